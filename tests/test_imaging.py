"""tilefuse.imaging.filter2d against scipy.ndimage.correlate and cv2.filter2D.

Tolerances: integer dtypes are exact (int32 accumulation, compared with scipy on int64 inputs
whose sums fit easily, and with the int32-wrapping numpy reference for full-range int32).
float32 is compared with float64 scipy within rtol 1e-5 plus an absolute 1e-5 of the term
scale ``max|image| * sum|kernel|``: correlation sums cancel (Sobel, Laplace on noise), so a
purely relative bound on a result near zero would test float32 rounding, not correctness.
"""

import cv2
import numpy as np
import pytest
import scipy.ndimage as ndi
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tilefuse.imaging import KERNELS, MAX_KERNEL, correlate_reference, filter2d

SCIPY_MODE = {"replicate": "nearest", "constant": "constant", "reflect": "mirror"}
CV2_BORDER = {"replicate": cv2.BORDER_REPLICATE, "constant": cv2.BORDER_CONSTANT,
              "reflect": cv2.BORDER_REFLECT_101}
FLOAT_RTOL = 1e-5
PROPERTY = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
INT_RANGES = {np.uint8: (0, 256), np.int16: (-2000, 2000), np.int32: (-10**6, 10**6)}


def random_image(rng, shape, dtype):
    if dtype == np.float32:
        return rng.standard_normal(shape).astype(np.float32)
    lo, hi = INT_RANGES[dtype]
    return rng.integers(lo, hi, size=shape).astype(dtype)


def scipy_correlate(image, kernel, border):
    """float64 / int64 scipy result, channel by channel."""
    wide = image.astype(np.float64 if image.dtype.kind == "f" else np.int64)
    if wide.ndim == 3:
        return np.stack([scipy_correlate(wide[..., c], kernel, border)
                         for c in range(wide.shape[2])], axis=-1)
    return ndi.correlate(wide, np.asarray(kernel, dtype=wide.dtype), mode=SCIPY_MODE[border])


def assert_float_close(out, ref, image, kernel):
    scale = float(np.abs(image).max()) * float(np.abs(kernel).sum())
    np.testing.assert_allclose(out, ref, rtol=FLOAT_RTOL, atol=FLOAT_RTOL * max(scale, 1.0))


case = st.fixed_dictionaries({
    "h": st.integers(1, 300), "w": st.integers(1, 300),
    "kh": st.sampled_from([1, 3, 5, 7]), "kw": st.sampled_from([1, 3, 5, 7]),
    "border": st.sampled_from(["replicate", "constant", "reflect"]),
    "tile": st.one_of(st.just("auto"), st.tuples(st.integers(7, 96), st.integers(7, 96))),
    "workers": st.integers(1, 4), "seed": st.integers(0, 2**32 - 1),
})


# --- shape and dtype first ---------------------------------------------------------------

@pytest.mark.parametrize("dtype, kernel, expected", [
    (np.uint8, KERNELS["sharpen"], np.int32),
    (np.int16, KERNELS["sobel-x"], np.int32),
    (np.int32, KERNELS["laplace"], np.int32),
    (np.float32, KERNELS["sharpen"], np.float32),
    (np.uint8, KERNELS["gauss"], np.float32),     # non-integer weights: float32 accumulator
    (np.int32, np.ones((3, 3)), np.int32),        # integer-valued float kernel: exact path
])
def test_output_dtype(dtype, kernel, expected):
    image = random_image(np.random.default_rng(0), (9, 11), dtype)
    out = filter2d(image, kernel)
    assert out.shape == image.shape and out.dtype == expected


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int32, np.float32])
def test_saturate_returns_input_dtype(dtype):
    image = random_image(np.random.default_rng(1), (20, 30), dtype)
    out = filter2d(image, KERNELS["sharpen"], saturate=True)
    assert out.dtype == dtype and out.shape == image.shape


def test_channels_filtered_independently():
    rng = np.random.default_rng(2)
    image = random_image(rng, (37, 41, 3), np.uint8)
    out = filter2d(image, KERNELS["sobel-y"], tile=(16, 16), workers=2)
    assert out.shape == (37, 41, 3)
    for c in range(3):
        np.testing.assert_array_equal(out[..., c], filter2d(image[..., c], KERNELS["sobel-y"]))


# --- values: property tests against scipy and OpenCV -------------------------------------

