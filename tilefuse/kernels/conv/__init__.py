"""Fast CPU convolution kernels (issue 3), each a free function next to the reference.

The front door (front.py): `prepare` at compile time, `bind` once per layer -> a validated
callable that runs the layer with its task grid fixed for the thread count; the runtime binds
every conv instruction that way (kernels/registry.bind). The per-call entry points below
(arrays NCHW float32 C-contiguous, `out` preallocated) check their arguments on every call:

    ALGORITHMS                                   names: gemm1x1, direct, winograd2, winograd4, im2col,
                                                 depthwise, grouped
    select_algorithm(x_shape, w_shape, stride, padding, dilation, groups, allow_winograd=True) -> str
    conv2d_prepare(algorithm, w, b, stride, padding, dilation, groups) -> dict[str, np.ndarray]
        compile-time weight packing/transform; {"weight": float32 array, "bias": float32 array}
    conv2d_run(algorithm, out, x, prepared, residual=None, *, stride, padding, dilation, groups,
               relu=False, act=None, threads=None) -> None
        out = act(conv(x) + bias (+ residual)); act an activation of kernels/activations.py as
        (code, alpha, beta) (or a name); relu=True is act relu; threads=None means all cores.

padding is (top, bottom, left, right); stride and dilation are (h, w) pairs (as in
tilefuse.kernels.reference.conv2d, the spec).

The blocked layout the compiler keeps between layers (NCHW16c: (N, ceil(C/16), H, W, 16), padded
channels zero, no spatial padding):

    NCHWC_ALGORITHMS                             gemm1x1, direct, winograd2, winograd4, depthwise, grouped
    conv2d_prepare(algorithm, ..., layout="nchwc")   channel-padded weights and bias
    conv2d_run_nchwc(algorithm, out_b, x_b, prepared, residual_b=None, *, stride, padding,
                     dilation, relu=False, act=None, threads=None)
    to_nchwc / from_nchwc                        conversions (to_nchwc can also pad spatially)
    direct_nchwc                                 direct conv on an already padded blocked input

Grouped convs: `depthwise` (groups == C_in, any multiplier; depthwise.py) and `grouped`
(1 < groups < C_in: groups of 2 / 4 / 8 channels inside one block on grouped_lanes.py, block
groups of the direct kernel otherwise; grouped.py) are NCHW16c kernels (their NCHW
entry points block the input and unblock the output around them); im2col runs every grouped conv.
"""
from __future__ import annotations

import numpy as np

from tilefuse.kernels.conv import depthwise, direct, gemm1x1, grouped, im2col, k1x1, stem, winograd
from tilefuse.kernels.conv.direct import direct_nchwc
from tilefuse.kernels.conv.epilogue import resolve_act
from tilefuse.kernels.conv.front import NCHWC_ALGORITHMS, BoundConv, bind
from tilefuse.kernels.conv.front import pad4 as _pad4
from tilefuse.kernels.conv.front import pair as _pair
from tilefuse.kernels.conv.layout import from_nchwc, nchwc_shape, to_nchwc
from tilefuse.kernels.conv.select import (ALGORITHMS, algorithm_flops, candidates, conv_flops, estimate_cost,
                                          select_algorithm)
from tilefuse.kernels.threads import resolve_threads

__all__ = ["ALGORITHMS", "NCHWC_ALGORITHMS", "prepare", "bind", "BoundConv", "conv2d_run_nchwc",
           "conv2d_run_to_nchwc", "select_algorithm", "candidates", "estimate_cost", "conv_flops", "conv2d_prepare",
           "conv2d_run", "algorithm_flops", "direct_nchwc", "to_nchwc", "from_nchwc", "nchwc_shape"]


def _check_applicable(algorithm, w_shape, stride, padding, dilation, groups):
    cands = candidates((1, w_shape[1] * groups, 1, 1), w_shape, stride, padding, dilation, groups)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown conv algorithm {algorithm!r}; expected one of {ALGORITHMS}")
    if algorithm not in cands:
        raise ValueError(f"conv algorithm {algorithm!r} cannot run weight {tuple(w_shape)} with stride={stride}, "
                         f"padding={padding}, dilation={dilation}, groups={groups}; candidates: {cands}")


