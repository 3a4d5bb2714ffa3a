"""The training's channel-major layout (CNHW) and what its kernels share.

A 4-D activation of logical shape (N, C, H, W) is stored as (C, N, H, W) while a network trains
(`training/schedule.py`), so a per-channel reduction (batch-norm statistics) walks one
contiguous row, and a convolution is one GEMM per column tile (`train_conv.py`); 2-D
activations (N, F) keep their layout. This module has the conversions, the channel-row view,
the numba flags of the training kernels (`train_conv.py`, `norm.py`, the training forms in
`pool.py` and `elementwise.py`), their placeholder arrays and their thread splits (tiles of
channel rows or flat ranges over the step's thread count, `kernels/threads.py`).
"""
from __future__ import annotations

import numba as nb
import numpy as np

from .threads import nthreads, ranges, split, split_rows

# numba loops run single-threaded inside the thread split of kernels/threads.py (the step's
# thread count, `using`): each call works on one tile (a range of images, columns or channels)
# handed to one thread
JIT = dict(nogil=True, cache=True)
# reductions (float64 sums of float32 values) may be reassociated so that they vectorize
JITR = dict(nogil=True, cache=True, fastmath={"reassoc", "contract"})

_DUMMY: dict = {}


def dummies(dtype):
    """Placeholder arrays for unused optional kernel arguments (numba needs fixed types)."""
    dt = np.dtype(dtype)
    if dt not in _DUMMY:
        _DUMMY[dt] = (np.zeros(1, dt), np.zeros((1, 1, 1, 1), dt), np.zeros((1, 1), dt))
    return _DUMMY[dt]


_D64 = np.zeros(1, np.float64)


@nb.njit(**JIT)
def _valid(off, s, n_in, n_out):
    """[lo, hi): output positions o with 0 <= o*s + off < n_in."""
    lo = 0 if off >= 0 else (-off + s - 1) // s
    top = n_in - 1 - off
    hi = top // s + 1 if top >= 0 else 0
    hi = min(hi, n_out)
    lo = min(lo, hi)
    return lo, hi


@nb.njit(**JIT)
def _transform(xr, ac, bc, sr, a2c, b2c, rr, out, affine, skind, relu, write_r):
    """out[k] = t(xr[k]) over 1-D views (one channel's values), the input-stage transform of a
    fused conv (train_conv.py, train_winograd.py)
        v = ac*x + bc                if affine (BN step 2), else x
        v += s  or  a2c*s + b2c      if skind == 1 or 2 (shortcut Add, optionally BN3 step 2)
        v = max(v, 0)                if relu (NaN stays NaN)
    and with write_r also rr[k] = v (pattern 4 keeps C2's input for the backward pass)."""
    n = xr.shape[0]
    if skind == 0 and not write_r:                 # one tight loop per case (they vectorize)
        if affine and relu:
            for k in range(n):
                v = ac * xr[k] + bc
                out[k] = 0 if v < 0 else v
        elif affine:
            for k in range(n):
                out[k] = ac * xr[k] + bc
        elif relu:
            for k in range(n):
                v = xr[k]
                out[k] = 0 if v < 0 else v
        else:
            for k in range(n):
                out[k] = xr[k]
        return
    for k in range(n):
        v = xr[k]
        if affine:
            v = ac * v + bc
        if skind == 1:
            v += sr[k]
        elif skind == 2:
            v += a2c * sr[k] + b2c
        if relu:
            v = 0 if v < 0 else v
        out[k] = v
        if write_r:
            rr[k] = v



@nb.njit(**JIT)
def transform_rows(x2, a, b, s2, a2, b2, r2, c, k0, k1, out, affine, skind, relu, write_r):
    """out[:k1 - k0] = t(x2[c, k0:k1]) (`_transform` with channel c's BN scalars and the matching
    slices of the shortcut s2 and the stored input r2; (C, L) rows). The input stage of every
    training conv path (train_conv.py's im2col and 1x1 forms, train_winograd.py's transforms)."""
    ac = a[c] if affine else 1
    bc = b[c] if affine else 0
    a2c = a2[c] if skind == 2 else 0
    b2c = b2[c] if skind == 2 else 0
    xr = x2[c, k0:k1]
    sr = s2[c, k0:k1] if skind != 0 else xr
    rr = r2[c, k0:k1] if write_r else xr
    _transform(xr, ac, bc, sr, a2c, b2c, rr, out[:k1 - k0], affine, skind, relu, write_r)

def _o(a, dummy):
    """`a`, or the placeholder when it is None (numba needs fixed argument types)."""
    return dummy if a is None else a


def rows(x):
    """Channel rows of an activation: CNHW (C, N, H, W) -> (C, N*H*W); (N, C) -> (C, N) copy."""
    if x.ndim == 2:
        return np.ascontiguousarray(x.T)
    return x.reshape(x.shape[0], -1)


def unrows(r, like):
    return np.ascontiguousarray(r.T) if like.ndim == 2 else r.reshape(like.shape)


def rows_split(C, fn):
    """fn(lo, hi) over channel-row ranges split across the step's threads."""
    split_rows(C, lambda lo, hi, tid: fn(lo, hi))


def flat_split(n, fn):
    """fn(lo, hi) over flat ranges (multiples of 4096) split across the step's threads."""
    rs = ranges(n, 2 * nthreads(), align=4096) if nthreads() > 1 else [(0, n)]
    split(len(rs), lambda i, tid: fn(*rs[i]))


def to_cnhw(x):
    """(N, C, H, W) -> contiguous (C, N, H, W)."""
    return np.ascontiguousarray(np.asarray(x).transpose(1, 0, 2, 3))


def to_nchw(x):
    return np.ascontiguousarray(x.transpose(1, 0, 2, 3))
