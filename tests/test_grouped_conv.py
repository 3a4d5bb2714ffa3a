"""Grouped convs with groups inside one 16-lane block (cg = og in 2, 4, 8: RegNet's group width 8),
the lanes kernel (tilefuse/kernels/conv/grouped_lanes.py), issue 9.

Against the reference conv (the spec) and PyTorch's F.conv2d on odd shapes (channels not a multiple
of 16, odd maps, 3x3 / 5x5, stride 2, dilation 2, padding 0 / 1 / asymmetric, batch 1 / 3), every
epilogue, thread counts 1 / 2 / 3 / 5 bitwise equal, and a NaN kept inside its own group (the
dense-tile form lets it reach the other group of the block: 0 * NaN = NaN).
Tolerance: max |got - want| <= 1e-4 * max(|want|, 1) (the same products, fp32 summation order).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tilefuse.kernels import reference as ref
from tilefuse.kernels.conv import (candidates, conv2d_prepare, conv2d_run, conv2d_run_nchwc, from_nchwc, grouped,
                                   grouped_lanes, nchwc_shape, planner, select_algorithm, to_nchwc)
from tilefuse.kernels.conv.front import bind

TOL = 1e-4
THREADS = (1, 2, 3, 5)

# (name, N, C, H, W, cg, k, stride, padding (t, b, l, r), dilation)
CASES = [
    ("cg8_48_3x3", 1, 48, 13, 9, 8, 3, 1, (1, 1, 1, 1), 1),
    ("cg8_24_s2_b3", 3, 24, 13, 9, 8, 3, 2, (1, 1, 1, 1), 1),
    ("cg8_40_5x5", 1, 40, 13, 9, 8, 5, 1, (2, 2, 2, 2), 1),
    ("cg8_40_5x5_s2", 1, 40, 13, 9, 8, 5, 2, (2, 2, 2, 2), 1),
    ("cg8_24_dil2", 1, 24, 13, 9, 8, 3, 1, (2, 2, 2, 2), 2),
    ("cg8_pad0", 3, 40, 13, 9, 8, 3, 1, (0, 0, 0, 0), 1),
    ("cg8_w7_s1", 1, 48, 7, 7, 8, 3, 1, (1, 1, 1, 1), 1),          # 7-wide maps: their own offsets
    ("cg8_w7_s2", 2, 16, 14, 13, 8, 3, 2, (1, 1, 1, 1), 1),
    ("cg8_wide", 1, 16, 9, 23, 8, 3, 1, (1, 1, 1, 1), 1),           # a short last block moves left
    ("cg8_narrow", 1, 32, 5, 3, 8, 3, 1, (1, 1, 1, 1), 1),          # narrower than a register block
    ("cg4_40_3x3", 1, 40, 13, 9, 4, 3, 1, (1, 1, 1, 1), 1),
    ("cg4_s2_pad0", 3, 20, 13, 9, 4, 3, 2, (0, 0, 0, 0), 1),
    ("cg4_5x5_dil2", 1, 24, 13, 17, 4, 5, 1, (4, 4, 4, 4), 2),
    ("cg2_26_3x3", 1, 26, 13, 9, 2, 3, 1, (1, 1, 1, 1), 1),
    ("cg2_s2_b3", 3, 34, 13, 19, 2, 3, 2, (1, 1, 1, 1), 1),
    ("cg2_5x5", 1, 18, 13, 9, 2, 5, 1, (2, 2, 2, 2), 1),
    ("cg2_narrow", 2, 18, 6, 5, 2, 3, 1, (1, 1, 1, 1), 1),          # the runtime-offset block at cg 2
    ("cg8_asym_pad", 1, 24, 11, 10, 8, 3, 1, (2, 0, 1, 2), 1),
    ("cg8_1x1_s2", 1, 24, 9, 9, 8, 1, 2, (0, 0, 0, 0), 1),
]
EPILOGUES = ["none", "relu", "residual_relu", "silu"]


def _case(case, seed=0, residual=False, dtype=np.float32):
    _, n, c, h, w, cg, k, s, pad, d = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    wt = (rng.standard_normal((c, cg, k, k)) / np.sqrt(cg * k * k)).astype(dtype)
    b = rng.standard_normal(c).astype(dtype)
    ho = ref.conv_out_size(h, k, s, pad[0], pad[1], d)
    wo = ref.conv_out_size(w, k, s, pad[2], pad[3], d)
    res = rng.standard_normal((n, c, ho, wo)).astype(dtype) if residual else None
    return x, wt, b, res, dict(stride=(s, s), padding=pad, dilation=(d, d), groups=c // cg)


def _act(epi):
    return {"none": None, "relu": ("relu", 0.0, 0.0), "residual_relu": ("relu", 0.0, 0.0),
            "silu": ("silu", 0.0, 0.0)}[epi]


def _torch(x, wt, b, res, kw, act=None):
    t, bo, l, r = kw["padding"]
    xt = F.pad(torch.from_numpy(x), (l, r, t, bo))
    y = F.conv2d(xt, torch.from_numpy(wt), torch.from_numpy(b), kw["stride"], 0, kw["dilation"], kw["groups"])
    if res is not None:
        y = y + torch.from_numpy(res)
    if act is not None:
        y = {"relu": torch.relu, "silu": F.silu}[act[0]](y)
    return y.numpy()


def _run_nchwc(x, wt, b, res, kw, act=None, threads=1, form=None):
    prep = (grouped.prepare(wt, b, kw["groups"], form=form) if form else
            conv2d_prepare("grouped", wt, b, kw["stride"], kw["padding"], kw["dilation"], kw["groups"], layout="nchwc"))
    ho, wo = ref.conv_out_size(x.shape[2], wt.shape[2], kw["stride"][0], kw["padding"][0], kw["padding"][1],
                               kw["dilation"][0]), \
        ref.conv_out_size(x.shape[3], wt.shape[3], kw["stride"][1], kw["padding"][2], kw["padding"][3],
                          kw["dilation"][1])
    ob = np.full(nchwc_shape((x.shape[0], wt.shape[0], ho, wo)), np.nan, np.float32)
    conv2d_run_nchwc("grouped", ob, to_nchwc(x), prep, to_nchwc(res) if res is not None else None, act=act,
                     threads=threads, **kw)
    return ob, from_nchwc(ob, wt.shape[0])


def _check(got, want):
    assert got.shape == want.shape
    err = float(np.abs(got - want).max())
    assert err <= TOL * max(float(np.abs(want).max()), 1.0), err


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_lanes_against_reference_and_torch(case):
    x, wt, b, _, kw = _case(case)
    assert grouped_lanes.applies(x.shape[1], wt.shape[0], kw["groups"])
    assert "grouped" in candidates(x.shape, wt.shape, kw["stride"], kw["padding"], kw["dilation"], kw["groups"])
    prep = conv2d_prepare("grouped", wt, b, kw["stride"], kw["padding"], kw["dilation"], kw["groups"], layout="nchwc")
    assert grouped.uses_lanes(prep) and prep["weight"].shape[3:] == (wt.shape[1], 16)
    ob, got = _run_nchwc(x, wt, b, None, kw)
    want = ref.conv2d(x, wt, b, **kw)
    _check(got, want)
    _check(got, _torch(x, wt, b, None, kw))
    assert not np.isnan(ob).any()                                   # every output written
    assert not ob.transpose(0, 1, 4, 2, 3).reshape(ob.shape[0], -1, *ob.shape[2:4])[:, wt.shape[0]:].any()  # padding 0


@pytest.mark.parametrize("epi", EPILOGUES)
@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[10], CASES[13], CASES[7]], ids=lambda c: c[0])
def test_lanes_epilogues(case, epi):
    x, wt, b, res, kw = _case(case, seed=1, residual=epi.startswith("residual"))
    act = _act(epi)
    _, got = _run_nchwc(x, wt, b, res, kw, act=act)
    _check(got, ref.conv2d(x, wt, b, residual=res, act=act, **kw))
    _check(got, _torch(x, wt, b, res, kw, act))


def test_lanes_nchw_entry():
    x, wt, b, res, kw = _case(CASES[3], seed=2, residual=True)
    prep = conv2d_prepare("grouped", wt, b, kw["stride"], kw["padding"], kw["dilation"], kw["groups"])
    want = ref.conv2d(x, wt, b, residual=res, act=("relu", 0.0, 0.0), **kw)
    out = np.full_like(want, np.nan)
    conv2d_run("grouped", out, x, prep, res, act=("relu", 0.0, 0.0), **kw)
    _check(out, want)


@pytest.mark.parametrize("case", [CASES[1], CASES[3], CASES[6], CASES[12], CASES[14]], ids=lambda c: c[0])
def test_lanes_thread_counts_bitwise_identical(case, monkeypatch):
    monkeypatch.setattr(planner, "GL_TASK_VFMAS", 1 << 10)       # many small tasks: row bands and block groups
    monkeypatch.setattr(planner, "GL_TASK_MIN_VFMAS", 1 << 9)
    x, wt, b, res, kw = _case(case, seed=9, residual=True)
    table = planner.plan_grouped_lanes_tasks(x.shape[0], -(-wt.shape[0] // 16), res.shape[2], res.shape[3],
                                             wt.shape[2], wt.shape[3], wt.shape[1])
    assert len(table) > 3
    outs = [_run_nchwc(x, wt, b, res, kw, act=("silu", 0.0, 0.0), threads=t)[0] for t in THREADS]
    for o in outs[1:]:
        assert np.array_equal(outs[0], o)
    # and the default task table gives the same bits
    monkeypatch.undo()
    assert np.array_equal(outs[0], _run_nchwc(x, wt, b, res, kw, act=("silu", 0.0, 0.0), threads=2)[0])


def _nan_case(cg):
    """NaN (and inf) in input channel 1 of group 0: torch keeps them in group 0's outputs."""
    case = ("nan", 1, 32, 9, 11, cg, 3, 1, (1, 1, 1, 1), 1)
    x, wt, b, _, kw = _case(case, seed=4)
    x[0, 1, 4, 5] = np.nan
    x[0, 16 + 1, 2, 2] = np.inf                # the second block: group 16 // cg
    return x, wt, b, kw


