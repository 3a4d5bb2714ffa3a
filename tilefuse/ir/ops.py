"""The closed vocabulary of ops, in one place.

Each op has a schema: how its parameters are normalized, how its output shape is inferred
(with errors naming the node), how many FLOPs it does, and its reference kernel. Passes,
lowering, the reference evaluator and the importers all read this table.

Normalized parameter forms (what the rest of tilefuse sees):
  stride, dilation, kernel_size: (h, w) tuples of ints
  padding: (top, bottom, left, right)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import GraphError
from ..kernels import activations as _acts
from ..kernels import reference as ref
from .node import exact_integers

Shape = tuple[int, ...]


# ----------------------------------------------------------------------------- param helpers

def _int(node: str, name: str, v, lo: int | None = None) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise GraphError(node, f"parameter {name}={v!r} must be an integer")
    if lo is not None and v < lo:
        raise GraphError(node, f"parameter {name}={v} must be >= {lo}")
    return int(v)


def pair(node: str, name: str, v, lo: int = 1) -> tuple[int, int]:
    """int or (h, w) -> (h, w)."""
    if isinstance(v, (list, tuple)):
        if len(v) != 2:
            raise GraphError(node, f"parameter {name}={v!r} must be an int or a pair (h, w)")
        return (_int(node, name, v[0], lo), _int(node, name, v[1], lo))
    x = _int(node, name, v, lo)
    return (x, x)


def padding4(node: str, v) -> tuple[int, int, int, int]:
    """int, (ph, pw) or (top, bottom, left, right) -> (top, bottom, left, right)."""
    if isinstance(v, (list, tuple)):
        if len(v) == 2:
            ph, pw = (_int(node, "padding", p, 0) for p in v)
            return (ph, ph, pw, pw)
        if len(v) == 4:
            t, b, l, r = (_int(node, "padding", p, 0) for p in v)
            return (t, b, l, r)
        raise GraphError(node, f"padding={v!r} must be an int, (ph, pw) or (top, bottom, left, right)")
    p = _int(node, "padding", v, 0)
    return (p, p, p, p)


def _expect_rank(node: str, what: str, d, rank: int):
    if len(d.shape) != rank:
        raise GraphError(node, f"{what} '{d.name}' has shape {d.shape} (rank {len(d.shape)}), "
                               f"expected rank {rank}")


def _expect_shape(node: str, what: str, d, shape: Shape):
    if tuple(d.shape) != tuple(shape):
        raise GraphError(node, f"{what} '{d.name}' has shape {d.shape}, expected {tuple(shape)}")


def _expect_same_dtype(node: str, inputs):
    dts = {d.dtype for d in inputs}
    if len(dts) > 1:
        found = ", ".join(f"{d.name}:{d.dtype}" for d in inputs)
        raise GraphError(node, f"inputs have different dtypes ({found}); expected one dtype")


# ----------------------------------------------------------------------------- schemas

@dataclass(frozen=True)
class OpSchema:
    name: str
    group: str                      # one of GROUP_NAMES (the op groups, end of this file)
    inputs: tuple[str, ...]         # input roles, in order (optional ones end with '?')
    normalize: Callable[[str, dict], dict]
    infer: Callable[[str, list, dict], Shape]
    reference: Callable[..., np.ndarray]
    flops: Callable[[list[Shape], Shape, dict], int]

    def input_roles(self, params: dict) -> list[str]:
        """The input roles present for these params (optional roles switched by has_<role>)."""
        roles = []
        for r in self.inputs:
            if r.endswith("?"):
                if params.get("has_" + r[:-1]):
                    roles.append(r[:-1])
            elif r.endswith("*"):
                roles.append(r)
            else:
                roles.append(r)
        return roles


OPS: dict[str, OpSchema] = {}
# input roles that must be constants (the compiler packs them, folds BNs into them, the Trainer trains them): a
# computed one is refused when the op is built. conv2d's weight and bias may be computed (a hypernetwork's,
# CondConv's, a weight standardized by ops the Trainer differentiates): the Trainer runs its conv kernels on them,
# the reference evaluator its conv, and compile lowers such a conv to im2col and a matmul first
# (compiler.passes.lower_computed_convs)
CONSTANT_ROLES = {"conv_transpose2d": ("weight", "bias"), "linear": ("weight", "bias"),
                  "batch_norm": ("gamma", "beta", "mean", "var"), "scale": ("alpha", "beta"), "prelu": ("slope",),
                  "squeeze_excitation": ("w1", "b1", "w2", "b2"), "group_norm": ("gamma", "beta"),
                  "layer_norm": ("gamma", "beta"), "channel_norm": ("gamma", "beta")}
GROUP_NAMES = ("conv", "pool", "global", "norm", "elementwise", "linear", "reduce", "shape", "resize")


def _register(schema: OpSchema):
    if schema.group not in GROUP_NAMES:
        raise ValueError(f"op '{schema.name}': group '{schema.group}', expected one of {GROUP_NAMES}")
    OPS[schema.name] = schema
    return schema


def schema(op: str, where: str = "?") -> OpSchema:
    try:
        return OPS[op]
    except KeyError:
        raise GraphError(where, f"unknown op type '{op}'; known: {', '.join(sorted(OPS))}") from None


def _prod(s) -> int:
    return int(np.prod(s)) if len(s) else 1


# conv2d --------------------------------------------------------------------------------

def act_param(node: str, v) -> tuple[str, float, float]:
    """An activation as (name, alpha, beta) from the shared table (kernels/activations.py).

    Accepts a name ("silu"), (name, {param: value}) or an already normalized (name, alpha, beta)."""
    if isinstance(v, str):
        name, params = v, {}
    elif isinstance(v, (tuple, list)) and len(v) == 2 and isinstance(v[1], dict):
        name, params = v
    elif isinstance(v, (tuple, list)) and len(v) == 3 and isinstance(v[0], str):
        name = v[0]
        pnames = _acts.ACTIVATIONS[name][1] if name in _acts.ACTIVATIONS else ()
        params = {k: x for k, x in zip(pnames, v[1:])}
    else:
        raise GraphError(node, f"activation {v!r} must be a name, (name, params) or (name, alpha, beta)")
    try:
        name, a, b = _acts.normalize(name, params, where=node)
    except ValueError as e:
        raise GraphError(node, str(e).split(": ", 1)[-1]) from None
    if name == "softplus":             # an open threshold is the float32 range: finite, so packages carry it
        a, b = (max(min(v, _F32_MAX), -_F32_MAX) for v in (a, b))
    # clip keeps an infinite bound: clamping it to the float32 range made clip(min=0) of +inf 3.4e38 and
    # Max(x, inf) 3.4e38 (ONNX Runtime and PyTorch: inf); packages carry it (validate.check_bounded)
    if name == "softplus" and not a > 0:
        raise GraphError(node, f"softplus beta={a}; expected beta > 0")
    return name, a, b


_F32_MAX = float(np.finfo(np.float32).max)


IDENTITY_ACT = ("identity", 0.0, 0.0)


def _epilogue_norm(node, p, blocked: bool = False) -> dict:
    """relu / act of a fused epilogue. Normal form: {"relu": bool}, plus "act": (name, alpha, beta)
    only for an activation other than identity and ReLU (so the ops and packages of before issue 9
    keep their form); act "relu" is relu=True."""
    relu = bool(p.get("relu", False))
    act = p.get("act")
    act = (("relu", 0.0, 0.0) if relu else IDENTITY_ACT) if act is None else act_param(node, act)
    if relu and act[0] != "relu":
        raise GraphError(node, f"relu=True with act={act[0]!r}; expected one activation")
    if blocked and not _acts.finite_at_zero(*act):
        # a conv's epilogue writes act(0) into the padded channels of an NCHW16c output, which the next conv
        # multiplies by zero weights: an infinity there would make every output NaN
        raise GraphError(node, f"activation {act[0]} (infinite at 0) in a conv's epilogue; expected it as its "
                               "own activation op (Network.activation), which keeps padded channels 0")
    q = {"relu": act[0] == "relu"}
    if act[0] not in ("identity", "relu"):
        q["act"] = act
    return q


def with_act(params: dict, act) -> dict:
    """`params` of an op with a fused epilogue, its activation replaced by `act` (normal form)."""
    q = {k: v for k, v in params.items() if k not in ("relu", "act")}
    act = tuple(act)
    q["relu"] = act[0] == "relu"
    if act[0] not in ("identity", "relu"):
        q["act"] = act
    return q


def epilogue_act(params: dict) -> tuple[str, float, float]:
    """The activation of an op's fused epilogue (identity when none)."""
    act = params.get("act")
    if act is None:
        return ("relu", 0.0, 0.0) if params.get("relu") else IDENTITY_ACT
    return tuple(act)


