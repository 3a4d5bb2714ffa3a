"""Convolution with a per-image input channel scale: the fused squeeze-excitation multiply.

    y[n] = act(conv(x[n] * s[n], w) + b (+ residual))        s (N, C, 1, 1)

For a 1x1 conv (stride 1, no padding, groups 1: the projection after the squeeze-excitation
of MobileNetV3 / EfficientNet / RegNetY), the scale moves onto the weights instead of the
activation: out[n] (O, H*W) = (w (O, C) * s[n] (1, C)) @ x[n] (C, H*W), so the scaled tensor
x * s (N*C*H*W values) is never written or read; the per-image weight copy is O*C values.
One OpenBLAS GEMM per image (tasks on the conv pool, BLAS at one thread), then bias, residual
and the activation in place. Other convs scale the input into a scratch buffer first and run
the reference conv (correct, not fast). Tolerance against the reference (which scales x
first): the products are associated differently, within 1e-5 relative.
"""
from __future__ import annotations

import numpy as np

from . import reference as ref
from .broadcast import _code, apply_act_inplace
from .threads import blas_threads, parallel_for


def conv2d_input_scaled(out, x, w, *rest, stride, padding, dilation, groups, has_bias, has_residual, relu,
                        act=None, threads=None):
    rest = list(rest)
    b = rest.pop(0) if has_bias else None
    res = rest.pop(0) if has_residual else None
    s = rest.pop(0)
    n, c, h, wd = x.shape
    o = w.shape[0]
    one_by_one = (w.shape[2:] == (1, 1) and tuple(stride) == (1, 1) and tuple(padding) == (0, 0, 0, 0)
                  and groups == 1)
    if out.dtype != np.float32 or not one_by_one:
        out[...] = ref.conv2d(x, w, b, stride, padding, dilation, groups, residual=res, relu=relu, act=act,
                              input_scale=s)
        return
    w2 = w.reshape(o, c)                       # (O, C, 1, 1) -> (O, C)
    x3 = x.reshape(n, c, h * wd)               # (N, C, H, W) -> (N, C, H*W)
    o3 = out.reshape(n, o, h * wd)
    s2 = s.reshape(n, 1, c)                    # (N, C, 1, 1) -> (N, 1, C)

    def task(i):
        np.matmul(w2 * s2[i], x3[i], out=o3[i])   # (O, C) @ (C, H*W) -> (O, H*W)
        if b is not None:
            o3[i] += b.reshape(o, 1)
        if res is not None:
            o3[i] += res[i].reshape(o, h * wd)

    with blas_threads(1):
        parallel_for(task, range(n), threads)
    code, al, be = _code(act, relu)
    apply_act_inplace(out, code, al, be, threads)
