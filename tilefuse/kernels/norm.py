"""Normalization runtime kernels: layer norm over trailing axes, channel norm (LayerNorm2d).

channel_norm normalizes each (n, h, w) position over the C channels of an NCHW tensor (ConvNeXt's
permute -> LayerNorm -> permute, recognized by the compiler as one op): a numba loop per image
that reads channel rows with unit stride, two passes (mean, then the centred variance, as the
reference: no cancellation), accumulating in float32 over C <= a few thousand channels:
within 1e-5 of the float64-accumulating reference. layer_norm runs the numpy reference form.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from . import reference as ref
from .threads import parallel_for


@njit(nogil=True, cache=True, fastmath=True)
def _channel_norm_image(out, x, gamma, beta, eps, n):
    """x, out (N, C, S): normalize each column s over C."""
    C, S = x.shape[1], x.shape[2]
    mean = np.zeros(S, np.float32)
    var = np.zeros(S, np.float32)
    for c in range(C):
        for s in range(S):
            mean[s] += x[n, c, s]
    inv_c = np.float32(1.0) / np.float32(C)
    for s in range(S):
        mean[s] *= inv_c
    for c in range(C):
        for s in range(S):
            d = x[n, c, s] - mean[s]
            var[s] += d * d
    for s in range(S):
        var[s] = np.float32(1.0) / np.sqrt(var[s] * inv_c + eps)
    for c in range(C):
        g, b = gamma[c], beta[c]
        for s in range(S):
            out[n, c, s] = (x[n, c, s] - mean[s]) * var[s] * g + b


def channel_norm(out, x, gamma, beta, *, eps, threads=None, **_):
    if out.dtype != np.float32:
        out[...] = ref.channel_norm(x, gamma, beta, eps)
        return
    n, c = x.shape[0], x.shape[1]
    # (N, C, H, W) -> (N, C, H*W)
    x3, o3 = x.reshape(n, c, -1), out.reshape(n, c, -1)
    parallel_for(lambda i: _channel_norm_image(o3, x3, gamma, beta, np.float32(eps), i), range(n), threads)


def layer_norm(out, x, gamma, beta, *, axis=-1, eps=1e-5, **_):
    out[...] = ref.layer_norm(x, gamma, beta, axis, eps)


KERNELS = {"channel_norm": channel_norm, "layer_norm": layer_norm}
THREADED = frozenset({"channel_norm"})
