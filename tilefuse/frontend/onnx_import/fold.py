"""The constant evaluator: ONNX nodes whose inputs are all known at import time, run in numpy.

Exporters write shape arithmetic into the graph (`Shape -> Gather -> Unsqueeze -> Concat ->
Reshape`, `Constant`, `Identity` on shared initializers, `Cast`, `Range`, `ConstantOfShape`).
tilefuse compiles static shapes, so every such value is a constant: the importer evaluates these
nodes here and never builds them into the network. `Shape` and `Size` fold even on computed
tensors (their shapes are static).

FOLD maps an ONNX op type to `fn(node, inputs, attrs) -> list of output arrays`; `node` is the
importer's node record (its `.where` names it in errors, `.version` is the op's resolved version).
Only the semantics written here are folded; any other constant-only node is refused by name.
Integer division truncates toward zero (C semantics, as ONNX Runtime computes it).
"""
from __future__ import annotations

import numpy as np

from ...errors import GraphError, UnsupportedOpError

MAX_FOLDED_ELEMENTS = 1 << 26   # a constant larger than this (256 MiB of float32) is refused


def _check_size(node, shape) -> None:
    n = 1
    for d in shape:
        if d < 0:
            raise GraphError(node.where, f"computed shape {tuple(shape)} has a negative dimension")
        n *= int(d)
    if n > MAX_FOLDED_ELEMENTS:
        raise GraphError(node.where, f"constant of shape {tuple(shape)} ({n} elements) is larger than the "
                                     f"{MAX_FOLDED_ELEMENTS} elements the importer folds")


def np_dtype(node, elem_type: int):
    """ONNX TensorProto element type -> numpy dtype (plain numeric and bool types only)."""
    from onnx import TensorProto
    table = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64, TensorProto.FLOAT16: np.float16,
             TensorProto.INT8: np.int8, TensorProto.INT16: np.int16, TensorProto.INT32: np.int32,
             TensorProto.INT64: np.int64, TensorProto.UINT8: np.uint8, TensorProto.UINT16: np.uint16,
             TensorProto.UINT32: np.uint32, TensorProto.UINT64: np.uint64, TensorProto.BOOL: np.bool_}
    if elem_type not in table:
        name = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else elem_type
        raise UnsupportedOpError(f"{node.where}: element type {name} is not supported; expected a float, "
                                 f"integer or bool type")
    return np.dtype(table[elem_type])


def tensor_to_array(node, t) -> np.ndarray:
    """A TensorProto (raw or typed fields; external data is refused) -> numpy array."""
    from onnx import TensorProto, numpy_helper
    if t.data_location == 1:  # TensorProto.EXTERNAL
        raise UnsupportedOpError(f"{node.where}: tensor '{t.name}' stores its data in an external file; "
                                 f"load the model with onnx.load(path) (which reads external data) and pass "
                                 f"the ModelProto")
    if t.data_type != TensorProto.STRING:    # strings load (as objects); no converter accepts them
        np_dtype(node, t.data_type)
    try:
        return np.asarray(numpy_helper.to_array(t))
    except Exception as e:
        raise GraphError(node.where, f"tensor '{t.name}' cannot be decoded: {e}") from e


def sparse_to_array(node, sp) -> np.ndarray:
    """A SparseTensorProto -> dense numpy array (indices linear [NNZ] or coordinates [NNZ, rank])."""
    vals = tensor_to_array(node, sp.values)
    idx = tensor_to_array(node, sp.indices).astype(np.int64)
    dims = tuple(int(d) for d in sp.dims)
    _check_size(node, dims)
    out = np.zeros(dims, vals.dtype)
    size = int(np.prod(dims)) if dims else 1
    if idx.ndim == 1:
        lin = idx
    elif idx.ndim == 2 and idx.shape[1] == len(dims):
        if (idx < 0).any() or (idx >= np.array(dims)).any():
            raise GraphError(node.where, f"sparse tensor indices out of range for shape {dims}")
        lin = np.ravel_multi_index(tuple(idx.T), dims) if len(idx) else idx.reshape(-1)
    else:
        raise GraphError(node.where, f"sparse tensor indices have shape {idx.shape}; expected [NNZ] or "
                                     f"[NNZ, {len(dims)}]")
    if lin.shape[0] != vals.size or (lin < 0).any() or (lin >= size).any():
        raise GraphError(node.where, f"sparse tensor has {vals.size} values and indices {idx.shape} "
                                     f"out of range for shape {dims}")
    out.reshape(-1)[lin] = vals.reshape(-1)
    return out


