"""Direct kxk convolution on the blocked NCHWc layout (seed 000, conv3x3 strategy, on AVX-512).

Layouts:
  input   xb (N, Cb, Hp, Wp, 16)       NCHWc, already zero padded (no bounds checks inside)
  weights wb (Ob, Cb, KH, KW, 16, 16)  wb[ob, cb, kh, kw, ci, co] = w[ob*16+co, cb*16+ci, kh, kw]
  output     (N, Ob, Ho, Wo, 16)       NCHWc (or NCHW through `run`)

Vectorized over a block of 16 output channels (one zmm register: the analogue of the paper's
48 lanes = 16 PEs x 3 FMACs) and register-blocked over RB = 8 output positions of a row: the
8 accumulators live in registers for the whole Ci*KH*KW reduction, each weight vector load
feeds 8 FMAs, each input scalar is broadcast once. Window-level partitioning: a task owns a
band of output rows of one image (all output channels), so cores split the output image.
Any kernel size, stride, dilation and (through the padded input) padding.
"""
from __future__ import annotations

import numba as nb
import numpy as np
from numba import njit

from tilefuse.kernels.conv._nb import LANES, stack_f32
from tilefuse.kernels.activations import apply_scalar
from tilefuse.kernels.conv.epilogue import EMPTY4, bias_or_zeros, RB_OFFSETS, resolve_act, store_block
from tilefuse.kernels.conv.layout import to_nchwc
from tilefuse.kernels.conv.planner import plan_direct
from tilefuse.kernels.threads import parallel_for, scratch



