"""Decomposed ops that older opsets make exporters write out, recognized as the op they spell.

Before opset 20 ONNX has no Gelu and before opset 17 no LayerNormalization, so the TorchScript
exporter writes them out of primitive ops (Erf, Sqrt, ...), each of which would otherwise run as its own op:

  GELU (erf):   y = (x * (Erf(x / sqrt(2)) + 1)) * 0.5       (and the orders 0.5 * x * (...), x * (0.5 * (...)))
  LayerNorm:    m = ReduceMean(x, axes); d = x - m; v = ReduceMean(d ^ 2, axes)
                y = d / Sqrt(v + eps) [* gamma] [+ beta]
  Mish:         y = x * Tanh(Softplus(x))                     (before opset 18, which has Mish)
  MaxUnpool:    ONNX MaxUnpool by a MaxPool's Indices, or the dynamo exporter's ScatterND of those indices
                re-based per plane (`_max_unpool`): one MaxUnpool node reading the pool's input and output

`rewrite(nodes, const)` replaces each such chain (every intermediate used only inside the chain, the
constants what the formula needs) by one node of domain `tilefuse.pattern` carrying the op it spells
(Gelu, LayerNormalization, Mish, MaxUnpool); the importer converts it with that op's rule. A chain that differs in
any constant, axis or extra use stays as it is and imports op by op (activation(erf), activation(sqrt), ...).
"""
from __future__ import annotations

import numpy as np

DOMAIN = "tilefuse.pattern"


def _scalar(const, name, value, rel=1e-4):
    v = const(name)
    return v is not None and v.size == 1 and v.dtype.kind == "f" and abs(float(v.reshape(-1)[0]) - value) <= rel * abs(value)


def _attr(node, key, default=None):
    from onnx import helper
    for a in node.attribute:
        if a.name == key:
            return helper.get_attribute_value(a)
    return default


class _Graph:
    def __init__(self, nodes, keep):
        self.nodes = nodes
        self.prod = {o: n for n in nodes for o in n.output if o}
        self.users: dict[str, list] = {}
        for n in nodes:
            for t in n.input:
                if t:
                    self.users.setdefault(t, []).append(n)
        self.keep = keep            # graph outputs: never internal to a chain

    def only_user(self, t, op):
        """The single consumer of t, when it has op type `op` and t is not a graph output."""
        us = self.users.get(t, [])
        if len(us) != 1 or t in self.keep or us[0].op_type != op or us[0].domain not in ("", "ai.onnx"):
            return None
        return us[0]

    def other(self, node, t):
        """The input of a binary node that is not t (None if both are t)."""
        a, b = node.input[0], node.input[1]
        return b if a == t else a if b == t else None


def _gelu(g: _Graph, const, erf):
    pre = g.prod.get(erf.input[0])
    if pre is None or erf.input[0] in g.keep or len(g.users.get(erf.input[0], [])) != 1:
        return None
    if pre.op_type == "Div" and _scalar(const, pre.input[1], np.sqrt(2.0)):
        x = pre.input[0]
    elif pre.op_type == "Mul" and (_scalar(const, pre.input[1], np.sqrt(0.5)) or _scalar(const, pre.input[0], np.sqrt(0.5))):
        x = pre.input[0] if _scalar(const, pre.input[1], np.sqrt(0.5)) else pre.input[1]
    else:
        return None
    add = g.only_user(erf.output[0], "Add")
    if add is None or not _scalar(const, g.other(add, erf.output[0]), 1.0):
        return None
    m1 = g.only_user(add.output[0], "Mul")
    if m1 is None:
        return None
    o = g.other(m1, add.output[0])
    chain = [pre, erf, add, m1]
    if o == x:                                          # (x * (1 + erf)) * 0.5
        m2 = g.only_user(m1.output[0], "Mul")
        if m2 is None or not _scalar(const, g.other(m2, m1.output[0]), 0.5):
            return None
        chain.append(m2)
    elif _scalar(const, o, 0.5):                        # x * ((1 + erf) * 0.5)
        m2 = g.only_user(m1.output[0], "Mul")
        if m2 is None or g.other(m2, m1.output[0]) != x:
            return None
        chain.append(m2)
    else:                                               # (x * 0.5) * (1 + erf)
        h = g.prod.get(o)
        if h is None or h.op_type != "Mul" or o in g.keep or len(g.users.get(o, [])) != 1:
            return None
        if not ((h.input[0] == x and _scalar(const, h.input[1], 0.5)) or
                (h.input[1] == x and _scalar(const, h.input[0], 0.5))):
            return None
        chain.insert(0, h)
    if len(g.users.get(pre.output[0], [])) != 1:
        return None
    return chain, ("Gelu", [x], chain[-1].output[0], {"approximate": "none"})


def _axes(node, const):
    if len(node.input) > 1 and node.input[1]:
        v = const(node.input[1])
        return None if v is None else tuple(int(a) for a in v.reshape(-1))
    v = _attr(node, "axes")
    return None if v is None else tuple(int(a) for a in v)


