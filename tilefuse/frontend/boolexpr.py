"""Bool tensors as the importers see them: comparisons kept symbolic until a select reads them.

The IR has no bool tensors. A comparison of float tensors (torch's gt / le / ..., ONNX's Greater / LessOrEqual /
...) becomes a `Cmp` leaf; ~ / logical_not / Not, & / logical_and / And and | / logical_or / Or build a small
expression over the leaves. What reads one: torch.where / ONNX Where (`select`: where ops, one per leaf), and a
cast to the network's float type (`select(e, 1, 0)`). Anything else reading a bool tensor is refused by the
importer, naming the comparison it came from.

    select(Cmp(l, c, r), a, b) = where(l c r, a, b)
    select(Not(e), a, b)      = select(e, b, a)
    select(And(e, f), a, b)   = select(e, select(f, a, b), b)
    select(Or(e, f), a, b)    = select(e, a, select(f, a, b))
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir import Network
from ..ir.node import DataNode


@dataclass(frozen=True)
class Cmp:
    l: DataNode
    cmp: str            # kernels/reference.py COMPARISONS: gt ge lt le eq ne
    r: DataNode
    origin: str         # where the comparison was written (for errors)


@dataclass(frozen=True)
class Not:
    e: object


@dataclass(frozen=True)
class And:
    a: object
    b: object


@dataclass(frozen=True)
class Or:
    a: object
    b: object


BOOL = (Cmp, Not, And, Or)


def leaf(e) -> Cmp:
    """The first comparison of an expression (its dtype and origin)."""
    while not isinstance(e, Cmp):
        e = e.e if isinstance(e, Not) else e.a
    return e


def select(net: Network, e, a, b, name: str) -> DataNode:
    """a where e holds else b, as where ops (the outermost one named `name`); a, b DataNodes or numbers."""
    if isinstance(e, Not):
        return select(net, e.e, b, a, name)
    if isinstance(e, And):
        return select(net, e.a, select(net, e.b, a, b, net._fresh(name + ".and")), b, name)
    if isinstance(e, Or):
        return select(net, e.a, a, select(net, e.b, a, b, net._fresh(name + ".or")), name)
    return net.where(e.l, e.cmp, e.r, a, b, name=name)


MIRROR = {"gt": "lt", "ge": "le", "lt": "gt", "le": "ge", "eq": "eq", "ne": "ne"}   # a cmp b == b MIRROR[cmp] a


def compare_infinite(x: DataNode, cmp: str, inf: float, finite, origin: str):
    """x cmp inf (+inf or -inf) as comparisons without an infinite constant (the IR's constants are finite):
    against the dtype's largest finite value M, exactly. x == inf is x > M, x < inf is x <= M, x <= inf is x == x
    (false for NaN only), x > inf never holds (x == x and not x == x); the same mirrored for -inf. finite(v): the
    number v as an operand node of x's dtype (the importer's)."""
    m = float(np.finfo(x.dtype).max)
    if inf < 0:             # x cmp -inf  <=>  -x MIRROR[cmp] +inf: the rows below with -M and the mirrored cmp
        cmp, m, above, at_most = MIRROR[cmp], -m, "lt", "ge"
    else:
        above, at_most = "gt", "le"
    beyond = Cmp(x, above, finite(m), origin)          # x == +-inf
    not_nan = Cmp(x, "eq", x, origin)
    return {"eq": lambda: beyond, "ne": lambda: Not(beyond), "lt": lambda: Cmp(x, at_most, finite(m), origin),
            "le": lambda: not_nan, "gt": lambda: And(not_nan, Not(not_nan)), "ge": lambda: beyond}[cmp]()


def is_nan(x: DataNode, origin: str) -> Cmp:
    return Cmp(x, "ne", x, origin)
