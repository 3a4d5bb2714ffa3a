"""Modern CNN building blocks, written in the idioms real model code uses, exported by both torch
exporters, imported with from_onnx, compiled and run through a Session: equal to ONNX Runtime on the
same file and to PyTorch (fp32, max error <= 1e-4 of the output's max)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tilefuse
from onnx_export import EXPORTERS, assert_close_to_max, export, ort_run, torch_run


class SqueezeExcite(nn.Module):
    def __init__(self, c, r=4, gate=nn.Hardsigmoid):
        super().__init__()
        self.fc1, self.fc2, self.gate = nn.Conv2d(c, c // r, 1), nn.Conv2d(c // r, c, 1), gate()

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        return x * self.gate(self.fc2(F.relu(self.fc1(s))))


class MobileBlocks(nn.Module):
    """MobileNetV2/V3: ReLU6, depthwise stride 2, hardswish, squeeze-excitation, inverted residual."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6(inplace=True))
        self.expand = nn.Sequential(nn.Conv2d(16, 48, 1, bias=False), nn.BatchNorm2d(48), nn.Hardswish())
        self.dw = nn.Sequential(nn.Conv2d(48, 48, 5, 1, 2, groups=48, bias=False), nn.BatchNorm2d(48),
                                nn.Hardswish())
        self.se = SqueezeExcite(48)
        self.project = nn.Sequential(nn.Conv2d(48, 16, 1, bias=False), nn.BatchNorm2d(16))
        self.down = nn.Conv2d(16, 24, 3, 2, 1, groups=8)
        self.head = nn.Linear(24, 10)

    def forward(self, x):
        if x.ndim != 4:
            raise ValueError("expected NCHW")
        x = self.stem(x)
        x = x + self.project(self.se(self.dw(self.expand(x))))
        x = F.hardtanh(self.down(x), 0.0, 6.0)
        x = F.adaptive_avg_pool2d(x, 1)
        return self.head(torch.flatten(x, 1))


class ShuffleBlock(nn.Module):
    """ShuffleNetV2: chunk, two branches, concat, channel shuffle with x.size(1) // groups."""

    def __init__(self, c=16):
        super().__init__()
        h = c // 2
        self.branch = nn.Sequential(nn.Conv2d(h, h, 1), nn.BatchNorm2d(h), nn.ReLU(inplace=True),
                                    nn.Conv2d(h, h, 3, 1, 1, groups=h), nn.BatchNorm2d(h),
                                    nn.Conv2d(h, h, 1), nn.ReLU(inplace=True))
        self.stem = nn.Conv2d(3, c, 3, 1, 1)

    @staticmethod
    def shuffle(x, groups: int):
        n, c, h, w = x.size()
        x = x.view(n, groups, c // groups, h, w)
        x = torch.transpose(x, 1, 2).contiguous()
        return x.view(n, -1, h, w)

    def forward(self, x):
        x = self.stem(x)
        a, b = x.chunk(2, dim=1)
        x = torch.cat((a, self.branch(b)), dim=1)
        x = self.shuffle(x, 2)
        c = x.size(1) // 2
        return x[:, :c] * torch.sigmoid(x[:, c:])


class LayerNorm2d(nn.LayerNorm):
    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """ConvNeXt: 7x7 depthwise, permute -> LayerNorm -> Linear -> GELU -> Linear -> layer scale ->
    permute, residual; LayerNorm2d downsampling."""

    def __init__(self, c=16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 4, 4), LayerNorm2d(c, eps=1e-6))
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.pw1, self.pw2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.linspace(0.5, 1.5, c))
        self.down = nn.Sequential(LayerNorm2d(c, eps=1e-6), nn.Conv2d(c, 2 * c, 2, 2))
        self.head_norm = nn.LayerNorm(2 * c)

    def forward(self, x):
        x = self.stem(x)
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.pw2(F.gelu(self.pw1(self.norm(y))))
        x = x + (self.gamma * y).permute(0, 3, 1, 2)
        x = self.down(x)
        return self.head_norm(x.mean([-2, -1]))


class UNetSmall(nn.Module):
    """UNet: encoder, max pool, transposed-conv upsampling, skip concat, bilinear resize, slicing."""

    def __init__(self):
        super().__init__()
        self.e1 = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True))
        self.e2 = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(inplace=True))
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.up3 = nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1)
        self.d1 = nn.Sequential(nn.Conv2d(16, 8, 3, padding=1), nn.PReLU(8))
        self.out = nn.Conv2d(8, 2, 1)

    def forward(self, x):
        s1 = self.e1(x)
        b = self.e2(F.max_pool2d(s1, 2))
        u = self.up(b) + self.up3(b)
        d = self.d1(torch.cat([u, s1], dim=1))
        y = self.out(d)
        y = y + F.interpolate(F.avg_pool2d(y, 2), scale_factor=2, mode="bilinear", align_corners=False)
        return y[:, :1] - F.interpolate(y[:, 1:], size=(y.shape[2], y.shape[3]), mode="bilinear",
                                        align_corners=True)


