"""The running sum (the IR's cumsum): torch.cumsum and ONNX CumSum, with the models that use it.

kernels/reference.py cumsum accumulates in float64 and rounds once: bitwise equal to PyTorch's CPU cumsum of
float32 on every axis of odd shapes (checked here), exclusive / reverse against their definitions; ONNX CumSum
against ONNX Runtime and ONNX's node cases (tests/test_onnx_node_cases.py). The models: the box filter of the
Deep Guided Filter (Wu et al., CVPR 2018: an integral image by two cumsums and differences of its shifted slices)
against SciPy's uniform filter in float64, its guided filter in a network through from_torch and the Trainer
(the gradient of a cumsum is the cumsum of dy the other way), DETR's sine position encoding of a mask
(`not_mask.cumsum(1, dtype=torch.float32)` of a comparison), and a bool count. The stream schedule computes a
cumsum after its streamed part (a running sum down the rows needs every row above)."""
from __future__ import annotations

import itertools
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import scipy.ndimage
import torch
import torch.nn as nn
from onnx import TensorProto, helper

import tilefuse
from test_training_modern import _step_against_torch
from tilefuse.interpreter import evaluate
from tilefuse.ir import Network
from tilefuse.kernels import reference as ref

SHAPES = [(3, 5, 37, 7), (1, 1, 1, 9), (2, 17, 3, 1)]


def _x(shape, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * np.exp(rng.uniform(-6, 6, shape))).astype(np.float32)


@pytest.mark.parametrize("shape", SHAPES)
def test_reference_is_torch_cumsum_bitwise(shape):
    x = _x(shape)
    for axis in range(-4, 4):
        np.testing.assert_array_equal(ref.cumsum(x, axis), torch.cumsum(torch.from_numpy(x), axis).numpy())
    x64 = x.astype(np.float64)
    np.testing.assert_array_equal(ref.cumsum(x64, 1), torch.cumsum(torch.from_numpy(x64), 1).numpy())


@pytest.mark.parametrize("exclusive,reverse", list(itertools.product([False, True], [False, True])))
def test_exclusive_and_reverse_are_their_definitions(exclusive, reverse):
    x = _x((2, 3, 11, 4), 1).astype(np.float64)
    got = ref.cumsum(x, 2, exclusive, reverse)
    for i in range(11):
        idx = [j for j in range(11) if (j >= i if reverse else j <= i) and (j != i or not exclusive)]
        want = x[:, :, idx].sum(axis=2) if idx else np.zeros_like(x[:, :, 0])
        np.testing.assert_allclose(got[:, :, i], want, rtol=1e-12, atol=1e-12 * np.abs(x).max())


def _run(module, *xs):
    net = tilefuse.from_torch(module, xs[0] if len(xs) == 1 else xs)
    return tilefuse.compile(net).run(*(x.numpy() for x in xs)), net


class Cumsums(nn.Module):
    def forward(self, x):
        return torch.cat([x.cumsum(2), torch.cumsum(x, -1), x.flip(3).cumsum(3).flip(3), x.cumsum(1)], 1)


def test_from_torch_cumsum_is_bitwise():
    x = torch.from_numpy(_x((2, 3, 13, 9), 2))
    got, _ = _run(Cumsums(), x)
    np.testing.assert_array_equal(got, Cumsums()(x).numpy())


def diff_x(x, r):
    """The Deep Guided Filter's diff along H of an integral image: window sums clipped at the borders."""
    left = x[:, :, r:2 * r + 1]
    middle = x[:, :, 2 * r + 1:] - x[:, :, :-2 * r - 1]
    right = x[:, :, -1:] - x[:, :, -2 * r - 1:-r - 1]
    return torch.cat([left, middle, right], dim=2)


def diff_y(x, r):
    left = x[:, :, :, r:2 * r + 1]
    middle = x[:, :, :, 2 * r + 1:] - x[:, :, :, :-2 * r - 1]
    right = x[:, :, :, -1:] - x[:, :, :, -2 * r - 1:-r - 1]
    return torch.cat([left, middle, right], dim=3)


class BoxFilter(nn.Module):
    def __init__(self, r):
        super().__init__()
        self.r = r

    def forward(self, x):
        return diff_y(diff_x(x.cumsum(dim=2), self.r).cumsum(dim=3), self.r)


class GuidedFilter(nn.Module):
    """The Deep Guided Filter's GuidedFilter (its asserts on the sizes, as written there)."""

    def __init__(self, r, eps=1e-2):
        super().__init__()
        self.r, self.eps = r, eps
        self.boxfilter = BoxFilter(r)

    def forward(self, x, y):
        n_x, c_x, h_x, w_x = x.size()
        n_y, c_y, h_y, w_y = y.size()
        assert n_x == n_y and (c_x == 1 or c_x == c_y) and h_x == h_y and w_x == w_y
        assert h_x > 2 * self.r + 1 and w_x > 2 * self.r + 1
        n = self.boxfilter(torch.ones_like(x[:1, :1]))
        mean_x = self.boxfilter(x) / n
        mean_y = self.boxfilter(y) / n
        cov_xy = self.boxfilter(x * y) / n - mean_x * mean_y
        var_x = self.boxfilter(x * x) / n - mean_x * mean_x
        a = cov_xy / (var_x + self.eps)
        b = mean_y - a * mean_x
        return self.boxfilter(a) / n * x + self.boxfilter(b) / n


