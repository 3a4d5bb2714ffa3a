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

import bisect

import numpy as np

from dataclasses import dataclass, field
from typing import Callable

from . import broadcast, movement, norm, pool
from . import conv_transpose as convt
from . import resize as resize_kernel
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
               "maximum": broadcast.KERNELS["maximum"], "minimum": broadcast.KERNELS["minimum"],
               "atan2": broadcast.KERNELS["atan2"],
               "channel_norm": norm.channel_norm, "slice": movement.slice_}


@dataclass(frozen=True)
class RowWindow:
    """Output row r needs input rows r*stride + offset + [0, span)."""
    stride: int = 1
    offset: int = 0
    span: int = 1

    def rows(self, r0: int, r1: int) -> tuple[int, int]:
        """Input rows [lo, hi) needed for output rows [r0, r1), unclipped (may be < 0 or > H)."""
        return r0 * self.stride + self.offset, (r1 - 1) * self.stride + self.offset + self.span


    def fits(self, have: int) -> int:
        """Output rows [0, fits) need only input rows below `have` (may be <= 0)."""
        return (have - self.offset - self.span) // self.stride + 1

    def param(self) -> list:
        """The band instruction's form (`window_from_param` reads it back)."""
        return [self.stride, self.offset, self.span]


IDENTITY = RowWindow()


@dataclass(frozen=True)
class RowTable:
    """Output row r needs input rows [lo[r], hi[r]) (both non-decreasing, within [0, H]): the
    row maps that are no integer-stride window (resize, conv_transpose2d, pad,
    adaptive_avg_pool), tabulated from the op's params by `row_window`."""
    lo: tuple
    hi: tuple

    def rows(self, r0: int, r1: int) -> tuple[int, int]:
        return self.lo[r0], self.hi[r1 - 1]

    def fits(self, have: int) -> int:
        return bisect.bisect_right(self.hi, have)

    def param(self) -> dict:
        return {"lo": list(self.lo), "hi": list(self.hi)}


def window_from_param(v) -> RowWindow | RowTable:
    """A band instruction's window: [stride, offset, span] or {"lo": [...], "hi": [...]}."""
    if isinstance(v, dict):
        if set(v) != {"lo", "hi"}:
            raise ValueError(f"window {sorted(v)}: expected keys 'lo' and 'hi'")
        lo, hi = v["lo"], v["hi"]
        if not isinstance(lo, (list, tuple)) or not isinstance(hi, (list, tuple)) or len(lo) != len(hi) or \
                any(isinstance(a, bool) or not isinstance(a, int) for a in list(lo) + list(hi)):
            raise ValueError("window tables 'lo' and 'hi' must be integer lists of one length")
        return RowTable(tuple(int(a) for a in lo), tuple(int(a) for a in hi))
    if not isinstance(v, (list, tuple)) or len(v) != 3 or any(isinstance(a, bool) or not isinstance(a, int)
                                                               for a in v):
        raise ValueError(f"window {v!r}: expected [stride, offset, span] or {{'lo': [...], 'hi': [...]}}")
    return RowWindow(*(int(a) for a in v))


# the ops `row_window` tabulates and `MappedRunner` runs (the IR's ops.ROW_MAPPED group)
ROW_MAPPED = frozenset({"resize", "conv_transpose2d", "pad", "adaptive_avg_pool", "pixel_shuffle"})


def row_slice(kind: str, params: dict) -> bool:
    """A slice of rows (axis 2 of (N, C, H, W)) in their order: a row-mapped op, where channel and column
    slices are row-local. YOLOv5's Focus, `x[..., ::2, ::2]`, is one of rows and one of columns. Rows
    reversed (a negative step: torch.flip of H) are neither: the streaming compiler refuses them."""
    return kind == "slice" and params["axis"] % 4 == 2 and params["step"] > 0


def slice_window(params: dict, height: int) -> RowWindow:
    """A row slice's window: output row r is input row start + r * step, its start clipped to the
    height as Python's slices clip (positive steps: `row_slice`)."""
    start = slice(params["start"], params["stop"], params["step"]).indices(height)[0]
    return RowWindow(params["step"], start, 1)


def _table(lo, hi, height: int) -> RowTable:
    """The monotone hull of per-row needs [lo[r], hi[r]) (rows needing nothing: lo >= hi):
    lo the suffix minimum, hi the prefix maximum, clipped to [0, H], lo <= hi."""
    lo = np.asarray(lo, np.int64)
    hi = np.asarray(hi, np.int64)
    empty = lo >= hi
    lo = np.where(empty, height, np.clip(lo, 0, height))
    hi = np.where(empty, 0, np.clip(hi, 0, height))
    lo = np.minimum.accumulate(lo[::-1])[::-1]
    hi = np.maximum.accumulate(hi)
    lo = np.minimum(lo, hi)
    return RowTable(tuple(int(v) for v in lo), tuple(int(v) for v in hi))