class ASPPHead(nn.Module):
    """DeepLabV3: dilated 3x3 branches, image pooling branch resized back (bilinear), concat, project."""

    def __init__(self, c=8):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, 2, 1), nn.BatchNorm2d(c), nn.ReLU())
        self.b0 = nn.Sequential(nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.b1 = nn.Sequential(nn.Conv2d(c, c, 3, padding=2, dilation=2, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.b2 = nn.Sequential(nn.Conv2d(c, c, 3, padding=3, dilation=3, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(c, c, 1, bias=False), nn.ReLU())
        self.project = nn.Sequential(nn.Conv2d(4 * c, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                                     nn.Dropout(0.5), nn.Conv2d(c, 3, 1))

    def forward(self, x):
        size = x.shape[-2:]
        f = self.stem(x)
        p = F.interpolate(self.pool(f), size=f.shape[-2:], mode="bilinear", align_corners=False)
        y = self.project(torch.cat([self.b0(f), self.b1(f), self.b2(f), p], dim=1))
        return F.interpolate(y, size=size, mode="bilinear", align_corners=False)


class YoloNeck(nn.Module):
    """A YOLO-style neck: SiLU convs, nearest 2x upsampling, concat across scales, leaky/ELU/tanh heads."""

    def __init__(self):
        super().__init__()
        def cbs(i, o, s=1):
            return nn.Sequential(nn.Conv2d(i, o, 3, s, 1, bias=False), nn.BatchNorm2d(o), nn.SiLU(inplace=True))
        self.p3, self.p4, self.p5 = cbs(3, 8, 2), cbs(8, 16, 2), cbs(16, 16, 2)
        self.lat = nn.Conv2d(16, 8, 1)
        self.fuse = cbs(24, 8)
        self.fuse3 = cbs(16, 8)
        self.act = nn.ModuleList([nn.LeakyReLU(0.1), nn.ELU(), nn.Tanh(), nn.Identity()])

    def forward(self, x):
        p3 = self.p3(x)
        p4 = self.p4(p3)
        p5 = self.p5(p4)
        up = F.interpolate(self.lat(p5), scale_factor=2, mode="nearest")
        f4 = self.fuse(torch.cat([up, p4], 1))
        f3 = self.fuse3(torch.cat([nn.Upsample(scale_factor=2)(f4), p3], 1))
        outs = [a(f3) for a in self.act]
        return torch.cat(outs, 1)


class EfficientBlock(nn.Module):
    """EfficientNet MBConv: SiLU, SE with x.mean((2, 3), keepdim=True) and sigmoid, padding, residual."""

    def __init__(self, c=16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, 2, 1, bias=False), nn.BatchNorm2d(c), nn.SiLU())
        self.dw = nn.Sequential(nn.Conv2d(c, c, 3, 1, 0, groups=c, bias=False), nn.BatchNorm2d(c), nn.SiLU())
        self.se = SqueezeExcite(c, 4, nn.Sigmoid)
        self.pw = nn.Sequential(nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        x = self.stem(x)
        y = self.dw(F.pad(x, (1, 1, 1, 1), mode="reflect"))
        y = self.pw(self.se(y))
        x = x + y
        x = F.pad(x, (0, 1, 2, 0), value=0.5)
        return x.view(x.size(0), -1)[:, ::3]


class Audio1d(nn.Module):
    """A 1-D CNN (keyword spotting style): Conv1d, BatchNorm1d, pools, ReLU6 written as min/max."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(2, 8, 5, stride=2, padding=2)
        self.bn = nn.BatchNorm1d(8)
        self.c2 = nn.Conv1d(8, 8, 3, padding=2, dilation=2, groups=4)
        self.up = nn.ConvTranspose1d(8, 4, 4, stride=2, padding=1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        y = torch.clamp(torch.maximum(self.bn(self.c1(x)), torch.tensor(0.0)), max=6.0)
        y = F.max_pool1d(self.c2(y), 3, stride=1, padding=1) + F.avg_pool1d(y, 3, 1, 1)
        y = self.up(y)
        return self.fc(F.adaptive_avg_pool1d(-y, 1).flatten(1))


class SuperRes(nn.Module):
    """ESPCN-style super-resolution: PixelShuffle (DepthToSpace) and PixelUnshuffle, Tanh output."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(12, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 3 * 16, 3, padding=1)

    def forward(self, x):
        y = F.pixel_unshuffle(x, 2)                         # (N, 3, 16, 16) -> (N, 12, 8, 8)
        y = torch.tanh(self.c2(F.elu(self.c1(y))))
        return F.pixel_shuffle(y, 4) + F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)


MODELS = {
    "mobile": (MobileBlocks, (2, 3, 32, 32)),
    "shuffle": (ShuffleBlock, (1, 3, 12, 10)),
    "convnext": (ConvNeXtBlock, (1, 3, 32, 32)),
    "unet": (UNetSmall, (1, 3, 16, 16)),
    "aspp": (ASPPHead, (1, 3, 20, 24)),
    "yolo_neck": (YoloNeck, (1, 3, 32, 32)),
    "efficient": (EfficientBlock, (2, 3, 16, 16)),
    "audio1d": (Audio1d, (2, 2, 30)),
    "superres": (SuperRes, (1, 3, 16, 16)),
}


def _randomize_bn(m):
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d)):
                mod.running_mean.copy_(torch.rand(mod.num_features, generator=g) - 0.5)
                mod.running_var.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
                mod.weight.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
                mod.bias.copy_(torch.rand(mod.num_features, generator=g) - 0.5)
    return m


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_modern_block(name, exporter):
    cls, shape = MODELS[name]
    torch.manual_seed(0)
    m = _randomize_bn(cls()).eval()
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    blob = export(m, x, exporter)
    net = tilefuse.from_onnx(blob)
    y = tilefuse.Session(tilefuse.compile(net)).run(x)
    assert_close_to_max(y, ort_run(blob, x), what=f"{name}/{exporter} vs ONNX Runtime")
    assert_close_to_max(y, torch_run(m, x), what=f"{name}/{exporter} vs PyTorch")
    assert_close_to_max(tilefuse.evaluate(net, x)[0], torch_run(m, x), what=f"{name}/{exporter} reference")


@pytest.mark.parametrize("name", ["mobile", "efficient", "yolo_neck"])
def test_unoptimized_dynamo_export_folds(name):
    """torch.onnx.export(dynamo=True, optimize=False) leaves Shape -> Expand, CastLike, Constant and
    BatchNormalization chains in the graph; the importer folds the constant ones."""
    cls, shape = MODELS[name]
    torch.manual_seed(1)
    m = _randomize_bn(cls()).eval()
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    blob = export(m, x, "dynamo_unoptimized")
    ops = {n.op_type for n in __import__("onnx").load_from_string(blob).graph.node}
    assert {"Shape", "Expand", "CastLike"} <= ops
    y = tilefuse.Session(tilefuse.compile(tilefuse.from_onnx(blob))).run(x)
    assert_close_to_max(y, ort_run(blob, x), what=f"{name} vs ONNX Runtime")
    assert_close_to_max(y, torch_run(m, x), what=f"{name} vs PyTorch")


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_modern_block_old_opsets(name, opset):
    """The TorchScript exporter at opsets 11 and 13: Clip with min/max inputs, Resize-11/13,
    HardSigmoid * x for hardswish, LayerNorm and GELU spelled out of ReduceMean/Pow/Sqrt and Erf."""
    cls, shape = MODELS[name]
    torch.manual_seed(2)
    m = _randomize_bn(cls()).eval()
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    blob = export(m, x, "torchscript", opset)
    y = tilefuse.Session(tilefuse.compile(tilefuse.from_onnx(blob))).run(x)
    assert_close_to_max(y, ort_run(blob, x), what=f"{name}/opset {opset} vs ONNX Runtime")
    assert_close_to_max(y, torch_run(m, x), what=f"{name}/opset {opset} vs PyTorch")


# (coordinate_transformation_mode, nearest_mode): (input length, output length) where a source coordinate lands
# on an exact tie (an integer, or a half for the round modes) and torch's float32 order (dst times in / out) and
# ONNX's (dst divided by out / in) round it to different sides: the ONNX import follows ONNX Runtime
RESIZE_TIES = {("half_pixel", "round_prefer_ceil"): (2, 41), ("align_corners", "floor"): (2, 42),
               ("half_pixel", "ceil"): (3, 21), ("pytorch_half_pixel", "ceil"): (3, 21),
               ("align_corners", "round_prefer_floor"): (3, 29), ("half_pixel", "floor"): (3, 37),
               ("asymmetric", "round_prefer_floor"): (3, 42), ("half_pixel", "round_prefer_floor"): (4, 14),
               ("align_corners", "ceil"): (5, 29), ("asymmetric", "ceil"): (5, 35),
               ("asymmetric", "round_prefer_ceil"): (7, 46), ("align_corners", "round_prefer_ceil"): (8, 47),
               ("asymmetric", "floor"): (14, 2)}


@pytest.mark.parametrize("modes", sorted(RESIZE_TIES))
def test_resize_nearest_ties_follow_onnx_runtime(modes):
    """A Resize (nearest, by sizes) whose source coordinates hit exact ties: the imported network (compiled,
    and streamed over its rows) picks ONNX Runtime's input rows and columns, bit for bit; a network built with
    torch's arithmetic (`Network.resize`'s default) picks other ones at these sizes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from tilefuse.kernels import reference as ref
    coord, nearest = modes
    n_in, n_out = RESIZE_TIES[modes]
    shape = (1, 3, n_in, n_in + 1)
    sizes = numpy_helper.from_array(np.array([1, 3, n_out, n_out + 1], np.int64), "sizes")
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest",
                            coordinate_transformation_mode=coord, nearest_mode=nearest)
    graph = helper.make_graph([node], "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, n_out, n_out + 1])],
                              [sizes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 8
    blob = model.SerializeToString()
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want = ort_run(blob, x)
    net = tilefuse.from_onnx(onnx.load_from_string(blob))
    assert np.array_equal(tilefuse.Session(tilefuse.compile(net, threads=2)).run(x), want)
    streamed = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": 2})
    assert np.array_equal(streamed.run(x), want)
    torch_order = ref.resize_nearest_index(n_in, n_out, None, coord, nearest, "aten")
    assert not np.array_equal(torch_order, ref.resize_nearest_index(n_in, n_out, None, coord, nearest, "onnx"))


def _resize_width_model(n_in, n_out, coord, nearest, channels=1, rows=1):
    """A Resize (nearest, by sizes) of the last axis only, (1, channels, rows, n_in) -> (.., n_out), opset 19."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    sizes = numpy_helper.from_array(np.array([1, channels, rows, n_out], np.int64), "sizes")
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest",
                            coordinate_transformation_mode=coord, nearest_mode=nearest)
    graph = helper.make_graph([node], "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                 [1, channels, rows, n_in])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, rows, n_out])],
                              [sizes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


@pytest.mark.parametrize("nearest", ["round_prefer_ceil", "round_prefer_floor"])
def test_resize_round_modes_near_a_half_follow_onnx_runtime(nearest):
    """ONNX Runtime's round modes take a float32 source coordinate within ONNX_HALF_TIE (1e-6) of a half as the
    half (asymmetric 7 -> 2: 3.4999998 reads input 4 with round_prefer_ceil), and one 1.9e-6 off as it is
    (26 -> 28: 19.499998 reads 19). Every size pair of input 2-32, output 2-48 with a source within 4e-6 of a half
    (but not on it), in four coordinate modes: the importer's input indices are ONNX Runtime's, and some differ
    from plain float32 rounding of the same coordinates (what the importer did before)."""
    from tilefuse.kernels import reference as ref
    checked = differs = 0
    for coord in ("asymmetric", "half_pixel", "pytorch_half_pixel", "align_corners"):
        for n_in in range(2, 33):
            for n_out in range(2, 49):
                src = ref.resize_source(n_in, n_out, None, coord, "onnx").astype(np.float64)
                off = np.abs(src - np.floor(src) - 0.5)
                if not ((off > 0) & (off <= 4e-6)).any():
                    continue
                x = np.arange(n_in, dtype=np.float32).reshape(1, 1, 1, n_in)
                want = ort_run(_resize_width_model(n_in, n_out, coord, nearest), x).reshape(-1)
                got = ref.resize_nearest_index(n_in, n_out, None, coord, nearest, "onnx")
                assert np.array_equal(got, want), (coord, n_in, n_out, got, want)
                plain = np.clip(np.floor(src + 0.5) if nearest == "round_prefer_ceil" else np.ceil(src - 0.5),
                                0, n_in - 1)
                checked += 1
                differs += not np.array_equal(plain, want)
    assert checked > 100 and differs > 5, (checked, differs)


NEAR_HALF = [(7, 2, "asymmetric", "round_prefer_ceil"), (7, 38, "asymmetric", "round_prefer_floor"),
             (14, 39, "half_pixel", "round_prefer_ceil"), (14, 19, "half_pixel", "round_prefer_floor")]


@pytest.mark.parametrize("case", NEAR_HALF)
def test_resize_near_a_half_compiled_and_streamed_as_onnx_runtime(case):
    """The near-half sizes through the network: compiled and streamed, the values are ONNX Runtime's bit for bit."""
    import onnx
    n_in, n_out, coord, nearest = case
    blob = _resize_width_model(n_in, n_out, coord, nearest, channels=3, rows=5)
    x = np.random.default_rng(1).standard_normal((1, 3, 5, n_in)).astype(np.float32)
    want = ort_run(blob, x)
    net = tilefuse.from_onnx(onnx.load_from_string(blob))
    assert np.array_equal(tilefuse.Session(tilefuse.compile(net, threads=2)).run(x), want)
    streamed = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": 2})
    assert np.array_equal(streamed.run(x), want)
