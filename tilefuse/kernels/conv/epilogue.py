"""Fused conv epilogue on an output block still in cache: y = acc + bias (+ residual), ReLU.

The GEMM-based kernels (gemm1x1, im2col) call `epilogue_rows` on the rows a task has just
produced; direct and Winograd apply the same three steps in registers before the store.
The order is the reference's: bias, then residual, then ReLU.
"""
from __future__ import annotations

import numpy as np
from numba import njit

EMPTY2 = np.zeros((0, 0), np.float32)  # "no residual" placeholder (keeps numba types fixed)


@njit(nogil=True, cache=True, fastmath=True)
def epilogue_rows(o, bias, res, has_res, relu):
    """o (C, L) block, bias (C,), res (C, L) or EMPTY2; in place."""
    C, L = o.shape
    for c in range(C):
        b = bias[c]
        if has_res:
            if relu:
                for i in range(L):
                    o[c, i] = max(o[c, i] + b + res[c, i], 0.0)
            else:
                for i in range(L):
                    o[c, i] = o[c, i] + b + res[c, i]
        elif relu:
            for i in range(L):
                o[c, i] = max(o[c, i] + b, 0.0)
        else:
            for i in range(L):
                o[c, i] = o[c, i] + b


def bias_or_zeros(b, n: int) -> np.ndarray:
    if b is None:
        return np.zeros(n, np.float32)
    b = np.asarray(b, np.float32).reshape(-1)
    if b.shape != (n,):
        raise ValueError(f"conv bias has shape {b.shape}, expected ({n},)")
    return np.ascontiguousarray(b)
