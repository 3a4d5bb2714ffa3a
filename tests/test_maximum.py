"""The element-wise maximum / minimum of two tensors (IR ops `maximum`, `minimum`): torch.maximum / minimum,
torch.max(a, b) / torch.min(a, b), torch.clamp with tensor bounds, ONNX Max / Min of several tensors.

The kernels (kernels/broadcast.py, kind 4 and 5 of the binary loops) against the numpy reference and PyTorch:
equal shapes, a per-channel operand in either order, other broadcasts, on NCHW and NCHW16c, a fused activation;
NaN in either operand gives NaN, as torch.maximum's. Model code as written: LightCNN's max-feature-map
(`torch.max(*torch.split(x, c, 1))`), clamps with a learned per-channel floor and a per-image ceiling, from
PyTorch and both exporters' files, in both schedules; ONNX Max / Min of three inputs against ONNX Runtime."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
from onnx_export import EXPORTERS, assert_close_to_max, check_export, check_from_torch, torch_run

import tilefuse
from tilefuse.errors import UnsupportedOpError
from tilefuse.kernels import broadcast as B
from tilefuse.kernels import reference as ref
from tilefuse.kernels.conv import from_nchwc, to_nchwc

RNG = np.random.default_rng(11)
TORCH = {"maximum": torch.maximum, "minimum": torch.minimum}


def _with_specials(shape):
    x = RNG.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    idx = RNG.choice(flat.size, size=min(12, flat.size), replace=False)
    flat[idx] = np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, np.nan, 3.0, -3.0, np.inf, 1e-40])[
        :idx.size]
    return x


@pytest.mark.parametrize("kind", ["maximum", "minimum"])
@pytest.mark.parametrize("sa,sb", [((2, 5, 4, 3), (2, 5, 4, 3)), ((2, 5, 4, 3), (1, 5, 1, 1)),
                                   ((2, 5, 1, 1), (2, 5, 4, 3)), ((2, 5, 4, 3), (1, 1, 4, 3)), ((7,), (3, 1))])
def test_kernel_reference_and_torch_agree_nan_included(kind, sa, sb):
    a, b = _with_specials(sa), _with_specials(sb)
    want = TORCH[kind](torch.from_numpy(a), torch.from_numpy(b)).numpy()
    r = ref.binary(kind, a, b)
    out = np.empty(np.broadcast_shapes(sa, sb), np.float32)
    B.binary(kind, out, a, b, threads=2)
    for got in (r, out):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(got[~np.isnan(want)], want[~np.isnan(want)])


@pytest.mark.parametrize("kind", ["maximum", "minimum"])
@pytest.mark.parametrize("swap", [False, True])
def test_blocked_per_channel_operand_and_fused_activation(kind, swap):
    """NCHW16c with a (1, C, 1, 1) operand (C = 20: a partial block), the activation fused: the real lanes equal
    the reference, the padded lanes stay 0."""
    c = 20
    x = RNG.standard_normal((2, c, 3, 5)).astype(np.float32)
    s = RNG.standard_normal((1, c, 1, 1)).astype(np.float32)
    xb = to_nchwc(x)
    o = np.full_like(xb, 7.0)
    args = (s, xb) if swap else (xb, s)
    B.binary(kind, o, *args, layout="nchwc", channels=c, threads=2, act=("sigmoid", 0.0, 0.0))
    want = ref.binary(kind, *((s, x) if swap else (x, s)), act=("sigmoid", 0.0, 0.0))
    np.testing.assert_allclose(from_nchwc(o, c), want, rtol=1e-6, atol=1e-7)
    assert np.all(o[:, -1, :, :, c % 16:] == 0)


class MaxFeatureMap(nn.Module):
    """LightCNN's mfm: a conv to 2C channels, then the maximum of the two halves."""

    def __init__(self, cin, c, k=3):
        super().__init__()
        self.c, self.conv = c, nn.Conv2d(cin, 2 * c, k, padding=k // 2)

    def forward(self, x):
        x = self.conv(x)
        out = torch.split(x, self.c, 1)
        return torch.max(out[0], out[1])


class TensorClamp(nn.Module):
    """A clamp between a learned per-channel floor and a per-image ceiling (the channel means), and
    torch.minimum / torch.maximum of computed tensors."""

    def __init__(self, c):
        super().__init__()
        self.floor = nn.Parameter(0.3 * torch.randn(1, c, 1, 1))

    def forward(self, x):
        top = x.mean((2, 3), keepdim=True).abs() + 0.2
        y = torch.clamp(x, min=self.floor, max=top)
        return torch.minimum(y, torch.relu(x) * 0.5) + torch.maximum(x, top) - torch.min(x, 1.0 - x)


MODELS = {
    "lightcnn_mfm": lambda: nn.Sequential(MaxFeatureMap(3, 8, 5), nn.MaxPool2d(2), MaxFeatureMap(8, 12),
                                          nn.Conv2d(12, 4, 1)),
    "tensor_clamp": lambda: nn.Sequential(nn.Conv2d(3, 20, 3, padding=1), TensorClamp(20), nn.Conv2d(20, 6, 3)),
}


def _x(seed=0, shape=(2, 3, 12, 10)):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_from_torch_matches_pytorch(name):
    check_from_torch(MODELS[name], _x())


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_onnx_exports_match_pytorch_and_onnxruntime(name, exporter):
    check_export(MODELS[name], _x(1), exporter)


def test_max_feature_map_streams_and_compiles_to_maximum():
    torch.manual_seed(0)
    m = MODELS["lightcnn_mfm"]().eval()
    x = _x(2, (1, 3, 40, 24))
    net = tilefuse.from_torch(m, torch.from_numpy(x))
    for schedule in ("layer", "stream"):
        cp = tilefuse.compile(net, schedule=schedule)
        assert [o.op for o in cp.network.ops].count("maximum") == 2
        assert_close_to_max(cp.run(x), torch_run(m, x))


@pytest.mark.parametrize("op", ["Max", "Min"])
def test_onnx_max_min_of_three_inputs_against_onnxruntime(op):
    """Max / Min of a computed tensor, a per-channel constant and another computed tensor (variadic)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    w = RNG.standard_normal((6, 3, 3, 3)).astype(np.float32)
    k = RNG.standard_normal((1, 6, 1, 1)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["a"], ["r"]),
         helper.make_node("Neg", ["a"], ["n"]),
         helper.make_node(op, ["a", "k", "n"], ["m"]),
         helper.make_node("Add", ["m", "r"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 7, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6, 7, 9])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(k, "k")])
    blob = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    onnx.checker.check_model(onnx.load_from_string(blob))
    x = _x(3, (2, 3, 7, 9))
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    cp = tilefuse.compile(tilefuse.from_onnx(blob))
    assert [o.op for o in cp.network.ops].count(op.lower() + "imum") == 2
    assert_close_to_max(cp.run(x), want)


def test_trainer_trains_maximum_as_torch():
    """A max-feature-map block trains (the gradient to the larger operand, halves at ties: torch.maximum's)."""
    import torch
    import torch.nn.functional as F
    from tilefuse.training import SGD, Trainer
    w1, w2 = (RNG.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.2 for _ in range(2))
    wf = RNG.standard_normal((5, 4)).astype(np.float32) * 0.3
    net = tilefuse.Network("t")
    x = net.input("x", (2, 3, 8, 8))
    y = net.maximum(net.conv2d(x, w1, None, padding=1, name="c1"), net.conv2d(x, w2, None, padding=1, name="c2"),
                    name="mfm")
    net.output(net.linear(net.flatten(net.global_avg_pool(y), 1), wf, np.zeros(5, np.float32), name="fc"))
    xv = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
    loss, grads = Trainer(net, SGD(lr=0.1)).forward_backward(xv, [1, 4])
    tw1, tw2, twf = (torch.from_numpy(w).requires_grad_() for w in (w1, w2, wf))
    tx = torch.from_numpy(xv).requires_grad_()
    t = torch.maximum(F.conv2d(tx, tw1, padding=1), F.conv2d(tx, tw2, padding=1)).mean((2, 3)) @ twf.T
    ref = F.cross_entropy(t, torch.tensor([1, 4]))
    ref.backward()
    assert loss == pytest.approx(ref.item(), rel=1e-5)
    names = {op.name: op.inputs[1].name for op in net.ops if op.op in ("conv2d", "linear")}
    for op, tw in (("c1", tw1), ("c2", tw2), ("fc", twf)):
        np.testing.assert_allclose(grads[names[op]], tw.grad.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(grads["x"], tx.grad.numpy(), rtol=1e-4, atol=1e-6)
