"""Training through a concat with a constant operand and a slice of one: ENet's channel padding of its
downsampling main branch (torch.cat((main, torch.zeros(n, ch, h, w)), 1): a fixed buffer), a learned map
concatenated as it is (torch.cat((x, self.pos), 1) at batch 1: a parameter, trained), TSM's temporal shift (slices
of torch.zeros_like(x) assigned from x's segments: the untouched slices stay constants). One step against PyTorch
in float64 (test_training_modern._step_against_torch: every parameter's gradient, the learned map's included)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from test_training_modern import _step_against_torch


class ZeroPadded(nn.Module):
    """ENet's DownsamplingBottleneck main branch: max pool, channels padded with zeros to the extension's count."""

    def __init__(self):
        super().__init__()
        self.ext = nn.Sequential(nn.Conv2d(3, 8, 2, 2), nn.BatchNorm2d(8), nn.PReLU(8))
        self.pool = nn.MaxPool2d(2, 2, return_indices=True)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        main, _ = self.pool(x)
        ext = self.ext(x)
        n, ch_ext, h, w = ext.size()
        padding = torch.zeros(n, ch_ext - main.size(1), h, w)
        main = torch.cat((main, padding), 1)
        return self.head(F.relu(main + ext).mean((2, 3)))


class LearnedMap(nn.Module):
    def __init__(self, h=6, w=7):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(1, 2, h, w))
        self.conv = nn.Conv2d(5, 4, 3, padding=1)
        self.head = nn.Linear(4, 5)

    def forward(self, x):
        return self.head(F.relu(self.conv(torch.cat((x, self.pos), 1))).mean((2, 3)))


def test_enet_zero_padding_trains_as_pytorch():
    torch.manual_seed(0)
    _step_against_torch(ZeroPadded(), torch.randn(4, 3, 8, 10), torch.tensor([0, 1, 4, 2]))


def test_a_concatenated_parameter_trains_as_pytorch():
    torch.manual_seed(1)
    m = LearnedMap()
    _, grads = _step_against_torch(m, torch.randn(1, 3, 6, 7), torch.tensor([3]))
    assert "pos" in grads and float(abs(grads["pos"]).max()) > 0


class TemporalShift(nn.Module):
    """TSM's shift (mit-han-lab temporal-shift-module) as the repo writes it: slices of torch.zeros_like(x)
    assigned from x's shifted segments; the zeros' untouched slices stay constants in the network."""

    def __init__(self, n_segment=2, fold_div=4):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.n_segment, self.fold_div = n_segment, fold_div
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = self.conv(x)
        nt, c, h, w = x.size()
        x = x.view(nt // self.n_segment, self.n_segment, c, h, w)
        fold = c // self.fold_div
        out = torch.zeros_like(x)
        out[:, :-1, :fold] = x[:, 1:, :fold]
        out[:, 1:, fold: 2 * fold] = x[:, :-1, fold: 2 * fold]
        out[:, :, 2 * fold:] = x[:, :, 2 * fold:]
        return self.fc(out.view(nt, c, h, w).mean((2, 3)))


def test_temporal_shift_trains_as_pytorch():
    torch.manual_seed(2)
    _step_against_torch(TemporalShift(), torch.randn(4, 3, 5, 6), torch.tensor([0, 1, 4, 2]))
