"""Line-buffer filtering (issue 6): filter2d_linebuffer == scipy.ndimage.correlate.

Integer images with integer kernels accumulate in int32 and must be exact; float32 images are
compared at rtol = atol = 1e-5 (different summation order from scipy's float64).
"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.ndimage as ndi

from tilefuse.imaging.linebuffer import filter2d_linebuffer

SCIPY_MODE = {"replicate": "nearest", "constant": "constant", "reflect": "mirror"}
SHAPES = [(1, 1), (1, 9), (17, 1), (2, 3), (23, 31), (40, 33, 3), (9, 1, 2)]


def scipy_ref(img, k, border):
    kk = k if img.ndim == 2 else k[:, :, None]
    if img.dtype.kind in "iu":
        return ndi.correlate(img.astype(np.int64), kk.astype(np.int64), mode=SCIPY_MODE[border], cval=0)
    return ndi.correlate(img.astype(np.float64), kk.astype(np.float64), mode=SCIPY_MODE[border], cval=0)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("k", [1, 3, 5, 7])
@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int32])
def test_integer_exact_replicate(shape, k, dtype):
    rng = np.random.default_rng(k * 100 + len(shape))
    info = np.iinfo(dtype)
    lo, hi = (0, 256) if dtype == np.uint8 else (max(info.min, -30000), min(info.max, 30000))
    img = rng.integers(lo, hi, shape).astype(dtype)
    ker = rng.integers(-5, 6, (k, k)).astype(np.int32)
    got = filter2d_linebuffer(img, ker)
    assert got.dtype == np.int32 and got.shape == img.shape
    assert np.array_equal(got, scipy_ref(img, ker, "replicate"))


@pytest.mark.parametrize("border", ["replicate", "constant", "reflect"])
@pytest.mark.parametrize("kshape", [(3, 3), (5, 5), (7, 7), (1, 5), (5, 3)])
def test_borders_and_rectangular_kernels(border, kshape):
    rng = np.random.default_rng(1)
    img = rng.integers(0, 256, (19, 26)).astype(np.uint8)
    ker = rng.integers(-3, 4, kshape).astype(np.int32)
    assert np.array_equal(filter2d_linebuffer(img, ker, border=border), scipy_ref(img, ker, border))


@pytest.mark.parametrize("shape", [(31, 17), (12, 7, 3), (1, 40)], ids=str)
@pytest.mark.parametrize("k", [3, 7])
def test_float32(shape, k):
    rng = np.random.default_rng(2)
    img = rng.standard_normal(shape).astype(np.float32)
    ker = rng.standard_normal((k, k)).astype(np.float32)
    got = filter2d_linebuffer(img, ker)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, scipy_ref(img, ker, "replicate"), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("workers", [2, 3, 50])
def test_row_bands_in_parallel_equal_one_pass(workers):
    rng = np.random.default_rng(3)
    img = rng.integers(0, 256, (45, 38, 3)).astype(np.uint8)
    ker = rng.integers(-4, 5, (5, 5)).astype(np.int32)
    assert np.array_equal(filter2d_linebuffer(img, ker, workers=workers), filter2d_linebuffer(img, ker))


def test_int32_wraps_like_int32_hardware():
    img = np.full((5, 5), 2**31 - 1, dtype=np.int32)
    ker = np.full((3, 3), 2, dtype=np.int32)
    want = (np.int64(2**31 - 1) * 18 + 2**31) % 2**32 - 2**31
    assert np.all(filter2d_linebuffer(img, ker) == want)


def test_matches_tiled_filter2d_and_saturates():
    from tilefuse.imaging import KERNELS, filter2d
    rng = np.random.default_rng(4)
    img = rng.integers(0, 256, (64, 80)).astype(np.uint8)
    for name in ("sharpen", "sobel-x", "gauss"):
        k = KERNELS[name]
        np.testing.assert_array_equal(filter2d_linebuffer(img, k), filter2d(img, k))
        np.testing.assert_array_equal(filter2d_linebuffer(img, k, saturate=True), filter2d(img, k, saturate=True))


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="even side"):
        filter2d_linebuffer(np.zeros((4, 4), np.uint8), np.ones((2, 2)))
    with pytest.raises(ValueError, match="border"):
        filter2d_linebuffer(np.zeros((4, 4), np.uint8), np.ones((3, 3)), border="wrap")


def test_public_api_selects_linebuffer_and_matches_tiled():
    from tilefuse.imaging import filter2d
    rng = np.random.default_rng(5)
    img = rng.integers(0, 255, (37, 53), dtype=np.uint8)
    ker = rng.integers(-3, 4, (5, 5)).astype(np.int32)
    lb = filter2d(img, ker, algorithm="linebuffer")
    tiled = filter2d(img, ker, algorithm="tiled", tile=(16, 16))
    assert lb.dtype == tiled.dtype and np.array_equal(lb, tiled)
    with pytest.raises(ValueError, match="algorithm: found 'fft'"):
        filter2d(img, ker, algorithm="fft")
