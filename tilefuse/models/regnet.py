"""RegNetY-400MF as torchvision builds it (torchvision.models.regnet, regnet_y_400mf).

Widths and depths come from the paper's quantized linear rule (Radosavovic et al. 2020,
"Designing Network Design Spaces", eqs. 2-4) with depth 16, w_0 48, w_a 27.89, w_m 2.09,
group width 8, bottleneck ratio 1, SE ratio 0.25: stages of 48, 104, 208, 440 channels and
1, 3, 6, 6 blocks. stem: conv3x3 s2 (32) + BN + ReLU; every block ("trunk_output.block<s>.
block<s>-<i>") is a ResBottleneckBlock: f.a 1x1 + BN + ReLU, f.b grouped 3x3 (stride on the
first block) + BN + ReLU, f.se squeeze-excitation (ReLU, sigmoid, squeeze = 0.25 * block input
width), f.c 1x1 + BN; the shortcut is proj (1x1 + BN) when the shape changes; add, ReLU.
Head: avgpool, flatten, fc.
"""
from __future__ import annotations

import math

import numpy as np

from ..ir import Network
from ._blocks import conv_norm_act, squeeze_excitation
from ._params import ParamFactory


def regnet_stages(depth=16, w_0=48, w_a=27.89, w_m=2.09, group_width=8, quant=8):
    """(stage widths, stage depths, group widths) of the RegNet rule (torchvision BlockParams)."""
    widths_cont = np.arange(depth) * w_a + w_0
    caps = np.round(np.log(widths_cont / w_0) / math.log(w_m))
    widths = (np.round(w_0 * np.power(w_m, caps) / quant) * quant).astype(int).tolist()
    splits = [w != wp for w, wp in zip(widths + [0], [0] + widths)]
    stage_widths = [w for w, t in zip(widths, splits[:-1]) if t]
    stage_depths = np.diff([d for d, t in enumerate(splits) if t]).astype(int).tolist()
    groups = [min(group_width, w) for w in stage_widths]
    stage_widths = [int(round(w / g) * g) for w, g in zip(stage_widths, groups)]
    return stage_widths, stage_depths, groups


def regnet_y_400mf(seed: int = 0, batch: int = 1, image_size: int = 224, num_classes: int = 1000,
                   dtype=np.float32) -> Network:
    net = Network("regnet_y_400mf")
    pf = ParamFactory(net, seed, dtype)
    x = net.input("x", (batch, 3, image_size, image_size), dtype)
    x = conv_norm_act(net, pf, x, "stem", 32, 3, stride=2, activation="relu")
    widths, depths, groups = regnet_stages()
    for s, (w, d, g) in enumerate(zip(widths, depths, groups), start=1):
        for i in range(d):
            p = f"trunk_output.block{s}.block{s}-{i}"
            stride = 2 if i == 0 else 1
            win = x.shape[1]
            shortcut = x
            if win != w or stride != 1:
                shortcut = conv_norm_act(net, pf, x, f"{p}.proj", w, 1, stride=stride, activation=None, gain=1.0)
            y = conv_norm_act(net, pf, x, f"{p}.f.a", w, 1, activation="relu")
            y = conv_norm_act(net, pf, y, f"{p}.f.b", w, 3, stride=stride, groups=w // g, activation="relu")
            y = squeeze_excitation(net, pf, y, f"{p}.f.se", int(round(0.25 * win)), "relu", "sigmoid")
            y = conv_norm_act(net, pf, y, f"{p}.f.c", w, 1, activation=None, gamma_range=(0.2, 0.6), gain=1.0)
            y = net.add(shortcut, y, name=f"{p}.add")
            x = net.relu(y, name=f"{p}.activation")
    x = net.global_avg_pool(x, name="avgpool")
    x = net.flatten(x, 1, name="flatten")
    x = net.linear(x, *pf.linear("fc", num_classes, x.shape[1], gain=1.0), name="fc")
    net.output(x)
    return net
