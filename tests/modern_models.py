"""PyTorch definitions of the modern CNNs, written in the idioms real model code uses (tests only).

torchvision is deliberately not a dependency: these reproduce torchvision's module trees (so
their state_dict keys equal the tilefuse zoo's constant names and `load(name, net)` copies a
zoo net's weights in) and forward passes, written the way model zoos write them:

  x.ndim checks                      ConvNeXt's LayerNorm2d, the YOLO neck
  x.size(1) // g channel shuffles    ShuffleNetV2 (channel_shuffle)
  torch.chunk and x[:, :c]           ShuffleNetV2, GhostNet, the YOLO neck (C2f)
  F.interpolate(scale_factor=2)      the YOLO neck; DeepLabV3 / UNet by size
  x.mean((2, 3), keepdim=True)       the squeeze-excitations of MobileNetV3, EfficientNet, RegNetY
  nn.Identity                        stochastic depth at inference, empty shortcuts
  in-place activations               ReLU(inplace=True), F.relu6(x, inplace=True), x += y, x.mul_()
  torch.flatten(x, 1), x.view(...)   the classifier heads

plus GhostNet (a reduced configuration: same blocks, fewer stages) and a YOLO-style neck (SiLU,
nearest upsampling, concat) that the zoo does not carry. The ONNX tests import this module too.
"""
from __future__ import annotations

import math
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

import tilefuse.models as models
from torch_zoo import Bottleneck


def make_divisible(v, divisor=8, min_value=None):
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class ConvNormAct(nn.Sequential):
    """torchvision.ops.Conv2dNormActivation: conv (no bias), BN, activation (or none)."""

    def __init__(self, cin, cout, k=3, stride=1, groups=1, act=nn.ReLU, dilation=1, eps=1e-5, padding=None):
        pad = (k - 1) // 2 * dilation if padding is None else padding
        layers = [nn.Conv2d(cin, cout, k, stride, pad, dilation=dilation, groups=groups, bias=False),
                  nn.BatchNorm2d(cout, eps=eps)]
        if act is not None:
            layers.append(act(inplace=True) if act in (nn.ReLU, nn.ReLU6, nn.Hardswish, nn.SiLU) else act())
        super().__init__(*layers)


class SqueezeExcitation(nn.Module):
    """torchvision.ops.SqueezeExcitation, squeezing with x.mean((2, 3), keepdim=True)."""

    def __init__(self, c, squeeze, act=nn.ReLU, scale_act=nn.Sigmoid):
        super().__init__()
        self.fc1 = nn.Conv2d(c, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, c, 1)
        self.activation = act()
        self.scale_activation = scale_act()

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        s = self.scale_activation(self.fc2(self.activation(self.fc1(s))))
        return s * x


class StochasticDepth(nn.Identity):
    """torchvision.ops.StochasticDepth at inference: the identity."""


# ----------------------------------------------------------------------------- MobileNetV2

