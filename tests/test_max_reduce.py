"""The max reduce (torch.amax, x.max(dim)[0], ONNX ReduceMax), adaptive max pooling, and CBAM, the attention
block built of them (channel attention from average- and max-pooled descriptors through one shared MLP, spatial
attention from the channel mean and max), through from_torch, both ONNX exporters and ONNX Runtime; GatherND
with constant indices (the dynamo exporter's form of an adaptive average pool with overlapping windows); the
indices of x.max(dim) (the IR's argmax, tests/test_argmax.py). Mish (YOLOv4's activation) through from_torch and both exporters (the
TorchScript one spells it Softplus -> Tanh -> Mul), fused into the producing conv."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import TensorProto, helper
from onnx_export import (EXPORTERS, assert_close_to_max, check_export, check_from_torch, export, ort_run,
                         torch_run)

import tilefuse
from tilefuse.errors import GraphError, UnsupportedOpError
from tilefuse.kernels import reference as ref


class CBAM(nn.Module):
    """Woo et al., 2018, as model code writes it."""

    def __init__(self, c, r=4, k=7):
        super().__init__()
        self.mlp = nn.Sequential(nn.Conv2d(c, c // r, 1, bias=False), nn.ReLU(inplace=True),
                                 nn.Conv2d(c // r, c, 1, bias=False))
        self.spatial = nn.Conv2d(2, 1, k, padding=k // 2, bias=False)

    def forward(self, x):
        a = self.mlp(F.adaptive_avg_pool2d(x, 1)) + self.mlp(F.adaptive_max_pool2d(x, 1))
        x = x * torch.sigmoid(a)
        s = torch.cat([torch.mean(x, dim=1, keepdim=True), torch.max(x, dim=1, keepdim=True)[0]], dim=1)
        return x * torch.sigmoid(self.spatial(s))


class Reductions(nn.Module):
    def forward(self, x):
        a = torch.amax(x, dim=(2, 3))                   # (N, C)
        b = x.max(1)[0].flatten(1).amax(1, keepdim=True)  # (N, 1)
        return a + b + x.amax((1, 2, 3), keepdim=True).flatten(1)


class AdaptiveMax(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.pool = nn.AdaptiveMaxPool2d(size)

    def forward(self, x):
        return self.pool(x)


MODELS = {
    "cbam": lambda: nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), CBAM(16), nn.Conv2d(16, 8, 3, stride=2)),
    "reductions": lambda: nn.Sequential(nn.Conv2d(3, 6, 3), Reductions()),
    "adaptive_max_1": lambda: nn.Sequential(nn.Conv2d(3, 6, 3), AdaptiveMax(1)),
    "adaptive_max_divisor": lambda: nn.Sequential(nn.Conv2d(3, 6, 3), AdaptiveMax((4, 3))),
}


def _x(seed=0, shape=(2, 3, 14, 11)):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_from_torch_matches_pytorch(name):
    check_from_torch(MODELS[name], _x())


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_onnx_exports_match_pytorch_and_onnxruntime(name, exporter):
    check_export(MODELS[name], _x(1), exporter)


class SPP(nn.Module):
    """Spatial pyramid pooling (He et al. 2014): adaptive max pooling to 1x1, 2x2 and 4x4 bins, flattened and
    concatenated; on a 13x13 map the 2x2 and 4x4 windows overlap (13 is no multiple of 2 or 4)."""

    def forward(self, x):
        n = x.size(0)
        return torch.cat([F.adaptive_max_pool2d(x, b).view(n, -1) for b in (1, 2, 4)], dim=1)


@pytest.mark.parametrize("size", [(5, 3), (13, 4), (3, 9)])
def test_adaptive_max_pool_to_sizes_that_do_not_divide(size):
    """adaptive_max_pool (PyTorch's overlapping windows, any output size, up to the input's or past it) against
    PyTorch; SPP's bins; a NaN in a window makes that window's output NaN, and only those."""
    x = _x(3, (2, 4, 13, 9))
    x[1, 2, 6, 4] = np.nan
    want = F.adaptive_max_pool2d(torch.from_numpy(x), size).numpy()
    net = tilefuse.Network("amp")
    net.output(net.adaptive_max_pool(net.input("x", x.shape), size, name="p"))
    for got in (tilefuse.compile(net).run(x), tilefuse.interpreter.evaluate(net, {"x": x})[0]):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(got[~np.isnan(want)], want[~np.isnan(want)])
    m = nn.Sequential(nn.Conv2d(3, 6, 3), nn.ReLU(), SPP(), nn.Linear(6 * 21, 5)).eval()
    xx = _x(4, (2, 3, 15, 15))
    cp = tilefuse.compile(tilefuse.from_torch(m, torch.from_numpy(xx)))
    assert "adaptive_max_pool" in {o.op for o in cp.network.ops}
    assert_close_to_max(cp.run(xx), torch_run(m, xx))


def test_max_reference_propagates_nan_like_pytorch():
    x = _x(2, (2, 5, 4, 3))
    x[1, 2, 0, 1] = np.nan
    want = torch.amax(torch.from_numpy(x), dim=(1, 3), keepdim=True).numpy()
    got = ref.reduce("max", x, (1, 3), True)
    np.testing.assert_array_equal(got, want)
    net = tilefuse.Network("n")
    y = net.max(net.input("x", x.shape), (1, 3), keepdim=True, name="m")
    net.output(y)
    np.testing.assert_array_equal(tilefuse.compile(net).run(x), want)


def test_the_indices_are_argmax_and_a_max_of_everything_is_computed():
    class Argmax(nn.Module):
        def forward(self, x):
            return x.max(1)[1].float()

    x = _x()
    got = tilefuse.compile(tilefuse.from_torch(Argmax(), torch.from_numpy(x))).run(x)
    np.testing.assert_array_equal(got, torch.from_numpy(x).max(1)[1].float().numpy())   # (tests/test_argmax.py)

    class Everything(nn.Module):
        def forward(self, x):
            return x - x.max()       # a 0-d tensor: the importer's (1,) (tests/test_zero_d.py)

    got = tilefuse.compile(tilefuse.from_torch(Everything(), torch.from_numpy(x))).run(x)
    np.testing.assert_array_equal(got, x - x.max())


def _gather_nd_model(x_shape, idx, out_shape, batch_dims=0):
    node = helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                          [onnx.numpy_helper.from_array(idx, "i")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


@pytest.mark.parametrize("x_shape,idx", [
    ((5, 4, 3), np.array([[0, 1], [0, 2], [4, 3], [-1, 0]], np.int64)),          # k = 2: rows of 3
    ((5, 4, 3), np.array([[[1], [2]], [[3], [0]]], np.int64)),                    # k = 1
    ((2, 3, 4), np.array([[0, 0, 0], [1, 2, 3], [1, 2, 2]], np.int64)),           # k = rank: scalars
])
def test_gather_nd_with_constant_indices_matches_onnxruntime(x_shape, idx):
    x = _x(3, x_shape)
    k = idx.shape[-1]
    out_shape = idx.shape[:-1] + x_shape[k:]
    blob = _gather_nd_model(x_shape, idx, out_shape)
    import onnxruntime as ort
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(tilefuse.compile(tilefuse.from_onnx(blob)).run(x), want)


def test_gather_nd_refusals():
    with pytest.raises(GraphError, match=r"indices \[5\] out of range for axis 0 of size 5"):
        tilefuse.from_onnx(_gather_nd_model((5, 4), np.array([[5]], np.int64), (1, 4)))
    with pytest.raises(UnsupportedOpError, match=r"batch_dims=1; tilefuse implements batch_dims=0"):
        tilefuse.from_onnx(_gather_nd_model((2, 4, 3), np.array([[1], [2]], np.int64), (2, 3), batch_dims=1))


class OverlappingPool(nn.Module):
    """adaptive_avg_pool2d 9x11 -> 3x2: equal, overlapping windows along W, which the dynamo exporter writes as
    GatherND + ReduceMean."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        g = F.adaptive_avg_pool2d(self.conv(x), (3, 2))
        return F.interpolate(g, size=(x.size(2), x.size(3)), mode="nearest") + x.mean(1, keepdim=True)


