"""Fast element-wise kernels: add (+ ReLU), ReLU, per-channel scale. Numba (`nogil`,
`cache=True`) next to the numpy reference (`kernels/reference.py`; `tests/test_layer_kernels.py`).
The training forms (new arrays, ReLU' for the backward pass) are at the end.

Any layout: add and relu run over the flat buffer in fixed chunks (CHUNK elements per task, one worker
per thread: `pool_region`; boundaries from the size only, so 1 and 2 threads give identical
results); scale takes the NCHW or NCHW16c per-channel view.
"""
from __future__ import annotations

import numba as nb
import numpy as np
from numba import njit

from .cnhw import JIT, flat_split
from .fpflags import FAST
from .conv._nb import atomic_add
from .threads import nthreads, pool_region, split


@njit(nogil=True, cache=True, fastmath=FAST)
def _add_flat(out, a, b, i0, i1, relu):
    # views from i0: indices from 0 up, no negative-index wraparound code in the loop, which kept it scalar
    # (393K values on one Zen 5 core: 0.32 -> 0.05 ms, as numpy's add)
    o, x, y = out[i0:i1], a[i0:i1], b[i0:i1]
    for i in range(o.size):
        v = x[i] + y[i]
        o[i] = max(v, np.float32(0.0)) if relu else v


@njit(nogil=True, cache=True, fastmath=FAST)
def _relu_flat(out, a, i0, i1):
    o, x = out[i0:i1], a[i0:i1]          # views from i0 (as _add_flat)
    for i in range(o.size):
        o[i] = max(x[i], np.float32(0.0))


CHUNK = 1 << 16  # elements per task (256 KB of float32: a few tasks per L2)


# task loops (threads.pool_region): chunks taken from `counter` inside numba, one worker per thread (a Python
# task per chunk cost more than a chunk of adds)
@njit(nogil=True, cache=True)
def _add_seq(counter, tid, out, a, b, relu):
    while True:
        i0 = atomic_add(counter, 0, 1) * CHUNK
        if i0 >= out.size:
            break
        _add_flat(out, a, b, i0, min(out.size, i0 + CHUNK), relu)


@njit(nogil=True, cache=True)
def _relu_seq(counter, tid, out, a):
    while True:
        i0 = atomic_add(counter, 0, 1) * CHUNK
        if i0 >= out.size:
            break
        _relu_flat(out, a, i0, min(out.size, i0 + CHUNK))


