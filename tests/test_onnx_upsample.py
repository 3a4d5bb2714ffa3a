"""ONNX Upsample (opsets 7 and 9) and Resize at opset 10: older exporters' upsampling (torch.onnx at opset 9,
the YOLOv3 files of the ONNX model zoo), which from_onnx refused ("Upsample is not supported", "Resize-10").

Their coordinates are asymmetric (source = destination / scale), their nearest pixel ONNX Runtime's legacy one
(truncated when enlarging, rounded up when shrinking), output lengths floor(in * scale). Checked against ONNX
Runtime (and, by tests/test_onnx_node_cases.py, the onnx package's test_upsample_nearest).
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tilefuse
from tilefuse.errors import GraphError, UnsupportedOpError

ort = pytest.importorskip("onnxruntime")


def _model(op, opset, scales, mode, shape=(1, 2, 5, 7)):
    ins, inits, attrs = ["x"], [], {"mode": mode}
    if op == "Upsample" and opset < 9:
        attrs["scales"] = scales
    else:
        ins.append("s")
        inits.append(numpy_helper.from_array(np.array(scales, np.float32), "s"))
    out = [int(np.floor(d * s)) for d, s in zip(shape, scales)]
    g = helper.make_graph([helper.make_node(op, ins, ["y"], **attrs)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)


def _ort(model, x):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


UP = [[1, 1, 2, 2], [1, 1, 2, 3], [1, 1, 1.5, 2.5], [1, 1, 3, 1], [1, 1, 1.25, 1.75]]


@pytest.mark.parametrize("scales", UP + [[1, 1, 0.5, 0.6], [1, 1, 0.75, 1], [1, 1, 1.7, 0.5]])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("op,opset", [("Upsample", 7), ("Upsample", 9), ("Resize", 10)])
def test_upsample_is_onnx_runtimes(op, opset, mode, scales):
    scales = [float(v) for v in scales]
    model = _model(op, opset, scales, mode)
    x = np.random.default_rng(3).standard_normal((1, 2, 5, 7)).astype(np.float32)
    if op == "Upsample" and min(scales) < 1:             # ONNX Runtime: "Scale value should be >= 1"
        with pytest.raises(GraphError, match="at least 1"):
            tilefuse.from_onnx(model)
        return
    if mode == "nearest" and scales[2] > 1 > scales[3]:
        with pytest.raises(UnsupportedOpError, match="one axis enlarged, the other shrunk"):
            tilefuse.from_onnx(model)
        return
    want = _ort(model, x)
    got = tilefuse.compile(tilefuse.from_onnx(model)).run(x)
    assert got.shape == want.shape
    if mode == "nearest":
        assert np.array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_torch_opset9_export_of_interpolate_imports():
    """torch.onnx.export(opset_version=9) writes F.interpolate as Upsample."""
    torch = pytest.importorskip("torch")
    import io

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, 1, 1)

        def forward(self, x):
            return self.conv(torch.nn.functional.interpolate(torch.relu(x), scale_factor=2, mode="nearest"))

    torch.manual_seed(0)
    x = torch.randn(1, 3, 6, 5)
    f = io.BytesIO()
    torch.onnx.export(M().eval(), x, f, opset_version=9, dynamo=False, input_names=["x"])
    net = tilefuse.from_onnx(f.getvalue())
    assert "resize" in [o.op for o in net.ops]
    want = _ort_bytes(f.getvalue(), x.numpy())
    np.testing.assert_allclose(tilefuse.compile(net).run(x.numpy()), want, rtol=1e-5, atol=1e-5)


def _ort_bytes(blob, x):
    return ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_scales_on_channels_are_refused_by_name():
    with pytest.raises(UnsupportedOpError, match=r"Upsample.*resizes H and W only"):
        tilefuse.from_onnx(_model("Upsample", 9, [1.0, 2.0, 2.0, 2.0], "nearest"))
