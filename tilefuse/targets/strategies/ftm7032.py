"""Seed 000's mapping onto one FT-M7032 GPDSP cluster (targets/ft-m7032.toml).

Every mechanism below is one the seed describes; the line is given (seeds/000_*.txt).

Data: FP16 in the N4CHW4 layout (four images side by side in each 64-bit word, 000:90-92), so
the batch is padded to a multiple of 4 and every vector lane works on 4 images. A vector
register spans the 16 VPEs: 16 words = 64 FP16 values.

conv 1x1 (000:100-113, feature-map-level parallel): the output channels are split over the n
  cores (m_core = ceil(Co/n)); each core's weight blocks Wb (m x K) go point-to-point into its
  SM, the input block Ib (K x Nb) is broadcast from GSM/DDR into every core's AM; when all cores
  have computed a block, the outputs go to AM and then to GSM/DDR, and the next block follows.
  Blocking (3.1.1, 000:154-156): Nb is the block of the Hi x Wi x 4 dimension (FP16 values),
  a multiple of 192 = 3 vector registers, one per FMAC of a VPE; m in 6..12; K = Ci halved until
  the two Wb fit SM; Nb grown by 192 while two Ib and Ob fit AM (K halved if even 192 does not).
  Inner kernel (Algorithm 1, 000:171-207): for each K step one row chunk of 3 vector registers is
  loaded; for each of the m weights a scalar load from SM, an expand and a broadcast to a vector
  register, and 3 FMAs into the m accumulator groups. One broadcast feeds the 3 FMACs, so a
  K step costs m cycles at one broadcast per cycle; m >= 6 covers the FMA pipeline and
  3m + 3 + m registers (accumulators, the row, the broadcasts) must fit the 64 per VPE, which is
  where m <= 12 comes from. The Wb blocks stream per Ib block, two buffers in SM (2.4).
conv k x k (000:115-119, 3.2, window-level parallel): output rows (of all image groups) are split
  over the cores; Wb [kh][kw][64][48][4] (weights replicated for the 4 images of a word) are
  broadcast from DDR into every core's AM, Ib [64][kh][Wib][4] go point-to-point into SM; Wib is
  the widest block whose two Ib fit SM (3.2.1). Only the SM input has two buffers (2.4, 000:131:
  "for kernels larger than 1x1, two buffers in SM for the input"); the single Wb buffer in AM
  is refilled, for every Ib block, once every core has finished with it (000:119: per block the
  input, then the weights, then compute, store, next block). Inner kernel (Algorithm 2): per
  output word, input channel and tap, a vector load of the 48 x 4 weights (3 registers), a
  scalar load + broadcast of the input word and 3 FMAs into the tap's own accumulator group
  (9 groups); then the 9 groups are summed; the Ci blocks accumulate in Ob (FP32); Algorithm 3
  transposes the Wib x 48 block before it leaves (000:290).
linear: as conv 1x1 over (N, K, 1, 1) (000:352). Other ops stream through AM (base.stream_layer).
Fusion (000:352): the BN and the ReLU after a convolution are applied in registers before the
  store; a residual Add the program fused into a convolution runs as its own streamed pass
  (param fuse_residual = 0; 1 keeps tilefuse's fusion).
Synchronisation: a block's outputs leave only when every core has computed it ("所有核都计算结束
  后", 000:113; "等到所有核的卷积计算完成", 000:119); Ob has one buffer (2.4), so a core's next
  block waits for its store.
Tensors live in GSM when they fit its share (param gsm_tensor_fraction), else in DDR (000:106).
"""
from __future__ import annotations

import math

import numpy as np

from ...kernels import reference as ref
from ..report import Layer, LayerReport
from ..spec import TargetError
from .base import ConvGeom, Strategy, epilogue, gather


