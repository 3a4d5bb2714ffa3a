"""Data movement runtime kernels: reshape, permute, slice, pad (constant / reflect / replicate),
concat, channel_shuffle, pixel_shuffle (and its inverse).

Each writes `out` in place with one numpy copy (strided views, no temporaries except the
reflect / replicate index gathers); exact, no arithmetic. NCHW (any rank), and for slice, pad,
concat and channel_shuffle also NCHW16c ("nchwc", the layout pass's blocked tensors; params
channels / in_channels give the real channel counts): H and W slices and pads work on the 5-D
array as they are; channel slices, concats and shuffles copy whole blocks with numpy where every
channel keeps its lane and block offset (a concat of multiples of 16), and otherwise run the lane
gather: one numba task loop over (image, output block), each output lane read from its source
(array, block, lane) through a table built once per shape (`lane_table`), the padded lanes
written zero in the same loop.
"""
from __future__ import annotations

import functools
import math

import numba as nb
import numpy as np
from numba import njit

from .conv._nb import atomic_add, load_f32, permsel16, stack_i64, transpose16
from .threads import numba_region, pool_region


def reshape(out, x, **_):
    # same element order: a flat copy
    out.reshape(-1)[...] = x.reshape(-1)


@functools.lru_cache(maxsize=1024)
def _merged_axes(shape, perm):
    """The permute as few output axes as possible: (sizes, input strides in elements) of the output's axes after
    dropping size-1 axes and merging neighbours that are neighbours in the input too."""
    istr, acc = [0] * len(shape), 1
    for k in range(len(shape) - 1, -1, -1):
        istr[k], acc = acc, acc * shape[k]
    merged: list[list[int]] = []
    for p in perm:
        if shape[p] == 1:
            continue
        if merged and merged[-1][1] == istr[p] * shape[p]:
            merged[-1] = [merged[-1][0] * shape[p], istr[p]]
        else:
            merged.append([shape[p], istr[p]])
    return tuple(m[0] for m in merged), tuple(m[1] for m in merged)


