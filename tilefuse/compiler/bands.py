"""The row-band schedule, a compiler stage (schedule="stream"): which ops stream, which rows
each output band needs, ring sizes, ring layouts, pipeline stages.

Streamable ops (row-local in H): conv2d (any kernel, stride, dilation, padding, groups, fused
bias/residual and any activation of kernels/activations.py), max_pool / avg_pool (padding,
ceil_mode), and the row-local ops (`ops.ROW_LOCAL`): relu, activation, prelu, add / sub / mul /
div (operands of equal shapes, or a constant broadcast over the rows: per-channel (1, C, 1, 1) /
(C, 1, 1) or a scalar; any fused activation), scale, batch_norm, channel_norm, dropout,
local_response_norm, channel concat, channel / column slices, slices of rows (a row window
of span 1: output row r is input row start + r * step), and the row-mapped ops (`ops.ROW_MAPPED`:
resize, conv_transpose2d, pad on H and W, adaptive_avg_pool to height > 1) whose rows come from
a row table (`refusal` says why any other op is not). The streamed
part of a network is every op whose variable inputs are the (single, NCHW) network input or
outputs of streamed ops; everything else (global pooling and what follows, a squeeze-excitation
scale and what follows: `BandSchedule.ends` says where and why) is the tail, lowered as
ordinary instructions on whole tensors after the band instructions (compiler/streaming.py).
Streamed tensors the tail or the caller reads ("sinks") are kept whole.

Row requirements. Output row r of a window op needs input rows
    [r*s - pad_top, r*s - pad_top + d*(k-1)]            (clipped to [0, H_in); outside is padding)
and of a row-local op (and of a conv's residual input) just row r; a row-mapped op's output
row r needs input rows [lo[r], hi[r]) of a `RowTable` computed from its params
(`kernels.bands.row_window`; both bounds non-decreasing in r).

The schedule is found by a dry run over row counts (no data): input rows are fed `band_rows` at
a time; after each feed the layers are swept in topological order, each emitting one band of as
many output rows as its inputs allow (at most `band_rows`), and the sweep repeats while any
layer can fire. So a full-resolution layer emits `band_rows` rows per feed, a layer after a
stride-2 one half as many, and so on down the network: each layer lags its input by its
window's halo, not by a whole band. (Waiting for full bands at every layer instead makes every
layer lag by a band, and the rings of a ResNet18 at 4K hold 4x more rows.) The dry run records
the steps (layer, r0, r1) and, for every tensor, the most rows ever held at once (rows written
minus the smallest row a consumer still needs): that is its ring capacity. Replaying the steps
with rings of those capacities is exact and never overwrites a row still needed (`check_steps`
replays any steps against any capacities; runtime/ring.py checks every write as well).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import GraphError
from ..ir import Network, OpNode, ops
from ..ir.ops import flops as op_flops
from ..kernels.bands import IDENTITY, RowWindow, band_layout, row_slice, row_window, slice_window

ROW_MAPPED = ops.ROW_MAPPED
STREAMABLE = ops.WINDOW | ops.ROW_LOCAL | ops.ROW_MAPPED



@dataclass
class StreamTensor:
    name: str
    shape: tuple[int, int, int, int]
    dtype: np.dtype
    producer: int                       # layer index, -1 for the network input
    consumers: list[tuple[int, int]] = field(default_factory=list)   # (layer, input position)
    sink: bool = False                  # kept whole: read by the tail or a network output
    capacity: int = 0                   # rows held (ring size); the height for whole tensors
    band: int = 1                       # rows per write

    @property
    def row_bytes(self) -> int:
        n, c, _, w = self.shape
        return n * c * w * self.dtype.itemsize

    @property
    def whole(self) -> bool:
        return self.producer < 0 or self.sink

    @property
    def held_bytes(self) -> int:
        return self.capacity * self.row_bytes

    @property
    def nbytes(self) -> int:
        return self.shape[2] * self.row_bytes


@dataclass
class StreamLayer:
    index: int
    op: OpNode
    inputs: list[str]                   # variable input tensors, in op input order
    windows: list[RowWindow]            # row requirement per variable input
    output: str
    rows: int                           # output height
    flops: int

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def kind(self) -> str:
        return self.op.op


@dataclass
class BandSchedule:
    network: Network                    # the optimized network the schedule was made for
    input: str
    layers: list[StreamLayer]
    tensors: dict[str, StreamTensor]
    sinks: list[str]
    tail: list[OpNode]
    steps: list[tuple[int, int, int]]   # (layer, r0, r1) in execution order
    band_rows: int
    layer_rows: list[int] = field(default_factory=list)   # minimum output rows per step, per layer
    ends: list = field(default_factory=list)   # (op name, op, why) of the tail ops reading streamed tensors

    def step_rows(self, layer: int) -> list[int]:
        """Rows of each step of `layer`, in order."""
        if not hasattr(self, "_step_rows"):
            per: list[list[int]] = [[] for _ in self.layers]
            for li, r0, r1 in self.steps:
                per[li].append(r1 - r0)
            self._step_rows = per
        return self._step_rows[layer]

    @property
    def streamed_flops(self) -> int:
        return sum(l.flops for l in self.layers)


def window_of(kind: str, params: dict, kernel_height: int | None = None) -> RowWindow:
    """The row window of a window op's first input (conv: the weight's height)."""
    k = kernel_height if kind == "conv2d" else params["kernel_size"][0]
    d = params.get("dilation", (1, 1))[0]
    return RowWindow(params["stride"][0], -params["padding"][0], d * (k - 1) + 1)


def windowed(kind: str, params: dict) -> bool:
    """Whether a streamed op's first input is read through a row window or table (window ops,
    row-mapped ops, a slice of rows) rather than row for row."""
    return kind in ops.WINDOW or kind in ROW_MAPPED or row_slice(kind, params)


def layer_window(kind: str, params: dict, in_shape, out_shape, weight_shape=None):
    """The row window (RowWindow) or row table (RowTable) of a streamed op's first input."""
    if kind in ROW_MAPPED:
        return row_window(kind, params, in_shape, out_shape, weight_shape)
    if row_slice(kind, params):
        return slice_window(params, in_shape[2])
    return window_of(kind, params, weight_shape[2] if kind == "conv2d" else None)


