"""Antialiased resampling: F.interpolate(..., mode="bilinear" | "bicubic", antialias=True), as torchvision's
Resize of a tensor calls it (antialias=True is its default since torchvision 0.17) inside models that carry
their preprocessing.

from_torch imports it as one matrix per resized axis (PyTorch's own weights: its kernel applied to the identity)
and a matmul each, W first, then H, as PyTorch's separable kernel. Checked against PyTorch for downsampling
(the widened filter), upsampling, odd and equal sizes, align_corners, scale factors, float64, compiled and
evaluated, and through the Trainer (the gradient of a matmul by a constant)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tilefuse
from test_training_modern import _step_against_torch
from tilefuse.interpreter import evaluate

# (input H, W), interpolate keywords
CASES = [
    ((37, 53), dict(size=(11, 16))),                          # downsampling by ~3.4
    ((16, 20), dict(size=(7, 20))),                           # H only (W stays: not resampled)
    ((9, 7), dict(size=(20, 15))),                            # upsampling (the plain filter, normalized)
    ((30, 41), dict(scale_factor=0.37)),                      # a scale factor (its 1 / scale in the weights)
    ((30, 41), dict(scale_factor=(0.5, 0.25), recompute_scale_factor=True)),
    ((25, 18), dict(size=(8, 31), align_corners=True)),
    ((64, 64), dict(size=(1, 1))),
]


class Resample(nn.Module):
    def __init__(self, mode, kw, c=4):
        super().__init__()
        self.conv = nn.Conv2d(3, c, 3, padding=1)
        self.mode, self.kw = mode, kw

    def forward(self, x):
        return F.interpolate(self.conv(x), mode=self.mode, antialias=True, **self.kw)


def _x(shape, seed=0, dtype=np.float32):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(dtype))


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("hw,kw", CASES, ids=[str(c[1]) for c in CASES])
def test_matches_pytorch_evaluated_and_compiled(mode, hw, kw):
    torch.manual_seed(0)
    m = Resample(mode, kw).eval()
    x = _x((2, 3) + hw)
    with torch.no_grad():
        want = m(x).numpy()
    net = tilefuse.from_torch(m, x)
    assert not any(op.op == "resize" for op in net.ops)
    np.testing.assert_allclose(evaluate(net, x.numpy())[0], want, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(tilefuse.compile(net).run(x.numpy()), want, rtol=1e-5, atol=2e-6)


def test_pytorchs_one_column_case_is_refused_by_name():
    """PyTorch's antialiased kernel repeats its first output row when the output is one column wide and the height
    changes (its own weights, applied per axis, give other rows): refused rather than computed otherwise."""
    x = torch.tensor([[[[1.0], [10.0], [100.0]]]])
    with torch.no_grad():
        y = F.interpolate(x, size=(2, 1), mode="bilinear", antialias=True).flatten()
    assert y[0] == y[1] and abs(float(y[0]) - 4.375) < 1e-5          # (its weights give 4.375 and 66.25)
    with pytest.raises(tilefuse.UnsupportedOpError, match=r"one output column.*repeats its first output row"):
        tilefuse.from_torch(Resample("bilinear", dict(size=(2, 1)), c=1), torch.randn(1, 3, 3, 1))


def test_float64_and_a_nonfinite_pixel():
    """float64 weights for a float64 model; a NaN pixel gives NaN wherever PyTorch's output is NaN (the matmul may
    spread it further along its row: 0 * nan)."""
    torch.manual_seed(1)
    m = Resample("bicubic", dict(size=(9, 13))).double().eval()
    x = _x((1, 3, 24, 31), 1, np.float64)
    with torch.no_grad():
        want = m(x).numpy()
    net = tilefuse.from_torch(m, x)
    np.testing.assert_allclose(evaluate(net, x.numpy())[0], want, rtol=1e-12, atol=1e-12)
    x[0, 1, 5, 7] = float("nan")
    with torch.no_grad():
        want = m(x).numpy()
    got = evaluate(net, x.numpy())[0]
    assert np.isnan(got[np.isnan(want)]).all()


class Preprocess(nn.Module):
    """A classifier carrying torchvision's tensor transforms: Resize(shorter side 24, antialias), CenterCrop(24),
    Normalize, then the network."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))

    def forward(self, img):
        h, w = img.shape[-2:]
        s = 24 / min(h, w)
        img = F.interpolate(img, size=(round(h * s), round(w * s)), mode="bilinear", antialias=True,
                            align_corners=False)
        top, left = (img.shape[-2] - 24) // 2, (img.shape[-1] - 24) // 2
        img = img[..., top:top + 24, left:left + 24]
        return self.body((img - self.mean) / self.std)


