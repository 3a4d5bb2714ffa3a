"""The ops of modern CNNs (issue 9): reference kernels against PyTorch, shape inference errors.

Each case builds a one-op Network with the builder (normalization and shape inference run) and
evaluates it with the interpreter; torch computes in float64 on the same values.
  float64  rtol = atol = 1e-10
  float32  rtol = atol = 1e-5   (float32 accumulation over at most a few hundred terms)
Odd shapes on purpose: prime channel counts, non-square maps, batch 3.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tilefuse.errors import GraphError
from tilefuse import Session, compile
from tilefuse.interpreter import evaluate
from tilefuse.ir import Network

TOL = {np.float64: 1e-10, np.float32: 1e-5}


def rnd(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def t64(a):
    return torch.from_numpy(np.array(a, dtype=np.float64))


def run1(build, *arrays, dtype=np.float32):
    net = Network("one_op")
    ins = [net.input(f"x{i}", a.shape, dtype) for i, a in enumerate(arrays)]
    out = build(net, *ins)
    net.output(out)
    net.lint()
    (y,) = evaluate(net, [a.astype(dtype) for a in arrays])
    return y, net


def check(got, want, dtype=np.float32):
    want = want.numpy() if isinstance(want, torch.Tensor) else want
    assert got.dtype == np.dtype(dtype)
    assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=TOL[dtype], atol=TOL[dtype])


# ----------------------------------------------------------------------------- conv_transpose2d

# (N, Ci, H, W, Co, k, stride, padding, output_padding, dilation, groups, bias)
CONVT_CASES = [
    (1, 3, 5, 7, 4, (3, 3), (2, 2), (1, 1), (1, 1), (1, 1), 1, True),     # the UNet upsampler shape
    (2, 6, 4, 5, 9, (2, 2), (2, 2), (0, 0), (0, 0), (1, 1), 3, False),    # groups 3, k = s
    (1, 4, 6, 3, 4, (3, 5), (3, 1), (2, 1), (2, 0), (1, 2), 4, True),     # depthwise, rect, dilation
    (3, 5, 3, 3, 7, (4, 4), (1, 1), (0, 2), (0, 0), (2, 1), 1, True),     # stride 1, big pad
    (1, 2, 7, 6, 3, (1, 1), (2, 3), (0, 0), (1, 2), (1, 1), 1, False),    # 1x1, output_padding only
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CONVT_CASES, ids=lambda c: "x".join(map(str, c[:5])) + f"_g{c[10]}")
def test_conv_transpose2d(case, dtype):
    n, ci, h, w, co, k, s, p, op, d, g, bias = case
    x = rnd((n, ci, h, w), 1, dtype)
    wt = rnd((ci, co // g) + k, 2, dtype)
    b = rnd((co,), 3, dtype) if bias else None
    got, net = run1(lambda net, xi: net.conv_transpose2d(xi, wt, b, s, p, op, d, g), x, dtype=dtype)
    want = F.conv_transpose2d(t64(x), t64(wt), None if b is None else t64(b), s, p, op, g, d)
    check(got, want, dtype)


def test_conv_transpose2d_errors():
    net = Network("e")
    x = net.input("x", (1, 4, 5, 5))
    with pytest.raises(GraphError, match=r"up: weight 'up.weight' has shape \(3, 2, 3, 3\): 3 input channels, "
                                         r"expected 4"):
        net.conv_transpose2d(x, np.zeros((3, 2, 3, 3)), name="up")
    with pytest.raises(GraphError, match=r"output_padding=\(2, 2\) must be smaller than stride"):
        net.conv_transpose2d(x, np.zeros((4, 2, 3, 3)), stride=2, output_padding=2, name="up2")
    with pytest.raises(GraphError, match="gives an empty output"):
        net.conv_transpose2d(x, np.zeros((4, 2, 1, 1)), padding=3, name="up3")


# ----------------------------------------------------------------------------- grouped conv, fused act

@pytest.mark.parametrize("act,fn", [(("clip", {"min": 0.0, "max": 6.0}), F.relu6), ("silu", F.silu),
                                    ("hardswish", F.hardswish), ("gelu", F.gelu)])
def test_conv2d_epilogue_activation(act, fn):
    x, wt, b, r = rnd((2, 6, 9, 7)), rnd((9, 2, 3, 3), 1), rnd((9,), 2), rnd((2, 9, 5, 3), 3)
    net = Network("c")
    xi, ri = net.input("x", x.shape), net.input("r", r.shape)
    y = net.add_op("conv2d", [xi, net.constant("w", wt), net.constant("b", b), ri],
                   dict(stride=2, padding=(1, 2, 0, 1), groups=3, has_bias=True, has_residual=True, act=act))
    net.output(y)
    got = evaluate(net, [x, r])[0]
    want = fn(F.conv2d(F.pad(t64(x), (0, 1, 1, 2)), t64(wt), t64(b), 2, 0, 1, 3) + t64(r))
    check(got, want)
    assert net.ops[0].params["act"][0] in ("clip", "silu", "hardswish", "gelu")
    assert net.ops[0].params["relu"] is False


def test_conv2d_input_scale_is_a_per_image_channel_scale():
    x, s, wt = rnd((3, 5, 6, 7)), rnd((3, 5, 1, 1), 1), rnd((4, 5, 1, 1), 2)
    net = Network("se")
    xi, si = net.input("x", x.shape), net.input("s", s.shape)
    net.output(net.add_op("conv2d", [xi, net.constant("w", wt), si], dict(has_input_scale=True)))
    check(evaluate(net, [x, s])[0], F.conv2d(t64(x) * t64(s), t64(wt)))


def test_epilogue_relu_and_act_conflict():
    net = Network("c")
    x = net.input("x", (1, 3, 4, 4))
    with pytest.raises(GraphError, match="relu=True with act='silu'; expected one activation"):
        net.add_op("conv2d", [x, net.constant("w", np.zeros((3, 3, 1, 1)))], dict(relu=True, act="silu"))
    with pytest.raises(GraphError, match="unknown activation 'swish2'"):
        net.add_op("activation", [x], dict(act="swish2"))
    with pytest.raises(GraphError, match=r"activation clip parameter|clip min 6.0 > max 0.0"):
        net.activation(x, "clip", min=6.0, max=0.0)


# ----------------------------------------------------------------------------- activations, prelu

ACTS = [("sigmoid", {}, torch.sigmoid), ("silu", {}, F.silu), ("hardswish", {}, F.hardswish),
        ("hardsigmoid", {}, F.hardsigmoid), ("clip", {"min": -1.0, "max": 1.0}, F.hardtanh),
        ("gelu_tanh", {}, lambda t: F.gelu(t, approximate="tanh")), ("elu", {"alpha": 0.7},
                                                                     lambda t: F.elu(t, 0.7)),
        ("leaky_relu", {"negative_slope": 0.1}, lambda t: F.leaky_relu(t, 0.1)), ("tanh", {}, torch.tanh)]


@pytest.mark.parametrize("name,params,fn", ACTS, ids=[a[0] for a in ACTS])
def test_activation_op(name, params, fn):
    x = rnd((3, 5, 4, 7)) * 4
    got, net = run1(lambda net, xi: net.activation(xi, name, **params), x)
    check(got, fn(t64(x)))
    assert net.ops[0].op == "activation"


def test_builder_relu_activation_is_the_relu_op():
    _, net = run1(lambda net, xi: net.activation(xi, "relu"), rnd((1, 2, 3, 3)))
    assert net.ops[0].op == "relu"


@pytest.mark.parametrize("shape,slope", [((3, 5, 4, 6), 5), ((2, 7), 7), ((2, 3, 4, 4), 1)])
def test_prelu(shape, slope):
    x, s = rnd(shape), np.abs(rnd((slope,), 1))
    got, _ = run1(lambda net, xi: net.prelu(xi, s), x)
    check(got, F.prelu(t64(x), t64(s)))
    net = Network("p")
    xi = net.input("x", shape)
    with pytest.raises(GraphError, match=r"slope 'p.weight' has shape \(4,\), expected"):
        net.prelu(xi, np.ones(4), name="p")


# ----------------------------------------------------------------------------- broadcasting binary ops

# rank 5: (C, 1, 1) broadcasts over axes 2-4, not over the channels, even where axes 1 and 2 have one size (the
# per-channel fast path took it as channels: ONNX PRelu of a rank-5 input, tests/onnx_mutants.py seed 2067734)
BIN = [((3, 5, 4, 6), (3, 5, 1, 1)), ((3, 5, 4, 6), (5, 1, 1)), ((1, 5, 4, 1), (3, 1, 1, 6)),
       ((2, 3, 4), (4,)), ((2, 3, 4, 4), (2, 3, 4, 4)), ((1, 8, 8, 5, 3), (8, 1, 1)), ((2, 4, 4, 3, 2), (1, 4, 1, 1))]


@pytest.mark.parametrize("kind,fn", [("add", torch.add), ("sub", torch.sub), ("mul", torch.mul),
                                     ("div", torch.div)])
@pytest.mark.parametrize("sa,sb", BIN)
def test_binary_broadcast(kind, fn, sa, sb):
    a, b = rnd(sa), rnd(sb, 1)
    if kind == "div":
        b = np.sign(b) * (np.abs(b) + 0.5)
    for order in ((0, 1), (1, 0)):                                        # broadcasting either side
        got, net = run1(lambda net, *xs: net.add_op(kind, [xs[i] for i in order]), a, b)
        want = fn(*(t64((a, b)[i]) for i in order))
        check(got, want)
        check(Session(compile(net)).run([a, b]), want)                   # the compiled kernels too


def test_binary_with_constants_and_errors():
    x = rnd((2, 3, 4, 5))
    got, net = run1(lambda net, xi: net.div(net.sub(net.mul(xi, 3.0), 1.5), 2.0), x)
    check(got, (t64(x) * 3 - 1.5) / 2)
    assert [d.shape for d in net.constants()] == [(1,), (1,), (1,)]
    net = Network("e")
    a, b = net.input("a", (2, 3, 4, 5)), net.input("b", (2, 4, 1, 1))
    with pytest.raises(GraphError, match=r"m: mul operands have shapes \(2, 3, 4, 5\) \('a'\) and \(2, 4, 1, 1\) "
                                         r"\('b'\); expected shapes that broadcast"):
        net.mul(a, b, name="m")


# ----------------------------------------------------------------------------- reductions

@pytest.mark.parametrize("kind", ["mean", "sum"])
@pytest.mark.parametrize("axes,keepdim", [((2, 3), True), ((2, 3), False), ((1,), True), ((-1, 0), False),
                                          ((1, 2, 3), True)])
def test_reductions(kind, axes, keepdim):
    x = rnd((3, 5, 4, 7))
    got, _ = run1(lambda net, xi: getattr(net, kind)(xi, axes, keepdim), x)
    want = getattr(torch, kind)(t64(x), dim=axes, keepdim=keepdim)
    check(got, want)


def test_reduction_errors():
    net = Network("e")
    x = net.input("x", (2, 3, 4, 5))
    with pytest.raises(GraphError, match="m: axis 4 is out of range for rank 4"):
        net.mean(x, (4,), name="m")
    with pytest.raises(GraphError, match=r"axes \(1, -3\) repeat an axis"):
        net.mean(x, (1, -3))


# ----------------------------------------------------------------------------- movement

def test_reshape_permute_channel_shuffle():
    """ShuffleNet's channel shuffle: view(n, g, c/g, h, w) -> transpose(1, 2) -> view(n, c, h, w)."""
    x = rnd((2, 12, 5, 3))

    def build(net, xi):
        y = net.reshape(xi, (2, 3, 4, 5, 3))
        y = net.permute(y, (0, 2, 1, 3, 4))
        return net.reshape(y, (2, -1, 5, 3))

    got, net = run1(build, x)
    t = t64(x).view(2, 3, 4, 5, 3).transpose(1, 2).contiguous().view(2, -1, 5, 3)
    check(got, t)
    assert net.ops[-1].outputs[0].shape == (2, 12, 5, 3)
    n2 = Network("e")
    xi = n2.input("x", (2, 12, 5, 3))
    with pytest.raises(GraphError, match=r"r: cannot reshape \(2, 12, 5, 3\) \(360 elements\) to \(7, -1\)"):
        n2.reshape(xi, (7, -1), name="r")
    with pytest.raises(GraphError, match=r"perm=\(0, 2, 1\) has 3 axes, input 'x' has shape"):
        n2.permute(xi, (0, 2, 1))
    with pytest.raises(GraphError, match="must be a permutation"):
        n2.permute(xi, (0, 0, 1, 2))