@PROPERTY
@given(case, st.sampled_from([np.uint8, np.int16, np.int32]))
def test_integer_equals_scipy_exactly(c, dtype):
    rng = np.random.default_rng(c["seed"])
    image = random_image(rng, (c["h"], c["w"]), dtype)
    kernel = rng.integers(-4, 5, size=(c["kh"], c["kw"]))
    tile = c["tile"] if c["tile"] == "auto" else (max(c["tile"][0], c["kh"]),
                                                   max(c["tile"][1], c["kw"]))
    out = filter2d(image, kernel, border=c["border"], tile=tile, workers=c["workers"])
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, scipy_correlate(image, kernel, c["border"]))


@PROPERTY
@given(case)
def test_float32_matches_scipy_and_cv2(c):
    rng = np.random.default_rng(c["seed"])
    image = random_image(rng, (c["h"], c["w"]), np.float32)
    kernel = rng.standard_normal((c["kh"], c["kw"])).astype(np.float32)
    tile = c["tile"] if c["tile"] == "auto" else (max(c["tile"][0], c["kh"]),
                                                   max(c["tile"][1], c["kw"]))
    out = filter2d(image, kernel, border=c["border"], tile=tile, workers=c["workers"])
    assert out.dtype == np.float32
    assert_float_close(out, scipy_correlate(image, kernel, c["border"]), image, kernel)
    ref_cv = cv2.filter2D(image, -1, kernel, borderType=CV2_BORDER[c["border"]])
    assert_float_close(out, ref_cv, image, kernel)


@PROPERTY
@given(case, st.sampled_from([np.uint8, np.int16]))
def test_saturated_integer_equals_cv2_exactly(c, dtype):
    """cv2.filter2D(src, -1, k) rounds and saturates; with integer weights that is exact."""
    rng = np.random.default_rng(c["seed"])
    image = random_image(rng, (c["h"], c["w"]), dtype)
    kernel = rng.integers(-3, 4, size=(c["kh"], c["kw"]))
    out = filter2d(image, kernel, border=c["border"], workers=c["workers"], saturate=True)
    ref = cv2.filter2D(image, -1, kernel.astype(np.float32), borderType=CV2_BORDER[c["border"]])
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("border", ["replicate", "constant", "reflect"])
def test_integer_matches_cv2_accumulator(border):
    """Unsaturated int32 result equals cv2's float32-depth output (exact for these sums)."""
    rng = np.random.default_rng(3)
    image = random_image(rng, (123, 77), np.uint8)
    for name in ("sharpen", "sobel-x", "sobel-y", "laplace"):
        ref = cv2.filter2D(image, cv2.CV_32F, KERNELS[name].astype(np.float32),
                           borderType=CV2_BORDER[border])
        np.testing.assert_array_equal(filter2d(image, KERNELS[name], border=border), ref)


def test_float_kernel_on_uint8_saturates_like_cv2():
    """Normalised kernels on uint8 go through float32; OpenCV rounds its own float sums, so
    results may differ by one grey level where a sum lands on .5 -- no more."""
    rng = np.random.default_rng(4)
    image = random_image(rng, (200, 300), np.uint8)
    for name in ("box", "gauss"):
        out = filter2d(image, KERNELS[name], saturate=True)
        ref = cv2.filter2D(image, -1, KERNELS[name], borderType=cv2.BORDER_REPLICATE)
        assert out.dtype == np.uint8
        assert np.abs(out.astype(int) - ref.astype(int)).max() <= 1


def test_full_range_int32_wraps_like_int32_hardware():
    """Random int32 over the whole range (the paper's frames): sums wrap modulo 2**32."""
    rng = np.random.default_rng(5)
    image = rng.integers(-2**31, 2**31, size=(97, 131), dtype=np.int32)
    kernel = KERNELS["sharpen"]
    out = filter2d(image, kernel, tile=(64, 32), workers=3)
    wide = scipy_correlate(image, kernel, "replicate")  # exact int64 sums
    np.testing.assert_array_equal(out, wide.astype(np.int32))  # low 32 bits
    np.testing.assert_array_equal(out, correlate_reference(image, kernel))


@pytest.mark.parametrize("border", ["replicate", "constant", "reflect"])
@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_separable_equals_full_kernel(border, dtype):
    rng = np.random.default_rng(6)
    image = random_image(rng, (71, 150), dtype)
    v, h = np.array([1, 4, 6, 4, 1]), np.array([-1, 0, 1])
    sep = filter2d(image, (v, h), border=border, tile=(20, 40), workers=2)
    full = scipy_correlate(image, np.outer(v, h), border)
    if dtype == np.int32:
        np.testing.assert_array_equal(sep, full)
    else:
        assert_float_close(sep, full, image, np.outer(v, h))


