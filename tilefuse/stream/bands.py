"""Band kernels: one streamed layer computing output rows [r0, r1) from its input rings.

Every runner reads the input rows its band needs (`RowWindow.rows`), builds the padded band
in a scratch buffer when the op has a window, and writes its output rows into the output
ring's slots (a band that would wrap the ring is computed in scratch and stored in two pieces).

float32 conv2d: `KernelConvRunner`, the fast kernels of `kernels/conv` (weights prepared once).
With NCHW16c rings (layout "nchwc", the default; `assign_ring_layouts` picks the rings) a conv with
an NCHW16c algorithm gathers its band as NCHW16c rows and runs `direct_nchwc` (on the band
padded left/right) or `conv2d_run_nchwc` (padding (0, 0, l, r)); im2col writes NCHW16c rows
through `conv2d_run_to_nchwc`; NCHW rings go through `conv2d_run` on the gathered band as
before, and a ring of the other layout is converted one band at a time (`band_as`,
`store_band`). Max pooling reads a blocked ring in place.

Other dtypes, or kernels="numpy": `NumpyConvRunner`, per image and group (numpy im2col + one
GEMM per band, the reference algorithm on a band instead of the whole map):
    xp    (C, Rin, W + l + r)        the padded input band, Rin = (R-1)*sh + d*(kh-1) + 1
    cols  (Cg*kh*kw, R*Wo)           im2col of the band, one strided copy per tap
    out   (Og, R*Wo) = Wg (Og, Cg*kh*kw) @ cols, then + bias (+ residual rows), ReLU, in place
A 1x1 stride-1 unpadded conv multiplies the ring rows directly (no copy); a depthwise conv
accumulates its taps with broadcasting instead of a GEMM.

Pooling sums or maxes its taps over the padded band (max pads with -inf, avg with 0 and
divides by separable per-row x per-column counts, PyTorch's count_include_pad and ceil_mode
rules, as `kernels/reference.py`); max pooling of float bands is a separable numba kernel.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..kernels import reference as ref
from ..kernels.threads import Scratch
from .schedule import BandSchedule, StreamLayer

LANES = 16   # NCHW16c channel block (kernels/conv)

# target size of one im2col columns chunk (measured: 1-2 MiB best with a 1 MiB L2 per core)
COLS_BYTES = 2 << 20


class Runner:
    """Computes one layer's output band; subclasses per op family.

    Layouts (`role`): "nchw" reads and writes NCHW rings only; "same" runs on NCHW or NCHW16c
    rings but needs all its inputs and its output in one layout; "any" (the fast convs)
    converts whatever it is given. `native_in` / `native_out`: NCHW16c without a conversion."""

    role = "nchw"
    native_in = native_out = False
    out_blocked = False          # set by the executor: its output ring is NCHW16c

    def __init__(self, layer: StreamLayer, sched: BandSchedule):
        self.layer = layer
        self.op = layer.op
        self.in_shapes = [sched.tensors[n].shape for n in layer.inputs]
        self.out_shape = sched.tensors[layer.output].shape
        self.dtype = sched.tensors[layer.output].dtype
        self.band = sched.band_rows
        self.consts = [d.value for d in layer.op.inputs if d.is_constant]

    def scratch_need(self) -> dict[str, int]:
        """Scratch elements per slot for the largest band."""
        return {}

    def cost(self) -> float:
        """Estimated seconds of the whole layer on one core (balances the pipeline stages):
        element-wise and pooling band kernels move about 1 GFLOP-equivalent per second."""
        return self.layer.flops / 1e9 + sum(int(np.prod(s)) for s in self.in_shapes) * 4 / 10e9

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

    def __init__(self, layer, sched, algorithm=None, allow_winograd=True, blocked=False):
        super().__init__(layer, sched)
        from ..kernels import conv as fast
        self.fast = fast
        p = self.op.params
        self.p = p
        w = self.consts[0]
        n, c, h, wd = self.in_shapes[0]
        t, b, l, r = p["padding"]
        self.hpad = (0, 0, l, r)
        rows = sched.step_rows(layer.index)
        self.rows_max = max(rows) if rows else 1
        typical = max(set(rows), key=rows.count) if rows else 1
        self.rin_max = self._rin(self.rows_max)
        self.kw_args = dict(stride=p["stride"], padding=self.hpad, dilation=p["dilation"], groups=p["groups"])
        if algorithm is None:
            # the whole layer's shape, as layer by layer selects (measured: a band's own shape makes
            # the cost model prefer direct over Winograd F(4,3), which is 2x faster on bands too)
            algorithm = fast.select_algorithm(self.in_shapes[0], w.shape, p["stride"], p["padding"], p["dilation"],
                                              p["groups"], allow_winograd=allow_winograd)
        self.algorithm = algorithm
        # blocked: the NCHW16c kernels (conv2d_run_nchwc / direct_nchwc) on NCHW16c bands
        self.blocked = bool(blocked) and algorithm in fast.NCHWC_ALGORITHMS and (
            p["groups"] == 1 or algorithm in ("depthwise", "grouped"))
        # native_in / native_out: reads / writes NCHW16c rings without a layout conversion
        self.native_in = self.blocked
        self.native_out = self.blocked or (bool(blocked) and algorithm == "im2col" and p["groups"] == 1)
        self.role = "any"            # converts whatever layout its rings have
        bias = self.consts[1] if p["has_bias"] else None
        self.prepared = {k: np.ascontiguousarray(v, dtype=np.float32)
                         for k, v in fast.conv2d_prepare(algorithm, w, bias, **self.kw_args,
                                                         layout="nchwc" if self.blocked else "nchw").items()}
        self.cb_in = -(-c // LANES)
        self.cb_out = -(-self.out_shape[1] // LANES)
        self.bpad = (l, r) if algorithm == "direct" else (0, 0)   # direct_nchwc reads a padded band
        self.threads = None          # set by the executor: None = all cores, 1 per pipeline stage
        self.acc = np.dtype(np.float32)

    def cost(self) -> float:
        """The conv library's cost model for this algorithm on the whole layer (it knows that
        Winograd does a quarter of the multiplies and im2col runs below the direct kernel's
        efficiency; FLOPs alone put conv1 in the same class as a Winograd layer)."""
        try:
            p = self.p
            return float(self.fast.estimate_cost(self.algorithm, self.in_shapes[0], self.consts[0].shape, p["stride"],
                                                 p["padding"], p["dilation"], p["groups"]))
        except Exception:  # the cost model is optional: FLOPs at a nominal 100 GFLOP/s
            return self.layer.flops / 100e9

    def _rin(self, rows):
        kh = self.consts[0].shape[2]
        return (rows - 1) * self.p["stride"][0] + self.p["dilation"][0] * (kh - 1) + 1

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
        if self.native_out and self.out_blocked:
            need["yband"] = ob
            if self.p["has_residual"]:
                need["rband"] = ob
        return need

    def _run_blocked(self, rings, scratch, r0, r1, dst):
        """NCHW16c band: gather the input rows (zero rows outside [0, H), and for direct zero
        columns left/right) into a contiguous blocked band, run the blocked kernel into the
        output ring's rows (or a contiguous scratch band, then one copy), epilogue fused."""
        p = self.p
        R = r1 - r0
        n, c, h, w = self.in_shapes[0]
        lo, hi = self.layer.windows[0].rows(r0, r1)
        src = rings[0]
        a, b = max(lo, 0), min(hi, h)
        left, right = self.bpad
        width = w + left + right
        xb = scratch.get("xband", (n, self.cb_in, hi - lo, width, LANES), np.float32)
        if src.blocked:
            if a > lo:
                xb[:, :, :a - lo] = 0
            if hi > b:
                xb[:, :, max(b, a) - lo:] = 0
            if left:
                xb[:, :, a - lo:b - lo, :left] = 0
            if right:
                xb[:, :, a - lo:b - lo, left + w:] = 0
            if b > a:
                src.read_into(a, b, xb[:, :, a - lo:b - lo, left:left + w])
        else:
            self.fast.to_nchwc(src.read(a, b), padding=(a - lo, hi - b, left, right), out=xb, threads=self.threads)
        res = None
        if p["has_residual"]:
            res = band_as(rings[1], r0, r1, True, scratch, "rband", self.threads)
        y = dst if (dst.ndim == 5 and dst.flags.c_contiguous) else \
            scratch.get("yband", (n, self.cb_out, R, self.out_shape[3], LANES), np.float32)
        if self.algorithm == "direct":
            self.fast.direct_nchwc(y, xb, self.prepared, res, stride=p["stride"], dilation=p["dilation"],
                                   relu=p["relu"], threads=self.threads)
        else:
            self.fast.conv2d_run_nchwc(self.algorithm, y, xb, self.prepared, res, stride=p["stride"],
                                       padding=self.hpad, dilation=p["dilation"], relu=p["relu"],
                                       threads=self.threads)
        if y is not dst:
            store_band(y, dst, self.out_shape[1], self.threads)

    def run(self, rings, scratch, r0, r1, dst):
        if self.blocked:
            return self._run_blocked(rings, scratch, r0, r1, dst)
        p = self.p
        R = r1 - r0
        n, c, h, w = self.in_shapes[0]
        lo, hi = self.layer.windows[0].rows(r0, r1)
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
        if dst.ndim == 5 and self.native_out:
            # im2col, groups 1: NCHW band in, NCHW16c rows out (conv2d_run_to_nchwc)
            res = band_as(rings[1], r0, r1, True, scratch, "rband", self.threads) if p["has_residual"] else None
            y = dst if dst.flags.c_contiguous else \
                scratch.get("yband", (n, self.cb_out, R, self.out_shape[3], LANES), np.float32)
            self.fast.conv2d_run_to_nchwc(self.algorithm, y, xb, self.prepared, res, stride=p["stride"],
                                          padding=self.hpad, dilation=p["dilation"], relu=p["relu"],
                                          threads=self.threads)
            if y is not dst:
                dst[...] = y
            return
        res = None
        if p["has_residual"]:
            res = band_as(rings[1], r0, r1, False, scratch, "rband", self.threads)
        y = dst if dst.ndim == 4 and dst.flags.c_contiguous and dst.dtype == np.float32 else \
            scratch.get("yband", (n, self.out_shape[1], R, self.out_shape[3]), np.float32)
        self.fast.conv2d_run(self.algorithm, y, xb, self.prepared, res, relu=p["relu"], threads=self.threads,
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


class NumpyConvRunner(Runner):
    def __init__(self, layer, sched):
        super().__init__(layer, sched)
        p = self.op.params
        self.p = p
        w = self.consts[0]
        self.o, self.cg, self.kh, self.kw = w.shape
        self.g = p["groups"]
        self.og = self.o // self.g
        acc = ref._acc_dtype(self.dtype)
        self.acc = acc
        # (O, Cg, kh, kw) -> (G, Og, Cg*kh*kw)
        self.wm = np.ascontiguousarray(w.astype(acc).reshape(self.g, self.og, self.cg * self.kh * self.kw))
        self.bias = self.consts[1].astype(acc).reshape(-1, 1, 1) if p["has_bias"] else None
        n, c, h, wd = self.in_shapes[0]
        t, b, l, r = p["padding"]
        self.wo = self.out_shape[3]
        self.width = wd + l + r
        self.direct = (self.kh == self.kw == 1 and p["stride"] == (1, 1) and p["padding"] == (0, 0, 0, 0)
                       and self.dtype == acc)
        self.depthwise = self.cg == 1 and self.og == 1 and self.g > 1
        self.flat = p["stride"] == (1, 1) and not self.direct
        self.role = "nchw"

    def _rin(self, rows):
        return (rows - 1) * self.p["stride"][0] + self.p["dilation"][0] * (self.kh - 1) + 1

    def scratch_need(self):
        n, c, _, _ = self.in_shapes[0]
        k = self.cg * self.kh * self.kw
        need = {}
        if not self.direct:
            need["pad"] = n * c * (self._rin(self.band) + 1) * self.width
        if self.depthwise:
            need["tap"] = self.o * self.band * self.wo
        elif self.flat:
            span = self.band * self.width
            need["cols"] = k * min(span, self._flat_chunk())
            need["gemm"] = self.og * span
        elif not self.direct:
            need["cols"] = k * min(self.band, self._row_chunk()) * self.wo
        return need

    def _flat_chunk(self) -> int:
        """Flat output positions per im2col chunk: the columns buffer stays near COLS_BYTES."""
        return max(64, COLS_BYTES // (self.cg * self.kh * self.kw * self.acc.itemsize))

    def _row_chunk(self) -> int:
        """Output rows per im2col chunk (strided convs)."""
        return max(1, COLS_BYTES // (self.cg * self.kh * self.kw * self.wo * self.acc.itemsize))

    def run(self, rings, scratch, r0, r1, dst):
        p = self.p
        x_ring = rings[0]
        R = r1 - r0
        n = self.in_shapes[0][0]
        if self.direct:
            xb = x_ring.read(r0, r1)                                  # (N, C, R, W), no padding
        else:
            lo, hi = self.layer.windows[0].rows(r0, r1)
            xb = _fill_band(x_ring, scratch, "pad", self.in_shapes[0], lo, hi, p["padding"][2],
                            self.width, 0, self.acc, extra_rows=1)    # (N, C, Rin + 1, Wp)
        res = rings[1].read(r0, r1) if p["has_residual"] else None   # (N, O, R, Wo)
        for i in range(n):
            if self.depthwise:
                self._depthwise(xb[i], dst[i], scratch, R)
                self._epilogue(dst[i], None if res is None else res[i])
                continue
            for g in range(self.g):
                gs = slice(g * self.og, (g + 1) * self.og)
                y = dst[i, gs]                                        # (Og, R, Wo): ring slots
                rg = None if res is None else res[i, gs]
                if self.direct:
                    cols = xb[i, g * self.cg:(g + 1) * self.cg].reshape(self.cg, R * self.wo)  # a view
                    self._gemm(g, cols, y)
                    self._epilogue(y, rg, gs)
                elif self.flat:
                    self._flat_gemm(xb[i], g, y, rg, scratch, R)
                else:
                    self._strided_gemm(xb[i], g, y, rg, scratch, R)

    def _gemm(self, g, cols, y):
        """y (Og, R, W') = Wg @ cols (K, R*W'), written in place when y's rows are contiguous."""
        og, R, m = y.shape
        y2 = y.reshape(og, R * m) if y.dtype == self.acc else None
        if y2 is not None and np.shares_memory(y2, y):
            np.matmul(self.wm[g], cols, out=y2)
        else:
            y[...] = (self.wm[g] @ cols).reshape(og, R, m)

    def _flat_gemm(self, xb, g, y, res, scratch, R):
        """Stride 1: im2col over the padded width. With the band flattened to xf (Cg, (Rin+1)*Wp),
        tap (a, b) of output position j = r*Wp + c is xf[:, a*dh*Wp + b*dw + j], so every tap
        row of the columns is one contiguous run; positions c >= Wo are computed and dropped
        (Wp - Wo of every Wp, a few per mille on wide images). Chunks over j keep the columns
        buffer near COLS_BYTES."""
        dh, dw = self.p["dilation"]
        cg, kh, kw, wp = self.cg, self.kh, self.kw, self.width
        xf = xb[g * cg:(g + 1) * cg].reshape(cg, -1)                  # (Cg, (Rin+1)*Wp), a view
        span = R * wp
        out = scratch.get("gemm", (self.og, span), self.acc)          # (Og, R*Wp)
        step = self._flat_chunk()
        for j0 in range(0, span, step):
            m = min(step, span - j0)
            cols3 = scratch.get("cols", (cg, kh * kw, m), self.acc)
            for a in range(kh):
                for b in range(kw):
                    o = a * dh * wp + b * dw + j0
                    cols3[:, a * kw + b] = xf[:, o:o + m]
            np.matmul(self.wm[g], cols3.reshape(cg * kh * kw, m), out=out[:, j0:j0 + m])
        out3 = out.reshape(self.og, R, wp)[:, :, :self.wo]            # (Og, R, Wo) valid columns
        gs = slice(g * self.og, (g + 1) * self.og)
        if self.bias is not None:
            np.add(out3, self.bias[gs], out=y)
        else:
            y[...] = out3
        if res is not None:
            y += res
        if self.p["relu"]:
            np.maximum(y, 0, out=y)

    def _strided_gemm(self, xb, g, y, res, scratch, R):
        """Strided convs: im2col of whole output rows (one strided copy per tap), chunks of rows."""
        sh, sw = self.p["stride"]
        dh, dw = self.p["dilation"]
        wo, cg, kh, kw = self.wo, self.cg, self.kh, self.kw
        gs = slice(g * self.og, (g + 1) * self.og)
        step = self._row_chunk()
        for q0 in range(0, R, step):
            rc = min(step, R - q0)
            cols6 = scratch.get("cols", (cg, kh, kw, rc, wo), self.acc)
            for a in range(kh):
                for b in range(kw):
                    # tap (a, b): rows (q0*sh + a*dh) + sh*[0, rc), columns b*dw + sw*[0, Wo)
                    y0 = q0 * sh + a * dh
                    cols6[:, a, b] = xb[g * cg:(g + 1) * cg, y0:y0 + (rc - 1) * sh + 1:sh,
                                        b * dw:b * dw + (wo - 1) * sw + 1:sw]
            yc = y[:, q0:q0 + rc]
            self._gemm(g, cols6.reshape(cg * kh * kw, rc * wo), yc)
            self._epilogue(yc, None if res is None else res[:, q0:q0 + rc], gs)

    def _depthwise(self, xb, y, scratch, R):
        # xb (C, Rin, Wp), y (C, R, Wo); per-channel weights (C, 1, kh, kw)
        sh, sw = self.p["stride"]
        dh, dw = self.p["dilation"]
        wo = self.wo
        w = self.wm.reshape(self.o, self.kh, self.kw)
        tap = scratch.get("tap", (self.o, R, wo), self.acc)
        y[...] = 0
        for a in range(self.kh):
            for b in range(self.kw):
                np.multiply(xb[:, a * dh:a * dh + (R - 1) * sh + 1:sh, b * dw:b * dw + (wo - 1) * sw + 1:sw],
                            w[:, a, b].reshape(-1, 1, 1), out=tap)
                y += tap

    def _epilogue(self, y, res, gs=slice(None)):
        """y (O', R, W') += bias (+ residual rows), ReLU; in place, while y is in cache."""
        if self.bias is not None:
            y += self.bias[gs]
        if res is not None:
            y += res
        if self.p["relu"]:
            np.maximum(y, 0, out=y)


@njit(nogil=True, cache=True)
def _max_pool_band(y, xp, kh, kw, sh, sw, dh, dw):
    """y (N, C, R, Wo) = max over the kh x kw taps of the padded band xp (N, C, Rin, Wp),
    separably: per output row the max of its kh input rows (contiguous, vectorized) into a
    row buffer, then the max of kw strided columns of it. kh + kw passes over a row in L1
    instead of numpy's kh * kw strided passes over the band (measured 2.2x faster, 3x3 s2)."""
    N, C, R, Wo = y.shape
    Wp = xp.shape[3]
    t = np.empty(Wp, xp.dtype)
    for n in range(N):
        for c in range(C):
            for r in range(R):
                r0 = r * sh
                for j in range(Wp):
                    t[j] = xp[n, c, r0, j]
                for a in range(1, kh):
                    row = r0 + a * dh
                    for j in range(Wp):
                        v = xp[n, c, row, j]
                        t[j] = v if v > t[j] else t[j]
                for j in range(Wo):
                    m = t[j * sw]
                    for b in range(1, kw):
                        v = t[j * sw + b * dw]
                        m = v if v > m else m
                    y[n, c, r, j] = m


@njit(nogil=True, cache=True)
def _max_pool_band_b(y, xp, kh, kw, sh, sw, dh, dw):
    """_max_pool_band on NCHW16c bands: y (N, Cb, R, Wo, 16), xp (N, Cb, Rin, Wp, 16); the
    16 lanes of a pixel are one vector."""
    N, C, R, Wo, L = y.shape
    Wp = xp.shape[3]
    t = np.empty((Wp, L), xp.dtype)
    for n in range(N):
        for c in range(C):
            for r in range(R):
                r0 = r * sh
                for j in range(Wp):
                    for l in range(L):
                        t[j, l] = xp[n, c, r0, j, l]
                for a in range(1, kh):
                    row = r0 + a * dh
                    for j in range(Wp):
                        for l in range(L):
                            v = xp[n, c, row, j, l]
                            t[j, l] = v if v > t[j, l] else t[j, l]
                for j in range(Wo):
                    for l in range(L):
                        m = t[j * sw, l]
                        for b in range(1, kw):
                            v = t[j * sw + b * dw, l]
                            m = v if v > m else m
                        y[n, c, r, j, l] = m


@njit(nogil=True, cache=True)
def _max_pool_ring_b(y, buf, cap, r0, h, w, kh, kw, sh, sw, dh, dw, pt, pl):
    """Max pooling straight from an NCHW16c ring, no padded band: y (N, Cb, R, Wo, 16) = output
    rows [r0, r0 + R); logical input row i lives in slot i % cap of buf (N, Cb, cap, W, 16).
    Padding is skipped by bounds (PyTorch: every window holds a real row and column)."""
    N, C, R, Wo, L = y.shape
    t = np.empty((w, L), buf.dtype)
    for n in range(N):
        for c in range(C):
            for r in range(R):
                base = (r0 + r) * sh - pt
                for j in range(w):
                    for l in range(L):
                        t[j, l] = -np.inf
                for a in range(kh):
                    i = base + a * dh
                    if i < 0 or i >= h:
                        continue
                    s = i % cap
                    for j in range(w):
                        for l in range(L):
                            v = buf[n, c, s, j, l]
                            t[j, l] = v if v > t[j, l] else t[j, l]
                for j in range(Wo):
                    c0 = j * sw - pl
                    for l in range(L):
                        m = -np.inf
                        for b in range(kw):
                            q = c0 + b * dw
                            if q >= 0 and q < w:
                                v = t[q, l]
                                m = v if v > m else m
                        y[n, c, r, j, l] = m


def _fill_band_b(ring, scratch: Scratch, slot: str, shape, lo: int, hi: int, left: int, width: int,
                 pad_value, dtype) -> np.ndarray:
    """_fill_band on an NCHW16c ring: (N, Cb, hi - lo, width, 16)."""
    n, c, h, w = shape
    xp = scratch.get(slot, (n, -(-c // LANES), hi - lo, width, LANES), dtype)
    return _fill_rows(ring, xp, h, w, lo, hi, left, width, pad_value)


class PoolRunner(Runner):
    def __init__(self, layer, sched):
        super().__init__(layer, sched)
        p = self.op.params
        self.p = p
        self.role = "same" if self.dtype == np.float32 else "nchw"
        self.native_in = self.native_out = self.role == "same"
        self.is_max = self.op.op == "max_pool"
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
        if self.out_blocked:   # max pooling reads the blocked ring in place: no band
            need["pad"] = 0 if self.is_max else n * -(-c // LANES) * rin * self.width * LANES
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
        if rings[0].blocked:
            if dst.ndim != 5:  # pragma: no cover - the layout assignment keeps both sides alike
                raise ValueError("pooling: NCHW16c input needs NCHW16c output rows")
            if self.is_max:
                src = rings[0]
                a, b = max(lo, 0), min(hi, src.height)
                src._check_read(a, b)                   # the rows are held (as read() checks)
                n, c, h, w = self.in_shapes[0]
                _max_pool_ring_b(dst, src.buf, src.capacity, r0, h, w, self.k[0], self.k[1], sh, sw, dh, dw,
                                 p["padding"][0], p["padding"][2])
                return
            xp = _fill_band_b(rings[0], scratch, "pad", self.in_shapes[0], lo, hi, p["padding"][2], self.width,
                              pad, dt)
            if self.is_max:
                _max_pool_band_b(dst, xp, self.k[0], self.k[1], sh, sw, dh, dw)
                return
            first = True
            for a in range(self.k[0]):
                for b in range(self.k[1]):
                    tap = xp[:, :, a * dh:a * dh + (R - 1) * sh + 1:sh, b * dw:b * dw + (wo - 1) * sw + 1:sw]
                    if first:
                        dst[...] = tap
                        first = False
                    else:
                        dst += tap
            dst /= (self.div_rows[r0:r1, None] * self.div_cols[None, :])[:, :, None]
            return
        xp = _fill_band(rings[0], scratch, "pad", self.in_shapes[0], lo, hi, p["padding"][2], self.width,
                        pad, dt)
        if self.is_max and dst.dtype in (np.float32, np.float64):
            _max_pool_band(dst, xp, self.k[0], self.k[1], sh, sw, dh, dw)   # fast path
            return
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
            y /= self.div_rows[r0:r1, None] * self.div_cols[None, :]
        if y is not dst:
            dst[...] = y


class RowLocalRunner(Runner):
    def __init__(self, layer, sched):
        super().__init__(layer, sched)
        ok = self.dtype == np.float32 and self.op.op in ("relu", "add", "dropout", "concat")
        if self.op.op == "concat":   # whole channel blocks: every input but the last a multiple of 16
            ok = ok and all(s[1] % LANES == 0 for s in self.in_shapes[:-1])
        self.role = "same" if ok else "nchw"
        self.native_in = self.native_out = ok

    def scratch_need(self):
        return {}

    def run(self, rings, scratch, r0, r1, dst):
        op, p = self.op.op, self.op.params
        xs = [ring.read(r0, r1) for ring in rings]
        if op == "relu":
            np.maximum(xs[0], 0, out=dst)
        elif op == "add":
            np.add(xs[0], xs[1], out=dst)
            if p["relu"]:
                np.maximum(dst, 0, out=dst)
        elif op == "scale":
            alpha, beta = self.consts
            dst[...] = ref.scale(xs[0], alpha, beta)
        elif op == "batch_norm":
            dst[...] = ref.batch_norm(xs[0], *self.consts, eps=p["eps"])
        elif op == "dropout":
            dst[...] = xs[0]
        elif op == "local_response_norm":
            dst[...] = ref.local_response_norm(xs[0], **p)
        elif op == "concat":
            c0 = 0
            for x in xs:
                dst[:, c0:c0 + x.shape[1]] = x
                c0 += x.shape[1]
        else:  # pragma: no cover - schedule.STREAMABLE and this table must agree
            raise NotImplementedError(f"{self.op.name}: no band kernel for op '{op}'")


def _forced(algorithm, layer: StreamLayer):
    """A forced algorithm where the conv library can run it on this layer, else None (select)."""
    if algorithm is None:
        return None
    from ..kernels import conv as fast
    p = layer.op.params
    t, b, l, r = p["padding"]
    w = layer.op.inputs[1].shape
    x = layer.op.inputs[0].shape
    ok = fast.candidates(x, w, p["stride"], p["padding"], p["dilation"], p["groups"])
    ok_band = fast.candidates(x, w, p["stride"], (0, 0, l, r), p["dilation"], p["groups"])
    return algorithm if algorithm in ok and algorithm in ok_band else None


def make_runner(layer: StreamLayer, sched: BandSchedule, kernels: str = "fast", winograd: bool = True,
                algorithm: str | None = None, layout: str = "nchwc") -> Runner:
    if layer.kind == "conv2d":
        if layer.op.outputs[0].dtype == np.float32 and kernels == "fast":
            return KernelConvRunner(layer, sched, algorithm=_forced(algorithm, layer), allow_winograd=winograd,
                                    blocked=layout == "nchwc")
        return NumpyConvRunner(layer, sched)
    if layer.kind in ("max_pool", "avg_pool"):
        r = PoolRunner(layer, sched)
    else:
        r = RowLocalRunner(layer, sched)
    if layout != "nchwc":
        r.role, r.native_in, r.native_out = "nchw", False, False
    return r


def assign_ring_layouts(sched: BandSchedule, runners: list[Runner]) -> set[str]:
    """The ring tensors kept in NCHW16c. A ring is blocked when its producer writes NCHW16c
    natively, some consumer reads it natively and none needs NCHW; then every "same" layer
    (pooling, element-wise) with one NCHW tensor gets all of its tensors NCHW, to a fixpoint.
    Whole tensors (the network input, the sinks) stay NCHW."""
    blocked = set()
    for name, t in sched.tensors.items():
        if t.whole:
            continue
        prod = runners[t.producer]
        cons = [runners[c] for c, _ in t.consumers]
        if prod.native_out and any(c.native_in for c in cons) and all(c.role != "nchw" for c in cons):
            blocked.add(name)
    changed = True
    while changed:
        changed = False
        for layer, r in zip(sched.layers, runners):
            if r.role != "same":
                continue
            names = list(layer.inputs) + [layer.output]
            if any(n in blocked for n in names) and not all(n in blocked for n in names):
                blocked.difference_update(names)
                changed = True
    return blocked
