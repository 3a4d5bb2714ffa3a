"""tinynet: a small residual CNN for quick demos and tests (~13 MFLOP at 32x32, 10k parameters).

stem conv3x3(3->16)+bn+relu; block1: two conv3x3+bn with a residual add and relu; down:
conv3x3 s2 (16->32, with bias)+relu; pool: max_pool 2x2; head: global avg pool, flatten, fc.
The matching torch module is tests/torch_zoo.py:TinyNet.
"""
from __future__ import annotations

import numpy as np

from ..ir import Network
from ._params import ParamFactory, adaptive_avg_pool, conv_bn


def tinynet(seed: int = 0, batch: int = 1, image_size: int = 32, num_classes: int = 10,
            dtype=np.float32) -> Network:
    net = Network("tinynet")
    pf = ParamFactory(net, seed, dtype)
    x = net.input("x", (batch, 3, image_size, image_size), dtype)
    x = conv_bn(net, pf, x, "conv1", "bn1", 16, 3, padding=1)
    x = net.relu(x, name="relu")
    y = conv_bn(net, pf, x, "block.conv1", "block.bn1", 16, 3, padding=1)
    y = net.relu(y, name="block.relu")
    y = conv_bn(net, pf, y, "block.conv2", "block.bn2", 16, 3, padding=1, gamma_range=(0.2, 0.6))
    y = net.add(y, x, name="block.add")
    x = net.relu(y, name="block.relu_1")
    w, b = pf.conv("down", 32, 16, 3, bias=True)
    x = net.conv2d(x, w, b, stride=2, padding=1, name="down")
    x = net.relu(x, name="relu_1")
    x = net.max_pool(x, kernel_size=2, stride=2, name="pool")
    x = adaptive_avg_pool(net, x, (1, 1), name="avgpool")
    x = net.flatten(x, 1, name="flatten")
    x = net.linear(x, *pf.linear("fc", num_classes, 32, gain=1.0), name="fc")
    net.output(x)
    return net
