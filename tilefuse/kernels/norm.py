"""Normalization kernels: layer norm over trailing axes, channel norm (LayerNorm2d, L2Norm) at inference.

channel_norm normalizes each (n, h, w) position over the C channels of an NCHW tensor (ConvNeXt's
permute -> LayerNorm -> permute, recognized by the compiler as one op): a numba loop per image
that reads channel rows with unit stride, two passes (mean, then the centred variance, as the
reference: no cancellation), accumulating in float32 over C <= a few thousand channels:
within 1e-5 of the float64-accumulating reference; on NCHW16c the same per position over the
lanes in use. Its l2 modes (SSD's L2Norm x / (||x|| + eps), F.normalize's x / max(||x||, eps)) skip the
mean pass: the same loops with mean 0. layer_norm (over the trailing axes) runs rows of the same two passes on
the pool.

Batch norm for training (the second half of this module): statistics, apply, and their backward
passes (seed 004). The unfused passes run on channel rows of CNHW tensors (`cnhw.rows`), one
range of channels per task of the step's thread split; the fused schedule computes the same sums inside the conv
kernels (`train_conv.py`) and uses `BNState` for the algebra. `batch_norm_forward` /
`batch_norm_backward` are the NCHW (or (N, C)) free functions the tests check against PyTorch.
Inference batch norm is folded into convs by the compiler, or runs as a `scale`.

Batch-norm algebra (paper eqs. 9-18; the printed eq. 11 ``F2 = beta - mu + F1`` is a typo for
``beta - mu*F1``):
    F1 = gamma / sqrt(var + eps),  F2 = beta - mu*F1,  F3 = 1 / (var + eps)
    forward  y  = F1*x + F2,     var = E[x^2] - mu^2 (biased)
    backward dx = F1*dy + B*x + C,  S1 = mean(dy), S2 = mean(dy*x)
             B  = F1*F3*(mu*S1 - S2),  C = -mu*B - F1*S1
             dgamma = m*(S2 - mu*S1)/sqrt(var + eps),  dbeta = m*S1
Sums are accumulated in float64.
"""
from __future__ import annotations

import numba as nb
import numpy as np
from numba import njit

from . import reference as ref
from .cnhw import JITR, rows, rows_split, to_cnhw, to_nchw, unrows
from .conv._nb import atomic_add, reduce16
from .activations import apply_span
from .fpflags import FAST
from .threads import numba_region, parallel_for, pool_region


# Shifted sums: both channel-norm kernels take the mean as channel 0's value plus the mean of the differences from
# it, so a position whose channels are all equal (a constant pad, a saturated ReLU6) gets its value exactly as
# mean, x - mean = 0, and the output is beta, as PyTorch's LayerNorm gives. Summing x itself, the float32 mean of C
# equal values missed by an ulp, which 1 / sqrt(0 + eps) magnified: up to 1.9e-3 (times gamma) instead of 0 at
# eps = 1e-6 (tests/test_kernels_modern.py::test_channel_norm_of_a_constant_position_is_beta).
# The channel norm's flags: FAST without reassociation (its loops run along a row, across positions, so they
# vectorize without it), which would let LLVM regroup acc + (x - x0) as (acc + x) - x0 and lose the shifted
# sums' exactness
CN_FASTMATH = {"contract", "nsz", "arcp", "afn"}


# the channel norm's modes (reference.CHANNEL_NORM_MODES) as the kernels' integer
CN_MODES = {"layer": 0, "l2": 1, "l2_clamp": 2}


@njit(inline="always")
def _cn_scale(t, inv_c, eps, mode):
    """The factor a position's values are multiplied by, from t = the sum of its squared (centred) values:
    layer 1 / sqrt(t / C + eps), l2 1 / (sqrt(t) + eps), l2_clamp 1 / max(sqrt(t), eps) (NaN stays NaN)."""
    if mode == 0:
        return np.float32(1.0) / np.sqrt(t * inv_c + eps)
    r = np.sqrt(t)
    if mode == 1:
        return np.float32(1.0) / (r + eps)
    return np.float32(1.0) / (r if r >= eps or r != r else eps)


