"""Convolution with a per-image input channel scale: the fused squeeze-excitation multiply.

    y[n] = act(conv(x[n] * s[n], w) + b (+ residual))        s (N, C, 1, 1)

For a 1x1 conv (stride 1, no padding, groups 1: the projection after the squeeze-excitation
of MobileNetV3 / EfficientNet / RegNetY), the scale moves onto the weights instead of the
activation: out[n] (O, H*W) = (w (O, C) * s[n] (1, C)) @ x[n] (C, H*W), so the scaled tensor
x * s (N*C*H*W values) is never written or read; the per-image weight copy is O*C values.
One OpenBLAS GEMM per image and block of output channels (tasks on the conv pool, BLAS at one
thread), then bias, residual and the activation in place. On NCHW16c tensors the per-image
scaled weights are packed for the blocked 1x1 kernel (kernels/conv/k1x1.py) instead, or, where
that moves more values (a batch of small maps with many channels: O + N*H*W < N*O), the input
is scaled once into a scratch buffer and one 1x1 conv runs over the batch (the products are
then rounded as the reference rounds them: x * s first). Other convs scale the input into a
scratch buffer first and run the reference conv (correct, not fast). Tolerance against the
reference (which scales x first): the products are associated differently, within 1e-5
relative.
"""
from __future__ import annotations

import numpy as np

from numba import njit

from . import reference as ref
from .broadcast import _code, apply_act_inplace
from .threads import blas_threads, parallel_for, scratch


@njit(nogil=True, cache=True)
def pack_scaled_1x1(wp, w2, s):
    """wp (OP, Cip, 32): wp[p, ci, 16k + l] = w2[(2p+k)*16 + l, ci] * s[ci], zero past O or C
    (k1x1.prepare's packing of the weights w2 (O, C) scaled per input channel by s (C,)), without
    the temporaries of scaling, padding and transposing in numpy."""
    OP, Cip, _ = wp.shape
    O, C = w2.shape
    for p in range(OP):
        nj = min(32, O - 32 * p)
        for ci in range(Cip):
            if ci < C:
                sc = s[ci]
                for j in range(nj):             # 32 rows of w2, each line in L1 across 16 ci
                    wp[p, ci, j] = w2[32 * p + j, ci] * sc
                for j in range(nj, 32):
                    wp[p, ci, j] = 0.0
            else:
                for j in range(32):
                    wp[p, ci, j] = 0.0


def conv2d_input_scaled(out, x, w, *rest, stride, padding, dilation, groups, has_bias, has_residual, relu,
                        act=None, threads=None, layout="nchw"):
    rest = list(rest)
    b = rest.pop(0) if has_bias else None
    res = rest.pop(0) if has_residual else None
    s = rest.pop(0)
    if layout == "nchwc":
        # blocked x / out / residual (1x1 only: the layout pass blocks no other), NCHW scale:
        # per image, the scaled weights packed for the blocked 1x1 kernel (O*C values) and run
        from .conv import k1x1
        o, c = w.shape[0], w.shape[1]
        if w.shape[2:] != (1, 1):
            raise ValueError(f"input-scaled conv (NCHWc): weight {w.shape}; expected a 1x1 kernel")
        op, cip = -(-o // 32), -(-c // 16) * 16
        bias = np.zeros(op * 32, np.float32)
        if b is not None:
            bias[:o] = b
        w2 = np.ascontiguousarray(w.reshape(o, c), dtype=np.float32)     # (O, C, 1, 1) -> (O, C)
        s2 = np.ascontiguousarray(s.reshape(s.shape[0], c), dtype=np.float32)  # (N, C, 1, 1) -> (N, C)
        wp = scratch("se_conv_wp", (op, cip, 32))
        n, cb, h, wd, _ = x.shape
        if o + n * h * wd < n * o:
            # scaling the input moves fewer values (N*C*H*W + O*C for one packing of the weights
            # against N*O*C) and runs one 1x1 conv over the whole batch: late, small maps of a
            # batch (RegNetY at 7x7: 49 positions, 440 channels)
            sb = np.zeros((n, cb * 16), np.float32)
            sb[:, :c] = s2
            xs = scratch("se_conv_xs", x.shape)
            np.multiply(x, sb.reshape(n, cb, 1, 1, 16), out=xs)    # (N, Cb, H, W, 16) * (N, Cb, 1, 1, 16)
            pack_scaled_1x1(wp, w2, np.ones(c, np.float32))
            k1x1.run_nchwc(out, xs, {"weight": wp, "bias": bias}, res, relu=relu, act=None if relu else act,
                           threads=threads)
            return
        for i in range(n):
            pack_scaled_1x1(wp, w2, s2[i])       # = k1x1.prepare(w * s[i], b)["weight"], in place
            k1x1.run_nchwc(out[i:i + 1], x[i:i + 1], {"weight": wp, "bias": bias},
                           res[i:i + 1] if res is not None else None,
                           relu=relu, act=None if relu else act, threads=threads)
        return
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

    ob = 64   # output channels per task: a batch-1 layer still splits over the threads

    def task(t):
        i, o0 = t
        o1 = min(o0 + ob, o)
        blk = o3[i, o0:o1]
        np.matmul(w2[o0:o1] * s2[i], x3[i], out=blk)   # (ob, C) @ (C, H*W) -> (ob, H*W)
        if b is not None:
            blk += b[o0:o1].reshape(-1, 1)
        if res is not None:
            blk += res[i, o0:o1].reshape(o1 - o0, h * wd)

    with blas_threads(1):
        parallel_for(task, [(i, o0) for i in range(n) for o0 in range(0, o, ob)], threads)
    code, al, be = _code(act, relu)
    apply_act_inplace(out, code, al, be, threads)
