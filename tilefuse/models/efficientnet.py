"""EfficientNet-B0 as torchvision builds it (torchvision.models.efficientnet, v1).

features.0 conv3x3 s2 (32) + BN + SiLU; features.1..7 stages of MBConv blocks
("block": [expand 1x1 + BN + SiLU] -> depthwise kxk + BN + SiLU -> squeeze-excitation (SiLU,
sigmoid gate, squeeze = input channels // 4) -> project 1x1 + BN; residual when stride 1 and
channels equal; stochastic depth is the identity at inference); features.8 conv1x1 (1280) +
BN + SiLU; avgpool, flatten, classifier.1 (dropout 0.2 first).
"""
from __future__ import annotations

import numpy as np

from ..ir import Network
from ._blocks import conv_norm_act, squeeze_excitation
from ._params import ParamFactory

# expand ratio, kernel, stride, input channels, output channels, layers (width and depth x1.0)
_B0 = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
       (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1)]


def efficientnet_b0(seed: int = 0, batch: int = 1, image_size: int = 224, num_classes: int = 1000,
                    dtype=np.float32) -> Network:
    net = Network("efficientnet_b0")
    pf = ParamFactory(net, seed, dtype)
    x = net.input("x", (batch, 3, image_size, image_size), dtype)
    x = conv_norm_act(net, pf, x, "features.0", 32, 3, stride=2, activation="silu")
    for si, (e, k, s, cin, cout, n) in enumerate(_B0, start=1):
        for j in range(n):
            inp, stride = (cin, s) if j == 0 else (cout, 1)
            p = f"features.{si}.{j}.block"
            exp = inp * e
            y, b = x, 0
            if exp != inp:
                y = conv_norm_act(net, pf, y, f"{p}.{b}", exp, 1, activation="silu")
                b += 1
            y = conv_norm_act(net, pf, y, f"{p}.{b}", exp, k, stride=stride, groups=exp, activation="silu")
            y = squeeze_excitation(net, pf, y, f"{p}.{b + 1}", max(1, inp // 4), "silu", "sigmoid")
            res = stride == 1 and inp == cout
            y = conv_norm_act(net, pf, y, f"{p}.{b + 2}", cout, 1, activation=None, gain=1.0,
                              gamma_range=(0.2, 0.6) if res else (0.5, 1.5))
            x = net.add(y, x, name=f"features.{si}.{j}.add") if res else y
    x = conv_norm_act(net, pf, x, "features.8", 1280, 1, activation="silu")
    x = net.global_avg_pool(x, name="avgpool")
    x = net.flatten(x, 1, name="flatten")
    x = net.linear(x, *pf.linear("classifier.1", num_classes, 1280, gain=1.0), name="classifier.1")
    net.output(x)
    return net
