"""Line-buffer 2-D filtering (issue 6, seed 003): one pass over the image, k rows in a ring.

Seed 003's accelerator keeps the rows a k x k window needs in a k-row array of RAMs; a new
image row overwrites the oldest RAM row and the row indices rotate, so the multiply-add array
always sees logical rows 0..k-1 in order (its figures 7 and 8). Here:

    ring      (kh, (W + kw - 1) * C)   accumulator dtype; padded row p lives in slot p % kh
    padded row p = image row border(p - kh//2), its columns extended by the border rule
    after padded row p arrives, output row y = p - (kh - 1) is
        out[y] = sum_{i, j} k[i, j] * ring[(y + i) % kh][j*C : j*C + W*C]

so every input row is read once, converted to the accumulator dtype once, and each output row
is kh*kw vectorized multiply-adds over rows held in L1. (H, W, C) images are filtered
interleaved: a tap's column offset is j*C. Semantics, dtypes and borders are those of
`filter2d` (OpenCV filter2D: correlation, anchor at the centre; int32 accumulation for integer
images and integer-valued kernels, exact modulo 2**32; float32 otherwise).

`workers` > 1 cuts the rows into that many bands, each streamed through its own ring on the
shared thread pool (`kernels/threads.py`; numba releases the GIL); a band re-reads kh - 1 halo rows of its neighbour.
"""
from __future__ import annotations

import numba
import numpy as np

from ..kernels.threads import parallel_for
from .checks import (accumulator_dtype, check_image, check_kernel, check_out, check_workers,
                     saturate_cast)
from .reference import BORDERS, border_index


@numba.njit(nogil=True, cache=True)
def _linebuffer_rows(img, rowmap, colmap, chans, k, out, ring, y0, y1):
    """Output rows [y0, y1) of img (H, W*C) into out (H, W*C); ring (kh, (W + kw - 1)*C).

    rowmap[p] / colmap[q]: image row / column read by padded row p / padded column q (-1: zero).
    """
    kh, kw = k.shape
    wc = out.shape[1]
    npad = colmap.shape[0]
    cw = kw // 2
    zero = out.dtype.type(0)
    # padded rows y0 .. y1 + kh - 2 flow through the ring, one at a time
    for p in range(y0, y1 + kh - 1):
        r = ring[p % kh]  # the oldest row's slot: indices rotate
        src = rowmap[p]
        if src < 0:
            r[:] = zero
        else:
            srow = img[src]
            mid = r[cw * chans:cw * chans + wc]
            for q in range(wc):  # the row itself, converted to the accumulator dtype
                mid[q] = srow[q]
            for b in range(2 * cw):  # border columns: cw on the left, cw on the right
                q = b if b < cw else npad - 2 * cw + b
                s = colmap[q]
                for c in range(chans):
                    r[q * chans + c] = srow[s * chans + c] if s >= 0 else zero
        y = p - (kh - 1)
        if y < y0:
            continue
        o = out[y]
        for i in range(kh):
            row = ring[(y + i) % kh]  # logical row i of the window
            for j in range(kw):
                kij = k[i, j]
                tap = row[j * chans:j * chans + wc]  # a slice, so the loop vectorizes (8x here)
                if i == 0 and j == 0:
                    for x in range(wc):
                        o[x] = kij * tap[x]
                else:
                    for x in range(wc):
                        o[x] += kij * tap[x]


def _maps(h: int, w: int, kh: int, kw: int, border: str) -> tuple[np.ndarray, np.ndarray]:
    ch, cw = kh // 2, kw // 2
    rowmap = np.array([border_index(p - ch, h, border) for p in range(h + kh - 1)], dtype=np.int64)
    colmap = np.array([border_index(q - cw, w, border) for q in range(w + kw - 1)], dtype=np.int64)
    return rowmap, colmap


def filter2d_linebuffer(image, kernel, border: str = "replicate", workers: int | None = 1,
                        saturate: bool = False, out: np.ndarray | None = None) -> np.ndarray:
    """Correlate `image` (H, W) or (H, W, C) with an odd kernel, streaming rows through a
    kh-row ring buffer (see the module doc). Same arguments and results as `filter2d`.

    workers: row bands streamed in parallel, each with its own ring (1: one pass, one ring).
    """
    img = check_image(image)
    k2d, sep = check_kernel(kernel)
    if border not in BORDERS:
        raise ValueError(f"border: found {border!r}, expected one of {BORDERS}")
    nworkers = check_workers(workers)
    acc = accumulator_dtype(img.dtype, kernel if sep is None else sep)
    out = check_out(out, img.shape, acc)
    h, w = img.shape[:2]
    chans = img.shape[2] if img.ndim == 3 else 1
    kh, kw = k2d.shape
    k = np.ascontiguousarray(k2d.astype(acc))
    src = np.ascontiguousarray(img).reshape(h, w * chans)       # (H, W, C) -> (H, W*C), a view
    dst = out.reshape(h, w * chans)
    rowmap, colmap = _maps(h, w, kh, kw, border)
    bands = min(nworkers, h)
    cuts = [h * b // bands for b in range(bands + 1)]

    def run(b: int) -> None:
        ring = np.empty((kh, (w + kw - 1) * chans), dtype=acc)
        _linebuffer_rows(src, rowmap, colmap, chans, k, dst, ring, cuts[b], cuts[b + 1])

    parallel_for(run, range(bands), bands)
    if saturate and img.dtype.kind in "iu":
        return saturate_cast(out, img.dtype)
    return out


__all__ = ["filter2d_linebuffer"]
