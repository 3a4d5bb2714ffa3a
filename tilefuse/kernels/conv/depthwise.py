"""Depthwise convolution on NCHW16c (groups == C_in; C_out = multiplier * C_in), issue 9.

Layouts:
  input   x  (N, Cb, H, W, 16)       NCHW16c, NOT padded (read in place; padded channels zero)
  weights wd (Ob, KH, KW, 16)        wd[ob, kh, kw, l] = w[ob*16 + l, 0, kh, kw], zero padded
  output     (N, Ob, Ho, Wo, 16)     NCHW16c, written in place (padded channels come out 0)

One output channel reads one input channel, so a zmm register holds 16 channels (one block)
and every tap is a vertical FMA: acc[pos, 0:16] += x[tap(pos), 0:16] * w[tap, 0:16]; there is
no reduction over channels and no broadcast. The work per byte is tiny (a 3x3 stride-1 layer does
2.25 FLOP per byte of input + output), so the kernel is memory bound and the goal is to touch
each input and output byte once, from DRAM, at the machine's bandwidth:

- Register blocking over output positions: RB = 8 consecutive output positions of a row are 8
  zmm accumulators held for the whole KH*KW reduction; each weight vector load feeds 8 FMAs.
  5x5 stride 2 and the 7-wide maps run generated column-order blocks instead (`_depthwise_gen.py`,
  COL_BLOCKS at the end of this module): each input column loaded once, a kernel row's weights held.
- No padding pass and no padded copy: the zero padding is the loop bounds. A row's taps are
  limited to the input rows that exist (kh_lo..kh_hi, per output row); the columns are split
  into the interior (every kw tap inside the image: the register-blocked code, no checks) and
  the left/right border positions (one position at a time, kw limited to the taps inside).
- Every output value is the same sequence of operations whatever path, block or task computes
  it: acc = 0; for kh ascending, for kw ascending over the taps inside the image: acc += x * w;
  then + bias, + residual, act. So results do not depend on the blocking or the thread count.
- Fused epilogue y = act(conv + bias + residual), with act = (code, alpha, beta) from
  `tilefuse.kernels.activations`: bias (and a clip without a residual: ReLU6) in the registers before
  the store, the residual and the other activations in one pass over the block's rows while they are
  in L1 (`_finish_row`); the same bits either way.

Partitioning: tasks are (image, range of channel blocks, band of output rows) from the layer shape
and the plan's thread count (`plan_tasks` = planner.plan_depthwise_tasks: about DW_TASK_VFMAS of work a
task, smaller down to DW_TASK_MIN_VFMAS so that each thread gets ~3): large maps split rows (window
level, seed 000), small maps (7x7, 14x14) group channel blocks into one task so a task is never
dominated by the call overhead. The split never changes a value (each output is computed by the same
code whatever task holds it): results are bitwise identical for every task table and thread count.

Channel multiplier > 1 (C_out = m * C_in, output channel co reads input channel co // m) is
supported by a lane-gather variant (`_dw_task_gather`, correct, not register blocked: rare in
practice). For the NCHW entry point (`run`) the input is blocked and the output unblocked
around the NCHW16c kernel; compiled networks keep depthwise layers in NCHW16c.
"""
from __future__ import annotations

import functools

import numba as nb
import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from tilefuse.kernels.activations import apply_scalar, apply_span
from tilefuse.kernels.conv import _depthwise_gen as _dg
from tilefuse.kernels.conv._nb import LANES, act16, new_counter, row_sum16, stack_f32, take
from tilefuse.kernels.conv.tiles import NARROW
from tilefuse.kernels.conv.epilogue import bias_or_zeros, resolve_act
from tilefuse.kernels.conv.layout import from_nchwc, to_nchwc
from tilefuse.kernels.conv.planner import plan_depthwise_padded, plan_depthwise_tasks
from tilefuse.kernels.threads import (numba_max_threads, numba_region, parallel_for, region_threads, resolve_threads,
                                      scratch)

RB = 8                  # output positions per register block
FINISH_SPAN = 2048      # floats (8 KiB) of output rows per residual / activation pass
EMPTY1 = np.zeros(0, np.float32)
EMPTY2 = np.zeros((0, LANES), np.float32)
# fused multiply-add but no reassociation: with "reassoc" LLVM vectorizes the kw loop as a
# reduction with gathers instead of the 16 lanes (10x slower), and the per-value order is the spec's
FASTMATH = {"contract", "nsz", "arcp"}


