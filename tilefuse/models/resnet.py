"""ResNet18 and ResNet50 as torchvision builds them (torchvision.models.resnet).

stem: conv1 7x7 s2 p3 (no bias), bn1, relu, maxpool 3x3 s2 p1; four stages layer1..layer4 of
BasicBlock (ResNet18: [2, 2, 2, 2]) or Bottleneck (ResNet50: [3, 4, 6, 3], expansion 4, the
stride on the 3x3 conv: "ResNet v1.5"); a block downsamples the identity with a 1x1 conv + BN
("downsample.0", "downsample.1") when its stride is not 1 or the channel count changes;
avgpool (global), flatten, fc.

A block's ReLU module is reused, so its ops are '<block>.relu', '<block>.relu_1', ... (the names
from_torch gives the repeated calls); the residual sum is '<block>.add'.
"""
from __future__ import annotations

import numpy as np

from ..ir import DataNode, Network
from ._params import ParamFactory, adaptive_avg_pool, conv_bn

_LAST_BN_GAMMA = (0.2, 0.6)   # last BN of each residual branch, see _params.py


def _downsample(net, pf, x, p, out_c, stride):
    if stride == 1 and x.shape[1] == out_c:
        return x
    return conv_bn(net, pf, x, f"{p}.downsample.0", f"{p}.downsample.1", out_c, 1, stride=stride)


def _basic_block(net: Network, pf: ParamFactory, x: DataNode, p: str, planes: int, stride: int):
    y = conv_bn(net, pf, x, f"{p}.conv1", f"{p}.bn1", planes, 3, stride=stride, padding=1)
    y = net.relu(y, name=f"{p}.relu")
    y = conv_bn(net, pf, y, f"{p}.conv2", f"{p}.bn2", planes, 3, padding=1, gamma_range=_LAST_BN_GAMMA)
    identity = _downsample(net, pf, x, p, planes, stride)
    y = net.add(y, identity, name=f"{p}.add")
    return net.relu(y, name=f"{p}.relu_1")


def _bottleneck(net: Network, pf: ParamFactory, x: DataNode, p: str, planes: int, stride: int):
    y = conv_bn(net, pf, x, f"{p}.conv1", f"{p}.bn1", planes, 1)
    y = net.relu(y, name=f"{p}.relu")
    y = conv_bn(net, pf, y, f"{p}.conv2", f"{p}.bn2", planes, 3, stride=stride, padding=1)
    y = net.relu(y, name=f"{p}.relu_1")
    y = conv_bn(net, pf, y, f"{p}.conv3", f"{p}.bn3", planes * 4, 1, gamma_range=_LAST_BN_GAMMA)
    identity = _downsample(net, pf, x, p, planes * 4, stride)
    y = net.add(y, identity, name=f"{p}.add")
    return net.relu(y, name=f"{p}.relu_2")


def _resnet(name, block, layers, seed, batch, image_size, num_classes, dtype) -> Network:
    net = Network(name)
    pf = ParamFactory(net, seed, dtype)
    x = net.input("x", (batch, 3, image_size, image_size), dtype)
    x = conv_bn(net, pf, x, "conv1", "bn1", 64, 7, stride=2, padding=3)
    x = net.relu(x, name="relu")
    x = net.max_pool(x, kernel_size=3, stride=2, padding=1, name="maxpool")
    for stage, (planes, n_blocks) in enumerate(zip((64, 128, 256, 512), layers), start=1):
        for j in range(n_blocks):
            stride = 2 if (stage > 1 and j == 0) else 1
            x = block(net, pf, x, f"layer{stage}.{j}", planes, stride)
    x = adaptive_avg_pool(net, x, (1, 1), name="avgpool")
    x = net.flatten(x, 1, name="flatten")
    x = net.linear(x, *pf.linear("fc", num_classes, x.shape[1], gain=1.0), name="fc")
    net.output(x)
    return net


def resnet18(seed: int = 0, batch: int = 1, image_size: int = 224, num_classes: int = 1000,
             dtype=np.float32) -> Network:
    return _resnet("resnet18", _basic_block, (2, 2, 2, 2), seed, batch, image_size, num_classes, dtype)


def resnet50(seed: int = 0, batch: int = 1, image_size: int = 224, num_classes: int = 1000,
             dtype=np.float32) -> Network:
    return _resnet("resnet50", _bottleneck, (3, 4, 6, 3), seed, batch, image_size, num_classes, dtype)
