"""Random ONNX graphs with random attributes, imported by `from_onnx` and checked against ONNX Runtime
(tests/test_onnx_graphs.py; longer runs: the command line below).

Two builders, each a chain of 1-3 nodes on a random (N, C, H, W) input at a random opset (11-21):
`spatial` (Conv with pads / auto_pad / dilations / groups, ConvTranspose with output_padding, Max / AveragePool
with ceil_mode and count_include_pad, Resize by scales or sizes in every coordinate and nearest mode, Pad in
three modes, Slice with negative starts and steps, Reshape with 0 / -1, ReduceMean by attribute or input, Clip
with optional bounds, Softmax, Concat, broadcast Mul / Add, BatchNormalization, Flatten, activations with
attributes, PRelu) and `tensor` (Gemm with transB / alpha / beta / C of four shapes, MatMul, Softmax on any axis,
Split, Gather, DepthToSpace, Tile, Expand, LRN, LayerNormalization, Pow, Max / Min with a scalar, Unsqueeze +
Squeeze, Transpose, ReduceSum / ReduceMean over random axes, Sub / Div either way, Sum / Mean, Gelu, ...). From
seed TAIL_FROM on, half the graphs end in one more node (`_tail`: Shrink, ThresholdedRelu, or a Where of IsNaN,
IsInf or a comparison with +-inf).

A graph ONNX Runtime rejects is skipped. Otherwise tilefuse must refuse it with a TilefuseError (an op or
attribute outside what it implements, named) or compute it: every output within 1e-4 of the output's max of ONNX
Runtime's, or, where ORT's own float32 arithmetic is the outlier, of ONNX's reference evaluator's (a ReduceSum
then Sigmoid of its negative: ORT 5.96e-8, the reference 9.586e-8; its LRN replaced, `_evaluator`), or, on a draw
float32 rounding decides, of the graph evaluated in float64 within 4x of how much rounding the input moves that
(`_rounding_decides`). An exception of another type, or a wrong value, is a failure.

    .venv/bin/python tests/onnx_graphs.py --kind spatial --seconds 300 [--seed 1]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

RTOL = 1e-4


def _c(name, a):
    from onnx import numpy_helper
    return numpy_helper.from_array(np.asarray(a), name)


def _conv(r, li, cur, n, c, h, w, inits):
    k, s = int(r.choice([1, 2, 3, 5])), int(r.choice([1, 2]))
    d = int(r.choice([1, 1, 2]))
    g = int(r.choice([1, c] if c > 1 else [1]))
    o = int(r.choice([1, 4, 8])) * g
    ap = str(r.choice(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    attrs = dict(kernel_shape=[k, k], strides=[s, s], dilations=[d, d], group=g)
    if ap == "NOTSET":
        p = [int(v) for v in r.integers(0, k, 4)]
        attrs["pads"] = p
        ho, wo = (h + p[0] + p[2] - d * (k - 1) - 1) // s + 1, (w + p[1] + p[3] - d * (k - 1) - 1) // s + 1
    else:
        attrs["auto_pad"] = ap
        if ap == "VALID":
            ho, wo = (h - d * (k - 1) - 1) // s + 1, (w - d * (k - 1) - 1) // s + 1
        else:
            ho, wo = -(-h // s), -(-w // s)
    if ho < 1 or wo < 1:
        return None
    inits.append(_c(f"w{li}", (r.standard_normal((o, c // g, k, k)) * 0.3).astype(np.float32)))
    ins = [cur, f"w{li}"]
    if r.random() < 0.5:
        inits.append(_c(f"b{li}", r.standard_normal(o).astype(np.float32)))
        ins.append(f"b{li}")
    return ins, attrs, [n, o, ho, wo]


def build_spatial(seed: int, tail: bool = False):
    """(ModelProto, input) of a chain of spatial and channel ops, or None (see the module docstring); tail: with
    `_tail`'s last node (`check` asks for it; onnx_mutants' bases do not, so its kept seeds keep their graphs)."""
    from onnx import helper
    r = np.random.default_rng(seed)
    shape0 = [int(r.choice([1, 2])), int(r.choice([1, 3, 4, 8, 16])), int(r.integers(2, 20)), int(r.integers(2, 20))]
    opset = int(r.choice([11, 13, 17, 18, 19, 21]))
    shp, cur, nodes, inits = list(shape0), "x", [], []
    for li in range(int(r.integers(1, 4))):
        op = str(r.choice(["Conv", "Conv", "MaxPool", "AveragePool", "Resize", "Pad", "Slice", "Transpose", "Reshape",
                           "ReduceMean", "Clip", "Softmax", "Concat", "Mul", "Add", "GlobalAveragePool",
                           "ConvTranspose", "BatchNormalization", "Flatten", "LeakyRelu", "HardSigmoid", "Elu",
                           "PRelu"]))
        out = f"t{li}"
        if len(shp) != 4 and op not in ("Softmax", "Clip", "Mul", "Add", "LeakyRelu"):
            continue
        n, c, h, w = shp if len(shp) == 4 else (None,) * 4
        if op == "Conv":
            made = _conv(r, li, cur, n, c, h, w, inits)
            if made is None:
                continue
            ins, attrs, shp = made
            nodes.append(helper.make_node("Conv", ins, [out], **attrs))
        elif op == "ConvTranspose":
            k, s = int(r.choice([1, 2, 3])), int(r.choice([1, 2]))
            p, op_ = int(r.integers(0, k)), (int(r.integers(0, s)) if s > 1 else 0)
            o = int(r.choice([1, 4, 8]))
            ho, wo = (h - 1) * s - 2 * p + k + op_, (w - 1) * s - 2 * p + k + op_
            if ho < 1 or wo < 1:
                continue
            attrs = dict(kernel_shape=[k, k], strides=[s, s], pads=[p] * 4)
            if op_:
                attrs["output_padding"] = [op_, op_]
            inits.append(_c(f"w{li}", (r.standard_normal((c, o, k, k)) * 0.3).astype(np.float32)))
            nodes.append(helper.make_node("ConvTranspose", [cur, f"w{li}"], [out], **attrs))
            shp = [n, o, ho, wo]
        elif op in ("MaxPool", "AveragePool"):
            k, ceil = int(r.choice([1, 2, 3])), int(r.random() < 0.3)
            attrs = dict(kernel_shape=[k, k])
            if r.random() < 0.7:
                attrs["strides"] = [int(r.choice([1, 2]))] * 2
            p = int(r.integers(0, (k + 1) // 2)) if k > 1 else 0
            if p:
                attrs["pads"] = [p] * 4
            if ceil:
                attrs["ceil_mode"] = 1
            if op == "AveragePool" and r.random() < 0.5:
                attrs["count_include_pad"] = 1
            s = attrs.get("strides", [1, 1])[0]
            if h + 2 * p < k or w + 2 * p < k:
                continue
            size = []
            for x in (h, w):
                o = (-(-(x + 2 * p - k) // s) if ceil else (x + 2 * p - k) // s) + 1
                if ceil and (o - 1) * s >= x + p:     # the last window must start inside
                    o -= 1
                size.append(o)
            nodes.append(helper.make_node(op, [cur], [out], **attrs))
            shp = [n, c] + size
        elif op == "GlobalAveragePool":
            nodes.append(helper.make_node(op, [cur], [out]))
            shp = [n, c, 1, 1]
        elif op == "Resize":
            if opset < 13:
                continue
            mode = str(r.choice(["nearest", "linear"]))
            attrs = dict(mode=mode, coordinate_transformation_mode=str(r.choice(
                ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"])))
            if mode == "nearest":
                attrs["nearest_mode"] = str(r.choice(["floor", "round_prefer_floor", "round_prefer_ceil", "ceil"]))
            if r.random() < 0.5:
                sc = float(r.choice([2.0, 0.5, 3.0]))
                inits.append(_c(f"sc{li}", np.array([1, 1, sc, sc], np.float32)))
                ins, ho, wo = [cur, "", f"sc{li}"], int(np.floor(h * sc)), int(np.floor(w * sc))
            else:
                ho, wo = int(r.integers(1, 30)), int(r.integers(1, 30))
                inits.append(_c(f"sz{li}", np.array([n, c, ho, wo], np.int64)))
                ins = [cur, "", "", f"sz{li}"]
            if ho < 1 or wo < 1:
                continue
            nodes.append(helper.make_node("Resize", ins, [out], **attrs))
            shp = [n, c, ho, wo]
        elif op == "Pad":
            mode = str(r.choice(["constant", "reflect", "edge"]))
            p = [0, 0] + [int(v) for v in r.integers(0, 3, 2)] + [0, 0] + [int(v) for v in r.integers(0, 3, 2)]
            if mode == "reflect" and (max(p[2], p[6]) >= h or max(p[3], p[7]) >= w):
                continue
            inits.append(_c(f"p{li}", np.array(p, np.int64)))
            ins = [cur, f"p{li}"]
            if mode == "constant" and r.random() < 0.5:
                inits.append(_c(f"pv{li}", np.array(0.5, np.float32)))
                ins.append(f"pv{li}")
            nodes.append(helper.make_node("Pad", ins, [out], mode=mode))
            shp = [n, c, h + p[2] + p[6], w + p[3] + p[7]]
        elif op == "Slice":
            ax = int(r.choice([1, 2, 3, -1, -2]))
            dim, st = shp[ax], int(r.choice([1, 1, 2, -1]))
            if st > 0:
                a, b = int(r.integers(-dim, dim)), int(r.choice([dim, 2 ** 31 - 1, -1, int(r.integers(-dim, dim + 1))]))
            else:
                a, b = int(r.choice([-1, dim - 1])), int(r.choice([-dim - 1, 0, -2 ** 31]))
            length = len(range(*slice(a, b, st).indices(dim)))
            if length < 1:
                continue
            for name, v in (("s", a), ("e", b), ("a", ax), ("st", st)):
                inits.append(_c(f"{name}{li}", np.array([v], np.int64)))
            nodes.append(helper.make_node("Slice", [cur, f"s{li}", f"e{li}", f"a{li}", f"st{li}"], [out]))
            shp = list(shp)
            shp[ax] = length
        elif op == "Transpose":      # NCHW -> NHWC -> NCHW (ConvNeXt-style code)
            nodes.append(helper.make_node("Transpose", [cur], [out + "a"], perm=[0, 2, 3, 1]))
            nodes.append(helper.make_node("Transpose", [out + "a"], [out], perm=[0, 3, 1, 2]))
        elif op == "Reshape":
            target = np.array([0, c, -1, w], np.int64) if r.random() < 0.5 else np.array([n, c, h, w], np.int64)
            inits.append(_c(f"rs{li}", target))
            nodes.append(helper.make_node("Reshape", [cur, f"rs{li}"], [out]))
        elif op == "ReduceMean":
            axes, kd = ([2, 3] if r.random() < 0.7 else [1]), int(r.random() < 0.7)
            if opset >= 18:
                inits.append(_c(f"ax{li}", np.array(axes, np.int64)))
                nodes.append(helper.make_node("ReduceMean", [cur, f"ax{li}"], [out], keepdims=kd))
            else:
                nodes.append(helper.make_node("ReduceMean", [cur], [out], axes=axes, keepdims=kd))
            shp = [1 if i in axes else d for i, d in enumerate(shp)] if kd else [d for i, d in enumerate(shp)
                                                                                 if i not in axes]
        elif op == "Clip":
            inits += [_c(f"lo{li}", np.array(float(r.choice([0.0, -1.0])), np.float32)),
                      _c(f"hi{li}", np.array(float(r.choice([6.0, 0.5])), np.float32))]
            ins = [cur, f"lo{li}", f"hi{li}"] if r.random() < 0.7 else [cur, "", f"hi{li}"]
            nodes.append(helper.make_node("Clip", ins, [out]))
        elif op == "Softmax":
            nodes.append(helper.make_node("Softmax", [cur], [out], axis=int(r.choice([1, -1, len(shp) - 1]))))
        elif op == "Concat":
            nodes.append(helper.make_node("Concat", [cur, cur], [out], axis=1))
            shp = list(shp)
            shp[1] *= 2
        elif op in ("Mul", "Add"):
            cshape = [1, shp[1], 1, 1] if len(shp) == 4 and r.random() < 0.5 else ([shp[-1]] if r.random() < 0.5
                                                                                    else [1])
            inits.append(_c(f"k{li}", r.standard_normal(cshape).astype(np.float32)))
            ins = [cur, f"k{li}"] if r.random() < 0.5 else [f"k{li}", cur]
            nodes.append(helper.make_node(op, ins, [out]))
        elif op == "BatchNormalization":
            for name, v in (("g", r.random(c) + 0.5), ("bb", r.standard_normal(c)), ("m", r.standard_normal(c) * 0.1),
                            ("v", r.random(c) + 0.5)):
                inits.append(_c(f"{name}{li}", v.astype(np.float32)))
            nodes.append(helper.make_node(op, [cur] + [f"{k}{li}" for k in ("g", "bb", "m", "v")], [out],
                                          epsilon=float(r.choice([1e-5, 1e-3]))))
        elif op == "Flatten":
            ax = int(r.choice([1, 2]))
            nodes.append(helper.make_node(op, [cur], [out], axis=ax))
            shp = [int(np.prod(shp[:ax])), int(np.prod(shp[ax:]))]
        elif op == "LeakyRelu":
            nodes.append(helper.make_node(op, [cur], [out], alpha=float(r.choice([0.01, 0.2]))))
        elif op == "HardSigmoid":
            nodes.append(helper.make_node(op, [cur], [out], **({"alpha": 0.2, "beta": 0.5} if r.random() < 0.5
                                                              else {})))
        elif op == "Elu":
            nodes.append(helper.make_node(op, [cur], [out], alpha=float(r.choice([1.0, 0.5]))))
        elif op == "PRelu":
            inits.append(_c(f"sl{li}", (r.random((c, 1, 1)) * 0.3).astype(np.float32)))
            nodes.append(helper.make_node(op, [cur, f"sl{li}"], [out]))
        cur = out
    built = _model(nodes, inits, shape0, len(shp), opset, r)
    return _tail(built, seed) if tail else built


def build_tensor(seed: int, tail: bool = False):
    """(ModelProto, input) of a chain of shape, reduction, GEMM and element-wise ops, or None; tail as
    build_spatial's."""
    from onnx import helper
    r = np.random.default_rng(seed)
    opset = int(r.choice([11, 13, 17, 18, 20, 21]))
    shape0 = [int(r.choice([1, 2])), int(r.choice([1, 2, 4, 8, 16])), int(r.integers(1, 9)), int(r.integers(1, 9))]
    shp, cur, nodes, inits = list(shape0), "x", [], []
    for li in range(int(r.integers(1, 4))):
        op = str(r.choice(["Gemm", "MatMul", "Softmax", "Split", "Gather", "DepthToSpace", "Tile", "Expand", "LRN",
                           "LayerNormalization", "Pow", "MaxMin", "SqueezeUnsqueeze", "Transpose", "ReduceSum",
                           "ReduceMean", "SubDiv", "SumMean", "NegSigmoid", "Gelu", "HardSwish", "GlobalMaxPool",
                           "Tanh"]))
        out, rank = f"t{li}", len(shp)
        if rank == 0:
            break
        if op == "Gemm":
            if rank != 2:
                nodes.append(helper.make_node("Flatten", [cur], [out + "f"], axis=1))
                cur, shp = out + "f", [shp[0], int(np.prod(shp[1:]))]
            k, m, tb = shp[1], int(r.choice([1, 3, 8])), int(r.random() < 0.5)
            inits.append(_c(f"B{li}", r.standard_normal((m, k) if tb else (k, m)).astype(np.float32)))
            ins = [cur, f"B{li}"]
            if r.random() < 0.6:
                cshape = [(m,), (1, m), (shp[0], m), ()][int(r.integers(4))]
                inits.append(_c(f"C{li}", r.standard_normal(cshape).astype(np.float32)))
                ins.append(f"C{li}")
            attrs = dict(transB=tb)
            if r.random() < 0.4:
                attrs["alpha"] = float(r.choice([0.5, 2.0]))
            if r.random() < 0.4 and len(ins) == 3:
                attrs["beta"] = float(r.choice([0.5, 2.0]))
            nodes.append(helper.make_node("Gemm", ins, [out], **attrs))
            shp = [shp[0], m]
        elif op == "MatMul":
            m = int(r.choice([1, 3, 8]))
            inits.append(_c(f"B{li}", r.standard_normal((shp[-1], m)).astype(np.float32)))
            nodes.append(helper.make_node("MatMul", [cur, f"B{li}"], [out]))
            shp = shp[:-1] + [m]
        elif op == "Softmax":
            nodes.append(helper.make_node("Softmax", [cur], [out], axis=int(r.integers(-rank, rank))))
        elif op == "Split":
            ax = int(r.integers(0, rank))
            if shp[ax] < 2:
                continue
            a = int(r.integers(1, shp[ax]))
            parts = [a, shp[ax] - a]
            if opset >= 13:
                inits.append(_c(f"sp{li}", np.array(parts, np.int64)))
                nodes.append(helper.make_node("Split", [cur, f"sp{li}"], [out, out + "b"], axis=ax))
            else:
                nodes.append(helper.make_node("Split", [cur], [out, out + "b"], axis=ax, split=parts))
            shp = list(shp)
            shp[ax] = a
        elif op == "Gather":
            ax = int(r.integers(0, rank))
            length = shp[ax]
            idx = r.integers(-length, length, int(r.integers(1, 5))).astype(np.int64)
            if r.random() < 0.3:
                idx = np.array(int(r.integers(0, length)), np.int64)
            inits.append(_c(f"gi{li}", idx))
            nodes.append(helper.make_node("Gather", [cur, f"gi{li}"], [out], axis=ax))
            shp = shp[:ax] + list(idx.shape) + shp[ax + 1:]
        elif op == "DepthToSpace":
            if rank != 4 or shp[1] % 4:
                continue
            nodes.append(helper.make_node("DepthToSpace", [cur], [out], blocksize=2,
                                          mode=str(r.choice(["DCR", "CRD"]))))
            shp = [shp[0], shp[1] // 4, shp[2] * 2, shp[3] * 2]
        elif op == "Tile":
            rep = [int(v) for v in r.integers(1, 3, rank)]
            inits.append(_c(f"rp{li}", np.array(rep, np.int64)))
            nodes.append(helper.make_node("Tile", [cur, f"rp{li}"], [out]))
            shp = [a * b for a, b in zip(shp, rep)]
        elif op == "Expand":
            target = [d if d != 1 or r.random() < 0.5 else int(r.choice([1, 3])) for d in shp]
            inits.append(_c(f"ex{li}", np.array(target, np.int64)))
            nodes.append(helper.make_node("Expand", [cur, f"ex{li}"], [out]))
            shp = target
        elif op == "LRN":
            if rank != 4:
                continue
            nodes.append(helper.make_node("LRN", [cur], [out], size=int(r.choice([1, 3, 5])), alpha=1e-3, beta=0.75,
                                          bias=float(r.choice([1.0, 2.0]))))
        elif op == "LayerNormalization":
            if opset < 17:
                continue
            ax = int(r.choice([-1, rank - 1, 1 if rank > 1 else -1]))
            normalized = shp[ax:]
            inits += [_c(f"ls{li}", (r.random(normalized) + 0.5).astype(np.float32)),
                      _c(f"lb{li}", r.standard_normal(normalized).astype(np.float32))]
            nodes.append(helper.make_node("LayerNormalization", [cur, f"ls{li}", f"lb{li}"], [out], axis=ax,
                                          epsilon=1e-5))
        elif op == "Pow":
            inits.append(_c(f"e{li}", np.array(float(r.choice([1, 2, 3, -1, 0.5])), np.float32)))
            nodes.append(helper.make_node("Pow", [cur, f"e{li}"], [out]))
        elif op == "MaxMin":
            inits.append(_c(f"mm{li}", np.array(float(r.choice([0.0, -0.5, 1.0])), np.float32)))
            nodes.append(helper.make_node(str(r.choice(["Max", "Min"])), [cur, f"mm{li}"], [out]))
        elif op == "SqueezeUnsqueeze":
            ax = int(r.integers(0, rank + 1))
            if opset >= 13:
                inits.append(_c(f"ua{li}", np.array([ax], np.int64)))
                nodes.append(helper.make_node("Unsqueeze", [cur, f"ua{li}"], [out + "u"]))
                nodes.append(helper.make_node("Squeeze", [out + "u", f"ua{li}"], [out]))
            else:
                nodes.append(helper.make_node("Unsqueeze", [cur], [out + "u"], axes=[ax]))
                nodes.append(helper.make_node("Squeeze", [out + "u"], [out], axes=[ax]))
        elif op == "Transpose":
            perm = [int(v) for v in r.permutation(rank)]
            nodes.append(helper.make_node("Transpose", [cur], [out], perm=perm))
            shp = [shp[p] for p in perm]
        elif op in ("ReduceSum", "ReduceMean"):
            axes = sorted(int(v) for v in r.choice(rank, int(r.integers(1, rank + 1)), replace=False))
            kd = 1 if len(axes) == rank else int(r.random() < 0.5)
            if (op == "ReduceSum" and opset >= 13) or (op == "ReduceMean" and opset >= 18):
                inits.append(_c(f"ax{li}", np.array(axes, np.int64)))
                nodes.append(helper.make_node(op, [cur, f"ax{li}"], [out], keepdims=kd))
            else:
                nodes.append(helper.make_node(op, [cur], [out], axes=axes, keepdims=kd))
            shp = [1 if i in axes else d for i, d in enumerate(shp)] if kd else [d for i, d in enumerate(shp)
                                                                                 if i not in axes]
        elif op == "SubDiv":
            kind = str(r.choice(["Sub", "Div"]))
            bshape = [d if r.random() < 0.5 else 1 for d in shp][int(r.integers(0, rank)):]
            v = r.standard_normal(bshape).astype(np.float32)
            if kind == "Div":
                v = v + np.sign(v) * 0.5
            inits.append(_c(f"sd{li}", v))
            ins = [cur, f"sd{li}"] if kind == "Div" or r.random() < 0.5 else [f"sd{li}", cur]
            nodes.append(helper.make_node(kind, ins, [out]))
        elif op == "SumMean":
            inits.append(_c(f"sm{li}", r.standard_normal([shp[-1]]).astype(np.float32)))
            nodes.append(helper.make_node(str(r.choice(["Sum", "Mean"])), [cur, f"sm{li}", cur], [out]))
        elif op == "NegSigmoid":
            nodes.append(helper.make_node("Neg", [cur], [out + "n"]))
            nodes.append(helper.make_node("Sigmoid", [out + "n"], [out]))
        elif op == "Gelu":
            if opset < 20:
                continue
            nodes.append(helper.make_node("Gelu", [cur], [out], approximate=str(r.choice(["none", "tanh"]))))
        elif op == "HardSwish":
            if opset < 14:
                continue
            nodes.append(helper.make_node("HardSwish", [cur], [out]))
        elif op == "GlobalMaxPool":
            if rank != 4:
                continue
            nodes.append(helper.make_node(op, [cur], [out]))
            shp = shp[:2] + [1, 1]
        elif op == "Tanh":
            nodes.append(helper.make_node(op, [cur], [out]))
        cur = out
    built = _model(nodes, inits, shape0, len(shp), opset, r)
    return _tail(built, seed) if tail else built


# seeds from here on may end their graph in one more node (`_tail`); the seeds below keep the graphs they had
TAIL_FROM = 111 * 10 ** 6


def _tail(built, seed: int):
    """For seeds from TAIL_FROM: half the graphs end in Shrink, ThresholdedRelu, or a Where of IsNaN, IsInf or a
    comparison with +-inf (shape-preserving), drawn from a side generator so the main draws stay what they were."""
    if built is None or seed < TAIL_FROM:
        return built
    from onnx import helper
    s = np.random.default_rng([seed, 23])
    if s.random() < 0.5:
        return built
    model, x = built
    g = model.graph
    g.node[-1].output[0] = "pre"
    kind = str(s.choice(["Shrink", "ThresholdedRelu", "IsNaN", "IsInf", "Equal", "Less", "Greater"]))
    if kind == "Shrink":
        g.node.append(helper.make_node("Shrink", ["pre"], ["y"], lambd=float(s.choice([0.0, 0.3, 1.0])),
                                       bias=float(s.choice([0.0, 0.2]))))
    elif kind == "ThresholdedRelu":
        g.node.append(helper.make_node("ThresholdedRelu", ["pre"], ["y"], alpha=float(s.choice([0.1, 1.0]))))
    else:
        if kind == "IsInf":
            g.node.append(helper.make_node("IsInf", ["pre"], ["m"], detect_positive=int(s.integers(2)),
                                           detect_negative=int(s.integers(2))))
        elif kind == "IsNaN":
            g.node.append(helper.make_node("IsNaN", ["pre"], ["m"]))
        else:
            g.initializer.append(_c("inf", np.array(float(s.choice([np.inf, -np.inf])), np.float32)))
            g.node.append(helper.make_node(kind, ["pre", "inf"] if s.random() < 0.5 else ["inf", "pre"], ["m"]))
        g.initializer.append(_c("fill", np.array([float(s.choice([0.0, -1.5]))], np.float32)))
        g.node.append(helper.make_node("Where", ["m", "fill", "pre"], ["y"]))
    return model, x


def _model(nodes, inits, shape, rank, opset, r):
    from onnx import TensorProto, helper
    if not nodes:
        return None
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [f"d{i}" for i in range(rank)])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model, r.standard_normal(shape).astype(np.float32)


