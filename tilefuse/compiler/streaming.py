"""schedule="stream": the row-band schedule lowered into the program and the package.

`compile(net, schedule="stream", stream_options=...)` runs the same passes and the same
algorithm pass as the layer schedule, then:

1. `bands.build_schedule`: the streamable part, row windows, the dry run (steps, capacities);
2. `bands.assign_ring_layouts`: which rings hold NCHW16c rows; with `workers > 1` the layers
   are cut into cost-balanced stages (`bands.balance_stages`) and the tensors crossing a stage
   boundary get `queue_bands` more bands of capacity;
3. lowering (`lower_streamed`), the program starts with the region

       stream  [steps]                     header: params layers L, band_rows, workers, stages;
                                           operand: the steps, an (S, 3) int32 constant
       band    [inputs..., output]  x L    one per streamed layer: the op and its params
                                           ("attrs", a conv's with its algorithm), the row
                                           windows of its activation inputs, every activation
                                           operand's logical (N, C, H, W), ring capacity and
                                           layout ("tensors"), prepared conv weights as constants

   whose ring operands are hidden blocks of the ring's real size ((N, C, capacity, W), or
   (N, ceil(C/16), capacity, W, 16) for an NCHW16c ring), sinks hidden whole tensors or IO
   outputs, the network input its IO block; then the tail's ordinary instructions (lowered and
   laid out as in the layer schedule). Every hidden block of the region stays live across the
   whole region (its layers run interleaved), so the memory planner never lets two rings share
   bytes; the tail may reuse them afterwards.

The runtime runs the region in its stream mode (`runtime/streaming.py`). A package with a
region is validated on load like any other program, and more (`validate_stream`): the band
params against the op table, every operand's shape against its logical shape and capacity,
the windows against the params, and the steps replayed against the capacities
(`bands.check_steps`), so no step can read a row not held or overwrite one still needed, and
each band's rows_max (its scratch size) equal to its steps' largest.
`StreamPlan` is the memory report (`compiled.plan().stream`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import GraphError, PackageError
from ..ir import Network, ops
from ..ir.node import DataNode
from ..ir.ops import schema
from ..kernels import bands as kernel_bands
from ..kernels.bands import LANES, BandLayer, RowTable, RowWindow, band_layout, make_runner, \
    window_from_param
from ..kernels.threads import Scratch
from . import bands
from .bands import (BandSchedule, assign_ring_layouts, balance_stages, build_schedule, check_steps,
                    layer_cost, layer_window, ring_capacities)
from .layout import assign_layouts, check_layouts, hidden_and_lifetimes
from .lower import Lowered, lower
from .program import CONST, DIRECT, HIDDEN, INDIRECT, IO, Instruction, Operand

STEPS = "__stream_steps__"
REGION_HEADERS = frozenset({"stream"})     # instructions that open a region (they write nothing)
REGION_KERNELS = REGION_HEADERS | {"band"}  # a program with any of these gets `validate_stream`
# how a band operand holds its tensor ("tensors": [N, C, H, W, rows held, kind] per operand)
WHOLE, RING, RING_C = 0, 1, 2           # whole NCHW tensor, NCHW ring, NCHW16c ring
OPTIONS = ("band_rows", "workers", "queue_bands", "band_mode", "layer_rows", "layout", "min_band_pixels", "threads")


@dataclass
class StreamInfo:
    """What the row-band stage decided (kept on the CompiledNetwork; the package has it all too)."""
    schedule: BandSchedule
    blocked: set[str]                    # rings holding NCHW16c rows
    capacities: dict[str, int]           # ring tensor -> rows held (queue bands included)
    stage_of: list[int]                  # stage of each streamed layer
    workers: int
    queue_bands: int
    rings: str                           # "nchwc" or "nchw"
    costs: list[float] = field(default_factory=list)
    scratch_bytes: int = 0               # band scratch, one set per stage

    @property
    def crossing(self) -> list[str]:
        s = self.schedule
        return sorted(n for n, t in s.tensors.items() if not t.whole and
                      any(self.stage_of[c] != self.stage_of[t.producer] for c, _ in t.consumers))

    def stage_costs(self) -> list[float]:
        out = [0.0] * (max(self.stage_of) + 1 if self.stage_of else 1)
        for l, c in zip(self.schedule.layers, self.costs):
            out[self.stage_of[l.index]] += c
        return out

    def stage_flops(self) -> list[int]:
        out = [0] * (max(self.stage_of) + 1 if self.stage_of else 1)
        for l in self.schedule.layers:
            out[self.stage_of[l.index]] += l.flops
        return out


def stream_options(options: dict | None, layout_mode: str) -> dict:
    """The stream options with their defaults; unknown names and bad values raise."""
    o = dict(options or {})
    o.pop("threads", None)          # the session's thread count: compile() takes it from here
    unknown = sorted(set(o) - set(OPTIONS))
    if unknown:
        raise ValueError(f"stream option(s) {unknown} unknown; expected some of {OPTIONS}")
    o.setdefault("band_rows", 4)
    o.setdefault("workers", 1)
    o.setdefault("queue_bands", 2)
    o.setdefault("band_mode", "layer")
    o.setdefault("layout", "nchw" if layout_mode == "nchw" else "nchwc")
    o.setdefault("min_band_pixels", 0)
    o.setdefault("layer_rows", None)
    for k in ("band_rows", "workers"):
        if isinstance(o[k], bool) or not isinstance(o[k], int) or o[k] < 1:
            raise ValueError(f"stream option {k} must be a positive integer, got {o[k]!r}")
    if isinstance(o["queue_bands"], bool) or not isinstance(o["queue_bands"], int) or o["queue_bands"] < 0:
        raise ValueError(f"stream option queue_bands must be an integer >= 0, got {o['queue_bands']!r}")
    if o["band_mode"] not in ("layer", "input"):
        raise ValueError(f"band_mode must be 'layer' or 'input', got {o['band_mode']!r}")
    if o["layout"] not in ("nchwc", "nchw"):
        raise ValueError(f"layout must be 'nchwc' or 'nchw', got {o['layout']!r}")
    return o


def _layer_rows(o: dict):
    """Rows per step of each layer (band_mode "layer"), or None (band_mode "input")."""
    band = o["band_rows"]
    if o["band_mode"] == "input":
        return None
    if o["layer_rows"] is not None:
        return o["layer_rows"]
    if o["min_band_pixels"] > 0:
        def rows(layer):
            r, wo = band, layer.op.outputs[0].shape[3]
            while r * wo < o["min_band_pixels"] and r < 4 * band:
                r *= 2
            return r
        return rows
    return lambda layer: band


class ConstBlock:
    """A constant block of the program that is no tensor of the network (the steps): what
    REOFF packing reads of a constant (name, value, shape, dtype, nbytes)."""

    def __init__(self, name: str, value: np.ndarray):
        self.name, self.value = name, np.ascontiguousarray(value)
        self.shape, self.dtype, self.nbytes = self.value.shape, self.value.dtype, self.value.nbytes


def _blocked_shape(shape, capacity: int) -> tuple[int, ...]:
    n, c, _, w = shape
    return (n, -(-c // LANES), capacity, w, LANES)


def lower_streamed(opt: Network, conv_rule, options: dict, layout_mode: str) -> tuple[Lowered, StreamInfo, str]:
    """(the lowered program: region + tail, what the stage decided, a log line)."""
    o = stream_options(options, layout_mode)
    sched = build_schedule(opt, o["band_rows"], _layer_rows(o))
    blocked = assign_ring_layouts(sched, o["layout"])
    costs = [layer_cost(l, sched) for l in sched.layers]
    stage_of = balance_stages(costs, o["workers"]) if o["workers"] > 1 else [0] * len(sched.layers)
    workers = max(stage_of) + 1 if stage_of else 1
    caps = ring_capacities(sched, stage_of, o["queue_bands"] if workers > 1 else 0)
    io_names = {d.name for d in opt.inputs} | {d.name for d in opt.outputs}

    def act(name: str) -> tuple[Operand, list[int]]:
        t = sched.tensors[name]
        n, c, h, w = t.shape
        if name in io_names:
            return Operand(name, INDIRECT, IO, t.dtype, t.shape), [n, c, h, w, h, WHOLE]
        if t.whole:
            return Operand(name, DIRECT, HIDDEN, t.dtype, t.shape), [n, c, h, w, h, WHOLE]
        cap, b = caps[name], name in blocked
        shape = _blocked_shape(t.shape, cap) if b else (n, c, cap, w)
        return Operand(name, DIRECT, HIDDEN, t.dtype, shape), [n, c, h, w, cap, RING_C if b else RING]

    steps = np.asarray(sched.steps, dtype=np.int32).reshape(-1, 3)
    constants = [ConstBlock(STEPS, steps)]
    header = Instruction("stream", [Operand(STEPS, DIRECT, CONST, np.dtype(np.int32), steps.shape)], {
        "layers": len(sched.layers), "band_rows": o["band_rows"], "band_mode": o["band_mode"],
        "workers": workers, "stages": stage_of if workers > 1 else [], "rings": o["layout"]})
    instructions, flops = [header], [0]
    for l in sched.layers:
        op = l.op
        p = dict(op.params)
        ins_nodes = list(op.inputs)
        params = {"op": l.kind, "name": op.name, "attrs": p,
                  "windows": [w.param() for w in l.windows],
                  "rows_max": max(sched.step_rows(l.index))}
        if l.kind == "conv2d":
            params["weight_shape"] = list(op.inputs[1].shape)
            if p.get("algorithm", "reference") != "reference" and op.outputs[0].dtype == np.float32:
                from ..kernels.conv import conv2d_prepare
                _, native_in, _ = band_layout(l.kind, p, op.outputs[0].dtype, [], o["layout"])
                wl = "nchwc" if native_in else "nchw"
                bias = op.inputs[2].value if p["has_bias"] else None
                prepared = conv2d_prepare(p["algorithm"], op.inputs[1].value, bias, p["stride"], p["padding"],
                                          p["dilation"], p["groups"], layout=wl)
                nodes = [DataNode(f"{op.inputs[1].name}@{p['algorithm']}.{wl}.band.{k}", v.shape, np.float32,
                                  np.ascontiguousarray(v, dtype=np.float32)) for k, v in prepared.items()]
                ins_nodes = ins_nodes[:1] + nodes + ins_nodes[2 + int(p["has_bias"]):]
                params["prepared"], params["layout"] = list(prepared), wl
        operands, tensors = [], []
        for d in ins_nodes + [op.outputs[0]]:
            if d.is_constant:
                if all(c.name != d.name for c in constants):
                    constants.append(d)
                operands.append(Operand(d.name, DIRECT, CONST, d.dtype, d.shape))
            else:
                opnd, desc = act(d.name)
                operands.append(opnd)
                tensors.append(desc)
        params["tensors"] = tensors
        instructions.append(Instruction("band", operands, params))
        flops.append(l.flops)
    region_end = len(instructions) - 1
    # the tail: ordinary instructions on whole tensors, laid out as in the layer schedule
    tail = lower(opt, conv_rule, ops=sched.tail)
    lay = assign_layouts(tail.instructions, tail.flops, layout_mode)
    check_layouts(lay.instructions)
    instructions += lay.instructions
    flops += lay.flops
    for d in tail.constants:
        if all(c.name != d.name for c in constants):
            constants.append(d)
    hidden, life = hidden_and_lifetimes(instructions)
    for ins in instructions[:region_end + 1]:        # the region's blocks live across the region
        for opnd in ins.operands:
            if opnd.segment == HIDDEN:
                a, b = life[opnd.name]
                life[opnd.name] = (0, max(b, region_end))
    low = Lowered(instructions, constants, hidden, life, tail.io, flops)
    info = StreamInfo(sched, blocked, caps, stage_of, workers, o["queue_bands"], o["layout"], costs)
    info.scratch_bytes = _scratch_bytes(info)
    log = (f"row bands: {len(sched.layers)} ops streamed in bands of {o['band_rows']} rows "
           f"({len(sched.steps)} steps, {len(blocked)} NCHW16c rings, {workers} stage(s)); tail "
           f"{len(sched.tail)} ops; {lay.conversions} layout conversions in the tail" +
           "".join(f"; streamed part ends at '{n}' ({o}): {w}" for n, o, w in sched.ends))
    return low, info, log


def band_layer(info: StreamInfo, index: int, consts=None) -> BandLayer:
    """The BandLayer of streamed layer `index` as the stage sees it (no prepared weights)."""
    s = info.schedule
    l = s.layers[index]
    op = l.op
    return BandLayer(name=op.name, kind=l.kind, params=dict(op.params),
                     in_shapes=[s.tensors[n].shape for n in l.inputs], out_shape=s.tensors[l.output].shape,
                     dtype=op.outputs[0].dtype, windows=list(l.windows),
                     consts=consts if consts is not None else [d.value for d in op.inputs if d.is_constant],
                     weight_shape=op.inputs[1].shape if l.kind == "conv2d" else None,
                     rows_max=max(s.step_rows(index)), reference=schema(l.kind).reference,
                     blocked_weights=band_layout(l.kind, op.params, op.outputs[0].dtype, [], info.rings)[1])


def _scratch_bytes(info: StreamInfo) -> int:
    """The band scratch the stream mode reserves: per stage, each slot's largest need."""
    stages = [Scratch() for _ in range(info.workers)]
    for l in info.schedule.layers:
        r = make_runner(band_layer(info, l.index))
        r.out_blocked = l.output in info.blocked
        for slot, n in r.scratch_need().items():
            stages[info.stage_of[l.index]].reserve(slot, n, getattr(r, "acc", r.dtype))
    return sum(s.nbytes for s in stages)


