"""The host CPU as a target: a roofline-style model of the machine tilefuse itself runs on.

Convolutions and linear layers run as `tiled_conv`: input and output tiles in each core's L2,
weight blocks in the shared L3, all double buffered, DRAM traffic over one shared link; a tile
computes at the cores' FMA rate with the output channels padded to whole vectors. Every other
op streams through L2. It is the baseline the accelerator models compare against and a target
for `tilefuse simulate` on a machine without an accelerator.
"""
from __future__ import annotations

import math

from ..report import Layer, LayerReport
from .base import Strategy


class Host(Strategy):
    name = "host"
    MEMORIES = ("L2", "L3", "DRAM")
    LINKS = ("dram",)
    PARAMS = {"vector_lanes": "count", "co_block": "count"}
    STREAM_MEMORY = "L2"
    STREAM_LINK = "dram"

    def _cycles(self, co, ci, kh, kw, pix):
        lanes = int(self.t.p("vector_lanes"))
        return math.ceil(co / lanes) * lanes * ci * kh * kw * pix / self.t.macs_per_cycle()


    def layer_conv2d(self, lay: Layer) -> LayerReport:
        return self.tiled_conv(lay, in_mem="L2", w_mem="L3", out_mem="L2", in_link="dram", w_link="dram",
                               out_link="dram", co_block=int(self.t.p("co_block")), cycles=self._cycles)

    layer_linear = layer_conv2d
