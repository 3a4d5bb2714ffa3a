"""0-d tensors, bool arithmetic and masked assignment, as real model code writes them.

A reduction over every axis without keepdim is a 0-d tensor (Network's reduce with keepdim and a reshape to ()):
`x - x.mean()`, `(x - x.mean()) / x.std()`, `x / x.abs().max()`, `x / x.norm()` (global normalisations), a 0-d
value unsqueezed, stacked or expanded, and 0-d network outputs (statistics a model returns). Every tensor the
importer builds is checked against the shape PyTorch computed (`_Importer._check_shapes`), so any importer mistake
of shape is refused rather than computed wrong.

Bool tensors in arithmetic are PyTorch's 1 / 0 (`x * (x > 0)`, logaddexp's `(a == b) * x`, nanmean's count
`(~isnan(x)).sum()`, an int64 output); `x[mask] = v` (index_put with a bool mask over x's leading dims) is
where(mask, v, x), and x[mask] itself (a data-dependent shape) is x computed whole: element-wise ops on it and an
assignment with the same mask (`y[m] = f(x[m])`, `y[m] += v`), and its sum and mean (0-d). Every case is compared
with PyTorch; the global normalisation trains as PyTorch does."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import tilefuse
from test_training_modern import _step_against_torch
from tilefuse.errors import GraphError, UnsupportedOpError
from tilefuse.frontend import torch_export


class Head(nn.Module):
    """A conv, then `f(self, y)`: the code under test reads a computed tensor."""

    def __init__(self, f, cin=4, cout=4):
        super().__init__()
        self.f = f
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.register_buffer("keep", torch.tensor([True, False, True]))

    def forward(self, x):
        return self.f(self, self.conv(x))


def _masked(s, y):
    y = y.clone()
    y[y < 0] = 0.5
    return y


def _masked_by_mean(s, y):
    z = y.clone()
    z[y > y.mean()] = y.std()           # a 0-d value
    return z


def _masked_images(s, y):
    z = y.clone()
    z[y.mean((1, 2, 3)) > 0] = 0.0      # a mask over the batch: whole images
    return z


def _masked_buffer(s, y):
    z = y.clone()
    z[s.keep] = -1.0                    # a constant mask (a buffer)
    return z


def _masked_planes(s, y):
    z = y.clone()
    z[y.mean((2, 3)) > 0] = torch.arange(35.0).view(5, 7)     # per (n, c): a (H, W) plane
    return z


def _masked_band(s, y):
    z = y.clone()
    z[(y > 0) & (y < 0.5)] = 1.0
    return z


def _masked_nan(s, y):
    z = y.log()                         # NaN where y < 0
    z[torch.isnan(z)] = 0.0
    return z


def _masked_add(s, y):
    z = y.clone()
    z[y > 0.2] += 2.0                   # z[m] = z[m] + 2: x[mask] element-wise, then assigned
    return z


def _masked_values(s, y):
    z = y.clone()
    z[y > 0.2] = y[y > 0.2] * 2         # the mask computed twice, as written
    return z


def _masked_elu(s, y):
    z = y.clone()
    m = y < 0
    z[m] = torch.exp(y[m]) - 1
    return z


def _masked_images_from_zeros(s, y):
    z = torch.zeros_like(y)
    m = y.mean((1, 2, 3)) > 0
    z[m] = torch.sigmoid(y[m]) * 3 + 1
    return z


def _masked_nan_values(s, y):
    z = y.log()
    z[torch.isnan(z)] = y[torch.isnan(z)] * 0.1
    return z


CASES = {
    "x - x.mean()": lambda s, y: y - y.mean(),
    "(x - x.mean()) / x.std()": lambda s, y: (y - y.mean()) / y.std(),
    "x / x.abs().max()": lambda s, y: y / y.abs().max(),
    "x - x.min() / amax": lambda s, y: (y - y.min()) / y.amax(),
    "x / x.norm()": lambda s, y: y / y.norm(),
    "var_mean()": lambda s, y: y * torch.var_mean(y)[0] + torch.var_mean(y)[1],
    "x.sum().sum()": lambda s, y: y * y.sum().sum(),
    "0-d arithmetic": lambda s, y: y * (y.mean() * y.std() + 1).sqrt(),
    "unsqueeze(0).unsqueeze(-1)": lambda s, y: y * y.mean().unsqueeze(0).unsqueeze(-1),
    "expand": lambda s, y: y + y.mean().expand(7),
    "stack": lambda s, y: y * torch.stack([y.mean(), y.max()]).view(1, 2, 1, 1).repeat(1, 2, 1, 1),
    "a 1-D tensor's element": lambda s, y: y * y.flatten()[3],
    "clamp(max=0-d)": lambda s, y: torch.clamp(y, max=y.max() * 0.5),
    "x[x < 0] = 0.5": _masked,
    "x[x > mean] = std": _masked_by_mean,
    "x[image mask] = 0": _masked_images,
    "x[buffer mask] = -1": _masked_buffer,
    "x[(n, c) mask] = plane": _masked_planes,
    "x[(x > 0) & (x < .5)] = 1": _masked_band,
    "x[isnan(x)] = 0": _masked_nan,
    "x[m] += 2": _masked_add,
    "x[m] = x[m] * 2": _masked_values,
    "x[m] = exp(x[m]) - 1": _masked_elu,
    "zeros[image mask] = f(x[image mask])": _masked_images_from_zeros,
    "x[isnan] = x[isnan] * .1": _masked_nan_values,
    "x[m].mean(), x[m].sum()": lambda s, y: y - y[y > 0].mean() + y[y < -0.5].sum() * 0.01,
    "x[image mask].mean()": lambda s, y: y * y[y.mean((1, 2, 3)) > -1].mean(),
    "x * (x > 0)": lambda s, y: y * (y > 0) + (y < 0) * 0.1 * y,
    "(x > 0) * (x < .5) (logical and)": lambda s, y: ((y > 0) * (y < 0.5)).float() * y,
    "(x > 0) + (x < -1) (logical or)": lambda s, y: ((y > 0) + (y < -1)).float() * y,
    "x - (x > 0) + 1 - (x > 0) * 1.0": lambda s, y: y - (y > 0).float() + 1 - (y > 0) * 1.0,
    "logaddexp": lambda s, y: torch.logaddexp(y, y.flip(1)),
    "nanmean": lambda s, y: torch.where(y > 0.3, y, y.log()).nanmean(dim=1, keepdim=True),   # NaN where y < 0
    "count / 4": lambda s, y: y * ((y > 0).sum(1, keepdim=True) / 4),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_torch(case):
    torch.manual_seed(0)
    m = Head(CASES[case]).eval()
    x = torch.randn(3, 4, 5, 7)
    with torch.no_grad():
        want = m(x).numpy()
    got = tilefuse.compile(tilefuse.from_torch(m, x)).run(x.numpy())
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


def test_a_count_of_bools_is_an_int64_output():
    m = Head(lambda s, y: (y > 0).sum(1)).eval()
    x = torch.randn(2, 4, 5, 7)
    with torch.no_grad():
        want = m(x).numpy()
    got = tilefuse.compile(tilefuse.from_torch(m, x)).run(x.numpy())
    assert got.dtype == np.int64 and want.dtype == np.int64
    np.testing.assert_array_equal(got, want)


class Statistics(nn.Module):
    def forward(self, x):
        y = x * 2.0
        return y.mean(), y.std(), (y - y.mean()).abs().max(), y.flatten()[3], (y > 0).sum(), y.mean() * 2.0, y.min()


def test_0d_outputs_are_0d():
    x = torch.randn(2, 3, 5, 4)
    net = tilefuse.from_torch(Statistics(), x)
    assert [o.shape for o in net.outputs] == [()] * 7
    got = tilefuse.compile(net).run(x.numpy())
    want = [t.numpy() for t in Statistics()(x)]
    for g, w in zip(got, want):
        assert g.shape == () and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-5)


def _other_mask(s, y):
    z = y.clone()
    z[y > 0] = y[y.flip(1) > 0] * 2      # (the same count of True by construction: a flip keeps it)
    return z


@pytest.mark.parametrize("f,match", [
    (lambda s, y: y * y[y > 0].amax(), r"aten\.amax\.default of x\[mask\].*its sum and mean"),
    (lambda s, y: y[y > 0], r"returning x\[mask\].*of a data-dependent shape"),
    (_other_mask, r"x\[mask\] and y\[other_mask\]|y\[mask\] = x\[other_mask\]"),
])
def test_what_x_mask_may_not_do_is_refused(f, match):
    with pytest.raises(UnsupportedOpError, match=match):
        tilefuse.from_torch(Head(f), torch.randn(1, 4, 5, 5))


def test_an_importer_shape_mistake_is_refused(monkeypatch):
    """The importer's own check: a handler that built the wrong shape (here permute returning its input) is
    refused naming both shapes, not computed."""
    monkeypatch.setitem(torch_export._ATEN, "permute", lambda imp, x, dims: imp.tensor(x))
    m = Head(lambda s, y: y.permute(0, 2, 3, 1))
    with pytest.raises(GraphError, match=r"built shape \(1, 4, 5, 6\) for aten.permute.default where PyTorch "
                                         r"computes \(1, 5, 6, 4\)"):
        tilefuse.from_torch(m, torch.randn(1, 4, 5, 6))


class GlobalNorm(nn.Module):
    """A classifier with a global normalisation between its convs ((x - x.mean()) / x.std(), 0-d statistics)
    and a masked clamp."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 6, 3, padding=1)
        self.c2 = nn.Conv2d(6, 8, 3, stride=2, padding=1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        y = self.c1(x)
        y = (y - y.mean()) / (y.std() + 1e-5)
        y = y * (y > -1.0)
        y = torch.relu(self.c2(y))
        return self.fc(y.mean((2, 3)))


def test_a_global_normalisation_trains_as_torch():
    torch.manual_seed(1)
    x = torch.randn(4, 3, 9, 11)
    _step_against_torch(GlobalNorm(), x, torch.tensor([0, 3, 1, 4]))
