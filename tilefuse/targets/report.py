"""What a simulation reports: per layer (`LayerReport`), per program (`SimReport`), over core
counts (`ScalingReport`), and the `Layer` a strategy receives."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import TilefuseError
from ..ir.ops import schema
from .spec import Target


@dataclass
class Layer:
    """One instruction of the program, as a strategy sees it."""
    index: int
    name: str                       # the op's name (or its output's)
    kernel: str
    params: dict                    # the op's normalized params (no CPU-only keys)
    inputs: list                    # reference-kernel arguments in order (arrays, or None when timing only)
    in_shapes: list[tuple]
    out_shape: tuple
    flops: int
    dtype: np.dtype                 # compute dtype on the target
    weight: np.ndarray | None = None
    bias: np.ndarray | None = None
    residual: np.ndarray | None = None
    functional: bool = True
    out: np.ndarray | None = None   # set by the strategy
    act_inputs: tuple = ()          # indices of `inputs` that are activations (the rest: constants)

    @property
    def x(self):
        return self.inputs[0] if self.inputs else None

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    def reference(self, *args):
        """The op's reference kernel (kernels/reference.py through the op schema)."""
        return schema(self.kernel, self.name).reference(*args, **self.params)


@dataclass
class LayerReport:
    index: int
    name: str
    kernel: str
    out_shape: tuple
    flops: int
    seconds: float
    cores: int
    peak: float                         # FLOP/s of the cores used
    clock: float
    busy: dict[str, float]              # resource -> busy seconds
    bytes: dict[str, int]               # memory level / link -> bytes
    mapping: str = ""                   # blocking / partitioning chosen
    phase: str = ""                     # training reports: fwd / bwd
    peaks: dict[str, int] = field(default_factory=dict)   # on-chip memory -> peak bytes of one instance
    instructions: int = 0               # transfer and compute steps issued (one instruction each)

    @property
    def cycles(self) -> float:
        return self.seconds * self.clock

    @property
    def efficiency(self) -> float:
        """Achieved FLOP/s over the peak of the cores used (never above 1: the model's compute
        time is at least FLOPs / peak)."""
        return self.flops / (self.seconds * self.peak) if self.seconds > 0 and self.peak > 0 else 0.0

    @property
    def compute_busy(self) -> float:
        c = [v for k, v in self.busy.items() if k.startswith("compute")]
        return max(c) if c else 0.0

    @property
    def utilization(self) -> float:
        return self.compute_busy / self.seconds if self.seconds > 0 else 0.0

    @property
    def bottleneck(self) -> str:
        """The resource busy longest: 'compute', 'link <name>' or 'host'."""
        if not self.busy:
            return "-"
        agg: dict[str, float] = {}
        for k, v in self.busy.items():
            key = "compute" if k.startswith("compute") else k.split("[")[0].replace("link:", "link ")
            agg[key] = max(agg.get(key, 0.0), v)
        return max(agg, key=agg.get)

    def link_busy(self, link: str) -> float:
        return max([v for k, v in self.busy.items() if k.split("[")[0] == f"link:{link}"] or [0.0])

    def saturated_links(self, threshold: float = 0.9) -> list[str]:
        """Shared links busy for most of the layer's time."""
        if self.seconds <= 0:
            return []
        out = []
        for k, v in self.busy.items():
            if k.startswith("link:") and "[" not in k and v >= threshold * self.seconds:
                out.append(k[5:])
        return out


