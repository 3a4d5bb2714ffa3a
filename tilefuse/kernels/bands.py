"""Band kernels: one streamed layer computing output rows [r0, r1) from its input rows.

The stream mode of the runtime (`runtime/streaming.py`) runs a program's band instructions:
each streamed layer's output rows [r0, r1) at a time, its input rows read from row rings
(`runtime/ring.py`; a ring holds `capacity` rows, logical row r in slot r % capacity) or from
whole tensors. A runner here computes one band: it reads the input rows the band needs
(`RowWindow.rows`), builds the padded band in a scratch buffer when the op has a window, and
writes its output rows into the output ring's slots. The runners take plain values
(`BandLayer`: the op, its params, shapes, windows and constants from the band instruction);
nothing here knows the IR or the program format.

float32 conv2d: `KernelConvRunner`, the fast kernels of `kernels/conv` through their public
entry points (weights prepared at compile time, in the layout the compiler gave the layer).
With NCHW16c rings a conv with an NCHW16c algorithm gathers its band as NCHW16c rows and runs
`direct_nchwc` (on the band padded left/right) or `conv2d_run_nchwc` (padding (0, 0, l, r));
im2col writes NCHW16c rows through `conv2d_run_to_nchwc`; NCHW rings go through `conv2d_run`
on the gathered band, and a ring of the other layout is converted one band at a time
(`band_as`, `store_band`). `ReferenceConvRunner`: the reference kernel on the padded band
(other dtypes, or the "reference" algorithm).

Pooling: max pooling of float bands is the one max-pool loop of `kernels/pool.py`, reading the
ring in place (either layout); average pooling (and max pooling of other dtypes) sums or maxes
its taps over the padded band (max pads with -inf, avg with 0 and divides by separable per-row
x per-column counts, PyTorch's count_include_pad and ceil_mode rules, as `kernels/reference.py`).
Row-local ops: relu, dropout, concat and the add of two rings on the ring rows (either
layout); activation, prelu, add/sub/mul/div with a constant broadcast over the rows, an add with
a fused activation other than ReLU and channel_norm through their layer kernels
(`kernels/broadcast.py`, `kernels/norm.py`) on contiguous row bands of either layout (their
NCHW16c forms, as layer by layer; `band_layout` says which); any other row-local op runs
its reference kernel on the rows (`BandLayer.reference`), so an op added to the `ROW_LOCAL`
group of `ir/ops.py` streams without a kernel of its own here. Convs apply any fused activation
of `kernels/activations.py` in their epilogue (`act` param), as in the layer schedule.
"""
from __future__ import annotations

import numpy as np

from dataclasses import dataclass, field
from typing import Callable

from . import broadcast, norm, pool
from . import reference as ref
from .threads import Scratch

LANES = 16   # NCHW16c channel block (kernels/conv)

# row ops that run on NCHW16c rows unchanged (padded channels stay zero: max(0, 0), 0 + 0; an
# add's fused activation writes act(0) there, which the next conv's zero weights ignore, as
# conv2d_run_nchwc's own epilogue does). An add reads two activation operands here.
BLOCKED_ROW_OPS = frozenset({"relu", "add", "dropout", "concat"})
# row ops computed by their layer kernel (kernels/broadcast.py, kernels/norm.py) on contiguous
# row bands: kernel(out, *inputs in op order, **params)
ROW_KERNELS = {"activation": broadcast.activation, "prelu": broadcast.prelu,
               "add": broadcast.KERNELS["add"], "sub": broadcast.KERNELS["sub"],
               "mul": broadcast.KERNELS["mul"], "div": broadcast.KERNELS["div"],
               "channel_norm": norm.channel_norm}


@dataclass(frozen=True)
class RowWindow:
    """Output row r needs input rows r*stride + offset + [0, span)."""
    stride: int = 1
    offset: int = 0
    span: int = 1

    def rows(self, r0: int, r1: int) -> tuple[int, int]:
        """Input rows [lo, hi) needed for output rows [r0, r1), unclipped (may be < 0 or > H)."""
        return r0 * self.stride + self.offset, (r1 - 1) * self.stride + self.offset + self.span


