"""Element-wise math as model code writes it: abs, exp, log, sqrt, rsqrt, pow, CELU, SELU, LogSigmoid, erf, floor,
ceil, round, sin, cos, tan, asin, acos, atan, sinh, cosh, asinh, acosh, atanh (activation codes 14-37), and what is composed of them: var / std, F.normalize's vector norm,
log_softmax, amin / x.min(dim).

The blocks are those of well-known models, written as their authors wrote them: SSD's L2Norm (`x.pow(2).sum(1,
keepdim=True).sqrt()`), the official ConvNeXt LayerNorm for channels_first (`(x - u).pow(2).mean(1)`,
`torch.sqrt(s + eps)`), GeM pooling (a learned exponent: `x.clamp(min=eps).pow(self.p)`), AdaIN's statistics
(`x.var(dim=2) + eps`, `.sqrt()`), an embedding head normalized with F.normalize, a classifier ending in
log_softmax, SELU / CELU / Softsign / LogSigmoid networks. Each through from_torch against PyTorch and through
both ONNX exporters against PyTorch and ONNX Runtime."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx_export import EXPORTERS, assert_close_to_max, check_export, check_from_torch, torch_run

import tilefuse
from tilefuse.errors import GraphError, UnsupportedOpError
from tilefuse.kernels import activations as A

_R = np.random.default_rng(0)
# every sign and scale of float32: values from 1e-38 to 1e38, both signs, and the small integers
MAG = np.exp(_R.uniform(-87, 87, 6000))
XALL = np.concatenate([MAG, -MAG, _R.standard_normal(4000) * 4, np.arange(-5, 6), [1e-30, -1e-30]]).astype(np.float32)
XPOS = XALL[XALL > 0]
XDIV = np.concatenate([XALL[np.abs(XALL) < 1e30], np.arange(-6, 6, 0.125, dtype=np.float32)])

# name, params, torch function, inputs, relative tolerance (pow: ln's error times |p ln x|, 1e-5 at e^80)
CASES = [
    ("abs", {}, torch.abs, XALL, 0),
    ("exp", {}, torch.exp, XALL, 2e-6),
    ("log", {}, torch.log, XPOS, 2e-6),
    ("log2", {}, torch.log2, XPOS, 1e-6),
    ("log10", {}, torch.log10, XPOS, 1e-6),
    ("base_pow", {}, torch.exp2, XALL, 1e-6),
    ("base_pow", {"base": 10.0}, lambda t: 10.0 ** t, XALL, 1e-6),
    ("base_pow", {"base": 0.375}, lambda t: torch.pow(0.375, t), XALL, 1e-6),   # (bases float32 holds: the
    # kernel's parameters are float32, as PyTorch's float32 pow rounds its number base)
    ("erfc", {}, torch.erfc, XALL, 1e-6),
    ("sqrt", {}, torch.sqrt, XPOS, 2e-6),
    ("rsqrt", {}, torch.rsqrt, XPOS, 2e-6),
    ("pow", {"exponent": 2.5}, lambda t: torch.pow(t, 2.5), XALL, 2e-5),
    ("pow", {"exponent": -3.0}, lambda t: torch.pow(t, -3.0), XALL, 2e-5),
    ("pow", {"exponent": 4.0}, lambda t: torch.pow(t, 4.0), XALL, 2e-5),
    ("pow", {"exponent": 1.0 / 3.0}, lambda t: torch.pow(t, 1.0 / 3.0), XALL, 2e-5),
    ("pow", {"exponent": 0.0}, lambda t: torch.pow(t, 0.0), XALL, 0),
    ("celu", {"alpha": 0.7}, lambda t: F.celu(t, 0.7), XALL, 2e-6),
    ("selu", {}, F.selu, XALL, 2e-6),
    ("log_sigmoid", {}, F.logsigmoid, XALL, 2e-6),
    ("erf", {}, torch.erf, XALL, 2e-6),
    ("floor", {}, torch.floor, XALL, 0),
    ("ceil", {}, torch.ceil, XALL, 0),
    ("round", {}, torch.round, np.concatenate([XALL, np.arange(-6, 6, 0.5, dtype=np.float32)]), 0),
    ("sin", {}, torch.sin, XALL, 1e-6),
    ("cos", {}, torch.cos, XALL, 1e-6),
    ("tan", {}, torch.tan, XALL, 1e-6),
    ("asin", {}, torch.asin, XALL, 1e-6),
    ("acos", {}, torch.acos, XALL, 1e-6),
    ("atan", {}, torch.atan, XALL, 1e-6),
    ("sinh", {}, torch.sinh, XALL, 1e-6),
    ("cosh", {}, torch.cosh, XALL, 1e-6),
    ("asinh", {}, torch.asinh, XALL, 1e-6),
    ("acosh", {}, torch.acosh, XALL, 1e-6),
    ("atanh", {}, torch.atanh, XALL, 1e-6),
    ("trunc", {}, torch.trunc, np.concatenate([XALL, np.arange(-6, 6, 0.5, dtype=np.float32)]), 0),
    # divisors float32 holds (PyTorch in float64 divides by the same number); |x / d| within float32's range
    # (PyTorch's vectorized float32 fmod is NaN past it, C's fmod exact)
    ("fmod", {"divisor": 0.75}, lambda t: torch.fmod(t, 0.75), XDIV, 0),
    ("fmod", {"divisor": -2.5}, lambda t: torch.fmod(t, -2.5), XDIV, 0),
    ("remainder", {"divisor": 0.375}, lambda t: torch.remainder(t, 0.375), XDIV, 0),
    ("remainder", {"divisor": -1.5}, lambda t: t % -1.5, XDIV, 0),
    ("floor_divide", {"divisor": 0.25}, lambda t: torch.div(t, 0.25, rounding_mode="floor"), XDIV, 0),
    ("floor_divide", {"divisor": -3.0}, lambda t: torch.div(t, -3.0, rounding_mode="floor"), XDIV, 0),  # (x // d:
    # no PyTorch derivative)
]
SPECIAL = np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0, -1.0, 1.0, -2.0, 89.0, -89.0, -104.0, 1e-40, -1e-40])


@pytest.mark.parametrize("name,params,fn,x,rtol", CASES, ids=[f"{c[0]}{i}" for i, c in enumerate(CASES)])
def test_kernel_and_reference_match_torch(name, params, fn, x, rtol):
    """The njit form (apply_inplace: the loop every kernel's epilogue runs) and the numpy reference against
    PyTorch in float64, rounded to float32; a result under e^-87 = 1.65e-38 may be 0 (no subnormal results: exp
    below -87 is 0)."""
    n, a, b = A.normalize(name, params)
    want = fn(torch.from_numpy(x.astype(np.float64))).numpy()
    y = x.copy()
    A.apply_inplace(y, *A.encode(n, a, b))
    got_ref = A.reference(n, x, a, b)
    for got in (y, got_ref):
        assert got.dtype == np.float32
        with np.errstate(over="ignore"):
            w32 = want.astype(np.float32)
        np.testing.assert_allclose(got, w32, rtol=max(rtol, 1e-6), atol=1.7e-38)


@pytest.mark.parametrize("name,params,fn,x,rtol", [c for c in CASES if c[0] in A.DIVISORS + ("trunc",)])
def test_division_codes_are_pytorchs_float32_bits(name, params, fn, x, rtol):
    """trunc, fmod, remainder and floor division bit for bit as PyTorch's float32 (its own roundings: fmod + d,
    the quotient's steps), signs of zeros included."""
    n, a, b = A.normalize(name, params)
    want = fn(torch.from_numpy(x)).numpy()
    y = x.copy()
    A.apply_inplace(y, *A.encode(n, a, b))
    for got in (y, A.reference(n, x, a, b)):
        np.testing.assert_array_equal(got, want)
        assert np.array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("name,params,fn", [c[:3] for c in CASES], ids=[f"{c[0]}{i}" for i, c in enumerate(CASES)])
def test_nan_infinities_zeros_and_signs_are_pytorchs(name, params, fn):
    """NaN in, NaN out; log(0) = -inf, log(-1) = NaN, rsqrt(0) = inf, exp(inf) = inf, (-inf)^2.5 = inf,
    (-0)^-3 = -inf, x^0 = 1 even for NaN: the same non-finite values and signs as PyTorch."""
    n, a, b = A.normalize(name, params)
    want = fn(torch.from_numpy(SPECIAL)).numpy()
    y = SPECIAL.copy()
    A.apply_inplace(y, *A.encode(n, a, b))
    fin = np.isfinite(want)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    np.testing.assert_array_equal(y[np.isinf(want)], want[np.isinf(want)])
    np.testing.assert_allclose(y[fin], want[fin], rtol=2e-6, atol=1.7e-38)
    if name in ("pow",) and a == -3.0:
        assert np.signbit(y[SPECIAL == 0]).tolist() == np.signbit(want[SPECIAL == 0]).tolist()


def test_parameters_are_checked():
    with pytest.raises(ValueError, match="pow exponent inf; expected a finite number"):
        A.normalize("pow", {"exponent": float("inf")})
    with pytest.raises(ValueError, match="celu alpha 0.0; expected alpha > 0"):
        A.normalize("celu", {"alpha": 0.0})
    assert [A.finite_at_zero(n) for n in ("exp", "abs", "sqrt", "log", "rsqrt")] == [True] * 3 + [False] * 2
    assert not A.finite_at_zero("pow", -2.0) and A.finite_at_zero("pow", 2.5)


def _conv_log_net(c_mid=20, act_on_conv=False):
    """conv (3 -> 20 channels: one full block of 16 and 4 channels in a padded one) with a large bias, so that its
    outputs are positive, then ln, then a 3x3 conv reading every channel block."""
    rng = np.random.default_rng(3)
    net = tilefuse.Network("logs")
    x = net.input("x", (2, 3, 12, 10))
    w1 = (rng.standard_normal((c_mid, 3, 3, 3)) * 0.1).astype(np.float32)
    b1 = np.full(c_mid, 5.0, np.float32)
    if act_on_conv:
        y = net.add_op("conv2d", [x, net.constant("w1", w1), net.constant("b1", b1)],
                       dict(padding=1, has_bias=True, act="log"), "c1")
    else:
        y = net.activation(net.conv2d(x, w1, b1, padding=1, name="c1"), "log", name="ln")
    y = net.conv2d(y, (rng.standard_normal((8, c_mid, 3, 3)) * 0.1).astype(np.float32), padding=1, name="c2")
    net.output(y)
    return net


@pytest.mark.parametrize("schedule", ["layer", "stream"])
def test_log_after_a_conv_keeps_padded_channels_finite(schedule):
    """ln is -inf at 0, and a conv's epilogue writes act(0) into the padded channels of its NCHW16c output (4 of
    the second block here), which the next conv multiplies by zero weights: -inf * 0 = NaN in every output. The
    fusion pass leaves ln as its own op (which zeroes those lanes), so the result is the reference's, finite."""
    net = _conv_log_net()
    x = np.random.default_rng(4).standard_normal((2, 3, 12, 10)).astype(np.float32)
    want = tilefuse.interpreter.evaluate(net, x)[0]
    got = tilefuse.compile(net, schedule=schedule).run(x)
    assert np.isfinite(want).all() and np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_an_infinite_at_zero_activation_in_a_conv_epilogue_is_refused():
    with pytest.raises(GraphError, match=r"activation log \(infinite at 0\) in a conv's epilogue; expected it as "
                                         r"its own activation op"):
        _conv_log_net(act_on_conv=True)


# ------------------------------------------------------------------------------------------------ model code


class L2Norm(nn.Module):
    """SSD's L2Norm (ssd.pytorch, layers/modules/l2norm.py)."""

    def __init__(self, n_channels, scale):
        super().__init__()
        self.eps = 1e-10
        self.weight = nn.Parameter(torch.full((n_channels,), float(scale)))

    def forward(self, x):
        norm = x.pow(2).sum(dim=1, keepdim=True).sqrt() + self.eps
        x = torch.div(x, norm)
        return self.weight.unsqueeze(0).unsqueeze(2).unsqueeze(3).expand_as(x) * x


class ConvNeXtLayerNorm(nn.Module):
    """The official ConvNeXt LayerNorm (facebookresearch/ConvNeXt, models/convnext.py), channels_first."""

    def __init__(self, normalized_shape, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(normalized_shape) + 0.1 * torch.randn(normalized_shape))
        self.bias = nn.Parameter(0.1 * torch.randn(normalized_shape))
        self.eps = eps

    def forward(self, x):
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class GeM(nn.Module):
    """Generalized-mean pooling (Radenovic et al.; cnnimageretrieval-pytorch), the exponent a learned parameter."""

    def __init__(self, p=3.0, eps=1e-6):
        super().__init__()
        self.p = nn.Parameter(torch.ones(1) * p)
        self.eps = eps

    def forward(self, x):
        return F.avg_pool2d(x.clamp(min=self.eps).pow(self.p), (x.size(-2), x.size(-1))).pow(1.0 / self.p)


class AdaINStats(nn.Module):
    """AdaIN's calc_mean_std (naoto0804/pytorch-AdaIN, function.py), normalizing by the content's statistics."""

    def forward(self, feat, eps=1e-5):
        n, c = feat.size()[:2]
        feat_var = feat.view(n, c, -1).var(dim=2) + eps
        feat_std = feat_var.sqrt().view(n, c, 1, 1)
        feat_mean = feat.view(n, c, -1).mean(dim=2).view(n, c, 1, 1)
        return (feat - feat_mean.expand(feat.size())) / feat_std.expand(feat.size())


class EmbeddingHead(nn.Module):
    """A metric-learning head: pooled features, a linear projection, F.normalize (ArcFace-style)."""

    def __init__(self, c, d=8):
        super().__init__()
        self.fc = nn.Linear(c, d)

    def forward(self, x):
        return F.normalize(self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)), dim=1)


