"""Each BatchNorm's own momentum in the Trainer's running-statistics update. The eval-mode export drops it;
from_torch reads it from the module (`Network.bn_momentum`): MobileNetV3 / EfficientNet-style momentum=0.01,
PyTorch's default 0.1, and momentum=None (the cumulative average: the n-th training batch weighted 1 / n, n
counted from the module's num_batches_tracked). Checked: after three SGD steps the Trainer's state dict equals
PyTorch's (weights and running statistics within 1e-6 absolute, the counts exact), for a fresh module and for
one that has seen batches already; the Trainer's bn_momentum argument, where given, applies to every BN.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tilefuse
from tilefuse.training import SGD, Trainer


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8, momentum=0.01)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8, momentum=None)
        self.bn3 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv(x)))
        return self.fc(F.relu(self.bn3(self.bn2(self.conv2(x)))).mean((2, 3)))


def _x(i):
    return torch.from_numpy(np.random.default_rng(i).standard_normal((4, 3, 8, 8)).astype(np.float32) + i)


def _steps(module, n=3, schedule="fused", **kw):
    labels = torch.tensor([1, 2, 3, 4])
    tr = Trainer(tilefuse.from_torch(module, _x(0)), SGD(lr=0.1), schedule=schedule, **kw)
    ref = copy.deepcopy(module).train()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for i in range(n):
        tr.step(_x(i).numpy(), labels.numpy())
        opt.zero_grad()
        F.cross_entropy(ref(_x(i)), labels).backward()
        opt.step()
    return tr, ref


@pytest.mark.parametrize("schedule", ["fused", "unfused"])
def test_each_bn_keeps_its_momentum(schedule):
    torch.manual_seed(0)
    m = Net()
    tr, ref = _steps(m, schedule=schedule)
    assert tr.net.bn_momentum == {"bn1": 0.01, "bn2": None, "bn3": 0.1}
    sd, want = tr.to_torch_state_dict(), ref.state_dict()
    for k, v in want.items():
        np.testing.assert_allclose(sd[k].numpy(), v.numpy(), rtol=0, atol=1e-6, err_msg=k)
    assert int(sd["bn2.num_batches_tracked"]) == 3
    ref.load_state_dict(sd, strict=True)


def test_the_cumulative_average_counts_from_the_modules_batches():
    torch.manual_seed(1)
    m = Net()
    _, seen = _steps(m, n=2)                  # a module that has trained two batches in PyTorch
    tr, ref = _steps(seen, n=2)
    sd, want = tr.to_torch_state_dict(), ref.state_dict()
    assert int(sd["bn2.num_batches_tracked"]) == int(want["bn2.num_batches_tracked"]) == 4
    for k in ("bn2.running_mean", "bn2.running_var", "bn1.running_var"):
        np.testing.assert_allclose(sd[k].numpy(), want[k].numpy(), rtol=0, atol=1e-6, err_msg=k)


def test_the_bn_momentum_argument_applies_to_every_bn():
    torch.manual_seed(2)
    m = Net()
    tr, _ = _steps(m, n=1, bn_momentum=0.5)
    ref = copy.deepcopy(m).train()
    for bn in (ref.bn1, ref.bn2, ref.bn3):
        bn.momentum = 0.5
    ref(_x(0))
    sd = tr.to_torch_state_dict()
    for k in ("bn1.running_mean", "bn2.running_var", "bn3.running_mean"):
        np.testing.assert_allclose(sd[k].numpy(), ref.state_dict()[k].numpy(), rtol=0, atol=1e-6, err_msg=k)
