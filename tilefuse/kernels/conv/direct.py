"""Direct kxk convolution on the blocked NCHWc layout (seed 000, conv3x3 strategy, on AVX-512).

Layouts:
  input   xb (N, Cb, Hp, Wp, 16)       NCHWc, already zero padded (no bounds checks inside)
  weights wb (Ob, Cb, KH, KW, 16, 16)  wb[ob, cb, kh, kw, ci, co] = w[ob*16+co, cb*16+ci, kh, kw]
  output     (N, Ob, Ho, Wo, 16)       NCHWc (or NCHW through `run`)

Vectorized over a block of 16 output channels (one zmm register: the analogue of the paper's
48 lanes = 16 PEs x 3 FMACs) and register-blocked over 7 output positions x 2 output-channel
blocks (`_direct_rows2`; 5 x 1 on hosts with 256-bit vectors, the 6 x 1 assembly tile `_direct_rows_avx2`
on x86-64 ones, the 14 x 2 AVX-512 strip `_direct_rows_512` on AVX-512 ones; the numba tiles generated from one
template, tilegen.DIRECT): 14 accumulators live in registers for the whole Ci*KH*KW reduction. Partitioning (planner.plan_direct, for the thread
count): a task is (one image, a band of output rows, a group of output-channel blocks): whole
images per task at large batch (task level), row bands (window level: cores split the image
into regions), and channel-block groups too on small late layers. The layer's task table runs in
one numba parallel loop (threads.numba_region). Each output element's reduction is the same
whichever task computes it, so every grid and thread count gives the same bits.
Any kernel size, stride, dilation and padding (copied per task into a zero-bordered band).
"""
from __future__ import annotations

import functools

import numba as nb
import numpy as np
from numba import njit

from tilefuse.kernels.conv._nb import (LANES, address, copy16, dpair512_rows, dstrip512_rows, new_counter, stack_f32,
                                       stack_i64, take, tile16_rows, tile16a_rows)
from tilefuse.kernels.conv._tiles_gen import _direct_rows2_wide, _direct_rows_narrow  # (tilegen.DIRECT)
from tilefuse.kernels.conv.tiles import ASM_512, ASM_AVX2, NARROW
from tilefuse.kernels.activations import apply_scalar
from tilefuse.kernels.fpflags import FAST
from tilefuse.kernels.conv.epilogue import (ACT_CHUNK, EMPTY4, IDENTITY, RB_OFFSETS, act_span, bias_or_zeros, resolve_act,
                                            store_rows)
from tilefuse.kernels.conv.layout import to_nchwc
from tilefuse.kernels.conv.planner import plan_direct
from tilefuse.kernels.threads import (numba_max_threads, numba_region, parallel_for, region_threads, resolve_threads,
                                      scratch)


# The AVX-512 strip prefetches the next block pair's weights into L2 during the second and third calls on a
# pair (`_direct_rows_512`). At batch 1 a late layer's weights come from DRAM (ResNet50's 9.4 MB 512-channel
# 3x3s; this VM's L3 share held ~40 MB): a pair's first call streamed them (14 positions a weight: 7 FLOP a
# byte, ~13 GB/s a core) while the later calls, on L2, left the memory idle. In ResNet50's batch-1 run on 2
# threads the three 7x7 layers went 1130-1142 / 1044-1052 / 1046 -> 968-993 / 859-865 / 863-865 us, the direct
# layers' sum 8.83 -> 8.03 ms (benchmarks/RESULTS.md, twenty-eighth session). False: no prefetch.
PF_NEXT_PAIR = True
SLICE_BYTES = 20480   # AVX2 tiles: the reduction in slices of input-channel blocks whose weights are at most this
                      # (one block at least: 2 at 3x3; `_direct_rows_avx2_sliced`)
SLICE_PART_BYTES = 65536   # ... where the task's partial sums (64 B a position) are at most this (else unsliced)


