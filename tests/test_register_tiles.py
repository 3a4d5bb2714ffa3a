"""The two register tiles of every blocked conv kernel give the same bits (docs/kernels.md, "AVX2").

Hosts compiled for 512-bit vectors run the wide tiles (7 positions x 2 blocks of 16 output channels
for 1x1 / direct / Winograd's GEMMs, 8 x 2 for the stem); hosts with 256-bit vectors (`tiles.NARROW`:
AVX2, Intel Xeons LLVM marks prefer-256-bit) run 5 positions x 1 block, which fits their 16 ymm
registers. Both are plain numba code that runs on either host, so this file calls both directly on
odd shapes (odd block counts, partial position blocks, stride 2, dilation, residual + ReLU6, task
ranges that start mid-map) and asserts the outputs are bitwise identical and match numpy: a model
compiled on one kind of host computes what it computes on the other.
"""
from __future__ import annotations

import numpy as np
import pytest

from tilefuse.kernels.conv import direct, k1x1, stem, winograd
from tilefuse.kernels.conv.tiles import ASM_512, ASM_AVX2, NARROW
from tilefuse.kernels.conv.epilogue import EMPTY1, EMPTY4

CLIP = (2, np.float32(0.0), np.float32(6.0))  # ReLU6: the epilogue's clip loop


