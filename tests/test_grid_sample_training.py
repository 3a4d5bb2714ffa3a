"""Training through grid_sample: spatial transformers and flow warps learn their theta / flow from the loss.

`train_resample.grid_sample_backward` (the input's gradient and the grid's, float64 inside) against PyTorch
autograd in float64 for every mode, padding mode and align_corners, on odd shapes and at grid points on the
image's edges and centres, where a clip's or a reflection's derivative changes (PyTorch's conventions: a clip
passes no gradient at its ends); then one training step of the PyTorch tutorial's spatial transformer and of a
RAFT-style flow warp through from_torch + Trainer against PyTorch (test_training_modern's tolerances), a grid that
is itself an nn.Parameter (trained), and a module's fixed buffers (`(x - self.mean) / self.std`, an STN's base
theta) in the Trainer's state dict, which PyTorch's load_state_dict(strict=True) takes."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tilefuse
from test_grid_sample import STN, Warp
from test_training_modern import _step_against_torch
from tilefuse.kernels import train_resample as trs
from tilefuse.training import SGD, Trainer

# (x shape, grid shape): odd sizes, one row, one column, an output larger than the input
SHAPES = [((2, 3, 5, 7), (2, 4, 6, 2)), ((1, 2, 1, 4), (1, 3, 3, 2)), ((1, 1, 4, 1), (1, 2, 5, 2)),
          ((3, 5, 6, 6), (3, 9, 8, 2))]
EDGES = [-1.0, 1.0, 0.0, -1.0, 1.0, 1.0, -0.5, 0.5, 1.5, -1.5, 3.0, -3.0]   # corners, centres, mirrored


@pytest.mark.parametrize("mode,pad,align", list(itertools.product(["bilinear", "nearest"],
                                                              ["zeros", "border", "reflection"], [False, True])))
def test_grid_sample_backward_matches_autograd(mode, pad, align):
    rng = np.random.default_rng(3)
    for xs, gs in SHAPES:
        x, g = rng.standard_normal(xs), rng.uniform(-1.7, 1.7, gs)
        g.reshape(-1)[:len(EDGES)] = EDGES
        dy = rng.standard_normal(xs[:2] + gs[1:3])
        xt, gt = torch.tensor(x, requires_grad=True), torch.tensor(g, requires_grad=True)
        F.grid_sample(xt, gt, mode=mode, padding_mode=pad, align_corners=align).backward(torch.tensor(dy))
        dx, dg = trs.grid_sample_backward(dy, x, g, mode, pad, align)
        assert dx.dtype == dg.dtype == np.float64 and dx.shape == xs and dg.shape == gs
        np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=0, atol=1e-12)
        np.testing.assert_allclose(dg, gt.grad.numpy(), rtol=0, atol=1e-12 * max(1.0, np.abs(dg).max()))
        if mode == "bilinear":
            assert np.abs(dg).max() > 0.1                  # a test of the grid's gradient, not of zeros
        f32 = trs.grid_sample_backward(dy.astype(np.float32), x.astype(np.float32), g.astype(np.float32), mode,
                                       pad, align)
        assert all(a.dtype == np.float32 for a in f32)


class STNClassifier(nn.Module):
    """The tutorial's STN (its theta computed from the image by a small conv net) and a classifier after it."""

    def __init__(self):
        super().__init__()
        self.stn = STN()
        self.fc = nn.Linear(4, 10)

    def forward(self, x):
        return self.fc(self.stn(x).mean((2, 3)))


class WarpClassifier(nn.Module):
    def __init__(self, padding_mode):
        super().__init__()
        self.warp = Warp(padding_mode)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        return self.fc(F.relu(self.warp(x)).mean((2, 3)))