def prepare(w, b, groups: int) -> dict:
    """w (Co, 1, KH, KW) with groups = C_in, Co = m * C_in -> {"weight": (Ob, KH, KW, 16), "bias": (Ob*16,)}
    plus, for m > 1, "src": (Ob*16,) the input channel each output lane reads (float32, exact)."""
    w = np.asarray(w, np.float32)
    co, cg, kh, kw = w.shape
    if cg != 1 or co % groups:
        raise ValueError(f"depthwise: weight {w.shape} with groups={groups} is not depthwise; expected "
                         f"(m*C_in, 1, KH, KW) with groups = C_in")
    ob = -(-co // LANES)
    wp = np.zeros((ob * LANES, kh, kw), np.float32)
    wp[:co] = w[:, 0]
    # (Ob*16, KH, KW) -> (Ob, 16, KH, KW) -> (Ob, KH, KW, 16)
    out = {"weight": np.ascontiguousarray(wp.reshape(ob, LANES, kh, kw).transpose(0, 2, 3, 1))}
    bias = np.zeros(ob * LANES, np.float32)
    bias[:co] = bias_or_zeros(b, co)
    out["bias"] = bias
    m = co // groups
    if m > 1:
        src = np.zeros(ob * LANES, np.float32)   # padded lanes read channel 0 with weight 0
        src[:co] = np.arange(co) // m
        out["src"] = src
    return out


PADDED = None           # force the padded-band path on/off (benchmarks, tests); None: use_padded()
use_padded = plan_depthwise_padded   # the shape rule (planner.py)
plan_tasks = plan_depthwise_tasks    # the task table (planner.py)


@intrinsic
def _data_ptr(typingctx, arr):
    """float32* to arr's data; numba.carray(_data_ptr(a), a.size) is a view without a reference
    count, so passing it to the inlined helpers adds no NRT incref/decref calls per block
    (they cost as much as the block's FMAs)."""
    if not isinstance(arr, types.Array) or arr.dtype != types.float32:
        return None
    sig = types.CPointer(types.float32)(arr)

    def codegen(context, builder, signature, args):
        return context.make_array(signature.args[0])(context, builder, args[0]).data

    return sig, codegen


@njit(inline="always", cache=True)
def _row_taps(ih0, dh, KH, H):
    """kh range [lo, hi) whose input row ih0 + kh*dh lies in [0, H)."""
    lo = 0 if ih0 >= 0 else (-ih0 + dh - 1) // dh
    hi = KH if ih0 + (KH - 1) * dh < H else ((H - 1 - ih0) // dh + 1 if H - 1 - ih0 >= 0 else 0)
    return lo, max(lo, min(hi, KH))


@njit(inline="always", cache=True, fastmath=FASTMATH)
def _block(xf, wf, a0, a1, a2, a3, a4, a5, a6, a7, k, wk, nk, rstep, KW, c1, c2, c3, c4, c5, c6, c7, kstep):
    """The register block: a_r[0:16] += xf[k + c_r + tap] * wf[wk + tap] over nk kernel rows and
    KW taps (c0 = 0), kh then kw ascending. k / wk: uint64 offsets of the block's first tap;
    rstep / kstep: offset steps per kernel row / column. Inlined, so the constant arguments of a
    call site become immediate address offsets and a constant KW unrolls the tap loop (1.5-2x
    faster than runtime offsets, which need a register each).
    Hosts with 256-bit vectors (tiles.NARROW) run lanes 0-7, then lanes 8-15: 8 ymm accumulators
    and one weight register fit the 16 ymm registers (all 16 lanes at once need 16 + 2 and spill);
    each lane's sequence of operations is unchanged, so the bits are too."""
    if NARROW:
        _block_lanes(xf, wf, a0, a1, a2, a3, a4, a5, a6, a7, k, wk, nk, rstep, KW, c1, c2, c3, c4, c5, c6, c7, kstep,
                     0, 8)
        _block_lanes(xf, wf, a0, a1, a2, a3, a4, a5, a6, a7, k, wk, nk, rstep, KW, c1, c2, c3, c4, c5, c6, c7, kstep,
                     8, 8)
    else:
        _block_lanes(xf, wf, a0, a1, a2, a3, a4, a5, a6, a7, k, wk, nk, rstep, KW, c1, c2, c3, c4, c5, c6, c7, kstep,
                     0, 16)


@njit(inline="always", cache=True, fastmath=FASTMATH)
def _block_lanes(xf, wf, a0, a1, a2, a3, a4, a5, a6, a7, k, wk, nk, rstep, KW, c1, c2, c3, c4, c5, c6, c7, kstep,
                 h0, nl):
    """`_block` on lanes [h0, h0 + nl) (constants at the call sites)."""
    C1, C2, C3, C4 = np.uint64(c1), np.uint64(c2), np.uint64(c3), np.uint64(c4)
    C5, C6, C7, KS = np.uint64(c5), np.uint64(c6), np.uint64(c7), np.uint64(kstep)
    for _ in range(nk):
        kk = k
        ww = wk
        for kw in range(KW):
            for l in range(h0, h0 + nl):
                u = np.uint64(l)
                q = wf[ww + u]
                a0[l] += xf[kk + u] * q
                a1[l] += xf[kk + C1 + u] * q
                a2[l] += xf[kk + C2 + u] * q
                a3[l] += xf[kk + C3 + u] * q
                a4[l] += xf[kk + C4 + u] * q
                a5[l] += xf[kk + C5 + u] * q
                a6[l] += xf[kk + C6 + u] * q
                a7[l] += xf[kk + C7 + u] * q
            kk += KS
            ww += np.uint64(16)
        k += rstep
        wk += np.uint64(KW * 16)


@njit(inline="always", cache=True)
def _fill_padded(sp, xf, xbase, H, W, r0, r1, pt, pl, Wp):
    """sp[(r - r0) * Wp + c, 0:16] = x[r - pt, c - pl, 0:16] of one channel plane (at xbase in
    xf), zero outside the image, for padded rows r in [r0, r1) and columns c in [0, Wp).
    Unsigned offsets: signed ones add wraparound code that stops the copy from vectorizing."""
    ncopy = max(0, min(W, Wp - pl))
    lo = min(pl, Wp) * 16
    z = np.float32(0.0)
    for r in range(r0, r1):
        ih = r - pt
        row = np.uint64((r - r0) * Wp * 16)
        if ih < 0 or ih >= H:
            for i in range(Wp * 16):
                sp[row + np.uint64(i)] = z
            continue
        for i in range(lo):
            sp[row + np.uint64(i)] = z
        src = np.uint64(xbase + ih * W * 16)
        dst = row + np.uint64(pl * 16)
        for i in range(ncopy * 16):
            sp[dst + np.uint64(i)] = xf[src + np.uint64(i)]
        for i in range((pl + ncopy) * 16, Wp * 16):
            sp[row + np.uint64(i)] = z


@njit(inline="always", cache=True, fastmath=FASTMATH)
def _store8(of, d, a0, a1, a2, a3, a4, a5, a6, a7, bv):
    """of[d + 16r : d + 16r + 16] = a_r + bias for r < 8."""
    for l in range(16):
        u = np.uint64(l)
        b = bv[l]
        of[d + u] = a0[l] + b
        of[d + np.uint64(16) + u] = a1[l] + b
        of[d + np.uint64(32) + u] = a2[l] + b
        of[d + np.uint64(48) + u] = a3[l] + b
        of[d + np.uint64(64) + u] = a4[l] + b
        of[d + np.uint64(80) + u] = a5[l] + b
        of[d + np.uint64(96) + u] = a6[l] + b
        of[d + np.uint64(112) + u] = a7[l] + b


@njit(inline="always", cache=True, fastmath=FASTMATH)
def _store(of, d, a, bv):
    """of[d:d+16] = a + bias (residual and activation follow per row, `_finish_row`)."""
    for l in range(16):
        of[d + np.uint64(l)] = a[l] + bv[l]


@njit(inline="always", cache=True, fastmath=FASTMATH)
def _store8_clip(of, d, a0, a1, a2, a3, a4, a5, a6, a7, bv, lo, hi):
    """`_store8` with the clip (ReLU6, hardtanh) applied in the registers: min(max(a_r + bias, lo), hi),
    apply_scalar's clip, so a layer without a residual needs no second pass over its rows."""
    for l in range(16):
        u = np.uint64(l)
        b = bv[l]
        of[d + u] = min(max(a0[l] + b, lo), hi)
        of[d + np.uint64(16) + u] = min(max(a1[l] + b, lo), hi)
        of[d + np.uint64(32) + u] = min(max(a2[l] + b, lo), hi)
        of[d + np.uint64(48) + u] = min(max(a3[l] + b, lo), hi)
        of[d + np.uint64(64) + u] = min(max(a4[l] + b, lo), hi)
        of[d + np.uint64(80) + u] = min(max(a5[l] + b, lo), hi)
        of[d + np.uint64(96) + u] = min(max(a6[l] + b, lo), hi)
        of[d + np.uint64(112) + u] = min(max(a7[l] + b, lo), hi)


@njit(inline="always", cache=True, fastmath=FASTMATH)
def _store_clip(of, d, a, bv, lo, hi):
    """`_store` with the clip in the registers (`_store8_clip`)."""
    for l in range(16):
        of[d + np.uint64(l)] = min(max(a[l] + bv[l], lo), hi)


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def _finish_row(of, rf, d0, m, has_res, code, al, be):
    """of[d0:d0+m] = act(of + rf) on output rows still in L1: ReLU / leaky ReLU (and identity / clip
    after a residual) as in-place act16 vectors, the other activations through activations.apply_span
    (one lanes loop per activation, each vectorized)."""
    if code == 1 or code == 9 or (has_res and code <= 2):
        # ReLU and leaky ReLU, and identity / clip after a residual: 16-lane vectors in place (act16: the
        # bits of the loops below; the in-place ReLU loop compiles to masked stores, microcoded on AMD
        # Zen: 1.6-2.2x the whole kernel's time; apply_span's clip loop is faster than act16's on its own)
        for j in range(d0, d0 + m, 16):
            act16(of, j, rf, j, has_res, code, al, be)
        return
    if has_res:
        g = of[d0:d0 + m]   # views indexed from 0 up: no negative-index wraparound code, so the loop
        r = rf[d0:d0 + m]   # vectorizes (indexing of / rf at d0 + i kept it scalar, 3x the kernel's time)
        for i in range(m):
            g[i] += r[i]
    apply_span(of, d0, d0 + m, code, al, be)


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def _dw_task(of, xf, wf, bias, rf, has_res, code, alpha, beta, n, ob0, ob1, oh0, oh1, geo, sp, padded, rs):
    """Output rows [oh0, oh1) of channel blocks [ob0, ob1) of image n (multiplier 1: block ob
    reads input block ob). Flat views xf (N*Cb*H*W*16), of / rf (N*Ob*Ho*Wo*16), wf (Ob*KH*KW*16);
    geo = (Cb, H, W, Ob, Ho, Wo, KH, KW, sh, sw, dh, dw, pt, pl). Offsets are unsigned (no
    negative-index wraparound code in the inner loops).

    rs: empty, or (N*Ob*Ho*16) flat: each output row's sum over its positions (`_nb.row_sum16`, after the
    activation, while the row is in L1) at rs[((n*Ob + ob)*Ho + oh)*16:+16], for the squeeze-excitation
    after the layer (its means: kernels/squeeze.py), which then does not read the output again.

    padded (small maps): each block's input rows are first copied into the zero-bordered scratch
    sp (rows x Wp x 16, in L1/L2), so every position is interior: no border path, whose
    one-position-at-a-time code would dominate 7x7 and 14x14 maps with 5x5 kernels."""
    Cb, H0, W0, Ob, Ho, Wo = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
    KH, KW, sh, sw, dh, dw, pt0, pl0 = geo[6], geo[7], geo[8], geo[9], geo[10], geo[11], geo[12], geo[13]
    # the geometry the row loop sees: the input itself, or the padded scratch band
    r0 = oh0 * sh                                   # first padded input row of the task
    r1 = (oh1 - 1) * sh + (KH - 1) * dh + 1         # one past the last
    Wp = (Wo - 1) * sw + (KW - 1) * dw + 1
    if padded:
        H, W, pt, pl = r1, Wp, 0, 0
    else:
        H, W, pt, pl = H0, W0, pt0, pl0
    a0 = nb.carray(stack_f32(16), 16)
    a1 = nb.carray(stack_f32(16), 16)
    a2 = nb.carray(stack_f32(16), 16)
    a3 = nb.carray(stack_f32(16), 16)
    a4 = nb.carray(stack_f32(16), 16)
    a5 = nb.carray(stack_f32(16), 16)
    a6 = nb.carray(stack_f32(16), 16)
    a7 = nb.carray(stack_f32(16), 16)
    bv = nb.carray(stack_f32(16), 16)
    tmp = nb.carray(stack_f32(128), 128)
    al, be = np.float32(alpha), np.float32(beta)
    # a clip (ReLU6: every MobileNetV2 depthwise layer) without a residual is applied in the stores: the
    # pass over the stored rows cost ~8 us of a 7x7 x 576 layer's 29 on one core (Ice Lake VM)
    clip = code == 2 and not has_res
    xf = nb.carray(_data_ptr(xf), xf.size)   # plain views (see _data_ptr)
    spv = nb.carray(_data_ptr(sp), sp.size)
    wf = nb.carray(_data_ptr(wf), wf.size)
    of = nb.carray(_data_ptr(of), of.size)
    sums = rs.size > 0
    # rows whose values are final only after the residual / activation pass (`_finish_row`)
    deferred = has_res or (code != 0 and not clip)
    # interior columns [owa, owb): every kw tap inside the image
    owa = (pl + sw - 1) // sw
    lim = W - 1 + pl - (KW - 1) * dw
    owb = min(Wo, lim // sw + 1) if lim >= 0 else 0
    if owb <= owa:
        owa = Wo
        owb = Wo
    na = min(owa, Wo)
    rstep = np.uint64(dh * W * 16)
    s16 = sw * 16
    for ob in range(ob0, ob1):
        if padded:
            _fill_padded(spv, xf, (n * Cb + ob) * H0 * W0 * 16, H0, W0, r0, r1, pt0, pl0, Wp)
            src = spv
            xbase = -r0 * Wp * 16                   # padded row r lives at (r - r0) * Wp * 16
        else:
            src = xf
            xbase = (n * Cb + ob) * H * W * 16
        obase = (n * Ob + ob) * Ho * Wo * 16
        wbase = ob * KH * KW * 16
        for l in range(16):
            bv[l] = bias[ob * 16 + l]
        fin0 = obase + oh0 * Wo * 16        # rows from here on still wait for the residual / activation
        srow = oh0                          # rows from here on are not summed yet (rs)
        for oh in range(oh0, oh1):
            ih0 = oh * sh - pt
            kh_lo, kh_hi = _row_taps(ih0, dh, KH, H)
            nk = kh_hi - kh_lo
            orow = obase + oh * Wo * 16
            # interior: blocks of RB positions
            for pb0 in range(owa, owb, RB):
                # a short last block moves left to end at owb when the interior holds a whole block:
                # it recomputes a few positions of the previous block (the same values, the same
                # order) but runs the constant-offset code instead of the clamped one
                pb = max(owa, min(pb0, owb - RB))
                nv = min(RB, owb - pb)
                for l in range(16):
                    a0[l] = 0.0
                    a1[l] = 0.0
                    a2[l] = 0.0
                    a3[l] = 0.0
                    a4[l] = 0.0
                    a5[l] = 0.0
                    a6[l] = 0.0
                    a7[l] = 0.0
                k = np.uint64(xbase + ((ih0 + kh_lo * dh) * W + pb * sw - pl) * 16)
                wk = np.uint64(wbase + kh_lo * KW * 16)
                # the common geometries with constant offsets; 5x5 stride 2 in column order (`_depthwise_gen`,
                # COL_BLOCKS below: 1.2-1.3x faster there, 1.04-1.17x slower for the others, Zen 3)
                if nv == RB and dw == 1 and sw == 1 and KW == 3:
                    _block(src, wf, a0, a1, a2, a3, a4, a5, a6, a7, k, wk, nk, rstep, 3,
                           16, 32, 48, 64, 80, 96, 112, 16)
                elif nv == RB and dw == 1 and sw == 2 and KW == 3:
                    _block(src, wf, a0, a1, a2, a3, a4, a5, a6, a7, k, wk, nk, rstep, 3,
                           32, 64, 96, 128, 160, 192, 224, 16)
                elif nv == RB and dw == 1 and sw == 1 and KW == 5:
                    _block(src, wf, a0, a1, a2, a3, a4, a5, a6, a7, k, wk, nk, rstep, 5,
                           16, 32, 48, 64, 80, 96, 112, 16)
                elif nv == RB and dw == 1 and sw == 2 and KW == 5:
                    _dg._cols_k5s2p8(src, wf, a0, a1, a2, a3, a4, a5, a6, a7, k, wk, nk, rstep)
                elif nv == RB and dw == 1 and sw == 1 and KW == 7:
                    _block(src, wf, a0, a1, a2, a3, a4, a5, a6, a7, k, wk, nk, rstep, 7,
                           16, 32, 48, 64, 80, 96, 112, 16)
                # 7-wide maps (the last stage of MobileNet / EfficientNet): 7 positions, the 8th accumulator
                # untouched. (`_block` with an 8th position repeating the 7th gave LLVM two uses of each of the
                # 7th's products, which it then did not fuse into the additions: that position's bits were a
                # multiply and an add, not the spec's fma; tests/test_depthwise.py::
                # test_depthwise_every_path_is_the_fma_sequence)
                elif nv == 7 and dw == 1 and sw == 1 and KW == 3:
                    _dg._cols_k3s1p7(src, wf, a0, a1, a2, a3, a4, a5, a6, a7, k, wk, nk, rstep)
                elif nv == 7 and dw == 1 and sw == 2 and KW == 3:
                    _dg._cols_k3s2p7(src, wf, a0, a1, a2, a3, a4, a5, a6, a7, k, wk, nk, rstep)
                elif nv == 7 and dw == 1 and sw == 1 and KW == 5:
                    _dg._cols_k5s1p7(src, wf, a0, a1, a2, a3, a4, a5, a6, a7, k, wk, nk, rstep)
                elif nv == 7 and dw == 1 and sw == 2 and KW == 5:
                    _dg._cols_k5s2p7(src, wf, a0, a1, a2, a3, a4, a5, a6, a7, k, wk, nk, rstep)
                else:
                    # any geometry; a partial last block repeats its final position (clamped offsets)
                    _block(src, wf, a0, a1, a2, a3, a4, a5, a6, a7, k, wk, nk, rstep, KW,
                           min(1, nv - 1) * s16, min(2, nv - 1) * s16, min(3, nv - 1) * s16, min(4, nv - 1) * s16,
                           min(5, nv - 1) * s16, min(6, nv - 1) * s16, min(7, nv - 1) * s16, dw * 16)
                # + bias, stored in one lane loop with constant offsets (separate per-position loops
                # or runtime offsets here cost 2-3x: the accumulators leave the registers)
                d = np.uint64(orow + pb * 16)
                if nv == RB:
                    if clip:
                        _store8_clip(of, d, a0, a1, a2, a3, a4, a5, a6, a7, bv, al, be)
                    else:
                        _store8(of, d, a0, a1, a2, a3, a4, a5, a6, a7, bv)
                else:
                    if clip:
                        _store8_clip(tmp, np.uint64(0), a0, a1, a2, a3, a4, a5, a6, a7, bv, al, be)
                    else:
                        _store8(tmp, np.uint64(0), a0, a1, a2, a3, a4, a5, a6, a7, bv)
                    for i in range(nv * 16):
                        of[d + np.uint64(i)] = tmp[i]
            # border positions: left [0, owa) and right [owb, Wo), kw limited to the taps inside
            for i in range(na + Wo - owb):
                ow = i if i < na else owb + (i - na)
                iw0 = ow * sw - pl
                kw_lo, kw_hi = _row_taps(iw0, dw, KW, W)
                for l in range(16):
                    a0[l] = 0.0
                k = np.uint64(xbase + ((ih0 + kh_lo * dh) * W + iw0 + kw_lo * dw) * 16)
                wk = np.uint64(wbase + (kh_lo * KW + kw_lo) * 16)
                for _ in range(nk):
                    kk = k
                    ww = wk
                    for kw in range(kw_lo, kw_hi):
                        for l in range(16):
                            u = np.uint64(l)
                            a0[l] += src[kk + u] * wf[ww + u]
                        kk += np.uint64(dw * 16)
                        ww += np.uint64(16)
                    k += rstep
                    wk += np.uint64(KW * 16)
                if clip:
                    _store_clip(of, np.uint64(orow + ow * 16), a0, bv, al, be)
                else:
                    _store(of, np.uint64(orow + ow * 16), a0, bv)
            # the residual and activation pass runs over whole rows of the block at once, FINISH_SPAN
            # floats or more (still in L1): one call per row cost ~150 cycles on a 7-wide map's row
            end = orow + Wo * 16
            if deferred and (end - fin0 >= FINISH_SPAN or oh == oh1 - 1):
                _finish_row(of, rf, fin0, end - fin0, has_res, code, al, be)
                fin0 = end
            if sums and (not deferred or fin0 == end):    # rows [srow, oh] are final: their sums
                for r in range(srow, oh + 1):
                    row_sum16(of, obase + r * Wo * 16, Wo, rs, ((n * Ob + ob) * Ho + r) * 16)
                srow = oh + 1


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def _dw_task_gather(o2, x2, w2, bias, src, r2, has_res, code, alpha, beta, n, ob0, ob1, oh0, oh1, geo):
    """Channel multiplier > 1: output lane l of block ob reads input channel src[ob*16 + l]
    (a lane gather), one output position at a time, same per-value order as `_dw_task`."""
    Cb, H, W, Ob, Ho, Wo = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
    KH, KW, sh, sw, dh, dw, pt, pl = geo[6], geo[7], geo[8], geo[9], geo[10], geo[11], geo[12], geo[13]
    a0 = nb.carray(stack_f32(16), 16)
    xb = np.empty(16, np.int64)   # input plane (row offset in x2) of each lane
    xl = np.empty(16, np.int64)   # input lane
    al, be = np.float32(alpha), np.float32(beta)
    for ob in range(ob0, ob1):
        for l in range(16):
            c = int(src[ob * 16 + l])
            xb[l] = (n * Cb + c // 16) * H * W
            xl[l] = c % 16
        obase = (n * Ob + ob) * Ho * Wo
        wbase = ob * KH * KW
        for oh in range(oh0, oh1):
            ih0 = oh * sh - pt
            kh_lo, kh_hi = _row_taps(ih0, dh, KH, H)
            for ow in range(Wo):
                iw0 = ow * sw - pl
                kw_lo, kw_hi = _row_taps(iw0, dw, KW, W)
                for l in range(16):
                    a0[l] = 0.0
                for kh in range(kh_lo, kh_hi):
                    for kw in range(kw_lo, kw_hi):
                        p = (ih0 + kh * dh) * W + iw0 + kw * dw
                        wv = w2[wbase + kh * KW + kw]
                        for l in range(16):
                            a0[l] += x2[xb[l] + p, xl[l]] * wv[l]
                orr = o2[obase + oh * Wo + ow]
                for l in range(16):
                    v = a0[l] + bias[ob * 16 + l]
                    if has_res:
                        v += r2[obase + oh * Wo + ow, l]
                    orr[l] = apply_scalar(code, v, al, be)


@njit(parallel=True, nogil=True, cache=True)
def _dw_par(nt, tasks, of, xf, wf, bias, rf, has_res, code, alpha, beta, geo, band, padded, rs):
    """Every task (rows (n, ob0, ob1, oh0, oh1)) on nt of numba's threads, handed out dynamically
    (a shared counter: a thread the OS does not schedule never holds a fixed share); band
    (threads, size) scratch."""
    counter = new_counter(nt)
    for _w in nb.prange(nt):
        _dw_seq(counter, nb.get_thread_id(), tasks, of, xf, wf, bias, rf, has_res, code, alpha, beta, geo, band, padded,
                rs)


@njit(nogil=True, cache=True)
def _dw_seq(counter, tid, tasks, of, xf, wf, bias, rf, has_res, code, alpha, beta, geo, band, padded, rs):
    """One worker of the task loop on the calling thread: tasks taken from `counter` (threads.numba_region)."""
    while True:
        i = take(counter, tid, tasks.shape[0])
        if i < 0:
            break
        _dw_task(of, xf, wf, bias, rf, has_res, code, alpha, beta, tasks[i, 0], tasks[i, 1], tasks[i, 2],
                 tasks[i, 3], tasks[i, 4], geo, band[tid], padded, rs)


def run_nchwc(out_b, x_b, prepared, residual_b=None, *, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
              relu=False, act=None, threads=None, row_sums=None) -> None:
    """x_b (N, Cb, H, W, 16) unpadded -> out_b (N, Ob, Ho, Wo, 16), y = act(conv + bias + residual).

    act: an activation of kernels/activations.py as epilogue.resolve_act takes it (relu=True is act relu).
    row_sums: None, or a float32 (N, Ob, Ho, 16) array given each output row's sum over its positions
    (`_dw_task`'s rs; multiplier 1 only)."""
    wd, bias = prepared["weight"], prepared["bias"]
    src = prepared.get("src")
    n, cb, h, w, _ = x_b.shape
    _, ob, ho, wo, _ = out_b.shape
    obw, kh, kw, _ = wd.shape
    if obw != ob or bias.shape != (ob * LANES,):
        raise ValueError(f"depthwise (NCHWc): weight {wd.shape} / bias {bias.shape} do not match the output "
                         f"{out_b.shape}; expected ({ob}, KH, KW, 16) / ({ob * LANES},)")
    if src is None and cb != ob:
        raise ValueError(f"depthwise (NCHWc): input has {cb} channel blocks, output {ob}; with multiplier 1 "
                         f"they must be equal (prepare() adds 'src' for a multiplier > 1)")
    code, alpha, beta = resolve_act(relu, act, "depthwise")
    has_res = residual_b is not None
    if has_res and residual_b.shape != out_b.shape:
        raise ValueError(f"depthwise (NCHWc): residual {residual_b.shape} != output {out_b.shape}")
    threads = resolve_threads(threads)
    geo, table, padded, band_len = _call_plan(n, cb, h, w, ob, ho, wo, kh, kw, tuple(stride), padding[0], padding[2],
                                              tuple(dilation), threads, src is not None, PADDED)
    of, xf = out_b.reshape(-1), x_b.reshape(-1)   # flat views, no copy
    if src is not None:
        if row_sums is not None:
            raise ValueError("depthwise (NCHWc): row sums with a channel multiplier > 1 are not supported")
        # (N, C, H, W, 16) -> (N*C*H*W, 16): one vector per row (the gather variant)
        o2, x2, w2 = out_b.reshape(-1, LANES), x_b.reshape(-1, LANES), wd.reshape(-1, LANES)
        r2 = residual_b.reshape(-1, LANES) if has_res else EMPTY2
        parallel_for(lambda tk: _dw_task_gather(o2, x2, w2, bias, src, r2, has_res, code, alpha, beta, tk[0], tk[1],
                                                tk[2], tk[3], tk[4], geo), table.tolist(), threads)
        return
    rf = residual_b.reshape(-1) if has_res else EMPTY1
    rs = EMPTY1
    if row_sums is not None:
        if row_sums.shape != (n, ob, ho, LANES) or row_sums.dtype != np.float32 or not row_sums.flags.c_contiguous:
            raise ValueError(f"depthwise (NCHWc): row sums {row_sums.shape} {row_sums.dtype}; expected a contiguous "
                             f"float32 ({n}, {ob}, {ho}, {LANES})")
        rs = row_sums.reshape(-1)
    # one padded-band scratch row per thread of the region (thread ids range over numba's pool)
    nrows = numba_max_threads() if region_threads(threads, len(table)) > 1 else 1
    band = scratch("dw_band", (nrows, band_len))
    numba_region(_dw_par, _dw_seq, threads, len(table), table, of, xf, wd.reshape(-1), bias, rf, has_res, code, alpha,
                 beta, geo, band, padded, rs)


@functools.lru_cache(maxsize=1024)
def _call_plan(n, cb, h, w, ob, ho, wo, kh, kw, stride, pt, pl, dilation, threads, gather, forced):
    """Everything run_nchwc derives from the shapes alone, once per layer shape (it cost ~15 us a call,
    as much as a 7x7 layer's kernel): geo (the kernel's geometry vector), the task table (T, 5),
    whether the row loop reads a padded band, and the band's scratch length per thread. The
    arrays are shared between calls (never written)."""
    sh, sw = stride
    dh, dw = dilation
    geo = np.array([cb, h, w, ob, ho, wo, kh, kw, sh, sw, dh, dw, pt, pl], np.int64)
    tasks = plan_tasks(n, ob, ho, wo, kh * kw, threads)
    table = np.array(tasks, np.int64).reshape(-1, 5)
    padded = (forced if forced is not None else use_padded(ho, wo, kw, sw)) and not gather
    wp = (wo - 1) * sw + (kw - 1) * dw + 1
    band_rows = max(t[4] - t[3] for t in tasks) * sh + (kh - 1) * dh if padded else 0
    return geo, table, bool(padded), max(1, band_rows * wp * LANES)


def run(out, x, prepared, residual=None, *, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), relu=False,
        act=None, threads=None) -> None:
    """NCHW in, NCHW out: block the input (and residual), run the NCHW16c kernel, unblock."""
    n, co, ho, wo = out.shape
    xb = to_nchwc(x, threads=threads)
    rb = to_nchwc(residual, threads=threads) if residual is not None else None
    ob = prepared["weight"].shape[0]
    out_b = np.empty((n, ob, ho, wo, LANES), np.float32)
    run_nchwc(out_b, xb, prepared, rb, stride=stride, padding=padding, dilation=dilation, relu=relu, act=act,
              threads=threads)
    from_nchwc(out_b, co, out=out, threads=threads)


# Column-order register blocks, generated (`_depthwise_gen.py`, committed; tests check it is current) ----------
# `_block`'s loop is tap-major: for each tap kw, 8 positions' FMAs. With stride S, position r's tap kw reads
# input column S r + kw, so a column feeds up to ceil(KW / S) (position, tap) pairs. For 5x5 stride 2 LLVM
# kept the columns shared between the unrolled taps live (common loads) and spilled the accumulators: 144 ch
# 56 -> 28 ran 165 us against ORT's 104 (Zen 3, 2 threads). The generated blocks run column-major: each of the
# S (P - 1) + KW columns of a kernel row is loaded once and used at once, the row's KW weights stay in
# registers (8 accumulators + KW weights + 1 column: 12-16 of the 16 ymm registers). Every accumulator still
# adds kh ascending, then kw ascending: the same bits as `_block`. P = 7 (7-wide maps) leaves the 8th
# accumulator alone (its store copies 7 positions); `_block` would need an 8th position to read, and one
# that repeats the 7th costs the 7th its fused multiply-adds (see `_dw_task`). For 8-position blocks of 3x3
# stride 1 / 2 and 5x5 stride 1 the column order was 1.04-1.17x slower than `_block` (one Zen 3 core), so
# those stay tap-major.
COL_BLOCKS = ((5, 2, 8), (3, 1, 7), (3, 2, 7), (5, 1, 7), (5, 2, 7))


def _gen_cols(kw_n: int, s: int, p: int) -> str:
    name = f"_cols_k{kw_n}s{s}p{p}"
    acc = ", ".join(f"a{r}" for r in range(8))
    args = f"xf, wf, {acc}, k, wk, nk, rstep"
    out = ['@njit(inline="always", cache=True, fastmath=FASTMATH)',
           f"def {name}({args}):",
           f'    """`depthwise._block` for KW = {kw_n}, stride {s}, dilation 1, {p} positions, in column order."""',
           "    if NARROW:",
           f"        {name}_lanes({args}, 0, 8)",
           f"        {name}_lanes({args}, 8, 8)",
           "    else:",
           f"        {name}_lanes({args}, 0, 16)",
           "", "",
           '@njit(inline="always", cache=True, fastmath=FASTMATH)',
           f"def {name}_lanes({args}, h0, nl):",
           "    for _ in range(nk):",
           "        for l in range(h0, h0 + nl):",
           "            u = np.uint64(l)"]
    out += [f"            w{t} = wf[wk + np.uint64({16 * t}) + u]" for t in range(kw_n)]
    bs = ", ".join(f"b{r}" for r in range(p))
    out.append(f"            {bs} = " + ", ".join(f"a{r}[l]" for r in range(p)))
    for c in range(s * (p - 1) + kw_n):
        out.append(f"            x = xf[k + np.uint64({16 * c}) + u]")
        out += [f"            b{r} += x * w{c - s * r}" for r in range(p) if 0 <= c - s * r < kw_n]
    out.append("            " + ", ".join(f"a{r}[l]" for r in range(p)) + f" = {bs}")
    out += ["        k += rstep", f"        wk += np.uint64({16 * kw_n})"]
    return "\n".join(out) + "\n"


def generate_block_source() -> str:
    head = ('"""GENERATED by tilefuse.kernels.conv.depthwise.generate_block_source(); do not edit.\n\n'
            'Column-order register blocks of the depthwise kernel (see depthwise.COL_BLOCKS)."""\n'
            "import numpy as np\nfrom numba import njit\n\nfrom tilefuse.kernels.conv.tiles import NARROW\n\n"
            "FASTMATH = {" + ", ".join(repr(f) for f in sorted(FASTMATH)) + "}\n\n\n")
    return head + "\n\n".join(_gen_cols(*b) for b in COL_BLOCKS)


if __name__ == "__main__":
    import pathlib
    path = pathlib.Path(__file__).with_name("_depthwise_gen.py")
    path.write_text(generate_block_source())
    print(f"wrote {path}")