def test_a_model_with_its_preprocessing_matches():
    """Compiled; the stream schedule refuses it by name (a matmul reads whole planes)."""
    torch.manual_seed(2)
    m = Preprocess().eval()
    x = torch.rand(2, 3, 60, 83)
    with torch.no_grad():
        want = m(x).numpy()
    net = tilefuse.from_torch(m, x)
    np.testing.assert_allclose(tilefuse.compile(net).run(x.numpy()), want, rtol=1e-4, atol=1e-5)
    with pytest.raises(tilefuse.GraphError, match="matmul does not stream"):
        tilefuse.compile(net, schedule="stream", stream_options={"band_rows": 4})


def test_trains_as_torch():
    torch.manual_seed(3)
    head = nn.Sequential(Resample("bilinear", dict(size=(5, 6)), c=6), nn.ReLU(), nn.Flatten(), nn.Linear(180, 4))
    _step_against_torch(head, _x((4, 3, 13, 17), 3), torch.tensor([0, 3, 1, 2]))


# ----------------------------------------------------------------------------- ONNX Resize with antialias=1

ONNX_CASES = [
    dict(mode="linear", sizes=(2, 3, 11, 16)),
    dict(mode="cubic", sizes=(2, 3, 11, 16)),
    dict(mode="linear", scales=(1, 1, 0.6, 0.3)),
    dict(mode="cubic", scales=(1, 1, 0.25, 0.5), coordinate_transformation_mode="asymmetric"),
    dict(mode="cubic", sizes=(2, 3, 9, 13), exclude_outside=1, cubic_coeff_a=-0.5),
    dict(mode="linear", sizes=(2, 3, 40, 7), coordinate_transformation_mode="pytorch_half_pixel"),
    dict(mode="cubic", sizes=(2, 3, 30, 53)),                 # H up, W the same size: identity on W
    dict(mode="linear", sizes=(2, 3, 12, 20), coordinate_transformation_mode="align_corners"),
]


def _onnx_resize(case, shape=(2, 3, 30, 53)):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    kw = dict(case)
    scales, sizes = kw.pop("scales", None), kw.pop("sizes", None)
    inits = [numpy_helper.from_array(np.float32(scales), "scales")] if scales else \
        [numpy_helper.from_array(np.int64(sizes), "sizes")]
    node = helper.make_node("Resize", ["x", "", "scales" if scales else "", "" if scales else "sizes"], ["y"],
                            antialias=1, **kw)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)]), onnx


@pytest.mark.parametrize("case", ONNX_CASES, ids=[str(sorted(c.items())) for c in ONNX_CASES])
def test_onnx_resize_antialias_matches_onnxruntime_and_the_reference(case):
    ort = pytest.importorskip("onnxruntime")
    from onnx.reference import ReferenceEvaluator
    m, onnx = _onnx_resize(case)
    x = np.random.default_rng(4).standard_normal((2, 3, 30, 53)).astype(np.float32)
    want_ref = ReferenceEvaluator(m).run(None, {"x": x})[0]
    got = tilefuse.compile(tilefuse.from_onnx(m)).run(x)
    np.testing.assert_allclose(got, want_ref, rtol=1e-5, atol=2e-6)
    want_ort = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want_ort, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("hw,kw", CASES, ids=[str(c[1]) for c in CASES])
def test_dynamo_exports_match_onnxruntime(mode, hw, kw):
    """The dynamo exporter writes Resize(antialias=1) (linear with exclude_outside=1). Against ONNX Runtime: for a
    scale factor whose output length is not whole, and for align_corners, the exported Resize is not PyTorch's
    resampling (ONNX Runtime differs from PyTorch there by 0.1-0.7), so the file's own semantics are the check."""
    import io
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    m = Resample(mode, kw).eval()
    x = _x((2, 3) + hw, 5)
    f = io.BytesIO()
    torch.onnx.export(m, (x,), f, dynamo=True, verbose=False)
    s = ort.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"])
    want = s.run(None, {s.get_inputs()[0].name: x.numpy()})[0]
    np.testing.assert_allclose(tilefuse.compile(tilefuse.from_onnx(f.getvalue())).run(x.numpy()), want,
                               rtol=1e-5, atol=3e-6)
