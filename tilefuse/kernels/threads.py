"""Thread control for the conv kernels.

Parallelism is ours, not the BLAS library's: a kernel splits its work into tasks whose
boundaries depend only on the layer shape (never on the thread count), and `parallel_for`
runs them on a shared ThreadPoolExecutor. Numba kernels are `nogil` and numpy's matmul drops
the GIL, so the threads run truly in parallel. Because every output element is computed by
the same code in the same order whichever thread runs its task, results are bitwise identical
for 1 and 2 (or any number of) threads.

While our threads run, OpenBLAS is held at one thread (`blas_threads(1)`) so the two levels
of parallelism do not oversubscribe the cores.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
_LOCAL = threading.local()


def cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def resolve_threads(threads) -> int:
    """None -> all cores; otherwise a positive int."""
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
            _POOL = ThreadPoolExecutor(max_workers=max(2, cpu_count()), thread_name_prefix="tilefuse-conv")
        return _POOL


def parallel_for(fn, tasks, threads=None) -> None:
    """Run fn(task) for every task; `threads` workers at most (None: all cores).

    Tasks are handed out dynamically; they must write disjoint outputs.
    """
    tasks = list(tasks)
    nt = min(resolve_threads(threads), len(tasks))
    if nt <= 1:
        for t in tasks:
            fn(t)
        return
    it = iter(tasks)
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                t = next(it, None)
            if t is None:
                return
            fn(t)

    pool = _pool()
    futs = [pool.submit(worker) for _ in range(nt - 1)]
    try:
        worker()  # the calling thread works too
    finally:
        for f in futs:
            f.result()  # re-raises a worker's exception


def scratch(name: str, size: int) -> np.ndarray:
    """A per-thread float32 buffer of at least `size` elements, reused across calls."""
    bufs = getattr(_LOCAL, "bufs", None)
    if bufs is None:
        bufs = _LOCAL.bufs = {}
    b = bufs.get(name)
    if b is None or b.size < size:
        b = np.empty(max(size, 1), dtype=np.float32)
        bufs[name] = b
    return b[:size]


# OpenBLAS thread control ---------------------------------------------------------------------

def _find_openblas():
    names = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
             "openblas_set_num_threads64_", "openblas_set_num_threads")
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({ln.split()[-1] for ln in f if "openblas" in ln.lower() and "/" in ln})
    except OSError:
        return None, None
    for p in paths:
        try:
            lib = ctypes.CDLL(p)
        except OSError:
            continue
        for nm in names:
            setter = getattr(lib, nm, None)
            getter = getattr(lib, nm.replace("set_num_threads", "get_num_threads"), None)
            if setter is not None and getter is not None:
                setter.argtypes = [ctypes.c_int]
                getter.restype = ctypes.c_int
                return setter, getter
    return None, None


_BLAS = None
_BLAS_LOCK = threading.Lock()


def _blas():
    global _BLAS
    if _BLAS is None:
        _BLAS = _find_openblas()
    return _BLAS


@contextlib.contextmanager
def blas_threads(n: int):
    """Temporarily set OpenBLAS's thread count (no-op if numpy is not on OpenBLAS)."""
    setter, getter = _blas()
    if setter is None:
        yield
        return
    with _BLAS_LOCK:
        old = getter()
        setter(int(n))
    try:
        yield
    finally:
        with _BLAS_LOCK:
            setter(old)


def blas_info() -> str:
    """OpenBLAS core type in use, e.g. 'Haswell' or 'SkylakeX' (set OPENBLAS_CORETYPE before numpy loads)."""
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({ln.split()[-1] for ln in f if "openblas" in ln.lower() and "/" in ln})
        for p in paths:
            lib = ctypes.CDLL(p)
            for nm in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename",
                       "openblas_get_corename64_", "openblas_get_corename"):
                fn = getattr(lib, nm, None)
                if fn is not None:
                    fn.restype = ctypes.c_char_p
                    return fn().decode()
    except OSError:
        pass
    return "unknown"
