"""Comparisons with +-inf, torch.isinf / isnan, nan_to_num and logsumexp through from_torch.

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
