"""Tiled large-image filtering (issue 4, seed 001): OpenCV-style 2-D correlation of big frames
cut into overlapping tiles that are spread over the CPU's cores, plus a 3-stage frame stream.

    >>> from tilefuse.imaging import filter2d, KERNELS
    >>> out = filter2d(frame, KERNELS["sobel-x"])          # int32 for integer frames, exact
"""

import numpy as np

from .checks import DTYPES, MAX_KERNEL, accumulator_dtype, saturate_cast
from .filter import filter2d
from .reference import BORDERS, correlate_reference
from .stream import FrameTiming, StreamReport, filter_stream
from .tiles import Tile, plan_tiles

# Named 3x3 kernels of the CLI. box and gauss are normalised (float32 results, or saturate back
# to the image dtype); the others are integer kernels, so integer images are filtered exactly.
KERNELS = {
    "box": np.full((3, 3), 1.0 / 9.0, dtype=np.float32),
    "gauss": (np.outer([1, 2, 1], [1, 2, 1]) / 16.0).astype(np.float32),
    "sharpen": np.array([[0, -1, 0], [-1, 5, -1], [0, -1, 0]], dtype=np.int32),
    "sobel-x": np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], dtype=np.int32),
    "sobel-y": np.array([[-1, -2, -1], [0, 0, 0], [1, 2, 1]], dtype=np.int32),
    "laplace": np.array([[0, 1, 0], [1, -4, 1], [0, 1, 0]], dtype=np.int32),
}

__all__ = [
    "BORDERS", "DTYPES", "KERNELS", "MAX_KERNEL", "FrameTiming", "StreamReport", "Tile",
    "accumulator_dtype", "correlate_reference", "filter2d", "filter_stream", "plan_tiles",
    "saturate_cast",
]
