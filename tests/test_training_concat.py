"""Training through a concat with a constant operand: ENet's channel padding of its downsampling main branch
(torch.cat((main, torch.zeros(n, ch, h, w)), 1): a fixed buffer) and a learned map concatenated as it is
(torch.cat((x, self.pos), 1) at batch 1: a parameter, trained). One step against PyTorch in float64
(test_training_modern._step_against_torch: every parameter's gradient, the learned map's included)."""
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