def _conv_norm(node, p):
    q = {
        "stride": pair(node, "stride", p.get("stride", 1)),
        "padding": padding4(node, p.get("padding", 0)),
        "dilation": pair(node, "dilation", p.get("dilation", 1)),
        "groups": _int(node, "groups", p.get("groups", 1), 1),
        "has_bias": bool(p.get("has_bias", False)),
        "has_residual": bool(p.get("has_residual", False)),
    }
    if p.get("has_input_scale"):
        q["has_input_scale"] = True
    q.update(_epilogue_norm(node, p, blocked=True))
    if p.get("algorithm") is not None:   # the compiler's annotation (compiler/algorithms.py)
        from ..kernels.conv.select import ALGORITHMS
        alg, known = p["algorithm"], ALGORITHMS + ("reference",)
        if not isinstance(alg, str) or alg not in known:
            raise GraphError(node, f"parameter algorithm={alg!r}; expected one of {known}")
        q["algorithm"] = alg
    return q


def _conv_infer(node, ins, p):
    x, w = ins[0], ins[1]
    _expect_rank(node, "input", x, 4)
    _expect_rank(node, "weight", w, 4)
    _expect_same_dtype(node, ins)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    g = p["groups"]
    if c % g or o % g:
        raise GraphError(node, f"groups={g} must divide input channels {c} and output channels {o}")
    if cg != c // g:
        raise GraphError(node, f"weight '{w.name}' has shape {w.shape}: {cg} input channels per group, "
                               f"expected {c // g} (input has {c} channels, groups={g})")
    ho = ref.conv_out_size(h, kh, p["stride"][0], p["padding"][0], p["padding"][1], p["dilation"][0])
    wo = ref.conv_out_size(wd, kw, p["stride"][1], p["padding"][2], p["padding"][3], p["dilation"][1])
    if ho < 1 or wo < 1:
        raise GraphError(node, f"input {x.shape} with kernel {kh}x{kw}, padding {p['padding']}, "
                               f"dilation {p['dilation']} gives an empty output ({ho}x{wo}); "
                               f"expected the padded input to be at least the dilated kernel")
    i = 2
    if p["has_bias"]:
        _expect_shape(node, "bias", ins[i], (o,))
        i += 1
    if p["has_residual"]:
        _expect_shape(node, "residual", ins[i], (n, o, ho, wo))
        i += 1
    if p.get("has_input_scale"):
        _expect_shape(node, "input_scale", ins[i], (n, c, 1, 1))
    return (n, o, ho, wo)


def _conv_ref(x, w, *rest, stride, padding, dilation, groups, has_bias, has_residual, relu, act=None,
              has_input_scale=False, algorithm=None):
    rest = list(rest)
    b = rest.pop(0) if has_bias else None
    res = rest.pop(0) if has_residual else None
    s = rest.pop(0) if has_input_scale else None
    return ref.conv2d(x, w, b, stride, padding, dilation, groups, residual=res, relu=relu, act=act,
                      input_scale=s)


def _conv_flops(in_shapes, out, p):
    o, cg, kh, kw = in_shapes[1]
    return 2 * _prod(out) * cg * kh * kw


_register(OpSchema("conv2d", "conv", ("x", "weight", "bias?", "residual?", "input_scale?"),
                   _conv_norm, _conv_infer, _conv_ref, _conv_flops))


# batch_norm, scale ------------------------------------------------------------------------

def _channel_params_infer(names):
    def infer(node, ins, p):
        x = ins[0]
        if len(x.shape) not in (2, 4):
            raise GraphError(node, f"input '{x.name}' has shape {x.shape}, expected (N, C) or (N, C, H, W)")
        _expect_same_dtype(node, ins)
        c = x.shape[1]
        for role, d in zip(names, ins[1:]):
            _expect_shape(node, role, d, (c,))
        return tuple(x.shape)
    return infer


def _bn_norm(node, p):
    eps = float(p.get("eps", 1e-5))
    if not eps > 0:
        raise GraphError(node, f"parameter eps={eps} must be > 0")
    return {"eps": eps}


_register(OpSchema("batch_norm", "norm", ("x", "gamma", "beta", "mean", "var"), _bn_norm,
                   _channel_params_infer(("gamma", "beta", "mean", "var")),
                   lambda x, g, b, m, v, eps: ref.batch_norm(x, g, b, m, v, eps),
                   lambda i, o, p: 2 * _prod(o)))
_register(OpSchema("scale", "norm", ("x", "alpha", "beta"), lambda n, p: {},
                   _channel_params_infer(("alpha", "beta")),
                   lambda x, a, b: ref.scale(x, a, b), lambda i, o, p: 2 * _prod(o)))


# elementwise ------------------------------------------------------------------------------

def _same_infer(node, ins, p):
    return tuple(ins[0].shape)


def broadcast_shape(node: str, what: str, a, b) -> Shape:
    """NumPy broadcasting of two data nodes' shapes, or a GraphError naming both."""
    try:
        return tuple(int(d) for d in np.broadcast_shapes(tuple(a.shape), tuple(b.shape)))
    except ValueError:
        raise GraphError(node, f"{what} operands have shapes {a.shape} ('{a.name}') and {b.shape} "
                               f"('{b.name}'); expected shapes that broadcast (NumPy rules: trailing "
                               f"dimensions equal or 1)") from None


def _binary_infer(kind):
    def infer(node, ins, p):
        a, b = ins
        _expect_same_dtype(node, ins)
        return broadcast_shape(node, kind, a, b)
    return infer


_register(OpSchema("relu", "elementwise", ("x",), lambda n, p: {}, _same_infer,
                   lambda x: ref.relu(x), lambda i, o, p: _prod(o)))
# the element-wise binary ops: a (op) b with NumPy broadcasting, then the fused activation (relu or act); maximum /
# minimum as torch.maximum / minimum (a NaN in either operand gives NaN); atan2(a, b) the angle of (b, a) in
# (-pi, pi], as torch.atan2 / np.arctan2
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "atan2")
for _kind in BINARY:
    _register(OpSchema(_kind, "elementwise", ("a", "b"), _epilogue_norm, _binary_infer(_kind),
                       (lambda k: lambda a, b, relu, act=None: ref.binary(k, a, b, relu, act))(_kind),
                       lambda i, o, p: _prod(o)))


