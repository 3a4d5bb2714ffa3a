"""PyTorch definitions of six more CNN / hybrid vision families, written the way their reference code writes them
(tests only; torchvision / timm are not dependencies): reduced widths, depths and input sizes, the same block
structure and forward-pass idioms.

  ResNeSt          zhanghang1989/ResNeSt splat.py + resnet.py: SplAtConv2d with radix 2, cardinality 1
                   (torch.split(x, rchannel // radix, dim=1), gap = sum(splited) (Python sum from 0),
                   F.adaptive_avg_pool2d(gap, 1), rSoftMax: view(batch, cardinality, radix, -1).transpose(1, 2),
                   F.softmax(dim=1), reshape(batch, -1); out = sum([att * split ...])), avd AvgPool2d(3, stride,
                   padding=1) after the split attention, deep stem, avg_down downsample (AvgPool2d(stride,
                   ceil_mode=True, count_include_pad=False) -> 1x1 conv -> BN, the 1x1 "pool" in stage 1),
                   `out += residual`, ReLU(inplace=True)
  SegFormer        NVlabs SegFormer mix_transformer.py (MiT) + segformer_head.py: OverlapPatchEmbed (conv 7/4 and
                   3/2, flatten(2).transpose(1, 2), LayerNorm, returns x, H, W), efficient self-attention (q Linear,
                   spatial-reduction conv on x.permute(0, 2, 1).reshape(B, C, H, W) + LayerNorm, kv Linear,
                   reshape(B, -1, 2, heads, C // heads).permute(2, 0, 3, 1, 4), kv[0] / kv[1]), Mix-FFN (Linear ->
                   DWConv on x.transpose(1, 2).view(B, C, H, W) -> GELU -> Linear), per-stage
                   reshape(B, H, W, -1).permute(0, 3, 1, 2).contiguous(); All-MLP decode head (flatten(2)
                   .transpose(1, 2) Linear, .permute(0, 2, 1).reshape(n, -1, h, w), F.interpolate(bilinear,
                   align_corners=False) to the 1/4 size, torch.cat, ConvModule 1x1 + BN + ReLU, Dropout2d,
                   1x1 classifier); output (N, num_classes, H / 4, W / 4)
  MobileViT v1     apple/ml-cvnets mobilevit.py / mobilevit_block.py: InvertedResidual (MV2) with SiLU,
                   MobileViTBlock (local 3x3 + 1x1, `unfolding` / `folding` by reshape / transpose with
                   patch_h = patch_w = 2 and the info dict, F.interpolate only when not divisible),
                   TransformerEncoder (pre-norm, cvnets MultiHeadAttention: qkv_proj(x).reshape(b, S, 3, h, -1)
                   .transpose(1, 3), qkv[:, :, 0], softmax of attn.float()), fusion conv on torch.cat((res, fm), 1),
                   GlobalPool mean(dim=[-2, -1])
  ConvNeXt V2      facebookresearch/ConvNeXt-V2 convnextv2.py + utils.py: Block (depthwise 7x7, permute(0, 2, 3, 1),
                   LayerNorm, Linear, GELU, GRN: torch.norm(x, p=2, dim=(1, 2), keepdim=True), Gx / (Gx.mean(-1) +
                   1e-6), gamma * (x * Nx) + beta + x; Linear, permute back, input + drop_path(x)), channels_first
                   LayerNorm written out (u = x.mean(1, keepdim=True); s = (x - u).pow(2).mean(1, keepdim=True)),
                   stem 4/4 conv, 2/2 downsample convs, norm(x.mean([-2, -1]))
  EfficientViT     mit-han-lab/efficientvit (the classification "B" backbone, ops.py as released with
                   EfficientViT-B / timm efficientvit_mit.py): LiteMLA (qkv 1x1, multi-scale aggregation depthwise
                   5x5 + grouped 1x1 (groups 3 * heads), torch.cat, reshape(B, -1, 3 * dim, H * W), transpose,
                   q / k / v by slicing, ReLU kernel, F.pad(v, (0, 1), value=1), k^T v, q (k^T v),
                   out[..., :-1] / (out[..., -1:] + eps)), ResidualBlock / IdentityLayer / OpSequential, DSConv and
                   MBConv with Hardswish, ClsHead (1x1 ConvLayer, AdaptiveAvgPool2d, LinearLayer + LayerNorm)
  MaxViT           timm maxxvit.py (MaxxVitCfg defaults, 'M' blocks as maxvit_tiny): Stem, MbConvBlock (pre-norm BN,
                   1x1 -> BN-GELU -> depthwise 3x3 (stride in the dw) -> BN-GELU -> SE (x.mean((2, 3),
                   keepdim=True), SiLU) -> 1x1, Downsample2d avg2 + 1x1 shortcut), PartitionAttentionCl block /
                   grid (window_partition / grid_partition by view / permute, reversed), AttentionCl (qkv(x)
                   .view(B, -1, heads, dim_head * 3).transpose(1, 2).chunk(3, dim=3)), RelPosBias
                   (table[relative_position_index].view(bias_shape).permute(2, 0, 1)), NHWC LayerNorms,
                   NormMlpClassifierHead (LayerNorm2d, Linear + Tanh pre-logits)

FAMILIES maps a name to (builder(num_classes), input shape (N, C, H, W)); `_randomize_extra` gives BatchNorm
non-trivial statistics (the house `randomize`) and, from the same seed, LayerNorm / GroupNorm affine parameters,
GRN gamma / beta, layer scales and the relative-position bias tables non-trivial values.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from modern_models import randomize          # non-trivial BN statistics, the house helper


def make_divisible(v, divisor=8, min_value=None, round_limit=.9):
    """timm / cvnets make_divisible."""
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < round_limit * v:
        new_v += divisor
    return new_v


def drop_path(x, drop_prob: float = 0., training: bool = False, scale_by_keep: bool = True):
    """timm drop_path."""
    if drop_prob == 0. or not training:
        return x
    keep_prob = 1 - drop_prob
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    random_tensor = x.new_empty(shape).bernoulli_(keep_prob)
    if keep_prob > 0.0 and scale_by_keep:
        random_tensor.div_(keep_prob)
    return x * random_tensor


class DropPath(nn.Module):
    """timm DropPath: the identity in eval mode (and with drop_prob = 0 after build(train=True))."""

    def __init__(self, drop_prob: float = 0., scale_by_keep: bool = True):
        super().__init__()
        self.drop_prob = drop_prob
        self.scale_by_keep = scale_by_keep

    def forward(self, x):
        return drop_path(x, self.drop_prob, self.training, self.scale_by_keep)


# ============================================================================= ResNeSt (zhanghang1989/ResNeSt)

class rSoftMax(nn.Module):
    def __init__(self, radix, cardinality):
        super().__init__()
        self.radix = radix
        self.cardinality = cardinality

    def forward(self, x):
        batch = x.size(0)
        if self.radix > 1:
            x = x.view(batch, self.cardinality, self.radix, -1).transpose(1, 2)
            x = F.softmax(x, dim=1)
            x = x.reshape(batch, -1)
        else:
            x = torch.sigmoid(x)
        return x


class SplAtConv2d(nn.Module):
    """Split-Attention Conv2d."""

    def __init__(self, in_channels, channels, kernel_size, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1,
                 bias=True, radix=2, reduction_factor=4, norm_layer=None, dropblock_prob=0.0):
        super().__init__()
        inter_channels = max(in_channels * radix // reduction_factor, 32)
        self.radix = radix
        self.cardinality = groups
        self.channels = channels
        self.dropblock_prob = dropblock_prob
        self.conv = nn.Conv2d(in_channels, channels * radix, kernel_size, stride, padding, dilation,
                              groups=groups * radix, bias=bias)
        self.use_bn = norm_layer is not None
        if self.use_bn:
            self.bn0 = norm_layer(channels * radix)
        self.relu = nn.ReLU(inplace=True)
        self.fc1 = nn.Conv2d(channels, inter_channels, 1, groups=self.cardinality)
        if self.use_bn:
            self.bn1 = norm_layer(inter_channels)
        self.fc2 = nn.Conv2d(inter_channels, channels * radix, 1, groups=self.cardinality)
        self.rsoftmax = rSoftMax(radix, groups)

    def forward(self, x):
        x = self.conv(x)
        if self.use_bn:
            x = self.bn0(x)
        x = self.relu(x)

        batch, rchannel = x.shape[:2]
        if self.radix > 1:
            splited = torch.split(x, rchannel // self.radix, dim=1)
            gap = sum(splited)
        else:
            gap = x
        gap = F.adaptive_avg_pool2d(gap, 1)
        gap = self.fc1(gap)

        if self.use_bn:
            gap = self.bn1(gap)
        gap = self.relu(gap)

        atten = self.fc2(gap)
        atten = self.rsoftmax(atten).view(batch, -1, 1, 1)

        if self.radix > 1:
            attens = torch.split(atten, rchannel // self.radix, dim=1)
            out = sum([att * split for (att, split) in zip(attens, splited)])
        else:
            out = atten * x
        return out.contiguous()


class ResNeStBottleneck(nn.Module):
    """ResNeSt Bottleneck (radix >= 1: SplAtConv2d carries its own BN / ReLU)."""
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None, radix=1, cardinality=1, bottleneck_width=64,
                 avd=False, avd_first=False, dilation=1, is_first=False, norm_layer=None):
        super().__init__()
        group_width = int(planes * (bottleneck_width / 64.)) * cardinality
        self.conv1 = nn.Conv2d(inplanes, group_width, kernel_size=1, bias=False)
        self.bn1 = norm_layer(group_width)
        self.radix = radix
        self.avd = avd and (stride > 1 or is_first)
        self.avd_first = avd_first

        if self.avd:
            self.avd_layer = nn.AvgPool2d(3, stride, padding=1)
            stride = 1

        if radix >= 1:
            self.conv2 = SplAtConv2d(group_width, group_width, kernel_size=3, stride=stride, padding=dilation,
                                     dilation=dilation, groups=cardinality, bias=False, radix=radix,
                                     norm_layer=norm_layer)
        else:
            self.conv2 = nn.Conv2d(group_width, group_width, kernel_size=3, stride=stride, padding=dilation,
                                   dilation=dilation, groups=cardinality, bias=False)
            self.bn2 = norm_layer(group_width)

        self.conv3 = nn.Conv2d(group_width, planes * 4, kernel_size=1, bias=False)
        self.bn3 = norm_layer(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.dilation = dilation
        self.stride = stride

    def forward(self, x):
        residual = x

        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)

        if self.avd and self.avd_first:
            out = self.avd_layer(out)

        out = self.conv2(out)
        if self.radix == 0:
            out = self.bn2(out)
            out = self.relu(out)

        if self.avd and not self.avd_first:
            out = self.avd_layer(out)

        out = self.conv3(out)
        out = self.bn3(out)

        if self.downsample is not None:
            residual = self.downsample(x)

        out += residual
        out = self.relu(out)

        return out


class GlobalAvgPool2d(nn.Module):
    def forward(self, inputs):
        return nn.functional.adaptive_avg_pool2d(inputs, 1).view(inputs.size(0), -1)


class ResNeSt(nn.Module):
    """ResNeSt (resnest50 settings: radix 2, cardinality 1, deep stem, avg_down, avd) at three stages."""

    def __init__(self, num_classes=10, layers=(1, 1, 1), planes=(8, 16, 32), radix=2, groups=1, bottleneck_width=64,
                 stem_width=8, avg_down=True, avd=True, avd_first=False, final_drop=0.0, norm_layer=nn.BatchNorm2d):
        super().__init__()
        block = ResNeStBottleneck
        self.cardinality = groups
        self.bottleneck_width = bottleneck_width
        self.inplanes = stem_width * 2
        self.avg_down = avg_down
        self.radix = radix
        self.avd = avd
        self.avd_first = avd_first
        self.conv1 = nn.Sequential(
            nn.Conv2d(3, stem_width, kernel_size=3, stride=2, padding=1, bias=False),
            norm_layer(stem_width),
            nn.ReLU(inplace=True),
            nn.Conv2d(stem_width, stem_width, kernel_size=3, stride=1, padding=1, bias=False),
            norm_layer(stem_width),
            nn.ReLU(inplace=True),
            nn.Conv2d(stem_width, self.inplanes, kernel_size=3, stride=1, padding=1, bias=False),
        )
        self.bn1 = norm_layer(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, planes[0], layers[0], norm_layer=norm_layer, is_first=False)
        self.layer2 = self._make_layer(block, planes[1], layers[1], stride=2, norm_layer=norm_layer)
        self.layer3 = self._make_layer(block, planes[2], layers[2], stride=2, norm_layer=norm_layer)
        self.avgpool = GlobalAvgPool2d()
        self.drop = nn.Dropout(final_drop) if final_drop > 0.0 else None
        self.fc = nn.Linear(planes[2] * block.expansion, num_classes)

    def _make_layer(self, block, planes, blocks, stride=1, dilation=1, norm_layer=None, is_first=True):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            down_layers = []
            if self.avg_down:
                if dilation == 1:
                    down_layers.append(nn.AvgPool2d(kernel_size=stride, stride=stride,
                                                    ceil_mode=True, count_include_pad=False))
                else:
                    down_layers.append(nn.AvgPool2d(kernel_size=1, stride=1,
                                                    ceil_mode=True, count_include_pad=False))
                down_layers.append(nn.Conv2d(self.inplanes, planes * block.expansion,
                                             kernel_size=1, stride=1, bias=False))
            else:
                down_layers.append(nn.Conv2d(self.inplanes, planes * block.expansion,
                                             kernel_size=1, stride=stride, bias=False))
            down_layers.append(norm_layer(planes * block.expansion))
            downsample = nn.Sequential(*down_layers)

        layers = [block(self.inplanes, planes, stride, downsample=downsample, radix=self.radix,
                        cardinality=self.cardinality, bottleneck_width=self.bottleneck_width, avd=self.avd,
                        avd_first=self.avd_first, dilation=1, is_first=is_first, norm_layer=norm_layer)]
        self.inplanes = planes * block.expansion
        for i in range(1, blocks):
            layers.append(block(self.inplanes, planes, radix=self.radix, cardinality=self.cardinality,
                                bottleneck_width=self.bottleneck_width, avd=self.avd, avd_first=self.avd_first,
                                dilation=dilation, norm_layer=norm_layer))
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.maxpool(x)

        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)

        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        if self.drop:
            x = self.drop(x)
        x = self.fc(x)
        return x


# ============================================================================= SegFormer (NVlabs MiT + All-MLP head)

class MitMlp(nn.Module):
    """mix_transformer.Mlp: the Mix-FFN."""

    def __init__(self, in_features, hidden_features=None, out_features=None, act_layer=nn.GELU, drop=0.):
        super().__init__()
        out_features = out_features or in_features
        hidden_features = hidden_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.dwconv = DWConv(hidden_features)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x, H, W):
        x = self.fc1(x)
        x = self.dwconv(x, H, W)
        x = self.act(x)
        x = self.drop(x)
        x = self.fc2(x)
        x = self.drop(x)
        return x


class MitAttention(nn.Module):
    """Efficient self-attention with spatial reduction."""

    def __init__(self, dim, num_heads=8, qkv_bias=False, qk_scale=None, attn_drop=0., proj_drop=0., sr_ratio=1):
        super().__init__()
        assert dim % num_heads == 0, f"dim {dim} should be divided by num_heads {num_heads}."
        self.dim = dim
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.scale = qk_scale or head_dim ** -0.5

        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

        self.sr_ratio = sr_ratio
        if sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, kernel_size=sr_ratio, stride=sr_ratio)
            self.norm = nn.LayerNorm(dim)

    def forward(self, x, H, W):
        B, N, C = x.shape
        q = self.q(x).reshape(B, N, self.num_heads, C // self.num_heads).permute(0, 2, 1, 3)

        if self.sr_ratio > 1:
            x_ = x.permute(0, 2, 1).reshape(B, C, H, W)
            x_ = self.sr(x_).reshape(B, C, -1).permute(0, 2, 1)
            x_ = self.norm(x_)
            kv = self.kv(x_).reshape(B, -1, 2, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        else:
            kv = self.kv(x).reshape(B, -1, 2, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        k, v = kv[0], kv[1]

        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = attn.softmax(dim=-1)
        attn = self.attn_drop(attn)

        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        x = self.proj(x)
        x = self.proj_drop(x)
        return x


class MitBlock(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio=4., qkv_bias=False, qk_scale=None, drop=0., attn_drop=0.,
                 drop_path=0., act_layer=nn.GELU, norm_layer=nn.LayerNorm, sr_ratio=1):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = MitAttention(dim, num_heads=num_heads, qkv_bias=qkv_bias, qk_scale=qk_scale,
                                 attn_drop=attn_drop, proj_drop=drop, sr_ratio=sr_ratio)
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = norm_layer(dim)
        mlp_hidden_dim = int(dim * mlp_ratio)
        self.mlp = MitMlp(in_features=dim, hidden_features=mlp_hidden_dim, act_layer=act_layer, drop=drop)

    def forward(self, x, H, W):
        x = x + self.drop_path(self.attn(self.norm1(x), H, W))
        x = x + self.drop_path(self.mlp(self.norm2(x), H, W))
        return x


class OverlapPatchEmbed(nn.Module):
    """Image to Patch Embedding."""

    def __init__(self, img_size=224, patch_size=7, stride=4, in_chans=3, embed_dim=768):
        super().__init__()
        img_size = (img_size, img_size)
        patch_size = (patch_size, patch_size)
        self.img_size = img_size
        self.patch_size = patch_size
        self.H, self.W = img_size[0] // patch_size[0], img_size[1] // patch_size[1]
        self.num_patches = self.H * self.W
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=stride,
                              padding=(patch_size[0] // 2, patch_size[1] // 2))
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, x):
        x = self.proj(x)
        _, _, H, W = x.shape
        x = x.flatten(2).transpose(1, 2)
        x = self.norm(x)

        return x, H, W


class DWConv(nn.Module):
    def __init__(self, dim=768):
        super(DWConv, self).__init__()
        self.dwconv = nn.Conv2d(dim, dim, 3, 1, 1, bias=True, groups=dim)

    def forward(self, x, H, W):
        B, N, C = x.shape
        x = x.transpose(1, 2).view(B, C, H, W)
        x = self.dwconv(x)
        x = x.flatten(2).transpose(1, 2)

        return x


class MixVisionTransformer(nn.Module):
    def __init__(self, img_size=64, in_chans=3, embed_dims=(16, 32, 40, 64), num_heads=(1, 2, 5, 8),
                 mlp_ratios=(4, 4, 4, 4), qkv_bias=True, qk_scale=None, drop_rate=0., attn_drop_rate=0.,
                 drop_path_rate=0.1, norm_layer=nn.LayerNorm, depths=(1, 1, 1, 1), sr_ratios=(8, 4, 2, 1)):
        super().__init__()
        self.depths = depths

        # patch_embed
        self.patch_embed1 = OverlapPatchEmbed(img_size=img_size, patch_size=7, stride=4, in_chans=in_chans,
                                              embed_dim=embed_dims[0])
        self.patch_embed2 = OverlapPatchEmbed(img_size=img_size // 4, patch_size=3, stride=2,
                                              in_chans=embed_dims[0], embed_dim=embed_dims[1])
        self.patch_embed3 = OverlapPatchEmbed(img_size=img_size // 8, patch_size=3, stride=2,
                                              in_chans=embed_dims[1], embed_dim=embed_dims[2])
        self.patch_embed4 = OverlapPatchEmbed(img_size=img_size // 16, patch_size=3, stride=2,
                                              in_chans=embed_dims[2], embed_dim=embed_dims[3])

        # transformer encoder
        dpr = [x.item() for x in torch.linspace(0, drop_path_rate, sum(depths))]  # stochastic depth decay rule
        cur = 0
        self.block1 = nn.ModuleList([MitBlock(
            dim=embed_dims[0], num_heads=num_heads[0], mlp_ratio=mlp_ratios[0], qkv_bias=qkv_bias, qk_scale=qk_scale,
            drop=drop_rate, attn_drop=attn_drop_rate, drop_path=dpr[cur + i], norm_layer=norm_layer,
            sr_ratio=sr_ratios[0])
            for i in range(depths[0])])
        self.norm1 = norm_layer(embed_dims[0])

        cur += depths[0]
        self.block2 = nn.ModuleList([MitBlock(
            dim=embed_dims[1], num_heads=num_heads[1], mlp_ratio=mlp_ratios[1], qkv_bias=qkv_bias, qk_scale=qk_scale,
            drop=drop_rate, attn_drop=attn_drop_rate, drop_path=dpr[cur + i], norm_layer=norm_layer,
            sr_ratio=sr_ratios[1])
            for i in range(depths[1])])
        self.norm2 = norm_layer(embed_dims[1])

        cur += depths[1]
        self.block3 = nn.ModuleList([MitBlock(
            dim=embed_dims[2], num_heads=num_heads[2], mlp_ratio=mlp_ratios[2], qkv_bias=qkv_bias, qk_scale=qk_scale,
            drop=drop_rate, attn_drop=attn_drop_rate, drop_path=dpr[cur + i], norm_layer=norm_layer,
            sr_ratio=sr_ratios[2])
            for i in range(depths[2])])
        self.norm3 = norm_layer(embed_dims[2])

        cur += depths[2]
        self.block4 = nn.ModuleList([MitBlock(
            dim=embed_dims[3], num_heads=num_heads[3], mlp_ratio=mlp_ratios[3], qkv_bias=qkv_bias, qk_scale=qk_scale,
            drop=drop_rate, attn_drop=attn_drop_rate, drop_path=dpr[cur + i], norm_layer=norm_layer,
            sr_ratio=sr_ratios[3])
            for i in range(depths[3])])
        self.norm4 = norm_layer(embed_dims[3])

    def forward_features(self, x):
        B = x.shape[0]
        outs = []

        # stage 1
        x, H, W = self.patch_embed1(x)
        for i, blk in enumerate(self.block1):
            x = blk(x, H, W)
        x = self.norm1(x)
        x = x.reshape(B, H, W, -1).permute(0, 3, 1, 2).contiguous()
        outs.append(x)

        # stage 2
        x, H, W = self.patch_embed2(x)
        for i, blk in enumerate(self.block2):
            x = blk(x, H, W)
        x = self.norm2(x)
        x = x.reshape(B, H, W, -1).permute(0, 3, 1, 2).contiguous()
        outs.append(x)

        # stage 3
        x, H, W = self.patch_embed3(x)
        for i, blk in enumerate(self.block3):
            x = blk(x, H, W)
        x = self.norm3(x)
        x = x.reshape(B, H, W, -1).permute(0, 3, 1, 2).contiguous()
        outs.append(x)

        # stage 4
        x, H, W = self.patch_embed4(x)
        for i, blk in enumerate(self.block4):
            x = blk(x, H, W)
        x = self.norm4(x)
        x = x.reshape(B, H, W, -1).permute(0, 3, 1, 2).contiguous()
        outs.append(x)

        return outs

    def forward(self, x):
        x = self.forward_features(x)
        return x


def resize(input, size=None, scale_factor=None, mode='nearest', align_corners=None):
    """mmseg.ops.resize (without its warning)."""
    if isinstance(size, torch.Size):
        size = tuple(int(x) for x in size)
    return F.interpolate(input, size, scale_factor, mode, align_corners)


class SegMLP(nn.Module):
    """segformer_head.MLP: Linear Embedding."""

    def __init__(self, input_dim=2048, embed_dim=768):
        super().__init__()
        self.proj = nn.Linear(input_dim, embed_dim)

    def forward(self, x):
        x = x.flatten(2).transpose(1, 2)
        x = self.proj(x)
        return x


class ConvModule(nn.Module):
    """mmcv ConvModule with norm_cfg BN and ReLU (bias='auto' -> no conv bias)."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)
        self.activate = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.activate(self.bn(self.conv(x)))