# ----------------------------------------------------------------------------- helpers

def _axis(node, axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < rank:
        raise GraphError(node.where, f"{what}={axis} is out of range for rank {rank}; expected "
                                     f"{-rank} <= {what} < {rank}")
    return axis % rank


def _ints(node, a: np.ndarray | None, what: str) -> list[int] | None:
    if a is None:
        return None
    a = np.asarray(a)
    if a.dtype.kind not in "iu":
        raise GraphError(node.where, f"{what} has dtype {a.dtype}; expected an integer tensor")
    if a.ndim != 1:                  # ONNX Runtime and ONNX's reference refuse a 0-d axes / starts / shape too
        raise GraphError(node.where, f"{what} has shape {a.shape}; expected a 1-D tensor")
    return [int(v) for v in a.reshape(-1)]


def slice_indices(node, dim: int, start: int, end: int, step: int) -> range:
    """ONNX Slice semantics on one axis (clamping, negative indices, negative steps) -> the indices."""
    if step == 0:
        raise GraphError(node.where, "slice step 0; expected a non-zero step")
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return range(start, end, step)


def slice_params(node, shape, starts, ends, axes, steps) -> list[range]:
    """Per-axis index ranges of an ONNX Slice on `shape` (axes default to 0..len(starts)-1)."""
    rank = len(shape)
    if len(starts) != len(ends):
        raise GraphError(node.where, f"slice starts {starts} and ends {ends} differ in length")
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if not len(axes) == len(steps) == len(starts):
        raise GraphError(node.where, f"slice starts/ends/axes/steps have lengths {len(starts)}/{len(ends)}/"
                                     f"{len(axes)}/{len(steps)}; expected equal lengths")
    axes = [_axis(node, a, rank, "slice axis") for a in axes]
    if len(set(axes)) != len(axes):
        raise GraphError(node.where, f"slice axes {axes} repeat an axis")
    out = [range(d) for d in shape]
    for a, s, e, st in zip(axes, starts, ends, steps):
        out[a] = slice_indices(node, shape[a], s, e, st)
    return out


def reshape_target(node, in_shape, shape: list[int], allowzero: bool) -> tuple[int, ...]:
    """ONNX Reshape's target shape: 0 copies the input dim (unless allowzero), one -1 is inferred."""
    out = list(shape)
    if out.count(-1) > 1:
        raise GraphError(node.where, f"reshape target {shape} has more than one -1")
    for i, s in enumerate(out):
        if s == 0 and not allowzero:
            if i >= len(in_shape):
                raise GraphError(node.where, f"reshape target {shape}: 0 at position {i} copies an input dim, "
                                             f"but the input {tuple(in_shape)} has rank {len(in_shape)}")
            out[i] = in_shape[i]
        elif s < -1:
            raise GraphError(node.where, f"reshape target {shape} has a negative size {s}")
    total = int(np.prod(in_shape)) if len(in_shape) else 1
    if -1 in out:
        rest = int(np.prod([s for s in out if s != -1])) if len(out) > 1 else 1
        if rest == 0 or total % rest:
            raise GraphError(node.where, f"cannot reshape {tuple(in_shape)} ({total} elements) to {shape}")
        out[out.index(-1)] = total // rest
    if int(np.prod(out)) != total:
        raise GraphError(node.where, f"cannot reshape {tuple(in_shape)} ({total} elements) to {shape} "
                                     f"({int(np.prod(out))} elements)")
    return tuple(int(s) for s in out)


def unsqueeze_shape(node, shape, axes: list[int]) -> tuple[int, ...]:
    r = len(shape) + len(axes)
    ax = sorted(_axis(node, a, r, "unsqueeze axis") for a in axes)
    if len(set(ax)) != len(ax):
        raise GraphError(node.where, f"unsqueeze axes {axes} repeat an axis")
    out, it = [], iter(shape)
    for i in range(r):
        out.append(1 if i in ax else next(it))
    return tuple(out)


def squeeze_shape(node, shape, axes: list[int] | None) -> tuple[int, ...]:
    """The shape after Squeeze; no axes, or an empty list of them, squeezes every axis of size 1 (as ONNX
    Runtime reads an empty `axes`)."""
    if axes is None or len(axes) == 0:
        return tuple(d for d in shape if d != 1)
    ax = {_axis(node, a, len(shape), "squeeze axis") for a in axes}
    for a in ax:
        if shape[a] != 1:
            raise GraphError(node.where, f"squeeze axis {a} has size {shape[a]} in shape {tuple(shape)}; "
                                         f"expected 1")
    return tuple(d for i, d in enumerate(shape) if i not in ax)


def axes_input(node, ins, attrs, idx: int, since: int) -> list[int] | None:
    """Axes given as the attribute (before opset `since`) or as input `idx` (from `since` on)."""
    if node.version < since:
        return list(attrs["axes"]) if "axes" in attrs else None
    return _ints(node, ins[idx] if len(ins) > idx else None, "axes")


# ----------------------------------------------------------------------------- folders

def _reduce(fn, since: int):
    """ReduceProd (the TorchScript exporter's element count of a shape: var / std's n - 1), ReduceMax / ReduceMin /
    ReduceSum of constants (the expanded Attention functions' masks); axes an input from opset `since` on. An
    empty reduction of max / min is refused (ONNX gives the dtype's lowest / highest value)."""
    def f(node, ins, a):
        x = np.asarray(ins[0])
        axes = axes_input(node, ins, a, 1, since)
        if not axes:
            if node.version >= since and a.get("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(x.ndim))
        ax = tuple(sorted({_axis(node, v, x.ndim, "axes") for v in axes}))
        if fn in (np.max, np.min) and any(x.shape[i] == 0 for i in ax):
            raise UnsupportedOpError(f"{node.where}: folding {node.op} over an empty axis of {x.shape}")
        return [np.asarray(fn(x, axis=ax, keepdims=bool(a.get("keepdims", 1)))).astype(x.dtype)]
    return f


def _pad_fold(node, ins, a):
    """Pad (11+: pads, constant_value, axes as inputs) of a constant: constant, edge, reflect or wrap, a negative
    pad crops (the expanded Attention functions pad their constant masks)."""
    x = np.asarray(ins[0])
    mode = a.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if node.version < 11:
        raise UnsupportedOpError(f"{node.where}: folding Pad-{node.version} (pads as an attribute)")
    pads = _ints(node, ins[1] if len(ins) > 1 else None, "pads") or []
    axes = _ints(node, ins[3] if len(ins) > 3 else None, "axes")
    axes = list(range(x.ndim)) if axes is None else [_axis(node, v, x.ndim, "axes") for v in axes]
    if len(pads) != 2 * len(axes):
        raise GraphError(node.where, f"pads {pads} for axes {axes}; expected {2 * len(axes)} values")
    width = [(0, 0)] * x.ndim
    for j, ax in enumerate(axes):
        width[ax] = (pads[j], pads[j + len(axes)])
    crop = tuple(slice(max(-b, 0), x.shape[i] - max(-e, 0)) for i, (b, e) in enumerate(width))
    x = x[crop]
    width = [(max(b, 0), max(e, 0)) for b, e in width]
    _check_size(node, [n + b + e for n, (b, e) in zip(x.shape, width)])
    if mode == "constant":
        v = ins[2] if len(ins) > 2 and ins[2] is not None and np.asarray(ins[2]).size else 0
        return [np.pad(x, width, mode="constant", constant_values=np.asarray(v).reshape(-1)[0] if np.size(v)
                       else 0)]
    if mode not in ("edge", "reflect", "wrap"):
        raise GraphError(node.where, f"Pad mode {mode!r}; expected constant, edge, reflect or wrap")
    if x.size == 0 and any(b or e for b, e in width):
        raise GraphError(node.where, f"Pad mode {mode!r} of an empty tensor {x.shape}")
    return [np.pad(x, width, mode=mode)]


def _constant(node, ins, a):
    if len(a) != 1:
        raise GraphError(node.where, f"Constant has attributes {sorted(a)}; expected exactly one value attribute")
    (k, v), = a.items()
    if k == "value":
        return [tensor_to_array(node, v)]
    if k == "sparse_value":
        return [sparse_to_array(node, v)]
    if k == "value_float":
        return [np.array(v, np.float32)]
    if k == "value_floats":
        return [np.array(list(v), np.float32)]
    if k == "value_int":
        return [np.array(v, np.int64)]
    if k == "value_ints":
        return [np.array(list(v), np.int64)]
    if k == "value_string":          # kept as a value; any converter given a string refuses it
        return [np.array(v.decode() if isinstance(v, bytes) else v, dtype=object)]
    if k == "value_strings":
        return [np.array([s.decode() if isinstance(s, bytes) else s for s in v], dtype=object)]
    raise GraphError(node.where, f"Constant attribute '{k}' is not a value attribute")


def _shape(node, ins, a):
    shape = np.array(ins[0].shape, np.int64)
    r = len(shape)
    start, end = a.get("start", 0), a.get("end", r)
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    return [shape[start:end]]


def _gather(node, ins, a):
    data, idx = ins[0], np.asarray(ins[1])
    if idx.dtype.kind not in "iu":
        raise GraphError(node.where, f"Gather indices have dtype {idx.dtype}; expected int32/int64")
    if data.ndim == 0:
        raise GraphError(node.where, "Gather data is a scalar; expected rank >= 1")
    ax = _axis(node, a.get("axis", 0), data.ndim)
    n = data.shape[ax]
    if ((idx < -n) | (idx >= n)).any():
        raise GraphError(node.where, f"Gather indices {idx.reshape(-1).tolist()[:8]} out of range for "
                                     f"axis {ax} of size {n}")
    return [np.take(data, np.where(idx < 0, idx + n, idx), axis=ax)]


def _concat(node, ins, a):
    arrs = [np.asarray(x) for x in ins]
    r = arrs[0].ndim
    ax = _axis(node, a["axis"], r)
    try:
        return [np.concatenate(arrs, axis=ax)]
    except ValueError as e:
        raise GraphError(node.where, f"Concat of shapes {[x.shape for x in arrs]} on axis {ax}: {e}") from e


def _unsqueeze(node, ins, a):
    axes = axes_input(node, ins, a, 1, 13)
    if axes is None:
        raise GraphError(node.where, "Unsqueeze without axes; expected the axes attribute or input")
    return [ins[0].reshape(unsqueeze_shape(node, ins[0].shape, axes))]


def _squeeze(node, ins, a):
    axes = axes_input(node, ins, a, 1, 13)
    return [ins[0].reshape(squeeze_shape(node, ins[0].shape, axes))]


def _cast(node, ins, a):
    to = np_dtype(node, a["to"])
    x = np.asarray(ins[0])
    if x.dtype.kind == "f" and to.kind in "iub" and to != np.bool_ and not np.isfinite(x).all():
        raise GraphError(node.where, f"Cast of a non-finite value to {to}")
    return [x.astype(to)]


def _slice(node, ins, a):
    x = np.asarray(ins[0])
    if node.version < 10:
        starts, ends = list(a["starts"]), list(a["ends"])
        axes, steps = (list(a["axes"]) if "axes" in a else None), None
    else:
        starts, ends = _ints(node, ins[1], "starts"), _ints(node, ins[2], "ends")
        axes = _ints(node, ins[3], "axes") if len(ins) > 3 and ins[3] is not None else None
        steps = _ints(node, ins[4], "steps") if len(ins) > 4 and ins[4] is not None else None
    idx = slice_params(node, x.shape, starts, ends, axes, steps)
    return [x[np.ix_(*[np.array(r, np.int64) for r in idx])] if x.ndim else x]


def _reshape(node, ins, a):
    shape = _ints(node, ins[1], "shape")
    tgt = reshape_target(node, ins[0].shape, shape, bool(a.get("allowzero", 0)))
    return [np.asarray(ins[0]).reshape(tgt)]


def _transpose(node, ins, a):
    x = np.asarray(ins[0])
    perm = list(a.get("perm", range(x.ndim - 1, -1, -1)))
    if sorted(perm) != list(range(x.ndim)):
        raise GraphError(node.where, f"perm {perm} is not a permutation of the {x.ndim} axes")
    return [x.transpose(perm)]


def _constant_of_shape(node, ins, a):
    shape = _ints(node, ins[0], "shape")
    _check_size(node, shape)
    v = tensor_to_array(node, a["value"]) if "value" in a else np.zeros(1, np.float32)
    if v.size != 1:
        raise GraphError(node.where, f"ConstantOfShape value has {v.size} elements; expected 1")
    return [np.full(shape, v.reshape(-1)[0], v.dtype)]


def _range(node, ins, a):
    start, limit, delta = (np.asarray(x) for x in ins)
    if any(x.ndim != 0 for x in (start, limit, delta)):
        raise GraphError(node.where, "Range start/limit/delta must be scalars")
    if delta == 0:
        raise GraphError(node.where, "Range delta is 0; expected non-zero")
    n = max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0)
    _check_size(node, (n,))
    return [(start + np.arange(n, dtype=start.dtype) * delta).astype(start.dtype)]


def _int_div(node, x, y):
    if (y == 0).any():
        raise GraphError(node.where, "integer division by zero in a constant expression")
    q = np.abs(x) // np.abs(y)
    return np.where((x < 0) != (y < 0), -q, q).astype(np.result_type(x, y))


def _binary(fn):
    def fold(node, ins, a):
        x, y = np.asarray(ins[0]), np.asarray(ins[1])
        try:
            np.broadcast_shapes(x.shape, y.shape)
        except ValueError:
            raise GraphError(node.where, f"operand shapes {x.shape} and {y.shape} do not broadcast") from None
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return [np.asarray(fn(node, x, y))]
    return fold


def _mod(node, x, y):
    """Mod of constants: fmod=1 C's fmod (the sign of x), fmod=0 the divisor's sign (integers; a float needs
    fmod=1 by the spec)."""
    if node.attrs.get("fmod", 0) not in (0, 1):
        raise GraphError(node.where, f"attribute fmod={node.attrs.get('fmod')!r}; expected 0 or 1")
    if not node.attrs.get("fmod", 0) and (x.dtype.kind == "f" or y.dtype.kind == "f") and node.version < 28:
        raise GraphError(node.where, f"Mod of a float tensor with fmod=0; Mod-{node.version} requires fmod=1 for "
                                     f"floats")
    if x.dtype.kind in "iu" and (y == 0).any():
        raise GraphError(node.where, "integer Mod by 0")
    return np.fmod(x, y) if node.attrs.get("fmod", 0) else np.mod(x, y)


def _div(node, x, y):
    if x.dtype.kind in "iu":
        return _int_div(node, x, y)
    return (x / y).astype(x.dtype)


def _unary(fn):
    def fold(node, ins, a):
        with np.errstate(all="ignore"):      # (log(0), 1 / 0, exp overflow: as the ops compute them)
            return [np.asarray(fn(np.asarray(ins[0]))).astype(np.asarray(ins[0]).dtype)]
    return fold


def _expand(node, ins, a):
    shape = _ints(node, ins[1], "shape")
    try:
        out = np.broadcast_shapes(ins[0].shape, tuple(shape))
    except ValueError:
        raise GraphError(node.where, f"Expand of {ins[0].shape} to {shape}: shapes do not broadcast") from None
    _check_size(node, out)
    return [np.broadcast_to(ins[0], out).copy()]


def _tile(node, ins, a):
    x = np.asarray(ins[0])
    reps = _ints(node, ins[1], "repeats")
    if len(reps) != x.ndim or min(reps, default=0) < 0:
        raise GraphError(node.where, f"Tile of {x.shape} by repeats {list(reps)}; expected {x.ndim} repeats, each >= 0")
    _check_size(node, [d * r for d, r in zip(x.shape, reps)])
    return [np.tile(x, tuple(int(r) for r in reps))]


def _affine_grid(node, ins, a):
    """AffineGrid (20) of a constant 2-D theta (N, 2, 3): ATen's base grid times theta transposed, (N, H, W, 2)."""
    from ...kernels.reference import affine_grid_base
    theta = np.asarray(ins[0])
    size = _ints(node, ins[1], "size")
    if len(size) != 4 or theta.shape != (size[0], 2, 3) or min(size[2:]) < 1 or theta.dtype.kind != "f":
        raise GraphError(node.where, f"AffineGrid of theta {theta.shape} ({theta.dtype}) for size {list(size)}; "
                                     f"expected a float theta (N, 2, 3) and a 4-element size (N, C, H, W), H, W >= 1")
    n, _, h, w = (int(v) for v in size)
    _check_size(node, [n, h, w, 2])
    ac = a.get("align_corners", 0)
    if ac not in (0, 1):
        raise GraphError(node.where, f"align_corners={ac!r}; expected 0 or 1")
    base = affine_grid_base(h, w, bool(ac), theta.dtype)                       # (1, H W, 3)
    return [np.matmul(base, theta.transpose(0, 2, 1)).reshape(n, h, w, 2)]    # (N, H W, 2) -> (N, H, W, 2)


def _cumsum(node, ins, a):
    """CumSum (11, 14) of a constant: kernels/reference.py cumsum (integers in their own dtype)."""
    from ...kernels.reference import cumsum
    x, axis = np.asarray(ins[0]), _cumsum_axis(node, ins[1], np.asarray(ins[0]).ndim)
    return [cumsum(x, axis, bool(a.get("exclusive", 0)), bool(a.get("reverse", 0)))]


def _cumsum_axis(node, v, rank) -> int:
    """CumSum's axis input: one integer in [-rank, rank)."""
    v = np.asarray(v)
    if v.size != 1 or v.dtype.kind not in "iu":
        raise GraphError(node.where, f"CumSum axis {v.tolist()} ({v.dtype}); expected one int32 / int64 value")
    return _axis(node, int(v.reshape(-1)[0]), rank, "axis")


def _where(node, ins, a):
    c, x, y = (np.asarray(v) for v in ins)
    if c.dtype != np.bool_:
        raise GraphError(node.where, f"Where condition has dtype {c.dtype}; expected bool")
    return [np.where(c, x, y)]


def _variadic(fn):
    def fold(node, ins, a):
        out = np.asarray(ins[0])
        for x in ins[1:]:
            out = fn(out, np.asarray(x))
        return [out]
    return fold


FOLD = {
    "Constant": _constant,
    "Identity": lambda node, ins, a: [ins[0]],
    "Shape": _shape,
    "Size": lambda node, ins, a: [np.array(int(np.prod(ins[0].shape)), np.int64)],
    "Gather": _gather,
    "Concat": _concat,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Cast": _cast,
    "CastLike": lambda node, ins, a: [np.asarray(ins[0]).astype(np.dtype(ins[1].dtype))],
    "Slice": _slice,
    "Reshape": _reshape,
    "Transpose": _transpose,
    "ConstantOfShape": _constant_of_shape,
    "Range": _range,
    "Expand": _expand,
    "Tile": _tile,
    "AffineGrid": _affine_grid,
    "CumSum": _cumsum,
    "Where": _where,
    "Add": _binary(lambda n, x, y: x + y),
    "Sub": _binary(lambda n, x, y: x - y),
    "Mul": _binary(lambda n, x, y: x * y),
    "Div": _binary(_div),
    "Mod": _binary(_mod),
    "Equal": _binary(lambda n, x, y: x == y),
    "Less": _binary(lambda n, x, y: x < y),
    "Greater": _binary(lambda n, x, y: x > y),
    "GreaterOrEqual": _binary(lambda n, x, y: x >= y),
    "LessOrEqual": _binary(lambda n, x, y: x <= y),
    "And": _binary(lambda n, x, y: np.logical_and(x, y)),
    "Or": _binary(lambda n, x, y: np.logical_or(x, y)),
    "Sign": _unary(np.sign),
    "Min": _variadic(np.minimum),
    "Max": _variadic(np.maximum),
    "Neg": _unary(np.negative),
    "Abs": _unary(np.abs),
    "Floor": _unary(np.floor),
    "Ceil": _unary(np.ceil),
    "Sqrt": _unary(np.sqrt),
    "Reciprocal": _unary(lambda v: 1 / v),
    "Exp": _unary(np.exp),
    "Sin": _unary(np.sin),
    "Cos": _unary(np.cos),
    "Tan": _unary(np.tan),
    "Atan": _unary(np.arctan),
    "Tanh": _unary(np.tanh),
    "Sigmoid": _unary(lambda v: 1 / (1 + np.exp(-v))),
    "Round": _unary(np.round),
    "Log": _unary(np.log),
    "Pow": _binary(lambda n, x, y: np.power(x.astype(np.float64), y).astype(x.dtype)),
    "Not": lambda node, ins, a: [np.logical_not(ins[0])],
    "ReduceProd": _reduce(np.prod, 18),
    "ReduceMax": _reduce(np.max, 18),
    "ReduceMin": _reduce(np.min, 18),
    "ReduceSum": _reduce(np.sum, 13),
    "Pad": _pad_fold,
}
"""ONNX op -> numpy folder; the ops whose constant-only nodes the importer evaluates."""

# Inputs a folder reads only the static shape or dtype of: a computed tensor there still folds.
META_INPUTS = {"Shape": (0,), "Size": (0,), "CastLike": (1,)}

# Attributes each folder reads; any other attribute on a folded node is refused by name.
FOLD_ATTRS = {
    "Constant": {"value", "sparse_value", "value_float", "value_floats", "value_int", "value_ints",
                 "value_string", "value_strings"},
    "Shape": {"start", "end"}, "Gather": {"axis"}, "Concat": {"axis"}, "Unsqueeze": {"axes"},
    "Squeeze": {"axes"}, "Cast": {"to", "saturate", "round_mode"}, "CastLike": {"saturate", "round_mode"}, "Slice": {"starts", "ends", "axes"},
    "Reshape": {"allowzero"}, "Transpose": {"perm"}, "ConstantOfShape": {"value"}, "Range": {"stash_type"},
    "ReduceProd": {"axes", "keepdims", "noop_with_empty_axes"}, "ReduceMax": {"axes", "keepdims", "noop_with_empty_axes"},
    "ReduceMin": {"axes", "keepdims", "noop_with_empty_axes"}, "ReduceSum": {"axes", "keepdims", "noop_with_empty_axes"},
    "Pad": {"mode"}, "AffineGrid": {"align_corners"},
    "CumSum": {"exclusive", "reverse"}, "Mod": {"fmod"},
}
