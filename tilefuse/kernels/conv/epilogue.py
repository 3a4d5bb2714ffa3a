"""The fused conv epilogue, one definition for every conv kernel:  y = act(conv + bias + residual).

`act` is an activation of the shared table `tilefuse.kernels.activations` (identity, relu, clip,
hardswish, sigmoid, silu, gelu, ...), given to the kernels as the triple (code, alpha, beta).
`resolve_act(relu, act)` turns a kernel call's arguments into that triple (`relu=True` is
act relu, kept for the callers that only know ReLU).

Three forms, so that the order (bias, then residual, then the activation) and the activation code
live here only:
  - `store16(dst, d, acc, r, c0, res, rd, has_res, code, alpha, beta)`: the register-blocked
    store of 16 output channels (one AVX-512 vector) of the direct, k1x1, stem and Winograd
    NCHWc kernels; `acc` already holds conv + bias (added as the accumulators leave registers).
  - `epilogue_rows(o, bias, res, has_res, code, alpha, beta)`: rows of a GEMM output block in
    place (gemm1x1 and im2col, NCHW).
  - `activations.apply_scalar(code, v, alpha, beta)`: one value, for the scattering stores
    (NCHW outputs of blocked kernels, the BLAS 1x1 on NCHWc, depthwise).
Identity and ReLU get loops of their own (the branch on `code` is outside the lanes loop, so the
loops vectorize and ReLU's bits are those of the kernels before activations were generalized).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from tilefuse.kernels.activations import ACTIVATIONS, NAMES, apply_scalar, normalize

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
def store16(dst, d, acc, r, c0, res, rd, has_res, code, alpha, beta):
    """dst[d + l] = act(acc[r, c0 + l] (+ res[rd + l])) for the 16 lanes l; dst and res 1-D.

    acc holds conv + bias; the residual is added into acc first (same order as the reference)."""
    if has_res:
        for l in range(16):
            acc[r, c0 + l] += res[rd + l]
    if code == 1:
        for l in range(16):
            dst[d + l] = max(acc[r, c0 + l], np.float32(0.0))
    elif code == 0:
        for l in range(16):
            dst[d + l] = acc[r, c0 + l]
    else:
        for l in range(16):
            dst[d + l] = apply_scalar(code, acc[r, c0 + l], alpha, beta)


@njit(nogil=True, cache=True, fastmath=True)
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