def _window(op: OpNode):
    return layer_window(op.op, op.params, op.inputs[0].shape, op.outputs[0].shape,
                        op.inputs[1].shape if op.op in ops.CONV else None)


def refusal(op: OpNode) -> str | None:
    """Why `op` cannot run on row bands (None: it can, given streamed inputs)."""
    if op.op not in STREAMABLE:
        if op.op in ops.GLOBAL or op.op in ops.REDUCE or op.op in ops.LINEAR:
            return f"{op.op} does not stream: it reads whole planes (a global op)"
        return f"{op.op} does not stream: it is not row-local in H; streamable: {', '.join(sorted(STREAMABLE))}"
    variables = [d for d in op.inputs if not d.is_constant]
    if not variables:
        return "it has no variable input"
    bad = [(d.name, d.shape) for d in variables if len(d.shape) != 4]
    if bad or len(op.outputs[0].shape) != 4:
        return f"inputs {bad or [(op.outputs[0].name, op.outputs[0].shape)]} are not (N, C, H, W)"
    if op.op == "pad" and any(op.params["pads"][:4]):
        return f"it pads the batch or channel axis (pads {op.params['pads']}); only H and W pads stream"
    if op.op == "adaptive_avg_pool" and op.outputs[0].shape[2] == 1:
        return "adaptive_avg_pool to height 1 does not stream: it reads whole planes (a global op)"
    if op.op == "slice" and op.params["axis"] % 4 == 0:
        return f"slice of axis {op.params['axis']} (the batch); only slices of channels, rows or columns stream"
    if op.op == "slice" and op.params["axis"] % 4 == 2 and op.params["step"] < 0:
        return (f"slice of rows with step {op.params['step']} (rows reversed: a flip of H) needs the whole image; "
                f"only flips of channels or columns stream")
    if op.op == "concat" and op.params["axis"] % 4 != 1:
        return f"concat on axis {op.params['axis']}; only channel concats (axis 1) stream"
    if op.params.get("has_input_scale"):
        return "its input scale is a per-image variable (a squeeze-excitation scale, from whole planes)"
    if op.op in ops.BINARY:
        if len(variables) == 2 and variables[0].shape != variables[1].shape:
            return (f"its operands {variables[0].shape} ('{variables[0].name}') and {variables[1].shape} "
                    f"('{variables[1].name}') broadcast; streamed operands must have equal shapes (or one "
                    f"be a constant broadcast over rows)")
        if tuple(op.outputs[0].shape) != tuple(variables[0].shape):
            return f"its output {op.outputs[0].shape} is larger than its streamed input {variables[0].shape}"
    # constants of a streamed op are parameters (a conv's weights, per-channel vectors, a
    # constant broadcast over the rows), never a whole feature map: that would need its own rows
    if op.op not in ops.CONV:
        for d in op.inputs:
            if d.is_constant and (len(d.shape) > 4 or (len(d.shape) >= 2 and d.shape[-2] != 1)):
                return f"its constant '{d.name}' {d.shape} varies over rows (expected height 1)"
    return None