@dataclass
class SimReport:
    target: Target
    cores: int
    layers: list[LayerReport]
    outputs: list | None
    host: dict[str, float] = field(default_factory=dict)   # host <-> device copies: name -> seconds
    notes: list[str] = field(default_factory=list)
    total_seconds: float | None = None      # strategies with overlapping layers (a layer pipeline) set it
    extra: dict = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        """Device time of one run of the program (layer by layer unless the strategy overlaps)."""
        return self.total_seconds if self.total_seconds is not None else sum(r.seconds for r in self.layers)

    @property
    def host_seconds(self) -> float:
        return sum(self.host.values())

    @property
    def flops(self) -> int:
        return sum(r.flops for r in self.layers)

    @property
    def efficiency(self) -> float:
        peak = self.target.peak_flops(self.cores)
        return self.flops / (self.seconds * peak) if self.seconds > 0 else 0.0

    @property
    def bottleneck(self) -> str:
        by: dict[str, float] = {}
        for r in self.layers:
            by[r.bottleneck] = by.get(r.bottleneck, 0.0) + r.seconds
        if self.host_seconds > self.seconds:
            return "host"
        return max(by, key=by.get) if by else "-"

    def bytes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.layers:
            for k, v in r.bytes.items():
                out[k] = out.get(k, 0) + v
        return out

    def table(self) -> str:
        t = self.target
        head = (f"{'#':>3} {'layer':<24} {'kernel':<16} {'output':<20} {'GFLOP':>8} {'ms':>9} "
                f"{'Mcycles':>9} {'eff %':>6} {'util %':>6}  {'bottleneck':<14} mapping")
        lines = [f"target {t.name}: {t.title}; {self.cores} core(s), {t.dtype}, peak "
                 f"{t.peak_flops(self.cores) / 1e9:.1f} GFLOP/s", head, "-" * len(head)]
        for r in self.layers:
            lines.append(f"{r.index:>3} {r.name[:24]:<24} {r.kernel[:16]:<16} {str(r.out_shape)[:20]:<20} "
                         f"{r.flops / 1e9:>8.3f} {r.seconds * 1e3:>9.3f} {r.cycles / 1e6:>9.3f} "
                         f"{100 * r.efficiency:>6.1f} {100 * r.utilization:>6.1f}  {r.bottleneck:<14} "
                         f"{r.mapping}")
        lines.append("-" * len(head))
        lines.append(f"total: {self.flops / 1e9:.3f} GFLOP in {self.seconds * 1e3:.3f} ms on the device "
                     f"({self.flops / max(self.seconds, 1e-30) / 1e9:.1f} GFLOP/s, {100 * self.efficiency:.1f}% "
                     f"of peak), bottleneck {self.bottleneck}")
        if self.host:
            lines.append("host <-> device: " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in self.host.items())
                         + f"; end to end {(self.seconds + self.host_seconds) * 1e3:.3f} ms")
        b = self.bytes()
        if b:
            lines.append("bytes moved: " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in sorted(b.items())))
        pk: dict[str, int] = {}
        for r in self.layers:
            for k, v in r.peaks.items():
                pk[k] = max(pk.get(k, 0), v)
        if pk:
            lines.append("peak use of one on-chip memory: " + ", ".join(
                f"{k} {v / 1024:.1f} of {self.target.capacity(k) / 1024:.0f} KiB" for k, v in sorted(pk.items())))
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "target": self.target.name, "cores": self.cores, "seconds": self.seconds,
            "host": dict(self.host), "flops": self.flops, "efficiency": self.efficiency,
            "bottleneck": self.bottleneck,
            "layers": [{"index": r.index, "name": r.name, "kernel": r.kernel, "seconds": r.seconds,
                        "cycles": r.cycles, "flops": r.flops, "efficiency": r.efficiency,
                        "utilization": r.utilization, "bottleneck": r.bottleneck, "bytes": dict(r.bytes),
                        "busy": dict(r.busy), "mapping": r.mapping, "phase": r.phase, "peaks": dict(r.peaks),
                        "instructions": r.instructions}
                       for r in self.layers],
            "notes": list(self.notes),
        }


class SimulationError(TilefuseError, RuntimeError):
    """The program cannot be mapped onto the target as asked."""


@dataclass
class ScalingReport:
    """One program simulated at several core counts: per layer efficiency and S_n = P_n / (n P_1)."""
    target: Target
    cores: list[int]
    runs: dict[int, SimReport]

    def layer_rows(self) -> list[dict]:
        base = self.runs[self.cores[0]]
        n0 = self.cores[0]
        rows = []
        for i, r0 in enumerate(base.layers):
            if r0.flops == 0:
                continue
            row = {"index": r0.index, "name": r0.name, "kernel": r0.kernel, "eff": {}, "S": {}, "seconds": {},
                   "saturated": {}}
            p0 = r0.flops / r0.seconds / n0 if r0.seconds > 0 else 0.0
            for n in self.cores:
                r = self.runs[n].layers[i]
                row["eff"][n] = r.efficiency
                row["seconds"][n] = r.seconds
                row["S"][n] = (r.flops / r.seconds) / (n * p0) if r.seconds > 0 and p0 > 0 else 0.0
                row["saturated"][n] = r.saturated_links()
            rows.append(row)
        return rows

    def slower_without_reason(self) -> list[str]:
        """Layers that got slower with more cores while the report names no saturated shared link
        (the invariant says there are none)."""
        bad = []
        for row in self.layer_rows():
            for a, b in zip(self.cores, self.cores[1:]):
                if row["seconds"][b] > row["seconds"][a] * (1 + 1e-9) and not row["saturated"][b]:
                    bad.append(f"{row['name']}: {a} -> {b} cores")
        return bad

    def table(self) -> str:
        cs = self.cores
        head = (f"{'#':>3} {'layer':<26} " + " ".join(f"{'eff' + str(n):>7}" for n in cs) + "  "
                + " ".join(f"{'S' + str(n):>6}" for n in cs) + "  saturated link at the most cores")
        lines = [f"target {self.target.name}: efficiency (% of the peak of the cores used) and scaling "
                 f"S_n = P_n / (n P_1)", head, "-" * len(head)]
        for row in self.layer_rows():
            lines.append(f"{row['index']:>3} {row['name'][:26]:<26} "
                         + " ".join(f"{100 * row['eff'][n]:>7.1f}" for n in cs) + "  "
                         + " ".join(f"{100 * row['S'][n]:>6.1f}" for n in cs) + "  "
                         + (", ".join(row["saturated"][cs[-1]]) or "-"))
        tot = [self.runs[n] for n in cs]
        p1 = tot[0].flops / tot[0].seconds / cs[0] if tot[0].seconds else 0
        lines.append("-" * len(head))
        lines.append(f"{'':>3} {'total':<26} " + " ".join(f"{100 * r.efficiency:>7.1f}" for r in tot) + "  "
                     + " ".join(f"{100 * (r.flops / r.seconds) / (n * p1) if p1 else 0:>6.1f}" for n, r in zip(cs, tot)))
        return "\n".join(lines)
