"""Depthwise and grouped convolution as NCHW16c kernels (kernels/conv/depthwise.py, grouped.py).

Every case is compared with the reference (kernels/reference.conv2d, itself compared with
PyTorch here for the grouped forms). Tolerances (fp32, relative to max|reference|):
  depthwise  1e-5: the same KH*KW products as the reference, summed kh then kw (the reference's
             im2col matmul may sum them in another order, with or without FMA)
  grouped    1e-4: the direct kernel per block group (Cbg*16*KH*KW-long sums, FMA, blocked order;
             the zero weights between groups add exact +0 for finite inputs)
Thread counts 1, 2, 3, 5, 8 give bitwise identical outputs (tasks from the shape only).
"""
import numpy as np
import pytest
from llvmlite import ir as llvm_ir
from numba import njit, types
from numba.extending import intrinsic

import tilefuse
from tilefuse.kernels import activations as A
from tilefuse.kernels import reference as ref
from tilefuse.kernels.conv import planner
from tilefuse.kernels.conv import (candidates, conv2d_prepare, conv2d_run, conv2d_run_nchwc, depthwise, from_nchwc,
                                   grouped, nchwc_shape, select_algorithm, to_nchwc)

TOL = {"depthwise": 1e-5, "grouped": 1e-4}
THREADS = (1, 2, 3, 5, 8)

# (name, N, C, H, W, multiplier, k, stride, padding (t, b, l, r), dilation)
DW_CASES = [
    ("mnv2_s1", 1, 32, 12, 12, 1, 3, 1, (1, 1, 1, 1), 1),
    ("odd_c_odd_hw", 2, 19, 13, 11, 1, 3, 2, (1, 1, 1, 1), 1),
    ("k5_s1", 1, 33, 9, 10, 1, 5, 1, (2, 2, 2, 2), 1),
    ("k5_s2_asym", 1, 24, 11, 14, 1, 5, 2, (2, 1, 1, 2), 1),
    ("k7_dil2_asym", 1, 5, 15, 17, 1, 7, 2, (3, 1, 0, 2), 2),
    ("dil2_s1", 2, 48, 10, 9, 1, 3, 1, (2, 2, 2, 2), 2),
    ("no_pad", 1, 16, 8, 9, 1, 3, 1, (0, 0, 0, 0), 1),
    ("k1", 1, 20, 6, 7, 1, 1, 1, (0, 0, 0, 0), 1),
    ("tiny_map", 1, 40, 2, 3, 1, 3, 1, (1, 1, 1, 1), 1),
    ("pad_wider_than_map", 1, 17, 3, 2, 1, 5, 1, (3, 2, 4, 3), 1),
    ("mult2", 1, 8, 9, 9, 2, 3, 1, (1, 0, 1, 0), 1),
    ("mult3_odd", 2, 7, 8, 7, 3, 5, 2, (2, 2, 1, 3), 1),
    # large maps: the register-blocked interior + border path (no padded copy), every constant-offset
    # specialization (k 3/5/7, stride 1/2) with full 8-position blocks, and dilation 2
    ("big_k3_s1", 1, 32, 40, 45, 1, 3, 1, (1, 1, 1, 1), 1),
    ("big_k3_s2", 1, 24, 41, 47, 1, 3, 2, (1, 1, 1, 1), 1),
    ("big_k5_s1", 1, 16, 33, 38, 1, 5, 1, (2, 2, 2, 2), 1),
    ("big_k5_s2", 2, 20, 35, 37, 1, 5, 2, (2, 2, 2, 2), 1),
    ("big_k7_s1_asym", 1, 16, 30, 43, 1, 7, 1, (3, 2, 1, 3), 1),
    ("big_k3_dil2", 1, 16, 31, 33, 1, 3, 1, (2, 2, 2, 2), 2),
    # 7-wide outputs (the last stages of MobileNetV2 / EfficientNet-B0): their own constant-offset code
    ("w7_k3_s1", 1, 48, 7, 7, 1, 3, 1, (1, 1, 1, 1), 1),
    ("w7_k3_s2", 1, 32, 13, 14, 1, 3, 2, (1, 1, 1, 1), 1),
    ("w7_k5_s1", 2, 40, 6, 7, 1, 5, 1, (2, 2, 2, 2), 1),
    ("w7_k5_s2", 1, 16, 14, 13, 1, 5, 2, (2, 2, 2, 2), 1),
]