# ----------------------------------------------------------------------------- the plan

def layer_by_layer_bytes(net: Network) -> int:
    """Peak bytes of live non-input, non-constant tensors executing `net` op by op (each op
    writes its whole output; tensors freed after their last reader: the ideal that the
    liveness planner approaches; im2col scratch not counted, which favours layer by layer)."""
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
    """Rows each streamed layer holds, activation bytes streamed vs layer by layer, stages.

    Activation bytes are counted the same way on both sides; the network input and the
    constants are not activations:
      streamed        = every ring (its real bytes: capacity x row bytes, an NCHW16c ring's rows
                        with the channels padded to a multiple of 16) + the sinks (whole: the
                        streamed part's results) + the band kernels' scratch (gathered input
                        band, output band, residual band; one set per stage) + the tail's
                        outputs and its largest tensor. Not counted: the conv kernels' own
                        per-call scratch (Winograd's zero-bordered band copy and V/M tiles, the
                        direct kernel's per-task band), a few MiB, as on the layer-by-layer side.
      layer by layer  = `layer_by_layer_bytes` of the optimized network."""
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
    ends: list = field(default_factory=list)   # (op name, op, why): where the streamed part ends

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
                "stage_flops": self.stage_flops, "steps": self.steps,
                "ends": [{"name": n, "op": o, "why": w} for n, o, w in self.ends]}

    def __str__(self) -> str:
        mib = 2.0 ** 20
        ow = max([10] + [len(r["op"]) for r in self.rows])        # (pixel_shuffle, conv_transpose2d)
        head = (f"{'#':>3} {'op':<{ow}} {'name':<22} {'output':<22} {'rows held':>10} {'held MiB':>9} "
                f"{'whole MiB':>10} {'MFLOP':>9} {'stage':>5}")
        lines = [head, "-" * len(head)]
        for r in self.rows:
            held = "whole" if r["whole"] else f"{r['capacity']}/{r['height']}"
            held += "c" if r.get("layout") == "nchwc" else " "
            lines.append(f"{r['index']:>3} {r['op']:<{ow}} {r['name'][:22]:<22} {str(r['shape']):<22} {held:>10} "
                         f"{r['held_bytes'] / mib:>9.2f} {r['bytes'] / mib:>10.2f} {r['flops'] / 1e6:>9.1f} "
                         f"{r['stage']:>5}")
        lines.append("-" * len(head))
        lines.append("rows held ending in 'c': an NCHW16c ring (channels padded to 16, bytes counted padded)")
        lines.append(f"band {self.band_rows} rows, {self.steps} steps; tail (whole tensors): "
                     f"{', '.join(self.tail_ops) or 'none'}")
        for name, op, why in self.ends:
            lines.append(f"streamed part ends at '{name}' ({op}): {why}")
        lines.append(f"activation memory streamed {self.streamed_bytes / mib:.2f} MiB (rings "
                     f"{self.ring_bytes / mib:.2f} + outputs of the streamed part {self.sink_bytes / mib:.2f} + "
                     f"band scratch {self.scratch_bytes / mib:.2f} + tail {self.tail_bytes / mib:.2f}) vs layer by "
                     f"layer {self.layer_by_layer_bytes / mib:.2f} MiB (layer by layer / streamed = {self.reduction:.1f})")
        if self.streamed_bytes > self.layer_by_layer_bytes:
            lines.append("streaming holds more activation memory than layer by layer here: the tail keeps "
                         "the streamed part's outputs whole; schedule='layer' uses less")
        if self.workers > 1:
            tot = max(sum(self.stage_flops), 1)
            parts = ", ".join(f"stage {k}: {f / 1e9:.2f} GFLOP ({100 * f / tot:.0f}%)"
                              for k, f in enumerate(self.stage_flops))
            lines.append(f"layer pipeline, {self.workers} stages: {parts}; rings crossing stages get extra "
                         f"bands: {', '.join(self.crossing) or 'none'}")
        return "\n".join(lines)


