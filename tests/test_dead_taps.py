"""The compile pass that drops a conv's kernel rows / columns reading only zero padding
(`passes.prune_dead_taps`): DeepLabV3's ASPP convs (dilation 12 / 24 / 36) on maps smaller than their
dilation, a 5x5 conv on a 1x1 map. Each case runs compiled (and through save / load_package) against the
reference evaluator on the network as written, and checks the kernel that runs is the trimmed one.

fp32 tolerance: 1e-5 of the output's max (the dropped taps add products with zeros; the kept ones are
summed in another order by the fast kernels).
"""
from __future__ import annotations

import numpy as np
import pytest

import tilefuse
from tilefuse.compiler.passes import _live_taps
from tilefuse.kernels import reference as ref
from test_kernels_modern import run_both

RNG = np.random.default_rng(5)


def _w(shape):
    return (RNG.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


# (input shape, weight shape, stride, padding, dilation, groups, kernel left after pruning)
CASES = {
    "aspp_d12_8x8": ((1, 24, 8, 8), (20, 24, 3, 3), 1, 12, 12, 1, (1, 1)),
    "aspp_d36_8x8": ((2, 24, 8, 8), (20, 24, 3, 3), 1, 36, 36, 1, (1, 1)),
    "d5_8x8_all_live": ((1, 24, 8, 8), (20, 24, 3, 3), 1, 5, 5, 1, (3, 3)),
    "5x5_on_1x1": ((1, 40, 1, 1), (24, 40, 5, 5), 1, 2, 1, 1, (1, 1)),
    "rows_only_2x16": ((1, 16, 2, 16), (16, 16, 3, 3), 1, 3, 3, 1, (1, 3)),
    "stride2_d3_4x4": ((1, 16, 4, 4), (32, 16, 3, 3), 2, 3, 3, 1, (2, 2)),
    "depthwise_d8_6x6": ((1, 48, 6, 6), (48, 1, 3, 3), 1, 8, 8, 48, (1, 1)),
    "7x7_on_2x2": ((1, 32, 2, 2), (32, 32, 7, 7), 1, 3, 1, 1, (3, 3)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_dead_taps_dropped_same_output(name):
    xs, ws, s, p, d, g, left = CASES[name]
    net = tilefuse.Network(name)
    x = net.input("x", xs)
    y = net.conv2d(x, _w(ws), _w((ws[0],)), stride=s, padding=p, dilation=d, groups=g, name="conv")
    net.output(net.relu(y))
    c = run_both(net, [RNG.standard_normal(xs).astype(np.float32)])
    conv = [i for i in c.package.program() if i.kernel == "conv2d"][0]
    assert tuple(conv.params["weight_shape"][2:]) == left, conv.params
    if left == (1, 1) and g == 1:
        assert conv.params["algorithm"] == "gemm1x1", conv.params


@pytest.mark.parametrize("seed", range(40))
def test_live_taps_against_reference_conv(seed):
    """Random geometry (sizes 1-9, kernels 1-5, stride 1-3, dilation 1-7, paddings 0-9 on each side): the
    trimmed kernel with the trimmed paddings gives the reference conv's output exactly (the dropped
    taps' products are with zeros), and only dead taps are ever dropped."""
    r = np.random.default_rng(seed)
    while True:          # draw until the geometry has an output
        h, w = (int(v) for v in r.integers(1, 10, 2))
        kh, kw = (int(v) for v in r.integers(1, 6, 2))
        s = tuple(int(v) for v in r.integers(1, 4, 2))
        d = tuple(int(v) for v in r.integers(1, 8, 2))
        pad = tuple(int(v) for v in r.integers(0, 10, 4))
        ho = (h + pad[0] + pad[1] - d[0] * (kh - 1) - 1) // s[0] + 1
        wo = (w + pad[2] + pad[3] - d[1] * (kw - 1) - 1) // s[1] + 1
        if ho >= 1 and wo >= 1:
            break
    x = r.standard_normal((1, 3, h, w)).astype(np.float32)
    wt = r.standard_normal((2, 3, kh, kw)).astype(np.float32)
    want = ref.conv2d(x, wt, None, s, pad, d)
    rows = _live_taps(h, ho, kh, pad[0], pad[1], s[0], d[0]) or (0, kh - 1, pad[0], pad[1])
    cols = _live_taps(w, wo, kw, pad[2], pad[3], s[1], d[1]) or (0, kw - 1, pad[2], pad[3])
    got = ref.conv2d(x, np.ascontiguousarray(wt[:, :, rows[0]:rows[1] + 1, cols[0]:cols[1] + 1]), None, s,
                     (rows[2], rows[3], cols[2], cols[3]), d)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # a dropped tap reads only padding: zeroing the kept taps leaves the output zero
    wz = wt.copy()
    wz[:, :, rows[0]:rows[1] + 1, cols[0]:cols[1] + 1] = 0
    assert not np.any(ref.conv2d(x, wz, None, s, pad, d))