def _streamable(op: OpNode) -> bool:
    return refusal(op) is None


def _reason(op: OpNode, streamed_ids: set) -> str:
    """Why a tail op that reads a streamed tensor ends the streamed part."""
    late = [d for d in op.inputs if not d.is_constant and id(d) not in streamed_ids]
    if late and op.op in STREAMABLE:
        return (f"its input '{late[0].name}' {late[0].shape} is computed in the tail (from an op that does not "
                f"stream, such as a global mean: a squeeze-excitation scale); streamed ops read streamed rows "
                f"and constants only")
    return refusal(op) or "?"


def split_streamable(net: Network, ends: list | None = None) -> tuple[list[OpNode], list[OpNode]]:
    """(streamed ops, tail ops), both in topological order. `ends`, if given, receives
    (op name, op, reason) for each tail op that reads a streamed tensor: where and why the
    streamed part ends."""
    if len(net.inputs) != 1 or len(net.inputs[0].shape) != 4:
        raise GraphError(net.name, f"streaming needs one (N, C, H, W) network input; found "
                                   f"{[(d.name, d.shape) for d in net.inputs]}")
    streamed_ids = {id(net.inputs[0])}
    streamed, tail = [], []
    for op in net.ops:
        ins = [d for d in op.inputs if not d.is_constant]
        if _streamable(op) and all(id(d) in streamed_ids for d in ins):
            streamed.append(op)
            streamed_ids.add(id(op.outputs[0]))
        else:
            tail.append(op)
            if ends is not None and any(id(d) in streamed_ids for d in ins):
                ends.append((op.name, op.op, _reason(op, streamed_ids)))
    return streamed, tail