def pack_weights(w: np.ndarray) -> np.ndarray:
    """(Co, Ci, KH, KW) -> (Ob, Cb, KH, KW, 16ci, 16co), zero padded channels."""
    co, ci, kh, kw = w.shape
    ob, cb = -(-co // LANES), -(-ci // LANES)
    wp = np.zeros((ob * LANES, cb * LANES, kh, kw), np.float32)
    wp[:co, :ci] = w
    # (Ob*16co, Cb*16ci, KH, KW) -> (Ob, 16co, Cb, 16ci, KH, KW) -> (Ob, Cb, KH, KW, 16ci, 16co)
    return np.ascontiguousarray(wp.reshape(ob, LANES, cb, LANES, kh, kw).transpose(0, 2, 4, 5, 3, 1))


def prepare(w, b) -> dict:
    co = w.shape[0]
    bias = np.zeros(-(-co // LANES) * LANES, np.float32)
    bias[:co] = bias_or_zeros(b, co)
    return {"weight": pack_weights(np.asarray(w, np.float32)), "bias": bias}


# the padded input rows and columns [r0, r1) x [c0, c1) that hold the image: the whole plane (no zero border)
ALL_LIVE = (-(1 << 40), 1 << 40, -(1 << 40), 1 << 40)


@njit(nogil=True, cache=True)
def _live_range(o0, o1, s, d, k, lo, hi):
    """The kernel taps [a, b) (of k, d apart) that some output i in [o0, o1] reads inside [lo, hi) of
    the padded input (output i's tap j reads i*s + j*d): the hull over the outputs of each one's live
    taps, (0, 0) when none is live."""
    a, b = k, 0
    for i in range(o0, o1 + 1):
        j0 = max(0, -((i * s - lo) // d))        # first j with i*s + j*d >= lo
        j1 = min(k, -((i * s - hi) // d))       # first j with i*s + j*d >= hi
        if j0 < j1:
            a = min(a, j0)
            b = max(b, j1)
    if a >= b:
        return 0, 0
    return a, b


@njit(nogil=True, cache=True)
def _live_taps(kr, t, pb, nv, Wo, sh, sw, dh, dw, KH, KW, live):
    """kr[t] = (kernel rows [a, b), kernel columns [c, d)) live for the tile of positions [pb, pb + nv) of
    a band (flat over its rows, Wo a row): the hulls over the tile's rows and over its columns, so that
    every position's live taps are among them."""
    y0, y1 = pb // Wo, (pb + nv - 1) // Wo
    kr[t, 0], kr[t, 1] = _live_range(y0, y1, sh, dh, KH, live[0], live[1])
    xa, xb = pb - y0 * Wo, pb + nv - 1 - y1 * Wo
    if y0 == y1:
        kr[t, 2], kr[t, 3] = _live_range(xa, xb, sw, dw, KW, live[2], live[3])
    elif y1 == y0 + 1:          # the tile wraps to the next row: the end of one, the start of the other
        a0, b0 = _live_range(xa, Wo - 1, sw, dw, KW, live[2], live[3])
        a1, b1 = _live_range(0, xb, sw, dw, KW, live[2], live[3])
        if a0 >= b0:
            a0, b0 = a1, b1
        elif a1 < b1:
            a0, b0 = min(a0, a1), max(b0, b1)
        kr[t, 2], kr[t, 3] = a0, b0
    else:
        kr[t, 2], kr[t, 3] = _live_range(0, Wo - 1, sw, dw, KW, live[2], live[3])


# a tile runs its live taps only (`_live_tile_calls`) where at most this fraction of its taps is live: the
# calls per input block cost about what a third of the taps saves (one Zen 3 core, alternated in one process
# against every tap: ResNet50's 512-channel 7x7 layer, whose top and bottom rows' tiles have 6 of 9 taps
# live, 0.86-1.05x the time split, 0.98-1.03x not; DeepLabV3's dilation-12 ASPP conv 0.87-0.88x split
# everywhere, 0.89-0.96x with this rule; dilation 24 0.35-0.50x either way)
LIVE_SPLIT = 0.6


@njit(nogil=True, cache=True)
def _split_tile(kr, t, KH, KW):
    """Does tile t run its live taps only (kr[t]; LIVE_SPLIT)?"""
    live = max(0, kr[t, 1] - kr[t, 0]) * max(0, kr[t, 3] - kr[t, 2])
    return live < KH * KW and live <= LIVE_SPLIT * KH * KW


@njit(nogil=True, cache=True)
def _live_tile_calls(pp, prm, nv, wf, table, kr, t, wob, c0, c1, KH, KW, b0):
    """One tile's slice [c0, c1) of input blocks over its live taps only (kr[t]): per block and live kernel
    row one tile call over the row's live columns (consecutive chunks in the weights' and the table's
    (cb, kh, kw) order; with every column live, one call over the block's live rows), the first of the
    tile's reduction from zero (tile16, when c0 == 0), the others resuming (tile16a); the bias b0 (0: none)
    with the slice's last call. No live tap: the slice adds nothing (the bias only, or zeros as the first)."""
    ky0, ky1, kx0, kx1 = kr[t, 0], kr[t, 1], kr[t, 2], kr[t, 3]
    prm[12] = 0
    if ky0 >= ky1 or kx0 >= kx1:
        prm[7] = 0
        prm[12] = b0
        if c0 == 0:
            tile16_rows(pp, nv)
        elif b0 != 0:
            tile16a_rows(pp, nv)
        return
    # every column live: the block's live rows are one run of chunks (one call a block)
    step = ky1 - ky0 if kx1 - kx0 == KW else 1
    prm[7] = (kx1 - kx0) * step
    for cb in range(c0, c1):
        for ky in range(ky0, ky1, step):
            j = (cb * KH + ky) * KW + kx0
            prm[1] = address(wf, wob + j * 256)
            prm[9] = address(table, j)
            if cb == c1 - 1 and ky + step >= ky1:
                prm[12] = b0
            if c0 == 0 and cb == c0 and ky == ky0:
                tile16_rows(pp, nv)
            else:
                tile16a_rows(pp, nv)


@njit(nogil=True, cache=True)
def _direct_rows_avx2(out, n_out, q_off, xb, n, x_row0, wb, oh0, oh1, Wo, Wp, sh, sw, dh, dw, bias, res, has_res,
                      code, alpha, beta, o0, o1):
    """`_direct_rows_narrow` with the assembly tile `_nb.tile16` (x86-64 AVX2 hosts, tiles.ASM_AVX2): 6
    consecutive output positions x 1 block, a partial last tile only its positions; the same
    arguments, order of the reduction, epilogue and bits. The reduction's chunks are the (cb, kh, kw)
    taps in the weights' order (16 input channels each, at the tap's offset from the position), the
    weight rows wb[ob, cb, kh, kw, ci] 64 bytes apart. The reduction runs in slices of input-channel
    blocks whose weights fit SLICE_BYTES (`_direct_rows_avx2_sliced`)."""
    KH, KW = wb.shape[2], wb.shape[3]
    _direct_rows_avx2_sliced(out, n_out, q_off, xb, n, x_row0, wb, oh0, oh1, Wo, Wp, sh, sw, dh, dw, bias, res,
                             has_res, code, alpha, beta, o0, o1, max(1, SLICE_BYTES // (KH * KW * 1024)), ALL_LIVE)


@njit(nogil=True, cache=True)
def _direct_rows_avx2_sliced(out, n_out, q_off, xb, n, x_row0, wb, oh0, oh1, Wo, Wp, sh, sw, dh, dw, bias, res,
                             has_res, code, alpha, beta, o0, o1, kb, live):
    """`_direct_rows_avx2` with the reduction in slices of kb input-channel blocks (kb >= Cb: one slice).
    Per output block, each slice runs over all the rows' tiles before the next (its weights, kb x KH x KW
    x 1 KiB, stay in L1 across the tiles; unsliced, each 6-position tile read the block's whole weights
    from L2 or L3: 288 KiB a tile for 512 input channels at 3x3), the tiles' partial sums kept in `part`
    and resumed by `_nb.tile16a` (the same FMA chain: the same bits); bias with the last slice, then the
    stores as the unsliced tiles do. Not where the band's partial sums would pass SLICE_PART_BYTES (wide
    rows: they would stream through L2 once a slice). One Zen 3 core, ResNet50's 512 -> 512 layers at 7x7
    output (stride 1 and 2), whole map: 0.91-0.94x the unsliced time (medians of 20 alternated calls); on
    28x28 and 56x56 maps within +-5% (2026-11-29, twentieth session).
    live = (r0, r1, c0, c1): the padded input rows [r0, r1) and columns [c0, c1) that hold the image (the
    rest is the band's zero border; ALL_LIVE: no border). A tile whose positions' taps partly read only
    the border (a dilated conv's outer taps: `_live_taps`), at most LIVE_SPLIT of them live, runs its
    live taps only (`_live_tile_calls`): the chain of FMAs without the ones that add x * 0 = 0, the same
    bits but for the sign of a zero sum and a non-finite weight times the padding (as
    `passes.prune_dead_taps`)."""
    Cb, HWp = xb.shape[1], xb.shape[2]
    Ob, _, KH, KW, _, _ = wb.shape
    xf = xb.reshape(xb.size)
    wf = wb.reshape(wb.size)
    pp = stack_i64(13)   # the tile's parameter block (_nb.tile16)
    prm = nb.carray(pp, 13)
    taps = KH * KW
    nbase = n * Cb * HWp * 16
    table = np.empty(Cb * taps, np.int64)   # chunk (cb, kh, kw): its byte offset from position 0
    for cb in range(Cb):
        for kh in range(KH):
            for kw in range(KW):
                table[(cb * KH + kh) * KW + kw] = (nbase + cb * HWp * 16 + (kh * dh * Wp + kw * dw) * 16) * 4
    prm[8] = 16
    prm[10] = 64
    p_begin, p_end = oh0 * Wo, oh1 * Wo
    of, rf = out.reshape(out.size), res.reshape(res.size)  # flat (N', Ob, P, 16); res the same or empty
    P = out.shape[2]
    wsize = Cb * taps * 256
    ntl = (p_end - p_begin + 5) // 6
    if ntl <= 1 or ntl * 6 * 64 > SLICE_PART_BYTES:
        kb = Cb
    sliced = kb < Cb
    part = np.empty(((ntl if sliced else 1) * 6, 16), np.float32)   # the tiles' partial sums: tile t's rows 6t ..
    partf = part.reshape(part.size)                                 # 6t + 5 (unsliced: one tile's, reused)
    offs = np.empty((ntl, 6), np.int64)          # tile t: its first position's input index, the others' bytes
    for t in range(ntl):
        pb = p_begin + 6 * t
        for r in range(min(6, p_end - pb)):
            p = pb + r
            f = (((p // Wo) * sh - x_row0) * Wp + (p % Wo) * sw) * 16
            offs[t, r] = f if r == 0 else (f - offs[t, 0]) * 4
    kr = np.empty((ntl, 4), np.int64)           # tile t: its live kernel rows [kr0, kr1) and columns [kc0, kc1)
    partial = False
    for t in range(ntl):
        pb = p_begin + 6 * t
        _live_taps(kr, t, pb, min(6, p_end - pb), Wo, sh, sw, dh, dw, KH, KW, live)
        if _split_tile(kr, t, KH, KW):
            partial = True
    for ob in range(o0, o1):   # a slice of the block's weights stays in L1 while the band's positions stream
        for c0 in range(0, Cb, kb):
            c1 = min(Cb, c0 + kb)
            w0 = ob * wsize + c0 * taps * 256
            b0 = address(bias, ob * 16) if c1 == Cb else 0
            prm[1] = address(wf, w0)
            prm[7] = (c1 - c0) * taps
            prm[9] = address(table, c0 * taps)
            prm[12] = b0
            for t in range(ntl):
                pb = p_begin + 6 * t
                nv = min(6, p_end - pb)
                prm[0] = address(xf, offs[t, 0])
                for r in range(1, nv):
                    prm[1 + r] = offs[t, r]
                a0 = 6 * t if sliced else 0
                prm[11] = address(partf, 16 * a0)
                if partial and _split_tile(kr, t, KH, KW):
                    _live_tile_calls(pp, prm, nv, wf, table, kr, t, ob * wsize, c0, c1, KH, KW, b0)
                    prm[1] = address(wf, w0)
                    prm[7] = (c1 - c0) * taps
                    prm[9] = address(table, c0 * taps)
                    prm[12] = b0
                elif c0 == 0:
                    tile16_rows(pp, nv)
                else:
                    tile16a_rows(pp, nv)
                if c1 == Cb:
                    store_rows(of, rf, has_res, part, a0, RB_OFFSETS, 0, ((n_out * Ob + ob) * P + pb - q_off) * 16,
                               nv, 1, P * 16, code, alpha, beta)


@njit(nogil=True, cache=True)
def _chunk_pairs(table, nbase, HWp, Wp, dh, dw, KH, KW, c0, c1, ky0, ky1, kx0, kx1):
    """table[2i], table[2i + 1] = the byte offsets of chunk i's input (from position 0) and weights (from
    block 0's first row) over the taps (cb, kh, kw) in [c0, c1) x [ky0, ky1) x [kx0, kx1), in the weights'
    order (`_nb.dstrip512`'s pairs); returns the chunk count."""
    i = 0
    for cb in range(c0, c1):
        for kh in range(ky0, ky1):
            for kw in range(kx0, kx1):
                table[2 * i] = (nbase + cb * HWp * 16 + (kh * dh * Wp + kw * dw) * 16) * 4
                table[2 * i + 1] = ((cb * KH + kh) * KW + kw) * 1024
                i += 1
    return i


@njit(nogil=True, cache=True)
def _direct_rows_512(out, n_out, q_off, xb, n, x_row0, wb, oh0, oh1, Wo, Wp, sh, sw, dh, dw, bias, res, has_res,
                     code, alpha, beta, o0, o1, live):
    """The direct tiles' work on the AVX-512 strip `_nb.dstrip512` (tiles.ASM_512 hosts, stride 1 or 2 along
    W, code <= 2): per block pair and output row, the row's whole 14-position tiles in one strip call, then
    one call for the rest; 2 blocks a tile (1 for an odd last block). The reduction's chunks are the (cb,
    kh, kw) taps in the weights' order (`_chunk_pairs`); the same FMA chains and epilogue as the numba
    tiles: the same bits.
    live: the padded input's image rows and columns (`_direct_rows_avx2_sliced`; ALL_LIVE). Where a row's
    tiles read the zero border with some taps (`_live_range` of the row, of each tile's columns), the
    strip runs over a table of the live taps' chunks only (input and weight offsets: no call more, no
    partial sums), consecutive tiles with the same taps in one call: the FMA chain without its x * 0
    products (the bits of every tap but for a zero sum's sign and a non-finite weight times the padding).
    The second and third row of a pair prefetch the next pair's weights (PF_NEXT_PAIR)."""
    Cb, HWp = xb.shape[1], xb.shape[2]
    Ob, _, KH, KW, _, _ = wb.shape
    xf = xb.reshape(xb.size)
    wf = wb.reshape(wb.size)
    of, rf = out.reshape(out.size), res.reshape(res.size)
    P = out.shape[2]
    pp = stack_i64(14)
    prm = nb.carray(pp, 14)
    ab = nb.carray(stack_f32(2), 2)
    ab[0] = alpha
    ab[1] = beta
    nch = Cb * KH * KW
    if nch <= 1024:      # on the stack: a heap array per call costs ~300 cycles
        table = nb.carray(stack_i64(2048), 2048)
    else:
        table = np.empty(2 * nch, np.int64)
    nbase = n * Cb * HWp * 16
    _chunk_pairs(table, nbase, HWp, Wp, dh, dw, KH, KW, 0, Cb, 0, KH, 0, KW)
    wsize = Cb * KH * KW * 256
    prm[2] = address(table, 0)
    prm[3] = nch
    prm[5] = wsize * 4
    prm[10] = code
    prm[11] = address(ab, 0)
    prm[13] = P * 64
    nt = Wo // 14
    rem = Wo - 14 * nt
    ntl = nt + (1 if rem > 0 else 0)
    # the live kernel columns of each tile of a row, and whether some row or tile reads the border
    if 2 * ntl <= 64:
        cols = nb.carray(stack_i64(64), 64)
    else:
        cols = np.empty(2 * ntl, np.int64)
    partial = False
    for t in range(ntl):
        cols[2 * t], cols[2 * t + 1] = _live_range(14 * t, min(Wo, 14 * t + 14) - 1, sw, dw, KW, live[2], live[3])
        if cols[2 * t + 1] - cols[2 * t] < KW:
            partial = True
    for oh in range(oh0, oh1):
        a, b = _live_range(oh, oh, sh, dh, KH, live[0], live[1])
        if b - a < KH:
            partial = True
    ltab = np.empty(2 * nch, np.int64) if partial else table    # the live taps' chunks of the tiles in hand
    # maps at most 7 wide: two output rows whose taps are all live (and the row's one tile every column) in
    # one two-row call (`_nb.dstrip512x2`): each position's chain is the one-row call's, the same bits
    pair = 2 * Wo <= 14 and ntl == 1 and cols[0] == 0 and cols[1] == KW
    key = (-1, -1, -1, -1)
    for g in range(o0, o1, 2):
        nbk = min(2, o1 - g)
        prm[1] = address(wf, g * wsize)
        prm[8] = address(bias, g * 16)
        oh = oh0
        call = 0
        while oh < oh1:
            # the first row's call reads the pair's weights (from DRAM, cold); the second and third
            # prefetch the next pair's blocks g + 2 and g + 3 (prm[4]: their rows' distance from block g's)
            prm[4] = (call + 1) * wsize * 4 if PF_NEXT_PAIR and (call == 1 or call == 2) and g + call + 1 < o1 else 0
            call += 1
            x0 = (oh * sh - x_row0) * Wp * 16
            d0 = ((n_out * Ob + g) * P + oh * Wo - q_off) * 16
            ky0, ky1 = _live_range(oh, oh, sh, dh, KH, live[0], live[1])
            if pair and oh + 1 < oh1 and ky1 - ky0 == KH:
                ky2, ky3 = _live_range(oh + 1, oh + 1, sh, dh, KH, live[0], live[1])
                if ky3 - ky2 == KH:      # two rows, every tap live: one call, 2 Wo positions
                    prm[0] = address(xf, x0)
                    prm[2] = address(table, 0)
                    prm[3] = nch
                    prm[6] = address(of, d0)
                    prm[7] = 1
                    prm[9] = address(rf, d0) if has_res else 0
                    prm[12] = sh * Wp * 64
                    dpair512_rows(pp, Wo, nbk, sw)
                    oh += 2
                    continue
            t = 0
            while t < ntl:       # runs of whole tiles with the same live columns, then the rest (no border
                                 # read: every whole tile in one call, the rest in another)
                kx0, kx1 = cols[2 * t], cols[2 * t + 1]
                cnt = 1
                if t < nt:
                    while t + cnt < nt and cols[2 * (t + cnt)] == kx0 and cols[2 * (t + cnt) + 1] == kx1:
                        cnt += 1
                if ky1 - ky0 == KH and kx1 - kx0 == KW or ky0 >= ky1 or kx0 >= kx1:
                    prm[2] = address(table, 0)      # every tap (or none live: the zeros the taps read)
                    prm[3] = nch
                else:
                    if key != (ky0, ky1, kx0, kx1):
                        _chunk_pairs(ltab, nbase, HWp, Wp, dh, dw, KH, KW, 0, Cb, ky0, ky1, kx0, kx1)
                        key = (ky0, ky1, kx0, kx1)
                    prm[2] = address(ltab, 0)
                    prm[3] = Cb * (ky1 - ky0) * (kx1 - kx0)
                prm[0] = address(xf, x0 + 14 * t * sw * 16)
                prm[6] = address(of, d0 + 14 * t * 16)
                prm[7] = cnt
                prm[9] = address(rf, d0 + 14 * t * 16) if has_res else 0
                dstrip512_rows(pp, 14 if t < nt else rem, nbk, sw)
                prm[4] = 0           # (once a row)
                t += cnt
            oh += 1


@njit(nogil=True, cache=True)
def _direct_rows2(out, n_out, q_off, xb, n, x_row0, wb, oh0, oh1, Wo, Wp, sh, sw, dh, dw, bias, res, has_res, code,
                  alpha, beta, o0, o1, live):
    """Output rows [oh0, oh1), blocks [o0, o1) (the tiles' arguments); an activation past clip is
    deferred to one pass per chunk of rows (k1x1._k1x1's form: the same bits, no per-tile act_block
    call). live: the padded input's image rows and columns (`_direct_rows_avx2_sliced`; ALL_LIVE)."""
    if code <= 2:
        _direct_tile(out, n_out, q_off, xb, n, x_row0, wb, oh0, oh1, Wo, Wp, sh, sw, dh, dw, bias, res, has_res,
                     code, alpha, beta, o0, o1, live)
        return
    Ob, P = out.shape[1], out.shape[2]
    of = out.reshape(out.size)
    step = max(1, ACT_CHUNK // (Wo * (o1 - o0) * 16))
    for r0 in range(oh0, oh1, step):
        r1 = min(oh1, r0 + step)
        _direct_tile(out, n_out, q_off, xb, n, x_row0, wb, r0, r1, Wo, Wp, sh, sw, dh, dw, bias, res, has_res, 0,
                     alpha, beta, o0, o1, live)
        for ob in range(o0, o1):
            d = (n_out * Ob + ob) * P
            act_span(of, (d + r0 * Wo - q_off) * 16, (d + r1 * Wo - q_off) * 16, code, alpha, beta)


@njit(nogil=True, cache=True)
def _direct_tile(out, n_out, q_off, xb, n, x_row0, wb, oh0, oh1, Wo, Wp, sh, sw, dh, dw, bias, res, has_res, code,
                 alpha, beta, o0, o1, live):
    """The register tile of the host's vector width (tiles.NARROW, tiles.ASM_AVX2, tiles.ASM_512): 7 x 2
    blocks, 5 x 1, the 6 x 1 assembly tile or the 14 x 2 AVX-512 strip (stride 1 or 2 along W; code <= 2
    here: _direct_rows2 defers the others)."""
    if ASM_512 and sw <= 2 and code <= 2:
        _direct_rows_512(out, n_out, q_off, xb, n, x_row0, wb, oh0, oh1, Wo, Wp, sh, sw, dh, dw, bias, res,
                         has_res, code, alpha, beta, o0, o1, live)
    elif ASM_AVX2:
        _direct_rows_avx2_sliced(out, n_out, q_off, xb, n, x_row0, wb, oh0, oh1, Wo, Wp, sh, sw, dh, dw, bias, res,
                                 has_res, code, alpha, beta, o0, o1,
                                 max(1, SLICE_BYTES // (wb.shape[2] * wb.shape[3] * 1024)), live)
    elif NARROW:
        _direct_rows_narrow(out, n_out, q_off, xb, n, x_row0, wb, oh0, oh1, Wo, Wp, sh, sw, dh, dw, bias, res,
                            has_res, code, alpha, beta, o0, o1)
    else:
        _direct_rows2_wide(out, n_out, q_off, xb, n, x_row0, wb, oh0, oh1, Wo, Wp, sh, sw, dh, dw, bias, res,
                           has_res, code, alpha, beta, o0, o1)


@njit(nogil=True, cache=True, fastmath=FAST)
def _band_to_nchw(out, band, n, oh0, res, has_res, code, alpha, beta):
    """band (1, Ob, R*Wo, 16) -> out[n, :, oh0:oh0+R, :] (NCHW) with residual and activation."""
    Co, Wo = out.shape[1], out.shape[3]
    R = band.shape[2] // Wo
    for c in range(Co):
        ob, l = c // 16, c % 16
        for r in range(R):
            for ow in range(Wo):
                v = band[0, ob, r * Wo + ow, l]
                if has_res:
                    v += res[n, c, oh0 + r, ow]
                out[n, c, oh0 + r, ow] = apply_scalar(code, v, alpha, beta)


@njit(nogil=True, cache=True)
def _direct_task(out, x, band, wb, bias, res, has_res, code, alpha, beta, n, r0, r1, o0, o1, pt, pl, Wp, padded,
                 Wo, sh, sw, dh, dw):
    """One task: image n, output rows [r0, r1), output-channel blocks [o0, o1) into out
    (N, Ob, Ho*Wo, 16). x (N, Cb, H, W, 16): padded=True copies the rows the task's windows read,
    zero-bordered (padding pt on top, pl on the left, Wp wide), into `band` (1-D scratch) and reads
    that; padded=False reads x in place (already padded, or no padding: Wp = x's W)."""
    Cb = x.shape[1]
    if padded:
        x0 = r0 * sh                                         # first padded input row of the band
        rows = (r1 - 1 - r0) * sh + (wb.shape[2] - 1) * dh + 1
        nin = Cb * rows * Wp * 16
        _pad_band(band[:nin].reshape(1, Cb, rows, Wp, 16), x, n, x0 - pt, pl, wb.shape[2], dh, sh, r1 - r0)
        live = (pt, pt + x.shape[2], pl, pl + x.shape[3])     # the image inside the padded plane
        _direct_rows2(out, n, 0, band[:nin].reshape(1, Cb, rows * Wp, 16), 0, x0, wb, r0, r1, Wo, Wp, sh, sw, dh, dw,
                      bias, res, has_res, code, alpha, beta, o0, o1, live)
    else:
        _direct_rows2(out, n, 0, x.reshape(x.shape[0], Cb, x.shape[2] * x.shape[3], 16), n, 0, wb, r0, r1, Wo, Wp,
                      sh, sw, dh, dw, bias, res, has_res, code, alpha, beta, o0, o1, ALL_LIVE)


@njit(parallel=True, nogil=True, cache=True)
def _direct_par(nt, tasks, out, x, band, wb, bias, res, has_res, code, alpha, beta, pt, pl, Wp, padded, Wo, sh, sw,
                dh, dw):
    """Every task (rows (n, r0, r1, o0, o1)) on numba's pool; band (threads, size) scratch."""
    counter = new_counter(nt)
    for _w in nb.prange(nt):
        _direct_seq(counter, nb.get_thread_id(), tasks, out, x, band, wb, bias, res, has_res, code, alpha, beta, pt, pl,
                    Wp, padded, Wo, sh, sw, dh, dw)


@njit(nogil=True, cache=True)
def _direct_seq(counter, tid, tasks, out, x, band, wb, bias, res, has_res, code, alpha, beta, pt, pl, Wp, padded, Wo,
                sh, sw, dh, dw):
    """One worker of the task loop on the calling thread: tasks taken from `counter` (threads.numba_region)."""
    while True:
        i = take(counter, tid, tasks.shape[0])
        if i < 0:
            break
        _direct_task(out, x, band[tid], wb, bias, res, has_res, code, alpha, beta, tasks[i, 0], tasks[i, 1],
                     tasks[i, 2], tasks[i, 3], tasks[i, 4], pt, pl, Wp, padded, Wo, sh, sw, dh, dw)


@functools.lru_cache(maxsize=1024)
def task_table(n: int, ho: int, ob: int, rows: int, blocks: int) -> np.ndarray:
    """(T, 5) int64 rows (n, r0, r1, o0, o1): images outer, row bands, then channel-block groups."""
    t = np.array([(i, r0, min(r0 + rows, ho), o0, min(o0 + blocks, ob)) for i in range(n) for r0 in range(0, ho, rows)
                  for o0 in range(0, ob, blocks)], np.int64).reshape(-1, 5)
    t.flags.writeable = False
    return t


def _run_tasks(out4, x, wb, bias, res4, has_res, act, tasks, threads, pt, pl, wp, padded, wo, stride, dilation,
               band_elems):
    code, al, be = act
    # one scratch band per thread of the region (thread ids range over numba's pool)
    rows = numba_max_threads() if region_threads(threads, len(tasks)) > 1 else 1
    band = scratch("direct_band", (rows, max(1, band_elems)))
    numba_region(_direct_par, _direct_seq, threads, len(tasks), tasks, out4, x, band, wb, bias, res4, has_res, code,
                 al, be, pt, pl, wp, padded, wo, stride[0], stride[1], dilation[0], dilation[1])


def _band_elems(cb, rows, sh, kh, dh, wp):
    return cb * ((rows - 1) * sh + (kh - 1) * dh + 1) * wp * LANES


def direct_nchwc(out_blocked, x_blocked, prepared, residual_blocked=None, *, stride=(1, 1), dilation=(1, 1),
                 relu=False, act=None, threads=None) -> None:
    """NCHWc-native direct conv. x_blocked is already padded (see layout.to_nchwc(x, padding)).

    out_blocked (N, Ob, Ho, Wo, 16); residual_blocked the same shape or None.
    """
    act = resolve_act(relu, act, "direct")
    wb, bias = prepared["weight"], prepared["bias"]
    n, cb, hp, wp, _ = x_blocked.shape
    _, ob, ho, wo, _ = out_blocked.shape
    threads = resolve_threads(threads)
    p = plan_direct(cb, wb.shape[2], dilation[0], stride[0], ho, wp, wo=wo, n=n, ob=ob, kw=wb.shape[3], padded=False,
                    threads=threads)
    has_res = residual_blocked is not None
    # (N, C, H, W, 16) -> (N, C, H*W, 16) flat views, no copy
    res = residual_blocked.reshape(n, ob, ho * wo, LANES) if has_res else EMPTY4
    _run_tasks(out_blocked.reshape(n, ob, ho * wo, LANES), x_blocked, wb, bias, res, has_res, act,
               task_table(n, ho, ob, p["rows"], p["blocks"]), threads, 0, 0, wp, False, wo, stride, dilation, 0)


def run(out, x, prepared, residual=None, *, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), relu=False,
        act=None, threads=None) -> None:
    """NCHW in, NCHW out: block the input once (unpadded), run the NCHWc kernel into a blocked
    buffer, then unblock it into `out` with the residual and the activation."""
    act = resolve_act(relu, act, "direct")
    n = x.shape[0]
    ob = prepared["weight"].shape[0]
    _, _, ho, wo = out.shape
    xb = to_nchwc(x, threads=threads)
    ob_ = scratch("direct_nchw_out", (n, ob, ho, wo, LANES))
    run_nchwc(ob_, xb, prepared, None, stride=stride, padding=padding, dilation=dilation, act=IDENTITY,
              threads=threads)
    has_res = residual is not None
    res = residual if has_res else EMPTY4
    parallel_for(lambda i: _band_to_nchw(out, ob_[i:i + 1].reshape(1, ob, ho * wo, LANES), i, 0, res, has_res, *act),
                 range(n), threads)


@njit(nogil=True, cache=True)
def _band_row_read(r, kh, dh, sh, rows_out):
    """Is row r of a task's band read by some output row i < rows_out and tap ky < kh (r = i*sh + ky*dh)?
    rows_out 0: every row counts as read."""
    if rows_out <= 0:
        return True
    for ky in range(kh):
        d = r - ky * dh
        if d >= 0 and d % sh == 0 and d // sh < rows_out:
            return True
    return False


@njit(nogil=True, cache=True)
def _pad_band(band, x, n, h0, pl, kh, dh, sh, rows_out):
    """band (1, Cb, R, Wp, 16) = rows h0 .. h0+R-1 of x[n] (N, Cb, H, W, 16) zero padded:
    row h < 0 or >= H is zeros, columns [0, pl) and [pl+W, Wp) are zeros. Given the task's geometry
    (kh taps dh rows apart, rows_out output rows sh apart), only the rows some tap reads are written
    (`_band_row_read`): a dilated conv's band skips the rows between its taps (DeepLabV3's dilation-24
    ASPP conv: 3 of 49 rows a task, 30 MB copied a task before). The others keep whatever the
    thread's scratch held; no tap reads them. Each position is one 16-lane copy (`_nb.copy16`), the
    zeros contiguous fills."""
    Cb, R, Wp = band.shape[1], band.shape[2], band.shape[3]
    H, W = x.shape[2], x.shape[3]
    bf = band.reshape(band.size)
    xf = x.reshape(x.size)
    for cb in range(Cb):      # the band in memory order
        for r in range(R):
            if not _band_row_read(r, kh, dh, sh, rows_out):
                continue
            h = h0 + r
            d = ((cb * R + r) * Wp) * 16
            if h < 0 or h >= H:
                for k in range(Wp * 16):
                    bf[d + k] = 0.0
                continue
            for k in range(pl * 16):
                bf[d + k] = 0.0
            s = (((n * Cb + cb) * H + h) * W) * 16
            for j in range(W):
                copy16(bf, d + (pl + j) * 16, xf, s + 16 * j)
            for k in range((pl + W) * 16, Wp * 16):
                bf[d + k] = 0.0


def run_nchwc(out_b, x_b, prepared, residual_b=None, *, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
              relu=False, act=None, threads=None, plan=None) -> None:
    """NCHWc in, NCHWc out, input NOT padded (the compiler's convention between layers).

    x_b (N, Cb, H, W, 16), out_b / residual_b (N, Ob, Ho, Wo, 16). The task grid (images, row
    bands, output-channel block groups) comes from planner.plan_direct for `threads`. With padding
    a task copies the input rows its windows read into a per-thread zero-bordered scratch band (it
    fits L2/2, see the planner) and runs the register-blocked kernel on it; without padding the
    kernel reads x_b directly. plan: a plan_direct result (default: the one for `threads`).
    """
    act = resolve_act(relu, act, "direct")
    wb, bias = prepared["weight"], prepared["bias"]
    n, cb, h, w, _ = x_b.shape
    _, ob, ho, wo, _ = out_b.shape
    kh = wb.shape[2]
    t, b, l, r = padding
    wp = w + l + r
    padded = padding != (0, 0, 0, 0)
    threads = resolve_threads(threads)
    p = plan or plan_direct(cb, kh, dilation[0], stride[0], ho, wp, wo=wo, n=n, ob=ob, kw=wb.shape[3], padded=padded,
                            threads=threads)
    has_res = residual_b is not None
    res = residual_b.reshape(n, ob, ho * wo, LANES) if has_res else EMPTY4
    band = _band_elems(cb, p["rows"], stride[0], kh, dilation[0], wp) if padded else 0
    _run_tasks(out_b.reshape(n, ob, ho * wo, LANES), x_b, wb, bias, res, has_res, act,
               task_table(n, ho, ob, p["rows"], p["blocks"]), threads, t, l, wp, padded, wo, stride, dilation, band)