class SegFormerHead(nn.Module):
    """SegFormer: Simple and Efficient Design for Semantic Segmentation with Transformers."""

    def __init__(self, in_channels=(16, 32, 40, 64), embedding_dim=32, num_classes=10, dropout_ratio=0.1):
        super().__init__()
        c1_in_channels, c2_in_channels, c3_in_channels, c4_in_channels = in_channels
        self.in_channels = in_channels
        self.linear_c4 = SegMLP(input_dim=c4_in_channels, embed_dim=embedding_dim)
        self.linear_c3 = SegMLP(input_dim=c3_in_channels, embed_dim=embedding_dim)
        self.linear_c2 = SegMLP(input_dim=c2_in_channels, embed_dim=embedding_dim)
        self.linear_c1 = SegMLP(input_dim=c1_in_channels, embed_dim=embedding_dim)
        self.linear_fuse = ConvModule(in_channels=embedding_dim * 4, out_channels=embedding_dim, kernel_size=1)
        self.dropout = nn.Dropout2d(dropout_ratio) if dropout_ratio > 0 else None
        self.linear_pred = nn.Conv2d(embedding_dim, num_classes, kernel_size=1)

    def forward(self, inputs):
        x = inputs  # len=4, 1/4,1/8,1/16,1/32
        c1, c2, c3, c4 = x

        n, _, h, w = c4.shape

        _c4 = self.linear_c4(c4).permute(0, 2, 1).reshape(n, -1, c4.shape[2], c4.shape[3])
        _c4 = resize(_c4, size=c1.size()[2:], mode='bilinear', align_corners=False)

        _c3 = self.linear_c3(c3).permute(0, 2, 1).reshape(n, -1, c3.shape[2], c3.shape[3])
        _c3 = resize(_c3, size=c1.size()[2:], mode='bilinear', align_corners=False)

        _c2 = self.linear_c2(c2).permute(0, 2, 1).reshape(n, -1, c2.shape[2], c2.shape[3])
        _c2 = resize(_c2, size=c1.size()[2:], mode='bilinear', align_corners=False)

        _c1 = self.linear_c1(c1).permute(0, 2, 1).reshape(n, -1, c1.shape[2], c1.shape[3])

        _c = self.linear_fuse(torch.cat([_c4, _c3, _c2, _c1], dim=1))

        if self.dropout is not None:
            x = self.dropout(_c)
        else:
            x = _c
        x = self.linear_pred(x)

        return x


