"""Every conv algorithm and partitioning at 1, 2, 3, 5, 8 and 16 threads: equal to the reference,
and bitwise equal across thread counts (issue 13). The task grid is chosen per thread count by
the planner's cost model; the tests check that the grids really differ, so equality of the bits
is a property of the kernels, not of an unchanged grid. 16 threads run oversubscribed on a small
machine (tests/conftest.py lets numba's pool have 16 threads).
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from tilefuse.kernels import activations as A
from tilefuse.kernels import reference as ref
from tilefuse.kernels.conv import (conv2d_prepare, conv2d_run, conv2d_run_nchwc, conv2d_run_to_nchwc, direct_nchwc,
                                   from_nchwc, nchwc_shape, planner, to_nchwc)
from tilefuse.kernels import threads
from tilefuse.kernels.threads import numba_max_threads

THREADS = (1, 2, 3, 5, 8, 16)
TOL = {"gemm1x1": 1e-4, "direct": 1e-4, "im2col": 1e-4, "winograd2": 1e-3, "winograd4": 5e-3, "depthwise": 1e-4,
       "grouped": 1e-4}

# (name, form, algorithm, (N, Ci, H, W), Co, k, stride, padding, groups)
CASES = [
    ("k1x1_7x7_b1", "nchwc", "gemm1x1", (1, 96, 7, 7), 200, 1, 1, 0, 1),        # Co split at many threads
    ("k1x1_14x14_b3", "nchwc", "gemm1x1", (3, 48, 14, 14), 72, 1, 1, 0, 1),     # positions (+ Co) split
    ("k1x1_s2", "nchwc", "gemm1x1", (2, 40, 13, 11), 40, 1, 2, 0, 1),
    ("direct_3x3_b1", "nchwc", "direct", (1, 40, 13, 12), 104, 3, 1, 1, 1),    # rows and Co split
    ("direct_3x3_s2_b2", "nchwc", "direct", (2, 24, 17, 15), 40, 3, 2, 1, 1),
    ("direct_5x5_nopad", "nchwc", "direct", (1, 20, 12, 12), 72, 5, 1, 0, 1),   # reads x in place
    ("direct_prepadded", "direct_nchwc", "direct", (1, 24, 11, 13), 72, 3, 1, 1, 1),
    ("direct_nchw", "nchw", "direct", (2, 20, 10, 9), 40, 3, 1, 1, 1),
    ("stem_7x7_s2", "to_nchwc", "im2col", (1, 3, 45, 39), 64, 7, 2, 3, 1),       # rows split
    ("stem_b3", "to_nchwc", "im2col", (3, 3, 17, 15), 24, 3, 1, 1, 1),
    ("winograd2", "nchwc", "winograd2", (1, 40, 13, 12), 72, 3, 1, 1, 1),
    ("winograd4", "nchwc", "winograd4", (2, 24, 17, 15), 40, 3, 1, 1, 1),
    ("winograd4_nchw", "nchw", "winograd4", (1, 24, 14, 14), 40, 3, 1, 1, 1),
    ("gemm1x1_nchw", "nchw", "gemm1x1", (2, 40, 9, 9), 48, 1, 1, 0, 1),
    ("im2col_grouped", "nchw", "im2col", (2, 24, 9, 9), 24, 3, 1, 1, 2),
    ("im2col_depthwise", "nchw", "im2col", (1, 16, 9, 9), 16, 3, 1, 1, 16),
    ("depthwise_5x5_s2", "nchwc", "depthwise", (2, 40, 13, 11), 40, 5, 2, 2, 40),
    ("depthwise_3x3_b1", "nchwc", "depthwise", (1, 24, 30, 17), 24, 3, 1, 1, 24),
    ("grouped_lanes_cg8_b1", "nchwc", "grouped", (1, 40, 45, 37), 40, 3, 1, 1, 5),     # row bands (RegNet width 8)
    ("grouped_lanes_cg4_s2", "nchwc", "grouped", (3, 24, 13, 11), 24, 3, 2, 1, 6),      # channel blocks bundled
    ("grouped_lanes_cg8_nchw", "nchw", "grouped", (2, 24, 9, 9), 24, 3, 1, 1, 3),
]


def _data(case):
    _, _, _, (n, ci, h, w), co, k, s, p, g = case
    rng = np.random.default_rng(11)
    x = rng.standard_normal((n, ci, h, w), dtype=np.float32)
    wt = (rng.standard_normal((co, ci // g, k, k), dtype=np.float32) / np.float32(np.sqrt(ci // g * k * k)))
    b = rng.standard_normal(co, dtype=np.float32)
    ho, wo = ref.conv_out_size(h, k, s, p, p, 1), ref.conv_out_size(w, k, s, p, p, 1)
    res = rng.standard_normal((n, co, ho, wo), dtype=np.float32)
    return x, wt.astype(np.float32), b, res, dict(stride=(s, s), padding=(p,) * 4, dilation=(1, 1), groups=g)


def _run(case, x, wt, b, res, kw, threads, act):
    name, form, alg = case[:3]
    co = wt.shape[0]
    if form == "nchw":
        out = np.full(res.shape, np.nan, np.float32)
        conv2d_run(alg, out, x, conv2d_prepare(alg, wt, b, **kw), res, act=act, threads=threads, **kw)
        return out
    ob = np.full(nchwc_shape(res.shape), np.nan, np.float32)
    g = kw.pop("groups")
    if form == "nchwc":
        prep = conv2d_prepare(alg, wt, b, groups=g, layout="nchwc", **kw)
        conv2d_run_nchwc(alg, ob, to_nchwc(x), prep, to_nchwc(res), act=act, threads=threads, **kw)
    elif form == "direct_nchwc":
        prep = conv2d_prepare(alg, wt, b, groups=g, layout="nchwc", **kw)
        direct_nchwc(ob, to_nchwc(x, kw["padding"]), prep, to_nchwc(res), stride=kw["stride"],
                     dilation=kw["dilation"], act=act, threads=threads)
    else:
        prep = conv2d_prepare(alg, wt, b, groups=g, **kw)
        conv2d_run_to_nchwc(alg, ob, x, prep, to_nchwc(res), act=act, threads=threads, **kw)
    kw["groups"] = g
    return from_nchwc(ob, co)


@pytest.fixture(params=["numba", "pool"])
def region_mode(request):
    """Run the numba kernels' task loops on numba's pool or on ours (threads.region_mode)."""
    old = threads._NUMBA.get("mode")
    threads._NUMBA["mode"] = request.param
    yield request.param
    threads._NUMBA["mode"] = old


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_thread_count_equals_reference_and_each_other(case, region_mode):
    x, wt, b, res, kw = _data(case)
    act = A.encode("silu")
    want = A.reference("silu", ref.conv2d(x, wt, b, residual=res, **kw))
    outs = [_run(case, x, wt, b, res, kw, t, act) for t in THREADS]
    tol = TOL[case[2]]
    for t, o in zip(THREADS, outs):
        assert np.isfinite(o).all(), (case[0], t)
        err = np.abs(o - want).max() / max(1.0, float(np.abs(want).max()))
        assert err <= tol, f"{case[0]} at {t} threads: max error {err:.3g} > {tol}"
        assert np.array_equal(o, outs[0]), f"{case[0]}: {t} threads differ from 1 thread"


def _grids(case):
    """The task grid each thread count gets (planner), for the numba kernels."""
    _, form, alg, (n, ci, h, w), co, k, s, p, g = case
    ho, wo = ref.conv_out_size(h, k, s, p, p, 1), ref.conv_out_size(w, k, s, p, p, 1)
    cb, ob = -(-ci // 16), -(-co // 16)
    if alg == "gemm1x1":
        return [tuple(planner.plan_k1x1(cb * 16, -(-co // 32), n * ho * wo, t)[k_] for k_ in ("Q", "P")) for t in THREADS]
    if alg == "direct":
        return [tuple(planner.plan_direct(cb, k, 1, s, ho, w + 2 * p, wo=wo, n=n, ob=ob, padded=p > 0, threads=t)[k_]
                      for k_ in ("rows", "blocks")) for t in THREADS]
    if form == "to_nchwc":
        return [planner.plan_stem(ci, k, k, s, 1, ho, wo, w + 2 * p, n, ob, t)["rows"] for t in THREADS]
    return None


@pytest.mark.parametrize("name", ["k1x1_7x7_b1", "k1x1_14x14_b3", "direct_3x3_b1", "stem_7x7_s2"])
def test_thread_counts_get_different_grids(name):
    """The equality above is tested over different partitionings, not one grid run by more threads."""
    case = next(c for c in CASES if c[0] == name)
    grids = _grids(case)
    assert len(set(grids)) >= 3, grids


def test_grids_feed_sixteen_threads_at_batch_one():
    """ResNet50's batch-1 layers have >= 16 tasks when planned for 16 threads (the 2-core grids
    of issue 13 gave 2 to 4)."""
    for ci, co, hw in ((256, 64, 56), (512, 128, 28), (1024, 256, 14), (2048, 512, 7), (1024, 2048, 7)):
        assert planner.plan_k1x1(ci, -(-co // 32), hw * hw, 16)["tasks"] >= 16, (ci, co, hw)
    for c, hw in ((64, 56), (128, 28), (256, 14), (512, 7)):
        p = planner.plan_direct(c // 16, 3, 1, 1, hw, hw + 2, wo=hw, n=1, ob=c // 16, threads=16)
        assert p["tasks"] >= 16, (c, hw, p)
    assert planner.plan_stem(3, 7, 7, 2, 1, 112, 112, 230, 1, 4, 16)["tasks"] >= 16


def test_numba_pool_allows_sixteen_threads():
    assert numba_max_threads() >= 16  # tests/conftest.py; otherwise the 16-thread runs would use fewer


def test_pool_region_never_waits_for_a_worker_that_has_not_started():
    """With every pool worker busy elsewhere (a loaded machine: the OS runs none of them), a
    2-thread region on our pool finishes on the calling thread alone and gives the same bits;
    waiting for the unstarted worker would block until the busy ones are released."""
    import threading
    import time
    case = CASES[0]
    x, wt, b, res, kw = _data(case)
    want = _run(case, x, wt, b, res, dict(kw), 1, A.encode("silu"))
    release = threading.Event()
    busy = [threads._pool().submit(release.wait, 30) for _ in range(threads._pool()._max_workers)]
    old = threads._NUMBA.get("mode")
    threads._NUMBA["mode"] = "pool"
    try:
        t0 = time.perf_counter()
        got = _run(case, x, wt, b, res, dict(kw), 2, A.encode("silu"))
        out = []
        threads.parallel_for(out.append, range(5), threads=2)
        elapsed = time.perf_counter() - t0
    finally:
        threads._NUMBA["mode"] = old
        release.set()
        for f in busy:
            f.result()
    assert elapsed < 10, f"the region waited for a busy worker ({elapsed:.1f} s)"
    assert np.array_equal(got, want) and sorted(out) == list(range(5))


def test_numba_regions_keep_one_team_width(monkeypatch):
    """On numba's pool every region runs the session's full width whatever its task count (workers
    past the last task return at once): a 3-task region after a 16-task one would shrink the OpenMP
    team, and regrowing it cost 0.1-0.8 ms per layer on the 16-core device machine. The pool is
    stood in for by a spy (no numba threads are started), so this runs on any core count."""
    widths, sets = [], []
    monkeypatch.setitem(threads._NUMBA, "mode", "numba")
    monkeypatch.setitem(threads._NUMBA, "layer", "omp")
    monkeypatch.setitem(threads._NUMBA, "max_threads", 16)
    monkeypatch.setitem(threads._NUMBA, "set", sets.append)
    monkeypatch.setattr(threads._LOCAL, "numba_nt", 0, raising=False)

    def par(nt, done):
        widths.append(nt)
        counter = np.zeros(1, np.int64)
        for tid in range(nt):            # the workers, one after another: each takes what is left
            seq(counter, tid, done)

    def seq(counter, tid, done):
        while counter[0] < len(done):
            done[counter[0]] += 1
            counter[0] += 1

    for ntasks in (16, 3, 16, 2):
        done = np.zeros(ntasks, np.int64)
        threads.numba_region(par, seq, 16, ntasks, done)
        assert (done == 1).all(), ntasks           # every task ran exactly once
    assert widths == [16, 16, 16, 16] and sets == [16], (widths, sets)
    done = np.zeros(1, np.int64)
    threads.numba_region(par, seq, 16, 1, done)    # one task: on the calling thread, no region
    assert done[0] == 1 and widths == [16] * 4


@pytest.mark.parametrize("env, others, want", [
    ({}, 0, ("spin", threads.GOMP_SPIN_DEFAULT, None)),                 # idle machine: the long spin
    ({}, 10 ** 6, ("passive", None, "PASSIVE")),                         # loaded: the workers sleep at once
    ({"TILEFUSE_WAIT": "passive"}, 0, ("passive", None, "PASSIVE")),
    ({"TILEFUSE_WAIT": "spin"}, 10 ** 6, ("spin", threads.GOMP_SPIN_DEFAULT, None)),
    ({"GOMP_SPINCOUNT": "1234"}, 0, ("user (GOMP_SPINCOUNT=1234)", "1234", None)),   # the user's own setting
])
def test_wait_policy_choice(env, others, want, monkeypatch):
    """How numba's OpenMP workers wait between regions, chosen before libgomp loads: on an idle machine
    they spin GOMP_SPIN_DEFAULT times before sleeping. That count is long (millions: ~43 ms of a core
    on the Ice Lake development VM) because a run after an idle gap paid ~2 ms per region for each of
    its first regions with a short one (30000: MobileNetV2 batch 1 at 2 threads 15 ms after a 200 ms
    gap against 6 ms; benchmarks/idle_gaps.py). Loaded machines get passive workers, and a user's
    OMP_WAIT_POLICY / GOMP_SPINCOUNT is left alone."""
    for k in ("TILEFUSE_WAIT", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(threads, "_others_running", lambda: others)
    monkeypatch.setitem(threads._NUMBA, "wait_others", 0)   # restored after: the choice records its count
    import os
    policy = threads._choose_wait_policy()
    assert (policy, os.environ.get("GOMP_SPINCOUNT"), os.environ.get("OMP_WAIT_POLICY")) == want
    assert int(threads.GOMP_SPIN_DEFAULT) >= 1_000_000


_IMPORT_ORDER = """
import os, sys
first = sys.argv[1]
if first == "torch":
    import torch  # noqa: F401
