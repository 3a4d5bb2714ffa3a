"""The reference kernels (the executable spec) op by op against torch.nn.functional.

Every case builds a one-op Network with the builder (so parameter normalization and shape
inference run too) and evaluates it with the interpreter. The torch result is computed in
float64 on exactly the same input values, so the error measured is tilefuse's alone:

  float64  rtol = atol = 1e-10   (float64 accumulation; only summation order differs)
  float32  rtol = atol = 1e-5    (float32 accumulation over at most a few hundred terms)
  float16  rtol = atol = 2e-3    (float32 accumulation, then one rounding to half: 4.9e-4 rel)

Inputs are O(1) (standard normal), so atol and rtol are on the same scale.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tilefuse.errors import GraphError
from tilefuse.interpreter import evaluate
from tilefuse.ir import DataNode, Network

TOL = {np.float64: 1e-10, np.float32: 1e-5, np.float16: 2e-3}
DTYPES = [np.float32, np.float64, np.float16]


def rand(rng, shape, dtype, lo=None, hi=None):
    a = rng.uniform(lo, hi, shape) if lo is not None else rng.standard_normal(shape)
    return a.astype(dtype)


def t64(a) -> torch.Tensor:
    return torch.from_numpy(np.array(a, dtype=np.float64))  # a writable copy


def check(got: np.ndarray, want: torch.Tensor, dtype):
    assert got.dtype == np.dtype(dtype), f"output dtype {got.dtype}, expected {np.dtype(dtype)}"
    want = want.numpy()
    assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
    tol = TOL[dtype]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


def run1(build, *arrays, dtype=np.float32):
    """Build net with inputs x0, x1, ... of the arrays' shapes; `build(net, *inputs)` -> output."""
    net = Network("one_op")
    ins = [net.input(f"x{i}", a.shape, dtype) for i, a in enumerate(arrays)]
    net.output(build(net, *ins))
    net.lint()
    (y,) = evaluate(net, list(arrays))
    return y


# ----------------------------------------------------------------------------- conv2d

# (N, C, H, W, O, kernel, stride, padding (t, b, l, r), dilation, groups, bias)
CONV_CASES = [
    (1, 3, 17, 19, 5, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, True),
    (3, 6, 15, 13, 10, (3, 5), (2, 1), (0, 2, 1, 3), (1, 1), 2, False),    # asymmetric, groups 2
    (1, 8, 16, 16, 8, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 8, True),      # depthwise, dilation 2
    (1, 5, 12, 12, 10, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 5, False),    # depthwise x2 multiplier
    (2, 12, 20, 21, 18, (5, 5), (3, 3), (2, 1, 0, 2), (2, 1), 3, True),    # stride 3, mixed dilation
    (1, 7, 9, 9, 13, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1, True),       # 1x1 stride 2
    (1, 3, 35, 35, 4, (11, 11), (4, 4), (2, 2, 2, 2), (1, 1), 1, True),    # AlexNet conv1 shape
    (3, 17, 7, 5, 33, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, False),     # odd channels, batch 3
    (1, 4, 6, 6, 6, (4, 2), (1, 3), (3, 0, 0, 1), (1, 2), 2, True),        # even kernel
]


def torch_conv(x, w, b, stride, padding, dilation, groups):
    t, bt, l, r = padding
    xp = F.pad(t64(x), (l, r, t, bt))   # F.pad takes (left, right, top, bottom)
    return F.conv2d(xp, t64(w), None if b is None else t64(b), stride, 0, dilation, groups)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: "x".join(map(str, c[:5])) + f"_g{c[9]}")