class SegFormer(nn.Module):
    """mmseg EncoderDecoder (backbone MiT, decode head SegFormerHead), the decode head's logits at 1/4 size."""

    def __init__(self, num_classes=10, img_size=64):
        super().__init__()
        self.backbone = MixVisionTransformer(img_size=img_size)
        self.decode_head = SegFormerHead(in_channels=(16, 32, 40, 64), embedding_dim=32, num_classes=num_classes)

    def forward(self, img):
        x = self.backbone(img)
        return self.decode_head(x)


# ============================================================================= MobileViT v1 (apple/ml-cvnets)

class CvConvLayer(nn.Module):
    """cvnets ConvLayer: conv (bias only without norm), BatchNorm2d, SiLU ("swish")."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, dilation=1, groups=1, use_norm=True,
                 use_act=True):
        super().__init__()
        padding = int((kernel_size - 1) / 2) * dilation
        block = nn.Sequential()
        block.add_module(name="conv", module=nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding,
                                                       dilation, groups, bias=not use_norm))
        if use_norm:
            block.add_module(name="norm", module=nn.BatchNorm2d(out_channels, momentum=0.1))
        if use_act:
            block.add_module(name="act", module=nn.SiLU(inplace=False))
        self.block = block

    def forward(self, x):
        return self.block(x)


class InvertedResidual(nn.Module):
    """cvnets InvertedResidual (MV2)."""

    def __init__(self, in_channels, out_channels, stride, expand_ratio, dilation=1, skip_connection=True):
        assert stride in [1, 2]
        hidden_dim = make_divisible(int(round(in_channels * expand_ratio)), 8)
        super().__init__()
        block = nn.Sequential()
        if expand_ratio != 1:
            block.add_module(name="exp_1x1", module=CvConvLayer(in_channels, hidden_dim, kernel_size=1))
        block.add_module(name="conv_3x3", module=CvConvLayer(hidden_dim, hidden_dim, stride=stride, kernel_size=3,
                                                             groups=hidden_dim, dilation=dilation))
        block.add_module(name="red_1x1", module=CvConvLayer(hidden_dim, out_channels, kernel_size=1, use_act=False))
        self.block = block
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.exp = expand_ratio
        self.dilation = dilation
        self.stride = stride
        self.use_res_connect = self.stride == 1 and in_channels == out_channels and skip_connection

    def forward(self, x, *args, **kwargs):
        if self.use_res_connect:
            return x + self.block(x)
        else:
            return self.block(x)


class CvMultiHeadAttention(nn.Module):
    """cvnets MultiHeadAttention (self-attention path of _forward_impl)."""

    def __init__(self, embed_dim, num_heads, attn_dropout=0.0, bias=True):
        super().__init__()
        self.qkv_proj = nn.Linear(embed_dim, 3 * embed_dim, bias=bias)
        self.attn_dropout = nn.Dropout(p=attn_dropout)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim ** -0.5
        self.softmax = nn.Softmax(dim=-1)
        self.num_heads = num_heads
        self.embed_dim = embed_dim

    def forward(self, x_q, x_kv=None):
        # [N, S, C]
        b_sz, S_len, in_channels = x_q.shape

        # [N, S, C] --> [N, S, 3C] --> [N, S, 3, h, c] where C = hc
        qkv = self.qkv_proj(x_q).reshape(b_sz, S_len, 3, self.num_heads, -1)
        # [N, S, 3, h, c] --> [N, h, 3, S, C]
        qkv = qkv.transpose(1, 3).contiguous()
        # [N, h, 3, S, C] --> [N, h, S, C] x 3
        query, key, value = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]

        query = query * self.scaling

        # [N h, T, c] --> [N, h, c, T]
        key = key.transpose(-1, -2)

        # QK^T
        # [N, h, S, c] x [N, h, c, T] --> [N, h, S, T]
        attn = torch.matmul(query, key)

        attn_dtype = attn.dtype
        attn_as_float = self.softmax(attn.float())
        attn = attn_as_float.to(attn_dtype)
        attn = self.attn_dropout(attn)

        # weighted sum
        # [N, h, S, T] x [N, h, T, c] --> [N, h, S, c]
        out = torch.matmul(attn, value)

        # [N, h, S, c] --> [N, S, h, c] --> [N, S, C]
        out = out.transpose(1, 2).reshape(b_sz, S_len, -1)
        out = self.out_proj(out)

        return out


class CvTransformerEncoder(nn.Module):
    """cvnets TransformerEncoder (pre-norm MHA and FFN with SiLU)."""

    def __init__(self, embed_dim, ffn_latent_dim, num_heads=8, attn_dropout=0.0, dropout=0.0, ffn_dropout=0.0):
        super().__init__()
        attn_unit = CvMultiHeadAttention(embed_dim, num_heads, attn_dropout=attn_dropout, bias=True)
        self.pre_norm_mha = nn.Sequential(
            nn.LayerNorm(embed_dim),
            attn_unit,
            nn.Dropout(p=dropout),
        )
        self.pre_norm_ffn = nn.Sequential(
            nn.LayerNorm(embed_dim),
            nn.Linear(in_features=embed_dim, out_features=ffn_latent_dim, bias=True),
            nn.SiLU(),
            nn.Dropout(p=ffn_dropout),
            nn.Linear(in_features=ffn_latent_dim, out_features=embed_dim, bias=True),
            nn.Dropout(p=dropout),
        )

    def forward(self, x, x_prev=None):
        # Multi-head attention
        res = x
        x = self.pre_norm_mha[0](x)  # norm
        x = self.pre_norm_mha[1](x_q=x, x_kv=x_prev)  # mha
        x = self.pre_norm_mha[2](x)  # dropout
        x = x + res

        # Feed forward network
        x = x + self.pre_norm_ffn(x)
        return x


class MobileViTBlock(nn.Module):
    """cvnets MobileViTBlock (v1): local conv, unfolding, transformers, folding, projection, fusion."""

    def __init__(self, in_channels, transformer_dim, ffn_dim, n_transformer_blocks=2, head_dim=32, attn_dropout=0.0,
                 dropout=0.0, ffn_dropout=0.0, patch_h=8, patch_w=8, conv_ksize=3, dilation=1, no_fusion=False):
        conv_3x3_in = CvConvLayer(in_channels, in_channels, kernel_size=conv_ksize, stride=1, dilation=dilation)
        conv_1x1_in = CvConvLayer(in_channels, transformer_dim, kernel_size=1, stride=1, use_norm=False,
                                  use_act=False)
        conv_1x1_out = CvConvLayer(transformer_dim, in_channels, kernel_size=1, stride=1)
        conv_3x3_out = None
        if not no_fusion:
            conv_3x3_out = CvConvLayer(2 * in_channels, in_channels, kernel_size=conv_ksize, stride=1)
        super().__init__()
        self.local_rep = nn.Sequential()
        self.local_rep.add_module(name="conv_3x3", module=conv_3x3_in)
        self.local_rep.add_module(name="conv_1x1", module=conv_1x1_in)

        assert transformer_dim % head_dim == 0
        num_heads = transformer_dim // head_dim

        global_rep = [
            CvTransformerEncoder(embed_dim=transformer_dim, ffn_latent_dim=ffn_dim, num_heads=num_heads,
                                 attn_dropout=attn_dropout, dropout=dropout, ffn_dropout=ffn_dropout)
            for _ in range(n_transformer_blocks)
        ]
        global_rep.append(nn.LayerNorm(transformer_dim))
        self.global_rep = nn.Sequential(*global_rep)

        self.conv_proj = conv_1x1_out
        self.fusion = conv_3x3_out

        self.patch_h = patch_h
        self.patch_w = patch_w
        self.patch_area = self.patch_w * self.patch_h

        self.cnn_in_dim = in_channels
        self.cnn_out_dim = transformer_dim
        self.n_heads = num_heads
        self.ffn_dim = ffn_dim
        self.dropout = dropout
        self.attn_dropout = attn_dropout
        self.ffn_dropout = ffn_dropout
        self.dilation = dilation
        self.n_blocks = n_transformer_blocks
        self.conv_ksize = conv_ksize

    def unfolding(self, feature_map: Tensor) -> Tuple[Tensor, Dict]:
        patch_w, patch_h = self.patch_w, self.patch_h
        patch_area = int(patch_w * patch_h)
        batch_size, in_channels, orig_h, orig_w = feature_map.shape

        new_h = int(math.ceil(orig_h / self.patch_h) * self.patch_h)
        new_w = int(math.ceil(orig_w / self.patch_w) * self.patch_w)

        interpolate = False
        if new_w != orig_w or new_h != orig_h:
            # Note: Padding can be done, but then it needs to be handled in attention function.
            feature_map = F.interpolate(feature_map, size=(new_h, new_w), mode="bilinear", align_corners=False)
            interpolate = True

        # number of patches along width and height
        num_patch_w = new_w // patch_w  # n_w
        num_patch_h = new_h // patch_h  # n_h
        num_patches = num_patch_h * num_patch_w  # N

        # [B, C, H, W] --> [B * C * n_h, p_h, n_w, p_w]
        reshaped_fm = feature_map.reshape(batch_size * in_channels * num_patch_h, patch_h, num_patch_w, patch_w)
        # [B * C * n_h, p_h, n_w, p_w] --> [B * C * n_h, n_w, p_h, p_w]
        transposed_fm = reshaped_fm.transpose(1, 2)
        # [B * C * n_h, n_w, p_h, p_w] --> [B, C, N, P] where P = p_h * p_w and N = n_h * n_w
        reshaped_fm = transposed_fm.reshape(batch_size, in_channels, num_patches, patch_area)
        # [B, C, N, P] --> [B, P, N, C]
        transposed_fm = reshaped_fm.transpose(1, 3)
        # [B, P, N, C] --> [BP, N, C]
        patches = transposed_fm.reshape(batch_size * patch_area, num_patches, -1)

        info_dict = {
            "orig_size": (orig_h, orig_w),
            "batch_size": batch_size,
            "interpolate": interpolate,
            "total_patches": num_patches,
            "num_patches_w": num_patch_w,
            "num_patches_h": num_patch_h,
        }

        return patches, info_dict

    def folding(self, patches: Tensor, info_dict: Dict) -> Tensor:
        n_dim = patches.dim()
        assert n_dim == 3, "Tensor should be of shape BPxNxC. Got: {}".format(patches.shape)
        # [BP, N, C] --> [B, P, N, C]
        patches = patches.contiguous().view(info_dict["batch_size"], self.patch_area, info_dict["total_patches"], -1)

        batch_size, pixels, num_patches, channels = patches.size()
        num_patch_h = info_dict["num_patches_h"]
        num_patch_w = info_dict["num_patches_w"]

        # [B, P, N, C] --> [B, C, N, P]
        patches = patches.transpose(1, 3)

        # [B, C, N, P] --> [B*C*n_h, n_w, p_h, p_w]
        feature_map = patches.reshape(batch_size * channels * num_patch_h, num_patch_w, self.patch_h, self.patch_w)
        # [B*C*n_h, n_w, p_h, p_w] --> [B*C*n_h, p_h, n_w, p_w]
        feature_map = feature_map.transpose(1, 2)
        # [B*C*n_h, p_h, n_w, p_w] --> [B, C, H, W]
        feature_map = feature_map.reshape(batch_size, channels, num_patch_h * self.patch_h,
                                          num_patch_w * self.patch_w)
        if info_dict["interpolate"]:
            feature_map = F.interpolate(feature_map, size=info_dict["orig_size"], mode="bilinear",
                                        align_corners=False)
        return feature_map

    def forward(self, x: Tensor) -> Tensor:
        res = x

        fm = self.local_rep(x)

        # convert feature map to patches
        patches, info_dict = self.unfolding(fm)

        # learn global representations
        for transformer_layer in self.global_rep:
            patches = transformer_layer(patches)

        # [B x Patch x Patches x C] --> [B x C x Patches x Patch]
        fm = self.folding(patches=patches, info_dict=info_dict)

        fm = self.conv_proj(fm)

        if self.fusion is not None:
            fm = self.fusion(torch.cat((res, fm), dim=1))
        return fm


class GlobalPool(nn.Module):
    """cvnets GlobalPool (mean, keep_dim=False)."""

    def __init__(self, pool_type="mean", keep_dim=False):
        super().__init__()
        self.pool_type = pool_type
        self.keep_dim = keep_dim

    def forward(self, x):
        return torch.mean(x, dim=[-2, -1], keepdim=self.keep_dim)


MOBILEVIT_CONFIG = {           # mobilevit "xx_small" pattern at reduced widths (layer_5 dropped)
    "layer1": {"out_channels": 8, "expand_ratio": 2, "num_blocks": 1, "stride": 1, "block_type": "mv2"},
    "layer2": {"out_channels": 16, "expand_ratio": 2, "num_blocks": 2, "stride": 2, "block_type": "mv2"},
    "layer3": {"out_channels": 24, "transformer_channels": 32, "ffn_dim": 64, "transformer_blocks": 2,
               "patch_h": 2, "patch_w": 2, "stride": 2, "mv_expand_ratio": 2, "head_dim": 16,
               "block_type": "mobilevit"},
    "layer4": {"out_channels": 32, "transformer_channels": 48, "ffn_dim": 96, "transformer_blocks": 1,
               "patch_h": 2, "patch_w": 2, "stride": 2, "mv_expand_ratio": 2, "head_dim": 16,
               "block_type": "mobilevit"},
    "last_layer_exp_factor": 2,
}


class MobileViT(nn.Module):
    def __init__(self, num_classes=10, classifier_dropout=0.1, config=MOBILEVIT_CONFIG):
        super().__init__()
        image_channels = 3
        out_channels = 8
        self.dilation = 1
        self.conv_1 = CvConvLayer(image_channels, out_channels, kernel_size=3, stride=2)
        in_channels = out_channels
        self.layer_1, out_channels = self._make_layer(in_channels, config["layer1"])
        in_channels = out_channels
        self.layer_2, out_channels = self._make_layer(in_channels, config["layer2"])
        in_channels = out_channels
        self.layer_3, out_channels = self._make_layer(in_channels, config["layer3"])
        in_channels = out_channels
        self.layer_4, out_channels = self._make_layer(in_channels, config["layer4"])
        in_channels = out_channels
        exp_channels = min(config["last_layer_exp_factor"] * in_channels, 960)
        self.conv_1x1_exp = CvConvLayer(in_channels, exp_channels, kernel_size=1, stride=1)
        self.classifier = nn.Sequential()
        self.classifier.add_module(name="global_pool", module=GlobalPool(pool_type="mean", keep_dim=False))
        if 0.0 < classifier_dropout < 1.0:
            self.classifier.add_module(name="dropout", module=nn.Dropout(p=classifier_dropout, inplace=True))
        self.classifier.add_module(name="fc", module=nn.Linear(exp_channels, num_classes, bias=True))

    def _make_layer(self, input_channel, cfg):
        if cfg.get("block_type", "mobilevit") == "mobilevit":
            return self._make_mit_layer(input_channel, cfg)
        return self._make_mobilenet_layer(input_channel, cfg)

    @staticmethod
    def _make_mobilenet_layer(input_channel, cfg):
        output_channels = cfg.get("out_channels")
        num_blocks = cfg.get("num_blocks", 2)
        expand_ratio = cfg.get("expand_ratio", 4)
        block = []

        for i in range(num_blocks):
            stride = cfg.get("stride", 1) if i == 0 else 1

            layer = InvertedResidual(in_channels=input_channel, out_channels=output_channels, stride=stride,
                                     expand_ratio=expand_ratio)
            block.append(layer)
            input_channel = output_channels
        return nn.Sequential(*block), input_channel

    def _make_mit_layer(self, input_channel, cfg):
        prev_dilation = self.dilation
        block = []
        stride = cfg.get("stride", 1)

        if stride == 2:
            layer = InvertedResidual(in_channels=input_channel, out_channels=cfg.get("out_channels"), stride=stride,
                                     expand_ratio=cfg.get("mv_expand_ratio", 4), dilation=prev_dilation)

            block.append(layer)
            input_channel = cfg.get("out_channels")

        head_dim = cfg.get("head_dim", 32)
        transformer_dim = cfg["transformer_channels"]
        ffn_dim = cfg.get("ffn_dim")
        if head_dim is None:
            num_heads = cfg.get("num_heads", 4)
            if num_heads is None:
                num_heads = 4
            head_dim = transformer_dim // num_heads

        block.append(MobileViTBlock(in_channels=input_channel, transformer_dim=transformer_dim, ffn_dim=ffn_dim,
                                    n_transformer_blocks=cfg.get("transformer_blocks", 1),
                                    patch_h=cfg.get("patch_h", 2), patch_w=cfg.get("patch_w", 2),
                                    dropout=0.0, ffn_dropout=0.0, attn_dropout=0.0, head_dim=head_dim,
                                    no_fusion=False, conv_ksize=3))

        return nn.Sequential(*block), input_channel

    def forward(self, x):
        x = self.conv_1(x)
        x = self.layer_1(x)
        x = self.layer_2(x)
        x = self.layer_3(x)
        x = self.layer_4(x)
        x = self.conv_1x1_exp(x)
        x = self.classifier(x)
        return x


# ============================================================================= ConvNeXt V2 (facebookresearch)

class LayerNorm(nn.Module):
    """ConvNeXt-V2 utils.LayerNorm: channels_last (default) or channels_first."""

    def __init__(self, normalized_shape, eps=1e-6, data_format="channels_last"):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))
        self.eps = eps
        self.data_format = data_format
        if self.data_format not in ["channels_last", "channels_first"]:
            raise NotImplementedError
        self.normalized_shape = (normalized_shape, )

    def forward(self, x):
        if self.data_format == "channels_last":
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        elif self.data_format == "channels_first":
            u = x.mean(1, keepdim=True)
            s = (x - u).pow(2).mean(1, keepdim=True)
            x = (x - u) / torch.sqrt(s + self.eps)
            x = self.weight[:, None, None] * x + self.bias[:, None, None]
            return x


class GRN(nn.Module):
    """GRN (Global Response Normalization) layer."""

    def __init__(self, dim):
        super().__init__()
        self.gamma = nn.Parameter(torch.zeros(1, 1, 1, dim))
        self.beta = nn.Parameter(torch.zeros(1, 1, 1, dim))

    def forward(self, x):
        Gx = torch.norm(x, p=2, dim=(1, 2), keepdim=True)
        Nx = Gx / (Gx.mean(dim=-1, keepdim=True) + 1e-6)
        return self.gamma * (x * Nx) + self.beta + x


class ConvNeXtV2Block(nn.Module):
    """ConvNeXtV2 Block."""

    def __init__(self, dim, drop_path=0.):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)  # depthwise conv
        self.norm = LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)  # pointwise/1x1 convs, implemented with linear layers
        self.act = nn.GELU()
        self.grn = GRN(4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()

    def forward(self, x):
        input = x
        x = self.dwconv(x)
        x = x.permute(0, 2, 3, 1)  # (N, C, H, W) -> (N, H, W, C)
        x = self.norm(x)
        x = self.pwconv1(x)
        x = self.act(x)
        x = self.grn(x)
        x = self.pwconv2(x)
        x = x.permute(0, 3, 1, 2)  # (N, H, W, C) -> (N, C, H, W)

        x = input + self.drop_path(x)
        return x


class ConvNeXtV2(nn.Module):
    """ConvNeXt V2 (atto pattern at reduced widths / depths)."""

    def __init__(self, in_chans=3, num_classes=10, depths=(1, 1, 2, 1), dims=(16, 24, 32, 48), drop_path_rate=0.1,
                 head_init_scale=1.):
        super().__init__()
        self.depths = depths
        self.downsample_layers = nn.ModuleList()  # stem and 3 intermediate downsampling conv layers
        stem = nn.Sequential(
            nn.Conv2d(in_chans, dims[0], kernel_size=4, stride=4),
            LayerNorm(dims[0], eps=1e-6, data_format="channels_first")
        )
        self.downsample_layers.append(stem)
        for i in range(3):
            downsample_layer = nn.Sequential(
                LayerNorm(dims[i], eps=1e-6, data_format="channels_first"),
                nn.Conv2d(dims[i], dims[i + 1], kernel_size=2, stride=2),
            )
            self.downsample_layers.append(downsample_layer)

        self.stages = nn.ModuleList()  # 4 feature resolution stages, each consisting of multiple residual blocks
        dp_rates = [x.item() for x in torch.linspace(0, drop_path_rate, sum(depths))]
        cur = 0
        for i in range(4):
            stage = nn.Sequential(
                *[ConvNeXtV2Block(dim=dims[i], drop_path=dp_rates[cur + j]) for j in range(depths[i])]
            )
            self.stages.append(stage)
            cur += depths[i]

        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)  # final norm layer
        self.head = nn.Linear(dims[-1], num_classes)
        self.head.weight.data.mul_(head_init_scale)
        self.head.bias.data.mul_(head_init_scale)

    def forward_features(self, x):
        for i in range(4):
            x = self.downsample_layers[i](x)
            x = self.stages[i](x)
        return self.norm(x.mean([-2, -1]))  # global average pooling, (N, C, H, W) -> (N, C)

    def forward(self, x):
        x = self.forward_features(x)
        x = self.head(x)
        return x


# ============================================================================= EfficientViT (mit-han-lab, LiteMLA)

def get_same_padding(kernel_size):
    if isinstance(kernel_size, tuple):
        return tuple([get_same_padding(ks) for ks in kernel_size])
    else:
        assert kernel_size % 2 > 0, "kernel size should be odd number"
        return kernel_size // 2


def val2tuple(x, min_len: int = 1, idx_repeat: int = -1) -> tuple:
    x = list(x) if isinstance(x, (list, tuple)) else [x]
    if len(x) > 0:
        x[idx_repeat:idx_repeat] = [x[idx_repeat] for _ in range(min_len - len(x))]
    return tuple(x)


REGISTERED_ACT_DICT = {"relu": nn.ReLU, "relu6": nn.ReLU6, "hswish": nn.Hardswish, "silu": nn.SiLU}


def build_act(name, **kwargs):
    if name in REGISTERED_ACT_DICT:
        act_cls = REGISTERED_ACT_DICT[name]
        return act_cls(**kwargs)
    else:
        return None


def build_norm(name="bn2d", num_features=None, **kwargs):
    if name == "ln":
        return nn.LayerNorm(num_features, **kwargs)
    elif name == "bn2d":
        return nn.BatchNorm2d(num_features, **kwargs)
    else:
        return None


class EvConvLayer(nn.Module):
    """efficientvit ConvLayer."""

    def __init__(self, in_channels, out_channels, kernel_size=3, stride=1, dilation=1, groups=1, use_bias=False,
                 dropout=0, norm="bn2d", act_func="relu"):
        super().__init__()
        padding = get_same_padding(kernel_size)
        padding *= dilation

        self.dropout = nn.Dropout2d(dropout, inplace=False) if dropout > 0 else None
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=(kernel_size, kernel_size),
                              stride=(stride, stride), padding=padding, dilation=(dilation, dilation),
                              groups=groups, bias=use_bias)
        self.norm = build_norm(norm, num_features=out_channels)
        self.act = build_act(act_func)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dropout is not None:
            x = self.dropout(x)
        x = self.conv(x)
        if self.norm:
            x = self.norm(x)
        if self.act:
            x = self.act(x)
        return x


class LinearLayer(nn.Module):
    """efficientvit LinearLayer."""

    def __init__(self, in_features, out_features, use_bias=True, dropout=0, norm=None, act_func=None):
        super().__init__()
        self.dropout = nn.Dropout(dropout, inplace=False) if dropout > 0 else None
        self.linear = nn.Linear(in_features, out_features, use_bias)
        self.norm = build_norm(norm, num_features=out_features)
        self.act = build_act(act_func)

    def _try_squeeze(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() > 2:
            x = torch.flatten(x, start_dim=1)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._try_squeeze(x)
        if self.dropout:
            x = self.dropout(x)
        x = self.linear(x)
        if self.norm:
            x = self.norm(x)
        if self.act:
            x = self.act(x)
        return x


class IdentityLayer(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class DSConv(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size=3, stride=1, use_bias=False, norm=("bn2d", "bn2d"),
                 act_func=("relu6", None)):
        super(DSConv, self).__init__()

        use_bias = val2tuple(use_bias, 2)
        norm = val2tuple(norm, 2)
        act_func = val2tuple(act_func, 2)

        self.depth_conv = EvConvLayer(in_channels, in_channels, kernel_size, stride, groups=in_channels,
                                      norm=norm[0], act_func=act_func[0], use_bias=use_bias[0])
        self.point_conv = EvConvLayer(in_channels, out_channels, 1, norm=norm[1], act_func=act_func[1],
                                      use_bias=use_bias[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.depth_conv(x)
        x = self.point_conv(x)
        return x


class EvMBConv(nn.Module):
    """efficientvit MBConv."""

    def __init__(self, in_channels, out_channels, kernel_size=3, stride=1, mid_channels=None, expand_ratio=6,
                 use_bias=False, norm=("bn2d", "bn2d", "bn2d"), act_func=("relu6", "relu6", None)):
        super().__init__()

        use_bias = val2tuple(use_bias, 3)
        norm = val2tuple(norm, 3)
        act_func = val2tuple(act_func, 3)
        mid_channels = mid_channels or round(in_channels * expand_ratio)

        self.inverted_conv = EvConvLayer(in_channels, mid_channels, 1, stride=1, norm=norm[0],
                                         act_func=act_func[0], use_bias=use_bias[0])
        self.depth_conv = EvConvLayer(mid_channels, mid_channels, kernel_size, stride=stride, groups=mid_channels,
                                      norm=norm[1], act_func=act_func[1], use_bias=use_bias[1])
        self.point_conv = EvConvLayer(mid_channels, out_channels, 1, norm=norm[2], act_func=act_func[2],
                                      use_bias=use_bias[2])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inverted_conv(x)
        x = self.depth_conv(x)
        x = self.point_conv(x)
        return x


class LiteMLA(nn.Module):
    r"""Lightweight multi-scale linear attention"""

    def __init__(self, in_channels, out_channels, heads=None, heads_ratio=1.0, dim=8, use_bias=False,
                 norm=(None, "bn2d"), act_func=(None, None), kernel_func="relu", scales=(5,), eps=1.0e-15):
        super(LiteMLA, self).__init__()
        self.eps = eps
        heads = heads or int(in_channels // dim * heads_ratio)

        total_dim = heads * dim

        use_bias = val2tuple(use_bias, 2)
        norm = val2tuple(norm, 2)
        act_func = val2tuple(act_func, 2)

        self.dim = dim
        self.qkv = EvConvLayer(in_channels, 3 * total_dim, 1, use_bias=use_bias[0], norm=norm[0],
                               act_func=act_func[0])
        self.aggreg = nn.ModuleList(
            [
                nn.Sequential(
                    nn.Conv2d(3 * total_dim, 3 * total_dim, scale, padding=get_same_padding(scale),
                              groups=3 * total_dim, bias=use_bias[0]),
                    nn.Conv2d(3 * total_dim, 3 * total_dim, 1, groups=3 * heads, bias=use_bias[0]),
                )
                for scale in scales
            ]
        )
        self.kernel_func = build_act(kernel_func, inplace=False)

        self.proj = EvConvLayer(total_dim * (1 + len(scales)), out_channels, 1, use_bias=use_bias[1], norm=norm[1],
                                act_func=act_func[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # generate multi-scale q, k, v
        qkv = self.qkv(x)
        multi_scale_qkv = [qkv]
        for op in self.aggreg:
            multi_scale_qkv.append(op(qkv))
        multi_scale_qkv = torch.cat(multi_scale_qkv, dim=1)

        B, _, H, W = list(multi_scale_qkv.size())

        multi_scale_qkv = torch.reshape(multi_scale_qkv, (B, -1, 3 * self.dim, H * W))
        multi_scale_qkv = torch.transpose(multi_scale_qkv, -1, -2)
        q, k, v = (
            multi_scale_qkv[..., 0: self.dim],
            multi_scale_qkv[..., self.dim: 2 * self.dim],
            multi_scale_qkv[..., 2 * self.dim:],
        )

        # lightweight linear attention
        q = self.kernel_func(q)
        k = self.kernel_func(k)

        # linear matmul
        trans_k = k.transpose(-1, -2)

        v = F.pad(v, (0, 1), mode="constant", value=1)
        kv = torch.matmul(trans_k, v)
        out = torch.matmul(q, kv)
        out = out[..., :-1] / (out[..., -1:] + self.eps)

        out = torch.transpose(out, -1, -2)
        out = torch.reshape(out, (B, -1, H, W))
        out = self.proj(out)

        return out


class ResidualBlock(nn.Module):
    def __init__(self, main, shortcut, post_act=None, pre_norm=None):
        super(ResidualBlock, self).__init__()

        self.pre_norm = pre_norm
        self.main = main
        self.shortcut = shortcut
        self.post_act = build_act(post_act)

    def forward_main(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm is None:
            return self.main(x)
        else:
            return self.main(self.pre_norm(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.main is None:
            res = x
        elif self.shortcut is None:
            res = self.forward_main(x)
        else:
            res = self.forward_main(x) + self.shortcut(x)
            if self.post_act:
                res = self.post_act(res)
        return res


class OpSequential(nn.Module):
    def __init__(self, op_list):
        super(OpSequential, self).__init__()
        valid_op_list = []
        for op in op_list:
            if op is not None:
                valid_op_list.append(op)
        self.op_list = nn.ModuleList(valid_op_list)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for op in self.op_list:
            x = op(x)
        return x


class EfficientViTBlock(nn.Module):
    def __init__(self, in_channels, heads_ratio=1.0, dim=32, expand_ratio=4, scales=(5,), norm="bn2d",
                 act_func="hswish"):
        super(EfficientViTBlock, self).__init__()
        self.context_module = ResidualBlock(
            LiteMLA(in_channels=in_channels, out_channels=in_channels, heads_ratio=heads_ratio, dim=dim,
                    norm=(None, norm), scales=scales),
            IdentityLayer(),
        )
        local_module = EvMBConv(in_channels=in_channels, out_channels=in_channels, expand_ratio=expand_ratio,
                                use_bias=(True, True, False), norm=(None, None, norm),
                                act_func=(act_func, act_func, None))
        self.local_module = ResidualBlock(local_module, IdentityLayer())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.context_module(x)
        x = self.local_module(x)
        return x


class EfficientViTBackbone(nn.Module):
    def __init__(self, width_list, depth_list, in_channels=3, dim=32, expand_ratio=4, norm="bn2d",
                 act_func="hswish"):
        super().__init__()

        self.width_list = []
        # input stem
        self.input_stem = [
            EvConvLayer(in_channels=3, out_channels=width_list[0], stride=2, norm=norm, act_func=act_func)
        ]
        for _ in range(depth_list[0]):
            block = self.build_local_block(in_channels=width_list[0], out_channels=width_list[0], stride=1,
                                           expand_ratio=1, norm=norm, act_func=act_func)
            self.input_stem.append(ResidualBlock(block, IdentityLayer()))
        in_channels = width_list[0]
        self.input_stem = OpSequential(self.input_stem)
        self.width_list.append(in_channels)

        # stages
        self.stages = []
        for w, d in zip(width_list[1:3], depth_list[1:3]):
            stage = []
            for i in range(d):
                stride = 2 if i == 0 else 1
                block = self.build_local_block(in_channels=in_channels, out_channels=w, stride=stride,
                                               expand_ratio=expand_ratio, norm=norm, act_func=act_func)
                block = ResidualBlock(block, IdentityLayer() if stride == 1 else None)
                stage.append(block)
                in_channels = w
            self.stages.append(OpSequential(stage))
            self.width_list.append(in_channels)

        for w, d in zip(width_list[3:], depth_list[3:]):
            stage = []
            block = self.build_local_block(in_channels=in_channels, out_channels=w, stride=2,
                                           expand_ratio=expand_ratio, norm=norm, act_func=act_func,
                                           fewer_norm=True)
            stage.append(ResidualBlock(block, None))
            in_channels = w

            for _ in range(d):
                stage.append(EfficientViTBlock(in_channels=in_channels, dim=dim, expand_ratio=expand_ratio,
                                               norm=norm, act_func=act_func))
            self.stages.append(OpSequential(stage))
            self.width_list.append(in_channels)
        self.stages = nn.ModuleList(self.stages)

    @staticmethod
    def build_local_block(in_channels, out_channels, stride, expand_ratio, norm, act_func, fewer_norm=False):
        if expand_ratio == 1:
            block = DSConv(in_channels=in_channels, out_channels=out_channels, stride=stride,
                           use_bias=(True, False) if fewer_norm else False,
                           norm=(None, norm) if fewer_norm else norm, act_func=(act_func, None))
        else:
            block = EvMBConv(in_channels=in_channels, out_channels=out_channels, stride=stride,
                             expand_ratio=expand_ratio, use_bias=(True, True, False) if fewer_norm else False,
                             norm=(None, None, norm) if fewer_norm else norm, act_func=(act_func, act_func, None))
        return block

    def forward(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        output_dict = {"input": x}
        output_dict["stage0"] = x = self.input_stem(x)
        for stage_id, stage in enumerate(self.stages, 1):
            output_dict["stage%d" % stage_id] = x = stage(x)
        output_dict["stage_final"] = x
        return output_dict


class ClsHead(OpSequential):
    def __init__(self, in_channels, width_list, n_classes=1000, dropout=0.0, norm="bn2d", act_func="hswish",
                 fid="stage_final"):
        ops = [
            EvConvLayer(in_channels, width_list[0], 1, norm=norm, act_func=act_func),
            nn.AdaptiveAvgPool2d(output_size=1),
            LinearLayer(width_list[0], width_list[1], False, norm="ln", act_func=act_func),
            LinearLayer(width_list[1], n_classes, True, dropout, None, None),
        ]
        super().__init__(ops)

        self.fid = fid

    def forward(self, feed_dict: Dict[str, torch.Tensor]) -> torch.Tensor:
        x = feed_dict[self.fid]
        return OpSequential.forward(self, x)


class EfficientViTCls(nn.Module):
    """efficientvit_cls_b0 pattern at reduced widths / depths (dim 16: two heads at 32 channels, three at 48)."""

    def __init__(self, num_classes=10, width_list=(8, 16, 24, 32, 48), depth_list=(1, 1, 1, 1, 1), dim=16):
        super().__init__()
        self.backbone = EfficientViTBackbone(width_list=list(width_list), depth_list=list(depth_list), dim=dim)
        self.head = ClsHead(in_channels=width_list[-1], width_list=[64, 80], n_classes=num_classes, dropout=0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feed_dict = self.backbone(x)
        output = self.head(feed_dict)
        return output


# ============================================================================= MaxViT (timm maxxvit.py)

def gen_relative_position_index(q_size: Tuple[int, int], k_size: Optional[Tuple[int, int]] = None,
                                class_token: bool = False) -> torch.Tensor:
    """timm layers/pos_embed_rel.py (no class token, q_size == k_size)."""
    assert k_size is None, 'Different q & k sizes not currently supported'
    coords = torch.stack(torch.meshgrid(torch.arange(q_size[0]), torch.arange(q_size[1]),
                                        indexing="ij")).flatten(1)  # 2, Wh, Ww
    relative_coords = coords[:, :, None] - coords[:, None, :]  # 2, Wh*Ww, Wh*Ww
    relative_coords = relative_coords.permute(1, 2, 0)  # Qh*Qw, Kh*Kw, 2
    relative_coords[:, :, 0] += q_size[0] - 1  # shift to start from 0
    relative_coords[:, :, 1] += q_size[1] - 1
    relative_coords[:, :, 0] *= 2 * q_size[1] - 1
    relative_position_index = relative_coords.sum(-1)  # Qh*Qw, Kh*Kw
    return relative_position_index.contiguous()


class RelPosBias(nn.Module):
    """timm RelPosBias (Swin-V1 relative position bias, modularized)."""

    def __init__(self, window_size, num_heads, prefix_tokens=0):
        super().__init__()
        assert prefix_tokens <= 1
        self.window_size = window_size
        self.window_area = window_size[0] * window_size[1]
        self.bias_shape = (self.window_area + prefix_tokens,) * 2 + (num_heads,)

        num_relative_distance = (2 * window_size[0] - 1) * (2 * window_size[1] - 1) + 3 * prefix_tokens
        self.relative_position_bias_table = nn.Parameter(torch.zeros(num_relative_distance, num_heads))
        self.register_buffer(
            "relative_position_index",
            gen_relative_position_index(self.window_size, class_token=prefix_tokens > 0).view(-1),
            persistent=False,
        )

    def get_bias(self) -> torch.Tensor:
        relative_position_bias = self.relative_position_bias_table[self.relative_position_index]
        # win_h * win_w, win_h * win_w, num_heads
        relative_position_bias = relative_position_bias.view(self.bias_shape).permute(2, 0, 1)
        return relative_position_bias.unsqueeze(0).contiguous()

    def forward(self, attn, shared_rel_pos: Optional[torch.Tensor] = None):
        return attn + self.get_bias()


class BatchNormAct2d(nn.BatchNorm2d):
    """timm layers/norm_act.py BatchNormAct2d: BatchNorm2d whose forward is a cut & paste of BatchNorm2d's (to avoid
    issues with torchscript and tracing) followed by drop and act."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True, apply_act=True,
                 act_layer=nn.ReLU, act_kwargs=None, inplace=True, drop_layer=None):
        super().__init__(num_features, eps=eps, momentum=momentum, affine=affine,
                         track_running_stats=track_running_stats)
        self.drop = drop_layer() if drop_layer is not None else nn.Identity()
        if apply_act and act_layer is not None:
            act_kwargs = dict(act_kwargs or {})
            if act_layer in (nn.ReLU, nn.SiLU, nn.ELU, nn.ReLU6, nn.Hardswish):
                act_kwargs.setdefault("inplace", inplace)
            self.act = act_layer(**act_kwargs)
        else:
            self.act = nn.Identity()

    def forward(self, x):
        # cut & paste of torch.nn.BatchNorm2d.forward impl to avoid issues with torchscript and tracing
        if self.momentum is None:
            exponential_average_factor = 0.0
        else:
            exponential_average_factor = self.momentum

        if self.training and self.track_running_stats:
            # TODO: if statement only here to tell the jit to skip emitting this when it is None
            if self.num_batches_tracked is not None:  # type: ignore[has-type]
                self.num_batches_tracked.add_(1)  # type: ignore[has-type]
                if self.momentum is None:  # use cumulative moving average
                    exponential_average_factor = 1.0 / float(self.num_batches_tracked)
                else:  # use exponential moving average
                    exponential_average_factor = self.momentum

        if self.training:
            bn_training = True
        else:
            bn_training = (self.running_mean is None) and (self.running_var is None)

        x = F.batch_norm(
            x,
            # If buffers are not to be tracked, ensure that they won't be updated
            self.running_mean if not self.training or self.track_running_stats else None,
            self.running_var if not self.training or self.track_running_stats else None,
            self.weight,
            self.bias,
            bn_training,
            exponential_average_factor,
            self.eps,
        )
        x = self.drop(x)
        x = self.act(x)
        return x