# where (l cmp r) a else b: torch.where / ONNX Where of a comparison (Hardshrink, Threshold, masks); the
# comparison is part of the op (the IR has no bool tensors); NaN compares false (ne: true), as IEEE / PyTorch
def _where_norm(node, p):
    cmp = p.get("cmp", "gt")
    if cmp not in ref.COMPARISONS:
        raise GraphError(node, f"parameter cmp={cmp!r}; expected one of {', '.join(ref.COMPARISONS)}")
    return {"cmp": cmp}


def _where_infer(node, ins, p):
    _expect_same_dtype(node, ins)
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*(tuple(d.shape) for d in ins)))
    except ValueError:
        raise GraphError(node, "operands " + ", ".join(f"'{d.name}' {d.shape}" for d in ins) +
                         " (l, r, a, b) do not broadcast") from None


_register(OpSchema("where", "elementwise", ("l", "r", "a", "b"), _where_norm, _where_infer,
                   lambda l, r, a, b, cmp: ref.where(l, r, a, b, cmp), lambda i, o, p: 2 * _prod(o)))


# activations (the shared table of kernels/activations.py), prelu ---------------------------

_ACT_FLOPS = {"identity": 0, "relu": 1, "clip": 2, "leaky_relu": 2, "hardsigmoid": 3, "hardswish": 4,
              "sigmoid": 4, "silu": 5, "elu": 4, "tanh": 4, "gelu": 8, "gelu_tanh": 8, "mish": 7, "softplus": 8,
              "abs": 1, "exp": 8, "log": 12, "sqrt": 1, "rsqrt": 2, "pow": 20, "celu": 9, "selu": 6,
              "log_sigmoid": 9, "erf": 12, "floor": 1, "ceil": 1, "round": 1,
              "sin": 20, "cos": 20}


def _activation_norm(node, p):
    if "act" not in p:
        raise GraphError(node, "activation needs act=(name, alpha, beta) or a name; expected one of "
                               + ", ".join(_acts.ACTIVATIONS))
    return {"act": act_param(node, p["act"])}


_register(OpSchema("activation", "elementwise", ("x",), _activation_norm, _same_infer,
                   lambda x, act: ref.activation(x, act),
                   lambda i, o, p: _ACT_FLOPS.get(p["act"][0], 4) * _prod(o)))


def _prelu_infer(node, ins, p):
    x, s = ins
    _expect_same_dtype(node, ins)
    if len(x.shape) < 2:
        raise GraphError(node, f"input '{x.name}' has shape {x.shape}, expected (N, C, ...)")
    if s.shape not in ((x.shape[1],), (1,)):
        raise GraphError(node, f"slope '{s.name}' has shape {s.shape}, expected ({x.shape[1]},) "
                               f"(one per channel) or (1,)")
    return tuple(x.shape)


_register(OpSchema("prelu", "elementwise", ("x", "slope"), lambda n, p: {}, _prelu_infer,
                   lambda x, s: ref.prelu(x, s), lambda i, o, p: 2 * _prod(o)))


# what one draw of a dropout's training mask covers: an element (nn.Dropout), a channel of one sample (Dropout1d /
# Dropout2d: axes 0 and 1), a sample (stochastic depth, DropPath: axis 0), the whole batch (StochasticDepth "batch")
DROPOUT_MODES = ("element", "channel", "sample", "batch")


def _dropout_norm(node, p):
    prob = float(p.get("p", 0.5))
    if not 0.0 <= prob < 1.0:
        raise GraphError(node, f"parameter p={prob} must be in [0, 1)")
    mode = p.get("mode", "element")
    if mode not in DROPOUT_MODES:
        raise GraphError(node, f"parameter mode={mode!r}; expected one of {', '.join(DROPOUT_MODES)}")
    return {"p": prob} if mode == "element" else {"p": prob, "mode": mode}


_register(OpSchema("dropout", "elementwise", ("x",), _dropout_norm, _same_infer,
                   lambda x, p: ref.dropout(x, p), lambda i, o, p: 0))


# pooling ----------------------------------------------------------------------------------

def _pool_norm_common(node, p):
    k = pair(node, "kernel_size", p.get("kernel_size"))
    s = pair(node, "stride", p.get("stride") if p.get("stride") is not None else k)
    pad = padding4(node, p.get("padding", 0))
    if max(pad[0], pad[1]) > k[0] // 2 or max(pad[2], pad[3]) > k[1] // 2:
        raise GraphError(node, f"padding {pad} must be at most half the kernel size {k}")
    return {"kernel_size": k, "stride": s, "padding": pad, "ceil_mode": bool(p.get("ceil_mode", False))}


def _maxpool_norm(node, p):
    q = _pool_norm_common(node, p)
    q["dilation"] = pair(node, "dilation", p.get("dilation", 1))
    return q


def _avgpool_norm(node, p):
    q = _pool_norm_common(node, p)
    q["count_include_pad"] = bool(p.get("count_include_pad", True))
    return q


def _pool_infer(node, ins, p):
    x = ins[0]
    _expect_rank(node, "input", x, 4)
    n, c, h, w = x.shape
    d = p.get("dilation", (1, 1))
    ek = (d[0] * (p["kernel_size"][0] - 1) + 1, d[1] * (p["kernel_size"][1] - 1) + 1)
    pad = p["padding"]
    ho = ref.pool_out_size(h, ek[0], p["stride"][0], pad[0], pad[1], p["ceil_mode"])
    wo = ref.pool_out_size(w, ek[1], p["stride"][1], pad[2], pad[3], p["ceil_mode"])
    if ho < 1 or wo < 1:
        raise GraphError(node, f"input {x.shape} is smaller than the pooling window {p['kernel_size']} "
                               f"with padding {pad}; expected H and W of at least the window")
    return (n, c, ho, wo)


_register(OpSchema("max_pool", "pool", ("x",), _maxpool_norm, _pool_infer,
                   lambda x, **p: ref.max_pool(x, **p),
                   lambda i, o, p: _prod(o) * p["kernel_size"][0] * p["kernel_size"][1]))
_register(OpSchema("avg_pool", "pool", ("x",), _avgpool_norm, _pool_infer,
                   lambda x, **p: ref.avg_pool(x, **p),
                   lambda i, o, p: _prod(o) * p["kernel_size"][0] * p["kernel_size"][1]))


def _gap_infer(node, ins, p):
    x = ins[0]
    _expect_rank(node, "input", x, 4)
    return (x.shape[0], x.shape[1], 1, 1)


_register(OpSchema("global_avg_pool", "global", ("x",), lambda n, p: {}, _gap_infer,
                   lambda x: ref.global_avg_pool(x), lambda i, o, p: _prod(i[0])))


def _se_norm(node, p):
    return {"act": act_param(node, p.get("act", "identity")), "gate": act_param(node, p.get("gate", "sigmoid"))}


def _se_infer(node, ins, p):
    x, w1, b1, w2, b2 = ins
    _expect_rank(node, "input", x, 4)
    _expect_rank(node, "w1", w1, 4)
    _expect_same_dtype(node, ins)
    n, c = x.shape[:2]
    r = w1.shape[0]
    _expect_shape(node, "w1", w1, (r, c, 1, 1))
    _expect_shape(node, "b1", b1, (r,))
    _expect_shape(node, "w2", w2, (c, r, 1, 1))
    _expect_shape(node, "b2", b2, (c,))
    return (n, c, 1, 1)


