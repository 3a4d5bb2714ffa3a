"""Full-width vectors on AVX-512 hosts (kernels/isa.py): read from the assembly numba generates.

Intel server cores are emulated on any AVX-512 host with NUMBA_CPU_NAME (LLVM tunes them
prefer-256-bit; the host's own features keep the code runnable), in a fresh process with an
empty numba cache (numba does not show the assembly of cached code).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tilefuse.kernels import isa

ROOT = Path(__file__).resolve().parent.parent
HOST_AVX512 = bool(__import__("llvmlite.binding", fromlist=["x"]).get_host_cpu_features().get("avx512f"))

SCRIPT = r"""
import json, re
import numpy as np
import tilefuse
from tilefuse.kernels import isa
from tilefuse.kernels.conv import k1x1, conv2d_prepare, conv2d_run_nchwc, to_nchwc, nchwc_shape
x = np.ones((1, 32, 7, 7), np.float32)
prep = conv2d_prepare("gemm1x1", np.ones((32, 32, 1, 1), np.float32), None, 1, 0, 1, 1, layout="nchwc")
ob = np.empty(nchwc_shape((1, 32, 7, 7)), np.float32)
conv2d_run_nchwc("gemm1x1", ob, to_nchwc(x), prep, None, stride=1, padding=0, dilation=1, threads=1)
from tilefuse.kernels.conv.tiles import NARROW
kern = k1x1._k1x1_narrow if NARROW else k1x1._k1x1_wide   # the register tile the dispatcher `_k1x1` ran
asm = kern.inspect_asm(kern.signatures[0])
# the register tile: weight vector x input broadcast from memory ({1to16} on zmm; the
# 256-bit tile broadcasts into a register instead);
# the activation loops inlined after it (apply_span) are LLVM-vectorized: a full-width body plus a
# narrower vectorized remainder (xmm/ymm), so "every FMA is zmm" would be the wrong rule for them
tile = sorted(set(re.findall(r"vfmadd\w*ps\s+\S*\{1to\d+\}, %([xyz])mm", asm)))
regs = sorted(set(re.findall(r"vfmadd\w*ps\s+[^\n]*?%([xyz])mm", asm)))
print(json.dumps({"info": isa.info(), "probe": isa.probe_vector_bits(), "k1x1_tile_fma": tile,
                  "k1x1_packed_fma": regs}))
"""


# the same check on any host, compile only: tilefuse is told the host has a Sapphire Rapids
# core's features (TILEFUSE_ASSUME_HOST_FEATURES), so configure() takes its AVX-512 branch; the
# register tile is compiled for the k1x1 signature and its assembly read, never run (it could not
# run here without AVX-512)
SPR_FEATURES = ("+avx512f,+avx512bw,+avx512vl,+avx512dq,+avx512cd,+avx512vnni,+avx512bf16,+avx2,+avx,+fma,"
                "+f16c,+bmi,+bmi2,+lzcnt,+popcnt,+sse4.2,+sse4.1,+ssse3,+sse3,+sse2,+sse,+cx16,+movbe")
COMPILE_ONLY = r"""
import json, re
from numba import types as t
import tilefuse
from tilefuse.kernels import isa
from tilefuse.kernels.conv import k1x1
from tilefuse.kernels.conv.tiles import NARROW
A = lambda n: t.Array(t.float32, n, "C", readonly=False, aligned=True)
# the tile's signature (_tiles_gen._k1x1_wide): of, xf, wp (3-D packed weights), bias, rf, has_res,
# code, alpha, beta, q0 .. sw (twelve int64), q_outer, pfd, pfo, kc
sig = (A(1), A(1), A(3), A(1), A(1), t.boolean, t.int64, t.float32, t.float32) + (t.int64,) * 12 \
    + (t.boolean, t.int64, t.boolean, t.int64)
