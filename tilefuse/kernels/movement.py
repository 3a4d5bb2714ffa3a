"""Data movement runtime kernels: reshape, permute, slice, pad (constant / reflect / replicate),
concat.

Each writes `out` in place with one numpy copy (strided views, no temporaries except the
reflect / replicate index gathers); exact, no arithmetic. NCHW (any rank), and for slice, pad
and concat also NCHW16c ("nchwc", the layout pass's blocked tensors; params channels /
in_channels give the real channel counts): H and W slices and pads work on the 5-D array as
they are, channel slices and concat copy channels between lanes (whole blocks when aligned),
and the padded lanes of the result are kept zero.
"""
from __future__ import annotations

import numpy as np
from numba import njit


def reshape(out, x, **_):
    # same element order: a flat copy
    out.reshape(-1)[...] = x.reshape(-1)


def permute(out, x, *, perm, **_):
    np.copyto(out, np.transpose(x, perm))


def slice_(out, x, *, axis, start, stop, step, layout="nchw", in_channels=None, channels=None, **_):
    if layout == "nchwc" and axis % 4 == 1:
        c0, _, st = slice(start, stop, step).indices(int(in_channels[0]))
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



THREADED: frozenset = frozenset()


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


def concat(out, *xs, axis=1, layout="nchw", in_channels=None, channels=None, **_):
    """Concatenation; blocked along channels: each input's channels copied to their offset (whole
    blocks when the offsets are multiples of 16), padded lanes of the result zeroed."""
    if layout != "nchwc":
        np.concatenate(xs, axis=axis, out=out)
        return
    off = 0
    for x, c in zip(xs, in_channels):
        _copy_channels(out, off, x, 0, int(c), 1)
        off += int(c)
    for n in range(out.shape[0]):
        _zero_lanes_from(out, int(channels), n)


KERNELS = {"reshape": reshape, "permute": permute, "slice": slice_, "pad": pad, "concat": concat}
BLOCKED = frozenset({"slice", "pad", "concat"})   # kernels with an NCHW16c form
