"""Seed 004's training accelerator (targets/trainer-004.toml): a 16 x 32 array of processing
units (32 MACs each), Fbuf_In / Wbuf / Fbuf_Out buffers, and for fused layers a PreU per PU row,
a PostU per PU pair and a DivSqrt per column.

Inference programs: a convolution maps output pixels to the 16 PU rows, output channels to the
32 columns and 32-wide slices of the Ci x kh x kw reduction to a PU's MACs (a tile of p pixels
costs ceil(p/16) x ceil(co/32) x ceil(K/32) cycles); inputs in Fbuf_In, weights in Wbuf,
outputs in Fbuf_Out, all ping-pong; the epilogue (folded BN, ReLU, residual add) runs in the
PostUs beside the PUs. Other ops stream through Fbuf_In on the vector unit.

Training (`TrainingJob`): one step of tilefuse.training's schedule, fused (BN/ReLU/Add folded
into the convolutions around them) or separate, executed for real; each unit of the executed
schedule is then timed on the accelerator: a conv unit takes the longest of its PU time (forward
MACs, or 2x for the input and weight gradients), its PreU work (the pre-processing of its input
elements, 16 MACs per row per cycle, cached after the first pass), its PostU work (1024 MACs per
cycle) and its traffic (activations over the 205 GB/s link, weights and their gradients over
25.6 GB/s); a separate memory-bound unit takes the longer of its traffic and its vector work.
Activation traffic and MACs scale exactly with the batch, so a step run at batch b can be
reported at batch b x batch_scale (the paper's 32) without running that batch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...ir import Network
from ..report import Layer, LayerReport, SimReport
from ..spec import TargetError
from .base import Strategy, vector_peak


@dataclass
class TrainingJob:
    """One training step of `net` (a trainable network: BN not folded) on the trainer-004 target.
    schedule: "fused" or "separate"; batch_scale: report at the network's batch x this."""
    net: Network
    schedule: str = "fused"
    batch_scale: int = 1
    labels: np.ndarray | None = None

    def __post_init__(self):
        if self.schedule not in ("fused", "separate"):
            raise ValueError(f"TrainingJob schedule: found '{self.schedule}', expected 'fused' or 'separate'")
        if not isinstance(self.batch_scale, int) or self.batch_scale < 1:
            raise ValueError(f"TrainingJob batch_scale: found {self.batch_scale!r}, expected a positive integer")


