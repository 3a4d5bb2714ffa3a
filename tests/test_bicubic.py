"""Bicubic resize (the resize op's mode "cubic"): F.interpolate(mode="bicubic") and ONNX Resize mode=cubic.

The reference (`ref.resize_cubic_weights`: Keys' cubic convolution, A = -0.75, the taps clamped to the edge, as
ATen's upsample_bicubic2d) and the kernel (kernels/resize.py, NCHW and NCHW16c) against PyTorch for up- and
down-scaling, odd sizes, both align_corners, by size and by scale factor; ONNX's cubic_coeff_a and
exclude_outside against ONNX Runtime; a super-resolution network that adds the bicubic-upsampled input to its
output (VDSR / ESPCN style), from PyTorch and both exporters, in both schedules (the streamed resize reads 4
input rows per output row)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper
from onnx_export import EXPORTERS, assert_close_to_max, check_export, check_from_torch, torch_run

import tilefuse
from tilefuse.kernels import reference as ref
from tilefuse.kernels import resize as R
from tilefuse.kernels.conv import from_nchwc, to_nchwc

RNG = np.random.default_rng(3)
CASES = [((9, 11), dict(size=(17, 23))), ((9, 11), dict(size=(5, 4))), ((8, 8), dict(scale_factor=2.0)),
         ((13, 7), dict(scale_factor=0.6)), ((6, 10), dict(scale_factor=(3.0, 1.5))), ((1, 5), dict(size=(4, 9))),
         ((7, 7), dict(size=(7, 7)))]


@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("hw,kw", CASES)
def test_kernel_and_reference_match_torch(hw, kw, align):
    x = RNG.standard_normal((2, 20) + hw).astype(np.float32)
    want = F.interpolate(torch.from_numpy(x), mode="bicubic", align_corners=align, **kw).numpy()
    size = want.shape[2:]
    sc = kw.get("scale_factor")
    scales = None if sc is None else ((float(sc), float(sc)) if np.isscalar(sc) else tuple(map(float, sc)))
    coord = "align_corners" if align else "half_pixel"
    r = ref.resize(x, size, scales, "cubic", coord)
    o = np.empty(want.shape, np.float32)
    R.resize(o, x, size=size, scales=scales, mode="cubic", coord=coord, threads=2)
    ob = np.full((2, 2) + size + (16,), 7.0, np.float32)
    R.resize(ob, to_nchwc(x), size=size, scales=scales, mode="cubic", coord=coord, layout="nchwc", channels=20,
             threads=3)
    for got in (r, o, from_nchwc(ob, 20)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)     # values up to ~4: float32 sums of 16
    np.testing.assert_array_equal(o, from_nchwc(ob, 20))
    assert np.all(ob[:, 1, :, :, 4:] == 0)                     # padded lanes zero


def _onnx_resize(x_shape, sizes, a, exclude, coord="half_pixel"):
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="cubic", cubic_coeff_a=a,
                            exclude_outside=exclude, coordinate_transformation_mode=coord)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x_shape[:2]) + list(sizes))],
                          [numpy_helper.from_array(np.int64(list(x_shape[:2]) + list(sizes)), "sizes")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)]).SerializeToString()


@pytest.mark.parametrize("a,exclude,coord", [(-0.75, 0, "half_pixel"), (-0.5, 0, "asymmetric"),
                                             (-0.5, 1, "half_pixel"), (-0.6, 1, "align_corners")])
def test_onnx_cubic_coefficient_and_exclude_outside_against_onnxruntime(a, exclude, coord):
    import onnxruntime as ort
    x = RNG.standard_normal((1, 3, 7, 9)).astype(np.float32)
    blob = _onnx_resize(x.shape, (12, 5), a, exclude, coord)
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    net = tilefuse.from_onnx(blob)
    (op,) = net.ops
    assert op.params["cubic_a"] == pytest.approx(a) and op.params["cubic_exclude"] == bool(exclude)
    np.testing.assert_allclose(tilefuse.compile(net).run(x), want, rtol=1e-5, atol=2e-6)


class BicubicSkipSR(nn.Module):
    """A x2 super-resolution net: features, a pixel shuffle, plus the bicubic-upsampled input (VDSR / ESPCN)."""

    def __init__(self, c=12):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, c, 5, padding=2), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1),
                                  nn.ReLU(), nn.Conv2d(c, 3 * 4, 3, padding=1), nn.PixelShuffle(2))

    def forward(self, x):
        return self.body(x) + F.interpolate(x, scale_factor=2, mode="bicubic", align_corners=False)


class BicubicBetweenConvs(nn.Module):
    """A bicubic resize to a fixed size between blocked convs (a feature pyramid's top-down path)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 20, 3, stride=2, padding=1), nn.Conv2d(20, 8, 3, padding=1)

    def forward(self, x):
        y = F.relu(self.a(x))
        return self.b(F.interpolate(y, size=(x.shape[2] - 3, x.shape[3] + 2), mode="bicubic", align_corners=True))


MODELS = {"sr_bicubic_skip": BicubicSkipSR, "bicubic_between_convs": BicubicBetweenConvs}


def _x(seed=0, shape=(2, 3, 14, 11)):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_from_torch_matches_pytorch(name):
    check_from_torch(MODELS[name], _x())


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_onnx_exports_match_pytorch_and_onnxruntime(name, exporter):
    check_export(MODELS[name], _x(1), exporter)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_stream_schedule_matches(name):
    """The streamed resize (kernels/bands.py: rows [first tap, last tap + 1) of each output row) over a tall image
    in bands of 3 rows, against the layer schedule and PyTorch."""
    torch.manual_seed(1)
    m = MODELS[name]().eval()
    x = _x(2, (1, 3, 61, 20))
    net = tilefuse.from_torch(m, torch.from_numpy(x))
    st = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": 3})
    assert any(l.op.op == "resize" for l in st.schedule.layers), "the resize streams"
    want = torch_run(m, x)
    assert_close_to_max(st.run(x), want)
    assert_close_to_max(tilefuse.compile(net).run(x), want)
