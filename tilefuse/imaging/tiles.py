"""Tile geometry and the paper's buffered tile scheme (seed 001, sections 1.3-1.4).

The image is cut into tiles of ``tile = (th, tw)`` input pixels, row-major (left to right, top
to bottom). Neighbouring tiles overlap by the kernel's halo ``(kh - 1, kw - 1)`` (2 pixels for
3x3, as in the paper), so tile ``(i, j)`` starts at ``(i * (th - kh + 1), j * (tw - kw + 1))``.
Each tile is padded on its own and filtered on its own; its output is wrong on the ``kh // 2``
rows / ``kw // 2`` columns next to each tile side that is *not* an image side (the padding there
invented data), so reassembly keeps only the tile's *valid* part:

==============  ==========================================================================
tile            output kept (rows x columns, tile coordinates, h = kh // 2, w = kw // 2)
==============  ==========================================================================
top-left        [0, th - h) x [0, tw - w): last row / column dropped (paper fig. 3(1))
top-right       [0, th - h) x [w, valid width): first column dropped, and what lies past
                the image (paper fig. 3(2))
bottom-left     [h, valid height) x [0, tw - w)
bottom-right    [h, valid height) x [w, valid width)
first column    [h, th - h) x [0, tw - w)
first row       [0, th - h) x [w, tw - w)
last column     [h, th - h) x [w, valid width)
last row        [h, valid height) x [w, tw - w)
interior        [h, th - h) x [w, tw - w)
==============  ==========================================================================

(a tile that is both first and last along an axis keeps that whole axis). The kept parts
partition the image exactly, so reassembly order does not matter and workers can write their
tiles concurrently (the paper lets later tiles overwrite; same result).

Tiles past the image edge (the last row / column of tiles when the image size is not a multiple
of the step) are filled by the paper's rule: the last valid row / column is replicated into the
next ``h`` / ``w`` rows / columns, the rest of the tile is zero. With replicate padding of the
tile this gives the correct image border for every kept pixel.

``plan_tiles`` and ``assign`` serve both execution paths; ``load_tile``, ``pad_tile`` and
``filter_tiles`` are the paper's buffered path (tile copied into a core-local buffer, padded,
filtered with ``kernels.correlate_valid``): replicate border only, and written for clarity.
The fast path (``kernels.correlate_regions``) computes each tile's valid part straight from the
image, reading the halo through the border rule instead of through a padded copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import kernels


@dataclass(frozen=True)
class Tile:
    """One tile: grid position, input window origin and size, and its kept output part.

    ``y, x``: image coordinates of the tile's top-left input pixel. ``rows``/``cols``: the kept
    output rows / columns, half-open, image coordinates. ``top``... ``right``: whether that
    side of the tile lies on (or past) the image border.
    """

    index: int
    grid_row: int
    grid_col: int
    y: int
    x: int
    height: int
    width: int
    rows: tuple[int, int]
    cols: tuple[int, int]
    top: bool
    bottom: bool
    left: bool
    right: bool

    @property
    def kind(self) -> str:
        """'corner', 'edge' or 'interior' (a tile covering a whole axis counts as an edge)."""
        vertical = self.top or self.bottom
        horizontal = self.left or self.right
        if vertical and horizontal:
            return "corner"
        if vertical or horizontal:
            return "edge"
        return "interior"

    @property
    def region(self) -> tuple[int, int, int, int]:
        """Kept output as (r0, r1, c0, c1), image coordinates."""
        return (*self.rows, *self.cols)


def _axis_plan(n: int, size: int, k: int) -> list[tuple[int, int, int]]:
    """Tiles along one axis of length ``n``: (start, kept_start, kept_stop) per tile."""
    halo, h = k - 1, k // 2
    step = size - halo
    count = 1 if n <= size else 1 + -(-(n - size) // step)
    plan = []
    for i in range(count):
        start = i * step
        kept_start = 0 if i == 0 else start + h
        kept_stop = n if i == count - 1 else start + size - h
        plan.append((start, kept_start, kept_stop))
    return plan


def plan_tiles(shape: tuple[int, int], tile: tuple[int, int], ksize: tuple[int, int]) -> list[Tile]:
    """Row-major tiles of ``tile`` input pixels covering an image of ``shape`` for a kernel of
    ``ksize``; ``filter2d`` has already checked ``tile >= ksize``."""
    (h, w), (th, tw), (kh, kw) = shape, tile, ksize
    row_plan, col_plan = _axis_plan(h, th, kh), _axis_plan(w, tw, kw)
    tiles = []
    for i, (y, r0, r1) in enumerate(row_plan):
        for j, (x, c0, c1) in enumerate(col_plan):
            tiles.append(Tile(
                index=len(tiles), grid_row=i, grid_col=j, y=y, x=x, height=th, width=tw,
                rows=(r0, r1), cols=(c0, c1),
                top=i == 0, bottom=i == len(row_plan) - 1,
                left=j == 0, right=j == len(col_plan) - 1))
    return tiles


def assign(tiles: list[Tile], workers: int) -> list[np.ndarray]:
    """Distribute tiles over ``workers`` cores the paper's way: consecutive groups of
    ``workers`` tiles, tile ``j`` of each group to core ``j`` (so core ``j`` gets tiles
    ``j, j + workers, ...``). Returns per core an (n, 4) int64 array of kept regions
    (r0, r1, c0, c1); cores without tiles are left out."""
    groups = []
    for core in range(workers):
        mine = tiles[core::workers]
        if mine:
            groups.append(np.array([t.region for t in mine], dtype=np.int64).reshape(-1, 4))
    return groups


def _fill_index(start: int, size: int, n: int, halo: int) -> np.ndarray:
    """Image index per tile position along one axis under the paper's fill rule
    (-1 = zero): valid data, then ``halo`` copies of the last valid index, then zeros."""
    idx = np.arange(start, start + size)
    out = np.where(idx < n, idx, -1)
    out[(idx >= n) & (idx < n + halo)] = n - 1
    return out


def load_tile(image: np.ndarray, tile: Tile, ksize: tuple[int, int]) -> np.ndarray:
    """The (height, width) input buffer of ``tile`` (what the PL kernel streams to a core)."""
    kh, kw = ksize
    rows = _fill_index(tile.y, tile.height, image.shape[0], kh // 2)
    cols = _fill_index(tile.x, tile.width, image.shape[1], kw // 2)
    buf = np.zeros((tile.height, tile.width), dtype=image.dtype)
    keep_r, keep_c = rows >= 0, cols >= 0
    buf[np.ix_(keep_r, keep_c)] = image[np.ix_(rows[keep_r], cols[keep_c])]
    return buf


def pad_tile(buf: np.ndarray, ksize: tuple[int, int]) -> np.ndarray:
    """Per-tile replicate padding (paper 1.3): corners copy the tile's corners, the first /
    last row and column copy themselves, ``kh // 2`` rows and ``kw // 2`` columns a side."""
    hy, hx = ksize[0] // 2, ksize[1] // 2
    # (th, tw) -> (th + 2hy, tw + 2hx)
    return np.pad(buf, ((hy, hy), (hx, hx)), mode="edge")


def filter_tiles(image: np.ndarray, kernel: np.ndarray, group: list[Tile],
                 out: np.ndarray) -> np.ndarray:
    """The paper's buffered scheme for one core's ``group`` of tiles of a 2-D image: load
    (with fill), pad, 'valid' filter, keep the valid part. ``kernel`` is in the accumulator
    dtype, ``out`` (H, W) of that dtype. Replicate border only."""
    ksize = kernel.shape
    for t in group:
        padded = pad_tile(load_tile(image, t, ksize), ksize)
        tile_out = np.empty((t.height, t.width), dtype=out.dtype)
        kernels.correlate_valid(padded, kernel, tile_out)
        (r0, r1), (c0, c1) = t.rows, t.cols
        out[r0:r1, c0:c1] = tile_out[r0 - t.y:r1 - t.y, c0 - t.x:c1 - t.x]
    return out
