"""Six more vision families (tests/zoo_vision.py: ResNeSt, SegFormer, MobileViT v1, ConvNeXt V2, EfficientViT,
MaxViT), written as their reference code (zhanghang1989/ResNeSt, NVlabs SegFormer, apple/ml-cvnets,
facebookresearch/ConvNeXt-V2, mit-han-lab/efficientvit, timm maxxvit) writes their forward passes, at reduced
widths and depths, norms / GRNs / layer scales / position-bias tables randomized (seeded):

  from_torch    tilefuse.from_torch -> compile (1 and 3 threads) -> run, against PyTorch
  export        torch.onnx.export by both exporters (TorchScript, dynamo) -> from_onnx -> compile -> run, against
                PyTorch and ONNX Runtime; ResNeSt and MaxViT also by the dynamo exporter without its optimizer
                (torch.split / chunk as SplitToSequence + SequenceAt)
  training      one forward / backward through from_torch + Trainer against PyTorch in float64, every parameter
                gradient (test_training_modern._step_against_torch; drop path and dropout set to 0)

Tolerance: fp32, max |tilefuse - reference| <= 1e-4 * max |reference| (onnx_export.assert_close_to_max).
Sizes: batch 2 (4 for training), 40x40 (ResNeSt: a ceil-mode average pool with a partial window) or 64x64.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx_export import EXPORTERS, check_export, check_from_torch
from test_training_modern import _step_against_torch

import zoo_vision as zv

FAMILIES = list(zv.FAMILIES)


def _x(name, seed=0):
    return np.random.default_rng(seed).standard_normal(zv.FAMILIES[name][1]).astype(np.float32)


@pytest.mark.parametrize("name", FAMILIES)
def test_from_torch_matches_pytorch(name):
    check_from_torch(lambda: zv.build(name, seed=3), _x(name))


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", FAMILIES)
def test_onnx_exports_match_pytorch_and_onnxruntime(name, exporter):
    check_export(lambda: zv.build(name, seed=4), _x(name, 1), exporter)


@pytest.mark.parametrize("name", ["resnest", "maxvit"])
def test_unoptimized_dynamo_export_splits_to_a_sequence(name):
    check_export(lambda: zv.build(name, seed=4), _x(name, 1), "dynamo_unoptimized")


@pytest.mark.parametrize("name", FAMILIES)
def test_one_training_step_matches_pytorch(name):
    torch.manual_seed(5)
    module = zv.build(name, seed=5, train=True)
    shape = (4,) + zv.FAMILIES[name][1][1:]
    # SegFormer's logits are (N, classes, H / 4, W / 4): a per-pixel target
    target = torch.randint(0, 10, (4, shape[2] // 4, shape[3] // 4)) if name == "segformer" else \
        torch.tensor([0, 3, 7, 9])
    _step_against_torch(module, torch.randn(shape), target)