@pytest.mark.parametrize("axis,start,stop,step", [(1, 0, 4, 1), (1, 4, None, 1), (2, 1, None, 2),
                                                  (3, -3, -1, 1), (-1, 0, 100, 3), (0, 1, 2, 1)])
def test_slice(axis, start, stop, step):
    x = rnd((3, 7, 6, 5))
    got, _ = run1(lambda net, xi: net.slice(xi, axis, start, stop, step), x)
    idx = [slice(None)] * 4
    idx[axis] = slice(start, stop, step)
    check(got, t64(x)[tuple(idx)])


def test_split_and_empty_slice():
    x = rnd((2, 10, 3, 3))
    net = Network("s")
    xi = net.input("x", x.shape)
    parts = net.split(xi, (3, 7), axis=1, name="sp")
    net.output(*parts)
    got = evaluate(net, x)
    for g, w in zip(got, torch.split(t64(x), [3, 7], 1)):
        check(g, w)
    assert [o.name for o in net.ops] == ["sp.0", "sp.1"]
    with pytest.raises(GraphError, match=r"slice 5:5:1 of axis 1 \(size 10\) of 'x' is empty"):
        net.slice(xi, 1, 5, 5)
    with pytest.raises(GraphError, match=r"split sizes \(3, 3\) sum to 6; expected 10"):
        net.split(xi, (3, 3))


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate"])
@pytest.mark.parametrize("tpad", [(1, 2, 0, 3), (0, 0, 2, 0), (3, 1, 1, 2)])
def test_pad(mode, tpad):
    x = rnd((2, 3, 5, 6))
    l, r, t, b = tpad                 # torch F.pad order: (left, right, top, bottom)
    got, _ = run1(lambda net, xi: net.pad(xi, (0, 0, 0, 0, t, b, l, r), mode, 0.5), x)
    want = F.pad(t64(x), tpad, mode=mode, **({"value": 0.5} if mode == "constant" else {}))
    check(got, want)