def _nan_positions_match(got, want, cg):
    assert np.array_equal(np.isnan(got), np.isnan(want))
    others = np.ones(got.shape[1], bool)
    others[:cg] = others[16:16 + cg] = False
    assert np.isfinite(got[:, others]).all()


@pytest.mark.parametrize("cg", [2, 4, 8])
def test_nan_stays_in_its_group(cg):
    x, wt, b, kw = _nan_case(cg)
    want = _torch(x, wt, b, None, kw)
    assert np.isnan(want[:, :cg]).any() and np.isfinite(want[:, cg:16]).all()
    _, got = _run_nchwc(x, wt, b, None, kw)
    _nan_positions_match(got, want, cg)
    ok = np.isfinite(want)
    _check(np.where(ok, got, 0), np.where(ok, want, 0))


@pytest.mark.xfail(strict=True, reason="the dense-tile form multiplies the other groups' inputs by zero weights: "
                                       "0 * NaN = NaN reaches every group of the block (why the lanes form exists)")
def test_nan_leaks_in_the_dense_tile_form():
    x, wt, b, kw = _nan_case(8)
    _, got = _run_nchwc(x, wt, b, None, kw, form="tiles")
    _nan_positions_match(got, _torch(x, wt, b, None, kw), 8)


def test_dense_tile_form_still_available_and_equal_on_finite_inputs():
    x, wt, b, res, kw = _case(CASES[0], seed=3, residual=True)
    _, lanes = _run_nchwc(x, wt, b, res, kw, act=("relu", 0.0, 0.0))
    _, tiles = _run_nchwc(x, wt, b, res, kw, act=("relu", 0.0, 0.0), form="tiles")
    assert grouped.prepare(wt, b, kw["groups"], form="tiles")["weight"].ndim == 7
    _check(lanes, tiles)


