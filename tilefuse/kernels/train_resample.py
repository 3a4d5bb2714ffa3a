"""Backward of the separable resamplers for the training schedule: resize (nearest / linear / cubic, every
coordinate mode of kernels/reference.py) and adaptive average pooling to any size.

Each of them is, along H and along W, a 1-D linear operator given by taps:

    out[o] = sum_k w[o, k] * in[idx[o, k]]          idx, w: (out, taps)

with every column idx[:, k] nondecreasing in o (the source coordinate grows with o; its floor, ceiling and
rounding, and the clamp to [0, in - 1], keep the order). Its adjoint sends dy[o] * w[o, k] back to idx[o, k]:
with the indices sorted, one np.add.reduceat over the runs of equal indices a tap, then one indexed add of
the run sums, whose indices are distinct (no np.add.at). The backward applies the W operator's adjoint, then
the H operator's, in float64 (the forward's accumulation type), and returns the gradient's dtype.

The taps come from the reference's own per-axis tables (`resize_nearest_index`, `resize_linear_weights`,
`resize_cubic_weights`, `adaptive_windows`), so the backward is the adjoint of exactly the forward the
reference evaluator computes. Arrays are (A, B, H, W) with any two leading axes: the schedule's CNHW
activations resample on axes 2 and 3 as NCHW ones do.
"""
from __future__ import annotations

import numpy as np

from . import reference as ref


def resize_taps(size_in: int, size_out: int, scale, mode: str, coord: str, nearest_mode: str = "floor",
                arith: str = "aten", cubic_a: float = -0.75, cubic_exclude: bool = False):
    """(idx, w), each (size_out, taps): one axis of ref.resize."""
    if mode == "nearest":
        i = ref.resize_nearest_index(size_in, size_out, scale, coord, nearest_mode, arith)
        return i[:, None], np.ones((size_out, 1))
    if mode == "cubic":
        idx, w = ref.resize_cubic_weights(size_in, size_out, scale, coord, cubic_a, arith, cubic_exclude)
        return idx, w.astype(np.float64)
    i0, i1, lam = ref.resize_linear_weights(size_in, size_out, scale, coord, arith)
    lam = lam.astype(np.float64)
    return np.stack([i0, i1], axis=1), np.stack([1 - lam, lam], axis=1)


def adaptive_taps(size_in: int, size_out: int):
    """(idx, w): one axis of ref.adaptive_avg_pool; window o is [lo, hi), weights 1 / (hi - lo), the taps past
    a short window's end weigh 0 (on its last index, which keeps the columns nondecreasing)."""
    lo, hi = ref.adaptive_windows(size_in, size_out)
    taps = int((hi - lo).max()) if size_out else 1
    k = np.arange(taps)
    idx = np.minimum(lo[:, None] + k, hi[:, None] - 1).astype(np.int64)
    w = np.where(lo[:, None] + k < hi[:, None], 1.0 / (hi - lo)[:, None], 0.0)
    return idx, w


def _adjoint_axis(dy: np.ndarray, taps, axis: int, size_in: int) -> np.ndarray:
    """The adjoint of one axis' operator: (.., out, ..) -> (.., size_in, ..) along `axis`, float64."""
    idx, w = taps
    shape = list(dy.shape)
    shape[axis] = size_in
    dx = np.zeros(shape)
    if dy.shape[axis] == 0:
        return dx
    wshape = [1] * dy.ndim
    wshape[axis] = -1
    for k in range(idx.shape[1]):
        col = idx[:, k]
        starts = np.flatnonzero(np.r_[True, col[1:] != col[:-1]])     # the runs of one source index
        runs = np.add.reduceat(dy * w[:, k].reshape(wshape), starts, axis=axis)
        cut = [slice(None)] * dy.ndim
        cut[axis] = col[starts]                                          # distinct: a plain indexed add
        dx[tuple(cut)] += runs
    return dx


def separable_backward(dy: np.ndarray, taps_h, taps_w, in_hw) -> np.ndarray:
    """dx (A, B, H, W) of y = (H operator) x (W operator)^T, from dy (A, B, Ho, Wo)."""
    d = _adjoint_axis(dy.astype(np.float64), taps_w, 3, in_hw[1])     # (A, B, Ho, W)
    return _adjoint_axis(d, taps_h, 2, in_hw[0]).astype(dy.dtype)    # (A, B, H, W)


def resize_backward(dy: np.ndarray, in_hw, size, scales=None, mode="nearest", coord="asymmetric",
                    nearest_mode="floor", arith="aten", cubic_a=-0.75, cubic_exclude=False) -> np.ndarray:
    """Gradient of ref.resize(x, size, ...) w.r.t. x (A, B, H, W), in_hw = (H, W)."""
    sh, sw = scales if scales else (None, None)
    th = resize_taps(in_hw[0], size[0], sh, mode, coord, nearest_mode, arith, cubic_a, cubic_exclude)
    tw = resize_taps(in_hw[1], size[1], sw, mode, coord, nearest_mode, arith, cubic_a, cubic_exclude)
    return separable_backward(dy, th, tw, in_hw)


def adaptive_avg_pool_backward(dy: np.ndarray, in_hw, output_size) -> np.ndarray:
    """Gradient of ref.adaptive_avg_pool(x, output_size) w.r.t. x (A, B, H, W)."""
    return separable_backward(dy, adaptive_taps(in_hw[0], output_size[0]),
                              adaptive_taps(in_hw[1], output_size[1]), in_hw)


def adaptive_max_pool_backward(dy: np.ndarray, x: np.ndarray, output_size) -> np.ndarray:
    """Gradient of ref.adaptive_max_pool(x, output_size) w.r.t. x (A, B, H, W): each window's dy to its maximum,
    the first in row-major order at ties and a NaN before any number (PyTorch's adaptive_max_pool2d, which
    takes a value when it is greater or NaN); overlapping windows add up. A window a loop: the output is small
    (SPP's bins)."""
    a, b, h, w = x.shape
    dx = np.zeros((a * b, h * w))
    x2, dy2 = x.reshape(a * b, h, w), dy.reshape(a * b, output_size[0], output_size[1])
    rows = np.arange(a * b)
    (h0, h1), (w0, w1) = ref.adaptive_windows(h, output_size[0]), ref.adaptive_windows(w, output_size[1])
    for i in range(output_size[0]):
        for j in range(output_size[1]):
            win = x2[:, h0[i]:h1[i], w0[j]:w1[j]].reshape(a * b, -1)
            k = np.argmax(win, axis=1)           # (numpy: the first maximum, a NaN first of all)
            ww = w1[j] - w0[j]
            dx[rows, (h0[i] + k // ww) * w + w0[j] + k % ww] += dy2[:, i, j]
    return dx.reshape(a, b, h, w).astype(dy.dtype)
