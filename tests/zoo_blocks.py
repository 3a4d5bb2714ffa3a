"""PyTorch definitions of ten CNN families known for unusual blocks, written the way their reference code writes them
(tests only; timm / torchvision are not dependencies): reduced widths, depths and input sizes, the same block
structure and forward-pass idioms.

  MixNet           timm efficientnet.py / _efficientnet_blocks.py / mixed_conv2d.py (mixnet_s arch strings,
                   reduced): MixedConv2d as an nn.ModuleDict (_split_channels with the remainder on the first split,
                   `x_split = torch.split(x, self.splits, 1)`, `[c(x_split[i]) for i, c in enumerate(self.values())]`,
                   torch.cat(x_out, 1)) for the mixed depthwise kernels (3, 5, 7 and 3, 5, 7, 9, the latter on 90
                   channels split 24 / 22 / 22 / 22) and for the "grouped" pointwise convs (kernel list [1, 1]:
                   a1.1 / p1.1), create_conv2d dispatch, BatchNormAct2d (an nn.BatchNorm2d subclass whose forward is
                   F.batch_norm + act, as timm's), SqueezeExcite (x.mean((2, 3), keepdim=True), rd from in_chs),
                   Swish (SiLU) 'nsw' blocks, ReLU elsewhere, DepthwiseSeparableConv / InvertedResidual with skip
  MobileNetV4      timm MobileNetV4 (mobilenetv3.py _gen_mobilenet_v4 'conv_small', _efficientnet_blocks.py):
                   stem ConvNormAct, FusedIB (EdgeResidual: 3x3 expand s2 -> 1x1 project), 'cn' ConvBnAct 1x1,
                   UniversalInvertedResidual in its four forms (ExtraDW: start dw + mid dw, IB: mid dw only,
                   ConvNext-like: start dw only, FFN: neither), ConvNormAct children (.conv / .bn), LayerScale2d
                   (`x * self.gamma.view(1, -1, 1, 1)`) on the last stage (conv_small itself has none; the hybrids'
                   layer_scale_init_value is used here), head: global pool -> conv_head -> norm_head (BN + act)
                   -> flatten -> classifier
  TResNet          Alibaba-MIIL TResNet (tresnet.py, layers/space_to_depth.py, anti_aliasing.py, avg_pool.py,
                   squeeze_and_excite.py): SpaceToDepth written out with the block size 4 hard-coded (the
                   remove_model_jit=True path: view(N, C, H // 4, 4, W // 4, 4).permute(0, 3, 5, 1, 2, 4)
                   .contiguous().view(N, C * 16, H // 4, W // 4)), anti-aliased downsampling (the non-JIT Downsample:
                   binomial filter buffer repeated per channel, F.pad(reflect) + F.conv2d(groups=input.shape[1])),
                   SEModule with FastAvgPool2d (view(...).mean(-1).view(...)), conv2d_ABN with an InPlaceABN
                   stand-in (BN subclass + F.leaky_relu(inplace=True), slope 1e-2 / 1e-3, or identity), BasicBlock
                   (`out += residual`) and Bottleneck (`out = out + residual`), downsample AvgPool2d(2, ceil_mode,
                   count_include_pad=False) + 1x1, FastAvgPool2d(flatten=True) head, self.embeddings set in forward
  CoordAttention   houqb/CoordAttention coordatt.py + mbv2_ca.py: CoordAtt (pool_h AdaptiveAvgPool2d((None, 1)),
                   pool_w ((1, None)).permute(0, 1, 3, 2), torch.cat dim 2, conv1 + BN + h_swish,
                   torch.split(y, [h, w], dim=2), permute back, sigmoid gates, identity * a_w * a_h),
                   h_sigmoid = ReLU6(inplace)(x + 3) / 6, h_swish, MobileNetV2 InvertedResidual with CoordAtt
                   after the depthwise conv, width_mult 0.5, non-square input (h != w at every CoordAtt)
  Triplet+SimAM    landskape-ai/triplet-attention (MODELS/triplet_attention.py: BasicConv, ZPool
                   torch.cat((torch.max(x, 1)[0].unsqueeze(1), torch.mean(x, 1).unsqueeze(1)), dim=1),
                   AttentionGate with torch.sigmoid_, TripletAttention permute(0, 2, 1, 3) / permute(0, 3, 2, 1)
                   .contiguous() branches, 1 / 3 * (...)) and ZjjConan/SimAM (simam_module as written, `activaton`
                   included) in a small CIFAR-style ResNet of BasicBlocks: triplet attention after bn2 as in the
                   triplet repo's ResNet, SimAM appended to conv2 (nn.Sequential(conv2, simam)) as in the SimAM
                   repo's ResNet; non-square input
  FocalNet         microsoft/FocalNet classification/focalnet.py: PatchEmbed (conv, flatten(2).transpose(1, 2),
                   LayerNorm, returns x, H, W), FocalModulation (f Linear, permute(0, 3, 1, 2).contiguous(),
                   `q, ctx, self.gates = torch.split(...)`, `ctx_all = 0` then hierarchical depthwise conv + GELU
                   with `ctx_all = ctx_all + ctx * self.gates[:, l:l+1]`, global context
                   ctx.mean(2, keepdim=True).mean(3, keepdim=True), `self.modulator = self.h(ctx_all)`,
                   q * self.modulator, permute back, proj Linear), FocalNetBlock (B, L, C = x.shape, view(B, H, W, C),
                   blk.H / blk.W set by BasicLayer, gamma_1 / gamma_2 layer scale), BasicLayer downsample by
                   x.transpose(1, 2).reshape(x.shape[0], -1, H, W) + PatchEmbed, final LayerNorm,
                   AdaptiveAvgPool1d on x.transpose(1, 2), torch.flatten
  VanillaNet       huawei-noah/VanillaNet models/vanillanet.py, training-time (deploy=False) form: `activation`
                   (an nn.ReLU subclass holding weight Parameter (dim, 1, 7, 7) and a BN:
                   self.bn(torch.nn.functional.conv2d(super(activation, self).forward(x), self.weight,
                   padding=(self.act_num*2 + 1)//2, groups=self.dim))), Block (conv1 + BN,
                   torch.nn.functional.leaky_relu(x, self.act_learn), conv2 + BN, MaxPool2d(stride) or
                   AdaptiveMaxPool2d((ada_pool, ada_pool)), act), stem1 / stem2, cls1 / cls2 with leaky_relu between,
                   x.view(x.size(0), -1); act_learn set to 0.5 by change_act (mid way through the paper's deep
                   training schedule; at 1 the leaky ReLU is the identity)
  InceptionNeXt    sail-sg/inceptionnext models/inceptionnext.py: InceptionDWConv2d (gc = int(C * 0.125),
                   `x_id, x_hw, x_w, x_h = torch.split(x, self.split_indexes, dim=1)`, 3x3 / 1x11 / 11x1 depthwise
                   convs with bias, torch.cat), MetaNeXtBlock (token mixer, BN, ConvMlp with GELU,
                   x.mul(self.gamma.reshape(1, -1, 1, 1)), drop_path(x) + shortcut), MetaNeXtStage (BN + 2x2 s2
                   conv downsample), stem 4x4 s4 conv + BN, MlpHead (x.mean((2, 3)), Linear, GELU, LayerNorm(eps=1e-6),
                   Linear)
  DPN              timm dpn.py (dpn68 layout, small stem, b=False): DualPathBlock (tuple input -> torch.cat(x, dim=1),
                   proj / down blocks with `x_s1 = x_s[:, :self.num_1x1_c, :, :]`, `x_s2 = x_s[:, self.num_1x1_c:,
                   :, :]`, grouped 3x3, out1 / out2 channel slices, `resid = x_s1 + out1`,
                   `dense = torch.cat([x_s2, out2], dim=1)`, returns the tuple), tuples carried between blocks through
                   nn.Sequential, BnActConv2d (pre-activation BatchNormAct2d eps 1e-3), CatBnAct (cat when a tuple)
                   with ELU (inplace=False) at the end, 1x1-conv classifier, flatten
  StyleGAN2 mod    rosinality/stylegan2-pytorch model.py: EqualConv2d / EqualLinear (weight * scale at run time,
                   bias * lr_mul, fused_lrelu through the CPU fallback of fused_leaky_relu: F.leaky_relu(input +
                   bias.view(1, C, 1, 1), 0.2) * sqrt(2)), PixelNorm + mapping MLP (lr_mul 0.01), ModulatedConv2d
                   (`style = self.modulation(style).view(batch, 1, in_channel, 1, 1)`, `weight = self.scale *
                   self.weight * style`, demod = torch.rsqrt(weight.pow(2).sum([2, 3, 4]) + 1e-8), weight.view(batch
                   * out_channel, ...), input.view(1, batch * in_channel, height, width), F.conv2d(groups=batch),
                   out.view(batch, out_channel, height, width)), StyledConv (without NoiseInjection: its noise is
                   drawn at run time, which no deterministic comparison can follow). A wrapper (not in the repo)
                   makes it a one-input classifier: the latent is derived from the image (stem EqualConv2d +
                   FusedLeakyReLU, global mean, EqualLinear), mapped to a style, and the styled convs run on the stem
                   features; the weights of those convs are computed from the input, so a refusal is expected.

FAMILIES maps a name to (builder(num_classes), input shape (N, C, H, W)); `_randomize_extra` gives BatchNorm
non-trivial statistics (the house `randomize`; timm's BatchNormAct2d and the InPlaceABN stand-in are BatchNorm2d
subclasses) and, from the same seed, LayerNorm affine parameters, layer scales / gammas (MobileNetV4 LayerScale2d,
FocalNet gamma_1 / gamma_2, InceptionNeXt gamma), VanillaNet's activation weights and StyleGAN2's FusedLeakyReLU
biases non-trivial values.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from functools import partial
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import nn

from modern_models import randomize          # non-trivial BN statistics, the house helper
from zoo_vision import BatchNormAct2d, DropPath      # timm's, as zoo_vision writes them


def make_divisible(v, divisor=8, min_value=None, round_limit=.9):
    """timm make_divisible."""
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < round_limit * v:
        new_v += divisor
    return new_v


def create_conv2d_pad(in_chs, out_chs, kernel_size, **kwargs):
    """timm create_conv2d_pad with padding '' (symmetric, static: ((stride - 1) + dilation * (k - 1)) // 2)."""
    padding = kwargs.pop('padding', '')
    kwargs.setdefault('bias', False)
    stride = kwargs.get('stride', 1)
    dilation = kwargs.get('dilation', 1)
    if padding == '':
        padding = ((stride - 1) + dilation * (kernel_size - 1)) // 2
    return nn.Conv2d(in_chs, out_chs, kernel_size, padding=padding, **kwargs)


def _split_channels(num_chan, num_groups):
    split = [num_chan // num_groups for _ in range(num_groups)]
    split[0] += num_chan - sum(split)
    return split


class MixedConv2d(nn.ModuleDict):
    """ Mixed Grouped Convolution

    Based on MDConv and GroupedConv in MixNet impl:
      https://github.com/tensorflow/tpu/blob/master/models/official/mnasnet/mixnet/custom_layers.py
    """
    def __init__(self, in_channels, out_channels, kernel_size=3,
                 stride=1, padding='', dilation=1, depthwise=False, **kwargs):
        super(MixedConv2d, self).__init__()

        kernel_size = kernel_size if isinstance(kernel_size, list) else [kernel_size]
        num_groups = len(kernel_size)
        in_splits = _split_channels(in_channels, num_groups)
        out_splits = _split_channels(out_channels, num_groups)
        self.in_channels = sum(in_splits)
        self.out_channels = sum(out_splits)
        for idx, (k, in_ch, out_ch) in enumerate(zip(kernel_size, in_splits, out_splits)):
            conv_groups = in_ch if depthwise else 1
            # use add_module to keep key space clean
            self.add_module(
                str(idx),
                create_conv2d_pad(
                    in_ch, out_ch, k, stride=stride,
                    padding=padding, dilation=dilation, groups=conv_groups, **kwargs)
            )
        self.splits = in_splits

    def forward(self, x):
        x_split = torch.split(x, self.splits, 1)
        x_out = [c(x_split[i]) for i, c in enumerate(self.values())]
        x = torch.cat(x_out, 1)
        return x


def create_conv2d(in_channels, out_channels, kernel_size, **kwargs):
    """ Select a 2d convolution implementation based on arguments (timm layers/create_conv2d.py)."""
    if isinstance(kernel_size, list):
        if 'groups' in kwargs:
            groups = kwargs.pop('groups')
            if groups == in_channels:
                kwargs['depthwise'] = True
            else:
                assert groups == 1
        # We're going to use only lists for defining the MixedConv2d kernel groups,
        # ints, tuples, other iterables will continue to pass to normal conv and specify h, w.
        m = MixedConv2d(in_channels, out_channels, kernel_size, **kwargs)
    else:
        depthwise = kwargs.pop('depthwise', False)
        # for DW out_channels must be multiple of in_channels as must have out_channels % groups == 0
        groups = in_channels if depthwise else kwargs.pop('groups', 1)
        m = create_conv2d_pad(in_channels, out_channels, kernel_size, groups=groups, **kwargs)
    return m


class SqueezeExcite(nn.Module):
    """ Squeeze-and-Excitation w/ specific features for EfficientNet/MobileNet family (timm)."""

    def __init__(self, in_chs, rd_ratio=0.25, rd_channels=None, act_layer=nn.ReLU, gate_layer=nn.Sigmoid,
                 force_act_layer=None, rd_round_fn=None):
        super(SqueezeExcite, self).__init__()
        if rd_channels is None:
            rd_round_fn = rd_round_fn or round
            rd_channels = rd_round_fn(in_chs * rd_ratio)
        act_layer = force_act_layer or act_layer
        self.conv_reduce = nn.Conv2d(in_chs, rd_channels, 1, bias=True)
        self.act1 = act_layer(inplace=True)
        self.conv_expand = nn.Conv2d(rd_channels, in_chs, 1, bias=True)
        self.gate = gate_layer()

    def forward(self, x):
        x_se = x.mean((2, 3), keepdim=True)
        x_se = self.conv_reduce(x_se)
        x_se = self.act1(x_se)
        x_se = self.conv_expand(x_se)
        return x * self.gate(x_se)


# ============================================================================= MixNet (timm)

class DepthwiseSeparableConv(nn.Module):
    """ Depthwise-separable block (timm): DW conv -> BN-act -> SE -> PW conv -> BN, skip when stride 1 and
    in == out."""

    def __init__(self, in_chs, out_chs, dw_kernel_size=3, stride=1, pad_type='', noskip=False, pw_kernel_size=1,
                 pw_act=False, act_layer=nn.ReLU, se_layer=None, drop_path_rate=0.):
        super(DepthwiseSeparableConv, self).__init__()
        norm_act_layer = partial(BatchNormAct2d, act_layer=act_layer)
        self.has_skip = (stride == 1 and in_chs == out_chs) and not noskip
        self.has_pw_act = pw_act

        self.conv_dw = create_conv2d(in_chs, in_chs, dw_kernel_size, stride=stride, padding=pad_type,
                                     groups=in_chs)
        self.bn1 = norm_act_layer(in_chs, inplace=True)
        self.aa = nn.Identity()

        # Squeeze-and-excitation
        self.se = se_layer(in_chs, act_layer=act_layer) if se_layer else nn.Identity()

        self.conv_pw = create_conv2d(in_chs, out_chs, pw_kernel_size, padding=pad_type)
        self.bn2 = norm_act_layer(out_chs, inplace=True, apply_act=self.has_pw_act)
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate else nn.Identity()

    def forward(self, x):
        shortcut = x
        x = self.conv_dw(x)
        x = self.bn1(x)
        x = self.aa(x)
        x = self.se(x)
        x = self.conv_pw(x)
        x = self.bn2(x)
        if self.has_skip:
            x = self.drop_path(x) + shortcut
        return x


class InvertedResidual(nn.Module):
    """ Inverted residual block w/ optional SE (timm _efficientnet_blocks.InvertedResidual); kernel sizes given as
    lists become MixedConv2d through create_conv2d."""

    def __init__(self, in_chs, out_chs, dw_kernel_size=3, stride=1, pad_type='', noskip=False, exp_ratio=1.0,
                 exp_kernel_size=1, pw_kernel_size=1, act_layer=nn.ReLU, se_layer=None, drop_path_rate=0.):
        super(InvertedResidual, self).__init__()
        norm_act_layer = partial(BatchNormAct2d, act_layer=act_layer)
        mid_chs = in_chs * exp_ratio     # mixnet: round_chs_fn(in_chs * exp_ratio) with multiplier 1.0
        self.has_skip = (in_chs == out_chs and stride == 1) and not noskip

        # Point-wise expansion
        self.conv_pw = create_conv2d(in_chs, mid_chs, exp_kernel_size, padding=pad_type)
        self.bn1 = norm_act_layer(mid_chs, inplace=True)

        # Depth-wise convolution
        self.conv_dw = create_conv2d(mid_chs, mid_chs, dw_kernel_size, stride=stride, groups=mid_chs,
                                     padding=pad_type)
        self.bn2 = norm_act_layer(mid_chs, inplace=True)
        self.aa = nn.Identity()

        # Squeeze-and-excitation
        self.se = se_layer(mid_chs, act_layer=act_layer) if se_layer else nn.Identity()

        # Point-wise linear projection
        self.conv_pwl = create_conv2d(mid_chs, out_chs, pw_kernel_size, padding=pad_type)
        self.bn3 = norm_act_layer(out_chs, apply_act=False)
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate else nn.Identity()

    def forward(self, x):
        shortcut = x
        x = self.conv_pw(x)
        x = self.bn1(x)
        x = self.conv_dw(x)
        x = self.bn2(x)
        x = self.aa(x)
        x = self.se(x)
        x = self.conv_pwl(x)
        x = self.bn3(x)
        if self.has_skip:
            x = self.drop_path(x) + shortcut
        return x


def _mixnet_se(in_chs, se_ratio, exp_ratio):
    # builder: se_from_exp=False -> rd_ratio = se_ratio / exp_ratio of mid_chs (= se_ratio of in_chs)
    return partial(SqueezeExcite, rd_ratio=se_ratio / exp_ratio)


class MixNet(nn.Module):
    """mixnet_s's block kinds at reduced width / depth (arch strings as timm writes them):
        ['ds_r1_k3_s1_e1_c16'],
        ['ir_r1_k3_a1.1_p1.1_s2_e3_c24'],
        ['ir_r1_k3.5.7_s2_e6_c30_se0.5_nsw', 'ir_r1_k3.5.7.9_a1.1_p1.1_s1_e3_c30_se0.5_nsw'],
        ['ir_r1_k3.5_p1.1_s2_e6_c40_se0.25_nsw'],
    at 64x64: 32 (stem), 32, 16, 8, 4. Stem / head act ReLU, 'nsw' blocks Swish."""

    def __init__(self, num_classes=10, in_chans=3, stem_size=16, num_features=128, drop_rate=0.2):
        super().__init__()
        act_layer = nn.ReLU
        swish = nn.SiLU
        self.num_classes = num_classes
        self.drop_rate = drop_rate
        self.conv_stem = create_conv2d(in_chans, stem_size, 3, stride=2, padding='')
        self.bn1 = BatchNormAct2d(stem_size, act_layer=act_layer, inplace=True)
        blocks = [
            nn.Sequential(DepthwiseSeparableConv(16, 16, 3, 1, act_layer=act_layer)),
            nn.Sequential(InvertedResidual(16, 24, 3, 2, exp_ratio=3, exp_kernel_size=[1, 1], pw_kernel_size=[1, 1],
                                           act_layer=act_layer)),
            nn.Sequential(
                InvertedResidual(24, 30, [3, 5, 7], 2, exp_ratio=6, act_layer=swish, se_layer=_mixnet_se(24, .5, 6)),
                InvertedResidual(30, 30, [3, 5, 7, 9], 1, exp_ratio=3, exp_kernel_size=[1, 1],
                                 pw_kernel_size=[1, 1], act_layer=swish, se_layer=_mixnet_se(30, .5, 3)),
            ),
            nn.Sequential(InvertedResidual(30, 40, [3, 5], 2, exp_ratio=6, pw_kernel_size=[1, 1], act_layer=swish,
                                           se_layer=_mixnet_se(30, .25, 6))),
        ]
        self.blocks = nn.Sequential(*blocks)
        self.num_features = num_features
        self.conv_head = create_conv2d(40, self.num_features, 1, padding='')
        self.bn2 = BatchNormAct2d(self.num_features, act_layer=act_layer, inplace=True)
        self.global_pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1))    # SelectAdaptivePool2d('avg')
        self.classifier = nn.Linear(self.num_features, num_classes)

    def forward_features(self, x):
        x = self.conv_stem(x)
        x = self.bn1(x)
        x = self.blocks(x)
        x = self.conv_head(x)
        x = self.bn2(x)
        return x

    def forward_head(self, x, pre_logits: bool = False):
        x = self.global_pool(x)
        if self.drop_rate > 0.:
            x = F.dropout(x, p=self.drop_rate, training=self.training)
        return x if pre_logits else self.classifier(x)

    def forward(self, x):
        x = self.forward_features(x)
        x = self.forward_head(x)
        return x


