"""from_onnx: models exported by torch.onnx (legacy exporter) and hand-built ONNX graphs,
compiled and run, against ONNX Runtime and PyTorch (fp32, rtol = atol = 1e-4)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn
from onnx import TensorProto, helper, numpy_helper

import tilefuse
from tilefuse import models
from onnx_export import export as export_with, ort_run as ort_x
from tilefuse.errors import GraphError, UnsupportedOpError
from torch_zoo import load as torch_zoo_load

RTOL = ATOL = 1e-4


def export(module, x, dynamic=False):
    return export_with(module, x, "torchscript", dynamic=dynamic)


def ort_run(blob, x):
    return [ort_x(blob, x)]


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 9, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(9)
        self.c2 = nn.Conv2d(9, 9, 3, padding=2, dilation=2, groups=3)
        self.c3 = nn.Conv2d(9, 5, 1)
        self.pool = nn.MaxPool2d(3, 2, padding=1, ceil_mode=True)
        self.ap = nn.AvgPool2d(2)
        self.fc = nn.Linear(14 * 2 * 2, 6)

    def forward(self, x):
        y = torch.relu(self.bn(self.c1(x)))
        y = y + self.c2(y)
        z = torch.cat([self.c3(y), y], 1)
        z = self.ap(self.pool(z))
        return torch.softmax(self.fc(torch.flatten(z, 1)), 1)


def test_small_model_matches_ort_and_torch():
    torch.manual_seed(0)
    m = Small().eval()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2)
    x = np.random.default_rng(0).standard_normal((2, 3, 15, 13)).astype(np.float32)
    blob = export(m, x)
    net = tilefuse.from_onnx(blob)
    y = tilefuse.Session(tilefuse.compile(net)).run(x)
    np.testing.assert_allclose(y, ort_run(blob, x)[0], rtol=RTOL, atol=ATOL)
    with torch.no_grad():
        np.testing.assert_allclose(y, m(torch.from_numpy(x)).numpy(), rtol=RTOL, atol=ATOL)


def test_resnet18_from_onnx_file(tmp_path):
    net0 = models.resnet18(seed=1, batch=1, image_size=64)
    tm = torch_zoo_load("resnet18", net0)
    x = np.random.default_rng(2).standard_normal((1, 3, 64, 64)).astype(np.float32)
    path = tmp_path / "r18.onnx"
    path.write_bytes(export(tm, x, dynamic=True))
    with pytest.raises(GraphError, match="symbolic shape"):
        tilefuse.from_onnx(path)
    net = tilefuse.from_onnx(path, input_shapes={"x": (1, 3, 64, 64)})
    y = tilefuse.Session(tilefuse.compile(net)).run(x)
    np.testing.assert_allclose(y, ort_run(path.read_bytes(), x)[0], rtol=RTOL, atol=ATOL)


def _graph(nodes, inits=(), out_shape=(1, 4)):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))],
                          initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_matmul_add_becomes_linear_with_bias():
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    b = np.array([1, -2, 3], np.float32)
    model = _graph([helper.make_node("MatMul", ["x", "w"], ["t"], name="mm"),
                    helper.make_node("Add", ["t", "b"], ["y"], name="bias")],
                   [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")], (1, 3))
    net = tilefuse.from_onnx(model)
    x = np.array([[1, 2, 3, 4]], np.float32)
    compiled = tilefuse.compile(net)
    assert [o.op for o in compiled.network.ops] == ["linear"]
    np.testing.assert_allclose(tilefuse.Session(compiled).run(x), x @ w + b, rtol=1e-6)


def test_lrn_node_matches_reference():
    g = helper.make_graph([helper.make_node("LRN", ["x"], ["y"], name="lrn", size=3, alpha=2e-4,
                                            beta=0.75, bias=1.5)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 7, 5, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 7, 5, 4])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    x = np.random.default_rng(0).standard_normal((2, 7, 5, 4)).astype(np.float32) * 3
    y = tilefuse.Session(tilefuse.compile(tilefuse.from_onnx(model))).run(x)
    np.testing.assert_allclose(y, ort_run(model.SerializeToString(), x)[0], rtol=RTOL, atol=ATOL)
    ref = torch.nn.functional.local_response_norm(torch.from_numpy(x), 3, 2e-4, 0.75, 1.5).numpy()
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=ATOL)



@pytest.mark.parametrize("size", [2, 4])
def test_lrn_of_an_even_size_is_refused_by_name(size):
    """ONNX's LRN window for an even size, [c - floor((size - 1) / 2), c + ceil((size - 1) / 2)], starts one
    channel after PyTorch's (the IR's): refused, naming the node and the size (ONNX Runtime refuses it too),
    not computed over the wrong channels."""
    g = helper.make_graph([helper.make_node("LRN", ["x"], ["y"], name="norm", size=size, alpha=0.1)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 3, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 3, 3])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    with pytest.raises(UnsupportedOpError, match=rf"node 'norm'.*size={size} is even.*expected an odd size"):
        tilefuse.from_onnx(model)

def test_unsupported_op_names_op_and_node():
    model = _graph([helper.make_node("Hardmax", ["x"], ["y"], name="gate")])
    with pytest.raises(UnsupportedOpError, match=r"ONNX op 'Hardmax' in node 'gate'"):
        tilefuse.from_onnx(model)


def test_invalid_bytes():
    with pytest.raises(GraphError, match="not a valid ONNX model"):
        tilefuse.from_onnx(b"\x00\x01garbage")


# ------------------------------------------------------------------ hand-built graphs, one rule each

def _model(nodes, inputs, outputs, inits=(), opset=13, extra_opsets=()):
    """inputs/outputs: [(name, shape or rank)] float tensors (a rank: symbolic dims); inits: [(name, array)]."""
    def vi(n, s):
        return helper.make_tensor_value_info(n, TensorProto.FLOAT, [f"{n}{i}" for i in range(s)]
                                             if isinstance(s, int) else list(s))
    g = helper.make_graph(nodes, "g", [vi(n, s) for n, s in inputs], [vi(n, s) for n, s in outputs],
                          initializer=[numpy_helper.from_array(np.asarray(a), n) for n, a in inits])
    ops = [helper.make_opsetid(d, v) for d, v in extra_opsets] + [helper.make_opsetid("", opset)]
    return helper.make_model(g, opset_imports=ops, ir_version=8)


def _ort(model, **feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _run(model, x):
    net = tilefuse.from_onnx(model)
    y = tilefuse.Session(tilefuse.compile(net)).run(x)
    np.testing.assert_allclose(tilefuse.evaluate(net, x)[0], y, rtol=RTOL, atol=ATOL)
    return y


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pool_without_strides_uses_stride_one(op):
    """ONNX's default stride is 1 (PyTorch's is the kernel size)."""
    x = np.random.default_rng(0).standard_normal((1, 2, 7, 6)).astype(np.float32)
    m = _model([helper.make_node(op, ["x"], ["y"], kernel_shape=[3, 2])], [("x", x.shape)], [("y", 4)])
    y = _run(m, x)
    assert y.shape == (1, 2, 5, 5)
    np.testing.assert_allclose(y, _ort(m, x=x)[0], rtol=RTOL, atol=ATOL)


def test_batchnorm_training_mode_normalizes_by_the_batch_and_refuses_running_outputs():
    """training_mode=1 with only Y read (the exporters' weight standardization): the batch's mean and biased
    variance, scale and B after (numpy's reference); the running statistics read by the graph: refused."""
    c = 3
    rng = np.random.default_rng(0)
    s_, b_ = rng.random(c).astype(np.float32) + 0.5, rng.standard_normal(c).astype(np.float32)
    inits = [("s", s_), ("b", b_), ("m", np.zeros(c, np.float32)), ("v", np.ones(c, np.float32))]
    m = _model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn",
                                 training_mode=1, epsilon=1e-3)], [("x", (2, c, 4, 5))], [("y", 4)], inits, opset=15)
    x = rng.standard_normal((2, c, 4, 5)).astype(np.float32) * 3 + 1
    mu, var = x.mean((0, 2, 3), keepdims=True), x.var((0, 2, 3), keepdims=True)
    want = (x - mu) / np.sqrt(var + 1e-3) * s_.reshape(1, c, 1, 1) + b_.reshape(1, c, 1, 1)
    np.testing.assert_allclose(tilefuse.compile(tilefuse.from_onnx(m)).run(x), want, rtol=1e-5, atol=1e-5)
    mr = _model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], name="bn",
                                  training_mode=1)], [("x", (2, c, 4, 4))], [("y", 4), ("rm", 1)], inits, opset=15)
    with pytest.raises(UnsupportedOpError, match=r"node 'bn' \(BatchNormalization-15\): output 1 'rm'"):
        tilefuse.from_onnx(mr)
    # before opset 14, training mode is written as the extra outputs (mean, var, saved statistics)
    m9 = _model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv", "sm", "sv"],
                                  name="bn")], [("x", (2, c, 4, 4))], [("y", 4)], inits, opset=9)
    with pytest.raises(UnsupportedOpError, match=r"BatchNormalization-9.*training mode"):
        tilefuse.from_onnx(m9)


