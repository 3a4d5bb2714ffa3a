"""PyTorch definitions of detection, dense-prediction and video CNN families, written the way their reference code
writes them (tests only; torchvision / timm / ultralytics / detectron2 are not dependencies): reduced widths, depths
and input sizes, the same block structure and forward-pass idioms, each forward returning one tensor.

  YOLOv8       ultralytics nn/modules (conv.py, block.py, head.py), nn/tasks.py, utils/tal.py: Conv (conv-BN-SiLU,
               autopad, the shared class-level `default_act = nn.SiLU()`), Bottleneck, C2f (`y = list(self.cv1(x)
               .chunk(2, 1)); y.extend(m(y[-1]) for m in self.m)`), SPPF (three chained MaxPool2d(5, 1, 2)), the
               yolov8.yaml layer table run by BaseModel._predict_once (`m.f` / `m.i` / save list, nn.Upsample(None, 2,
               "nearest"), Concat), initialize_weights (BN eps 1e-3, in-place activations), Detect set up as
               ultralytics' Exporter(format="onnx", dynamic=True) does (export=True: the decoded tensor only;
               dynamic=True: the anchors rebuilt every call, so the grid is in the traced graph rather than a
               tensor cached on the module by the first, possibly fake-tensor, call) with
               (`x[i] = torch.cat((self.cv2[i](x[i]), self.cv3[i](x[i])), 1)`, x_cat of xi.view(shape[0], self.no,
               -1), x_cat.split((reg_max * 4, nc), 1), DFL: x.view(b, 4, c1, a).transpose(2, 1).softmax(1) through
               a fixed 1x1 conv with arange weights, make_anchors (arange + meshgrid(indexing="ij") + stack(-1)
               .view(-1, 2), torch.full stride tensor, each .transpose(0, 1)), dist2bbox (chunk, cat, xywh),
               `* self.strides`, `torch.cat((dbox, cls.sigmoid()), 1)`); output (N, 4 + nc, 84) at 64x64.
               Detect.bias_init (a training-time prior that makes the class scores ~1e-4) is not applied.
  CenterNet    xingyizhou/CenterNet msra_resnet.py (PoseResNet: 7x7 stem, BasicBlocks, three ConvTranspose2d(4, 2,
               1) deconv-BN-ReLU layers, per-head conv3x3-ReLU-conv1x1 set with __setattr__ / __getattr__, hm bias
               -2.19, returns [ret]) + the detector's post-processing up to the top-k: `hm = output['hm'].sigmoid_()`
               and decode.py `_nms` (`hmax = F.max_pool2d(heat, (3, 3), stride=1, padding=1); keep = (hmax == heat)
               .float(); heat * keep`); thin wrapper output torch.cat([heat, wh, reg], 1), (N, nc + 4, 16, 16)
  FCOS         tianzhi0549/FCOS (maskrcnn_benchmark): ResNet with FrozenBatchNorm2d (weight * running_var.rsqrt(),
               reshape(1, -1, 1, 1), x * scale + bias; no eps), StemWithFixedBatchNorm (F.relu_, F.max_pool2d),
               stride_in_1x1 Bottleneck (`out0 = self.conv3(out)`, `out += identity`, F.relu_), FPN with
               getattr(self, "fpn_inner{}") modules, F.interpolate(scale_factor=2, "nearest"), results.insert(0, ..),
               LastLevelP6P7 on P5; FCOSHead (cls / bbox towers conv-GroupNorm-ReLU (GroupNorm(32) at 256 channels
               -> 8 groups at 32), Scale modules (`input * self.scale`), `torch.exp(self.scales[l](self.bbox_pred(
               box_tower)))`, centerness); compute_locations (arange with step, meshgrid without indexing=,
               reshape(-1), stack + stride // 2); FCOSPostProcessor.forward_for_single_feature_map up to the
               threshold (view / permute(0, 2, 3, 1) / reshape(N, -1, C) .sigmoid(), box_cls * centerness[:, :,
               None]) with the boxes decoded densely (the per-candidate stack of locations -/+ regressions) and
               sqrt(scores); levels concatenated: output (N, 194, 4 + nc) at 96x96 (12, 6, 3, 2, 1 a side)
  SSD-lite     qfgaohao/pytorch-ssd mobilenetv2_ssd_lite.py + ssd.py + box_utils.py: MobileNetV2 features
               (conv_bn / InvertedResidual with ReLU6, `x + self.conv(x)`), GraphPath(s0, 'conv', s1) splitting an
               inverted residual inside its `conv`, extras InvertedResidual(expand_ratio 0.2 / 0.25 / 0.5),
               SeperableConv2d headers (dw conv - BN - ReLU6 - 1x1), compute_header (`confidence.permute(0, 2, 3, 1)
               .contiguous()`, `.view(confidence.size(0), -1, self.num_classes)`), torch.cat over levels, is_test:
               F.softmax(confidences, dim=2), convert_locations_to_boxes (center / size variances, exp) and
               center_form_to_corner_form on generate_ssd_priors priors (itertools.product grid, clamp, a buffer);
               thin wrapper output torch.cat((boxes, confidences), 2), (N, 840, 4 + nc) at 150x150 (maps 10, 5, 3,
               2, 1, 1)
  PSPNet       hszhao/semseg model/pspnet.py + model/resnet.py: deep-base ResNet (three 3x3 stem convs), layer3 /
               layer4 made dilated after construction (`for n, m in self.layer3.named_modules(): if 'conv2' in n:
               m.dilation, m.padding, m.stride = (2, 2), (2, 2), (1, 1)`), PPM (AdaptiveAvgPool2d bins 1, 2, 3, 6
               over a 9x9 map -> conv1x1-BN-ReLU -> F.interpolate(x_size[2:], bilinear, align_corners=True),
               torch.cat), cls (conv3x3-BN-ReLU-Dropout2d-conv1x1), the final F.interpolate to
               ((H - 1) / 8 * zoom_factor + 1); input 65x65, output (N, nc, 65, 65). The aux head (built only for
               training with a target) is left out, so the forward is the same in both modes.
  DANet        junfu1115/DANet encoding/nn/da_att.py + encoding/models/sseg/danet.py: dilated ResNet (output stride
               8), DANetHead (conv5a / conv5c, PAM_Module: query / key / value 1x1 convs, `.view(m_batchsize, -1,
               width*height).permute(0, 2, 1)`, torch.bmm, Softmax(dim=-1), `out = self.gamma*out + x`; CAM_Module:
               `energy_new = torch.max(energy, -1, keepdim=True)[0].expand_as(energy)-energy`; conv51 / conv52,
               `feat_sum = sa_conv+sc_conv`, conv6 / 7 / 8 with Dropout2d), `x = list(x)` and every output upsampled
               (bilinear, align_corners=True); the tuple (sasc, sa, sc) concatenated on channels (a thin wrapper:
               inference reads the first nc channels, training uses all three), (N, 3 * nc, 64, 64)
  OCRNet       HRNet/HRNet-Semantic-Segmentation seg_hrnet_ocr.py: a four-branch HRNet (stem, Bottleneck layer1,
               _make_transition_layer, HighResolutionModule with fuse layers: 1x1 conv + BN then F.interpolate
               (size=[height_output, width_output], bilinear) up, strided 3x3 chains down), the four maps upsampled
               and concatenated, aux_head, conv3x3_ocr, SpatialGather_Module (`probs.view(batch_size, c, -1)`,
               `F.softmax(self.scale * probs, dim=2)`, torch.matmul(probs, feats).permute(0, 2, 1).unsqueeze(3)),
               ObjectAttentionBlock2D (f_pixel / f_object / f_down / f_up, `sim_map = (self.key_channels**-.5) *
               sim_map`, softmax(dim=-1), `context.view(batch_size, self.key_channels, *x.size()[2:])`),
               SpatialOCR_Module (torch.cat([context, feats], 1) -> conv-BN-ReLU-Dropout2d), cls_head; output the
               model's `out` (out_aux feeds the gather, so every parameter is used), (N, nc, 16, 16) at 64x64
  TSM          mit-han-lab/temporal-shift-module ops/temporal_shift.py + ops/models.py + ops/basic_ops.py: a
               torchvision ResNet (Bottleneck) whose blocks' conv1 are wrapped by make_temporal_shift('blockres')
               in TemporalShift (the out-of-place shift: torch.zeros_like and three slice assignments), TSN's
               `input.view((-1, sample_len) + input.size()[-2:])`, fc replaced by Dropout + new_fc, and the avg
               ConsensusModule (`base_out.view((-1, self.num_segments) + base_out.size()[1:])`, mean(dim=1,
               keepdim=True), squeeze(1)); input (2, 4 * 3, 64, 64) = 2 clips of 4 segments, output (2, nc)
  PointRend    facebookresearch/detectron2 projects/PointRend semantic_seg.py + point_features.py + point_head.py:
               a small ResNet + FPN (p2, p3), SemSegFPNHead coarse predictor (GroupNorm scale heads, bilinear
               Upsample), and the inference subdivision: F.interpolate(scale_factor=2, bilinear), calculate_uncertainty
               (torch.topk(k=2)), get_uncertain_point_coords_on_grid (torch.topk indices, `point_indices % W`,
               `point_indices // W` into slice-assigned coords), point_sample (F.grid_sample(2.0 * coords - 1.0)),
               StandardPointHead (Conv1d with the coarse prediction concatenated at each layer) and
               `scatter_(2, point_indices, point_logits)`; output (N, nc, 64, 64). Its training path samples random
               points, so only inference is defined.

FAMILIES maps a name to (builder(num_classes), input shape); `_randomize_extra` gives BatchNorm non-trivial
statistics (the house `randomize`) and, from the same seed, GroupNorm / LayerNorm affine parameters,
FrozenBatchNorm2d buffers, FCOS Scale values and the DANet PAM / CAM gammas (zero at construction, which would make
both attention modules the identity) non-trivial values.
"""
from __future__ import annotations

import collections
import itertools
import math
from collections import namedtuple
from typing import List

import torch
import torch.nn.functional as F
from torch import nn

from modern_models import randomize          # non-trivial BN statistics, the house helper


# ============================================================================= shared: torchvision-style ResNet

def conv3x3(in_planes, out_planes, stride=1, groups=1, dilation=1):
    """3x3 convolution with padding"""
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=dilation, groups=groups,
                     bias=False, dilation=dilation)


def conv1x1(in_planes, out_planes, stride=1):
    """1x1 convolution"""
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None, groups=1, base_width=64, dilation=1,
                 norm_layer=None):
        super().__init__()
        if norm_layer is None:
            norm_layer = nn.BatchNorm2d
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = norm_layer(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes, dilation=dilation)
        self.bn2 = norm_layer(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x

        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)

        out = self.conv2(out)
        out = self.bn2(out)

        if self.downsample is not None:
            identity = self.downsample(x)

        out += identity
        out = self.relu(out)

        return out


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None, groups=1, base_width=64, dilation=1,
                 norm_layer=None):
        super().__init__()
        if norm_layer is None:
            norm_layer = nn.BatchNorm2d
        width = int(planes * (base_width / 64.)) * groups
        self.conv1 = conv1x1(inplanes, width)
        self.bn1 = norm_layer(width)
        self.conv2 = conv3x3(width, width, stride, groups, dilation)
        self.bn2 = norm_layer(width)
        self.conv3 = conv1x1(width, planes * self.expansion)
        self.bn3 = norm_layer(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x

        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)

        out = self.conv2(out)
        out = self.bn2(out)
        out = self.relu(out)

        out = self.conv3(out)
        out = self.bn3(out)

        if self.downsample is not None:
            identity = self.downsample(x)

        out += identity
        out = self.relu(out)

        return out


class ResNet(nn.Module):
    """torchvision's ResNet (replace_stride_with_dilation) at reduced widths, with hszhao/semseg's `deep_base` stem
    (conv1 3x3 s2 -> conv2 -> conv3, each BN-ReLU) as an option."""

    def __init__(self, block, layers, num_classes=1000, widths=(64, 128, 256, 512), stem_width=64,
                 deep_base=False, replace_stride_with_dilation=None, norm_layer=None):
        super().__init__()
        if norm_layer is None:
            norm_layer = nn.BatchNorm2d
        self._norm_layer = norm_layer
        self.deep_base = deep_base
        self.dilation = 1
        if replace_stride_with_dilation is None:
            replace_stride_with_dilation = [False, False, False]
        self.groups = 1
        self.base_width = 64
        if not deep_base:
            self.inplanes = stem_width
            self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
            self.bn1 = norm_layer(self.inplanes)
        else:
            self.inplanes = stem_width * 2
            self.conv1 = conv3x3(3, stem_width, stride=2)
            self.bn1 = norm_layer(stem_width)
            self.conv2 = conv3x3(stem_width, stem_width)
            self.bn2 = norm_layer(stem_width)
            self.conv3 = conv3x3(stem_width, stem_width * 2)
            self.bn3 = norm_layer(stem_width * 2)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, widths[0], layers[0])
        self.layer2 = self._make_layer(block, widths[1], layers[1], stride=2,
                                       dilate=replace_stride_with_dilation[0])
        self.layer3 = self._make_layer(block, widths[2], layers[2], stride=2,
                                       dilate=replace_stride_with_dilation[1])
        self.layer4 = self._make_layer(block, widths[3], layers[3], stride=2,
                                       dilate=replace_stride_with_dilation[2])
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[3] * block.expansion, num_classes)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _make_layer(self, block, planes, blocks, stride=1, dilate=False):
        norm_layer = self._norm_layer
        downsample = None
        previous_dilation = self.dilation
        if dilate:
            self.dilation *= stride
            stride = 1
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                conv1x1(self.inplanes, planes * block.expansion, stride),
                norm_layer(planes * block.expansion),
            )

        layers = []
        layers.append(block(self.inplanes, planes, stride, downsample, self.groups, self.base_width,
                            previous_dilation, norm_layer))
        self.inplanes = planes * block.expansion
        for _ in range(1, blocks):
            layers.append(block(self.inplanes, planes, groups=self.groups, base_width=self.base_width,
                                dilation=self.dilation, norm_layer=norm_layer))

        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        if self.deep_base:
            x = self.relu(self.bn2(self.conv2(x)))
            x = self.relu(self.bn3(self.conv3(x)))
        x = self.maxpool(x)

        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)

        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        x = self.fc(x)

        return x


