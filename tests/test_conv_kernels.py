"""Fast conv kernels (tilefuse.kernels.conv) against the reference conv2d (the spec).

Tolerances: max |fast - ref| <= TOL[algorithm] * max(|ref|, 1), per algorithm, with the reason.
"""
from __future__ import annotations

import numpy as np
import pytest

from tilefuse.kernels import reference as ref
from tilefuse.kernels.conv import (ALGORITHMS, NCHWC_ALGORITHMS, candidates, conv2d_prepare, conv2d_run,
                                   conv2d_run_nchwc, conv2d_run_to_nchwc, direct_nchwc, estimate_cost, from_nchwc,
                                   nchwc_shape, select_algorithm, to_nchwc)
from tilefuse.kernels.conv import planner, winograd
from tilefuse.kernels.conv.epilogue import resolve_act
from tilefuse.kernels.conv.select import algorithm_flops

TOL = {
    # same products as the reference, only the fp32 summation order differs (blocked K, FMA)
    "gemm1x1": 1e-4,
    "direct": 1e-4,
    "im2col": 1e-4,
    "depthwise": 1e-4,   # same products, taps summed kh then kw (tests/test_depthwise.py covers it fully)
    "grouped": 1e-4,     # the direct kernel per block group (zero weights between groups add +0)
    # transforms with coefficients up to 1 (B, A) / 1/2 (G) add a few roundings per output
    "winograd2": 1e-3,
    # F(4,3): coefficients up to 8 in A^T and 5 in B^T amplify rounding ~10x (docs/kernels.md)
    "winograd4": 5e-3,
}

# (name, N, Ci, H, W, Co, k, stride, padding (t, b, l, r), dilation, groups)
# ResNet50 / VGG16 / AlexNet layers keep their channel counts, spatial size reduced.
SHAPES = [
    ("r50_stem_7x7s2", 1, 3, 32, 32, 64, 7, 2, (3, 3, 3, 3), 1, 1),
    ("r50_1x1_256_64", 1, 256, 14, 14, 64, 1, 1, (0, 0, 0, 0), 1, 1),
    ("r50_1x1_512_128", 1, 512, 7, 7, 128, 1, 1, (0, 0, 0, 0), 1, 1),
    ("r50_1x1_1024_256", 1, 1024, 7, 7, 256, 1, 1, (0, 0, 0, 0), 1, 1),
    ("r50_1x1_2048_512", 1, 2048, 7, 7, 512, 1, 1, (0, 0, 0, 0), 1, 1),
    ("r50_1x1s2_512_1024", 1, 512, 14, 14, 1024, 1, 2, (0, 0, 0, 0), 1, 1),
    ("r50_3x3_64", 1, 64, 14, 14, 64, 3, 1, (1, 1, 1, 1), 1, 1),
    ("r50_3x3_128", 1, 128, 14, 14, 128, 3, 1, (1, 1, 1, 1), 1, 1),
    ("r50_3x3_256", 1, 256, 7, 7, 256, 3, 1, (1, 1, 1, 1), 1, 1),
    ("r50_3x3_512", 1, 512, 7, 7, 512, 3, 1, (1, 1, 1, 1), 1, 1),
    ("r50_3x3s2_128", 1, 128, 14, 14, 128, 3, 2, (1, 1, 1, 1), 1, 1),
    ("vgg_3x3_3_64", 1, 3, 16, 16, 64, 3, 1, (1, 1, 1, 1), 1, 1),
    ("vgg_3x3_64_128", 1, 64, 16, 16, 128, 3, 1, (1, 1, 1, 1), 1, 1),
    ("vgg_3x3_256_256", 1, 256, 8, 8, 256, 3, 1, (1, 1, 1, 1), 1, 1),
    ("vgg_3x3_512_512", 1, 512, 7, 7, 512, 3, 1, (1, 1, 1, 1), 1, 1),
    ("alex_11x11s4", 1, 3, 63, 63, 64, 11, 4, (2, 2, 2, 2), 1, 1),
    ("alex_5x5", 1, 64, 15, 15, 192, 5, 1, (2, 2, 2, 2), 1, 1),
    ("alex_3x3_192_384", 1, 192, 7, 7, 384, 3, 1, (1, 1, 1, 1), 1, 1),
    ("alex_3x3_384_256", 1, 384, 7, 7, 256, 3, 1, (1, 1, 1, 1), 1, 1),
    ("odd_1x1_7x7", 1, 17, 7, 7, 33, 1, 1, (0, 0, 0, 0), 1, 1),
    ("odd_3x3_13x17", 1, 17, 13, 17, 33, 3, 1, (1, 1, 1, 1), 1, 1),
    ("odd_5x5s2", 1, 3, 15, 15, 20, 5, 2, (2, 2, 2, 2), 1, 1),
    ("odd_asym_pad", 1, 16, 11, 9, 17, 3, 1, (2, 1, 0, 2), 1, 1),
    ("odd_batch3", 3, 33, 9, 10, 16, 3, 1, (1, 1, 1, 1), 1, 1),
    ("odd_dilation2", 1, 16, 12, 12, 32, 3, 1, (2, 2, 2, 2), 2, 1),
    ("odd_groups2", 2, 32, 9, 9, 48, 3, 1, (1, 1, 1, 1), 1, 2),
    ("odd_depthwise", 1, 32, 10, 10, 32, 3, 2, (1, 1, 1, 1), 1, 32),
    ("odd_depthwise_mult2", 1, 8, 9, 9, 16, 3, 1, (1, 0, 1, 0), 1, 8),
    ("odd_1x1_pad", 1, 16, 6, 6, 16, 1, 1, (1, 1, 1, 1), 1, 1),
    ("odd_3x3_s3", 1, 17, 13, 13, 17, 3, 3, (0, 1, 1, 0), 1, 1),
]
EPILOGUES = ["none", "bias", "bias_relu", "bias_res_relu"]


