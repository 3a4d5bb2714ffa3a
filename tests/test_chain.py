"""Fused conv chains (kernels/conv/chain.py): [1x1 expand] -> depthwise -> 1x1 project over row bands.

A session binds an inverted-residual block's three conv instructions as one call (kernels/registry.py
`bind_chains`). The chain computes every value with the layer kernels' own operations in their order, so
its results are bitwise those of the three layers one after another, for any band height, thread count
and batch. The tests run the chain against the layer kernels (bitwise) and the numpy reference
(tolerance) on odd shapes, and whole networks with chains on and off (bitwise), as a server runs them.
"""
from __future__ import annotations

import numpy as np
import pytest

import tilefuse
from tilefuse import models
from tilefuse.ir import Network
from tilefuse.kernels import reference as ref
from tilefuse.kernels.activations import NAMES, reference as act_reference
from tilefuse.kernels.conv import chain, depthwise, k1x1
from tilefuse.kernels.conv.layout import from_nchwc, to_nchwc
from tilefuse.kernels.threads import region_counts

pytestmark = pytest.mark.skipif(not chain.AVAILABLE, reason="the chains run the 1x1 assembly strip (x86-64 AVX2 or "
                                                                 "AVX-512 hosts); elsewhere sessions run the layers")


def _readonly(d):
    for v in d.values():
        v.flags.writeable = False     # as the package's constants
    return d