# ============================================================================= MobileNetV4 (timm)

class ConvNormAct(nn.Module):
    """timm layers/conv_bn_act.py ConvNormAct (conv, then BatchNormAct2d as .bn)."""

    def __init__(self, in_channels, out_channels, kernel_size=1, stride=1, padding='', dilation=1, groups=1,
                 bias=False, apply_act=True, norm_layer=None, act_layer=nn.ReLU, aa_layer=None):
        super(ConvNormAct, self).__init__()
        norm_act_layer = norm_layer or partial(BatchNormAct2d, act_layer=act_layer)   # get_norm_act_layer
        self.conv = create_conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding,
                                  dilation=dilation, groups=groups, bias=bias)
        self.bn = norm_act_layer(out_channels, apply_act=apply_act)

    def forward(self, x):
        x = self.conv(x)
        x = self.bn(x)
        return x


class LayerScale2d(nn.Module):
    def __init__(self, dim, init_values=1e-5, inplace=False):
        super().__init__()
        self.inplace = inplace
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x):
        gamma = self.gamma.view(1, -1, 1, 1)
        return x.mul_(gamma) if self.inplace else x * gamma


class ConvBnAct(nn.Module):
    """ Conv + Norm Layer + Activation w/ optional skip connection (timm 'cn')."""

    def __init__(self, in_chs, out_chs, kernel_size, stride=1, dilation=1, group_size=0, pad_type='', skip=False,
                 act_layer=nn.ReLU, drop_path_rate=0.):
        super(ConvBnAct, self).__init__()
        self.has_skip = skip and stride == 1 and in_chs == out_chs
        self.conv = create_conv2d(in_chs, out_chs, kernel_size, stride=stride, dilation=dilation, padding=pad_type)
        self.bn1 = BatchNormAct2d(out_chs, act_layer=act_layer, inplace=True)
        self.aa = nn.Identity()
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate else nn.Identity()

    def forward(self, x):
        shortcut = x
        x = self.conv(x)
        x = self.bn1(x)
        x = self.aa(x)
        if self.has_skip:
            x = self.drop_path(x) + shortcut
        return x


class EdgeResidual(nn.Module):
    """ Residual block with expansion convolution followed by pointwise-linear w/ stride (timm 'er': FusedIB)."""

    def __init__(self, in_chs, out_chs, exp_kernel_size=3, stride=1, dilation=1, group_size=0, pad_type='',
                 force_in_chs=0, noskip=False, exp_ratio=1.0, pw_kernel_size=1, act_layer=nn.ReLU, se_layer=None,
                 drop_path_rate=0.):
        super(EdgeResidual, self).__init__()
        if force_in_chs > 0:
            mid_chs = make_divisible(force_in_chs * exp_ratio)
        else:
            mid_chs = make_divisible(in_chs * exp_ratio)
        self.has_skip = (in_chs == out_chs and stride == 1) and not noskip

        # Expansion convolution
        self.conv_exp = create_conv2d(in_chs, mid_chs, exp_kernel_size, stride=stride, dilation=dilation,
                                      padding=pad_type)
        self.bn1 = BatchNormAct2d(mid_chs, act_layer=act_layer, inplace=True)
        self.aa = nn.Identity()

        # Squeeze-and-excitation
        self.se = se_layer(mid_chs, act_layer=act_layer) if se_layer else nn.Identity()

        # Point-wise linear projection
        self.conv_pwl = create_conv2d(mid_chs, out_chs, pw_kernel_size, padding=pad_type)
        self.bn2 = BatchNormAct2d(out_chs, apply_act=False)
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate else nn.Identity()

    def forward(self, x):
        shortcut = x
        x = self.conv_exp(x)
        x = self.bn1(x)
        x = self.aa(x)
        x = self.se(x)
        x = self.conv_pwl(x)
        x = self.bn2(x)
        if self.has_skip:
            x = self.drop_path(x) + shortcut
        return x