def _case(shape, epi, seed=0):
    name, n, ci, h, w, co, k, s, pad, d, g = shape
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, ci, h, w), dtype=np.float32)
    wt = (rng.standard_normal((co, ci // g, k, k), dtype=np.float32) / np.sqrt(ci // g * k * k)).astype(np.float32)
    b = rng.standard_normal(co, dtype=np.float32) if epi != "none" else None
    ho = ref.conv_out_size(h, k, s, pad[0], pad[1], d)
    wo = ref.conv_out_size(w, k, s, pad[2], pad[3], d)
    res = rng.standard_normal((n, co, ho, wo), dtype=np.float32) if "res" in epi else None
    relu = "relu" in epi
    kw = dict(stride=(s, s), padding=pad, dilation=(d, d), groups=g)
    want = ref.conv2d(x, wt, b, kw["stride"], pad, kw["dilation"], g, residual=res, relu=relu)
    return x, wt, b, res, relu, kw, want


def _run(alg, x, wt, b, res, relu, kw, threads=None):
    prep = conv2d_prepare(alg, wt, b, kw["stride"], kw["padding"], kw["dilation"], kw["groups"])
    for key, v in prep.items():
        assert isinstance(v, np.ndarray) and v.dtype == np.float32, (alg, key)
    out = np.full((x.shape[0], wt.shape[0]) + _out_hw(x, wt, kw), np.nan, np.float32)
    conv2d_run(alg, out, x, prep, res, relu=relu, threads=threads, **kw)
    return out


def _out_hw(x, wt, kw):
    k = wt.shape[2]
    p, s, d = kw["padding"], kw["stride"][0], kw["dilation"][0]
    return (ref.conv_out_size(x.shape[2], k, s, p[0], p[1], d), ref.conv_out_size(x.shape[3], k, s, p[2], p[3], d))


def _check(alg, got, want):
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.isfinite(got).all(), f"{alg}: non-finite output (unwritten elements?)"
    err = np.abs(got - want).max() / max(1.0, float(np.abs(want).max()))
    assert err <= TOL[alg], f"{alg}: max error {err:.3g} > {TOL[alg]} (rel. to max|ref|)"


CASES = [(shape, alg, EPILOGUES[i % 4])
         for i, shape in enumerate(SHAPES)
         for alg in candidates((shape[1], shape[2], shape[3], shape[4]), (shape[5], shape[2] // shape[10], shape[6],
                                                                          shape[6]),
                               (shape[7],) * 2, shape[8], (shape[9],) * 2, shape[10])]


@pytest.mark.parametrize("shape,alg,epi", CASES, ids=[f"{s[0]}-{a}-{e}" for s, a, e in CASES])
def test_against_reference(shape, alg, epi):
    x, wt, b, res, relu, kw, want = _case(shape, epi)
    _check(alg, _run(alg, x, wt, b, res, relu, kw), want)


def test_every_algorithm_is_covered():
    assert {a for _, a, _ in CASES} == set(ALGORITHMS)


@pytest.mark.parametrize("alg", ALGORITHMS)
@pytest.mark.parametrize("epi", EPILOGUES)
def test_epilogues(alg, epi):
    shape = ("epi", 2, 20, 10, 11, 24, 1 if alg == "gemm1x1" else 3, 1, (0, 0, 0, 0) if alg == "gemm1x1" else
             (1, 1, 1, 1), 1, 1)
    if alg in GROUPED_SHAPES:
        shape = GROUPED_SHAPES[alg]
    x, wt, b, res, relu, kw, want = _case(shape, epi, seed=1)
    _check(alg, _run(alg, x, wt, b, res, relu, kw), want)


THREAD_SHAPES = {
    "gemm1x1": ("t", 3, 64, 20, 20, 80, 1, 2, (0, 0, 0, 0), 1, 1),
    "direct": ("t", 3, 40, 23, 21, 40, 3, 1, (1, 1, 1, 1), 1, 1),
    "winograd2": ("t", 3, 40, 23, 21, 40, 3, 1, (1, 1, 1, 1), 1, 1),
    "winograd4": ("t", 3, 40, 33, 29, 40, 3, 1, (1, 1, 1, 1), 1, 1),
    "im2col": ("t", 3, 32, 23, 21, 48, 3, 1, (1, 1, 1, 1), 1, 2),
    "depthwise": ("t", 3, 40, 23, 21, 40, 3, 1, (1, 1, 1, 1), 1, 40),
    "grouped": ("t", 3, 32, 23, 21, 48, 3, 1, (1, 1, 1, 1), 1, 2),
}
# the grouped algorithms' epilogue shapes (groups == C_in; block groups of 2 x 16 in, 3 x 16 out)
GROUPED_SHAPES = {"depthwise": ("epi", 2, 20, 10, 11, 20, 3, 1, (1, 1, 1, 1), 1, 20),
                  "grouped": ("epi", 2, 32, 10, 11, 48, 3, 1, (1, 1, 1, 1), 1, 2)}


@pytest.mark.parametrize("alg", ALGORITHMS)
def test_one_and_two_threads_bitwise_identical(alg):
    x, wt, b, res, relu, kw, want = _case(THREAD_SHAPES[alg], "bias_res_relu", seed=2)
    o1 = _run(alg, x, wt, b, res, relu, kw, threads=1)
    o2 = _run(alg, x, wt, b, res, relu, kw, threads=2)
    o3 = _run(alg, x, wt, b, res, relu, kw, threads=None)
    assert np.array_equal(o1, o2) and np.array_equal(o1, o3)
    _check(alg, o1, want)


def test_direct_nchwc_native():
    x, wt, b, res, relu, kw, want = _case(("n", 2, 20, 9, 12, 24, 3, 2, (1, 2, 0, 1), 1, 1), "bias_res_relu", 3)
    prep = conv2d_prepare("direct", wt, b, kw["stride"], kw["padding"], kw["dilation"], 1)
    xb = to_nchwc(x, kw["padding"])
    rb = to_nchwc(res)
    ob = np.empty(rb.shape, np.float32)
    direct_nchwc(ob, xb, prep, rb, stride=kw["stride"], dilation=kw["dilation"], relu=True)
    _check("direct", from_nchwc(ob, 24), want)


def test_layout_roundtrip_and_padding():
    x = np.random.default_rng(4).standard_normal((2, 19, 5, 6), dtype=np.float32)
    xb = to_nchwc(x, (1, 2, 3, 0))
    assert xb.shape == (2, 2, 8, 9, 16)
    assert np.array_equal(from_nchwc(xb[:, :, 1:6, 3:9], 19), x)
    assert not xb[:, 1, :, :, 3:].any() and not xb[:, :, 0].any()


@pytest.mark.parametrize("m", [2, 4])
def test_winograd_matrices_are_exact(m):
    assert winograd.check_transform(m) < 1e-12


def test_winograd_generated_source_is_current():
    import pathlib
    path = pathlib.Path(winograd.__file__).with_name("_winograd_gen.py")
    assert path.read_text() == winograd.generate_transform_source(), "run: python -m tilefuse.kernels.conv.winograd"


RESNET_3X3 = [((32, c, s, s), (c, c, 3, 3)) for c, s in ((64, 56), (128, 28), (256, 14), (512, 7))]
RESNET_1X1 = [((32, ci, s, s), (co, ci, 1, 1)) for ci, co, s in ((256, 64, 56), (512, 128, 28), (1024, 256, 14),
                                                                 (2048, 512, 7))]


@pytest.mark.parametrize("host", ["base", "intel-avx512"])
def test_select_algorithm(host, monkeypatch):
    monkeypatch.setenv("TILEFUSE_COST_HOST", host)      # every call below without host= uses this kind
    one = ((1, 1), (1, 1, 1, 1), (1, 1), 1)
    for xs, ws in RESNET_3X3:
        assert select_algorithm(xs, ws, *one).startswith("winograd")
        assert select_algorithm(xs, ws, *one, allow_winograd=False) == "direct"
    for xs, ws in RESNET_1X1:
        assert select_algorithm(xs, ws, (1, 1), (0, 0, 0, 0), (1, 1), 1) == "gemm1x1"
    # batch 1, 7x7, 512 channels: F(4x4) has 4 tiles and a 37.7 MB U to stream (measured 1.6x slower
    # than direct, select.WEIGHT_BW)
    assert select_algorithm((1, 512, 7, 7), (512, 512, 3, 3), *one) == "direct"
    # batch 1, 14x14: Winograd on the base host, direct on an Intel AVX-512 core (its strip 1.6x the
    # base rate, F(4x4)'s 9.4 MB U at 6.5 GB/s: select.HOST_RATES), on one and two threads; at 16
    # threads direct on both (parallel_cost, base rates); 28x28 and 56x56 keep F(4x4) on both
    b1_14 = ((1, 256, 14, 14), (256, 256, 3, 3), *one)
    for t in (1, 2):
        got = select_algorithm(*b1_14, threads=t)
        assert got.startswith("winograd") if host == "base" else got == "direct", (host, t, got)
    assert select_algorithm(*b1_14, threads=16) == "direct"
    for c, hw in ((128, 28), (64, 56)):
        for t in (1, 2, 16):
            assert select_algorithm((1, c, hw, hw), (c, c, 3, 3), *one, threads=t) == "winograd4", (c, hw, t)
    assert select_algorithm((1, 32, 8, 8), (32, 1, 3, 3), *one[:3], 32) == "depthwise"
    assert select_algorithm((1, 32, 8, 8), (64, 16, 3, 3), *one[:3], 2) == "grouped"
    assert select_algorithm((1, 64, 9, 9), (64, 64, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1) in ("direct", "im2col")
    assert "winograd4" not in candidates((1, 64, 9, 9), (64, 64, 3, 3), (1, 1), (1, 1, 1, 1), (2, 2), 1)


def test_cost_host_kind():
    from tilefuse.kernels import isa
    from tilefuse.kernels.conv.select import HOST_RATES, estimate_cost
    assert isa.cost_host_of("emeraldrapids", 512) == isa.cost_host_of("icelake-server", 512) == "intel-avx512"
    # LLVM's own 256-bit tuning kept (TILEFUSE_VECTOR_BITS=256), an AMD core, a client core: the base rates
    assert isa.cost_host_of("emeraldrapids", 256) == isa.cost_host_of("znver4", 512) == "base"
    assert isa.cost_host_of("znver3", 256) == isa.cost_host_of("tigerlake", 512) == "base"
    # a server core a hypervisor reports as a client model (rocketlake) has AMX tiles; a real Rocket Lake does not
    assert isa.cost_host_of("rocketlake", 512, "+avx512f,+amx-bf16,+amx-tile") == "intel-avx512"
    assert isa.cost_host_of("rocketlake", 512, "+avx512f,-amx-tile") == "base"
    assert isa.cost_host_of("rocketlake", 256, "+avx512f,+amx-tile") == "base"
    assert isa.cost_host() in HOST_RATES
    args = ((1, 256, 14, 14), (256, 256, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    base, intel = (estimate_cost("direct", *args, host=h) for h in ("base", "intel-avx512"))
    assert intel < base
    with pytest.raises(ValueError, match="expected one of"):
        estimate_cost("direct", *args, host="zen9")



@pytest.mark.parametrize("x_shape, w_shape, stride, groups", [
    ((1, 440, 2, 2), (440, 8, 3, 3), 2, 55),     # RegNetY's last stage at 32x32 images: 1x1 outputs
    ((1, 440, 1, 1), (440, 8, 3, 3), 1, 55),
    ((1, 208, 4, 4), (208, 8, 3, 3), 1, 26),
    ((1, 64, 8, 8), (64, 2, 3, 3), 1, 32),
])
def test_select_algorithm_counts_im2col_python_tasks(x_shape, w_shape, stride, groups):
    """im2col runs a Python call per image x group x band (~6.5 us each, no faster on more threads): on small
    grouped convs that is most of its time, and the blocked grouped kernel wins by 10x (355 against 28 us at
    the first shape, one Zen 3 core). Without the per-task term the model picked im2col on each of these."""
    from tilefuse.kernels.conv.select import IM2COL_TASK_S, estimate_cost
    args = (x_shape, w_shape, (stride, stride), (1, 1, 1, 1), (1, 1), groups)
    assert select_algorithm(*args) == "grouped"
    assert estimate_cost("im2col", *args) >= groups * IM2COL_TASK_S
    # a 3-channel stem runs im2col as the stem kernel (stem.py): no Python task per band
    stem = ((1, 3, 224, 224), (32, 3, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1)
    assert estimate_cost("im2col", *stem) < 100 * IM2COL_TASK_S

def test_cost_model_winograd_saves_multiplies():
    # the GEMM stage of F(4,3) does < 0.6 of the direct kernel's work on a ResNet 3x3 layer
    xs, ws = RESNET_3X3[0]
    one = ((1, 1), (1, 1, 1, 1), (1, 1), 1)
    assert algorithm_flops("winograd4", xs, ws, *one) < 0.6 * algorithm_flops("direct", xs, ws, *one)
    assert algorithm_flops("winograd2", xs, ws, *one) < 0.6 * algorithm_flops("direct", xs, ws, *one)
    # and the cost model, transforms included, still prefers it
    assert estimate_cost("winograd4", xs, ws, *one) < min(estimate_cost("winograd2", xs, ws, *one),
                                                          estimate_cost("direct", xs, ws, *one))


def test_selection_knows_the_thread_count(monkeypatch):
    """On 16 threads a batch-1 14x14 layer's F(4x4) has 16 tiles: its largest tasks hold two 7-tile
    blocks and each streams 1.18 MB of U (406-433 us a layer on the 16-core device machine, where
    direct with the same output ran 307 us), so the thread-aware model picks direct there; on one or
    two threads, at batch 32, and on the larger maps it keeps the one-thread pick (the base host
    kind's: on an Intel AVX-512 core the one-thread pick at 14x14 is direct, test_select_algorithm)."""
    from tilefuse.kernels.conv.select import parallel_cost
    monkeypatch.setenv("TILEFUSE_COST_HOST", "base")
    one = ((1, 1), (1, 1, 1, 1), (1, 1), 1)
    xs, ws = (1, 256, 14, 14), (256, 256, 3, 3)
    for t in (1, 2):
        assert select_algorithm(xs, ws, *one, threads=t) == "winograd4"
    assert select_algorithm(xs, ws, *one, threads=16) == "direct"
    assert select_algorithm((32, 256, 14, 14), ws, *one, threads=16) == "winograd4"
    assert select_algorithm((1, 128, 28, 28), (128, 128, 3, 3), *one, threads=16) == "winograd4"
    assert select_algorithm((1, 512, 7, 7), (512, 512, 3, 3), *one, threads=2) == "direct"
    for a in ("direct", "winograd4", "gemm1x1"):
        w = ws if a != "gemm1x1" else (256, 256, 1, 1)
        o = one if a != "gemm1x1" else ((1, 1), (0, 0, 0, 0), (1, 1), 1)
        assert parallel_cost(a, xs, w, *o, 1) == estimate_cost(a, xs, w, *o)
    # the 16-thread Winograd makespan is the largest task's, not a sixteenth of the one-thread cost
    assert parallel_cost("winograd4", xs, ws, *one, 16) > 2 * estimate_cost("winograd4", xs, ws, *one) / 16


def test_bad_algorithm_errors():
    w = np.zeros((8, 8, 3, 3), np.float32)
    with pytest.raises(ValueError, match="unknown conv algorithm 'fft'"):
        conv2d_prepare("fft", w, None, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    with pytest.raises(ValueError, match="cannot run weight"):
        conv2d_prepare("winograd2", w, None, (2, 2), (1, 1, 1, 1), (1, 1), 1)
    with pytest.raises(ValueError, match="cannot run weight"):
        conv2d_prepare("gemm1x1", w, None, (1, 1), (1, 1, 1, 1), (1, 1), 1)


def test_planner_reads_and_overrides_cache_sizes():
    c = planner.cache_sizes()
    assert 8 << 10 <= c.l1d <= 1 << 20 and c.l1d < c.l2
    try:
        planner.set_cache_sizes(l2=256 << 10)
        small = planner.plan_gemm1x1(1024, 256, 196)
        planner.set_cache_sizes(l2=4 << 20)
        big = planner.plan_gemm1x1(1024, 256, 196)
        assert small["Nb"] < big["Nb"] and small["Nb"] % 16 == 0
        assert 1024 * small["Nb"] * 4 <= (256 << 10) / 2
    finally:
        planner.set_cache_sizes()
    assert planner.cache_sizes() == c


# NCHW16c forms (the layout the compiler keeps between layers) ---------------------------------
NCHWC_CASES = [(shape, alg, EPILOGUES[i % 4]) for i, (shape, alg, _) in enumerate(CASES) if alg in NCHWC_ALGORITHMS]


@pytest.mark.parametrize("shape,alg,epi", NCHWC_CASES, ids=[f"{s[0]}-{a}-{e}" for s, a, e in NCHWC_CASES])
def test_nchwc_forms_against_reference(shape, alg, epi):
    """Unpadded blocked input, blocked output; padded output channels must come out zero."""
    x, wt, b, res, relu, kw, want = _case(shape, epi)
    prep = conv2d_prepare(alg, wt, b, kw["stride"], kw["padding"], kw["dilation"], kw["groups"], layout="nchwc")
    ob = np.full(nchwc_shape(want.shape), np.nan, np.float32)
    conv2d_run_nchwc(alg, ob, to_nchwc(x), prep, to_nchwc(res) if res is not None else None, relu=relu, **kw)
    co = want.shape[1]
    assert not ob[:, -1, ..., co - (ob.shape[1] - 1) * 16:].any(), "padded channels must be zero"
    _check(alg, from_nchwc(ob, co), want)


@pytest.mark.parametrize("alg", NCHWC_ALGORITHMS)
def test_nchwc_one_and_two_threads_bitwise_identical(alg):
    x, wt, b, res, relu, kw, _ = _case(THREAD_SHAPES[alg], "bias_res_relu", seed=2)
    prep = conv2d_prepare(alg, wt, b, kw["stride"], kw["padding"], kw["dilation"], kw["groups"], layout="nchwc")
    outs = []
    for t in (1, 2):
        ob = np.empty(nchwc_shape((x.shape[0], wt.shape[0]) + _out_hw(x, wt, kw)), np.float32)
        conv2d_run_nchwc(alg, ob, to_nchwc(x), prep, to_nchwc(res), relu=relu, threads=t, **kw)
        outs.append(ob)
    assert np.array_equal(outs[0], outs[1])


@pytest.mark.parametrize("name", ["r50_stem_7x7s2", "alex_11x11s4", "odd_5x5s2"])
def test_im2col_writes_nchwc(name):
    shape = next(s for s in SHAPES if s[0] == name)
    x, wt, b, res, relu, kw, want = _case(shape, "bias_res_relu")
    prep = conv2d_prepare("im2col", wt, b, kw["stride"], kw["padding"], kw["dilation"], 1)
    ob = np.full(nchwc_shape(want.shape), np.nan, np.float32)
    conv2d_run_to_nchwc("im2col", ob, x, prep, to_nchwc(res), relu=relu, **kw)
    assert np.isfinite(ob).all()
    _check("im2col", from_nchwc(ob, want.shape[1]), want)


def test_nchwc_errors_name_the_problem():
    wt = np.zeros((16, 16, 3, 3), np.float32)
    with pytest.raises(ValueError, match="no NCHWc form"):
        conv2d_prepare("im2col", wt, None, (1, 1), (1, 1, 1, 1), (1, 1), 1, layout="nchwc")
    prep = conv2d_prepare("direct", wt, None, (1, 1), (1, 1, 1, 1), (1, 1), 1, layout="nchwc")
    with pytest.raises(ValueError, match=r"\(N, C/16, H, W, 16\)"):
        conv2d_run_nchwc("direct", np.zeros((1, 16, 4, 4), np.float32), np.zeros((1, 1, 4, 4, 16), np.float32),
                         prep, stride=1, padding=1, dilation=1, relu=False)


# The numba NCHW16c 1x1 kernel (k1x1.py: what gemm1x1 runs on NCHW16c) -------------------------
K1X1_SHAPES = [
    ("k_7x7_2048_512", 1, 2048, 7, 7, 512, 1, 1, (0, 0, 0, 0), 1, 1),    # ResNet50 stage 5, batch 1
    ("k_14x14_1024_256", 1, 1024, 14, 14, 256, 1, 1, (0, 0, 0, 0), 1, 1),
    ("k_7x7_odd", 1, 17, 7, 7, 33, 1, 1, (0, 0, 0, 0), 1, 1),            # Ci, Co not multiples of 16, odd Ob
    ("k_7x7_b3", 3, 64, 7, 7, 48, 1, 1, (0, 0, 0, 0), 1, 1),             # blocks of 7 span images
    ("k_s2_odd", 3, 40, 9, 11, 24, 1, 2, (0, 0, 0, 0), 1, 1),            # stride 2 on an odd map
    ("k_s2_r50", 1, 256, 14, 14, 512, 1, 2, (0, 0, 0, 0), 1, 1),         # ResNet50 projection, stride 2
    ("k_1x5", 1, 16, 1, 5, 16, 1, 1, (0, 0, 0, 0), 1, 1),                # fewer positions than one block
    ("k_s2x1", 2, 32, 8, 9, 32, 1, 1, (0, 0, 0, 0), 1, 1),
]
K1X1_CASES = [(s, e) for s in K1X1_SHAPES for e in EPILOGUES]


@pytest.mark.parametrize("shape,epi", K1X1_CASES, ids=[f"{s[0]}-{e}" for s, e in K1X1_CASES])
def test_k1x1_against_reference(shape, epi):
    from tilefuse.kernels.conv import k1x1
    x, wt, b, res, relu, kw, want = _case(shape, epi)
    if shape[0] == "k_s2x1":
        kw["stride"] = (2, 1)
        want = ref.conv2d(x, wt, b, (2, 1), (0, 0, 0, 0), (1, 1), 1, relu=relu)
        res = None
    prep = k1x1.prepare(wt, b)
    ob = np.full(nchwc_shape(want.shape), np.nan, np.float32)
    k1x1.run_nchwc(ob, to_nchwc(x), prep, to_nchwc(res) if res is not None else None, stride=kw["stride"],
                   relu=relu)
    co = want.shape[1]
    assert not ob[:, -1, ..., co - (ob.shape[1] - 1) * 16:].any(), "padded channels must be zero"
    _check("gemm1x1", from_nchwc(ob, co), want)


@pytest.mark.parametrize("name", ["k_7x7_2048_512", "k_s2_odd", "k_7x7_b3"])
@pytest.mark.parametrize("q_outer", [None, True, False])
def test_k1x1_one_and_two_threads_bitwise_identical(name, q_outer):
    """Task boundaries come from the shape only and each output is one full-K dot product: any
    thread count (and either loop order) gives the same bits."""
    from tilefuse.kernels.conv import k1x1
    shape = next(s for s in K1X1_SHAPES if s[0] == name)
    x, wt, b, res, relu, kw, _ = _case(shape, "bias_res_relu", seed=3)
    prep = k1x1.prepare(wt, b)
    outs = []
    try:
        k1x1.Q_OUTER = q_outer
        for t in (1, 2, 2):
            ob = np.empty(nchwc_shape((x.shape[0], wt.shape[0]) + _out_hw(x, wt, kw)), np.float32)
            conv2d_run_nchwc("gemm1x1", ob, to_nchwc(x), prep, to_nchwc(res), relu=relu, threads=t, **kw)
            outs.append(ob)
    finally:
        k1x1.Q_OUTER = None
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


@pytest.mark.parametrize("name", ["k_s2_odd", "k_7x7_b3", "k_1x5", "k_7x7_odd"])
@pytest.mark.parametrize("q_outer", [True, False])
def test_k1x1_software_prefetch_does_not_change_bits(name, q_outer):
    """The software prefetch (input PF_BLOCKS blocks ahead, output with write intent) is a hint:
    every distance, on or off, gives the same bits, and prefetch targets past the task's end
    (clamped to its last position) stay inside the arrays."""
    from tilefuse.kernels.conv import k1x1
    shape = next(s for s in K1X1_SHAPES if s[0] == name)
    x, wt, b, res, relu, kw, want = _case(shape, "bias_res_relu", seed=5)
    prep = k1x1.prepare(wt, b)
    old = (k1x1.PF_BLOCKS, k1x1.PF_OUT, k1x1.Q_OUTER)
    outs = []
    try:
        k1x1.Q_OUTER = q_outer
        for pfd, pfo in ((0, False), (1, False), (1, True), (3, True)):
            k1x1.PF_BLOCKS, k1x1.PF_OUT = pfd, pfo
            for t in (1, 2):
                ob = np.empty(nchwc_shape(want.shape), np.float32)
                conv2d_run_nchwc("gemm1x1", ob, to_nchwc(x), prep, to_nchwc(res), relu=relu, threads=t, **kw)
                outs.append(ob)
    finally:
        k1x1.PF_BLOCKS, k1x1.PF_OUT, k1x1.Q_OUTER = old
    assert all(np.array_equal(outs[0], o) for o in outs[1:])
    _check("gemm1x1", from_nchwc(outs[0], want.shape[1]), want)


def _whole_tiles(q: int) -> bool:
    """A k1x1 task's positions: whole tiles (RB1X1), except on AVX2 hosts, whose assembly strip runs any count."""
    return planner.ASM_AVX2 or q % planner.RB1X1 == 0


@pytest.mark.parametrize("l2", [1 << 20, 2 << 20])
def test_k1x1_plan_splits_channels_on_small_maps(l2):
    """With a 1-2 MiB L2 (Zen 4, Emerald Rapids) the 7x7 map's input block (49 x 2048 x 4 B) fits the
    L2 rule, so a batch-1 layer is split by output channels only (the plan depends on the host's L2:
    pinned here, the host's own L2 is tested below)."""
    planner.set_cache_sizes(l2=l2)
    try:
        for t in (2, 8, 16):                            # ResNet50 1x1 on 7x7, batch 1: Co split, t tasks
            p = planner.plan_k1x1(2048, 16, 49, threads=t)
            assert p["Q"] >= 49 and p["P"] == 16 // t and p["tasks"] == t and p["partitioning"].startswith("Co split")
        assert planner.plan_k1x1(2048, 16, 49, threads=1)["tasks"] == 1
    finally:
        planner.set_cache_sizes()


def test_k1x1_plan_small_l2_keeps_the_l2_rule():
    """A 512 KiB L2 (Zen 2/3): a 14x14 map of 2048 channels (1.6 MB) does not fit, so its position
    blocks keep the L2/2 rule; a whole 7x7 map (442 KB: within WHOLE_MAP_L2 of the L2) may be one
    block, and the cores then split the output channels instead of each streaming all the weights;
    every task still has work for each thread count."""
    planner.set_cache_sizes(l2=512 << 10)
    try:
        for t in (1, 2, 8, 16):
            p = planner.plan_k1x1(2048, 16, 196, threads=t)
            assert _whole_tiles(p["Q"]) and p["Q"] * 2048 * 4 <= (512 << 10) / 2 and p["tasks"] >= min(t, 2)
            p = planner.plan_k1x1(2048, 16, 49, threads=t)
            assert _whole_tiles(p["Q"]) and p["tasks"] >= min(t, 2)
            assert p["Q"] * 2048 * 4 <= planner.WHOLE_MAP_L2 * (512 << 10)
        assert planner.plan_k1x1(2048, 16, 49, threads=2)["partitioning"] == "Co split (input shared)"
    finally:
        planner.set_cache_sizes()


@pytest.mark.parametrize("l2", [None, 512 << 10, 1 << 20, 2 << 20])
def test_k1x1_plan_positions_on_large_maps(l2):
    """Batch 32 56x56: positions split, blocks within the L2 rule, the 16 threads' last round of
    tasks nearly full (the planner's candidates are balanced, not only task counts divisible by 16)."""
    if l2:
        planner.set_cache_sizes(l2=l2)
    try:
        big = planner.plan_k1x1(256, 2, 32 * 3136, threads=16)
        assert big["P"] == 2 and _whole_tiles(big["Q"]) and big["Q"] * 256 * 4 <= planner.cache_sizes().l2 / 2 + 1
        assert big["partitioning"] == "positions split" and big["tasks"] >= 16
        assert -(-big["tasks"] // 16) * 16 / big["tasks"] <= 1.05, big
    finally:
        planner.set_cache_sizes()


def test_k1x1_plan_balances_blocks_on_avx2():
    """MobileNetV2's 960 -> 160 at 7x7, batch 1, 2 threads: 10 output blocks. The AVX2 strip runs one block a
    tile, so its tasks split 5 + 5 (pairs gave 6 + 4); elsewhere a task's blocks stay whole pairs."""
    p = planner.plan_k1x1(960, 5, 49, threads=2, ob=10)
    assert p["tasks"] == 2 and p["partitioning"].startswith("Co split")
    assert p["B"] == (5 if planner.ASM_AVX2 else 6) and p["P"] == 3
    for t in (1, 2, 3, 5, 8):
        for cip, op, ob, pos in ((576, 3, 6, 196), (960, 5, 10, 49), (96, 1, 2, 3136), (1024, 8, 15, 49)):
            q = planner.plan_k1x1(cip, op, pos, threads=t, ob=ob)
            assert planner.ASM_AVX2 or q["B"] % 2 == 0, q


@pytest.mark.parametrize("act", [None, "silu"])
@pytest.mark.parametrize("res", [False, True])
def test_k1x1_odd_block_ranges_same_bits(act, res):
    """Tasks of any block range (what the AVX2 planner may hand out: [0, 5), [5, 10), single blocks, odd
    position counts) and the planner's grid give the same bits as one task over everything: each output
    element is the same full-K chain whichever task holds it. On AVX-512 and numba-tile hosts the grids
    below keep pairs (even block starts), as the planner does there."""
    from tilefuse.kernels.conv import k1x1
    rng = np.random.default_rng(7)
    for ci, co, hw in ((960, 160, 7), (72, 40, 9), (40, 24, 5)):
        w = rng.standard_normal((co, ci, 1, 1)).astype(np.float32)
        prep = k1x1.prepare(w, rng.standard_normal(co).astype(np.float32))
        cb, ob = -(-ci // 16), -(-co // 16)
        x = rng.standard_normal((1, cb, hw, hw, 16)).astype(np.float32)
        r = rng.standard_normal((1, ob, hw, hw, 16)).astype(np.float32) if res else None
        base = planner.plan_k1x1(cb * 16, prep["weight"].shape[0], hw * hw, 1, ob)
        one = dict(base, Q=hw * hw, B=ob)
        want = np.zeros((1, ob, hw, hw, 16), np.float32)
        k1x1.run_nchwc(want, x, prep, r, act=act, threads=1, plan=one)
        step = 1 if planner.ASM_AVX2 else 2
        grids = [dict(base, Q=q, B=b) for q in (hw * hw, 11, 25) for b in range(step, ob + 1, step)]
        grids.append(planner.plan_k1x1(cb * 16, prep["weight"].shape[0], hw * hw, 2, ob))
        for pl in grids:
            for t in (1, 2):
                got = np.full_like(want, np.nan)
                k1x1.run_nchwc(got, x, prep, r, act=act, threads=t, plan=pl)
                assert np.array_equal(got, want), (ci, co, hw, pl["Q"], pl["B"], t)
    # the scaled-weights form (squeeze-excitation's per-image scale) on odd ranges too
    ci, co, hw = 72, 40, 9
    w = rng.standard_normal((co, ci, 1, 1)).astype(np.float32)
    prep = k1x1.prepare(w, None)
    x = rng.standard_normal((1, 5, hw, hw, 16)).astype(np.float32)
    sc = rng.uniform(0.5, 1.5, 80).astype(np.float32)
    base = planner.plan_k1x1(80, prep["weight"].shape[0], hw * hw, 1, 3)
    want = np.zeros((1, 3, hw, hw, 16), np.float32)
    k1x1.run_nchwc(want, x, prep, act=act, threads=1, plan=dict(base, Q=hw * hw, B=3), input_scale=sc)
    for b in ((1, 2, 3) if planner.ASM_AVX2 else (2,)):
        got = np.full_like(want, np.nan)
        k1x1.run_nchwc(got, x, prep, act=act, threads=2, plan=dict(base, Q=40, B=b), input_scale=sc)
        assert np.array_equal(got, want), b


@pytest.mark.parametrize("shape", [("d_odd_ob", 2, 20, 9, 11, 40, 3, 1, (1, 1, 1, 1), 1, 1),
                                   ("d_s2", 1, 32, 14, 14, 48, 3, 2, (1, 1, 1, 1), 1, 1),
                                   ("d_5x5_dil", 1, 16, 13, 12, 16, 5, 1, (4, 4, 4, 4), 2, 1)],
                         ids=lambda s: s[0])
def test_direct_wide_and_narrow_tiles_match(shape):
    """direct.py's two register tiles (7 positions x 2 output blocks on AVX-512, 5 x 1 on AVX2; both
    generated from tilegen.DIRECT): same products summed in the same order, so bitwise equal; and
    against the spec."""
    from tilefuse.kernels.conv import direct
    x, wt, b, res, relu, kw, want = _case(shape, "bias_res_relu")
    prep = conv2d_prepare("direct", wt, b, kw["stride"], kw["padding"], kw["dilation"], 1, layout="nchwc")
    xb, rb = to_nchwc(x, kw["padding"]), to_nchwc(res)
    outs = []
    for k in (direct._direct_rows_narrow, direct._direct_rows2_wide):
        ob = np.full(nchwc_shape(want.shape), np.nan, np.float32)
        n, cb, hp, wp, _ = xb.shape
        ofl, rfl = ob.reshape(n, ob.shape[1], -1, 16), rb.reshape(n, rb.shape[1], -1, 16)
        for i in range(n):
            k(ofl, i, 0, xb.reshape(n, cb, hp * wp, 16), i, 0, prep["weight"], 0, want.shape[2], want.shape[3], wp,
              kw["stride"][0], kw["stride"][1], kw["dilation"][0], kw["dilation"][1], prep["bias"], rfl, True,
              *resolve_act(relu), 0, ob.shape[1])
        outs.append(ob)
    assert np.array_equal(outs[0], outs[1])
    _check("direct", from_nchwc(outs[1], want.shape[1]), want)


# ---------------------------------------------------------------- stem kernel (few input channels)
# (N, Ci, H, W, Co, k, stride, padding (t, b, l, r), dilation)
STEM_SHAPES = [
    (1, 3, 37, 29, 64, 7, 2, (3, 3, 3, 3), 1),     # the ResNet stem on an odd size
    (3, 1, 17, 13, 20, 7, 2, (3, 3, 3, 3), 1),     # Ci 1, Co not a multiple of 16, batch 3
    (2, 4, 15, 19, 37, 3, 1, (1, 1, 1, 1), 1),     # Ci 4, odd Ob (3 blocks)
    (1, 3, 23, 21, 16, 5, 3, (0, 2, 1, 0), 1),     # asymmetric padding, stride 3, one block
    (1, 2, 19, 19, 48, 3, 1, (2, 2, 2, 2), 2),     # dilation 2
    (3, 3, 9, 11, 33, 11, 4, (2, 2, 2, 2), 1),     # AlexNet-like 11x11/s4
]


@pytest.mark.parametrize("shape", STEM_SHAPES)
@pytest.mark.parametrize("epi", ["none", "bias_relu", "bias_res_relu", "res"])
def test_stem_kernel_against_reference(shape, epi):
    from tilefuse.kernels.conv import stem
    n, ci, h, w, co, k, s, pad, d = shape
    rng = np.random.default_rng(7)
    x = rng.standard_normal((n, ci, h, w), dtype=np.float32)
    wt = rng.standard_normal((co, ci, k, k), dtype=np.float32)
    b = rng.standard_normal(co, dtype=np.float32) if "bias" in epi else None
    kw = dict(stride=(s, s), padding=pad, dilation=(d, d))
    base = ref.conv2d(x, wt, b, **kw, groups=1)
    res = rng.standard_normal(base.shape, dtype=np.float32) if "res" in epi else None
    relu = "relu" in epi
    want = ref.conv2d(x, wt, b, **kw, groups=1, residual=res, relu=relu)
    assert stem.applies(ci, 1)
    prep = conv2d_prepare("im2col", wt, b, kw["stride"], pad, kw["dilation"], 1)
    outs = []
    for threads in (1, 2):
        ob = np.full(nchwc_shape(want.shape), np.nan, np.float32)
        conv2d_run_to_nchwc("im2col", ob, x, prep, to_nchwc(res) if res is not None else None, relu=relu,
                            threads=threads, **kw)
        assert np.isfinite(ob).all()
        pad_ch = ob.transpose(0, 1, 4, 2, 3).reshape(n, -1, *want.shape[2:])[:, co:]
        assert (pad_ch == 0).all()  # padded output channels are exactly zero
        outs.append(ob)
    _check("im2col", from_nchwc(outs[0], co), want)
    assert np.array_equal(outs[0], outs[1])  # 1 and 2 threads bitwise identical
    # the direct stem kernel agrees with im2col + GEMM (the other blocked-output path)
    from tilefuse.kernels.conv import im2col
    ob2 = np.zeros_like(outs[0])
    im2col.run_to_nchwc(ob2, x, prep, to_nchwc(res) if res is not None else None, relu=relu, threads=1, **kw)
    _check("im2col", from_nchwc(outs[0], co), from_nchwc(ob2, co))


def test_stem_applies_only_to_few_channels():
    from tilefuse.kernels.conv import stem
    assert stem.applies(3, 1) and stem.applies(4, 1) and not stem.applies(5, 1) and not stem.applies(3, 3)


def test_bound_conv_matches_generic_call():
    """kernels.registry.bind: the validated closure gives the same bits as the generic kernel call."""
    from tilefuse.kernels import registry
    rng = np.random.default_rng(3)
    x = to_nchwc(rng.standard_normal((1, 32, 9, 9), dtype=np.float32))
    wt = rng.standard_normal((32, 32, 3, 3), dtype=np.float32)
    b = rng.standard_normal(32, dtype=np.float32)
    res = to_nchwc(rng.standard_normal((1, 32, 9, 9), dtype=np.float32))
    for alg in ("direct", "winograd2"):
        prep = conv2d_prepare(alg, wt, b, 1, 1, 1, 1, layout="nchwc")
        params = dict(stride=(1, 1), padding=(1, 1, 1, 1), dilation=(1, 1), groups=1, has_bias=True,
                      has_residual=True, relu=True, algorithm=alg, prepared=tuple(prep), layout="nchwc", threads=2)
        o1, o2 = np.zeros_like(res), np.zeros_like(res)
        views = [x, *prep.values(), res, o1]
        fn, p = registry.bind("conv2d", views, params)
        assert fn is not registry.KERNELS["conv2d"]
        fn(o1, *views[:-1], **p)
        registry.KERNELS["conv2d"](o2, *views[:-1], **params)
        assert np.array_equal(o1, o2)
    # invalid arguments: no fast path, the generic kernel raises at call time as before
    fn, p = registry.bind("conv2d", [x[..., :8], *prep.values(), res, o1], params)
    assert fn is registry.KERNELS["conv2d"]


# Winograd: the input transform reads the unpadded input (border tiles gather a zero-padded patch);
# every task grid (tile chunk x output-channel pair group) gives the same bits --------------------
WINO_GRID_SHAPES = [
    # (name, N, Ci, H, W, Co, k, stride, padding, dilation, groups): odd tile counts (H, W not
    # multiples of m), channels not multiples of 16, batch 1 and 3, asymmetric and zero padding
    ("wf_odd_tiles", 1, 17, 13, 11, 33, 3, 1, (1, 1, 1, 1), 1, 1),
    ("wf_batch3", 3, 40, 9, 10, 24, 3, 1, (1, 1, 1, 1), 1, 1),
    ("wf_asym_pad", 3, 16, 11, 9, 17, 3, 1, (2, 1, 0, 2), 1, 1),
    ("wf_no_pad", 1, 20, 10, 14, 16, 3, 1, (0, 0, 0, 0), 1, 1),
    ("wf_tiny", 3, 8, 3, 3, 5, 3, 1, (1, 1, 1, 1), 1, 1),
    ("wf_co_split", 1, 20, 7, 9, 250, 3, 1, (1, 1, 1, 1), 1, 1),     # 8 pairs of output blocks
]
WINO_GRID_CASES = [(s, alg, EPILOGUES[i % len(EPILOGUES)])
                   for i, (s, alg) in enumerate((s, a) for s in WINO_GRID_SHAPES for a in ("winograd2", "winograd4"))]


@pytest.mark.parametrize("shape,alg,epi", WINO_GRID_CASES, ids=[f"{s[0]}-{a}-{e}" for s, a, e in WINO_GRID_CASES])
def test_winograd_every_grid_same_bits(shape, alg, epi):
    x, wt, b, res, relu, kw, want = _case(shape, epi, seed=5)
    co = want.shape[1]
    prep = conv2d_prepare(alg, wt, b, kw["stride"], kw["padding"], kw["dilation"], 1, layout="nchwc")
    outs = []
    # small plans: several tasks, the last one partial (odd tile counts); channel-pair groups
    for plan in (None, {"tiles": 3, "pairs": 1}, {"tiles": 8, "pairs": 2}, {"tiles": 7, "pairs": 3}):
        for t in (1, 2):
            ob = np.full(nchwc_shape(want.shape), np.nan, np.float32)
            winograd.run_nchwc(ob, to_nchwc(x), prep, to_nchwc(res) if res is not None else None, m=int(alg[-1]),
                               padding=kw["padding"], relu=relu, threads=t, plan=plan)
            outs.append(ob)
    assert all(np.array_equal(outs[0], o) for o in outs[1:])
    assert not outs[0][:, -1, ..., co - (outs[0].shape[1] - 1) * 16:].any(), "padded channels must be zero"
    _check(alg, from_nchwc(outs[0], co), want)
    # the NCHW form: the same input transform and GEMMs, its own output transform (NCHW stores; fastmath
    # may contract its sums differently, so equal within the tolerance, not bitwise)
    out = np.full(want.shape, np.nan, np.float32)
    conv2d_run(alg, out, x, conv2d_prepare(alg, wt, b, kw["stride"], kw["padding"], kw["dilation"], 1), res,
               relu=relu, **kw)
    _check(alg, out, want)


def test_winograd_plan_feeds_the_threads():
    """Batch-1 ResNet 3x3 layers get about T tasks or more for T threads (tile chunks, channel groups)."""
    for c, hw in ((64, 56), (128, 28), (256, 14), (512, 7)):
        for m in (2, 4):
            tiles = (-(-hw // m)) ** 2
            for t in (2, 16):
                p = planner.plan_winograd(m + 2, c, c, tiles, t)
                assert p["tasks"] >= min(t, tiles * -(-c // 32)) * 0.85, (c, hw, m, t, p)
                assert p["tiles"] % 7 == 0 or p["tiles"] >= tiles, p


# Thin 1x1 convs (issue 9, MobileNetV2 / EfficientNet): an odd number of 16-channel output blocks
# goes to the one-block kernel (k1x1._k1x1_one, 14 positions x 1 block) and zero weight rows past
# the last real input channel are skipped (k1x1.reduction_length).
THIN_SHAPES = [  # (name, N, Ci, H, W, Co, stride)
    ("t_16_16", 1, 16, 9, 13, 16, 1),      # Ob = 1: the whole layer is one-block
    ("t_3_24", 3, 3, 8, 11, 24, 1),        # Ci 3 (13 zero rows skipped), Co 24 (Ob = 2)
    ("t_17_40", 1, 17, 10, 9, 40, 2),      # Ci 17, Co 40 (Ob = 3: a pair + one block), stride 2
    ("t_16_8", 3, 16, 7, 9, 8, 2),         # Co 8 < one block, batch 3, stride 2
    ("t_17_1", 1, 17, 5, 6, 1, 1),         # one output channel
    ("t_24_144", 1, 24, 7, 7, 144, 1),     # MobileNetV2 expansion on a 7x7 map (Co split: the odd block in a task)
    ("t_32_16_b3", 3, 32, 15, 15, 16, 1),  # MobileNetV2's first projection, blocks of 14 span images
]
THIN_EPIS = [("none", None), ("relu6", ("clip", 0.0, 6.0)), ("res_relu6", ("clip", 0.0, 6.0)), ("res", None),
             ("hardswish", ("hardswish", 0.0, 0.0)), ("res_silu", ("silu", 0.0, 0.0))]
THIN_CASES = [(s, e) for s in THIN_SHAPES for e in THIN_EPIS]


def _thin_case(shape, epi, seed=0):
    from tilefuse.kernels.activations import reference as act_ref
    name, n, ci, h, w, co, s = shape
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, ci, h, w), dtype=np.float32)
    wt = (rng.standard_normal((co, ci, 1, 1), dtype=np.float32) / np.sqrt(ci)).astype(np.float32)
    b = rng.standard_normal(co, dtype=np.float32)
    ho, wo = (h - 1) // s + 1, (w - 1) // s + 1
    res = rng.standard_normal((n, co, ho, wo), dtype=np.float32) * 3 if epi[0].startswith("res") else None
    want = ref.conv2d(x, wt, b, (s, s), (0, 0, 0, 0), (1, 1), 1, residual=res)
    if epi[1] is not None:
        want = act_ref(epi[1][0], want, epi[1][1], epi[1][2])
    return x, wt, b, res, want


def _thin_run(x, wt, b, res, stride, act, threads):
    from tilefuse.kernels.conv import k1x1
    prep = k1x1.prepare(wt, b)
    n, _, h, w = x.shape
    ho, wo = (h - 1) // stride + 1, (w - 1) // stride + 1
    ob = np.full(nchwc_shape((n, wt.shape[0], ho, wo)), np.nan, np.float32)
    k1x1.run_nchwc(ob, to_nchwc(x), prep, to_nchwc(res) if res is not None else None, stride=(stride, stride),
                   act=act, threads=threads)
    return ob


@pytest.mark.parametrize("shape,epi", THIN_CASES, ids=[f"{s[0]}-{e[0]}" for s, e in THIN_CASES])
def test_thin_1x1_against_reference_every_thread_count_same_bits(shape, epi):
    """Each output element is the same full-K dot product (one code path per block, chosen by the
    shape) whatever task or thread holds it: 1, 2, 3 and 5 threads give the same bits, and the
    result matches the reference conv (with the activation's numpy spec)."""
    x, wt, b, res, want = _thin_case(shape, epi)
    outs = [_thin_run(x, wt, b, res, shape[6], epi[1], t) for t in (1, 2, 3, 5)]
    assert all(np.array_equal(outs[0], o) for o in outs[1:]), "thread count changed the bits"
    co = want.shape[1]
    if co % 16 and not epi[0].startswith(("hardswish", "res")):   # act(0) = 0 in the padding lanes
        assert not outs[0][:, -1, ..., co % 16:].any(), "padded channels must be zero"
    _check("gemm1x1", from_nchwc(outs[0], co), want)


def test_thin_1x1_every_grid_same_bits():
    """The task grid (positions x channel pairs, any split, the odd block inside or alone in a
    task) never changes a bit: forced plans against the default one."""
    from tilefuse.kernels.conv import k1x1
    x, wt, b, res, want = _thin_case(("g", 2, 24, 9, 10, 144, 1), ("res_relu6", ("clip", 0.0, 6.0)), seed=7)
    prep = k1x1.prepare(wt, b)
    op = prep["weight"].shape[0]
    outs = []
    for q, p, qo in ((7, 1, True), (14, 2, False), (21, 5, True), (180, 3, False), (63, 4, True)):
        ob = np.empty(nchwc_shape(want.shape), np.float32)
        plan = {"Q": q, "P": min(p, op), "q_outer": qo}
        k1x1.run_nchwc(ob, to_nchwc(x), prep, to_nchwc(res), act=("clip", 0.0, 6.0), threads=3, plan=plan)
        outs.append(ob)
    assert all(np.array_equal(outs[0], o) for o in outs[1:])
    _check("gemm1x1", from_nchwc(outs[0], 144), want)


def test_reduction_length_skips_only_trailing_zero_rows():
    from tilefuse.kernels.conv import k1x1
    rng = np.random.default_rng(0)
    for ci, co in ((3, 16), (17, 40), (24, 144), (32, 8), (16, 1)):
        wt = rng.standard_normal((co, ci, 1, 1)).astype(np.float32)
        assert k1x1.reduction_length(k1x1.prepare(wt, None)["weight"]) == ci
    wt = rng.standard_normal((40, 20, 1, 1)).astype(np.float32)
    wt[:, 5] = 0          # a zero row inside: still reduced over
    wt[:, 15:] = 0        # trailing zero rows: skipped
    assert k1x1.reduction_length(k1x1.prepare(wt, None)["weight"]) == 15
    wt[3, 19] = 1.0       # one output channel uses the last input channel: nothing skipped
    assert k1x1.reduction_length(k1x1.prepare(wt, None)["weight"]) == 20
    assert k1x1.reduction_length(k1x1.prepare(np.zeros((4, 4, 1, 1), np.float32), None)["weight"]) == 0


def test_thin_1x1_in_a_compiled_mobilenet_block():
    """The path as the network uses it: an inverted-residual block (1x1 expand + ReLU6, depthwise
    3x3 + ReLU6, 1x1 project + residual) with 24 -> 144 -> 24 channels compiled, at 1 and 3 threads,
    equal bits, against the reference interpreter."""
    import tilefuse
    rng = np.random.default_rng(1)
    outs = []
    for threads in (1, 3):
        net = tilefuse.Network("ir_block")
        x = net.input("x", (2, 24, 9, 9))
        r = np.random.default_rng(2)
        w1 = (r.standard_normal((144, 24, 1, 1)) / 5).astype(np.float32)
        w2 = (r.standard_normal((144, 1, 3, 3)) / 3).astype(np.float32)
        w3 = (r.standard_normal((24, 144, 1, 1)) / 12).astype(np.float32)
        y = net.activation(net.conv2d(x, w1, r.standard_normal(144).astype(np.float32)), "clip", min=0.0, max=6.0)
        y = net.activation(net.conv2d(y, w2, np.zeros(144, np.float32), padding=1, groups=144), "clip", min=0.0,
                           max=6.0)
        y = net.add(net.conv2d(y, w3, np.zeros(24, np.float32)), x)
        net.output(y)
        xin = rng.standard_normal((2, 24, 9, 9)).astype(np.float32) if not outs else xin
        compiled = tilefuse.compile(net, threads=threads)
        assert [r["algorithm"] for r in compiled.plan().rows if r["kernel"] == "conv2d"] == [
            "gemm1x1", "depthwise", "gemm1x1"], compiled.plan()
        outs.append(tilefuse.Session(compiled, threads=threads).run(xin))
        want = tilefuse.evaluate(net, {"x": xin})[0]
    assert np.array_equal(outs[0], outs[1])
    err = np.abs(outs[0] - want).max() / max(1.0, float(np.abs(want).max()))
    assert err <= 1e-4
