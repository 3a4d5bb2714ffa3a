"""Convolution for training: forward and backward on CNHW tensors, with the fused pre- and
post-processing of seed 004 (the trainer's conv-centred units, `training/schedule.py`).

Three paths, all GEMMs on column tiles with no transposes (CNHW, `cnhw.py`):

    Winograd   3x3, stride 1, pad 1, one group, float32 (`train_winograd.py`): 16 GEMMs per
               tile on transformed filters and input patches, 2.25x fewer multiplies
    direct     1x1, stride 1, no padding: cols is the input itself (or its transform)
    im2col     everything else: Y (O, m) = W (O, C*kh*kw) @ cols (C*kh*kw, m); backward
                   dW^T (C*kh*kw, O) += cols (C*kh*kw, m) @ dy^T (m, O)
                   dX (C, m) = Wd (C, O*kh*kw) @ cols_dy (O*kh*kw, m) for stride-1 "same"
                   convs (the im2col of dy with the taps mirrored: a gather, no scatter-add),
                   else dcols = W^T @ dy and col2im (a gather too, `_col2im_post`)

GEMMs are `kernels.blas.gemm` (single-threaded OpenBLAS through ctypes, in place into views)
or `blas.nb_gemm` (the same library called from inside numba). The numba loops (``nogil``,
``cache``, one tile per call) carry the fused processing: im2col with an input-stage transform
(BN step 2, shortcut Add, ReLU), the post-processing of the input gradient (error Add, ReLU',
BN step-1 sums S1/S2) on the GEMM's output tile while it is in cache, the backward
pre-processing ``dy = F1*dz + B*x + C``, and the conv epilogue (bias, BN step-1 sums of x and
x^2); the batch-norm algebra itself is in `norm.py`. `conv2d_forward` / `conv2d_backward` are
the NCHW free functions the tests check against PyTorch autograd.

im2col. A stride-1 conv whose output plane has its input's shape ("same" padding) reads tap t
of output position q at input position q + d_t of the flattened planes of a tile of images,
so a cols row is one shifted copy of the (transformed) tile under a 0/1 mask of the positions
whose tap falls inside the image (`_cols_shift`: contiguous loads and selects, ~0.1 ns per
element). Other convs gather through a (taps, positions) index table into one transformed
plane with a zero slot for padding (`_cols_gather`).

Partitioning (the same for every thread count). Every conv call runs a task grid that depends
only on the layer's shape, planned for up to `TASKS` threads (`Plan`): column tiles (a power-of-
two count of image ranges, or column ranges for 1x1 stride-1 convs) of about `COLS_BYTES` of
operand, split further
into output-channel blocks (forward) or input-channel blocks (input gradient) when a layer has
fewer tiles than `TASKS`, and weight-gradient tasks (input-channel block x a fixed group of
tiles, each group accumulating its tiles in order into its own partial dW, the partials summed
in group order). Tasks are handed to the step's threads (`kernels.threads.split`) in any order;
every GEMM call has the same operands whichever thread runs it, and every reduction across tasks
(BN sums, bias gradient, dW partials) goes through per-task partials summed in a fixed order, so
the results are bitwise identical for 1, 2, 3, ... threads. (A grid sized for the thread count
would not be: OpenBLAS's result for an element depends on the size of the GEMM that computes
it.) A tile that several tasks read is built once: by the thread that runs them (im2col), or
into a shared buffer in a first parallel phase (Winograd's transforms).
"""
from __future__ import annotations

import os
import threading
from functools import lru_cache

import numba as nb
import numpy as np

from . import train_winograd as wg
from .blas import SGEMM, gemm
from .cnhw import _D64, JIT, JITR, _o, _valid, dummies, to_cnhw, to_nchw, transform_rows
from .conv._nb import ev2
from .reference import conv_out_size, conv_transpose_out_size
from .threads import nthreads, scratch, split

# ============================================================================ task grid

TASKS = 16                 # the grid is planned for up to this many threads (any count runs it)
COLS_BYTES = 2 << 20       # operand bytes of a column tile (about one core's L2)
MIN_COLS = 256             # GEMM columns of a tile when the layer has them
MAX_COLS = 8192
MIN_BLOCK = 128            # output / input channels of a block when a layer is split by channels
                           # (smaller blocks re-pack the tile's cols for too few GEMM rows)
MIN_KROWS = 128            # cols rows of a weight-gradient block
DW_PARTIAL_BYTES = 16 << 20  # at most this much memory of weight-gradient partials
WINO_DW_PATCHES = 1536     # patches a Winograd weight-gradient GEMM reduces over (at least)
# Winograd F(2x2, 3x3) (`train_winograd.py`) for the 3x3 stride-1 pad-1 one-group float32 convs
# where cblas_sgemm can be called from numba (blas.SGEMM); False: im2col + GEMM for all
WINOGRAD = SGEMM[0] != 0 and os.environ.get("TILEFUSE_TRAIN_WINOGRAD", "1") != "0"

_LOCAL = threading.local()


# ============================================================================ numba loops

@nb.njit(**JIT)
def _cols_shift(x2, a, b, s2, a2, b2, r2, cols, n0, n1, c0, c1, hw, d, mask, margin,
                affine, skind, relu, write_r):
    """Stride-1 "same" conv: cols[(c - c0)*kk + t, q] = t(x)[c, n0*hw + q + d[t]] where mask[t, q],
    else 0, for c in [c0, c1) and q < (n1 - n0)*hw.

    x2, s2, r2: (C, N*H*W) rows (hw = H*W); cols: ((c1 - c0)*kk, >= (n1 - n0)*hw); d: (kk,)
    flat offset of tap t; mask: (kk, >= (n1 - n0)*hw) whether tap t of position q is inside
    its image. The tile's transformed row sits in a buffer with `margin` zeros on both sides,
    so every shifted read stays inside it."""
    L = (n1 - n0) * hw
    kk = d.shape[0]
    tb = np.zeros(L + 2 * margin, x2.dtype)
    mid = tb[margin:margin + L]
    for c in range(c0, c1):
        transform_rows(x2, a, b, s2, a2, b2, r2, c, n0 * hw, n1 * hw, mid, affine, skind, relu, write_r)
        for t in range(kk):
            row = cols[(c - c0) * kk + t, :L]
            o = margin + d[t]
            src = tb[o:o + L]
            mt = mask[t, :L]
            for q in range(L):
                row[q] = src[q] if mt[q] else 0


@nb.njit(**JIT)
def _cols_gather(x2, a, b, s2, a2, b2, r2, cols, n0, n1, c0, c1, HW, idx,
                 affine, skind, relu, write_r):
    """Any conv: cols[(c - c0)*kk + t, (n - n0)*hw + p] = plane[idx[t, p]] where plane is the
    transformed input plane (c, n) (HW values) followed by one zero (the padding slot)."""
    kk, hw = idx.shape
    nn = n1 - n0
    tmp = np.empty(nn * HW, x2.dtype)
    plane = np.zeros(HW + 1, x2.dtype)
    for c in range(c0, c1):
        # the channel's planes of all the tile's images at once (one call per plane cost ~0.3 us,
        # more than the gather on 7x7 planes)
        transform_rows(x2, a, b, s2, a2, b2, r2, c, n0 * HW, n1 * HW, tmp, affine, skind, relu, write_r)
        for n in range(nn):
            src = tmp[n * HW:(n + 1) * HW]
            for q in range(HW):
                plane[q] = src[q]
            base = n * hw
            for t in range(kk):
                row = cols[(c - c0) * kk + t, base:base + hw]
                it = idx[t]
                for p in range(hw):
                    row[p] = plane[it[p]]


