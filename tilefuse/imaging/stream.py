"""`filter_stream`: frames through a 3-stage pipeline, timed per stage (seed 001, figure 4).

Stages, each on its own thread (the runtime's `iter_pipeline`, the same one behind
`Session.run_many`), connected by bounded queues over a ring of ``depth`` preallocated
"device" buffer pairs:

1. copy-in: the host frame is copied into a free device input buffer (paper: host -> board DDR);
2. compute: tiled ``filter2d`` from the device input into a device output buffer, reassembly
   included (paper: PL tiler + AI Engine cores + PL gatherer);
3. copy-out: the device output is copied into a fresh host array (paper: board DDR -> host).

With ``overlap=True`` (default), while frame n is computed frame n + 1 is copied in and frame
n - 1 copied out, so the wall time per frame approaches the slowest stage rather than the sum
(the double buffering the paper names as its next step); on a machine with few cores the
stages then compete for cores and memory bandwidth, which inflates each stage's own time.
With ``overlap=False`` the three stages run one after another in the calling thread, which
measures each stage cleanly, as the paper's figure 4 does. Either way each frame's three stage
times are recorded; the paper's "total execution time" is their sum.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import numpy as np

from ..runtime.stages import iter_pipeline
from .checks import accumulator_dtype, check_image, check_kernel, saturate_cast
from .filter import filter2d

@dataclass(frozen=True)
class FrameTiming:
    """Milliseconds one frame spent in each stage."""

    index: int
    copy_in_ms: float
    compute_ms: float
    copy_out_ms: float

    @property
    def total_ms(self) -> float:
        """Sum of the stages: the paper's per-frame "total execution time"."""
        return self.copy_in_ms + self.compute_ms + self.copy_out_ms


@dataclass(frozen=True)
class StreamFrame:
    index: int
    output: np.ndarray
    timing: FrameTiming


@dataclass
class StreamReport:
    """Per-frame timings and the wall time of the whole stream."""

    timings: list[FrameTiming] = field(default_factory=list)
    wall_s: float = 0.0

    def mean(self, stage: str) -> float:
        """Average milliseconds of ``stage`` ('copy_in_ms', 'compute_ms', 'copy_out_ms',
        'total_ms') over the frames."""
        return float(np.mean([getattr(t, stage) for t in self.timings])) if self.timings else 0.0

    @property
    def sequential_fps(self) -> float:
        """Frames per second if the stages ran one after another (the paper's 11.42 fps)."""
        total = self.mean("total_ms")
        return 1000.0 / total if total > 0 else 0.0

    @property
    def pipelined_fps(self) -> float:
        """Frames per second actually achieved by the overlapped pipeline (wall clock)."""
        return len(self.timings) / self.wall_s if self.wall_s > 0 else 0.0


def filter_stream(frames: Iterable[np.ndarray], kernel, border: str = "replicate", tile="auto",
                  workers: int | None = None, saturate: bool = False, depth: int = 2,
                  overlap: bool = True, report: StreamReport | None = None
                  ) -> Iterator[StreamFrame]:
    """Filter each frame of ``frames`` (all the same shape and dtype) through the pipeline.

    Yields ``StreamFrame(index, output, timing)`` in order. Arguments as ``filter2d``; ``depth``
    is the number of device buffers per direction (2 = double buffering); ``overlap`` picks
    threaded stages or one-after-another (see module doc). If ``report`` is given, timings and
    the wall time so far (including the consumer's own time between frames) are recorded in it
    as frames come out.
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth: found {depth!r}, expected a positive integer")
    source = iter(frames)
    try:
        first = check_image(next(source))
    except StopIteration:
        return
    k2d, sep = check_kernel(kernel)
    acc = accumulator_dtype(first.dtype, kernel if sep is None else sep)
    # "device memory": a ring of input and output buffers reused frame after frame
    # (touched now, so first-use page faults are not billed to frame 0's copies)
    dev_in = [np.ones(first.shape, first.dtype) for _ in range(depth)]
    dev_out = [np.ones(first.shape, acc) for _ in range(depth)]
    if not overlap:
        yield from _sequential(first, source, kernel, border, tile, workers, saturate,
                               dev_in[0], dev_out[0], report)
        return

    def copy_in(item, slot, _):
        index, frame = item
        frame = np.asarray(frame)
        if frame.shape != first.shape or frame.dtype != first.dtype:
            raise ValueError(f"frames[{index}]: found {frame.dtype} {frame.shape}, "
                             f"expected {first.dtype} {first.shape} like frame 0")
        np.copyto(slot[0], frame)

    def compute(item, slot, _):
        filter2d(slot[0], kernel, border=border, tile=tile, workers=workers, out=slot[1])

    def copy_out(item, slot, _):
        return slot[1].copy()

    # the runtime's pipeline: one thread per stage, `depth` buffer pairs in flight
    start = time.perf_counter()
    for index, host, secs in iter_pipeline(enumerate(_chain(first, source)), [copy_in, compute, copy_out],
                                           list(zip(dev_in, dev_out)),
                                           names=["copy-in", "compute", "copy-out"]):
        if saturate and first.dtype.kind in "iu":
            host = saturate_cast(host, first.dtype)
        timing = FrameTiming(index, *(1e3 * t for t in secs))
        if report is not None:
            report.timings.append(timing)
            report.wall_s = time.perf_counter() - start
        yield StreamFrame(index, host, timing)


def _sequential(first, source, kernel, border, tile, workers, saturate, dev_in, dev_out, report):
    """The three stages one after another per frame, in the calling thread."""
    start = time.perf_counter()
    for index, frame in enumerate(_chain(first, source)):
        frame = np.asarray(frame)
        if frame.shape != first.shape or frame.dtype != first.dtype:
            raise ValueError(f"frames[{index}]: found {frame.dtype} {frame.shape}, "
                             f"expected {first.dtype} {first.shape} like frame 0")
        t0 = time.perf_counter()
        np.copyto(dev_in, frame)
        t1 = time.perf_counter()
        filter2d(dev_in, kernel, border=border, tile=tile, workers=workers, out=dev_out)
        t2 = time.perf_counter()
        host = dev_out.copy()
        t3 = time.perf_counter()
        if saturate and first.dtype.kind in "iu":
            host = saturate_cast(host, first.dtype)
        timing = FrameTiming(index, (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3)
        if report is not None:
            report.timings.append(timing)
            report.wall_s = time.perf_counter() - start
        yield StreamFrame(index, host, timing)


def _chain(first, rest):
    yield first
    yield from rest
