"""Seeded sweeps of single-node ONNX graphs against ONNX Runtime: odd shapes, asymmetric pads,
auto_pad, ceil mode, count_include_pad, groups, dilations, output_padding/output_shape, resize
coordinate modes, pad modes, negative slice indices. Each case must match ONNX Runtime (the
reference evaluator and the compiled Session, fp32, rtol = atol = 1e-4) or be refused with a
tilefuse error; ONNX Runtime rejecting a case skips it. Where ONNX Runtime's output shape
contradicts ONNX's own shape inference (MaxPool with auto_pad SAME and dilations: ONNX Runtime
pads as if undilated), onnx's reference evaluator (`onnx.reference`) is the judge instead; where
that contradicts it too (SAME_LOWER with dilations and strides), the case is skipped after checking
that tilefuse's output has the shape the ONNX spec gives. A sweep that refuses most of its cases
fails (the sweep would test nothing)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tilefuse
from tilefuse.errors import TilefuseError

TOL = 1e-4
N_CASES = 24


def _model(node, x_shape, inits, opset=19):
    g = helper.make_graph([node], "sweep", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    # declare the output shape ONNX infers, so the importer's declared-shape check applies too
    from onnx import shape_inference
    return shape_inference.infer_shapes(m)


def _check(model, x):
    try:
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    except Exception:
        return "invalid"
    declared = [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
    if list(want.shape) != declared:
        from onnx.reference import ReferenceEvaluator
        want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    try:
        net = tilefuse.from_onnx(model)
    except TilefuseError:
        return "refused"
    if list(want.shape) != declared:      # both implementations differ from the spec's shape
        assert list(net.outputs[0].shape) == declared
        return "invalid"
    got_ref = tilefuse.evaluate(net, x)[0]
    got = tilefuse.Session(tilefuse.compile(net)).run(x)
    desc = helper.printable_node(model.graph.node[0])
    np.testing.assert_allclose(got_ref, want, rtol=TOL, atol=TOL, err_msg=f"reference: {desc}")
    np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL, err_msg=f"compiled: {desc}")
    return "pass"


def _pool(rng):
    op = rng.choice(["MaxPool", "AveragePool"])
    k = [int(rng.integers(1, 4)), int(rng.integers(1, 4))]
    a = {"kernel_shape": k}
    if rng.random() < 0.7:
        a["strides"] = [int(rng.integers(1, 3)), int(rng.integers(1, 3))]
    if rng.random() < 0.3:
        a["auto_pad"] = str(rng.choice(["SAME_UPPER", "SAME_LOWER", "VALID"]))
    else:
        a["pads"] = [int(rng.integers(0, k[0] // 2 + 1)), int(rng.integers(0, k[1] // 2 + 1)),
                     int(rng.integers(0, k[0] // 2 + 1)), int(rng.integers(0, k[1] // 2 + 1))]
        a["ceil_mode"] = int(rng.integers(0, 2))
    if op == "AveragePool":
        a["count_include_pad"] = int(rng.integers(0, 2))
    elif rng.random() < 0.3:
        a["dilations"] = [int(rng.integers(1, 3)), int(rng.integers(1, 3))]
    shape = (int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(4, 10)), int(rng.integers(4, 10)))
    return helper.make_node(op, ["x"], ["y"], **a), shape, {}


def _conv(rng):
    g = int(rng.choice([1, 2, 3]))
    c, m = g * int(rng.integers(1, 3)), g * int(rng.integers(1, 3))
    k = [int(rng.integers(1, 4)), int(rng.integers(1, 4))]
    a = {"group": g, "strides": [int(rng.integers(1, 3)), int(rng.integers(1, 3))],
         "dilations": [int(rng.integers(1, 3)), int(rng.integers(1, 3))]}
    if rng.random() < 0.3:
        a["auto_pad"] = str(rng.choice(["SAME_UPPER", "SAME_LOWER", "VALID"]))
    else:
        a["pads"] = [int(v) for v in rng.integers(0, 3, 4)]
    inits = {"w": rng.standard_normal((m, c // g, *k)).astype(np.float32)}
    ins = ["x", "w"]
    if rng.random() < 0.5:
        inits["b"] = rng.standard_normal(m).astype(np.float32)
        ins.append("b")
    shape = (int(rng.integers(1, 3)), c, int(rng.integers(5, 10)), int(rng.integers(5, 10)))
    return helper.make_node("Conv", ins, ["y"], **a), shape, inits


def _conv_transpose(rng):
    g = int(rng.choice([1, 2]))
    c, m = g * int(rng.integers(1, 3)), g * int(rng.integers(1, 3))
    k = [int(rng.integers(1, 4)), int(rng.integers(1, 4))]
    s = [int(rng.integers(1, 3)), int(rng.integers(1, 3))]
    d = [int(rng.integers(1, 3)), int(rng.integers(1, 3))]
    a = {"group": g, "strides": s, "dilations": d}
    shape = (1, c, int(rng.integers(3, 6)), int(rng.integers(3, 6)))
    r = rng.random()
    if r < 0.25:
        a["auto_pad"] = str(rng.choice(["SAME_UPPER", "SAME_LOWER"]))
    elif r < 0.45:
        full = [s[i] * (shape[2 + i] - 1) + (k[i] - 1) * d[i] + 1 for i in range(2)]
        a["output_shape"] = [full[i] + int(rng.integers(0, s[i])) for i in range(2)]
    else:
        a["pads"] = [int(rng.integers(0, k[0])), int(rng.integers(0, k[1])),
                     int(rng.integers(0, k[0])), int(rng.integers(0, k[1]))]
        a["output_padding"] = [int(rng.integers(0, max(s[0], d[0]))), int(rng.integers(0, max(s[1], d[1])))]
    inits = {"w": rng.standard_normal((c, m // g, *k)).astype(np.float32)}
    return helper.make_node("ConvTranspose", ["x", "w"], ["y"], **a), shape, inits


def _resize(rng):
    mode = str(rng.choice(["nearest", "linear"]))
    coord = str(rng.choice(["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"]))
    a = {"mode": mode, "coordinate_transformation_mode": coord}
    if mode == "nearest":
        a["nearest_mode"] = str(rng.choice(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]))
    shape = (1, 2, int(rng.integers(2, 7)), int(rng.integers(2, 7)))
    if rng.random() < 0.5:
        inits = {"roi": np.zeros(0, np.float32),
                 "scales": np.array([1, 1, rng.choice([0.5, 1.5, 2.0, 3.0]), rng.choice([0.6, 2.0, 2.5])], np.float32)}
        ins = ["x", "roi", "scales"]
    else:
        inits = {"roi": np.zeros(0, np.float32), "scales": np.zeros(0, np.float32),
                 "sizes": np.array([1, 2, rng.integers(1, 12), rng.integers(1, 12)], np.int64)}
        ins = ["x", "roi", "scales", "sizes"]
    return helper.make_node("Resize", ins, ["y"], **a), shape, inits


def _pad_slice(rng):
    shape = (1, int(rng.integers(1, 4)), int(rng.integers(3, 7)), int(rng.integers(3, 7)))
    if rng.random() < 0.5:
        mode = str(rng.choice(["constant", "reflect", "edge"]))
        pads = np.array([0, 0, rng.integers(0, 3), rng.integers(0, 3), 0, 0, rng.integers(0, 3),
                         rng.integers(0, 3)], np.int64)
        return (helper.make_node("Pad", ["x", "pads", "v"], ["y"], mode=mode), shape,
                {"pads": pads, "v": np.array(rng.standard_normal(), np.float32)})
    axes = rng.permutation(4)[:int(rng.integers(1, 3))]
    starts = [int(rng.integers(-shape[a] - 2, shape[a])) for a in axes]          # clamped and negative
    ends = [int(rng.choice([rng.integers(-shape[a], shape[a] + 3), 1 << 40])) for a in axes]
    steps = [int(rng.choice([1, 1, 2, 3, -1])) for _ in axes]                    # -1: refused (reversal)
    return (helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"]), shape,
            {"s": np.array(starts, np.int64), "e": np.array(ends, np.int64), "a": np.array(axes, np.int64),
             "t": np.array(steps, np.int64)})


def _pad_crop(rng):
    """Pads with negative entries (a crop) on any axis, in every mode."""
    shape = (int(rng.integers(1, 3)), int(rng.integers(1, 5)), int(rng.integers(3, 8)), int(rng.integers(3, 8)))
    mode = str(rng.choice(["constant", "reflect", "edge"]))
    pads = rng.integers(-2, 3, 8)
    pads[[0, 4]] = np.minimum(pads[[0, 4]], 0) if rng.random() < 0.3 else 0     # batch: crop only, sometimes
    if mode != "constant":
        pads[[1, 5]] = np.minimum(pads[[1, 5]], 0)                               # channels: no reflected pad
    return (helper.make_node("Pad", ["x", "pads", "v"], ["y"], mode=mode), shape,
            {"pads": pads.astype(np.int64), "v": np.array(rng.standard_normal(), np.float32)})


def _binary(rng):
    r = int(rng.integers(1, 5))
    shape = tuple(int(v) for v in rng.integers(1, 5, r))
    # a constant that broadcasts against x: a suffix of x's shape with some dims set to 1
    k = int(rng.integers(0, r + 1))
    cshape = tuple(1 if rng.random() < 0.5 else d for d in shape[r - k:])
    if rng.random() < 0.3 and r >= 2:
        cshape = (shape[1],) + (1,) * (r - 2)            # per channel, the scale op's case
    op = str(rng.choice(["Add", "Sub", "Mul", "Div"]))
    c = (rng.uniform(0.5, 2.0, cshape) * rng.choice([-1, 1])).astype(np.float32)
    ins = ["c", "x"] if rng.random() < 0.3 and op != "Div" else ["x", "c"]
    return helper.make_node(op, ins, ["y"]), shape, {"c": c}


def _gemm(rng):
    m, k, n = (int(v) for v in rng.integers(1, 6, 3))
    ta, tb = int(rng.integers(0, 2)), int(rng.integers(0, 2))
    a = {"transA": ta, "transB": tb, "alpha": float(rng.choice([1.0, 0.5, -2.0])),
         "beta": float(rng.choice([1.0, 0.25]))}
    inits = {"b": rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)}
    ins = ["x", "b"]
    if rng.random() < 0.7:
        inits["c"] = rng.standard_normal([(), (n,), (1, n), (m, n), (m, 1)][int(rng.integers(0, 5))]).astype(np.float32)
        ins.append("c")
    return helper.make_node("Gemm", ins, ["y"], **a), ((k, m) if ta else (m, k)), inits


SWEEPS = {"pool": _pool, "conv": _conv, "conv_transpose": _conv_transpose, "resize": _resize,
          "pad_slice": _pad_slice, "pad_crop": _pad_crop, "binary": _binary, "gemm": _gemm}


@pytest.mark.parametrize("kind", sorted(SWEEPS))
def test_sweep_against_onnxruntime(kind):
    rng = np.random.default_rng(sorted(SWEEPS).index(kind))
    counts = {"pass": 0, "refused": 0, "invalid": 0}
    for _ in range(N_CASES):
        node, shape, inits = SWEEPS[kind](rng)
        x = rng.standard_normal(shape).astype(np.float32)
        counts[_check(_model(node, shape, inits), x)] += 1
    assert counts["pass"] >= N_CASES // 2, counts


def test_pad_that_crops_and_reflects_past_the_crop_is_refused():
    """ONNX Runtime crops before it reflects and rejects (3, -2) on a width of 5; PyTorch pads first (tilefuse's
    Network.pad, used by from_torch). from_onnx refuses rather than give PyTorch's answer to an ONNX graph."""
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")
    model = _model(node, (1, 2, 4, 5), {"pads": np.array([0, 0, 0, 3, 0, 0, 0, -2], np.int64)})
    with pytest.raises(TilefuseError, match=r"reflect pads \(3, -2\) on axis 3 of size 5"):
        tilefuse.from_onnx(model)
    ok = _model(node, (1, 2, 4, 5), {"pads": np.array([0, 0, 0, 2, 0, 0, 0, -2], np.int64)})
    x = np.random.default_rng(0).standard_normal((1, 2, 4, 5)).astype(np.float32)
    assert _check(ok, x) == "pass"