# ============================================================================= YOLOv8 (ultralytics)

def autopad(k, p=None, d=1):  # kernel, padding, dilation
    """Pad to 'same' shape outputs."""
    if d > 1:
        k = d * (k - 1) + 1 if isinstance(k, int) else [d * (x - 1) + 1 for x in k]  # actual kernel-size
    if p is None:
        p = k // 2 if isinstance(k, int) else [x // 2 for x in k]  # auto-pad
    return p


class Conv(nn.Module):
    """Standard convolution with args(ch_in, ch_out, kernel, stride, padding, groups, dilation, activation)."""

    default_act = nn.SiLU()  # default activation

    def __init__(self, c1, c2, k=1, s=1, p=None, g=1, d=1, act=True):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, autopad(k, p, d), groups=g, dilation=d, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = self.default_act if act is True else act if isinstance(act, nn.Module) else nn.Identity()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class YoloBottleneck(nn.Module):
    """Standard bottleneck (ultralytics Bottleneck)."""

    def __init__(self, c1, c2, shortcut=True, g=1, k=(3, 3), e=0.5):
        super().__init__()
        c_ = int(c2 * e)  # hidden channels
        self.cv1 = Conv(c1, c_, k[0], 1)
        self.cv2 = Conv(c_, c2, k[1], 1, g=g)
        self.add = shortcut and c1 == c2

    def forward(self, x):
        return x + self.cv2(self.cv1(x)) if self.add else self.cv2(self.cv1(x))


class C2f(nn.Module):
    """Faster Implementation of CSP Bottleneck with 2 convolutions."""

    def __init__(self, c1, c2, n=1, shortcut=False, g=1, e=0.5):
        super().__init__()
        self.c = int(c2 * e)  # hidden channels
        self.cv1 = Conv(c1, 2 * self.c, 1, 1)
        self.cv2 = Conv((2 + n) * self.c, c2, 1)  # optional act=FReLU(c2)
        self.m = nn.ModuleList(YoloBottleneck(self.c, self.c, shortcut, g, k=((3, 3), (3, 3)), e=1.0)
                               for _ in range(n))

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    """Spatial Pyramid Pooling - Fast (SPPF) layer for YOLOv5 by Glenn Jocher."""

    def __init__(self, c1, c2, k=5):
        super().__init__()
        c_ = c1 // 2  # hidden channels
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c_ * 4, c2, 1, 1)
        self.m = nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2)

    def forward(self, x):
        y = [self.cv1(x)]
        y.extend(self.m(y[-1]) for _ in range(3))
        return self.cv2(torch.cat(y, 1))


class Concat(nn.Module):
    """Concatenate a list of tensors along dimension."""

    def __init__(self, dimension=1):
        super().__init__()
        self.d = dimension

    def forward(self, x):
        return torch.cat(x, self.d)


class DFL(nn.Module):
    """Integral module of Distribution Focal Loss (DFL)."""

    def __init__(self, c1=16):
        super().__init__()
        self.conv = nn.Conv2d(c1, 1, 1, bias=False).requires_grad_(False)
        x = torch.arange(c1, dtype=torch.float)
        self.conv.weight.data[:] = nn.Parameter(x.view(1, c1, 1, 1))
        self.c1 = c1

    def forward(self, x):
        b, _, a = x.shape  # batch, channels, anchors
        return self.conv(x.view(b, 4, self.c1, a).transpose(2, 1).softmax(1)).view(b, 4, a)


def make_anchors(feats, strides, grid_cell_offset=0.5):
    """Generate anchors from features."""
    anchor_points, stride_tensor = [], []
    assert feats is not None
    dtype, device = feats[0].dtype, feats[0].device
    for i, stride in enumerate(strides):
        _, _, h, w = feats[i].shape
        sx = torch.arange(end=w, device=device, dtype=dtype) + grid_cell_offset  # shift x
        sy = torch.arange(end=h, device=device, dtype=dtype) + grid_cell_offset  # shift y
        sy, sx = torch.meshgrid(sy, sx, indexing="ij")
        anchor_points.append(torch.stack((sx, sy), -1).view(-1, 2))
        stride_tensor.append(torch.full((h * w, 1), stride, dtype=dtype, device=device))
    return torch.cat(anchor_points), torch.cat(stride_tensor)


def dist2bbox(distance, anchor_points, xywh=True, dim=-1):
    """Transform distance(ltrb) to box(xywh or xyxy)."""
    lt, rb = distance.chunk(2, dim)
    x1y1 = anchor_points - lt
    x2y2 = anchor_points + rb
    if xywh:
        c_xy = (x1y1 + x2y2) / 2
        wh = x2y2 - x1y1
        return torch.cat((c_xy, wh), dim)  # xywh bbox
    return torch.cat((x1y1, x2y2), dim)  # xyxy bbox


class Detect(nn.Module):
    """YOLOv8 Detect head for detection models."""

    dynamic = False  # force grid reconstruction
    export = False  # export mode
    shape = None
    anchors = torch.empty(0)  # init
    strides = torch.empty(0)  # init

    def __init__(self, nc=80, ch=()):
        super().__init__()
        self.nc = nc  # number of classes
        self.nl = len(ch)  # number of detection layers
        self.reg_max = 16  # DFL channels (ch[0] // 16 to scale 4/8/12/16/20 for n/s/m/l/x)
        self.no = nc + self.reg_max * 4  # number of outputs per anchor
        self.stride = torch.zeros(self.nl)  # strides computed during build
        c2, c3 = max((16, ch[0] // 4, self.reg_max * 4)), max(ch[0], min(self.nc, 100))  # channels
        self.cv2 = nn.ModuleList(
            nn.Sequential(Conv(x, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 4 * self.reg_max, 1)) for x in ch
        )
        self.cv3 = nn.ModuleList(nn.Sequential(Conv(x, c3, 3), Conv(c3, c3, 3), nn.Conv2d(c3, self.nc, 1)) for x in ch)
        self.dfl = DFL(self.reg_max) if self.reg_max > 1 else nn.Identity()

    def forward(self, x):
        """Concatenates and returns predicted bounding boxes and class probabilities."""
        for i in range(self.nl):
            x[i] = torch.cat((self.cv2[i](x[i]), self.cv3[i](x[i])), 1)
        if self.training:  # Training path
            return x

        # Inference path
        shape = x[0].shape  # BCHW
        x_cat = torch.cat([xi.view(shape[0], self.no, -1) for xi in x], 2)
        if self.dynamic or self.shape != shape:
            self.anchors, self.strides = (x.transpose(0, 1) for x in make_anchors(x, self.stride, 0.5))
            self.shape = shape

        if self.export and self.format in ("saved_model", "pb", "tflite", "edgetpu", "tfjs"):  # avoid TF FlexSplitV ops
            box = x_cat[:, : self.reg_max * 4]
            cls = x_cat[:, self.reg_max * 4:]
        else:
            box, cls = x_cat.split((self.reg_max * 4, self.nc), 1)
        dbox = self.decode_bboxes(self.dfl(box), self.anchors.unsqueeze(0)) * self.strides

        y = torch.cat((dbox, cls.sigmoid()), 1)
        return y if self.export else (y, x)

    def decode_bboxes(self, bboxes, anchors):
        """Decode bounding boxes."""
        return dist2bbox(bboxes, anchors, xywh=True, dim=1)


def initialize_weights(model):
    """Initialize model weights to random values (ultralytics torch_utils)."""
    for m in model.modules():
        t = type(m)
        if t is nn.Conv2d:
            pass  # nn.init.kaiming_normal_(m.weight, mode='fan_out', nonlinearity='relu')
        elif t is nn.BatchNorm2d:
            m.eps = 1e-3
            m.momentum = 0.03
        elif t in {nn.Hardswish, nn.LeakyReLU, nn.ReLU, nn.ReLU6, nn.SiLU}:
            m.inplace = True


class DetectionModel(nn.Module):
    """ultralytics DetectionModel: the yolov8.yaml table parsed into an nn.Sequential whose layers carry `f` (from),
    `i` (index) and `type`, run by BaseModel._predict_once. Widths (8, 16, 24, 32, 48), every repeat 1."""

    def __init__(self, nc=80, widths=(8, 16, 24, 32, 48), imgsz=64):
        super().__init__()
        c1, c2, c3, c4, c5 = widths
        # [from, module, args] -- yolov8.yaml backbone + head at one repeat per C2f
        table = [
            [-1, Conv, [3, c1, 3, 2]],  # 0-P1/2
            [-1, Conv, [c1, c2, 3, 2]],  # 1-P2/4
            [-1, C2f, [c2, c2, 1, True]],
            [-1, Conv, [c2, c3, 3, 2]],  # 3-P3/8
            [-1, C2f, [c3, c3, 1, True]],
            [-1, Conv, [c3, c4, 3, 2]],  # 5-P4/16
            [-1, C2f, [c4, c4, 1, True]],
            [-1, Conv, [c4, c5, 3, 2]],  # 7-P5/32
            [-1, C2f, [c5, c5, 1, True]],
            [-1, SPPF, [c5, c5, 5]],  # 9
            [-1, nn.Upsample, [None, 2, "nearest"]],
            [[-1, 6], Concat, [1]],  # cat backbone P4
            [-1, C2f, [c5 + c4, c4, 1]],  # 12
            [-1, nn.Upsample, [None, 2, "nearest"]],
            [[-1, 4], Concat, [1]],  # cat backbone P3
            [-1, C2f, [c4 + c3, c3, 1]],  # 15 (P3/8-small)
            [-1, Conv, [c3, c3, 3, 2]],
            [[-1, 12], Concat, [1]],  # cat head P4
            [-1, C2f, [c3 + c4, c4, 1]],  # 18 (P4/16-medium)
            [-1, Conv, [c4, c4, 3, 2]],
            [[-1, 9], Concat, [1]],  # cat head P5
            [-1, C2f, [c4 + c5, c5, 1]],  # 21 (P5/32-large)
            [[15, 18, 21], Detect, [nc, (c3, c4, c5)]],  # Detect(P3, P4, P5)
        ]
        layers, save = [], []
        for i, (f, m, args) in enumerate(table):
            m_ = m(*args)
            t = str(m)[8:-2].replace("__main__.", "")  # module type
            m_.i, m_.f, m_.type = i, f, t  # attach index, 'from' index, type
            save.extend(x % i for x in ([f] if isinstance(f, int) else f) if x != -1)  # append to savelist
            layers.append(m_)
        self.model = nn.Sequential(*layers)
        self.save = sorted(save)
        m = self.model[-1]  # Detect()
        s = imgsz  # 2x min stride
        m.inplace = True
        self.train()  # (fresh modules: Detect returns the per-level maps)
        m.stride = torch.tensor([s / x.shape[-2] for x in self.forward(torch.zeros(1, 3, s, s))])  # forward
        self.stride = m.stride
        initialize_weights(self)
        for m in self.modules():  # as ultralytics' Exporter(format="onnx", dynamic=True) sets the head up
            if isinstance(m, Detect):
                m.dynamic = True
                m.export = True
                m.format = "onnx"

    def _predict_once(self, x):
        y = []  # outputs
        for m in self.model:
            if m.f != -1:  # if not from previous layer
                x = y[m.f] if isinstance(m.f, int) else [x if j == -1 else y[j] for j in m.f]  # from earlier layers
            x = m(x)  # run
            y.append(x if m.i in self.save else None)  # save output
        return x

    def forward(self, x):
        return self._predict_once(x)


# ============================================================================= CenterNet (xingyizhou, msra_resnet)

BN_MOMENTUM = 0.1


class PoseResNet(nn.Module):

    def __init__(self, block, layers, heads, head_conv, widths=(16, 32, 48, 64), deconv_width=32):
        self.inplanes = widths[0]
        self.deconv_with_bias = False
        self.heads = heads

        super(PoseResNet, self).__init__()
        self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes, momentum=BN_MOMENTUM)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, widths[0], layers[0])
        self.layer2 = self._make_layer(block, widths[1], layers[1], stride=2)
        self.layer3 = self._make_layer(block, widths[2], layers[2], stride=2)
        self.layer4 = self._make_layer(block, widths[3], layers[3], stride=2)

        # used for deconv layers
        self.deconv_layers = self._make_deconv_layer(3, [deconv_width] * 3, [4, 4, 4])

        for head in sorted(self.heads):
            num_output = self.heads[head]
            if head_conv > 0:
                fc = nn.Sequential(
                    nn.Conv2d(deconv_width, head_conv, kernel_size=3, padding=1, bias=True),
                    nn.ReLU(inplace=True),
                    nn.Conv2d(head_conv, num_output, kernel_size=1, stride=1, padding=0))
            else:
                fc = nn.Conv2d(in_channels=deconv_width, out_channels=num_output, kernel_size=1, stride=1,
                               padding=0)
            self.__setattr__(head, fc)
        # init_weights: 'hm' final bias -2.19 (focal-loss prior)
        self.__getattr__('hm')[-1].bias.data.fill_(-2.19)

    def _make_layer(self, block, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * block.expansion, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(planes * block.expansion, momentum=BN_MOMENTUM),
            )

        layers = []
        layers.append(block(self.inplanes, planes, stride, downsample))
        self.inplanes = planes * block.expansion
        for i in range(1, blocks):
            layers.append(block(self.inplanes, planes))

        return nn.Sequential(*layers)

    def _get_deconv_cfg(self, deconv_kernel, index):
        if deconv_kernel == 4:
            padding = 1
            output_padding = 0
        elif deconv_kernel == 3:
            padding = 1
            output_padding = 1
        elif deconv_kernel == 2:
            padding = 0
            output_padding = 0

        return deconv_kernel, padding, output_padding

    def _make_deconv_layer(self, num_layers, num_filters, num_kernels):
        assert num_layers == len(num_filters), \
            'ERROR: num_deconv_layers is different len(num_deconv_filters)'
        assert num_layers == len(num_kernels), \
            'ERROR: num_deconv_layers is different len(num_deconv_filters)'

        layers = []
        for i in range(num_layers):
            kernel, padding, output_padding = \
                self._get_deconv_cfg(num_kernels[i], i)

            planes = num_filters[i]
            layers.append(
                nn.ConvTranspose2d(
                    in_channels=self.inplanes,
                    out_channels=planes,
                    kernel_size=kernel,
                    stride=2,
                    padding=padding,
                    output_padding=output_padding,
                    bias=self.deconv_with_bias))
            layers.append(nn.BatchNorm2d(planes, momentum=BN_MOMENTUM))
            layers.append(nn.ReLU(inplace=True))
            self.inplanes = planes

        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.maxpool(x)

        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)

        x = self.deconv_layers(x)
        ret = {}
        for head in self.heads:
            ret[head] = self.__getattr__(head)(x)
        return [ret]


