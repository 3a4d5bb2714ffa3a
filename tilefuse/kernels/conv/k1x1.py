"""Numba 1x1 convolution on NCHW16c, no gather/scatter (issue 3, batch-1 gap).

    input   x  (N, Cb, H, W, 16)       read in place (flat), stride by strided position offsets
    weights wp (OP, Cip, 32)           wp[p, ci, 16*k + l] = w[(2p+k)*16 + l, ci], k in {0, 1};
                                       Cop padded to an even number of 16-channel blocks
    output     (N, Ob, Ho, Wo, 16)     written in place, bias / residual / activation fused (epilogue.store_block)

Micro-kernel: RB = 7 output positions x 2 output-channel blocks = 14 zmm accumulators held for
the whole Ci reduction; per input channel one 128-byte weight row (2 vector loads) feeds
14 FMAs with 7 broadcast input scalars. 7 divides every ResNet map (49, 196, 784, 3136), so no
partial blocks; positions are flat over the batch (n*Ho*Wo + j), blocks may span images.

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

from tilefuse.kernels.conv._nb import atomic_add, prefetch, prefetchw, stack_f32
from tilefuse.kernels.conv.epilogue import EMPTY1, bias_or_zeros, resolve_act, store_block
from tilefuse.kernels.conv.planner import RB1X1 as RB
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


@njit(nogil=True, cache=True, fastmath=True)
def _k1x1(of, xf, wp, bias, rf, has_res, code, alpha, beta, q0, q1, p0, p1, HWo, Wo, HWi, Wi, Cb, Ob, sh, sw, q_outer, pfd, pfo):
    """of / rf flat (N*Ob*HWo*16), xf flat (N*Cb*HWi*16); positions [q0, q1), channel pairs [p0, p1)."""
    a0 = nb.carray(stack_f32(16), 16)
    a1 = nb.carray(stack_f32(16), 16)
    a2 = nb.carray(stack_f32(16), 16)
    a3 = nb.carray(stack_f32(16), 16)
    a4 = nb.carray(stack_f32(16), 16)
    a5 = nb.carray(stack_f32(16), 16)
    a6 = nb.carray(stack_f32(16), 16)
    b0 = nb.carray(stack_f32(16), 16)
    b1 = nb.carray(stack_f32(16), 16)
    b2 = nb.carray(stack_f32(16), 16)
    b3 = nb.carray(stack_f32(16), 16)
    b4 = nb.carray(stack_f32(16), 16)
    b5 = nb.carray(stack_f32(16), 16)
    b6 = nb.carray(stack_f32(16), 16)
    acc = nb.carray(stack_f32(224), (7, 32))
    cs = HWi * 16
    os_ = HWo * 16
    # input / output offsets of every position of the task, computed once (integer divisions
    # per block cost as much as a K = 64 reduction); unsigned input offsets: no negative-index
    # wraparound code in the inner loop. The last block repeats position q1 - 1.
    nqp = (q1 - q0 + 6) // 7 * 7
    # + pfd blocks of prefetch targets past the end (clamped to the task's last position)
    # (image, row, column) of q0 by division once, then stepped: three integer divisions per
    # position cost more than the whole K = 16 or 32 reduction of MobileNet's thin layers
    io_all = np.empty(nqp + 7 * pfd, np.uint64)
    oo_all = np.empty(nqp + 7 * pfd, np.int64)
    n = q0 // HWo
    j = q0 - n * HWo
    row = j // Wo
    col = j - row * Wo
    nlast = q1 - q0
    for i in range(nqp + 7 * pfd):
        if i < nlast:
            io_all[i] = np.uint64(n * Cb * cs + (row * sh * Wi + col * sw) * 16)
            oo_all[i] = n * Ob * os_ + (row * Wo + col) * 16
            col += 1
            if col == Wo:
                col = 0
                row += 1
                if row * Wo == HWo:
                    row = 0
                    n += 1
        else:
            io_all[i] = io_all[nlast - 1]
            oo_all[i] = oo_all[nlast - 1]
    nq = (q1 - q0 + 6) // 7
    npr = p1 - p0
    for it in range(nq * npr):
        if q_outer:  # a 7-position input block stays in L1 while the weights stream from L2
            qb = q0 + (it // npr) * 7
            p = p0 + it % npr
        else:        # a channel pair's weights stay in L1/L2 while the positions stream
            p = p0 + it // nq
            qb = q0 + (it % nq) * 7
        w = wp[p]
        ob0 = 2 * p
        two = ob0 + 1 < Ob
        io = io_all[qb - q0:qb - q0 + 7]
        oo = oo_all[qb - q0:qb - q0 + 7]
        f0, f1, f2, f3, f4, f5, f6 = io[0], io[1], io[2], io[3], io[4], io[5], io[6]
        # software prefetch of the input block pfd blocks ahead (once per block: the many
        # 64-byte-per-position plane streams of a large map defeat the hardware prefetcher)
        pf = pfd > 0 and ((not q_outer) or it % npr == 0)
        pio = io_all[qb - q0 + 7 * pfd:qb - q0 + 7 * pfd + 7]
        if pfo and pfd > 0:
            poo = oo_all[qb - q0 + 7 * pfd:qb - q0 + 7 * pfd + 7]
            for r in range(7):
                prefetchw(of, poo[r] + ob0 * os_)
                if two:
                    prefetchw(of, poo[r] + (ob0 + 1) * os_)
        for l in range(16):
            a0[l] = 0.0
            a1[l] = 0.0
            a2[l] = 0.0
            a3[l] = 0.0
            a4[l] = 0.0
            a5[l] = 0.0
            a6[l] = 0.0
            b0[l] = 0.0
            b1[l] = 0.0
            b2[l] = 0.0
            b3[l] = 0.0
            b4[l] = 0.0
            b5[l] = 0.0
            b6[l] = 0.0
        for cb in range(Cb):
            base = np.uint64(cb * cs)
            if pf:
                for r in range(7):
                    prefetch(xf, pio[r] + base)
            for c in range(16):
                wv = w[cb * 16 + c]
                k = base + np.uint64(c)
                x0 = xf[f0 + k]
                x1 = xf[f1 + k]
                x2 = xf[f2 + k]
                x3 = xf[f3 + k]
                x4 = xf[f4 + k]
                x5 = xf[f5 + k]
                x6 = xf[f6 + k]
                for l in range(16):
                    u = wv[l]
                    v = wv[16 + l]
                    a0[l] += x0 * u
                    a1[l] += x1 * u
                    a2[l] += x2 * u
                    a3[l] += x3 * u
                    a4[l] += x4 * u
                    a5[l] += x5 * u
                    a6[l] += x6 * u
                    b0[l] += x0 * v
                    b1[l] += x1 * v
                    b2[l] += x2 * v
                    b3[l] += x3 * v
                    b4[l] += x4 * v
                    b5[l] += x5 * v
                    b6[l] += x6 * v
        for l in range(16):
            u = bias[np.uint64(ob0 * 16 + l)]
            v = bias[np.uint64(ob0 * 16 + 16 + l)]
            acc[0, l] = a0[l] + u
            acc[1, l] = a1[l] + u
            acc[2, l] = a2[l] + u
            acc[3, l] = a3[l] + u
            acc[4, l] = a4[l] + u
            acc[5, l] = a5[l] + u
            acc[6, l] = a6[l] + u
            acc[0, 16 + l] = b0[l] + v
            acc[1, 16 + l] = b1[l] + v
            acc[2, 16 + l] = b2[l] + v
            acc[3, 16 + l] = b3[l] + v
            acc[4, 16 + l] = b4[l] + v
            acc[5, 16 + l] = b5[l] + v
            acc[6, 16 + l] = b6[l] + v
        nv = min(7, q1 - qb)
        nk = 2 if two else 1
        store_block(of, rf, has_res, acc, 0, oo, ob0 * os_, nv, nk, os_, code, alpha, beta)


@njit(parallel=True, nogil=True, cache=True)
def _k1x1_par(nt, tasks, of, xf, wp, bias, rf, has_res, code, alpha, beta, HWo, Wo, HWi, Wi, Cb, Ob, sh, sw,
              q_outer, pfd, pfo):
    """Every task of the layer on numba's pool: tasks (T, 4) = (q0, q1, p0, p1)."""
    counter = np.zeros(1, np.int64)  # next task: handed out dynamically (stragglers never stall)
    for _w in nb.prange(nt):
        _k1x1_seq(counter, nb.get_thread_id(), tasks, of, xf, wp, bias, rf, has_res, code, alpha, beta, HWo, Wo, HWi,
                  Wi, Cb, Ob, sh, sw, q_outer, pfd, pfo)


@njit(nogil=True, cache=True)
def _k1x1_seq(counter, tid, tasks, of, xf, wp, bias, rf, has_res, code, alpha, beta, HWo, Wo, HWi, Wi, Cb, Ob, sh, sw,
              q_outer, pfd, pfo):
    """One worker of the task loop on the calling thread: tasks taken from `counter` (threads.numba_region)."""
    while True:
        i = atomic_add(counter, 0, 1)
        if i >= tasks.shape[0]:
            break
        _k1x1(of, xf, wp, bias, rf, has_res, code, alpha, beta, tasks[i, 0], tasks[i, 1], tasks[i, 2], tasks[i, 3],
              HWo, Wo, HWi, Wi, Cb, Ob, sh, sw, q_outer, pfd, pfo)


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
                 has_res, code, al, be, hw, wo, h * w, w, cb, ob, stride[0], stride[1], qo, PF_BLOCKS, PF_OUT)
