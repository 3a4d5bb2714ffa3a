"""Replayed layer calls (kernels/threads.py `replaying`, kernels/registry.py).

From its second call on, a bound conv layer (k1x1, direct, Winograd, depthwise, the stem kernel), the
input-scaled 1x1, the squeeze-excitation scale, global average pooling and the classifier replay the
numba task loops they recorded, without the Python that derived the loops' arguments, while the
runtime passes them the same arrays. These tests run sessions the way a server does (many runs,
new input values each time, several sessions at once) and compare every run with a fresh session
that has never replayed anything: bitwise, since the same loops run on the same data. A replay that
kept a stale argument (a scratch buffer another layer replaced, a per-call flag array, the scale of an
earlier run) gives a different result on the second input and fails here.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest
from numba import njit

import tilefuse
from tilefuse import models
from tilefuse.kernels import threads as T


@njit(nogil=True, cache=True)
def _add_one_seq(counter, tid, out, x):
    """A one-task loop (threads.numba_region's seq form): out = x + 1."""
    for i in range(out.size):
        out[i] = x[i] + 1.0


def _fresh(net, x, threads):
    """One run of a new session: every layer takes the full path (nothing is replayed on a first call)."""
    return tilefuse.Session(tilefuse.compile(net, threads=threads), threads=threads).run(x)


# efficientnet_b0 at 64 x 64: the squeeze-excitation 1x1s scale the weights per task (8x8 maps: few output
# channels for their positions) and the input (2x2 and 4x4 maps), with the depthwise, k1x1 and stem kernels;
# resnet18: the direct, Winograd, max pool and classifier paths; mobilenet_v2: depthwise with ReLU6 and
# residuals; regnet_y_400mf: grouped convs (lanes form); shufflenet_v2: the layout conversions around its
# channel shuffles. 1 and 2 threads (the region widths differ; the
# bits do not).
@pytest.mark.parametrize("name", ["efficientnet_b0", "resnet18", "mobilenet_v2", "regnet_y_400mf", "shufflenet_v2"])
@pytest.mark.parametrize("threads", [1, 2])
def test_replayed_runs_equal_fresh_sessions(name, threads):
    net = models.get(name, seed=0, batch=1, image_size=64)
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal(net.inputs[0].shape).astype(np.float32) * s for s in (1.0, 3.0, 0.2, 1.0)]
    sess = tilefuse.Session(tilefuse.compile(net, threads=threads), threads=threads)
    T.region_counts(reset=True)
    got = [sess.run(x) for x in xs]
    assert T.region_counts()["replayed"] > 0, "no bound call replayed: the test would not exercise replays"
    for i, (g, x) in enumerate(zip(got, xs)):
        want = _fresh(net, x, threads)
        assert np.array_equal(g, want), f"run {i}: max diff {np.abs(g - want).max()}"
    assert not np.array_equal(got[0], got[1])


