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
           residual=None, relu=False, act=None, input_scale=None):
    """2-D cross-correlation, PyTorch Conv2d semantics, with an optional fused epilogue.

    x: (N, C, H, W), w: (O, C/groups, kh, kw), b: (O,) or None, residual: (N, O, Ho, Wo) or None.
    y = act(conv(x * input_scale, w) + b (+ residual)); relu=True is act ("relu", 0, 0).
    input_scale: (N, C, 1, 1) per-image channel scale of the input (a fused squeeze-excitation).
    """
    if input_scale is not None:
        x = (x.astype(_acc_dtype(x.dtype)) * input_scale.astype(_acc_dtype(x.dtype))).astype(x.dtype)
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
    return apply_act(y, act).astype(x.dtype, copy=False)


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


def squeeze_excitation(x, w1, b1, w2, b2, act, gate):
    """The squeeze-excitation scale of x (N, C, H, W): gate(fc2(act(fc1(mean over H, W of x)))),
    fc1 (R, C, 1, 1) + b1 (R,), fc2 (C, R, 1, 1) + b2 (C,) as 1x1 convs -> (N, C, 1, 1)."""
    s = global_avg_pool(x)
    s = conv2d(s, w1, b1, act=act)
    return conv2d(s, w2, b2, act=gate)


def linear(x, w, b=None, relu=False, act=None):
    """(..., K) @ (M, K)^T + b -> (..., M), PyTorch Linear semantics, then the activation."""
    acc = _acc_dtype(x.dtype)
    y = x.astype(acc) @ w.astype(acc).T
    if b is not None:
        y += b.astype(acc)
    if relu:
        np.maximum(y, 0, out=y)
    return apply_act(y, act).astype(x.dtype, copy=False)


def matmul(a, b):
    """a @ b of two tensors (np.matmul: (..., M, K) @ (..., K, N) -> (..., M, N), the batch axes broadcast),
    accumulated in float32 (float64 for float64) as PyTorch's and ONNX Runtime's GEMMs do."""
    acc = _acc_dtype(a.dtype)
    return np.matmul(a.astype(acc), b.astype(acc)).astype(a.dtype, copy=False)


def flatten(x, start_dim=1):
    """(N, C, H, W) -> (N, C*H*W) for start_dim=1."""
    return x.reshape(x.shape[:start_dim] + (-1,))


def softmax(x, axis=1, scale=1.0):
    """softmax(x * scale) along axis (x * scale rounded to the accumulation type first, as a multiply before it)."""
    acc = _acc_dtype(x.dtype)
    z = x.astype(acc) * acc.type(scale) if scale != 1.0 else x.astype(acc)
    z = z - z.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype, copy=False)


def channel_window_sum(a: np.ndarray, before: int, after: int) -> np.ndarray:
    """out[:, c] = sum of a[:, c - before .. c + after] over axis 1 (zeros outside), in a's dtype, term by term
    in channel order (LRN's window and its backward's). A difference of running sums lost a small window next
    to a large one: float32 sums of 4e5 are 0.03 apart, a window of 7.0 came out 0.8% off (tests/onnx_graphs.py
    seed 77014535)."""
    c = a.shape[1]
    out = np.zeros_like(a)
    for d in range(max(-before, 1 - c), min(after, c - 1) + 1):   # channel c + d into channel c's, both present
        out[:, max(0, -d):c - max(0, d)] += a[:, max(0, d):c - max(0, -d)]
    return out


def local_response_norm(x, size, alpha=1e-4, beta=0.75, k=1.0):
    """PyTorch LocalResponseNorm: b_c = a_c / (k + alpha/size * sum_{c' in window} a_c'^2)^beta.

    The window over channels is [c - size//2, c + (size-1)//2], zero-padded (`channel_window_sum`).
    """
    acc = _acc_dtype(x.dtype)
    xa = x.astype(acc)
    window = channel_window_sum(xa * xa, size // 2, (size - 1) // 2)
    div = (acc.type(k) + acc.type(alpha) / size * window) ** acc.type(beta)
    return (xa / div).astype(x.dtype, copy=False)


def concat(*xs, axis=1):
    return np.concatenate(xs, axis=axis)


def dropout(x, p=0.5):
    """Inference: identity."""
    return x.copy()


def reshape(x, shape):
    return x.reshape(shape)


# ----------------------------------------------------------------------------- modern CNN ops
# (issue 9) Each is PyTorch's semantics unless it says otherwise; tests/test_ops_modern.py
# compares every one with torch on odd shapes.

def apply_act(y, act):
    """The activation (name, alpha, beta) of kernels/activations.py on y (None or identity: y)."""
    if act is None or act[0] == "identity":
        return y
    from .activations import reference as act_ref
    return act_ref(act[0], y, act[1], act[2])


def activation(x, act):
    """y = act(x), act = (name, alpha, beta) from the shared table (kernels/activations.py)."""
    return apply_act(x, act).astype(x.dtype, copy=False)


def prelu(x, slope):
    """PReLU: x if x > 0 else slope[c] * x; slope (C,) over axis 1, or (1,) shared."""
    acc = _acc_dtype(x.dtype)
    s = slope.astype(acc).reshape((1, -1) + (1,) * (x.ndim - 2)) if x.ndim >= 2 else slope.astype(acc)
    xa = x.astype(acc)
    return np.where(xa > 0, xa, s * xa).astype(x.dtype, copy=False)


_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "atan2": np.arctan2,
           "maximum": np.maximum,
           "minimum": np.minimum}     # np.maximum / minimum: NaN in either operand gives NaN, as torch's


