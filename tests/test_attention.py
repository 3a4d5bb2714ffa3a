"""Matrix products of computed tensors (IR op `matmul`): the attention blocks CNNs carry.

The kernel (kernels/dense.py `matmul`: one OpenBLAS GEMM per batch item on the thread pool) against the
reference (np.matmul) and PyTorch: 2-D, batched, broadcast batch axes, a transposed view as an operand, bitwise
the same for 1, 2, 3 and 5 threads. Model code as written: the non-local block (Wang et al. 2018, embedded
Gaussian: `torch.matmul(theta_x, phi_x)`, softmax, `.permute(0, 2, 1).contiguous().view(...)`), timm-style
multi-head self-attention over a feature map's positions (`qkv.reshape(B, N, 3, h, d).permute(2, 0, 3, 1, 4)`,
`unbind`, `q @ k.transpose(-2, -1) * scale`), and an einsum attention (`torch.einsum("bcn,bcm->bnm")`); from
PyTorch, from both exporters' files (against ONNX Runtime too), through save / load_package, and with
schedule="stream" (the convs before the attention stream, the rest runs in the tail)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx_export import EXPORTERS, assert_close_to_max, check_export, check_from_torch, torch_run

import tilefuse
from tilefuse.errors import GraphError, UnsupportedOpError
from tilefuse.kernels import dense
from tilefuse.kernels import reference as ref

RNG = np.random.default_rng(5)


@pytest.mark.parametrize("sa,sb", [((7, 5), (5, 3)), ((3, 4, 5), (3, 5, 2)), ((2, 1, 4, 5), (3, 5, 6)),
                                   ((4, 6), (2, 3, 6, 1)), ((2, 3, 17, 33), (2, 3, 33, 9)),
                                   ((1, 300, 20), (20, 7))])      # 300 rows: three row-block tasks
def test_kernel_matches_reference_and_torch(sa, sb):
    a = RNG.standard_normal(sa).astype(np.float32)
    b = RNG.standard_normal(sb).astype(np.float32)
    want = torch.matmul(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    r = ref.matmul(a, b)
    outs = []
    for th in (1, 2, 3, 5):
        o = np.full(want.shape, np.nan, np.float32)
        dense.matmul(o, a, b, threads=th)
        outs.append(o)
    for got in (r, outs[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


@pytest.mark.parametrize("shape", [(3, 37), (2, 5, 100), (1, 130, 16)])
@pytest.mark.parametrize("scale", [1.0, 0.125, -0.7])
def test_softmax_kernel_with_a_folded_scale(shape, scale):
    """dense.softmax over the last axis of x * scale (16-lane max and sum, vectorized exp) against PyTorch; a NaN
    row is NaN, a row with +inf as PyTorch's; bitwise the same for 1, 2 and 3 threads (tasks of rows)."""
    x = (RNG.standard_normal(shape) * 4).astype(np.float32)
    x.reshape(-1, shape[-1])[0, 3] = np.nan
    if x.reshape(-1, shape[-1]).shape[0] > 1:
        x.reshape(-1, shape[-1])[1, 5] = np.inf
    want = torch.softmax(torch.from_numpy(x) * scale, dim=-1).numpy()
    outs = []
    for th in (1, 2, 3):
        o = np.empty_like(x)
        dense.softmax(o, x, axis=len(shape) - 1, scale=scale, threads=th)
        outs.append(o)
    for got in (outs[0], ref.softmax(x, len(shape) - 1, scale)):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], rtol=2e-6, atol=1e-7)
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


