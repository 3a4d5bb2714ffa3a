"""Graph passes: each is a function Network -> PassResult(network, changed).

Passes never mutate their input; they work on a clone. Each fusion is a rewrite that looks at
one op and returns without change when it does not apply (single-user checks as in torch.fx
`fuse()`). The pipeline that runs them is `compiler.pipeline.PASSES`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir import Network, OpNode, ops
from ..ir.network import _toposort
from ..ir.node import DataNode


@dataclass
class PassResult:
    network: Network
    changed: bool
    detail: str = ""


def _single_user(net: Network, d: DataNode) -> OpNode | None:
    """The only consumer of d, if d has exactly one and is not a network output."""
    if len(d.consumers) != 1 or any(d is o for o in net.outputs):
        return None
    return d.consumers[0]


def _replace_output(net: Network, producer: OpNode, old: OpNode) -> None:
    """Make `producer` write what `old` wrote, dropping `old` and producer's old output."""
    dead = producer.outputs[0]
    new_out = old.outputs[0]
    for d in old.inputs:
        if old in d.consumers:
            d.consumers.remove(old)
    producer.outputs = [new_out]
    new_out.producer = producer
    net.ops.remove(old)
    assert not dead.consumers, f"{dead.name} still has consumers"


def _reorder(net: Network) -> None:
    net.ops = _toposort(net.ops, net.inputs)


# ----------------------------------------------------------------------------- passes

def remove_dropout(net: Network) -> PassResult:
    """Dropout is the identity at inference: consumers read its input directly."""
    net = net.clone()
    n = 0
    for op in [o for o in net.ops if o.op == "dropout"]:
        src, out = op.inputs[0], op.outputs[0]
        if any(out is o for o in net.outputs):
            continue  # keep it: an output must be written by an op
        for c in list(out.consumers):
            c.inputs = [src if d is out else d for d in c.inputs]
            src.consumers.append(c)
        src.consumers.remove(op)
        net.ops.remove(op)
        n += 1
    return PassResult(net, n > 0, f"{n} dropout removed")


def fold_batch_norm(net: Network) -> PassResult:
    """conv2d -> batch_norm (conv output used only by the BN): scale weights, shift bias.

    w'[o] = w[o] * gamma[o] / sqrt(var[o] + eps);  b'[o] = (b[o] - mean[o]) * that + beta[o]
    """
    net = net.clone()
    n = 0
    for bn in [o for o in net.ops if o.op == "batch_norm"]:
        conv = bn.inputs[0].producer
        if conv is None or conv.op != "conv2d" or _single_user(net, bn.inputs[0]) is not bn:
            continue
        if conv.params["has_residual"] or conv.params["relu"]:
            continue
        gamma, beta, mean, var = (d.value.astype(np.float64) for d in bn.inputs[1:])
        s = gamma / np.sqrt(var + bn.params["eps"])
        w = conv.inputs[1].value.astype(np.float64)
        b = conv.inputs[2].value.astype(np.float64) if conv.params["has_bias"] else np.zeros_like(s)
        dt = conv.inputs[1].dtype
        wd = DataNode(f"{conv.name}.weight_bnfold", w.shape, dt, (w * s.reshape(-1, 1, 1, 1)).astype(dt))
        bd = DataNode(f"{conv.name}.bias_bnfold", s.shape, dt, ((b - mean) * s + beta).astype(dt))
        for d in conv.inputs[1:]:
            d.consumers.remove(conv)
        conv.inputs = [conv.inputs[0], wd, bd]
        wd.consumers.append(conv)
        bd.consumers.append(conv)
        conv.params = dict(conv.params, has_bias=True)
        _replace_output(net, conv, bn)
        n += 1
    return PassResult(net, n > 0, f"{n} batch_norm folded into conv2d")


def batch_norm_to_scale(net: Network) -> PassResult:
    """A BN that could not be folded becomes a per-channel scale (alpha, beta precomputed)."""
    net = net.clone()
    n = 0
    for bn in [o for o in net.ops if o.op == "batch_norm"]:
        gamma, beta, mean, var = (d.value.astype(np.float64) for d in bn.inputs[1:])
        alpha = gamma / np.sqrt(var + bn.params["eps"])
        dt = bn.inputs[0].dtype
        ad = DataNode(f"{bn.name}.alpha", alpha.shape, dt, alpha.astype(dt))
        bd = DataNode(f"{bn.name}.beta_shift", alpha.shape, dt, (beta - mean * alpha).astype(dt))
        for d in bn.inputs[1:]:
            d.consumers.remove(bn)
        bn.inputs = [bn.inputs[0], ad, bd]
        ad.consumers.append(bn)
        bd.consumers.append(bn)
        bn.op, bn.params = "scale", {}
        n += 1
    return PassResult(net, n > 0, f"{n} batch_norm lowered to scale")


def fuse_residual_add(net: Network) -> PassResult:
    """conv2d -> add(conv_out, other): the add becomes the conv's epilogue (residual input)."""
    net = net.clone()
    n = 0
    for add in [o for o in net.ops if o.op == "add"]:
        if add.params.get("relu"):
            continue
        for i, d in enumerate(add.inputs):
            conv = d.producer
            if conv is None or conv.op != "conv2d" or _single_user(net, d) is not add:
                continue
            if conv.params["has_residual"] or conv.params["relu"]:
                continue
            other = add.inputs[1 - i]
            if other is d:
                continue  # add(x, x)
            other.consumers.remove(add)
            d.consumers.remove(add)
            conv.inputs = conv.inputs + [other]
            other.consumers.append(conv)
            conv.params = dict(conv.params, has_residual=True)
            _replace_output(net, conv, add)
            n += 1
            break
    if n:
        _reorder(net)  # the residual's producer must now run before the conv
    return PassResult(net, n > 0, f"{n} add fused into conv2d epilogue")


def fuse_relu(net: Network) -> PassResult:
    """conv2d / linear / add -> relu (single user): ReLU becomes the producer's epilogue."""
    net = net.clone()
    n = 0
    for relu in [o for o in net.ops if o.op == "relu"]:
        d = relu.inputs[0]
        prod = d.producer
        if prod is None or prod.op not in ops.RELU_EPILOGUE or prod.params.get("relu"):
            continue
        if _single_user(net, d) is not relu:
            continue
        prod.params = dict(prod.params, relu=True)
        _replace_output(net, prod, relu)
        n += 1
    return PassResult(net, n > 0, f"{n} relu fused into its producer")


def eliminate_dead_nodes(net: Network) -> PassResult:
    """Drop ops whose results reach no network output."""
    net = net.clone()
    live: set[int] = {id(d) for d in net.outputs}
    keep: list[OpNode] = []
    for op in reversed(net.ops):
        if any(id(d) in live for d in op.outputs):
            keep.append(op)
            live.update(id(d) for d in op.inputs)
        else:
            for d in op.inputs:
                d.consumers.remove(op)
    removed = len(net.ops) - len(keep)
    net.ops = list(reversed(keep))
    return PassResult(net, removed > 0, f"{removed} dead ops removed")
