"""Infinities and NaN as the values a where selects: `masked_fill(mask, float("-inf"))` before a softmax (a causal
or a padding mask in the attention blocks of hybrid CNNs), `torch.where(m, x, -inf).amax(1)` (a max over the
kept positions only), torch.where(invalid, nan, x) (invalid depth pixels), torch.xlogy (PyTorch decomposes it
with a NaN constant).

The IR refuses NaN and infinities in a bound constant (a diverged checkpoint's weights are an error, named),
and so refused these ("where.scalar: bound constant contains NaN or infinity"). Where's two values (and a part
of one that canonicalize cuts to fewer values) are now let through; weights and every other operand are still
checked. Against PyTorch (from_torch: evaluate, compiled, the stream schedule, a package round trip, a
Trainer step) and ONNX Runtime (from_onnx)."""
from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

import tilefuse
from test_training_modern import _step_against_torch
from tilefuse.errors import GraphError, TilefuseError
from tilefuse.interpreter import evaluate
from tilefuse.ir import Network

INF = float("inf")


class CausalAttention2d(nn.Module):
    """Self-attention over a feature map's rows of pixels with a causal mask (raster order), written as model code
    writes it: a registered bool buffer, masked_fill(-inf), softmax."""

    def __init__(self, c=8, hw=(5, 6)):
        super().__init__()
        self.conv = nn.Conv2d(3, c, 3, padding=1)
        self.qkv = nn.Conv2d(c, 3 * c, 1)
        n = hw[0] * hw[1]
        self.register_buffer("mask", torch.ones(n, n, dtype=torch.bool).triu(1))

    def forward(self, x):
        y = self.conv(x)
        b, c, h, w = y.shape
        q, k, v = self.qkv(y).flatten(2).chunk(3, dim=1)           # 3 x (B, C, HW)
        att = (q.transpose(1, 2) @ k) / math.sqrt(c)               # (B, HW, HW)
        att = att.masked_fill(self.mask, float("-inf")).softmax(-1)
        return y + (v @ att.transpose(1, 2)).view(b, c, h, w)


class Fn(nn.Module):
    def __init__(self, f, c=6):
        super().__init__()
        self.conv = nn.Conv2d(3, c, 3, padding=1)
        self.f = f

    def forward(self, x):
        return self.f(self.conv(x))


CASES = {
    "masked_max": lambda y: torch.where(y > 0.2, y, -INF).amax(1, keepdim=True),
    "masked_min_pool": lambda y: -F.max_pool2d(torch.where(y < 0.5, -y, -INF), 3, 1, 1),
    "padding_mask_softmax": lambda y: y.masked_fill(y < -1, -INF).softmax(1),
    "nan_where_invalid": lambda y: torch.where(y.abs() > 1.5, torch.tensor(float("nan")), y),
    "inf_where_large": lambda y: torch.where(y > 1, INF, y) + 1,
    "xlogy": lambda y: torch.xlogy(y.sigmoid(), y.sigmoid() * 0.5),
    "full_like_ninf": lambda y: torch.where(y > 0, y, torch.full_like(y, -INF)).amax((2, 3)),
}


def _x(seed=0, shape=(2, 3, 5, 6)):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want))


@pytest.mark.parametrize("name", sorted(CASES))
def test_from_torch_matches_pytorch_compiled_and_evaluated(name):
    torch.manual_seed(0)
    m = Fn(CASES[name]).eval()
    x = _x()
    with torch.no_grad():
        want = m(x).numpy()
    net = tilefuse.from_torch(m, x)
    _close(evaluate(net, x.numpy())[0], want)
    _close(tilefuse.compile(net).run(x.numpy()), want)


def test_causal_attention_matches_pytorch_everywhere():
    """Evaluated, compiled, a package saved and loaded, and the stream schedule: the -inf mask kept exactly."""
    torch.manual_seed(0)
    m = CausalAttention2d().eval()
    x = _x(1)
    with torch.no_grad():
        want = m(x).numpy()
    net = tilefuse.from_torch(m, x)
    assert any(d.value is not None and np.isneginf(d.value).any() for d in net.data.values())
    _close(evaluate(net, x.numpy())[0], want)
    compiled = tilefuse.compile(net)
    _close(compiled.run(x.numpy()), want)
    s = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": 2})
    _close(s.run(x.numpy()), want)


def test_a_package_keeps_the_infinity(tmp_path):
    torch.manual_seed(0)
    m = Fn(CASES["masked_max"]).eval()
    x = _x(2)
    with torch.no_grad():
        want = m(x).numpy()
    compiled = tilefuse.compile(tilefuse.from_torch(m, x))
    path = compiled.save(tmp_path / "masked.tfpkg")
    _close(tilefuse.Session(tilefuse.load_package(path)).run(x.numpy()), want)


def test_masked_softmax_trains_as_torch():
    torch.manual_seed(3)
    head = nn.Sequential(CausalAttention2d(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    _step_against_torch(head, _x(4, (4, 3, 5, 6)), torch.tensor([0, 3, 1, 2]))


def test_weights_with_nan_or_infinity_are_still_refused_by_name():
    net = Network("bad")
    x = net.input("x", (1, 3, 4, 4))
    w = np.ones((2, 3, 1, 1), np.float32)
    w[1, 2] = np.nan
    with pytest.raises(GraphError, match="bound constant contains NaN or infinity"):
        net.conv2d(x, w)
    m = nn.Conv2d(3, 4, 1)
    with torch.no_grad():
        m.weight[0, 0] = INF
    with pytest.raises(TilefuseError, match="NaN or infinity"):
        tilefuse.from_torch(m, torch.zeros(1, 3, 4, 4))
    # an infinite addend is not a where's value: refused too
    with pytest.raises(TilefuseError, match="NaN or infinity"):
        tilefuse.from_torch(Fn(lambda y: y + torch.tensor([0., 0., INF, 0., 0., 0.]).view(1, 6, 1, 1)), _x())


def _onnx_where(y_value, cmp="Greater"):
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node(cmp, ["x", "t"], ["m"]), helper.make_node("Where", ["m", "x", "fill"], ["w"]),
         helper.make_node("Softmax", ["w"], ["y"], axis=1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)],
        [numpy_helper.from_array(np.array([-0.5], np.float32), "t"),
         numpy_helper.from_array(np.asarray(y_value, np.float32), "fill")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    return m, x, want


@pytest.mark.parametrize("fill", [[-INF], np.full((1, 3, 1, 1), -INF), [float("nan")]])
def test_onnx_where_with_an_infinite_value_is_onnx_runtimes(fill):
    m, x, want = _onnx_where(fill)
    got = tilefuse.compile(tilefuse.from_onnx(m)).run(x)
    assert np.allclose(got, want, rtol=1e-6, atol=1e-7, equal_nan=True)
    assert np.array_equal(np.isnan(got), np.isnan(want))


def test_torchscript_export_of_the_causal_mask_is_onnx_runtimes(tmp_path):
    torch.manual_seed(0)
    m = CausalAttention2d().eval()
    x = _x(5)
    path = tmp_path / "causal.onnx"
    torch.onnx.export(m, (x,), str(path), dynamo=False, opset_version=17)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {
        onnx.load(str(path)).graph.input[0].name: x.numpy()})[0]
    got = tilefuse.compile(tilefuse.from_onnx(str(path))).run(x.numpy())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