def conv2d_prepare(algorithm, w, b, stride, padding, dilation, groups, layout="nchw") -> dict:
    """Pack or transform the constant weights for `algorithm` (run once, at compile time).

    layout "nchwc": the form `conv2d_run_nchwc` takes (channels zero padded to multiples of 16)."""
    stride, padding, dilation = _pair(stride), _pad4(padding), _pair(dilation)
    w = np.asarray(w, np.float32)
    _check_applicable(algorithm, w.shape, stride, padding, dilation, groups)
    if layout not in ("nchw", "nchwc"):
        raise ValueError(f"conv2d_prepare: layout {layout!r} unknown; expected 'nchw' or 'nchwc'")
    if layout == "nchwc":
        if algorithm not in NCHWC_ALGORITHMS:
            raise ValueError(f"conv algorithm {algorithm!r} has no NCHWc form; NCHWc algorithms: {NCHWC_ALGORITHMS}")
        if algorithm == "gemm1x1":
            return k1x1.prepare(w, b)  # numba NCHW16c kernel (gemm1x1.prepare_nchwc: the BLAS form)
    if algorithm == "gemm1x1":
        return gemm1x1.prepare(w, b)
    if algorithm == "depthwise":
        return depthwise.prepare(w, b, groups)   # one form for both layouts (NCHW runs it blocked)
    if algorithm == "grouped":
        return grouped.prepare(w, b, groups)     # the same
    if algorithm == "direct":
        return direct.prepare(w, b)
    if algorithm in ("winograd2", "winograd4"):
        return winograd.prepare(w, b, int(algorithm[-1]))
    return im2col.prepare(w, b, groups)


prepare = conv2d_prepare  # the front door's first half (front.py: bind is the second)


def conv2d_run(algorithm, out, x, prepared, residual=None, *, stride, padding, dilation, groups, relu=False,
               act=None, threads=None) -> None:
    """Compute the conv into `out` (N, Co, Ho, Wo) with the fused epilogue act(conv + bias + residual)."""
    stride, padding, dilation = _pair(stride), _pad4(padding), _pair(dilation)
    act = resolve_act(relu, act, f"conv2d_run({algorithm})")
    threads = resolve_threads(threads)
    for name, a in (("x", x), ("out", out)) + ((("residual", residual),) if residual is not None else ()):
        if a.dtype != np.float32 or not a.flags.c_contiguous or a.ndim != 4:
            raise ValueError(f"conv2d_run({algorithm}): {name} must be a 4-D C-contiguous float32 array, "
                             f"got dtype {a.dtype}, shape {a.shape}, contiguous={a.flags.c_contiguous}")
    if residual is not None and residual.shape != out.shape:
        raise ValueError(f"conv2d_run({algorithm}): residual shape {residual.shape} != output shape {out.shape}")
    if algorithm == "gemm1x1":
        gemm1x1.run(out, x, prepared, residual, stride=stride, act=act, threads=threads)
    elif algorithm == "direct":
        direct.run(out, x, prepared, residual, stride=stride, padding=padding, dilation=dilation, act=act,
                   threads=threads)
    elif algorithm in ("winograd2", "winograd4"):
        winograd.run(out, x, prepared, residual, m=int(algorithm[-1]), padding=padding, act=act, threads=threads)
    elif algorithm == "im2col":
        im2col.run(out, x, prepared, residual, stride=stride, padding=padding, dilation=dilation, groups=groups,
                   act=act, threads=threads)
    elif algorithm == "depthwise":
        depthwise.run(out, x, prepared, residual, stride=stride, padding=padding, dilation=dilation, act=act,
                      threads=threads)
    elif algorithm == "grouped":
        grouped.run(out, x, prepared, residual, stride=stride, padding=padding, dilation=dilation, act=act,
                    threads=threads)
    else:
        raise ValueError(f"unknown conv algorithm {algorithm!r}; expected one of {ALGORITHMS}")


