"""Element-wise runtime kernels: activations, PReLU, add/sub/mul/div/maximum/minimum with NumPy broadcasting.

Every kernel writes `out` in place (the registry convention, `fn(out, *inputs, **params)`) and
takes the IR's params; the activation is the triple of the shared table
(`kernels/activations.py`), applied by `apply_span` (one vectorized loop per code) over a chunk or row the op's
loop has just written. Each op's loop is specialized too (one loop per kind or comparison, a literal in each;
views from the chunk's start): a kind or a code read inside a loop, or an index that numba wraps when negative,
keeps the loop scalar (6-11x slower than numpy's ufuncs before; benchmarks/RESULTS.md, thirty-fifth session).

Layouts: NCHW, and NCHW16c ("nchwc", (N, C/16, H, W, 16)) for the layout pass's blocked
tensors. In NCHW16c the padded channels must stay zero (the blocked convs and the global pool
rely on it), so a kernel whose result may be non-zero there (an activation not mapping 0 to 0,
a binary op, PReLU) rewrites the padded lanes to zero. A per-channel operand of a blocked binary op or of
PReLU is an NCHW (.., C, 1, 1) / (C,) array, read with channel c = block*16 + lane.

float32 runs the numba loops (tasks of fixed size on the conv thread pool: results do not depend
on the thread count); other dtypes run the numpy reference.
"""
from __future__ import annotations

import math

import numpy as np
from numba import carray as nb_carray, njit, types
from numba.extending import overload

from . import activations as A
from .conv._nb import atomic_add, stack_f32
from .fpflags import FAST
from . import reference as ref
from .threads import parallel_for, pool_region

CHUNK = 1 << 16  # elements per task


def _code(act, relu=False):
    """(code, alpha, beta) float32-ready from an IR act triple (relu=True: the relu code)."""
    if act is None or act[0] == "identity":
        return A.encode("relu") if relu else A.IDENTITY
    return A.encode(act[0], act[1], act[2])


@njit(nogil=True, cache=True, fastmath=FAST)
def _act_flat(out, x, i0, i1, code, alpha, beta):
    o, v = out[i0:i1], x[i0:i1]     # views from i0: no negative-index wraparound code, the loops vectorize
    for i in range(o.size):
        o[i] = v[i]
    A.apply_span(o, 0, o.size, code, np.float32(alpha), np.float32(beta))   # one vectorized loop per code


# The flat kernels' task loops (threads.pool_region): chunks of CHUNK values taken from `counter` inside numba,
# one worker per thread; a Python task per chunk cost ~5-30 us each on the pool (a 393K-value add took longer on
# two threads than on one).
@njit(nogil=True, cache=True)
def _act_seq(counter, tid, out, x, code, alpha, beta):
    while True:
        i0 = atomic_add(counter, 0, 1) * CHUNK
        if i0 >= out.size:
            break
        _act_flat(out, x, i0, min(out.size, i0 + CHUNK), code, alpha, beta)


