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
template (tilegen.K1X1 -> _tiles_gen.py). On x86-64 AVX2 hosts (`tiles.ASM_AVX2`) `_k1x1_avx2` runs
instead: 6 positions x 1 block in assembly (`_nb.tile16`: 12 ymm accumulators, which numba's code
spilled), the same bits again.

Thin layers (MobileNetV2, EfficientNet): an odd last output block (Co = 16, 40, 144, ...) is computed
by `_k1x1_one` (14 positions x 1 block) instead of a pair with a zero-weight half, and the
reduction runs over input channels [0, kc), kc = `reduction_length(wp)` (the zero rows padding Ci
to a multiple of 16 are skipped).

Tasks: (block of positions, range of output blocks: whole channel pairs, any range on AVX2 hosts whose
strip runs one block a tile), the grid chosen for the thread count
by planner.plan_k1x1 (small maps at batch 1 split the output channels, seed 000's feature-map
level; large ones positions); the layer's task table runs in one numba parallel loop
(threads.numba_region). Every output element is one full-K dot product computed by the same code
whichever task or thread owns it, so any grid and thread count give bitwise identical results.
"""
from __future__ import annotations

import functools
import os

import numba as nb
import numpy as np
from numba import njit

from tilefuse.kernels.conv._nb import (HALF_ROWS, address, atomic_add, borrow, copy16, mul16, new_counter, prefetch,
                                       prefetch_l2, prefetchw, stack_f32, stack_i64, store16, strip8_rows, strip16_rows,
                                       strip512_rows, take, tile16_rows)
from tilefuse.kernels.conv._tiles_gen import _k1x1_narrow, _k1x1_one, _k1x1_wide, _offsets  # noqa: F401  (tilegen.py)
from tilefuse.kernels.conv.tiles import ASM_512, ASM_AVX2, NARROW
from tilefuse.kernels.conv.epilogue import ACT_CHUNK, EMPTY1, act_block, act_span, bias_or_zeros, resolve_act
from tilefuse.kernels.conv.planner import RB1X1, plan_k1x1
from tilefuse.kernels.threads import numba_max_threads, numba_region, region_threads, resolve_threads, scratch

Q_OUTER = None  # force the loop order (benchmarks); None: the plan's
PF_OUT = 1      # also prefetchw the output lines of the block ahead (docs/kernels.md)
PF_WEIGHTS = 2  # software prefetch of the next channel pair's weight rows (assembly tile)
PF_INPUT_SWEEPS = 0  # 4: pair outer, prefetch the input block on every sweep (else on the first)
PF_BLOCKS = 1  # software-prefetch distance in 7-position blocks (0: off)
STRIPS = True   # stride-1 layers on the assembly strip (_nb.strip16, `_k1x1_strips`); False: tile by tile
# AVX2 strips: a last output block with zero weights in lanes 8-15 on `_nb.strip8` (12 positions x 8 lanes; pfo
# bit 5, set per layer by `half_flag`, read when a layer's task loop or a chain is bound). TILEFUSE_HALF_STRIPS=0
# or False: on strip16 (both halves) as before
HALF_STRIPS = os.environ.get("TILEFUSE_HALF_STRIPS", "1") != "0"
STRIP_GROUP_BYTES = 16384   # q outer: a strip group's input block (positions x kc x 4 B) at most this (L1 / 2)
SR = 14 if ASM_512 else 6   # positions a strip tile (_nb.strip512 / strip16)
SU = 2 if ASM_512 else 1    # output blocks a strip tile
GATHER_STRIDED = True   # strided 1x1s on a strip host: gather the strided positions, then the strip at stride 1
GATHER_VALUES = 8192    # values a gather task writes (whole output rows): tasks enough for many threads
STRIP_K = 128   # the strip's reduction slice (input channels, a multiple of 16, at most 4080; 0: none): longer
                # reductions run in slices whose block weights (STRIP_K x 64 B) stay in L1 (128: 2048 -> 512 at
                # 7x7 0.70x the time of no slices, 256 0.74x; benchmarks/RESULTS.md, fifth session)


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


@njit(inline="always")
def _on_strips(pfo, sh, sw):
    """Whether a task runs on the assembly strips (`_k1x1_strips`): an x86-64 host with the assembly tiles
    (tiles.ASM_AVX2 or ASM_512), STRIPS on (pfo bit 4) and stride 1. `_k1x1_tile` / `_k1x1_avx2` dispatch on
    it, and `_k1x1` does not chunk an activation past clip there (the strips activate their own rows)."""
    return (ASM_AVX2 or ASM_512) and (pfo & 16) != 0 and sh == 1 and sw == 1


@njit(nogil=True, cache=True)
def _k1x1_tile(of, xf, wp, bias, rf, has_res, code, alpha, beta, q0, q1, b0, b1, HWo, Wo, HWi, Wi, Cb, Ob, sh, sw,
               q_outer, pfd, pfo, kc):
    """The micro-kernel of the host's vector width (tiles.NARROW, tiles.ASM_AVX2: compile-time constants) for
    output blocks [b0, b1): any range on ASM_AVX2 hosts (one block a tile), else b0 even (the numba tiles and
    strip512 work on channel pairs: blocks 2p, 2p + 1)."""
    if ASM_512 and _on_strips(pfo, sh, sw):   # stride 1 on AVX-512: the assembly strip
        _k1x1_strips(of, xf, wp, bias, rf, has_res, code, alpha, beta, q0, q1, b0, b1, HWo, Cb, Ob, q_outer, pfo,
                     kc, max(SR, STRIP_GROUP_BYTES // max(1, 4 * kc) // SR * SR), HWo, 0)
    elif ASM_AVX2:
        _k1x1_avx2(of, xf, wp, bias, rf, has_res, code, alpha, beta, q0, q1, b0, b1, HWo, Wo, HWi, Wi, Cb, Ob, sh,
                   sw, q_outer, pfd, pfo, kc)
    elif NARROW:
        _k1x1_narrow(of, xf, wp, bias, rf, has_res, code, alpha, beta, q0, q1, b0 // 2, (b1 + 1) // 2, HWo, Wo, HWi,
                     Wi, Cb, Ob, sh, sw, q_outer, pfd, pfo, kc)
    else:
        _k1x1_wide(of, xf, wp, bias, rf, has_res, code, alpha, beta, q0, q1, b0 // 2, (b1 + 1) // 2, HWo, Wo, HWi,
                   Wi, Cb, Ob, sh, sw, q_outer, pfd, pfo, kc)


@njit(nogil=True, cache=True)
def _k1x1(of, xf, wp, bias, rf, has_res, code, alpha, beta, q0, q1, b0, b1, HWo, Wo, HWi, Wi, Cb, Ob, sh, sw,
          q_outer, pfd, pfo, kc):
    """One task (positions [q0, q1), output blocks [b0, b1): `_k1x1_tile`). Identity, ReLU and clip run in the
    tiles' stores. The other activations (SiLU, GELU, hardswish, ...) are deferred: the task runs in
    chunks of positions whose output (all its blocks) is at most epilogue.ACT_CHUNK floats; each chunk is
    stored with bias (+ residual) and no activation, then activated in place by
    epilogue.act_span over its rows while they are still in L1/L2. A call of the tile's
    per-tile activation (epilogue.act_block, 96-224 values) cost ~120 cycles more than the same
    values in one pass (SiLU on a 16 -> 96 1x1 at 112x112: 2.08 ms against 0.78 ms conv + 0.79 ms
    pass, one Zen 3 core). Each value gets the same operations (bias, residual, then the
    activation), so the bits are those of the per-tile form. Stride-1 layers on the assembly strips
    (tiles.ASM_AVX2 / ASM_512, STRIPS) activate in the strip loop instead, each strip's rows right after
    it stored them (`_k1x1_strips`): the chunks ran every output block's strip over a few positions
    (18 for ConvNeXt's 96 -> 384 expansion), each block's weights read again for every chunk."""
    if code <= 2 or _on_strips(pfo, sh, sw):
        _k1x1_tile(of, xf, wp, bias, rf, has_res, code, alpha, beta, q0, q1, b0, b1, HWo, Wo, HWi, Wi, Cb, Ob, sh,
                   sw, q_outer, pfd, pfo, kc)
        return
    b1 = min(b1, Ob)
    step = max(RB1X1, ACT_CHUNK // ((b1 - b0) * 16) // RB1X1 * RB1X1)
    os_ = HWo * 16
    for c0 in range(q0, q1, step):
        c1 = min(q1, c0 + step)
        _k1x1_tile(of, xf, wp, bias, rf, has_res, 0, alpha, beta, c0, c1, b0, b1, HWo, Wo, HWi, Wi, Cb, Ob, sh,
                   sw, q_outer, pfd, pfo, kc)
        n = c0 // HWo
        while n * HWo < c1:   # the chunk's rows per image: positions [j0, j1) of image n
            j0 = max(c0, n * HWo) - n * HWo
            j1 = min(c1, (n + 1) * HWo) - n * HWo
            for b in range(b0, b1):
                d = (n * Ob + b) * os_
                act_span(of, d + j0 * 16, d + j1 * 16, code, alpha, beta)
            n += 1


@njit(nogil=True, cache=True)
def _upper_half_zero(wp, g, kc):
    """Whether output block g's lanes 8-15 have zero weights in every input channel [0, kc) of the
    pair-packed weights wp (OP, Cip, 32): the block's half that the half strip skips."""
    k = 16 * (g % 2) + 8
    for c in range(kc):
        for lane in range(8):
            if wp[g // 2, c, k + lane] != 0:
                return False
    return True


def half_flag(wp, kc: int, ob: int) -> int:
    """pfo's bit 5 (32) for a 1x1 of ob output blocks: its last block runs on the half strip (HALF_STRIPS,
    AVX2 hosts, lanes 8-15 zero weights), else 0. Decided once per layer (the task loop's arguments, a
    chain's binding), not per strip call."""
    if not HALF_STRIPS or ASM_512 or not ASM_AVX2 or ob < 1:
        return 0
    return 32 if _upper_half_zero(wp, ob - 1, kc) else 0


@njit(nogil=True, cache=True)
def _k1x1_strips(of, xf, wp, bias, rf, has_res, code, alpha, beta, q0, q1, b0, b1, HWo, Cb, Ob, q_outer, pfo, kc,
                 group, HWi, xsh):
    """`_k1x1_avx2` for a stride-1 layer on the assembly strip (`_nb.strip16`): the task's positions
    in groups, each group's blocks one after the other, a block's positions of one image in one strip
    call (whole 6-position tiles, then one call for the rest), stored (bias, residual, identity / ReLU /
    clip) by the assembly. Pair outer (q_outer False): one group, the whole task (a block's weights
    stay in L1 while its positions stream); q outer: groups of `group` positions (their input block
    stays in L1 while the blocks' weights stream from L2). A long reduction (kc > the slice in pfo's
    bits 8-15, x 16 channels: STRIP_K) runs in slices of that many input channels, each slice over all
    the group's blocks (a block's slice of weights stays in L1: 2048 channels were 128 KiB a block,
    streamed from L2 for every tile), the partial sums stored in the output and the next slice's chain
    going on from them (the same FMAs in the same order: the same bits); bias, residual and activation
    with the last slice. The bits are the tile's (the same FMA chain, then + bias, + residual, the
    activation as store16; an activation past clip, which the assembly does not have, by act_span over
    each strip's stored rows while they are in L1). On AVX-512 hosts (tiles.ASM_512) the strip is `_nb.strip512`: SR = 14
    positions x SU = 2 blocks a tile (one block for an odd last one), and a tile never crosses an
    image's end (the image's last positions are a partial tile).
    HWi: positions per input channel block (HWo for a layer; a row band's for the fused chains of
    kernels/conv/chain.py); xsh: output position j of an image reads input position j + xsh."""
    pp = stack_i64(17)
    prm = nb.carray(pp, 17)
    ab = nb.carray(stack_f32(2), 2)
    ab[0] = alpha
    ab[1] = beta
    cs = HWo * 16
    ci_s = HWi * 16       # input channel block stride
    u0 = b0               # output blocks [b0, b1) (an odd b0 on AVX-512: its first block alone)
    nu = min(b1, Ob) - u0
    ncb = (kc + 15) // 16
    kb = ((pfo >> 8) & 255) * 16
    if kb == 0 or kb >= kc:
        kb = max(kc, 16)
    elif has_res:   # a residual sharing the output's memory would be overwritten by the partial sums
        o0 = address(of, 0)
        r0 = address(rf, 0)
        if o0 < r0 + 4 * rf.size and r0 < o0 + 4 * of.size:
            kb = max(kc, 16)
    nkb = (kc + kb - 1) // kb if kc > 0 else 1
    if nkb > 1 and q_outer:
        group = max(SR, STRIP_GROUP_BYTES // (4 * kb) // SR * SR)
    prm[2] = ci_s * 4     # input chunk stride
    prm[16] = cs * 4      # output block g + 1 (strip512's second block): HWo * 16 floats on
    prm[5] = wp.shape[2] * 4
    post = code > 2                 # past clip: the rows stored without it, then act_span over them in place
    scode = 0 if post else code
    prm[10] = scode
    prm[11] = address(ab, 0)
    wf = wp.reshape(wp.size)
    ps = wp.shape[1] * 32
    # tile16's parameter block, for tiles that cross an image boundary (one slice only)
    acc = nb.carray(stack_f32(96), (6, 16))
    tpp = stack_i64(13)
    tp = nb.carray(tpp, 13)
    # on the stack: three heap arrays cost ~1000 cycles a call, as much as a tile's FMAs (a batch-1 task)
    if ncb <= 256:
        table = nb.carray(stack_i64(256), 256)
    else:
        table = np.empty(ncb, np.int64)
    for cb in range(ncb):
        table[cb] = cb * ci_s * 4
    xoff = nb.carray(stack_i64(6), 6)
    ooff = nb.carray(stack_i64(6), 6)
    tp[7] = ncb
    tp[8] = kc - 16 * (ncb - 1)
    tp[9] = address(table, 0)
    tp[10] = wp.shape[2] * 4
    tp[11] = address(acc.reshape(96), 0)
    span = group if q_outer else q1 - q0
    # the last output block on the half strip (AVX2; pfo bit 5: its lanes 8-15 all zero weights, `half_flag`)
    half = not ASM_512 and (pfo & 32) != 0 and u0 + nu == Ob
    for a0 in range(q0, q1, span):
        a1 = min(q1, a0 + span)
        for ks in range(nkb):
            k0 = ks * kb
            k1 = min(kc, k0 + kb)
            nch = (k1 - k0 + 15) // 16
            prm[3] = nch
            prm[4] = (k1 - k0) - 16 * (nch - 1)
            prm[14] = 1 if ks > 0 else 0
            fin = ks == nkb - 1
            prm[15] = 1 if fin else 0
            xk = (k0 // 16) * ci_s
            g = u0
            while g < u0 + nu:
                # blocks in this strip: 2 on AVX-512 (a pair of the packing, wp[g // 2]), but an odd last
                # block, and an odd first one alone (a task starting at an odd block: SplitChain's groups
                # of 3; strip512 reads its second block 16 floats after the first, in the same pair)
                nbk = 1 if g % 2 else min(SU, u0 + nu - g)
                p = g // 2
                wo = p * ps + (g - 2 * p) * 16
                # the rows the strip computes next, prefetched row by row as this block's are read
                # (PF_WEIGHTS): the next block's slice, else the first block's next slice, else (the next
                # group) its first slice
                gn, kn = g + nbk, k0
                if gn >= u0 + nu:
                    gn, kn = u0, (k0 + kb if ks + 1 < nkb else 0)
                    if ks + 1 == nkb and a0 + span >= q1:
                        gn, kn = g, k0   # nothing after this block: a distance of 0
                won = (gn // 2) * ps + (gn % 2) * 16 + kn * 32
                prm[13] = (won - wo - k0 * 32) * 4 if (pfo & 2) else 0
                prm[1] = address(wf, wo + k0 * 32)
                prm[8] = address(bias, g * 16)
                prm[12] = 1 if g == u0 or (pfo & 4) else 0   # the input: on the group's first block's sweep
                tp[1] = prm[1]
                tp[12] = prm[8]
                hb = half and g == Ob - 1
                sr = HALF_ROWS if hb else SR
                j = a0
                while j < a1:
                    n = j // HWo
                    jj = j - n * HWo
                    end = min(a1, (n + 1) * HWo)
                    nt = (end - j) // sr
                    if nt > 0:   # the image's whole tiles
                        oo = ((n * Ob + g) * HWo + jj) * 16
                        prm[0] = address(xf, (n * Cb * HWi + jj + xsh) * 16 + xk)
                        prm[6] = address(of, oo)
                        prm[7] = nt
                        prm[9] = address(rf, oo) if has_res and fin else 0
                        if ASM_512:
                            strip512_rows(pp, SR, nbk)
                        elif hb:
                            strip8_rows(pp, HALF_ROWS)
                        else:
                            strip16_rows(pp, 6)
                        if post and fin:
                            for b in range(nbk):
                                act_span(of, oo + b * cs, oo + b * cs + 16 * sr * nt, code, ab[0], ab[1])
                        j += sr * nt
                    if j == end:
                        continue
                    if end < a1 and nkb == 1 and not ASM_512 and not hb:
                        # the image's last positions and the next image's first in one tile (7x7 maps of a
                        # batch: a partial tile at every image's end cost 5-7%): tile16 on gathered offsets
                        nv = min(6, a1 - j)
                        for r in range(nv):
                            pos = j + r
                            nr = pos // HWo
                            jr = pos - nr * HWo
                            xoff[r] = (nr * Cb * HWi + jr + xsh) * 16
                            ooff[r] = ((nr * Ob + g) * HWo + jr) * 16
                        tp[0] = address(xf, xoff[0])
                        for r in range(1, 6):
                            tp[1 + r] = (xoff[min(r, nv - 1)] - xoff[0]) * 4
                        tile16_rows(tpp, nv)
                        for r in range(nv):
                            d = np.uint64(ooff[r])
                            store16(of, d, acc, r * 16, rf, d, has_res, scode, alpha, beta)
                            if post:
                                act_span(of, ooff[r], ooff[r] + 16, code, ab[0], ab[1])
                        j += nv
                    else:        # the image's (or group's) last positions
                        jj = j - n * HWo
                        oo = ((n * Ob + g) * HWo + jj) * 16
                        prm[0] = address(xf, (n * Cb * HWi + jj + xsh) * 16 + xk)
                        prm[6] = address(of, oo)
                        prm[7] = 1
                        prm[9] = address(rf, oo) if has_res and fin else 0
                        if ASM_512:
                            strip512_rows(pp, end - j, nbk)
                        elif hb:
                            strip8_rows(pp, end - j)
                        else:
                            strip16_rows(pp, end - j)
                        if post and fin:
                            for b in range(nbk):
                                act_span(of, oo + b * cs, oo + b * cs + 16 * (end - j), code, ab[0], ab[1])
                        j = end
                g += nbk


@njit(nogil=True, cache=True)
def _k1x1_avx2(of, xf, wp, bias, rf, has_res, code, alpha, beta, q0, q1, b0, b1, HWo, Wo, HWi, Wi, Cb, Ob, sh, sw,
               q_outer, pfd, pfo, kc):
    """`_k1x1_narrow` with the assembly tile `_nb.tile16` (x86-64 AVX2 hosts, tiles.ASM_AVX2): 6
    positions x 1 block, a partial last tile of a task only its positions. The same arguments, loop
    orders, prefetches, epilogue and bits. The numba code around the tile fills its parameter block
    (the positions' input offsets; output block g's weight rows in the pair-packed wp:
    wp[g // 2, c, 16 * (g % 2) + l], 128 bytes apart; chunk cb of 16 input channels at cb * HWi * 64
    bytes) and stores it (epilogue.store_rows' forms)."""
    if _on_strips(pfo, sh, sw):   # stride 1: the assembly strip (STRIPS)
        _k1x1_strips(of, xf, wp, bias, rf, has_res, code, alpha, beta, q0, q1, b0, b1, HWo, Cb, Ob, q_outer, pfo,
                     kc, max(SR, STRIP_GROUP_BYTES // max(1, 4 * kc) // SR * SR), HWo, 0)
        return
    acc = nb.carray(stack_f32(96), (6, 16))
    pp = stack_i64(13)   # the tile's parameter block (_nb.tile16)
    prm = nb.carray(pp, 13)
    cs = HWi * 16
    os_ = HWo * 16
    nqp = (q1 - q0 + 5) // 6 * 6
    io_all, oo_all = _offsets(q0, q1, nqp + 6 * pfd, HWo, Wo, Wi, Cb, Ob, cs, os_, sh, sw)
    nq = nqp // 6
    u0 = b0  # units of a step: output blocks
    nu = min(b1, Ob) - u0
    ncb = (kc + 15) // 16
    table = np.empty(max(ncb, 1), np.int64)   # chunk cb's byte offset
    for cb in range(ncb):
        table[cb] = cb * cs * 4
    prm[7] = ncb
    prm[8] = kc - 16 * (ncb - 1)
    prm[9] = address(table, 0)
    prm[10] = wp.shape[2] * 4
    prm[11] = address(acc.reshape(96), 0)
    wf = wp.reshape(wp.size)
    ps = wp.shape[1] * 32                       # floats per channel pair (its kc rows: 2 * kc lines)
    wl = 2 * kc
    pl = (u0 + nu - 1) // 2                     # the task's last pair
    wper = (wl + 2 * nq - 1) // (2 * nq)        # next-pair lines per tile (pair outer)
    if (pfo & 2) and not q_outer:               # the first pair's first lines at once (its first tile waits on them)
        for l in range(min(wl, 64)):
            prefetch(wf, u0 // 2 * ps + l * 16)
    for it in range(nq * nu):
        if q_outer:  # a 6-position input block stays in L1 while the weights stream from L2
            qb = q0 + (it // nu) * 6
            g = u0 + it % nu
        else:        # a block's weights stay in L1/L2 while the positions stream
            g = u0 + it // nq
            qb = q0 + (it % nq) * 6
        p = g // 2
        if pfo & 2:   # software prefetch of the weights (PF_WEIGHTS)
            if not q_outer:
                # the next pair's rows, spread over this pair's tiles; while on the first block, the
                # first pair's rest too
                j = (g - 2 * p) * nq + it % nq
                if p < pl:   # into L2 (prefetcht1): into L1 it evicted this pair's rows where K is large
                    for l in range(j * wper, min(wl, (j + 1) * wper)):
                        prefetch_l2(wf, (p + 1) * ps + l * 16)
                if it < nq:
                    for l in range(64 + j * wper, min(wl, 64 + (j + 1) * wper)):
                        prefetch(wf, p * ps + l * 16)
            elif it < nu and g % 2 == 0 and p < pl:   # the first position block: the next pair's rows
                for l in range(wl):
                    prefetch_l2(wf, (p + 1) * ps + l * 16)
        s0 = qb - q0
        f0 = io_all[s0]
        prm[0] = address(xf, f0)
        for r in range(1, 6):
            prm[1 + r] = (np.int64(io_all[s0 + r]) - np.int64(f0)) * 4
        prm[1] = address(wf, (p * wp.shape[1]) * 32 + (g - 2 * p) * 16)
        prm[12] = address(bias, g * 16)
        # the input block pfd blocks ahead: once per position block (q outer), on the first block's
        # sweep (pair outer: later sweeps find it in L1/L2; PF_INPUT_SWEEPS: on every sweep)
        if pfd > 0 and ((it % nu == 0) if q_outer else (it < nq or (pfo & 4) != 0)):
            sp = s0 + 6 * pfd
            for r in range(6):
                for cb in range(ncb):
                    prefetch(xf, io_all[sp + r] + np.uint64(cb * cs))
        if pfd > 0 and (pfo & 1) and ((not q_outer) or it % nu == 0):
            sp = s0 + 6 * pfd
            for r in range(6):
                prefetchw(of, oo_all[sp + r] + g * os_)
        nv = min(6, q1 - qb)
        tile16_rows(pp, nv)
        if code > 2:   # the other activations: one call per tile (their exp / erf code stays out)
            act_block(borrow(of), borrow(rf), has_res, acc, 0, borrow(oo_all), s0, g * os_, nv, 1, os_, code, alpha,
                      beta)
        else:
            for r in range(nv):
                d = np.uint64(g * os_ + oo_all[s0 + r])
                store16(of, d, acc, r * 16, rf, d, has_res, code, alpha, beta)


@njit(parallel=True, nogil=True, cache=True)
def _k1x1_par(nt, tasks, of, xf, wp, bias, rf, has_res, code, alpha, beta, HWo, Wo, HWi, Wi, Cb, Ob, sh, sw,
              q_outer, pfd, pfo, kc):
    """Every task of the layer on numba's pool: tasks (T, 4) = (q0, q1, b0, b1)."""
    counter = new_counter(nt)  # tasks handed out by `take`: own chunk first (stragglers never stall)
    for _w in nb.prange(nt):
        _k1x1_seq(counter, nb.get_thread_id(), tasks, of, xf, wp, bias, rf, has_res, code, alpha, beta, HWo, Wo, HWi,
                  Wi, Cb, Ob, sh, sw, q_outer, pfd, pfo, kc)


@njit(nogil=True, cache=True)
def _k1x1_seq(counter, tid, tasks, of, xf, wp, bias, rf, has_res, code, alpha, beta, HWo, Wo, HWi, Wi, Cb, Ob, sh, sw,
              q_outer, pfd, pfo, kc):
    """One worker of the task loop on the calling thread: tasks taken from `counter` (threads.numba_region)."""
    while True:
        i = take(counter, tid, tasks.shape[0])
        if i < 0:
            break
        _k1x1(of, xf, wp, bias, rf, has_res, code, alpha, beta, tasks[i, 0], tasks[i, 1], tasks[i, 2], tasks[i, 3],
              HWo, Wo, HWi, Wi, Cb, Ob, sh, sw, q_outer, pfd, pfo, kc)


@njit(nogil=True, cache=True)
def _k1x1_scaled_seq(counter, tid, tasks, of, xf, wk, sc, scr, done, bias, rf, has_res, code, alpha, beta, HWo, Wo,
                     HWi, Wi, Cb, Ob, sh, sw, q_outer, pfd, pfo, kc):
    """`_k1x1_seq` for a 1x1 with a per-input-channel scale sc (Cip,) (the fused squeeze-excitation,
    kernels/se_conv.py): before its tiles, a task scales the rows [0, kc) of its channel pairs of the
    unscaled packed weights wk into this thread's scratch scr[tid] (wk's shape), once per pair and
    call (done[tid, p]), and runs the tiles on those. The scaled weights are wk * sc, rounded as
    k1x1.prepare(w * s) rounds them, so the bits are those of scaling all the weights first; the
    scaling is spread over the threads with the tasks and lands in the cache of the core that reads
    it."""
    w = scr[tid]
    wf = w.reshape(w.size)
    wkf = wk.reshape(wk.size)
    cip = wk.shape[1]
    for p in range(done.shape[1]):      # this thread's flags (its row only: no other worker touches it)
        done[tid, p] = 0
    while True:
        i = take(counter, tid, tasks.shape[0])
        if i < 0:
            break
        for p in range(tasks[i, 2] // 2, (tasks[i, 3] + 1) // 2):   # the pairs of its blocks
            if done[tid, p] == 0:
                done[tid, p] = 1
                for ci in range(kc):            # two 16-lane multiplies per input channel (_nb.mul16)
                    f = sc[ci]
                    o = (p * cip + ci) * 32
                    mul16(wf, o, wkf, o, f, 0)
                    mul16(wf, o + 16, wkf, o + 16, f, 0)
        _k1x1(of, xf, w, bias, rf, has_res, code, alpha, beta, tasks[i, 0], tasks[i, 1], tasks[i, 2], tasks[i, 3],
              HWo, Wo, HWi, Wi, Cb, Ob, sh, sw, q_outer, pfd, pfo, kc)


@njit(parallel=True, nogil=True, cache=True)
def _k1x1_scaled_par(nt, tasks, of, xf, wk, sc, scr, done, bias, rf, has_res, code, alpha, beta, HWo, Wo, HWi, Wi,
                     Cb, Ob, sh, sw, q_outer, pfd, pfo, kc):
    """_k1x1_scaled_seq's workers on numba's pool."""
    counter = new_counter(nt)
    for _w in nb.prange(nt):
        _k1x1_scaled_seq(counter, nb.get_thread_id(), tasks, of, xf, wk, sc, scr, done, bias, rf, has_res, code,
                         alpha, beta, HWo, Wo, HWi, Wi, Cb, Ob, sh, sw, q_outer, pfd, pfo, kc)


@njit(nogil=True, cache=True)
def _strided_seq(counter, tid, xs, x, sh, sw, rows):
    """One worker of the strided gather (run_nchwc): xs[n, c, i, j] = x[n, c, i*sh, j*sw] (NCHW16c), a task
    per (image, channel block, `rows` output rows), each position one 16-lane copy (`_nb.copy16`; as a
    5-d indexed lane loop numba left it scalar, ~1 value a nanosecond: 96 us for RegNetY's 32-channel
    112x112 -> 56x56 gather, 20 us now, and N x Cb tasks only: 2 for that layer at batch 1)."""
    N, Cb, Ho, Wo, _ = xs.shape
    H, W = x.shape[2], x.shape[3]
    xf, xsf = x.reshape(x.size), xs.reshape(xs.size)
    per = -(-Ho // rows)
    while True:
        t = atomic_add(counter, 0, 1)
        if t >= N * Cb * per:
            break
        nc = t // per                       # image * Cb + channel block
        i0 = (t - nc * per) * rows
        for i in range(i0, min(i0 + rows, Ho)):
            d = ((nc * Ho + i) * Wo) * 16
            s = ((nc * H + i * sh) * W) * 16
            for j in range(Wo):
                copy16(xsf, d + 16 * j, xf, s + 16 * sw * j)


@njit(parallel=True, nogil=True, cache=True)
def _strided_par(nt, xs, x, sh, sw, rows):
    counter = np.zeros(1, np.int64)
    for _w in nb.prange(nt):
        _strided_seq(counter, nb.get_thread_id(), xs, x, sh, sw, rows)


@functools.lru_cache(maxsize=1024)
def task_table(total: int, ob: int, q: int, b: int) -> np.ndarray:
    """(T, 4) int64 rows (q0, q1, b0, b1): position blocks outer, ranges of b output blocks inner (b even but on
    AVX2 hosts, planner.plan_k1x1's "B"; read-only, shared by the calls of a layer shape)."""
    t = np.array([(q0, min(q0 + q, total), b0, min(b0 + b, ob)) for q0 in range(0, total, q) for b0 in range(0, ob, b)],
                 np.int64).reshape(-1, 4)
    t.flags.writeable = False
    return t


def _task_loop(out_b, x_b, prepared, residual_b, stride, code, al, be, threads, plan) -> tuple:
    """The arguments of `_k1x1_seq` after (counter, tid) for a layer whose strided positions were gathered
    already where the strips need it (run_nchwc): (tasks, of, xf, wp, bias, rf, has_res, code, alpha, beta,
    HWo, Wo, HWi, Wi, Cb, Ob, sh, sw, q_outer, pfd, pfo, kc)."""
    wp, bias = prepared["weight"], prepared["bias"]
    n, cb, h, w, _ = x_b.shape
    _, ob, ho, wo, _ = out_b.shape
    op, cip, _ = wp.shape
    hw = ho * wo
    pl = plan or plan_k1x1(cip, op, n * hw, threads, ob)
    tasks = task_table(n * hw, ob, pl["Q"], pl.get("B", 2 * pl["P"]))   # a plan of pairs only (P): whole pairs
    has_res = residual_b is not None
    rf = residual_b.reshape(-1) if has_res else EMPTY1
    qo = Q_OUTER if Q_OUTER is not None else pl["q_outer"]
    kc = prepared.get("kc")
    if kc is None:
        kc = reduction_length(wp)
    pfo = (PF_OUT | PF_WEIGHTS | PF_INPUT_SWEEPS | (16 if STRIPS else 0) | half_flag(wp, kc, ob)
           | (min(255, STRIP_K // 16) << 8))
    return (tasks, out_b.reshape(-1), x_b.reshape(-1), wp, bias, rf, has_res, code, al, be, hw, wo, h * w, w, cb, ob,
            int(stride[0]), int(stride[1]), qo, PF_BLOCKS, pfo, kc)


def run_nchwc(out_b, x_b, prepared, residual_b=None, *, stride=(1, 1), relu=False, act=None, threads=None,
              plan=None, input_scale=None) -> None:
    """x_b (N, Cb, H, W, 16) -> out_b (N, Ob, Ho, Wo, 16), no padding (1x1).

    plan: from planner.plan_k1x1 (default: the one for `threads`). input_scale: None, or a float32
    per-input-channel scale (at least the weights' used input channels, `prepared["kc"]` or
    reduction_length) applied to the weights task by task (`_k1x1_scaled_seq`; the fused
    squeeze-excitation of kernels/se_conv.py, one image per call)."""
    code, al, be = resolve_act(relu, act, "gemm1x1")
    wp = prepared["weight"]
    n, cb, h, w, _ = x_b.shape
    ho, wo = out_b.shape[2:4]
    op, cip, _ = wp.shape
    if cip != cb * 16:
        raise ValueError(f"gemm1x1 (NCHWc): weight has {cip} input channels, input {cb * 16}")
    threads = resolve_threads(threads)
    if tuple(stride) != (1, 1) and STRIPS and GATHER_STRIDED and (ASM_512 or ASM_AVX2):
        # the strips (AVX2 and AVX-512) read a tile's positions 64 bytes apart: the strided positions (a quarter
        # of the input at stride 2, ResNet's projection shortcuts) are gathered into a scratch map first, then
        # the strip runs at stride 1. The same products in the same order: the same bits as the strided tiles
        # (on Zen 3, 2 threads, ResNet50's projections 0.71-0.80x the time of the strided tile path).
        xs = scratch("k1x1_strided", (n, cb, ho, wo, 16))
        rows = max(1, GATHER_VALUES // (16 * wo))          # output rows per gather task
        x_c = x_b if x_b.flags.c_contiguous else np.ascontiguousarray(x_b)
        numba_region(_strided_par, _strided_seq, threads, n * cb * -(-ho // rows), xs, x_c, int(stride[0]),
                     int(stride[1]), rows)
        x_b, stride, h, w = xs, (1, 1), ho, wo
    loop = _task_loop(out_b, x_b, prepared, residual_b, stride, code, al, be, threads, plan)
    tasks, kc = loop[0], loop[-1]
    if input_scale is None:
        numba_region(_k1x1_par, _k1x1_seq, threads, len(tasks), *loop)
        return
    sc = np.asarray(input_scale, np.float32).reshape(-1)
    if sc.shape[0] < kc:
        raise ValueError(f"gemm1x1 (NCHWc): input scale has {sc.shape[0]} channels, the weights use {kc}")
    # one scaled-weights scratch row per thread of the region (thread ids range over numba's pool); the
    # flags are scratch too, each worker clearing its own row first (a call's task loop can be replayed:
    # threads.replaying)
    nrows = numba_max_threads() if region_threads(threads, len(tasks)) > 1 else 1
    scr = scratch("k1x1_scaled_w", (nrows,) + wp.shape)
    done = scratch("k1x1_scaled_done", (nrows, op), np.uint8)
    numba_region(_k1x1_scaled_par, _k1x1_scaled_seq, threads, len(tasks), *loop[:4], sc, scr, done, *loop[4:])
