"""MobileNetV2 and MobileNetV3-Large as torchvision builds them (torchvision.models.mobilenetv2/v3).

MobileNetV2: features.0 conv3x3 s2 (32) + BN + ReLU6; features.1..17 inverted residuals
[expand 1x1 + BN + ReLU6] -> depthwise 3x3 + BN + ReLU6 -> project 1x1 + BN (linear bottleneck),
a residual add when stride 1 and channels equal; features.18 conv1x1 (1280) + BN + ReLU6;
global average pool, flatten, classifier.1 (dropout 0.2 first).

MobileNetV3-Large: features.0 conv3x3 s2 (16) + BN + Hardswish; features.1..15 inverted
residuals ("block": [expand] -> depthwise kxk -> [squeeze-excitation with Hardsigmoid gate] ->
project), ReLU or Hardswish per the paper's table; features.16 conv1x1 (960) + BN + Hardswish;
avgpool; classifier.0 Linear(960, 1280) + Hardswish, classifier.3 Linear(1280, classes).
BN eps 1e-3 (torchvision's partial(BatchNorm2d, eps=0.001)).
"""
from __future__ import annotations

import numpy as np

from ..ir import Network
from ._blocks import act, conv_norm_act, make_divisible, squeeze_excitation
from ._params import ParamFactory

_LAST_GAMMA = (0.2, 0.6)   # the BN closing a residual branch (see _params.py)

# MobileNetV2: expansion t, channels c, repeats n, first stride s
_V2 = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


def mobilenet_v2(seed: int = 0, batch: int = 1, image_size: int = 224, num_classes: int = 1000,
                 dtype=np.float32) -> Network:
    net = Network("mobilenet_v2")
    pf = ParamFactory(net, seed, dtype)
    x = net.input("x", (batch, 3, image_size, image_size), dtype)
    x = conv_norm_act(net, pf, x, "features.0", 32, 3, stride=2, activation="relu6")
    i = 1
    for t, c, n, s in _V2:
        for j in range(n):
            stride = s if j == 0 else 1
            p = f"features.{i}"
            inp, hidden = x.shape[1], x.shape[1] * t
            y, k = x, 0
            if t != 1:
                y = conv_norm_act(net, pf, y, f"{p}.conv.{k}", hidden, 1, activation="relu6")
                k += 1
            y = conv_norm_act(net, pf, y, f"{p}.conv.{k}", hidden, 3, stride=stride, groups=hidden,
                              activation="relu6")
            w, _ = pf.conv(f"{p}.conv.{k + 1}", c, hidden, 1, gain=1.0)
            y = net.conv2d(y, w, None, name=f"{p}.conv.{k + 1}")
            res = stride == 1 and inp == c
            y = net.batch_norm(y, *pf.bn(f"{p}.conv.{k + 2}", c, _LAST_GAMMA if res else (0.5, 1.5)),
                               name=f"{p}.conv.{k + 2}")
            x = net.add(x, y, name=f"{p}.add") if res else y
            i += 1
    x = conv_norm_act(net, pf, x, f"features.{i}", 1280, 1, activation="relu6")
    x = net.global_avg_pool(x, name="adaptive_avg_pool2d")
    x = net.flatten(x, 1, name="flatten")
    x = net.linear(x, *pf.linear("classifier.1", num_classes, 1280, gain=1.0), name="classifier.1")
    net.output(x)
    return net


# MobileNetV3-Large: input, kernel, expanded, out, use_se, activation, stride
_V3L = [(16, 3, 16, 16, False, "relu", 1), (16, 3, 64, 24, False, "relu", 2), (24, 3, 72, 24, False, "relu", 1),
        (24, 5, 72, 40, True, "relu", 2), (40, 5, 120, 40, True, "relu", 1), (40, 5, 120, 40, True, "relu", 1),
        (40, 3, 240, 80, False, "hardswish", 2), (80, 3, 200, 80, False, "hardswish", 1),
        (80, 3, 184, 80, False, "hardswish", 1), (80, 3, 184, 80, False, "hardswish", 1),
        (80, 3, 480, 112, True, "hardswish", 1), (112, 3, 672, 112, True, "hardswish", 1),
        (112, 5, 672, 160, True, "hardswish", 2), (160, 5, 960, 160, True, "hardswish", 1),
        (160, 5, 960, 160, True, "hardswish", 1)]


def mobilenet_v3_large(seed: int = 0, batch: int = 1, image_size: int = 224, num_classes: int = 1000,
                       dtype=np.float32) -> Network:
    net = Network("mobilenet_v3_large")
    pf = ParamFactory(net, seed, dtype)
    eps = 1e-3
    x = net.input("x", (batch, 3, image_size, image_size), dtype)
    x = conv_norm_act(net, pf, x, "features.0", 16, 3, stride=2, activation="hardswish", eps=eps)
    for i, (inp, k, exp, out, se, a, s) in enumerate(_V3L, start=1):
        p = f"features.{i}.block"
        y, j = x, 0
        if exp != inp:
            y = conv_norm_act(net, pf, y, f"{p}.{j}", exp, 1, activation=a, eps=eps)
            j += 1
        y = conv_norm_act(net, pf, y, f"{p}.{j}", exp, k, stride=s, groups=exp, activation=a, eps=eps)
        j += 1
        if se:
            y = squeeze_excitation(net, pf, y, f"{p}.{j}", make_divisible(exp // 4, 8), "relu", "hardsigmoid")
            j += 1
        res = s == 1 and inp == out
        y = conv_norm_act(net, pf, y, f"{p}.{j}", out, 1, activation=None, eps=eps,
                          gamma_range=_LAST_GAMMA if res else (0.5, 1.5), gain=1.0)
        x = net.add(y, x, name=f"features.{i}.add") if res else y
    x = conv_norm_act(net, pf, x, "features.16", 960, 1, activation="hardswish", eps=eps)
    x = net.global_avg_pool(x, name="avgpool")
    x = net.flatten(x, 1, name="flatten")
    x = net.linear(x, *pf.linear("classifier.0", 1280, 960), name="classifier.0")
    x = act(net, x, "hardswish", "classifier.1")
    x = net.linear(x, *pf.linear("classifier.3", num_classes, 1280, gain=1.0), name="classifier.3")
    net.output(x)
    return net
