"""ONNX ScatterND / ScatterElements at constant indices: how both torch exporters write a slice assignment
(`vgrid[:, 0] = ...`, `x[:, :, 2:5] = 0`, `y[..., -1] = ...`): the TorchScript exporter as ScatterND, the dynamo
exporter as ScatterElements (select_scatter / slice_scatter). Against ONNX Runtime and PyTorch; the ONNX package's
node cases without a reduction pass too (tests/test_onnx_node_cases.py)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
from onnx import TensorProto, helper
from onnx_export import EXPORTERS, assert_close_to_max, export, ort_run, torch_run

import tilefuse


class FirstChannel(nn.Module):
    """vgrid[:, 0] = 2 * vgrid[:, 0].clone() / 7 - 1 (a flow warp's normalization), then a conv."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        v = self.c(x)
        v[:, 0, :, :] = 2.0 * v[:, 0, :, :].clone() / 7 - 1.0
        v[:, 2] = torch.sigmoid(x[:, 1])
        return v


class Band(nn.Module):
    def forward(self, x):
        y = x * 2
        y[:, :, 2:5] = 0
        y[..., -1] = x[..., 0]
        return y


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("make", [FirstChannel, Band], ids=["channel", "band"])
def test_slice_assignments_match_onnx_runtime(make, exporter):
    torch.manual_seed(0)
    m = make().eval()
    x = np.random.default_rng(0).standard_normal((2, 3, 9, 8)).astype(np.float32)
    blob = export(m, x, exporter)
    ops = {n.op_type for n in onnx.load_from_string(blob).graph.node}
    assert ops & {"ScatterND", "ScatterElements"}, ops
    y = tilefuse.compile(tilefuse.from_onnx(blob)).run(x)
    np.testing.assert_array_equal(y, ort_run(blob, x)) if make is Band else \
        assert_close_to_max(y, ort_run(blob, x), what="against ONNX Runtime")
    assert_close_to_max(y, torch_run(m, x), what="against PyTorch")


def _model(op, data_shape, ind, upd_shape, **attrs):
    nodes = [helper.make_node("Relu", ["x"], ["d"]), helper.make_node("Neg", ["u"], ["s"]),
             helper.make_node(op, ["d", "i", "s"], ["y"], **attrs)]
    g = helper.make_graph(nodes, "scatter", [helper.make_tensor_value_info("x", TensorProto.FLOAT, data_shape),
                                             helper.make_tensor_value_info("u", TensorProto.FLOAT, upd_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, data_shape)],
                          [helper.make_tensor("i", TensorProto.INT64, ind.shape, ind.reshape(-1))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def test_scattered_elements_and_rows_are_onnx_runtimes():
    """Unordered, negative and strided positions: ScatterElements along axis 1 and ScatterND of whole rows."""
    import onnxruntime as ort
    rng = np.random.default_rng(1)
    cases = [(_model("ScatterElements", (2, 6, 3), np.array([[[5, -6, 2], [1, 3, -1]]] * 2), (2, 2, 3), axis=1),
              (2, 6, 3), (2, 2, 3)),
             (_model("ScatterND", (5, 4), np.array([[4], [0], [-3]]), (3, 4)), (5, 4), (3, 4))]
    for m, xs, us in cases:
        x, u = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(us).astype(np.float32)
        blob = m.SerializeToString()
        want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"x": x, "u": u})[0]
        net = tilefuse.from_onnx(blob)
        np.testing.assert_array_equal(tilefuse.compile(net).run({"x": x, "u": u}), want)


def test_what_is_refused_is_refused_by_name():
    dup = _model("ScatterND", (5, 4), np.array([[1], [1]]), (2, 4))
    with pytest.raises(tilefuse.UnsupportedOpError, match=r"ScatterND writing one position twice"):
        tilefuse.from_onnx(dup)
    red = _model("ScatterND", (5, 4), np.array([[1], [2]]), (2, 4), reduction="add")
    with pytest.raises(tilefuse.UnsupportedOpError, match=r"ScatterND with reduction 'add'; tilefuse writes"):
        tilefuse.from_onnx(red)
    bad = _model("ScatterND", (5, 4), np.array([[7]]), (1, 4))
    with pytest.raises(tilefuse.GraphError, match=r"ScatterND index out of range for data \(5, 4\)"):
        tilefuse.from_onnx(bad)
