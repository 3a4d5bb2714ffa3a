"""Thread split and GEMM for the training kernels.

One thread pool does everything during a step: ``run(ntasks, fn)`` hands tasks
``fn(task, tid)`` to ``threads`` threads (the caller is thread 0) in dynamic order; the
kernels inside are numba ``nogil`` loops (compiled without numba's own thread pool) and
single-threaded BLAS GEMMs, so both cores work on independent tiles and no second pool
spins while this one works (see docs/training.md "Threads"). Idle workers block on a
condition variable.

``gemm(a, b, out, beta)`` is ``out = a @ b + beta*out`` on 2-D float32 views with unit stride
in the last dimension (either operand may be a transposed view). It calls ``cblas_sgemm`` of
the OpenBLAS numpy ships (through ctypes, which releases the GIL) so that weight gradients
accumulate in place (beta = 1) without a temporary; without that library it falls back to
``np.matmul`` (+ add).
"""
from __future__ import annotations

import ctypes
import glob
import itertools
import os
import threading
from pathlib import Path

import numpy as np

# ---------------------------------------------------------------------------- thread split


class ThreadSplit:
    def __init__(self, threads: int):
        self.threads = max(1, int(threads))
        self._cv = threading.Condition()
        self._job = None
        self._gen = 0
        self._pending = 0
        self._errors: list = []
        self._workers = []
        for tid in range(1, self.threads):
            t = threading.Thread(target=self._loop, args=(tid,), daemon=True,
                                 name=f"tilefuse-train-{tid}")
            t.start()
            self._workers.append(t)

    def _loop(self, tid):
        seen = 0
        while True:
            with self._cv:
                while self._gen == seen:
                    self._cv.wait()
                seen = self._gen
                job = self._job
            try:
                job(tid)
            except BaseException as e:          # re-raised in the caller
                self._errors.append(e)
            with self._cv:
                self._pending -= 1
                if self._pending == 0:
                    self._cv.notify_all()

    def run(self, ntasks: int, fn, threads: int | None = None) -> None:
        """fn(task, tid) for task in range(ntasks), over min(threads, ntasks) threads."""
        use = min(self.threads if threads is None else threads, ntasks)
        if use <= 1:
            for i in range(ntasks):
                fn(i, 0)
            return
        counter = itertools.count()

        def body(tid):
            if tid >= use:
                return
            while True:
                i = next(counter)              # atomic under the GIL
                if i >= ntasks:
                    return
                fn(i, tid)

        with self._cv:
            self._job = body
            self._pending = len(self._workers)
            self._errors = []
            self._gen += 1
            self._cv.notify_all()
        err = None
        try:
            body(0)
        except BaseException as e:
            err = e
        with self._cv:
            while self._pending:
                self._cv.wait()
        if err is not None:
            raise err
        if self._errors:
            raise self._errors[0]


_POOLS: dict[int, ThreadSplit] = {}
_local = threading.local()


def default_threads() -> int:
    return os.cpu_count() or 1


def pool() -> ThreadSplit:
    """The thread split active in this thread (set by `using`), 1 thread outside a step."""
    return getattr(_local, "pool", None) or _pool(1)


def _pool(n: int) -> ThreadSplit:
    if n not in _POOLS:
        _POOLS[n] = ThreadSplit(n)
    return _POOLS[n]


class using:
    """with using(threads): kernels called in this thread split over `threads` threads."""

    def __init__(self, threads: int | None):
        self.n = default_threads() if threads is None else max(1, int(threads))

    def __enter__(self):
        self.old = getattr(_local, "pool", None)
        _local.pool = _pool(self.n)
        return _local.pool

    def __exit__(self, *exc):
        _local.pool = self.old


def run(ntasks: int, fn) -> None:
    pool().run(ntasks, fn)


def nthreads() -> int:
    return pool().threads


