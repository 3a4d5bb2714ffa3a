"""The squeeze-excitation scale in one kernel (issue 9): mean, two tiny FCs, activations.

    s[n] = gate(w2 @ act(w1 @ mean_hw(x[n]) + b1) + b2)        x (N, C, H, W) -> s (N, C, 1, 1)

w1 (R, C, 1, 1), w2 (C, R, 1, 1): the 1x1 convs of MobileNetV3 / EfficientNet / RegNetY's SE
block on a (N, C, 1, 1) tensor. Unfused, that is five instructions (global average pool, conv,
conv, and at batch 1 layout conversions around the convs), each a few thousand FLOPs after
the mean: the dispatch costs more than the work. Here: the means, then per image both FCs as dot
products over contiguous weight rows and the activations (kernels/activations.py `apply_scalar`),
in numba. The scale stays NCHW: the next 1x1 conv takes it as its input scale (kernels/se_conv.py).

The means of an NCHW16c input are sums of row sums: each row's 16-lane sum over its positions
(`conv/_nb.row_sum16`), the rows added in order in float64, times 1/(H*W). Where a depthwise conv produces x,
a session has that conv write the row sums in its epilogue while each row is in L1
(`depthwise.run_nchwc(row_sums=)`, bound by kernels/registry.py `bind_se_sums`), and the
squeeze-excitation starts from them (`row_sums=`) instead of reading x again: the same order, so
the same bits as computing them here. NCHW inputs use kernels/pool.py `channel_means`.

Tolerance against the reference (kernels/reference.py `squeeze_excitation`: numpy mean, then
ref.conv2d): float32 sums in another order, within 1e-5 relative. Every value of image n is
computed by one task in a fixed order whatever the task split: any thread count gives bitwise
identical results.
"""
from __future__ import annotations

import numba as nb
import numpy as np
from numba import njit

from . import activations as A
from . import reference as ref
from .conv._nb import atomic_add, row_sum16, stack_f32
from .fpflags import FAST
from .pool import mean_blocks_per_task, means_into, next_block_task
from .threads import numba_region, scratch


@njit(nogil=True, cache=True, fastmath=FAST)
def _fc_gate(s, m, w1, b1, w2, b2, i0, i1, c1, a1, e1, c2, a2, e2):
    """s[i] = gate(w2 @ act(w1 @ m[i] + b1) + b2) for images [i0, i1); w1 (R, C), w2 (C, R)."""
    R, C = w1.shape
    h = np.empty(R, np.float32)
    for i in range(i0, i1):
        for r in range(R):
            acc = np.float32(0.0)
            for c in range(C):
                acc += w1[r, c] * m[i, c]
            h[r] = A.apply_scalar(c1, acc + b1[r], a1, e1)
        si = s[i]
        for c in range(C):
            acc = np.float32(0.0)
            for r in range(R):
                acc += w2[c, r] * h[r]
            si[c] = acc + b2[c]
        # the gate over the row as one vectorized loop (per value inside the loop above it was a
        # scalar exp per channel: ~15 us of an EfficientNet 7x7 SE block's ~50)
        A.apply_span(si, 0, C, c2, a2, e2)


IMAGES_PER_TASK = 4   # the FC part per task (fixed: the result never depends on the split)
# FC weights (both layers, bytes) from which the FCs' rows are split over tasks too: at batch 1 the FC part
# was one task, one core streaming MobileNetV3-Large's 0.9-1.8 MB blocks (85-166 us, ~11 GB/s) while the
# others waited; EfficientNet-B0's blocks (<= 442 KB) did not gain from a split (eleventh session)
SPLIT_BYTES = 512 << 10
SPLIT_TASK_BYTES = 128 << 10   # a split task's share of one layer's weights (shape only: the split is fixed)


