"""Blocking planner: tile sizes from the cache sizes of this machine.

Cache sizes come from /sys/devices/system/cpu/cpu0/cache (fallback: `lscpu`, then 32 KB /
1 MB / 32 MB); `set_cache_sizes(l1=..., l2=...)` or the environment variables
TILEFUSE_L1D / TILEFUSE_L2 / TILEFUSE_L3 (bytes, suffix K/M allowed) override them.

The rules, in the spirit of seed 000's conv1x1 blocking (weight block m x K with m in 6..12,
K = Ci halved until it fits SM, input block K x Nb with Nb grown while it fits AM); here L1
plays SM's role and L2 plays AM's:

gemm1x1  (out[Co, HW] = W[Co, Ci] @ X[Ci, HW] per image; the BLAS blocks its own inner loops)
  - K  = Ci, never split (one GEMM accumulates the whole depth, so no partial sums).
  - Nb = HW columns per task: the largest multiple of 16 with K*Nb*4 <= L2/2 (the input block
    stays in L2 while all the task's output rows are produced), at least 16, at most HW.
  - m  = Co rows per task (feature-map-level partitioning: tasks split the output channels and
    every task reads the whole input block): the largest multiple of 16 with
    m*Nb*4 <= L2/4 (the output block is still in L2 when the epilogue runs) and
    m*K*4 <= L2/4; halved (not below 16) until there are >= 4 tasks per thread-capable core.
  - on NCHW16c (what compiled networks run) the GEMM is (Nb, Ci) @ (Ci, m) on gathered position
    blocks instead, with measured sizes: see `plan_gemm1x1_nchwc`.

direct   (NCHWc, out[ob, oh, ow:ow+RB, 16] accumulated in RB zmm registers)
  - RB = 8 output positions x 16 output channels: 8 accumulators + 1 weight vector + the
    broadcast input fit the 32 AVX-512 registers; each weight vector load feeds 8 FMAs.
  - rows per task (window-level partitioning: tasks split the output rows): the largest R with
    the input band Cb*((R-1)*sh + (KH-1)*dh + 1)*Wp*64 B <= L2/2, at most ceil(Ho/2) so that
    two cores always have work; the packed weights of one output block (Cb*KH*KW*1 KB) are
    re-read from L2 for every register block.

winograd (F(m x m, 3 x 3), alpha = m + 2)
  - P tiles per task: V (alpha^2 x P x Ci) and M (alpha^2 x P x Co) together <= L2:
    P = L2 / (4*alpha^2*(Ci+Co)), rounded down to a multiple of 8 and clamped to [64, 512]
    (measured: OpenBLAS runs the (P x Ci) @ (Ci x Co) planes at 60-80% of its peak from
    P = 64 up, and far worse below). When U = alpha^2*Ci*Co*4 B exceeds L2 it is streamed from
    L3/DRAM once per task, so P grows to total/k for the smallest even k >= 2 with P <= 256
    (rounded up to a multiple of 8): equal tasks, an even count, so 2 cores finish together.

im2col   (cols[K = Cg*kh*kw, R*Wo] then out[og, R*Wo] = Wg @ cols)
  - rows per task: the largest R with K*R*Wo*4 <= L2/2, at least 1.
"""
from __future__ import annotations

import functools
import math
import os
import re
import subprocess
from dataclasses import dataclass

import numpy as np

from tilefuse.kernels.conv.tiles import ASM_AVX2, NARROW

_OVERRIDE: dict[str, int] = {}


@dataclass(frozen=True)
class CacheSizes:
    l1d: int
    l2: int
    l3: int
    source: str


def _parse_size(s: str) -> int:
    m = re.match(r"\s*([\d.]+)\s*([KMG]?)i?B?", s.strip(), re.I)
    if not m:
        raise ValueError(f"cannot parse a cache size from {s!r}; expected e.g. '48K' or '1048576'")
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]
    return int(float(m.group(1)) * mult)


