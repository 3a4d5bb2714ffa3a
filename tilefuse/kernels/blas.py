"""The one BLAS module: which OpenBLAS numpy runs on, its thread count, and a GEMM into views.

numpy ships OpenBLAS (`numpy.libs/libscipy_openblas*.so`); `_openblas()` finds that library
once (the copies this process has mapped, else numpy's own directory) and everything BLAS in
tilefuse goes through it:

  blas_threads(n)      context: OpenBLAS's thread count while our own pool runs (kernels split
                       their work on `kernels/threads.py`, so OpenBLAS is held at one thread
                       and the two levels of parallelism do not oversubscribe the cores)
  blas_info()          the OpenBLAS core type in use ('SkylakeX', 'Haswell', ...)
  gemm(a, b, out, beta)  out = a @ b + beta*out on 2-D float32 views with unit stride in the
                       last dimension (either operand may be a transposed view): cblas_sgemm
                       through ctypes (which releases the GIL), so that gradients accumulate in
                       place (beta = 1) without a temporary; np.matmul (+ add) without the
                       library or with TILEFUSE_TRAIN_NUMPY_GEMM set
  SGEMM, nb_gemm       the same cblas_sgemm called from inside numba kernels (~1 us a call
                       instead of ~25 us through Python): SGEMM = (the function's address, whether
                       its integers are 64-bit), an argument of the kernels (so they stay
                       cacheable), address 0 without the library; nb_gemm(SGEMM, a, b, c, beta,
                       trans_b) is c = a @ (b.T if trans_b else b) + beta*c
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import threading
from pathlib import Path

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core.extending import intrinsic

_LIB = None
_LIB_FOUND = False
_LOCK = threading.Lock()


def _candidates() -> list[str]:
    """OpenBLAS libraries: those this process has mapped (numpy's, once numpy is imported),
    then the ones in numpy's wheel directory."""
    paths: list[str] = []
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({ln.split()[-1] for ln in f if "openblas" in ln.lower() and "/" in ln})
    except OSError:
        pass
    libdir = Path(np.__file__).resolve().parent.parent / "numpy.libs"
    return paths + [p for p in sorted(glob.glob(str(libdir / "libscipy_openblas*.so*"))) if p not in paths]


def _openblas():
    """The OpenBLAS library numpy uses (a ctypes.CDLL), or None."""
    global _LIB, _LIB_FOUND
    with _LOCK:
        if not _LIB_FOUND:
            for p in _candidates():
                try:
                    _LIB = ctypes.CDLL(p)
                except OSError:
                    continue
                break
            _LIB_FOUND = True
        return _LIB


def _symbol(*names):
    lib = _openblas()
    for nm in names:
        fn = getattr(lib, nm, None) if lib is not None else None
        if fn is not None:
            return fn
    return None


# ---------------------------------------------------------------------------- threads

_THREADS = None
_THREADS_LOCK = threading.Lock()


def _thread_calls():
    """(set_num_threads, get_num_threads) of OpenBLAS, or (None, None)."""
    global _THREADS
    if _THREADS is None:
        for nm in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                   "openblas_set_num_threads64_", "openblas_set_num_threads"):
            setter = _symbol(nm)
            getter = _symbol(nm.replace("set_num_threads", "get_num_threads"))
            if setter is not None and getter is not None:
                setter.argtypes = [ctypes.c_int]
                getter.restype = ctypes.c_int
                _THREADS = (setter, getter)
                break
        else:
            _THREADS = (None, None)
    return _THREADS


@contextlib.contextmanager
def blas_threads(n: int):
    """Temporarily set OpenBLAS's thread count (no-op if numpy is not on OpenBLAS)."""
    setter, getter = _thread_calls()
    if setter is None:
        yield
        return
    with _THREADS_LOCK:
        old = getter()
        setter(int(n))
    try:
        yield
    finally:
        with _THREADS_LOCK:
            setter(old)


def blas_info() -> str:
    """OpenBLAS core type in use, e.g. 'Haswell' or 'SkylakeX' (set OPENBLAS_CORETYPE before numpy loads)."""
    fn = _symbol("scipy_openblas_get_corename64_", "scipy_openblas_get_corename",
                 "openblas_get_corename64_", "openblas_get_corename")
    if fn is None:
        return "unknown"
    fn.restype = ctypes.c_char_p
    return fn().decode()


