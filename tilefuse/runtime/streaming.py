"""The runtime's stream mode: a program's band instructions run depth-first over row rings.

A program compiled with `schedule="stream"` (compiler/streaming.py) starts with a region:

    stream   [steps]                      header: steps (S, 3) int32 constant (layer, r0, r1);
                                          params: layers L, band_rows, workers, stage per layer
    band     [inputs..., output]  x L     one per streamed layer, in topological order: the op,
                                          its params, row windows, every activation operand's
                                          logical shape, ring capacity and layout

then the tail's ordinary instructions. `Session` binds the header and its L band instructions
together (`bind_region`) into one callable over views of device memory: every ring is a block
of the hidden segment ((N, C, capacity, W), or (N, ceil(C/16), capacity, W, 16) for an NCHW16c
ring), the sinks (streamed tensors kept whole) are hidden blocks or IO outputs, the network
input is read in place from its IO block. A compute replays the steps:

  workers 1   one thread, depth first, each band's kernels on the session's threads;
  workers > 1 the layer pipeline: one thread per stage (stages from the compiler, contiguous
              runs of layers of balanced estimated time, seed 003), kernels on one thread each;
              the rings are the bounded queues between stages (the compiler gave the tensors
              that cross a stage boundary extra bands of capacity): a consumer waits for the
              rows its band needs, a producer until the rows it overwrites are released. Each
              stage runs its steps in the order of the sequential schedule, which satisfies
              every wait with the sequential capacities, so the pipeline cannot deadlock.

After a step a layer releases the input rows it will not read again (`RowRing.release`); a
write over a held row or a read of a row not held raises RingError (the package loader has
already replayed the steps against the capacities, `compiler/streaming.py`). OpenBLAS is held
to one thread while a region runs (a band's GEMMs are small; waking BLAS threads for each cost
more than it gained, 5x slower with 2 threads on a busy 2-core machine).
"""
from __future__ import annotations

import threading
import time

import numpy as np

from ..compiler.program import CONST, IO, Instruction
from ..compiler.streaming import RING_C, WHOLE
from ..errors import GraphError
from ..ir.ops import schema
from ..kernels.bands import BandLayer, Runner, make_runner, window_from_param
from ..kernels.blas import blas_threads
from ..kernels.threads import Scratch, use_scratch
from .ring import FullRows, RowRing


class _Tensor:
    """One streamed tensor of a region: its logical shape, ring capacity, producer, consumers."""
    __slots__ = ("name", "shape", "dtype", "capacity", "whole", "blocked", "producer", "consumers", "io", "ring")

    def __init__(self, name, shape, dtype, capacity, kind, io):
        self.name, self.shape, self.dtype = name, tuple(shape), np.dtype(dtype)
        self.capacity, self.io = int(capacity), io
        self.whole, self.blocked = kind == WHOLE, kind == RING_C
        self.producer = -1
        self.consumers: list[tuple[int, int]] = []
        self.ring: RowRing | None = None


def _band_layer(ins: Instruction, views: list) -> BandLayer:
    p = ins.params
    acts = [i for i, op in enumerate(ins.inputs) if op.segment != CONST]
    consts = [views[i] for i, op in enumerate(ins.inputs) if op.segment == CONST]
    shapes = [tuple(t[:4]) for t in p["tensors"]]
    prepared = dict(zip(p["prepared"], consts)) if p.get("prepared") else None
    return BandLayer(
        name=p["name"], kind=p["op"], params=dict(p["attrs"]), in_shapes=shapes[:-1], out_shape=shapes[-1],
        dtype=np.dtype(ins.output.dtype), windows=[window_from_param(w) for w in p["windows"]],
        consts=consts, const_positions=[i for i, op in enumerate(ins.inputs) if op.segment == CONST],
        act_positions=acts, prepared=prepared, blocked_weights=p.get("layout") == "nchwc",
        weight_shape=tuple(p["weight_shape"]) if "weight_shape" in p else None,
        rows_max=int(p["rows_max"]), reference=schema(p["op"]).reference)