def stream_plan(info: StreamInfo) -> StreamPlan:
    s = info.schedule
    rows = []
    ring_bytes = 0
    for l in s.layers:
        t = s.tensors[l.output]
        if t.whole:
            held, cap = t.nbytes, t.capacity
        else:
            cap = info.capacities[t.name]
            shape = _blocked_shape(t.shape, cap) if t.name in info.blocked else t.shape[:2] + (cap, t.shape[3])
            held = int(np.prod(shape)) * t.dtype.itemsize
            ring_bytes += held
        rows.append({"index": l.index, "op": l.kind, "name": l.name, "shape": t.shape, "height": t.shape[2],
                     "capacity": cap, "whole": t.whole, "held_bytes": held, "bytes": t.nbytes, "flops": l.flops,
                     "stage": info.stage_of[l.index], "layout": "nchwc" if t.name in info.blocked else "nchw"})
    sink_bytes = sum(s.tensors[n].nbytes for n in s.sinks)
    tail_bytes = 0
    if s.tail:
        outs = {d.name for d in s.network.outputs}
        tail_bytes = sum(op.outputs[0].nbytes for op in s.tail if op.outputs[0].name in outs) + \
            max(op.outputs[0].nbytes for op in s.tail)
    return StreamPlan(rows, ring_bytes, sink_bytes, info.scratch_bytes, tail_bytes, layer_by_layer_bytes(s.network),
                      s.band_rows, info.workers, info.stage_flops(), info.crossing if info.workers > 1 else [],
                      [op.name for op in s.tail], len(s.steps), list(s.ends))