class NormalizedFeatures(nn.Module):
    """F.normalize over the channels of a feature map (contrastive and retrieval models' dense heads)."""

    def forward(self, x):
        return F.normalize(x, dim=1)


class BareL2(nn.Module):
    """x / x.norm(dim=1, keepdim=True): no eps."""

    def forward(self, x):
        return x / x.norm(dim=1, keepdim=True)


class LogSoftmaxHead(nn.Module):
    def __init__(self, c, k=5):
        super().__init__()
        self.fc = nn.Linear(c, k)

    def forward(self, x):
        return F.log_softmax(self.fc(x.mean((2, 3))), dim=1)


class Elementwise(nn.Module):
    """abs, exp, log, rsqrt, std, amin and x.min(dim) in one block."""

    def forward(self, x):
        a = torch.log(x.abs() + 1.0) + torch.exp(-x.abs())
        b = torch.rsqrt(x * x + 1.0) * x.std(dim=(2, 3), keepdim=True)
        c = torch.amin(x, dim=1, keepdim=True) + x.min(dim=1, keepdim=True)[0]
        return a + b - c


class Rounding(nn.Module):
    """Quantization-style rounding of the input (x * 4 and x * 2 are exact: no rounding difference upstream
    decides a step) and GELU written out with torch.erf, as pre-nn.GELU model code did."""

    def forward(self, x):
        q = torch.round(x * 4.0) / 4.0 + torch.floor(x * 2.0) - torch.ceil(x * 0.5)
        return q + 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


