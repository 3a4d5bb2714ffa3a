"""from_onnx: models exported by torch.onnx (legacy exporter) and hand-built ONNX graphs,
compiled and run, against ONNX Runtime and PyTorch (fp32, rtol = atol = 1e-4)."""
import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn
from onnx import TensorProto, helper, numpy_helper

import tilefuse
from tilefuse import models
from tilefuse.errors import GraphError, UnsupportedOpError
from torch_zoo import load as torch_zoo_load

RTOL = ATOL = 1e-4


def export(module, x, dynamic=False):
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (torch.from_numpy(x.copy()),), f, dynamo=False, input_names=["x"],
                          output_names=["y"], dynamic_axes={"x": {0: "n"}} if dynamic else None)
    return f.getvalue()


def ort_run(blob, x):
    return ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"x": x})


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


def test_unsupported_op_names_op_and_node():
    model = _graph([helper.make_node("Sigmoid", ["x"], ["y"], name="gate")])
    with pytest.raises(UnsupportedOpError, match=r"ONNX op 'Sigmoid' in node 'gate'"):
        tilefuse.from_onnx(model)


def test_invalid_bytes():
    with pytest.raises(GraphError, match="not a valid ONNX model"):
        tilefuse.from_onnx(b"\x00\x01garbage")
