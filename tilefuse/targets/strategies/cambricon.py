"""Seed 002's platform: the Cambricon-X accelerator (dense mode) behind the QingLong runtime.

Device (002:304): 16 PEs, each with 16 FP16 multipliers and an adder tree (a 16-element dot
product per cycle) and its own 2 KB synapse buffer SB; one shared 8 KB input-neuron buffer NBin
and one 8 KB output-neuron buffer NBout. A conv / FC layer maps one output channel to each PE
(blocks of 16 channels), the PE's SB holds that channel's weights for a block of input
channels, input neurons stream through NBin and are broadcast to all PEs, outputs collect in
NBout: a tile of p output pixels over a Ci block costs p x ceil(Ci_block x kh x kw / 16) cycles.
Scale / BN / ReLU / pooling stream through NBin at 256 operations per cycle.

Host (QingLong, section 3.3): the constant segment is copied once, then every input is copied
in, computed and copied out; `qinglong_modes` gives the four modes of the evaluation
(DLPlib, QingLong1-3, table 2) from one simulated run. Nothing is measured on the machine
running the model: the compile time is the instruction compiler's per-instruction cost times
the instructions the run issued (every transfer and compute step of the tiles is one
instruction), plus REOFF packing for QingLong2/3; see `finish`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..report import Layer, LayerReport, SimReport
from ..spec import TargetError
from .base import Strategy


class CambriconX(Strategy):
    name = "cambricon-x"
    MEMORIES = ("SB", "NBin", "NBout", "DRAM")
    LINKS = ("dram", "host")
    PARAMS = {"dot_width": "count", "instruction_bytes": "count", "compile_per_instruction": "time",
              "pack_bandwidth": "bandwidth"}
    STREAM_MEMORY = "NBin"
    STREAM_LINK = "dram"

    @classmethod
    def check_target(cls, tgt) -> None:
        super().check_target(tgt)
        if tgt.p("dot_width") > tgt.macs_per_cycle():
            raise TargetError(tgt.path or tgt.name, f"param.dot_width: found {tgt.params['dot_width'].raw!r}, expected "
                              f"at most macs_per_cycle.{tgt.dtype} = {tgt.macs_per_cycle():g} (a PE's dot product "
                              f"cannot use more multipliers than it has)")

    def __init__(self, target, functional=True):
        super().__init__(target, functional)
        self.pes = target.cores

    def _cycles(self, co, ci, kh, kw, pix):
        return pix * math.ceil(ci * kh * kw / self.t.p("dot_width"))


    def layer_conv2d(self, lay: Layer) -> LayerReport:
        # the PEs work in lock step on one tile: one compute unit, the SBs per channel
        return self.tiled_conv(lay, in_mem="NBin", w_mem="SB", out_mem="NBout", in_link="dram", w_link="dram",
                               out_link="dram", co_block=self.pes, cycles=self._cycles, w_per_channel=True,
                               acc_bytes=2, cores=1, note=f"{self.pes} PEs x 1 channel, ")

    layer_linear = layer_conv2d

    def stream_layer(self, lay, memory=None, link=None, cores=None):
        return super().stream_layer(lay, memory, link, cores=1)

    def report(self, lay, mapping, cores=None, seconds=None, phase=""):
        # the PEs are the "cores" of the peak; they always work together
        return super().report(lay, mapping, self.pes, seconds, phase)

    def finish(self, report: SimReport, prog, layers) -> None:
        """The host side of QingLong (002 section 3.3) and of DLPlib, from the target's numbers:
        the constant area (the instructions the program issued, `instruction_bytes` each, then
        the bound constants: 002:3.2.3 "instructions first, then the data") copied as one data
        package (QingLong2/3) or block by block with every run (DLPlib, QingLong1: "拷入数据包,
        而无需用户逐一拷入每个常量", 002:3); the compile time as the instruction compiler's
        `compile_per_instruction` for every instruction plus, for QingLong2/3, REOFF packing
        (002:3.2.3: the constants reordered into the package at `pack_bandwidth`)."""
        pkg = prog.package
        p = self.t.p
        host = self.t.link("host")
        lat = host.latency.value if host.latency is not None else 0.0
        isz = np.dtype(self.t.dtype).itemsize
        in_b = sum(int(np.prod(s.shape)) for s in pkg.inputs) * isz
        out_b = sum(int(np.prod(s.shape)) for s in pkg.outputs) * isz
        consts = [int(np.prod(b.shape)) * isz for b in pkg.blocks if b.segment == "const"]
        instr = sum(r.instructions for r in report.layers)
        instr_b = instr * int(p("instruction_bytes"))
        total_b = sum(consts) + instr_b
        report.host = {"copy in": self.link_seconds("host", in_b), "copy out": self.link_seconds("host", out_b)}
        report.extra.update({
            "instructions": instr, "constant_blocks": len(consts), "constant_bytes": total_b,
            "constants_seconds": self.link_seconds("host", total_b),
            "constants_separate_seconds": (len(consts) + 1) * lat + total_b / host.effective,
            "compile_seconds": instr * p("compile_per_instruction"),
            "pack_seconds": total_b / p("pack_bandwidth"),
        })
        report.notes.append(f"{instr:,} instructions; constants ({total_b / 2**20:.2f} MiB in {self.t.dtype}, "
                            f"{len(consts)} blocks + the instructions) are copied once: "
                            f"{report.extra['constants_seconds'] * 1e3:.3f} ms over {host.effective / 1e9:.3g} GB/s")


@dataclass
class ModeTimes:
    """Seconds for n inputs under each mode of seed 002's evaluation (table 2)."""
    n: int
    compile: float              # instruction generation
    pack: float                 # REOFF packing of the data package (QingLong2/3 only)
    constants: float            # the data package, one copy
    constants_separate: float   # the constants block by block (DLPlib, QingLong1)
    copy_in: float
    compute: float
    copy_out: float

    def seconds(self, mode: str) -> float:
        c, k, i, x, o, n = self.compile, self.constants, self.copy_in, self.compute, self.copy_out, self.n
        ks = self.constants_separate
        if mode == "dlplib":       # compile and run coupled: everything for every input
            return n * (c + ks + i + x + o)
        if mode == "ql1":          # compile once, constants with every input
            return c + n * (ks + i + x + o)
        if mode == "ql2":          # compile and pack once, the package once
            return c + self.pack + k + n * (i + x + o)
        if mode == "ql3":          # ... and copy-in / compute / copy-out as a 3-stage pipeline
            return c + self.pack + k + i + x + o + (n - 1) * max(i, x, o)
        raise ValueError(f"mode '{mode}' is not one of dlplib, ql1, ql2, ql3")

    def speedup(self, mode: str) -> float:
        return self.seconds("dlplib") / self.seconds(mode)


def qinglong_modes(report: SimReport, n_inputs: int, compile_seconds: float | None = None) -> ModeTimes:
    """The four modes' times for n inputs from one simulated run on the cambricon-x target.
    compile_seconds: replaces the modelled instruction-generation time (a what-if)."""
    if "constants_seconds" not in report.extra:
        raise ValueError(f"qinglong_modes needs a cambricon-x report; got one for {report.target.name}")
    e = report.extra
    return ModeTimes(n_inputs, e["compile_seconds"] if compile_seconds is None else compile_seconds,
                     e["pack_seconds"], e["constants_seconds"], e["constants_separate_seconds"],
                     report.host["copy in"], report.seconds, report.host["copy out"])
