"""Numba kernels for tiled 2-D correlation (the fast path of `filter2d`).

Every kernel is a free function compiled with ``nogil=True`` (so a thread pool runs them on
several cores at once) and ``cache=True``. The plain numpy spec they must match is
``reference.correlate_reference``; tests compare the two.

Layout: ``src`` is a C-contiguous (H, W) image, ``out`` the (H, W) result, ``k`` the (kh, kw)
kernel already cast to the accumulator dtype (int32 for exact integer filtering, float32
otherwise). A *region* is ``(r0, r1, c0, c1)``: the output pixels a tile is responsible for
(its valid part, see ``tiles.py``); the kernel reads the tile's halo straight from ``src``, and
where the halo leaves the image it reads through ``border_index`` -- the per-tile padding of the
paper. Integer sums wrap modulo 2**32 like int32 hardware: numba computes in int64 and the store
to int32 keeps the low 32 bits, which is the same ring arithmetic.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from tilefuse.kernels.fpflags import FAST

REPLICATE, CONSTANT, REFLECT = 0, 1, 2  # == reference.BORDER_CODES


@njit(nogil=True, cache=True, fastmath=False)   # stated: never inherited from a fastmath caller (integer code)
def border_index(i, n, mode):
    """Image index read by position ``i`` on an axis of length ``n`` (-1: a zero)."""
    if i >= 0 and i < n:
        return i
    if mode == REPLICATE:
        return 0 if i < 0 else n - 1
    if mode == CONSTANT:
        return -1
    if n == 1:  # REFLECT (BORDER_REFLECT_101), period 2n - 2
        return 0
    period = 2 * n - 2
    i = i % period
    if i >= n:
        i = period - i
    return i


@njit(nogil=True, cache=True, fastmath=FAST)
def _edge_pixel(src, k, r, x, mode):
    """One output pixel with full border mapping (slow path for columns near the edges)."""
    h, w = src.shape
    kh, kw = k.shape
    acc = k[0, 0] * 0
    for dy in range(kh):
        ry = border_index(r + dy - kh // 2, h, mode)
        if ry < 0:
            continue
        for dx in range(kw):
            cx = border_index(x + dx - kw // 2, w, mode)
            if cx >= 0:
                acc += k[dy, dx] * src[ry, cx]
    return acc


@njit(nogil=True, cache=True, fastmath=FAST)
def _row_3x3(a, b, c, k, orow, xa, xb):
    """orow[x] = 3x3 taps over rows a, b, c (above, centre, below), all in registers.

    Every operand is sliced so the loop index starts at 0: numba then drops its negative-index
    wraparound check and LLVM vectorizes the loop.
    """
    n = xb - xa
    a0, a1, a2 = a[xa - 1:xb - 1], a[xa:xb], a[xa + 1:xb + 1]
    b0, b1, b2 = b[xa - 1:xb - 1], b[xa:xb], b[xa + 1:xb + 1]
    c0, c1, c2 = c[xa - 1:xb - 1], c[xa:xb], c[xa + 1:xb + 1]
    o = orow[xa:xb]
    w00, w01, w02 = k[0, 0], k[0, 1], k[0, 2]
    w10, w11, w12 = k[1, 0], k[1, 1], k[1, 2]
    w20, w21, w22 = k[2, 0], k[2, 1], k[2, 2]
    for i in range(n):
        o[i] = (w00 * a0[i] + w01 * a1[i] + w02 * a2[i]
                + w10 * b0[i] + w11 * b1[i] + w12 * b2[i]
                + w20 * c0[i] + w21 * c1[i] + w22 * c2[i])


@njit(nogil=True, cache=True, fastmath=FAST)
def _axpy(o, wt, s, first):
    """o (+)= wt * s over equal-length row segments."""
    if first:
        for i in range(o.shape[0]):
            o[i] = wt * s[i]
    else:
        for i in range(o.shape[0]):
            o[i] += wt * s[i]


@njit(nogil=True, cache=True, fastmath=FAST)
def _row_taps(srow, k, dy, orow, xa, xb, first):
    """orow[x] (+)= sum over dx of k[dy, dx] * srow[x + dx - kw//2] for x in [xa, xb);
    horizontal taps unrolled for kw in 3, 5 so each pass over the row is one vector loop."""
    kw = k.shape[1]
    hx = kw // 2
    n = xb - xa
    o = orow[xa:xb]
    if kw == 3:
        s0, s1, s2 = srow[xa - 1:xb - 1], srow[xa:xb], srow[xa + 1:xb + 1]
        w0, w1, w2 = k[dy, 0], k[dy, 1], k[dy, 2]
        if first:
            for i in range(n):
                o[i] = w0 * s0[i] + w1 * s1[i] + w2 * s2[i]
        else:
            for i in range(n):
                o[i] += w0 * s0[i] + w1 * s1[i] + w2 * s2[i]
    elif kw == 5:
        s0, s1, s2 = srow[xa - 2:xb - 2], srow[xa - 1:xb - 1], srow[xa:xb]
        s3, s4 = srow[xa + 1:xb + 1], srow[xa + 2:xb + 2]
        w0, w1, w2, w3, w4 = k[dy, 0], k[dy, 1], k[dy, 2], k[dy, 3], k[dy, 4]
        if first:
            for i in range(n):
                o[i] = w0 * s0[i] + w1 * s1[i] + w2 * s2[i] + w3 * s3[i] + w4 * s4[i]
        else:
            for i in range(n):
                o[i] += w0 * s0[i] + w1 * s1[i] + w2 * s2[i] + w3 * s3[i] + w4 * s4[i]
    else:
        for dx in range(kw):
            _axpy(o, k[dy, dx], srow[xa + dx - hx:xb + dx - hx], first and dx == 0)


_NARROW = 128  # row segments shorter than this (e.g. the paper's 64x32 tiles) use _narrow_row


@njit(nogil=True, cache=True, fastmath=FAST)
def _narrow_row(src, k, r, orow, xa, xb, mode):
    """orow[xa:xb] for a short row segment: one pixel at a time, all taps in a register.
    Cheaper than the row-pass loops when there are too few pixels to amortise their setup."""
    h = src.shape[0]
    kh, kw = k.shape
    hy, hx = kh // 2, kw // 2
    for x in range(xa, xb):
        orow[x] = 0
    for dy in range(kh):
        ry = border_index(r + dy - hy, h, mode)
        if ry < 0:
            continue
        srow = src[ry]
        for x in range(xa, xb):
            acc = orow[x]
            seg = srow[x - hx:x + hx + 1]
            for dx in range(kw):
                acc += k[dy, dx] * seg[dx]
            orow[x] = acc


@njit(nogil=True, cache=True, fastmath=FAST)
def correlate_region(src, k, out, r0, r1, c0, c1, mode, zero):
    """out[r0:r1, c0:c1] = correlation of ``src`` with ``k`` under border ``mode``.

    Columns whose taps stay inside the image run as vector loops over whole row segments;
    the at most kw//2 columns at each image edge go through ``_edge_pixel``. ``zero`` is a
    zero row of src's width and dtype, read above / below the image in CONSTANT mode.
    """
    h, w = src.shape
    kh, kw = k.shape
    hy, hx = kh // 2, kw // 2
    xa = max(c0, hx)
    xb = min(c1, w - hx)
    for r in range(r0, r1):
        orow = out[r]
        if xa < xb:
            if kh == 3 and kw == 3:
                ra = border_index(r - 1, h, mode)
                rc = border_index(r + 1, h, mode)
                a = src[ra] if ra >= 0 else zero
                c = src[rc] if rc >= 0 else zero
                _row_3x3(a, src[r], c, k, orow, xa, xb)
            elif xb - xa < _NARROW:
                _narrow_row(src, k, r, orow, xa, xb, mode)
            else:
                for dy in range(kh):
                    ry = border_index(r + dy - hy, h, mode)
                    srow = src[ry] if ry >= 0 else zero
                    _row_taps(srow, k, dy, orow, xa, xb, dy == 0)
        for x in range(c0, min(xa, c1)):
            orow[x] = _edge_pixel(src, k, r, x, mode)
        for x in range(max(xb, c0), c1):
            if x >= xa:
                orow[x] = _edge_pixel(src, k, r, x, mode)


@njit(nogil=True, cache=True)
def correlate_regions(src, k, out, regions, mode):
    """Run ``correlate_region`` over each row (r0, r1, c0, c1) of ``regions``: one worker's
    group of tiles, computed in order without the GIL."""
    zero = np.zeros(src.shape[1], dtype=src.dtype)
    for i in range(regions.shape[0]):
        correlate_region(src, k, out, regions[i, 0], regions[i, 1], regions[i, 2],
                         regions[i, 3], mode, zero)


@njit(nogil=True, cache=True, fastmath=FAST)
def separable_region(src, kv, kh, out, r0, r1, c0, c1, mode):
    """out[r0:r1, c0:c1] = correlation with the rank-1 kernel outer(kv, kh).

    Per output row: a vertical pass sums ``kv`` taps into a row buffer covering columns
    c0 - hx .. c1 + hx (columns outside the image mapped through the border), then a
    horizontal pass applies ``kh``. Integer passes wrap modulo 2**32, so the result equals the
    full 2-D integer correlation exactly.
    """
    h, w = src.shape
    ny, nx = kv.shape[0], kh.shape[0]
    hy, hx = ny // 2, nx // 2
    span = c1 - c0 + 2 * hx
    tmp = np.empty(span, dtype=out.dtype)
    ia = max(c0 - hx, 0)  # image columns read directly
    ib = min(c1 + hx, w)
    for r in range(r0, r1):
        # vertical pass over the image columns [ia, ib): tmp[j - (c0 - hx)]
        base = c0 - hx
        for dy in range(ny):
            ry = border_index(r + dy - hy, h, mode)
            wt = kv[dy]
            if ry < 0:
                if dy == 0:
                    for j in range(ia, ib):
                        tmp[j - base] = 0
                continue
            srow = src[ry]
            if dy == 0:
                for j in range(ia, ib):
                    tmp[j - base] = wt * srow[j]
            else:
                for j in range(ia, ib):
                    tmp[j - base] += wt * srow[j]
        # columns outside the image: the vertical sum of the column they map to
        for j in range(base, c1 + hx):
            if j >= 0 and j < w:
                continue
            cj = border_index(j, w, mode)
            acc = kv[0] * 0
            if cj >= 0:
                for dy in range(ny):
                    ry = border_index(r + dy - hy, h, mode)
                    if ry >= 0:
                        acc += kv[dy] * src[ry, cj]
            tmp[j - base] = acc
        # horizontal pass
        orow = out[r]
        for x in range(c0, c1):
            orow[x] = 0
        for dx in range(nx):
            wt = kh[dx]
            for x in range(c0, c1):
                orow[x] += wt * tmp[x - c0 + dx]


@njit(nogil=True, cache=True)
def separable_regions(src, kv, kh, out, regions, mode):
    """``separable_region`` over each row (r0, r1, c0, c1) of ``regions``."""
    for i in range(regions.shape[0]):
        separable_region(src, kv, kh, out, regions[i, 0], regions[i, 1], regions[i, 2],
                         regions[i, 3], mode)


@njit(nogil=True, cache=True, fastmath=FAST)
def correlate_valid(padded, k, out):
    """'Valid' correlation of a padded tile: out (th, tw) from padded (th+kh-1, tw+kw-1).

    This is the per-core kernel of the paper's buffered scheme (``tiles.filter_tiles``): the
    tile arrives already padded, and the kernel knows nothing about the image.
    """
    th, tw = out.shape
    kh, kw = k.shape
    for r in range(th):
        for x in range(tw):
            out[r, x] = 0
        for dy in range(kh):
            for dx in range(kw):
                wt = k[dy, dx]
                for x in range(tw):
                    out[r, x] += wt * padded[r + dy, x + dx]