def build_schedule(net: Network, band_rows: int = 8, layer_rows=None) -> BandSchedule:
    """Streamed part, tensors, dry-run steps and ring capacities of an optimized network.

    layer_rows: None (every layer emits as many rows as its inputs allow, up to band_rows), or
    a function (StreamLayer) -> int: that layer fires only once it can emit that many rows (or
    its last rows), and emits exactly that many per step."""
    if band_rows < 1:
        raise ValueError(f"band_rows must be >= 1, got {band_rows}")
    ends: list = []
    streamed, tail = split_streamable(net, ends)
    if not streamed:
        raise GraphError(net.name, "no op can be streamed: the first op is "
                                   f"'{net.ops[0].op}' ({net.ops[0].name}): {ends[0][2] if ends else '?'}; "
                                   f"expected a conv, pool or row-local op on the (N, C, H, W) input")
    x = net.inputs[0]
    tensors: dict[str, StreamTensor] = {x.name: StreamTensor(x.name, x.shape, x.dtype, -1)}
    layers: list[StreamLayer] = []
    for i, op in enumerate(streamed):
        names, wins = [], []
        for pos, d in enumerate(op.inputs):
            if d.is_constant:
                continue
            win = _window(op) if (windowed(op.op, op.params) and pos == 0) else IDENTITY
            tensors[d.name].consumers.append((i, len(names)))
            names.append(d.name)
            wins.append(win)
        out = op.outputs[0]
        tensors[out.name] = StreamTensor(out.name, out.shape, out.dtype, i, band=band_rows)
        layers.append(StreamLayer(i, op, names, wins, out.name, out.shape[2], op_flops(op)))
    tail_reads = {d.name for op in tail for d in op.inputs if not d.is_constant}
    outputs = {d.name for d in net.outputs}
    sinks = [t.name for t in tensors.values() if t.producer >= 0 and (t.name in tail_reads or t.name in outputs)]
    for s in sinks:
        tensors[s].sink = True
    mins = [max(1, int(layer_rows(l))) if layer_rows else 1 for l in layers]
    steps = _dry_run(layers, tensors, x.name, band_rows, mins)
    return BandSchedule(net, x.name, layers, tensors, sinks, tail, steps, band_rows, mins, ends)


def _dry_run(layers, tensors, input_name, band, mins=None) -> list[tuple[int, int, int]]:
    """Simulate the row flow; fill in tensor capacities; return the steps."""
    produced = {name: 0 for name in tensors}
    lows = {name: [0] * len(t.consumers) for name, t in tensors.items()}
    peak = {name: 0 for name in tensors}
    next_row = [0] * len(layers)
    steps: list[tuple[int, int, int]] = []
    x = tensors[input_name]
    height = x.shape[2]

    def ready(layer: StreamLayer) -> tuple[int, int] | None:
        """The next band: up to `band` rows, as many as the inputs' rows allow (at least one)."""
        r0 = next_row[layer.index]
        want = mins[layer.index] if mins else 1
        r1 = min(r0 + (band if want <= 1 else want), layer.rows)
        for name, win in zip(layer.inputs, layer.windows):
            h, have = tensors[name].shape[2], produced[name]
            if have < h:  # rows needing input row >= have must wait: (r - 1)*s + off + span <= have
                r1 = min(r1, win.fits(have))
        if r1 - r0 < want and r1 < layer.rows and r0 > 0:
            return None
        return (r0, r1) if r1 > r0 else None

    while True:
        if produced[input_name] < height:
            produced[input_name] = min(height, produced[input_name] + band)
        elif all(next_row[l.index] >= l.rows for l in layers):
            break
        # sweep the layers in order, each firing at most one band per sweep, until none can:
        # depth first, so a layer that could emit several bands (the flush after the last
        # input row) lets its consumers catch up between them
        progress, fired = False, True
        while fired:
            fired = False
            for layer in layers:
                span = ready(layer)
                if span is None:
                    continue
                r0, r1 = span
                steps.append((layer.index, r0, r1))
                out = layer.output
                produced[out] = r1
                low = min(lows[out]) if lows[out] else r1
                peak[out] = max(peak[out], r1 - min(low, r0))
                next_row[layer.index] = r1
                for pos, (name, win) in enumerate(zip(layer.inputs, layer.windows)):
                    h = tensors[name].shape[2]
                    nxt = h if r1 >= layer.rows else max(0, min(h, win.rows(r1, r1 + 1)[0]))
                    k = tensors[name].consumers.index((layer.index, pos))
                    lows[name][k] = max(lows[name][k], nxt)
                fired = progress = True
        if not progress and produced[input_name] >= height:
            stuck = [l.name for l in layers if next_row[l.index] < l.rows]
            if not stuck:     # every layer done before the input's last rows came (a stride-2 layer that
                break         # reads no row past 2 (Ho - 1) + k - 1 of an odd-height input)
            raise GraphError(stuck[0], f"streaming schedule is stuck with layers {stuck[:4]} unfinished")
    for name, t in tensors.items():
        t.capacity = t.shape[2] if t.whole else min(t.shape[2], max(peak[name], 1))
    return steps


