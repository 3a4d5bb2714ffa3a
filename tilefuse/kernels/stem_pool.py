"""The stem conv and the max pool after it in one task loop (ResNet's 7x7/2 conv -> 3x3/2 max pool).

Run one after the other, the pool read the stem's whole output back (112 x 112 x 64 floats, 3.2 MB an
image: from L3 or DRAM, the stem having written it band by band) and took ~160-220 us of ResNet50's 2-thread
batch-1 run where the same pool on a map in cache takes ~100. Here each stem task (kernels/conv/stem.py: an
image, a band of output rows [r0, r1), the plan's) computes its rows a few at a time (`SUB_ROWS`) and, after
each few, pools the output rows whose window rows are all computed by now and all in the band: the rows it
pools are read from L1 / L2, a moment after they were written. The pool rows whose windows straddle two bands
(one or two a band boundary, none where a task is a whole image) run after every band is done, in a second
task loop. The stem's output is written whole as before (a later reader finds it unchanged).

Bits: the stem rows are computed by the same code, in sub-ranges of the band (each output's FMA chain does not
depend on which rows a call covers), and max is exact: the output of the pair is the bits of the stem then the
pool, for every grid and thread count (tests/test_stem_pool.py). The session binds the pairs it finds
(kernels/registry.py `bind_stem_pools`); `registry.STEM_POOL = False` (TILEFUSE_STEM_POOL=0) runs them apart.
"""
from __future__ import annotations

import functools
import os

import numba as nb
import numpy as np
from numba import njit

from .conv import stem
from .conv._nb import atomic_add
from .pool import _pool_rows
from .threads import numba_region, scratch

SUB_ROWS = 4      # stem rows a task computes before it pools what they complete (4 x 112 x 64 floats: 115 KB)
# the stem rows into a per-thread ring instead of the stem's output when only the pool reads it (run's
# stem_output=False); TILEFUSE_STEM_RING=0 or False: into the output as before (the same bits)
RING = os.environ.get("TILEFUSE_STEM_RING", "1").strip() != "0"


def ring_rows(k: int, d: int) -> int:
    """The ring's rows: a sub-block's and the rows of a pool window before it (k, d: the pool's along H)."""
    return SUB_ROWS + (k - 1) * d


@njit(nogil=True, cache=True)
def _window(i, s, pt, k, d, h):
    """The input rows [lo, hi] (clamped to the map's [0, h - 1]) of pool output row i."""
    lo = i * s - pt
    return max(lo, 0), min(lo + (k - 1) * d, h - 1)


@njit(nogil=True, cache=True)
def _interior(r0, r1, s, pt, k, d, h, ho):
    """The pool rows [ia, ib) whose window rows all lie in [r0, r1) (windows are monotone in i)."""
    ia = 0
    while ia < ho and _window(ia, s, pt, k, d, h)[0] < r0:
        ia += 1
    ib = ia
    while ib < ho and _window(ib, s, pt, k, d, h)[1] <= r1 - 1:
        ib += 1
    return ia, ib


@njit(nogil=True, cache=True)
def _stem_into_ring(ring4, cap, n, b3, x0, wb, s0, s1, Wo, sh, sw, dh, dw, bias, res, has_res, code, alpha, beta):
    """Stem rows [s0, s1) of image n into the ring ring4 (1, Ob, cap*Wo, 16): row i in slot i % cap, in pieces that
    do not wrap. `_stem_rows` takes a piece's rows as rows [a, b) of a map whose row 0 is stem row delta = a - a % cap
    (its input rows shifted by delta * sh): the same code, each output's FMA chain unchanged."""
    a = s0
    while a < s1:
        sa = a % cap
        b = min(s1, a + cap - sa)
        delta = a - sa
        stem._stem_rows(ring4, 0, b3, x0 - delta * sh, wb, sa, sa + (b - a), Wo, sh, sw, dh, dw, bias, res, has_res,
                        code, alpha, beta)
        a = b


