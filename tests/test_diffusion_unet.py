"""A diffusion model's noise-prediction UNet, written as guided-diffusion's `unet.py` writes it (Dhariwal & Nichol,
2021; the DDPM / ADM family): the sinusoidal timestep embedding (`torch.arange`, `timesteps[:, None].float() *
freqs[None]`, `torch.cat([torch.cos(args), torch.sin(args)])`), ResBlocks that add the embedding with
`while len(emb_out.shape) < len(h.shape): emb_out = emb_out[..., None]` (or scale and shift the norm with
`torch.chunk(emb_out, 2, dim=1)`), GroupNorm32's `super().forward(x.float()).type(x.dtype)`, the legacy QKV
attention over `x.reshape(b, c, -1)` with 1-D convs and `torch.einsum("bct,bcs->bts", q * scale, k * scale)`,
nearest upsampling, skip concatenations, and `TimestepEmbedSequential`'s isinstance dispatch.

The network takes two inputs (the image and a batch of timesteps); through from_torch against PyTorch and through
both ONNX exporters against PyTorch and ONNX Runtime. Timesteps up to 999 put the embedding's arguments at
hundreds of radians: a float32 sin / cos with a careless range reduction is off by 1e-4 there."""
from __future__ import annotations

import io
import logging
import math
import warnings
from abc import abstractmethod

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx_export import assert_close_to_max

import tilefuse