class LayerNorm2d(nn.LayerNorm):
    """timm LayerNorm2d: LayerNorm over the channels of an NCHW tensor."""

    def __init__(self, num_channels, eps=1e-6, affine=True):
        super().__init__(num_channels, eps=eps, elementwise_affine=affine)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        x = x.permute(0, 3, 1, 2)
        return x


class Mlp(nn.Module):
    """timm.layers.Mlp."""

    def __init__(self, in_features, hidden_features=None, out_features=None, act_layer=nn.GELU, drop=0.):
        super().__init__()
        out_features = out_features or in_features
        hidden_features = hidden_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.norm = nn.Identity()
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x):
        x = self.fc1(x)
        x = self.act(x)
        x = self.drop1(x)
        x = self.norm(x)
        x = self.fc2(x)
        x = self.drop2(x)
        return x


class SEModule(nn.Module):
    """timm SEModule (create_attn('se', ..., act_layer='silu', rd_channels=...))."""

    def __init__(self, channels, rd_ratio=1. / 16, rd_channels=None, rd_divisor=8, add_maxpool=False, bias=True,
                 act_layer=nn.SiLU, norm_layer=None):
        super().__init__()
        self.add_maxpool = add_maxpool
        if not rd_channels:
            rd_channels = make_divisible(channels * rd_ratio, rd_divisor, round_limit=0.)
        self.fc1 = nn.Conv2d(channels, rd_channels, kernel_size=1, bias=bias)
        self.bn = norm_layer(rd_channels) if norm_layer else nn.Identity()
        self.act = act_layer(inplace=True)
        self.fc2 = nn.Conv2d(rd_channels, channels, kernel_size=1, bias=bias)
        self.gate = nn.Sigmoid()

    def forward(self, x):
        x_se = x.mean((2, 3), keepdim=True)
        if self.add_maxpool:
            # experimental codepath, may remove or change
            x_se = 0.5 * x_se + 0.5 * x.amax((2, 3), keepdim=True)
        x_se = self.fc1(x_se)
        x_se = self.act(self.bn(x_se))
        x_se = self.fc2(x_se)
        return x * self.gate(x_se)


