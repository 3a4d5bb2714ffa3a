"""Training through expressions of parameters: weights that forward() computes from nn.Parameters before a conv or a
linear reads them. timm's StdConv2d (BiT: weight standardization through F.batch_norm with batch statistics),
ScaledStdConv2d (NFNet: the same with a learned per-channel gain), torch.nn.utils.parametrizations.weight_norm
(w = g * v / ||v||, on Conv2d, Conv1d and Linear), StyleGAN's equalized learning rate (EqualConv2d / EqualLinear:
`self.weight * self.scale`, `self.bias * self.lr_mul`), and BatchNorm2d(track_running_stats=False), which
normalizes with the batch's statistics in eval mode too.

from_torch folds such an expression into one constant by default (the inference network: the conv keeps its fast
weight-slot path); the Trainer refuses that constant by name, since training it as a free tensor would train
another network. With `from_torch(..., fold_parameters=False)` the expression stays in the network as ops on the
parameter (a constant the Trainer trains) and the conv's weight is computed (the Trainer runs its conv kernels on
it; compile folds the expression back into a constant weight): inference against PyTorch at 1 and 3 threads,
one training step (fused and unfused schedules) against PyTorch in float64 with every parameter's gradient, and one SGD step whose state dict equals PyTorch's and loads back.
Spectral norm runs for inference (folded or kept) and the Trainer refuses it naming the module: its training
forward updates u / v by a power iteration that the eval-mode export does not hold.
Tolerances: inference fp32 max |tilefuse - torch| <= 1e-4 max |torch| (onnx_export.assert_close_to_max);
gradients as test_training_modern._step_against_torch.
"""
from __future__ import annotations

import ast
import inspect

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx_export import assert_close_to_max, check_from_torch
from test_computed_weights import StdConv2d
from test_training_modern import _step_against_torch
from torch.nn.utils import parametrizations

import tilefuse
from tilefuse.errors import UnsupportedOpError
from tilefuse.training import SGD, Trainer
from tilefuse.training import schedule as sched


class ScaledStdConv2d(nn.Conv2d):
    """timm's ScaledStdConv2d (NFNet): weight standardization with a learned gain, the fan-in scale a float."""

    def __init__(self, in_channels, out_channels, kernel_size, gamma=1.0, eps=1e-6, gain_init=1.0, **kwargs):
        super().__init__(in_channels, out_channels, kernel_size, **kwargs)
        self.gain = nn.Parameter(torch.full((self.out_channels, 1, 1, 1), gain_init))
        self.scale = gamma * self.weight[0].numel() ** -0.5
        self.eps = eps

    def forward(self, x):
        weight = F.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None,
                              weight=(self.gain * self.scale).view(-1), training=True, momentum=0.,
                              eps=self.eps).reshape_as(self.weight)
        return F.conv2d(x, weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class EqualConv2d(nn.Module):
    """StyleGAN2 (rosinality): the weight stored unit-variance, scaled by 1/sqrt(fan-in) in every forward."""

    def __init__(self, cin, cout, k, padding=0, lr_mul=1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cout, cin, k, k) / lr_mul)
        self.bias = nn.Parameter(torch.randn(cout) * 0.1)
        self.scale = lr_mul / (cin * k * k) ** 0.5
        self.lr_mul, self.padding = lr_mul, padding

    def forward(self, x):
        return F.conv2d(x, self.weight * self.scale, bias=self.bias * self.lr_mul, padding=self.padding)


class EqualLinear(nn.Module):
    def __init__(self, cin, cout, lr_mul=0.5):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cout, cin) / lr_mul)
        self.bias = nn.Parameter(torch.randn(cout) * 0.1)
        self.scale, self.lr_mul = lr_mul / cin ** 0.5, lr_mul

    def forward(self, x):
        return F.linear(x, self.weight * self.scale, bias=self.bias * self.lr_mul)


class NFNetBlock(nn.Module):
    """An NF-ResNet block: ScaledStdConv2d, GELU with the gamma scale, alpha / beta scaled residual."""

    def __init__(self, c=6):
        super().__init__()
        self.stem = ScaledStdConv2d(3, c, 3, padding=1, gain_init=1.2)
        self.conv1 = ScaledStdConv2d(c, c, 3, padding=1, groups=2)
        self.conv2 = ScaledStdConv2d(c, c, 1, gain_init=0.8)
        self.head = nn.Linear(c, 10)

    def forward(self, x):
        x = self.stem(x)
        out = self.conv2(F.gelu(self.conv1(F.gelu(x) * 1.7015 / 1.0)) * 1.7015)
        return self.head((x + 0.2 * out).mean((2, 3)))


class BiTNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = StdConv2d(3, 8, 3, padding=1, stride=2, bias=False)
        self.gn = nn.GroupNorm(2, 8)
        self.conv2 = StdConv2d(8, 10, 1)

    def forward(self, x):
        return self.conv2(F.relu(self.gn(self.conv1(x)))).mean((2, 3))


class WeightNormNet(nn.Module):
    """parametrizations.weight_norm on a Conv2d (dim 0), a Conv1d over the flattened rows (HiFi-GAN's style) and a
    Linear with dim=None (one norm for the whole weight)."""

    def __init__(self):
        super().__init__()
        self.conv = parametrizations.weight_norm(nn.Conv2d(3, 8, 3, padding=1))
        self.conv1d = parametrizations.weight_norm(nn.Conv1d(8, 6, 5, padding=2))
        self.fc = parametrizations.weight_norm(nn.Linear(6, 10), dim=None)

    def forward(self, x):
        x = F.leaky_relu(self.conv(x), 0.1)
        n, c, h, w = x.shape
        x = F.leaky_relu(self.conv1d(x.view(n, c, h * w)), 0.1)      # (N, C, H*W)
        return self.fc(x.mean(2))


class StyleNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = EqualConv2d(3, 8, 3, padding=1)
        self.conv2 = EqualConv2d(8, 8, 1, lr_mul=0.1)
        self.fc = EqualLinear(8, 10)

    def forward(self, x):
        return self.fc(F.leaky_relu(self.conv2(F.leaky_relu(self.conv1(x), 0.2)), 0.2).mean((2, 3)))