def timestep_embedding(timesteps, dim, max_period=10000):
    """guided-diffusion's nn.timestep_embedding."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(max_period) * torch.arange(start=0, end=half, dtype=torch.float32) / half
    ).to(device=timesteps.device)
    args = timesteps[:, None].float() * freqs[None]
    embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        embedding = torch.cat([embedding, torch.zeros_like(embedding[:, :1])], dim=-1)
    return embedding


class GroupNorm32(nn.GroupNorm):
    def forward(self, x):
        return super().forward(x.float()).type(x.dtype)


def normalization(channels):
    return GroupNorm32(32, channels)


class TimestepBlock(nn.Module):
    @abstractmethod
    def forward(self, x, emb):
        """Apply the module to `x` given `emb` timestep embeddings."""


class TimestepEmbedSequential(nn.Sequential, TimestepBlock):
    def forward(self, x, emb):
        for layer in self:
            if isinstance(layer, TimestepBlock):
                x = layer(x, emb)
            else:
                x = layer(x)
        return x


class Upsample(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.channels = channels
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        assert x.shape[1] == self.channels
        x = F.interpolate(x, scale_factor=2, mode="nearest")
        return self.conv(x)


class Downsample(nn.Module):
    def __init__(self, channels, use_conv=True):
        super().__init__()
        self.channels = channels
        self.op = nn.Conv2d(channels, channels, 3, stride=2, padding=1) if use_conv else nn.AvgPool2d(2, 2)

    def forward(self, x):
        assert x.shape[1] == self.channels
        return self.op(x)


class ResBlock(TimestepBlock):
    def __init__(self, channels, emb_channels, dropout, out_channels=None, use_scale_shift_norm=False):
        super().__init__()
        self.out_channels = out_channels or channels
        self.use_scale_shift_norm = use_scale_shift_norm
        self.in_layers = nn.Sequential(normalization(channels), nn.SiLU(),
                                       nn.Conv2d(channels, self.out_channels, 3, padding=1))
        self.emb_layers = nn.Sequential(
            nn.SiLU(), nn.Linear(emb_channels, 2 * self.out_channels if use_scale_shift_norm else self.out_channels))
        self.out_layers = nn.Sequential(normalization(self.out_channels), nn.SiLU(), nn.Dropout(p=dropout),
                                        nn.Conv2d(self.out_channels, self.out_channels, 3, padding=1))
        self.skip_connection = (nn.Identity() if self.out_channels == channels
                                else nn.Conv2d(channels, self.out_channels, 1))

    def forward(self, x, emb):
        h = self.in_layers(x)
        emb_out = self.emb_layers(emb).type(h.dtype)
        while len(emb_out.shape) < len(h.shape):
            emb_out = emb_out[..., None]
        if self.use_scale_shift_norm:
            out_norm, out_rest = self.out_layers[0], self.out_layers[1:]
            scale, shift = torch.chunk(emb_out, 2, dim=1)
            h = out_norm(h) * (1 + scale) + shift
            h = out_rest(h)
        else:
            h = h + emb_out
            h = self.out_layers(h)
        return self.skip_connection(x) + h


class QKVAttentionLegacy(nn.Module):
    def __init__(self, n_heads):
        super().__init__()
        self.n_heads = n_heads

    def forward(self, qkv):
        bs, width, length = qkv.shape
        assert width % (3 * self.n_heads) == 0
        ch = width // (3 * self.n_heads)
        q, k, v = qkv.reshape(bs * self.n_heads, ch * 3, length).split(ch, dim=1)
        scale = 1 / math.sqrt(math.sqrt(ch))
        weight = torch.einsum("bct,bcs->bts", q * scale, k * scale)
        weight = torch.softmax(weight.float(), dim=-1).type(weight.dtype)
        a = torch.einsum("bts,bcs->bct", weight, v)
        return a.reshape(bs, -1, length)


class AttentionBlock(nn.Module):
    def __init__(self, channels, num_heads=1):
        super().__init__()
        self.channels = channels
        self.norm = normalization(channels)
        self.qkv = nn.Conv1d(channels, channels * 3, 1)
        self.attention = QKVAttentionLegacy(num_heads)
        self.proj_out = nn.Conv1d(channels, channels, 1)

    def forward(self, x):
        b, c, *spatial = x.shape
        x = x.reshape(b, c, -1)
        qkv = self.qkv(self.norm(x))
        h = self.attention(qkv)
        h = self.proj_out(h)
        return (x + h).reshape(b, c, *spatial)


class UNetModel(nn.Module):
    """guided-diffusion's UNetModel, cut to what a 32x32 test needs (two levels, attention at 16x16)."""

    def __init__(self, in_channels=3, model_channels=32, out_channels=6, num_res_blocks=1, attention_resolutions=(2,),
                 channel_mult=(1, 2), num_heads=2, use_scale_shift_norm=False, conv_resample=True):
        super().__init__()
        self.model_channels = model_channels
        time_embed_dim = model_channels * 4
        self.time_embed = nn.Sequential(nn.Linear(model_channels, time_embed_dim), nn.SiLU(),
                                        nn.Linear(time_embed_dim, time_embed_dim))
        ch = input_ch = int(channel_mult[0] * model_channels)
        self.input_blocks = nn.ModuleList([TimestepEmbedSequential(nn.Conv2d(in_channels, ch, 3, padding=1))])
        input_block_chans = [ch]
        ds = 1
        for level, mult in enumerate(channel_mult):
            for _ in range(num_res_blocks):
                layers = [ResBlock(ch, time_embed_dim, 0.1, out_channels=int(mult * model_channels),
                                   use_scale_shift_norm=use_scale_shift_norm)]
                ch = int(mult * model_channels)
                if ds in attention_resolutions:
                    layers.append(AttentionBlock(ch, num_heads=num_heads))
                self.input_blocks.append(TimestepEmbedSequential(*layers))
                input_block_chans.append(ch)
            if level != len(channel_mult) - 1:
                self.input_blocks.append(TimestepEmbedSequential(Downsample(ch, conv_resample)))
                input_block_chans.append(ch)
                ds *= 2
        self.middle_block = TimestepEmbedSequential(
            ResBlock(ch, time_embed_dim, 0.1, use_scale_shift_norm=use_scale_shift_norm),
            AttentionBlock(ch, num_heads=num_heads),
            ResBlock(ch, time_embed_dim, 0.1, use_scale_shift_norm=use_scale_shift_norm))
        self.output_blocks = nn.ModuleList([])
        for level, mult in list(enumerate(channel_mult))[::-1]:
            for i in range(num_res_blocks + 1):
                ich = input_block_chans.pop()
                layers = [ResBlock(ch + ich, time_embed_dim, 0.1, out_channels=int(model_channels * mult),
                                   use_scale_shift_norm=use_scale_shift_norm)]
                ch = int(model_channels * mult)
                if ds in attention_resolutions:
                    layers.append(AttentionBlock(ch, num_heads=num_heads))
                if level and i == num_res_blocks:
                    layers.append(Upsample(ch))
                    ds //= 2
                self.output_blocks.append(TimestepEmbedSequential(*layers))
        self.out = nn.Sequential(normalization(ch), nn.SiLU(), nn.Conv2d(input_ch, out_channels, 3, padding=1))

    def forward(self, x, timesteps):
        hs = []
        emb = self.time_embed(timestep_embedding(timesteps, self.model_channels))
        h = x
        for module in self.input_blocks:
            h = module(h, emb)
            hs.append(h)
        h = self.middle_block(h, emb)
        for module in self.output_blocks:
            h = torch.cat([h, hs.pop()], dim=1)
            h = module(h, emb)
        return self.out(h)


def _model(seed=0, **kw):
    torch.manual_seed(seed)
    m = UNetModel(**kw).eval()
    with torch.no_grad():       # guided-diffusion zero-initialises the last convs; random weights test them
        for p in m.parameters():
            if p.ndim == 1 and p.abs().max() == 0:
                p.normal_(0, 0.1)
    return m