def _trailing_axis(axes, rank):
    """The first axis of `axes` when they are the trailing axes (k..r-1 or -k..-1), else None."""
    if not axes:
        return None
    if all(a < 0 for a in axes):
        return min(axes) if sorted(axes) == list(range(min(axes), 0)) else None
    if rank is None:
        return None
    ax = sorted(a % rank for a in axes)
    return ax[0] if ax == list(range(ax[0], rank)) else None


def _layer_norm(g: _Graph, const, sqrt, rank):
    ve = g.prod.get(sqrt.input[0])
    if ve is None or ve.op_type != "Add":
        return None
    v = next((g.prod[t] for t in ve.input if t in g.prod and g.prod[t].op_type == "ReduceMean"), None)
    if v is None:
        return None
    e = const(g.other(ve, v.output[0]))
    if e is None or e.size != 1 or e.dtype.kind != "f":
        return None
    p = g.prod.get(v.input[0])
    if p is None or p.op_type != "Pow" or not _scalar(const, p.input[1], 2.0, rel=0):
        return None
    d = g.prod.get(p.input[0])
    if d is None or d.op_type != "Sub":
        return None
    x = d.input[0]
    m = g.prod.get(d.input[1])
    if m is None or m.op_type != "ReduceMean" or m.input[0] != x:
        return None
    axes_m, axes_v = _axes(m, const), _axes(v, const)
    if axes_m is None or axes_m != axes_v or _attr(m, "keepdims", 1) != 1 or _attr(v, "keepdims", 1) != 1:
        return None
    axis = _trailing_axis(axes_m, rank(x))
    if axis is None:
        return None
    div = g.only_user(sqrt.output[0], "Div")
    if div is None or list(div.input) != [d.output[0], sqrt.output[0]]:
        return None
    # d feeds Pow and Div only; m, p, v, ve feed only the next step
    if sorted(n.op_type for n in g.users.get(d.output[0], [])) != ["Div", "Pow"] or d.output[0] in g.keep:
        return None
    for t, op in ((m.output[0], "Sub"), (p.output[0], "ReduceMean"), (v.output[0], "Add"), (ve.output[0], "Sqrt")):
        if g.only_user(t, op) is None:
            return None
    chain, out, gamma, beta = [m, d, p, v, ve, sqrt, div], div.output[0], "", ""
    mul = g.only_user(out, "Mul")
    if mul is not None and const(g.other(mul, out)) is not None:
        chain.append(mul)
        gamma, out = g.other(mul, out), mul.output[0]
        add = g.only_user(out, "Add")
        if add is not None and const(g.other(add, out)) is not None:
            chain.append(add)
            beta, out = g.other(add, out), add.output[0]
    return chain, ("LayerNormalization", [x, gamma, beta], out, {"axis": axis, "epsilon": float(e.reshape(-1)[0])})


def _mish(g: _Graph, softplus):
    """Softplus(x) -> Tanh -> Mul(x, .), each the single user of the one before."""
    x = softplus.input[0]
    th = g.only_user(softplus.output[0], "Tanh")
    mul = g.only_user(th.output[0], "Mul") if th is not None else None
    if mul is None or g.other(mul, th.output[0]) != x:
        return None
    return [softplus, th, mul], ("Mish", [x], mul.output[0], {})


def _ints(const, name):
    v = const(name) if name else None
    return None if v is None or v.dtype.kind not in "iu" else [int(a) for a in v.reshape(-1)]


def _pool_indices(g: _Graph, t):
    """The MaxPool whose Indices output is t, or None."""
    mp = g.prod.get(t)
    return mp if mp is not None and mp.op_type == "MaxPool" and len(mp.output) > 1 and mp.output[1] == t and \
        _attr(mp, "storage_order", 0) == 0 else None


def _unpool_node(mp, y, out, output_hw, exact):
    attrs = {k: _attr(mp, k) for k in ("kernel_shape", "strides", "pads", "dilations", "ceil_mode")
             if _attr(mp, k) is not None}
    return ("MaxUnpool", [y, mp.input[0], mp.output[0]], out, dict(attrs, output_hw=list(output_hw), exact=exact))


