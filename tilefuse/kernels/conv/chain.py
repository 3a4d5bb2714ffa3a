"""Fused conv chains on NCHW16c: [1x1 expand] -> depthwise -> [1x1 project] over row bands, issue 9.

The inverted-residual block of MobileNetV2 / V3 and EfficientNet is three layers: a 1x1 conv
widens C channels to t*C (t = 4-6), a depthwise kxk conv filters them, a 1x1 conv narrows them
again (plus the block's input as a residual). Layer by layer, the wide tensor is written by the
expansion and read back by the depthwise conv, and the depthwise output written and read again
by the projection: at 112x112x96 (MobileNetV2's second block) 4.8 MB each, beyond L2. Here the
three run as one task loop over row bands of the block's output (seed 003's streaming, applied
to one block): a task takes output rows [oh0, oh1) of one image and

    E (Ce/16, re, W, 16)  = act_e(x[rows ih_lo..ih_hi) @ w_e + b_e)      the rows the band needs
    D (Ce/16, rd, Wo, 16) = act_d(depthwise(E) + b_d)                     rd = oh1 - oh0
    out[rows oh0..oh1)    = act_p(D @ w_p + b_p (+ residual))

E and D are per-thread scratch sized to stay in L2; a band's halo rows (kh - 1 of them at stride
1) are expanded again by the next band (recomputed, not copied: bands are tasks and any thread may
take the next one). Either 1x1 may be absent (MobileNetV2's first block has no expansion;
EfficientNet's squeeze-excitation sits between the depthwise conv and the projection, so there
the chain is expansion -> depthwise and D is the layer's output tensor).

The parts are the layer kernels themselves: the 1x1s are `k1x1._k1x1_strips` (the assembly strip
of AVX-512 / AVX2 hosts, `tiles.ASM_512` / `tiles.ASM_AVX2`), told the band's input block stride
and row offset (HWi, xsh); the depthwise is `depthwise._dw_task` on the band as a small image
(geometry with the band's height and its first row's offset folded into the top padding). Every
output value is computed by the same operations in the same order as layer by layer (a 1x1
value's dot product does not depend on the positions around it; a depthwise value's taps are the
rows inside the image, all of them in the band), so the fused chain gives the same bits as the
three layers, for any band height and thread count (tests/test_chain.py).

Where the bands would expand too many halo rows (small maps with many channels, batch 1), `SplitChain` runs
the expansion and the depthwise as one region split by the wide tensor's channel blocks instead (a depthwise
channel needs only its own expanded channel); the projection stays a layer.

A session binds chains itself (`find_chains`, called from kernels/registry.py's `bind_chains`):
the program keeps its three conv instructions, the first runs the chain and the others become
no-ops, and nothing changes in packages, plans or the accelerator models. `CHAINS = False` or
TILEFUSE_CHAINS=0 turns it off.
"""
from __future__ import annotations

import os

import numba as nb
import numpy as np
from numba import njit

from tilefuse.kernels.conv._nb import new_counter, stack_i64, take
from tilefuse.kernels.conv import depthwise
from tilefuse.kernels.conv.depthwise import _dw_task
from tilefuse.kernels.conv.epilogue import EMPTY1, resolve_act
from tilefuse.kernels.conv.k1x1 import (PF_INPUT_SWEEPS, PF_OUT, PF_WEIGHTS, SR, STRIP_GROUP_BYTES,
                                        STRIP_K, _k1x1_strips, half_flag, reduction_length)
from tilefuse.kernels.conv.planner import cache_sizes
from tilefuse.kernels.conv.tiles import ASM_512, ASM_AVX2
from tilefuse.kernels.threads import numba_max_threads, numba_region, region_threads, scratch

