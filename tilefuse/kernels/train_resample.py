"""Backward of the resamplers for the training schedule: resize (nearest / linear / cubic, every coordinate
mode of kernels/reference.py), adaptive average pooling to any size, and grid_sample (`grid_sample_backward`:
the input's and the grid's gradient, at the end of this file).

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


def _unnormalize_grad(g: np.ndarray, size: int, padding_mode: str, align_corners: bool):
    """(c, dc/dg) of ref.grid_unnormalize in float64, with ATen's CPU (vectorized) derivative conventions: a
    clip passes the gradient where its input is strictly inside (0, size - 1) (0 at the ends, as PyTorch's); a reflection
    multiplies it by -1 on a mirrored stretch (and on the negative side of the low edge); one pixel reflected
    with align_corners has none."""
    scale = (size - 1) / 2 if align_corners else size / 2
    with np.errstate(invalid="ignore", over="ignore"):
        c = (g + 1.0) * scale - (0.0 if align_corners else 0.5)
        d = np.full(g.shape, scale)
        if padding_mode == "reflection":
            lo, span = (0.0, size - 1.0) if align_corners else (-0.5, float(size))
            if span == 0.0:
                return np.zeros_like(c), np.zeros_like(c)
            a = c - lo
            neg = a < 0
            a = np.abs(a)
            extra = a - np.floor(a / (2 * span)) * (2 * span)
            flip = extra > span
            c = np.where(flip, 2 * span - extra, extra) + lo
            d = np.where(flip != neg, -d, d)
        if padding_mode in ("border", "reflection"):
            inside = (c > 0) & (c < size - 1)
            d = np.where(inside, d, 0.0)
            c = np.where(np.isnan(c), 0.0, np.clip(c, 0.0, size - 1.0))
    return c, d


def grid_sample_backward(dy: np.ndarray, x: np.ndarray, grid: np.ndarray, mode: str = "bilinear",
                         padding_mode: str = "zeros", align_corners: bool = False):
    """(dx, dgrid) of ref.grid_sample: x (N, C, H, W), grid (N, Ho, Wo, 2), dy (N, C, Ho, Wo), in float64, returned
    in dy's dtype.

    dx: each output value's gradient times its bilinear weight (nearest: 1) back to the pixels it read; a corner
    outside the image (zeros padding) read 0 and gets nothing. dgrid (bilinear; nearest's is 0, as PyTorch's):
    d out / d ix = (1 - ty)(ne - nw) + ty (se - sw) and d out / d iy = (1 - tx)(sw - nw) + tx (se - ne), summed
    over the channels with dy, times d ix / d gx (`_unnormalize_grad`: the scale, a clip's 0 outside, a
    reflection's sign). The positions are scattered with one np.add.at per corner over (N * H * W, C) rows."""
    n, c, h, w = x.shape
    ho, wo = grid.shape[1:3]
    xs = np.ascontiguousarray(x.astype(np.float64).transpose(0, 2, 3, 1)).reshape(n * h * w, c)   # (N*H*W, C)
    g = grid.astype(np.float64)
    d = np.ascontiguousarray(dy.astype(np.float64).transpose(0, 2, 3, 1)).reshape(-1, c)          # (N*Ho*Wo, C)
    ix, dix = _unnormalize_grad(g[..., 0], w, padding_mode, align_corners)                        # (N, Ho, Wo)
    iy, diy = _unnormalize_grad(g[..., 1], h, padding_mode, align_corners)
    base = (np.arange(n) * (h * w))[:, None, None]
    dx = np.zeros((n * h * w, c))
    dgrid = np.zeros(grid.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        if mode == "nearest":
            corners = [(np.rint(iy), np.rint(ix), None, None, None)]
        else:
            x0, y0 = np.floor(ix), np.floor(iy)
            tx, ty = ix - x0, iy - y0
            # (row, column, weight, d weight / d ix, d weight / d iy) of nw, ne, sw, se
            corners = [(y0, x0, (1 - tx) * (1 - ty), -(1 - ty), -(1 - tx)),
                       (y0, x0 + 1, tx * (1 - ty), 1 - ty, -tx),
                       (y0 + 1, x0, (1 - tx) * ty, -ty, 1 - tx),
                       (y0 + 1, x0 + 1, tx * ty, ty, tx)]
        for yy, xx, wt, wx, wy in corners:
            ok = np.isfinite(yy) & np.isfinite(xx) & (xx >= 0) & (xx < w) & (yy >= 0) & (yy < h)
            row = (base + np.where(ok, yy, 0).astype(np.int64) * w + np.where(ok, xx, 0).astype(np.int64))[ok]
            dsel = d[ok.reshape(-1)]                                                                 # (k, C)
            np.add.at(dx, row, dsel if wt is None else dsel * wt[ok][:, None])
            if wt is not None:
                gv = np.zeros(ok.shape)
                gv[ok] = (dsel * xs[row]).sum(axis=1)            # sum_c dy * value at this corner
                dgrid[..., 0] += gv * wx
                dgrid[..., 1] += gv * wy
    dgrid[..., 0] *= dix
    dgrid[..., 1] *= diy
    dt = dy.dtype
    return (np.ascontiguousarray(dx.reshape(n, h, w, c).transpose(0, 3, 1, 2)).astype(dt),
            dgrid.astype(dt))