# the squeeze-excitation scale in one op (compiler/passes.py fuse_squeeze_scale writes it for
# global_avg_pool -> 1x1 conv (act) -> 1x1 conv (gate)); kernel: kernels/squeeze.py
_register(OpSchema("squeeze_excitation", "global", ("x", "w1", "b1", "w2", "b2"), _se_norm, _se_infer,
                   lambda x, w1, b1, w2, b2, act, gate: ref.squeeze_excitation(x, w1, b1, w2, b2, act, gate),
                   lambda i, o, p: _prod(i[0]) + 4 * i[0][0] * _prod(i[1])))


# linear, softmax, lrn ------------------------------------------------------------------------

def _linear_norm(node, p):
    return {"has_bias": bool(p.get("has_bias", False)), **_epilogue_norm(node, p)}


def _linear_infer(node, ins, p):
    """(..., K) x (M, K) -> (..., M): a 2-D (N, K) input, or channels-last (N, H, W, K)."""
    x, w = ins[0], ins[1]
    if len(x.shape) < 2:
        raise GraphError(node, f"input '{x.name}' has shape {x.shape}, expected rank >= 2 (..., in_features)")
    _expect_rank(node, "weight", w, 2)
    _expect_same_dtype(node, ins)
    if w.shape[1] != x.shape[-1]:
        raise GraphError(node, f"weight '{w.name}' has shape {w.shape}, expected (out_features, "
                               f"{x.shape[-1]}) to match input {x.shape}")
    if p["has_bias"]:
        _expect_shape(node, "bias", ins[2], (w.shape[0],))
    return tuple(x.shape[:-1]) + (w.shape[0],)


def _linear_ref(x, w, *rest, has_bias, relu, act=None):
    return ref.linear(x, w, rest[0] if has_bias else None, relu=relu, act=act)


_register(OpSchema("linear", "linear", ("x", "weight", "bias?"), _linear_norm, _linear_infer,
                   _linear_ref, lambda i, o, p: 2 * _prod(o) * i[1][1]))


def _matmul_infer(node, ins, p):
    """(..., M, K) @ (..., K, N) -> (..., M, N), the batch axes broadcast (np.matmul, torch.matmul of rank >= 2)."""
    a, b = ins
    _expect_same_dtype(node, ins)
    for role, d in (("a", a), ("b", b)):
        if len(d.shape) < 2:
            raise GraphError(node, f"{role} '{d.name}' has shape {d.shape}; expected rank >= 2 (..., rows, columns)")
    if a.shape[-1] != b.shape[-2]:
        raise GraphError(node, f"a '{a.name}' {a.shape} and b '{b.name}' {b.shape} do not multiply: "
                               f"{a.shape[-1]} columns against {b.shape[-2]} rows")
    try:
        batch = np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2]))
    except ValueError:
        raise GraphError(node, f"the batch axes of a '{a.name}' {a.shape} and b '{b.name}' {b.shape} do not "
                               f"broadcast") from None
    return tuple(int(d) for d in batch) + (a.shape[-2], b.shape[-1])


# a @ b of two tensors (attention: q @ k^T, attn @ v); a constant right operand of rank 2 is `linear`
_register(OpSchema("matmul", "linear", ("a", "b"), lambda n, p: {}, _matmul_infer,
                   lambda a, b: ref.matmul(a, b), lambda i, o, p: 2 * _prod(o) * i[0][-1]))


def _axis_norm(node, p, default=1):
    return {"axis": _int(node, "axis", p.get("axis", default))}


def _softmax_infer(node, ins, p):
    x = ins[0]
    ax = p["axis"]
    if not -len(x.shape) <= ax < len(x.shape):
        raise GraphError(node, f"axis={ax} is out of range for input shape {x.shape}")
    return tuple(x.shape)


def _softmax_norm(node, p):
    """axis; scale (softmax of x * scale: a scalar multiply before it folded in by the compiler), when not 1."""
    q = _axis_norm(node, p)
    scale = float(p.get("scale", 1.0))
    if not np.isfinite(scale) or scale == 0.0:
        raise GraphError(node, f"parameter scale={scale}; expected a finite non-zero number")
    if scale != 1.0:
        q["scale"] = scale
    return q


_register(OpSchema("softmax", "reduce", ("x",), _softmax_norm, _softmax_infer,
                   lambda x, axis, scale=1.0: ref.softmax(x, axis, scale), lambda i, o, p: 5 * _prod(o)))


def _lrn_norm(node, p):
    return {"size": _int(node, "size", p.get("size"), 1), "alpha": float(p.get("alpha", 1e-4)),
            "beta": float(p.get("beta", 0.75)), "k": float(p.get("k", 1.0))}


def _lrn_infer(node, ins, p):
    x = ins[0]
    if len(x.shape) < 3:
        raise GraphError(node, f"input '{x.name}' has shape {x.shape}, expected (N, C, H, W)")
    return tuple(x.shape)


_register(OpSchema("local_response_norm", "norm", ("x",), _lrn_norm, _lrn_infer,
                   lambda x, **p: ref.local_response_norm(x, **p),
                   lambda i, o, p: (p["size"] + 4) * _prod(o)))


# shape ops --------------------------------------------------------------------------------

def _flatten_norm(node, p):
    return {"start_dim": _int(node, "start_dim", p.get("start_dim", 1), 1)}


def _flatten_infer(node, ins, p):
    x = ins[0]
    sd = p["start_dim"]
    if sd >= len(x.shape):
        raise GraphError(node, f"start_dim={sd} is out of range for input shape {x.shape}")
    return tuple(x.shape[:sd]) + (_prod(x.shape[sd:]),)


_register(OpSchema("flatten", "shape", ("x",), _flatten_norm, _flatten_infer,
                   lambda x, start_dim: ref.flatten(x, start_dim), lambda i, o, p: 0))


def _concat_infer(node, ins, p):
    ax = p["axis"]
    r = len(ins[0].shape)
    if not -r <= ax < r:
        raise GraphError(node, f"axis={ax} is out of range for rank {r}")
    ax %= r
    _expect_same_dtype(node, ins)
    first = ins[0].shape
    for d in ins[1:]:
        if len(d.shape) != r or any(a != b for i, (a, b) in enumerate(zip(first, d.shape)) if i != ax):
            raise GraphError(node, f"concat input '{d.name}' has shape {d.shape}; expected {first} "
                                   f"except along axis {ax}")
    out = list(first)
    out[ax] = sum(d.shape[ax] for d in ins)
    return tuple(out)


_register(OpSchema("concat", "shape", ("x*",), _axis_norm, _concat_infer,
                   lambda *xs, axis: ref.concat(*xs, axis=axis), lambda i, o, p: 0))


# conv_transpose2d --------------------------------------------------------------------------