def test_conv2d(case, dtype):
    n, c, h, w, o, k, s, p, d, g, has_bias = case
    rng = np.random.default_rng(0)
    x = rand(rng, (n, c, h, w), dtype)
    wt = rand(rng, (o, c // g) + k, dtype)
    b = rand(rng, (o,), dtype) if has_bias else None
    y = run1(lambda net, xi: net.conv2d(xi, wt, b, stride=s, padding=p, dilation=d, groups=g,
                                        name="conv"), x, dtype=dtype)
    check(y, torch_conv(x, wt, b, s, p, d, g), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv2d_fused_epilogue(dtype):
    """has_residual and relu (what the compiler fuses) = conv + residual, then ReLU."""
    rng = np.random.default_rng(1)
    x, wt, b = rand(rng, (2, 6, 9, 9), dtype), rand(rng, (6, 3, 3, 3), dtype), rand(rng, (6,), dtype)
    res = rand(rng, (2, 6, 9, 9), dtype)

    def build(net, xi, ri):
        w_, b_ = net.constant("w", wt), net.constant("b", b)
        return net.add_op("conv2d", [xi, w_, b_, ri], dict(padding=1, groups=2, has_bias=True,
                                                           has_residual=True, relu=True), "conv")

    y = run1(build, x, res, dtype=dtype)
    want = torch.relu(F.conv2d(t64(x), t64(wt), t64(b), 1, 1, 1, 2) + t64(res))
    check(y, want, dtype)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(n=st.integers(1, 3), cg=st.integers(1, 5), og=st.integers(1, 5), g=st.integers(1, 3),
       kh=st.integers(1, 5), kw=st.integers(1, 5), sh=st.integers(1, 3), sw=st.integers(1, 3),
       dh=st.integers(1, 3), dw=st.integers(1, 3), pad=st.tuples(*[st.integers(0, 3)] * 4),
       extra=st.tuples(st.integers(0, 6), st.integers(0, 6)), bias=st.booleans())
def test_conv2d_property(n, cg, og, g, kh, kw, sh, sw, dh, dw, pad, extra, bias):
    """Seeded random conv configurations (fp64, so any indexing slip shows up exactly)."""
    h = max(1, dh * (kh - 1) + 1 - pad[0] - pad[1]) + extra[0]
    w = max(1, dw * (kw - 1) + 1 - pad[2] - pad[3]) + extra[1]
    rng = np.random.default_rng(n * 1000 + h * 10 + w)
    x = rand(rng, (n, cg * g, h, w), np.float64)
    wt = rand(rng, (og * g, cg, kh, kw), np.float64)
    b = rand(rng, (og * g,), np.float64) if bias else None
    y = run1(lambda net, xi: net.conv2d(xi, wt, b, (sh, sw), pad, (dh, dw), g, name="conv"), x,
             dtype=np.float64)
    check(y, torch_conv(x, wt, b, (sh, sw), pad, (dh, dw), g), np.float64)


# ----------------------------------------------------------------------------- norms

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 5, 7, 9), (3, 20, 4, 4), (3, 7)])
def test_batch_norm(shape, dtype):
    rng = np.random.default_rng(2)
    c = shape[1]
    x = rand(rng, shape, dtype)
    gamma, beta, mean = rand(rng, c, dtype), rand(rng, c, dtype), rand(rng, c, dtype)
    var = rand(rng, c, dtype, 0.5, 2.0)
    y = run1(lambda net, xi: net.batch_norm(xi, gamma, beta, mean, var, eps=1e-3, name="bn"), x,
             dtype=dtype)
    want = F.batch_norm(t64(x), t64(mean), t64(var), t64(gamma), t64(beta), training=False, eps=1e-3)
    check(y, want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scale(dtype):
    rng = np.random.default_rng(3)
    x, a, b = rand(rng, (3, 11, 5, 6), dtype), rand(rng, 11, dtype), rand(rng, 11, dtype)
    y = run1(lambda net, xi: net.scale(xi, a, b, name="scale"), x, dtype=dtype)
    check(y, t64(x) * t64(a).view(1, -1, 1, 1) + t64(b).view(1, -1, 1, 1), dtype)


# (size, alpha, beta, k, channels)
LRN_CASES = [(3, 1e-4, 0.75, 1.0, 7), (5, 1e-4, 0.75, 2.0, 13), (5, 0.5, 0.6, 1.0, 4),
             (4, 0.1, 0.75, 1.5, 9), (1, 0.3, 1.0, 1.0, 3)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size,alpha,beta,k,c", LRN_CASES)
def test_local_response_norm(size, alpha, beta, k, c, dtype):
    rng = np.random.default_rng(4)
    x = rand(rng, (2, c, 5, 3), dtype) * np.asarray(3, dtype)
    y = run1(lambda net, xi: net.local_response_norm(xi, size, alpha, beta, k, name="lrn"), x, dtype=dtype)
    check(y, F.local_response_norm(t64(x), size, alpha, beta, k), dtype)



@pytest.mark.parametrize("size", [1, 3, 5])
def test_local_response_norm_small_window_beside_large_ones(size):
    """A channel of ~2.65 beside channels of ~600 (a Pow(x, -1) of inputs near 0): each output to 1e-5 of the
    float64 formula's, compiled and in the reference. The window was a difference of running sums over the
    channels, float32 sums of 4e5 that are 0.03 apart: the small window came out 0.8% off (tests/onnx_graphs.py
    seed 77014535)."""
    rng = np.random.default_rng(5)
    x = rng.uniform(2.0, 3.0, (2, 9, 4, 3)).astype(np.float32)
    x[:, ::2] *= 240.0           # channels 0, 2, 4, ... ~600: squares ~4e5
    xd = x.astype(np.float64)
    c = x.shape[1]
    sq = np.stack([(xd[:, max(0, k - size // 2):min(c, k + (size - 1) // 2 + 1)] ** 2).sum(1) for k in range(c)], 1)
    want = xd / (1.0 + 1e-3 / size * sq) ** 0.75
    got = run1(lambda net, xi: net.local_response_norm(xi, size, 1e-3, 0.75, 1.0, name="lrn"), x, dtype=np.float32)
    from tilefuse.kernels import reference as ref
    for y in (got, ref.local_response_norm(x, size, 1e-3, 0.75, 1.0)):
        rel = np.abs(y.astype(np.float64) - want) / np.abs(want)
        assert rel.max() <= 1e-5, (rel.max(), np.unravel_index(rel.argmax(), rel.shape))

# ----------------------------------------------------------------------------- elementwise

@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_add_dropout(dtype):
    rng = np.random.default_rng(5)
    a, b = rand(rng, (3, 5, 4, 7), dtype), rand(rng, (3, 5, 4, 7), dtype)
    check(run1(lambda net, x: net.relu(x, name="r"), a, dtype=dtype), torch.relu(t64(a)), dtype)
    check(run1(lambda net, x, z: net.add(x, z, name="s"), a, b, dtype=dtype), t64(a) + t64(b), dtype)
    check(run1(lambda net, x, z: net.add_op("add", [x, z], {"relu": True}, "s"), a, b, dtype=dtype),
          torch.relu(t64(a) + t64(b)), dtype)
    check(run1(lambda net, x: net.dropout(x, 0.3, name="d"), a, dtype=dtype),
          F.dropout(t64(a), 0.3, training=False), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axis", [((3, 10), 1), ((3, 10), -1), ((3, 10), 0),
                                        ((2, 7, 3, 5), 1), ((2, 7, 3, 5), 3), ((2, 7, 3, 5), -2)])
def test_softmax(shape, axis, dtype):
    rng = np.random.default_rng(6)
    x = rand(rng, shape, dtype) * np.asarray(4, dtype)
    check(run1(lambda net, xi: net.softmax(xi, axis, name="sm"), x, dtype=dtype),
          F.softmax(t64(x), dim=axis), dtype)


# ----------------------------------------------------------------------------- pooling

# (shape, kernel, stride, padding (ph, pw), dilation, ceil_mode)
MAXPOOL_CASES = [
    ((1, 3, 13, 13), 3, 2, 0, 1, False),
    ((1, 64, 16, 16), 3, 2, 1, 1, False),        # ResNet stem
    ((3, 5, 13, 13), 3, 2, 0, 1, True),
    ((2, 7, 6, 6), 3, 2, 1, 1, True),
    ((2, 7, 5, 5), 2, 2, 1, 1, True),            # ceil: a 4th window would start in the padding
    ((1, 5, 11, 10), (2, 3), (2, 1), (1, 1), 1, False),
    ((2, 3, 14, 15), 3, 3, 1, 2, True),          # dilation 2, stride 3
    ((1, 2, 7, 9), (3, 2), (1, 2), (1, 0), (1, 2), False),
]


def _pad4(p):
    ph, pw = (p, p) if isinstance(p, int) else p
    return (ph, ph, pw, pw)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,k,s,p,d,ceil", MAXPOOL_CASES)
def test_max_pool(shape, k, s, p, d, ceil, dtype):
    x = rand(np.random.default_rng(7), shape, dtype)
    y = run1(lambda net, xi: net.max_pool(xi, k, s, _pad4(p), d, ceil, name="mp"), x, dtype=dtype)
    check(y, F.max_pool2d(t64(x), k, s, p, d, ceil_mode=ceil), dtype)


# (shape, kernel, stride, padding, ceil_mode, count_include_pad)
AVGPOOL_CASES = [
    ((1, 3, 13, 13), 3, 2, 0, False, True),
    ((2, 5, 12, 11), 3, 2, 1, False, True),
    ((2, 5, 12, 11), 3, 2, 1, False, False),
    ((3, 4, 7, 7), 3, 2, 1, True, True),
    ((3, 4, 8, 8), 3, 2, 1, True, True),       # ceil overhang beyond the padding is not counted
    ((3, 4, 8, 8), 3, 2, 1, True, False),
    ((2, 3, 5, 5), 2, 2, 1, True, True),       # ceil: a 4th window would start in the padding
    ((1, 6, 10, 9), (2, 3), (2, 3), (1, 0), True, False),
    ((1, 17, 8, 8), 2, 2, 0, False, True),
    ((1, 2, 9, 10), (4, 3), (3, 1), (2, 1), False, False),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,k,s,p,ceil,cip", AVGPOOL_CASES)
def test_avg_pool(shape, k, s, p, ceil, cip, dtype):
    x = rand(np.random.default_rng(8), shape, dtype)
    y = run1(lambda net, xi: net.avg_pool(xi, k, s, _pad4(p), ceil, cip, name="ap"), x, dtype=dtype)
    check(y, F.avg_pool2d(t64(x), k, s, p, ceil_mode=ceil, count_include_pad=cip), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 3, 7, 7), (3, 10, 1, 5), (2, 33, 4, 6)])
def test_global_avg_pool(shape, dtype):
    x = rand(np.random.default_rng(9), shape, dtype)
    check(run1(lambda net, xi: net.global_avg_pool(xi, name="gap"), x, dtype=dtype),
          F.adaptive_avg_pool2d(t64(x), 1), dtype)


# ----------------------------------------------------------------------------- linear, shape ops

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k,m,bias", [(1, 37, 19, True), (3, 64, 10, False), (2, 5, 1, True)])
def test_linear(n, k, m, bias, dtype):
    rng = np.random.default_rng(10)
    x, w = rand(rng, (n, k), dtype), rand(rng, (m, k), dtype)
    b = rand(rng, (m,), dtype) if bias else None
    check(run1(lambda net, xi: net.linear(xi, w, b, name="fc"), x, dtype=dtype),
          F.linear(t64(x), t64(w), None if b is None else t64(b)), dtype)


def test_linear_fused_relu():
    rng = np.random.default_rng(11)
    x, w, b = rand(rng, (3, 8), np.float64), rand(rng, (5, 8), np.float64), rand(rng, (5,), np.float64)

    def build(net, xi):
        return net.add_op("linear", [xi, net.constant("w", w), net.constant("b", b)],
                          {"has_bias": True, "relu": True}, "fc")

    check(run1(build, x, dtype=np.float64), torch.relu(F.linear(t64(x), t64(w), t64(b))), np.float64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("start_dim", [1, 2, 3])
def test_flatten(start_dim, dtype):
    x = rand(np.random.default_rng(12), (3, 4, 5, 6), dtype)
    check(run1(lambda net, xi: net.flatten(xi, start_dim, name="fl"), x, dtype=dtype),
          torch.flatten(t64(x), start_dim), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes,axis", [([(1, 3, 5, 5), (1, 7, 5, 5), (1, 1, 5, 5)], 1),
                                         ([(2, 3, 4, 4), (1, 3, 4, 4)], 0),
                                         ([(2, 3, 4, 2), (2, 3, 4, 5)], -1)])
def test_concat(shapes, axis, dtype):
    rng = np.random.default_rng(13)
    xs = [rand(rng, s, dtype) for s in shapes]
    y = run1(lambda net, *ins: net.concat(ins, axis, name="cat"), *xs, dtype=dtype)
    check(y, torch.cat([t64(a) for a in xs], dim=axis), dtype)


# ----------------------------------------------------------------------------- shape inference errors

def graph_error(fn, node: str, *fragments: str) -> GraphError:
    """fn() must raise a GraphError at `node` whose message contains every fragment."""
    with pytest.raises(GraphError) as info:
        fn()
    err = info.value
    msg = str(err)
    assert err.node == node, f"error names node {err.node!r}, expected {node!r}: {msg}"
    assert msg.startswith(f"{node}:"), msg
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    return err


def net_with(shape=(1, 4, 8, 8), dtype=np.float32):
    net = Network("bad")
    return net, net.input("x", shape, dtype)


W = np.zeros


def test_conv_errors():
    net, x = net_with()
    graph_error(lambda: net.conv2d(x, W((6, 3, 3, 3)), name="c1"), "c1", "(6, 3, 3, 3)",
                "3 input channels per group", "expected 4")
    graph_error(lambda: net.conv2d(x, W((6, 4, 3, 3)), groups=3, name="c2"), "c2", "groups=3",
                "input channels 4", "output channels 6")
    graph_error(lambda: net.conv2d(x, W((6, 4, 9, 9)), name="c3"), "c3", "9x9", "empty output",
                "expected")
    graph_error(lambda: net.conv2d(x, W((6, 4, 3, 3)), W(5), name="c4"), "c4", "bias",
                "(5,)", "expected (6,)")
    graph_error(lambda: net.conv2d(x, W((6, 4, 3)), name="c5"), "c5", "rank 3", "expected rank 4")
    net2, x3 = net_with((4, 8, 8))
    graph_error(lambda: net2.conv2d(x3, W((6, 4, 3, 3)), name="c6"), "c6", "(4, 8, 8)", "expected rank 4")


def test_conv_param_errors():
    net, x = net_with()
    w = W((4, 4, 3, 3))
    graph_error(lambda: net.conv2d(x, w, stride=0, name="s0"), "s0", "stride=0", ">= 1")
    graph_error(lambda: net.conv2d(x, w, padding=-1, name="pn"), "pn", "padding=-1", ">= 0")
    graph_error(lambda: net.conv2d(x, w, padding=(1, 2, 3), name="p3"), "p3", "(1, 2, 3)",
                "(top, bottom, left, right)")
    graph_error(lambda: net.conv2d(x, w, stride="2", name="ss"), "ss", "'2'", "integer")
    graph_error(lambda: net.conv2d(x, w, dilation=(1, 2, 3), name="d3"), "d3", "(1, 2, 3)", "pair")
    graph_error(lambda: net.conv2d(x, w, groups=1.5, name="gf"), "gf", "groups=1.5", "integer")


def test_dtype_errors():
    net, x = net_with()
    w64 = net.constant("w64", W((4, 4, 3, 3), np.float64))
    graph_error(lambda: net.conv2d(x, w64, name="c"), "c", "x:float32", "w64:float64", "expected one dtype")
    graph_error(lambda: net.input("xi", (1, 3), np.int32), "xi", "int32", "expected one of")
    y = net.input("y", (1, 4, 8, 8), np.float64)
    graph_error(lambda: net.add(x, y, name="a"), "a", "float32", "float64", "expected one dtype")


def test_shape_and_name_errors():
    net, x = net_with()
    graph_error(lambda: net.input("z", (1, 0, 3)), "z", "(1, 0, 3)", "positive")
    graph_error(lambda: net.input("x", (1, 2)), "x", "already used", "unique")
    graph_error(lambda: net.add(x, net.input("y", (1, 4, 8, 7)), name="a"), "a", "(1, 4, 8, 8)",
                "(1, 4, 8, 7)", "expected shapes that broadcast")
    graph_error(lambda: net.batch_norm(x, W(4), W(4), W(3), W(4) + 1, name="bn"), "bn", "mean",
                "(3,)", "expected (4,)")
    graph_error(lambda: net.batch_norm(x, W(4), W(4), W(4), W(4) + 1, eps=0, name="bn2"), "bn2",
                "eps=0", "> 0")
    graph_error(lambda: net.scale(x, W(5), W(4), name="sc"), "sc", "alpha", "(5,)", "expected (4,)")


def test_pool_errors():
    net, x = net_with((1, 4, 3, 3))
    graph_error(lambda: net.max_pool(x, 5, name="mp"), "mp", "(1, 4, 3, 3)", "(5, 5)", "expected")
    graph_error(lambda: net.max_pool(x, 2, padding=2, name="mp2"), "mp2", "(2, 2, 2, 2)",
                "at most half")
    graph_error(lambda: net.avg_pool(x, 0, name="ap"), "ap", "kernel_size=0", ">= 1")
    net2, v = net_with((3, 4))
    graph_error(lambda: net2.global_avg_pool(v, name="g"), "g", "(3, 4)", "expected rank 4")


def test_linear_softmax_shape_op_errors():
    net, x = net_with((2, 10))
    graph_error(lambda: net.linear(x, W((5, 9)), name="fc"), "fc", "(5, 9)", "(out_features, 10)")
    graph_error(lambda: net.linear(x, W((5, 10)), W(4), name="fc2"), "fc2", "bias", "(4,)", "expected (5,)")
    graph_error(lambda: net.softmax(x, 2, name="sm"), "sm", "axis=2", "(2, 10)")
    graph_error(lambda: net.flatten(x, 2, name="fl"), "fl", "start_dim=2", "(2, 10)")
    graph_error(lambda: net.dropout(x, 1.0, name="dr"), "dr", "p=1.0", "[0, 1)")
    net4, x4 = net_with()
    graph_error(lambda: net4.linear(x4, W((5, 256)), name="fc4"), "fc4", "(1, 4, 8, 8)",
                "(out_features, 8)")    # linear acts on the last axis (channels-last layers)
    y = net4.input("y", (1, 3, 7, 8))
    graph_error(lambda: net4.concat([x4, y], 1, name="cat"), "cat", "(1, 3, 7, 8)", "except along axis 1")
    graph_error(lambda: net4.concat([x4], 4, name="cat2"), "cat2", "axis=4", "rank 4")
    graph_error(lambda: net4.local_response_norm(x4, 0, name="lrn"), "lrn", "size=0", ">= 1")
    graph_error(lambda: net4.add_op("nonsense", [x4], {}, "ns"), "ns", "unknown op type 'nonsense'", "known:")


def test_evaluate_input_errors():
    net, x = net_with()
    net.output(net.relu(x, name="r"))
    graph_error(lambda: evaluate(net, np.zeros((1, 4, 8, 7), np.float32)), "x", "(1, 4, 8, 7)",
                "expected (1, 4, 8, 8)")
    graph_error(lambda: evaluate(net, np.zeros((1, 4, 8, 8), np.complex64)), "x", "complex64",
                "expected float32")
    graph_error(lambda: evaluate(net, []), "bad", "got 0 inputs", "expected 1")
    graph_error(lambda: evaluate(net, {"q": np.zeros((1, 4, 8, 8), np.float32)}), "bad", "'q'", "expected")


def test_constant_errors():
    d = DataNode("k", (2, 3))
    graph_error(lambda: d.bind_constant(np.zeros((3, 2), np.float32)), "k", "(3, 2)", "expected (2, 3)")
    graph_error(lambda: d.bind_constant(np.full((2, 3), np.nan, np.float32)), "k", "NaN")
