"""The stem conv -> max pool pair in one task loop (kernels/stem_pool.py) and the session's binding of it
(kernels/registry.py `bind_stem_pools`).

The pair computes the stem's rows as the stem kernel does and pools them as the max pool does (max is exact):
its two outputs are the bits of stem.run_to_nchwc then pool.max_pool, for every band size, pool geometry and
thread count, every output element written (the pool's output starts as a sentinel the reference never
produces) and no pool row read before its stem rows are written (the stem's output starts as 1e30, which a
max would keep). A network gives the same bits with the pair bound and without (`registry.STEM_POOL = False`).
"""
from __future__ import annotations

import numpy as np
import pytest

import tilefuse
from tilefuse import models
from tilefuse.kernels import pool, registry, stem_pool
from tilefuse.kernels.conv import stem
from tilefuse.kernels.conv.planner import plan_stem
from tilefuse.kernels.reference import pool_out_size

RNG = np.random.default_rng(31)
SENTINEL = np.float32(-12345.0)
UNCOMPUTED = np.float32(1e30)       # the stem output before the pair writes it: a pool reading it too early wins


def _pair(n, cin, h, w, co, k, s, pad, pk, ps, ppad, pdil=1, ceil=False, rows=None, threads=2, act=None,
          relu=True, stem_output=True):
    x = RNG.standard_normal((n, cin, h, w)).astype(np.float32)
    prep = stem.prepare(RNG.standard_normal((co, cin, k, k)).astype(np.float32) * 0.2,
                        RNG.standard_normal(co).astype(np.float32))
    ho, wo = (h + 2 * pad - k) // s + 1, (w + 2 * pad - k) // s + 1
    ob = -(-co // 16)
    hp = pool_out_size(ho, pdil * (pk - 1) + 1, ps, ppad, ppad, ceil)
    wq = pool_out_size(wo, pdil * (pk - 1) + 1, ps, ppad, ppad, ceil)
    conv = dict(stride=(s, s), padding=(pad,) * 4, relu=relu, act=act, threads=threads,
                plan={"rows": rows} if rows else None)
    pl = dict(kernel_size=(pk, pk), stride=(ps, ps), padding=(ppad,) * 4, dilation=(pdil, pdil))
    want_o = np.empty((n, ob, ho, wo, 16), np.float32)
    want_y = np.empty((n, ob, hp, wq, 16), np.float32)
    stem.run_to_nchwc(want_o, x, prep, **conv)
    pool.max_pool(want_y, want_o, layout="nchwc", threads=threads, **pl)
    got_o = np.full_like(want_o, UNCOMPUTED)
    got_y = np.full_like(want_y, SENTINEL)
    stem_pool.run(got_o, x, prep, got_y, pool_kernel=pl["kernel_size"], pool_stride=pl["stride"],
                  pool_padding=pl["padding"], pool_dilation=pl["dilation"], stem_output=stem_output, **conv)
    return want_o, want_y, got_o, got_y


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
@pytest.mark.parametrize("geom", [
    # n, cin, h, w, co, k, s, pad, pool k, stride, pad, dilation, ceil, stem band rows
    (1, 3, 224, 224, 64, 7, 2, 3, 3, 2, 1, 1, False, None),     # ResNet's stem and pool, the plan's bands
    (2, 3, 61, 47, 40, 7, 2, 3, 3, 2, 1, 1, False, 7),          # odd sizes, an odd last block, 7-row bands
    (1, 3, 64, 50, 24, 3, 1, 1, 3, 2, 1, 1, True, 5),           # ceil_mode: a last window past the map
    (1, 4, 33, 35, 16, 5, 2, 2, 2, 2, 0, 1, False, 3),          # 2x2 pool, no padding, 4 input channels
    (3, 3, 40, 40, 32, 7, 2, 3, 3, 2, 1, 1, False, 1),          # one-row bands: every window straddles
    (1, 1, 30, 30, 16, 3, 1, 1, 3, 1, 1, 2, False, 4),          # stride-1 pool, dilation 2
    (2, 3, 29, 31, 48, 7, 2, 3, 3, 2, 1, 1, False, 100),        # a band larger than the map: whole images
])
def test_pair_gives_the_bits_of_stem_then_pool(geom, threads):
    *g, rows = geom
    n, cin, h, w, co, k, s, pad, pk, ps, ppad, pdil, ceil = g
    want_o, want_y, got_o, got_y = _pair(n, cin, h, w, co, k, s, pad, pk, ps, ppad, pdil, ceil, rows, threads)
    assert np.array_equal(got_o, want_o)
    assert not (got_y == SENTINEL).any(), "a pool output left unwritten"
    assert np.array_equal(got_y, want_y)


@pytest.mark.parametrize("threads", [1, 2, 5])
@pytest.mark.parametrize("geom", [
    # n, cin, h, w, co, k, s, pad, pool k, stride, pad, dilation, ceil, stem band rows
    (1, 3, 224, 224, 64, 7, 2, 3, 3, 2, 1, 1, False, None),     # ResNet's stem and pool, the plan's bands
    (2, 3, 61, 47, 40, 7, 2, 3, 3, 2, 1, 1, False, 7),          # 7-row bands: a sub-block wraps the 6-row ring
    (1, 3, 64, 50, 24, 3, 1, 1, 3, 2, 1, 1, True, 5),           # ceil_mode: a last window past the map
    (1, 4, 33, 35, 16, 5, 2, 2, 2, 2, 0, 1, False, 3),          # 2x2 pool, no padding: a 5-row ring
    (3, 3, 40, 40, 32, 7, 2, 3, 3, 2, 1, 1, False, 1),          # one-row bands: every row an edge row
    (1, 1, 30, 30, 16, 3, 1, 1, 3, 1, 1, 2, False, 9),          # stride-1 pool, dilation 2: an 8-row ring
    (1, 3, 77, 77, 32, 3, 1, 1, 3, 3, 0, 1, False, 23),         # pool stride 3: rows no window reads
    (2, 3, 29, 31, 48, 7, 2, 3, 3, 2, 1, 1, False, 100),        # a band larger than the map: whole images
])
def test_pair_into_the_ring_gives_the_pool_bits(geom, threads):
    """stem_output=False (the pool the stem's only reader): the stem rows in a per-thread ring of
    stem_pool.ring_rows rows; the pool's output is the bits of stem then pool, and the stem's output holds the
    rows the straddling pool rows read (those are what `_edge_seq` reads), the others left as they were."""
    *g, rows = geom
    n, cin, h, w, co, k, s, pad, pk, ps, ppad, pdil, ceil = g
    want_o, want_y, got_o, got_y = _pair(n, cin, h, w, co, k, s, pad, pk, ps, ppad, pdil, ceil, rows, threads,
                                         stem_output=False)
    assert not (got_y == SENTINEL).any(), "a pool output left unwritten"
    assert np.array_equal(got_y, want_y)
    written = (got_o != UNCOMPUTED).all(axis=(1, 3, 4))         # (N, Ho): the stem rows written out
    ho, wo = want_o.shape[2:4]
    hp = want_y.shape[2]
    rows = rows or plan_stem(cin, k, k, s, 1, ho, wo, w + 2 * pad, n, want_o.shape[1], threads)["rows"]
    need = np.zeros(ho, bool)
    for i in stem_pool.edge_rows(1, ho, rows, hp, ps, ppad, pk, pdil)[:, 1]:
        lo, hi = stem_pool._window(i, ps, ppad, pk, pdil, ho)
        need[lo:hi + 1] = True
    assert (written >= need).all(), "a row a straddling pool row reads was not written out"
    assert np.array_equal(got_o.transpose(0, 2, 1, 3, 4)[written], want_o.transpose(0, 2, 1, 3, 4)[written])
    if 16 <= rows < ho:         # bands of many rows: most rows stay in the ring
        assert written.mean() < 0.5, f"{written.mean():.0%} of the stem's rows written out"


def test_pair_with_an_activation_past_clip():
    """hardswish (code > 2): the stem defers it to a pass per chunk of rows; the rows pooled are activated."""
    want_o, want_y, got_o, got_y = _pair(1, 3, 45, 45, 32, 3, 2, 1, 3, 2, 1, rows=4, act="hardswish",
                                         relu=False)
    assert np.array_equal(got_o, want_o) and np.array_equal(got_y, want_y)


@pytest.mark.parametrize("ho,rows,s,pt,k,d", [(112, 56, 2, 1, 3, 1), (112, 7, 2, 1, 3, 1), (31, 4, 2, 1, 3, 1),
                                              (31, 1, 2, 0, 2, 1), (20, 3, 1, 2, 3, 2), (9, 100, 2, 1, 3, 1)])
def test_every_pool_row_is_pooled_once(ho, rows, s, pt, k, d):
    """The bands' interior rows and the straddling rows (`edge_rows`) partition the pool's rows."""
    hp = pool_out_size(ho, d * (k - 1) + 1, s, pt, pt)
    seen = []
    for r0 in range(0, ho, rows):
        ia, ib = stem_pool._interior(r0, min(r0 + rows, ho), s, pt, k, d, ho, hp)
        seen += list(range(ia, ib))
        for i in range(ia, ib):          # an interior row's window lies in its band
            lo, hi = stem_pool._window(i, s, pt, k, d, ho)
            assert r0 <= lo and hi < min(r0 + rows, ho)
    edges = stem_pool.edge_rows(2, ho, rows, hp, s, pt, k, d)
    assert set(edges[:, 0]) <= {0, 1}
    seen += [int(i) for i in edges[edges[:, 0] == 0, 1]]
    assert sorted(seen) == list(range(hp))


def test_bad_pool_output_is_refused():
    x = np.zeros((1, 3, 16, 16), np.float32)
    prep = stem.prepare(np.zeros((16, 3, 3, 3), np.float32), np.zeros(16, np.float32))
    out = np.empty((1, 1, 16, 16, 16), np.float32)
    with pytest.raises(ValueError, match=r"pool output \(1, 2, 8, 8, 16\); expected \(N, Ob, Hp, Wp, 16\)"):
        stem_pool.run(out, x, prep, np.empty((1, 2, 8, 8, 16), np.float32), padding=(1, 1, 1, 1),
                      pool_kernel=(2, 2), pool_stride=(2, 2))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_resnet_with_the_pair_bound_equals_without(threads, monkeypatch):
    """ResNet18 at batch 2: the session binds the stem -> pool pair and gives the bits of a session that runs
    them apart, over several inputs (the replayed calls included), and matches the reference evaluator."""
    net = models.get("resnet18", seed=0, batch=2, image_size=72)
    compiled = tilefuse.compile(net, threads=threads)
    xs = [RNG.standard_normal(net.inputs[0].shape).astype(np.float32) * s for s in (1.0, 3.0, 0.5)]
    monkeypatch.setattr(registry, "STEM_POOL", False)
    plain = tilefuse.Session(compiled, threads=threads)
    want = [plain.run(x) for x in xs]
    assert plain.stem_pools() == {}
    monkeypatch.setattr(registry, "STEM_POOL", True)
    sess = tilefuse.Session(compiled, threads=threads)
    got = [sess.run(x) for x in xs]
    prog = compiled.package.program()
    pairs = sess.stem_pools()
    assert len(pairs) == 1, "the stem -> pool pair was not bound: the test would not exercise it"
    (i, j), = pairs.items()
    assert prog[i].kernel == "conv2d" and prog[j].kernel == "max_pool" and j == i + 1
    for k, (g, w) in enumerate(zip(got, want)):
        assert np.array_equal(g, w), f"run {k}: max diff {np.abs(g - w).max()}"
    from tilefuse.interpreter import evaluate
    r = evaluate(net, xs[1])[0]
    np.testing.assert_allclose(got[1], r, rtol=0, atol=1e-4 * max(1.0, float(np.abs(r).max())))


def test_pair_is_not_bound_where_the_pool_would_overwrite_what_the_stem_reads():
    """Run apart, the pool may write over the conv's input (dead after the conv); together it must not: the
    binding skips a pair whose pool output shares memory with any of the conv's operands."""
    net = models.get("resnet18", seed=0, batch=1, image_size=64)
    compiled = tilefuse.compile(net, threads=2)
    sess = tilefuse.Session(compiled, threads=2)
    sess.copy_constants()
    prog = compiled.package.program()
    views = [b[1] for b in sess._contexts[0].bound]
    assert registry.bind_stem_pools(prog, views, 2), "the pair should bind as compiled"
    cv, pv = list(views[0]), list(views[1])
    y = pv[-1]
    cv[0] = y.reshape(-1)[:int(np.prod(cv[0].shape))].reshape(cv[0].shape)     # the input inside the pool's output
    assert registry.bind_stem_pools(prog, [cv, pv] + views[2:], 2) == {}
