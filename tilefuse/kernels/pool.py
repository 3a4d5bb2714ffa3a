"""Fast pooling kernels (max, average, global average) on both layouts the compiler uses, for
whole tensors and row bands (one max-pool loop, `_max_pool_rows`, serves layer-by-layer
inference, the stream mode's rings and bands; the training forms with the argmax its backward
pass needs are at the end).
Numba (`nogil`, `cache=True`) next to the numpy reference (`kernels/reference.py`, the spec;
`tests/test_layer_kernels.py` checks each against it). Element-wise kernels are in
`elementwise.py`, linear and softmax in `dense.py`.

Every spatial kernel works on both layouts through one view:
  NCHW   (N, C, H, W)          viewed as (N, C, H, W, 1)      one channel per "block"
  NCHWc  (N, C/16, H, W, 16)   as is                         16 channels per block, the inner
                                                              loops run over the 16 lanes (a zmm)
so one numba function serves both (L = 1 or 16 lanes). Work is split into (image, channel
block) tasks on the shared thread pool (`kernels/threads.py`); every output element is computed
by the same code whatever the thread count, so results are identical for 1 and 2 threads.

Tolerances against the reference: max pool is exact (no arithmetic); average pools sum in
float32 in window order (the reference sums in float32 too, in numpy's order): <= 1e-6 relative.
"""
from __future__ import annotations

import numba as nb
import numpy as np
from numba import njit, types
from numba.extending import overload

from .cnhw import JIT, _valid, rows_split
from .reference import pool_out_size
from .conv._nb import atomic_add, max16, maxwin16, stack_f32, stack_i64
from .threads import numba_region, parallel_for


def _blocks(x: np.ndarray, layout: str) -> np.ndarray:
    """(N, C, H, W) -> (N, C, H, W, 1) view; NCHWc (N, Cb, H, W, 16) unchanged."""
    if layout == "nchwc":
        if x.ndim != 5:
            raise ValueError(f"NCHWc tensor must be 5-D (N, C/16, H, W, 16), got shape {x.shape}")
        return x
    if x.ndim != 4:
        raise ValueError(f"NCHW tensor must be 4-D, got shape {x.shape}")
    return x[..., None]


def _tasks(x5):
    return [(n, c) for n in range(x5.shape[0]) for c in range(x5.shape[1])]


# pooling ----------------------------------------------------------------------------------------

@njit(nogil=True, cache=True)
def _max_pool_rows(y, x, cap, r0, h, w, kh, kw, sh, sw, dh, dw, pt, pl, n, c0, c1, ra, rb):
    """The one max-pool loop: rows [ra, rb) of y[n, c] (R, Wo, L), c in [c0, c1), where y holds
    output rows [r0, r0 + R) of
    the max pool of an (N, C, h, w, L) tensor whose input row i is held at slot i % cap of
    x (N, C, cap, w, L): a whole tensor (cap = h, r0 = 0), a ring of rows (the stream mode's
    rings, read in place) or a band. Separable: per output row the max of its kh input rows
    into a row buffer (contiguous, w*L values), then the max of kw strided columns of it, so
    kh + kw passes over a row in L1 instead of kh * kw strided ones (2.2x faster than numpy
    taps on a 3x3 stride-2 band). Padding is skipped by bounds (PyTorch: every window holds a
    real row and column), so no padded copy is made. A NaN in a window is the window's max, as in
    PyTorch and the reference (`v if v > t or v != v else t`)."""
    Wo, L = y.shape[3], y.shape[4]
    t = np.empty((w, L), x.dtype)
    m = np.empty(L, x.dtype)
    u = np.empty(Wo * 16 if L == 16 else 0, x.dtype)
    for c in range(c0, c1):
        for r in range(ra, rb):
            base = (r0 + r) * sh - pt
            for j in range(w):
                for l in range(L):
                    t[j, l] = -np.inf
            for a in range(kh):
                i = base + a * dh
                if i < 0 or i >= h:
                    continue
                src = x[n, c, i % cap]                       # (w, L): one input row
                for j in range(w):
                    for l in range(L):
                        v = src[j, l]
                        t[j, l] = v if v > t[j, l] or v != v else t[j, l]
            yr = y[n, c, r]                                  # (Wo, L): one output row
            if L == 16:
                # the kw columns of t per output position as 16-lane vectors (max16: the same
                # selects as the loop below), into u (Wo*16), then copied to the row
                for k in range(Wo * 16):
                    u[k] = -np.inf
                for j in range(Wo):
                    q0 = j * sw - pl
                    for b in range(kw):
                        q = q0 + b * dw
                        if q >= 0 and q < w:
                            max16(u, j * 16, t, q * 16)
                for j in range(Wo):
                    for l in range(16):
                        yr[j, l] = u[j * 16 + l]
                continue
            for j in range(Wo):
                q0 = j * sw - pl
                for l in range(L):
                    m[l] = -np.inf
                for b in range(kw):
                    q = q0 + b * dw
                    if q >= 0 and q < w:
                        for l in range(L):
                            v = t[q, l]
                            m[l] = v if v > m[l] or v != v else m[l]
                for l in range(L):
                    yr[j, l] = m[l]


