"""`tilefuse filter`: filter an image file, or run the 4K frame-stream bench (seed 001, fig. 4).

    tilefuse filter IN OUT --kernel {box,gauss,sharpen,sobel-x,sobel-y,laplace}|FILE.npy
                    [--border replicate] [--tile 64x32|auto] [--workers N] [--saturate]
    tilefuse filter --bench [--frames 100] [--size 3840x2160] [--kernel sharpen] [--overlap]

Files: .npy (any supported dtype), .png and .tif/.tiff through Pillow (optional dependency,
imported only here). PNG output holds 8-bit pixels, so integer results are saturated back to
uint8 for PNG (as OpenCV's ``filter2D(src, -1, ...)`` does); TIFF holds 2-D int32 / float32
results as they are. ``--tile RxC`` is rows x columns of input pixels, halo included.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from . import KERNELS
from .checks import saturate_cast
from .filter import filter2d
from .reference import BORDERS, correlate_reference
from .stream import StreamReport, filter_stream

IMAGE_SUFFIXES = (".png", ".tif", ".tiff")
PAPER = {"copy_in_ms": 11.642862, "compute_ms": 62.967593, "copy_out_ms": 12.989634,
         "total_ms": 87.600089, "fps": 11.42}  # seed 001, figure 4


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``filter`` subcommand to an argparse ``subparsers`` object."""
    p = subparsers.add_parser("filter", help="tiled 2-D filtering of an image, or the 4K bench",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", nargs="?", help="input image (.png, .tif, .tiff, .npy)")
    p.add_argument("output", nargs="?", help="output image (.png, .tif, .tiff, .npy)")
    p.add_argument("--kernel", default=None,
                   help=f"one of {', '.join(KERNELS)} or a .npy file (default: sharpen)")
    p.add_argument("--border", default="replicate", choices=BORDERS)
    p.add_argument("--tile", default="auto", help="RxC input pixels per tile, or auto")
    p.add_argument("--workers", type=int, default=None, help="threads (default: all cores)")
    p.add_argument("--method", default="direct", choices=("direct", "paper"))
    p.add_argument("--saturate", action="store_true",
                   help="cast integer results back to the input dtype (always for PNG output)")
    p.add_argument("--bench", action="store_true",
                   help="stream random int32 frames, check each against the reference")
    p.add_argument("--frames", type=int, default=100, help="bench: number of frames")
    p.add_argument("--size", default="3840x2160", help="bench: frame WIDTHxHEIGHT")
    p.add_argument("--overlap", action="store_true",
                   help="bench: overlap the three stages on threads (default: one after another)")
    p.add_argument("--seed", type=int, default=0, help="bench: random seed")
    p.set_defaults(func=run)
    return p


def _pair(text: str, name: str) -> tuple[int, int]:
    try:
        a, b = (int(s) for s in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"{name}: found {text!r}, expected two integers like 64x32") from None
    return a, b


def _load_kernel(spec: str | None):
    if spec is None:
        return KERNELS["sharpen"]
    if spec in KERNELS:
        return KERNELS[spec]
    if spec.endswith(".npy"):
        return read_npy(spec, "--kernel")
    raise ValueError(f"--kernel: found {spec!r}, expected one of {', '.join(KERNELS)} "
                     "or a .npy file")


def _pillow():
    try:
        from PIL import Image
    except ImportError:
        raise RuntimeError("reading and writing PNG / TIFF needs Pillow, which is not "
                           "installed: pip install pillow (or use .npy files)") from None
    return Image


def read_npy(path: str, what: str = "input") -> np.ndarray:
    """A .npy file's array, its header checked against the file before anything is allocated: a
    header that claims more data than the file holds (or less) is refused by name instead of
    allocating what it claims; object arrays are refused (never unpickled)."""
    fmt = np.lib.format
    with open(path, "rb") as f:
        try:
            version = fmt.read_magic(f)
            read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, _, dtype = read_header(f)
        except (ValueError, EOFError, SyntaxError) as e:
            raise ValueError(f"{what}: {path!r} is not a readable .npy file ({e})") from None
        if dtype.hasobject:
            raise ValueError(f"{what}: {path!r} holds Python objects (dtype {dtype}), expected numbers; "
                             "object arrays are never unpickled")
        if any(d < 0 for d in shape):
            raise ValueError(f"{what}: {path!r} declares shape {shape}, expected sizes >= 0")
        need = int(np.prod(shape, dtype=object)) * dtype.itemsize
        have = os.fstat(f.fileno()).st_size - f.tell()
        if need != have:
            raise ValueError(f"{what}: {path!r} declares a {dtype} array of shape {shape} ({need} bytes) but "
                             f"holds {have} bytes after its header (truncated or not a .npy file)")
        f.seek(0)
        arr = fmt.read_array(f, allow_pickle=False)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))          # a big-endian file: the same values, native order
    return arr


def read_image(path: str) -> np.ndarray:
    """A .npy, .png or .tif image as an array (16-bit images become int32). Pillow's
    decompression-bomb limit is an error here, and a multi-page TIFF is refused (only one image
    is filtered)."""
    suffix = Path(path).suffix.lower()
    if suffix == ".npy":
        return read_npy(path)
    if suffix not in IMAGE_SUFFIXES:
        raise ValueError(f"input: found suffix {suffix!r} in {path!r}, expected .npy, "
                         f"{', '.join(IMAGE_SUFFIXES)}")
    Image = _pillow()
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            with Image.open(path) as im:
                return _image_array(im, path)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
            raise ValueError(f"input: {path!r} is too large to read safely ({e})") from None