def _rel(got, want) -> float:
    """Max |got - want| over the finite entries / max |want| there; inf where shapes, or the non-finite
    entries, differ."""
    if got.shape != want.shape:
        return float("inf")
    fin = np.isfinite(want)
    if not np.array_equal(np.isfinite(got), fin) or not np.array_equal(got[~fin], want[~fin], equal_nan=True):
        return float("inf")
    if not fin.any():
        return 0.0
    scale = float(np.abs(want[fin]).max()) or 1.0
    return float(np.abs(got[fin].astype(np.float64) - want[fin]).max()) / scale


def check(kind: str, seed: int) -> str | None:
    """None (computed right, refused by name, or a graph ONNX Runtime rejects), or what went wrong."""
    import onnxruntime as ort

    import tilefuse
    from tilefuse.errors import TilefuseError
    built = (build_spatial if kind == "spatial" else build_tensor)(seed, tail=True)
    if built is None:
        return None
    model, x = built
    blob = model.SerializeToString()
    try:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.log_severity_level = 4
        want = ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    except Exception:        # not a valid graph for ONNX Runtime: nothing to compare
        return None
    ops = [n.op_type for n in model.graph.node]
    try:
        net = tilefuse.from_onnx(model)
        got = np.asarray(tilefuse.Session(tilefuse.compile(net, threads=2), threads=2).run(x))
    except TilefuseError:
        return None
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:200]} ({ops})"
    err = _rel(got, want)
    if not err <= RTOL:
        with np.errstate(all="ignore"):
            err = min(err, _rel(got, _evaluator(model).run(None, {"x": x})[0]))
    if not err <= RTOL and _rounding_decides(model, x, got, want, seed):
        return None
    return None if err <= RTOL else f"error {err:.3g} against ONNX Runtime and the ONNX reference ({ops})"