# ----------------------------------------------------------------------------- validation on load

class _T:
    __slots__ = ("name", "shape", "dtype")

    def __init__(self, name, shape, dtype):
        self.name, self.shape, self.dtype = name, tuple(shape), np.dtype(dtype)


def _int_list(v, n: int, what: str) -> list[int]:
    if not isinstance(v, (list, tuple)) or len(v) != n or any(isinstance(x, bool) or not isinstance(x, int)
                                                              for x in v):
        raise ValueError(f"{what} is {v!r}; expected {n} integers")
    return [int(x) for x in v]


HEADER_PARAMS = {"layers", "band_rows", "band_mode", "workers", "stages", "rings"}
BAND_PARAMS = {"op", "name", "attrs", "windows", "tensors", "rows_max", "weight_shape", "prepared", "layout"}


def _check_band(ins: Instruction) -> dict:
    """One band instruction against the op table; returns what `check_steps` needs of it."""
    p = ins.params
    extra = sorted(set(p) - BAND_PARAMS)
    if extra:
        raise ValueError(f"parameter(s) {extra} unknown to the band kernel")
    op = p.get("op")
    if op not in bands.STREAMABLE:
        raise ValueError(f"op {op!r} does not stream; expected one of {sorted(bands.STREAMABLE)}")
    conv_only = sorted({"weight_shape", "prepared", "layout"} & set(p))
    if op != "conv2d" and conv_only:
        raise ValueError(f"parameter(s) {conv_only} are for conv2d bands, not {op}")
    if op == "conv2d" and ("prepared" in p) != ("layout" in p):
        raise ValueError("'prepared' and 'layout' come together (prepared weights and their layout)")
    attrs = p.get("attrs")
    if not isinstance(attrs, dict) or not isinstance(p.get("name"), str):
        raise ValueError("params 'attrs' (an object) and 'name' (a string) are required")
    norm = schema(op).normalize(p["name"], attrs)
    if norm != attrs:
        raise ValueError(f"attrs {attrs} are not the normal form of {op}'s params ({norm})")
    if op == "slice" and attrs["axis"] % 4 == 0:
        raise ValueError(f"slice of axis {attrs['axis']} (the batch): only slices of channels, rows or columns stream")
    if op == "slice" and attrs["axis"] % 4 == 2 and attrs["step"] < 0:
        raise ValueError(f"slice of rows with step {attrs['step']} (rows reversed) does not stream")
    if op == "pad" and (len(attrs["pads"]) != 8 or any(attrs["pads"][:4])):
        raise ValueError(f"pads {attrs['pads']}: only H and W pads of an (N, C, H, W) tensor stream")
    acts = [o for o in ins.operands if o.segment != CONST]
    consts = [o for o in ins.inputs if o.segment == CONST]
    if not acts or acts[-1] is not ins.output:
        raise ValueError("the output must be an activation (hidden or IO) operand")
    # operands in the op's input order, constants where its parameters go (the band kernels and
    # every reader of the program take them by position)
    pattern = "".join("c" if o.segment == CONST else "a" for o in ins.inputs)
    if op == "conv2d":
        k = len(p["prepared"]) if p.get("prepared") else 1 + int(bool(attrs.get("has_bias")))
        want = "a" + "c" * k + "a" * int(bool(attrs.get("has_residual")))
        if pattern != want:
            raise ValueError(f"operands are {pattern!r} (a: activation, c: constant); a conv takes {want!r}")
    elif op == "conv_transpose2d":
        want = "a" + "c" * (1 + int(bool(attrs.get("has_bias"))))
        if pattern != want:
            raise ValueError(f"operands are {pattern!r} (a: activation, c: constant); a transposed conv takes "
                             f"{want!r}")
    elif (op in ops.POOL or op in ("resize", "pad", "pixel_shuffle") or op in kernel_bands.BLOCKED_ROW_OPS - {"add"}) \
            and "c" in pattern:
        raise ValueError(f"{op} takes no constant operands; found {pattern!r} (a: activation, c: constant)")
    tensors = p.get("tensors")
    if not isinstance(tensors, (list, tuple)) or len(tensors) != len(acts):
        raise ValueError(f"'tensors' must describe the {len(acts)} activation operands")
    descs = []
    for o, t in zip(acts, tensors):
        n, c, h, w, cap, kind = _int_list(t, 6, f"tensor '{o.name}'")
        if min(n, c, h, w, cap) < 1 or cap > h or kind not in (WHOLE, RING, RING_C) or (kind == WHOLE and cap != h):
            raise ValueError(f"tensor '{o.name}' {t}: expected positive sizes, 1 <= rows held <= height, kind "
                             f"{WHOLE} (whole, all rows held), {RING} (NCHW ring) or {RING_C} (NCHW16c ring)")
        want = {WHOLE: (n, c, h, w), RING: (n, c, cap, w), RING_C: _blocked_shape((n, c, h, w), cap)}[kind]
        if tuple(o.shape) != want or (o.segment == IO and kind != WHOLE):
            raise ValueError(f"operand '{o.name}' has shape {o.shape}; expected {want} for logical {(n, c, h, w)} "
                             f"with {cap} rows held ({['whole', 'NCHW ring', 'NCHW16c ring'][kind]})")
        descs.append(((n, c, h, w), cap, kind))
    # NCHW16c rings only where the band kernel has that form (band_layout), one layout for "same"
    role = band_layout(op, attrs, acts[-1].dtype, [d[0][1] for d in descs[:-1]],
                       const_shapes=[tuple(o.shape) for o in consts])[0]
    kinds = {RING_C if d[2] == RING_C else RING for d in descs}
    if role == "nchw" and RING_C in kinds or role == "same" and len(kinds) > 1:
        raise ValueError(f"tensor layouts {[['whole', 'NCHW ring', 'NCHW16c ring'][d[2]] for d in descs]}: the "
                         f"{op} band kernel takes {'NCHW rings only' if role == 'nchw' else 'one layout'}")
    # the output shape re-derived from the params and the logical input shapes
    ins_t, ai, ci = [], 0, 0
    roles = schema(op).input_roles(attrs)
    if op == "conv2d":
        wshape = tuple(_int_list(p.get("weight_shape"), 4, "weight_shape"))
        if p.get("prepared"):
            if not isinstance(p["prepared"], (list, tuple)) or len(p["prepared"]) != len(consts) or \
                    p.get("layout") not in ("nchw", "nchwc"):
                raise ValueError("'prepared' must name each constant operand, 'layout' be nchw or nchwc")
        ins_t = [_T(acts[0].name, descs[0][0], acts[0].dtype), _T("weight", wshape, acts[0].dtype)]
        if attrs["has_bias"]:
            ins_t.append(_T("bias", (wshape[0],), acts[0].dtype))
        if attrs["has_residual"]:
            ins_t.append(_T(acts[1].name, descs[1][0], acts[1].dtype))
        if len(acts) != 2 + int(attrs["has_residual"]):
            raise ValueError(f"{len(acts)} activation operands; expected {2 + int(attrs['has_residual'])}")
        if not p.get("prepared") and [tuple(c.shape) for c in consts] != [wshape] + ([(wshape[0],)] if attrs[
                "has_bias"] else []):
            raise ValueError(f"constant shapes {[c.shape for c in consts]} are not the weight {wshape} and bias")
    else:
        for k, o in enumerate(ins.inputs):
            if o.segment == CONST:
                ins_t.append(_T(o.name, o.shape, o.dtype))
                ci += 1
            else:
                ins_t.append(_T(o.name, descs[ai][0], o.dtype))
                ai += 1
        if roles and not roles[-1].endswith("*") and len(ins_t) != len(roles):
            raise ValueError(f"{len(ins_t)} inputs; {op} takes {roles}")
    out = tuple(schema(op).infer(p["name"], ins_t, attrs))
    if out != descs[-1][0]:
        raise ValueError(f"output '{acts[-1].name}' is {descs[-1][0]}; {op} of these inputs gives {out}")
    # windows: recomputed from the params
    wins = p.get("windows")
    if not isinstance(wins, (list, tuple)) or len(wins) != len(acts) - 1:
        raise ValueError(f"'windows' must give one window per activation input ({len(acts) - 1})")
    windows = [window_from_param(w) for w in wins]
    for k, wn in enumerate(windows):
        wshape = p["weight_shape"] if op == "conv2d" else consts[0].shape if op == "conv_transpose2d" else None
        want = layer_window(op, attrs, descs[0][0], descs[-1][0], wshape) \
            if (bands.windowed(op, attrs) and k == 0) else RowWindow()
        if wn != want:
            raise ValueError(f"window {k} is {_describe(wn, want)}; the params give {_describe(want, wn)}")
    if isinstance(p.get("rows_max"), bool) or not isinstance(p.get("rows_max"), int) or p["rows_max"] < 1:
        raise ValueError(f"rows_max {p.get('rows_max')!r} must be a positive integer")
    return {"inputs": [(o.name, w) for o, w in zip(acts[:-1], windows)], "output": acts[-1].name,
            "rows": descs[-1][0][2], "descs": {o.name: d for o, d in zip(acts, descs)}}


