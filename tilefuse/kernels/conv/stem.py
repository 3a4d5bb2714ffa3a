"""Stem conv for few input channels (Cin <= 4, any k, stride, padding, dilation): NCHW in, NCHW16c out.

The 7x7/s2 ResNet stem (Cin = 3) has a reduction of only Cin*KH*KW = 147 taps: im2col + GEMM
spends most of its time gathering cols and scattering the GEMM block into NCHW16c. Here a task
(one image, a band of output rows) copies the input rows its windows read into a per-thread
zero-bordered scratch band (Cin, rows, Wp) (this is the border/interior split: the padding is
materialized once per band, so the inner loop has no bounds checks), then for each pair of
output-channel blocks runs a register-blocked kernel: 8 output positions x 2 blocks of 16
output channels = 16 zmm accumulators, live across the whole Cin*KH*KW reduction (2 weight
vectors + 8 broadcasts feed 16 FMAs per tap; on AVX-512 hosts the 14 x 2 assembly strip `_stem_rows_512`). Epilogue (epilogue.store_block): + bias (+ residual), activation,
stored straight into the blocked output; padded output channels come out 0 (zero weights/bias).

Weights are packed at compile time (`prepare`: (Ob, Cin, KH, KW, 16co) and a padded bias, added
to im2col's prepared constants) and read from the data package. Tasks (image, band of rows)
from planner.plan_stem for the thread count, run in one numba parallel loop; every output is
the same reduction whatever its task, so every grid and thread count gives the same bits.
"""
from __future__ import annotations

import functools

import numba as nb
import numpy as np
from numba import njit

from tilefuse.kernels.conv._nb import (LANES, address, new_counter, sstrip16_rows, sstrip512_rows, stack_f32, stack_i64,
                                       take)
from tilefuse.kernels.conv._tiles_gen import _stem_rows_narrow, _stem_rows_wide  # (tilegen.STEM)
from tilefuse.kernels.conv.tiles import ASM_512, ASM_AVX2, NARROW
from tilefuse.kernels.conv.epilogue import ACT_CHUNK, EMPTY4, act_span, resolve_act
from tilefuse.kernels.conv.planner import plan_stem
from tilefuse.kernels.threads import numba_max_threads, numba_region, region_threads, resolve_threads, scratch

MAX_CIN = 4
RB = 8

def applies(cin: int, groups: int) -> bool:
    return groups == 1 and cin <= MAX_CIN


