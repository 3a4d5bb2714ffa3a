"""Training kernels: forward and backward of every op the trainer runs.

Internal layout is CNHW ("channel-major"): a 4-D activation of logical shape (N, C, H, W) is
stored as (C, N, H, W), so a per-channel reduction (batch-norm statistics) walks one
contiguous row, and a convolution is one GEMM per column tile,
``Y (O, N*Ho*Wo) = W (O, C*kh*kw) @ cols (C*kh*kw, N*Ho*Wo)``, with no transposes; a 1x1
stride-1 convolution needs no im2col at all. 2-D activations (N, F) keep their layout.

Three kinds of functions live here:

* numba loops (``nogil``, ``cache``, one tile per call, split over threads by parallel.py)
  that carry the fused pre- and
  post-processing of the paper: im2col with an input-stage transform (BN step 2, shortcut Add,
  ReLU), col2im with a post-processing (error Add, ReLU', BN step-1 sums S1/S2), the backward
  pre-processing ``dy = F1*dz + B*x + C``, and the conv epilogue (bias, BN step-1 sums of x
  and x^2);
* the unfused memory-bound passes (BN statistics, BN apply, ReLU, their backward passes);
* NCHW free functions (``conv2d_forward``/``conv2d_backward``, ``batch_norm_forward`` ...)
  that the tests check one by one against PyTorch autograd.

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

from ..kernels.reference import conv_out_size, pool_out_size
from ..kernels.threads import scratch
from . import parallel as par

# numba loops run single-threaded inside the trainer's own thread split (parallel.py): each
# call works on one tile (a range of images, columns or channels) handed to one thread
_JIT = dict(nogil=True, cache=True)
# reductions (float64 sums of float32 values) may be reassociated so that they vectorize
_JITR = dict(nogil=True, cache=True, fastmath={"reassoc", "contract"})

_DUMMY: dict = {}


def dummies(dtype):
    """Placeholder arrays for unused optional kernel arguments (numba needs fixed types)."""
    dt = np.dtype(dtype)
    if dt not in _DUMMY:
        _DUMMY[dt] = (np.zeros(1, dt), np.zeros((1, 1, 1, 1), dt), np.zeros((1, 1), dt))
    return _DUMMY[dt]


_D64 = np.zeros(1, np.float64)


# ============================================================================ numba loops

@nb.njit(**_JIT)
def _valid(off, s, n_in, n_out):
    """[lo, hi): output positions o with 0 <= o*s + off < n_in."""
    lo = 0 if off >= 0 else (-off + s - 1) // s
    top = n_in - 1 - off
    hi = top // s + 1 if top >= 0 else 0
    hi = min(hi, n_out)
    lo = min(lo, hi)
    return lo, hi


@nb.njit(**_JIT)
def _im2col_pre(x, a, b, s, a2, b2, r_out, cols, n0, n1, kh, kw, sh, sw, pt, pl, dh, dw,
                ho, wo, affine, skind, relu, write_r):
    """cols[(c, i, j), (n - n0, oh, ow)] = t(x)[c, n, oh*sh - pt + i*dh, ow*sw - pl + j*dw].

    x: (C, N, H, W); cols: (C*kh*kw, (n1 - n0)*ho*wo). The input-stage transform t is
        v = a[c]*x + b[c]            if affine (BN step 2), else x
        v += s  or  a2[c]*s + b2[c]  if skind == 1 or 2 (shortcut Add, optionally BN3 step 2)
        v = max(v, 0)                if relu
    computed once per (c, n) plane into a scratch plane (the paper's stashed pre-processing
    result) and, with write_r, also stored to r_out (pattern 4 keeps C2's input for backward).
    Padding positions are zero (padding belongs to the conv's actual input t(x)).
    """
    C, N, H, W = x.shape
    kk = kh * kw
    hw_o = ho * wo
    transform = affine or skind != 0 or relu or write_r
    plane = np.empty((H, W), x.dtype)
    for c in range(C):
        for n in range(n0, n1):
            if transform:
                ac = a[c] if affine else 1
                bc = b[c] if affine else 0
                a2c = a2[c] if skind == 2 else 0
                b2c = b2[c] if skind == 2 else 0
                for i in range(H):                 # 1-D row slices (they vectorize)
                    xr = x[c, n, i]
                    pr = plane[i]
                    sr = s[c, n, i] if skind != 0 else xr
                    rr = r_out[c, n, i] if write_r else xr
                    for j in range(W):
                        v = xr[j]
                        if affine:
                            v = ac * v + bc
                        if skind == 1:
                            v += sr[j]
                        elif skind == 2:
                            v += a2c * sr[j] + b2c
                        if relu and v < 0:
                            v = 0
                        pr[j] = v
                        if write_r:
                            rr[j] = v
                src = plane
            else:
                src = x[c, n]
            base = (n - n0) * hw_o
            for ki in range(kh):
                for kj in range(kw):
                    row = c * kk + ki * kw + kj
                    off = kj * dw - pl
                    lo, hi = _valid(off, sw, W, wo)
                    for oh in range(ho):
                        ih = oh * sh - pt + ki * dh
                        col = base + oh * wo
                        if ih < 0 or ih >= H:
                            for ow in range(wo):
                                cols[row, col + ow] = 0
                            continue
                        for ow in range(lo):
                            cols[row, col + ow] = 0
                        if sw == 1:
                            for ow in range(lo, hi):
                                cols[row, col + ow] = src[ih, ow + off]
                        else:
                            for ow in range(lo, hi):
                                cols[row, col + ow] = src[ih, ow * sw + off]
                        for ow in range(hi, wo):
                            cols[row, col + ow] = 0


@nb.njit(**_JITR)
def _pre_rows(x2, a, b, s2, a2, b2, r2, out, k0, k1, affine, skind, relu, write_r):
    """The input-stage transform of _im2col_pre for a 1x1 stride-1 conv, on the column tile
    [k0, k1) of the (C, M) rows: out[:, k - k0] = t(x2[:, k]) (a per-thread scratch tile that
    the GEMM reads while it is in cache); with write_r also r2[:, k] = t(x2[:, k])."""
    C = x2.shape[0]
    for c in range(C):
        ac = a[c] if affine else 1
        bc = b[c] if affine else 0
        a2c = a2[c] if skind == 2 else 0
        b2c = b2[c] if skind == 2 else 0
        if skind == 0 and not write_r:            # patterns 1-3: one tight loop per row
            xr = x2[c, k0:k1]                     # (1-D row slices vectorize)
            orow = out[c]
            if relu:
                for j in range(k1 - k0):
                    v = ac * xr[j] + bc
                    orow[j] = v if v > 0 else 0
            else:
                for j in range(k1 - k0):
                    orow[j] = ac * xr[j] + bc
            continue
        xr = x2[c, k0:k1]
        orow = out[c]
        sr = s2[c, k0:k1] if skind != 0 else xr
        rr = r2[c, k0:k1] if write_r else orow
        for j in range(k1 - k0):
            v = xr[j]
            if affine:
                v = ac * v + bc
            if skind == 1:
                v += sr[j]
            elif skind == 2:
                v += a2c * sr[j] + b2c
            if relu and v < 0:
                v = 0
            orow[j] = v
            if write_r:
                rr[j] = v


@nb.njit(**_JITR)
def _col2im_post(dcols, dx, n0, n1, kh, kw, sh, sw, pt, pl, dh, dw, ho, wo,
                 acc, has_acc, mk, mask_mode, ma, mb, x1, x2, nstat, s1, s2a, s2b):
    """dx[c, n] = post(sum of the dcols entries that land on (c, n, ih, iw)), n in [n0, n1).

    dcols: (C*kh*kw, (n1 - n0)*ho*wo); dx: (C, N, H, W). Post-processing, in this order:
        v += acc[c, n, ih, iw]              if has_acc (the error Add at a fork)
        v *= (mk > 0) or (ma*mk + mb > 0)   if mask_mode == 1 or 2 (ReLU')
        s1[c] += v, s2a[c] += v*x1, s2b[c] += v*x2   for nstat >= 1, >= 1, == 2 (BN step 1)
    """
    C, N, H, W = dx.shape
    kk = kh * kw
    hw_o = ho * wo
    plane = np.empty((H, W), dx.dtype)
    for c in range(C):
        mac = ma[c] if mask_mode == 2 else 1
        mbc = mb[c] if mask_mode == 2 else 0
        t1 = 0.0
        t2 = 0.0
        t3 = 0.0
        for n in range(n0, n1):
            plane[:, :] = 0
            base = (n - n0) * hw_o
            for ki in range(kh):
                for kj in range(kw):
                    row = c * kk + ki * kw + kj
                    off = kj * dw - pl
                    lo, hi = _valid(off, sw, W, wo)
                    for oh in range(ho):
                        ih = oh * sh - pt + ki * dh
                        if ih < 0 or ih >= H:
                            continue
                        col = base + oh * wo
                        if sw == 1:
                            for ow in range(lo, hi):
                                plane[ih, ow + off] += dcols[row, col + ow]
                        else:
                            for ow in range(lo, hi):
                                plane[ih, ow * sw + off] += dcols[row, col + ow]
            for i in range(H):
                src = plane[i]                    # 1-D row slices (they vectorize)
                dr = dx[c, n, i]
                for j in range(W):
                    dr[j] = src[j]
                if has_acc:
                    ar = acc[c, n, i]
                    for j in range(W):
                        dr[j] += ar[j]
                if mask_mode == 1:
                    mr = mk[c, n, i]
                    for j in range(W):
                        v = dr[j]
                        dr[j] = v if mr[j] > 0 else 0
                elif mask_mode == 2:
                    mr = mk[c, n, i]
                    for j in range(W):
                        v = dr[j]
                        dr[j] = v if mac * mr[j] + mbc > 0 else 0
                if nstat >= 1:
                    xr = x1[c, n, i]
                    for j in range(W):
                        v = dr[j]
                        t1 += v
                        t2 += v * xr[j]
                if nstat == 2:
                    xr2 = x2[c, n, i]
                    for j in range(W):
                        t3 += dr[j] * xr2[j]
        if nstat >= 1:
            s1[c] += t1
            s2a[c] += t2
        if nstat == 2:
            s2b[c] += t3


@nb.njit(**_JITR)
def _post_rows(d2, k0, k1, acc2, has_acc, mk2, mask_mode, ma, mb, x12, x22, nstat, s1, s2a, s2b):
    """The post-processing of _col2im_post in place on the column tile [k0, k1) of the (C, M)
    input gradient of a 1x1 stride-1 conv (just written by the GEMM, still in cache).

    One branch-free inner loop per mode (selects instead of jumps: the ReLU' masks are
    data-dependent and ~50% taken, and per-element branches keep the loop from vectorizing)."""
    C = d2.shape[0]
    n = k1 - k0
    for c in range(C):
        mac = ma[c] if mask_mode == 2 else 1
        mbc = mb[c] if mask_mode == 2 else 0
        d = d2[c, k0:k1]                            # 1-D row slices (they vectorize)
        if has_acc:
            a = acc2[c, k0:k1]
            for j in range(n):
                d[j] += a[j]
        if mask_mode == 1:
            m = mk2[c, k0:k1]
            for j in range(n):
                v = d[j]
                d[j] = v if m[j] > 0 else 0
        elif mask_mode == 2:
            m = mk2[c, k0:k1]
            for j in range(n):
                v = d[j]
                d[j] = v if mac * m[j] + mbc > 0 else 0
        if nstat >= 1:
            t1 = 0.0
            t2 = 0.0
            xa = x12[c, k0:k1]
            for j in range(n):
                v = d[j]
                t1 += v
                t2 += v * xa[j]
            s1[c] += t1
            s2a[c] += t2
        if nstat == 2:
            t3 = 0.0
            xc = x22[c, k0:k1]
            for j in range(n):
                t3 += d[j] * xc[j]
            s2b[c] += t3


@nb.njit(**_JITR)
def _epilogue(y2, c0, c1, bias, has_bias, stats, s, ss):
    """In place on the column tile y2[:, c0:c1]: add bias; accumulate per-row sum and sum of
    squares (BN step 1 of the consuming batch norm)."""
    O = y2.shape[0]
    for o in range(O):
        t = 0.0
        tt = 0.0
        r = y2[o, c0:c1]                             # 1-D row slice (vectorizes)
        bo = bias[o] if has_bias else 0
        for j in range(c1 - c0):
            v = r[j]
            if has_bias:
                v += bo
                r[j] = v
            if stats:
                t += v
                tt += v * v
        if stats:
            s[o] += t
            ss[o] += tt


@nb.njit(**_JITR)
def _bwd_pre(dz, x, f1, bb, cc, out, c0, c1):
    """out[:, k - c0] = F1*dz[:, k] + B*x[:, k] + C over the column tile (BN step 2 backward).

    dz, x: (O, M) views; out: (O, c1 - c0) contiguous."""
    O = dz.shape[0]
    for o in range(O):        # 1-D row slices: 2-D indexing with an offset does not vectorize
        fo = f1[o]
        bo = bb[o]
        co = cc[o]
        d = dz[o, c0:c1]
        xr = x[o, c0:c1]
        orow = out[o]
        for j in range(c1 - c0):
            orow[j] = fo * d[j] + bo * xr[j] + co


# ----------------------------------------------------------------- shifted-GEMM convolution
# (stride 1, one group): the input tile is copied once into a zero-padded plane layout
# (C, images*Hp*Wp); tap (ki, kj) of the kernel is then a GEMM on the same buffer shifted by
# ki*dh*Wp + kj*dw, accumulated (beta = 1) into a "wide" output (O, images*Hp*Wp) whose
# positions (oh < ho, ow < wo) are the conv's outputs. No im2col/col2im: the input is
# copied once instead of kh*kw times, and the tiles stay in cache.

@nb.njit(**_JITR)
def _pad_pre(x, a, b, s, a2, b2, r_out, xp, n0, n1, pt, pl, Hp, Wp,
             affine, skind, relu, write_r):
    """xp[c, (n - n0)*Hp*Wp + (i + pt)*Wp + j + pl] = t(x)[c, n, i, j], zeros around (and in
    the tail of xp); t as in _im2col_pre (with write_r also r_out = t(x))."""
    C, N, H, W = x.shape
    P = Hp * Wp
    L = (n1 - n0) * P
    for c in range(C):
        ac = a[c] if affine else 1
        bc = b[c] if affine else 0
        a2c = a2[c] if skind == 2 else 0
        b2c = b2[c] if skind == 2 else 0
        for k in range(L, xp.shape[1]):
            xp[c, k] = 0
        for n in range(n0, n1):
            base = (n - n0) * P
            for i in range(Hp):
                r = base + i * Wp
                ii = i - pt
                if ii < 0 or ii >= H:
                    for j in range(Wp):
                        xp[c, r + j] = 0
                    continue
                for j in range(pl):
                    xp[c, r + j] = 0
                for j in range(pl + W, Wp):
                    xp[c, r + j] = 0
                xr = x[c, n, ii]                 # 1-D row slices (they vectorize)
                orow = xp[c, r + pl:r + pl + W]
                if not (skind != 0 or write_r):
                    for j in range(W):
                        v = xr[j]
                        if affine:
                            v = ac * v + bc
                        if relu and v < 0:
                            v = 0
                        orow[j] = v
                    continue
                sr = s[c, n, ii] if skind != 0 else xr
                rr = r_out[c, n, ii] if write_r else xr
                for j in range(W):
                    v = xr[j]
                    if affine:
                        v = ac * v + bc
                    if skind == 1:
                        v += sr[j]
                    elif skind == 2:
                        v += a2c * sr[j] + b2c
                    if relu and v < 0:
                        v = 0
                    orow[j] = v
                    if write_r:
                        rr[j] = v


@nb.njit(**_JITR)
def _unwide(yw, y, n0, n1, Hp, Wp, bias, has_bias, stats, s, ss):
    """y[o, n, oh, ow] = yw[o, (n - n0)*Hp*Wp + oh*Wp + ow] (+ bias), BN step-1 sums."""
    O, N, ho, wo = y.shape
    P = Hp * Wp
    for o in range(O):
        t = 0.0
        tt = 0.0
        for n in range(n0, n1):
            base = (n - n0) * P
            for i in range(ho):
                for j in range(wo):
                    v = yw[o, base + i * Wp + j]
                    if has_bias:
                        v += bias[o]
                    y[o, n, i, j] = v
                    if stats:
                        t += v
                        tt += v * v
        if stats:
            s[o] += t
            ss[o] += tt


@nb.njit(**_JITR)
def _wide_dy(dz, xb, f1, bb, cc, pre, dyw, n0, n1, Hp, Wp):
    """dyw[o, (n - n0)*Hp*Wp + oh*Wp + ow] = dy[o, n, oh, ow], zero elsewhere; dy = dz, or
    F1*dz + B*xb + C when pre (BN step 2 backward)."""
    O, N, ho, wo = dz.shape
    P = Hp * Wp
    for o in range(O):
        for n in range(n0, n1):
            base = (n - n0) * P
            for i in range(Hp):
                r = base + i * Wp
                if i >= ho:
                    for j in range(Wp):
                        dyw[o, r + j] = 0
                    continue
                for j in range(wo):
                    v = dz[o, n, i, j]
                    if pre:
                        v = f1[o] * v + bb[o] * xb[o, n, i, j] + cc[o]
                    dyw[o, r + j] = v
                for j in range(wo, Wp):
                    dyw[o, r + j] = 0


@nb.njit(**_JITR)
def _unpad_post(dxp, dx, n0, n1, pt, pl, Hp, Wp, acc, has_acc, mk, mask_mode, ma, mb,
                x1, x2, nstat, s1, s2a, s2b):
    """dx[c, n, i, j] = post(dxp[c, (n - n0)*Hp*Wp + (i + pt)*Wp + j + pl]); post as in
    _col2im_post."""
    C, N, H, W = dx.shape
    P = Hp * Wp
    for c in range(C):
        mac = ma[c] if mask_mode == 2 else 1
        mbc = mb[c] if mask_mode == 2 else 0
        t1 = 0.0
        t2 = 0.0
        t3 = 0.0
        for n in range(n0, n1):
            base = (n - n0) * P
            for i in range(H):
                r = base + (i + pt) * Wp + pl
                src = dxp[c, r:r + W]             # 1-D row slices (they vectorize)
                dr = dx[c, n, i]
                for j in range(W):
                    dr[j] = src[j]
                if has_acc:
                    ar = acc[c, n, i]
                    for j in range(W):
                        dr[j] += ar[j]
                if mask_mode == 1:
                    mr = mk[c, n, i]
                    for j in range(W):
                        v = dr[j]
                        dr[j] = v if mr[j] > 0 else 0
                elif mask_mode == 2:
                    mr = mk[c, n, i]
                    for j in range(W):
                        v = dr[j]
                        dr[j] = v if mac * mr[j] + mbc > 0 else 0
                if nstat >= 1:
                    xr = x1[c, n, i]
                    for j in range(W):
                        v = dr[j]
                        t1 += v
                        t2 += v * xr[j]
                if nstat == 2:
                    xr2 = x2[c, n, i]
                    for j in range(W):
                        t3 += dr[j] * xr2[j]
        if nstat >= 1:
            s1[c] += t1
            s2a[c] += t2
        if nstat == 2:
            s2b[c] += t3


# ----------------------------------------------------------------- unfused memory-bound passes
# (called on channel-row slices, one per task of the thread split)

@nb.njit(**_JITR)
def _row_sums(x2, s, ss):
    """s[c] = sum(x[c]), ss[c] = sum(x[c]^2) over rows of a (C, L) array."""
    C, L = x2.shape
    for c in range(C):
        t = 0.0
        tt = 0.0
        for k in range(L):
            v = x2[c, k]
            t += v
            tt += v * v
        s[c] = t
        ss[c] = tt


@nb.njit(**_JITR)
def _row_affine(x2, a, b, out):
    C, L = x2.shape
    for c in range(C):
        for k in range(L):
            out[c, k] = a[c] * x2[c, k] + b[c]


@nb.njit(**_JITR)
def _row_dot_sums(dy, x, s1, s2):
    """s1[c] = sum(dy[c]), s2[c] = sum(dy[c]*x[c])."""
    C, L = dy.shape
    for c in range(C):
        t = 0.0
        tt = 0.0
        for k in range(L):
            v = dy[c, k]
            t += v
            tt += v * x[c, k]
        s1[c] = t
        s2[c] = tt


@nb.njit(**_JITR)
def _row_bn_bwd(dy, x, f1, bb, cc, out):
    C, L = dy.shape
    for c in range(C):
        for k in range(L):
            out[c, k] = f1[c] * dy[c, k] + bb[c] * x[c, k] + cc[c]


@nb.njit(**_JIT)
def _relu(x1, out):
    for k in range(x1.shape[0]):
        v = x1[k]
        out[k] = v if v > 0 else 0


@nb.njit(**_JIT)
def _relu_bwd(dy, x, out):
    for k in range(dy.shape[0]):
        out[k] = dy[k] if x[k] > 0 else 0


@nb.njit(**_JIT)
def _add(a, b, out):
    for k in range(a.shape[0]):
        out[k] = a[k] + b[k]


# ----------------------------------------------------------------- pooling (per (c, n) plane)

@nb.njit(**_JIT)
def _max_pool_fwd(x, y, idx, kh, kw, sh, sw, pt, pl, dh, dw):
    P, H, W = x.shape
    _, ho, wo = y.shape
    for p in range(P):
        for oh in range(ho):
            i0 = oh * sh - pt
            ki0, ki1 = _valid(i0, dh, H, kh)         # taps inside the image
            for ow in range(wo):
                j0 = ow * sw - pl
                kj0, kj1 = _valid(j0, dw, W, kw)
                best = -np.inf
                bi = -1
                for ki in range(ki0, ki1):
                    ih = i0 + ki * dh
                    for kj in range(kj0, kj1):
                        iw = j0 + kj * dw
                        v = x[p, ih, iw]
                        if v > best or bi < 0 or v != v:
                            best = v
                            bi = ih * W + iw
                y[p, oh, ow] = best
                idx[p, oh, ow] = bi


@nb.njit(**_JIT)
def _max_pool_fwd_sep(x, y, idx, kh, kw, sh, sw, pt, pl, dh, dw):
    """_max_pool_fwd in two separable passes (per input row: max over the kw taps of each
    output column; then per output row: max over the kh row results), kh + kw instead of
    kh*kw compares per output. Same selection rule as PyTorch's loop over (ki, kj): a strictly
    greater value or a NaN replaces the current best, so the first maximum (or the last NaN) in
    (ki, kj) order wins: the row pass keeps the first maximum of its row, and the column pass,
    scanning rows in ki order with the same rule, keeps the first row holding the maximum."""
    P, H, W = x.shape
    _, ho, wo = y.shape
    rv = np.empty((H, wo), x.dtype)
    ri = np.empty((H, wo), np.int32)
    lo_j = np.empty(wo, np.int64)
    hi_j = np.empty(wo, np.int64)
    for ow in range(wo):
        lo_j[ow], hi_j[ow] = _valid(ow * sw - pl, dw, W, kw)
    for p in range(P):
        for ih in range(H):
            for ow in range(wo):
                j0 = ow * sw - pl
                kj0 = lo_j[ow]
                kj1 = hi_j[ow]
                if kj0 >= kj1:
                    rv[ih, ow] = -np.inf
                    ri[ih, ow] = -1
                    continue
                iw = j0 + kj0 * dw
                best = x[p, ih, iw]
                bi = iw
                for kj in range(kj0 + 1, kj1):     # branch-free selects (random data)
                    iw = j0 + kj * dw
                    v = x[p, ih, iw]
                    t = (v > best) | (v != v)
                    best = v if t else best
                    bi = iw if t else bi
                rv[ih, ow] = best
                ri[ih, ow] = bi
        for oh in range(ho):
            i0 = oh * sh - pt
            ki0, ki1 = _valid(i0, dh, H, kh)
            for ow in range(wo):
                best = -np.inf
                bi = -1
                for ki in range(ki0, ki1):
                    ih = i0 + ki * dh
                    c = ri[ih, ow]
                    v = rv[ih, ow]
                    t = (c >= 0) & ((bi < 0) | (v > best) | (v != v))
                    best = v if t else best
                    bi = ih * W + c if t else bi
                y[p, oh, ow] = best
                idx[p, oh, ow] = bi


@nb.njit(**_JIT)
def _max_pool_bwd(dy, idx, dx):
    P, ho, wo = dy.shape
    W = dx.shape[2]
    for p in range(P):
        dx[p, :, :] = 0
        for oh in range(ho):
            for ow in range(wo):
                k = idx[p, oh, ow]
                dx[p, k // W, k % W] += dy[p, oh, ow]


@nb.njit(**_JIT)
def _avg_pool(x, y, dy, dx, backward, kh, kw, sh, sw, pt, pb, pl, pr, include_pad):
    """Forward y = window means, or (backward) dx = scatter of dy / divisor; PyTorch divisor
    rule: the window clipped to the padded extent, or to the image without include_pad."""
    P, H, W = x.shape
    _, ho, wo = y.shape
    for p in range(P):
        if backward:
            dx[p, :, :] = 0
        for oh in range(ho):
            h0 = oh * sh - pt
            h1 = min(h0 + kh, H + pb)
            for ow in range(wo):
                w0 = ow * sw - pl
                w1 = min(w0 + kw, W + pr)
                size = (h1 - h0) * (w1 - w0)
                a0 = max(h0, 0)
                a1 = min(h1, H)
                b0 = max(w0, 0)
                b1 = min(w1, W)
                if not include_pad:
                    size = (a1 - a0) * (b1 - b0)
                if backward:
                    g = dy[p, oh, ow] / size
                    for i in range(a0, a1):
                        for j in range(b0, b1):
                            dx[p, i, j] += g
                else:
                    t = 0.0
                    for i in range(a0, a1):
                        for j in range(b0, b1):
                            t += x[p, i, j]
                    y[p, oh, ow] = t / size


# ============================================================================ python wrappers

# per-thread tile budgets: an im2col tile (C*kh*kw, columns) of about _COLS_BYTES, and for
# 1x1 stride-1 convs a column tile whose input and output rows fit in the 1 MB L2 of a core
# (the transformed input tile and the post-processed gradient tile never leave the cache)
_COLS_BYTES = 4 << 20
_L2_TILE = 4 << 20
_MIN_COLS = 512
_SHIFT_BYTES = 2 << 20
SHIFT_MAX_WASTE = 1.2      # padded plane / output plane above which im2col is used instead


class ConvGeom:
    """Static geometry of one conv2d op (IR-normalized params) on CNHW tensors."""

    __slots__ = ("C", "N", "H", "W", "O", "kh", "kw", "sh", "sw", "pt", "pb", "pl", "pr",
                 "dh", "dw", "groups", "ho", "wo", "direct", "K", "shift", "Hp", "Wp", "tail",
                 "offs")

    def __init__(self, x_shape, w_shape, stride, padding, dilation, groups):
        self.N, self.C, self.H, self.W = x_shape           # logical NCHW shape
        self.O, cg, self.kh, self.kw = w_shape
        self.sh, self.sw = stride
        self.pt, self.pb, self.pl, self.pr = padding
        self.dh, self.dw = dilation
        self.groups = groups
        self.ho = conv_out_size(self.H, self.kh, self.sh, self.pt, self.pb, self.dh)
        self.wo = conv_out_size(self.W, self.kw, self.sw, self.pl, self.pr, self.dw)
        self.K = cg * self.kh * self.kw                     # GEMM depth per group
        # 1x1, stride 1, no padding: cols is the input itself, (C, N*H*W)
        self.direct = (self.kh == self.kw == 1 and self.sh == self.sw == 1
                       and tuple(padding) == (0, 0, 0, 0))
        # stride 1, one group, kh*kw > 1: shifted GEMMs on a padded copy (see _pad_pre) when
        # the padded plane wastes little (< 20%) GEMM work on the positions it skips
        self.Hp, self.Wp = self.H + self.pt + self.pb, self.W + self.pl + self.pr
        self.tail = self.dh * (self.kh - 1) * self.Wp + self.dw * (self.kw - 1)
        self.offs = [ki * self.dh * self.Wp + kj * self.dw
                     for ki in range(self.kh) for kj in range(self.kw)]
        self.shift = (self.sh == self.sw == 1 and groups == 1 and self.kh * self.kw > 1
                      and self.ho > 0 and self.wo > 0
                      and self.Hp * self.Wp <= SHIFT_MAX_WASTE * self.ho * self.wo)

    def args(self):
        return (self.kh, self.kw, self.sh, self.sw, self.pt, self.pl, self.dh, self.dw,
                self.ho, self.wo)

    def tiles(self, target_bytes=_COLS_BYTES, itemsize=4, threads=None):
        """Image ranges [n0, n1) whose im2col buffer is about target_bytes (>= 1 image, and
        >= _MIN_COLS GEMM columns when the batch allows), a multiple of `threads` of them."""
        t = par.nthreads() if threads is None else threads
        hw = self.ho * self.wo
        per_image = self.C * self.kh * self.kw * hw * itemsize
        nb_ = max(1, target_bytes // max(per_image, 1), -(-_MIN_COLS // max(hw, 1)))
        nb_ = min(nb_, max(1, -(-self.N // t)))
        nt = -(-self.N // nb_)
        if nt > 1:
            nt = -(-nt // t) * t
        nb_ = -(-self.N // nt)
        return [(n0, min(self.N, n0 + nb_)) for n0 in range(0, self.N, nb_)]

    def shift_tiles(self, itemsize=4, threads=None):
        """Image ranges for the shifted-GEMM path: padded input + wide output of a tile in
        about _SHIFT_BYTES."""
        t = par.nthreads() if threads is None else threads
        per_image = (self.C + self.O) * self.Hp * self.Wp * itemsize
        nb_ = max(1, min(_SHIFT_BYTES // per_image, -(-self.N // t)))
        nt = -(-self.N // nb_)
        if nt > 1:
            nt = -(-nt // t) * t
        nb_ = -(-self.N // nt)
        return [(n0, min(self.N, n0 + nb_)) for n0 in range(0, self.N, nb_)]

    def col_tiles(self, itemsize=4, threads=None):
        """Column ranges of the (C, N*H*W) rows of a 1x1 stride-1 conv (see _L2_TILE)."""
        t = par.nthreads() if threads is None else threads
        M = self.N * self.ho * self.wo
        m = max(1024, _L2_TILE // (itemsize * (self.C + self.O)) // 64 * 64)
        m = min(m, max(64, -(-M // t)))
        return par.ranges(M, -(-M // m))


class Pre:
    """Input-stage transform of a fused conv (see _im2col_pre); all None = identity."""

    __slots__ = ("a", "b", "s", "a2", "b2", "relu", "r_out")

    def __init__(self, a=None, b=None, s=None, a2=None, b2=None, relu=False, r_out=None):
        self.a, self.b, self.s, self.a2, self.b2 = a, b, s, a2, b2
        self.relu, self.r_out = relu, r_out

    @property
    def identity(self):
        return self.a is None and self.s is None and not self.relu and self.r_out is None

    def flags(self):
        return (self.a is not None, 0 if self.s is None else (2 if self.a2 is not None else 1),
                self.relu, self.r_out is not None)


IDENTITY = Pre()


def im2col(x, g: ConvGeom, n0, n1, pre: Pre = IDENTITY, out=None):
    """(C, N, H, W) -> cols (C*kh*kw, (n1-n0)*ho*wo) of the transformed input (see Pre)."""
    m = (n1 - n0) * g.ho * g.wo
    if g.direct and pre.identity:
        return x[:, n0:n1].reshape(x.shape[0], m)  # (C, nb, H, W) -> (C, nb*H*W), no copy
    d1, d4, _ = dummies(x.dtype)
    cols = out if out is not None else np.empty((x.shape[0] * g.kh * g.kw, m), x.dtype)
    _im2col_pre(x, _o(pre.a, d1), _o(pre.b, d1), _o(pre.s, d4), _o(pre.a2, d1), _o(pre.b2, d1),
                _o(pre.r_out, d4), cols, n0, n1, *g.args(), *pre.flags())
    return cols


def pre_rows(x, g: ConvGeom, k0, k1, pre: Pre, out):
    """1x1 stride-1 conv: the transformed input columns [k0, k1) into the scratch tile `out`."""
    d1, _, d2 = dummies(x.dtype)
    x2 = x.reshape(x.shape[0], -1)
    s2 = d2 if pre.s is None else pre.s.reshape(x2.shape)
    r2 = d2 if pre.r_out is None else pre.r_out.reshape(x2.shape)
    _pre_rows(x2, _o(pre.a, d1), _o(pre.b, d1), s2, _o(pre.a2, d1), _o(pre.b2, d1), r2, out,
              k0, k1, *pre.flags())
    return out


class Post:
    """Post-processing of a conv's input gradient (see _col2im_post)."""

    __slots__ = ("acc", "mk", "ma", "mb", "x1", "x2", "s1", "s2a", "s2b")

    def __init__(self, acc=None, mk=None, ma=None, mb=None, x1=None, x2=None):
        self.acc, self.mk, self.ma, self.mb, self.x1, self.x2 = acc, mk, ma, mb, x1, x2
        c = None
        for t in (x1, acc, mk):
            if t is not None:
                c = t.shape[0]
        self.s1 = np.zeros(c or 1)
        self.s2a = np.zeros(c or 1)
        self.s2b = np.zeros(c or 1)

    @property
    def identity(self):
        return self.acc is None and self.mk is None and self.x1 is None

    def modes(self):
        return (0 if self.mk is None else (2 if self.ma is not None else 1),
                0 if self.x1 is None else (2 if self.x2 is not None else 1))

    def local_sums(self):
        """Fresh (s1, s2a, s2b) accumulators for one thread."""
        return np.zeros_like(self.s1), np.zeros_like(self.s2a), np.zeros_like(self.s2b)

    def add_sums(self, sums):
        for a, b in zip((self.s1, self.s2a, self.s2b), sums):
            a += b


_NO_POST = None


def col2im(dcols, dx, g: ConvGeom, n0, n1, post: Post | None = None, sums=None):
    """Scatter-add dcols into dx[:, n0:n1] (CNHW), then post-process (see Post); the BN sums
    go to `sums` (per-thread) or to post.s1/s2a/s2b."""
    post = post or Post()
    d1, d4, _ = dummies(dx.dtype)
    mask_mode, nstat = post.modes()
    s1, s2a, s2b = sums if sums is not None else (post.s1, post.s2a, post.s2b)
    _col2im_post(dcols, dx, n0, n1, *g.args(), _o(post.acc, d4), post.acc is not None,
                 _o(post.mk, d4), mask_mode, _o(post.ma, d1), _o(post.mb, d1),
                 _o(post.x1, d4), _o(post.x2, d4), nstat, s1, s2a, s2b)


def post_rows(dx2, k0, k1, post: Post, sums):
    """1x1 stride-1 conv: post-process the input-gradient columns [k0, k1) in place."""
    d1, _, d2 = dummies(dx2.dtype)
    mask_mode, nstat = post.modes()
    C = dx2.shape[0]

    def r(t):
        return d2 if t is None else t.reshape(C, -1)
    _post_rows(dx2, k0, k1, r(post.acc), post.acc is not None, r(post.mk), mask_mode,
               _o(post.ma, d1), _o(post.mb, d1), r(post.x1), r(post.x2), nstat, *sums)


def _o(a, dummy):
    return dummy if a is None else a


def epilogue(y2, c0, c1, bias=None, stats=None):
    """Bias add and BN step-1 sums on a GEMM output column tile; stats = (s, ss) float64."""
    d1, _, _ = dummies(y2.dtype)
    s, ss = stats if stats is not None else (_D64, _D64)
    if bias is None and stats is None:
        return
    _epilogue(y2, c0, c1, _o(bias, d1), bias is not None, stats is not None, s, ss)


def bwd_pre(dz2, x2, f1, bb, cc, c0, c1, out=None):
    out = out if out is not None else np.empty((dz2.shape[0], c1 - c0), dz2.dtype)
    _bwd_pre(dz2, x2, f1, bb, cc, out, c0, c1)
    return out


def pad_pre(x, g: ConvGeom, n0, n1, pre: Pre):
    """The tile's transformed input in the padded-plane layout of the shifted-GEMM path."""
    d1, d4, _ = dummies(x.dtype)
    xp = scratch("xp", (g.C, (n1 - n0) * g.Hp * g.Wp + g.tail), x.dtype)
    _pad_pre(x, _o(pre.a, d1), _o(pre.b, d1), _o(pre.s, d4), _o(pre.a2, d1), _o(pre.b2, d1),
             _o(pre.r_out, d4), xp, n0, n1, g.pt, g.pl, g.Hp, g.Wp, *pre.flags())
    return xp


def _taps(w, g: ConvGeom):
    """(kh*kw, O, C): one (O, C) weight matrix per kernel tap."""
    return np.ascontiguousarray(w.reshape(g.O, g.C, g.kh * g.kw).transpose(2, 0, 1))


def _thread_sums(O, threads, on):
    return [(np.zeros(O), np.zeros(O)) if on else None for _ in range(threads)]


def conv_forward_cnhw(x, w, g: ConvGeom, bias=None, pre: Pre = IDENTITY, stats=None,
                      out=None, tiles=None):
    """Y (O, N, Ho, Wo) = conv(t(x), w) [+ bias], BN step-1 sums into stats, tile by tile.

    Tiles (ranges of images, or of columns for 1x1 stride-1 convs) are split over the
    threads of parallel.py; each thread transforms its tile into its own scratch buffer,
    runs one single-threaded GEMM per group and the epilogue on the tile it just wrote."""
    y = out if out is not None else np.empty((g.O, g.N, g.ho, g.wo), x.dtype)
    y2 = y.reshape(g.O, -1)
    og = g.O // g.groups
    w2 = w.reshape(g.O, -1)                         # (O, Cg*kh*kw)
    hw = g.ho * g.wo
    T = par.nthreads()
    st = _thread_sums(g.O, T, stats is not None)
    x2 = x.reshape(x.shape[0], -1)
    direct = g.direct and tiles is None
    if g.shift and tiles is None:
        return _shift_forward(x, w, g, y, bias, pre, stats, st)
    tl = g.col_tiles(x.dtype.itemsize) if direct else (tiles or g.tiles(itemsize=x.dtype.itemsize))

    def task(i, tid):
        if direct:
            c0, c1 = tl[i]
            if pre.identity:
                cols = x2[:, c0:c1]
            else:
                cols = pre_rows(x, g, c0, c1, pre, scratch("cols", (g.C, c1 - c0), x.dtype))
        else:
            n0, n1 = tl[i]
            c0, c1 = n0 * hw, n1 * hw
            cols = (im2col(x, g, n0, n1, pre) if g.direct and pre.identity else
                    im2col(x, g, n0, n1, pre,
                           out=scratch("cols", (g.C * g.kh * g.kw, c1 - c0), x.dtype)))
        for gi in range(g.groups):
            par.gemm(w2[gi * og:(gi + 1) * og], cols[gi * g.K:(gi + 1) * g.K],
                     y2[gi * og:(gi + 1) * og, c0:c1])
        epilogue(y2, c0, c1, bias, st[tid])

    par.run(len(tl), task)
    if stats is not None:
        for s in st:
            stats[0][...] += s[0]
            stats[1][...] += s[1]
    return y


def _shift_forward(x, w, g: ConvGeom, y, bias, pre, stats, st):
    wk = _taps(w, g)
    tl = g.shift_tiles(x.dtype.itemsize)
    P = g.Hp * g.Wp
    d1, _, _ = dummies(x.dtype)

    def task(i, tid):
        n0, n1 = tl[i]
        L = (n1 - n0) * P
        xp = pad_pre(x, g, n0, n1, pre)
        yw = scratch("yw", (g.O, L), x.dtype)
        for k, off in enumerate(g.offs):
            par.gemm(wk[k], xp[:, off:off + L], yw, beta=0.0 if k == 0 else 1.0)
        s_, ss_ = st[tid] if st[tid] is not None else (_D64, _D64)
        _unwide(yw, y, n0, n1, g.Hp, g.Wp, _o(bias, d1), bias is not None, st[tid] is not None,
                s_, ss_)

    par.run(len(tl), task)
    if stats is not None:
        for s in st:
            stats[0][...] += s[0]
            stats[1][...] += s[1]
    return y


def _shift_backward(dy, x, w, g: ConvGeom, pre, post, dy_pre, need_dx, has_bias):
    T = par.nthreads()
    wk = _taps(w, g)
    kk = g.kh * g.kw
    dwks = [np.zeros((kk, g.O, g.C), w.dtype) for _ in range(T)]
    dbs = [np.zeros(g.O, np.float64) for _ in range(T)] if has_bias else None
    dx = np.empty((g.C, g.N, g.H, g.W), x.dtype) if need_dx else None
    post = post or Post()
    sums = [post.local_sums() for _ in range(T)]
    mask_mode, nstat = post.modes()
    d1, d4, _ = dummies(x.dtype)
    tl = g.shift_tiles(x.dtype.itemsize)
    P = g.Hp * g.Wp
    if dy_pre is None:
        src, xb, f1, bb, cc = dy, d4, d1, d1, d1
    else:
        src, xb, f1, bb, cc = dy_pre

    def task(i, tid):
        n0, n1 = tl[i]
        L = (n1 - n0) * P
        dyw = scratch("dyw", (g.O, L), x.dtype)
        _wide_dy(src, xb, f1, bb, cc, dy_pre is not None, dyw, n0, n1, g.Hp, g.Wp)
        if has_bias:
            dbs[tid] += dyw.sum(axis=1, dtype=np.float64)
        xp = pad_pre(x, g, n0, n1, pre)
        dwk = dwks[tid]
        for k, off in enumerate(g.offs):
            par.gemm(dyw, xp[:, off:off + L].T, dwk[k], beta=1.0)
        if not need_dx:
            return
        dxp = scratch("dxp", (g.C, L + g.tail), x.dtype)
        dxp[:, L:] = 0
        for k, off in enumerate(g.offs):
            par.gemm(wk[k].T, dyw, dxp[:, off:off + L], beta=0.0 if k == 0 else 1.0)
        _unpad_post(dxp, dx, n0, n1, g.pt, g.pl, g.Hp, g.Wp, _o(post.acc, d4),
                    post.acc is not None, _o(post.mk, d4), mask_mode, _o(post.ma, d1),
                    _o(post.mb, d1), _o(post.x1, d4), _o(post.x2, d4), nstat, *sums[tid])

    par.run(len(tl), task)
    dwk = dwks[0]
    for d in dwks[1:]:
        dwk += d
    dw = np.ascontiguousarray(dwk.transpose(1, 2, 0)).reshape(w.shape)
    db = None
    if has_bias:
        db = dbs[0]
        for d in dbs[1:]:
            db += d
        db = db.astype(w.dtype)
    if need_dx:
        for s in sums:
            post.add_sums(s)
    return dw, db, dx


def conv_backward_cnhw(dy, x, w, g: ConvGeom, pre: Pre = IDENTITY, post: Post | None = None,
                       dy_pre=None, need_dx=True, has_bias=False, tiles=None):
    """Weight, bias and input gradients of Y = conv(t(x), w), tile by tile.

    dy: (O, N, Ho, Wo) output gradient, or with dy_pre=(dz, xb, F1, B, C) the output gradient
    is computed per tile as F1*dz + B*xb + C (the consumer-side BN step 2 backward).
    Returns (dw, db, dx); dx is CNHW and post-processed by `post`.

    Per tile and thread: dy tile (pre-processed into scratch), the transformed input tile
    (im2col, or the 1x1 transform), dW += dy_t @ cols_t^T accumulated in place (GEMM beta=1)
    into the thread's own dW, then dcols = W^T @ dy_t and col2im + post-processing of the
    tile's images (1x1 stride 1: the GEMM writes dx's columns, post-processed in place)."""
    if g.shift and tiles is None:
        return _shift_backward(dy, x, w, g, pre, post, dy_pre, need_dx, has_bias)
    og = g.O // g.groups
    hw = g.ho * g.wo
    w2 = w.reshape(g.O, -1)
    T = par.nthreads()
    # weight gradient per group as the transposed product dW^T (K, og) = cols @ dy^T when
    # K > og: OpenBLAS runs it 5-25% faster than dy @ cols^T (stem: (147, 64) vs (64, 147))
    wt = g.K > og
    dws = [np.zeros((g.groups, g.K, og) if wt else w2.shape, w.dtype) for _ in range(T)]
    dbs = [np.zeros(g.O, np.float64) for _ in range(T)] if has_bias else None
    dx = np.empty((g.C, g.N, g.H, g.W), x.dtype) if need_dx else None
    dx2 = dx.reshape(g.C, -1) if need_dx else None
    post_id = post is None or post.identity
    sums = [post.local_sums() for _ in range(T)] if post is not None and need_dx else [None] * T
    src = dy if dy_pre is None else dy_pre[0]
    src2 = src.reshape(g.O, -1)
    xb2 = dy_pre[1].reshape(g.O, -1) if dy_pre is not None else None
    x2 = x.reshape(x.shape[0], -1)
    direct = g.direct and tiles is None
    tl = g.col_tiles(x.dtype.itemsize) if direct else (tiles or g.tiles(itemsize=x.dtype.itemsize))

    def task(i, tid):
        if direct:
            c0, c1 = tl[i]
        else:
            n0, n1 = tl[i]
            c0, c1 = n0 * hw, n1 * hw
        if dy_pre is None:
            dyt = src2[:, c0:c1]
        else:
            dyt = bwd_pre(src2, xb2, dy_pre[2], dy_pre[3], dy_pre[4], c0, c1,
                          out=scratch("dy", (g.O, c1 - c0), x.dtype))
        if has_bias:
            dbs[tid] += dyt.sum(axis=1, dtype=np.float64)
        if direct:
            cols = x2[:, c0:c1] if pre.identity else pre_rows(
                x, g, c0, c1, pre, scratch("cols", (g.C, c1 - c0), x.dtype))
        elif g.direct and pre.identity:
            cols = im2col(x, g, n0, n1)
        else:
            cols = im2col(x, g, n0, n1, pre,
                          out=scratch("cols", (g.C * g.kh * g.kw, c1 - c0), x.dtype))
        dw_t = dws[tid]
        for gi in range(g.groups):
            if wt:
                par.gemm(cols[gi * g.K:(gi + 1) * g.K], dyt[gi * og:(gi + 1) * og].T, dw_t[gi],
                         beta=1.0)
            else:
                par.gemm(dyt[gi * og:(gi + 1) * og], cols[gi * g.K:(gi + 1) * g.K].T,
                         dw_t[gi * og:(gi + 1) * og], beta=1.0)
        if not need_dx:
            return
        if g.direct:
            for gi in range(g.groups):
                par.gemm(w2[gi * og:(gi + 1) * og].T, dyt[gi * og:(gi + 1) * og],
                         dx2[gi * g.K:(gi + 1) * g.K, c0:c1])
            if not post_id:
                post_rows(dx2, c0, c1, post, sums[tid])
            return
        dcols = scratch("dcols", (g.C * g.kh * g.kw, c1 - c0), x.dtype)
        for gi in range(g.groups):
            par.gemm(w2[gi * og:(gi + 1) * og].T, dyt[gi * og:(gi + 1) * og],
                     dcols[gi * g.K:(gi + 1) * g.K])
        col2im(dcols, dx, g, n0, n1, post, sums[tid])

    par.run(len(tl), task)
    dw = dws[0]
    for d in dws[1:]:
        dw += d
    if wt:
        dw = np.ascontiguousarray(dw.transpose(0, 2, 1)).reshape(g.O, g.K)
    db = None
    if has_bias:
        db = dbs[0]
        for d in dbs[1:]:
            db += d
    if post is not None and need_dx:
        for s in sums:
            post.add_sums(s)
    return dw.reshape(w.shape), (db.astype(w.dtype) if has_bias else None), dx


# ----------------------------------------------------------------- batch norm algebra

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


def rows(x):
    """Channel rows of an activation: CNHW (C, N, H, W) -> (C, N*H*W); (N, C) -> (C, N) copy."""
    if x.ndim == 2:
        return np.ascontiguousarray(x.T)
    return x.reshape(x.shape[0], -1)


def unrows(r, like):
    return np.ascontiguousarray(r.T) if like.ndim == 2 else r.reshape(like.shape)


def _rows_split(C, fn):
    """fn(lo, hi) over channel-row ranges split across the threads (parallel.py)."""
    par.split_rows(C, lambda lo, hi, tid: fn(lo, hi))


def _flat_split(n, fn):
    rs = par.ranges(n, 2 * par.nthreads(), align=4096) if par.nthreads() > 1 else [(0, n)]
    par.run(len(rs), lambda i, tid: fn(*rs[i]))


def bn_stats(x):
    r = rows(x)
    s = np.empty(r.shape[0])
    ss = np.empty(r.shape[0])
    _rows_split(r.shape[0], lambda lo, hi: _row_sums(r[lo:hi], s[lo:hi], ss[lo:hi]))
    return s, ss, r.shape[1]


def bn_apply(x, f1, f2):
    r = rows(x)
    out = np.empty_like(r)
    _rows_split(r.shape[0], lambda lo, hi: _row_affine(r[lo:hi], f1[lo:hi], f2[lo:hi], out[lo:hi]))
    return unrows(out, x)


def bn_bwd_sums(dy, x):
    r, xr = rows(dy), rows(x)
    s1 = np.empty(r.shape[0])
    s2 = np.empty(r.shape[0])
    _rows_split(r.shape[0], lambda lo, hi: _row_dot_sums(r[lo:hi], xr[lo:hi], s1[lo:hi], s2[lo:hi]))
    return s1, s2


def bn_bwd_apply(dy, x, f1, bb, cc):
    r, xr = rows(dy), rows(x)
    out = np.empty_like(r)
    _rows_split(r.shape[0], lambda lo, hi: _row_bn_bwd(r[lo:hi], xr[lo:hi], f1[lo:hi], bb[lo:hi],
                                                       cc[lo:hi], out[lo:hi]))
    return unrows(out, dy)


def relu(x):
    out = np.empty_like(x)
    a, o = x.reshape(-1), out.reshape(-1)
    _flat_split(a.shape[0], lambda lo, hi: _relu(a[lo:hi], o[lo:hi]))
    return out


def relu_backward(dy, x):
    out = np.empty_like(dy)
    d, a, o = dy.reshape(-1), x.reshape(-1), out.reshape(-1)
    _flat_split(d.shape[0], lambda lo, hi: _relu_bwd(d[lo:hi], a[lo:hi], o[lo:hi]))
    return out


def add(a, b):
    out = np.empty_like(a)
    a1, b1, o = a.reshape(-1), b.reshape(-1), out.reshape(-1)
    _flat_split(a1.shape[0], lambda lo, hi: _add(a1[lo:hi], b1[lo:hi], o[lo:hi]))
    return out


# ----------------------------------------------------------------- pooling wrappers (CNHW)

def _planes(x):
    return x.reshape(-1, x.shape[2], x.shape[3])


def max_pool_forward(x, kernel_size, stride, padding, dilation, ceil_mode):
    """x (C, N, H, W) -> (y, argmax) with PyTorch MaxPool2d semantics."""
    C, N, H, W = x.shape
    ho = pool_out_size(H, dilation[0] * (kernel_size[0] - 1) + 1, stride[0], padding[0], padding[1], ceil_mode)
    wo = pool_out_size(W, dilation[1] * (kernel_size[1] - 1) + 1, stride[1], padding[2], padding[3], ceil_mode)
    y = np.empty((C, N, ho, wo), x.dtype)
    idx = np.empty((C, N, ho, wo), np.int32)
    xp, yp, ip = _planes(x), _planes(y), _planes(idx)
    _rows_split(xp.shape[0], lambda lo, hi: _max_pool_fwd_sep(
        xp[lo:hi], yp[lo:hi], ip[lo:hi], kernel_size[0], kernel_size[1], stride[0], stride[1],
        padding[0], padding[2], dilation[0], dilation[1]))
    return y, idx


def max_pool_backward(dy, idx, x_shape):
    dx = np.empty(x_shape, dy.dtype)
    dp, ip, xp = _planes(dy), _planes(idx), _planes(dx)
    _rows_split(dp.shape[0], lambda lo, hi: _max_pool_bwd(dp[lo:hi], ip[lo:hi], xp[lo:hi]))
    return dx


def avg_pool_forward(x, kernel_size, stride, padding, ceil_mode, count_include_pad):
    C, N, H, W = x.shape
    ho = pool_out_size(H, kernel_size[0], stride[0], padding[0], padding[1], ceil_mode)
    wo = pool_out_size(W, kernel_size[1], stride[1], padding[2], padding[3], ceil_mode)
    y = np.empty((C, N, ho, wo), x.dtype)
    xp, yp = _planes(x), _planes(y)
    _rows_split(xp.shape[0], lambda lo, hi: _avg_pool(
        xp[lo:hi], yp[lo:hi], yp[lo:hi], xp[lo:hi], False, kernel_size[0], kernel_size[1],
        stride[0], stride[1], padding[0], padding[1], padding[2], padding[3], count_include_pad))
    return y


def avg_pool_backward(dy, x_shape, kernel_size, stride, padding, count_include_pad):
    dx = np.empty(x_shape, dy.dtype)
    xp, dp = _planes(dx), _planes(dy)
    _rows_split(xp.shape[0], lambda lo, hi: _avg_pool(
        xp[lo:hi], dp[lo:hi], dp[lo:hi], xp[lo:hi], True, kernel_size[0], kernel_size[1],
        stride[0], stride[1], padding[0], padding[1], padding[2], padding[3], count_include_pad))
    return dx


def global_avg_pool_forward(x):
    """(C, N, H, W) -> (C, N, 1, 1)."""
    return x.mean(axis=(2, 3), keepdims=True, dtype=np.float64).astype(x.dtype)


def global_avg_pool_backward(dy, x_shape):
    hw = x_shape[2] * x_shape[3]
    return np.broadcast_to(dy / hw, x_shape).astype(dy.dtype)


def linear_forward(x, w, b=None):
    y = x @ w.T
    if b is not None:
        y += b
    return y


def linear_backward(dy, x, w, has_bias):
    """(N, M) dy, (N, K) x, (M, K) w -> dx (N, K), dw (M, K), db (M,)."""
    return dy @ w, dy.T @ x, (dy.sum(axis=0) if has_bias else None)


def softmax_cross_entropy(logits, labels):
    """Mean cross-entropy over the batch and its gradient w.r.t. the logits (N, K)."""
    z = logits.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=1, keepdims=True))
    logp = z - lse
    n = logits.shape[0]
    labels = np.asarray(labels, dtype=np.int64)
    loss = -logp[np.arange(n), labels].mean()
    grad = np.exp(logp)
    grad[np.arange(n), labels] -= 1.0
    return float(loss), (grad / n).astype(logits.dtype)


# ============================================================================ NCHW free functions

def to_cnhw(x):
    """(N, C, H, W) -> contiguous (C, N, H, W)."""
    return np.ascontiguousarray(np.asarray(x).transpose(1, 0, 2, 3))


def to_nchw(x):
    return np.ascontiguousarray(x.transpose(1, 0, 2, 3))


def conv2d_forward(x, w, b=None, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    """NCHW conv2d (PyTorch semantics, IR-normalized params) via im2col + GEMM."""
    g = ConvGeom(x.shape, w.shape, stride, padding, dilation, groups)
    return to_nchw(conv_forward_cnhw(to_cnhw(x), np.ascontiguousarray(w), g, bias=b))


def conv2d_backward(dy, x, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1,
                    has_bias=False):
    """NCHW gradients (dx, dw, db) of conv2d_forward via GEMMs + col2im."""
    g = ConvGeom(x.shape, w.shape, stride, padding, dilation, groups)
    dw, db, dx = conv_backward_cnhw(to_cnhw(dy), to_cnhw(x), np.ascontiguousarray(w), g,
                                    has_bias=has_bias)
    return to_nchw(dx), dw, db


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