def test_pad_errors():
    net = Network("e")
    x = net.input("x", (1, 2, 3, 3))
    with pytest.raises(GraphError, match=r"p: reflect padding \(3, 0\) of axis 2 needs a larger input: size 3"):
        net.pad(x, (0, 0, 0, 0, 3, 0, 0, 0), "reflect", name="p")
    with pytest.raises(GraphError, match="has 4 values for input shape"):
        net.pad(x, (1, 1, 1, 1))
    with pytest.raises(GraphError, match="pad mode 'mirror' is not supported"):
        net.pad(x, (0,) * 8, "mirror")


# ----------------------------------------------------------------------------- resize

RESIZE = [  # (input HxW, kwargs for both)
    ((5, 7), dict(scale_factor=2, mode="nearest")),
    ((5, 7), dict(size=(9, 4), mode="nearest")),
    ((6, 5), dict(size=(13, 11), mode="nearest")),
    ((7, 9), dict(scale_factor=1.7, mode="nearest")),
    ((7, 9), dict(scale_factor=0.6, mode="nearest")),
    ((5, 7), dict(size=(11, 3), mode="nearest-exact")),
    ((5, 7), dict(scale_factor=2, mode="bilinear", align_corners=False)),
    ((5, 7), dict(scale_factor=2, mode="bilinear", align_corners=True)),
    ((8, 6), dict(size=(5, 13), mode="bilinear", align_corners=False)),
    ((8, 6), dict(size=(5, 13), mode="bilinear", align_corners=True)),
    ((7, 9), dict(scale_factor=1.7, mode="bilinear", align_corners=False)),
    ((4, 5), dict(size=(1, 1), mode="bilinear", align_corners=False)),
    ((4, 5), dict(size=(1, 2), mode="bilinear", align_corners=True)),
    ((33, 17), dict(scale_factor=(0.25, 3), mode="bilinear", align_corners=False)),
]