def create_conv2d(in_chs, out_chs, kernel_size, stride=1, dilation=1, groups=1, bias=False):
    """timm create_conv2d with padding='' (symmetric ((stride - 1) + dilation * (k - 1)) // 2)."""
    padding = ((stride - 1) + dilation * (kernel_size - 1)) // 2
    return nn.Conv2d(in_chs, out_chs, kernel_size, stride=stride, padding=padding, dilation=dilation,
                     groups=groups, bias=bias)


class Downsample2d(nn.Module):
    """timm maxxvit Downsample2d, pool_type 'avg2'."""

    def __init__(self, dim, dim_out, pool_type='avg2', padding='', bias=True):
        super().__init__()
        assert pool_type in ('max', 'max2', 'avg', 'avg2')
        if pool_type == 'max':
            self.pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=padding or 1)
        elif pool_type == 'max2':
            self.pool = nn.MaxPool2d(2, stride=2, padding=padding or 0)  # kernel_size == stride == 2
        elif pool_type == 'avg':
            self.pool = nn.AvgPool2d(kernel_size=3, stride=2, count_include_pad=False, padding=padding or 1)
        else:
            self.pool = nn.AvgPool2d(2, stride=2, padding=padding or 0)

        if dim != dim_out:
            self.expand = nn.Conv2d(dim, dim_out, 1, bias=bias)
        else:
            self.expand = nn.Identity()

    def forward(self, x):
        x = self.pool(x)  # spatial downsample
        x = self.expand(x)  # expand chs
        return x