@pytest.mark.parametrize("make,shape,classes", [
    (STNClassifier, (4, 1, 28, 28), 10),
    (lambda: WarpClassifier("border"), (2, 6, 11, 13), 5),
    (lambda: WarpClassifier("reflection"), (2, 6, 9, 9), 5),
    (lambda: WarpClassifier("zeros"), (3, 6, 8, 10), 5),
], ids=["stn", "warp-border", "warp-reflection", "warp-zeros"])
def test_spatial_transformers_and_flow_warps_train_as_torch(make, shape, classes):
    torch.manual_seed(0)
    module = make()
    x = torch.randn(shape)
    tr, grads = _step_against_torch(module, x, torch.arange(shape[0]) % classes)
    loc = "stn.fc_loc.2.weight" if "stn.fc_loc.2.weight" in grads else "warp.flow.weight"
    assert np.abs(grads[loc]).max() > 1e-4               # the loss reaches the net that computes theta / flow
    assert {o.op for o in tr.net.ops} >= {"grid_sample"}


class LearnedGrid(nn.Module):
    """A sampling grid that is itself a parameter (a learned resampling), and fixed buffers in arithmetic."""

    def __init__(self):
        super().__init__()
        g = F.affine_grid(torch.tensor([[[0.9, 0.1, 0.05], [-0.1, 0.8, 0.0]]]), [1, 3, 6, 5], align_corners=False)
        self.grid = nn.Parameter(g + 0.03 * torch.randn(g.shape))
        self.register_buffer("mean", torch.tensor([0.4, 0.5, 0.6]).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor([0.2, 0.25, 0.3]).view(1, 3, 1, 1))
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        x = (x - self.mean) / self.std
        y = F.grid_sample(self.conv(x), self.grid.expand(x.size(0), -1, -1, -1), padding_mode="border",
                          align_corners=False)
        return self.fc(y.mean((2, 3)))


def test_a_grid_parameter_trains_and_fixed_buffers_load_back():
    torch.manual_seed(1)
    module = LearnedGrid()
    x = torch.randn(1, 3, 7, 9)
    tr, grads = _step_against_torch(module, x, torch.tensor([2]))
    assert np.abs(grads["grid"]).max() > 1e-3
    tr.step(x.numpy(), np.array([2]))
    state = tr.to_torch_state_dict()
    assert set(state) == set(module.state_dict())
    torch.testing.assert_close(state["mean"], module.mean, rtol=0, atol=0)
    assert not torch.equal(state["grid"], module.grid.data)          # trained
    module.load_state_dict(state, strict=True)
    tr.load_state_dict(module.state_dict())                         # the same buffers: taken
    with pytest.raises(ValueError, match=r"state key 'std' is a buffer of the module that the network holds as "
                                         r"constants folded at import"):
        tr.load_state_dict({"std": torch.ones(1, 3, 1, 1)})


def test_a_grid_folded_from_a_parameter_is_refused_by_name():
    class Folded(nn.Module):
        def __init__(self):
            super().__init__()
            self.theta = nn.Parameter(torch.tensor([[[1.0, 0.1, 0.0], [0.0, 1.0, 0.1]]]))

        def forward(self, x):
            return F.grid_sample(x, F.affine_grid(self.theta, [1, 3, 5, 5], align_corners=False),
                                 align_corners=False).mean((2, 3))

    net = tilefuse.from_torch(Folded(), torch.randn(1, 3, 5, 5))
    with pytest.raises(tilefuse.UnsupportedOpError, match=r"derived from parameter 'theta'"):
        Trainer(net, SGD(lr=0.1))


def test_bicubic_is_refused_by_name_in_training():
    class Bicubic(nn.Module):
        def __init__(self):
            super().__init__()
            self.g = nn.Conv2d(3, 2, 3, padding=1)
            self.fc = nn.Linear(3, 4)

        def forward(self, x):
            y = F.grid_sample(x, torch.tanh(self.g(x)).permute(0, 2, 3, 1), mode="bicubic", align_corners=False)
            return self.fc(y.mean((2, 3)))

    net = tilefuse.from_torch(Bicubic(), torch.randn(2, 3, 6, 6))
    with pytest.raises(tilefuse.UnsupportedOpError, match=r"grid_sample mode 'bicubic' has no backward in the "
                                                          r"trainer; expected mode 'bilinear' or 'nearest'"):
        Trainer(net, SGD(lr=0.1))
