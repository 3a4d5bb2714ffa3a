"""ONNX import: `from_onnx(model_or_path) -> Network`.

The model is read with the `onnx` package (protobuf, never pickle) and checked with
`onnx.checker`; then each node, in order:

  * constant-only nodes (all inputs initializers, `Constant`s or folded values; `Shape`/`Size` of
    any tensor, whose shape is static) are evaluated in numpy (`fold.py`): exporters' shape
    arithmetic (`Shape -> Gather -> Unsqueeze -> Concat -> Reshape`), `Identity` on shared
    initializers, `Cast`, `Range`, `ConstantOfShape`, ... never reach the network;
  * chains that older opsets use to spell LayerNorm and GELU are recognized as those ops
    (`patterns.py`);
  * every other node is translated by its row of the op table (`convert.RULES`), for the op's
    version in the model's default-domain (`''`/`ai.onnx`) opset.

Nodes no graph output depends on are not imported.

Anything else (an op outside the table, an op version, attribute or mode the converter does not
implement, a training-mode node) raises UnsupportedOpError naming the node, the op and version,
and what was expected; a malformed model raises GraphError. Shapes the model declares for
outputs and intermediate tensors are checked against the shapes tilefuse infers.

Graph inputs that are not initializers become network inputs, in order; they need static shapes
(`input_shapes` fixes symbolic dimensions). `constants` binds graph inputs to fixed values (an
integer "shape" input, a weight fed as an input). `onnx` is imported here only; it is not a
runtime dependency.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ...compiler.compile import check_fits_host
from ...errors import GraphError, TilefuseError, UnsupportedOpError
from ...ir import Network
from ...ir.node import DataNode
from .. import boolexpr
from . import fold, patterns
from .convert import RULES, Ctx, OnnxNode, Sequence

__all__ = ["from_onnx", "RULES", "claimed_ops"]

_FLOAT_INPUTS = (np.float32, np.float64, np.float16)
# the attributes that are 0 / 1 switches; any other value is refused by name
FLAGS = frozenset({"allowzero", "antialias", "ceil_mode", "count_include_pad", "exclude_outside", "keepdims",
                   "noop_with_empty_axes", "saturate", "spatial", "storage_order", "training_mode", "transA",
                   "transB"})


def claimed_ops() -> list[str]:
    """The ONNX op types the importer implements (converted, or folded when constant-only)."""
    return sorted(set(RULES) | set(fold.FOLD))


def _load(model):
    import onnx
    if isinstance(model, (str, Path)):
        try:
            return onnx.load(str(model))
        except Exception as e:
            raise GraphError(str(model), f"cannot read ONNX model: {e}") from e
    if isinstance(model, (bytes, bytearray)):
        try:
            return onnx.load_from_string(bytes(model))
        except Exception as e:
            raise GraphError("<bytes>", f"not a valid ONNX model: {e}") from e
    if not isinstance(model, onnx.ModelProto):
        raise GraphError("from_onnx", f"got {type(model).__name__}; expected an onnx.ModelProto, a path "
                                      f"or bytes")
    return model


def default_opset(model) -> int:
    """The opset version of the default ONNX domain ('' or 'ai.onnx'), wherever it is listed."""
    vs = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not vs:
        found = [(o.domain, o.version) for o in model.opset_import]
        raise GraphError(model.graph.name or "onnx", f"opset_import {found} has no entry for the default "
                                                     f"domain ''; expected one")
    import onnx
    newest = onnx.defs.onnx_opset_version()
    if not 1 <= vs[0] <= newest:       # a newer opset's ops may mean something the importer does not know
        raise GraphError(model.graph.name or "onnx", f"opset {vs[0]} of the default domain; expected 1 to "
                                                     f"{newest} (the newest onnx {onnx.__version__} defines)")
    return int(vs[0])


def _elem_name(elem_type: int) -> str:
    from onnx import TensorProto
    try:
        return TensorProto.DataType.Name(elem_type)
    except ValueError:
        return str(elem_type)


def _declared(vi):
    """(numpy dtype or None, dims with None for symbolic) of a tensor ValueInfo; None if not a tensor."""
    if not vi.type.HasField("tensor_type"):
        return None
    tt = vi.type.tensor_type
    try:
        dt = fold.np_dtype(OnnxNode(vi.name, "value", 0, [], [], {}), tt.elem_type)
    except UnsupportedOpError:
        dt = None
    dims = None
    if tt.HasField("shape"):
        dims = [int(d.dim_value) if d.HasField("dim_value") else None for d in tt.shape.dim]
    return dt, dims


def _check_without_group_norm_18(onnx, model, gname) -> None:
    """The checker on a copy with each GroupNormalization an Identity of its input: files from opset 18-20
    carry GroupNormalization-18 (scale and bias per group), which onnx >= 1.16 marks deprecated and its checker
    refuses, while ONNX Runtime runs it; the importer converts it (`convert._group_norm`), the rest is checked."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for nd in m.graph.node:
        if nd.op_type == "GroupNormalization" and nd.domain in ("", "ai.onnx"):
            inp, out = (nd.input[0] if len(nd.input) else ""), list(nd.output)    # none: the checker says so
            nd.Clear()
            nd.op_type, nd.name = "Identity", "group_norm_18_checked_as_identity"
            nd.input.append(inp)
            nd.output.extend(out)
    try:
        onnx.checker.check_model(m)
    except Exception as e:
        raise GraphError(gname, f"ONNX checker rejected the model: {e}") from e


