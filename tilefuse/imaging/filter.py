"""`filter2d`: tiled 2-D correlation of an image on the CPU's cores (OpenCV filter2D semantics).

Argument checks and dtype rules are in ``checks.py``; the arithmetic is in ``kernels.py`` (fast,
numba) and ``reference.py`` (spec, numpy); tile geometry in ``tiles.py``.

Output dtype:

- float32 image -> float32.
- uint8 / int16 / int32 image with an integer-valued kernel -> int32, exact (int32 arithmetic,
  wrapping modulo 2**32 if the sums overflow, as int32 hardware does).
- integer image with a kernel holding non-integers (e.g. a normalised Gaussian) -> float32.
- ``saturate=True`` casts an integer image's result back to the image dtype like OpenCV's
  ``filter2D(src, -1, ...)``: round half to even, then clip to the dtype's range.
"""

from __future__ import annotations

import numpy as np

from ..kernels.threads import parallel_for
from . import kernels, tiles
from .checks import accumulator_dtype, check_image, check_kernel, check_out, check_workers, saturate_cast
from .linebuffer import filter2d_linebuffer
from .reference import BORDER_CODES, BORDERS

METHODS = ("direct", "paper")
_BANDS_PER_WORKER = 2  # auto tile: full-width row bands, this many per worker


def check_tile(tile, shape: tuple[int, int], ksize: tuple[int, int], workers: int) -> tuple[int, int]:
    """The (rows, cols) tile size; "auto" picks full-width row bands, a few per worker."""
    h, w = shape
    kh, kw = ksize
    if isinstance(tile, str):
        if tile != "auto":
            raise ValueError(f"tile: found {tile!r}, expected 'auto' or (rows, cols)")
        bands = max(1, workers * _BANDS_PER_WORKER)
        return (-(-h // bands) + kh - 1, w + kw - 1)
    try:
        th, tw = (int(s) for s in tile)
        exact = all(int(s) == s for s in tile)
    except (TypeError, ValueError):
        raise ValueError(f"tile: found {tile!r}, expected 'auto' or a pair (rows, cols)") from None
    if not exact or th < 1 or tw < 1:
        raise ValueError(f"tile: found {tile!r}, expected two positive integers (rows, cols)")
    if th < kh or tw < kw:
        raise ValueError(
            f"tile: found {(th, tw)}, smaller than the kernel halo allows: tiles overlap by "
            f"the halo {(kh - 1, kw - 1)}, so each side must be at least the kernel size "
            f"{(kh, kw)} (halo + 1 pixel of output)")
    return th, tw


def _filter_plane(src: np.ndarray, k: np.ndarray, sep, border: str, tile, workers: int,
                  method: str, out: np.ndarray) -> None:
    """Filter one C-contiguous 2-D plane into ``out`` (accumulator dtype)."""
    plan = tiles.plan_tiles(src.shape, tile, k.shape)
    # the work runs on the one shared worker pool (kernels.threads), `workers` at a time,
    # the calling thread included
    if method == "paper":
        work = [plan[core::workers] for core in range(min(workers, len(plan)))]
        parallel_for(lambda g: tiles.filter_tiles(src, k, g, out), work, workers)
        return
    groups = tiles.assign(plan, workers)
    mode = BORDER_CODES[border]
    if sep is None:
        run, args = kernels.correlate_regions, (src, k)
    else:
        run, args = kernels.separable_regions, (src, sep[0], sep[1])
    if len(groups) == 1:
        run(*args, out, groups[0], mode)
        return
    parallel_for(lambda g: run(*args, out, g, mode), groups, workers)


def filter2d(image, kernel, border: str = "replicate", tile="auto", workers: int | None = None,
             saturate: bool = False, method: str = "direct", out: np.ndarray | None = None,
             algorithm: str = "tiled") -> np.ndarray:
    """Correlate ``image`` (H, W) or (H, W, C) with an odd ``kernel``, OpenCV filter2D style.

    kernel: (kh, kw) array with odd sides up to ``MAX_KERNEL``, or a tuple ``(v, h)`` of two
        1-D arrays for the separable kernel ``outer(v, h)`` (computed in two passes).
    border: "replicate" (default, the paper's), "constant" (zeros) or "reflect"
        (OpenCV BORDER_REFLECT_101 = scipy "mirror": ``dcb|abcd|cba``).
    tile: (rows, cols) of input pixels per tile, halo included (the paper uses (64, 32)), or
        "auto": full-width row bands, ``_BANDS_PER_WORKER`` per worker (fastest here).
    workers: threads the tiles are spread over (default: all cores this process may use).
    saturate: for integer images, cast back to the image dtype (see module doc).
    method: "direct" (numba kernels read each tile's halo from the image) or "paper" (each
        tile copied to a buffer, padded and filtered on its own; replicate border only).
    out: optional preallocated result (accumulator dtype, image shape), written in place.
    algorithm: "tiled" (this module) or "linebuffer" (rows streamed through a k-row ring
        buffer, seed 003; `imaging/linebuffer.py`; `tile` and `method` do not apply).

    ``out`` may be the image itself (``filter2d(a, k, out=a)``): the result is computed into a
    scratch array and then copied into ``out``, since the kernels read pixels around the ones
    they write.
    """
    if out is not None and isinstance(out, np.ndarray) and np.shares_memory(np.asarray(image), out):
        tmp = np.empty(out.shape, out.dtype)
        res = filter2d(image, kernel, border=border, tile=tile, workers=workers, saturate=saturate,
                       method=method, out=tmp, algorithm=algorithm)
        out[...] = tmp
        return out if res is tmp else res
    if algorithm == "linebuffer":
        return filter2d_linebuffer(image, kernel, border=border, workers=workers, saturate=saturate,
                                   out=out)
    if algorithm != "tiled":
        raise ValueError(f"algorithm: found {algorithm!r}, expected 'tiled' or 'linebuffer'")
    img = check_image(image)
    k2d, sep = check_kernel(kernel)
    if border not in BORDERS:
        raise ValueError(f"border: found {border!r}, expected one of {BORDERS}")
    if method not in METHODS:
        raise ValueError(f"method: found {method!r}, expected one of {METHODS}")
    if method == "paper" and border != "replicate":
        raise ValueError(f"border: found {border!r} with method='paper', expected 'replicate' "
                         "(the paper's per-tile padding rules are replicate rules)")
    nworkers = check_workers(workers)
    th_tw = check_tile(tile, img.shape[:2], k2d.shape, nworkers)
    acc = accumulator_dtype(img.dtype, kernel if sep is None else sep)
    out = check_out(out, img.shape, acc)
    k = k2d.astype(acc)
    if sep is not None and method == "direct":
        sep = (sep[0].astype(acc), sep[1].astype(acc))
    else:
        sep = None
    if img.ndim == 2:
        _filter_plane(np.ascontiguousarray(img), k, sep, border, th_tw, nworkers, method, out)
    else:
        # (H, W, C) -> C planes (H, W), filtered one after another
        plane = np.empty(img.shape[:2], dtype=acc)
        for c in range(img.shape[2]):
            _filter_plane(np.ascontiguousarray(img[..., c]), k, sep, border, th_tw, nworkers,
                          method, plane)
            out[..., c] = plane
    if saturate and img.dtype.kind in "iu":
        return saturate_cast(out, img.dtype)
    return out
