"""The copies the blocked conv kernels make before their tiles: the direct (and grouped) kernel's
zero-bordered band (`direct._pad_band`, which writes only the rows some tap reads) and the strided
1x1's gather (`k1x1._strided_seq`). Each is checked on its own (the rows it must write, the rows it
must leave alone) and through the kernel, with the scratch buffers poisoned with NaN so that a row
the kernel reads but the copy skipped shows up in the output."""
from __future__ import annotations

import numpy as np
import pytest

from tilefuse.kernels import reference as ref
from tilefuse.kernels.conv import direct, from_nchwc, k1x1, planner, to_nchwc
from tilefuse.kernels.conv.epilogue import EMPTY4
from tilefuse.kernels.threads import scratch

# (Cb, H, W, taps, dilation, stride, output rows of the task, first band row h0, left padding)
BANDS = [(2, 9, 7, 3, 1, 1, 3, -1, 1), (1, 28, 28, 3, 24, 1, 1, -24, 24), (3, 11, 5, 3, 4, 2, 2, -4, 4),
         (2, 13, 6, 5, 3, 1, 2, 2, 6), (1, 8, 8, 7, 2, 2, 3, -6, 6), (2, 6, 9, 1, 1, 2, 3, 0, 0),
         (1, 30, 4, 3, 12, 1, 4, 5, 12)]


def _read_rows(kh, dh, sh, rows_out):
    return {i * sh + ky * dh for i in range(rows_out) for ky in range(kh)}


@pytest.mark.parametrize("cb,h,w,kh,dh,sh,rows_out,h0,pl", BANDS)
def test_pad_band_writes_exactly_the_rows_the_taps_read(cb, h, w, kh, dh, sh, rows_out, h0, pl):
    rng = np.random.default_rng(cb * 100 + h)
    x = rng.standard_normal((2, cb, h, w, 16)).astype(np.float32)
    nrows = (rows_out - 1) * sh + (kh - 1) * dh + 1
    wp = w + 2 * pl
    band = np.full((1, cb, nrows, wp, 16), np.nan, np.float32)
    direct._pad_band(band, x, 1, h0, pl, kh, dh, sh, rows_out)
    # the padded image of x[1]: rows h0 .. h0 + nrows - 1 with zeros outside
    padded = np.zeros((cb, nrows, wp, 16), np.float32)
    for r in range(nrows):
        if 0 <= h0 + r < h:
            padded[:, r, pl:pl + w] = x[1, :, h0 + r]
    read = _read_rows(kh, dh, sh, rows_out)
    for r in range(nrows):
        if r in read:
            assert np.array_equal(band[0, :, r], padded[:, r]), f"row {r} (read by a tap) wrong"
        else:
            assert np.isnan(band[0, :, r]).all(), f"row {r} is read by no tap but was written"
    # rows_out 0: every row written
    full = np.full_like(band, np.nan)
    direct._pad_band(full, x, 1, h0, pl, kh, dh, sh, 0)
    assert np.array_equal(full[0], padded)


# (N, C, H, W, Co, k, stride, padding, dilation): ASPP-like dilations wider than the map, strided
# dilated convs, odd sizes
DILATED = [(1, 35, 9, 11, 20, 3, 1, 6, 6), (1, 16, 28, 28, 16, 3, 1, 12, 12), (2, 19, 10, 7, 33, 3, 2, 4, 4),
           (1, 24, 12, 12, 40, 3, 1, 24, 24), (1, 17, 13, 9, 16, 5, 1, 4, 2), (1, 32, 7, 7, 48, 3, 2, 1, 1)]


