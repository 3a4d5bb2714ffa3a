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
same bits (`_k1x1` dispatches; tests/test_register_tiles.py).

Thin layers (MobileNetV2, EfficientNet): an odd last output block (Co = 16, 40, 144, ...) is computed
by `_k1x1_one` (RB1 = 14 positions x 1 block) instead of a pair with a zero-weight half, and the
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

from tilefuse.kernels.conv._nb import atomic_add, prefetch, prefetchw, stack_f32
from tilefuse.kernels.conv.tiles import NARROW
from tilefuse.kernels.conv.epilogue import EMPTY1, bias_or_zeros, resolve_act, store_rows
from tilefuse.kernels.conv.planner import RB1X1 as RB
from tilefuse.kernels.conv.planner import plan_k1x1
from tilefuse.kernels.threads import numba_region, resolve_threads

Q_OUTER = None  # force the loop order (benchmarks); None: the plan's
PF_OUT = True  # also prefetchw the output lines of the block ahead (docs/kernels.md)
PF_BLOCKS = 1  # software-prefetch distance in 7-position blocks (0: off)
RB1 = 14  # positions of the one-block kernel (_k1x1_one)


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


@njit(inline="always")
def _offsets(q0, q1, m, HWo, Wo, Wi, Cb, Ob, cs, os_, sh, sw):
    """Input (unsigned: no negative-index wraparound code in the inner loops) and output offsets of
    positions q0, q0 + 1, ... (m entries; those from q1 on repeat position q1 - 1). (image, row,
    column) of q0 by division once, then stepped: three integer divisions per position cost more
    than the whole K = 16 or 32 reduction of MobileNet's thin layers."""
    io_all = np.empty(m, np.uint64)
    oo_all = np.empty(m, np.int64)
    n = q0 // HWo
    j = q0 - n * HWo
    row = j // Wo
    col = j - row * Wo
    nlast = q1 - q0
    for i in range(m):
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
    return io_all, oo_all


@njit(nogil=True, cache=True, fastmath=True)
def _k1x1_one(of, xf, wp, bias, rf, has_res, code, alpha, beta, q0, q1, p, HWo, Wo, HWi, Wi, Cb, Ob, sh, sw, kc):
    """The odd last output block 2p (its pair's second block is padding): RB1 = 14 positions x 1
    block = 14 zmm accumulators, weights wp[p, :, 0:16], positions [q0, q1). Each output element is
    the same full-K dot product in the same order as in `_k1x1` (acc = 0; += x[c] * w[c] for c
    ascending; + bias), so which kernel computes a block never changes a bit."""
    c0 = nb.carray(stack_f32(16), 16)
    c1 = nb.carray(stack_f32(16), 16)
    c2 = nb.carray(stack_f32(16), 16)
    c3 = nb.carray(stack_f32(16), 16)
    c4 = nb.carray(stack_f32(16), 16)
    c5 = nb.carray(stack_f32(16), 16)
    c6 = nb.carray(stack_f32(16), 16)
    c7 = nb.carray(stack_f32(16), 16)
    c8 = nb.carray(stack_f32(16), 16)
    c9 = nb.carray(stack_f32(16), 16)
    c10 = nb.carray(stack_f32(16), 16)
    c11 = nb.carray(stack_f32(16), 16)
    c12 = nb.carray(stack_f32(16), 16)
    c13 = nb.carray(stack_f32(16), 16)
    acc = nb.carray(stack_f32(224), (14, 16))
    cs = HWi * 16
    os_ = HWo * 16
    nqp = (q1 - q0 + RB1 - 1) // RB1 * RB1
    io_all, oo_all = _offsets(q0, q1, nqp, HWo, Wo, Wi, Cb, Ob, cs, os_, sh, sw)
    w = wp[p]
    ob0 = 2 * p
    ncb = (kc + 15) // 16
    for qb in range(0, nqp, RB1):
        # offsets read in place (a slice per block would cost two atomic reference-count updates)
        f0, f1, f2, f3, f4, f5, f6 = (io_all[qb], io_all[qb + 1], io_all[qb + 2], io_all[qb + 3], io_all[qb + 4],
                                      io_all[qb + 5], io_all[qb + 6])
        f7, f8, f9, f10, f11, f12, f13 = (io_all[qb + 7], io_all[qb + 8], io_all[qb + 9], io_all[qb + 10],
                                          io_all[qb + 11], io_all[qb + 12], io_all[qb + 13])
        for l in range(16):
            c0[l] = 0.0
            c1[l] = 0.0
            c2[l] = 0.0
            c3[l] = 0.0
            c4[l] = 0.0
            c5[l] = 0.0
            c6[l] = 0.0
            c7[l] = 0.0
            c8[l] = 0.0
            c9[l] = 0.0
            c10[l] = 0.0
            c11[l] = 0.0
            c12[l] = 0.0
            c13[l] = 0.0
        for cb in range(ncb):
            base = np.uint64(cb * cs)
            for c in range(min(16, kc - cb * 16)):
                wv = w[cb * 16 + c]
                k = base + np.uint64(c)
                x0 = xf[f0 + k]
                x1 = xf[f1 + k]
                x2 = xf[f2 + k]
                x3 = xf[f3 + k]
                x4 = xf[f4 + k]
                x5 = xf[f5 + k]
                x6 = xf[f6 + k]
                x7 = xf[f7 + k]
                x8 = xf[f8 + k]
                x9 = xf[f9 + k]
                x10 = xf[f10 + k]
                x11 = xf[f11 + k]
                x12 = xf[f12 + k]
                x13 = xf[f13 + k]
                for l in range(16):
                    u = wv[l]
                    c0[l] += x0 * u
                    c1[l] += x1 * u
                    c2[l] += x2 * u
                    c3[l] += x3 * u
                    c4[l] += x4 * u
                    c5[l] += x5 * u
                    c6[l] += x6 * u
                    c7[l] += x7 * u
                    c8[l] += x8 * u
                    c9[l] += x9 * u
                    c10[l] += x10 * u
                    c11[l] += x11 * u
                    c12[l] += x12 * u
                    c13[l] += x13 * u
        for l in range(16):
            u = bias[np.uint64(ob0 * 16 + l)]
            acc[0, l] = c0[l] + u
            acc[1, l] = c1[l] + u
            acc[2, l] = c2[l] + u
            acc[3, l] = c3[l] + u
            acc[4, l] = c4[l] + u
            acc[5, l] = c5[l] + u
            acc[6, l] = c6[l] + u
            acc[7, l] = c7[l] + u
            acc[8, l] = c8[l] + u
            acc[9, l] = c9[l] + u
            acc[10, l] = c10[l] + u
            acc[11, l] = c11[l] + u
            acc[12, l] = c12[l] + u
            acc[13, l] = c13[l] + u
        store_rows(of, rf, has_res, acc, 0, oo_all, qb, ob0 * os_, min(RB1, q1 - q0 - qb), 1, os_, code, alpha, beta)