def test_applies_and_selection():
    assert grouped_lanes.applies(48, 48, 6) and grouped_lanes.applies(40, 40, 10) and grouped_lanes.applies(26, 26, 13)
    assert not grouped_lanes.applies(32, 32, 2)          # cg 16: the dense-tile form (L = 1)
    assert not grouped_lanes.applies(48, 96, 6)          # og != cg
    assert not grouped_lanes.applies(48, 48, 16)         # cg 3
    assert not grouped_lanes.applies(32, 32, 32)         # depthwise
    # RegNet's grouped layers (group width 8) select it
    one = ((1, 1, 1, 1), (1, 1))
    for c, h, s in ((48, 112, 2), (48, 56, 1), (104, 28, 1), (208, 14, 1), (440, 7, 1), (440, 14, 2)):
        for n in (1, 32):
            assert select_algorithm((n, c, h, h), (c, 8, 3, 3), (s, s), *one, c // 8) == "grouped"
    # cg 2 bundles 8 groups per block (L = 8 > MAX_WASTE): grouped only through the lanes form
    assert "grouped" in candidates((1, 32, 9, 9), (32, 2, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 16)
    assert grouped.prepare(np.zeros((32, 16, 3, 3), np.float32), None, 2)["weight"].ndim == 7
    with pytest.raises(ValueError, match="lanes"):
        grouped.prepare(np.zeros((32, 16, 3, 3), np.float32), None, 2, form="lanes")


def test_task_table_covers_every_output_once():
    for (n, ob, ho, wo, k, cg) in [(1, 3, 56, 56, 3, 8), (32, 28, 7, 7, 3, 8), (1, 28, 7, 7, 3, 8), (3, 2, 13, 9, 5, 4)]:
        t = planner.plan_grouped_lanes_tasks(n, ob, ho, wo, k, k, cg)
        cover = np.zeros((n, ob, ho), int)
        for i, b0, b1, r0, r1 in t:
            cover[i, b0:b1, r0:r1] += 1
        assert (cover == 1).all()


def test_bind_checks_the_lanes_weight():
    x, wt, b, _, kw = _case(CASES[0])
    prep = conv2d_prepare("grouped", wt, b, kw["stride"], kw["padding"], kw["dilation"], kw["groups"], layout="nchwc")
    shapes = {k: v.shape for k, v in prep.items()}
    xs, os_ = nchwc_shape(x.shape), nchwc_shape((1, 48, 13, 9))
    layer = bind("grouped", xs, os_, shapes, stride=kw["stride"], padding=kw["padding"], dilation=kw["dilation"],
                 groups=kw["groups"], layout="nchwc")
    assert layer.describe()["tiles"]["form"] == "lanes"
    ob = np.empty(os_, np.float32)
    layer(ob, to_nchwc(x), prep, None)
    _check(from_nchwc(ob, 48), ref.conv2d(x, wt, b, **kw))
    bad = dict(shapes, weight=(3, 3, 3, 6, 16))          # cg 6: not a lanes weight
    with pytest.raises(ValueError, match="lanes"):
        bind("grouped", xs, os_, bad, stride=kw["stride"], padding=kw["padding"], dilation=kw["dilation"],
             groups=kw["groups"], layout="nchwc")
    bad = dict(shapes, weight=(2, 3, 3, 8, 16))          # 2 blocks for a 3-block tensor
    with pytest.raises(ValueError, match="does not fit"):
        bind("grouped", xs, os_, bad, stride=kw["stride"], padding=kw["padding"], dilation=kw["dilation"],
             groups=kw["groups"], layout="nchwc")
    with pytest.raises(ValueError, match="does not fit"):   # groups x cg must match the tensors' blocks
        bind("grouped", xs, os_, shapes, stride=kw["stride"], padding=kw["padding"], dilation=kw["dilation"],
             groups=2, layout="nchwc")
