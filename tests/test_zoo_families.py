"""Eleven more real-world CNN families (tests/zoo_families.py: DenseNet, SqueezeNet 1.1, Res2Net, SKNet, RepVGG,
ConvMixer, Xception, DLA, HRNet, EfficientNetV2, GhostNetV2), written as torchvision / timm / the papers' code
writes their forward passes, at reduced widths and depths, BatchNorm statistics and affines randomized (seeded):

  from_torch    tilefuse.from_torch -> compile (1 and 3 threads) -> run, against PyTorch
  export        torch.onnx.export by both exporters (TorchScript, dynamo) -> from_onnx -> compile -> run, against
                PyTorch and ONNX Runtime
  training      one forward / backward through from_torch + Trainer against PyTorch in float64, every parameter
                gradient (test_training_modern._step_against_torch; the random parts of a PyTorch training step,
                stochastic depth and functional dropout, set to 0 by zoo_families.build(train=True))
  idioms        the constructs that make each family what it is reach the IR as written (ceil-mode pools, the
                split / cat of Res2Net, the softmax over SKNet's stacked branch axis, HRNet's and GhostNetV2's
                nearest resizes, ...), so the checks above test them

Tolerance: fp32, max |tilefuse - reference| <= 1e-4 * max |reference| (onnx_export.assert_close_to_max).
Sizes: batch 2 (4 for training), 32x32 to 64x64 inputs, odd sizes where a family has ceil-mode pools or a
non-integer resize; the file runs in about a minute and a half on 2 cores with a warm kernel cache.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx_export import EXPORTERS, check_export, check_from_torch
from test_training_modern import _step_against_torch

import tilefuse
import zoo_families as zf

FAMILIES = list(zf.FAMILIES)


def _x(name, seed=0):
    return np.random.default_rng(seed).standard_normal(zf.FAMILIES[name][1]).astype(np.float32)


@pytest.mark.parametrize("name", FAMILIES)
def test_from_torch_matches_pytorch(name):
    check_from_torch(lambda: zf.build(name, seed=3), _x(name))


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", FAMILIES)
def test_onnx_exports_match_pytorch_and_onnxruntime(name, exporter):
    check_export(lambda: zf.build(name, seed=4), _x(name, 1), exporter)


@pytest.mark.parametrize("name", FAMILIES)
def test_one_training_step_matches_pytorch(name):
    torch.manual_seed(5)
    module = zf.build(name, seed=5, train=True)
    shape = (4,) + zf.FAMILIES[name][1][1:]
    _step_against_torch(module, torch.randn(shape), torch.tensor([0, 3, 7, 9]))


def _pools(net, kind):
    return [o for o in net.ops if o.op == kind]


IDIOMS = {
    # torch.cat(features, 1) in every dense layer and block end; AvgPool2d(2) transitions
    "densenet": lambda net: (sum(o.op == "concat" for o in net.ops) == 7
                             and [o.params["kernel_size"] for o in _pools(net, "avg_pool")] == [(2, 2)] * 2),
    # MaxPool2d(3, 2, ceil_mode=True) rounding up at every pool (24 -> 12 -> 6 -> 3); Fire's cat
    "squeezenet1_1": lambda net: ([(o.params["ceil_mode"], o.outputs[0].shape[-1]) for o in _pools(net, "max_pool")]
                                  == [(True, 12), (True, 6), (True, 3)]
                                  and sum(o.op == "concat" for o in net.ops) == 8),
    # torch.split into scale groups (slices), cat, the 'stage' AvgPool2d(3, stride, 1) and the v1b downsample
    # AvgPool2d(2, ceil_mode=True, count_include_pad=False) over an odd map (9 -> 5)
    "res2net": lambda net: ({"slice", "concat"} <= {o.op for o in net.ops}
                            and any(o.params["ceil_mode"] and not o.params["count_include_pad"]
                                    and o.inputs[0].shape[-1] == 9 and o.outputs[0].shape[-1] == 5
                                    for o in _pools(net, "avg_pool"))),
    # softmax over the stacked branch axis of (B, M, C, 1, 1); the dilated 3x3 path
    "sknet": lambda net: (all(o.params["axis"] == 1 and len(o.inputs[0].shape) == 5 for o in _pools(net, "softmax"))
                          and len(_pools(net, "softmax")) == 2
                          and any(o.params["dilation"] == (2, 2) for o in _pools(net, "conv2d"))),
    # three branches summed (an identity BN where shapes allow), grouped convs in the g2 layer
    "repvgg": lambda net: (sum(o.op == "batch_norm" for o in net.ops) == 15
                           and any(o.params["groups"] == 2 for o in _pools(net, "conv2d"))),
    # padding="same" at k=9, depthwise
    "convmixer": lambda net: sum(o.params["padding"] == (4, 4, 4, 4) and o.params["groups"] == 32
                                 for o in _pools(net, "conv2d")) == 2,
    # MaxPool2d(3, 2, 1) in every strided block, 29 -> 15 (the unpadded stem's odd map)
    "xception": lambda net: [o.outputs[0].shape[-1] for o in _pools(net, "max_pool")] == [15, 8, 4, 2],
    # DlaRoot's cat of the children (three roots)
    "dla": lambda net: sum(o.op == "concat" for o in net.ops) == 3,
    # nn.Upsample(scale_factor=2 ** (j - i), mode="nearest") in the fuse layers; avg_pool2d over y.size()[2:]
    "hrnet": lambda net: ([o.params["scales"] for o in _pools(net, "resize")] == [(2.0, 2.0), (2.0, 2.0), (4.0, 4.0),
                                                                                  (2.0, 2.0)]
                          and all(o.params["mode"] == "nearest" for o in _pools(net, "resize"))),
    # x.mean((2, 3), keepdim=True) squeeze-excitations, three of them (one in a FusedMBConv)
    "efficientnet_v2": lambda net: sum(o.op == "mean" for o in net.ops) == 3,
    # DFC attention: F.avg_pool2d(x, 2, 2) 11 -> 5, (1, 5) and (5, 1) depthwise, nearest back to 11x11
    "ghostnet_v2": lambda net: ([(o.inputs[0].shape[-1], o.outputs[0].shape[-1]) for o in _pools(net, "resize")]
                                == [(5, 11), (5, 11)]
                                and any(o.inputs[1].shape[-2:] == (1, 5) for o in _pools(net, "conv2d"))
                                and any(o.inputs[1].shape[-2:] == (5, 1) for o in _pools(net, "conv2d"))),
}


@pytest.mark.parametrize("name", FAMILIES)
def test_the_family_idioms_reach_the_ir(name):
    net = tilefuse.from_torch(zf.build(name), torch.from_numpy(_x(name)))
    assert IDIOMS[name](net), sorted({o.op for o in net.ops})