def test_dynamo_export_of_an_overlapping_adaptive_pool():
    torch.manual_seed(2)
    m = OverlappingPool().eval()
    x = _x(4, (2, 3, 9, 11))
    blob = export(m, x, "dynamo")
    assert "GatherND" in {n.op_type for n in onnx.load_from_string(blob).graph.node}
    y = tilefuse.compile(tilefuse.from_onnx(blob)).run(x)
    assert_close_to_max(y, torch_run(m, x), what="against PyTorch")
    assert_close_to_max(y, ort_run(blob, x), what="against ONNX Runtime")


class MishNet(nn.Module):
    """YOLOv4's CSPDarknet style: conv -> BN -> Mish (in place), and a functional F.mish."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.act = nn.Mish(inplace=True)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2)

    def forward(self, x):
        return F.mish(self.conv2(self.act(self.bn(self.conv(x)))))


@pytest.mark.parametrize("path", ["torch", "torchscript", "dynamo"])
def test_mish_through_every_importer_fuses_into_the_conv(path):
    torch.manual_seed(4)
    m = MishNet().eval()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.running_var.uniform_(0.5, 2)
    x = _x(5, (2, 3, 13, 12)) * 3
    if path == "torch":
        net = tilefuse.from_torch(m, torch.from_numpy(x))
    else:
        blob = export(m, x, path)
        ops = {n.op_type for n in onnx.load_from_string(blob).graph.node}
        assert ("Softplus" in ops) if path == "torchscript" else ("Mish" in ops)   # opset 17 spells it out
        net = tilefuse.from_onnx(blob)
    prog = tilefuse.compile(net)
    kernels = [i.kernel for i in prog.lowered.instructions if i.kernel not in ("to_nchwc", "from_nchwc")]
    assert kernels == ["conv2d", "conv2d"], kernels            # both Mish in the convs' epilogues
    y = prog.run(x)
    assert_close_to_max(y, torch_run(m, x), what="against PyTorch")
    if path != "torch":
        assert_close_to_max(y, ort_run(blob, x), what="against ONNX Runtime")


class SoftplusNet(nn.Module):
    def __init__(self, beta, threshold):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.act = nn.Softplus(beta=beta, threshold=threshold)

    def forward(self, x):
        return F.softplus(self.act(self.conv(x))) * 2


@pytest.mark.parametrize("path", ["torch", "torchscript"])
def test_softplus_that_is_not_mish_runs_through_from_torch_and_torchscript_onnx(path):
    torch.manual_seed(7)
    # ONNX's Softplus has neither beta nor threshold: the TorchScript exporter scales around it and drops the
    # threshold, so the exported module keeps the defaults (1, 20), where the two differ by under 1e-8
    m = (SoftplusNet(2.0, 4.0) if path == "torch" else SoftplusNet(1.0, 20.0)).eval()
    x = _x(8) * 3
    net = tilefuse.from_torch(m, torch.from_numpy(x)) if path == "torch" else tilefuse.from_onnx(export(m, x, path))
    y = tilefuse.compile(net).run(x)
    assert_close_to_max(y, torch_run(m, x), what="against PyTorch")
    if path != "torch":
        assert_close_to_max(y, ort_run(export(m, x, path), x), what="against ONNX Runtime")


def test_dynamo_softplus_threshold_imports_as_a_where():
    """The dynamo exporter writes softplus's threshold as Greater -> Where on computed tensors (refused by name
    before the where op): now a where op selecting x past the threshold, against PyTorch and ONNX Runtime."""
    torch.manual_seed(3)
    m = SoftplusNet(1.0, 20.0).eval()
    x = _x() * 15.0                        # values on both sides of the threshold
    blob = export(m, x, "dynamo")
    net = tilefuse.from_onnx(blob)
    assert "where" in {o.op for o in net.ops}
    y = tilefuse.compile(net).run(x)
    assert_close_to_max(y, torch_run(m, x), what="against PyTorch")
    assert_close_to_max(y, ort_run(blob, x), what="against ONNX Runtime")


class AdaptiveAvg(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(size)

    def forward(self, x):
        return torch.flatten(self.pool(self.conv(x)), 1)


@pytest.mark.parametrize("hw,size", [((8, 8), (7, 7)),       # VGG's classifier pool at 256x256: 98 runs of 2
                                     ((9, 11), (4, 3)),      # unequal windows: GatherND, Where masks, ReduceSum
                                     ((10, 7), (3, 5))])
def test_dynamo_adaptive_average_pools_to_non_divisors(hw, size):
    torch.manual_seed(5)
    m = AdaptiveAvg(size).eval()
    x = _x(6, (2, 3) + hw)
    blob = export(m, x, "dynamo")
    y = tilefuse.compile(tilefuse.from_onnx(blob)).run(x)
    assert_close_to_max(y, torch_run(m, x), what="against PyTorch")
    assert_close_to_max(y, ort_run(blob, x), what="against ONNX Runtime")


def _where_model(cond, fill, computed_first):
    ins = ["c", "x", "f"] if computed_first else ["c", "f", "x"]
    g = helper.make_graph([helper.make_node("Where", ins, ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])],
                          [onnx.numpy_helper.from_array(cond, "c"), onnx.numpy_helper.from_array(fill, "f")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)]).SerializeToString()


@pytest.mark.parametrize("computed_first", [True, False])
@pytest.mark.parametrize("fill", [0.0, -2.5])
def test_where_with_a_constant_condition_matches_onnxruntime(computed_first, fill):
    r = np.random.default_rng(7)
    cond = r.random((3, 1)) < 0.5
    blob = _where_model(cond, np.full((1, 4), fill, np.float32), computed_first)
    x = _x(7, (2, 3, 4))
    import onnxruntime as ort
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(tilefuse.compile(tilefuse.from_onnx(blob)).run(x), want)