def _inputs(n=3, seed=0, int_t=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3, 32, 32), dtype=np.float32)
    t = np.array([0, 999, 417, 1, 250, 731][:n], np.int64 if int_t else np.float32)
    return x, t


def _torch(m, x, t):
    with torch.no_grad():
        return m(torch.from_numpy(x), torch.from_numpy(t)).numpy()


def _export(m, x, t, exporter):
    f = io.BytesIO()
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (torch.from_numpy(x), torch.from_numpy(t)), f, dynamo=exporter == "dynamo",
                          input_names=["x", "t"])
    return f.getvalue()


def _ort(blob, x, t):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"]).run(None, {"x": x, "t": t})[0]


@pytest.mark.parametrize("scale_shift", [False, True], ids=["add", "scale_shift"])
def test_from_torch_matches_pytorch(scale_shift):
    m = _model(use_scale_shift_norm=scale_shift)
    x, t = _inputs()
    net = tilefuse.from_torch(m, (torch.from_numpy(x), torch.from_numpy(t)))
    assert [d.name for d in net.inputs] == ["x", "timesteps"]
    want = _torch(m, x, t)
    for threads in (1, 3):
        sess = tilefuse.compile(net, threads=threads)
        assert_close_to_max(sess.run({"x": x, "timesteps": t}), want, what=f"{threads} threads")
    # another batch of timesteps through the same session: the embedding is computed, not folded
    x2, t2 = x[::-1].copy(), np.float32([5.0, 600.0, 998.0])
    assert_close_to_max(sess.run([x2, t2]), _torch(m, x2, t2), what="second call")


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_onnx_exports_match_pytorch_and_onnx_runtime(exporter):
    m = _model(seed=1, use_scale_shift_norm=exporter == "dynamo")
    x, t = _inputs(2, seed=1)
    blob = _export(m, x, t, exporter)
    sess = tilefuse.compile(tilefuse.from_onnx(blob))
    y = sess.run({"x": x, "t": t})
    assert_close_to_max(y, _torch(m, x, t), what="against PyTorch")
    assert_close_to_max(y, _ort(blob, x, t), what="against ONNX Runtime")


def test_the_embedding_at_large_timesteps_is_sin_and_cos_of_the_true_argument():
    """The embedding alone at timesteps up to 1e4 (arguments up to 1e4 radians): within 2e-6 of float64."""
    class Emb(nn.Module):
        def forward(self, t):
            return timestep_embedding(t, 64)

    t = np.float32([0.0, 1.0, 999.0, 4096.0, 9999.0, 10000.0])
    net = tilefuse.from_torch(Emb(), torch.from_numpy(t))
    got = tilefuse.compile(net).run(t)
    # the float32 argument t * freq is rounded first, as PyTorch's float32 rounds it: sin / cos of that in float64
    freqs = torch.exp(-math.log(10000) * torch.arange(start=0, end=32, dtype=torch.float32) / 32)
    args = (torch.from_numpy(t)[:, None] * freqs[None]).numpy().astype(np.float64)
    np.testing.assert_allclose(got, np.concatenate([np.cos(args), np.sin(args)], -1), rtol=0, atol=6e-8)
    np.testing.assert_allclose(got, timestep_embedding(torch.from_numpy(t), 64).numpy(), rtol=0, atol=2e-7)


# ---------------------------------------------------------------- integer timesteps (guided-diffusion passes int64)

def test_integer_timesteps_from_torch():
    """`timesteps` as guided-diffusion's sampler passes them (int64): the input is declared integer, computes as
    float32, and a run takes int64 / int32 arrays (or floats) whose values float32 holds exactly."""
    m = _model(seed=2)
    x, t = _inputs(int_t=True)
    net = tilefuse.from_torch(m, (torch.from_numpy(x), torch.from_numpy(t)))
    assert net.integer_inputs == {"timesteps": np.dtype(np.int64).str}
    assert [d.dtype for d in net.inputs] == [np.float32, np.float32]
    want = _torch(m, x, t)
    sess = tilefuse.compile(net)
    for given in (t, t.astype(np.int32), t.astype(np.uint16), t.astype(np.float32)):
        assert_close_to_max(sess.run({"x": x, "timesteps": given}), want, what=str(given.dtype))
    assert_close_to_max(tilefuse.evaluate(net, [x, t])[0], want, what="reference evaluator")
    with pytest.raises(tilefuse.GraphError, match=r"timesteps: input has the value 16777217; the model takes it as "
                                                  r"int64, which tilefuse computes in float32: expected integers "
                                                  r"within \+-16777216"):
        sess.run({"x": x, "timesteps": np.array([1, 16777217, 3])})
    with pytest.raises(tilefuse.GraphError, match=r"input has dtype bool, expected float32 or an integer dtype"):
        sess.run({"x": x, "timesteps": np.array([True, False, True])})
    with pytest.raises(tilefuse.GraphError, match=r"x: input has dtype int64, expected float32 \(the network"):
        sess.run({"x": x.astype(np.int64), "timesteps": t})


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_integer_timesteps_through_onnx(exporter):
    m = _model(seed=3)
    x, t = _inputs(2, seed=3, int_t=True)
    blob = _export(m, x, t, exporter)
    net = tilefuse.from_onnx(blob)
    assert net.integer_inputs == {"t": np.dtype(np.int64).str}
    y = tilefuse.compile(net).run({"x": x, "t": t})
    assert_close_to_max(y, _torch(m, x, t), what="against PyTorch")
    assert_close_to_max(y, _ort(blob, x, t), what="against ONNX Runtime")


