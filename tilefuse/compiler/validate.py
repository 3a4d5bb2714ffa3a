"""Kernel validators: what each runtime kernel accepts, checked before a package may run.

A package is untrusted input. Its instructions name a kernel, give JSON parameters and operand
shapes; a kernel trusts all three (numba does not check bounds). So every kernel name of the
runtime registry (`kernels/registry.py: KERNELS`) has an entry in `VALIDATORS` below:

    validator(ins: Instruction) -> None        raises ValueError saying what is wrong

which re-derives the output shape from the parameters and the input shapes with the IR's own
shape inference (`ir/ops.py`), checks the operand count, shapes and dtypes, the parameter
types and bounds, and refuses any parameter the kernel does not declare. The package loader
(`compiler/package.py: validate_program`) runs it on every instruction, after checking that
every operand lies inside the block it names; a kernel without a validator cannot load.
(The validators live in the compiler layer because they read the IR; kernels/ imports neither.)

Adding a kernel (docs/architecture.md, "Package validation"):
  - a kernel that computes an IR op on operands in the op's input order: one line here,
        VALIDATORS["gelu"] = op_validator("gelu")
    (its NCHW16c form, when kernels/registry.py lists it in BLOCKED_FORM, is accepted too);
    or `register("gelu", fn, op_validator("gelu"))` from anywhere, which adds both
  - one with extra parameters: op_validator(op, extra={"name": check}), check(value) raising
    ValueError
  - anything else (conversions, prepared weights): a function like `validate_conv2d`
  - a new conv algorithm: an entry in PREPARED (its prepared constants' shapes)
`tests/test_validate.py` fails while a kernel or a conv algorithm lacks its entry.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..errors import GraphError
from ..ir.node import MAX_DIM  # any tensor dimension
from ..ir.ops import BINARY, normalize, schema
from ..kernels import registry
from ..kernels.broadcast import channel_operand
from ..kernels.conv import NCHWC_ALGORITHMS
from ..kernels.conv.stem import applies as stem_applies
from ..kernels.conv.select import candidates
from .layout import nchwc_params_ok
from .program import CONST

LANES = 16
MAX_PARAM = 1 << 31          # any integer in the params
MAX_SPATIAL = 1 << 16        # stride, dilation, padding, kernel size (and a conv's weight_shape)
SPATIAL = ("stride", "dilation", "padding", "kernel_size", "weight_shape")
FLOATS = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16))
F32 = np.dtype(np.float32)


class _T:
    """What shape inference reads of a DataNode."""
    __slots__ = ("name", "shape", "dtype")

    def __init__(self, name, shape, dtype):
        self.name, self.shape, self.dtype = name, tuple(shape), np.dtype(dtype)


def _is_const(op) -> bool:
    return op.segment == CONST


def _fail(msg: str):
    raise ValueError(msg)


def blocked(shape) -> tuple[int, ...]:
    """NCHW (N, C, H, W) -> NCHW16c (N, ceil(C/16), H, W, 16)."""
    n, c, h, w = shape
    return (n, -(-c // LANES), h, w, LANES)


def _unblock(shape, what: str, channels: int | None = None) -> tuple[int, ...]:
    """NCHW16c (N, Cb, H, W, 16) -> logical (N, C, H, W); C = channels or Cb*16."""
    if len(shape) != 5 or shape[-1] != LANES:
        _fail(f"{what} has shape {shape}, expected NCHW16c (N, C/16, H, W, 16)")
    n, cb, h, w, _ = shape
    if channels is None:
        return (n, cb * LANES, h, w)
    if -(-channels // LANES) != cb:
        _fail(f"{what} has {cb} channel blocks, expected ceil({channels}/16) = {-(-channels // LANES)}")
    return (n, channels, h, w)


def check_bounded(params: dict, where: str = "parameter") -> None:
    """Every number in the params: ints within +-MAX_PARAM (the spatial ones, SPATIAL, within
    +-MAX_SPATIAL), floats finite, but for a clip's bounds (an activation ("clip", min, max)), which may be
    infinite (an open side), not NaN."""
    def walk(k, v):
        if isinstance(v, bool) or v is None or isinstance(v, str):
            return
        if (isinstance(v, (tuple, list)) and len(v) == 3 and v[0] == "clip"
                and all(isinstance(x, float) and not math.isnan(x) for x in v[1:])):
            return
        if isinstance(v, int):
            limit = MAX_SPATIAL if k in SPATIAL else MAX_PARAM
            if abs(v) > limit:
                _fail(f"{where} {k}={v} is out of bounds; expected |value| <= {limit}")
        elif isinstance(v, float):
            if not math.isfinite(v):
                _fail(f"{where} {k}={v} is not finite")
        elif isinstance(v, (tuple, list)):
            for x in v:
                walk(k, x)
        elif isinstance(v, dict):
            for kk, x in v.items():
                walk(f"{k}.{kk}", x)
        else:
            _fail(f"{where} {k} has type {type(v).__name__}")
    for k, v in params.items():
        walk(k, v)


def check_shapes(ins) -> None:
    for op in ins.operands:
        if any(d > MAX_DIM for d in op.shape):
            _fail(f"operand '{op.name}' has shape {op.shape}; expected dimensions <= {MAX_DIM}")


def _same(a, b) -> bool:
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return type(a) is type(b) and a == b


def _normalized(op: str, node: str, params: dict) -> dict:
    """The op's parameters as the IR normalizes them; the instruction must carry exactly these."""
    try:
        norm = normalize(op, node, params)
    except GraphError as e:
        _fail(str(e))
    for k, v in norm.items():
        if k not in params:
            _fail(f"parameter '{k}' is missing (expected {v!r})")
        if not _same(params[k], v):
            _fail(f"parameter {k}={params[k]!r} is not in normal form; expected {v!r}")
    return norm


