"""Grouped convolution with small groups for training, on CNHW (RegNet's group-width-8 3x3s, ResNeXt-like
convs, depthwise convs with a channel multiplier): at most `MAX_GROUP` input and output channels a group.

The general training conv (train_conv.py) runs a grouped conv as one GEMM per group after an im2col copy: for
RegNetY-400MF's 3x3s with 8 channels a group, (8, 72) @ (72, m) products on 9 copies of the input, 5-6x slower
than PyTorch's grouped conv (forward and backward, batch 32 at 112x112, 2 threads; benchmarks/RESULTS.md,
forty-third session). Here a group's channels are convolved directly on flat planes, as the depthwise training
kernels do (train_depthwise.py's `_fwd_flat_seq`), with strides turned into stride 1 by phase planes:

    phase planes  the zero-padded plane xp (Hp, Wp) of an image split by (row % sh, column % sw) into sh*sw
                  planes of (Hq, Wq): phase (a, b) holds xp[r*sh + a, s*sw + b] at (r, s). Output (oh, ow)'s tap
                  (i, j) reads xp[oh*sh + i*dh, ow*sw + j*dw] = phase ((i*dh) % sh, (j*dw) % sw) at
                  (oh + (i*dh) // sh, ow + (j*dw) // sw): for every stride and dilation a fixed offset in one
                  phase plane. A task's images are stacked flat, image n of the block at n*Hq*Wq; output q =
                  (n*Hq + oh)*Wq + ow reads phase(t)[q + off(t)] (`_taps`). Positions with oh >= Ho or ow >= Wo
                  are computed and dropped (forward) or hold dy = 0 (backward).
    forward       y[o, q]  = bias[o] + sum over c < cg, taps t of w[o, c, t] * xph[c, phase(t), q + off(t)]
    weight        dw[o, c, t] = sum over q of g[o, q] * xph[c, phase(t), q + off(t)]
                  (per chunk a float32 dot product, reassociated into vector partial sums, added into float64)
    input         dxph[c, ph, e] = sum over o < og, taps t in phase ph of w[o, c, t] * g[o, e - off(t)]
                  (a gather: g is stored after `off` zeros), then dx read back out of the phase planes

A task is one group and a block of images (`plan`: about `BLOCK_BYTES` of phase planes, so the block's planes stay
in the core's L2); the position loop runs in chunks of `CHUNK` values so that one output chunk and the chunks it
reads stay in L1. The forward and input-gradient sums run in a fixed order for each chunk (forward: c, then kernel
rows, then taps of a row; input gradient: o, then the taps of each phase plane in tap order), the weight gradient's
per chunk in float32, then in float64, and the tasks' partial weight and bias gradients are added in task order
after the loop: the results are bitwise equal for every thread count. `tests/test_train_grouped.py` compares all
three with PyTorch autograd (strides 1 to 3, dilation, asymmetric padding, odd sizes, 1 to 16 channels a group).

As for depthwise convs, the fused pre/post-processing of train_conv.py does not apply: patterns.py leaves these
convs out of its patterns (kernels/train_direct.py), so the BN / activations around them run as their own units.
"""
from __future__ import annotations

from functools import lru_cache

import numba as nb
import numpy as np

from .cnhw import JIT, JITR
from .conv._nb import atomic_add
from .threads import nthreads, pool_region
from .train_depthwise import is_depthwise

MAX_GROUP = 16            # at most this many input and output channels a group (else im2col + GEMM)
BLOCK_BYTES = 256 << 10   # phase planes of a task's images (the group's input channels), about
CHUNK = 512               # positions a chunk: an output chunk and the input chunks it reads in L1
_PAD = 64                 # spare values after a buffer's last chunk
_TAIL = 64


