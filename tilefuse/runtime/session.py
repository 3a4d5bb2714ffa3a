"""Session: run a data package on a device, QingLong's compute stage (seed 002, section 3.3).

    sess = Session(compiled_or_package, device)
    sess.copy_constants()               # once: allocate the constant segment, copy the constant
                                        #       area, bind the program (first context)
    sess.warmup()                       # optional: first call (numba JIT / cache load), seconds
    y = sess.run(x)                     # alloc IO, copy in, compute, copy out, free
                                        # (on a zero-copy device: map x and a new y, compute)
    ys = sess.run_many(xs, depth=3)     # the same as a 3-stage pipeline

Segments and contexts. The constant segment is allocated once per session and shared by every
call. What one call in flight writes lives in a *context*: its own segment-base record (three
u64 device words: the constant, hidden and IO-address segment bases), its own hidden segment
and its own IO-address segment, with the program's kernels bound to them. Contexts are made on
demand, at most `max_concurrent` of them, and reused; a call that finds none free waits for one.
So several sessions share one device safely (each has its own records), and `run`, `run_many`
and `compute` may be called from several threads at once: each call computes in its own
context, with the same results as sequential calls.

`compute(in_addrs, out_addrs)` (= `compute_network`) checks the addresses (user blocks on this
device, large enough, outside every session's segments, outputs overlapping nothing else),
writes them into the context's IO-address segment and executes the program; every operand is
resolved by segment-direct or segment-indirect addressing through the context's record in
device memory (`resolve`).

Zero copy. On a device whose memory is the host's (`device.zero_copy`: the default growable
`CPUDevice()`), the constant segment is the package's constant area mapped in place
(`map_host`), not a second copy, and `run` hands the caller's input array and a new output array
to the kernels as the call's IO operands instead of copying in and out: the views `map_host` blocks
would give, made from the arrays directly (no block bookkeeping, no address checks: these arrays are
the call's own: 20-70 us of Python less a call after an idle pause, 4-8 us back to back; benchmarks/RESULTS.md
2026-12-04). `compute` with addresses keeps the full path. `run_many` still copies in and out: its
stages overlap, and an input iterator may reuse one array for the next item while the previous
one computes. A package whose constant area is read-only bytes (a crafted or hand-built one) is
copied as before.
"""
from __future__ import annotations

import math
import threading
import time
import weakref
from typing import Sequence

import numpy as np

from ..compiler.compile import CompiledNetwork
from ..compiler.package import DataPackage, validate_package
from ..compiler.program import CONST, DIRECT, HIDDEN, IO, Instruction, Operand, decode
from ..errors import DeviceError
from ..ir.node import check_inputs, integer_results
from ..kernels.registry import (KERNELS, THREADED, bind as bind_kernel, bind_chains, bind_se_sums,  # noqa: F401
                                bind_stem_pools)
from ..kernels.placement import keep_off_caller
from ..kernels import threads as threads_mod
from ..kernels.threads import Scratch, aligned_empty, use_scratch
from .device import CPUDevice
from .stages import PipelineStats, run_pipeline
from .streaming import bind_region, region_length

RECORD_BYTES = 24            # a segment-base record: u64 const, hidden, IO-address base
_SLOT = {CONST: 0, HIDDEN: 8, IO: 16}


def resolve_direct(segment_base: int, seg_offset: int, block_offset: int) -> int:
    """Segment-direct addressing: base + segment offset + block offset (1024 + 2048 + 4 = 3076)."""
    return segment_base + seg_offset + block_offset


def resolve_indirect(device: CPUDevice, segment_base: int, seg_offset: int, block_offset: int) -> int:
    """Segment-indirect addressing: *(base + segment offset) + block offset (*(9000 + 8) + 6 = 10006)."""
    return device.read_u64(segment_base + seg_offset) + block_offset


