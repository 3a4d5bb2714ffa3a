"""Streaming execution for large images (issue 6, seed 003): line buffers and a layer pipeline.

    from tilefuse.stream import compile_stream
    s = compile_stream(net, band_rows=8)          # workers=2: the layer pipeline over 2 threads
    y = s.run(x)                                   # numpy NCHW in, the network's outputs out
    print(s.plan())                                # rows each layer holds, bytes, stage split

The network goes through the same passes as `tilefuse.compile` (BN folded, ReLU and residual
adds fused into conv epilogues); then every conv, pooling and element-wise op on the input side
streams: bands of rows flow depth-first through the whole streamed part, each tensor held in a
ring of a few rows (`schedule.py`, `ring.py`, `executor.py`); global pooling / linear / softmax
end it and run on whole tensors. `docs/streaming.md` has the details and the numbers.
"""
from __future__ import annotations

import time

import numpy as np

from ..compiler.pipeline import run_passes
from ..errors import GraphError
from ..ir import Network
from .executor import StreamExecutor, prepare_input, run_tail
from .pipeline import PipelineExecutor, balance_stages
from .plan import StreamPlan, make_plan
from .ring import FullRows, RingError, RowRing
from .schedule import RowWindow, Schedule, build_schedule, split_streamable


class StreamedNetwork:
    """A network compiled for streamed execution; `.run(x)` like `Session.run`."""

    def __init__(self, source: Network, network: Network, schedule: Schedule, workers: int,
                 pass_log: list[str], compile_seconds: float, queue_bands: int = 2):
        self.source = source
        self.network = network
        self.schedule = schedule
        self.pass_log = pass_log
        self.compile_seconds = compile_seconds
        self.workers = workers
        if workers > 1:
            self.executor = PipelineExecutor(schedule, workers, queue_bands)
        else:
            self.executor = StreamExecutor(schedule)
        self.last_seconds = 0.0

    @property
    def band_rows(self) -> int:
        return self.schedule.band_rows

    def run_streamed(self, x) -> dict[str, np.ndarray]:
        """Only the streamed part: {sink tensor name: whole array}."""
        return self.executor.run_streamed(prepare_input(self.schedule, x))

    def run(self, x):
        """numpy (N, C, H, W) in; one array out, or a list for several outputs (as Session.run)."""
        t = time.perf_counter()
        xa = prepare_input(self.schedule, x)
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


def compile_stream(net: Network, band_rows: int = 8, workers: int = 1, *, passes=None,
                   queue_bands: int = 2) -> StreamedNetwork:
    """Compile `net` for streamed (depth-first, row-band) execution.

    band_rows: output rows each layer computes per step (1 = the paper's row-by-row line
        buffer; 4-16 vectorize better).
    workers: 1 = one thread, layers in turn band by band; >1 = the layer pipeline, the streamed
        layers cut into `workers` stages of balanced FLOPs, one thread each.
    queue_bands: extra bands of ring capacity on tensors that cross a stage boundary.
    """
    if not isinstance(net, Network):
        raise TypeError(f"compile_stream() takes a tilefuse Network, got {type(net).__name__}")
    if not net.outputs:
        raise GraphError(net.name, "network has no outputs; call net.output(node) first")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    t = time.perf_counter()
    net.lint()
    opt, log = run_passes(net, passes)
    sched = build_schedule(opt, band_rows)
    return StreamedNetwork(net, opt, sched, workers, log, time.perf_counter() - t, queue_bands)


__all__ = ["StreamedNetwork", "compile_stream", "StreamPlan", "Schedule", "RowWindow", "RowRing",
           "FullRows", "RingError", "build_schedule", "split_streamable", "balance_stages",
           "StreamExecutor", "PipelineExecutor"]