def from_onnx(model, input_shapes: dict | None = None, name: str | None = None,
              constants: dict | None = None) -> Network:
    """Import an ONNX model (a ModelProto, a path, or bytes) as a tilefuse Network.

    input_shapes: {input name: shape} for inputs with symbolic dimensions.
    constants: {input name: array} binds graph inputs to constant values.
    """
    try:
        import onnx
    except ImportError as e:  # pragma: no cover
        raise ImportError("tilefuse.from_onnx needs the onnx package (pip install onnx)") from e
    model = _load(model)
    gname = model.graph.name or "onnx"
    try:
        onnx.checker.check_model(model)
    except Exception as e:
        if "GroupNormalization is deprecated" not in str(e):
            raise GraphError(gname, f"ONNX checker rejected the model: {e}") from e
        _check_without_group_norm_18(onnx, model, gname)
    opset = default_opset(model)
    g = model.graph
    cx = Ctx(Network(name or g.name or "onnx_model"))
    where = OnnxNode(gname, "graph", opset, [], [], {})
    for t in g.initializer:
        cx.consts[t.name] = fold.tensor_to_array(where, t)
    for sp in g.sparse_initializer:
        cx.consts[sp.values.name] = fold.sparse_to_array(where, sp)

    input_shapes, constants = dict(input_shapes or {}), dict(constants or {})
    graph_inputs = [vi.name for vi in g.input if vi.name not in cx.consts]
    extra = sorted((set(input_shapes) | set(constants)) - set(graph_inputs))
    if extra:
        raise GraphError(gname, f"input_shapes/constants name {extra}, which are not graph inputs; graph "
                                f"inputs are {graph_inputs}")
    overridden = False
    floats = [d[0] for d in (_declared(vi) for vi in g.input if vi.name not in cx.consts and vi.name not in constants)
              if d is not None and d[0] in _FLOAT_INPUTS]
    float_dt = floats[0] if floats else np.dtype(np.float32)       # what an integer input computes as
    for vi in g.input:
        if vi.name in cx.consts:
            continue
        decl = _declared(vi)
        if decl is None:
            raise UnsupportedOpError(f"input '{vi.name}' is a {vi.type.WhichOneof('value')}; expected a tensor")
        dt, dims = decl
        if vi.name in constants:
            arr = np.asarray(constants[vi.name])
            if dt is not None and arr.dtype != dt:
                raise GraphError(vi.name, f"constants value has dtype {arr.dtype}; the model declares {dt}")
            if dims is not None and (len(dims) != arr.ndim or any(d is not None and d != s
                                                                   for d, s in zip(dims, arr.shape))):
                raise GraphError(vi.name, f"constants value has shape {arr.shape}; the model declares {dims}")
            cx.consts[vi.name] = arr
            continue
        integer = dt is not None and np.dtype(dt).kind in "iu"
        if dt not in _FLOAT_INPUTS and not integer:
            raise UnsupportedOpError(
                f"input '{vi.name}' has element type {_elem_name(vi.type.tensor_type.elem_type)}; tilefuse "
                f"computes float32/float64/float16 tensors (bind a fixed value with constants={{'{vi.name}': "
                f"array}})")
        shape = input_shapes.get(vi.name)
        if shape is None:
            if dims is None or any(d is None for d in dims):
                raise GraphError(vi.name, f"input has a symbolic shape {dims}; pass "
                                          f"input_shapes={{'{vi.name}': (N, C, H, W)}}")
            shape = dims
        else:
            shape = tuple(int(s) for s in shape)
            if dims is None or len(dims) != len(shape):
                raise GraphError(vi.name, f"input_shapes gives {shape}; the model declares {dims}")
            overridden |= any(d is not None and d != s for d, s in zip(dims, shape))
        if integer:         # timesteps, a class index: computed as the network's float, moved until a Cast
            cx.env[vi.name] = cx.net.input(cx.fresh(vi.name), tuple(shape), float_dt, integer=dt)
            cx.ints.add(vi.name)
        else:
            cx.env[vi.name] = cx.net.input(cx.fresh(vi.name), tuple(shape), dt)
        check_fits_host(vi.name, tuple(shape), dt)  # before any constant is made to its size

    nodes = _live(_recognize(cx, g, input_shapes), [o.name for o in g.output])
    used = {t for n in nodes for t in n.input} | {o.name for o in g.output}
    for i, n in enumerate(nodes):
        _import_node(cx, n, i, opset, used)

    outs = []
    for vi in g.output:
        d = cx.env.get(vi.name)
        if d is None:
            if vi.name in cx.consts:
                raise UnsupportedOpError(f"graph output '{vi.name}' is a constant (its subgraph depends on no "
                                         f"graph input); expected a computed tensor")
            raise GraphError(vi.name, "graph output is not produced by any node")
        if isinstance(d, boolexpr.BOOL):
            raise UnsupportedOpError(f"graph output '{vi.name}' is the bool tensor of a comparison "
                                     f"({boolexpr.leaf(d).origin}); tilefuse computes float tensors")
        if isinstance(d, Sequence):
            raise UnsupportedOpError(f"graph output '{vi.name}' is a sequence of {len(d)} tensors; tilefuse returns "
                                     f"tensors (SequenceAt / ConcatFromSequence read a sequence)")
        if d.producer is None:
            raise UnsupportedOpError(f"graph output '{vi.name}' is the graph input '{d.name}' passed through; "
                                     f"expected a computed tensor")
        if any(d is o for o in outs):
            raise UnsupportedOpError(f"graph output '{vi.name}' is the same tensor as an earlier output; "
                                     f"expected distinct outputs")
        outs.append(d)
    if not overridden:
        _check_declared(cx, list(g.value_info) + list(g.output), {t: n for n in nodes for t in n.output},
                        {o.name for o in g.output})
    for vi, d in zip(g.output, outs):
        # integer values (an ArgMax, an integer input moved) are returned in the dtype the model declares
        cx.net.output(d, integer=_declared_integer(vi) if vi.name in cx.ints else None)
    return cx.net


