"""Session: run a data package on a device, QingLong's compute stage (seed 002, section 3.3).

    sess = Session(compiled_or_package, device)
    sess.copy_constants()               # once: allocate the 3 segments, copy the constant area,
                                        #       write the segment bases
    sess.warmup()                       # optional: first call (numba JIT / cache load), seconds
    y = sess.run(x)                     # alloc IO, copy in, compute, copy out, free
    ys = sess.run_many(xs, depth=3)     # the same as a 3-stage pipeline

`compute(in_addrs, out_addrs)` writes the IO-address segment and executes the program, which it
decodes from the device's constant segment; every operand is resolved by segment-direct or
segment-indirect addressing (`resolve`).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..compiler.package import DataPackage
from ..compiler.program import CONST, DIRECT, HIDDEN, IO, Instruction, Operand, decode
from ..errors import DeviceError, GraphError
from ..kernels.registry import KERNELS, THREADED, bind as bind_kernel  # noqa: F401
from .device import CPUDevice
from .stages import PipelineStats, run_pipeline

_SEG_NAMES = {CONST: "const", HIDDEN: "hidden", IO: "io"}


def resolve_direct(segment_base: int, seg_offset: int, block_offset: int) -> int:
    """Segment-direct addressing: base + segment offset + block offset (1024 + 2048 + 4 = 3076)."""
    return segment_base + seg_offset + block_offset


def resolve_indirect(device: CPUDevice, segment_base: int, seg_offset: int, block_offset: int) -> int:
    """Segment-indirect addressing: *(base + segment offset) + block offset (*(9000 + 8) + 6 = 10006)."""
    return device.read_u64(segment_base + seg_offset) + block_offset


def resolve(device: CPUDevice, op: Operand) -> int:
    base = device.segment_base(_SEG_NAMES[op.segment])
    if op.mode == DIRECT:
        return resolve_direct(base, op.seg_offset, op.block_offset)
    return resolve_indirect(device, base, op.seg_offset, op.block_offset)


class Session:
    def __init__(self, compiled_or_package, device: CPUDevice | None = None, threads: int | None = None):
        pkg = getattr(compiled_or_package, "package", compiled_or_package)
        if not isinstance(pkg, DataPackage):
            raise TypeError(f"Session takes a compiled network or a DataPackage, got "
                            f"{type(compiled_or_package).__name__}")
        self.package = pkg
        self.device = device if device is not None else CPUDevice()
        # threads: None -> the count the network was compiled for (compile(threads=)), else all cores
        if threads is None:
            t = (pkg.meta.get("options") or {}).get("threads") if isinstance(pkg.meta.get("options"), dict) else None
            threads = t if isinstance(t, int) and not isinstance(t, bool) and t > 0 else None
        self.threads = threads
        self.jit_seconds: float | None = None
        self.segments: dict[str, int] = {}
        self._program: list[Instruction] | None = None
        self._bound: list | None = None
        self.last_stats: PipelineStats | None = None

    # ---------------------------------------------------------------- constants

    def copy_constants(self) -> None:
        """Allocate the const, hidden and IO-address segments, copy the constant area once,
        and write the three segment bases into the device's segment-base area."""
        if self.segments:
            return
        pkg, dev = self.package, self.device
        sizes = {"const": pkg.const_bytes, "hidden": pkg.hidden_bytes, "io": pkg.io_bytes}
        try:
            for seg, size in sizes.items():
                self.segments[seg] = dev.alloc(max(size, 1))
        except Exception:
            self.release()
            raise
        dev.copy_in(self.segments["const"], np.frombuffer(pkg.const_area, dtype=np.uint8))
        for seg, addr in self.segments.items():
            dev.set_segment_base(seg, addr)
        # the program is read back from device memory, where the instructions now live
        base = self.segments["const"]
        self._program = decode(dev.memory[base:base + pkg.program_size].tobytes())
        self._bind()

    def _bind(self) -> None:
        """Resolve direct operands once (their bases do not change); IO ones per compute."""
        dev = self.device
        bound = []
        for ins in self._program:
            views = []
            for op in ins.operands:
                if op.mode == DIRECT:
                    views.append(dev.view(resolve(dev, op), op.dtype, op.shape))
                else:
                    views.append(op)
            params = dict(ins.params)
            if ins.kernel in THREADED:
                params["threads"] = self.threads
            # validated once here (kernels.registry.bind): blocked convs get a closure without per-call
            # argument checks, tiny layers run on one thread (shape rule, results unchanged)
            fn, params = bind_kernel(ins.kernel, views, params)
            bound.append((fn, views, params, ins))
        self._bound = bound

    def release(self) -> None:
        """Free the three segments."""
        for addr in self.segments.values():
            self.device.free(addr)
        self.segments = {}
        self._program = self._bound = None

    def __enter__(self):
        self.copy_constants()
        return self

    def __exit__(self, *exc):
        self.release()

    # ---------------------------------------------------------------- compute

    def compute(self, in_addrs: Sequence[int], out_addrs: Sequence[int]) -> None:
        """Write the IO addresses into the IO segment and run every instruction."""
        if self._bound is None:
            raise DeviceError("compute() before copy_constants(): the constants are not on the device")
        pkg, dev = self.package, self.device
        if len(in_addrs) != len(pkg.inputs) or len(out_addrs) != len(pkg.outputs):
            raise DeviceError(f"compute got {len(in_addrs)} input and {len(out_addrs)} output addresses, "
                              f"expected {len(pkg.inputs)} and {len(pkg.outputs)}")
        io_base = self.segments["io"]
        for slot, addr in zip(pkg.io, list(in_addrs) + list(out_addrs)):
            nbytes = int(np.prod(slot.shape)) * np.dtype(slot.dtype).itemsize
            dev.block_of(addr, nbytes)  # the user's block must hold the whole tensor
            dev.write_u64(io_base + slot.offset, addr)
        for fn, views, params, ins in self._bound:
            args = [v if isinstance(v, np.ndarray) else dev.view(resolve(dev, v), v.dtype, v.shape)
                    for v in views]
            try:
                fn(args[-1], *args[:-1], **params)
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
        if isinstance(xs, np.ndarray):
            xs = [xs]
        xs = list(xs)
        if len(xs) != len(self.package.inputs):
            raise GraphError(self.package.name, f"got {len(xs)} inputs, expected {len(self.package.inputs)} "
                                                f"({', '.join(s.name for s in self.package.inputs)})")
        out = []
        for slot, x in zip(self.package.inputs, xs):
            a = np.asarray(x)
            if a.shape != slot.shape:
                raise GraphError(slot.name, f"input has shape {a.shape}, expected {slot.shape}")
            if a.dtype != np.dtype(slot.dtype):
                if not np.can_cast(a.dtype, slot.dtype, casting="same_kind"):
                    raise GraphError(slot.name, f"input has dtype {a.dtype}, expected {np.dtype(slot.dtype)}")
                a = a.astype(slot.dtype)
            out.append(a)
        return out

    def alloc_io(self) -> tuple[list[int], list[int]]:
        dev = self.device
        ins, outs = [], []
        try:
            for s in self.package.inputs:
                ins.append(dev.alloc(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize))
            for s in self.package.outputs:
                outs.append(dev.alloc(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize))
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
        ys = [self.device.copy_out(a, s.shape, s.dtype) for a, s in zip(bufs[1], self.package.outputs)]
        return ys[0] if len(ys) == 1 else ys

    def run(self, xs):
        """alloc -> copy in -> compute -> copy out -> free. One array, or a list for several outputs."""
        self.copy_constants()
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
        buffers are freed either way. Stage timings are kept in `self.last_stats`.
        """
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
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