@pytest.mark.parametrize("hw,kw", RESIZE, ids=[f"{h}x{w}_{k}" for (h, w), k in RESIZE])
def test_resize_matches_interpolate(hw, kw):
    x = rnd((2, 3) + hw)
    got, _ = run1(lambda net, xi: net.resize(xi, **kw), x)
    want = F.interpolate(torch.from_numpy(x), **kw)       # float32 in torch too: same index rule
    assert got.shape == tuple(want.shape)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)
    if kw["mode"].startswith("nearest"):
        np.testing.assert_array_equal(got, want.numpy())  # a gather: exact


def test_resize_errors():
    net = Network("e")
    x = net.input("x", (1, 2, 3, 3))
    with pytest.raises(GraphError, match="exactly one of size and scale_factor"):
        net.resize(x)
    with pytest.raises(GraphError, match="interpolation mode 'area' is not supported"):
        net.resize(x, size=4, mode="area")
    with pytest.raises(GraphError, match="coordinate mode 'tf_crop_and_resize' is not supported"):
        net.add_op("resize", [x], dict(size=(4, 4), coord="tf_crop_and_resize"))


# ----------------------------------------------------------------------------- norms, adaptive pooling

def test_layer_norm_and_channel_norm():
    x = rnd((2, 7, 5, 3)) * 3 + 1
    g, b = rnd((7,), 1), rnd((7,), 2)
    got, _ = run1(lambda net, xi: net.channel_norm(xi, g, b, eps=1e-6), x)
    want = F.layer_norm(t64(x).permute(0, 2, 3, 1), (7,), t64(g), t64(b), 1e-6).permute(0, 3, 1, 2)
    check(got, want)
    g2, b2 = rnd((5, 3), 3), rnd((5, 3), 4)
    got, _ = run1(lambda net, xi: net.layer_norm(xi, g2, b2, axis=2), x)
    check(got, F.layer_norm(t64(x), (5, 3), t64(g2), t64(b2)))
    net = Network("e")
    xi = net.input("x", x.shape)
    with pytest.raises(GraphError, match=r"ln: gamma 'ln.weight' has shape \(7,\), expected \(3,\)"):
        net.layer_norm(xi, g, b, name="ln")


