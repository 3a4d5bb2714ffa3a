"""conv_transpose2d on NCHW16c (kernels/conv/transpose.py): the phase kernel against PyTorch and the
reference (kernels/reference.conv_transpose2d), compiled networks against evaluate().

Tolerance 1e-4 relative to max|y| (fp32): the same products as the reference, summed per output in
(kh, kw, ci) order with FMA instead of the reference's tap-by-tap scatter. Thread counts 1, 2, 3,
5, 8 give bitwise identical outputs.
"""
import numpy as np
import pytest

import tilefuse
from tilefuse.kernels import activations as A
from tilefuse.kernels import reference as ref
from tilefuse.kernels.conv import from_nchwc, nchwc_shape, to_nchwc, transpose

TOL = 1e-4

# (name, N, Ci, H, W, Co, k, stride, padding (t, b, l, r), output_padding, dilation, groups)
CASES = [
    ("unet_2x2_s2", 1, 32, 8, 8, 16, 2, 2, (0, 0, 0, 0), 0, 1, 1),
    ("unet_odd_c", 2, 19, 5, 7, 13, 2, 2, (0, 0, 0, 0), 0, 1, 1),
    ("k3_s2_p1_op1", 2, 19, 5, 7, 13, 3, 2, (1, 1, 1, 1), 1, 1, 1),
    ("k4_s2_p1", 1, 16, 6, 5, 40, 4, 2, (1, 1, 1, 1), 0, 1, 1),
    ("k3_s1_dil2", 1, 8, 7, 6, 24, 3, 1, (1, 1, 1, 1), 0, 2, 1),
    ("k5_s3_op2", 1, 24, 5, 5, 32, 5, 3, (2, 2, 2, 2), 2, 1, 1),
    ("k1_s2_gaps", 1, 16, 4, 5, 16, 1, 2, (0, 0, 0, 0), 1, 1, 1),
    ("k3_s2_groups2", 1, 32, 6, 6, 32, 3, 2, (1, 1, 1, 1), 1, 1, 2),
    ("k3_s2_dil2_groups2", 1, 20, 5, 6, 30, 3, 2, (0, 0, 0, 0), 1, 2, 2),
    ("asym_pad", 1, 16, 6, 7, 20, 3, 2, (2, 0, 0, 1), 1, 1, 1),
    ("wide_maps", 1, 16, 9, 23, 48, 2, 2, (0, 0, 0, 0), 0, 1, 1),
]


