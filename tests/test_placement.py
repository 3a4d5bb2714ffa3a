"""numba's OpenMP workers kept off the caller's core (kernels/placement.py).

A run's first region wakes numba's workers, and Linux may place a woken worker on the caller's core
when another thread of the process has just kept the other core busy (the two then share one core
for a time slice per barrier: MobileNetV2 batch 1 at 2 threads ran 6.5-6.9 ms against 2.6-3.2 after
such a burst). Each Session compute sets the workers' affinity to their own cores less the caller's.
These tests read the workers' affinity back from the OS (`os.sched_getaffinity` of their thread ids):
with the placement removed, the workers keep every core and the tests fail.
"""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import tilefuse
from tilefuse import models
from tilefuse.kernels import placement
from tilefuse.kernels import threads as T

CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
needs_two = pytest.mark.skipif(not placement.available() or len(CPUS) < 2 or T.numba_layer() != "omp",
                               reason="needs Linux affinity calls, glibc, numba's OpenMP layer and 2 cores")


def _session(threads):
    net = models.get("resnet18", seed=0, batch=1, image_size=32)
    x = np.random.default_rng(0).standard_normal(net.inputs[0].shape).astype(np.float32)
    return tilefuse.Session(tilefuse.compile(net, threads=threads), threads=threads), x


def _in_new_thread(fn):
    """fn() on a new thread (its own numba team and placement state; the test's affinity changes stay there)."""
    box = {}

    def body():
        try:
            box["out"] = fn()
        except BaseException as e:      # re-raised on the test's thread
            box["err"] = e
    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "err" in box:
        raise box["err"]
    return box["out"]


@needs_two
def test_a_run_keeps_its_workers_off_the_callers_core():
    s, x = _session(2)
    want = s.run(x)

    def body():
        me = threading.get_native_id()
        y = s.run(x)
        p = placement.placed()
        tasks = {int(t) for t in os.listdir("/proc/self/task")}
        return y, p, me, tasks, sorted(os.sched_getaffinity(0))
    y, p, me, tasks, mine = _in_new_thread(body)
    np.testing.assert_array_equal(y, want)            # which core a task runs on never changes its bits
    assert len(p["workers"]) == 1, p                  # 2 threads: the caller and one worker
    (tid, aff), = p["workers"].items()
    assert tid != me and tid in tasks
    assert p["off_cpu"] in CPUS
    assert aff == sorted(set(CPUS) - {p["off_cpu"]}), p
    assert mine == CPUS                               # the caller's own affinity is left alone


@needs_two
def test_the_workers_follow_the_caller_to_another_core():
    s, x = _session(2)
    a, b = CPUS[0], CPUS[1]

    def body():
        s.run(x)                                      # the team starts with this thread's full affinity
        seen = []
        for cpu in (a, b, a):
            os.sched_setaffinity(0, {cpu})            # this thread only
            s.run(x)
            p = placement.placed()
            seen.append((p["off_cpu"], list(p["workers"].values())))
        return seen
    for (off, affs), cpu in zip(_in_new_thread(body), (a, b, a)):
        assert off == cpu
        assert affs == [sorted(set(CPUS) - {cpu})]


@needs_two
def test_more_threads_than_cores_keeps_the_workers_affinity(monkeypatch):
    """With more workers than the cores besides the caller's, excluding one would crowd them: they keep
    their own affinity. (Regions on numba's pool at the full width: `region_plan` would narrow the team to the
    free cores, and libgomp then ends the extra workers.)"""
    nt = min(len(CPUS) + 1, T.numba_max_threads())
    if nt <= len(CPUS):
        pytest.skip("NUMBA_NUM_THREADS caps the team at the core count")
    monkeypatch.setitem(T._NUMBA, "mode", "numba")
    s, x = _session(nt)

    def body():
        s.run(x)
        return placement.placed()
    p = _in_new_thread(body)
    assert len(p["workers"]) == nt - 1
    assert all(aff == CPUS for aff in p["workers"].values()), p


@needs_two
def test_a_worker_that_exited_is_read_again():
    """libgomp ends workers when a team shrinks: an affinity call on a thread id that is gone reads the team
    again instead of failing the run."""
    s, x = _session(2)

    def body():
        s.run(x)
        st = placement._ST
        real = st.tids
        gone = 2 ** 22 + 7                            # no such thread: above Linux's largest pid_max
        st.tids = st.tids + (gone,)
        st.masks = dict(st.masks)
        st.masks[gone] = set(CPUS)
        st.cpu = -1                                   # as if the caller had moved: the next run applies again
        s.run(x)
        return real, st.tids, placement.placed()
    real, now, p = _in_new_thread(body)
    assert now == real
    assert p["off_cpu"] is not None and list(p["workers"]) == list(real)


@needs_two
def test_off_leaves_the_workers_alone(monkeypatch):
    monkeypatch.setattr(placement, "ENABLED", False)
    s, x = _session(2)

    def body():
        s.run(x)
        return placement.placed()
    assert _in_new_thread(body) == {"workers": {}, "off_cpu": None}