@njit(nogil=True, cache=True)
def _max_pool_rows16(y, x, cap, r0, h, w, kh, kw, sh, sw, dh, dw, pt, pl, n, c0, c1, ra, rb):
    """`_max_pool_rows` for C-contiguous NCHW16c x and y (L = 16): per output vector its window's
    valid rows and columns in one `maxwin16` (the row maxima per column, then their max, in the
    separable loop's order: the same bits) with the vectors in registers. numba left the 16-lane
    loops scalar (9x slower than ONNX Runtime's pool on the ResNet stem); the separable form on
    `max16` vectors (a row buffer, then three dependent load-select-store rounds per output vector)
    ran the ResNet stem pool 329 us on one core where this runs ~4x faster (benchmarks/RESULTS.md,
    twenty-fourth session)."""
    C, Cy, R, Wo = x.shape[1], y.shape[1], y.shape[2], y.shape[3]
    yf = y.reshape(y.size)
    xf = x.reshape(x.size)
    # per output column its first valid column's offset and their count; the window's valid rows'
    # offsets (on the stack: a heap array per task call costs ~100 ns)
    K = max(kh, 16)
    if K + 2 * Wo <= 1024:
        rows = nb.carray(stack_i64(1024), 1024)
    else:
        rows = np.empty(K + 2 * Wo, np.int64)
    cofs = rows[K:K + Wo]
    ncol = rows[K + Wo:K + 2 * Wo]
    for j in range(Wo):
        q0 = j * sw - pl
        b0 = 0
        while b0 < kw and q0 + b0 * dw < 0:
            b0 += 1
        b1 = kw
        while b1 > b0 and q0 + (b1 - 1) * dw >= w:
            b1 -= 1
        cofs[j] = (q0 + b0 * dw) * 16
        ncol[j] = b1 - b0
    for c in range(c0, c1):
        for r in range(ra, rb):
            base = (r0 + r) * sh - pt
            nr = 0
            for a in range(kh):
                i = base + a * dh
                if i >= 0 and i < h:
                    rows[nr] = ((n * C + c) * cap + i % cap) * w * 16      # x[n, c, i % cap, 0, 0], flat
                    nr += 1
            yo = ((n * Cy + c) * R + r) * Wo * 16                          # y[n, c, r, 0, 0], flat
            for j in range(Wo):
                maxwin16(yf, yo + j * 16, xf, rows, nr, cofs[j], dw * 16, ncol[j])


def _pool_rows(y, x, cap, r0, h, w, kh, kw, sh, sw, dh, dw, pt, pl, n, c0, c1, ra, rb):
    """The max-pool row loop for these array types (resolved when numba compiles the caller)."""
    raise NotImplementedError("njit only")


