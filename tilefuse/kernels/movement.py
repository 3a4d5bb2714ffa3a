"""Data movement runtime kernels: reshape, permute, slice, pad (constant / reflect / replicate).

Each writes `out` in place with one numpy copy (strided views, no temporaries except the
reflect / replicate index gathers). NCHW (any rank). Exact: no arithmetic.
"""
from __future__ import annotations

import numpy as np


def reshape(out, x, **_):
    # same element order: a flat copy
    out.reshape(-1)[...] = x.reshape(-1)


def permute(out, x, *, perm, **_):
    np.copyto(out, np.transpose(x, perm))


def slice_(out, x, *, axis, start, stop, step, **_):
    idx = [slice(None)] * x.ndim
    idx[axis % x.ndim] = slice(start, stop, step)
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


def pad(out, x, *, pads, mode="constant", value=0.0, **_):
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


KERNELS = {"reshape": reshape, "permute": permute, "slice": slice_, "pad": pad}
THREADED: frozenset = frozenset()
