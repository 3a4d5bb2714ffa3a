"""Training backward of the element-wise and reduction ops that have no fused training kernel: binary ops
with NumPy broadcasting, mean / sum over axes, PReLU. Plain numpy in the logical (NCHW) layout; the training
schedule converts its CNHW activations to views in that layout (training/schedule.py). Activations:
`activation_backward` (activations.grad_span's float32 loops, threaded; `activations.derivative` for the
other codes).

Gradients follow PyTorch autograd's formulas (tools/autograd/derivatives.yaml), so a tie or a kink takes the
same side: maximum / minimum split the gradient in halves where the operands are equal; div's divisor gets
-dy a / b^2; PReLU's slope gets dy x where x <= 0.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from . import activations as A
from . import reference as ref
from .conv._nb import atomic_add
from .threads import nthreads, pool_region


def sum_to(g: np.ndarray, shape) -> np.ndarray:
    """The gradient of a broadcast: g summed over the axes `shape` was broadcast along (leading axes it lacks,
    axes where it has size 1), in shape `shape`."""
    shape = tuple(shape)
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, s in enumerate(shape) if s == 1 and g.shape[i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return np.ascontiguousarray(g).reshape(shape)


def binary_backward(kind: str, dy: np.ndarray, a: np.ndarray, b: np.ndarray):
    """(da, db) of y = a (kind) b with broadcasting, each in its operand's shape."""
    if kind == "add":
        ga, gb = dy, dy
    elif kind == "sub":
        ga, gb = dy, -dy
    elif kind == "mul":
        ga, gb = dy * b, dy * a
    elif kind == "div":
        ga = dy / b
        gb = -dy * a / (b * b)
    elif kind == "atan2":             # d/da atan2(a, b) = b / (a^2 + b^2), d/db = -a / (a^2 + b^2) (NaN at 0, 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            r = a * a + b * b
            ga, gb = dy * b / r, -dy * a / r
    elif kind in ("maximum", "minimum"):
        half = np.where(a == b, dy * np.float32(0.5), dy)
        wins = a > b if kind == "maximum" else a < b
        loses = a < b if kind == "maximum" else a > b
        ga = np.where(loses, 0, half)
        gb = np.where(wins, 0, half)
    else:
        raise ValueError(f"binary op {kind!r} has no backward; expected one of {', '.join(ref._BINARY)}")
    dt = dy.dtype
    return sum_to(np.asarray(ga, dt), a.shape), sum_to(np.asarray(gb, dt), b.shape)


def reduce_backward(kind: str, dy: np.ndarray, x_shape, axes, keepdim: bool) -> np.ndarray:
    """dx of y = mean / sum of x over `axes`: dy spread back over the reduced axes (mean: divided by their
    size)."""
    x_shape = tuple(x_shape)
    axes = tuple(a % len(x_shape) for a in axes)
    g = dy.reshape(ref._reduced_shape(x_shape, axes, True))
    if kind == "mean":
        g = g / np.asarray(np.prod([x_shape[a] for a in axes]), dy.dtype)
    elif kind != "sum":
        raise ValueError(f"reduction {kind!r} has no backward; expected mean or sum")
    return np.ascontiguousarray(np.broadcast_to(g, x_shape))


def prelu_backward(dy: np.ndarray, x: np.ndarray, slope: np.ndarray):
    """(dx, dslope) of PReLU: dx = dy where x > 0 else slope[c] dy; dslope[c] = sum of dy x where x <= 0
    (slope (C,) over axis 1, or (1,) shared)."""
    shape = (1, -1) + (1,) * (x.ndim - 2) if x.ndim >= 2 and slope.size > 1 else (1,) * x.ndim
    s = slope.reshape(shape)
    pos = x > 0
    dx = np.where(pos, dy, s * dy).astype(dy.dtype)
    contrib = np.where(pos, 0, dy * x)
    ds = contrib.sum(axis=tuple(i for i in range(x.ndim) if not (i == 1 and slope.size > 1)))
    return dx, np.asarray(ds, dy.dtype).reshape(slope.shape)


def layer_norm_backward(dy: np.ndarray, x: np.ndarray, gamma: np.ndarray, axis: int, eps: float):
    """(dx, dgamma, dbeta) of y = gamma * (x - mean) / sqrt(var + eps) + beta over axes [axis, rank) (biased
    variance; float64 inside): dx = rstd (g - mean(g) - xhat mean(g xhat)) with g = dy gamma."""
    axis %= x.ndim
    axes = tuple(range(axis, x.ndim))
    lead = tuple(range(axis))
    xa = x.astype(np.float64)
    mu = xa.mean(axis=axes, keepdims=True)
    xc = xa - mu
    rstd = 1.0 / np.sqrt((xc * xc).mean(axis=axes, keepdims=True) + eps)
    xhat = xc * rstd
    d = dy.astype(np.float64)
    g = d * gamma.astype(np.float64)
    dx = rstd * (g - g.mean(axis=axes, keepdims=True) - xhat * (g * xhat).mean(axis=axes, keepdims=True))
    dgamma = (d * xhat).sum(axis=lead) if lead else d * xhat
    dbeta = d.sum(axis=lead) if lead else d
    return dx.astype(dy.dtype), dgamma.astype(dy.dtype), dbeta.astype(dy.dtype)


