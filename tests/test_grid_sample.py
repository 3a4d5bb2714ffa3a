"""grid_sample: F.grid_sample / ONNX GridSample (and AffineGrid), as spatial transformers and optical-flow warps use it.

The reference (kernels/reference.py `grid_sample`, ATen's vectorized CPU arithmetic) against PyTorch for every mode,
padding mode and align_corners, odd shapes (1 x 1 images, one row or column, grids far outside, NaN / inf
coordinates); the numba kernel (kernels/resize.py) bitwise against the reference at several thread counts; the
PyTorch tutorial's spatial transformer network (F.affine_grid of a computed theta) and a RAFT / PWC-Net style flow
warp (`vgrid[:, 0] = 2.0 * vgrid[:, 0].clone() / max(W - 1, 1) - 1.0`, permute, grid_sample) through from_torch;
the STN through both ONNX exporters (AffineGrid + GridSample at opset 20) and GridSample-16 against ONNX Runtime.
Bicubic: the 4 x 4 taps each brought in by the padding mode (ATen's get_value_bounded), A = -0.75."""
from __future__ import annotations

import io
import logging
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx_export import assert_close_to_max

import tilefuse
from tilefuse.kernels import reference as ref
from tilefuse.kernels.resize import grid_sample as grid_kernel

MODES = ["bilinear", "nearest", "bicubic"]
PADS = ["zeros", "border", "reflection"]
# (N, C, H, W, Ho, Wo)
SHAPES = [(2, 3, 5, 7, 4, 6), (1, 1, 1, 1, 3, 3), (1, 2, 1, 9, 2, 5), (3, 17, 13, 11, 9, 10), (1, 4, 6, 1, 1, 7)]
SPECIAL = [np.nan, 0.0, 0.0, np.inf, -np.inf, 0.5, -1.0, 1.0, 1.0, -1.0, 1e30, -1e30, 0.999999, -1.0000001]


def _data(shape, seed=0, special=False):
    n, c, h, w, ho, wo = shape
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    g = (rng.standard_normal((n, ho, wo, 2)) * 1.5).astype(np.float32)   # about a third of the points outside
    if special:
        k = min(len(SPECIAL), g.size)
        g.reshape(-1)[:k] = SPECIAL[:k]
    return x, g


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("pad", PADS)
@pytest.mark.parametrize("mode", MODES)
def test_reference_matches_pytorch(mode, pad, align, shape):
    for special in (False, True):
        x, g = _data(shape, special=special)
        want = F.grid_sample(torch.from_numpy(x), torch.from_numpy(g), mode=mode, padding_mode=pad,
                             align_corners=align).numpy()
        got = ref.grid_sample(x, g, mode, pad, align)
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(x).max())


@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("pad", PADS)
@pytest.mark.parametrize("mode", MODES)
def test_kernel_is_the_reference_bitwise_at_any_thread_count(mode, pad, align):
    for shape in SHAPES:
        x, g = _data(shape, seed=1, special=True)
        want = ref.grid_sample(x, g, mode, pad, align)
        for t in (1, 2, 3, 5, 8):
            out = np.full_like(want, 7.0)
            grid_kernel(out, x, g, mode=mode, padding_mode=pad, align_corners=align, threads=t)
            np.testing.assert_array_equal(out, want, err_msg=f"{shape} {t} threads")


