"""1x1 convolution as GEMM (seed 000, conv1x1 strategy).

Per image, NCHW is already the GEMM layout: out[n] (Co, Ho*Wo) = W (Co, Ci) @ X[n] (Ci, Ho*Wo).
Feature-map-level partitioning: a task owns `m` output channels x `Nb` output columns of one
image and reads the whole input block (every core reads the input, the cores split Co), the
GEMM runs in OpenBLAS (one thread per task), then the epilogue (bias, residual, ReLU) runs on
the task's output block while it is still in L2. Stride > 1 gathers only the rows a task
needs (x[n, :, oh*s, ::s]) into a per-thread buffer, never the whole subsampled input.
Padding on a 1x1 conv is handled by the im2col fallback (select never picks gemm1x1 then).
"""
from __future__ import annotations

import numpy as np

from tilefuse.kernels.conv.epilogue import EMPTY2, bias_or_zeros, epilogue_rows
from tilefuse.kernels.conv.planner import plan_gemm1x1
from tilefuse.kernels.conv.threads import blas_threads, parallel_for, scratch


def prepare(w, b) -> dict:
    co, ci, kh, kw = w.shape
    if (kh, kw) != (1, 1):
        raise ValueError(f"gemm1x1 needs a 1x1 kernel, got weight shape {w.shape}")
    return {"weight": np.ascontiguousarray(w.reshape(co, ci), np.float32), "bias": bias_or_zeros(b, co)}


def run(out, x, prepared, residual=None, *, stride=(1, 1), relu=False, threads=None, plan=None) -> None:
    w2, bias = prepared["weight"], prepared["bias"]
    n, ci, h, wd = x.shape
    co = w2.shape[0]
    _, _, ho, wo = out.shape
    sh, sw = stride
    hw = ho * wo
    p = plan or plan_gemm1x1(ci, co, hw)
    m, nb = p["m"], p["Nb"]
    if sh != 1 or sw != 1:
        nb = max(wo, nb // wo * wo)  # whole output rows per task, so the gather is row-wise
    out3 = out.reshape(n, co, hw)  # (N, Co, Ho, Wo) -> (N, Co, Ho*Wo), no copy
    x3 = x.reshape(n, ci, h * wd)
    res3 = residual.reshape(n, co, hw) if residual is not None else None
    tasks = [(i, c0, j0) for i in range(n) for j0 in range(0, hw, nb) for c0 in range(0, co, m)]

    def task(t):
        i, c0, j0 = t
        c1, j1 = min(c0 + m, co), min(j0 + nb, hw)
        if sh == 1 and sw == 1:
            xin = x3[i, :, j0:j1]  # (Ci, cols) strided view, BLAS-able
        else:
            r0, r1 = j0 // wo, j1 // wo
            buf = scratch("g1x1", ci * (j1 - j0)).reshape(ci, r1 - r0, wo)
            buf[...] = x[i, :, r0 * sh:(r1 - 1) * sh + 1:sh, 0:(wo - 1) * sw + 1:sw]  # (Ci, rows, Wo)
            xin = buf.reshape(ci, j1 - j0)
        o = out3[i, c0:c1, j0:j1]
        np.matmul(w2[c0:c1], xin, out=o)
        r = res3[i, c0:c1, j0:j1] if res3 is not None else EMPTY2
        epilogue_rows(o, bias[c0:c1], r, res3 is not None, relu)

    with blas_threads(1):
        parallel_for(task, tasks, threads)
