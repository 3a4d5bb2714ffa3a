"""Fast pooling / element-wise / linear / softmax kernels (kernels/pool.py, elementwise.py,
dense.py) against the reference (kernels/reference.py), on NCHW and on the blocked NCHW16c layout.

Tolerances: max pool exact (no arithmetic); average pools 1e-6 relative (float32 sums, other
order); linear 1e-5 relative (BLAS blocks K differently); softmax 1e-6.
"""
import numpy as np
import pytest

from tilefuse.kernels import dense, elementwise, pool
from tilefuse.kernels import reference as ref
from tilefuse.kernels.conv import from_nchwc, nchwc_shape, to_nchwc

RNG = np.random.default_rng(0)

POOLS = [  # kernel, stride, padding (t, b, l, r), dilation, ceil_mode, shape
    ((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False, (2, 64, 17, 16)),    # ResNet stem max pool
    ((2, 2), (2, 2), (0, 0, 0, 0), (1, 1), False, (1, 20, 14, 14)),    # VGG
    ((3, 3), (2, 2), (0, 0, 0, 0), (1, 1), True, (1, 17, 13, 12)),     # AlexNet-like, ceil mode
    ((3, 2), (1, 2), (1, 0, 1, 1), (2, 1), False, (3, 5, 9, 7)),       # odd: dilation, asymmetric
]


def _pool_call(kind, fn_out, x, k, s, p, d, ceil, layout, cip=True):
    o = np.full(fn_out, np.nan, np.float32)
    if kind == "max":
        pool.max_pool(o, x, kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=ceil, layout=layout)
    else:
        pool.avg_pool(o, x, kernel_size=k, stride=s, padding=p, ceil_mode=ceil, count_include_pad=cip, layout=layout)
    return o


@pytest.mark.parametrize("case", POOLS)
@pytest.mark.parametrize("kind,cip", [("max", True), ("avg", True), ("avg", False)])
@pytest.mark.parametrize("layout", ["nchw", "nchwc"])
def test_pools_against_reference(case, kind, cip, layout):
    k, s, p, d, ceil, shape = case
    if kind == "avg":
        d = (1, 1)
        p = tuple(min(v, kk // 2) for v, kk in zip(p, (k[0], k[0], k[1], k[1])))
    x = RNG.standard_normal(shape, dtype=np.float32)
    if kind == "max":
        want = ref.max_pool(x, k, s, p, d, ceil)
    else:
        want = ref.avg_pool(x, k, s, p, ceil, cip)
    assert want.dtype == np.float32
    if layout == "nchw":
        got = _pool_call(kind, want.shape, x, k, s, p, d, ceil, layout, cip)
    else:
        got = from_nchwc(_pool_call(kind, nchwc_shape(want.shape), to_nchwc(x), k, s, p, d, ceil, layout, cip),
                         shape[1])
    if kind == "max":
        assert np.array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", POOLS)
@pytest.mark.parametrize("lanes", [1, 16])
def test_max_pool_rows_from_a_ring(case, lanes):
    """The one max-pool loop on output rows [r0, r1) read from a ring of input rows (row i in
    slot i % cap, a capacity that makes the rows wrap), written into a strided ring-slot view:
    exact against the whole-tensor reference, nothing written outside the view."""
    k, s, p, d, ceil, shape = case
    x = RNG.standard_normal(shape, dtype=np.float32)
    want = ref.max_pool(x, k, s, p, d, ceil)
    n, c, h, w = shape
    ho, wo = want.shape[2:]
    x5 = x[..., None] if lanes == 1 else to_nchwc(x)               # (N, C, H, W, L)
    want5 = want[..., None] if lanes == 1 else to_nchwc(want)
    span = d[0] * (k[0] - 1) + 1
    for r0 in range(0, ho, 2):
        r1 = min(ho, r0 + 2)
        lo, hi = max(0, r0 * s[0] - p[0]), min(h, (r1 - 1) * s[0] - p[0] + span)
        cap = hi - lo + 1 + (r0 % 3)
        buf = np.full((n, x5.shape[1], cap) + x5.shape[3:], np.nan, np.float32)
        for i in range(lo, hi):
            buf[:, :, i % cap] = x5[:, :, i]
        big = np.zeros((n, x5.shape[1], r1 - r0 + 3, wo, x5.shape[4]), np.float32)
        pool.max_pool_rows(big[:, :, 1:1 + r1 - r0], buf, cap, r0, h, kernel_size=k, stride=s, padding=p,
                           dilation=d, threads=2)
        assert np.array_equal(big[:, :, 1:1 + r1 - r0], want5[:, :, r0:r1]), (r0, r1)
        assert not big[:, :, 0].any() and not big[:, :, 1 + r1 - r0:].any()


@pytest.mark.parametrize("task", [1, 100, 4096, 1 << 30])
@pytest.mark.parametrize("layout", ["nchw", "nchwc"])
def test_max_pool_row_chunks_and_thread_counts(monkeypatch, task, layout):
    """Max pool's tasks are row chunks of (image, channel) planes (MAX_POOL_TASK outputs at least):
    every chunk size (one row each .. whole planes) and thread count 1, 2, 3, 5, 16 gives the
    reference's bits, on a stem-like 3x3/2 pool with odd sizes; a NaN is its windows' max (as in
    PyTorch and the reference), -inf stays -inf."""
    monkeypatch.setattr(pool, "MAX_POOL_TASK", task)
    x = RNG.standard_normal((2, 35, 23, 19), dtype=np.float32)
    x[0, 3, 4, 5] = x[1, 17, 0, 0] = x[1, 34, 22, 18] = np.nan
    x[0, 20, 10, 10:13] = -np.inf
    k, s, p, d = (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)
    want = ref.max_pool(x, k, s, p, d, False)
    for threads in (1, 2, 3, 5, 16):
        if layout == "nchw":
            o = np.full(want.shape, np.nan, np.float32)
            pool.max_pool(o, x, kernel_size=k, stride=s, padding=p, dilation=d, layout=layout, threads=threads)
        else:
            ob = np.full(nchwc_shape(want.shape), np.nan, np.float32)
            pool.max_pool(ob, to_nchwc(x), kernel_size=k, stride=s, padding=p, dilation=d, layout=layout,
                          threads=threads)
            o = from_nchwc(ob, x.shape[1])
        assert np.isnan(want).sum() > 3 and np.array_equal(o, want, equal_nan=True), (task, threads)


@pytest.mark.parametrize("shape", [(2, 64, 7, 7), (1, 20, 3, 5), (1, 200, 40, 33), (3, 37, 112, 9)])
def test_global_avg_pool_both_layouts(shape):
    """(image, channel-block) tasks over a numba region: same bits for 1, 2, 3 and 16 threads
    (the (1, 200, 40, 33) and (3, 37, 112, 9) shapes have several tasks per image)."""
    x = RNG.standard_normal(shape, dtype=np.float32)
    want = ref.global_avg_pool(x)
    for layout, xin in (("nchw", x), ("nchwc", to_nchwc(x))):
        outs = []
        for threads in (1, 2, 3, 16):
            o = np.full(want.shape, np.nan, np.float32)
            pool.global_avg_pool(o, xin, layout=layout, threads=threads)
            np.testing.assert_allclose(o, want, rtol=1e-5, atol=1e-6)
            outs.append(o)
        assert all(np.array_equal(outs[0], o) for o in outs[1:])


def test_elementwise_and_scale():
    a, b = RNG.standard_normal((2, 3, 70000), dtype=np.float32), RNG.standard_normal((2, 3, 70000), dtype=np.float32)
    for relu in (False, True):
        o = np.empty_like(a)
        elementwise.add(o, a, b, relu=relu)
        assert np.array_equal(o, ref.add(a, b, relu=relu))
    o = np.empty_like(a)
    elementwise.relu(o, a)
    assert np.array_equal(o, ref.relu(a))
    x = RNG.standard_normal((2, 20, 4, 5), dtype=np.float32)
    al, be = RNG.standard_normal(20, dtype=np.float32), RNG.standard_normal(20, dtype=np.float32)
    want = ref.scale(x, al, be)
    o = np.empty_like(x)
    elementwise.scale(o, x, al, be)
    np.testing.assert_allclose(o, want, rtol=1e-6, atol=1e-6)
    ob = np.empty(nchwc_shape(x.shape), np.float32)
    elementwise.scale(ob, to_nchwc(x), al, be, layout="nchwc")
    np.testing.assert_allclose(from_nchwc(ob, 20), want, rtol=1e-6, atol=1e-6)
    assert not ob[:, 1, ..., 4:].any()   # padded channels stay zero


@pytest.mark.parametrize("rows", [1, 3, 8])     # <= dense.GEMV_ROWS: the numba GEMV; 8: BLAS blocks
@pytest.mark.parametrize("has_bias,relu", [(False, False), (True, False), (True, True)])
def test_linear(has_bias, relu, rows):
    x = RNG.standard_normal((rows, 601), dtype=np.float32)
    w = RNG.standard_normal((1000, 601), dtype=np.float32) / 25
    b = RNG.standard_normal(1000, dtype=np.float32)
    want = ref.linear(x, w, b if has_bias else None, relu)
    outs = []
    for t in (1, 2, 3):
        o = np.full((rows, 1000), np.nan, np.float32)
        dense.linear(o, x, w, *([b] if has_bias else []), has_bias=has_bias, relu=relu, threads=t)
        outs.append(o)
    assert np.array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[0], want, rtol=1e-5, atol=1e-5)


def test_softmax():
    x = RNG.standard_normal((4, 1000), dtype=np.float32) * 10
    o = np.empty_like(x)
    dense.softmax(o, x, axis=1)
    np.testing.assert_allclose(o, ref.softmax(x, 1), rtol=1e-6, atol=1e-7)
    x3 = RNG.standard_normal((2, 5, 3), dtype=np.float32)
    o3 = np.empty_like(x3)
    dense.softmax(o3, x3, axis=1)                  # not the last axis: the reference path
    np.testing.assert_allclose(o3, ref.softmax(x3, 1), rtol=1e-6)


@pytest.mark.parametrize("kind", [0, 1, 2])
def test_reduce16_is_the_lane_loop(kind):
    """conv._nb.reduce16 (16 lanes in a register) gives the bits of the scalar loop over 16 lanes it replaced:
    lane l takes values l mod 16 in order, the lanes combined in order; a NaN skipped by the max."""
    from numba import njit

    from tilefuse.kernels.conv._nb import reduce16

    @njit
    def vec(x, i0, n, sh, sc):
        return reduce16(x, i0, n, sh, sc, kind)

    x = RNG.standard_normal(16 * 9 + 5, dtype=np.float32) * 100
    x[37] = np.nan if kind == 0 else x[37]
    sh, sc = np.float32(0.3), np.float32(-1.7)
    lane = np.full(16, -np.inf if kind == 0 else 0.0, np.float32)
    for k in range(5, 5 + 16 * 8):
        t = np.float32((x[k] - sh) * sc)
        t = np.float32(t * t) if kind == 2 else t
        l = (k - 5) % 16
        lane[l] = (t if t > lane[l] else lane[l]) if kind == 0 else np.float32(lane[l] + t)
    r = np.float32(-np.inf if kind == 0 else 0.0)
    for v in lane:
        r = (v if v > r else r) if kind == 0 else np.float32(r + v)
    assert vec(x, 5, 8, sh, sc) == r


@pytest.mark.parametrize("shape,perm", [((3, 70, 165), (0, 2, 1)), ((1, 128, 1024), (0, 2, 1)),
                                        ((2, 3, 50, 120), (0, 1, 3, 2)), ((2, 40, 3, 150), (1, 3, 0, 2)),
                                        ((5, 33, 2, 128), (2, 0, 3, 1)), ((2, 5, 33, 17, 19), (0, 3, 1, 4, 2)),
                                        ((4, 17, 3), (1, 0, 2))])
def test_permute_register_tiles(shape, perm):
    """movement.permute: the batched 2-D transposes (16 x 16 register tiles, partial tiles and edges element by
    element, outer axes at any input stride) and the rest (numpy) equal numpy's transpose for 1, 2 and 3 threads."""
    from tilefuse.kernels import movement
    x = RNG.standard_normal(shape, dtype=np.float32)
    sizes, strides = movement._merged_axes(shape, perm)
    tiled = strides[-1] != 1 and strides[-2] == 1 and min(sizes[-2:]) >= 32 and x.size >= movement.TILED_MIN_SIZE
    assert tiled == (shape[-1] in (165, 1024, 120, 128))          # the cases meant to take the tiles do
    want = np.ascontiguousarray(np.transpose(x, perm))
    for th in (1, 2, 3):
        o = np.full(want.shape, np.nan, np.float32)
        movement.permute(o, x, perm=perm, threads=th)
        np.testing.assert_array_equal(o, want)


@pytest.mark.parametrize("shape,pad", [((1, 1000, 32, 32), (0, 0, 0, 0)), ((2, 35, 13, 21), (1, 2, 3, 1)),
                                       ((1, 16, 5, 40), (0, 0, 0, 0)), ((2, 17, 4, 33), (2, 0, 0, 3)),
                                       ((1, 3, 7, 5), (1, 1, 1, 1))])
def test_nchwc_conversions_register_tiles(shape, pad):
    """to_nchwc / from_nchwc (16 x 16 tiles transposed in registers, the last block's missing channels as zero
    lanes, spatial padding and the columns past the last full tile element by element) against numpy."""
    x = RNG.standard_normal(shape, dtype=np.float32)
    n, c, h, w = shape
    t, b, l, r = pad
    full = np.zeros((n, -(-c // 16) * 16, h + t + b, w + l + r), np.float32)
    full[:, :c, t:t + h, l:l + w] = x
    want = full.reshape(n, -1, 16, h + t + b, w + l + r).transpose(0, 1, 3, 4, 2)   # (N, Cb, Hp, Wp, 16)
    for th in (1, 2):
        np.testing.assert_array_equal(to_nchwc(x, pad, threads=th), want)
    np.testing.assert_array_equal(from_nchwc(to_nchwc(x), c), x)
    xb = RNG.standard_normal(nchwc_shape(shape), dtype=np.float32)
    np.testing.assert_array_equal(from_nchwc(xb, c), xb.transpose(0, 1, 4, 2, 3).reshape(n, -1, h, w)[:, :c])


def test_pools_identical_for_one_and_two_threads():
    x = to_nchwc(RNG.standard_normal((2, 40, 15, 15), dtype=np.float32))
    outs = []
    for t in (1, 2):
        o = np.empty((2, 3, 7, 7, 16), np.float32)
        pool.avg_pool(o, x, kernel_size=(3, 3), stride=(2, 2), padding=(0, 0, 0, 0), layout="nchwc", threads=t)
        outs.append(o)
    assert np.array_equal(*outs)


@pytest.mark.parametrize("seed", range(4))
def test_max_pool_vector_windows_match_the_general_loop_bitwise(seed):
    """The NCHW16c max pool (`_max_pool_rows16`: each window's rows and columns in registers,
    `_nb.maxwin16`) against the general loop (`_max_pool_rows`, which a non-contiguous view selects):
    the same bits, signed zeros and NaN included (max of +0.0 and -0.0 is whichever came first, so
    the order of the selects shows), over random kernels, strides, dilations and paddings."""
    rng = np.random.default_rng(seed)
    done = 0
    while done < 25:
        kh, kw, sh, sw, dh, dw = (int(v) for v in rng.integers(1, [5, 5, 4, 4, 3, 3]))
        pt, pl = int(rng.integers(0, (kh - 1) * dh // 2 + 1)), int(rng.integers(0, (kw - 1) * dw // 2 + 1))
        h, w = (int(v) for v in rng.integers(max(kh * dh, kw * dw, 3), 20, 2))
        ho, wo = (h + 2 * pt - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pl - dw * (kw - 1) - 1) // sw + 1
        x = rng.standard_normal((2, 3, h, w, 16)).astype(np.float32)
        m = rng.random(x.shape)
        x[m < 0.03], x[(m > 0.03) & (m < 0.12)], x[(m > 0.12) & (m < 0.21)] = np.nan, 0.0, -0.0
        kwargs = dict(kernel_size=(kh, kw), stride=(sh, sw), padding=(pt, pt, pl, pl), dilation=(dh, dw), threads=2)
        fast = np.zeros((2, 3, ho, wo, 16), np.float32)
        pool.max_pool_rows(fast, x, h, 0, h, **kwargs)
        xv = np.zeros((2, 3, h, w, 32), np.float32)[..., :16]          # strided views: the general loop
        yv = np.zeros((2, 3, ho, wo, 32), np.float32)[..., :16]
        xv[...] = x
        pool.max_pool_rows(yv, xv, h, 0, h, **kwargs)
        assert fast.tobytes() == np.ascontiguousarray(yv).tobytes(), (kh, kw, sh, sw, dh, dw, pt, pl, h, w)
        done += 1
