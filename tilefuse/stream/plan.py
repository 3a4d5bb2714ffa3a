"""The streamed plan: rows each layer holds, activation bytes streamed vs layer by layer, stages.

Activation bytes are counted the same way on both sides; the network input (the caller's
array) and the constants are not activations:
  streamed        = every ring (its real bytes: capacity x row bytes, an NCHW16c ring's rows
                    with the channels padded to a multiple of 16) + the sinks (whole: the streamed part's
                    results) + the scratch buffers of the band kernels (gathered input band,
                    output band, residual band; numpy path: padded bands, im2col columns; one
                    set per thread) + the tail's peak of live tensors. Not counted: the conv
                    kernels' own per-call scratch (Winograd's zero-bordered band copy and V/M
                    tiles, the direct kernel's per-task band), a few MiB, as on the
                    layer-by-layer side.
  layer by layer  = the peak over ops of the live intermediate and output tensors when each
                    op writes its whole output (tensors freed after their last reader: the
                    ideal that tilefuse's liveness planner approaches; im2col scratch of the
                    layer-by-layer kernels not counted, which favours layer by layer)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import Network


def layer_by_layer_bytes(net: Network) -> int:
    """Peak bytes of live non-input, non-constant tensors executing `net` op by op."""
    last: dict[str, int] = {}
    outs = {d.name for d in net.outputs}
    for i, op in enumerate(net.ops):
        for d in op.inputs:
            if not d.is_constant:
                last[d.name] = i
    inputs = {d.name for d in net.inputs}
    live: dict[str, int] = {}
    peak = 0
    for i, op in enumerate(net.ops):
        out = op.outputs[0]
        live[out.name] = out.nbytes
        peak = max(peak, sum(live.values()))
        for d in op.inputs:
            if not d.is_constant and d.name not in inputs and d.name not in outs and last.get(d.name) == i:
                live.pop(d.name, None)
        if out.name not in outs and out.name not in last:
            live.pop(out.name, None)
    return peak


@dataclass
class StreamPlan:
    rows: list[dict]
    ring_bytes: int
    sink_bytes: int
    scratch_bytes: int
    tail_bytes: int
    layer_by_layer_bytes: int
    band_rows: int
    workers: int
    stage_flops: list[int] = field(default_factory=list)
    crossing: list[str] = field(default_factory=list)
    tail_ops: list[str] = field(default_factory=list)
    steps: int = 0

    @property
    def streamed_bytes(self) -> int:
        return self.ring_bytes + self.sink_bytes + self.scratch_bytes + self.tail_bytes

    @property
    def reduction(self) -> float:
        return self.layer_by_layer_bytes / max(self.streamed_bytes, 1)

    def as_dict(self) -> dict:
        return {"ring_bytes": self.ring_bytes, "sink_bytes": self.sink_bytes,
                "scratch_bytes": self.scratch_bytes, "tail_bytes": self.tail_bytes,
                "streamed_bytes": self.streamed_bytes, "layer_by_layer_bytes": self.layer_by_layer_bytes,
                "reduction": self.reduction, "band_rows": self.band_rows, "workers": self.workers,
                "stage_flops": self.stage_flops, "steps": self.steps}

    def __str__(self) -> str:
        mib = 2.0 ** 20
        head = (f"{'#':>3} {'op':<10} {'name':<22} {'output':<22} {'rows held':>10} {'held MiB':>9} "
                f"{'whole MiB':>10} {'MFLOP':>9} {'stage':>5}")
        lines = [head, "-" * len(head)]
        for r in self.rows:
            held = "whole" if r["whole"] else f"{r['capacity']}/{r['height']}"
            held += "c" if r.get("layout") == "nchwc" else " "
            lines.append(f"{r['index']:>3} {r['op']:<10} {r['name'][:22]:<22} {str(r['shape']):<22} {held:>10} "
                         f"{r['held_bytes'] / mib:>9.2f} {r['bytes'] / mib:>10.2f} {r['flops'] / 1e6:>9.1f} "
                         f"{r['stage']:>5}")
        lines.append("-" * len(head))
        lines.append("rows held ending in 'c': an NCHW16c ring (channels padded to 16, bytes counted padded)")
        lines.append(f"band {self.band_rows} rows, {self.steps} steps; tail (whole tensors): "
                     f"{', '.join(self.tail_ops) or 'none'}")
        lines.append(f"activation memory streamed {self.streamed_bytes / mib:.2f} MiB (rings "
                     f"{self.ring_bytes / mib:.2f} + outputs of the streamed part {self.sink_bytes / mib:.2f} + "
                     f"band scratch {self.scratch_bytes / mib:.2f} + tail {self.tail_bytes / mib:.2f}) vs layer by "
                     f"layer {self.layer_by_layer_bytes / mib:.2f} MiB (layer by layer / streamed = {self.reduction:.1f})")
        if self.workers > 1:
            tot = max(sum(self.stage_flops), 1)
            parts = ", ".join(f"stage {k}: {f / 1e9:.2f} GFLOP ({100 * f / tot:.0f}%)"
                              for k, f in enumerate(self.stage_flops))
            lines.append(f"layer pipeline, {self.workers} stages: {parts}; rings crossing stages get extra "
                         f"bands: {', '.join(self.crossing) or 'none'}")
        return "\n".join(lines)


def make_plan(streamed) -> StreamPlan:
    from .layer_pipeline import PipelineExecutor
    sched = streamed.schedule
    ex = streamed.executor
    pipe = isinstance(ex, PipelineExecutor)
    stage_of = ex.stage_of if pipe else [0] * len(sched.layers)
    rings = ex.rings.rings
    rows = []
    for l in sched.layers:
        t = sched.tensors[l.output]
        held = t.nbytes if t.whole else rings[t.name].nbytes
        rows.append({"index": l.index, "op": l.kind, "name": l.name, "shape": t.shape, "height": t.shape[2],
                     "capacity": t.capacity if t.whole else rings[t.name].capacity, "whole": t.whole,
                     "held_bytes": held, "bytes": t.nbytes, "flops": l.flops, "stage": stage_of[l.index],
                     "layout": "nchwc" if (not t.whole and rings[t.name].blocked) else "nchw"})
    scratch = sum(s.nbytes for s in ex.scratch) if pipe else ex.scratch.nbytes
    sink_bytes = sum(sched.tensors[s].nbytes for s in sched.sinks)
    tail_bytes = 0
    if sched.tail:
        tail_net_out = {d.name for d in sched.network.outputs}
        tail_bytes = sum(op.outputs[0].nbytes for op in sched.tail if op.outputs[0].name in tail_net_out) + \
            max(op.outputs[0].nbytes for op in sched.tail)
    return StreamPlan(rows, ex.rings.ring_bytes, sink_bytes, scratch, tail_bytes,
                      layer_by_layer_bytes(sched.network), sched.band_rows, ex.workers if pipe else 1,
                      ex.stage_flops() if pipe else [sched.streamed_flops], ex.crossing if pipe else [],
                      [op.name for op in sched.tail], len(sched.steps))