def _nms(heat, kernel=3):
    pad = (kernel - 1) // 2

    hmax = nn.functional.max_pool2d(
        heat, (kernel, kernel), stride=1, padding=pad)
    keep = (hmax == heat).float()
    return heat * keep


class CtdetInference(nn.Module):
    """CtdetDetector.process up to ctdet_decode's top-k (a thin wrapper): sigmoid_ on the heatmap, the 3x3 max-pool
    NMS, and the maps concatenated on channels."""

    def __init__(self, num_classes):
        super().__init__()
        self.model = PoseResNet(BasicBlock, [1, 1, 1, 1], {'hm': num_classes, 'wh': 2, 'reg': 2}, head_conv=16)

    def forward(self, images):
        output = self.model(images)[-1]
        hm = output['hm'].sigmoid_()
        wh = output['wh']
        reg = output['reg']
        heat = _nms(hm)
        return torch.cat([heat, wh, reg], 1)


# ============================================================================= FCOS (tianzhi0549, maskrcnn_benchmark)

class FrozenBatchNorm2d(nn.Module):
    """
    BatchNorm2d where the batch statistics and the affine parameters
    are fixed
    """

    def __init__(self, n):
        super(FrozenBatchNorm2d, self).__init__()
        self.register_buffer("weight", torch.ones(n))
        self.register_buffer("bias", torch.zeros(n))
        self.register_buffer("running_mean", torch.zeros(n))
        self.register_buffer("running_var", torch.ones(n))

    def forward(self, x):
        scale = self.weight * self.running_var.rsqrt()
        bias = self.bias - self.running_mean * scale
        scale = scale.reshape(1, -1, 1, 1)
        bias = bias.reshape(1, -1, 1, 1)
        return x * scale + bias


class FCOSBottleneck(nn.Module):
    """maskrcnn_benchmark resnet.Bottleneck (stride_in_1x1, FrozenBatchNorm2d)."""

    def __init__(self, in_channels, bottleneck_channels, out_channels, num_groups, stride_in_1x1, stride,
                 dilation, norm_func):
        super(FCOSBottleneck, self).__init__()

        self.downsample = None
        if in_channels != out_channels:
            down_stride = stride if dilation == 1 else 1
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=down_stride, bias=False),
                norm_func(out_channels),
            )
            for modules in [self.downsample, ]:
                for l in modules.modules():
                    if isinstance(l, nn.Conv2d):
                        nn.init.kaiming_uniform_(l.weight, a=1)

        if dilation > 1:
            stride = 1  # reset to be 1

        # The original MSRA ResNet models have stride in the first 1x1 conv
        # The subsequent fb.torch.resnet and Caffe2 ResNe[X]t implementations have
        # stride in the 3x3 conv
        stride_1x1, stride_3x3 = (stride, 1) if stride_in_1x1 else (1, stride)

        self.conv1 = nn.Conv2d(in_channels, bottleneck_channels, kernel_size=1, stride=stride_1x1, bias=False)
        self.bn1 = norm_func(bottleneck_channels)
        self.conv2 = nn.Conv2d(bottleneck_channels, bottleneck_channels, kernel_size=3, stride=stride_3x3,
                               padding=dilation, bias=False, groups=num_groups, dilation=dilation)
        self.bn2 = norm_func(bottleneck_channels)
        self.conv3 = nn.Conv2d(bottleneck_channels, out_channels, kernel_size=1, bias=False)
        self.bn3 = norm_func(out_channels)

        for l in [self.conv1, self.conv2, self.conv3, ]:
            nn.init.kaiming_uniform_(l.weight, a=1)

    def forward(self, x):
        identity = x

        out = self.conv1(x)
        out = self.bn1(out)
        out = F.relu_(out)

        out = self.conv2(out)
        out = self.bn2(out)
        out = F.relu_(out)

        out0 = self.conv3(out)
        out = self.bn3(out0)

        if self.downsample is not None:
            identity = self.downsample(x)

        out += identity
        out = F.relu_(out)

        return out