@nb.njit(**JIT)
def _cols_s2(x2, a, b, s2, a2, b2, r2, cols, n0, n1, c0, c1, H, W, kh, kw, sh, pt, pl, dh, ho, wo,
             affine, skind, relu, write_r):
    """`_cols_gather` for convs of stride 2 along W (dilation 1 there; the stem, ResNet's strided 3x3s and
    1x1 shortcuts): per plane, the transformed input copied into a zero-padded plane once, then each cols
    row (tap, output row) the even columns of a padded row, 16, 8 or 4 at a time (`_nb.ev2`, the last
    chunk overlapping). The same values as the gather (a copy): the gather through the index table ran
    ~0.5 ns a value (the stem's im2col: 7.7 ms of CPU a step)."""
    kk = kh * kw
    hw = ho * wo
    HW = H * W
    nn = n1 - n0
    Hp = max((ho - 1) * sh + (kh - 1) * dh + 1, pt + H)
    Wp = max(2 * (wo - 1) + kw, pl + W) + 32      # + the last vector load's slack
    plane = np.zeros(Hp * Wp, x2.dtype)          # padding stays 0
    tmp = np.empty(nn * HW, x2.dtype)
    for c in range(c0, c1):
        transform_rows(x2, a, b, s2, a2, b2, r2, c, n0 * HW, n1 * HW, tmp, affine, skind, relu, write_r)
        for n in range(nn):
            for i in range(H):
                dst = plane[(pt + i) * Wp + pl:(pt + i) * Wp + pl + W]
                src = tmp[n * HW + i * W:n * HW + (i + 1) * W]
                for j in range(W):
                    dst[j] = src[j]
            base = n * hw
            for ki in range(kh):
                for kj in range(kw):
                    row = cols[(c - c0) * kk + ki * kw + kj]
                    for oy in range(ho):
                        s = (oy * sh + ki * dh) * Wp + kj
                        d = base + oy * wo
                        if wo >= 16:
                            for k in range((wo + 15) // 16):
                                t = min(16 * k, wo - 16)
                                ev2(row, d + t, plane, s + 2 * t, 16)
                        elif wo >= 8:
                            for k in range((wo + 7) // 8):
                                t = min(8 * k, wo - 8)
                                ev2(row, d + t, plane, s + 2 * t, 8)
                        elif wo >= 4:
                            for k in range((wo + 3) // 4):
                                t = min(4 * k, wo - 4)
                                ev2(row, d + t, plane, s + 2 * t, 4)
                        else:
                            for t in range(wo):
                                row[d + t] = plane[s + 2 * t]


@nb.njit(**JIT)
def _pre_rows(x2, a, b, s2, a2, b2, r2, out, k0, k1, affine, skind, relu, write_r):
    """1x1 stride-1 conv: out[c, k - k0] = t(x2[c, k]) for k in [k0, k1) (t as in _transform)."""
    for c in range(x2.shape[0]):
        transform_rows(x2, a, b, s2, a2, b2, r2, c, k0, k1, out[c], affine, skind, relu, write_r)


@nb.njit(**JITR)
def _col2im_post(df, ld, dx2, n0, n1, HW, tbl, acc2, has_acc, mk2, mask_mode, ma, mb, x12, x22,
                 nstat, s1, s2a, s2b):
    """dx[c, n] = post(sum of the dcols entries that land on (c, n, ih, iw)), n in [n0, n1): the
    col2im as a gather (no scatter-add): input position p of local image l receives
    df[c*kk*ld + tbl[j, l, p]] for j < J (kk = rows per channel; unused entries point at a
    zero column of row c*kk), summed in j order, then post-processed in one pass:
        v += acc                            if has_acc (the error Add at a fork)
        v = v if mk > 0 / ma*mk + mb > 0    if mask_mode == 1 / 2 (ReLU')
        s1[c] += v, s2a[c] += v*x1, s2b[c] += v*x2   for nstat >= 1, >= 1, == 2 (BN step 1)

    df: the flat dcols scratch, rows of ld values (a channel block's C*kk rows); dx2, acc2,
    mk2, x12, x22: (C, N*HW) rows of the block's channels."""
    C = dx2.shape[0]
    J = tbl.shape[0]
    kk_ld = (df.shape[0] // ld) // C * ld
    plane = np.empty(HW, dx2.dtype)
    for c in range(C):
        cb = c * kk_ld
        mac = ma[c] if mask_mode == 2 else 1
        mbc = mb[c] if mask_mode == 2 else 0
        t1 = 0.0
        t2 = 0.0
        t3 = 0.0
        for n in range(n0, n1):
            tl = tbl[:, n - n0]
            t0 = tl[0]
            for q in range(HW):                   # gathers in table order (they vectorize)
                plane[q] = df[cb + t0[q]]
            for j in range(1, J):
                tj = tl[j]
                for q in range(HW):
                    plane[q] += df[cb + tj[q]]
            dr = dx2[c, n * HW:(n + 1) * HW]
            if has_acc == 0 and mask_mode == 0 and nstat == 0:
                for q in range(HW):
                    dr[q] = plane[q]
                continue
            ar = acc2[c, n * HW:(n + 1) * HW] if has_acc else plane
            mr = mk2[c, n * HW:(n + 1) * HW] if mask_mode != 0 else plane
            xr = x12[c, n * HW:(n + 1) * HW] if nstat >= 1 else plane
            xr2 = x22[c, n * HW:(n + 1) * HW] if nstat == 2 else plane
            for q in range(HW):                   # one fused pass, selects (no jumps)
                v = plane[q]
                if has_acc:
                    v += ar[q]
                if mask_mode == 1:
                    v = v if mr[q] > 0 else 0
                elif mask_mode == 2:
                    v = v if mac * mr[q] + mbc > 0 else 0
                dr[q] = v
                w = np.float64(v)                 # float64 products (the BN sums cancel: norm._row_sums)
                if nstat >= 1:
                    t1 += w
                    t2 += w * xr[q]
                if nstat == 2:
                    t3 += w * xr2[q]
        if nstat >= 1:
            s1[c] += t1
            s2a[c] += t2
        if nstat == 2:
            s2b[c] += t3


@nb.njit(**JITR)
def _post_rows(d2, k0, k1, acc2, has_acc, mk2, mask_mode, ma, mb, x12, x22, nstat, s1, s2a, s2b):
    """The post-processing of _col2im_post in place on the column tile [k0, k1) of the (C, M)
    input gradient rows d2 (a channel block, just written by the GEMM, still in cache).

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
                v = np.float64(d[j])                # float64 products (norm._row_sums)
                t1 += v
                t2 += v * xa[j]
            s1[c] += t1
            s2a[c] += t2
        if nstat == 2:
            t3 = 0.0
            xc = x22[c, k0:k1]
            for j in range(n):
                t3 += np.float64(d[j]) * xc[j]
            s2b[c] += t3


@nb.njit(**JITR)
def _epilogue(y2, c0, c1, bias, has_bias, stats, s, ss):
    """In place on the column tile y2[:, c0:c1] (an output-channel block): add bias; per-row sum
    and sum of squares (BN step 1 of the consuming batch norm) into s, ss."""
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
                w = np.float64(v)                    # float64 products (norm._row_sums)
                t += w
                tt += w * w
        if stats:
            s[o] += t
            ss[o] += tt


@nb.njit(**JITR)
def _bwd_pre(dz, x, f1, bb, cc, out):
    """out = F1*dz + B*x + C row by row (BN step 2 backward); dz, x, out: (O, L) views."""
    for o in range(dz.shape[0]):   # 1-D row slices: 2-D indexing with an offset does not vectorize
        fo = f1[o]
        bo = bb[o]
        co = cc[o]
        d = dz[o]
        xr = x[o]
        orow = out[o]
        for j in range(d.shape[0]):
            orow[j] = fo * d[j] + bo * xr[j] + co


@nb.njit(**JIT)
def _sum_transpose(dwp, dw3, gi, k0, k1):
    """dw3[gi, o, k] = sum over partials p in order of dwp[p, gi, k, o], for k in [k0, k1):
    the weight-gradient partials (transposed, (K, og) per conv group) summed and turned into
    W's layout in one pass: 16 rows of K at a time summed into a buffer (contiguous rows of og),
    then stored transposed (16 contiguous values per output channel)."""
    P, _, K, og = dwp.shape
    t = np.empty((16, og), dwp.dtype)
    for kb in range(k0, k1, 16):
        nk = min(kb + 16, k1) - kb
        for i in range(nk):
            tr = t[i]
            src = dwp[0, gi, kb + i]
            for j in range(og):
                tr[j] = src[j]
            for q in range(1, P):
                src = dwp[q, gi, kb + i]
                for j in range(og):
                    tr[j] += src[j]
        for o in range(og):
            r = dw3[gi, o]
            for i in range(nk):
                r[kb + i] = t[i, o]


@nb.njit(**JITR)
def _row_sums(a2, out):
    """out[o] = sum of row o of a2 (float64)."""
    for o in range(a2.shape[0]):
        t = 0.0
        r = a2[o]
        for j in range(r.shape[0]):
            t += r[j]
        out[o] = t


# ============================================================================ geometry

class ConvGeom:
    """Static geometry of one conv2d op (IR-normalized params) on CNHW tensors."""

    __slots__ = ("C", "N", "H", "W", "O", "kh", "kw", "sh", "sw", "pt", "pb", "pl", "pr",
                 "dh", "dw", "groups", "ho", "wo", "direct", "same", "wino", "K", "key")

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
        # stride 1, output plane = input plane: im2col and the input gradient are shifted copies
        self.same = (not self.direct and self.sh == self.sw == 1 and self.ho == self.H
                     and self.wo == self.W)
        # 3x3, stride 1, pad 1, one group: Winograd F(2x2, 3x3) for float32 (see WINOGRAD)
        self.wino = (self.kh == self.kw == 3 and self.sh == self.sw == 1 and groups == 1
                     and self.dh == self.dw == 1 and tuple(padding) == (1, 1, 1, 1))
        self.key = (self.N, self.C, self.H, self.W, self.O, cg, self.kh, self.kw, self.sh,
                    self.sw, tuple(padding), self.dh, self.dw, groups)

    def args(self):
        return (self.kh, self.kw, self.sh, self.sw, self.pt, self.pl, self.dh, self.dw,
                self.ho, self.wo)

    @property
    def kk(self):
        return self.kh * self.kw


@lru_cache(maxsize=256)
def _shift_tables(key, nb_, mirrored):
    """(d, mask, margin) of the shifted im2col of a "same" conv for tiles of nb_ images: tap t of
    output position q reads input position q + d[t] when mask[t, q]. mirrored: the tables of the
    input gradient's gather (output position q - d[t] feeds input position q)."""
    N, C, H, W, O, cg, kh, kw, sh, sw, pad, dh, dw, groups = key
    pt, pl = pad[0], pad[2]
    ih = np.arange(H)[:, None]
    iw = np.arange(W)[None, :]
    d = np.empty(kh * kw, np.int64)
    mask = np.empty((kh * kw, nb_ * H * W), np.bool_)
    for ki in range(kh):
        for kj in range(kw):
            t = ki * kw + kj
            oy, ox = ki * dh - pt, kj * dw - pl
            if mirrored:           # input (ih, iw) <- output (ih - oy, iw - ox)
                ok = (ih - oy >= 0) & (ih - oy < H) & (iw - ox >= 0) & (iw - ox < W)
                d[t] = -(oy * W + ox)
            else:                  # output (oh, ow) <- input (oh + oy, ow + ox)
                ok = (ih + oy >= 0) & (ih + oy < H) & (iw + ox >= 0) & (iw + ox < W)
                d[t] = oy * W + ox
            mask[t] = np.tile(ok.reshape(-1), nb_)
    return d, mask, int(np.abs(d).max()) if d.size else 0


@lru_cache(maxsize=256)
def _gather_table(key):
    """idx (kk, ho*wo): the flat input position tap t of output position p reads, or H*W (the
    zero slot) where it falls into the padding."""
    N, C, H, W, O, cg, kh, kw, sh, sw, pad, dh, dw, groups = key
    pt, pl = pad[0], pad[2]
    ho = conv_out_size(H, kh, sh, pad[0], pad[1], dh)
    wo = conv_out_size(W, kw, sw, pad[2], pad[3], dw)
    oh = np.arange(ho)[:, None]
    ow = np.arange(wo)[None, :]
    idx = np.empty((kh * kw, ho * wo), np.int32)
    for ki in range(kh):
        for kj in range(kw):
            ih = oh * sh - pt + ki * dh
            iw = ow * sw - pl + kj * dw
            ok = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            idx[ki * kw + kj] = np.where(ok, ih * W + iw, H * W).reshape(-1)
    return idx


@lru_cache(maxsize=256)
def _col2im_table(key, nb_, ld):
    """tbl (J, nb_, H*W) int32 for _col2im_post: for input position p of local image l, the
    offsets t*ld + l*ho*wo + q of the dcols entries (tap t, output position q) that land on it,
    in tap order, padded with ld - 1 (a zero column); J = the most any position receives."""
    N, C, H, W, O, cg, kh, kw, sh, sw, pad, dh, dw, groups = key
    pt, pl = pad[0], pad[2]
    ho = conv_out_size(H, kh, sh, pad[0], pad[1], dh)
    wo = conv_out_size(W, kw, sw, pad[2], pad[3], dw)
    lists = [[] for _ in range(H * W)]
    for ki in range(kh):
        for kj in range(kw):
            for oh in range(ho):
                ih = oh * sh - pt + ki * dh
                if not 0 <= ih < H:
                    continue
                for ow in range(wo):
                    iw = ow * sw - pl + kj * dw
                    if 0 <= iw < W:
                        lists[ih * W + iw].append((ki * kw + kj) * ld + oh * wo + ow)
    J = max(1, max(len(v) for v in lists))
    tbl = np.full((J, nb_, H * W), ld - 1, np.int32)
    for p, v in enumerate(lists):
        for j, off in enumerate(v):
            tbl[j, :, p] = off + np.arange(nb_) * (ho * wo)
    return tbl


# ============================================================================ task grid

def _ranges(n, parts, align=1):
    """range(n) in `parts` contiguous [lo, hi) pieces of equal size (multiples of align)."""
    parts = max(1, min(parts, -(-n // align)))
    step = -(-n // parts)
    step = -(-step // align) * align
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def _parts() -> int:
    """Pieces of a split whose pieces' results do not depend on where it is cut (transforms
    and sums per channel row): two per thread of the step, one on one thread. Each piece is a
    Python task; 32 of ~5 us each took 0.2-0.4 ms on 2 threads, the workers waiting for the
    GIL between them."""
    t = nthreads()
    return 1 if t == 1 else 2 * t


def _blocks(rows, groups, ntiles, min_rows=MIN_BLOCK):
    """(group, lo, hi) row blocks of each group's `rows` rows: one per group when the layer has
    TASKS tiles, else enough for about TASKS tasks (blocks of >= min_rows, multiples of 16)."""
    per = 1
    if ntiles * groups < TASKS:
        per = max(1, min(-(-TASKS // (ntiles * groups)), rows // min_rows))
    out = []
    for gi in range(groups):
        for lo, hi in _ranges(rows, per, 16 if rows >= 16 * per else 1):
            out.append((gi, gi * rows + lo, gi * rows + hi))
    return out


class Plan:
    """A conv's task grid (shape only, see the module docstring).

    tiles: column tiles, as image ranges [n0, n1) (im2col) or column ranges (direct);
    cols(i): the tile's GEMM columns [c0, c1); oblocks / cblocks: (group, lo, hi) output / input
    channel blocks of the forward and input-gradient tasks; kblocks: (group, c_lo, c_hi)
    input-channel blocks of the weight gradient; dw_groups: tile ranges whose weight-gradient
    partial one task accumulates in order."""

    def __init__(self, g: ConvGeom, itemsize=4, wino=False):
        hw = g.ho * g.wo
        M = g.N * hw
        Cg = g.C // g.groups
        og = g.O // g.groups
        self.wino = wino
        _, planes, T = _wino_geom(g) if wino else (0, 0, 0)
        if wino:                 # Winograd: T patches per image, 16*C or 36*C (*O) values each
            unit, rows = T, planes * max(g.C, g.O)
        else:                    # operand rows per column of cols (and of dy's im2col)
            unit, rows = (1 if g.direct else hw), max(g.C * g.kk, g.O * g.kk if g.same else 0)
        m = max(MIN_COLS, min(MAX_COLS, COLS_BYTES // max(rows * itemsize, 1)))
        m = min(m, max(MIN_COLS, -(-(g.N * unit) // TASKS)))  # TASKS tiles when the layer has them
        if g.direct:
            self.unit = 1
            self.tiles = _ranges(M, -(-M // m), 64)
        else:
            nb_ = max(1, min(g.N, round(m / max(unit, 1))))
            self.unit = hw
            # a power-of-two tile count: equal tiles that any power-of-two thread count shares
            # evenly (32 images in 7 tiles of 5 left one thread idle for the last tile's time)
            count = min(g.N, 1 << (-(-g.N // nb_) - 1).bit_length())
            self.tiles = [(g.N * i // count, g.N * (i + 1) // count) for i in range(count)]
        nt = len(self.tiles)
        self.max_units = max(hi - lo for lo, hi in self.tiles)
        self.oblocks = _blocks(og, g.groups, nt)
        self.cblocks = _blocks(Cg, g.groups, nt)
        # weight gradient: tile groups that accumulate their own partial dW, as many as TASKS
        # needs while the partials stay within DW_PARTIAL_BYTES; input-channel blocks (of >=
        # MIN_KROWS cols rows, or 64 channels for Winograd) for the rest
        dw_bytes = g.O * (planes * g.C if wino else g.K) * itemsize
        ng = max(1, min(nt, TASKS, DW_PARTIAL_BYTES // max(dw_bytes, 1)))
        if wino:
            # Winograd's weight-gradient GEMMs reduce over patches: long chunks of them
            # (WINO_DW_PATCHES, whole images), fewer groups; input-channel blocks of >= 64
            ng = max(1, min(ng, (g.N * unit) // WINO_DW_PATCHES))
            per = max(1, WINO_DW_PATCHES // unit)
            self.dw_chunks = [[(a + lo, a + hi) for lo, hi in _ranges(b - a, -(-(b - a) // per))]
                              for a, b in _ranges(g.N, ng)]
        most = Cg // 64 if wino else (Cg * g.kk) // MIN_KROWS
        nk = max(1, min(Cg, most, -(-TASKS // (ng * g.groups))))
        self.kblocks = [(gi, gi * Cg + lo, gi * Cg + hi) for gi in range(g.groups)
                        for lo, hi in _ranges(Cg, nk)]
        self.dw_groups = _ranges(nt, ng)

    def cols(self, i):
        lo, hi = self.tiles[i]
        return lo * self.unit, hi * self.unit


@lru_cache(maxsize=256)
def plan(key, itemsize=4, wino=False) -> Plan:
    N, C, H, W, O, cg, kh, kw, sh, sw, pad, dh, dw, groups = key
    return Plan(ConvGeom((N, C, H, W), (O, cg, kh, kw), (sh, sw), pad, (dh, dw), groups), itemsize,
                wino)


def _use_wino(g: ConvGeom, dtype) -> bool:
    return WINOGRAD and g.wino and np.dtype(dtype) == np.float32


def _wino_geom(g: ConvGeom):
    """(m, planes, T) of a Winograd conv: F(m x m, 3x3) (`train_winograd.wino_m`: 4 on small planes),
    (m + 2)^2 transform planes, T patches an image."""
    m = wg.wino_m(g.H, g.W)
    return m, (m + 2) * (m + 2), wg.wino_tiles(g.H, g.W, m)


# ============================================================================ python wrappers

class Pre:
    """Input-stage transform of a fused conv (see _transform); all None = identity."""

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

    def args(self, dtype, C):
        """(a, b, s2, a2, b2, r2) with placeholders for the unused ones; s, r as (C, L) rows."""
        d1, _, d2 = dummies(dtype)
        return (_o(self.a, d1), _o(self.b, d1),
                d2 if self.s is None else self.s.reshape(C, -1), _o(self.a2, d1), _o(self.b2, d1),
                d2 if self.r_out is None else self.r_out.reshape(C, -1))


IDENTITY = Pre()


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


def _tile_cols(x, g: ConvGeom, p: Plan, i, c0, c1, pre: Pre, out, token=None):
    """The cols rows of input channels [c0, c1) for tile i: a view of x (1x1 stride 1, no
    transform) or `out` filled by the fused im2col. With a token, a thread that built the same
    (token, tile, channels) last returns its buffer as is."""
    lo, hi = p.tiles[i]
    if g.direct and pre.identity:
        return x.reshape(x.shape[0], -1)[c0:c1, lo:hi]
    if token is not None:
        key = (token, i, c0, c1)
        if getattr(_LOCAL, "cols_key", None) == key:   # same call (token), tile and channels:
            return out                                   # the scratch still holds them
    C = x.shape[0]
    x2 = x.reshape(C, -1)
    a, b, s2, a2, b2, r2 = pre.args(x.dtype, C)
    if g.direct:
        _pre_rows(x2[c0:c1], a[c0:c1] if pre.a is not None else a,
                  b[c0:c1] if pre.b is not None else b,
                  s2[c0:c1] if pre.s is not None else s2,
                  a2[c0:c1] if pre.a2 is not None else a2,
                  b2[c0:c1] if pre.b2 is not None else b2,
                  r2[c0:c1] if pre.r_out is not None else r2, out, lo, hi, *pre.flags())
    elif g.same:
        d, mask, margin = _shift_tables(g.key, p.max_units, False)
        _cols_shift(x2, a, b, s2, a2, b2, r2, out, lo, hi, c0, c1, g.H * g.W, d, mask, margin,
                    *pre.flags())
    elif g.sw == 2 and g.dw == 1 and min(g.pt, g.pl) >= 0:
        _cols_s2(x2, a, b, s2, a2, b2, r2, out, lo, hi, c0, c1, g.H, g.W, g.kh, g.kw, g.sh, g.pt, g.pl,
                 g.dh, g.ho, g.wo, *pre.flags())
    else:
        _cols_gather(x2, a, b, s2, a2, b2, r2, out, lo, hi, c0, c1, g.H * g.W,
                     _gather_table(g.key), *pre.flags())
    if token is not None:
        _LOCAL.cols_key = (token, i, c0, c1)
    return out


def _dy_cols(dy, g: ConvGeom, p: Plan, i, out, token):
    """The im2col of the output gradient with mirrored taps (stride-1 "same" convs): rows
    (o, t), the columns of tile i (thread-cached like _tile_cols)."""
    key = (token, i)
    if getattr(_LOCAL, "dcols_key", None) == key:
        return out
    lo, hi = p.tiles[i]
    O = dy.shape[0]
    d1, _, d2 = dummies(dy.dtype)
    d, mask, margin = _shift_tables(g.key, p.max_units, True)
    _cols_shift(dy.reshape(O, -1), d1, d1, d2, d1, d1, d2, out, lo, hi, 0, O, g.H * g.W, d, mask,
                margin, False, 0, False, False)
    _LOCAL.dcols_key = key
    return out


def _sum_rows(part, out):
    """out += the per-task partials part (tasks, n) summed in task order (fixed for a grid)."""
    acc = part[0].copy()
    for r in part[1:]:
        acc += r
    out += acc


def _shared_cols(x, g: ConvGeom, p: Plan, pre: Pre, rows):
    """Every tile's cols in one buffer (tiles, rows, tile columns) of the calling thread, built
    by tasks (tile, input-channel range) (phase 1 of an im2col layer whose tiles several tasks
    read)."""
    kr = rows // g.C                              # cols rows per input channel
    mc = max(hi - lo for lo, hi in (p.cols(i) for i in range(len(p.tiles))))
    out = scratch("cols_all", (len(p.tiles), rows, mc), x.dtype)
    cr = _ranges(g.C, max(1, -(-_parts() // len(p.tiles))))
    tasks = [(i, c) for i in range(len(p.tiles)) for c in cr]

    def task(k, tid):
        i, (c0, c1) = tasks[k]
        lo, hi = p.cols(i)
        _tile_cols(x, g, p, i, c0, c1, pre, out[i, c0 * kr:c1 * kr, :hi - lo])
    split(len(tasks), task)
    return out


def conv_forward_cnhw(x, w, g: ConvGeom, bias=None, pre: Pre = IDENTITY, stats=None, out=None):
    """Y (O, N, Ho, Wo) = conv(t(x), w) [+ bias], BN step-1 sums added into stats = (s, ss).

    Tasks (tile, output-channel block) of the layer's Plan: each builds its tile's cols (the
    transformed input, im2col) in its thread's scratch (once per tile and thread), runs one
    single-threaded GEMM into its block of Y and the epilogue on the block it just wrote; the
    BN sums go to per-tile partials summed in tile order."""
    wino = _use_wino(g, x.dtype)
    p = plan(g.key, x.dtype.itemsize, wino)
    y = out if out is not None else np.empty((g.O, g.N, g.ho, g.wo), x.dtype)
    y2 = y.reshape(g.O, -1)
    w2 = w.reshape(g.O, -1)                         # (O, Cg*kh*kw)
    K = g.K
    nt, nb_ = len(p.tiles), len(p.oblocks)
    d1, _, _ = dummies(x.dtype)
    part = np.zeros((nt, 2, g.O)) if stats is not None else None
    token = object()
    rows = g.C if g.direct else g.C * g.kk
    call = None
    if wino:
        _, planes, T = _wino_geom(g)
        # several output-channel blocks per tile: the tiles' V once, shared (phase 1, with U's tasks)
        vall, vtasks = _wino_shared_input(x, g, p, pre, T) if nb_ > 1 else (None, ())
        U = _wino_weights(w, g, vtasks)
    elif nb_ > 1 and not (g.direct and pre.identity):
        # the same: every tile's cols once, shared (a thread-cached tile was built by each thread
        # that ran one of its blocks: twice per tile on two threads)
        call = _shared_cols(x, g, p, pre, rows)

    def task(k, tid):
        i, j = divmod(k, nb_)
        gi, o0, o1 = p.oblocks[j]
        c0, c1 = p.cols(i)
        if wino:
            n0, n1 = p.tiles[i]
            P = (n1 - n0) * T
            if vall is None:
                V, b0 = _wino_in(x, g, n0, n1, 0, g.C, pre, _wbuf("wv", g.C, P, x.dtype, planes)), 0
            else:
                V, b0 = vall, n0 * T
            Mt = _wbuf("wm", o1 - o0, P, x.dtype, planes)
            if wg.nn_fits(o1 - o0, g.C, P):
                wg.wino_gemms_nn(U, V, Mt, o0, 0, b0, 0, o1 - o0, g.C, P)
            else:
                wg.wino_gemms(SGEMM, U, V, Mt, o0, o1 - o0, g.C, P, b0, 0.0, False)
            wg.wino_output(Mt, o1 - o0, y2, n0, n1, o0, g.H, g.W)
        else:
            cols = (call[i, :, :c1 - c0] if call is not None else
                    _tile_cols(x, g, p, i, 0, g.C, pre, scratch("cols", (rows, c1 - c0), x.dtype),
                               token))
            _mm(w2[o0:o1], cols[gi * K:(gi + 1) * K], y2[o0:o1, c0:c1])
        if bias is not None or part is not None:
            s, ss = (part[i, 0, o0:o1], part[i, 1, o0:o1]) if part is not None else (_D64, _D64)
            _epilogue(y2[o0:o1], c0, c1, bias[o0:o1] if bias is not None else d1,
                      bias is not None, part is not None, s, ss)

    split(nt * nb_, task)
    if stats is not None:
        _sum_rows(part[:, 0], stats[0])
        _sum_rows(part[:, 1], stats[1])
    return y


@nb.njit(**JIT)
def _mirror_rows(w4, out, c0, c1):
    """out[c, o*kk + t] = w4[group(c), o, c - group(c)*Cg, t] for c in [c0, c1)."""
    groups, og, Cg, kk = w4.shape
    for c in range(c0, c1):
        gi = c // Cg
        cl = c - gi * Cg
        r = out[c]
        for o in range(og):
            src = w4[gi, o, cl]
            for t in range(kk):
                r[o * kk + t] = src[t]


def _mirror_weights(w, g: ConvGeom):
    """Wd (C, og*kh*kw): Wd[c, o*kk + t] = W[group(c)*og + o, c - group(c)*Cg, t], the weights
    of the input gradient's GEMM (scratch, split over the step's threads)."""
    og, Cg = g.O // g.groups, g.C // g.groups
    w4 = w.reshape(g.groups, og, Cg, g.kk)
    out = scratch("wd", (g.C, og * g.kk), w.dtype)
    rs = _ranges(g.C, _parts())
    split(len(rs), lambda k, tid: _mirror_rows(w4, out, rs[k][0], rs[k][1]))
    return out


def _wino_weights(w, g: ConvGeom, also=(), mirrored=False):
    """Winograd filters U (16, O, C) (scratch, split over output-channel ranges): the forward
    pass's, and with F(2x2) the input gradient's read transposed (`train_winograd.wino_gemms_mirrored`);
    F(4x4): U (36, O, C), or with `mirrored` the input gradient's Ud (36, C, O) of the rotated filters
    (split over input-channel ranges). `also`: other tasks fn(tid) that do not read U, run in the same
    split (one parallel region instead of two: the filter transform's region alone was half idle, its
    pieces short against the worker's start)."""
    w2 = w.reshape(g.O, g.C * 9)                  # (O, C*3*3) rows
    m, planes, _ = _wino_geom(g)
    if m == 2:
        out = scratch("wu", (16, g.O, g.C), w.dtype)
        tasks = [(lambda tid, lo=lo, hi=hi: wg.wino_weights(w2, out, lo, hi)) for lo, hi in _ranges(g.O, _parts())]
    elif not mirrored:
        out = scratch("wu", (planes, g.O, g.C), w.dtype)
        tasks = [(lambda tid, lo=lo, hi=hi: wg.wino4_weights(w2, out, lo, hi)) for lo, hi in _ranges(g.O, _parts())]
    else:
        out = scratch("wud", (planes, g.C, g.O), w.dtype)
        tasks = [(lambda tid, lo=lo, hi=hi: wg.wino4_weights_mirrored(w2, out, lo, hi))
                 for lo, hi in _ranges(g.C, _parts())]
    tasks += list(also)
    split(len(tasks), lambda k, tid: tasks[k](tid))
    return out


def _flat(v, span):
    """The `span` float32 from v's first element on as a 1-D array (a view; v's extent)."""
    return np.lib.stride_tricks.as_strided(v, shape=(span,), strides=(v.itemsize,))


def _mm(a, b, out):
    """out = a @ b for 2-D float32 views with unit stride along their rows: `train_winograd.nn_gemm`
    where it takes the product (the forward's weights times cols, reductions of <= NN_MAX_K: the stem's
    147-deep cols at 127-151 GFLOP/s against OpenBLAS's 120-124, a 1x1's 64 at 124 against 111), else
    OpenBLAS (`gemm`; the input gradient's transposed weights, m = C kh kw rows, ran as fast or faster
    there: OpenBLAS packs b once for all of them)."""
    (m, k), n = a.shape, b.shape[1]
    isz = a.itemsize
    if (a.dtype == np.float32 and wg.nn_fits(m, k, n) and a.strides[1] == isz and b.strides[1] == isz
            and out.strides[1] == isz):
        lda, ldb, ldc = a.strides[0] // isz, b.strides[0] // isz, out.strides[0] // isz
        wg.nn_gemm(_flat(a, (m - 1) * lda + k), 0, lda, 1, _flat(b, (k - 1) * ldb + n), 0, ldb,
                   _flat(out, (m - 1) * ldc + n), 0, ldc, m, n, k)
    else:
        gemm(a, b, out)


def _wbuf(name, rows, P, dtype, planes=16):
    """A Winograd buffer (planes, rows + 1, pitch) for `rows` rows of P patches (train_winograd.pitch)."""
    return scratch(name, (planes, rows + 1, wg.pitch(rows, P)), dtype)


def _wino_dummies(dtype):
    d1, _, d2 = dummies(dtype)
    return d1, d2, np.zeros((1, 1, 1), dtype)


def _wino_in(x, g: ConvGeom, n0, n1, c0, c1, pre: Pre, out, vr0=0, p0=0):
    """Winograd input transform of t(x), images [n0, n1), channels [c0, c1), into `out` (16 or 36
    planes, rows, pitch) at row vr0 and patch column p0."""
    C = x.shape[0]
    wg.wino_input(x.reshape(C, -1), *pre.args(x.dtype, C), out, vr0, p0, n0, n1, c0, c1, g.H,
                  g.W, *pre.flags())
    return out


def _wino_shared_input(x, g: ConvGeom, p: Plan, pre: Pre, T, name="wv_all"):
    """V of every tile in one buffer (planes, C + 1, pitch) of the calling thread, and the tasks fn(tid)
    (tile, channel range) that build it, for the caller to run (phase 1 of a layer whose tiles
    several tasks read; the forward runs them with the filter transform's)."""
    C = x.shape[0]
    out = _wbuf(name, C, g.N * T, x.dtype, _wino_geom(g)[1])
    cr = _ranges(C, max(1, -(-_parts() // len(p.tiles))))

    def task(i, c0, c1):
        n0, n1 = p.tiles[i]
        _wino_in(x, g, n0, n1, c0, c1, pre, out, c0, n0 * T)
    return out, [(lambda tid, i=i, c0=c0, c1=c1: task(i, c0, c1)) for i in range(len(p.tiles)) for c0, c1 in cr]


def conv_backward_cnhw(dy, x, w, g: ConvGeom, pre: Pre = IDENTITY, post: Post | None = None,
                       dy_pre=None, need_dx=True, has_bias=False, need_dw=True):
    """Weight, bias and input gradients of Y = conv(t(x), w).

    dy: (O, N, Ho, Wo) output gradient, or with dy_pre=(dz, xb, F1, B, C) the output gradient
    is F1*dz + B*xb + C (the consumer-side BN step 2 backward, computed once into scratch).
    Returns (dw, db, dx); dx is CNHW and post-processed by `post` (its BN sums into post.s1,
    post.s2a, post.s2b). need_dw=False: the input gradient alone (dw and db None; x is read for
    its dtype only): a transposed conv's forward is this conv's input gradient.

    One parallel region of the layer's Plan: weight-gradient tasks (input-channel block x
    tile group: per tile the block's cols, then dW^T += cols @ dy^T, GEMM beta = 1, into the
    group's partial) and input-gradient tasks (tile x input-channel block: the GEMM writes dx's
    block, post-processed in place; or dcols and col2im with the post-processing)."""
    wino = _use_wino(g, x.dtype)
    p = plan(g.key, x.dtype.itemsize, wino)
    og, Cg, K, kk = g.O // g.groups, g.C // g.groups, g.K, g.kk
    hw = g.ho * g.wo
    M = g.N * hw
    nt = len(p.tiles)
    post = post if post is not None else Post()
    post_id = post.identity
    mask_mode, nstat = post.modes()
    # ---- the output gradient, pre-processed once (elementwise: any split gives the same bits; run
    # below, with the Winograd filter transform's tasks where there is one)
    pre_tasks = []
    if dy_pre is None:
        dy2 = dy.reshape(g.O, M)
    else:
        dz, xb, f1, bb, cc = dy_pre
        dy2 = scratch("dy", (g.O, M), x.dtype)
        dz2, xb2 = dz.reshape(g.O, M), xb.reshape(g.O, M)
        pre_tasks = [(lambda tid, lo=lo, hi=hi: _bwd_pre(dz2[lo:hi], xb2[lo:hi], f1[lo:hi], bb[lo:hi], cc[lo:hi],
                                                         dy2[lo:hi])) for lo, hi in _ranges(g.O, _parts())]
    dy4 = dy2.reshape(g.O, g.N, g.ho, g.wo)
    # ---- weight gradient: partials (dw group, groups, K, og), transposed dW per conv group;
    # Winograd: (dw group, planes, O, C) products
    wm, planes, T = _wino_geom(g) if wino else (0, 0, 0)
    ng = len(p.dw_chunks) if wino else len(p.dw_groups)
    dwp = scratch("dwp", (ng, planes, g.O, g.C) if wino else (ng, g.groups, K, og), w.dtype) if need_dw else None
    has_bias = has_bias and need_dw
    dbp = np.zeros((g.N if wino else nt, g.O)) if has_bias else None    # per tile / chunk
    # ---- input gradient
    dx = np.empty((g.C, g.N, g.H, g.W), x.dtype) if need_dx else None
    dx2 = dx.reshape(g.C, -1) if need_dx else None
    sums = np.zeros((nt, 3, g.C)) if need_dx and nstat else None
    w2 = w.reshape(g.O, -1)
    wd = _mirror_weights(w, g) if need_dx and g.same and not wino else None
    ud = _wino_weights(w, g, pre_tasks, mirrored=True) if need_dx and wino else None
    if ud is None and pre_tasks:
        split(len(pre_tasks), lambda k, tid: pre_tasks[k](tid))
    d1w, d2w, d3w = _wino_dummies(x.dtype)
    d1, d4, d2 = dummies(x.dtype)
    C2 = (lambda t: d2 if t is None else t.reshape(g.C, -1))
    acc2, mk2, x12, x22 = C2(post.acc), C2(post.mk), C2(post.x1), C2(post.x2)
    ma, mb = _o(post.ma, d1), _o(post.mb, d1)
    token = object()
    wtasks = [(gg, kb) for gg in range(ng) for kb in range(len(p.kblocks))] if need_dw else []
    xtasks = [(i, cb) for i in range(nt) for cb in range(len(p.cblocks))] if need_dx else []
    dall = vdall = None
    if wino:      # transforms of dy that several tasks read: once, shared (phase 1)
        dall = _wbuf("wdy_all", g.O, g.N * T, x.dtype, planes) if need_dw and len(p.kblocks) > 1 else None
        vdall = (_wbuf("wvd_all", g.O, g.N * T, x.dtype, planes)
                 if need_dx and len(p.cblocks) > 1 else None)
        ors = _ranges(g.O, max(1, -(-_parts() // nt)))
        ptasks = ([("d", a, b, o) for c in p.dw_chunks for a, b in c for o in ors]
                  if dall is not None else [])
        ptasks += ([("v", a, b, o) for a, b in p.tiles for o in ors] if vdall is not None else [])

        def ptask(k, tid):
            kind, n0, n1, (o0, o1) = ptasks[k]
            if kind == "d":
                wg.wino_dy(dy2, dall, o0, n0 * T, n0, n1, o0, o1, g.H, g.W)
            else:
                wg.wino_input(dy2, d1w, d1w, d2w, d1w, d1w, d2w, vdall, o0, n0 * T, n0, n1, o0,
                              o1, g.H, g.W, False, 0, False, False)
        split(len(ptasks), ptask)

    def wdw_task(gg, kb):                      # Winograd weight gradient
        _, c_lo, c_hi = p.kblocks[kb]
        for ci, (n0, n1) in enumerate(p.dw_chunks[gg]):
            P = (n1 - n0) * T
            vx = _wino_in(x, g, n0, n1, c_lo, c_hi, pre, _wbuf("wvx", c_hi - c_lo, P, x.dtype, planes))
            if dall is None:
                D, b0 = _wbuf("wdy", g.O, P, x.dtype, planes), 0
                wg.wino_dy(dy2, D, 0, 0, n0, n1, 0, g.O, g.H, g.W)
            else:
                D, b0 = dall, n0 * T
            # Mw^T (O, block) = D (O, P) @ V^T: dW's rows o contiguous over c (wino_dw's stores)
            beta = 0.0 if ci == 0 else 1.0
            if wg.NT_GEMM and P >= wg.NT_MIN_K:
                wg.wino_gemms_nt(D, vx, dwp[gg], 0, g.O, P, c_hi - c_lo, b0, c_lo, beta)
            elif ci == 0 and wg.nn_fits(g.O, P, c_hi - c_lo):
                # few patches (the 4x4 layers' 128): V^T (P, block) in scratch, then the NN form
                vt = scratch("wvt", (planes, P, c_hi - c_lo), x.dtype)
                wg.transpose_planes(vx, vt, c_hi - c_lo, P)
                wg.wino_gemms_nn(D, vt, dwp[gg], 0, b0, 0, c_lo, g.O, P, c_hi - c_lo)
            else:
                wg.wino_gemms(SGEMM, D[:, :, b0:], vx, dwp[gg, :, :, c_lo:c_hi], 0, g.O, P, c_hi - c_lo, 0,
                              beta, True)
            if dbp is not None and c_lo == 0:
                _row_sums(dy2[:, n0 * hw:n1 * hw], dbp[n0])

    def wdx_task(i, cb):                       # Winograd input gradient
        _, c_lo, c_hi = p.cblocks[cb]
        n0, n1 = p.tiles[i]
        c0, c1 = p.cols(i)
        P = (n1 - n0) * T
        if vdall is None:
            vd, b0 = _wbuf("wvd", g.O, P, x.dtype, planes), 0
            wg.wino_input(dy2, d1w, d1w, d2w, d1w, d1w, d2w, vd, 0, 0, n0, n1, 0, g.O, g.H, g.W,
                          False, 0, False, False)
        else:
            vd, b0 = vdall, n0 * T
        Md = _wbuf("wmd", c_hi - c_lo, P, x.dtype, planes)
        if wm == 2:
            wg.wino_gemms_mirrored(SGEMM, ud, vd, Md, c_lo, c_hi - c_lo, g.O, P, b0)
        elif wg.nn_fits(c_hi - c_lo, g.O, P):           # F(4x4): Ud (36, C, O) as it is
            wg.wino_gemms_nn(ud, vd, Md, c_lo, 0, b0, 0, c_hi - c_lo, g.O, P)
        else:
            wg.wino_gemms(SGEMM, ud, vd, Md, c_lo, c_hi - c_lo, g.O, P, b0, 0.0, False)
        wg.wino_output(Md, c_hi - c_lo, dx2, n0, n1, c_lo, g.H, g.W)
        if not post_id:
            s1, s2a, s2b = ((sums[i, 0, c_lo:c_hi], sums[i, 1, c_lo:c_hi], sums[i, 2, c_lo:c_hi])
                            if sums is not None else (_D64, _D64, _D64))
            sl = (lambda a: a if a is d2 else a[c_lo:c_hi])
            _post_rows(dx2[c_lo:c_hi], c0, c1, sl(acc2), post.acc is not None, sl(mk2),
                       mask_mode, ma[c_lo:c_hi] if post.ma is not None else ma,
                       mb[c_lo:c_hi] if post.mb is not None else mb, sl(x12), sl(x22), nstat,
                       s1, s2a, s2b)

    def dw_task(gg, kb):
        gi, c_lo, c_hi = p.kblocks[kb]
        r0, r1 = (c_lo - gi * Cg) * kk, (c_hi - gi * Cg) * kk
        t0, t1 = p.dw_groups[gg]
        first_block = c_lo == gi * Cg
        for i in range(t0, t1):
            c0, c1 = p.cols(i)
            cols = _tile_cols(x, g, p, i, c_lo, c_hi, pre,
                              scratch("wcols", ((c_hi - c_lo) * (1 if g.direct else kk), c1 - c0),
                                      x.dtype))
            dyt = dy2[gi * og:(gi + 1) * og, c0:c1]
            gemm(cols, dyt.T, dwp[gg, gi, r0:r1], beta=0.0 if i == t0 else 1.0)
            if dbp is not None and first_block:
                _row_sums(dyt, dbp[i, gi * og:(gi + 1) * og])

    def dx_task(i, cb):
        gi, c_lo, c_hi = p.cblocks[cb]
        c0, c1 = p.cols(i)
        dyt = dy2[gi * og:(gi + 1) * og, c0:c1]
        cl, ch = c_lo - gi * Cg, c_hi - gi * Cg
        s1, s2a, s2b = ((sums[i, 0, c_lo:c_hi], sums[i, 1, c_lo:c_hi], sums[i, 2, c_lo:c_hi])
                        if sums is not None else (_D64, _D64, _D64))
        if g.direct or g.same:
            if g.direct:
                gemm(w2[gi * og:(gi + 1) * og, cl:ch].T, dyt, dx2[c_lo:c_hi, c0:c1])
            else:
                dc = _dy_cols(dy4, g, p, i, scratch("dcols", (g.O * kk, c1 - c0), x.dtype), token)
                _mm(wd[c_lo:c_hi], dc[gi * og * kk:(gi + 1) * og * kk], dx2[c_lo:c_hi, c0:c1])
            if not post_id:
                sl = (lambda a: a if a is d2 else a[c_lo:c_hi])
                _post_rows(dx2[c_lo:c_hi], c0, c1, sl(acc2), post.acc is not None, sl(mk2),
                           mask_mode, ma[c_lo:c_hi] if post.ma is not None else ma,
                           mb[c_lo:c_hi] if post.mb is not None else mb, sl(x12), sl(x22), nstat,
                           s1, s2a, s2b)
            return
        n0, n1 = p.tiles[i]
        ld = p.max_units * hw + 1                 # one zero column (the table's padding slot)
        dcols = scratch("dcols", ((c_hi - c_lo) * kk, ld), x.dtype)
        dcols[:, ld - 1] = 0
        gemm(w2[gi * og:(gi + 1) * og, cl * kk:ch * kk].T, dyt, dcols[:, :c1 - c0])
        sl = (lambda a: a if a is d2 else a[c_lo:c_hi])
        _col2im_post(dcols.reshape(-1), ld, dx2[c_lo:c_hi], n0, n1, g.H * g.W,
                     _col2im_table(g.key, p.max_units, ld), sl(acc2), post.acc is not None,
                     sl(mk2), mask_mode, ma[c_lo:c_hi] if post.ma is not None else ma,
                     mb[c_lo:c_hi] if post.mb is not None else mb, sl(x12), sl(x22), nstat,
                     s1, s2a, s2b)

    wt_fn, xt_fn = (wdw_task, wdx_task) if wino else (dw_task, dx_task)

    def task(k, tid):
        if k < len(wtasks):
            wt_fn(*wtasks[k])
        else:
            xt_fn(*xtasks[k - len(wtasks)])

    split(len(wtasks) + len(xtasks), task)
    dw = np.empty(w.shape, w.dtype) if need_dw else None
    if not need_dw:
        pass
    elif wino:
        dw4 = dw.reshape(g.O, g.C, 3, 3)
        rs = _ranges(g.O, _parts())
        split(len(rs), lambda k, tid: wg.wino_dw(dwp, dw4, *rs[k]))
    else:
        dw3 = dw.reshape(g.groups, og, K)
        rs = _ranges(K, _parts(), 16)
        split(g.groups * len(rs), lambda k, tid: _sum_transpose(dwp, dw3, k // len(rs),
                                                                *rs[k % len(rs)]))
    db = None
    if dbp is not None:
        db = np.zeros(g.O)
        _sum_rows(dbp, db)
        db = db.astype(w.dtype)
    if sums is not None:
        _sum_rows(sums[:, 0], post.s1)
        _sum_rows(sums[:, 1], post.s2a)
        _sum_rows(sums[:, 2], post.s2b)
    return dw, db, dx


# ============================================================================ transposed convolution

def transposed_geom(x_shape, w_shape, stride, padding, output_padding, dilation, groups) -> ConvGeom:
    """The conv of which a conv_transpose2d (x (N, C_in, H, W), w (C_in, C_out/groups, kh, kw)) is the input
    gradient: input (N, C_out, Ho, Wo), the transposed conv's output; weight w as it is (O = C_in); the same
    stride, padding and dilation. Ho = (H-1)s - pt - pb + d(kh-1) + output_padding + 1, so the conv's output
    is H again (output_padding < stride: the extra rows are read by no window)."""
    n, c, h, wd = x_shape
    ci, og, kh, kw = w_shape
    ho = conv_transpose_out_size(h, kh, stride[0], padding[0], padding[1], dilation[0], output_padding[0])
    wo = conv_transpose_out_size(wd, kw, stride[1], padding[2], padding[3], dilation[1], output_padding[1])
    g = ConvGeom((n, og * groups, ho, wo), w_shape, stride, padding, dilation, groups)
    if (g.ho, g.wo) != (h, wd):
        raise ValueError(f"transposed conv of {x_shape} with weight {w_shape}: the adjoint conv gives "
                         f"{g.ho}x{g.wo}, expected {h}x{wd}")
    return g


def conv_transpose_forward_cnhw(x, w, g: ConvGeom, bias=None):
    """Y (C_out, N, Ho, Wo) = conv_transpose2d(x (C_in, N, H, W), w): the input gradient of the conv g with
    x as its output gradient (conv_backward_cnhw, its weight-gradient tasks left out)."""
    shape = np.broadcast_to(np.zeros((), x.dtype), (g.C, g.N, g.H, g.W))    # (dtype and shape only)
    _, _, y = conv_backward_cnhw(x, shape, w, g, need_dw=False)
    if bias is not None:
        y += bias.astype(y.dtype).reshape(-1, 1, 1, 1)
    return y


def conv_transpose_backward_cnhw(dy, x, w, g: ConvGeom, need_dx=True, has_bias=False):
    """(dw, db, dx) of Y = conv_transpose2d(x, w) + b on CNHW: dx = conv g of dy (its forward), dw = g's
    weight gradient with dy as the input and x as the output gradient, db = dy summed per channel."""
    dx = conv_forward_cnhw(dy, w, g) if need_dx else None
    dw, _, _ = conv_backward_cnhw(x, dy, w, g, need_dx=False)
    db = dy.sum(axis=(1, 2, 3), dtype=np.float64).astype(w.dtype) if has_bias else None
    return dw, db, dx


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
