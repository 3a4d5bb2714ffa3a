"""Pooling idioms through from_torch.

nn.MaxUnpool2d / F.max_unpool2d by the indices of max_pool2d(return_indices=True) through from_torch (SegNet,
ENet): Network.max_unpool writes the unpooled values where each window of the pooled input held its maximum,
without an index tensor (slices of the input, where-chains for PyTorch's choice of position, an interleave).
The values are copies, so they equal PyTorch's bit for bit, including PyTorch's position for ties (the first
maximum in row-major order), NaN (the last NaN of the window) and -inf windows; a SegNet-style encoder-decoder
matches PyTorch at 1 and 3 threads and trains as PyTorch does. Windows that overlap or have padding, and
indices read by any other op, are refused by name. ONNX: MaxUnpool by a MaxPool's Indices and the dynamo
exporter's ScatterND form of max_unpool2d import as the same unpool (against PyTorch and ONNX Runtime).

avg_pool2d(divisor_override=d) (a sum pooling over a chosen divisor): every kernel / stride / padding / ceil_mode
/ count_include_pad combination against PyTorch, fp32 max |error| <= 1e-6 * max |PyTorch| (a mean of whole windows
times k_h * k_w / d: two roundings PyTorch does not make)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tilefuse
import onnx
from onnx_export import assert_close_to_max, export, ort_run
from test_training_modern import _step_against_torch
from tilefuse.errors import UnsupportedOpError


class SegNetSmall(nn.Module):
    """SegNet's encoder-decoder (two stages): conv-BN-ReLU, MaxPool2d(2, 2, return_indices=True), the decoder's
    MaxUnpool2d(2, 2)(x, indices, output_size=size) with the encoder's sizes (odd inputs: floor pools)."""

    def __init__(self, num_classes=5):
        super().__init__()

        def cbr(i, o):
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU(inplace=True))
        self.enc1, self.enc2 = cbr(3, 8), cbr(8, 16)
        self.dec2, self.dec1 = cbr(16, 8), cbr(8, 8)
        self.pool = nn.MaxPool2d(2, 2, return_indices=True)
        self.unpool = nn.MaxUnpool2d(2, 2)
        self.classifier = nn.Conv2d(8, num_classes, 1)

    def forward(self, x):
        x = self.enc1(x)
        size1 = x.size()
        x, ind1 = self.pool(x)
        x = self.enc2(x)
        size2 = x.size()
        x, ind2 = self.pool(x)
        x = self.unpool(x, ind2, output_size=size2)
        x = self.dec2(x)
        x = self.unpool(x, ind1, output_size=size1)
        return self.classifier(self.dec1(x))


class Unpool(nn.Module):
    def __init__(self, kernel, scale=2.0):
        super().__init__()
        self.kernel, self.scale = kernel, scale

    def forward(self, x):
        y, i = F.max_pool2d(x, self.kernel, return_indices=True)
        return F.max_unpool2d(y * self.scale + 1, i, self.kernel, output_size=x.shape[-2:])


