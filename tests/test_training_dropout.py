"""Dropout and stochastic depth in networks imported from PyTorch and trained by the Trainer.

An eval-mode export shows nn.Dropout / F.dropout / Dropout2d as aten ops with train=False, and stochastic depth
(torchvision's StochasticDepth, timm's DropPath) not at all (their eval forward returns x). Before, from_torch
dropped all of them and the Trainer trained the network without any of them: silently another training than
PyTorch's. Now each with p > 0 is a dropout op (`Network.dropout`, mode: 'element', 'channel' (one draw per
sample and channel), 'sample' (one per sample: stochastic depth 'row', DropPath), 'batch'); compile removes it,
the Trainer draws its mask. Checked: the ops and modes imported, inference unchanged (compiled, 1 and 3 threads,
against PyTorch's eval forward), each mask's shape and values, a step's gradients against PyTorch's with the
Trainer's masks put in place of PyTorch's dropouts (float64, every parameter), masks drawn anew each step and
the drop fraction near p; alpha dropout, an unscaled DropPath, RReLU and an InstanceNorm2d with running
statistics (training forwards the eval export does not show) refused by name.
Tolerance: gradients within 1e-3 of each tensor's largest (plus 1e-4 of the largest gradient).
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tilefuse
from tilefuse.errors import UnsupportedOpError
from tilefuse.training import SGD, Trainer


class StochasticDepth(nn.Module):
    """torchvision.ops.StochasticDepth (its forward, verbatim up to names)."""

    def __init__(self, p: float, mode: str) -> None:
        super().__init__()
        self.p, self.mode = p, mode

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        survival_rate = 1.0 - self.p
        size = [x.shape[0]] + [1] * (x.ndim - 1) if self.mode == "row" else [1] * x.ndim
        noise = torch.empty(size, dtype=x.dtype, device=x.device).bernoulli_(survival_rate)
        if survival_rate > 0.0:
            noise.div_(survival_rate)
        return x * noise


class DropPath(nn.Module):
    """timm's DropPath."""

    def __init__(self, drop_prob: float = 0., scale_by_keep: bool = True):
        super().__init__()
        self.drop_prob, self.scale_by_keep = drop_prob, scale_by_keep

    def forward(self, x):
        if self.drop_prob == 0. or not self.training:
            return x
        keep_prob = 1 - self.drop_prob
        shape = (x.shape[0],) + (1,) * (x.ndim - 1)
        random_tensor = x.new_empty(shape).bernoulli_(keep_prob)
        if keep_prob > 0.0 and self.scale_by_keep:
            random_tensor.div_(keep_prob)
        return x * random_tensor


class Net(nn.Module):
    def __init__(self, drop_rate=0.25):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.d2 = nn.Dropout2d(0.2)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.sd = StochasticDepth(0.3, "row")
        self.conv3 = nn.Conv2d(8, 8, 1)
        self.dp = DropPath(0.2)
        self.sd_batch = StochasticDepth(0.5, "batch")
        self.drop = nn.Dropout(0.4)
        self.fc = nn.Linear(8, 10)
        self.drop_rate = drop_rate
        self.off = nn.Dropout(0.0)

    def forward(self, x):
        x = self.d2(F.relu(self.bn(self.conv(x))))
        x = x + self.sd(F.relu(self.conv2(x)))
        x = x + self.dp(self.conv3(x)) + self.sd_batch(x)
        x = F.dropout(self.off(x.mean((2, 3))), self.drop_rate, self.training)
        return self.fc(self.drop(x))


MODES = {"d2": ("channel", 0.2), "sd": ("sample", 0.3), "dp": ("sample", 0.2), "sd_batch": ("batch", 0.5),
         "drop": ("element", 0.4)}


def _x(seed=0, n=6):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((n, 3, 8, 8)).astype(np.float32))


def _dropouts(net):
    return {op.name: op for op in net.ops if op.op == "dropout"}


def test_each_dropout_is_an_op_with_its_mode_and_inference_is_unchanged():
    torch.manual_seed(0)
    m, x = Net().eval(), _x()
    net = tilefuse.from_torch(m, x)
    ops = _dropouts(net)
    assert {k: (op.params.get("mode", "element"), op.params["p"]) for k, op in ops.items() if k in MODES} == MODES
    functional = [op for k, op in ops.items() if k not in MODES]
    assert len(functional) == 1 and functional[0].params == {"p": 0.25}        # F.dropout(x, self.drop_rate)
    want = m(x).detach().numpy()
    for t in (1, 3):
        got = tilefuse.compile(net, threads=t).run(x.numpy())
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert not _dropouts(tilefuse.compile(net).network)


