"""What every mapping strategy shares: per-layer timelines and memories, transfers, and the
streamed execution of the memory-bound ops (pooling, element-wise, normalization).

A strategy subclass maps conv2d / linear its paper's way (`layer_conv2d`, `layer_linear`); every
other op goes through `stream_layer`: the op's channel planes (or whole images, for ops that mix
channels) stream in chunks through an on-chip memory, double buffered, each chunk computed by
the op's reference kernel.
"""
from __future__ import annotations

import math

import numpy as np

from ...errors import UnsupportedOpError
from ...ir import ops
from ...ir.ops import schema
from ...kernels import reference as ref
from ..machine import CapacityError, Scratchpad, Timeline, Traffic
from ..report import Layer, LayerReport, SimReport
from ..spec import Target, require


def schema_ref(kernel: str, name: str):
    return schema(kernel, name).reference


# Ops whose output channel c reads only channel c of every input (constants broadcast over the
# others): they stream in chunks of channel planes. Every other op streams whole images.
CHANNEL_LOCAL = frozenset(ops.ELEMENTWISE | ops.POOL | {"global_avg_pool", "scale", "batch_norm", "resize"})
# Channel-local ops whose output row r reads input rows r*s - pad + [0, k): they may stream in
# row bands of one plane when a plane does not fit.
ROW_BANDS = frozenset(ops.ELEMENTWISE | {"scale", "batch_norm", "max_pool", "avg_pool", "global_avg_pool"})
# 1-D constants that are per-channel parameters (elsewhere a 1-D constant broadcasts along W).
CHANNEL_VECTORS = ("scale", "batch_norm", "prelu")
# vector operations per output (or input) element of the streamed ops
OPS_PER_ELEMENT = {"relu": 1, "add": 1, "scale": 2, "batch_norm": 2, "global_avg_pool": 1, "concat": 0,
                   "softmax": 4, "local_response_norm": 8}


def gather(x: np.ndarray | None, n0: int, n1: int, c0: int, c1: int, r0: int, nr: int, q0: int, nq: int,
           rstep: int = 1, qstep: int = 1, batch_pad: int | None = None) -> np.ndarray | None:
    """A DMA's source tile x[n0:n1, c0:c1, r0::rstep (nr rows), q0::qstep (nq cols)], positions
    outside the tensor (convolution padding, ragged edges, padded batch) read as zero.
    (N, C, H, W) -> (n1-n0 or batch_pad, c1-c0, nr, nq)."""
    if x is None:
        return None
    n, c, h, w = x.shape
    nb = batch_pad or (n1 - n0)
    out = np.zeros((nb, c1 - c0, nr, nq), x.dtype)
    rows = r0 + rstep * np.arange(nr)
    cols = q0 + qstep * np.arange(nq)
    rk, ck = (rows >= 0) & (rows < h), (cols >= 0) & (cols < w)
    nn = min(n1, n) - n0
    if nn <= 0 or not rk.any() or not ck.any():
        return out
    src = x[n0:n0 + nn, c0:c1][:, :, rows[rk]][:, :, :, cols[ck]]
    out[:nn][:, :, np.flatnonzero(rk)[:, None], np.flatnonzero(ck)[None, :]] = src
    return out


class ConvGeom:
    """A conv (or a linear layer seen as a 1x1 conv) layer's sizes, unpacked once."""
    __slots__ = ("N", "Ci", "H", "W", "Co", "Ho", "Wo", "kh", "kw", "sh", "sw", "dh", "dw", "pt", "pb", "pl", "pr")

    def __init__(self, lay):
        if lay.kernel == "linear":
            (self.N, self.Ci), self.Co = lay.in_shapes[0], lay.out_shape[1]
            self.H = self.W = self.Ho = self.Wo = self.kh = self.kw = self.sh = self.sw = self.dh = self.dw = 1
            self.pt = self.pb = self.pl = self.pr = 0
            return
        p = lay.params
        self.N, self.Ci, self.H, self.W = lay.in_shapes[0]
        _, self.Co, self.Ho, self.Wo = lay.out_shape
        self.kh, self.kw = lay.weight.shape[2:]
        self.sh, self.sw = p["stride"]
        self.dh, self.dw = p["dilation"]
        self.pt, self.pb, self.pl, self.pr = p["padding"]