def _describe(w, other) -> str:
    """A window for an error message: a RowTable by its length and first row differing from `other`."""
    if not isinstance(w, RowTable):
        return str(w)
    if not isinstance(other, RowTable) or len(other.lo) != len(w.lo):
        return f"a row table of {len(w.lo)} rows"
    r = next(i for i in range(len(w.lo)) if (w.lo[i], w.hi[i]) != (other.lo[i], other.hi[i]))
    return f"rows [{w.lo[r]}, {w.hi[r]}) for output row {r}"


def validate_header(ins: Instruction) -> None:
    """The `stream` header alone (the package loader's validator for it); ValueError if wrong."""
    p = ins.params
    extra = sorted(set(p) - HEADER_PARAMS)
    if extra:
        raise ValueError(f"parameter(s) {extra} unknown to the stream header")
    L, workers = p.get("layers"), p.get("workers")
    for k, v in (("layers", L), ("workers", workers), ("band_rows", p.get("band_rows"))):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{k}={v!r} must be a positive integer")
    if p.get("band_mode") not in ("layer", "input") or p.get("rings") not in ("nchwc", "nchw"):
        raise ValueError(f"band_mode {p.get('band_mode')!r} / rings {p.get('rings')!r}; expected layer or input / "
                         f"nchwc or nchw")
    if workers > 1:
        stages = _int_list(p.get("stages"), L, "stages")
        if stages != sorted(stages) or stages[0] != 0 or stages[-1] != workers - 1 or \
                any(b - a > 1 for a, b in zip(stages, stages[1:])):
            raise ValueError(f"stages {stages} must cut the layers into {workers} contiguous runs")
    elif p.get("stages") not in ((), []):
        raise ValueError(f"stages {p.get('stages')!r} with one worker; expected none")
    if len(ins.operands) != 1 or ins.operands[0].segment != CONST or \
            ins.operands[0].dtype != np.int32 or len(ins.operands[0].shape) != 2 or \
            ins.operands[0].shape[1] != 3:
        raise ValueError("its one operand must be the (S, 3) int32 constant of steps")


