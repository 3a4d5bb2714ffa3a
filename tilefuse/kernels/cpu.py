"""The CPU kernel registry: instruction kernel name -> function(out, *inputs, **params).

A compiled program's instructions name their kernel; the runtime looks it up here and calls it
with views of device memory, so every kernel writes its result into `out` in place. Conv2d
dispatches on the `algorithm` the compiler chose (`kernels/conv`); the other ops use
vectorized numpy, bit-compatible with `reference.py` or within its stated tolerance.
"""
from __future__ import annotations

import numpy as np

from . import reference as ref


def _conv2d(out, x, *args, stride, padding, dilation, groups, has_bias, has_residual, relu,
            algorithm="reference", prepared=(), threads=None, **_):
    args = list(args)
    if algorithm == "reference":
        w = args.pop(0)
        b = args.pop(0) if has_bias else None
        res = args.pop(0) if has_residual else None
        out[...] = ref.conv2d(x, w, b, stride, padding, dilation, groups, residual=res, relu=relu)
        return
    from .conv import conv2d_run
    prep = {k: args.pop(0) for k in prepared}
    res = args.pop(0) if has_residual else None
    conv2d_run(algorithm, out, x, prep, res, stride=stride, padding=padding, dilation=dilation,
               groups=groups, relu=relu, threads=threads)


def _scale(out, x, alpha, beta):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    np.multiply(x, alpha.reshape(shape), out=out)
    out += beta.reshape(shape)


def _relu(out, x):
    np.maximum(x, 0, out=out)


def _add(out, a, b, relu=False):
    np.add(a, b, out=out)
    if relu:
        np.maximum(out, 0, out=out)


def _linear(out, x, w, *b, has_bias, relu):
    np.matmul(x, w.T, out=out)
    if has_bias:
        out += b[0]
    if relu:
        np.maximum(out, 0, out=out)


def _global_avg_pool(out, x):
    acc = np.float64 if x.dtype == np.float64 else np.float32
    out[...] = x.mean(axis=(2, 3), keepdims=True, dtype=acc)


def _copy_reshape(out, x, **_):
    out.reshape(-1)[...] = x.reshape(-1)


def _wrap(fn):
    """Adapt a reference kernel (returns a new array) to the in-place convention."""
    def k(out, *ins, **params):
        out[...] = fn(*ins, **params)
    k.__name__ = getattr(fn, "__name__", "kernel")
    return k


KERNELS = {
    "conv2d": _conv2d,
    "batch_norm": _wrap(lambda x, g, b, m, v, eps: ref.batch_norm(x, g, b, m, v, eps)),
    "scale": _scale,
    "relu": _relu,
    "add": _add,
    "max_pool": _wrap(ref.max_pool),
    "avg_pool": _wrap(ref.avg_pool),
    "global_avg_pool": _global_avg_pool,
    "linear": _linear,
    "flatten": _copy_reshape,
    "dropout": _copy_reshape,
    "softmax": _wrap(lambda x, axis: ref.softmax(x, axis)),
    "local_response_norm": _wrap(ref.local_response_norm),
    "concat": _wrap(lambda *xs, axis: ref.concat(*xs, axis=axis)),
}