# ----------------------------------------------------------------------------- ring layouts

def assign_ring_layouts(sched: BandSchedule, rings: str = "nchwc") -> set[str]:
    """The ring tensors kept in NCHW16c (`rings="nchw"`: none). A ring is blocked when its
    producer writes NCHW16c natively, some consumer reads it natively and none needs NCHW
    (`kernels.bands.band_layout`); then every "same" layer (pooling, element-wise) with one NCHW
    tensor gets all of its tensors NCHW, to a fixpoint. Whole tensors (the network input, the
    sinks) stay NCHW."""
    if rings != "nchwc":
        return set()
    roles = [band_layout(l.kind, l.op.params, l.op.outputs[0].dtype, [sched.tensors[n].shape[1] for n in l.inputs],
                         const_shapes=[d.shape for d in l.op.inputs if d.is_constant]) for l in sched.layers]
    blocked = set()
    for name, t in sched.tensors.items():
        if t.whole:
            continue
        prod = roles[t.producer]
        cons = [roles[c] for c, _ in t.consumers]
        if prod[2] and any(c[1] for c in cons) and all(c[0] != "nchw" for c in cons):
            blocked.add(name)
    changed = True
    while changed:
        changed = False
        for layer, (role, _, _) in zip(sched.layers, roles):
            if role != "same":
                continue
            names = list(layer.inputs) + [layer.output]
            if any(n in blocked for n in names) and not all(n in blocked for n in names):
                blocked.difference_update(names)
                changed = True
    return blocked


# ----------------------------------------------------------------------------- the layer pipeline

def layer_cost(layer: StreamLayer, sched: BandSchedule) -> float:
    """Estimated seconds of a whole streamed layer on one core (balances the pipeline stages).
    Convs: the conv library's cost model for their algorithm (it knows that Winograd does a
    quarter of the multiplies and im2col runs below the direct kernel's efficiency; FLOPs alone
    put conv1 in the same class as a Winograd layer); element-wise and pooling band kernels
    move about 1 GFLOP-equivalent per second."""
    op = layer.op
    alg = op.params.get("algorithm", "reference")
    if layer.kind == "conv2d" and alg != "reference":
        from ..kernels.conv import estimate_cost
        p = op.params
        return float(estimate_cost(alg, op.inputs[0].shape, op.inputs[1].shape, p["stride"], p["padding"],
                                   p["dilation"], p["groups"]))
    if layer.kind == "conv2d":
        return layer.flops / 100e9
    return layer.flops / 1e9 + sum(int(np.prod(sched.tensors[n].shape)) for n in layer.inputs) * 4 / 10e9


