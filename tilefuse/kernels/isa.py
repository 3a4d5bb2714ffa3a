"""The instruction set numba compiles the kernels for: full-width vectors on every AVX-512 machine.

LLVM tunes Intel Skylake-SP and later server cores (skylake-avx512, cascadelake, icelake-server,
sapphirerapids, emeraldrapids, ...) with `prefer-256-bit`: its vectorizers then use 256-bit ymm
registers even though the core has 512-bit zmm ones (AMD Zen 4/5 are not tuned that way). The
conv kernels are written for one 16-float zmm register per output-channel block, so on those
Intel cores they ran at half width (issue 13: the 1x1 layers 1.4-1.6x slower on one core).

`configure()` runs once, from `tilefuse/__init__.py`, before any kernel is defined (numba reads
its target options when the first function is decorated): on a host with AVX-512 it sets
numba's CPU features to the host's own feature list plus `-prefer-256-bit`. It leaves numba
alone when the user chose the features (NUMBA_CPU_FEATURES) and can be overridden with
TILEFUSE_VECTOR_BITS=256 (keep LLVM's choice: for measurements) or =512.
TILEFUSE_ASSUME_HOST_FEATURES replaces the host's feature list (assembly inspection only).

`info()` says what numba really compiles for (CPU model, LLVM CPU name, vector width, whether
tilefuse changed the features); it goes into `compiled.plan()`, the package metadata and the
tuning cache key. `probe_vector_bits()` compiles a small loop and reads its assembly: the tests
check that it finds zmm FMAs on every AVX-512 host.
"""
from __future__ import annotations

import functools
import os
import re

from .fpflags import FAST

ENV = "TILEFUSE_VECTOR_BITS"
# act as if the host had these LLVM features ("+avx512f,+avx2,..."): configure() then decides as it
# would on such a host. For inspecting the assembly of another machine (tests/test_isa.py checks
# the AVX-512 rule on hosts without AVX-512); code compiled so may not run on this host.
ASSUME_ENV = "TILEFUSE_ASSUME_HOST_FEATURES"
_STATE: dict = {"configured": False, "changed": False, "reason": "not configured"}


def _target_initialized() -> bool:
    """Has numba created its CPU code generator (then its options are fixed)?"""
    from numba.core.registry import cpu_target
    return "_toplevel_target_context" in cpu_target.__dict__


def configure() -> dict:
    """Set numba's CPU features for full-width vectors (idempotent); returns the state."""
    if _STATE["configured"]:
        return _STATE
    _STATE["configured"] = True
    want = os.environ.get(ENV, "").strip()
    if want not in ("", "256", "512"):
        _STATE["reason"] = f"{ENV}={want!r} ignored (expected 256 or 512)"
        want = ""
    if os.environ.get("NUMBA_CPU_FEATURES"):
        _STATE["reason"] = "NUMBA_CPU_FEATURES set by the user"
        return _STATE
    if want == "256":
        _STATE["reason"] = f"{ENV}=256: LLVM's default tuning kept"
        return _STATE
    forced = os.environ.get(ASSUME_ENV, "").strip()
    if forced:      # cross-compiling for inspection: the code built this way may not run here
        feats = {f[1:]: f[0] == "+" for f in forced.split(",") if f[:1] in "+-" and len(f) > 1}
        flat = forced
    else:
        try:
            import llvmlite.binding as ll
            host = ll.get_host_cpu_features()
        except Exception as e:  # no LLVM host information: leave numba's defaults
            _STATE["reason"] = f"host CPU features unavailable ({e})"
            return _STATE
        feats, flat = host, host.flatten()
    if not feats.get("avx512f"):
        _STATE["reason"] = "no AVX-512 on this host"
        return _STATE
    if _target_initialized():
        _STATE["reason"] = "numba's code generator was created before tilefuse was imported"
        return _STATE
    from numba.core import config
    config.CPU_FEATURES = flat + ",-prefer-256-bit"
    _STATE["changed"] = True
    _STATE["reason"] = "AVX-512 host: host features + -prefer-256-bit"
    return _STATE


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), e.g. 'INTEL(R) XEON(R) PLATINUM 8581C'."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine() or "unknown cpu"


def _codegen_target() -> tuple[str, str]:
    """(LLVM CPU name, feature string) numba's JIT compiles for."""
    from numba.core.registry import cpu_target
    cg = cpu_target.target_context.codegen()
    return cg._get_host_cpu_name(), cg._tm_features