def _flat_tasks(n):
    return -(-n // CHUNK)


@njit(nogil=True, cache=True)
def _zero_pad_lanes(out5, channels):
    """out5 (N, Cb, H, W, 16): lanes of channels >= `channels` set to 0 (last block only)."""
    n_, cb, h_, w_, _ = out5.shape
    l0 = channels - (cb - 1) * 16
    if l0 >= 16:
        return
    for n in range(n_):
        for h in range(h_):
            for w in range(w_):
                for l in range(l0, 16):
                    out5[n, cb - 1, h, w, l] = 0.0


def _fix_padding(out, layout, channels, code, alpha, beta, always=False):
    """Blocked outputs: padded lanes back to zero when the op may have made them non-zero."""
    if layout != "nchwc" or channels is None:
        return
    if always or A.apply_scalar(code, np.float32(0.0), np.float32(alpha), np.float32(beta)) != 0.0:
        _zero_pad_lanes(out, int(channels))


def apply_act_inplace(out, code, alpha, beta, threads=None):
    """out[...] = act(out) over a contiguous float32 array, in fixed chunks on the thread pool."""
    if code == 0:
        return
    o = out.reshape(-1)
    pool_region(_act_seq, threads, _flat_tasks(o.size), o, o, code, np.float32(alpha), np.float32(beta))


def activation(out, x, *, act, layout="nchw", channels=None, threads=None, **_):
    """out = act(x), any shape and layout."""
    if out.dtype != np.float32:
        out[...] = ref.activation(x, act)
        return
    code, a, b = _code(act)
    o, xf = out.reshape(-1), x.reshape(-1)
    pool_region(_act_seq, threads, _flat_tasks(o.size), o, xf, code, np.float32(a), np.float32(b))
    _fix_padding(out, layout, channels, code, a, b)


# prelu ---------------------------------------------------------------------------------------

@njit(nogil=True, cache=True, fastmath=FAST)
def _prelu_planes(out3, x3, slope, n, lanes):
    """x3 (N, C', S) rows; channel of row j, position p: j (lanes=1) or j*16 + p % 16 (blocked)."""
    C, S = x3.shape[1], x3.shape[2]
    nsl = slope.size
    for j in range(C):
        for p in range(S):
            c = j if lanes == 1 else j * 16 + p % 16
            s = slope[0] if nsl == 1 else (slope[c] if c < nsl else np.float32(0.0))
            v = x3[n, j, p]
            out3[n, j, p] = v if v > 0 else s * v


def prelu(out, x, slope, *, layout="nchw", channels=None, threads=None, **_):
    """out = x if x > 0 else slope[c] * x (channel axis 1; slope (C,) or (1,))."""
    if out.dtype != np.float32 or x.ndim < 2:
        out[...] = ref.prelu(x, slope)
        return
    n, c = x.shape[0], x.shape[1]
    # (N, C, ...) -> (N, C, S); blocked (N, Cb, H, W, 16) -> (N, Cb, H*W*16)
    x3, o3 = x.reshape(n, c, -1), out.reshape(n, c, -1)
    lanes = 16 if layout == "nchwc" else 1
    s = np.ascontiguousarray(slope, np.float32).reshape(-1)
    parallel_for(lambda i: _prelu_planes(o3, x3, s, i, lanes), range(n), threads)
    _fix_padding(out, layout, channels, 0, 0.0, 0.0, always=True)


# binary ops --------------------------------------------------------------------------------

_UFUNC = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "maximum": np.maximum,
          "minimum": np.minimum, "atan2": np.arctan2}
_KIND = {"add": 0, "sub": 1, "mul": 2, "div": 3, "maximum": 4, "minimum": 5, "atan2": 6}


@njit(inline="always")
def _op(kind, a, b):
    """a (kind) b; maximum / minimum give NaN when either operand is NaN (torch.maximum's, np.maximum's)."""
    if kind == 0:
        return a + b
    if kind == 1:
        return a - b
    if kind == 2:
        return a * b
    if kind == 3:
        return a / b
    if kind == 4:
        return a if a > b or a != a else b
    if kind == 5:
        return a if a < b or a != a else b
    return math.atan2(a, b)         # libm's atan2f / atan2 (a scalar call: this loop does not vectorize)


@njit(inline="always")
def _op_loop(o, x, y, kind):
    for i in range(o.size):
        o[i] = _op(kind, x[i], y[i])


@njit(nogil=True, cache=True, fastmath=FAST, error_model="numpy")   # x / 0 is inf, as in NumPy and PyTorch
def _binary_flat(out, a, b, i0, i1, kind, code, alpha, beta):
    """out[i0:i1] = act(a (kind) b): one loop per kind (a literal in each, so each vectorizes; a kind and a code
    read inside one loop kept it scalar: 393K adds on one Zen 5 core 0.39 -> 0.05 ms), then the activation in
    place over the chunk (in cache; `apply_span`, one loop per code)."""
    o, x, y = out[i0:i1], a[i0:i1], b[i0:i1]     # views from i0: no negative-index wraparound code
    if kind == 0:
        _op_loop(o, x, y, 0)
    elif kind == 1:
        _op_loop(o, x, y, 1)
    elif kind == 2:
        _op_loop(o, x, y, 2)
    elif kind == 3:
        _op_loop(o, x, y, 3)
    elif kind == 4:
        _op_loop(o, x, y, 4)
    elif kind == 5:
        _op_loop(o, x, y, 5)
    else:
        _op_loop(o, x, y, 6)
    A.apply_span(o, 0, o.size, code, np.float32(alpha), np.float32(beta))