def balance_stages(costs: list[float], stages: int) -> list[int]:
    """Stage index of each item: contiguous groups, at most `stages`, minimizing the largest
    group sum (ties: the earliest cut; an exact linear-partition DP). Seed 003: unbalanced
    stages stall the pipeline."""
    n = len(costs)
    k = max(1, min(stages, n))
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    INF = float("inf")
    # best[j][i]: smallest max-sum splitting items[:i] into j groups; cut[j][i]: start of the last group
    best = [[INF] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0
    for j in range(1, k + 1):
        for i in range(j, n + 1):
            for s in range(j - 1, i):
                v = max(best[j - 1][s], prefix[i] - prefix[s])
                if v < best[j][i]:
                    best[j][i], cut[j][i] = v, s
    out = [0] * n
    i = n
    for j in range(k, 0, -1):
        s = cut[j][i]
        for t in range(s, i):
            out[t] = j - 1
        i = s
    return out


def ring_capacities(sched: BandSchedule, stage_of: list[int], queue_bands: int) -> dict[str, int]:
    """Rows each ring holds: the dry run's capacity, plus `queue_bands` bands on a tensor that
    crosses a stage boundary (the pipeline's bounded queue)."""
    caps = {}
    for name, t in sched.tensors.items():
        if t.whole:
            continue
        extra = queue_bands * t.band if any(stage_of[c] != stage_of[t.producer] for c, _ in t.consumers) else 0
        caps[name] = min(t.shape[2], t.capacity + extra)
    return caps


# ----------------------------------------------------------------------------- replaying the steps

def check_steps(steps, layers: list[dict], where: str = "stream") -> None:
    """Replay the steps on row counts only and raise ValueError at the first one that would read
    a row not yet written or already overwritten, overwrite a row a consumer still needs, go out
    of order or past a tensor's end, or leave a layer unfinished. `layers[i]`: {"inputs":
    [(tensor, RowWindow)], "output": tensor, "rows": output height}; tensors are described by
    `tensors[name] = (height, capacity, whole written at the start)` in `layers[0]["tensors"]`.
    The same bookkeeping as the rings (runtime/ring.py) without data: a schedule that passes
    never raises RingError, whatever the package it came from."""
    tensors = layers[0]["tensors"] if layers else {}
    end = {n: (h if pre else 0) for n, (h, cap, pre) in tensors.items()}
    consumers: dict[str, list[tuple[int, int]]] = {n: [] for n in tensors}
    for li, l in enumerate(layers):
        for k, (n, _) in enumerate(l["inputs"]):
            consumers[n].append((li, k))
    lows = {n: [0] * max(len(c), 1) for n, c in consumers.items()}
    nxt = [0] * len(layers)
    for si, (li, r0, r1) in enumerate(steps):
        w = f"{where}: step {si} (layer {li}, rows [{r0}, {r1}))"
        if not 0 <= li < len(layers):
            raise ValueError(f"{w}: layer {li} does not exist; expected 0 <= layer < {len(layers)}")
        l = layers[li]
        if r0 != nxt[li] or not r0 < r1 <= l["rows"]:
            raise ValueError(f"{w}: expected rows [{nxt[li]}, ..) within the output height {l['rows']}")
        for n, win in l["inputs"]:
            h, cap, _ = tensors[n]
            lo, hi = win.rows(r0, r1)
            a, b = max(lo, 0), min(hi, h)
            if b > end[n] or (b > a and a < end[n] - cap):
                raise ValueError(f"{w}: input '{n}' rows [{a}, {b}) are not held (written [0, {end[n]}), "
                                 f"capacity {cap})")
        out = l["output"]
        h, cap, _ = tensors[out]
        if r0 != end[out] or r1 > h:
            raise ValueError(f"{w}: output '{out}' rows must continue at row {end[out]} below its height {h}")
        if r1 - min(lows[out]) > cap:
            raise ValueError(f"{w}: writing '{out}' rows [{r0}, {r1}) would overwrite row {min(lows[out])} "
                             f"that a consumer still needs (capacity {cap} rows)")
        end[out] = r1
        nxt[li] = r1
        for k, (n, win) in enumerate(l["inputs"]):
            hn = tensors[n][0]
            low = hn if r1 >= l["rows"] else max(0, min(hn, win.rows(r1, r1 + 1)[0]))
            slot = consumers[n].index((li, k))
            lows[n][slot] = max(lows[n][slot], low)
    for li, l in enumerate(layers):
        if nxt[li] != l["rows"]:
            raise ValueError(f"{where}: layer {li} computes rows [0, {nxt[li]}) of {l['rows']}; the steps "
                             f"must finish every layer")