class InvertedResidualV2(nn.Module):
    def __init__(self, inp, oup, stride, t):
        super().__init__()
        hidden = inp * t
        self.use_res_connect = stride == 1 and inp == oup
        layers = []
        if t != 1:
            layers.append(ConvNormAct(inp, hidden, 1, act=nn.ReLU6))
        layers += [ConvNormAct(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6),
                   nn.Conv2d(hidden, oup, 1, bias=False), nn.BatchNorm2d(oup)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        features = [ConvNormAct(3, 32, 3, 2, act=nn.ReLU6)]
        cin = 32
        for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                           (6, 160, 3, 2), (6, 320, 1, 1)]:
            for i in range(n):
                features.append(InvertedResidualV2(cin, c, s if i == 0 else 1, t))
                cin = c
        features.append(ConvNormAct(cin, 1280, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x):
        x = self.features(x)
        x = F.adaptive_avg_pool2d(x, (1, 1))
        x = x.view(x.size(0), -1)
        return self.classifier(x)


# ----------------------------------------------------------------------------- MobileNetV3-Large

class InvertedResidualV3(nn.Module):
    def __init__(self, inp, k, exp, out, use_se, act, stride):
        super().__init__()
        a = nn.Hardswish if act == "HS" else nn.ReLU
        self.use_res_connect = stride == 1 and inp == out
        layers = []
        if exp != inp:
            layers.append(ConvNormAct(inp, exp, 1, act=a, eps=1e-3))
        layers.append(ConvNormAct(exp, exp, k, stride, groups=exp, act=a, eps=1e-3))
        if use_se:
            layers.append(SqueezeExcitation(exp, make_divisible(exp // 4, 8), scale_act=nn.Hardsigmoid))
        layers.append(ConvNormAct(exp, out, 1, act=None, eps=1e-3))
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        result = self.block(x)
        if self.use_res_connect:
            result += x
        return result


class MobileNetV3Large(nn.Module):
    CONF = [(16, 3, 16, 16, False, "RE", 1), (16, 3, 64, 24, False, "RE", 2), (24, 3, 72, 24, False, "RE", 1),
            (24, 5, 72, 40, True, "RE", 2), (40, 5, 120, 40, True, "RE", 1), (40, 5, 120, 40, True, "RE", 1),
            (40, 3, 240, 80, False, "HS", 2), (80, 3, 200, 80, False, "HS", 1), (80, 3, 184, 80, False, "HS", 1),
            (80, 3, 184, 80, False, "HS", 1), (80, 3, 480, 112, True, "HS", 1), (112, 3, 672, 112, True, "HS", 1),
            (112, 5, 672, 160, True, "HS", 2), (160, 5, 960, 160, True, "HS", 1), (160, 5, 960, 160, True, "HS", 1)]

    def __init__(self, num_classes=1000):
        super().__init__()
        layers = [ConvNormAct(3, 16, 3, 2, act=nn.Hardswish, eps=1e-3)]
        layers += [InvertedResidualV3(*c) for c in self.CONF]
        layers.append(ConvNormAct(160, 960, 1, act=nn.Hardswish, eps=1e-3))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(960, 1280), nn.Hardswish(inplace=True), nn.Dropout(0.2),
                                        nn.Linear(1280, num_classes))

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


# ----------------------------------------------------------------------------- EfficientNet-B0

class MBConv(nn.Module):
    def __init__(self, e, k, stride, inp, out):
        super().__init__()
        self.use_res_connect = stride == 1 and inp == out
        exp = inp * e
        layers = []
        if exp != inp:
            layers.append(ConvNormAct(inp, exp, 1, act=nn.SiLU))
        layers += [ConvNormAct(exp, exp, k, stride, groups=exp, act=nn.SiLU),
                   SqueezeExcitation(exp, max(1, inp // 4), act=nn.SiLU),
                   ConvNormAct(exp, out, 1, act=None)]
        self.block = nn.Sequential(*layers)
        self.stochastic_depth = StochasticDepth()

    def forward(self, x):
        result = self.block(x)
        if self.use_res_connect:
            result = self.stochastic_depth(result)
            result += x
        return result


class EfficientNetB0(nn.Module):
    CONF = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
            (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1)]

    def __init__(self, num_classes=1000):
        super().__init__()
        layers = [ConvNormAct(3, 32, 3, 2, act=nn.SiLU)]
        for e, k, s, cin, cout, n in self.CONF:
            layers.append(nn.Sequential(*[MBConv(e, k, s if i == 0 else 1, cin if i == 0 else cout, cout)
                                          for i in range(n)]))
        layers.append(ConvNormAct(320, 1280, 1, act=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2, inplace=True), nn.Linear(1280, num_classes))

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


# ----------------------------------------------------------------------------- ShuffleNetV2 x1.0

def channel_shuffle(x, groups: int):
    batchsize, num_channels, height, width = x.size()
    channels_per_group = num_channels // groups
    x = x.view(batchsize, groups, channels_per_group, height, width)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(batchsize, -1, height, width)


class ShuffleUnit(nn.Module):
    def __init__(self, inp, oup, stride):
        super().__init__()
        self.stride = stride
        bf = oup // 2
        if stride > 1:
            self.branch1 = nn.Sequential(nn.Conv2d(inp, inp, 3, stride, 1, groups=inp, bias=False), nn.BatchNorm2d(inp),
                                         nn.Conv2d(inp, bf, 1, bias=False), nn.BatchNorm2d(bf), nn.ReLU(inplace=True))
        else:
            self.branch1 = nn.Sequential()
        self.branch2 = nn.Sequential(
            nn.Conv2d(inp if stride > 1 else bf, bf, 1, bias=False), nn.BatchNorm2d(bf), nn.ReLU(inplace=True),
            nn.Conv2d(bf, bf, 3, stride, 1, groups=bf, bias=False), nn.BatchNorm2d(bf),
            nn.Conv2d(bf, bf, 1, bias=False), nn.BatchNorm2d(bf), nn.ReLU(inplace=True))

    def forward(self, x):
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    def __init__(self, num_classes=1000, repeats=(4, 8, 4), channels=(24, 116, 232, 464, 1024)):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(3, channels[0], 3, 2, 1, bias=False), nn.BatchNorm2d(channels[0]),
                                   nn.ReLU(inplace=True))
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin = channels[0]
        for name, r, c in zip(["stage2", "stage3", "stage4"], repeats, channels[1:]):
            setattr(self, name, nn.Sequential(ShuffleUnit(cin, c, 2), *[ShuffleUnit(c, c, 1) for _ in range(r - 1)]))
            cin = c
        self.conv5 = nn.Sequential(nn.Conv2d(cin, channels[-1], 1, bias=False), nn.BatchNorm2d(channels[-1]),
                                   nn.ReLU(inplace=True))
        self.fc = nn.Linear(channels[-1], num_classes)

    def forward(self, x):
        x = self.maxpool(self.conv1(x))
        x = self.stage4(self.stage3(self.stage2(x)))
        x = self.conv5(x)
        x = x.mean([2, 3])
        return self.fc(x)


# ----------------------------------------------------------------------------- RegNetY-400MF

class ResBottleneckBlock(nn.Module):
    def __init__(self, win, wout, stride, group_width, se_ratio=0.25):
        super().__init__()
        self.proj = None
        if win != wout or stride != 1:
            self.proj = ConvNormAct(win, wout, 1, stride, act=None)
        g = wout // group_width
        self.f = nn.Sequential(OrderedDict([
            ("a", ConvNormAct(win, wout, 1)),
            ("b", ConvNormAct(wout, wout, 3, stride, groups=g)),
            ("se", SqueezeExcitation(wout, int(round(se_ratio * win)))),
            ("c", ConvNormAct(wout, wout, 1, act=None)),
        ]))
        self.activation = nn.ReLU(inplace=True)

    def forward(self, x):
        if self.proj is not None:
            x = self.proj(x) + self.f(x)
        else:
            x = x + self.f(x)
        return self.activation(x)


class RegNetY400MF(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        widths, depths, groups = models.regnet.regnet_stages()
        self.stem = ConvNormAct(3, 32, 3, 2)
        stages, cin = [], 32
        for s, (w, d, g) in enumerate(zip(widths, depths, groups), start=1):
            blocks = nn.Sequential()
            for i in range(d):
                blocks.add_module(f"block{s}-{i}", ResBottleneckBlock(cin if i == 0 else w, w, 2 if i == 0 else 1, g))
            stages.append((f"block{s}", blocks))
            cin = w
        self.trunk_output = nn.Sequential(OrderedDict(stages))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.trunk_output(self.stem(x))
        x = self.avgpool(x)
        x = x.flatten(start_dim=1)
        return self.fc(x)


# ----------------------------------------------------------------------------- ConvNeXt-Tiny

class LayerNorm2d(nn.LayerNorm):
    def forward(self, x):
        if x.ndim == 4:
            x = x.permute(0, 2, 3, 1)
            x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
            return x.permute(0, 3, 1, 2)
        return super().forward(x)


class Permute(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.dims = dims

    def forward(self, x):
        return torch.permute(x, self.dims)


class CNBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv2d(dim, dim, 7, padding=3, groups=dim, bias=True), Permute([0, 2, 3, 1]), nn.LayerNorm(dim, eps=1e-6),
            nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), Permute([0, 3, 1, 2]))
        self.layer_scale = nn.Parameter(torch.ones(dim, 1, 1) * 1e-6)
        self.stochastic_depth = StochasticDepth()

    def forward(self, x):
        result = self.layer_scale * self.block(x)
        result = self.stochastic_depth(result)
        result += x
        return result


class ConvNeXtTiny(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        layers = [nn.Sequential(nn.Conv2d(3, 96, 4, 4, bias=True), LayerNorm2d(96, eps=1e-6))]
        for i, (c, n) in enumerate([(96, 3), (192, 3), (384, 9), (768, 3)]):
            if i > 0:
                layers.append(nn.Sequential(LayerNorm2d(c // 2, eps=1e-6), nn.Conv2d(c // 2, c, 2, 2)))
            layers.append(nn.Sequential(*[CNBlock(c) for _ in range(n)]))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(LayerNorm2d(768, eps=1e-6), nn.Flatten(1), nn.Linear(768, num_classes))

    def forward(self, x):
        return self.classifier(self.avgpool(self.features(x)))


# ----------------------------------------------------------------------------- U-Net

class DoubleConv(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.double_conv = nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

    def forward(self, x):
        return self.double_conv(x)


class Down(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.maxpool_conv = nn.Sequential(nn.MaxPool2d(2), DoubleConv(cin, cout))

    def forward(self, x):
        return self.maxpool_conv(x)


class Up(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.up = nn.ConvTranspose2d(cin, cin // 2, kernel_size=2, stride=2)
        self.conv = DoubleConv(cin, cout)

    def forward(self, x1, x2):
        x1 = self.up(x1)
        diff_y = x2.size()[2] - x1.size()[2]
        diff_x = x2.size()[3] - x1.size()[3]
        x1 = F.pad(x1, [diff_x // 2, diff_x - diff_x // 2, diff_y // 2, diff_y - diff_y // 2])
        return self.conv(torch.cat([x2, x1], dim=1))


class UNet(nn.Module):
    def __init__(self, n_classes=2, base=64, in_channels=3):
        super().__init__()
        self.inc = DoubleConv(in_channels, base)
        for i in range(1, 5):
            setattr(self, f"down{i}", Down(base * 2 ** (i - 1), base * 2 ** i))
        for i in range(1, 5):
            setattr(self, f"up{i}", Up(base * 2 ** (5 - i), base * 2 ** (4 - i)))
        self.outc = nn.Sequential()
        self.outc.add_module("conv", nn.Conv2d(base, n_classes, 1))

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        x4 = self.down3(x3)
        x5 = self.down4(x4)
        x = self.up1(x5, x4)
        x = self.up2(x, x3)
        x = self.up3(x, x2)
        x = self.up4(x, x1)
        return self.outc(x)


# ----------------------------------------------------------------------------- DeepLabV3-ResNet50

class DilatedResNet50(nn.Module):
    def __init__(self, replace_stride_with_dilation=(False, True, True)):
        super().__init__()
        self.inplanes, self.dilation = 64, 1
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(64, 3)
        self.layer2 = self._make_layer(128, 4, 2, replace_stride_with_dilation[0])
        self.layer3 = self._make_layer(256, 6, 2, replace_stride_with_dilation[1])
        self.layer4 = self._make_layer(512, 3, 2, replace_stride_with_dilation[2])

    def _make_layer(self, planes, blocks, stride=1, dilate=False):
        downsample = None
        previous_dilation = self.dilation
        if dilate:
            self.dilation *= stride
            stride = 1
        if stride != 1 or self.inplanes != planes * 4:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * 4, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes * 4))
        layers = [Bottleneck(self.inplanes, planes, stride, downsample, previous_dilation)]
        self.inplanes = planes * 4
        layers += [Bottleneck(self.inplanes, planes, dilation=self.dilation) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return {"out": self.layer4(self.layer3(self.layer2(self.layer1(x))))}


class ASPPPooling(nn.Sequential):
    def __init__(self, cin, cout):
        super().__init__(nn.AdaptiveAvgPool2d(1), nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    def forward(self, x):
        size = x.shape[-2:]
        for mod in self:
            x = mod(x)
        return F.interpolate(x, size=size, mode="bilinear", align_corners=False)


class ASPP(nn.Module):
    def __init__(self, cin, rates, cout=256):
        super().__init__()
        modules = [nn.Sequential(nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())]
        for r in rates:
            modules.append(nn.Sequential(nn.Conv2d(cin, cout, 3, padding=r, dilation=r, bias=False),
                                         nn.BatchNorm2d(cout), nn.ReLU()))
        modules.append(ASPPPooling(cin, cout))
        self.convs = nn.ModuleList(modules)
        self.project = nn.Sequential(nn.Conv2d(len(self.convs) * cout, cout, 1, bias=False), nn.BatchNorm2d(cout),
                                     nn.ReLU(), nn.Dropout(0.5))

    def forward(self, x):
        return self.project(torch.cat([conv(x) for conv in self.convs], dim=1))


class DeepLabV3(nn.Module):
    def __init__(self, num_classes=21):
        super().__init__()
        self.backbone = DilatedResNet50()
        self.classifier = nn.Sequential(ASPP(2048, [12, 24, 36]), nn.Conv2d(256, 256, 3, padding=1, bias=False),
                                        nn.BatchNorm2d(256), nn.ReLU(), nn.Conv2d(256, num_classes, 1))

    def forward(self, x):
        input_shape = x.shape[-2:]
        features = self.backbone(x)
        x = self.classifier(features["out"])
        return F.interpolate(x, size=input_shape, mode="bilinear", align_corners=False)


# ----------------------------------------------------------------------------- GhostNet (reduced)

def hard_sigmoid(x, inplace: bool = False):
    if inplace:
        return x.add_(3.0).clamp_(0.0, 6.0).div_(6.0)
    return F.relu6(x + 3.0) / 6.0


class GhostSE(nn.Module):
    def __init__(self, c, se_ratio=0.25):
        super().__init__()
        r = make_divisible(c * se_ratio, 4)
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        self.conv_reduce = nn.Conv2d(c, r, 1, bias=True)
        self.act1 = nn.ReLU(inplace=True)
        self.conv_expand = nn.Conv2d(r, c, 1, bias=True)

    def forward(self, x):
        x_se = self.conv_expand(self.act1(self.conv_reduce(self.avg_pool(x))))
        return x * hard_sigmoid(x_se)


class GhostModule(nn.Module):
    def __init__(self, inp, oup, kernel_size=1, ratio=2, dw_size=3, stride=1, relu=True):
        super().__init__()
        self.oup = oup
        init_channels = math.ceil(oup / ratio)
        new_channels = init_channels * (ratio - 1)
        self.primary_conv = nn.Sequential(
            nn.Conv2d(inp, init_channels, kernel_size, stride, kernel_size // 2, bias=False),
            nn.BatchNorm2d(init_channels), nn.ReLU(inplace=True) if relu else nn.Sequential())
        self.cheap_operation = nn.Sequential(
            nn.Conv2d(init_channels, new_channels, dw_size, 1, dw_size // 2, groups=init_channels, bias=False),
            nn.BatchNorm2d(new_channels), nn.ReLU(inplace=True) if relu else nn.Sequential())

    def forward(self, x):
        x1 = self.primary_conv(x)
        x2 = self.cheap_operation(x1)
        out = torch.cat([x1, x2], dim=1)
        return out[:, :self.oup, :, :]


class GhostBottleneck(nn.Module):
    def __init__(self, cin, mid, cout, k=3, stride=1, se_ratio=0.0):
        super().__init__()
        self.stride = stride
        self.ghost1 = GhostModule(cin, mid, relu=True)
        if stride > 1:
            self.conv_dw = nn.Conv2d(mid, mid, k, stride, (k - 1) // 2, groups=mid, bias=False)
            self.bn_dw = nn.BatchNorm2d(mid)
        self.se = GhostSE(mid, se_ratio) if se_ratio > 0 else None
        self.ghost2 = GhostModule(mid, cout, relu=False)
        if cin == cout and stride == 1:
            self.shortcut = nn.Sequential()
        else:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cin, k, stride, (k - 1) // 2, groups=cin, bias=False), nn.BatchNorm2d(cin),
                nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        residual = x
        x = self.ghost1(x)
        if self.stride > 1:
            x = self.bn_dw(self.conv_dw(x))
        if self.se is not None:
            x = self.se(x)
        x = self.ghost2(x)
        x += self.shortcut(residual)
        return x


class GhostNet(nn.Module):
    """GhostNet (Han et al. 2020) blocks: ghost modules, SE with hard sigmoid, stride-2 depthwise;
    a reduced stage list (the paper's first 9 bottlenecks at width 1.0, then its head)."""

    CFGS = [[3, 16, 16, 0, 1], [3, 48, 24, 0, 2], [3, 72, 24, 0, 1], [5, 72, 40, 0.25, 2], [5, 120, 40, 0.25, 1],
            [3, 240, 80, 0, 2], [3, 200, 80, 0, 1], [3, 480, 112, 0.25, 1], [5, 672, 160, 0.25, 2]]

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv_stem = nn.Conv2d(3, 16, 3, 2, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.act1 = nn.ReLU(inplace=True)
        blocks, cin = [], 16
        for k, exp, c, se, s in self.CFGS:
            out = make_divisible(c, 4)
            blocks.append(GhostBottleneck(cin, make_divisible(exp, 4), out, k, s, se))
            cin = out
        self.blocks = nn.Sequential(*blocks)
        self.conv_head = nn.Conv2d(cin, 320, 1, bias=True)
        self.act2 = nn.ReLU(inplace=True)
        self.classifier = nn.Linear(320, num_classes)

    def forward(self, x):
        x = self.act1(self.bn1(self.conv_stem(x)))
        x = self.blocks(x)
        x = F.adaptive_avg_pool2d(x, 1)
        x = self.act2(self.conv_head(x))
        x = x.view(x.size(0), -1)
        return self.classifier(x)


# ----------------------------------------------------------------------------- YOLO-style neck

class Conv(nn.Module):
    """conv + BN + SiLU, the YOLOv5/v8 building block."""

    def __init__(self, c1, c2, k=1, s=1):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(c2, eps=1e-3)
        self.act = nn.SiLU(inplace=True)

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class C2f(nn.Module):
    def __init__(self, c1, c2, n=1, shortcut=True):
        super().__init__()
        self.c = c2 // 2
        self.cv1 = Conv(c1, 2 * self.c, 1)
        self.cv2 = Conv((2 + n) * self.c, c2, 1)
        self.m = nn.ModuleList(nn.Sequential(Conv(self.c, self.c, 3), Conv(self.c, self.c, 3)) for _ in range(n))
        self.shortcut = shortcut

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        for m in self.m:
            y.append(y[-1] + m(y[-1]) if self.shortcut else m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    def __init__(self, c1, c2, k=5):
        super().__init__()
        c_ = c1 // 2
        self.cv1 = Conv(c1, c_, 1)
        self.cv2 = Conv(c_ * 4, c2, 1)
        self.m = nn.MaxPool2d(k, 1, k // 2)

    def forward(self, x):
        x = self.cv1(x)
        y1 = self.m(x)
        y2 = self.m(y1)
        return self.cv2(torch.cat((x, y1, y2, self.m(y2)), 1))


class YoloNeck(nn.Module):
    """A small backbone (strided Conv + C2f) and a PAN neck: SPPF, nearest upsampling x2 and
    concat top-down, strided convs and concat bottom-up; three outputs (strides 8, 16, 32)."""

    def __init__(self, w=16, nc_out=18):
        super().__init__()
        self.stem = Conv(3, w, 3, 2)
        self.b1 = nn.Sequential(Conv(w, 2 * w, 3, 2), C2f(2 * w, 2 * w))
        self.b2 = nn.Sequential(Conv(2 * w, 4 * w, 3, 2), C2f(4 * w, 4 * w))       # P3, stride 8
        self.b3 = nn.Sequential(Conv(4 * w, 8 * w, 3, 2), C2f(8 * w, 8 * w))       # P4, stride 16
        self.b4 = nn.Sequential(Conv(8 * w, 8 * w, 3, 2), C2f(8 * w, 8 * w), SPPF(8 * w, 8 * w))   # P5
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.td4 = C2f(16 * w, 8 * w, shortcut=False)
        self.td3 = C2f(12 * w, 4 * w, shortcut=False)
        self.down3 = Conv(4 * w, 4 * w, 3, 2)
        self.bu4 = C2f(12 * w, 8 * w, shortcut=False)
        self.down4 = Conv(8 * w, 8 * w, 3, 2)
        self.bu5 = C2f(16 * w, 8 * w, shortcut=False)
        self.heads = nn.ModuleList(nn.Conv2d(c, nc_out, 1) for c in (4 * w, 8 * w, 8 * w))

    def forward(self, x):
        assert x.ndim == 4, "expected (N, C, H, W)"
        p3 = self.b2(self.b1(self.stem(x)))
        p4 = self.b3(p3)
        p5 = self.b4(p4)
        t4 = self.td4(torch.cat([self.up(p5), p4], 1))
        t3 = self.td3(torch.cat([F.interpolate(t4, scale_factor=2), p3], 1))   # the functional form
        o4 = self.bu4(torch.cat([self.down3(t3), t4], 1))
        o5 = self.bu5(torch.cat([self.down4(o4), p5], 1))
        return [h(o) for h, o in zip(self.heads, (t3, o4, o5))]


# ----------------------------------------------------------------------------- registry

BUILDERS = {
    "mobilenet_v2": lambda nc: MobileNetV2(nc),
    "mobilenet_v3_large": lambda nc: MobileNetV3Large(nc),
    "efficientnet_b0": lambda nc: EfficientNetB0(nc),
    "shufflenet_v2": lambda nc: ShuffleNetV2(nc),
    "regnet_y_400mf": lambda nc: RegNetY400MF(nc),
    "convnext_tiny": lambda nc: ConvNeXtTiny(nc),
    "unet": lambda nc: UNet(nc),
    "deeplabv3": lambda nc: DeepLabV3(nc),
    "ghostnet": lambda nc: GhostNet(nc),
    "yolo_neck": lambda nc: YoloNeck(nc_out=nc),
}
ZOO = ("mobilenet_v2", "mobilenet_v3_large", "efficientnet_b0", "shufflenet_v2", "regnet_y_400mf", "convnext_tiny",
       "unet", "deeplabv3")


def build(name: str, num_classes: int = 1000, **kw) -> nn.Module:
    """The untrained torch module `name`, in eval mode."""
    if kw:
        return {"unet": UNet}[name](num_classes, **kw).eval()
    return BUILDERS[name](num_classes).eval()


def load(name: str, net, **kw) -> nn.Module:
    """The torch twin of zoo model `name` carrying `net`'s constants, in eval mode."""
    nc = net.outputs[0].shape[1]
    m = build(name, nc, **kw)
    models.load_into_torch(m, net, strict=True)
    return m.eval()


def randomize(module: nn.Module, seed: int = 0) -> nn.Module:
    """Non-trivial BN statistics for the test-only models (fresh modules have mean 0, var 1,
    gamma 1, beta 0)."""
    g = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            m.running_mean.copy_(torch.rand(c, generator=g) - 0.5)
            m.running_var.copy_(torch.rand(c, generator=g) * 1.5 + 0.5)
            if m.affine:
                m.weight.data.copy_(torch.rand(c, generator=g) + 0.5)
                m.bias.data.copy_(torch.rand(c, generator=g) * 0.5 - 0.25)
    return module