def ranges(n: int, parts: int, align: int = 1):
    """Split range(n) into about `parts` contiguous [lo, hi) pieces (multiples of align)."""
    parts = max(1, min(parts, -(-n // align)))
    step = -(-n // parts)
    step = -(-step // align) * align
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def split_rows(n: int, fn, min_per_task: int = 1) -> None:
    """fn(lo, hi, tid) over ~2 pieces per thread of range(n)."""
    t = nthreads()
    parts = 1 if t == 1 else min(2 * t, max(1, n // max(min_per_task, 1)))
    rs = ranges(n, parts)
    run(len(rs), lambda i, tid: fn(rs[i][0], rs[i][1], tid))


# ---------------------------------------------------------------------------- per-thread scratch

_SCRATCH: dict = {}


def scratch(tid: int, key: str, shape, dtype=np.float32) -> np.ndarray:
    """A reusable per-thread buffer (contents undefined), grown as needed."""
    n = int(np.prod(shape))
    k = (tid, key, np.dtype(dtype))
    buf = _SCRATCH.get(k)
    if buf is None or buf.size < n:
        buf = np.empty(max(n, 1), dtype)
        _SCRATCH[k] = buf
    return buf[:n].reshape(shape)


# ---------------------------------------------------------------------------- GEMM

_ROW, _NT, _T = 101, 111, 112


def _load_sgemm():
    """(cblas_sgemm, get_num_threads, set_num_threads) of numpy's OpenBLAS, or Nones."""
    if os.environ.get("TILEFUSE_TRAIN_NUMPY_GEMM"):
        return None, None, None
    libdir = Path(np.__file__).resolve().parent.parent / "numpy.libs"
    for so in sorted(glob.glob(str(libdir / "libscipy_openblas*.so*"))):
        try:
            lib = ctypes.CDLL(so)
        except OSError:
            continue
        for sym, it in (("scipy_cblas_sgemm64_", ctypes.c_int64), ("scipy_cblas_sgemm", ctypes.c_int32)):
            fn = getattr(lib, sym, None)
            if fn is None:
                continue
            fn.restype = None
            fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, it, it, it, ctypes.c_float,
                           ctypes.c_void_p, it, ctypes.c_void_p, it, ctypes.c_float,
                           ctypes.c_void_p, it]
            sfx = "64_" if sym.endswith("64_") else ""
            get = getattr(lib, f"scipy_openblas_get_num_threads{sfx}", None)
            put = getattr(lib, f"scipy_openblas_set_num_threads{sfx}", None)
            if get is not None and put is not None:
                get.restype, get.argtypes = ctypes.c_int, []
                put.restype, put.argtypes = None, [ctypes.c_int]
            else:
                get = put = None
            return fn, get, put
    return None, None, None


_SGEMM, _GET_THREADS, _SET_THREADS = _load_sgemm()


class blas_threads:
    """with blas_threads(1): numpy's BLAS runs in the calling thread (threadpoolctl when it
    is installed, else numpy's OpenBLAS directly); our threads call it concurrently."""

    def __init__(self, n: int):
        self.n = n

    def __enter__(self):
        self._ctl = None
        try:
            from threadpoolctl import threadpool_limits
            self._ctl = threadpool_limits(self.n, user_api="blas")
        except ImportError:
            if _SET_THREADS is not None:
                self._old = _GET_THREADS()
                _SET_THREADS(self.n)
        return self

    def __exit__(self, *exc):
        if self._ctl is not None:
            self._ctl.restore_original_limits()
        elif _SET_THREADS is not None:
            _SET_THREADS(self._old)


def _desc(a):
    """(trans flag, leading dimension) of a 2-D float32 view for row-major cblas, or None."""
    s0, s1 = a.strides
    if a.shape[1] == 1 or s1 == 4:
        if s0 % 4 == 0 and s0 // 4 >= max(a.shape[1], 1):
            return _NT, s0 // 4
    if a.shape[0] == 1 or s0 == 4:
        if s1 % 4 == 0 and s1 // 4 >= max(a.shape[0], 1):
            return _T, s1 // 4
    return None


def gemm(a: np.ndarray, b: np.ndarray, out: np.ndarray, beta: float = 0.0) -> np.ndarray:
    """out = a @ b + beta*out (float32, 2-D; out row-major with unit column stride)."""
    m, k = a.shape
    n = b.shape[1]
    if _SGEMM is not None and a.dtype == b.dtype == out.dtype == np.float32 and m and n and k:
        da, db, do = _desc(a), _desc(b), _desc(out)
        if da and db and do and do[0] == _NT:
            _SGEMM(_ROW, da[0], db[0], m, n, k, 1.0, a.ctypes.data, da[1], b.ctypes.data, db[1],
                   float(beta), out.ctypes.data, do[1])
            return out
    if beta == 0.0:
        np.matmul(a, b, out=out)
    else:
        out += a @ b
    return out
