"""Seed 001's design on the VCK5000: 2-D convolution in 64 x 32 tiles on 7 AI Engine cores,
fed by PL data movers (targets/vck5000-aie.toml).

Per frame (001 section 1.2): the host copies the image into card DDR (an XRT buffer write, i.e.
a host memcpy, then a PCIe DMA: 001's host.cpp times both; the DMA's efficiency per direction is
the XRT rate measured on an Alveo of the same raw PCIe rate), the PL kernel `tile_mm2s` cuts it
into 64 x 32 tiles that overlap by 2 pixels (k - 1 for a k x k kernel) and sends groups of 7
tiles to the 7 AIE cores over 32-bit AXI streams; each core filters its tile (int32: 8 MACs per
cycle, `lmac8`); `sticker_s2mm` gathers the output tiles, drops their invalid border and writes
the frame; the host copies it back. The movers handle one 32-bit word per PL cycle and load
from DDR, then send, one after the other (001:117: "serial"), so each tile costs the input
mover 2 x 2048 cycles; the output mover runs concurrently with the input mover.

Networks: stride-1 convolutions run the same way per (output channel, input channel) plane
pair, the core accumulating the Ci planes of an output tile; other ops are not part of the
seed's design. `FilterJob` runs the seed's own workload (one int32 image, a 3x3 kernel,
replicated borders), computed with the imaging reference (exact integer arithmetic).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...errors import UnsupportedOpError
from ...imaging.reference import correlate_valid, extend
from ...kernels import reference as ref
from ..machine import Scratchpad
from ..report import Layer, LayerReport, SimReport
from .base import Strategy


@dataclass
class FilterJob:
    """One frame filtered with one kernel: the seed-001 workload.
    image: (H, W) array, or None with `shape` given (random ints 0..99 as in 001's host.cpp)."""
    kernel: np.ndarray
    image: np.ndarray | None = None
    shape: tuple[int, int] | None = None
    border: str = "replicate"
    dtype: str = "int32"

    def __post_init__(self):
        self.kernel = np.asarray(self.kernel)
        if self.kernel.ndim != 2 or self.kernel.shape[0] % 2 == 0 or self.kernel.shape[1] % 2 == 0:
            raise ValueError(f"FilterJob kernel: found shape {self.kernel.shape}, expected an odd (kh, kw)")
        if self.image is not None:
            self.image = np.asarray(self.image)
            if self.image.ndim != 2:
                raise ValueError(f"FilterJob image: found shape {self.image.shape}, expected (H, W)")
            self.shape = tuple(self.image.shape)
            self.dtype = self.image.dtype.name
        if self.shape is None:
            raise ValueError("FilterJob needs an image or a shape")


class VCK5000(Strategy):
    name = "vck5000-aie"
    MEMORIES = ("window", "DDR")
    LINKS = ("h2c", "c2h", "host_copy", "ddr_port")
    PARAMS = {"tile_width": "count", "tile_height": "count", "words_per_cycle": "positive", "load_send_serial": "flag",
              "kernel_overhead": "nonneg"}
    CLOCKS = ("aie", "pl")
    KERNELS = ("conv2d", "flatten", "reshape", "dropout")

    def unsupported(self, lay: Layer) -> str | None:
        if lay.kernel != "conv2d":
            return (f"seed 001's design is a 2-D convolution on AIE tiles fed by PL movers; it has no "
                    f"{lay.kernel}")
        p = lay.params
        if p["stride"] != (1, 1) or p["dilation"] != (1, 1) or p["groups"] != 1:
            return (f"the tiled AIE convolution needs stride 1, dilation 1, groups 1; found stride "
                    f"{p['stride']}, dilation {p['dilation']}, groups {p['groups']}")
        kh, kw = lay.weight.shape[2:]
        th, tw = int(self.t.p("tile_height")), int(self.t.p("tile_width"))
        if kh >= th or kw >= tw:
            return f"a {kh}x{kw} kernel does not fit a {th}x{tw} tile"
        return None

    # ------------------------------------------------------------------ the tiled plane filter

    def _word(self) -> int:
        return 4           # the PLIO and the AIE windows carry 32-bit words

    def _tiles(self, H: int, W: int, kh: int, kw: int):
        """Output tiles (r0, r1, q0, q1) covering H x W: a tile's input overlaps its neighbours by
        k - 1 (the repository's formula ceil((W - T) / (T - 2)) + 1 for 3 x 3)."""
        th, tw = int(self.t.p("tile_height")), int(self.t.p("tile_width"))
        oh, ow = th - (kh - 1), tw - (kw - 1)
        return [(r0, min(H, r0 + oh), q0, min(W, q0 + ow)) for r0 in range(0, H, oh) for q0 in range(0, W, ow)]

    def _run_planes(self, n_img: int, Ci: int, Co: int, H: int, W: int, kh: int, kw: int, read, compute,
                    write, dtype) -> dict:
        """Time (and, with callbacks, execute) the tiles of every (image, co) output plane.
        read(img, ci, r0, q0) -> input tile with halo; compute(tiles, co, ci) -> partial output
        tile; write(img, co, r0, r1, q0, q1, acc)."""
        th, tw = int(self.t.p("tile_height")), int(self.t.p("tile_width"))
        words = th * tw
        f_pl, f_aie = self.t.clock("pl"), self.t.clock("aie")
        wpc = self.t.p("words_per_cycle")
        serial = self.t.p("load_send_serial") >= 0.5
        cores = self.cores
        tiles = self._tiles(H, W, kh, kw)
        load = words / wpc / f_pl
        send = words / wpc / f_pl
        mm2s = load + send if serial else max(load, send)
        s2mm = 2 * words / wpc / f_pl if serial else words / wpc / f_pl
        macs = (th - kh + 1) * (tw - kw + 1) * kh * kw
        aie = (macs / self.t.macs_per_cycle(dtype) + self.t.p("kernel_overhead")) / f_aie
        win = {c: [self.pad("window", c).alloc(f"input window[{j}] {th}x{tw}", (th, tw), dtype) for j in range(2)]
               + [self.pad("window", c).alloc(f"output window[{j}] {th}x{tw}", (th, tw), dtype) for j in range(2)]
               for c in range(cores)}
        in_free = {c: [] for c in range(cores)}
        last_aie = {c: 0.0 for c in range(cores)}
        k = 0
        for img in range(n_img):
            for co in range(Co):
                for (r0, r1, q0, q1) in tiles:
                    c = k % cores
                    k += 1
                    acc = None
                    for ci in range(Ci):
                        hist = in_free[c]
                        dep = [hist[-2]] if len(hist) >= 2 else []         # ping-pong input window
                        t_in = self.tl.step("link:mm2s", mm2s, dep)       # the mover: load, then send
                        self.traffic.move("ddr_port", words * self._word(), "DDR")
                        self.traffic.move("plio", words * self._word(), "window")
                        last_aie[c] = self.compute(c, aie, [t_in, last_aie[c]])
                        hist.append(last_aie[c])
                        if read is not None:
                            tile = win[c][len(hist) % 2].load(read(img, ci, r0, q0))
                            part = compute(tile, co, ci)
                            acc = part if acc is None else acc + part
                    self.tl.step("link:s2mm", s2mm, [last_aie[c]])        # the output mover
                    self.traffic.move("plio", words * self._word(), "window")
                    self.traffic.move("ddr_port", (r1 - r0) * (q1 - q0) * self._word(), "DDR")
                    if write is not None:
                        win[c][2 + k % 2].load(np.zeros((th, tw), dtype) if acc is None else
                                               np.pad(acc, ((0, th - acc.shape[0]), (0, tw - acc.shape[1]))))
                        write(img, co, r0, r1, q0, q1, acc)
        return {"tiles": len(tiles), "aie_seconds_per_tile": aie, "mover_seconds_per_tile": mm2s}

    def layer_conv2d(self, lay: Layer) -> LayerReport:
        N, Ci, H, W = lay.in_shapes[0]
        _, Co, Ho, Wo = lay.out_shape
        kh, kw = lay.weight.shape[2:]
        pt, _, pl, _ = lay.params["padding"]
        th, tw = int(self.t.p("tile_height")), int(self.t.p("tile_width"))
        out = np.zeros(lay.out_shape, lay.dtype) if self.functional else None
        read = compute = write = None
        if self.functional:
            x, w = lay.x, lay.weight

            def read(img, ci, r0, q0):
                from .base import gather
                return gather(x, img, img + 1, ci, ci + 1, r0 - pt, th, q0 - pl, tw)[0, 0]

            def compute(tile, co, ci):          # (th, tw) -> (th - kh + 1, tw - kw + 1), the valid part
                return ref.conv2d(tile[None, None].astype(np.float32), w[co:co + 1, ci:ci + 1].astype(np.float32))[0, 0]

            def write(img, co, r0, r1, q0, q1, acc):
                out[img, co, r0:r1, q0:q1] = acc[:r1 - r0, :q1 - q0]
        info = self._run_planes(N, Ci, Co, Ho, Wo, kh, kw, read, compute, write, lay.dtype.name)
        if self.functional:
            from .base import epilogue
            lay.out = epilogue(out.astype(np.float32), lay.bias, lay.residual, lay.params["relu"], lay.dtype,
                              lay.params.get("act"))
        return self.report(lay, f"{info['tiles']} tiles of {th}x{tw} per plane x {N * Co * Ci} plane pairs on "
                                f"{self.cores} AIE cores; mover {info['mover_seconds_per_tile'] * 1e6:.2f} us, "
                                f"AIE {info['aie_seconds_per_tile'] * 1e6:.2f} us per tile")

    # ------------------------------------------------------------------ host side

    def _host(self, nbytes: float, dma: str) -> dict:
        """One frame's host copy as 001's host.cpp times it: host -> device is xrt::bo::write (a
        memcpy into the buffer's host copy) then sync (the PCIe DMA, link h2c); device -> host
        is sync (link c2h) then xrt::bo::read (a memcpy out). The two run one after the other."""
        return {"copy": nbytes / self.t.link("host_copy").effective, "dma": self.link_seconds(dma, nbytes)}

    def finish(self, report: SimReport, prog, layers) -> None:
        isz = np.dtype(self.t.dtype).itemsize
        pkg = prog.package
        in_b = sum(int(np.prod(s.shape)) for s in pkg.inputs) * isz
        out_b = sum(int(np.prod(s.shape)) for s in pkg.outputs) * isz
        report.host = {"host -> device": sum(self._host(in_b, "h2c").values()),
                       "device -> host": sum(self._host(out_b, "c2h").values())}

    def simulate_job(self, job, inputs=None, seed: int = 0) -> SimReport:
        if not isinstance(job, FilterJob):
            raise TypeError(f"the vck5000-aie target simulates a compiled program or a FilterJob, got "
                            f"{type(job).__name__}")
        H, W = job.shape
        kh, kw = job.kernel.shape
        dt = np.dtype(job.dtype)
        if f"macs_per_cycle.{dt.name}" not in self.t.compute:
            raise UnsupportedOpError(f"FilterJob dtype {dt} has no MAC rate on {self.t.name}")
        self.begin()
        out = read = compute = write = None
        th, tw = int(self.t.p("tile_height")), int(self.t.p("tile_width"))
        if kh >= th or kw >= tw:
            raise UnsupportedOpError(f"FilterJob: a {kh}x{kw} kernel does not fit a {th}x{tw} tile "
                                     f"(param.tile_height / param.tile_width of {self.t.name})")
        # the two input windows of a tile must fit (CapacityError) before the frame is padded to whole tiles
        probe = Scratchpad("window", self.t.capacity("window"), False)
        for j in range(2):
            probe.alloc(f"input window[{j}] {th}x{tw}", (th, tw), dt)
        if self.functional:
            img = job.image
            if img is None:
                img = np.random.default_rng(seed).integers(0, 100, size=(H, W)).astype(dt)
            job.image = img
            padded = extend(img, kh // 2, th, kw // 2, tw, job.border)     # borders as the movers fill them
            out = np.zeros((H, W), dt)
            acc_dt = np.int32 if dt.kind in "iu" else np.float32

            def read(i, ci, r0, q0):
                return padded[r0:r0 + th, q0:q0 + tw]

            def compute(tile, co, ci):      # exact integer arithmetic: the imaging reference
                return correlate_valid(tile, job.kernel, acc_dt)

            def write(i, co, r0, r1, q0, q1, acc):
                out[r0:r1, q0:q1] = acc[:r1 - r0, :q1 - q0]
        info = self._run_planes(1, 1, 1, H, W, kh, kw, read, compute, write, dt.name)
        flops = 2 * H * W * kh * kw
        lay = Layer(0, "filter2d", "filter2d", {}, [], [(H, W)], (H, W), flops, dt)
        rep = self.report(lay, f"{info['tiles']} tiles of {th}x{tw} on {self.cores} AIE cores; mover "
                               f"{info['mover_seconds_per_tile'] * 1e6:.2f} us, AIE "
                               f"{info['aie_seconds_per_tile'] * 1e6:.2f} us per tile")
        nbytes = H * W * dt.itemsize
        h2d, d2h = self._host(nbytes, "h2c"), self._host(nbytes, "c2h")
        sr = SimReport(self.t, self.cores, [rep], [out] if out is not None else None,
                       host={"host -> device": sum(h2d.values()), "device -> host": sum(d2h.values())})
        sr.extra.update({"h2d": h2d, "d2h": d2h, "tiles": info["tiles"]})
        return sr
