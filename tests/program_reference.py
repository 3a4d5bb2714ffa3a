"""A plain reference interpreter of a loaded package: the fuzz tests' oracle.

It runs the program instruction by instruction on its own memory model (a byte array per
segment and per IO slot, the same offsets the runtime uses, so blocks that share hidden memory
share it here too), reading every input as a copy and computing the output with plain numpy
semantics of each runtime kernel:

  - IR op kernels: the op's reference (`ir/ops.py`), on NCHW16c operands through an unblocked
    view with all Cb*16 channels (what the blocked kernels compute: padded lanes included);
  - conv2d with prepared constants: the constants unpacked back into a (padded) weight and bias
    (gemm1x1, k1x1, direct, im2col; the stem's own packing where the runtime's stem kernel reads it), or
    the Winograd algorithm itself with the stored transform U (unpacked from (alpha^2, OP, Cip,
    32); a plain numpy F(m x m, 3 x 3), so a package whose U is not G g G^T still has one answer);
  - to_nchwc / from_nchwc: zero-padded blocking / dropping the padded channels;
  - the blocked kernels of issue 9 (params channels, in_channels): the op on the real channels,
    padded lanes 0; an input-scaled 1x1 conv on its unblocked input.
  - a stream region (schedule="stream"): the header is skipped and each band instruction
    computes its op on whole logical tensors (its attrs, its constants), ignoring the steps and
    the rings: a ring's tensor is kept whole here, a whole tensor (sink, IO) lives in memory.

It shares no code with the runtime's kernels, its addressing or its validators.
"""
from __future__ import annotations

import numpy as np

from tilefuse.compiler.program import CONST, HIDDEN, IO
from tilefuse.ir.ops import schema
from tilefuse.kernels import reference as ref
from tilefuse.kernels.conv.winograd import MATRICES

L = 16


def _unblock(xb):
    """(N, Cb, H, W, 16) -> (N, Cb*16, H, W)."""
    n, cb, h, w, _ = xb.shape
    return xb.transpose(0, 1, 4, 2, 3).reshape(n, cb * L, h, w)


