"""Decomposed ops that older opsets make exporters write out, recognized as the op they spell.

Before opset 20 ONNX has no Gelu and before opset 17 no LayerNormalization, so the TorchScript
exporter writes them out of primitive ops (Erf, Sqrt, ...), each of which would otherwise run as its own op:

  GELU (erf):   y = (x * (Erf(x / sqrt(2)) + 1)) * 0.5       (and the orders 0.5 * x * (...), x * (0.5 * (...)))
  LayerNorm:    m = ReduceMean(x, axes); d = x - m; v = ReduceMean(d ^ 2, axes)
                y = d / Sqrt(v + eps) [* gamma] [+ beta]
  Mish:         y = x * Tanh(Softplus(x))                     (before opset 18, which has Mish)

`rewrite(nodes, const)` replaces each such chain (every intermediate used only inside the chain, the
constants what the formula needs) by one node of domain `tilefuse.pattern` carrying the op it spells
(Gelu, LayerNormalization, Mish); the importer converts it with that op's rule. A chain that differs in
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
            _mish(g, n) if n.op_type == "Softplus" else None
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
