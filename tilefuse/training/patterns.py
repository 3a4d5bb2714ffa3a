"""Find the paper's five fusion patterns in any network.

    (1)   C1 -> ReLU -> C2
    (2)   C1 -> BN -> C2
    (3)   C1 -> BN -> ReLU -> C2
    (4-1) C1 -> BN -> Add(., s) -> ReLU -> C2          s: any stored tensor (identity shortcut)
    (4-2) C1 -> BN -> Add(., BN3(C3(s))) -> ReLU -> C2  (projection shortcut)

C1, C2, C3 are plain conv2d ops (no fused relu/residual epilogue from the inference
compiler). Every intermediate tensor must have a single consumer (the check torch.fx
``fuse()`` makes), except the ReLU output of pattern 4, which the paper stores anyway (C2's
input, kept for C2's weight gradient) and so may also feed other ops (the next residual
block's shortcut). C2 is the first consumer of that tensor in topological order, so in the
reversed (backward) order it is the last contributor to its gradient, and the ReLU', error
Add and BN step 1 of the backward pass can run in its post-processing. An ``add`` with its
``relu`` flag stands for Add -> ReLU.

Each matcher is a named function returning a Pattern or None; ``find_patterns`` is the one
driver.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import Network, OpNode
from ..kernels.train_direct import direct_conv


@dataclass(eq=False)
class Pattern:
    kind: str                       # "1", "2", "3", "4-1", "4-2"
    c1: OpNode
    c2: OpNode
    bn: OpNode | None = None
    relu: OpNode | None = None
    add: OpNode | None = None
    c3: OpNode | None = None
    bn3: OpNode | None = None
    shortcut: object = None         # DataNode: the Add's other operand (4-1) or C3's input (4-2)
    members: list = field(default_factory=list)   # the memory-bound ops, forward order

    @property
    def name(self) -> str:
        return f"({self.kind}) {self.c1.name}->{self.c2.name}"

    @property
    def x1(self):
        """C1's output: the stored tensor every memory-bound layer of the pattern derives from."""
        return self.c1.outputs[0]

    @property
    def r(self):
        """The tensor C2 consumes (ReLU, BN output): virtual in patterns 1-3, stored in 4."""
        return self.c2.inputs[0]

    @property
    def unit_bytes(self) -> int:
        """The paper's unit: one memory-bound layer's mini-batch input (C1's output)."""
        return self.x1.nbytes


def _plain_conv(op) -> bool:
    """A conv the fused units can run: not an inference-fused one, not one of kernels/train_direct.py's
    (depthwise, small-group and fc convs run their own kernels, with no input stage or epilogue to fuse into)."""
    if op is None or op.op != "conv2d" or op.params.get("relu") or op.params.get("has_residual") or \
            not all(d.is_constant for d in op.inputs[1:]):         # (a computed weight: a conv of its own)
        return False
    return direct_conv(op.inputs[0].shape, op.inputs[1].shape, op.params) is None


def _only_consumer(d):
    return d.consumers[0] if len(d.consumers) == 1 else None


def _first_consumer(d, order):
    cs = sorted(d.consumers, key=lambda o: order[id(o)])
    return cs[0] if cs else None


def _conv_input_is(c2, d) -> bool:
    return _plain_conv(c2) and c2.inputs[0] is d


def match_relu(c1, order):
    """(1) C1 -> ReLU -> C2."""
    relu = _only_consumer(c1.outputs[0])
    if relu is None or relu.op != "relu":
        return None
    c2 = _only_consumer(relu.outputs[0])
    if not _conv_input_is(c2, relu.outputs[0]):
        return None
    return Pattern("1", c1, c2, relu=relu, members=[relu])


def match_bn(c1, order):
    """(2) C1 -> BN -> C2 and (3) C1 -> BN -> ReLU -> C2."""
    bn = _only_consumer(c1.outputs[0])
    if bn is None or bn.op != "batch_norm" or len(bn.outputs[0].shape) != 4:
        return None
    nxt = _only_consumer(bn.outputs[0])
    if _conv_input_is(nxt, bn.outputs[0]):
        return Pattern("2", c1, nxt, bn=bn, members=[bn])
    if nxt is not None and nxt.op == "relu":
        c2 = _only_consumer(nxt.outputs[0])
        if _conv_input_is(c2, nxt.outputs[0]):
            return Pattern("3", c1, c2, bn=bn, relu=nxt, members=[bn, nxt])
    return None


def _bn_of_conv(d):
    """(bn, conv) if d = BN(C(.)) with single consumers, else None."""
    bn = d.producer
    if bn is None or bn.op != "batch_norm" or len(d.consumers) != 1:
        return None
    c = bn.inputs[0].producer
    if not _plain_conv(c) or len(bn.inputs[0].consumers) != 1:
        return None
    return bn, c


def match_residual(add, order):
    """(4-1) and (4-2), matched from the Add: operand 0 is the main path when both qualify."""
    if add.op != "add" or add.inputs[0].shape != add.inputs[1].shape or any(d.is_constant for d in add.inputs):
        return None                 # (a broadcasting add runs alone: TrainingSchedule._fwd_binary)
    main = next((i for i in (0, 1) if _bn_of_conv(add.inputs[i])), None)
    if main is None:
        return None
    bn, c1 = _bn_of_conv(add.inputs[main])
    other = add.inputs[1 - main]
    out = add.outputs[0]
    relu = None
    if add.params.get("relu"):
        r = out
    else:
        relu = _only_consumer(out)
        if relu is None or relu.op != "relu":
            return None
        r = relu.outputs[0]
    c2 = _first_consumer(r, order)
    if not _conv_input_is(c2, r):
        return None
    sc = _bn_of_conv(other)
    if sc is not None and other is not add.inputs[main]:
        bn3, c3 = sc
        return Pattern("4-2", c1, c2, bn=bn, relu=relu, add=add, c3=c3, bn3=bn3,
                       shortcut=c3.inputs[0], members=[m for m in (bn, bn3, add, relu) if m])
    return Pattern("4-1", c1, c2, bn=bn, relu=relu, add=add, shortcut=other,
                   members=[m for m in (bn, add, relu) if m])


def find_patterns(net: Network) -> list[Pattern]:
    """All non-overlapping pattern instances, in forward order of their C1."""
    order = {id(o): i for i, o in enumerate(net.ops)}
    found: list[Pattern] = []
    used: set[int] = set()          # memory-bound ops already in a pattern

    def take(p):
        if p is None or any(id(m) in used for m in p.members):
            return
        if any(id(q.c2) == id(p.c2) for q in found):
            return
        used.update(id(m) for m in p.members)
        found.append(p)

    for op in net.ops:              # residual patterns first: they claim their BNs
        take(match_residual(op, order))
    for op in net.ops:
        if _plain_conv(op):
            take(match_bn(op, order) or match_relu(op, order))
    found.sort(key=lambda p: order[id(p.c1)])
    return found
