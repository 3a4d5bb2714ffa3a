"""The fused conv epilogue y = act(conv + bias + residual) on every conv kernel and form, for every
activation of the shared table, against the spec: reference conv2d, then activations.reference.

Tolerance: the conv tolerance of the algorithm (tests/test_conv_kernels.py TOL: fp32 summation
order, Winograd transforms) times max(|ref|, 1); the activations' own error (a few ulp, see
tests/test_activations.py) and their slope (<= 1.5, hardswish) stay well inside it.
"""
from __future__ import annotations

import numpy as np
import pytest

from tilefuse.kernels import activations as A
from tilefuse.kernels import reference as ref
from tilefuse.kernels.conv import (conv2d_prepare, conv2d_run, conv2d_run_nchwc, conv2d_run_to_nchwc, direct_nchwc,
                                   from_nchwc, gemm1x1, im2col, k1x1, nchwc_shape, stem, to_nchwc)
from tilefuse.kernels.conv.epilogue import resolve_act

TOL = {"gemm1x1": 1e-4, "direct": 1e-4, "im2col": 1e-4, "winograd2": 1e-3, "winograd4": 5e-3}

# every activation, with parameters away from their defaults where it has some
ACTS = [("identity", {}), ("relu", {}), ("clip", {"min": -0.5, "max": 0.7}), ("clip", {"min": 0.0, "max": 6.0}),
        ("hardswish", {}), ("hardsigmoid", {"alpha": 0.2, "beta": 0.5}), ("sigmoid", {}), ("silu", {}),
        ("gelu", {}), ("gelu_tanh", {}), ("leaky_relu", {"negative_slope": 0.2}), ("elu", {"alpha": 0.7}),
        ("tanh", {}), ("mish", {}), ("softplus", {"beta": 2.0, "threshold": 5.0}), ("abs", {}), ("exp", {}),
        ("log", {}), ("sqrt", {}), ("rsqrt", {}), ("pow", {"exponent": 2.5}), ("celu", {"alpha": 0.7}), ("selu", {}),
        ("log_sigmoid", {}), ("erf", {}), ("floor", {}), ("ceil", {}), ("round", {}),
        ("sin", {}), ("cos", {}), ("tan", {}), ("asin", {}), ("acos", {}), ("atan", {}), ("sinh", {}), ("cosh", {}),
        ("asinh", {}), ("acosh", {}), ("atanh", {}), ("trunc", {}), ("fmod", {"divisor": 0.7}),
        ("remainder", {"divisor": -0.3}), ("floor_divide", {"divisor": 0.45}), ("log2", {}), ("log10", {}),
        ("base_pow", {"base": 1.7}), ("erfc", {})]
# NaN below 0 and steep near it: checked against the activation of the kernel's own un-activated output (the
# conv's rounding near 0 would move ln and sqrt by more than the conv tolerance), NaN where it is negative
DOMAIN = {"log", "log2", "log10", "sqrt", "rsqrt", "pow", "asin", "acos", "acosh", "atanh"}
# steep (tan near its poles, sinh / cosh of large values) but finite: the same check, without NaN
STEEP = {"tan", "sinh", "cosh"}
# steps: the same, exactly (a conv's rounding difference from the reference may move a value across a step)
STEPS = {"floor", "ceil", "round", "trunc", "fmod", "remainder", "floor_divide"}


def test_every_activation_is_tested():
    assert {n for n, _ in ACTS} == set(A.ACTIVATIONS)


# (path, algorithm for the tolerance, (N, Ci, H, W), Co, k, stride, padding, groups)
PATHS = [
    ("nchw-gemm1x1", "gemm1x1", (2, 20, 7, 9), 40, 1, 1, 0, 1),
    ("nchw-gemm1x1-s2", "gemm1x1", (2, 20, 7, 9), 24, 1, 2, 0, 1),
    ("nchw-direct", "direct", (2, 20, 9, 8), 40, 3, 1, 1, 1),
    ("nchw-winograd2", "winograd2", (2, 20, 9, 8), 40, 3, 1, 1, 1),
    ("nchw-winograd4", "winograd4", (2, 20, 9, 8), 40, 3, 1, 1, 1),
    ("nchw-im2col", "im2col", (2, 20, 9, 8), 24, 3, 2, 1, 1),
    ("nchw-im2col-grouped", "im2col", (2, 20, 9, 8), 24, 3, 1, 1, 2),
    ("nchw-im2col-depthwise", "im2col", (2, 20, 9, 8), 20, 3, 1, 1, 20),
    ("nchwc-gemm1x1", "gemm1x1", (2, 20, 7, 9), 40, 1, 1, 0, 1),
    ("nchwc-gemm1x1-blas", "gemm1x1", (2, 20, 7, 9), 40, 1, 1, 0, 1),
    ("nchwc-direct", "direct", (2, 20, 9, 8), 40, 3, 1, 1, 1),
    ("nchwc-direct-s2", "direct", (2, 20, 9, 8), 24, 3, 2, 1, 1),
    ("nchwc-direct-prepadded", "direct", (2, 20, 9, 8), 40, 3, 1, 1, 1),
    ("nchwc-winograd2", "winograd2", (2, 20, 9, 8), 40, 3, 1, 1, 1),
    ("nchwc-winograd4", "winograd4", (2, 20, 9, 8), 40, 3, 1, 1, 1),
    ("to_nchwc-stem", "im2col", (2, 3, 15, 13), 40, 7, 2, 3, 1),
    ("to_nchwc-im2col", "im2col", (2, 6, 11, 9), 40, 3, 1, 1, 1),
]


