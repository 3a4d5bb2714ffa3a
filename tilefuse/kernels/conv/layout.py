"""NCHW <-> NCHWc (channel blocks of 16 innermost) conversions, with zero padding.

NCHWc: (N, C, H, W) -> (N, ceil(C/16), H, W, 16); channel c lives at [:, c // 16, :, :, c % 16];
the padded channels are zero. `to_nchwc` can also add spatial zero padding (top, bottom,
left, right), which the direct and Winograd kernels use instead of bounds checks.
"""
from __future__ import annotations

import numba as nb
import numpy as np
from numba import njit

from tilefuse.kernels.conv._nb import LANES, atomic_add, transpose16
from tilefuse.kernels.threads import numba_region


@njit(nogil=True, cache=True)
def _to_nchwc_one(xb, x, n, cb, pt, pl):
    # x (N, C, H, W) -> xb[n, cb] (Hp, Wp, 16), zeros outside; each row's 16-column runs as 16 x 16 tiles
    # transposed in registers (`transpose16`: channels -> lanes, the missing channels of the last block as zero
    # rows), the rest element by element
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    Hp, Wp = xb.shape[2], xb.shape[3]
    c0 = cb * 16
    nl = min(16, C - c0)
    xf, bf = x.reshape(-1), xb.reshape(-1)
    HW = H * W
    W16 = W - W % 16
    for hp in range(Hp):
        h = hp - pt
        if h < 0 or h >= H:
            for wp in range(Wp):
                for l in range(16):
                    xb[n, cb, hp, wp, l] = 0.0
            continue
        for wp in range(pl):
            for l in range(16):
                xb[n, cb, hp, wp, l] = 0.0
        xrow = ((n * C + c0) * H + h) * W            # x[n, c0, h, 0]
        brow = (((n * xb.shape[1] + cb) * Hp + hp) * Wp + pl) * 16   # xb[n, cb, hp, pl, 0]
        for w0 in range(0, W16, 16):
            transpose16(bf, brow + w0 * 16, 16, xf, xrow + w0, HW, nl, 16)
        for w in range(W16, W):
            for l in range(nl):
                xb[n, cb, hp, pl + w, l] = x[n, c0 + l, h, w]
            for l in range(nl, 16):
                xb[n, cb, hp, pl + w, l] = 0.0
        for wp in range(pl + W, Wp):
            for l in range(16):
                xb[n, cb, hp, wp, l] = 0.0


@njit(nogil=True, cache=True)
def _from_nchwc_one(x, xb, n, cb):
    # xb[n, cb] (H W, 16) -> x[n, c0:c0 + nl] (H W): 16 positions at a time as 16 x 16 tiles transposed in
    # registers (lanes -> channels, only the block's real channels stored), the last positions element by element
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    c0 = cb * 16
    nl = min(16, C - c0)
    xf, bf = x.reshape(-1), xb.reshape(-1)
    HW = H * W
    P16 = HW - HW % 16
    xo = (n * C + c0) * HW                           # x[n, c0, 0, 0]
    bo = (n * xb.shape[1] + cb) * HW * 16            # xb[n, cb, 0, 0, 0]
    for p0 in range(0, P16, 16):
        transpose16(xf, xo + p0, HW, bf, bo + p0 * 16, 16, 16, nl)
    for l in range(nl):
        for p in range(P16, HW):
            xf[xo + l * HW + p] = bf[bo + p * 16 + l]


@njit(nogil=True, cache=True)
def _to_seq(counter, tid, xb, x, pt, pl):
    """One worker of the conversion's task loop (threads.numba_region): a task per (image, channel block)."""
    cb = xb.shape[1]
    while True:
        i = atomic_add(counter, 0, 1)
        if i >= xb.shape[0] * cb:
            break
        _to_nchwc_one(xb, x, i // cb, i % cb, pt, pl)


@njit(parallel=True, nogil=True, cache=True)
def _to_par(nt, xb, x, pt, pl):
    counter = np.zeros(1, np.int64)
    for _w in nb.prange(nt):
        _to_seq(counter, nb.get_thread_id(), xb, x, pt, pl)


@njit(nogil=True, cache=True)
def _from_seq(counter, tid, x, xb):
    cb = xb.shape[1]
    while True:
        i = atomic_add(counter, 0, 1)
        if i >= xb.shape[0] * cb:
            break
        _from_nchwc_one(x, xb, i // cb, i % cb)


@njit(parallel=True, nogil=True, cache=True)
def _from_par(nt, x, xb):
    counter = np.zeros(1, np.int64)
    for _w in nb.prange(nt):
        _from_seq(counter, nb.get_thread_id(), x, xb)


def nchwc_shape(shape, padding=(0, 0, 0, 0)) -> tuple:
    n, c, h, w = shape
    t, b, l, r = padding
    return (n, -(-c // LANES), h + t + b, w + l + r, LANES)


def to_nchwc(x: np.ndarray, padding=(0, 0, 0, 0), out: np.ndarray | None = None, threads=None) -> np.ndarray:
    """(N, C, H, W) -> (N, Cb, H+t+b, W+l+r, 16) with zero padding (spatial and channel)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    shape = nchwc_shape(x.shape, padding)
    if out is None:
        out = np.empty(shape, np.float32)
    elif out.shape != shape:
        raise ValueError(f"to_nchwc: out has shape {out.shape}, expected {shape}")
    t, _, l, _ = padding
    # one numba task loop (a task per image and channel block): a Python pool task per block cost 40-75 us
    # for ShuffleNetV2's 7x7 and 14x14 maps, whose channel shuffles convert at every block
    if not out.flags.c_contiguous:          # a view (a ring's rows): the kernel reads and writes flat
        out[...] = to_nchwc(x, padding, threads=threads)
        return out
    numba_region(_to_par, _to_seq, threads, shape[0] * shape[1], out, x, t, l)
    return out


def from_nchwc(xb: np.ndarray, channels: int, out: np.ndarray | None = None, threads=None) -> np.ndarray:
    """(N, Cb, H, W, 16) -> (N, channels, H, W); the padded channels are dropped."""
    n, cb, h, w, _ = xb.shape
    if out is None:
        out = np.empty((n, channels, h, w), np.float32)
    if not out.flags.c_contiguous:          # views (a band of a blocked tensor): the kernel reads and writes flat
        out[...] = from_nchwc(xb, channels, threads=threads)
        return out
    numba_region(_from_par, _from_seq, threads, n * cb, out, np.ascontiguousarray(xb))
    return out
