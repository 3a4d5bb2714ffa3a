"""Fast dense kernels: linear (N, K) x (M, K)^T with fused bias and ReLU, row-wise softmax.
Numba / OpenBLAS next to the numpy reference (`kernels/reference.py`;
`tests/test_layer_kernels.py`). Tolerances: linear 1e-5 relative (BLAS blocks K differently),
softmax 1e-6. The training forms (forward / backward of linear, softmax cross-entropy with its
gradient) are at the end.
"""
from __future__ import annotations

import numba as nb
import numpy as np
from numba import njit

from . import activations as A
from .blas import blas_threads, gemm
from .conv._nb import atomic_add, reduce16
from .fpflags import FAST
from .threads import numba_region, parallel_for, pool_region, scratch, split


@njit(nogil=True, cache=True, fastmath=FAST)
def _bias_relu_rows(o, b, has_bias, relu):
    N, M = o.shape
    for i in range(N):
        for j in range(M):
            v = o[i, j]
            if has_bias:
                v += b[j]
            if relu:
                v = max(v, np.float32(0.0))
            o[i, j] = v


LINEAR_COLS = 256  # output features per task
GEMV_ROWS = 4      # inputs of at most this many rows (a classifier at batch 1-4) take the numba GEMV
GEMV_COLS = 64     # output features per GEMV task


@njit(nogil=True, cache=True, fastmath=FAST)
def _gemv_cols(out, x, w, b, has_bias, relu, j0, j1):
    """out[n, j] = act(x[n] . w[j] (+ b[j])) for j in [j0, j1): one dot product of two contiguous rows
    per output (vectorized over K), the same code whichever task or thread computes it."""
    N, K = x.shape
    for j in range(j0, j1):
        for n in range(N):
            acc = np.float32(0.0)
            for k in range(K):
                acc += x[n, k] * w[j, k]
            if has_bias:
                acc += b[j]
            if relu:
                acc = max(acc, np.float32(0.0))
            out[n, j] = acc


@njit(nogil=True, cache=True)
def _gemv_seq(counter, tid, out, x, w, b, has_bias, relu):
    """One worker: blocks of GEMV_COLS output features taken from `counter` (threads.numba_region)."""
    M = w.shape[0]
    while True:
        j0 = atomic_add(counter, 0, 1) * GEMV_COLS
        if j0 >= M:
            break
        _gemv_cols(out, x, w, b, has_bias, relu, j0, min(j0 + GEMV_COLS, M))


@njit(parallel=True, nogil=True, cache=True)
def _gemv_par(nt, out, x, w, b, has_bias, relu):
    counter = np.zeros(1, np.int64)
    for _w in nb.prange(nt):
        _gemv_seq(counter, nb.get_thread_id(), out, x, w, b, has_bias, relu)