def _case(rng, n, cin, ce, cout, h, w, k, s, d, pad, expand, residual, acts):
    """x (N, Cin, H, W) and a chain's weights; the layer-by-layer NCHW16c result and the numpy reference."""
    x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
    if not expand:
        ce = cin
    we = (rng.standard_normal((ce, cin, 1, 1)) / np.sqrt(cin)).astype(np.float32)
    be = rng.standard_normal(ce).astype(np.float32) * 0.1
    wd = (rng.standard_normal((ce, 1, k, k)) / k).astype(np.float32)
    bd = rng.standard_normal(ce).astype(np.float32) * 0.1
    wp = (rng.standard_normal((cout, ce, 1, 1)) / np.sqrt(ce)).astype(np.float32)
    bp = rng.standard_normal(cout).astype(np.float32) * 0.1
    ae, ad, ap = acts
    pe, pd, pp = _readonly(k1x1.prepare(we, be)), _readonly(depthwise.prepare(wd, bd, ce)), _readonly(
        k1x1.prepare(wp, bp))
    xb = to_nchwc(x)
    dw_kw = dict(stride=(s, s), padding=pad, dilation=(d, d))
    # layer by layer, the NCHW16c kernels
    if expand:
        e = np.zeros((n, -(-ce // 16), h, w, 16), np.float32)
        k1x1.run_nchwc(e, xb, pe, act=ae, threads=1)
    else:
        e = xb
    ho = (h + pad[0] + pad[1] - d * (k - 1) - 1) // s + 1
    wo = (w + pad[2] + pad[3] - d * (k - 1) - 1) // s + 1
    dd = np.zeros((n, -(-ce // 16), ho, wo, 16), np.float32)
    depthwise.run_nchwc(dd, e, pd, **dw_kw, act=ad, threads=1)
    res = None
    if residual:
        res = to_nchwc(rng.standard_normal((n, cout, ho, wo)).astype(np.float32))
    layers = np.zeros((n, -(-cout // 16), ho, wo, 16), np.float32)
    k1x1.run_nchwc(layers, dd, pp, res, act=ap, threads=1)
    # numpy reference
    def act(v, a):
        return act_reference(a[0], v, float(a[1]), float(a[2]))
    r = act(ref.conv2d(x, we, be, (1, 1), (0, 0, 0, 0), (1, 1), 1), ae) if expand else x
    r = act(ref.conv2d(r, wd, bd, (s, s), pad, (d, d), ce), ad)
    r = ref.conv2d(r, wp, bp, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    if residual:
        r = r + from_nchwc(res, cout)
    want = act(r, ap)
    parts = dict(x=xb, res=res, expand=({"act": ae}, pe) if expand else None,
                 dw=({"act": ad, **dw_kw}, pd), project=({"act": ap}, pp))
    return parts, layers, want, cout


def _run_chain(parts, shape, threads):
    out = np.full(shape, np.nan, np.float32)
    c = chain.BoundChain(parts["x"], out, parts["res"], parts["expand"], parts["dw"], parts["project"], threads)
    c()
    return out, c


RELU6 = ("clip", 0.0, 6.0)
ID = ("identity", 0.0, 0.0)
CASES = [
    # n, cin, ce, cout, h, w, k, s, d, padding, expand, residual, (act_e, act_d, act_p)
    (1, 16, 96, 24, 23, 17, 3, 2, 1, (1, 1, 1, 1), True, False, (RELU6, RELU6, ID)),      # MobileNetV2's stride 2
    (2, 24, 88, 24, 13, 11, 3, 1, 1, (1, 1, 1, 1), True, True, (RELU6, RELU6, ID)),       # residual, odd map, batch
    (1, 40, 120, 40, 15, 15, 5, 1, 1, (2, 2, 2, 2), True, True, (("hardswish", 0.0, 0.0),) * 2 + (ID,)),
    (1, 24, 72, 40, 21, 19, 5, 2, 1, (2, 2, 2, 2), True, False, (("silu", 0.0, 0.0), ("silu", 0.0, 0.0), ID)),
    (1, 32, 32, 16, 19, 18, 3, 1, 1, (1, 1, 1, 1), False, False, (ID, RELU6, ("relu", 0.0, 0.0))),  # no expansion
    (1, 16, 48, 20, 12, 14, 3, 1, 2, (2, 2, 2, 2), True, False, (RELU6, RELU6, ID)),      # dilation 2
    (1, 16, 64, 16, 11, 9, 3, 2, 1, (0, 1, 0, 1), True, True, (RELU6, RELU6, ("gelu", 0.0, 0.0))),  # TF "same"
    (1, 8, 48, 8, 7, 7, 3, 2, 1, (1, 1, 1, 1), True, False, (RELU6, RELU6, ID)),          # 4x4: the padded band
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("bands", ["planned", "one row", "one row, D one row"])
def test_chain_equals_the_layers_bitwise(case, bands, monkeypatch):
    """The chain against k1x1 -> depthwise -> k1x1 layer by layer (bitwise) and the numpy reference (fp32
    tolerance), with the planned bands, one-row bands (every band a border band), and one-row D."""
    if bands != "planned":
        monkeypatch.setattr(chain, "E_SHARE", 1e-9)
    if bands == "one row, D one row":
        monkeypatch.setattr(chain, "D_BYTES", 1)
    parts, layers, want, cout = _case(np.random.default_rng(case), *CASES[case])
    for threads in (1, 2, 3):
        got, c = _run_chain(parts, layers.shape, threads)
        if bands != "planned":
            assert c.describe()["rows"] == 1
        assert np.array_equal(got, layers), f"threads {threads}: max diff {np.nanmax(np.abs(got - layers))}"
    y = from_nchwc(got, cout)
    assert np.abs(y - want).max() <= 1e-4 * max(1.0, np.abs(want).max())


def test_plan_bands_fit_the_budget_and_the_threads():
    # MobileNetV2's 112 -> 56 block: 96 expanded channels of 112 columns (43 KB a row)
    t = chain.plan_bands(1, 96, 112, 112, 56, 56, 3, 2, 1, threads=2, budget=640 << 10)
    rows = t[:, 2] - t[:, 1]
    assert t[0, 1] == 0 and t[-1, 2] == 56 and np.all(t[1:, 1] == t[:-1, 2])      # the rows, once each
    assert ((rows.max() - 1) * 2 + 3) * 96 * 112 * 4 <= 640 << 10                 # E fits the budget
    assert len(t) % 2 == 0                                                       # even over 2 threads
    # a batch: every image's bands
    t = chain.plan_bands(3, 96, 20, 20, 20, 20, 3, 1, 1, threads=4, budget=1 << 30)
    assert sorted(set(t[:, 0])) == [0, 1, 2] and np.all(t[:, 2] > t[:, 1])


@pytest.mark.parametrize("name,batch,size", [("mobilenet_v2", 1, 96), ("mobilenet_v2", 2, 64),
                                             ("mobilenet_v3_large", 1, 96), ("shufflenet_v2", 1, 224)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_networks_with_chains_equal_without(name, batch, size, threads, monkeypatch):
    """Whole networks: sessions with chains give the bits of sessions without, over several runs with new
    inputs (replayed calls included), and chains were bound. (ShuffleNetV2 at 224: at 96 its blocks' depthwise
    inputs are small, or the memory plan gives a projection's output the block input's memory, which a
    chain must not write while it reads: none is bound there.)"""
    net = models.get(name, seed=0, batch=batch, image_size=size)
    compiled = tilefuse.compile(net, threads=threads)
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(net.inputs[0].shape).astype(np.float32) * s for s in (1.0, 2.0, 0.5)]
    monkeypatch.setattr(chain, "CHAINS", False)
    plain = tilefuse.Session(compiled, threads=threads)
    want = [plain.run(x) for x in xs]
    assert plain.chains() == {}
    monkeypatch.setattr(chain, "CHAINS", True)
    sess = tilefuse.Session(compiled, threads=threads)
    region_counts(reset=True)
    got = [sess.run(x) for x in xs]
    assert sess.chains(), "no chain bound: the test would not exercise them"
    assert region_counts()["replayed"] > 0
    for i, (g, w) in enumerate(zip(got, want)):
        assert np.array_equal(g, w), f"run {i}: max diff {np.abs(g - w).max()}"


def test_a_chain_covers_its_instructions_and_the_profile_says_so():
    net = models.get("mobilenet_v2", seed=0, batch=1, image_size=96)
    compiled = tilefuse.compile(net, threads=2)
    sess = tilefuse.Session(compiled, threads=2)
    sess.run(np.zeros(net.inputs[0].shape, np.float32))
    chains = sess.chains()
    prog = compiled.package.program()
    for head, (covers, d) in chains.items():
        assert covers[0] == head and len(covers) in (2, 3)
        algs = [prog[j].params["algorithm"] for j in covers]
        if "channel groups" in d["partitioning"]:    # a SplitChain: expansion -> depthwise
            assert algs == ["gemm1x1", "depthwise"]
            continue
        assert algs[-2:] == ["depthwise", "gemm1x1"] and (len(covers) == 2 or algs[0] == "gemm1x1")
        assert d["algorithm"] == "chain" and d["tasks"] >= 1
    from tilefuse.profile import profile
    p = profile(compiled, threads=2, repeat=2)
    rows = {r["index"]: r for r in p.rows}
    for head, (covers, _) in chains.items():
        assert rows[head]["algorithm"] == "chain"
        assert rows[head]["flops"] == sum(compiled.plan().rows[j]["flops"] for j in covers)
        assert all(rows[j]["algorithm"] == "fused" and rows[j]["flops"] == 0 for j in covers[1:])


def _block_net(extra_reader: bool):
    """x -> 1x1 (16 -> 96, ReLU6) -> depthwise 3x3 (ReLU6) -> 1x1 (96 -> 24), and, with extra_reader, the
    depthwise output also pooled into a second network output (so the chain may not skip writing it)."""
    rng = np.random.default_rng(0)
    net = Network("block")
    x = net.input("x", (1, 16, 48, 48))
    e = net.relu6(net.conv2d(x, rng.standard_normal((96, 16, 1, 1)).astype(np.float32) * 0.2, np.zeros(96, np.float32)))
    d = net.relu6(net.conv2d(e, rng.standard_normal((96, 1, 3, 3)).astype(np.float32) * 0.3, np.zeros(96, np.float32),
                             padding=1, groups=96))
    p = net.conv2d(d, rng.standard_normal((24, 96, 1, 1)).astype(np.float32) * 0.1, np.zeros(24, np.float32))
    if extra_reader:
        net.output(p, net.global_avg_pool(d))
    else:
        net.output(p)
    return net


def test_an_intermediate_with_another_reader_is_not_fused():
    x = np.random.default_rng(2).standard_normal((1, 16, 48, 48)).astype(np.float32)
    s1 = tilefuse.Session(tilefuse.compile(_block_net(False), threads=2))
    y1 = s1.run(x)
    assert len(s1.chains()) == 1
    s2 = tilefuse.Session(tilefuse.compile(_block_net(True), threads=2))
    y2 = s2.run(x)
    assert s2.chains() == {}, "the depthwise output has a second reader: it must be written"
    assert np.array_equal(y1, y2[0])


@pytest.mark.parametrize("threads", [2, 4, 8, 16])
def test_chains_give_every_thread_a_band_and_bound_the_recomputed_halo(threads):
    """Batch 1 on many threads needs thin bands, and thin bands expand their halo rows again: a chain is
    bound only where every thread gets a band and at most MAX_HALO of the expansion is computed twice
    (MobileNetV2 at 16 threads: the two 112-row blocks; the stride-1 56- and 28-row ones run as layers)."""
    net = models.get("mobilenet_v2", seed=0, batch=1, image_size=224)
    sess = tilefuse.Session(tilefuse.compile(net, threads=threads), threads=threads)
    sess.copy_constants()
    chains = sess.chains()
    assert chains
    prog = sess.package.program()
    for head, (covers, d) in chains.items():
        assert d["tasks"] >= threads
        dw = prog[covers[-2]]
        if len(covers) == 3:
            p, (_, _, h, _, _) = dw.params, dw.inputs[0].shape
            c = sess._contexts[0].bound[head][0].chain
            kh = c.geo[6]
            assert chain.halo_share(c.tasks, h, kh, p["stride"][0], p["dilation"][0], p["padding"][0]) <= \
                chain.MAX_HALO
    sess.release()
    if threads == 16:   # fewer row-band chains (SplitChains, by channels, are not bands)
        two = tilefuse.Session(tilefuse.compile(net, threads=2), threads=2)
        two.copy_constants()
        bands = lambda cs: [h for h, (_, d) in cs.items() if "row bands" in d["partitioning"]]  # noqa: E731
        assert len(bands(chains)) < len(bands(two.chains()))
        two.release()


def test_a_chain_whose_output_shares_its_input_memory_is_not_bound(monkeypatch):
    """ShuffleNetV2 at 96x96: the memory plan gives a depthwise -> 1x1 pair's output the depthwise input's
    block (its last reader is the depthwise). Layer by layer that is safe; a chain writes output bands while
    other bands still read the input (wrong results whenever a band's input rows are overwritten first: it
    depends on which thread runs which band when), so it is not bound there. With the check patched out the
    chain is bound: the check is what refuses it."""
    net = models.get("shufflenet_v2", seed=0, batch=1, image_size=96)
    compiled = tilefuse.compile(net, threads=2)
    x = np.random.default_rng(3).standard_normal(net.inputs[0].shape).astype(np.float32)
    monkeypatch.setattr(chain, "CHAINS", False)
    want = tilefuse.Session(compiled, threads=2).run(x)
    monkeypatch.setattr(chain, "CHAINS", True)
    sess = tilefuse.Session(compiled, threads=2)
    assert np.array_equal(sess.run(x), want)
    bound = sess.chains()
    monkeypatch.setattr(chain, "_overlaps", lambda a, b: False)
    unsafe = tilefuse.Session(compiled, threads=2)
    unsafe.copy_constants()
    extra = set(unsafe.chains()) - set(bound)
    assert extra, "no chain was refused for sharing memory: the test would not exercise the check"
    unsafe.release()


SPLIT_CASES = [
    # n, cin, ce, cout, h, w, k, s, d, padding, expand, residual, (act_e, act_d, act_p)
    (1, 96, 576, 96, 14, 14, 3, 1, 1, (1, 1, 1, 1), True, False, (RELU6, RELU6, ID)),     # MobileNetV2's 14x14
    (1, 40, 200, 24, 9, 7, 3, 2, 1, (1, 1, 1, 1), True, False, (("hardswish", 0.0, 0.0),) * 2 + (ID,)),
    (1, 24, 88, 16, 6, 5, 5, 1, 1, (2, 2, 2, 2), True, False, (("silu", 0.0, 0.0),) * 2 + (ID,)),  # odd blocks
]


@pytest.mark.parametrize("case", range(len(SPLIT_CASES)))
def test_split_chain_equals_the_layers_bitwise(case):
    """SplitChain (expansion -> depthwise split by the wide tensor's channel blocks) against k1x1 -> depthwise
    layer by layer: bitwise, for thread counts whose groups are one task a thread (2, 3) or several (5, 7)."""
    n, cin, ce, cout, h, w, k, s, d, pad, _, _, (ae, ad, _) = SPLIT_CASES[case]
    rng = np.random.default_rng(case)
    x = to_nchwc(rng.standard_normal((n, cin, h, w)).astype(np.float32))
    pe = _readonly(k1x1.prepare((rng.standard_normal((ce, cin, 1, 1)) / np.sqrt(cin)).astype(np.float32),
                                rng.standard_normal(ce).astype(np.float32) * 0.1))
    pd = _readonly(depthwise.prepare((rng.standard_normal((ce, 1, k, k)) / k).astype(np.float32),
                                     rng.standard_normal(ce).astype(np.float32) * 0.1, ce))
    dw_kw = dict(stride=(s, s), padding=pad, dilation=(d, d))
    e = np.zeros((n, -(-ce // 16), h, w, 16), np.float32)
    k1x1.run_nchwc(e, x, pe, act=ae, threads=1)
    ho = (h + pad[0] + pad[1] - d * (k - 1) - 1) // s + 1
    wo = (w + pad[2] + pad[3] - d * (k - 1) - 1) // s + 1
    want = np.zeros((n, -(-ce // 16), ho, wo, 16), np.float32)
    depthwise.run_nchwc(want, e, pd, **dw_kw, act=ad, threads=1)
    cb = -(-ce // 16)
    for threads in (1, 2, 3, 5, 7):
        got = np.full_like(want, np.nan)
        c = chain.SplitChain(x, got, ({"act": ae}, pe), ({"act": ad, **dw_kw}, pd), threads)
        c()
        assert c.describe()["tasks"] == -(-cb // chain.split_group(cb, threads))
        assert np.array_equal(got, want), f"threads {threads}: max diff {np.nanmax(np.abs(got - want))}"


def test_mobilenet_v2_binds_split_chains_where_bands_would_recompute():
    """MobileNetV2 at 224, batch 1, 2 threads: the 14x14 and 7x7 blocks, whose row bands MAX_HALO refuses, run
    expansion -> depthwise split by channels; the session's bits equal the layers' (SPLIT off)."""
    net = models.get("mobilenet_v2", seed=0, batch=1, image_size=224)
    compiled = tilefuse.compile(net, threads=2)
    x = np.random.default_rng(4).standard_normal(net.inputs[0].shape).astype(np.float32)
    sess = tilefuse.Session(compiled, threads=2)
    got = [sess.run(x), sess.run(x * 2)]
    split = [d for _, d in sess.chains().values() if "channel groups" in d["partitioning"]]
    assert len(split) >= 2, sess.chains()
    chain_split = chain.SPLIT
    try:
        chain.SPLIT = False
        plain = tilefuse.Session(compiled, threads=2)
        want = [plain.run(x), plain.run(x * 2)]
        assert not [d for _, d in plain.chains().values() if "channel groups" in d["partitioning"]]
    finally:
        chain.SPLIT = chain_split
    for g, w in zip(got, want):
        assert np.array_equal(g, w)