def _convt_norm(node, p):
    q = {
        "stride": pair(node, "stride", p.get("stride", 1)),
        "padding": padding4(node, p.get("padding", 0)),
        "output_padding": pair(node, "output_padding", p.get("output_padding", 0), lo=0),
        "dilation": pair(node, "dilation", p.get("dilation", 1)),
        "groups": _int(node, "groups", p.get("groups", 1), 1),
        "has_bias": bool(p.get("has_bias", False)),
    }
    q.update(_epilogue_norm(node, p, blocked=True))
    for i in range(2):
        if q["output_padding"][i] >= max(q["stride"][i], q["dilation"][i]):
            raise GraphError(node, f"output_padding={q['output_padding']} must be smaller than stride "
                                   f"{q['stride']} or dilation {q['dilation']} in each dimension")
    return q


def _convt_infer(node, ins, p):
    x, w = ins[0], ins[1]
    _expect_rank(node, "input", x, 4)
    _expect_rank(node, "weight", w, 4)
    _expect_same_dtype(node, ins)
    n, c, h, wd = x.shape
    ci, og, kh, kw = w.shape
    g = p["groups"]
    if ci != c:
        raise GraphError(node, f"weight '{w.name}' has shape {w.shape}: {ci} input channels, expected {c} "
                               f"(transposed conv weights are (C_in, C_out/groups, kh, kw))")
    if c % g:
        raise GraphError(node, f"groups={g} must divide input channels {c}")
    co = og * g
    ho = ref.conv_transpose_out_size(h, kh, p["stride"][0], p["padding"][0], p["padding"][1],
                                     p["dilation"][0], p["output_padding"][0])
    wo = ref.conv_transpose_out_size(wd, kw, p["stride"][1], p["padding"][2], p["padding"][3],
                                     p["dilation"][1], p["output_padding"][1])
    if ho < 1 or wo < 1:
        raise GraphError(node, f"input {x.shape} with kernel {kh}x{kw}, stride {p['stride']}, padding "
                               f"{p['padding']} gives an empty output ({ho}x{wo}); expected padding smaller "
                               f"than the transposed conv's full output")
    if p["has_bias"]:
        _expect_shape(node, "bias", ins[2], (co,))
    return (n, co, ho, wo)


def _convt_ref(x, w, *rest, stride, padding, output_padding, dilation, groups, has_bias, relu, act=None):
    return ref.conv_transpose2d(x, w, rest[0] if has_bias else None, stride, padding, output_padding,
                                dilation, groups, act=act if act is not None else ("relu", 0.0, 0.0) if relu else None)


_register(OpSchema("conv_transpose2d", "conv", ("x", "weight", "bias?"), _convt_norm, _convt_infer,
                   _convt_ref, lambda i, o, p: 2 * _prod(i[0]) * _prod(i[1][1:])))


# reductions ----------------------------------------------------------------------------------

def _axes_norm(node, p, name="axes"):
    v = p.get(name)
    if v is None:
        raise GraphError(node, f"parameter {name} is required (a tuple of axes)")
    v = (v,) if isinstance(v, (int, np.integer)) else tuple(v)
    return tuple(_int(node, name, a) for a in v)


def _resolve_axes(node, axes, rank) -> tuple[int, ...]:
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise GraphError(node, f"axis {a} is out of range for rank {rank}; expected -{rank} <= axis < {rank}")
        out.append(a % rank)
    if len(set(out)) != len(out):
        raise GraphError(node, f"axes {axes} repeat an axis (rank {rank})")
    return tuple(sorted(out))


def _reduce_norm(node, p):
    return {"axes": _axes_norm(node, p), "keepdim": bool(p.get("keepdim", False))}


def _reduce_infer(node, ins, p):
    x = ins[0]
    axes = _resolve_axes(node, p["axes"], len(x.shape))
    if not axes:
        raise GraphError(node, "axes=() reduces nothing; expected at least one axis")
    out = ref._reduced_shape(x.shape, axes, p["keepdim"])
    if not out:
        raise GraphError(node, f"reducing every axis of {x.shape} without keepdim gives a scalar; "
                               f"expected keepdim=True or fewer axes")
    return out


for _kind in ("mean", "sum", "max"):
    _register(OpSchema(_kind, "reduce", ("x",), _reduce_norm, _reduce_infer,
                       (lambda k: lambda x, axes, keepdim: ref.reduce(
                           k, x, tuple(a % x.ndim for a in axes), keepdim))(_kind),
                       lambda i, o, p: _prod(i[0])))


def _argmax_norm(node, p):
    return {"axis": _int(node, "axis", p.get("axis", 0)), "keepdim": bool(p.get("keepdim", False)),
            "largest": bool(p.get("largest", True)), "select_last": bool(p.get("select_last", False))}


def _argmax_infer(node, ins, p):
    x = ins[0]
    (axis,) = _resolve_axes(node, (p["axis"],), len(x.shape))
    if x.shape[axis] > exact_integers(x.dtype):
        raise GraphError(node, f"argmax along axis {axis} of {x.shape}: indices up to {x.shape[axis] - 1} are not "
                               f"exact in {np.dtype(x.dtype)}; expected at most {exact_integers(x.dtype)} values")
    out = ref._reduced_shape(x.shape, (axis,), p["keepdim"])
    if not out:
        raise GraphError(node, f"argmax of the 1-D {x.shape} without keepdim gives a scalar; expected keepdim=True")
    return out


# out = the index along axis of the largest value (largest=False: the smallest) as a float of x's dtype (exact:
# at most 2^24 values for float32); ties: the first (select_last: the last); NaN counts as the extreme. Its
# outputs are integers: a network output of it is declared `Network.output(..., integer=np.int64)` and a run
# returns that dtype (torch.argmax / argmin, max(dim)'s indices, ONNX ArgMax / ArgMin)
_register(OpSchema("argmax", "reduce", ("x",), _argmax_norm, _argmax_infer,
                   lambda x, **p: ref.argmax(x, **p), lambda i, o, p: _prod(i[0])))


def _cumsum_norm(node, p):
    return {"axis": _int(node, "axis", p.get("axis", 0)), "exclusive": bool(p.get("exclusive", False)),
            "reverse": bool(p.get("reverse", False))}


def _cumsum_infer(node, ins, p):
    x = ins[0]
    _resolve_axes(node, (p["axis"],), len(x.shape))
    return tuple(x.shape)


# out[..., i, ...] = the sum of x along axis up to i (exclusive: before i; reverse: from the end), accumulated in
# float64 (PyTorch's CPU cumsum and ONNX Runtime's CumSum of float32 accumulate wider): torch.cumsum, ONNX CumSum;
# its gradient is the cumsum of dy the other way (kernels/reference.py cumsum)
_register(OpSchema("cumsum", "reduce", ("x",), _cumsum_norm, _cumsum_infer,
                   lambda x, **p: ref.cumsum(x, **p), lambda i, o, p: _prod(i[0])))


# movement: reshape, permute, slice, pad --------------------------------------------------------

def _reshape_norm(node, p):
    shape = p.get("shape")
    if shape is None:
        raise GraphError(node, "parameter shape is required")
    shape = tuple(_int(node, "shape", d) for d in shape)
    if sum(d == -1 for d in shape) > 1 or any(d == 0 or d < -1 for d in shape):
        raise GraphError(node, f"shape={shape} must have positive sizes and at most one -1")
    return {"shape": shape}


