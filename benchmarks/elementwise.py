"""Memory-bound kernels (element-wise, row reductions, layout changes): tilefuse's kernels against PyTorch.

    .venv/bin/python benchmarks/elementwise.py --threads 1 2 --reps 30
    PYTHONPATH=. python3 benchmarks/elementwise.py --threads 16        # a bigger machine

Each case calls one tilefuse kernel function (the one a compiled program's instruction runs, on the same thread
pool) and the PyTorch call that computes the same tensor, on the same arrays, with the same thread count: a
same-shape add, add + SiLU, a per-channel multiply in NCHW and in NCHW16c (a squeeze-excitation scale that did
not fuse), where with a scalar operand (Hardshrink-style), softmax over the last axis (attention scores), layer
norm over channels (a token's features), a batched 2-D transpose (k.transpose(-2, -1), (N, C, HW) -> (N, HW, C)),
and the NCHW <-> NCHW16c conversions at a blocked network's ends (PyTorch: the view / permute / contiguous that
gives the same layout). GB/s counts each operand read once and the output written once. Medians of --reps runs
after a warm-up. Ratios > 1: tilefuse faster. These kernels ran 6-11x slower than numpy's ufuncs before the
thirty-fifth session (a kind or code read inside the element loop, or an index numba wraps when negative, kept
the loops scalar): this benchmark is the guard. Needs numpy, numba, torch.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scaling import median_time  # noqa: E402


def _cases(rng):
    """(name, tilefuse call, torch call, bytes moved); the arrays are made here, once."""
    import torch
    import torch.nn.functional as F

    from tilefuse.kernels import broadcast, dense, movement, norm
    from tilefuse.kernels.conv.layout import from_nchwc, to_nchwc

    def arr(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    out = []
    a, b = arr(8, 192, 16, 16), arr(8, 192, 16, 16)
    o = np.empty_like(a)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    out.append(("add 8x192@16x16", lambda th: broadcast.binary("add", o, a, b, threads=th),
                lambda: torch.add(ta, tb), 3 * a.nbytes))
    out.append(("add + silu", lambda th: broadcast.binary("add", o, a, b, act=("silu", 0.0, 0.0), threads=th),
                lambda: F.silu(ta + tb), 3 * a.nbytes))
    x, s = arr(8, 192, 56, 56), arr(8, 192, 1, 1)
    ox = np.empty_like(x)
    tx, ts = torch.from_numpy(x), torch.from_numpy(s)
    out.append(("mul per channel 8x192@56x56", lambda th: broadcast.binary("mul", ox, x, s, threads=th),
                lambda: tx * ts, 2 * x.nbytes))
    xb = to_nchwc(x)
    oxb = np.empty_like(xb)
    txb = torch.from_numpy(xb)
    sb = torch.from_numpy(s.reshape(8, 12, 1, 1, 16))
    out.append(("mul per channel, NCHW16c", lambda th: broadcast.binary("mul", oxb, xb, s, layout="nchwc",
                                                                        channels=192, threads=th),
                lambda: txb * sb, 2 * xb.nbytes))
    half = np.float32([0.5])
    out.append(("where x > 0.5, scalar", lambda th: broadcast.where(o, a, half, a, b, cmp="gt", threads=th),
                lambda: torch.where(ta > 0.5, ta, tb), 3 * a.nbytes))
    sc = arr(8, 4, 256, 256)
    osc = np.empty_like(sc)
    tsc = torch.from_numpy(sc)
    out.append(("softmax 8x4x256 x 256", lambda th: dense.softmax(osc, sc, axis=3, threads=th),
                lambda: torch.softmax(tsc, -1), 2 * sc.nbytes))
    w49 = arr(4096, 49)
    o49 = np.empty_like(w49)
    t49 = torch.from_numpy(w49)
    out.append(("softmax 4096 x 49", lambda th: dense.softmax(o49, w49, axis=1, threads=th),
                lambda: torch.softmax(t49, -1), 2 * w49.nbytes))
    t = arr(8, 256, 192)
    ot = np.empty_like(t)
    g, be = arr(192), arr(192)
    tt, tg, tbe = torch.from_numpy(t), torch.from_numpy(g), torch.from_numpy(be)
    out.append(("layer norm 8x256 x 192", lambda th: norm.layer_norm(ot, t, g, be, axis=-1, threads=th),
                lambda: F.layer_norm(tt, (192,), tg, tbe), 2 * t.nbytes))
    pt = arr(8, 192, 256)
    opt = np.empty((8, 256, 192), np.float32)
    tpt = torch.from_numpy(pt)
    out.append(("permute (8, 192, 256) -> (0, 2, 1)", lambda th: movement.permute(opt, pt, perm=(0, 2, 1), threads=th),
                lambda: tpt.permute(0, 2, 1).contiguous(), 2 * pt.nbytes))
    c = arr(1, 1000, 32, 32)
    cb = np.empty((1, 63, 32, 32, 16), np.float32)
    cpad = torch.from_numpy(np.concatenate([c, np.zeros((1, 8, 32, 32), np.float32)], 1))
    out.append(("to_nchwc 1000@32x32", lambda th: to_nchwc(c, out=cb, threads=th),
                lambda: cpad.view(1, 63, 16, 32, 32).permute(0, 1, 3, 4, 2).contiguous(), 2 * c.nbytes))
    oc = np.empty_like(c)
    tcb = torch.from_numpy(cb)
    out.append(("from_nchwc 1000@32x32", lambda th: from_nchwc(cb, 1000, out=oc, threads=th),
                lambda: tcb.permute(0, 1, 4, 2, 3).reshape(1, 1008, 32, 32)[:, :1000].contiguous(), 2 * c.nbytes))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[2])
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args(argv)
    import torch
    print(f"# elementwise: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, torch "
          f"{torch.__version__}")
    cases = _cases(np.random.default_rng(0))
    for threads in a.threads:
        torch.set_num_threads(threads)
        print(f"\n## {threads} thread(s): median of {a.reps}")
        print(f"{'case':36s} {'tilefuse ms':>11s} {'GB/s':>6s} {'PyTorch ms':>10s} {'PT/tf':>6s}")
        ratios = []
        for name, tf, pt, nbytes in cases:
            t_tf = median_time(lambda: tf(threads), a.reps)
            t_pt = median_time(pt, a.reps)
            ratios.append(t_pt / t_tf)
            print(f"{name:36s} {t_tf * 1e3:11.3f} {nbytes / t_tf / 1e9:6.1f} {t_pt * 1e3:10.3f} {t_pt / t_tf:6.2f}")
        print(f"geometric mean: PyTorch / tilefuse {float(np.exp(np.mean(np.log(ratios)))):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