def resolve(device: CPUDevice, record: int, op: Operand) -> int:
    """An operand's device address: its segment base read from the record at `record`."""
    base = device.read_u64(record + _SLOT[op.segment])
    if op.mode == DIRECT:
        return resolve_direct(base, op.seg_offset, op.block_offset)
    return resolve_indirect(device, base, op.seg_offset, op.block_offset)


SMALL_OUTPUT_BYTES = 64 << 10


def _new_output(shape, dtype) -> np.ndarray:
    """A run's output array: on a cache line (threads.aligned_empty) when large; a plain np.empty below
    SMALL_OUTPUT_BYTES, where no kernel's speed depends on it (every vector store is unaligned-safe:
    `vmovups`) and the alignment's address query was the largest Python step of a run after an idle
    pause (MobileNetV2's 1000 logits: 68-77 us, benchmarks/RESULTS.md 2026-12-04)."""
    dt = np.dtype(dtype)
    n = math.prod(shape)
    if n * dt.itemsize < SMALL_OUTPUT_BYTES:
        return np.empty(shape, dt)
    return aligned_empty(n, dt).reshape(shape)


def _host_view(host: dict, op: Operand) -> np.ndarray:
    """An IO operand's view straight from the call's host array (`host`: {IO slot offset: its bytes}); the
    bytes `resolve` would address: the slot's block from its start plus the operand's block offset."""
    n = math.prod(op.shape) * np.dtype(op.dtype).itemsize
    b = host[op.seg_offset][op.block_offset:op.block_offset + n]
    if b.size != n:
        raise DeviceError(f"IO operand at slot {op.seg_offset} + {op.block_offset} needs {n} bytes; its array has "
                          f"{host[op.seg_offset].size}")
    return b.view(op.dtype).reshape(op.shape)


def _flatten(calls: list) -> list:
    """A context's flat plan: its calls (`_Context.calls`) as steps, ("call", entry) or ("replay", task loops,
    instructions, first, last instruction). The calls whose recording (threads.replaying) holds for their fixed
    operands are what they would replay anyway: consecutive ones become one step, a single replay_regions over
    all their task loops, instead of a wrapper call, an identity check and a region plan each. A fused chain's
    no-op members (registry.bind_chains) are left out. MobileNetV2 batch 1: 55 instructions, 25 replayed and 27
    no-ops, 4 steps; the run's Python 33 -> 17 us back to back (benchmarks/RESULTS.md 2026-12-04)."""
    steps: list = []
    for entry in calls:
        fn, args, views, params, ins = entry
        if getattr(fn, "fused_into", None) is not None:
            continue
        rec = threads_mod.recorded(fn, args) if args is not None and not params else None
        if rec is None:
            steps.append(("call", entry))
        elif steps and steps[-1][0] == "replay":
            _, loops, n, first, _ = steps[-1]
            steps[-1] = ("replay", loops + rec, n + 1, first, ins)
        else:
            steps.append(("replay", tuple(rec), 1, ins, ins))
    return steps


class _Context:
    """One call in flight: segment-base record, hidden and IO-address segments, bound kernels, and
    the kernels' host scratch (Winograd's transform buffers, direct conv's bands): it lives with
    the context, so a call on a new thread (each `run_many` starts new stage threads) reuses the
    buffers of the calls before it instead of allocating them again (kernels.threads.use_scratch)."""
    __slots__ = ("record", "hidden", "io", "bound", "scratch", "_calls", "flat", "runs")

    def __init__(self, record: int, hidden: int, io: int):
        self.record, self.hidden, self.io = record, hidden, io
        self.bound: list = []
        self.scratch = Scratch()
        self._calls = None
        self.flat: list | None = None    # the flat plan (_flatten), made after the second untimed compute
        self.runs = 0                    # untimed computes with replaying on, before the flat plan

    def calls(self) -> list:
        """`bound` as (fn, args, views, params, ins): args the call's positional arguments (out first)
        when every operand is a direct view (made once: ~0.7 us an instruction a compute), None when
        some are IO operands (resolved at every compute)."""
        if self._calls is None or len(self._calls) != len(self.bound):
            self._calls = [(fn, (views[-1], *views[:-1]) if all(isinstance(v, np.ndarray) for v in views) else None,
                            views, params, ins) for fn, views, params, ins in self.bound]
        return self._calls