def binary(kind, a, b, relu=False, act=None):
    """Element-wise add / sub / mul / div / maximum / minimum / atan2 with NumPy broadcasting, then the
    activation."""
    acc = _acc_dtype(a.dtype) if kind != "atan2" else np.dtype(np.float64)   # (NumPy's float32 arctan2: 5e-6 off)
    y = _BINARY[kind](a.astype(acc), b.astype(acc))
    if relu:
        np.maximum(y, 0, out=y)
    return apply_act(y, act).astype(a.dtype, copy=False)


COMPARISONS = ("gt", "ge", "lt", "le", "eq", "ne")
_CMP = {"gt": np.greater, "ge": np.greater_equal, "lt": np.less, "le": np.less_equal, "eq": np.equal,
        "ne": np.not_equal}


def where(l, r, a, b, cmp="gt"):
    """a where (l cmp r) else b, all four broadcast (NumPy rules); NaN compares false but for ne."""
    with np.errstate(invalid="ignore"):
        return np.where(_CMP[cmp](l, r), a, b).astype(a.dtype, copy=False)


def reduce(kind, x, axes, keepdim=False):
    """mean / sum / max over `axes` (accumulated in float32, float64 for float64; max: NaN wins, as in PyTorch)."""
    acc = _acc_dtype(x.dtype)
    f = {"mean": np.mean, "sum": np.sum, "max": np.max}[kind]
    return f(x.astype(acc), axis=tuple(axes), keepdims=keepdim).astype(x.dtype, copy=False).reshape(
        _reduced_shape(x.shape, axes, keepdim))


def argmax(x, axis, keepdim=False, largest=True, select_last=False):
    """The index along `axis` of the largest value (largest=False: the smallest), in x's dtype; ties: the first
    (select_last: the last); a NaN counts as the extreme (the first NaN, as torch.argmax / argmin). Written as a
    mask of the positions equal to the extreme, then its first True."""
    v = np.moveaxis(np.asarray(x), axis, -1)
    if select_last:
        v = v[..., ::-1]
    nan = np.isnan(v)
    with np.errstate(invalid="ignore"):
        ext = (np.max if largest else np.min)(v, axis=-1, keepdims=True) if v.shape[-1] else v[..., :0]
        hit = np.where(nan.any(axis=-1, keepdims=True), nan, v == ext)
    idx = np.argmax(hit, axis=-1)                      # the first True
    if select_last:
        idx = v.shape[-1] - 1 - idx
    out = idx.astype(x.dtype)
    return np.expand_dims(out, axis) if keepdim else out


def cumsum(x, axis, exclusive=False, reverse=False):
    """The running sum along `axis` (exclusive: of the values before each position; reverse: from the end),
    accumulated in float64 and rounded once to x's dtype (an integer x: in its own dtype, ONNX's folded CumSum).

        reverse: flip, cumsum, flip;  exclusive: [0, c_0, ..., c_{n-2}] of the inclusive c"""
    x = np.asarray(x)
    v = x.astype(np.float64) if x.dtype.kind == "f" else x
    axis = axis % v.ndim
    if reverse:
        v = np.flip(v, axis)
    c = np.cumsum(v, axis=axis)
    if exclusive:
        c = np.concatenate([np.zeros_like(np.take(c, [0], axis=axis)),
                            np.take(c, range(c.shape[axis] - 1), axis=axis)], axis=axis)
    if reverse:
        c = np.flip(c, axis)
    return np.ascontiguousarray(c).astype(x.dtype)


def _reduced_shape(shape, axes, keepdim):
    return tuple(1 if i in axes else d for i, d in enumerate(shape) if keepdim or i not in axes)


def permute(x, perm):
    return np.ascontiguousarray(np.transpose(x, perm))