import tilefuse  # noqa: F401
env = (os.environ.get("GOMP_SPINCOUNT"), os.environ.get("OMP_WAIT_POLICY"))
if first == "tilefuse":
    import torch  # noqa: F401,F811
from tilefuse.kernels import threads
print(repr((env, threads._gomp_mapped(), threads.wait_policy())))
"""


@pytest.mark.parametrize("first", ["tilefuse", "torch"])
def test_wait_policy_reaches_a_libgomp_loaded_later(first):
    """libgomp reads its wait settings once, when it loads, and numba's pool binds to the first libgomp.so.1
    of the process: torch's when torch was imported first. So `import tilefuse` sets them, before torch
    loads its copy; imported after torch, tilefuse cannot, and `wait_policy()` says that the loaded
    libgomp keeps its defaults, names it, and says what to do (a preprocessing thread's 40 ms burst made
    the next MobileNetV2 batch 1 run 8-14 ms against 3.2-3.7 with torch's defaults)."""
    import ast
    import subprocess
    import sys
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if k not in ("TILEFUSE_WAIT", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", _IMPORT_ORDER, first], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    (spin, passive), gomp, policy = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    if first == "tilefuse":
        assert (spin, passive) in ((threads.GOMP_SPIN_DEFAULT, None), (None, "PASSIVE")), (spin, passive)
        assert policy.startswith(("spin", "passive")), policy
    elif gomp is not None:                 # torch brought its libgomp: its defaults apply, and the report says so
        assert policy.startswith("libgomp defaults") and gomp in policy and "GOMP_SPINCOUNT=" in policy, policy
    else:
        assert policy.startswith(("spin", "passive")), policy


@pytest.mark.parametrize("cpus, others, nt, want", [
    (16, 0, 16, ("numba", 16)),     # idle: the session's width
    (16, 1, 16, ("numba", 15)),     # a daemon on a 16-core server: one core fewer, still numba's pool
    (16, 8, 16, ("numba", 8)),      # half the cores free: half the team
    (16, 9, 16, ("pool", 16)),      # fewer: our pool (the caller never waits for a descheduled worker)
    (2, 0, 2, ("numba", 2)),
    (2, 1, 2, ("pool", 2)),         # the loaded 2-core machine: our pool, as measured there
    (16, 12, 4, ("numba", 4)),      # a narrow session fits in the free cores
    (16, 13, 4, ("numba", 3)),
])
def test_region_plan_narrows_before_it_leaves_numbas_pool(cpus, others, nt, want, monkeypatch):
    """Where other processes' runnable threads leave fewer free cores than the region wants, the
    team shrinks to the free cores while they are at least half of it, and only then do the regions
    move to our pool. Before, one runnable thread of another process put every region of a 16-thread
    session on a 16-core machine on our pool (~0.4 ms a region there)."""
    monkeypatch.setitem(threads._NUMBA, "mode", "auto")
    monkeypatch.setitem(threads._NUMBA, "sampled", -1e9)
    monkeypatch.setitem(threads._NUMBA, "last", others)
    monkeypatch.setattr(threads, "_others_now", lambda: others)
    monkeypatch.setattr(threads, "cpu_count", lambda: cpus)
    assert threads.region_plan(nt) == want
    assert threads.region_mode(nt) == want[0]


def test_narrowed_region_runs_every_task_once_and_is_counted(monkeypatch):
    """A narrowed region (one other runnable thread on a 16-core machine) runs on numba's pool with 15
    workers; every task runs exactly once, and region_counts() says where each region ran."""
    widths, sets = [], []
    monkeypatch.setitem(threads._NUMBA, "mode", "auto")
    monkeypatch.setitem(threads._NUMBA, "sampled", -1e9)
    monkeypatch.setitem(threads._NUMBA, "last", 1)
    monkeypatch.setitem(threads._NUMBA, "layer", "omp")
    monkeypatch.setitem(threads._NUMBA, "max_threads", 16)
    monkeypatch.setitem(threads._NUMBA, "set", sets.append)
    monkeypatch.setattr(threads._LOCAL, "numba_nt", 0, raising=False)
    monkeypatch.setattr(threads, "_others_now", lambda: 1)
    monkeypatch.setattr(threads, "cpu_count", lambda: 16)

    def par(nt, done):
        widths.append(nt)
        counter = np.zeros(1, np.int64)
        for tid in range(nt):
            seq(counter, tid, done)

    def seq(counter, tid, done):
        while counter[0] < len(done):
            done[counter[0]] += 1
            counter[0] += 1

    threads.region_counts(reset=True)
    for ntasks in (16, 40, 1):
        done = np.zeros(ntasks, np.int64)
        threads.numba_region(par, seq, 16, ntasks, done)
        assert (done == 1).all(), ntasks
    assert widths == [15, 15] and sets == [15], (widths, sets)
    assert threads.region_counts(reset=True) == {"numba": 0, "narrowed": 2, "pool": 0, "serial": 1, "replayed": 0}
    assert threads.region_counts() == {"numba": 0, "narrowed": 0, "pool": 0, "serial": 0, "replayed": 0}


def test_take_hands_each_worker_its_own_chunk_first_then_the_rest():
    """`_nb.take` on a `new_counter(nt)` counter: worker k takes its contiguous chunk [k*n//nt, (k+1)*n//nt) in
    order, then what is left of the chunks after it (wrapping round), each task once; a counter without a team
    width (slot 3 zero: a serial loop's) hands the tasks out in order. The kernels' task loops take their tasks
    this way, so consecutive layers split the same way keep a thread's part of a map on its own core."""
    from tilefuse.kernels.conv._nb import AFFINITY, new_counter, take
    if not AFFINITY:
        pytest.skip("TILEFUSE_AFFINITY=0: every counter hands tasks out in order")
    c = new_counter(3)                                   # chunks of 10 tasks: [0, 3), [3, 6), [6, 10)
    assert [take(c, 1, 10) for _ in range(11)] == [3, 4, 5, 6, 7, 8, 9, 0, 1, 2, -1]
    c = new_counter(3)
    got = [take(c, 2, 10), take(c, 0, 10), take(c, 2, 10), take(c, 1, 10), take(c, 0, 10)]
    assert got == [6, 0, 7, 3, 1]
    rest = []
    while (i := take(c, 0, 10)) >= 0:
        rest.append(i)
    assert rest == [2, 4, 5, 8, 9]                       # its own chunk, then 1's, then 2's
    assert take(c, 1, 10) == -1 and take(c, 2, 10) == -1
    c = new_counter(4)                                   # fewer tasks than workers: empty chunks are skipped
    assert sorted(take(c, k, 3) for k in range(4)) == [-1, 0, 1, 2]
    plain = np.zeros(threads.COUNTER_SLOTS, np.int64)
    assert [take(plain, 1, 4) for _ in range(5)] == [0, 1, 2, 3, -1]


@pytest.mark.parametrize("mode", ["numba", "pool"])
@pytest.mark.parametrize("nt,ntasks", [(2, 7), (3, 2), (5, 64)])
def test_take_runs_every_task_once_on_real_threads(mode, nt, ntasks, monkeypatch):
    """Workers on real threads (numba's pool and ours, oversubscribed on a small machine) taking tasks with `take`
    run every task exactly once, however the OS schedules them."""
    import numba as nb

    from tilefuse.kernels.conv._nb import atomic_add, new_counter, take

    @nb.njit(nogil=True)
    def seq(counter, tid, hits):
        while True:
            i = take(counter, tid, hits.shape[0])
            if i < 0:
                break
            atomic_add(hits, i, 1)

    @nb.njit(parallel=True, nogil=True)
    def par(n, hits):
        counter = new_counter(n)
        for _w in nb.prange(n):
            seq(counter, nb.get_thread_id(), hits)

    monkeypatch.setitem(threads._NUMBA, "mode", mode)
    for _ in range(20):
        hits = np.zeros(ntasks, np.int64)
        threads.numba_region(par, seq, nt, ntasks, hits)
        assert (hits == 1).all(), hits