class Trigonometric(nn.Module):
    """tan and the inverse functions on arguments inside their domains (a tanh bounds asin / acos's), as
    coordinate-transform and SIREN-style code uses them (the hyperbolic ones: `test_hyperbolic_functions_import`;
    the TorchScript exporter cannot export them)."""

    def forward(self, x):
        b = torch.tanh(x) * 0.9
        return torch.asin(b) + torch.acos(b) * 0.5 + torch.atan(x * 3.0) + torch.tan(b)


MODELS = {
    "ssd_l2norm": lambda: nn.Sequential(nn.Conv2d(3, 24, 3, padding=1), nn.ReLU(), L2Norm(24, 20),
                                        nn.Conv2d(24, 8, 3, padding=1)),
    "convnext_layernorm": lambda: nn.Sequential(nn.Conv2d(3, 20, 4, stride=2), ConvNeXtLayerNorm(20),
                                                nn.Conv2d(20, 40, 3, padding=1, groups=20)),
    "gem": lambda: nn.Sequential(nn.Conv2d(3, 18, 3, padding=1), nn.ReLU(), GeM()),
    "adain": lambda: nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), AdaINStats(), nn.Conv2d(16, 4, 1)),
    "embedding": lambda: nn.Sequential(nn.Conv2d(3, 12, 3, stride=2), nn.ReLU(), EmbeddingHead(12)),
    "log_softmax": lambda: nn.Sequential(nn.Conv2d(3, 12, 3), nn.ReLU(), LogSoftmaxHead(12)),
    "selu_celu": lambda: nn.Sequential(nn.Conv2d(3, 20, 3, padding=1), nn.SELU(), nn.Conv2d(20, 12, 3),
                                       nn.CELU(0.6), nn.Conv2d(12, 6, 1), nn.Softsign(), nn.Conv2d(6, 4, 1),
                                       nn.LogSigmoid()),
    "elementwise": lambda: nn.Sequential(nn.Conv2d(3, 10, 3, padding=1), Elementwise()),
    "normalize_features": lambda: nn.Sequential(nn.Conv2d(3, 20, 3, padding=1), NormalizedFeatures(),
                                                nn.Conv2d(20, 6, 1)),
    "bare_l2": lambda: nn.Sequential(nn.Conv2d(3, 17, 3), BareL2(), nn.Conv2d(17, 4, 3)),
    "rounding": lambda: nn.Sequential(Rounding(), nn.Conv2d(3, 6, 3)),
    "trigonometric": lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), Trigonometric(), nn.Conv2d(8, 4, 1)),
}