def test_dropout_training_mode_is_refused():
    t = numpy_helper.from_array(np.array(True), "t")
    r = numpy_helper.from_array(np.array(0.5, np.float32), "r")
    m = _model([helper.make_node("Dropout", ["x", "r", "t"], ["d"], name="drop"),
                helper.make_node("Relu", ["d"], ["y"])], [("x", (1, 4))], [("y", 2)], opset=13)
    m.graph.initializer.extend([t, r])
    with pytest.raises(UnsupportedOpError, match=r"node 'drop' \(Dropout-13\): training_mode=True"):
        tilefuse.from_onnx(m)
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.array(False), "t"))
    x = np.array([[-1, 2, -3, 4]], np.float32)
    np.testing.assert_allclose(_run(m, x), np.maximum(x, 0))


@pytest.mark.parametrize("ratio, mode, message", [
    (np.array([0, 1, 1, 0], np.int64), np.array(False), r"ratio has dtype int64 and shape \(4,\); expected a "
                                                        r"float scalar"),
    (np.array([0.5], np.float32), np.array(False), r"ratio has dtype float32 and shape \(1,\)"),
    (np.array(0.5, np.float32), np.array(0, np.int32), r"training_mode has dtype int32 and shape \(\); expected "
                                                       r"a bool scalar"),
    (np.array(0.5, np.float32), np.array([False]), r"training_mode has dtype bool and shape \(1,\)"),
])
def test_dropout_of_a_wrong_ratio_or_mode_is_refused(ratio, mode, message):
    """Unused at inference, but they make the file invalid: ONNX Runtime refuses it (onnx_mutants seeds 15095788:
    an int64 ratio, 16006568: a ratio of shape (1,); tilefuse ignored them)."""
    m = _model([helper.make_node("Dropout", ["x", "r", "t"], ["y"], name="drop")], [("x", (1, 4))], [("y", 2)],
               opset=13)
    m.graph.initializer.extend([numpy_helper.from_array(mode, "t"), numpy_helper.from_array(ratio, "r")])
    with pytest.raises(Exception, match="Type Error|must be a scalar"):
        ort.InferenceSession(m.SerializeToString())
    with pytest.raises(GraphError, match=r"node 'drop' \(Dropout-13\): " + message):
        tilefuse.from_onnx(m)


@pytest.mark.parametrize("op", ["Softmax"])
@pytest.mark.parametrize("shape, axis, ops", [((2, 3, 1, 1), 1, ["softmax"]), ((2, 3, 2, 2), 3, ["softmax"]),
                                              ((2, 3, 2, 2), 1, ["reshape", "softmax", "reshape"]),
                                              ((2, 3, 4, 2), 2, ["reshape", "softmax", "reshape"]),
                                              ((2, 5), None, ["softmax"])])