def channel_norm_backward(dy: np.ndarray, x: np.ndarray, gamma: np.ndarray, eps: float, mode: str):
    """(dx, dgamma, dbeta) of ref.channel_norm over axis 1 of (N, C, ...), float64 inside. "layer": layer norm over
    the channels at each position (layer_norm_backward on the channels-last view); "l2": y = x / (n + eps) and
    "l2_clamp" (F.normalize): y = x / max(n, eps), n = ||x||_2 over the channels, then gamma[c] * y + beta[c]:
    dx = g / d - x (g . x) / (d^2 n) where the norm is live (l2: always; l2_clamp: n > eps, else g / eps),
    g = dy gamma, d the denominator; at n = 0 the second term is 0 (PyTorch's norm backward masks it)."""
    lead = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    if mode == "layer":
        dx, dg, db = layer_norm_backward(np.moveaxis(dy, 1, -1), np.moveaxis(x, 1, -1), gamma, -1, eps)
        return np.ascontiguousarray(np.moveaxis(dx, -1, 1)), dg, db
    xa, d = x.astype(np.float64), dy.astype(np.float64)
    n = np.sqrt((xa * xa).sum(axis=1, keepdims=True))
    den = n + eps if mode == "l2" else np.maximum(n, eps)
    live = n > 0 if mode == "l2" else n > eps
    g = d * gamma.astype(np.float64).reshape(shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        dx = g / den - np.where(live, xa * (g * xa).sum(axis=1, keepdims=True) / (den * den * n), 0.0)
        y = xa / den
    return dx.astype(dy.dtype), (d * y).sum(axis=lead).astype(dy.dtype), d.sum(axis=lead).astype(dy.dtype)


def local_response_norm_backward(dy: np.ndarray, x: np.ndarray, size: int, alpha: float, beta: float,
                                 k: float) -> np.ndarray:
    """dx of ref.local_response_norm (PyTorch's): y_c = x_c s_c^-beta, s_c = k + alpha / size * (sum of x^2 over the
    window [c - size // 2, c + (size - 1) // 2]); so dx_j = dy_j s_j^-beta - 2 alpha beta / size * x_j * (sum of
    dy_c x_c s_c^(-beta - 1) over the c whose window holds j: [j - (size - 1) // 2, j + size // 2]). Float64."""
    xa, d = x.astype(np.float64), dy.astype(np.float64)
    lo, hi = size // 2, (size - 1) // 2
    s = k + alpha / size * ref.channel_window_sum(xa * xa, lo, hi)
    t = d * xa * s ** (-beta - 1)
    dx = d * s ** -beta - (2 * alpha * beta / size) * xa * ref.channel_window_sum(t, hi, lo)
    return dx.astype(dy.dtype)


CHUNK = 1 << 16      # values a task


@nb.njit(nogil=True, cache=True)
def _act_grad_seq(counter, tid, out, dy, x, code, a, b):
    n = out.size
    while True:
        i0 = atomic_add(counter, 0, 1) * CHUNK
        if i0 >= n:
            return
        i1 = min(n, i0 + CHUNK)
        A.grad_span(out[i0:i1], dy[i0:i1], x[i0:i1], code, a, b)


# activations whose derivative is infinite somewhere (at 0, at a domain's edge): 0 * inf there is NaN, where dy is 0
# the gradient is 0
_SINGULAR = frozenset({"sqrt", "rsqrt", "log", "log2", "log10", "pow", "tan", "asin", "acos", "acosh", "atanh"})


def activation_backward(act, dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    """dy * act'(x), act = (name, alpha, beta): float32 codes in activations.GRAD_CODES on the step's threads
    (chunks of CHUNK values, any layout: element-wise), the rest `activations.derivative`.

    Where an activation's derivative is infinite (sqrt, rsqrt, log, a power at 0) and dy is 0, dx is 0, not
    0 * inf = NaN: a position no gradient reaches (F.normalize's norm under its clamp_min(eps), a branch
    torch.where did not take) gets none (PyTorch's autograd gives NaN for the explicit expression there)."""
    name, alpha, beta = act
    code = A.ACTIVATIONS[name][0]
    if name in _SINGULAR:
        dx = A.derivative(name, dy, x, alpha, beta)
        return np.where(dy == 0, np.zeros((), dx.dtype), dx)
    if code not in A.GRAD_CODES or dy.dtype != np.float32 or x.dtype != np.float32:
        return A.derivative(name, dy, x, alpha, beta)
    out = np.empty_like(dy)
    o, d, v = out.reshape(-1), np.ascontiguousarray(dy).reshape(-1), np.ascontiguousarray(x).reshape(-1)
    pool_region(_act_grad_seq, nthreads(), -(-o.size // CHUNK), o, d, v, code, np.float32(alpha), np.float32(beta))
    return out


def max_backward(dy: np.ndarray, x: np.ndarray, y: np.ndarray, axes, keepdim: bool) -> np.ndarray:
    """dx of y = max of x over `axes`: torch.amax's rule, dy shared evenly among the positions equal to the
    maximum (a NaN maximum: the NaN positions)."""
    axes = tuple(a % x.ndim for a in axes)
    keep = ref._reduced_shape(x.shape, axes, True)
    yk, gk = y.reshape(keep), dy.reshape(keep)
    hit = (x == yk) | (np.isnan(x) & np.isnan(yk))
    count = hit.sum(axis=axes, keepdims=True).astype(dy.dtype)
    return np.where(hit, gk / count, np.zeros((), dy.dtype)).astype(dy.dtype)


def where_backward(dy: np.ndarray, cond: np.ndarray, a_shape, b_shape):
    """(da, db) of y = where(cond, a, b): dy where the condition holds to a, elsewhere to b, summed back to each
    operand's shape (the comparison's operands get none: it is not differentiable)."""
    z = np.zeros((), dy.dtype)
    return sum_to(np.where(cond, dy, z), a_shape), sum_to(np.where(cond, z, dy), b_shape)


def pad_backward(dy: np.ndarray, x_shape, pads, mode: str) -> np.ndarray:
    """dx of y = pad(x): constant padding crops dy; replicate / reflect add each padded position's gradient to
    the input position it copies (axis by axis)."""
    g = dy
    for ax, n in enumerate(x_shape):
        lo = pads[2 * ax]
        m = g.shape[ax]
        if m == n:
            continue
        if mode == "constant":
            g = np.take(g, np.arange(lo, lo + n), axis=ax)
            continue
        src = np.arange(m) - lo                               # output position -> input position it copies
        if mode == "replicate":
            src = np.clip(src, 0, n - 1)
        else:                                                 # reflect: -1 -> 1, n -> n - 2
            src = np.abs(src)
            src = np.where(src > n - 1, 2 * (n - 1) - src, src)
        out_shape = list(g.shape)
        out_shape[ax] = n
        acc = np.zeros(out_shape, g.dtype)
        moved = np.moveaxis(g, ax, 0)
        np.add.at(np.moveaxis(acc, ax, 0), src, moved)
        g = acc
    return np.ascontiguousarray(g)


def matmul_backward(dy: np.ndarray, a: np.ndarray, b: np.ndarray):
    """(da, db) of y = a @ b ((..., M, K) @ (..., K, N), batch axes broadcast): dy @ b^T and a^T @ dy, summed back
    over the broadcast batch axes."""
    da = np.matmul(dy, np.swapaxes(b, -1, -2))
    db = np.matmul(np.swapaxes(a, -1, -2), dy)
    return sum_to(da.astype(dy.dtype), a.shape), sum_to(db.astype(dy.dtype), b.shape)


def softmax_backward(dy: np.ndarray, y: np.ndarray, axis: int, scale: float = 1.0) -> np.ndarray:
    """dx of y = softmax(x * scale) along axis: scale * y * (dy - sum(dy * y)) (float64 sums)."""
    d, yy = dy.astype(np.float64), y.astype(np.float64)
    s = (d * yy).sum(axis=axis, keepdims=True)
    return (scale * yy * (d - s)).astype(dy.dtype)


def take_backward(dy: np.ndarray, x_shape, indices: np.ndarray, axis: int, negative: bool = True,
                  padding_idx: int | None = None, scale_grad_by_freq: bool = False) -> np.ndarray:
    """The gradient of take's table (ref.take): dy's slice for each index added into that index's slice along
    `axis` (np.add.at, float64), in dy's dtype; nn.Embedding's padding_idx row gets none, and with
    scale_grad_by_freq a row's sum is divided by how many times the indices read it (PyTorch's). dy: x_shape[:axis]
    + indices.shape + x_shape[axis + 1:]."""
    n = x_shape[axis]
    i = np.asarray(indices, np.float64).astype(np.int64).reshape(-1)
    i = np.where(i < 0, i + n, i) if negative else i
    pre, post = tuple(x_shape[:axis]), tuple(x_shape[axis + 1:])
    g = np.asarray(dy, np.float64).reshape(pre + (i.size,) + post)
    dx = np.zeros(tuple(x_shape))
    np.add.at(np.moveaxis(dx, axis, 0), i, np.moveaxis(g, axis, 0))      # (N, pre, post) += (K, pre, post)
    if scale_grad_by_freq:
        count = np.bincount(i, minlength=n).astype(np.float64)
        np.moveaxis(dx, axis, -1)[...] /= np.maximum(count, 1.0)
    if padding_idx is not None:
        np.moveaxis(dx, axis, 0)[padding_idx] = 0.0
    return dx.astype(dy.dtype)