def pack_weights(w: np.ndarray) -> np.ndarray:
    """(Co, Ci, KH, KW) -> (Ob, Cb, KH, KW, 16ci, 16co), zero padded channels."""
    co, ci, kh, kw = w.shape
    ob, cb = -(-co // LANES), -(-ci // LANES)
    wp = np.zeros((ob * LANES, cb * LANES, kh, kw), np.float32)
    wp[:co, :ci] = w
    # (Ob*16co, Cb*16ci, KH, KW) -> (Ob, 16co, Cb, 16ci, KH, KW) -> (Ob, Cb, KH, KW, 16ci, 16co)
    return np.ascontiguousarray(wp.reshape(ob, LANES, cb, LANES, kh, kw).transpose(0, 2, 4, 5, 3, 1))


def prepare(w, b) -> dict:
    co = w.shape[0]
    bias = np.zeros(-(-co // LANES) * LANES, np.float32)
    bias[:co] = bias_or_zeros(b, co)
    return {"weight": pack_weights(np.asarray(w, np.float32)), "bias": bias}


@njit(nogil=True, cache=True, fastmath=True)
def _direct_rows(out, n_out, q_off, xb, n, x_row0, wb, oh0, oh1, Wo, Wp, sh, sw, dh, dw, bias, res, has_res,
                 code, alpha, beta):
    """out[n_out, ob, oh*Wo + ow - q_off, :] for oh in [oh0, oh1), all ob, all ow.

    Flat views: xb (N, Cb, Hp*Wp, 16) whose row 0 is padded input row x_row0 (a whole padded
    image: x_row0 = 0; a padded band: x_row0 = the band's first row), out (N', Ob, R*Wo, 16),
    res out's shape (then q_off = 0) or EMPTY4.
    The register block is 8 consecutive output positions of the band in row-major order, so it
    may wrap to the next row (narrow 7x7 / 14x14 maps keep all 8 accumulators busy); the last
    partial block repeats its final position and stores only the valid ones.
    Epilogue (epilogue.store_block): + bias[ob*16+l] as the accumulators leave registers, then
    (+ res) and the activation (code, alpha, beta).
    """
    Cb = xb.shape[1]
    Ob, _, KH, KW, _, _ = wb.shape
    a0 = nb.carray(stack_f32(16), 16)
    a1 = nb.carray(stack_f32(16), 16)
    a2 = nb.carray(stack_f32(16), 16)
    a3 = nb.carray(stack_f32(16), 16)
    a4 = nb.carray(stack_f32(16), 16)
    a5 = nb.carray(stack_f32(16), 16)
    a6 = nb.carray(stack_f32(16), 16)
    a7 = nb.carray(stack_f32(16), 16)
    acc = nb.carray(stack_f32(128), (8, 16))
    bv = nb.carray(stack_f32(16), 16)
    offs = np.empty(8, np.int64)
    p_begin, p_end = oh0 * Wo, oh1 * Wo
    of, rf = out.reshape(out.size), res.reshape(res.size)  # flat (N', Ob, P, 16); res the same or empty
    P = out.shape[2]
    for ob in range(Ob):
        for l in range(16):
            bv[l] = bias[ob * 16 + l]
        for pb in range(p_begin, p_end, 8):
            for r in range(8):
                p = min(pb + r, p_end - 1)
                offs[r] = ((p // Wo) * sh - x_row0) * Wp + (p % Wo) * sw
            f0, f1, f2, f3 = offs[0], offs[1], offs[2], offs[3]
            f4, f5, f6, f7 = offs[4], offs[5], offs[6], offs[7]
            for l in range(16):
                a0[l] = 0.0
                a1[l] = 0.0
                a2[l] = 0.0
                a3[l] = 0.0
                a4[l] = 0.0
                a5[l] = 0.0
                a6[l] = 0.0
                a7[l] = 0.0
            for cb in range(Cb):
                xr = xb[n, cb]
                for kh in range(KH):
                    for kw in range(KW):
                        wk = wb[ob, cb, kh, kw]
                        k0 = kh * dh * Wp + kw * dw
                        for ci in range(16):
                            wv = wk[ci]
                            x0 = xr[f0 + k0, ci]
                            x1 = xr[f1 + k0, ci]
                            x2 = xr[f2 + k0, ci]
                            x3 = xr[f3 + k0, ci]
                            x4 = xr[f4 + k0, ci]
                            x5 = xr[f5 + k0, ci]
                            x6 = xr[f6 + k0, ci]
                            x7 = xr[f7 + k0, ci]
                            for l in range(16):
                                q = wv[l]
                                a0[l] += x0 * q
                                a1[l] += x1 * q
                                a2[l] += x2 * q
                                a3[l] += x3 * q
                                a4[l] += x4 * q
                                a5[l] += x5 * q
                                a6[l] += x6 * q
                                a7[l] += x7 * q
            for l in range(16):
                acc[0, l] = a0[l] + bv[l]
                acc[1, l] = a1[l] + bv[l]
                acc[2, l] = a2[l] + bv[l]
                acc[3, l] = a3[l] + bv[l]
                acc[4, l] = a4[l] + bv[l]
                acc[5, l] = a5[l] + bv[l]
                acc[6, l] = a6[l] + bv[l]
                acc[7, l] = a7[l] + bv[l]
            nv = min(8, p_end - pb)
            store_block(of, rf, has_res, acc, 0, RB_OFFSETS, ((n_out * Ob + ob) * P + pb - q_off) * 16, nv, 1, 0,
                        code, alpha, beta)


@njit(nogil=True, cache=True, fastmath=True)
def _direct_rows2(out, n_out, q_off, xb, n, x_row0, wb, oh0, oh1, Wo, Wp, sh, sw, dh, dw, bias, res, has_res,
                  code, alpha, beta):
    """Same contract as `_direct_rows`, register-blocked as RB2 = 7 output positions x 2 output
    blocks (14 zmm accumulators): per (ci, kh, kw) two weight vectors feed 14 FMAs with 7
    broadcasts (the 8 x 1 blocking loads 9 vectors per 8 FMAs and is load-bound on small maps).
    The input is indexed through a flat view with unsigned offsets (no wraparound code).
    An odd Ob computes its last block twice in the second slot and stores it once."""
    Cb, HWp = xb.shape[1], xb.shape[2]
    Ob, _, KH, KW, _, _ = wb.shape
    xf = xb.reshape(xb.size)
    a0 = nb.carray(stack_f32(16), 16)
    a1 = nb.carray(stack_f32(16), 16)
    a2 = nb.carray(stack_f32(16), 16)
    a3 = nb.carray(stack_f32(16), 16)
    a4 = nb.carray(stack_f32(16), 16)
    a5 = nb.carray(stack_f32(16), 16)
    a6 = nb.carray(stack_f32(16), 16)
    b0 = nb.carray(stack_f32(16), 16)
    b1 = nb.carray(stack_f32(16), 16)
    b2 = nb.carray(stack_f32(16), 16)
    b3 = nb.carray(stack_f32(16), 16)
    b4 = nb.carray(stack_f32(16), 16)
    b5 = nb.carray(stack_f32(16), 16)
    b6 = nb.carray(stack_f32(16), 16)
    acc = nb.carray(stack_f32(224), (7, 32))
    offs = np.empty(7, np.uint64)
    p_begin, p_end = oh0 * Wo, oh1 * Wo
    nbase = n * Cb * HWp * 16
    of, rf = out.reshape(out.size), res.reshape(res.size)  # flat (N', Ob, P, 16); res the same or empty
    P = out.shape[2]
    for ob in range(0, Ob, 2):
        ob1 = min(ob + 1, Ob - 1)
        nk = 2 if ob + 1 < Ob else 1
        for pb in range(p_begin, p_end, 7):
            for r in range(7):
                p = min(pb + r, p_end - 1)
                offs[r] = np.uint64((((p // Wo) * sh - x_row0) * Wp + (p % Wo) * sw) * 16)
            f0, f1, f2, f3, f4, f5, f6 = offs[0], offs[1], offs[2], offs[3], offs[4], offs[5], offs[6]
            for l in range(16):
                a0[l] = 0.0
                a1[l] = 0.0
                a2[l] = 0.0
                a3[l] = 0.0
                a4[l] = 0.0
                a5[l] = 0.0
                a6[l] = 0.0
                b0[l] = 0.0
                b1[l] = 0.0
                b2[l] = 0.0
                b3[l] = 0.0
                b4[l] = 0.0
                b5[l] = 0.0
                b6[l] = 0.0
            for cb in range(Cb):
                cbase = np.uint64(nbase + cb * HWp * 16)
                for kh in range(KH):
                    for kw in range(KW):
                        w0 = wb[ob, cb, kh, kw]
                        w1 = wb[ob1, cb, kh, kw]
                        k0 = cbase + np.uint64((kh * dh * Wp + kw * dw) * 16)
                        for ci in range(16):
                            k = k0 + np.uint64(ci)
                            x0 = xf[f0 + k]
                            x1 = xf[f1 + k]
                            x2 = xf[f2 + k]
                            x3 = xf[f3 + k]
                            x4 = xf[f4 + k]
                            x5 = xf[f5 + k]
                            x6 = xf[f6 + k]
                            for l in range(16):
                                u = w0[ci, l]
                                v = w1[ci, l]
                                a0[l] += x0 * u
                                a1[l] += x1 * u
                                a2[l] += x2 * u
                                a3[l] += x3 * u
                                a4[l] += x4 * u
                                a5[l] += x5 * u
                                a6[l] += x6 * u
                                b0[l] += x0 * v
                                b1[l] += x1 * v
                                b2[l] += x2 * v
                                b3[l] += x3 * v
                                b4[l] += x4 * v
                                b5[l] += x5 * v
                                b6[l] += x6 * v
            for l in range(16):
                u = bias[np.uint64(ob * 16 + l)]
                v = bias[np.uint64(ob1 * 16 + l)]
                acc[0, l] = a0[l] + u
                acc[1, l] = a1[l] + u
                acc[2, l] = a2[l] + u
                acc[3, l] = a3[l] + u
                acc[4, l] = a4[l] + u
                acc[5, l] = a5[l] + u
                acc[6, l] = a6[l] + u
                acc[0, 16 + l] = b0[l] + v
                acc[1, 16 + l] = b1[l] + v
                acc[2, 16 + l] = b2[l] + v
                acc[3, 16 + l] = b3[l] + v
                acc[4, 16 + l] = b4[l] + v
                acc[5, 16 + l] = b5[l] + v
                acc[6, 16 + l] = b6[l] + v
            nv = min(7, p_end - pb)
            store_block(of, rf, has_res, acc, 0, RB_OFFSETS, ((n_out * Ob + ob) * P + pb - q_off) * 16, nv, nk, P * 16,
                        code, alpha, beta)


@njit(nogil=True, cache=True, fastmath=True)
def _band_to_nchw(out, band, n, oh0, res, has_res, code, alpha, beta):
    """band (1, Ob, R*Wo, 16) -> out[n, :, oh0:oh0+R, :] (NCHW) with residual and activation."""
    Co, Wo = out.shape[1], out.shape[3]
    R = band.shape[2] // Wo
    for c in range(Co):
        ob, l = c // 16, c % 16
        for r in range(R):
            for ow in range(Wo):
                v = band[0, ob, r * Wo + ow, l]
                if has_res:
                    v += res[n, c, oh0 + r, ow]
                out[n, c, oh0 + r, ow] = apply_scalar(code, v, alpha, beta)


def _bands(ho, rows):
    return [(r0, min(r0 + rows, ho)) for r0 in range(0, ho, rows)]


def direct_nchwc(out_blocked, x_blocked, prepared, residual_blocked=None, *, stride=(1, 1), dilation=(1, 1),
                 relu=False, act=None, threads=None) -> None:
    """NCHWc-native direct conv. x_blocked is already padded (see layout.to_nchwc(x, padding)).

    out_blocked (N, Ob, Ho, Wo, 16); residual_blocked the same shape or None.
    """
    code, al, be = resolve_act(relu, act, "direct")
    wb, bias = prepared["weight"], prepared["bias"]
    n, cb, hp, wp, _ = x_blocked.shape
    ho = out_blocked.shape[2]
    p = plan_direct(cb, wb.shape[2], dilation[0], stride[0], ho, wp)
    wo = out_blocked.shape[3]
    has_res = residual_blocked is not None
    # (N, C, H, W, 16) -> (N, C, H*W, 16) flat views, no copy
    res = residual_blocked.reshape(n, -1, ho * wo, LANES) if has_res else EMPTY4
    ofl = out_blocked.reshape(n, -1, ho * wo, LANES)
    xfl = x_blocked.reshape(n, cb, hp * wp, LANES)
    tasks = [(i, r0, r1) for i in range(n) for (r0, r1) in _bands(ho, p["rows"])]
    parallel_for(lambda t: _direct_rows2(ofl, t[0], 0, xfl, t[0], 0, wb, t[1], t[2], wo, wp, stride[0], stride[1],
                                        dilation[0], dilation[1], bias, res, has_res, code, al, be), tasks, threads)


def run(out, x, prepared, residual=None, *, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), relu=False,
        act=None, threads=None) -> None:
    """NCHW in, NCHW out: pad+block the input once, then per row band compute in NCHWc into a
    per-thread buffer and unblock it into `out` with the residual and activation while it is in cache."""
    code, al, be = resolve_act(relu, act, "direct")
    wb, bias = prepared["weight"], prepared["bias"]
    n = x.shape[0]
    ob = wb.shape[0]
    _, _, ho, wo = out.shape
    xb = to_nchwc(x, padding, threads=threads)
    p = plan_direct(xb.shape[1], wb.shape[2], dilation[0], stride[0], ho, xb.shape[3])
    has_res = residual is not None
    res = residual if has_res else np.zeros((0, 0, 0, 0), np.float32)
    tasks = [(i, r0, r1) for i in range(n) for (r0, r1) in _bands(ho, p["rows"])]
    _, cb, hp, wp, _ = xb.shape
    xfl = xb.reshape(n, cb, hp * wp, LANES)  # (N, Cb, Hp, Wp, 16) -> (N, Cb, Hp*Wp, 16)

    def task(t):
        i, r0, r1 = t
        band = scratch("direct_band", ob * (r1 - r0) * wo * LANES).reshape(1, ob, (r1 - r0) * wo, LANES)
        _direct_rows2(band, 0, r0 * wo, xfl, i, 0, wb, r0, r1, wo, wp, stride[0], stride[1], dilation[0],
                     dilation[1], bias, EMPTY4, False, 0, al, be)
        _band_to_nchw(out, band, i, r0, res, has_res, code, al, be)

    parallel_for(task, tasks, threads)


@njit(nogil=True, cache=True)
def _pad_band(band, x, n, h0, pl):
    """band (1, Cb, R, Wp, 16) = rows h0 .. h0+R-1 of x[n] (N, Cb, H, W, 16) zero padded:
    row h < 0 or >= H is zeros, columns [0, pl) and [pl+W, Wp) are zeros."""
    Cb, R, Wp = band.shape[1], band.shape[2], band.shape[3]
    H, W = x.shape[2], x.shape[3]
    for cb in range(Cb):
        for r in range(R):
            h = h0 + r
            if h < 0 or h >= H:
                for j in range(Wp):
                    for l in range(16):
                        band[0, cb, r, j, l] = 0.0
                continue
            for j in range(pl):
                for l in range(16):
                    band[0, cb, r, j, l] = 0.0
            for j in range(W):
                for l in range(16):
                    band[0, cb, r, pl + j, l] = x[n, cb, h, j, l]
            for j in range(pl + W, Wp):
                for l in range(16):
                    band[0, cb, r, j, l] = 0.0


def run_nchwc(out_b, x_b, prepared, residual_b=None, *, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
              relu=False, act=None, threads=None) -> None:
    """NCHWc in, NCHWc out, input NOT padded (the compiler's convention between layers).

    x_b (N, Cb, H, W, 16), out_b / residual_b (N, Ob, Ho, Wo, 16). Padding is folded into the
    per-task band copy: a task (one image, a band of output rows) copies the input rows its
    windows read into a per-thread zero-bordered scratch band (it fits L2/2, see the planner)
    and runs the register-blocked kernel on it. Without padding the kernel reads x_b directly.
    """
    code, al, be = resolve_act(relu, act, "direct")
    wb, bias = prepared["weight"], prepared["bias"]
    n, cb, h, w, _ = x_b.shape
    _, ob, ho, wo, _ = out_b.shape
    kh = wb.shape[2]
    t, b, l, r = padding
    hp, wp = h + t + b, w + l + r
    p = plan_direct(cb, kh, dilation[0], stride[0], ho, wp)
    has_res = residual_b is not None
    res = residual_b.reshape(n, ob, ho * wo, LANES) if has_res else EMPTY4
    ofl = out_b.reshape(n, ob, ho * wo, LANES)  # (N, Ob, Ho, Wo, 16) -> (N, Ob, Ho*Wo, 16)
    tasks = [(i, r0, r1) for i in range(n) for (r0, r1) in _bands(ho, p["rows"])]
    if padding == (0, 0, 0, 0):
        xfl = x_b.reshape(n, cb, h * w, LANES)
        parallel_for(lambda tk: _direct_rows2(ofl, tk[0], 0, xfl, tk[0], 0, wb, tk[1], tk[2], wo, wp, stride[0],
                                             stride[1], dilation[0], dilation[1], bias, res, has_res, code, al, be),
                     tasks, threads)
        return

    def task(tk):
        i, r0, r1 = tk
        x0 = r0 * stride[0]                                  # first padded input row of the band
        rows = (r1 - 1 - r0) * stride[0] + (kh - 1) * dilation[0] + 1
        band = scratch("direct_pad", cb * rows * wp * LANES).reshape(1, cb, rows, wp, LANES)
        _pad_band(band, x_b, i, x0 - t, l)
        bfl = band.reshape(1, cb, rows * wp, LANES)
        _direct_rows2(ofl, i, 0, bfl, 0, x0, wb, r0, r1, wo, wp, stride[0], stride[1], dilation[0], dilation[1],
                     bias, res, has_res, code, al, be)

    parallel_for(task, tasks, threads)