@pytest.mark.parametrize("r,shape", [(1, (2, 3, 9, 11)), (3, (1, 2, 17, 8)), (2, (1, 1, 6, 30))])
def test_box_filter_is_scipy_uniform_filter(r, shape):
    x = torch.from_numpy(np.random.default_rng(r).standard_normal(shape).astype(np.float32))
    got, net = _run(BoxFilter(r), x)
    assert sum(op.op == "cumsum" for op in net.ops) == 2
    k = 2 * r + 1
    want = scipy.ndimage.uniform_filter(x.numpy().astype(np.float64), size=(1, 1, k, k), mode="constant") * k * k
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


class GuidedNet(nn.Module):
    """A DGF-style network: a conv net's output filtered with the input's gray image as the guide; a
    classifier head for training."""

    def __init__(self, head=False):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 3, 3, padding=1))
        self.gf = GuidedFilter(2)
        self.head = nn.Linear(3, 4) if head else None

    def forward(self, x):
        y = self.gf(x.mean(1, keepdim=True), self.net(x))
        return self.head(y.mean((2, 3))) if self.head is not None else y


def test_guided_filter_network_matches_torch():
    torch.manual_seed(0)
    m = GuidedNet().eval()
    x = torch.randn(2, 3, 12, 10)
    got, _ = _run(m, x)
    with torch.no_grad():
        want = m(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_guided_filter_network_trains_as_torch():
    torch.manual_seed(1)
    _step_against_torch(GuidedNet(head=True), torch.randn(4, 3, 10, 9), torch.tensor([0, 3, 1, 2]))


class SinePosition(nn.Module):
    """DETR's PositionEmbeddingSine over a mask the network computes (its `not_mask.cumsum(1, dtype=float32)`)."""

    def __init__(self, feats=4, temperature=10000):
        super().__init__()
        self.feats, self.temperature = feats, temperature
        self.conv = nn.Conv2d(3, 2 * feats, 1)

    def forward(self, x):
        not_mask = x[:, 0] > -0.5                               # (N, H, W)
        y_embed = not_mask.cumsum(1, dtype=torch.float32)
        x_embed = not_mask.cumsum(2, dtype=torch.float32)
        eps, scale = 1e-6, 2 * math.pi
        y_embed = y_embed / (y_embed[:, -1:, :] + eps) * scale
        x_embed = x_embed / (x_embed[:, :, -1:] + eps) * scale
        dim_t = torch.arange(self.feats, dtype=torch.float32)
        dim_t = self.temperature ** (2 * (dim_t // 2) / self.feats)
        pos_x = x_embed[:, :, :, None] / dim_t
        pos_y = y_embed[:, :, :, None] / dim_t
        pos_x = torch.stack((pos_x[:, :, :, 0::2].sin(), pos_x[:, :, :, 1::2].cos()), dim=4).flatten(3)
        pos_y = torch.stack((pos_y[:, :, :, 0::2].sin(), pos_y[:, :, :, 1::2].cos()), dim=4).flatten(3)
        pos = torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)
        return self.conv(x) + pos


def test_detr_sine_position_of_a_computed_mask_matches_torch():
    torch.manual_seed(2)
    m = SinePosition().eval()
    x = torch.randn(2, 3, 7, 9)
    got, _ = _run(m, x)
    with torch.no_grad():
        want = m(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


class Count(nn.Module):
    def forward(self, x):
        return (x > 0).cumsum(3)


def test_a_running_count_of_bools_is_int64():
    x = torch.randn(2, 3, 4, 9)
    got, _ = _run(Count(), x)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, Count()(x).numpy())


def _onnx_cumsum(shape, axis, exclusive, reverse, opset=14):
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                          [onnx.numpy_helper.from_array(np.array(axis, np.int64), "axis")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("axis,exclusive,reverse", [(2, 0, 0), (-1, 1, 0), (1, 0, 1), (0, 1, 1), (3, 1, 1)])
def test_onnx_cumsum_matches_onnxruntime(axis, exclusive, reverse):
    shape = (2, 3, 7, 5)
    model = _onnx_cumsum(shape, axis, exclusive, reverse)
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = tilefuse.compile(tilefuse.from_onnx(model)).run(x)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got, ref.cumsum(x, axis, bool(exclusive), bool(reverse)))


def test_the_stream_schedule_computes_a_cumsum_after_its_streamed_part():
    rng = np.random.default_rng(5)
    net = Network("running")
    x = net.input("x", (1, 4, 12, 10))
    w = rng.standard_normal((4, 4, 3, 3)).astype(np.float32) * 0.3
    y = net.relu(net.conv2d(x, w, padding=1, name="c1"))
    y = net.cumsum(y, 2, name="rows")
    net.output(net.conv2d(y, w, padding=1, name="c2"))
    xv = rng.standard_normal((1, 4, 12, 10)).astype(np.float32)
    s = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": 2})
    np.testing.assert_allclose(s.run(xv), evaluate(net, xv)[0], rtol=1e-5, atol=1e-5)
    assert [e[:2] for e in s.schedule.ends] == [("rows", "cumsum")], s.schedule.ends
