"""Fast CPU convolution kernels (issue 3), each a free function next to the reference.

The runtime calls exactly this interface (arrays NCHW float32 C-contiguous, `out` preallocated):

    ALGORITHMS                                   names: gemm1x1, direct, winograd2, winograd4, im2col
    select_algorithm(x_shape, w_shape, stride, padding, dilation, groups, allow_winograd=True) -> str
    conv2d_prepare(algorithm, w, b, stride, padding, dilation, groups) -> dict[str, np.ndarray]
        compile-time weight packing/transform; {"weight": float32 array, "bias": float32 array}
    conv2d_run(algorithm, out, x, prepared, residual=None, *, stride, padding, dilation, groups,
               relu, threads=None) -> None
        out = conv(x) + bias (+ residual), ReLU if relu; threads=None means all cores.

padding is (top, bottom, left, right); stride and dilation are (h, w) pairs (as in
tilefuse.kernels.reference.conv2d, the spec). NCHWc-native entry points: `direct_nchwc`,
`to_nchwc`, `from_nchwc`.
"""
from __future__ import annotations

import numpy as np

from tilefuse.kernels.conv import direct, gemm1x1, im2col, winograd
from tilefuse.kernels.conv.direct import direct_nchwc
from tilefuse.kernels.conv.layout import from_nchwc, nchwc_shape, to_nchwc
from tilefuse.kernels.conv.select import (ALGORITHMS, algorithm_flops, candidates, conv_flops, estimate_cost,
                                          select_algorithm)
from tilefuse.kernels.conv.threads import resolve_threads

__all__ = ["ALGORITHMS", "select_algorithm", "candidates", "estimate_cost", "conv_flops", "conv2d_prepare",
           "conv2d_run", "algorithm_flops", "direct_nchwc", "to_nchwc", "from_nchwc", "nchwc_shape"]


def _pair(v):
    return (int(v), int(v)) if np.isscalar(v) else tuple(int(i) for i in v)


def _pad4(p):
    if np.isscalar(p):
        return (int(p),) * 4
    p = tuple(int(i) for i in p)
    return p if len(p) == 4 else (p[0], p[0], p[1], p[1])


def _check_applicable(algorithm, w_shape, stride, padding, dilation, groups):
    cands = candidates((1, w_shape[1] * groups, 1, 1), w_shape, stride, padding, dilation, groups)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown conv algorithm {algorithm!r}; expected one of {ALGORITHMS}")
    if algorithm not in cands:
        raise ValueError(f"conv algorithm {algorithm!r} cannot run weight {tuple(w_shape)} with stride={stride}, "
                         f"padding={padding}, dilation={dilation}, groups={groups}; candidates: {cands}")


def conv2d_prepare(algorithm, w, b, stride, padding, dilation, groups) -> dict:
    """Pack or transform the constant weights for `algorithm` (run once, at compile time)."""
    stride, padding, dilation = _pair(stride), _pad4(padding), _pair(dilation)
    w = np.asarray(w, np.float32)
    _check_applicable(algorithm, w.shape, stride, padding, dilation, groups)
    if algorithm == "gemm1x1":
        return gemm1x1.prepare(w, b)
    if algorithm == "direct":
        return direct.prepare(w, b)
    if algorithm in ("winograd2", "winograd4"):
        return winograd.prepare(w, b, int(algorithm[-1]))
    return im2col.prepare(w, b, groups)


def conv2d_run(algorithm, out, x, prepared, residual=None, *, stride, padding, dilation, groups, relu,
               threads=None) -> None:
    """Compute the conv into `out` (N, Co, Ho, Wo) with the fused epilogue."""
    stride, padding, dilation = _pair(stride), _pad4(padding), _pair(dilation)
    threads = resolve_threads(threads)
    for name, a in (("x", x), ("out", out)) + ((("residual", residual),) if residual is not None else ()):
        if a.dtype != np.float32 or not a.flags.c_contiguous or a.ndim != 4:
            raise ValueError(f"conv2d_run({algorithm}): {name} must be a 4-D C-contiguous float32 array, "
                             f"got dtype {a.dtype}, shape {a.shape}, contiguous={a.flags.c_contiguous}")
    if residual is not None and residual.shape != out.shape:
        raise ValueError(f"conv2d_run({algorithm}): residual shape {residual.shape} != output shape {out.shape}")
    if algorithm == "gemm1x1":
        gemm1x1.run(out, x, prepared, residual, stride=stride, relu=relu, threads=threads)
    elif algorithm == "direct":
        direct.run(out, x, prepared, residual, stride=stride, padding=padding, dilation=dilation, relu=relu,
                   threads=threads)
    elif algorithm in ("winograd2", "winograd4"):
        winograd.run(out, x, prepared, residual, m=int(algorithm[-1]), padding=padding, relu=relu, threads=threads)
    elif algorithm == "im2col":
        im2col.run(out, x, prepared, residual, stride=stride, padding=padding, dilation=dilation, groups=groups,
                   relu=relu, threads=threads)
    else:
        raise ValueError(f"unknown conv algorithm {algorithm!r}; expected one of {ALGORITHMS}")