class MbConvBlock(nn.Module):
    """Pre-Norm Conv Block - 1x1 - kxk - 1x1, w/ inverted bottleneck (expand); MaxxVitConvCfg defaults."""

    def __init__(self, in_chs, out_chs, stride=1, dilation=(1, 1), expand_ratio=4.0, attn_ratio=0.25, norm_eps=1e-5,
                 drop_path=0.):
        super(MbConvBlock, self).__init__()
        mid_chs = make_divisible(out_chs * expand_ratio)      # expand_output=True
        groups = mid_chs                                      # group_size=1: depthwise

        if stride == 2:
            self.shortcut = Downsample2d(in_chs, out_chs, pool_type='avg2', bias=True, padding='')
        else:
            self.shortcut = nn.Identity()

        stride_2, dilation_2 = stride, dilation[0]           # stride_mode 'dw'

        self.pre_norm = BatchNormAct2d(in_chs, eps=norm_eps, apply_act=False)
        self.down = nn.Identity()
        self.conv1_1x1 = create_conv2d(in_chs, mid_chs, 1, stride=1)
        self.norm1 = BatchNormAct2d(mid_chs, eps=norm_eps)

        self.conv2_kxk = create_conv2d(mid_chs, mid_chs, 3, stride=stride_2, dilation=dilation_2, groups=groups)

        self.se_early = None
        self.norm2 = BatchNormAct2d(mid_chs, eps=norm_eps)
        self.se = SEModule(mid_chs, act_layer=nn.SiLU, rd_channels=int(attn_ratio * out_chs))

        self.conv3_1x1 = create_conv2d(mid_chs, out_chs, 1, bias=True)
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()

    def forward(self, x):
        shortcut = self.shortcut(x)
        x = self.pre_norm(x)
        x = self.down(x)

        # 1x1 expansion conv & norm-act
        x = self.conv1_1x1(x)
        x = self.norm1(x)

        # depthwise / grouped 3x3 conv w/ SE (or other) channel attention & norm-act
        x = self.conv2_kxk(x)
        if self.se_early is not None:
            x = self.se_early(x)
        x = self.norm2(x)
        if self.se is not None:
            x = self.se(x)

        # 1x1 linear projection to output width
        x = self.conv3_1x1(x)
        x = self.drop_path(x) + shortcut
        return x


