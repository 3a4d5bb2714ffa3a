"""Normalization runtime kernels: layer norm over trailing axes, channel norm (LayerNorm2d).

channel_norm normalizes each (n, h, w) position over the C channels of an NCHW tensor (ConvNeXt's
permute -> LayerNorm -> permute, recognized by the compiler as one op): a numba loop per image
that reads channel rows with unit stride, two passes (mean, then the centred variance, as the
reference: no cancellation), accumulating in float32 over C <= a few thousand channels:
within 1e-5 of the float64-accumulating reference; on NCHW16c the same per position over the
lanes in use. layer_norm runs the numpy reference form.
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


@njit(nogil=True, cache=True, fastmath=True)
def _channel_norm_blocked(out, x, gamma, beta, eps, C, n):
    """x, out (N, Cb, H, W, 16), C real channels: normalize each (h, w) over the C lanes in use;
    the padded lanes are written 0."""
    Cb, H, W = x.shape[1], x.shape[2], x.shape[3]
    inv_c = np.float32(1.0) / np.float32(C)
    for h in range(H):
        for w in range(W):
            m = np.float32(0.0)
            for cb in range(Cb):
                for l in range(min(16, C - cb * 16)):
                    m += x[n, cb, h, w, l]
            m *= inv_c
            v = np.float32(0.0)
            for cb in range(Cb):
                for l in range(min(16, C - cb * 16)):
                    d = x[n, cb, h, w, l] - m
                    v += d * d
            r = np.float32(1.0) / np.sqrt(v * inv_c + eps)
            for cb in range(Cb):
                for l in range(16):
                    c = cb * 16 + l
                    out[n, cb, h, w, l] = (x[n, cb, h, w, l] - m) * r * gamma[c] + beta[c] if c < C else 0.0


def channel_norm(out, x, gamma, beta, *, eps, threads=None, layout="nchw", channels=None, **_):
    if layout == "nchwc":
        g, b = np.ascontiguousarray(gamma, np.float32), np.ascontiguousarray(beta, np.float32)
        parallel_for(lambda i: _channel_norm_blocked(out, x, g, b, np.float32(eps), int(channels), i),
                     range(x.shape[0]), threads)
        return
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
BLOCKED = frozenset({"channel_norm"})   # kernels with an NCHW16c form