IDENTITY = RowWindow()


@dataclass
class BandLayer:
    """What a band kernel knows of its layer (a band instruction's op, params and operands)."""
    name: str
    kind: str                                   # the IR op
    params: dict                                # the op's params (conv: with its algorithm)
    in_shapes: list                             # logical (N, C, H, W) of each activation input
    out_shape: tuple
    dtype: np.dtype
    windows: list                               # RowWindow per activation input
    consts: list = field(default_factory=list)  # constant inputs, in operand order
    const_positions: list = field(default_factory=list)   # their positions among the op's inputs
    act_positions: list = field(default_factory=list)     # the activation inputs' positions
    prepared: dict | None = None                # conv: {role: array} from conv2d_prepare
    blocked_weights: bool = False               # conv: prepared for NCHW16c (conv2d_run_nchwc)
    weight_shape: tuple | None = None           # conv: (O, C/groups, kh, kw)
    rows_max: int = 1                           # the largest step's output rows
    reference: Callable | None = None           # the op's reference kernel (row-local fallback)

    @property
    def rows(self) -> int:
        return self.out_shape[2]


def _channel_const(shape) -> bool:
    """A constant the NCHW16c form of kernels/broadcast.py takes: (1, C or 1, 1, 1) right-aligned."""
    s = (1,) * (4 - len(shape)) + tuple(shape) if len(shape) <= 4 else None
    return s is not None and s[0] == 1 and s[2:] == (1, 1)


def band_layout(kind: str, params: dict, dtype, in_channels, rings: str = "nchwc",
                const_shapes=()) -> tuple[str, bool, bool]:
    """(role, reads NCHW16c natively, writes NCHW16c natively) of a layer's band kernel, for the
    compiler's ring layouts (compiler/bands.py `assign_ring_layouts`). Roles: "nchw" reads and
    writes NCHW rings only; "same" runs on NCHW or NCHW16c rings but needs all its tensors in one
    layout; "any" (the fast convs) converts whatever its rings hold. `const_shapes`: the shapes
    of the layer's constant operands (a binary op runs blocked with per-channel constants only)."""
    dtype = np.dtype(dtype)
    if kind == "conv2d":
        alg = params.get("algorithm", "reference")
        if alg == "reference":
            return "nchw", False, False
        if rings != "nchwc":
            return "any", False, False
        from .conv import NCHWC_ALGORITHMS
        one = params["groups"] == 1
        blocked = alg in NCHWC_ALGORITHMS and (one or alg in ("depthwise", "grouped"))
        return "any", blocked, blocked or (alg == "im2col" and one)
    if rings != "nchwc" or dtype != np.float32:
        return "nchw", False, False
    if kind in ("max_pool", "avg_pool"):
        return "same", True, True
    if kind in BLOCKED_ROW_OPS:   # a concat of whole channel blocks: every input but the last x16
        if kind != "concat" or all(c % LANES == 0 for c in in_channels[:-1]):
            if kind != "add" or all(_channel_const(s) for s in const_shapes):
                return "same", True, True
        return "nchw", False, False
    if kind in ROW_KERNELS:   # their layer kernels' NCHW16c forms; binary ops: per-channel constants
        # (not a div by a constant: broadcast.binary's blocked per-channel loop divides the padded
        # lanes by 0, which numba raises as ZeroDivisionError)
        if kind not in ("sub", "mul", "div") or (kind != "div" or not const_shapes) and \
                all(_channel_const(s) for s in const_shapes):
            return "same", True, True
    return "nchw", False, False


# target size of one im2col columns chunk (measured: 1-2 MiB best with a 1 MiB L2 per core)
COLS_BYTES = 2 << 20