# (name, N, Ci, H, W, Co, groups, k, stride, padding, dilation): L = groups per block group
GROUPED_CASES = [
    ("cg16_L1", 1, 32, 9, 9, 32, 2, 3, 1, (1, 1, 1, 1), 1),
    ("cg16_og32", 2, 32, 8, 10, 64, 2, 3, 2, (1, 1, 1, 1), 1),
    ("cg8_regnet", 1, 48, 7, 9, 48, 6, 3, 1, (1, 1, 1, 1), 1),
    ("cg8_odd_groups", 1, 40, 6, 6, 40, 5, 3, 1, (1, 0, 2, 1), 1),
    ("cg4_resnext", 1, 16, 10, 9, 16, 4, 3, 1, (2, 2, 2, 2), 2),
    ("cg24_clipped", 1, 72, 7, 7, 72, 3, 1, 1, (0, 0, 0, 0), 1),
    ("cg8_og16_k5_s2", 1, 48, 9, 11, 96, 6, 5, 2, (2, 2, 2, 2), 1),
    ("cg16_big", 1, 64, 30, 33, 64, 4, 3, 1, (1, 1, 1, 1), 1),
]

ACT_PARAMS = {"clip": (0.0, 6.0), "hardsigmoid": (1 / 6, 0.5), "leaky_relu": (0.1, 0.0), "elu": (1.0, 0.0),
              "softplus": (2.0, 5.0), "pow": (3.0, 0.0), "celu": (0.7, 0.0), "fmod": (0.7, 0.0),
              "remainder": (-0.3, 0.0), "floor_divide": (0.45, 0.0),
              "base_pow": (1.7, 0.0)}
# steps: against the activation of the kernel's un-activated output, exactly (a rounding difference from the
# reference may move a value across a step)
STEPS = {"floor", "ceil", "round", "trunc", "fmod", "remainder", "floor_divide"}


def _dw_case(case, seed=0, bias=True, residual=False):
    _, n, c, h, w, m, k, s, pad, d = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((c * m, 1, k, k)).astype(np.float32)
    b = rng.standard_normal(c * m).astype(np.float32) if bias else None
    ho = ref.conv_out_size(h, k, s, pad[0], pad[1], d)
    wo = ref.conv_out_size(w, k, s, pad[2], pad[3], d)
    res = rng.standard_normal((n, c * m, ho, wo)).astype(np.float32) if residual else None
    return x, wt, b, res, dict(stride=(s, s), padding=pad, dilation=(d, d), groups=c)