def fc_chunks(r: int, c: int) -> int:
    """Row chunks per FC layer for weights (R, C) and (C, R): 1 (no split) below SPLIT_BYTES, else enough
    for SPLIT_TASK_BYTES a chunk. A rule on the shape only: the bits never depend on the thread count."""
    nbytes = 4 * r * c
    return 1 if 2 * nbytes < SPLIT_BYTES else -(-nbytes // SPLIT_TASK_BYTES)


@njit(nogil=True, cache=True, fastmath=FAST)
def _fc1_rows(h, m, w1, b1, i0, i1, r0, r1, c1, a1, e1):
    """h[i, r] = act(w1[r] . m[i] + b1[r]) for images [i0, i1), rows [r0, r1): `_fc_gate`'s first layer."""
    C = w1.shape[1]
    for i in range(i0, i1):
        for r in range(r0, r1):
            acc = np.float32(0.0)
            for c in range(C):
                acc += w1[r, c] * m[i, c]
            h[i, r] = A.apply_scalar(c1, acc + b1[r], a1, e1)


@njit(nogil=True, cache=True, fastmath=FAST)
def _fc2_rows(s, h, w2, b2, i0, i1, c0, c1_, c2, a2, e2):
    """s[i, c] = gate(w2[c] . h[i] + b2[c]) for images [i0, i1), channels [c0, c1_): `_fc_gate`'s second."""
    R = w2.shape[1]
    for i in range(i0, i1):
        si = s[i]
        hi = h[i]
        for c in range(c0, c1_):
            acc = np.float32(0.0)
            for r in range(R):
                acc += w2[c, r] * hi[r]
            si[c] = acc + b2[c]
        A.apply_span(si, c0, c1_, c2, a2, e2)


@njit(nogil=True, cache=True)
def _split_seq(counter, tid, phase, s, h, m, w1, b1, w2, b2, k, c1, a1, e1, c2, a2, e2):
    """One worker of a split FC layer (phase 1: the first, into h; 2: the second and the gate, into s):
    task t = (group of IMAGES_PER_TASK images, row chunk of k)."""
    n = s.shape[0]
    rows = w1.shape[0] if phase == 1 else w2.shape[0]
    per = -(-rows // k)
    ng = -(-n // IMAGES_PER_TASK)
    while True:
        t = atomic_add(counter, 0, 1)
        if t >= ng * k:
            break
        g = t // k
        r0 = (t - g * k) * per
        r1 = min(rows, r0 + per)
        i0 = g * IMAGES_PER_TASK
        i1 = min(n, i0 + IMAGES_PER_TASK)
        if r0 >= r1:
            continue
        if phase == 1:
            _fc1_rows(h, m, w1, b1, i0, i1, r0, r1, c1, a1, e1)
        else:
            _fc2_rows(s, h, w2, b2, i0, i1, r0, r1, c2, a2, e2)


@njit(parallel=True, nogil=True, cache=True)
def _split_par(nt, phase, s, h, m, w1, b1, w2, b2, k, c1, a1, e1, c2, a2, e2):
    counter = np.zeros(1, np.int64)
    for _w in nb.prange(nt):
        _split_seq(counter, nb.get_thread_id(), phase, s, h, m, w1, b1, w2, b2, k, c1, a1, e1, c2, a2, e2)


@njit(nogil=True, cache=True)
def _means_from_rows(m, rs, i, inv):
    """m[i, c] = (image i's row sums rs (N, Cb, H, 16) of channel c, added in row order in float64) * inv."""
    C = m.shape[1]
    cb, h = rs.shape[1], rs.shape[2]
    for b in range(cb):
        for l in range(min(16, C - b * 16)):
            acc = np.float64(0.0)
            for r in range(h):
                acc += np.float64(rs[i, b, r, l])
            m[i, b * 16 + l] = acc * inv


@njit(nogil=True, cache=True)
def _rows_means_seq(counter, tid, m, rs, inv):
    """The means of `_fc_rows_seq` (`_means_from_rows`), a task per image, for the split FCs."""
    while True:
        i = atomic_add(counter, 0, 1)
        if i >= m.shape[0]:
            break
        _means_from_rows(m, rs, i, inv)


@njit(parallel=True, nogil=True, cache=True)
def _rows_means_par(nt, m, rs, inv):
    counter = np.zeros(1, np.int64)
    for _w in nb.prange(nt):
        _rows_means_seq(counter, nb.get_thread_id(), m, rs, inv)


def _fc_split(s, m, w1m, b1, w2m, b2, k, threads, c1, a1, e1, c2, a2, e2) -> None:
    """Both FC layers with their rows in k chunks, a task loop each (the first's output in scratch)."""
    n = s.shape[0]
    h = scratch("se_hidden", (n, w1m.shape[0]))
    ng = -(-n // IMAGES_PER_TASK)
    for phase in (1, 2):
        numba_region(_split_par, _split_seq, threads, ng * k, phase, s, h, m, w1m, b1, w2m, b2, k, c1, a1, e1, c2,
                     a2, e2)


@njit(nogil=True, cache=True)
def _fc_seq(counter, tid, s, m, w1, b1, w2, b2, c1, a1, e1, c2, a2, e2):
    """One worker of the FC part (threads.numba_region): groups of IMAGES_PER_TASK images taken from
    counter."""
    n = s.shape[0]
    while True:
        i0 = atomic_add(counter, 0, 1) * IMAGES_PER_TASK
        if i0 >= n:
            break
        _fc_gate(s, m, w1, b1, w2, b2, i0, min(i0 + IMAGES_PER_TASK, n), c1, a1, e1, c2, a2, e2)


@njit(parallel=True, nogil=True, cache=True)
def _fc_par(nt, s, m, w1, b1, w2, b2, c1, a1, e1, c2, a2, e2):
    counter = np.zeros(1, np.int64)
    for _w in nb.prange(nt):
        _fc_seq(counter, nb.get_thread_id(), s, m, w1, b1, w2, b2, c1, a1, e1, c2, a2, e2)


@njit(nogil=True, cache=True)
def _row_means_seq(counter, tid, m, xf, n, cb, h, w, per, inv):
    """One worker (threads.numba_region) of the means of an NCHW16c x (flat xf, (N, Cb, H, W, 16)) into m
    (N, C), over (image, channel blocks) tasks (pool.next_block_task): per block the rows' sums
    (`row_sum16`, float32) added in order from 0 in float64, times inv; the order `_fc_rows_seq` adds given
    row sums in. Float64 over the rows as in pool.means_into: float32 lost up to 1.5e-6 of a 4K mean."""
    C = m.shape[1]
    row = nb.carray(stack_f32(16), 16)
    acc = np.empty(16, np.float64)
    while True:
        i, c0, c1 = next_block_task(counter, n, cb, per)
        if i < 0:
            break
        for b in range(c0, c1):
            for l in range(16):
                acc[l] = 0.0
            for r in range(h):
                row_sum16(xf, ((i * cb + b) * h + r) * w * 16, w, row, 0)
                for l in range(16):
                    acc[l] += np.float64(row[l])
            for l in range(min(16, C - b * 16)):
                m[i, b * 16 + l] = acc[l] * inv


@njit(parallel=True, nogil=True, cache=True)
def _row_means_par(nt, m, xf, n, cb, h, w, per, inv):
    counter = np.zeros(1, np.int64)
    for _w in nb.prange(nt):
        _row_means_seq(counter, nb.get_thread_id(), m, xf, n, cb, h, w, per, inv)


@njit(nogil=True, cache=True)
def _fc_rows_seq(counter, tid, s, m, rs, inv, w1, b1, w2, b2, c1, a1, e1, c2, a2, e2):
    """`_fc_seq` starting from row sums rs (N, Cb, H, 16): m[i, c] = (the rows' sums added in order) * inv."""
    n = s.shape[0]
    while True:
        i0 = atomic_add(counter, 0, 1) * IMAGES_PER_TASK
        if i0 >= n:
            break
        i1 = min(i0 + IMAGES_PER_TASK, n)
        for i in range(i0, i1):
            _means_from_rows(m, rs, i, inv)
        _fc_gate(s, m, w1, b1, w2, b2, i0, i1, c1, a1, e1, c2, a2, e2)


@njit(parallel=True, nogil=True, cache=True)
def _fc_rows_par(nt, s, m, rs, inv, w1, b1, w2, b2, c1, a1, e1, c2, a2, e2):
    counter = np.zeros(1, np.int64)
    for _w in nb.prange(nt):
        _fc_rows_seq(counter, nb.get_thread_id(), s, m, rs, inv, w1, b1, w2, b2, c1, a1, e1, c2, a2, e2)


def squeeze_excitation(out, x, w1, b1, w2, b2, *, act, gate, layout="nchw", threads=None, row_sums=None, **_):
    """out (N, C, 1, 1) NCHW = the SE scale of x (NCHW, or NCHW16c with layout="nchwc").

    row_sums (NCHW16c only): None, or x's row sums (N, Cb, H, 16) as the depthwise conv that wrote x
    left them (`depthwise.run_nchwc(row_sums=)`): then x itself is not read."""
    n, c = out.shape[0], out.shape[1]
    if out.dtype != np.float32 or not x.flags.c_contiguous:
        if layout == "nchwc":
            raise ValueError(f"squeeze_excitation (NCHW16c): float32 contiguous input expected, got {x.dtype}")
        out[...] = ref.squeeze_excitation(x, w1, b1, w2, b2, tuple(act), tuple(gate))
        return
    r = w1.shape[0]
    m = scratch("se_means", (n, c))
    c1, a1, e1 = A.encode(*act)
    c2, a2, e2 = A.encode(*gate)
    a1, e1, a2, e2 = (np.float32(v) for v in (a1, e1, a2, e2))
    w1m, w2m = w1.reshape(r, c), w2.reshape(c, r)          # (R, C, 1, 1) -> (R, C), (C, R, 1, 1) -> (C, R)
    s = out.reshape(n, c)                                    # (N, C, 1, 1) -> (N, C)
    # every step is a numba_region task loop: a bound call can be replayed (threads.replaying)
    k = fc_chunks(r, c)

    def fcs():
        if k > 1:
            _fc_split(s, m, w1m, b1, w2m, b2, k, threads, c1, a1, e1, c2, a2, e2)
        else:
            numba_region(_fc_par, _fc_seq, threads, -(-n // IMAGES_PER_TASK), s, m, w1m, b1, w2m, b2, c1, a1, e1, c2,
                         a2, e2)
    if layout != "nchwc":
        means_into(m, x, layout, threads)
        fcs()
        return
    _, cb, h, w, _ = x.shape
    inv = np.float32(1.0) / np.float32(h * w)
    if row_sums is None:
        per = mean_blocks_per_task(h * w, 16)
        numba_region(_row_means_par, _row_means_seq, threads, n * -(-cb // per), m, x.reshape(-1), n, cb, h, w,
                     int(per), inv)
        fcs()
        return
    if row_sums.shape != (n, cb, h, 16):
        raise ValueError(f"squeeze_excitation (NCHW16c): row sums {row_sums.shape}; expected ({n}, {cb}, {h}, 16)")
    if k > 1:
        numba_region(_rows_means_par, _rows_means_seq, threads, n, m, row_sums, inv)
        fcs()
        return
    numba_region(_fc_rows_par, _fc_rows_seq, threads, -(-n // IMAGES_PER_TASK), s, m, row_sums, inv, w1m, b1, w2m,
                 b2, c1, a1, e1, c2, a2, e2)


KERNELS = {"squeeze_excitation": squeeze_excitation}
THREADED = frozenset({"squeeze_excitation"})
BLOCKED = frozenset({"squeeze_excitation"})
BLOCKED_TO_NCHW = frozenset({"squeeze_excitation"})
ACT_KERNELS = frozenset({"squeeze_excitation"})    # applies its `act` (and `gate`) itself
