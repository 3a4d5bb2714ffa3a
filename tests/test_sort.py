"""Order statistics through from_torch: median, kthvalue, sort and topk values along an axis of up to 64 values,
by a sorting network (Batcher's odd-even merge sort) of IR ops: minimum / maximum for the median (NaN anywhere in
the axis gives NaN, as PyTorch's median), where ops on `a > b or a != a` for the rest (NaN above every number,
as PyTorch's sort). The values are selections, so they equal PyTorch's bit for bit (NaN and infinities where
PyTorch has them). The indices are refused by name where read. The network itself is checked by the 0-1
principle; a median blur as kornia writes it (one-hot conv kernels, a view, median over the window) against
SciPy's median filter; a top-k pooling head trains as PyTorch's."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.ndimage
import torch
import torch.nn as nn
import torch.nn.functional as F

import tilefuse
from test_training_modern import _step_against_torch
from tilefuse.errors import UnsupportedOpError
from tilefuse.ir.network import MAX_SORTED, batcher_pairs
from tilefuse.interpreter import evaluate


@pytest.mark.parametrize("n", list(range(1, 13)))
def test_the_network_sorts_every_zero_one_input(n):
    """The 0-1 principle: a comparator network that sorts every 0/1 sequence sorts every sequence."""
    pairs = batcher_pairs(n)
    for bits in itertools.product((0, 1), repeat=n):
        v = list(bits)
        for i, j in pairs:
            v[i], v[j] = min(v[i], v[j]), max(v[i], v[j])
        assert v == sorted(bits), (n, bits)


@pytest.mark.parametrize("n", [13, 25, 49, MAX_SORTED])
def test_the_network_sorts_random_values(n):
    rng = np.random.default_rng(n)
    for _ in range(20):
        v = list(rng.standard_normal(n))
        want = sorted(v)
        for i, j in batcher_pairs(n):
            v[i], v[j] = min(v[i], v[j]), max(v[i], v[j])
        assert v == want


class Fn(nn.Module):
    """f of 2 x (exact: the values f selects are the input's, so PyTorch's bits are the check)."""

    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x):
        return self.f(x * 2.0)


CASES = {
    "median_channels": lambda y: y.median(1).values,
    "median_keepdim_rows": lambda y: torch.median(y, dim=2, keepdim=True)[0],
    "median_all": lambda y: y[:, :2, :3, :4].median() + y,
    "kthvalue": lambda y: y.kthvalue(2, dim=3).values,
    "kthvalue_keepdim": lambda y: torch.kthvalue(y, 5, 1, keepdim=True)[0],
    "sort": lambda y: y.sort(dim=1).values,
    "sort_descending_last": lambda y: torch.sort(y, descending=True).values,
    "sort_stable": lambda y: torch.sort(y, dim=2, stable=True)[0],
    "topk": lambda y: y.topk(3, dim=1).values,
    "topk_smallest": lambda y: torch.topk(y, 2, dim=-1, largest=False)[0],
    "topk_pool": lambda y: y.flatten(2).topk(4, dim=2).values.mean(2),
}


def _x(seed=0, shape=(2, 6, 7, 9)):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _special(x):
    """NaN, +-inf, ties and -0.0 in x: a NaN and an inf channel, scattered specials elsewhere."""
    x[:, 0] = float("nan")
    x[0, 1] = float("inf")
    x[1, 2, :, ::2] = -float("inf")
    x[:, 3, 1] = 0.5
    x[:, 4, 1] = 0.5
    x[0, 5, 2, 3] = -0.0
    x[1, 5, ::3, ::2] = float("nan")
    return x


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_are_pytorchs_bit_for_bit(name):
    m = Fn(CASES[name]).eval()
    x = _x()
    with torch.no_grad():
        want = m(x).numpy()
    net = tilefuse.from_torch(m, x)
    np.testing.assert_array_equal(evaluate(net, x.numpy())[0], want)
    np.testing.assert_array_equal(tilefuse.compile(net).run(x.numpy()), want)


@pytest.mark.parametrize("name", sorted(CASES))
def test_nan_and_infinities_are_where_pytorch_puts_them(name):
    """A NaN channel, +-inf channels, ties and -0.0: median is NaN wherever the axis holds a NaN, sort and topk put
    NaN above every number."""
    m = Fn(CASES[name]).eval()
    x = _special(_x(1))
    with torch.no_grad():
        want = m(x).numpy()
    got = tilefuse.compile(tilefuse.from_torch(m, x)).run(x.numpy())
    np.testing.assert_array_equal(got, want)


class MedianBlur(nn.Module):
    """kornia.filters.median_blur: the window's values by a conv with one-hot kernels (one output channel per
    window position, per input channel), then the median over them."""

    def __init__(self, k=3):
        super().__init__()
        self.k = k
        eye = torch.eye(k * k).view(k * k, 1, k, k)
        self.register_buffer("kernel", eye)

    def forward(self, x):
        b, c, h, w = x.shape
        pad = (self.k - 1) // 2
        feats = F.conv2d(x.reshape(b * c, 1, h, w), self.kernel, padding=pad, stride=1)
        feats = feats.view(b, c, -1, h, w)                      # (B, C, k*k, H, W)
        return torch.median(feats, dim=2)[0]


@pytest.mark.parametrize("k", [3, 5])
def test_median_blur_is_scipys_median_filter(k):
    x = _x(2, (2, 3, 23, 17))
    m = MedianBlur(k)
    got = tilefuse.compile(tilefuse.from_torch(m, x)).run(x.numpy())
    want = scipy.ndimage.median_filter(x.numpy(), size=(1, 1, k, k), mode="constant", cval=0.0)
    np.testing.assert_array_equal(got, want)
    with torch.no_grad():
        np.testing.assert_array_equal(got, m(x).numpy())


def test_a_top_k_pooling_head_trains_as_torch():
    torch.manual_seed(4)
    head = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), Fn(CASES["topk_pool"]), nn.Linear(8, 4))
    _step_against_torch(head, _x(4, (4, 3, 6, 5)), torch.tensor([0, 3, 1, 2]))


def test_indices_and_long_axes_are_refused_by_name():
    x = _x()
    with pytest.raises(UnsupportedOpError, match="of the indices of topk.*values only"):
        tilefuse.from_torch(Fn(lambda y: y.topk(2, dim=1).indices.float()), x)
    with pytest.raises(UnsupportedOpError, match="forward.. returning the indices of median.*values only"):
        tilefuse.from_torch(Fn(lambda y: y.median(1)), x)
    with pytest.raises(UnsupportedOpError, match="the indices of sort"):
        tilefuse.from_torch(Fn(lambda y: y.sort(1)[1]), x)
    with pytest.raises(UnsupportedOpError, match=f"along an axis of 70 values.*up to {MAX_SORTED}"):
        tilefuse.from_torch(Fn(lambda y: y.flatten(2).median(2).values), _x(shape=(1, 2, 7, 10)))


# what the exporters export (neither exports kthvalue, median or a stable sort)
EXPORTED = {e: ["sort", "sort_descending_last", "topk", "topk_pool", "topk_smallest"] for e in ("torchscript", "dynamo")}


@pytest.mark.parametrize("exporter,name", [(e, n) for e, names in EXPORTED.items() for n in names])
def test_exports_match_onnxruntime_and_pytorch(exporter, name):
    """The exporters write sort / topk as TopK (the Indices unread): from_onnx imports the Values by the same
    sorting network."""
    from onnx_export import check_export
    check_export(lambda: Fn(CASES[name]), _x(2).numpy(), exporter)


def test_onnx_topk_indices_are_refused_by_name():
    from onnx import TensorProto, helper, numpy_helper
    g = helper.make_graph([helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
                          [helper.make_tensor_value_info("v", TensorProto.FLOAT, [2, 2]),
                           helper.make_tensor_value_info("i", TensorProto.INT64, [2, 2])],
                          [numpy_helper.from_array(np.int64([2]), "k")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])
    with pytest.raises(UnsupportedOpError, match=r"TopK.*the Indices\) is used; tilefuse computes the Values only"):
        tilefuse.from_onnx(m)