def test_softmax_before_opset_13_normalizes_trailing_dims_together(op, shape, axis, ops):
    """Opset < 13: the input is coerced to 2-D at `axis` (default 1), one softmax over all the dims
    from `axis` on (ONNX Runtime implements the same rule)."""
    kw = {} if axis is None else {"axis": axis}
    m = _model([helper.make_node(op, ["x"], ["y"], name="sm", **kw)], [("x", shape)], [("y", len(shape))],
               opset=11)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    net = tilefuse.from_onnx(m)
    assert [o.op for o in net.ops] == ops
    ref = _ort(m, x=x)[0]
    np.testing.assert_allclose(_run(m, x), ref, rtol=RTOL, atol=ATOL)
    if len(ops) > 1:   # the per-axis rule of opset 13 would differ here
        m13 = _model(m.graph.node, [("x", shape)], [("y", len(shape))], opset=13)
        assert np.abs(_ort(m13, x=x)[0] - ref).max() > 1e-3


def test_opset_read_from_the_default_domain():
    """opset_import may list other domains first; the default domain's version decides the semantics
    (Softmax's default axis is 1 before opset 13, -1 from 13)."""
    m = _model([helper.make_node("Softmax", ["x"], ["y"])], [("x", (2, 5))], [("y", 2)], opset=11,
               extra_opsets=[("com.microsoft", 1)])
    assert m.opset_import[0].domain == "com.microsoft"
    x = np.random.default_rng(2).standard_normal((2, 5)).astype(np.float32)
    np.testing.assert_allclose(tilefuse.evaluate(tilefuse.from_onnx(m), x)[0], _ort(m, x=x)[0], rtol=RTOL)
    m.ClearField("opset_import")
    m.opset_import.extend([helper.make_opsetid("ai.onnx.ml", 3)])
    with pytest.raises(GraphError, match="domain ''"):
        tilefuse.from_onnx(m)


