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

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ...errors import GraphError, UnsupportedOpError
from ...ir import Network
from ...ir.node import DataNode
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


@dataclass
class Ctx:
    """Import state: the network being built, computed tensors and folded constants by ONNX name."""
    net: Network
    env: dict[str, DataNode] = field(default_factory=dict)
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    used_names: set[str] = field(default_factory=set)
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

    def const_node(self, name: str, arr: np.ndarray, dtype) -> DataNode:
        """A constant operand as a DataNode (shared when the same array is used again)."""
        arr = np.ascontiguousarray(arr, dtype=dtype)
        key = (name, arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._const_nodes:
            self._const_nodes[key] = self.net.constant(self.fresh(name), arr, dtype)
        return self._const_nodes[key]

    def operand(self, nd: OnnxNode, i: int, dtype, role: str = "input") -> DataNode:
        """Input i as a DataNode, computed or constant."""
        if self.is_const(nd, i):
            return self.const_node(nd.inputs[i], self.consts[nd.inputs[i]], dtype)
        return self.computed(nd, i, role)


def _float_array(nd, a: np.ndarray, role: str) -> np.ndarray:
    if a.dtype.kind not in "fiu":
        raise nd.refuse(f"{role} has dtype {a.dtype}; expected a numeric tensor")
    return a


# ----------------------------------------------------------------------------- shared helpers

def _spatial(nd: OnnxNode, x: DataNode, what: str = "input") -> None:
    if len(x.shape) != 4:
        raise nd.refuse(f"{what} '{x.name}' has shape {x.shape}; tilefuse implements the 2-D form, "
                        f"expected a 4-D (N, C, H, W) tensor")


def _hw(nd: OnnxNode, a: dict, key: str, default) -> tuple[int, int]:
    v = list(a.get(key, default))
    if len(v) != 2:
        raise nd.refuse(f"attribute {key}={v}; expected 2 values (H, W) for a 2-D op")
    return int(v[0]), int(v[1])


def _pads(nd: OnnxNode, a: dict, x: DataNode, kernel, strides, dilations) -> tuple[int, int, int, int]:
    """ONNX pads / auto_pad -> tilefuse (top, bottom, left, right)."""
    auto = a.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
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


def _per_channel(nd: OnnxNode, c: np.ndarray, x: DataNode) -> np.ndarray | None:
    """c as a (C,) vector when it broadcasts against x only along the channel axis (dim 1), else None."""
    r = len(x.shape)
    if r not in (2, 4) or c.ndim > r:
        return None
    cs = (1,) * (r - c.ndim) + c.shape
    if any(d != 1 for i, d in enumerate(cs) if i != 1) or cs[1] not in (1, x.shape[1]):
        return None
    return np.broadcast_to(c.reshape(-1), (x.shape[1],)) if c.size == 1 else c.reshape(-1)


def _check_training_outputs(nd: OnnxNode, used: set[str], keep: int, what: str) -> None:
    for i, t in enumerate(nd.outputs[keep:], keep):
        if t and t in used:
            raise nd.refuse(f"output {i} '{t}' ({what}) is used; tilefuse imports inference graphs and "
                            f"produces only output 0")


# ----------------------------------------------------------------------------- converters
# Each takes (ctx, node, used) and returns the DataNode(s) of the node's outputs, in order.

def _conv(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0)
    _spatial(nd, x)
    w = _float_array(nd, cx.const(nd, 1, "weight W"), "weight W")
    if w.ndim != 4:
        raise nd.refuse(f"weight W has shape {w.shape}; expected (M, C/group, kH, kW)")
    a = nd.attrs
    k = _hw(nd, a, "kernel_shape", w.shape[2:])
    if k != w.shape[2:]:
        raise GraphError(nd.where, f"kernel_shape={list(k)} disagrees with weight W of shape {w.shape}")
    s, d = _hw(nd, a, "strides", (1, 1)), _hw(nd, a, "dilations", (1, 1))
    wn = cx.const_node(nd.inputs[1], w, x.dtype)
    b = cx.const(nd, 2, "bias B")
    bn = cx.const_node(nd.inputs[2], b, x.dtype) if b is not None else None
    return cx.net.conv2d(x, wn, bn, stride=s, padding=_pads(nd, a, x, k, s, d), dilation=d,
                         groups=int(a.get("group", 1)), name=cx.fresh(nd.name))


def _batch_norm(cx: Ctx, nd: OnnxNode, used):
    a = nd.attrs
    if a.get("training_mode", 0):
        raise nd.refuse("training_mode=1 normalizes with the batch statistics; tilefuse imports "
                        "inference graphs, expected training_mode=0")
    if nd.version < 14 and sum(1 for t in nd.outputs[1:] if t) > 0:
        raise nd.refuse(f"outputs {list(nd.outputs)}: before opset 14 extra outputs (mean, var, saved "
                        f"statistics) mean training mode; expected the single output Y (test mode)")
    if a.get("spatial", 1) != 1:
        raise nd.refuse("spatial=0 (per-activation statistics); expected spatial=1")
    _check_training_outputs(nd, used, 1, "running statistics")
    x = cx.computed(nd, 0)
    if len(x.shape) not in (2, 4):
        raise nd.refuse(f"input '{x.name}' has shape {x.shape}; expected (N, C) or (N, C, H, W)")
    params = [cx.const_node(nd.inputs[i], _float_array(nd, cx.const(nd, i, r), r), x.dtype)
              for i, r in ((1, "scale"), (2, "B"), (3, "input_mean"), (4, "input_var"))]
    return cx.net.batch_norm(x, *params, eps=a.get("epsilon", 1e-5), name=cx.fresh(nd.name))


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
        _check_training_outputs(nd, used, 1, "Indices")
        return cx.net.max_pool(x, k, s, pad, dilation=d, ceil_mode=ceil, name=name)
    if d != (1, 1):
        raise nd.refuse(f"dilations={list(d)}; tilefuse's avg_pool has no dilation, expected [1, 1]")
    return cx.net.avg_pool(x, k, s, pad, ceil_mode=ceil, count_include_pad=bool(a.get("count_include_pad", 0)),
                           name=name)


def _global_avg_pool(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0)
    _spatial(nd, x)
    return cx.net.global_avg_pool(x, name=cx.fresh(nd.name))


def _reduce_mean(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0)
    a = nd.attrs
    axes = fold.axes_input(nd, [None] + [cx.const(nd, 1, "axes")], a, 1, 18)
    if not axes:
        if nd.version >= 18 and a.get("noop_with_empty_axes", 0):
            raise nd.refuse("noop_with_empty_axes=1 with no axes passes the input through; expected axes")
        axes = list(range(len(x.shape)))
    r = len(x.shape)
    ax = sorted({fold._axis(nd, v, r, "axes") for v in axes})
    if r != 4 or ax != [2, 3]:
        raise nd.refuse(f"mean over axes {ax} of a rank-{r} tensor; tilefuse implements the mean over H, W "
                        f"of an (N, C, H, W) tensor (axes [2, 3])")
    keep = a.get("keepdims", 1)
    name = cx.fresh(nd.name)
    y = cx.net.global_avg_pool(x, name=name if keep else cx.fresh(nd.name + ".pool"))
    return y if keep else cx.net.flatten(y, 1, name=name)       # (N, C, 1, 1) -> (N, C)


def _gemm(cx: Ctx, nd: OnnxNode, used):
    a = nd.attrs
    x = cx.computed(nd, 0, "A")
    if len(x.shape) != 2:
        raise GraphError(nd.where, f"A '{x.name}' has shape {x.shape}; expected a 2-D matrix")
    if a.get("transA", 0):
        raise nd.refuse("transA=1 with a computed A; expected transA=0")
    b = _float_array(nd, cx.const(nd, 1, "B"), "B")
    if b.ndim != 2:
        raise GraphError(nd.where, f"B has shape {b.shape}; expected a 2-D matrix")
    # linear wants weight (out, in): B is (K, N), or (N, K) with transB
    w = (b if a.get("transB", 0) else b.T) * np.asarray(a.get("alpha", 1.0), b.dtype)
    if w.shape[1] != x.shape[1]:
        raise GraphError(nd.where, f"A {x.shape} and B {b.shape} (transB={a.get('transB', 0)}) do not "
                                   f"multiply")
    c = cx.const(nd, 2, "C")
    bias = None
    if c is not None:
        n = w.shape[0]
        if c.size == 1 or c.shape in ((n,), (1, n)):
            bias = np.broadcast_to(c.reshape(-1), (n,)) * np.asarray(a.get("beta", 1.0), c.dtype)
        else:
            raise nd.refuse(f"C has shape {c.shape}; tilefuse's linear takes a bias over the {n} outputs, "
                            f"expected a scalar, ({n},) or (1, {n})")
    name = cx.fresh(nd.name)
    return cx.net.linear(x, cx.const_node(nd.inputs[1] + ".weight", w, x.dtype),
                         None if bias is None else cx.const_node(nd.inputs[2], bias, x.dtype), name=name)


def _matmul(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0, "A")
    b = _float_array(nd, cx.const(nd, 1, "B"), "B")
    if len(x.shape) != 2 or b.ndim != 2:
        raise nd.refuse(f"MatMul of {x.shape} by {b.shape}; tilefuse imports a 2-D (N, K) by a constant "
                        f"(K, M) as a linear layer")
    if b.shape[0] != x.shape[1]:
        raise GraphError(nd.where, f"A {x.shape} and B {b.shape} do not multiply")
    return cx.net.linear(x, cx.const_node(nd.inputs[1] + ".T", b.T, x.dtype), None, name=cx.fresh(nd.name))


def _elementwise(cx: Ctx, nd: OnnxNode, used):
    op = nd.op
    ca, cb = cx.is_const(nd, 0), cx.is_const(nd, 1)
    if not ca and not cb:
        a, b = cx.computed(nd, 0, "A"), cx.computed(nd, 1, "B")
        if op == "Add" and a.shape == b.shape:
            return cx.net.add(a, b, name=cx.fresh(nd.name))
        raise nd.refuse(f"{op} of two computed tensors {a.shape} and {b.shape}; tilefuse implements the "
                        f"sum of two tensors of equal shape")
    x = cx.computed(nd, 1 if ca else 0, "B" if ca else "A")
    c = _float_array(nd, cx.const(nd, 0 if ca else 1, "constant operand"), "constant operand")
    if np.broadcast_shapes(x.shape, c.shape) != x.shape:
        raise nd.refuse(f"{op} of {x.shape} with a constant of shape {c.shape} broadcasts to "
                        f"{np.broadcast_shapes(x.shape, c.shape)}; expected the result to keep {x.shape}")
    if op == "Add" and x.producer is not None and x.producer.op == "linear" \
            and not x.producer.params["has_bias"] and len(x.consumers) == 0 and c.size == x.shape[1] \
            and c.shape in ((x.shape[1],), (1, x.shape[1])):
        # MatMul + Add(bias) -> one linear with bias; the bias-less linear is left without users and
        # the compiler's dead-node pass drops it
        lin = x.producer
        return cx.net.linear(lin.inputs[0], lin.inputs[1],
                             cx.const_node(nd.inputs[0 if ca else 1], c.reshape(-1), x.dtype), name=cx.fresh(nd.name))
    v = _per_channel(nd, c, x)
    if v is None:
        raise nd.refuse(f"{op} of {x.shape} with a constant of shape {c.shape}; tilefuse implements a "
                        f"constant that is a scalar or varies only along the channel axis (dim 1)")
    v = v.astype(np.float64)
    one, zero = np.ones_like(v), np.zeros_like(v)
    if op == "Add":
        alpha, beta = one, v
    elif op == "Sub":
        alpha, beta = (-one, v) if ca else (one, -v)
    elif op == "Mul":
        alpha, beta = v, zero
    elif ca:
        raise nd.refuse("Div of a constant by a computed tensor; expected the computed tensor first")
    elif (v == 0).any():
        raise nd.refuse("Div by a constant containing 0; expected a non-zero divisor")
    else:
        alpha, beta = 1.0 / v, zero
    name = cx.fresh(nd.name)
    return cx.net.scale(x, cx.const_node(name + ".alpha", alpha, x.dtype),
                        cx.const_node(name + ".beta", beta, x.dtype), name=name)


def _flatten(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0)
    r = len(x.shape)
    axis = nd.attrs.get("axis", 1)
    if not -r <= axis <= r:
        raise GraphError(nd.where, f"axis={axis} is out of range for rank {r}; expected {-r} <= axis <= {r}")
    axis = axis + r if axis < 0 else axis
    if axis != 1:
        raise nd.refuse(f"axis={nd.attrs.get('axis', 1)} on {x.shape}; tilefuse flattens to (N, -1), "
                        f"expected axis=1")
    if len(x.shape) < 2:
        raise nd.refuse(f"input {x.shape} has rank {len(x.shape)}; expected rank >= 2")
    return cx.net.flatten(x, 1, name=cx.fresh(nd.name))


def _reshape(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0, "data")
    shape = fold._ints(nd, cx.const(nd, 1, "shape"), "shape")
    tgt = fold.reshape_target(nd, x.shape, shape, bool(nd.attrs.get("allowzero", 0)))
    if len(x.shape) >= 2 and tgt == (x.shape[0], int(np.prod(x.shape[1:]))):
        return cx.net.flatten(x, 1, name=cx.fresh(nd.name))
    raise nd.refuse(f"reshape of {x.shape} to {tgt}; tilefuse implements flattening to (N, -1)")


def _softmax(cx: Ctx, nd: OnnxNode, used):
    x = cx.computed(nd, 0)
    r = len(x.shape)
    axis = fold._axis(nd, nd.attrs.get("axis", -1 if nd.version >= 13 else 1), r)
    if nd.version < 13 and int(np.prod(x.shape[axis + 1:])) != 1:
        # before opset 13 the input is coerced to 2-D: softmax over all dims from `axis` on
        raise nd.refuse(f"axis={axis} on {x.shape}: before opset 13 Softmax normalizes over dims "
                        f"{axis}..{r - 1} together; tilefuse implements this when dims after the axis are 1")
    return cx.net.softmax(x, axis=axis, name=cx.fresh(nd.name))


def _lrn(cx: Ctx, nd: OnnxNode, used):
    a = nd.attrs
    x = cx.computed(nd, 0)
    _spatial(nd, x)
    if "size" not in a:
        raise GraphError(nd.where, "attribute size is missing")
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
        tm = cx.const(nd, 2, "training_mode")
        if tm is not None and bool(np.asarray(tm).reshape(-1)[0]):
            raise nd.refuse("training_mode=True drops values at random; tilefuse imports inference graphs, "
                            "expected training_mode absent or False")
        cx.const(nd, 1, "ratio")
    _check_training_outputs(nd, used, 1, "mask")
    return cx.computed(nd, 0)      # inference: the identity


def _identity(cx: Ctx, nd: OnnxNode, used):
    return cx.computed(nd, 0)


@dataclass(frozen=True)
class Rule:
    convert: Callable                 # (ctx, node, used names) -> DataNode or list of DataNodes
    versions: tuple[int, ...]         # ONNX since_versions implemented
    attrs: frozenset[str]             # attributes read; any other is refused
    ir: tuple[str, ...]               # IR ops emitted
    limits: str = ""                  # what is refused, for docs/ops.md


def _r(fn, versions, attrs, ir, limits=""):
    return Rule(fn, tuple(versions), frozenset(attrs.split()), tuple(ir.split()), limits)


_POOL = "auto_pad ceil_mode dilations kernel_shape pads strides"

RULES: dict[str, Rule] = {
    "Conv": _r(_conv, (1, 11, 22), "auto_pad dilations group kernel_shape pads strides", "conv2d",
               "2-D; constant W and B"),
    "BatchNormalization": _r(_batch_norm, (7, 9, 14, 15), "epsilon momentum spatial training_mode",
                             "batch_norm", "inference (training_mode=0); constant statistics"),
    "Relu": _r(_relu, (1, 6, 13, 14), "", "relu"),
    "MaxPool": _r(_pool, (1, 8, 10, 11, 12, 22), _POOL + " storage_order", "max_pool",
                  "2-D; the Indices output is refused"),
    "AveragePool": _r(_pool, (1, 7, 10, 11, 19, 22), _POOL + " count_include_pad", "avg_pool",
                      "2-D; dilations 1"),
    "GlobalAveragePool": _r(_global_avg_pool, (1, 22), "", "global_avg_pool", "2-D"),
    "ReduceMean": _r(_reduce_mean, (1, 11, 13, 18), "axes keepdims noop_with_empty_axes",
                     "global_avg_pool flatten", "over H, W of (N, C, H, W)"),
    "Gemm": _r(_gemm, (7, 9, 11, 13), "alpha beta transA transB", "linear",
               "constant B and C; transA=0; C a scalar or per output"),
    "MatMul": _r(_matmul, (1, 9, 13), "", "linear", "2-D A by a constant 2-D B"),
    "Add": _r(_elementwise, (7, 13, 14), "", "add scale linear",
              "two tensors of equal shape, or a per-channel/scalar constant"),
    "Sub": _r(_elementwise, (7, 13, 14), "", "scale", "a per-channel/scalar constant"),
    "Mul": _r(_elementwise, (7, 13, 14), "", "scale", "a per-channel/scalar constant"),
    "Div": _r(_elementwise, (7, 13, 14), "", "scale", "by a per-channel/scalar constant"),
    "Flatten": _r(_flatten, (1, 9, 11, 13, 21, 23, 24, 25), "axis", "flatten", "axis=1"),
    "Reshape": _r(_reshape, (5, 13, 14, 19, 21, 23, 24, 25), "allowzero", "flatten",
                  "constant shape; to (N, -1)"),
    "Softmax": _r(_softmax, (1, 11, 13), "axis", "softmax",
                  "before opset 13: when the dims after axis are 1"),
    "LRN": _r(_lrn, (1, 13), "alpha beta bias size", "local_response_norm"),
    "Concat": _r(_concat, (4, 11, 13), "axis", "concat"),
    "Dropout": _r(_dropout, (7, 10, 12, 13, 22), "ratio seed", "-",
                  "inference: the identity; training_mode=True and the mask output are refused"),
    "Identity": _r(_identity, (1, 13, 14, 16, 19, 21, 23, 24, 25), "", "-", "tensors"),
}
"""ONNX op type -> Rule; the importer's vocabulary (constant-only nodes go to fold.FOLD)."""
