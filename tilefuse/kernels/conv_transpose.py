"""Transposed convolution runtime kernel: GEMM + col2im, with the fused epilogue.

Per (image, group, block of OUT_BLOCK output channels): cols (ob*kh*kw, H*W) =
W_g^T (ob*kh*kw, Cig) @ x[n, g] (Cig, H*W) with OpenBLAS (one thread; our pool splits the
tasks), then a numba col2im adds every column entry into its output pixel
(i*s + p*d - pad_top, j*s + q*d - pad_left) when it lies inside the output, then bias and the
activation. Every output element is summed in the same order
whatever the thread count. The reference (`ref.conv_transpose2d`) scatters tap by tap in
float32/64; the sums differ only in order: within 1e-5 relative for float32.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from . import activations as A
from .fpflags import FAST
from . import reference as ref
from .threads import blas_threads, parallel_for, scratch


@njit(nogil=True, cache=True, fastmath=FAST)
def _col2im(out, cols, n, co0, og, kh, kw, H, W, sh, sw, dh, dw, pt, pl, bias, code, alpha, beta):
    """out[n, co0 + o] = act(bias + sum over (p, q, i, j) of cols[(o*kh + p)*kw + q, i*W + j])."""
    Ho, Wo = out.shape[2], out.shape[3]
    a, b = np.float32(alpha), np.float32(beta)
    for o in range(og):
        plane = out[n, co0 + o]
        for y in range(Ho):
            for x in range(Wo):
                plane[y, x] = 0.0
        for p in range(kh):
            for q in range(kw):
                row = cols[(o * kh + p) * kw + q]
                for i in range(H):
                    y = i * sh + p * dh - pt
                    if y < 0 or y >= Ho:
                        continue
                    for j in range(W):
                        x = j * sw + q * dw - pl
                        if 0 <= x < Wo:
                            plane[y, x] += row[i * W + j]
        bv = bias[co0 + o]
        for y in range(Ho):
            for x in range(Wo):
                plane[y, x] = A.apply_scalar(code, plane[y, x] + bv, a, b)


OUT_BLOCK = 32   # output channels per task: the tasks split a batch-1 layer over the threads


def conv_transpose2d(out, x, w, *b, stride, padding, output_padding=(0, 0), dilation=(1, 1), groups=1,
                     has_bias=False, relu=False, act=None, threads=None, algorithm=None, prepared=(), layout="nchw",
                     **_):
    if algorithm == "phase":
        # compiled networks: the NCHW16c phase kernel (kernels/conv/transpose.py) on its prepared
        # weights (they replaced w and b); layout "nchwc": x and out are blocked
        from .conv import transpose
        prep = dict(zip(prepared, (w,) + b))
        run = transpose.run_nchwc if layout == "nchwc" else transpose.run
        run(out, x, prep, stride=stride, padding=padding, dilation=dilation, relu=relu, act=act, threads=threads)
        return
    if out.dtype != np.float32:
        out[...] = ref.conv_transpose2d(x, w, b[0] if has_bias else None, stride, padding, output_padding,
                                        dilation, groups, act=act if act is not None else
                                        (("relu", 0.0, 0.0) if relu else None))
        return
    n, ci, h, wd = x.shape
    _, og, kh, kw = w.shape
    cig = ci // groups
    co = og * groups
    bias = np.ascontiguousarray(b[0], np.float32) if has_bias else np.zeros(co, np.float32)
    code, al, be = A.encode(*act) if act is not None and act[0] != "identity" else \
        (A.encode("relu") if relu else A.IDENTITY)
    # (Ci, og, kh, kw) -> (G, Cig, og*kh*kw): per group the transposed GEMM operand, no copy
    w3 = w.reshape(groups, cig, og * kh * kw)
    x3 = x.reshape(n, ci, h * wd)  # (N, Ci, H, W) -> (N, Ci, H*W)

    kk = kh * kw
    ob = max(1, min(og, OUT_BLOCK))

    def task(t):
        i, g, o0 = t
        o1 = min(o0 + ob, og)
        cols = scratch("convt", (o1 - o0) * kk * h * wd).reshape((o1 - o0) * kk, h * wd)
        # (ob*kh*kw, Cig) @ (Cig, H*W): the rows of output channels o0..o1 of group g
        np.matmul(w3[g, :, o0 * kk:o1 * kk].T, x3[i, g * cig:(g + 1) * cig], out=cols)
        _col2im(out, cols, i, g * og + o0, o1 - o0, kh, kw, h, wd, stride[0], stride[1], dilation[0], dilation[1],
                padding[0], padding[2], bias, code, al, be)

    tasks = [(i, g, o0) for i in range(n) for g in range(groups) for o0 in range(0, og, ob)]
    with blas_threads(1):
        parallel_for(task, tasks, threads)


KERNELS = {"conv_transpose2d": conv_transpose2d}
THREADED = frozenset(KERNELS)
ACT_KERNELS = frozenset(KERNELS)
BLOCKED = frozenset()