def _i64(*v):
    return np.array(v, np.int64)


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_shape_arithmetic_folds(opset):
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, Identity on an initializer, Cast, Range,
    ConstantOfShape, Slice, Squeeze, Constant: all folded, the network is flatten -> linear."""
    unsq = (lambda i, o: helper.make_node("Unsqueeze", [i], [o], axes=[0])) if opset < 13 else \
        (lambda i, o: helper.make_node("Unsqueeze", [i, "ax0"], [o]))
    nodes = [
        helper.make_node("Identity", ["w"], ["w_shared"]),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
        unsq("n", "n1"),
        helper.make_node("Slice", ["shape", "one", "big"], ["tail"]),       # dims 1.. of the shape (unused)
        helper.make_node("Constant", [], ["minus1"], value=numpy_helper.from_array(_i64(-1))),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Cast", ["target"], ["target_f"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["target_f"], ["target_i"], to=TensorProto.INT64),
        helper.make_node("Reshape", ["x", "target_i"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w_shared"], ["mm"]),
        helper.make_node("Range", ["r0", "r1", "r2"], ["ramp"]),               # [0, 1, 2]
        helper.make_node("Cast", ["ramp"], ["rampf"], to=TensorProto.FLOAT),
        helper.make_node("ConstantOfShape", ["three"], ["ones"],
                         value=numpy_helper.from_array(np.array([1.0], np.float32))),
        helper.make_node("Add", ["rampf", "ones"], ["bias"]),                  # [1, 2, 3]
        helper.make_node("Add", ["mm", "bias"], ["y"]),
    ]
    inits = [("w", np.arange(36, dtype=np.float32).reshape(12, 3) / 36), ("zero", np.array(0, np.int64)), ("one", _i64(1)),
             ("big", _i64(1 << 40)), ("ax0", _i64(0)), ("r0", np.array(0, np.int64)), ("r1", np.array(3, np.int64)), ("r2", np.array(1, np.int64)),
             ("three", _i64(3))]
    m = _model(nodes, [("x", (2, 3, 2, 2))], [("y", (2, 3))], inits, opset=opset)
    x = np.random.default_rng(3).standard_normal((2, 3, 2, 2)).astype(np.float32)
    net = tilefuse.from_onnx(m)
    assert [o.op for o in tilefuse.compile(net).network.ops] == ["flatten", "linear"]
    np.testing.assert_allclose(_run(m, x), _ort(m, x=x)[0], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("attr, value, expect", [
    ("value_float", 2.0, 2.0), ("value_floats", [1.0, 2.0, 3.0], [1.0, 2.0, 3.0]),
    ("value", numpy_helper.from_array(np.array([0.5, -1, 4], np.float32)), [0.5, -1, 4]),
    ("sparse_value", helper.make_sparse_tensor(numpy_helper.from_array(np.array([5.0], np.float32)),
                                               numpy_helper.from_array(_i64(1)), [3]), [0, 5, 0]),
])
def test_constant_value_attributes(attr, value, expect):
    m = _model([helper.make_node("Constant", [], ["c"], **{attr: value}),
                helper.make_node("Mul", ["x", "c"], ["y"])], [("x", (2, 3))], [("y", 2)])
    x = np.random.default_rng(4).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(_run(m, x), x * np.asarray(expect, np.float32), rtol=1e-6)


def test_constant_int_attributes_fold_into_shapes():
    m = _model([helper.make_node("Constant", [], ["n"], value_int=2),
                helper.make_node("Constant", [], ["rest"], value_ints=[12]),
                helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
                helper.make_node("Concat", ["n1", "rest"], ["shape"], axis=0),
                helper.make_node("Reshape", ["x", "shape"], ["f"]),
                helper.make_node("Relu", ["f"], ["y"])], [("x", (2, 3, 2, 2))], [("y", (2, 12))],
               [("ax", _i64(0))])
    x = np.random.default_rng(5).standard_normal((2, 3, 2, 2)).astype(np.float32)
    np.testing.assert_allclose(_run(m, x), np.maximum(x.reshape(2, 12), 0))


def test_refusals_name_node_op_and_what_was_expected():
    x = [("x", (1, 3, 5, 5))]
    w = [("w", np.ones((4, 3, 3, 3), np.float32))]
    cases = [
        # (a Conv's computed W is a modulated / dynamic conv: imported, tests/test_computed_weights.py)
        (_model([helper.make_node("ConvTranspose", ["x", "x"], ["y"], name="c2")], x, [("y", 4)]),
         UnsupportedOpError, r"node 'c2' \(ConvTranspose-11\): weight W 'x' is computed by the graph"),
        (_model([helper.make_node("AveragePool", ["x"], ["y"], name="p", kernel_shape=[2, 2], dilations=[2, 2])],
                x, [("y", 4)], opset=19),
         UnsupportedOpError, r"node 'p' \(AveragePool-19\): dilations=\[2, 2\]"),
        (_model([helper.make_node("BatchNormalization", ["x", "s", "s", "s", "s"], ["y"], name="b")], x,
                [("y", 4)], [("s", np.ones(3, np.float32))], opset=6),
         UnsupportedOpError, r"node 'b' \(BatchNormalization-6\): version 6 \(opset 6\) is not supported"),
        (_model([helper.make_node("Relu", ["x"], ["y"], name="r")], x, [("y", (1, 3, 5, 4))]),
         GraphError, r"graph output 'y' \(output of node 'r', Relu\): the importer computes shape \(1, 3, 5, 5\); "
                     r"the model declares \(1, 3, 5, 4\); the graph's ops give the computed one"),
        (_model([helper.make_node("ReduceProd", ["x"], ["y"], name="f", keepdims=1)], x, [("y", 4)]),
         UnsupportedOpError, r"node 'f' \(ReduceProd-13\): tilefuse folds ReduceProd on constants only"),
        (_model([helper.make_node("Gather", ["x", "i"], ["y"], name="g", axis=3)], x, [("y", 4)],
                [("i", np.array([4, 2, 0], np.int64))]),
         None, None),
        (_model([helper.make_node("Gather", ["x", "i"], ["y"], name="g", axis=1)], x, [("y", 4)],
                [("i", np.zeros(0, np.int64))]),
         UnsupportedOpError, r"node 'g' \(Gather-13\): indices of shape \(0,\) are empty"),
        (_model([helper.make_node("MaxPool", ["x"], ["y", "idx"], name="mp", kernel_shape=[2, 2])], x,
                [("y", 4), ("idx", 4)]),
         UnsupportedOpError, r"node 'mp' \(MaxPool-12\): output 1 'idx' \(the Indices\) is used.*only in a MaxUnpool"),
        (_model([helper.make_node("Conv", ["x", "w"], ["y"], name="c3", kernel_shape=[3, 3, 3])],
                [("x", (1, 3, 5, 5, 5))], [("y", 4)], [("w", np.ones((4, 3, 3, 3, 3), np.float32))]),
         UnsupportedOpError, r"node 'c3' \(Conv-11\): input 'x' has shape \(1, 3, 5, 5, 5\); tilefuse implements "
                             r"the 2-D form"),
    ]
    for model, err, pattern in cases:
        if err is None:   # imported: must equal ONNX Runtime
            xv = np.random.default_rng(8).standard_normal((1, 3, 5, 5)).astype(np.float32)
            np.testing.assert_allclose(_run(model, xv), _ort(model, x=xv)[0])
            continue
        with pytest.raises(err, match=pattern):
            tilefuse.from_onnx(model)


def test_inputs_bound_as_constants():
    """constants= binds a graph input (a weight fed as an input) to a fixed value, validated."""
    w = np.random.default_rng(6).standard_normal((4, 3, 3, 3)).astype(np.float32)
    m = _model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
               [("x", (1, 3, 6, 6)), ("w", w.shape)], [("y", 4)])
    x = np.random.default_rng(7).standard_normal((1, 3, 6, 6)).astype(np.float32)
    net = tilefuse.from_onnx(m, constants={"w": w})
    np.testing.assert_allclose(tilefuse.Session(tilefuse.compile(net)).run(x), _ort(m, x=x, w=w)[0],
                               rtol=RTOL, atol=ATOL)
    with pytest.raises(GraphError, match=r"w: constants value has shape \(3, 3, 3\); the model declares \[4, 3, 3, 3\]"):
        tilefuse.from_onnx(m, constants={"w": w[0]})
    with pytest.raises(GraphError, match="not graph inputs"):
        tilefuse.from_onnx(m, constants={"nope": w})


def test_docs_ops_table_matches_the_importer_table():
    """docs/ops.md lists every ONNX rule with its versions, IR ops and limits, and the folded ops."""
    from pathlib import Path

    from tilefuse.frontend.onnx_import import RULES, fold
    text = (Path(__file__).resolve().parents[1] / "docs" / "ops.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] in RULES:
            rows[cells[0]] = cells[1:]
    for op, r in RULES.items():
        assert rows.get(op) == [", ".join(map(str, r.versions)), ", ".join(r.ir), r.limits], op
    folded = text.split("It folds:")[1].split(". `constants")[0]
    for op in fold.FOLD:
        assert op in folded, op


class _Decomposed(nn.Module):
    """LayerNorm and GELU, which exporters spell out of ReduceMean/Pow/Sqrt and Erf before opsets 17/20."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(8)
        self.ln2 = nn.LayerNorm([4, 8], elementwise_affine=False)
        with torch.no_grad():
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        manual = 0.5 * x * (1 + torch.erf(x / 1.4142135623730951))
        return torch.nn.functional.gelu(self.ln(x)) + manual + self.ln2(x)