kern = k1x1._k1x1_narrow if NARROW else k1x1._k1x1_wide
kern.compile(sig)
asm = kern.inspect_asm(kern.signatures[0])
tile = sorted(set(re.findall(r"vfmadd\w*ps\s+\S*\{1to\d+\}, %([xyz])mm", asm)))
regs = sorted(set(re.findall(r"vfmadd\w*ps\s+[^\n]*?%([xyz])mm", asm)))
print(json.dumps({"info": isa.info(), "narrow": NARROW, "k1x1_tile_fma": tile, "k1x1_packed_fma": regs}))
"""


def test_assumed_intel_server_core_gets_zmm_in_the_conv_kernel(tmp_path):
    """On any host: with a Sapphire Rapids core's features, configure() must lift LLVM's
    prefer-256-bit and the k1x1 register tile must be zmm; with TILEFUSE_VECTOR_BITS=256 the same
    reading sees no zmm (so the check can fail)."""
    def compile_for(**extra):
        e = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), PYTHONPATH=str(ROOT),
                 NUMBA_CPU_NAME="sapphirerapids", **{isa.ASSUME_ENV: SPR_FEATURES}, **extra)
        e.pop("NUMBA_CPU_FEATURES", None)
        out = subprocess.run([sys.executable, "-c", COMPILE_ONLY], env=e, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    got = compile_for()
    assert got["info"]["tilefuse_set"] and got["info"]["vector_bits"] == 512 and not got["narrow"], got
    assert got["k1x1_tile_fma"] == ["z"] and max(got["k1x1_packed_fma"]) == "z", got
    half = compile_for(**{isa.ENV: "256"})
    assert half["info"]["vector_bits"] == 256 and half["narrow"], half
    assert "z" not in half["k1x1_tile_fma"] and "z" not in half["k1x1_packed_fma"], half


def _run(tmp_path, **env):
    # the numba register tiles, whose width is LLVM's choice (TILEFUSE_ASM_TILES=0: the assembly strips,
    # zmm / ymm by construction, would otherwise run the stride-1 1x1 instead; tests/test_register_tiles.py)
    e = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), PYTHONPATH=str(ROOT), TILEFUSE_ASM_TILES="0", **env)
    e.pop("NUMBA_CPU_FEATURES", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=e, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_this_process_compiles_full_width():
    """The width info() reports is the one the assembly shows; 512 on every AVX-512 host."""
    bits = isa.probe_vector_bits()
    assert isa.info()["vector_bits"] == bits
    assert bits == (512 if HOST_AVX512 else bits)
    if HOST_AVX512 and not os.environ.get(isa.ENV) and not os.environ.get("NUMBA_CPU_FEATURES"):
        assert isa.info()["tilefuse_set"] or not isa._tuned_prefer_256(isa.info()["llvm_cpu"])


@pytest.mark.skipif(not HOST_AVX512, reason="emulating an Intel AVX-512 core needs an AVX-512 host")
def test_intel_server_core_gets_zmm_in_the_conv_kernel(tmp_path):
    """sapphirerapids is tuned prefer-256-bit by LLVM: tilefuse must still get zmm FMAs in k1x1's
    register tile, and zmm is the widest packed FMA in the kernel; with
    TILEFUSE_VECTOR_BITS=256 (LLVM's choice kept) the same check sees ymm, so it can fail."""
    got = _run(tmp_path, NUMBA_CPU_NAME="sapphirerapids")
    assert got["info"]["llvm_cpu"] == "sapphirerapids" and got["info"]["vector_bits"] == 512
    assert got["probe"] == 512 and got["k1x1_tile_fma"] == ["z"] and max(got["k1x1_packed_fma"]) == "z", got
    half = _run(tmp_path, NUMBA_CPU_NAME="sapphirerapids", **{isa.ENV: "256"})
    assert half["probe"] == 256 and half["info"]["vector_bits"] == 256, half
    assert "z" not in half["k1x1_tile_fma"] and "z" not in half["k1x1_packed_fma"], half


def test_vector_width_rule():
    host = "+avx,+avx2,+avx512f,+fma"
    assert isa.vector_bits_of("sapphirerapids", host) == 256
    assert isa.vector_bits_of("sapphirerapids", host + ",-prefer-256-bit") == 512
    assert isa.vector_bits_of("emeraldrapids", host + ",-prefer-256-bit") == 512
    assert isa.vector_bits_of("znver4", host) == 512
    assert isa.vector_bits_of("skylake", "+avx,+avx2,-avx512f") == 256
    assert isa.vector_bits_of("generic", "") == 128


def _fma_loop_spills(chains: int, lanes: int) -> tuple[int, int]:
    """(FMAs, stack references) in the peak loop's body (from its first FMA to the branch back)."""
    import re
    f = isa._fma_kernel(chains, lanes)
    x = np.ones(lanes, np.float32)
    f(1, x, x)
    lines = f.inspect_asm(f.signatures[0]).splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.strip().startswith("vfmadd"))
    body = []
    for ln in lines[first:]:
        if re.match(r"\s*j\w+\s", ln):
            break
        body.append(ln)
    return sum(ln.strip().startswith("vfmadd") for ln in body), sum("rsp" in ln for ln in body)


def test_peak_loop_keeps_every_chain_in_a_register():
    """measure_peak's chains are one register each at the compiled width and fit the register file
    (16 chains of 16 lanes on an AVX2 host spilled every accumulator and read half the peak, which
    doubled every '% of peak' that tilefuse profile and benchmarks/scaling.py print)."""
    bits = isa.info()["vector_bits"]
    chains, lanes = isa.fma_shape(bits)
    assert lanes * 32 == bits or bits < 128
    n, spilled = _fma_loop_spills(chains, lanes)
    assert n >= chains and spilled == 0, (n, spilled)
    if bits == 256:                                   # the old shape does spill here: the check can fail
        n, spilled = _fma_loop_spills(16, 16)
        assert spilled > 0


def test_fma_shape_rule():
    assert isa.fma_shape(512) == (16, 16)
    assert isa.fma_shape(256) == (12, 8)
    assert isa.fma_shape(128) == (12, 4)