@functools.lru_cache(maxsize=1)
def _detect() -> CacheSizes:
    found: dict[str, int] = {}
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for d in sorted(os.listdir(base)):
            if not d.startswith("index"):
                continue
            rd = lambda f: open(os.path.join(base, d, f)).read().strip()  # noqa: E731
            level, typ, size = rd("level"), rd("type"), rd("size")
            key = {"1": "l1d", "2": "l2", "3": "l3"}.get(level)
            if key and typ in ("Data", "Unified"):
                found[key] = _parse_size(size)
        if {"l1d", "l2"} <= found.keys():
            return CacheSizes(found["l1d"], found["l2"], found.get("l3", found["l2"]), "sysfs")
    except OSError:
        pass
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        for ln in out.splitlines():
            m = re.match(r"(L1d|L2|L3) cache:\s*([\d.]+ ?[KMG]i?B)(?: \((\d+) instances?\))?", ln.strip())
            if m:
                total = _parse_size(m.group(2).replace(" ", ""))
                per = total // int(m.group(3) or 1)
                found[{"L1d": "l1d", "L2": "l2", "L3": "l3"}[m.group(1)]] = per if m.group(1) != "L3" else total
        if {"l1d", "l2"} <= found.keys():
            return CacheSizes(found["l1d"], found["l2"], found.get("l3", found["l2"]), "lscpu")
    except (OSError, subprocess.SubprocessError):
        pass
    return CacheSizes(32 << 10, 1 << 20, 32 << 20, "default")


_MEMO: dict = {}
_ENV_KEYS = ("TILEFUSE_L1D", "TILEFUSE_L2", "TILEFUSE_L3")


def cache_sizes() -> CacheSizes:
    """Per-core L1d and L2, shared L3, in bytes (overrides applied).

    Memoized on (environment overrides, set_cache_sizes overrides): the kernels call this on
    every run, and rebuilding it cost ~3 us per conv."""
    envget = os.environ.get
    key = (envget("TILEFUSE_L1D"), envget("TILEFUSE_L2"), envget("TILEFUSE_L3"), tuple(sorted(_OVERRIDE.items())))
    hit = _MEMO.get(key)
    if hit is not None:
        return hit
    if len(_MEMO) > 64:
        _MEMO.clear()
    _MEMO[key] = cs = _cache_sizes()
    return cs


def _cache_sizes() -> CacheSizes:
    c = _detect()
    env = {k: os.environ.get(f"TILEFUSE_{k.upper()}") for k in ("l1d", "l2", "l3")}
    vals = {}
    for k in ("l1d", "l2", "l3"):
        if k in _OVERRIDE:
            vals[k] = _OVERRIDE[k]
        elif env[k]:
            vals[k] = _parse_size(env[k])
        else:
            vals[k] = getattr(c, k)
    src = c.source if not (_OVERRIDE or any(env.values())) else c.source + "+override"
    return CacheSizes(vals["l1d"], vals["l2"], vals["l3"], src)


def set_cache_sizes(l1d: int | None = None, l2: int | None = None, l3: int | None = None) -> None:
    """Override detected cache sizes (bytes); pass None to keep, call with no args to reset."""
    if l1d is None and l2 is None and l3 is None:
        _OVERRIDE.clear()
        return
    for k, v in (("l1d", l1d), ("l2", l2), ("l3", l3)):
        if v is not None:
            if v <= 0:
                raise ValueError(f"cache size {k} must be positive, got {v}")
            _OVERRIDE[k] = int(v)


def _floor_mult(v: float, m: int) -> int:
    return int(v) // m * m