@pytest.mark.parametrize("opset", [11, 13, 17, 20])
def test_decomposed_layer_norm_and_gelu_are_recognized(opset):
    torch.manual_seed(0)
    m = _Decomposed().eval()
    x = np.random.default_rng(9).standard_normal((2, 4, 8)).astype(np.float32)
    blob = export_with(m, x, "torchscript", opset)
    onnx_ops = {n.op_type for n in onnx.load_from_string(blob).graph.node}
    assert "Erf" in onnx_ops and ("Gelu" in onnx_ops) == (opset >= 20) and ("Sqrt" in onnx_ops) == (opset < 17)
    net = tilefuse.from_onnx(blob)
    ops = [o.op for o in net.ops]
    assert ops.count("layer_norm") == 2
    assert sum(o.op == "activation" and o.params["act"][0] == "gelu" for o in net.ops) == 2
    y = tilefuse.Session(tilefuse.compile(net)).run(x)
    np.testing.assert_allclose(y, ort_x(blob, x), rtol=RTOL, atol=ATOL)
    with torch.no_grad():
        np.testing.assert_allclose(y, m(torch.from_numpy(x)).numpy(), rtol=RTOL, atol=ATOL)


def test_a_chain_that_is_not_gelu_stays_as_written():
    """x * (1 + erf(x / 1.5)) * 0.5 is not GELU: nothing is fused, Erf runs as activation(erf), and the result is
    ONNX Runtime's; with sqrt(2) it is one gelu."""
    nodes = [helper.make_node("Div", ["x", "c15"], ["t"]), helper.make_node("Erf", ["t"], ["e"], name="erf"),
             helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["x", "a"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["y"])]
    inits = [("c15", np.array(1.5, np.float32)), ("one", np.array(1.0, np.float32)),
             ("half", np.array(0.5, np.float32))]
    m = _model(nodes, [("x", (2, 3))], [("y", 2)], inits)
    net = tilefuse.from_onnx(m)
    assert sorted(o.params["act"][0] for o in net.ops if o.op == "activation") == ["erf"]
    x = np.random.default_rng(9).standard_normal((2, 3)).astype(np.float32) * 3
    np.testing.assert_allclose(_run(m, x), _ort(m, x=x)[0], rtol=RTOL, atol=ATOL)
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.array(np.sqrt(2), np.float32), "c15"))
    assert [o.params["act"][0] for o in tilefuse.from_onnx(m).ops if o.op == "activation"] == ["gelu"]
    x = np.random.default_rng(10).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(_run(m, x), _ort(m, x=x)[0], rtol=RTOL, atol=ATOL)


# ------------------------------------------------------------------ files tilefuse did not make (onnx_mutants.py)

@pytest.mark.parametrize("op,attrs", [("ReduceSum", dict(keepdims=-9)), ("ReduceMean", dict(keepdims=2)),
                                      ("Gemm", dict(transB=7))])
def test_flags_other_than_0_or_1_are_refused_by_name(op, attrs):
    """ONNX Runtime reads keepdims=-2^63 as 0 where tilefuse read it as 1 (onnx_mutants seed 1015990): a 0 / 1
    switch with another value is refused, naming the node and the value."""
    if op == "Gemm":
        node = helper.make_node(op, ["x", "w"], ["y"], name="n", **attrs)
        m = _model([node], [("x", (2, 3))], [("y", 2)], [("w", np.ones((3, 3), np.float32))])
    else:
        m = _model([helper.make_node(op, ["x"], ["y"], name="n", **attrs)], [("x", (2, 3))], [("y", 2)])
    key, value = next(iter(attrs.items()))
    with pytest.raises(GraphError, match=rf"node 'n' \({op}-\d+\): attribute {key}={value}; expected 0 or 1"):
        tilefuse.from_onnx(m)


@pytest.mark.parametrize("opset", [11, 13])
def test_squeeze_with_an_empty_axes_list_squeezes_every_axis_of_size_1(opset):
    """An empty `axes` (attribute before opset 13, input from 13) squeezes as no axes, as ONNX Runtime does
    (tilefuse squeezed nothing: seed 1003963)."""
    if opset < 13:
        nodes, inits = [helper.make_node("Squeeze", ["x"], ["y"])], []
        nodes[0].attribute.append(helper.make_attribute("axes", [], attr_type=onnx.AttributeProto.INTS))
    else:
        nodes, inits = [helper.make_node("Squeeze", ["x", "ax"], ["y"])], [("ax", np.zeros(0, np.int64))]
    m = _model([helper.make_node("Relu", ["x0"], ["x"])] + nodes, [("x0", (1, 3, 1, 5))], [("y", 2)], inits,
               opset=opset)
    x = np.random.default_rng(0).standard_normal((1, 3, 1, 5)).astype(np.float32)
    y = _run(m, x)
    assert y.shape == (3, 5)
    np.testing.assert_array_equal(y, _ort(m, x0=x)[0])


def test_unary_ops_of_a_scalar_keep_it_a_scalar():
    """Neg / Reciprocal / Softsign of a tensor squeezed to shape () stay shape () (a (1,) constant operand made
    them (1,): onnx_mutants seed 6018449), and a 0-d initializer stays 0-d."""
    nodes = [helper.make_node("Squeeze", ["x"], ["s"]), helper.make_node("Neg", ["s"], ["n"]),
             helper.make_node("Softsign", ["n"], ["r"]), helper.make_node("Mul", ["r", "k"], ["y"])]
    m = _model(nodes, [("x", (1, 1, 1, 1))], [("y", ())], [("k", np.array(3.0, np.float32))])
    x = np.full((1, 1, 1, 1), 0.75, np.float32)
    y, want = _run(m, x), _ort(m, x=x)[0]
    assert y.shape == want.shape == ()
    np.testing.assert_allclose(y, want, rtol=RTOL)


