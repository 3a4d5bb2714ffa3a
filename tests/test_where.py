"""Comparisons and torch.where on computed tensors (IR op `where`: a if l cmp r else b, the comparison inside the
op: the IR has no bool tensors).

The kernel (kernels/broadcast.py `where`: one flat loop for full-size and one-value operands, the reference
otherwise) against the reference and PyTorch for every comparison, NaN in every operand (NaN compares false, ne
true); model code as written: torch.where(x > 0, x, 0.2 * x), F.hardshrink / softshrink / threshold (which
PyTorch decomposes into where and sign), `x * (x > t).float()`, `~mask`, `&` and `|` of comparisons
(frontend/boolexpr.py: one where op per comparison), a constant bool buffer as the mask;
from PyTorch and from both exporters' files (Greater / Less / Not / And / Or / Where / Cast / Sign) against
PyTorch and ONNX Runtime, in both schedules; what is refused is named."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import TensorProto, helper
from onnx_export import EXPORTERS, assert_close_to_max, check_export, check_from_torch, torch_run

import tilefuse
from tilefuse.errors import UnsupportedOpError
from tilefuse.kernels import broadcast as B
from tilefuse.kernels import reference as ref

RNG = np.random.default_rng(9)
TORCH_CMP = {"gt": torch.gt, "ge": torch.ge, "lt": torch.lt, "le": torch.le, "eq": torch.eq, "ne": torch.ne}


def _vals(shape):
    x = RNG.integers(-2, 3, shape).astype(np.float32)          # small integers: ties for eq / ge / le
    flat = x.reshape(-1)
    flat[RNG.choice(flat.size, size=min(5, flat.size), replace=False)] = np.nan
    return x


@pytest.mark.parametrize("cmp", sorted(TORCH_CMP))
@pytest.mark.parametrize("shapes", [[(2, 3, 4, 5)] * 4, [(2, 3, 4, 5), (1,), (2, 3, 4, 5), (1,)],
                                    [(2, 3, 4, 5), (1, 3, 1, 1), (4, 5), (2, 1, 4, 5)]])
def test_kernel_reference_and_torch_agree_nan_included(cmp, shapes):
    l, r, a, b = (_vals(s) for s in shapes)
    want = torch.where(TORCH_CMP[cmp](torch.from_numpy(l), torch.from_numpy(r)), torch.from_numpy(a),
                       torch.from_numpy(b)).numpy()
    outs = []
    for th in (1, 2, 3):
        o = np.full(want.shape, 7.0, np.float32)
        B.where(o, l, r, a, b, cmp=cmp, threads=th)
        outs.append(o)
    for got in (ref.where(l, r, a, b, cmp), outs[0]):
        np.testing.assert_array_equal(got, want)               # a selection: exact, NaN positions included
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


class WhereActs(nn.Module):
    """Activations and masks written with comparisons."""

    def forward(self, x):
        a = torch.where(x > 0, x, 0.2 * x)
        b = F.hardshrink(x, 0.5) + F.softshrink(x, 0.3)
        c = x * (x > 0.2).float() + torch.where(x < a, 1.0, x) + torch.where(~(x >= 0.3), x, -x)
        return a + b + c + torch.sign(x - 0.1)


class Band(nn.Module):
    """Compound masks: (x > a) & (x < b), | and ~ of comparisons, a mask as a float."""

    def forward(self, x):
        inside = (x > -0.5) & (x < 0.8)
        y = torch.where(inside, x, torch.tanh(x)) + torch.where((x < -1) | ~(x < 1.5), 0.3, x)
        return y + ((x > 0) & (x.abs() < 0.5)).float()


class Threshold(nn.Module):
    """F.threshold with a non-zero threshold (the TorchScript exporter cannot export it)."""

    def forward(self, x):
        return F.threshold(x, 0.1, 20.0) + torch.where(x.abs() <= 1.0, x, torch.zeros_like(x))


class MaskBuffer(nn.Module):
    """A fixed bool mask (a registered buffer) selecting between two computed tensors."""

    def __init__(self, c, h, w):
        super().__init__()
        self.register_buffer("mask", torch.rand(1, c, h, w, generator=torch.Generator().manual_seed(0)) < 0.5)

    def forward(self, x):
        return torch.where(self.mask, x, torch.sigmoid(x))


class AnyAll(nn.Module):
    """any / all of comparisons (a channel active anywhere, a pixel valid in every channel, the whole tensor), as
    masks and as counts: count_nonzero of a mask (PyTorch writes m != 0)."""

    def forward(self, x):
        active = (x > 0.5).any(1, keepdim=True)                      # (N, 1, H, W)
        valid = (x.abs() < 2.0).all(dim=1, keepdim=True)
        rows = (~(x > -1.0)).any(dim=(1, 3), keepdim=True)           # (N, 1, H, 1)
        y = torch.where(active & valid, x, -x) + torch.where(rows, 0.5, x)
        y = y + torch.where((x > 2.5).any(), x, 0.25 * x) + (x < 0).all(3, keepdim=True).float()
        return y + torch.count_nonzero(x > 0, dim=1).unsqueeze(1).float()


MODELS = {
    "where_acts": lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), WhereActs(), nn.Conv2d(8, 4, 3)),
    "band": lambda: nn.Sequential(nn.Conv2d(3, 7, 3, padding=1), Band(), nn.Conv2d(7, 4, 1)),
    "mask_buffer": lambda: nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), MaskBuffer(6, 9, 7), nn.Conv2d(6, 4, 1)),
}


def _x(seed=0, shape=(2, 3, 9, 7)):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


TORCH_ONLY = {"threshold": lambda: nn.Sequential(nn.Conv2d(3, 5, 3), Threshold()),
              "any_all": lambda: nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), AnyAll(), nn.Conv2d(6, 4, 1))}


@pytest.mark.parametrize("name", sorted(MODELS) + sorted(TORCH_ONLY))
def test_from_torch_matches_pytorch(name):
    check_from_torch(MODELS.get(name) or TORCH_ONLY[name], _x())


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_onnx_exports_match_pytorch_and_onnxruntime(name, exporter):
    check_export(MODELS[name], _x(1), exporter)


def test_dynamo_export_of_any_all_and_counts_matches():
    """any / all as the dynamo exporter writes them: Cast(bool -> int64), ReduceMax / ReduceMin, Cast to bool (the
    TorchScript exporter cannot export count_nonzero)."""
    check_export(TORCH_ONLY["any_all"], _x(1), "dynamo")


def test_stream_schedule_matches():
    torch.manual_seed(0)
    m = MODELS["where_acts"]().eval()
    x = _x(2, (1, 3, 40, 12))
    net = tilefuse.from_torch(m, torch.from_numpy(x))
    assert_close_to_max(tilefuse.compile(net, schedule="stream", stream_options={"band_rows": 4}).run(x),
                        torch_run(m, x))


def test_onnx_where_selects_between_two_computed_tensors_with_a_constant_condition():
    """A constant condition with X and Y both computed (refused before the where op), NaN kept where selected."""
    g = helper.make_graph([helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Where", ["c", "x", "n"], ["y"])],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                          [onnx.numpy_helper.from_array(np.array([True, False, True]), "c")])
    blob = helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)]).SerializeToString()
    x = np.float32([[1, 2, np.nan], [np.inf, -5, 6]])
    import onnxruntime as ort
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(tilefuse.compile(tilefuse.from_onnx(blob)).run(x), want)


def test_what_stays_refused_is_named():
    class FlipMask(nn.Module):
        def forward(self, x):
            return x * (x > 0).flip(1)

    with pytest.raises(UnsupportedOpError, match=r"aten\.flip\.default of a comparison's bool tensor"):
        tilefuse.from_torch(FlipMask(), torch.from_numpy(_x()))
    g = helper.make_graph([helper.make_node("Greater", ["x", "z"], ["c"]), helper.make_node("Cast", ["c"], ["i"], to=10),
                           helper.make_node("Cast", ["i"], ["y"], to=1)],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                          [onnx.numpy_helper.from_array(np.float32([0.0]), "z")])
    blob = helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)]).SerializeToString()
    with pytest.raises(UnsupportedOpError, match=r"Cast of a comparison's bool tensor to float16; expected float32 "
                                                 r"or int32 / int64"):
        tilefuse.from_onnx(blob)


def test_onnx_counts_of_a_comparison_are_int64():
    """Cast(bool -> int64) then ReduceSum / CumSum (the exporters' `(x > t).sum(1)`, a running count): exact
    counts in the float, returned as int64; against ONNX Runtime."""
    nodes = [helper.make_node("Greater", ["x", "z"], ["c"]), helper.make_node("Cast", ["c"], ["i"], to=7),
             helper.make_node("ReduceSum", ["i", "ax"], ["n"], keepdims=1),
             helper.make_node("CumSum", ["i", "one"], ["run"]),
             helper.make_node("Cast", ["n"], ["nf"], to=1), helper.make_node("Mul", ["x", "nf"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                          [helper.make_tensor_value_info("n", TensorProto.INT64, [2, 1, 4]),
                           helper.make_tensor_value_info("run", TensorProto.INT64, [2, 3, 4]),
                           helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])],
                          [onnx.numpy_helper.from_array(np.float32([0.0]), "z"),
                           onnx.numpy_helper.from_array(np.int64([1]), "ax"),
                           onnx.numpy_helper.from_array(np.int64(1), "one")])
    blob = helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)]).SerializeToString()
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = tilefuse.compile(tilefuse.from_onnx(blob)).run(x)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def test_trainer_trains_where_as_the_relu_it_spells():
    """where(y > 0, y, 0) is a ReLU: the Trainer's gradients through it equal those through relu (where's backward
    routes dy by the condition; tests/test_training_modern.py has it against PyTorch)."""
    from tilefuse.training import SGD, Trainer
    w = (RNG.standard_normal((4, 3, 3, 3)) * 0.2).astype(np.float32)
    xv = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
    grads = []
    for gate in ("where", "relu"):
        net = tilefuse.Network("t")
        x = net.input("x", (2, 3, 8, 8))
        y = net.conv2d(x, w, None, padding=1, name="conv")
        y = net.where(y, "gt", 0.0, y, 0.0, name="gate") if gate == "where" else net.relu(y, name="gate")
        net.output(net.linear(net.flatten(net.global_avg_pool(y), 1), np.ones((5, 4), np.float32) * 0.1,
                              np.zeros(5, np.float32), name="fc"))
        grads.append(Trainer(net, SGD(lr=0.1), schedule="unfused").forward_backward(xv, [1, 3])[1])
    for k in grads[1]:
        np.testing.assert_array_equal(grads[0][k], grads[1][k], err_msg=k)
