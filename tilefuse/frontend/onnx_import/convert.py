"""The ONNX -> tilefuse op table: one row per ONNX op the importer claims.

RULES maps an ONNX op type to a Rule: the converter, the op's versions (ONNX `since_version`s)
whose semantics the converter implements, the attributes it reads, and the IR ops it emits.
The importer resolves each node's version from the model's default-domain opset; a version not
listed, an attribute not listed, or a case the converter does not cover (a rank, a mode, an
operand computed by the graph where a constant is needed) is refused with UnsupportedOpError
naming the node, the op and version, the attribute or operand, and what was expected. Nothing
outside this table is imported. `docs/ops.md` lists the same table; tests check the ONNX backend
node cases of every op named here.

Constant-only nodes never reach a converter: `fold.py` evaluates them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ...errors import GraphError, UnsupportedOpError
from ...ir import Network
from ...ir.node import DataNode, rounded_product
from .. import boolexpr, gather
from . import fold


# ----------------------------------------------------------------------------- node and context

@dataclass
class OnnxNode:
    """One ONNX node being imported: names, resolved version, attributes."""
    name: str
    op: str
    version: int
    inputs: list[str]          # '' for an absent optional input
    outputs: list[str]
    attrs: dict

    @property
    def where(self) -> str:
        return f"node '{self.name}' ({self.op}-{self.version})"

    def refuse(self, what: str) -> UnsupportedOpError:
        return UnsupportedOpError(f"{self.where}: {what}")

    def has(self, i: int) -> bool:
        return len(self.inputs) > i and bool(self.inputs[i])


class Sequence(tuple):
    """An ONNX sequence value (SplitToSequence, SequenceConstruct): its tensors, known at import."""


@dataclass
class Ctx:
    """Import state: the network being built, computed tensors and folded constants by ONNX name."""
    net: Network
    env: dict[str, DataNode] = field(default_factory=dict)
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    used_names: set[str] = field(default_factory=set)
    ints: set[str] = field(default_factory=set)       # names holding an integer input's values (a float DataNode)
    counts: set[str] = field(default_factory=set)     # of those, a bool's 1 / 0 and sums of them (ReduceSum / CumSum)
    _const_nodes: dict = field(default_factory=dict)

    def fresh(self, base: str) -> str:
        """A name not used yet in the network (the ONNX name when free)."""
        name, k = base, 1
        while name in self.used_names:
            name, k = f"{base}~{k}", k + 1
        self.used_names.add(name)
        return name

    def is_const(self, nd: OnnxNode, i: int) -> bool:
        return nd.has(i) and nd.inputs[i] in self.consts

    def computed(self, nd: OnnxNode, i: int, role: str = "input") -> DataNode:
        """Input i as a computed tensor (a constant here is refused: tilefuse has no op for it)."""
        if not nd.has(i):
            raise GraphError(nd.where, f"{role} (input {i}) is missing")
        t = nd.inputs[i]
        if t in self.env:
            if isinstance(self.env[t], boolexpr.BOOL):
                raise nd.refuse(f"{role} '{t}' is the bool tensor of a comparison "
                                f"({boolexpr.leaf(self.env[t]).origin}); tilefuse uses comparisons in Where, Not, "
                                f"And, Or and a Cast to float (or to int32 / int64: a count) only")
            if isinstance(self.env[t], Sequence):
                raise nd.refuse(f"{role} '{t}' is a sequence of {len(self.env[t])} tensors; expected a tensor "
                                f"(SequenceAt / ConcatFromSequence read a sequence)")
            return self.env[t]
        if t in self.consts:
            raise nd.refuse(f"{role} '{t}' is a constant; expected a tensor computed by the graph "
                            f"(its constant-only subgraph should have been folded)")
        raise GraphError(nd.where, f"{role} '{t}' is not produced by any earlier node or graph input")

    def const(self, nd: OnnxNode, i: int, role: str) -> np.ndarray | None:
        """Input i as a constant array (None when the optional input is absent)."""
        if not nd.has(i):
            return None
        t = nd.inputs[i]
        if t in self.consts:
            return self.consts[t]
        if t in self.env:
            raise nd.refuse(f"{role} '{t}' is computed by the graph; tilefuse needs it to be a constant "
                            f"(an initializer or a constant expression)")
        raise GraphError(nd.where, f"{role} '{t}' is not produced by any earlier node or graph input")

    def const_node(self, name: str, arr: np.ndarray, dtype, nonfinite: bool = False) -> DataNode:
        """A constant operand as a DataNode (shared when the same array is used again); NaN and infinities only
        with `nonfinite` (Where's values)."""
        arr = np.asarray(arr, dtype=dtype, order="C")      # (ascontiguousarray makes a 0-d array 1-d)
        key = (name, arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._const_nodes:
            self._const_nodes[key] = self.net.constant(self.fresh(name), arr, dtype, nonfinite)
        return self._const_nodes[key]

    def operand(self, nd: OnnxNode, i: int, dtype, role: str = "input", nonfinite: bool = False) -> DataNode:
        """Input i as a DataNode, computed or constant (NaN and infinities only with `nonfinite`)."""
        if self.is_const(nd, i):
            return self.const_node(nd.inputs[i], self.consts[nd.inputs[i]], dtype, nonfinite)
        return self.computed(nd, i, role)


def _float_array(nd, a: np.ndarray, role: str) -> np.ndarray:
    """A constant in a float role (weights, biases, slopes, an element-wise operand): ONNX's type constraint binds
    it to the computed input's float type, so an integer or bool tensor makes the model invalid (ONNX Runtime
    refuses it); a float of another width is converted."""
    if a.dtype.kind != "f":
        raise GraphError(nd.where, f"{role} has dtype {a.dtype}; {nd.op} takes it in the computed input's float "
                                   f"type (type constraint T): expected a float tensor")
    return a


# ----------------------------------------------------------------------------- shared helpers

def _spatial(nd: OnnxNode, x: DataNode, what: str = "input") -> None:
    if len(x.shape) != 4:
        raise nd.refuse(f"{what} '{x.name}' has shape {x.shape}; tilefuse implements the 2-D form, "
                        f"expected a 4-D (N, C, H, W) tensor")


def _str(a: dict, key: str, default: str) -> str:
    """A string attribute (ONNX stores bytes) as str."""
    v = a.get(key, default)
    return v.decode() if isinstance(v, bytes) else str(v)


def _hw(nd: OnnxNode, a: dict, key: str, default) -> tuple[int, int]:
    v = list(a.get(key, default))
    if len(v) != 2:
        raise nd.refuse(f"attribute {key}={v}; expected 2 values (H, W) for a 2-D op")
    return int(v[0]), int(v[1])


def _pads(nd: OnnxNode, a: dict, x: DataNode, kernel, strides, dilations) -> tuple[int, int, int, int]:
    """ONNX pads / auto_pad -> tilefuse (top, bottom, left, right)."""
    auto = _str(a, "auto_pad", "NOTSET")
    if auto == "NOTSET":
        p = [int(v) for v in a.get("pads", [0, 0, 0, 0])]
        if len(p) != 4:
            raise nd.refuse(f"attribute pads={p}; expected 4 values (top, left, bottom, right)")
        if min(p) < 0:
            raise nd.refuse(f"attribute pads={p} has a negative pad; expected pads >= 0")
        # ONNX (x1_begin, x2_begin, x1_end, x2_end) -> (top, bottom, left, right)
        return (p[0], p[2], p[1], p[3])
    if auto == "VALID":
        return (0, 0, 0, 0)
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise nd.refuse(f"auto_pad={auto!r}; expected NOTSET, VALID, SAME_UPPER or SAME_LOWER")
    out = []
    for size, k, s, d in zip(x.shape[2:], kernel, strides, dilations):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small, big = total // 2, total - total // 2
        out += [small, big] if auto == "SAME_UPPER" else [big, small]
    return tuple(out)


def _check_training_outputs(nd: OnnxNode, used: set[str], keep: int, what: str) -> None:
    for i, t in enumerate(nd.outputs[keep:], keep):
        if t and t in used:
            raise nd.refuse(f"output {i} '{t}' ({what}) is used; tilefuse imports inference graphs and "
                            f"produces only output 0")


# ----------------------------------------------------------------------------- converters
# Each takes (ctx, node, used) and returns the DataNode(s) of the node's outputs, in order.

def _conv_operands(cx: Ctx, nd: OnnxNode, w_layout: str):
    """Conv / ConvTranspose: x, the weight and bias DataNodes, kernel, strides, dilations."""
    x = cx.computed(nd, 0)
    _spatial(nd, x)
    # Conv's W and B may be computed by the graph (a modulated / dynamic conv: Network.conv2d lowers it)
    computed = nd.op == "Conv" and not cx.is_const(nd, 1)
    w = cx.computed(nd, 1, "weight W") if computed else _float_array(nd, cx.const(nd, 1, "weight W"), "weight W")
    if len(w.shape) != 4:
        raise nd.refuse(f"weight W has shape {tuple(w.shape)}; expected {w_layout}")
    a = nd.attrs
    k = _hw(nd, a, "kernel_shape", tuple(w.shape[2:]))
    if k != tuple(w.shape[2:]):
        raise GraphError(nd.where, f"kernel_shape={list(k)} disagrees with weight W of shape {tuple(w.shape)}")
    s, d = _hw(nd, a, "strides", (1, 1)), _hw(nd, a, "dilations", (1, 1))
    if nd.op == "Conv" and nd.has(2) and not cx.is_const(nd, 2):
        bn = cx.computed(nd, 2, "bias B")
    else:
        b = cx.const(nd, 2, "bias B")
        b = None if b is None else _float_array(nd, b, "bias B")
        bn = cx.const_node(nd.inputs[2], b, x.dtype) if b is not None else None
    return x, w if computed else cx.const_node(nd.inputs[1], w, x.dtype), bn, k, s, d


def _conv(cx: Ctx, nd: OnnxNode, used):
    x, wn, bn, k, s, d = _conv_operands(cx, nd, "(M, C/group, kH, kW)")
    a = nd.attrs
    return cx.net.conv2d(x, wn, bn, stride=s, padding=_pads(nd, a, x, k, s, d), dilation=d,
                         groups=int(a.get("group", 1)), name=cx.fresh(nd.name))


def _batch_norm_batch_stats(cx: Ctx, nd: OnnxNode, used):
    """BatchNormalization with training_mode=1 whose running-statistics outputs nothing reads (the exporters'
    `F.batch_norm(w, None, None, training=True)`: timm's StdConv2d weight standardization): Y with the batch's
    mean and biased variance over every axis but 1 (`Network.batch_stats_normalize`), then scale and B
    (constants or computed, (C,) viewed as (1, C, 1, ...))."""
    _check_training_outputs(nd, used, 1, "running statistics (training_mode=1 updates them)")
    x = cx.computed(nd, 0)
    r = len(x.shape)
    if r < 2:
        raise GraphError(nd.where, f"input '{x.name}' has shape {x.shape}; expected (N, C, ...)")
    y = cx.net.batch_stats_normalize(x, float(nd.attrs.get("epsilon", 1e-5)), name=cx.fresh(nd.name + ".normalized"))
    shape = (1, x.shape[1]) + (1,) * (r - 2)
    for i, role, fn in ((1, "scale", cx.net.mul), (2, "B", cx.net.add)):
        if cx.is_const(nd, i):
            t = cx.const_node(nd.inputs[i] + ".view", _float_array(nd, cx.consts[nd.inputs[i]], role).reshape(shape),
                              x.dtype)
        else:
            t = cx.net.reshape(cx.computed(nd, i, role), shape, name=cx.fresh(nd.inputs[i] + ".view"))
        y = fn(y, t, name=cx.fresh(nd.name if i == 2 else nd.name + ".scaled"))
    return y


def _batch_norm(cx: Ctx, nd: OnnxNode, used):
    a = nd.attrs
    if a.get("training_mode", 0):
        return _batch_norm_batch_stats(cx, nd, used)
    if nd.version < 14 and sum(1 for t in nd.outputs[1:] if t) > 0:
        raise nd.refuse(f"outputs {list(nd.outputs)}: before opset 14 extra outputs (mean, var, saved "
                        f"statistics) mean training mode; expected the single output Y (test mode)")
    if a.get("spatial", 1) != 1:
        raise nd.refuse("spatial=0 (per-activation statistics); expected spatial=1")
    _check_training_outputs(nd, used, 1, "running statistics")
    x = cx.computed(nd, 0)
    if len(x.shape) < 2:
        raise GraphError(nd.where, f"input '{x.name}' has shape {x.shape}; expected (N, C, ...)")
    params = [cx.const_node(nd.inputs[i], _float_array(nd, cx.const(nd, i, r), r), x.dtype)
              for i, r in ((1, "scale"), (2, "B"), (3, "input_mean"), (4, "input_var"))]
    if len(x.shape) in (2, 4):
        return cx.net.batch_norm(x, *params, eps=a.get("epsilon", 1e-5), name=cx.fresh(nd.name))
    # (N, C, D1, ..., Dk) -> (N, C, D1 * ... * Dk, 1) -> batch_norm -> back
    x4 = cx.net.reshape(x, x.shape[:2] + (int(np.prod(x.shape[2:])), 1), name=cx.fresh(nd.name + ".4d"))
    y = cx.net.batch_norm(x4, *params, eps=a.get("epsilon", 1e-5), name=cx.fresh(nd.name + ".bn"))
    return cx.net.reshape(y, x.shape, name=cx.fresh(nd.name))


def _lift_1d(convert_2d):
    """A 2-D converter applied to a 1-D node: (N, C, L) as (N, C, 1, L), the attributes and a 3-D
    weight given a unit H, and the result reshaped back to (N, C', L')."""
    def convert(cx: Ctx, nd: OnnxNode, used):
        x = cx.computed(nd, 0)
        if len(x.shape) != 3:
            return convert_2d(cx, nd, used)
        a = dict(nd.attrs)
        for k, unit in (("kernel_shape", 1), ("strides", 1), ("dilations", 1), ("output_padding", 0),
                        ("output_shape", 1)):
            if k in a:
                a[k] = [unit] + list(a[k])
        if "pads" in a:
            if len(a["pads"]) != 2:
                raise nd.refuse(f"attribute pads={list(a['pads'])}; expected 2 values for a 1-D op")
            a["pads"] = [0, a["pads"][0], 0, a["pads"][1]]
        ins = list(nd.inputs)
        ins[0] = cx.fresh(nd.name + ".2d")
        x4 = x.shape[:2] + (1, x.shape[2])
        src = x.producer.inputs[0] if x.producer is not None and x.producer.op == "reshape" else None
        # (N, C, L) -> (N, C, 1, L); a tensor just reshaped from that form is taken as it was
        cx.env[ins[0]] = src if src is not None and src.shape == x4 else cx.net.reshape(x, x4, name=ins[0])
        if nd.op in ("Conv", "ConvTranspose") and cx.is_const(nd, 1) and cx.consts[nd.inputs[1]].ndim == 3:
            ins[1] = cx.fresh(nd.inputs[1] + ".2d")
            cx.consts[ins[1]] = cx.consts[nd.inputs[1]][:, :, None, :]            # (M, C/g, k) -> (M, C/g, 1, k)
        elif nd.op == "Conv" and nd.has(1) and not cx.is_const(nd, 1):
            w = cx.computed(nd, 1, "weight W")
            if len(w.shape) == 3:                          # a computed weight: (M, C/g, k) -> (M, C/g, 1, k)
                ins[1] = cx.fresh(nd.inputs[1] + ".2d")
                cx.env[ins[1]] = cx.net.reshape(w, (w.shape[0], w.shape[1], 1, w.shape[2]), name=ins[1])
        y = convert_2d(cx, OnnxNode(nd.name, nd.op, nd.version, ins, nd.outputs, a), used)
        return cx.net.reshape(y, (y.shape[0], y.shape[1], y.shape[3]), name=cx.fresh(nd.name))
    return convert


def _relu(cx: Ctx, nd: OnnxNode, used):
    return cx.net.relu(cx.computed(nd, 0), name=cx.fresh(nd.name))


def _pool(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0)
    _spatial(nd, x)
    a = nd.attrs
    if "kernel_shape" not in a:
        raise GraphError(nd.where, "attribute kernel_shape is missing; expected (kH, kW)")
    k = _hw(nd, a, "kernel_shape", None)
    s = _hw(nd, a, "strides", (1, 1))          # ONNX default stride is 1, not the kernel size
    d = _hw(nd, a, "dilations", (1, 1))
    pad = _pads(nd, a, x, k, s, d)
    ceil = bool(a.get("ceil_mode", 0))
    name = cx.fresh(nd.name)
    if nd.op == "MaxPool":
        if len(nd.outputs) > 1 and nd.outputs[1] in used:
            raise nd.refuse(f"output 1 '{nd.outputs[1]}' (the Indices) is used; tilefuse reads a MaxPool's Indices "
                            f"only in a MaxUnpool of windows that do not overlap (or the dynamo exporter's form of "
                            f"max_unpool2d), without an index tensor")
        return cx.net.max_pool(x, k, s, pad, dilation=d, ceil_mode=ceil, name=name)
    if d != (1, 1):
        raise nd.refuse(f"dilations={list(d)}; tilefuse's avg_pool has no dilation, expected [1, 1]")
    return cx.net.avg_pool(x, k, s, pad, ceil_mode=ceil, count_include_pad=bool(a.get("count_include_pad", 0)),
                           name=name)


def _max_unpool(cx: Ctx, nd: OnnxNode, used):
    """MaxUnpool by the Indices of a MaxPool in the graph (patterns._max_unpool rewrites ONNX MaxUnpool and the
    dynamo exporter's ScatterND form to inputs (y, the pool's input x, the pool's output)): Network.max_unpool
    where the windows do not overlap; other indices are refused."""
    if "output_hw" not in nd.attrs:
        raise nd.refuse(f"indices '{nd.inputs[1] if len(nd.inputs) > 1 else ''}' that are not the Indices output "
                        f"of a MaxPool in this graph; tilefuse unpools by a MaxPool's Indices (no index tensor)")
    y, x, pooled = (cx.computed(nd, i) for i in range(3))
    a = nd.attrs
    _spatial(nd, x)
    k = _hw(nd, a, "kernel_shape", None)
    s = _hw(nd, a, "strides", (1, 1))
    d = _hw(nd, a, "dilations", (1, 1))
    pads = tuple(int(v) for v in a.get("pads", (0, 0, 0, 0)))
    h, w = x.shape[2:]
    ho, wo = pooled.shape[2:]
    if tuple(k) != tuple(s) or any(pads) or tuple(d) != (1, 1) or ho * k[0] > h or wo * k[1] > w:
        raise nd.refuse(f"unpooling a MaxPool with kernel {list(k)}, strides {list(s)}, pads {list(pads)}, "
                        f"dilations {list(d)} of {h}x{w} -> {ho}x{wo}; tilefuse unpools windows that do not overlap "
                        f"(strides = kernel_shape, no pads or dilations, no partial window)")
    if tuple(y.shape) != tuple(pooled.shape):
        raise GraphError(nd.where, f"MaxUnpool of {tuple(y.shape)} by the indices of a {tuple(pooled.shape)} "
                                   f"MaxPool; expected the pooled shape")
    oh, ow = tuple(a["output_hw"]) if any(a["output_hw"]) else (ho * k[0], wo * k[1])
    if (a["exact"] and (oh, ow) != (h, w)) or ow != w or oh < ho * k[0]:
        raise nd.refuse(f"an output of {oh}x{ow} by the indices of a {h}x{w} MaxPool input (the indices are "
                        f"offsets in x's rows of {w}); expected the output {h}x{w}")
    return cx.net.max_unpool(y, x, pooled, k, (oh, ow), name=cx.fresh(nd.name))


def _global_avg_pool(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0)
    _spatial(nd, x)
    return cx.net.global_avg_pool(x, name=cx.fresh(nd.name))


def _reduce(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0)
    a = nd.attrs
    since = 13 if nd.op == "ReduceSum" else 18     # the opset from which axes is an input
    axes = fold.axes_input(nd, [None, cx.const(nd, 1, "axes")], a, 1, since)
    if not axes:
        if nd.version >= since and a.get("noop_with_empty_axes", 0):
            return x                                   # no axes, noop: the identity
        axes = list(range(len(x.shape)))
    r = len(x.shape)
    ax = sorted({fold._axis(nd, v, r, "axes") for v in axes})
    keep = bool(a.get("keepdims", 1))
    name = cx.fresh(nd.name)
    if nd.op == "ReduceMean" and r == 4 and ax == [2, 3]:
        # the mean over H, W is global average pooling (N, C, 1, 1), flattened to (N, C) without keepdims
        y = cx.net.global_avg_pool(x, name=name if keep else cx.fresh(nd.name + ".pool"))
        return y if keep else cx.net.flatten(y, 1, name=name)
    if nd.op in ("ReduceL1", "ReduceL2"):
        return cx.net.vector_norm(x, 1 if nd.op == "ReduceL1" else 2, tuple(ax), keep, name=name)
    if nd.op == "ReduceSumSquare":
        return cx.net.sum(cx.net.mul(x, x, name=cx.fresh(nd.name + ".square")), tuple(ax), keep, name=name)
    f = {"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "max", "ReduceMin": "min"}[nd.op]
    return getattr(cx.net, f)(x, tuple(ax), keepdim=keep, name=name)


def _lp_normalization(cx: Ctx, nd: OnnxNode, used):
    """x / ||x||_p along `axis`, 0 where the norm is 0 (the spec since opset 22): the norm clamped below at the
    smallest normal float32 (a subnormal norm, from subnormal inputs only, divides by that instead); p = 2 along
    axis 1 becomes one channel_norm (the compiler's fold_l2_norm)."""
    x = cx.computed(nd, 0)
    p = nd.attrs.get("p", 2)
    if p not in (1, 2):
        raise GraphError(nd.where, f"attribute p={p}; expected 1 or 2")
    axis = fold._axis(nd, nd.attrs.get("axis", -1), len(x.shape), "axis")
    nrm = cx.net.vector_norm(x, p, (axis,), True, name=cx.fresh(nd.name + ".norm"))
    nrm = cx.net.activation(nrm, "clip", name=cx.fresh(nd.name + ".clamp"), min=float(np.finfo(np.float32).tiny))
    return cx.net.div(x, nrm, name=cx.fresh(nd.name))


def _gemm(cx: Ctx, nd: OnnxNode, used):
    a = nd.attrs
    x = cx.computed(nd, 0, "A")
    if len(x.shape) != 2:
        raise GraphError(nd.where, f"A '{x.name}' has shape {x.shape}; expected a 2-D matrix")
    if a.get("transA", 0):
        x = cx.net.permute(x, (1, 0), name=cx.fresh(nd.name + ".A^T"))     # (K, M) -> (M, K)
    b = _float_array(nd, cx.const(nd, 1, "B"), "B")
    if b.ndim != 2:
        raise GraphError(nd.where, f"B has shape {b.shape}; expected a 2-D matrix")
    # linear wants weight (out, in): B is (K, N), or (N, K) with transB; alpha folded in unless that would
    # flush or overflow a weight (then a scale after the sums, as ONNX Runtime's sgemm applies it)
    w = b if a.get("transB", 0) else b.T
    alpha = float(a.get("alpha", 1.0))
    folded = w if alpha == 1.0 else rounded_product(w, w.astype(np.float64) * alpha, w.dtype)
    w, alpha = (w, alpha) if folded is None else (folded, 1.0)
    if w.shape[1] != x.shape[1]:
        raise GraphError(nd.where, f"A {x.shape} and B {b.shape} (transB={a.get('transB', 0)}) do not "
                                   f"multiply")
    c = cx.const(nd, 2, "C")
    c = None if c is None else _float_array(nd, c, "C")
    if c is not None and c.ndim > 2:
        raise GraphError(nd.where, f"C has shape {c.shape}; expected a shape that broadcasts to (M, N) = "
                                   f"{(x.shape[0], w.shape[0])} (rank <= 2)")
    bias = None
    if c is not None:
        n = w.shape[0]
        c = c * np.asarray(a.get("beta", 1.0), c.dtype)
        if c.size == 1 or c.shape in ((n,), (1, n)):
            bias = np.broadcast_to(c.reshape(-1), (n,))
        elif np.broadcast_shapes(c.shape, (x.shape[0], n)) != (x.shape[0], n):
            raise GraphError(nd.where, f"C has shape {c.shape}; expected a shape that broadcasts to "
                                       f"{(x.shape[0], n)}")
    name = cx.fresh(nd.name)
    w = cx.const_node(nd.inputs[1] + ".weight", w, x.dtype)
    if alpha != 1.0:                        # (A B) alpha + beta C: linear, a scale, then C as below
        y = cx.net.linear(x, w, None, name=cx.fresh(nd.name + ".linear"))
        n = w.shape[0]
        s = (cx.const_node(nd.name + ".alpha", np.full(n, alpha), x.dtype),
             cx.const_node(nd.name + ".zero", np.zeros(n), x.dtype))
        if c is None:
            return cx.net.scale(y, *s, name=name)
        y = cx.net.scale(y, *s, name=cx.fresh(nd.name + ".alpha"))
        return cx.net.add(y, cx.const_node(nd.inputs[2], c if bias is None else bias, x.dtype), name=name)
    if c is not None and bias is None:      # a C per row: linear, then a broadcasting add
        y = cx.net.linear(x, w, None, name=cx.fresh(nd.name + ".linear"))
        return cx.net.add(y, cx.const_node(nd.inputs[2], c, x.dtype), name=name)
    return cx.net.linear(x, w, None if bias is None else cx.const_node(nd.inputs[2], bias, x.dtype), name=name)


def _matmul(cx: Ctx, nd: OnnxNode, used):
    """(..., K) by a constant (K, M): a linear layer; otherwise (a computed B, a constant A, batched constants)
    a matmul, the batch axes broadcast, 1-D operands as np.matmul's (attention's Q K^T and A V)."""
    if not cx.is_const(nd, 1) or cx.is_const(nd, 0) or np.ndim(cx.const(nd, 1, "B")) != 2:
        a = cx.computed(nd, 0, "A") if not cx.is_const(nd, 0) else \
            cx.const_node(nd.inputs[0], _float_array(nd, cx.const(nd, 0, "A"), "A"), np.float32)
        b = cx.computed(nd, 1, "B") if not cx.is_const(nd, 1) else \
            cx.const_node(nd.inputs[1], _float_array(nd, cx.const(nd, 1, "B"), "B"), a.dtype)
        return cx.net.matmul(a, b, name=cx.fresh(nd.name))
    x = cx.computed(nd, 0, "A")
    b = _float_array(nd, cx.const(nd, 1, "B"), "B")
    if len(x.shape) < 2 or b.ndim != 2:
        raise nd.refuse(f"MatMul of {x.shape} by {b.shape}; tilefuse imports (..., K) by a constant (K, M) "
                        f"as a linear layer")
    if b.shape[0] != x.shape[-1]:
        raise GraphError(nd.where, f"A {x.shape} and B {b.shape} do not multiply")
    return cx.net.linear(x, cx.const_node(nd.inputs[1] + ".T", b.T, x.dtype), None, name=cx.fresh(nd.name))


def _einsum(cx: Ctx, nd: OnnxNode, used):
    """Einsum of two operands (the TorchScript exporter's torch.einsum): `Network.einsum`, a matmul between
    permutes and reshapes."""
    eq = nd.attrs.get("equation", "")
    eq = eq.decode() if isinstance(eq, bytes) else str(eq)
    ins = [i for i in range(len(nd.inputs)) if nd.has(i)]
    if len(ins) != 2:
        raise nd.refuse(f"Einsum of {len(ins)} operands; tilefuse implements two")
    a, b = (cx.computed(nd, i) if not cx.is_const(nd, i) else
            cx.const_node(nd.inputs[i], _float_array(nd, cx.const(nd, i, "Inputs"), "Inputs"), np.float32)
            for i in ins)
    return cx.net.einsum(eq, a, b, name=cx.fresh(nd.name))


def _channel_vector(c: np.ndarray, x: DataNode) -> np.ndarray | None:
    """c as a (C,) vector when it broadcasts against x (rank >= 2) along the channel axis only, else None."""
    r = len(x.shape)
    if r < 2 or c.ndim > r:
        return None
    cs = (1,) * (r - c.ndim) + c.shape
    if any(d != 1 for i, d in enumerate(cs) if i != 1) or cs[1] not in (1, x.shape[1]):
        return None
    return np.broadcast_to(c.reshape(-1), (x.shape[1],)) if c.size == 1 else c.reshape(-1)


def _elementwise(cx: Ctx, nd: OnnxNode, used):
    op = nd.op
    kind = op.lower()
    ca, cb = cx.is_const(nd, 0), cx.is_const(nd, 1)
    name = cx.fresh(nd.name)
    if not ca and not cb:
        a, b = cx.computed(nd, 0, "A"), cx.computed(nd, 1, "B")
        if op == "Mul":
            for g, v in ((a, b), (b, a)):   # x * sigmoid(x) -> silu
                if g.producer is not None and g.producer.op == "activation" \
                        and g.producer.params["act"][0] == "sigmoid" and g.producer.inputs[0] is v:
                    return cx.net.silu(v, name=name)
        return getattr(cx.net, kind)(a, b, name=name)
    x = cx.computed(nd, 1 if ca else 0, "B" if ca else "A")
    ci = 0 if ca else 1
    c = _float_array(nd, cx.const(nd, ci, "constant operand"), "constant operand")
    try:
        out_shape = np.broadcast_shapes(x.shape, c.shape)
    except ValueError:
        raise GraphError(nd.where, f"operands {x.shape} and {c.shape} do not broadcast") from None
    if op == "Add" and x.producer is not None and x.producer.op == "linear" \
            and not x.producer.params["has_bias"] and c.shape in ((x.shape[-1],), (1,) * (len(x.shape) - 1)
                                                                   + (x.shape[-1],)) and out_shape == x.shape:
        # MatMul + Add(bias) -> one linear with bias; the bias-less linear is left without users and
        # the compiler's dead-node pass drops it
        lin = x.producer
        return cx.net.linear(lin.inputs[0], lin.inputs[1], cx.const_node(nd.inputs[ci], c.reshape(-1), x.dtype),
                             name=name)
    v = _channel_vector(c, x) if out_shape == x.shape and len(x.shape) in (2, 4) and op != "Div" else None
    if v is not None:
        # a per-channel (or scalar) constant: one scale op, y = x * alpha + beta
        v = v.astype(np.float64)
        one, zero = np.ones_like(v), np.zeros_like(v)
        alpha, beta = {"Add": (one, v), "Mul": (v, zero), "Sub": (-one, v) if ca else (one, -v)}[op]
        return cx.net.scale(x, cx.const_node(name + ".alpha", alpha, x.dtype),
                            cx.const_node(name + ".beta", beta, x.dtype), name=name)
    cn = cx.const_node(nd.inputs[ci], c.reshape(c.shape or (1,) * bool(x.shape)), x.dtype)
    a, b = (cn, x) if ca else (x, cn)
    return getattr(cx.net, kind)(a, b, name=name)


def _activation(act: str, **params):
    def convert(cx: Ctx, nd: OnnxNode, used):
        kw = {k: nd.attrs.get(a, d) for k, (a, d) in params.items()}
        return cx.net.activation(cx.computed(nd, 0), act, name=cx.fresh(nd.name), **kw)
    return convert


def _clip(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0)
    if nd.version < 11:
        lo, hi = nd.attrs.get("min", -np.inf), nd.attrs.get("max", np.inf)
    else:
        lo, hi = (cx.const(nd, i, r) for i, r in ((1, "min"), (2, "max")))
        for v, r in ((lo, "min"), (hi, "max")):
            if v is not None:
                _float_array(nd, v, r)
            if v is not None and v.size != 1:
                raise GraphError(nd.where, f"{r} has shape {v.shape}; expected a scalar")
        lo = -np.inf if lo is None else float(np.asarray(lo).reshape(-1)[0])
        hi = np.inf if hi is None else float(np.asarray(hi).reshape(-1)[0])
    if lo > hi:
        raise nd.refuse(f"min {lo} > max {hi} (ONNX then outputs max everywhere); expected min <= max")
    name = cx.fresh(nd.name)
    if _is_relu_bound(lo) and hi == np.inf:
        return cx.net.relu(x, name=name)
    return cx.net.activation(x, "clip", name=name, min=lo, max=hi)


def _gelu(cx: Ctx, nd: OnnxNode, used):
    approx = _str(nd.attrs, "approximate", "none")
    if approx not in ("none", "tanh"):
        raise nd.refuse(f"approximate={approx!r}; expected 'none' or 'tanh'")
    return cx.net.gelu(cx.computed(nd, 0), approximate=approx, name=cx.fresh(nd.name))


def _prelu(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0)
    s = _float_array(nd, cx.const(nd, 1, "slope"), "slope")
    try:
        ok = np.broadcast_shapes(x.shape, s.shape) == x.shape
    except ValueError:
        ok = False
    if not ok:
        raise GraphError(nd.where, f"slope of shape {s.shape} does not broadcast to the input {x.shape}")
    v = _channel_vector(s, x)
    name = cx.fresh(nd.name)
    if v is not None:
        return cx.net.prelu(x, v if s.size > 1 else v[:1], name=name)
    # any other slope shape: relu(x) + slope * (x - relu(x)), exact (x - relu(x) = min(x, 0))
    r = cx.net.relu(x, name=cx.fresh(nd.name + ".pos"))
    neg = cx.net.sub(x, r, name=cx.fresh(nd.name + ".neg"))
    sn = cx.net.mul(neg, cx.const_node(nd.inputs[1], s, x.dtype), name=cx.fresh(nd.name + ".slope"))
    return cx.net.add(r, sn, name=name)


def _reshape_to(cx: Ctx, nd: OnnxNode, x: DataNode, tgt: tuple):
    """x reshaped to tgt: nothing when equal, flatten for (N, -1), else the reshape op."""
    if tuple(tgt) == tuple(x.shape):
        return x
    name = cx.fresh(nd.name)
    if len(x.shape) >= 2 and len(tgt) == 2 and tgt == (x.shape[0], int(np.prod(x.shape[1:]))):
        return cx.net.flatten(x, 1, name=name)
    return cx.net.reshape(x, tgt, name=name)


def _flatten(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0)
    r = len(x.shape)
    axis = nd.attrs.get("axis", 1)
    if not -r <= axis <= r:
        raise GraphError(nd.where, f"axis={axis} is out of range for rank {r}; expected {-r} <= axis <= {r}")
    axis = axis + r if axis < 0 else axis
    # (d0, ..., d_{axis-1}, d_axis, ...) -> (d0 * ... * d_{axis-1}, d_axis * ...)
    return _reshape_to(cx, nd, x, (int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:]))))


