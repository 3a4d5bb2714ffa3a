"""The CPU kernel registry: instruction kernel name -> function(out, *inputs, **params).

A compiled program's instructions name their kernel; the runtime looks it up here and calls it
with views of device memory, so every kernel writes its result into `out` in place. Conv2d
dispatches on the `algorithm` the compiler chose (`kernels/conv`); pooling, element-wise,
linear and softmax use the numba kernels of `fast_misc.py`; the rest vectorized numpy, all
within the tolerance `tests/` states against `reference.py`.

Instructions the layout pass (compiler/layout.py) moved to NCHW16c carry params["layout"] =
"nchwc" and get blocked (N, C/16, H, W, 16) views; `to_nchwc` / `from_nchwc` convert.
Kernels in THREADED take `threads` (the session's thread count) as a parameter.
"""
from __future__ import annotations

import numpy as np

from . import fast_misc as fm
from . import reference as ref


def _conv2d(out, x, *args, stride, padding, dilation, groups, has_bias, has_residual, relu,
            algorithm="reference", prepared=(), threads=None, layout="nchw", out_layout=None, **_):
    args = list(args)
    if layout == "nchw" and out_layout == "nchwc":
        from .conv import conv2d_run_to_nchwc
        prep = {k: args.pop(0) for k in prepared}
        res = args.pop(0) if has_residual else None
        conv2d_run_to_nchwc(algorithm, out, x, prep, res, stride=stride, padding=padding, dilation=dilation,
                            groups=groups, relu=relu, threads=threads)
        return
    if layout == "nchwc":
        from .conv import conv2d_run_nchwc
        prep = {k: args.pop(0) for k in prepared}
        res = args.pop(0) if has_residual else None
        conv2d_run_nchwc(algorithm, out, x, prep, res, stride=stride, padding=padding, dilation=dilation,
                         groups=groups, relu=relu, threads=threads)
        return
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


def _to_nchwc(out, x, channels=None, threads=None, **_):
    from .conv import to_nchwc
    to_nchwc(x, out=out, threads=threads)


def _from_nchwc(out, xb, channels, threads=None, **_):
    from .conv import from_nchwc
    from_nchwc(xb, channels, out=out, threads=threads)


def _max_pool(out, x, **p):
    if x.dtype != np.float32:
        out[...] = ref.max_pool(x, **{k: v for k, v in p.items() if k not in ("layout", "threads")})
        return
    fm.max_pool(out, x, **p)


def _avg_pool(out, x, **p):
    if x.dtype != np.float32:
        out[...] = ref.avg_pool(x, **{k: v for k, v in p.items() if k not in ("layout", "threads")})
        return
    fm.avg_pool(out, x, **p)


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
    "scale": fm.scale,
    "relu": fm.relu,
    "add": fm.add,
    "max_pool": _max_pool,
    "avg_pool": _avg_pool,
    "global_avg_pool": fm.global_avg_pool,
    "linear": fm.linear,
    "flatten": _copy_reshape,
    "dropout": _copy_reshape,
    "softmax": fm.softmax,
    "local_response_norm": _wrap(ref.local_response_norm),
    "concat": _wrap(lambda *xs, axis: ref.concat(*xs, axis=axis)),
    "to_nchwc": _to_nchwc,
    "from_nchwc": _from_nchwc,
}

# kernels that take the session's thread count as params["threads"]
THREADED = frozenset({"conv2d", "max_pool", "avg_pool", "global_avg_pool", "add", "relu", "to_nchwc",
                      "from_nchwc", "linear"})