@pytest.mark.parametrize("shape", [(1, 1), (1, 300), (300, 1), (2, 2), (5, 3)])
@pytest.mark.parametrize("ksize", [1, 3, 7])
def test_tiny_images_all_borders(shape, ksize):
    """Images smaller than one tile and than the kernel, one-pixel-wide images."""
    rng = np.random.default_rng(7)
    image = random_image(rng, shape, np.int16)
    kernel = rng.integers(-3, 4, size=(ksize, ksize))
    for border in ("replicate", "constant", "reflect"):
        for tile in ("auto", (64, 32), (ksize, ksize)):
            out = filter2d(image, kernel, border=border, tile=tile, workers=2)
            np.testing.assert_array_equal(out, scipy_correlate(image, kernel, border))


def test_out_argument_is_written_in_place():
    image = random_image(np.random.default_rng(8), (40, 50), np.float32)
    out = np.empty((40, 50), np.float32)
    result = filter2d(image, KERNELS["laplace"], out=out)
    assert result is out
    assert_float_close(out, scipy_correlate(image, KERNELS["laplace"], "replicate"), image,
                       KERNELS["laplace"])


def test_non_contiguous_input():
    image = random_image(np.random.default_rng(9), (60, 80), np.int32)[::2, ::3]
    np.testing.assert_array_equal(filter2d(image, KERNELS["sharpen"]),
                                  scipy_correlate(image, KERNELS["sharpen"], "replicate"))


# --- the paper's frame: 3840 x 2160 ------------------------------------------------------

@pytest.fixture(scope="module")
def frame_4k():
    return np.random.default_rng(2160).integers(-2**31, 2**31, size=(2160, 3840),
                                                dtype=np.int32)


@pytest.mark.parametrize("tile, workers", [("auto", None), ((64, 32), 7), ((64, 32), 2)])
def test_4k_int32_exact(frame_4k, tile, workers):
    """Full-range random int32 4K frame, 3x3, paper tiles over 7 'cores' and the fast default."""
    out = filter2d(frame_4k, KERNELS["sharpen"], tile=tile, workers=workers)
    ref = correlate_reference(frame_4k, KERNELS["sharpen"])
    assert np.count_nonzero(out != ref) == 0


def test_4k_paper_method_exact(frame_4k):
    out = filter2d(frame_4k, KERNELS["laplace"], tile=(64, 32), workers=2, method="paper")
    assert np.count_nonzero(out != correlate_reference(frame_4k, KERNELS["laplace"])) == 0


def test_4k_uint8_and_float32_match_cv2():
    rng = np.random.default_rng(3840)
    u8 = random_image(rng, (2160, 3840), np.uint8)
    k5 = rng.integers(-2, 3, size=(5, 5))
    np.testing.assert_array_equal(filter2d(u8, k5, saturate=True),
                                  cv2.filter2D(u8, -1, k5.astype(np.float32),
                                               borderType=cv2.BORDER_REPLICATE))
    f32 = random_image(rng, (2160, 3840), np.float32)
    k3 = KERNELS["gauss"]
    assert_float_close(filter2d(f32, k3), cv2.filter2D(f32, -1, k3,
                                                       borderType=cv2.BORDER_REPLICATE), f32, k3)


# --- errors: argument, what was found, what was expected ---------------------------------

IMG = np.zeros((8, 8), np.uint8)


