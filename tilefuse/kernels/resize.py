"""Resize runtime kernel: nearest, bilinear and bicubic over H and W, NCHW and NCHW16c; grid_sample (NCHW).

The source indices and weights per output row / column come from the reference
(`ref.resize_nearest_index`, `ref.resize_linear_weights`, `ref.resize_cubic_weights`: float32 arithmetic as
ATen computes them), so the kernels pick exactly the reference's pixels; bilinear blends in float32 in the
reference's order (top row, bottom row, then vertically): within 1e-6 relative; bicubic sums each of the 4
rows' 4 columns, then the rows (the reference's order, per output instead of per plane).
One numba loop serves both layouts through a 5-D view ((N, C, H, W, 1) or the blocked tensor);
tasks are (image, channel block) planes.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from . import reference as ref
from .broadcast import _zero_pad_lanes
from .threads import parallel_for


def _view5(x, layout):
    return x if layout == "nchwc" else x.reshape(x.shape + (1,))


@njit(nogil=True, cache=True)
def _nearest_plane(out, x, n, c, ih, iw):
    L = x.shape[4]
    for oh in range(out.shape[2]):
        h = ih[oh]
        for ow in range(out.shape[3]):
            w = iw[ow]
            for l in range(L):
                out[n, c, oh, ow, l] = x[n, c, h, w, l]


@njit(nogil=True, cache=True)
def _bilinear_plane(out, x, n, c, h0, h1, lh, w0, w1, lw):
    L = x.shape[4]
    one = np.float32(1.0)
    for oh in range(out.shape[2]):
        a, b, t = h0[oh], h1[oh], lh[oh]
        for ow in range(out.shape[3]):
            p, q, u = w0[ow], w1[ow], lw[ow]
            for l in range(L):
                top = x[n, c, a, p, l] * (one - u) + x[n, c, a, q, l] * u
                bot = x[n, c, b, p, l] * (one - u) + x[n, c, b, q, l] * u
                out[n, c, oh, ow, l] = top * (one - t) + bot * t


@njit(nogil=True, cache=True)
def _bicubic_plane(out, x, n, c, ih, wh, iw, ww):
    """ih, wh (Ho, 4): each output row's 4 source rows and weights; iw, ww (Wo, 4) the columns'."""
    L = x.shape[4]
    for oh in range(out.shape[2]):
        for ow in range(out.shape[3]):
            for l in range(L):
                acc = np.float32(0.0)
                for j in range(4):
                    r = ih[oh, j]
                    t = np.float32(0.0)
                    for i in range(4):
                        t += x[n, c, r, iw[ow, i], l] * ww[ow, i]
                    acc += t * wh[oh, j]
                out[n, c, oh, ow, l] = acc


def resize(out, x, *, size, scales=None, mode="nearest", coord="asymmetric", nearest_mode="floor",
           layout="nchw", channels=None, threads=None, band=None, arith="aten", cubic_a=-0.75, cubic_exclude=False,
           **_):
    """band=(r0, lo, H): out holds output rows [r0, r0 + out.shape[2]) and x input rows
    [lo, lo + x.shape[2]) of an input of height H (the stream mode's row bands)."""
    h, w = x.shape[2], x.shape[3]
    r0, lo = 0, 0
    if band is not None:
        r0, lo, h = band
    r1 = r0 + out.shape[2]
    sh, sw = scales if scales else (None, None)
    if layout != "nchwc" and out.dtype != np.float32:
        out[...] = ref.resize(x, tuple(size), scales, mode, coord, nearest_mode,
                              band=None if band is None else (r0, r1, lo, h), arith=arith, cubic_a=cubic_a,
                              cubic_exclude=cubic_exclude)
        return
    x5, o5 = _view5(x, layout), _view5(out, layout)
    tasks = [(n, c) for n in range(x5.shape[0]) for c in range(x5.shape[1])]
    if mode == "nearest":
        ih = ref.resize_nearest_index(h, size[0], sh, coord, nearest_mode, arith)[r0:r1] - lo
        iw = ref.resize_nearest_index(w, size[1], sw, coord, nearest_mode, arith)
        parallel_for(lambda t: _nearest_plane(o5, x5, t[0], t[1], ih, iw), tasks, threads)
    elif mode == "cubic":
        ih, wh = ref.resize_cubic_weights(h, size[0], sh, coord, cubic_a, arith, cubic_exclude)
        ih, wh = np.ascontiguousarray(ih[r0:r1] - lo), np.ascontiguousarray(wh[r0:r1])
        iw, ww = ref.resize_cubic_weights(w, size[1], sw, coord, cubic_a, arith, cubic_exclude)
        parallel_for(lambda t: _bicubic_plane(o5, x5, t[0], t[1], ih, wh, iw, ww), tasks, threads)
    else:
        h0, h1, lh = (a[r0:r1] for a in ref.resize_linear_weights(h, size[0], sh, coord, arith))
        h0, h1 = h0 - lo, h1 - lo
        w0, w1, lw = ref.resize_linear_weights(w, size[1], sw, coord, arith)
        parallel_for(lambda t: _bilinear_plane(o5, x5, t[0], t[1], h0, h1, lh, w0, w1, lw), tasks, threads)
    if layout == "nchwc" and channels is not None:   # padded lanes 0 whatever the input held there
        _zero_pad_lanes(out, int(channels))


# grid_sample: the reference's float32 arithmetic per output position (kernels/reference.py grid_unnormalize,
# ATen's vectorized kernel's order), NCHW; tasks are (image, output row) pairs, each reading its grid row once
# and every channel's four corners
@njit(inline="always", cache=True)
def _grid_coord(g, size, pad, align):
    """pad: 0 zeros, 1 border, 2 reflection."""
    one = np.float32(1.0)
    if align:
        c = (g + one) * np.float32((size - 1) / 2)
    else:
        c = (g + one) * np.float32(size / 2) - np.float32(0.5)
    return _grid_bound(c, size, pad, align)


@njit(inline="always", cache=True)
def _grid_bound(c, size, pad, align):
    """reference.grid_bound: border clips, reflection reflects then clips, zeros leaves c."""
    zero = np.float32(0.0)
    if pad == 2:
        if align:
            lo, span2 = zero, np.float32(2 * (size - 1))
        else:
            lo, span2 = np.float32(-0.5), np.float32(2 * size)
        if span2 == zero:
            c = zero
        else:
            a = abs(c - lo)
            extra = a - np.floor(a / span2) * span2
            c = min(extra, span2 - extra) + lo
    if pad >= 1:
        c = zero if c != c else min(max(c, zero), np.float32(size - 1))
    return c


@njit(inline="always", cache=True)
def _grid_index(f):
    """floor / rint result as an index; NaN and far-off coordinates -> -2 (outside)."""
    if not (abs(f) < np.float32(2.0 ** 30)):
        return -2
    return int(f)


@njit(inline="always", cache=True)
def _cubic_far(x):
    a = np.float32(-0.75)
    return ((a * x - np.float32(5.0) * a) * x + np.float32(8.0) * a) * x - np.float32(4.0) * a


@njit(inline="always", cache=True)
def _cubic_near(x):
    a = np.float32(-0.75)
    return ((a + np.float32(2.0)) * x - (a + np.float32(3.0))) * x * x + np.float32(1.0)


@njit(inline="always", cache=True)
def _bicubic_at(out, x, n, i, j, ux, uy, pad, align, cx, cy, xs, oks):
    """One output position of bicubic sampling (reference.grid_sample's order): the 4 x 4 taps around the
    unnormalized (ux, uy), each brought in by the padding mode, rows along x, then along y."""
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    x0, y0 = np.floor(ux), np.floor(uy)
    tx, ty = ux - x0, uy - y0
    one = np.float32(1.0)
    cx[0], cx[1], cx[2], cx[3] = _cubic_far(tx + one), _cubic_near(tx), _cubic_near(one - tx), \
        _cubic_far(np.float32(2.0) - tx)
    cy[0], cy[1], cy[2], cy[3] = _cubic_far(ty + one), _cubic_near(ty), _cubic_near(one - ty), \
        _cubic_far(np.float32(2.0) - ty)
    for k in range(4):
        xs[k] = _grid_index(_grid_bound(x0 + np.float32(k - 1), W, pad, align))
        oks[k] = 0 <= xs[k] < W
    for c in range(C):
        acc = np.float32(0.0)
        for r in range(4):
            yi = _grid_index(_grid_bound(y0 + np.float32(r - 1), H, pad, align))
            row = np.float32(0.0)
            for k in range(4):
                val = x[n, c, yi, xs[k]] if (0 <= yi < H and oks[k]) else np.float32(0.0)
                row = cx[k] * val if k == 0 else row + cx[k] * val
            acc = cy[r] * row if r == 0 else acc + cy[r] * row
        out[n, c, i, j] = acc


@njit(nogil=True, cache=True)
def _grid_row(out, x, grid, n, i, mode, pad, align):
    """mode: 0 bilinear, 1 nearest, 2 bicubic."""
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    one = np.float32(1.0)
    cx, cy = np.empty(4, np.float32), np.empty(4, np.float32)
    xs, oks = np.empty(4, np.int64), np.empty(4, np.bool_)
    for j in range(out.shape[3]):
        if mode == 2:
            _bicubic_at(out, x, n, i, j, _grid_coord(grid[n, i, j, 0], W, 0, align),
                        _grid_coord(grid[n, i, j, 1], H, 0, align), pad, align, cx, cy, xs, oks)
            continue
        ix = _grid_coord(grid[n, i, j, 0], W, pad, align)
        iy = _grid_coord(grid[n, i, j, 1], H, pad, align)
        if mode == 1:
            xi, yi = _grid_index(np.rint(ix)), _grid_index(np.rint(iy))
            if 0 <= xi < W and 0 <= yi < H:
                for c in range(C):
                    out[n, c, i, j] = x[n, c, yi, xi]
            else:
                for c in range(C):
                    out[n, c, i, j] = np.float32(0.0)
            continue
        x0, y0 = np.floor(ix), np.floor(iy)
        we = ix - x0
        ea = one - we
        ns = iy - y0
        so = one - ns
        nw, ne, sw, se = so * ea, so * we, ns * ea, ns * we
        xa, ya = _grid_index(x0), _grid_index(y0)
        xb, yb = xa + 1, ya + 1
        ok_xa, ok_xb, ok_ya, ok_yb = 0 <= xa < W, 0 <= xb < W, 0 <= ya < H, 0 <= yb < H
        for c in range(C):
            v_nw = x[n, c, ya, xa] if ok_ya and ok_xa else np.float32(0.0)
            v_ne = x[n, c, ya, xb] if ok_ya and ok_xb else np.float32(0.0)
            v_sw = x[n, c, yb, xa] if ok_yb and ok_xa else np.float32(0.0)
            v_se = x[n, c, yb, xb] if ok_yb and ok_xb else np.float32(0.0)
            out[n, c, i, j] = v_nw * nw + v_ne * ne + v_sw * sw + v_se * se


GRID_PADDING_CODES = {"zeros": 0, "border": 1, "reflection": 2}
GRID_MODE_CODES = {"bilinear": 0, "nearest": 1, "bicubic": 2}


def grid_sample(out, x, grid, *, mode="bilinear", padding_mode="zeros", align_corners=False, threads=None, **_):
    """out (N, C, Ho, Wo) = x (N, C, H, W) sampled at grid (N, Ho, Wo, 2) (kernels/reference.py grid_sample)."""
    if out.dtype != np.float32:
        out[...] = ref.grid_sample(x, grid, mode, padding_mode, align_corners)
        return
    code, pad, align = GRID_MODE_CODES[mode], GRID_PADDING_CODES[padding_mode], bool(align_corners)
    tasks = [(n, i) for n in range(out.shape[0]) for i in range(out.shape[2])]
    parallel_for(lambda t: _grid_row(out, x, grid, t[0], t[1], code, pad, align), tasks, threads)


KERNELS = {"resize": resize, "grid_sample": grid_sample}
THREADED = frozenset(KERNELS)
BLOCKED = frozenset({"resize"})   # kernels with an NCHW16c form
