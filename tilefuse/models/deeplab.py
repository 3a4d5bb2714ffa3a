"""DeepLabV3 with a ResNet-50 backbone as torchvision builds it (torchvision.models.segmentation,
deeplabv3_resnet50, no auxiliary head).

backbone: ResNet-50 whose layer3 and layer4 trade their stride for dilation 2 and 4
(replace_stride_with_dilation=[False, True, True]: output stride 8); the first block of a
dilated layer keeps the previous dilation. classifier.0: ASPP over the 2048 channels: a 1x1
branch, three 3x3 branches with dilation 12, 24, 36, and image pooling (global average pool,
1x1, BN, ReLU, bilinear upsampling back to the feature size), each 256 channels, concatenated
and projected by 1x1 + BN + ReLU (dropout 0.5 at training); classifier.1-3 conv3x3 + BN + ReLU;
classifier.4 conv1x1 to the classes. The logits are upsampled bilinearly (align_corners=False)
to the input size.
"""
from __future__ import annotations

import numpy as np

from ..ir import Network
from ._blocks import conv_norm_act
from ._params import ParamFactory

_LAST_GAMMA = (0.2, 0.6)


def _conv_bn(net, pf, x, conv, bn, out_c, k, stride=1, dilation=1, gamma=(0.5, 1.5)):
    w, _ = pf.conv(conv, out_c, x.shape[1], k)
    y = net.conv2d(x, w, None, stride=stride, padding=(k // 2) * dilation, dilation=dilation, name=conv)
    return net.batch_norm(y, *pf.bn(bn, out_c, gamma), name=bn)


def _bottleneck(net, pf, x, p, planes, stride, dilation, downsample):
    y = net.relu(_conv_bn(net, pf, x, f"{p}.conv1", f"{p}.bn1", planes, 1), name=f"{p}.relu")
    y = net.relu(_conv_bn(net, pf, y, f"{p}.conv2", f"{p}.bn2", planes, 3, stride, dilation), name=f"{p}.relu_1")
    y = _conv_bn(net, pf, y, f"{p}.conv3", f"{p}.bn3", planes * 4, 1, gamma=_LAST_GAMMA)
    identity = _conv_bn(net, pf, x, f"{p}.downsample.0", f"{p}.downsample.1", planes * 4, 1, stride) \
        if downsample else x
    return net.relu(net.add(y, identity, name=f"{p}.add"), name=f"{p}.relu_2")


def deeplabv3_resnet50(seed: int = 0, batch: int = 1, image_size: int = 224, num_classes: int = 21,
                       dtype=np.float32) -> Network:
    net = Network("deeplabv3")
    pf = ParamFactory(net, seed, dtype)
    h, w = (image_size, image_size) if isinstance(image_size, int) else image_size   # H = W, or (H, W)
    x = net.input("x", (batch, 3, h, w), dtype)
    size = x.shape[2:]
    x = net.relu(_conv_bn(net, pf, x, "backbone.conv1", "backbone.bn1", 64, 7, 2), name="backbone.relu")
    x = net.max_pool(x, 3, 2, 1, name="backbone.maxpool")
    dilation = 1
    for li, (planes, blocks, stride, dilate) in enumerate(
            [(64, 3, 1, False), (128, 4, 2, False), (256, 6, 2, True), (512, 3, 2, True)], start=1):
        previous = dilation
        if dilate:
            dilation *= stride
            stride = 1
        for j in range(blocks):
            p = f"backbone.layer{li}.{j}"
            down = j == 0 and (stride != 1 or x.shape[1] != planes * 4)
            x = _bottleneck(net, pf, x, p, planes, stride if j == 0 else 1, previous if j == 0 else dilation, down)
    # ASPP
    feat = x
    branches = [conv_norm_act(net, pf, feat, "classifier.0.convs.0", 256, 1)]
    for i, rate in enumerate((12, 24, 36), start=1):
        branches.append(conv_norm_act(net, pf, feat, f"classifier.0.convs.{i}", 256, 3, dilation=rate))
    p = "classifier.0.convs.4"   # ASPPPooling: .0 pool, .1 conv, .2 BN, .3 ReLU
    pooled = net.global_avg_pool(feat, name=f"{p}.0")
    pooled = net.relu(_conv_bn(net, pf, pooled, f"{p}.1", f"{p}.2", 256, 1), name=f"{p}.3")
    pooled = net.resize(pooled, size=feat.shape[2:], mode="bilinear", name=f"{p}.interpolate")
    branches.append(pooled)
    y = net.concat(branches, axis=1, name="classifier.0.cat")
    y = conv_norm_act(net, pf, y, "classifier.0.project", 256, 1)
    y = net.relu(_conv_bn(net, pf, y, "classifier.1", "classifier.2", 256, 3), name="classifier.3")
    w, b = pf.conv("classifier.4", num_classes, 256, 1, bias=True, gain=1.0)
    y = net.conv2d(y, w, b, name="classifier.4")
    net.output(net.resize(y, size=size, mode="bilinear", name="interpolate"))
    return net