def is_small_grouped(x_shape, w_shape, groups) -> bool:
    """A grouped conv these kernels run: groups > 1, not depthwise, at most MAX_GROUP channels a group in and
    out."""
    return (groups > 1 and not is_depthwise(x_shape, w_shape, groups)
            and w_shape[1] <= MAX_GROUP and w_shape[0] // groups <= MAX_GROUP)


class _Plan:
    __slots__ = ("Hq", "Wq", "nbk", "nblk", "tph", "toff", "tord", "maxoff", "L", "groups", "cg", "og", "P")


@lru_cache(maxsize=256)
def plan(key) -> _Plan:
    """The phase-plane geometry and task grid of a conv (train_conv.ConvGeom.key): a function of the shape
    only, never of the thread count."""
    N, C, H, W, O, cg, kh, kw, sh, sw, pad, dh, dw, groups = key
    pt, pb, pl, pr = pad
    ho = (H + pt + pb - dh * (kh - 1) - 1) // sh + 1
    wo = (W + pl + pr - dw * (kw - 1) - 1) // sw + 1
    p = _Plan()
    # an image's phase rows: its data rows, and enough rows after them for its outputs' taps; the zero rows
    # before the next image's data (pt // sh of them in every phase) are read by both (7x7 maps: 8 x 8 a plane,
    # not 9 x 9); columns the same way within a row
    p.Hq = max(-(-(pt + H) // sh), ho + ((kh - 1) * dh) // sh - pt // sh)
    p.Wq = max(-(-(pl + W) // sw), wo + ((kw - 1) * dw) // sw - pl // sw)
    p.P = sh * sw
    p.groups, p.cg, p.og = groups, cg, O // groups
    per_image = max(cg, p.og) * p.P * p.Hq * p.Wq * 4
    p.nbk = max(1, min(N, BLOCK_BYTES // per_image))
    p.nblk = -(-N // p.nbk)
    p.L = p.nbk * p.Hq * p.Wq
    tph, toff = [], []
    for i in range(kh):
        for j in range(kw):
            tph.append(((i * dh) % sh) * sw + (j * dw) % sw)
            toff.append(((i * dh) // sh) * p.Wq + (j * dw) // sw)
    p.tph = np.array(tph, np.int64)
    p.toff = np.array(toff, np.int64)
    p.tord = np.array(sorted(range(kh * kw), key=lambda t: (tph[t], t)), np.int64)   # the taps by phase
    p.maxoff = int(max(toff))
    return p


@nb.njit(**JIT)
def _fill(xf, Lx, x, c0, cg, P, n0, n1, pt, pl, sh, sw, Hq, Wq):
    """xf[(c*P + phase)*Lx + position] = the zero-padded phase planes of images n0..n1 of channels c0..c0+cg of
    x (C, N, H, W), stacked flat."""
    _, _, H, W = x.shape
    xf[:cg * P * Lx] = 0.0
    for c in range(cg):
        for n in range(n0, n1):
            base = (n - n0) * Hq
            xp = x[c0 + c, n]                      # (H, W): one view a plane (a view a row cost ~15 ns)
            for h in range(H):
                hp = h + pt
                row = (c * P + (hp % sh) * sw) * Lx + (base + hp // sh) * Wq
                if sw == 1:
                    o = row + pl
                    for k in range(W):
                        xf[o + k] = xp[h, k]
                elif sw == 2:                      # both phase columns in one loop (LLVM's interleaved loads)
                    ka = pl % 2                    # input column 0's phase column; k = 2m + (1 - ka) is the other
                    oa = row + ka * Lx + pl // 2
                    ob = row + (1 - ka) * Lx + (pl + 1) // 2
                    for m in range(W // 2):
                        xf[oa + m] = xp[h, 2 * m]
                        xf[ob + m] = xp[h, 2 * m + 1]
                    if W % 2:
                        xf[oa + W // 2] = xp[h, W - 1]
                else:
                    for b in range(sw):            # phase column b: input columns k = k0, k0 + sw, ...
                        k0 = (b - pl) % sw
                        o = row + b * Lx + (k0 + pl) // sw
                        for m in range((W - k0 + sw - 1) // sw):
                            xf[o + m] = xp[h, k0 + m * sw]


@nb.njit(**JIT)
def _task_fill(task, xf, Lx, x, cg, P, nblk, nbk, pt, pl, sh, sw, Hq, Wq):
    """Task -> (group gi, images n0..n1, positions Lt), its phase planes filled into xf (`_fill`)."""
    gi, bi = task // nblk, task % nblk
    n0 = bi * nbk
    n1 = min(x.shape[1], n0 + nbk)
    _fill(xf, Lx, x, gi * cg, cg, P, n0, n1, pt, pl, sh, sw, Hq, Wq)
    return gi, n0, n1, (n1 - n0) * Hq * Wq


@nb.njit(**JIT)
def _fwd_seq(counter, tid, y, x, w3, b, has_bias, sh, sw, pt, pl, Hq, Wq, nbk, kw, tph, toff, maxoff):
    C, N, H, W = x.shape
    O, _, Ho, Wo = y.shape
    cg, kk = w3.shape[1], w3.shape[2]
    groups = C // cg
    og = O // groups
    kh = kk // kw
    nblk = -(-N // nbk)
    L = nbk * Hq * Wq
    P = sh * sw
    Lx = L + maxoff + _TAIL
    xf = np.empty(cg * P * Lx, x.dtype)            # flat 1-D buffers: contiguous loops LLVM vectorizes
    ye = np.empty(L, x.dtype)
    while True:
        task = atomic_add(counter, 0, 1)
        if task >= groups * nblk:
            return
        gi, n0, n1, Lt = _task_fill(task, xf, Lx, x, cg, P, nblk, nbk, pt, pl, sh, sw, Hq, Wq)
        for o in range(og):
            oc = gi * og + o
            bv = b[oc] if has_bias else x.dtype.type(0.0)
            for q0 in range(0, Lt, CHUNK):
                q1 = min(Lt, q0 + CHUNK)
                nq = q1 - q0
                yv = ye[q0:q1]                 # (1-D slices indexed from 0: loops LLVM vectorizes)
                for q in range(nq):
                    yv[q] = bv
                for c in range(cg):
                    for i in range(kh):
                        t = i * kw
                        if kw == 3:        # a kernel row's three taps in one pass: ((y + t0) + t1) + t2
                            w0, w1, w2 = w3[oc, c, t], w3[oc, c, t + 1], w3[oc, c, t + 2]
                            a0 = (c * P + tph[t]) * Lx + toff[t] + q0
                            a1 = (c * P + tph[t + 1]) * Lx + toff[t + 1] + q0
                            a2 = (c * P + tph[t + 2]) * Lx + toff[t + 2] + q0
                            s0, s1, s2 = xf[a0:a0 + nq], xf[a1:a1 + nq], xf[a2:a2 + nq]
                            for q in range(nq):
                                yv[q] = ((yv[q] + w0 * s0[q]) + w1 * s1[q]) + w2 * s2[q]
                        else:
                            for j in range(kw):
                                wv = w3[oc, c, t + j]
                                a0 = (c * P + tph[t + j]) * Lx + toff[t + j] + q0
                                s0 = xf[a0:a0 + nq]
                                for q in range(nq):
                                    yv[q] = yv[q] + wv * s0[q]
            for n in range(n0, n1):
                for oh in range(Ho):
                    r = ((n - n0) * Hq + oh) * Wq
                    dst = y[oc, n, oh]
                    for k in range(Wo):
                        dst[k] = ye[r + k]


@nb.njit(**JITR)
def _dot3(g, a0, a1, a2):
    """(g . a0, g . a1, g . a2) in float32, reassociated: LLVM keeps vector partial sums in registers (the same
    order on every call of one compiled kernel, so on every thread count)."""
    s0 = s1 = s2 = np.float32(0.0)
    for k in range(g.shape[0]):
        gk = g[k]
        s0 += gk * a0[k]
        s1 += gk * a1[k]
        s2 += gk * a2[k]
    return s0, s1, s2


@nb.njit(**JITR)
def _dot(g, a0):
    s0 = np.float32(0.0)
    for k in range(g.shape[0]):
        s0 += g[k] * a0[k]
    return s0


@nb.njit(**JIT)
def _bwd_seq(counter, tid, dy, x, w3, dx, dwp, dbp, need_dx, sh, sw, pt, pl, Hq, Wq, nbk, kw, tph, toff, tord,
             maxoff):
    C, N, H, W = x.shape
    O, _, Ho, Wo = dy.shape
    cg, kk = w3.shape[1], w3.shape[2]
    groups = C // cg
    og = O // groups
    kh = kk // kw
    P = sh * sw
    nblk = -(-N // nbk)
    L = nbk * Hq * Wq
    Lx = L + maxoff + _TAIL + _PAD
    Lg = maxoff + L + _PAD
    xf = np.empty(cg * P * Lx, x.dtype)
    dxf = np.empty(P * L, x.dtype)
    gf = np.empty(og * Lg, x.dtype)            # g[o, q] at o*Lg + maxoff + q; zeros before and after
    acc64 = np.empty((og, cg * kk), np.float64)
    while True:
        task = atomic_add(counter, 0, 1)
        if task >= groups * nblk:
            return
        gi, n0, n1, Lt = _task_fill(task, xf, Lx, x, cg, P, nblk, nbk, pt, pl, sh, sw, Hq, Wq)
        gf[:] = 0.0
        for o in range(og):
            oc = gi * og + o
            s = 0.0
            for n in range(n0, n1):
                for oh in range(Ho):
                    r = o * Lg + maxoff + ((n - n0) * Hq + oh) * Wq
                    src = dy[oc, n, oh]
                    for k in range(Wo):
                        gf[r + k] = src[k]
                        s += src[k]
            dbp[task, o] = s
        # weight gradient: per chunk of positions, (o, c, t) dot products in float32 (`_dot3`), added into float64
        acc64[:, :] = 0.0
        for b0 in range(0, Lt, CHUNK):
            nq = min(CHUNK, Lt - b0)
            for c in range(cg):
                for i in range(kh):
                    t = i * kw
                    for o in range(og):
                        g0 = o * Lg + maxoff + b0
                        gv = gf[g0:g0 + nq]
                        for j in range(0, kw, 3):
                            a0 = (c * P + tph[t + j]) * Lx + toff[t + j] + b0
                            if j + 2 < kw:
                                a1 = (c * P + tph[t + j + 1]) * Lx + toff[t + j + 1] + b0
                                a2 = (c * P + tph[t + j + 2]) * Lx + toff[t + j + 2] + b0
                                r0, r1, r2 = _dot3(gv, xf[a0:a0 + nq], xf[a1:a1 + nq], xf[a2:a2 + nq])
                                acc64[o, c * kk + t + j] += r0
                                acc64[o, c * kk + t + j + 1] += r1
                                acc64[o, c * kk + t + j + 2] += r2
                            else:
                                for jj in range(j, kw):
                                    a0 = (c * P + tph[t + jj]) * Lx + toff[t + jj] + b0
                                    acc64[o, c * kk + t + jj] += _dot(gv, xf[a0:a0 + nq])
        for o in range(og):
            for r in range(cg * kk):
                dwp[task, o, r // kk, r % kk] = acc64[o, r]
        if not need_dx:
            continue
        # input gradient: gathered per phase plane, then read out into dx
        for c in range(cg):
            cc = gi * cg + c
            dxf[:] = 0.0
            for e0 in range(0, Lt, CHUNK):
                e1 = min(Lt, e0 + CHUNK)
                ne = e1 - e0
                for o in range(og):
                    oc = gi * og + o
                    gs = o * Lg + maxoff + e0
                    j = 0
                    while j < kk:                  # the taps by phase (`tord`), up to three of one phase a pass
                        t0 = tord[j]
                        d = tph[t0] * L + e0
                        dv = dxf[d:d + ne]
                        g0 = gf[gs - toff[t0]:gs - toff[t0] + ne]
                        w0 = w3[oc, c, t0]
                        if j + 2 < kk and tph[tord[j + 2]] == tph[t0]:
                            t1, t2 = tord[j + 1], tord[j + 2]
                            w1, w2 = w3[oc, c, t1], w3[oc, c, t2]
                            g1 = gf[gs - toff[t1]:gs - toff[t1] + ne]
                            g2 = gf[gs - toff[t2]:gs - toff[t2] + ne]
                            for e in range(ne):
                                dv[e] = ((dv[e] + w0 * g0[e]) + w1 * g1[e]) + w2 * g2[e]
                            j += 3
                        elif j + 1 < kk and tph[tord[j + 1]] == tph[t0]:
                            t1 = tord[j + 1]
                            w1 = w3[oc, c, t1]
                            g1 = gf[gs - toff[t1]:gs - toff[t1] + ne]
                            for e in range(ne):
                                dv[e] = (dv[e] + w0 * g0[e]) + w1 * g1[e]
                            j += 2
                        else:
                            for e in range(ne):
                                dv[e] = dv[e] + w0 * g0[e]
                            j += 1
            for n in range(n0, n1):
                base = (n - n0) * Hq
                for h in range(H):
                    hp = h + pt
                    row = (hp % sh) * sw * L + (base + hp // sh) * Wq
                    dst = dx[cc, n, h]
                    if sw == 1:
                        for k in range(W):
                            dst[k] = dxf[row + pl + k]
                    elif sw == 2:                  # as _fill's: both phase columns in one loop
                        oa = row + (pl % 2) * L + pl // 2
                        ob = row + (1 - pl % 2) * L + (pl + 1) // 2
                        for m in range(W // 2):
                            dst[2 * m] = dxf[oa + m]
                            dst[2 * m + 1] = dxf[ob + m]
                        if W % 2:
                            dst[W - 1] = dxf[oa + W // 2]
                    else:
                        for k in range(W):
                            wp = k + pl
                            dst[k] = dxf[row + (wp % sw) * L + wp // sw]


def grouped_forward_cnhw(x, w, g, bias=None):
    """y (O, N, Ho, Wo) of a grouped conv of x (C, N, H, W), w (O, C / groups, kh, kw); g:
    train_conv.ConvGeom with is_small_grouped."""
    p = plan(g.key)
    y = np.empty((g.O, g.N, g.ho, g.wo), x.dtype)
    w3 = np.ascontiguousarray(w).reshape(g.O, w.shape[1], g.kh * g.kw)
    b = bias if bias is not None else np.zeros(1, x.dtype)
    pool_region(_fwd_seq, nthreads(), p.groups * p.nblk, y, x, w3, b, bias is not None, g.sh, g.sw, g.pt, g.pl,
                p.Hq, p.Wq, p.nbk, g.kw, p.tph, p.toff, p.maxoff)
    return y


def grouped_backward_cnhw(dy, x, w, g, need_dx=True, has_bias=False):
    """(dw, db, dx) of y = grouped_forward_cnhw(x, w, g): dw like w, db (O,) or None, dx (C, N, H, W) or None.
    The tasks' partial sums are added in task order (the same bits for every thread count)."""
    p = plan(g.key)
    ntasks = p.groups * p.nblk
    w3 = np.ascontiguousarray(w).reshape(g.O, w.shape[1], g.kh * g.kw)
    dx = np.empty_like(x) if need_dx else np.empty((1, 1, 1, 1), x.dtype)
    dwp = np.empty((ntasks, p.og, p.cg, g.kh * g.kw), np.float64)
    dbp = np.empty((ntasks, p.og), np.float64)
    pool_region(_bwd_seq, nthreads(), ntasks, np.ascontiguousarray(dy), x, w3, dx, dwp, dbp, bool(need_dx), g.sh,
                g.sw, g.pt, g.pl, p.Hq, p.Wq, p.nbk, g.kw, p.tph, p.toff, p.tord, p.maxoff)
    # task gi * nblk + bi: group gi's partials, image blocks in order
    dw = dwp.reshape(p.groups, p.nblk, p.og, p.cg, -1)
    acc = dw[:, 0].copy()
    for bi in range(1, p.nblk):
        acc += dw[:, bi]
    db = None
    if has_bias:
        b4 = dbp.reshape(p.groups, p.nblk, p.og)
        dbs = b4[:, 0].copy()
        for bi in range(1, p.nblk):
            dbs += b4[:, bi]
        db = dbs.reshape(g.O).astype(x.dtype)
    return acc.reshape(w.shape).astype(w.dtype), db, (dx if need_dx else None)
