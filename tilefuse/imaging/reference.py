"""Plain numpy 2-D correlation: the executable spec of `filter2d`.

Semantics are OpenCV's ``filter2D`` (correlation, not convolution: the kernel is not flipped,
anchor at the kernel centre). Everything here is written for clarity, not speed; the tiled numba
kernels in ``kernels.py`` must agree with it exactly for integers and to float32 rounding for
float32.

Border modes (index ``i`` outside ``[0, n)`` is mapped by ``border_index``):

- ``"replicate"``: clamp to the nearest edge pixel, ``aaa|abcd|ddd``
  (OpenCV ``BORDER_REPLICATE``, scipy ``mode="nearest"``, numpy ``pad(mode="edge")``).
- ``"constant"``: zero outside the image, ``000|abcd|000``
  (OpenCV ``BORDER_CONSTANT`` with value 0, scipy ``mode="constant", cval=0``).
- ``"reflect"``: reflection *without* repeating the edge pixel, ``dcb|abcd|cba``
  (OpenCV ``BORDER_REFLECT_101``, which is OpenCV's default; scipy ``mode="mirror"``;
  numpy ``pad(mode="reflect")``). Reflection repeats with period ``2n - 2`` when the kernel is
  larger than the image; a one-pixel axis maps everything to pixel 0.
"""

from __future__ import annotations

import numpy as np

BORDERS = ("replicate", "constant", "reflect")
BORDER_CODES = {name: code for code, name in enumerate(BORDERS)}  # numba kernels take the code


def border_index(i: int, n: int, border: str) -> int:
    """Image index that position ``i`` reads on an axis of length ``n``; -1 means zero."""
    if 0 <= i < n:
        return i
    if border == "replicate":
        return 0 if i < 0 else n - 1
    if border == "constant":
        return -1
    if border == "reflect":
        if n == 1:
            return 0
        period = 2 * n - 2
        i %= period
        return period - i if i >= n else i
    raise ValueError(f"border: found {border!r}, expected one of {BORDERS}")


def border_indices(start: int, stop: int, n: int, border: str) -> np.ndarray:
    """``border_index`` for every position in ``range(start, stop)``, as an int64 array."""
    return np.array([border_index(i, n, border) for i in range(start, stop)], dtype=np.int64)


def extend(image: np.ndarray, top: int, bottom: int, left: int, right: int, border: str) -> np.ndarray:
    """The 2-D ``image`` grown by the given margins, the new pixels following ``border``."""
    h, w = image.shape
    rows = border_indices(-top, h + bottom, h, border)
    cols = border_indices(-left, w + right, w, border)
    # (h, w) -> (h + top + bottom, w + left + right); index -1 reads a zero
    padded = np.zeros((rows.size, cols.size), dtype=image.dtype)
    keep_r, keep_c = rows >= 0, cols >= 0
    padded[np.ix_(keep_r, keep_c)] = image[np.ix_(rows[keep_r], cols[keep_c])]
    return padded


def correlate_valid(padded: np.ndarray, kernel: np.ndarray, acc_dtype) -> np.ndarray:
    """'Valid' correlation: output (H - kh + 1, W - kw + 1), summed in ``acc_dtype``.

    Integer accumulation wraps modulo 2**32 exactly as int32 hardware (and numpy int32) does.
    """
    kh, kw = kernel.shape
    oh, ow = padded.shape[0] - kh + 1, padded.shape[1] - kw + 1
    out = np.zeros((oh, ow), dtype=acc_dtype)
    src = padded.astype(acc_dtype, copy=False)
    weights = kernel.astype(acc_dtype)
    for dy in range(kh):
        for dx in range(kw):
            out += weights[dy, dx] * src[dy:dy + oh, dx:dx + ow]
    return out


def correlate_reference(image: np.ndarray, kernel: np.ndarray, border: str = "replicate",
                        acc_dtype=None) -> np.ndarray:
    """Correlate a 2-D or HxWxC ``image`` with an odd ``kernel`` (kh, kw), per channel.

    ``acc_dtype`` defaults to int32 when the image is integer and the kernel holds integers,
    float32 otherwise. No validation beyond what the arithmetic needs: ``filter2d`` validates.
    """
    image = np.asarray(image)
    kernel = np.asarray(kernel)
    if acc_dtype is None:
        integral = image.dtype.kind in "iu" and np.all(kernel == np.round(kernel))
        acc_dtype = np.int32 if integral else np.float32
    if image.ndim == 3:
        # (H, W, C) -> C x (H, W) -> (H, W, C)
        return np.stack([correlate_reference(image[..., c], kernel, border, acc_dtype)
                         for c in range(image.shape[2])], axis=-1)
    hy, hx = kernel.shape[0] // 2, kernel.shape[1] // 2
    padded = extend(image, hy, hy, hx, hx, border)
    return correlate_valid(padded, kernel, acc_dtype)
