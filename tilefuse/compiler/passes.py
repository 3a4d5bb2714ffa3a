"""Graph passes: each is a function Network -> PassResult(network, changed).

Passes never mutate their input; they work on a clone. Each fusion is a rewrite that looks at
one op and returns without change when it does not apply (single-user checks as in torch.fx
`fuse()`). The pipeline that runs them is `compiler.passlist.PASSES`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import GraphError
from ..ir import Network, OpNode, ops
from ..ir.network import _toposort
from ..ir.node import DataNode, rounded_product
from ..ir.ops import IDENTITY_ACT
from ..kernels import activations as _acts


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


def _has_act(op: OpNode) -> bool:
    """The op already has a fused epilogue activation (relu or another)."""
    return op.params.get("relu", False) or tuple(op.params.get("act", IDENTITY_ACT))[0] != "identity"


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


FOLD_LIMIT = 1 << 16          # elements a folded constant may have beyond its largest constant operand's


def fold_constants(net: Network) -> PassResult:
    """An op whose inputs are all constants -> its value, computed once by the reference kernel (TVM's FoldConstant):
    the expressions of parameters `from_torch(..., fold_parameters=False)` keeps for the Trainer (a weight
    standardization, weight norm's g * v / ||v||), so a conv reading one gets a constant weight and its fast
    kernels. Not folded: a network output (an op writes it), a result with NaN or infinities (computed at run time
    as written), and a result larger than its largest constant operand by more than FOLD_LIMIT elements (an
    expand of a constant to an activation's size stays an op)."""
    from ..ir.ops import schema
    if not any(op.inputs and all(d.is_constant for d in op.inputs) for op in net.ops):
        return PassResult(net, False, "no op of constants only")
    net = net.clone()
    outs = {id(d) for d in net.outputs}
    n = 0
    for op in list(net.ops):
        out = op.outputs[0]
        if not op.inputs or not all(d.is_constant for d in op.inputs) or id(out) in outs or \
                int(np.prod(out.shape)) > max(d.value.size for d in op.inputs) + FOLD_LIMIT:
            continue
        with np.errstate(all="ignore"):
            v = np.asarray(schema(op.op, op.name).reference(*[d.value for d in op.inputs], **op.params))
        if v.shape != tuple(out.shape) or not np.all(np.isfinite(v)):
            continue
        _drop(net, op)
        out.producer = None
        out.bind_constant(v.astype(out.dtype, copy=False))
        n += 1
    return PassResult(net, n > 0, f"{n} ops of constants folded")


def computed_conv(op: OpNode) -> bool:
    """A conv2d whose weight the network computes (its bias may be computed too)."""
    return op.op == "conv2d" and not op.inputs[1].is_constant


def lower_computed_convs(net: Network) -> PassResult:
    """A conv whose weight the network computes -> im2col and a batched matmul (`Network.conv2d_as_matmul`): the
    runtime's conv kernels read weights prepared at compile time. Not an optimization: `compile` runs it before
    the pass list (whatever `passes=` says); the reference evaluator and the Trainer run the conv op itself."""
    if not any(computed_conv(op) for op in net.ops):
        return PassResult(net, False, "no conv of a computed weight")
    net = net.clone()
    n = 0
    for op in [o for o in net.ops if computed_conv(o)]:
        p, out = op.params, op.outputs[0]
        if p.get("relu") or p.get("has_residual") or p.get("has_input_scale") or _has_act(op):
            raise GraphError(op.name, "a conv of a computed weight with a fused epilogue; expected the plain conv "
                                      "the builder makes (fusions run after this lowering)")
        x, w = op.inputs[0], op.inputs[1]
        bias = op.inputs[2] if p["has_bias"] else None
        _drop(net, op)
        net._names.difference_update({op.name, out.name})
        y = net.conv2d_as_matmul(x, w, bias, p["stride"], p["padding"], p["dilation"], p["groups"], out.name)
        for c in list(out.consumers):            # y (named as out) takes out's place
            c.inputs = [y if d is out else d for d in c.inputs]
            y.consumers.append(c)
        net.outputs = [y if d is out else d for d in net.outputs]
        n += 1
    _reorder(net)
    return PassResult(net, True, f"{n} convs of computed weights as im2col and a matmul")


def _scale_rows(w: np.ndarray, s: np.ndarray, dt) -> np.ndarray | None:
    """(w * s[o]) per output channel o, computed in float64 and rounded to dt, a few output
    channels at a time: whole-weight float64 temporaries (4x the weights, 38 MiB for a 512x512
    3x3 conv) left ~40 MiB of freed but resident heap after the passes of a ResNet18. None where a
    product would flush or overflow a weight (ir/node.py `rounded_product`): the caller does not fold."""
    out = np.empty(w.shape, dt)
    per = max(1, (1 << 20) // max(1, w[:1].size * 8))          # ~1 MiB of float64 per chunk
    for o in range(0, w.shape[0], per):
        q = rounded_product(w[o:o + per], w[o:o + per].astype(np.float64)
                            * s[o:o + per].reshape((-1,) + (1,) * (w.ndim - 1)), dt)
        if q is None:
            return None
        out[o:o + per] = q
    return out


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
        if conv.params["has_residual"] or _has_act(conv):
            continue
        gamma, beta, mean, var = (d.value.astype(np.float64) for d in bn.inputs[1:])
        s = gamma / np.sqrt(var + bn.params["eps"])
        w = conv.inputs[1].value
        b = conv.inputs[2].value.astype(np.float64) if conv.params["has_bias"] else np.zeros_like(s)
        dt = conv.inputs[1].dtype
        ws = _scale_rows(w, s, dt)
        if ws is None:                          # a weight would flush or overflow: a scale op after the conv
            continue
        wd = DataNode(f"{conv.name}.weight_bnfold", w.shape, dt, ws)
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
        if _has_act(add) or add.inputs[0].shape != add.inputs[1].shape:
            continue  # an activation first, or a broadcasting add: not a residual
        for i, d in enumerate(add.inputs):
            conv = d.producer
            if conv is None or conv.op != "conv2d" or _single_user(net, d) is not add:
                continue
            if conv.params["has_residual"] or _has_act(conv):
                continue
            other = add.inputs[1 - i]
            if other is d or other.is_constant:
                continue  # add(x, x), or a constant (fold_channel_affine's job)
            other.consumers.remove(add)
            d.consumers.remove(add)
            at = 2 + int(conv.params["has_bias"])   # roles: x, weight, bias?, residual?, input_scale?
            conv.inputs = conv.inputs[:at] + [other] + conv.inputs[at:]
            other.consumers.append(conv)
            conv.params = dict(conv.params, has_residual=True)
            _replace_output(net, conv, add)
            n += 1
            break
    if n:
        _reorder(net)  # the residual's producer must now run before the conv
    return PassResult(net, n > 0, f"{n} add fused into conv2d epilogue")


def fuse_activation(net: Network) -> PassResult:
    """conv2d / conv_transpose2d / linear / add / sub / mul / div -> relu or activation (single
    user): the activation becomes the producer's epilogue, y = act(op(...)) (params relu / act).
    Lowering splits it out again for a kernel that cannot apply it (compiler/lower.py)."""
    net = net.clone()
    n = 0
    for a in [o for o in net.ops if o.op in ("relu", "activation")]:
        d = a.inputs[0]
        prod = d.producer
        if prod is None or prod.op not in ops.ACT_EPILOGUE or _has_act(prod):
            continue
        if _single_user(net, d) is not a:
            continue
        act = ("relu", 0.0, 0.0) if a.op == "relu" else tuple(a.params["act"])
        if prod.op in ("conv2d", "conv_transpose2d") and not _acts.finite_at_zero(*act):
            continue    # ln, rsqrt, x^-p: infinite in the padded channels (ops._epilogue_norm); stays its own op
        prod.params = ops.with_act(prod.params, act)
        _replace_output(net, prod, a)
        n += 1
    return PassResult(net, n > 0, f"{n} activations fused into their producer")


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


# ----------------------------------------------------------------------------- modern CNNs (issue 9)

def _make_op(net: Network, op: str, inputs: list[DataNode], params: dict, name: str,
             out: DataNode | None = None) -> OpNode:
    """A new op appended to net.ops (re-sort afterwards): params normalized, shape inferred; it
    writes `out` (whose shape must match) or a new data node named like the op."""
    from ..ir.ops import schema
    sch = schema(op, name)
    p = sch.normalize(name, dict(params))
    shape = sch.infer(name, inputs, p)
    if out is None:
        out = DataNode(name, shape, inputs[0].dtype)
    elif tuple(out.shape) != tuple(shape):
        raise AssertionError(f"{name}: rewritten {op} gives {shape}, the tensor it replaces is {out.shape}")
    node = OpNode(name, op, list(inputs), [out], p)
    out.producer = node
    for d in inputs:
        d.consumers.append(node)
    net.ops.append(node)
    return node


def _drop(net: Network, op: OpNode) -> None:
    for d in op.inputs:
        if op in d.consumers:
            d.consumers.remove(op)
    net.ops.remove(op)


def _bypass(net: Network, op: OpNode, src: DataNode) -> bool:
    """Remove `op`, its consumers read `src` instead (not when op writes a network output)."""
    out = op.outputs[0]
    if any(out is o for o in net.outputs):
        return False
    for c in list(out.consumers):
        c.inputs = [src if d is out else d for d in c.inputs]
        src.consumers.append(c)
    _drop(net, op)
    return True


def _shuffle_chain(net: Network, r1: OpNode):
    """(permute, reshape) when r1 starts a channel shuffle: reshape (N, C, H, W) -> (N, g, C/g, H, W),
    permute (0, 2, 1, 3, 4), reshape back to (N, C, H, W), each intermediate read only by the next;
    else None."""
    x, y = r1.inputs[0], r1.outputs[0]
    if len(x.shape) != 4 or len(y.shape) != 5 or y.shape[0] != x.shape[0] or y.shape[3:] != x.shape[2:] \
            or y.shape[1] * y.shape[2] != x.shape[1]:
        return None
    pm = _single_user(net, y)
    if pm is None or pm.op != "permute" or pm.params["perm"] != (0, 2, 1, 3, 4):
        return None
    r2 = _single_user(net, pm.outputs[0])
    if r2 is None or r2.op != "reshape" or tuple(r2.outputs[0].shape) != tuple(x.shape):
        return None
    return pm, r2


# (inverse, mode) -> (the 6-D view of x, the permutation) of PixelShuffle / DepthToSpace and their inverses as
# model code and the ONNX importer write them (view -> permute -> view); kernels/reference.py pixel_shuffle
_PIXEL_SHUFFLE_FORMS = {
    (False, "crd"): (lambda n, c, h, w, r: (n, c // (r * r), r, r, h, w), (0, 1, 4, 2, 5, 3)),
    (False, "dcr"): (lambda n, c, h, w, r: (n, r, r, c // (r * r), h, w), (0, 3, 4, 1, 5, 2)),
    (True, "crd"): (lambda n, c, h, w, r: (n, c, h // r, r, w // r, r), (0, 1, 3, 5, 2, 4)),
    (True, "dcr"): (lambda n, c, h, w, r: (n, c, h // r, r, w // r, r), (0, 3, 5, 1, 2, 4)),
}


def _pixel_shuffle_chain(net: Network, r1: OpNode):
    """(permute, reshape, params) when r1 starts a pixel shuffle or unshuffle (either channel order): reshape
    (N, C, H, W) to one of `_PIXEL_SHUFFLE_FORMS`' 6-D views, its permutation, reshape to the op's 4-D output,
    each intermediate read only by the next; else None."""
    x, y = r1.inputs[0], r1.outputs[0]
    if len(x.shape) != 4 or len(y.shape) != 6:
        return None
    pm = _single_user(net, y)
    if pm is None or pm.op != "permute":
        return None
    r2 = _single_user(net, pm.outputs[0])
    if r2 is None or r2.op != "reshape" or len(r2.outputs[0].shape) != 4:
        return None
    n, c, h, w = x.shape
    oh = r2.outputs[0].shape[2]
    for (inverse, mode), (view, perm) in _PIXEL_SHUFFLE_FORMS.items():
        r = (h // oh if oh and h % oh == 0 else 0) if inverse else (oh // h if oh % h == 0 else 0)
        if r < 1 or (inverse and w % r) or (not inverse and c % (r * r)):
            continue
        want = (n, c * r * r, h // r, w // r) if inverse else (n, c // (r * r), h * r, w * r)
        if tuple(y.shape) == view(n, c, h, w, r) and tuple(pm.params["perm"]) == perm and \
                tuple(r2.outputs[0].shape) == want:
            return pm, r2, {"factor": r, "mode": mode, "inverse": inverse}
    return None


def canonicalize(net: Network) -> PassResult:
    """One form per computation, so later passes and kernels see the fast op:
    mean over (H, W) with keepdim -> global_avg_pool, without -> global_avg_pool + flatten; adaptive_avg_pool to 1x1 -> global_avg_pool,
    to the input size -> nothing, to a divisor of it -> avg_pool; permute by the identity and
    reshape to the same shape -> nothing; reshape (N, ...) -> (N, prod) -> flatten; reshape to
    (N, g, C/g, H, W) -> permute (0, 2, 1, 3, 4) -> reshape back -> channel_shuffle; the 6-D view -> permute
    -> view of a pixel (un)shuffle / DepthToSpace / SpaceToDepth -> pixel_shuffle, and an activation after it moved
    before it (`_hoist_act_over_pixel_shuffle`); activation
    relu -> relu; a binary op's constant operand cut to the axes it varies on (`_shrink_broadcast_constant`), and
    an expand (x * ones) read only by broadcasting ops dropped (`_bypass_expand`)."""
    net = net.clone()
    n = 0
    for op in list(net.ops):
        if op not in net.ops:   # dropped by a rewrite of an earlier op (a channel shuffle's permute, reshape)
            continue
        x, out, p = op.inputs[0], op.outputs[0], op.params
        new = None
        if op.op == "mean" and len(x.shape) == 4 and tuple(a % 4 for a in p["axes"]) in ((2, 3), (3, 2)):
            if p["keepdim"]:
                new = ("global_avg_pool", {})
            else:   # x.mean((2, 3)) (ShuffleNetV2, MNASNet): the blocked pool, then (N, C, 1, 1) -> (N, C)
                _drop(net, op)
                g = _make_op(net, "global_avg_pool", [x], {}, net._fresh(op.name + ".pool"))
                _make_op(net, "flatten", [g.outputs[0]], {"start_dim": 1}, op.name, out)
                n += 1
                continue
        elif op.op == "adaptive_avg_pool":
            (h, w), (oh, ow) = x.shape[2:], p["output_size"]
            if (oh, ow) == (h, w):
                n += _bypass(net, op, x)
                continue
            if (oh, ow) == (1, 1):
                new = ("global_avg_pool", {})
            elif h % oh == 0 and w % ow == 0:
                k = (h // oh, w // ow)
                new = ("avg_pool", {"kernel_size": k, "stride": k})
        elif op.op in ("permute", "reshape") and out.shape == x.shape and \
                (op.op == "reshape" or p["perm"] == tuple(range(len(x.shape)))):
            n += _bypass(net, op, x)
            continue
        elif op.op == "reshape" and _shuffle_chain(net, op) is not None:
            pm, r2 = _shuffle_chain(net, op)
            for o in (op, pm, r2):
                _drop(net, o)
            _make_op(net, "channel_shuffle", [x], {"groups": out.shape[1]}, r2.name, r2.outputs[0])
            n += 1
            continue
        elif op.op == "reshape" and _pixel_shuffle_chain(net, op) is not None:
            pm, r2, ps = _pixel_shuffle_chain(net, op)
            for o in (op, pm, r2):
                _drop(net, o)
            _make_op(net, "pixel_shuffle", [x], ps, r2.name, r2.outputs[0])
            n += 1
            continue
        elif op.op == "reshape" and len(out.shape) == 2 and out.shape[0] == x.shape[0] and len(x.shape) > 2:
            new = ("flatten", {"start_dim": 1})
        elif op.op == "activation" and p["act"][0] == "relu":
            new = ("relu", {})
        elif (op.op in _BINARY and not _has_act(op)) or op.op == "where":
            k = _shrink_broadcast_constant(net, op)
            if op.op == "mul" and _bypass_expand(net, op):
                k += 1
            n += k
            continue
        if new is not None:
            _drop(net, op)
            _make_op(net, new[0], [x], new[1], op.name, out)
            n += 1
    n += _hoist_act_over_pixel_shuffle(net)
    if n:
        _reorder(net)
    return PassResult(net, n > 0, f"{n} ops canonicalized")


def _hoist_act_over_pixel_shuffle(net: Network) -> int:
    """pixel_shuffle -> relu / activation (element-wise, no per-channel parameter) becomes activation ->
    pixel_shuffle: the same values moved (a shuffle permutes elements), and the activation can then fuse into
    the conv before the shuffle (a super-resolution upsampler's conv -> PixelShuffle -> LeakyReLU: one pass
    fewer over the largest tensor). Only where the shuffle is its input's one reader and the activation its."""
    n = 0
    for ps in [o for o in net.ops if o.op == "pixel_shuffle"]:
        act = _single_user(net, ps.outputs[0])
        if act is None or act.op not in ("relu", "activation") or _single_user(net, ps.inputs[0]) is not ps:
            continue
        x, z = ps.inputs[0], act.outputs[0]
        _drop(net, ps)
        _drop(net, act)
        pre = _make_op(net, act.op, [x], act.params, net._fresh(act.name))
        _make_op(net, "pixel_shuffle", [pre.outputs[0]], ps.params, ps.name, z)
        n += 1
    return n


_BINARY = ops.BINARY


def _aligned(shape, rank):
    return (1,) * (rank - len(shape)) + tuple(shape)


def _shrink_broadcast_constant(net: Network, op: OpNode) -> int:
    """A constant operand of a broadcasting binary op (or of where) that repeats one value along an axis where the
    other operands span the output anyway is cut to size 1 there (`w.view(1, C, 1, 1).expand_as(x) * x`, folded
    at import to a constant as large as the activation: SSD's L2Norm weight at batch 32 would be 94 MB in the
    package; zeros_like(x) in a torch.where). The output is unchanged, bit for bit; a constant shared with other
    ops gets a reduced copy."""
    out = op.outputs[0].shape
    r = len(out)
    n = 0
    for i, c in enumerate(op.inputs):
        others = [d for j, d in enumerate(op.inputs) if j != i]
        if not c.is_constant or all(d.is_constant for d in others) or len(c.shape) != r or c.value.size <= 1:
            continue
        v = c.value
        oth = tuple(int(d) for d in np.broadcast_shapes(*(_aligned(d.shape, r) for d in others)))
        for k in range(r):
            if v.shape[k] > 1 and oth[k] == out[k] and np.array_equal(v, np.broadcast_to(v.take([0], axis=k), v.shape)):
                v = v.take([0], axis=k)
        if v.shape == c.value.shape:
            continue
        d = DataNode(net._fresh(f"{c.name}.reduced"), v.shape, c.dtype, np.ascontiguousarray(v),
                     nonfinite=True)    # a part of c, admitted already
        c.consumers.remove(op)
        op.inputs = [d if j == i else x for j, x in enumerate(op.inputs)]
        d.consumers.append(op)
        n += 1
    return n


def _bypass_expand(net: Network, op: OpNode) -> bool:
    """x * ones (an importer's expand / expand_as, which keeps the values) whose consumers broadcast anyway:
    they read x itself when their output shape stays the same (F.normalize's `norm.clamp_min(eps).expand_as(x)`
    before x / it), or when x already has the product's shape."""
    ones = [i for i, d in enumerate(op.inputs) if d.is_constant and d.value.size and np.all(d.value == 1)]
    if not ones or op.inputs[0].is_constant and op.inputs[1].is_constant:
        return False
    x, out = op.inputs[1 - ones[0]], op.outputs[0]
    if any(out is o for o in net.outputs):
        return False
    if tuple(x.shape) != tuple(out.shape):
        for c in out.consumers:
            if c.op not in _BINARY:
                return False
            try:
                shape = np.broadcast_shapes(*[x.shape if d is out else d.shape for d in c.inputs])
            except ValueError:
                return False
            if tuple(shape) != tuple(c.outputs[0].shape):
                return False
    return _bypass(net, op, x)


def fuse_channel_shuffle(net: Network) -> PassResult:
    """ShuffleNetV2's concat -> channel shuffle -> chunk as gathers: a channel concat read only by a
    channel_shuffle becomes the shuffle's inputs, and a shuffle read only by channel slices (step 1)
    becomes one channel_shuffle per slice, each with that slice's [start, stop): every tensor the
    convs read is gathered from the concat's inputs in one pass (kernels/movement.py's lane gather)
    instead of a concat, a shuffle and a slice each copying it."""
    net = net.clone()
    n = 0
    for sh in [o for o in net.ops if o.op == "channel_shuffle"]:
        if sh not in net.ops:
            continue
        xs, out, p = list(sh.inputs), sh.outputs[0], sh.params
        if len(xs) == 1 and xs[0].producer is not None and xs[0].producer.op == "concat" and \
                xs[0].producer.params["axis"] % 4 == 1 and _single_user(net, xs[0]) is sh:
            cat = xs[0].producer
            xs = list(cat.inputs)
            _drop(net, sh)
            _drop(net, cat)
            sh = _make_op(net, "channel_shuffle", xs, p, sh.name, out)
            n += 1
        users = list(out.consumers)
        if users and not any(out is o for o in net.outputs) and all(
                u.op == "slice" and u.params["axis"] % 4 == 1 and u.params["step"] == 1 and u.inputs[0] is out
                for u in users):
            base = p["start"]
            for u in users:
                c0, c1, _ = slice(u.params["start"], u.params["stop"], 1).indices(out.shape[1])
                _drop(net, u)
                _make_op(net, "channel_shuffle", xs, {"groups": p["groups"], "start": base + c0, "stop": base + c1},
                         u.name, u.outputs[0])
            _drop(net, sh)
            n += 1
    if n:
        _reorder(net)
    return PassResult(net, n > 0, f"{n} channel shuffles fused with their concat / slices")


def _const_like(net: Network, name: str, value: np.ndarray, dtype) -> DataNode:
    """A constant for a rewritten op: the state_dict name kept when the old one is unused."""
    used = {d.name for d in net.data.values()}
    if name in used:
        name = f"{name}@nchw"
    return DataNode(name, value.shape, dtype, value.astype(dtype))


_TO_NHWC, _TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)


def _nhwc_chain(net: Network, p1: OpNode):
    """The ops between permute(0, 2, 3, 1) and permute(0, 3, 1, 2) when every one acts per
    position on the last (channel) axis, or None."""
    chain = []
    d = p1.outputs[0]
    while True:
        u = _single_user(net, d)
        if u is None or u.inputs[0] is not d and u.op not in ("add", "sub", "mul", "div"):
            return None
        if u.op == "permute":
            return chain + [u] if u.params["perm"] == _TO_NCHW else None
        c = d.shape[-1]
        if u.op == "layer_norm" and u.params["axis"] % 4 == 3:
            pass
        elif u.op == "linear" or u.op in ("relu", "activation"):
            pass
        elif u.op in ("add", "sub", "mul", "div"):
            other = u.inputs[1] if u.inputs[0] is d else u.inputs[0]
            if not other.is_constant or other.shape[-1] not in (1, c) or any(s != 1 for s in other.shape[:-1]) \
                    or u.outputs[0].shape != d.shape:
                return None
        else:
            return None
        chain.append(u)
        d = u.outputs[0]


def channels_last_to_nchw(net: Network) -> PassResult:
    """permute(0,2,3,1) -> per-position ops on the channel axis -> permute(0,3,1,2) (ConvNeXt's
    block and its LayerNorm2d) runs in NCHW: layer_norm over the last axis -> channel_norm,
    linear -> 1x1 conv2d, activations unchanged, per-channel constants reshaped to (1, C, 1, 1);
    the two permutes disappear."""
    net = net.clone()
    n = 0
    for p1 in [o for o in net.ops if o.op == "permute" and o.params["perm"] == _TO_NHWC]:
        if p1 not in net.ops:
            continue
        chain = _nhwc_chain(net, p1)
        if chain is None:
            continue
        x = p1.inputs[0]
        final = chain[-1].outputs[0]
        for op in [p1] + chain:
            _drop(net, op)
        cur = x
        for k, op in enumerate(chain[:-1]):
            out = final if k == len(chain) - 2 else None
            if op.op == "layer_norm":
                g, b = op.inputs[1], op.inputs[2]
                node = _make_op(net, "channel_norm", [cur, g, b], {"eps": op.params["eps"]}, op.name, out)
            elif op.op == "linear":
                w = op.inputs[1]
                wc = _const_like(net, w.name, w.value.reshape(w.shape + (1, 1)), w.dtype)  # (M, K) -> (M, K, 1, 1)
                ins = [cur, wc] + op.inputs[2:]
                node = _make_op(net, "conv2d", ins, ops.with_act({"has_bias": op.params["has_bias"]},
                                                                 ops.epilogue_act(op.params)), op.name, out)
            elif op.op in ("relu", "activation"):
                node = _make_op(net, op.op, [cur], op.params, op.name, out)
            else:
                i = 0 if op.inputs[0].is_constant else 1
                k_ = op.inputs[i]
                c = k_.value.reshape(-1)
                kc = _const_like(net, k_.name, c.reshape((1, c.size, 1, 1)) if c.size > 1 else c, k_.dtype)
                ins = [kc, cur] if i == 0 else [cur, kc]
                node = _make_op(net, op.op, ins, op.params, op.name, out)
            cur = node.outputs[0]
        if len(chain) == 1:   # permute straight back: the identity
            for c in list(final.consumers):
                c.inputs = [x if d is final else d for d in c.inputs]
                x.consumers.append(c)
            if any(final is o for o in net.outputs):
                _make_op(net, "dropout", [x], {"p": 0.0}, final.name, final)
        n += 1
    if n:
        _reorder(net)
    return PassResult(net, n > 0, f"{n} channels-last blocks rewritten to NCHW")


def _channel_constant(d: DataNode, channels: int, rank: int, axis1: bool) -> np.ndarray | None:
    """The per-channel vector (channels,) of a constant broadcasting along axis 1 of a conv's
    (N, C, H, W) output (axis1) or the last axis of a linear's rank-`rank` output, else None."""
    if not d.is_constant:
        return None
    v = d.value.astype(np.float64)
    shape = tuple(d.shape)
    if v.size == 1:
        return np.full(channels, float(v.reshape(-1)[0]))
    if axis1:
        s = (1,) * (4 - len(shape)) + shape
        ok = len(shape) <= 4 and s[0] == 1 and s[1] == channels and s[2:] == (1, 1)
    else:
        ok = shape[-1] == channels and all(x == 1 for x in shape[:-1]) and len(shape) <= rank
    return v.reshape(-1) if ok else None


def _live_taps(size: int, out: int, k: int, pad0: int, pad1: int, stride: int, dil: int):
    """(first, last, pad0', pad1') of a conv's taps along one axis that read the input for some output
    (tap t reads rows o * stride - pad0 + t * dil, o < out), with the paddings of the trimmed kernel; None
    when every tap is live or trimming would need a negative padding (a crop)."""
    live = [t for t in range(k) if -pad0 + t * dil < size and (out - 1) * stride - pad0 + t * dil >= 0]
    if not live or (live[0] == 0 and live[-1] == k - 1):
        return None
    a, b = live[0], live[-1]
    p0, p1 = pad0 - a * dil, pad1 - (k - 1 - b) * dil
    return None if p0 < 0 or p1 < 0 else (a, b, p0, p1)


def prune_dead_taps(net: Network) -> PassResult:
    """A conv's kernel rows / columns that only ever read the zero padding are dropped, the padding
    shrunk to match: the same output (those taps add products with zeros). DeepLabV3's ASPP convs at
    dilation 12 / 24 / 36 on a map smaller than the dilation are 1x1 convs in effect: at 64x64 images
    (8x8 maps, 2048 channels) they ran the direct kernel over an 80x80 zero-bordered band, 10-21 ms
    each, the whole network 3x ONNX Runtime's time."""
    net = net.clone()
    n = 0
    for conv in [o for o in net.ops if o.op == "conv2d"]:
        wd = conv.inputs[1]
        if not wd.is_constant or len(conv.inputs[0].shape) != 4:
            continue
        p = conv.params
        (_, _, h, w), (_, _, ho, wo) = conv.inputs[0].shape, conv.outputs[0].shape
        kh, kw = wd.shape[2], wd.shape[3]
        pt, pb, pl, pr = p["padding"]
        rows = _live_taps(h, ho, kh, pt, pb, p["stride"][0], p["dilation"][0])
        cols = _live_taps(w, wo, kw, pl, pr, p["stride"][1], p["dilation"][1])
        if rows is None and cols is None:
            continue
        r0, r1, pt, pb = rows or (0, kh - 1, pt, pb)
        c0, c1, pl, pr = cols or (0, kw - 1, pl, pr)
        value = np.ascontiguousarray(wd.value[:, :, r0:r1 + 1, c0:c1 + 1])
        nd = DataNode(f"{conv.name}.weight_live_taps", value.shape, wd.dtype, value)
        wd.consumers.remove(conv)
        conv.inputs = [conv.inputs[0], nd] + conv.inputs[2:]
        nd.consumers.append(conv)
        conv.params = dict(p, padding=(pt, pb, pl, pr))
        n += 1
    return PassResult(net, n > 0, f"{n} convs' taps that read only padding dropped")


def fold_channel_affine(net: Network) -> PassResult:
    """conv2d / linear -> mul, div, add or sub by a per-output-channel constant (ConvNeXt's
    layer scale, a constant bias): folded into the weights and bias (w' = w*s, b' = b*s + t)."""
    net = net.clone()
    n = 0
    for u in [o for o in net.ops if o.op in ("mul", "div", "add", "sub")]:
        if _has_act(u):
            continue
        for i, d in enumerate(u.inputs):
            prod = d.producer
            if prod is None or prod.op not in ("conv2d", "linear") or _single_user(net, d) is not u:
                continue
            p = prod.params
            if _has_act(prod) or p.get("has_residual") or p.get("has_input_scale") or u.outputs[0].shape != d.shape:
                continue
            chans = d.shape[1] if prod.op == "conv2d" else d.shape[-1]
            s = _channel_constant(u.inputs[1 - i], chans, len(d.shape), prod.op == "conv2d")
            if s is None or (u.op == "sub" and i == 1) or (u.op == "div" and (i == 1 or np.any(s == 0))):
                continue
            w = prod.inputs[1].value.astype(np.float64)
            b = prod.inputs[2].value.astype(np.float64) if p["has_bias"] else np.zeros(chans)
            if u.op in ("mul", "div"):
                f = s if u.op == "mul" else 1.0 / s
                w = w * f.reshape((-1,) + (1,) * (w.ndim - 1))
                b = b * f
            else:
                b = b + s if u.op == "add" else b - s
            dt = prod.inputs[1].dtype
            w = rounded_product(prod.inputs[1].value, w, dt)
            if w is None:                       # a weight would flush or overflow: the op stays
                continue
            wd = DataNode(f"{prod.name}.weight_folded", w.shape, dt, w)
            bd = DataNode(f"{prod.name}.bias_folded", b.shape, dt, b.astype(dt))
            for x in prod.inputs[1:]:
                x.consumers.remove(prod)
            prod.inputs = [prod.inputs[0], wd, bd]
            wd.consumers.append(prod)
            bd.consumers.append(prod)
            prod.params = dict(p, has_bias=True)
            _replace_output(net, prod, u)
            n += 1
            break
    return PassResult(net, n > 0, f"{n} per-channel constant ops folded into conv/linear")


def _set_inputs(op: OpNode, inputs: list[DataNode]) -> None:
    for d in op.inputs:
        if op in d.consumers:
            d.consumers.remove(op)
    op.inputs = list(inputs)
    for d in inputs:
        d.consumers.append(op)


def _absorb_affine(net: Network, gn: OpNode) -> int:
    """Per-channel affine ops after a group_norm / channel_norm (scale, or mul / div / add / sub by a per-channel
    or scalar constant: the exporters' and model code's weight and bias) folded into its gamma and beta, one after
    another; returns how many."""
    n = 0
    while not _has_act(gn):
        u = _single_user(net, gn.outputs[0])
        if u is None or u.op not in ("scale", "mul", "div", "add", "sub") or _has_act(u) \
                or u.outputs[0].shape != gn.outputs[0].shape:
            break
        c = gn.outputs[0].shape[1]
        if u.op == "scale":
            if u.inputs[0] is not gn.outputs[0]:
                break
            f, t = u.inputs[1].value.astype(np.float64), u.inputs[2].value.astype(np.float64)
        else:
            i = 0 if u.inputs[0] is gn.outputs[0] else 1
            other = u.inputs[1 - i]
            if other is gn.outputs[0] or not other.is_constant or len(other.shape) > len(gn.outputs[0].shape):
                break
            v = other.value.astype(np.float64)
            # (.., C, 1, ..) aligned to the output's axes: per channel when only axis 1 may differ from 1
            full = (1,) * (len(gn.outputs[0].shape) - v.ndim) + v.shape
            if any(d != 1 for k, d in enumerate(full) if k != 1) or full[1] not in (1, c):
                break
            v = np.broadcast_to(v.reshape(-1), (c,)) if full[1] == c else np.full(c, float(v.reshape(-1)[0]))
            if (u.op == "sub" and i == 1) or (u.op == "div" and (i == 1 or np.any(v == 0))):
                break
            f, t = {"mul": (v, 0.0 * v), "div": (1.0 / v, 0.0 * v), "add": (1.0 + 0.0 * v, v),
                    "sub": (1.0 + 0.0 * v, -v)}[u.op]
        gam, bet = gn.inputs[1].value.astype(np.float64), gn.inputs[2].value.astype(np.float64)
        dt = gn.inputs[1].dtype
        _set_inputs(gn, [gn.inputs[0], DataNode(f"{gn.name}.weight_folded", (c,), dt, (gam * f).astype(dt)),
                         DataNode(f"{gn.name}.bias_folded", (c,), dt, (bet * f + t).astype(dt))])
        _replace_output(net, gn, u)
        n += 1
    return n


def _channel_mean(op: OpNode | None) -> bool:
    """A mean over the channel axis of (N, C, H, W) with keepdim and no epilogue."""
    return (op is not None and op.op == "mean" and len(op.inputs[0].shape) == 4 and op.params["keepdim"]
            and tuple(a % 4 for a in op.params["axes"]) == (1,))


def fold_channel_norm(net: Network) -> PassResult:
    """The channels_first LayerNorm spelled out, as the official ConvNeXt code writes it (`u = x.mean(1,
    keepdim=True); s = (x - u).pow(2).mean(1, keepdim=True); x = (x - u) / torch.sqrt(s + eps)`) and as both ONNX
    exporters write that: mean(x, 1) -> d = x - u (once or twice) -> d * d -> mean(., 1) -> + eps (an add, or
    ONNX's scale) -> sqrt -> d / . becomes one channel_norm (unit weight, zero bias), and the per-channel weight
    and bias after it fold into its gamma and beta (`_absorb_affine`): 8-9 ops, as many passes over the tensor,
    become one kernel."""
    net = net.clone()
    n = 0
    for m1 in [o for o in net.ops if _channel_mean(o)]:
        if not any(o is m1 for o in net.ops):      # the second mean of a chain folded before
            continue
        x, u = m1.inputs[0], m1.outputs[0]
        # x - u once, or twice (the official code writes it in the variance and again in the quotient)
        subs = list(dict.fromkeys(u.consumers))
        if not 1 <= len(subs) <= 2 or any(o.op != "sub" or _has_act(o) or o.inputs[0] is not x or o.inputs[1] is not u
                                          for o in subs):
            continue
        ds = [o.outputs[0] for o in subs]
        users = list(dict.fromkeys(c for d in ds for c in d.consumers))
        sq = next((o for o in users if o.op == "mul" and o.inputs[0] is o.inputs[1]), None)
        div = next((o for o in users if o.op == "div" and any(o.inputs[0] is d for d in ds)), None)
        if len(users) != 2 or sq is None or div is None or _has_act(sq) or _has_act(div) \
                or any(d in net.outputs for d in ds) or any(div.inputs[1] is d for d in ds):
            continue
        m2 = _single_user(net, sq.outputs[0])
        if not _channel_mean(m2):
            continue
        add = _single_user(net, m2.outputs[0])
        if add is None or add.op not in ("add", "scale") or _has_act(add):
            continue
        if add.op == "scale":         # ONNX's Add of a scalar: scale(v, 1, eps)
            eps_d = add.inputs[2]
            if add.inputs[0] is not m2.outputs[0] or not np.all(add.inputs[1].value == 1):
                continue
        else:
            eps_d = add.inputs[1] if add.inputs[0] is m2.outputs[0] else add.inputs[0]
        if not eps_d.is_constant or eps_d.value.size != 1 or not float(eps_d.value.reshape(-1)[0]) >= 0:
            continue
        rt = _single_user(net, add.outputs[0])
        if rt is None or rt.op != "activation" or rt.params["act"][0] != "sqrt" \
                or div.inputs[1] is not rt.outputs[0] or _single_user(net, rt.outputs[0]) is not div:
            continue
        chain = [m1, *subs, sq, m2, add, rt, div]
        if any(o.outputs[0] in net.outputs for o in chain[:-1]):
            continue
        c, dt = x.shape[1], x.dtype
        out = div.outputs[0]
        for o in chain:
            _drop(net, o)
        cn = _make_op(net, "channel_norm", [x, DataNode(f"{div.name}.unit_weight", (c,), dt, np.ones(c, dt)),
                                            DataNode(f"{div.name}.zero_bias", (c,), dt, np.zeros(c, dt))],
                      {"eps": float(eps_d.value.reshape(-1)[0])}, div.name, out)
        _reorder(net)
        _absorb_affine(net, cn)
        n += 1
    return PassResult(net, n > 0, f"{n} spelled-out channel layer norms as channel_norm")


_FLT_MAX = float(np.finfo(np.float32).max)


def _l2_divisor(net: Network, d: DataNode) -> tuple[DataNode, str, float, list[OpNode]] | None:
    """d = sqrt(sum(x * x, axis 1, keepdim)) [+ eps | clamped below at eps]: (x, mode, eps, the ops), each op
    read only by the next (the divide is the last reader)."""
    op, chain = d.producer, []
    mode, eps = "l2", 0.0
    if op is not None and not _has_act(op) and op.op in ("add", "scale"):
        if op.op == "scale":          # ONNX's Add of a scalar: scale(v, 1, eps)
            if not np.all(op.inputs[1].value == 1):
                return None
            eps_d, src = op.inputs[2], op.inputs[0]
        else:
            eps_d, src = op.inputs[::-1] if op.inputs[1].is_constant else op.inputs
        if not eps_d.is_constant or eps_d.value.size != 1:
            return None
        eps = float(eps_d.value.reshape(-1)[0])
        chain.append(op)
        op = src.producer
    elif op is not None and op.op == "activation" and op.params["act"][0] == "clip":
        _, lo, hi = op.params["act"][:3]
        if not hi >= _FLT_MAX:
            return None
        mode, eps = "l2_clamp", float(lo)
        chain.append(op)
        op = op.inputs[0].producer
    if not 0.0 <= eps < float("inf"):
        return None
    if op is None or op.op != "activation" or op.params["act"][0] != "sqrt":
        return None
    chain.append(op)
    sm = op.inputs[0].producer
    if sm is None or sm.op != "sum" or _has_act(sm) or not sm.params["keepdim"] \
            or tuple(a % len(sm.inputs[0].shape) for a in sm.params["axes"]) != (1,):
        return None
    sq = sm.inputs[0].producer
    if sq is None or sq.op != "mul" or _has_act(sq) or sq.inputs[0] is not sq.inputs[1]:
        return None
    chain += [sm, sq]
    if any(_single_user(net, o.outputs[0]) is None for o in chain):
        return None
    return sq.inputs[0], mode, eps, chain[::-1]


def fold_l2_norm(net: Network) -> PassResult:
    """x / ||x||_2 over the channels as model code writes it: SSD's L2Norm (`x.pow(2).sum(1, keepdim=True).sqrt()
    + eps`, torch.div), F.normalize (the vector norm clamped at eps, expanded), a bare `x / x.norm(dim=1,
    keepdim=True)`, and ONNX's ReduceL2 / Clip / Div: square -> sum over axis 1 -> sqrt -> [+ eps | clamp] ->
    x / . becomes one channel_norm in an l2 mode (x read twice instead of six passes and a squared copy), and
    the per-channel weight after it (SSD's) folds into its gamma (`_absorb_affine`)."""
    net = net.clone()
    n = 0
    for div in [o for o in net.ops if o.op == "div" and not _has_act(o)]:
        x, d = div.inputs
        if len(x.shape) < 2 or tuple(div.outputs[0].shape) != tuple(x.shape):
            continue
        found = _l2_divisor(net, d)
        if found is None or found[0] is not x or _single_user(net, d) is not div:
            continue
        _, mode, eps, chain = found
        c, dt, out = x.shape[1], x.dtype, div.outputs[0]
        for o in [*chain, div]:
            _drop(net, o)
        cn = _make_op(net, "channel_norm", [x, DataNode(f"{div.name}.unit_weight", (c,), dt, np.ones(c, dt)),
                                            DataNode(f"{div.name}.zero_bias", (c,), dt, np.zeros(c, dt))],
                      {"eps": eps, "mode": mode}, div.name, out)
        _reorder(net)
        _absorb_affine(net, cn)
        n += 1
    return PassResult(net, n > 0, f"{n} channel L2 norms as channel_norm")


def fold_softmax_scale(net: Network) -> PassResult:
    """x * c -> softmax over the last axis (attention's scores times 1 / sqrt(d)), c one constant value (a mul, or
    ONNX's scale with beta 0): softmax(x, scale=c), which multiplies each value as it reads it; the same values
    (the kernel rounds x * c first, as the mul did), one pass over the scores fewer."""
    net = net.clone()
    n = 0
    for sm in [o for o in net.ops if o.op == "softmax" and o.params.get("scale", 1.0) == 1.0]:
        x = sm.inputs[0]
        mul = x.producer
        if mul is None or _has_act(mul) or _single_user(net, x) is not sm or \
                sm.params["axis"] % len(x.shape) != len(x.shape) - 1:
            continue
        if mul.op == "mul":
            i = next((i for i, d in enumerate(mul.inputs) if d.is_constant and d.value.size == 1), None)
            if i is None or mul.inputs[1 - i].shape != x.shape:
                continue
            src, c = mul.inputs[1 - i], float(mul.inputs[i].value.reshape(-1)[0])
        elif mul.op == "scale" and mul.inputs[1].value.size == 1 and not np.any(mul.inputs[2].value) \
                and mul.inputs[0].shape == x.shape:
            src, c = mul.inputs[0], float(mul.inputs[1].value.reshape(-1)[0])
        else:
            continue
        if not np.isfinite(c) or c == 0.0:
            continue
        _drop(net, mul)
        _drop(net, sm)
        _make_op(net, "softmax", [src], {"axis": sm.params["axis"], "scale": c}, sm.name, sm.outputs[0])
        _reorder(net)
        n += 1
    return PassResult(net, n > 0, f"{n} scalar multiplies folded into softmax")


def fold_group_norm(net: Network) -> PassResult:
    """GroupNorm as ONNX exporters write it, back to one group_norm: reshape (N, C, ...) -> (N, G, L), an
    instance norm of the G rows with unit scale and zero bias, reshape back to (N, C, ...) -> group_norm(G) of
    the 4-D tensor; and a per-channel affine after a group_norm (scale, or mul / div / add / sub by a
    per-channel constant: the exporters' weight and bias) folded into its gamma and beta."""
    net = net.clone()
    n_shape = n_affine = 0
    for gn in [o for o in net.ops if o.op == "group_norm"]:
        if _has_act(gn):
            continue
        xr, g, b = gn.inputs
        rp, bk = xr.producer, _single_user(net, gn.outputs[0])
        if (rp is not None and rp.op == "reshape" and _single_user(net, xr) is gn and bk is not None
                and bk.op == "reshape" and len(xr.shape) == 3 and gn.params["groups"] == xr.shape[1]
                and np.all(g.value == 1) and np.all(b.value == 0)):
            x = rp.inputs[0]
            big = tuple(bk.outputs[0].shape)
            if len(x.shape) >= 3 and tuple(x.shape) == big and x.shape[0] == xr.shape[0] \
                    and x.shape[1] % xr.shape[1] == 0:
                c, dt = x.shape[1], g.dtype
                _set_inputs(gn, [x, DataNode(f"{gn.name}.unit_weight", (c,), dt, np.ones(c, dt)),
                                 DataNode(f"{gn.name}.zero_bias", (c,), dt, np.zeros(c, dt))])
                _replace_output(net, gn, bk)
                rp.inputs[0].consumers.remove(rp)
                net.ops.remove(rp)
                n_shape += 1
        n_affine += _absorb_affine(net, gn)
    if n_shape:
        _reorder(net)
    return PassResult(net, bool(n_shape or n_affine), f"{n_shape} reshaped instance norms as group_norm, "
                                                      f"{n_affine} per-channel affine ops folded into group_norm")


def fuse_squeeze_excitation(net: Network) -> PassResult:
    """mul(x, s) with s (N, C, 1, 1) computed from x (a squeeze-excitation scale) feeding a 1x1
    conv: the conv takes s as an input scale (params has_input_scale), and x * s is never
    materialized (kernels/se_conv.py scales the weights per image instead)."""
    net = net.clone()
    n = 0
    for m in [o for o in net.ops if o.op == "mul"]:
        if _has_act(m):
            continue
        out = m.outputs[0]
        conv = _single_user(net, out)
        if conv is None or conv.op != "conv2d" or conv.inputs[0] is not out or conv.params.get("has_input_scale"):
            continue
        p = conv.params
        if conv.inputs[1].shape[2:] != (1, 1) or p["stride"] != (1, 1) or p["padding"] != (0, 0, 0, 0) \
                or p["groups"] != 1:
            continue
        a, b = m.inputs
        x, s = (a, b) if len(b.shape) == 4 and b.shape[2:] == (1, 1) and a.shape == out.shape else (b, a)
        if x.shape == s.shape and _computed_from(x, s):
            # a 1x1 map: both operands are (N, C, 1, 1); the scale is the one computed from the other
            # (`scale * x` read as x = scale put the conv on the scale's layout, NCHW: RegNetY's last stage
            # at 32x32 images ran its 1x1s 5-10x slower)
            x, s = s, x
        if len(x.shape) != 4 or x.shape != out.shape or s.is_constant or s.shape != x.shape[:2] + (1, 1):
            continue
        conv.inputs = [x] + conv.inputs[1:] + [s]
        x.consumers.append(conv)
        s.consumers.append(conv)
        out.consumers.remove(conv)
        conv.params = dict(p, has_input_scale=True)
        _drop(net, m)
        n += 1
    if n:
        _reorder(net)
    return PassResult(net, n > 0, f"{n} squeeze-excitation scales fused into the next 1x1 conv")


def _computed_from(d: DataNode, src: DataNode, depth: int = 16) -> bool:
    """d depends on src through at most `depth` ops (a squeeze-excitation scale on its feature map)."""
    todo, seen = [(d, 0)], set()
    while todo:
        t, k = todo.pop()
        if t is src:
            return True
        if t.producer is None or k >= depth or id(t) in seen:
            continue
        seen.add(id(t))
        todo.extend((i, k + 1) for i in t.producer.inputs)
    return False


def _se_fc(net: Network, op: OpNode | None, channels: int) -> bool:
    """op is a 1x1 conv on a (N, C, 1, 1) tensor (an SE block's fc) that fits the fused kernel:
    stride 1, no padding, groups 1, constant weights (and bias), no residual or input scale."""
    if op is None or op.op != "conv2d" or op.inputs[0].shape[1] != channels:
        return False
    p, w = op.params, op.inputs[1]
    return (len(op.inputs[0].shape) == 4 and op.inputs[0].shape[2:] == (1, 1) and w.shape[2:] == (1, 1)
            and w.is_constant and p["stride"] == (1, 1) and p["padding"] == (0, 0, 0, 0) and p["groups"] == 1
            and not p["has_residual"] and not p.get("has_input_scale")
            and (not p["has_bias"] or op.inputs[2].is_constant))


def fuse_squeeze_scale(net: Network) -> PassResult:
    """global_avg_pool(x) -> 1x1 conv (act) -> 1x1 conv (gate), each feeding only the next: the
    squeeze-excitation scale as one `squeeze_excitation` op (kernels/squeeze.py: one instruction
    instead of three, and no layout conversions around the tiny convs). A conv without a bias
    gets a zero one. What does not match (a linear FC, a shared mean) stays unfused."""
    net = net.clone()
    n = 0
    for g in [o for o in net.ops if o.op == "global_avg_pool"]:
        x, m = g.inputs[0], g.outputs[0]
        fc1 = _single_user(net, m)
        if not _se_fc(net, fc1, x.shape[1]):
            continue
        fc2 = _single_user(net, fc1.outputs[0])
        if not _se_fc(net, fc2, fc1.outputs[0].shape[1]) or fc2.outputs[0].shape[1] != x.shape[1]:
            continue

        def bias(fc):
            if fc.params["has_bias"]:
                return fc.inputs[2]
            return _const_like(net, f"{fc.name}.bias", np.zeros(fc.inputs[1].shape[0]), x.dtype)
        ins = [x, fc1.inputs[1], bias(fc1), fc2.inputs[1], bias(fc2)]
        params = {"act": ops.epilogue_act(fc1.params), "gate": ops.epilogue_act(fc2.params)}
        out = fc2.outputs[0]
        for op in (g, fc1, fc2):
            _drop(net, op)
        _make_op(net, "squeeze_excitation", ins, params, fc2.name, out=out)
        n += 1
    if n:
        _reorder(net)
    return PassResult(net, n > 0, f"{n} squeeze-excitation scales (mean, fc, fc) as one op")