def test_concurrent_sessions_replay_their_own_buffers():
    """Two sessions of one package and one session's two contexts, each driven by its own thread:
    every context replays its own recorded loops (its own scratch buffers and views)."""
    net = models.get("efficientnet_b0", seed=0, batch=1, image_size=64)
    compiled = tilefuse.compile(net, threads=2)
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal(net.inputs[0].shape).astype(np.float32) for _ in range(6)]
    want = [_fresh(net, x, 2) for x in xs]
    shared = tilefuse.Session(compiled, threads=2, max_concurrent=2)
    sessions = [tilefuse.Session(compiled, threads=2), shared, shared]
    errors = []

    def drive(sess, k):
        try:
            for r in range(4):
                for i in range(len(xs)):
                    j = (i + k + r) % len(xs)
                    if not np.array_equal(sess.run(xs[j]), want[j]):
                        errors.append((k, r, j))
        except Exception as e:      # noqa: BLE001  (reported below, with the thread)
            errors.append((k, repr(e)))

    ts = [threading.Thread(target=drive, args=(s, k)) for k, s in enumerate(sessions)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors


def test_io_operands_are_not_replayed_and_not_kept():
    """A call site whose operands change between calls (the program's input and output layers get new
    views every run) drops its recording and never records again."""
    calls = []

    def run(out, x):
        calls.append(x)
        T.numba_region(None, _add_one_seq, 1, 1, out, x)

    fn = T.replaying(run)
    a, b = np.zeros(4, np.float32), np.zeros(4, np.float32)
    out = np.zeros(4, np.float32)
    fn(out, a)          # first call: full path
    fn(out, a)          # second: recorded
    T.region_counts(reset=True)
    fn(out, a)          # replayed: run() not called
    assert len(calls) == 2 and T.region_counts()["replayed"] == 1
    a += 1.0
    fn(out, a)          # replayed on the new values in the same array
    assert np.array_equal(out, a + 1.0)
    fn(out, b)          # another operand: the full path, the recording dropped
    fn(out, a)
    fn(out, a)
    assert len(calls) == 5 and T.region_counts()["replayed"] == 2
    assert np.array_equal(out, a + 1.0)


def test_a_call_with_a_python_pool_loop_is_never_replayed():
    """parallel_for work cannot be replayed: the call keeps taking the full path."""
    calls = []

    def run(out):
        calls.append(1)
        T.parallel_for(lambda i: out.__setitem__(i, out[i] + 1.0), range(out.size), 1)

    fn = T.replaying(run)
    out = np.zeros(3, np.float32)
    for _ in range(4):
        fn(out)
    assert len(calls) == 4 and np.array_equal(out, np.full(3, 4.0, np.float32))


@pytest.mark.parametrize("mode,threads,where", [("numba", 2, "numba"), ("pool", 2, "pool"), ("numba", 1, "serial")])
def test_inlined_replay_runs_the_loops_where_numba_region_would(mode, threads, where):
    """replay_regions' inlined form (threads.REPLAY_INLINE) and the numba_region call per loop run a recorded
    1x1 conv's task loops to the same bits and count them in the same place: numba's pool, our pool (forced by
    the region mode), or the calling thread (one thread)."""
    from tilefuse.kernels.conv import k1x1
    rng = np.random.default_rng(3)
    xb = rng.standard_normal((2, 3, 7, 9, 16)).astype(np.float32)
    w = rng.standard_normal((40, 48, 1, 1)).astype(np.float32)
    pr = k1x1.prepare(w, rng.standard_normal(40).astype(np.float32))
    out = np.zeros((2, 3, 7, 9, 16), np.float32)
    with T.capture_regions() as calls:
        k1x1.run_nchwc(out, xb, pr, relu=True, threads=threads)
    want = out.copy()
    assert calls and None not in calls and want.any()
    saved_mode, saved_flag = T._NUMBA.get("mode"), T.REPLAY_INLINE
    try:
        T._NUMBA["mode"] = mode
        for inline in (True, False):
            T.REPLAY_INLINE = inline
            out[...] = 0.0
            T.region_counts(reset=True)
            T.replay_regions(calls)
            counts = T.region_counts()
            assert np.array_equal(out, want), f"inline={inline}"
            assert counts[where] == len(calls) and sum(v for k, v in counts.items() if k != where) == 0, counts
    finally:
        T.REPLAY_INLINE = saved_flag
        if saved_mode is None:
            T._NUMBA.pop("mode", None)
        else:
            T._NUMBA["mode"] = saved_mode


@pytest.mark.parametrize("name", ["mobilenet_v2", "efficientnet_b0"])
def test_flat_plan_replays_every_recorded_call_in_order(name):
    """From a context's third run on, Session runs its flat plan (runtime/session.py `_flatten`): the recorded
    task loops of consecutive replayed calls as one replay, the other calls as they are, the fused no-ops left
    out. Every instruction is covered once, and every run equals a fresh session bit for bit (a plan that
    dropped or reordered a step computes from the previous run's tensors); with replaying turned off
    (threads.REPLAY) the plan is not used."""
    from tilefuse.runtime.session import _flatten
    net = models.get(name, seed=0, batch=1, image_size=64)
    rng = np.random.default_rng(9)
    xs = [rng.standard_normal(net.inputs[0].shape).astype(np.float32) * s for s in (1.0, 2.0, 0.5, 1.5, 1.0)]
    sess = tilefuse.Session(tilefuse.compile(net, threads=2), threads=2)
    got = [sess.run(xs[0]), sess.run(xs[1])]
    ctx = sess._contexts[0]
    assert ctx.flat is not None
    calls = ctx.calls()
    live = [e for e in calls if getattr(e[0], "fused_into", None) is None]
    covered = sum(s[2] if s[0] == "replay" else 1 for s in ctx.flat)
    assert covered == len(live) <= len(calls)
    replays = [s for s in ctx.flat if s[0] == "replay"]
    assert replays and max(s[2] for s in replays) > 1 and len(ctx.flat) < len(live)
    assert ctx.flat == _flatten(calls)                      # nothing recorded anew since
    got += [sess.run(x) for x in xs[2:4]]
    T.REPLAY = False
    try:
        calls_before = T.region_counts()["replayed"]
        got.append(sess.run(xs[4]))
        assert T.region_counts()["replayed"] == calls_before  # the full path, no plan
    finally:
        T.REPLAY = True
    for i, (g, x) in enumerate(zip(got, xs)):
        want = _fresh(net, x, 2)
        assert np.array_equal(g, want), f"run {i}: max diff {np.abs(g - want).max()}"
