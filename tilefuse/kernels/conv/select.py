"""Algorithm selection: which kernel runs a conv layer.

`candidates()` lists every algorithm that can run the layer (for tuning); `estimate_cost()`
is a cost model computed from the layer shape only (testable without timing anything);
`select_algorithm()` returns the cheapest candidate.

Cost model (seconds on one core): t = flops / (PEAK * eff) + bytes / BW, with
  PEAK = 110 GFLOP/s  (one AVX-512 core's float32 FMA peak, the order kernels/isa.measure_peak
            finds on the development machine; only ratios matter)
  gemm1x1   flops = 2*N*Ho*Wo*Ci*Co, eff 0.9 (the numba 7x2 NCHW16c kernel: 79-96% of the measured
            peak on ResNet50's 1x1 layers, one core); bytes: the stride > 1 gather
  direct    flops = 2*N*Ho*Wo*Cip*Cop*KH*KW (channels padded to 16), eff 0.9 (7x2 register
            blocking, 89-92% on ResNet50's 3x3 layers); bytes: the input band copies and the output
  winogradM GEMM flops = 2*alpha^2*Cip*Cop32 per tile, the tiles of each task rounded up to the
            GEMM's 7-row register block (batch-1 7x7 maps: 4 tiles computed as 7), eff 0.85
            (the same micro-kernel as gemm1x1); V and M written and read by the transforms at
            TRANSFORM_BW; the packed U streamed once per task at WEIGHT_BW, overlapped with the
            GEMMs (max, not sum)
  im2col    flops = 2*N*Ho*Wo*Co*Cg*KH*KW, eff 0.6 (0.08 for one input channel per group,
            which runs as a scalar-ish depthwise loop); bytes: the cols matrix; plus IM2COL_TASK_S per
            task (image x group x band), each a Python call (the 3-channel stems excepted: stem.py)
  depthwise flops = 2*N*Ho*Wo*Cop*KH*KW, eff 0.4 (40-60 GFLOP/s on one core, depthwise.py) plus
            input + output bytes at DW_BW (it is memory bound)
  grouped   groups inside one block (cg = og in 2, 4, 8; grouped_lanes.py): flops = 2*N*Ho*Wo*Cop*cg*KH*KW,
            eff 0.35 (cg FMAs per tap on shuffled input vectors, 30-45 GFLOP/s on one core of the
            AVX2 development machine), plus the zero-bordered input band copy at BAND_BW;
            otherwise the flops of the block groups (grouped.py: L times the group conv's when groups are
            narrower than 16 channels), the direct kernel's eff (0.6 with an odd block count per
            block group: the 8 x 1 register block); bytes: the padded band copies
Measured on the development machine (one core, `benchmarks/scaling.py` layers at batch 1/8/32):
F(4x4) is the fastest on every ResNet50 3x3 layer, 1.4-2.1x direct, but the batch-1 7x7 one (512
channels, 4 tiles: the GEMM streams a 37.7 MB U for 75 MFLOP), where direct is 1.6x faster; the
model picks F(4x4) on the others and direct there (WEIGHT_BW below). `tilefuse.compile(tune=True)` replaces the model by measurements.
"""
from __future__ import annotations

import math

from tilefuse.kernels.conv.grouped import applies as grouped_applies
from tilefuse.kernels.conv.grouped import bundle
from tilefuse.kernels.conv.planner import grouped_lanes_applies, plan_direct, plan_im2col, plan_winograd
from tilefuse.kernels.conv.stem import applies as stem_applies

ALGORITHMS = ("gemm1x1", "direct", "winograd2", "winograd4", "im2col", "depthwise", "grouped")