def window_partition(x, window_size: List[int]):
    B, H, W, C = x.shape
    assert H % window_size[0] == 0, f'height ({H}) must be divisible by window ({window_size[0]})'
    assert W % window_size[1] == 0, ''
    x = x.view(B, H // window_size[0], window_size[0], W // window_size[1], window_size[1], C)
    windows = x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, window_size[0], window_size[1], C)
    return windows


def window_reverse(windows, window_size: List[int], img_size: List[int]):
    H, W = img_size
    C = windows.shape[-1]
    x = windows.view(-1, H // window_size[0], W // window_size[1], window_size[0], window_size[1], C)
    x = x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, H, W, C)
    return x


def grid_partition(x, grid_size: List[int]):
    B, H, W, C = x.shape
    assert H % grid_size[0] == 0, f'height {H} must be divisible by grid {grid_size[0]}'
    assert W % grid_size[1] == 0, ''
    x = x.view(B, grid_size[0], H // grid_size[0], grid_size[1], W // grid_size[1], C)
    windows = x.permute(0, 2, 4, 1, 3, 5).contiguous().view(-1, grid_size[0], grid_size[1], C)
    return windows


def grid_reverse(windows, grid_size: List[int], img_size: List[int]):
    H, W = img_size
    C = windows.shape[-1]
    x = windows.view(-1, H // grid_size[0], W // grid_size[1], grid_size[0], grid_size[1], C)
    x = x.permute(0, 3, 1, 4, 2, 5).contiguous().view(-1, H, W, C)
    return x


class AttentionCl(nn.Module):
    """Channels-last multi-head attention (B, ..., C), timm's explicit (non-fused) path."""

    def __init__(self, dim, dim_out=None, dim_head=32, bias=True, expand_first=True, head_first=True,
                 rel_pos_cls=None, attn_drop=0., proj_drop=0.):
        super().__init__()
        dim_out = dim_out or dim
        dim_attn = dim_out if expand_first and dim_out > dim else dim
        assert dim_attn % dim_head == 0, 'attn dim should be divisible by head_dim'
        self.num_heads = dim_attn // dim_head
        self.dim_head = dim_head
        self.head_first = head_first
        self.scale = dim_head ** -0.5

        self.qkv = nn.Linear(dim, dim_attn * 3, bias=bias)
        self.rel_pos = rel_pos_cls(num_heads=self.num_heads) if rel_pos_cls else None
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim_attn, dim_out, bias=bias)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x, shared_rel_pos: Optional[torch.Tensor] = None):
        B = x.shape[0]
        restore_shape = x.shape[:-1]

        if self.head_first:
            q, k, v = self.qkv(x).view(B, -1, self.num_heads, self.dim_head * 3).transpose(1, 2).chunk(3, dim=3)
        else:
            q, k, v = self.qkv(x).reshape(B, -1, 3, self.num_heads, self.dim_head).transpose(1, 3).unbind(2)

        q = q * self.scale
        attn = q @ k.transpose(-2, -1)
        if self.rel_pos is not None:
            attn = self.rel_pos(attn, shared_rel_pos=shared_rel_pos)
        elif shared_rel_pos is not None:
            attn = attn + shared_rel_pos
        attn = attn.softmax(dim=-1)
        attn = self.attn_drop(attn)
        x = attn @ v

        x = x.transpose(1, 2).reshape(restore_shape + (-1,))
        x = self.proj(x)
        x = self.proj_drop(x)
        return x