def _blocked(x):
    """(N, C, H, W) -> (N, Cb, H, W, 16) zero padded channels."""
    n, c, h, w = x.shape
    cb = -(-c // 16)
    xp = np.zeros((n, cb * 16, h, w), np.float32)
    xp[:, :c] = x
    # (N, Cb*16, H, W) -> (N, Cb, 16, H, W) -> (N, Cb, H, W, 16)
    return np.ascontiguousarray(xp.reshape(n, cb, 16, h, w).transpose(0, 1, 3, 4, 2))


def _unblocked(xb, c):
    """(N, Cb, H, W, 16) -> (N, c, H, W)."""
    n, cb, h, w, _ = xb.shape
    return xb.transpose(0, 1, 4, 2, 3).reshape(n, cb * 16, h, w)[:, :c]


def _act(v, res=None):
    if res is not None:
        v = v + res
    return np.clip(v, 0.0, 6.0)


def _probe(tmp_path, script, flag, cache=None):
    """Run `script` in a fresh process with its own numba cache (numba cannot inspect cached code) and
    TILEFUSE_ASM_TILES=flag; returns the JSON of its last output line."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    e = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / (cache or f"numba{flag}")), TILEFUSE_ASM_TILES=flag,
             PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    out = subprocess.run([sys.executable, "-c", script], env=e, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_narrow_flag_follows_the_compiled_width():
    from tilefuse.kernels import isa
    assert NARROW == (isa.info()["vector_bits"] < 512)


_DISPATCH_IR = r"""
import json
from numba import types as t
import tilefuse
from tilefuse.kernels.conv import k1x1
A = lambda n: t.Array(t.float32, n, "C", readonly=False, aligned=True)
# the 1x1 dispatcher's signature: of, xf, wp (3-D packed weights), bias, rf, has_res, code, alpha,
# beta, q0 .. sw (twelve int64), q_outer, pfd, pfo, kc
sig = (A(1), A(1), A(3), A(1), A(1), t.boolean, t.int64, t.float32, t.float32) + (t.int64,) * 12 \
    + (t.boolean, t.int64, t.boolean, t.int64)
k1x1._k1x1.compile(sig)
print(json.dumps({"fma": k1x1._k1x1.inspect_llvm(k1x1._k1x1.signatures[0]).count("vfmadd231ps")}))
"""


_FRESH_CALLER = r"""
import json
import numpy as np
from numba import njit
import tilefuse
from tilefuse.kernels.conv import k1x1
from tilefuse.kernels.conv.epilogue import EMPTY1
pr = k1x1.prepare(np.ones((32, 32, 1, 1), np.float32), None)
x = np.ones(2 * 49 * 16, np.float32)
out = np.zeros(2 * 49 * 16, np.float32)

@njit
def caller(of, xf, wp, bias):
    k1x1._k1x1(of, xf, wp, bias, EMPTY1, False, 0, np.float32(0), np.float32(0), 0, 49, 0, 2, 49, 7, 49, 7, 2, 2,
               1, 1, True, 1, True, 32)

caller(out, x, pr["weight"], pr["bias"])
print(json.dumps({"ok": bool(np.all(out == 32.0))}))
"""


def test_assembly_tile_runs_on_x86_avx2_hosts(tmp_path):
    """x86-64 hosts compiled for 256-bit vectors with AVX2 and FMA run the assembly tile
    (`_nb.tile16`): the flag says so, and the 1x1 dispatcher compiled afresh (numba cannot inspect
    cached code) holds the tile's six variants (6 + 5 + ... + 1 = 21 positions x 2 FMAs per copy); with
    TILEFUSE_ASM_TILES=0 it holds none. Fails if the dispatch falls back to the numba tile."""
    import os
    import platform

    from tilefuse.kernels import isa
    feats = set(isa._codegen_target()[1].split(","))
    host_can = NARROW and platform.machine().lower() in ("x86_64", "amd64") and {"+avx2", "+fma"} <= feats
    assert ASM_AVX2 == (host_can and os.environ.get("TILEFUSE_ASM_TILES", "").strip() != "0")

    got = _probe(tmp_path, _DISPATCH_IR, "1")["fma"]   # 42 per copy of the tile LLVM inlined into the dispatcher
    assert (got > 0 and got % 42 == 0) if host_can else got == 0, got
    assert _probe(tmp_path, _DISPATCH_IR, "0")["fma"] == 0
    # a new process: the dispatcher now comes from numba's cache (its codegen, which could register
    # LLVM's asm parser, never runs), and a function compiled afresh links its IR, assembly
    # included. Without the parser registered at import LLVM aborts the process here.
    assert _probe(tmp_path, _FRESH_CALLER, "1") == {"ok": True}


_STEM_IR = r"""
import json, re
import numpy as np
import tilefuse
from tilefuse.kernels.conv import stem
x = np.ones((1, 3, 12, 12), np.float32)
o = np.empty((1, 2, 6, 6, 16), np.float32)
stem.run_to_nchwc(o, x, stem.prepare(np.ones((32, 3, 3, 3), np.float32), np.zeros(32, np.float32)), stride=(2, 2),
                  padding=(1, 1, 1, 1), relu=True, threads=1)
ir = stem._stem_tile.inspect_llvm(stem._stem_tile.signatures[0])
calls = sorted(set(re.findall(r"call [^@\n]*@\S*?(_stem_rows_[a-z0-9]+)B", ir)))
print(json.dumps({"calls": calls, "ok": bool(np.all(o[:, :, 1:, 1:] == 27.0))}))
"""


def test_stem_strip_runs_on_x86_avx2_hosts(tmp_path):
    """x86-64 AVX2 hosts (tiles.ASM_AVX2) run the stem on the AVX2 strip: its tile dispatcher, compiled
    afresh through the public entry (in a new process with its own numba cache: numba cannot inspect cached
    code), calls `_stem_rows_avx2` and computes the conv. Fails if the dispatch falls back to the numba
    5 x 1 tile (1.2-1.5x the time: benchmarks/RESULTS.md, fifteenth session)."""
    from tilefuse.kernels.conv import tiles
    if not (NARROW and tiles.X86_AVX2):
        pytest.skip("not an x86-64 AVX2 host compiled for 256-bit vectors (the AVX-512 strip's test covers those)")

    on = _probe(tmp_path, _STEM_IR, "1")
    assert on["ok"] and "_stem_rows_avx2" in on["calls"], on


_STRIP512_IR = r"""
import json, re
from numba import types as t
import tilefuse
from tilefuse.kernels.conv import k1x1
A = lambda n: t.Array(t.float32, n, "C", readonly=False, aligned=True)
# _k1x1_tile's signature: _k1x1's with pfo an int64
sig = (A(1), A(1), A(3), A(1), A(1), t.boolean, t.int64, t.float32, t.float32) + (t.int64,) * 12 \
    + (t.boolean, t.int64, t.int64, t.int64)
k1x1._k1x1_tile.compile(sig)
ir = k1x1._k1x1_tile.inspect_llvm(k1x1._k1x1_tile.signatures[0])
calls = sorted(set(re.findall(r"call [^@\n]*@\S*?(_k1x1_[a-z0-9]+)B", ir)))
s = k1x1._k1x1_strips.inspect_llvm(k1x1._k1x1_strips.signatures[0]) if "_k1x1_strips" in calls else ""
# the direct conv: a 3x3 through its public entry, then its tile dispatcher's calls
import numpy as np
from tilefuse.kernels.conv import direct
x = np.ones((1, 1, 9, 9, 16), np.float32)
o = np.empty((1, 2, 9, 9, 16), np.float32)
direct.run_nchwc(o, x, direct.prepare(np.ones((32, 16, 3, 3), np.float32), None), padding=(1, 1, 1, 1), threads=1)
dir_ir = direct._direct_tile.inspect_llvm(direct._direct_tile.signatures[0])
dcalls = sorted(set(re.findall(r"call [^@\n]*@\S*?(_direct_rows[a-z0-9_]+?)B", dir_ir)))
print(json.dumps({"calls": calls, "zmm": s.count("vfmadd231ps %zmm"), "direct": dcalls}))
"""


def test_avx512_strip_runs_on_avx512_hosts(tmp_path):
    """x86-64 hosts compiled for 512-bit vectors run the 1x1 on the AVX-512 strip: the flag says so, the
    1x1's tile dispatcher compiled afresh calls `_k1x1_strips`, whose code holds strip512's 28 variants
    (14 + 13 + ... + 1 positions x 3 FMAs = 315 zmm FMAs, more where LLVM copies a branch), and the
    direct conv's tile dispatcher calls its strip (`_direct_rows_512`); with TILEFUSE_ASM_TILES=0 both
    call the numba tiles only. Fails if AVX-512 hosts fall back to the
    numba 7 x 2 tile (60-80% of the peak where the strip runs 70-85%: benchmarks/RESULTS.md)."""
    import os

    from tilefuse.kernels.conv import tiles
    host_can = (not NARROW) and tiles.X86_512
    assert ASM_512 == (host_can and os.environ.get("TILEFUSE_ASM_TILES", "").strip() != "0")
    if not host_can:
        pytest.skip("no AVX-512 code generation on this host (the AVX2 strip's test covers it)")

    on, off = _probe(tmp_path, _STRIP512_IR, "1"), _probe(tmp_path, _STRIP512_IR, "0")
    assert "_k1x1_strips" in on["calls"] and on["zmm"] >= 315, on
    assert "_k1x1_strips" not in off["calls"] and "_k1x1_wide" in off["calls"], off
    assert "_direct_rows_512" in on["direct"] and "_direct_rows_512" not in off["direct"], (on, off)


@pytest.mark.parametrize("ci,co,h,w,stride,n", [(24, 40, 9, 7, 1, 2), (40, 144, 7, 5, 2, 1), (256, 48, 6, 6, 1, 1),
                                              (16, 16, 3, 11, 1, 3), (72, 80, 13, 13, 2, 2), (48, 32, 4, 4, 1, 1),
                                              (33, 17, 1, 17, 1, 1)])
@pytest.mark.parametrize("with_res", [False, True])
def test_k1x1_tiles_same_bits(ci, co, h, w, stride, n, with_res):
    rng = np.random.default_rng(ci * co + h)
    x = rng.standard_normal((n, ci, h, w)).astype(np.float32)
    wt = (rng.standard_normal((co, ci, 1, 1)) / np.sqrt(ci)).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32)
    pr = k1x1.prepare(wt, b)
    wp, bias = pr["weight"], pr["bias"]
    xb = _blocked(x)
    ho, wo = (h - 1) // stride + 1, (w - 1) // stride + 1
    ob = -(-co // 16)
    op = wp.shape[0]
    res = rng.standard_normal((n, ob, ho, wo, 16)).astype(np.float32) if with_res else None
    rf = res.reshape(-1) if with_res else EMPTY1
    total = n * ho * wo
    outs = []
    # every tile, both loop orders (position block outer / output block outer); the assembly tile
    # where this host runs it (tasks of 13, 3, 4, 5, 113 ... positions: partial tiles of 1-5 rows)
    # (pfo 19: the assembly strip at stride 1, `k1x1._k1x1_strips`: whole tiles per image run, tiles across
    # an image boundary, the partial last tile)
    tiles = [(k1x1._k1x1_narrow, True), (k1x1._k1x1_wide, True)] + (
        [(k1x1._k1x1_avx2, True), (k1x1._k1x1_avx2, 19)] if ASM_AVX2 else [])
    for (fn, pfo), q_outer in (((fn, pfo), q_outer) for fn, pfo in tiles for q_outer in (True, False)):
        out = np.full((n, ob, ho, wo, 16), np.nan, np.float32)
        # three tasks: positions [0, q) x all pairs, then [q, total) in two pair ranges (mid-map starts); the
        # AVX2 kernel takes output blocks (any range: [q, total) then splits at block 1, inside a pair)
        q = min(total - 1, 13)
        blocks = fn is k1x1._k1x1_avx2
        rows = ((0, q, 0, ob), (q, total, 0, 1), (q, total, 1, ob)) if blocks else \
            ((0, q, 0, op), (q, total, 0, 1), (q, total, 1, op))
        for q0, q1, p0, p1 in rows:
            if p0 >= p1:
                continue
            fn(out.reshape(-1), xb.reshape(-1), wp, bias, rf, with_res, *CLIP, q0, q1, p0, p1, ho * wo, wo, h * w,
               w, xb.shape[1], ob, stride, stride, q_outer, 1, pfo, k1x1.reduction_length(wp))
        outs.append(out)
    assert all(np.array_equal(outs[0], o) for o in outs[1:])
    got = _unblocked(outs[0], co)
    ref = np.einsum("nchw,oc->nohw", x[:, :, ::stride, ::stride], wt[:, :, 0, 0]) + b[None, :, None, None]
    ref = _act(ref, _unblocked(res, co) if with_res else None)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not (ASM_AVX2 or ASM_512),
                    reason="the assembly strips run on x86-64 AVX2 or AVX-512 hosts (tiles.ASM_AVX2 / ASM_512) only")
@pytest.mark.parametrize("act", [None, "relu", ("clip", 0.0, 6.0), "silu", "gelu", ("leaky_relu", 0.1, 0.0)])
def test_k1x1_strips_same_bits_as_tiles(act):
    """run_nchwc with the strip (k1x1.STRIPS, the default on these hosts: `_nb.strip16` on AVX2, the
    14 x 2 `_nb.strip512` on AVX-512) and without (the numba tiles): the same bits for
    identity / ReLU / clip stored by the assembly (NaN inputs included: max / min with the bound first, as
    store16's selects) and for SiLU, GELU and leaky ReLU, which the strip path applies over each strip's
    stored rows (epilogue.act_span, after the last reduction slice only) and the tiles in deferred chunks
    (k1x1._k1x1); batches whose tasks cross image boundaries, residuals, 1-3
    threads, reductions in slices (k1x1.STRIP_K) or whole, a residual in the output's memory, odd output
    block counts (strip512's one-block tile), maps longer than a tile with a partial last one, stride 2.
    That the strips are what these hosts run: test_assembly_tile_runs_on_x86_avx2_hosts and
    test_avx512_strip_runs_on_avx512_hosts (a dispatcher's signatures, checked here before, are empty
    when the kernels come from numba's cache)."""
    rng = np.random.default_rng(7)
    cases = [(1, 16, 16, 5, 5), (2, 24, 40, 7, 7), (3, 32, 16, 3, 5), (1, 160, 96, 7, 7), (2, 200, 48, 7, 7),
             (1, 20, 48, 13, 11), (2, 3, 17, 9, 4), (1, 40, 80, 15, 15), (2, 64, 32, 14, 14)]
    try:
        # reduction slices of 32 channels (k1x1.STRIP_K: partial sums stored and resumed) and none
        for (n, ci, co, h, w), k in ((c, k) for c in cases for k in (32, 0)):
            k1x1.STRIP_K = k
            x = rng.standard_normal((n, ci, h, w)).astype(np.float32)
            x[0, 0, 0, 0] = np.nan
            x[-1, -1, -1, -1] = -0.0
            wt = rng.standard_normal((co, ci, 1, 1)).astype(np.float32)
            pr = k1x1.prepare(wt, rng.standard_normal(co).astype(np.float32))
            xb = _blocked(x)
            ob = -(-co // 16)
            for res in (None, rng.standard_normal((n, ob, h, w, 16)).astype(np.float32)):
                for th in (1, 2, 3):
                    outs = []
                    for strips in (False, True):
                        k1x1.STRIPS = strips
                        o = np.full((n, ob, h, w, 16), 7.0, np.float32)
                        k1x1.run_nchwc(o, xb, pr, res, act=act, threads=th)
                        outs.append(o)
                    assert _same_bits(outs[0], outs[1], co, x), (n, ci, co, h, w, th)
        # stride 2 (ResNet's projection shortcuts): on the strips the strided positions are gathered first
        for n, ci, co, h, w in ((2, 40, 48, 13, 11), (1, 64, 96, 14, 14), (3, 16, 16, 7, 9)):
            k1x1.STRIP_K = 32
            x = rng.standard_normal((n, ci, h, w)).astype(np.float32)
            wt = rng.standard_normal((co, ci, 1, 1)).astype(np.float32)
            pr = k1x1.prepare(wt, None)
            ho, wo, ob = (h - 1) // 2 + 1, (w - 1) // 2 + 1, -(-co // 16)
            r = rng.standard_normal((n, ob, ho, wo, 16)).astype(np.float32)
            outs = []
            for strips in (False, True):
                k1x1.STRIPS = strips
                o = np.full((n, ob, ho, wo, 16), 7.0, np.float32)
                k1x1.run_nchwc(o, _blocked(x), pr, r, stride=(2, 2), act=act, threads=2)
                outs.append(o)
            assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32)), ("stride 2", n, ci, co, h, w)
            ref = np.einsum("nchw,oc->nohw", x[:, :, ::2, ::2], wt[:, :, 0, 0])
            if act is None:
                np.testing.assert_allclose(_unblocked(outs[1], co), ref + _unblocked(r, co), rtol=1e-4, atol=1e-4)
        # the residual in the output's own memory (in place): the slices' partial sums must not overwrite it
        for n, ci, co, h, w in ((1, 200, 48, 7, 7), (2, 96, 64, 5, 5)):
            k1x1.STRIP_K = 32
            xb = _blocked(rng.standard_normal((n, ci, h, w)).astype(np.float32))
            pr = k1x1.prepare(rng.standard_normal((co, ci, 1, 1)).astype(np.float32), None)
            r = rng.standard_normal((n, 2 * (-(-co // 32)), h, w, 16)).astype(np.float32)
            outs = []
            for strips in (False, True):
                k1x1.STRIPS = strips
                o = r.copy()
                k1x1.run_nchwc(o, xb, pr, o, act=act, threads=1)
                outs.append(o)
            assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32)), ("in place", n, ci, co)
    finally:
        k1x1.STRIPS = True
        k1x1.STRIP_K = 128


@pytest.mark.skipif(not ASM_AVX2 or ASM_512, reason="the half strip (_nb.strip8) runs on x86-64 AVX2 hosts only")
@pytest.mark.parametrize("act", [None, ("clip", 0.0, 6.0), "silu"])
def test_k1x1_half_strip_same_bits(act):
    """A last output block of 1-8 channels (Co = 8, 17, 24, 40, 104) on the half strip (k1x1.HALF_STRIPS:
    12 positions x lanes 0-7, `_nb.strip8`) and on strip16 (both halves): the same bits in every lane for finite
    inputs (the padded lanes act(bias + residual) as strip16 leaves them), with residuals, reductions in slices
    (k1x1.STRIP_K) or whole, batches, partial tiles, 1-3 threads. And that the half strip is what runs: a NaN
    input makes strip16's padded lanes NaN (0 x NaN), the half strip's stay act(0) = 0."""
    rng = np.random.default_rng(11)
    try:
        for n, ci, co, h, w in ((1, 96, 24, 13, 11), (2, 40, 40, 7, 7), (1, 20, 8, 5, 5), (3, 300, 104, 3, 5),
                                (1, 16, 17, 14, 14), (2, 144, 24, 1, 23)):
            for k in (32, 0):
                k1x1.STRIP_K = k
                x = rng.standard_normal((n, ci, h, w)).astype(np.float32)
                pr = k1x1.prepare(rng.standard_normal((co, ci, 1, 1)).astype(np.float32),
                                  rng.standard_normal(co).astype(np.float32))
                ob = -(-co // 16)
                res = rng.standard_normal((n, ob, h, w, 16)).astype(np.float32)
                res.reshape(-1, ob * 16)[:, co:] = 0        # the padded channels of a blocked tensor
                for r in (None, res):
                    for th in (1, 2, 3):
                        outs = []
                        for half in (False, True):
                            k1x1.HALF_STRIPS = half
                            o = np.full((n, ob, h, w, 16), 7.0, np.float32)
                            k1x1.run_nchwc(o, _blocked(x), pr, r, act=act, threads=th)
                            outs.append(o)
                        assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32)), (n, ci, co, k, th)
        # the per-layer decision (a layer's task loop and a fused chain's binding read it): the last block's upper half
        for co, flag in ((24, 32), (40, 32), (17, 32), (32, 0), (48, 0), (30, 0)):
            w = k1x1.prepare(rng.standard_normal((co, 20, 1, 1)).astype(np.float32), None)["weight"]
            assert k1x1.half_flag(w, 20, -(-co // 16)) == flag, co
        x = rng.standard_normal((1, 32, 6, 6)).astype(np.float32)
        x[0, 5, 2, 3] = np.nan
        pr = k1x1.prepare(rng.standard_normal((24, 32, 1, 1)).astype(np.float32), None)
        outs = []
        for half in (False, True):
            k1x1.HALF_STRIPS = half
            o = np.full((1, 2, 6, 6, 16), 7.0, np.float32)
            k1x1.run_nchwc(o, _blocked(x), pr, None, act=act, threads=2)
            outs.append(o)
        assert np.isnan(outs[0][0, 1, 2, 3, 8:]).all() and (outs[1][0, 1, :, :, 8:] == 0).all()
        nan = np.isnan(outs[0])
        nan[0, 1, 2, 3, 8:] = False        # only the padded lanes at the NaN's position differ
        assert np.array_equal(np.isnan(outs[1]), nan) and nan[0, :, 2, 3, :8].all()
    finally:
        k1x1.HALF_STRIPS = True
        k1x1.STRIP_K = 128


def _same_bits(tiles, strips, co, x):
    """The strips' output has the tiles' bits: every real channel, and the padded lanes (channels >= co) too
    but at positions whose input holds a NaN or infinity. There the tiles' FMAs on zero weights made the
    padded lanes NaN; the half strip (AVX2, a last block of 1-8 channels: `_nb.strip8`) does not compute them
    and stores act(bias + residual) of the padding, act(0), as for finite inputs (docs/kernels.md)."""
    a, b = tiles.view(np.uint32).copy(), strips.view(np.uint32).copy()
    bad = ~np.isfinite(x).all(axis=1)                  # (N, H, W) positions with a non-finite input
    for arr in (a, b):
        # (N, Ob, H, W, 16) -> (N, H, W, Ob * 16): the channels of each position, padding last
        flat = arr.transpose(0, 2, 3, 1, 4).reshape(arr.shape[0], arr.shape[2], arr.shape[3], -1)
        flat[..., co:][bad] = 0
        arr[...] = flat.reshape(arr.shape[0], arr.shape[2], arr.shape[3], arr.shape[1], 16).transpose(0, 3, 1, 2, 4)
    return np.array_equal(a, b)


def _conv_ref(x, wt, b, stride, pad, dil):
    import torch
    return torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), torch.from_numpy(b), stride=stride,
                                      padding=pad, dilation=dil).numpy()


@pytest.mark.parametrize("ci,co,k,stride,dil,hw,o0", [(32, 48, 3, 1, 1, 9, 0), (16, 80, 3, 2, 1, 11, 1),
                                                       (20, 40, 5, 1, 2, 12, 1), (48, 16, 3, 1, 1, 7, 0),
                                                       (32, 48, 3, 1, 1, 30, 0), (16, 40, 3, 2, 1, 31, 1),
                                                       (24, 32, 7, 1, 1, 16, 0)])
def test_direct_tiles_same_bits(ci, co, k, stride, dil, hw, o0):
    rng = np.random.default_rng(co + k)
    n, pad = 2, dil * (k // 2)
    x = rng.standard_normal((n, ci, hw, hw)).astype(np.float32)
    wt = (rng.standard_normal((co, ci, k, k)) / np.sqrt(ci * k * k)).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32)
    pr = direct.prepare(wt, b)
    xp = _blocked(np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad))))
    hp = wp_ = hw + 2 * pad
    ho = (hp - dil * (k - 1) - 1) // stride + 1
    ob = -(-co // 16)
    res = rng.standard_normal((n, ob, ho * ho, 16)).astype(np.float32)
    xv = xp.reshape(n, xp.shape[1], hp * wp_, 16)
    outs = []
    # (the AVX-512 strip where this host runs it: rows of 16-30 positions, whole 14-position tiles and the rest)
    # (the AVX2 tiles also with the reduction in slices of one input-channel block: partial sums resumed)
    avx2 = (direct._direct_rows_avx2, lambda *a: direct._direct_rows_avx2_sliced(*a, 1, direct.ALL_LIVE))
    for fn in ((direct._direct_rows_narrow, direct._direct_rows2_wide) + (avx2 if ASM_AVX2 else ())
               + ((lambda *a: direct._direct_rows_512(*a, direct.ALL_LIVE),) if ASM_512 else ())):
        out = np.zeros((n, ob, ho * ho, 16), np.float32)
        for img in range(n):
            for r0, r1 in ((0, 2), (2, ho)):   # two row bands
                fn(out, img, 0, xv, img, 0, pr["weight"], r0, r1, ho, wp_, stride, stride, dil, dil, pr["bias"], res,
                   True, *CLIP, o0, ob)
        outs.append(out)
    assert all(np.array_equal(outs[0], o) for o in outs[1:])
    got = _unblocked(outs[0].reshape(n, ob, ho, ho, 16), co)[:, 16 * o0:]
    ref = _act(_conv_ref(x, wt, b, stride, pad, dil), _unblocked(res.reshape(n, ob, ho, ho, 16), co))[:, 16 * o0:]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cin,co,k,stride,hw,with_res", [(3, 64, 7, 2, 19, False), (1, 40, 3, 1, 10, True),
                                                          (4, 24, 5, 2, 13, False), (3, 48, 7, 2, 63, True),
                                                          (3, 32, 3, 1, 30, False), (3, 16, 4, 4, 29, True)])