def _reshape(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0, "data")
    shape = fold._ints(nd, cx.const(nd, 1, "shape"), "shape")
    tgt = fold.reshape_target(nd, x.shape, shape, bool(nd.attrs.get("allowzero", 0)))
    if 0 in tgt:
        raise nd.refuse(f"reshape of {x.shape} to {tgt} is empty; expected a non-empty shape")
    return _reshape_to(cx, nd, x, tgt)


def _squeeze(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0)
    axes = fold.axes_input(nd, [None, cx.const(nd, 1, "axes")], nd.attrs, 1, 13)
    return _reshape_to(cx, nd, x, fold.squeeze_shape(nd, x.shape, axes))


def _unsqueeze(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0)
    axes = fold.axes_input(nd, [None, cx.const(nd, 1, "axes")], nd.attrs, 1, 13)
    if axes is None:
        raise GraphError(nd.where, "Unsqueeze without axes; expected the axes attribute or input")
    return _reshape_to(cx, nd, x, fold.unsqueeze_shape(nd, x.shape, axes))


def _transpose(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0)
    perm = list(nd.attrs.get("perm", range(len(x.shape) - 1, -1, -1)))
    if sorted(perm) != list(range(len(x.shape))):
        raise GraphError(nd.where, f"perm {perm} is not a permutation of the {len(x.shape)} axes of {x.shape}")
    if perm == sorted(perm):
        return x
    return cx.net.permute(x, perm, name=cx.fresh(nd.name))


