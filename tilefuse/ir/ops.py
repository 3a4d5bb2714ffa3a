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
from ..kernels import reference as ref

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
GROUP_NAMES = ("conv", "pool", "global", "norm", "elementwise", "linear", "reduce", "shape")


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

def _conv_norm(node, p):
    return {
        "stride": pair(node, "stride", p.get("stride", 1)),
        "padding": padding4(node, p.get("padding", 0)),
        "dilation": pair(node, "dilation", p.get("dilation", 1)),
        "groups": _int(node, "groups", p.get("groups", 1), 1),
        "has_bias": bool(p.get("has_bias", False)),
        "has_residual": bool(p.get("has_residual", False)),
        "relu": bool(p.get("relu", False)),
    }


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
    return (n, o, ho, wo)


def _conv_ref(x, w, *rest, stride, padding, dilation, groups, has_bias, has_residual, relu):
    rest = list(rest)
    b = rest.pop(0) if has_bias else None
    res = rest.pop(0) if has_residual else None
    return ref.conv2d(x, w, b, stride, padding, dilation, groups, residual=res, relu=relu)


def _conv_flops(in_shapes, out, p):
    o, cg, kh, kw = in_shapes[1]
    return 2 * _prod(out) * cg * kh * kw


_register(OpSchema("conv2d", "conv", ("x", "weight", "bias?", "residual?"),
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


def _add_infer(node, ins, p):
    a, b = ins
    if a.shape != b.shape:
        raise GraphError(node, f"add operands have shapes {a.shape} ('{a.name}') and {b.shape} "
                               f"('{b.name}'); expected equal shapes")
    _expect_same_dtype(node, ins)
    return tuple(a.shape)


_register(OpSchema("relu", "elementwise", ("x",), lambda n, p: {}, _same_infer,
                   lambda x: ref.relu(x), lambda i, o, p: _prod(o)))
_register(OpSchema("add", "elementwise", ("a", "b"), lambda n, p: {"relu": bool(p.get("relu", False))},
                   _add_infer, lambda a, b, relu: ref.add(a, b, relu), lambda i, o, p: _prod(o)))


def _dropout_norm(node, p):
    prob = float(p.get("p", 0.5))
    if not 0.0 <= prob < 1.0:
        raise GraphError(node, f"parameter p={prob} must be in [0, 1)")
    return {"p": prob}


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


# linear, softmax, lrn ------------------------------------------------------------------------

def _linear_norm(node, p):
    return {"has_bias": bool(p.get("has_bias", False)), "relu": bool(p.get("relu", False))}


def _linear_infer(node, ins, p):
    x, w = ins[0], ins[1]
    _expect_rank(node, "input", x, 2)
    _expect_rank(node, "weight", w, 2)
    _expect_same_dtype(node, ins)
    if w.shape[1] != x.shape[1]:
        raise GraphError(node, f"weight '{w.name}' has shape {w.shape}, expected (out_features, "
                               f"{x.shape[1]}) to match input {x.shape}")
    if p["has_bias"]:
        _expect_shape(node, "bias", ins[2], (w.shape[0],))
    return (x.shape[0], w.shape[0])


def _linear_ref(x, w, *rest, has_bias, relu):
    return ref.linear(x, w, rest[0] if has_bias else None, relu=relu)


_register(OpSchema("linear", "linear", ("x", "weight", "bias?"), _linear_norm, _linear_infer,
                   _linear_ref, lambda i, o, p: 2 * _prod(o) * i[1][1]))


def _axis_norm(node, p, default=1):
    return {"axis": _int(node, "axis", p.get("axis", default))}


def _softmax_infer(node, ins, p):
    x = ins[0]
    ax = p["axis"]
    if not -len(x.shape) <= ax < len(x.shape):
        raise GraphError(node, f"axis={ax} is out of range for input shape {x.shape}")
    return tuple(x.shape)


_register(OpSchema("softmax", "reduce", ("x",), _axis_norm, _softmax_infer,
                   lambda x, axis: ref.softmax(x, axis), lambda i, o, p: 5 * _prod(o)))


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


CONV = ops_in("conv")                # convolutions (conv2d)
POOL = ops_in("pool")                # windowed pooling (max_pool, avg_pool)
GLOBAL = ops_in("global")            # whole-plane reductions (global_avg_pool)
NORM = ops_in("norm")                # per-channel / cross-channel maps (batch_norm, scale, lrn)
ELEMENTWISE = ops_in("elementwise")  # one output element per input element (relu, add, dropout)
LINEAR = ops_in("linear")            # dense layers (linear)
REDUCE = ops_in("reduce")            # reductions along an axis (softmax)
SHAPE = ops_in("shape")              # data movement (flatten, concat)

# property groups:
# output row r reads a window of input rows (kernel_size / stride / padding / dilation in H):
# the ops streaming runs through row windows (stream/schedule.py)
WINDOW = frozenset({"conv2d", "max_pool", "avg_pool"})
# output row r reads input row r only: streamed as is (stream/bands.py has a band kernel each)
ROW_LOCAL = frozenset({"relu", "add", "scale", "batch_norm", "dropout", "local_response_norm", "concat"})
# ops with a `relu` parameter: a following ReLU fuses into them (compiler/passes.py fuse_relu)
RELU_EPILOGUE = frozenset({"conv2d", "linear", "add"})
# seed 004's memory-bound layers (BN, its inference form scale, ReLU, Add): what training fuses
# into the convolutions and its traffic tables count as memory-bound
MEMORY_BOUND = frozenset({"batch_norm", "scale", "relu", "add"})


def normalize(op: str, node: str, params: dict[str, Any]) -> dict[str, Any]:
    return schema(op, node).normalize(node, dict(params))


def flops(opnode) -> int:
    s = schema(opnode.op, opnode.name)
    return int(s.flops([d.shape for d in opnode.inputs], opnode.outputs[0].shape, opnode.params))
