"""Numba 1x1 convolution on NCHW16c, no gather/scatter (issue 3, batch-1 gap).

    input   x  (N, Cb, H, W, 16)       read in place (flat), stride by strided position offsets
    weights wp (OP, Cip, 32)           wp[p, ci, 16*k + l] = w[(2p+k)*16 + l, ci], k in {0, 1};
                                       Cop padded to an even number of 16-channel blocks
    output     (N, Ob, Ho, Wo, 16)     written in place, bias / residual / activation fused (epilogue.store_block)

Micro-kernel: RB = 7 output positions x 2 output-channel blocks = 14 zmm accumulators held for
the whole Ci reduction; per input channel one 128-byte weight row (2 vector loads) feeds
14 FMAs with 7 broadcast input scalars. 7 divides every ResNet map (49, 196, 784, 3136), so no
partial blocks; positions are flat over the batch (n*Ho*Wo + j), blocks may span images.
Hosts compiled for 256-bit vectors (`tiles.NARROW`: AVX2) run `_k1x1_narrow` instead: 5 positions x
1 block = 10 ymm accumulators (the 7 x 2 tile needs 28 of the 16 ymm registers and spilled), the
same bits (`_k1x1` dispatches; tests/test_register_tiles.py). The tiles are generated from one
template (tilegen.K1X1 -> _tiles_gen.py).

Thin layers (MobileNetV2, EfficientNet): an odd last output block (Co = 16, 40, 144, ...) is computed
by `_k1x1_one` (14 positions x 1 block) instead of a pair with a zero-weight half, and the
reduction runs over input channels [0, kc), kc = `reduction_length(wp)` (the zero rows padding Ci
to a multiple of 16 are skipped).

Tasks: (block of positions, range of output-channel pairs), the grid chosen for the thread count
by planner.plan_k1x1 (small maps at batch 1 split the output channels, seed 000's feature-map
level; large ones positions); the layer's task table runs in one numba parallel loop
(threads.numba_region). Every output element is one full-K dot product computed by the same code
whichever task or thread owns it, so any grid and thread count give bitwise identical results.
"""
from __future__ import annotations

import functools

import numba as nb
import numpy as np
from numba import njit

from tilefuse.kernels.conv._nb import atomic_add
from tilefuse.kernels.conv._tiles_gen import _k1x1_narrow, _k1x1_one, _k1x1_wide  # noqa: F401  (tilegen.py)
from tilefuse.kernels.conv.tiles import NARROW
from tilefuse.kernels.conv.epilogue import EMPTY1, bias_or_zeros, resolve_act
from tilefuse.kernels.conv.planner import plan_k1x1
from tilefuse.kernels.threads import numba_region, resolve_threads

Q_OUTER = None  # force the loop order (benchmarks); None: the plan's
PF_OUT = True  # also prefetchw the output lines of the block ahead (docs/kernels.md)
PF_BLOCKS = 1  # software-prefetch distance in 7-position blocks (0: off)


