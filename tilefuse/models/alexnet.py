"""AlexNet as torchvision builds it (torchvision.models.alexnet, the one-GPU variant).

features: Conv(3,64,11,s4,p2) ReLU MaxPool(3,2) Conv(64,192,5,p2) ReLU MaxPool(3,2)
          Conv(192,384,3,p1) ReLU Conv(384,256,3,p1) ReLU Conv(256,256,3,p1) ReLU MaxPool(3,2)
avgpool:  AdaptiveAvgPool2d(6, 6)
classifier: Dropout Linear(9216,4096) ReLU Dropout Linear(4096,4096) ReLU Linear(4096,classes)
"""
from __future__ import annotations

import numpy as np

from ..ir import Network
from ._params import ParamFactory, adaptive_avg_pool

# (out_channels, kernel, stride, padding) per conv; "M" = MaxPool(3, 2)
_FEATURES = [(64, 11, 4, 2), "M", (192, 5, 1, 2), "M", (384, 3, 1, 1), (256, 3, 1, 1),
             (256, 3, 1, 1), "M"]


def alexnet(seed: int = 0, batch: int = 1, image_size: int = 224, num_classes: int = 1000,
            dtype=np.float32) -> Network:
    net = Network("alexnet")
    pf = ParamFactory(net, seed, dtype)
    x = net.input("x", (batch, 3, image_size, image_size), dtype)
    i = 0
    for item in _FEATURES:
        if item == "M":
            x = net.max_pool(x, kernel_size=3, stride=2, name=f"features.{i}")
            i += 1
            continue
        c, k, s, p = item
        w, b = pf.conv(f"features.{i}", c, x.shape[1], k, bias=True)
        x = net.conv2d(x, w, b, stride=s, padding=p, name=f"features.{i}")
        x = net.relu(x, name=f"features.{i + 1}")
        i += 2
    x = adaptive_avg_pool(net, x, (6, 6), name="avgpool")
    x = net.flatten(x, 1, name="flatten")
    x = net.dropout(x, 0.5, name="classifier.0")
    x = net.linear(x, *pf.linear("classifier.1", 4096, x.shape[1]), name="classifier.1")
    x = net.relu(x, name="classifier.2")
    x = net.dropout(x, 0.5, name="classifier.3")
    x = net.linear(x, *pf.linear("classifier.4", 4096, 4096), name="classifier.4")
    x = net.relu(x, name="classifier.5")
    x = net.linear(x, *pf.linear("classifier.6", num_classes, 4096, gain=1.0), name="classifier.6")
    net.output(x)
    return net