def _x(seed=0, shape=(2, 3, 14, 11)):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_from_torch_matches_pytorch(name):
    check_from_torch(MODELS[name], _x())


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_onnx_exports_match_pytorch_and_onnxruntime(name, exporter):
    check_export(MODELS[name], _x(1), exporter)


def test_hyperbolic_functions_import():
    """sinh, cosh, asinh, acosh (of 1 + |x|), atanh (of a tanh's 0.9): from_torch and the dynamo exporter."""
    class Hyperbolic(nn.Module):
        def forward(self, x):
            b = torch.tanh(x) * 0.9
            y = torch.sinh(b) - torch.cosh(b) * 0.25 + torch.asinh(x)
            return y + torch.acosh(1.0 + x.abs()) + torch.atanh(b) * 2.0

    m = lambda: nn.Sequential(nn.Conv2d(3, 5, 3), Hyperbolic())                 # noqa: E731
    check_from_torch(m, _x())
    check_export(m, _x(1), "dynamo")


def test_base_two_and_ten_functions_and_erfc_import():
    """An entropy in bits (-p log2 p), decibels (10 log10 of a power), an octave scale (2^x) and a Gaussian tail
    (erfc(x / sqrt 2) / 2): from_torch (one activation each) and the dynamo exporter's forms (their gradients:
    tests/test_training_modern.py, from CASES)."""
    class Bits(nn.Module):
        def forward(self, x):
            p = x.softmax(1)
            entropy = -(p * torch.log2(p)).sum(1, keepdim=True)
            db = 10.0 * torch.log10(x * x + 1e-3)
            return entropy + db + torch.exp2(x * 0.5) + 10.0 ** (x * 0.1) + 0.5 * torch.erfc(x / math.sqrt(2.0))

    m = lambda: nn.Sequential(nn.Conv2d(3, 5, 3), Bits())                       # noqa: E731
    check_from_torch(m, _x())
    check_export(m, _x(1), "dynamo")
    net = tilefuse.from_torch(m().eval(), torch.from_numpy(_x()))
    assert {"log2", "log10", "base_pow", "erfc"} <= {op.params["act"][0] for op in net.ops if op.op == "activation"}


