"""Network helpers for large images: a new input size, the fully convolutional trunk.

    net = with_input_shape(tilefuse.models.resnet18(), (1, 3, 2160, 3840))
    body = trunk(net)        # the streamable part; its outputs are what the head would read

Both rebuild the network through the builder, so every shape is inferred again and a head
that cannot take the new size (a fixed-size adaptive pool before a linear layer) raises a
GraphError naming the op. Constants are shared with the source network (they are read-only).
"""
from __future__ import annotations

from ..ir import DataNode, Network
from ..compiler.bands import split_streamable


def _replay(net: Network, shape, ops, outputs, name: str) -> Network:
    new = Network(name)
    env: dict[str, DataNode] = {}
    for d in net.inputs:
        env[d.name] = new.input(d.name, shape if shape is not None else d.shape, d.dtype,
                                integer=net.integer_inputs.get(d.name))
    consts: dict[str, DataNode] = {}
    for op in ops:
        ins = []
        for d in op.inputs:
            if d.is_constant:
                if d.name not in consts:
                    c = DataNode(d.name, d.shape, d.dtype)
                    c.value = d.value
                    consts[d.name] = c
                ins.append(consts[d.name])
            else:
                ins.append(env[d.name])
        env[op.outputs[0].name] = new.add_op(op.op, ins, op.params, op.outputs[0].name)
    new.output(*[env[d.name] for d in outputs])
    return new


def with_input_shape(net: Network, shape) -> Network:
    """`net` rebuilt for an input of `shape` (N, C, H, W)."""
    return _replay(net, tuple(shape), net.ops, net.outputs, net.name)


def trunk(net: Network, shape=None) -> Network:
    """The streamable prefix of `net` as a network of its own (optionally for a new input shape):
    its outputs are the streamed tensors the rest of `net` reads."""
    streamed, tail = split_streamable(net)
    produced = {op.outputs[0].name: op.outputs[0] for op in streamed}
    reads = []
    for op in tail:
        for d in op.inputs:
            if d.name in produced and all(d is not r for r in reads):
                reads.append(d)
    for d in net.outputs:
        if d.name in produced and all(d is not r for r in reads):
            reads.append(d)
    return _replay(net, shape, streamed, reads, f"{net.name}-trunk")