def test_max_with_an_infinite_bound_stays_infinite():
    """Max(x, inf) is inf and Min(x, -inf) -inf, as ONNX Runtime gives (tilefuse clamped clip bounds to
    +-3.4e38: seed 1036922); Clip(min=0) of inf is inf, as the ONNX spec ("if not specified, there is no upper
    bound"), its reference evaluator and PyTorch's clamp give (ONNX Runtime 1.32's Clip gives 3.4e38 there);
    the bounds survive a package round trip."""
    from onnx.reference import ReferenceEvaluator
    from tilefuse.compiler.package import from_bytes, to_bytes
    nodes = [helper.make_node("Max", ["x", "inf"], ["a"]), helper.make_node("Min", ["x", "ninf"], ["b"]),
             helper.make_node("Concat", ["a", "b"], ["y"], axis=1)]
    inits = [("inf", np.array(np.inf, np.float32)), ("ninf", np.array(-np.inf, np.float32))]
    m = _model(nodes, [("x", (1, 4))], [("y", 2)], inits)
    x = np.array([[1.0, np.inf, -np.inf, -2.0]], np.float32)
    want = _ort(m, x=x)[0]
    np.testing.assert_array_equal(want, [[np.inf] * 4 + [-np.inf] * 4])
    np.testing.assert_array_equal(_run(m, x), want)
    pkg = from_bytes(to_bytes(tilefuse.compile(tilefuse.from_onnx(m)).package))
    np.testing.assert_array_equal(tilefuse.Session(pkg).run(x), want)
    m = _model([helper.make_node("Clip", ["x", "zero"], ["y"])], [("x", (1, 4))], [("y", 2)],
               [("zero", np.array(0.0, np.float32))])
    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    np.testing.assert_array_equal(want, torch.clamp(torch.from_numpy(x), min=0).numpy())
    np.testing.assert_array_equal(_run(m, x), [[1.0, np.inf, 0.0, 0.0]])


@pytest.mark.parametrize("shape", [(1, 7), (1, 16, 3, 5)])
def test_a_negative_zero_bound_keeps_the_sign_of_zero(shape):
    """Max(x, -0.0) and Clip(x, -0.0[, 6]) give -0.0 for negative x (NumPy, PyTorch, ONNX Runtime): 1 / that is
    -inf. tilefuse made them a relu (+0.0, so +inf after a reciprocal: onnx_mutants seed 9053317)."""
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    x.reshape(-1)[:3] = [-0.0, 2.0, -1.0]        # not +0.0: max(+0.0, -0.0) may be either zero (IEEE)
    nz = ("nz", np.array(-0.0, np.float32))
    six = ("six", np.array(6.0, np.float32))
    for first, inits in ((helper.make_node("Max", ["x", "nz"], ["t"]), [nz]),
                         (helper.make_node("Clip", ["x", "nz"], ["t"]), [nz]),
                         (helper.make_node("Clip", ["x", "nz", "six"], ["t"]), [nz, six])):
        m = _model([first, helper.make_node("Reciprocal", ["t"], ["y"])], [("x", shape)], [("y", len(shape))], inits)
        want = _ort(m, x=x)[0]
        assert np.isneginf(want).sum() == (x < 0).sum() + 1           # every negative x, and -0.0 itself
        np.testing.assert_array_equal(_run(m, x), want)
        t = torch.maximum(torch.from_numpy(x), torch.tensor(-0.0)).clamp(max=6.0 if len(inits) == 2 else float("inf"))
        np.testing.assert_array_equal(want, torch.reciprocal(t).numpy())


def test_sizes_no_host_holds_are_refused_before_any_memory_is_taken():
    """An input dimension over 2^31 (struct.error in the program encoder: seed 1003977), a batch of 2^31 (all the
    host's memory in compile: seed 1041598) and an Expand to 2^31 rows (a 16 GiB constant: seed 2005072) are
    refused by name."""
    from tilefuse.errors import OutOfDeviceMemory
    relu = [helper.make_node("Relu", ["x"], ["y"])]
    with pytest.raises(GraphError, match=r"x: shape \(1, 4611686018427387904, 2, 2\) has a dimension over"):
        tilefuse.from_onnx(_model(relu, [("x", (1, 2 ** 62, 2, 2))], [("y", 4)]))
    with pytest.raises(OutOfDeviceMemory, match=r"tensor 'x' of shape \(2147483648, 4, 11, 2\) \(float32\) takes "
                                                r"\d+ bytes, more than this host's memory"):
        tilefuse.from_onnx(_model(relu, [("x", (2 ** 31, 4, 11, 2))], [("y", 4)]))
    net = tilefuse.Network("big")
    net.output(net.relu(net.input("x", (2 ** 31, 4, 11, 2))))
    with pytest.raises(OutOfDeviceMemory, match="more than this host's memory"):
        tilefuse.compile(net)
    expand = [helper.make_node("Expand", ["x", "shape"], ["y"], name="e")]
    m = _model(expand, [("x", (16, 4, 2))], [("y", 4)], [("shape", np.array([2 ** 31 - 1, 16, 4, 2], np.int64))])
    with pytest.raises(GraphError, match=r"node 'e' \(Expand-13\): constant of shape \(2147483647, 1, 1, 1\)"):
        tilefuse.from_onnx(m)


def test_malformed_declarations_and_values_are_refused_by_name():
    """A graph output declared as a string or an undefined type (ONNX Runtime refuses both; tilefuse computed
    float32), an opset newer than onnx defines (tilefuse read opset 99 as the newest), a Pad constant_value with
    no element (tilefuse padded with 0), a GroupNormalization without inputs (an IndexError in the importer)."""
    relu = [helper.make_node("Relu", ["x"], ["y"])]
    for et in (TensorProto.STRING, 0):
        m = _model(relu, [("x", (1, 4))], [("y", 2)])
        m.graph.output[0].type.tensor_type.elem_type = et
        with pytest.raises(GraphError, match=r"graph output 'y' .*declares element type (STRING|UNDEFINED); the "
                                             r"importer computes float32"):
            tilefuse.from_onnx(m)
    with pytest.raises(GraphError, match=r"opset 99 of the default domain; expected 1 to \d+"):
        tilefuse.from_onnx(_model(relu, [("x", (1, 4))], [("y", 2)], opset=99))
    pad = [helper.make_node("Pad", ["x", "p", "v"], ["y"], name="pad")]
    m = _model(pad, [("x", (1, 4))], [("y", 2)], [("p", np.array([0, 1, 0, 1], np.int64)),
                                                  ("v", np.zeros(0, np.float32))])
    with pytest.raises(GraphError, match=r"node 'pad' \(Pad-13\): constant_value has shape \(0,\); expected one "
                                         r"value"):
        tilefuse.from_onnx(m)
    gn = [helper.make_node("GroupNormalization", [], ["y"], num_groups=1)]
    with pytest.raises(GraphError, match="ONNX checker rejected the model"):
        tilefuse.from_onnx(_model(gn, [("x", (1, 4, 2, 2))], [("y", 4)], opset=18))


