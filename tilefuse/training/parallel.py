"""Thread split and GEMM for the training kernels.

One thread pool does everything during a step, the shared pool of `kernels/threads.py`:
``using(threads)`` sets the step's thread count, ``run(ntasks, fn)`` hands tasks
``fn(task, tid)`` to that many threads (the caller is thread 0) in dynamic order; the
kernels inside are numba ``nogil`` loops (compiled without numba's own thread pool) and
single-threaded BLAS GEMMs (``kernels.threads.blas_threads``), so both cores work on
independent tiles and no second pool spins while this one works (see docs/training.md
"Threads"). Idle workers block. Per-thread buffers: ``kernels.threads.scratch``.

``gemm(a, b, out, beta)`` is ``out = a @ b + beta*out`` on 2-D float32 views with unit stride
in the last dimension (either operand may be a transposed view). It calls ``cblas_sgemm`` of
the OpenBLAS numpy ships (through ctypes, which releases the GIL) so that weight gradients
accumulate in place (beta = 1) without a temporary; without that library it falls back to
``np.matmul`` (+ add).
"""
from __future__ import annotations

import ctypes
import glob
import os
import threading
from pathlib import Path

import numpy as np

from ..kernels.threads import parallel_range, resolve_threads

# ---------------------------------------------------------------------------- thread split

_local = threading.local()


class using:
    """with using(threads): kernels called in this thread split over `threads` threads
    (None: all cores, `kernels.threads.resolve_threads`)."""

    def __init__(self, threads: int | None):
        self.n = resolve_threads(threads)

    def __enter__(self):
        self.old = getattr(_local, "threads", None)
        _local.threads = self.n
        return self

    def __exit__(self, *exc):
        _local.threads = self.old


def nthreads() -> int:
    """The thread count set by `using` in this thread; 1 outside a step."""
    return getattr(_local, "threads", None) or 1


def run(ntasks: int, fn) -> None:
    """fn(task, tid) for task in range(ntasks) over `nthreads()` threads of the shared pool."""
    parallel_range(ntasks, fn, nthreads())


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


# ---------------------------------------------------------------------------- GEMM

_ROW, _NT, _T = 101, 111, 112


def _load_sgemm():
    """cblas_sgemm of numpy's OpenBLAS, or None."""
    if os.environ.get("TILEFUSE_TRAIN_NUMPY_GEMM"):
        return None
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
            return fn
    return None


_SGEMM = _load_sgemm()


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
