"""Streaming execution for large images (issue 6, seed 003): line buffers and a layer pipeline.

    from tilefuse.stream import compile_stream
    s = compile_stream(net, band_rows=4)          # workers=2: the layer pipeline over 2 threads
    y = s.run(x)                                   # numpy NCHW in, the network's outputs out
    print(s.plan())                                # rows each layer holds, bytes, stage split

The network goes through the same passes as `tilefuse.compile` (BN folded, ReLU and residual
adds fused into conv epilogues); then every conv, pooling and element-wise op on the input side
streams: bands of rows flow depth-first through the whole streamed part, each tensor held in a
ring of a few rows (`schedule.py`, `ring.py`, `executor.py`), float32 convs on the fast kernels
of `kernels/conv` (`bands.py`); global pooling / linear / softmax end it and run on whole tensors. `docs/streaming.md` has the details and the numbers.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from ..compiler.passlist import run_passes
from ..errors import GraphError
from ..ir import Network
from .executor import StreamExecutor, prepare_input, run_tail
from .layer_pipeline import PipelineExecutor, balance_stages
from .plan import StreamPlan, make_plan
from .ring import FullRows, RingError, RowRing
from .schedule import BandSchedule, RowWindow, build_schedule, split_streamable


class StreamedNetwork:
    """A network compiled for streamed execution; `.run(x)` like `Session.run`.

    Thread-safe by a lock: the rings and scratch buffers are allocated once per network (that is
    the memory saving), so calls from several threads run one after another, each with the
    result it would get alone. For parallel streams, compile one StreamedNetwork per thread."""

    def __init__(self, source: Network, network: Network, schedule: BandSchedule, workers: int,
                 pass_log: list[str], compile_seconds: float, queue_bands: int = 2, threads: int | None = None,
                 kernels: str = "fast", winograd: bool = True, algorithm: str | None = None, layout: str = "nchwc"):
        self.source = source
        self.layout = layout
        self.network = network
        self.schedule = schedule
        self.pass_log = pass_log
        self.compile_seconds = compile_seconds
        self.workers = workers
        self.kernels = kernels
        if workers > 1:
            self.executor = PipelineExecutor(schedule, workers, queue_bands, kernels=kernels, winograd=winograd,
                                             algorithm=algorithm, layout=layout)
        else:
            self.executor = StreamExecutor(schedule, threads=threads, kernels=kernels, winograd=winograd,
                                           algorithm=algorithm, layout=layout)
        self.last_seconds = 0.0
        self._lock = threading.Lock()     # one run at a time over the shared rings (class docstring)

    @property
    def band_rows(self) -> int:
        return self.schedule.band_rows

    def run_streamed(self, x) -> dict[str, np.ndarray]:
        """Only the streamed part: {sink tensor name: whole array} (new arrays each call)."""
        xa = prepare_input(self.schedule, x)
        with self._lock:
            return self.executor.run_streamed(xa)

    def run(self, x):
        """numpy (N, C, H, W) in; one array out, or a list for several outputs (as Session.run)."""
        xa = prepare_input(self.schedule, x)
        with self._lock:
            t = time.perf_counter()
            sinks = self.executor.run_streamed(xa)
            outs = run_tail(self.schedule, xa, sinks)
            self.last_seconds = time.perf_counter() - t
        return outs[0] if len(outs) == 1 else outs

    def plan(self) -> StreamPlan:
        return make_plan(self)

    def __repr__(self) -> str:
        s = self.schedule
        return (f"StreamedNetwork({self.source.name!r}, {len(s.layers)} streamed ops, {len(s.tail)} tail ops, "
                f"band {s.band_rows} rows, workers {self.workers})")


def compile_stream(net: Network, band_rows: int = 4, workers: int = 1, *, passes=None,
                   queue_bands: int = 2, band_mode: str = "layer", layer_rows=None, threads: int | None = None,
                   kernels: str = "fast", winograd: bool = True, algorithm: str | None = None,
                   layout: str = "nchwc", min_band_pixels: int = 0) -> StreamedNetwork:
    """Compile `net` for streamed (depth-first, row-band) execution.

    band_rows: output rows each layer computes per step (1 = the paper's row-by-row line
        buffer). Default 4: the fast conv kernels need a few rows per call (Winograd F(4,3)
        computes 4-row tiles) and 4 keeps the ResNet18 trunk at 4K above 10x less activation
        memory than layer by layer; 8 is ~10-20% faster and holds ~1.6x the rows.
    workers: 1 = one thread stream, each band's conv on all cores (`threads`); >1 = the layer
        pipeline, the streamed layers cut into `workers` stages of balanced estimated time, one
        thread each, kernels single-threaded.
    queue_bands: extra bands of ring capacity on tensors that cross a stage boundary.
    band_mode: "layer" (default): every layer computes `band_rows` output rows per step (its
        first step may be shorter, which aligns it with its producer's bands); "input": rows are
        fed `band_rows` at a time and every layer emits as many rows as its inputs allow (the
        first version; after k stride-2 layers a step has band_rows / 2**k rows).
    layer_rows: with band_mode "layer", a function StreamLayer -> rows per step overriding
        band_rows per layer.
    threads: conv kernel threads for workers=1 (None: all cores).
    kernels: "fast" (default): float32 convs run `kernels.conv.conv2d_run` on bands, weights
        prepared once here; "numpy": im2col + GEMM on bands (also used for other dtypes).
    winograd: allow Winograd for 3x3 stride-1 convs (changes rounding, see docs/streaming.md).
    algorithm: force one conv algorithm wherever the conv library can run it (else select).
    layout: "nchwc" (default): rings between layers that run blocked (float32 convs with an
        NCHW16c form, pooling, relu / add / concat) hold NCHW16c rows and the convs call the
        blocked kernels (`conv2d_run_nchwc`, `direct_nchwc`) with no layout conversion per band;
        "nchw": the first version, every ring NCHW and every conv band through `conv2d_run`.
    min_band_pixels: band_mode "layer" without layer_rows: a layer whose band_rows x output
        width is below this doubles its rows per step (at most 4x band_rows), so narrow deep
        layers get enough Winograd tiles per call and re-read their weights less often. 0
        (default): off. 480 leaves ResNet18 / VGG at 4K unchanged and gives their deep layers
        at 1080p 8-16 rows (measured 1.31x -> 1.24x layer by layer, ResNet18 trunk 1080p).
    """
    if not isinstance(net, Network):
        raise TypeError(f"compile_stream() takes a tilefuse Network, got {type(net).__name__}")
    if not net.outputs:
        raise GraphError(net.name, "network has no outputs; call net.output(node) first")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if band_mode not in ("layer", "input"):
        raise ValueError(f"band_mode must be 'layer' or 'input', got {band_mode!r}")
    if layout not in ("nchwc", "nchw"):
        raise ValueError(f"layout must be 'nchwc' or 'nchw', got {layout!r}")
    if kernels not in ("fast", "numpy"):
        raise ValueError(f"kernels must be 'fast' or 'numpy', got {kernels!r}")
    if band_mode == "input":
        layer_rows = None
    elif layer_rows is None:
        if min_band_pixels > 0:
            def layer_rows(layer):
                r, wo = band_rows, layer.op.outputs[0].shape[3]
                while r * wo < min_band_pixels and r < 4 * band_rows:
                    r *= 2
                return r
        else:
            layer_rows = lambda layer: band_rows  # noqa: E731
    t = time.perf_counter()
    net.lint()
    opt, log = run_passes(net, passes)
    sched = build_schedule(opt, band_rows, layer_rows)
    return StreamedNetwork(net, opt, sched, workers, log, time.perf_counter() - t, queue_bands, threads=threads,
                           kernels=kernels, winograd=winograd, algorithm=algorithm, layout=layout)


__all__ = ["StreamedNetwork", "compile_stream", "StreamPlan", "BandSchedule", "RowWindow", "RowRing",
           "FullRows", "RingError", "build_schedule", "split_streamable", "balance_stages",
           "StreamExecutor", "PipelineExecutor"]
