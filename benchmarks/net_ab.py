"""In-network A/B of kernel settings, layer by layer, in one process.

    PYTHONPATH=. .venv/bin/python benchmarks/net_ab.py mobilenet_v2 --threads 1 --batch 1 \
        "tiles:k1x1.STRIPS=False" "strip:k1x1.STRIPS=True"

Each variant is NAME:STATEMENTS (Python, `;`-separated, run with the conv kernel modules k1x1, direct,
depthwise, winograd and stem and kernels/threads.py as `threads` in scope) that set module-level switches the kernels read at call time.
The network is compiled once; the rounds alternate the variants (order reversed every other round so
neither always runs first; the bound layers' replays (threads.replaying) are off, so every call reads
the switches), each round running `--runs` computes with per-instruction timings
(`Session.compute(timings=)`). Printed: each variant's median wall time and median kernel sum, and every
layer whose median differs by more than 8% from the first variant's (ratio > 1: slower). This machine's
speed drifts by more than most kernel changes between runs minutes apart; within a round the variants
see the same machine, which is what makes the ratios meaningful.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("variants", nargs="+", help="NAME:STATEMENTS")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()

    import tilefuse
    from tilefuse import models
    from tilefuse.kernels.conv import depthwise, direct, k1x1, stem, winograd
    from tilefuse.kernels import threads
    threads.REPLAY = False      # every call takes the full path: the variants' switches are read at call time
    scope = {"threads": threads, "k1x1": k1x1, "direct": direct, "depthwise": depthwise, "winograd": winograd, "stem": stem}
    variants = []
    for v in args.variants:
        name, sep, stmt = v.partition(":")
        if not sep:
            ap.error(f"variant {v!r}: expected NAME:STATEMENTS")
        variants.append((name, compile(stmt, name, "exec")))

    net = models.get(args.model, seed=0, batch=args.batch)
    sess = tilefuse.Session(tilefuse.compile(net, threads=args.threads), threads=args.threads)
    x = np.random.default_rng(0).standard_normal(net.inputs[0].shape).astype(np.float32)
    sess.run([x])                                    # constants on the device, kernels compiled
    ins, outs = sess.alloc_io()
    sess._copy_in([x], (ins, outs))
    for _, code in variants:                         # each variant's kernels compiled before timing
        exec(code, scope)
        sess.compute(ins, outs)
    wall = {n: [] for n, _ in variants}
    per = {n: [] for n, _ in variants}
    for r in range(args.rounds):
        for name, code in (variants if r % 2 == 0 else variants[::-1]):
            exec(code, scope)
            for _ in range(args.runs):
                t = []
                t0 = time.perf_counter()
                sess.compute(ins, outs, timings=t)
                wall[name].append(time.perf_counter() - t0)
                per[name].append(t)
    med = {n: np.median(np.array(t), 0) for n, t in per.items()}
    names = [n for n, _ in variants]
    print(f"# {args.model} batch {args.batch}, {args.threads} threads, {args.rounds} rounds x {args.runs} runs")
    print("wall median:  " + "  ".join(f"{n} {np.median(wall[n]) * 1e3:.2f} ms" for n in names))
    print("kernel sums:  " + "  ".join(f"{n} {med[n].sum() * 1e3:.2f} ms" for n in names))
    base = med[names[0]]
    print(f"layers more than 8% off {names[0]} (time ratios {', '.join(names[1:])}):")
    for i in range(len(base)):
        rel = [med[n][i] / base[i] for n in names[1:]]
        if base[i] > 20e-6 and any(abs(q - 1) > 0.08 for q in rel):
            print(f"  {i:3d} {base[i] * 1e6:9.1f} us  " + " ".join(f"{q:5.2f}" for q in rel))
    return 0


if __name__ == "__main__":
    sys.exit(main())
