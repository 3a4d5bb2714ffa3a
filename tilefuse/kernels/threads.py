"""Threads for every kernel in tilefuse: one pool, one thread-count rule, one BLAS limiter,
one scratch allocator, one step thread count. Used by the inference kernels (`kernels/`, `kernels/conv/`), the
row-band kernels of the stream mode (`kernels/bands.py`), the training kernels and the image
filters (`imaging/`).

Parallelism is ours, not the BLAS library's: a kernel splits its work into tasks whose
boundaries depend only on the layer shape (never on the thread count), and `parallel_for`
(fn(task)) or `parallel_range` (fn(i, tid)) runs them on one shared ThreadPoolExecutor, the
calling thread working too. Numba kernels are `nogil` and numpy's matmul drops the GIL, so the
threads run truly in parallel. Because every output element is computed by the same code in
the same order whichever thread runs its task, results are bitwise identical for 1 and 2 (or
any number of) threads.

While our threads run, OpenBLAS is held at one thread (`blas_threads(1)`, from `kernels/blas.py`)
so the two levels of parallelism do not oversubscribe the cores.

The thread count: `resolve_threads(None)` is every core this process may run on (`cpu_count`,
the CPU affinity); a positive int is taken as given. Scratch: `scratch(name, shape, dtype)` is
a per-thread buffer reused across calls; `Scratch` is the same allocator as an object, for
callers that account for their buffers (the stream mode reports its scratch bytes). The training
kernels read the thread count a step set for its thread (`using`, `nthreads`, `split`).
"""
from __future__ import annotations

import itertools
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
_LOCAL = threading.local()


def cpu_count() -> int:
    """Cores this process may run on (its CPU affinity; os.cpu_count() where there is none)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def resolve_threads(threads) -> int:
    """None -> all cores (`cpu_count`); otherwise a positive int."""
    if threads is None:
        return cpu_count()
    t = int(threads)
    if t < 1:
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
    return t


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=max(2, cpu_count()), thread_name_prefix="tilefuse",
                                       initializer=_mark_worker)
        return _POOL


def _mark_worker() -> None:
    _LOCAL.worker = True


def _spread(body, nt: int) -> None:
    """body(tid) for tid in range(nt): tid 0 on the calling thread, the others on the pool.
    Waits for all; re-raises the caller's exception, else the first worker's."""
    futs = [_pool().submit(body, tid) for tid in range(1, nt)]
    err = None
    try:
        body(0)
    except BaseException as e:
        err = e
    for f in futs:
        try:
            f.result()
        except BaseException as e:
            err = err or e
    if err is not None:
        raise err


def _width(threads, ntasks: int) -> int:
    """Threads a parallel region uses: at most `threads` (None: all cores) and `ntasks`; 1 inside
    a pool worker (a nested region runs inline, so it can never wait for its own pool)."""
    if getattr(_LOCAL, "worker", False):
        return 1
    return min(resolve_threads(threads), ntasks)


def parallel_for(fn, tasks, threads=None) -> None:
    """Run fn(task) for every task; `threads` workers at most (None: all cores).

    Tasks are handed out dynamically; they must write disjoint outputs.
    """
    tasks = list(tasks)
    nt = _width(threads, len(tasks))
    if nt <= 1:
        for t in tasks:
            fn(t)
        return
    it = iter(tasks)
    lock = threading.Lock()

    def body(_tid):
        while True:
            with lock:
                t = next(it, None)
            if t is None:
                return
            fn(t)

    _spread(body, nt)


def parallel_range(ntasks: int, fn, threads=None) -> None:
    """fn(i, tid) for i in range(ntasks), handed out dynamically over min(threads, ntasks)
    threads; tid (0 = the caller) indexes per-thread accumulators the caller sized for
    `threads`."""
    nt = _width(threads, ntasks)
    if nt <= 1:
        for i in range(ntasks):
            fn(i, 0)
        return
    counter = itertools.count()

    def body(tid):
        while True:
            i = next(counter)              # atomic under the GIL
            if i >= ntasks:
                return
            fn(i, tid)

    _spread(body, nt)


class Scratch:
    """Named, typed scratch buffers, grown on demand and reused (contents undefined)."""

    def __init__(self):
        self.bufs: dict[tuple[str, np.dtype], np.ndarray] = {}

    def reserve(self, slot: str, nelem: int, dtype=np.float32) -> None:
        key = (slot, np.dtype(dtype))
        if key not in self.bufs or self.bufs[key].size < nelem:
            self.bufs[key] = np.empty(max(int(nelem), 1), dtype=dtype)

    def get(self, slot: str, shape, dtype=np.float32) -> np.ndarray:
        """A view of `shape` (an int: 1-D) on the slot's buffer."""
        n = shape if isinstance(shape, int) else math.prod(shape)   # (np.prod: ~20 us a call)
        key = (slot, np.dtype(dtype))
        buf = self.bufs.get(key)
        if buf is None or buf.size < n:
            self.reserve(slot, n, dtype)
            buf = self.bufs[key]
        return buf[:n].reshape(shape)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.bufs.values())


def scratch(name: str, shape, dtype=np.float32) -> np.ndarray:
    """A per-thread buffer of `shape` (an int: 1-D), reused across calls of this thread."""
    s = getattr(_LOCAL, "scratch", None)
    if s is None:
        s = _LOCAL.scratch = Scratch()
    return s.get(name, shape, dtype)


# the step thread count (training) -------------------------------------------------------------
# The training kernels take no `threads` argument: a step sets the count once for the thread it
# runs on (`using`), and every kernel it calls splits its tiles over that many threads of the pool.

class using:
    """with using(threads): kernels called in this thread split over `threads` threads
    (None: all cores, `resolve_threads`)."""

    def __init__(self, threads: int | None):
        self.n = resolve_threads(threads)

    def __enter__(self):
        self.old = getattr(_LOCAL, "threads", None)
        _LOCAL.threads = self.n
        return self

    def __exit__(self, *exc):
        _LOCAL.threads = self.old


def nthreads() -> int:
    """The thread count set by `using` in this thread; 1 outside."""
    return getattr(_LOCAL, "threads", None) or 1


def split(ntasks: int, fn) -> None:
    """fn(task, tid) for task in range(ntasks) over `nthreads()` threads of the pool."""
    parallel_range(ntasks, fn, nthreads())


def ranges(n: int, parts: int, align: int = 1):
    """Split range(n) into about `parts` contiguous [lo, hi) pieces (multiples of align)."""
    parts = max(1, min(parts, -(-n // align)))
    step = -(-n // parts)
    step = -(-step // align) * align
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def split_rows(n: int, fn, min_per_task: int = 1) -> None:
    """fn(lo, hi, tid) over ~2 pieces per thread of range(n) (`nthreads()` threads)."""
    t = nthreads()
    parts = 1 if t == 1 else min(2 * t, max(1, n // max(min_per_task, 1)))
    rs = ranges(n, parts)
    split(len(rs), lambda i, tid: fn(rs[i][0], rs[i][1], tid))


# OpenBLAS: its thread count lives with the rest of BLAS in kernels/blas.py (re-exported here
# for the kernels that limit it around their own parallel regions)
from .blas import blas_info, blas_threads  # noqa: E402,F401