def test_stem_tiles_same_bits(cin, co, k, stride, hw, with_res):
    rng = np.random.default_rng(cin * co)
    pad = k // 2
    x = rng.standard_normal((1, cin, hw, hw)).astype(np.float32)
    wt = (rng.standard_normal((co, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32)
    pr = stem.prepare(wt, b)
    wb, bias = pr["stem_weight"], pr["stem_bias"]
    band = np.ascontiguousarray(np.pad(x[0], ((0, 0), (pad, pad), (pad, pad))))
    ho = (hw + 2 * pad - k) // stride + 1
    ob = wb.shape[0]
    res = rng.standard_normal((1, ob, ho * ho, 16)).astype(np.float32) if with_res else EMPTY4
    outs = []
    # (the AVX-512 strip / the AVX2 strip where this host runs them: whole 14- / 6-position tiles of a row and
    # the rest; the AVX2 strip also at stride 4, ConvNeXt's patchify stem)
    fns = [stem._stem_rows_narrow, stem._stem_rows_wide]
    fns += [stem._stem_rows_512] if ASM_512 and stride <= 2 else []
    fns += [stem._stem_rows_avx2] if ASM_AVX2 else []
    for fn in fns:
        out = np.full((1, ob, ho * ho, 16), np.nan, np.float32)
        for r0, r1 in ((0, 3), (3, ho)):
            fn(out, 0, band, 0, wb, r0, r1, ho, stride, stride, 1, 1, bias, res, with_res, *CLIP)
        outs.append(out)
    assert all(np.array_equal(outs[0], o) for o in outs[1:])
    got = _unblocked(outs[0].reshape(1, ob, ho, ho, 16), co)
    want = _act(_conv_ref(x, wt, b, stride, pad, 1),
                _unblocked(res.reshape(1, ob, ho, ho, 16), co) if with_res else None)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("code,alpha", [(1, 0.0), (9, 0.1), (9, -0.3)])
def test_act_span_vectors_keep_apply_span_bits(code, alpha):
    """epilogue.act_span runs ReLU and leaky ReLU as act16 vectors instead of apply_span's loop (masked stores
    on AVX2): the same bits, -0.0, NaN and infinities included, over spans that start and end at any multiple of
    16 inside the array (nothing outside the span written)."""
    from tilefuse.kernels.activations import apply_span
    from tilefuse.kernels.conv.epilogue import act_span
    rng = np.random.default_rng(code)
    x = (rng.standard_normal(16 * 40) * 3).astype(np.float32)
    x[5:11] = [np.nan, -0.0, 0.0, np.inf, -np.inf, -1e-38]
    a, b = np.float32(alpha), np.float32(0.0)
    for lo, hi in ((0, x.size), (16, 16 * 7), (32, 48)):
        got, want = x.copy(), x.copy()
        act_span(got, lo, hi, code, a, b)
        apply_span(want, lo, hi, code, a, b)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        np.testing.assert_array_equal(got[:lo].view(np.uint32), x[:lo].view(np.uint32))


@pytest.mark.parametrize("act", [("leaky_relu", 0.1, 0.0), "silu"])
def test_deferred_activation_passes_keep_the_bits(act):
    """The deferred activation passes of the conv kernels (direct._direct_rows2, stem._stem_rows, k1x1._k1x1 on
    strided 1x1s: the tiles store conv + bias, then epilogue.act_span activates each chunk of rows) give the
    bits of the conv without activation followed by the activation: leaky ReLU as numpy's v if v >= 0 else
    alpha * v (act_span runs it as act16 vectors, not apply_span's masked-store loop), SiLU as
    activations.apply_span over the stored output. Maps of several chunks (epilogue.ACT_CHUNK) and a partial
    last one, 1 and 2 threads."""
    from tilefuse.kernels.activations import apply_span
    from tilefuse.kernels.conv.epilogue import resolve_act
    from tilefuse.kernels.conv.layout import to_nchwc

    code, al, be = resolve_act(False, act)

    def want(o):
        if code == 9:
            return np.where(o >= 0, o, al * o).astype(np.float32)
        f = o.copy().reshape(-1)
        apply_span(f, 0, f.size, code, al, be)
        return f.reshape(o.shape)

    rng = np.random.default_rng(11)
    for threads in (1, 2):
        for ci, co, hw, s in ((24, 40, 23, 1), (16, 48, 30, 2), (40, 24, 57, 1)):   # direct 3x3
            x = rng.standard_normal((1, ci, hw, hw)).astype(np.float32)
            pr = direct.prepare((rng.standard_normal((co, ci, 3, 3)) / np.sqrt(9 * ci)).astype(np.float32),
                                rng.standard_normal(co).astype(np.float32))
            xb = to_nchwc(x, (1, 1, 1, 1))
            ho = (hw - 1) // s + 1
            outs = [np.full((1, -(-co // 16), ho, ho, 16), np.nan, np.float32) for _ in range(2)]
            direct.direct_nchwc(outs[0], xb, pr, stride=(s, s), threads=threads)
            direct.direct_nchwc(outs[1], xb, pr, stride=(s, s), act=act, threads=threads)
            assert np.array_equal(want(outs[0]).view(np.uint32), outs[1].view(np.uint32)), ("direct", ci, co, hw, s)
        for co, hw in ((32, 224), (24, 61)):                                        # stem 3x3 / 2
            x = rng.standard_normal((1, 3, hw, hw)).astype(np.float32)
            pr = stem.prepare((rng.standard_normal((co, 3, 3, 3)) / 5).astype(np.float32),
                              rng.standard_normal(co).astype(np.float32))
            ho = (hw - 1) // 2 + 1
            outs = [np.full((1, -(-co // 16), ho, ho, 16), np.nan, np.float32) for _ in range(2)]
            stem.run_to_nchwc(outs[0], x, pr, stride=(2, 2), padding=(1, 1, 1, 1), threads=threads)
            stem.run_to_nchwc(outs[1], x, pr, stride=(2, 2), padding=(1, 1, 1, 1), act=act, threads=threads)
            assert np.array_equal(want(outs[0]).view(np.uint32), outs[1].view(np.uint32)), ("stem", co, hw)
        for n, ci, co, hw in ((2, 40, 72, 37), (1, 24, 160, 56)):                   # 1x1 stride 2
            xb = _blocked(rng.standard_normal((n, ci, hw, hw)).astype(np.float32))
            pr = k1x1.prepare((rng.standard_normal((co, ci, 1, 1)) / np.sqrt(ci)).astype(np.float32),
                              rng.standard_normal(co).astype(np.float32))
            ho = (hw - 1) // 2 + 1
            outs = [np.full((n, -(-co // 16), ho, ho, 16), np.nan, np.float32) for _ in range(2)]
            k1x1.run_nchwc(outs[0], xb, pr, stride=(2, 2), threads=threads)
            k1x1.run_nchwc(outs[1], xb, pr, stride=(2, 2), act=act, threads=threads)
            assert np.array_equal(want(outs[0]).view(np.uint32), outs[1].view(np.uint32)), ("k1x1", n, ci, co, hw)


@pytest.mark.parametrize("a2,p,cip,op,pa0,pa1,nob", [(16, 13, 48, 3, 0, 3, 5), (36, 7, 32, 2, 1, 2, 2),
                                                    (16, 1, 16, 1, 0, 1, 1), (16, 10, 24, 2, 0, 2, 3)])
def test_winograd_gemm_tiles_same_bits(a2, p, cip, op, pa0, pa1, nob):
    rng = np.random.default_rng(a2 + p + cip)
    V = rng.standard_normal((a2, p, cip)).astype(np.float32)
    U = rng.standard_normal((a2, op, cip, 32)).astype(np.float32)
    outs = []
    for fn in (winograd._wino_gemm_narrow, winograd._wino_gemm_wide) + ((winograd._wino_gemm_avx2,) if ASM_AVX2 else ()):
        M = np.full((a2, p, nob * 16), np.nan, np.float32)
        fn(M, V, U, p, pa0, pa1, nob)
        outs.append(M)
    assert all(np.array_equal(outs[0], o) for o in outs[1:])
    # U (a2, OP, Cip, 32) -> (a2, Cip, OP*32): output block k of the task is column block 2*pa0 + k
    Uf = U.transpose(0, 2, 1, 3).reshape(a2, cip, op * 32)[:, :, 32 * pa0:32 * pa0 + nob * 16]
    np.testing.assert_allclose(outs[0], np.einsum("apc,ack->apk", V, Uf), rtol=1e-4, atol=1e-3)


def test_assembly_chunks_unrolled_beside_the_rolled_loop():
    """tile16 and strip16 run a whole 16-channel chunk unrolled (`_nb.TILE_UNROLL`) and keep the rolled loop
    for a chunk of fewer channels (and strip16 for weight rows not 128 bytes apart): each R-position tile's
    assembly has 16 x 2R FMAs unrolled plus 2R in the loop, and the broadcasts of the unrolled channels step 4
    bytes along the positions. The bits against the numba tiles: the tests above (16-channel and partial
    chunks, 1-6 positions)."""
    from tilefuse.kernels.conv import _nb
    assert _nb.TILE_UNROLL
    for rows in (1, 4, 6):
        for text in (_nb._tile_asm(rows), _nb._tile_asm(rows, True), _nb._strip_asm(rows)):
            assert text.count("vfmadd231ps") == 17 * 2 * rows, (rows, text.count("vfmadd231ps"))
            assert "vbroadcastss 60(%rsi" in text or f"vbroadcastss {64 * (rows - 1) + 60}(%rsi)" in text
            assert "jnz 14b" in text


def test_generated_tiles_are_current():
    """_tiles_gen.py is what tilegen.generate_source() writes (edit the templates, not the output)."""
    import pathlib

    from tilefuse.kernels.conv import tilegen
    path = pathlib.Path(tilegen.__file__).with_name("_tiles_gen.py")
    assert path.read_text() == tilegen.generate_source(), "run: python -m tilefuse.kernels.conv.tilegen"


def test_tilegen_expands_a_template_per_tile_shape():
    from tilefuse.kernels.conv import tilegen
    t = """
    #@ accumulators
    #@ zero
    #@ each x{r} = xf[f{r} + k]
    w = wp[p]  #@B2
    #@B1 fma wp[p, l]
    #@B2 fma w[l] | w[16 + l]
    #@ toacc bias[l] | bias[16 + l]
"""
    one = tilegen.expand(t, 3, 1)
    two = tilegen.expand(t, 2, 2)
    assert "a2 = nb.carray" in one and "b0" not in one and "w = wp[p]" not in one
    assert "x2 = xf[f2 + k]" in one and "a2[l] += x2 * u" in one and "acc[2, l] = a2[l] + u" in one
    assert "acc = nb.carray(stack_f32(48), (3, 16))" in one
    assert "b1[l] += x1 * v" in two and "acc[1, 16 + l] = b1[l] + v" in two and "w = wp[p]" in two
    assert "acc = nb.carray(stack_f32(64), (2, 32))" in two
    with pytest.raises(ValueError, match="unknown directive 'bogus'"):
        tilegen.expand("    #@ bogus", 2, 1)
    with pytest.raises(ValueError, match="fma needs 2 weight expression"):
        tilegen.expand("    #@ fma w[l]", 2, 2)
    with pytest.raises(ValueError, match="1 or 2 blocks"):
        tilegen.expand("", 2, 3)
    st = tilegen.expand("        #@ store of, rf, has_res, acc, 0, offs, s0, o0, nv, nk, dk, code, alpha, beta", 2, 1)
    assert "act_block(borrow(of), borrow(rf), has_res, acc, 0, borrow(offs)," in st
    assert "d_ = np.uint64(o0 + offs[s0 + r_] + k_ * (dk))" in st
    assert "store16(of, d_, acc, (0 + r_) * acc.shape[1] + 16 * k_, rf, d_, has_res, code, alpha, beta)" in st
    with pytest.raises(ValueError, match="store needs the 14 arguments"):
        tilegen.expand("    #@ store of, rf, acc", 2, 1)


def _store_rows_spec(dst, res, has_res, acc, offs, o0, nv, nk, dk, code, alpha, beta):
    """epilogue.store_rows lane by lane in numpy, with numba's max / min (max(v, a) = a if a > v else v)."""
    for r in range(nv):
        for k in range(nk):
            d = o0 + offs[r] + k * dk
            v = acc[r, 16 * k:16 * k + 16].copy()
            if has_res:
                v = v + res[d:d + 16]
            if code >= 1:
                lo = np.float32(0.0) if code == 1 else alpha
                v = np.where(lo > v, lo, v)
            if code == 2:
                v = np.where(beta < v, beta, v)
            dst[d:d + 16] = v


@pytest.mark.parametrize("code", [0, 1, 2, 6])
@pytest.mark.parametrize("has_res", [False, True])
def test_vector_epilogue_keeps_the_scalar_bits(code, has_res):
    """store_rows stores one 16-lane vector per position and block (_nb.store16) and act_block works on
    borrowed views; the bits are those of the lane-by-lane spec, NaN, infinities and -0.0 included,
    the residual added before the activation, and nothing outside the stored rows written."""
    from numba import njit

    from tilefuse.kernels.activations import apply_inplace
    from tilefuse.kernels.conv.epilogue import store_rows

    @njit
    def run(dst, res, has_res, acc, offs, o0, nv, nk, dk, code, alpha, beta):
        store_rows(dst, res, has_res, acc, 0, offs, 0, o0, nv, nk, dk, code, alpha, beta)

    rng = np.random.default_rng(code)
    acc = rng.standard_normal((5, 32)).astype(np.float32) * 4
    acc[0, :6] = [np.nan, -0.0, 0.0, np.inf, -np.inf, 6.0]
    acc[1, 16:20] = [-0.0, np.nan, 0.5, -7.0]
    offs = np.array([0, 64, 96, 160, 224], np.int64)
    dk = 512
    res = rng.standard_normal(1200).astype(np.float32)
    res[3] = -0.0
    res[70] = np.nan
    alpha, beta = np.float32(-0.5), np.float32(0.7)
    if code > 2:   # the other activations compile with fastmath: finite inputs only
        acc[~np.isfinite(acc)] = 1.5
        res[~np.isfinite(res)] = -1.5
    for nv, nk in ((5, 2), (3, 1), (1, 2)):
        got = np.full(1200, 7.5, np.float32)
        want = got.copy()
        run(got, res if has_res else np.zeros(0, np.float32), has_res, acc.copy(), offs, 16, nv, nk, dk, code, alpha,
            beta)   # (act_block works in the register block: acc's rows come back overwritten)
        if code <= 2:
            _store_rows_spec(want, res, has_res, acc, offs, 16, nv, nk, dk, code, alpha, beta)
            np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
        else:   # the act_block path: the same sums through the activation's loop (apply_inplace)
            _store_rows_spec(want, res, has_res, acc, offs, 16, nv, nk, dk, 0, alpha, beta)
            sel = np.flatnonzero(want != np.float32(7.5))
            v = want[sel].copy()
            apply_inplace(v, code, alpha, beta)
            want[sel] = v
            assert np.array_equal(np.isnan(got), np.isnan(want))
            np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("code", [0, 1, 2, 9])
@pytest.mark.parametrize("has_res", [False, True])
def test_in_place_vector_activation_keeps_the_scalar_bits(code, has_res):
    """_nb.act16 (depthwise / grouped rows, in place): dst = act(dst + res) 16 lanes at a time, the bits of the
    lane-by-lane spec (NaN, infinities and -0.0 included), nothing outside the vectors written."""
    from numba import njit

    from tilefuse.kernels.conv._nb import act16

    @njit
    def run(dst, lo, hi, res, has_res, code, alpha, beta):
        for j in range(lo, hi, 16):
            act16(dst, j, res, j, has_res, code, alpha, beta)

    rng = np.random.default_rng(10 + code)
    x = (rng.standard_normal(96) * 4).astype(np.float32)
    x[16:24] = [np.nan, -0.0, 0.0, np.inf, -np.inf, 6.0, -7.0, 0.25]
    res = rng.standard_normal(96).astype(np.float32)
    res[20:23] = [-0.0, np.nan, 3.0]
    alpha, beta = np.float32(-0.5), np.float32(0.7)
    got = x.copy()
    run(got, 16, 80, res if has_res else np.zeros(0, np.float32), has_res, code, alpha, beta)
    want = x.copy()
    acc = np.zeros((4, 16), np.float32)
    acc[:] = x[16:80].reshape(4, 16)
    if code == 9:   # leaky ReLU: v if v >= 0 else alpha * v (a NaN stays NaN)
        v = want[16:80] + res[16:80] if has_res else want[16:80].copy()   # (+ 0 would turn -0.0 into 0.0)
        want[16:80] = np.where(v >= 0, v, alpha * v)
    else:
        _store_rows_spec(want, res, has_res, acc, np.array([0, 16, 32, 48], np.int64), 16, 4, 1, 0, code, alpha,
                         beta)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


def test_in_place_relu_is_not_a_masked_store():
    """An in-place ReLU loop (`if v < 0: x[i] = 0`, what numba's max(v, 0) stored back becomes) is vectorized
    by LLVM into masked stores: vmaskmovps on AVX2, microcoded on AMD Zen (depthwise rows with ReLU ran
    1.6-2.2x slower). The rows' epilogue runs act16 instead, whose loop keeps plain vector stores."""
    from numba import njit

    from tilefuse.kernels.conv._nb import act16

    @njit
    def relu_vectors(dst, n):
        for j in range(0, n, 16):
            act16(dst, j, dst, j, False, 1, np.float32(0.0), np.float32(0.0))

    @njit
    def relu_scalar(dst, n):   # activations._apply_loop's form
        g = dst[0:n]
        for i in range(g.size):
            g[i] = max(g[i], np.float32(0.0))

    def stores(f):
        f(np.zeros(64, np.float32), 64)
        asm = f.inspect_asm(f.signatures[0])
        return [ln.strip() for ln in asm.splitlines() if ln.strip().startswith(("vmov", "vmaskmov"))
                and ln.strip().endswith(")")]   # AT&T syntax: a memory destination comes last

    masked = lambda lines: [ln for ln in lines if "vmaskmov" in ln or "{%k" in ln]  # noqa: E731
    got = stores(relu_vectors)
    assert got and not masked(got), got
    if NARROW and not masked(stores(relu_scalar)):
        pytest.skip("this host's LLVM does not fold the scalar in-place ReLU into masked stores")