@pytest.mark.parametrize("alpha,xscale,with_c", [(1.4e-45, 1.0, False), (1e-40, 1.0, True), (1e30, 1e-20, False),
                                                 (0.5, 1.0, True)])
def test_a_gemm_alpha_that_would_flush_or_overflow_the_weights_is_applied_after_the_sums(alpha, xscale, with_c):
    """Gemm's alpha folded into B: 1.4e-45 x B flushed every weight to 0 or +-1.4e-45 (0.53 off ONNX Runtime,
    onnx_mutants seed 11068116); 1e30 x B (B ~ 1e10) overflowed to inf where ORT's (A B) alpha is 1e20. Such
    an alpha stays a scale after the linear layer; an ordinary one is still folded (no scale op)."""
    rng = np.random.default_rng(3)
    b = rng.standard_normal((140, 3)).astype(np.float32) * (1e10 if alpha > 1 else 1)
    x = (rng.standard_normal((2, 140)) * xscale).astype(np.float32)
    ins = ["x", "b", "c"] if with_c else ["x", "b"]
    inits = [("b", b)] + ([("c", np.full(3, 1e-44 if alpha < 1e-30 else 0.25, np.float32))] if with_c else [])
    m = _model([helper.make_node("Gemm", ins, ["y"], alpha=alpha)], [("x", x.shape)], [("y", 2)], inits)
    net = tilefuse.from_onnx(m)
    assert sum(o.op == "scale" for o in net.ops) == (alpha != 0.5)
    got = tilefuse.Session(tilefuse.compile(net)).run(x)
    want = _ort(m, x=x)[0]
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=3e-45)


@pytest.mark.parametrize("op,ins", [("Concat", ["x", "x", ""]), ("Sum", ["", "x", "x"]), ("Mean", ["", "x"]),
                                    ("Max", ["x", "", "x"])])
def test_an_empty_name_in_a_variadic_input_is_refused(op, ins):
    """Concat(x, x, '') was imported as Concat(x, x) and Sum('', c, x) as c + x (onnx_mutants seeds 11005160,
    11006920), files ONNX Runtime refuses: '' leaves out an optional input, and a variadic one is not."""
    attrs = dict(axis=1) if op == "Concat" else {}
    m = _model([helper.make_node(op, ins, ["y"], name="n", **attrs)], [("x", (1, 4, 3, 3))], [("y", 4)])
    from onnx_mutants import _ort_run              # a worker process: ORT crashes on some of these
    assert isinstance(_ort_run(m.SerializeToString(), np.zeros((1, 4, 3, 3), np.float32)), str)
    i = ins.index("")
    with pytest.raises(GraphError, match=rf"node 'n' \({op}-\d+\): input {i} is the empty name ''; .* is variadic"):
        tilefuse.from_onnx(m)


def test_an_empty_optional_input_still_leaves_it_out():
    """The same check leaves an Optional input's '' alone: Clip(x, '', max) is a clip from above only."""
    m = _model([helper.make_node("Clip", ["x", "", "hi"], ["y"])], [("x", (2, 5))], [("y", 2)],
               [("hi", np.array(0.25, np.float32))])
    x = np.random.default_rng(2).standard_normal((2, 5)).astype(np.float32)
    np.testing.assert_array_equal(_run(m, x), _ort(m, x=x)[0])


def _int_case(role):
    """(a model whose `role` constant is int32 where ONNX binds it to the input's float type, its input)"""
    i32 = np.int32
    x = np.random.default_rng(4).standard_normal((1, 2, 4, 4)).astype(np.float32)
    cases = {
        "weight W": ("Conv", ["x", "w"], [("w", np.ones((3, 2, 1, 1), i32))], {}),
        "bias B": ("Conv", ["x", "w", "b"], [("w", np.ones((3, 2, 1, 1), np.float32)), ("b", np.ones(3, i32))], {}),
        "slope": ("PRelu", ["x", "s"], [("s", np.ones((2, 1, 1), i32))], {}),
        "constant_value": ("Pad", ["x", "p", "v"], [("p", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)),
                                                    ("v", np.array(3, i32))], {}),
        "min": ("Clip", ["x", "lo"], [("lo", np.array(0, i32))], {}),
        "constant operand": ("Add", ["x", "c"], [("c", np.ones((2, 1, 1), i32))], {}),
    }
    op, ins, inits, attrs = cases[role]
    return _model([helper.make_node(op, ins, ["y"], name="n", **attrs)], [("x", x.shape)], [("y", 4)], inits), x


@pytest.mark.parametrize("role", ["weight W", "bias B", "slope", "constant_value", "min", "constant operand"])
def test_an_integer_constant_in_a_float_role_is_refused_by_name(role):
    """An int32 Conv weight, PRelu slope, Pad value ... was converted to float and computed (onnx_mutants seed
    11002144 and 5 others); ONNX's type constraint T makes such a file invalid and ONNX Runtime refuses it."""
    m, x = _int_case(role)
    with pytest.raises(Exception):
        _ort(m, x=x)
    with pytest.raises(GraphError, match=rf"node 'n' \(\w+-\d+\): {role} has dtype int32; .* expected a float tensor"):
        tilefuse.from_onnx(m)