@overload(_pool_rows, inline="always")
def _pool_rows_impl(y, x, cap, r0, h, w, kh, kw, sh, sw, dh, dw, pt, pl, n, c0, c1, ra, rb):
    """C-contiguous float arrays of one dtype: `_max_pool_rows16` when the blocks are 16 lanes; any
    other layout (ring and band views) `_max_pool_rows`, the only one that compiles for them."""
    if (isinstance(y, types.Array) and isinstance(x, types.Array) and y.layout == "C" and x.layout == "C"
            and x.dtype == y.dtype and x.dtype in (types.float32, types.float64)):
        def vec(y, x, cap, r0, h, w, kh, kw, sh, sw, dh, dw, pt, pl, n, c0, c1, ra, rb):
            if y.shape[4] == 16:
                _max_pool_rows16(y, x, cap, r0, h, w, kh, kw, sh, sw, dh, dw, pt, pl, n, c0, c1, ra, rb)
            else:
                _max_pool_rows(y, x, cap, r0, h, w, kh, kw, sh, sw, dh, dw, pt, pl, n, c0, c1, ra, rb)
        return vec

    def general(y, x, cap, r0, h, w, kh, kw, sh, sw, dh, dw, pt, pl, n, c0, c1, ra, rb):
        _max_pool_rows(y, x, cap, r0, h, w, kh, kw, sh, sw, dh, dw, pt, pl, n, c0, c1, ra, rb)
    return general


MAX_POOL_TASK = 4096        # output values per task at least (rows of one (image, channel) plane)