def add(out, a, b, *, relu=False, threads=None, **_):
    """out = a + b (ReLU) in one pass; any layout (both operands have the output's shape)."""
    if out.dtype != np.float32 or a.shape != out.shape or b.shape != out.shape:
        np.add(a, b, out=out)
        if relu:
            np.maximum(out, 0, out=out)
        return
    o, x, y = out.reshape(-1), a.reshape(-1), b.reshape(-1)
    pool_region(_add_seq, threads, -(-o.size // CHUNK), o, x, y, bool(relu))


def relu(out, x, *, threads=None, **_):
    if out.dtype != np.float32:
        np.maximum(x, 0, out=out)
        return
    o, a = out.reshape(-1), x.reshape(-1)
    pool_region(_relu_seq, threads, -(-o.size // CHUNK), o, a)


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


# training forms (kernels/cnhw.py: the step's thread split) -------------------------------------

@nb.njit(**JIT)
def _relu_copy(x1, out):
    for k in range(x1.shape[0]):
        v = x1[k]
        out[k] = v if v > 0 else 0


@nb.njit(**JIT)
def _relu_grad(dy, x, out):
    for k in range(dy.shape[0]):
        out[k] = dy[k] if x[k] > 0 else 0


@nb.njit(**JIT)
def _add_copy(a, b, out):
    for k in range(a.shape[0]):
        out[k] = a[k] + b[k]


def relu_forward(x):
    """A new array max(x, 0) (training: `v if v > 0 else 0`, NaN -> 0), split over the step's threads."""
    out = np.empty_like(x)
    a, o = x.reshape(-1), out.reshape(-1)
    flat_split(a.shape[0], lambda lo, hi: _relu_copy(a[lo:hi], o[lo:hi]))
    return out


def relu_backward(dy, x):
    """dy where x > 0, else 0 (a new array)."""
    out = np.empty_like(dy)
    d, a, o = dy.reshape(-1), x.reshape(-1), out.reshape(-1)
    flat_split(d.shape[0], lambda lo, hi: _relu_grad(d[lo:hi], a[lo:hi], o[lo:hi]))
    return out


def add_forward(a, b):
    """A new array a + b (training; the error Add of a fork too)."""
    out = np.empty_like(a)
    a1, b1, o = a.reshape(-1), b.reshape(-1), out.reshape(-1)
    flat_split(a1.shape[0], lambda lo, hi: _add_copy(a1[lo:hi], b1[lo:hi], o[lo:hi]))
    return out


@nb.njit(**JIT)
def _sgd(p, g, buf, lr, momentum, wd, has_wd, has_mom, first):
    """One pass of torch.optim.SGD (dampening 0, no Nesterov) over flat float32 views, with
    numpy's float32 operation order (no contraction into FMAs, so the bits equal the numpy
    form): d = g + wd*p; buf = d (first) or buf*momentum + d; p -= lr*buf (or lr*d)."""
    for k in range(p.shape[0]):
        d = g[k]
        if has_wd:
            d = d + wd * p[k]
        if has_mom:
            if first:
                b = d
            else:
                b = buf[k] * momentum
                b = b + d
            buf[k] = b
            d = b
        p[k] = p[k] - lr * d


@nb.njit(nogil=True, cache=True, fastmath={"reassoc"})
def _nonfinite_sum(a):
    """sum of a[k] - a[k] over a flat float view: 0 when every value is finite, NaN when one
    is NaN or +-inf (inf - inf = NaN). Only reassociation is allowed (a vectorized sum); x - x
    is not folded to 0 (that needs no-NaN / no-inf), and NaN survives any order."""
    s = a.dtype.type(0)
    for k in range(a.shape[0]):
        s += a[k] - a[k]
    return s


def all_finite(a) -> bool:
    """np.all(np.isfinite(a)) without the bool temporary, split over the step's threads (one read of
    a: `finite_many` for one array)."""
    return finite_many([a])[0]


# pieces of the batched forms below: a step's parameters (62 arrays for ResNet18, 9.4k to 2.4M values)
# cut into pieces of at most PIECE values, all of them one split (one parallel region per pass instead
# of one per array: ~190 regions a step for the checks and the update before)
PIECE = 1 << 18


def _pieces(sizes):
    """(array index, lo, hi) pieces of flat arrays of the given sizes: at most PIECE values each, and
    at least two per thread of the step in all."""
    total = sum(sizes)
    step = max(4096, min(PIECE, -(-total // max(1, 2 * nthreads()))))
    step = -(-step // 4096) * 4096
    return [(i, lo, min(n, lo + step)) for i, n in enumerate(sizes) for lo in range(0, n, step)]


def finite_many(arrays) -> list[bool]:
    """[all_finite(a) for a in arrays] in one split over the step's threads (float32 / float64
    arrays; others through numpy)."""
    out = [True] * len(arrays)
    flats, idx = [], []
    for i, a in enumerate(arrays):
        a = np.asarray(a)
        if a.dtype not in (np.float32, np.float64):
            out[i] = bool(np.all(np.isfinite(a)))
            continue
        flats.append(a.reshape(-1) if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(-1))
        idx.append(i)
    ps = _pieces([f.shape[0] for f in flats])
    sums = [0.0] * len(ps)

    def task(k, tid):
        i, lo, hi = ps[k]
        sums[k] = _nonfinite_sum(flats[i][lo:hi])
    split(len(ps), task)
    for (i, _, _), v in zip(ps, sums):
        if v != 0:
            out[idx[i]] = False
    return out


def sgd_update_many(updates, lr, momentum, weight_decay) -> None:
    """In place, for every (p, g, buf, first) in `updates` (float32, contiguous, each g and buf of p's
    shape; buf None without momentum): the SGD update of parameter p (`_sgd`), all of them in one split
    over the step's threads (each value's update is the same whichever piece runs it)."""
    f32 = np.float32
    flat = [(p.reshape(-1), g.reshape(-1), buf.reshape(-1) if buf is not None else p.reshape(-1),
             buf is not None, bool(first)) for p, g, buf, first in updates]
    ps = _pieces([f[0].shape[0] for f in flat])

    def task(k, tid):
        i, lo, hi = ps[k]
        p1, g1, b1, has_mom, first = flat[i]
        _sgd(p1[lo:hi], g1[lo:hi], b1[lo:hi], f32(lr), f32(momentum), f32(weight_decay),
             weight_decay != 0, has_mom, first)
    split(len(ps), task)