PEAK = 110e9
BW = 10e9             # NCHW <-> NCHWc copies, gathers
TRANSFORM_BW = 4e9    # Winograd transforms, bytes of V + M per second
# the packed Winograd U streamed by the GEMM (overlapped): one core's rate. 40e9 before; the batch-1
# 7x7 layers (F(4x4): 4 tiles, a 37.7 MB U for 512 channels, each 64-byte weight row feeding 8 FMAs)
# ran F(4x4) at 13 GFLOP/s on one Zen 3 core (~6.5 GB/s of U), and at 2 threads 4.1-4.5 ms against
# direct's 2.5-2.6 ms (F(2x2) 3.2-3.7), while the model picked F(4x4) (benchmarks/RESULTS.md,
# 2026-11-27, fourth session). At 8e9 it picks direct there, F(4x4) for 14x14 at batch 1 (the three
# within 15% measured) and for every ResNet50 3x3 layer from batch 8 on (F(4x4) measured fastest).
WEIGHT_BW = 8e9
# ...and what all cores together stream: on the 16-core device machine at 16 threads every batch-1
# ResNet50 layer that streams a large weight slice per task ran at ~2-3 GB/s of it per core (F(4x4)
# 14x14: 1.18 MB of U a task in 406-433 us; 28x28: 590 KB in 184-260 us; the 7x7 direct convs: 590 KB
# of weights a task in 311-327 us; benchmarks/RESULTS.md, tenth session). parallel_cost gives each of
# T streaming cores min(WEIGHT_BW, AGG_WEIGHT_BW / T).
AGG_WEIGHT_BW = 48e9
# the direct kernel's weight stream on many threads ran ~1.4x slower than the U stream of Winograd's
# GEMM (the 7x7 layers at 16 threads: 311-327 us measured, 230 modelled with the same rate; Winograd's
# 0.8-1.3x its model): direct's weight stream is modelled at DIRECT_PAR_EFF times that rate
DIRECT_PAR_EFF = 0.7
SWITCH_MARGIN = 0.6   # select_algorithm: on many threads, another of direct / Winograd must model this much cheaper
EFF = {"gemm1x1": 0.9, "direct": 0.9, "direct1": 0.6, "winograd": 0.85, "im2col": 0.6, "depthwise": 0.08,
       "dw_blocked": 0.4, "grouped_lanes": 0.35}
BAND_BW = 10e9        # grouped_lanes: bytes of the zero-bordered input band copied per second
# im2col's tasks (image x group x row band) are Python calls (scratch, the cols gather, np.matmul, the
# epilogue): ~6.5 us each on one Zen 3 core whatever their size, and no faster on two threads (the GIL).
# Without this term the model sent RegNetY's grouped 3x3s at 1x1 and 2x2 outputs (32x32 images; 55
# groups) to im2col: 355 us on one thread, 740 on two, against the blocked grouped kernel's 28 us
# (benchmarks/RESULTS.md, twenty-first session)
IM2COL_TASK_S = 6.5e-6
DW_BW = 20e9          # depthwise NCHW16c: bytes of input + output per second (memory bound)
# Per host kind (kernels/isa.cost_host), the one-thread model's rates relative to the constants above:
# "strip" multiplies the FLOP rate of the 1x1 and direct kernels (the AVX-512 assembly strips of
# `_nb`), "weight_bw" replaces WEIGHT_BW. On an Intel Emerald Rapids core (AVX-512, two FMA pipes)
# inside ResNet50 at batch 1 on one thread, the direct strip ran 1.6-1.8x its base model on the
# 14x14-56x56 3x3 layers (1475 us at 14x14 against 2402 modelled; 1385 at 28x28, 1420 at 56x56; the
# 1x1 strip the same, 83-96% of the host's 176 GFLOP/s peak against the base's 110), while F(4x4)'s
# batch-1 14x14 layer, bound by its 9.4 MB U, ran 1660 us against 1501 modelled (~6.5 GB/s of U, not
# 8): the base rates picked F(4x4) there, 11% slower than direct on one thread and 12% on two (780
# against 890 us; benchmarks/RESULTS.md, twenty-fourth session). The multi-thread terms of
# `parallel_cost` stay in the base rates: they were fitted to the 16-core device machine's
# measurements in those units.
HOST_RATES = {"base": {"strip": 1.0, "weight_bw": WEIGHT_BW},
              "intel-avx512": {"strip": 1.6, "weight_bw": 6.5e9}}


def _rates(host: str | None) -> dict:
    if host is None:
        from tilefuse.kernels.isa import cost_host
        host = cost_host()
    try:
        return HOST_RATES[host]
    except KeyError:
        raise ValueError(f"cost model host kind {host!r}: expected one of {tuple(HOST_RATES)}") from None