@njit(inline="always")
def _channel_row(o, x, sv, kind, swap, lanes):
    """o = x (kind) sv over one channel row (NCHW: sv[0] for all; NCHW16c: lane l of each position takes sv[l])."""
    if lanes == 16:
        for q in range(o.size // 16):
            for l in range(16):
                xv = x[q * 16 + l]
                o[q * 16 + l] = _op(kind, sv[l], xv) if swap else _op(kind, xv, sv[l])
    else:
        v = sv[0]
        for p in range(o.size):
            o[p] = _op(kind, v, x[p]) if swap else _op(kind, x[p], v)


@njit(nogil=True, cache=True)
def _binary_seq(counter, tid, out, a, b, kind, code, alpha, beta):
    while True:
        i0 = atomic_add(counter, 0, 1) * CHUNK
        if i0 >= out.size:
            break
        _binary_flat(out, a, b, i0, min(out.size, i0 + CHUNK), kind, code, alpha, beta)


@njit(nogil=True, cache=True, fastmath=FAST, error_model="numpy")
def _binary_channel(out3, x3, s, n, kind, swap, lanes, code, alpha, beta):
    """out (N, C', S) = x (op) s[n, c] (a per-image, per-channel operand s (Ns, C)); swap: s (op) x. A row (one
    channel, or one block of 16) at a time: the operand's values in a stack vector, one loop per kind (a literal:
    the loop vectorizes; a kind and a code read in the loop kept it scalar, 8 x 192 @ 56x56 on one Zen 5 core
    7.0 -> 0.77 ms, numpy's broadcast 1.2), then the activation over the row in place (`apply_span`)."""
    C = x3.shape[1]
    al, be = np.float32(alpha), np.float32(beta)
    ns, cs = s.shape
    row = n if ns > 1 else 0
    sv = nb_carray(stack_f32(16), 16)
    for j in range(C):
        for l in range(lanes):
            c = j if lanes == 1 else j * 16 + l
            sv[l] = s[row, 0] if cs == 1 else (s[row, c] if c < cs else np.float32(0.0))
        o, x = out3[n, j], x3[n, j]
        if kind == 0:
            _channel_row(o, x, sv, 0, swap, lanes)
        elif kind == 1:
            _channel_row(o, x, sv, 1, swap, lanes)
        elif kind == 2:
            _channel_row(o, x, sv, 2, swap, lanes)
        elif kind == 3:
            _channel_row(o, x, sv, 3, swap, lanes)
        elif kind == 4:
            _channel_row(o, x, sv, 4, swap, lanes)
        elif kind == 5:
            _channel_row(o, x, sv, 5, swap, lanes)
        else:
            _channel_row(o, x, sv, 6, swap, lanes)
        A.apply_span(o, 0, o.size, code, al, be)


def channel_operand(full_shape, other_shape, layout="nchw"):
    """True when `other` is a per-channel operand (N or 1, C, 1, 1) / (C, 1, 1) of a 4-D tensor: NCHW (4-D) or
    NCHW16c (5-D, layout "nchwc"). A 5-D NCHW tensor is no NCHW: a (C, 1, 1) operand broadcasts over its axes 2-4
    (the fast path read it as channels and was wrong where axis 1 had the same size, PRelu of a rank-5 input)."""
    if len(full_shape) != (5 if layout == "nchwc" else 4) or len(other_shape) > 4:
        return False
    c = full_shape[1] if layout != "nchwc" else None
    s = (1,) * (4 - len(other_shape)) + tuple(other_shape)
    if s[2:] != (1, 1) or s[0] not in (1, full_shape[0]):
        return False
    return c is None or s[1] in (1, c)


def binary(kind, out, a, b, *, relu=False, act=None, layout="nchw", channels=None, threads=None, **_):
    """out = act(a (kind) b) with broadcasting. Fast paths (float32): equal shapes (one flat loop)
    and a per-channel operand (the squeeze-excitation scale, a bias) without materializing it;
    anything else a numpy ufunc into `out`, then the activation in place."""
    code, al, be = _code(act, relu)
    if out.dtype != np.float32:
        out[...] = ref.binary(kind, a, b, relu, act)
        return
    if a.shape == out.shape and b.shape == out.shape:
        o, x, y = out.reshape(-1), a.reshape(-1), b.reshape(-1)
        pool_region(_binary_seq, threads, _flat_tasks(o.size), o, x, y, _KIND[kind], code,
                     np.float32(al), np.float32(be))
        _fix_padding(out, layout, channels, code, al, be, always=True)   # 0/0 in padded lanes of a div
        return
    for full, other, swap in ((a, b, False), (b, a, True)):
        if full.shape == out.shape and channel_operand(full.shape, other.shape, layout):
            n, cb = full.shape[0], full.shape[1]
            s = np.ascontiguousarray(other, np.float32)
            s2 = s.reshape(s.shape[0] if s.ndim == 4 else 1, -1)   # (Ns, C, 1, 1) -> (Ns, C)
            x3, o3 = full.reshape(n, cb, -1), out.reshape(n, cb, -1)
            lanes = 16 if layout == "nchwc" else 1
            parallel_for(lambda i: _binary_channel(o3, x3, s2, i, _KIND[kind], swap, lanes, code, al, be),
                         range(n), threads)
            _fix_padding(out, layout, channels, code, al, be, always=True)
            return
    if layout == "nchwc":
        raise ValueError(f"{kind}: blocked operands of shapes {a.shape} and {b.shape} are not supported; "
                         f"expected equal shapes or a per-channel operand")
    _UFUNC[kind](a, b, out=out)
    apply_act_inplace(out, code, al, be, threads)


# where (l cmp r) a else b ---------------------------------------------------------------------

_CMP_CODE = {"gt": 0, "ge": 1, "lt": 2, "le": 3, "eq": 4, "ne": 5}


@njit(inline="always")
def _cmp(cmp, x, y):
    if cmp == 0:
        return x > y
    if cmp == 1:
        return x >= y
    if cmp == 2:
        return x < y
    if cmp == 3:
        return x <= y
    if cmp == 4:
        return x == y
    return x != y


def _at(v, i):
    """v[i] for an array, v for a scalar (numba: a separate specialization per operand kind, no test in the loop)."""


@overload(_at, inline="always")
def _at_impl(v, i):
    if isinstance(v, types.Array):
        return lambda v, i: v[i]
    return lambda v, i: v


def _part(v, i0, i1):
    """v[i0:i1] for an array (a view from i0: no negative-index wraparound code in the loop), v for a scalar."""


@overload(_part, inline="always")
def _part_impl(v, i0, i1):
    if isinstance(v, types.Array):
        return lambda v, i0, i1: v[i0:i1]
    return lambda v, i0, i1: v


@njit(inline="always")
def _where_loop(out, l, r, a, b, cmp):
    for i in range(out.size):
        out[i] = _at(a, i) if _cmp(cmp, _at(l, i), _at(r, i)) else _at(b, i)


@njit(nogil=True, cache=True)       # no fastmath: comparisons with NaN as IEEE (false, ne true)
def _where_flat(out, l, r, a, b, i0, i1, cmp):
    """out[i] = a[i] if l[i] cmp r[i] else b[i] for i in [i0, i1); each of l, r, a, b an array or a float32
    scalar (one specialization each combination: no test in the loop) and one loop per comparison, so each
    vectorizes (393K values on one Zen 5 core: 1.63 -> 0.15 ms)."""
    l, r, a, b, o = _part(l, i0, i1), _part(r, i0, i1), _part(a, i0, i1), _part(b, i0, i1), out[i0:i1]
    if cmp == 0:
        _where_loop(o, l, r, a, b, 0)
    elif cmp == 1:
        _where_loop(o, l, r, a, b, 1)
    elif cmp == 2:
        _where_loop(o, l, r, a, b, 2)
    elif cmp == 3:
        _where_loop(o, l, r, a, b, 3)
    elif cmp == 4:
        _where_loop(o, l, r, a, b, 4)
    else:
        _where_loop(o, l, r, a, b, 5)


@njit(nogil=True, cache=True)
def _where_seq(counter, tid, out, l, r, a, b, cmp):
    while True:
        i0 = atomic_add(counter, 0, 1) * CHUNK
        if i0 >= out.size:
            break
        _where_flat(out, l, r, a, b, i0, min(out.size, i0 + CHUNK), cmp)


def where(out, l, r, a, b, *, cmp="gt", threads=None, **_):
    """out = a where (l cmp r) else b (broadcasting). One flat loop when every operand has the output's shape or
    is a single value (Hardshrink, Threshold, torch.where(x > 0, x, 0.1 * x)); any other broadcast through
    the reference (numpy)."""
    ops = (l, r, a, b)
    if out.dtype == np.float32 and out.flags.c_contiguous and \
            all(v.dtype == np.float32 and (v.size == 1 or v.shape == out.shape) for v in ops):
        o = out.reshape(-1)
        fl = [np.float32(v.reshape(-1)[0]) if v.size == 1 else np.ascontiguousarray(v).reshape(-1) for v in ops]
        pool_region(_where_seq, threads, _flat_tasks(o.size), o, *fl, _CMP_CODE[cmp])
        return
    out[...] = ref.where(l, r, a, b, cmp)


def _binary_kernel(kind):
    def k(out, a, b, **p):
        binary(kind, out, a, b, **p)
    k.__name__ = kind
    return k


KERNELS = {
    "activation": activation,
    "prelu": prelu,
    "add": _binary_kernel("add"),
    "sub": _binary_kernel("sub"),
    "mul": _binary_kernel("mul"),
    "div": _binary_kernel("div"),
    "maximum": _binary_kernel("maximum"),
    "minimum": _binary_kernel("minimum"),
    "atan2": _binary_kernel("atan2"),
    "where": where,
}
THREADED = frozenset(KERNELS)
ACT_KERNELS = frozenset({"activation", "add", "sub", "mul", "div", "maximum", "minimum", "atan2"})   # they apply act
BLOCKED = frozenset(KERNELS) - {"where"}   # the kernels here with an NCHW16c form
