"""The paper's tile rules (seed 001, 1.3-1.4), one test per rule.

Geometry: tiles of (th, tw) input pixels overlap by the kernel halo (k - 1); each tile is padded
on its own by replicating its border; tiles past the image edge replicate the last valid
row/column then hold zeros; reassembly keeps each tile's valid part, by tile kind.
"""

import numpy as np
import pytest
import scipy.ndimage as ndi
from hypothesis import given, settings
from hypothesis import strategies as st

from tilefuse.imaging import KERNELS, filter2d
from tilefuse.imaging import kernels as K
from tilefuse.imaging.tiles import assign, load_tile, pad_tile, plan_tiles

TH, TW = 8, 10  # small tiles so a 3x3 kernel gives a 5 x 5 grid on a 36 x 45 image
SHAPE = (36, 45)
K3 = (3, 3)


def grid():
    tiles = plan_tiles(SHAPE, (TH, TW), K3)
    return {(t.grid_row, t.grid_col): t for t in tiles}


def test_tiles_overlap_by_the_halo():
    """3x3: neighbours overlap by 2 pixels (paper fig. 2); 5x5: by 4."""
    for ksize, overlap in ((3, 2), (5, 4)):
        tiles = plan_tiles((200, 300), (64, 32), (ksize, ksize))
        row0 = [t for t in tiles if t.grid_row == 0]
        for a, b in zip(row0, row0[1:]):
            assert a.x + a.width - b.x == overlap
        col0 = [t for t in tiles if t.grid_col == 0]
        for a, b in zip(col0, col0[1:]):
            assert a.y + a.height - b.y == overlap


def test_tiles_are_row_major():
    tiles = plan_tiles(SHAPE, (TH, TW), K3)
    assert [t.index for t in tiles] == list(range(len(tiles)))
    order = [(t.grid_row, t.grid_col) for t in tiles]
    assert order == sorted(order)
    assert max(t.grid_row for t in tiles) == 5 and max(t.grid_col for t in tiles) == 5


def test_pad_tile_corners_copy_corners():
    buf = np.arange(TH * TW).reshape(TH, TW)
    padded = pad_tile(buf, K3)
    assert padded.shape == (TH + 2, TW + 2)
    assert padded[0, 0] == buf[0, 0] and padded[0, -1] == buf[0, -1]
    assert padded[-1, 0] == buf[-1, 0] and padded[-1, -1] == buf[-1, -1]


def test_pad_tile_first_and_last_rows_and_columns_copy_themselves():
    buf = np.arange(TH * TW).reshape(TH, TW)
    for ksize in ((3, 3), (5, 7)):
        hy, hx = ksize[0] // 2, ksize[1] // 2
        padded = pad_tile(buf, ksize)
        inner = padded[hy:-hy, hx:-hx]
        np.testing.assert_array_equal(inner, buf)
        for i in range(hy):
            np.testing.assert_array_equal(padded[i, hx:-hx], buf[0])
            np.testing.assert_array_equal(padded[-1 - i, hx:-hx], buf[-1])
        for j in range(hx):
            np.testing.assert_array_equal(padded[hy:-hy, j], buf[:, 0])
            np.testing.assert_array_equal(padded[hy:-hy, -1 - j], buf[:, -1])


@pytest.mark.parametrize("ksize", [(3, 3), (5, 5)])
def test_tile_past_image_edge_replicates_last_valid_then_zeros(ksize):
    shape = (35, 44)
    image = np.arange(1, 35 * 44 + 1, dtype=np.int32).reshape(shape)
    tiles = plan_tiles(shape, (TH, TW), ksize)
    last = tiles[-1]  # bottom-right corner tile, sticks out past both edges
    vh, vw = shape[0] - last.y, shape[1] - last.x  # valid rows / columns in the tile
    assert vh < TH and vw < TW
    buf = load_tile(image, last, ksize)
    hy, hx = ksize[0] // 2, ksize[1] // 2
    np.testing.assert_array_equal(buf[:vh, :vw], image[last.y:, last.x:])
    for i in range(min(hy, TH - vh)):  # the last valid row, copied into the next rows
        np.testing.assert_array_equal(buf[vh + i, :vw], image[-1, last.x:])
    for j in range(min(hx, TW - vw)):
        np.testing.assert_array_equal(buf[:vh, vw + j], image[last.y:, -1])
    assert np.all(buf[vh + hy:, :] == 0) and np.all(buf[:, vw + hx:] == 0)
    assert buf[vh, vw] == image[-1, -1]  # the corner of the copies is the image corner