@pytest.mark.parametrize("scale", [0.7, -3.0, 1.0])
def test_softmax_of_huge_equal_values_is_uniform(scale):
    """A row of equal values near 1e30 times a scale: uniform, as PyTorch's. Computed as x * s - max(x * s), LLVM
    contracted the two into one multiply-add of the exact product, ~1e23 off the rounded max: every e^ 0 and a
    zero sum (ZeroDivisionError in the worker)."""
    x = np.full((3, 40), 1e30, np.float32)
    x[1] = -2e30
    x[2, :20] = 3e30
    o = np.empty_like(x)
    dense.softmax(o, x, axis=1, scale=scale, threads=1)
    want = torch.softmax(torch.from_numpy(x) * scale, dim=-1).numpy()
    np.testing.assert_allclose(o, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(o[0], 1 / 40, rtol=1e-6)


def test_the_attention_scale_folds_into_the_softmax():
    torch.manual_seed(0)
    m = MODELS["sdpa"]().eval()
    x = _x(3, (1, 3, 9, 8))
    cp = tilefuse.compile(tilefuse.from_torch(m, torch.from_numpy(x)))
    sms = [o for o in cp.network.ops if o.op == "softmax"]
    assert [round(o.params["scale"], 6) for o in sms] == [round(8 ** -0.5, 6), 0.3]
    assert "mul" not in {o.op for o in cp.network.ops}
    assert_close_to_max(cp.run(x), torch_run(m, x))


def test_a_transposed_view_operand_is_read_as_it_is():
    """k.transpose(-2, -1) as a view (the last axis not contiguous): the same product as the contiguous copy's."""
    a = RNG.standard_normal((2, 6, 8)).astype(np.float32)
    k = RNG.standard_normal((2, 5, 8)).astype(np.float32)
    o1, o2 = np.empty((2, 6, 5), np.float32), np.empty((2, 6, 5), np.float32)
    dense.matmul(o1, a, k.transpose(0, 2, 1), threads=2)
    dense.matmul(o2, a, np.ascontiguousarray(k.transpose(0, 2, 1)), threads=2)
    np.testing.assert_allclose(o1, o2, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(o1, a @ k.transpose(0, 2, 1), rtol=1e-5, atol=1e-5)


def test_shapes_that_do_not_multiply_are_named():
    net = tilefuse.Network("bad")
    a = net.input("a", (2, 4, 5))
    with pytest.raises(GraphError, match=r"q.*\(2, 4, 5\).*\(2, 4, 3\) do not multiply: 5 columns against 4 rows"):
        net.matmul(a, net.input("b", (2, 4, 3)), name="q")
    with pytest.raises(GraphError, match=r"batch axes .*\(2, 4, 5\).*\(3, 5, 3\) do not broadcast"):
        net.matmul(a, net.input("c", (3, 5, 3)), name="r")
    with pytest.raises(GraphError, match=r"s: the product of two vectors \(3,\) and \(3,\) is a scalar"):
        net.matmul(net.input("d", (3,)), net.input("e", (3,)), name="s")
    v = net.matmul(a, net.input("f", (5,)), name="t")                           # np.matmul's column: (2, 4)
    assert v.shape == (2, 4)


@pytest.mark.parametrize("eq,sa,sb", [("bcn,bcm->bnm", (2, 3, 4), (2, 3, 5)),
                                      ("bhqd,bhkd->bhqk", (2, 2, 3, 4), (2, 2, 5, 4)), ("ij,jk", (3, 4), (4, 5)),
                                      ("bik,kj->bji", (2, 3, 4), (4, 6)),
                                      ("nchw,nc->nhw", (2, 3, 4, 5), (2, 3)), ("ijk,jl->il", (3, 4, 5), (4, 2))])
def test_einsum_against_numpy(eq, sa, sb):
    """Network.einsum (ONNX Einsum's import): batch, contracted, own and summed-out labels, the implicit output."""
    a = RNG.standard_normal(sa).astype(np.float32)
    b = RNG.standard_normal(sb).astype(np.float32)
    net = tilefuse.Network("e")
    net.output(net.einsum(eq, net.input("a", sa), net.input("b", sb), name="e"))
    got = tilefuse.compile(net).run({"a": a, "b": b})
    np.testing.assert_allclose(got, np.einsum(eq, a.astype(np.float64), b), rtol=1e-5, atol=1e-5)


def test_einsum_refusals_are_named():
    net = tilefuse.Network("e")
    a, b = net.input("a", (3, 3)), net.input("b", (3, 4))
    for eq, msg in [("ii,ij->j", "none repeated"), ("...i,ij->...j", "no ellipsis"), ("ij,jk->", "scalar"),
                    ("ij,kj->ik", "label 'j' is 3 and 4 long"), ("ij,jk->iz", "output labels 'iz'")]:
        with pytest.raises(GraphError, match=msg):
            net.einsum(eq, a, b)


class NonLocal(nn.Module):
    """The non-local block, embedded Gaussian (Wang et al. 2018; the reference implementation's forward)."""

    def __init__(self, c, ci):
        super().__init__()
        self.ci = ci
        self.g, self.theta, self.phi = nn.Conv2d(c, ci, 1), nn.Conv2d(c, ci, 1), nn.Conv2d(c, ci, 1)
        self.W = nn.Sequential(nn.Conv2d(ci, c, 1), nn.BatchNorm2d(c))
        nn.init.normal_(self.W[1].weight, 1.0, 0.2)

    def forward(self, x):
        batch_size = x.size(0)
        g_x = self.g(x).view(batch_size, self.ci, -1).permute(0, 2, 1)
        theta_x = self.theta(x).view(batch_size, self.ci, -1).permute(0, 2, 1)
        phi_x = self.phi(x).view(batch_size, self.ci, -1)
        f = torch.matmul(theta_x, phi_x)
        f_div_c = F.softmax(f, dim=-1)
        y = torch.matmul(f_div_c, g_x)
        y = y.permute(0, 2, 1).contiguous()
        y = y.view(batch_size, self.ci, *x.size()[2:])
        return self.W(y) + x


class MHSA(nn.Module):
    """timm-style multi-head self-attention over the positions of a feature map (MobileViT / BoTNet blocks)."""

    def __init__(self, c, heads=2):
        super().__init__()
        self.heads, self.scale = heads, (c // heads) ** -0.5
        self.norm, self.qkv, self.proj = nn.LayerNorm(c), nn.Linear(c, 3 * c), nn.Linear(c, c)

    def forward(self, x):
        B, C, H, W = x.shape
        t = x.flatten(2).transpose(1, 2)                                           # (B, N, C)
        qkv = self.qkv(self.norm(t)).reshape(B, H * W, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)                                                    # (B, h, N, d) each
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = attn.softmax(dim=-1)
        o = (attn @ v).transpose(1, 2).reshape(B, H * W, C)
        return x + self.proj(o).transpose(1, 2).reshape(B, C, H, W)


class SDPAttention(nn.Module):
    """Attention through F.scaled_dot_product_attention (timm's fused_attn path, MobileViT's transformer)."""

    def __init__(self, c, heads=2, scale=None):
        super().__init__()
        self.heads, self.s = heads, scale
        self.qkv, self.proj = nn.Conv2d(c, 3 * c, 1), nn.Conv2d(c, c, 1)

    def forward(self, x):
        B, C, H, W = x.shape
        q, k, v = self.qkv(x).reshape(B, 3, self.heads, C // self.heads, H * W).transpose(-2, -1).unbind(1)
        o = F.scaled_dot_product_attention(q, k, v, scale=self.s)                # (B, h, N, d)
        return x + self.proj(o.transpose(-2, -1).reshape(B, C, H, W))


class EinsumAttention(nn.Module):
    """Position attention written with einsum (DANet's PAM in einsum form)."""

    def __init__(self, c):
        super().__init__()
        self.q, self.k, self.v = nn.Conv2d(c, c // 2, 1), nn.Conv2d(c, c // 2, 1), nn.Conv2d(c, c, 1)
        self.gamma = nn.Parameter(torch.tensor(0.7))

    def forward(self, x):
        b, c, h, w = x.shape
        q, k, v = self.q(x).flatten(2), self.k(x).flatten(2), self.v(x).flatten(2)
        attn = torch.softmax(torch.einsum("bcn,bcm->bnm", q, k), dim=-1)
        out = torch.einsum("bcm,bnm->bcn", v, attn).reshape(b, c, h, w)
        return self.gamma * out + x


MODELS = {
    "non_local": lambda: nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), NonLocal(16, 8),
                                       nn.Conv2d(16, 6, 3, stride=2)),
    "mhsa": lambda: nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.SiLU(), MHSA(16),
                                  nn.Conv2d(16, 5, 1)),
    "einsum_pam": lambda: nn.Sequential(nn.Conv2d(3, 12, 3, padding=1), EinsumAttention(12), nn.Conv2d(12, 4, 1)),
    "sdpa": lambda: nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.GELU(), SDPAttention(16),
                                  SDPAttention(16, 4, scale=0.3), nn.Conv2d(16, 4, 1)),
}


def _x(seed=0, shape=(2, 3, 10, 7)):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_from_torch_matches_pytorch(name):
    check_from_torch(MODELS[name], _x())


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_onnx_exports_match_pytorch_and_onnxruntime(name, exporter):
    check_export(MODELS[name], _x(1), exporter)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_package_round_trip_and_stream_schedule(name, tmp_path):
    """The compiled program with its matmuls saved and loaded, and streamed (the attention in the tail)."""
    torch.manual_seed(4)
    m = MODELS[name]().eval()
    x = _x(2, (1, 3, 24, 10))
    net = tilefuse.from_torch(m, torch.from_numpy(x))
    cp = tilefuse.compile(net)
    assert [o.op for o in cp.network.ops].count("matmul") == (4 if name == "sdpa" else 2)
    path = cp.save(tmp_path / f"{name}.tfpkg")
    want = torch_run(m, x)
    assert_close_to_max(tilefuse.Session(tilefuse.load_package(path)).run(x), want)
    st = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": 4})
    assert st.schedule.ends, "the attention cannot stream: the plan says where the streamed part ends"
    assert_close_to_max(st.run(x), want)


class MaskedSDPA(nn.Module):
    """F.scaled_dot_product_attention over a feature map's pixels with each kind of mask model code passes: a float
    bias (timm's fused Swin: relative position bias + shift mask), a constant bool mask with a fully masked row,
    is_causal, a computed bool mask (valid pixels), and a computed float mask with -inf rows."""

    def __init__(self, kind, c=8, n=12):
        super().__init__()
        self.kind = kind
        self.qkv = nn.Conv2d(c, 3 * c, 1)
        g = torch.Generator().manual_seed(3)
        self.register_buffer("bias", torch.randn(2, n, n, generator=g))
        keep = torch.rand(n, n, generator=g) > 0.3
        keep[3] = False
        self.register_buffer("keep", keep)

    def forward(self, x):
        b, c, h, w = x.shape
        q, k, v = self.qkv(x).flatten(2).transpose(1, 2).reshape(b, h * w, 3, 2, c // 2).permute(2, 0, 3, 1, 4)
        if self.kind == "float_bias":
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias)
        elif self.kind == "bool_constant":
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=self.keep)
        elif self.kind == "causal":
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif self.kind == "bool_computed":
            valid = (q.sum(-1, keepdim=True) > 0) | (k.sum(-1)[:, :, None, :] > 0.5)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=valid)
        else:                                                    # float, computed, whole rows of -inf
            drop = torch.where(q[..., :1] > 0.3, float("-inf"), 0.0)          # (B, h, N, 1): rows
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=drop + self.bias)
        return x + o.transpose(1, 2).reshape(b, h * w, c).transpose(1, 2).reshape(b, c, h, w)