def _randomized(m, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for b in m.modules():
            if isinstance(b, nn.BatchNorm2d):
                b.running_mean.copy_(torch.rand(b.num_features, generator=g) - 0.5)
                b.running_var.copy_(torch.rand(b.num_features, generator=g) + 0.5)
    return m.eval()


@pytest.mark.parametrize("shape", [(2, 3, 16, 16), (2, 3, 17, 15), (1, 3, 9, 22)])
def test_segnet_matches_pytorch(shape):
    torch.manual_seed(0)
    m = _randomized(SegNetSmall(), 1)
    x = torch.randn(shape)
    net = tilefuse.from_torch(m, x)
    assert sum(o.op == "max_pool" for o in net.ops) == 2
    want = m(x).detach().numpy()
    for t in (1, 3):
        assert_close_to_max(tilefuse.compile(net, threads=t).run(x.numpy()), want, what=f"{t} threads")


@pytest.mark.parametrize("kernel", [2, 3, (2, 3), (1, 2)])
def test_unpooled_values_are_pytorchs_bit_for_bit(kernel):
    """Random values with many ties (integers 0..3): the position of each window's maximum is PyTorch's."""
    x = torch.from_numpy(np.random.default_rng(0).integers(0, 4, (2, 3, 12, 18)).astype(np.float32))
    got = tilefuse.compile(tilefuse.from_torch(Unpool(kernel), x)).run(x.numpy())
    np.testing.assert_array_equal(got, Unpool(kernel)(x).numpy())


def test_nan_and_infinite_windows_place_values_where_pytorch_does():
    """PyTorch's index: the first maximum; in a window holding NaN the last NaN; an all -inf window its first."""
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([[1., 1., 2., nan, 7., 7.],
                      [0., 1., nan, 3., 7., -1.],
                      [-inf, -inf, 5., 5., nan, nan],
                      [-inf, -inf, 5., nan, nan, 0.]]).reshape(1, 1, 4, 6).repeat(2, 2, 1, 1)
    x[1] = -x[1]
    got = tilefuse.compile(tilefuse.from_torch(Unpool(2), x)).run(x.numpy())
    want = Unpool(2)(x).numpy()
    np.testing.assert_array_equal(got, want)
    assert np.isnan(want).sum() == 12 and (want != 0).sum() == 24     # 6 windows x 4 planes, 3 with NaN


class UnpoolAfterDropout(nn.Module):
    """ENet's upsampling bottleneck order: Dropout2d (aten.feature_dropout: from_torch's decomposing path, which
    keeps max_unpool2d whole) between the pool and the unpool."""

    def __init__(self):
        super().__init__()
        self.pool, self.drop, self.unpool = nn.MaxPool2d(2, 2, return_indices=True), nn.Dropout2d(0.1), nn.MaxUnpool2d(2)
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        y, idx = self.pool(x)
        return self.unpool(self.drop(self.conv(y)), idx, output_size=x.size())


def test_unpool_on_the_decomposing_path_matches_pytorch():
    torch.manual_seed(0)
    m = UnpoolAfterDropout().eval()
    x = torch.randn(2, 4, 10, 8)
    assert_close_to_max(tilefuse.compile(tilefuse.from_torch(m, x)).run(x.numpy()), m(x).detach().numpy())


def test_segnet_trains_as_pytorch():
    class Classify(SegNetSmall):
        def forward(self, x):
            return super().forward(x).mean((2, 3))
    torch.manual_seed(3)
    _step_against_torch(Classify(), torch.randn(2, 3, 12, 12), torch.tensor([1, 4]))


class Overlapping(nn.Module):
    def forward(self, x):
        y, i = F.max_pool2d(x, 3, 2, return_indices=True)
        return F.max_unpool2d(y, i, 3, 2)


class Padded(nn.Module):
    def forward(self, x):
        y, i = F.max_pool2d(x, 2, 2, padding=1, return_indices=True)
        return F.max_unpool2d(y, i, 2, 2, padding=1)


class NoOutputSize(nn.Module):
    def forward(self, x):
        y, i = F.max_pool2d(x, 2, return_indices=True)
        return F.max_unpool2d(y, i, 2)


class IndicesOut(nn.Module):
    def forward(self, x):
        y, i = F.max_pool2d(x, 2, return_indices=True)
        return y, i


class IndicesRead(nn.Module):
    def forward(self, x):
        y, i = F.max_pool2d(x, 2, return_indices=True)
        return y + i.float()


@pytest.mark.parametrize("module,match", [
    (Overlapping(), r"kernel \(3, 3\), stride \(2, 2\).*stride = kernel_size"),
    (Padded(), r"padding \(1, 1\).*no padding"),
    (NoOutputSize(), r"to 8x8 by the indices of a 9x9 input.*output_size=x.size\(\)"),
    (IndicesOut(), r"returning the indices of max pooling"),
    (IndicesRead(), r"of the indices of max pooling"),
])
def test_other_uses_of_the_indices_are_refused_by_name(module, match):
    with pytest.raises(UnsupportedOpError, match=match):
        tilefuse.from_torch(module, torch.randn(1, 2, 8, 8) if not isinstance(module, NoOutputSize) else
                            torch.randn(1, 2, 9, 9))


# ----------------------------------------------------------------------------- ONNX: MaxPool's Indices -> MaxUnpool

@pytest.mark.parametrize("case", ["segnet", "unpool_2x3"])
def test_dynamo_onnx_export_matches_pytorch_and_onnxruntime(case):
    """The dynamo exporter writes max_unpool2d as a ScatterND of the Indices re-based per plane (the TorchScript
    exporter cannot export it): one MaxUnpool node again (patterns._max_unpool), no ScatterND left."""
    rng = np.random.default_rng(2)
    if case == "segnet":
        m, x = _randomized(SegNetSmall(), 2), rng.standard_normal((2, 3, 17, 15)).astype(np.float32)
    else:
        m, x = Unpool((2, 3)), rng.integers(0, 4, (2, 3, 9, 12)).astype(np.float32)
    blob = export(m, x, "dynamo")
    assert "ScatterND" in {n.op_type for n in onnx.load_from_string(blob).graph.node}
    net = tilefuse.from_onnx(blob)
    assert not [o for o in net.ops if o.op == "scatter"]
    got = tilefuse.compile(net).run(x)
    assert_close_to_max(got, m(torch.from_numpy(x)).detach().numpy(), what="against PyTorch")
    assert_close_to_max(got, ort_run(blob, x), what="against ONNX Runtime")


def _onnx_unpool(kernel, output_shape=None, indices_input=False, opset=11):
    from onnx import TensorProto, helper
    n, c, h, w = 2, 3, 8, 12
    ho, wo = h // kernel[0], w // kernel[1]
    nodes = [helper.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=list(kernel), strides=list(kernel)),
             helper.make_node("Mul", ["p", "two"], ["y"]),
             helper.make_node("MaxUnpool", ["y", "idx" if indices_input else "i"] + (["shape"] if output_shape else []),
                              ["out"], kernel_shape=list(kernel), strides=list(kernel))]
    inits = [helper.make_tensor("two", TensorProto.FLOAT, [1], [2.0])]
    if output_shape:
        inits.append(helper.make_tensor("shape", TensorProto.INT64, [4], list(output_shape)))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, w])]
    if indices_input:
        inputs.append(helper.make_tensor_value_info("idx", TensorProto.INT64, [n, c, ho, wo]))
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [n, c, None, None])
    g = helper.make_graph(nodes, "unpool", inputs, [out], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


@pytest.mark.parametrize("kernel,output_shape,opset", [((2, 2), None, 11), ((2, 3), None, 22),
                                                       ((2, 2), (2, 3, 8, 12), 11)])
def test_onnx_maxunpool_of_a_maxpool_matches_onnxruntime(kernel, output_shape, opset):
    blob = _onnx_unpool(kernel, output_shape, opset=opset)
    x = np.random.default_rng(4).integers(0, 4, (2, 3, 8, 12)).astype(np.float32)     # ties: the first maximum
    got = tilefuse.compile(tilefuse.from_onnx(blob)).run(x)
    np.testing.assert_array_equal(got, ort_run(blob, x))


def test_onnx_maxunpool_by_other_indices_is_refused_by_name():
    with pytest.raises(UnsupportedOpError, match=r"MaxUnpool of the integer tensor 'idx'"):
        tilefuse.from_onnx(_onnx_unpool((2, 2), indices_input=True))
    with pytest.raises(UnsupportedOpError, match=r"an output of 8x14 .* expected the output 8x12"):
        tilefuse.from_onnx(_onnx_unpool((2, 2), (2, 3, 8, 14)))


# ----------------------------------------------------------------------------- avg_pool2d(divisor_override=d)

class AvgOver(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, x):
        return F.avg_pool2d(x, **self.kw)


def _divisor_cases():
    for k, s, p, ceil in itertools.product([2, 3, (2, 3)], [1, 2, (2, 1)], [0, 1], [False, True]):
        if 2 * p <= min(np.atleast_1d(k)):
            yield pytest.param(dict(kernel_size=k, stride=s, padding=p, ceil_mode=ceil), id=f"k{k}-s{s}-p{p}-c{ceil:d}")


@pytest.mark.parametrize("kw", list(_divisor_cases()))
def test_avg_pool_divisor_override_matches_pytorch(kw):
    x = torch.randn(2, 3, 11, 10, generator=torch.Generator().manual_seed(0))
    for d, cip in ((1, True), (3, False), (7, True)):
        m = AvgOver(**kw, divisor_override=d, count_include_pad=cip)
        got = tilefuse.compile(tilefuse.from_torch(m, x)).run(x.numpy())
        want = m(x).numpy()
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * np.abs(want).max())