@njit(nogil=True, cache=True, fastmath=CN_FASTMATH, error_model="numpy")   # 1 / 0 is inf (eps = 0)
def _channel_norm_image(out, x, gamma, beta, eps, n, mode):
    """x, out (N, C, S): normalize each column s over C (mode: CN_MODES; the l2 modes take mean 0)."""
    C, S = x.shape[1], x.shape[2]
    mean = np.zeros(S, np.float32)
    var = np.zeros(S, np.float32)
    inv_c = np.float32(1.0) / np.float32(C)
    if mode == 0:
        for c in range(C):     # sums of x - x[channel 0] (shifted sums, above)
            for s in range(S):
                mean[s] += x[n, c, s] - x[n, 0, s]
        for s in range(S):
            mean[s] = x[n, 0, s] + mean[s] * inv_c
    for c in range(C):
        for s in range(S):
            d = x[n, c, s] - mean[s]
            var[s] += d * d
    for s in range(S):
        var[s] = _cn_scale(var[s], inv_c, eps, mode)
    for c in range(C):
        g, b = gamma[c], beta[c]
        for s in range(S):
            out[n, c, s] = (x[n, c, s] - mean[s]) * var[s] * g + b


@njit(nogil=True, cache=True, fastmath=CN_FASTMATH, error_model="numpy")
def _channel_norm_rows(o4, x4, gt, bt, eps, C, n, h0, h1, mode):
    """x4, o4: (N, Cb, H, W*16) views of NCHW16c tensors, C real channels; gt, bt: (Cb, W*16), gamma and
    beta per lane tiled along the row. Rows [h0, h1) of image n, each (h, w) normalized over the C lanes
    in use (the padded lanes are never read and are written 0). A row at a time, every
    loop over the row's W x 16 contiguous floats of a block (vectorized): acc[w*16 + l] sums lane l of
    every block (the whole blocks, then the partial one's lanes), the 16 lane sums then added for the
    position's sum and spread over its 16 lanes again (mean, rstd); two passes (mean, then the centred
    variance: no cancellation) and the output, over the row's blocks while they are in L1. A position's
    result depends on its own values only: the task split never changes a bit. (One position at a time
    over the blocks, a scalar sum, it ran ~4 GB/s: 9.8 ms of ConvNeXt-Tiny's batch-1 time against ORT's
    3.8 for LayerNormalization; with a W x 16 nest for the output, which numba leaves scalar (LLVM
    unrolls the 16 and numba runs no SLP vectorizer), 2-3x slower than with the tiled gamma/beta.)"""
    Cb, RW = x4.shape[1], x4.shape[3]
    W = RW // 16
    full = C // 16
    rem = C - full * 16
    inv_c = np.float32(1.0) / np.float32(C)
    acc = np.empty(RW, np.float32)
    mean = np.empty(RW, np.float32)     # per lane: its position's mean
    rstd = np.empty(RW, np.float32)
    shift = np.empty(RW, np.float32)    # per lane: its position's channel 0 (shifted sums)
    if mode != 0:
        for i in range(RW):
            mean[i] = 0.0
    for h in range(h0, h1):
        if mode == 0:
            x0 = x4[n, 0, h]
            for w in range(W):
                shift[w * 16:w * 16 + 16] = x0[w * 16]
            for i in range(RW):
                acc[i] = 0.0
            for cb in range(full):
                xr = x4[n, cb, h]
                for i in range(RW):
                    acc[i] += xr[i] - shift[i]
            if rem:
                xr = x4[n, full, h]
                for w in range(W):
                    for l in range(rem):
                        acc[w * 16 + l] += xr[w * 16 + l] - shift[w * 16 + l]
            for w in range(W):
                t = np.float32(0.0)
                for l in range(16):
                    t += acc[w * 16 + l]
                t = shift[w * 16] + t * inv_c
                for l in range(16):
                    mean[w * 16 + l] = t
        for i in range(RW):
            acc[i] = 0.0
        for cb in range(full):
            xr = x4[n, cb, h]
            for i in range(RW):
                d = xr[i] - mean[i]
                acc[i] += d * d
        if rem:
            xr = x4[n, full, h]
            for w in range(W):
                for l in range(rem):
                    d = xr[w * 16 + l] - mean[w * 16 + l]
                    acc[w * 16 + l] += d * d
        for w in range(W):
            t = np.float32(0.0)
            for l in range(16):
                t += acc[w * 16 + l]
            r = _cn_scale(t, inv_c, eps, mode)
            for l in range(16):
                rstd[w * 16 + l] = r
        for cb in range(Cb):
            xr = x4[n, cb, h]
            orow = o4[n, cb, h]
            g = gt[cb]
            b = bt[cb]
            if cb < full:
                for i in range(RW):
                    orow[i] = (xr[i] - mean[i]) * rstd[i] * g[i] + b[i]
            else:       # the partial block (its padded lanes, never read: 0) and any block past C
                for w in range(W):
                    for l in range(16):
                        i = w * 16 + l
                        orow[i] = (xr[i] - mean[i]) * rstd[i] * g[i] + b[i] if cb * 16 + l < C else np.float32(0.0)