def epilogue(acc: np.ndarray, bias, residual, relu: bool, dtype, act=None) -> np.ndarray:
    """y = act(relu(acc + bias + residual)); the conv epilogue (reference order: kernels/reference.py
    conv2d), cast to the target dtype. act: the conv's fused activation (name, alpha, beta)."""
    y = acc.astype(np.float32, copy=True) if acc.dtype != np.float64 else acc.copy()
    if bias is not None:
        y += bias.astype(y.dtype).reshape((1, -1) + (1,) * (y.ndim - 2))
    if residual is not None:
        y += residual.astype(y.dtype)
    if relu:
        np.maximum(y, 0, out=y)
    return ref.apply_act(y, act).astype(dtype)


def _channel_slice(a, kernel: str, img: int, c0: int, c1: int, N: int, C: int, acts: bool = False):
    """The part of a channel-local op's argument that output image `img`, channels [c0, c1) read.
    Arguments broadcast NumPy-style against the (N, C, ...) output: an axis of size 1 is shared;
    a 1-D constant is per channel only for CHANNEL_VECTORS ops (otherwise it runs along W)."""
    if a is None or not hasattr(a, "ndim"):
        return a
    if a.ndim == 1:
        return a[c0:c1] if kernel in CHANNEL_VECTORS and a.shape[0] == C and C > 1 else a
    if acts or a.ndim >= 4:             # (N, C, ...) aligned with the output's leading axes
        idx = [slice(None)] * a.ndim
        if a.shape[0] == N and N > 1:
            idx[0] = slice(img, img + 1)
        if a.ndim > 1 and a.shape[1] == C and C > 1:
            idx[1] = slice(c0, c1)
        return a[tuple(idx)]
    if a.ndim == 3 and a.shape[0] == C and C > 1:      # (C, H, W) broadcast against (N, C, H, W)
        return a[c0:c1]
    return a


def vector_peak(rep: LayerReport) -> LayerReport:
    """A vector (streamed) layer's efficiency is measured against the MAC peak of the cores used or,
    where the target's vector units outrun that peak, against the rate its compute units ran at: an
    efficiency never above 1 whatever the target file's numbers."""
    if rep.compute_busy > 0:
        rep.peak = max(rep.peak, rep.flops / rep.compute_busy)
    return rep