class FTM7032(Strategy):
    name = "ft-m7032"
    MEMORIES = ("SM", "AM", "GSM", "DDR")
    LINKS = ("ddr", "gsm")
    PARAMS = {"images_per_word": "count", "m_min": "count", "m_max": "count", "nb_unit": "count", "ci_block": "count",
              "co_block": "count", "vpes": "count", "fmacs": "positive", "vector_registers": "count",
              "reserved_registers": "count0", "broadcasts_per_cycle": "positive", "vector_bytes_per_cycle": "positive",
              "stores_per_cycle": "positive", "fmac_latency": "nonneg", "loop_overhead": "nonneg",
              "gsm_tensor_fraction": "fraction", "fuse_residual": "flag", "kxk_weight_buffers": "count"}
    STREAM_MEMORY = "AM"
    STREAM_LINK = "ddr"

    @classmethod
    def check_target(cls, tgt) -> None:
        super().check_target(tgt)
        fm, vp, ipw = (tgt.p(k) for k in ("fmacs", "vpes", "images_per_word"))
        if fm * vp * ipw > tgt.macs_per_cycle():
            raise TargetError(tgt.path or tgt.name, f"param.fmacs x vpes x images_per_word = {fm:g} x {vp:g} x {ipw:g} "
                              f"MACs per cycle, more than compute.macs_per_cycle.{tgt.dtype} = {tgt.macs_per_cycle():g}"
                              f" of a core: change them together")
        if tgt.p("m_min") > tgt.p("m_max") or tgt.p("reserved_registers") >= tgt.p("vector_registers"):
            raise TargetError(tgt.path or tgt.name, f"param.m_min / m_max / reserved_registers / vector_registers: "
                              f"found {tgt.p('m_min'):g} / {tgt.p('m_max'):g} / {tgt.p('reserved_registers'):g} / "
                              f"{tgt.p('vector_registers'):g}; expected m_min <= m_max and reserved < vector registers")

    # ------------------------------------------------------------------ helpers

    def _where(self, nbytes: float) -> str:
        """Link a tensor of nbytes travels on: GSM if it fits GSM's share, else DDR."""
        return "gsm" if nbytes <= self.t.p("gsm_tensor_fraction") * self.t.capacity("GSM") else "ddr"

    def _lanes(self) -> int:
        return int(self.t.p("images_per_word"))

    def _word_bytes(self) -> int:
        return 8            # one 64-bit VPE register word (000:77, 000:90)

    def _vreg_values(self) -> int:
        """FP16 values in one vector register: 16 VPEs x 4 (000:77)."""
        return int(self.t.p("vpes")) * self._lanes()

    def _cyc(self, cycles: float) -> float:
        return cycles / self.t.clock()

    def stream_layer(self, lay, memory=None, link=None, cores=None):
        x_bytes = int(np.prod(lay.in_shapes[0])) * lay.itemsize
        return super().stream_layer(lay, memory, link or self._where(x_bytes), cores)

    # ------------------------------------------------------------------ conv 1x1 / linear

    def chunk_vregs(self) -> int:
        """Vector registers of one Nb unit (192 FP16 values = 3 registers: one per FMAC)."""
        return max(1, int(self.t.p("nb_unit")) // self._vreg_values())

    def k1x1_cycles(self, m: int, K: int, npx: int, first_k: bool = True) -> float:
        """Algorithm 1 on one (Wb m x K, Ib K x npx words) pair, in chunks of `chunk_vregs`
        registers: per K step max(3 FMAs per broadcast weight at `fmacs` per cycle, the m
        broadcasts, the row's vector loads, the FMA pipeline); per chunk the pipeline drain, the m x v stores to AM
        (and, for a later K block, the loads of the partial sums) and the loop set-up."""
        p = self.t.p
        fm, bc = p("fmacs"), p("broadcasts_per_cycle")
        vb = self._vreg_values() // self._lanes() * self._word_bytes()      # bytes per vector register
        loads = p("vector_bytes_per_cycle") / vb                              # registers loaded per cycle
        unit = self.chunk_vregs()
        vecs = math.ceil(npx / p("vpes"))                                     # registers per Ib row
        cyc = 0.0
        for c0 in range(0, vecs, unit):
            v = min(unit, vecs - c0)
            # an accumulator group takes one FMA per K step: a step shorter than the FMA
            # pipeline stalls (why m >= 6, 000:156)
            per_k = max(m * v / fm, m / bc, v / loads, p("fmac_latency"))
            tail = p("fmac_latency") + m * v / p("stores_per_cycle") + p("loop_overhead")
            if not first_k:
                tail += m * v / loads + m * v / fm                           # reload and add the partial sums
            cyc += K * per_k + tail
        return cyc

    def blocking_1x1(self, Co: int, Ci: int, P: int, n: int, isz: int) -> dict:
        """Section 3.1.1: m in 6..12 (the value that pads m_core least; m <= 12 also keeps the
        3m accumulators, the row and the m broadcast registers within 64 minus the reserved);
        K = Ci halved until two Wb fit SM; Nb = 192 values (K halved until two Ib fit AM beside
        Ob), then grown by 192 while they fit. Ob holds the partial sums of `m_pass` channels
        (all of the core's when they fit; FP32 when K is split). Sizes in pixel words (P: words
        of one image group; Nb values = 4 x words)."""
        p = self.t.p
        lanes = self._lanes()
        m_core = math.ceil(Co / n)
        v = self.chunk_vregs()
        regs = int(p("vector_registers") - p("reserved_registers"))
        m_lo, m_hi = int(p("m_min")), min(int(p("m_max")), max(1, (regs - v) // (v + 1)))
        m = min(range(m_lo, max(m_lo, m_hi) + 1), key=lambda mm: (math.ceil(m_core / mm) * mm - m_core, -mm))
        m = min(m, m_core)
        sm, am = self.t.capacity("SM"), self.t.capacity("AM")
        unit = max(1, int(p("nb_unit")) // lanes)            # 192 values = 48 words
        nb_max = max(1, math.ceil(P / unit)) * unit
        if P < unit:                    # a short row (FC, small maps): whole vector registers
            unit = nb_max = math.ceil(P / p("vpes")) * int(p("vpes"))

        def am_bytes(k, nb, mp):
            acc = isz if k == Ci else 4          # split K: partial sums kept in FP32
            return 2 * k * nb * lanes * isz + mp * nb * lanes * acc
        K = Ci
        while K > 1 and 2 * m * K * isz > sm:
            K = math.ceil(K / 2)
        while K > 1 and am_bytes(K, unit, m) > am:
            K = math.ceil(K / 2)
        m_pass = m_core
        while m_pass > m and am_bytes(K, unit, m_pass) > am:
            m_pass -= m
        nb = unit
        while nb + unit <= nb_max and am_bytes(K, nb + unit, m_pass) <= am:
            nb += unit
        return {"m_core": m_core, "m": m, "K": K, "Nb": nb, "m_pass": m_pass, "acc": isz if K == Ci else 4}

    def layer_linear(self, lay: Layer) -> LayerReport:
        """A fully connected layer as conv 1x1 (section 4.5.1): the N4 image groups take the
        place of the pixels, x (N, K) -> N4CHW4 words (4, K, 1, N4), word [l, k, 0, p] = x[4p + l, k]."""
        n_, k_ = lay.in_shapes[0]
        co = lay.out_shape[1]
        lanes = self._lanes()
        n4 = math.ceil(n_ / lanes)
        x4 = None
        if lay.x is not None:
            xp = np.zeros((n4 * lanes, k_), lay.dtype)
            xp[:n_] = lay.x
            x4 = np.ascontiguousarray(xp.reshape(n4, lanes, k_).transpose(1, 2, 0)[:, :, None, :])
        w = lay.weight.reshape(co, k_, 1, 1)
        rep = self._conv1x1(lay, x4, w, lay.bias, None, (lanes, k_, 1, n4), (lanes, co, 1, n4), (1, 1), False,
                            lay.params.get("relu", False))
        if lay.out is not None:      # (4, Co, 1, N4) -> (N4, 4, Co) -> (N, Co)
            lay.out = lay.out[:, :, 0, :].transpose(2, 0, 1).reshape(n4 * lanes, co)[:n_]
        return rep

    def layer_conv2d(self, lay: Layer) -> LayerReport:
        p = lay.params
        if p["has_residual"] and self.t.p("fuse_residual") < 0.5:
            return self._conv_then_add(lay)
        w = lay.weight
        if w.shape[2:] == (1, 1) and p["padding"] == (0, 0, 0, 0):
            return self._conv1x1(lay, lay.x, w, lay.bias, lay.residual, lay.in_shapes[0], lay.out_shape,
                                 p["stride"], p["has_residual"], p["relu"])
        return self._convkxk(lay)

    def _conv_then_add(self, lay: Layer) -> LayerReport:
        """A convolution whose program fuses a residual Add: the seed fuses only the BN and the
        ReLU into the convolution (000:352), so the conv stores its BN'd output and the Add (with
        the ReLU that follows it) streams through AM as its own element-wise pass."""
        params, res = lay.params, lay.residual
        lay.params, lay.residual = dict(params, has_residual=False, relu=False, act=None), None
        try:
            conv = self.layer_conv2d(lay)
        finally:
            lay.params, lay.residual = params, res
        self.begin()
        add = Layer(lay.index, lay.name + ".add", "add", {"relu": params["relu"]}, [lay.out, res],
                    [lay.out_shape, lay.out_shape], lay.out_shape, 0, lay.dtype, functional=self.functional,
                    act_inputs=(0, 1))
        tail = self.stream_layer(add)
        lay.out = ref.apply_act(add.out, params.get("act")).astype(lay.dtype, copy=False) \
            if add.out is not None else None        # the fused activation after the Add (reference order)
        busy = dict(conv.busy)
        for k, v in tail.busy.items():
            busy[k] = busy.get(k, 0.0) + v
        nbytes = dict(conv.bytes)
        for k, v in tail.bytes.items():
            nbytes[k] = nbytes.get(k, 0) + v
        peaks = {k: max(conv.peaks.get(k, 0), tail.peaks.get(k, 0)) for k in set(conv.peaks) | set(tail.peaks)}
        return LayerReport(lay.index, lay.name, lay.kernel, lay.out_shape, lay.flops, conv.seconds + tail.seconds,
                           conv.cores, conv.peak, conv.clock, busy, nbytes,
                           f"{conv.mapping}; then the residual Add{' + ReLU' if params['relu'] else ''} "
                           f"{tail.mapping}", "", peaks, conv.instructions + tail.instructions)

    def _conv1x1(self, lay, x, w, bias, residual, xshape, oshape, stride, has_res, relu) -> LayerReport:
        n = self.cores
        N, Ci, H, W = xshape
        _, Co, Ho, Wo = oshape
        isz = lay.itemsize
        lanes = self._lanes()
        groups = math.ceil(N / lanes)
        P = Ho * Wo
        blk = self.blocking_1x1(Co, Ci, P, n, isz)
        m_core, m, K, nb, m_pass = blk["m_core"], blk["m"], blk["K"], blk["Nb"], blk["m_pass"]
        src_in = self._where(groups * lanes * Ci * H * W * isz)
        src_out = self._where(groups * lanes * Co * P * isz)
        lv_in, lv_out = ("DDR" if src_in == "ddr" else "GSM"), ("DDR" if src_out == "ddr" else "GSM")
        used = min(n, math.ceil(Co / m_core))
        ranges = [(c * m_core, min(Co, (c + 1) * m_core)) for c in range(used)]
        wb = {c: [self.pad("SM", c).alloc(f"Wb[{j}] {m}x{K}", (m, K), lay.dtype) for j in range(2)]
              for c in range(used)}
        ib = {c: [self.pad("AM", c).alloc(f"Ib[{j}] {K}x{nb * lanes}", (lanes, K, 1, nb), lay.dtype)
                  for j in range(2)] for c in range(used)}
        ob = {c: self.pad("AM", c).alloc(f"Ob {m_pass}x{nb * lanes}", (lanes, m_pass, 1, nb),
                                         np.float32 if blk["acc"] == 4 else lay.dtype) for c in range(used)}
        out = np.zeros(oshape, lay.dtype) if self.functional else None
        # FP16 values, multiplied and summed in FP32 (the reference kernel's accumulation)
        w32 = w.astype(np.float32) if self.functional else None
        kblocks = [(k0, min(Ci, k0 + K)) for k0 in range(0, Ci, K)]
        pblocks = [(p0, min(P, p0 + nb)) for p0 in range(0, P, nb)]
        passes = [(q0, q0 + m_pass) for q0 in range(0, m_core, m_pass)]
        sh, sw = stride
        ib_used: list[float] = []       # per Ib load: when every core has finished computing on it
        c_last = {c: 0.0 for c in range(used)}
        wb_used = {c: [] for c in range(used)}
        st_end = {c: 0.0 for c in range(used)}
        cyc: dict = {}
        for g in range(groups):
            nn = min(lanes, N - g * lanes)
            for (p0, p1) in pblocks:
                npx = p1 - p0
                rows, cols = (p0 + np.arange(npx)) // Wo, (p0 + np.arange(npx)) % Wo
                for (q0, q1) in passes:
                    for kb, (k0, k1) in enumerate(kblocks):
                        # Ib: one broadcast into every core's AM; ping-pong: it waits until the
                        # computes on the load two back have finished
                        t_ib = self.xfer(src_in, (k1 - k0) * npx * lanes * isz,
                                         [ib_used[-2]] if len(ib_used) >= 2 else [], levels=(lv_in, "AM"))
                        if kb == 0:
                            self.flush()            # the previous block's Ob stores follow this prefetch
                        tile = None
                        if self.functional:
                            tile = np.zeros((lanes, k1 - k0, 1, npx), lay.dtype)       # N4CHW4 block
                            tile[:nn, :, 0, :] = x[g * lanes:g * lanes + nn, k0:k1][:, :, rows * sh, cols * sw]
                        ends = []
                        for c, (co0, co1) in enumerate(ranges):
                            ibv = ib[c][len(ib_used) % 2].load(tile, (lanes, k1 - k0, 1, npx))
                            for b0 in range(co0 + q0, min(co1, co0 + q1), m):
                                b1 = min(co1, co0 + q1, b0 + m)
                                # Wb point-to-point into SM (000:106), two buffers (2.4)
                                uses = wb_used[c]
                                t_w = self.xfer(src_in, (b1 - b0) * (k1 - k0) * isz,
                                                [uses[-2]] if len(uses) >= 2 else [], core=c, levels=(lv_in, "SM"))
                                wb[c][len(uses) % 2].load(None, (b1 - b0, k1 - k0))
                                key = (b1 - b0, k1 - k0, npx, kb == 0)
                                if key not in cyc:
                                    cyc[key] = self._cyc(self.k1x1_cycles(*key))
                                deps = [t_ib, t_w, c_last[c]] + ([st_end[c]] if kb == 0 else [])  # Ob: one buffer
                                c_last[c] = self.compute(c, cyc[key], deps)
                                wb_used[c].append(c_last[c])
                            a0, a1 = co0 + q0, min(co1, co0 + q1)
                            if self.functional and a1 > a0:
                                # the m-blocks' weight data is the layer's constant; one call covers them
                                part = ref.conv2d(ibv[:nn].astype(np.float32), w32[a0:a1, k0:k1])  # (n, co, 1, npx)
                                acc = ob[c].array[:nn, :a1 - a0, :, :npx]
                                if kb == 0:
                                    acc[...] = part
                                else:
                                    acc += part
                            ends.append(c_last[c])
                        ib_used.append(max(ends))
                    # when every core has computed the block (000:113), Ob (and the residual tile
                    # the epilogue reads) goes back to GSM/DDR
                    barrier = max(c_last.values())
                    for c, (co0, co1) in enumerate(ranges):
                        a0, a1 = co0 + q0, min(co1, co0 + q1)
                        if a1 <= a0:
                            continue
                        nbytes = (a1 - a0) * npx * lanes * isz
                        self.defer(lambda b=nbytes * (2 if has_res else 1), t=barrier, cc=c: st_end.__setitem__(
                            cc, self.xfer(src_out, b, [t], core=cc, levels=("AM", lv_out))))
                        if self.functional:
                            acc = ob[c].array[:nn, :a1 - a0, 0, :npx]                    # (n, co, npx)
                            res = residual[g * lanes:g * lanes + nn, a0:a1][:, :, rows, cols] if has_res else None
                            y = epilogue(acc, bias[a0:a1] if bias is not None else None, res, relu, lay.dtype,
                                         lay.params.get("act"))
                            view = out[g * lanes:g * lanes + nn, a0:a1]
                            view[:, :, rows, cols] = y
        self.flush()
        lay.out = out
        return self.report(lay, f"1x1: Co split {used} way(s), m_core={m_core}, Wb {m}x{K} in SM"
                                f", Ib {K}x{nb * lanes} in AM"
                                + (f", {len(passes)} passes" if len(passes) > 1 else "") + f", via {src_in}")

    # ------------------------------------------------------------------ conv k x k

    def kxk_cycles(self, npix: int, cib: int, kh: int, kw: int, cob: int, first_ci: bool = True) -> float:
        """Algorithms 2-3 for npix output words x cob (48) channels x 4 images over cib channels:
        per tap max(the 3 FMAs, the input word's broadcast, the 3-register weight load); per
        word the sum of the kh*kw accumulator groups, the partial sums of earlier Ci blocks
        loaded and added, the pipeline drain, the store and the loop set-up; per block the
        Wib x 48 transpose (loads and stores of the block)."""
        p = self.t.p
        fm = p("fmacs")
        vecs = math.ceil(cob / p("vpes"))                # 48 channels -> 3 vector registers
        vb = self._vreg_values() // self._lanes() * self._word_bytes()
        loads = p("vector_bytes_per_cycle") / vb
        per_tap = max(vecs / fm, 1 / p("broadcasts_per_cycle"), vecs / loads)
        taps = kh * kw
        # a tap's accumulator group takes one FMA per input channel (the 9 groups of Algorithm 2)
        per_tap = max(per_tap, p("fmac_latency") / taps)
        tail = (taps - 1) * vecs / fm + p("fmac_latency") + vecs / p("stores_per_cycle") + p("loop_overhead")
        if not first_ci:
            tail += vecs / loads + vecs / fm
        transpose = 2 * npix * vecs / p("stores_per_cycle")
        return npix * (cib * taps * per_tap + tail) + transpose

    def _convkxk(self, lay: Layer) -> LayerReport:
        p = lay.params
        n = self.cores
        g_ = ConvGeom(lay)
        N, Ci, H, W, Co, Ho, Wo, kh, kw = g_.N, g_.Ci, g_.H, g_.W, g_.Co, g_.Ho, g_.Wo, g_.kh, g_.kw
        sh, sw, dh, dw, pt, pl = g_.sh, g_.sw, g_.dh, g_.dw, g_.pt, g_.pl
        isz = lay.itemsize
        lanes = self._lanes()
        groups = math.ceil(N / lanes)
        cib = min(int(self.t.p("ci_block")), Ci)
        cob = int(self.t.p("co_block"))
        co_pad = math.ceil(Co / cob) * cob
        span_h = (kh - 1) * dh + 1
        sm, am = self.t.capacity("SM"), self.t.capacity("AM")
        width = lambda q: (q - 1) * sw + (kw - 1) * dw + 1  # noqa: E731  input columns for q outputs
        sm_need = lambda c, q: 2 * c * span_h * width(q) * lanes * isz  # noqa: E731  two Ib
        wb_bytes = lambda c: kh * kw * c * cob * lanes * isz  # noqa: E731  one Wb
        ob_bytes = lambda q: lanes * co_pad * q * 4  # noqa: E731  FP32 partial sums
        # Ci block: 64 (section 3.2.1, chosen for ResNet50's 3x3 layers and AM), halved until one
        # Wb and a one-word Ob fit AM (larger kernels, a smaller AM) and two one-word Ib fit SM
        while cib > 1 and (max(1, int(self.t.p("kxk_weight_buffers"))) * wb_bytes(cib) + ob_bytes(1) > am
                           or sm_need(cib, 1) > sm):
            cib = math.ceil(cib / 2)
        wbufs = max(1, int(self.t.p("kxk_weight_buffers")))     # 1: section 2.4 (000:131)
        # Wib: the widest output segment whose two Ib fit SM and whose Ob fits AM beside the Wb
        wib = Wo
        while wib > 1 and (sm_need(cib, wib) > sm or wbufs * wb_bytes(cib) + ob_bytes(wib) > am):
            wib -= 1
        win = width(wib)
        ci_blocks = [(c0, min(Ci, c0 + cib)) for c0 in range(0, Ci, cib)]
        co_blocks = [(c0, min(Co, c0 + cob)) for c0 in range(0, Co, cob)]
        segs = [(q0, min(Wo, q0 + wib)) for q0 in range(0, Wo, wib)]
        link_in = self._where(groups * lanes * Ci * H * W * isz)
        link_out = self._where(groups * lanes * Co * Ho * Wo * isz)
        link_w = "ddr"          # weight blocks come from DDR (section 2.2.2)
        # work items (image group, output row, segment), split into n contiguous parts
        items = [(g, r, s) for g in range(groups) for r in range(Ho) for s in range(len(segs))]
        per = math.ceil(len(items) / n)
        used = min(n, math.ceil(len(items) / per))
        parts = [items[c * per:(c + 1) * per] for c in range(used)]
        sms = {c: self.pad("SM", c) for c in range(used)}
        ams = {c: self.pad("AM", c) for c in range(used)}
        ibuf = {c: [sms[c].alloc(f"Ib[{j}] {cib}x{span_h}x{win}x{lanes}", (lanes, cib, span_h, win), lay.dtype)
                    for j in range(2)] for c in range(used)}
        wbuf = {c: [ams[c].alloc(f"Wb[{j}] {kh}x{kw}x{cib}x{cob}x{lanes}", (kh, kw, cib, cob, lanes), lay.dtype)
                    for j in range(wbufs)] for c in range(used)}
        obuf = {c: ams[c].alloc(f"Ob {co_pad}x{wib}x{lanes} (FP32 partial sums)", (lanes, co_pad, 1, wib),
                                np.float32) for c in range(used)}
        out = np.zeros(lay.out_shape, lay.dtype) if self.functional else None
        w = lay.weight
        w32 = w.astype(np.float32) if self.functional else None    # FP16 values, FP32 products and sums
        c_end = {c: [] for c in range(used)}
        ib_ends = {c: [] for c in range(used)}
        st_end = {c: 0.0 for c in range(used)}
        cyc_cache: dict = {}
        wb_used: list[float] = []       # per Wb broadcast: when every core has finished with it
        for step in range(per):
            active = [c for c in range(used) if step < len(parts[c])]
            for cb, (ci0, ci1) in enumerate(ci_blocks):
                # each core: its Ib into SM (ping-pong: waits for the compute two Ib loads back)
                ib_t = {}
                for c in active:
                    g, r, s = parts[c][step]
                    q0, q1 = segs[s]
                    nq = (q1 - q0 - 1) * sw + (kw - 1) * dw + 1
                    hist = ib_ends[c]
                    dep = [hist[-2][1]] if len(hist) >= 2 else []
                    t = self.xfer(link_in, (ci1 - ci0) * span_h * nq * lanes * isz, dep, core=c,
                                  levels=("DDR" if link_in == "ddr" else "GSM", "SM"))
                    ib_t[c] = t
                    tile = gather(lay.x, g * lanes, (g + 1) * lanes, ci0, ci1, r * sh - pt, span_h, q0 * sw - pl,
                                  nq, dh, 1, batch_pad=lanes) if self.functional else None
                    view = ibuf[c][len(hist) % 2].load(tile, (lanes, ci1 - ci0, span_h, nq))
                    hist.append([view, 0.0])
                if cb == 0:
                    self.flush()                    # the previous step's Ob stores follow these prefetches
                for ob0, (co0, co1) in enumerate(co_blocks):
                    # Wb: one broadcast into every core's AM, into its buffer once every core has
                    # finished computing on the block that buffer held (one buffer: the previous)
                    free = [wb_used[-wbufs]] if len(wb_used) >= wbufs else []
                    t_w = self.xfer(link_w, wb_bytes(ci1 - ci0), free, levels=("DDR", "AM"))
                    last = []
                    for c in active:
                        g, r, s = parts[c][step]
                        q0, q1 = segs[s]
                        wbuf[c][len(wb_used) % wbufs].load(None, (kh, kw, ci1 - ci0, cob, lanes))
                        key = (q1 - q0, ci1 - ci0, cb == 0)
                        if key not in cyc_cache:
                            cyc_cache[key] = self._cyc(self.kxk_cycles(q1 - q0, ci1 - ci0, kh, kw, cob, cb == 0))
                        deps = [ib_t[c], t_w] + ([c_end[c][-1]] if c_end[c] else [])
                        if cb == 0 and ob0 == 0:
                            deps.append(st_end[c])          # Ob: one buffer
                        tc = self.compute(c, cyc_cache[key], deps)
                        c_end[c].append(tc)
                        last.append(tc)
                    wb_used.append(max(last))
                for c in active:
                    ib_ends[c][-1][1] = c_end[c][-1]       # this Ib buffer is free again
                    if self.functional:
                        # every 48-channel Wb block of this Ci block has passed through AM; the
                        # weight data is the layer's constant, so one call covers all of them
                        g, r, s = parts[c][step]
                        q0, q1 = segs[s]
                        nn = min(lanes, N - g * lanes)
                        part = ref.conv2d(ib_ends[c][-1][0][:nn].astype(np.float32), w32[:, ci0:ci1], None,
                                          (1, sw), (0, 0, 0, 0), (1, dw))    # (n, Co, 1, q1 - q0)
                        acc = obuf[c].array[:nn, :Co, :, :q1 - q0]
                        if cb == 0:
                            acc[...] = part
                        else:
                            acc += part
            # every core has computed its block (000:119): the Ob blocks leave for GSM/DDR
            barrier = max(c_end[c][-1] for c in active)
            for c in active:
                g, r, s = parts[c][step]
                q0, q1 = segs[s]
                nbytes = Co * (q1 - q0) * lanes * isz
                self.defer(lambda b=nbytes * (2 if p["has_residual"] else 1), t=barrier, cc=c: st_end.__setitem__(
                    cc, self.xfer(link_out, b, [t], core=cc, levels=("AM", "DDR" if link_out == "ddr" else "GSM"))))
                if self.functional:
                    nn = min(lanes, N - g * lanes)
                    acc = obuf[c].array[:nn, :Co, 0, :q1 - q0]
                    res = lay.residual[g * lanes:g * lanes + nn, :, r, q0:q1] if p["has_residual"] else None
                    out[g * lanes:g * lanes + nn, :, r, q0:q1] = epilogue(acc, lay.bias, res, p["relu"], lay.dtype,
                                                                                 p.get("act"))
        self.flush()
        lay.out = out
        return self.report(lay, f"{kh}x{kw}: regions split {used} way(s), Wb {kh}x{kw}x{cib}x{cob}x{lanes} in AM "
                                f"(broadcast, {'one buffer' if wbufs == 1 else f'{wbufs} buffers'}), "
                                f"Ib {cib}x{span_h}x{win}x{lanes} in SM, Wib={wib}, via {link_in}")