def _reshape_infer(node, ins, p):
    x = ins[0]
    total = _prod(x.shape)
    shape = p["shape"]
    known = _prod([d for d in shape if d != -1])
    if -1 in shape:
        if total % known:
            raise GraphError(node, f"cannot reshape {x.shape} ({total} elements) to {shape}; expected a "
                                   f"shape whose known sizes divide {total}")
        shape = tuple(total // known if d == -1 else d for d in shape)
    if _prod(shape) != total:
        raise GraphError(node, f"cannot reshape {x.shape} ({total} elements) to {shape} ({_prod(shape)} "
                               f"elements); expected the same element count")
    return shape


_register(OpSchema("reshape", "shape", ("x",), _reshape_norm, _reshape_infer,
                   lambda x, shape: ref.reshape(x, shape), lambda i, o, p: 0))


def _permute_norm(node, p):
    perm = p.get("perm")
    if perm is None:
        raise GraphError(node, "parameter perm is required")
    perm = tuple(_int(node, "perm", a, 0) for a in perm)
    if sorted(perm) != list(range(len(perm))):
        raise GraphError(node, f"perm={perm} must be a permutation of 0..{len(perm) - 1}")
    return {"perm": perm}


def _permute_infer(node, ins, p):
    x = ins[0]
    if len(p["perm"]) != len(x.shape):
        raise GraphError(node, f"perm={p['perm']} has {len(p['perm'])} axes, input '{x.name}' has shape "
                               f"{x.shape}; expected one axis per dimension")
    return tuple(x.shape[a] for a in p["perm"])


_register(OpSchema("permute", "shape", ("x",), _permute_norm, _permute_infer,
                   lambda x, perm: ref.permute(x, perm), lambda i, o, p: 0))


def _slice_norm(node, p):
    """Python's slice rules along one axis; a negative step reverses (torch.flip, ONNX Slice steps < 0: start -1,
    stop None, step -1 is the whole axis reversed)."""
    step = _int(node, "step", p.get("step", 1))
    if step == 0:
        raise GraphError(node, "parameter step=0; expected a non-zero step (negative: reversed)")
    start = _int(node, "start", p.get("start", 0))
    stop = p.get("stop")
    stop = None if stop is None else _int(node, "stop", stop)
    return {"axis": _int(node, "axis", p.get("axis", 1)), "start": start, "stop": stop, "step": step}


def _slice_infer(node, ins, p):
    x = ins[0]
    (axis,) = _resolve_axes(node, (p["axis"],), len(x.shape))
    n = len(range(*slice(p["start"], p["stop"], p["step"]).indices(x.shape[axis])))
    if n < 1:
        raise GraphError(node, f"slice {p['start']}:{p['stop']}:{p['step']} of axis {axis} (size "
                               f"{x.shape[axis]}) of '{x.name}' is empty; expected at least one element")
    out = list(x.shape)
    out[axis] = n
    return tuple(out)


_register(OpSchema("slice", "shape", ("x",), _slice_norm, _slice_infer,
                   lambda x, axis, start, stop, step: ref.slice_axis(x, axis % x.ndim, start, stop, step),
                   lambda i, o, p: 0))


def _shuffle_norm(node, p):
    start = _int(node, "start", p.get("start", 0), 0)
    stop = p.get("stop")
    return {"groups": _int(node, "groups", p.get("groups"), 1), "start": start,
            "stop": None if stop is None else _int(node, "stop", stop, start + 1)}


def _shuffle_infer(node, ins, p):
    for d in ins:
        _expect_rank(node, "input", d, 4)
    c = _concat_infer(node, ins, {"axis": 1})[1]
    if c % p["groups"]:
        raise GraphError(node, f"channel_shuffle of {[d.shape for d in ins]}: {c} channels do not split into "
                               f"groups={p['groups']}; expected a channel count divisible by the groups")
    stop = c if p["stop"] is None else p["stop"]
    if stop > c:
        raise GraphError(node, f"channel_shuffle channels [{p['start']}, {stop}) of {c}; expected stop <= {c}")
    return (ins[0].shape[0], stop - p["start"]) + tuple(ins[0].shape[2:])


# ShuffleNet's channel shuffle of the concatenation of its inputs along channels, then channels
# [start, stop) of it: shuffled channel c = concatenated channel (c % g) * (C / g) + c // g. torch's
# channel_shuffle, or what model code writes, view (N, g, C/g, H, W) -> transpose(1, 2) -> view
# (N, C, H, W) (compiler/passes.py canonicalize recognizes it, fuse_channel_shuffle takes in the
# concat before it and the channel slices after it)
_register(OpSchema("channel_shuffle", "shape", ("x*",), _shuffle_norm, _shuffle_infer,
                   lambda *xs, groups, start, stop: ref.channel_shuffle(xs, groups, start, stop),
                   lambda i, o, p: 0))


def _pixel_shuffle_norm(node, p):
    mode, inverse = p.get("mode", "crd"), p.get("inverse", False)
    if mode not in ("crd", "dcr"):
        raise GraphError(node, f"pixel_shuffle mode={mode!r}; expected 'crd' (PyTorch's order, ONNX's CRD) or 'dcr' "
                               f"(ONNX DepthToSpace's default and SpaceToDepth's order)")
    if not isinstance(inverse, (bool, np.bool_)):
        raise GraphError(node, f"parameter inverse={inverse!r} must be a bool")
    return {"factor": _int(node, "factor", p.get("factor"), 1), "mode": mode, "inverse": bool(inverse)}


def _pixel_shuffle_infer(node, ins, p):
    x = ins[0]
    _expect_rank(node, "input", x, 4)
    n, c, h, w = x.shape
    r = p["factor"]
    if p["inverse"]:
        if h % r or w % r:
            raise GraphError(node, f"pixel_unshuffle by {r} of '{x.name}' {x.shape}: height {h} and width {w} must "
                                   f"be multiples of {r}")
        return (n, c * r * r, h // r, w // r)
    if c % (r * r):
        raise GraphError(node, f"pixel_shuffle by {r} of '{x.name}' {x.shape}: {c} channels; expected a multiple "
                               f"of {r * r}")
    return (n, c // (r * r), h * r, w * r)


# PixelShuffle / DepthToSpace (inverse: PixelUnshuffle / SpaceToDepth) by `factor` r: input channel
# c*r*r + i*r + j ("crd"; "dcr": (i*r + j)*C' + c) is output channel c at row h*r + i, column w*r + j.
# What model code writes as view -> permute -> view (compiler/passes.py canonicalize recognizes it).
# Output row R reads input row R // r (inverse: rows [R*r, R*r + r)): a row-mapped op.
_register(OpSchema("pixel_shuffle", "shape", ("x",), _pixel_shuffle_norm, _pixel_shuffle_infer,
                   lambda x, factor, mode, inverse: ref.pixel_shuffle(x, factor, mode, inverse),
                   lambda i, o, p: 0))


PAD_MODES = ("constant", "reflect", "replicate")


def _pad_norm(node, p):
    pads = p.get("pads")
    if pads is None:
        raise GraphError(node, "parameter pads is required: (before_0, after_0, before_1, after_1, ...)")
    pads = tuple(_int(node, "pads", v, 0) for v in pads)
    mode = {"edge": "replicate"}.get(p.get("mode", "constant"), p.get("mode", "constant"))
    if mode not in PAD_MODES:
        raise GraphError(node, f"pad mode {mode!r} is not supported; expected one of {PAD_MODES}")
    value = float(p.get("value", 0.0))
    if not np.isfinite(value):
        raise GraphError(node, f"pad value {value} must be finite")
    return {"pads": pads, "mode": mode, "value": value}


def _pad_infer(node, ins, p):
    x = ins[0]
    pads = p["pads"]
    if len(pads) != 2 * len(x.shape):
        raise GraphError(node, f"pads={pads} has {len(pads)} values for input shape {x.shape}; expected "
                               f"{2 * len(x.shape)} (before, after per axis)")
    out = []
    for i, d in enumerate(x.shape):
        lo, hi = pads[2 * i], pads[2 * i + 1]
        if p["mode"] == "reflect" and max(lo, hi) >= d:
            raise GraphError(node, f"reflect padding ({lo}, {hi}) of axis {i} needs a larger input: size {d}, "
                                   f"expected padding < {d}")
        out.append(d + lo + hi)
    return tuple(out)


_register(OpSchema("pad", "shape", ("x",), _pad_norm, _pad_infer,
                   lambda x, pads, mode, value: ref.pad(x, pads, mode, value), lambda i, o, p: 0))


# resize -----------------------------------------------------------------------------------

RESIZE_MODES = ("nearest", "linear", "cubic")


def _resize_norm(node, p):
    size = pair(node, "size", p.get("size"))
    scales = p.get("scales")
    if scales is not None:
        scales = tuple(float(v) for v in (scales if isinstance(scales, (tuple, list)) else (scales, scales)))
        if len(scales) != 2 or not all(np.isfinite(v) and v > 0 for v in scales):
            raise GraphError(node, f"scales={p.get('scales')!r} must be two positive numbers (h, w)")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(p.get("mode", "nearest"), p.get("mode", "nearest"))
    if mode not in RESIZE_MODES:
        raise GraphError(node, f"resize mode {mode!r} is not supported; expected one of {RESIZE_MODES}")
    coord = p.get("coord", "asymmetric" if mode == "nearest" else "half_pixel")
    if coord not in ref.RESIZE_COORDS:
        raise GraphError(node, f"coordinate mode {coord!r} is not supported; expected one of {ref.RESIZE_COORDS}")
    nm = p.get("nearest_mode", "floor")
    if nm not in ref.NEAREST_MODES:
        raise GraphError(node, f"nearest_mode {nm!r} is not supported; expected one of {ref.NEAREST_MODES}")
    arith = p.get("arith", "aten")
    if arith not in ref.RESIZE_ARITH:
        raise GraphError(node, f"arith {arith!r} is not supported; expected one of {ref.RESIZE_ARITH}")
    q = {"size": size, "scales": scales, "mode": mode, "coord": coord, "nearest_mode": nm, "arith": arith}
    if mode == "cubic":     # Keys' cubic convolution coefficient (PyTorch's and ONNX's default -0.75)
        q["cubic_a"] = float(p.get("cubic_a", -0.75))
        if not np.isfinite(q["cubic_a"]):
            raise GraphError(node, f"cubic_a={q['cubic_a']}; expected a finite number")
        q["cubic_exclude"] = bool(p.get("cubic_exclude", False))     # ONNX's exclude_outside
    return q


def _resize_infer(node, ins, p):
    x = ins[0]
    _expect_rank(node, "input", x, 4)
    return (x.shape[0], x.shape[1]) + tuple(p["size"])


_register(OpSchema("resize", "resize", ("x",), _resize_norm, _resize_infer,
                   lambda x, **p: ref.resize(x, **p),
                   lambda i, o, p: {"linear": 7, "cubic": 32}.get(p["mode"], 0) * _prod(o)))


def _take_norm(node, p):
    pad = p.get("padding_idx")
    return {"axis": _int(node, "axis", p.get("axis", 0)), "negative": bool(p.get("negative", True)),
            "padding_idx": None if pad is None else _int(node, "padding_idx", pad),
            "scale_grad_by_freq": bool(p.get("scale_grad_by_freq", False))}


def _take_infer(node, ins, p):
    """x (..., N, ...) at indices of any shape along axis -> x.shape[:axis] + indices.shape + x.shape[axis + 1:]."""
    x, i = ins
    _expect_same_dtype(node, ins)
    ax = p["axis"]
    if not -len(x.shape) <= ax < len(x.shape):
        raise GraphError(node, f"axis {ax} of '{x.name}' {x.shape}; expected -{len(x.shape)} <= axis < "
                               f"{len(x.shape)}")
    ax %= len(x.shape)
    return tuple(x.shape[:ax]) + tuple(i.shape) + tuple(x.shape[ax + 1:])


# x's slices at run-time indices (an integer input's values): nn.Embedding, table[t], ONNX Gather at computed indices;
# a run with an index out of range fails naming it (kernels/reference.py take)
_register(OpSchema("take", "shape", ("x", "indices"), _take_norm, _take_infer,
                   lambda x, indices, **p: ref.take(x, indices, **p), lambda i, o, p: 0))


def _grid_sample_norm(node, p):
    mode = {"linear": "bilinear"}.get(p.get("mode", "bilinear"), p.get("mode", "bilinear"))
    if mode not in ref.GRID_MODES:
        raise GraphError(node, f"grid_sample mode {mode!r} is not supported; expected one of {ref.GRID_MODES}")
    pad = p.get("padding_mode", "zeros")
    if pad not in ref.GRID_PADDINGS:
        raise GraphError(node, f"grid_sample padding_mode {pad!r}; expected one of {ref.GRID_PADDINGS}")
    ac = p.get("align_corners", False)
    if not isinstance(ac, (bool, np.bool_)) and ac not in (0, 1):
        raise GraphError(node, f"grid_sample align_corners={ac!r}; expected a bool")
    return {"mode": mode, "padding_mode": pad, "align_corners": bool(ac)}


def _grid_sample_infer(node, ins, p):
    """x (N, C, H, W) sampled at grid (N, Ho, Wo, 2) -> (N, C, Ho, Wo)."""
    x, g = ins
    _expect_same_dtype(node, ins)
    _expect_rank(node, "input", x, 4)
    _expect_rank(node, "grid", g, 4)
    if g.shape[0] != x.shape[0] or g.shape[3] != 2:
        raise GraphError(node, f"grid '{g.name}' has shape {g.shape}; expected ({x.shape[0]}, Ho, Wo, 2) for the "
                               f"input '{x.name}' {x.shape}")
    return (x.shape[0], x.shape[1], g.shape[1], g.shape[2])


# out[n, c, i, j] = x[n, c] at grid[n, i, j] (F.grid_sample, ONNX GridSample: spatial transformers, flow warps)
_register(OpSchema("grid_sample", "resize", ("x", "grid"), _grid_sample_norm, _grid_sample_infer,
                   lambda x, grid, **p: ref.grid_sample(x, grid, **p),
                   lambda i, o, p: (8 if p["mode"] == "bilinear" else 0) * _prod(o) + 10 * _prod(o[2:]) * o[0]))


# normalization over channels, adaptive pooling ----------------------------------------------

def _layer_norm_norm(node, p):
    return {"eps": _bn_norm(node, p)["eps"], "axis": _int(node, "axis", p.get("axis", -1))}


def _channel_norm_norm(node, p):
    mode = p.get("mode", "layer")
    if mode not in ref.CHANNEL_NORM_MODES:
        raise GraphError(node, f"parameter mode={mode!r}; expected one of {', '.join(ref.CHANNEL_NORM_MODES)}")
    if mode == "layer":
        return {**_bn_norm(node, {"eps": p.get("eps", 1e-6)}), "mode": mode}
    eps = float(p.get("eps", 0.0))      # x / ||x|| (eps = 0) is allowed: 0 / 0 is NaN, as PyTorch's
    if not eps >= 0 or eps == float("inf"):
        raise GraphError(node, f"parameter eps={eps} must be finite and >= 0")
    return {"eps": eps, "mode": mode}


def _layer_norm_infer(node, ins, p):
    x, g, b = ins
    _expect_same_dtype(node, ins)
    (axis,) = _resolve_axes(node, (p["axis"],), len(x.shape))
    _expect_shape(node, "gamma", g, x.shape[axis:])
    _expect_shape(node, "beta", b, x.shape[axis:])
    return tuple(x.shape)


def _group_norm_norm(node, p):
    q = {"groups": _int(node, "groups", p.get("groups", 1), 1), "eps": _bn_norm(node, p)["eps"]}
    q.update(_epilogue_norm(node, p))
    return q


def _group_norm_infer(node, ins, p):
    x, g, b = ins
    _expect_same_dtype(node, ins)
    if len(x.shape) < 2:
        raise GraphError(node, f"input '{x.name}' has shape {x.shape}, expected (N, C, ...)")
    c = x.shape[1]
    if c % p["groups"]:
        raise GraphError(node, f"groups={p['groups']} does not divide the {c} channels of input '{x.name}' "
                               f"{x.shape}; expected a divisor of {c}")
    for role, d in (("gamma", g), ("beta", b)):
        _expect_shape(node, role, d, (c,))
    return tuple(x.shape)


# group_norm reads whole planes (a group's statistics): a "global" op for the row-band schedule
_register(OpSchema("group_norm", "global", ("x", "gamma", "beta"), _group_norm_norm, _group_norm_infer,
                   lambda x, g, b, groups, eps, relu, act=None: ref.group_norm(x, g, b, groups, eps, relu, act),
                   lambda i, o, p: 8 * _prod(o)))
_register(OpSchema("layer_norm", "norm", ("x", "gamma", "beta"), _layer_norm_norm, _layer_norm_infer,
                   lambda x, g, b, eps, axis: ref.layer_norm(x, g, b, axis, eps),
                   lambda i, o, p: 8 * _prod(o)))


def _channel_norm_infer(node, ins, p):
    x, g, b = ins
    if len(x.shape) < 2:
        raise GraphError(node, f"input '{x.name}' has shape {x.shape}, expected (N, C, ...)")
    _expect_same_dtype(node, ins)
    _expect_shape(node, "gamma", g, (x.shape[1],))
    _expect_shape(node, "beta", b, (x.shape[1],))
    return tuple(x.shape)


_register(OpSchema("channel_norm", "norm", ("x", "gamma", "beta"), _channel_norm_norm, _channel_norm_infer,
                   lambda x, g, b, eps, mode: ref.channel_norm(x, g, b, eps, mode), lambda i, o, p: 8 * _prod(o)))


def _adaptive_norm(node, p):
    return {"output_size": pair(node, "output_size", p.get("output_size"))}


def _adaptive_infer(node, ins, p):
    x = ins[0]
    _expect_rank(node, "input", x, 4)
    return (x.shape[0], x.shape[1]) + tuple(p["output_size"])


_register(OpSchema("adaptive_avg_pool", "pool", ("x",), _adaptive_norm, _adaptive_infer,
                   lambda x, output_size: ref.adaptive_avg_pool(x, output_size), lambda i, o, p: _prod(i[0])))
# (the importers give sizes that divide the input's to max_pool; this is the rest: SPP's 2x2 bins of 13x13)
_register(OpSchema("adaptive_max_pool", "pool", ("x",), _adaptive_norm, _adaptive_infer,
                   lambda x, output_size: ref.adaptive_max_pool(x, output_size), lambda i, o, p: _prod(i[0])))

# ----------------------------------------------------------------------------- named op groups
# What passes, layouts, streaming and training match on, defined once (tinygrad's GroupOp).
# Every op has one `group` (its schema's field); the family groups below are read from it, so a
# new op joins its family by naming it. The property groups are contracts that code elsewhere
# implements op by op, so an op joins one only when that code handles it.


def ops_in(*groups: str) -> frozenset[str]:
    """The ops whose schema group is one of `groups`."""
    unknown = [g for g in groups if g not in GROUP_NAMES]
    if unknown:
        raise ValueError(f"unknown op group(s) {unknown}; expected one of {GROUP_NAMES}")
    return frozenset(n for n, s in OPS.items() if s.group in groups)


CONV = ops_in("conv")                # convolutions (conv2d, conv_transpose2d)
POOL = ops_in("pool")                # windowed pooling (max_pool, avg_pool, adaptive_avg_pool)
GLOBAL = ops_in("global")            # whole-plane reductions (global_avg_pool, squeeze_excitation)
NORM = ops_in("norm")                # per-channel / cross-channel maps (batch_norm, scale, lrn)
ELEMENTWISE = ops_in("elementwise")  # one output element per input element (relu, activation, add, ...)
LINEAR = ops_in("linear")            # dense layers (linear)
REDUCE = ops_in("reduce")            # reductions along axes (softmax, mean, sum)
SHAPE = ops_in("shape")              # data movement (flatten, concat, reshape, permute, slice, pad, channel_shuffle,
                                     # pixel_shuffle)
RESIZE = ops_in("resize")            # spatial resampling (resize: nearest, bilinear, bicubic; grid_sample)

# property groups:
# output row r reads a window of input rows (kernel_size / stride / padding / dilation in H):
# the ops the row-band schedule runs through row windows (compiler/bands.py)
WINDOW = frozenset({"conv2d", "max_pool", "avg_pool"})
# output row r reads input row r only: streamed as is (kernels/bands.py: relu, add, dropout,
# concat on rows of either layout; activation, prelu, add/sub/mul/div with a constant broadcast
# over the rows and channel_norm through their layer kernels on row bands; any other op through
# its reference kernel on NCHW rows)
# (slice: of channels or columns; a slice of rows streams through a row window, compiler/bands.py `windowed`)
ROW_LOCAL = frozenset({"relu", "activation", "prelu", *BINARY, "scale", "batch_norm",
                       "channel_norm", "dropout", "local_response_norm", "concat", "slice"})
# output row r reads a monotone range of input rows [lo(r), hi(r)) that no integer-stride window
# describes (upsampling, transposed convs, reflected borders, adaptive windows): the row-band
# schedule tabulates it from the op's params (kernels/bands.py `row_window`, `RowTable`)
ROW_MAPPED = frozenset({"resize", "conv_transpose2d", "pad", "adaptive_avg_pool", "pixel_shuffle"})
# ops with a fused epilogue activation (`relu` / `act` parameters): a following ReLU or activation
# fuses into them (compiler/passes.py fuse_activation); lowering splits it out again for a kernel
# that cannot apply it
ACT_EPILOGUE = frozenset({"conv2d", "conv_transpose2d", "linear", *BINARY, "group_norm"})
# seed 004's memory-bound layers (BN, its inference form scale, ReLU, Add): what training fuses
# into the convolutions and its traffic tables count as memory-bound
MEMORY_BOUND = frozenset({"batch_norm", "scale", "relu", "add"})


def normalize(op: str, node: str, params: dict[str, Any]) -> dict[str, Any]:
    return schema(op, node).normalize(node, dict(params))


def flops(opnode) -> int:
    s = schema(opnode.op, opnode.name)
    return int(s.flops([d.shape for d in opnode.inputs], opnode.outputs[0].shape, opnode.params))