def _infer(op: str, node: str, ins_t: list, params: dict) -> tuple[int, ...]:
    try:
        return tuple(schema(op).infer(node, ins_t, params))
    except GraphError as e:
        _fail(str(e))
    except Exception as e:  # noqa: BLE001 - inference on malformed shapes
        _fail(f"shape inference failed on input shapes {[t.shape for t in ins_t]}: {type(e).__name__}: {e}")


def _layout_param(params: dict, layouts) -> str:
    if "layout" not in params:
        return "nchw"
    lay = params["layout"]
    if lay == "nchwc" and "nchwc" in layouts:
        return lay
    _fail(f"parameter layout={lay!r}; expected " + ("'nchwc' or no layout parameter" if "nchwc" in layouts
                                                    else "no layout parameter (this kernel runs NCHW only)"))


def op_validator(op: str, layouts=("nchw",), extra: dict[str, Callable] | None = None,
                 channels_from: str | None = None) -> Callable:
    """The validator of a kernel that computes IR op `op`: inputs in the op's role order, then
    the output; params = the op's normalized params (+ `layout` when `layouts` has "nchwc",
    + the `extra` keys, each checked by its function). In NCHW16c the logical channel count is
    Cb*16, or taken from `channels_from` ("output" or an input role)."""
    s = schema(op)
    extra = dict(extra or {})

    def validate(ins) -> None:
        p = dict(ins.params)
        lay = _layout_param(p, layouts)
        own = {k: v for k, v in p.items() if k != "layout" and k not in extra}
        for k, check in extra.items():
            if k in p:
                check(p[k])
        check_bounded(p)
        node = ins.output.name
        norm = _normalized(op, node, own)
        unknown = set(own) - set(norm)
        if unknown:
            _fail(f"unknown parameter(s) {sorted(unknown)}; {op} takes {sorted(norm) or 'none'}")
        roles = s.input_roles(norm)
        ins_ops = ins.inputs
        variadic = any(r.endswith("*") for r in roles)
        if (len(ins_ops) < len(roles)) if variadic else (len(ins_ops) != len(roles)):
            _fail(f"{len(ins_ops)} input operands, expected {len(roles)} ({', '.join(roles)})")
        dts = {o.dtype for o in ins.operands}
        if len(dts) != 1 or next(iter(dts)) not in FLOATS:
            _fail(f"operand dtypes {[str(o.dtype) for o in ins.operands]}; expected one float dtype "
                  f"for every operand")
        out_blocked = lay == "nchwc" and op not in registry.BLOCKED_TO_NCHW
        if lay == "nchwc":
            if next(iter(dts)) != F32:
                _fail(f"NCHW16c operands are {next(iter(dts))}; expected float32")
            ch = None
            if channels_from == "output":
                ch = ins.output.shape[1] if len(ins.output.shape) == 4 else None
                if ch is None:
                    _fail(f"output '{node}' has shape {ins.output.shape}, expected (N, C, 1, 1)")
            elif channels_from is not None:
                k = [r.rstrip("?") for r in s.inputs].index(channels_from)
                if len(ins_ops[k].shape) != 1:
                    _fail(f"{channels_from} '{ins_ops[k].name}' has shape {ins_ops[k].shape}, expected (C,)")
                ch = ins_ops[k].shape[0]
            ts = []
            for o in ins_ops:
                if _is_const(o):
                    ts.append(_T(o.name, o.shape, o.dtype))
                else:
                    ts.append(_T(o.name, _unblock(o.shape, f"input '{o.name}'", ch), o.dtype))
        else:
            ts = [_T(o.name, o.shape, o.dtype) for o in ins_ops]
        want = _infer(op, node, ts, norm)
        if out_blocked:
            want = blocked(want) if len(want) == 4 else want
        if tuple(ins.output.shape) != want:
            _fail(f"output '{node}' has shape {ins.output.shape}; its inputs and parameters give {want}")

    validate.__name__ = f"validate_{op}"
    validate.op = op
    return validate