class _Fixed(nn.Module):
    def __init__(self, mask):
        super().__init__()
        self.register_buffer("mask", torch.from_numpy(np.asarray(mask, np.float64)))

    def forward(self, x):
        return x * self.mask


def _logical(a):
    return a.transpose(1, 0, 2, 3) if a.ndim == 4 else a


@pytest.mark.parametrize("schedule", ["fused", "unfused"])
def test_a_step_equals_pytorch_with_the_trainers_masks(schedule):
    torch.manual_seed(1)
    m, x = Net(), _x(1)
    labels = torch.tensor([0, 3, 7, 9, 2, 5])
    tr = Trainer(tilefuse.from_torch(m, x), SGD(lr=0.1), schedule=schedule, seed=3)
    loss, grads = tr.forward_backward(x.numpy(), labels.numpy())
    ops = _dropouts(tr.net)
    masks = {k: _logical(np.asarray(tr.schedule.saved[k])) for k in ops}
    for k, (mode, p) in MODES.items():
        mk, shape = masks[k], ops[k].inputs[0].shape
        assert set(np.unique(mk)) <= {0.0, np.float32(1 / (1 - p))}, k
        want = {"element": shape, "channel": shape[:2] + (1,) * (len(shape) - 2),
                "sample": shape[:1] + (1,) * (len(shape) - 1), "batch": (1,) * len(shape)}[mode]
        assert mk.shape == want, (k, mk.shape)
    # PyTorch with those masks in place of its dropouts (the functional one: a module wrapping F.dropout's place)
    m64 = copy.deepcopy(m).double().train()
    for k in MODES:
        setattr(m64, k, _Fixed(masks[k]))
    functional = next(masks[k] for k in ops if k not in MODES)
    m64.drop_rate = 0.0
    m64.off = _Fixed(functional)
    ref_loss = F.cross_entropy(m64(x.double()), labels)
    ref_loss.backward()
    assert loss == pytest.approx(ref_loss.item(), rel=1e-4)
    ref = {k: p.grad.numpy() for k, p in m64.named_parameters()}
    gmax = max(float(np.abs(g).max()) for g in ref.values())
    for k, g in ref.items():
        assert np.abs(grads[k] - g).max() <= 1e-3 * np.abs(g).max() + 1e-4 * gmax, k


def test_masks_are_drawn_anew_each_step_and_drop_about_p():
    torch.manual_seed(2)

    class Wide(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 64, 3, padding=1)
            self.drop = nn.Dropout(0.3)
            self.fc = nn.Linear(64, 10)

        def forward(self, x):
            return self.fc(self.drop(F.relu(self.conv(x))).mean((2, 3)))
    x = _x(3, 8)
    tr = Trainer(tilefuse.from_torch(Wide(), x), SGD(lr=0.01))
    seen = []
    for _ in range(2):
        tr.step(x.numpy(), np.arange(8) % 10)
        seen.append(np.asarray(tr.schedule.saved["drop"]).copy())
    assert not np.array_equal(seen[0], seen[1])
    frac = float((seen[0] == 0).mean())             # 32768 draws: p +- 5 sigma (sigma = 0.0025)
    assert abs(frac - 0.3) < 0.0125, frac


@pytest.mark.parametrize("module,what", [
    (nn.AlphaDropout(0.1), r"alpha_dropout\(p=0.1\).*alpha dropout"),
    (DropPath(0.1, scale_by_keep=False), r"DropPath\(scale_by_keep=False\)"),
    (nn.RReLU(), r"RReLU\(lower=0.125, upper=0.33+\d*\).*random slope"),
    (nn.InstanceNorm2d(4, track_running_stats=True), r"inner: instance norm with running statistics.*each sample's")])
def test_a_training_forward_the_trainer_does_not_have_is_refused_naming_it(module, what):
    """Modules whose training forward the eval-mode export does not show: inference as PyTorch's eval, and the
    Trainer refuses the network naming them (it would train the eval graph's function)."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 1)
            self.inner = module
            self.fc = nn.Linear(4, 10)

        def forward(self, x):
            return self.fc(self.inner(self.conv(x)).mean((2, 3)))
    m, x = M().eval(), _x()
    net = tilefuse.from_torch(m, x)
    np.testing.assert_allclose(tilefuse.compile(net).run(x.numpy()), m(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(UnsupportedOpError, match=what):
        Trainer(net, SGD(lr=0.1))
