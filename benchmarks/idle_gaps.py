"""Latency of a run after an idle gap: tilefuse against ONNX Runtime, the way a server sees requests.

    .venv/bin/python benchmarks/idle_gaps.py --model mobilenet_v2 --threads 2
    .venv/bin/python benchmarks/idle_gaps.py --model mobilenet_v2 --threads 2 --spin 30000 3000000

A service does not run inferences back to back: requests arrive with gaps, and the threads a runtime
parked in the gap have to wake up. Each engine runs in a fresh process of its own (no other engine's
threads in it), warms up with 10 runs, then for each gap in --gaps (seconds) runs --reps times
`sleep(gap); run` and reports the median and 90th percentile. It also reports the CPU time the
process burns in a 0.3 s idle pause right after a run: the price of threads that spin instead of
sleeping. --spin runs tilefuse once per GOMP_SPINCOUNT value (numba's OpenMP workers spin that many
times before they sleep; tilefuse sets threads.GOMP_SPIN_DEFAULT unless the environment sets one).
ONNX Runtime runs with its defaults (intra_op_num_threads = --threads, sequential execution; its
workers spin after a run). Same weights and input as benchmarks/networks.py (the zoo model and its
PyTorch twin exported to ONNX).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _child(model: str, threads: int, engine: str, gaps: list[float], reps: int) -> dict:
    import time

    import numpy as np
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    sys.path.insert(0, os.path.join(HERE, ".."))
    import tilefuse
    from tilefuse import models
    net = models.get(model, seed=0, batch=1)
    x = np.random.default_rng(0).standard_normal(net.inputs[0].shape).astype(np.float32)
    if engine == "ort":
        from networks import ort_session, torch_twin
        s = ort_session(torch_twin(model, net), x, threads)
        run = lambda: s.run(None, {"x": x})   # noqa: E731
    else:
        sess = tilefuse.Session(tilefuse.compile(net, threads=threads), threads=threads)
        run = lambda: sess.run([x])           # noqa: E731
    for _ in range(10):
        run()
    out = {}
    for gap in gaps:
        ts = []
        for _ in range(reps):
            if gap:
                time.sleep(gap)
            t = time.perf_counter()
            run()
            ts.append(time.perf_counter() - t)
        ts.sort()
        out[str(gap)] = (ts[len(ts) // 2], ts[min(len(ts) - 1, (9 * len(ts)) // 10)])
    run()
    c = time.process_time()
    time.sleep(0.3)
    out["burnt"] = time.process_time() - c
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gaps", type=float, nargs="+", default=[0.0, 0.05, 0.2, 1.0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--spin", nargs="*", default=[], help="GOMP_SPINCOUNT values for tilefuse (default: its own)")
    ap.add_argument("--no-ort", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.model, args.threads, args.child, args.gaps, args.reps)))
        return 0

    runs = [("tilefuse", None)] if not args.spin else [("tilefuse", s) for s in args.spin]
    if not args.no_ort:
        runs.append(("ort", None))
    print(f"# idle gaps: {args.model} batch 1, {args.threads} threads, {args.reps} runs per gap "
          f"(median / p90 ms); each engine in its own process")
    head = "engine                      " + "".join(f"  gap {g * 1e3:6.0f} ms   " for g in args.gaps) + "  CPU in 0.3 s idle"
    print(head)
    print("-" * len(head))
    for engine, spin in runs:
        env = dict(os.environ)
        if spin is not None:
            env["GOMP_SPINCOUNT"] = spin
        cmd = [sys.executable, os.path.abspath(__file__), "--model", args.model, "--threads", str(args.threads),
               "--reps", str(args.reps), "--child", "ort" if engine == "ort" else "tilefuse", "--gaps",
               *map(str, args.gaps)]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode:
            print(f"{engine}: failed\n{p.stderr[-2000:]}")
            return 1
        r = json.loads(p.stdout.strip().splitlines()[-1])
        label = engine if engine == "ort" else f"tilefuse (spin {spin or 'default'})"
        cells = "".join(f"  {r[str(g)][0] * 1e3:6.2f} / {r[str(g)][1] * 1e3:6.2f}" for g in args.gaps)
        print(f"{label:28s}{cells}  {r['burnt'] * 1e3:8.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