def _max_unpool(g: _Graph, const, node):
    """ONNX MaxUnpool(X, I[, output_shape]) with I a MaxPool's Indices, or the dynamo exporter's max_unpool2d:

      I, I1 = MaxPool(x).Indices, MaxPool[kernel 1](x).Indices        (absolute offsets in x's N, C, H, W)
      i = Reshape(Sub(I, Slice(I1, [0, 0], [1, 1], axes [2, 3])) + plane offsets of the output, [-1])
      out = Reshape(ScatterND(Reshape(ConstantOfShape(S), [-1]), Unsqueeze(i, -1), Reshape(y, [-1])), S)

    as one MaxUnpool node of this domain with inputs (y, x, MaxPool(x).Y): the pool's input and output, no index
    tensor (Network.max_unpool). output_hw [0, 0]: MaxUnpool's default size. `exact`: the output's H, W must be
    x's (ONNX MaxUnpool reads absolute offsets); else its width (the dynamo form re-bases each plane)."""
    from onnx import numpy_helper
    if node.op_type == "MaxUnpool":
        mp = _pool_indices(g, node.input[1])
        if mp is None:
            return None
        hw = None
        if len(node.input) > 2 and node.input[2]:
            shape = _ints(const, node.input[2])
            if shape is None or len(shape) != 4:
                return None
            hw = shape[2:]
        return [node], _unpool_node(mp, node.input[0], node.output[0], hw or [0, 0], 1)
    sc = node                                                   # ScatterND
    if _attr(sc, "reduction", b"none") not in (b"none", "none") or len(sc.input) != 3:
        return None
    rd, uq, ru = (g.prod.get(t) for t in sc.input)
    fin = g.only_user(sc.output[0], "Reshape")
    if any(n is None for n in (rd, uq, ru, fin)) or (rd.op_type, uq.op_type, ru.op_type) != \
            ("Reshape", "Unsqueeze", "Reshape"):
        return None
    flat = [-1]
    cs = g.prod.get(rd.input[0])
    shape = _ints(const, cs.input[0]) if cs is not None and cs.op_type == "ConstantOfShape" else None
    value = _attr(cs, "value") if cs is not None else None
    if shape is None or len(shape) != 4 or _ints(const, fin.input[1]) != shape or \
            _ints(const, rd.input[1]) != flat or _ints(const, ru.input[1]) != flat or \
            (value is not None and np.any(numpy_helper.to_array(value) != 0)):
        return None
    axes = _ints(const, uq.input[1]) if len(uq.input) > 1 else _attr(uq, "axes")
    rf = g.prod.get(uq.input[0])
    if axes is None or list(axes) not in ([-1], [1]) or rf is None or rf.op_type != "Reshape" or \
            _ints(const, rf.input[1]) != flat:
        return None
    add = g.prod.get(rf.input[0])
    if add is None or add.op_type != "Add":
        return None
    sub = next((g.prod[t] for t in add.input if t in g.prod and g.prod[t].op_type == "Sub"), None)
    offsets = const(g.other(add, sub.output[0])) if sub is not None else None
    n, c, oh, ow = shape
    want = ((np.arange(n)[:, None] * c + np.arange(c)[None]) * (oh * ow)).reshape(n, c, 1, 1)
    if offsets is None or offsets.shape != want.shape or np.any(offsets != want):
        return None
    mp, sl = _pool_indices(g, sub.input[0]), g.prod.get(sub.input[1])
    if mp is None or sl is None or sl.op_type != "Slice" or len(sl.input) < 4:
        return None
    mp1 = _pool_indices(g, sl.input[0])
    if mp1 is None or mp1.input[0] != mp.input[0] or list(_attr(mp1, "kernel_shape", [])) != [1, 1] or \
            list(_attr(mp1, "strides", [1, 1])) != [1, 1] or any(_attr(mp1, "pads", [0])) or \
            [_ints(const, t) for t in sl.input[1:4]] != [[0, 0], [1, 1], [2, 3]] or \
            (len(sl.input) > 4 and sl.input[4] and _ints(const, sl.input[4]) != [1, 1]):
        return None
    chain = [sc, uq, ru, rf, add, sub, fin]
    ids = {id(m) for m in chain}

    def internal(m):                             # m's outputs read inside the chain only
        return not any(o in g.keep or any(id(u) not in ids for u in g.users.get(o, [])) for o in m.output if o)
    if not all(internal(m) for m in chain[:-1]):
        return None
    for m in (rd, cs, sl, mp1):                  # producers read by nothing else go too (two unpools of one shape
        # share the zeros: seed 161000065)
        if internal(m):
            chain.append(m)
            ids.add(id(m))
    return chain, _unpool_node(mp, ru.input[0], fin.output[0], (oh, ow), 0)


def rewrite(nodes, const, rank, graph_outputs):
    """nodes (NodeProtos in order) -> nodes with the recognized chains replaced by one node each.

    const(name) -> the constant array of a tensor or None; rank(name) -> a tensor's rank or None
    (known for graph inputs and initializers before import; patterns needing it elsewhere skip)."""
    from onnx import helper
    g = _Graph(list(nodes), set(graph_outputs))
    replaced: dict[int, object] = {}      # id(last node of a chain) -> the new node
    dropped: set[int] = set()
    for n in g.nodes:
        if n.domain not in ("", "ai.onnx") or id(n) in dropped:
            continue
        hit = _gelu(g, const, n) if n.op_type == "Erf" else \
            _layer_norm(g, const, n, rank) if n.op_type == "Sqrt" else \
            _mish(g, n) if n.op_type == "Softplus" else \
            _max_unpool(g, const, n) if n.op_type in ("ScatterND", "MaxUnpool") else None
        if hit is None:
            continue
        chain, (op, ins, out, attrs) = hit
        if any(id(c) in dropped for c in chain):
            continue
        last = max(chain, key=lambda c: g.nodes.index(c))
        new = helper.make_node(op, ins, [out], name=(last.name or op) + ".fused", domain=DOMAIN, **attrs)
        dropped.update(id(c) for c in chain)
        replaced[id(last)] = new
    out = []
    for n in g.nodes:
        if id(n) in replaced:
            out.append(replaced[id(n)])
        elif id(n) not in dropped:
            out.append(n)
    return out
