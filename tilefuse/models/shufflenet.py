"""ShuffleNetV2 x1.0 as torchvision builds it (torchvision.models.shufflenetv2).

conv1 conv3x3 s2 (24) + BN + ReLU, maxpool 3x3 s2; stage2..4 (repeats 4, 8, 4; channels 116,
232, 464) of inverted residuals: stride 2 units run two branches on the whole input
(branch1: depthwise 3x3 s2 + BN, 1x1 + BN + ReLU; branch2: 1x1 + BN + ReLU, depthwise 3x3 +
BN, 1x1 + BN + ReLU), stride 1 units split the channels in halves (x.chunk(2)) and run
branch2 on the second; the halves are concatenated and channel-shuffled with 2 groups
(view (N, 2, C/2, H, W) -> transpose(1, 2) -> view (N, C, H, W)); conv5 1x1 (1024) + BN + ReLU;
x.mean([2, 3]); fc.
"""
from __future__ import annotations

import numpy as np

from ..ir import DataNode, Network
from ._params import ParamFactory

_REPEATS = (4, 8, 4)
_CHANNELS = (24, 116, 232, 464, 1024)


def _cbr(net, pf, x, p, i, out_c, k, stride=1, groups=1, relu=True):
    """modules p.i (conv, no bias), p.(i+1) (BN)[, p.(i+2) ReLU]."""
    w, _ = pf.conv(f"{p}.{i}", out_c, x.shape[1], k, groups=groups, gain=2.0 if relu else 1.0)
    y = net.conv2d(x, w, None, stride=stride, padding=(k - 1) // 2, groups=groups, name=f"{p}.{i}")
    y = net.batch_norm(y, *pf.bn(f"{p}.{i + 1}", out_c), name=f"{p}.{i + 1}")
    return net.relu(y, name=f"{p}.{i + 2}") if relu else y


def channel_shuffle(net: Network, x: DataNode, groups: int, name: str) -> DataNode:
    n, c, h, w = x.shape
    y = net.reshape(x, (n, groups, c // groups, h, w), name=f"{name}.view")      # (N, g, C/g, H, W)
    y = net.permute(y, (0, 2, 1, 3, 4), name=f"{name}.transpose")               # (N, C/g, g, H, W)
    return net.reshape(y, (n, c, h, w), name=f"{name}.view_1")                 # (N, C, H, W)


def _unit(net, pf, x, p, out_c, stride):
    bf = out_c // 2
    if stride > 1:
        b1 = _cbr(net, pf, x, f"{p}.branch1", 0, x.shape[1], 3, stride, groups=x.shape[1], relu=False)
        b1 = _cbr(net, pf, b1, f"{p}.branch1", 2, bf, 1)
        b2 = x
    else:
        b1, b2 = net.split(x, (x.shape[1] // 2, x.shape[1] // 2), axis=1, name=f"{p}.chunk")
    b2 = _cbr(net, pf, b2, f"{p}.branch2", 0, bf, 1)
    b2 = _cbr(net, pf, b2, f"{p}.branch2", 3, bf, 3, stride, groups=bf, relu=False)
    b2 = _cbr(net, pf, b2, f"{p}.branch2", 5, bf, 1)
    y = net.concat([b1, b2], axis=1, name=f"{p}.cat")
    return channel_shuffle(net, y, 2, f"{p}.shuffle")


def shufflenet_v2(seed: int = 0, batch: int = 1, image_size: int = 224, num_classes: int = 1000,
                  dtype=np.float32) -> Network:
    net = Network("shufflenet_v2")
    pf = ParamFactory(net, seed, dtype)
    x = net.input("x", (batch, 3, image_size, image_size), dtype)
    x = _cbr(net, pf, x, "conv1", 0, _CHANNELS[0], 3, 2)
    x = net.max_pool(x, 3, 2, 1, name="maxpool")
    for s, (reps, c) in enumerate(zip(_REPEATS, _CHANNELS[1:4]), start=2):
        for j in range(reps):
            x = _unit(net, pf, x, f"stage{s}.{j}", c, 2 if j == 0 else 1)
    x = _cbr(net, pf, x, "conv5", 0, _CHANNELS[4], 1)
    x = net.mean(x, (2, 3), name="mean")
    x = net.linear(x, *pf.linear("fc", num_classes, x.shape[1], gain=1.0), name="fc")
    net.output(x)
    return net