def _case(case, seed=0):
    _, n, ci, h, w, co, k, s, pad, op, d, g = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, ci, h, w)).astype(np.float32)
    wt = rng.standard_normal((ci, co // g, k, k)).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32)
    kw = dict(stride=(s, s), padding=pad, output_padding=(op, op), dilation=(d, d), groups=g)
    return x, wt, b, kw


def _want(x, wt, b, kw, act=None):
    return ref.conv_transpose2d(x, wt, b, kw["stride"], kw["padding"], kw["output_padding"], kw["dilation"],
                                kw["groups"], act=act)


def _run(x, wt, b, kw, act=None, threads=None):
    prep = transpose.prepare(wt, b, kw["groups"])
    want_shape = _want(x, wt, b, kw).shape
    ob = np.full(nchwc_shape(want_shape), np.nan, np.float32)
    transpose.run_nchwc(ob, to_nchwc(x), prep, stride=kw["stride"], padding=kw["padding"], dilation=kw["dilation"],
                        act=act, threads=threads)
    assert np.isfinite(ob).all(), "unwritten output elements"
    return ob, from_nchwc(ob, want_shape[1])


def _check(got, want):
    assert got.shape == want.shape
    err = np.abs(got - want).max() / max(1.0, float(np.abs(want).max()))
    assert err <= TOL, f"max error {err:.3g}"


@pytest.mark.parametrize("case", [c for c in CASES if c[8][0] == c[8][1] and c[8][2] == c[8][3]], ids=lambda c: c[0])
def test_reference_matches_torch(case):
    torch = pytest.importorskip("torch")
    x, wt, b, kw = _case(case)
    want = torch.nn.functional.conv_transpose2d(torch.from_numpy(x), torch.from_numpy(wt), torch.from_numpy(b),
                                                kw["stride"], (kw["padding"][0], kw["padding"][2]),
                                                kw["output_padding"], kw["groups"], kw["dilation"]).numpy()
    _check(_want(x, wt, b, kw), want)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_phase_kernel_against_reference(case):
    x, wt, b, kw = _case(case)
    ob, got = _run(x, wt, b, kw)
    co = got.shape[1]
    assert not ob[:, -1, ..., co - (ob.shape[1] - 1) * 16:].any(), "padded channels must stay zero"
    _check(got, _want(x, wt, b, kw))


@pytest.mark.parametrize("name", ["relu", "clip", "silu", "hardswish", "leaky_relu", "gelu"])
def test_fused_activation(name):
    x, wt, b, kw = _case(CASES[2], seed=1)
    act = (name, *{"clip": (0.0, 6.0), "leaky_relu": (0.1, 0.0)}.get(name, (0.0, 0.0)))
    _check(_run(x, wt, b, kw, act=act)[1], _want(x, wt, b, kw, act=act))


def test_nchw_entry():
    x, wt, b, kw = _case(CASES[3])
    want = _want(x, wt, b, kw)
    out = np.full_like(want, np.nan)
    transpose.run(out, x, transpose.prepare(wt, b, 1), stride=kw["stride"], padding=kw["padding"],
                  dilation=kw["dilation"])
    _check(out, want)


@pytest.mark.parametrize("case", [CASES[1], CASES[5], CASES[8]], ids=lambda c: c[0])
def test_thread_counts_bitwise_identical(case, monkeypatch):
    monkeypatch.setattr(transpose, "TASK_FLOPS", 2e4)   # many small tasks
    x, wt, b, kw = _case(case, seed=2)
    ho = _want(x, wt, b, kw).shape[2]
    assert len(transpose.plan_tasks(x.shape[0], ho, _want(x, wt, b, kw).shape[3], -(-x.shape[1] // 16) * 16,
                                    -(-wt.shape[1] * kw["groups"] // 32), 1)) > 3
    outs = [_run(x, wt, b, kw, act=("relu", 0.0, 0.0), threads=t)[0] for t in (1, 2, 3, 5, 8)]
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


def test_column_padding_only_where_phases_read_outside():
    assert transpose.column_padding(8, 16, 2, 2, 1, 0) == (0, 0)        # UNet 2x2 s2: in place
    assert transpose.column_padding(7, 14, 3, 2, 1, 1) == (0, 1)        # k3 s2 p1 op1: ow 13 reads iw 7
    assert transpose.applies(1) and transpose.applies(4) and not transpose.applies(8)


def _decoder(groups=1, batch=2):
    """A UNet decoder step: 2x2 stride-2 upsampling, skip concat, 3x3 conv + ReLU, then a k4 s2 p1 up."""
    rng = np.random.default_rng(3)
    net = tilefuse.Network("decoder")
    x = net.input("x", (batch, 32, 6, 6))
    skip = net.input("skip", (batch, 16, 12, 12))
    w = lambda *s: (rng.standard_normal(s) * np.sqrt(1.0 / np.prod(s[1:]))).astype(np.float32)  # noqa: E731
    u = net.conv_transpose2d(x, w(32, 16 // groups, 2, 2), rng.standard_normal(16).astype(np.float32), stride=2,
                             groups=groups)
    y = net.relu(net.conv2d(net.concat([u, skip], axis=1), w(32, 32, 3, 3), padding=1))
    y = net.conv_transpose2d(y, w(32, 24, 4, 4), None, stride=2, padding=1)
    net.output(y)
    return net


@pytest.mark.parametrize("groups", [1, 8])
def test_compiled_decoder_matches_evaluate(groups):
    net = _decoder(groups)
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal(d.shape).astype(np.float32) for d in net.inputs]
    c = tilefuse.compile(net)
    convt = [r for r in c.plan().rows if r["kernel"] == "conv_transpose2d"]
    assert len(convt) == 2
    # groups 8 > MAX_DENSE_GROUPS: the first runs the NCHW GEMM + col2im kernel, the second the phase kernel
    assert [r["algorithm"] for r in convt] == (["phase", "phase"] if groups == 1 else ["-", "phase"])
    assert convt[-1]["layout"] == "nchwc"
    want = tilefuse.evaluate(net, xs)
    want = want[0] if isinstance(want, (list, tuple)) else list(want.values())[0] if isinstance(want, dict) else want
    got = tilefuse.Session(c).run(xs)
    _check(got, want)
    got1 = tilefuse.Session(tilefuse.compile(net, threads=1)).run(xs)
    assert np.array_equal(got, got1)


def test_relu_fused_into_the_phase_kernel():
    net2 = tilefuse.Network("up_relu")
    x = net2.input("x", (1, 16, 5, 5))
    rng = np.random.default_rng(5)
    net2.output(net2.relu(net2.conv_transpose2d(x, rng.standard_normal((16, 16, 2, 2)).astype(np.float32),
                                                 np.ones(16, np.float32), stride=2)))
    c = tilefuse.compile(net2)
    rows = [r for r in c.plan().rows if r["kernel"] not in ("to_nchwc", "from_nchwc")]
    assert [r["kernel"] for r in rows] == ["conv_transpose2d"]
    xv = rng.standard_normal((1, 16, 5, 5)).astype(np.float32)
    want = A.reference("relu", _want(xv, net2.ops[0].inputs[1].value, np.ones(16, np.float32),
                                     dict(stride=(2, 2), padding=(0, 0, 0, 0), output_padding=(0, 0),
                                          dilation=(1, 1), groups=1)))
    _check(tilefuse.Session(c).run(xv), want)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_wide_and_narrow_tiles_same_bits(case, monkeypatch):
    """Both register tiles (7 positions x 2 blocks on AVX-512, 5 x 1 on hosts with 256-bit vectors;
    tilegen.TRANSPOSE) on every case (odd channel counts, odd pair counts, gaps, bands): bitwise equal
    and equal to the reference, whichever kind of host runs the test."""
    monkeypatch.setattr(transpose, "TASK_FLOPS", 5e4)   # tasks that start mid-map and mid-pairs
    x, wt, b, kw = _case(case, seed=3)
    outs = []
    for tile in (transpose._convt_rows_narrow, transpose._convt_rows_wide):
        monkeypatch.setattr(transpose, "_convt_rows", tile)
        outs.append(_run(x, wt, b, kw, act=("clip", 0.0, 6.0), threads=2))
    assert np.array_equal(outs[0][0], outs[1][0])
    _check(outs[0][1], _want(x, wt, b, kw, act=("clip", 0.0, 6.0)))
