"""The squeeze-excitation means from the depthwise conv's epilogue (issue 9): `conv/_nb.row_sum16`,
`depthwise.run_nchwc(row_sums=)`, `squeeze.squeeze_excitation(row_sums=)` and the session's binding of
depthwise -> squeeze-excitation pairs (kernels/registry.py `bind_se_sums`).

The means are sums of row sums in one fixed order whichever kernel computes the row sums, so a network
gives the same bits with the pairs bound and without (`TILEFUSE_SE_SUMS=0`), at every thread count.
Row sums against numpy: float32 sums in another order, within 1e-5 of the row's magnitude.
"""
from __future__ import annotations

import numpy as np
import pytest
from numba import njit

import tilefuse
from tilefuse import models
from tilefuse.kernels import reference as ref
from tilefuse.kernels import registry
from tilefuse.kernels.conv import depthwise
from tilefuse.kernels.conv._nb import row_sum16
from tilefuse.kernels.conv.layout import from_nchwc, to_nchwc
from tilefuse.kernels.squeeze import squeeze_excitation

RNG = np.random.default_rng(23)


def rand(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


@njit(cache=False)
def _rows(f, w, nrows, dst):
    for r in range(nrows):
        row_sum16(f, r * w * 16, w, dst, r * 16)


@pytest.mark.parametrize("w", [1, 2, 3, 4, 5, 7, 8, 13, 19])
def test_row_sum16_against_numpy(w):
    x = rand(3, w, 16, scale=3.0)
    got = np.zeros((3, 16), np.float32)
    _rows(x.reshape(-1), w, 3, got.reshape(-1))
    want = x.astype(np.float64).sum(axis=1)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(x).sum(axis=1).max())))


# (n, c, h, w, k, stride, padding, dilation, act, residual)
DW_CASES = [
    (1, 32, 17, 13, 3, 1, 1, 1, ("silu", 0.0, 0.0), False),
    (2, 40, 14, 14, 5, 2, 2, 1, ("silu", 0.0, 0.0), False),     # C not a multiple of 16, batch 2, stride 2
    (1, 24, 9, 11, 3, 1, 2, 2, ("clip", 0.0, 6.0), False),      # dilation, ReLU6 in the stores
    (1, 16, 7, 7, 3, 1, 1, 1, ("identity", 0.0, 0.0), True),     # residual, no activation
    (1, 48, 28, 28, 3, 2, 1, 1, ("hardswish", 0.0, 0.0), False),
    (3, 16, 5, 3, 5, 1, 2, 1, ("relu", 0.0, 0.0), False),
]


def _dw_case(n, c, h, w, k, s, p, d, residual):
    wt, b = rand(c, 1, k, k, scale=0.3), rand(c)
    prep = depthwise.prepare(wt, b, c)
    xb = to_nchwc(rand(n, c, h, w))
    ho = (h + 2 * p - d * (k - 1) - 1) // s + 1
    wo = (w + 2 * p - d * (k - 1) - 1) // s + 1
    cb = xb.shape[1]
    res = to_nchwc(rand(n, c, ho, wo)) if residual else None
    return prep, xb, res, (n, cb, ho, wo, 16)


@pytest.mark.parametrize("case", DW_CASES)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_depthwise_row_sums_are_the_rows_of_its_output(case, threads):
    """The epilogue's sums are each output row's sum after bias, residual and activation: the bits of
    row_sum16 over the stored output, for every row of every block and image; the output itself is the
    layer's without sums."""
    n, c, h, w, k, s, p, d, act, residual = case
    prep, xb, res, oshape = _dw_case(n, c, h, w, k, s, p, d, residual)
    kw = dict(stride=(s, s), padding=(p, p, p, p), dilation=(d, d), act=act, threads=threads)
    plain = np.empty(oshape, np.float32)
    depthwise.run_nchwc(plain, xb, prep, res, **kw)
    out = np.empty(oshape, np.float32)
    rs = np.full(oshape[:3] + (16,), np.nan, np.float32)
    depthwise.run_nchwc(out, xb, prep, res, row_sums=rs, **kw)
    assert np.array_equal(out, plain)
    want = np.empty_like(rs)
    nrows = oshape[0] * oshape[1] * oshape[2]
    _rows(out.reshape(-1), oshape[3], nrows, want.reshape(-1))
    assert np.array_equal(rs, want), f"max diff {np.nanmax(np.abs(rs - want))}"
    np.testing.assert_allclose(rs, out.astype(np.float64).sum(axis=3), rtol=0,
                               atol=1e-5 * max(1.0, float(np.abs(out).sum(axis=3).max())))


def test_depthwise_row_sums_refusals():
    prep, xb, _, oshape = _dw_case(1, 32, 8, 8, 3, 1, 1, 1, False)
    out = np.empty(oshape, np.float32)
    with pytest.raises(ValueError, match=r"row sums \(1, 2, 7, 16\).*expected a contiguous float32 \(1, 2, 8, 16\)"):
        depthwise.run_nchwc(out, xb, prep, padding=(1, 1, 1, 1), row_sums=np.zeros((1, 2, 7, 16), np.float32))
    mult = depthwise.prepare(rand(64, 1, 3, 3), None, 32)                  # channel multiplier 2
    out2 = np.empty((1, 4, 8, 8, 16), np.float32)
    with pytest.raises(ValueError, match="multiplier > 1"):
        depthwise.run_nchwc(out2, xb, mult, padding=(1, 1, 1, 1), row_sums=np.zeros((1, 4, 8, 16), np.float32))