class StemWithFixedBatchNorm(nn.Module):
    def __init__(self, out_channels, norm_func=FrozenBatchNorm2d):
        super(StemWithFixedBatchNorm, self).__init__()
        self.conv1 = nn.Conv2d(3, out_channels, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = norm_func(out_channels)
        for l in [self.conv1, ]:
            nn.init.kaiming_uniform_(l.weight, a=1)

    def forward(self, x):
        x = self.conv1(x)
        x = self.bn1(x)
        x = F.relu_(x)
        x = F.max_pool2d(x, kernel_size=3, stride=2, padding=1)
        return x


def _make_stage(transformation_module, in_channels, bottleneck_channels, out_channels, block_count, num_groups,
                stride_in_1x1, first_stride, dilation=1):
    blocks = []
    stride = first_stride
    for _ in range(block_count):
        blocks.append(transformation_module(in_channels, bottleneck_channels, out_channels, num_groups,
                                            stride_in_1x1, stride, dilation=dilation,
                                            norm_func=FrozenBatchNorm2d))
        stride = 1
        in_channels = out_channels
    return nn.Sequential(*blocks)


class MaskrcnnResNet(nn.Module):
    """maskrcnn_benchmark ResNet body (R-50-FPN-RETINANET stage specs at one block a stage), returning C3..C5."""

    def __init__(self, stem_out=16, res2_out=16, block_counts=(1, 1, 1, 1), return_features=(False, True, True, True)):
        super(MaskrcnnResNet, self).__init__()
        self.stem = StemWithFixedBatchNorm(stem_out)
        num_groups, width_per_group = 1, 4
        in_channels = stem_out
        stage2_bottleneck_channels = num_groups * width_per_group
        out_channels = res2_out
        self.stages = []
        self.return_features = {}
        for index, count in enumerate(block_counts, 1):
            name = "layer" + str(index)
            stage2_relative_factor = 2 ** (index - 1)
            bottleneck_channels = stage2_bottleneck_channels * stage2_relative_factor
            out_channels = res2_out * stage2_relative_factor
            module = _make_stage(FCOSBottleneck, in_channels, bottleneck_channels, out_channels, count, num_groups,
                                 True, first_stride=int(index > 1) + 1)
            in_channels = out_channels
            self.add_module(name, module)
            self.stages.append(name)
            self.return_features[name] = return_features[index - 1]

    def forward(self, x):
        outputs = []
        x = self.stem(x)
        for stage_name in self.stages:
            x = getattr(self, stage_name)(x)
            if self.return_features[stage_name]:
                outputs.append(x)
        return outputs


def conv_with_kaiming_uniform(use_gn=False, use_relu=False):
    def make_conv(in_channels, out_channels, kernel_size, stride=1, dilation=1):
        conv = nn.Conv2d(in_channels, out_channels, kernel_size=kernel_size, stride=stride,
                         padding=dilation * (kernel_size - 1) // 2, dilation=dilation, bias=False if use_gn else True)
        # Caffe2 implementation uses XavierFill, which in fact
        # corresponds to kaiming_uniform_ in PyTorch
        nn.init.kaiming_uniform_(conv.weight, a=1)
        if not use_gn:
            nn.init.constant_(conv.bias, 0)
        module = [conv, ]
        if use_relu:
            module.append(nn.ReLU(inplace=True))
        if len(module) > 1:
            return nn.Sequential(*module)
        return conv

    return make_conv


class FPN(nn.Module):
    """
    Module that adds FPN on top of a list of feature maps.
    The feature maps are currently supposed to be in increasing depth
    order, and must be consecutive
    """

    def __init__(self, in_channels_list, out_channels, conv_block, top_blocks=None):
        super(FPN, self).__init__()
        self.inner_blocks = []
        self.layer_blocks = []
        for idx, in_channels in enumerate(in_channels_list, 1):
            inner_block = "fpn_inner{}".format(idx)
            layer_block = "fpn_layer{}".format(idx)

            if in_channels == 0:
                continue
            inner_block_module = conv_block(in_channels, out_channels, 1)
            layer_block_module = conv_block(out_channels, out_channels, 3, 1)
            self.add_module(inner_block, inner_block_module)
            self.add_module(layer_block, layer_block_module)
            self.inner_blocks.append(inner_block)
            self.layer_blocks.append(layer_block)
        self.top_blocks = top_blocks

    def forward(self, x):
        last_inner = getattr(self, self.inner_blocks[-1])(x[-1])
        results = []
        results.append(getattr(self, self.layer_blocks[-1])(last_inner))
        for feature, inner_block, layer_block in zip(
                x[:-1][::-1], self.inner_blocks[:-1][::-1], self.layer_blocks[:-1][::-1]
        ):
            if not inner_block:
                continue
            inner_top_down = F.interpolate(last_inner, scale_factor=2, mode="nearest")
            inner_lateral = getattr(self, inner_block)(feature)
            # TODO use size instead of scale to make it robust to different sizes
            # inner_top_down = F.upsample(last_inner, size=inner_lateral.shape[-2:],
            # mode='bilinear', align_corners=False)
            last_inner = inner_lateral + inner_top_down
            results.insert(0, getattr(self, layer_block)(last_inner))

        if isinstance(self.top_blocks, LastLevelP6P7):
            last_results = self.top_blocks(x[-1], results[-1])
            results.extend(last_results)

        return tuple(results)


class LastLevelP6P7(nn.Module):
    """
    This module is used in RetinaNet to generate extra layers, P6 and P7.
    """

    def __init__(self, in_channels, out_channels):
        super(LastLevelP6P7, self).__init__()
        self.p6 = nn.Conv2d(in_channels, out_channels, 3, 2, 1)
        self.p7 = nn.Conv2d(out_channels, out_channels, 3, 2, 1)
        for module in [self.p6, self.p7]:
            nn.init.kaiming_uniform_(module.weight, a=1)
            nn.init.constant_(module.bias, 0)
        self.use_P5 = in_channels == out_channels

    def forward(self, c5, p5):
        x = p5 if self.use_P5 else c5
        p6 = self.p6(x)
        p7 = self.p7(F.relu(p6))
        return [p6, p7]


class Scale(nn.Module):
    def __init__(self, init_value=1.0):
        super(Scale, self).__init__()
        self.scale = nn.Parameter(torch.FloatTensor([init_value]))

    def forward(self, input):
        return input * self.scale


class FCOSHead(torch.nn.Module):
    def __init__(self, in_channels, num_classes, num_convs=2, gn_groups=8, prior_prob=0.01,
                 fpn_strides=(8, 16, 32, 64, 128), norm_reg_targets=False, centerness_on_reg=False):
        """
        Arguments:
            in_channels (int): number of channels of the input feature
        """
        super(FCOSHead, self).__init__()
        self.fpn_strides = fpn_strides
        self.norm_reg_targets = norm_reg_targets
        self.centerness_on_reg = centerness_on_reg

        cls_tower = []
        bbox_tower = []
        for i in range(num_convs):
            conv_func = nn.Conv2d
            cls_tower.append(conv_func(in_channels, in_channels, kernel_size=3, stride=1, padding=1, bias=True))
            cls_tower.append(nn.GroupNorm(gn_groups, in_channels))
            cls_tower.append(nn.ReLU())
            bbox_tower.append(conv_func(in_channels, in_channels, kernel_size=3, stride=1, padding=1, bias=True))
            bbox_tower.append(nn.GroupNorm(gn_groups, in_channels))
            bbox_tower.append(nn.ReLU())

        self.add_module('cls_tower', nn.Sequential(*cls_tower))
        self.add_module('bbox_tower', nn.Sequential(*bbox_tower))
        self.cls_logits = nn.Conv2d(in_channels, num_classes, kernel_size=3, stride=1, padding=1)
        self.bbox_pred = nn.Conv2d(in_channels, 4, kernel_size=3, stride=1, padding=1)
        self.centerness = nn.Conv2d(in_channels, 1, kernel_size=3, stride=1, padding=1)

        # initialization
        for modules in [self.cls_tower, self.bbox_tower, self.cls_logits, self.bbox_pred, self.centerness]:
            for l in modules.modules():
                if isinstance(l, nn.Conv2d):
                    torch.nn.init.normal_(l.weight, std=0.01)
                    torch.nn.init.constant_(l.bias, 0)

        # initialize the bias for focal loss
        bias_value = -math.log((1 - prior_prob) / prior_prob)
        torch.nn.init.constant_(self.cls_logits.bias, bias_value)

        self.scales = nn.ModuleList([Scale(init_value=1.0) for _ in range(5)])

    def forward(self, x):
        logits = []
        bbox_reg = []
        centerness = []
        for l, feature in enumerate(x):
            cls_tower = self.cls_tower(feature)
            box_tower = self.bbox_tower(feature)

            logits.append(self.cls_logits(cls_tower))
            if self.centerness_on_reg:
                centerness.append(self.centerness(box_tower))
            else:
                centerness.append(self.centerness(cls_tower))

            bbox_pred = self.scales[l](self.bbox_pred(box_tower))
            if self.norm_reg_targets:
                bbox_pred = F.relu(bbox_pred)
                if self.training:
                    bbox_reg.append(bbox_pred)
                else:
                    bbox_reg.append(bbox_pred * self.fpn_strides[l])
            else:
                bbox_reg.append(torch.exp(bbox_pred))
        return logits, bbox_reg, centerness


class FCOSPostProcessor(nn.Module):
    """FCOS inference.py FCOSPostProcessor up to the pre-NMS threshold: every location's decoded box and score."""

    def forward_for_single_feature_map(self, locations, box_cls, box_regression, centerness):
        N, C, H, W = box_cls.shape

        # put in the same format as locations
        box_cls = box_cls.view(N, C, H, W).permute(0, 2, 3, 1)
        box_cls = box_cls.reshape(N, -1, C).sigmoid()
        box_regression = box_regression.view(N, 4, H, W).permute(0, 2, 3, 1)
        box_regression = box_regression.reshape(N, -1, 4)
        centerness = centerness.view(N, 1, H, W).permute(0, 2, 3, 1)
        centerness = centerness.reshape(N, -1).sigmoid()

        # multiply the classification scores with centerness scores
        box_cls = box_cls * centerness[:, :, None]

        # (the per-image candidate selection, dense: every location a candidate)
        detections = torch.stack([
            locations[None, :, 0] - box_regression[:, :, 0],
            locations[None, :, 1] - box_regression[:, :, 1],
            locations[None, :, 0] + box_regression[:, :, 2],
            locations[None, :, 1] + box_regression[:, :, 3],
        ], dim=2)
        return torch.cat([detections, torch.sqrt(box_cls)], dim=2)

    def forward(self, locations, box_cls, box_regression, centerness):
        sampled_boxes = []
        for _, (l, o, b, c) in enumerate(zip(locations, box_cls, box_regression, centerness)):
            sampled_boxes.append(self.forward_for_single_feature_map(l, o, b, c))
        return torch.cat(sampled_boxes, dim=1)


class FCOS(nn.Module):
    """GeneralizedRCNN(backbone = Sequential(body, fpn), rpn = FCOSModule) in test mode, up to the box selector's
    threshold / NMS; output (N, sum of H * W over the five levels, 4 + num_classes)."""

    def __init__(self, num_classes, fpn_channels=32):
        super().__init__()
        body = MaskrcnnResNet()
        in_channels_stage2 = 16
        fpn = FPN(
            in_channels_list=[0, in_channels_stage2 * 2, in_channels_stage2 * 4, in_channels_stage2 * 8],
            out_channels=fpn_channels,
            conv_block=conv_with_kaiming_uniform(),
            top_blocks=LastLevelP6P7(fpn_channels, fpn_channels),
        )
        self.backbone = nn.Sequential(collections.OrderedDict([("body", body), ("fpn", fpn)]))
        self.head = FCOSHead(fpn_channels, num_classes)
        self.box_selector_test = FCOSPostProcessor()
        self.fpn_strides = [8, 16, 32, 64, 128]

    def compute_locations(self, features):
        locations = []
        for level, feature in enumerate(features):
            h, w = feature.size()[-2:]
            locations_per_level = self.compute_locations_per_level(h, w, self.fpn_strides[level], feature.device)
            locations.append(locations_per_level)
        return locations

    def compute_locations_per_level(self, h, w, stride, device):
        shifts_x = torch.arange(0, w * stride, step=stride, dtype=torch.float32, device=device)
        shifts_y = torch.arange(0, h * stride, step=stride, dtype=torch.float32, device=device)
        shift_y, shift_x = torch.meshgrid(shifts_y, shifts_x)
        shift_x = shift_x.reshape(-1)
        shift_y = shift_y.reshape(-1)
        locations = torch.stack((shift_x, shift_y), dim=1) + stride // 2
        return locations

    def forward(self, images):
        features = self.backbone(images)
        box_cls, box_regression, centerness = self.head(features)
        locations = self.compute_locations(features)
        return self.box_selector_test(locations, box_cls, box_regression, centerness)


# ============================================================================= SSD-lite (qfgaohao/pytorch-ssd)

GraphPath = namedtuple("GraphPath", ['s0', 'name', 's1'])
SSDBoxSizes = collections.namedtuple('SSDBoxSizes', ['min', 'max'])
SSDSpec = collections.namedtuple('SSDSpec', ['feature_map_size', 'shrinkage', 'box_sizes', 'aspect_ratios'])


def generate_ssd_priors(specs: List[SSDSpec], image_size, clamp=True) -> torch.Tensor:
    """Generate SSD Prior Boxes (center form: center_x, center_y, w, h, relative to the image size)."""
    priors = []
    for spec in specs:
        scale = image_size / spec.shrinkage
        for j, i in itertools.product(range(spec.feature_map_size), repeat=2):
            x_center = (i + 0.5) / scale
            y_center = (j + 0.5) / scale

            # small sized square box
            size = spec.box_sizes.min
            h = w = size / image_size
            priors.append([x_center, y_center, w, h])

            # big sized square box
            size = math.sqrt(spec.box_sizes.max * spec.box_sizes.min)
            h = w = size / image_size
            priors.append([x_center, y_center, w, h])

            # change h/w ratio of the small sized box
            size = spec.box_sizes.min
            h = w = size / image_size
            for ratio in spec.aspect_ratios:
                ratio = math.sqrt(ratio)
                priors.append([x_center, y_center, w * ratio, h / ratio])
                priors.append([x_center, y_center, w / ratio, h * ratio])

    priors = torch.tensor(priors)
    if clamp:
        torch.clamp(priors, 0.0, 1.0, out=priors)
    return priors


def convert_locations_to_boxes(locations, priors, center_variance, size_variance):
    # priors can have one dimension less.
    if priors.dim() + 1 == locations.dim():
        priors = priors.unsqueeze(0)
    return torch.cat([
        locations[..., :2] * center_variance * priors[..., 2:] + priors[..., :2],
        torch.exp(locations[..., 2:] * size_variance) * priors[..., 2:]
    ], dim=locations.dim() - 1)


def center_form_to_corner_form(locations):
    return torch.cat([locations[..., :2] - locations[..., 2:] / 2,
                      locations[..., :2] + locations[..., 2:] / 2], locations.dim() - 1)


class SSDConfig:
    """mobilenetv1_ssd_config at half size (image 150; feature maps 10, 5, 3, 2, 1, 1)."""
    image_size = 150
    center_variance = 0.1
    size_variance = 0.2
    specs = [
        SSDSpec(10, 15, SSDBoxSizes(30, 52), [2, 3]),
        SSDSpec(5, 30, SSDBoxSizes(52, 75), [2, 3]),
        SSDSpec(3, 50, SSDBoxSizes(75, 97), [2, 3]),
        SSDSpec(2, 75, SSDBoxSizes(97, 120), [2, 3]),
        SSDSpec(1, 150, SSDBoxSizes(120, 142), [2, 3]),
        SSDSpec(1, 150, SSDBoxSizes(142, 165), [2, 3]),
    ]
    priors = generate_ssd_priors(specs, image_size)


def conv_bn(inp, oup, stride, use_batch_norm=True, onnx_compatible=False):
    ReLU = nn.ReLU if onnx_compatible else nn.ReLU6
    return nn.Sequential(
        nn.Conv2d(inp, oup, 3, stride, 1, bias=False),
        nn.BatchNorm2d(oup),
        ReLU(inplace=True)
    )


def conv_1x1_bn(inp, oup, use_batch_norm=True, onnx_compatible=False):
    ReLU = nn.ReLU if onnx_compatible else nn.ReLU6
    return nn.Sequential(
        nn.Conv2d(inp, oup, 1, 1, 0, bias=False),
        nn.BatchNorm2d(oup),
        ReLU(inplace=True)
    )


class InvertedResidual(nn.Module):
    def __init__(self, inp, oup, stride, expand_ratio, use_batch_norm=True, onnx_compatible=False):
        super(InvertedResidual, self).__init__()
        ReLU = nn.ReLU if onnx_compatible else nn.ReLU6

        self.stride = stride
        assert stride in [1, 2]

        hidden_dim = round(inp * expand_ratio)
        self.use_res_connect = self.stride == 1 and inp == oup

        if expand_ratio == 1:
            self.conv = nn.Sequential(
                # dw
                nn.Conv2d(hidden_dim, hidden_dim, 3, stride, 1, groups=hidden_dim, bias=False),
                nn.BatchNorm2d(hidden_dim),
                ReLU(inplace=True),
                # pw-linear
                nn.Conv2d(hidden_dim, oup, 1, 1, 0, bias=False),
                nn.BatchNorm2d(oup),
            )
        else:
            self.conv = nn.Sequential(
                # pw
                nn.Conv2d(inp, hidden_dim, 1, 1, 0, bias=False),
                nn.BatchNorm2d(hidden_dim),
                ReLU(inplace=True),
                # dw
                nn.Conv2d(hidden_dim, hidden_dim, 3, stride, 1, groups=hidden_dim, bias=False),
                nn.BatchNorm2d(hidden_dim),
                ReLU(inplace=True),
                # pw-linear
                nn.Conv2d(hidden_dim, oup, 1, 1, 0, bias=False),
                nn.BatchNorm2d(oup),
            )

    def forward(self, x):
        if self.use_res_connect:
            return x + self.conv(x)
        else:
            return self.conv(x)


class MobileNetV2(nn.Module):
    """qfgaohao vision/nn/mobilenet_v2.py at reduced widths / depths (features: 12 layers, last 128)."""

    def __init__(self, n_class=1000, input_size=224, width_mult=1., dropout_ratio=0.2,
                 use_batch_norm=True, onnx_compatible=False):
        super(MobileNetV2, self).__init__()
        block = InvertedResidual
        input_channel = 8
        last_channel = 128
        interverted_residual_setting = [
            # t, c, n, s
            [1, 8, 1, 1],
            [6, 12, 1, 2],
            [6, 16, 2, 2],
            [6, 24, 2, 2],
            [6, 32, 1, 1],
            [6, 48, 2, 2],
            [6, 64, 1, 1],
        ]

        # building first layer
        input_channel = int(input_channel * width_mult)
        self.last_channel = int(last_channel * width_mult) if width_mult > 1.0 else last_channel
        self.features = [conv_bn(3, input_channel, 2, onnx_compatible=onnx_compatible)]
        # building inverted residual blocks
        for t, c, n, s in interverted_residual_setting:
            output_channel = int(c * width_mult)
            for i in range(n):
                if i == 0:
                    self.features.append(block(input_channel, output_channel, s, expand_ratio=t,
                                               use_batch_norm=use_batch_norm, onnx_compatible=onnx_compatible))
                else:
                    self.features.append(block(input_channel, output_channel, 1, expand_ratio=t,
                                               use_batch_norm=use_batch_norm, onnx_compatible=onnx_compatible))
                input_channel = output_channel
        # building last several layers
        self.features.append(conv_1x1_bn(input_channel, self.last_channel,
                                         use_batch_norm=use_batch_norm, onnx_compatible=onnx_compatible))
        # make it nn.Sequential
        self.features = nn.Sequential(*self.features)


def SeperableConv2d(in_channels, out_channels, kernel_size=1, stride=1, padding=0, onnx_compatible=False):
    """Replace Conv2d with a depthwise Conv2d and Pointwise Conv2d.
    """
    ReLU = nn.ReLU if onnx_compatible else nn.ReLU6
    return nn.Sequential(
        nn.Conv2d(in_channels=in_channels, out_channels=in_channels, kernel_size=kernel_size,
                  groups=in_channels, stride=stride, padding=padding),
        nn.BatchNorm2d(in_channels),
        ReLU(),
        nn.Conv2d(in_channels=in_channels, out_channels=out_channels, kernel_size=1),
    )


class SSD(nn.Module):
    def __init__(self, num_classes: int, base_net: nn.ModuleList, source_layer_indexes: List[int],
                 extras: nn.ModuleList, classification_headers: nn.ModuleList,
                 regression_headers: nn.ModuleList, is_test=False, config=None, device=None):
        """Compose a SSD model using the given components.
        """
        super(SSD, self).__init__()

        self.num_classes = num_classes
        self.base_net = base_net
        self.source_layer_indexes = source_layer_indexes
        self.extras = extras
        self.classification_headers = classification_headers
        self.regression_headers = regression_headers
        self.is_test = is_test
        self.config = config

        # register layers in source_layer_indexes by adding them to a module list
        self.source_layer_add_ons = nn.ModuleList([t[1] for t in source_layer_indexes
                                                   if isinstance(t, tuple) and not isinstance(t, GraphPath)])
        if is_test:
            self.config = config
            self.register_buffer("priors", config.priors.clone())

    def forward(self, x: torch.Tensor):
        confidences = []
        locations = []
        start_layer_index = 0
        header_index = 0
        for end_layer_index in self.source_layer_indexes:
            if isinstance(end_layer_index, GraphPath):
                path = end_layer_index
                end_layer_index = end_layer_index.s0
                added_layer = None
            elif isinstance(end_layer_index, tuple):
                added_layer = end_layer_index[1]
                end_layer_index = end_layer_index[0]
                path = None
            else:
                added_layer = None
                path = None
            for layer in self.base_net[start_layer_index: end_layer_index]:
                x = layer(x)
            if added_layer:
                y = added_layer(x)
            else:
                y = x
            if path:
                sub = getattr(self.base_net[end_layer_index], path.name)
                for layer in sub[:path.s1]:
                    x = layer(x)
                y = x
                for layer in sub[path.s1:]:
                    x = layer(x)
                end_layer_index += 1
            start_layer_index = end_layer_index
            confidence, location = self.compute_header(header_index, y)
            header_index += 1
            confidences.append(confidence)
            locations.append(location)

        for layer in self.base_net[end_layer_index:]:
            x = layer(x)

        for layer in self.extras:
            x = layer(x)
            confidence, location = self.compute_header(header_index, x)
            header_index += 1
            confidences.append(confidence)
            locations.append(location)

        confidences = torch.cat(confidences, 1)
        locations = torch.cat(locations, 1)

        if self.is_test:
            confidences = F.softmax(confidences, dim=2)
            boxes = convert_locations_to_boxes(
                locations, self.priors, self.config.center_variance, self.config.size_variance
            )
            boxes = center_form_to_corner_form(boxes)
            return confidences, boxes
        else:
            return confidences, locations

    def compute_header(self, i, x):
        confidence = self.classification_headers[i](x)
        confidence = confidence.permute(0, 2, 3, 1).contiguous()
        confidence = confidence.view(confidence.size(0), -1, self.num_classes)

        location = self.regression_headers[i](x)
        location = location.permute(0, 2, 3, 1).contiguous()
        location = location.view(location.size(0), -1, 4)

        return confidence, location


def create_mobilenetv2_ssd_lite(num_classes, width_mult=1.0, use_batch_norm=True, onnx_compatible=False,
                                is_test=False):
    base_net = MobileNetV2(width_mult=width_mult, use_batch_norm=use_batch_norm,
                           onnx_compatible=onnx_compatible).features

    source_layer_indexes = [
        GraphPath(8, 'conv', 3),
        12,
    ]
    extras = nn.ModuleList([
        InvertedResidual(128, 64, stride=2, expand_ratio=0.2),
        InvertedResidual(64, 32, stride=2, expand_ratio=0.25),
        InvertedResidual(32, 32, stride=2, expand_ratio=0.5),
        InvertedResidual(32, 16, stride=2, expand_ratio=0.25)
    ])

    regression_headers = nn.ModuleList([
        SeperableConv2d(in_channels=round(192 * width_mult), out_channels=6 * 4,
                        kernel_size=3, padding=1, onnx_compatible=False),
        SeperableConv2d(in_channels=128, out_channels=6 * 4, kernel_size=3, padding=1, onnx_compatible=False),
        SeperableConv2d(in_channels=64, out_channels=6 * 4, kernel_size=3, padding=1, onnx_compatible=False),
        SeperableConv2d(in_channels=32, out_channels=6 * 4, kernel_size=3, padding=1, onnx_compatible=False),
        SeperableConv2d(in_channels=32, out_channels=6 * 4, kernel_size=3, padding=1, onnx_compatible=False),
        nn.Conv2d(in_channels=16, out_channels=6 * 4, kernel_size=1),
    ])

    classification_headers = nn.ModuleList([
        SeperableConv2d(in_channels=round(192 * width_mult), out_channels=6 * num_classes, kernel_size=3,
                        padding=1),
        SeperableConv2d(in_channels=128, out_channels=6 * num_classes, kernel_size=3, padding=1),
        SeperableConv2d(in_channels=64, out_channels=6 * num_classes, kernel_size=3, padding=1),
        SeperableConv2d(in_channels=32, out_channels=6 * num_classes, kernel_size=3, padding=1),
        SeperableConv2d(in_channels=32, out_channels=6 * num_classes, kernel_size=3, padding=1),
        nn.Conv2d(in_channels=16, out_channels=6 * num_classes, kernel_size=1),
    ])

    return SSD(num_classes, base_net, source_layer_indexes,
               extras, classification_headers, regression_headers, is_test=is_test, config=SSDConfig)


class SSDLiteInference(nn.Module):
    """A thin wrapper: the test-mode SSD's (confidences, boxes) as one tensor torch.cat((boxes, confidences), 2)
    (what the Predictor hands to NMS)."""

    def __init__(self, num_classes):
        super().__init__()
        self.net = create_mobilenetv2_ssd_lite(num_classes, is_test=True)

    def forward(self, x):
        confidences, boxes = self.net(x)
        return torch.cat((boxes, confidences), 2)


# ============================================================================= PSPNet (hszhao/semseg)

class PPM(nn.Module):
    def __init__(self, in_dim, reduction_dim, bins):
        super(PPM, self).__init__()
        self.features = []
        for bin in bins:
            self.features.append(nn.Sequential(
                nn.AdaptiveAvgPool2d(bin),
                nn.Conv2d(in_dim, reduction_dim, kernel_size=1, bias=False),
                nn.BatchNorm2d(reduction_dim),
                nn.ReLU(inplace=True)
            ))
        self.features = nn.ModuleList(self.features)

    def forward(self, x):
        x_size = x.size()
        out = [x]
        for f in self.features:
            out.append(F.interpolate(f(x), x_size[2:], mode='bilinear', align_corners=True))
        return torch.cat(out, 1)


class PSPNet(nn.Module):
    def __init__(self, layers=(1, 1, 1, 1), bins=(1, 2, 3, 6), dropout=0.1, classes=2, zoom_factor=8,
                 use_ppm=True, widths=(4, 8, 16, 32), stem_width=8, cls_width=32):
        super(PSPNet, self).__init__()
        fea_dim = widths[3] * Bottleneck.expansion
        assert fea_dim % len(bins) == 0
        assert classes > 1
        assert zoom_factor in [1, 2, 4, 8]
        self.zoom_factor = zoom_factor
        self.use_ppm = use_ppm

        resnet = ResNet(Bottleneck, layers, widths=widths, stem_width=stem_width, deep_base=True)
        self.layer0 = nn.Sequential(resnet.conv1, resnet.bn1, resnet.relu, resnet.conv2, resnet.bn2, resnet.relu,
                                    resnet.conv3, resnet.bn3, resnet.relu, resnet.maxpool)
        self.layer1, self.layer2, self.layer3, self.layer4 = resnet.layer1, resnet.layer2, resnet.layer3, resnet.layer4

        for n, m in self.layer3.named_modules():
            if 'conv2' in n:
                m.dilation, m.padding, m.stride = (2, 2), (2, 2), (1, 1)
            elif 'downsample.0' in n:
                m.stride = (1, 1)
        for n, m in self.layer4.named_modules():
            if 'conv2' in n:
                m.dilation, m.padding, m.stride = (4, 4), (4, 4), (1, 1)
            elif 'downsample.0' in n:
                m.stride = (1, 1)

        if use_ppm:
            self.ppm = PPM(fea_dim, int(fea_dim / len(bins)), bins)
            fea_dim *= 2
        self.cls = nn.Sequential(
            nn.Conv2d(fea_dim, cls_width, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(cls_width),
            nn.ReLU(inplace=True),
            nn.Dropout2d(p=dropout),
            nn.Conv2d(cls_width, classes, kernel_size=1)
        )

    def forward(self, x, y=None):
        x_size = x.size()
        assert (x_size[2] - 1) % 8 == 0 and (x_size[3] - 1) % 8 == 0
        h = int((x_size[2] - 1) / 8 * self.zoom_factor + 1)
        w = int((x_size[3] - 1) / 8 * self.zoom_factor + 1)

        x = self.layer0(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x_tmp = self.layer3(x)
        x = self.layer4(x_tmp)
        if self.use_ppm:
            x = self.ppm(x)
        x = self.cls(x)
        if self.zoom_factor != 1:
            x = F.interpolate(x, size=(h, w), mode='bilinear', align_corners=True)

        return x


# ============================================================================= DANet (junfu1115/DANet)

class PAM_Module(nn.Module):
    """ Position attention module"""

    # Ref from SAGAN
    def __init__(self, in_dim):
        super(PAM_Module, self).__init__()
        self.chanel_in = in_dim

        self.query_conv = nn.Conv2d(in_channels=in_dim, out_channels=in_dim // 8, kernel_size=1)
        self.key_conv = nn.Conv2d(in_channels=in_dim, out_channels=in_dim // 8, kernel_size=1)
        self.value_conv = nn.Conv2d(in_channels=in_dim, out_channels=in_dim, kernel_size=1)
        self.gamma = nn.Parameter(torch.zeros(1))

        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x):
        """
            inputs :
                x : input feature maps( B X C X H X W)
            returns :
                out : attention value + input feature
                attention: B X (HxW) X (HxW)
        """
        m_batchsize, C, height, width = x.size()
        proj_query = self.query_conv(x).view(m_batchsize, -1, width * height).permute(0, 2, 1)
        proj_key = self.key_conv(x).view(m_batchsize, -1, width * height)
        energy = torch.bmm(proj_query, proj_key)
        attention = self.softmax(energy)
        proj_value = self.value_conv(x).view(m_batchsize, -1, width * height)

        out = torch.bmm(proj_value, attention.permute(0, 2, 1))
        out = out.view(m_batchsize, C, height, width)

        out = self.gamma * out + x
        return out


class CAM_Module(nn.Module):
    """ Channel attention module"""

    def __init__(self, in_dim):
        super(CAM_Module, self).__init__()
        self.chanel_in = in_dim

        self.gamma = nn.Parameter(torch.zeros(1))
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x):
        """
            inputs :
                x : input feature maps( B X C X H X W)
            returns :
                out : attention value + input feature
                attention: B X C X C
        """
        m_batchsize, C, height, width = x.size()
        proj_query = x.view(m_batchsize, C, -1)
        proj_key = x.view(m_batchsize, C, -1).permute(0, 2, 1)
        energy = torch.bmm(proj_query, proj_key)
        energy_new = torch.max(energy, -1, keepdim=True)[0].expand_as(energy) - energy
        attention = self.softmax(energy_new)
        proj_value = x.view(m_batchsize, C, -1)

        out = torch.bmm(attention, proj_value)
        out = out.view(m_batchsize, C, height, width)

        out = self.gamma * out + x
        return out


class DANetHead(nn.Module):
    def __init__(self, in_channels, out_channels, norm_layer):
        super(DANetHead, self).__init__()
        inter_channels = in_channels // 4
        self.conv5a = nn.Sequential(nn.Conv2d(in_channels, inter_channels, 3, padding=1, bias=False),
                                    norm_layer(inter_channels),
                                    nn.ReLU())

        self.conv5c = nn.Sequential(nn.Conv2d(in_channels, inter_channels, 3, padding=1, bias=False),
                                    norm_layer(inter_channels),
                                    nn.ReLU())

        self.sa = PAM_Module(inter_channels)
        self.sc = CAM_Module(inter_channels)
        self.conv51 = nn.Sequential(nn.Conv2d(inter_channels, inter_channels, 3, padding=1, bias=False),
                                    norm_layer(inter_channels),
                                    nn.ReLU())
        self.conv52 = nn.Sequential(nn.Conv2d(inter_channels, inter_channels, 3, padding=1, bias=False),
                                    norm_layer(inter_channels),
                                    nn.ReLU())

        self.conv6 = nn.Sequential(nn.Dropout2d(0.1, False), nn.Conv2d(inter_channels, out_channels, 1))
        self.conv7 = nn.Sequential(nn.Dropout2d(0.1, False), nn.Conv2d(inter_channels, out_channels, 1))

        self.conv8 = nn.Sequential(nn.Dropout2d(0.1, False), nn.Conv2d(inter_channels, out_channels, 1))

    def forward(self, x):
        feat1 = self.conv5a(x)
        sa_feat = self.sa(feat1)
        sa_conv = self.conv51(sa_feat)
        sa_output = self.conv6(sa_conv)

        feat2 = self.conv5c(x)
        sc_feat = self.sc(feat2)
        sc_conv = self.conv52(sc_feat)
        sc_output = self.conv7(sc_conv)

        feat_sum = sa_conv + sc_conv

        sasc_output = self.conv8(feat_sum)

        output = [sasc_output]
        output.append(sa_output)
        output.append(sc_output)
        return tuple(output)


class DANet(nn.Module):
    """encoding BaseNet (dilated ResNet, deep base, output stride 8) + DANetHead; returns the three outputs, each
    upsampled to the input size."""

    def __init__(self, nclass, norm_layer=nn.BatchNorm2d, widths=(4, 8, 16, 32), stem_width=8):
        super(DANet, self).__init__()
        self.nclass = nclass
        self._up_kwargs = {'mode': 'bilinear', 'align_corners': True}
        self.pretrained = ResNet(Bottleneck, [1, 1, 2, 2], widths=widths, stem_width=stem_width, deep_base=True,
                                 replace_stride_with_dilation=[False, True, True], norm_layer=norm_layer)
        self.pretrained.fc = None
        self.head = DANetHead(widths[3] * Bottleneck.expansion, nclass, norm_layer)

    def base_forward(self, x):
        x = self.pretrained.relu(self.pretrained.bn1(self.pretrained.conv1(x)))
        x = self.pretrained.relu(self.pretrained.bn2(self.pretrained.conv2(x)))
        x = self.pretrained.relu(self.pretrained.bn3(self.pretrained.conv3(x)))
        x = self.pretrained.maxpool(x)
        c1 = self.pretrained.layer1(x)
        c2 = self.pretrained.layer2(c1)
        c3 = self.pretrained.layer3(c2)
        c4 = self.pretrained.layer4(c3)
        return c1, c2, c3, c4

    def forward(self, x):
        imsize = x.size()[2:]
        _, _, c3, c4 = self.base_forward(x)

        x = self.head(c4)
        x = list(x)
        x[0] = F.interpolate(x[0], imsize, **self._up_kwargs)
        x[1] = F.interpolate(x[1], imsize, **self._up_kwargs)
        x[2] = F.interpolate(x[2], imsize, **self._up_kwargs)

        outputs = [x[0]]
        outputs.append(x[1])
        outputs.append(x[2])
        return tuple(outputs)


class DANetOutputs(nn.Module):
    """A thin wrapper: DANet's (sasc, sa, sc) tuple concatenated on channels."""

    def __init__(self, nclass):
        super().__init__()
        self.net = DANet(nclass)

    def forward(self, x):
        return torch.cat(self.net(x), 1)


# ============================================================================= OCRNet (HRNet-Semantic-Segmentation)

ALIGN_CORNERS = True
relu_inplace = True


class ModuleHelper:

    @staticmethod
    def BNReLU(num_features, bn_type=None, **kwargs):
        return nn.Sequential(
            nn.BatchNorm2d(num_features, **kwargs),
            nn.ReLU()
        )

    @staticmethod
    def BatchNorm2d(*args, **kwargs):
        return nn.BatchNorm2d


class SpatialGather_Module(nn.Module):
    """
        Aggregate the context features according to the initial
        predicted probability distribution.
        Employ the soft-weighted method to aggregate the context.
    """

    def __init__(self, cls_num=0, scale=1):
        super(SpatialGather_Module, self).__init__()
        self.cls_num = cls_num
        self.scale = scale

    def forward(self, feats, probs):
        batch_size, c, h, w = probs.size(0), probs.size(1), probs.size(2), probs.size(3)
        probs = probs.view(batch_size, c, -1)
        feats = feats.view(batch_size, feats.size(1), -1)
        feats = feats.permute(0, 2, 1)  # batch x hw x c
        probs = F.softmax(self.scale * probs, dim=2)  # batch x k x hw
        ocr_context = torch.matmul(probs, feats) \
            .permute(0, 2, 1).unsqueeze(3)  # batch x k x c
        return ocr_context


class _ObjectAttentionBlock(nn.Module):
    '''
    The basic implementation for object context block
    Input:
        N X C X H X W
    Parameters:
        in_channels       : the dimension of the input feature map
        key_channels      : the dimension after the key/query transform
        scale             : choose the scale to downsample the input feature maps (save memory cost)
        bn_type           : specify the bn type
    Return:
        N X C X H X W
    '''

    def __init__(self, in_channels, key_channels, scale=1, bn_type=None):
        super(_ObjectAttentionBlock, self).__init__()
        self.scale = scale
        self.in_channels = in_channels
        self.key_channels = key_channels
        self.pool = nn.MaxPool2d(kernel_size=(scale, scale))
        self.f_pixel = nn.Sequential(
            nn.Conv2d(in_channels=self.in_channels, out_channels=self.key_channels,
                      kernel_size=1, stride=1, padding=0, bias=False),
            ModuleHelper.BNReLU(self.key_channels, bn_type=bn_type),
            nn.Conv2d(in_channels=self.key_channels, out_channels=self.key_channels,
                      kernel_size=1, stride=1, padding=0, bias=False),
            ModuleHelper.BNReLU(self.key_channels, bn_type=bn_type),
        )
        self.f_object = nn.Sequential(
            nn.Conv2d(in_channels=self.in_channels, out_channels=self.key_channels,
                      kernel_size=1, stride=1, padding=0, bias=False),
            ModuleHelper.BNReLU(self.key_channels, bn_type=bn_type),
            nn.Conv2d(in_channels=self.key_channels, out_channels=self.key_channels,
                      kernel_size=1, stride=1, padding=0, bias=False),
            ModuleHelper.BNReLU(self.key_channels, bn_type=bn_type),
        )
        self.f_down = nn.Sequential(
            nn.Conv2d(in_channels=self.in_channels, out_channels=self.key_channels,
                      kernel_size=1, stride=1, padding=0, bias=False),
            ModuleHelper.BNReLU(self.key_channels, bn_type=bn_type),
        )
        self.f_up = nn.Sequential(
            nn.Conv2d(in_channels=self.key_channels, out_channels=self.in_channels,
                      kernel_size=1, stride=1, padding=0, bias=False),
            ModuleHelper.BNReLU(self.in_channels, bn_type=bn_type),
        )

    def forward(self, x, proxy):
        batch_size, h, w = x.size(0), x.size(2), x.size(3)
        if self.scale > 1:
            x = self.pool(x)

        query = self.f_pixel(x).view(batch_size, self.key_channels, -1)
        query = query.permute(0, 2, 1)
        key = self.f_object(proxy).view(batch_size, self.key_channels, -1)
        value = self.f_down(proxy).view(batch_size, self.key_channels, -1)
        value = value.permute(0, 2, 1)

        sim_map = torch.matmul(query, key)
        sim_map = (self.key_channels ** -.5) * sim_map
        sim_map = F.softmax(sim_map, dim=-1)

        # add bg context ...
        context = torch.matmul(sim_map, value)
        context = context.permute(0, 2, 1).contiguous()
        context = context.view(batch_size, self.key_channels, *x.size()[2:])
        context = self.f_up(context)
        if self.scale > 1:
            context = F.interpolate(input=context, size=(h, w), mode='bilinear', align_corners=ALIGN_CORNERS)

        return context


class ObjectAttentionBlock2D(_ObjectAttentionBlock):
    def __init__(self, in_channels, key_channels, scale=1, bn_type=None):
        super(ObjectAttentionBlock2D, self).__init__(in_channels, key_channels, scale, bn_type=bn_type)


class SpatialOCR_Module(nn.Module):
    """
    Implementation of the OCR module:
    We aggregate the global object representation to update the representation for each pixel.
    """

    def __init__(self, in_channels, key_channels, out_channels, scale=1, dropout=0.1, bn_type=None):
        super(SpatialOCR_Module, self).__init__()
        self.object_context_block = ObjectAttentionBlock2D(in_channels, key_channels, scale, bn_type)
        _in_channels = 2 * in_channels

        self.conv_bn_dropout = nn.Sequential(
            nn.Conv2d(_in_channels, out_channels, kernel_size=1, padding=0, bias=False),
            ModuleHelper.BNReLU(out_channels, bn_type=bn_type),
            nn.Dropout2d(dropout)
        )

    def forward(self, feats, proxy_feats):
        context = self.object_context_block(feats, proxy_feats)

        output = self.conv_bn_dropout(torch.cat([context, feats], 1))

        return output


class HighResolutionModule(nn.Module):
    def __init__(self, num_branches, blocks, num_blocks, num_inchannels, num_channels, fuse_method,
                 multi_scale_output=True):
        super(HighResolutionModule, self).__init__()
        self.num_inchannels = num_inchannels
        self.fuse_method = fuse_method
        self.num_branches = num_branches

        self.multi_scale_output = multi_scale_output

        self.branches = self._make_branches(num_branches, blocks, num_blocks, num_channels)
        self.fuse_layers = self._make_fuse_layers()
        self.relu = nn.ReLU(inplace=relu_inplace)

    def _make_one_branch(self, branch_index, block, num_blocks, num_channels, stride=1):
        downsample = None
        if stride != 1 or self.num_inchannels[branch_index] != num_channels[branch_index] * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.num_inchannels[branch_index], num_channels[branch_index] * block.expansion,
                          kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(num_channels[branch_index] * block.expansion, momentum=BN_MOMENTUM),
            )

        layers = []
        layers.append(block(self.num_inchannels[branch_index], num_channels[branch_index], stride, downsample))
        self.num_inchannels[branch_index] = num_channels[branch_index] * block.expansion
        for i in range(1, num_blocks[branch_index]):
            layers.append(block(self.num_inchannels[branch_index], num_channels[branch_index]))

        return nn.Sequential(*layers)

    def _make_branches(self, num_branches, block, num_blocks, num_channels):
        branches = []

        for i in range(num_branches):
            branches.append(self._make_one_branch(i, block, num_blocks, num_channels))

        return nn.ModuleList(branches)

    def _make_fuse_layers(self):
        if self.num_branches == 1:
            return None

        num_branches = self.num_branches
        num_inchannels = self.num_inchannels
        fuse_layers = []
        for i in range(num_branches if self.multi_scale_output else 1):
            fuse_layer = []
            for j in range(num_branches):
                if j > i:
                    fuse_layer.append(nn.Sequential(
                        nn.Conv2d(num_inchannels[j], num_inchannels[i], 1, 1, 0, bias=False),
                        nn.BatchNorm2d(num_inchannels[i], momentum=BN_MOMENTUM)))
                elif j == i:
                    fuse_layer.append(None)
                else:
                    conv3x3s = []
                    for k in range(i - j):
                        if k == i - j - 1:
                            num_outchannels_conv3x3 = num_inchannels[i]
                            conv3x3s.append(nn.Sequential(
                                nn.Conv2d(num_inchannels[j], num_outchannels_conv3x3, 3, 2, 1, bias=False),
                                nn.BatchNorm2d(num_outchannels_conv3x3, momentum=BN_MOMENTUM)))
                        else:
                            num_outchannels_conv3x3 = num_inchannels[j]
                            conv3x3s.append(nn.Sequential(
                                nn.Conv2d(num_inchannels[j], num_outchannels_conv3x3, 3, 2, 1, bias=False),
                                nn.BatchNorm2d(num_outchannels_conv3x3, momentum=BN_MOMENTUM),
                                nn.ReLU(inplace=relu_inplace)))
                    fuse_layer.append(nn.Sequential(*conv3x3s))
            fuse_layers.append(nn.ModuleList(fuse_layer))

        return nn.ModuleList(fuse_layers)

    def get_num_inchannels(self):
        return self.num_inchannels

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
                elif j > i:
                    width_output = x[i].shape[-1]
                    height_output = x[i].shape[-2]
                    y = y + F.interpolate(
                        self.fuse_layers[i][j](x[j]),
                        size=[height_output, width_output],
                        mode='bilinear', align_corners=ALIGN_CORNERS)
                else:
                    y = y + self.fuse_layers[i][j](x[j])
            x_fuse.append(self.relu(y))

        return x_fuse


class HighResolutionNetOCR(nn.Module):
    """seg_hrnet_ocr.HighResolutionNet at widths (8, 16, 32, 64), one block a branch and one module a stage,
    OCR mid / key channels 32 / 16; returns [out_aux, out] at 1/4 of the input."""

    def __init__(self, num_classes, stem_width=16, channels=(8, 16, 32, 64), ocr_mid_channels=32,
                 ocr_key_channels=16):
        super(HighResolutionNetOCR, self).__init__()
        # stem net
        self.conv1 = nn.Conv2d(3, stem_width, kernel_size=3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(stem_width, momentum=BN_MOMENTUM)
        self.conv2 = nn.Conv2d(stem_width, stem_width, kernel_size=3, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(stem_width, momentum=BN_MOMENTUM)
        self.relu = nn.ReLU(inplace=relu_inplace)

        self.inplanes = stem_width
        self.layer1 = self._make_layer(Bottleneck, stem_width // 2, 1)
        stage1_out_channel = Bottleneck.expansion * (stem_width // 2)

        num_channels = list(channels[:2])
        self.transition1 = self._make_transition_layer([stage1_out_channel], num_channels)
        self.stage2, pre_stage_channels = self._make_stage(2, BasicBlock, num_channels)

        num_channels = list(channels[:3])
        self.transition2 = self._make_transition_layer(pre_stage_channels, num_channels)
        self.stage3, pre_stage_channels = self._make_stage(3, BasicBlock, num_channels)

        num_channels = list(channels[:4])
        self.transition3 = self._make_transition_layer(pre_stage_channels, num_channels)
        self.stage4, pre_stage_channels = self._make_stage(4, BasicBlock, num_channels, multi_scale_output=True)

        last_inp_channels = int(sum(pre_stage_channels))

        self.conv3x3_ocr = nn.Sequential(
            nn.Conv2d(last_inp_channels, ocr_mid_channels, kernel_size=3, stride=1, padding=1),
            nn.BatchNorm2d(ocr_mid_channels),
            nn.ReLU(inplace=relu_inplace),
        )
        self.ocr_gather_head = SpatialGather_Module(num_classes)

        self.ocr_distri_head = SpatialOCR_Module(in_channels=ocr_mid_channels, key_channels=ocr_key_channels,
                                                 out_channels=ocr_mid_channels, scale=1, dropout=0.05)
        self.cls_head = nn.Conv2d(ocr_mid_channels, num_classes, kernel_size=1, stride=1, padding=0, bias=True)

        self.aux_head = nn.Sequential(
            nn.Conv2d(last_inp_channels, last_inp_channels, kernel_size=1, stride=1, padding=0),
            nn.BatchNorm2d(last_inp_channels),
            nn.ReLU(inplace=relu_inplace),
            nn.Conv2d(last_inp_channels, num_classes, kernel_size=1, stride=1, padding=0, bias=True)
        )

    def _make_transition_layer(self, num_channels_pre_layer, num_channels_cur_layer):
        num_branches_cur = len(num_channels_cur_layer)
        num_branches_pre = len(num_channels_pre_layer)

        transition_layers = []
        for i in range(num_branches_cur):
            if i < num_branches_pre:
                if num_channels_cur_layer[i] != num_channels_pre_layer[i]:
                    transition_layers.append(nn.Sequential(
                        nn.Conv2d(num_channels_pre_layer[i], num_channels_cur_layer[i], 3, 1, 1, bias=False),
                        nn.BatchNorm2d(num_channels_cur_layer[i], momentum=BN_MOMENTUM),
                        nn.ReLU(inplace=relu_inplace)))
                else:
                    transition_layers.append(None)
            else:
                conv3x3s = []
                for j in range(i + 1 - num_branches_pre):
                    inchannels = num_channels_pre_layer[-1]
                    outchannels = num_channels_cur_layer[i] if j == i - num_branches_pre else inchannels
                    conv3x3s.append(nn.Sequential(
                        nn.Conv2d(inchannels, outchannels, 3, 2, 1, bias=False),
                        nn.BatchNorm2d(outchannels, momentum=BN_MOMENTUM),
                        nn.ReLU(inplace=relu_inplace)))
                transition_layers.append(nn.Sequential(*conv3x3s))

        return nn.ModuleList(transition_layers)

    def _make_layer(self, block, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * block.expansion, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(planes * block.expansion, momentum=BN_MOMENTUM),
            )

        layers = []
        layers.append(block(self.inplanes, planes, stride, downsample))
        self.inplanes = planes * block.expansion
        for i in range(1, blocks):
            layers.append(block(self.inplanes, planes))

        return nn.Sequential(*layers)

    def _make_stage(self, num_branches, block, num_channels, multi_scale_output=True, num_modules=1):
        num_blocks = [1] * num_branches
        num_inchannels = [c * block.expansion for c in num_channels]
        fuse_method = 'SUM'

        modules = []
        for i in range(num_modules):
            # multi_scale_output is only used last module
            if not multi_scale_output and i == num_modules - 1:
                reset_multi_scale_output = False
            else:
                reset_multi_scale_output = True
            modules.append(HighResolutionModule(num_branches, block, num_blocks, num_inchannels, num_channels,
                                                fuse_method, reset_multi_scale_output))
            num_inchannels = modules[-1].get_num_inchannels()

        return nn.Sequential(*modules), num_inchannels

    def forward(self, x):
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.conv2(x)
        x = self.bn2(x)
        x = self.relu(x)
        x = self.layer1(x)

        x_list = []
        for i in range(2):
            if self.transition1[i] is not None:
                x_list.append(self.transition1[i](x))
            else:
                x_list.append(x)
        y_list = self.stage2(x_list)

        x_list = []
        for i in range(3):
            if self.transition2[i] is not None:
                if i < 2:
                    x_list.append(self.transition2[i](y_list[i]))
                else:
                    x_list.append(self.transition2[i](y_list[-1]))
            else:
                x_list.append(y_list[i])
        y_list = self.stage3(x_list)

        x_list = []
        for i in range(4):
            if self.transition3[i] is not None:
                if i < 3:
                    x_list.append(self.transition3[i](y_list[i]))
                else:
                    x_list.append(self.transition3[i](y_list[-1]))
            else:
                x_list.append(y_list[i])
        x = self.stage4(x_list)

        # Upsampling
        x0_h, x0_w = x[0].size(2), x[0].size(3)
        x1 = F.interpolate(x[1], size=(x0_h, x0_w), mode='bilinear', align_corners=ALIGN_CORNERS)
        x2 = F.interpolate(x[2], size=(x0_h, x0_w), mode='bilinear', align_corners=ALIGN_CORNERS)
        x3 = F.interpolate(x[3], size=(x0_h, x0_w), mode='bilinear', align_corners=ALIGN_CORNERS)

        feats = torch.cat([x[0], x1, x2, x3], 1)

        out_aux_seg = []

        # ocr
        out_aux = self.aux_head(feats)
        # compute contrast feature
        feats = self.conv3x3_ocr(feats)

        context = self.ocr_gather_head(feats, out_aux)
        feats = self.ocr_distri_head(feats, context)

        out = self.cls_head(feats)

        out_aux_seg.append(out_aux)
        out_aux_seg.append(out)

        return out_aux_seg


class OCRNet(nn.Module):
    """A thin wrapper: the model's final prediction (config OUTPUT_INDEX -1), `out`."""

    def __init__(self, num_classes):
        super().__init__()
        self.model = HighResolutionNetOCR(num_classes)

    def forward(self, x):
        return self.model(x)[-1]


# ============================================================================= TSM (mit-han-lab/temporal-shift-module)

class TemporalShift(nn.Module):
    def __init__(self, net, n_segment=3, n_div=8, inplace=False):
        super(TemporalShift, self).__init__()
        self.net = net
        self.n_segment = n_segment
        self.fold_div = n_div
        self.inplace = inplace

    def forward(self, x):
        x = self.shift(x, self.n_segment, fold_div=self.fold_div, inplace=self.inplace)
        return self.net(x)

    @staticmethod
    def shift(x, n_segment, fold_div=3, inplace=False):
        nt, c, h, w = x.size()
        n_batch = nt // n_segment
        x = x.view(n_batch, n_segment, c, h, w)

        fold = c // fold_div
        if inplace:
            raise NotImplementedError  # InplaceShift (a custom autograd Function) is not used by default
        else:
            out = torch.zeros_like(x)
            out[:, :-1, :fold] = x[:, 1:, :fold]  # shift left
            out[:, 1:, fold: 2 * fold] = x[:, :-1, fold: 2 * fold]  # shift right
            out[:, :, 2 * fold:] = x[:, :, 2 * fold:]  # not shift

        return out.view(nt, c, h, w)


def make_temporal_shift(net, n_segment, n_div=8, place='blockres', temporal_pool=False):
    if temporal_pool:
        n_segment_list = [n_segment, n_segment // 2, n_segment // 2, n_segment // 2]
    else:
        n_segment_list = [n_segment] * 4
    assert n_segment_list[-1] > 0

    if place == 'block':
        def make_block_temporal(stage, this_segment):
            blocks = list(stage.children())
            for i, b in enumerate(blocks):
                blocks[i] = TemporalShift(b, n_segment=this_segment, n_div=n_div)
            return nn.Sequential(*(blocks))

        net.layer1 = make_block_temporal(net.layer1, n_segment_list[0])
        net.layer2 = make_block_temporal(net.layer2, n_segment_list[1])
        net.layer3 = make_block_temporal(net.layer3, n_segment_list[2])
        net.layer4 = make_block_temporal(net.layer4, n_segment_list[3])

    elif 'blockres' in place:
        n_round = 1
        if len(list(net.layer3.children())) >= 23:
            n_round = 2

        def make_block_temporal(stage, this_segment):
            blocks = list(stage.children())
            for i, b in enumerate(blocks):
                if i % n_round == 0:
                    blocks[i].conv1 = TemporalShift(b.conv1, n_segment=this_segment, n_div=n_div)
            return nn.Sequential(*blocks)

        net.layer1 = make_block_temporal(net.layer1, n_segment_list[0])
        net.layer2 = make_block_temporal(net.layer2, n_segment_list[1])
        net.layer3 = make_block_temporal(net.layer3, n_segment_list[2])
        net.layer4 = make_block_temporal(net.layer4, n_segment_list[3])
    else:
        raise NotImplementedError(place)


class SegmentConsensus(torch.nn.Module):

    def __init__(self, consensus_type, dim=1):
        super(SegmentConsensus, self).__init__()
        self.consensus_type = consensus_type
        self.dim = dim
        self.shape = None

    def forward(self, input_tensor):
        self.shape = input_tensor.size()
        if self.consensus_type == 'avg':
            output = input_tensor.mean(dim=self.dim, keepdim=True)
        elif self.consensus_type == 'identity':
            output = input_tensor
        else:
            output = None

        return output


class ConsensusModule(torch.nn.Module):

    def __init__(self, consensus_type, dim=1):
        super(ConsensusModule, self).__init__()
        self.consensus_type = consensus_type if consensus_type != 'rnn' else 'identity'
        self.dim = dim

    def forward(self, input):
        return SegmentConsensus(self.consensus_type, self.dim)(input)


class TSN(nn.Module):
    """ops/models.py TSN with is_shift=True, shift_place='blockres', shift_div=8, RGB, new_length 1, avg consensus,
    dropout 0.5, before_softmax=True; base model a torchvision ResNet (Bottleneck, one block a stage, widths
    (8, 16, 32, 64), stem 16)."""

    def __init__(self, num_class, num_segments, modality='RGB', base_model='resnet', new_length=None,
                 consensus_type='avg', before_softmax=True, dropout=0.5, is_shift=True, shift_div=8,
                 shift_place='blockres', temporal_pool=False):
        super(TSN, self).__init__()
        self.modality = modality
        self.num_segments = num_segments
        self.reshape = True
        self.before_softmax = before_softmax
        self.dropout = dropout
        self.consensus_type = consensus_type
        self.is_shift = is_shift
        self.shift_div = shift_div
        self.shift_place = shift_place
        self.temporal_pool = temporal_pool
        if new_length is None:
            self.new_length = 1 if modality == "RGB" else 5
        else:
            self.new_length = new_length

        self._prepare_base_model(base_model)
        self._prepare_tsn(num_class)
        self.consensus = ConsensusModule(consensus_type)
        if not self.before_softmax:
            self.softmax = nn.Softmax()

    def _prepare_base_model(self, base_model):
        self.base_model = ResNet(Bottleneck, [1, 1, 1, 1], widths=(8, 16, 32, 64), stem_width=16)
        if self.is_shift:
            make_temporal_shift(self.base_model, self.num_segments, n_div=self.shift_div, place=self.shift_place,
                                temporal_pool=self.temporal_pool)
        self.base_model.last_layer_name = 'fc'
        self.base_model.avgpool = nn.AdaptiveAvgPool2d(1)

    def _prepare_tsn(self, num_class):
        feature_dim = getattr(self.base_model, self.base_model.last_layer_name).in_features
        if self.dropout == 0:
            setattr(self.base_model, self.base_model.last_layer_name, nn.Linear(feature_dim, num_class))
            self.new_fc = None
        else:
            setattr(self.base_model, self.base_model.last_layer_name, nn.Dropout(p=self.dropout))
            self.new_fc = nn.Linear(feature_dim, num_class)

        std = 0.001
        if self.new_fc is None:
            nn.init.normal_(getattr(self.base_model, self.base_model.last_layer_name).weight, 0, std)
            nn.init.constant_(getattr(self.base_model, self.base_model.last_layer_name).bias, 0)
        else:
            if hasattr(self.new_fc, 'weight'):
                nn.init.normal_(self.new_fc.weight, 0, std)
                nn.init.constant_(self.new_fc.bias, 0)
        return feature_dim

    def forward(self, input, no_reshape=False):
        if not no_reshape:
            sample_len = (3 if self.modality == "RGB" else 2) * self.new_length

            base_out = self.base_model(input.view((-1, sample_len) + input.size()[-2:]))
        else:
            base_out = self.base_model(input)

        if self.dropout > 0:
            base_out = self.new_fc(base_out)

        if not self.before_softmax:
            base_out = self.softmax(base_out)

        if self.reshape:
            if self.is_shift and self.temporal_pool:
                base_out = base_out.view((-1, self.num_segments // 2) + base_out.size()[1:])
            else:
                base_out = base_out.view((-1, self.num_segments) + base_out.size()[1:])
            output = self.consensus(base_out)
            return output.squeeze(1)


# ============================================================================= PointRend (detectron2 project)

def cat(tensors: List[torch.Tensor], dim: int = 0):
    """
    Efficient version of torch.cat that avoids a copy if there is only a single element in a list
    """
    assert isinstance(tensors, (list, tuple))
    if len(tensors) == 1:
        return tensors[0]
    return torch.cat(tensors, dim)


def point_sample(input, point_coords, **kwargs):
    """
    A wrapper around :function:`torch.nn.functional.grid_sample` to support 3D point_coords tensors.
    Unlike :function:`torch.nn.functional.grid_sample` it assumes `point_coords` to lie inside
    [0, 1] x [0, 1] square.
    """
    add_dim = False
    if point_coords.dim() == 3:
        add_dim = True
        point_coords = point_coords.unsqueeze(2)
    output = F.grid_sample(input, 2.0 * point_coords - 1.0, **kwargs)
    if add_dim:
        output = output.squeeze(3)
    return output


def get_uncertain_point_coords_on_grid(uncertainty_map, num_points):
    """
    Find `num_points` most uncertain points from `uncertainty_map` grid.
    """
    R, _, H, W = uncertainty_map.shape
    h_step = 1.0 / float(H)
    w_step = 1.0 / float(W)

    num_points = min(H * W, num_points)
    point_indices = torch.topk(uncertainty_map.view(R, H * W), k=num_points, dim=1)[1]
    point_coords = torch.zeros(R, num_points, 2, dtype=torch.float, device=uncertainty_map.device)
    point_coords[:, :, 0] = w_step / 2.0 + (point_indices % W).to(torch.float) * w_step
    point_coords[:, :, 1] = h_step / 2.0 + (point_indices // W).to(torch.float) * h_step
    return point_indices, point_coords


def calculate_uncertainty(sem_seg_logits):
    """
    For each location of the prediction `sem_seg_logits` we estimate uncerainty as the
        difference between top first and top second predicted logits.
    """
    top2_scores = torch.topk(sem_seg_logits, k=2, dim=1)[0]
    return (top2_scores[:, 1] - top2_scores[:, 0]).unsqueeze(1)


class StandardPointHead(nn.Module):
    """
    A point head multi-layer perceptron which we model with conv1d layers with kernel 1. The head
    takes both fine-grained and coarse prediction features as its input.
    """

    def __init__(self, num_classes, in_channels, fc_dim=16, num_fc=2, cls_agnostic_mask=False,
                 coarse_pred_each_layer=True):
        super(StandardPointHead, self).__init__()
        self.coarse_pred_each_layer = coarse_pred_each_layer

        num_mask_classes = 1 if cls_agnostic_mask else num_classes

        fc_dim_in = in_channels + num_mask_classes
        self.fc_layers = []
        for k in range(num_fc):
            fc = nn.Conv1d(fc_dim_in, fc_dim, kernel_size=1, stride=1, padding=0, bias=True)
            self.add_module("fc{}".format(k + 1), fc)
            self.fc_layers.append(fc)
            fc_dim_in = fc_dim
            fc_dim_in += num_mask_classes if self.coarse_pred_each_layer else 0

        self.predictor = nn.Conv1d(fc_dim_in, num_mask_classes, kernel_size=1, stride=1, padding=0)

    def forward(self, fine_grained_features, coarse_features):
        x = torch.cat((fine_grained_features, coarse_features), dim=1)
        for layer in self.fc_layers:
            x = F.relu(layer(x))
            if self.coarse_pred_each_layer:
                x = cat((x, coarse_features), dim=1)
        return self.predictor(x)


class SemSegFPNHead(nn.Module):
    """detectron2 SemSegFPNHead (GroupNorm scale heads, bilinear Upsample to the common stride)."""

    def __init__(self, in_features, feature_strides, feature_channels, num_classes, conv_dims=16, common_stride=4,
                 gn_groups=8):
        super().__init__()
        self.in_features = in_features
        self.common_stride = common_stride
        self.scale_heads = []
        for in_feature in self.in_features:
            head_ops = []
            head_length = max(1, int(math.log2(feature_strides[in_feature]) - math.log2(self.common_stride)))
            for k in range(head_length):
                conv = nn.Conv2d(feature_channels[in_feature] if k == 0 else conv_dims, conv_dims, kernel_size=3,
                                 stride=1, padding=1, bias=False)
                head_ops.append(conv)
                head_ops.append(nn.GroupNorm(gn_groups, conv_dims))
                head_ops.append(nn.ReLU())
                if feature_strides[in_feature] != self.common_stride:
                    head_ops.append(nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False))
            self.scale_heads.append(nn.Sequential(*head_ops))
            self.add_module(in_feature, self.scale_heads[-1])
        self.predictor = nn.Conv2d(conv_dims, num_classes, kernel_size=1, stride=1, padding=0)

    def layers(self, features):
        for i, f in enumerate(self.in_features):
            if i == 0:
                x = self.scale_heads[i](features[f])
            else:
                x = x + self.scale_heads[i](features[f])
        x = self.predictor(x)
        return x


class PointRendSemSeg(nn.Module):
    """A small ResNet (BasicBlock, res2 / res3) + detectron2-style FPN (p2, p3) + PointRendSemSegHead in inference
    (two subdivision steps, 64 points each)."""

    def __init__(self, num_classes, fpn_channels=16, subdivision_steps=2, subdivision_num_points=64):
        super().__init__()
        self.bottom_up = ResNet(BasicBlock, [1, 1, 1, 1], widths=(16, 32, 32, 32), stem_width=16)
        for name in ("layer3", "layer4", "avgpool", "fc"):  # (out_features res2, res3: later stages not built)
            delattr(self.bottom_up, name)
        self.lateral_convs = nn.ModuleList([nn.Conv2d(32, fpn_channels, 1), nn.Conv2d(16, fpn_channels, 1)])
        self.output_convs = nn.ModuleList([nn.Conv2d(fpn_channels, fpn_channels, 3, padding=1),
                                           nn.Conv2d(fpn_channels, fpn_channels, 3, padding=1)])
        self.in_features = ["p2"]
        self.coarse_sem_seg_head = SemSegFPNHead(["p2", "p3"], {"p2": 4, "p3": 8},
                                                 {"p2": fpn_channels, "p3": fpn_channels}, num_classes)
        self.point_head = StandardPointHead(num_classes, fpn_channels)
        self.subdivision_steps = subdivision_steps
        self.subdivision_num_points = subdivision_num_points

    def backbone(self, x):
        b = self.bottom_up
        x = b.maxpool(b.relu(b.bn1(b.conv1(x))))
        res2 = b.layer1(x)
        res3 = b.layer2(res2)
        bottom_up_features = [res2, res3]
        results = []
        prev_features = self.lateral_convs[0](bottom_up_features[-1])
        results.append(self.output_convs[0](prev_features))
        for idx, (lateral_conv, output_conv) in enumerate(zip(self.lateral_convs, self.output_convs)):
            if idx > 0:
                features = bottom_up_features[-idx - 1]
                top_down_features = F.interpolate(prev_features, scale_factor=2.0, mode="nearest")
                lateral_features = lateral_conv(features)
                prev_features = lateral_features + top_down_features
                results.insert(0, output_conv(prev_features))
        return {"p2": results[0], "p3": results[1]}

    def forward(self, images):
        features = self.backbone(images)
        coarse_sem_seg_logits = self.coarse_sem_seg_head.layers(features)

        sem_seg_logits = coarse_sem_seg_logits.clone()
        for _ in range(self.subdivision_steps):
            sem_seg_logits = F.interpolate(sem_seg_logits, scale_factor=2, mode="bilinear", align_corners=False)
            uncertainty_map = calculate_uncertainty(sem_seg_logits)
            point_indices, point_coords = get_uncertain_point_coords_on_grid(
                uncertainty_map, self.subdivision_num_points
            )
            fine_grained_features = cat([point_sample(features[in_feature], point_coords, align_corners=False)
                                         for in_feature in self.in_features])
            coarse_features = point_sample(coarse_sem_seg_logits, point_coords, align_corners=False)
            point_logits = self.point_head(fine_grained_features, coarse_features)

            # put sem seg point predictions to the right places on the upsampled grid.
            N, C, H, W = sem_seg_logits.shape
            point_indices = point_indices.unsqueeze(1).expand(-1, C, -1)
            sem_seg_logits = (
                sem_seg_logits.reshape(N, C, H * W)
                .scatter_(2, point_indices, point_logits)
                .view(N, C, H, W)
            )
        return sem_seg_logits


# ============================================================================= registry

def _randomize_extra(module: nn.Module, seed: int = 0) -> nn.Module:
    """The house `randomize` (BatchNorm2d statistics and affine parameters), then, from the same seed, non-trivial
    GroupNorm / LayerNorm affine parameters, FrozenBatchNorm2d buffers, FCOS Scale values and DANet PAM / CAM gammas
    (fresh modules have identity norms, unit scales and zero gammas, which make both attention modules the
    identity)."""
    randomize(module, seed)
    g = torch.Generator().manual_seed(seed + 1000003)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (nn.GroupNorm, nn.LayerNorm)) and m.weight is not None:
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.rand(m.bias.shape, generator=g) * 0.5 - 0.25)
            elif isinstance(m, FrozenBatchNorm2d):
                c = m.weight.numel()
                m.running_mean.copy_(torch.rand(c, generator=g) - 0.5)
                m.running_var.copy_(torch.rand(c, generator=g) * 1.5 + 0.5)
                m.weight.copy_(torch.rand(c, generator=g) + 0.5)
                m.bias.copy_(torch.rand(c, generator=g) * 0.5 - 0.25)
            elif isinstance(m, Scale):
                m.scale.copy_(torch.rand(m.scale.shape, generator=g) + 0.5)
            elif isinstance(m, (PAM_Module, CAM_Module)):
                m.gamma.copy_(torch.rand(m.gamma.shape, generator=g) + 0.5)
    return module


FAMILIES = {
    # name: (builder(num_classes), input shape). YOLOv8 / CenterNet / DANet / OCRNet / PointRend at 64x64; FCOS at
    # 96 (P3..P7 12, 6, 3, 2, 1 a side); SSD-lite at 150 (maps 10, 5, 3, 2, 1, 1); PSPNet at 65 ((H - 1) % 8 == 0,
    # a 9x9 map under the PPM: bins 2 and 6 overlap unevenly); TSM: 2 clips of 4 RGB segments stacked on channels
    "yolov8": (lambda nc: DetectionModel(nc), (2, 3, 64, 64)),
    "centernet": (lambda nc: CtdetInference(nc), (2, 3, 64, 64)),
    "fcos": (lambda nc: FCOS(nc), (2, 3, 96, 96)),
    "ssdlite": (lambda nc: SSDLiteInference(nc), (2, 3, 150, 150)),
    "pspnet": (lambda nc: PSPNet(classes=nc), (2, 3, 65, 65)),
    "danet": (lambda nc: DANetOutputs(nc), (2, 3, 64, 64)),
    "ocrnet": (lambda nc: OCRNet(nc), (2, 3, 64, 64)),
    "tsm": (lambda nc: TSN(nc, num_segments=4), (2, 12, 64, 64)),
    "pointrend": (lambda nc: PointRendSemSeg(nc), (2, 3, 64, 64)),
}


def build(name: str, num_classes: int = 10, seed: int = 0, train: bool = False) -> nn.Module:
    """Family `name` with its norms, Scales and attention gammas randomized (seeded), in eval mode. train=True:
    every dropout's p set to 0, so one training step can be compared with a Trainer's."""
    m = _randomize_extra(FAMILIES[name][0](num_classes), seed).eval()
    if train:
        for mod in m.modules():
            if isinstance(mod, nn.modules.dropout._DropoutNd):
                mod.p = 0.0
    return m