@njit(nogil=True, cache=True)
def _channel_norm_seq(counter, tid, o4, x4, gt, bt, eps, C, N, H, rows, mode):
    """One worker (threads.numba_region): task i = image i // bands, rows [(i % bands) * rows, + rows)."""
    bands = (H + rows - 1) // rows
    total = N * bands
    while True:
        i = atomic_add(counter, 0, 1)
        if i >= total:
            break
        h0 = (i % bands) * rows
        _channel_norm_rows(o4, x4, gt, bt, eps, C, i // bands, h0, min(H, h0 + rows), mode)


@njit(parallel=True, nogil=True, cache=True)
def _channel_norm_par(nt, o4, x4, gt, bt, eps, C, N, H, rows, mode):
    counter = np.zeros(1, np.int64)
    for _w in nb.prange(nt):
        _channel_norm_seq(counter, nb.get_thread_id(), o4, x4, gt, bt, eps, C, N, H, rows, mode)


CN_TASK_VALUES = 1 << 14   # about this many values a channel-norm task (rows of one image; from the shape only)


def channel_norm(out, x, gamma, beta, *, eps, threads=None, layout="nchw", channels=None, mode="layer", **_):
    m = CN_MODES[mode]
    if layout == "nchwc":
        n, cb, h, w, _ = x.shape
        rows = max(1, min(h, CN_TASK_VALUES // max(1, cb * w * 16)))
        # gamma, beta padded to whole blocks, each block's 16 lanes repeated along a row:
        # (C,) -> (Cb*16,) -> (Cb, 1, 16) -> broadcast (Cb, W, 16) -> (Cb, W*16)
        gt, bt = np.empty((cb, w, 16), np.float32), np.empty((cb, w, 16), np.float32)
        for t, v in ((gt, gamma), (bt, beta)):
            v16 = np.zeros(cb * 16, np.float32)
            v16[:channels] = v[:channels]
            t[...] = v16.reshape(cb, 1, 16)
        gt, bt = gt.reshape(cb, -1), bt.reshape(cb, -1)
        # (N, Cb, H, W, 16) -> (N, Cb, H, W*16): one row of a block is contiguous (views; a strided
        # out or x is written through / read from a contiguous copy)
        o = out if out.flags.c_contiguous else np.empty(out.shape, np.float32)
        numba_region(_channel_norm_par, _channel_norm_seq, threads, n * -(-h // rows), o.reshape(n, cb, h, -1),
                     np.ascontiguousarray(x).reshape(n, cb, h, -1), gt, bt, np.float32(eps), int(channels), n, h,
                     int(rows), m)
        if o is not out:
            out[...] = o
        return
    if out.dtype != np.float32:
        out[...] = ref.channel_norm(x, gamma, beta, eps, mode)
        return
    n, c = x.shape[0], x.shape[1]
    # (N, C, H, W) -> (N, C, H*W)
    x3, o3 = x.reshape(n, c, -1), out.reshape(n, c, -1)
    parallel_for(lambda i: _channel_norm_image(o3, x3, gamma, beta, np.float32(eps), i, m), range(n), threads)


@njit(nogil=True, cache=True, fastmath=CN_FASTMATH, error_model="numpy")
def _layer_norm_rows(out, x, gamma, beta, eps, r0, r1):
    """Rows [r0, r1) of (R, K), each normalized over its K values: the shifted sums of the channel norm (the
    mean as the row's first value plus the mean of the differences: exact for a constant row), then the centred
    variance, then (x - mean) * rstd * gamma + beta; float32 as the reference. The two sums over 16 lanes in one
    register (`reduce16`, then the tail): a scalar sum was one add's latency per value (8 x 256 x 192 on one Zen 5
    core: 0.56 -> 0.08 ms, PyTorch 0.28 without an affine, 0.15 with one)."""
    K = x.shape[1]
    n16 = K // 16
    K16 = 16 * n16
    inv_k = np.float32(1.0) / np.float32(K)
    one = np.float32(1.0)
    for r in range(r0, r1):
        xr, orow = x[r], out[r]
        x0 = xr[0]
        acc = reduce16(xr, 0, n16, x0, one, 1)
        for k in range(K16, K):
            acc += xr[k] - x0
        mean = x0 + acc * inv_k
        acc = reduce16(xr, 0, n16, mean, one, 2)
        for k in range(K16, K):
            d = xr[k] - mean
            acc += d * d
        rstd = np.float32(1.0) / np.sqrt(acc * inv_k + eps)
        for k in range(K):
            orow[k] = (xr[k] - mean) * rstd * gamma[k] + beta[k]


_F32_TINY = float(np.finfo(np.float32).tiny)
LN_TASK_VALUES = 1 << 15   # about this many values a layer-norm task (whole rows; from the shape only)


@njit(nogil=True, cache=True)
def _layer_norm_seq(counter, tid, out, x, gamma, beta, eps, rows):
    """One worker: tasks of `rows` rows taken from `counter` (threads.pool_region)."""
    R = x.shape[0]
    while True:
        r0 = atomic_add(counter, 0, 1) * rows
        if r0 >= R:
            break
        _layer_norm_rows(out, x, gamma, beta, eps, r0, min(R, r0 + rows))


def layer_norm(out, x, gamma, beta, *, axis=-1, eps=1e-5, threads=None, **_):
    """Layer norm over the trailing axes [axis, rank) (torch LayerNorm(x.shape[axis:])): (..., K) rows on the
    pool (a transformer block's tokens, LayerNorm2d after a permute); other dtypes or layouts: the reference."""
    if x.dtype != np.float32 or not x.flags.c_contiguous or not out.flags.c_contiguous:
        out[...] = ref.layer_norm(x, gamma, beta, axis, eps)
        return
    k = int(np.prod(x.shape[axis % x.ndim:]))
    x2, o2 = x.reshape(-1, k), out.reshape(-1, k)       # (..., normalized axes) -> (R, K)
    g, b = np.ascontiguousarray(gamma, np.float32).reshape(-1), np.ascontiguousarray(beta, np.float32).reshape(-1)
    # an eps below float32's smallest normal is taken as it: the fastmath 1 / sqrt (a reciprocal square root
    # estimate) reads a subnormal var + eps as 0, and a constant row came out 0 x inf = NaN (ONNX eps=1e-45,
    # tests/onnx_mutants.py seed 2045711); it moves rstd by > 1 ulp only where var < 1e-31
    R, e = x2.shape[0], np.float32(max(eps, _F32_TINY) if eps > 0 else eps)
    rows = max(1, LN_TASK_VALUES // max(1, k))
    pool_region(_layer_norm_seq, threads, -(-R // rows), o2, x2, g, b, e, rows)


# ---------------------------------------------------------------------------- group norm
# GroupNorm / InstanceNorm at inference: one task per (image, group), a slab of C/G channel rows that NCHW keeps
# contiguous. Three passes over the slab: the mean, the centred variance (no cancellation where the mean is far
# above the spread), then y = (x - mean) * (gamma[c] * rstd) + beta[c], all three in float64 lanes (the slab is
# read from memory once and from cache twice: the kernel is memory bound, float64 costs nothing measurable), and
# the fused activation on each written row. Each slab is one task whatever the thread count: the same bits.
# reassoc lets LLVM vectorize the float64 sums (their order is the kernel's own, not the thread count's).
GN_FASTMATH = {"contract", "reassoc", "nsz", "arcp"}


@njit(nogil=True, cache=True, fastmath=GN_FASTMATH, error_model="numpy")
def _group_norm_slab(o3, x3, gamma, beta, eps, n, c0, cg, code, a, b):
    """x3, o3 (N, C, S): channels [c0, c0 + cg) of image n normalized together (one group)."""
    S = x3.shape[2]
    s1 = 0.0
    for c in range(c0, c0 + cg):
        xr = x3[n, c]
        t = 0.0
        for i in range(S):
            t += np.float64(xr[i])
        s1 += t
    cnt = np.float64(cg * S)
    mean = s1 / cnt
    s2 = 0.0
    for c in range(c0, c0 + cg):
        xr = x3[n, c]
        t = 0.0
        for i in range(S):
            d = np.float64(xr[i]) - mean
            t += d * d
        s2 += t
    rstd = 1.0 / np.sqrt(s2 / cnt + eps)
    for c in range(c0, c0 + cg):
        sc = np.float64(gamma[c]) * rstd
        sh = np.float64(beta[c])
        xr = x3[n, c]
        orow = o3[n, c]
        for i in range(S):
            orow[i] = np.float32((np.float64(xr[i]) - mean) * sc + sh)
        apply_span(orow, 0, S, code, a, b)


@njit(nogil=True, cache=True)
def _group_norm_seq(counter, tid, o3, x3, gamma, beta, eps, groups, code, a, b):
    """One worker (threads.numba_region): task i = image i // groups, group i % groups."""
    cg = x3.shape[1] // groups
    total = x3.shape[0] * groups
    while True:
        i = atomic_add(counter, 0, 1)
        if i >= total:
            break
        _group_norm_slab(o3, x3, gamma, beta, eps, i // groups, (i % groups) * cg, cg, code, a, b)


@njit(parallel=True, nogil=True, cache=True)
def _group_norm_par(nt, o3, x3, gamma, beta, eps, groups, code, a, b):
    counter = np.zeros(1, np.int64)
    for _w in nb.prange(nt):
        _group_norm_seq(counter, nb.get_thread_id(), o3, x3, gamma, beta, eps, groups, code, a, b)


# On NCHW16c a group's channels are lanes of one or more blocks, so the tasks are (image, block) pairs and the
# statistics come in two steps: each task sums its block's 16 lanes over the positions (float64, shifted by the
# lane's first value: x0, sum(x - x0), sum((x - x0)^2)), numpy adds the lanes of each group in a fixed order
# (mean, then the centred sum of squares from the shifted sums, exact algebra), and a second region writes
# y = (x - mean) * gamma[c] * rstd + beta[c] per lane and the activation, the padded lanes kept 0. Two reads of
# the input instead of NCHW's three, and no conversions around a group norm between blocked convs.

@njit(nogil=True, cache=True, fastmath=GN_FASTMATH)
def _gn_block_sums(part, x3, n, b):
    """x3 (N, Cb, S*16): part[n, b] = (x0, sum(x - x0), sum((x - x0)^2)) per lane of block b of image n."""
    row = x3[n, b]
    S = row.size // 16
    x0 = np.empty(16, np.float64)
    s1 = np.zeros(16, np.float64)
    s2 = np.zeros(16, np.float64)
    for lane in range(16):
        x0[lane] = row[lane]
    for p in range(S):
        for lane in range(16):
            d = np.float64(row[p * 16 + lane]) - x0[lane]
            s1[lane] += d
            s2[lane] += d * d
    for lane in range(16):
        part[n, b, 0, lane] = x0[lane]
        part[n, b, 1, lane] = s1[lane]
        part[n, b, 2, lane] = s2[lane]


@njit(nogil=True, cache=True)
def _gn_sums_seq(counter, tid, part, x3):
    total = x3.shape[0] * x3.shape[1]
    while True:
        i = atomic_add(counter, 0, 1)
        if i >= total:
            break
        _gn_block_sums(part, x3, i // x3.shape[1], i % x3.shape[1])


@njit(parallel=True, nogil=True, cache=True)
def _gn_sums_par(nt, part, x3):
    counter = np.zeros(1, np.int64)
    for _w in nb.prange(nt):
        _gn_sums_seq(counter, nb.get_thread_id(), part, x3)


@njit(nogil=True, cache=True, fastmath=GN_FASTMATH)
def _gn_block_apply(o3, x3, lm, ls, lb, n, b, lanes, code, a, be):
    """o3[n, b] = act((x - lm) * ls + lb) per lane (float64 arithmetic); lanes >= `lanes` (padding) set to 0."""
    row, orow = x3[n, b], o3[n, b]
    S = row.size // 16
    for p in range(S):
        for lane in range(16):
            orow[p * 16 + lane] = np.float32((np.float64(row[p * 16 + lane]) - lm[n, b, lane]) * ls[n, b, lane]
                                             + lb[b, lane])
    apply_span(orow, 0, S * 16, code, a, be)
    if lanes < 16:
        for p in range(S):
            for lane in range(lanes, 16):
                orow[p * 16 + lane] = np.float32(0.0)


@njit(nogil=True, cache=True)
def _gn_apply_seq(counter, tid, o3, x3, lm, ls, lb, C, code, a, be):
    cb = x3.shape[1]
    total = x3.shape[0] * cb
    while True:
        i = atomic_add(counter, 0, 1)
        if i >= total:
            break
        b = i % cb
        _gn_block_apply(o3, x3, lm, ls, lb, i // cb, b, min(16, C - b * 16), code, a, be)


@njit(parallel=True, nogil=True, cache=True)
def _gn_apply_par(nt, o3, x3, lm, ls, lb, C, code, a, be):
    counter = np.zeros(1, np.int64)
    for _w in nb.prange(nt):
        _gn_apply_seq(counter, nb.get_thread_id(), o3, x3, lm, ls, lb, C, code, a, be)


def _group_norm_blocked(out, x, gamma, beta, groups, eps, channels, code, al, be, threads):
    n, cb = x.shape[:2]
    c, cg = int(channels), int(channels) // groups
    # (N, Cb, H, W, 16) -> (N, Cb, H*W*16): a block's values are contiguous
    x3 = np.ascontiguousarray(x).reshape(n, cb, -1)
    o = out if out.flags.c_contiguous else np.empty(out.shape, np.float32)
    s = x3.shape[2] // 16
    part = np.empty((n, cb, 3, 16), np.float64)
    numba_region(_gn_sums_par, _gn_sums_seq, threads, n * cb, part, x3)
    # per channel (the lanes in use): x0, sum(x - x0), sum((x - x0)^2) -> (N, C) each
    x0, s1, s2 = (part[:, :, k, :].reshape(n, cb * 16)[:, :c] for k in range(3))
    mean = (x0 * s + s1).reshape(n, groups, cg).sum(axis=2) / (cg * s)            # (N, G)
    d = x0 - np.repeat(mean, cg, axis=1)                                            # x0 - mean, (N, C)
    var = (s2 + 2.0 * d * s1 + s * d * d).reshape(n, groups, cg).sum(axis=2) / (cg * s)
    rstd = 1.0 / np.sqrt(var + eps)
    lm, ls = np.zeros((n, cb * 16)), np.zeros((n, cb * 16))
    lm[:, :c] = np.repeat(mean, cg, axis=1)
    ls[:, :c] = np.repeat(rstd, cg, axis=1) * gamma[:c].astype(np.float64)
    lb = np.zeros(cb * 16)
    lb[:c] = beta[:c]
    numba_region(_gn_apply_par, _gn_apply_seq, threads, n * cb, o.reshape(n, cb, -1), x3, lm.reshape(n, cb, 16),
                 ls.reshape(n, cb, 16), lb.reshape(cb, 16), c, code, np.float32(al), np.float32(be))
    if o is not out:
        out[...] = o


def group_norm(out, x, gamma, beta, *, groups, eps, relu=False, act=None, threads=None, layout="nchw",
               channels=None, **_):
    """GroupNorm (InstanceNorm: groups = C) of (N, C, ...) NCHW or (N, Cb, H, W, 16) NCHW16c with `channels` real
    channels, with the fused activation (relu / act)."""
    from .activations import encode
    code, al, be = encode(*(act if act is not None else (("relu",) if relu else ("identity",))))
    if layout == "nchwc":
        _group_norm_blocked(out, x, gamma, beta, groups, eps, channels, code, al, be, threads)
        return
    if out.dtype != np.float32:
        out[...] = ref.group_norm(x, gamma, beta, groups, eps, relu, act)
        return
    n, c = x.shape[0], x.shape[1]
    o = out if out.flags.c_contiguous else np.empty(out.shape, np.float32)
    # (N, C, ...) -> (N, C, S): a group's channel rows are consecutive
    numba_region(_group_norm_par, _group_norm_seq, threads, n * groups, o.reshape(n, c, -1),
                 np.ascontiguousarray(x).reshape(n, c, -1), np.ascontiguousarray(gamma, np.float32),
                 np.ascontiguousarray(beta, np.float32), np.float64(eps), int(groups), code, np.float32(al),
                 np.float32(be))
    if o is not out:
        out[...] = o


KERNELS = {"channel_norm": channel_norm, "layer_norm": layer_norm, "group_norm": group_norm}
THREADED = frozenset({"channel_norm", "group_norm", "layer_norm"})
BLOCKED = frozenset({"channel_norm", "group_norm"})   # kernels with an NCHW16c form
ACT_KERNELS = frozenset({"group_norm"})   # kernels that apply their fused activation (relu / act) themselves


# ============================================================================ training: group norm
# GroupNorm / InstanceNorm in the trainer, on its CNHW activations: plain float64 numpy (a group of image n is
# channels [g*C/G, (g+1)*C/G) of column n: strided in CNHW). The forward keeps the per-(group, image) mean and
# 1/std for the backward:
#   xhat = (x - mean) * rstd,  y = gamma[c] * xhat + beta[c]
#   dgamma[c] = sum(dy * xhat), dbeta[c] = sum(dy)            (over images and positions)
#   g = dy * gamma[c],  dx = rstd * (g - mean(g) - xhat * mean(g * xhat))   (means over the group)

def group_norm_forward(x, gamma, beta, groups: int, eps: float):
    """x (C, N, ...) CNHW -> (y, mean, rstd); mean and rstd (G, 1, N, 1) float64."""
    c, n = x.shape[:2]
    xg = x.reshape(groups, c // groups, n, -1).astype(np.float64)     # (G, C/G, N, positions)
    mean = xg.mean(axis=(1, 3), keepdims=True)
    rstd = 1.0 / np.sqrt(((xg - mean) ** 2).mean(axis=(1, 3), keepdims=True) + eps)
    cshape = (groups, c // groups, 1, 1)
    y = (xg - mean) * rstd * gamma.astype(np.float64).reshape(cshape) + beta.astype(np.float64).reshape(cshape)
    return y.reshape(x.shape).astype(x.dtype), mean, rstd


def group_norm_backward(dy, x, gamma, mean, rstd, groups: int):
    """(dx, dgamma, dbeta) of group_norm_forward, dy and x CNHW."""
    c, n = x.shape[:2]
    shape = (groups, c // groups, n, -1)
    xhat = (x.reshape(shape).astype(np.float64) - mean) * rstd
    d = dy.reshape(shape).astype(np.float64)
    dgamma = (d * xhat).sum(axis=(2, 3)).reshape(c)
    dbeta = d.sum(axis=(2, 3)).reshape(c)
    g = d * gamma.astype(np.float64).reshape(groups, c // groups, 1, 1)
    dx = rstd * (g - g.mean(axis=(1, 3), keepdims=True) - xhat * (g * xhat).mean(axis=(1, 3), keepdims=True))
    return dx.reshape(x.shape).astype(x.dtype), dgamma, dbeta


# ============================================================================ training: batch norm

@nb.njit(**JITR)
def _row_sums(x2, s, ss):
    """s[c] = sum(x[c]), ss[c] = sum(x[c]^2) over rows of a (C, L) array (float64 products and sums)."""
    C, L = x2.shape
    for c in range(C):
        t = 0.0
        tt = 0.0
        for k in range(L):
            v = np.float64(x2[c, k])         # float64 products: var = E[x^2] - mean^2 cancels where |mean| >> std
            t += v
            tt += v * v
        s[c] = t
        ss[c] = tt


@nb.njit(**JITR)
def _row_affine(x2, a, b, out):
    C, L = x2.shape
    for c in range(C):
        for k in range(L):
            out[c, k] = a[c] * x2[c, k] + b[c]


@nb.njit(**JITR)
def _row_dot_sums(dy, x, s1, s2):
    """s1[c] = sum(dy[c]), s2[c] = sum(dy[c]*x[c])."""
    C, L = dy.shape
    for c in range(C):
        t = 0.0
        tt = 0.0
        for k in range(L):
            v = np.float64(dy[c, k])         # float64 products: B's mean*s1 - s2 cancels like the variance
            t += v
            tt += v * x[c, k]
        s1[c] = t
        s2[c] = tt


@nb.njit(**JITR)
def _row_bn_bwd(dy, x, f1, bb, cc, out):
    C, L = dy.shape
    for c in range(C):
        for k in range(L):
            out[c, k] = f1[c] * dy[c, k] + bb[c] * x[c, k] + cc[c]


class BNState:
    """Per-channel quantities of one batch norm in one training step (paper's F1, F2, F3)."""

    __slots__ = ("m", "mean", "var", "inv", "f1", "f2", "f3", "B", "C", "dgamma", "dbeta")

    def finalize_forward(self, s, ss, m, gamma, beta, eps, running=None, momentum=0.1):
        """Sums of x and x^2 over m values per channel -> F1, F2, F3; update running stats
        (PyTorch: unbiased variance, running = (1 - momentum)*running + momentum*batch)."""
        self.m = m
        self.mean = s / m
        self.var = np.maximum(ss / m - self.mean ** 2, 0.0)
        self.inv = 1.0 / np.sqrt(self.var + eps)
        self.f1 = gamma.astype(np.float64) * self.inv
        self.f2 = beta.astype(np.float64) - self.mean * self.f1
        self.f3 = self.inv ** 2
        if running is not None:
            rm, rv = running
            unbiased = self.var * (m / max(m - 1, 1))
            rm *= 1.0 - momentum
            rm += momentum * self.mean
            rv *= 1.0 - momentum
            rv += momentum * unbiased
        return self

    def finalize_backward(self, s1sum, s2sum):
        """Sums of dy and dy*x -> B, C, dgamma, dbeta (eqs. 13, 14, 16, 17)."""
        s1 = s1sum / self.m
        s2 = s2sum / self.m
        self.B = self.f1 * self.f3 * (self.mean * s1 - s2)
        self.C = -self.mean * self.B - self.f1 * s1
        self.dgamma = (s2sum - self.mean * s1sum) * self.inv
        self.dbeta = s1sum.copy()
        return self

    def fwd_coefs(self, dtype):
        return self.f1.astype(dtype), self.f2.astype(dtype)

    def bwd_coefs(self, dtype):
        return self.f1.astype(dtype), self.B.astype(dtype), self.C.astype(dtype)


def bn_stats(x):
    r = rows(x)
    s = np.empty(r.shape[0])
    ss = np.empty(r.shape[0])
    rows_split(r.shape[0], lambda lo, hi: _row_sums(r[lo:hi], s[lo:hi], ss[lo:hi]))
    return s, ss, r.shape[1]


def bn_apply(x, f1, f2):
    r = rows(x)
    out = np.empty_like(r)
    rows_split(r.shape[0], lambda lo, hi: _row_affine(r[lo:hi], f1[lo:hi], f2[lo:hi], out[lo:hi]))
    return unrows(out, x)


def bn_bwd_sums(dy, x):
    r, xr = rows(dy), rows(x)
    s1 = np.empty(r.shape[0])
    s2 = np.empty(r.shape[0])
    rows_split(r.shape[0], lambda lo, hi: _row_dot_sums(r[lo:hi], xr[lo:hi], s1[lo:hi], s2[lo:hi]))
    return s1, s2


def bn_bwd_apply(dy, x, f1, bb, cc):
    r, xr = rows(dy), rows(x)
    out = np.empty_like(r)
    rows_split(r.shape[0], lambda lo, hi: _row_bn_bwd(r[lo:hi], xr[lo:hi], f1[lo:hi], bb[lo:hi],
                                                       cc[lo:hi], out[lo:hi]))
    return unrows(out, dy)


def batch_norm_forward(x, gamma, beta, running_mean, running_var, eps=1e-5, momentum=0.1):
    """Training-mode BN on NCHW or (N, C) x; updates running stats in place.

    Returns (y, state) where state feeds batch_norm_backward."""
    xc = to_cnhw(x) if x.ndim == 4 else x
    s, ss, m = bn_stats(xc)
    st = BNState().finalize_forward(s, ss, m, gamma, beta, eps, (running_mean, running_var), momentum)
    y = bn_apply(xc, *st.fwd_coefs(x.dtype))
    return (to_nchw(y) if x.ndim == 4 else y), st


def batch_norm_backward(dy, x, state: BNState):
    """(dx, dgamma, dbeta) for NCHW or (N, C) tensors."""
    dyc, xc = (to_cnhw(dy), to_cnhw(x)) if x.ndim == 4 else (dy, x)
    s1, s2 = bn_bwd_sums(dyc, xc)
    state.finalize_backward(s1, s2)
    dx = bn_bwd_apply(dyc, xc, *state.bwd_coefs(x.dtype))
    return (to_nchw(dx) if x.ndim == 4 else dx), state.dgamma, state.dbeta