class _PlusOne(nn.Module):
    def forward(self, x, t):
        return x * (t + 1).float()[:, None, None, None]


class _FloorHalf(nn.Module):
    def forward(self, x, t):
        return x * (t // 2).float()[:, None, None, None]


class _TableAtT(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("alphas", torch.linspace(0.9, 0.1, 1000))

    def forward(self, x, t):
        return x * self.alphas[t][:, None, None, None]


class _ReturnsT(nn.Module):
    def forward(self, x, t):
        return x * 2, t[:, None]


class _TimesHalf(nn.Module):
    """t * 0.5 and t / 1000 (a float result: PyTorch converts the integer first) and a comparison with t."""
    def forward(self, x, t):
        s = (t * 0.5 + t / 1000)[:, None, None, None]
        return x * s + torch.where(t > 500, 1.0, -1.0)[:, None, None, None]


def test_integer_arithmetic_is_refused_by_name():
    """Integer arithmetic would be computed in float (t // 2 is not a float division): refused naming the op; ops
    with a float result are imported, and so is a table read at t (the IR's take, tests/test_take.py); t returned
    is returned as int64."""
    x, t = _inputs(int_t=True)
    ex = (torch.from_numpy(x), torch.from_numpy(t))
    with pytest.raises(tilefuse.UnsupportedOpError, match=r"aten.add.Tensor: integer arithmetic on 't' .* convert "
                                                          r"it first \(t.float\(\) \+ 1\)"):
        tilefuse.from_torch(_PlusOne(), ex)
    with pytest.raises(tilefuse.UnsupportedOpError, match=r"integer arithmetic on 't'"):
        tilefuse.from_torch(_FloorHalf(), ex)
    net = tilefuse.from_torch(_ReturnsT(), ex)            # an integer input's values returned: as int64
    y, tt = tilefuse.compile(net).run([x, t])
    assert tt.dtype == np.int64 and np.array_equal(tt, t[:, None])
    with pytest.raises(tilefuse.UnsupportedOpError, match=r"node '/Div' \(Div-14\): Div of the integer tensor 't'"):
        tilefuse.from_onnx(_export(_FloorHalf(), x, t, "torchscript"))
    for m in (_TableAtT(), _TimesHalf()):
        y = tilefuse.compile(tilefuse.from_torch(m, ex)).run([x, t])
        assert_close_to_max(y, _torch(m, x, t), what=type(m).__name__)
        blob = _export(m, x, t, "torchscript")
        assert_close_to_max(tilefuse.compile(tilefuse.from_onnx(blob)).run([x, t]), _ort(blob, x, t), what="ONNX")


def test_a_saved_package_keeps_its_integer_inputs(tmp_path):
    import copy

    from tilefuse.compiler.package import validate_package
    from tilefuse.errors import PackageError
    m = _model(seed=4)
    x, t = _inputs(int_t=True)
    c = tilefuse.compile(tilefuse.from_torch(m, (torch.from_numpy(x), torch.from_numpy(t))))
    c.save(tmp_path / "unet.tfpkg")
    pkg = tilefuse.load_package(tmp_path / "unet.tfpkg")
    assert pkg.meta["integer_inputs"] == {"timesteps": np.dtype(np.int64).str}
    assert_close_to_max(tilefuse.Session(pkg).run([x, t]), _torch(m, x, t), what="loaded package")
    for bad, msg in [({"x": "<f4"}, r"gives input 'x' the dtype '<f4'; expected an integer dtype"),
                     ({"nope": "<i8"}, r"expected \{input name: integer dtype\} naming float inputs"),
                     (["timesteps"], r"meta integer_inputs \['timesteps'\]"),
                     ({"timesteps": "int128"}, r"expected an integer dtype")]:
        p = copy.deepcopy(pkg)
        p.meta["integer_inputs"] = bad
        with pytest.raises(PackageError, match=msg):
            validate_package(p, "hostile")
