"""Comparisons with +-inf, torch.isinf / isnan, nan_to_num and logsumexp through from_torch; ONNX IsNaN, IsInf,
Shrink, ThresholdedRelu and comparisons with an infinite constant through from_onnx.

The IR's constants are finite, so `x == float("inf")` (in torch's own decomposition of logsumexp, `maxes.abs() ==
inf`, and of nan_to_num) was refused ("bound constant contains NaN or infinity"). A comparison with an infinity is
now one against the dtype's largest finite value M, exactly: x == inf is x > M, x < inf is x <= M, x <= inf is
x == x (false for NaN only), x > inf never holds. Checked on inputs holding inf, -inf, NaN, +-M and ordinary
values, against PyTorch, bit for bit where PyTorch's result is exact.
"""
from __future__ import annotations

import numpy as np
import pytest

import tilefuse

torch = pytest.importorskip("torch")
nn = torch.nn
INF = float("inf")

COMPARISONS = {
    "eq": lambda t, v: t == v, "ne": lambda t, v: t != v, "lt": lambda t, v: t < v, "le": lambda t, v: t <= v,
    "gt": lambda t, v: t > v, "ge": lambda t, v: t >= v,
    "left_gt": lambda t, v: v > t, "left_le": lambda t, v: v <= t}


class Fn(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x):
        return self.f(x)


def _inputs(dtype):
    m = torch.finfo(dtype).max
    x = torch.randn(2, 3, 4, 5, dtype=dtype)
    special = x.clone()
    special[0, 0, 0] = torch.tensor([INF, -INF, float("nan"), m, -m], dtype=dtype)
    special[1, 2, 3] = torch.tensor([-INF, INF, INF, float("nan"), 0.0], dtype=dtype)
    return x, special


def _check(f, dtype=torch.float32):
    x, special = _inputs(dtype)
    compiled = tilefuse.compile(tilefuse.from_torch(Fn(f), x), threads=1)
    for inp in (x, special):
        got = tilefuse.Session(compiled).run(inp.numpy())
        want = Fn(f)(inp).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("sign", [1, -1])
@pytest.mark.parametrize("cmp", sorted(COMPARISONS))
def test_comparison_with_an_infinity_is_pytorchs(cmp, sign, dtype):
    _check(lambda x: torch.where(COMPARISONS[cmp](x, sign * INF), 1.0, -2.0) + x.abs().clamp(max=1.0), dtype)


@pytest.mark.parametrize("name,f", [
    ("logsumexp", lambda x: torch.logsumexp(x, 1, keepdim=True)),
    ("nan_to_num", lambda x: torch.nan_to_num(x, nan=0.0, posinf=100.0, neginf=-100.0)),
    ("nan_to_num_default", lambda x: torch.nan_to_num(x) * 0.5),
    ("isinf", lambda x: torch.where(torch.isinf(x), torch.zeros_like(x), x)),
    ("isnan", lambda x: torch.where(torch.isnan(x), 1.0, x)),
    ("masked_fill_inf", lambda x: x.masked_fill(x.abs() == INF, 0.0))])
def test_nonfinite_idioms_are_pytorchs(name, f):
    _check(f)


# ----------------------------------------------------------------------------- ONNX: the same, and the ops on them

def _onnx_check(nodes, inits=()):
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32) * 2
    x[0, 0, 0] = [np.inf, -np.inf, np.nan, 3.4e38, -3.4e38]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = tilefuse.compile(tilefuse.from_onnx(m)).run(x)
    assert np.array_equal(got, want, equal_nan=True)


def _c(name, v):
    from onnx import numpy_helper
    return numpy_helper.from_array(np.array(v, np.float32), name)


@pytest.mark.parametrize("pos,neg", [(1, 1), (1, 0), (0, 1), (0, 0)])
def test_onnx_isinf_is_onnx_runtimes(pos, neg):
    from onnx import helper
    _onnx_check([helper.make_node("IsInf", ["x"], ["m"], detect_positive=pos, detect_negative=neg),
                 helper.make_node("Where", ["m", "one", "x"], ["y"])], [_c("one", [1.0])])


def test_onnx_isnan_shrink_thresholded_relu_are_onnx_runtimes():
    from onnx import helper
    _onnx_check([helper.make_node("IsNaN", ["x"], ["m"]), helper.make_node("Where", ["m", "zero", "x"], ["y"])],
                [_c("zero", [0.0])])
    _onnx_check([helper.make_node("Shrink", ["x"], ["y"], lambd=0.7, bias=0.2)])
    _onnx_check([helper.make_node("Shrink", ["x"], ["y"])])
    _onnx_check([helper.make_node("ThresholdedRelu", ["x"], ["y"], alpha=0.5)])


@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("value", [np.inf, -np.inf])
@pytest.mark.parametrize("op", ["Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"])
def test_onnx_comparison_with_an_infinity_is_onnx_runtimes(op, value, left):
    from onnx import helper
    _onnx_check([helper.make_node(op, ["c", "x"] if left else ["x", "c"], ["m"]),
                 helper.make_node("Where", ["m", "one", "zero"], ["w"]), helper.make_node("Add", ["w", "x"], ["y"])],
                [_c("c", value), _c("one", [1.0]), _c("zero", [0.0])])