class Runner:
    """Computes one layer's output band; subclasses per op family."""

    out_blocked = False          # set by the stream mode: its output ring is NCHW16c

    def __init__(self, layer: BandLayer):
        self.layer = layer
        self.in_shapes = list(layer.in_shapes)
        self.out_shape = layer.out_shape
        self.dtype = np.dtype(layer.dtype)
        self.band = layer.rows_max
        self.consts = layer.consts

    def scratch_need(self) -> dict[str, int]:
        """Scratch elements per slot for the largest band."""
        return {}

    def release_rows(self, r1: int) -> list[int]:
        """After output rows [.., r1): the first row of each input still needed."""
        out = []
        for shape, win in zip(self.in_shapes, self.layer.windows):
            h = shape[2]
            out.append(h if r1 >= self.layer.rows else max(0, min(h, win.rows(r1, r1 + 1)[0])))
        return out

    def run(self, rings, scratch: Scratch, r0: int, r1: int, dst: np.ndarray) -> None:
        raise NotImplementedError


def _fill_band(ring, scratch: Scratch, slot: str, shape, lo: int, hi: int, left: int, width: int,
               pad_value, dtype, extra_rows: int = 0) -> np.ndarray:
    """The padded input band (N, C, hi - lo, width): ring rows [lo, hi) ∩ [0, H) at column
    `left`, pad_value everywhere else (and `extra_rows` more rows of pad_value below)."""
    n, c, h, w = shape
    xp = scratch.get(slot, (n, c, hi - lo + extra_rows, width), dtype)
    if extra_rows:
        xp[:, :, hi - lo:] = pad_value
    return _fill_rows(ring, xp, h, w, lo, hi, left, width, pad_value)


def _fill_rows(ring, xp: np.ndarray, h: int, w: int, lo: int, hi: int, left: int, width: int,
               pad_value) -> np.ndarray:
    """Copy ring rows [max(lo, 0), min(hi, h)) into `xp` (rows on axis 2, columns on axis 3, for
    NCHW and NCHW16c alike) at column `left`, pad_value around them."""
    a, b = max(lo, 0), min(hi, h)
    if a > lo:
        xp[:, :, :a - lo] = pad_value
    if hi > b:
        xp[:, :, max(b, a) - lo:] = pad_value
    if left:
        xp[:, :, a - lo:b - lo, :left] = pad_value
    if width > left + w:
        xp[:, :, a - lo:b - lo, left + w:] = pad_value
    if b > a:
        ring.read_into(a, b, xp[:, :, a - lo:b - lo, left:left + w])
    return xp


