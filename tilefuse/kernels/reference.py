"""Reference kernels: plain numpy, the executable spec of every op.

Each kernel is a free function taking and returning numpy arrays (NCHW layout). They favour
clarity over speed, but stay vectorized (im2col + matmul for convolution) so the reference
evaluator can run the model zoo. Every fast kernel in tilefuse is tested against these, and
these are tested against PyTorch (tests/test_reference_ops.py).

Conventions:
  padding  is always (top, bottom, left, right) here; the IR normalizes user input.
  stride, dilation, kernel_size are (h, w) pairs.
  Accumulation happens in float32 (float64 for float64 inputs); results are cast back to the
  input dtype.
"""
from __future__ import annotations

import numpy as np


def _acc_dtype(dtype) -> np.dtype:
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def pad_nchw(x: np.ndarray, padding, value=0.0) -> np.ndarray:
    """Pad H and W of an NCHW array by (top, bottom, left, right) with a constant."""
    t, b, l, r = padding
    if t == b == l == r == 0:
        return x
    return np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)), mode="constant", constant_values=value)


def windows(x: np.ndarray, kernel_size, stride, dilation, out_hw) -> np.ndarray:
    """Strided view of the sliding windows of an already padded NCHW array.

    (N, C, Hp, Wp) -> (N, C, Ho, Wo, kh, kw), no copy.
    """
    n, c, _, _ = x.shape
    kh, kw = kernel_size
    sh, sw = stride
    dh, dw = dilation
    ho, wo = out_hw
    s = x.strides
    return np.lib.stride_tricks.as_strided(
        x,
        shape=(n, c, ho, wo, kh, kw),
        strides=(s[0], s[1], s[2] * sh, s[3] * sw, s[2] * dh, s[3] * dw),
        writeable=False,
    )


def conv_out_size(size: int, k: int, stride: int, pad_lo: int, pad_hi: int, dilation: int) -> int:
    return (size + pad_lo + pad_hi - dilation * (k - 1) - 1) // stride + 1


def conv2d(x, w, b=None, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1,
           residual=None, relu=False):
    """2-D cross-correlation, PyTorch Conv2d semantics, with an optional fused epilogue.

    x: (N, C, H, W), w: (O, C/groups, kh, kw), b: (O,) or None, residual: (N, O, Ho, Wo) or None.
    y = conv(x, w) + b (+ residual), then max(y, 0) if relu.
    """
    acc = _acc_dtype(x.dtype)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    t, bt, l, r = padding
    ho = conv_out_size(h, kh, stride[0], t, bt, dilation[0])
    wo = conv_out_size(wd, kw, stride[1], l, r, dilation[1])
    xp = pad_nchw(x.astype(acc, copy=False), padding)
    cols = windows(xp, (kh, kw), stride, dilation, (ho, wo))  # (N, C, Ho, Wo, kh, kw)
    og = o // groups
    y = np.empty((n, o, ho, wo), dtype=acc)
    for g in range(groups):
        cg_cols = cols[:, g * cg:(g + 1) * cg]  # (N, Cg, Ho, Wo, kh, kw)
        # (N, Cg, Ho, Wo, kh, kw) -> (N, Ho, Wo, Cg, kh, kw) -> (N*Ho*Wo, Cg*kh*kw)
        a = cg_cols.transpose(0, 2, 3, 1, 4, 5).reshape(n * ho * wo, cg * kh * kw)
        wg = w[g * og:(g + 1) * og].astype(acc, copy=False).reshape(og, cg * kh * kw)
        # (N*Ho*Wo, K) @ (K, Og) -> (N, Ho, Wo, Og) -> (N, Og, Ho, Wo)
        y[:, g * og:(g + 1) * og] = (a @ wg.T).reshape(n, ho, wo, og).transpose(0, 3, 1, 2)
    if b is not None:
        y += b.astype(acc, copy=False).reshape(1, o, 1, 1)
    if residual is not None:
        y += residual.astype(acc, copy=False)
    if relu:
        np.maximum(y, 0, out=y)
    return y.astype(x.dtype, copy=False)


def batch_norm(x, gamma, beta, mean, var, eps=1e-5):
    """Inference batch norm over channel axis 1: (x - mean) / sqrt(var + eps) * gamma + beta."""
    acc = _acc_dtype(x.dtype)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv = (gamma.astype(acc) / np.sqrt(var.astype(acc) + acc.type(eps))).reshape(shape)
    y = (x.astype(acc) - mean.astype(acc).reshape(shape)) * inv + beta.astype(acc).reshape(shape)
    return y.astype(x.dtype, copy=False)


def scale(x, alpha, beta):
    """Per-channel affine map y = alpha[c] * x + beta[c] over channel axis 1."""
    acc = _acc_dtype(x.dtype)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = x.astype(acc) * alpha.astype(acc).reshape(shape) + beta.astype(acc).reshape(shape)
    return y.astype(x.dtype, copy=False)


def relu(x):
    return np.maximum(x, 0).astype(x.dtype, copy=False)


def add(a, b, relu=False):
    y = a + b
    if relu:
        np.maximum(y, 0, out=y)
    return y


