"""Grouped convolution with groups inside one 16-lane block (cg = og in 2, 4, 8) on NCHW16c, issue 9.

RegNet's grouped 3x3 convs have group width 8, ResNeXt-like nets narrower ones: cg = og = 2, 4 or
8 channels per group, 16 % cg == 0. Every 16-channel block then holds 16 / cg whole groups, and
output block ob reads input block ob only:

    out[ob, p, l] = sum_{kh, kw} sum_{c < cg} x[ob, tap(p), (l // cg) * cg + c] * w[ob*16 + l, c, kh, kw]

For a fixed input-channel offset c the input operand is a lane permutation of the input vector
(the lanes of a group repeat one of its values): each tap costs cg vector FMAs on permuted inputs,
not the 16 broadcast FMAs of the dense-tile form (`grouped.py`, which multiplies by zeros between
the groups: 16 / cg times the FLOPs, and lets an inf/NaN of one group's input reach the other
groups' outputs of the block, 0 * inf = NaN). Here a group's outputs read its own inputs only.

Layouts:
  input   x  (N, Cb, H, W, 16)          NCHW16c, not padded (read in place)
  weights wl (Ob, KH, KW, cg, 16)       wl[ob, kh, kw, c, l] = w[ob*16 + l, c, kh, kw], zero padded
  output     (N, Ob, Ho, Wo, 16)        Ob = Cb, written in place

The kernel, per task (image, channel blocks, band of output rows):
  - Band: the input rows the band needs are copied once into a zero-bordered ring of
    (KH-1)*dh + 1 rows of Wp columns (the padding is in the band: no border path); each thread's
    ring starts on a 64-byte line (15% faster than a 16-byte offset on the AVX2 development machine).
  - Register block (as depthwise.py): RB = 8 consecutive output positions x 16 lanes held for the
    whole reduction. Per tap and position one vector load of the input, then for c < cg one LLVM
    `shufflevector` with a constant mask (lane l <- lane (l // cg) * cg + c) and one `llvm.fma`
    with the weight vector of (tap, c) (`_pfma`, an intrinsic: the accumulators are whole-vector
    values LLVM keeps in registers, the shuffles lower to what the target has: on AVX2 at cg 8 a
    vbroadcastss from memory per 8-lane half, vpermilps for cg 4 / 2, vpermps on AVX-512).
    On hosts with 256-bit vectors (AVX2) the block's two 8-lane halves run one after the other
    (`HALVES`: 8 accumulators of 8 lanes fit the 16 ymm registers, 16 of them spilled; 1.2-1.35x
    faster on the AVX2 machine, the same bits); AVX-512 hosts run the 16 lanes at once.
    Constant offsets at the specialized call sites (stride 1 / 2, the 7-wide maps, cg 8 / 4 / 2);
    a short last block moves left (recomputes positions of the previous block: the same values in
    the same order), maps narrower than RB repeat their last position.
    An earlier form wrote the cg permuted copies of every input vector into the band and ran plain
    memory-operand FMAs on them: 1.2-1.5x slower at cg 8 on the AVX2 machine (the band cg times
    larger, 16 stores per input vector), 10-15% faster at cg 4 / 2.
  - Fused epilogue: + bias in the store, then + residual and the activation per output row
    (depthwise._finish_row: activations.apply_span), y = act(conv + bias + residual).
  - Every output value is acc = 0; for kh, kw, c ascending: acc = fma(x, w, acc); + bias,
    + residual, act: the same sequence whichever block, task or thread computes it, so results are
    bitwise identical for every thread count. Tasks come from the layer shape only
    (planner.plan_grouped_lanes_tasks) and run in one numba parallel loop (threads.numba_region).
"""
from __future__ import annotations

import functools