class STN(nn.Module):
    """The PyTorch tutorial's spatial transformer network (MNIST)."""

    def __init__(self):
        super().__init__()
        self.localization = nn.Sequential(nn.Conv2d(1, 8, kernel_size=7), nn.MaxPool2d(2, stride=2), nn.ReLU(True),
                                          nn.Conv2d(8, 10, kernel_size=5), nn.MaxPool2d(2, stride=2), nn.ReLU(True))
        self.fc_loc = nn.Sequential(nn.Linear(10 * 3 * 3, 32), nn.ReLU(True), nn.Linear(32, 3 * 2))
        self.fc_loc[2].weight.data.normal_(0, 0.05)      # the tutorial zeroes it: a random theta tests the warp
        self.fc_loc[2].bias.data.copy_(torch.tensor([1, 0, 0, 0, 1, 0], dtype=torch.float))
        self.conv = nn.Conv2d(1, 4, 3)

    def stn(self, x):
        xs = self.localization(x)
        xs = xs.view(-1, 10 * 3 * 3)
        theta = self.fc_loc(xs)
        theta = theta.view(-1, 2, 3)
        grid = F.affine_grid(theta, x.size(), align_corners=False)
        return F.grid_sample(x, grid, align_corners=False)

    def forward(self, x):
        return F.relu(self.conv(self.stn(x)))


def flow_warp(x, flow, padding_mode="zeros", mode="bilinear"):
    """A backward warp as RAFT / PWC-Net code writes it."""
    B, C, H, W = x.size()
    xx = torch.arange(0, W).view(1, -1).repeat(H, 1)
    yy = torch.arange(0, H).view(-1, 1).repeat(1, W)
    xx = xx.view(1, 1, H, W).repeat(B, 1, 1, 1)
    yy = yy.view(1, 1, H, W).repeat(B, 1, 1, 1)
    grid = torch.cat((xx, yy), 1).float()
    vgrid = grid + flow
    vgrid[:, 0, :, :] = 2.0 * vgrid[:, 0, :, :].clone() / max(W - 1, 1) - 1.0
    vgrid[:, 1, :, :] = 2.0 * vgrid[:, 1, :, :].clone() / max(H - 1, 1) - 1.0
    vgrid = vgrid.permute(0, 2, 3, 1)
    return F.grid_sample(x, vgrid, mode=mode, padding_mode=padding_mode, align_corners=True)


class Warp(nn.Module):
    """Two frames in, a flow predicted from both, the second frame warped to the first and convolved."""

    def __init__(self, padding_mode="zeros", mode="bilinear"):
        super().__init__()
        self.padding_mode, self.mode = padding_mode, mode
        self.flow = nn.Conv2d(6, 2, 3, padding=1)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        second = x[:, 3:]
        return self.conv(flow_warp(second, self.flow(x) * 3, self.padding_mode, self.mode))


class SampleAtConv(nn.Module):
    """A grid computed by a conv, squashed into [-1.2, 1.2] (GridSample-16 through the TorchScript exporter)."""

    def __init__(self, mode="bilinear", padding_mode="zeros", align_corners=False):
        super().__init__()
        self.kw = dict(mode=mode, padding_mode=padding_mode, align_corners=align_corners)
        self.g = nn.Conv2d(3, 2, 3, stride=2, padding=1)

    def forward(self, x):
        grid = torch.tanh(self.g(x)).permute(0, 2, 3, 1) * 1.2
        return F.grid_sample(x, grid, **self.kw)


def _torch(m, x):
    with torch.no_grad():
        return m.eval()(torch.from_numpy(x)).numpy()


@pytest.mark.parametrize("make,shape", [
    (STN, (4, 1, 28, 28)),
    (lambda: Warp("border"), (2, 6, 17, 23)),
    (lambda: Warp("zeros", "nearest"), (1, 6, 9, 30)),
    (lambda: Warp("reflection"), (2, 6, 12, 12)),
], ids=["stn", "warp-border", "warp-nearest", "warp-reflection"])
def test_from_torch_matches_pytorch(make, shape):
    torch.manual_seed(0)
    m = make().eval()
    x = torch.randn(shape).numpy()
    net = tilefuse.from_torch(m, torch.from_numpy(x))
    assert "grid_sample" in {o.op for o in net.ops}
    want = _torch(m, x)
    for threads in (1, 3):
        assert_close_to_max(tilefuse.compile(net, threads=threads).run(x), want, what=f"{threads} threads")


def _export(m, x, exporter, opset):
    f = io.BytesIO()
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(m.eval(), (torch.from_numpy(x),), f, dynamo=exporter == "dynamo", input_names=["x"],
                          opset_version=opset)
    return f.getvalue()


