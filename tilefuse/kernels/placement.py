"""numba's OpenMP workers kept off the core of the thread that starts a run.

A run's first parallel region wakes numba's worker threads. Linux places a woken thread by its
scheduler's load history, not by what is idle now: after another thread of the process (a
preprocessing thread, ONNX Runtime's spinning workers, a BLAS pool) has just kept a core busy,
that core still counts as the loaded one, and the woken worker can land on the caller's core
while the other sits idle. The two then share one core until the load balancer moves one, and
every barrier of the run waits a time slice. Measured on the 2-core development VM (MobileNetV2
batch 1 at 2 threads, torch imported first so numba runs on torch's libgomp with its default spin;
a 40 ms busy loop of another thread, an idle pause, then one run; medians of 30, benchmarks/RESULTS.md
2026-12-03): 6.5-6.9 ms a run (75th percentile 10-14 ms) against 2.6-3.2 ms with the workers kept
off the caller's core; 2.4-3.0 ms either way without the busy loop.

`keep_off_caller(threads)` runs at the start of every Session compute (the Trainer runs its kernels
on our own pool, not numba's: it has no such team): it
records the OS thread ids of this thread's numba workers once (libgomp keeps a team of workers per
calling thread; a parallel region where each writes its `gettid()`), and sets their CPU affinity
to the cores they may use minus the one the caller is on now. Nothing changes while the caller
stays on its core (one `sched_getcpu` a run, ~0.5 us); when it moves, the workers' affinity follows
(one `sched_setaffinity` each). Where the other cores cannot hold every worker (more threads than
cores) the workers keep their own affinity. Only for numba's OpenMP layer on Linux, never inside
our pool's workers; `TILEFUSE_PLACE=0` turns it off. Which thread runs a task never changes its
bits (threads.py), so neither does this.
"""
from __future__ import annotations

import ctypes
import os
import threading

import numba as nb
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import threads as T

ENABLED = os.environ.get("TILEFUSE_PLACE", "1").strip().lower() not in ("0", "false", "no", "off")


@intrinsic
def _gettid(typingctx):
    """The calling OS thread's id (glibc's gettid(), by symbol: the compiled code caches)."""
    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), []), "gettid")
        return builder.call(fn, [])
    return types.int32(), codegen


@njit(parallel=True, nogil=True, cache=True)
def _tids_par(nt, out):
    for _w in nb.prange(nt):
        out[nb.get_thread_id()] = _gettid()


def _libc_fn(name):
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (AttributeError, OSError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = ()
    return fn


_SCHED_GETCPU = _libc_fn("sched_getcpu") if hasattr(os, "sched_setaffinity") else None
_HAS_GETTID = _libc_fn("gettid") is not None


class _State(threading.local):
    """Per calling thread: its numba workers, their own affinity, the core they are kept off."""
    tids: tuple = ()       # OS thread ids of the workers of this thread's numba team
    masks: dict = {}       # tid -> the affinity it had before we changed it
    width = 0              # the team width they were recorded at
    team = -1              # threads._LOCAL.team when recorded (it counts team growths)
    cpu = -1               # the caller's core they are kept off (-1: none applied)
    off = False            # this thread gave up (an affinity call failed other than on a dead thread)


_ST = _State()


def available() -> bool:
    """Whether workers can be placed here: Linux affinity calls, glibc's gettid and sched_getcpu."""
    return ENABLED and _SCHED_GETCPU is not None and _HAS_GETTID


def _record(st: _State, width: int) -> None:
    """The OS ids of this thread's numba workers at team width `width` (a region of `width` workers, each
    writing its id), and each one's current affinity (kept for the ones seen before)."""
    out = np.zeros(T.numba_max_threads(), np.int32)
    if T._LOCAL.numba_nt != width:
        T.set_numba_threads(width)
    _tids_par(width, out)
    me = threading.get_native_id()
    tids = tuple(sorted({int(t) for t in out[:width] if t > 0 and t != me}))
    masks = {}
    for t in tids:
        masks[t] = st.masks[t] if t in st.masks else os.sched_getaffinity(t)
    st.tids, st.masks, st.width, st.team, st.cpu = tids, masks, width, T._LOCAL.team, -1


def _apply(st: _State, cpu: int) -> None:
    """Each worker's own affinity less `cpu`, where the rest holds every worker; else its own."""
    n = len(st.tids)
    for t in st.tids:
        own = st.masks[t]
        rest = own - {cpu}
        os.sched_setaffinity(t, rest if len(rest) >= n else own)
    st.cpu = cpu


def keep_off_caller(threads) -> None:
    """Keep this thread's numba workers (the team a region at `threads` runs on) off the core this thread is
    on now (see the module docstring). Cheap when nothing changed: one sched_getcpu."""
    if not ENABLED or _SCHED_GETCPU is None or not _HAS_GETTID or T._LOCAL.worker:
        return
    st = _ST
    if st.off:
        return
    width = T.region_threads(threads, 1 << 30)
    if width < 2:
        return
    cpu = _SCHED_GETCPU()
    if st.cpu == cpu and st.width >= width and st.team == T._LOCAL.team:
        return
    if T.numba_layer() != "omp":
        st.off = True
        return
    for attempt in (0, 1):
        try:
            if st.width < width or st.team != T._LOCAL.team or attempt:
                _record(st, width)
            _apply(st, cpu)
            return
        except ProcessLookupError:       # a worker has exited (libgomp shrank the team): read them again
            st.width = 0
        except OSError:
            st.off = True
            return


def placed() -> dict:
    """This thread's numba workers and where they are kept: {'workers': {tid: sorted affinity}, 'off_cpu': the
    caller's core they are kept off or None}; workers that have exited are left out."""
    st = _ST
    alive = [t for t in st.tids if os.path.exists(f"/proc/self/task/{t}")]
    return {"workers": {t: sorted(os.sched_getaffinity(t)) for t in alive}, "off_cpu": st.cpu if st.cpu >= 0 else None}
