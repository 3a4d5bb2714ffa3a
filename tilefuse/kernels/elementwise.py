"""Fast element-wise kernels: add (+ ReLU), ReLU, per-channel scale. Numba (`nogil`,
`cache=True`) next to the numpy reference (`kernels/reference.py`; `tests/test_layer_kernels.py`).

Any layout: add and relu run over the flat buffer in fixed chunks (CHUNK elements per task on
the shared thread pool, boundaries from the size only, so 1 and 2 threads give identical
results); scale takes the NCHW or NCHW16c per-channel view.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .threads import parallel_for


@njit(nogil=True, cache=True, fastmath=True)
def _add_flat(out, a, b, i0, i1, relu):
    for i in range(i0, i1):
        v = a[i] + b[i]
        out[i] = max(v, np.float32(0.0)) if relu else v


@njit(nogil=True, cache=True, fastmath=True)
def _relu_flat(out, a, i0, i1):
    for i in range(i0, i1):
        out[i] = max(a[i], np.float32(0.0))


CHUNK = 1 << 16  # elements per task (256 KB of float32: a few tasks per L2)


def _chunks(size):
    return [(i, min(i + CHUNK, size)) for i in range(0, size, CHUNK)]


def add(out, a, b, *, relu=False, threads=None, **_):
    """out = a + b (ReLU) in one pass; any layout (both operands have the output's shape)."""
    if out.dtype != np.float32 or a.shape != out.shape or b.shape != out.shape:
        np.add(a, b, out=out)
        if relu:
            np.maximum(out, 0, out=out)
        return
    o, x, y = out.reshape(-1), a.reshape(-1), b.reshape(-1)
    parallel_for(lambda c: _add_flat(o, x, y, c[0], c[1], relu), _chunks(o.size), threads)


def relu(out, x, *, threads=None, **_):
    if out.dtype != np.float32:
        np.maximum(x, 0, out=out)
        return
    o, a = out.reshape(-1), x.reshape(-1)
    parallel_for(lambda c: _relu_flat(o, a, c[0], c[1]), _chunks(o.size), threads)


def scale(out, x, alpha, beta, *, layout="nchw", **_):
    """Per-channel affine map; NCHWc pads alpha and beta with zeros to the blocked channels."""
    if layout == "nchwc":
        cb = x.shape[1]
        a = np.zeros(cb * 16, x.dtype)
        bt = np.zeros(cb * 16, x.dtype)
        a[:alpha.size], bt[:beta.size] = alpha, beta
        shape = (1, cb, 1, 1, 16)  # (C,) -> (1, Cb, 1, 1, 16)
        np.multiply(x, a.reshape(shape), out=out)
        out += bt.reshape(shape)
        return
    shape = (1, -1) + (1,) * (x.ndim - 2)
    np.multiply(x, alpha.reshape(shape), out=out)
    out += beta.reshape(shape)