def row_window(kind: str, params: dict, in_shape, out_shape, weight_shape=None) -> RowTable:
    """The row table of a ROW_MAPPED op's (first) input, from its params and shapes: what the
    compiler records in the band instruction and the package loader recomputes."""
    h, ho = int(in_shape[2]), int(out_shape[2])
    r = np.arange(ho, dtype=np.int64)
    if kind == "resize":
        sh = params["scales"][0] if params.get("scales") else None
        lo, hi = ref.resize_rows(h, ho, sh, params["mode"], params["coord"], params["nearest_mode"],
                                 params.get("arith", "aten"), params.get("cubic_a", -0.75))
    elif kind == "conv_transpose2d":
        # output row oh gets kernel row kh from input row (oh + pt - kh*dh) / sh when divisible
        kh, (sh, _), (dh, _), pt = weight_shape[2], params["stride"], params["dilation"], params["padding"][0]
        lo = -((-(r + pt - (kh - 1) * dh)) // sh)
        hi = (r + pt) // sh + 1
    elif kind == "pad":
        top, bottom = params["pads"][4], params["pads"][5]
        if params["mode"] == "constant":
            src = r - top
            inside = (src >= 0) & (src < h)
            lo, hi = np.where(inside, src, h), np.where(inside, src + 1, 0)
        else:
            src = movement._edge_index(h, top, bottom, params["mode"])
            lo, hi = src, src + 1
    elif kind == "adaptive_avg_pool":
        lo, hi = ref.adaptive_windows(h, ho)
    elif kind == "pixel_shuffle":       # output row R: input row R // f (unshuffle: rows [R f, R f + f))
        f = params["factor"]
        lo = r * f if params["inverse"] else r // f
        hi = lo + (f if params["inverse"] else 1)
    else:
        raise ValueError(f"{kind} has no row table")
    return _table(lo, hi, h)


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
    if kind == "resize":          # kernels/resize.py has an NCHW16c form
        return "same", True, True
    if kind == "conv_transpose2d":  # the phase kernel (NCHW16c, or NCHW through a conversion)
        from .conv import transpose
        return ("same", True, True) if transpose.applies(params["groups"]) else ("nchw", False, False)
    if kind in ("max_pool", "avg_pool"):
        return "same", True, True
    if kind in BLOCKED_ROW_OPS:   # a concat of whole channel blocks: every input but the last x16
        if kind != "concat" or all(c % LANES == 0 for c in in_channels[:-1]):
            if kind != "add" or all(_channel_const(s) for s in const_shapes):
                return "same", True, True
        return "nchw", False, False
    if kind == "slice":       # kernels/movement.py's slice_: lane copies of channels, or columns
        return "same", True, True
    if kind == "pixel_shuffle":   # NCHW bands, converted from / to NCHW16c rings by the band kernel (the convs
        return "any", True, True  # around a super-resolution upsampler keep their NCHW16c forms)
    if kind in ROW_KERNELS:   # their layer kernels' NCHW16c forms; binary ops: per-channel constants
        # (not a div by a constant: broadcast.binary's blocked per-channel loop divides the padded
        # lanes by 0, which numba raises as ZeroDivisionError)
        if kind not in ("sub", "mul", "div", "maximum", "minimum", "atan2") or (kind != "div" or not const_shapes) and \
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
        extra = {"in_channels": [sh[1] for sh in self.in_shapes]} if self.layer.kind == "slice" else {}
        kernel(y, *args, layout="nchwc" if blocked else "nchw", channels=self.out_shape[1], threads=self.threads,
               **extra, **self.layer.params)
        if y is not dst:
            dst[...] = y


class MappedRunner(Runner):
    """The ROW_MAPPED ops (their rows come from a `RowTable`), each through its layer kernel on
    the band of input rows [lo, hi) the table gives for output rows [r0, r1):

    resize             kernels/resize.py with its `band` argument (either layout);
    conv_transpose2d   the phase kernel (kernels/conv/transpose.py, NCHW16c or NCHW) or the GEMM +
                       col2im kernel (kernels/conv_transpose.py) on the input band [B0, B1) with
                       top padding r0 + pad_top - B0 * stride: rows of the band outside [lo, hi)
                       are zeros (they only feed output rows outside [r0, r1));
    pad                the rows mapped through the pad's index (movement._edge_index), W padded by
                       kernels/movement.py's pad, rows of the constant border filled (NCHW);
    adaptive_avg_pool  its reference (kernels/reduce.py) with its `band` argument (NCHW);
    pixel_shuffle      NCHW16c rings in and out: `movement.pixel_shuffle_band_nchwc`, a lane gather of
                       the output rows [r0, r1); else kernels/movement.py's on the NCHW band of input
                       rows, the rows [r0, r1) of its result (an unshuffle's band gives exactly those),
                       an NCHW16c ring on one side converted (`band_as`, `store_band`);
    slice of rows      every step-th row of the band (either layout; a `RowWindow`, `slice_window`)."""

    def __init__(self, layer: BandLayer):
        super().__init__(layer)
        self.threads = None          # set by the stream mode
        self.win = layer.windows[0]
        self.p = p = layer.params
        self.height = self.in_shapes[0][2]
        if layer.kind == "conv_transpose2d":
            from .conv import transpose
            self.w = self.consts[0]
            self.b = self.consts[1] if p["has_bias"] else None
            self.phase = self.dtype == np.float32 and transpose.applies(p["groups"])
            self.prepared = transpose.prepare(self.w, self.b, p["groups"]) if self.phase else None
        if layer.kind == "pad":
            top, bottom = p["pads"][4], p["pads"][5]
            if p["mode"] == "constant":
                src = np.arange(self.out_shape[2]) - top
                self.src = np.where((src >= 0) & (src < self.height), src, -1)
            else:
                self.src = movement._edge_index(self.height, top, bottom, p["mode"])

    def _in_rows(self, r0: int, r1: int) -> int:
        lo, hi = self.win.rows(r0, r1)
        return hi - lo

    def _convt_band(self, r0: int, r1: int) -> tuple[int, int, int, int, int]:
        """(lo, hi, B0, B1, top padding): the input rows held and the zero-extended band."""
        p = self.p
        lo, hi = self.win.rows(r0, r1)
        sh, dh, kh, pt = p["stride"][0], p["dilation"][0], self.w.shape[2], p["padding"][0]
        b0 = min(lo, (r0 + pt) // sh)                     # top padding >= 0
        top = r0 + pt - b0 * sh
        # enough rows below for r1 - r0 output rows (zeros: they feed rows >= r1 only)
        b1 = max(hi, b0 + 1 + max(0, -(-(r1 - r0 + top - dh * (kh - 1) - 1) // sh)))
        return lo, hi, b0, b1, top

    def scratch_need(self):
        if self.layer.kind == "slice":
            return {}
        n, c, _, w = self.in_shapes[0]
        R = self.band
        rin = max(self._in_rows(r, min(r + R, self.layer.rows)) for r in range(0, self.layer.rows))
        if self.layer.kind == "pixel_shuffle":   # NCHW bands in and out (the path without NCHW16c rings)
            need = {"xband": n * c * rin * w, "yband": n * self.out_shape[1] * R * self.out_shape[3]}
            if not self.p["inverse"]:           # the band's rows shuffled whole
                need["yfull"] = n * self.out_shape[1] * rin * self.p["factor"] * self.out_shape[3]
            return need
        if self.layer.kind == "conv_transpose2d":
            rin = max(b1 - b0 for r in range(self.layer.rows)
                      for _, _, b0, b1, _ in [self._convt_band(r, min(r + R, self.layer.rows))])
        cb = -(-c // LANES) * LANES if self.out_blocked else c
        co = -(-self.out_shape[1] // LANES) * LANES if self.out_blocked else self.out_shape[1]
        return {"xband": n * cb * max(rin, 1) * w, "yband": n * co * R * self.out_shape[3]}

    def run(self, rings, scratch, r0, r1, dst):
        kind, p = self.layer.kind, self.p
        ring = rings[0]
        if kind == "slice":     # input rows lo, lo + step, ... (hi - lo = (r1 - r0 - 1) * step + 1)
            dst[...] = ring.read(*self.win.rows(r0, r1))[:, :, ::p["step"]]
            return
        if kind == "pixel_shuffle":     # NCHW16c rings both sides: one lane gather; else on NCHW bands
            lo, hi = self.win.rows(r0, r1)
            n, co, _, wo = self.out_shape
            if dst.ndim == 5 and ring.blocked and self.dtype == np.float32:
                movement.pixel_shuffle_band_nchwc(dst, ring.read(lo, hi), channels=co, row0=r0, lo=lo,
                                                  threads=self.threads, **p)
                return
            xb = band_as(ring, lo, hi, False, scratch, "xband", self.threads)
            y = dst if dst.ndim == 4 and dst.flags.c_contiguous else \
                scratch.get("yband", (n, co, r1 - r0, wo), self.dtype)
            self._run_pixel_shuffle(xb, scratch, r0, r1, lo, y)
            if y is not dst:
                store_band(y, dst, co, self.threads)
            return
        blocked = dst.ndim == 5
        y = dst if dst.flags.c_contiguous else scratch.get("yband", dst.shape, dst.dtype)
        if kind == "conv_transpose2d":
            self._run_convt(ring, scratch, r0, r1, y, blocked)
        else:
            lo, hi = self.win.rows(r0, r1)
            if kind == "pad":
                self._run_pad(ring, scratch, r0, r1, lo, hi, y)
            elif hi <= lo:  # pragma: no cover - a resize / adaptive pool row reads at least one row
                raise ValueError(f"{self.layer.name}: rows [{r0}, {r1}) read no input rows")
            else:
                xb = band_as(ring, lo, hi, blocked, scratch, "xband", self.threads)
                if kind == "resize":
                    resize_kernel.resize(y, xb, layout="nchwc" if blocked else "nchw", channels=self.out_shape[1],
                                         threads=self.threads, band=(r0, lo, self.height), **p)
                else:
                    y[...] = ref.adaptive_avg_pool(xb, tuple(p["output_size"]), band=(r0, r1, lo, self.height))
        if y is not dst:
            dst[...] = y

    def _run_convt(self, ring, scratch, r0, r1, y, blocked):
        p = self.p
        lo, hi, b0, b1, top = self._convt_band(r0, r1)
        n, c, h, w = self.in_shapes[0]
        shape = (n, -(-c // LANES), b1 - b0, w, LANES) if blocked else (n, c, b1 - b0, w)
        xb = scratch.get("xband", shape, self.dtype)
        xb[:, :, :lo - b0] = 0
        xb[:, :, hi - b0:] = 0
        if hi > lo:
            ring.read_into(lo, hi, xb[:, :, lo - b0:hi - b0])
        pad = (top, 0, p["padding"][2], p["padding"][3])
        if self.phase:
            from .conv import transpose
            run = transpose.run_nchwc if blocked else transpose.run
            run(y, xb, self.prepared, stride=p["stride"], padding=pad, dilation=p["dilation"], relu=p["relu"],
                act=p.get("act"), threads=self.threads)
        elif self.dtype == np.float32:
            convt.conv_transpose2d(y, xb, self.w, *([self.b] if p["has_bias"] else []),
                                   **dict(p, padding=pad, output_padding=(0, p["output_padding"][1])),
                                   threads=self.threads)
        else:   # other dtypes: the reference on the band, its rows [0, r1 - r0)
            full = ref.conv_transpose2d(xb, self.w, self.b, p["stride"], pad, (0, p["output_padding"][1]),
                                        p["dilation"], p["groups"], act=p.get("act") if p.get("act") is not None
                                        else (("relu", 0.0, 0.0) if p["relu"] else None))
            y[...] = full[:, :, :r1 - r0]

    def _run_pixel_shuffle(self, xb, scratch, r0, r1, lo, y):
        """Input rows [lo, hi) shuffle to output rows [lo f, hi f) (an unshuffle's to [r0, r1))."""
        p = self.p
        if p["inverse"]:
            movement.pixel_shuffle(y, xb, **p)
            return
        f = p["factor"]
        n, c, rows, w = xb.shape
        full = scratch.get("yfull", (n, c // (f * f), rows * f, w * f), self.dtype)
        movement.pixel_shuffle(full, xb, **p)
        y[...] = full[:, :, r0 - lo * f:r1 - lo * f]

    def _run_pad(self, ring, scratch, r0, r1, lo, hi, y):
        p = self.p
        src = self.src[r0:r1]
        inside = src >= 0
        if hi > lo:
            rows = ring.read(lo, hi)
            g = np.take(rows, np.where(inside, src - lo, 0), axis=2)       # (N, C, R, W)
            pads = (0, 0, 0, 0, 0, 0, p["pads"][6], p["pads"][7])
            movement.pad(y, g, pads=pads, mode=p["mode"], value=p["value"])
        if not inside.all():
            y[:, :, ~inside] = p["value"]


def make_runner(layer: BandLayer) -> Runner:
    """The band kernel of a layer: by op family (conv, pool, row-mapped; everything else is
    row-local)."""
    if layer.kind in ROW_MAPPED or row_slice(layer.kind, layer.params):
        return MappedRunner(layer)
    if layer.kind == "conv2d":
        if layer.params.get("algorithm", "reference") != "reference" and np.dtype(layer.dtype) == np.float32:
            return KernelConvRunner(layer)
        return ReferenceConvRunner(layer)
    if layer.kind in ("max_pool", "avg_pool"):
        return PoolRunner(layer)
    return RowLocalRunner(layer)
