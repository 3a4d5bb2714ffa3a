"""A kernel computes the same bits whether this process compiled it or loaded it from numba's cache.

numba runs the machine code it compiled in the compiling process and writes that kernel's library to its
on-disk cache; a later process loads it. With fastmath flags (reassociation, FMA contraction) LLVM may pick
another order of a kernel's arithmetic in each optimization context: the Winograd F(4x4) input transform
(fastmath=True) inlined into `winograd._wino_front` ran with one order in the process that compiled it and
another in every process that loaded it from the cache, so ResNet50's output differed in its last bits
between the first process on a machine and the next ones (2026-11-29, Intel Emerald Rapids). The transforms
are generated with `fastmath=False` now. Here a fresh process with an empty cache compiles the kernels, a second
one loads them from that cache, and both write their outputs: they must be equal bit for bit.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

_SCRIPT = r'''
import sys
import numpy as np
from tilefuse.kernels.conv import layout, winograd

out = {}
rng = np.random.default_rng(0)
for m, n, c, hw in ((4, 1, 32, 18), (2, 2, 32, 13)):
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    w = (rng.standard_normal((c, c, 3, 3)) * 0.2).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    r = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    prep = winograd.prepare(w, b, m)
    ob = np.zeros((n, c // 16, hw, hw, 16), np.float32)
    winograd.run_nchwc(ob, layout.to_nchwc(x), prep, layout.to_nchwc(r), m=m, padding=(1, 1, 1, 1), relu=True,
                       threads=1)
    out[f"nchwc{m}"] = ob
    o = np.zeros((n, c, hw, hw), np.float32)
    winograd.run(o, x, prep, r, m=m, padding=(1, 1, 1, 1), relu=True, threads=1)
    out[f"nchw{m}"] = o
from tilefuse.kernels.conv import depthwise, direct, k1x1
x = rng.standard_normal((1, 48, 15, 17)).astype(np.float32)
xb = layout.to_nchwc(x)
w = (rng.standard_normal((40, 48, 3, 3)) * 0.1).astype(np.float32)
o = np.zeros((1, 3, 15, 17, 16), np.float32)
direct.run_nchwc(o, xb, direct.prepare(w, rng.standard_normal(40).astype(np.float32)), padding=(2, 2, 2, 2),
                 dilation=(2, 2), relu=True, threads=2)
out["direct"] = o
w = (rng.standard_normal((40, 48, 1, 1)) * 0.1).astype(np.float32)
o = np.zeros((1, 3, 15, 17, 16), np.float32)
k1x1.run_nchwc(o, xb, k1x1.prepare(w, rng.standard_normal(40).astype(np.float32)), relu=True, threads=2)
out["k1x1"] = o
w = (rng.standard_normal((48, 1, 3, 3)) * 0.3).astype(np.float32)
o = np.zeros((1, 3, 15, 17, 16), np.float32)
depthwise.run_nchwc(o, xb, depthwise.prepare(w, rng.standard_normal(48).astype(np.float32), 48),
                    padding=(1, 1, 1, 1), relu=True, threads=2)
out["depthwise"] = o
np.savez(sys.argv[1], **out)
'''


def test_kernels_compiled_here_and_loaded_from_the_cache_agree(tmp_path):
    """Two processes sharing one empty kernel cache: the first compiles the Winograd kernels (F(2x2) and
    F(4x4), NCHWc and NCHW output, residual and ReLU), the direct conv (dilated, padded), the 1x1 and the
    depthwise conv and caches them, the second loads them. Their outputs are bitwise equal, and the second
    process wrote nothing new (it ran the cached code). With the transforms' old `fastmath=True` the F(4x4)
    outputs differed in their last bits."""
    root = Path(__file__).resolve().parent.parent
    script = tmp_path / "kernels.py"
    script.write_text(_SCRIPT)
    # TILEFUSE_REGIONS=numba: both processes run their task loops on numba's parallel regions whatever the
    # machine's load (with other processes running, `threads.region_plan` may put a loop on the Python pool,
    # which calls the sequential worker: one process would then never compile, nor cache, `depthwise._dw_par`)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(root), TILEFUSE_REGIONS="numba")
    got = []
    for run in ("compiles", "loads"):
        out = tmp_path / f"{run}.npz"
        r = subprocess.run([sys.executable, str(script), str(out)], env=env, capture_output=True, text=True,
                           timeout=900)
        assert r.returncode == 0, r.stderr[-2000:]
        got.append(dict(np.load(out)))
        if run == "compiles":
            cached = {p: p.stat().st_mtime_ns for p in (tmp_path / "cache").rglob("*") if p.is_file()}
            assert any(p.suffix == ".nbc" for p in cached), "the first process cached no kernel"
    now = {p: p.stat().st_mtime_ns for p in (tmp_path / "cache").rglob("*") if p.is_file()}
    assert now == cached, "the second process compiled (and cached) kernels instead of loading them"
    a, b = got
    assert a.keys() == b.keys()
    for k in a:
        bad = np.argwhere(a[k].view(np.uint32) != b[k].view(np.uint32))
        assert bad.size == 0, f"{k}: {len(bad)} values differ, first at {bad[:3].tolist()}"
