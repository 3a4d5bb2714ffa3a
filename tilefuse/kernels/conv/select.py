"""Algorithm selection: which kernel runs a conv layer.

`candidates()` lists every algorithm that can run the layer (for tuning); `estimate_cost()`
is a cost model computed from the layer shape only (testable without timing anything);
`select_algorithm()` returns the cheapest candidate.

Cost model (seconds on one core): t = flops / (PEAK * eff) + bytes / BW, with
  PEAK = 200 GFLOP/s  (the order of one AVX-512 core's sgemm here; only ratios matter)
  gemm1x1   flops = 2*N*Ho*Wo*Ci*Co, eff 1.05 (the numba 7x2 NCHW16c kernel, 190-240 GFLOP/s on
            ResNet50's 1x1 layers); bytes: the stride > 1 gather
  direct    flops = 2*N*Ho*Wo*Cip*Cop*KH*KW (channels padded to 16), eff 0.9 (7x2 register
            blocking: 230-260 GFLOP/s on ResNet50's 3x3 layers, one core; held at 0.9 because the Winograd
            term below underestimates F(4x4) on 7x7-28x28 maps, 290-490 effective GFLOP/s);
            bytes: the NCHW -> padded NCHWc conversion and the NCHWc -> NCHW output copy
  winogradM flops = 2*N*tiles*alpha^2*Cip*Cop, eff 0.75 * P/(P+32) for P tiles per task
            (small GEMMs lose to call overhead); bytes: layout + V and M written and read
            by the transforms at TRANSFORM_BW, plus U once per task when U exceeds L2
  im2col    flops = 2*N*Ho*Wo*Co*Cg*KH*KW, eff 0.6 (0.08 for one input channel per group,
            which runs as a scalar-ish depthwise loop); bytes: the cols matrix
  depthwise flops = 2*N*Ho*Wo*Cop*KH*KW, eff 0.2 (40-60 GFLOP/s on one core, depthwise.py) plus
            input + output bytes at DW_BW (it is memory bound)
  grouped   flops of the block groups (grouped.py: L times the group conv's when groups are
            narrower than 16 channels), the direct kernel's eff (0.6 with an odd block count per
            block group: the 8 x 1 register block); bytes: the padded band copies
The efficiencies are round figures from measurements on the development machine (AMD EPYC
Zen 5, docs/kernels.md); `tilefuse.compile(tune=True)` replaces the guess by measurements.
"""
from __future__ import annotations

import math

from tilefuse.kernels.conv.grouped import applies as grouped_applies
from tilefuse.kernels.conv.grouped import bundle
from tilefuse.kernels.conv.planner import cache_sizes, plan_winograd

ALGORITHMS = ("gemm1x1", "direct", "winograd2", "winograd4", "im2col", "depthwise", "grouped")

PEAK = 200e9
BW = 10e9             # NCHW <-> NCHWc copies, gathers
TRANSFORM_BW = 6e9    # Winograd transforms, bytes of V + M per second (measured ~5-9 GB/s)
EFF = {"gemm1x1": 1.05, "direct": 0.9, "direct1": 0.6, "winograd": 0.75, "im2col": 0.6, "depthwise": 0.08,
       "dw_blocked": 0.2}
DW_BW = 20e9          # depthwise NCHW16c: bytes of input + output per second (memory bound)


def _out_hw(x_shape, w_shape, stride, padding, dilation):
    _, _, h, w = x_shape
    _, _, kh, kw = w_shape
    ho = (h + padding[0] + padding[1] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (w + padding[2] + padding[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    return ho, wo


def _pad16(c):
    return -(-c // 16) * 16


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
        _, cbg, obg, gp = bundle(ci, co, groups)
        return 2 * n * ho * wo * gp * obg * 16 * cbg * 16 * kh * kw
    if algorithm.startswith("winograd"):
        m = int(algorithm[-1])
        return 2 * n * math.ceil(ho / m) * math.ceil(wo / m) * (m + 2) ** 2 * _pad16(ci) * _pad16(co)
    return conv_flops(x_shape, w_shape, stride, padding, dilation, groups)


def estimate_cost(algorithm, x_shape, w_shape, stride, padding, dilation, groups) -> float:
    """Estimated single-core seconds (a model, see the module docstring)."""
    n, ci, h, w = x_shape
    co, cg, kh, kw = w_shape
    ho, wo = _out_hw(x_shape, w_shape, stride, padding, dilation)
    flops = conv_flops(x_shape, w_shape, stride, padding, dilation, groups)
    out_bytes = 4 * n * co * ho * wo
    if algorithm == "gemm1x1":
        gather = 4 * n * ci * ho * wo if tuple(stride) != (1, 1) else 0
        return flops / (PEAK * EFF["gemm1x1"]) + gather / BW
    if algorithm == "direct":
        cip, cop = _pad16(ci), _pad16(co)
        f = 2 * n * ho * wo * cip * cop * kh * kw
        in_bytes = 4 * n * cip * (h + padding[0] + padding[1]) * (w + padding[2] + padding[3])
        return f / (PEAK * EFF["direct"]) + (in_bytes + 2 * out_bytes) / BW
    if algorithm.startswith("winograd"):
        m = int(algorithm[-1])
        alpha = m + 2
        cip, cop = _pad16(ci), _pad16(co)
        tiles = n * math.ceil(ho / m) * math.ceil(wo / m)
        p = min(tiles, plan_winograd(alpha, cip, cop, tiles)["tiles"])
        f = 2 * tiles * alpha * alpha * cip * cop
        eff = EFF["winograd"] * p / (p + 32)
        vm = 4 * tiles * alpha * alpha * (cip + cop)
        u = 4 * alpha * alpha * cip * cop
        tasks = math.ceil(tiles / p)
        u_traffic = u * tasks if u > cache_sizes().l2 else u
        in_bytes = 4 * n * cip * (ho + 2) * (wo + 2)
        return f / (PEAK * eff) + vm / TRANSFORM_BW + (in_bytes + u_traffic) / BW
    if algorithm == "depthwise":
        f = algorithm_flops("depthwise", x_shape, w_shape, stride, padding, dilation, groups)
        moved = 4 * n * (_pad16(ci) * h * w + _pad16(co) * ho * wo)
        return f / (PEAK * EFF["dw_blocked"]) + moved / DW_BW
    if algorithm == "grouped":
        f = algorithm_flops("grouped", x_shape, w_shape, stride, padding, dilation, groups)
        obg = bundle(ci, co, groups)[2]
        in_bytes = 4 * n * _pad16(ci) * (h + padding[0] + padding[1]) * (w + padding[2] + padding[3])
        return f / (PEAK * EFF["direct" if obg % 2 == 0 else "direct1"]) + in_bytes / BW
    if algorithm == "im2col":
        if cg == 1:   # its per-channel loop reads the input and writes the output like depthwise does
            return flops / (PEAK * EFF["depthwise"]) + 4 * n * (ci * h * w + co * ho * wo) / BW
        cols = 4 * n * ho * wo * cg * kh * kw * groups
        return flops / (PEAK * EFF["im2col"]) + 2 * cols / BW
    raise ValueError(f"unknown conv algorithm {algorithm!r}; expected one of {ALGORITHMS}")


def select_algorithm(x_shape, w_shape, stride, padding, dilation, groups, allow_winograd=True) -> str:
    """The cheapest candidate under `estimate_cost`."""
    cands = candidates(x_shape, w_shape, stride, padding, dilation, groups, allow_winograd)
    return min(cands, key=lambda a: estimate_cost(a, x_shape, w_shape, stride, padding, dilation, groups))