CHAINS = os.environ.get("TILEFUSE_CHAINS", "1") != "0"
AVAILABLE = ASM_512 or ASM_AVX2          # the 1x1 parts run the assembly strip
# fuse only where the wide tensor leaves L2 layer by layer: a depthwise input smaller than this (per
# image) stays in L2 between the layers anyway, and a band's recomputed halo rows then cost more than the
# region launches the chain saves
MIN_WIDE_BYTES = 128 << 10
# where MAX_HALO refuses the bands at batch 1: expansion -> depthwise as one region split by channels (SplitChain);
# TILEFUSE_SPLIT_CHAINS=0: the layers
SPLIT = os.environ.get("TILEFUSE_SPLIT_CHAINS", "1") != "0"
MAX_HALO = 0.35        # at most this share of the expansion's rows computed twice (the bands' halos)
D_BYTES = 64 << 10      # the depthwise rows projected at a time (D): at most this many bytes, at least a row
E_SHARE = 0.5           # a band's expanded rows (E): at most this share of L2
PFO = PF_OUT | PF_WEIGHTS | PF_INPUT_SWEEPS | 16 | (min(255, STRIP_K // 16) << 8)   # | k1x1.half_flag per 1x1


def _readonly(a):
    a.flags.writeable = False
    return a


# a missing 1x1's operands: read-only like the package's constants, so each chain shape compiles once
NO_WEIGHT = _readonly(np.zeros((0, 0, 32), np.float32))
NO_BIAS = _readonly(np.zeros(0, np.float32))


@njit(nogil=True, cache=True)
def _pointwise(of, xf, wp, bias, rf, has_res, code, al, be, q0, q1, HWo, Cb, Ob, kc, pfo, HWi, xsh):
    """One 1x1 over positions [q0, q1) of a plane of HWo positions (image 0 of `of`), every output
    block, reading input position j + xsh of planes of HWi positions; act as k1x1._k1x1_strips applies
    it (identity / ReLU / clip in the strip's stores, the others over each strip's rows once stored); pfo: PFO and
    the 1x1's k1x1.half_flag."""
    group = max(SR, STRIP_GROUP_BYTES // max(1, 4 * kc) // SR * SR)
    _k1x1_strips(of, xf, wp, bias, rf, has_res, code, al, be, q0, q1, 0, Ob, HWo, Cb, Ob, False, pfo, kc,
                 group, HWi, xsh)


@njit(nogil=True, cache=True)
def _chain_task(n, oh0, oh1, of, xf, rf, has_res, E, D, sp, padded, geo,
                has_e, we, bwe, kce, pfe, ce_code, ce_al, ce_be,
                wd, bd, cd_code, cd_al, cd_be,
                has_p, wp, bwp, kcp, pfp, cp_code, cp_al, cp_be):
    """Output rows [oh0, oh1) of image n (see the module docstring). geo = (Cx, H, W, Ce, Ho, Wo, KH, KW,
    sh, sw, dh, dw, pt, pl, Cout, sub): Cx input blocks, Ce the depthwise's blocks, Cout output blocks, sub the
    rows D holds (the band's depthwise rows are projected `sub` at a time)."""
    Cx, H, W, Ce, Ho, Wo = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
    KH, sh, dh, pt, Cout = geo[6], geo[8], geo[10], geo[12], geo[14]
    g = nb.carray(stack_i64(14), 14)
    for i in range(14):
        g[i] = geo[i]
    ih_lo = max(0, oh0 * sh - pt)
    ih_hi = min(H, (oh1 - 1) * sh - pt + (KH - 1) * dh + 1)
    sx = Cx * H * W * 16
    xi = xf[n * sx:(n + 1) * sx]
    if has_e:   # the band's input rows, expanded: E (Ce, re, W, 16)
        re = ih_hi - ih_lo
        src = E[:Ce * re * W * 16]
        _pointwise(src, xi, we, bwe, EMPTY1, False, ce_code, ce_al, ce_be, 0, re * W, re * W, Cx, Ce, kce, pfe, H * W,
                   ih_lo * W)
        g[1] = re
        src_row = ih_lo
    else:       # the depthwise reads the block's input in place
        src = xi
        src_row = 0
    so = Cout * Ho * Wo * 16
    if not has_p:   # the depthwise writes the output rows; input row i of src is row i + src_row of the image
        g[12] = pt + src_row
        _dw_task(of[n * so:(n + 1) * so], src, wd, bd, EMPTY1, False, cd_code, cd_al, cd_be, 0, 0, Ce, oh0, oh1, g,
                 sp, padded, EMPTY1)
        return
    oi = of[n * so:(n + 1) * so]
    ri = rf[n * so:(n + 1) * so] if has_res else EMPTY1
    sub = geo[15]
    for s0 in range(oh0, oh1, sub):   # `sub` rows at a time: depthwise into D (Ce, rd, Wo, 16), then projected
        s1 = min(oh1, s0 + sub)
        rd = s1 - s0
        dst = D[:Ce * rd * Wo * 16]
        g[4] = rd
        g[12] = pt + src_row - s0 * sh   # D's row r is the layer's row r + s0
        _dw_task(dst, src, wd, bd, EMPTY1, False, cd_code, cd_al, cd_be, 0, 0, Ce, 0, rd, g, sp, padded, EMPTY1)
        _pointwise(oi, dst, wp, bwp, ri, has_res, cp_code, cp_al, cp_be, s0 * Wo, s1 * Wo, Ho * Wo, Ce, Cout, kcp,
                   pfp, rd * Wo, -s0 * Wo)


@njit(nogil=True, cache=True)
def _chain_seq(counter, tid, tasks, of, xf, rf, has_res, E, D, sp, padded, geo, has_e, we, bwe, kce, pfe, ce_code,
               ce_al, ce_be, wd, bd, cd_code, cd_al, cd_be, has_p, wp, bwp, kcp, pfp, cp_code, cp_al, cp_be):
    """One worker of the chain's task loop (threads.numba_region): tasks (T, 3) = (n, oh0, oh1)."""
    while True:
        i = take(counter, tid, tasks.shape[0])
        if i < 0:
            break
        _chain_task(tasks[i, 0], tasks[i, 1], tasks[i, 2], of, xf, rf, has_res, E[tid], D[tid], sp[tid], padded, geo,
                    has_e, we, bwe, kce, pfe, ce_code, ce_al, ce_be, wd, bd, cd_code, cd_al, cd_be,
                    has_p, wp, bwp, kcp, pfp, cp_code, cp_al, cp_be)


@njit(parallel=True, nogil=True, cache=True)
def _chain_par(nt, tasks, of, xf, rf, has_res, E, D, sp, padded, geo, has_e, we, bwe, kce, pfe, ce_code, ce_al, ce_be,
               wd, bd, cd_code, cd_al, cd_be, has_p, wp, bwp, kcp, pfp, cp_code, cp_al, cp_be):
    counter = new_counter(nt)
    for _w in nb.prange(nt):
        _chain_seq(counter, nb.get_thread_id(), tasks, of, xf, rf, has_res, E, D, sp, padded, geo, has_e, we, bwe, kce,
                   pfe, ce_code, ce_al, ce_be, wd, bd, cd_code, cd_al, cd_be, has_p, wp, bwp, kcp, pfp, cp_code, cp_al,
                   cp_be)


@njit(nogil=True, cache=True)
def _split_seq(counter, tid, tasks, of, xf, Cx, E, sp, padded, geo, we, bwe, kce, pfe, ce_code, ce_al, ce_be, wd, bd,
               cd_code, cd_al, cd_be):
    """One worker of a channel-split chain (`SplitChain`): tasks (T, 2) = expanded blocks [c0, c1). A task expands
    its blocks over the whole map of image 0 into this thread's E (the wide tensor's shape, only [c0, c1)
    written), then runs the depthwise on those blocks from E into the layer's output. Cx: the input's blocks;
    geo: the depthwise layer's (its input, E, has Ce blocks)."""
    H, W, Ce = geo[1], geo[2], geo[3]
    Ho = geo[4]
    group = max(SR, STRIP_GROUP_BYTES // max(1, 4 * kce) // SR * SR)
    e = E[tid]
    while True:
        i = take(counter, tid, tasks.shape[0])
        if i < 0:
            break
        c0, c1 = tasks[i, 0], tasks[i, 1]
        _k1x1_strips(e, xf, we, bwe, EMPTY1, False, ce_code, ce_al, ce_be, 0, H * W, c0, c1, H * W, Cx, Ce, False,
                     pfe, kce, group, H * W, 0)
        _dw_task(of, e, wd, bd, EMPTY1, False, cd_code, cd_al, cd_be, 0, c0, c1, 0, Ho, geo, sp[tid], padded, EMPTY1)


@njit(parallel=True, nogil=True, cache=True)
def _split_par(nt, tasks, of, xf, Cx, E, sp, padded, geo, we, bwe, kce, pfe, ce_code, ce_al, ce_be, wd, bd, cd_code,
               cd_al, cd_be):
    counter = new_counter(nt)
    for _w in nb.prange(nt):
        _split_seq(counter, nb.get_thread_id(), tasks, of, xf, Cx, E, sp, padded, geo, we, bwe, kce, pfe, ce_code,
                   ce_al, ce_be, wd, bd, cd_code, cd_al, cd_be)


def _dw_geometry(dwp, dwv) -> tuple:
    """A depthwise instruction's (params, prepared) -> (blocks, KH, KW, sh, sw, dh, dw, top pad, left pad)."""
    kh, kw = dwv["weight"].shape[1:3]
    sh, sw = dwp["stride"]
    dh, dd = dwp["dilation"]
    pt, _, pl, _ = dwp["padding"]
    return dwv["weight"].shape[0], kh, kw, sh, sw, dh, dd, pt, pl


def _pw_part(p, ob: int) -> tuple:
    """A chain's 1x1 arguments from (params, prepared) or None (absent): (present, weight, bias, kc, pfo, act
    code, alpha, beta); pfo with the 1x1's k1x1.half_flag for its ob output blocks."""
    if p is None:
        return (False, NO_WEIGHT, NO_BIAS, 0, PFO, 0, np.float32(0), np.float32(0))
    params, prep = p
    code, al, be = resolve_act(params.get("relu", False), params.get("act"), "chain")
    kc = int(reduction_length(prep["weight"]))
    return (True, prep["weight"], prep["bias"], kc, PFO | half_flag(prep["weight"], kc, ob), code, al, be)


def _dw_part(dwp, dwv) -> tuple:
    """A chain's depthwise arguments: (flat weight, bias, act code, alpha, beta)."""
    code, al, be = resolve_act(dwp.get("relu", False), dwp.get("act"), "chain")
    return (dwv["weight"].reshape(-1), dwv["bias"], code, al, be)


def split_group(ce: int, threads: int) -> int:
    """A SplitChain task's blocks of the wide tensor's ce: one task per thread where ce divides evenly (the
    blocks a core expands are the ones it filters), else about three per thread (equal groups) to balance."""
    t = max(1, int(threads))
    want = t if ce % t == 0 else min(ce, 3 * t)
    g = -(-ce // want)
    return -(-ce // -(-ce // g))


class SplitChain:
    """Expansion -> depthwise of one image split by the wide tensor's channel blocks (`_split_seq`), where row
    bands would expand too many halo rows twice (MAX_HALO: MobileNetV2's 14x14 and 7x7 blocks at batch 1). A
    depthwise channel reads only its own expanded channel, so a task of blocks [c0, c1) needs nothing from
    the others: one region for the two layers, each expanded block read by the depthwise from the core that
    wrote it (layer by layer, half of it was in the other core's cache) and never written to the shared
    tensor. The projection after it stays its own layer. The same bits as the two layers (the 1x1's full-K
    chains, the depthwise's taps on the same values)."""

    def __init__(self, x, out, expand, dw, threads):
        self.x, self.out, self.res = x, out, None
        self.threads = threads
        dwp, dwv = dw
        _, cx, h, w, _ = x.shape
        _, _, ho, wo, _ = out.shape
        ce, kh, kw, sh, sw, dh, dd, pt, pl = _dw_geometry(dwp, dwv)
        g = split_group(ce, threads)
        self.tasks = np.array([(c, min(c + g, ce)) for c in range(0, ce, g)], np.int64).reshape(-1, 2)
        self.tasks.flags.writeable = False
        self.geo = np.array([ce, h, w, ce, ho, wo, kh, kw, sh, sw, dh, dd, pt, pl], np.int64)
        self.geo.flags.writeable = False
        self.cx = cx
        self.e_len = ce * h * w * 16
        pad = depthwise.PADDED if depthwise.PADDED is not None else depthwise.use_padded(ho, wo, kw, sw)
        self.padded = bool(pad)
        self.sp_len = (((ho - 1) * sh + (kh - 1) * dh + 1) * ((wo - 1) * sw + (kw - 1) * dd + 1) * 16
                       if self.padded else 1)
        self.e = _pw_part(expand, ce)[1:]
        self.d = _dw_part(dwp, dwv)

    def __call__(self, *_):
        nrows = numba_max_threads() if region_threads(self.threads, len(self.tasks)) > 1 else 1
        E = scratch("chain_split_e", (nrows, self.e_len))
        sp = scratch("chain_sp", (nrows, self.sp_len))
        numba_region(_split_par, _split_seq, self.threads, len(self.tasks), self.tasks, self.out.reshape(-1),
                     self.x.reshape(-1), self.cx, E, sp, self.padded, self.geo, *self.e, *self.d)

    def describe(self) -> dict:
        return {"algorithm": "chain", "partitioning": f"pw+dw, {int(self.tasks[0, 1] - self.tasks[0, 0])}-block "
                "channel groups", "tasks": len(self.tasks), "rows": int(self.geo[4])}


def plan_bands(n, ce, h, w, ho, wo, kh, sh, dh, threads, budget=None):
    """Output rows per band: the most whose expanded input rows (E) fit `budget` bytes (default E_SHARE
    of L2), at most ceil(Ho / 2) and few enough for a band per thread (a batch-1 layer on 16 threads:
    Ho / 16 rows), then fewer while the batch's bands do not split evenly over the threads (a count that
    is a multiple of the thread count, or at least 4 per thread); equal bands. Returns the task table
    (T, 3) int64: (image, oh0, oh1)."""
    budget = budget or int(cache_sizes().l2 * E_SHARE)
    row_e = ce * w * 64
    rows = max(1, -(-ho // 2))
    while rows > 1 and ((rows - 1) * sh + (kh - 1) * dh + 1) * row_e > budget:
        rows -= 1
    rows = max(1, min(rows, ho // -(-threads // n)))
    best = rows
    while rows > 1:
        bands = n * -(-ho // rows)
        if bands % threads == 0 or bands >= 4 * threads:
            break
        rows -= 1
    rows = rows if rows > max(1, best // 2) else best
    rows = -(-ho // -(-ho // rows))          # equal bands
    t = np.array([(i, r, min(r + rows, ho)) for i in range(n) for r in range(0, ho, rows)], np.int64).reshape(-1, 3)
    t.flags.writeable = False
    return t


def halo_share(tasks, h, kh, sh, dh, pt) -> float:
    """The share of the expansion's rows a chain with these bands computes twice: the E rows of all bands
    over the input's rows, minus 1 (0 when the bands need no input row twice)."""
    lo = np.maximum(0, tasks[:, 1] * sh - pt)
    hi = np.minimum(h, (tasks[:, 2] - 1) * sh - pt + (kh - 1) * dh + 1)
    images = len(set(tasks[:, 0].tolist()))
    return float((hi - lo).sum()) / (images * h) - 1.0


class BoundChain:
    """A chain of NCHW16c conv instructions bound to views of one context (see `find_chains`):
    call it to run the whole chain; `describe()` for the profile."""

    def __init__(self, x, out, res, expand, dw, project, threads):
        self.x, self.out, self.res = x, out, res
        self.threads = threads
        dwp, dwv = dw
        n, cx, h, w, _ = x.shape
        _, cout, ho, wo, _ = out.shape
        ce, kh, kw, sh, sw, dh, dd, pt, pl = _dw_geometry(dwp, dwv)
        self.tasks = plan_bands(n, ce, h, w, ho, wo, kh, sh, dh, threads)
        rows = int((self.tasks[:, 2] - self.tasks[:, 1]).max())
        sub = max(1, min(rows, D_BYTES // (ce * wo * 64)))
        self.geo = np.array([cx, h, w, ce, ho, wo, kh, kw, sh, sw, dh, dd, pt, pl, cout, sub], np.int64)
        self.e_len = (ce * ((rows - 1) * sh + (kh - 1) * dh + 1) * w * 16) if expand else 1
        self.d_len = ce * sub * wo * 16 if project else 1
        # the depthwise layer's own choice of the padded-band path (its bits at stride 2 differ from the
        # in-place path's in the last column: the chain follows the layer)
        pad = depthwise.PADDED if depthwise.PADDED is not None else depthwise.use_padded(ho, wo, kw, sw)
        self.padded = bool(pad)
        band_in = (rows - 1) * sh + (kh - 1) * dh + 1
        self.sp_len = band_in * ((wo - 1) * sw + (kw - 1) * dd + 1) * 16 if self.padded else 1
        self.e = _pw_part(expand, ce)
        self.p = _pw_part(project, cout)
        self.d = _dw_part(dwp, dwv)

    def __call__(self, *_):
        nrows = numba_max_threads() if region_threads(self.threads, len(self.tasks)) > 1 else 1
        E = scratch("chain_e", (nrows, self.e_len))
        D = scratch("chain_d", (nrows, self.d_len))
        sp = scratch("chain_sp", (nrows, self.sp_len))
        has_res = self.res is not None
        numba_region(_chain_par, _chain_seq, self.threads, len(self.tasks), self.tasks, self.out.reshape(-1),
                     self.x.reshape(-1), self.res.reshape(-1) if has_res else EMPTY1, has_res, E, D, sp, self.padded,
                     self.geo,
                     *self.e, *self.d, *self.p)

    def describe(self) -> dict:
        rows = int((self.tasks[:, 2] - self.tasks[:, 1]).max())
        parts = "+".join(("pw",) * bool(self.e[0]) + ("dw",) + ("pw",) * bool(self.p[0]))
        return {"algorithm": "chain", "partitioning": f"{parts}, {rows}-row bands", "tasks": len(self.tasks),
                "rows": rows}


def _conv(ins, kind):
    """ins is a conv2d instruction of the NCHW16c `kind` ("pw": a stride-1 1x1 gemm1x1, "dw": a depthwise
    with multiplier 1) that a chain can take; its epilogue has no input scale."""
    p = ins.params
    if ins.kernel != "conv2d" or p.get("layout") != "nchwc" or p.get("out_layout") not in (None, "nchwc") or \
            p.get("has_input_scale"):
        return False
    if kind == "pw":
        return p.get("algorithm") == "gemm1x1" and tuple(p["stride"]) == (1, 1) and p.get("groups", 1) == 1
    return p.get("algorithm") == "depthwise" and "src" not in (p.get("prepared") or ()) and not p.get("has_residual")


def _parts(ins, views):
    """(params, {prepared name: view}, residual view or None) of a conv instruction's operand views."""
    keys = tuple(ins.params.get("prepared") or ())
    prep = dict(zip(keys, views[1:1 + len(keys)]))
    res = views[1 + len(keys)] if ins.params.get("has_residual") else None
    return ins.params, prep, res


def _overlaps(a, b) -> bool:
    a0, b0 = a.__array_interface__["data"][0], b.__array_interface__["data"][0]
    return a0 < b0 + b.nbytes and b0 < a0 + a.nbytes


def find_chains(program, views, threads) -> dict:
    """{first instruction index: (BoundChain, indices it covers)} for the chains of `program` (decoded
    instructions; views[i]: instruction i's operand views, None for one the chains must not touch):
    a depthwise conv with the 1x1 before it (its only reader) and / or the 1x1 after it (the only reader
    of its output), every operand a direct view, a wide tensor of at least MIN_WIDE_BYTES per image, the
    chain's output sharing no memory with its input or residual."""
    if not (CHAINS and AVAILABLE):
        return {}
    readers: dict[str, list[int]] = {}
    for i, ins in enumerate(program):
        for op in ins.inputs:
            readers.setdefault(op.name, []).append(i)
    found = {}
    for i, ins in enumerate(program):
        if views[i] is None or not _conv(ins, "dw"):
            continue
        pre = program[i - 1] if i > 0 and views[i - 1] is not None else None
        post = program[i + 1] if i + 1 < len(program) and views[i + 1] is not None else None
        take_e = pre is not None and _conv(pre, "pw") and not pre.params.get("has_residual") and \
            pre.output.name == ins.inputs[0].name and readers.get(pre.output.name) == [i]
        take_p = post is not None and _conv(post, "pw") and post.inputs[0].name == ins.output.name and \
            readers.get(ins.output.name) == [i + 1]
        if not take_p:   # expansion -> depthwise alone (EfficientNet's, before its squeeze-excitation) did not pay:
            continue     # its halo rows' expansion and activation are recomputed, and nothing after it is saved
        idx = ([i - 1] if take_e else []) + [i] + ([i + 1] if take_p else [])
        vs = [views[j] for j in idx]
        if not all(isinstance(v, np.ndarray) for w in vs for v in w):
            continue
        wide = views[i][0]
        if wide.nbytes // wide.shape[0] < MIN_WIDE_BYTES:
            continue
        x = vs[0][0]
        out = vs[-1][-1]
        eparams, eprep, _ = _parts(pre, views[i - 1]) if take_e else (None, None, None)
        dparams, dprep, _ = _parts(ins, views[i])
        pparams, pprep, res = _parts(post, views[i + 1]) if take_p else (None, None, None)
        if _overlaps(out, x) or (res is not None and _overlaps(out, res)):
            continue
        chain = BoundChain(x, out, res, (eparams, eprep) if take_e else None, (dparams, dprep),
                           (pparams, pprep) if take_p else None, threads)
        g = chain.geo   # bands thin enough for every thread expand many rows twice: the layers are cheaper
        if take_e and halo_share(chain.tasks, g[1], g[6], g[8], g[10], g[12]) > MAX_HALO:
            # batch 1: expansion -> depthwise split by channels instead (its output must not share memory with the
            # input: a task writes its blocks while another still expands)
            if SPLIT and x.shape[0] == 1 and take_e and wide.shape[1] >= threads and not _overlaps(views[i][-1], x):
                found[idx[0]] = (SplitChain(x, views[i][-1], (eparams, eprep), (dparams, dprep), threads), idx[:2])
            continue
        found[idx[0]] = (chain, idx)
    return found