MASKS = ["float_bias", "bool_constant", "causal", "bool_computed", "float_inf_rows"]


@pytest.mark.parametrize("kind", MASKS)
def test_masked_and_causal_attention_match_pytorch(kind):
    """Fully masked rows are 0, as PyTorch's safe softmax makes them (not 0 / 0)."""
    torch.manual_seed(5)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), MaskedSDPA(kind)).eval()
    x = _x(3, (2, 3, 3, 4))
    want = torch_run(m, x)
    assert np.isfinite(want).all()
    net = tilefuse.from_torch(m, torch.from_numpy(x))
    for t in (1, 3):
        assert_close_to_max(tilefuse.compile(net, threads=t).run(x), want)


def test_attention_dropout_and_gqa_are_refused_by_name():
    class Dropped(nn.Module):
        def forward(self, x):
            t = x.flatten(2).transpose(1, 2)
            return F.scaled_dot_product_attention(t, t, t, dropout_p=0.1)

    with pytest.raises(UnsupportedOpError, match=r"scaled_dot_product_attention with dropout_p=0.1.*no dropout"):
        tilefuse.from_torch(Dropped(), torch.from_numpy(_x()))


def test_trainer_asks_what_a_matmul_constant_is():
    """matmul trains (tests/test_training_modern.py); a hand-built network's constant operand is refused until the
    network says whether it is a parameter, then trained or kept as said."""
    from tilefuse.training import SGD, Trainer

    def build():
        net = tilefuse.Network("t")
        x = net.input("x", (2, 3, 4, 4))
        y = net.flatten(net.global_avg_pool(net.conv2d(x, RNG.standard_normal((4, 3, 3, 3)) * 0.2, None, padding=1,
                                                       name="c")), 1)
        net.output(net.matmul(y, net.constant("m", np.ones((4, 3), np.float32)), name="gram"))  # (2, 4) @ (4, 3)
        return net
    with pytest.raises(UnsupportedOpError, match="gram: constant operand 'm' .* may be a trainable parameter"):
        Trainer(build(), SGD(lr=0.1))
    net = build()
    net.constant_origin["m"] = "parameter"
    _, grads = Trainer(net, SGD(lr=0.1)).forward_backward(_x()[:2, :3, :4, :4].copy(), [0, 2])
    assert grads["m"].shape == (4, 3) and np.abs(grads["m"]).max() > 0
