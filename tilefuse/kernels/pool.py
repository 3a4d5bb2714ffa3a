"""Fast pooling kernels (max, average, global average) on both layouts the compiler uses.
Numba (`nogil`, `cache=True`) next to the numpy reference (`kernels/reference.py`, the spec;
`tests/test_layer_kernels.py` checks each against it). Element-wise kernels are in
`elementwise.py`, linear and softmax in `dense.py`.

Every spatial kernel works on both layouts through one view:
  NCHW   (N, C, H, W)          viewed as (N, C, H, W, 1)      one channel per "block"
  NCHWc  (N, C/16, H, W, 16)   as is                         16 channels per block, the inner
                                                              loops run over the 16 lanes (a zmm)
so one numba function serves both (L = 1 or 16 lanes). Work is split into (image, channel
block) tasks on the shared thread pool (`kernels/threads.py`); every output element is computed
by the same code whatever the thread count, so results are identical for 1 and 2 threads.

Tolerances against the reference: max pool is exact (no arithmetic); average pools sum in
float32 in window order (the reference sums in float32 too, in numpy's order): <= 1e-6 relative.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .threads import parallel_for


def _blocks(x: np.ndarray, layout: str) -> np.ndarray:
    """(N, C, H, W) -> (N, C, H, W, 1) view; NCHWc (N, Cb, H, W, 16) unchanged."""
    if layout == "nchwc":
        if x.ndim != 5:
            raise ValueError(f"NCHWc tensor must be 5-D (N, C/16, H, W, 16), got shape {x.shape}")
        return x
    if x.ndim != 4:
        raise ValueError(f"NCHW tensor must be 4-D, got shape {x.shape}")
    return x.reshape(x.shape + (1,))


def _tasks(x5):
    return [(n, c) for n in range(x5.shape[0]) for c in range(x5.shape[1])]


# pooling ----------------------------------------------------------------------------------------

@njit(nogil=True, cache=True)
def _max_pool_plane(out, x, n, c, kh, kw, sh, sw, pt, pl, dh, dw):
    """out[n, c] (Ho, Wo, L) = max over the window; padding counts as -inf (PyTorch).
    The running maximum lives in a local array of L lanes (a register for L = 16)."""
    H, W, L = x.shape[2], x.shape[3], x.shape[4]
    Ho, Wo = out.shape[2], out.shape[3]
    acc = np.empty(L, x.dtype)
    for oh in range(Ho):
        for ow in range(Wo):
            for l in range(L):
                acc[l] = -np.inf
            for i in range(kh):
                h = oh * sh - pt + i * dh
                if h < 0 or h >= H:
                    continue
                for j in range(kw):
                    w = ow * sw - pl + j * dw
                    if w < 0 or w >= W:
                        continue
                    for l in range(L):
                        acc[l] = max(acc[l], x[n, c, h, w, l])
            for l in range(L):
                out[n, c, oh, ow, l] = acc[l]


@njit(nogil=True, cache=True)
def _max_pool_plane1(out, x, n, c, kh, kw, sh, sw, pt, pl, dh, dw):
    """NCHW (one lane): the same rule with a scalar running maximum."""
    H, W = x.shape[2], x.shape[3]
    Ho, Wo = out.shape[2], out.shape[3]
    for oh in range(Ho):
        for ow in range(Wo):
            m = -np.inf
            for i in range(kh):
                h = oh * sh - pt + i * dh
                if h < 0 or h >= H:
                    continue
                for j in range(kw):
                    w = ow * sw - pl + j * dw
                    if w < 0 or w >= W:
                        continue
                    m = max(m, x[n, c, h, w, 0])
            out[n, c, oh, ow, 0] = m


@njit(nogil=True, cache=True)
def _avg_pool_plane(out, x, n, c, kh, kw, sh, sw, pt, pb, pl, pr, include_pad):
    """out[n, c] = window sum / divisor; the divisor counts the padded area when include_pad
    (not the ceil-mode overhang beyond it), else only the positions inside the image."""
    H, W, L = x.shape[2], x.shape[3], x.shape[4]
    Ho, Wo = out.shape[2], out.shape[3]
    acc = np.empty(L, np.float32)
    for oh in range(Ho):
        h0 = oh * sh - pt
        for ow in range(Wo):
            w0 = ow * sw - pl
            if include_pad:
                ch = min(h0 + kh, H + pb) - max(h0, -pt)
                cw = min(w0 + kw, W + pr) - max(w0, -pl)
            else:
                ch = min(h0 + kh, H) - max(h0, 0)
                cw = min(w0 + kw, W) - max(w0, 0)
            inv = np.float32(1.0) / np.float32(ch * cw)
            for l in range(L):
                acc[l] = 0.0
            for i in range(kh):
                h = h0 + i
                if h < 0 or h >= H:
                    continue
                for j in range(kw):
                    w = w0 + j
                    if w < 0 or w >= W:
                        continue
                    for l in range(L):
                        acc[l] += x[n, c, h, w, l]
            for l in range(L):
                out[n, c, oh, ow, l] = acc[l] * inv


def max_pool(out, x, *, kernel_size, stride, padding=(0, 0, 0, 0), dilation=(1, 1), ceil_mode=False,
             layout="nchw", threads=None, **_):
    """Max pooling into `out` (shape from the IR: ceil_mode is already in it)."""
    x5, o5 = _blocks(x, layout), _blocks(out, layout)
    kh, kw = kernel_size
    f = _max_pool_plane1 if x5.shape[4] == 1 else _max_pool_plane
    parallel_for(lambda t: f(o5, x5, t[0], t[1], kh, kw, stride[0], stride[1], padding[0],
                                           padding[2], dilation[0], dilation[1]), _tasks(x5), threads)


def avg_pool(out, x, *, kernel_size, stride, padding=(0, 0, 0, 0), ceil_mode=False, count_include_pad=True,
             layout="nchw", threads=None, **_):
    x5, o5 = _blocks(x, layout), _blocks(out, layout)
    kh, kw = kernel_size
    t, b, l, r = padding
    parallel_for(lambda tk: _avg_pool_plane(o5, x5, tk[0], tk[1], kh, kw, stride[0], stride[1], t, b, l, r,
                                            count_include_pad), _tasks(x5), threads)


@njit(nogil=True, cache=True, fastmath=True)
def _gap_nchwc(out, x, n):
    """x (N, Cb, H, W, 16) -> out (N, C, 1, 1) NCHW: the mean over H*W, padded channels dropped."""
    Cb, H, W = x.shape[1], x.shape[2], x.shape[3]
    C = out.shape[1]
    inv = np.float32(1.0) / np.float32(H * W)
    acc = np.empty(16, np.float32)
    for cb in range(Cb):
        for l in range(16):
            acc[l] = 0.0
        for h in range(H):
            for w in range(W):
                for l in range(16):
                    acc[l] += x[n, cb, h, w, l]
        for l in range(min(16, C - cb * 16)):
            out[n, cb * 16 + l, 0, 0] = acc[l] * inv


def global_avg_pool(out, x, *, layout="nchw", threads=None, **_):
    """(N, C, H, W) or NCHWc -> (N, C, 1, 1) NCHW (the layout pass keeps the output NCHW)."""
    if layout == "nchwc":
        parallel_for(lambda n: _gap_nchwc(out, x, n), range(x.shape[0]), threads)
    else:
        out[...] = x.mean(axis=(2, 3), keepdims=True, dtype=np.float64 if x.dtype == np.float64 else np.float32)