def _free_blocks(device: CPUDevice, blocks: list[int]) -> None:
    """Finalizer: a dropped Session gives its segments back."""
    while blocks:
        try:
            device.free(blocks.pop())
        except Exception:  # noqa: BLE001 - the device may be gone first at interpreter exit
            pass


class Session:
    """Runs one package on one device. Thread-safe: see the module docstring.

    threads: kernel threads (None: the count the network was compiled for, else all cores).
    max_concurrent: contexts (calls computing at once) at most; default 4.
    """

    def __init__(self, compiled_or_package, device: CPUDevice | None = None, threads: int | None = None,
                 max_concurrent: int = 4):
        pkg = getattr(compiled_or_package, "package", compiled_or_package)
        if not isinstance(pkg, DataPackage):
            raise TypeError(f"Session takes a compiled network or a DataPackage, got "
                            f"{type(compiled_or_package).__name__}")
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 1:
            raise ValueError(f"max_concurrent must be a positive integer, got {max_concurrent!r}")
        self.package = pkg
        self.device = device if device is not None else CPUDevice()
        # threads: None -> the count the network was compiled for (compile(threads=)), else all cores
        if threads is None:
            t = (pkg.meta.get("options") or {}).get("threads") if isinstance(pkg.meta.get("options"), dict) else None
            threads = t if isinstance(t, int) and not isinstance(t, bool) and t > 0 else None
        self.threads = threads
        self.max_concurrent = max_concurrent
        self.jit_seconds: float | None = None
        self.last_stats: PipelineStats | None = None
        self._const: int | None = None
        self._program: list[Instruction] | None = None
        self._contexts: list[_Context] = []
        self._idle: list[_Context] = []
        self._cond = threading.Condition()
        self._in_specs: list | None = None          # (name, shape, dtype) of each input (_check_inputs)
        self._blocks: list[int] = []               # every segment block, for release / the finalizer
        self._finalizer = weakref.finalize(self, _free_blocks, self.device, self._blocks)

    # ---------------------------------------------------------------- constants

    @property
    def segments(self) -> dict[str, int]:
        """Segment addresses: the constant segment and the first context's record, hidden and
        IO-address segments (empty before copy_constants)."""
        if self._const is None:
            return {}
        c = self._contexts[0]
        return {"const": self._const, "hidden": c.hidden, "io": c.io, "bases": c.record}

    @property
    def contexts(self) -> int:
        """Contexts made so far (calls that have computed at once, at most max_concurrent)."""
        return len(self._contexts)

    def copy_constants(self) -> None:
        """Validate the package (unless loading did), allocate the constant segment, copy the
        constant area once, decode the program from device memory, make the first context."""
        with self._cond:
            if self._const is not None:
                return
            pkg, dev = self.package, self.device
            if not pkg.validated:
                validate_package(pkg)
            try:
                area = np.frombuffer(pkg.const_area, dtype=np.uint8)
                if getattr(dev, "zero_copy", False) and area.flags.writeable and area.size:
                    self._const = dev.map_host(area, kind="segment")     # the package's bytes, in place
                    self._blocks.append(self._const)
                else:
                    self._const = self._alloc(pkg.const_bytes)
                    dev.copy_in(self._const, area)
                # the program is read back from device memory, where the instructions now live
                self._program = decode(dev.read_bytes(self._const, pkg.program_size))
                ctx = self._new_context()
            except BaseException:
                self._release_all()
                raise
            self._idle.append(ctx)

    def _alloc(self, nbytes: int) -> int:
        addr = self.device.alloc(max(int(nbytes), 1), kind="segment")
        self._blocks.append(addr)
        return addr

    def _new_context(self) -> _Context:
        """Allocate a record, a hidden and an IO-address segment; bind the program to them."""
        pkg, dev = self.package, self.device
        ctx = _Context(self._alloc(RECORD_BYTES), self._alloc(pkg.hidden_bytes), self._alloc(pkg.io_bytes))
        for seg, addr in ((CONST, self._const), (HIDDEN, ctx.hidden), (IO, ctx.io)):
            dev.write_u64(ctx.record + _SLOT[seg], addr)
        # direct operands resolve once (their bases do not change); IO ones at every compute. A
        # stream region (a `stream` header and its band instructions) binds as one entry: the
        # runtime's stream mode (runtime/streaming.py) over views of this context's memory
        def views_of(ins):
            return [dev.view(resolve(dev, ctx.record, op), op.dtype, op.shape) if op.mode == DIRECT else op
                    for op in ins.operands]
        prog, i = self._program, 0
        # operand views of every instruction outside stream regions; fused conv chains over them
        # (kernels/registry.bind_chains: an inverted-residual block's three convs as one call)
        all_views: list = [None] * len(prog)
        while i < len(prog):
            if prog[i].kernel == "stream":
                i += region_length(prog, i)
                continue
            all_views[i] = views_of(prog[i])
            i += 1
        chains = bind_chains(prog, all_views, self.threads)
        # depthwise -> squeeze-excitation pairs: the means from the depthwise epilogue (registry.bind_se_sums)
        chains.update(bind_se_sums(prog, all_views, self.threads, taken=chains))
        # the stem conv -> max pool pair: the pool band by band inside the stem's tasks (registry.bind_stem_pools)
        chains.update(bind_stem_pools(prog, all_views, self.threads, taken=chains))
        i = 0
        while i < len(prog):
            ins = prog[i]
            if ins.kernel == "stream":
                n = region_length(prog, i)
                ctx.bound.append(bind_region(prog, i, [views_of(x) for x in prog[i:i + n]], self.threads))
                i += n
                continue
            views = all_views[i]
            i += 1
            if i - 1 in chains:
                ctx.bound.append((chains[i - 1], views, {}, ins))
                continue
            params = dict(ins.params)
            if ins.kernel in THREADED:
                params["threads"] = self.threads
            # kernels.registry.bind: blocked convs get a closure without per-call argument checks,
            # tiny layers run on one thread (shape rule, results unchanged)
            fn, params = bind_kernel(ins.kernel, views, params)
            ctx.bound.append((fn, views, params, ins))
        self._contexts.append(ctx)
        return ctx

    def chains(self) -> dict:
        """The fused conv chains the session bound (kernels/conv/chain.py): {first instruction index:
        (indices the chain covers, its describe())}; empty before copy_constants or when none applies."""
        if not self._contexts:
            return {}
        return {i: (fn.covers, fn.chain.describe()) for i, (fn, _, _, _) in enumerate(self._contexts[0].bound)
                if getattr(fn, "covers", None)}

    def se_sums(self) -> dict:
        """The depthwise -> squeeze-excitation pairs the session bound (kernels/registry.py `bind_se_sums`: the
        means from the depthwise epilogue): {depthwise instruction index: squeeze-excitation index}."""
        if not self._contexts:
            return {}
        return {i: fn.se_sums_for for i, (fn, _, _, _) in enumerate(self._contexts[0].bound)
                if getattr(fn, "se_sums_for", None) is not None}

    def stem_pools(self) -> dict:
        """The stem conv -> max pool pairs the session bound (kernels/registry.py `bind_stem_pools`: the pool
        computed inside the stem's tasks): {conv instruction index: max pool index}."""
        if not self._contexts:
            return {}
        return {i: fn.stem_pool_for for i, (fn, _, _, _) in enumerate(self._contexts[0].bound)
                if getattr(fn, "stem_pool_for", None) is not None}

    def _acquire(self) -> _Context:
        if self._const is None:
            raise DeviceError("compute() before copy_constants(): the constants are not on the device")
        with self._cond:
            while not self._idle:
                if self._const is None:
                    raise DeviceError("the session was released while a call waited for a context")
                if len(self._contexts) < self.max_concurrent:
                    return self._new_context()
                self._cond.wait()
            return self._idle.pop()

    def _give_back(self, ctx: _Context) -> None:
        with self._cond:
            if ctx in self._contexts:
                self._idle.append(ctx)
            self._cond.notify()

    def release(self) -> None:
        """Free every segment (constant, and each context's record, hidden and IO segments).
        Refused while calls are computing; a dropped Session releases itself."""
        with self._cond:
            busy = len(self._contexts) - len(self._idle)
            if busy:
                raise DeviceError(f"release() while {busy} call(s) are computing on this session; "
                                  f"expected every run / compute to have returned")
            self._release_all()
            self._cond.notify_all()

    def _release_all(self) -> None:
        _free_blocks(self.device, self._blocks)
        self._const = self._program = None
        self._contexts, self._idle = [], []

    def __enter__(self):
        self.copy_constants()
        return self

    def __exit__(self, *exc):
        self.release()

    # ---------------------------------------------------------------- compute

    def _check_io(self, in_addrs, out_addrs) -> list[int]:
        pkg, dev = self.package, self.device
        in_addrs, out_addrs = list(in_addrs), list(out_addrs)
        if len(in_addrs) != len(pkg.inputs) or len(out_addrs) != len(pkg.outputs):
            raise DeviceError(f"compute got {len(in_addrs)} input and {len(out_addrs)} output addresses, "
                              f"expected {len(pkg.inputs)} and {len(pkg.outputs)}")
        spans = []
        for slot, addr in zip(pkg.io, in_addrs + out_addrs):
            if isinstance(addr, bool) or not isinstance(addr, (int, np.integer)):
                raise DeviceError(f"{slot.kind} '{slot.name}': address {addr!r} is not an integer")
            nbytes = math.prod(slot.shape) * np.dtype(slot.dtype).itemsize
            try:
                # the block must be the user's (dev_malloc), never a session's segment, and hold the tensor
                dev.block_of(int(addr), nbytes, kind="user")
            except DeviceError as e:
                raise DeviceError(f"{slot.kind} '{slot.name}' at {addr} ({nbytes} bytes): {e}; expected "
                                  f"a block from dev_malloc outside every session's segments") from None
            spans.append((int(addr), int(addr) + nbytes, slot))
        # an output must not overlap an input or another output (kernels would read what they write)
        for i, (a0, a1, s) in enumerate(spans):
            if s.kind != "output":
                continue
            for j, (b0, b1, t) in enumerate(spans):
                if j != i and a0 < b1 and b0 < a1:
                    raise DeviceError(f"output '{s.name}' [{a0}, {a1}) overlaps {t.kind} '{t.name}' "
                                      f"[{b0}, {b1}); expected separate blocks")
        return [a for a, _, _ in spans]

    def compute(self, in_addrs: Sequence[int], out_addrs: Sequence[int], timings: list | None = None) -> None:
        """Write the IO addresses into a context's IO segment and run every instruction.
        timings: a list; the seconds of each instruction's kernel call are appended (tilefuse profile)."""
        self._in_context(self._check_io(in_addrs, out_addrs), timings)

    def _in_context(self, addrs: list[int] | None, timings: list | None = None, host: dict | None = None) -> None:
        """Execute the program in a free context (compute, and run on a zero-copy device with `host`)."""
        keep_off_caller(self.threads)        # numba's workers off this thread's core (kernels/placement.py)
        ctx = self._acquire()
        try:
            with use_scratch(ctx.scratch):   # contexts are exclusive per call: never shared at once
                self._execute(ctx, addrs, timings, host)
        finally:
            self._give_back(ctx)

    def _execute(self, ctx: _Context, addrs: list[int] | None, timings: list | None = None,
                 host: dict | None = None) -> None:
        """Run every instruction of `ctx`. IO operands resolve through the IO-address segment, where
        `addrs` are written first; or, with `host` ({IO slot offset: the host array's bytes}, run() on a
        zero-copy device), straight from those arrays. From a context's third untimed compute on, its flat
        plan runs instead (`_flatten`): the same task loops in the same order, less Python."""
        dev = self.device
        if host is None:
            for slot, addr in zip(self.package.io, addrs):
                dev.write_u64(ctx.io + slot.offset, addr)
        if timings is None and threads_mod.REPLAY:
            if ctx.flat is not None:
                self._execute_flat(ctx, host)
                return
            ctx.runs += 1
        clock = time.perf_counter
        for entry in ctx.calls():
            t0 = clock() if timings is not None else 0.0
            self._call(ctx, entry, host)
            if timings is not None:
                timings.append(clock() - t0)
        if ctx.runs >= 2 and ctx.flat is None:
            # every replaying call recorded its task loops at its second call (threads.replaying)
            ctx.flat = _flatten(ctx.calls())

    def _io_args(self, ctx: _Context, views: list, host: dict | None) -> tuple:
        """A call's positional arguments (out first) with its IO operands resolved: segment-indirect, through
        the record and the IO segment in device memory, or from the host arrays of a zero-copy run."""
        if host is None:
            dev = self.device
            a = [v if isinstance(v, np.ndarray) else dev.view(resolve(dev, ctx.record, v), v.dtype, v.shape)
                 for v in views]
        else:
            a = [v if isinstance(v, np.ndarray) else _host_view(host, v) for v in views]
        return (a[-1], *a[:-1])

    def _execute_flat(self, ctx: _Context, host: dict | None) -> None:
        replayed = threads_mod._REGIONS
        for step in ctx.flat:
            if step[0] == "replay":
                _, regions, n, first, last = step
                replayed["replayed"] += n
                try:
                    threads_mod.replay_regions(regions)
                except Exception as e:
                    raise RuntimeError(f"instructions {first.kernel} -> '{first.output.name}' to {last.kernel} -> "
                                       f"'{last.output.name}' (replayed) failed: {e}") from e
                continue
            self._call(ctx, step[1], host)

    def _call(self, ctx: _Context, entry: tuple, host: dict | None) -> None:
        """One bound call (`_Context.calls` entry), its IO operands resolved (`_io_args`); an error names the
        instruction."""
        fn, args, views, params, ins = entry
        if args is None:
            args = self._io_args(ctx, views, host)
        try:
            if params:
                fn(*args, **params)
            else:
                fn(*args)
        except Exception as e:
            raise RuntimeError(f"instruction {ins.kernel} -> '{ins.output.name}' failed: {e}") from e

    def warmup(self) -> float:
        """Run the program once on zero inputs: numba compiles (or loads from its on-disk cache,
        cache=True) every kernel on first use. Returns and keeps the seconds (`jit_seconds`)."""
        import time
        self.copy_constants()
        t = time.perf_counter()
        self.run([np.zeros(s.shape, np.dtype(s.dtype)) for s in self.package.inputs])
        self.jit_seconds = time.perf_counter() - t
        return self.jit_seconds

    # ---------------------------------------------------------------- convenience

    def _check_inputs(self, xs) -> list[np.ndarray]:
        specs = self._in_specs
        if specs is None:
            ints = self.package.meta.get("integer_inputs") or {}
            specs = self._in_specs = [(s.name, tuple(s.shape), np.dtype(s.dtype), ints.get(s.name))
                                      for s in self.package.inputs]
        if type(xs) is np.ndarray and len(specs) == 1 and xs.shape == specs[0][1] and xs.dtype == specs[0][2] \
                and specs[0][3] is None:
            return [xs]                   # the common call, as check_inputs would pass it
        return check_inputs(specs, xs, self.package.name)

    def alloc_io(self) -> tuple[list[int], list[int]]:
        dev = self.device
        ins, outs = [], []
        try:
            for s in self.package.inputs:
                ins.append(dev.alloc(math.prod(s.shape) * np.dtype(s.dtype).itemsize))
            for s in self.package.outputs:
                outs.append(dev.alloc(math.prod(s.shape) * np.dtype(s.dtype).itemsize))
        except Exception:
            self.free_io((ins, outs))
            raise
        return ins, outs

    def free_io(self, bufs) -> None:
        for a in list(bufs[0]) + list(bufs[1]):
            self.device.free(a)

    def _copy_in(self, xs, bufs):
        for a, x in zip(bufs[0], self._check_inputs(xs)):
            self.device.copy_in(a, x)

    def _copy_out(self, bufs):
        return self._results([self.device.copy_out(a, s.shape, s.dtype)
                              for a, s in zip(bufs[1], self.package.outputs)])

    def _results(self, ys):
        """The outputs as a run returns them: integer outputs (meta["integer_outputs"]: argmax's indices)
        checked and converted; one array, or a list for several."""
        ints = self.package.meta.get("integer_outputs")
        if ints:
            ys = integer_results(ys, [s.name for s in self.package.outputs], ints, self.package.name)
        return ys[0] if len(ys) == 1 else ys

    def run(self, xs):
        """alloc -> copy in -> compute -> copy out -> free (zero copy: the arrays as the IO operands -> compute).
        One array, or a list for several outputs."""
        self.copy_constants()
        xs = self._check_inputs(xs)
        if getattr(self.device, "zero_copy", False):
            # the arrays themselves are the IO operands (the module docstring): an input that is not
            # C-contiguous and writable is copied, as map_host would need; large outputs on a cache line
            xs = [x if x.flags.c_contiguous and x.flags.writeable else np.array(x, order="C") for x in xs]
            ys = [_new_output(s.shape, s.dtype) for s in self.package.outputs]
            arrays = xs + ys
            if any(a.nbytes == 0 for a in arrays):
                raise DeviceError(f"{self.package.name}: an input or output of 0 bytes; expected non-empty tensors")
            self._in_context(None, host={slot.offset: a.reshape(-1).view(np.uint8)
                                         for slot, a in zip(self.package.io, arrays)})
            return self._results(ys)
        bufs = self.alloc_io()
        try:
            self._copy_in(xs, bufs)
            self.compute(*bufs)
            return self._copy_out(bufs)
        finally:
            self.free_io(bufs)

    def run_many(self, inputs, depth: int = 3, progress: bool = False):
        """copy-in / compute / copy-out as a 3-stage pipeline with `depth` IO buffer sets in flight.

        Outputs come back in input order; an exception in any stage reaches the caller, and the
        buffers are freed either way. Stage timings are kept in `self.last_stats` (of the last
        run_many to finish, when several threads call it).
        """
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive integer, got {depth!r}")
        self.copy_constants()
        total = len(inputs) if hasattr(inputs, "__len__") else None
        slots = []
        try:
            for _ in range(depth):
                slots.append(self.alloc_io())
            results, stats = run_pipeline(
                inputs,
                [lambda x, b, _: self._copy_in(x, b),
                 lambda x, b, _: self.compute(*b),
                 lambda x, b, _: self._copy_out(b)],
                slots, names=["copy-in", "compute", "copy-out"], progress=progress, total=total)
        finally:
            for b in slots:
                self.free_io(b)
        self.last_stats = stats
        return results


CompiledNetwork.session_class = Session      # compiled.run(x) / run_many(xs): a Session of it