def vector_bits_of(cpu_name: str, features: str) -> int:
    """The float vector width LLVM uses for (cpu name, features): 512 with AVX-512 unless tuned
    prefer-256-bit, 256 with AVX, else 128."""
    on = {f[1:] for f in features.split(",") if f.startswith("+")}
    off = {f[1:] for f in features.split(",") if f.startswith("-")}
    if "avx512f" in on:
        if "prefer-256-bit" in on:
            return 256
        if "prefer-256-bit" in off:
            return 512
        return 256 if _tuned_prefer_256(cpu_name) else 512
    if "avx" in on:
        return 256
    return 128


# LLVM CPU names tuned prefer-256-bit (X86.td TuningPrefer256Bit; measured with LLVM 22 through
# numba: the Intel server cores and the client cores that have AVX-512; alderlake .. pantherlake,
# knl and the AMD cores are not). tests/test_isa.py checks the rule against the assembly.
_PREFER_256 = re.compile(r"^(skylake-avx512|cascadelake|cooperlake|cannonlake|icelake-client|icelake-server|"
                         r"tigerlake|rocketlake|sapphirerapids|emeraldrapids|graniterapids.*|diamondrapids|"
                         r"x86-64-v4)$")


def _tuned_prefer_256(cpu_name: str) -> bool:
    return bool(_PREFER_256.match(cpu_name or ""))


# The algorithm cost model's host kinds (kernels/conv/select.py, HOST_RATES). Intel's AVX-512 server
# cores (two 512-bit FMA pipes on the Xeon Gold / Platinum parts) run the direct conv's assembly strip
# ~1.6x faster against the Winograd kernels than the machines the model was calibrated on (Zen 3 / Zen 4):
# measured on an Emerald Rapids VM (benchmarks/RESULTS.md, twenty-fourth session). The LLVM CPU name, the
# compiled width and one feature decide, so a plan is the same in every process on a host: a hypervisor may
# report a server core as a client model (a 2-vCPU KVM guest with AMX, 2 MiB of L2 a core, reads as CPUID model
# 167, `rocketlake` to LLVM; sixty-fourth session), so AMX tiles (`amx-tile`: Sapphire Rapids and later server
# cores only) count as a server core too.
COST_HOST_ENV = "TILEFUSE_COST_HOST"
_INTEL_AVX512_SERVER = re.compile(r"^(skylake-avx512|cascadelake|cooperlake|icelake-server|sapphirerapids|"
                                  r"emeraldrapids|graniterapids.*|diamondrapids)$")
COST_HOSTS = ("base", "intel-avx512")


def cost_host() -> str:
    """The cost model's host kind: "intel-avx512" for an Intel AVX-512 server core compiled for 512-bit
    vectors, else "base". TILEFUSE_COST_HOST (one of COST_HOSTS) overrides it."""
    want = os.environ.get(COST_HOST_ENV, "").strip()
    if want:
        if want not in COST_HOSTS:
            raise ValueError(f"{COST_HOST_ENV}={want!r}: expected one of {COST_HOSTS}")
        return want
    i = info()
    return cost_host_of(i["llvm_cpu"], i["vector_bits"], _codegen_features())


@functools.lru_cache(maxsize=1)
def _codegen_features() -> str:
    """LLVM's feature string numba compiles for (fixed once its code generator exists: `info()` made it)."""
    return _codegen_target()[1]


def cost_host_of(llvm_cpu: str, vector_bits: int, features: str = "") -> str:
    """The cost model's host kind for an LLVM CPU name, the compiled vector width and LLVM's feature string."""
    server = _INTEL_AVX512_SERVER.match(llvm_cpu or "") or "+amx-tile" in features.split(",")
    return "intel-avx512" if vector_bits == 512 and server else "base"


@functools.lru_cache(maxsize=1)
def info() -> dict:
    """What the kernels are compiled for: {"cpu_model", "llvm_cpu", "vector_bits", "tilefuse_set",
    "reason"} (vector_bits from numba's real target options)."""
    configure()
    name, feats = _codegen_target()
    return {"cpu_model": cpu_model(), "llvm_cpu": name, "vector_bits": vector_bits_of(name, feats),
            "tilefuse_set": _STATE["changed"], "reason": _STATE["reason"]}


def describe() -> str:
    i = info()
    return f"{i['cpu_model']} ({i['llvm_cpu']}), {i['vector_bits']}-bit vectors"