def _block(x, cb=None):
    """(N, C, H, W) -> (N, ceil(C/16), H, W, 16), zero padded channels."""
    n, c, h, w = x.shape
    cb = cb if cb is not None else -(-c // L)
    full = np.zeros((n, cb * L, h, w), x.dtype)
    full[:, :c] = x
    # (N, Cb*16, H, W) -> (N, Cb, 16, H, W) -> (N, Cb, H, W, 16)
    return full.reshape(n, cb, L, h, w).transpose(0, 1, 3, 4, 2)


def _winograd(x, U, bias, m, padding):
    """Y = A^T [U (.) (B^T d B)] A over m x m output tiles; x (N, Cp, H, W) float64 with Cp = U's
    input channels; returns (N, Cop, Ho, Wo) float64 (bias added)."""
    bt, _, at = MATRICES[m]
    alpha = m + 2
    n, c, h, w = x.shape
    t, b, l, r = padding
    ho, wo = h + t + b - 2, w + l + r - 2
    th, tw = -(-ho // m), -(-wo // m)
    xp = np.zeros((n, c, th * m + 2, tw * m + 2))
    xp[:, :, t:t + h, l:l + w] = x
    s = xp.strides
    tiles = np.lib.stride_tricks.as_strided(xp, (n, c, th, tw, alpha, alpha),
                                            (s[0], s[1], s[2] * m, s[3] * m, s[2], s[3]))
    V = np.einsum("ai,nctuij,bj->nctuab", bt, tiles, bt).reshape(n, c, th, tw, alpha * alpha)
    M = np.einsum("nctuk,kco->notuk", V, U.astype(np.float64)).reshape(n, -1, th, tw, alpha, alpha)
    Y = np.einsum("pa,notuab,qb->notupq", at, M, at)           # (N, O, th, tw, m, m)
    o = Y.shape[1]
    out = Y.transpose(0, 1, 2, 4, 3, 5).reshape(n, o, th * m, tw * m)[:, :, :ho, :wo]
    return out + bias.astype(np.float64).reshape(1, -1, 1, 1)


def _conv_prepared(ins, args):
    p = ins.params
    alg, lay, out_lay = p["algorithm"], p.get("layout", "nchw"), p.get("out_layout", "nchw")
    co, cg, kh, kw = p["weight_shape"]
    g = p["groups"]
    x, wt, bias = args[0], args[1], args[2]
    res = args[1 + len(p["prepared"])] if p["has_residual"] else None   # after every prepared constant
    blocked_in = lay == "nchwc"
    xl = _unblock(x) if blocked_in else x
    if alg.startswith("winograd"):
        # packed (alpha^2, OP, Cip, 32) -> (alpha^2, Cip, OP*32), the output channels the bias covers
        a2, op_, cip, _ = wt.shape
        U = wt.transpose(0, 2, 1, 3).reshape(a2, cip, op_ * 32)[:, :, :bias.shape[0]]
        xw = np.zeros((xl.shape[0], U.shape[1], xl.shape[2], xl.shape[3]))
        xw[:, :xl.shape[1]] = xl
        y = _winograd(xw, U, bias, int(alg[-1]), p["padding"])
        if not blocked_in:
            y = y[:, :co]
    else:
        if alg == "direct":
            ob, cb = wt.shape[0], wt.shape[1]
            # (Ob, Cb, KH, KW, 16ci, 16co) -> (Ob, 16co, Cb, 16ci, KH, KW) -> (Ob*16, Cb*16, KH, KW)
            w = wt.transpose(0, 5, 1, 4, 2, 3).reshape(ob * L, cb * L, kh, kw)
            b = bias
        elif alg == "gemm1x1" and blocked_in:
            op_, cip, _ = wt.shape
            w = wt.transpose(0, 2, 1).reshape(op_ * 32, cip)[..., None, None]   # (OP*32, Cip, 1, 1)
            b = bias
        elif alg == "gemm1x1":
            w, b = wt[..., None, None], bias
        elif out_lay == "nchwc" and "stem_weight" in p["prepared"]:
            # NCHW in, NCHW16c out with few input channels: the stem kernel reads its own packing,
            # (Ob, Cin, KH, KW, 16) -> (Ob, 16, Cin, KH, KW) -> (Ob*16, Cin, KH, KW), and bias
            keys = list(p["prepared"])
            sw, b = args[1 + keys.index("stem_weight")], args[1 + keys.index("stem_bias")]
            w = sw.transpose(0, 4, 1, 2, 3).reshape(sw.shape[0] * L, cg, kh, kw)
        else:  # im2col: (G, og, cg, KH, KW) -> (Co, cg, KH, KW)
            w, b = wt.reshape(co, cg, kh, kw), bias
        if blocked_in:
            nout = ins.output.shape[1] * L
            w, b = w[:nout, :xl.shape[1]], b[:nout]
        else:
            w, b = w[:co, :cg], b[:co]
        y = ref.conv2d(xl.astype(np.float64), w.astype(np.float64), b.astype(np.float64), p["stride"],
                       p["padding"], p["dilation"], g)
    if blocked_in:
        if res is not None:
            y = y + _unblock(res)
        return _block(_act(y, p).astype(np.float32))
    if out_lay == "nchwc":
        y = y[:, :co]
        if res is not None:
            y = y + _unblock(res)[:, :co]
        return _block(_act(y, p).astype(np.float32), ins.output.shape[1])   # padded lanes written as 0
    if res is not None:
        y = y + res
    return _act(y, p).astype(np.float32)


def _act(y, p):
    """The conv's fused activation (params act; relu=True is act relu)."""
    act = p.get("act")
    if act is None or act[0] in ("identity", "relu"):
        return np.maximum(y, 0) if p.get("relu") else y
    from tilefuse.kernels.activations import reference as act_ref
    return act_ref(act[0], y, act[1], act[2])


def kernel_reference(ins, args):
    """The output of one instruction from copies of its inputs."""
    k, p = ins.kernel, dict(ins.params)
    if k == "to_nchwc":
        return _block(args[0])
    if k == "from_nchwc":
        return _unblock(args[0])[:, :p["channels"]].copy()
    if k == "conv2d" and "prepared" in p:
        return _conv_prepared(ins, args)
    lay = p.pop("layout", "nchw")
    p.pop("algorithm", None)
    s = schema(k)
    if lay == "nchwc" and "in_channels" in p:
        # the issue-9 blocked kernels: computed on the real channels (in_channels, channels), the
        # padded lanes of the result written 0; a 4-D operand is a per-channel NCHW one
        inch, c = list(p.pop("in_channels")), p.pop("channels")
        it = iter(inch)
        xs = [_unblock(a)[:, :next(it)] if a.ndim == 5 else a for a in args]
        return _block(s.reference(*xs, **p)[:, :c])
    if k == "conv2d" and p.get("has_input_scale") and lay == "nchwc":
        w = args[1]
        xs = [_unblock(args[0])[:, :w.shape[1]]] + list(args[1:])
        if p["has_residual"]:
            i = 2 + int(p["has_bias"])
            xs[i] = _unblock(xs[i])[:, :w.shape[0]]
        return _block(s.reference(*xs, **p))
    if lay == "nchwc":
        if k == "scale":
            x, a, b = args
            cb = x.shape[1]
            ap, bp = np.zeros(cb * L, a.dtype), np.zeros(cb * L, b.dtype)
            ap[:a.size], bp[:b.size] = a, b
            return _block(s.reference(_unblock(x), ap, bp, **p))
        if k == "global_avg_pool":
            return s.reference(_unblock(args[0]), **p)[:, :ins.output.shape[1]]
        return _block(s.reference(*[_unblock(a) for a in args], **p))
    return s.reference(*args, **p)


class _Whole:
    """What kernel_reference reads of an instruction, for a band's op on whole tensors."""

    def __init__(self, kernel, params, out_shape):
        self.kernel, self.params = kernel, params
        self.output = type("Out", (), {"shape": tuple(out_shape)})()


def band_reference(ins, args):
    """A band instruction's op on whole logical NCHW tensors (args: activations whole, constants
    as stored), by the same rules as the instructions of the layer schedule."""
    p = ins.params
    kp = dict(p["attrs"])
    out = tuple(p["tensors"][-1][:4])
    if p["op"] == "conv2d" and p.get("prepared"):
        kp.update(prepared=tuple(p["prepared"]), weight_shape=tuple(p["weight_shape"]))
        if p["layout"] == "nchwc":       # weights for NCHW16c: the reference conv on blocked tensors
            kp["layout"] = "nchwc"
            x = [_block(a) if i not in range(1, 1 + len(p["prepared"])) else a for i, a in enumerate(args)]
            y = _conv_prepared(_Whole("conv2d", kp, (out[0], -(-out[1] // L)) + out[2:] + (L,)), x)
            return _unblock(y)[:, :out[1]]
        if p["tensors"][-1][5] == 2:     # NCHW in, an NCHW16c ring out: conv2d_run_to_nchwc's form
            kp["out_layout"] = "nchwc"
            k = 1 + len(p["prepared"])
            x = [_block(a) if i >= k else a for i, a in enumerate(args)]          # the residual
            y = _conv_prepared(_Whole("conv2d", kp, (out[0], -(-out[1] // L)) + out[2:] + (L,)), x)
            return _unblock(y)[:, :out[1]]
        return _conv_prepared(_Whole("conv2d", kp, out), args)
    return kernel_reference(_Whole(p["op"], kp, out), args)


def run_reference(pkg, inputs):
    """The package's outputs for `inputs` (one array per input slot), as a list."""
    mem = {CONST: np.frombuffer(pkg.const_area, np.uint8).copy(),
           HIDDEN: np.zeros(max(pkg.hidden_bytes, 1), np.uint8)}
    io = {}
    for s, x in zip(pkg.inputs, inputs):
        io[s.offset] = np.ascontiguousarray(x, s.dtype).reshape(-1).view(np.uint8).copy()
    for s in pkg.outputs:
        io[s.offset] = np.zeros(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize, np.uint8)

    def where(op):
        if op.segment == IO:
            return io[op.seg_offset], op.block_offset
        return mem[op.segment], op.seg_offset + op.block_offset

    rings = {}                     # a band's ring tensors, kept whole (name -> NCHW array)
    for ins in pkg.program():
        if ins.kernel == "stream":
            continue
        band = ins.kernel == "band"
        kinds = iter(t[5] for t in ins.params["tensors"]) if band else None
        args = []
        for op in ins.inputs:
            if band and op.segment != CONST and next(kinds) != 0:
                args.append(rings[op.name].copy())
                continue
            buf, a = where(op)
            args.append(buf[a:a + op.nbytes].view(op.dtype).reshape(op.shape).copy())
        out = ins.output
        if band:
            y = np.asarray(band_reference(ins, args)).astype(out.dtype)
            if ins.params["tensors"][-1][5] != 0:
                rings[out.name] = y
                continue
        else:
            y = np.asarray(kernel_reference(ins, args))
        assert y.shape == out.shape, (ins.kernel, y.shape, out.shape)
        buf, a = where(out)
        buf[a:a + out.nbytes] = np.ascontiguousarray(y, out.dtype).reshape(-1).view(np.uint8)
    return [io[s.offset].view(np.dtype(s.dtype)).reshape(s.shape) for s in pkg.outputs]
