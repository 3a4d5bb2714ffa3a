"""ONNX import: `from_onnx(model_or_path) -> Network`.

The model is read with the `onnx` package (protobuf, never pickle), checked with
`onnx.checker`, and each node is translated to the op vocabulary:

  Conv, BatchNormalization, Relu, MaxPool, AveragePool, GlobalAveragePool, Gemm, MatMul (with
  a constant right operand), Add, Flatten, Softmax, LRN, Concat, Dropout, Identity, Reshape
  (flattening the trailing dimensions only)

Initializers become bound constants under their ONNX names. Graph inputs that are not
initializers become network inputs, in order; they need static shapes (pass `input_shapes`
to fix a symbolic batch dimension). Anything else raises UnsupportedOpError naming the op
type and the node. `onnx` is imported here only; it is not a runtime dependency.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import GraphError, UnsupportedOpError
from ..ir import Network

_ELEM = {1: np.float32, 11: np.float64, 10: np.float16}


def _attrs(node) -> dict:
    import onnx
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _pads(node, attrs, spatial=2):
    if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise UnsupportedOpError(f"node '{node.name}' ({node.op_type}): auto_pad="
                                 f"{attrs['auto_pad']!r} is not supported; expected explicit pads")
    p = list(attrs.get("pads", [0] * 2 * spatial))
    # ONNX: (top, left, bottom, right) -> tilefuse (top, bottom, left, right)
    return (p[0], p[2], p[1], p[3])


def from_onnx(model, input_shapes: dict | None = None, name: str | None = None) -> Network:
    """Import an ONNX model (a ModelProto, a path, or bytes) as a tilefuse Network."""
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError as e:  # pragma: no cover
        raise ImportError("tilefuse.from_onnx needs the onnx package (pip install onnx)") from e
    if isinstance(model, (str, Path)):
        try:
            model = onnx.load(str(model))
        except Exception as e:
            raise GraphError(str(model), f"cannot read ONNX model: {e}") from e
    elif isinstance(model, (bytes, bytearray)):
        try:
            model = onnx.load_from_string(bytes(model))
        except Exception as e:
            raise GraphError("<bytes>", f"not a valid ONNX model: {e}") from e
    try:
        onnx.checker.check_model(model)
    except Exception as e:
        raise GraphError(model.graph.name or "onnx", f"ONNX checker rejected the model: {e}") from e
    g = model.graph
    net = Network(name or g.name or "onnx_model")
    env: dict = {}
    consts: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    for n in g.node:
        if n.op_type == "Constant":
            consts[n.output[0]] = numpy_helper.to_array(_attrs(n)["value"])
    input_shapes = dict(input_shapes or {})
    for vi in g.input:
        if vi.name in consts:
            continue
        tt = vi.type.tensor_type
        dt = _ELEM.get(tt.elem_type)
        if dt is None:
            raise UnsupportedOpError(f"input '{vi.name}': element type {tt.elem_type} is not supported; "
                                     f"expected float32/float64/float16")
        shape = input_shapes.get(vi.name)
        if shape is None:
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            if any(d is None for d in dims):
                raise GraphError(vi.name, f"input has a symbolic shape {dims}; pass "
                                          f"input_shapes={{'{vi.name}': (N, C, H, W)}}")
            shape = dims
        env[vi.name] = net.input(vi.name, tuple(shape), dt)

    def const(nm: str, node) -> np.ndarray:
        if nm not in consts:
            raise UnsupportedOpError(f"node '{node.name}' ({node.op_type}): operand '{nm}' must be a "
                                     f"constant initializer")
        return consts[nm]

    def cnode(nm: str, dtype, transpose: bool = False):
        """A constant operand as a DataNode (shared if used twice), optionally transposed."""
        key = ("const", nm, transpose)
        if key not in env:
            arr = consts[nm].T if transpose else consts[nm]
            env[key] = net.constant(nm + ("^T" if transpose else ""),
                                    np.ascontiguousarray(arr).astype(dtype))
        return env[key]

    for i, n in enumerate(g.node):
        if n.op_type == "Constant":
            continue
        a = _attrs(n)
        nm = n.name or f"{n.op_type}_{i}"
        ins = [x for x in n.input]
        op = n.op_type
        x = env.get(ins[0]) if ins else None
        if x is None and op not in ("Concat", "Add"):
            raise UnsupportedOpError(f"node '{nm}' ({op}): its data input '{ins[0] if ins else ''}' is not a "
                                     f"computed tensor (a constant-only subgraph is not supported)")
        if op == "Conv":
            w = cnode(ins[1], x.dtype)
            b = cnode(ins[2], x.dtype) if len(ins) > 2 and ins[2] else None
            y = net.conv2d(x, w, b, stride=tuple(a.get("strides", (1, 1))), padding=_pads(n, a),
                           dilation=tuple(a.get("dilations", (1, 1))), groups=a.get("group", 1), name=nm)
        elif op == "BatchNormalization":
            g_, b_, m_, v_ = (cnode(t, x.dtype) for t in ins[1:5])
            y = net.batch_norm(x, g_, b_, m_, v_, eps=a.get("epsilon", 1e-5), name=nm)
        elif op == "Relu":
            y = net.relu(x, name=nm)
        elif op in ("MaxPool", "AveragePool"):
            k = tuple(a["kernel_shape"])
            kw = dict(kernel_size=k, stride=tuple(a.get("strides", k)), padding=_pads(n, a),
                      ceil_mode=bool(a.get("ceil_mode", 0)), name=nm)
            if op == "MaxPool":
                if len(n.output) > 1 and n.output[1]:
                    raise UnsupportedOpError(f"node '{nm}' (MaxPool): the Indices output is not supported")
                y = net.max_pool(x, dilation=tuple(a.get("dilations", (1, 1))), **kw)
            else:
                y = net.avg_pool(x, count_include_pad=bool(a.get("count_include_pad", 0)), **kw)
        elif op == "GlobalAveragePool":
            y = net.global_avg_pool(x, name=nm)
        elif op == "Gemm":
            if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
                raise UnsupportedOpError(f"node '{nm}' (Gemm): only transA=0, alpha=beta=1 are supported")
            const(ins[1], n)
            wn = cnode(ins[1], x.dtype, transpose=not a.get("transB", 0))  # linear wants (out, in)
            b = cnode(ins[2], x.dtype) if len(ins) > 2 and ins[2] else None
            y = net.linear(x, wn, b, name=nm)
        elif op == "MatMul" and ins[1] in consts:
            y = net.linear(x, cnode(ins[1], x.dtype, transpose=True), None, name=nm)
        elif op == "Add" and all(t in env for t in ins):
            y = net.add(env[ins[0]], env[ins[1]], name=nm)
        elif op == "Add" and ins[0] in env and ins[1] in consts and x.producer is not None \
                and x.producer.op == "linear" and not x.producer.params["has_bias"] \
                and consts[ins[1]].shape == (x.shape[1],):
            # MatMul + Add(bias) -> one linear with bias; the bias-less linear is left without
            # users and the compiler's dead-node pass drops it
            lin = x.producer
            y = net.linear(lin.inputs[0], lin.inputs[1], cnode(ins[1], x.dtype), name=nm)
        elif op == "Flatten":
            axis = a.get("axis", 1)
            if axis != 1:
                raise UnsupportedOpError(f"node '{nm}' (Flatten): axis={axis}, expected 1")
            y = net.flatten(x, 1, name=nm)
        elif op == "Reshape":
            shape = [int(s) for s in const(ins[1], n)]
            if len(shape) == 2 and (shape[1] == -1 or shape[1] == int(np.prod(x.shape[1:]))) \
                    and shape[0] in (x.shape[0], 0, -1):
                y = net.flatten(x, 1, name=nm)
            else:
                raise UnsupportedOpError(f"node '{nm}' (Reshape): target {shape} from {x.shape}; only "
                                         f"flattening to (N, -1) is supported")
        elif op == "Softmax":
            y = net.softmax(x, axis=a.get("axis", -1 if model.opset_import[0].version >= 13 else 1), name=nm)
        elif op == "LRN":
            y = net.local_response_norm(x, a["size"], a.get("alpha", 1e-4), a.get("beta", 0.75),
                                        a.get("bias", 1.0), name=nm)
        elif op == "Concat":
            y = net.concat([env[t] for t in ins], axis=a.get("axis", 1), name=nm)
        elif op in ("Dropout", "Identity"):
            env[n.output[0]] = x
            continue
        else:
            raise UnsupportedOpError(f"ONNX op '{op}' in node '{nm}' is not supported; supported: Conv, "
                                     f"BatchNormalization, Relu, MaxPool, AveragePool, GlobalAveragePool, Gemm, "
                                     f"MatMul, Add, Flatten, Reshape (to N,-1), Softmax, LRN, Concat, "
                                     f"Dropout, Identity")
        env[n.output[0]] = y
    outs = []
    for vi in g.output:
        d = env.get(vi.name)
        if d is None:
            raise GraphError(vi.name, "graph output is not produced by an imported node")
        if d.producer is None:
            raise GraphError(vi.name, "graph output is a graph input; expected a computed tensor")
        outs.append(d)
    net.output(*outs)
    return net