class UniversalInvertedResidual(nn.Module):
    """ Universal Inverted Residual Block (aka Universal Inverted Bottleneck, UIB)

    For MobileNetV4 - https://arxiv.org/abs/, referenced from
    https://github.com/tensorflow/models/blob/d93c7e932de27522b2fa3b115f58d06d6f640537/
    official/vision/modeling/layers/nn_blocks.py#L778
    """

    def __init__(self, in_chs, out_chs, dw_kernel_size_start=0, dw_kernel_size_mid=3, dw_kernel_size_end=0, stride=1,
                 dilation=1, group_size=1, pad_type='', noskip=False, exp_ratio=1.0, act_layer=nn.ReLU,
                 se_layer=None, drop_path_rate=0., layer_scale_init_value=1e-5):
        super(UniversalInvertedResidual, self).__init__()
        self.has_skip = (in_chs == out_chs and stride == 1) and not noskip
        if stride > 1:
            assert dw_kernel_size_start or dw_kernel_size_mid or dw_kernel_size_end

        if dw_kernel_size_start:
            dw_start_stride = stride if not dw_kernel_size_mid else 1
            self.dw_start = ConvNormAct(
                in_chs, in_chs, dw_kernel_size_start,
                stride=dw_start_stride,
                dilation=dilation,  # FIXME
                groups=in_chs,
                padding=pad_type,
                apply_act=False,
                act_layer=act_layer,
            )
        else:
            self.dw_start = nn.Identity()

        # Point-wise expansion
        mid_chs = make_divisible(in_chs * exp_ratio)
        self.pw_exp = ConvNormAct(in_chs, mid_chs, 1, padding=pad_type, act_layer=act_layer)

        # Middle depth-wise convolution
        if dw_kernel_size_mid:
            self.dw_mid = ConvNormAct(mid_chs, mid_chs, dw_kernel_size_mid, stride=stride, dilation=dilation,
                                      groups=mid_chs, padding=pad_type, act_layer=act_layer)
        else:
            # keeping mid as identity so it can be hooked more easily for features
            self.dw_mid = nn.Identity()

        # Squeeze-and-excitation
        self.se = se_layer(mid_chs, act_layer=act_layer) if se_layer is not None else nn.Identity()

        # Point-wise linear projection
        self.pw_proj = ConvNormAct(mid_chs, out_chs, 1, padding=pad_type, apply_act=False, act_layer=act_layer)

        if dw_kernel_size_end:
            dw_end_stride = stride if not dw_kernel_size_start and not dw_kernel_size_mid else 1
            self.dw_end = ConvNormAct(out_chs, out_chs, dw_kernel_size_end, stride=dw_end_stride, dilation=dilation,
                                      groups=out_chs, padding=pad_type, apply_act=False, act_layer=act_layer)
        else:
            self.dw_end = nn.Identity()

        if layer_scale_init_value is not None:
            self.layer_scale = LayerScale2d(out_chs, layer_scale_init_value)
        else:
            self.layer_scale = nn.Identity()

        self.drop_path = DropPath(drop_path_rate) if drop_path_rate else nn.Identity()

    def forward(self, x):
        shortcut = x
        x = self.dw_start(x)
        x = self.pw_exp(x)
        x = self.dw_mid(x)
        x = self.se(x)
        x = self.pw_proj(x)
        x = self.dw_end(x)
        x = self.layer_scale(x)
        if self.has_skip:
            x = self.drop_path(x) + shortcut
        return x


class MobileNetV4(nn.Module):
    """MobileNetV4 conv-small's block kinds at reduced width / depth (timm arch strings; a = start dw kernel,
    k = mid dw kernel):
        ['er_r1_k3_s2_e2_c24', 'cn_r1_k1_s1_e1_c24'],                  # FusedIB, 1x1 ConvBnAct
        ['uir_r1_a5_k5_s2_e3_c32', 'uir_r1_a0_k3_s1_e2_c32', 'uir_r1_a3_k0_s1_e4_c32'],   # ExtraDW, IB, ConvNext
        ['uir_r1_a3_k3_s2_e4_c48', 'uir_r1_a0_k0_s1_e2_c48', 'uir_r1_a5_k0_s1_e3_c48'],   # + layer scale; FFN
        ['cn_r1_k1_s1_c96'],
    at 64x64: 32 (stem), 16, 8, 4, 4; head: pool, conv_head 128, BN-ReLU, flatten, classifier."""

    def __init__(self, num_classes=10, in_chans=3, stem_size=16, num_features=128, drop_rate=0.2,
                 layer_scale_init_value=1e-5):
        super().__init__()
        self.num_classes = num_classes
        self.drop_rate = drop_rate
        ls = layer_scale_init_value
        self.conv_stem = create_conv2d(in_chans, stem_size, 3, stride=2, padding='')
        self.bn1 = BatchNormAct2d(stem_size, inplace=True)
        self.blocks = nn.Sequential(
            nn.Sequential(EdgeResidual(16, 24, 3, 2, exp_ratio=2.0), ConvBnAct(24, 24, 1)),
            nn.Sequential(
                UniversalInvertedResidual(24, 32, 5, 5, 0, stride=2, exp_ratio=3.0, layer_scale_init_value=None),
                UniversalInvertedResidual(32, 32, 0, 3, 0, exp_ratio=2.0, layer_scale_init_value=None),
                UniversalInvertedResidual(32, 32, 3, 0, 0, exp_ratio=4.0, layer_scale_init_value=None),
            ),
            nn.Sequential(
                UniversalInvertedResidual(32, 48, 3, 3, 0, stride=2, exp_ratio=4.0, layer_scale_init_value=ls),
                UniversalInvertedResidual(48, 48, 0, 0, 0, exp_ratio=2.0, layer_scale_init_value=ls),
                UniversalInvertedResidual(48, 48, 5, 0, 0, exp_ratio=3.0, layer_scale_init_value=ls),
            ),
            nn.Sequential(ConvBnAct(48, 96, 1)),
        )
        self.num_features = 96
        self.head_hidden_size = num_features
        self.global_pool = nn.AdaptiveAvgPool2d(1)    # SelectAdaptivePool2d('avg', flatten=False)
        self.conv_head = create_conv2d(self.num_features, self.head_hidden_size, 1, padding='')
        self.norm_head = BatchNormAct2d(self.head_hidden_size)
        self.act2 = nn.Identity()
        self.flatten = nn.Flatten(1)
        self.classifier = nn.Linear(self.head_hidden_size, num_classes)

    def forward_features(self, x):
        x = self.conv_stem(x)
        x = self.bn1(x)
        x = self.blocks(x)
        return x

    def forward_head(self, x, pre_logits: bool = False):
        x = self.global_pool(x)
        x = self.conv_head(x)
        x = self.norm_head(x)
        x = self.act2(x)
        x = self.flatten(x)
        if pre_logits:
            return x
        if self.drop_rate > 0.:
            x = F.dropout(x, p=self.drop_rate, training=self.training)
        return self.classifier(x)

    def forward(self, x):
        x = self.forward_features(x)
        x = self.forward_head(x)
        return x


# ============================================================================= TResNet (Alibaba-MIIL)