@pytest.mark.parametrize("kwargs, exc, pattern", [
    ({"kernel": np.ones((4, 4))}, ValueError, r"kernel: found shape \(4, 4\) .*even.*expected odd"),
    ({"kernel": np.ones((3, 2))}, ValueError, r"kernel: found shape \(3, 2\) .*expected odd"),
    ({"kernel": np.ones((0, 3))}, ValueError, r"kernel: found an empty kernel .*\(0, 3\).*expected odd"),
    ({"kernel": []}, ValueError, r"kernel: found an empty kernel"),
    ({"kernel": np.ones((33, 33))}, ValueError,
     rf"kernel: found shape \(33, 33\), expected sides of at most {MAX_KERNEL}"),
    ({"kernel": np.ones(3)}, ValueError, r"kernel: found a 1-D array of shape \(3,\), expected 2-D"),
    ({"kernel": np.ones((3, 3, 3))}, ValueError, r"kernel: found a 3-D array .*expected 2-D"),
    ({"kernel": np.array([[np.nan]])}, ValueError, r"kernel: found non-finite weights"),
    ({"kernel": np.array([["a"]])}, TypeError, r"kernel: found dtype <U1, expected integer or float"),
    ({"kernel": (np.ones(3), np.ones(4))}, ValueError,
     r"kernel\[1\] \(horizontal factor\): found shape \(4,\) .*expected odd"),
    ({"kernel": (np.ones(0), np.ones(3))}, ValueError, r"kernel\[0\] \(vertical factor\): found an empty"),
    ({"image": np.zeros((2, 3, 4, 5), np.uint8)}, ValueError,
     r"image: found a 4-D array of shape \(2, 3, 4, 5\), expected 2-D \(H, W\) or 3-D"),
    ({"image": np.zeros(5, np.uint8)}, ValueError, r"image: found a 1-D array .*expected 2-D"),
    ({"image": np.zeros((0, 5), np.uint8)}, ValueError,
     r"image: found an empty array of shape \(0, 5\), expected at least one pixel"),
    ({"image": np.zeros((4, 4), np.float64)}, TypeError,
     r"image: found dtype float64, expected one of uint8, int16, int32, float32"),
    ({"image": np.zeros((4, 4), np.uint16)}, TypeError, r"image: found dtype uint16"),
    ({"tile": (2, 32)}, ValueError,
     r"tile: found \(2, 32\), smaller than the kernel halo.*halo \(2, 2\).*at least the kernel size \(3, 3\)"),
    ({"tile": (64, 3), "kernel": np.ones((5, 5))}, ValueError,
     r"tile: found \(64, 3\), smaller than the kernel halo.*at least the kernel size \(5, 5\)"),
    ({"tile": "big"}, ValueError, r"tile: found 'big', expected 'auto' or \(rows, cols\)"),
    ({"tile": (0, 8)}, ValueError, r"tile: found \(0, 8\), expected two positive integers"),
    ({"tile": (8.5, 8)}, ValueError, r"tile: found \(8.5, 8\), expected two positive integers"),
    ({"tile": 8}, ValueError, r"tile: found 8, expected 'auto' or a pair"),
    ({"border": "wrap"}, ValueError, r"border: found 'wrap', expected one of \('replicate'"),
    ({"workers": 0}, ValueError, r"workers: found 0, expected a positive integer or None"),
    ({"workers": 1.5}, ValueError, r"workers: found 1.5, expected a positive integer"),
    ({"method": "fast"}, ValueError, r"method: found 'fast', expected one of \('direct', 'paper'\)"),
    ({"method": "paper", "border": "reflect"}, ValueError,
     r"border: found 'reflect' with method='paper', expected 'replicate'"),
    ({"out": np.empty((8, 8), np.float32)}, ValueError,
     r"out: found float32 array of shape \(8, 8\), expected a C-contiguous int32 array"),
])
def test_errors_name_argument_found_and_expected(kwargs, exc, pattern):
    args = {"image": IMG, "kernel": KERNELS["sharpen"], **kwargs}
    with pytest.raises(exc, match=pattern):
        filter2d(**args)


# ----------------------------------------------------------------------------- issue 11

def test_one_shared_pool_whatever_the_workers_value():
    """workers = 1..200 used to leave a thread pool per value (3,099 threads)."""
    import threading

    from tilefuse.imaging import filter2d
    img = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)
    k = np.ones((3, 3), np.float32) / 9
    ways = [{}, {"method": "paper"}, {"algorithm": "linebuffer"}]
    want = [filter2d(img, k, workers=1, **kw) for kw in ways]
    before = threading.active_count()
    for w in range(1, 201, 7):
        for kw, y in zip(ways, want):
            np.testing.assert_allclose(filter2d(img, k, workers=w, **kw), y, rtol=1e-6, atol=1e-6)
    from tilefuse.kernels.threads import cpu_count
    assert threading.active_count() <= before + max(2, cpu_count())


@pytest.mark.parametrize("algorithm", ["tiled", "linebuffer"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_out_may_be_the_input(algorithm, dtype):
    from tilefuse.imaging import filter2d
    rng = np.random.default_rng(1)
    img = rng.integers(-50, 50, (37, 29)).astype(dtype)
    k = np.array([[0, -1, 0], [-1, 5, -1], [0, -1, 0]], dtype)
    want = filter2d(img, k, algorithm=algorithm)
    a = img.copy()
    got = filter2d(a, k, out=a, algorithm=algorithm)
    assert got is a
    np.testing.assert_array_equal(a, want)
    b = img.copy()          # out overlapping the image without being it
    view = b.reshape(-1)[:b.size].reshape(b.shape)
    filter2d(b, k, out=view, algorithm=algorithm)
    np.testing.assert_array_equal(view, want)