def _slice_axis(cx: Ctx, nd: OnnxNode, x: DataNode, axis: int, idx: range, name: str | None = None):
    """x restricted to the indices `idx` (a range) along axis: the slice op (a negative step reverses) or
    nothing."""
    if len(idx) == 0:
        raise nd.refuse(f"slice of axis {axis} of {x.shape} is empty; expected at least one element")
    if idx == range(x.shape[axis]):
        return x
    return cx.net.slice(x, axis, *gather.slice_args(idx), name=name or cx.fresh(f"{nd.name}.axis{axis}"))


def _slice(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0, "data")
    if nd.version < 10:
        a = nd.attrs
        starts, ends, axes, steps = list(a["starts"]), list(a["ends"]), a.get("axes"), None
        axes = None if axes is None else list(axes)
    else:
        starts, ends = (fold._ints(nd, cx.const(nd, i, r), r) for i, r in ((1, "starts"), (2, "ends")))
        axes, steps = (fold._ints(nd, cx.const(nd, i, r), r) for i, r in ((3, "axes"), (4, "steps")))
    ranges = fold.slice_params(nd, x.shape, starts, ends, axes, steps)
    changed = [i for i, r in enumerate(ranges) if r != range(x.shape[i])]
    y = x
    for k, i in enumerate(changed):
        y = _slice_axis(cx, nd, y, i, ranges[i], name=cx.fresh(nd.name) if k == len(changed) - 1 else None)
    return y


def _gather(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0, "data")
    idx = np.asarray(cx.const(nd, 1, "indices"))
    if idx.dtype.kind not in "iu":
        raise GraphError(nd.where, f"indices have dtype {idx.dtype}; expected int32/int64")
    r = len(x.shape)
    axis = fold._axis(nd, nd.attrs.get("axis", 0), r)
    n = x.shape[axis]
    if ((idx < -n) | (idx >= n)).any():
        raise GraphError(nd.where, f"indices {idx.reshape(-1).tolist()[:8]} out of range for axis {axis} "
                                   f"of size {n}")
    return _gather_runs(cx, nd, x, axis, [int(i) % n for i in idx.reshape(-1)], idx.shape)


def _gather_runs(cx: Ctx, nd: OnnxNode, x: DataNode, axis: int, ids: list[int], shape) -> DataNode:
    """x's entries `ids` (in range) along `axis`, as slices of the runs of evenly spaced indices (a run: its first
    two indices set the step, nonzero, and it goes on while the step holds) concatenated, the axis then reshaped to
    `shape` (the indices' shape)."""
    if not ids:
        raise nd.refuse(f"indices of shape {tuple(shape)} are empty; expected at least one index")
    runs = gather.index_runs(ids)       # runs of the (flattened) indices -> one slice each, concatenated
    if len(runs) > gather.MAX_RUNS:
        raise nd.refuse(f"indices {ids[:8]}... form {len(runs)} runs; tilefuse gathers up to {gather.MAX_RUNS} "
                        f"runs of evenly spaced indices (as slices)")
    parts = [_slice_axis(cx, nd, x, axis, rg) for rg in runs]
    y = parts[0] if len(parts) == 1 else cx.net.concat(parts, axis=axis, name=cx.fresh(nd.name + ".concat"))
    # (..., len(ids), ...) -> (..., *indices.shape, ...)
    return _reshape_to(cx, nd, y, x.shape[:axis] + tuple(shape) + x.shape[axis + 1:])


def _where(cx: Ctx, nd: OnnxNode, used):
    """Where(condition, X, Y) -> the where op, exact (NaN and infinities where they are selected only). The
    condition: a comparison of computed tensors (a Cmp: l cmp r, Not swapping X and Y), or a constant bool
    tensor (the dynamo exporter's masked_fill for an adaptive average pool with unequal windows) as a 0 / 1
    constant k and k > 0.5; X and Y computed or constant, at least one computed."""
    c = cx.env.get(nd.inputs[0]) if nd.has(0) else None
    if not isinstance(c, boolexpr.BOOL):
        cond = cx.const(nd, 0, "condition")
        if cond is None:
            raise GraphError(nd.where, "condition (input 0) is missing")
        cond = np.asarray(cond)
        if cond.dtype != np.bool_:
            raise GraphError(nd.where, f"condition has dtype {cond.dtype}; expected bool")
    if cx.is_const(nd, 1) and cx.is_const(nd, 2) and not isinstance(c, boolexpr.BOOL):
        raise nd.refuse("X and Y are constants (expected the node folded)")
    dt = next((cx.computed(nd, i).dtype for i in (1, 2) if not cx.is_const(nd, i)), None) or \
        boolexpr.leaf(c).l.dtype
    a, b = (cx.operand(nd, i, dt, role, nonfinite=True) for i, role in ((1, "X"), (2, "Y")))
    if not isinstance(c, boolexpr.BOOL):
        c = boolexpr.Cmp(cx.const_node(nd.inputs[0] + ".keep", cond.astype(dt), dt), "gt",
                         cx.const_node(nd.name + ".half", np.full((1,), 0.5, dt), dt), nd.where)
    return boolexpr.select(cx.net, c, a, b, cx.fresh(nd.name))


def _gather_nd(cx: Ctx, nd: OnnxNode, used):
    """GatherND with constant indices (batch_dims 0): each index tuple of length k picks data[i0, .., ik-1],
    i.e. a Gather along the first k axes flattened into one (torch's dynamo exporter writes it for an adaptive
    average pool whose windows overlap)."""
    x = cx.computed(nd, 0, "data")
    idx = np.asarray(cx.const(nd, 1, "indices"))
    if idx.dtype.kind not in "iu":
        raise GraphError(nd.where, f"indices have dtype {idx.dtype}; expected int32/int64")
    if nd.attrs.get("batch_dims", 0) != 0:
        raise nd.refuse(f"batch_dims={nd.attrs['batch_dims']}; tilefuse implements batch_dims=0")
    r = len(x.shape)
    k = idx.shape[-1] if idx.ndim else 0
    if idx.ndim < 1 or not 1 <= k <= r:
        raise GraphError(nd.where, f"indices have shape {idx.shape}; expected (..., k) with 1 <= k <= {r} "
                                   f"(the rank of data {x.shape})")
    lead = x.shape[:k]
    for j, n in enumerate(lead):
        if ((idx[..., j] < -n) | (idx[..., j] >= n)).any():
            raise GraphError(nd.where, f"indices {idx[..., j].reshape(-1).tolist()[:8]} out of range for axis "
                                       f"{j} of size {n}")
    flat = np.ravel_multi_index(tuple((idx[..., j] % n).reshape(-1) for j, n in enumerate(lead)), lead)
    if k > 1:     # (d0, .., dk-1, rest..) -> (d0 * .. * dk-1, rest..)
        x = cx.net.reshape(x, (int(np.prod(lead)),) + x.shape[k:], name=cx.fresh(nd.name + ".flat"))
    return _gather_runs(cx, nd, x, 0, [int(i) for i in flat], idx.shape[:-1])