class InPlaceABN(nn.BatchNorm2d):
    """Stand-in for inplace_abn.InPlaceABN (the package is a CUDA extension): its pure-PyTorch ABN forward,
    functional.batch_norm then the named activation in place. A BatchNorm2d subclass so the house randomize
    reaches it."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, activation="leaky_relu",
                 activation_param=0.01):
        super().__init__(num_features, eps=eps, momentum=momentum, affine=affine)
        self.activation = activation
        self.activation_param = activation_param

    def forward(self, x):
        x = F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                         self.training, self.momentum, self.eps)
        if self.activation == "relu":
            return F.relu(x, inplace=True)
        elif self.activation == "leaky_relu":
            return F.leaky_relu(x, negative_slope=self.activation_param, inplace=True)
        elif self.activation == "elu":
            return F.elu(x, alpha=self.activation_param, inplace=True)
        elif self.activation == "identity":
            return x
        else:
            raise RuntimeError("Unknown activation function {}".format(self.activation))


class SpaceToDepth(nn.Module):
    def __init__(self, block_size=4):
        super().__init__()
        assert block_size == 4
        self.bs = block_size

    def forward(self, x):
        # assuming hard-coded that block_size==4 for acceleration
        N, C, H, W = x.size()
        x = x.view(N, C, H // 4, 4, W // 4, 4)  # (N, C, H//bs, bs, W//bs, bs)
        x = x.permute(0, 3, 5, 1, 2, 4).contiguous()  # (N, bs, bs, C, H//bs, W//bs)
        x = x.view(N, C * 16, H // 4, W // 4)  # (N, C*bs^2, H//bs, W//bs)
        return x


class SpaceToDepthModule(nn.Module):
    def __init__(self, remove_model_jit=True):
        super().__init__()
        self.op = SpaceToDepth()

    def forward(self, x):
        return self.op(x)


class Downsample(nn.Module):
    def __init__(self, filt_size=3, stride=2, channels=None):
        super(Downsample, self).__init__()
        self.filt_size = filt_size
        self.stride = stride
        self.channels = channels

        assert self.filt_size == 3
        a = torch.tensor([1., 2., 1.])

        filt = (a[:, None] * a[None, :]).clone().detach()
        filt = filt / torch.sum(filt)
        self.register_buffer('filt', filt[None, None, :, :].repeat((self.channels, 1, 1, 1)))

    def forward(self, input):
        input_pad = F.pad(input, (1, 1, 1, 1), 'reflect')
        return F.conv2d(input_pad, self.filt, stride=self.stride, padding=0, groups=input.shape[1])


class AntiAliasDownsampleLayer(nn.Module):
    def __init__(self, remove_aa_jit: bool = True, filt_size: int = 3, stride: int = 2, channels: int = 0):
        super(AntiAliasDownsampleLayer, self).__init__()
        self.op = Downsample(filt_size, stride, channels)      # the remove_aa_jit=True path

    def forward(self, x):
        return self.op(x)


class FastAvgPool2d(nn.Module):
    def __init__(self, flatten=False):
        super(FastAvgPool2d, self).__init__()
        self.flatten = flatten

    def forward(self, x):
        if self.flatten:
            in_size = x.size()
            return x.view((in_size[0], in_size[1], -1)).mean(dim=2)
        else:
            return x.view(x.size(0), x.size(1), -1).mean(-1).view(x.size(0), x.size(1), 1, 1)


class SEModule(nn.Module):
    def __init__(self, channels, reduction_channels, inplace=True):
        super(SEModule, self).__init__()
        self.avg_pool = FastAvgPool2d()
        self.fc1 = nn.Conv2d(channels, reduction_channels, kernel_size=1, padding=0, bias=True)
        self.relu = nn.ReLU(inplace=inplace)
        self.fc2 = nn.Conv2d(reduction_channels, channels, kernel_size=1, padding=0, bias=True)
        self.activation = nn.Sigmoid()

    def forward(self, x):
        x_se = self.avg_pool(x)
        x_se2 = self.fc1(x_se)
        x_se2 = self.relu(x_se2)
        x_se = self.fc2(x_se2)
        x_se = self.activation(x_se)
        return x * x_se


def conv2d_ABN(ni, nf, stride, activation="leaky_relu", kernel_size=3, activation_param=1e-2, groups=1):
    return nn.Sequential(
        nn.Conv2d(ni, nf, kernel_size=kernel_size, stride=stride, padding=kernel_size // 2, groups=groups,
                  bias=False),
        InPlaceABN(num_features=nf, activation=activation, activation_param=activation_param)
    )


class TResBasicBlock(nn.Module):
    """TResNet BasicBlock."""
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None, use_se=True, anti_alias_layer=None):
        super(TResBasicBlock, self).__init__()
        if stride == 1:
            self.conv1 = conv2d_ABN(inplanes, planes, stride=1, activation_param=1e-3)
        else:
            if anti_alias_layer is None:
                self.conv1 = conv2d_ABN(inplanes, planes, stride=2, activation_param=1e-3)
            else:
                self.conv1 = nn.Sequential(conv2d_ABN(inplanes, planes, stride=1, activation_param=1e-3),
                                           anti_alias_layer(channels=planes, filt_size=3, stride=2))

        self.conv2 = conv2d_ABN(planes, planes, stride=1, activation="identity")
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride
        reduce_layer_planes = max(planes * self.expansion // 4, 64)
        self.se = SEModule(planes * self.expansion, reduce_layer_planes) if use_se else None

    def forward(self, x):
        if self.downsample is not None:
            residual = self.downsample(x)
        else:
            residual = x

        out = self.conv1(x)
        out = self.conv2(out)

        if self.se is not None:
            out = self.se(out)

        out += residual

        out = self.relu(out)

        return out


class TResBottleneck(nn.Module):
    """TResNet Bottleneck."""
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None, use_se=True, anti_alias_layer=None):
        super(TResBottleneck, self).__init__()
        self.conv1 = conv2d_ABN(inplanes, planes, kernel_size=1, stride=1, activation="leaky_relu",
                                activation_param=1e-3)
        if stride == 1:
            self.conv2 = conv2d_ABN(planes, planes, kernel_size=3, stride=1, activation="leaky_relu",
                                    activation_param=1e-3)
        else:
            if anti_alias_layer is None:
                self.conv2 = conv2d_ABN(planes, planes, kernel_size=3, stride=2, activation="leaky_relu",
                                        activation_param=1e-3)
            else:
                self.conv2 = nn.Sequential(conv2d_ABN(planes, planes, kernel_size=3, stride=1,
                                                      activation="leaky_relu", activation_param=1e-3),
                                           anti_alias_layer(channels=planes, filt_size=3, stride=2))

        self.conv3 = conv2d_ABN(planes, planes * self.expansion, kernel_size=1, stride=1,
                                activation="identity")

        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

        reduce_layer_planes = max(planes * self.expansion // 8, 64)
        self.se = SEModule(planes, reduce_layer_planes) if use_se else None

    def forward(self, x):
        if self.downsample is not None:
            residual = self.downsample(x)
        else:
            residual = x

        out = self.conv1(x)
        out = self.conv2(out)
        if self.se is not None:
            out = self.se(out)

        out = self.conv3(out)
        out = out + residual  # no inplace
        out = self.relu(out)

        return out


class TResNet(nn.Module):
    """TResNet-M's layout (Basic, Basic, Bottleneck, Bottleneck; SE on the first three) with layers [1, 1, 1, 1]
    and width_factor 0.125 (planes 8): 64x64 -> 16x16 (space-to-depth), 16, 8, 4, 2."""

    def __init__(self, layers=(1, 1, 1, 1), in_chans=3, num_classes=10, width_factor=0.125, remove_aa_jit=True):
        super(TResNet, self).__init__()

        # JIT layers
        space_to_depth = SpaceToDepthModule()
        anti_alias_layer = partial(AntiAliasDownsampleLayer, remove_aa_jit=remove_aa_jit)
        global_pool_layer = FastAvgPool2d(flatten=True)

        # TResnet stages
        self.inplanes = int(64 * width_factor)
        self.planes = int(64 * width_factor)
        conv1 = conv2d_ABN(in_chans * 16, self.planes, stride=1, kernel_size=3)
        layer1 = self._make_layer(TResBasicBlock, self.planes, layers[0], stride=1, use_se=True,
                                  anti_alias_layer=anti_alias_layer)  # 56x56
        layer2 = self._make_layer(TResBasicBlock, self.planes * 2, layers[1], stride=2, use_se=True,
                                  anti_alias_layer=anti_alias_layer)  # 28x28
        layer3 = self._make_layer(TResBottleneck, self.planes * 4, layers[2], stride=2, use_se=True,
                                  anti_alias_layer=anti_alias_layer)  # 14x14
        layer4 = self._make_layer(TResBottleneck, self.planes * 8, layers[3], stride=2, use_se=False,
                                  anti_alias_layer=anti_alias_layer)  # 7x7

        # body
        self.body = nn.Sequential(OrderedDict([
            ('SpaceToDepth', space_to_depth),
            ('conv1', conv1),
            ('layer1', layer1),
            ('layer2', layer2),
            ('layer3', layer3),
            ('layer4', layer4)]))

        # head
        self.embeddings = []
        self.global_pool = nn.Sequential(OrderedDict([('global_pool_layer', global_pool_layer)]))
        self.num_features = (self.planes * 8) * TResBottleneck.expansion
        fc = nn.Linear(self.num_features, num_classes)
        self.head = nn.Sequential(OrderedDict([('fc', fc)]))

    def _make_layer(self, block, planes, blocks, stride=1, use_se=True, anti_alias_layer=None):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            layers = []
            if stride == 2:
                # avg pooling before 1x1 conv
                layers.append(nn.AvgPool2d(kernel_size=2, stride=2, ceil_mode=True, count_include_pad=False))
            layers += [conv2d_ABN(self.inplanes, planes * block.expansion, kernel_size=1, stride=1,
                                  activation="identity")]
            downsample = nn.Sequential(*layers)

        layers = []
        layers.append(block(self.inplanes, planes, stride, downsample, use_se=use_se,
                            anti_alias_layer=anti_alias_layer))
        self.inplanes = planes * block.expansion
        for i in range(1, blocks):
            layers.append(block(self.inplanes, planes, use_se=use_se, anti_alias_layer=anti_alias_layer))
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.body(x)
        self.embeddings = self.global_pool(x)
        logits = self.head(self.embeddings)
        return logits


# ============================================================================= Coordinate Attention (houqb)

class h_sigmoid(nn.Module):
    def __init__(self, inplace=True):
        super(h_sigmoid, self).__init__()
        self.relu = nn.ReLU6(inplace=inplace)

    def forward(self, x):
        return self.relu(x + 3) / 6


class h_swish(nn.Module):
    def __init__(self, inplace=True):
        super(h_swish, self).__init__()
        self.sigmoid = h_sigmoid(inplace=inplace)

    def forward(self, x):
        return x * self.sigmoid(x)


class CoordAtt(nn.Module):
    def __init__(self, inp, oup, reduction=32):
        super(CoordAtt, self).__init__()
        self.pool_h = nn.AdaptiveAvgPool2d((None, 1))
        self.pool_w = nn.AdaptiveAvgPool2d((1, None))

        mip = max(8, inp // reduction)

        self.conv1 = nn.Conv2d(inp, mip, kernel_size=1, stride=1, padding=0)
        self.bn1 = nn.BatchNorm2d(mip)
        self.act = h_swish()

        self.conv_h = nn.Conv2d(mip, oup, kernel_size=1, stride=1, padding=0)
        self.conv_w = nn.Conv2d(mip, oup, kernel_size=1, stride=1, padding=0)

    def forward(self, x):
        identity = x

        n, c, h, w = x.size()
        x_h = self.pool_h(x)
        x_w = self.pool_w(x).permute(0, 1, 3, 2)

        y = torch.cat([x_h, x_w], dim=2)
        y = self.conv1(y)
        y = self.bn1(y)
        y = self.act(y)

        x_h, x_w = torch.split(y, [h, w], dim=2)
        x_w = x_w.permute(0, 1, 3, 2)

        a_h = self.conv_h(x_h).sigmoid()
        a_w = self.conv_w(x_w).sigmoid()

        out = identity * a_w * a_h

        return out


def _make_divisible(v, divisor, min_value=None):
    """
    This function is taken from the original tf repo.
    It ensures that all layers have a channel number that is divisible by 8
    """
    if min_value is None:
        min_value = divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    # Make sure that round down does not go down by more than 10%.
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


def conv_3x3_bn(inp, oup, stride):
    return nn.Sequential(
        nn.Conv2d(inp, oup, 3, stride, 1, bias=False),
        nn.BatchNorm2d(oup),
        nn.ReLU6(inplace=True)
    )


def conv_1x1_bn(inp, oup):
    return nn.Sequential(
        nn.Conv2d(inp, oup, 1, 1, 0, bias=False),
        nn.BatchNorm2d(oup),
        nn.ReLU6(inplace=True)
    )


class CAInvertedResidual(nn.Module):
    """mbv2_ca.py InvertedResidual."""

    def __init__(self, inp, oup, stride, expand_ratio):
        super(CAInvertedResidual, self).__init__()
        assert stride in [1, 2]

        hidden_dim = round(inp * expand_ratio)
        self.identity = stride == 1 and inp == oup

        if expand_ratio == 1:
            self.conv = nn.Sequential(
                # dw
                nn.Conv2d(hidden_dim, hidden_dim, 3, stride, 1, groups=hidden_dim, bias=False),
                nn.BatchNorm2d(hidden_dim),
                nn.ReLU6(inplace=True),
                # pw-linear
                nn.Conv2d(hidden_dim, oup, 1, 1, 0, bias=False),
                nn.BatchNorm2d(oup),
            )
        else:
            self.conv = nn.Sequential(
                # pw
                nn.Conv2d(inp, hidden_dim, 1, 1, 0, bias=False),
                nn.BatchNorm2d(hidden_dim),
                nn.ReLU6(inplace=True),
                # dw
                nn.Conv2d(hidden_dim, hidden_dim, 3, stride, 1, groups=hidden_dim, bias=False),
                nn.BatchNorm2d(hidden_dim),
                nn.ReLU6(inplace=True),
                # coordinate attention
                CoordAtt(hidden_dim, hidden_dim),
                # pw-linear
                nn.Conv2d(hidden_dim, oup, 1, 1, 0, bias=False),
                nn.BatchNorm2d(oup),
            )

    def forward(self, x):
        y = self.conv(x)
        if self.identity:
            return x + y
        else:
            return y


class MBV2_CA(nn.Module):
    """mbv2_ca.py MBV2_CA with width_mult 0.5, the first five cfg rows (n reduced) and a 256-wide last conv:
    48x64 -> 24x32 (stem), 24x32, 12x16, 6x8, 3x4, 3x4."""

    def __init__(self, num_classes=10, width_mult=0.5, last_channel=256):
        super(MBV2_CA, self).__init__()
        # setting of inverted residual blocks
        self.cfgs = [
            # t, c, n, s
            [1, 16, 1, 1],
            [6, 24, 2, 2],
            [6, 32, 2, 2],
            [6, 64, 2, 2],
            [6, 96, 1, 1],
        ]

        # building first layer
        input_channel = _make_divisible(32 * width_mult, 4 if width_mult == 0.1 else 8)
        layers = [conv_3x3_bn(3, input_channel, 2)]
        # building inverted residual blocks
        block = CAInvertedResidual
        for t, c, n, s in self.cfgs:
            output_channel = _make_divisible(c * width_mult, 4 if width_mult == 0.1 else 8)
            for i in range(n):
                layers.append(block(input_channel, output_channel, s if i == 0 else 1, t))
                input_channel = output_channel
        self.features = nn.Sequential(*layers)
        # building last several layers
        output_channel = _make_divisible(last_channel * width_mult, 4 if width_mult == 0.1 else 8) \
            if width_mult > 1.0 else last_channel
        self.conv = conv_1x1_bn(input_channel, output_channel)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.classifier = nn.Sequential(
            nn.Dropout(0.1),
            nn.Linear(output_channel, num_classes)
        )

    def forward(self, x):
        x = self.features(x)
        x = self.conv(x)
        x = self.avgpool(x)
        x = x.view(x.size(0), -1)
        x = self.classifier(x)
        return x


# ============================================================================= Triplet Attention + SimAM

class BasicConv(nn.Module):
    def __init__(self, in_planes, out_planes, kernel_size, stride=1, padding=0, dilation=1, groups=1, relu=True,
                 bn=True, bias=False):
        super(BasicConv, self).__init__()
        self.out_channels = out_planes
        self.conv = nn.Conv2d(in_planes, out_planes, kernel_size=kernel_size, stride=stride, padding=padding,
                              dilation=dilation, groups=groups, bias=bias)
        self.bn = nn.BatchNorm2d(out_planes, eps=1e-5, momentum=0.01, affine=True) if bn else None
        self.relu = nn.ReLU() if relu else None

    def forward(self, x):
        x = self.conv(x)
        if self.bn is not None:
            x = self.bn(x)
        if self.relu is not None:
            x = self.relu(x)
        return x


class ZPool(nn.Module):
    def forward(self, x):
        return torch.cat((torch.max(x, 1)[0].unsqueeze(1), torch.mean(x, 1).unsqueeze(1)), dim=1)


class AttentionGate(nn.Module):
    def __init__(self):
        super(AttentionGate, self).__init__()
        kernel_size = 7
        self.compress = ZPool()
        self.conv = BasicConv(2, 1, kernel_size, stride=1, padding=(kernel_size - 1) // 2, relu=False)

    def forward(self, x):
        x_compress = self.compress(x)
        x_out = self.conv(x_compress)
        scale = torch.sigmoid_(x_out)
        return x * scale


class TripletAttention(nn.Module):
    def __init__(self, no_spatial=False):
        super(TripletAttention, self).__init__()
        self.cw = AttentionGate()
        self.hc = AttentionGate()
        self.no_spatial = no_spatial
        if not no_spatial:
            self.hw = AttentionGate()

    def forward(self, x):
        x_perm1 = x.permute(0, 2, 1, 3).contiguous()
        x_out1 = self.cw(x_perm1)
        x_out11 = x_out1.permute(0, 2, 1, 3).contiguous()
        x_perm2 = x.permute(0, 3, 2, 1).contiguous()
        x_out2 = self.hc(x_perm2)
        x_out21 = x_out2.permute(0, 3, 2, 1).contiguous()
        if not self.no_spatial:
            x_out = self.hw(x)
            x_out = 1 / 3 * (x_out + x_out11 + x_out21)
        else:
            x_out = 1 / 2 * (x_out11 + x_out21)
        return x_out


class simam_module(torch.nn.Module):
    def __init__(self, channels=None, e_lambda=1e-4):
        super(simam_module, self).__init__()

        self.activaton = nn.Sigmoid()
        self.e_lambda = e_lambda

    def __repr__(self):
        s = self.__class__.__name__ + '('
        s += ('lambda=%f)' % self.e_lambda)
        return s

    @staticmethod
    def get_module_name():
        return "simam"

    def forward(self, x):
        b, c, h, w = x.size()

        n = w * h - 1

        x_minus_mu_square = (x - x.mean(dim=[2, 3], keepdim=True)).pow(2)
        y = x_minus_mu_square / (4 * (x_minus_mu_square.sum(dim=[2, 3], keepdim=True) / n + self.e_lambda)) + 0.5

        return x * self.activaton(y)


def conv3x3(in_planes, out_planes, stride=1):
    "3x3 convolution with padding"
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class AttnBasicBlock(nn.Module):
    """ResNet BasicBlock carrying either attention: 'triplet' (triplet repo model_resnet.py: applied to bn2's output
    before the residual add) or 'simam' (SimAM repo resnet.py: self.conv2 = nn.Sequential(conv2, simam))."""
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None, attention=None):
        super(AttnBasicBlock, self).__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride
        if attention == "simam":
            self.conv2 = nn.Sequential(self.conv2, simam_module(planes))
        if attention == "triplet":
            self.triplet_attention = TripletAttention()
        else:
            self.triplet_attention = None

    def forward(self, x):
        residual = x

        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)

        out = self.conv2(out)
        out = self.bn2(out)

        if self.downsample is not None:
            residual = self.downsample(x)

        if not self.triplet_attention is None:  # noqa: E714  (as the repo writes it)
            out = self.triplet_attention(out)

        out += residual
        out = self.relu(out)

        return out


class TripletSimAMResNet(nn.Module):
    """A CIFAR-style ResNet (3x3 stem, three stages of widths 16, 32, 64) whose blocks carry triplet attention and
    SimAM: layer1 [triplet, simam], layer2 [simam, triplet], layer3 [triplet]; 32x40 -> 32x40, 16x20, 8x10."""

    def __init__(self, num_classes=10, widths=(16, 32, 64)):
        super(TripletSimAMResNet, self).__init__()
        self.inplanes = widths[0]
        self.conv1 = nn.Conv2d(3, widths[0], kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._make_layer(widths[0], ["triplet", "simam"], stride=1)
        self.layer2 = self._make_layer(widths[1], ["simam", "triplet"], stride=2)
        self.layer3 = self._make_layer(widths[2], ["triplet"], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(widths[2], num_classes)

    def _make_layer(self, planes, attentions, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * AttnBasicBlock.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * AttnBasicBlock.expansion, kernel_size=1, stride=stride,
                          bias=False),
                nn.BatchNorm2d(planes * AttnBasicBlock.expansion),
            )
        layers = [AttnBasicBlock(self.inplanes, planes, stride, downsample, attention=attentions[0])]
        self.inplanes = planes * AttnBasicBlock.expansion
        for att in attentions[1:]:
            layers.append(AttnBasicBlock(self.inplanes, planes, attention=att))
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)

        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)

        x = self.avgpool(x)
        x = x.view(x.size(0), -1)
        x = self.fc(x)
        return x


# ============================================================================= FocalNet (microsoft)

def to_2tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x, x)


class Mlp(nn.Module):
    def __init__(self, in_features, hidden_features=None, out_features=None, act_layer=nn.GELU, drop=0.):
        super().__init__()
        out_features = out_features or in_features
        hidden_features = hidden_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x):
        x = self.fc1(x)
        x = self.act(x)
        x = self.drop(x)
        x = self.fc2(x)
        x = self.drop(x)
        return x


class FocalModulation(nn.Module):
    def __init__(self, dim, focal_window, focal_level, focal_factor=2, bias=True, proj_drop=0.,
                 use_postln_in_modulation=False, normalize_modulator=False):
        super().__init__()

        self.dim = dim
        self.focal_window = focal_window
        self.focal_level = focal_level
        self.focal_factor = focal_factor
        self.use_postln_in_modulation = use_postln_in_modulation
        self.normalize_modulator = normalize_modulator

        self.f = nn.Linear(dim, 2 * dim + (self.focal_level + 1), bias=bias)
        self.h = nn.Conv2d(dim, dim, kernel_size=1, stride=1, bias=bias)

        self.act = nn.GELU()
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.focal_layers = nn.ModuleList()

        self.kernel_sizes = []
        for k in range(self.focal_level):
            kernel_size = self.focal_factor * k + self.focal_window
            self.focal_layers.append(
                nn.Sequential(
                    nn.Conv2d(dim, dim, kernel_size=kernel_size, stride=1,
                              groups=dim, padding=kernel_size // 2, bias=False),
                    nn.GELU(),
                )
            )
            self.kernel_sizes.append(kernel_size)
        if self.use_postln_in_modulation:
            self.ln = nn.LayerNorm(dim)

    def forward(self, x):
        """
        Args:
            x: input features with shape of (B, H, W, C)
        """
        C = x.shape[-1]

        # pre linear projection
        x = self.f(x).permute(0, 3, 1, 2).contiguous()
        q, ctx, self.gates = torch.split(x, (C, C, self.focal_level + 1), 1)

        # context aggreation
        ctx_all = 0
        for l in range(self.focal_level):  # noqa: E741
            ctx = self.focal_layers[l](ctx)
            ctx_all = ctx_all + ctx * self.gates[:, l:l + 1]
        ctx_global = self.act(ctx.mean(2, keepdim=True).mean(3, keepdim=True))
        ctx_all = ctx_all + ctx_global * self.gates[:, self.focal_level:]

        # normalize context
        if self.normalize_modulator:
            ctx_all = ctx_all / (self.focal_level + 1)

        # focal modulation
        self.modulator = self.h(ctx_all)
        x_out = q * self.modulator
        x_out = x_out.permute(0, 2, 3, 1).contiguous()
        if self.use_postln_in_modulation:
            x_out = self.ln(x_out)

        # post linear porjection
        x_out = self.proj(x_out)
        x_out = self.proj_drop(x_out)
        return x_out


class FocalNetBlock(nn.Module):
    def __init__(self, dim, input_resolution, mlp_ratio=4., drop=0., drop_path=0., act_layer=nn.GELU,
                 norm_layer=nn.LayerNorm, focal_level=1, focal_window=3, use_layerscale=False, layerscale_value=1e-4,
                 use_postln=False, use_postln_in_modulation=False, normalize_modulator=False):
        super().__init__()
        self.dim = dim
        self.input_resolution = input_resolution
        self.mlp_ratio = mlp_ratio

        self.focal_window = focal_window
        self.focal_level = focal_level
        self.use_postln = use_postln

        self.norm1 = norm_layer(dim)
        self.modulation = FocalModulation(
            dim, proj_drop=drop, focal_window=focal_window, focal_level=self.focal_level,
            use_postln_in_modulation=use_postln_in_modulation, normalize_modulator=normalize_modulator
        )

        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = norm_layer(dim)
        mlp_hidden_dim = int(dim * mlp_ratio)
        self.mlp = Mlp(in_features=dim, hidden_features=mlp_hidden_dim, act_layer=act_layer, drop=drop)

        self.gamma_1 = 1.0
        self.gamma_2 = 1.0
        if use_layerscale:
            self.gamma_1 = nn.Parameter(layerscale_value * torch.ones((dim)), requires_grad=True)
            self.gamma_2 = nn.Parameter(layerscale_value * torch.ones((dim)), requires_grad=True)

        self.H = None
        self.W = None

    def forward(self, x):
        H, W = self.H, self.W
        B, L, C = x.shape
        shortcut = x

        # Focal Modulation
        x = x if self.use_postln else self.norm1(x)
        x = x.view(B, H, W, C)
        x = self.modulation(x).view(B, H * W, C)
        x = x if not self.use_postln else self.norm1(x)

        # FFN
        x = shortcut + self.drop_path(self.gamma_1 * x)
        x = x + self.drop_path(self.gamma_2 * (self.norm2(self.mlp(x)) if self.use_postln
                                               else self.mlp(self.norm2(x))))

        return x


class FocalPatchEmbed(nn.Module):
    """FocalNet PatchEmbed."""

    def __init__(self, img_size=(224, 224), patch_size=4, in_chans=3, embed_dim=96, use_conv_embed=False,
                 norm_layer=None, is_stem=False):
        super().__init__()
        patch_size = to_2tuple(patch_size)
        patches_resolution = [img_size[0] // patch_size[0], img_size[1] // patch_size[1]]
        self.img_size = img_size
        self.patch_size = patch_size
        self.patches_resolution = patches_resolution
        self.num_patches = patches_resolution[0] * patches_resolution[1]

        self.in_chans = in_chans
        self.embed_dim = embed_dim

        if use_conv_embed:
            # if we choose to use conv embedding, then we treat the stem and non-stem differently
            if is_stem:
                kernel_size = 7
                padding = 2
                stride = 4
            else:
                kernel_size = 3
                padding = 1
                stride = 2
            self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=kernel_size, stride=stride, padding=padding)
        else:
            self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

        if norm_layer is not None:
            self.norm = norm_layer(embed_dim)
        else:
            self.norm = None

    def forward(self, x):
        B, C, H, W = x.shape

        x = self.proj(x)
        H, W = x.shape[2:]
        x = x.flatten(2).transpose(1, 2)  # B Ph*Pw C
        if self.norm is not None:
            x = self.norm(x)
        return x, H, W


class FocalBasicLayer(nn.Module):
    """FocalNet BasicLayer."""

    def __init__(self, dim, out_dim, input_resolution, depth, mlp_ratio=4., drop=0., drop_path=0.,
                 norm_layer=nn.LayerNorm, downsample=None, use_checkpoint=False, focal_level=1, focal_window=1,
                 use_conv_embed=False, use_layerscale=False, layerscale_value=1e-4, use_postln=False,
                 use_postln_in_modulation=False, normalize_modulator=False):
        super().__init__()
        self.dim = dim
        self.input_resolution = input_resolution
        self.depth = depth
        self.use_checkpoint = use_checkpoint

        # build blocks
        self.blocks = nn.ModuleList([
            FocalNetBlock(
                dim=dim,
                input_resolution=input_resolution,
                mlp_ratio=mlp_ratio,
                drop=drop,
                drop_path=drop_path[i] if isinstance(drop_path, list) else drop_path,
                norm_layer=norm_layer,
                focal_level=focal_level,
                focal_window=focal_window,
                use_layerscale=use_layerscale,
                layerscale_value=layerscale_value,
                use_postln=use_postln,
                use_postln_in_modulation=use_postln_in_modulation,
                normalize_modulator=normalize_modulator,
            )
            for i in range(depth)])

        if downsample is not None:
            self.downsample = downsample(
                img_size=input_resolution,
                patch_size=2,
                in_chans=dim,
                embed_dim=out_dim,
                use_conv_embed=use_conv_embed,
                norm_layer=norm_layer,
                is_stem=False
            )
        else:
            self.downsample = None

    def forward(self, x, H, W):
        for blk in self.blocks:
            blk.H, blk.W = H, W
            x = blk(x)

        if self.downsample is not None:
            x = x.transpose(1, 2).reshape(x.shape[0], -1, H, W)
            x, Ho, Wo = self.downsample(x)
        else:
            Ho, Wo = H, W
        return x, Ho, Wo


class FocalNet(nn.Module):
    """FocalNet (srf: focal_levels 2, focal_windows 3) with embed_dim 16, depths [1, 2, 1], layer scale on:
    64x64 -> 16x16 tokens, 8x8, 4x4."""

    def __init__(self, img_size=64, patch_size=4, in_chans=3, num_classes=10, embed_dim=16, depths=(1, 2, 1),
                 mlp_ratio=4., drop_rate=0., drop_path_rate=0.1, norm_layer=nn.LayerNorm, patch_norm=True,
                 use_checkpoint=False, focal_levels=(2, 2, 2), focal_windows=(3, 3, 3), use_conv_embed=False,
                 use_layerscale=True, layerscale_value=1e-4, use_postln=False, use_postln_in_modulation=False,
                 normalize_modulator=False, **kwargs):
        super().__init__()

        self.num_layers = len(depths)
        embed_dim = [embed_dim * (2 ** i) for i in range(self.num_layers)]

        self.num_classes = num_classes
        self.embed_dim = embed_dim
        self.patch_norm = patch_norm
        self.num_features = embed_dim[-1]
        self.mlp_ratio = mlp_ratio

        # split image into patches using either non-overlapped embedding or overlapped embedding
        self.patch_embed = FocalPatchEmbed(
            img_size=to_2tuple(img_size),
            patch_size=patch_size,
            in_chans=in_chans,
            embed_dim=embed_dim[0],
            use_conv_embed=use_conv_embed,
            norm_layer=norm_layer if self.patch_norm else None,
            is_stem=True)

        patches_resolution = self.patch_embed.patches_resolution
        self.patches_resolution = patches_resolution
        self.pos_drop = nn.Dropout(p=drop_rate)

        # stochastic depth
        dpr = [x.item() for x in torch.linspace(0, drop_path_rate, sum(depths))]  # stochastic depth decay rule

        # build layers
        self.layers = nn.ModuleList()
        for i_layer in range(self.num_layers):
            layer = FocalBasicLayer(
                dim=embed_dim[i_layer],
                out_dim=embed_dim[i_layer + 1] if (i_layer < self.num_layers - 1) else None,
                input_resolution=(patches_resolution[0] // (2 ** i_layer),
                                  patches_resolution[1] // (2 ** i_layer)),
                depth=depths[i_layer],
                mlp_ratio=self.mlp_ratio,
                drop=drop_rate,
                drop_path=dpr[sum(depths[:i_layer]):sum(depths[:i_layer + 1])],
                norm_layer=norm_layer,
                downsample=FocalPatchEmbed if (i_layer < self.num_layers - 1) else None,
                focal_level=focal_levels[i_layer],
                focal_window=focal_windows[i_layer],
                use_conv_embed=use_conv_embed,
                use_checkpoint=use_checkpoint,
                use_layerscale=use_layerscale,
                layerscale_value=layerscale_value,
                use_postln=use_postln,
                use_postln_in_modulation=use_postln_in_modulation,
                normalize_modulator=normalize_modulator
            )
            self.layers.append(layer)

        self.norm = norm_layer(self.num_features)
        self.avgpool = nn.AdaptiveAvgPool1d(1)
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()

    def forward_features(self, x):
        x, H, W = self.patch_embed(x)
        x = self.pos_drop(x)

        for layer in self.layers:
            x, H, W = layer(x, H, W)
        x = self.norm(x)  # B L C
        x = self.avgpool(x.transpose(1, 2))  # B C 1
        x = torch.flatten(x, 1)
        return x

    def forward(self, x):
        x = self.forward_features(x)
        x = self.head(x)
        return x


# ============================================================================= VanillaNet (huawei-noah)

class activation(nn.ReLU):
    def __init__(self, dim, act_num=3, deploy=False):
        super(activation, self).__init__()
        self.deploy = deploy
        self.weight = torch.nn.Parameter(torch.randn(dim, 1, act_num * 2 + 1, act_num * 2 + 1))
        self.bias = None
        self.bn = nn.BatchNorm2d(dim, eps=1e-6)
        self.dim = dim
        self.act_num = act_num
        nn.init.trunc_normal_(self.weight, std=.02)

    def forward(self, x):
        if self.deploy:
            return torch.nn.functional.conv2d(
                super(activation, self).forward(x),
                self.weight, self.bias, padding=(self.act_num * 2 + 1) // 2, groups=self.dim)
        else:
            return self.bn(torch.nn.functional.conv2d(
                super(activation, self).forward(x),
                self.weight, padding=(self.act_num * 2 + 1) // 2, groups=self.dim))


class VanillaBlock(nn.Module):
    """VanillaNet Block."""

    def __init__(self, dim, dim_out, act_num=3, stride=2, deploy=False, ada_pool=None):
        super().__init__()
        self.act_learn = 1
        self.deploy = deploy
        if self.deploy:
            self.conv = nn.Conv2d(dim, dim_out, kernel_size=1)
        else:
            self.conv1 = nn.Sequential(
                nn.Conv2d(dim, dim, kernel_size=1),
                nn.BatchNorm2d(dim, eps=1e-6),
            )
            self.conv2 = nn.Sequential(
                nn.Conv2d(dim, dim_out, kernel_size=1),
                nn.BatchNorm2d(dim_out, eps=1e-6)
            )

        if not ada_pool:
            self.pool = nn.Identity() if stride == 1 else nn.MaxPool2d(stride)
        else:
            self.pool = nn.Identity() if stride == 1 else nn.AdaptiveMaxPool2d((ada_pool, ada_pool))

        self.act = activation(dim_out, act_num, deploy=self.deploy)

    def forward(self, x):
        if self.deploy:
            x = self.conv(x)
        else:
            x = self.conv1(x)
            x = torch.nn.functional.leaky_relu(x, self.act_learn)
            x = self.conv2(x)

        x = self.pool(x)
        x = self.act(x)
        return x


class VanillaNet(nn.Module):
    """VanillaNet-5-like (three stages) with dims [16, 32, 64, 96], strides [2, 2, 1], ada_pool [0, 4, 0] (stage 1
    an AdaptiveMaxPool2d((4, 4)) from 8x8): 64x64 -> 16 (stem), 8 (MaxPool2d(2)), 4, 4. (The repo's ada_pool
    variants pool to sizes that do not divide the input, e.g. 56 -> 40; the TorchScript ONNX exporter refuses
    adaptive_max_pool2d with such sizes, so the registry keeps a dividing one.)"""

    def __init__(self, in_chans=3, num_classes=10, dims=(16, 32, 64, 96), drop_rate=0, act_num=3, strides=(2, 2, 1),
                 deploy=False, ada_pool=(0, 4, 0), **kwargs):
        super().__init__()
        self.deploy = deploy
        if self.deploy:
            self.stem = nn.Sequential(
                nn.Conv2d(in_chans, dims[0], kernel_size=4, stride=4),
                activation(dims[0], act_num, deploy=self.deploy)
            )
        else:
            self.stem1 = nn.Sequential(
                nn.Conv2d(in_chans, dims[0], kernel_size=4, stride=4),
                nn.BatchNorm2d(dims[0], eps=1e-6),
            )
            self.stem2 = nn.Sequential(
                nn.Conv2d(dims[0], dims[0], kernel_size=1, stride=1),
                nn.BatchNorm2d(dims[0], eps=1e-6),
                activation(dims[0], act_num)
            )

        self.act_learn = 1

        self.stages = nn.ModuleList()
        for i in range(len(strides)):
            if not ada_pool:
                stage = VanillaBlock(dim=dims[i], dim_out=dims[i + 1], act_num=act_num, stride=strides[i],
                                     deploy=deploy)
            else:
                stage = VanillaBlock(dim=dims[i], dim_out=dims[i + 1], act_num=act_num, stride=strides[i],
                                     deploy=deploy, ada_pool=ada_pool[i])
            self.stages.append(stage)
        self.depth = len(strides)

        if self.deploy:
            self.cls = nn.Sequential(
                nn.AdaptiveAvgPool2d((1, 1)),
                nn.Dropout(drop_rate),
                nn.Conv2d(dims[-1], num_classes, 1),
            )
        else:
            self.cls1 = nn.Sequential(
                nn.AdaptiveAvgPool2d((1, 1)),
                nn.Dropout(drop_rate),
                nn.Conv2d(dims[-1], num_classes, 1),
                nn.BatchNorm2d(num_classes, eps=1e-6),
            )

            self.cls2 = nn.Sequential(
                nn.Conv2d(num_classes, num_classes, 1)
            )

    def change_act(self, m):
        for i in range(self.depth):
            self.stages[i].act_learn = m
        self.act_learn = m

    def forward(self, x):
        if self.deploy:
            x = self.stem(x)
        else:
            x = self.stem1(x)
            x = torch.nn.functional.leaky_relu(x, self.act_learn)
            x = self.stem2(x)

        for i in range(self.depth):
            x = self.stages[i](x)

        if self.deploy:
            x = self.cls(x)
        else:
            x = self.cls1(x)
            x = torch.nn.functional.leaky_relu(x, self.act_learn)
            x = self.cls2(x)
        return x.view(x.size(0), -1)


def _vanillanet(num_classes):
    m = VanillaNet(num_classes=num_classes)
    m.change_act(0.5)       # the training schedule's act_learn, half way (1 would make the leaky ReLUs identities)
    return m


# ============================================================================= InceptionNeXt (sail-sg)

class InceptionDWConv2d(nn.Module):
    """ Inception depthweise convolution
    """
    def __init__(self, in_channels, square_kernel_size=3, band_kernel_size=11, branch_ratio=0.125):
        super().__init__()

        gc = int(in_channels * branch_ratio)  # channel numbers of a convolution branch
        self.dwconv_hw = nn.Conv2d(gc, gc, square_kernel_size, padding=square_kernel_size // 2, groups=gc)
        self.dwconv_w = nn.Conv2d(gc, gc, kernel_size=(1, band_kernel_size), padding=(0, band_kernel_size // 2),
                                  groups=gc)
        self.dwconv_h = nn.Conv2d(gc, gc, kernel_size=(band_kernel_size, 1), padding=(band_kernel_size // 2, 0),
                                  groups=gc)
        self.split_indexes = (in_channels - 3 * gc, gc, gc, gc)

    def forward(self, x):
        x_id, x_hw, x_w, x_h = torch.split(x, self.split_indexes, dim=1)
        return torch.cat(
            (x_id, self.dwconv_hw(x_hw), self.dwconv_w(x_w), self.dwconv_h(x_h)),
            dim=1,
        )


class ConvMlp(nn.Module):
    """ MLP using 1x1 convs that keeps spatial dims
    copied from timm: https://github.com/huggingface/pytorch-image-models/blob/v0.6.11/timm/models/layers/mlp.py
    """
    def __init__(self, in_features, hidden_features=None, out_features=None, act_layer=nn.ReLU, norm_layer=None,
                 bias=True, drop=0.):
        super().__init__()
        out_features = out_features or in_features
        hidden_features = hidden_features or in_features
        bias = to_2tuple(bias)

        self.fc1 = nn.Conv2d(in_features, hidden_features, kernel_size=1, bias=bias[0])
        self.norm = norm_layer(hidden_features) if norm_layer else nn.Identity()
        self.act = act_layer()
        self.drop = nn.Dropout(drop)
        self.fc2 = nn.Conv2d(hidden_features, out_features, kernel_size=1, bias=bias[1])

    def forward(self, x):
        x = self.fc1(x)
        x = self.norm(x)
        x = self.act(x)
        x = self.drop(x)
        x = self.fc2(x)
        return x


class MlpHead(nn.Module):
    """ MLP classification head
    """
    def __init__(self, dim, num_classes=1000, mlp_ratio=3, act_layer=nn.GELU,
                 norm_layer=partial(nn.LayerNorm, eps=1e-6), drop=0., bias=True):
        super().__init__()
        hidden_features = int(mlp_ratio * dim)
        self.fc1 = nn.Linear(dim, hidden_features, bias=bias)
        self.act = act_layer()
        self.norm = norm_layer(hidden_features)
        self.fc2 = nn.Linear(hidden_features, num_classes, bias=bias)
        self.drop = nn.Dropout(drop)

    def forward(self, x):
        x = x.mean((2, 3))  # global average pooling
        x = self.fc1(x)
        x = self.act(x)
        x = self.norm(x)
        x = self.drop(x)
        x = self.fc2(x)
        return x


class MetaNeXtBlock(nn.Module):
    """ MetaNeXtBlock Block
    Args:
        dim (int): Number of input channels.
        drop_path (float): Stochastic depth rate. Default: 0.0
        ls_init_value (float): Init value for Layer Scale. Default: 1e-6.
    """

    def __init__(self, dim, token_mixer=nn.Identity, norm_layer=nn.BatchNorm2d, mlp_layer=ConvMlp, mlp_ratio=4,
                 act_layer=nn.GELU, ls_init_value=1e-6, drop_path=0.):
        super().__init__()
        self.token_mixer = token_mixer(dim)
        self.norm = norm_layer(dim)
        self.mlp = mlp_layer(dim, int(mlp_ratio * dim), act_layer=act_layer)
        self.gamma = nn.Parameter(ls_init_value * torch.ones(dim)) if ls_init_value else None
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()

    def forward(self, x):
        shortcut = x
        x = self.token_mixer(x)
        x = self.norm(x)
        x = self.mlp(x)
        if self.gamma is not None:
            x = x.mul(self.gamma.reshape(1, -1, 1, 1))
        x = self.drop_path(x) + shortcut
        return x


class MetaNeXtStage(nn.Module):
    def __init__(self, in_chs, out_chs, ds_stride=2, depth=2, drop_path_rates=None, ls_init_value=1.0,
                 token_mixer=nn.Identity, act_layer=nn.GELU, norm_layer=None, mlp_ratio=4):
        super().__init__()
        self.grad_checkpointing = False
        if ds_stride > 1:
            self.downsample = nn.Sequential(
                norm_layer(in_chs),
                nn.Conv2d(in_chs, out_chs, kernel_size=ds_stride, stride=ds_stride),
            )
        else:
            self.downsample = nn.Identity()

        drop_path_rates = drop_path_rates or [0.] * depth
        stage_blocks = []
        for i in range(depth):
            stage_blocks.append(MetaNeXtBlock(
                dim=out_chs,
                drop_path=drop_path_rates[i],
                ls_init_value=ls_init_value,
                token_mixer=token_mixer,
                act_layer=act_layer,
                norm_layer=norm_layer,
                mlp_ratio=mlp_ratio,
            ))
            in_chs = out_chs
        self.blocks = nn.Sequential(*stage_blocks)

    def forward(self, x):
        x = self.downsample(x)
        x = self.blocks(x)
        return x


class MetaNeXt(nn.Module):
    r""" MetaNeXt (inceptionnext_tiny's token mixers, band kernel 11) with depths (1, 1, 2, 1), dims
    (16, 32, 64, 96): 64x64 -> 16x16 (stem), 16, 8, 4, 2; gc = 2, 4, 8, 12."""

    def __init__(self, in_chans=3, num_classes=10, depths=(1, 1, 2, 1), dims=(16, 32, 64, 96),
                 token_mixers=InceptionDWConv2d, norm_layer=nn.BatchNorm2d, act_layer=nn.GELU,
                 mlp_ratios=(4, 4, 4, 3), head_fn=MlpHead, drop_rate=0., drop_path_rate=0.1, ls_init_value=1e-6,
                 **kwargs):
        super().__init__()

        num_stage = len(depths)
        if not isinstance(token_mixers, (list, tuple)):
            token_mixers = [token_mixers] * num_stage
        if not isinstance(mlp_ratios, (list, tuple)):
            mlp_ratios = [mlp_ratios] * num_stage

        self.num_classes = num_classes
        self.drop_rate = drop_rate
        self.stem = nn.Sequential(
            nn.Conv2d(in_chans, dims[0], kernel_size=4, stride=4),
            norm_layer(dims[0])
        )

        self.stages = nn.Sequential()
        dp_rates = [x.tolist() for x in torch.linspace(0, drop_path_rate, sum(depths)).split(depths)]
        stages = []
        prev_chs = dims[0]
        # feature resolution stages, each consisting of multiple residual blocks
        for i in range(num_stage):
            out_chs = dims[i]
            stages.append(MetaNeXtStage(
                prev_chs,
                out_chs,
                ds_stride=2 if i > 0 else 1,
                depth=depths[i],
                drop_path_rates=dp_rates[i],
                ls_init_value=ls_init_value,
                act_layer=act_layer,
                token_mixer=token_mixers[i],
                norm_layer=norm_layer,
                mlp_ratio=mlp_ratios[i],
            ))
            prev_chs = out_chs
        self.stages = nn.Sequential(*stages)
        self.num_features = prev_chs
        if self.num_classes > 0:
            if issubclass(head_fn, MlpHead):
                self.head = head_fn(self.num_features, num_classes, drop=self.drop_rate)
            else:
                self.head = head_fn(self.num_features, num_classes)
        else:
            self.head = nn.Identity()

    def forward_features(self, x):
        x = self.stem(x)
        x = self.stages(x)
        return x

    def forward_head(self, x):
        x = self.head(x)
        return x

    def forward(self, x):
        x = self.forward_features(x)
        x = self.forward_head(x)
        return x


# ============================================================================= DPN (timm dpn.py)

class CatBnAct(nn.Module):
    def __init__(self, in_chs, norm_layer=BatchNormAct2d):
        super(CatBnAct, self).__init__()
        self.bn = norm_layer(in_chs, eps=0.001)

    def forward(self, x):
        if isinstance(x, tuple):
            x = torch.cat(x, dim=1)
        return self.bn(x)


class BnActConv2d(nn.Module):
    def __init__(self, in_chs, out_chs, kernel_size, stride, groups=1, norm_layer=BatchNormAct2d):
        super(BnActConv2d, self).__init__()
        self.bn = norm_layer(in_chs, eps=0.001)
        self.conv = create_conv2d(in_chs, out_chs, kernel_size, stride=stride, groups=groups)

    def forward(self, x):
        return self.conv(self.bn(x))


class DualPathBlock(nn.Module):
    def __init__(self, in_chs, num_1x1_a, num_3x3_b, num_1x1_c, inc, groups, block_type='normal', b=False):
        super(DualPathBlock, self).__init__()
        self.num_1x1_c = num_1x1_c
        self.inc = inc
        self.b = b
        if block_type == 'proj':
            self.key_stride = 1
            self.has_proj = True
        elif block_type == 'down':
            self.key_stride = 2
            self.has_proj = True
        else:
            assert block_type == 'normal'
            self.key_stride = 1
            self.has_proj = False

        self.c1x1_w_s1 = None
        self.c1x1_w_s2 = None
        if self.has_proj:
            # Using different member names here to allow easier parameter key matching for porting
            if self.key_stride == 2:
                self.c1x1_w_s2 = BnActConv2d(
                    in_chs=in_chs, out_chs=num_1x1_c + 2 * inc, kernel_size=1, stride=2)
            else:
                self.c1x1_w_s1 = BnActConv2d(
                    in_chs=in_chs, out_chs=num_1x1_c + 2 * inc, kernel_size=1, stride=1)

        self.c1x1_a = BnActConv2d(in_chs=in_chs, out_chs=num_1x1_a, kernel_size=1, stride=1)
        self.c3x3_b = BnActConv2d(
            in_chs=num_1x1_a, out_chs=num_3x3_b, kernel_size=3, stride=self.key_stride, groups=groups)
        if b:
            self.c1x1_c = CatBnAct(in_chs=num_3x3_b)
            self.c1x1_c1 = create_conv2d(num_3x3_b, num_1x1_c, kernel_size=1)
            self.c1x1_c2 = create_conv2d(num_3x3_b, inc, kernel_size=1)
        else:
            self.c1x1_c = BnActConv2d(in_chs=num_3x3_b, out_chs=num_1x1_c + inc, kernel_size=1, stride=1)
            self.c1x1_c1 = None
            self.c1x1_c2 = None

    def forward(self, x) -> Tuple[torch.Tensor, torch.Tensor]:
        if isinstance(x, tuple):
            x_in = torch.cat(x, dim=1)
        else:
            x_in = x
        if self.c1x1_w_s1 is None and self.c1x1_w_s2 is None:
            # self.has_proj == False, torchscript requires condition on module == None
            x_s1 = x[0]
            x_s2 = x[1]
        else:
            # self.has_proj == True
            if self.c1x1_w_s1 is not None:
                # self.key_stride = 1
                x_s = self.c1x1_w_s1(x_in)
            else:
                # self.key_stride = 2
                x_s = self.c1x1_w_s2(x_in)
            x_s1 = x_s[:, :self.num_1x1_c, :, :]
            x_s2 = x_s[:, self.num_1x1_c:, :, :]
        x_in = self.c1x1_a(x_in)
        x_in = self.c3x3_b(x_in)
        x_in = self.c1x1_c(x_in)
        if self.c1x1_c1 is not None:
            # self.b == True, using None check for torchscript compat
            out1 = self.c1x1_c1(x_in)
            out2 = self.c1x1_c2(x_in)
        else:
            out1 = x_in[:, :self.num_1x1_c, :, :]
            out2 = x_in[:, self.num_1x1_c:, :, :]
        resid = x_s1 + out1
        dense = torch.cat([x_s2, out2], dim=1)
        return resid, dense


class DPN(nn.Module):
    """timm DPN, dpn68's small stem (3x3 conv s2 + max pool) and b=False, with the stage bottleneck widths
    64 / 128 / 256 / 512 scaled by base_width / 64 (16: 16, 32, 64, 128), k_r 16, groups 4, k_sec (1, 2, 2, 1),
    inc_sec (4, 8, 8, 16): 64x64 -> 32 (conv1_1), 16 (pool), 16, 8, 4, 2."""

    def __init__(self, k_sec=(1, 2, 2, 1), inc_sec=(4, 8, 8, 16), k_r=16, groups=4, num_classes=10, in_chans=3,
                 output_stride=32, global_pool='avg', small=True, num_init_features=16, b=False, drop_rate=0.,
                 base_width=16):
        super(DPN, self).__init__()
        self.num_classes = num_classes
        self.drop_rate = drop_rate
        self.b = b
        assert output_stride == 32  # FIXME look into dilation support
        norm_layer = partial(BatchNormAct2d, act_layer=nn.ReLU, eps=.001)
        fc_norm_layer = partial(BatchNormAct2d, act_layer=nn.ELU, eps=.001, inplace=False)
        bw_factor = 1 if small else 4
        blocks = OrderedDict()

        # conv1
        blocks['conv1_1'] = ConvNormAct(in_chans, num_init_features, kernel_size=3 if small else 7, stride=2,
                                        norm_layer=norm_layer)
        blocks['conv1_pool'] = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)

        # conv2
        bw = base_width * bw_factor
        inc = inc_sec[0]
        r = (k_r * bw) // (base_width * bw_factor)
        blocks['conv2_1'] = DualPathBlock(num_init_features, r, r, bw, inc, groups, 'proj', b)
        in_chs = bw + 3 * inc
        for i in range(2, k_sec[0] + 1):
            blocks['conv2_' + str(i)] = DualPathBlock(in_chs, r, r, bw, inc, groups, 'normal', b)
            in_chs += inc

        # conv3
        bw = 2 * base_width * bw_factor
        inc = inc_sec[1]
        r = (k_r * bw) // (base_width * bw_factor)
        blocks['conv3_1'] = DualPathBlock(in_chs, r, r, bw, inc, groups, 'down', b)
        in_chs = bw + 3 * inc
        for i in range(2, k_sec[1] + 1):
            blocks['conv3_' + str(i)] = DualPathBlock(in_chs, r, r, bw, inc, groups, 'normal', b)
            in_chs += inc

        # conv4
        bw = 4 * base_width * bw_factor
        inc = inc_sec[2]
        r = (k_r * bw) // (base_width * bw_factor)
        blocks['conv4_1'] = DualPathBlock(in_chs, r, r, bw, inc, groups, 'down', b)
        in_chs = bw + 3 * inc
        for i in range(2, k_sec[2] + 1):
            blocks['conv4_' + str(i)] = DualPathBlock(in_chs, r, r, bw, inc, groups, 'normal', b)
            in_chs += inc

        # conv5
        bw = 8 * base_width * bw_factor
        inc = inc_sec[3]
        r = (k_r * bw) // (base_width * bw_factor)
        blocks['conv5_1'] = DualPathBlock(in_chs, r, r, bw, inc, groups, 'down', b)
        in_chs = bw + 3 * inc
        for i in range(2, k_sec[3] + 1):
            blocks['conv5_' + str(i)] = DualPathBlock(in_chs, r, r, bw, inc, groups, 'normal', b)
            in_chs += inc
        blocks['conv5_bn_ac'] = CatBnAct(in_chs, norm_layer=fc_norm_layer)

        self.num_features = in_chs
        self.features = nn.Sequential(blocks)

        # Using 1x1 conv for the FC layer to allow the extra pooling scheme
        self.global_pool = nn.AdaptiveAvgPool2d(1)        # SelectAdaptivePool2d('avg', flatten=False)
        self.classifier = nn.Conv2d(self.num_features, self.num_classes, kernel_size=1, bias=True)
        self.flatten = nn.Flatten(1) if global_pool else nn.Identity()

    def forward_features(self, x):
        return self.features(x)

    def forward_head(self, x, pre_logits: bool = False):
        x = self.global_pool(x)
        if self.drop_rate > 0.:
            x = F.dropout(x, p=self.drop_rate, training=self.training)
        if pre_logits:
            return self.flatten(x)
        x = self.classifier(x)
        return self.flatten(x)

    def forward(self, x):
        x = self.forward_features(x)
        x = self.forward_head(x)
        return x


# ============================================================================= StyleGAN2 ModulatedConv2d (rosinality)

def fused_leaky_relu(input, bias=None, negative_slope=0.2, scale=2 ** 0.5):
    """op/fused_act.py, the CPU path."""
    if input.device.type == "cpu":
        if bias is not None:
            rest_dim = [1] * (input.ndim - bias.ndim - 1)
            return (
                F.leaky_relu(
                    input + bias.view(1, bias.shape[0], *rest_dim), negative_slope=0.2
                )
                * scale
            )

        else:
            return F.leaky_relu(input, negative_slope=0.2) * scale
    raise NotImplementedError("the CUDA FusedLeakyReLUFunction is not part of this test copy")


class FusedLeakyReLU(nn.Module):
    def __init__(self, channel, bias=True, negative_slope=0.2, scale=2 ** 0.5):
        super().__init__()

        if bias:
            self.bias = nn.Parameter(torch.zeros(channel))

        else:
            self.bias = None

        self.negative_slope = negative_slope
        self.scale = scale

    def forward(self, input):
        return fused_leaky_relu(input, self.bias, self.negative_slope, self.scale)


class PixelNorm(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, input):
        return input * torch.rsqrt(torch.mean(input ** 2, dim=1, keepdim=True) + 1e-8)


class EqualConv2d(nn.Module):
    def __init__(self, in_channel, out_channel, kernel_size, stride=1, padding=0, bias=True):
        super().__init__()

        self.weight = nn.Parameter(
            torch.randn(out_channel, in_channel, kernel_size, kernel_size)
        )
        self.scale = 1 / math.sqrt(in_channel * kernel_size ** 2)

        self.stride = stride
        self.padding = padding

        if bias:
            self.bias = nn.Parameter(torch.zeros(out_channel))

        else:
            self.bias = None

    def forward(self, input):
        out = F.conv2d(      # conv2d_gradfix.conv2d: F.conv2d off CUDA
            input,
            self.weight * self.scale,
            bias=self.bias,
            stride=self.stride,
            padding=self.padding,
        )

        return out


class EqualLinear(nn.Module):
    def __init__(self, in_dim, out_dim, bias=True, bias_init=0, lr_mul=1, activation=None):
        super().__init__()

        self.weight = nn.Parameter(torch.randn(out_dim, in_dim).div_(lr_mul))

        if bias:
            self.bias = nn.Parameter(torch.zeros(out_dim).fill_(bias_init))

        else:
            self.bias = None

        self.activation = activation

        self.scale = (1 / math.sqrt(in_dim)) * lr_mul
        self.lr_mul = lr_mul

    def forward(self, input):
        if self.activation:
            out = F.linear(input, self.weight * self.scale)
            out = fused_leaky_relu(out, self.bias * self.lr_mul)

        else:
            out = F.linear(
                input, self.weight * self.scale, bias=self.bias * self.lr_mul
            )

        return out


class ModulatedConv2d(nn.Module):
    """rosinality ModulatedConv2d, the fused path without up / down sampling."""

    def __init__(self, in_channel, out_channel, kernel_size, style_dim, demodulate=True, upsample=False,
                 downsample=False, blur_kernel=(1, 3, 3, 1), fused=True):
        super().__init__()

        self.eps = 1e-8
        self.kernel_size = kernel_size
        self.in_channel = in_channel
        self.out_channel = out_channel
        self.upsample = upsample
        self.downsample = downsample
        assert not upsample and not downsample

        fan_in = in_channel * kernel_size ** 2
        self.scale = 1 / math.sqrt(fan_in)
        self.padding = kernel_size // 2

        self.weight = nn.Parameter(
            torch.randn(1, out_channel, in_channel, kernel_size, kernel_size)
        )

        self.modulation = EqualLinear(style_dim, in_channel, bias_init=1)

        self.demodulate = demodulate
        self.fused = fused

    def forward(self, input, style):
        batch, in_channel, height, width = input.shape

        if not self.fused:
            weight = self.scale * self.weight.squeeze(0)
            style = self.modulation(style)

            if self.demodulate:
                w = weight.unsqueeze(0) * style.view(batch, 1, in_channel, 1, 1)
                dcoefs = (w.square().sum((2, 3, 4)) + 1e-8).rsqrt()

            input = input * style.reshape(batch, in_channel, 1, 1)
            out = F.conv2d(input, weight, padding=self.padding)

            if self.demodulate:
                out = out * dcoefs.view(batch, -1, 1, 1)

            return out

        style = self.modulation(style).view(batch, 1, in_channel, 1, 1)
        weight = self.scale * self.weight * style

        if self.demodulate:
            demod = torch.rsqrt(weight.pow(2).sum([2, 3, 4]) + 1e-8)
            weight = weight * demod.view(batch, self.out_channel, 1, 1, 1)

        weight = weight.view(
            batch * self.out_channel, in_channel, self.kernel_size, self.kernel_size
        )

        input = input.view(1, batch * in_channel, height, width)
        out = F.conv2d(input, weight, padding=self.padding, groups=batch)
        _, _, height, width = out.shape
        out = out.view(batch, self.out_channel, height, width)

        return out


class StyledConv(nn.Module):
    """rosinality StyledConv without its NoiseInjection (run-time random noise)."""

    def __init__(self, in_channel, out_channel, kernel_size, style_dim, upsample=False, blur_kernel=(1, 3, 3, 1),
                 demodulate=True):
        super().__init__()

        self.conv = ModulatedConv2d(
            in_channel,
            out_channel,
            kernel_size,
            style_dim,
            upsample=upsample,
            blur_kernel=blur_kernel,
            demodulate=demodulate,
        )

        self.activate = FusedLeakyReLU(out_channel)

    def forward(self, input, style):
        out = self.conv(input, style)
        out = self.activate(out)

        return out


class StyleModConvNet(nn.Module):
    """One-input wrapper (not in the repo): stem ConvLayer-like EqualConv2d 3x3 + FusedLeakyReLU; latent z =
    EqualLinear(mean of the stem features); style = PixelNorm + 2 EqualLinear fused_lrelu (lr_mul 0.01, the
    Generator's mapping network); two StyledConvs (16 -> 16 -> 32, 3x3, demodulated) on the stem features; global
    mean; EqualLinear classifier. 32x32 input."""

    def __init__(self, num_classes=10, ch=16, style_dim=32, n_mlp=2, lr_mlp=0.01):
        super().__init__()
        self.stem = EqualConv2d(3, ch, 3, padding=1, bias=False)
        self.stem_act = FusedLeakyReLU(ch)
        self.to_latent = EqualLinear(ch, style_dim)
        layers = [PixelNorm()]
        for i in range(n_mlp):
            layers.append(EqualLinear(style_dim, style_dim, lr_mul=lr_mlp, activation="fused_lrelu"))
        self.style = nn.Sequential(*layers)
        self.conv1 = StyledConv(ch, ch, 3, style_dim)
        self.conv2 = StyledConv(ch, 2 * ch, 3, style_dim)
        self.head = EqualLinear(2 * ch, num_classes)

    def forward(self, x):
        feat = self.stem_act(self.stem(x))
        z = self.to_latent(feat.mean((2, 3)))
        style = self.style(z)
        out = self.conv1(feat, style)
        out = self.conv2(out, style)
        return self.head(out.mean((2, 3)))


# ----------------------------------------------------------------------------- registry

def _randomize_extra(module: nn.Module, seed: int = 0) -> nn.Module:
    """The house `randomize` (BatchNorm2d statistics and affine parameters, BatchNormAct2d / InPlaceABN included),
    then, from the same seed, non-trivial LayerNorm affine parameters, layer scales / gammas (LayerScale2d.gamma,
    FocalNet gamma_1 / gamma_2, MetaNeXtBlock.gamma: all init 1e-4 .. 1e-6, which would mute their branches),
    VanillaNet's activation weights (trunc_normal std 0.02) and StyleGAN2's FusedLeakyReLU biases (zeros)."""
    randomize(module, seed)
    g = torch.Generator().manual_seed(seed + 1000003)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm) and m.weight is not None:
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.rand(m.bias.shape, generator=g) * 0.5 - 0.25)
            elif isinstance(m, activation):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * 0.15)
            elif isinstance(m, FusedLeakyReLU) and m.bias is not None:
                m.bias.copy_(torch.rand(m.bias.shape, generator=g) * 0.5 - 0.25)
        for name, p in module.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf in ("gamma", "gamma_1", "gamma_2"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
    return module


FAMILIES = {
    # name: (builder(num_classes), input shape). CoordAttention and Triplet+SimAM take non-square inputs so that
    # h != w wherever their pools / permutes / splits tell the two apart (CoordAtt's split [h, w]: 24x32 ... 3x4;
    # triplet branches on 32x40, 16x20, 8x10)
    "mixnet": (lambda nc: MixNet(nc), (2, 3, 64, 64)),
    "mobilenetv4": (lambda nc: MobileNetV4(nc), (2, 3, 64, 64)),
    "tresnet": (lambda nc: TResNet(num_classes=nc), (2, 3, 64, 64)),
    "coordatt_mbv2": (lambda nc: MBV2_CA(nc), (2, 3, 48, 64)),
    "triplet_simam_resnet": (lambda nc: TripletSimAMResNet(nc), (2, 3, 32, 40)),
    "focalnet": (lambda nc: FocalNet(num_classes=nc), (2, 3, 64, 64)),
    "vanillanet": (lambda nc: _vanillanet(nc), (2, 3, 64, 64)),
    "inceptionnext": (lambda nc: MetaNeXt(num_classes=nc), (2, 3, 64, 64)),
    "dpn": (lambda nc: DPN(num_classes=nc), (2, 3, 64, 64)),
    "stylegan2_modconv": (lambda nc: StyleModConvNet(nc), (2, 3, 32, 32)),
}


def build(name: str, num_classes: int = 10, seed: int = 0, train: bool = False) -> nn.Module:
    """Family `name` with its norms, layer scales and activation weights randomized (seeded), in eval mode.
    train=True: without the random parts a training step draws in PyTorch (DropPath's drop_prob, every dropout's p
    and the functional-dropout drop_rate attributes set to 0), so one step can be compared with a Trainer's."""
    m = _randomize_extra(FAMILIES[name][0](num_classes), seed).eval()
    if train:
        for mod in m.modules():
            if isinstance(mod, DropPath):
                mod.drop_prob = 0.0
            elif isinstance(mod, nn.modules.dropout._DropoutNd):
                mod.p = 0.0
            if isinstance(getattr(mod, "drop_rate", None), float):
                mod.drop_rate = 0.0
    return m
