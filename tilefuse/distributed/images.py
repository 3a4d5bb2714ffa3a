"""Images in, classes out: the pre- and post-processing of `tilefuse batch` and `Predictor`.

    prep = ImagePreprocess(size=224, channels=3)          # ImageNet mean / std by default
    x = prep(("cat.jpg", data))                           # PNG/JPEG bytes -> (3, 224, 224) float32
    classes, scores = TopK(5)(y)                          # a sample's output row -> top 5

Decoding: Pillow (imported on first use: `pip install 'tilefuse[distributed]'`), PNG and JPEG
only, fully decoded before use (a truncated file is an error, not a half-grey image); images
larger than Pillow's decompression-bomb limit are refused. Grayscale, palette and RGBA images
are converted to the channel count the model takes (RGB for 3, L for 1). Resize "crop" scales
the shorter side to `size` (bilinear) and cuts the centre square; "stretch" scales both sides
to `size`. Normalize: x / 255, minus mean, divided by std, per channel, HWC -> CHW.
The callables are plain classes so Ray can send them to workers.
"""
from __future__ import annotations

import io
import warnings
from typing import Sequence

import numpy as np

from ..errors import TilefuseError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
RESIZE_MODES = ("crop", "stretch")


class ImageError(TilefuseError, ValueError):
    """A file that is not a readable PNG/JPEG image; the message says why."""


def import_pillow():
    try:
        from PIL import Image
    except ImportError as e:
        raise ImageError(f"reading images needs Pillow, which is not installed ({e}); "
                         f"pip install 'tilefuse[distributed]'") from None
    return Image


def decode(data: bytes, channels: int = 3):
    """PNG/JPEG bytes -> a fully decoded PIL image in mode RGB (channels=3) or L (channels=1)."""
    Image = import_pillow()
    if channels not in (1, 3):
        raise ImageError(f"images give 1 or 3 channels, the model takes {channels}")
    if not data:
        raise ImageError("empty file")
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            img = Image.open(io.BytesIO(data), formats=["PNG", "JPEG"])
            img.load()
        except Image.DecompressionBombError as e:
            raise ImageError(f"image too large: {e}") from None
        except Image.DecompressionBombWarning as e:
            raise ImageError(f"image too large: {e}") from None
        except Image.UnidentifiedImageError:
            raise ImageError("not a readable PNG/JPEG image (the data is neither)") from None
        except Exception as e:   # truncated data, bad chunks, bad Huffman tables ...
            raise ImageError(f"not a readable PNG/JPEG image ({type(e).__name__}: {e})") from None
    if img.width < 1 or img.height < 1:
        raise ImageError(f"image has size {img.width}x{img.height}")
    if img.mode in ("P", "PA"):                              # palette (maybe with transparency)
        img = img.convert("RGBA")
    return img.convert("RGB" if channels == 3 else "L")


def resize(img, size: int, mode: str = "crop"):
    """Scale to size x size: "crop" (shorter side to size, centre square) or "stretch"."""
    Image = import_pillow()
    if mode == "stretch":
        return img.resize((size, size), Image.BILINEAR)
    if mode != "crop":
        raise ValueError(f"resize mode must be one of {RESIZE_MODES}, got {mode!r}")
    w, h = img.size
    s = size / min(w, h)
    nw, nh = max(size, round(w * s)), max(size, round(h * s))
    img = img.resize((nw, nh), Image.BILINEAR)
    left, top = (nw - size) // 2, (nh - size) // 2
    return img.crop((left, top, left + size, top + size))


def normalize(pixels: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """uint8 pixels (H, W, C) or (H, W) -> float32 (C, H, W): (x / 255 - mean) / std."""
    a = np.asarray(pixels)
    if a.ndim == 2:
        a = a[:, :, None]                                   # (H, W) -> (H, W, 1)
    if a.ndim != 3 or a.shape[2] != len(mean) or len(mean) != len(std):
        raise ImageError(f"pixels have shape {a.shape}, expected (H, W, {len(mean)}) for "
                         f"{len(mean)} mean and {len(std)} std values")
    x = a.astype(np.float32) / np.float32(255)
    x = (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))       # (H, W, C) -> (C, H, W)


def default_mean_std(channels: int, mean=None, std=None) -> tuple[tuple, tuple]:
    if mean is None and std is None and channels == 3:
        return IMAGENET_MEAN, IMAGENET_STD
    if mean is None or std is None or len(mean) != channels or len(std) != channels:
        raise ImageError(f"the model takes {channels} channels: give {channels} mean and {channels} std "
                         f"values (got mean {mean}, std {std})")
    if any(s <= 0 for s in std):
        raise ImageError(f"std values must be positive, got {std}")
    return tuple(mean), tuple(std)


class ImagePreprocess:
    """(name, bytes) or bytes -> (C, size, size) float32, ready for the model."""

    def __init__(self, size: int, channels: int = 3, mean=None, std=None, resize: str = "crop"):
        if size < 1:
            raise ValueError(f"image size must be positive, got {size}")
        if resize not in RESIZE_MODES:
            raise ValueError(f"resize mode must be one of {RESIZE_MODES}, got {resize!r}")
        self.size, self.channels, self.resize_mode = size, channels, resize
        self.mean, self.std = default_mean_std(channels, mean, std)

    def __call__(self, item) -> np.ndarray:
        data = item[1] if isinstance(item, tuple) else item
        if isinstance(data, BaseException):         # the file could not even be read
            raise ImageError(str(data))
        img = resize(decode(data, self.channels), self.size, self.resize_mode)
        return normalize(np.asarray(img), self.mean, self.std)


def softmax(y: np.ndarray) -> np.ndarray:
    z = np.asarray(y, np.float64)
    z = np.exp(z - z.max())
    return z / z.sum()


class TopK:
    """A sample's output -> (class indices, scores), best first, ties by lower index.
    softmax=True turns logits into probabilities first."""

    def __init__(self, k: int = 5, softmax: bool = True):
        if k < 1:
            raise ValueError(f"top-k needs k >= 1, got {k}")
        self.k, self.softmax = k, softmax

    def __call__(self, y) -> tuple[np.ndarray, np.ndarray]:
        if isinstance(y, list):
            raise ImageError(f"top-k takes a model with one output, this one has {len(y)}")
        s = np.asarray(y).reshape(-1)                       # (classes,) or (classes, 1, 1) -> (classes,)
        if self.softmax:
            s = softmax(s)
        order = np.argsort(-s, kind="stable")[:self.k]
        return order.astype(np.int64), s[order].astype(np.float64)