class Strategy:
    """Base of every mapping strategy."""
    name = "base"
    MEMORIES: tuple = ()
    LINKS: tuple = ()
    PARAMS: dict = {}                   # param name -> its rule (spec.PARAM_RULES key, or allowed values)
    CLOCKS: tuple = ()
    KERNELS: tuple | None = None        # kernels it maps (None: all of the op vocabulary)
    GROUPED = False                     # maps grouped convolutions
    STREAM_MEMORY = ""                  # on-chip memory streamed ops use
    STREAM_LINK = ""                    # link they stream over

    def __init__(self, target: Target, functional: bool = True):
        self.check_target(target)            # again: overrides may have changed a number since loading
        self.t = target
        self.functional = functional
        self.cores = target.cores

    @classmethod
    def check_target(cls, tgt: Target) -> None:
        require(tgt, cls.MEMORIES, cls.LINKS, cls.PARAMS, cls.CLOCKS)

    # ------------------------------------------------------------------ program level

    def unsupported(self, lay: Layer) -> str | None:
        """Why this target cannot run the layer (None: it can)."""
        if self.KERNELS is not None and lay.kernel not in self.KERNELS:
            return f"the {self.t.name} mapping has no {lay.kernel}; it maps {', '.join(self.KERNELS)}"
        if lay.kernel == "conv2d" and lay.params["groups"] != 1 and not self.GROUPED:
            return f"the {self.t.name} mapping takes ungrouped convolutions; found groups={lay.params['groups']}"
        if lay.kernel == "conv2d" and lay.params.get("has_input_scale"):
            return (f"the {self.t.name} mapping has no input-scaled convolution (a squeeze-excitation scale "
                    f"fused into the conv); found has_input_scale=True")
        return None

    def check_program(self, layers) -> None:
        for lay, _ in layers:
            if lay.kernel in ("flatten", "reshape", "dropout"):
                continue
            why = self.unsupported(lay)
            if why:
                raise UnsupportedOpError(f"instruction {lay.index} ({lay.kernel} '{lay.name}', input "
                                         f"{lay.in_shapes[0] if lay.in_shapes else '-'}): {why}")

    def run(self, lay: Layer) -> LayerReport:
        self.begin()
        fn = getattr(self, "layer_" + lay.kernel, None)
        if fn is None:
            return self.stream_layer(lay)
        return fn(lay)

    def finish(self, report: SimReport, prog, layers) -> None:
        """Whole-program additions: host copies, a layer pipeline's interval, notes."""

    # ------------------------------------------------------------------ per-layer machinery

    def begin(self) -> None:
        self._pending: list = []
        self.tl = Timeline()
        self.traffic = Traffic()
        self.pads: dict[tuple[str, int], Scratchpad] = {}

    def pad(self, memory: str, instance: int = 0) -> Scratchpad:
        """The scratchpad `memory` of core/unit `instance` (a shared memory has one instance)."""
        spec = self.t.memories[memory]
        if spec.per in ("chip", "cluster", "card", "host"):
            instance = 0
        key = (memory, instance)
        if key not in self.pads:
            label = memory if spec.per in ("chip", "cluster", "card", "host") else f"{memory}[{spec.per} {instance}]"
            self.pads[key] = Scratchpad(label, self.t.capacity(memory), self.functional)
        return self.pads[key]

    def defer(self, fn) -> None:
        """Queue a store: issued after the next block's first load (the order a double-buffered
        loop issues its DMAs in: prefetch the next block, then write back the last one)."""
        self._pending.append(fn)

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        for fn in pending:
            fn()

    def link_seconds(self, link: str, nbytes: float) -> float:
        ln = self.t.link(link)
        lat = ln.latency.value if ln.latency is not None else 0.0
        return lat + nbytes / ln.effective

    def xfer(self, link: str, nbytes: float, after=(), core: int = 0, levels=()) -> float:
        """A DMA of nbytes over `link` (a shared link serializes every core's transfers). The
        link's latency is the issuing engine's start-up: it delays this transfer but does not
        occupy the link, so other engines' transfers use the link meanwhile."""
        ln = self.t.link(link)
        res = f"link:{link}" if ln.shared else f"link:{link}[{core}]"
        lat = ln.latency.value if ln.latency is not None else 0.0
        if lat > 0:
            after = [max(after, default=0.0) + lat]
        end = self.tl.step(res, nbytes / ln.effective, after)
        self.traffic.move(link, nbytes, *(levels or (ln.src, ln.dst)))
        return end

    def compute(self, core: int, seconds: float, after=()) -> float:
        return self.tl.step(f"compute[{core}]", seconds, after)

    def report(self, lay: Layer, mapping: str, cores: int | None = None, seconds: float | None = None,
               phase: str = "") -> LayerReport:
        n = self.cores if cores is None else cores
        b = {f"link {k}": v for k, v in self.traffic.link.items()}
        b.update({f"mem {k}": v for k, v in self.traffic.level.items()})
        peaks: dict[str, int] = {}
        for (mem, _), sp in self.pads.items():
            peaks[mem] = max(peaks.get(mem, 0), sp.peak)
        dt = lay.dtype.name if f"macs_per_cycle.{lay.dtype.name}" in self.t.compute else None
        return LayerReport(lay.index, lay.name, lay.kernel, lay.out_shape, lay.flops,
                           self.tl.end if seconds is None else seconds, n, self.t.peak_flops(n, dt),
                           self.t.clock(), dict(self.tl.busy), b, mapping, phase, peaks, self.tl.steps)

    def vector_seconds(self, elements: float, ops: float) -> float:
        """Time for the vector units of one core to apply `ops` operations to `elements` values."""
        lanes = self.t.compute["vector_ops_per_cycle"].value if "vector_ops_per_cycle" in self.t.compute \
            else self.t.macs_per_cycle()
        return elements * ops / (lanes * self.t.clock())

    # ------------------------------------------------------------------ streamed (memory-bound) ops

    def stream_layer(self, lay: Layer, memory: str | None = None, link: str | None = None,
                     cores: int | None = None) -> LayerReport:
        """Stream the op through `memory` over `link`: chunks of channel planes (whole images for
        ops that mix channels), double buffered, spread round-robin over the cores."""
        memory = memory or self.STREAM_MEMORY
        link = link or self.STREAM_LINK
        n = self.cores if cores is None else cores
        k = lay.kernel
        isz = lay.itemsize
        osh = lay.out_shape
        # activation inputs: the program's variable operands (the first when the layer does not say)
        acts = list(lay.act_inputs) or [0]
        shp = [lay.in_shapes[i] for i in acts]
        whole = k not in CHANNEL_LOCAL
        size = lambda s, d: int(np.prod(s[d:])) if len(s) > d else 1  # noqa: E731
        if whole:       # (N, ...) one image per chunk unit
            in_e, out_e, units = sum(size(s, 1) for s in shp), size(osh, 1), 1
        else:           # (N, C, ...) one channel plane per chunk unit
            in_e, out_e, units = sum(size(s, 2) for s in shp), size(osh, 2), (osh[1] if len(osh) > 1 else 1)
        per_unit = (in_e + out_e) * isz
        cap = self.t.capacity(memory)
        fit = int(cap // (2 * per_unit))
        if fit < 1 and not whole and k in ROW_BANDS and len(osh) == 4 and not lay.params.get("ceil_mode", False) \
                and all(len(lay.in_shapes[i]) == 4 for i in acts):
            return self._stream_bands(lay, memory, link, n, acts)
        if fit < 1:
            raise CapacityError(memory, f"{k} chunk of one {'image' if whole else 'channel plane'} "
                                        f"(double buffered)", int(2 * per_unit), 0, cap)
        chunk = min(units, fit)
        nch = math.ceil(units / chunk)
        nimg = osh[0]
        used = min(n, nimg * nch)
        bufs = {}
        for c in range(used):
            sp = self.pad(memory, c)
            bufs[c] = ([sp.alloc(f"{k} input[{j}]", (chunk * in_e,), lay.dtype) for j in range(2)],
                       [sp.alloc(f"{k} output[{j}]", (chunk * out_e,), lay.dtype) for j in range(2)])
        out = np.zeros(osh, lay.dtype) if self.functional else None
        ops = OPS_PER_ELEMENT.get(k)
        if ops is None:         # pooling: one operation per window element and output
            ks = lay.params.get("kernel_size", (1, 1))
            ops = ks[0] * ks[1]
        work_e = out_e if k in ("max_pool", "avg_pool") else in_e
        ends: dict[int, list[float]] = {c: [] for c in bufs}
        step = 0
        for img in range(nimg):
            for j in range(nch):
                core = step % used
                c0, c1 = j * chunk, min(units, (j + 1) * chunk)
                cnt = c1 - c0
                prev = ends[core]
                t_in = self.xfer(link, cnt * in_e * isz, (prev[-2],) if len(prev) >= 2 else (), core)
                self.flush()
                t_c = self.compute(core, self.vector_seconds(cnt * work_e, ops),
                                   (t_in,) + ((prev[-1],) if prev else ()))
                prev.append(t_c)
                self.defer(lambda b=cnt * out_e * isz, t=t_c, c=core: self.xfer(link, b, (t,), c))
                ib, ob = bufs[core][0][len(prev) % 2], bufs[core][1][len(prev) % 2]
                if self.functional:
                    args = self._chunk_args(lay, acts, img, c0, c1)
                    pos, views = 0, {}
                    for i in acts:          # the activation chunks go through the input buffer
                        a = args[i]
                        views[i] = ib.array.reshape(-1)[pos:pos + a.size].reshape(a.shape)
                        views[i][...] = a
                        pos += a.size
                    if pos > ib.array.size:
                        raise CapacityError(ib.memory.name, f"{k} input chunk", pos * isz, 0, ib.nbytes)
                    y = lay.reference(*[views.get(i, a) for i, a in enumerate(args)])
                    yv = ob.load(y)
                    if whole:
                        out[img:img + 1] = yv
                    else:
                        out[img:img + 1, c0:c1] = yv
                else:
                    ib.load(None, (cnt * in_e,))
                    ob.load(None, (cnt * out_e,))
                step += 1
        self.flush()
        lay.out = out
        return vector_peak(self.report(lay, f"streamed through {memory} over {link}: {chunk} "
                                            f"{'image' if whole else 'plane'}(s) per chunk, double buffered, "
                                            f"{used} core(s)", cores=n))

    def _stream_bands(self, lay: Layer, memory: str, link: str, n: int, acts) -> LayerReport:
        """A channel plane larger than the memory: bands of output rows of one plane (with the
        input rows their windows need), double buffered."""
        k = lay.kernel
        isz = lay.itemsize
        N, C, Ho, Wo = lay.out_shape
        H, W = lay.in_shapes[0][2:]
        kh = lay.params.get("kernel_size", (1, 1))[0] if k in ("max_pool", "avg_pool") else 1
        sh = lay.params.get("stride", (1, 1))[0] if k in ("max_pool", "avg_pool") else 1
        pt = lay.params.get("padding", (0, 0, 0, 0))[0] if k in ("max_pool", "avg_pool") else 0
        gap = k == "global_avg_pool"
        rows_in = lambda r: (r - 1) * sh + kh if not gap else r  # noqa: E731
        need = lambda r: 2 * (len(acts) * rows_in(r) * W + (r * Wo if not gap else 1)) * isz  # noqa: E731
        cap = self.t.capacity(memory)
        out_rows = H if gap else Ho
        r = 1
        if need(1) > cap:
            raise CapacityError(memory, f"{k} band of one row (double buffered)", int(need(1)), 0, cap)
        while r < out_rows and need(r + 1) <= cap:
            r += 1
        bands = [(b0, min(out_rows, b0 + r)) for b0 in range(0, out_rows, r)]
        units = [(img, c, b) for img in range(N) for c in range(C) for b in bands]
        used = min(n, len(units))
        bufs = {c: ([self.pad(memory, c).alloc(f"{k} input band[{j}]", (len(acts) * rows_in(r) * W,), lay.dtype)
                     for j in range(2)],
                    [self.pad(memory, c).alloc(f"{k} output band[{j}]", (r * Wo if not gap else 1,), lay.dtype)
                     for j in range(2)]) for c in range(used)}
        ops = OPS_PER_ELEMENT.get(k) or kh * kh
        out = np.zeros(lay.out_shape, np.float32 if gap else lay.dtype) if self.functional else None
        ends: dict[int, list[float]] = {c: [] for c in bufs}
        for i, (img, ch, (o0, o1)) in enumerate(units):
            core = i % used
            prev = ends[core]
            a0, a1 = (o0, o1) if gap else (o0 * sh - pt, (o1 - 1) * sh - pt + kh)
            lo, hi = max(a0, 0), min(a1, H)
            t_in = self.xfer(link, len(acts) * (hi - lo) * W * isz, (prev[-2],) if len(prev) >= 2 else (), core)
            self.flush()
            t_c = self.compute(core, self.vector_seconds((o1 - o0) * (Wo if not gap else W), ops),
                               (t_in,) + ((prev[-1],) if prev else ()))
            prev.append(t_c)
            self.defer(lambda b=(o1 - o0) * Wo * isz if not gap else isz, t=t_c, c=core: self.xfer(link, b, (t,), c))
            ib, ob = bufs[core][0][len(prev) % 2], bufs[core][1][len(prev) % 2]
            if not self.functional:
                ib.load(None, (len(acts) * (hi - lo) * W,))
                continue
            args = []
            for j, a in enumerate(lay.inputs):
                if j in acts:
                    args.append(a[img:img + 1, ch:ch + 1, lo:hi] if a.shape[2] == H else
                                _channel_slice(a, k, img, ch, ch + 1, N, C, acts=True))
                else:
                    args.append(_channel_slice(a, k, img, ch, ch + 1, N, C))
            ib.load(np.concatenate([args[q].reshape(-1) for q in acts]))     # the bands go through the buffer
            if gap:
                y = lay.reference(*args).astype(np.float32) * (hi - lo) / H      # a band's share of the mean
                out[img, ch] += y[0, 0]
                ob.load(y.reshape(-1).astype(lay.dtype))
                continue
            if k in ("max_pool", "avg_pool"):
                p = dict(lay.params)
                p["padding"] = (lo - a0, a1 - hi, p["padding"][2], p["padding"][3])
                y = schema_ref(k, lay.name)(*args, **p)
            else:
                y = lay.reference(*args)
            out[img, ch, o0:o1] = ob.load(y.reshape(-1)).reshape(o1 - o0, Wo)
        self.flush()
        lay.out = out.astype(lay.dtype) if out is not None else None
        return vector_peak(self.report(lay, f"streamed through {memory} over {link}: bands of {r} row(s) of one plane, "
                                            f"double buffered, {used} core(s)", cores=n))

    def _chunk_args(self, lay: Layer, acts, img: int, c0: int, c1: int) -> list:
        k = lay.kernel
        whole = k not in CHANNEL_LOCAL
        N, C = lay.out_shape[0], lay.out_shape[1] if len(lay.out_shape) > 1 else 1
        args = []
        for i, a in enumerate(lay.inputs):
            if whole:
                args.append(a[img:img + 1] if i in acts and a.shape[0] == N else a)
            else:
                args.append(_channel_slice(a, k, img, c0, c1, N, C, acts=i in acts))
        return args

    # ------------------------------------------------------------------ generic tiled convolution

    def tiled_conv(self, lay: Layer, *, in_mem: str, w_mem: str, out_mem: str, in_link: str, w_link: str,
                   out_link: str, co_block: int, cycles, w_per_channel: bool = False, ci_block: int | None = None,
                   acc_bytes: int = 4, cores: int | None = None, note: str = "") -> LayerReport:
        """A convolution (or a linear layer as a 1x1 conv) in tiles: for each block of co_block
        output channels, every spatial tile of every image streams its input channels in blocks;
        the weights of the channel block stay on chip when all their Ci blocks fit `w_mem` (else
        they are reloaded per tile). Buffers are double buffered when the memory says so.
        cycles(co, ci, kh, kw, out_pixels) -> compute cycles of one tile on one core.
        w_per_channel: `w_mem` is one memory per output channel of the block (a PE's SB)."""
        p = lay.params
        n = self.cores if cores is None else cores
        isz = lay.itemsize
        g = ConvGeom(lay)
        N, Ci, H, W, Co, Ho, Wo, kh, kw = g.N, g.Ci, g.H, g.W, g.Co, g.Ho, g.Wo, g.kh, g.kw
        sh, sw, dh, dw, pt, pl = g.sh, g.sw, g.dh, g.dw, g.pt, g.pl
        if lay.kernel == "linear":
            x = lay.x.reshape(N, Ci, 1, 1) if lay.x is not None else None
            w = lay.weight.reshape(Co, Ci, 1, 1)
            relu, res = p.get("relu", False), None
        else:
            x, w, relu, res = lay.x, lay.weight, p["relu"], lay.residual
        mems = self.t.memories
        dbl = lambda m: 2 if mems[m].double_buffered else 1  # noqa: E731
        shared = lambda m: mems[m].per in ("chip", "cluster", "card", "host")  # noqa: E731
        cap = lambda m: self.t.capacity(m) / (n if shared(m) else 1)  # noqa: E731  one core's share
        cob = min(co_block, Co)
        # Ci block: all of Ci unless the weights of one block (per channel or all) do not fit
        cib = min(Ci, ci_block or Ci)
        wbytes = lambda c: c * kh * kw * isz * (1 if w_per_channel else cob) * dbl(w_mem)  # noqa: E731
        while cib > 1 and wbytes(cib) > cap(w_mem):
            cib = math.ceil(cib / 2)
        span = lambda q, s, k, d: (q - 1) * s + (k - 1) * d + 1  # noqa: E731
        in_bytes = lambda r, q, c: c * span(r, sh, kh, dh) * span(q, sw, kw, dw) * isz * dbl(in_mem)  # noqa: E731
        out_bytes = lambda r, q: cob * r * q * (acc_bytes if cib < Ci else isz) * dbl(out_mem)  # noqa: E731
        same = in_mem == out_mem
        fits = lambda r, q, c: (in_bytes(r, q, c) + (out_bytes(r, q) if same else 0) <= cap(in_mem)  # noqa: E731
                                and (same or out_bytes(r, q) <= cap(out_mem)))
        while cib > 1 and not fits(1, 1, cib):
            cib = math.ceil(cib / 2)
        cols = Wo
        while cols > 1 and not fits(1, cols, cib):
            cols = math.ceil(cols / 2)
        rows = 1
        while rows < Ho and fits(rows + 1, cols, cib):
            rows += 1
        ci_blocks = [(c0, min(Ci, c0 + cib)) for c0 in range(0, Ci, cib)]
        co_blocks = [(c0, min(Co, c0 + cob)) for c0 in range(0, Co, cob)]
        tiles = [(img, r0, min(Ho, r0 + rows), q0, min(Wo, q0 + cols))
                 for img in range(N) for r0 in range(0, Ho, rows) for q0 in range(0, Wo, cols)]
        stationary = wbytes(cib) * len(ci_blocks) / dbl(w_mem) <= cap(w_mem)
        used = min(n, len(tiles))
        # buffers: per core (or per PE for per-channel weight memories)
        in_bufs = {c: [] for c in range(used)}
        for c in range(used):
            for j in range(dbl(in_mem)):
                in_bufs[c].append(self.pad(in_mem, c).alloc(f"input tile[{j}] {cib}x{span(rows, sh, kh, dh)}x{span(cols, sw, kw, dw)}",
                                          (cib, span(rows, sh, kh, dh), span(cols, sw, kw, dw)), lay.dtype))
            for j in range(dbl(out_mem)):
                self.pad(out_mem, c).alloc(f"output tile[{j}] {cob}x{rows}x{cols}", (cob, rows, cols),
                                           np.float32 if cib < Ci else lay.dtype)
            if w_per_channel:
                for pe in range(cob if c == 0 else 0):
                    wm = self.pad(w_mem, pe)
                    for j in range(dbl(w_mem) if not stationary else 1):
                        wm.alloc(f"weights of one channel[{j}] {cib}x{kh}x{kw}" + (f" x{len(ci_blocks)} blocks"
                                 if stationary and len(ci_blocks) > 1 else ""),
                                 ((len(ci_blocks) if stationary else 1) * cib, kh, kw), lay.dtype)
            else:
                wm = self.pad(w_mem, c)
                for j in range(1 if stationary else dbl(w_mem)):
                    wm.alloc(f"weight block[{j}] {cob}x{cib}x{kh}x{kw}" + (f" x{len(ci_blocks)} blocks"
                             if stationary and len(ci_blocks) > 1 else ""),
                             (cob, (len(ci_blocks) if stationary else 1) * cib, kh, kw), lay.dtype)
        out = np.zeros((N, Co, Ho, Wo), lay.dtype) if self.functional else None
        w32 = w.astype(np.float32) if self.functional else None
        last_c = {c: 0.0 for c in range(used)}
        hist = {c: [] for c in range(used)}      # compute ends, for buffer reuse
        st = {c: [] for c in range(used)}        # store ends
        cyc: dict = {}
        k = 0
        for (co0, co1) in co_blocks:
            w_ready = 0.0
            if stationary:
                w_ready = self.xfer(w_link, (co1 - co0) * Ci * kh * kw * isz, [max(last_c.values())],
                                    levels=(self.t.link(w_link).src, w_mem))
            for (img, r0, r1, q0, q1) in tiles:
                c = k % used
                k += 1
                acc = None
                for (ci0, ci1) in ci_blocks:
                    h = hist[c]
                    free_in = [h[-dbl(in_mem)]] if len(h) >= dbl(in_mem) else []
                    nr, nq = span(r1 - r0, sh, kh, dh), span(q1 - q0, sw, kw, dw)
                    t_in = self.xfer(in_link, (ci1 - ci0) * nr * nq * isz, free_in, core=c,
                                     levels=(self.t.link(in_link).src, in_mem))
                    if ci0 == 0:
                        self.flush()
                    deps = [t_in, last_c[c], w_ready]
                    if not stationary:
                        deps.append(self.xfer(w_link, (co1 - co0) * (ci1 - ci0) * kh * kw * isz, free_in, core=c,
                                              levels=(self.t.link(w_link).src, w_mem)))
                    if ci0 == 0 and len(st[c]) >= dbl(out_mem):
                        deps.append(st[c][-dbl(out_mem)])           # output buffer free again
                    key = (co1 - co0, ci1 - ci0, (r1 - r0) * (q1 - q0))
                    if key not in cyc:
                        cyc[key] = cycles(co1 - co0, ci1 - ci0, kh, kw, (r1 - r0) * (q1 - q0)) / self.t.clock()
                    last_c[c] = self.compute(c, cyc[key], deps)
                    h.append(last_c[c])
                    tile = gather(x, img, img + 1, ci0, ci1, r0 * sh - pt, nr, q0 * sw - pl, nq) \
                        if self.functional else None
                    view = in_bufs[c][len(h) % dbl(in_mem)].load(
                        tile, ((ci1 - ci0), nr, nq))
                    if self.functional:
                        part = ref.conv2d(view.astype(np.float32), w32[co0:co1, ci0:ci1], None, (sh, sw),
                                          (0, 0, 0, 0), (dh, dw))           # (1, co, r, q)
                        acc = part if acc is None else acc + part
                nbytes = (co1 - co0) * (r1 - r0) * (q1 - q0) * isz * (2 if lay.kernel == "conv2d" and p["has_residual"] else 1)
                self.defer(lambda b=nbytes, t=last_c[c], cc=c: st[cc].append(
                    self.xfer(out_link, b, [t], core=cc, levels=(out_mem, self.t.link(out_link).src))))
                if self.functional:
                    r_t = res[img:img + 1, co0:co1, r0:r1, q0:q1] if res is not None else None
                    b_t = lay.bias[co0:co1] if lay.bias is not None else None
                    out[img:img + 1, co0:co1, r0:r1, q0:q1] = epilogue(acc, b_t, r_t, relu, lay.dtype,
                                                                       p.get("act"))
        self.flush()
        lay.out = out.reshape(lay.out_shape) if out is not None else None
        return self.report(lay, f"{note}co block {cob}, ci block {cib}{' (weights stay)' if stationary else ''}, "
                                f"tile {rows}x{cols} px, {len(tiles)} tiles x {len(co_blocks)} co blocks, "
                                f"{used} unit(s)", cores=n)