def _shape_case(case):
    """(a model whose index / scale tensor has a shape the spec does not allow, its input, the message)"""
    x = np.random.default_rng(5).standard_normal((1, 4, 6, 6)).astype(np.float32)
    i64 = np.int64
    cases = {
        "squeeze axes 0-d": ("Squeeze", ["x", "a"], [("a", np.array(0, i64))], {},
                             r"axes has shape \(\); expected a 1-D"),
        "slice starts 0-d": ("Slice", ["x", "s", "e", "a"], [("s", np.array(1, i64)), ("e", np.array([4], i64)),
                                                            ("a", np.array([2], i64))], {},
                             r"starts has shape \(\); expected a 1-D"),
        "resize 5 scales": ("Resize", ["x", "", "sc"], [("sc", np.ones(5, np.float32))], {},
                            r"5 scales for 4 axes; expected one per axis"),
        "gemm C rank 3": ("Gemm", ["x2", "b", "c"], [("b", np.ones((6, 3), np.float32)),
                                                      ("c", np.ones((1, 1, 1), np.float32))], {},
                          r"C has shape \(1, 1, 1\); expected a shape that broadcasts to \(M, N\)"),
    }
    op, ins, inits, attrs, msg = cases[case]
    if op == "Gemm":
        x = x[0, 0]
        ins = ["x"] + ins[1:]
    m = _model([helper.make_node(op, ins, ["y"], name="n", **attrs)], [("x", x.shape)], [("y", x.ndim)], inits,
               opset=13 if op != "Resize" else 19)
    return m, x, msg


@pytest.mark.parametrize("case", ["squeeze axes 0-d", "slice starts 0-d", "resize 5 scales", "gemm C rank 3"])
def test_index_and_scale_tensors_of_the_wrong_shape_are_refused(case):
    """A 0-d `axes` / `starts` was read as a list of one, a fifth scale for a 4-D input dropped, a (1, 1, 1) Gemm
    C taken as a scalar: files ONNX Runtime and ONNX's reference evaluator both refuse (onnx_mutants seed 11 run,
    the mutants computed where both refused). (A (1, 4) scales is flattened, as ONNX Runtime reads it.)"""
    m, x, msg = _shape_case(case)
    from onnx_mutants import _ort_run
    assert isinstance(_ort_run(m.SerializeToString(), x), str)
    with pytest.raises(GraphError, match=r"node 'n' \(\w+-\d+\): " + msg):
        tilefuse.from_onnx(m)


@pytest.mark.parametrize("op", ["Max", "Min"])
def test_a_one_value_bound_of_a_higher_rank_broadcasts_the_output(op):
    """Max / Min of x (2, 3) and a (1, 1, 1) constant are (1, 2, 3), as ONNX Runtime gives; the clip tilefuse
    made of them kept x's shape (onnx_mutants seed 14014198: a 0-d x and a (1,) bound gave a 0-d output)."""
    m = _model([helper.make_node(op, ["x", "c"], ["y"])], [("x", (2, 3))], [("y", 3)],
               [("c", np.full((1, 1, 1), 0.25, np.float32))])
    x = np.random.default_rng(6).standard_normal((2, 3)).astype(np.float32)
    got, want = _run(m, x), _ort(m, x=x)[0]
    assert got.shape == want.shape == (1, 2, 3)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode,pads", [("constant", [0, 1, -1, 2]), ("edge", [2, 0, 1, 1]), ("reflect", [1, 2, 0, -1]),
                                       ("wrap", [3, 1, 2, 0])])
@pytest.mark.parametrize("reduce", ["ReduceMax", "ReduceMin", "ReduceSum"])
def test_constant_pads_and_reductions_fold_as_onnxruntime(mode, pads, reduce):
    """A constant through Pad (every mode, a negative pad crops) and a Reduce* (axes as an input) folds at import
    (as the expanded Attention functions pad and reduce their masks); the result added to the input."""
    c = np.random.default_rng(3).standard_normal((4, 5)).astype(np.float32)
    nodes = [helper.make_node("Pad", ["c", "pads", "v"], ["p"], mode=mode),
             helper.make_node(reduce, ["p", "axes"], ["r"], keepdims=1),
             helper.make_node("Add", ["x", "r"], ["y"])]
    inits = [numpy_helper.from_array(c, "c"), numpy_helper.from_array(np.int64(pads), "pads"),
             numpy_helper.from_array(np.float32(0.5), "v"), numpy_helper.from_array(np.int64([1]), "axes")]
    if mode != "constant":
        nodes[0].input.pop()
        inits.pop(2)
    rows = 4 + pads[0] + pads[2]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, rows, 1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, rows, 1])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    x = np.random.default_rng(4).standard_normal((2, rows, 1)).astype(np.float32)
    net = tilefuse.from_onnx(m)
    assert [op.op for op in net.ops] == ["add"]
    np.testing.assert_allclose(tilefuse.evaluate(net, x)[0], _ort(m, x=x)[0], rtol=1e-6, atol=1e-6)


def test_a_constant_only_conv_of_a_shape_derived_encoding_is_evaluated_at_import():
    """EdgeNeXt's Fourier position encoding as the TorchScript exporter writes it: ConstantOfShape(Shape(x)) ->
    CumSum -> Sin -> Conv -> Add to x. Every node but the Add is constant-only; Sin folds and the Conv (an op
    fold.py does not evaluate) runs in a scratch network through the reference evaluator at import."""
    w = np.random.default_rng(5).standard_normal((3, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("ConstantOfShape", ["s"], ["ones"],
                              value=numpy_helper.from_array(np.float32([1.0]), "v")),
             helper.make_node("CumSum", ["ones", "ax"], ["pos"]),
             helper.make_node("Sin", ["pos"], ["enc"]),
             helper.make_node("Conv", ["enc", "w"], ["proj"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["x", "proj"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 6, 5])],
                          [numpy_helper.from_array(np.int64(2), "ax"), numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(6).standard_normal((2, 3, 6, 5)).astype(np.float32)
    net = tilefuse.from_onnx(m)
    assert [op.op for op in net.ops] == ["add"]
    np.testing.assert_allclose(tilefuse.compile(net).run(x), _ort(m, x=x)[0], rtol=1e-5, atol=1e-5)