def _data(path, seed=0):
    name, alg, (n, ci, h, w), co, k, s, p, g = path
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, ci, h, w), dtype=np.float32)
    wt = (rng.standard_normal((co, ci // g, k, k), dtype=np.float32) * (2.0 / np.sqrt(ci // g * k * k)))
    wt = wt.astype(np.float32)
    b = rng.standard_normal(co, dtype=np.float32)
    kw = dict(stride=(s, s), padding=(p,) * 4, dilation=(1, 1), groups=g)
    ho, wo = ref.conv_out_size(h, k, s, p, p, 1), ref.conv_out_size(w, k, s, p, p, 1)
    res = rng.standard_normal((n, co, ho, wo), dtype=np.float32)
    return x, wt, b, res, kw


def _run(path, x, wt, b, res, kw, **epi):
    """The conv through `path`, NCHW result (and the blocked output, for the padded channels)."""
    name, alg = path[0], path[1]
    n, co = x.shape[0], wt.shape[0]
    s, pad, dil, g = kw["stride"], kw["padding"], kw["dilation"], kw["groups"]
    ho = ref.conv_out_size(x.shape[2], wt.shape[2], s[0], pad[0], pad[1], 1)
    wo = ref.conv_out_size(x.shape[3], wt.shape[3], s[1], pad[2], pad[3], 1)
    if name.startswith("nchw-"):
        out = np.full((n, co, ho, wo), np.nan, np.float32)
        conv2d_run(alg, out, x, conv2d_prepare(alg, wt, b, s, pad, dil, g), res, **kw, **epi)
        return out, None
    ob = np.full(nchwc_shape((n, co, ho, wo)), np.nan, np.float32)
    rb = to_nchwc(res)
    if name == "nchwc-gemm1x1-blas":
        gemm1x1.run_nchwc(ob, to_nchwc(x), gemm1x1.prepare_nchwc(wt, b), rb, stride=s, **epi)
    elif name == "nchwc-direct-prepadded":
        direct_nchwc(ob, to_nchwc(x, pad), conv2d_prepare("direct", wt, b, s, pad, dil, 1, layout="nchwc"), rb,
                     stride=s, dilation=dil, **epi)
    elif name.startswith("nchwc-"):
        conv2d_run_nchwc(alg, ob, to_nchwc(x), conv2d_prepare(alg, wt, b, s, pad, dil, 1, layout="nchwc"), rb,
                         stride=s, padding=pad, dilation=dil, **epi)
    else:
        prep = conv2d_prepare("im2col", wt, b, s, pad, dil, 1)
        assert stem.applies(x.shape[1], 1) == (name == "to_nchwc-stem")
        conv2d_run_to_nchwc("im2col", ob, x, prep, rb, stride=s, padding=pad, dilation=dil, **epi)
    return from_nchwc(ob, co), ob


@pytest.mark.parametrize("path", PATHS, ids=[p[0] for p in PATHS])
def test_every_activation_against_reference(path):
    x, wt, b, res, kw = _data(path)
    base = ref.conv2d(x, wt, b, kw["stride"], kw["padding"], kw["dilation"], kw["groups"], residual=res)
    tol = TOL[path[1]]
    plain = _run(path, x, wt, b, res, kw)[0]
    for name, params in ACTS:
        _, al, be = A.normalize(name, params)
        got, blocked = _run(path, x, wt, b, res, kw, act=A.encode(name, al, be))
        if name in DOMAIN or name in STEEP:
            want = A.reference(name, plain, al, be)
            assert np.array_equal(np.isnan(got), np.isnan(want)) and (name in STEEP or np.isnan(want).any()), name
            fin = np.isfinite(want)
            got, want, t = got[fin], want[fin], 2e-6
        elif name in STEPS:
            want, t = A.reference(name, plain, al, be), 0.0
            assert np.isfinite(got).all(), name
        else:
            want, t = A.reference(name, base, al, be), tol
            assert got.dtype == np.float32 and np.isfinite(got).all(), (name, params)
        err = np.abs(got - want).max() / max(1.0, float(np.abs(want).max()))
        assert err <= t, f"{path[0]} act {name}{params}: max error {err:.3g} > {t}"
        if blocked is not None and A.reference(name, np.zeros(1, np.float32), al, be)[0] == 0:
            co = wt.shape[0]
            assert not blocked[:, -1, ..., co - (blocked.shape[1] - 1) * 16:].any(), f"{name}: padded channels"


@pytest.mark.parametrize("path", PATHS, ids=[p[0] for p in PATHS])
def test_relu_flag_is_act_relu_bitwise(path):
    """relu=True, act=encode('relu'), act='relu' and act=('relu', 0, 0) give the same bits, and so do
    relu=False and act identity (the kernels' ReLU is the table's, with no second code path)."""
    x, wt, b, res, kw = _data(path, seed=1)
    r = [_run(path, x, wt, b, res, kw, **e)[0] for e in ({"relu": True}, {"act": A.encode("relu")},
                                                           {"act": "relu"}, {"act": ("relu", 0.0, 0.0)})]
    assert all(np.array_equal(r[0], o) for o in r[1:])
    i = [_run(path, x, wt, b, res, kw, **e)[0] for e in ({"relu": False}, {"act": A.encode("identity")})]
    assert np.array_equal(i[0], i[1])
    assert (r[0] >= 0).all() and (i[0] < 0).any()


# maps large enough that the dispatchers' deferred activation (epilogue.ACT_CHUNK floats of output
# per pass) runs in several chunks: 1x1 chunks that end mid-image and cross into the next image,
# direct / stem chunks of a few output rows
CHUNKED = [
    ("nchwc-gemm1x1", "gemm1x1", (2, 20, 20, 20), 40, 1, 1, 0, 1),
    ("nchwc-direct", "direct", (2, 20, 22, 20), 40, 3, 1, 1, 1),
    ("to_nchwc-stem", "im2col", (2, 3, 70, 66), 40, 7, 2, 3, 1),
]


@pytest.mark.parametrize("path", CHUNKED, ids=[p[0] for p in CHUNKED])
def test_deferred_activation_covers_every_chunk(path):
    """SiLU / GELU / hardswish run after a chunk of output rows is stored (k1x1._k1x1,
    direct._direct_rows2, stem._stem_rows): every chunk, the image boundaries a 1x1 chunk crosses and
    the last partial chunk all get it (against the reference), with the residual added first."""
    from tilefuse.kernels.conv.epilogue import ACT_CHUNK
    x, wt, b, res, kw = _data(path, seed=3)
    base = ref.conv2d(x, wt, b, kw["stride"], kw["padding"], kw["dilation"], kw["groups"], residual=res)
    assert base[0, 0].size * 3 * 16 > ACT_CHUNK      # more than one chunk per image
    for name, params in (("silu", ()), ("gelu", ()), ("hardswish", ())):
        _, al, be = A.normalize(name, params)
        want = A.reference(name, base, al, be)
        got, _ = _run(path, x, wt, b, res, kw, act=A.encode(name, al, be))
        err = np.abs(got - want).max() / max(1.0, float(np.abs(want).max()))
        assert err <= TOL[path[1]], f"{path[0]} act {name}: max error {err:.3g}"


def test_k1x1_and_stem_keep_activation_bits_across_threads():
    path = next(p for p in PATHS if p[0] == "nchwc-gemm1x1")
    x, wt, b, res, kw = _data(path, seed=2)
    prep = k1x1.prepare(wt, b)
    outs = []
    for t in (1, 2, 3):
        ob = np.empty(nchwc_shape(res.shape), np.float32)
        k1x1.run_nchwc(ob, to_nchwc(x), prep, to_nchwc(res), act=A.encode("silu"), threads=t)
        outs.append(ob)
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


def test_resolve_act_errors_name_the_problem():
    assert resolve_act(True, None) == (1, 0.0, 0.0) and resolve_act(False, None)[0] == 0
    assert resolve_act(False, "clip") == (2, np.float32(-np.inf), np.float32(np.inf))
    code, al, be = resolve_act(False, [4, 0.2, 0.5])  # a JSON list (program params) works too
    assert code == 4 and al.dtype == np.float32 and al == np.float32(0.2)
    with pytest.raises(ValueError, match="conv: relu=True and act=sigmoid both given"):
        resolve_act(True, A.encode("sigmoid"))
    with pytest.raises(ValueError, match="unknown activation code 99"):
        resolve_act(False, (99, 0.0, 0.0))
    with pytest.raises(ValueError, match="unknown activation 'swish2'"):
        resolve_act(False, ("swish2", 0.0, 0.0))
    with pytest.raises(ValueError, match="must be \\(code, alpha, beta\\)"):
        resolve_act(False, 5)
    with pytest.raises(ValueError, match="NaN"):
        resolve_act(False, (2, float("nan"), 1.0))
    x = np.zeros((1, 16, 4, 4), np.float32)
    prep = conv2d_prepare("im2col", np.zeros((16, 16, 1, 1), np.float32), None, 1, 0, 1, 1)
    with pytest.raises(ValueError, match=r"conv2d_run\(im2col\): unknown activation 'swish2'"):
        conv2d_run("im2col", np.zeros_like(x), x, prep, stride=1, padding=0, dilation=1, groups=1, act="swish2")


def test_im2col_run_to_nchwc_direct_call_has_every_activation():
    """im2col.run_to_nchwc (more than 4 input channels; fewer go to the stem kernel) directly."""
    path = next(p for p in PATHS if p[0] == "to_nchwc-im2col")
    x, wt, b, res, kw = _data(path, seed=3)
    prep = conv2d_prepare("im2col", wt, b, kw["stride"], kw["padding"], kw["dilation"], 1)
    base = ref.conv2d(x, wt, b, kw["stride"], kw["padding"], kw["dilation"], 1, residual=res)
    ob = np.empty(nchwc_shape(res.shape), np.float32)
    im2col.run_to_nchwc(ob, x, prep, to_nchwc(res), stride=kw["stride"], padding=kw["padding"],
                        dilation=kw["dilation"], act=A.encode("gelu"))
    np.testing.assert_allclose(from_nchwc(ob, wt.shape[0]), A.reference("gelu", base), atol=1e-4 * np.abs(base).max())


# ---------------------------------------------------------------- the conv front door (conv.bind)
def test_bind_runs_every_form_like_the_per_call_entry_points():
    """A bound layer gives the bits of the per-call entry points, for every form and algorithm."""
    from tilefuse.kernels import conv
    for path in PATHS:
        name, alg = path[0], path[1]
        if name in ("nchwc-gemm1x1-blas", "nchwc-direct-prepadded"):
            continue  # not a front-door form (the BLAS 1x1 on NCHWc; direct_nchwc on a padded input)
        x, wt, b, res, kw = _data(path, seed=4)
        form = "nchw" if name.startswith("nchw-") else "nchwc" if name.startswith("nchwc") else "nchw>nchwc"
        lay = "nchwc" if form == "nchwc" else "nchw"
        prep = conv2d_prepare(alg, wt, b, kw["stride"], kw["padding"], kw["dilation"], kw["groups"], layout=lay)
        want, _ = _run(path, x, wt, b, res, kw, act=A.encode("hardswish"))
        xin = to_nchwc(x) if form == "nchwc" else x
        rin = res if form == "nchw" else to_nchwc(res)
        out = np.full(rin.shape, np.nan, np.float32)
        layer = conv.bind(alg, xin.shape, out.shape, prep, has_residual=True, act=A.encode("hardswish"), layout=lay,
                          out_layout="nchwc" if form == "nchw>nchwc" else None, threads=2, **kw)
        layer(out, xin, prep, rin)
        got = out if form == "nchw" else from_nchwc(out, wt.shape[0])
        assert np.array_equal(got, want), name
        d = layer.describe()
        assert d["form"] == form and d["tasks"] >= 1 and d["activation"] == "hardswish" and d["threads"] == 2


def test_bind_errors_say_found_and_expected():
    from tilefuse.kernels import conv
    wt = np.zeros((32, 16, 3, 3), np.float32)
    prep = conv2d_prepare("direct", wt, None, 1, 1, 1, 1, layout="nchwc")
    kw = dict(stride=1, padding=1, dilation=1, layout="nchwc")
    x, out = (1, 1, 8, 8, 16), (1, 2, 8, 8, 16)
    assert conv.bind("direct", x, out, prep, **kw).describe()["partitioning"]
    cases = [
        (dict(out_shape=(1, 2, 7, 8, 16)), r"out has shape \(1, 2, 7, 8, 16\), expected \(1, 2, 8, 8, 16\)"),
        (dict(x_shape=(1, 2, 8, 8, 16)), "input has 32 channels, the weights expect 16"),
        (dict(x_shape=(1, 16, 8, 8)), r"x has shape \(1, 16, 8, 8\), expected NCHW16c"),
        (dict(algorithm="fft"), "unknown conv algorithm"),
        (dict(algorithm="im2col"), "no NCHWc form"),
        (dict(layout="nhwc"), "layout 'nhwc'"),
        (dict(dtype=np.float64), "take float32, found float64"),
        (dict(act=("swish2", 0, 0)), "unknown activation 'swish2'"),
        (dict(prepared={"bias": prep["bias"]}), "no 'weight'"),
    ]
    for change, msg in cases:
        args = dict(algorithm="direct", x_shape=x, out_shape=out, prepared=prep, **kw)
        args.update(change)
        with pytest.raises(ValueError, match=msg):
            conv.bind(**args)