@njit(nogil=True, cache=True, fastmath=True)
def _k1x1_narrow(of, xf, wp, bias, rf, has_res, code, alpha, beta, q0, q1, p0, p1, HWo, Wo, HWi, Wi, Cb, Ob, sh, sw,
                 q_outer, pfd, pfo, kc):
    """`_k1x1_wide` for hosts with 256-bit vectors (tiles.NARROW): 5 positions x 1 output block of 16 channels =
    10 ymm accumulators, + 2 for the weight row and 1-5 broadcasts: no spill (7 x 2 blocks need 28
    registers of the 16). Blocks [2 p0, min(2 p1, Ob)) one at a time (an odd last block needs no
    special case). Per input channel: 2 weight loads, 5 broadcasts, 10 FMAs. Each output element is
    the same full-K dot product in the same order as `_k1x1_wide` / `_k1x1_one` (acc = 0; += x[c] * w[c]
    for c ascending; + bias): the same bits whichever kernel runs (2.0-2.4x the 7 x 2 kernel on a
    Zen 3 core, docs/kernels.md)."""
    a0 = nb.carray(stack_f32(16), 16)
    a1 = nb.carray(stack_f32(16), 16)
    a2 = nb.carray(stack_f32(16), 16)
    a3 = nb.carray(stack_f32(16), 16)
    a4 = nb.carray(stack_f32(16), 16)
    acc = nb.carray(stack_f32(80), (5, 16))
    cs = HWi * 16
    os_ = HWo * 16
    nqp = (q1 - q0 + 4) // 5 * 5
    io_all, oo_all = _offsets(q0, q1, nqp + 5 * pfd, HWo, Wo, Wi, Cb, Ob, cs, os_, sh, sw)
    nq = nqp // 5
    b0 = 2 * p0
    nbk = min(2 * p1, Ob) - b0
    ncb = (kc + 15) // 16
    for it in range(nq * nbk):
        if q_outer:  # the 5-position input block stays in L1 while the weights stream from L2
            qb = q0 + (it // nbk) * 5
            ob = b0 + it % nbk
        else:        # a block's weights stay in L1/L2 while the positions stream
            ob = b0 + it // nq
            qb = q0 + (it % nq) * 5
        p = ob // 2
        wo = np.uint64((ob - 2 * p) * 16)
        s0 = qb - q0
        f0, f1, f2, f3, f4 = io_all[s0], io_all[s0 + 1], io_all[s0 + 2], io_all[s0 + 3], io_all[s0 + 4]
        pf = pfd > 0 and ((not q_outer) or it % nbk == 0)
        sp = s0 + 5 * pfd
        if pfo and pfd > 0:
            for r in range(5):
                prefetchw(of, oo_all[sp + r] + ob * os_)
        for l in range(16):
            a0[l] = 0.0
            a1[l] = 0.0
            a2[l] = 0.0
            a3[l] = 0.0
            a4[l] = 0.0
        for cb in range(ncb):
            base = np.uint64(cb * cs)
            if pf:
                for r in range(5):
                    prefetch(xf, io_all[sp + r] + base)
            for c in range(min(16, kc - cb * 16)):
                ci = cb * 16 + c
                k = base + np.uint64(c)
                x0 = xf[f0 + k]
                x1 = xf[f1 + k]
                x2 = xf[f2 + k]
                x3 = xf[f3 + k]
                x4 = xf[f4 + k]
                for l in range(16):
                    u = wp[p, ci, wo + np.uint64(l)]   # indexed in place: a row view costs two refcount updates
                    a0[l] += x0 * u
                    a1[l] += x1 * u
                    a2[l] += x2 * u
                    a3[l] += x3 * u
                    a4[l] += x4 * u
        for l in range(16):
            u = bias[np.uint64(ob * 16 + l)]
            acc[0, l] = a0[l] + u
            acc[1, l] = a1[l] + u
            acc[2, l] = a2[l] + u
            acc[3, l] = a3[l] + u
            acc[4, l] = a4[l] + u
        store_rows(of, rf, has_res, acc, 0, oo_all, s0, ob * os_, min(5, q1 - qb), 1, os_, code, alpha, beta)


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


@njit(nogil=True, cache=True, fastmath=True)
def _k1x1_wide(of, xf, wp, bias, rf, has_res, code, alpha, beta, q0, q1, p0, p1, HWo, Wo, HWi, Wi, Cb, Ob, sh, sw,
               q_outer, pfd, pfo,
          kc):
    """of / rf flat (N*Ob*HWo*16), xf flat (N*Cb*HWi*16); positions [q0, q1), channel pairs [p0, p1);
    the reduction runs over input channels [0, kc) (kc <= Cb*16: the weight rows from kc on are zero).
    A last pair with one real block (Ob odd) goes to `_k1x1_one` (14 positions x 1 block). Hosts
    with 256-bit vectors run `_k1x1_narrow` instead (NARROW, a compile-time constant)."""
    if 2 * (p1 - 1) + 1 >= Ob:   # the range ends with the odd block: pairs [p0, p1 - 1) here
        _k1x1_one(of, xf, wp, bias, rf, has_res, code, alpha, beta, q0, q1, p1 - 1, HWo, Wo, HWi, Wi, Cb, Ob, sh,
                  sw, kc)
        p1 -= 1
        if p1 == p0:
            return
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
    io_all, oo_all = _offsets(q0, q1, nqp + 7 * pfd, HWo, Wo, Wi, Cb, Ob, cs, os_, sh, sw)
    nq = (q1 - q0 + 6) // 7
    npr = p1 - p0
    ncb = (kc + 15) // 16
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
        s0 = qb - q0  # the block's offsets at io_all[s0:s0 + 7] (read in place: no slice, no refcount)
        f0, f1, f2, f3, f4, f5, f6 = (io_all[s0], io_all[s0 + 1], io_all[s0 + 2], io_all[s0 + 3], io_all[s0 + 4],
                                      io_all[s0 + 5], io_all[s0 + 6])
        # software prefetch of the input block pfd blocks ahead (once per block: the many
        # 64-byte-per-position plane streams of a large map defeat the hardware prefetcher)
        pf = pfd > 0 and ((not q_outer) or it % npr == 0)
        sp = s0 + 7 * pfd
        if pfo and pfd > 0:
            for r in range(7):
                prefetchw(of, oo_all[sp + r] + ob0 * os_)
                if two:
                    prefetchw(of, oo_all[sp + r] + (ob0 + 1) * os_)
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
        for cb in range(ncb):
            base = np.uint64(cb * cs)
            if pf:
                for r in range(7):
                    prefetch(xf, io_all[sp + r] + base)
            for c in range(min(16, kc - cb * 16)):
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
        store_rows(of, rf, has_res, acc, 0, oo_all, s0, ob0 * os_, nv, nk, os_, code, alpha, beta)


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
