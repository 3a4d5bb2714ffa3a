"""PyTorch definitions of eleven more CNN families, written the way their reference code writes them
(tests only; torchvision / timm are not dependencies): reduced widths and depths, the same block structure
and forward-pass idioms.

  DenseNet         torchvision densenet.py: _DenseLayer over a list of features (torch.cat(inputs, 1)),
                   _DenseBlock(nn.ModuleDict), _Transition with AvgPool2d(2), F.relu(inplace=True),
                   F.adaptive_avg_pool2d, torch.flatten
  SqueezeNet 1.1   torchvision squeezenet.py: Fire modules (torch.cat of the 1x1 / 3x3 expands),
                   MaxPool2d(3, 2, ceil_mode=True), Dropout -> final 1x1 conv -> ReLU -> AdaptiveAvgPool2d
  Res2Net          Res2Net's res2net.py Bottle2neck: torch.split(out, width, 1), the hierarchical
                   sp = sp + spx[i], torch.cat((out, sp), 1), stype 'stage' with AvgPool2d(3, stride, 1);
                   the v1b downsample (AvgPool2d(ceil_mode=True, count_include_pad=False) -> 1x1 conv)
  SKNet            timm selective_kernel.py: split input, torch.stack(paths, dim=1), x.sum(1).mean((2, 3)),
                   x.view(B, num_paths, C // num_paths, H, W), torch.softmax(dim=1), (x * attn).sum(1);
                   paths 3x3 and 3x3 dilation 2 (keep_3x3)
  RepVGG           RepVGG's repvgg.py train-time block: conv_bn 3x3 + conv_bn 1x1 + identity BN, summed,
                   ReLU; a grouped stage (the g2 variants)
  ConvMixer        locuslab convmixer: Residual(depthwise k=9 padding="same" -> GELU -> BN), 1x1 -> GELU -> BN,
                   as one nn.Sequential
  Xception         Cadene / timm legacy xception entry, middle and exit flow: SeparableConv2d (depthwise +
                   pointwise), ReLU(inplace=False) first, MaxPool2d(3, 2, 1), 1x1 stride-2 skip, x += skip
  DLA              timm dla.py: DlaTree recursion with a children list, DlaRoot (torch.cat(children, 1),
                   1x1 conv, BN, x += children[0], ReLU), MaxPool2d(stride) downsample, a 1x1-conv classifier
  HRNet            HRNet's HighResolutionModule: branches, fuse layers (strided 3x3 conv-BN chains and
                   1x1 conv-BN-nn.Upsample(scale_factor=2 ** (j - i), mode='nearest')), list mutation
                   x[i] = ..., the classification head's F.avg_pool2d(y, kernel_size=y.size()[2:])
  EfficientNetV2   torchvision FusedMBConv / MBConv (SE by x.mean((2, 3), keepdim=True), SiLU,
                   StochasticDepth as the identity at inference), timm EdgeResidual's optional SE
  GhostNetV2       ghostnetv2_pytorch GhostModuleV2 mode 'attn': DFC attention F.avg_pool2d(x, 2, 2) ->
                   1x1 -> (1, 5) dw -> (5, 1) dw -> sigmoid -> F.interpolate(size=(H, W), mode='nearest')

FAMILIES maps a name to (builder(num_classes), input shape (N, C, H, W)); `randomize` gives BatchNorm
non-trivial statistics and affine parameters from a seeded generator.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from modern_models import randomize          # non-trivial BN statistics, the house helper


# ----------------------------------------------------------------------------- DenseNet (torchvision)

class _DenseLayer(nn.Module):
    def __init__(self, num_input_features, growth_rate, bn_size, drop_rate=0.0):
        super().__init__()
        self.norm1 = nn.BatchNorm2d(num_input_features)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(num_input_features, bn_size * growth_rate, kernel_size=1, stride=1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth_rate)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(bn_size * growth_rate, growth_rate, kernel_size=3, stride=1, padding=1, bias=False)
        self.drop_rate = float(drop_rate)

    def bn_function(self, inputs: List[Tensor]) -> Tensor:
        concated_features = torch.cat(inputs, 1)
        return self.conv1(self.relu1(self.norm1(concated_features)))

    def forward(self, input):
        prev_features = [input] if isinstance(input, Tensor) else input
        bottleneck_output = self.bn_function(prev_features)
        new_features = self.conv2(self.relu2(self.norm2(bottleneck_output)))
        if self.drop_rate > 0:
            new_features = F.dropout(new_features, p=self.drop_rate, training=self.training)
        return new_features


class _DenseBlock(nn.ModuleDict):
    def __init__(self, num_layers, num_input_features, bn_size, growth_rate, drop_rate=0.0):
        super().__init__()
        for i in range(num_layers):
            layer = _DenseLayer(num_input_features + i * growth_rate, growth_rate, bn_size, drop_rate)
            self.add_module("denselayer%d" % (i + 1), layer)

    def forward(self, init_features):
        features = [init_features]
        for name, layer in self.items():
            new_features = layer(features)
            features.append(new_features)
        return torch.cat(features, 1)


class _Transition(nn.Sequential):
    def __init__(self, num_input_features, num_output_features):
        super().__init__()
        self.norm = nn.BatchNorm2d(num_input_features)
        self.relu = nn.ReLU(inplace=True)
        self.conv = nn.Conv2d(num_input_features, num_output_features, kernel_size=1, stride=1, bias=False)
        self.pool = nn.AvgPool2d(kernel_size=2, stride=2)


class DenseNet(nn.Module):
    """torchvision's DenseNet-BC at growth 8, blocks (2, 3, 2), 16 initial features, bn_size 2."""

    def __init__(self, num_classes=10, growth_rate=8, block_config=(2, 3, 2), num_init_features=16, bn_size=2,
                 drop_rate=0.0):
        super().__init__()
        self.features = nn.Sequential(OrderedDict([
            ("conv0", nn.Conv2d(3, num_init_features, kernel_size=7, stride=2, padding=3, bias=False)),
            ("norm0", nn.BatchNorm2d(num_init_features)),
            ("relu0", nn.ReLU(inplace=True)),
            ("pool0", nn.MaxPool2d(kernel_size=3, stride=2, padding=1)),
        ]))
        num_features = num_init_features
        for i, num_layers in enumerate(block_config):
            block = _DenseBlock(num_layers, num_features, bn_size, growth_rate, drop_rate)
            self.features.add_module("denseblock%d" % (i + 1), block)
            num_features = num_features + num_layers * growth_rate
            if i != len(block_config) - 1:
                trans = _Transition(num_features, num_features // 2)
                self.features.add_module("transition%d" % (i + 1), trans)
                num_features = num_features // 2
        self.features.add_module("norm5", nn.BatchNorm2d(num_features))
        self.classifier = nn.Linear(num_features, num_classes)

    def forward(self, x):
        features = self.features(x)
        out = F.relu(features, inplace=True)
        out = F.adaptive_avg_pool2d(out, (1, 1))
        out = torch.flatten(out, 1)
        return self.classifier(out)


# ----------------------------------------------------------------------------- SqueezeNet 1.1 (torchvision)

class Fire(nn.Module):
    def __init__(self, inplanes, squeeze_planes, expand1x1_planes, expand3x3_planes):
        super().__init__()
        self.inplanes = inplanes
        self.squeeze = nn.Conv2d(inplanes, squeeze_planes, kernel_size=1)
        self.squeeze_activation = nn.ReLU(inplace=True)
        self.expand1x1 = nn.Conv2d(squeeze_planes, expand1x1_planes, kernel_size=1)
        self.expand1x1_activation = nn.ReLU(inplace=True)
        self.expand3x3 = nn.Conv2d(squeeze_planes, expand3x3_planes, kernel_size=3, padding=1)
        self.expand3x3_activation = nn.ReLU(inplace=True)

    def forward(self, x):
        x = self.squeeze_activation(self.squeeze(x))
        return torch.cat([self.expand1x1_activation(self.expand1x1(x)),
                          self.expand3x3_activation(self.expand3x3(x))], 1)


class SqueezeNet11(nn.Module):
    """torchvision's squeezenet1_1 at a quarter of its widths (same layer list)."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.num_classes = num_classes
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, kernel_size=3, stride=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
            Fire(16, 4, 16, 16),
            Fire(32, 4, 16, 16),
            nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
            Fire(32, 8, 32, 32),
            Fire(64, 8, 32, 32),
            nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
            Fire(64, 12, 48, 48),
            Fire(96, 12, 48, 48),
            Fire(96, 16, 64, 64),
            Fire(128, 16, 64, 64),
        )
        final_conv = nn.Conv2d(128, self.num_classes, kernel_size=1)
        self.classifier = nn.Sequential(nn.Dropout(p=0.5), final_conv, nn.ReLU(inplace=True),
                                        nn.AdaptiveAvgPool2d((1, 1)))

    def forward(self, x):
        x = self.features(x)
        x = self.classifier(x)
        return torch.flatten(x, 1)


# ----------------------------------------------------------------------------- Res2Net (Res2Net's res2net.py)

class Bottle2neck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None, baseWidth=26, scale=4, stype="normal"):
        super().__init__()
        width = int(math.floor(planes * (baseWidth / 64.0)))
        self.conv1 = nn.Conv2d(inplanes, width * scale, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width * scale)
        self.nums = 1 if scale == 1 else scale - 1
        if stype == "stage":
            self.pool = nn.AvgPool2d(kernel_size=3, stride=stride, padding=1)
        convs, bns = [], []
        for i in range(self.nums):
            convs.append(nn.Conv2d(width, width, kernel_size=3, stride=stride, padding=1, bias=False))
            bns.append(nn.BatchNorm2d(width))
        self.convs = nn.ModuleList(convs)
        self.bns = nn.ModuleList(bns)
        self.conv3 = nn.Conv2d(width * scale, planes * self.expansion, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stype = stype
        self.scale = scale
        self.width = width

    def forward(self, x):
        residual = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        spx = torch.split(out, self.width, 1)
        for i in range(self.nums):
            if i == 0 or self.stype == "stage":
                sp = spx[i]
            else:
                sp = sp + spx[i]
            sp = self.convs[i](sp)
            sp = self.relu(self.bns[i](sp))
            if i == 0:
                out = sp
            else:
                out = torch.cat((out, sp), 1)
        if self.scale != 1 and self.stype == "normal":
            out = torch.cat((out, spx[self.nums]), 1)
        elif self.scale != 1 and self.stype == "stage":
            out = torch.cat((out, self.pool(spx[self.nums])), 1)
        out = self.conv3(out)
        out = self.bn3(out)
        if self.downsample is not None:
            residual = self.downsample(x)
        out += residual
        out = self.relu(out)
        return out


class Res2Net(nn.Module):
    """Res2Net-v1b's layout (deep stem reduced to one conv, avg-pool downsample) with two stages of two
    Bottle2necks, baseWidth 26, scale 4: widths 3 and 6 per scale group."""

    def __init__(self, num_classes=10, layers=(2, 2), baseWidth=26, scale=4):
        super().__init__()
        self.inplanes = 16
        self.baseWidth, self.scale = baseWidth, scale
        self.conv1 = nn.Conv2d(3, 16, kernel_size=3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(Bottle2neck, 8, layers[0])
        self.layer2 = self._make_layer(Bottle2neck, 16, layers[1], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16 * Bottle2neck.expansion, num_classes)

    def _make_layer(self, block, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                nn.AvgPool2d(kernel_size=stride, stride=stride, ceil_mode=True, count_include_pad=False),
                nn.Conv2d(self.inplanes, planes * block.expansion, kernel_size=1, stride=1, bias=False),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample=downsample, stype="stage",
                        baseWidth=self.baseWidth, scale=self.scale)]
        self.inplanes = planes * block.expansion
        for i in range(1, blocks):
            layers.append(block(self.inplanes, planes, baseWidth=self.baseWidth, scale=self.scale))
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.maxpool(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.avgpool(x)
        x = x.view(x.size(0), -1)
        return self.fc(x)


# ----------------------------------------------------------------------------- SKNet (timm selective_kernel.py)

def make_divisible(v, divisor=8, min_value=None, round_limit=0.9):
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < round_limit * v:
        new_v += divisor
    return new_v


def get_padding(kernel_size, stride=1, dilation=1):
    return ((stride - 1) + dilation * (kernel_size - 1)) // 2


class ConvNormAct(nn.Module):
    """timm's ConvNormAct: conv (no bias), BN, optional activation."""

    def __init__(self, in_channels, out_channels, kernel_size=1, stride=1, dilation=1, groups=1, apply_act=True,
                 act_layer=nn.ReLU):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride,
                              padding=get_padding(kernel_size, stride, dilation), dilation=dilation, groups=groups,
                              bias=False)
        self.bn = nn.BatchNorm2d(out_channels)
        self.act = act_layer(inplace=True) if apply_act else nn.Identity()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class SelectiveKernelAttn(nn.Module):
    def __init__(self, channels, num_paths=2, attn_channels=32):
        super().__init__()
        self.num_paths = num_paths
        self.fc_reduce = nn.Conv2d(channels, attn_channels, kernel_size=1, bias=False)
        self.bn = nn.BatchNorm2d(attn_channels)
        self.act = nn.ReLU(inplace=True)
        self.fc_select = nn.Conv2d(attn_channels, channels * num_paths, kernel_size=1, bias=False)

    def forward(self, x):
        assert x.shape[1] == self.num_paths
        x = x.sum(1).mean((2, 3), keepdim=True)
        x = self.fc_reduce(x)
        x = self.bn(x)
        x = self.act(x)
        x = self.fc_select(x)
        B, C, H, W = x.shape
        x = x.view(B, self.num_paths, C // self.num_paths, H, W)
        x = torch.softmax(x, dim=1)
        return x


class SelectiveKernel(nn.Module):
    def __init__(self, in_channels, out_channels=None, kernel_size=None, stride=1, dilation=1, groups=1,
                 rd_ratio=1. / 16, rd_channels=None, rd_divisor=8, keep_3x3=True, split_input=True):
        super().__init__()
        out_channels = out_channels or in_channels
        kernel_size = kernel_size or [3, 5]
        if not isinstance(kernel_size, list):
            kernel_size = [kernel_size] * 2
        if keep_3x3:
            dilation = [dilation * (k - 1) // 2 for k in kernel_size]
            kernel_size = [3] * len(kernel_size)
        else:
            dilation = [dilation] * len(kernel_size)
        self.num_paths = len(kernel_size)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.split_input = split_input
        if self.split_input:
            assert in_channels % self.num_paths == 0
            in_channels = in_channels // self.num_paths
        groups = min(out_channels, groups)
        self.paths = nn.ModuleList([
            ConvNormAct(in_channels, out_channels, kernel_size=k, stride=stride, dilation=d, groups=groups)
            for k, d in zip(kernel_size, dilation)])
        attn_channels = rd_channels or make_divisible(out_channels * rd_ratio, divisor=rd_divisor)
        self.attn = SelectiveKernelAttn(out_channels, self.num_paths, attn_channels)

    def forward(self, x):
        if self.split_input:
            x_split = torch.split(x, self.in_channels // self.num_paths, 1)
            x_paths = [op(x_split[i]) for i, op in enumerate(self.paths)]
        else:
            x_paths = [op(x) for op in self.paths]
        x = torch.stack(x_paths, dim=1)
        x_attn = self.attn(x)
        x = x * x_attn
        x = torch.sum(x, dim=1)
        return x


class SelectiveKernelBasic(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = SelectiveKernel(inplanes, planes, stride=stride, split_input=True)
        self.conv2 = ConvNormAct(planes, planes, kernel_size=3, apply_act=False)
        self.act = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        shortcut = x
        x = self.conv1(x)
        x = self.conv2(x)
        if self.downsample is not None:
            shortcut = self.downsample(shortcut)
        x += shortcut
        x = self.act(x)
        return x


class SKNet(nn.Module):
    """timm's skresnet18 layout (split input, keep_3x3) at widths 16 / 32, one block per stage."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, kernel_size=3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.act1 = nn.ReLU(inplace=True)
        self.layer1 = nn.Sequential(SelectiveKernelBasic(16, 16))
        down = nn.Sequential(nn.Conv2d(16, 32, 1, stride=2, bias=False), nn.BatchNorm2d(32))
        self.layer2 = nn.Sequential(SelectiveKernelBasic(16, 32, stride=2, downsample=down))
        self.global_pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x):
        x = self.act1(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        x = self.global_pool(x).flatten(1)
        return self.fc(x)


# ----------------------------------------------------------------------------- RepVGG (RepVGG's repvgg.py)

def conv_bn(in_channels, out_channels, kernel_size, stride, padding, groups=1):
    result = nn.Sequential()
    result.add_module("conv", nn.Conv2d(in_channels=in_channels, out_channels=out_channels,
                                        kernel_size=kernel_size, stride=stride, padding=padding, groups=groups,
                                        bias=False))
    result.add_module("bn", nn.BatchNorm2d(num_features=out_channels))
    return result


class RepVGGBlock(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1):
        super().__init__()
        assert kernel_size == 3 and padding == 1
        padding_11 = padding - kernel_size // 2
        self.nonlinearity = nn.ReLU()
        self.se = nn.Identity()
        self.rbr_identity = nn.BatchNorm2d(num_features=in_channels) \
            if out_channels == in_channels and stride == 1 else None
        self.rbr_dense = conv_bn(in_channels, out_channels, kernel_size, stride, padding, groups)
        self.rbr_1x1 = conv_bn(in_channels, out_channels, 1, stride, padding_11, groups)

    def forward(self, inputs):
        if self.rbr_identity is None:
            id_out = 0
        else:
            id_out = self.rbr_identity(inputs)
        return self.nonlinearity(self.se(self.rbr_dense(inputs) + self.rbr_1x1(inputs) + id_out))


class RepVGG(nn.Module):
    """RepVGG in its training-time form: stages of (1, 2, 2) blocks at widths 8 / 16 / 32, groups 2 on the odd
    layers of the last stage (override_groups_map, as RepVGG-B1g2)."""

    def __init__(self, num_blocks=(1, 2, 2), num_classes=10, width=(8, 16, 32), override_groups_map=None):
        super().__init__()
        self.override_groups_map = override_groups_map or {4: 2}
        self.in_planes = width[0]
        self.stage0 = RepVGGBlock(3, self.in_planes, kernel_size=3, stride=2, padding=1)
        self.cur_layer_idx = 1
        self.stage1 = self._make_stage(width[0], num_blocks[0], stride=1)
        self.stage2 = self._make_stage(width[1], num_blocks[1], stride=2)
        self.stage3 = self._make_stage(width[2], num_blocks[2], stride=2)
        self.gap = nn.AdaptiveAvgPool2d(output_size=1)
        self.linear = nn.Linear(width[2], num_classes)

    def _make_stage(self, planes, num_blocks, stride):
        strides = [stride] + [1] * (num_blocks - 1)
        blocks = []
        for stride in strides:
            cur_groups = self.override_groups_map.get(self.cur_layer_idx, 1)
            blocks.append(RepVGGBlock(self.in_planes, planes, kernel_size=3, stride=stride, padding=1,
                                      groups=cur_groups))
            self.in_planes = planes
            self.cur_layer_idx += 1
        return nn.ModuleList(blocks)

    def forward(self, x):
        out = self.stage0(x)
        for stage in (self.stage1, self.stage2, self.stage3):
            for block in stage:
                out = block(out)
        out = self.gap(out)
        out = out.view(out.size(0), -1)
        return self.linear(out)


# ----------------------------------------------------------------------------- ConvMixer (locuslab)

class Residual(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x) + x


class ConvMixer(nn.Sequential):
    """ConvMixer-32/2 (kernel 9, patch 4): the paper's nn.Sequential, as a class."""

    def __init__(self, dim=32, depth=2, kernel_size=9, patch_size=4, n_classes=10):
        super().__init__(
            nn.Conv2d(3, dim, kernel_size=patch_size, stride=patch_size),
            nn.GELU(),
            nn.BatchNorm2d(dim),
            *[nn.Sequential(
                Residual(nn.Sequential(
                    nn.Conv2d(dim, dim, kernel_size, groups=dim, padding="same"),
                    nn.GELU(),
                    nn.BatchNorm2d(dim)
                )),
                nn.Conv2d(dim, dim, kernel_size=1),
                nn.GELU(),
                nn.BatchNorm2d(dim)
            ) for i in range(depth)],
            nn.AdaptiveAvgPool2d((1, 1)),
            nn.Flatten(),
            nn.Linear(dim, n_classes)
        )


# ----------------------------------------------------------------------------- Xception (Cadene / timm legacy)

class SeparableConv2d(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size=1, stride=1, padding=0, dilation=1, bias=False):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, in_channels, kernel_size, stride, padding, dilation, groups=in_channels,
                               bias=bias)
        self.pointwise = nn.Conv2d(in_channels, out_channels, 1, 1, 0, 1, 1, bias=bias)

    def forward(self, x):
        x = self.conv1(x)
        x = self.pointwise(x)
        return x


class XceptionBlock(nn.Module):
    def __init__(self, in_filters, out_filters, reps, strides=1, start_with_relu=True, grow_first=True):
        super().__init__()
        if out_filters != in_filters or strides != 1:
            self.skip = nn.Conv2d(in_filters, out_filters, 1, stride=strides, bias=False)
            self.skipbn = nn.BatchNorm2d(out_filters)
        else:
            self.skip = None
        rep = []
        for i in range(reps):
            if grow_first:
                inc = in_filters if i == 0 else out_filters
                outc = out_filters
            else:
                inc = in_filters
                outc = in_filters if i < (reps - 1) else out_filters
            rep.append(nn.ReLU(inplace=True))
            rep.append(SeparableConv2d(inc, outc, 3, stride=1, padding=1))
            rep.append(nn.BatchNorm2d(outc))
        if not start_with_relu:
            rep = rep[1:]
        else:
            rep[0] = nn.ReLU(inplace=False)
        if strides != 1:
            rep.append(nn.MaxPool2d(3, strides, 1))
        self.rep = nn.Sequential(*rep)

    def forward(self, inp):
        x = self.rep(inp)
        if self.skip is not None:
            skip = self.skip(inp)
            skip = self.skipbn(skip)
        else:
            skip = inp
        x += skip
        return x


class Xception(nn.Module):
    """Xception's entry flow (unpadded stem convs, three strided blocks), one middle-flow block and the exit
    flow, at widths 8 ... 128."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, 2, 0, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.act1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(8, 16, 3, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.act2 = nn.ReLU(inplace=True)
        self.block1 = XceptionBlock(16, 32, 2, 2, start_with_relu=False)
        self.block2 = XceptionBlock(32, 48, 2, 2)
        self.block3 = XceptionBlock(48, 64, 2, 2)
        self.block4 = XceptionBlock(64, 64, 3, 1)
        self.block12 = XceptionBlock(64, 96, 2, 2, grow_first=False)
        self.conv3 = SeparableConv2d(96, 128, 3, 1, 1)
        self.bn3 = nn.BatchNorm2d(128)
        self.act3 = nn.ReLU(inplace=True)
        self.global_pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(128, num_classes)

    def forward(self, x):
        x = self.act1(self.bn1(self.conv1(x)))
        x = self.act2(self.bn2(self.conv2(x)))
        x = self.block1(x)
        x = self.block2(x)
        x = self.block3(x)
        x = self.block4(x)
        x = self.block12(x)
        x = self.act3(self.bn3(self.conv3(x)))
        x = self.global_pool(x).flatten(1)
        return self.fc(x)


# ----------------------------------------------------------------------------- DLA (timm dla.py)

class DlaBasic(nn.Module):
    def __init__(self, inplanes, planes, stride=1, dilation=1, **_):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, kernel_size=3, stride=stride, padding=dilation, bias=False,
                               dilation=dilation)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=dilation, bias=False,
                               dilation=dilation)
        self.bn2 = nn.BatchNorm2d(planes)
        self.stride = stride

    def forward(self, x, shortcut: Optional[Tensor] = None, children: Optional[List[Tensor]] = None):
        if shortcut is None:
            shortcut = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        out += shortcut
        out = self.relu(out)
        return out


class DlaRoot(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, shortcut):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 1, stride=1, bias=False, padding=(kernel_size - 1) // 2)
        self.bn = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = shortcut

    def forward(self, x_children: List[Tensor]):
        x = self.conv(torch.cat(x_children, 1))
        x = self.bn(x)
        if self.shortcut:
            x += x_children[0]
        x = self.relu(x)
        return x


class DlaTree(nn.Module):
    def __init__(self, levels, block, in_channels, out_channels, stride=1, dilation=1, level_root=False,
                 root_dim=0, root_kernel_size=1, root_shortcut=False):
        super().__init__()
        if root_dim == 0:
            root_dim = 2 * out_channels
        if level_root:
            root_dim += in_channels
        self.downsample = nn.MaxPool2d(stride, stride=stride) if stride > 1 else nn.Identity()
        self.project = nn.Identity()
        cargs = dict(dilation=dilation)
        if levels == 1:
            self.tree1 = block(in_channels, out_channels, stride, **cargs)
            self.tree2 = block(out_channels, out_channels, 1, **cargs)
            if in_channels != out_channels:
                self.project = nn.Sequential(
                    nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=1, bias=False),
                    nn.BatchNorm2d(out_channels))
            self.root = DlaRoot(root_dim, out_channels, root_kernel_size, root_shortcut)
        else:
            cargs.update(dict(root_kernel_size=root_kernel_size, root_shortcut=root_shortcut))
            self.tree1 = DlaTree(levels - 1, block, in_channels, out_channels, stride, root_dim=0, **cargs)
            self.tree2 = DlaTree(levels - 1, block, out_channels, out_channels, root_dim=root_dim + out_channels,
                                 **cargs)
            self.root = None
        self.level_root = level_root
        self.root_dim = root_dim
        self.levels = levels

    def forward(self, x, shortcut: Optional[Tensor] = None, children: Optional[List[Tensor]] = None):
        if children is None:
            children = []
        bottom = self.downsample(x)
        shortcut = self.project(bottom)
        if self.level_root:
            children.append(bottom)
        x1 = self.tree1(x, shortcut)
        if self.root is not None:  # levels == 1
            x2 = self.tree2(x1)
            x = self.root([x2, x1] + children)
        else:
            children.append(x1)
            x = self.tree2(x1, None, children)
        return x


class DLA(nn.Module):
    """DLA-34's layout (levels 1, 1, 1, 2) at channels 8 / 16 / 16 / 32, residual roots (as DLA-X-102),
    timm's 1x1-conv classifier then flatten."""

    def __init__(self, num_classes=10, levels=(1, 1, 1, 2), channels=(8, 16, 16, 32), residual_root=True):
        super().__init__()
        self.base_layer = nn.Sequential(
            nn.Conv2d(3, channels[0], kernel_size=7, stride=1, padding=3, bias=False),
            nn.BatchNorm2d(channels[0]),
            nn.ReLU(inplace=True))
        self.level0 = self._make_conv_level(channels[0], channels[0], levels[0])
        self.level1 = self._make_conv_level(channels[0], channels[1], levels[1], stride=2)
        cargs = dict(root_shortcut=residual_root)
        self.level2 = DlaTree(levels[2], DlaBasic, channels[1], channels[2], 2, level_root=False, **cargs)
        self.level3 = DlaTree(levels[3], DlaBasic, channels[2], channels[3], 2, level_root=True, **cargs)
        self.global_pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Conv2d(channels[3], num_classes, kernel_size=1, bias=True)
        self.flatten = nn.Flatten(1)

    def _make_conv_level(self, inplanes, planes, convs, stride=1, dilation=1):
        modules = []
        for i in range(convs):
            modules.extend([
                nn.Conv2d(inplanes, planes, kernel_size=3, stride=stride if i == 0 else 1, padding=dilation,
                          bias=False, dilation=dilation),
                nn.BatchNorm2d(planes),
                nn.ReLU(inplace=True)])
            inplanes = planes
        return nn.Sequential(*modules)

    def forward(self, x):
        x = self.base_layer(x)
        x = self.level0(x)
        x = self.level1(x)
        x = self.level2(x)
        x = self.level3(x)
        x = self.global_pool(x)
        x = self.fc(x)
        return self.flatten(x)


# ----------------------------------------------------------------------------- HRNet (HRNet-Image-Classification)

class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        residual = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            residual = self.downsample(x)
        out += residual
        out = self.relu(out)
        return out


class HighResolutionModule(nn.Module):
    def __init__(self, num_branches, block, num_blocks, num_inchannels, num_channels, multi_scale_output=True):
        super().__init__()
        self.num_inchannels = list(num_inchannels)
        self.num_branches = num_branches
        self.multi_scale_output = multi_scale_output
        self.branches = nn.ModuleList([
            nn.Sequential(*[block(self.num_inchannels[i], num_channels[i]) for _ in range(num_blocks[i])])
            for i in range(num_branches)])
        self.fuse_layers = self._make_fuse_layers()
        self.relu = nn.ReLU(False)

    def _make_fuse_layers(self):
        num_branches = self.num_branches
        num_inchannels = self.num_inchannels
        fuse_layers = []
        for i in range(num_branches if self.multi_scale_output else 1):
            fuse_layer = []
            for j in range(num_branches):
                if j > i:
                    fuse_layer.append(nn.Sequential(
                        nn.Conv2d(num_inchannels[j], num_inchannels[i], 1, 1, 0, bias=False),
                        nn.BatchNorm2d(num_inchannels[i]),
                        nn.Upsample(scale_factor=2 ** (j - i), mode="nearest")))
                elif j == i:
                    fuse_layer.append(None)
                else:
                    conv3x3s = []
                    for k in range(i - j):
                        if k == i - j - 1:
                            num_outchannels_conv3x3 = num_inchannels[i]
                            conv3x3s.append(nn.Sequential(
                                nn.Conv2d(num_inchannels[j], num_outchannels_conv3x3, 3, 2, 1, bias=False),
                                nn.BatchNorm2d(num_outchannels_conv3x3)))
                        else:
                            num_outchannels_conv3x3 = num_inchannels[j]
                            conv3x3s.append(nn.Sequential(
                                nn.Conv2d(num_inchannels[j], num_outchannels_conv3x3, 3, 2, 1, bias=False),
                                nn.BatchNorm2d(num_outchannels_conv3x3),
                                nn.ReLU(False)))
                    fuse_layer.append(nn.Sequential(*conv3x3s))
            fuse_layers.append(nn.ModuleList(fuse_layer))
        return nn.ModuleList(fuse_layers)

    def forward(self, x):
        if self.num_branches == 1:
            return [self.branches[0](x[0])]
        for i in range(self.num_branches):
            x[i] = self.branches[i](x[i])
        x_fuse = []
        for i in range(len(self.fuse_layers)):
            y = x[0] if i == 0 else self.fuse_layers[i][0](x[0])
            for j in range(1, self.num_branches):
                if i == j:
                    y = y + x[j]
                else:
                    y = y + self.fuse_layers[i][j](x[j])
            x_fuse.append(self.relu(y))
        return x_fuse


def _conv_bn_relu(cin, cout, stride):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class HRNet(nn.Module):
    """HRNet-W8-ish: a stem, stage 2 (two branches), stage 3 (three branches, stride 4 / 8 / 16), the
    classification head (per-branch increase, strided merges, final 1x1, avg-pool over y.size()[2:])."""

    def __init__(self, num_classes=10, channels=(8, 16, 32)):
        super().__init__()
        c0, c1, c2 = channels
        self.conv1 = nn.Conv2d(3, 16, kernel_size=3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.transition1 = nn.ModuleList([_conv_bn_relu(16, c0, 1), _conv_bn_relu(16, c1, 2)])
        self.stage2 = nn.Sequential(HighResolutionModule(2, BasicBlock, [1, 1], [c0, c1], [c0, c1]))
        self.transition2 = nn.ModuleList([None, None, _conv_bn_relu(c1, c2, 2)])
        self.stage3 = nn.Sequential(HighResolutionModule(3, BasicBlock, [1, 1, 1], [c0, c1, c2], [c0, c1, c2]))
        head = [16, 32, 64]
        self.incre_modules = nn.ModuleList([
            nn.Sequential(nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU(inplace=True))
            for c, h in zip(channels, head)])
        self.downsamp_modules = nn.ModuleList([_conv_bn_relu(head[i], head[i + 1], 2) for i in range(2)])
        self.final_layer = nn.Sequential(nn.Conv2d(head[2], 96, 1), nn.BatchNorm2d(96), nn.ReLU(inplace=True))
        self.classifier = nn.Linear(96, num_classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x_list = []
        for i in range(2):
            x_list.append(self.transition1[i](x))
        y_list = self.stage2(x_list)
        x_list = []
        for i in range(3):
            if self.transition2[i] is not None:
                x_list.append(self.transition2[i](y_list[-1]))
            else:
                x_list.append(y_list[i])
        y_list = self.stage3(x_list)
        y = self.incre_modules[0](y_list[0])
        for i in range(len(self.downsamp_modules)):
            y = self.incre_modules[i + 1](y_list[i + 1]) + self.downsamp_modules[i](y)
        y = self.final_layer(y)
        y = F.avg_pool2d(y, kernel_size=y.size()[2:]).view(y.size(0), -1)
        return self.classifier(y)


# ----------------------------------------------------------------------------- EfficientNetV2 (torchvision + timm)

class Conv2dNormActivation(nn.Sequential):
    """torchvision.ops.Conv2dNormActivation: conv (no bias), BN, activation (or none)."""

    def __init__(self, cin, cout, kernel_size=3, stride=1, groups=1, activation_layer=nn.SiLU):
        layers = [nn.Conv2d(cin, cout, kernel_size, stride, (kernel_size - 1) // 2, groups=groups, bias=False),
                  nn.BatchNorm2d(cout, eps=1e-3)]
        if activation_layer is not None:
            layers.append(activation_layer(inplace=True))
        super().__init__(*layers)


class SqueezeExcite(nn.Module):
    """timm's SqueezeExcite: x.mean((2, 3), keepdim=True), reduce, act, expand, x * sigmoid."""

    def __init__(self, in_chs, rd_channels, act_layer=nn.SiLU):
        super().__init__()
        self.conv_reduce = nn.Conv2d(in_chs, rd_channels, 1, bias=True)
        self.act1 = act_layer(inplace=True)
        self.conv_expand = nn.Conv2d(rd_channels, in_chs, 1, bias=True)
        self.gate = nn.Sigmoid()

    def forward(self, x):
        x_se = x.mean((2, 3), keepdim=True)
        x_se = self.conv_reduce(x_se)
        x_se = self.act1(x_se)
        x_se = self.conv_expand(x_se)
        return x * self.gate(x_se)


class StochasticDepth(nn.Module):
    """torchvision.ops.StochasticDepth: the identity in eval mode (and here with p = 0 in training too)."""

    def __init__(self, p: float, mode: str):
        super().__init__()
        self.p, self.mode = p, mode

    def forward(self, input):
        if not self.training or self.p == 0.0:
            return input
        survival_rate = 1.0 - self.p
        size = [input.shape[0]] + [1] * (input.ndim - 1) if self.mode == "row" else [1] * input.ndim
        noise = torch.empty(size, dtype=input.dtype, device=input.device).bernoulli_(survival_rate)
        return input * noise.div_(survival_rate)


class FusedMBConv(nn.Module):
    """torchvision's FusedMBConv, with timm EdgeResidual's optional SE between the expand and the project."""

    def __init__(self, inp, out, expand_ratio, kernel, stride, se=False, sd_prob=0.0):
        super().__init__()
        self.use_res_connect = stride == 1 and inp == out
        layers = []
        expanded_channels = inp * expand_ratio
        if expanded_channels != inp:
            layers.append(Conv2dNormActivation(inp, expanded_channels, kernel_size=kernel, stride=stride))
            if se:
                layers.append(SqueezeExcite(expanded_channels, max(1, inp // 4)))
            layers.append(Conv2dNormActivation(expanded_channels, out, kernel_size=1, activation_layer=None))
        else:
            layers.append(Conv2dNormActivation(inp, out, kernel_size=kernel, stride=stride))
        self.block = nn.Sequential(*layers)
        self.stochastic_depth = StochasticDepth(sd_prob, "row")

    def forward(self, input):
        result = self.block(input)
        if self.use_res_connect:
            result = self.stochastic_depth(result)
            result += input
        return result


class MBConvV2(nn.Module):
    """torchvision's MBConv (EfficientNetV2 stages 4-6): expand 1x1, depthwise, SE, project."""

    def __init__(self, inp, out, expand_ratio, kernel, stride, sd_prob=0.0):
        super().__init__()
        self.use_res_connect = stride == 1 and inp == out
        expanded_channels = inp * expand_ratio
        layers = []
        if expanded_channels != inp:
            layers.append(Conv2dNormActivation(inp, expanded_channels, kernel_size=1))
        layers.append(Conv2dNormActivation(expanded_channels, expanded_channels, kernel_size=kernel, stride=stride,
                                           groups=expanded_channels))
        layers.append(SqueezeExcite(expanded_channels, max(1, inp // 4)))
        layers.append(Conv2dNormActivation(expanded_channels, out, kernel_size=1, activation_layer=None))
        self.block = nn.Sequential(*layers)
        self.stochastic_depth = StochasticDepth(sd_prob, "row")

    def forward(self, input):
        result = self.block(input)
        if self.use_res_connect:
            result = self.stochastic_depth(result)
            result += input
        return result


class EfficientNetV2(nn.Module):
    """EfficientNetV2-S's block kinds in order: FusedMBConv e1 (no expansion), e4 strided, e4 with SE, then
    MBConv e4 with SE (strided and residual); stem / head as torchvision."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.features = nn.Sequential(
            Conv2dNormActivation(3, 16, 3, 2),
            nn.Sequential(FusedMBConv(16, 16, 1, 3, 1, sd_prob=0.1)),
            nn.Sequential(FusedMBConv(16, 24, 4, 3, 2), FusedMBConv(24, 24, 4, 3, 1, se=True, sd_prob=0.1)),
            nn.Sequential(MBConvV2(24, 32, 4, 3, 2), MBConvV2(32, 32, 4, 3, 1, sd_prob=0.1)),
            Conv2dNormActivation(32, 64, 1),
        )
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(p=0.2, inplace=True), nn.Linear(64, num_classes))

    def forward(self, x):
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


# ----------------------------------------------------------------------------- GhostNetV2 (ghostnetv2_pytorch)

def hard_sigmoid(x, inplace: bool = False):
    if inplace:
        return x.add_(3.).clamp_(0., 6.).div_(6.)
    else:
        return F.relu6(x + 3.) / 6.


class GhostV2SE(nn.Module):
    def __init__(self, in_chs, se_ratio=0.25, divisor=4):
        super().__init__()
        self.gate_fn = hard_sigmoid
        reduced_chs = make_divisible(in_chs * se_ratio, divisor)
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        self.conv_reduce = nn.Conv2d(in_chs, reduced_chs, 1, bias=True)
        self.act1 = nn.ReLU(inplace=True)
        self.conv_expand = nn.Conv2d(reduced_chs, in_chs, 1, bias=True)

    def forward(self, x):
        x_se = self.avg_pool(x)
        x_se = self.conv_reduce(x_se)
        x_se = self.act1(x_se)
        x_se = self.conv_expand(x_se)
        x = x * self.gate_fn(x_se)
        return x


class GhostModuleV2(nn.Module):
    def __init__(self, inp, oup, kernel_size=1, ratio=2, dw_size=3, stride=1, relu=True, mode=None):
        super().__init__()
        self.mode = mode
        self.gate_fn = nn.Sigmoid()
        self.oup = oup
        init_channels = math.ceil(oup / ratio)
        new_channels = init_channels * (ratio - 1)
        self.primary_conv = nn.Sequential(
            nn.Conv2d(inp, init_channels, kernel_size, stride, kernel_size // 2, bias=False),
            nn.BatchNorm2d(init_channels),
            nn.ReLU(inplace=True) if relu else nn.Sequential(),
        )
        self.cheap_operation = nn.Sequential(
            nn.Conv2d(init_channels, new_channels, dw_size, 1, dw_size // 2, groups=init_channels, bias=False),
            nn.BatchNorm2d(new_channels),
            nn.ReLU(inplace=True) if relu else nn.Sequential(),
        )
        if self.mode in ["attn"]:
            self.short_conv = nn.Sequential(
                nn.Conv2d(inp, oup, kernel_size, stride, kernel_size // 2, bias=False),
                nn.BatchNorm2d(oup),
                nn.Conv2d(oup, oup, kernel_size=(1, 5), stride=1, padding=(0, 2), groups=oup, bias=False),
                nn.BatchNorm2d(oup),
                nn.Conv2d(oup, oup, kernel_size=(5, 1), stride=1, padding=(2, 0), groups=oup, bias=False),
                nn.BatchNorm2d(oup),
            )

    def forward(self, x):
        if self.mode in ["original"]:
            x1 = self.primary_conv(x)
            x2 = self.cheap_operation(x1)
            out = torch.cat([x1, x2], dim=1)
            return out[:, :self.oup, :, :]
        elif self.mode in ["attn"]:
            res = self.short_conv(F.avg_pool2d(x, kernel_size=2, stride=2))
            x1 = self.primary_conv(x)
            x2 = self.cheap_operation(x1)
            out = torch.cat([x1, x2], dim=1)
            return out[:, :self.oup, :, :] * F.interpolate(self.gate_fn(res), size=(out.shape[-2], out.shape[-1]),
                                                           mode="nearest")


class GhostBottleneckV2(nn.Module):
    def __init__(self, in_chs, mid_chs, out_chs, dw_kernel_size=3, stride=1, se_ratio=0., layer_id=None):
        super().__init__()
        has_se = se_ratio is not None and se_ratio > 0.
        self.stride = stride
        if layer_id <= 1:
            self.ghost1 = GhostModuleV2(in_chs, mid_chs, relu=True, mode="original")
        else:
            self.ghost1 = GhostModuleV2(in_chs, mid_chs, relu=True, mode="attn")
        if self.stride > 1:
            self.conv_dw = nn.Conv2d(mid_chs, mid_chs, dw_kernel_size, stride=stride,
                                     padding=(dw_kernel_size - 1) // 2, groups=mid_chs, bias=False)
            self.bn_dw = nn.BatchNorm2d(mid_chs)
        self.se = GhostV2SE(mid_chs, se_ratio=se_ratio) if has_se else None
        self.ghost2 = GhostModuleV2(mid_chs, out_chs, relu=False, mode="original")
        if in_chs == out_chs and self.stride == 1:
            self.shortcut = nn.Sequential()
        else:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_chs, in_chs, dw_kernel_size, stride=stride, padding=(dw_kernel_size - 1) // 2,
                          groups=in_chs, bias=False),
                nn.BatchNorm2d(in_chs),
                nn.Conv2d(in_chs, out_chs, 1, stride=1, padding=0, bias=False),
                nn.BatchNorm2d(out_chs),
            )

    def forward(self, x):
        residual = x
        x = self.ghost1(x)
        if self.stride > 1:
            x = self.conv_dw(x)
            x = self.bn_dw(x)
        if self.se is not None:
            x = self.se(x)
        x = self.ghost2(x)
        x += self.shortcut(residual)
        return x


class GhostNetV2(nn.Module):
    """GhostNetV2 1.0x's first four bottlenecks (layer ids 0-3: two 'original', two DFC-attention ghost1s, the
    last with SE), stem and head as the paper's code."""

    CFGS = [[3, 16, 16, 0, 1], [3, 48, 24, 0, 2], [3, 72, 24, 0, 1], [5, 72, 40, 0.25, 2]]

    def __init__(self, num_classes=10, dropout=0.2):
        super().__init__()
        self.dropout = dropout
        self.conv_stem = nn.Conv2d(3, 16, 3, 2, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.act1 = nn.ReLU(inplace=True)
        input_channel = 16
        stages = []
        for layer_id, (k, exp_size, c, se_ratio, s) in enumerate(self.CFGS):
            output_channel = make_divisible(c, 4)
            hidden_channel = make_divisible(exp_size, 4)
            stages.append(nn.Sequential(GhostBottleneckV2(input_channel, hidden_channel, output_channel, k, s,
                                                          se_ratio=se_ratio, layer_id=layer_id)))
            input_channel = output_channel
        stages.append(nn.Sequential(nn.Conv2d(input_channel, 96, 1, bias=False), nn.BatchNorm2d(96),
                                    nn.ReLU(inplace=True)))
        self.blocks = nn.Sequential(*stages)
        self.global_pool = nn.AdaptiveAvgPool2d((1, 1))
        self.conv_head = nn.Conv2d(96, 128, 1, 1, 0, bias=True)
        self.act2 = nn.ReLU(inplace=True)
        self.classifier = nn.Linear(128, num_classes)

    def forward(self, x):
        x = self.conv_stem(x)
        x = self.bn1(x)
        x = self.act1(x)
        x = self.blocks(x)
        x = self.global_pool(x)
        x = self.conv_head(x)
        x = self.act2(x)
        x = x.view(x.size(0), -1)
        if self.dropout > 0.:
            x = F.dropout(x, p=self.dropout, training=self.training)
        return self.classifier(x)


# ----------------------------------------------------------------------------- registry

FAMILIES = {
    # name: (builder(num_classes), input shape); the odd sizes exercise ceil-mode pools (SqueezeNet: 50 ->
    # 24 -> 12 -> 6 -> 3, every pool rounding up; Res2Net's v1b downsample AvgPool2d(2, ceil_mode=True,
    # count_include_pad=False) 9 -> 5, its last window partial) and a nearest resize by a non-integer factor
    # (GhostNetV2: the DFC gate at 5x5 back to 11x11)
    "densenet": (lambda nc: DenseNet(nc), (2, 3, 32, 32)),
    "squeezenet1_1": (lambda nc: SqueezeNet11(nc), (2, 3, 50, 50)),
    "res2net": (lambda nc: Res2Net(nc), (2, 3, 36, 36)),
    "sknet": (lambda nc: SKNet(nc), (2, 3, 32, 32)),
    "repvgg": (lambda nc: RepVGG(num_classes=nc), (2, 3, 32, 32)),
    "convmixer": (lambda nc: ConvMixer(n_classes=nc), (2, 3, 40, 40)),
    "xception": (lambda nc: Xception(nc), (2, 3, 64, 64)),
    "dla": (lambda nc: DLA(nc), (2, 3, 32, 32)),
    "hrnet": (lambda nc: HRNet(nc), (2, 3, 32, 32)),
    "efficientnet_v2": (lambda nc: EfficientNetV2(nc), (2, 3, 32, 32)),
    "ghostnet_v2": (lambda nc: GhostNetV2(nc), (2, 3, 44, 44)),
}


def build(name: str, num_classes: int = 10, seed: int = 0, train: bool = False) -> nn.Module:
    """Family `name` with its BatchNorms randomized (seeded), in eval mode. train=True: without the random
    parts a training step draws in PyTorch (StochasticDepth's p and GhostNetV2's functional dropout set to 0;
    nn.Dropout is left to the caller), so one step can be compared with the Trainer's."""
    m = randomize(FAMILIES[name][0](num_classes), seed).eval()
    if train:
        for mod in m.modules():
            if isinstance(mod, StochasticDepth):
                mod.p = 0.0
            if isinstance(mod, GhostNetV2):
                mod.dropout = 0.0
    return m