def probe_vector_bits() -> int:
    """Compile a float32 multiply-add loop (not cached) and read the width of its FMAs from the
    assembly: 512 (zmm), 256 (ymm) or 128 (xmm / scalar)."""
    import numpy as np
    from numba import njit

    def axpy(a, b, c):
        for i in range(c.size):
            c[i] += a[i] * b[i]

    f = njit(fastmath=FAST)(axpy)
    x = np.ones(256, np.float32)
    f(x, x, x.copy())
    asm = f.inspect_asm(f.signatures[0])
    regs = re.findall(r"vfmadd\w*\s+[^\n]*?%([xyz])mm", asm)
    if "z" in regs:
        return 512
    if "y" in regs:
        return 256
    return 128


# Measured peak ---------------------------------------------------------------------------------
# The efficiency figures (tilefuse profile, benchmarks/scaling.py) divide by a peak measured here,
# not a datasheet number: independent float32 FMA chains, each exactly one vector register of the
# compiled width (`info()["vector_bits"]` / 32 lanes: 16 on AVX-512, 8 on AVX2), as many chains as
# hide the FMA latency on every current core (two FMA pipes x 4-5 cycles) while chains + operands
# still fit the register file (32 zmm on AVX-512: 16 chains; 16 ymm on AVX2: 12 chains). A chain
# wider than a register, or more chains than registers, spills every accumulator to the stack and
# measures the store port instead (16 chains of 16 lanes on an AVX2 host read 37 instead of
# 77 GFLOP/s on a 2.45 GHz Zen 3: every "% of peak" doubled). FLOPs counted as 2 per lane per FMA.

def fma_shape(vector_bits: int) -> tuple[int, int]:
    """(chains, lanes) of the peak loop for a vector width: one register per chain, chains and
    the two operands within the register file."""
    lanes = max(4, vector_bits // 32)
    chains = 16 if vector_bits >= 512 else 12
    return chains, lanes


def _fma_chains_source(chains: int, lanes: int = 16) -> str:
    names = [f"a{i}" for i in range(chains)]
    lines = ["def fma_chains(n, x, y):"]
    lines += [f"    {a} = nb.carray(stack_f32({lanes}), {lanes})" for a in names]
    lines += [f"    for l in range({lanes}):"] + [f"        {a}[l] = x[l] + np.float32({i})" for i, a in enumerate(names)]
    lines += ["    for _ in range(n):", f"        for l in range({lanes}):"]
    lines += [f"            {a}[l] = {a}[l] * y[l] + x[l]" for a in names]
    lines += ["    s = np.float32(0.0)", f"    for l in range({lanes}):"] + [f"        s += {a}[l]" for a in names]
    lines += ["    return s"]
    return "\n".join(lines)


_FMA: dict = {}


def _fma_kernel(chains: int, lanes: int):
    f = _FMA.get((chains, lanes))
    if f is None:
        import numba as nb
        import numpy as np
        from numba import njit

        from tilefuse.kernels.conv._nb import stack_f32
        ns = {"nb": nb, "np": np, "stack_f32": stack_f32}
        exec(_fma_chains_source(chains, lanes), ns)  # straight-line source: one register per chain
        f = _FMA[(chains, lanes)] = njit(fastmath=FAST, nogil=True)(ns["fma_chains"])
    return f


def measure_peak(seconds: float = 0.2, repeats: int = 5, vector_bits: int | None = None) -> float:
    """Single-core float32 FMA peak in FLOP/s, measured (best of `repeats` runs of ~seconds/repeats)
    at the compiled vector width (or `vector_bits`)."""
    import time

    import numpy as np
    chains, lanes = fma_shape(vector_bits or info()["vector_bits"])
    f = _fma_kernel(chains, lanes)
    x = np.full(lanes, 1e-3, np.float32)
    y = np.full(lanes, 0.999, np.float32)
    f(10, x, y)
    n = 1 << 16
    while True:                      # grow the trip count until one run takes long enough
        t = time.perf_counter()
        f(n, x, y)
        dt = time.perf_counter() - t
        if dt > seconds / repeats / 4 or n > 1 << 34:
            break
        n *= 4
    best = 0.0
    for _ in range(repeats):
        t = time.thread_time()
        f(n, x, y)
        dt = time.thread_time() - t
        if dt > 0:
            best = max(best, 2.0 * lanes * chains * n / dt)
    return best


def host_memory_bytes() -> int | None:
    """Physical memory of this host (the most a growable device takes, the largest tensor `compile` plans),
    or None if unknown."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
