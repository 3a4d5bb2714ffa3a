"""Transposed convolution (conv_transpose2d) on NCHW16c, issue 9.

PyTorch ConvTranspose2d semantics (the spec: `reference.conv_transpose2d`): x (N, Ci, H, W),
w (Ci, Co/groups, KH, KW), stride s, dilation d, padding (top, bottom, left, right) cropping
the full output, output_padding growing it at the bottom / right:

    y[n, co, oh, ow] = b[co] + sum over (ci, kh, kw) with oh = ih*sh - pt + kh*dh, ow = iw*sw - pl + kw*dw
                       of x[n, ci, ih, iw] * w[ci, co, kh, kw]

Phase decomposition (no zero-stuffed input, no col2im scatter): output row oh receives the
kernel rows kh with (oh + pt - kh*dh) divisible by sh, from input row ih = (oh + pt - kh*dh)/sh;
the output columns of one phase c = (ow + pl) mod sw, ow = ow0 + j*sw, receive the kernel
columns kw with (c - kw*dw) divisible by sw, from input columns q_kw + j: consecutive outputs of
a phase read consecutive inputs. So each (row, phase) is a small stride-1 convolution, and the
register block is the 1x1 kernel's (k1x1.py): 7 consecutive positions of a phase x 32 output
channels (14 zmm accumulators) over every (tap, input channel): per input channel two weight
vectors feed 14 FMAs with 7 broadcasts. UNet's 2x2 stride-2 upsampling is the case of one tap per
phase: four interleaved 1x1 GEMMs, written straight to their strided output positions. Hosts
with 256-bit vectors (tiles.NARROW) run 5 positions x 1 block (10 ymm accumulators; the 7 x 2
tile needs 28 of the 16 registers and spills), the same sum in the same order: the same bits.
Both tiles are generated from one template (tilegen.TRANSPOSE -> _tiles_gen.py).

Borders: input rows outside the image are skipped (the row's tap list); input columns outside
it come from a zero-bordered copy of the task's input rows (only when some phase needs columns
left of 0 or right of W-1: not for kernel == stride, padding 0), adding 0 * w.

Layouts:
  input   x  (N, Cb, H, W, 16)       NCHW16c, read in place (or its band copy)
  weights wp (KH, KW, OP, Cip, 32)   wp[kh, kw, p, ci, 16k + l] = w[ci, (2p+k)*16 + l, kh, kw]
                                     (groups: dense with zeros between groups, see `applies`)
  output     (N, Ob, Ho, Wo, 16)     bias and activation fused (epilogue.store_block)

Tasks: (image, band of output rows, range of output-channel pairs) from the shape only; every
output value is the same sum in the same order whichever task computes it, so any thread count
gives bitwise identical results.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from tilefuse.kernels.conv._nb import LANES
from tilefuse.kernels.conv._tiles_gen import _convt_rows_narrow, _convt_rows_wide  # (tilegen.TRANSPOSE)
from tilefuse.kernels.conv.epilogue import bias_or_zeros, resolve_act
from tilefuse.kernels.conv.tiles import NARROW
from tilefuse.kernels.conv.layout import from_nchwc, to_nchwc
from tilefuse.kernels.threads import parallel_for, scratch

MAX_DENSE_GROUPS = 4        # groups > 1 run dense with zero weights between groups up to this many
TASK_FLOPS = 8e6            # work per task (a band of rows x a range of channel pairs)


def out_size(size: int, k: int, s: int, pad_lo: int, pad_hi: int, d: int, op: int) -> int:
    return (size - 1) * s - pad_lo - pad_hi + d * (k - 1) + op + 1


def applies(groups: int) -> bool:
    """groups 1, or a few groups run as one dense conv (groups x the FLOPs); more groups: the
    GEMM + col2im kernel of the NCHW runtime."""
    return 1 <= groups <= MAX_DENSE_GROUPS


def prepare(w, b, groups: int = 1) -> dict:
    """w (Ci, Co/groups, KH, KW) -> {"weight": (KH, KW, OP, Cip, 32), "bias": (OP*32,)}."""
    w = np.asarray(w, np.float32)
    ci, og, kh, kw = w.shape
    if ci % groups:
        raise ValueError(f"conv_transpose2d: {ci} input channels not divisible by groups={groups}")
    co, cig = og * groups, ci // groups
    dense = np.zeros((ci, co, kh, kw), np.float32)
    for g in range(groups):
        dense[g * cig:(g + 1) * cig, g * og:(g + 1) * og] = w[g * cig:(g + 1) * cig]
    cip, op = -(-ci // LANES) * LANES, -(-co // 32)
    wpad = np.zeros((cip, op * 32, kh, kw), np.float32)
    wpad[:ci, :co] = dense
    # (Cip, OP*32, KH, KW) -> (KH, KW, OP*32, Cip) -> (KH, KW, OP, 32, Cip) -> (KH, KW, OP, Cip, 32)
    wp = wpad.transpose(2, 3, 1, 0).reshape(kh, kw, op, 32, cip).transpose(0, 1, 2, 4, 3)
    bias = np.zeros(op * 32, np.float32)
    bias[:co] = bias_or_zeros(b, co)
    return {"weight": np.ascontiguousarray(wp), "bias": bias}


def column_padding(W: int, Wo: int, KW: int, sw: int, dw: int, pl: int) -> tuple[int, int]:
    """Zero columns the phases read left of input column 0 and right of W-1."""
    lo, hi = 0, W - 1
    for c in range(sw):
        ow0 = (c - pl) % sw
        if ow0 >= Wo:
            continue
        nj = -(-(Wo - ow0) // sw)
        for kw in range(KW):
            t = ow0 + pl - kw * dw
            if t % sw == 0:
                lo, hi = min(lo, t // sw), max(hi, t // sw + nj - 1)
    return -lo, hi - (W - 1)


@njit(nogil=True, cache=True)
def _fill_band(band, xf, n, Cb, H, W, ih0, rows, Ws, pli):
    """band (Cb, rows, Ws, 16) flat = input rows [ih0, ih0 + rows) of image n, W columns at
    column pli, zeros around (the caller keeps the rows inside the image)."""
    z = np.float32(0.0)
    for cb in range(Cb):
        for r in range(rows):
            dst = np.uint64(((cb * rows + r) * Ws) * 16)
            src = np.uint64((((n * Cb + cb) * H + ih0 + r) * W) * 16)
            for i in range(pli * 16):
                band[dst + np.uint64(i)] = z
            d2 = dst + np.uint64(pli * 16)
            for i in range(W * 16):
                band[d2 + np.uint64(i)] = xf[src + np.uint64(i)]
            for i in range((pli + W) * 16, Ws * 16):
                band[dst + np.uint64(i)] = z


@njit(nogil=True, cache=True)
def _convt_rows(of, xs, wp, bias, oh0, oh1, p0, p1, geo, xbase, ih_base, Hs, Ws, pli, offs, code, alpha, beta):
    """The register tile of the host's vector width (tiles.NARROW): 7 x 2 blocks or 5 x 1."""
    if NARROW:
        _convt_rows_narrow(of, xs, wp, bias, oh0, oh1, p0, p1, geo, xbase, ih_base, Hs, Ws, pli, offs, code, alpha,
                           beta)
    else:
        _convt_rows_wide(of, xs, wp, bias, oh0, oh1, p0, p1, geo, xbase, ih_base, Hs, Ws, pli, offs, code, alpha,
                         beta)


