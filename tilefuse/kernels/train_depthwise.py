"""Depthwise convolution for training, on CNHW (MobileNet's, EfficientNet's, ConvNeXt's 3x3 / 5x5 / 7x7 convs
with one filter per channel).

The general training conv (train_conv.py) runs a grouped conv as one GEMM per group: for a depthwise layer a
(1, kh*kw) @ (kh*kw, N*Ho*Wo) product per channel, after an im2col copy of kh*kw times the input; in a
MobileNetV2 step those layers took 75% of the time. Here a channel's planes are convolved directly: in CNHW a
channel's N planes are one contiguous block, so a task is one channel (all its images). Strided convs loop along
an output row (Wo values: vector lanes), the taps outside; stride 1 runs each tap as one loop over the channel's
stacked padded planes (`_fwd_flat_seq`, `_bwd_flat_seq`, below):

    forward   y[n, oh, :]  = bias + sum over taps (i, j) of w[i, j] * xp[n, oh*s + i*d, j*d + s*(0..Wo-1)]
    input     dxp[n, oh*s + i*d, j*d + s*(0..Wo-1)] += w[i, j] * dy[n, oh, :]     (then cropped to dx)
    weight    acc[:] += dy[n, oh, :] * xp[n, oh*s + i*d, j*d + s*(0..Wo-1)]  over oh in float32 lanes, added
              into float64 lanes after each image; dw[i, j] = the sum of those lanes, in order

xp / dxp is the image plane zero-padded, in the task's own scratch. The sums of a channel run in a fixed order
whatever thread runs it, so results are bitwise equal for every thread count; the forward and input gradient
accumulate in float32 in tap order, the weight and bias gradients per image in float32 (Ho terms a lane), then in
float64. `tests/test_train_depthwise.py`
compares all three with PyTorch (strides 1 and 2, dilation, asymmetric padding, odd sizes).

The fused pre/post-processing of train_conv.py (seed 004's patterns) does not apply: patterns.py leaves
depthwise convs out of its patterns, so the BN / activation around them run as their own units.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from .cnhw import JIT
from .conv._nb import atomic_add
from .threads import nthreads, pool_region


def is_depthwise(x_shape, w_shape, groups) -> bool:
    """(N, C, H, W) input, (O, 1, kh, kw) weight, groups = C = O: one filter per channel."""
    return groups > 1 and groups == x_shape[1] == w_shape[0] and w_shape[1] == 1


@nb.njit(**JIT)
def _pad_plane(xp, x2, pt, pl):
    """xp[:] = 0, then x2 (H, W) at (pt, pl)."""
    xp[:, :] = 0.0
    H, W = x2.shape
    for h in range(H):
        for k in range(W):
            xp[pt + h, pl + k] = x2[h, k]


@nb.njit(**JIT)
def _row_geom(H, W, Ho, Wo, kh, kw, sh, sw, pt, pl, dh, dw):
    """The padded plane (Hp, Wp) that every tap of every output reads inside."""
    return max(H + pt, (Ho - 1) * sh + (kh - 1) * dh + 1), max(W + pl, (Wo - 1) * sw + (kw - 1) * dw + 1)


@nb.njit(**JIT)
def _fwd_seq(counter, tid, y, x, w, b, has_bias, sh, sw, pt, pl, dh, dw):
    C, N, H, W = x.shape
    _, _, Ho, Wo = y.shape
    kh, kw = w.shape[2], w.shape[3]
    Hp, Wp = _row_geom(H, W, Ho, Wo, kh, kw, sh, sw, pt, pl, dh, dw)
    xp = np.empty((Hp, Wp), x.dtype)
    while True:
        c = atomic_add(counter, 0, 1)
        if c >= C:
            return
        bias = b[c] if has_bias else 0.0
        for n in range(N):
            _pad_plane(xp, x[c, n], pt, pl)
            yp = y[c, n]
            for oh in range(Ho):
                row = yp[oh]
                for ow in range(Wo):
                    row[ow] = bias
                for i in range(kh):
                    src = xp[oh * sh + i * dh]
                    for j in range(kw):
                        wv = w[c, 0, i, j]
                        o0 = j * dw
                        if sw == 1:
                            s1 = src[o0:o0 + Wo]
                            for ow in range(Wo):
                                row[ow] += wv * s1[ow]
                        else:
                            for ow in range(Wo):
                                row[ow] += wv * src[o0 + ow * sw]


@nb.njit(**JIT)
def _bwd_seq(counter, tid, dy, x, w, dx, dwt, db, need_dx, sh, sw, pt, pl, dh, dw):
    C, N, H, W = x.shape
    _, _, Ho, Wo = dy.shape
    kh, kw = w.shape[2], w.shape[3]
    Hp, Wp = _row_geom(H, W, Ho, Wo, kh, kw, sh, sw, pt, pl, dh, dw)
    xp = np.empty((Hp, Wp), x.dtype)
    dxp = np.empty((Hp, Wp), x.dtype)
    acc = np.empty((kh * kw, Wo), np.float64)
    bacc = np.empty(Wo, np.float64)
    acc32 = np.empty((kh * kw, Wo), np.float32)
    bacc32 = np.empty(Wo, np.float32)
    while True:
        c = atomic_add(counter, 0, 1)
        if c >= C:
            return
        acc[:, :] = 0.0
        bacc[:] = 0.0
        for n in range(N):
            _pad_plane(xp, x[c, n], pt, pl)
            g = dy[c, n]
            if need_dx:
                dxp[:, :] = 0.0
            acc32[:, :] = 0.0
            bacc32[:] = 0.0
            for oh in range(Ho):
                grow = g[oh]
                for ow in range(Wo):
                    bacc32[ow] += grow[ow]
                for i in range(kh):
                    r = oh * sh + i * dh
                    src = xp[r]
                    dst = dxp[r]
                    for j in range(kw):
                        t = i * kw + j
                        a = acc32[t]
                        wv = w[c, 0, i, j]
                        o0 = j * dw
                        if sw == 1:
                            s1 = src[o0:o0 + Wo]
                            for ow in range(Wo):
                                a[ow] += grow[ow] * s1[ow]
                            if need_dx:
                                d1 = dst[o0:o0 + Wo]
                                for ow in range(Wo):
                                    d1[ow] += wv * grow[ow]
                        else:
                            for ow in range(Wo):
                                a[ow] += grow[ow] * src[o0 + ow * sw]
                            if need_dx:
                                for ow in range(Wo):
                                    dst[o0 + ow * sw] += wv * grow[ow]
            for t in range(kh * kw):           # an image's column sums (Ho float32 terms) into float64
                for ow in range(Wo):
                    acc[t, ow] += acc32[t, ow]
            for ow in range(Wo):
                bacc[ow] += bacc32[ow]
            if need_dx:
                for h in range(H):
                    for k in range(W):
                        dx[c, n, h, k] = dxp[pt + h, pl + k]
        for i in range(kh):
            for j in range(kw):
                s = 0.0
                a = acc[i * kw + j]
                for ow in range(Wo):
                    s += a[ow]
                dwt[c, 0, i, j] = s
        s = 0.0
        for ow in range(Wo):
            s += bacc[ow]
        db[c] = s


# stride 1: a channel's N zero-padded planes stacked flat, (N, Hp, Wp) -> N*Hp*Wp values, and every tap one loop
# over all of them: output q = n*Hp*Wp + oh*Wp + ow reads xp[q + i*d*Wp + j*d]. Positions with oh >= Ho or
# ow >= Wo are computed and dropped (forward) or hold dy = 0 (backward), so a 7x7 plane's loop runs 9 x 9 values
# where the row loops above ran 7 rows of 7 (a vector's remainder, scalar): the 7x7 and 4x4 layers of MobileNetV2
# ran 10-20x slower than PyTorch's before. The padded planes have `_TAIL` zeros after them, so that the last
# image's dropped positions read inside the buffer.
_TAIL = 64
_LANES = 64


@nb.njit(**JIT)
def _flat_geom(H, W, Ho, Wo, kh, kw, pt, pl, dh, dw):
    Hp = max(H + pt, Ho + (kh - 1) * dh)
    Wp = max(W + pl, Wo + (kw - 1) * dw)
    return Hp, Wp


@nb.njit(**JIT)
def _pad_planes(xp, x3, Hp, Wp, pt, pl):
    """xp[:] = 0, then image n of x3 (N, H, W) at (n*Hp + pt) * Wp + pl, rows Wp apart."""
    xp[:] = 0.0
    N, H, W = x3.shape
    for n in range(N):
        for h in range(H):
            o = (n * Hp + pt + h) * Wp + pl
            for k in range(W):              # (element loops: a slice assignment costs ~50 ns a row in numba)
                xp[o + k] = x3[n, h, k]


@nb.njit(**JIT)
def _fwd_flat_seq(counter, tid, y, x, w, b, has_bias, pt, pl, dh, dw):
    C, N, H, W = x.shape
    _, _, Ho, Wo = y.shape
    kh, kw = w.shape[2], w.shape[3]
    Hp, Wp = _flat_geom(H, W, Ho, Wo, kh, kw, pt, pl, dh, dw)
    L = N * Hp * Wp
    xp = np.empty(L + _TAIL + (kh - 1) * dh * Wp + (kw - 1) * dw, x.dtype)
    ye = np.empty(L, x.dtype)
    while True:
        c = atomic_add(counter, 0, 1)
        if c >= C:
            return
        _pad_planes(xp, x[c], Hp, Wp, pt, pl)
        ye[:] = b[c] if has_bias else 0.0
        for i in range(kh):
            for j in range(kw):
                wv = w[c, 0, i, j]
                off = i * dh * Wp + j * dw
                src = xp[off:off + L]
                for q in range(L):
                    ye[q] += wv * src[q]
        for n in range(N):
            for oh in range(Ho):
                o = (n * Hp + oh) * Wp
                for k in range(Wo):
                    y[c, n, oh, k] = ye[o + k]


@nb.njit(**JIT)
def _bwd_flat_seq(counter, tid, dy, x, w, dx, dwt, db, need_dx, pt, pl, dh, dw):
    C, N, H, W = x.shape
    _, _, Ho, Wo = dy.shape
    kh, kw = w.shape[2], w.shape[3]
    Hp, Wp = _flat_geom(H, W, Ho, Wo, kh, kw, pt, pl, dh, dw)
    L = N * Hp * Wp
    extra = _TAIL + (kh - 1) * dh * Wp + (kw - 1) * dw
    xp = np.empty(L + extra, x.dtype)
    dxp = np.empty(L + extra, x.dtype)
    ge = np.zeros(L + _LANES, x.dtype)             # dy at the output positions, 0 elsewhere (and past L)
    lanes = np.empty(_LANES, np.float32)
    nchunk = -(-L // _LANES)
    while True:
        c = atomic_add(counter, 0, 1)
        if c >= C:
            return
        _pad_planes(xp, x[c], Hp, Wp, pt, pl)
        ge[:] = 0.0
        for n in range(N):
            for oh in range(Ho):
                o = (n * Hp + oh) * Wp
                for k in range(Wo):
                    ge[o + k] = dy[c, n, oh, k]
        if need_dx:
            dxp[:] = 0.0
        for i in range(kh):
            for j in range(kw):
                wv = w[c, 0, i, j]
                off = i * dh * Wp + j * dw
                src = xp[off:off + L + _LANES]
                total = 0.0
                lanes[:] = 0.0
                for k0 in range(nchunk):               # 64 float32 lanes, into float64 every 64 chunks
                    a = ge[k0 * _LANES:(k0 + 1) * _LANES]
                    s_ = src[k0 * _LANES:(k0 + 1) * _LANES]
                    for k in range(_LANES):
                        lanes[k] += a[k] * s_[k]
                    if k0 % 64 == 63:
                        for k in range(_LANES):
                            total += lanes[k]
                        lanes[:] = 0.0
                for k in range(_LANES):
                    total += lanes[k]
                dwt[c, 0, i, j] = total
                if need_dx:
                    dst = dxp[off:off + L]
                    for q in range(L):
                        dst[q] += wv * ge[q]
        s = 0.0
        for n in range(N):
            for oh in range(Ho):
                for ow in range(Wo):
                    s += dy[c, n, oh, ow]
        db[c] = s
        if need_dx:
            for n in range(N):
                for h in range(H):
                    o = (n * Hp + pt + h) * Wp + pl
                    for k in range(W):
                        dx[c, n, h, k] = dxp[o + k]


def depthwise_forward_cnhw(x, w, g, bias=None):
    """y (C, N, Ho, Wo) of a depthwise conv of x (C, N, H, W), w (C, 1, kh, kw); g: train_conv.ConvGeom."""
    y = np.empty((g.O, g.N, g.ho, g.wo), x.dtype)
    b = bias if bias is not None else np.zeros(1, x.dtype)
    if g.sh == g.sw == 1:
        pool_region(_fwd_flat_seq, nthreads(), g.C, y, x, w, b, bias is not None, g.pt, g.pl, g.dh, g.dw)
    else:
        pool_region(_fwd_seq, nthreads(), g.C, y, x, w, b, bias is not None, g.sh, g.sw, g.pt, g.pl, g.dh, g.dw)
    return y


def depthwise_backward_cnhw(dy, x, w, g, need_dx=True, has_bias=False):
    """(dw, db, dx) of y = depthwise_forward_cnhw(x, w, g): dw like w, db (C,) or None, dx (C, N, H, W) or
    None."""
    dx = np.empty_like(x) if need_dx else np.empty((1, 1, 1, 1), x.dtype)
    dwt = np.empty(w.shape, np.float64)
    db = np.empty(g.C, np.float64)
    if g.sh == g.sw == 1:
        pool_region(_bwd_flat_seq, nthreads(), g.C, dy, x, w, dx, dwt, db, bool(need_dx), g.pt, g.pl, g.dh, g.dw)
    else:
        pool_region(_bwd_seq, nthreads(), g.C, dy, x, w, dx, dwt, db, bool(need_dx), g.sh, g.sw, g.pt, g.pl,
                    g.dh, g.dw)
    return dwt.astype(w.dtype), (db.astype(x.dtype) if has_bias else None), (dx if need_dx else None)
