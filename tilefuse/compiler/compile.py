"""compile(): Network -> passes -> lowering -> memory plan -> REOFF -> CompiledNetwork."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import GraphError
from ..ir import Network
from .lower import Lowered, lower
from .memory import MemoryPlan, plan_hidden
from .package import DataPackage, reoff_pack, save_package
from .pipeline import run_passes
from .program import SEGMENTS

TARGETS = ("cpu",)


@dataclass
class Plan:
    """What the compiler decided, per instruction, and the memory totals."""
    rows: list[dict]
    const_bytes: int
    hidden_bytes: int
    hidden_naive_bytes: int
    io_bytes: int
    passes: list[str] = field(default_factory=list)

    @property
    def total_flops(self) -> int:
        return sum(r["flops"] for r in self.rows)

    def __str__(self) -> str:
        head = f"{'#':>3} {'kernel':<16} {'algorithm':<10} {'output':<22} {'MFLOP':>9}  operands (segment+offset)"
        lines = [head, "-" * len(head)]
        for r in self.rows:
            ops = " ".join(r["addresses"])
            lines.append(f"{r['index']:>3} {r['kernel']:<16} {r['algorithm']:<10} {str(r['output_shape']):<22} "
                         f"{r['flops'] / 1e6:>9.2f}  {ops}")
        lines.append("-" * len(head))
        saved = 1 - self.hidden_bytes / self.hidden_naive_bytes if self.hidden_naive_bytes else 0.0
        lines.append(f"total {self.total_flops / 1e9:.3f} GFLOP; constants {self.const_bytes / 2**20:.2f} MiB; "
                     f"hidden {self.hidden_bytes / 2**20:.2f} MiB planned vs {self.hidden_naive_bytes / 2**20:.2f} "
                     f"MiB naive ({100 * saved:.0f}% saved by liveness sharing); IO addresses {self.io_bytes} B")
        return "\n".join(lines)


@dataclass
class CompiledNetwork:
    network: Network            # after the passes
    source: Network             # as the user defined it
    package: DataPackage
    lowered: Lowered
    memory: MemoryPlan
    pass_log: list[str]
    compile_seconds: float
    options: dict

    def plan(self) -> Plan:
        rows = []
        for i, (ins, fl) in enumerate(zip(self.package.program(), self.lowered.flops)):
            addrs = []
            for op in ins.operands:
                seg = SEGMENTS[op.segment]
                addrs.append(f"{op.name}@{seg}+{op.seg_offset}" + ("*" if seg == "io" else ""))
            rows.append({
                "index": i, "kernel": ins.kernel, "algorithm": ins.params.get("algorithm", "-"),
                "output": ins.output.name, "output_shape": ins.output.shape,
                "input_shapes": [op.shape for op in ins.inputs], "flops": fl, "addresses": addrs,
                "params": ins.params,
            })
        return Plan(rows, self.package.const_bytes, self.package.hidden_bytes,
                    self.memory.naive_bytes, self.package.io_bytes, list(self.pass_log))

    def save(self, path) -> Path:
        return save_package(self.package, path)

    @property
    def inputs(self):
        return self.package.inputs

    @property
    def outputs(self):
        return self.package.outputs


def _conv_rule(options: dict):
    """Choose each conv's algorithm and prepare its constants (None: reference kernel)."""
    algo_forced = options.get("algorithm")
    if algo_forced == "reference":
        return None
    try:
        from ..kernels import conv as fast
    except ImportError:
        return None
    if not all(hasattr(fast, f) for f in ("select_algorithm", "conv2d_prepare", "conv2d_run")):
        return None

    def rule(op):
        x, w = op.inputs[0], op.inputs[1]
        if x.dtype != np.float32:
            return None
        p = op.params
        algo = algo_forced or fast.select_algorithm(x.shape, w.shape, p["stride"], p["padding"],
                                                    p["dilation"], p["groups"],
                                                    allow_winograd=options.get("winograd", True))
        b = op.inputs[2].value if p["has_bias"] else None
        prepared = fast.conv2d_prepare(algo, w.value, b, p["stride"], p["padding"], p["dilation"], p["groups"])
        return {"algorithm": algo}, {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in prepared.items()}
    return rule


SCHEDULES = ("layer", "stream")


def compile(net: Network, target: str = "cpu", *, schedule: str = "layer", passes=None,
            winograd: bool = True, algorithm: str | None = None, threads: int | None = None,
            stream_options: dict | None = None):
    """Compile a network once into a program and a REOFF data package.

    schedule: "layer" runs the layers one after another over whole tensors (a CompiledNetwork);
              "stream" runs the convolutional part depth-first, a few rows per layer at a time
              (a StreamedNetwork, see docs/streaming.md; stream_options go to compile_stream).
    algorithm: force one conv algorithm for every conv ("reference" = plain numpy kernel).
    winograd: allow Winograd for stride-1 3x3 convs when the heuristic picks it.
    """
    if target not in TARGETS:
        raise ValueError(f"target '{target}' is not supported; expected one of {TARGETS}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule '{schedule}' is not supported; expected one of {SCHEDULES}")
    if schedule == "stream":
        from ..stream import compile_stream
        return compile_stream(net, **(stream_options or {}))
    if not isinstance(net, Network):
        raise TypeError(f"compile() takes a tilefuse Network, got {type(net).__name__}")
    if not net.outputs:
        raise GraphError(net.name, "network has no outputs; call net.output(node) first")
    t0 = time.perf_counter()
    net.lint()
    options = {"target": target, "winograd": winograd, "algorithm": algorithm, "threads": threads}
    opt, log = run_passes(net, passes)
    low = lower(opt, _conv_rule(options))
    mem = plan_hidden(low.hidden, low.lifetimes)
    meta = {"pass_log": log, "options": {k: v for k, v in options.items() if v is not None},
            "gflops": sum(low.flops) / 1e9}
    pkg = reoff_pack(net.name, low, mem, meta)
    return CompiledNetwork(opt, net, pkg, low, mem, log, time.perf_counter() - t0, options)