def plan_tasks(n, ho, wo, cip, op, taps_per_out) -> list[tuple[int, int, int, int, int]]:
    """(image, oh0, oh1, p0, p1) from the shape only: about TASK_FLOPS each; rows first, then
    channel pairs when one row is already more than that (deep, narrow maps at batch 1)."""
    row = 2.0 * wo * cip * op * 32 * max(taps_per_out, 1)
    if row <= TASK_FLOPS:
        rows = min(ho, max(1, int(TASK_FLOPS // row)))
        rows = -(-ho // -(-ho // rows))
        return [(i, r, min(r + rows, ho), 0, op) for i in range(n) for r in range(0, ho, rows)]
    k = max(1, int(op * TASK_FLOPS // row))
    k = -(-op // -(-op // k))
    return [(i, r, r + 1, p, min(p + k, op)) for i in range(n) for r in range(ho) for p in range(0, op, k)]


def run_nchwc(out_b, x_b, prepared, *, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), relu=False, act=None,
              threads=None) -> None:
    """x_b (N, Cb, H, W, 16) -> out_b (N, Ob, Ho, Wo, 16) = act(conv_transpose(x) + bias).

    Ho, Wo come from out_b (output_padding is only a statement of the output size)."""
    code, al, be = resolve_act(relu, act, "conv_transpose2d")
    wp, bias = prepared["weight"], prepared["bias"]
    n, cb, h, w, _ = x_b.shape
    _, ob, ho, wo, _ = out_b.shape
    kh, kw, op, cip, _ = wp.shape
    if cip != cb * LANES or op * 2 < ob or bias.shape != (op * 32,):
        raise ValueError(f"conv_transpose2d (NCHWc): weight {wp.shape} / bias {bias.shape} do not match input "
                         f"{x_b.shape} / output {out_b.shape}")
    (sh, sw), (dh, dw) = stride, dilation
    pt, _, pl, _ = padding
    pli, pri = column_padding(w, wo, kw, sw, dw, pl)
    pli, pri = max(pli, 0), max(pri, 0)
    offs = np.arange(16, dtype=np.int64) * sw * 16
    of, xf = out_b.reshape(-1), x_b.reshape(-1)
    per_out = max(1, math.ceil(kh / sh)) * max(1, math.ceil(kw / sw))
    tasks = plan_tasks(n, ho, wo, cip, op, per_out)

    def task(tk):
        i, r0, r1, p0, p1 = tk
        geo = np.array([i, cb, h, w, ob, ho, wo, kh, kw, sh, sw, dh, dw, pt, pl], np.int64)
        if pli == 0 and pri == 0:
            _convt_rows(of, xf, wp, bias, r0, r1, p0, p1, geo, i * cb * h * w * 16, 0, h, w, 0, offs, code, al, be)
            return
        # input rows the task's output rows read, clipped to the image
        ih0 = max(0, -(-(r0 + pt - (kh - 1) * dh) // sh))
        ih1 = min(h, (r1 - 1 + pt) // sh + 1)
        rows = max(ih1 - ih0, 1)
        ws = w + pli + pri
        band = scratch("convt_band", cb * rows * ws * LANES)
        if ih1 > ih0:
            _fill_band(band, xf, i, cb, h, w, ih0, ih1 - ih0, ws, pli)
        else:
            band[:] = 0.0
        _convt_rows(of, band, wp, bias, r0, r1, p0, p1, geo, 0, ih0, rows, ws, pli, offs, code, al, be)

    parallel_for(task, tasks, threads)


def run(out, x, prepared, *, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), relu=False, act=None,
        threads=None) -> None:
    """NCHW in, NCHW out: block the input, run the NCHW16c kernel, unblock."""
    n, co, ho, wo = out.shape
    out_b = np.empty((n, -(-co // LANES), ho, wo, LANES), np.float32)
    run_nchwc(out_b, to_nchwc(x, threads=threads), prepared, stride=stride, padding=padding, dilation=dilation,
              relu=relu, act=act, threads=threads)
    from_nchwc(out_b, co, out=out, threads=threads)