def validate_band(ins: Instruction) -> None:
    """One `band` instruction alone (the package loader's validator for it); ValueError if wrong."""
    try:
        _check_band(ins)
    except (GraphError, KeyError, TypeError, IndexError) as e:
        raise ValueError(f"{type(e).__name__}: {e}") from None


def validate_stream(program: list[Instruction], read_const, where: str = "package") -> None:
    """Every stream region of a decoded program: a header followed by its band instructions
    (none elsewhere), each tensor described alike everywhere, the steps replayed against the
    capacities (`check_steps`). `read_const(operand)` returns a constant operand's array. The
    instructions one by one are the validators' business (`validate_header`, `validate_band`).
    Raises PackageError."""
    i = 0
    while i < len(program):
        ins = program[i]
        if ins.kernel == "band":
            raise PackageError(f"{where}: instruction {i} (band) is outside a stream region")
        if ins.kernel not in REGION_HEADERS:
            i += 1
            continue
        w = f"{where}: instruction {i} (stream)"
        try:
            validate_header(ins)
            L = ins.params["layers"]
            if i + L >= len(program) or any(b.kernel != "band" for b in program[i + 1:i + 1 + L]):
                raise ValueError(f"expected {L} band instructions after the header")
        except ValueError as e:
            raise PackageError(f"{w}: {e}") from None
        layers, tensors = [], {}
        for li in range(L):
            b = program[i + 1 + li]
            try:
                info = _check_band(b)
            except (ValueError, GraphError, KeyError, TypeError, IndexError) as e:
                raise PackageError(f"{where}: instruction {i + 1 + li} (band {b.params.get('op')!r}): {e}") from None
            for name, d in info.pop("descs").items():
                if tensors.setdefault(name, d) != d:
                    raise PackageError(f"{where}: instruction {i + 1 + li}: tensor '{name}' is {d} (shape, rows "
                                       f"held, kind), elsewhere {tensors[name]}")
            layers.append(info)
        produced = {l["output"] for l in layers}
        desc = {n: (shape[2], cap, n not in produced) for n, (shape, cap, kind) in tensors.items()}
        for n, (shape, cap, kind) in tensors.items():
            if n not in produced and kind != WHOLE:
                raise PackageError(f"{where}: stream region at {i}: '{n}' is read but never written, so it must "
                                   f"be a whole tensor (the network input)")
        if layers:
            layers[0]["tensors"] = desc
        steps = np.asarray(read_const(ins.operands[0]))
        steps = [tuple(int(v) for v in s) for s in steps]
        try:
            check_steps(steps, layers, f"{w}")
        except ValueError as e:
            raise PackageError(str(e)) from None
        # rows_max sizes each band's scratch: the most rows one of its steps computes, as compiled
        # (2^31 would ask for terabytes)
        most = [0] * L
        for li, r0, r1 in steps:
            most[li] = max(most[li], r1 - r0)
        for li in range(L):
            b = program[i + 1 + li]
            if b.params["rows_max"] != most[li]:
                raise PackageError(f"{where}: instruction {i + 1 + li} (band {b.params['op']!r}): rows_max "
                                   f"{b.params['rows_max']}; its steps compute at most {most[li]} rows at once")
        i += 1 + L