def _pool_out(size, k, s, lo, hi, ceil_mode):
    span = size + lo + hi - k
    out = (-(-span // s) if ceil_mode else span // s) + 1
    # PyTorch rule: the last window must start inside the image or the left padding.
    if ceil_mode and (out - 1) * s >= size + lo:
        out -= 1
    return out


def pool_out_size(size, k, s, lo, hi, ceil_mode=False):
    return _pool_out(size, k, s, lo, hi, ceil_mode)


def max_pool(x, kernel_size, stride, padding=(0, 0, 0, 0), dilation=(1, 1), ceil_mode=False):
    """Max pooling, PyTorch MaxPool2d semantics (padding counts as -inf)."""
    n, c, h, w = x.shape
    t, b, l, r = padding
    ho = _pool_out(h, dilation[0] * (kernel_size[0] - 1) + 1, stride[0], t, b, ceil_mode)
    wo = _pool_out(w, dilation[1] * (kernel_size[1] - 1) + 1, stride[1], l, r, ceil_mode)
    # extra bottom/right padding so ceil-mode windows stay inside the array
    eb = max(0, (ho - 1) * stride[0] + dilation[0] * (kernel_size[0] - 1) + 1 - (h + t + b))
    er = max(0, (wo - 1) * stride[1] + dilation[1] * (kernel_size[1] - 1) + 1 - (w + l + r))
    xp = pad_nchw(x, (t, b + eb, l, r + er), value=-np.inf)
    cols = windows(xp, kernel_size, stride, dilation, (ho, wo))  # (N, C, Ho, Wo, kh, kw)
    return cols.max(axis=(4, 5)).astype(x.dtype, copy=False)


def avg_pool(x, kernel_size, stride, padding=(0, 0, 0, 0), ceil_mode=False, count_include_pad=True):
    """Average pooling, PyTorch AvgPool2d semantics (divisor_override not supported)."""
    acc = _acc_dtype(x.dtype)
    n, c, h, w = x.shape
    t, b, l, r = padding
    kh, kw = kernel_size
    ho = _pool_out(h, kh, stride[0], t, b, ceil_mode)
    wo = _pool_out(w, kw, stride[1], l, r, ceil_mode)
    eb = max(0, (ho - 1) * stride[0] + kh - (h + t + b))
    er = max(0, (wo - 1) * stride[1] + kw - (w + l + r))
    xp = pad_nchw(x.astype(acc), (t, b + eb, l, r + er))
    ones = pad_nchw(np.ones((1, 1, h, w), dtype=acc), (t, b + eb, l, r + er))
    sums = windows(xp, kernel_size, stride, (1, 1), (ho, wo)).sum(axis=(4, 5))
    if count_include_pad:
        # padded area counts, the ceil-mode overhang beyond the padding does not
        inside = pad_nchw(np.ones((1, 1, h + t + b, w + l + r), dtype=acc), (0, eb, 0, er))
        div = windows(inside, kernel_size, stride, (1, 1), (ho, wo)).sum(axis=(4, 5))
    else:
        div = windows(ones, kernel_size, stride, (1, 1), (ho, wo)).sum(axis=(4, 5))
    return (sums / div).astype(x.dtype, copy=False)


def global_avg_pool(x):
    """(N, C, H, W) -> (N, C, 1, 1)."""
    acc = _acc_dtype(x.dtype)
    return x.astype(acc).mean(axis=(2, 3), keepdims=True).astype(x.dtype, copy=False)


def linear(x, w, b=None, relu=False):
    """(N, K) @ (M, K)^T + b -> (N, M), PyTorch Linear semantics."""
    acc = _acc_dtype(x.dtype)
    y = x.astype(acc) @ w.astype(acc).T
    if b is not None:
        y += b.astype(acc)
    if relu:
        np.maximum(y, 0, out=y)
    return y.astype(x.dtype, copy=False)


def flatten(x, start_dim=1):
    """(N, C, H, W) -> (N, C*H*W) for start_dim=1."""
    return x.reshape(x.shape[:start_dim] + (-1,))


def softmax(x, axis=1):
    acc = _acc_dtype(x.dtype)
    z = x.astype(acc)
    z = z - z.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype, copy=False)


def local_response_norm(x, size, alpha=1e-4, beta=0.75, k=1.0):
    """PyTorch LocalResponseNorm: b_c = a_c / (k + alpha/size * sum_{c' in window} a_c'^2)^beta.

    The window over channels is [c - size//2, c + (size-1)//2], zero-padded.
    """
    acc = _acc_dtype(x.dtype)
    xa = x.astype(acc)
    sq = xa * xa
    c = x.shape[1]
    lo, hi = size // 2, (size - 1) // 2
    padded = np.concatenate(
        [np.zeros((x.shape[0], lo) + x.shape[2:], acc), sq, np.zeros((x.shape[0], hi) + x.shape[2:], acc)],
        axis=1)
    csum = np.cumsum(padded, axis=1)
    csum = np.concatenate([np.zeros_like(csum[:, :1]), csum], axis=1)
    window = csum[:, size:size + c] - csum[:, 0:c]
    div = (acc.type(k) + acc.type(alpha) / size * window) ** acc.type(beta)
    return (xa / div).astype(x.dtype, copy=False)


def concat(*xs, axis=1):
    return np.concatenate(xs, axis=axis)


def dropout(x, p=0.5):
    """Inference: identity."""
    return x.copy()


def reshape(x, shape):
    return x.reshape(shape)