def _grouped_case(case, seed=0, residual=False):
    _, n, ci, h, w, co, g, k, s, pad, d = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, ci, h, w)).astype(np.float32)
    wt = rng.standard_normal((co, ci // g, k, k)).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32)
    ho = ref.conv_out_size(h, k, s, pad[0], pad[1], d)
    wo = ref.conv_out_size(w, k, s, pad[2], pad[3], d)
    res = rng.standard_normal((n, co, ho, wo)).astype(np.float32) if residual else None
    return x, wt, b, res, dict(stride=(s, s), padding=pad, dilation=(d, d), groups=g)


def _want(x, wt, b, res, kw, act=("identity", 0.0, 0.0)):
    y = ref.conv2d(x, wt, b, kw["stride"], kw["padding"], kw["dilation"], kw["groups"], residual=res)
    return A.reference(act[0], y, act[1], act[2])


_UNWRITTEN = np.uint32(0x7FA5A5A5)


def _run_nchwc(alg, x, wt, b, res, kw, act=None, threads=None):
    """Blocked in, blocked out; returns NCHW and checks the padded output channels stay zero (act(0) = 0)."""
    prep = conv2d_prepare(alg, wt, b, kw["stride"], kw["padding"], kw["dilation"], kw["groups"], layout="nchwc")
    ho = ref.conv_out_size(x.shape[2], wt.shape[2], kw["stride"][0], kw["padding"][0], kw["padding"][1],
                           kw["dilation"][0])
    wo = ref.conv_out_size(x.shape[3], wt.shape[3], kw["stride"][1], kw["padding"][2], kw["padding"][3],
                           kw["dilation"][1])
    co = wt.shape[0]
    ob = np.empty(nchwc_shape((x.shape[0], co, ho, wo)), np.float32)
    ob.view(np.uint32)[...] = _UNWRITTEN       # a NaN no arithmetic makes (ln of a negative value may give NaN)
    conv2d_run_nchwc(alg, ob, to_nchwc(x), prep, to_nchwc(res) if res is not None else None, act=act,
                     threads=threads, **kw)
    assert (ob.view(np.uint32) != _UNWRITTEN).all(), f"{alg}: unwritten output elements"
    name = A.NAMES[act[0]] if act is not None and not isinstance(act[0], str) else act and act[0]
    if act is None or A.reference(name, np.zeros(1, np.float32), act[1], act[2])[0] == 0:
        assert not ob[:, -1, ..., co - (ob.shape[1] - 1) * 16:].any(), "padded channels must stay zero"
    return ob, from_nchwc(ob, co)


def _check(alg, got, want):
    assert got.shape == want.shape and got.dtype == np.float32
    err = np.abs(got - want).max() / max(1.0, float(np.abs(want).max()))
    assert err <= TOL[alg], f"{alg}: max error {err:.3g} > {TOL[alg]}"


# ------------------------------------------------------------------ the reference vs PyTorch

@pytest.mark.parametrize("case", DW_CASES[:6] + DW_CASES[10:12], ids=lambda c: c[0])
def test_reference_depthwise_matches_torch(case):
    torch = pytest.importorskip("torch")
    x, wt, b, _, kw = _dw_case(case)
    t, bo, l, r = kw["padding"]
    xp = np.pad(x, ((0, 0), (0, 0), (t, bo), (l, r)))  # torch has no asymmetric padding: pad first
    want = torch.nn.functional.conv2d(torch.from_numpy(xp), torch.from_numpy(wt), torch.from_numpy(b),
                                      kw["stride"], 0, kw["dilation"], kw["groups"]).numpy()
    got = ref.conv2d(x, wt, b, kw["stride"], kw["padding"], kw["dilation"], kw["groups"])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("case", GROUPED_CASES[:5], ids=lambda c: c[0])
def test_reference_grouped_matches_torch(case):
    torch = pytest.importorskip("torch")
    x, wt, b, _, kw = _grouped_case(case)
    t, bo, l, r = kw["padding"]
    xp = np.pad(x, ((0, 0), (0, 0), (t, bo), (l, r)))
    want = torch.nn.functional.conv2d(torch.from_numpy(xp), torch.from_numpy(wt), torch.from_numpy(b),
                                      kw["stride"], 0, kw["dilation"], kw["groups"]).numpy()
    got = ref.conv2d(x, wt, b, kw["stride"], kw["padding"], kw["dilation"], kw["groups"])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


# ------------------------------------------------------------------ depthwise kernel

@pytest.mark.parametrize("case", DW_CASES, ids=lambda c: c[0])
def test_depthwise_nchwc_against_reference(case):
    x, wt, b, res, kw = _dw_case(case, residual=True)
    _, got = _run_nchwc("depthwise", x, wt, b, res, kw)
    _check("depthwise", got, _want(x, wt, b, res, kw))


@pytest.mark.parametrize("padded", [False, True], ids=["in_place", "padded_band"])
@pytest.mark.parametrize("case", [DW_CASES[i] for i in (1, 3, 4, 9, 12, 14, 16, 18, 21)], ids=lambda c: c[0])
def test_depthwise_both_paths(case, padded, monkeypatch):
    """Small maps run on a zero-bordered band copy, large ones in place with border positions:
    force each path on each shape."""
    monkeypatch.setattr(depthwise, "PADDED", padded)
    x, wt, b, res, kw = _dw_case(case, seed=3, residual=True)
    _, got = _run_nchwc("depthwise", x, wt, b, res, kw, act=A.encode("relu"))
    _check("depthwise", got, _want(x, wt, b, res, kw, ("relu", 0.0, 0.0)))


def test_depthwise_nchw_entry_and_no_bias():
    x, wt, _, _, kw = _dw_case(DW_CASES[1], bias=False)
    prep = conv2d_prepare("depthwise", wt, None, kw["stride"], kw["padding"], kw["dilation"], kw["groups"])
    want = _want(x, wt, None, None, kw)
    out = np.full_like(want, np.nan)
    conv2d_run("depthwise", out, x, prep, None, **kw)
    _check("depthwise", out, want)


@pytest.mark.parametrize("name", list(A.ACTIVATIONS))
@pytest.mark.parametrize("case", [DW_CASES[1], DW_CASES[12], DW_CASES[10]], ids=lambda c: c[0])
def test_depthwise_every_activation_with_residual(case, name):
    alpha, beta = ACT_PARAMS.get(name, (0.0, 0.0))
    act = (name, alpha, beta)
    x, wt, b, res, kw = _dw_case(case, seed=5, residual=True)
    _, got = _run_nchwc("depthwise", x, wt, b, res, kw, act=act)
    if name in ("log", "log2", "log10", "sqrt", "rsqrt", "asin", "acos", "acosh", "atanh", "tan", "sinh", "cosh"):
        # NaN outside a domain and steep near its edge (tan near its poles, sinh / cosh of large values): against
        # the activation of the kernel's un-activated output
        want = A.reference(name, _run_nchwc("depthwise", x, wt, b, res, kw)[1], alpha, beta)
        assert np.array_equal(np.isnan(got), np.isnan(want)) and (name in ("tan", "sinh", "cosh") or
                                                                  np.isnan(want).any())
        fin = np.isfinite(want)
        np.testing.assert_allclose(got[fin], want[fin], rtol=2e-6, atol=1e-6)
        return
    if name in STEPS:
        np.testing.assert_array_equal(got, A.reference(name, _run_nchwc("depthwise", x, wt, b, res, kw)[1], alpha,
                                                       beta))
        return
    _check("depthwise", got, _want(x, wt, b, res, kw, act))


@pytest.mark.parametrize("case", [DW_CASES[1], DW_CASES[11], DW_CASES[13], DW_CASES[15]], ids=lambda c: c[0])
def test_depthwise_thread_counts_bitwise_identical(case, monkeypatch):
    monkeypatch.setattr(planner, "DW_TASK_VFMAS", 600)   # small tasks: many per layer, split rows and blocks
    monkeypatch.setattr(planner, "DW_TASK_MIN_VFMAS", 64)
    x, wt, b, res, kw = _dw_case(case, seed=7, residual=True)
    outs = [_run_nchwc("depthwise", x, wt, b, res, kw, act=("silu", 0.0, 0.0), threads=t)[0] for t in THREADS]
    assert len(depthwise.plan_tasks(x.shape[0], -(-wt.shape[0] // 16), outs[0].shape[2], outs[0].shape[3],
                                    wt.shape[2] * wt.shape[3])) >= 3
    for o in outs[1:]:
        assert np.array_equal(outs[0], o)


@pytest.mark.parametrize("padded", [False, True], ids=["in_place", "padded_band"])
@pytest.mark.parametrize("case", [DW_CASES[i] for i in (0, 1, 3, 4, 9)], ids=lambda c: c[0])
def test_depthwise_clip_in_the_stores_equals_the_clip_pass(case, padded, monkeypatch):
    """A clip (ReLU6) without a residual is applied in the stores (interior blocks, a short last block,
    border positions): the bits of the conv without activation followed by activations.apply_span's
    clip, NaN, +-inf and -0 inputs included, on both paths and every thread count."""
    monkeypatch.setattr(depthwise, "PADDED", padded)
    x, wt, b, _, kw = _dw_case(case, seed=11)
    x *= 4.0                                  # values on both sides of the clip
    x[0, 0, 0, :3] = [np.nan, np.inf, -0.0][:x.shape[3]]
    x[0, -1, -1, -1] = -np.inf
    prep = conv2d_prepare("depthwise", wt, b, kw["stride"], kw["padding"], kw["dilation"], kw["groups"], layout="nchwc")
    ho = ref.conv_out_size(x.shape[2], wt.shape[2], kw["stride"][0], kw["padding"][0], kw["padding"][1],
                           kw["dilation"][0])
    wo = ref.conv_out_size(x.shape[3], wt.shape[3], kw["stride"][1], kw["padding"][2], kw["padding"][3],
                           kw["dilation"][1])
    shape = nchwc_shape((x.shape[0], wt.shape[0], ho, wo))
    plain = np.zeros(shape, np.float32)
    conv2d_run_nchwc("depthwise", plain, to_nchwc(x), prep, None, act=None, threads=1, **kw)
    f = plain.reshape(-1)
    A.apply_span(f, 0, f.size, 2, np.float32(0.0), np.float32(6.0))
    assert (plain == 0.0).any() and (np.isnan(plain).any() or case[0] == "k7_dil2_asym")   # (its taps skip the NaN)
    for t in (1, 2, 3):
        got = np.full(shape, -7.0, np.float32)
        conv2d_run_nchwc("depthwise", got, to_nchwc(x), prep, None, act=A.encode("clip", 0.0, 6.0), threads=t, **kw)
        assert np.array_equal(got.view(np.uint32), plain.view(np.uint32)), t


def test_depthwise_tasks_split_large_maps_and_group_small_ones():
    big = depthwise.plan_tasks(2, 6, 112, 112, 9)
    assert all(t[2] - t[1] == 1 for t in big) and max(t[4] - t[3] for t in big) < 112
    assert sorted((t[0], t[1], t[3]) for t in big) == sorted({(t[0], t[1], t[3]) for t in big})
    for threads in (1, 16):
        small = depthwise.plan_tasks(1, 60, 7, 7, 9, threads)
        assert all(t[3:] == (0, 7) for t in small) and max(t[2] - t[1] for t in small) > 1
        covered = sorted(b for t in small for b in range(t[1], t[2]))
        assert covered == list(range(60))
    # more threads: smaller tasks (never below planner.DW_TASK_MIN_VFMAS), so 16 cores get work at batch 1
    assert len(depthwise.plan_tasks(1, 6, 56, 56, 9, 16)) > len(depthwise.plan_tasks(1, 6, 56, 56, 9, 1))
    assert depthwise.use_padded(7, 7) and depthwise.use_padded(28, 28) and not depthwise.use_padded(56, 56)
    # 3x3 at stride 2: the band copy (four input values per output) only pays at 7x7 outputs; 5x5 keeps it
    assert depthwise.use_padded(7, 7, 3, 2) and not depthwise.use_padded(14, 14, 3, 2)
    assert not depthwise.use_padded(28, 28, 3, 2) and depthwise.use_padded(28, 28, 5, 2)


def test_depthwise_rejects_mismatched_blocks():
    x, wt, b, _, kw = _dw_case(DW_CASES[0])
    prep = conv2d_prepare("depthwise", wt, b, kw["stride"], kw["padding"], kw["dilation"], kw["groups"],
                          layout="nchwc")
    ob = np.zeros(nchwc_shape((1, 48, 12, 12)), np.float32)
    with pytest.raises(ValueError, match="depthwise"):
        conv2d_run_nchwc("depthwise", ob, to_nchwc(x), prep, None, **kw)


# ------------------------------------------------------------------ grouped kernel

def test_grouped_bundles():
    assert grouped.bundle(32, 32, 2) == (1, 1, 1, 2)          # cg = og = 16
    assert grouped.bundle(48, 48, 6) == (2, 1, 1, 3)          # RegNet group width 8
    assert grouped.bundle(128, 128, 32) == (4, 1, 1, 8)       # ResNeXt 32x4d stage 1
    assert grouped.bundle(72, 72, 3) == (2, 3, 3, 2)          # cg 24: 2 groups in 3 blocks
    assert grouped.applies(128, 128, 32) and not grouped.applies(48, 48, 16)   # cg 3: L = 16
    assert not grouped.applies(32, 32, 32) and not grouped.applies(32, 64, 1)  # depthwise, dense


@pytest.mark.parametrize("case", GROUPED_CASES, ids=lambda c: c[0])
def test_grouped_nchwc_against_reference(case):
    x, wt, b, res, kw = _grouped_case(case, residual=True)
    assert "grouped" in candidates(x.shape, wt.shape, kw["stride"], kw["padding"], kw["dilation"], kw["groups"])
    act = ("clip", 0.0, 6.0)
    _, got = _run_nchwc("grouped", x, wt, b, res, kw, act=act)
    _check("grouped", got, _want(x, wt, b, res, kw, act))


def test_grouped_nchw_entry():
    x, wt, b, _, kw = _grouped_case(GROUPED_CASES[2])
    prep = conv2d_prepare("grouped", wt, b, kw["stride"], kw["padding"], kw["dilation"], kw["groups"])
    want = _want(x, wt, b, None, kw)
    out = np.full_like(want, np.nan)
    conv2d_run("grouped", out, x, prep, None, **kw)
    _check("grouped", out, want)


@pytest.mark.parametrize("case", [GROUPED_CASES[1], GROUPED_CASES[3], GROUPED_CASES[7]], ids=lambda c: c[0])
def test_grouped_thread_counts_bitwise_identical(case, monkeypatch):
    monkeypatch.setattr(planner, "GROUPED_TASK_FLOPS", 1e4)   # one block group per task, several row bands
    x, wt, b, res, kw = _grouped_case(case, seed=9, residual=True)
    outs = [_run_nchwc("grouped", x, wt, b, res, kw, act=("hardswish", 0.0, 0.0), threads=t)[0] for t in THREADS]
    for o in outs[1:]:
        assert np.array_equal(outs[0], o)


# ------------------------------------------------------------------ selection, layout, end to end

def test_selection():
    one = ((1, 1), (1, 1, 1, 1), (1, 1))
    assert select_algorithm((1, 96, 56, 56), (96, 1, 3, 3), *one, 96) == "depthwise"
    assert select_algorithm((1, 8, 9, 9), (16, 1, 3, 3), *one, 8) == "depthwise"       # multiplier 2
    assert select_algorithm((1, 128, 56, 56), (128, 4, 3, 3), *one, 32) == "grouped"   # ResNeXt
    assert select_algorithm((1, 48, 16, 16), (48, 3, 3, 3), *one, 16) == "im2col"      # cg 3: L 16


def _bn(rng, c):
    return dict(gamma=rng.uniform(0.5, 1.5, c), beta=rng.standard_normal(c) * 0.1, mean=rng.standard_normal(c) * 0.1,
                var=rng.uniform(0.5, 1.5, c))


def _inverted_residual(net, x, rng, cin, cout, expand, stride, k=3, name="b"):
    """MobileNetV2 block: 1x1 expand + BN + ReLU, kxk depthwise + BN + ReLU, 1x1 project + BN (+ x)."""
    hid = cin * expand
    w = lambda *s: (rng.standard_normal(s) * np.sqrt(2.0 / np.prod(s[1:]))).astype(np.float32)  # noqa: E731
    y = net.relu(net.batch_norm(net.conv2d(x, w(hid, cin, 1, 1), name=f"{name}_expand"), **_bn(rng, hid)))
    y = net.relu(net.batch_norm(net.conv2d(y, w(hid, 1, k, k), stride=stride, padding=k // 2, groups=hid,
                                           name=f"{name}_dw"), **_bn(rng, hid)))
    y = net.batch_norm(net.conv2d(y, w(cout, hid, 1, 1), name=f"{name}_project"), **_bn(rng, cout))
    return net.add(y, x) if stride == 1 and cin == cout else y


def _mobilenet_like(batch=2, size=24):
    rng = np.random.default_rng(0)
    net = tilefuse.Network("mnv2_blocks")
    x = net.input("x", (batch, 3, size, size))
    w = (rng.standard_normal((16, 3, 3, 3)) * 0.3).astype(np.float32)
    y = net.relu(net.batch_norm(net.conv2d(x, w, stride=2, padding=1, name="stem"), **_bn(rng, 16)))
    y = _inverted_residual(net, y, rng, 16, 24, 6, 2, name="b1")
    y = _inverted_residual(net, y, rng, 24, 24, 6, 1, name="b2")
    y = _inverted_residual(net, y, rng, 24, 32, 6, 1, k=5, name="b3")
    net.output(net.global_avg_pool(y))
    return net


def test_mobilenet_blocks_run_blocked_end_to_end_without_conversions():
    net = _mobilenet_like()
    x = np.random.default_rng(1).standard_normal(net.inputs[0].shape).astype(np.float32)
    c = tilefuse.compile(net)
    rows = c.plan().rows
    kernels = [r["kernel"] for r in rows]
    assert "to_nchwc" not in kernels and "from_nchwc" not in kernels
    dws = [r for r in rows if r["kernel"] == "conv2d" and r["params"]["groups"] > 1]
    assert len(dws) == 3 and all(r["algorithm"] == "depthwise" and r["layout"] == "nchwc" for r in dws)
    assert all(r["partitioning"] != "-" for r in dws)
    want = tilefuse.evaluate(net, [x])
    want = want[0] if isinstance(want, (list, tuple)) else list(want.values())[0] if isinstance(want, dict) else want
    outs = [tilefuse.Session(tilefuse.compile(net, threads=t)).run(x) for t in (1, 2, 3)]
    got = tilefuse.Session(c).run(x)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= 1e-4, err
    assert all(np.array_equal(outs[0], o) for o in outs[1:])
    # the same network on NCHW (layout="nchw": the depthwise NCHW entry) agrees too
    nchw = tilefuse.Session(tilefuse.compile(net, layout="nchw")).run(x)
    assert np.abs(nchw - want).max() / np.abs(want).max() <= 1e-4


def test_grouped_block_compiles_blocked():
    rng = np.random.default_rng(2)
    net = tilefuse.Network("resnext_like")
    x = net.input("x", (1, 64, 10, 10))
    w = lambda *s: (rng.standard_normal(s) * np.sqrt(2.0 / np.prod(s[1:]))).astype(np.float32)  # noqa: E731
    y = net.relu(net.conv2d(x, w(64, 64, 1, 1), name="reduce"))
    y = net.relu(net.conv2d(y, w(64, 8, 3, 3), np.zeros(64, np.float32), padding=1, groups=8, name="grouped"))
    y = net.conv2d(y, w(64, 64, 1, 1), name="expand")
    net.output(net.relu(net.add(y, x)))
    c = tilefuse.compile(net)
    g = next(r for r in c.plan().rows if r["kernel"] == "conv2d" and r["params"]["groups"] == 8)
    assert g["algorithm"] == "grouped" and g["layout"] == "nchwc"
    xv = rng.standard_normal((1, 64, 10, 10)).astype(np.float32)
    want = tilefuse.evaluate(net, [xv])
    want = want[0] if isinstance(want, (list, tuple)) else list(want.values())[0] if isinstance(want, dict) else want
    got = tilefuse.Session(c).run(xv)
    assert np.abs(got - want).max() / np.abs(want).max() <= 1e-4


def test_small_layer_rule_lets_depthwise_use_the_threads():
    """Layers below a FLOP threshold run on the calling thread (registry.threads_for, a shape rule).
    Depthwise runs ~10x fewer FLOP/s than the dense convs, so its threshold is lower: a 7x7 x 576 layer
    (0.5 MFLOP, ~23 us on one core) runs on the session's threads (MobileNetV2 batch 1 at 2 threads: the
    depthwise rows -12%), a 7x7 x 16 one stays on one, and at 16 threads the threshold is 4x; a dense 1x1 of
    0.4 MFLOP stays on one thread."""
    from tilefuse.kernels import registry
    from tilefuse.kernels.conv.layout import nchwc_shape

    def views(c, hw, w_shape):
        x = np.zeros(nchwc_shape((1, c, hw, hw)), np.float32)
        return [x, np.zeros(w_shape, np.float32), np.zeros(c, np.float32), np.zeros_like(x)]

    dw = dict(algorithm="depthwise", prepared=("weight", "bias"), layout="nchwc")
    assert registry.threads_for("conv2d", views(576, 7, (36, 3, 3, 16)), dw, 2) == 2
    assert registry.threads_for("conv2d", views(16, 7, (1, 3, 3, 16)), dw, 2) == 1
    # on many threads a region costs more (~16 us at 16): the threshold grows with the thread count
    assert registry.threads_for("conv2d", views(576, 7, (36, 3, 3, 16)), dw, 16) == 1
    assert registry.threads_for("conv2d", views(960, 14, (60, 3, 3, 16)), dw, 16) == 16
    dense = dict(algorithm="gemm1x1", prepared=("weight", "bias"), layout="nchwc")
    assert registry.threads_for("conv2d", views(64, 7, (64, 64)), dense, 2) == 1     # 2*49*4096 = 0.4 MFLOP


# ------------------------------------------------------------------ one operation sequence on every path

@intrinsic
def _fma32(typingctx, a, b, c):
    """fma(a, b, c) in float32, one rounding (LLVM's llvm.fma.f32)."""
    if not all(t == types.float32 for t in (a, b, c)):
        return None

    def codegen(context, builder, signature, args):
        f = llvm_ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f], llvm_ir.FunctionType(f, [f, f, f]))
        return builder.call(fn, args)
    return types.float32(types.float32, types.float32, types.float32), codegen


@njit(cache=False)
def _fma_sequence(x, w, b, m, sh, sw, pt, pl, dh, dw, ho, wo):
    """The depthwise spec's operation order, value by value: acc = 0; for kh, then kw ascending over the
    taps inside the image, acc = fma(x, w, acc); then acc + bias."""
    n, c, h, wi = x.shape
    co, _, kh_n, kw_n = w.shape
    out = np.empty((n, co, ho, wo), np.float32)
    for i in range(n):
        for o in range(co):
            ci = o // m
            for oh in range(ho):
                for ow in range(wo):
                    acc = np.float32(0.0)
                    for kh in range(kh_n):
                        ih = oh * sh - pt + kh * dh
                        if ih < 0 or ih >= h:
                            continue
                        for kw in range(kw_n):
                            iw = ow * sw - pl + kw * dw
                            if 0 <= iw < wi:
                                acc = _fma32(x[i, ci, ih, iw], w[o, 0, kh, kw], acc)
                    out[i, o, oh, ow] = acc + b[o]
    return out


@pytest.mark.parametrize("padded", [False, True], ids=["in_place", "padded_band"])
@pytest.mark.parametrize("case", DW_CASES, ids=lambda c: c[0])
def test_depthwise_every_path_is_the_fma_sequence(case, padded, monkeypatch):
    """Every output value, whichever path computes it (a register block of 8 or of 7 positions, each
    constant-offset specialization, the clamped generic block, the border positions, the padded band, the
    lane-gather variant), is the spec's sequence: fma over the taps inside the image in (kh, kw) order, then
    + bias; bitwise. (A 7-wide block's 7th position came out of a plain multiply and add in the KW = 5 stride-2
    code, last bits apart from the 8-wide blocks'.)"""
    monkeypatch.setattr(depthwise, "PADDED", padded)
    _, n, c, h, w, m, k, s, pad, d = case
    x, wt, b, _, kw = _dw_case(case, seed=11)
    _, got = _run_nchwc("depthwise", x, wt, b, None, kw)
    want = _fma_sequence(x, wt, b, m, s, s, pad[0], pad[2], d, d, got.shape[2], got.shape[3])
    bad = np.argwhere(got.view(np.uint32) != want.view(np.uint32))
    assert len(bad) == 0, f"{len(bad)} values differ from the fma sequence, first at {bad[0].tolist()}: " \
                          f"{got[tuple(bad[0])]!r} against {want[tuple(bad[0])]!r}"


def test_depthwise_generated_blocks_are_current():
    import pathlib
    path = pathlib.Path(depthwise.__file__).with_name("_depthwise_gen.py")
    assert path.read_text() == depthwise.generate_block_source(), "run: python -m tilefuse.kernels.conv.depthwise"