class KernelConvRunner(Runner):
    """float32 convs through the fast kernels of `kernels/conv` (the layer-by-layer kernels).

    Weights are prepared once (`conv2d_prepare`, at compile time). A band of output rows
    [r0, r1) needs input rows [lo, hi) = window.rows(r0, r1); they are gathered from the ring
    into a C-contiguous (N, C, hi - lo, W) scratch band whose rows outside [0, H) are zeros
    (the conv's top/bottom padding, materialized), and `conv2d_run` computes the band with
    padding (0, 0, left, right), bias / residual / ReLU fused in its epilogue. The output is
    written straight into the ring slots when they are C-contiguous, else into scratch and
    copied (one pass; a ring of C > 1 channels holds rows of every channel apart)."""

    def __init__(self, layer: BandLayer):
        super().__init__(layer)
        from . import conv as fast
        self.fast = fast
        p = layer.params
        self.p = p
        self.kh = layer.weight_shape[2]
        n, c, h, wd = self.in_shapes[0]
        t, b, l, r = p["padding"]
        self.hpad = (0, 0, l, r)
        self.rows_max = layer.rows_max
        self.rin_max = self._rin(self.rows_max)
        self.kw_args = dict(stride=p["stride"], padding=self.hpad, dilation=p["dilation"], groups=p["groups"])
        self.algorithm = p["algorithm"]   # the algorithm pass's choice (compiler/algorithms.py)
        # blocked: the NCHW16c kernels (conv2d_run_nchwc / direct_nchwc) on NCHW16c bands, with
        # the weights the compiler prepared in that form
        self.blocked = layer.blocked_weights
        self.prepared = layer.prepared
        self.cb_in = -(-c // LANES)
        self.cb_out = -(-self.out_shape[1] // LANES)
        self.bpad = (l, r) if self.algorithm == "direct" else (0, 0)   # direct_nchwc reads a padded band
        self.threads = None          # set by the stream mode: None = all cores, 1 per pipeline stage
        self.acc = np.dtype(np.float32)

    def _rin(self, rows):
        return (rows - 1) * self.p["stride"][0] + self.p["dilation"][0] * (self.kh - 1) + 1

    def scratch_need(self):
        n, c, _, w = self.in_shapes[0]
        o, wo = self.out_shape[1], self.out_shape[3]
        # one slot per role whatever the layout (a runner uses one layout per slot)
        ob = n * self.cb_out * self.rows_max * wo * LANES
        if self.blocked:
            need = {"xband": n * self.cb_in * self.rin_max * (w + sum(self.bpad)) * LANES, "yband": ob}
            if self.p["has_residual"]:
                need["rband"] = ob
            return need
        need = {"xband": n * c * self.rin_max * w, "yband": n * o * self.rows_max * wo}
        if self.p["has_residual"]:
            need["rband"] = n * o * self.rows_max * wo
        if self.out_blocked:
            need["yband"] = ob
            if self.p["has_residual"]:
                need["rband"] = ob
        return need

    def _run_blocked(self, rings, scratch, r0, r1, dst, lo, hi):
        """NCHW16c band: gather the input rows [lo, hi) (zero rows outside [0, H), and for
        direct zero columns left/right) into a contiguous blocked band, run the blocked kernel
        into the output ring's rows (or a contiguous scratch band, then one copy), epilogue fused."""
        p = self.p
        R = r1 - r0
        n, c, h, w = self.in_shapes[0]
        src = rings[0]
        a, b = max(lo, 0), min(hi, h)
        left, right = self.bpad
        width = w + left + right
        xb = scratch.get("xband", (n, self.cb_in, hi - lo, width, LANES), np.float32)
        if src.blocked:
            _fill_rows(src, xb, h, w, lo, hi, left, width, 0)
        else:
            self.fast.to_nchwc(src.read(a, b), padding=(a - lo, hi - b, left, right), out=xb, threads=self.threads)
        res = None
        if p["has_residual"]:
            res = band_as(rings[1], r0, r1, True, scratch, "rband", self.threads)
        y = dst if (dst.ndim == 5 and dst.flags.c_contiguous) else \
            scratch.get("yband", (n, self.cb_out, R, self.out_shape[3], LANES), np.float32)
        if self.algorithm == "direct":
            self.fast.direct_nchwc(y, xb, self.prepared, res, stride=p["stride"], dilation=p["dilation"],
                                   relu=p["relu"], act=p.get("act"), threads=self.threads)
        else:
            self.fast.conv2d_run_nchwc(self.algorithm, y, xb, self.prepared, res, stride=p["stride"],
                                       padding=self.hpad, dilation=p["dilation"], relu=p["relu"],
                                       act=p.get("act"), threads=self.threads)
        if y is not dst:
            store_band(y, dst, self.out_shape[1], self.threads)

    def run(self, rings, scratch, r0, r1, dst):
        lo, hi = self.layer.windows[0].rows(r0, r1)        # the input rows of the band, unclipped
        if self.blocked:
            return self._run_blocked(rings, scratch, r0, r1, dst, lo, hi)
        p = self.p
        R = r1 - r0
        n, c, h, w = self.in_shapes[0]
        src = rings[0]
        a, b = max(lo, 0), min(hi, h)
        if lo >= 0 and hi <= h and src.full and src.buf.flags.c_contiguous and (n == 1 and c == 1):
            xb = src.buf[:, :, lo:hi]                                # contiguous already: no copy
        else:
            xb = scratch.get("xband", (n, c, hi - lo, w), np.float32)
            if a > lo:
                xb[:, :, :a - lo] = 0
            if hi > b:
                xb[:, :, max(b, a) - lo:] = 0
            if b > a:
                if src.blocked:
                    self.fast.from_nchwc(src.read(a, b), c, out=xb[:, :, a - lo:b - lo], threads=self.threads)
                else:
                    src.read_into(a, b, xb[:, :, a - lo:b - lo])
        if dst.ndim == 5:
            # im2col, groups 1: NCHW band in, NCHW16c rows out (conv2d_run_to_nchwc)
            res = band_as(rings[1], r0, r1, True, scratch, "rband", self.threads) if p["has_residual"] else None
            y = dst if dst.flags.c_contiguous else \
                scratch.get("yband", (n, self.cb_out, R, self.out_shape[3], LANES), np.float32)
            self.fast.conv2d_run_to_nchwc(self.algorithm, y, xb, self.prepared, res, stride=p["stride"],
                                          padding=self.hpad, dilation=p["dilation"], relu=p["relu"],
                                          act=p.get("act"), threads=self.threads)
            if y is not dst:
                dst[...] = y
            return
        res = None
        if p["has_residual"]:
            res = band_as(rings[1], r0, r1, False, scratch, "rband", self.threads)
        y = dst if dst.ndim == 4 and dst.flags.c_contiguous and dst.dtype == np.float32 else \
            scratch.get("yband", (n, self.out_shape[1], R, self.out_shape[3]), np.float32)
        self.fast.conv2d_run(self.algorithm, y, xb, self.prepared, res, relu=p["relu"], act=p.get("act"),
                             threads=self.threads,
                             **self.kw_args)
        if y is not dst:
            store_band(y, dst, self.out_shape[1], self.threads)


def _copy_into(out, a):
    out[...] = a
    return out


def band_as(ring, r0: int, r1: int, blocked: bool, scratch: Scratch, slot: str, threads=None) -> np.ndarray:
    """Rows [r0, r1) of a ring as a C-contiguous band in the wanted layout (NCHW16c if
    `blocked`, else NCHW): a view when possible, else one copy / conversion into scratch."""
    from ..kernels import conv as fast
    rows = ring.read(r0, r1)
    if ring.blocked == blocked:
        if rows.flags.c_contiguous:
            return rows
        return _copy_into(scratch.get(slot, rows.shape, rows.dtype), rows)
    if blocked:
        n, c, R, w = rows.shape
        out = scratch.get(slot, (n, -(-c // LANES), R, w, LANES), np.float32)
        fast.to_nchwc(rows, out=out, threads=threads)
        return out
    n, _, R, w, _ = rows.shape
    out = scratch.get(slot, (n, ring.channels, R, w), np.float32)
    fast.from_nchwc(rows, ring.channels, out=out, threads=threads)
    return out


def store_band(y: np.ndarray, dst: np.ndarray, channels: int, threads=None) -> None:
    """Copy a computed band into the output rows, converting the layout when they differ."""
    if y.ndim == dst.ndim:
        dst[...] = y
        return
    from ..kernels import conv as fast
    if y.ndim == 5:
        fast.from_nchwc(y, channels, out=dst, threads=threads)
    else:
        fast.to_nchwc(y, out=dst, threads=threads)


class ReferenceConvRunner(Runner):
    """The reference conv on the padded band: other dtypes than float32 (float16 computes in
    float32, as the reference does), or the "reference" algorithm. The band's input rows
    [lo, hi) with zero rows outside [0, H) (the top/bottom padding), the left/right padding
    left to the kernel: (hi - lo - span) // stride + 1 = r1 - r0 output rows."""

    def __init__(self, layer: BandLayer):
        super().__init__(layer)
        self.p = layer.params
        self.w = self.consts[0]
        self.b = self.consts[1] if self.p["has_bias"] else None
        self.kh = self.w.shape[2]

    def scratch_need(self):
        n, c, _, w = self.in_shapes[0]
        rin = (self.band - 1) * self.p["stride"][0] + self.p["dilation"][0] * (self.kh - 1) + 1
        return {"xband": n * c * rin * w}

    def run(self, rings, scratch, r0, r1, dst):
        p = self.p
        lo, hi = self.layer.windows[0].rows(r0, r1)
        n, c, h, w = self.in_shapes[0]
        xb = _fill_band(rings[0], scratch, "xband", self.in_shapes[0], lo, hi, 0, w, 0, self.dtype)
        res = rings[1].read(r0, r1) if p["has_residual"] else None
        dst[...] = ref.conv2d(xb, self.w, self.b, p["stride"], (0, 0) + tuple(p["padding"][2:]), p["dilation"],
                              p["groups"], residual=res, relu=p["relu"], act=p.get("act"))


def _fill_band_b(ring, scratch: Scratch, slot: str, shape, lo: int, hi: int, left: int, width: int,
                 pad_value, dtype) -> np.ndarray:
    """_fill_band on an NCHW16c ring: (N, Cb, hi - lo, width, 16)."""
    n, c, h, w = shape
    xp = scratch.get(slot, (n, -(-c // LANES), hi - lo, width, LANES), dtype)
    return _fill_rows(ring, xp, h, w, lo, hi, left, width, pad_value)


class PoolRunner(Runner):
    def __init__(self, layer: BandLayer):
        super().__init__(layer)
        p = layer.params
        self.p = p
        self.is_max = layer.kind == "max_pool"
        # float max pooling: kernels.pool.max_pool_rows straight from the ring (both layouts)
        self.fast_max = self.is_max and self.dtype in (np.float32, np.float64)
        self.k = p["kernel_size"]
        self.d = p.get("dilation", (1, 1))
        n, c, h, w = self.in_shapes[0]
        ho, wo = self.out_shape[2], self.out_shape[3]
        t, b, l, r = p["padding"]
        s = p["stride"]
        self.width = max(w + l + r, (wo - 1) * s[1] + self.d[1] * (self.k[1] - 1) + 1)
        self.acc = ref._acc_dtype(self.dtype)
        if not self.is_max:
            inc = p["count_include_pad"]

            def counts(size, k, st, lo, hi, out):
                # window [i*st - lo, i*st - lo + k) counted inside [-lo, size + hi) or [0, size)
                a0, a1 = (-lo, size + hi) if inc else (0, size)
                start = np.arange(out) * st - lo
                return (np.minimum(start + k, a1) - np.maximum(start, a0)).astype(self.acc)
            self.div_rows = counts(h, self.k[0], s[0], t, b, ho)
            self.div_cols = counts(w, self.k[1], s[1], l, r, wo)

    def scratch_need(self):
        n, c, _, _ = self.in_shapes[0]
        rin = (self.band - 1) * self.p["stride"][0] + self.d[0] * (self.k[0] - 1) + 1
        need = {"pad": n * c * rin * self.width}
        if self.fast_max:      # max pooling reads the rings in place: no band
            need["pad"] = 0
        elif self.out_blocked:
            need["pad"] = n * -(-c // LANES) * rin * self.width * LANES
        if not self.is_max and self.dtype != self.acc:
            need["acc"] = n * c * self.band * self.out_shape[3]
        return need

    def run(self, rings, scratch, r0, r1, dst):
        p = self.p
        lo, hi = self.layer.windows[0].rows(r0, r1)
        pad = -np.inf if self.is_max else 0
        dt = self.dtype if self.is_max else self.acc
        R, wo = r1 - r0, self.out_shape[3]
        sh, sw = p["stride"]
        dh, dw = self.d
        if self.fast_max:
            src = rings[0]
            src.check_read(max(lo, 0), min(hi, src.height))     # the rows are held
            if src.blocked != (dst.ndim == 5):  # pragma: no cover - the layout assignment keeps both sides alike
                raise ValueError("pooling: input and output rows must have one layout")
            x5, y5 = (src.buf, dst) if src.blocked else (src.buf[..., None], dst[..., None])
            pool.max_pool_rows(y5, x5, src.capacity, r0, src.height, kernel_size=self.k, stride=p["stride"],
                               padding=p["padding"], dilation=self.d, threads=1)
            return
        blocked = rings[0].blocked
        if blocked != (dst.ndim == 5):  # pragma: no cover - the layout assignment keeps both sides alike
            raise ValueError("pooling: input and output rows must have one layout")
        fill = _fill_band_b if blocked else _fill_band
        xp = fill(rings[0], scratch, "pad", self.in_shapes[0], lo, hi, p["padding"][2], self.width, pad, dt)
        y = dst if dt == dst.dtype else scratch.get("acc", dst.shape, dt)
        first = True
        for a in range(self.k[0]):
            for b in range(self.k[1]):
                tap = xp[:, :, a * dh:a * dh + (R - 1) * sh + 1:sh, b * dw:b * dw + (wo - 1) * sw + 1:sw]
                if first:
                    y[...] = tap
                    first = False
                elif self.is_max:
                    np.maximum(y, tap, out=y)
                else:
                    y += tap
        if not self.is_max:
            div = self.div_rows[r0:r1, None] * self.div_cols[None, :]      # (R, Wo)
            y /= div[:, :, None] if blocked else div                      # NCHW16c: the lanes innermost
        if y is not dst:
            dst[...] = y


class RowLocalRunner(Runner):
    """Row-local ops on the rows [r0, r1) of their inputs: relu, dropout, concat and the add of
    two activation operands on the ring rows in place (either layout); activation, prelu,
    add/sub/mul/div (a constant operand broadcast over the rows) and channel_norm through their
    layer kernels (`ROW_KERNELS`) on contiguous row bands (the ring rows, a view or one copy;
    either layout); any other op through its reference kernel on NCHW rows."""

    def __init__(self, layer: BandLayer):
        super().__init__(layer)
        self.threads = None          # set by the stream mode
        p = layer.params
        self.plain_add = layer.kind == "add" and len(layer.in_shapes) == 2 and \
            p.get("act") is None and not layer.consts

    def scratch_need(self):
        if self.layer.kind in ("relu", "dropout", "concat") or self.plain_add:
            return {}
        n, c, _, w = self.out_shape
        cb = -(-c // LANES) * LANES if self.out_blocked else c
        need = {f"in{k}": n * (-(-s[1] // LANES) * LANES if self.out_blocked else s[1]) * self.band * s[3]
                for k, s in enumerate(self.in_shapes)}
        need["yband"] = n * cb * self.band * w
        return need

    def run(self, rings, scratch, r0, r1, dst):
        op, p = self.layer.kind, self.layer.params
        if op == "relu":
            np.maximum(rings[0].read(r0, r1), 0, out=dst)
        elif op == "dropout":
            dst[...] = rings[0].read(r0, r1)
        elif op == "concat":
            c0 = 0
            for ring in rings:
                x = ring.read(r0, r1)
                dst[:, c0:c0 + x.shape[1]] = x
                c0 += x.shape[1]
        elif self.plain_add:
            np.add(rings[0].read(r0, r1), rings[1].read(r0, r1), out=dst)
            if p["relu"]:
                np.maximum(dst, 0, out=dst)
        else:
            self._run_kernel(rings, scratch, r0, r1, dst)

    def _run_kernel(self, rings, scratch, r0, r1, dst):
        """The op's layer kernel (or reference) on contiguous bands, its inputs in op order."""
        blocked = dst.ndim == 5
        xs = [band_as(ring, r0, r1, blocked, scratch, f"in{k}", self.threads) for k, ring in enumerate(rings)]
        args = [None] * (len(xs) + len(self.consts))
        for i, x in zip(self.layer.act_positions, xs):
            args[i] = x
        for i, cst in zip(self.layer.const_positions, self.consts):
            args[i] = cst
        kernel = ROW_KERNELS.get(self.layer.kind)
        if kernel is None or dst.dtype != np.float32:
            if blocked:  # pragma: no cover - band_layout gives these ops NCHW rings (validate_stream checks)
                raise ValueError(f"{self.layer.name}: {self.layer.kind} has no NCHW16c band kernel")
            dst[...] = self.layer.reference(*args, **self.layer.params)
            return
        y = dst if dst.flags.c_contiguous else scratch.get("yband", dst.shape, dst.dtype)
        kernel(y, *args, layout="nchwc" if blocked else "nchw", channels=self.out_shape[1], threads=self.threads,
               **self.layer.params)
        if y is not dst:
            dst[...] = y


def make_runner(layer: BandLayer) -> Runner:
    """The band kernel of a layer: by op family (conv, pool; everything else is row-local)."""
    if layer.kind == "conv2d":
        if layer.params.get("algorithm", "reference") != "reference" and np.dtype(layer.dtype) == np.float32:
            return KernelConvRunner(layer)
        return ReferenceConvRunner(layer)
    if layer.kind in ("max_pool", "avg_pool"):
        return PoolRunner(layer)
    return RowLocalRunner(layer)
