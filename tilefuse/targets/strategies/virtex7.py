"""Seed 003's design on a Virtex-7 XC7VX690T: every layer its own pipeline stage, line buffers,
Winograd F(2x2, 3x3) for the stride-1 3x3 convolutions (targets/virtex7-690t.toml).

* Line buffers (003 section 2): a conv stage keeps the kh input rows it needs (kh + 1 rows for a
  Winograd stage, which emits two output rows at once) of every input channel in block RAM and
  slides down the image; each new row is fetched once. Its weights are on chip when they fit
  the block RAM that is left (all stages are resident at once), else they stream from DDR.
* Winograd F(2x2, 3x3): 16 multiplies per 2x2 outputs per (ci, co) instead of 36; the input
  and weight transforms are adds in logic (no DSPs). Functionally the stage runs the project's
  F(2x2, 3x3) kernel (kernels/conv/winograd.py) on each band of 4 buffered rows.
* One stage per layer with balanced resources (003: "the work of every layer should be about
  equal, or the slowest stage limits the pipeline"): the DSPs are divided in proportion to each
  stage's multiplies, so every stage needs about the same time per image; the fully connected
  stages stream their weights from DDR once per batch of `fc_batch` images.
The pipeline's interval is its slowest stage; throughput = FLOPs per image / interval.
"""
from __future__ import annotations

import math

import numpy as np

from ...kernels import reference as ref
from ..machine import CapacityError, Scratchpad, Timeline, Traffic
from ..report import Layer, LayerReport, SimReport
from .base import ConvGeom, Strategy, gather, vector_peak


def _is_winograd(lay: Layer) -> bool:
    p = lay.params
    return (lay.kernel == "conv2d" and lay.weight.shape[2:] == (3, 3) and p["stride"] == (1, 1)
            and p["dilation"] == (1, 1) and p["groups"] == 1)