@njit(nogil=True, cache=True)
def _max_pool_seq(counter, tid, y, x, cap, r0, h, w, kh, kw, sh, sw, dh, dw, pt, pl, rows):
    """One worker (threads.numba_region): tasks i = ((n * C) + c) * chunks + k from `counter`,
    output rows [k * rows, (k + 1) * rows) of plane (n, c) (`_pool_rows`: the max16 loop on
    C-contiguous NCHW16c tensors, the general one otherwise)."""
    C, R = y.shape[1], y.shape[2]
    chunks = (R + rows - 1) // rows
    total = y.shape[0] * C * chunks
    while True:
        i = atomic_add(counter, 0, 1)
        if i >= total:
            break
        k = i % chunks
        c = (i // chunks) % C
        n = i // (chunks * C)
        _pool_rows(y, x, cap, r0, h, w, kh, kw, sh, sw, dh, dw, pt, pl, n, c, c + 1, k * rows,
                   min(R, (k + 1) * rows))


@njit(parallel=True, nogil=True, cache=True)
def _max_pool_par(nt, y, x, cap, r0, h, w, kh, kw, sh, sw, dh, dw, pt, pl, rows):
    counter = np.zeros(1, np.int64)
    for _w in nb.prange(nt):
        _max_pool_seq(counter, nb.get_thread_id(), y, x, cap, r0, h, w, kh, kw, sh, sw, dh, dw, pt, pl, rows)


def max_pool_rows(y, x, cap: int, r0: int, h: int, *, kernel_size, stride, padding, dilation, threads=None):
    """Output rows [r0, r0 + R) into y (N, C, R, Wo, L) from x (N, C, cap, w, L) holding input
    row i in slot i % cap (see `_max_pool_rows`); NCHW callers pass `a[..., None]` views.
    Tasks are row chunks of (image, channel) planes, at least MAX_POOL_TASK outputs each (from the
    shape only), on a numba parallel region (a Python-pool region cost ~0.4 ms at 16 threads,
    and (image, channel block) tasks gave a batch-1 NCHW16c stem pool only 4); max is exact,
    so the result does not depend on the split or the thread count."""
    kh, kw = kernel_size
    N, C, R, Wo, L = y.shape
    rows = max(1, min(R, -(-MAX_POOL_TASK // max(Wo * L, 1))))
    ntasks = N * C * (-(-R // rows)) if R else 0
    if ntasks == 0:
        return
    numba_region(_max_pool_par, _max_pool_seq, threads, ntasks, y, x, int(cap), int(r0), int(h), int(x.shape[3]),
                 int(kh), int(kw), int(stride[0]), int(stride[1]), int(dilation[0]), int(dilation[1]),
                 int(padding[0]), int(padding[2]), int(rows))


@njit(nogil=True, cache=True)
def _avg_pool_plane(out, x, n, c, kh, kw, sh, sw, pt, pb, pl, pr, include_pad):
    """out[n, c] = window sum / divisor; the divisor counts the padded area when include_pad
    (not the ceil-mode overhang beyond it), else only the positions inside the image."""
    H, W, L = x.shape[2], x.shape[3], x.shape[4]
    Ho, Wo = out.shape[2], out.shape[3]
    acc = np.empty(L, np.float32)
    for oh in range(Ho):
        h0 = oh * sh - pt
        for ow in range(Wo):
            w0 = ow * sw - pl
            if include_pad:
                ch = min(h0 + kh, H + pb) - max(h0, -pt)
                cw = min(w0 + kw, W + pr) - max(w0, -pl)
            else:
                ch = min(h0 + kh, H) - max(h0, 0)
                cw = min(w0 + kw, W) - max(w0, 0)
            inv = np.float32(1.0) / np.float32(ch * cw)
            for l in range(L):
                acc[l] = 0.0
            for i in range(kh):
                h = h0 + i
                if h < 0 or h >= H:
                    continue
                for j in range(kw):
                    w = w0 + j
                    if w < 0 or w >= W:
                        continue
                    for l in range(L):
                        acc[l] += x[n, c, h, w, l]
            for l in range(L):
                out[n, c, oh, ow, l] = acc[l] * inv


def max_pool(out, x, *, kernel_size, stride, padding=(0, 0, 0, 0), dilation=(1, 1), ceil_mode=False,
             layout="nchw", threads=None, **_):
    """Max pooling of a whole tensor into `out` (shape from the IR: ceil_mode is already in it)."""
    x5, o5 = _blocks(x, layout), _blocks(out, layout)
    max_pool_rows(o5, x5, x5.shape[2], 0, x5.shape[2], kernel_size=kernel_size, stride=stride, padding=padding,
                  dilation=dilation, threads=threads)


def avg_pool(out, x, *, kernel_size, stride, padding=(0, 0, 0, 0), ceil_mode=False, count_include_pad=True,
             layout="nchw", threads=None, **_):
    x5, o5 = _blocks(x, layout), _blocks(out, layout)
    kh, kw = kernel_size
    t, b, l, r = padding
    parallel_for(lambda tk: _avg_pool_plane(o5, x5, tk[0], tk[1], kh, kw, stride[0], stride[1], t, b, l, r,
                                            count_include_pad), _tasks(x5), threads)


# positions summed in float32 before their sum goes into a float64 total (channel_means); chunks of 1024 made
# the 16-lane means 1.3-1.6x slower (1280 x 7x7, 96 x 112x112 on the Zen 4 VM), 16384 keep their speed
MEAN_CHUNK = 16384


@njit(nogil=True, cache=True)
def channel_means(m, x, n, c0, c1):
    """m[n, c] = mean over positions of x[n, c] for the channel blocks [c0, c1) of image n.

    x (N, Cb, P, L): NCHW16c viewed as (N, Cb, H*W, 16), or NCHW as (N, C, H*W, 1) (blocks of one
    channel); m (N, C) NCHW (the padded channels of the last block dropped). Each block is read
    once, its L lanes summed as one vector in position order (the order is fixed, so the result
    does not depend on the task split). No fastmath: with reassociation allowed LLVM vectorized the
    position sum instead, gathering every 16th value (vinsertps chains: 271 us for 96 channels at
    112x112 on one Zen 3 core)."""
    P, L = x.shape[2], x.shape[3]
    C = m.shape[1]
    inv = 1.0 / P
    if L == 16:   # NCHW16c: a constant lane count, so the sums stay in registers over the positions
        # (a run-time count kept them in memory: a store-to-load chain per position). Four partial sums,
        # positions p = 4i + k into a_k, then (a0 + a1) + (a2 + a3): four chains in flight. Each MEAN_CHUNK
        # positions the partials go into a float64 total, so a large map's mean keeps float32's precision (a
        # 3 x 9.4M-position map: one float32 chain per lane was 0.55% off, ONNX Runtime 0.034%)
        a0 = nb.carray(stack_f32(16), 16)
        a1 = nb.carray(stack_f32(16), 16)
        a2 = nb.carray(stack_f32(16), 16)
        a3 = nb.carray(stack_f32(16), 16)
        t = np.empty(16, np.float64)
        for cb in range(c0, c1):
            for l in range(16):
                t[l] = 0.0
            for q0 in range(0, P, MEAN_CHUNK):
                q1 = min(q0 + MEAN_CHUNK, P)
                q4 = q0 + (q1 - q0) // 4 * 4
                for l in range(16):
                    a0[l] = 0.0
                    a1[l] = 0.0
                    a2[l] = 0.0
                    a3[l] = 0.0
                for p in range(q0, q4, 4):
                    for l in range(16):
                        a0[l] += x[n, cb, p, l]
                        a1[l] += x[n, cb, p + 1, l]
                        a2[l] += x[n, cb, p + 2, l]
                        a3[l] += x[n, cb, p + 3, l]
                for p in range(q4, q1):
                    for l in range(16):
                        a0[l] += x[n, cb, p, l]
                for l in range(16):
                    t[l] += (a0[l] + a1[l]) + (a2[l] + a3[l])
            for l in range(min(16, C - cb * 16)):
                m[n, cb * 16 + l] = t[l] * inv
        return
    acc = np.zeros(L, np.float32)
    t = np.zeros(L, np.float64)
    for cb in range(c0, c1):
        for l in range(L):
            t[l] = 0.0
        for q0 in range(0, P, MEAN_CHUNK):
            for l in range(L):
                acc[l] = 0.0
            for p in range(q0, min(q0 + MEAN_CHUNK, P)):
                for l in range(L):
                    acc[l] += x[n, cb, p, l]
            for l in range(L):
                t[l] += acc[l]
        for l in range(min(L, C - cb * L)):
            m[n, cb * L + l] = t[l] * inv


def mean_blocks_per_task(positions: int, lanes: int) -> int:
    """Channel blocks per (image, blocks) task: about 64K values (from the shape only)."""
    return max(1, (64 << 10) // max(positions * lanes, 1))


def mean_tasks(n: int, blocks: int, positions: int, lanes: int) -> list[tuple[int, int, int]]:
    """(image, first block, end block) tasks of about 64K values each (from the shape only)."""
    per = mean_blocks_per_task(positions, lanes)
    return [(i, c, min(c + per, blocks)) for i in range(n) for c in range(0, blocks, per)]


@njit(nogil=True, cache=True)
def next_block_task(counter, n, blocks, per):
    """The next (image, first block, end block) task of `mean_tasks`' table, taken from `counter`
    (atomically: threads.numba_region's workers): task i = image i // chunks, channel blocks
    [(i % chunks) * per, + per). (-1, 0, 0) when none is left. Shared by the workers that run over
    (image, channel blocks) tasks: the means here, se_conv's input-scaling pass."""
    chunks = (blocks + per - 1) // per
    i = atomic_add(counter, 0, 1)
    if i >= n * chunks:
        return -1, 0, 0
    c0 = (i % chunks) * per
    return i // chunks, c0, min(c0 + per, blocks)


@njit(nogil=True, cache=True)
def _means_seq(counter, tid, m, x, per):
    """One worker (threads.numba_region) over `mean_tasks`' tasks (`next_block_task`)."""
    while True:
        n, c0, c1 = next_block_task(counter, x.shape[0], x.shape[1], per)
        if n < 0:
            break
        channel_means(m, x, n, c0, c1)


@njit(parallel=True, nogil=True, cache=True)
def _means_par(nt, m, x, per):
    counter = np.zeros(1, np.int64)
    for _w in nb.prange(nt):
        _means_seq(counter, nb.get_thread_id(), m, x, per)


def means_into(m, x, layout, threads=None) -> None:
    """m (N, C) = the mean over H, W of x: NCHW (N, C, H, W) or NCHW16c (N, Cb, H, W, 16), float32.
    Threads over (image, channel blocks) tasks (`mean_tasks`), so the batch-1 layers of a network
    split too, on a numba parallel region."""
    if layout == "nchwc":
        n, cb, h, w, lanes = x.shape
    else:
        n, cb, h, w = x.shape
        lanes = 1
    x4 = x.reshape(n, cb, h * w, lanes)       # (N, Cb, H, W, L) -> (N, Cb, H*W, L), no copy
    per = mean_blocks_per_task(h * w, lanes)
    ntasks = n * -(-cb // per)
    if ntasks:
        numba_region(_means_par, _means_seq, threads, ntasks, m, x4, int(per))


def global_avg_pool(out, x, *, layout="nchw", threads=None, **_):
    """(N, C, H, W) or NCHWc -> (N, C, 1, 1) NCHW (the layout pass keeps the output NCHW)."""
    if out.dtype != np.float32 or not x.flags.c_contiguous:
        out[...] = x.mean(axis=(2, 3), keepdims=True, dtype=np.float64 if x.dtype == np.float64 else np.float32)
        return
    means_into(out.reshape(out.shape[0], out.shape[1]), x, layout, threads)    # (N, C, 1, 1) -> (N, C)


# training forms: CNHW planes (kernels/cnhw.py), split over the step's threads -----------------------

@nb.njit(inline="always", **JIT)
def _max_row_full(xr, rvr, rir, oa, ob, kw, dw, pl, SW):
    """The row pass over the output columns [oa, ob) whose kw taps are all inside the row, tap by
    tap (loops over the columns: vectors; SW a literal at each call, so the loads have a constant
    stride; views indexed from 0, so no negative-index code). Per column the taps come in kj order
    with the same rule as the scalar loop."""
    n = ob - oa
    if n <= 0:
        return
    rs = rvr[oa:ob]
    ri = rir[oa:ob]
    if SW == 2 and kw == 3 and dw == 1:     # ResNet's 3x3 / 2: the three taps in one loop
        x0 = xr[oa * 2 - pl:]
        j0 = oa * 2 - pl
        for k in range(n):
            a0 = x0[2 * k]
            a1 = x0[2 * k + 1]
            a2 = x0[2 * k + 2]
            t = (a1 > a0) | (a1 != a1)
            b = a1 if t else a0
            bi = j0 + 2 * k + 1 if t else j0 + 2 * k
            t = (a2 > b) | (a2 != a2)
            rs[k] = a2 if t else b
            ri[k] = j0 + 2 * k + 2 if t else bi
        return
    x0 = xr[oa * SW - pl:]
    for k in range(n):
        rs[k] = x0[k * SW]
        ri[k] = (oa + k) * SW - pl
    for kj in range(1, kw):
        off = kj * dw
        xk = xr[oa * SW - pl + off:]
        for k in range(n):
            v = xk[k * SW]
            b = rs[k]
            t = (v > b) | (v != v)
            rs[k] = v if t else b
            ri[k] = (oa + k) * SW - pl + off if t else ri[k]


@nb.njit(**JIT)
def _max_pool_argmax(x, y, idx, kh, kw, sh, sw, pt, pl, dh, dw):
    """Max pool of planes x (P, H, W) -> y, with the flat index of each maximum in idx (what
    the backward pass scatters to), in two separable passes (per input row: max over the kw
    taps of each output column; then per output row: max over the kh row results), kh + kw
    instead of kh*kw compares per output. Same selection rule as PyTorch's loop over (ki, kj): a strictly
    greater value or a NaN replaces the current best, so the first maximum (or the last NaN) in
    (ki, kj) order wins: the row pass keeps the first maximum of its row, and the column pass,
    scanning rows in ki order with the same rule, keeps the first row holding the maximum.

    Both passes loop over the output columns innermost (vectors): the row pass over the columns
    whose taps are all inside the row (`_max_row_full`, stride 1 and 2 with a constant stride),
    the border columns one at a time; the column pass row by row in ki order. ResNet's 3x3 / 2
    pool on (64, 32, 56, 56), one Ice Lake core: 15 cycles an input value one column at a time
    with the taps innermost, 4.9 in this form (benchmarks/RESULTS.md)."""
    P, H, W = x.shape
    _, ho, wo = y.shape
    rv = np.empty((H, wo), x.dtype)
    ri = np.empty((H, wo), np.int32)
    lo_j = np.empty(wo, np.int64)
    hi_j = np.empty(wo, np.int64)
    oa = wo                                  # [oa, ob): the columns with all kw taps inside
    ob = wo
    for ow in range(wo):
        lo_j[ow], hi_j[ow] = _valid(ow * sw - pl, dw, W, kw)
        if lo_j[ow] == 0 and hi_j[ow] == kw:
            if oa == wo:
                oa = ow
            ob = ow + 1
    for ow in range(oa, ob):                 # contiguous (the window start grows with ow)
        if lo_j[ow] != 0 or hi_j[ow] != kw:
            oa = ob = wo
    yb = np.empty(wo, x.dtype)
    ib = np.empty(wo, np.int32)
    for p in range(P):
        for ih in range(H):
            xr = x[p, ih]
            rvr = rv[ih]
            rir = ri[ih]
            if sw == 2:
                _max_row_full(xr, rvr, rir, oa, ob, kw, dw, pl, 2)
            elif sw == 1:
                _max_row_full(xr, rvr, rir, oa, ob, kw, dw, pl, 1)
            else:
                _max_row_full(xr, rvr, rir, oa, ob, kw, dw, pl, sw)
            for q in range(wo - (ob - oa)):  # the border columns, one at a time
                ow = q if q < oa else q + ob - oa
                j0 = ow * sw - pl
                kj0 = lo_j[ow]
                kj1 = hi_j[ow]
                if kj0 >= kj1:
                    rvr[ow] = -np.inf
                    rir[ow] = -1
                    continue
                iw = j0 + kj0 * dw
                best = xr[iw]
                bi = iw
                for kj in range(kj0 + 1, kj1):
                    iw = j0 + kj * dw
                    v = xr[iw]
                    t = (v > best) | (v != v)
                    best = v if t else best
                    bi = iw if t else bi
                rvr[ow] = best
                rir[ow] = bi
        for oh in range(ho):
            i0 = oh * sh - pt
            ki0, ki1 = _valid(i0, dh, H, kh)
            for ow in range(wo):
                yb[ow] = -np.inf
                ib[ow] = -1
            for ki in range(ki0, ki1):       # rows in ki order, the columns as vectors
                ih = i0 + ki * dh
                rvr = rv[ih]
                rir = ri[ih]
                base = ih * W
                for ow in range(wo):
                    c = rir[ow]
                    v = rvr[ow]
                    best = yb[ow]
                    bi = ib[ow]
                    t = (c >= 0) & ((bi < 0) | (v > best) | (v != v))
                    yb[ow] = v if t else best
                    ib[ow] = base + c if t else bi
            yr = y[p, oh]
            ir = idx[p, oh]
            for ow in range(wo):
                yr[ow] = yb[ow]
                ir[ow] = ib[ow]


@nb.njit(**JIT)
def _max_pool_scatter(dy, idx, dx):
    P, ho, wo = dy.shape
    W = dx.shape[2]
    for p in range(P):
        dx[p, :, :] = 0
        for oh in range(ho):
            for ow in range(wo):
                k = idx[p, oh, ow]
                dx[p, k // W, k % W] += dy[p, oh, ow]


@nb.njit(**JIT)
def _avg_pool_train(x, y, dy, dx, backward, kh, kw, sh, sw, pt, pb, pl, pr, include_pad):
    """Forward y = window means, or (backward) dx = scatter of dy / divisor; PyTorch divisor
    rule: the window clipped to the padded extent, or to the image without include_pad."""
    P, H, W = x.shape
    _, ho, wo = y.shape
    for p in range(P):
        if backward:
            dx[p, :, :] = 0
        for oh in range(ho):
            h0 = oh * sh - pt
            h1 = min(h0 + kh, H + pb)
            for ow in range(wo):
                w0 = ow * sw - pl
                w1 = min(w0 + kw, W + pr)
                size = (h1 - h0) * (w1 - w0)
                a0 = max(h0, 0)
                a1 = min(h1, H)
                b0 = max(w0, 0)
                b1 = min(w1, W)
                if not include_pad:
                    size = (a1 - a0) * (b1 - b0)
                if backward:
                    g = dy[p, oh, ow] / size
                    for i in range(a0, a1):
                        for j in range(b0, b1):
                            dx[p, i, j] += g
                else:
                    t = 0.0
                    for i in range(a0, a1):
                        for j in range(b0, b1):
                            t += x[p, i, j]
                    y[p, oh, ow] = t / size


def _planes(x):
    return x.reshape(-1, x.shape[2], x.shape[3])


def max_pool_forward(x, kernel_size, stride, padding, dilation, ceil_mode):
    """x (C, N, H, W) -> (y, argmax) with PyTorch MaxPool2d semantics."""
    C, N, H, W = x.shape
    ho = pool_out_size(H, dilation[0] * (kernel_size[0] - 1) + 1, stride[0], padding[0], padding[1], ceil_mode)
    wo = pool_out_size(W, dilation[1] * (kernel_size[1] - 1) + 1, stride[1], padding[2], padding[3], ceil_mode)
    y = np.empty((C, N, ho, wo), x.dtype)
    idx = np.empty((C, N, ho, wo), np.int32)
    xp, yp, ip = _planes(x), _planes(y), _planes(idx)
    rows_split(xp.shape[0], lambda lo, hi: _max_pool_argmax(
        xp[lo:hi], yp[lo:hi], ip[lo:hi], kernel_size[0], kernel_size[1], stride[0], stride[1],
        padding[0], padding[2], dilation[0], dilation[1]))
    return y, idx


def max_pool_backward(dy, idx, x_shape):
    dx = np.empty(x_shape, dy.dtype)
    dp, ip, xp = _planes(dy), _planes(idx), _planes(dx)
    rows_split(dp.shape[0], lambda lo, hi: _max_pool_scatter(dp[lo:hi], ip[lo:hi], xp[lo:hi]))
    return dx


def avg_pool_forward(x, kernel_size, stride, padding, ceil_mode, count_include_pad):
    C, N, H, W = x.shape
    ho = pool_out_size(H, kernel_size[0], stride[0], padding[0], padding[1], ceil_mode)
    wo = pool_out_size(W, kernel_size[1], stride[1], padding[2], padding[3], ceil_mode)
    y = np.empty((C, N, ho, wo), x.dtype)
    xp, yp = _planes(x), _planes(y)
    rows_split(xp.shape[0], lambda lo, hi: _avg_pool_train(
        xp[lo:hi], yp[lo:hi], yp[lo:hi], xp[lo:hi], False, kernel_size[0], kernel_size[1],
        stride[0], stride[1], padding[0], padding[1], padding[2], padding[3], count_include_pad))
    return y


def avg_pool_backward(dy, x_shape, kernel_size, stride, padding, count_include_pad):
    dx = np.empty(x_shape, dy.dtype)
    xp, dp = _planes(dx), _planes(dy)
    rows_split(xp.shape[0], lambda lo, hi: _avg_pool_train(
        xp[lo:hi], dp[lo:hi], dp[lo:hi], xp[lo:hi], True, kernel_size[0], kernel_size[1],
        stride[0], stride[1], padding[0], padding[1], padding[2], padding[3], count_include_pad))
    return dx


@nb.njit(**JIT)
def _plane_means(x2, y):
    """y[p] = the mean of row p of x2 (P, L): float64 sums in four chains (element j into chain j % 4), then
    (s0 + s1) + (s2 + s3), rounded to y's dtype once. A fixed order: the same bits for any split of the rows."""
    P, L = x2.shape
    L4 = L // 4 * 4
    for p in range(P):
        r = x2[p]
        s0 = s1 = s2 = s3 = 0.0
        for j in range(0, L4, 4):
            s0 += r[j]
            s1 += r[j + 1]
            s2 += r[j + 2]
            s3 += r[j + 3]
        for j in range(L4, L):
            s0 += r[j]
        y[p] = ((s0 + s1) + (s2 + s3)) / L


def global_avg_pool_forward(x):
    """(C, N, H, W) -> (C, N, 1, 1) (numpy's mean over the two small axes, in float64: 444 us for ResNet18's
    512 x 32 x 4 x 4 at 2 threads; `_plane_means` split over the step's threads)."""
    C, N, H, W = x.shape
    y = np.empty((C, N, 1, 1), x.dtype)
    x2, y1 = np.ascontiguousarray(x).reshape(C * N, H * W), y.reshape(C * N)
    rows_split(C * N, lambda lo, hi: _plane_means(x2[lo:hi], y1[lo:hi]))
    return y


def global_avg_pool_backward(dy, x_shape):
    hw = x_shape[2] * x_shape[3]
    return np.broadcast_to(dy / hw, x_shape).astype(dy.dtype)