def _split(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0)
    a = nd.attrs
    axis = fold._axis(nd, a.get("axis", 0), len(x.shape))
    d = x.shape[axis]
    k = len(nd.outputs)
    if nd.version < 13:
        sizes = list(a["split"]) if "split" in a else None
    else:
        sizes = fold._ints(nd, cx.const(nd, 1, "split"), "split")
    if sizes is None:
        if nd.version >= 18:
            if "num_outputs" not in a:
                raise GraphError(nd.where, "neither split nor num_outputs is given")
            k = int(a["num_outputs"])
            part = -(-d // k)                      # ceil: the last piece is smaller
            sizes = [part] * (d // part) + ([d % part] if d % part else [])
        else:
            if d % k:
                raise GraphError(nd.where, f"axis {axis} of {x.shape} does not split evenly into {k} outputs")
            sizes = [d // k] * k
    if len(sizes) != len(nd.outputs) or sum(sizes) != d or min(sizes) < 1:
        raise GraphError(nd.where, f"split sizes {sizes} for {len(nd.outputs)} outputs of axis {axis} (size {d}); "
                                   f"expected {len(nd.outputs)} positive sizes summing to {d}")
    return cx.net.split(x, sizes, axis=axis, name=cx.fresh(nd.name))


def _sequence(cx: Ctx, nd: OnnxNode, i: int) -> Sequence:
    t = nd.inputs[i] if nd.has(i) else ""
    v = cx.env.get(t)
    if not isinstance(v, Sequence):
        raise nd.refuse(f"input {i} '{t}' is not a sequence from SplitToSequence / SequenceConstruct in this graph")
    return v


def _split_to_sequence(cx: Ctx, nd: OnnxNode, used):
    """SplitToSequence (the dynamo exporter's torch.split / chunk without its optimizer): the pieces as a Sequence.
    split a scalar: pieces of that size (the last smaller); 1-D: those sizes; absent: size-1 pieces, squeezed
    along the axis unless keepdims."""
    x = cx.computed(nd, 0)
    axis = fold._axis(nd, nd.attrs.get("axis", 0), len(x.shape))
    d = x.shape[axis]
    split = cx.const(nd, 1, "split") if nd.has(1) else None
    if nd.has(1) and (split is None or np.asarray(split).dtype.kind not in "iu" or np.asarray(split).ndim > 1):
        raise GraphError(nd.where, f"split {None if split is None else np.asarray(split).tolist()}; expected a "
                                   f"constant int scalar or 1-D int tensor")
    if split is None:
        sizes = [1] * d
    elif np.asarray(split).ndim == 0:
        part = int(split)
        if part < 1:
            raise GraphError(nd.where, f"split {part}; expected a positive piece size")
        sizes = [part] * (d // part) + ([d % part] if d % part else [])
    else:
        sizes = [int(v) for v in np.asarray(split)]
    if sum(sizes) != d or min(sizes, default=0) < 1:
        raise GraphError(nd.where, f"split sizes {sizes} of axis {axis} (size {d}); expected positive sizes "
                                   f"summing to {d}")
    parts = cx.net.split(x, sizes, axis=axis, name=cx.fresh(nd.name))
    if split is None and not nd.attrs.get("keepdims", 1):
        shape = x.shape[:axis] + x.shape[axis + 1:]                 # (.., 1, ..) -> (.., ..)
        parts = [cx.net.reshape(v, shape, name=cx.fresh(f"{nd.name}.squeezed{i}")) for i, v in enumerate(parts)]
    return [Sequence(parts)]


def _sequence_at(cx: Ctx, nd: OnnxNode, used):
    seq = _sequence(cx, nd, 0)
    pos = cx.const(nd, 1, "position")
    if pos is None or np.asarray(pos).size != 1 or np.asarray(pos).dtype.kind not in "iu":
        raise GraphError(nd.where, f"position {None if pos is None else np.asarray(pos).tolist()}; expected a "
                                   f"constant int scalar")
    p = int(np.asarray(pos).reshape(-1)[0])
    if not -len(seq) <= p < len(seq):
        raise GraphError(nd.where, f"position {p} in a sequence of {len(seq)} tensors; expected "
                                   f"{-len(seq)} <= position < {len(seq)}")
    return seq[p]


def _sequence_construct(cx: Ctx, nd: OnnxNode, used):
    return [Sequence(cx.computed(nd, i) for i in range(len(nd.inputs)))]


def _concat_from_sequence(cx: Ctx, nd: OnnxNode, used):
    """ConcatFromSequence: concat along axis, or stack (new_axis=1: each tensor unsqueezed there first)."""
    seq = _sequence(cx, nd, 0)
    if not seq:
        raise GraphError(nd.where, "the sequence is empty; expected at least one tensor")
    r = len(seq[0].shape)
    new = bool(nd.attrs.get("new_axis", 0))
    axis = fold._axis(nd, nd.attrs["axis"], r + new, "axis") if "axis" in nd.attrs else None
    if axis is None:
        raise GraphError(nd.where, "attribute axis is missing")
    parts = list(seq)
    if new:
        parts = [cx.net.reshape(v, v.shape[:axis] + (1,) + v.shape[axis:],
                                name=cx.fresh(f"{nd.name}.unsqueezed{i}")) for i, v in enumerate(parts)]
    return parts[0] if len(parts) == 1 else cx.net.concat(parts, axis=axis, name=cx.fresh(nd.name))


def _pad(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0, "data")
    r = len(x.shape)
    a = nd.attrs
    mode = _str(a, "mode", "constant")
    if nd.version < 11:
        pads, value, axes = list(a.get("pads", [])), float(a.get("value", 0.0)), None
    else:
        pads = fold._ints(nd, cx.const(nd, 1, "pads"), "pads")
        v = cx.const(nd, 2, "constant_value")
        v = None if v is None else _float_array(nd, v, "constant_value")
        if v is not None and v.size != 1:
            raise GraphError(nd.where, f"constant_value has shape {v.shape}; expected one value")
        value = 0.0 if v is None else float(np.asarray(v).reshape(-1)[0])
        axes = fold._ints(nd, cx.const(nd, 3, "axes"), "axes")
    axes = list(range(r)) if axes is None else [fold._axis(nd, v, r, "axes") for v in axes]
    if pads is None or len(pads) != 2 * len(axes):
        raise GraphError(nd.where, f"pads {pads} for axes {axes}; expected {2 * len(axes)} values")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise nd.refuse(f"mode={mode!r}; expected constant, reflect, edge or wrap")
    full = [0] * (2 * r)
    for j, ax in enumerate(axes):     # ONNX (b_0, b_1, ..., e_0, e_1, ...) -> IR (b_0, e_0, b_1, e_1, ...)
        full[2 * ax], full[2 * ax + 1] = pads[j], pads[j + len(axes)]
    for i, d in enumerate(x.shape):   # negative pads crop (Network.pad); ONNX Runtime crops before it reflects
        lo, hi = full[2 * i], full[2 * i + 1]
        if mode == "reflect" and min(lo, hi) < 0 and max(lo, hi) >= d + min(lo, hi):
            raise nd.refuse(f"reflect pads ({lo}, {hi}) on axis {i} of size {d}: the reflection needs more than "
                            f"the {d + min(lo, hi)} values the crop leaves; expected a pad < {d + min(lo, hi)}")
    if not any(full):
        return x
    # wrap: Network.pad's circular padding (crops first, as ONNX Runtime does)
    return cx.net.pad(x, full, mode={"edge": "replicate", "wrap": "circular"}.get(mode, mode), value=value,
                      name=cx.fresh(nd.name))


def _resize(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0)
    _spatial(nd, x)
    a = nd.attrs
    s = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in a.items()}
    mode = s.get("mode", "nearest")
    coord = s.get("coordinate_transformation_mode", "half_pixel")
    nearest = s.get("nearest_mode", "round_prefer_floor")
    if mode not in ("nearest", "linear", "cubic"):
        raise nd.refuse(f"mode={mode!r}; expected 'nearest', 'linear' or 'cubic'")
    if coord not in ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"):
        raise nd.refuse(f"coordinate_transformation_mode={coord!r}; expected half_pixel, pytorch_half_pixel, "
                        f"align_corners or asymmetric")
    if s.get("antialias", 0) and mode == "nearest":
        raise nd.refuse("antialias=1 with mode 'nearest'; expected mode 'linear' or 'cubic' (ONNX defines no "
                        "antialiased nearest)")
    if s.get("exclude_outside", 0) and mode != "cubic" and not s.get("antialias", 0):
        raise nd.refuse(f"exclude_outside=1 with mode={mode!r}; expected 0 (or mode 'cubic', or antialias=1)")
    if s.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise nd.refuse(f"keep_aspect_ratio_policy={s['keep_aspect_ratio_policy']!r}; expected 'stretch'")
    scales, sizes = cx.const(nd, 2, "scales"), cx.const(nd, 3, "sizes")
    scales = None if scales is None or scales.size == 0 else [float(v) for v in scales.reshape(-1)]
    sizes = None if sizes is None or sizes.size == 0 else [int(v) for v in sizes.reshape(-1)]
    if (scales is None) == (sizes is None):
        raise GraphError(nd.where, "exactly one of scales and sizes must be given")
    axes = [fold._axis(nd, v, 4, "axes") for v in a.get("axes", range(4))]
    given = scales if scales is not None else sizes
    if len(given) != len(axes):
        raise GraphError(nd.where, f"{len(given)} {'scales' if scales is not None else 'sizes'} for {len(axes)} "
                                   f"axes; expected one per axis")
    full_scale, full_size = [1.0] * 4, list(x.shape)
    for j, ax in enumerate(axes):
        if scales is not None:
            full_scale[ax] = scales[j]
            full_size[ax] = int(np.floor(x.shape[ax] * scales[j]))
        else:
            full_size[ax] = sizes[j]
    if tuple(full_size[:2]) != x.shape[:2] or (scales is not None and full_scale[:2] != [1.0, 1.0]):
        raise nd.refuse(f"resize of {x.shape} to {tuple(full_size)}; tilefuse resizes H and W only")
    if min(full_size) < 1:
        raise GraphError(nd.where, f"resize of {x.shape} to {tuple(full_size)} is empty")
    if scales is not None and coord in ("align_corners", "pytorch_half_pixel"):
        for ax in (2, 3):   # these modes use the unrounded output length in * scale
            if x.shape[ax] * full_scale[ax] != full_size[ax]:
                raise nd.refuse(f"{coord} with scale {full_scale[ax]} on axis {ax} (size {x.shape[ax]}): the "
                                f"output length {x.shape[ax] * full_scale[ax]} is not whole; tilefuse implements "
                                f"whole output lengths (give sizes instead)")
    if s.get("antialias", 0):
        return _resize_antialias(cx, nd, x, full_size, [full_scale[ax] if scales is not None else
                                                        full_size[ax] / x.shape[ax] for ax in (0, 1, 2, 3)],
                                 mode, coord, float(a.get("cubic_coeff_a", -0.75)), bool(a.get("exclude_outside", 0)))
    extra = {"cubic_a": float(a.get("cubic_coeff_a", -0.75)), "cubic_exclude": bool(a.get("exclude_outside", 0))} \
        if mode == "cubic" else {}
    return cx.net.add_op("resize", [x], dict(size=tuple(full_size[2:]), mode=mode, coord=coord,
                                             nearest_mode=nearest, arith="onnx", **extra,
                                             scales=None if scales is None else tuple(full_scale[2:])),
                         cx.fresh(nd.name))


def resize_weights(n_in: int, n_out: int, scale: float, mode: str, coord: str, cubic_a: float = -0.75,
                   exclude_outside: bool = False, antialias: bool = True) -> np.ndarray:
    """(n_out, n_in): ONNX Resize's weights along one axis (the reference implementation's, float64). Output x
    maps to x_ori by the coordinate mode; its taps are base + i, base = ceil(x_ori) - 1, ratio = x_ori - base in
    (0, 1], i from 1 - n / 2 to n / 2 (the n nearest, ties to the smaller); antialiased, a downsampling by s widens
    the filter to 1 / s (linear: 2 / s taps of a tent, cubic: 4 / s of Keys' kernel), normalized; taps outside the
    input take its edge values (or, exclude_outside, are dropped and the rest renormalized)."""
    w = np.zeros((n_out, n_in))
    out_len = scale * n_in                     # the unrounded output length (align_corners, pytorch_half_pixel)
    s = min(scale, 1.0) if antialias else 1.0
    for x in range(n_out):
        if coord == "align_corners":
            x_ori = 0.0 if out_len == 1 else x * (n_in - 1) / (out_len - 1)
        elif coord == "asymmetric":
            x_ori = x / scale
        elif coord == "pytorch_half_pixel" and out_len == 1:
            x_ori = -0.5
        else:                                  # half_pixel, pytorch_half_pixel
            x_ori = (x + 0.5) / scale - 0.5
        base = math.ceil(x_ori) - 1
        ratio = x_ori - base
        if mode == "linear":
            start = math.floor(-1.0 / s) + 1
            taps = np.arange(start, 2 - start)
            c = np.clip(1.0 - np.abs((taps - ratio) * s), 0.0, 1.0)
        else:
            start = math.floor(-2.0 / s) + 1
            taps = np.arange(start, 2 - start)
            d = np.abs((taps - ratio) * s)
            A = cubic_a
            c = np.where(d <= 1, (A + 2) * d ** 3 - (A + 3) * d ** 2 + 1,
                         np.where(d < 2, A * d ** 3 - 5 * A * d ** 2 + 8 * A * d - 4 * A, 0.0))
        if antialias:
            c = c / c.sum()
        idx = base + taps
        if exclude_outside:
            c = np.where((idx >= 0) & (idx < n_in), c, 0.0)
            c = c / c.sum()
        np.add.at(w[x], np.clip(idx, 0, n_in - 1), c)
    return w


def _resize_antialias(cx: Ctx, nd: OnnxNode, x: DataNode, size, scale, mode: str, coord: str, cubic_a: float,
                      exclude: bool) -> DataNode:
    """Resize with antialias=1 (linear or cubic): one weight matrix per resized axis (`resize_weights`) and a
    matmul by it, W first, then H (the reference's order); an axis whose matrix is the identity is left."""
    if coord not in ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"):
        raise nd.refuse(f"antialias with coordinate_transformation_mode={coord!r}")
    y = x
    ww = resize_weights(x.shape[3], size[3], scale[3], mode, coord, cubic_a, exclude)
    wh = resize_weights(x.shape[2], size[2], scale[2], mode, coord, cubic_a, exclude)
    keep_w = ww.shape[0] == ww.shape[1] and np.array_equal(ww, np.eye(len(ww)))
    keep_h = wh.shape[0] == wh.shape[1] and np.array_equal(wh, np.eye(len(wh)))
    if not keep_w:      # (N, C, H, W) @ (W, Wo) -> (N, C, H, Wo)
        y = cx.net.matmul(y, cx.const_node(nd.name + ".aa_w", np.ascontiguousarray(ww.T), x.dtype),
                          name=cx.fresh(nd.name if keep_h else nd.name + ".aa_cols"))
    if not keep_h:      # (Ho, H) @ (N, C, H, Wo) -> (N, C, Ho, Wo)
        y = cx.net.matmul(cx.const_node(nd.name + ".aa_h", wh, x.dtype), y, name=cx.fresh(nd.name))
    if y is x:          # nothing resampled: the identity, a node of its own for the graph's output names
        y = cx.net.mul(x, 1.0, name=cx.fresh(nd.name))
    return y


def _grid_sample(cx: Ctx, nd: OnnxNode, used):
    """GridSample (16: bilinear / nearest / bicubic; 20, 22: linear / nearest / cubic, N-D) of a 4-D input."""
    x = cx.computed(nd, 0)
    g = cx.net.constant(cx.fresh(nd.inputs[1]), cx.consts[nd.inputs[1]], dtype=x.dtype) if cx.is_const(nd, 1) \
        else cx.computed(nd, 1, "grid")
    mode = _str(nd.attrs, "mode", "bilinear" if nd.version < 20 else "linear")
    pad = _str(nd.attrs, "padding_mode", "zeros")
    if mode not in ("bilinear", "linear", "nearest", "bicubic", "cubic") or len(x.shape) != 4:
        raise nd.refuse(f"GridSample mode {mode!r} of a {len(x.shape)}-D input; tilefuse samples 4-D (N, C, H, W) "
                        f"inputs, mode {'bilinear, nearest or bicubic' if nd.version < 20 else 'linear, nearest or cubic'}")
    if pad not in ("zeros", "border", "reflection"):
        raise GraphError(nd.where, f"padding_mode {pad!r}; expected zeros, border or reflection")
    ac = nd.attrs.get("align_corners", 0)
    if ac not in (0, 1):
        raise GraphError(nd.where, f"align_corners={ac!r}; expected 0 or 1")
    mode = {"linear": "bilinear", "cubic": "bicubic"}.get(mode, mode)
    return cx.net.grid_sample(x, g, mode, pad, bool(ac), name=cx.fresh(nd.name))


def _affine_grid(cx: Ctx, nd: OnnxNode, used):
    """AffineGrid (20) of a computed 2-D theta (N, 2, 3) and a constant size (N, C, H, W): the base grid (H W, 3) of
    (x, y, 1) times theta transposed, as ATen's affine_grid (a matmul of the constant base with the computed
    theta), (N, H, W, 2)."""
    theta = cx.computed(nd, 0, "theta")
    size = cx.const(nd, 1, "size")
    if size is None or np.asarray(size).dtype.kind not in "iu" or np.asarray(size).shape != (4,):
        raise nd.refuse(f"AffineGrid size {None if size is None else np.asarray(size).tolist()}; tilefuse takes a "
                        f"constant 4-element (N, C, H, W) size (2-D grids)")
    ac = nd.attrs.get("align_corners", 0)
    if ac not in (0, 1):
        raise GraphError(nd.where, f"align_corners={ac!r}; expected 0 or 1")
    return cx.net.affine_grid(theta, np.asarray(size), bool(ac), name=cx.fresh(nd.name))


def _scatter_result(cx: Ctx, nd: OnnxNode, data: DataNode, updates: DataNode, target: np.ndarray) -> DataNode:
    """data with updates written at constant positions: target[i] is the flat position in data of updates' flat
    element i. The result, in data's flat order, is cut into runs taken from data or from updates (a slice each,
    step 1), concatenated and reshaped back: exact, no arithmetic (a slice assignment is 2-4 runs)."""
    size = int(np.prod(data.shape))
    if target.size and (target.min() < 0 or target.max() >= size):
        raise GraphError(nd.where, f"{nd.op} writes position {int(target.max())} of a {size}-element tensor")
    src = np.full(size, -1, np.int64)          # the updates' element each position takes, -1: data's own
    src[target] = np.arange(target.size)
    if np.unique(target).size != target.size:
        raise nd.refuse(f"{nd.op} writing one position twice (reduction 'none': ONNX leaves the result undefined)")
    pos = np.arange(size)
    from_upd = src >= 0
    idx = np.where(from_upd, src, pos)
    cut = np.flatnonzero((from_upd[1:] != from_upd[:-1]) | (idx[1:] != idx[:-1] + 1)) + 1
    starts = np.concatenate([[0], cut])
    ends = np.concatenate([cut, [size]])
    if len(starts) > gather.MAX_RUNS:
        box = _scatter_box(data.shape, target)
        if box is not None:
            return _scatter_into_box(cx, nd, data, updates, box)
        raise nd.refuse(f"{nd.op} at constant indices that make {len(starts)} runs of positions and no strided box "
                        f"(x[a:b:s, c:d:t, ...] = v); tilefuse builds up to {gather.MAX_RUNS} runs (a slice each)")
    flat = {}

    def flat_of(t: DataNode, key: str) -> DataNode:
        if key not in flat:
            n = int(np.prod(t.shape))
            flat[key] = t if len(t.shape) == 1 else cx.net.reshape(t, (n,), name=cx.fresh(f"{nd.name}.{key}_flat"))
        return flat[key]
    parts = []
    for a, b in zip(starts, ends):
        u = bool(from_upd[a])
        t = flat_of(updates, "updates") if u else flat_of(data, "data")
        lo = int(idx[a])
        n_t = int(np.prod(t.shape))
        parts.append(t if (lo, lo + b - a) == (0, n_t) else
                     cx.net.slice(t, 0, lo, lo + int(b - a), 1, name=cx.fresh(f"{nd.name}.run")))
    y = parts[0] if len(parts) == 1 else cx.net.concat(parts, axis=0, name=cx.fresh(nd.name + ".runs"))
    return cx.net.reshape(y, tuple(data.shape), name=cx.fresh(nd.name))


def _scatter_box(shape, target: np.ndarray):
    """The per-axis (start, step, count) when the flat positions `target`, in their order, are a strided box's in
    row-major order (the TorchScript exporter's `y[..., 1::3] = v`), else None."""
    coords = np.unravel_index(target, tuple(shape))
    box = []
    for c, size in zip(coords, shape):
        u = np.unique(c)
        step = int(u[1] - u[0]) if len(u) > 1 else 1
        if not np.array_equal(u, u[0] + step * np.arange(len(u))):
            return None
        box.append((int(u[0]), step, len(u)))
    grids = np.meshgrid(*[a + s * np.arange(n) for a, s, n in box], indexing="ij")
    expected = np.ravel_multi_index(tuple(g.reshape(-1) for g in grids), tuple(shape))
    return box if np.array_equal(expected, target) else None


def _scatter_into_box(cx: Ctx, nd: OnnxNode, data: DataNode, updates: DataNode, box) -> DataNode:
    """data[a0:b0:s0, a1:b1:s1, ...] = updates: a slice_scatter per axis the box does not span whole, nested
    (the innermost axis first: a slice of data along the outer axes takes the inner assignment)."""
    u = cx.net.reshape(updates, tuple(n for _, _, n in box), name=cx.fresh(nd.name + ".box"))

    def put(x: DataNode, axis: int) -> DataNode:
        if axis == len(box):
            return u
        a, s, n = box[axis]
        if (a, s, n) == (0, 1, x.shape[axis]):
            return put(x, axis + 1)
        stop = a + s * (n - 1) + 1
        inner = put(cx.net.slice(x, axis, a, stop, s, name=cx.fresh(f"{nd.name}.at{axis}")), axis + 1)
        return cx.net.slice_scatter(x, inner, axis, a, stop, s, name=cx.fresh(f"{nd.name}.put{axis}"))
    return put(data, 0)


def _scatter_operands(cx: Ctx, nd: OnnxNode):
    red = _str(nd.attrs, "reduction", "none")
    if red != "none":
        raise nd.refuse(f"{nd.op} with reduction '{red}'; tilefuse writes (reduction 'none')")
    if not (cx.is_const(nd, 1)):
        raise nd.refuse(f"{nd.op} at computed indices '{nd.inputs[1]}'; tilefuse scatters at constant indices "
                        f"(a slice assignment) only")
    ops = []
    for i, role in ((0, "data"), (2, "updates")):
        ops.append(cx.net.constant(cx.fresh(nd.inputs[i]), cx.consts[nd.inputs[i]]) if cx.is_const(nd, i)
                   else cx.computed(nd, i, role))
    data, updates = ops
    if data.dtype != updates.dtype:
        raise GraphError(nd.where, f"data {data.dtype} and updates {updates.dtype}; expected one dtype")
    ind = np.asarray(cx.consts[nd.inputs[1]])
    if ind.dtype.kind not in "iu":
        raise GraphError(nd.where, f"indices have dtype {ind.dtype}; expected int64 or int32")
    return data, updates, ind.astype(np.int64)


def _element_positions(nd: OnnxNode, ind: np.ndarray, axis: int, shp: tuple) -> np.ndarray:
    """GatherElements / ScatterElements: the flat position in a tensor of shape shp of each element of ind (in
    ind's flat order): its own position with the axis coordinate replaced by the index (negative from the end)."""
    axis %= len(shp)
    if ((ind < -shp[axis]) | (ind >= shp[axis])).any():
        raise GraphError(nd.where, f"{nd.op} index out of range for axis {axis} of {shp}")
    coords = list(np.indices(ind.shape))
    coords[axis] = np.where(ind < 0, ind + shp[axis], ind)
    return np.ravel_multi_index(tuple(c.reshape(-1) for c in coords), shp)


def _gather_elements(cx: Ctx, nd: OnnxNode, used):
    """GatherElements at constant indices: each output element is data at its own position with the axis
    coordinate replaced by the index; the positions, in output order, cut into runs of consecutive ones (a slice
    of the flattened data each), concatenated and reshaped. (At an integer input's values: onnx_import's take.)"""
    data = cx.computed(nd, 0, "data")
    ind = cx.const(nd, 1, "indices")
    shp = tuple(data.shape)
    ind = np.asarray(ind)
    axis = int(nd.attrs.get("axis", 0))
    if ind.dtype.kind not in "iu" or ind.ndim != len(shp) or not -len(shp) <= axis < len(shp) or \
            any(a > b for d, (a, b) in enumerate(zip(ind.shape, shp)) if d != axis % len(shp)) or ind.size == 0:
        raise GraphError(nd.where, f"GatherElements indices {ind.dtype} {ind.shape}, axis {axis} for data {shp}; "
                                   f"expected integer indices of data's rank, within data's shape off the axis")
    pos = _element_positions(nd, ind, axis, shp)
    cut = np.flatnonzero(pos[1:] != pos[:-1] + 1) + 1
    starts, ends = np.concatenate([[0], cut]), np.concatenate([cut, [pos.size]])
    if len(starts) > gather.MAX_RUNS:
        raise nd.refuse(f"GatherElements at constant indices that make {len(starts)} runs; tilefuse builds up to "
                        f"{gather.MAX_RUNS} (a slice each)")
    size = int(np.prod(shp))
    flat = data if len(shp) == 1 else cx.net.reshape(data, (size,), name=cx.fresh(nd.name + ".flat"))
    parts = [flat if (int(pos[a]), int(b - a)) == (0, size) else
             cx.net.slice(flat, 0, int(pos[a]), int(pos[a]) + int(b - a), 1, name=cx.fresh(nd.name + ".run"))
             for a, b in zip(starts, ends)]
    y = parts[0] if len(parts) == 1 else cx.net.concat(parts, axis=0, name=cx.fresh(nd.name + ".runs"))
    return cx.net.reshape(y, tuple(ind.shape), name=cx.fresh(nd.name))


def _scatter_nd(cx: Ctx, nd: OnnxNode, used):
    """ScatterND at constant indices (the TorchScript exporter's `x[:, 0] = v`): indices (..., k) name slices of
    data (the first k axes), updates (indices.shape[:-1] + data.shape[k:]) fill them."""
    data, updates, ind = _scatter_operands(cx, nd)
    k = ind.shape[-1] if ind.ndim else 0
    shp = tuple(data.shape)
    if ind.ndim < 1 or not 1 <= k <= len(shp) or tuple(updates.shape) != ind.shape[:-1] + shp[k:]:
        raise GraphError(nd.where, f"ScatterND indices {ind.shape}, updates {updates.shape} for data {shp}; expected "
                                   f"updates of shape indices.shape[:-1] + data.shape[k:]")
    dims = np.array(shp[:k])
    t = ind.reshape(-1, k)
    if ((t < -dims) | (t >= dims)).any():
        raise GraphError(nd.where, f"ScatterND index out of range for data {shp}")
    t = np.where(t < 0, t + dims, t)
    inner = int(np.prod(shp[k:]))
    base = np.ravel_multi_index(tuple(t.T), shp[:k]) * inner                # each slice's first flat position
    target = (base[:, None] + np.arange(inner)[None, :]).reshape(-1)
    return _scatter_result(cx, nd, data, updates, target)


def _scatter_elements(cx: Ctx, nd: OnnxNode, used):
    """ScatterElements (and Scatter-9/11) at constant indices (the dynamo exporter's select_scatter): updates'
    element at (i, j, ...) goes to data at the same position with the axis coordinate replaced by the index."""
    data, updates, ind = _scatter_operands(cx, nd)
    shp = tuple(data.shape)
    axis = int(nd.attrs.get("axis", 0))
    if not -len(shp) <= axis < len(shp) or ind.shape != tuple(updates.shape) or len(ind.shape) != len(shp) or \
            any(a > b for a, b in zip(ind.shape, shp)):
        raise GraphError(nd.where, f"{nd.op} indices {ind.shape}, updates {updates.shape}, axis {axis} for data "
                                   f"{shp}; expected indices and updates of one shape within data's")
    return _scatter_result(cx, nd, data, updates, _element_positions(nd, ind, axis, shp))


def _upsample(cx: Ctx, nd: OnnxNode, used):
    """Upsample (opset 7: scales an attribute; 9: input 1) and Resize before opset 11 (scales input 1): older
    exporters' nearest / bilinear upsampling (torch.onnx at opset 9, YOLOv3's files). Their coordinates are
    asymmetric (source = destination / scale) and their nearest pixel ONNX Runtime's legacy one: truncated when
    enlarging, rounded up when shrinking (the floor / ceil nearest modes here); output length floor(in * scale)."""
    if nd.op == "Resize" and nd.version >= 11:
        return _resize(cx, nd, used)
    x = cx.computed(nd, 0)
    _spatial(nd, x)
    mode = nd.attrs.get("mode", "nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("nearest", "linear", "bilinear"):
        raise nd.refuse(f"mode={mode!r}; expected 'nearest' or 'linear'")
    if nd.op == "Upsample" and nd.version < 9:
        if "scales" not in nd.attrs:
            raise GraphError(nd.where, "attribute scales is missing")
        scales = [float(v) for v in nd.attrs["scales"]]
    else:
        sc = cx.const(nd, 1, "scales")
        if sc is None:
            raise GraphError(nd.where, "input 1 (scales) is missing")
        scales = [float(v) for v in np.asarray(sc).reshape(-1)]
    if len(scales) != 4 or not all(np.isfinite(v) and v > 0 for v in scales):
        raise GraphError(nd.where, f"scales {scales}; expected 4 positive values for the input {x.shape}")
    if scales[:2] != [1.0, 1.0]:
        raise nd.refuse(f"scales {scales}; tilefuse resizes H and W only (scales 1 on N and C)")
    if nd.op == "Upsample" and min(scales) < 1:
        raise GraphError(nd.where, f"scales {scales}; Upsample's scales are at least 1 (Resize shrinks)")
    size = tuple(int(np.floor(x.shape[a] * scales[a])) for a in (2, 3))
    if min(size) < 1:
        raise GraphError(nd.where, f"upsample of {x.shape} by {scales} is empty")
    shrink = [scales[a] < 1 for a in (2, 3)]
    if mode == "nearest" and shrink[0] != shrink[1] and scales[2] != 1 and scales[3] != 1:
        raise nd.refuse(f"nearest with scales {scales}: one axis enlarged, the other shrunk (ONNX Runtime "
                        f"truncates on the first and rounds up on the second; tilefuse takes one rule per resize)")
    nearest = "ceil" if any(shrink) else "floor"
    return cx.net.add_op("resize", [x], dict(size=size, mode="linear" if mode != "nearest" else "nearest",
                                             coord="asymmetric", nearest_mode=nearest, arith="onnx",
                                             scales=tuple(scales[2:])), cx.fresh(nd.name))


def _layer_norm(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0)
    r = len(x.shape)
    axis = fold._axis(nd, nd.attrs.get("axis", -1), r)
    norm_shape = x.shape[axis:]
    g = cx.const(nd, 1, "Scale")
    g = np.ones(norm_shape, np.float32) if g is None else _float_array(nd, g, "Scale")
    b = cx.const(nd, 2, "B")
    b = np.zeros(norm_shape, g.dtype) if b is None else _float_array(nd, b, "B")
    try:
        g, b = np.broadcast_to(g, norm_shape), np.broadcast_to(b, norm_shape)
    except ValueError:
        raise GraphError(nd.where, f"Scale {g.shape} / B {b.shape} do not broadcast to the normalized shape "
                                   f"{norm_shape}") from None
    return cx.net.layer_norm(x, cx.const_node(nd.inputs[1] if nd.has(1) else nd.name + ".Scale", g, x.dtype),
                             cx.const_node(nd.inputs[2] if nd.has(2) else nd.name + ".B", b, x.dtype),
                             axis=axis, eps=nd.attrs.get("epsilon", 1e-5), name=cx.fresh(nd.name))


def _group_norm(cx: Ctx, nd: OnnxNode, used):
    """InstanceNormalization (groups = C) and GroupNormalization (num_groups; scale and bias per channel from
    opset 21, per group in opset 18: each group's value repeated over its C / G channels) -> group_norm."""
    x = cx.computed(nd, 0)
    if len(x.shape) < 3:
        raise GraphError(nd.where, f"input '{x.name}' has shape {x.shape}; expected (N, C, D1, ...)")
    c = x.shape[1]
    groups = c
    if nd.op == "GroupNormalization":
        if "num_groups" not in nd.attrs:
            raise GraphError(nd.where, "attribute num_groups is missing")
        groups = int(nd.attrs["num_groups"])
        if groups < 1 or c % groups:
            raise GraphError(nd.where, f"num_groups={groups} does not divide the {c} channels of input "
                                       f"'{x.name}' {x.shape}")
    vals = []
    for i, role in ((1, "scale"), (2, "bias" if nd.op == "GroupNormalization" else "B")):
        v = cx.const(nd, i, role)
        if v is None:
            raise GraphError(nd.where, f"input {role} (input {i}) is missing")
        v = _float_array(nd, v, role)
        if nd.op == "GroupNormalization" and nd.version < 21:      # opset 18: one value per group
            if v.shape != (groups,):
                raise GraphError(nd.where, f"{role} has shape {v.shape}; expected ({groups},) (GroupNormalization-"
                                           f"{nd.version}: one value per group)")
            v = np.repeat(v, c // groups)                          # (G,) -> (C,)
        if v.shape != (c,):
            raise GraphError(nd.where, f"{role} has shape {v.shape}; expected ({c},) (one value per channel)")
        vals.append(cx.const_node(nd.inputs[i], v, x.dtype))
    return cx.net.group_norm(x, groups, vals[0], vals[1], eps=nd.attrs.get("epsilon", 1e-5), name=cx.fresh(nd.name))


def _conv_transpose(cx: Ctx, nd: OnnxNode, used):
    x, wn, bn, k, s, d = _conv_operands(cx, nd, "(C, M/group, kH, kW)")
    a = nd.attrs
    op = _hw(nd, a, "output_padding", (0, 0))
    auto = _str(a, "auto_pad", "NOTSET")
    full = [s[i] * (x.shape[2 + i] - 1) + op[i] + (k[i] - 1) * d[i] + 1 for i in range(2)]  # unpadded size
    out = [int(v) for v in a["output_shape"][-2:]] if "output_shape" in a else None
    op = list(op)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        # ONNX: total_padding = full - output_shape (default input * stride), split floor-wise; a
        # negative end pad is extra output at the end (output_padding)
        out = out or [v * st for v, st in zip(x.shape[2:], s)]
        pads = []
        for i in range(2):
            t = full[i] - out[i]
            lo, hi = (t // 2, t - t // 2) if auto == "SAME_UPPER" else (t - t // 2, t // 2)
            if lo < 0:
                raise nd.refuse(f"auto_pad={auto} for output {out} needs negative padding at the start of "
                                f"axis {2 + i}; expected an output of at most {full[i]}")
            if hi < 0:
                op[i], hi = op[i] - hi, 0
            pads += [lo, hi]
        pads = tuple(pads)
    else:
        pads = (0, 0, 0, 0) if auto == "VALID" else _pads(nd, a, x, k, s, d)
        if out is not None:   # explicit output_shape with explicit pads: extra rows/cols at the end
            for i in range(2):
                extra = out[i] - (full[i] - pads[2 * i] - pads[2 * i + 1])
                if extra < 0:
                    raise nd.refuse(f"output_shape {out} is smaller than the transposed conv's output on axis "
                                    f"{2 + i}; expected at least {full[i] - pads[2 * i] - pads[2 * i + 1]}")
                op[i] += extra
    return cx.net.conv_transpose2d(x, wn, bn, stride=s, padding=pads, output_padding=tuple(op), dilation=d,
                                   groups=int(a.get("group", 1)), name=cx.fresh(nd.name))


def _global_max_pool(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0)
    _spatial(nd, x)
    return cx.net.max_pool(x, x.shape[2:], 1, name=cx.fresh(nd.name))   # (N, C, H, W) -> (N, C, 1, 1)


def _variadic_sum(cx: Ctx, nd: OnnxNode, used):
    """Sum / Mean of any number of tensors (NumPy broadcasting): a chain of adds (then / n)."""
    ins = [i for i in range(len(nd.inputs)) if nd.has(i)]
    comp = [cx.computed(nd, i) for i in ins if not cx.is_const(nd, i)]
    for i in ins:
        if cx.is_const(nd, i):
            _float_array(nd, cx.const(nd, i, f"input {i}"), f"input {i}")
    xs = [cx.operand(nd, i, comp[0].dtype) for i in ins]
    if len(xs) == 1:
        return xs[0]
    y = xs[0]
    for k, b in enumerate(xs[1:], 1):
        last = k == len(xs) - 1 and nd.op == "Sum"
        y = cx.net.add(y, b, name=cx.fresh(nd.name if last else f"{nd.name}.add{k}"))
    if nd.op == "Mean":
        y = cx.net.div(y, cx.const_node(nd.name + ".n", np.array([len(xs)]), y.dtype), name=cx.fresh(nd.name))
    return y


def _scalar(x: DataNode, v: float) -> np.ndarray:
    """v as a constant operand of x that broadcasts to x's own shape: (1,), or () for a 0-d x (a (1,) constant
    made Neg of a Squeeze to a scalar shape (1,): onnx_mutants seed 6018449)."""
    return np.full((1,) if x.shape else (), v)


def _neg(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0)
    return cx.net.mul(x, cx.const_node("minus_one", _scalar(x, -1.0), x.dtype), name=cx.fresh(nd.name))


def _reciprocal(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0)
    return cx.net.div(cx.const_node("one", _scalar(x, 1.0), x.dtype), x, name=cx.fresh(nd.name))


def _pow(cx: Ctx, nd: OnnxNode, used):
    """Pow by a one-value constant exponent: 1 (x), 2 and 3 (products), -1 (1 / x), 0.5 (sqrt), any other
    as activation(pow); a one-value constant base X > 0 to a computed power Y as activation(base_pow) (the dynamo
    exporter's torch.exp2, 10 ** x)."""
    if cx.is_const(nd, 0) and not cx.is_const(nd, 1):
        y, c = cx.computed(nd, 1, "Y"), np.asarray(cx.consts[nd.inputs[0]])
        if c.size != 1 or np.broadcast_shapes(y.shape, c.shape) != y.shape or c.dtype.kind != "f":
            raise nd.refuse(f"constant base X of shape {c.shape}, dtype {c.dtype}; tilefuse implements a float "
                            f"base of one value that does not broadcast Y {y.shape}")
        b = float(c.reshape(-1)[0])
        if not (np.isfinite(b) and b > 0):
            raise nd.refuse(f"constant base X {b}; expected a finite number > 0")
        return cx.net.activation(y, "base_pow", name=cx.fresh(nd.name), base=b)
    x = cx.computed(nd, 0, "X")
    e = cx.const(nd, 1, "exponent Y")
    if e is None or e.size != 1:
        raise nd.refuse(f"exponent {None if e is None else e.reshape(-1)[:4].tolist()}; tilefuse implements "
                        f"a constant exponent of one value")
    k = float(e.reshape(-1)[0])
    name = cx.fresh(nd.name)
    if np.broadcast_shapes(x.shape, e.shape) != x.shape:
        raise nd.refuse(f"exponent of shape {e.shape} broadcasts the input {x.shape}; expected a scalar")
    if k == 1.0:
        return x
    if k == -1.0:
        return cx.net.div(cx.const_node("one", _scalar(x, 1.0), x.dtype), x, name=name)
    if k == 0.5:
        return cx.net.activation(x, "sqrt", name=name)
    if k not in (2.0, 3.0):
        if not np.isfinite(k):
            raise nd.refuse(f"exponent {k}; expected a finite number")
        return cx.net.power(x, k, name=name)
    sq = cx.net.mul(x, x, name=name if k == 2.0 else cx.fresh(nd.name + ".sq"))
    return sq if k == 2.0 else cx.net.mul(sq, x, name=name)


def _selu(cx: Ctx, nd: OnnxNode, used):
    """Selu: activation(selu) with the default alpha and gamma (PyTorch's constants), else gamma * elu(alpha)."""
    from ...kernels import activations as acts
    x = cx.computed(nd, 0)
    alpha, gamma = float(nd.attrs.get("alpha", 1.67326319217681884765625)), \
        float(nd.attrs.get("gamma", 1.05070102214813232421875))
    if np.float32(alpha) == np.float32(acts._SELU_ALPHA) and np.float32(gamma) == np.float32(acts._SELU_SCALE):
        return cx.net.activation(x, "selu", name=cx.fresh(nd.name))
    y = cx.net.activation(x, "elu", name=cx.fresh(nd.name + ".elu"), alpha=alpha)
    return cx.net.mul(y, gamma, name=cx.fresh(nd.name))


def _softsign(cx: Ctx, nd: OnnxNode, used):
    """Softsign: x / (1 + |x|)."""
    x = cx.computed(nd, 0)
    a = cx.net.activation(x, "abs", name=cx.fresh(nd.name + ".abs"))
    d = cx.net.add(a, cx.const_node("one", _scalar(x, 1.0), x.dtype), name=cx.fresh(nd.name + ".den"))
    return cx.net.div(x, d, name=cx.fresh(nd.name))


def _max_min(cx: Ctx, nd: OnnxNode, used):
    """Max / Min of a tensor and scalar constants: a clip (relu for max(x, 0)); of several computed tensors or
    tensor constants: a chain of element-wise maximum / minimum ops, broadcasting (NaN wins, as np.maximum)."""
    ins = [i for i in range(len(nd.inputs)) if nd.has(i)]
    comp = [i for i in ins if not cx.is_const(nd, i)]
    if not comp:
        raise nd.refuse(f"{nd.op} of constants only (expected them folded)")
    x = cx.computed(nd, comp[0])
    cs = [_float_array(nd, cx.const(nd, i, "bound"), f"input {i}") for i in ins if i != comp[0] and i not in comp[1:]]
    if len(comp) > 1 or any(c.size != 1 for c in cs) or any(len(c.shape) > len(x.shape) for c in cs):
        # (a one-value constant of a higher rank broadcasts x up: Min(x of shape (), c of shape (1,)) is (1,),
        # onnx_mutants seed 14014198; the chain's ops broadcast, a clip keeps x's shape)
        f = cx.net.maximum if nd.op == "Max" else cx.net.minimum
        rest = [i for i in ins if i != comp[0]]
        for k, i in enumerate(rest):
            other = cx.computed(nd, i) if i in comp else cx.const_node(f"{nd.name}.input{i}",
                                                                        cx.const(nd, i, "operand"), x.dtype)
            x = f(x, other, name=cx.fresh(nd.name if k == len(rest) - 1 else f"{nd.name}.{k}"))
        return x
    if not cs:
        return x
    v = [float(c.reshape(-1)[0]) for c in cs]
    name = cx.fresh(nd.name)
    if nd.op == "Max":
        lo = max(v)
        return cx.net.relu(x, name=name) if _is_relu_bound(lo) else cx.net.activation(x, "clip", name=name, min=lo)
    return cx.net.activation(x, "clip", name=name, max=min(v))


def _is_relu_bound(lo: float) -> bool:
    """max(x, lo) is relu for lo = +0.0 only: max(x, -0.0) is -0.0 for negative x (NumPy, ONNX Runtime,
    PyTorch), which a later 1 / x tells apart from relu's +0.0 (onnx_mutants seed 9053317); the clip kernel keeps
    it."""
    return lo == 0 and not np.signbit(lo)


def _expand(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0)
    shape = fold._ints(nd, cx.const(nd, 1, "shape"), "shape")
    try:
        out = tuple(int(d) for d in np.broadcast_shapes(x.shape, tuple(shape)))
    except ValueError:
        raise GraphError(nd.where, f"Expand of {x.shape} to {shape}: shapes do not broadcast") from None
    if out == x.shape:
        return x
    xs = (1,) * (len(out) - len(x.shape)) + x.shape
    fold._check_size(nd, [o if d == 1 else 1 for d, o in zip(xs, out)])
    ones = np.ones([o if d == 1 else 1 for d, o in zip(xs, out)])     # only the expanded axes
    return cx.net.mul(x, cx.const_node(nd.name + ".ones", ones, x.dtype), name=cx.fresh(nd.name))   # exact


def _tile(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0)
    reps = fold._ints(nd, cx.const(nd, 1, "repeats"), "repeats")
    if reps is None or len(reps) != len(x.shape) or min(reps) < 1:
        raise GraphError(nd.where, f"repeats {reps} for input {x.shape}; expected {len(x.shape)} values >= 1")
    if max(reps) > 64:
        raise nd.refuse(f"repeats {reps}; tilefuse tiles up to 64 copies per axis (as a concat)")
    y = x
    for ax, r in enumerate(reps):
        if r > 1:
            y = cx.net.concat([y] * r, axis=ax, name=cx.fresh(f"{nd.name}.axis{ax}"))
    return y


def _depth_space(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0)
    _spatial(nd, x)
    if "blocksize" not in nd.attrs:
        raise GraphError(nd.where, "attribute blocksize is missing")
    b = int(nd.attrs["blocksize"])
    n, c, h, w = x.shape
    mode = _str(nd.attrs, "mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise nd.refuse(f"mode={mode!r}; expected DCR or CRD")
    if b < 1:
        raise GraphError(nd.where, f"blocksize {b}; expected a positive integer")
    if nd.op == "DepthToSpace":
        if c % (b * b):
            raise GraphError(nd.where, f"channels {c} are not a multiple of blocksize^2 = {b * b}")
    else:
        if h % b or w % b:
            raise GraphError(nd.where, f"H, W = {h}, {w} are not multiples of blocksize {b}")
    return cx.net.pixel_shuffle(x, b, mode.lower(), inverse=nd.op == "SpaceToDepth", name=cx.fresh(nd.name))


def _softmax(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0)
    r = len(x.shape)
    axis = fold._axis(nd, nd.attrs.get("axis", -1 if nd.version >= 13 else 1), r)
    f = cx.net.log_softmax if nd.op == "LogSoftmax" else cx.net.softmax
    if nd.version >= 13 or int(np.prod(x.shape[axis + 1:])) == 1:
        return f(x, axis=axis, name=cx.fresh(nd.name))
    # before opset 13 the input is coerced to 2-D at `axis`: one softmax over all dims from `axis` on
    flat = (int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:])))    # (d0..d_{axis-1}, d_axis..)
    y = cx.net.reshape(x, flat, name=cx.fresh(nd.name + ".2d"))
    y = f(y, axis=1, name=cx.fresh(nd.name + ".softmax"))
    return cx.net.reshape(y, x.shape, name=cx.fresh(nd.name))


def _lrn(cx: Ctx, nd: OnnxNode, used):
    a = nd.attrs
    x = cx.computed(nd, 0)
    _spatial(nd, x)
    if "size" not in a:
        raise GraphError(nd.where, "attribute size is missing")
    if int(a["size"]) % 2 == 0:
        # ONNX's window is [c - floor((size - 1) / 2), c + ceil((size - 1) / 2)]; the IR's (PyTorch's) is
        # [c - size // 2, c + (size - 1) // 2]: the same for odd sizes, one channel apart for even ones
        raise nd.refuse(f"size={int(a['size'])} is even: ONNX's channel window for an even size starts one "
                        "channel later than tilefuse's (PyTorch's), and ONNX Runtime refuses even sizes too; "
                        "expected an odd size")
    return cx.net.local_response_norm(x, int(a["size"]), a.get("alpha", 1e-4), a.get("beta", 0.75),
                                      a.get("bias", 1.0), name=cx.fresh(nd.name))


def _concat(cx: Ctx, nd: OnnxNode, used):
    if "axis" not in nd.attrs:
        raise GraphError(nd.where, "attribute axis is missing")
    comp = [cx.env[t] for t in nd.inputs if t in cx.env]
    if not comp:
        raise GraphError(nd.where, "no computed input")
    xs = [cx.operand(nd, i, comp[0].dtype) for i in range(len(nd.inputs)) if nd.has(i)]
    xs = [d for d in xs if 0 not in d.shape]
    return cx.net.concat(xs, axis=int(nd.attrs["axis"]), name=cx.fresh(nd.name))


def _dropout(cx: Ctx, nd: OnnxNode, used):
    if nd.version >= 12:
        # ratio and training_mode: unused at inference, but another type or a shape other than () makes the
        # model invalid (ONNX Runtime refuses it)
        for i, role, kind, what in ((1, "ratio", "f", "a float"), (2, "training_mode", "b", "a bool")):
            v = cx.const(nd, i, role)
            v = None if v is None else np.asarray(v)
            if v is not None and (v.dtype.kind != kind or v.ndim != 0):
                raise GraphError(nd.where, f"{role} has dtype {v.dtype} and shape {v.shape}; expected {what} "
                                           f"scalar (shape ())")
        if v is not None and bool(v):                    # training_mode, a bool scalar
            raise nd.refuse("training_mode=True drops values at random; tilefuse imports inference graphs, "
                            "expected training_mode absent or False")
    _check_training_outputs(nd, used, 1, "mask")
    return cx.computed(nd, 0)      # inference: the identity


def _identity(cx: Ctx, nd: OnnxNode, used):
    return cx.computed(nd, 0)


_ONNX_CMP = {"Greater": "gt", "GreaterOrEqual": "ge", "Less": "lt", "LessOrEqual": "le", "Equal": "eq"}


def _finite(cx: Ctx, nd: OnnxNode, dtype):
    """v -> a one-value constant node of dtype (the finite bounds `boolexpr.compare_infinite` compares with)."""
    return lambda v: cx.const_node(cx.fresh(f"{nd.name}.finite"), np.full((1,), v, dtype), dtype)


def _one_infinity(cx: Ctx, nd: OnnxNode, i: int) -> float | None:
    """+-inf where input i is a constant holding that one value (a NaN-guard's `x == inf`), else None."""
    if not cx.is_const(nd, i):
        return None
    v = np.asarray(cx.consts[nd.inputs[i]])
    return float(v.reshape(-1)[0]) if v.size == 1 and v.dtype.kind == "f" and np.isinf(v).all() else None


def _comparison(cx: Ctx, nd: OnnxNode, used):
    """Greater / Less / Equal / ...OrEqual of computed tensors (or one constant): a boolexpr.Cmp, no op yet. A
    one-value +-inf constant side: `boolexpr.compare_infinite` (the IR's constants are finite)."""
    dt = next(cx.computed(nd, i).dtype for i in (0, 1) if not cx.is_const(nd, i))   # (constants only: folded)
    for i in (0, 1):
        inf = _one_infinity(cx, nd, i)
        if inf is not None:
            x = cx.computed(nd, 1 - i)
            cmp = _ONNX_CMP[nd.op] if i == 1 else boolexpr.MIRROR[_ONNX_CMP[nd.op]]
            return boolexpr.compare_infinite(x, cmp, inf, _finite(cx, nd, x.dtype), nd.where)
    a, b = (cx.operand(nd, i, dt, role) for i, role in ((0, "A"), (1, "B")))
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise GraphError(nd.where, f"A {a.shape} and B {b.shape} do not broadcast") from None
    return boolexpr.Cmp(a, _ONNX_CMP[nd.op], b, nd.where)


def _bool_input(cx: Ctx, nd: OnnxNode, i: int):
    e = cx.env.get(nd.inputs[i]) if nd.has(i) else None
    if not isinstance(e, boolexpr.BOOL):
        cx.computed(nd, i)         # names what it is (missing, a constant)
        raise nd.refuse(f"{nd.op} of a tensor that is not a comparison (tilefuse keeps bool tensors as "
                        f"comparisons of float tensors)")
    return e


def _logical(cx: Ctx, nd: OnnxNode, used):
    """Not / And / Or of comparisons: a boolexpr expression."""
    if nd.op == "Not":
        return boolexpr.Not(_bool_input(cx, nd, 0))
    return (boolexpr.And if nd.op == "And" else boolexpr.Or)(_bool_input(cx, nd, 0), _bool_input(cx, nd, 1))


def _is_nan_inf(cx: Ctx, nd: OnnxNode, used):
    """IsNaN (x != x) and IsInf (detect_positive / detect_negative: x > M, x < -M, |x| > M for the largest finite
    M): comparisons (`boolexpr`), read as a comparison is."""
    x = cx.computed(nd, 0)
    if nd.op == "IsNaN":
        return boolexpr.is_nan(x, nd.where)
    pos, neg = int(nd.attrs.get("detect_positive", 1)), int(nd.attrs.get("detect_negative", 1))
    finite = _finite(cx, nd, x.dtype)
    if pos and neg:
        x = cx.net.activation(x, "abs", name=cx.fresh(nd.name + ".abs"))
    if not (pos or neg):            # detects nothing: false everywhere (NaN included)
        return boolexpr.compare_infinite(x, "gt", float("inf"), finite, nd.where)
    return boolexpr.compare_infinite(x, "eq", float("inf") if pos else float("-inf"), finite, nd.where)


def _shrink(cx: Ctx, nd: OnnxNode, used):
    """Shrink: x + bias where x < -lambd, x - bias where x > lambd, else 0 (NaN: 0, as ONNX Runtime): where ops."""
    x = cx.computed(nd, 0)
    lambd, bias = float(nd.attrs.get("lambd", 0.5)), float(nd.attrs.get("bias", 0.0))
    b = cx.const_node(cx.fresh(nd.name + ".bias"), np.full((1,), bias, x.dtype), x.dtype)
    above = cx.net.where(x, "gt", lambd, cx.net.sub(x, b, name=cx.fresh(nd.name + ".sub")), 0.0,
                         name=cx.fresh(nd.name + ".above"))
    return cx.net.where(x, "lt", -lambd, cx.net.add(x, b, name=cx.fresh(nd.name + ".add")), above,
                        name=cx.fresh(nd.name))


def _thresholded_relu(cx: Ctx, nd: OnnxNode, used):
    """ThresholdedRelu: x where x > alpha, else 0 (NaN: 0): a where op."""
    x = cx.computed(nd, 0)
    return cx.net.where(x, "gt", float(nd.attrs.get("alpha", 1.0)), x, 0.0, name=cx.fresh(nd.name))


def _sign(cx: Ctx, nd: OnnxNode, used):
    """Sign: 1 where x > 0, else -1 where x < 0, else x (0 and NaN kept): two where ops."""
    x = cx.computed(nd, 0)
    neg = cx.net.where(x, "lt", 0.0, -1.0, x, name=cx.fresh(nd.name + ".neg"))
    return cx.net.where(x, "gt", 0.0, 1.0, neg, name=cx.fresh(nd.name))


def _cast(cx: Ctx, nd: OnnxNode, used):
    c = cx.env.get(nd.inputs[0]) if nd.has(0) else None
    if isinstance(c, boolexpr.BOOL):    # mask.float(): 1 where it holds, else 0
        to = fold.np_dtype(nd, nd.attrs["to"]) if nd.op == "Cast" else None
        if to == np.dtype(np.bool_):
            return c                # a bool to bool cast (the TorchScript exporter writes them)
        dt = np.dtype(boolexpr.leaf(c).l.dtype)
        if to is not None and to.kind in "iu" and to.itemsize >= 4:
            # to int32 / int64 (a count's start: `(x > t).sum(1)`): 1 / 0 as floats, an integer tensor (cx.ints)
            cx.ints.add(nd.outputs[0])
            cx.counts.add(nd.outputs[0])
        elif to is None or to != dt:
            raise nd.refuse(f"Cast of a comparison's bool tensor to {to}; expected {dt} or int32 / int64")
        return boolexpr.select(cx.net, c, 1.0, 0.0, cx.fresh(nd.name))
    x = cx.computed(nd, 0)
    if nd.op == "CastLike":
        to = np.dtype(cx.consts[nd.inputs[1]].dtype if cx.is_const(nd, 1) else cx.computed(nd, 1).dtype)
    else:
        to = fold.np_dtype(nd, nd.attrs["to"])
    if to != np.dtype(x.dtype):
        raise nd.refuse(f"Cast of a computed {np.dtype(x.dtype)} tensor to {to}; tilefuse casts constants only "
                        f"(a cast to the tensor's own dtype is the identity)")
    return x


@dataclass(frozen=True)
class Rule:
    convert: Callable                 # (ctx, node, used names) -> DataNode or list of DataNodes
    versions: tuple[int, ...]         # ONNX since_versions implemented
    attrs: frozenset[str]             # attributes read; any other is refused
    ir: tuple[str, ...]               # IR ops emitted
    limits: str = ""                  # what is refused, for docs/ops.md


def _topk(cx: Ctx, nd: OnnxNode, used):
    """TopK (1: k an attribute; 10, 11: K a constant input): the Values by a sorting network along the axis
    (`Network.sorted_slices`, NaN above every number), the k largest in descending order (largest=0: the k
    smallest, ascending); sorted=0 leaves the order open, and sorted it is. The Indices output is refused where
    read (the TorchScript exporter writes torch.sort / topk / kthvalue as TopK and reads the values only)."""
    x = cx.computed(nd, 0)
    if len(nd.outputs) > 1 and nd.outputs[1] in used:
        raise nd.refuse(f"output 1 '{nd.outputs[1]}' (the Indices) is used; tilefuse computes the Values only")
    if nd.version < 10:
        k = int(nd.attrs.get("k", -1))
    else:
        kk = cx.const(nd, 1, "K")
        if kk is None or np.asarray(kk).size != 1 or np.asarray(kk).dtype.kind not in "iu":
            raise GraphError(nd.where, f"K {None if kk is None else np.asarray(kk).tolist()}; expected one int64")
        k = int(np.asarray(kk).reshape(-1)[0])
    axis = fold._axis(nd, int(nd.attrs.get("axis", -1)), len(x.shape), "axis")
    n = x.shape[axis]
    if not 0 < k <= n:
        raise GraphError(nd.where, f"k={k} of an axis of {n} values; expected 0 < k <= {n}")
    v = cx.net.sorted_slices(x, axis, True, name=cx.fresh(nd.name + ".sort"))
    parts = v[:k] if nd.attrs.get("largest", 1) == 0 else v[::-1][:k]
    return parts[0] if k == 1 else cx.net.concat(parts, axis=axis, name=cx.fresh(nd.name))


def _arg_extreme(cx: Ctx, nd: OnnxNode, used):
    """ArgMax / ArgMin: the IR's argmax along `axis` (keepdims, select_last_index); its output is an integer
    tensor (cx.ints: moved, compared, Cast, or returned as int64)."""
    x = cx.computed(nd, 0)
    a = nd.attrs
    axis = fold._axis(nd, a.get("axis", 0), len(x.shape), "axis")
    y = cx.net.argmax(x, axis, bool(a.get("keepdims", 1)), nd.op == "ArgMax", bool(a.get("select_last_index", 0)),
                      name=cx.fresh(nd.name))
    cx.ints.add(nd.outputs[0])
    return y


def _mod(cx: Ctx, nd: OnnxNode, used):
    """Mod (10, 13, 28) of a computed float tensor by a one-value constant: fmod=1 (the dynamo exporter's
    torch.fmod) activation code 39, C's exact fmod; fmod=0 (floats from version 28: the divisor's sign) code 40,
    PyTorch's remainder (a zero keeps x's sign where the spec gives the divisor's)."""
    x = cx.computed(nd, 0, "A")
    d = cx.const(nd, 1, "B")
    if d is None or np.asarray(d).size != 1:
        raise nd.refuse(f"Mod by {'a computed tensor' if d is None else f'a constant of shape {np.asarray(d).shape}'}"
                        f"; tilefuse computes fmod by one number")
    fmod = nd.attrs.get("fmod", 0)
    if fmod not in (0, 1) or (fmod == 0 and nd.version < 28):
        raise GraphError(nd.where, f"Mod of a float tensor with fmod={fmod!r}; Mod-{nd.version} requires fmod=1 for "
                                   f"floats (fmod=0 from version 28)")
    return cx.net.activation(x, "fmod" if fmod else "remainder", name=cx.fresh(nd.name),
                             divisor=float(np.asarray(d).reshape(-1)[0]))


def _cumsum(cx: Ctx, nd: OnnxNode, used):
    """CumSum (11, 14) along a constant axis: the IR's cumsum (exclusive, reverse)."""
    x = cx.computed(nd, 0)
    axis = cx.const(nd, 1, "axis")
    if axis is None:
        raise nd.refuse("CumSum with a computed axis; tilefuse takes a constant axis")
    a = nd.attrs
    return cx.net.cumsum(x, fold._cumsum_axis(nd, axis, len(x.shape)), bool(a.get("exclusive", 0)),
                         bool(a.get("reverse", 0)), name=cx.fresh(nd.name))


def _col2im(cx: Ctx, nd: OnnxNode, used):
    """Col2Im (18) of 2-D blocks: `Network.fold` (constant image_shape and block_shape; pads begin and end per
    axis)."""
    x = cx.computed(nd, 0)
    image, block = cx.const(nd, 1, "image_shape"), cx.const(nd, 2, "block_shape")
    if image is None or block is None or np.asarray(image).shape != (2,) or np.asarray(block).shape != (2,):
        raise nd.refuse(f"Col2Im with image_shape {None if image is None else np.asarray(image).tolist()} and "
                        f"block_shape {None if block is None else np.asarray(block).tolist()}; tilefuse takes "
                        f"constant 2-element shapes (2-D images)")
    a = nd.attrs
    dil, strides = tuple(a.get("dilations", (1, 1))), tuple(a.get("strides", (1, 1)))
    pads = tuple(a.get("pads", (0, 0, 0, 0)))
    if len(dil) != 2 or len(strides) != 2 or len(pads) != 4:
        raise GraphError(nd.where, f"dilations {list(dil)}, strides {list(strides)}, pads {list(pads)}; expected 2, "
                                   f"2 and 4 values (2-D)")
    return cx.net.fold(x, [int(v) for v in image], [int(v) for v in block], dil, pads, strides,
                       name=cx.fresh(nd.name))


def _r(fn, versions, attrs, ir, limits=""):
    return Rule(fn, tuple(versions), frozenset(attrs.split()), tuple(ir.split()), limits)


_POOL = "auto_pad ceil_mode dilations kernel_shape pads strides"
_EW = (7, 13, 14)
_RESIZE = ("antialias axes coordinate_transformation_mode cubic_coeff_a exclude_outside extrapolation_value "
           "keep_aspect_ratio_policy mode nearest_mode")

RULES: dict[str, Rule] = {
    # convolution, pooling, normalization
    "Conv": _r(_lift_1d(_conv), (1, 11, 22), "auto_pad dilations group kernel_shape pads strides",
               "conv2d reshape", "1-D (as 2-D) or 2-D; constant W and B"),
    "ConvTranspose": _r(_lift_1d(_conv_transpose), (1, 11, 22), "auto_pad dilations group kernel_shape "
                        "output_padding output_shape pads strides", "conv_transpose2d reshape",
                        "1-D (as 2-D) or 2-D; constant W and B"),
    "BatchNormalization": _r(_batch_norm, (7, 9, 14, 15), "epsilon momentum spatial training_mode",
                             "batch_norm reshape mean sub mul add activation",
                             "inference (training_mode=0); constant statistics; training_mode=1 with only Y read: the "
                             "batch's statistics (exported weight standardization), its running outputs read: "
                             "refused"),
    "LayerNormalization": _r(_layer_norm, (17,), "axis epsilon stash_type", "layer_norm",
                             "constant Scale and B; the Mean/InvStdDev outputs are refused"),
    "InstanceNormalization": _r(_group_norm, (6, 22), "epsilon", "group_norm", "constant scale and B"),
    "GroupNormalization": _r(_group_norm, (18, 21), "epsilon num_groups stash_type", "group_norm",
                             "constant scale and bias (per group in opset 18, per channel from 21)"),
    "LRN": _r(_lrn, (1, 13), "alpha beta bias size", "local_response_norm",
              "odd sizes (an even size's ONNX window is one channel off PyTorch's; refused, as ONNX Runtime does)"),
    "MaxPool": _r(_lift_1d(_pool), (1, 8, 10, 11, 12, 22), _POOL + " storage_order", "max_pool reshape",
                  "1-D (as 2-D) or 2-D; the Indices output only to MaxUnpool"),
    "AveragePool": _r(_lift_1d(_pool), (1, 7, 10, 11, 19, 22), _POOL + " count_include_pad", "avg_pool reshape",
                      "1-D (as 2-D) or 2-D; dilations 1"),
    "GlobalAveragePool": _r(_lift_1d(_global_avg_pool), (1, 22), "", "global_avg_pool reshape",
                            "1-D (as 2-D) or 2-D"),
    "GlobalMaxPool": _r(_lift_1d(_global_max_pool), (1, 22), "", "max_pool reshape", "1-D (as 2-D) or 2-D"),
    "ReduceMean": _r(_reduce, (1, 11, 13, 18), "axes keepdims noop_with_empty_axes", "mean global_avg_pool",
                     "constant axes; over H, W of (N, C, H, W): global_avg_pool"),
    "ReduceSum": _r(_reduce, (1, 11, 13), "axes keepdims noop_with_empty_axes", "sum", "constant axes"),
    "Col2Im": _r(_col2im, (18,), "dilations pads strides", "reshape slice pad add",
                 "2-D; constant image_shape and block_shape"),
    "CumSum": _r(_cumsum, (11, 14), "exclusive reverse", "cumsum", "a constant axis; float64 accumulation"),
    "Mod": _r(_mod, (10, 13, 28), "fmod", "activation(fmod) activation(remainder)",
              "a float tensor by a one-value constant; fmod=0 from version 28"),
    "TopK": _r(_topk, (1, 10, 11, 24), "axis k largest sorted", "slice where concat",
               "the Values by a sorting network (an axis of up to 64 values); the Indices output refused where read"),
    "ArgMax": _r(_arg_extreme, (1, 11, 12, 13), "axis keepdims select_last_index", "argmax",
                 "an int64 result: moved, compared, Cast, or returned (as int64)"),
    "ArgMin": _r(_arg_extreme, (1, 11, 12, 13), "axis keepdims select_last_index", "argmax",
                 "an int64 result: moved, compared, Cast, or returned (as int64)"),
    "ReduceMax": _r(_reduce, (1, 11, 12, 13, 18, 20), "axes keepdims noop_with_empty_axes", "max",
                    "constant axes; float tensors"),
    "ReduceMin": _r(_reduce, (1, 11, 12, 13, 18, 20), "axes keepdims noop_with_empty_axes", "max mul",
                    "constant axes; float tensors; as -max(-x)"),
    "ReduceL1": _r(_reduce, (1, 11, 13, 18), "axes keepdims noop_with_empty_axes", "activation(abs) sum",
                   "constant axes"),
    "ReduceL2": _r(_reduce, (1, 11, 13, 18), "axes keepdims noop_with_empty_axes", "mul sum activation(sqrt)",
                   "constant axes"),
    "ReduceSumSquare": _r(_reduce, (1, 11, 13, 18), "axes keepdims noop_with_empty_axes", "mul sum",
                          "constant axes"),
    "AffineGrid": _r(_affine_grid, (20,), "align_corners", "matmul permute reshape",
                     "2-D: a computed theta (N, 2, 3), a constant size"),
    "GatherElements": _r(_gather_elements, (11, 13), "axis", "reshape slice concat take",
                         "constant indices (runs of the flattened data), or 1-D data at an integer input's values"),
    "MaxUnpool": _r(_max_unpool, (9, 11, 22), "kernel_shape strides pads",
                    "slice where concat pixel_shuffle reshape permute pad",
                    "2-D; I the Indices of a MaxPool in the graph whose windows do not overlap, output its input's "
                    "H, W (or the dynamo exporter's ScatterND form of max_unpool2d)"),
    "ScatterND": _r(_scatter_nd, (11, 13, 16, 18), "reduction", "reshape slice concat pad",
                    "constant indices (a slice assignment: up to 256 runs of positions, or a strided box), reduction "
                    "none, each position written once"),
    "ScatterElements": _r(_scatter_elements, (11, 13, 16, 18), "axis reduction", "reshape slice concat",
                          "constant indices, reduction none, each position written once"),
    "GridSample": _r(_grid_sample, (16, 20, 22), "align_corners mode padding_mode", "grid_sample",
                     "4-D input; bilinear / linear, nearest, bicubic / cubic"),
    "Upsample": _r(_upsample, (7, 9), "mode scales", "resize",
                   "H, W of (N, C, H, W); nearest or linear; asymmetric coordinates, ONNX Runtime's legacy nearest "
                   "pixel (truncated enlarging, rounded up shrinking)"),
    "Resize": _r(_upsample, (10, 11, 13, 18, 19), _RESIZE, "resize matmul mul",
                 "H, W of (N, C, H, W); nearest, linear or cubic; antialiased linear / cubic as a matmul by "
                 "the reference's weights per resized axis; half_pixel, "
                 "pytorch_half_pixel, align_corners, "
                 "asymmetric; ONNX Runtime's coordinate order (dst / (out / in): `arith=\"onnx\"`), and its round "
                 "modes, which take a source within 1e-6 of a half as the half; opset 10 as Upsample"),
    # linear algebra
    "Gemm": _r(_gemm, (7, 9, 11, 13), "alpha beta transA transB", "linear add permute", "constant B and C"),
    "Einsum": _r(_einsum, (12, 28), "equation", "matmul permute reshape sum",
                 "two operands, letter labels, no ellipsis or repeated label"),
    "MatMul": _r(_matmul, (1, 9, 13), "", "linear matmul",
                 "(..., K) by a constant 2-D (K, M): linear; else matmul (1-D as np.matmul; not two 1-D)"),
    # element-wise
    "Add": _r(_elementwise, _EW, "", "add scale linear", "NumPy broadcasting"),
    "Sub": _r(_elementwise, _EW, "", "sub scale", "NumPy broadcasting"),
    "Mul": _r(_elementwise, _EW, "", "mul scale activation(silu)", "NumPy broadcasting"),
    "Div": _r(_elementwise, _EW, "", "div", "NumPy broadcasting"),
    "Sum": _r(_variadic_sum, (8, 13), "", "add", "NumPy broadcasting"),
    "Mean": _r(_variadic_sum, (8, 13), "", "add div", "NumPy broadcasting"),
    "Neg": _r(_neg, (6, 13), "", "mul", "as x * -1"),
    "Reciprocal": _r(_reciprocal, (6, 13), "", "div", "as 1 / x"),
    "Pow": _r(_pow, (7, 12, 13, 15), "", "mul div activation(sqrt) activation(pow) activation(base_pow)",
              "a constant exponent of one value, or a constant base > 0 of one value"),
    "Abs": _r(_activation("abs"), (6, 13), "", "activation(abs)"),
    "Exp": _r(_activation("exp"), (6, 13), "", "activation(exp)"),
    "Erf": _r(_activation("erf"), (9, 13), "", "activation(erf)"),
    "Floor": _r(_activation("floor"), (6, 13), "", "activation(floor)"),
    "Ceil": _r(_activation("ceil"), (6, 13), "", "activation(ceil)"),
    "Round": _r(_activation("round"), (11, 22), "", "activation(round)", "halves to even"),
    "Sin": _r(_activation("sin"), (7, 22), "", "activation(sin)"),
    "Cos": _r(_activation("cos"), (7, 22), "", "activation(cos)"),
    "Tan": _r(_activation("tan"), (7, 22), "", "activation(tan)"),
    "Asin": _r(_activation("asin"), (7, 22), "", "activation(asin)"),
    "Acos": _r(_activation("acos"), (7, 22), "", "activation(acos)"),
    "Atan": _r(_activation("atan"), (7, 22), "", "activation(atan)"),
    "Sinh": _r(_activation("sinh"), (9, 22), "", "activation(sinh)"),
    "Cosh": _r(_activation("cosh"), (9, 22), "", "activation(cosh)"),
    "Asinh": _r(_activation("asinh"), (9, 22), "", "activation(asinh)"),
    "Acosh": _r(_activation("acosh"), (9, 22), "", "activation(acosh)"),
    "Atanh": _r(_activation("atanh"), (9, 22), "", "activation(atanh)"),
    "Log": _r(_activation("log"), (6, 13), "", "activation(log)"),
    "Sqrt": _r(_activation("sqrt"), (6, 13), "", "activation(sqrt)"),
    "Celu": _r(_activation("celu", alpha=("alpha", 1.0)), (12, 28), "alpha", "activation(celu)", "alpha > 0"),
    "Selu": _r(_selu, (6, 22), "alpha gamma", "activation(selu) activation(elu) mul"),
    "Softsign": _r(_softsign, (1, 22), "", "activation(abs) add div", "as x / (1 + abs(x))"),
    "Max": _r(_max_min, (8, 12, 13), "", "activation(clip) relu maximum",
              "float tensors; one tensor and scalar constants: a clip"),
    "Min": _r(_max_min, (8, 12, 13), "", "activation(clip) minimum",
              "float tensors; one tensor and scalar constants: a clip"),
    "Relu": _r(_relu, (1, 6, 13, 14), "", "relu"),
    "Clip": _r(_clip, (6, 11, 12, 13), "min max", "activation(clip) relu", "constant min and max"),
    "Sigmoid": _r(_activation("sigmoid"), (6, 13), "", "activation(sigmoid)"),
    "HardSigmoid": _r(_activation("hardsigmoid", alpha=("alpha", 0.2), beta=("beta", 0.5)), (6, 22),
                      "alpha beta", "activation(hardsigmoid)"),
    "HardSwish": _r(_activation("hardswish"), (14, 22), "", "activation(hardswish)"),
    "LeakyRelu": _r(_activation("leaky_relu", negative_slope=("alpha", 0.01)), (6, 16), "alpha",
                    "activation(leaky_relu)"),
    "Elu": _r(_activation("elu", alpha=("alpha", 1.0)), (6, 22), "alpha", "activation(elu)"),
    "Tanh": _r(_activation("tanh"), (6, 13), "", "activation(tanh)"),
    "Mish": _r(_activation("mish"), (18, 22), "", "activation(mish)"),
    "Softplus": _r(_activation("softplus", threshold=("threshold", float("inf"))), (1, 22), "",
                   "activation(softplus)"),
    "Gelu": _r(_gelu, (20,), "approximate", "activation(gelu) activation(gelu_tanh)"),
    "PRelu": _r(_prelu, (7, 9, 16), "", "prelu relu sub mul add",
                 "a constant slope; per channel: prelu, other shapes: relu(x) + slope * (x - relu(x))"),
    "Softmax": _r(_softmax, (1, 11, 13), "axis", "softmax reshape",
                  "before opset 13: the 2-D rule, as reshape -> softmax -> reshape"),
    "LogSoftmax": _r(_softmax, (1, 11, 13), "axis", "max sub activation(exp) sum activation(log) reshape",
                     "as x - m - ln sum e^(x - m); before opset 13 the 2-D rule"),
    "LpNormalization": _r(_lp_normalization, (1, 22), "axis p",
                          "mul activation(abs) sum activation(sqrt) activation(clip) div",
                          "p 1 or 2; 0 where the norm is 0 (a subnormal norm divides by 2^-126)"),
    "Dropout": _r(_dropout, (7, 10, 12, 13, 22), "ratio seed", "-",
                  "inference: the identity; training_mode=True and the mask output are refused, so are a ratio "
                  "other than a float scalar and a training_mode other than a bool scalar (an invalid file)"),
    "Identity": _r(_identity, (1, 13, 14, 16, 19, 21, 23, 24, 25), "", "-", "tensors"),
    "Cast": _r(_cast, (6, 9, 13, 19, 21, 23, 24, 25, 28), "to saturate round_mode", "-",
               "computed tensors: to their own dtype (the identity); constants: folded"),
    "CastLike": _r(_cast, (15, 19, 21, 23, 24, 25), "saturate round_mode", "-",
                   "computed tensors: to their own dtype (the identity); constants: folded"),
    # movement
    "Flatten": _r(_flatten, (1, 9, 11, 13, 21, 23, 24, 25), "axis", "flatten reshape"),
    "Reshape": _r(_reshape, (5, 13, 14, 19, 21, 23, 24, 25), "allowzero", "reshape flatten", "constant shape"),
    "Squeeze": _r(_squeeze, (1, 11, 13, 21, 23, 24, 25), "axes", "reshape", "constant axes"),
    "Unsqueeze": _r(_unsqueeze, (1, 11, 13, 21, 23, 24, 25), "axes", "reshape", "constant axes"),
    "Transpose": _r(_transpose, (1, 13, 21, 23, 24, 25), "perm", "permute"),
    "Slice": _r(_slice, (1, 10, 11, 13), "starts ends axes", "slice", "constant starts/ends/axes/steps"),
    "Gather": _r(_gather, (1, 11, 13), "axis", "slice reshape concat",
                  "constant indices forming at most 256 runs of evenly spaced values"),
    "Greater": _r(_comparison, (7, 9, 13), "", "-", "read by Where, Not or a Cast to float"),
    "GreaterOrEqual": _r(_comparison, (12, 16), "", "-", "read by Where, Not or a Cast to float"),
    "Less": _r(_comparison, (7, 9, 13), "", "-", "read by Where, Not or a Cast to float"),
    "LessOrEqual": _r(_comparison, (12, 16), "", "-", "read by Where, Not or a Cast to float"),
    "Equal": _r(_comparison, (7, 11, 13, 19), "", "-", "read by Where, Not or a Cast to float"),
    "Not": _r(_logical, (1,), "", "-", "of comparisons"),
    "And": _r(_logical, (7,), "", "-", "of comparisons"),
    "Or": _r(_logical, (7,), "", "-", "of comparisons"),
    "Sign": _r(_sign, (9, 13), "", "where"),
    "IsNaN": _r(_is_nan_inf, (9, 13, 20), "", "-", "read by Where, Not or a Cast to float (x != x)"),
    "IsInf": _r(_is_nan_inf, (10, 20), "detect_negative detect_positive", "activation(abs)",
                "read by Where, Not or a Cast to float (against the largest finite value)"),
    "Shrink": _r(_shrink, (9,), "bias lambd", "where add sub"),
    "ThresholdedRelu": _r(_thresholded_relu, (10, 22), "alpha", "where"),
    "Where": _r(_where, (9, 16), "", "where",
                "the condition a comparison of computed tensors (or its Not) or a constant; X, Y not both constant"),
    "GatherND": _r(_gather_nd, (11, 12, 13), "batch_dims", "slice reshape concat",
                   "constant indices forming at most 256 runs of evenly spaced positions; batch_dims 0"),
    "Split": _r(_split, (2, 11, 13, 18), "axis split num_outputs", "slice", "constant split"),
    "Concat": _r(_concat, (4, 11, 13), "axis", "concat"),
    "SplitToSequence": _r(_split_to_sequence, (11, 24), "axis keepdims", "slice reshape",
                          "split a constant; the sequence read by SequenceAt / ConcatFromSequence"),
    "SequenceAt": _r(_sequence_at, (11,), "", "", "a constant position"),
    "SequenceConstruct": _r(_sequence_construct, (11,), "", "", "read by SequenceAt / ConcatFromSequence"),
    "ConcatFromSequence": _r(_concat_from_sequence, (11,), "axis new_axis", "concat reshape", ""),
    "Pad": _r(_pad, (2, 11, 13, 18, 19, 21, 23, 24, 25), "mode pads value", "pad slice concat",
              "constant pads (a negative pad crops); constant, reflect, edge, wrap"),
    "Expand": _r(_expand, (8, 13), "", "mul", "constant shape; as x * ones over the expanded axes"),
    "Tile": _r(_tile, (6, 13), "", "concat", "constant repeats, up to 64 per axis"),
    "DepthToSpace": _r(_depth_space, (11, 13, 28), "blocksize mode", "pixel_shuffle", "DCR and CRD"),
    "SpaceToDepth": _r(_depth_space, (1, 13, 28), "blocksize", "pixel_shuffle", "inverse=True (DCR's order)"),
}
"""ONNX op type -> Rule; the importer's vocabulary (constant-only nodes go to fold.FOLD)."""