class Virtex7(Strategy):
    name = "virtex7-line-buffer"
    MEMORIES = ("BRAM", "DDR")
    LINKS = ("ddr",)
    PARAMS = {"winograd_m": (2, 4), "fc_batch": "count", "logic_lanes": "positive"}     # F(2x2) or F(4x4) (kernels)

    def __init__(self, target, functional=True):
        super().__init__(target, functional)
        self.bram = Scratchpad("BRAM", target.capacity("BRAM"), functional)
        self.dsps: dict[int, int] = {}

    # ------------------------------------------------------------------ resources

    def multiplies(self, lay: Layer) -> float:
        """DSP multiplies per image of a stage (Winograd: 16 per 2x2 output tile per (ci, co))."""
        n = lay.out_shape[0]
        if lay.kernel == "conv2d":
            _, co, ho, wo = lay.out_shape
            ci = lay.in_shapes[0][1]
            if _is_winograd(lay):
                m = int(self.t.p("winograd_m"))
                a = m + 2
                return math.ceil(ho / m) * math.ceil(wo / m) * a * a * ci * co
            return lay.flops / 2 / n
        if lay.kernel == "linear":
            return lay.flops / 2 / n
        return 0.0

    def check_program(self, layers) -> None:
        super().check_program(layers)
        lays = [lay for lay, _ in layers]
        total = sum(self.multiplies(lay) for lay in lays)
        dsp = self.t.cores
        for lay in lays:
            mul = self.multiplies(lay)
            if mul > 0:
                self.dsps[lay.index] = max(1, int(dsp * mul / total))   # balanced: proportional shares

    def begin(self) -> None:
        self.tl = Timeline()
        self.traffic = Traffic()
        self.pads = {("BRAM", 0): self.bram}        # every stage is resident: BRAM is never released

    # ------------------------------------------------------------------ stages

    def _stage(self, lay: Layer, compute_s: float, ddr_bytes: float, mapping: str, peak: float) -> LayerReport:
        n = lay.out_shape[0]
        ddr_s = ddr_bytes / self.t.link("ddr").effective
        self.tl.busy["compute"] = n * compute_s
        if ddr_bytes:
            self.tl.busy["link:ddr"] = n * ddr_s
            self.traffic.move("ddr", n * ddr_bytes, "DDR", "BRAM")
        stage = max(compute_s, ddr_s)
        rep = self.report(lay, mapping, seconds=n * stage)
        rep.peak = peak
        rep.peaks = {"BRAM": self.bram.used}
        return rep

    def layer_conv2d(self, lay: Layer) -> LayerReport:
        g = ConvGeom(lay)
        Ci, W, kh, kw, dh, sh = g.Ci, g.W, g.kh, g.kw, g.dh, g.sh
        isz = lay.itemsize
        wino = _is_winograd(lay)
        m = int(self.t.p("winograd_m")) if wino else 1
        span = (m - 1) * sh + (kh - 1) * dh + 1            # rows one step of the stage reads
        Wp = W + g.pl + g.pr
        self.bram.alloc(f"{lay.name} line buffer {Ci}x{span}x{Wp}", (Ci, span, Wp), lay.dtype)
        wbytes = lay.weight.size * isz
        on_chip = self.bram.used + wbytes <= self.bram.capacity
        if on_chip:
            self.bram.alloc(f"{lay.name} weights", lay.weight.shape, lay.dtype)
        dsp = self.dsps[lay.index]
        f = self.t.clock()
        compute_s = self.multiplies(lay) / (dsp * f)
        ddr = 0 if on_chip else wbytes
        out = None
        if self.functional:
            out = self._run_rows(lay, wino, m, span)
        lay.out = out
        gain = (kh * kw * m * m) / ((m + 2) ** 2) if wino else 1.0
        peak = 2.0 * dsp * f * gain
        return self._stage(lay, compute_s, ddr, f"{'Winograd F(2x2,3x3)' if wino else 'direct'}, line buffer "
                                                 f"{span} rows, {dsp} DSPs, weights "
                                                 f"{'on chip' if on_chip else 'from DDR'}", peak)

    def _run_rows(self, lay: Layer, wino: bool, m: int, span: int) -> np.ndarray:
        """Slide the line buffer down each image: m output rows per step."""
        p = lay.params
        g = ConvGeom(lay)
        N, Ci, W, Co, Ho, Wo = g.N, g.Ci, g.W, g.Co, g.Ho, g.Wo
        sh, sw, dh, dw, pt, pl, pr = g.sh, g.sw, g.dh, g.dw, g.pt, g.pl, g.pr
        x = lay.x
        out = np.empty(lay.out_shape, np.float32)
        buf = self.bram.buffers[-2] if self.bram.buffers[-1].what.endswith("weights") else self.bram.buffers[-1]
        if wino:
            from ...kernels.conv import winograd
            prep = winograd.prepare(lay.weight.astype(np.float32),
                                    lay.bias.astype(np.float32) if lay.bias is not None else None, m)
        w32 = lay.weight.astype(np.float32)
        for img in range(N):
            for r0 in range(0, Ho, m):
                rows = min(m, Ho - r0)
                band = gather(x, img, img + 1, 0, Ci, r0 * sh - pt, span, -pl, W + pl + pr)   # (1, Ci, span, Wp)
                band = buf.load(band[0])[None].astype(np.float32)
                res = lay.residual[img:img + 1, :, r0:r0 + rows].astype(np.float32) if p["has_residual"] else None
                if wino:
                    o = np.empty((1, Co, m, Wo), np.float32)
                    rr = None
                    if res is not None:
                        rr = np.zeros((1, Co, m, Wo), np.float32)
                        rr[:, :, :rows] = res
                    winograd.run(o, band, prep, rr, m=m, padding=(0, 0, 0, 0), relu=p["relu"], threads=1)
                    out[img:img + 1, :, r0:r0 + rows] = o[:, :, :rows]
                else:
                    o = ref.conv2d(band, w32, lay.bias.astype(np.float32) if lay.bias is not None else None,
                                   (sh, sw), (0, 0, 0, 0), (dh, dw), 1, res, p["relu"])
                    out[img:img + 1, :, r0:r0 + rows] = o[:, :, :rows]
        return ref.apply_act(out, p.get("act")).astype(lay.dtype)     # the fused activation, after the ReLU

    def layer_linear(self, lay: Layer) -> LayerReport:
        isz = lay.itemsize
        N, K = lay.in_shapes[0]
        M = lay.out_shape[1]
        batch = self.t.p("fc_batch")
        self.bram.alloc(f"{lay.name} input vector", (K,), lay.dtype)
        self.bram.alloc(f"{lay.name} weight rows (double buffered)", (2, K), lay.dtype)
        dsp = self.dsps[lay.index]
        compute_s = self.multiplies(lay) / (dsp * self.t.clock())
        ddr = lay.weight.size * isz / batch
        lay.out = lay.reference(*lay.inputs) if self.functional else None
        return self._stage(lay, compute_s, ddr, f"weights streamed from DDR once per {batch:g} images, "
                                                f"{dsp} DSPs", 2.0 * dsp * self.t.clock())

    def stream_layer(self, lay, memory=None, link=None, cores=None) -> LayerReport:
        """Pooling / element-wise stages: a line buffer of the rows their window needs, at
        `logic_lanes` elements per cycle in fabric logic (no DSPs)."""
        shp = lay.in_shapes[0]
        rows = lay.params.get("kernel_size", (1, 1))[0] if len(shp) == 4 else 1
        per_row = shp[1] * (shp[3] if len(shp) == 4 else 1)
        self.bram.alloc(f"{lay.name} line buffer {rows} rows", (rows, per_row), lay.dtype)
        n = lay.out_shape[0]
        elems = max(int(np.prod(shp[1:])), int(np.prod(lay.out_shape[1:])))
        compute_s = elems / (self.t.p("logic_lanes") * self.t.clock())
        lay.out = lay.reference(*lay.inputs) if self.functional else None
        # against the DSP array's peak, or the logic's own rate where it outruns the DSPs used (base.vector_peak)
        mapping = f"line buffer {rows} rows, {self.t.p('logic_lanes'):g} elements/cycle in logic"
        rep = vector_peak(self._stage(lay, compute_s, 0, mapping, 2.0 * self.t.cores * self.t.clock()))
        return rep

    def finish(self, report: SimReport, prog, layers) -> None:
        n = max((r.out_shape[0] for r in report.layers if r.out_shape), default=1)
        stage = [r.seconds / n for r in report.layers if r.seconds > 0]
        interval = max(stage) if stage else 0.0
        report.total_seconds = sum(stage) + (n - 1) * interval      # fill, then one image per interval
        slow = max((r for r in report.layers if r.seconds > 0), key=lambda r: r.seconds, default=None)
        report.extra.update({"interval": interval, "images": n,
                             "throughput_flops": (report.flops / n) / interval if interval else 0.0,
                             "slowest_stage": slow.name if slow else "-",
                             "dsps": dict(self.dsps), "bram_used": self.bram.used})
        report.notes.append(f"layer pipeline: interval {interval * 1e3:.3f} ms per image (slowest stage "
                            f"{slow.name if slow else '-'}), {report.extra['throughput_flops'] / 1e12:.3f} TFLOP/s; "
                            f"block RAM {self.bram.used / 2**20:.2f} of {self.bram.capacity / 2**20:.2f} MiB")
