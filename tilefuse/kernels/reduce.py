"""Reduction runtime kernels: mean / sum / max over axes, argmax / argmin and the running sum (cumsum) along one,
adaptive average and max pooling to any size.

NCHW (any rank) only; the layout pass keeps their inputs NCHW. Global average pooling (mean
over H and W with keepdim) is canonicalized by the importers to the `global_avg_pool` op, which
has its own blocked kernel (kernels/pool.py). Accumulation in float32 (float64 for float64),
numpy's pairwise summation: within 1e-6 relative of the reference.
"""
from __future__ import annotations

import numpy as np

from . import reference as ref


def _reduce(kind):
    def k(out, x, *, axes, keepdim=False, **_):
        axes = tuple(a % x.ndim for a in axes)
        if kind == "max":      # NaN propagates (np.max), as torch.amax and ONNX Runtime's ReduceMax
            out[...] = np.max(x, axis=axes, keepdims=True).reshape(out.shape)
            return
        f = np.mean if kind == "mean" else np.sum
        acc = np.float64 if x.dtype == np.float64 else np.float32
        # (.., reduced axes, ..) -> out's shape (keepdim or not: same element order)
        out[...] = f(x, axis=axes, dtype=acc, keepdims=True).reshape(out.shape)
    k.__name__ = kind
    return k


def adaptive_avg_pool(out, x, *, output_size, **_):
    """PyTorch's adaptive windows; prefix sums per axis (ref.adaptive_avg_pool)."""
    out[...] = ref.adaptive_avg_pool(x, tuple(output_size))


def adaptive_max_pool(out, x, *, output_size, **_):
    """PyTorch's adaptive windows, rows then columns (ref.adaptive_max_pool)."""
    out[...] = ref.adaptive_max_pool(x, tuple(output_size))


def argmax(out, x, *, axis, keepdim=False, largest=True, select_last=False, **_):
    """np.argmax / np.argmin along the axis (the first extreme; a NaN is the extreme, its first), on the reversed
    axis for select_last; the indices written as floats (exact: ops.py bounds the axis)."""
    v = x[(slice(None),) * (axis % x.ndim) + (slice(None, None, -1),)] if select_last else x
    idx = (np.argmax if largest else np.argmin)(v, axis=axis)
    if select_last:
        idx = x.shape[axis] - 1 - idx
    out[...] = idx.reshape(out.shape)


def cumsum(out, x, *, axis, exclusive=False, reverse=False, **_):
    """The running sum along the axis in float64 (np.cumsum; ref.cumsum, the same bits)."""
    out[...] = ref.cumsum(x, axis, exclusive, reverse)


KERNELS = {"mean": _reduce("mean"), "sum": _reduce("sum"), "max": _reduce("max"),
           "adaptive_avg_pool": adaptive_avg_pool, "adaptive_max_pool": adaptive_max_pool, "argmax": argmax,
           "cumsum": cumsum}
THREADED: frozenset = frozenset()
BLOCKED = frozenset()
