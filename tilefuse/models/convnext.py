"""ConvNeXt-Tiny as torchvision builds it (torchvision.models.convnext, convnext_tiny).

features.0: conv4x4 s4 (96, bias) + LayerNorm2d (eps 1e-6); stages features.1, .3, .5, .7 of
3, 3, 9, 3 CNBlocks (96, 192, 384, 768 channels), with downsampling features.2, .4, .6 =
LayerNorm2d + conv2x2 s2 between them. A CNBlock: depthwise 7x7 (bias) -> LayerNorm over
channels -> Linear(C, 4C) -> GELU -> Linear(4C, C) (torchvision runs these channels-last between
two permutes; here they are the channel_norm op and 1x1 convs, which is what the compiler makes
of the permuted form too) -> times layer_scale (C, 1, 1) -> plus the block input.
Head: avgpool, classifier.0 LayerNorm2d, classifier.1 flatten, classifier.2 Linear.
layer_scale is drawn from U[0.1, 0.5] (torchvision initializes it to 1e-6, which would make
every block nearly the identity and a test of it weak).
"""
from __future__ import annotations

import numpy as np

from ..ir import Network
from ._params import ParamFactory

_STAGES = ((96, 3), (192, 3), (384, 9), (768, 3))
_EPS = 1e-6


def _ln2d(net, pf, x, p):
    g, b = pf.layer_norm(p, (x.shape[1],))
    return net.channel_norm(x, g, b, eps=_EPS, name=p)


def _cn_block(net, pf, x, p):
    c = x.shape[1]
    w, b = pf.conv(f"{p}.block.0", c, c, 7, groups=c, bias=True, gain=1.0)
    y = net.conv2d(x, w, b, padding=3, groups=c, name=f"{p}.block.0")
    g, bb = pf.layer_norm(f"{p}.block.2", (c,))
    y = net.channel_norm(y, g, bb, eps=_EPS, name=f"{p}.block.2")
    # Linear over channels = 1x1 conv; its (out, in, 1, 1) weight loads into torch's (out, in) one
    w1, b1 = pf.conv(f"{p}.block.3", 4 * c, c, 1, bias=True)
    y = net.conv2d(y, w1, b1, name=f"{p}.block.3")
    y = net.gelu(y, name=f"{p}.block.4")
    w2, b2 = pf.conv(f"{p}.block.5", c, 4 * c, 1, bias=True, gain=1.0)
    y = net.conv2d(y, w2, b2, name=f"{p}.block.5")
    scale = pf.uniform(f"{p}.layer_scale", (c, 1, 1), 0.1, 0.5)
    y = net.mul(scale, y, name=f"{p}.mul")
    return net.add(y, x, name=f"{p}.add")


def convnext_tiny(seed: int = 0, batch: int = 1, image_size: int = 224, num_classes: int = 1000,
                  dtype=np.float32) -> Network:
    net = Network("convnext_tiny")
    pf = ParamFactory(net, seed, dtype)
    x = net.input("x", (batch, 3, image_size, image_size), dtype)
    w, b = pf.conv("features.0.0", 96, 3, 4, bias=True, gain=1.0)
    x = net.conv2d(x, w, b, stride=4, name="features.0.0")
    x = _ln2d(net, pf, x, "features.0.1")
    for s, (c, n) in enumerate(_STAGES):
        if s > 0:
            p = f"features.{2 * s}"
            x = _ln2d(net, pf, x, f"{p}.0")
            w, b = pf.conv(f"{p}.1", c, x.shape[1], 2, bias=True, gain=1.0)
            x = net.conv2d(x, w, b, stride=2, name=f"{p}.1")
        for j in range(n):
            x = _cn_block(net, pf, x, f"features.{2 * s + 1}.{j}")
    x = net.global_avg_pool(x, name="avgpool")
    x = _ln2d(net, pf, x, "classifier.0")
    x = net.flatten(x, 1, name="classifier.1")
    x = net.linear(x, *pf.linear("classifier.2", num_classes, x.shape[1], gain=1.0), name="classifier.2")
    net.output(x)
    return net