def _declared_integer(vi):
    """The integer dtype a graph output declares (int64 where it declares none or a float)."""
    decl = _declared(vi)
    dt = np.dtype(decl[0]) if decl is not None and decl[0] is not None else None
    return dt if dt is not None and dt.kind in "iu" else np.int64


def _live(nodes, outputs) -> list:
    """The nodes the graph outputs depend on, in order (dead nodes are never imported)."""
    need, keep = set(outputs), []
    for n in reversed(nodes):
        if any(o in need for o in n.output if o):
            keep.append(n)
            need.update(t for t in n.input if t)
    return keep[::-1]


def _recognize(cx: Ctx, g, input_shapes) -> list:
    """The graph's nodes with decomposed GELU / LayerNorm chains replaced (patterns.py)."""
    from onnx import helper
    constant_nodes = {n.output[0]: n for n in g.node
                      if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.output) == 1}
    ranks = {vi.name: len(vi.type.tensor_type.shape.dim) for vi in list(g.input) + list(g.value_info)
             if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")}
    ranks.update({k: len(v) for k, v in input_shapes.items()})

    def const(name):
        if name in cx.consts:
            return cx.consts[name]
        n = constant_nodes.get(name)
        if n is None:
            return None
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        try:
            return fold.FOLD["Constant"](OnnxNode(n.name, "Constant", 0, [], [], attrs), [], attrs)[0]
        except TilefuseError:
            return None
    return patterns.rewrite(g.node, const, ranks.get, [o.name for o in g.output])


def _check_empty_inputs(nd: OnnxNode, schema) -> None:
    """An empty input name '' in a variadic input (Concat(x, x, ''), Sum('', a, b)) is an error ONNX Runtime
    reports too, where skipping it computed another graph. ('' for a Single input is left to the converters:
    Resize-11 files from some converters leave out `roi` that way, and ONNX Runtime runs them.)"""
    import onnx
    formals = schema.inputs
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    for i, t in enumerate(nd.inputs):
        if t or not formals:
            continue
        f = formals[min(i, len(formals) - 1)]
        if f.option == variadic:
            raise GraphError(nd.where, f"input {i} is the empty name ''; {nd.op}-{nd.version}'s input '{f.name}' "
                                       f"is variadic, not optional: expected a tensor name")


def _import_node(cx: Ctx, n, i: int, opset: int, used: set[str]) -> None:
    import onnx
    from onnx import helper
    name = n.name or f"{n.op_type}_{i}"
    if n.domain == patterns.DOMAIN:      # a recognized chain: the op it spells, at that op's version
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        nd = OnnxNode(name, n.op_type, RULES[n.op_type].versions[-1], list(n.input), list(n.output), attrs)
        cx.env[n.output[0]] = RULES[n.op_type].convert(cx, nd, used)
        return
    if n.domain not in ("", "ai.onnx"):
        raise UnsupportedOpError(f"ONNX op '{n.domain}::{n.op_type}' in node '{name}' is not supported; "
                                 f"tilefuse imports the default ONNX domain only")
    if n.op_type not in RULES and n.op_type not in fold.FOLD:
        raise UnsupportedOpError(f"ONNX op '{n.op_type}' in node '{name}' is not supported; supported: "
                                 f"{', '.join(sorted(RULES))} (and, on constants, {', '.join(sorted(fold.FOLD))})")
    try:
        schema = onnx.defs.get_schema(n.op_type, opset, "")
    except Exception:
        raise UnsupportedOpError(f"ONNX op '{n.op_type}' in node '{name}' is not defined in opset {opset}") \
            from None
    version = schema.since_version
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    nd = OnnxNode(name, n.op_type, version, list(n.input), list(n.output), attrs)
    _check_empty_inputs(nd, schema)
    for k in sorted(FLAGS & attrs.keys()):
        if type(attrs[k]) is not int or attrs[k] not in (0, 1):
            raise GraphError(nd.where, f"attribute {k}={attrs[k]!r}; expected 0 or 1")
    ins = list(n.input)
    ints = [t for t in ins if t in cx.ints]
    counting = bool(ints) and n.op_type in _COUNTERS and ins[0] in cx.counts and \
        all(t in cx.counts or t in cx.consts for t in ins[1:] if t)
    if ints and not counting and _integer_use(cx, nd, ints):
        return
    meta = fold.META_INPUTS.get(n.op_type, ())
    try:
        if n.op_type in fold.FOLD and all(t in cx.consts or (i in meta and t in cx.env)
                                          for i, t in enumerate(ins) if t):
            unknown = sorted(set(attrs) - fold.FOLD_ATTRS.get(n.op_type, set()))
            if unknown:
                raise nd.refuse(f"attribute(s) {unknown} are not supported when folding constants")
            # a computed tensor in a metadata input is passed as its DataNode (shape and dtype only)
            vals = [None if not t else cx.consts[t] if t in cx.consts else cx.env[t] for t in ins]
            for t, v in zip(n.output, fold.FOLD[n.op_type](nd, vals, attrs)):
                if t:
                    cx.consts[t] = np.asarray(v)
            return
        rule = RULES.get(n.op_type)
        if rule is None:
            raise nd.refuse(f"tilefuse folds {n.op_type} on constants only, and input(s) "
                            f"{[t for t in ins if t and t not in cx.consts]} are computed by the graph")
        if version not in rule.versions:
            raise nd.refuse(f"version {version} (opset {opset}) is not supported; the importer implements "
                            f"{n.op_type} versions {list(rule.versions)}")
        unknown = sorted(set(attrs) - rule.attrs)
        if unknown:
            raise nd.refuse(f"attribute(s) {unknown} are not supported; {n.op_type} reads "
                            f"{sorted(rule.attrs) or 'no attributes'}")
        if ins and ins[0] in cx.consts and all(not t or t in cx.consts for t in ins):
            _evaluate_constant_node(cx, nd, rule, used)
            return
        outs = rule.convert(cx, nd, used)
    except TilefuseError:
        raise
    except Exception as e:   # an importer bug or a malformed value: name the node, keep the cause
        raise GraphError(nd.where, f"import failed: {type(e).__name__}: {e}") from e
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    for k, t in enumerate(n.output):
        if k < len(outs):
            cx.env[t] = outs[k]
            if ints and (n.op_type in _INT_MOVES or counting):
                cx.ints.add(t)
                if counting or all(i in cx.counts for i in ints):
                    cx.counts.add(t)
        elif t and t in used:
            raise nd.refuse(f"output {k} '{t}' is used, but tilefuse produces only the first {len(outs)} "
                            f"output(s) of {n.op_type}")


def _evaluate_constant_node(cx: Ctx, nd: OnnxNode, rule, used) -> None:
    """A constant-only node of an op the importer converts but `fold.py` does not evaluate (the TorchScript exporter
    leaves EdgeNeXt's Fourier position encoding, a function of the input's shape only, as ConstantOfShape ...
    Conv): converted in a scratch network whose one input is input 0's value, run by the reference evaluator, its
    outputs constants. Input 0 must be a float tensor (the other inputs stay the constants the converter reads)."""
    from ...interpreter import evaluate
    x0 = np.asarray(cx.consts[nd.inputs[0]])
    if x0.dtype.kind != "f" or x0.ndim == 0:
        raise nd.refuse(f"input '{nd.inputs[0]}' is a constant of dtype {x0.dtype}, shape {x0.shape}; tilefuse "
                        f"evaluates a constant-only {nd.op} of a float tensor only")
    sub = Ctx(Network(f"{nd.name}.fold"))
    sub.consts = {k: v for k, v in cx.consts.items() if k != nd.inputs[0]}
    sub.env[nd.inputs[0]] = d = sub.net.input(sub.fresh("x"), x0.shape, x0.dtype)
    outs = rule.convert(sub, nd, used)
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    nodes = [o for o in outs if isinstance(o, DataNode) and o is not d]
    if any(not isinstance(o, DataNode) for o in outs):
        raise nd.refuse(f"a constant-only {nd.op} whose result is not a tensor (a comparison) cannot be evaluated")
    if nodes:
        sub.net.output(*nodes)
    vals = iter(evaluate(sub.net, x0) if nodes else [])
    for t, o in zip(nd.outputs, outs):
        if t:
            v = x0 if o is d else np.asarray(next(vals))
            fold._check_size(nd, v.shape)
            cx.consts[t] = v


# ops that move an integer input's values without computing with them (their outputs stay integer-valued); the
# values leave the integers through a Cast to the float dtype, or a comparison (exact in float for |v| <= 2^24)
_INT_MOVES = frozenset({"Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity", "Slice", "Expand", "Concat",
                        "Transpose", "Split", "Tile", "Gather"})
_INT_READERS = frozenset({"Shape", "Size", "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"})
# sums of a bool's 1 / 0 (cx.counts: `(x > t).sum(1)`, a running count), exact in the float up to 2^24 values,
# and their maxima / minima (the dynamo exporter's any / all)
_COUNTERS = frozenset({"ReduceSum", "CumSum", "ReduceMax", "ReduceMin"})


def _take_at_integers(cx: Ctx, nd: OnnxNode) -> None:
    """Gather, GatherElements of a 1-D tensor and GatherND with one index per row (batch_dims 0) at an integer
    input's values: the IR's take (nn.Embedding, `alphas[t]`, `a.gather(-1, t)` as the exporters write them)."""
    known = {"Gather": {"axis"}, "GatherElements": {"axis"}, "GatherND": {"batch_dims"}}[nd.op]
    unknown = sorted(set(nd.attrs) - known)
    if unknown:
        raise nd.refuse(f"attribute(s) {unknown} are not supported; {nd.op} reads {sorted(known)}")
    idx = cx.env[nd.inputs[1]]
    data = cx.env[nd.inputs[0]] if nd.inputs[0] in cx.env else \
        cx.net.constant(cx.fresh(nd.inputs[0]), cx.consts[nd.inputs[0]], dtype=idx.dtype)
    axis = int(nd.attrs.get("axis", 0))
    if nd.op == "GatherElements" and (len(data.shape) != 1 or len(idx.shape) != 1):
        raise nd.refuse(f"GatherElements of a {len(data.shape)}-D tensor at an integer input's values; tilefuse "
                        f"takes 1-D data and indices (a.gather(-1, t))")
    if nd.op == "GatherND":
        if nd.attrs.get("batch_dims", 0) != 0 or len(idx.shape) < 2 or idx.shape[-1] != 1:
            raise nd.refuse(f"GatherND at an integer input's values of shape {idx.shape} (batch_dims "
                            f"{nd.attrs.get('batch_dims', 0)}); tilefuse takes one index per row (..., 1), batch_dims 0")
        idx = cx.net.reshape(idx, tuple(idx.shape[:-1]), name=cx.fresh(nd.name + ".indices"))
        axis = 0
    cx.env[nd.outputs[0]] = cx.net.take(data, idx, axis=axis, name=cx.fresh(nd.name))
    if nd.inputs[0] in cx.ints:
        cx.ints.add(nd.outputs[0])


def _integer_use(cx: Ctx, nd: OnnxNode, ints: list[str]) -> bool:
    """A node reading an integer input's values (cx.ints): a Cast to the float dtype or to a 32 / 64-bit integer is
    the identity on the float tensor (True: done here); a move or a comparison imports as usual (False); integer
    arithmetic (Add, Div: integer division) is refused by name; a Gather at them is the IR's take (a table read at
    run-time indices, True)."""
    if nd.op in ("Cast", "CastLike"):
        src = cx.env[nd.inputs[0]]
        if nd.op == "CastLike":
            to = np.dtype(cx.consts[nd.inputs[1]].dtype if cx.is_const(nd, 1) else cx.computed(nd, 1).dtype)
        else:
            to = fold.np_dtype(nd, nd.attrs["to"])
        if to.kind in "iu" and to.itemsize >= 4:
            cx.env[nd.outputs[0]] = src
            cx.ints.add(nd.outputs[0])
            return True
        if to == np.dtype(np.bool_):      # v != 0 (the dynamo exporter's any / all: ReduceMax of a 1 / 0, then bool)
            cx.env[nd.outputs[0]] = boolexpr.Cmp(src, "ne", cx.const_node(nd.name + ".zero", np.zeros(1, src.dtype),
                                                                          src.dtype), nd.where)
            return True
        if to != np.dtype(src.dtype):
            raise nd.refuse(f"Cast of the integer tensor '{nd.inputs[0]}' (an integer input's values) to {to}; "
                            f"expected {np.dtype(src.dtype)} (what the network computes) or a 32 / 64-bit integer")
        cx.env[nd.outputs[0]] = src
        return True
    if nd.op in ("Gather", "GatherElements", "GatherND") and nd.has(1) and nd.inputs[1] in cx.ints:
        _take_at_integers(cx, nd)      # a table read at run-time indices
        return True
    if nd.op not in _INT_MOVES and nd.op not in _INT_READERS:
        raise nd.refuse(f"{nd.op} of the integer tensor '{ints[0]}' (an integer input's values): integer "
                        f"arithmetic; tilefuse computes in floats and takes an integer input through reshapes, "
                        f"slices, comparisons and a Cast to float: Cast it first")
    return False


def _check_declared(cx: Ctx, infos, producers: dict, outputs: set) -> None:
    """Shapes and dtypes the model declares (value_info, outputs) must equal the imported ones. (ONNX Runtime
    only warns and runs with the computed shape; a declaration that disagrees with the graph's own ops is a
    broken export, e.g. the TorchScript exporter's output shapes after padded pools, so tilefuse refuses it and
    says where.)"""
    for vi in infos:
        d = cx.env.get(vi.name)
        decl = _declared(vi)
        if d is None or decl is None or isinstance(d, boolexpr.BOOL) or vi.name in cx.ints:
            continue          # (a comparison's bool: no tensor; an integer input's values: declared integer)
        dt, dims = decl
        n = producers.get(vi.name)
        what = (f"{'graph output' if vi.name in outputs else 'value_info'} '{vi.name}'"
                + (f" (output of node '{n.name}', {n.op_type})" if n is not None else ""))
        fix = ("; the graph's ops give the computed one (as ONNX Runtime does): fix or drop the declaration "
               "(or re-export the model)")
        if dims is not None and all(v is not None for v in dims) and tuple(dims) != tuple(d.shape):
            raise GraphError(vi.name, f"{what}: the importer computes shape {d.shape}; the model declares "
                                      f"{tuple(dims)}{fix}")
        et = vi.type.tensor_type.elem_type
        if dt is None and (et != 0 or vi.name in outputs):     # (value_info may leave the type undefined)
            raise GraphError(vi.name, f"{what}: the model declares element type {_elem_name(et)}; the importer "
                                      f"computes {np.dtype(d.dtype)}{fix}")
        if dt is not None and np.dtype(dt) != np.dtype(d.dtype):
            raise GraphError(vi.name, f"{what}: the importer computes dtype {np.dtype(d.dtype)}; the model "
                                      f"declares {np.dtype(dt)}{fix}")
