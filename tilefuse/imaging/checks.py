"""Argument checks and dtype rules shared by the 2-D filters (`filter.py`'s tiled `filter2d`,
`linebuffer.py`'s `filter2d_linebuffer`, `stream.py`'s `filter_stream`).

Errors say what was found and what was expected, naming the argument.
"""
from __future__ import annotations

import numpy as np

from ..kernels.threads import cpu_count

DTYPES = (np.dtype(np.uint8), np.dtype(np.int16), np.dtype(np.int32), np.dtype(np.float32))
MAX_KERNEL = 31  # per side; direct correlation costs kh*kw per pixel, beyond this use an FFT


def check_image(image) -> np.ndarray:
    """The image as an array, or a ValueError / TypeError naming what is wrong."""
    arr = np.asarray(image)
    if arr.ndim not in (2, 3):
        raise ValueError(f"image: found a {arr.ndim}-D array of shape {arr.shape}, "
                         "expected 2-D (H, W) or 3-D (H, W, C)")
    if arr.size == 0:
        raise ValueError(f"image: found an empty array of shape {arr.shape}, "
                         "expected at least one pixel")
    if arr.dtype not in DTYPES:
        raise TypeError(f"image: found dtype {arr.dtype}, expected one of "
                        f"{', '.join(str(d) for d in DTYPES)}")
    return arr


def _check_kernel_array(k, name: str, ndim: int) -> np.ndarray:
    arr = np.asarray(k)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{name}: found dtype {arr.dtype}, expected integer or float weights")
    if arr.size == 0:
        raise ValueError(f"{name}: found an empty kernel of shape {arr.shape}, "
                         "expected odd sides (1, 3, 5, 7, ...)")
    if arr.ndim != ndim:
        raise ValueError(f"{name}: found a {arr.ndim}-D array of shape {arr.shape}, "
                         f"expected {ndim}-D")
    if any(s % 2 == 0 for s in arr.shape):
        raise ValueError(f"{name}: found shape {arr.shape} with an even side, "
                         "expected odd sides (1, 3, 5, 7, ...) so the kernel has a centre")
    if any(s > MAX_KERNEL for s in arr.shape):
        raise ValueError(f"{name}: found shape {arr.shape}, expected sides of at most "
                         f"{MAX_KERNEL} (direct correlation; use an FFT for larger kernels)")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: found non-finite weights (nan or inf), expected finite ones")
    return arr


def check_kernel(kernel) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """(2-D kernel, separable factors or None). A tuple of two 1-D arrays ``(v, h)`` is the
    separable kernel ``outer(v, h)``: ``v`` runs down the rows, ``h`` along the columns."""
    if isinstance(kernel, tuple) and len(kernel) == 2 and all(np.ndim(f) == 1 for f in kernel):
        v = _check_kernel_array(kernel[0], "kernel[0] (vertical factor)", 1)
        h = _check_kernel_array(kernel[1], "kernel[1] (horizontal factor)", 1)
        return np.outer(v, h), (v, h)
    return _check_kernel_array(kernel, "kernel", 2), None


def _is_integral(arr: np.ndarray) -> bool:
    if arr.dtype.kind in "biu":
        return bool(np.all((arr >= -2**31) & (arr < 2**31)))
    return bool(np.all(arr == np.round(arr)) and np.all(np.abs(arr) < 2**31))


def accumulator_dtype(image_dtype, kernel) -> np.dtype:
    """int32 for an integer image and integer-valued kernel (exact), float32 otherwise."""
    kernels_ = kernel if isinstance(kernel, tuple) else (kernel,)
    if np.dtype(image_dtype).kind in "iu" and all(_is_integral(np.asarray(k)) for k in kernels_):
        return np.dtype(np.int32)
    return np.dtype(np.float32)


def check_workers(workers) -> int:
    if workers is None:
        return cpu_count()
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise ValueError(f"workers: found {workers!r}, expected a positive integer or None")
    return int(workers)


def saturate_cast(result: np.ndarray, dtype) -> np.ndarray:
    """Round half to even and clip to ``dtype``'s range (OpenCV's saturate_cast)."""
    info = np.iinfo(dtype)
    if result.dtype.kind == "f":
        result = np.rint(result)
    return np.clip(result, info.min, info.max).astype(dtype)


def check_out(out, shape, acc) -> np.ndarray:
    """A new result array, or the caller's `out` if it is C-contiguous with the right shape/dtype."""
    if out is None:
        return np.empty(shape, dtype=acc)
    if out.shape != shape or out.dtype != acc or not out.flags.c_contiguous:
        raise ValueError(f"out: found {out.dtype} array of shape {out.shape}, expected a "
                         f"C-contiguous {acc} array of shape {shape}")
    return out