def linear(out, x, w, *b, has_bias, relu, threads=None, **_):
    """out (N, M) = x (N, K) @ w (M, K)^T + bias, ReLU.

    Tasks are blocks of LINEAR_COLS output features on our thread pool, each one OpenBLAS call
    with OpenBLAS held at one thread: the blocks depend on the shape only, so 1 and 2 threads
    give identical results (a multi-threaded BLAS call may split K differently), and OpenBLAS's
    own threads do not fight the pool's. At most GEMV_ROWS input rows (a classifier at batch 1-4,
    where the GEMM is a matrix-vector product bound by reading w): a numba GEMV over blocks of
    GEMV_COLS output features on the numba region (0.31 -> 0.10 ms for 1280 -> 1000 on two Zen 3
    cores, w in cache; benchmarks/RESULTS.md)."""
    if out.dtype != np.float32 or not out.flags.c_contiguous or x.ndim != 2:
        np.matmul(x, w.T, out=out)
        if has_bias:
            out += b[0]
        if relu:
            np.maximum(out, 0, out=out)
        return
    m = w.shape[0]
    bias = b[0] if has_bias else out[0]
    if x.shape[0] <= GEMV_ROWS and x.dtype == np.float32 and x.flags.c_contiguous and w.dtype == np.float32 \
            and w.flags.c_contiguous and bias.dtype == np.float32:
        numba_region(_gemv_par, _gemv_seq, threads, -(-m // GEMV_COLS), out, x, w, bias, bool(has_bias), bool(relu))
        return

    def task(j0):
        j1 = min(j0 + LINEAR_COLS, m)
        blk = scratch("linear", x.shape[0] * (j1 - j0)).reshape(x.shape[0], j1 - j0)
        np.matmul(x, w[j0:j1].T, out=blk)  # (N, K) @ (K, cols) -> (N, cols)
        _bias_relu_rows(blk, bias[j0:j1] if has_bias else bias, has_bias, relu)
        out[:, j0:j1] = blk

    with blas_threads(1):
        parallel_for(task, range(0, m, LINEAR_COLS), threads)


_EXP_LO = np.float32(-87.0)


@njit(inline="always", cache=True)
def _exp_nonpos(d):
    """e^d for d <= 0 (a softmax's t - max t): one exp32, 0 below -87 (activations._exp computes two exp32 and
    its second factor is e^0 = 1 here: the same bits at half the cost), NaN for NaN."""
    r = A.exp32(max(d, _EXP_LO))
    return np.float32(0.0) if d < _EXP_LO else r


@njit(nogil=True, cache=True, fastmath=A.SPAN_FASTMATH)
def _softmax_rows(out, x, r0, r1, scale):
    """Rows [r0, r1) of (R, K): t = x * scale, softmax(t) = e^(t - max t) / sum, in float32 as the reference.
    The max and the sum over 16 lanes in one register (`reduce16`: partial results per lane, combined in order,
    nothing reassociated), then the tail; e^ in a plain loop LLVM vectorizes (one exp32). Four passes over a row
    in L1: 1.52 -> 0.55 ms for 8 x 4 x 256 x 256 scores on one Zen 5 core (PyTorch 0.91; benchmarks/elementwise.py,
    RESULTS.md). A NaN in a row makes the row NaN, as PyTorch's (the max skips it, its e^NaN makes the sum NaN);
    a row of -inf only is NaN too (-inf - -inf), as PyTorch's."""
    K = x.shape[1]
    n16 = K // 16
    K16 = 16 * n16
    u = np.float32(1.0) if scale >= np.float32(0.0) else np.float32(-1.0)
    a = abs(scale)
    for r in range(r0, r1):
        xr, orow = x[r], out[r]
        # e^(s x - max s x) as e^((u x - max u x) |s|), u = sign(s): u x is exact, so no multiply-add LLVM may
        # contract (`contract`) moves the difference; from x * s - max(x * s) the multiply-add of the exact
        # product sits ~1e23 off the rounded max where |x s| ~ 1e30 (every e^ 0, a zero sum)
        m = reduce16(xr, 0, n16, np.float32(0.0), u, 0)
        for k in range(K16, K):
            t = xr[k] * u
            m = t if t > m else m
        for k in range(K):
            orow[k] = _exp_nonpos((xr[k] * u - m) * a)
        s = reduce16(orow, 0, n16, np.float32(0.0), np.float32(1.0), 1)
        for k in range(K16, K):
            s += orow[k]
        inv = np.float32(1.0) / s
        for k in range(K):
            orow[k] = orow[k] * inv


SOFTMAX_ROWS = 64     # rows of a softmax task


@njit(nogil=True, cache=True)
def _softmax_seq(counter, tid, out, x, scale):
    """One worker: tasks of SOFTMAX_ROWS rows taken from `counter` (threads.pool_region)."""
    R = x.shape[0]
    while True:
        r0 = atomic_add(counter, 0, 1) * SOFTMAX_ROWS
        if r0 >= R:
            break
        _softmax_rows(out, x, r0, min(R, r0 + SOFTMAX_ROWS), scale)


def softmax(out, x, *, axis=1, scale=1.0, threads=None, **_):
    """Softmax over the last axis of x * scale (the scale: an attention's 1 / sqrt(d) folded in by the
    compiler), rows in tasks of SOFTMAX_ROWS taken inside numba by one worker per thread (`pool_region`: a Python
    task per row block cost more than its rows, 128 tasks of 8 x 4 x 256 x 256 scores); another axis or dtype: the
    reference."""
    if x.dtype != np.float32 or axis not in (x.ndim - 1, -1) or not x.flags.c_contiguous \
            or not out.flags.c_contiguous:
        from . import reference as ref
        out[...] = ref.softmax(x, axis, scale)
        return
    x2, o2 = x.reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1])   # (..., K) -> (R, K)
    pool_region(_softmax_seq, threads, -(-x2.shape[0] // SOFTMAX_ROWS), o2, x2, np.float32(scale))


MATMUL_ROWS = 128     # rows of a matmul task (a GEMM call)


def matmul(out, a, b, *, threads=None, **_):
    """out (..., M, N) = a (..., M, K) @ b (..., K, N), the batch axes broadcast: OpenBLAS GEMMs (`blas.gemm`,
    which takes either operand as a transposed view: a k.transpose(-2, -1) arrives without a copy) per batch
    item and block of rows, spread over our thread pool with OpenBLAS held at one thread, so any thread count
    gives the same bits. float64 / non-contiguous outputs: np.matmul."""
    if out.dtype != np.float32 or not out.flags.c_contiguous:
        np.matmul(a, b, out=out)
        return
    batch = out.shape[:-2]
    m = out.shape[-2]
    # the operands broadcast to the output's batch axes (views: stride 0 where an operand is shared), one
    # 2-D (rows, K) @ (K, N) per batch index and block of MATMUL_ROWS rows (from the shape only: the same
    # GEMM calls whatever the thread count, so the same bits; a batch-1 non-local block's 1024 x 1024 scores
    # are 8 tasks, not 1)
    ab = np.broadcast_to(a, batch + a.shape[-2:])
    bb = np.broadcast_to(b, batch + b.shape[-2:])
    tasks = [(idx, r0) for idx in np.ndindex(*batch) for r0 in range(0, m, MATMUL_ROWS)]

    def task(t):
        idx, r0 = t
        r1 = min(m, r0 + MATMUL_ROWS)
        gemm(ab[idx][r0:r1], bb[idx], out[idx][r0:r1])

    with blas_threads(1):
        parallel_for(task, tasks, threads)


# training forms -----------------------------------------------------------------------------------

# The step's BLAS runs single-threaded (kernels/blas.blas_threads: one pool per step), so the training linear splits
# its GEMMs itself over the step's threads, in blocks fixed by the shapes (not by the thread count: OpenBLAS's result
# for an element may depend on the call's size, and the step's results stay bitwise equal for every thread count):
# y and dx in blocks of LINEAR_ROWS rows, dW in blocks of LINEAR_COLS output features (each a whole reduction over
# the rows, no partial sums). ConvNeXt's MLP linears over (N*H*W, C) token rows ran on one of two threads.
LINEAR_ROWS = 1024
LINEAR_COLS = 64


def _row_blocks(n, step):
    return [(i, min(n, i + step)) for i in range(0, n, step)]


def linear_forward(x, w, b=None):
    """(R, K) x, (M, K) w -> (R, M) x @ w.T [+ b]."""
    if x.dtype != np.float32 or w.dtype != np.float32 or x.shape[0] <= LINEAR_ROWS:
        y = x @ w.T
        if b is not None:
            y += b
        return y
    x = np.ascontiguousarray(x)
    y = np.empty((x.shape[0], w.shape[0]), np.float32)
    blocks = _row_blocks(x.shape[0], LINEAR_ROWS)

    def task(i, tid):
        r0, r1 = blocks[i]
        gemm(x[r0:r1], w.T, y[r0:r1])
        if b is not None:
            y[r0:r1] += b
    split(len(blocks), task)
    return y


def linear_backward(dy, x, w, has_bias):
    """(N, M) dy, (N, K) x, (M, K) w -> dx (N, K), dw (M, K), db (M,)."""
    if dy.dtype != np.float32 or x.dtype != np.float32 or w.dtype != np.float32 or x.shape[0] <= LINEAR_ROWS:
        return dy @ w, dy.T @ x, (dy.sum(axis=0) if has_bias else None)
    dy, x = np.ascontiguousarray(dy), np.ascontiguousarray(x)
    R, M = dy.shape
    dx = np.empty(x.shape, np.float32)
    dw = np.empty(w.shape, np.float32)
    rows, cols = _row_blocks(R, LINEAR_ROWS), _row_blocks(M, LINEAR_COLS)

    def task(i, tid):
        if i < len(rows):
            r0, r1 = rows[i]
            gemm(dy[r0:r1], w, dx[r0:r1])
        else:
            m0, m1 = cols[i - len(rows)]
            gemm(dy[:, m0:m1].T, x, dw[m0:m1])
    split(len(rows) + len(cols), task)
    return dx, dw, (dy.sum(axis=0) if has_bias else None)


def softmax_cross_entropy(logits, labels, ignore_index=None):
    """Mean cross-entropy and its gradient w.r.t. the logits, PyTorch's F.cross_entropy (reduction 'mean'):
    logits (N, K) with labels (N,), or a dense prediction (N, K, d1, ...) with labels (N, d1, ...), the
    classes on axis 1. Entries labelled ignore_index count for nothing: the mean is over the others (at least
    one: trainer.check_labels), their gradient is 0."""
    z = np.moveaxis(logits, 1, -1)                  # (N, d1, ..., K)
    moved = z.shape
    z = z.reshape(-1, moved[-1]).astype(np.float64)  # (entries, K)
    lab = np.asarray(labels, dtype=np.int64).reshape(-1)
    keep = np.flatnonzero(lab != ignore_index) if ignore_index is not None else np.arange(lab.size)
    z = z - z.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=1, keepdims=True))
    logp = z - lse
    loss = -logp[keep, lab[keep]].sum() / keep.size
    grad = np.exp(logp)
    grad[keep, lab[keep]] -= 1.0
    if keep.size < lab.size:
        grad[lab == ignore_index] = 0.0
    grad /= keep.size
    return float(loss), np.moveaxis(grad.reshape(moved), -1, 1).astype(logits.dtype)