# ---------------------------------------------------------------------------- GEMM

_ROW, _NT, _T = 101, 111, 112


def _load_sgemm():
    """cblas_sgemm of numpy's OpenBLAS with its argument types, or None."""
    if os.environ.get("TILEFUSE_TRAIN_NUMPY_GEMM"):
        return None
    for sym, it in (("scipy_cblas_sgemm64_", ctypes.c_int64), ("scipy_cblas_sgemm", ctypes.c_int32)):
        fn = _symbol(sym)
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


# ---------------------------------------------------------------------------- GEMM from numba

def _sgemm_intrinsic(bits):
    """An intrinsic calling cblas_sgemm at an address with `bits`-bit integer arguments:
    (addr, transa, transb, m, n, k, a, lda, b, ldb, beta, c, ldc), RowMajor and alpha = 1; the
    integers arrive as int64 (truncated for the 32-bit interface), a, b, c are addresses."""
    @intrinsic
    def call(typingctx, addr, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc):
        sig = types.void(types.int64, types.int32, types.int32, types.int64, types.int64,
                         types.int64, types.uint64, types.int64, types.uint64, types.int64,
                         types.float32, types.uint64, types.int64)

        def codegen(context, builder, signature, args):
            i32, idx, ptr, f32 = ir.IntType(32), ir.IntType(bits), ir.IntType(64), ir.FloatType()
            fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, idx, idx, idx, f32, ptr, idx,
                                                   ptr, idx, f32, ptr, idx])
            (addr_, ta_, tb_, m_, n_, k_, a_, lda_, b_, ldb_, beta_, c_, ldc_) = args
            cast = (lambda v: builder.trunc(v, idx)) if bits == 32 else (lambda v: v)
            fn = builder.inttoptr(addr_, fnty.as_pointer())
            builder.call(fn, [ir.Constant(i32, _ROW), ta_, tb_, cast(m_), cast(n_), cast(k_),
                              ir.Constant(f32, 1.0), a_, cast(lda_), b_, cast(ldb_), beta_, c_,
                              cast(ldc_)])
            return context.get_dummy_value()
        return sig, codegen
    return call


_call_sgemm64 = _sgemm_intrinsic(64)
_call_sgemm32 = _sgemm_intrinsic(32)


def _nb_sgemm():
    """(address, 64-bit integers?) of numpy's cblas_sgemm, or (0, True) without one (or with
    TILEFUSE_TRAIN_NUMPY_GEMM set)."""
    if os.environ.get("TILEFUSE_TRAIN_NUMPY_GEMM"):
        return (0, True)
    for sym, ilp64 in (("scipy_cblas_sgemm64_", True), ("scipy_cblas_sgemm", False)):
        fn = _symbol(sym)
        if fn is not None:
            return (ctypes.cast(fn, ctypes.c_void_p).value, ilp64)
    return (0, True)


SGEMM = _nb_sgemm()


@nb.njit(nogil=True, cache=True)
def nb_gemm(fn, a, b, c, beta, trans_b, trans_a=False):
    """c = op(a) @ op(b) + beta*c, op(b) = b.T if trans_b else b, op(a) = a.T if trans_a else a
    (a stored (k, m) then); 2-D float32 views, unit stride in the last dimension (C order rows of
    any pitch); fn = SGEMM (the library's address and interface; the address must not be 0)."""
    m, k = (a.shape[1], a.shape[0]) if trans_a else (a.shape[0], a.shape[1])
    n = c.shape[1]
    if m == 0 or n == 0:
        return
    if k == 0:
        for i in range(m):
            for j in range(n):
                c[i, j] = c[i, j] * np.float32(beta)
        return
    addr, ilp64 = fn
    ta = np.int32(_T if trans_a else _NT)
    tb = np.int32(_T if trans_b else _NT)
    if ilp64:
        _call_sgemm64(addr, ta, tb, m, n, k, a.ctypes.data, a.strides[0] // 4,
                      b.ctypes.data, b.strides[0] // 4, np.float32(beta), c.ctypes.data,
                      c.strides[0] // 4)
    else:
        _call_sgemm32(addr, ta, tb, m, n, k, a.ctypes.data, a.strides[0] // 4,
                      b.ctypes.data, b.strides[0] // 4, np.float32(beta), c.ctypes.data,
                      c.strides[0] // 4)