# ----------------------------------------------------------------------------- conv2d

def _ceil16(c: int) -> int:
    return -(-c // LANES) * LANES


def _prepared_gemm1x1(w, groups, layout):
    co, ci = w[0], w[1]
    if layout == "nchwc":   # k1x1.prepare: (OP, Cip, 32), bias padded to OP*32
        op = -(-co // 32)
        return {"weight": (op, _ceil16(ci), 32), "bias": (op * 32,)}
    return {"weight": (co, ci), "bias": (co,)}


def _prepared_direct(w, groups, layout):
    co, ci, kh, kw = w
    return {"weight": (-(-co // LANES), -(-ci // LANES), kh, kw, LANES, LANES), "bias": (_ceil16(co),)}


def _prepared_winograd(m):
    def shapes(w, groups, layout):   # winograd.prepare: U packed (alpha^2, OP, Cip, 32)
        co, ci = w[0], w[1]
        return {"weight": ((m + 2) ** 2, -(-co // 32), _ceil16(ci), 32), "bias": (_ceil16(co),)}
    return shapes


def _prepared_im2col(w, groups, layout):
    co, cg, kh, kw = w
    out = {"weight": (groups, co // groups, cg, kh, kw), "bias": (co,)}
    if stem_applies(cg, groups):    # the stem kernel's packing too (stem.prepare, via im2col.prepare)
        out.update({"stem_weight": (-(-co // LANES), cg, kh, kw, LANES), "stem_bias": (_ceil16(co),)})
    return out


def _prepared_depthwise(w, groups, layout):
    co, _, kh, kw = w   # depthwise.prepare: one form for both layouts; "src" for a channel multiplier > 1
    out = {"weight": (-(-co // LANES), kh, kw, LANES), "bias": (_ceil16(co),)}
    if co != groups:
        out["src"] = (_ceil16(co),)
    return out


def _prepared_grouped(w, groups, layout):
    from ..kernels.conv.planner import grouped_bundle, grouped_lanes_applies
    co, cg, kh, kw = w  # grouped.prepare: one form for both layouts
    if grouped_lanes_applies(cg * groups, co, groups):      # groups inside one block: grouped_lanes.prepare
        return {"weight": (-(-co // LANES), kh, kw, cg, LANES), "bias": (_ceil16(co),)}
    _, cbg, obg, gp = grouped_bundle(cg * groups, co, groups)   # the block groups' dense tiles
    return {"weight": (gp, obg, cbg, kh, kw, LANES, LANES), "bias": (gp * obg * LANES,)}


# algorithm -> fn(weight_shape, groups, layout) -> {role: shape}: the constants conv2d_prepare makes
PREPARED: dict[str, Callable] = {
    "depthwise": _prepared_depthwise,
    "grouped": _prepared_grouped,
    "gemm1x1": _prepared_gemm1x1,
    "direct": _prepared_direct,
    "winograd2": _prepared_winograd(2),
    "winograd4": _prepared_winograd(4),
    "im2col": _prepared_im2col,
}

_CONV_KEYS = {"stride", "padding", "dilation", "groups", "has_bias", "has_residual", "relu", "act",
              "has_input_scale"}
_CONV_EXTRA = {"algorithm", "prepared", "weight_shape", "layout", "out_layout"}


def validate_conv2d(ins) -> None:
    """conv2d: the reference form (x, weight, bias?, residual?) or an algorithm's form
    (x, prepared constants in `prepared` order, residual?) in NCHW, NCHW16c, or NCHW in and
    NCHW16c out; every shape re-derived from `weight_shape` and the IR's conv inference."""
    p = dict(ins.params)
    check_bounded(p)
    node = ins.output.name
    unknown = set(p) - _CONV_KEYS - _CONV_EXTRA
    if unknown:
        _fail(f"unknown parameter(s) {sorted(unknown)}")
    own = {k: v for k, v in p.items() if k in _CONV_KEYS}
    norm = _normalized("conv2d", node, own)
    alg = p.get("algorithm", "reference")
    lay, out_lay = p.get("layout", "nchw"), p.get("out_layout", "nchw")
    if ("layout" in p and lay != "nchwc") or ("out_layout" in p and out_lay != "nchwc"):
        _fail(f"layout={lay!r}, out_layout={out_lay!r}; expected 'nchwc' when given")
    if lay == "nchwc" and "out_layout" in p:
        _fail("both layout and out_layout given; expected one")
    if any(o.dtype != ins.output.dtype for o in ins.operands) or ins.output.dtype not in FLOATS:
        _fail(f"operand dtypes {[str(o.dtype) for o in ins.operands]}; expected one float dtype")
    xs, wt = ins.inputs[0] if ins.inputs else None, None
    if xs is None:
        _fail("no input operands")
    if norm.get("has_input_scale"):
        return _validate_input_scaled_conv(ins, p, norm, node)
    if alg == "reference":
        if set(p) & {"prepared", "weight_shape", "layout", "out_layout"}:
            _fail(f"the reference conv takes no {sorted(set(p) & {'prepared', 'weight_shape', 'layout', 'out_layout'})}")
        roles = ["x", "weight"] + (["bias"] if norm["has_bias"] else []) + (["residual"] if norm["has_residual"] else [])
        if len(ins.inputs) != len(roles):
            _fail(f"{len(ins.inputs)} input operands, expected {len(roles)} ({', '.join(roles)})")
        ts = [_T(o.name, o.shape, o.dtype) for o in ins.inputs]
        want = _infer("conv2d", node, ts, norm)
        if tuple(ins.output.shape) != want:
            _fail(f"output '{node}' has shape {ins.output.shape}; its inputs and parameters give {want}")
        return
    # an algorithm with prepared constants
    if alg not in PREPARED:
        _fail(f"conv algorithm {alg!r} has no validator; known: {sorted(PREPARED)}")
    ws = p.get("weight_shape")
    if not (isinstance(ws, (tuple, list)) and len(ws) == 4
            and all(isinstance(d, int) and not isinstance(d, bool) and 0 < d <= MAX_SPATIAL for d in ws)):
        _fail(f"parameter weight_shape={ws!r}; expected (out channels, in channels / groups, kh, kw)")
    ws = tuple(ws)
    keys = p.get("prepared")
    if ins.output.dtype != F32:
        _fail(f"algorithm {alg!r} runs float32 only, operands are {ins.output.dtype}")
    g = norm["groups"]
    if g < 1 or ws[0] % g:
        _fail(f"weight_shape {ws} with groups={g}; expected out channels divisible by groups")
    expect_keys = list(PREPARED[alg](ws, g, lay))
    if keys is None or list(keys) != expect_keys:
        _fail(f"parameter prepared={keys!r}; expected {tuple(expect_keys)}")
    if lay == "nchwc" or out_lay == "nchwc":
        if g != 1 and not (lay == "nchwc" and alg in ("depthwise", "grouped")):
            _fail(f"groups={g} in NCHW16c with algorithm {alg!r}; expected 1 (or a depthwise / grouped algorithm)")
        if lay == "nchwc" and alg not in NCHWC_ALGORITHMS:
            _fail(f"algorithm {alg!r} has no NCHW16c form; expected one of {NCHWC_ALGORITHMS}")
        if out_lay == "nchwc" and alg != "im2col":
            _fail(f"out_layout 'nchwc' is only for im2col, got algorithm {alg!r}")
    nres = int(norm["has_residual"])
    if len(ins.inputs) != 1 + len(keys) + nres:
        _fail(f"{len(ins.inputs)} input operands, expected {1 + len(keys) + nres} "
              f"(x, {', '.join(keys)}{', residual' if nres else ''})")
    x = ins.inputs[0]
    ci = ws[1] * g
    if lay == "nchwc":
        xl = _unblock(x.shape, f"input '{x.name}'", None)
        if xl[1] != _ceil16(ci):
            _fail(f"input '{x.name}' has {xl[1] // LANES} channel blocks; weight_shape {ws} needs {_ceil16(ci) // LANES}")
        xl = (xl[0], ci, xl[2], xl[3])
    else:
        xl = tuple(x.shape)
    ts = [_T(x.name, xl, x.dtype), _T("weight", ws, x.dtype)]
    # bias and residual are prepared / checked against the output below
    want = _infer("conv2d", node, ts, dict(norm, has_bias=False, has_residual=False))
    cands = candidates((1, ci, 1, 1), ws, norm["stride"], norm["padding"], norm["dilation"], g)
    if alg not in cands:
        _fail(f"algorithm {alg!r} cannot run weight {ws} with stride={norm['stride']}, "
              f"padding={norm['padding']}, dilation={norm['dilation']}, groups={g}; candidates: {cands}")
    if lay == "nchwc" or out_lay == "nchwc":
        want = blocked(want)
    if tuple(ins.output.shape) != want:
        _fail(f"output '{node}' has shape {ins.output.shape}; its inputs and parameters give {want}")
    if nres and tuple(ins.inputs[-1].shape) != want:
        _fail(f"residual '{ins.inputs[-1].name}' has shape {ins.inputs[-1].shape}, expected {want}")
    shapes = PREPARED[alg](ws, g, lay)
    for k, o in zip(keys, ins.inputs[1:1 + len(keys)]):
        if not _is_const(o):
            _fail(f"prepared {k} '{o.name}' is not a constant")
        if tuple(o.shape) != tuple(shapes[k]):
            _fail(f"prepared {k} '{o.name}' has shape {o.shape}; algorithm {alg!r} with weight_shape {ws} "
                  f"needs {tuple(shapes[k])}")


# ----------------------------------------------------------------------------- layout conversions

def _channels_param(p: dict) -> int:
    c = p.get("channels")
    if isinstance(c, bool) or not isinstance(c, int) or not 0 < c <= MAX_DIM:
        _fail(f"parameter channels={c!r}; expected a positive integer")
    return c


def _conversion(direction: str):
    def validate(ins) -> None:
        p = dict(ins.params)
        unknown = set(p) - {"channels"}
        if unknown:
            _fail(f"unknown parameter(s) {sorted(unknown)}; {direction} takes channels")
        c = _channels_param(p)
        if len(ins.inputs) != 1:
            _fail(f"{len(ins.inputs)} input operands, expected 1")
        src, dst = ins.inputs[0], ins.output
        if src.dtype != F32 or dst.dtype != F32:
            _fail(f"operands are {src.dtype} -> {dst.dtype}; expected float32")
        nchw, nchwc = (src, dst) if direction == "to_nchwc" else (dst, src)
        if len(nchw.shape) != 4 or nchw.shape[1] != c:
            _fail(f"'{nchw.name}' has shape {nchw.shape}, expected (N, {c}, H, W)")
        if tuple(nchwc.shape) != blocked(nchw.shape):
            _fail(f"'{nchwc.name}' has shape {nchwc.shape}, expected {blocked(nchw.shape)}")
    validate.__name__ = f"validate_{direction}"
    return validate


validate_to_nchwc = _conversion("to_nchwc")
validate_from_nchwc = _conversion("from_nchwc")


# ----------------------------------------------------------------------------- the registry

def _layouts(kernel: str) -> tuple[str, ...]:
    """NCHW, and NCHW16c for the kernels with a blocked form (kernels/registry.py)."""
    return ("nchw", "nchwc") if kernel in registry.BLOCKED_FORM else ("nchw",)


# kernel name -> validator, one per kernels/registry.py KERNELS entry (tests/test_validate.py)
VALIDATORS: dict[str, Callable] = {
    "conv2d": validate_conv2d,
    "to_nchwc": validate_to_nchwc,
    "from_nchwc": validate_from_nchwc,
    "scale": op_validator("scale", _layouts("scale"), channels_from="alpha"),
    "global_avg_pool": op_validator("global_avg_pool", _layouts("global_avg_pool"), channels_from="output"),
    "squeeze_excitation": op_validator("squeeze_excitation", _layouts("squeeze_excitation"),
                                       channels_from="output"),
}
for _k in ("batch_norm", "relu", "add", "max_pool", "avg_pool", "linear", "flatten", "dropout", "softmax",
           "local_response_norm", "concat"):
    VALIDATORS[_k] = op_validator(_k, _layouts(_k))


# ----------------------------------------------------------------------------- the row-band schedule

def validate_band(ins) -> None:
    """A band instruction (compiler/streaming.py): its op's params bounded and in normal form,
    every activation operand's shape against its logical shape and rows held, the output
    re-derived by the op's shape inference, the windows; a conv's prepared constants have the
    shapes its algorithm makes from `weight_shape`. (The steps of the region are replayed
    against the rings by `streaming.validate_stream` once the whole program has passed.)"""
    from .streaming import validate_band as check_band
    p = ins.params
    check_bounded({k: v for k, v in p.items() if k not in ("tensors", "name", "attrs")})
    if isinstance(p.get("attrs"), dict):
        check_bounded(p["attrs"])
    check_band(ins)
    if p["op"] == "conv2d" and p.get("prepared"):
        # the prepared weights as the layer's conv2d validator sees them: the same instruction on
        # whole logical tensors (NCHW16c when the weights are the blocked form)
        from .program import DIRECT, HIDDEN, Instruction, Operand
        blk = p["layout"] == "nchwc"
        acts = iter(tuple(t[:4]) for t in p["tensors"])

        def whole(o):
            if _is_const(o):
                return o
            shape = next(acts)
            return Operand(o.name, DIRECT, HIDDEN, o.dtype, blocked(shape) if blk else shape)
        ops = [whole(o) for o in ins.operands]
        params = dict(p["attrs"], prepared=p["prepared"], weight_shape=p["weight_shape"])
        if blk:
            params["layout"] = "nchwc"
        validate_conv2d(Instruction("conv2d", ops, params))


def validate_stream_header(ins) -> None:
    from .streaming import validate_header
    check_bounded({k: v for k, v in ins.params.items() if k != "stages"})
    validate_header(ins)


VALIDATORS["band"] = validate_band
VALIDATORS["stream"] = validate_stream_header


def register(name: str, fn, validator, threaded: bool = False) -> None:
    """Add a runtime kernel and its validator together (both are required)."""
    if not callable(fn) or not callable(validator):
        raise TypeError(f"kernel '{name}': register needs a kernel function and a validator")
    registry.KERNELS[name] = fn
    VALIDATORS[name] = validator
    if threaded:
        registry.THREADED.add(name)



# ----------------------------------------------------------------------------- modern CNN ops (issue 9)

def _validate_input_scaled_conv(ins, p, norm, node) -> None:
    """conv2d with a squeeze-excitation scale (kernels/se_conv.py): operands x, weight, bias?,
    residual?, input_scale (N, C, 1, 1), the reference weights (algorithm 'reference' or none);
    NCHW, or x / residual / output NCHW16c (1x1 stride 1 only, float32), the scale NCHW."""
    if set(p) & {"prepared", "weight_shape", "out_layout"}:
        _fail(f"an input-scaled conv takes no {sorted(set(p) & {'prepared', 'weight_shape', 'out_layout'})}")
    if p.get("algorithm", "reference") != "reference":
        _fail(f"an input-scaled conv runs kernels/se_conv.py on the reference weights; found algorithm "
              f"{p['algorithm']!r}, expected 'reference' or none")
    roles = ["x", "weight"] + (["bias"] if norm["has_bias"] else []) + \
        (["residual"] if norm["has_residual"] else []) + ["input_scale"]
    if len(ins.inputs) != len(roles):
        _fail(f"{len(ins.inputs)} input operands, expected {len(roles)} ({', '.join(roles)})")
    w = ins.inputs[1]
    if not _is_const(w) or len(w.shape) != 4:
        _fail(f"weight '{w.name}' must be a constant (O, C/groups, kh, kw), got shape {w.shape}")
    ts = [_T(o.name, o.shape, o.dtype) for o in ins.inputs]
    blocked_io = p.get("layout") == "nchwc"
    if blocked_io:
        if ins.output.dtype != F32 or w.shape[2:] != (1, 1) or norm["stride"] != (1, 1) or \
                norm["padding"] != (0, 0, 0, 0) or norm["groups"] != 1:
            _fail("an input-scaled conv runs NCHW16c only as a float32 1x1 conv with stride 1, no padding, groups 1")
        ts[0] = _T(ins.inputs[0].name, _unblock(ins.inputs[0].shape, f"input '{ins.inputs[0].name}'", w.shape[1]),
                   ins.inputs[0].dtype)
        if norm["has_residual"]:
            r = ins.inputs[roles.index("residual")]
            ts[roles.index("residual")] = _T(r.name, _unblock(r.shape, f"residual '{r.name}'", w.shape[0]), r.dtype)
    want = _infer("conv2d", node, ts, norm)
    want = blocked(want) if blocked_io else want
    if tuple(ins.output.shape) != want:
        _fail(f"output '{node}' has shape {ins.output.shape}; its inputs and parameters give {want}")


def _check_channel_params(p: dict, n_blocked: int) -> tuple[int, list[int]]:
    """The real channel counts a blocked non-conv kernel carries (compiler/layout.py)."""
    c = _channels_param(p)
    inch = p.get("in_channels")
    if not isinstance(inch, (tuple, list)) or len(inch) != n_blocked or \
            any(isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= MAX_DIM for v in inch):
        _fail(f"parameter in_channels={inch!r}; expected {n_blocked} positive integers (one per blocked input)")
    return c, list(inch)


def blocked_op_validator(op: str, layouts=("nchw",)) -> Callable:
    """The validator of a kernel computing IR op `op` whose NCHW16c form (params layout "nchwc",
    channels, in_channels from the layout pass) reads its 5-D operands blocked and any 4-D one
    as NCHW (a per-channel operand, kernels/broadcast.py): logical shapes re-derived with the
    channel counts, then the IR's inference; NCHW instructions go to op_validator."""
    nchw = op_validator(op)
    s = schema(op)

    def validate(ins) -> None:
        p = dict(ins.params)
        if p.get("layout") != "nchwc":
            if set(p) & {"channels", "in_channels"}:
                _fail(f"parameters {sorted(set(p) & {'channels', 'in_channels'})} belong to the NCHW16c form; "
                      f"expected layout='nchwc' with them")
            return nchw(ins)
        _layout_param(p, layouts)
        node = ins.output.name
        blocked_ins = [o for o in ins.inputs if not _is_const(o) and len(o.shape) == 5]
        c, inch = _check_channel_params(p, len(blocked_ins))
        own = {k: v for k, v in p.items() if k not in ("layout", "channels", "in_channels")}
        check_bounded(p)
        norm = _normalized(op, node, own)
        unknown = set(own) - set(norm)
        if unknown:
            _fail(f"unknown parameter(s) {sorted(unknown)}; {op} takes {sorted(norm) or 'none'}")
        roles = s.input_roles(norm)
        variadic = any(r.endswith("*") for r in roles)
        if (len(ins.inputs) < 1) if variadic else (len(ins.inputs) != len(roles)):
            _fail(f"{len(ins.inputs)} input operands, expected {len(roles)} ({', '.join(roles)})")
        if any(o.dtype != F32 for o in ins.operands):
            _fail(f"NCHW16c operands are {[str(o.dtype) for o in ins.operands]}; expected float32")
        it = iter(inch)
        ts = [_T(o.name, _unblock(o.shape, f"input '{o.name}'", next(it)), o.dtype)
              if (not _is_const(o) and len(o.shape) == 5) else _T(o.name, o.shape, o.dtype) for o in ins.inputs]
        want = _infer(op, node, ts, norm)
        if len(want) != 4 or want[1] != c:
            _fail(f"output '{node}': inputs and parameters give {want}, expected {c} channels (N, C, H, W)")
        if tuple(ins.output.shape) != blocked(want):
            _fail(f"output '{node}' has shape {ins.output.shape}; its inputs and parameters give {blocked(want)}")
        # what the NCHW16c kernels take (the layout pass's `_blockable`): a binary op's blocked inputs are the
        # output's shape and the others per-channel (kernels/broadcast.py); concat / slice / pad params as
        # `layout.nchwc_params_ok`
        if op in BINARY:
            for o in ins.inputs:
                if (len(o.shape) == 5 and tuple(o.shape) != tuple(ins.output.shape)) or \
                        (len(o.shape) != 5 and not channel_operand(ins.output.shape, o.shape, "nchwc")):
                    _fail(f"input '{o.name}' has shape {o.shape}; the NCHW16c {op} takes the output's shape "
                          f"{ins.output.shape} or a per-channel (N or 1, C, 1, 1) operand")
        if not nchwc_params_ok(op, norm):
            _fail({"concat": f"axis={norm.get('axis')}; the NCHW16c concat joins channels (axis 1)",
                   "slice": f"axis={norm.get('axis')}; the NCHW16c slice takes channels, rows or columns (axes 1-3)",
                   "pad": f"pads={norm.get('pads')}; the NCHW16c pad pads rows and columns only"}[op])

    validate.__name__ = f"validate_{op}"
    validate.op = op
    return validate


for _k in ("activation", "prelu", "add", "sub", "mul", "div", "maximum", "minimum", "atan2", "resize", "pad", "slice", "concat",
           "channel_norm", "channel_shuffle", "group_norm"):
    VALIDATORS[_k] = blocked_op_validator(_k, _layouts(_k))
for _k in ("mean", "sum", "max", "reshape", "permute", "layer_norm", "adaptive_avg_pool", "adaptive_max_pool",
           "matmul", "where", "pixel_shuffle", "grid_sample", "take", "argmax", "cumsum"):
    VALIDATORS[_k] = op_validator(_k, _layouts(_k))


_validate_convt_reference = op_validator("conv_transpose2d", _layouts("conv_transpose2d"))


def validate_conv_transpose2d(ins) -> None:
    """conv_transpose2d: the reference form (x, weight, bias?), or the phase kernel's
    (kernels/conv/transpose.py; params algorithm "phase", prepared, weight_shape, layout?):
    x, its prepared weight (KH, KW, OP, Cip, 32) and bias (OP*32,), NCHW or NCHW16c; every shape
    re-derived from weight_shape and the IR's shape inference."""
    p = dict(ins.params)
    if "algorithm" not in p:
        _validate_convt_reference(ins)
        return
    check_bounded(p)
    node = ins.output.name
    extra = {"algorithm", "prepared", "weight_shape", "layout"}
    own = {k: v for k, v in p.items() if k not in extra}
    norm = _normalized("conv_transpose2d", node, own)
    unknown = set(own) - set(norm)
    if unknown:
        _fail(f"unknown parameter(s) {sorted(unknown)}")
    if p["algorithm"] != "phase":
        _fail(f"conv_transpose2d algorithm {p['algorithm']!r}; expected 'phase'")
    lay = p.get("layout", "nchw")
    if lay not in ("nchw", "nchwc") or ("layout" in p and lay != "nchwc"):
        _fail(f"layout={lay!r}; expected 'nchwc' when given")
    ws = p.get("weight_shape")
    if not (isinstance(ws, (tuple, list)) and len(ws) == 4
            and all(isinstance(d, int) and not isinstance(d, bool) and 0 < d <= MAX_SPATIAL for d in ws)):
        _fail(f"parameter weight_shape={ws!r}; expected (in channels, out channels / groups, kh, kw)")
    ws = tuple(ws)
    if list(p.get("prepared") or ()) != ["weight", "bias"]:
        _fail(f"parameter prepared={p.get('prepared')!r}; expected ('weight', 'bias')")
    if len(ins.inputs) != 3:
        _fail(f"{len(ins.inputs)} input operands, expected 3 (x, weight, bias)")
    if any(o.dtype != F32 for o in ins.operands):
        _fail(f"operand dtypes {[str(o.dtype) for o in ins.operands]}; the phase kernel runs float32")
    x = ins.inputs[0]
    ci, g = ws[0], norm["groups"]
    if lay == "nchwc":
        xl = _unblock(x.shape, f"input '{x.name}'", None)
        if xl[1] != _ceil16(ci):
            _fail(f"input '{x.name}' has {xl[1] // LANES} channel blocks; weight_shape {ws} needs {_ceil16(ci) // LANES}")
        xl = (xl[0], ci, xl[2], xl[3])
    else:
        xl = tuple(x.shape)
    want = _infer("conv_transpose2d", node, [_T(x.name, xl, x.dtype), _T("weight", ws, x.dtype)],
                  dict(norm, has_bias=False))
    if lay == "nchwc":
        want = blocked(want)
    if tuple(ins.output.shape) != want:
        _fail(f"output '{node}' has shape {ins.output.shape}; its inputs and parameters give {want}")
    co, op = ws[1] * g, -(-(ws[1] * g) // 32)
    for k, o, s in (("weight", ins.inputs[1], (ws[2], ws[3], op, _ceil16(ci), 32)), ("bias", ins.inputs[2], (op * 32,))):
        if not _is_const(o):
            _fail(f"prepared {k} '{o.name}' is not a constant")
        if tuple(o.shape) != s:
            _fail(f"prepared {k} '{o.name}' has shape {o.shape}; weight_shape {ws} with groups={g} needs {s}")


VALIDATORS["conv_transpose2d"] = validate_conv_transpose2d
