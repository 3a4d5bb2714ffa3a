"""1x1 convolution as GEMM (seed 000, conv1x1 strategy).

Per image, NCHW is already the GEMM layout: out[n] (Co, Ho*Wo) = W (Co, Ci) @ X[n] (Ci, Ho*Wo).
Feature-map-level partitioning: a task owns `m` output channels x `Nb` output columns of one
image and reads the whole input block (every core reads the input, the cores split Co), the
GEMM runs in OpenBLAS (one thread per task), then the epilogue (bias, residual, activation) runs on
the task's output block while it is still in L2. Stride > 1 gathers only the rows a task
needs (x[n, :, oh*s, ::s]) into a per-thread buffer, never the whole subsampled input.
Padding on a 1x1 conv is handled by the im2col fallback (select never picks gemm1x1 then).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from tilefuse.kernels.activations import apply_scalar
from tilefuse.kernels.conv.epilogue import EMPTY2, EMPTY4, bias_or_zeros, epilogue_rows, resolve_act
from tilefuse.kernels.conv.planner import plan_gemm1x1, plan_gemm1x1_nchwc
from tilefuse.kernels.fpflags import FAST
from tilefuse.kernels.threads import blas_threads, parallel_for, scratch



def prepare(w, b) -> dict:
    co, ci, kh, kw = w.shape
    if (kh, kw) != (1, 1):
        raise ValueError(f"gemm1x1 needs a 1x1 kernel, got weight shape {w.shape}")
    return {"weight": np.ascontiguousarray(w.reshape(co, ci), np.float32), "bias": bias_or_zeros(b, co)}


def run(out, x, prepared, residual=None, *, stride=(1, 1), relu=False, act=None, threads=None, plan=None) -> None:
    code, al, be = resolve_act(relu, act, "gemm1x1")
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
        epilogue_rows(o, bias[c0:c1], r, res3 is not None, code, al, be)

    with blas_threads(1):
        parallel_for(task, tasks, threads)


# NCHWc form ------------------------------------------------------------------------------------
# Between layers the compiler keeps activations in NCHWc (N, Cb, H, W, 16). A block of output
# positions of one image is then, read per position, a row of 16-float vectors: gathering it as
# an (Nb, Cip) "NHWC" block copies whole 64-byte vectors (no transpose), the GEMM runs as
# out_blk (Nb, m) = X_blk (Nb, Cip) @ Wt[:, c0:c0+m] (Cip, m), and the (Nb, m) result goes back
# to NCHWc as 64-byte vectors again, with bias, residual and the activation on the way.

def prepare_nchwc(w, b) -> dict:
    """weight Wt (Cip, Cop) = W^T zero padded to multiples of 16; bias (Cop,) zero padded."""
    co, ci, kh, kw = w.shape
    if (kh, kw) != (1, 1):
        raise ValueError(f"gemm1x1 needs a 1x1 kernel, got weight shape {w.shape}")
    cip, cop = -(-ci // 16) * 16, -(-co // 16) * 16
    wt = np.zeros((cip, cop), np.float32)
    wt[:ci, :co] = np.asarray(w, np.float32).reshape(co, ci).T
    bias = np.zeros(cop, np.float32)
    bias[:co] = bias_or_zeros(b, co)
    return {"weight": wt, "bias": bias}


@njit(nogil=True, cache=True)
def _gather_nhwc(xs, x, q0, q1, HWo, Wo, sh, sw):
    """xs[q - q0, cb*16 + l] = x[n, cb, oh*sh, ow*sw, l] for flat output positions
    q = n*HWo + oh*Wo + ow in [q0, q1) (a block may span images: 7x7 maps are 49 positions)."""
    Cb = x.shape[1]
    for q in range(q0, q1):
        n, j = q // HWo, q % HWo
        ih, iw = (j // Wo) * sh, (j % Wo) * sw
        for cb in range(Cb):
            for l in range(16):
                xs[q - q0, cb * 16 + l] = x[n, cb, ih, iw, l]


@njit(nogil=True, cache=True, fastmath=FAST)
def _scatter_nchwc(out, o, c0, q0, bias, res, has_res, code, alpha, beta):
    """out[n, (c0+c)//16, j, c%16] = act(o[q - q0, c] + bias[c0+c] (+ res)) for q = n*HW + j;
    out / res flat (N, Ob, HW, 16)."""
    nq, m = o.shape
    HW = out.shape[2]
    for c in range(0, m, 16):
        ob = (c0 + c) // 16
        for i in range(nq):
            n, j = (q0 + i) // HW, (q0 + i) % HW
            for l in range(16):
                v = o[i, c + l] + bias[c0 + c + l]
                if has_res:
                    v += res[n, ob, j, l]
                out[n, ob, j, l] = apply_scalar(code, v, alpha, beta)


def run_nchwc(out_b, x_b, prepared, residual_b=None, *, stride=(1, 1), relu=False, act=None, threads=None,
              plan=None) -> None:
    """x_b (N, Cb, H, W, 16) -> out_b (N, Ob, Ho, Wo, 16); stride > 1 gathers only the used positions.

    Tasks (block of Nb output positions over the whole batch, block of m output channels):
    feature-map-level partitioning over Co as in the NCHW form when there are few positions;
    each task gathers its (Nb, Cip) input block into L2 (cheap next to the m*Cip*Nb*2 FLOPs of
    its GEMM). Blocks run across image boundaries, so small maps still make large GEMMs.
    """
    code, al, be = resolve_act(relu, act, "gemm1x1")
    wt, bias = prepared["weight"], prepared["bias"]
    n, cb, h, wd, _ = x_b.shape
    _, ob, ho, wo, _ = out_b.shape
    cip, cop = wt.shape
    hw = ho * wo
    total = n * hw
    p = plan or plan_gemm1x1_nchwc(cip, cop, total)
    m, nb = p["m"], p["Nb"]
    has_res = residual_b is not None
    ofl = out_b.reshape(n, ob, hw, 16)  # (N, Ob, Ho, Wo, 16) -> (N, Ob, HoWo, 16)
    res = residual_b.reshape(n, ob, hw, 16) if has_res else EMPTY4
    sh, sw = stride
    tasks = [(q0, c0) for q0 in range(0, total, nb) for c0 in range(0, cop, m)]

    def task(t):
        q0, c0 = t
        q1, c1 = min(q0 + nb, total), min(c0 + m, cop)
        xs = scratch("g1x1c_x", (q1 - q0) * cip).reshape(q1 - q0, cip)
        _gather_nhwc(xs, x_b, q0, q1, hw, wo, sh, sw)
        o = scratch("g1x1c_o", (q1 - q0) * (c1 - c0)).reshape(q1 - q0, c1 - c0)
        np.matmul(xs, wt[:, c0:c1], out=o)  # (Nb, Cip) @ (Cip, m) -> (Nb, m)
        _scatter_nchwc(ofl, o, c0, q0, bias, res, has_res, code, al, be)

    with blas_threads(1):
        parallel_for(task, tasks, threads)