@pytest.mark.parametrize("hw,out", [((7, 7), (3, 3)), ((10, 13), (4, 5)), ((5, 6), (7, 9)), ((9, 9), (1, 4)),
                                    ((6, 4), (6, 4))])
def test_adaptive_avg_pool_any_size(hw, out):
    x = rnd((2, 3) + hw)
    got, _ = run1(lambda net, xi: net.adaptive_avg_pool(xi, out), x)
    check(got, F.adaptive_avg_pool2d(t64(x), out))


def test_linear_channels_last():
    x, w, b = rnd((2, 3, 4, 6)), rnd((5, 6), 1), rnd((5,), 2)
    got, _ = run1(lambda net, xi: net.linear(xi, w, b), x)
    check(got, F.linear(t64(x), t64(w), t64(b)))


def test_flops_of_new_ops():
    from tilefuse.ir.ops import flops
    net = Network("f")
    x = net.input("x", (1, 4, 8, 8))
    y = net.conv_transpose2d(x, np.zeros((4, 3, 2, 2)), stride=2)
    net.output(net.silu(y))
    assert flops(net.ops[0]) == 2 * (4 * 8 * 8) * (3 * 2 * 2)    # every input pixel x every tap
    assert flops(net.ops[1]) == 5 * 3 * 16 * 16


@pytest.mark.parametrize("keepdim", [True, False])
def test_mean_over_hw_compiles_to_the_blocked_pool(keepdim):
    """x.mean((2, 3)) (ShuffleNetV2, MNASNet) and x.mean((2, 3), keepdim=True): canonicalized to
    global_avg_pool (+ flatten without keepdim), which reads the conv's NCHW16c output without a
    conversion; the result is the mean's."""
    import tilefuse
    x = rnd((2, 24, 9, 7))
    w = rnd((40, 24, 1, 1), seed=1)
    net = Network("m")
    xi = net.input("x", x.shape)
    net.output(net.mean(net.conv2d(xi, w), (3, 2), keepdim))
    compiled = tilefuse.compile(net, threads=2)
    ops = [o.op for o in compiled.network.ops]
    assert "mean" not in ops and "global_avg_pool" in ops and ("flatten" in ops) != keepdim
    assert "from_nchwc" not in [i.kernel for i in compiled.package.program()][:-1]
    got = compiled.run(x)
    want = torch.mean(F.conv2d(t64(x), t64(w)), dim=(2, 3), keepdim=keepdim)
    check(got, want)