@pytest.mark.parametrize("n,c,h,w,co,k,s,p,d", DILATED)
def test_direct_with_poisoned_band_scratch(n, c, h, w, co, k, s, p, d):
    """The direct kernel over bands that skip rows, its per-thread band scratch full of NaN first, with
    bands of one output row (the dilated layers' tasks) and the planner's, at 1, 2 and 3 threads:
    equal to the reference conv, and the same bits for every thread count."""
    rng = np.random.default_rng(c * 7 + h)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((co, c, k, k)) * 0.2).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32)
    want = ref.conv2d(x, wt, b, (s, s), (p, p, p, p), (d, d), 1)
    ho, wo = want.shape[2:]
    prep = direct.prepare(wt, b)
    for rows in (1, None):
        outs = []
        for threads in (1, 2, 3):
            pl = planner.plan_direct(-(-c // 16), k, d, s, ho, w + 2 * p, wo=wo, n=n, ob=-(-co // 16), kw=k,
                                     padded=True, threads=threads)
            if rows is not None:
                pl = dict(pl, rows=rows)
            ntasks = n * -(-ho // pl["rows"]) * -(-(-(-co // 16)) // pl["blocks"])
            elems = direct._band_elems(-(-c // 16), pl["rows"], s, k, d, w + 2 * p)
            nb_rows = direct.numba_max_threads() if direct.region_threads(threads, ntasks) > 1 else 1
            scratch("direct_band", (nb_rows, max(1, elems)))[...] = np.nan
            ob = np.full((n, -(-co // 16), ho, wo, 16), np.nan, np.float32)
            direct.run_nchwc(ob, to_nchwc(x), prep, stride=(s, s), padding=(p, p, p, p), dilation=(d, d),
                             threads=threads, plan=pl)
            got = from_nchwc(ob, co)
            assert np.isfinite(got).all(), "a row the taps read was not copied into the band"
            err = np.abs(got - want).max() / max(1.0, float(np.abs(want).max()))
            assert err <= 1e-4, f"{threads} threads, rows {pl['rows']}: max error {err:.3g}"
            outs.append(got)
        assert all(np.array_equal(outs[0], o) for o in outs[1:]), "bits differ between thread counts"


# (N, C, H, W, Co, stride): RegNetY's / ResNet's strided projections and odd sizes
STRIDED = [(1, 32, 112, 112, 48, 2), (2, 48, 13, 9, 40, 2), (1, 20, 15, 15, 16, 3), (3, 16, 8, 8, 70, 2)]


@pytest.mark.parametrize("gather_values", [16, 8192])
@pytest.mark.parametrize("n,c,h,w,co,s", STRIDED)
def test_strided_1x1_gather(n, c, h, w, co, s, gather_values, monkeypatch):
    """The strided 1x1's gather (one output row a task with gather_values 16, several otherwise; a
    partial last task where the rows do not divide), through the kernel at 1, 2 and 3 threads with
    the gather's scratch poisoned: equal to the reference conv, the same bits for every thread count,
    and the gathered map equal to x[:, :, ::s, ::s]."""
    monkeypatch.setattr(k1x1, "GATHER_VALUES", gather_values)
    rng = np.random.default_rng(c + h)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((co, c, 1, 1)) * 0.2).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32)
    want = ref.conv2d(x, wt, b, (s, s), (0, 0, 0, 0), (1, 1), 1)
    ho, wo = want.shape[2:]
    prep = k1x1.prepare(wt, b)
    xb = to_nchwc(x)
    outs = []
    for t in (1, 2, 3):
        scratch("k1x1_strided", (n, xb.shape[1], ho, wo, 16))[...] = np.nan
        ob = np.full((n, -(-co // 16), ho, wo, 16), np.nan, np.float32)
        k1x1.run_nchwc(ob, xb, prep, stride=(s, s), threads=t)
        got = from_nchwc(ob, co)
        err = np.abs(got - want).max() / max(1.0, float(np.abs(want).max()))
        assert np.isfinite(got).all() and err <= 1e-4, f"{t} threads: max error {err:.3g}"
        outs.append(got)
    assert all(np.array_equal(outs[0], o) for o in outs[1:])
    xs = np.full((n, xb.shape[1], ho, wo, 16), np.nan, np.float32)
    rows = max(1, gather_values // (16 * wo))
    k1x1.numba_region(k1x1._strided_par, k1x1._strided_seq, 2, n * xb.shape[1] * -(-ho // rows), xs, xb, s, s, rows)
    assert np.array_equal(xs, xb[:, :, ::s, ::s][:, :, :ho, :wo])


# (Ho, Wo, KH, KW, stride, dilation, padding top/left, input H, W)
LIVE = [(28, 28, 3, 3, 1, 24, 24, 28, 28), (28, 28, 3, 3, 1, 12, 12, 28, 28), (9, 7, 3, 3, 2, 4, 4, 17, 13),
        (5, 11, 5, 5, 1, 3, 6, 5, 11), (14, 14, 7, 7, 2, 1, 3, 28, 28), (6, 6, 3, 3, 1, 1, 1, 6, 6),
        (4, 9, 3, 5, 1, 6, 7, 4, 9)]


@pytest.mark.parametrize("ho,wo,kh,kw,s,d,p,h,w", LIVE)
def test_live_taps_are_the_hull_of_each_positions_live_taps(ho, wo, kh, kw, s, d, p, h, w):
    """`direct._live_taps` for every tile of 1..6 positions of a band: the kernel rows and columns it
    keeps hold every position's taps that read the image (not the zero border), and are exactly the hulls
    of the kernel rows some position's row reads and of the columns some position's column reads.
    Narrower would drop products (wrong results), wider would compute zeros."""
    live = (p, p + h, p, p + w)
    kr = np.zeros((1, 4), np.int64)
    for nv in (1, 5, 6):
        for pb in range(0, ho * wo - nv + 1, 3):
            direct._live_taps(kr, 0, pb, nv, wo, s, s, d, d, kh, kw, live)
            taps = [(ky, kx) for q in range(pb, pb + nv) for ky in range(kh) for kx in range(kw)
                    if p <= (q // wo) * s + ky * d < p + h and p <= (q % wo) * s + kx * d < p + w]
            ys = {ky for q in range(pb, pb + nv) for ky in range(kh) if p <= (q // wo) * s + ky * d < p + h}
            xs = {kx for q in range(pb, pb + nv) for kx in range(kw) if p <= (q % wo) * s + kx * d < p + w}
            assert all(kr[0, 0] <= ky < kr[0, 1] and kr[0, 2] <= kx < kr[0, 3] for ky, kx in taps), (pb, nv)
            # exactly the hull of the rows some position's row reads and of the columns some column reads
            assert (kr[0, 0], kr[0, 1]) == ((min(ys), max(ys) + 1) if ys else (0, 0)), (pb, nv)
            assert (kr[0, 2], kr[0, 3]) == ((min(xs), max(xs) + 1) if xs else (0, 0)), (pb, nv)


@pytest.mark.skipif(not (direct.ASM_AVX2 or direct.ASM_512),
                    reason="the assembly tiles (x86-64 AVX2 or AVX-512 hosts) skip dead taps")
@pytest.mark.parametrize("c,co,k,s,d,p,h,w,kb", [(32, 32, 3, 1, 12, 12, 28, 28, 2), (48, 16, 3, 2, 4, 4, 17, 13, 1),
                                                 (16, 48, 5, 1, 3, 6, 9, 11, 1), (64, 32, 3, 1, 24, 24, 28, 28, 4),
                                                 (32, 48, 3, 1, 2, 2, 7, 33, 1), (16, 16, 3, 2, 1, 1, 9, 31, 1)])
def test_live_taps_give_the_bits_of_all_taps(c, co, k, s, d, p, h, w, kb):
    """The host's assembly direct kernel (the AVX2 tile, the AVX-512 strip) on a padded band with its live
    taps only against the same kernel over every tap (ALL_LIVE): the same values bit for bit (the skipped
    products are x * 0), the AVX2 one sliced or not, with a bias and a residual; and against the reference
    conv. (33 and 31 columns: AVX-512 rows of two whole 14-position tiles and a rest, border tiles both.)"""
    rng = np.random.default_rng(c + k + d)
    x = rng.standard_normal((1, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((co, c, k, k)) * 0.2).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32)
    res = rng.standard_normal((1, co, (h + 2 * p - d * (k - 1) - 1) // s + 1,
                               (w + 2 * p - d * (k - 1) - 1) // s + 1)).astype(np.float32)
    want = ref.conv2d(x, wt, b, (s, s), (p, p, p, p), (d, d), 1, residual=res)
    ho, wo = want.shape[2:]
    prep = direct.prepare(wt, b)
    xp = to_nchwc(x, (p, p, p, p))                               # (1, Cb, H + 2p, W + 2p, 16), zeros around
    cb, ob = xp.shape[1], -(-co // 16)
    wp = w + 2 * p
    xv = xp.reshape(1, cb, -1, 16)
    rb = to_nchwc(res).reshape(1, ob, ho * wo, 16)
    outs = []
    for live in ((p, p + h, p, p + w), direct.ALL_LIVE):
        o = np.full((1, ob, ho * wo, 16), np.nan, np.float32)
        if direct.ASM_512:
            direct._direct_rows_512(o, 0, 0, xv, 0, 0, prep["weight"], 0, ho, wo, wp, s, s, d, d, prep["bias"], rb,
                                    True, 0, np.float32(0), np.float32(0), 0, ob, live)
        else:
            direct._direct_rows_avx2_sliced(o, 0, 0, xv, 0, 0, prep["weight"], 0, ho, wo, wp, s, s, d, d,
                                            prep["bias"], rb, True, 0, np.float32(0), np.float32(0), 0, ob, kb, live)
        outs.append(o)
    assert np.array_equal(outs[0], outs[1])
    got = from_nchwc(outs[0].reshape(1, ob, ho, wo, 16), co)
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max()))


@pytest.mark.skipif(not direct.ASM_512, reason="the AVX-512 strip's two-row calls (maps at most 7 wide)")
@pytest.mark.parametrize("c,co,k,s,d,p,h,w,code", [(48, 40, 3, 1, 1, 1, 7, 7, 1), (32, 32, 3, 2, 1, 1, 14, 13, 0),
                                                   (16, 48, 3, 1, 1, 1, 6, 5, 2), (32, 16, 3, 1, 2, 2, 9, 3, 0),
                                                   (16, 32, 5, 1, 1, 2, 8, 6, 1), (64, 16, 3, 1, 1, 1, 5, 1, 0),
                                                   (16, 16, 3, 1, 1, 1, 8, 8, 0), (32, 16, 3, 1, 1, 1, 6, 13, 1)])
def test_two_row_calls_give_the_rows_bits(c, co, k, s, d, p, h, w, code):
    """On maps at most 7 wide the AVX-512 direct rows run two output rows whose taps are all live in one strip
    call (`_nb.dstrip512x2`); one row at a time (oh1 = oh0 + 1: no pairs) must give the same bytes, with a
    residual, an activation and the border rows' live taps; and the reference conv's values. (8 and 13 wide:
    one tile a row, not two rows: an 8..13-wide map paired as 7 + 7 positions computed the wrong outputs.)"""
    rng = np.random.default_rng(c + k + h)
    x = rng.standard_normal((1, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((co, c, k, k)) * 0.2).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32)
    ho, wo = (h + 2 * p - d * (k - 1) - 1) // s + 1, (w + 2 * p - d * (k - 1) - 1) // s + 1
    assert wo < 14      # one tile a row (8..13 wide: too wide for two rows a tile, must not pair)
    res = rng.standard_normal((1, co, ho, wo)).astype(np.float32)
    want = ref.conv2d(x, wt, b, (s, s), (p, p, p, p), (d, d), 1, residual=res)
    if code == 1:
        want = np.maximum(want, 0)
    elif code == 2:
        want = np.clip(want, -0.5, 0.5)
    prep = direct.prepare(wt, b)
    xp = to_nchwc(x, (p, p, p, p))
    cb, ob = xp.shape[1], -(-co // 16)
    xv = xp.reshape(1, cb, -1, 16)
    rb = to_nchwc(res).reshape(1, ob, ho * wo, 16)
    outs = []
    for rows in ([(0, ho)], [(r, r + 1) for r in range(ho)]):
        o = np.full((1, ob, ho * wo, 16), np.nan, np.float32)
        for r0, r1 in rows:
            direct._direct_rows_512(o, 0, 0, xv, 0, 0, prep["weight"], r0, r1, wo, w + 2 * p, s, s, d, d,
                                    prep["bias"], rb, True, code, np.float32(-0.5), np.float32(0.5), 0, ob,
                                    (p, p + h, p, p + w))
        outs.append(o)
    assert outs[0].tobytes() == outs[1].tobytes()
    got = from_nchwc(outs[0].reshape(1, ob, ho, wo, 16), co)
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max()))


@pytest.mark.skipif(not (direct.ASM_AVX2 or direct.ASM_512),
                    reason="the assembly tiles (x86-64 AVX2 or AVX-512 hosts) skip dead taps")
@pytest.mark.parametrize("c,co,hw,s", [(32, 48, 14, 1), (16, 32, 31, 1), (48, 16, 20, 2)])
def test_dead_taps_are_not_read(c, co, hw, s):
    """A 3x3 conv dilated by the map's size (padding the same): every output's outer taps read only the
    padding, so the live taps are the centre tap alone for every tile. With the padding full of NaN instead
    of zeros, a kernel that still multiplies the dead taps returns NaN; skipping them gives the centre tap's
    1x1 conv (the reference conv with zero padding)."""
    d = p = hw
    rng = np.random.default_rng(c + hw)
    x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
    wt = (rng.standard_normal((co, c, 3, 3)) * 0.2).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32)
    want = ref.conv2d(x, wt, b, (s, s), (p, p, p, p), (d, d), 1)
    ho, wo = want.shape[2:]
    prep = direct.prepare(wt, b)
    xp = to_nchwc(x, (p, p, p, p))
    inside = np.zeros(xp.shape[2:4], bool)
    inside[p:p + hw, p:p + hw] = True
    xp[:, :, ~inside] = np.nan                                    # the padding poisoned
    cb, ob, wp = xp.shape[1], -(-co // 16), hw + 2 * p
    o = np.full((1, ob, ho * wo, 16), np.nan, np.float32)
    args = (o, 0, 0, xp.reshape(1, cb, -1, 16), 0, 0, prep["weight"], 0, ho, wo, wp, s, s, d, d, prep["bias"],
            EMPTY4, False, 0, np.float32(0), np.float32(0), 0, ob)
    if direct.ASM_512:
        direct._direct_rows_512(*args, (p, p + hw, p, p + hw))
    else:
        direct._direct_rows_avx2_sliced(*args, 1, (p, p + hw, p, p + hw))
    got = from_nchwc(o.reshape(1, ob, ho, wo, 16), co)
    assert np.isfinite(got).all(), "a dead tap's padding was read"
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max()))


@pytest.mark.parametrize("c,co,g,k,s,d,h,w", [(48, 48, 2, 3, 1, 4, 13, 11), (48, 96, 2, 3, 2, 6, 17, 9),
                                              (32, 32, 4, 5, 1, 3, 10, 12)])
def test_grouped_tiles_with_poisoned_band_scratch(c, co, g, k, s, d, h, w):
    """The grouped conv's tiles form shares the band copy (`_pad_band` per block group): dilated, its band
    scratch full of NaN first (one thread: the scratch is this thread's), equal to the reference."""
    from tilefuse.kernels.conv import grouped
    rng = np.random.default_rng(c + co + k)
    p = d * (k // 2)
    x = rng.standard_normal((1, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((co, c // g, k, k)) * 0.2).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32)
    want = ref.conv2d(x, wt, b, (s, s), (p, p, p, p), (d, d), g)
    ho, wo = want.shape[2:]
    prep = grouped.prepare(wt, b, g, form="tiles")
    assert not grouped.uses_lanes(prep)
    _, obg, cbg, kh, kw = prep["weight"].shape[:5]
    rows = grouped._rows(cbg, obg, kh, kw, (s, s), (d, d), ho, wo, w + 2 * p, True)
    scratch("grouped_pad", cbg * ((rows - 1) * s + (kh - 1) * d + 1) * (w + 2 * p) * 16)[...] = np.nan
    ob = np.full((1, -(-co // 16), ho, wo, 16), np.nan, np.float32)
    grouped.run_nchwc(ob, to_nchwc(x), prep, stride=(s, s), padding=(p, p, p, p), dilation=(d, d), threads=1)
    got = from_nchwc(ob, co)
    assert np.isfinite(got).all(), "a row the taps read was not copied into the band"
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max()))


def test_bands_past_the_l2_rule():
    """Small maps may take row bands past the L2/2 rule (planner.BAND_PAST_L2: the weights read once per
    band instead of once per L2-sized band). On a 256 KiB L2 the planner's band for this layer is past the
    rule; the kernel over it, its band scratch poisoned, equals the reference and has the bits of the
    L2-rule bands (BAND_PAST_L2 = 0) at 1, 2 and 3 threads. A wide map's bands keep the rule."""
    n, c, h, w, co, k, s, p = 1, 256, 14, 14, 256, 3, 2, 1
    cb, ob, ho, wp = c // 16, co // 16, 7, w + 2 * p
    rule = lambda r: cb * ((r - 1) * s + k) * wp * 64 <= (256 << 10) / 2  # noqa: E731
    rng = np.random.default_rng(5)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((co, c, k, k)) * 0.2).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32)
    want = ref.conv2d(x, wt, b, (s, s), (p,) * 4, (1, 1), 1)
    prep = direct.prepare(wt, b)
    for threads in (1, 2, 3):
        outs = {}
        for past, beyond in ((planner.BAND_PAST_L2, True), (0.0, False)):
            old = planner.BAND_PAST_L2
            planner.BAND_PAST_L2 = past
            try:
                pl = dict(planner._plan_direct.__wrapped__(cb, k, k, 1, s, ho, wp, ho, n, ob, True, threads, 256 << 10))
            finally:
                planner.BAND_PAST_L2 = old
            assert rule(pl["rows"]) != beyond, (past, pl)
            elems = direct._band_elems(cb, pl["rows"], s, k, 1, wp)
            scratch("direct_band", (direct.numba_max_threads(), max(1, elems)))[...] = np.nan
            out = np.full((n, ob, ho, ho, 16), np.nan, np.float32)
            direct.run_nchwc(out, to_nchwc(x), prep, stride=(s, s), padding=(p,) * 4, threads=threads, plan=pl)
            outs[past] = from_nchwc(out, co)
            err = np.abs(outs[past] - want).max() / max(1.0, float(np.abs(want).max()))
            assert err <= 1e-4, f"{threads} threads, rows {pl['rows']}: max error {err:.3g}"
        assert np.array_equal(*outs.values())
    # VGG's 64-channel 224x224 layer: bands of up to 15 rows fit 2x L2, but its weights are small (147 KiB) and
    # the band's re-reads cost more than they save: the rule's bands stay
    wide = dict(planner._plan_direct.__wrapped__(4, 3, 3, 1, 1, 224, 226, 224, 1, 4, True, 2, 512 << 10))
    assert 4 * ((wide["rows"] - 1) + 3) * 226 * 64 <= (512 << 10) / 2, wide