class Trainer004(Strategy):
    name = "trainer-004"
    MEMORIES = ("Fbuf_In", "Wbuf", "Fbuf_Out", "Bbuf", "DRAM")
    LINKS = ("feature", "weight")
    PARAMS = {"pu_rows": "count", "pu_cols": "count", "pu_macs": "count", "preu_macs": "count", "postu_macs": "count",
              "co_block": "count", "preu_ops": "nonneg", "postu_ops": "nonneg", "vector_ops": "nonneg"}
    STREAM_MEMORY = "Fbuf_In"
    STREAM_LINK = "feature"

    @classmethod
    def check_target(cls, tgt) -> None:
        super().check_target(tgt)
        rows, cols, macs = (tgt.p(k) for k in ("pu_rows", "pu_cols", "pu_macs"))
        if rows * cols > tgt.cores or macs > tgt.macs_per_cycle():
            raise TargetError(tgt.path or tgt.name, f"param.pu_rows x pu_cols x pu_macs: a {rows:g} x {cols:g} "
                              f"array of {macs:g}-MAC PUs, but target.cores = {tgt.cores} PUs of macs_per_cycle."
                              f"{tgt.dtype} = {tgt.macs_per_cycle():g}: the PU array is the cores; change both "
                              f"together")

    def _cycles(self, co, ci, kh, kw, pix):
        p = self.t.p
        return math.ceil(pix / p("pu_rows")) * math.ceil(co / p("pu_cols")) * math.ceil(ci * kh * kw / p("pu_macs"))


    def layer_conv2d(self, lay: Layer) -> LayerReport:
        return self.tiled_conv(lay, in_mem="Fbuf_In", w_mem="Wbuf", out_mem="Fbuf_Out", in_link="feature",
                               w_link="weight", out_link="feature", co_block=int(self.t.p("co_block")),
                               cycles=self._cycles, cores=1, note="16x32 PUs, ")

    layer_linear = layer_conv2d

    def stream_layer(self, lay, memory=None, link=None, cores=None):
        return super().stream_layer(lay, memory, link, cores=1)

    def report(self, lay, mapping, cores=None, seconds=None, phase=""):
        return super().report(lay, mapping, self.t.cores, seconds, phase)

    # ------------------------------------------------------------------ training

    def simulate_job(self, job, inputs=None, seed: int = 0) -> SimReport:
        if not isinstance(job, TrainingJob):
            raise TypeError(f"the trainer-004 target simulates a compiled program or a TrainingJob, got "
                            f"{type(job).__name__}")
        from ...training import Trainer
        net = job.net
        tr = Trainer(net, schedule="fused" if job.schedule == "fused" else "unfused", seed=seed)
        rng = np.random.default_rng(seed)
        shape = net.inputs[0].shape
        x = rng.standard_normal(shape).astype(np.float32) if inputs is None else np.asarray(inputs, np.float32)
        ncls = net.outputs[0].shape[-1]
        labels = job.labels if job.labels is not None else rng.integers(0, ncls, size=shape[0])
        loss, grads = tr.forward_backward(x, labels)
        sch = tr.schedule
        reports = self._time_units(sch, job.batch_scale)
        rep = SimReport(self.t, self.t.cores, reports, [np.float32(loss)], notes=[
            f"training step, schedule '{job.schedule}', executed at batch {shape[0]}, timed at batch "
            f"{shape[0] * job.batch_scale} (activation traffic and MACs scale with the batch)"])
        rep.extra.update({
            "loss": loss, "grads": grads, "schedule": job.schedule, "batch": shape[0] * job.batch_scale,
            "fwd_seconds": sum(r.seconds for r in reports if r.phase == "fwd"),
            "bwd_seconds": sum(r.seconds for r in reports if r.phase == "bwd")})
        return rep

    def _time_units(self, sch, scale: int) -> list[LayerReport]:
        p = self.t.p
        f = self.t.clock()
        feat, wlink = self.t.link("feature"), self.t.link("weight")
        isz = np.dtype(self.t.dtype).itemsize
        ops = {op.name: op for op in sch.ops}
        units: dict[tuple[str, str], dict] = {}
        order: list[tuple[str, str]] = []
        for a in sch.log.accesses:
            key = (a.phase, a.unit)
            if key not in units:
                units[key] = {"read": 0, "write": 0, "extra": 0}
                order.append(key)
            u = units[key]
            nbytes = a.nbytes * isz // 4 * scale            # the schedule keeps FP32; the accelerator FP16
            u["read" if a.kind == "read" else "write"] += nbytes
            if a.layer != a.unit:                            # bytes a fused pre/post-processing needs
                u["extra"] += nbytes
        reports = []
        array_macs = self.t.macs_per_cycle() * self.t.cores
        for i, (phase, name) in enumerate(order):
            u = units[(phase, name)]
            op = ops.get(name) or ops.get(name.rsplit(".", 1)[0])      # "bn1.stats" -> bn1
            busy: dict[str, float] = {}
            fbytes = u["read"] + u["write"]
            busy["link:feature"] = fbytes / feat.effective
            flops = 0
            mapping = ""
            if op is not None and op.op in ("conv2d", "linear") and op.name == name:
                x, w = op.inputs[0], op.inputs[1]
                out = op.outputs[0]
                if op.op == "conv2d":
                    kh, kw = w.shape[2:]
                    ci, co = w.shape[1], w.shape[0]
                    pix = out.shape[0] * out.shape[2] * out.shape[3] * scale
                else:
                    kh = kw = 1
                    ci, co = w.shape[1], w.shape[0]
                    pix = out.shape[0] * scale
                passes = 1 if phase == "fwd" else 2                 # backward: input and weight gradients
                macs = pix * co * ci * kh * kw * passes
                flops = 2 * macs
                cyc = self._cycles(co, ci, kh, kw, pix) * passes
                busy["compute[PU]"] = cyc / f
                wb = int(np.prod(w.shape)) * isz * (1 if phase == "fwd" else 2)     # weights (+ their gradients)
                busy["link:weight"] = wb / wlink.effective
                # PreU: the fused input stage (forward: C2 applies BN step 2 / ReLU / Add to its input;
                # backward: a conv feeding a BN applies F1*dz + B*x + C to its output gradient).
                # PostU: the fused output stage (forward: BN sums of a conv feeding a BN; backward:
                # error Add / ReLU' / BN sums on C2's input gradient).
                n_in = int(np.prod(x.shape)) * scale
                n_out = int(np.prod(out.shape)) * scale
                fused_in = name in sch.c2_of
                fused_out = name in sch.stat_of
                pre_el = (n_in if fused_in else 0) if phase == "fwd" else (n_out if fused_out else 0)
                post_el = (n_out if fused_out else 0) if phase == "fwd" else (n_in if fused_in else 0)
                pre = pre_el * p("preu_ops") / (p("preu_macs") * p("pu_rows") * f)
                post = post_el * p("postu_ops") / (p("postu_macs") * self.t.cores / 2 * f)
                busy["compute[PreU]"] = pre
                busy["compute[PostU]"] = post
                mapping = f"{'fused ' if sch.mode == 'fused' else ''}conv unit: {cyc:,.0f} PU cycles"
            else:
                elems = fbytes / isz
                busy["compute[VecU]"] = elems * p("vector_ops") / (self.t.compute["vector_ops_per_cycle"].value * f)
                mapping = "memory-bound unit on the vector unit"
            seconds = max(busy.values())
            lay_peak = 2.0 * array_macs * f
            rep = LayerReport(i, name, op.op if op is not None else "add (error)", tuple(op.outputs[0].shape)
                              if op is not None else (), flops, seconds, self.t.cores, lay_peak, f, busy,
                              {"link feature": fbytes, "link weight": int(busy.get("link:weight", 0) * wlink.effective)},
                              mapping, phase)
            reports.append(vector_peak(rep) if "compute[VecU]" in busy else rep)
        return reports
