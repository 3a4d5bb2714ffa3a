"""The fused conv epilogue, one definition for every conv kernel:  y = act(conv + bias + residual).

`act` is an activation of the shared table `tilefuse.kernels.activations` (identity, relu, clip,
hardswish, sigmoid, silu, gelu, ...), given to the kernels as the triple (code, alpha, beta).
`resolve_act(relu, act)` turns a kernel call's arguments into that triple (`relu=True` is
act relu, kept for the callers that only know ReLU).

Three forms, so that the order (bias, then residual, then the activation) and the activation code
live here only:
  - `store_block(dst, res, has_res, acc, a0, offs, o0, nv, nk, dk, code, alpha, beta)` (and `store_rows`,
    the same with the block's offsets at offs[s0:]): the store of
    a register block (nv output positions x nk blocks of 16 output channels, one AVX-512 vector
    each) of the direct, k1x1, stem and Winograd NCHWc kernels; `acc` already holds conv + bias
    (added as the accumulators leave registers).
  - `epilogue_rows(o, bias, res, has_res, code, alpha, beta)`: rows of a GEMM output block in
    place (gemm1x1 and im2col, NCHW).
  - `activations.apply_scalar(code, v, alpha, beta)`: one value, for the scattering stores
    (NCHW outputs of blocked kernels, the BLAS 1x1 on NCHWc, depthwise).
Identity, ReLU and clip (ReLU6: MobileNet's every expand and depthwise layer) get loops of their
own inside `store_block` (the branch on `code` is outside the lanes loop, so the loops vectorize and
ReLU's bits are those of the kernels before activations were generalized; clip is the same
min(max(v, alpha), beta) as `apply_scalar`, without a call per register block).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from tilefuse.kernels.activations import ACTIVATIONS, NAMES, apply_scalar, apply_span, normalize
from tilefuse.kernels.conv._nb import act16, store16
from tilefuse.kernels.fpflags import FAST

# floats (32 KiB) of output per deferred activation pass: the kernels' dispatchers (k1x1._k1x1,
# direct._direct_rows2, stem._stem_rows) store the tiles of a chunk of output rows with bias (+ residual)
# only and run an activation past clip over the chunk in one act_span pass while it is in L1/L2
ACT_CHUNK = 8192
EMPTY1 = np.zeros(0, np.float32)  # "no residual" placeholders (keep numba types fixed)
EMPTY2 = np.zeros((0, 0), np.float32)
EMPTY4 = np.zeros((0, 0, 0, 0), np.float32)

IDENTITY = (0, np.float32(0.0), np.float32(0.0))
RELU = (1, np.float32(0.0), np.float32(0.0))

def resolve_act(relu: bool = False, act=None, where: str = "conv") -> tuple:
    """A kernel call's (relu, act) -> (code, alpha, beta) with alpha, beta as np.float32.

    act: None, a (code, alpha, beta) triple (from activations.encode), a (name, alpha, beta)
    triple, or a name (parameters at their defaults). relu=True means act relu; giving both
    relu=True and another activation is an error."""
    if (not relu and type(act) is tuple and len(act) == 3 and type(act[0]) is int and act[0] in NAMES
            and type(act[1]) is np.float32 and type(act[2]) is np.float32 and act[1] == act[1] and act[2] == act[2]):
        return act   # already resolved (the bound layers pass it on every call)
    if act is None:
        return RELU if relu else IDENTITY
    if isinstance(act, str):
        _, a, b = normalize(act, None, where)
        code = ACTIVATIONS[act][0]
    else:
        try:
            head, a, b = act
        except (TypeError, ValueError):
            raise ValueError(f"{where}: act must be (code, alpha, beta), (name, alpha, beta) or a name, "
                             f"got {act!r}") from None
        if isinstance(head, str):
            if head not in ACTIVATIONS:
                raise ValueError(f"{where}: unknown activation {head!r}; known: {', '.join(ACTIVATIONS)}")
            code = ACTIVATIONS[head][0]
        else:
            code = int(head)
            if code != head or code not in NAMES:
                raise ValueError(f"{where}: unknown activation code {head!r}; known codes 0..{max(NAMES)} "
                                 f"({', '.join(f'{c}={n}' for c, n in NAMES.items())})")
        a, b = float(a), float(b)
        if a != a or b != b:
            raise ValueError(f"{where}: activation {NAMES[code]} parameters must not be NaN, got ({a}, {b})")
    if relu and code not in (0, 1):
        raise ValueError(f"{where}: relu=True and act={NAMES[code]} both given; pass one activation")
    if relu and code == 0:
        return RELU
    return code, np.float32(a), np.float32(b)


@njit(inline="always")
def store_block(dst, res, has_res, acc, a0, offs, o0, nv, nk, dk, code, alpha, beta):
    """The register block's epilogue and store: for r < nv, k < nk, the 16 lanes l,
        dst[o0 + offs[r] + k*dk + l] = act(acc[a0 + r, 16k + l] (+ res[same offset]))
    dst and res 1-D with the same layout; acc (rows, >= 16 nk) holds conv + bias; offsets >= 0
    (`store_rows` with s0 = 0).

    The residual is added before the activation (the reference's order). Unsigned indices keep
    numba's negative-index wraparound code out of the stores; identity, ReLU and clip compute in
    registers without writing acc back; the other activations go through `act_block`, one call
    per register block (not per 16 lanes), so the call and the branch on the code are paid once
    per block and the lanes loop of each activation vectorizes."""
    store_rows(dst, res, has_res, acc, a0, offs, 0, o0, nv, nk, dk, code, alpha, beta)


@njit(inline="always")
def store_rows(dst, res, has_res, acc, a0, offs, s0, o0, nv, nk, dk, code, alpha, beta):
    """store_block with the offsets of the block at offs[s0:s0 + nv]: a kernel that keeps every
    position's offset in one array passes it whole (a slice per block would cost numba two atomic
    reference-count updates, as much as a K = 16 reduction of a thin layer)."""
    if code > 2:
        act_block(dst, res, has_res, acc, a0, offs, s0, o0, nv, nk, dk, code, alpha, beta)
        return
    # one 16-lane vector per (position, block): _nb.store16 (numba runs no SLP vectorizer, and
    # the lanes loops were left scalar: dst may alias acc or res as far as LLVM knows)
    LN = acc.shape[1]
    for r in range(nv):
        for k in range(nk):
            du = np.uint64(o0 + offs[s0 + r] + k * dk)
            store16(dst, du, acc, (a0 + r) * LN + 16 * k, res, du, has_res, code, alpha, beta)


@njit(nogil=True, cache=True, fastmath=FAST)
def act_span(f, lo, hi, code, alpha, beta):
    """f[lo:hi] = act(f[lo:hi]) in place (f 1-D float32; hi - lo a multiple of 16 when code is 1 or 9):
    activations.apply_span, but ReLU and leaky ReLU as act16 vectors: apply_span's in-place loop for them
    compiles to masked stores on AVX2, microcoded on AMD Zen (leaky ReLU over 401K floats, one Zen 3 core:
    ~0.5 ns a value, 8x the loop of the other arrays' form; tests/test_register_tiles.py). act_block's
    activation, the assembly strips' for the codes past clip (k1x1._k1x1_strips) and the deferred passes of
    the conv kernels' chunks (k1x1._k1x1, direct._direct_rows2, stem._stem_rows)."""
    if code == 1 or code == 9:
        for i in range(lo, hi, 16):
            act16(f, i, f, i, False, code, alpha, beta)
    else:
        apply_span(f, lo, hi, code, alpha, beta)


@njit(nogil=True, cache=True, fastmath=FAST)
def act_block(dst, res, has_res, acc, a0, offs, s0, o0, nv, nk, dk, code, alpha, beta):
    """store_rows for the activations other than identity, ReLU and clip, called (not inlined) so
    that their code (exp, erf, tanh) stays out of the kernels' loops: the residual added into the
    register block (acc rows [a0, a0 + nv), as 16-lane vectors), the activation over those rows in
    place (activations.apply_span, the loop depthwise and the element-wise ops run: one vectorized
    loop per code), then the vector stores. Every lane of a row is activated, also the blocks
    k >= nk that are not stored; acc's rows [a0, a0 + nv) come back overwritten (every caller's
    register block is scratch, rewritten for its next tile)."""
    LN = acc.shape[1]
    af = acc.reshape(acc.size)
    if has_res:
        for r in range(nv):
            for k in range(nk):
                i = (a0 + r) * LN + 16 * k
                store16(af, i, af, i, res, np.uint64(o0 + offs[s0 + r] + k * dk), True, 0, alpha, beta)
    act_span(af, a0 * LN, (a0 + nv) * LN, code, alpha, beta)
    for r in range(nv):
        for k in range(nk):
            du = np.uint64(o0 + offs[s0 + r] + k * dk)
            store16(dst, du, af, (a0 + r) * LN + 16 * k, res, du, False, 0, alpha, beta)


@njit(nogil=True, cache=True, fastmath=FAST)
def epilogue_rows(o, bias, res, has_res, code, alpha, beta):
    """o (C, L) block, bias (C,), res (C, L) or EMPTY2; in place: o = act(o + bias[c] (+ res))."""
    C, L = o.shape
    for c in range(C):
        b = bias[c]
        if has_res:
            if code == 1:
                for i in range(L):
                    o[c, i] = max(o[c, i] + b + res[c, i], np.float32(0.0))
            else:
                for i in range(L):
                    o[c, i] = o[c, i] + b + res[c, i]
        elif code == 1:
            for i in range(L):
                o[c, i] = max(o[c, i] + b, np.float32(0.0))
        else:
            for i in range(L):
                o[c, i] = o[c, i] + b
        if code > 1:
            for i in range(L):
                o[c, i] = apply_scalar(code, o[c, i], alpha, beta)


def bias_or_zeros(b, n: int) -> np.ndarray:
    if b is None:
        return np.zeros(n, np.float32)
    b = np.asarray(b, np.float32).reshape(-1)
    if b.shape != (n,):
        raise ValueError(f"conv bias has shape {b.shape}, expected ({n},)")
    return np.ascontiguousarray(b)


RB_OFFSETS = np.arange(16, dtype=np.int64) * 16  # offs for a register block of consecutive positions
