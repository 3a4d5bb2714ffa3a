"""im2col + GEMM: the fallback that is correct for every conv the IR accepts.

Groups (including depthwise), any stride, padding, dilation, kernel size. Per task (one image,
one group, a band of output rows): gather cols (K = Cg*KH*KW, R*Wo) in numba with the bounds
checks that implement the zero padding, then out[n, group rows, band] (og, R*Wo) = Wg (og, K)
@ cols with OpenBLAS, then the epilogue on that block while it is in L2 (R from the planner:
cols fits half of L2). Depthwise-like groups (one input channel per group) skip the GEMM: a
numba loop accumulates the KH*KW taps directly, which is the cheaper way for tiny K.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from tilefuse.kernels.activations import apply_scalar
from tilefuse.kernels.conv import stem
from tilefuse.kernels.conv.epilogue import EMPTY2, EMPTY4, bias_or_zeros, epilogue_rows, resolve_act
from tilefuse.kernels.conv.planner import plan_im2col
from tilefuse.kernels.fpflags import FAST
from tilefuse.kernels.threads import blas_threads, parallel_for, scratch


def prepare(w, b, groups: int) -> dict:
    co, cg, kh, kw = w.shape
    if co % groups:
        raise ValueError(f"im2col: {co} output channels not divisible by groups={groups}")
    og = co // groups
    # (Co, Cg, KH, KW) -> (G, og, Cg, KH, KW)
    prep = {"weight": np.ascontiguousarray(np.asarray(w, np.float32).reshape(groups, og, cg, kh, kw)),
            "bias": bias_or_zeros(b, co)}
    if stem.applies(cg, groups):  # few input channels: the stem kernel's own packing too (NCHW16c output)
        prep.update(stem.prepare(w, prep["bias"]))
    return prep


@njit(nogil=True, cache=True)
def _im2col(cols, x, n, c0, cg, KH, KW, sh, sw, pt, pl, dh, dw, r0, r1, Wo):
    """cols[(c*KH + kh)*KW + kw, (oh - r0)*Wo + ow] = x[n, c0 + c, oh*sh - pt + kh*dh, ow*sw - pl + kw*dw] or 0."""
    H, W = x.shape[2], x.shape[3]
    for c in range(cg):
        for kh in range(KH):
            for kw in range(KW):
                row = (c * KH + kh) * KW + kw
                for oh in range(r0, r1):
                    ih = oh * sh - pt + kh * dh
                    base = (oh - r0) * Wo
                    if ih < 0 or ih >= H:
                        for ow in range(Wo):
                            cols[row, base + ow] = 0.0
                        continue
                    for ow in range(Wo):
                        iw = ow * sw - pl + kw * dw
                        cols[row, base + ow] = x[n, c0 + c, ih, iw] if 0 <= iw < W else 0.0


@njit(nogil=True, cache=True, fastmath=FAST)
def _depthwise_rows(out, x, w3, bias, res, has_res, code, alpha, beta, n, g, og, KH, KW, sh, sw, pt, pl, dh, dw, r0, r1):
    """Groups with one input channel: out[n, g*og + j, oh, :] = sum_taps w * x[n, g, ...]."""
    H, W = x.shape[2], x.shape[3]
    Wo = out.shape[3]
    for j in range(og):
        co = g * og + j
        for oh in range(r0, r1):
            orow = out[n, co, oh]
            for ow in range(Wo):
                orow[ow] = 0.0
            for kh in range(KH):
                ih = oh * sh - pt + kh * dh
                if ih < 0 or ih >= H:
                    continue
                xrow = x[n, g, ih]
                for kw in range(KW):
                    wv = w3[g, j, kh * KW + kw]
                    off = kw * dw - pl
                    # valid ow: 0 <= ow*sw + off < W
                    lo = max(0, (-off + sw - 1) // sw)
                    hi = min(Wo, (W - 1 - off) // sw + 1) if W - 1 - off >= 0 else 0
                    for ow in range(lo, hi):
                        orow[ow] += wv * xrow[ow * sw + off]
            b = bias[co]
            for ow in range(Wo):
                v = orow[ow] + b
                if has_res:
                    v += res[n, co, oh, ow]
                orow[ow] = apply_scalar(code, v, alpha, beta)


def run(out, x, prepared, residual=None, *, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1,
        relu=False, act=None, threads=None, plan=None) -> None:
    code, al, be = resolve_act(relu, act, "im2col")
    w5, bias = prepared["weight"], prepared["bias"]
    g_, og, cg, kh, kw = w5.shape
    if g_ != groups:
        raise ValueError(f"im2col: prepared weight has {g_} groups, conv has groups={groups}")
    k = cg * kh * kw
    w3 = w5.reshape(groups, og, k)  # (G, og, Cg, KH, KW) -> (G, og, K), no copy
    n, c, h, wd = x.shape
    _, co, ho, wo = out.shape
    sh, sw = stride
    pt, pl = padding[0], padding[2]
    dh, dw = dilation
    has_res = residual is not None
    rows = (plan or plan_im2col(k, wo, ho))["rows"]
    bands = [(r0, min(r0 + rows, ho)) for r0 in range(0, ho, rows)]
    if cg == 1:
        res4 = residual if has_res else EMPTY4
        tasks = [(i, g) for i in range(n) for g in range(groups)]
        parallel_for(lambda t: _depthwise_rows(out, x, w3, bias, res4, has_res, code, al, be, t[0], t[1], og, kh, kw,
                                               sh, sw, pt, pl, dh, dw, 0, ho), tasks, threads)
        return
    out3 = out.reshape(n, co, ho * wo)  # (N, Co, Ho, Wo) -> (N, Co, Ho*Wo), no copy
    res3 = residual.reshape(n, co, ho * wo) if has_res else None
    tasks = [(i, g, r0, r1) for i in range(n) for g in range(groups) for (r0, r1) in bands]

    def task(t):
        i, g, r0, r1 = t
        cols = scratch("im2col", k * (r1 - r0) * wo).reshape(k, (r1 - r0) * wo)
        _im2col(cols, x, i, g * cg, cg, kh, kw, sh, sw, pt, pl, dh, dw, r0, r1, wo)
        o = out3[i, g * og:(g + 1) * og, r0 * wo:r1 * wo]
        np.matmul(w3[g], cols, out=o)  # (og, K) @ (K, R*Wo) -> (og, R*Wo)
        r = res3[i, g * og:(g + 1) * og, r0 * wo:r1 * wo] if has_res else EMPTY2
        epilogue_rows(o, bias[g * og:(g + 1) * og], r, has_res, code, al, be)

    with blas_threads(1):
        parallel_for(task, tasks, threads)


@njit(nogil=True, cache=True, fastmath=FAST)
def _scatter_rows_nchwc(out, o, n, q0, bias, res, has_res, code, alpha, beta):
    """o (Co, L) GEMM block of positions q0..q0+L -> out[n, c//16, q0+j, c%16] (flat (N, Ob, HW, 16))
    with bias, residual, activation; padded channels (c >= Co) are written as zeros."""
    Co, L = o.shape
    Ob = out.shape[1]
    for ob in range(Ob):
        for j in range(L):
            for l in range(16):
                c = ob * 16 + l
                v = np.float32(0.0)
                if c < Co:
                    v = o[c, j] + bias[c]
                    if has_res:
                        v += res[n, ob, q0 + j, l]
                    v = apply_scalar(code, v, alpha, beta)
                out[n, ob, q0 + j, l] = v


def run_to_nchwc(out_b, x, prepared, residual_b=None, *, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
                 relu=False, act=None, threads=None, plan=None) -> None:
    """NCHW in, NCHW16c out (groups = 1): the network's first conv (3 input channels, where a
    blocked input would waste 13/16 of the work) feeding blocked layers. The GEMM writes a
    per-thread (Co, R*Wo) block that the epilogue scatters into the blocked output."""
    code, al, be = resolve_act(relu, act, "im2col")
    w5, bias = prepared["weight"], prepared["bias"]
    g_, co, cg, kh, kw = w5.shape
    if g_ != 1:
        raise ValueError(f"im2col.run_to_nchwc needs groups=1, got {g_}")
    k = cg * kh * kw
    w2 = w5.reshape(co, k)  # (1, Co, Cg, KH, KW) -> (Co, K), no copy
    n = x.shape[0]
    _, ob, ho, wo, _ = out_b.shape
    has_res = residual_b is not None
    ofl = out_b.reshape(n, ob, ho * wo, 16)  # (N, Ob, Ho, Wo, 16) -> (N, Ob, Ho*Wo, 16)
    res = residual_b.reshape(n, ob, ho * wo, 16) if has_res else EMPTY4
    rows = (plan or plan_im2col(k, wo, ho))["rows"]
    tasks = [(i, r0, min(r0 + rows, ho)) for i in range(n) for r0 in range(0, ho, rows)]

    def task(t):
        i, r0, r1 = t
        cols = scratch("im2col", k * (r1 - r0) * wo).reshape(k, (r1 - r0) * wo)
        _im2col(cols, x, i, 0, cg, kh, kw, stride[0], stride[1], padding[0], padding[2], dilation[0], dilation[1],
                r0, r1, wo)
        o = scratch("im2col_o", co * (r1 - r0) * wo).reshape(co, (r1 - r0) * wo)
        np.matmul(w2, cols, out=o)  # (Co, K) @ (K, R*Wo) -> (Co, R*Wo)
        _scatter_rows_nchwc(ofl, o, i, r0 * wo, bias, res, has_res, code, al, be)

    with blas_threads(1):
        parallel_for(task, tasks, threads)