def prepare(w, b) -> dict:
    """weight (OP, Cip, 32) as above, bias (2*OP*16,) zero padded."""
    co, ci, kh, kw = w.shape
    if (kh, kw) != (1, 1):
        raise ValueError(f"gemm1x1 needs a 1x1 kernel, got weight shape {w.shape}")
    cip = -(-ci // 16) * 16
    op = -(-co // 32)
    wpad = np.zeros((op * 32, cip), np.float32)
    wpad[:co, :ci] = np.asarray(w, np.float32).reshape(co, ci)
    # (OP*32, Cip) -> (OP, 32, Cip) -> (OP, Cip, 32)
    wp = np.ascontiguousarray(wpad.reshape(op, 32, cip).transpose(0, 2, 1))
    bias = np.zeros(op * 32, np.float32)
    bias[:co] = bias_or_zeros(b, co)
    return {"weight": wp, "bias": bias}


@njit(nogil=True, cache=True)
def reduction_length(wp):
    """wp (OP, Cip, 32) -> kc: 1 + the last input channel with a nonzero weight (0 if none). The
    rows from kc on (the zero padding of Cin to a multiple of 16, e.g. MobileNetV2's 24 -> 32)
    contribute exactly 0 to every finite sum, so the kernels skip them."""
    for r in range(wp.shape[1] - 1, -1, -1):
        for p in range(wp.shape[0]):
            for l in range(32):
                if wp[p, r, l] != 0.0:
                    return r + 1
    return 0


@njit(nogil=True, cache=True)
def _k1x1(of, xf, wp, bias, rf, has_res, code, alpha, beta, q0, q1, p0, p1, HWo, Wo, HWi, Wi, Cb, Ob, sh, sw,
          q_outer, pfd, pfo, kc):
    """One task: the micro-kernel of the host's vector width (tiles.NARROW, a compile-time constant)."""
    if NARROW:
        _k1x1_narrow(of, xf, wp, bias, rf, has_res, code, alpha, beta, q0, q1, p0, p1, HWo, Wo, HWi, Wi, Cb, Ob, sh,
                     sw, q_outer, pfd, pfo, kc)
    else:
        _k1x1_wide(of, xf, wp, bias, rf, has_res, code, alpha, beta, q0, q1, p0, p1, HWo, Wo, HWi, Wi, Cb, Ob, sh,
                   sw, q_outer, pfd, pfo, kc)


@njit(parallel=True, nogil=True, cache=True)
def _k1x1_par(nt, tasks, of, xf, wp, bias, rf, has_res, code, alpha, beta, HWo, Wo, HWi, Wi, Cb, Ob, sh, sw,
              q_outer, pfd, pfo, kc):
    """Every task of the layer on numba's pool: tasks (T, 4) = (q0, q1, p0, p1)."""
    counter = np.zeros(1, np.int64)  # next task: handed out dynamically (stragglers never stall)
    for _w in nb.prange(nt):
        _k1x1_seq(counter, nb.get_thread_id(), tasks, of, xf, wp, bias, rf, has_res, code, alpha, beta, HWo, Wo, HWi,
                  Wi, Cb, Ob, sh, sw, q_outer, pfd, pfo, kc)


@njit(nogil=True, cache=True)
def _k1x1_seq(counter, tid, tasks, of, xf, wp, bias, rf, has_res, code, alpha, beta, HWo, Wo, HWi, Wi, Cb, Ob, sh, sw,
              q_outer, pfd, pfo, kc):
    """One worker of the task loop on the calling thread: tasks taken from `counter` (threads.numba_region)."""
    while True:
        i = atomic_add(counter, 0, 1)
        if i >= tasks.shape[0]:
            break
        _k1x1(of, xf, wp, bias, rf, has_res, code, alpha, beta, tasks[i, 0], tasks[i, 1], tasks[i, 2], tasks[i, 3],
              HWo, Wo, HWi, Wi, Cb, Ob, sh, sw, q_outer, pfd, pfo, kc)


@functools.lru_cache(maxsize=1024)
def task_table(total: int, op: int, q: int, p: int) -> np.ndarray:
    """(T, 4) int64 rows (q0, q1, p0, p1): position blocks outer, channel-pair ranges inner."""
    t = np.array([(q0, min(q0 + q, total), p0, min(p0 + p, op)) for q0 in range(0, total, q) for p0 in range(0, op, p)],
                 np.int64).reshape(-1, 4)
    t.flags.writeable = False
    return t


def run_nchwc(out_b, x_b, prepared, residual_b=None, *, stride=(1, 1), relu=False, act=None, threads=None,
              plan=None) -> None:
    """x_b (N, Cb, H, W, 16) -> out_b (N, Ob, Ho, Wo, 16), no padding (1x1).

    plan: from planner.plan_k1x1 (default: the one for `threads`)."""
    code, al, be = resolve_act(relu, act, "gemm1x1")
    wp, bias = prepared["weight"], prepared["bias"]
    n, cb, h, w, _ = x_b.shape
    _, ob, ho, wo, _ = out_b.shape
    op, cip, _ = wp.shape
    if cip != cb * 16:
        raise ValueError(f"gemm1x1 (NCHWc): weight has {cip} input channels, input {cb * 16}")
    hw = ho * wo
    total = n * hw
    threads = resolve_threads(threads)
    pl = plan or plan_k1x1(cip, op, total, threads)
    tasks = task_table(total, op, pl["Q"], pl["P"])
    has_res = residual_b is not None
    rf = residual_b.reshape(-1) if has_res else EMPTY1
    qo = Q_OUTER if Q_OUTER is not None else pl["q_outer"]
    numba_region(_k1x1_par, _k1x1_seq, threads, len(tasks), tasks, out_b.reshape(-1), x_b.reshape(-1), wp, bias, rf,
                 has_res, code, al, be, hw, wo, h * w, w, cb, ob, stride[0], stride[1], qo, PF_BLOCKS, PF_OUT,
                 reduction_length(wp))