def _out_hw(x_shape, w_shape, stride, padding, dilation):
    _, _, h, w = x_shape
    _, _, kh, kw = w_shape
    ho = (h + padding[0] + padding[1] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (w + padding[2] + padding[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    return ho, wo


def _pad16(c):
    return -(-c // 16) * 16


def _ceil7(v):
    return -(-v // 7) * 7


def candidates(x_shape, w_shape, stride, padding, dilation, groups, allow_winograd=True) -> list[str]:
    """Every algorithm that can compute this conv (im2col always can)."""
    co, cg, kh, kw = w_shape
    out = []
    ci = cg * groups
    if groups > 1 and cg == 1:
        out.append("depthwise")             # groups == C_in, any channel multiplier
    if grouped_applies(ci, co, groups):
        out.append("grouped")
    if groups == 1:
        if (kh, kw) == (1, 1) and tuple(padding) == (0, 0, 0, 0):
            out.append("gemm1x1")
        out.append("direct")
        if allow_winograd and (kh, kw) == (3, 3) and tuple(stride) == (1, 1) and tuple(dilation) == (1, 1):
            out += ["winograd2", "winograd4"]
    out.append("im2col")
    return out


def conv_flops(x_shape, w_shape, stride, padding, dilation, groups) -> int:
    n = x_shape[0]
    co, cg, kh, kw = w_shape
    ho, wo = _out_hw(x_shape, w_shape, stride, padding, dilation)
    return 2 * n * ho * wo * co * cg * kh * kw


def algorithm_flops(algorithm, x_shape, w_shape, stride, padding, dilation, groups) -> int:
    """FLOPs the algorithm's multiply stage really executes (padded channels, Winograd GEMMs)."""
    n, ci, _, _ = x_shape
    co, cg, kh, kw = w_shape
    ho, wo = _out_hw(x_shape, w_shape, stride, padding, dilation)
    if algorithm == "direct":
        return 2 * n * ho * wo * _pad16(ci) * _pad16(co) * kh * kw
    if algorithm == "depthwise":
        return 2 * n * ho * wo * _pad16(co) * kh * kw
    if algorithm == "grouped":
        if grouped_lanes_applies(ci, co, groups):
            return 2 * n * ho * wo * _pad16(co) * cg * kh * kw
        _, cbg, obg, gp = bundle(ci, co, groups)
        return 2 * n * ho * wo * gp * obg * 16 * cbg * 16 * kh * kw
    if algorithm.startswith("winograd"):
        m = int(algorithm[-1])
        return 2 * n * math.ceil(ho / m) * math.ceil(wo / m) * (m + 2) ** 2 * _pad16(ci) * _pad16(co)
    return conv_flops(x_shape, w_shape, stride, padding, dilation, groups)


def estimate_cost(algorithm, x_shape, w_shape, stride, padding, dilation, groups, host: str | None = None) -> float:
    """Estimated single-core seconds (a model, see the module docstring) on host kind `host`
    (HOST_RATES; None: this host's, kernels/isa.cost_host)."""
    rates = _rates(host)
    n, ci, h, w = x_shape
    co, cg, kh, kw = w_shape
    ho, wo = _out_hw(x_shape, w_shape, stride, padding, dilation)
    flops = conv_flops(x_shape, w_shape, stride, padding, dilation, groups)
    out_bytes = 4 * n * co * ho * wo
    if algorithm == "gemm1x1":
        gather = 4 * n * ci * ho * wo if tuple(stride) != (1, 1) else 0
        return flops / (PEAK * EFF["gemm1x1"] * rates["strip"]) + gather / BW
    if algorithm == "direct":
        cip, cop = _pad16(ci), _pad16(co)
        f = 2 * n * ho * wo * cip * cop * kh * kw
        in_bytes = 4 * n * cip * (h + padding[0] + padding[1]) * (w + padding[2] + padding[3])
        return f / (PEAK * EFF["direct"] * rates["strip"]) + (in_bytes + 2 * out_bytes) / BW
    if algorithm.startswith("winograd"):
        m = int(algorithm[-1])
        alpha = m + 2
        cip, cop = _pad16(ci), _pad16(co)
        tiles = n * math.ceil(ho / m) * math.ceil(wo / m)
        p = min(tiles, plan_winograd(alpha, cip, cop, tiles)["tiles"])
        tasks = math.ceil(tiles / p)
        last = tiles - (tasks - 1) * p
        padded = (tasks - 1) * _ceil7(p) + _ceil7(last)     # GEMM rows computed, in 7-row blocks
        f = 2 * padded * alpha * alpha * cip * (-(-cop // 32) * 32)
        vm = 4 * tiles * alpha * alpha * (cip + cop)
        u_traffic = 4 * alpha * alpha * cip * cop * tasks
        in_bytes = 4 * n * cip * (ho + 2) * (wo + 2)
        return max(f / (PEAK * EFF["winograd"]), u_traffic / rates["weight_bw"]) + vm / TRANSFORM_BW + in_bytes / BW
    if algorithm == "depthwise":
        f = algorithm_flops("depthwise", x_shape, w_shape, stride, padding, dilation, groups)
        moved = 4 * n * (_pad16(ci) * h * w + _pad16(co) * ho * wo)
        return f / (PEAK * EFF["dw_blocked"]) + moved / DW_BW
    if algorithm == "grouped":
        f = algorithm_flops("grouped", x_shape, w_shape, stride, padding, dilation, groups)
        if grouped_lanes_applies(ci, co, groups):
            band = 4 * n * _pad16(ci) * (ho * stride[0] + kh) * (wo * stride[1] + kw)
            return f / (PEAK * EFF["grouped_lanes"]) + band / BAND_BW
        obg = bundle(ci, co, groups)[2]
        in_bytes = 4 * n * _pad16(ci) * (h + padding[0] + padding[1]) * (w + padding[2] + padding[3])
        return f / (PEAK * EFF["direct" if obg % 2 == 0 else "direct1"]) + in_bytes / BW
    if algorithm == "im2col":
        if cg == 1:   # its per-channel loop reads the input and writes the output like depthwise does
            return flops / (PEAK * EFF["depthwise"]) + 4 * n * (ci * h * w + co * ho * wo) / BW + \
                n * groups * IM2COL_TASK_S
        cols = 4 * n * ho * wo * cg * kh * kw * groups
        tasks = 0 if stem_applies(ci, groups) else n * groups * -(-ho // plan_im2col(cg * kh * kw, wo, ho)["rows"])
        return flops / (PEAK * EFF["im2col"]) + 2 * cols / BW + tasks * IM2COL_TASK_S
    raise ValueError(f"unknown conv algorithm {algorithm!r}; expected one of {ALGORITHMS}")


def _makespan(task_seconds: list[float], threads: int) -> float:
    """Finish time of tasks handed out in order to whichever of `threads` workers is free first (the
    kernels' shared task counter, threads.numba_region)."""
    free = [0.0] * max(1, int(threads))
    for t in task_seconds:
        i = free.index(min(free))
        free[i] += t
    return max(free)


def parallel_cost(algorithm, x_shape, w_shape, stride, padding, dilation, groups, threads: int,
                  host: str | None = None) -> float:
    """Estimated seconds on `threads` threads: `estimate_cost` on one; on more, for direct and Winograd
    (the two that compete on 3x3 layers), the makespan of the task grid the planner gives that thread
    count (planner.plan_direct, planner.plan_winograd): each task's share of the one-thread cost, tasks
    handed out in order to the first free thread, in the base host rates (HOST_RATES: the terms were
    fitted in those units; `host` only sets the one-thread cost). A Winograd task computes its tiles in 7-row blocks
    (a 2-tile remainder costs a whole block), transforms its tiles' input again for every channel
    group and streams its pairs' U; on a batch-1 14x14 map F(4x4) has 16 tiles (3 blocks), so at 16
    threads its largest task holds 2 of them against direct's even row x channel split (the device
    machine, 16 threads: F(4x4) 406-433 us a 14x14 ResNet50 layer, direct with stride 2 and the same
    output 307 us; benchmarks/RESULTS.md, tenth session). Other algorithms: the one-thread cost / threads."""
    t = max(1, int(threads))
    if t == 1:
        return estimate_cost(algorithm, x_shape, w_shape, stride, padding, dilation, groups, host)
    one = estimate_cost(algorithm, x_shape, w_shape, stride, padding, dilation, groups, "base")
    n, ci, h, w = x_shape
    co, cg, kh, kw = w_shape
    ho, wo = _out_hw(x_shape, w_shape, stride, padding, dilation)
    cip, cop = _pad16(ci), _pad16(co)
    wbw = min(WEIGHT_BW, AGG_WEIGHT_BW / t)     # each streaming core's share
    if algorithm.startswith("winograd"):
        m = int(algorithm[-1])
        a2 = (m + 2) ** 2
        tiles = n * math.ceil(ho / m) * math.ceil(wo / m)
        p = plan_winograd(m + 2, cip, cop, tiles, t)
        op = -(-cop // 32)
        secs = []
        for p0 in range(0, tiles, p["tiles"]):
            pt = min(p["tiles"], tiles - p0)
            for c0 in range(0, op, p["pairs"]):
                npr = min(p["pairs"], op - c0)
                f = 2.0 * _ceil7(pt) * a2 * cip * 32 * npr
                u = 4.0 * a2 * cip * 32 * npr
                vm = 4.0 * pt * a2 * (cip + 32 * npr)
                secs.append(max(f / (PEAK * EFF["winograd"]), u / wbw) + vm / TRANSFORM_BW)
        in_bytes = 4 * n * cip * (ho + 2) * (wo + 2)
        return _makespan(secs, t) + in_bytes / BW / t
    if algorithm == "direct" and groups == 1:
        p = plan_direct(cip // 16, kh, dilation[0], stride[0], ho, w + padding[2] + padding[3], wo=wo, n=n,
                        ob=cop // 16, kw=kw, padded=tuple(padding) != (0, 0, 0, 0), threads=t)
        r, g, ob = p["rows"], p["blocks"], cop // 16
        wp = w + padding[2] + padding[3]
        secs, work = [], []
        for _ in range(n):
            for r0 in range(0, ho, r):
                rr = min(r, ho - r0)
                band = 4.0 * cip * ((rr - 1) * stride[0] + (kh - 1) * dilation[0] + 1) * wp
                for b0 in range(0, ob, g):
                    gg = min(g, ob - b0)
                    work.append(_ceil7(rr * wo) * gg)
                    # the task's weight slice streamed alongside its FMAs; its input band copied first
                    secs.append((4.0 * gg * 16 * cip * kh * kw / wbw, 2 * band / BW))
        total = sum(work)
        return _makespan([max(one * wk / total, u / DIRECT_PAR_EFF) + b for wk, (u, b) in zip(work, secs)], t)
    return one / t


def select_algorithm(x_shape, w_shape, stride, padding, dilation, groups, allow_winograd=True,
                     threads: int = 1, host: str | None = None) -> str:
    """The cheapest candidate under `estimate_cost` (host kind `host`, None: this host's); on more
    threads, where that is direct or Winograd, the cheaper of those under `parallel_cost` for the
    thread count."""
    cands = candidates(x_shape, w_shape, stride, padding, dilation, groups, allow_winograd)
    best = min(cands, key=lambda a: estimate_cost(a, x_shape, w_shape, stride, padding, dilation, groups, host))
    if int(threads) <= 1 or not (best == "direct" or best.startswith("winograd")):
        return best
    # on more threads only direct and Winograd are weighed again (their task grids are modelled), and
    # the one-thread pick is kept unless another is SWITCH_MARGIN of its cost or less: the model's
    # multi-thread terms are calibrated on one machine's batch-1 layers, each within ~1.3x either way
    cost = {a: parallel_cost(a, x_shape, w_shape, stride, padding, dilation, groups, threads)
            for a in cands if a == "direct" or a.startswith("winograd")}
    other = min(cost, key=cost.get)
    return other if cost[other] <= SWITCH_MARGIN * cost[best] else best