import numba as nb
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from tilefuse.kernels.conv._nb import LANES, new_counter, stack_f32, take
from tilefuse.kernels.conv.tiles import NARROW
from tilefuse.kernels.conv.depthwise import FASTMATH, _data_ptr, _finish_row, _store8
from tilefuse.kernels.conv.epilogue import EMPTY1, bias_or_zeros, resolve_act
from tilefuse.kernels.conv.layout import from_nchwc, to_nchwc
from tilefuse.kernels.conv.planner import grouped_lanes_applies as applies
from tilefuse.kernels.conv.planner import plan_grouped_lanes_tasks as plan_tasks
from tilefuse.kernels.threads import numba_max_threads, numba_region, region_threads, scratch

RB = 8                  # output positions per register block
HALVES = NARROW  # run the block's two 8-lane halves one after the other (`_gblock`)


def prepare(w, b, groups: int) -> dict:
    """w (Co, cg, KH, KW), cg = Co / groups in (2, 4, 8) -> {"weight": (Ob, KH, KW, cg, 16), "bias": (Ob*16,)}."""
    w = np.asarray(w, np.float32)
    co, cg, kh, kw = w.shape
    if not applies(cg * groups, co, groups):
        raise ValueError(f"grouped (lanes): weight {w.shape} with groups={groups} does not have groups of 2, 4 "
                         f"or 8 channels in and out")
    ob = -(-co // LANES)
    wp = np.zeros((ob * LANES, cg, kh, kw), np.float32)
    wp[:co] = w
    # (Ob*16, cg, KH, KW) -> (Ob, 16, cg, KH, KW) -> (Ob, KH, KW, cg, 16)
    wl = np.ascontiguousarray(wp.reshape(ob, LANES, cg, kh, kw).transpose(0, 3, 4, 2, 1))
    bias = np.zeros(ob * LANES, np.float32)
    bias[:co] = bias_or_zeros(b, co)
    return {"weight": wl, "bias": bias}


@intrinsic
def _pfma(typingctx, acc, x, xoff, w, woff, cg, nl, h):
    """acc[b:b+nl] = fma(perm_c(x[xoff+b : +nl]), w[woff+16c+b : +nl], acc[b:b+nl]) for c < cg, c ascending,
    b = h*nl (cg, nl (8 or 16 lanes), h: literals); perm_c: lane l <- lane (l // cg) * cg + c (an LLVM
    shufflevector with a constant mask; cg divides nl)."""
    if not (isinstance(cg, types.IntegerLiteral) and isinstance(nl, types.IntegerLiteral)
            and isinstance(h, types.IntegerLiteral) and isinstance(acc, types.Array)
            and isinstance(x, types.Array) and isinstance(w, types.Array)):
        return None
    g, n, b = cg.literal_value, nl.literal_value, h.literal_value * nl.literal_value
    sig = types.void(acc, x, xoff, w, woff, cg, nl, h)

    def codegen(context, builder, signature, args):
        vty = ir.VectorType(ir.FloatType(), n)
        i64 = ir.IntType(64)
        pa = context.make_array(signature.args[0])(context, builder, args[0]).data
        pa = builder.bitcast(builder.gep(pa, [ir.Constant(i64, b)]), vty.as_pointer())
        px = context.make_array(signature.args[1])(context, builder, args[1]).data
        pw = context.make_array(signature.args[3])(context, builder, args[3]).data
        xo = builder.add(context.cast(builder, args[2], signature.args[2], types.int64), ir.Constant(i64, b))
        wo = builder.add(context.cast(builder, args[4], signature.args[4], types.int64), ir.Constant(i64, b))
        v = builder.load(builder.bitcast(builder.gep(px, [xo]), vty.as_pointer()), align=4)
        a = builder.load(pa, align=4)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [vty, vty, vty]),
                                             f"llvm.fma.v{n}f32")
        for c in range(g):
            mask = ir.Constant(ir.VectorType(ir.IntType(32), n), [(l // g) * g + c for l in range(n)])
            p = builder.shuffle_vector(v, v, mask)
            wc = builder.load(builder.bitcast(builder.gep(pw, [builder.add(wo, ir.Constant(i64, c * LANES))]),
                                              vty.as_pointer()), align=4)
            a = builder.call(fma, [p, wc, a])
        builder.store(a, pa, align=4)
        return context.get_dummy_value()

    return sig, codegen


@njit(inline="always", cache=True)
def _fill_row(sp, so, xf, xbase, r, H, W, pt, pl, Wp, cg):
    """Padded input row r of one channel plane (at xbase in xf) -> ring slot at sp[so:]:
    Wp columns x 16 lanes, zero outside the image (unsigned offsets: the copy vectorizes)."""
    cs = 16
    ih = r - pt
    z = np.float32(0.0)
    if ih < 0 or ih >= H:
        for i in range(Wp * cs):
            sp[so + np.uint64(i)] = z
        return
    lo = min(pl, Wp)
    ncopy = max(0, min(W, Wp - pl))
    for i in range(lo * cs):
        sp[so + np.uint64(i)] = z
    d = so + np.uint64(lo * cs)
    sx = np.uint64(xbase + ih * W * 16)
    for i in range(ncopy * 16):
        sp[d + np.uint64(i)] = xf[sx + np.uint64(i)]
    for i in range((lo + ncopy) * cs, Wp * cs):
        sp[so + np.uint64(i)] = z


@njit(inline="always", cache=True)
def _gtaps(sp, wf, a0, a1, a2, a3, a4, a5, a6, a7, ro, k0, wk, KH, KW, CG, C1, C2, C3, C4, C5, C6, C7, KS, NL, H):
    """Lanes [H*NL, (H+1)*NL) of the register block over every tap (see `_gblock`)."""
    ww = wk
    for kh in range(KH):
        kk = ro[kh] + k0
        for kw in range(KW):
            _pfma(a0, sp, kk, wf, ww, CG, NL, H)
            _pfma(a1, sp, kk + C1, wf, ww, CG, NL, H)
            _pfma(a2, sp, kk + C2, wf, ww, CG, NL, H)
            _pfma(a3, sp, kk + C3, wf, ww, CG, NL, H)
            _pfma(a4, sp, kk + C4, wf, ww, CG, NL, H)
            _pfma(a5, sp, kk + C5, wf, ww, CG, NL, H)
            _pfma(a6, sp, kk + C6, wf, ww, CG, NL, H)
            _pfma(a7, sp, kk + C7, wf, ww, CG, NL, H)
            ww += np.uint64(CG * 16)
            kk += KS


@njit(inline="always", cache=True)
def _gblock(sp, wf, a0, a1, a2, a3, a4, a5, a6, a7, ro, k0, wk, KH, KW, CG, c1, c2, c3, c4, c5, c6, c7, kstep):
    """The register block: a_r = fma(perm_c(sp[ro[kh] + k0 + c_r + kw*kstep : +16]), wf[wk + 16 (tap*CG + c) : +16], a_r)
    for kh, kw, c ascending (c0 = 0; `_pfma`). ro: the ring slot offset of each kernel row. Inlined,
    so constant offsets at a call site become immediate address offsets; CG is a literal.
    HALVES (hosts with 256-bit vectors): the two 8-lane halves one after the other, so the 8
    accumulators of a half stay in 8 of the 16 ymm registers (16-lane accumulators need all 16 and
    spill); each lane's sequence of operations is the same either way."""
    C1, C2, C3, C4 = np.uint64(c1), np.uint64(c2), np.uint64(c3), np.uint64(c4)
    C5, C6, C7, KS = np.uint64(c5), np.uint64(c6), np.uint64(c7), np.uint64(kstep)
    if HALVES:
        _gtaps(sp, wf, a0, a1, a2, a3, a4, a5, a6, a7, ro, k0, wk, KH, KW, CG, C1, C2, C3, C4, C5, C6, C7, KS, 8, 0)
        _gtaps(sp, wf, a0, a1, a2, a3, a4, a5, a6, a7, ro, k0, wk, KH, KW, CG, C1, C2, C3, C4, C5, C6, C7, KS, 8, 1)
    else:
        _gtaps(sp, wf, a0, a1, a2, a3, a4, a5, a6, a7, ro, k0, wk, KH, KW, CG, C1, C2, C3, C4, C5, C6, C7, KS, 16, 0)


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def _gl_task(of, xf, wf, bias, rf, has_res, code, alpha, beta, n, ob0, ob1, oh0, oh1, geo, sp):
    """Output rows [oh0, oh1) of channel blocks [ob0, ob1) of image n. Flat views xf (N*Cb*H*W*16),
    of / rf (N*Ob*Ho*Wo*16), wf (Ob*KH*KW*cg*16); sp: this thread's ring of zero-bordered input rows;
    geo = (Cb, H, W, Ob, Ho, Wo, KH, KW, sh, sw, dh, dw, pt, pl, cg)."""
    Cb, H, W, Ob, Ho, Wo = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
    KH, KW, sh, sw, dh, dw, pt, pl, cg = geo[6], geo[7], geo[8], geo[9], geo[10], geo[11], geo[12], geo[13], geo[14]
    cs = 16                                        # floats per column
    Wp = (Wo - 1) * sw + (KW - 1) * dw + 1         # band columns: exactly those the taps read
    nr = (KH - 1) * dh + 1                         # ring slots
    rs = Wp * cs                                   # floats per ring slot
    a0 = nb.carray(stack_f32(16), 16)
    a1 = nb.carray(stack_f32(16), 16)
    a2 = nb.carray(stack_f32(16), 16)
    a3 = nb.carray(stack_f32(16), 16)
    a4 = nb.carray(stack_f32(16), 16)
    a5 = nb.carray(stack_f32(16), 16)
    a6 = nb.carray(stack_f32(16), 16)
    a7 = nb.carray(stack_f32(16), 16)
    bv = nb.carray(stack_f32(16), 16)
    tmp = nb.carray(stack_f32(128), 128)
    ro = np.empty(KH, np.uint64)
    al, be = np.float32(alpha), np.float32(beta)
    xf = nb.carray(_data_ptr(xf), xf.size)   # plain views (depthwise._data_ptr)
    spv = nb.carray(_data_ptr(sp), sp.size)
    wf = nb.carray(_data_ptr(wf), wf.size)
    of = nb.carray(_data_ptr(of), of.size)
    s1 = sw * cs                                   # offset step of one output position
    nv = min(RB, Wo)
    ks = dw * cs
    for ob in range(ob0, ob1):
        xbase = (n * Cb + ob) * H * W * 16
        obase = (n * Ob + ob) * Ho * Wo * 16
        wbase = np.uint64(ob * KH * KW * cg * 16)
        for l in range(16):
            bv[l] = bias[ob * 16 + l]
        nxt = oh0 * sh                             # next padded row to copy into the ring
        for oh in range(oh0, oh1):
            top = oh * sh
            for r in range(max(nxt, top), top + nr):
                _fill_row(spv, np.uint64((r % nr) * rs), xf, xbase, r, H, W, pt, pl, Wp, cg)
            nxt = top + nr
            for kh in range(KH):
                ro[kh] = np.uint64(((top + kh * dh) % nr) * rs)
            orow = obase + oh * Wo * 16
            for pb0 in range(0, Wo, RB):
                pb = max(0, min(pb0, Wo - RB))
                for l in range(16):
                    a0[l] = 0.0
                    a1[l] = 0.0
                    a2[l] = 0.0
                    a3[l] = 0.0
                    a4[l] = 0.0
                    a5[l] = 0.0
                    a6[l] = 0.0
                    a7[l] = 0.0
                k0 = np.uint64(pb * s1)
                if nv == RB and cg == 8 and sw == 1:
                    _gblock(spv, wf, a0, a1, a2, a3, a4, a5, a6, a7, ro, k0, wbase, KH, KW, 8,
                            16, 32, 48, 64, 80, 96, 112, ks)
                elif nv == RB and cg == 8 and sw == 2:
                    _gblock(spv, wf, a0, a1, a2, a3, a4, a5, a6, a7, ro, k0, wbase, KH, KW, 8,
                            32, 64, 96, 128, 160, 192, 224, ks)
                elif nv == 7 and cg == 8 and sw == 1:
                    _gblock(spv, wf, a0, a1, a2, a3, a4, a5, a6, a7, ro, k0, wbase, KH, KW, 8,
                            16, 32, 48, 64, 80, 96, 96, ks)
                elif nv == 7 and cg == 8 and sw == 2:
                    _gblock(spv, wf, a0, a1, a2, a3, a4, a5, a6, a7, ro, k0, wbase, KH, KW, 8,
                            32, 64, 96, 128, 160, 192, 192, ks)
                elif nv == RB and cg == 4 and sw == 1:
                    _gblock(spv, wf, a0, a1, a2, a3, a4, a5, a6, a7, ro, k0, wbase, KH, KW, 4,
                            16, 32, 48, 64, 80, 96, 112, ks)
                elif nv == RB and cg == 4 and sw == 2:
                    _gblock(spv, wf, a0, a1, a2, a3, a4, a5, a6, a7, ro, k0, wbase, KH, KW, 4,
                            32, 64, 96, 128, 160, 192, 224, ks)
                elif nv == RB and cg == 2 and sw == 1:
                    _gblock(spv, wf, a0, a1, a2, a3, a4, a5, a6, a7, ro, k0, wbase, KH, KW, 2,
                            16, 32, 48, 64, 80, 96, 112, ks)
                elif nv == RB and cg == 2 and sw == 2:
                    _gblock(spv, wf, a0, a1, a2, a3, a4, a5, a6, a7, ro, k0, wbase, KH, KW, 2,
                            32, 64, 96, 128, 160, 192, 224, ks)
                else:
                    # any geometry; a map narrower than RB repeats its last position (clamped offsets)
                    c1, c2, c3 = min(1, nv - 1) * s1, min(2, nv - 1) * s1, min(3, nv - 1) * s1
                    c4, c5, c6, c7 = min(4, nv - 1) * s1, min(5, nv - 1) * s1, min(6, nv - 1) * s1, min(7, nv - 1) * s1
                    if cg == 8:
                        _gblock(spv, wf, a0, a1, a2, a3, a4, a5, a6, a7, ro, k0, wbase, KH, KW, 8,
                                c1, c2, c3, c4, c5, c6, c7, ks)
                    elif cg == 4:
                        _gblock(spv, wf, a0, a1, a2, a3, a4, a5, a6, a7, ro, k0, wbase, KH, KW, 4,
                                c1, c2, c3, c4, c5, c6, c7, ks)
                    else:
                        _gblock(spv, wf, a0, a1, a2, a3, a4, a5, a6, a7, ro, k0, wbase, KH, KW, 2,
                                c1, c2, c3, c4, c5, c6, c7, ks)
                d = np.uint64(orow + pb * 16)
                if nv == RB:
                    _store8(of, d, a0, a1, a2, a3, a4, a5, a6, a7, bv)
                else:
                    _store8(tmp, np.uint64(0), a0, a1, a2, a3, a4, a5, a6, a7, bv)
                    for i in range(nv * 16):
                        of[d + np.uint64(i)] = tmp[i]
            if has_res or code != 0:
                _finish_row(of, rf, orow, Wo * 16, has_res, code, al, be)


@njit(parallel=True, nogil=True, cache=True)
def _gl_par(nt, tasks, of, xf, wf, bias, rf, has_res, code, alpha, beta, geo, band):
    """Every task (rows (n, ob0, ob1, oh0, oh1)) on nt of numba's threads, handed out dynamically."""
    counter = new_counter(nt)
    for _w in nb.prange(nt):
        _gl_seq(counter, nb.get_thread_id(), tasks, of, xf, wf, bias, rf, has_res, code, alpha, beta, geo, band)


@njit(nogil=True, cache=True)
def _gl_seq(counter, tid, tasks, of, xf, wf, bias, rf, has_res, code, alpha, beta, geo, band):
    """One worker of the task loop on the calling thread: tasks taken from `counter` (threads.numba_region)."""
    while True:
        i = take(counter, tid, tasks.shape[0])
        if i < 0:
            break
        _gl_task(of, xf, wf, bias, rf, has_res, code, alpha, beta, tasks[i, 0], tasks[i, 1], tasks[i, 2],
                 tasks[i, 3], tasks[i, 4], geo, band[tid])


@functools.lru_cache(maxsize=512)
def _plan(n, cb, h, w, ho, wo, kh, kw, cg, stride, padding, dilation):
    """(task table, geo, ring floats per thread) of a layer shape: computed once per shape (a few us a call)."""
    t, _, l, _ = padding
    (sh, sw), (dh, dw) = stride, dilation
    geo = np.array([cb, h, w, cb, ho, wo, kh, kw, sh, sw, dh, dw, t, l, cg], np.int64)
    wp = (wo - 1) * sw + (kw - 1) * dw + 1
    table = plan_tasks(n, cb, ho, wo, kh, kw, cg)
    table.flags.writeable = geo.flags.writeable = False
    return table, geo, ((kh - 1) * dh + 1) * wp * LANES


def run_nchwc(out_b, x_b, prepared, residual_b=None, *, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
              relu=False, act=None, threads=None) -> None:
    """x_b (N, Cb, H, W, 16) unpadded -> out_b (N, Ob, Ho, Wo, 16), y = act(conv + bias + residual)."""
    wl, bias = prepared["weight"], prepared["bias"]
    n, cb, h, w, _ = x_b.shape
    _, ob, ho, wo, _ = out_b.shape
    obw, kh, kw, cg, _ = wl.shape
    if obw != ob or cb != ob or cg not in (2, 4, 8) or bias.shape != (ob * LANES,):
        raise ValueError(f"grouped (lanes, NCHWc): weight {wl.shape} / bias {bias.shape} do not match input "
                         f"{x_b.shape} / output {out_b.shape}; expected ({ob}, KH, KW, cg in 2/4/8, 16) / "
                         f"({ob * LANES},), Cb = Ob")
    has_res = residual_b is not None
    if has_res and residual_b.shape != out_b.shape:
        raise ValueError(f"grouped (lanes, NCHWc): residual {residual_b.shape} != output {out_b.shape}")
    code, alpha, beta = resolve_act(relu, act, "grouped")
    of, xf, wf = out_b.reshape(-1), x_b.reshape(-1), wl.reshape(-1)   # flat views, no copy
    rf = residual_b.reshape(-1) if has_res else EMPTY1
    table, geo, ring = _plan(n, cb, h, w, ho, wo, kh, kw, cg, tuple(stride), tuple(padding), tuple(dilation))
    nrows = numba_max_threads() if region_threads(threads, len(table)) > 1 else 1
    # one ring per thread of the region, each starting on a 64-byte line (the FMAs' vector loads
    # then never split a cache line; ring is a multiple of 16 floats)
    buf = scratch("grouped_lanes_ring", nrows * (ring + 16) + 16)
    off = (-(buf.ctypes.data // 4)) % 16
    band = buf[off:off + nrows * (ring + 16)].reshape(nrows, ring + 16)
    numba_region(_gl_par, _gl_seq, threads, len(table), table, of, xf, wf, bias, rf, has_res, code, alpha, beta, geo,
                 band)


def run(out, x, prepared, residual=None, *, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), relu=False,
        act=None, threads=None) -> None:
    """NCHW in, NCHW out: block the input (and residual), run the NCHW16c kernel, unblock."""
    n, co, ho, wo = out.shape
    rb = to_nchwc(residual, threads=threads) if residual is not None else None
    out_b = np.empty((n, prepared["weight"].shape[0], ho, wo, LANES), np.float32)
    run_nchwc(out_b, to_nchwc(x, threads=threads), prepared, rb, stride=stride, padding=padding, dilation=dilation,
              relu=relu, act=act, threads=threads)
    from_nchwc(out_b, co, out=out, threads=threads)
