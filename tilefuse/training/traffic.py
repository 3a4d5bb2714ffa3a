"""Main-memory traffic and activation memory, counted from the executed schedule.

Model (the paper's accelerator, section 2): a *unit* is one kernel that streams tensors in
from main memory and out to it; everything inside a unit stays on chip. A unit reads each
tensor once per side - the conv's input space ("in": its input, the WG input, tensors its
input-stage pre-processing or its input-gradient post-processing needs) and its output space
("out": its output gradient and what the backward pre-processing needs) - and writes the
tensors that leave it. Each read or write is charged to a layer: the conv's natural input and
output to the conv; whatever pre/post-processing adds to the memory-bound layer that needs it.
Only activations and activation gradients are counted (weights and per-channel vectors are
not), as in the paper's tables.

Memory held: every tensor written to main memory during the forward pass is live until the
backward unit of the op that wrote it has run (a layer-by-layer executor; Caffe keeps blobs
the same way). What is live when the forward pass ends is what the step holds for backward.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass


@dataclass
class Access:
    phase: str      # "fwd" | "bwd"
    unit: str       # name of the executed unit
    layer: str      # op the bytes are charged to
    kind: str       # "read" | "write"
    tensor: str
    nbytes: int


class UnitLog:
    """Reads and writes of one executed unit (deduplicated per (side, tensor))."""

    def __init__(self, log: "TrafficLog", phase: str, name: str):
        self.log, self.phase, self.name = log, phase, name
        self._seen: set = set()

    def read(self, tensor: str, nbytes: int, layer: str, side: str = "in"):
        key = (side, tensor)
        if key in self._seen:
            return
        self._seen.add(key)
        self.log.accesses.append(Access(self.phase, self.name, layer, "read", tensor, int(nbytes)))

    def write(self, tensor: str, nbytes: int, layer: str):
        self.log.accesses.append(Access(self.phase, self.name, layer, "write", tensor, int(nbytes)))


class TrafficLog:
    def __init__(self):
        self.accesses: list[Access] = []

    def unit(self, phase: str, name: str) -> UnitLog:
        return UnitLog(self, phase, name)

    def by_layer(self) -> dict:
        """{layer: {"fwd": bytes, "bwd": bytes}}."""
        out: dict = defaultdict(lambda: {"fwd": 0, "bwd": 0})
        for a in self.accesses:
            out[a.layer][a.phase] += a.nbytes
        return dict(out)


class MemoryTracker:
    """Live activation buffers (bytes, charged layer, writing unit), with the peak."""

    def __init__(self):
        self.live: dict[str, tuple[int, str, str]] = {}
        self.current = 0
        self.peak = 0
        self.held_at_fwd_end: dict[str, int] = {}

    def alloc(self, name: str, nbytes: int, layer: str, writer: str):
        if name in self.live:
            self.free(name)
        self.live[name] = (int(nbytes), layer, writer)
        self.current += int(nbytes)
        self.peak = max(self.peak, self.current)

    def free(self, name: str):
        if name in self.live:
            self.current -= self.live.pop(name)[0]

    def free_written_by(self, writer: str):
        for k in [k for k, v in self.live.items() if v[2] == writer]:
            self.free(k)

    def end_forward(self):
        held: dict[str, int] = defaultdict(int)
        for nbytes, layer, _ in self.live.values():
            held[layer] += nbytes
        self.held_at_fwd_end = dict(held)


def pattern_table(patterns, log: TrafficLog, mem: MemoryTracker) -> list[dict]:
    """Per pattern: memory-bound traffic forward/backward and memory held, in bytes and units."""
    by_layer = log.by_layer()
    rows = []
    for p in patterns:
        names = {m.name for m in p.members}
        fwd = sum(by_layer.get(n, {}).get("fwd", 0) for n in names)
        bwd = sum(by_layer.get(n, {}).get("bwd", 0) for n in names)
        held = sum(mem.held_at_fwd_end.get(n, 0) for n in names)
        u = p.unit_bytes
        rows.append({"pattern": p.name, "kind": p.kind, "unit_bytes": u, "fwd_bytes": fwd,
                     "bwd_bytes": bwd, "held_bytes": held, "fwd_units": fwd / u,
                     "bwd_units": bwd / u, "held_units": held / u})
    return rows


def format_report(schedule_name: str, layers: list, patterns, log: TrafficLog,
                  mem: MemoryTracker, memory_bound: set, unit_of: dict) -> str:
    """Text report: per layer (bytes; memory-bound layers also in units of their input) and
    per pattern (bytes and the paper's unit)."""
    by_layer = log.by_layer()
    lines = [f"traffic report, schedule '{schedule_name}' (activation bytes to/from main memory)",
             f"{'layer':<32} {'kind':<14} {'fwd B':>12} {'bwd B':>12} {'held B':>12}"
             f" {'fwd u':>6} {'bwd u':>6} {'held u':>6}"]
    tot = {"fwd": 0, "bwd": 0, "mb_fwd": 0, "mb_bwd": 0}
    for name, kind in layers:
        t = by_layer.get(name, {"fwd": 0, "bwd": 0})
        held = mem.held_at_fwd_end.get(name, 0)
        tot["fwd"] += t["fwd"]
        tot["bwd"] += t["bwd"]
        if name in memory_bound:
            tot["mb_fwd"] += t["fwd"]
            tot["mb_bwd"] += t["bwd"]
            u = unit_of.get(name) or 1
            units = f" {t['fwd'] / u:6.2f} {t['bwd'] / u:6.2f} {held / u:6.2f}"
        else:
            units = ""
        lines.append(f"{name:<32} {kind:<14} {t['fwd']:>12,} {t['bwd']:>12,} {held:>12,}{units}")
    extra = sorted(set(by_layer) - {n for n, _ in layers})
    for name in extra:
        t = by_layer[name]
        tot["fwd"] += t["fwd"]
        tot["bwd"] += t["bwd"]
        lines.append(f"{name:<32} {'grad-add':<14} {t['fwd']:>12,} {t['bwd']:>12,} {0:>12,}")
    lines.append(f"{'total':<32} {'':<14} {tot['fwd']:>12,} {tot['bwd']:>12,} "
                 f"{sum(mem.held_at_fwd_end.values()):>12,}")
    lines.append(f"{'  of which memory-bound':<32} {'':<14} {tot['mb_fwd']:>12,} {tot['mb_bwd']:>12,}")
    lines.append(f"peak live activations + gradients: {mem.peak:,} B")
    if patterns:
        lines.append("")
        lines.append(f"{'pattern':<48} {'unit B':>10} {'FP':>6} {'BP':>6} {'held':>6}  (paper's unit)")
        for r in pattern_table(patterns, log, mem):
            lines.append(f"{r['pattern']:<48} {r['unit_bytes']:>10,} {r['fwd_units']:6.2f} "
                         f"{r['bwd_units']:6.2f} {r['held_units']:6.2f}")
    return "\n".join(lines)
