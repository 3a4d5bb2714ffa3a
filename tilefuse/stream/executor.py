"""Depth-first execution: bands of rows flow through the whole streamed network.

The executor replays the schedule's steps (layer, r0, r1) in order. Every streamed tensor lives
in a `RowRing` of the capacity the dry run found, except the network input (the caller's
array, read in place) and the sinks (whole arrays: the streamed part's results). After a step
the layer releases the input rows it will not read again, so producers may overwrite them.
Activation memory is the rings, the sinks and one set of scratch buffers, instead of whole
feature maps; the tail (global pooling, linear, ...) then runs on whole tensors with the
reference kernels.
"""
from __future__ import annotations

import numpy as np

from ..errors import GraphError
from ..interpreter import bind_inputs
from ..ir.ops import schema
from ..kernels.threads import Scratch, blas_threads
from .bands import Runner, assign_ring_layouts, make_runner
from .ring import FullRows, RowRing
from .schedule import BandSchedule


class RingSet:
    """The rings of every streamed tensor (allocated once, reset before each run)."""

    def __init__(self, sched: BandSchedule, extra_rows: dict[str, int] | None = None, blocked=()):
        self.sched = sched
        self.rings: dict[str, RowRing] = {}
        extra_rows = extra_rows or {}
        for name, t in sched.tensors.items():
            if t.whole:
                continue
            cap = min(t.shape[2], t.capacity + extra_rows.get(name, 0))
            self.rings[name] = RowRing(name, t.shape, cap, t.dtype, consumers=len(t.consumers),
                                       blocked=name in blocked)

    @property
    def ring_bytes(self) -> int:
        return sum(r.nbytes for r in self.rings.values())

    def bind(self, x: np.ndarray) -> dict:
        """Fresh state for one run: the input, new sink arrays, emptied rings."""
        s = self.sched
        rows: dict = {}
        for name, t in s.tensors.items():
            if t.producer < 0:
                rows[name] = FullRows(name, x, len(t.consumers), written=True)
            elif t.sink:
                rows[name] = FullRows(name, np.empty(t.shape, t.dtype), len(t.consumers))
            else:
                ring = self.rings[name]
                ring.end = 0
                ring.lows = [0] * len(ring.lows)
                rows[name] = ring
        return rows


def consumer_slot(sched: BandSchedule, tensor: str, layer: int, pos: int) -> int:
    return sched.tensors[tensor].consumers.index((layer, pos))


class StreamExecutor:
    """Runs a schedule on one thread."""

    def __init__(self, sched: BandSchedule, threads: int | None = None, kernels: str = "fast", winograd: bool = True,
                 algorithm: str | None = None, layout: str = "nchwc"):
        self.sched = sched
        self.threads = threads
        self.layout = layout
        self.runners: list[Runner] = [make_runner(l, sched, kernels, winograd, algorithm, layout)
                                      for l in sched.layers]
        self.blocked = assign_ring_layouts(sched, self.runners) if layout == "nchwc" else set()
        for l, r in zip(sched.layers, self.runners):
            r.out_blocked = l.output in self.blocked
        for r in self.runners:
            if hasattr(r, "threads"):
                r.threads = threads
        self.slots = [[consumer_slot(sched, n, l.index, k) for k, n in enumerate(l.inputs)]
                      for l in sched.layers]
        self.rings = RingSet(sched, blocked=self.blocked)
        self.scratch = Scratch()
        for r in self.runners:
            for slot, n in r.scratch_need().items():
                self.scratch.reserve(slot, n, getattr(r, "acc", r.dtype))

    def step(self, rows: dict, li: int, r0: int, r1: int, scratch: Scratch) -> None:
        """One band of one layer: read its inputs, write its output rows, release inputs."""
        layer = self.sched.layers[li]
        runner = self.runners[li]
        out = rows[layer.output]
        ins = [rows[n] for n in layer.inputs]
        try:
            compute_band(runner, ins, out, scratch, r0, r1)
            out.commit(r1)
        except GraphError:
            raise
        except Exception as e:
            raise GraphError(layer.name, f"streamed {layer.kind} on rows [{r0}, {r1}) failed: {e}") from e
        for ring, slot, low in zip(ins, self.slots[li], runner.release_rows(r1)):
            ring.release(slot, low)

    def run_streamed(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """The sinks (whole arrays) for input x (N, C, H, W).

        OpenBLAS is held to one thread (`kernels.threads.blas_threads`): a band's GEMMs are
        small, and waking BLAS threads for each of them costs more than it gains (measured
        5x slower with 2 threads on a busy 2-core machine); the layer pipeline is the way to
        use more cores."""
        rows = self.rings.bind(x)
        with blas_threads(1):
            for li, r0, r1 in self.sched.steps:
                self.step(rows, li, r0, r1, self.scratch)
        return {s: rows[s].buf for s in self.sched.sinks}


def compute_band(runner: Runner, ins: list, out, scratch: Scratch, r0: int, r1: int) -> None:
    """Compute output rows [r0, r1) into the output ring's slots; a band that would wrap around
    the ring's physical end is computed into scratch and copied in two pieces."""
    dst = out.write_view(r0, r1)
    if dst is not None:
        runner.run(ins, scratch, r0, r1, dst)
        return
    shape = out.buf.shape[:2] + (r1 - r0,) + out.buf.shape[3:]
    tmp = scratch.get("wrap", shape, out.buf.dtype)
    runner.run(ins, scratch, r0, r1, tmp)
    out.store(r0, tmp)


def run_tail(sched: BandSchedule, x: np.ndarray, sinks: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run the non-streamed ops on whole tensors; return the network outputs in order."""
    env = dict(sinks)
    env[sched.input] = x
    for op in sched.tail:
        args = [d.value if d.is_constant else env[d.name] for d in op.inputs]
        try:
            env[op.outputs[0].name] = np.asarray(schema(op.op, op.name).reference(*args, **op.params))
        except Exception as e:
            raise GraphError(op.name, f"tail {op.op} after the streamed part failed: {e}") from e
    return [env[d.name] for d in sched.network.outputs]


def prepare_input(sched: BandSchedule, x) -> np.ndarray:
    (a,) = bind_inputs(sched.network, x)
    return np.ascontiguousarray(a)