def _evaluator(model):
    """ONNX's reference evaluator, its LRN replaced: onnx 1.23.2's loops the channel over the batch axis
    (`for c in range(x.shape[0])`), so every channel from N on gets a square sum of 0 (seed 77014535); its
    BatchNormalization, dilated Conv and GELU too (below)."""
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.op_run import OpRun

    class LRN(OpRun):
        op_domain = ""

        def _run(self, x, alpha=None, beta=None, bias=None, size=None):
            c = x.shape[1]
            sq = np.zeros_like(x)
            for k in range(c):       # ONNX's window: [k - floor((size - 1) / 2), k + ceil((size - 1) / 2)]
                sq[:, k] = np.sum(x[:, max(0, k - (size - 1) // 2):min(c, k + size // 2 + 1)] ** 2, axis=1)
            return ((x / (bias + (alpha / size) * sq) ** beta).astype(x.dtype),)

    class BatchNormalization(OpRun):
        """Inference BN (batch statistics only with training_mode=1, opset 14+): onnx 1.23.2's BatchNormalization_9
        takes the schema's default momentum 0.9 as training and mixes in the batch's statistics (seed 11063615)."""
        op_domain = ""

        def _run(self, x, scale, bias, mean, var, epsilon=None, momentum=None, training_mode=None, **_):
            if training_mode:
                axes = (0,) + tuple(range(2, x.ndim))
                mean, var = x.mean(axis=axes), x.var(axis=axes)
            shape = (1, -1) + (1,) * (x.ndim - 2)
            y = scale.reshape(shape) * (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + epsilon) \
                + bias.reshape(shape)
            return (y.astype(x.dtype),)

    class Conv(OpRun):
        """A dilated 2-D Conv tap by tap: onnx's inserts zeros between the taps of a dilated kernel, and 0 x NaN
        made a NaN from input positions no tap reads (sqrt of a negative one column over, seed 12010801)."""
        op_domain = ""

        def _run(self, x, w, b=None, auto_pad=None, dilations=None, group=None, kernel_shape=None, pads=None,
                 strides=None):
            from onnx.reference.ops.op_conv import _conv_implementation
            if x.ndim != 4 or not dilations or all(d == 1 for d in dilations):
                return (_conv_implementation(x, w, b, auto_pad, dilations, group, kernel_shape, pads,
                                             strides).astype(x.dtype),)
            (sh, sw), (dh, dw), (kh, kw) = strides or (1, 1), dilations, w.shape[2:]
            g = group or 1
            eh, ew = (kh - 1) * dh + 1, (kw - 1) * dw + 1
            if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                pads, tails = [], []
                for d, s_, e in ((x.shape[2], sh, eh), (x.shape[3], sw, ew)):
                    need = max(0, (-(-d // s_) - 1) * s_ + e - d)
                    head = (need + 1) // 2 if auto_pad == "SAME_LOWER" else need // 2
                    pads.append(head)
                    tails.append(need - head)
                pads = pads + tails
            elif auto_pad == "VALID" or pads is None:
                pads = [0, 0, 0, 0]
            xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
            ho, wo = (xp.shape[2] - eh) // sh + 1, (xp.shape[3] - ew) // sw + 1
            n, c = x.shape[:2]
            o = w.shape[0]
            y = np.zeros((n, o, ho, wo), x.dtype)
            xg = xp.reshape(n, g, c // g, *xp.shape[2:])
            wg = w.reshape(g, o // g, c // g, kh, kw)
            for i in range(kh):
                for j in range(kw):
                    win = xg[:, :, :, i * dh:i * dh + (ho - 1) * sh + 1:sh, j * dw:j * dw + (wo - 1) * sw + 1:sw]
                    y += np.einsum("ngchw,goc->ngohw", win, wg[:, :, :, i, j]).reshape(n, o, ho, wo)
            if b is not None:
                y += b.reshape(1, -1, 1, 1)
            return (y.astype(x.dtype),)

    class Gelu(OpRun):
        """GELU(erf) with Phi = erfc(-x / sqrt 2) / 2: onnx's x / 2 (1 + erf(x / sqrt 2)) cancels, in float64 too (0
        below x = -8.3, where tilefuse's float32 GELU(-9) is -1.0e-18 and a reciprocal after it finite: seed
        101115614); the tanh form as onnx's."""
        op_domain = ""

        def _run(self, x, approximate=None):
            from scipy.special import erfc
            if approximate == "tanh":
                y = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
            else:
                y = 0.5 * x * erfc(-x / np.sqrt(2))
            return (y.astype(x.dtype),)

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)

    def softmax(x, axis, log):
        """Softmax / LogSoftmax; before opset 13 over the input coerced to 2-D at `axis` (onnx's evaluator takes
        every version as 13's one axis: seeds 12066739, 12069362)."""
        shape = x.shape
        if opset < 13:
            axis = 1 if axis is None else axis
            axis += x.ndim if axis < 0 else 0
            x = x.reshape(int(np.prod(shape[:axis], dtype=np.int64)), -1)
            axis = 1
        axis = -1 if axis is None else axis
        t = x - x.max(axis=axis, keepdims=True)
        y = t - np.log(np.exp(t).sum(axis=axis, keepdims=True)) if log else \
            np.exp(t) / np.exp(t).sum(axis=axis, keepdims=True)
        return (y.reshape(shape).astype(x.dtype),)

    def given_axis(node, axis):
        """The node's own axis, or None: OpRun fills a missing one with the newest schema's default (-1), not
        the model's opset's (1 before 13: seed 15125578)."""
        return axis if any(a.name == "axis" for a in node.attribute) else None

    class Softmax(OpRun):
        op_domain = ""

        def _run(self, x, axis=None):
            return softmax(x, given_axis(self.onnx_node, axis), False)

    class LogSoftmax(OpRun):
        op_domain = ""

        def _run(self, x, axis=None):
            return softmax(x, given_axis(self.onnx_node, axis), True)

    class Squeeze(OpRun):
        """An empty `axes` squeezes every axis of size 1, as ONNX Runtime reads it (onnx's squeezes none)."""
        op_domain = ""

        def _run(self, x, *inputs, axes=None):
            given = axes if axes is not None else (inputs[0] if inputs and inputs[0] is not None else None)
            given = [] if given is None else [int(v) for v in np.asarray(given).reshape(-1)]
            return (np.squeeze(x) if not given else np.squeeze(x, axis=tuple(given)),)

    return ReferenceEvaluator(model, new_ops=[LRN, BatchNormalization, Conv, Softmax, LogSoftmax, Squeeze, Gelu])


def _float64_model(model):
    """The graph in float64 (input, output, float initializers), for ONNX's reference evaluator."""
    import copy

    from onnx import TensorProto, numpy_helper
    m = copy.deepcopy(model)
    for vi in list(m.graph.input) + list(m.graph.output):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.DOUBLE
    for i, t in enumerate(m.graph.initializer):
        if t.data_type == TensorProto.FLOAT:
            m.graph.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64),
                                                                    t.name))
    return m


def _rounded_model(model64, values: dict, rng):
    """model64 (`_float64_model`) with float32's rounding modelled at every node: each float output t of a node
    times (1 + 2^-24 x a normal draw) plus 2^-149 x another draw (a subnormal's quantum: 6e-45 against 7e-45,
    seed 12072864) per element (t renamed t.raw, a Mul and an Add by the draws make t), shapes from
    `values` (a run with intermediate=True). A float64 evaluation of it moves as float32 rounding inside the graph
    moves the result: a LayerNorm's outputs summed to ~0 move by ~1e-7 of their terms where the input's
    rounding alone moves them by nothing (seed 12060690)."""
    import copy

    from onnx import helper, numpy_helper
    m = copy.deepcopy(model64)
    nodes = []
    for nd in m.graph.node:
        muls = []
        for k, t in enumerate(nd.output):
            v = values.get(t)
            if not t or not isinstance(v, np.ndarray) or v.dtype != np.float64:
                continue
            nd.output[k] = t + ".raw"
            noise = 1.0 + 2.0 ** -24 * rng.standard_normal(v.shape)
            under = 2.0 ** -149 * rng.standard_normal(v.shape)          # a subnormal's quantum
            if nd.op_type == "Gelu" and isinstance(values.get(nd.input[0]), np.ndarray):
                # x / 2 (1 + erf(x / sqrt 2)): 1 + erf cancels in the tail, a rounding of erf moves the result
                # by 2^-24 |x| / 2 (PyTorch's GELU is 3e-4 off at -3.55 too; seeds 14017953, 14044539)
                under = under + 2.0 ** -25 * np.abs(values[nd.input[0]]) * rng.standard_normal(v.shape)
            m.graph.initializer.append(numpy_helper.from_array(noise, t + ".rounding"))
            m.graph.initializer.append(numpy_helper.from_array(under, t + ".underflow"))
            muls.append(helper.make_node("Mul", [t + ".raw", t + ".rounding"], [t + ".rounded"]))
            muls.append(helper.make_node("Add", [t + ".rounded", t + ".underflow"], [t]))
        nodes += [nd] + muls
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return m


def _element_errors(got, want) -> np.ndarray:
    """Per element: |got - want| / max|want| (over want's finite entries) where both are finite, 0 where both
    are the same non-finite value (NaN and NaN, inf and inf), inf where one is finite and the other not."""
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    fin = np.isfinite(w)
    scale = float(np.abs(w[fin]).max()) if fin.any() else 1.0
    with np.errstate(invalid="ignore"):
        e = np.where(fin & np.isfinite(g), np.abs(g - w) / (scale or 1.0), np.inf)
    same = ~fin & ~np.isfinite(g) & ((np.isnan(g) & np.isnan(w)) | (g == w))
    return np.where(same, 0.0, e)


def _rounding_decides(model, x, got, want, seed) -> bool:
    """Whether the draw is one float32 rounding decides (ill-conditioned: a mean of 162 values that cancel to
    1e-5 of their sum, seed 76047196; a Pow of a LayerNorm to the fourth power, 77002218), with the graph in
    float64 (ONNX's reference evaluator) as the truth: every output within RTOL of ONNX Runtime's, or within
    RTOL of the float64 one, or 4x what float32's rounding of the input and of every node's output (each value
    x (1 + 2^-24 x a normal draw), two draws, `_rounded_model`) moves it. Element by element, non-finite ones
    included: the sign of a value below float32's reach decides a NaN after it (sqrt of GELU(-5.6), -2.6e-9,
    where float32 frameworks give 0; ORT's own GELU is +3e-7 at -5.15, seed 79056053). ONNX Runtime's own error does not
    widen the tolerance: its LRN is 0.24% off the formula on seed 77052015, where tilefuse is 1.2e-7 off. The float64
    evaluation counts only where it is the function ORT computes: ORT within 5% of it (or 16x what the modelled rounding
    moves it by: a reduction rounds once per term where the model rounds once per node; ORT 6x on 12060690) on at least
    half of the outputs (ORT is 0.6% off on 77025285, a GELU tail).
    """
    if got.shape != want.shape:
        return False
    try:
        m64 = _float64_model(model)
        ev = _evaluator(m64)
        with np.errstate(all="ignore"):
            x64 = x.astype(np.float64)
            values = ev.run(None, {"x": x64}, intermediate=True)
            ref = np.asarray(ev.run(None, {"x": x64})[0], np.float64)
            rs = np.random.default_rng([seed, 64])
            moves = [_rel(np.asarray(_evaluator(_rounded_model(m64, values, rs)).run(None, {"x": x64 * (
                1.0 + 2.0 ** -24 * rs.standard_normal(x.shape))})[0], np.float64), ref) for _ in range(2)]
    except Exception:        # an op the float64 evaluation does not take: the float32 verdict stands
        return False
    if ref.shape != got.shape:
        return False
    moves = [m for m in moves if np.isfinite(m)]
    tol64 = max([RTOL] + [4 * m for m in moves])
    if not np.median(_element_errors(want, ref)) <= max(0.05, 4 * tol64):
        return False         # not the function ORT computes (the evaluator's Softmax before opset 13, seed 79)
    ok = (_element_errors(got, want) <= RTOL) | (_element_errors(got, ref) <= tol64)
    return bool(ok.all())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", choices=("spatial", "tensor"), default="spatial")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0, help="first seed: seeds run from seed * 1e6 up")
    a = ap.parse_args(argv)
    from random_nets import run_seeds
    return 1 if run_seeds(lambda seed: check(a.kind, seed), a.seconds, a.seed * 10 ** 6, a.kind) else 0


if __name__ == "__main__":
    sys.exit(main())