class StreamRegion:
    """The bound region of one context: runners, rings over hidden-segment views, scratch."""

    def __init__(self, header: Instruction, bands: list[Instruction], views: list[list], threads=None):
        hp = header.params
        self.header = header
        self.bands = bands
        self.steps = [tuple(int(v) for v in s) for s in np.asarray(views[0][0])]
        self.workers = int(hp["workers"])
        self.stage_of = [int(s) for s in hp["stages"]] if self.workers > 1 else [0] * len(bands)
        self.nstages = max(self.stage_of) + 1 if self.stage_of else 1
        self.layers = [_band_layer(ins, v) for ins, v in zip(bands, views[1:])]
        self.runners: list[Runner] = [make_runner(l) for l in self.layers]
        # tensors by operand name: producer, consumers, ring capacity and layout
        self.tensors: dict[str, _Tensor] = {}
        self.io_of: list[list[int]] = []            # per band: operand positions that are IO (resolved per call)
        for li, (ins, v) in enumerate(zip(bands, views[1:])):
            acts = [op for op in ins.operands if op.segment != CONST]
            for k, (op, t) in enumerate(zip(acts, ins.params["tensors"])):
                n, c, h, w, cap, kind = t
                ten = self.tensors.get(op.name)
                if ten is None:
                    ten = self.tensors[op.name] = _Tensor(op.name, (n, c, h, w), op.dtype, cap, kind,
                                                          op.segment == IO)
                if k == len(acts) - 1:
                    ten.producer = li
                else:
                    ten.consumers.append((li, k))
            self.io_of.append([i for i, op in enumerate(ins.operands) if op.segment == IO])
        for li, ins in enumerate(bands):
            self.runners[li].out_blocked = self.tensors[ins.output.name].blocked
            conv_threads = 1 if self.workers > 1 else threads
            if hasattr(self.runners[li], "threads"):
                self.runners[li].threads = conv_threads
        # rings: views of the hidden segment, fixed for this context
        for li, (ins, v) in enumerate(zip(bands, views[1:])):
            ten = self.tensors[ins.output.name]
            if not ten.whole:
                ten.ring = RowRing(ten.name, ten.shape, ten.capacity, ten.dtype, consumers=len(ten.consumers),
                                   blocked=ten.blocked, buf=v[-1])
        # per layer: its activation inputs' and its output's tensor names, its consumer slots
        self.in_names = [[op.name for op in ins.inputs if op.segment != CONST] for ins in bands]
        self.out_names = [ins.output.name for ins in bands]
        self.slots = [[self.tensors[n].consumers.index((li, k)) for k, n in enumerate(names)]
                      for li, names in enumerate(self.in_names)]
        self.scratch = [Scratch() for _ in range(self.nstages)]
        self.kernel_scratch = [Scratch() for _ in range(self.nstages)]   # threads.scratch in stage threads
        for li, r in enumerate(self.runners):
            for slot, nelem in r.scratch_need().items():
                self.scratch[self.stage_of[li]].reserve(slot, nelem, getattr(r, "acc", r.dtype))
        self.stage_seconds = [0.0] * self.nstages
        self.wait_seconds = [0.0] * self.nstages

    # ------------------------------------------------------------------ per call

    @property
    def scratch_bytes(self) -> int:
        return sum(s.nbytes for s in self.scratch)

    @property
    def ring_bytes(self) -> int:
        return sum(t.ring.nbytes for t in self.tensors.values() if t.ring is not None)

    def _rows(self, band_args: list[list[np.ndarray]]) -> dict:
        """Fresh state for one run: emptied rings, the input and the sinks as whole rows."""
        rows: dict = {}
        for li, (ins, args) in enumerate(zip(self.bands, band_args)):
            acts = [(op, a) for op, a in zip(ins.operands, args) if op.segment != CONST]
            for op, a in acts:
                if op.name in rows:
                    continue
                ten = self.tensors[op.name]
                if ten.ring is not None:
                    ten.ring.reset()
                    rows[op.name] = ten.ring
                else:
                    rows[op.name] = FullRows(op.name, a, len(ten.consumers), written=ten.producer < 0)
        return rows

    def __call__(self, last, *rest) -> None:
        """Session calls fn(out, *inputs): here the region's operands, flattened band by band."""
        flat = list(rest) + [last]
        args, at = [], 1                                 # flat[0]: the steps block
        for ins in self.bands:
            args.append(flat[at:at + len(ins.operands)])
            at += len(ins.operands)
        rows = self._rows(args)
        with blas_threads(1):
            if self.workers > 1:
                self._run_pipeline(rows)
            else:
                for li, r0, r1 in self.steps:
                    self._step(rows, li, r0, r1, self.scratch[0])

    def _step(self, rows: dict, li: int, r0: int, r1: int, scratch: Scratch) -> None:
        """One band of one layer: read its inputs, write its output rows, release inputs."""
        runner = self.runners[li]
        out = rows[self.out_names[li]]
        srcs = [rows[n] for n in self.in_names[li]]
        try:
            compute_band(runner, srcs, out, scratch, r0, r1)
            out.commit(r1)
        except GraphError:
            raise
        except Exception as e:
            raise GraphError(runner.layer.name, f"streamed {runner.layer.kind} on rows [{r0}, {r1}) failed: "
                                                f"{e}") from e
        for ring, slot, low in zip(srcs, self.slots[li], runner.release_rows(r1)):
            ring.release(slot, low)

    def _run_pipeline(self, rows: dict) -> None:
        cond = threading.Condition()
        error: list[BaseException] = []
        self.stage_seconds = [0.0] * self.nstages
        self.wait_seconds = [0.0] * self.nstages
        stage_steps = [[s for s in self.steps if self.stage_of[s[0]] == k] for k in range(self.nstages)]

        def ready(li, r0, r1) -> bool:
            for n, win in zip(self.in_names[li], self.layers[li].windows):
                ring = rows[n]
                if ring.end < min(win.rows(r0, r1)[1], ring.height):
                    return False
            return rows[self.out_names[li]].room_for(r1)

        def stage(k: int):
            # the kernels' own scratch buffers live with the region, not with this run's thread
            with use_scratch(self.kernel_scratch[k]):
                stage_steps_run(k)

        def stage_steps_run(k: int):
            scratch = self.scratch[k]
            try:
                for li, r0, r1 in stage_steps[k]:
                    t0 = time.perf_counter()
                    with cond:
                        cond.wait_for(lambda: error or ready(li, r0, r1))
                        if error:
                            return
                    t1 = time.perf_counter()
                    runner = self.runners[li]
                    out = rows[self.out_names[li]]
                    srcs = [rows[n] for n in self.in_names[li]]
                    try:
                        compute_band(runner, srcs, out, scratch, r0, r1)
                    except Exception as e:
                        raise GraphError(runner.layer.name, f"streamed {runner.layer.kind} on rows [{r0}, {r1}) "
                                                            f"failed in stage {k}: {e}") from e
                    with cond:
                        out.commit(r1)
                        for ring, slot, low in zip(srcs, self.slots[li], runner.release_rows(r1)):
                            ring.release(slot, low)
                        cond.notify_all()
                    self.wait_seconds[k] += t1 - t0
                    self.stage_seconds[k] += time.perf_counter() - t1
            except BaseException as e:
                with cond:
                    if not error:
                        error.append(e)
                    cond.notify_all()

        threads = [threading.Thread(target=stage, args=(k,), name=f"stream-stage{k}", daemon=True)
                   for k in range(self.nstages)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if error:
            raise error[0]


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


def region_length(program: list[Instruction], i: int) -> int:
    """Instructions the region starting at program[i] spans (1 + its band instructions)."""
    return 1 + int(program[i].params["layers"])


def bind_region(program: list[Instruction], i: int, views: list[list], threads=None):
    """(fn, flat views, params, header) for the region at program[i]: what Session's compute
    loop calls as fn(args[-1], *args[:-1]) with the IO operands resolved per call."""
    n = region_length(program, i)
    header, bands = program[i], program[i + 1:i + n]
    region = StreamRegion(header, bands, views, threads)
    flat = [v for vs in views for v in vs]
    return region, flat, {}, header