def _ort(blob, x):
    import onnxruntime as ort
    return ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_stn_through_onnx(exporter):
    """AffineGrid + GridSample (opset 20; the dynamo exporter spells affine_grid out in Mul / ReduceSum) against
    PyTorch and ONNX Runtime."""
    torch.manual_seed(1)
    m = STN().eval()
    x = torch.randn(3, 1, 28, 28).numpy()
    blob = _export(m, x, exporter, 20)
    net = tilefuse.from_onnx(blob)
    assert {"grid_sample", "matmul"} <= {o.op for o in net.ops} if exporter == "torchscript" else \
        "grid_sample" in {o.op for o in net.ops}
    y = tilefuse.compile(net).run(x)
    assert_close_to_max(y, _torch(m, x), what="against PyTorch")
    assert_close_to_max(y, _ort(blob, x), what="against ONNX Runtime")


@pytest.mark.parametrize("opset", [16, 20])
@pytest.mark.parametrize("kw", [dict(), dict(mode="nearest", padding_mode="border"),
                                dict(padding_mode="reflection", align_corners=True),
                                dict(mode="nearest", padding_mode="reflection"),
                                dict(mode="bicubic", padding_mode="border"),
                                dict(mode="bicubic", padding_mode="reflection", align_corners=True)], ids=str)
def test_grid_sample_through_onnx_matches_onnx_runtime(kw, opset):
    torch.manual_seed(2)
    m = SampleAtConv(**kw).eval()
    x = torch.randn(2, 3, 15, 13).numpy()
    blob = _export(m, x, "torchscript", opset)
    y = tilefuse.compile(tilefuse.from_onnx(blob)).run(x)
    assert_close_to_max(y, _ort(blob, x), what="against ONNX Runtime")
    assert_close_to_max(y, _torch(m, x), what="against PyTorch")


class Volumetric(nn.Module):
    def forward(self, x):
        return F.grid_sample(x, torch.tanh(x[:, :3].permute(0, 2, 3, 4, 1)), align_corners=False)


def test_what_is_refused_is_refused_by_name():
    x = torch.randn(1, 3, 4, 5, 6)
    with pytest.raises(tilefuse.UnsupportedOpError, match=r"grid_sample mode='bilinear' of a 5-D input"):
        tilefuse.from_torch(Volumetric(), x)
    blob = _export(Volumetric(), x.numpy(), "dynamo", 20)
    with pytest.raises(tilefuse.UnsupportedOpError, match=r"GridSample mode 'linear' of a 5-D input; tilefuse samples 4-D"):
        tilefuse.from_onnx(blob)
    net = tilefuse.Network("g")
    a = net.input("x", (1, 4, 16, 16))
    with pytest.raises(tilefuse.GraphError, match=r"grid 'g' has shape \(1, 8, 8, 3\); expected \(1, Ho, Wo, 2\)"):
        net.grid_sample(a, net.input("g", (1, 8, 8, 3)))
    with pytest.raises(tilefuse.GraphError, match=r"padding_mode 'circular'; expected one of"):
        net.grid_sample(a, net.input("g2", (1, 8, 8, 2)), padding_mode="circular")


@pytest.mark.parametrize("exporter,opset", [("torchscript", 16), ("dynamo", 20)])
def test_flow_warp_through_onnx(exporter, opset):
    """The flow warp's slice assignments export as ScatterND (TorchScript) / ScatterElements (dynamo)."""
    torch.manual_seed(3)
    m = Warp("border").eval()
    x = torch.randn(2, 6, 11, 14).numpy()
    blob = _export(m, x, exporter, opset)
    y = tilefuse.compile(tilefuse.from_onnx(blob)).run(x)
    assert_close_to_max(y, _ort(blob, x), what="against ONNX Runtime")
    assert_close_to_max(y, _torch(m, x), what="against PyTorch")