class PartitionAttentionCl(nn.Module):
    """Grid or Block partition + Attn + FFN. NxC 'channels last' tensor layout."""

    def __init__(self, dim, partition_type='block', partition_size=(4, 4), dim_head=8, expand_ratio=4.0,
                 norm_eps=1e-6, drop_path=0.):
        super().__init__()
        self.partition_block = partition_type == 'block'
        self.partition_size = tuple(partition_size)

        def rel_pos_cls(num_heads):
            return RelPosBias(window_size=self.partition_size, num_heads=num_heads)

        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = AttentionCl(dim, dim, dim_head=dim_head, bias=True, head_first=True, rel_pos_cls=rel_pos_cls)
        self.ls1 = nn.Identity()           # MaxxVitTransformerCfg.init_values = None
        self.drop_path1 = DropPath(drop_path) if drop_path > 0. else nn.Identity()

        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * expand_ratio), act_layer=nn.GELU, drop=0.)
        self.ls2 = nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0. else nn.Identity()

    def _partition_attn(self, x):
        img_size = x.shape[1:3]
        if self.partition_block:
            partitioned = window_partition(x, self.partition_size)
        else:
            partitioned = grid_partition(x, self.partition_size)

        partitioned = self.attn(partitioned)

        if self.partition_block:
            x = window_reverse(partitioned, self.partition_size, img_size)
        else:
            x = grid_reverse(partitioned, self.partition_size, img_size)
        return x

    def forward(self, x):
        x = x + self.drop_path1(self.ls1(self._partition_attn(self.norm1(x))))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x


class MaxxVitBlock(nn.Module):
    """MaxVit conv, window partition + FFN, grid partition + FFN."""

    def __init__(self, dim, dim_out, stride=1, partition_size=(4, 4), dim_head=8, drop_path=0.):
        super().__init__()
        self.nchw_attn = False
        self.conv = MbConvBlock(dim, dim_out, stride=stride, drop_path=drop_path)

        attn_kwargs = dict(dim=dim_out, partition_size=partition_size, dim_head=dim_head, drop_path=drop_path)
        self.attn_block = PartitionAttentionCl(**attn_kwargs)
        self.attn_grid = PartitionAttentionCl(partition_type='grid', **attn_kwargs)

    def forward(self, x):
        # NCHW format
        x = self.conv(x)

        if not self.nchw_attn:
            x = x.permute(0, 2, 3, 1)  # to NHWC (channels-last)
        if self.attn_block is not None:
            x = self.attn_block(x)
        x = self.attn_grid(x)
        if not self.nchw_attn:
            x = x.permute(0, 3, 1, 2)  # back to NCHW
        return x


class MaxxVitStage(nn.Module):
    def __init__(self, in_chs, out_chs, stride=2, depth=4, partition_size=(4, 4), dim_head=8, drop_path=(0.,)):
        super().__init__()
        blocks = []
        for i in range(depth):
            block_stride = stride if i == 0 else 1
            blocks += [MaxxVitBlock(in_chs, out_chs, stride=block_stride, partition_size=partition_size,
                                    dim_head=dim_head, drop_path=drop_path[i])]
            in_chs = out_chs
        self.blocks = nn.Sequential(*blocks)

    def forward(self, x):
        x = self.blocks(x)
        return x


class MaxVitStem(nn.Module):
    def __init__(self, in_chs, out_chs, kernel_size=3, bias=False, norm_eps=1e-5):
        super().__init__()
        if not isinstance(out_chs, (list, tuple)):
            out_chs = (out_chs, out_chs)
        self.out_chs = out_chs[-1]
        self.stride = 2
        self.conv1 = create_conv2d(in_chs, out_chs[0], kernel_size, stride=2, bias=bias)
        self.norm1 = BatchNormAct2d(out_chs[0], eps=norm_eps)
        self.conv2 = create_conv2d(out_chs[0], out_chs[1], kernel_size, stride=1, bias=bias)

    def forward(self, x):
        x = self.conv1(x)
        x = self.norm1(x)
        x = self.conv2(x)
        return x


class NormMlpClassifierHead(nn.Module):
    """timm NormMlpClassifierHead (avg pool, LayerNorm2d, flatten, Linear + Tanh pre-logits, fc)."""

    def __init__(self, in_features, num_classes, hidden_size=None, drop_rate=0., norm_eps=1e-6):
        super().__init__()
        self.in_features = in_features
        self.hidden_size = hidden_size
        self.num_features = in_features
        self.global_pool = nn.AdaptiveAvgPool2d(1)
        self.norm = LayerNorm2d(in_features, eps=norm_eps)
        self.flatten = nn.Flatten(1)
        if hidden_size:
            self.pre_logits = nn.Sequential(OrderedDict([
                ('fc', nn.Linear(in_features, hidden_size)),
                ('act', nn.Tanh()),
            ]))
            self.num_features = hidden_size
        else:
            self.pre_logits = nn.Identity()
        self.drop = nn.Dropout(drop_rate)
        self.fc = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()

    def forward(self, x, pre_logits: bool = False):
        x = self.global_pool(x)
        x = self.norm(x)
        x = self.flatten(x)
        x = self.pre_logits(x)
        x = self.drop(x)
        if pre_logits:
            return x
        x = self.fc(x)
        return x


class MaxxVit(nn.Module):
    """MaxViT (maxvit_tiny block pattern 'M' per stage, the head_hidden_size head) at reduced widths / depths;
    partition size img_size // partition_ratio (timm's cfg_window_size) = 64 // 16 = 4."""

    def __init__(self, num_classes=10, img_size=64, embed_dim=(16, 24, 32), depths=(1, 1, 1), stem_width=16,
                 dim_head=8, partition_ratio=16, head_hidden_size=32, drop_path_rate=0.1):
        super().__init__()
        partition_size = (img_size // partition_ratio, img_size // partition_ratio)
        self.num_features = self.embed_dim = embed_dim[-1]
        self.stem = MaxVitStem(in_chs=3, out_chs=stem_width)
        stride = self.stem.stride

        num_stages = len(embed_dim)
        dpr = [x.tolist() for x in torch.linspace(0, drop_path_rate, sum(depths)).split(list(depths))]
        in_chs = self.stem.out_chs
        stages = []
        for i in range(num_stages):
            stage_stride = 2
            out_chs = embed_dim[i]
            stages += [MaxxVitStage(in_chs, out_chs, depth=depths[i], partition_size=partition_size,
                                    dim_head=dim_head, drop_path=dpr[i])]
            stride *= stage_stride
            in_chs = out_chs
        self.stages = nn.Sequential(*stages)

        self.norm = nn.Identity()
        self.head_hidden_size = head_hidden_size
        self.head = NormMlpClassifierHead(self.num_features, num_classes, hidden_size=head_hidden_size)

    def forward_features(self, x):
        x = self.stem(x)
        x = self.stages(x)
        x = self.norm(x)
        return x

    def forward_head(self, x, pre_logits: bool = False):
        return self.head(x, pre_logits=pre_logits)

    def forward(self, x):
        x = self.forward_features(x)
        x = self.forward_head(x)
        return x


# ----------------------------------------------------------------------------- registry

def _randomize_extra(module: nn.Module, seed: int = 0) -> nn.Module:
    """The house `randomize` (BatchNorm2d statistics and affine parameters), then, from the same seed,
    non-trivial LayerNorm / GroupNorm affine parameters (nn and the ConvNeXt-V2 LayerNorm), GRN gamma and beta,
    layer scales and relative-position bias tables (fresh modules have identity norms and zero GRN / bias
    tables, which would make the GRN the identity and the bias a no-op)."""
    randomize(module, seed)
    g = torch.Generator().manual_seed(seed + 1000003)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (nn.GroupNorm, nn.LayerNorm, LayerNorm)) and m.weight is not None:
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.rand(m.bias.shape, generator=g) * 0.5 - 0.25)
            elif isinstance(m, GRN):
                m.gamma.copy_(torch.rand(m.gamma.shape, generator=g) + 0.5)
                m.beta.copy_(torch.rand(m.beta.shape, generator=g) * 0.5 - 0.25)
        for name, p in module.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf.startswith("layer_scale") or (leaf == "gamma" and not name.endswith("grn.gamma")):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif leaf == "relative_position_bias_table":
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return module


FAMILIES = {
    # name: (builder(num_classes), input shape). ResNeSt at 40: 20 -> 10 (max pool) -> 10 -> 5 -> 3, the last
    # avg_down AvgPool2d(2, ceil_mode=True, count_include_pad=False) with a partial window; SegFormer / MobileViT /
    # ConvNeXt V2 / EfficientViT / MaxViT at 64 (SegFormer: 16, 8, 4, 2 tokens a side, the spatial reductions
    # 8, 4, 2 all down to 2x2; MobileViT: 8x8 and 4x4 maps, 2x2 patches; MaxViT: 4x4 windows / grids at 16x16)
    "resnest": (lambda nc: ResNeSt(nc), (2, 3, 40, 40)),
    "segformer": (lambda nc: SegFormer(nc), (2, 3, 64, 64)),
    "mobilevit": (lambda nc: MobileViT(nc), (2, 3, 64, 64)),
    "convnextv2": (lambda nc: ConvNeXtV2(num_classes=nc), (2, 3, 64, 64)),
    "efficientvit": (lambda nc: EfficientViTCls(nc), (2, 3, 64, 64)),
    "maxvit": (lambda nc: MaxxVit(nc), (2, 3, 64, 64)),
}


def build(name: str, num_classes: int = 10, seed: int = 0, train: bool = False) -> nn.Module:
    """Family `name` with its norms, GRNs and bias tables randomized (seeded), in eval mode. train=True: without
    the random parts a training step draws in PyTorch (DropPath's drop_prob and every dropout's p set to 0), so one
    step can be compared with a Trainer's."""
    m = _randomize_extra(FAMILIES[name][0](num_classes), seed).eval()
    if train:
        for mod in m.modules():
            if isinstance(mod, DropPath):
                mod.drop_prob = 0.0
            elif isinstance(mod, nn.modules.dropout._DropoutNd):
                mod.p = 0.0
    return m