@njit(nogil=True, cache=True)
def _task(out, x, band, wb, bias, res, has_res, code, alpha, beta, n, r0, r1, pt, pl, Wp, Wo, sh, sw, dh, dw,
          y, pk, ps, pp, pd, ring, cap):
    """One stem task (image n, stem rows [r0, r1)) with the pool rows interior to it. out (N, Ob, Ho*Wo, 16);
    y (N, Ob, Hp, Wq, 16); pk, ps, pp, pd: the pool's (kh, kw), stride, (top, left) padding, dilation.
    cap == 0: the stem rows go to `out`, the pool reads them there. cap > 0: they go to this thread's ring of
    cap rows (`ring`, 1-D scratch), the pool reads them there, and only the rows that pool rows outside the
    band read (`_edge_seq`'s) are copied to `out`."""
    C = x.shape[1]
    Ob, Ho = out.shape[1], out.shape[2] // Wo
    out5 = out.reshape(out.shape[0], Ob, Ho, Wo, 16)            # (N, Ob, Ho*Wo, 16) -> (N, Ob, Ho, Wo, 16)
    x0 = r0 * sh
    nr = (r1 - 1 - r0) * sh + (wb.shape[2] - 1) * dh + 1
    b3 = band[:C * nr * Wp].reshape(C, nr, Wp)
    stem._pad_rows(b3, x, n, x0 - pt, pl)
    Hp = y.shape[2]
    ia, ib = _interior(r0, r1, ps[0], pp[0], pk[0], pd[0], Ho, Hp)
    ring4 = ring[:Ob * cap * Wo * 16].reshape(1, Ob, cap * Wo, 16)
    ring5 = ring4.reshape(1, Ob, cap, Wo, 16)                   # (1, Ob, cap*Wo, 16) -> (1, Ob, cap, Wo, 16)
    y1 = y[n:n + 1]
    # the band's rows that pool rows outside [ia, ib) read: [r0, elo) and [ehi, r1) (windows are monotone)
    elo = min(r1, _window(ia - 1, ps[0], pp[0], pk[0], pd[0], Ho)[1] + 1) if ia > 0 else r0
    ehi = max(r0, _window(ib, ps[0], pp[0], pk[0], pd[0], Ho)[0]) if ib < Hp else r1
    done = ia
    for s0 in range(r0, r1, SUB_ROWS):
        s1 = min(r1, s0 + SUB_ROWS)
        if cap == 0:
            stem._stem_rows(out, n, b3, x0, wb, s0, s1, Wo, sh, sw, dh, dw, bias, res, has_res, code, alpha, beta)
        else:
            _stem_into_ring(ring4, cap, n, b3, x0, wb, s0, s1, Wo, sh, sw, dh, dw, bias, res, has_res, code, alpha,
                            beta)
            for i in range(s0, s1):
                if i < elo or i >= ehi:
                    for ob in range(Ob):
                        out5[n, ob, i] = ring5[0, ob, i % cap]
        e = done
        while e < ib and _window(e, ps[0], pp[0], pk[0], pd[0], Ho)[1] <= s1 - 1:
            e += 1
        if e > done:
            if cap == 0:
                _pool_rows(y, out5, Ho, 0, Ho, Wo, pk[0], pk[1], ps[0], ps[1], pd[0], pd[1], pp[0], pp[1], n, 0, Ob,
                           done, e)
            else:
                _pool_rows(y1, ring5, cap, 0, Ho, Wo, pk[0], pk[1], ps[0], ps[1], pd[0], pd[1], pp[0], pp[1], 0, 0,
                           Ob, done, e)
            done = e


@njit(nogil=True, cache=True)
def _seq(counter, tid, tasks, out, x, band, wb, bias, res, has_res, code, alpha, beta, pt, pl, Wp, Wo, sh, sw, dh, dw,
         y, pk, ps, pp, pd, ring, cap):
    """One worker of the stem tasks (threads.numba_region)."""
    while True:
        i = atomic_add(counter, 0, 1)
        if i >= tasks.shape[0]:
            break
        _task(out, x, band[tid], wb, bias, res, has_res, code, alpha, beta, tasks[i, 0], tasks[i, 1], tasks[i, 2],
              pt, pl, Wp, Wo, sh, sw, dh, dw, y, pk, ps, pp, pd, ring[tid], cap)


@njit(parallel=True, nogil=True, cache=True)
def _par(nt, tasks, out, x, band, wb, bias, res, has_res, code, alpha, beta, pt, pl, Wp, Wo, sh, sw, dh, dw, y, pk, ps,
         pp, pd, ring, cap):
    counter = np.zeros(1, np.int64)
    for _w in nb.prange(nt):
        _seq(counter, nb.get_thread_id(), tasks, out, x, band, wb, bias, res, has_res, code, alpha, beta, pt, pl, Wp,
             Wo, sh, sw, dh, dw, y, pk, ps, pp, pd, ring, cap)