def _image_array(im, path: str) -> np.ndarray:
    """An open Pillow image's pixels (1-bit and palette images expanded)."""
    frames = getattr(im, "n_frames", 1)
    if frames != 1:
        raise ValueError(f"input: {path!r} holds {frames} images (pages or frames), expected one; "
                         "split it first (or pass one page as .npy)")
    if im.mode in ("1", "LA"):
        im = im.convert("L")
    elif im.mode in ("P", "PA"):
        im = im.convert("RGBA" if im.mode == "PA" or "transparency" in im.info else "RGB")
    arr = np.asarray(im)
    if arr.dtype in (np.uint16, np.dtype(">u2"), np.dtype("<u2")):
        arr = arr.astype(np.int32)  # uint16 is not a filter2d dtype; int32 holds it exactly
    return arr


def write_image(path: str, arr: np.ndarray) -> None:
    suffix = Path(path).suffix.lower()
    if suffix == ".npy":
        np.save(path, arr)
        return
    if suffix not in IMAGE_SUFFIXES:
        raise ValueError(f"output: found suffix {suffix!r} in {path!r}, expected .npy, "
                         f"{', '.join(IMAGE_SUFFIXES)}")
    Image = _pillow()
    if arr.dtype != np.uint8 and (arr.ndim == 3 or suffix == ".png"):
        raise ValueError(f"output: found a {arr.dtype} {arr.shape} result, which {suffix} "
                         "cannot hold; expected uint8 (an 8-bit input, or --saturate), "
                         "or write .tif (2-D) / .npy")
    Image.fromarray(np.ascontiguousarray(arr)).save(path)


def _filter_file(args) -> int:
    if not args.input or not args.output:
        raise ValueError("input/output: expected IN and OUT paths (or --bench)")
    image = read_image(args.input)
    kernel = _load_kernel(args.kernel)
    tile = args.tile if args.tile == "auto" else _pair(args.tile, "--tile")
    png = Path(args.output).suffix.lower() == ".png"
    t0 = time.perf_counter()
    out = filter2d(image, kernel, border=args.border, tile=tile, workers=args.workers,
                   method=args.method)
    ms = (time.perf_counter() - t0) * 1e3
    if (args.saturate or png) and image.dtype.kind in "iu":
        out = saturate_cast(out, image.dtype)
    write_image(args.output, out)
    print(f"{args.input} {image.dtype}{list(image.shape)} -> {args.output} "
          f"{out.dtype}{list(out.shape)} in {ms:.1f} ms (including numba load/compile)")
    return 0


def _bench(args) -> int:
    width, height = _pair(args.size, "--size")
    if args.frames < 1:
        raise ValueError(f"--frames: found {args.frames}, expected at least 1")
    kernel = _load_kernel(args.kernel)
    tile = args.tile if args.tile == "auto" else _pair(args.tile, "--tile")
    rng = np.random.default_rng(args.seed)
    # compile (or load from numba's cache) before timing anything
    filter2d(np.zeros((16, 16), np.int32), kernel, border=args.border, tile="auto",
             workers=args.workers)
    frames = (rng.integers(-2**31, 2**31, size=(height, width), dtype=np.int32)
              for _ in range(args.frames))
    report = StreamReport()
    errors_total = 0
    stream = filter_stream(frames, kernel, border=args.border, tile=tile,
                           workers=args.workers, overlap=args.overlap, report=report)
    print(f"{args.frames} random int32 frames {width}x{height}, kernel "
          f"{args.kernel or 'sharpen'}, tile {tile}, workers {args.workers or 'all'}, "
          f"stages {'overlapped' if args.overlap else 'one after another'}")
    check_rng = np.random.default_rng(args.seed)  # regenerates the same frames for checking
    for item in stream:
        frame = check_rng.integers(-2**31, 2**31, size=(height, width), dtype=np.int32)
        errors = int(np.count_nonzero(item.output != correlate_reference(frame, kernel,
                                                                         args.border)))
        errors_total += errors
        t = item.timing
        print(f"IMG {item.index + 1}/{args.frames} : errors {errors}  copy-in "
              f"{t.copy_in_ms:.2f} ms  compute {t.compute_ms:.2f} ms  copy-out "
              f"{t.copy_out_ms:.2f} ms")
    print("===== END =====")
    print(f"Average copy-in (host -> device buffer): {report.mean('copy_in_ms'):.3f} ms "
          f"(paper {PAPER['copy_in_ms']:.2f})")
    print(f"Average copy-out (device buffer -> host): {report.mean('copy_out_ms'):.3f} ms "
          f"(paper {PAPER['copy_out_ms']:.2f})")
    print(f"Average tiled compute with reassembly: {report.mean('compute_ms'):.3f} ms "
          f"(paper AIE & PL {PAPER['compute_ms']:.2f})")
    print(f"Total per frame: {report.mean('total_ms'):.3f} ms (paper {PAPER['total_ms']:.1f})")
    print(f"errors: {errors_total} in {args.frames} frames")
    print(f"{report.sequential_fps:.2f} fps (1000 / total; paper {PAPER['fps']}), "
          f"{report.sequential_fps / PAPER['fps']:.1f}x the paper")
    return 0 if errors_total == 0 else 1


def run(args) -> int:
    """Handler of ``tilefuse filter``: exit code 0 on success, 1 on a failed bench check,
    2 on bad arguments or files."""
    try:
        return _bench(args) if args.bench else _filter_file(args)
    except (ValueError, TypeError, RuntimeError, OSError) as exc:
        print(f"tilefuse filter: error: {exc}", file=sys.stderr)
        return 2