@njit(nogil=True, cache=True)
def _transpose_tasks(o, x, osh, ois, na, nb_, sa, t0, t1):
    """out (outer..., B, A) flat from x: x offset of (outer, b, a) = sum outer_d ois_d + b + a sa. Task t = (outer
    index, block of 16 b's): 16 x 16 tiles transposed in registers (`transpose16`), the edges element by element."""
    nbb = -(-nb_ // 16)
    A16 = na - na % 16
    for t in range(t0, t1):
        oi, b0 = t // nbb, (t % nbb) * 16
        r, ib = oi, 0
        for d in range(osh.size - 1, -1, -1):
            ib += (r % osh[d]) * ois[d]
            r //= osh[d]
        ob = oi * na * nb_
        nbr = min(16, nb_ - b0)
        if nbr == 16:
            for a0 in range(0, A16, 16):
                transpose16(o, ob + b0 * na + a0, na, x, ib + a0 * sa + b0, sa, 16, 16)
        a1 = A16 if nbr == 16 else 0     # where the element loop starts
        for b in range(b0, b0 + nbr):
            for a in range(a1, na):
                o[ob + b * na + a] = x[ib + b + a * sa]


PERMUTE_TASKS = 64       # tasks of a tiled permute at most (from the shape only)
TILED_MIN_SIZE = 1 << 15  # smaller permutes, or a transposed plane with a side under TILED_MIN_SIDE: numpy's copy
TILED_MIN_SIDE = 32       # (the tasks' set-up and the partial tiles cost more than they save)


@njit(nogil=True, cache=True)
def _transpose_seq(counter, tid, o, x, osh, ois, na, nb_, sa, ntask, step):
    """One worker: blocks of `step` tile tasks taken from `counter` (threads.pool_region)."""
    while True:
        t0 = atomic_add(counter, 0, 1) * step
        if t0 >= ntask:
            break
        _transpose_tasks(o, x, osh, ois, na, nb_, sa, t0, min(ntask, t0 + step))


def permute(out, x, *, perm, threads=None, **_):
    """out = x transposed by perm. A permute that moves the input's last axis to the output's second-last place
    after merging axes (a batched 2-D transpose: (N, C, HW) -> (N, HW, C), k.transpose(-2, -1)) runs as
    16 x 16 register tiles, one worker per thread (`pool_region`; 8 x 192 x 256 on one Zen 5 core: numpy's strided
    copy 0.34 -> 0.05 ms); anything else, numpy's copy (the last axis kept: contiguous runs)."""
    sizes, strides = _merged_axes(tuple(x.shape), tuple(perm))
    if x.dtype != np.float32 or not out.flags.c_contiguous or not x.flags.c_contiguous or len(sizes) < 2 \
            or strides[-1] == 1 or strides[-2] != 1 or min(sizes[-2:]) < TILED_MIN_SIDE or x.size < TILED_MIN_SIZE:
        np.copyto(out, np.transpose(x, perm))
        return
    osh = np.array(sizes[:-2] or (1,), np.int64)
    ois = np.array(strides[:-2] or (0,), np.int64)
    nb_, na, sa = sizes[-2], sizes[-1], strides[-1]
    ntask = int(np.prod(osh)) * -(-nb_ // 16)
    step = -(-ntask // min(PERMUTE_TASKS, ntask))
    pool_region(_transpose_seq, threads, -(-ntask // step), out.reshape(-1), x.reshape(-1), osh,
                 ois, na, nb_, sa, ntask, step)


def slice_(out, x, *, axis, start, stop, step, layout="nchw", in_channels=None, channels=None, threads=None,
           **_):
    if layout == "nchwc" and axis % 4 == 1:
        c0, _, st = slice(start, stop, step).indices(int(in_channels[0]))
        if not (st == 1 and c0 % 16 == 0) and _gather_ok(out, (x,)):
            _gather(out, (x,), ("slice", (int(in_channels[0]),), int(channels), out.shape[1], (c0, st)), threads)
            return
        _copy_channels(out, 0, x, c0, int(channels), st)
        for n in range(out.shape[0]):
            _zero_lanes_from(out, int(channels), n)
        return
    rank = 4 if layout == "nchwc" else x.ndim
    idx = [slice(None)] * x.ndim
    idx[axis % rank] = slice(start, stop, step)
    np.copyto(out, x[tuple(idx)])


def _edge_index(size: int, lo: int, hi: int, mode: str) -> np.ndarray:
    """Source index of every padded position along one axis (reflect: mirror without the edge)."""
    i = np.arange(-lo, size + hi)
    if mode == "replicate":
        return np.clip(i, 0, size - 1)
    if size == 1:
        return np.zeros_like(i)
    period = 2 * (size - 1)
    i = np.abs(i) % period
    return np.where(i >= size, period - i, i)


def pad(out, x, *, pads, mode="constant", value=0.0, layout="nchw", channels=None, **_):
    if layout == "nchwc":   # H, W pads of the blocked tensor; the lane axis is not padded
        pad(out, x, pads=tuple(pads) + (0, 0), mode=mode, value=value)
        for n in range(out.shape[0]):                       # padded lanes 0 (a pad value lands there)
            _zero_lanes_from(out, int(channels), n)
        return
    if mode == "constant":
        out.fill(value)
        inner = tuple(slice(pads[2 * i], pads[2 * i] + d) for i, d in enumerate(x.shape))
        out[inner] = x
        return
    y = x
    for axis, d in enumerate(x.shape):
        lo, hi = pads[2 * axis], pads[2 * axis + 1]
        if lo or hi:
            y = np.take(y, _edge_index(d, lo, hi, mode), axis=axis)
    np.copyto(out, y)



THREADED = frozenset({"slice", "concat", "channel_shuffle", "permute"})   # the lane gather, the tiled transpose


# channel copies for blocked (NCHW16c) tensors ------------------------------------------------

@njit(nogil=True, cache=True)
def _copy_lanes(out5, o0, x5, c0, j0, count, step, n):
    """out5[n, channel o0 + j] = x5[n, channel c0 + j * step] for j0 <= j < count (channel c lives
    at block c // 16, lane c % 16); positions outer, channels inner (neighbouring lanes)."""
    H, W = x5.shape[2], x5.shape[3]
    for h in range(H):
        for w in range(W):
            for j in range(j0, count):
                c, o = c0 + j * step, o0 + j
                out5[n, o // 16, h, w, o % 16] = x5[n, c // 16, h, w, c % 16]


def _copy_channels(out5, o0, x5, c0, count, step):
    """Channels c0, c0 + step, ... (count of them) of x5 to channels o0.. of out5, every image:
    whole 16-lane blocks with one numpy copy when aligned, the rest lane by lane."""
    done = 0
    if step == 1 and o0 % 16 == 0 and c0 % 16 == 0 and count >= 16:
        nb = count // 16
        out5[:, o0 // 16:o0 // 16 + nb] = x5[:, c0 // 16:c0 // 16 + nb]
        done = nb * 16
    if done < count:
        for n in range(out5.shape[0]):
            _copy_lanes(out5, o0, x5, c0, done, count, step, n)


@njit(nogil=True, cache=True)
def _zero_lanes_from(out5, channels, n):
    cb = out5.shape[1]
    l0 = channels - (cb - 1) * 16
    if l0 >= 16:
        return
    for h in range(out5.shape[2]):
        for w in range(out5.shape[3]):
            for l in range(l0, 16):
                out5[n, cb - 1, h, w, l] = 0.0


def concat(out, *xs, axis=1, layout="nchw", in_channels=None, channels=None, threads=None, **_):
    """Concatenation; blocked along channels: each input's channels copied to their offset (whole
    blocks when the offsets are multiples of 16), padded lanes of the result zeroed; other offsets
    (ShuffleNetV2's 58 + 58) run the lane gather."""
    if layout != "nchwc":
        np.concatenate(xs, axis=axis, out=out)
        return
    inch = tuple(int(c) for c in in_channels)
    if any(c % 16 for c in inch[:-1]) and _gather_ok(out, xs):
        _gather(out, xs, ("concat", inch, int(channels), out.shape[1], ()), threads)
        return
    off = 0
    for x, c in zip(xs, in_channels):
        _copy_channels(out, off, x, 0, int(c), 1)
        off += int(c)
    for n in range(out.shape[0]):
        _zero_lanes_from(out, int(channels), n)


def channel_shuffle(out, *xs, groups, start=0, stop=None, layout="nchw", in_channels=None, channels=None,
                    threads=None, **_):
    """The inputs concatenated along channels, shuffled (channel c <- (c % g) * (C / g) + c // g: ShuffleNet's
    view (N, g, C/g, H, W), transpose of the two channel axes, view back), channels [start, stop) of that;
    blocked: the lane gather reading the inputs directly."""
    g = int(groups)
    if layout == "nchwc":
        inch = tuple(int(c) for c in in_channels)
        key = ("channel_shuffle", inch, int(channels), out.shape[1], (g, int(start)))
        table = lane_table(*key)
        if _gather_ok(out, xs):
            _gather(out, xs, key, threads)
        else:   # non-contiguous operands (a band's ring view): the same table, lane by lane
            for n in range(out.shape[0]):
                for c in range(int(channels)):
                    b, l = c // 16, c % 16
                    out[n, b, :, :, l] = xs[table[0, b, l]][n, table[1, b, l], :, :, table[2, b, l]]
                _zero_lanes_from(out, int(channels), n)
        return
    x = xs[0] if len(xs) == 1 else np.concatenate(xs, axis=1)
    n, c, h, w = x.shape
    if start == 0 and out.shape[1] == c:
        # (N, C, H, W) -> (N, g, C/g, H, W) -> (N, C/g, g, H, W): out viewed as the transposed grid
        np.copyto(out.reshape(n, c // g, g, h, w), x.reshape(n, g, c // g, h, w).transpose(0, 2, 1, 3, 4))
        return
    np.copyto(out, x.reshape(n, g, c // g, h, w).transpose(0, 2, 1, 3, 4).reshape(n, c, h, w)[:, start:stop])


# the lane gather (NCHW16c channel movement) --------------------------------------------------

@functools.lru_cache(maxsize=1024)
def lane_table(kind: str, in_channels: tuple, channels: int, ob: int, args: tuple) -> np.ndarray:
    """(3, Ob, 16) int64, read-only: for output lane (block b, lane l), channel c = 16 b + l, its source
    array k (-1: a padded lane, written 0), source block and source lane. kind: "concat" (the inputs'
    channels one after the other), "slice" (args (c0, step): channel c0 + c * step of input 0),
    "channel_shuffle" (args (g, start): channel s = start + c of the shuffled concatenation, concatenated
    channel (s % g) * (C / g) + s // g)."""
    t = np.full((3, ob, 16), -1, np.int64)
    t[1:] = 0
    offs = np.cumsum((0,) + in_channels)
    for c in range(channels):
        if kind == "concat":
            k = int(np.searchsorted(offs, c, side="right")) - 1
            src = c - int(offs[k])
        elif kind == "slice":
            k, src = 0, args[0] + c * args[1]
        elif kind == "channel_shuffle":   # args (g, start): the shuffled concatenation's channel start + c
            s = args[1] + c
            s = (s % args[0]) * (int(offs[-1]) // args[0]) + s // args[0]
            k = int(np.searchsorted(offs, s, side="right")) - 1
            src = s - int(offs[k])
        else:
            raise ValueError(f"lane_table: unknown kind {kind!r}")
        t[0, c // 16, c % 16], t[1, c // 16, c % 16], t[2, c // 16, c % 16] = k, src // 16, src % 16
    t.flags.writeable = False
    return t


LANE_SIMD = None   # the lane gather's vector form (conv/_nb.permsel16): None = where the host has AVX-512F
MAX_SEGMENTS = 4   # source vectors an output block may read for the vector form (more: that block lane by lane)


@functools.lru_cache(maxsize=1024)
def lane_segments(kind: str, in_channels: tuple, channels: int, ob: int, args: tuple) -> tuple:
    """`lane_table` as source vectors per output block, for `conv/_nb.permsel16`: (nseg (Ob,), src (2, Ob, 4):
    input k and block of each, idx (Ob, 4 * 16) int32: the lane of segment j feeding output lane l, or -1).
    nseg is MAX_SEGMENTS + 1 where a block reads more source vectors (that block runs lane by lane)."""
    t = lane_table(kind, in_channels, channels, ob, args)
    nseg = np.zeros(ob, np.int64)
    src = np.zeros((2, ob, MAX_SEGMENTS), np.int64)
    idx = np.full((ob, MAX_SEGMENTS * 16), -1, np.int32)
    for b in range(ob):
        segs = sorted({(int(t[0, b, l]), int(t[1, b, l])) for l in range(16) if t[0, b, l] >= 0})
        if len(segs) > MAX_SEGMENTS:
            nseg[b] = MAX_SEGMENTS + 1
            continue
        nseg[b] = len(segs)
        for j, (k, blk) in enumerate(segs):
            src[0, b, j], src[1, b, j] = k, blk
            for l in range(16):
                if (t[0, b, l], t[1, b, l]) == (k, blk):
                    idx[b, 16 * j + l] = t[2, b, l]
    for a in (nseg, src, idx):
        a.flags.writeable = False
    return nseg, src, idx


def _simd() -> bool:
    if LANE_SIMD is None:
        from .conv.tiles import X86_512
        return X86_512
    return bool(LANE_SIMD)


def _gather_ok(out, xs) -> bool:
    return all(a.dtype == np.float32 and a.flags.c_contiguous and a.ndim == 5 for a in (out,) + tuple(xs))


def _gather(out, xs, key, threads) -> None:
    """out (N, Ob, H, W, 16) from the blocked sources xs by the tables of `key` (lane_table's arguments):
    one task loop, every lane of every output block written (so a replayed call, threads.replaying,
    redoes all of it). The sources are passed as data addresses (any number of them in one compiled
    loop); they stay alive for the call, and the tables only name blocks they have (built from their
    channel counts)."""
    bases = np.array([x.ctypes.data for x in xs], np.int64)
    cbs = np.array([x.shape[1] for x in xs], np.int64)
    nseg, src, idx = lane_segments(*key)
    numba_region(_lanes_par, _lanes_seq, threads, out.shape[0] * out.shape[1], out, bases, cbs, lane_table(*key),
                 nseg, src, idx, _simd())


@njit(nogil=True, cache=True)
def _lanes_seq(counter, tid, out, bases, cbs, table, nseg, src, idx, simd):
    """One worker of the lane gather: task t = (image n, output block b). Vector form (simd, a block reading
    at most MAX_SEGMENTS source vectors): per position one `permsel16` over the block's source vectors
    (their addresses at position 0: bases[k] + (n * Cb_k + block) * P * 64 bytes). Lane by lane: each
    lane's source address at position 0 (+ lane * 4), then the positions in order, 16 lanes each; the
    padded lanes (after the last channel: the last block only) are written 0. Both write the same values."""
    N, Ob = out.shape[0], out.shape[1]
    P = out.shape[2] * out.shape[3]
    of = out.reshape(out.size)
    ap = stack_i64(16)
    a = nb.carray(ap, 16)
    while True:
        t = atomic_add(counter, 0, 1)
        if t >= N * Ob:
            break
        n = t // Ob
        b = t - n * Ob
        d = (n * Ob + b) * P * 16
        ns = nseg[b]
        if simd and ns <= MAX_SEGMENTS:
            for j in range(ns):
                k = src[0, b, j]
                a[j] = bases[k] + (n * cbs[k] + src[1, b, j]) * P * 64
            ii = b * MAX_SEGMENTS * 16
            if ns == 1:
                for p in range(P):
                    permsel16(of, d + p * 16, ap, p * 64, idx, ii, 1)
            elif ns == 2:
                for p in range(P):
                    permsel16(of, d + p * 16, ap, p * 64, idx, ii, 2)
            elif ns == 3:
                for p in range(P):
                    permsel16(of, d + p * 16, ap, p * 64, idx, ii, 3)
            elif ns == 4:
                for p in range(P):
                    permsel16(of, d + p * 16, ap, p * 64, idx, ii, 4)
            else:   # an output block of padding only (no channel): zeros
                for p in range(P * 16):
                    of[d + p] = 0.0
            continue
        nl = 0          # lanes with a source: the first nl (a padded lane is never followed by a real one)
        for l in range(16):
            k = table[0, b, l]
            if k >= 0:
                a[l] = bases[k] + ((n * cbs[k] + table[1, b, l]) * P * 16 + table[2, b, l]) * 4
                nl = l + 1
        if nl == 16:
            for p in range(P):
                for l in range(16):
                    of[d + p * 16 + l] = load_f32(a[l] + p * 64)
        else:
            for p in range(P):
                for l in range(nl):
                    of[d + p * 16 + l] = load_f32(a[l] + p * 64)
                for l in range(nl, 16):
                    of[d + p * 16 + l] = 0.0


@njit(parallel=True, nogil=True, cache=True)
def _lanes_par(nt, out, bases, cbs, table, nseg, src, idx, simd):
    counter = np.zeros(1, np.int64)
    for _w in nb.prange(nt):
        _lanes_seq(counter, nb.get_thread_id(), out, bases, cbs, table, nseg, src, idx, simd)


def pixel_shuffle(out, x, *, factor, mode="crd", inverse=False, **_):
    """PixelShuffle / DepthToSpace (inverse: PixelUnshuffle / SpaceToDepth), NCHW: one strided copy
    of x's 6-D view into out's (kernels/reference.py `pixel_shuffle` says which element goes where)."""
    n, c, h, w = x.shape
    r = int(factor)
    if not out.flags.c_contiguous:
        from . import reference as ref
        out[...] = ref.pixel_shuffle(x, r, mode, inverse)
        return
    if not inverse:
        co = c // (r * r)
        o6 = out.reshape(n, co, h, r, w, r)                      # (N, C', H, i, W, j)
        x6 = x.reshape((n, co, r, r, h, w) if mode == "crd" else (n, r, r, co, h, w))
        np.copyto(o6, x6.transpose((0, 1, 4, 2, 5, 3) if mode == "crd" else (0, 3, 4, 1, 5, 2)))
        return
    x6 = x.reshape(n, c, h // r, r, w // r, r)                   # (N, C, H', i, W', j)
    if mode == "crd":                                            # out (N, C, i, j, H', W')
        np.copyto(out.reshape(n, c, r, r, h // r, w // r), x6.transpose(0, 1, 3, 5, 2, 4))
    else:                                                        # out (N, i, j, C, H', W')
        np.copyto(out.reshape(n, r, r, c, h // r, w // r), x6.transpose(0, 3, 5, 1, 2, 4))


def pixel_shuffle_band_nchwc(out5, x5, *, factor, mode, inverse, channels, row0, lo, threads=None):
    """A streamed band of pixel_shuffle on NCHW16c rows (kernels/bands.py): out5 (N, Ob, R, Wo, 16) are output
    rows [row0, row0 + R) of `channels` real channels, x5 (N, Cb, rows, W, 16) input rows from `lo` on. One
    task loop over (image, output block, row); every output lane read from its input channel, position and
    lane (the reference's order), the padded lanes written zero."""
    n, ob, rows = out5.shape[:3]
    numba_region(_shuffle_par, _shuffle_seq, threads, n * ob * rows, out5, x5, int(factor), mode == "dcr",
                 bool(inverse), int(channels), int(row0), int(lo))


@njit(nogil=True, cache=True)
def _shuffle_seq(counter, tid, out5, x5, r, dcr, inverse, co, row0, lo):
    n_img, ob, rows, wo, _ = out5.shape
    rr = r * r
    cin = co // rr                                 # an unshuffle's input channels (its output has cin * r * r)
    src = np.empty(16, np.int64)                   # per lane: input channel of the output lane, this (i, j)
    while True:
        t = atomic_add(counter, 0, 1)
        if t >= n_img * ob * rows:
            break
        n = t // (ob * rows)
        b = (t // rows) % ob
        q = t % rows
        g = row0 + q                               # the output row
        nl = min(16, co - b * 16)                  # real lanes of this block
        if not inverse:                            # output (c, g, x) <- input (ci, g // r, x // r)
            i = g % r
            h = g // r - lo
            for j in range(r):
                for l in range(nl):
                    c = b * 16 + l
                    src[l] = (i * r + j) * co + c if dcr else c * rr + i * r + j
                for w in range(wo // r):
                    x = w * r + j
                    for l in range(nl):
                        out5[n, b, q, x, l] = x5[n, src[l] >> 4, h, w, src[l] & 15]
                    for l in range(nl, 16):
                        out5[n, b, q, x, l] = 0.0
        else:                                      # output (c, g, x) <- input (ci, g r + i, x r + j)
            for l in range(nl):
                c = b * 16 + l
                if dcr:
                    k = c // cin
                    src[l] = c - k * cin
                else:
                    k = c % rr
                    src[l] = c // rr
                i = k // r
                j = k - i * r
                for x in range(wo):
                    out5[n, b, q, x, l] = x5[n, src[l] >> 4, g * r + i - lo, x * r + j, src[l] & 15]
            for x in range(wo):
                for l in range(nl, 16):
                    out5[n, b, q, x, l] = 0.0


@njit(parallel=True, nogil=True, cache=True)
def _shuffle_par(nt, out5, x5, r, dcr, inverse, co, row0, lo):
    counter = np.zeros(1, np.int64)
    for _w in nb.prange(nt):
        _shuffle_seq(counter, nb.get_thread_id(), out5, x5, r, dcr, inverse, co, row0, lo)


@njit(nogil=True, cache=True)
def _take(out3, x3, idx, negative):
    """out3 (A, K, B) = x3 (A, N, B) at rows idx (K,) (float values); returns the first bad index's position or -1
    (checked before anything is written)."""
    n = x3.shape[1]
    lo = -n if negative else 0
    for k in range(idx.size):
        v = idx[k]
        if not (v == np.floor(v) and v >= lo and v < n):
            return k
    for k in range(idx.size):
        r = int(idx[k])
        if r < 0:
            r += n
        for a in range(x3.shape[0]):
            for b in range(x3.shape[2]):
                out3[a, k, b] = x3[a, r, b]
    return -1


def take(out, x, indices, *, axis=0, negative=True, **_):
    """kernels/reference.py `take` (the ValueError naming a bad index included), one numba loop."""
    axis %= x.ndim
    a, n = math.prod(x.shape[:axis]), x.shape[axis]
    b = math.prod(x.shape[axis + 1:])
    idx = np.ascontiguousarray(indices).reshape(-1)
    bad = _take(out.reshape(a, idx.size, b), np.ascontiguousarray(x).reshape(a, n, b), idx, bool(negative))
    if bad >= 0:
        from . import reference as ref
        ref.take(x, indices, axis, negative)       # raises the ValueError naming the index
        raise ValueError(f"index {idx[bad]} out of range")      # pragma: no cover (the reference raises first)


KERNELS = {"reshape": reshape, "permute": permute, "slice": slice_, "pad": pad, "concat": concat,
           "channel_shuffle": channel_shuffle, "pixel_shuffle": pixel_shuffle, "take": take}
BLOCKED = frozenset({"slice", "pad", "concat", "channel_shuffle"})   # kernels with an NCHW16c form
