"""Image restoration, generation, segmentation and classic CNN families (tests/zoo_restoration.py: NAFNet,
Restormer, the CycleGAN ResNet generator and PatchGAN discriminator, ENet, U^2-Net (u2netp), Inception v3, VoVNetV2,
FasterNet in both Partial_conv3 forwards), written as their reference code writes their forward passes, at reduced
widths and depths, norms / layer scales / PReLU slopes / temperatures randomized (seeded):

  from_torch    tilefuse.from_torch -> compile (1 and 3 threads) -> run, against PyTorch
  export        torch.onnx.export by both exporters (TorchScript, dynamo) -> from_onnx -> compile -> run, against
                PyTorch and ONNX Runtime. ENet by the dynamo exporter only: PyTorch's TorchScript exporter cannot
                export nn.MaxUnpool2d (F.max_unpool2d's output-size check fails under tracing, before tilefuse runs)
  training      one forward / backward through from_torch + Trainer against PyTorch in float64, every parameter
                gradient (test_training_modern._step_against_torch); image-to-image and segmentation outputs
                (N, C, H, W) take a per-pixel target over their channels

Tolerance: fp32, max |tilefuse - reference| <= 1e-4 * max |reference| (onnx_export.assert_close_to_max).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx_export import EXPORTERS, check_export, check_from_torch
from test_training_modern import _step_against_torch

import zoo_restoration as zr

FAMILIES = list(zr.FAMILIES)
NOT_TORCHSCRIPT = {"enet"}          # PyTorch's TorchScript exporter fails on nn.MaxUnpool2d itself
# one training step each; PatchGAN and u2netp end in one channel (a one-class cross-entropy has no gradient)
TRAIN = ["nafnet", "restormer", "cyclegan_resnet", "enet", "inception_v3", "vovnet", "fasternet"]


def _x(name, seed=0):
    return np.random.default_rng(seed).standard_normal(zr.FAMILIES[name][1]).astype(np.float32)


@pytest.mark.parametrize("name", FAMILIES)
def test_from_torch_matches_pytorch(name):
    check_from_torch(lambda: zr.build(name, seed=3), _x(name))


@pytest.mark.parametrize("exporter,name", [(e, n) for n in FAMILIES for e in EXPORTERS
                                           if not (e == "torchscript" and n in NOT_TORCHSCRIPT)])
def test_onnx_exports_match_pytorch_and_onnxruntime(name, exporter):
    check_export(lambda: zr.build(name, seed=4), _x(name, 1), exporter)


# Inception v3's input seed: at seed 5 windows of its F.max_pool2d(x, 3, 2) hold top-two values 7.7e-6 and 8.8e-6
# apart at ~5.5 (about 17 float32 ulps; measured in float64), which float32 convs summed in another order than
# PyTorch's can swap; the gradient then flows through the other position and every parameter before that pool moves
# 2-9% while the loss and the later layers' gradients agree to 5e-5. _kink_allowance covers activation kinks, not
# max-pool ties: another input.
SEEDS = {"inception_v3": 7}


@pytest.mark.parametrize("name", TRAIN)
def test_one_training_step_matches_pytorch(name):
    torch.manual_seed(SEEDS.get(name, 5))
    module = zr.build(name, seed=5, train=True)
    shape = (4,) + zr.FAMILIES[name][1][1:]
    x = torch.randn(shape)
    with torch.no_grad():
        out = module(x)
    if out.dim() == 4:                     # per-pixel classes over the output's channels
        target = torch.randint(0, out.shape[1], (4,) + tuple(out.shape[2:]), generator=torch.Generator().manual_seed(6))
    else:
        target = torch.tensor([0, 3, 7, 9])
    _step_against_torch(module, x, target)