# kept output part per tile kind, tile coordinates; h = w = 1 for 3x3; "end" = valid extent
KEPT = {
    "top-left": ((0, 0), (0, TH - 1), (0, TW - 1)),
    "top-right": ((0, 5), (0, TH - 1), (1, "end")),
    "bottom-left": ((5, 0), (1, "end"), (0, TW - 1)),
    "bottom-right": ((5, 5), (1, "end"), (1, "end")),
    "first-column": ((2, 0), (1, TH - 1), (0, TW - 1)),
    "first-row": ((0, 2), (0, TH - 1), (1, TW - 1)),
    "last-column": ((2, 5), (1, TH - 1), (1, "end")),
    "last-row": ((5, 2), (1, "end"), (1, TW - 1)),
    "interior": ((2, 2), (1, TH - 1), (1, TW - 1)),
}


@pytest.mark.parametrize("kind", list(KEPT))
def test_reassembly_keeps_valid_part_by_tile_kind(kind):
    """Each kind's kept part (paper fig. 3), checked against the reference: the kept part of
    the tile's own output is exact, and the dropped border next to a tile-tile seam is wrong."""
    (gr, gc), (r0, r1), (c0, c1) = KEPT[kind]
    t = grid()[(gr, gc)]
    r1 = SHAPE[0] - t.y if r1 == "end" else r1
    c1 = SHAPE[1] - t.x if c1 == "end" else c1
    assert (t.rows, t.cols) == ((t.y + r0, t.y + r1), (t.x + c0, t.x + c1))
    expected_kind = "interior" if kind == "interior" else (
        "corner" if kind.count("-") == 1 and "column" not in kind and "row" not in kind else "edge")
    assert t.kind == expected_kind

    rng = np.random.default_rng(11)
    image = rng.integers(-100, 100, size=SHAPE).astype(np.int32)
    kernel = KERNELS["laplace"]
    ref = ndi.correlate(image, kernel, mode="nearest")
    tile_out = np.empty((TH, TW), np.int32)
    K.correlate_valid(pad_tile(load_tile(image, t, K3), K3), kernel, tile_out)
    np.testing.assert_array_equal(tile_out[r0:r1, c0:c1], ref[t.y + r0:t.y + r1, t.x + c0:t.x + c1])
    # a dropped row or column on a seam side holds padding artefacts
    window = ref[t.y:t.y + TH, t.x:t.x + TW]
    if not t.top:
        assert np.any(tile_out[0, c0:c1] != window[0, c0:c1])
    if not t.left:
        assert np.any(tile_out[r0:r1, 0] != window[r0:r1, 0])
    if not t.bottom:
        assert np.any(tile_out[TH - 1, c0:c1] != window[TH - 1, c0:c1])
    if not t.right:
        assert np.any(tile_out[r0:r1, TW - 1] != window[r0:r1, TW - 1])


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.integers(1, 300), st.integers(1, 300), st.integers(1, 9), st.integers(1, 9),
       st.sampled_from([1, 3, 5, 7]))
def test_kept_parts_partition_the_image(h, w, dth, dtw, k):
    """Every output pixel is kept by exactly one tile, whatever the sizes."""
    th, tw = k + dth - 1, k + dtw - 1
    cover = np.zeros((h, w), np.int32)
    for t in plan_tiles((h, w), (th, tw), (k, k)):
        (r0, r1), (c0, c1) = t.rows, t.cols
        assert t.y <= r0 < r1 <= t.y + th and t.x <= c0 < c1 <= t.x + tw
        cover[r0:r1, c0:c1] += 1
    assert np.all(cover == 1)


def test_single_tile_keeps_everything():
    (t,) = plan_tiles((20, 30), (64, 32), K3)
    assert t.rows == (0, 20) and t.cols == (0, 30)
    assert t.top and t.bottom and t.left and t.right and t.kind == "corner"


def test_assign_groups_tiles_round_robin_like_the_paper():
    """Groups of `workers` consecutive tiles; tile j of each group goes to core j."""
    tiles = plan_tiles((2160, 3840), (64, 32), K3)
    groups = assign(tiles, 7)
    assert len(groups) == 7
    for core, regions in enumerate(groups):
        expected = [t.region for t in tiles[core::7]]
        np.testing.assert_array_equal(regions, np.array(expected))
    assert sum(len(g) for g in groups) == len(tiles)
    assert len(assign(tiles[:3], 7)) == 3  # cores without tiles are left out


@pytest.mark.parametrize("shape", [(36, 45), (1, 1), (1, 77), (77, 1), (64, 32), (65, 33)])
@pytest.mark.parametrize("ksize", [1, 3, 5])
def test_paper_buffered_path_equals_direct_and_scipy(shape, ksize):
    rng = np.random.default_rng(12)
    image = rng.integers(0, 256, size=shape).astype(np.uint8)
    kernel = rng.integers(-3, 4, size=(ksize, ksize))
    paper = filter2d(image, kernel, tile=(TH, TW), workers=3, method="paper")
    direct = filter2d(image, kernel, tile=(TH, TW), workers=3)
    np.testing.assert_array_equal(paper, direct)
    np.testing.assert_array_equal(paper, ndi.correlate(image.astype(np.int64), kernel,
                                                       mode="nearest"))