def channel_shuffle(xs, groups, start=0, stop=None):
    """(N, C, H, W) inputs, concatenated along channels, then shuffled: channel c of the result is
    concatenated channel (c % g) * (C / g) + c // g (torch.nn.ChannelShuffle); channels [start, stop)
    of that."""
    x = np.concatenate(xs, axis=1)
    n, c, h, w = x.shape
    y = x.reshape(n, groups, c // groups, h, w).transpose(0, 2, 1, 3, 4).reshape(n, c, h, w)
    return np.ascontiguousarray(y[:, start:stop])


def take_check(idx, n: int, negative: bool):
    """(position, value) of the first index that is not an integer in [-n, n) ([0, n) without negative), or None."""
    f = np.asarray(idx, np.float64).reshape(-1)
    lo = -n if negative else 0
    bad = ~((f == np.floor(f)) & (f >= lo) & (f < n))       # NaN fails every comparison
    if bad.any():
        k = int(np.argmax(bad))
        return k, float(f[k])
    return None


def take(x, indices, axis=0, negative=True, padding_idx=None, scale_grad_by_freq=False):
    """x's slices along `axis` at run-time indices (integer values held in a float tensor: an integer input's, see
    ir/node.py check_inputs): np.take, (x.shape[:axis] + indices.shape + x.shape[axis + 1:]); nn.Embedding,
    `table[t]`, ONNX Gather at computed indices. An index that is not an integer in range is a ValueError naming
    it (PyTorch and ONNX Runtime refuse it too): never a wrong read. padding_idx, scale_grad_by_freq: nn.Embedding's,
    which change only the training gradient (kernels/train_elementwise.py take_backward)."""
    n = x.shape[axis]
    bad = take_check(indices, n, negative)
    if bad is not None:
        lo = -n if negative else 0
        raise ValueError(f"index {bad[1]:g} (element {bad[0]} of the indices) is out of range: expected an integer "
                         f"in [{lo}, {n}) for axis {axis} of {tuple(x.shape)}")
    i = np.asarray(indices, np.float64).astype(np.int64)
    return np.ascontiguousarray(np.take(x, np.where(i < 0, i + n, i), axis=axis))


def pixel_shuffle(x, factor, mode="crd", inverse=False):
    """PixelShuffle / DepthToSpace by r = factor, (N, C, H, W) -> (N, C/r^2, H r, W r): input channel
    c*r*r + i*r + j ("crd": PyTorch's, ONNX's CRD; "dcr": (i*r + j)*C/r^2 + c, ONNX's default) goes to
    row h*r + i, column w*r + j of output channel c. inverse: PixelUnshuffle / SpaceToDepth, its exact
    inverse (N, C, H, W) -> (N, C r^2, H/r, W/r) ("crd": torch.pixel_unshuffle, "dcr": SpaceToDepth)."""
    n, c, h, w = x.shape
    r = factor
    if not inverse:
        co = c // (r * r)
        if mode == "crd":   # (N, C', i, j, H, W) -> (N, C', H, i, W, j)
            v = x.reshape(n, co, r, r, h, w).transpose(0, 1, 4, 2, 5, 3)
        else:               # (N, i, j, C', H, W) -> (N, C', H, i, W, j)
            v = x.reshape(n, r, r, co, h, w).transpose(0, 3, 4, 1, 5, 2)
        return np.ascontiguousarray(v).reshape(n, co, h * r, w * r)
    v = x.reshape(n, c, h // r, r, w // r, r)                    # (N, C, H', i, W', j)
    v = v.transpose(0, 1, 3, 5, 2, 4) if mode == "crd" else v.transpose(0, 3, 5, 1, 2, 4)
    return np.ascontiguousarray(v).reshape(n, c * r * r, h // r, w // r)


def slice_axis(x, axis, start, stop, step):
    """x[..., start:stop:step, ...] along `axis` (Python slice rules; a negative step reverses)."""
    idx = [slice(None)] * x.ndim
    idx[axis] = slice(start, stop, step)
    return np.ascontiguousarray(x[tuple(idx)])


def pad(x, pads, mode="constant", value=0.0):
    """pads = (before_0, after_0, before_1, after_1, ...) for every axis; mode constant / reflect
    (mirror without repeating the edge) / replicate (repeat the edge)."""
    width = [(pads[2 * i], pads[2 * i + 1]) for i in range(x.ndim)]
    if mode == "constant":
        return np.pad(x, width, mode="constant", constant_values=x.dtype.type(value))
    return np.pad(x, width, mode="reflect" if mode == "reflect" else "edge")


def conv_transpose_out_size(size, k, stride, pad_lo, pad_hi, dilation, output_padding):
    return (size - 1) * stride - pad_lo - pad_hi + dilation * (k - 1) + output_padding + 1


def conv_transpose2d(x, w, b=None, stride=(1, 1), padding=(0, 0, 0, 0), output_padding=(0, 0),
                     dilation=(1, 1), groups=1, act=None):
    """PyTorch ConvTranspose2d: x (N, Ci, H, W), w (Ci, Co/groups, kh, kw) -> (N, Co, Ho, Wo),
    Ho = (H-1)*s - pad_top - pad_bottom + d*(kh-1) + output_padding + 1.

    Every input pixel scatters x[n, ci, i, j] * w[ci, :, p, q] to full-canvas position
    (i*s + p*d, j*s + q*d); the output is the canvas cropped by (top, left) padding."""
    acc = _acc_dtype(x.dtype)
    n, ci, h, wd = x.shape
    _, og, kh, kw = w.shape
    co = og * groups
    cig = ci // groups
    t, bt, l, r = padding
    ho = conv_transpose_out_size(h, kh, stride[0], t, bt, dilation[0], output_padding[0])
    wo = conv_transpose_out_size(wd, kw, stride[1], l, r, dilation[1], output_padding[1])
    hc = max((h - 1) * stride[0] + dilation[0] * (kh - 1) + 1, t + ho)
    wc = max((wd - 1) * stride[1] + dilation[1] * (kw - 1) + 1, l + wo)
    canvas = np.zeros((n, co, hc, wc), acc)
    xa = x.astype(acc)
    wa = w.astype(acc)
    for g in range(groups):
        xg = xa[:, g * cig:(g + 1) * cig]                       # (N, Cig, H, W)
        for p in range(kh):
            for q in range(kw):
                wg = wa[g * cig:(g + 1) * cig, :, p, q]          # (Cig, og)
                # (N, Cig, H, W) x (Cig, og) -> (N, og, H, W)
                contrib = np.einsum("nchw,co->nohw", xg, wg)
                r0, c0 = p * dilation[0], q * dilation[1]
                canvas[:, g * og:(g + 1) * og, r0:r0 + (h - 1) * stride[0] + 1:stride[0],
                       c0:c0 + (wd - 1) * stride[1] + 1:stride[1]] += contrib
    y = canvas[:, :, t:t + ho, l:l + wo]
    if b is not None:
        y = y + b.astype(acc).reshape(1, co, 1, 1)
    return apply_act(y, act).astype(x.dtype, copy=False)


def adaptive_windows(size: int, out: int):
    """PyTorch adaptive pooling windows: [floor(i*size/out), ceil((i+1)*size/out)) per output i."""
    i = np.arange(out)
    return (i * size) // out, -((-(i + 1) * size) // out)


def adaptive_avg_pool(x, output_size, band=None):
    """AdaptiveAvgPool2d to any (oh, ow): each window's sum in float64, per axis (rectangles: the rows'
    windows, then the columns'). band=(r0, r1, lo, H): output rows [r0, r1) only, x holding input rows
    [lo, lo + x.shape[2]) of an input of height H (a row band of the stream mode). (Window sums as differences
    of prefix sums spread a NaN or an infinity to every later window: inf - inf = nan; PyTorch's stay in the
    windows that hold them, tests/test_nonfinite.py.)"""
    y = x.astype(np.float64)
    for axis in (2, 3):
        lo, hi = adaptive_windows(y.shape[axis], output_size[axis - 2])
        if axis == 2 and band is not None:
            r0, r1, first, height = band
            lo, hi = (v[r0:r1] - first for v in adaptive_windows(height, output_size[0]))
        cut = [slice(None)] * y.ndim
        parts = []
        for a, b in zip(lo, hi):
            cut[axis] = slice(int(a), int(b))
            parts.append(y[tuple(cut)].sum(axis=axis, keepdims=True) / (b - a))
        y = np.concatenate(parts, axis=axis) if parts else np.take(y, [], axis=axis)   # (an empty band)
    return y.astype(x.dtype, copy=False)


def adaptive_max_pool(x, output_size):
    """AdaptiveMaxPool2d to any (oh, ow): the maximum over PyTorch's windows, per axis (the rows' windows, then
    the columns'; max is separable); a NaN in a window gives NaN (np.max, as PyTorch's)."""
    y = x
    for axis in (2, 3):
        lo, hi = adaptive_windows(y.shape[axis], output_size[axis - 2])
        cut = [slice(None)] * y.ndim
        parts = []
        for a, b in zip(lo, hi):
            cut[axis] = slice(int(a), int(b))
            parts.append(np.max(y[tuple(cut)], axis=axis, keepdims=True))
        y = np.concatenate(parts, axis=axis)
    return y.astype(x.dtype, copy=False)


def layer_norm(x, gamma, beta, axis=-1, eps=1e-5):
    """Normalize over axes [axis, rank) (biased variance), then gamma * . + beta (shape x.shape[axis:])."""
    acc = _acc_dtype(x.dtype)
    axis %= x.ndim
    axes = tuple(range(axis, x.ndim))
    xa = x.astype(acc)
    mu, var = _mean_var(xa, axes)
    y = (xa - mu) / np.sqrt(var + acc.type(eps))
    return (y * gamma.astype(acc) + beta.astype(acc)).astype(x.dtype, copy=False)


def _mean_var(xa, axes):
    """Mean and biased variance over `axes` (kept), the mean as the first value plus the mean of the differences
    from it: exact where all values are equal, so x - mean = 0 and a norm gives beta there, as PyTorch's
    LayerNorm does (the plain float32 mean of equal values can miss by an ulp, which 1 / sqrt(eps) magnifies to
    ~1e-3), and no cancellation where the mean is large against the spread."""
    x0 = xa[tuple(slice(0, 1) if a in axes else slice(None) for a in range(xa.ndim))]
    mu = x0 + (xa - x0).mean(axis=axes, keepdims=True)
    return mu, ((xa - mu) ** 2).mean(axis=axes, keepdims=True)


def group_norm(x, gamma, beta, groups, eps=1e-5, relu=False, act=None):
    """GroupNorm: the channels of (N, C, ...) in `groups` consecutive groups, each group of each image normalized
    over its channels and every position (biased variance), then gamma[c] * . + beta[c], then the activation.
    groups = C is InstanceNorm, groups = 1 a LayerNorm over (C, ...) with per-channel affine. In float64."""
    n, c = x.shape[:2]
    xa = x.astype(np.float64).reshape(n, groups, -1)      # (N, C, ...) -> (N, G, C/G * prod(...))
    mu = xa.mean(axis=2, keepdims=True)
    var = ((xa - mu) ** 2).mean(axis=2, keepdims=True)
    shape = (1, c) + (1,) * (x.ndim - 2)
    y = ((xa - mu) / np.sqrt(var + eps)).reshape(x.shape)
    y = y * gamma.astype(np.float64).reshape(shape) + beta.astype(np.float64).reshape(shape)
    if relu:
        np.maximum(y, 0, out=y)
    return apply_act(y, act).astype(x.dtype, copy=False)


CHANNEL_NORM_MODES = ("layer", "l2", "l2_clamp")


def channel_norm(x, gamma, beta, eps=1e-6, mode="layer"):
    """A norm over the channel axis 1 of (N, C, ...) at every position, then gamma[c] * . + beta[c]. mode "layer":
    (x - mean) / sqrt(var + eps) (LayerNorm2d, ConvNeXt); "l2": x / (||x||_2 + eps) (SSD's L2Norm); "l2_clamp":
    x / max(||x||_2, eps) (F.normalize)."""
    acc = _acc_dtype(x.dtype)
    xa = x.astype(acc)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    if mode == "layer":
        mu, var = _mean_var(xa, (1,))
        y = (xa - mu) / np.sqrt(var + acc.type(eps))
    else:
        nrm = np.sqrt((xa * xa).sum(axis=1, keepdims=True))
        with np.errstate(divide="ignore", invalid="ignore"):
            y = xa / (nrm + acc.type(eps) if mode == "l2" else np.maximum(nrm, acc.type(eps)))
    return (y * gamma.astype(acc).reshape(shape) + beta.astype(acc).reshape(shape)).astype(x.dtype, copy=False)


RESIZE_COORDS = ("asymmetric", "half_pixel", "align_corners", "pytorch_half_pixel")
NEAREST_MODES = ("floor", "ceil", "round_prefer_floor", "round_prefer_ceil")
# the float32 arithmetic of the coordinate map: "aten" (PyTorch's F.interpolate: the source is dst times
# in/out, or 1/scale) or "onnx" (ONNX's formulas as ONNX Runtime evaluates them: dst divided by out/in, or
# by the given scale). They differ in the last bit, and a nearest index at an exact tie (a source coordinate
# of 6.0 or 7.5) can fall either way: half_pixel 13 -> 7 rows, floor, reads row 6 where the map lands on
# 5.9999995 (ORT, dst / scale) or row 6 on 6.0; each importer asks for its framework's arithmetic.
RESIZE_ARITH = ("aten", "onnx")


def resize_source(size_in: int, size_out: int, scale, coord: str, arith: str = "aten") -> np.ndarray:
    """Source coordinate (float32) of every output index.

    scale: the user's scale factor out/in, or None (then from the sizes). arith "aten" (torch's order):
    asymmetric dst * s; half_pixel (dst + 0.5) * s - 0.5; pytorch_half_pixel the same but 0 for a
    length-1 output; align_corners dst * ((in - 1) / (out - 1)); s = in/out or 1/scale. arith "onnx"
    (ONNX Runtime's order): asymmetric dst / r; half_pixel (dst + 0.5) / r - 0.5; align_corners
    (dst * (in - 1)) / (out - 1); r = out/in or the scale."""
    f32 = np.float32
    dst = np.arange(size_out, dtype=f32)
    if coord == "align_corners":
        if size_out <= 1:
            return np.zeros(size_out, f32)
        if arith == "onnx":
            return dst * f32(size_in - 1) / f32(size_out - 1)
        return dst * (f32(size_in - 1) / f32(size_out - 1))
    if arith == "onnx":
        r = f32(scale) if scale else f32(size_out) / f32(size_in)
        if coord == "asymmetric":
            return dst / r
        src = (dst + f32(0.5)) / r - f32(0.5)
    else:
        s = f32(1.0 / float(scale)) if scale else f32(size_in) / f32(size_out)
        if coord == "asymmetric":
            return dst * s
        src = (dst + f32(0.5)) * s - f32(0.5)
    if coord == "pytorch_half_pixel" and size_out == 1:
        src[:] = 0.0
    return src


# ONNX Runtime's round modes take a source coordinate within this distance of a half as the half itself (ORT
# 1.32, measured over every input length 2-64, output length 2-96 and four coordinate modes: a float32 source one
# ulp off a half, 3.4999998 or 14.499999, rounds as 3.5 / 14.5 would; 22.499998, 1.9e-6 off, does not)
ONNX_HALF_TIE = 1e-6


def resize_nearest_index(size_in, size_out, scale, coord, nearest_mode, arith="aten") -> np.ndarray:
    src = resize_source(size_in, size_out, scale, coord, arith)
    if nearest_mode == "floor":
        i = np.floor(src)
    elif nearest_mode == "ceil":
        i = np.ceil(src)
    elif arith == "onnx":     # a round mode as ONNX Runtime rounds it: near a half is the half (ONNX_HALF_TIE)
        s = src.astype(np.float64)
        lo = np.floor(s)
        off = s - lo - 0.5            # exact: s and lo are float32 values
        tie = np.abs(off) <= ONNX_HALF_TIE
        i = lo + np.where(tie, 1.0 if nearest_mode == "round_prefer_ceil" else 0.0, off > 0)
    elif nearest_mode == "round_prefer_ceil":
        i = np.floor(src + np.float32(0.5))
    else:  # round_prefer_floor
        i = np.ceil(src - np.float32(0.5))
    return np.clip(i, 0, size_in - 1).astype(np.int64)


def resize_linear_weights(size_in, size_out, scale, coord, arith="aten"):
    """(i0, i1, lambda): out = (1 - lambda) * x[i0] + lambda * x[i1]; source clamped to [0, in-1]."""
    src = np.clip(resize_source(size_in, size_out, scale, coord, arith), 0, size_in - 1)
    i0 = np.minimum(np.floor(src).astype(np.int64), size_in - 1)
    lam = np.clip(src - i0, 0, 1).astype(np.float32)
    i1 = np.minimum(i0 + 1, size_in - 1)
    return i0, i1, lam


def resize_cubic_weights(size_in, size_out, scale, coord, a=-0.75, arith="aten", exclude_outside=False):
    """(idx, w), each (out, 4): out = sum_k w[:, k] * x[idx[:, k]]; the taps floor(src) - 1 .. floor(src) + 2 of
    the unclamped source coordinate, clamped to [0, in - 1] (the edge repeated, as PyTorch's bicubic and ONNX's
    cubic with exclude_outside 0), Keys' cubic convolution with A = a (-0.75: PyTorch's and ONNX's default), in
    float32 as ATen's get_cubic_upsample_coefficients. exclude_outside (ONNX's): the taps outside the input
    weigh 0 and the others are divided by their sum."""
    f32 = np.float32
    src = resize_source(size_in, size_out, scale, coord, arith)
    i = np.floor(src)
    t = (src - i).astype(f32)
    A = f32(a)

    def near(x):            # |x| <= 1
        return ((A + f32(2)) * x - (A + f32(3))) * x * x + f32(1)

    def far(x):             # 1 < |x| < 2
        return ((A * x - f32(5) * A) * x + f32(8) * A) * x - f32(4) * A
    w = np.stack([far(t + f32(1)), near(t), near(f32(1) - t), far(f32(2) - t)], axis=1).astype(f32)
    raw = i.astype(np.int64)[:, None] + np.arange(-1, 3)
    if exclude_outside:
        w = np.where((raw >= 0) & (raw < size_in), w, f32(0))
        w = (w / w.sum(axis=1, keepdims=True)).astype(f32)
    return np.clip(raw, 0, size_in - 1), w


def resize_rows(size_in, size_out, scale, mode, coord, nearest_mode="floor", arith="aten", cubic_a=-0.75):
    """(first, last + 1) input row each output row reads: nearest (i, i + 1), linear (i0, i1 + 1), cubic (its
    first clamped tap, its last + 1)."""
    if mode == "nearest":
        i = resize_nearest_index(size_in, size_out, scale, coord, nearest_mode, arith)
        return i, i + 1
    if mode == "cubic":
        idx, _ = resize_cubic_weights(size_in, size_out, scale, coord, cubic_a, arith)   # (the same taps)
        return idx[:, 0], idx[:, 3] + 1
    i0, i1, _ = resize_linear_weights(size_in, size_out, scale, coord, arith)
    return i0, i1 + 1


def resize(x, size, scales=None, mode="nearest", coord="asymmetric", nearest_mode="floor", band=None, arith="aten",
           cubic_a=-0.75, cubic_exclude=False):
    """Resize H and W of (N, C, H, W) to `size`.

    torch F.interpolate: nearest = (asymmetric, floor); nearest-exact = (half_pixel,
    round_prefer_ceil); bilinear = (half_pixel, linear) or (align_corners, linear); bicubic = (half_pixel or
    align_corners, cubic, A = -0.75); scales are the
    scale_factor given (they enter the coordinate map, as in torch with recompute_scale_factor unset).
    arith: the coordinate map's float32 order (RESIZE_ARITH: "aten" for torch, "onnx" for ONNX files).
    band=(r0, r1, lo, H): output rows [r0, r1) only, x holding input rows [lo, lo + x.shape[2]) of
    an input of height H (a row band of the stream mode)."""
    n, c, h, w = x.shape
    r0, r1, lo = 0, size[0], 0
    if band is not None:
        r0, r1, lo, h = band
    sh, sw = scales if scales else (None, None)
    if mode == "nearest":
        ih = resize_nearest_index(h, size[0], sh, coord, nearest_mode, arith)[r0:r1] - lo
        iw = resize_nearest_index(w, size[1], sw, coord, nearest_mode, arith)
        return np.ascontiguousarray(x[:, :, ih][:, :, :, iw])
    acc = _acc_dtype(x.dtype)
    if mode == "cubic":         # the columns' 4 taps, then the rows' (ATen's order)
        ih, wh = resize_cubic_weights(h, size[0], sh, coord, cubic_a, arith, cubic_exclude)
        ih, wh = ih[r0:r1] - lo, wh[r0:r1].astype(acc)
        iw, ww = resize_cubic_weights(w, size[1], sw, coord, cubic_a, arith, cubic_exclude)
        xa = x.astype(acc)
        cols = sum(xa[:, :, :, iw[:, k]] * ww[:, k].astype(acc) for k in range(4))      # (N, C, H, Wo)
        y = sum(cols[:, :, ih[:, k], :] * wh[:, k].reshape(1, 1, -1, 1) for k in range(4))
        return y.astype(x.dtype, copy=False)
    h0, h1, lh = (a[r0:r1] for a in resize_linear_weights(h, size[0], sh, coord, arith))
    h0, h1 = h0 - lo, h1 - lo
    w0, w1, lw = resize_linear_weights(w, size[1], sw, coord, arith)
    xa = x.astype(acc)
    lh = lh.astype(acc).reshape(1, 1, -1, 1)
    lw = lw.astype(acc).reshape(1, 1, 1, -1)
    top = xa[:, :, h0][:, :, :, w0] * (1 - lw) + xa[:, :, h0][:, :, :, w1] * lw
    bot = xa[:, :, h1][:, :, :, w0] * (1 - lw) + xa[:, :, h1][:, :, :, w1] * lw
    return (top * (1 - lh) + bot * lh).astype(x.dtype, copy=False)


# grid_sample ---------------------------------------------------------------------------------------------------
# PyTorch's F.grid_sample / ONNX GridSample on 2-D images: out[n, c, i, j] samples x[n, c] at grid[n, i, j] = (gx,
# gy) in [-1, 1] (gx along W). The arithmetic is ATen's vectorized CPU kernel's (GridSamplerKernel.cpp), in the
# input's float dtype: the coordinate unnormalized as (g + 1) * ((size - 1) / 2) with align_corners, else
# (g + 1) * (size / 2) - 0.5; border clips it to [0, size - 1]; reflection folds it into [0, size - 1]
# (align_corners) or [-0.5, size - 0.5] (then clips); bilinear weights from floor(ix) and the four corners summed
# nw, ne, sw, se (a corner outside the image reads 0); nearest rounds halves to even and reads 0 outside.
GRID_MODES = ("bilinear", "nearest", "bicubic")
GRID_PADDINGS = ("zeros", "border", "reflection")


def linspace_from_neg_one(n: int, align_corners: bool) -> np.ndarray:
    """ATen's affine_grid base coordinates along an axis of n (float32): -1 .. 1 (align_corners) or the pixel
    centres -(n - 1) / n .. (n - 1) / n; one pixel: 0."""
    if n <= 1:
        return np.zeros(max(n, 1), np.float32)
    r = np.linspace(-1.0, 1.0, n, dtype=np.float32)
    return r if align_corners else (r * np.float32((n - 1) / n)).astype(np.float32)


def affine_grid_base(h: int, w: int, align_corners: bool, dtype=np.float32) -> np.ndarray:
    """(1, H W, 3) rows (x, y, 1) of F.affine_grid's base grid; the grid is this times theta transposed."""
    xs, ys = linspace_from_neg_one(w, align_corners), linspace_from_neg_one(h, align_corners)
    base = np.stack([np.broadcast_to(xs[None, :], (h, w)), np.broadcast_to(ys[:, None], (h, w)),
                     np.ones((h, w), np.float32)], -1)                       # (H, W, 3)
    return base.reshape(1, h * w, 3).astype(dtype)


def grid_unnormalize(g, size, padding_mode, align_corners):
    """Source coordinates (float, input dtype) of normalized grid coordinates g along an axis of `size`."""
    dt = g.dtype.type
    with np.errstate(invalid="ignore", over="ignore"):
        if align_corners:
            c = (g + dt(1)) * dt((size - 1) / 2)
        else:
            c = (g + dt(1)) * dt(size / 2) - dt(0.5)
        return grid_bound(c, size, padding_mode, align_corners)


def grid_bound(c, size, padding_mode, align_corners):
    """A source coordinate brought into the image by the padding mode: border clips, reflection reflects (about the
    corner pixels' centres with align_corners, their outer edges without) then clips; zeros leaves it."""
    with np.errstate(invalid="ignore", over="ignore"):
        if padding_mode == "border":
            c = _clip(c, size)
        elif padding_mode == "reflection":
            c = _clip(_reflect(c, 0, 2 * (size - 1)) if align_corners else _reflect(c, -1, 2 * size - 1), size)
    return c


def grid_cubic_coefficients(t):
    """ATen's vectorized bicubic grid sampler's four weights (A = -0.75) at fractions t: the taps at -1, 0, 1, 2
    (distances t + 1, t, 1 - t, 2 - t), in t's dtype."""
    dt = t.dtype.type
    a = dt(-0.75)

    def far(x):                      # 1 < x < 2
        return ((a * x - dt(5) * a) * x + dt(8) * a) * x - dt(4) * a

    def near(x):                     # x <= 1
        return ((a + dt(2)) * x - (a + dt(3))) * x * x + dt(1)
    with np.errstate(invalid="ignore", over="ignore"):
        return far(t + dt(1)), near(t), near(dt(1) - t), far(dt(2) - t)


def _reflect(c, twice_low, twice_high):
    """ATen's vectorized reflect_coordinates: |c - low| modulo twice the span, folded back (min(e, 2 span - e))."""
    dt = c.dtype.type
    if twice_low == twice_high:
        return np.zeros_like(c)
    lo, span2 = dt(twice_low / 2), dt(twice_high - twice_low)
    a = np.abs(c - lo)
    extra = a - np.floor(a / span2) * span2
    return (np.minimum(extra, span2 - extra) + lo).astype(c.dtype, copy=False)


def _clip(c, size):
    """ATen's clip_coordinates: into [0, size - 1], NaN to 0 (its vector max returns the 0 for a NaN)."""
    dt = c.dtype.type
    return np.where(np.isnan(c), dt(0), np.minimum(np.maximum(c, dt(0)), dt(size - 1)))


def grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False):
    """x (N, C, H, W), grid (N, Ho, Wo, 2) -> (N, C, Ho, Wo)."""
    n, c, h, w = x.shape
    dt = x.dtype.type
    ix = grid_unnormalize(grid[..., 0], w, padding_mode, align_corners)     # (N, Ho, Wo)
    iy = grid_unnormalize(grid[..., 1], h, padding_mode, align_corners)
    nidx = np.arange(n)[:, None, None]

    def read(yy, xx):
        """x at integer (yy, xx) (N, Ho, Wo), 0 outside: (N, C, Ho, Wo)."""
        ok = (xx >= 0) & (xx < w) & (yy >= 0) & (yy < h)
        v = x[nidx, :, np.where(ok, yy, 0), np.where(ok, xx, 0)]            # (N, Ho, Wo, C)
        return np.where(ok[..., None], v, dt(0)).transpose(0, 3, 1, 2)

    with np.errstate(invalid="ignore", over="ignore"):
        if mode == "nearest":
            rx, ry = np.rint(ix), np.rint(iy)
            return np.ascontiguousarray(read(_as_index(ry), _as_index(rx)))
        if mode == "bicubic":
            # unnormalized only; each of the 4 x 4 taps brought in by the padding mode (ATen's get_value_bounded),
            # rows interpolated along x, then those along y
            ux = grid_unnormalize(grid[..., 0], w, "zeros", align_corners)
            uy = grid_unnormalize(grid[..., 1], h, "zeros", align_corners)
            x0, y0 = np.floor(ux), np.floor(uy)
            cx, cy = grid_cubic_coefficients(ux - x0), grid_cubic_coefficients(uy - y0)
            xs = [_as_index(grid_bound(x0 + dt(k), w, padding_mode, align_corners)) for k in (-1, 0, 1, 2)]
            out = None
            for i, k in enumerate((-1, 0, 1, 2)):
                yi = _as_index(grid_bound(y0 + dt(k), h, padding_mode, align_corners))
                row = (cx[0][:, None] * read(yi, xs[0]) + cx[1][:, None] * read(yi, xs[1])
                       + cx[2][:, None] * read(yi, xs[2]) + cx[3][:, None] * read(yi, xs[3]))
                out = cy[i][:, None] * row if out is None else out + cy[i][:, None] * row
            return np.ascontiguousarray(out.astype(x.dtype, copy=False))
        x0, y0 = np.floor(ix), np.floor(iy)
        we = ix - x0
        ea = dt(1) - we
        ns = iy - y0
        so = dt(1) - ns
        nw, ne, sw, se = so * ea, so * we, ns * ea, ns * we
        xi, yi = _as_index(x0), _as_index(y0)
        out = (read(yi, xi) * nw[:, None] + read(yi, xi + 1) * ne[:, None]
               + read(yi + 1, xi) * sw[:, None] + read(yi + 1, xi + 1) * se[:, None])
    return np.ascontiguousarray(out.astype(x.dtype, copy=False))


def _as_index(f):
    """Integer positions of floored / rounded coordinates; NaN and those far outside any image -> -2 (read as 0)."""
    ok = np.isfinite(f) & (np.abs(f) < 2.0 ** 30)
    return np.where(ok, f, -2).astype(np.int64)
