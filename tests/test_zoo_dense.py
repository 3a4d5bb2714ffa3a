"""Detection, dense-prediction and video families (tests/zoo_dense.py: YOLOv8 with its Detect head's decoding,
CenterNet with the heatmap NMS, FCOS, SSDLite with its prior-box decoding, PSPNet, DANet, OCRNet, TSM, PointRend),
written as their reference code (ultralytics, xingyizhou CenterNet, FCOS / mmdet, qfgaohao pytorch-ssd, hszhao
semseg, junfu1115 DANet, HRNet-OCR, mit-han-lab TSM, detectron2 PointRend) writes their inference forward passes,
at reduced widths and depths, norms / scales / attention gammas randomized (seeded):

  from_torch    tilefuse.from_torch -> compile (1 and 3 threads) -> run, against PyTorch
  export        both ONNX exporters -> from_onnx -> compile -> run, against PyTorch and ONNX Runtime (PSPNet by the
                dynamo exporter only: the TorchScript exporter refuses adaptive_avg_pool2d to 6 of a 9x9 map)
  training      one Trainer step against PyTorch for the families that output logits (PSPNet, OCRNet, DANet:
                per-pixel targets; TSM: per clip)

PointRend is a strict xfail: it picks 64 of 1,024 uncertain points by topk and reads the indices (grid_sample at
them, scatter_ back); tilefuse sorts up to 64 values and computes no indices.
Tolerance: fp32, max |tilefuse - reference| <= 1e-4 * max |reference| (onnx_export.assert_close_to_max).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx_export import EXPORTERS, check_export, check_from_torch
from test_training_modern import _step_against_torch
from tilefuse.errors import UnsupportedOpError

import zoo_dense as zd

FAMILIES = [n for n in zd.FAMILIES if n != "pointrend"]
NOT_TORCHSCRIPT = {"pspnet"}            # the TorchScript exporter refuses a non-divisor adaptive pool
# (DANet at seed 5: one input of conv51's ReLU is 7.4e-6 in float64 (1.1e-6 of the tensor's largest), while float32
# PyTorch's error on that tensor reaches 2.5e-5 (train-mode BN after the position attention); tilefuse's float32
# puts it at -4.7e-6, on the other side of the kink, which moves the stem's gradient by 9.8e-4 of 0.105: within
# _kink_allowance, whose rounding distance follows PyTorch's own float32 error on each activation input)
TRAIN = ["pspnet", "ocrnet", "tsm", "danet"]
POINTREND = pytest.param("pointrend", marks=pytest.mark.xfail(
    reason="topk indices of 1,024 point uncertainties (grid_sample / scatter_ at them)", raises=UnsupportedOpError,
    strict=True))


def _x(name, seed=0):
    return np.random.default_rng(seed).standard_normal(zd.FAMILIES[name][1]).astype(np.float32)


@pytest.mark.parametrize("name", FAMILIES + [POINTREND])
def test_from_torch_matches_pytorch(name):
    check_from_torch(lambda: zd.build(name, seed=3), _x(name))


@pytest.mark.parametrize("exporter,name", [(e, n) for n in FAMILIES for e in EXPORTERS
                                           if not (e == "torchscript" and n in NOT_TORCHSCRIPT)])
def test_onnx_exports_match_pytorch_and_onnxruntime(name, exporter):
    check_export(lambda: zd.build(name, seed=4), _x(name, 1), exporter)


@pytest.mark.parametrize("name", TRAIN)
def test_one_training_step_matches_pytorch(name):
    torch.manual_seed(5)
    module = zd.build(name, seed=5, train=True)
    shape = (4,) + zd.FAMILIES[name][1][1:] if name != "tsm" else (8,) + zd.FAMILIES[name][1][1:]
    x = torch.randn(shape)
    with torch.no_grad():
        out = module(x)
    g = torch.Generator().manual_seed(6)
    target = torch.randint(0, out.shape[1], (out.shape[0],) + tuple(out.shape[2:]), generator=g)
    _step_against_torch(module, x, target)