@pytest.mark.parametrize("n,c,r", [(1, 40, 10), (3, 96, 4)])
def test_squeeze_excitation_from_row_sums_does_not_read_its_input(n, c, r):
    """Given the depthwise conv's row sums, the squeeze-excitation gives the bits it computes from x
    itself, without reading x (garbage in its place changes nothing), and both match the reference."""
    prep, xb, _, oshape = _dw_case(n, c, 15, 12, 3, 1, 1, 1, False)
    y = np.empty(oshape, np.float32)
    rs = np.empty(oshape[:3] + (16,), np.float32)
    depthwise.run_nchwc(y, xb, prep, padding=(1, 1, 1, 1), act=("silu", 0.0, 0.0), row_sums=rs, threads=2)
    w1, b1 = rand(r, c, 1, 1, scale=0.2), rand(r)
    w2, b2 = rand(c, r, 1, 1, scale=0.2), rand(c)
    se = dict(act=("silu", 0.0, 0.0), gate=("sigmoid", 0.0, 0.0), layout="nchwc")
    plain = np.empty((n, c, 1, 1), np.float32)
    squeeze_excitation(plain, y, w1, b1, w2, b2, threads=3, **se)
    got = np.empty_like(plain)
    squeeze_excitation(got, np.full_like(y, np.nan), w1, b1, w2, b2, threads=2, row_sums=rs, **se)
    assert np.array_equal(got, plain)
    want = ref.squeeze_excitation(from_nchwc(y, c), w1, b1, w2, b2, se["act"], se["gate"])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match=r"row sums \(1, 1, 1, 16\); expected"):
        squeeze_excitation(got, y, w1, b1, w2, b2, row_sums=np.zeros((1, 1, 1, 16), np.float32), **se)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_rows_are_added_in_float64(threads):
    """A tall map whose first row is 2^24 and every other row 1: float32 over the rows stopped at 2^24
    (the mean 2.4e-4 low; random 4K maps were 1.5e-6 off, global_avg_pool's float64 totals 3e-8). With
    identity FCs the SE's output is the mean itself; from x and from given row sums, the same bits."""
    c, h = 16, 4097
    x = np.ones((1, 1, h, 1, 16), np.float32)                  # NCHW16c, W = 1: each row sum is the value
    x[:, :, 0] = 2.0 ** 24
    eye = np.eye(c, dtype=np.float32).reshape(c, c, 1, 1)
    zero = np.zeros(c, np.float32)
    se = dict(act=("identity", 0.0, 0.0), gate=("identity", 0.0, 0.0), layout="nchwc", threads=threads)
    got = np.empty((1, c, 1, 1), np.float32)
    squeeze_excitation(got, x, eye, zero, eye, zero, **se)
    want = np.float32((2.0 ** 24 + h - 1) / h)
    np.testing.assert_allclose(got.reshape(-1), np.full(c, want), rtol=1e-7)
    from_rows = np.empty_like(got)
    squeeze_excitation(from_rows, x, eye, zero, eye, zero, row_sums=x[:, :, :, 0].copy(), **se)
    assert np.array_equal(from_rows, got)


@pytest.mark.parametrize("name,size", [("efficientnet_b0", 96), ("mobilenet_v3_large", 64)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_networks_with_se_sums_equal_without(name, size, threads, monkeypatch):
    """Whole networks: sessions with the pairs bound give the bits of sessions without, over several inputs
    (the replayed calls included), with pairs bound, and match the reference evaluator."""
    net = models.get(name, seed=0, batch=1, image_size=size)
    compiled = tilefuse.compile(net, threads=threads)
    xs = [RNG.standard_normal(net.inputs[0].shape).astype(np.float32) * s for s in (1.0, 2.0, 0.5)]
    monkeypatch.setattr(registry, "SE_SUMS", False)
    plain = tilefuse.Session(compiled, threads=threads)
    want = [plain.run(x) for x in xs]
    assert plain.se_sums() == {}
    monkeypatch.setattr(registry, "SE_SUMS", True)
    sess = tilefuse.Session(compiled, threads=threads)
    got = [sess.run(x) for x in xs]
    pairs = sess.se_sums()
    assert pairs, "no pair bound: the test would not exercise them"
    prog = compiled.package.program()
    for i, j in pairs.items():
        assert prog[i].params["algorithm"] == "depthwise" and prog[j].kernel == "squeeze_excitation" and j == i + 1
    for k, (g, w) in enumerate(zip(got, want)):
        assert np.array_equal(g, w), f"run {k}: max diff {np.abs(g - w).max()}"
    from tilefuse.interpreter import evaluate
    r = evaluate(net, xs[0])[0]
    np.testing.assert_allclose(got[0], r, rtol=0, atol=1e-4 * max(1.0, float(np.abs(r).max())))