class Periodic(nn.Module):
    """Wrapping and quantizing as model code writes them: a phase wrapped to [0, 2 pi) (`x % (2 * math.pi)`),
    torch.fmod, a floor division's cell index and its offset (`x // s`, `x - s * (x // s)`), frac, trunc, and
    div(rounding_mode='trunc') by a computed tensor."""

    def forward(self, x):
        phase = (x * 4.0) % (2 * math.pi)
        cell = torch.div(x, 0.25, rounding_mode="floor")
        offset = x - 0.25 * (x // 0.25)
        q = torch.div(x * 8.0, x.abs() + 1.0, rounding_mode="trunc")
        return phase + torch.fmod(x * 3.0, -0.75) + cell * 0.1 + offset + torch.frac(x * 5.0) + torch.trunc(x) + q


def test_wrapping_and_quantizing_import_as_pytorch():
    # first, on the input: the steps see the same float32 values as PyTorch's (a conv's rounding before them could
    # move a value across a step)
    m = nn.Sequential(Periodic(), nn.Conv2d(3, 4, 3, padding=1))
    check_from_torch(lambda: m, _x())
    net = tilefuse.from_torch(m.eval(), torch.from_numpy(_x()))
    assert {op.params["act"][0] for op in net.ops if op.op == "activation"} >= {"remainder", "floor_divide",
                                                                                 "fmod", "trunc"}
    with pytest.raises(UnsupportedOpError, match=r"remainder \(x % d\) by a computed tensor"):
        tilefuse.from_torch(nn.Sequential(nn.Conv2d(3, 5, 3), _Lambda(lambda x: x % x.flip(1))),
                            torch.from_numpy(_x()))


class _Lambda(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x):
        return self.f(x)


def test_pow_imports_as_products_roots_and_the_pow_activation():
    """x^2 and x^3 are products, x^0.5 sqrt, x^-0.5 rsqrt, x^-1 a division, x^1 nothing; any other number (or a
    one-value constant tensor) the pow activation."""
    class Pows(nn.Module):
        def forward(self, x):
            a = x.abs() + 0.5
            return a ** 2 + a ** 3 + a ** 0.5 + a ** -0.5 + a ** -1 + a ** 1 + a ** 1.7 + a.pow(torch.tensor(2.2))

    m = nn.Sequential(nn.Conv2d(3, 4, 3), Pows()).eval()
    x = _x(2)
    net = tilefuse.from_torch(m, torch.from_numpy(x))
    acts = sorted(o.params["act"][0] for o in net.ops if o.op == "activation")
    assert acts == ["abs", "pow", "pow", "rsqrt", "sqrt"], acts
    assert_close_to_max(tilefuse.compile(net).run(x), torch_run(m, x))


@pytest.mark.parametrize("p", [2 ** 31 - 1, 16777217, -(2 ** 31 - 1), 2 ** 31, 16777215])
def test_an_odd_exponent_past_float32s_integers_keeps_the_sign_of_a_negative_base(p):
    """float32 rounds 2^31 - 1 to 2^31 and 16777217 to 16777216, both even: (-2) ** (2^31 - 1) was +inf where
    PyTorch (and ONNX Runtime, onnx_mutants seed 12061890) gives -inf. An odd p from 2^24 on is pow(x, p - 1) * x;
    the same through torch.export and through an ONNX Pow with an int64 exponent."""
    x = np.array([[-2.0, -0.5, -1.0, -0.0, 0.0, 1.0, 1.0000001, 0.9999999, 3.0, -1.0000001]], np.float32)

    class Pow(nn.Module):
        def forward(self, v):
            return v ** p

    want = torch_run(Pow().eval(), x)
    net = tilefuse.from_torch(Pow().eval(), torch.from_numpy(x))
    got = np.asarray(tilefuse.compile(net).run(x))
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    from onnx import TensorProto, helper, numpy_helper
    g = helper.make_graph([helper.make_node("Pow", ["x", "p"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)],
                          [numpy_helper.from_array(np.array(p, np.int64), "p")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])
    got = np.asarray(tilefuse.compile(tilefuse.from_onnx(m)).run(x))
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_what_stays_refused_is_named():
    class TensorExponent(nn.Module):
        def forward(self, x):
            return x.abs().pow(x)

    with pytest.raises(UnsupportedOpError, match=r"pow with a computed exponent"):
        tilefuse.from_torch(TensorExponent(), torch.from_numpy(_x()))

    class RoundDecimals(nn.Module):
        def forward(self, x):
            return torch.round(x * 4.0, decimals=2)

    with pytest.raises(UnsupportedOpError, match=r"round with decimals=2 is not supported.*expected torch\.round"):
        tilefuse.from_torch(RoundDecimals(), torch.from_numpy(_x()))

    class Norm3(nn.Module):
        def forward(self, x):
            return torch.linalg.vector_norm(x, 3, dim=1, keepdim=True)

    with pytest.raises(UnsupportedOpError, match=r"vector norm of order 3 is not supported.*supported: 1, 2, inf"):
        tilefuse.from_torch(Norm3(), torch.from_numpy(_x()))


# ------------------------------------------------------------------------- the spelled-out channel LayerNorm

class _UsesCentered(nn.Module):
    """The chain with x - u also read outside it: not one norm (the pass must leave it)."""

    def forward(self, x):
        d = x - x.mean(1, keepdim=True)
        return d / torch.sqrt(d.pow(2).mean(1, keepdim=True) + 1e-6) + 0.5 * d


class _OverWidth(nn.Module):
    def forward(self, x):
        u = x.mean(3, keepdim=True)
        return (x - u) / torch.sqrt((x - u).pow(2).mean(3, keepdim=True) + 1e-6)


@pytest.mark.parametrize("source", ["torch", "torchscript", "dynamo"])
def test_official_convnext_layernorm_becomes_one_channel_norm(source):
    """ConvNeXt's own LayerNorm (channels_first: mean, (x - u).pow(2).mean, torch.sqrt, weight[:, None, None] * x
    + bias[:, None, None]), from PyTorch and from both exporters' files, compiles to one channel_norm (its affine
    folded in): the compiled network holds only the convs and the norm, and matches PyTorch."""
    from onnx_export import export
    torch.manual_seed(2)
    m = MODELS["convnext_layernorm"]().eval()
    x = _x(3)
    net = tilefuse.from_torch(m, torch.from_numpy(x)) if source == "torch" else tilefuse.from_onnx(export(m, x, source))
    cp = tilefuse.compile(net)
    assert sorted(o.op for o in cp.network.ops) == ["channel_norm", "conv2d", "conv2d"], [o.op for o in cp.network.ops]
    assert_close_to_max(cp.run(x), torch_run(m, x))


@pytest.mark.parametrize("block", [_UsesCentered, _OverWidth])
def test_chains_that_are_not_a_channel_norm_stay_as_written(block):
    m = nn.Sequential(nn.Conv2d(3, 20, 3), block()).eval()
    x = _x(4)
    cp = tilefuse.compile(tilefuse.from_torch(m, torch.from_numpy(x)))
    assert "channel_norm" not in {o.op for o in cp.network.ops}
    assert_close_to_max(cp.run(x), torch_run(m, x))


# ------------------------------------------------------------------------------------ channel L2 norms

@pytest.mark.parametrize("source", ["torch", "torchscript", "dynamo"])
@pytest.mark.parametrize("name,mode", [("ssd_l2norm", "l2"), ("normalize_features", "l2_clamp"), ("bare_l2", "l2"),
                                       ("embedding", "l2_clamp")])
def test_channel_l2_norms_become_one_channel_norm(name, mode, source):
    """SSD's L2Norm (its weight expanded to the input's shape and multiplied), F.normalize over a feature map and
    over an embedding, x / x.norm(dim=1, keepdim=True): from PyTorch and both exporters' files, one channel_norm in
    an l2 mode (square, sum, sqrt, eps, expand, divide and the weight gone), matching PyTorch."""
    from onnx_export import export
    torch.manual_seed(3)
    m = MODELS[name]().eval()
    x = _x(5)
    net = tilefuse.from_torch(m, torch.from_numpy(x)) if source == "torch" else tilefuse.from_onnx(export(m, x, source))
    cp = tilefuse.compile(net)
    ops = [o.op for o in cp.network.ops]
    norms = [o for o in cp.network.ops if o.op == "channel_norm"]
    assert len(norms) == 1 and norms[0].params["mode"] == mode, ops
    assert not {"mul", "sum", "div", "activation", "add", "scale"} & set(ops), ops
    assert_close_to_max(cp.run(x), torch_run(m, x))


def test_ssd_weight_is_not_kept_at_the_activations_size():
    """SSD's `weight.unsqueeze(0).unsqueeze(2).unsqueeze(3).expand_as(x) * x` is a constant as large as the
    activation once folded at import; the compiled package keeps C values, whatever the batch and image size."""
    m = MODELS["ssd_l2norm"]().eval()
    sizes = []
    for shape in ((1, 3, 8, 8), (4, 3, 30, 20)):
        x = _x(1, shape)
        cp = tilefuse.compile(tilefuse.from_torch(m, torch.from_numpy(x)))
        sizes.append(cp.package.const_bytes)
        assert_close_to_max(cp.run(x), torch_run(m, x))
    assert sizes[0] == sizes[1] < 4 * 24 * 30 * 20 * 4, sizes    # the batch-4 activation: 230 KB


class _NormAlsoAdded(nn.Module):
    def forward(self, x):
        n = x.pow(2).sum(1, keepdim=True).sqrt()
        return x / n + n


class _OverHeight(nn.Module):
    def forward(self, x):
        return x / x.pow(2).sum(2, keepdim=True).sqrt()


class _ClampedAbove(nn.Module):
    def forward(self, x):
        return x / x.norm(dim=1, keepdim=True).clamp(1e-6, 3.0)


class _OtherSquare(nn.Module):
    def forward(self, x):
        return x / (x * x.flip(1)).sum(1, keepdim=True).abs().sqrt()


@pytest.mark.parametrize("block", [_NormAlsoAdded, _OverHeight, _ClampedAbove])
def test_chains_that_are_not_an_l2_norm_stay_as_written(block):
    """The norm read again, a sum over another axis, a clamp from above: not x / ||x|| over the channels."""
    m = nn.Sequential(nn.Conv2d(3, 20, 3), block()).eval()
    x = _x(4)
    cp = tilefuse.compile(tilefuse.from_torch(m, torch.from_numpy(x)))
    assert "channel_norm" not in {o.op for o in cp.network.ops}
    assert_close_to_max(cp.run(x), torch_run(m, x))


def test_binary_constants_shrink_and_expands_drop_without_changing_a_bit():
    """canonicalize: a constant repeating along an axis the other operand spans is cut to size 1 there (a shared one
    is cut for each reader by what that reader's other operand spans), and x * ones (an expand) read only by
    broadcasting ops is dropped; outputs bit for bit the same as the network run without the passes' rewrites (the
    interpreter)."""
    from tilefuse.compiler.passes import canonicalize
    from tilefuse.interpreter import evaluate
    rng = np.random.default_rng(7)
    net = tilefuse.Network("shrink")
    x = net.input("x", (2, 6, 5, 4))
    w = np.broadcast_to(rng.standard_normal((1, 6, 1, 1)), (2, 6, 5, 4)).astype(np.float32)
    wn = net.constant("w", w, np.float32)
    a = net.mul(x, wn, name="a")                      # w shrinks to (1, 6, 1, 1)
    s = net.sum(x, (1,), True, name="s")             # (2, 1, 5, 4)
    e = net.mul(s, net.constant("ones", np.ones((1, 6, 1, 1), np.float32), np.float32), name="e")   # expand
    d = net.div(a, e, name="d")                       # reads s itself
    y = net.add(d, wn, name="y")                      # the shared w: its own reduced copy
    z = net.sub(net.mean(x, (2, 3), True, name="m"), wn, name="z")   # m (2, 6, 1, 1): w keeps H, W for z
    net.output(y)
    net.output(z)
    res = canonicalize(net)
    got = {o.name: o for o in res.network.ops}
    assert "e" not in got and got["d"].inputs[1].name == "s"
    assert got["a"].inputs[1].shape == (1, 6, 1, 1) and got["y"].inputs[1].shape == (1, 6, 1, 1)
    assert got["z"].inputs[1].shape == (1, 6, 5, 4)
    xv = rng.standard_normal((2, 6, 5, 4)).astype(np.float32)
    for o1, o2 in zip(evaluate(net, {"x": xv}), evaluate(res.network, {"x": xv})):
        np.testing.assert_array_equal(o1, o2)
    for o1, o2 in zip(evaluate(net, {"x": xv}), tilefuse.compile(net).run(xv)):
        np.testing.assert_allclose(o1, o2, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset,fmod,d", [(13, 1, 0.75), (13, 1, -2.5), (28, 0, 0.375), (28, 0, -1.5), (28, 1, 3.0)])
def test_onnx_mod_by_a_number(opset, fmod, d):
    """ONNX Mod of a computed tensor by a one-value constant (the dynamo exporter writes torch.fmod so): fmod=1 C's
    fmod, fmod=0 (floats from Mod-28) the divisor's sign; against ONNX's reference evaluator (and ONNX Runtime
    where it runs the opset), and PyTorch's fmod / remainder."""
    import onnx
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator
    nodes = [helper.make_node("Mul", ["x", "k"], ["y"]), helper.make_node("Mod", ["y", "d"], ["z"], fmod=fmod)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3, 5])],
                          [onnx.numpy_helper.from_array(np.float32([3.0]), "k"),
                           onnx.numpy_helper.from_array(np.float32(d), "d")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    x = _R.standard_normal((2, 3, 5)).astype(np.float32)
    got = tilefuse.compile(tilefuse.from_onnx(model)).run(x)
    torch_fn = torch.fmod if fmod else torch.remainder
    np.testing.assert_array_equal(got, torch_fn(torch.from_numpy(x * 3.0), d).numpy())
    np.testing.assert_array_equal(got, ReferenceEvaluator(model).run(None, {"x": x})[0])
    if opset < 28:
        import onnxruntime as ort
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
        np.testing.assert_allclose(got, want[0], rtol=0, atol=1e-6)


def test_onnx_mod_by_a_tensor_is_refused_by_name():
    import onnx
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("Mod", ["x", "x"], ["z"], fmod=1)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])])
    with pytest.raises(UnsupportedOpError, match=r"Mod-13.*B 'x' is computed by the graph; tilefuse needs it to be a "
                                                 r"constant"):
        tilefuse.from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