def _ceil_mult(v: int, m: int) -> int:
    return -(-int(v) // m) * m


def plan_gemm1x1(ci: int, co: int, hw: int) -> dict:
    l2 = cache_sizes().l2
    nb = max(16, min(hw, _floor_mult(l2 / 2 / (4 * ci), 16)))
    m = max(16, _floor_mult(min(l2 / 4 / (4 * nb), l2 / 4 / (4 * ci)), 16))
    m = min(m, co)
    n_hw = math.ceil(hw / nb)
    while m > 16 and n_hw * math.ceil(co / m) < 8:
        m = max(16, _floor_mult(m // 2, 16))
    return {"K": ci, "Nb": nb, "m": m}


def plan_gemm1x1_nchwc(cip: int, cop: int, positions: int) -> dict:
    """gemm1x1 on NCHW16c: a task gathers Nb output positions (N*Ho*Wo in all, blocks may span
    images) as an (Nb, Cip) block and multiplies it by Wt[:, c0:c0+m] (Cip, m).

    - Nb = 384 rows (at most N*Ho*Wo): OpenBLAS blocks K and packs the weight panel itself, and
      measured on the ResNet50 1x1 layers (batch 16, one core) 384..512 rows reach 185-200
      GFLOP/s where 64..128 rows reach 113-170; the L2 rule of the NCHW form (block <= L2/2)
      would give 64 rows for Ci = 2048, 40% slower.
    - m = Co (the gathered block is used once, by one GEMM); halved (multiple of 16, not below
      64) while there are fewer than 4 tasks, so small batch-1 maps still feed both cores
      (then cores split Co: seed 000's feature-map-level partitioning).
    """
    nb = min(positions, NB_NCHWC)
    m = cop
    n_pos = math.ceil(positions / nb)
    while m > 64 and n_pos * math.ceil(cop / m) < 4:
        m = max(64, _floor_mult(m // 2, 16))
    return {"K": cip, "Nb": nb, "m": m}


NB_NCHWC = 384
RB = 8
# k1x1's positions per register tile, so that a task's Q positions fill whole tiles: 7 (7 x 2 blocks)
# on AVX-512 hosts, 5 (5 x 1) where tiles.NARROW (a Q of 21 there ran 5 tiles for 21 positions; RB 5:
# ConvNeXt's 3072 -> 768 1x1 at batch 32 1.22x, benchmarks/RESULTS.md), 6 where tiles.ASM_AVX2
RB1X1 = 6 if ASM_AVX2 else 5 if NARROW else 7


# Thread-aware task grids (issue 13, seed 000's partitioning levels) ----------------------------
# A conv layer is cut into equal tasks; numba's parallel loop hands each thread a contiguous run of
# ceil(tasks / threads) of them. The grid is chosen per layer by a small cost model that knows the
# thread count T: minimize  ceil(tasks / T) * task_seconds,  task_seconds = FLOPs / PEAK_CORE +
# bytes moved / BW_CORE + TASK_SECONDS (ties: fewer tasks). Large tasks reuse their input and
# weight blocks (fewer bytes per FLOP); more tasks than threads balance the load. The kernels that
# use these grids (k1x1, direct, stem) compute every output element with the same full-length
# reduction in the same order whatever task holds it, so the grid (and the thread count) never
# changes a bit of the result.
PEAK_CORE = 100e9      # FLOP/s of one core in the model (only ratios matter)
BW_CORE = 10e9         # bytes/s one core streams from L3/DRAM
TASK_SECONDS = 2e-6    # fixed cost of a task (offsets, scratch, loop set-up)
BAND_PAST_L2 = 2.0     # direct: a row band's input may pass the L2 rule up to this multiple of L2 (plan_direct)
WHOLE_MAP_L2 = 0.85    # k1x1: a whole map's input block up to this fraction of L2 may be one task's (plan_k1x1)


def _pick(cands, threads: int):
    """cands: (key, ntasks, seconds per task) -> the key of the least makespan."""
    t = max(1, int(threads))
    return min(cands, key=lambda c: (math.ceil(c[1] / t) * c[2], c[1]))[0]


def _splits(n: int, most: int) -> list[int]:
    """Distinct chunk sizes ceil(n / k) for k = 1 .. most (largest first)."""
    return sorted({-(-n // k) for k in range(1, max(1, min(n, most)) + 1)}, reverse=True)


def _task_seconds(flops: float, nbytes: float) -> float:
    return flops / PEAK_CORE + nbytes / BW_CORE + TASK_SECONDS


def plan_k1x1(cip: int, op: int, positions: int, threads: int = 1, ob: int | None = None) -> dict:
    """The numba NCHW16c 1x1 kernel (k1x1.py, what gemm1x1 runs on NCHW16c).

    A task is Q output positions (flat over the batch, a multiple of RB1X1: 7; 5 on NARROW hosts; any
    number with the AVX2 assembly strip, whose partial tiles cost their positions) x B output blocks (16
    channels; B even, a channel pair's 32, except with the AVX2 strip, which runs one block a tile: 10 blocks
    split 5 + 5 over two threads, not 6 + 4). ob: the layer's output blocks (default 2 * op, op channel
    pairs). Q is at most the L2 rule Q*Cip*4 <= L2/2 (the task's input
    block stays in L2 while its channel pairs sweep it); the cost model (above) then picks Q and B
    for T threads: with many positions (large maps, large batch) whole-channel tasks over position
    blocks; with few (batch-1 7x7 / 14x14 maps) the cores split the output channels and every
    task reads the same small input block (seed 000's feature-map level). "P": the channel pairs a
    task touches (ceil(B / 2)).
    Loop order inside a task: position block outer (7 positions of input stay in L1, the weights
    stream from L2) when the task's weights B*Cip*64 B fit L2/2, else channel pair outer; on AVX2 hosts
    (tiles.ASM_AVX2: the assembly strip) channel pair outer always.
    """
    ob = 2 * op if ob is None else max(1, int(ob))
    return dict(_plan_k1x1(cip, ob, positions, max(1, int(threads)), cache_sizes().l2))


@functools.lru_cache(maxsize=4096)
def _plan_k1x1(cip, ob, positions, threads, l2):
    c7 = lambda v: -(-v // RB1X1) * RB1X1  # noqa: E731
    # the AVX2 strips (k1x1._k1x1_strips, one block a tile; ASM_512's strip512 works on pairs): tasks of any
    # number of blocks and positions. 960 -> 160 at 7x7, batch 1, 2 threads: 6 + 4 blocks was 1.2x the time of 5 + 5
    fine = ASM_AVX2
    cq = (lambda v: v) if fine else c7  # noqa: E731   (a task's positions)
    bu = 1 if fine else 2               # blocks a unit of the Co split
    qmax = min(max(RB1X1, int(l2 / 2 / (4 * cip)) // RB1X1 * RB1X1), cq(positions))
    if c7(positions) * 4 * cip <= WHOLE_MAP_L2 * l2:
        # the whole input fits the L2 (with room for the weight rows streaming through): the cores may
        # share it and split the output channels (2048 -> 512 at 7x7, batch 1, 512 KiB L2: the L2/2 rule
        # forced two position blocks, each core streaming all 4 MB of weights; the channel split ran
        # 0.86-0.89x the time with the weights cold; benchmarks/RESULTS.md, 2026-11-27, fourth session)
        qmax = cq(positions)
    kmin = -(-positions // qmax)
    qs = {cq(-(-positions // k)) for k in range(kmin, kmin + 2 * threads + 1)}
    qs |= {q for q in (cq(-(-positions // k)) for k in range(1, 4 * threads + 1)) if q <= qmax}
    units = -(-ob // bu)
    cands = []
    for q in sorted(q for q in qs if q <= qmax):
        nq = -(-positions // q)
        for u in _splits(units, 4 * threads):
            b = u * bu
            flops = 2.0 * c7(q) * cip * 16 * b
            nbytes = 4.0 * q * cip + 64.0 * b * cip + 64.0 * q * b
            cands.append(((q, b), nq * -(-units // u), _task_seconds(flops, nbytes)))
    q, b = _pick(cands, threads)
    nq, nb_ = -(-positions // q), -(-ob // b)
    part = ("positions x Co split" if nq > 1 and nb_ > 1 else "Co split (input shared)" if nb_ > 1
            else "positions split" if nq > 1 else "one task")
    # AVX2 hosts (the assembly strip, k1x1._k1x1_strips) keep channel pair outer: a block's weight slice (STRIP_K
    # channels, 8 KiB) stays in L1 while the positions stream from L2; position blocks outer ran 1.02-1.05x the
    # time (ResNet50 / MobileNetV2 1x1s alone, batch 1 and 32, Zen 3; benchmarks/RESULTS.md, twentieth session)
    q_outer = b * cip * 64 <= l2 / 2 and not ASM_AVX2
    return (("Q", q), ("B", b), ("P", -(-b // 2)), ("RB", RB1X1), ("q_outer", q_outer), ("tasks", nq * nb_),
            ("partitioning", part), ("threads", threads))


def plan_direct(cb: int, kh: int, dh: int, sh: int, ho: int, wp: int, *, wo: int | None = None, n: int = 1,
                ob: int = 1, kw: int | None = None, padded: bool = True, threads: int = 1) -> dict:
    """The direct NCHWc kernel: a task is (one image, a band of R output rows, G output-channel
    blocks). R is at most the L2 rule (the band's input Cb*((R-1)*sh + (KH-1)*dh + 1)*Wp*64 B
    <= L2/2), or past it up to BAND_PAST_L2 x L2 with the band's re-reads from L3 counted (small
    maps: fewer bands read the weights fewer times); the cost model picks R and G for T threads:
    whole images per task when the batch alone feeds the threads (seed 000's task level), row
    bands (window level: cores split the image into regions) when it does not, and output-channel
    blocks too for small late layers (7x7, 14x14 maps at batch 1). G is even (the 7x2
    micro-kernel works on block pairs).
    padded: the task copies its input rows into a zero-bordered band (run_nchwc with padding),
    so smaller bands and channel splits re-copy more."""
    wo = wp if wo is None else wo
    kw = kh if kw is None else kw
    return dict(_plan_direct(cb, kh, kw, dh, sh, ho, wp, wo, n, ob, bool(padded), max(1, int(threads)),
                             cache_sizes().l2))


@functools.lru_cache(maxsize=4096)
def _plan_direct(cb, kh, kw, dh, sh, ho, wp, wo, n, ob, padded, threads, l2):
    band_of = lambda r: cb * ((r - 1) * sh + (kh - 1) * dh + 1) * wp * 64  # noqa: E731  (a band's input bytes)
    rmax = 1
    for r in range(1, ho + 1):
        if band_of(r) > l2 / 2:
            break
        rmax = r
    c7 = lambda v: -(-v // 7) * 7  # noqa: E731
    gs = sorted({min(ob, g + g % 2) for g in _splits(ob, 2 * threads)}, reverse=True)
    cands = []
    # row bands within the L2 rule, and past it on small maps (at most BAND_PAST_L2 of the L2): the band
    # then streams from L3 again for every output block after the first (the tiles sweep the whole band per
    # block), which the bytes count; fewer bands read the weights fewer times. On wide maps (4K: rmax 1-2
    # rows) none of the splits may fit the rule
    splits = _splits(ho, 4 * threads)
    past = [r for r in splits if r > rmax and band_of(r) <= BAND_PAST_L2 * l2]
    for r in ([r for r in splits if r <= rmax] or [rmax]) + past:
        band = band_of(r)
        for g in gs:
            flops = 2.0 * c7(r * wo) * cb * 16 * kh * kw * 16 * (g + g % 2)
            nbytes = (2.0 * band if padded else band) + g * cb * kh * kw * 1024.0 + 64.0 * r * wo * g
            if r > rmax:
                nbytes += (g - 1) * band
            cands.append(((r, g), n * -(-ho // r) * -(-ob // g), _task_seconds(flops, nbytes)))
    r, g = _pick(cands, threads)
    nb, ng = -(-ho // r), -(-ob // g)
    part = "images" if nb == 1 and ng == 1 else "rows split" if ng == 1 else \
        "Co split" if nb == 1 else "rows x Co split"
    return (("RB", 7), ("rows", r), ("blocks", g), ("tasks", n * nb * ng), ("partitioning", part),
            ("threads", threads))


def plan_stem(cin: int, kh: int, kw: int, sh: int, dh: int, ho: int, wo: int, wp: int, n: int = 1, ob: int = 1,
              threads: int = 1) -> dict:
    """The stem kernel (stem.py, Cin <= 4): a task is (one image, a band of R output rows, all
    output channels), its input rows copied into a zero-bordered band; the cost model picks R
    for T threads (at least one full 8-position register block per task where the map allows)."""
    return dict(_plan_stem(cin, kh, kw, sh, dh, ho, wo, wp, n, ob, max(1, int(threads))))


@functools.lru_cache(maxsize=1024)
def _plan_stem(cin, kh, kw, sh, dh, ho, wo, wp, n, ob, threads):
    c8 = lambda v: -(-v // 8) * 8  # noqa: E731
    rmin = min(ho, -(-8 // max(wo, 1)))
    cands = []
    for r in (r for r in _splits(ho, 8 * threads) if r >= rmin):
        band = 4.0 * cin * ((r - 1) * sh + (kh - 1) * dh + 1) * wp
        flops = 2.0 * c8(r * wo) * cin * kh * kw * 16 * (ob + ob % 2)
        cands.append((r, n * -(-ho // r), _task_seconds(flops, 2 * band + 64.0 * r * wo * ob)))
    r = _pick(cands, threads)
    nb = -(-ho // r)
    return (("RB", 8), ("rows", r), ("tasks", n * nb), ("partitioning", "images" if nb == 1 else "rows split"),
            ("threads", threads))


def plan_winograd(alpha: int, cip: int, cop: int, total_tiles: int | None = None, threads: int = 1) -> dict:
    """Winograd F(m x m, 3 x 3) on NCHWc (winograd.py): a task is P tiles x a group of output-
    channel pairs: it transforms its tiles' input (all Cip channels) into V (alpha^2, P, Cip),
    runs the alpha^2 GEMMs into M (alpha^2, P, cob) and the output transform. The cost model
    (above) picks P (a multiple of 7, the GEMM's register block, up to 512) and the pair group for T
    threads: per task the FLOPs of its GEMMs (7-row blocks), the packed U of its pairs
    (alpha^2*Cip*32 floats per pair, from L3: larger P amortizes it), V and M written and read
    (a channel split transforms the same tiles again). total_tiles None: one image's worth is
    assumed large (the plan for a layer of unknown size)."""
    tiles = 512 if total_tiles is None else int(total_tiles)
    return dict(_plan_winograd(alpha, cip, cop, tiles, max(1, int(threads))))


@functools.lru_cache(maxsize=1024)
def _plan_winograd(alpha, cip, cop, total, threads):
    a2 = alpha * alpha
    op = -(-cop // 32)
    c7 = lambda v: -(-v // 7) * 7  # noqa: E731
    ps = {min(512, c7(-(-total // k))) for k in range(1, 4 * threads + 1)} | {min(c7(total), q) for q in (64, 128, 256)}
    cands = []
    for pt in sorted(ps):
        nt = -(-total // pt)
        for npr in _splits(op, 2 * threads):
            cob = min(32 * npr, cop)
            flops = 2.0 * a2 * c7(pt) * cip * 32 * npr
            nbytes = 4.0 * a2 * (cip * 32 * npr + 2 * pt * cip + 2 * pt * cob)
            cands.append(((pt, npr), nt * -(-op // npr), _task_seconds(flops, nbytes)))
    pt, npr = _pick(cands, threads)
    nt, ng = -(-total // pt), -(-op // npr)
    part = ("tiles x Co split" if nt > 1 and ng > 1 else "Co split" if ng > 1 else "tiles split" if nt > 1
            else "one task")
    return (("tiles", pt), ("pairs", npr), ("tasks", nt * ng), ("partitioning", part), ("threads", threads))


def plan_im2col(k: int, wo: int, ho: int) -> dict:
    l2 = cache_sizes().l2
    r = int(l2 / 2 / (4 * k * max(wo, 1)))
    return {"rows": max(1, min(ho, r))}


# depthwise (depthwise.py) ---------------------------------------------------------------------

DW_PAD_MAX_POSITIONS = 28 * 28
DW_PAD_S2K3_MAX_POSITIONS = 7 * 7


def plan_depthwise_padded(ho: int, wo: int, kw: int = 3, sw: int = 1) -> bool:
    """Small maps run on a zero-bordered copy of their input rows (see depthwise._dw_task): shape-only rule.
    A 3-wide kernel at stride 2 copies about four input values per output value for 9 taps, and the
    copy costs more than the border code it saves above 7x7 outputs: 56 -> 28 x 144 channels ran
    138 us padded, 114 direct; 28 -> 14 x 192 67 and 40 (one thread, Ice Lake VM; at 7x7 39 and 51).
    5x5 kernels keep the band at every small size (28 -> 14: 57 against 85 us)."""
    if kw == 3 and sw >= 2:
        return ho * wo <= DW_PAD_S2K3_MAX_POSITIONS
    return ho * wo <= DW_PAD_MAX_POSITIONS


DW_TASK_VFMAS = 1 << 15      # depthwise work per task in vector FMAs on one thread (~20 us on one core)
DW_TASK_MIN_VFMAS = 1 << 12  # smallest depthwise task worth handing to a thread (~3 us)


def plan_depthwise_tasks(n: int, ob: int, ho: int, wo: int, taps: int, threads: int = 1) -> list[tuple[int, int, int, int, int]]:
    """(image, ob0, ob1, oh0, oh1) tasks of about `target` vector FMAs: DW_TASK_VFMAS on one thread,
    down to DW_TASK_MIN_VFMAS so that `threads` threads get ~3 tasks each. A channel block's map
    larger than the target is split into row bands (window level); smaller maps (7x7, 14x14) are
    bundled, several channel blocks per task (a row split would re-copy the padded band's halo).
    The split never changes a result: every output value is computed by the same code in the same
    order whichever task holds it (bitwise identical for every thread count)."""
    total = n * ob * ho * wo * taps
    target = max(DW_TASK_MIN_VFMAS, min(DW_TASK_VFMAS, total // (3 * max(1, threads)) + 1))
    plane = ho * wo * taps
    if plane > target:
        rows = max(1, math.ceil(target / (wo * taps)))
        rows = -(-ho // -(-ho // rows))          # equal bands
        return [(i, b, b + 1, r, min(r + rows, ho)) for i in range(n) for b in range(ob) for r in range(0, ho, rows)]
    g = max(1, target // plane)
    g = -(-ob // -(-ob // g))                    # equal groups
    return [(i, b, min(b + g, ob), 0, ho) for i in range(n) for b in range(0, ob, g)]


# grouped (grouped.py) --------------------------------------------------------------------------

def grouped_bundle(cin: int, cout: int, groups: int) -> tuple[int, int, int, int]:
    """(L, Cbg, Obg, G'): groups per block group, input / output blocks per block group, block groups."""
    cg, og = cin // groups, cout // groups
    lcm = lambda a, b: a * b // math.gcd(a, b)  # noqa: E731
    L = lcm(16 // math.gcd(16, cg), 16 // math.gcd(16, og))
    return L, L * cg // 16, L * og // 16, -(-groups // L)


def _row_bands(ho, rows):
    return [(r0, min(r0 + rows, ho)) for r0 in range(0, ho, rows)]


def plan_grouped_rows(cbg, obg, kh, kw, stride, dilation, ho, wo, wp, padded) -> int:
    """Row band height: the direct planner's for one block group, planned for one thread (so the
    tasks depend on the shape only)."""
    return plan_direct(cbg, kh, dilation[0], stride[0], ho, wp, wo=wo, ob=obg, kw=kw, padded=padded)["rows"]


GROUPED_TASK_FLOPS = 4e6        # block groups per task: about this much work (a task call costs ~5-10 us)


def plan_grouped_tasks(n, gp, cbg, obg, kh, kw, ho, wo, rows) -> list[tuple[int, int, int, int, int]]:
    """(image, j0, j1, r0, r1) from the shape only: row bands of the direct planner, block groups
    bundled until a task does about GROUPED_TASK_FLOPS."""
    per = 2.0 * rows * wo * obg * cbg * 256 * kh * kw
    k = max(1, min(gp, int(GROUPED_TASK_FLOPS // max(per, 1.0))))
    k = -(-gp // -(-gp // k))                           # equal bundles
    return [(i, j, min(j + k, gp), r0, r1) for i in range(n) for j in range(0, gp, k) for (r0, r1) in _row_bands(ho, rows)]


# grouped with groups inside one 16-lane block (grouped_lanes.py) ---------------------------------

def grouped_lanes_applies(cin: int, cout: int, groups: int) -> bool:
    """cg == og in (2, 4, 8): every 16-channel block holds whole groups, in and out (grouped_lanes.py)."""
    if groups <= 1 or cin % groups or cout % groups:
        return False
    cg, og = cin // groups, cout // groups
    return cg == og and 1 < cg < 16 and 16 % cg == 0


GL_TASK_VFMAS = 1 << 16      # grouped_lanes work per task in 16-lane FMAs (~50-100 us on one core)
GL_TASK_MIN_VFMAS = 1 << 13  # smallest task: layers this small are split in about 8 tasks at most


def plan_grouped_lanes_tasks(n: int, ob: int, ho: int, wo: int, kh: int, kw: int, cg: int) -> np.ndarray:
    """(image, ob0, ob1, oh0, oh1) tasks (an int64 table) from the layer shape only: about
    GL_TASK_VFMAS vector FMAs each (fewer, down to GL_TASK_MIN_VFMAS, so a layer has about 8 tasks
    or more). A channel block's map larger than that is split in equal row bands (each band
    copies its (KH-1)*dh halo rows again), smaller maps bundle channel blocks. The split never
    changes a result (grouped_lanes: the same operations per output value in every task)."""
    row = -(-wo // 8) * 8 * kh * kw * cg            # vector FMAs of one output row of one block
    plane = row * ho
    target = max(GL_TASK_MIN_VFMAS, min(GL_TASK_VFMAS, n * ob * plane // 8))
    if plane > target:
        rows = max(1, -(-target // row))
        rows = -(-ho // -(-ho // rows))          # equal bands
        t = [(i, b, b + 1, r, min(r + rows, ho)) for i in range(n) for b in range(ob) for r in range(0, ho, rows)]
    else:
        g = max(1, target // plane)
        g = -(-ob // -(-ob // g))                # equal groups
        t = [(i, b, min(b + g, ob), 0, ho) for i in range(n) for b in range(0, ob, g)]
    return np.array(t, np.int64).reshape(-1, 5)


def describe_grouped(x_shape, w_shape, out_shape, groups, stride, padding, dilation) -> dict:
    """Partitioning and tiles for `compiled.plan()` (NCHW shapes)."""
    n, ci, h, w = x_shape
    co, cg, kh, kw = w_shape
    ho, wo = out_shape[2], out_shape[3]
    if grouped_lanes_applies(ci, co, groups):
        tasks = plan_grouped_lanes_tasks(n, -(-co // 16), ho, wo, kh, kw, cg)
        rows = int(max(tasks[:, 4] - tasks[:, 3]))
        return {"partitioning": "rows split" if rows < ho else "blocks split", "tasks": len(tasks),
                "tiles": {"form": "lanes", "cg": cg, "RB": 8, "rows": rows,
                          "blocks": int(max(tasks[:, 2] - tasks[:, 1]))}}
    L, cbg, obg, gp = grouped_bundle(ci, co, groups)
    rows = plan_grouped_rows(cbg, obg, kh, kw, stride, dilation, ho, wo, w + padding[2] + padding[3],
                 tuple(padding) != (0, 0, 0, 0))
    tasks = plan_grouped_tasks(n, gp, cbg, obg, kh, kw, ho, wo, rows)
    return {"partitioning": "groups x rows", "tasks": len(tasks),
            "tiles": {"L": L, "Cbg": cbg, "Obg": obg, "rows": rows, "groups/task": max(t[2] - t[1] for t in tasks)}}


def layer_plan(algorithm: str, x_shape, w_shape, out_shape, groups: int = 1, stride=(1, 1), padding=(0, 0, 0, 0),
               dilation=(1, 1), layout: str = "nchwc", threads: int = 1, out_layout: str | None = None) -> dict:
    """The plan a conv layer runs with on `threads` threads: {"partitioning", "tasks", "tiles" (the
    tile sizes, for `compiled.plan()`), "threads", "plan" (what the kernel takes as plan=, or None
    for the BLAS kernels, whose grids depend on the shape only)}. The conv front door
    (`conv.bind`) and `compiled.plan()` both read it, so the plan shown is the plan run.

    Shapes are NCHW (N, C, H, W) and (Co, Cg, KH, KW)."""
    n, ci, h, w = x_shape
    co, cg, kh, kw = w_shape
    _, _, ho, wo = out_shape
    cip, cop = -(-ci // 16) * 16, -(-co // 16) * 16
    t = max(1, int(threads))
    out = {"threads": t, "plan": None}
    if algorithm == "gemm1x1" and layout == "nchwc":
        op = -(-co // 32)
        p = plan_k1x1(cip, op, n * ho * wo, t, cop // 16)
        # K = reduction depth, Nb = output positions per task, m = output channels per task
        tiles = {"K": cip, "Nb": p["Q"], "m": p["B"] * 16}
        return dict(out, partitioning=p["partitioning"], tasks=p["tasks"], tiles=tiles, plan=p)
    if algorithm == "gemm1x1":
        p = plan_gemm1x1(ci, co, ho * wo)
        tasks = n * math.ceil(ho * wo / p["Nb"]) * math.ceil(co / p["m"])
        # seed 000's feature-map level: cores split Co; with many positions they split columns
        return dict(out, partitioning="Co split" if p["m"] < co else "cols split", tasks=tasks, tiles=p)
    if algorithm == "direct":
        p = plan_direct(cip // 16, kh, dilation[0], stride[0], ho, w + padding[2] + padding[3], wo=wo, n=n,
                        ob=cop // 16, kw=kw, padded=tuple(padding) != (0, 0, 0, 0), threads=t)
        return dict(out, partitioning=p["partitioning"], tasks=p["tasks"],
                    tiles={"rows": p["rows"], "Co": 16 * p["blocks"]}, plan=p)
    if algorithm.startswith("winograd"):
        m = int(algorithm[-1])
        p = plan_winograd(m + 2, cip, cop, n * math.ceil(ho / m) * math.ceil(wo / m), t)
        return dict(out, partitioning=p["partitioning"], tasks=p["tasks"],
                    tiles={"tiles": p["tiles"], "Co": 32 * p["pairs"]}, plan=p)
    if algorithm == "im2col" and out_layout == "nchwc" and groups == 1 and ci <= 4:
        p = plan_stem(ci, kh, kw, stride[0], dilation[0], ho, wo, w + padding[2] + padding[3], n, cop // 16, t)
        return dict(out, partitioning=p["partitioning"] + " (stem kernel)", tasks=p["tasks"],
                    tiles={"rows": p["rows"]}, plan=p)
    if algorithm == "depthwise":
        tasks = plan_depthwise_tasks(n, -(-co // 16), ho, wo, kh * kw, t)
        rows = max(q[4] - q[3] for q in tasks)
        blocks = max(q[2] - q[1] for q in tasks)
        return dict(out, partitioning="rows split" if rows < ho else "blocks split", tasks=len(tasks),
                    tiles={"RB": 8, "rows": rows, "blocks": blocks, "padded": plan_depthwise_padded(ho, wo, kw, stride[1])})
    if algorithm == "grouped":
        return dict(out, **describe_grouped(x_shape, w_shape, out_shape, groups, stride, padding, dilation))
    if algorithm == "im2col":
        p = plan_im2col(cg * kh * kw, wo, ho)
        return dict(out, partitioning="rows split", tasks=n * groups * math.ceil(ho / p["rows"]), tiles=p)
    return dict(out, partitioning="-", tasks=1, tiles={})


def describe(algorithm: str, x_shape, w_shape, out_shape, groups: int = 1, stride=(1, 1),
             padding=(0, 0, 0, 0), dilation=(1, 1), layout: str = "nchwc", threads: int = 1,
             out_layout: str | None = None) -> dict:
    """`layer_plan` without the kernel's plan: {"partitioning", "tiles", "tasks", "threads"}."""
    d = layer_plan(algorithm, x_shape, w_shape, out_shape, groups, stride, padding, dilation, layout, threads, out_layout)
    d.pop("plan")
    return d
