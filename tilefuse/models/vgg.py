"""VGG16 (configuration "D", no batch norm) as torchvision builds it (torchvision.models.vgg16).

features: 13 Conv3x3(p1)+ReLU with MaxPool(2,2) after each stage (64,64,M,128,128,M,256x3,M,
          512x3,M,512x3,M); avgpool: AdaptiveAvgPool2d(7, 7);
classifier: Linear(25088,4096) ReLU Dropout Linear(4096,4096) ReLU Dropout Linear(4096,classes)
"""
from __future__ import annotations

import numpy as np

from ..ir import Network
from ._params import ParamFactory, adaptive_avg_pool

CFG_D = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]


def vgg16(seed: int = 0, batch: int = 1, image_size: int = 224, num_classes: int = 1000,
          dtype=np.float32) -> Network:
    net = Network("vgg16")
    pf = ParamFactory(net, seed, dtype)
    x = net.input("x", (batch, 3, image_size, image_size), dtype)
    i = 0
    for v in CFG_D:
        if v == "M":
            x = net.max_pool(x, kernel_size=2, stride=2, name=f"features.{i}")
            i += 1
            continue
        w, b = pf.conv(f"features.{i}", v, x.shape[1], 3, bias=True)
        x = net.conv2d(x, w, b, stride=1, padding=1, name=f"features.{i}")
        x = net.relu(x, name=f"features.{i + 1}")
        i += 2
    x = adaptive_avg_pool(net, x, (7, 7), name="avgpool")
    x = net.flatten(x, 1, name="flatten")
    x = net.linear(x, *pf.linear("classifier.0", 4096, x.shape[1]), name="classifier.0")
    x = net.relu(x, name="classifier.1")
    x = net.dropout(x, 0.5, name="classifier.2")
    x = net.linear(x, *pf.linear("classifier.3", 4096, 4096), name="classifier.3")
    x = net.relu(x, name="classifier.4")
    x = net.dropout(x, 0.5, name="classifier.5")
    x = net.linear(x, *pf.linear("classifier.6", num_classes, 4096, gain=1.0), name="classifier.6")
    net.output(x)
    return net