class BatchStatsNet(nn.Module):
    """BatchNorm2d(track_running_stats=False): the batch's statistics in eval mode too (no running buffers)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8, track_running_stats=False)
        self.bn_plain = nn.BatchNorm2d(8, affine=False, track_running_stats=False)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(self.bn_plain(F.relu(self.bn(self.conv(x)))).mean((2, 3)))


MODELS = {"nfnet": NFNetBlock, "bit": BiTNet, "weight_norm": WeightNormNet, "equalized_lr": StyleNet,
          "batch_stats": BatchStatsNet}
# parameters that only an expression reads (their gradient flows back through it)
EXPRESSION_PARAMS = {"nfnet": ["stem.gain", "stem.weight", "conv1.gain", "conv2.weight"],
                     "bit": ["conv1.weight", "conv2.weight"],
                     "weight_norm": ["conv.parametrizations.weight.original0",
                                     "conv.parametrizations.weight.original1",
                                     "conv1d.parametrizations.weight.original1",
                                     "fc.parametrizations.weight.original0"],
                     "equalized_lr": ["conv1.weight", "conv2.bias", "fc.weight", "fc.bias"],
                     "batch_stats": ["bn.weight", "bn.bias"]}


def _build(name, seed=0):
    torch.manual_seed(seed)
    m = MODELS[name]()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in m.parameters():         # gains and norms away from their initial 1 / 0
            if p.ndim <= 1 or p.shape[1:] == (1, 1, 1):
                p.add_(0.2 * torch.randn(p.shape, generator=g))
    return m


def _x(seed=0, n=4, size=8):
    return np.random.default_rng(seed).standard_normal((n, 3, size, size)).astype(np.float32)


@pytest.mark.parametrize("fold", [True, False], ids=["folded", "kept"])
@pytest.mark.parametrize("name", list(MODELS))
def test_inference_matches_pytorch(name, fold):
    check_from_torch(lambda: _build(name), _x(), fold_parameters=fold)


@pytest.mark.parametrize("name", ["nfnet", "bit", "weight_norm", "equalized_lr"])
def test_compile_folds_the_kept_expressions_into_constant_weights(name):
    """For inference, compile folds the expressions of parameters (`passes.fold_constants`): every conv of the kept
    network gets a constant weight (the folded import's convs, not the im2col lowering), and the two programs agree
    within float32 rounding."""
    m, x = _build(name), _x()
    kept = tilefuse.compile(tilefuse.from_torch(m, torch.from_numpy(x), fold_parameters=False), threads=2)
    folded = tilefuse.compile(tilefuse.from_torch(m, torch.from_numpy(x)), threads=2)
    assert kept.pass_log[0].startswith("fold_constants: ")
    convs = [[op for op in c.network.ops if op.op == "conv2d"] for c in (kept, folded)]
    assert len(convs[0]) == len(convs[1]) > 0 and all(op.inputs[1].is_constant for op in convs[0])
    assert_close_to_max(kept.run(x), folded.run(x), what="kept vs folded")


@pytest.mark.parametrize("schedule", ["fused", "unfused"])
@pytest.mark.parametrize("name", list(MODELS))
def test_one_training_step_matches_pytorch(name, schedule):
    module = _build(name, 2)
    tr, grads = _step_against_torch(module, torch.from_numpy(_x(3)), torch.tensor([0, 3, 7, 9]), schedule=schedule,
                                    fold_parameters=False)
    assert set(EXPRESSION_PARAMS[name]) <= set(tr.params)
    assert all(np.abs(grads[k]).max() > 0 for k in EXPRESSION_PARAMS[name])


@pytest.mark.parametrize("name", ["nfnet", "weight_norm"])
def test_a_step_updates_the_parameters_as_pytorch_and_loads_back(name):
    module = _build(name, 4)
    x, labels = torch.from_numpy(_x(5)), torch.tensor([1, 2, 3, 4])
    tr = Trainer(tilefuse.from_torch(module, x, fold_parameters=False), SGD(lr=0.1, momentum=0.9))
    tr.step(x.numpy(), labels.numpy())
    module.train()
    opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    F.cross_entropy(module(x), labels).backward()
    opt.step()
    sd, ref = tr.to_torch_state_dict(), module.state_dict()
    for k in EXPRESSION_PARAMS[name]:
        np.testing.assert_allclose(sd[k].numpy(), ref[k].numpy(), rtol=1e-4, atol=1e-6)
    module.load_state_dict(sd, strict=True)


@pytest.mark.parametrize("name", ["nfnet", "weight_norm", "equalized_lr"])
def test_the_folded_network_refuses_training_and_names_the_option(name):
    net = tilefuse.from_torch(_build(name), torch.from_numpy(_x()))
    with pytest.raises(UnsupportedOpError, match=r"derived from parameter .*fold_parameters=False"):
        Trainer(net, SGD(lr=0.1))


class NormOfParameter(nn.Module):
    """A parameter as the input of a layer norm, whose backward in the trainer gives its input 0 no gradient."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 3, 3, 3))
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(F.conv2d(x, F.layer_norm(self.w, (3, 3, 3)), padding=1).mean((2, 3)))


def test_a_parameter_read_without_a_gradient_is_refused_naming_the_op():
    m = NormOfParameter()
    x = torch.from_numpy(_x())
    net = tilefuse.from_torch(m, x, fold_parameters=False)
    np.testing.assert_allclose(tilefuse.compile(net).run(x.numpy()), m(x).detach().numpy(), rtol=1e-4, atol=1e-5)
    with pytest.raises(UnsupportedOpError, match=r"parameter 'w' \(8, 3, 3, 3\) is input 0 of a layer_norm"):
        Trainer(net, SGD(lr=0.1))


def test_the_input0_gradient_ops_are_those_whose_backward_gives_it():
    """_INPUT0_GRAD (ops whose parameter input 0 the Trainer trains) is the set of ops whose backward runs through
    _bwd_simple, less those with a weight slot (their input 0 is the activation)."""
    tree = ast.parse(inspect.getsource(sched))          # (the source, not the live class: a test may patch it)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TrainingSchedule")
    simple = {f.name[5:] for f in cls.body if isinstance(f, ast.FunctionDef) and f.name.startswith("_bwd_") and
              "_bwd_simple(" in ast.unparse(f)}
    simple |= {t.id[5:] for a in cls.body if isinstance(a, ast.Assign) and isinstance(a.value, ast.Name) and
               a.value.id[5:] in simple for t in a.targets}          # _bwd_mean = _bwd_sum = _bwd_reduce
    with_weights = {"conv_transpose2d", "group_norm", "linear", "prelu", "dropout", "reduce", "simple"}
    assert sched._INPUT0_GRAD == simple - with_weights


class SpectralNet(nn.Module):
    def __init__(self, old_style=False):
        super().__init__()
        sn = nn.utils.spectral_norm if old_style else parametrizations.spectral_norm
        self.conv = sn(nn.Conv2d(3, 8, 3, padding=1))
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(F.leaky_relu(self.conv(x), 0.2).mean((2, 3)))


@pytest.mark.parametrize("old_style", [False, True], ids=["parametrization", "hook"])
def test_spectral_norm_runs_and_its_training_is_refused_naming_the_module(old_style):
    """Spectral norm's eval forward divides by sigma from its stored u / v (which the import reads, folded or
    kept); its training forward first runs a power iteration that updates them, which an eval-mode export does not
    hold: a step would train another function than PyTorch's (its gradient was 3x off the float32 tolerance)."""
    torch.manual_seed(0)
    m = SpectralNet(old_style)
    x = torch.from_numpy(_x())
    m.train()(x)                                     # u / v away from their initial draw
    m.eval()
    for fold in (True, False):
        net = tilefuse.from_torch(m, x, fold_parameters=fold)
        np.testing.assert_allclose(tilefuse.compile(net).run(x.numpy()), m(x).detach().numpy(), rtol=1e-4,
                                   atol=1e-5)
        with pytest.raises(UnsupportedOpError, match=r"^conv.*spectral norm.*power iteration"):
            Trainer(net, SGD(lr=0.1))