def pack_weights(w: np.ndarray) -> np.ndarray:
    """(Co, Cin, KH, KW) -> (Ob, Cin, KH, KW, 16) zero padded output channels (compile time)."""
    co, cg, kh, kw = w.shape
    ob = -(-co // LANES)
    wp = np.zeros((ob * LANES, cg, kh, kw), np.float32)
    wp[:co] = w
    # (Ob*16, Cg, KH, KW) -> (Ob, 16, Cg, KH, KW) -> (Ob, Cg, KH, KW, 16)
    return np.ascontiguousarray(wp.reshape(ob, LANES, cg, kh, kw).transpose(0, 2, 3, 4, 1))


def pad_bias(bias: np.ndarray, ob: int) -> np.ndarray:
    b = np.zeros(ob * LANES, np.float32)
    b[:bias.shape[0]] = bias
    return b


def prepare(w, bias) -> dict:
    """The stem's own constants, added to im2col's prepared weights (`im2col.prepare`) for convs
    it applies to: {"stem_weight": (Ob, Cin, KH, KW, 16), "stem_bias": (Ob*16,)}. They travel in
    the data package like every prepared constant, so the kernel reads device memory (no host
    side copy)."""
    w = np.asarray(w, np.float32)
    return {"stem_weight": pack_weights(w), "stem_bias": pad_bias(np.asarray(bias, np.float32), -(-w.shape[0] // LANES))}


@njit(nogil=True, cache=True)
def _pad_rows(band, x, n, h0, pl):
    """band (C, R, Wp) = rows h0 .. h0+R-1 of x[n] (N, C, H, W) zero padded (columns [pl, pl+W)). Row slices
    (numba's copy loops, vectorized): writing every row twice, zeros then values, element by element took a
    third of the kernel's time at MobileNetV2's stem (53 us for half of a 224x224 image, one Zen 3 core)."""
    C, R, Wp = band.shape
    H, W = x.shape[2], x.shape[3]
    jn = max(0, min(W, Wp - pl))
    for c in range(C):
        for r in range(R):
            h = h0 + r
            row = band[c, r]
            if h < 0 or h >= H:
                row[:] = 0.0
                continue
            row[:pl] = 0.0
            row[pl:pl + jn] = x[n, c, h, :jn]
            row[pl + jn:] = 0.0


@njit(nogil=True, cache=True)
def _stem_rows_512(out, n, band, x_row0, wb, oh0, oh1, Wo, sh, sw, dh, dw, bias, res, has_res, code, alpha, beta):
    """The stem tiles' work on the AVX-512 strip (`_nb.dstrip512` with one input channel a chunk:
    `sstrip512_rows`; tiles.ASM_512 hosts, stride 1 or 2 along W, code <= 2): per block pair and output row,
    the row's whole 14-position tiles in one call, then one call for the rest. The chunks are the (c, kh, kw)
    taps in the weights' order, the weight rows wb[ob, c, kh, kw] 64 bytes apart: the numba tiles' FMA chain
    per output (the same bits)."""
    C, R, Wp = band.shape
    Ob, _, KH, KW, _ = wb.shape
    bf = band.reshape(band.size)
    wf = wb.reshape(wb.size)
    of, rf = out.reshape(out.size), res.reshape(res.size)
    HW = out.shape[2]
    pp = stack_i64(14)
    prm = nb.carray(pp, 14)
    ab = nb.carray(stack_f32(2), 2)
    ab[0] = alpha
    ab[1] = beta
    nch = C * KH * KW
    if nch <= 1024:
        table = nb.carray(stack_i64(1024), 1024)
    else:
        table = np.empty(nch, np.int64)
    for c in range(C):
        for kh in range(KH):
            for kw in range(KW):
                table[(c * KH + kh) * KW + kw] = (c * R * Wp + kh * dh * Wp + kw * dw) * 4
    wsize = nch * 16
    prm[2] = address(table, 0)
    prm[3] = nch
    prm[5] = wsize * 4
    prm[10] = code
    prm[11] = address(ab, 0)
    prm[13] = HW * 64
    nt = Wo // 14
    rem = Wo - 14 * nt
    for g in range(0, Ob, 2):
        nbk = min(2, Ob - g)
        prm[1] = address(wf, g * wsize)
        prm[8] = address(bias, g * 16)
        for oh in range(oh0, oh1):
            x0 = (oh * sh - x_row0) * Wp
            d0 = ((n * Ob + g) * HW + oh * Wo) * 16
            if nt > 0:
                prm[0] = address(bf, x0)
                prm[6] = address(of, d0)
                prm[7] = nt
                prm[9] = address(rf, d0) if has_res else 0
                sstrip512_rows(pp, 14, nbk, sw)
            if rem > 0:
                prm[0] = address(bf, x0 + 14 * nt * sw)
                prm[6] = address(of, d0 + 14 * nt * 16)
                prm[7] = 1
                prm[9] = address(rf, d0 + 14 * nt * 16) if has_res else 0
                sstrip512_rows(pp, rem, nbk, sw)


@njit(nogil=True, cache=True)
def _stem_rows_avx2(out, n, band, x_row0, wb, oh0, oh1, Wo, sh, sw, dh, dw, bias, res, has_res, code, alpha, beta):
    """The stem tiles' work on the AVX2 strip (`_nb.sstrip16`; tiles.ASM_AVX2 hosts, stride 1, 2 or 4 along
    W (4: ConvNeXt's patchify stem), code <= 2): per output block and row, the row's whole 6-position tiles
    in one call, then one call for the rest. `_stem_rows_512`'s table and parameter block, one block a tile:
    the numba tiles' FMA chain per output (the same bits)."""
    C, R, Wp = band.shape
    Ob, _, KH, KW, _ = wb.shape
    bf = band.reshape(band.size)
    wf = wb.reshape(wb.size)
    of, rf = out.reshape(out.size), res.reshape(res.size)
    HW = out.shape[2]
    pp = stack_i64(14)
    prm = nb.carray(pp, 14)
    ab = nb.carray(stack_f32(2), 2)
    ab[0] = alpha
    ab[1] = beta
    nch = C * KH * KW
    if nch <= 1024:
        table = nb.carray(stack_i64(1024), 1024)
    else:
        table = np.empty(nch, np.int64)
    for c in range(C):
        for kh in range(KH):
            for kw in range(KW):
                table[(c * KH + kh) * KW + kw] = (c * R * Wp + kh * dh * Wp + kw * dw) * 4
    wsize = nch * 16
    prm[2] = address(table, 0)
    prm[3] = nch
    prm[10] = code
    prm[11] = address(ab, 0)
    nt = Wo // 6
    rem = Wo - 6 * nt
    for g in range(Ob):
        prm[1] = address(wf, g * wsize)
        prm[8] = address(bias, g * 16)
        for oh in range(oh0, oh1):
            x0 = (oh * sh - x_row0) * Wp
            d0 = ((n * Ob + g) * HW + oh * Wo) * 16
            if nt > 0:
                prm[0] = address(bf, x0)
                prm[6] = address(of, d0)
                prm[7] = nt
                prm[9] = address(rf, d0) if has_res else 0
                sstrip16_rows(pp, 6, sw)
            if rem > 0:
                prm[0] = address(bf, x0 + 6 * nt * sw)
                prm[6] = address(of, d0 + 6 * nt * 16)
                prm[7] = 1
                prm[9] = address(rf, d0 + 6 * nt * 16) if has_res else 0
                sstrip16_rows(pp, rem, sw)


@njit(nogil=True, cache=True)
def _stem_tile(out, n, band, x_row0, wb, oh0, oh1, Wo, sh, sw, dh, dw, bias, res, has_res, code, alpha, beta):
    """The register tile of the host's vector width (tiles.NARROW, tiles.ASM_512, tiles.ASM_AVX2): 8 x 2
    blocks, 5 x 1, the AVX-512 strip (stride 1 or 2 along W) or the AVX2 strip (stride 1, 2 or 4); code <= 2
    here: _stem_rows defers the others."""
    if ASM_512 and sw <= 2 and code <= 2:
        _stem_rows_512(out, n, band, x_row0, wb, oh0, oh1, Wo, sh, sw, dh, dw, bias, res, has_res, code, alpha, beta)
    elif ASM_AVX2 and (sw <= 2 or sw == 4) and code <= 2:
        _stem_rows_avx2(out, n, band, x_row0, wb, oh0, oh1, Wo, sh, sw, dh, dw, bias, res, has_res, code, alpha, beta)
    elif NARROW:
        _stem_rows_narrow(out, n, band, x_row0, wb, oh0, oh1, Wo, sh, sw, dh, dw, bias, res, has_res, code, alpha, beta)
    else:
        _stem_rows_wide(out, n, band, x_row0, wb, oh0, oh1, Wo, sh, sw, dh, dw, bias, res, has_res, code, alpha, beta)


@njit(nogil=True, cache=True)
def _stem_rows(out, n, band, x_row0, wb, oh0, oh1, Wo, sh, sw, dh, dw, bias, res, has_res, code, alpha, beta):
    """Output rows [oh0, oh1) of image n (out (N, Ob, Ho*Wo, 16)); an activation past clip is deferred
    to one pass per chunk of rows (k1x1._k1x1's form: the same bits, no per-tile act_block call)."""
    if code <= 2:
        _stem_tile(out, n, band, x_row0, wb, oh0, oh1, Wo, sh, sw, dh, dw, bias, res, has_res, code, alpha, beta)
        return
    Ob, HW = out.shape[1], out.shape[2]
    of = out.reshape(out.size)
    step = max(1, ACT_CHUNK // (Wo * Ob * 16))
    for r0 in range(oh0, oh1, step):
        r1 = min(oh1, r0 + step)
        _stem_tile(out, n, band, x_row0, wb, r0, r1, Wo, sh, sw, dh, dw, bias, res, has_res, 0, alpha, beta)
        for ob in range(Ob):
            d = (n * Ob + ob) * HW * 16
            act_span(of, d + r0 * Wo * 16, d + r1 * Wo * 16, code, alpha, beta)


@njit(nogil=True, cache=True)
def _stem_task(out, x, band, wb, bias, res, has_res, code, alpha, beta, n, r0, r1, pt, pl, Wp, Wo, sh, sw, dh, dw):
    """One task: image n, output rows [r0, r1): pad its input rows into `band` (1-D scratch), run
    the register-blocked kernel."""
    C = x.shape[1]
    x0 = r0 * sh                                         # first padded input row of the band
    nr = (r1 - 1 - r0) * sh + (wb.shape[2] - 1) * dh + 1
    b3 = band[:C * nr * Wp].reshape(C, nr, Wp)
    _pad_rows(b3, x, n, x0 - pt, pl)
    _stem_rows(out, n, b3, x0, wb, r0, r1, Wo, sh, sw, dh, dw, bias, res, has_res, code, alpha, beta)


@njit(parallel=True, nogil=True, cache=True)
def _stem_par(nt, tasks, out, x, band, wb, bias, res, has_res, code, alpha, beta, pt, pl, Wp, Wo, sh, sw, dh, dw):
    """Every task of the layer on nt of numba's threads."""
    counter = new_counter(nt)
    for _w in nb.prange(nt):
        _stem_seq(counter, nb.get_thread_id(), tasks, out, x, band, wb, bias, res, has_res, code, alpha, beta, pt, pl,
                  Wp, Wo, sh, sw, dh, dw)


@njit(nogil=True, cache=True)
def _stem_seq(counter, tid, tasks, out, x, band, wb, bias, res, has_res, code, alpha, beta, pt, pl, Wp, Wo, sh, sw,
              dh, dw):
    """One worker of the task loop on the calling thread: tasks taken from `counter` (threads.numba_region)."""
    while True:
        i = take(counter, tid, tasks.shape[0])
        if i < 0:
            break
        _stem_task(out, x, band[tid], wb, bias, res, has_res, code, alpha, beta, tasks[i, 0], tasks[i, 1],
                   tasks[i, 2], pt, pl, Wp, Wo, sh, sw, dh, dw)


@functools.lru_cache(maxsize=256)
def task_table(n: int, ho: int, rows: int) -> np.ndarray:
    """(T, 3) int64 rows (n, r0, r1)."""
    t = np.array([(i, r0, min(r0 + rows, ho)) for i in range(n) for r0 in range(0, ho, rows)], np.int64).reshape(-1, 3)
    t.flags.writeable = False
    return t


def loop_args(out_b, x, prepared, residual_b, stride, padding, dilation, relu, act, threads, plan, where="stem kernel"):
    """The stem's task loop for these operands, checked: (threads, tasks, the `_stem_seq` arguments after the
    task table, the plan's band rows). Shared by `run_to_nchwc` and kernels/stem_pool.py."""
    code, al, be = resolve_act(relu, act, "stem")
    if "stem_weight" not in prepared:
        raise ValueError(f"{where}: prepared weights have no 'stem_weight' (prepare them with "
                         "conv2d_prepare('im2col', ...) or stem.prepare)")
    wb, bp = prepared["stem_weight"], prepared["stem_bias"]
    n, cin, h, w = x.shape
    _, ob, ho, wo, _ = out_b.shape
    if wb.shape[0] != ob or wb.shape[1] != cin:
        raise ValueError(f"{where}: stem_weight {wb.shape} does not match input channels {cin} and output "
                         f"blocks {ob}")
    kh, kw = wb.shape[2], wb.shape[3]
    t, _, l, r = padding
    wp = w + l + r
    sh, sw = stride
    dh, dw = dilation
    threads = resolve_threads(threads)
    p = plan or plan_stem(cin, kh, kw, sh, dh, ho, wo, wp, n, ob, threads)
    tasks = task_table(n, ho, p["rows"])
    has_res = residual_b is not None
    ofl = out_b.reshape(n, ob, ho * wo, LANES)  # (N, Ob, Ho, Wo, 16) -> (N, Ob, Ho*Wo, 16)
    res = residual_b.reshape(n, ob, ho * wo, LANES) if has_res else EMPTY4
    nband = cin * ((p["rows"] - 1) * sh + (kh - 1) * dh + 1) * wp
    band = scratch("stem_band", (numba_max_threads() if region_threads(threads, len(tasks)) > 1 else 1, nband))
    return threads, tasks, (ofl, x, band, wb, bp, res, has_res, code, al, be, t, l, wp, wo, sh, sw, dh, dw), p["rows"]


def run_to_nchwc(out_b, x, prepared, residual_b=None, *, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
                 relu=False, act=None, threads=None, plan=None) -> None:
    """NCHW x (N, Cin <= 4, H, W) -> NCHW16c out_b (N, Ob, Ho, Wo, 16); `prepared` holds the
    stem's constants ("stem_weight", "stem_bias", from `prepare`; im2col's conv2d_prepare adds
    them for the convs this kernel applies to)."""
    threads, tasks, args, _ = loop_args(out_b, x, prepared, residual_b, stride, padding, dilation, relu, act, threads,
                                        plan)
    numba_region(_stem_par, _stem_seq, threads, len(tasks), tasks, *args)