def conv2d_run_to_nchwc(algorithm, out_b, x, prepared, residual_b=None, *, stride, padding, dilation, relu=False,
                        act=None, threads=None, groups=1) -> None:
    """NCHW input, NCHW16c output (im2col, groups=1): a first layer feeding blocked layers."""
    stride, padding, dilation = _pair(stride), _pad4(padding), _pair(dilation)
    act = resolve_act(relu, act, f"conv2d_run_to_nchwc({algorithm})")
    if algorithm != "im2col" or groups != 1:
        raise ValueError(f"conv2d_run_to_nchwc: only im2col with groups=1, got {algorithm!r}, groups={groups}")
    x = np.ascontiguousarray(x, np.float32)
    # few input channels (the 3-channel stems): the register-blocked numba stem kernel (stem.py),
    # 2-3x faster than im2col + GEMM + scatter; its packed weights come with im2col's prepared ones
    f = stem.run_to_nchwc if stem.applies(x.shape[1], groups) and "stem_weight" in prepared else im2col.run_to_nchwc
    f(out_b, x, prepared, residual_b, stride=stride, padding=padding, dilation=dilation, act=act,
      threads=resolve_threads(threads))


def conv2d_run_nchwc(algorithm, out_b, x_b, prepared, residual_b=None, *, stride, padding, dilation, relu=False,
                     act=None, threads=None, groups=1) -> None:
    """The conv on NCHW16c tensors: x_b (N, Cb, H, W, 16) unpadded -> out_b (N, Ob, Ho, Wo, 16).

    `prepared` comes from conv2d_prepare(..., layout="nchwc"); padded output channels come out 0
    (zero weights and bias; a residual's padded channels are 0 too, so they stay 0 after ReLU).
    An activation with act(0) != 0 (sigmoid, hardsigmoid, a clip excluding 0, ...) writes act(0)
    into the padded channels; the next layer's weights for them are zero, so no result depends on it."""
    stride, padding, dilation = _pair(stride), _pad4(padding), _pair(dilation)
    act = resolve_act(relu, act, f"conv2d_run_nchwc({algorithm})")
    threads = resolve_threads(threads)
    for name, a in (("x", x_b), ("out", out_b)) + ((("residual", residual_b),) if residual_b is not None else ()):
        if a.dtype != np.float32 or not a.flags.c_contiguous or a.ndim != 5 or a.shape[-1] != 16:
            raise ValueError(f"conv2d_run_nchwc({algorithm}): {name} must be a C-contiguous float32 "
                             f"(N, C/16, H, W, 16) array, got dtype {a.dtype}, shape {a.shape}")
    if residual_b is not None and residual_b.shape != out_b.shape:
        raise ValueError(f"conv2d_run_nchwc({algorithm}): residual shape {residual_b.shape} != output shape "
                         f"{out_b.shape}")
    if groups != 1 and algorithm not in ("depthwise", "grouped"):
        raise ValueError(f"conv2d_run_nchwc({algorithm}): groups={groups}; the NCHWc forms of {algorithm} need "
                         f"groups=1 (grouped convs run 'depthwise' or 'grouped')")
    if algorithm == "depthwise":
        depthwise.run_nchwc(out_b, x_b, prepared, residual_b, stride=stride, padding=padding, dilation=dilation,
                            act=act, threads=threads)
    elif algorithm == "grouped":
        grouped.run_nchwc(out_b, x_b, prepared, residual_b, stride=stride, padding=padding, dilation=dilation,
                          act=act, threads=threads)
    elif algorithm == "gemm1x1":
        k1x1.run_nchwc(out_b, x_b, prepared, residual_b, stride=stride, act=act, threads=threads)
    elif algorithm == "direct":
        direct.run_nchwc(out_b, x_b, prepared, residual_b, stride=stride, padding=padding, dilation=dilation,
                         act=act, threads=threads)
    elif algorithm in ("winograd2", "winograd4"):
        winograd.run_nchwc(out_b, x_b, prepared, residual_b, m=int(algorithm[-1]), padding=padding, act=act,
                           threads=threads)
    else:
        raise ValueError(f"conv algorithm {algorithm!r} has no NCHWc form; NCHWc algorithms: {NCHWC_ALGORITHMS}")
