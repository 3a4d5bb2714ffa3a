"""Slice assignment through from_torch: `y[:, :c] = f(y[:, :c])` (FasterNet's partial conv, 'slicing' forward),
`y[..., 1:3] = 0.5`, `y[:, :, ::2] = v`, `y[:, 0] = v`, written as real model code writes them. torch.export
functionalizes them to aten.slice_scatter (select_scatter decomposes to a where); tilefuse builds the result from
slices, a concat and, for a step past 1, a reshape to (.., L, step, ..) whose first column is the source. The ops
move values: results equal PyTorch's bit for bit (the conv case within the fp32 tolerance). Both ONNX exporters'
forms of the same assignments (TorchScript: ScatterND at constant indices, a strided box of positions nested
slice assignments (convert._scatter_box); dynamo: Slice / Concat / ScatterND) against PyTorch and ONNX Runtime."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tilefuse
from onnx_export import EXPORTERS, assert_close_to_max, export, ort_run


class PartialConv(nn.Module):
    """FasterNet's Partial_conv3, forward 'slicing' (inference)."""

    def __init__(self, dim=6, n_div=3):
        super().__init__()
        self.dim_conv3 = dim // n_div
        self.partial_conv3 = nn.Conv2d(self.dim_conv3, self.dim_conv3, 3, 1, 1, bias=False)

    def forward(self, x):
        x = x.clone()
        x[:, :self.dim_conv3, :, :] = self.partial_conv3(x[:, :self.dim_conv3, :, :])
        return x


class Assign(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        y = x * 2
        self.fn(y, x)
        return y


def _set(index, value):
    def fn(y, x):
        y[index] = value(x) if callable(value) else value
    return fn


S = slice
CASES = {
    "fill_band": _set((S(None), S(None), S(1, 3)), 0.5),
    "channel_zero": _set((S(None), 0), 0.0),
    "select_from_x": _set((S(None), 0), lambda x: x[:, 1] + 1),
    "even_rows": _set((S(None), S(None), S(None, None, 2)), lambda x: x[:, :, 3:]),          # H 7: rows 0, 2, 4, 6
    "step3_tail": _set((Ellipsis, S(1, None, 3)), lambda x: -x[..., :2]),      # W 5: columns 1, 4
    "negative_start": _set((Ellipsis, S(-3, -1)), lambda x: x[..., :2] * 3),
    "all_of_axis": _set((S(None), S(None, None, 1)), lambda x: x.flip(1)),
    "step2_odd": _set((S(None), S(None), S(1, None, 2)), lambda x: x[:, :, :3] * 3),     # H 7: rows 1, 3, 5
}


@pytest.mark.parametrize("case", list(CASES))
def test_slice_assignment_equals_pytorch(case):
    m = Assign(CASES[case])
    x = torch.randn(2, 4, 7, 5, generator=torch.Generator().manual_seed(1))
    got = tilefuse.compile(tilefuse.from_torch(m, x)).run(x.numpy())
    np.testing.assert_array_equal(got, m(x).numpy())


def test_fasternet_partial_conv_slicing_matches_pytorch():
    torch.manual_seed(0)
    m = PartialConv().eval()
    x = torch.randn(2, 6, 9, 8)
    net = tilefuse.from_torch(m, x)
    assert [o.op for o in net.ops].count("concat") == 1
    assert_close_to_max(tilefuse.compile(net).run(x.numpy()), m(x).detach().numpy())


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("case", list(CASES))
def test_exported_slice_assignment_matches_pytorch_and_onnxruntime(case, exporter):
    m = Assign(CASES[case])
    x = np.random.default_rng(2).standard_normal((2, 4, 7, 5)).astype(np.float32)
    blob = export(m, x, exporter)
    got = tilefuse.compile(tilefuse.from_onnx(blob)).run(x)
    np.testing.assert_array_equal(got, m(torch.from_numpy(x)).numpy())
    np.testing.assert_array_equal(got, ort_run(blob, x))


LARGE = {"cols_step3": _set((Ellipsis, S(1, None, 3)), lambda x: -x[..., :4]),         # W 13: columns 1, 4, 7, 10
         "cols_step2": _set((S(None), S(2, 6), S(None), S(None, None, 2)), lambda x: x[:, :4, :, 6:] * 2)}


@pytest.mark.parametrize("case", list(LARGE))
def test_torchscript_scatter_of_a_large_strided_box_matches(case):
    """(2, 8, 16, 13): the TorchScript ScatterND writes 500-1800 runs of positions, past the runs form's limit of
    256 slices; the strided box form writes any number (a few slices)."""
    m = Assign(LARGE[case])
    x = np.random.default_rng(3).standard_normal((2, 8, 16, 13)).astype(np.float32)
    blob = export(m, x, "torchscript")
    net = tilefuse.from_onnx(blob)
    assert len([o for o in net.ops if o.op == "slice"]) < 20
    got = tilefuse.compile(net).run(x)
    np.testing.assert_array_equal(got, m(torch.from_numpy(x)).numpy())
    np.testing.assert_array_equal(got, ort_run(blob, x))


class PartialConvTrain(nn.Module):
    """The slicing form PyTorch can differentiate: the conv reads x's slice, the assignment writes a clone's."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 6, 3, padding=1)
        self.pconv = nn.Conv2d(2, 2, 3, padding=1, bias=False)
        self.head = nn.Linear(6, 5)

    def forward(self, x):
        x = F.relu(self.stem(x))
        y = x.clone()
        y[:, :2] = self.pconv(x[:, :2])
        y[:, :, ::2] = y[:, :, ::2] * 0.5
        return self.head(y.mean((2, 3)))


def test_slice_assignment_trains_as_pytorch():
    from test_training_modern import _step_against_torch
    torch.manual_seed(2)
    _step_against_torch(PartialConvTrain(), torch.randn(3, 3, 7, 6), torch.tensor([1, 0, 4]))
