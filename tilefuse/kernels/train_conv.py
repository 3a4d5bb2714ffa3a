"""Convolution for training: forward and backward on CNHW tensors, with the fused pre- and
post-processing of seed 004 (the trainer's conv-centred units, `training/schedule.py`).

A convolution is one GEMM per column tile, ``Y (O, N*Ho*Wo) = W (O, C*kh*kw) @ cols (C*kh*kw,
N*Ho*Wo)``, with no transposes (CNHW, `cnhw.py`); a 1x1 stride-1 convolution needs no im2col at
all, and a stride-1 conv whose padded plane wastes little runs as shifted GEMMs on one padded
copy of its input. GEMMs are `kernels.blas.gemm` (single-threaded OpenBLAS, in place into
views); tiles are split over the step's threads (`kernels/threads.py`).

The numba loops (``nogil``, ``cache``, one tile per call) carry the fused processing:
im2col with an input-stage transform (BN step 2, shortcut Add, ReLU), col2im with a
post-processing (error Add, ReLU', BN step-1 sums S1/S2), the backward pre-processing
``dy = F1*dz + B*x + C``, and the conv epilogue (bias, BN step-1 sums of x and x^2); the batch
norm algebra itself is in `norm.py`. `conv2d_forward` / `conv2d_backward` are the NCHW free
functions the tests check against PyTorch autograd.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from .blas import gemm
from .cnhw import _D64, JIT, JITR, _o, _valid, dummies, to_cnhw, to_nchw
from .reference import conv_out_size
from .threads import nthreads, ranges, scratch, split


# ============================================================================ numba loops

@nb.njit(**JIT)
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


@nb.njit(**JITR)
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


@nb.njit(**JITR)
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


@nb.njit(**JITR)
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


@nb.njit(**JITR)
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


@nb.njit(**JITR)
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


@nb.njit(**JITR)
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


@nb.njit(**JITR)
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


@nb.njit(**JITR)
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


@nb.njit(**JITR)
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
        t = nthreads() if threads is None else threads
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
        t = nthreads() if threads is None else threads
        per_image = (self.C + self.O) * self.Hp * self.Wp * itemsize
        nb_ = max(1, min(_SHIFT_BYTES // per_image, -(-self.N // t)))
        nt = -(-self.N // nb_)
        if nt > 1:
            nt = -(-nt // t) * t
        nb_ = -(-self.N // nt)
        return [(n0, min(self.N, n0 + nb_)) for n0 in range(0, self.N, nb_)]

    def col_tiles(self, itemsize=4, threads=None):
        """Column ranges of the (C, N*H*W) rows of a 1x1 stride-1 conv (see _L2_TILE)."""
        t = nthreads() if threads is None else threads
        M = self.N * self.ho * self.wo
        m = max(1024, _L2_TILE // (itemsize * (self.C + self.O)) // 64 * 64)
        m = min(m, max(64, -(-M // t)))
        return ranges(M, -(-M // m))


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
    threads of `kernels.threads.split`; each thread transforms its tile into its own scratch buffer,
    runs one single-threaded GEMM per group and the epilogue on the tile it just wrote."""
    y = out if out is not None else np.empty((g.O, g.N, g.ho, g.wo), x.dtype)
    y2 = y.reshape(g.O, -1)
    og = g.O // g.groups
    w2 = w.reshape(g.O, -1)                         # (O, Cg*kh*kw)
    hw = g.ho * g.wo
    T = nthreads()
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
            gemm(w2[gi * og:(gi + 1) * og], cols[gi * g.K:(gi + 1) * g.K],
                     y2[gi * og:(gi + 1) * og, c0:c1])
        epilogue(y2, c0, c1, bias, st[tid])

    split(len(tl), task)
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
            gemm(wk[k], xp[:, off:off + L], yw, beta=0.0 if k == 0 else 1.0)
        s_, ss_ = st[tid] if st[tid] is not None else (_D64, _D64)
        _unwide(yw, y, n0, n1, g.Hp, g.Wp, _o(bias, d1), bias is not None, st[tid] is not None,
                s_, ss_)

    split(len(tl), task)
    if stats is not None:
        for s in st:
            stats[0][...] += s[0]
            stats[1][...] += s[1]
    return y


def _shift_backward(dy, x, w, g: ConvGeom, pre, post, dy_pre, need_dx, has_bias):
    T = nthreads()
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
            gemm(dyw, xp[:, off:off + L].T, dwk[k], beta=1.0)
        if not need_dx:
            return
        dxp = scratch("dxp", (g.C, L + g.tail), x.dtype)
        dxp[:, L:] = 0
        for k, off in enumerate(g.offs):
            gemm(wk[k].T, dyw, dxp[:, off:off + L], beta=0.0 if k == 0 else 1.0)
        _unpad_post(dxp, dx, n0, n1, g.pt, g.pl, g.Hp, g.Wp, _o(post.acc, d4),
                    post.acc is not None, _o(post.mk, d4), mask_mode, _o(post.ma, d1),
                    _o(post.mb, d1), _o(post.x1, d4), _o(post.x2, d4), nstat, *sums[tid])

    split(len(tl), task)
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
    T = nthreads()
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
                gemm(cols[gi * g.K:(gi + 1) * g.K], dyt[gi * og:(gi + 1) * og].T, dw_t[gi],
                         beta=1.0)
            else:
                gemm(dyt[gi * og:(gi + 1) * og], cols[gi * g.K:(gi + 1) * g.K].T,
                         dw_t[gi * og:(gi + 1) * og], beta=1.0)
        if not need_dx:
            return
        if g.direct:
            for gi in range(g.groups):
                gemm(w2[gi * og:(gi + 1) * og].T, dyt[gi * og:(gi + 1) * og],
                         dx2[gi * g.K:(gi + 1) * g.K, c0:c1])
            if not post_id:
                post_rows(dx2, c0, c1, post, sums[tid])
            return
        dcols = scratch("dcols", (g.C * g.kh * g.kw, c1 - c0), x.dtype)
        for gi in range(g.groups):
            gemm(w2[gi * og:(gi + 1) * og].T, dyt[gi * og:(gi + 1) * og],
                     dcols[gi * g.K:(gi + 1) * g.K])
        col2im(dcols, dx, g, n0, n1, post, sums[tid])

    split(len(tl), task)
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


# ============================================================================ NCHW free functions

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
