"""Training kernels: forward and backward of every op the trainer runs.

Internal layout is CNHW ("channel-major"): a 4-D activation of logical shape (N, C, H, W) is
stored as (C, N, H, W), so a per-channel reduction (batch-norm statistics) walks one
contiguous row, and a convolution is one GEMM per column tile,
``Y (O, N*Ho*Wo) = W (O, C*kh*kw) @ cols (C*kh*kw, N*Ho*Wo)``, with no transposes; a 1x1
stride-1 convolution needs no im2col at all. 2-D activations (N, F) keep their layout.

Three kinds of functions live here:

* numba loops (``nogil``, ``cache``, parallel over channels) that carry the fused pre- and
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
from numba import prange

from ..kernels.reference import conv_out_size, pool_out_size

_JIT = dict(nogil=True, cache=True, parallel=True)

_DUMMY: dict = {}


def dummies(dtype):
    """Placeholder arrays for unused optional kernel arguments (numba needs fixed types)."""
    dt = np.dtype(dtype)
    if dt not in _DUMMY:
        _DUMMY[dt] = (np.zeros(1, dt), np.zeros((1, 1, 1, 1), dt))
    return _DUMMY[dt]


_D64 = np.zeros(1, np.float64)


# ============================================================================ numba loops

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
    for c in prange(C):
        plane = np.empty((H, W), x.dtype)
        for n in range(n0, n1):
            for i in range(H):
                for j in range(W):
                    v = x[c, n, i, j]
                    if affine:
                        v = a[c] * v + b[c]
                    if skind == 1:
                        v += s[c, n, i, j]
                    elif skind == 2:
                        v += a2[c] * s[c, n, i, j] + b2[c]
                    if relu and v < 0:
                        v = 0
                    plane[i, j] = v
                    if write_r:
                        r_out[c, n, i, j] = v
            base = (n - n0) * hw_o
            for ki in range(kh):
                for kj in range(kw):
                    row = c * kk + ki * kw + kj
                    for oh in range(ho):
                        ih = oh * sh - pt + ki * dh
                        col = base + oh * wo
                        if ih < 0 or ih >= H:
                            for ow in range(wo):
                                cols[row, col + ow] = 0
                            continue
                        for ow in range(wo):
                            iw = ow * sw - pl + kj * dw
                            if iw >= 0 and iw < W:
                                cols[row, col + ow] = plane[ih, iw]
                            else:
                                cols[row, col + ow] = 0


@nb.njit(**_JIT)
def _col2im_post(dcols, dx, n0, n1, kh, kw, sh, sw, pt, pl, dh, dw, ho, wo,
                 acc, has_acc, mk, mask_mode, ma, mb, x1, x2, nstat, s1, s2a, s2b):
    """dx[c, n] = post(sum of the dcols entries that land on (c, n, ih, iw)).

    dcols: (C*kh*kw, (n1 - n0)*ho*wo); dx: (C, N, H, W). Post-processing, in this order:
        v += acc[c, n, ih, iw]              if has_acc (the error Add at a fork)
        v *= (mk > 0) or (ma*mk + mb > 0)   if mask_mode == 1 or 2 (ReLU')
        s1[c] += v, s2a[c] += v*x1, s2b[c] += v*x2   for nstat >= 1, >= 1, == 2 (BN step 1)
    """
    C, N, H, W = dx.shape
    kk = kh * kw
    hw_o = ho * wo
    for c in prange(C):
        plane = np.empty((H, W), dx.dtype)
        t1 = 0.0
        t2 = 0.0
        t3 = 0.0
        for n in range(n0, n1):
            plane[:, :] = 0
            base = (n - n0) * hw_o
            for ki in range(kh):
                for kj in range(kw):
                    row = c * kk + ki * kw + kj
                    for oh in range(ho):
                        ih = oh * sh - pt + ki * dh
                        if ih < 0 or ih >= H:
                            continue
                        col = base + oh * wo
                        for ow in range(wo):
                            iw = ow * sw - pl + kj * dw
                            if iw >= 0 and iw < W:
                                plane[ih, iw] += dcols[row, col + ow]
            for i in range(H):
                for j in range(W):
                    v = plane[i, j]
                    if has_acc:
                        v += acc[c, n, i, j]
                    if mask_mode == 1:
                        if not mk[c, n, i, j] > 0:
                            v = 0
                    elif mask_mode == 2:
                        if not ma[c] * mk[c, n, i, j] + mb[c] > 0:
                            v = 0
                    dx[c, n, i, j] = v
                    if nstat >= 1:
                        t1 += v
                        t2 += v * x1[c, n, i, j]
                    if nstat == 2:
                        t3 += v * x2[c, n, i, j]
        s1[c] += t1
        s2a[c] += t2
        s2b[c] += t3


@nb.njit(**_JIT)
def _epilogue(y2, c0, c1, bias, has_bias, stats, s, ss):
    """In place on the column tile y2[:, c0:c1]: add bias; accumulate per-row sum and sum of
    squares (BN step 1 of the consuming batch norm)."""
    O = y2.shape[0]
    for o in prange(O):
        t = 0.0
        tt = 0.0
        for k in range(c0, c1):
            v = y2[o, k]
            if has_bias:
                v += bias[o]
                y2[o, k] = v
            if stats:
                t += v
                tt += v * v
        s[o] += t
        ss[o] += tt


@nb.njit(**_JIT)
def _bwd_pre(dz, x, f1, bb, cc, out, c0, c1):
    """out[:, k - c0] = F1*dz[:, k] + B*x[:, k] + C over the column tile (BN step 2 backward).

    dz, x: (O, M) views; out: (O, c1 - c0) contiguous."""
    O = dz.shape[0]
    for o in prange(O):
        for k in range(c0, c1):
            out[o, k - c0] = f1[o] * dz[o, k] + bb[o] * x[o, k] + cc[o]


# ----------------------------------------------------------------- unfused memory-bound passes

@nb.njit(**_JIT)
def _row_sums(x2, s, ss):
    """s[c] = sum(x[c]), ss[c] = sum(x[c]^2) over rows of a (C, L) array."""
    C, L = x2.shape
    for c in prange(C):
        t = 0.0
        tt = 0.0
        for k in range(L):
            v = x2[c, k]
            t += v
            tt += v * v
        s[c] = t
        ss[c] = tt


@nb.njit(**_JIT)
def _row_affine(x2, a, b, out):
    C, L = x2.shape
    for c in prange(C):
        for k in range(L):
            out[c, k] = a[c] * x2[c, k] + b[c]


@nb.njit(**_JIT)
def _row_dot_sums(dy, x, s1, s2):
    """s1[c] = sum(dy[c]), s2[c] = sum(dy[c]*x[c])."""
    C, L = dy.shape
    for c in prange(C):
        t = 0.0
        tt = 0.0
        for k in range(L):
            v = dy[c, k]
            t += v
            tt += v * x[c, k]
        s1[c] = t
        s2[c] = tt


@nb.njit(**_JIT)
def _row_bn_bwd(dy, x, f1, bb, cc, out):
    C, L = dy.shape
    for c in prange(C):
        for k in range(L):
            out[c, k] = f1[c] * dy[c, k] + bb[c] * x[c, k] + cc[c]


@nb.njit(**_JIT)
def _relu(x1, out):
    for k in prange(x1.shape[0]):
        v = x1[k]
        out[k] = v if v > 0 else 0


@nb.njit(**_JIT)
def _relu_bwd(dy, x, out):
    for k in prange(dy.shape[0]):
        out[k] = dy[k] if x[k] > 0 else 0


@nb.njit(**_JIT)
def _add(a, b, out):
    for k in prange(a.shape[0]):
        out[k] = a[k] + b[k]


# ----------------------------------------------------------------- pooling (per (c, n) plane)

@nb.njit(**_JIT)
def _max_pool_fwd(x, y, idx, kh, kw, sh, sw, pt, pl, dh, dw):
    P, H, W = x.shape
    _, ho, wo = y.shape
    for p in prange(P):
        for oh in range(ho):
            for ow in range(wo):
                best = -np.inf
                bi = -1
                for ki in range(kh):
                    ih = oh * sh - pt + ki * dh
                    if ih < 0 or ih >= H:
                        continue
                    for kj in range(kw):
                        iw = ow * sw - pl + kj * dw
                        if iw < 0 or iw >= W:
                            continue
                        v = x[p, ih, iw]
                        if v > best or bi < 0 or np.isnan(v):
                            best = v
                            bi = ih * W + iw
                y[p, oh, ow] = best
                idx[p, oh, ow] = bi


@nb.njit(**_JIT)
def _max_pool_bwd(dy, idx, dx):
    P, ho, wo = dy.shape
    W = dx.shape[2]
    for p in prange(P):
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
    for p in prange(P):
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

class ConvGeom:
    """Static geometry of one conv2d op (IR-normalized params) on CNHW tensors."""

    __slots__ = ("C", "N", "H", "W", "O", "kh", "kw", "sh", "sw", "pt", "pb", "pl", "pr",
                 "dh", "dw", "groups", "ho", "wo", "direct", "K")

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
                       and padding == (0, 0, 0, 0))

    def args(self):
        return (self.kh, self.kw, self.sh, self.sw, self.pt, self.pl, self.dh, self.dw,
                self.ho, self.wo)

    def tiles(self, target_bytes=6 << 20, itemsize=4):
        """Image ranges [n0, n1) whose im2col buffer is about target_bytes (>= 1 image)."""
        per_image = self.C * self.kh * self.kw * self.ho * self.wo * itemsize
        nb_ = max(1, min(self.N, target_bytes // max(per_image, 1)))
        return [(n0, min(self.N, n0 + nb_)) for n0 in range(0, self.N, nb_)]


class Pre:
    """Input-stage transform of a fused conv (see _im2col_pre); all None = identity."""

    __slots__ = ("a", "b", "s", "a2", "b2", "relu", "r_out")

    def __init__(self, a=None, b=None, s=None, a2=None, b2=None, relu=False, r_out=None):
        self.a, self.b, self.s, self.a2, self.b2 = a, b, s, a2, b2
        self.relu, self.r_out = relu, r_out

    @property
    def identity(self):
        return self.a is None and self.s is None and not self.relu and self.r_out is None


IDENTITY = Pre()


def im2col(x, g: ConvGeom, n0, n1, pre: Pre = IDENTITY, out=None):
    """(C, N, H, W) -> cols (C*kh*kw, (n1-n0)*ho*wo) of the transformed input (see Pre)."""
    m = (n1 - n0) * g.ho * g.wo
    if g.direct and pre.identity:
        return x[:, n0:n1].reshape(x.shape[0], m)  # (C, nb, H, W) -> (C, nb*H*W), no copy
    d1, d4 = dummies(x.dtype)
    cols = out if out is not None else np.empty((x.shape[0] * g.kh * g.kw, m), x.dtype)
    _im2col_pre(x, _o(pre.a, d1), _o(pre.b, d1), _o(pre.s, d4), _o(pre.a2, d1), _o(pre.b2, d1),
                _o(pre.r_out, d4), cols, n0, n1, *g.args(),
                pre.a is not None, 0 if pre.s is None else (2 if pre.a2 is not None else 1),
                pre.relu, pre.r_out is not None)
    return cols


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


def col2im(dcols, dx, g: ConvGeom, n0, n1, post: Post | None = None):
    """Scatter-add dcols into dx[:, n0:n1] (CNHW), then post-process (see Post)."""
    post = post or Post()
    d1, d4 = dummies(dx.dtype)
    mask_mode = 0 if post.mk is None else (2 if post.ma is not None else 1)
    nstat = 0 if post.x1 is None else (2 if post.x2 is not None else 1)
    _col2im_post(dcols, dx, n0, n1, *g.args(), _o(post.acc, d4), post.acc is not None,
                 _o(post.mk, d4), mask_mode, _o(post.ma, d1), _o(post.mb, d1),
                 _o(post.x1, d4), _o(post.x2, d4), nstat, post.s1, post.s2a, post.s2b)


def _o(a, dummy):
    return dummy if a is None else a


def epilogue(y2, c0, c1, bias=None, stats=None):
    """Bias add and BN step-1 sums on a GEMM output column tile; stats = (s, ss) float64."""
    d1, _ = dummies(y2.dtype)
    s, ss = stats if stats is not None else (_D64, _D64)
    if bias is None and stats is None:
        return
    _epilogue(y2, c0, c1, _o(bias, d1), bias is not None, stats is not None, s, ss)


def bwd_pre(dz2, x2, f1, bb, cc, c0, c1, out=None):
    out = out if out is not None else np.empty((dz2.shape[0], c1 - c0), dz2.dtype)
    _bwd_pre(dz2, x2, f1, bb, cc, out, c0, c1)
    return out


def conv_forward_cnhw(x, w, g: ConvGeom, bias=None, pre: Pre = IDENTITY, stats=None,
                      out=None, tiles=None):
    """Y (O, N, Ho, Wo) = conv(t(x), w) [+ bias], BN step-1 sums into stats, tile by tile."""
    y = out if out is not None else np.empty((g.O, g.N, g.ho, g.wo), x.dtype)
    y2 = y.reshape(g.O, -1)
    og = g.O // g.groups
    w2 = w.reshape(g.O, -1)                         # (O, Cg*kh*kw)
    hw = g.ho * g.wo
    for n0, n1 in tiles or g.tiles(itemsize=x.dtype.itemsize):
        cols = im2col(x, g, n0, n1, pre)
        c0, c1 = n0 * hw, n1 * hw
        for gi in range(g.groups):
            np.matmul(w2[gi * og:(gi + 1) * og], cols[gi * g.K:(gi + 1) * g.K],
                      out=y2[gi * og:(gi + 1) * og, c0:c1])
        epilogue(y2, c0, c1, bias, stats)
    return y


def conv_backward_cnhw(dy, x, w, g: ConvGeom, pre: Pre = IDENTITY, post: Post | None = None,
                       dy_pre=None, need_dx=True, has_bias=False, tiles=None):
    """Weight, bias and input gradients of Y = conv(t(x), w), tile by tile.

    dy: (O, N, Ho, Wo) output gradient, or with dy_pre=(dz, xb, F1, B, C) the output gradient
    is computed per tile as F1*dz + B*xb + C (the consumer-side BN step 2 backward).
    Returns (dw, db, dx); dx is CNHW and post-processed by `post`.
    """
    og = g.O // g.groups
    hw = g.ho * g.wo
    w2 = w.reshape(g.O, -1)
    dw = np.zeros_like(w2)
    db = np.zeros(g.O, np.float64) if has_bias else None
    dx = np.empty((g.C, g.N, g.H, g.W), x.dtype) if need_dx else None
    src = dy if dy_pre is None else dy_pre[0]
    src2 = src.reshape(g.O, -1)
    if dy_pre is not None:
        xb2 = dy_pre[1].reshape(g.O, -1)
    tmp = np.empty((og, g.K), w.dtype)
    direct_dx = g.direct and (post is None or post.identity) and g.groups == 1
    for n0, n1 in tiles or g.tiles(itemsize=x.dtype.itemsize):
        c0, c1 = n0 * hw, n1 * hw
        if dy_pre is None:
            dyt = src2[:, c0:c1]
        else:
            dyt = bwd_pre(src2, xb2, dy_pre[2], dy_pre[3], dy_pre[4], c0, c1)
        if has_bias:
            db += dyt.sum(axis=1, dtype=np.float64)
        cols = im2col(x, g, n0, n1, pre)
        for gi in range(g.groups):
            np.matmul(dyt[gi * og:(gi + 1) * og], cols[gi * g.K:(gi + 1) * g.K].T, out=tmp)
            dw[gi * og:(gi + 1) * og] += tmp
        if not need_dx:
            continue
        if direct_dx:
            np.matmul(w2.T, dyt, out=dx.reshape(g.C, -1)[:, c0:c1])
            continue
        dcols = np.empty((g.C * g.kh * g.kw, c1 - c0), x.dtype)
        for gi in range(g.groups):
            np.matmul(w2[gi * og:(gi + 1) * og].T, dyt[gi * og:(gi + 1) * og],
                      out=dcols[gi * g.K:(gi + 1) * g.K])
        col2im(dcols, dx, g, n0, n1, post)
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


def bn_stats(x):
    r = rows(x)
    s = np.empty(r.shape[0])
    ss = np.empty(r.shape[0])
    _row_sums(r, s, ss)
    return s, ss, r.shape[1]


def bn_apply(x, f1, f2):
    r = rows(x)
    out = np.empty_like(r)
    _row_affine(r, f1, f2, out)
    return unrows(out, x)


def bn_bwd_sums(dy, x):
    r, xr = rows(dy), rows(x)
    s1 = np.empty(r.shape[0])
    s2 = np.empty(r.shape[0])
    _row_dot_sums(r, xr, s1, s2)
    return s1, s2


def bn_bwd_apply(dy, x, f1, bb, cc):
    r, xr = rows(dy), rows(x)
    out = np.empty_like(r)
    _row_bn_bwd(r, xr, f1, bb, cc, out)
    return unrows(out, dy)


def relu(x):
    out = np.empty_like(x)
    _relu(x.reshape(-1), out.reshape(-1))
    return out


def relu_backward(dy, x):
    out = np.empty_like(dy)
    _relu_bwd(dy.reshape(-1), x.reshape(-1), out.reshape(-1))
    return out


def add(a, b):
    out = np.empty_like(a)
    _add(a.reshape(-1), b.reshape(-1), out.reshape(-1))
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
    _max_pool_fwd(_planes(x), _planes(y), _planes(idx), kernel_size[0], kernel_size[1],
                  stride[0], stride[1], padding[0], padding[2], dilation[0], dilation[1])
    return y, idx


def max_pool_backward(dy, idx, x_shape):
    dx = np.empty(x_shape, dy.dtype)
    _max_pool_bwd(_planes(dy), _planes(idx), _planes(dx))
    return dx


def avg_pool_forward(x, kernel_size, stride, padding, ceil_mode, count_include_pad):
    C, N, H, W = x.shape
    ho = pool_out_size(H, kernel_size[0], stride[0], padding[0], padding[1], ceil_mode)
    wo = pool_out_size(W, kernel_size[1], stride[1], padding[2], padding[3], ceil_mode)
    y = np.empty((C, N, ho, wo), x.dtype)
    _avg_pool(_planes(x), _planes(y), _planes(y), _planes(x), False, kernel_size[0], kernel_size[1],
              stride[0], stride[1], padding[0], padding[1], padding[2], padding[3], count_include_pad)
    return y


def avg_pool_backward(dy, x_shape, kernel_size, stride, padding, count_include_pad):
    dx = np.empty(x_shape, dy.dtype)
    _avg_pool(_planes(dx), _planes(dy), _planes(dy), _planes(dx), True, kernel_size[0], kernel_size[1],
              stride[0], stride[1], padding[0], padding[1], padding[2], padding[3], count_include_pad)
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