@njit(nogil=True, cache=True)
def _edge_seq(counter, tid, rows, out5, y, pk, ps, pp, pd):
    """One worker of the straddling pool rows: task i = (image, pool row) rows[i]."""
    Ho, Wo, Ob = out5.shape[2], out5.shape[3], out5.shape[1]
    while True:
        i = atomic_add(counter, 0, 1)
        if i >= rows.shape[0]:
            break
        _pool_rows(y, out5, Ho, 0, Ho, Wo, pk[0], pk[1], ps[0], ps[1], pd[0], pd[1], pp[0], pp[1], rows[i, 0], 0,
                   Ob, rows[i, 1], rows[i, 1] + 1)


@njit(parallel=True, nogil=True, cache=True)
def _edge_par(nt, rows, out5, y, pk, ps, pp, pd):
    counter = np.zeros(1, np.int64)
    for _w in nb.prange(nt):
        _edge_seq(counter, nb.get_thread_id(), rows, out5, y, pk, ps, pp, pd)


@functools.lru_cache(maxsize=256)
def edge_rows(n: int, ho: int, rows: int, hp: int, s: int, pt: int, k: int, d: int) -> np.ndarray:
    """(E, 2) int64 (image, pool row): the pool rows that no stem task (bands of `rows` of the ho stem rows,
    stem.task_table) pools, those whose window rows straddle two bands; the same rows of each of the n images."""
    covered = set()
    for r0 in range(0, ho, rows):
        ia, ib = _interior(r0, min(r0 + rows, ho), s, pt, k, d, ho, hp)
        covered.update(range(ia, ib))
    e = np.array([(i, j) for i in range(n) for j in range(hp) if j not in covered], np.int64).reshape(-1, 2)
    e.flags.writeable = False
    return e


def run(out_b, x, prepared, pool_out, residual_b=None, *, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
        relu=False, act=None, pool_kernel, pool_stride, pool_padding=(0, 0, 0, 0), pool_dilation=(1, 1),
        threads=None, plan=None, stem_output=True) -> None:
    """stem.run_to_nchwc(out_b, x, prepared, residual_b, ...) and then pool.max_pool(pool_out, out_b, ...) (NCHW16c,
    the pool's output shape from the IR: ceil_mode is in it), computed together (module docstring).
    stem_output=False: nothing reads the stem's output but the pool (the session's binder knows): the stem rows go
    to a per-thread ring of `ring_rows` rows, and out_b gets only the rows of band edges (RING)."""
    n, ob = out_b.shape[:2]
    if pool_out.ndim != 5 or pool_out.shape[:2] != (n, ob) or pool_out.shape[4] != 16:
        raise ValueError(f"stem_pool: pool output {pool_out.shape}; expected (N, Ob, Hp, Wp, 16) with N={n}, Ob={ob}")
    threads, tasks, args, rows = stem.loop_args(out_b, x, prepared, residual_b, stride, padding, dilation, relu, act,
                                                threads, plan, "stem_pool")
    pk = np.array(pool_kernel, np.int64)
    ps = np.array(pool_stride, np.int64)
    pp = np.array((pool_padding[0], pool_padding[2]), np.int64)
    pd = np.array(pool_dilation, np.int64)
    cap = ring_rows(int(pk[0]), int(pd[0])) if RING and not stem_output and residual_b is None else 0
    wo = out_b.shape[3]
    band = args[2]
    ring = scratch("stem_ring", (band.shape[0], ob * cap * wo * 16)) if cap else np.empty((band.shape[0], 0),
                                                                                         np.float32)
    numba_region(_par, _seq, threads, len(tasks), tasks, *args, pool_out, pk, ps, pp, pd, ring, cap)
    edges = edge_rows(n, out_b.shape[2], rows, pool_out.shape[2], int(ps[0]), int(pp[0]), int(pk[0]), int(pd[0]))
    if len(edges):
        numba_region(_edge_par, _edge_seq, threads, len(edges), edges, out_b, pool_out, pk, ps, pp, pd)
