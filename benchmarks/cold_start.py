"""What a run after an idle pause pays, and for what: the CPU waking, the caches, or the engine.

    PYTHONPATH=. .venv/bin/python benchmarks/cold_start.py --model mobilenet_v2 --threads 2 --reps 30

`benchmarks/networks.py` times every engine's run after `quiesce()` (the process idle first), so
a run there starts cold. This script splits that cold start. For tilefuse (`Session.run`) and ONNX
Runtime (the same weights and input as networks.py), in rotated rounds, each run is timed after one
of:

- `cold`: quiesce() only, as networks.py times it;
- `evicted`: quiesce(), then this thread reads a 64 MiB array (the engine's weights and buffers
  leave the caches; the CPUs stay idle but the caller's);
- `cpu warm`: quiesce(), then --threads Python threads run an L1-resident FMA loop for --warm-ms
  (numba, nogil) and end: the CPUs busy for a while, no engine's data touched, no spinning thread
  left over;
- `evicted + cpu warm`: both, in that order;
- `back to back`: the engine's own run just before.

A penalty that `cpu warm` removes is the CPU's (on a VM: the vCPUs waking from halt and ramping up),
one that only `back to back` removes is the engine's data and code in the caches. The last lines give
each engine's cold penalty (cold - back to back) and the share `cpu warm` takes off it. Medians of
--reps rounds; a ratio > 1 means tilefuse is faster.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import numpy as np

from quiesce import quiesce  # noqa: E402  (benchmarks/quiesce.py)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

CONDITIONS = ("cold", "evicted", "cpu warm", "evicted + cpu warm", "back to back")


def make_warmer(threads: int, ms: float):
    """warm(): `threads` threads each spin an L1-resident float32 FMA loop for about `ms` milliseconds, joined."""
    from numba import njit

    @njit(nogil=True, fastmath=True, cache=False)
    def fma(v, reps):
        for _ in range(reps):
            for j in range(v.shape[0]):
                v[j] = v[j] * np.float32(0.9999) + np.float32(0.5)

    bufs = [np.ones(4096, np.float32) for _ in range(threads)]
    fma(bufs[0], 1)
    t = time.perf_counter()
    fma(bufs[0], 200)
    reps = max(1, int(200 * ms * 1e-3 / max(time.perf_counter() - t, 1e-6)))

    def warm() -> None:
        ts = [threading.Thread(target=fma, args=(b, reps)) for b in bufs]
        for th in ts:
            th.start()
        for th in ts:
            th.join()
    return warm


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warm-ms", type=float, default=6.0, help="how long `cpu warm` keeps the CPUs busy")
    args = ap.parse_args()

    import torch

    import tilefuse
    from networks import ort_session, torch_twin
    from tilefuse import models
    from tilefuse.compiler.tune import cpu_model
    torch.set_num_threads(args.threads)
    net = models.get(args.model, seed=0, batch=args.batch, image_size=224)
    x = np.random.default_rng(0).standard_normal(net.inputs[0].shape).astype(np.float32)
    sess = tilefuse.Session(tilefuse.compile(net, threads=args.threads), threads=args.threads)
    sess.warmup()
    osess = ort_session(torch_twin(args.model, net), x, args.threads)
    engines = {"tilefuse": lambda: sess.run(x), "ort": lambda: osess.run(None, {"x": x})}
    for fn in engines.values():
        for _ in range(3):
            fn()
    big = np.ones(64 << 17)                                  # 64 MiB of float64
    warm = make_warmer(args.threads, args.warm_ms)
    before = {"cold": lambda e: None, "evicted": lambda e: big.sum(), "cpu warm": lambda e: warm(),
              "evicted + cpu warm": lambda e: (big.sum(), warm()), "back to back": lambda e: engines[e]()}
    combos = [(e, c) for e in engines for c in CONDITIONS]
    times: dict = {k: [] for k in combos}
    print(f"# cold_start: {cpu_model()}, {os.cpu_count()} cores, {args.model} batch {args.batch}, threads "
          f"{args.threads}, {args.reps} rounds, cpu warm {args.warm_ms:.1f} ms", flush=True)
    for r in range(args.reps):
        for e, c in combos[r % len(combos):] + combos[:r % len(combos)]:
            quiesce(0.02)
            before[c](e)
            t = time.perf_counter()
            engines[e]()
            times[(e, c)].append(time.perf_counter() - t)
    med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    print(f"{'before the run':<20} {'tilefuse ms':>11} {'ort ms':>8} {'vs ort':>7}")
    for c in CONDITIONS:
        print(f"{c:<20} {med[('tilefuse', c)]:>11.2f} {med[('ort', c)]:>8.2f} "
              f"{med[('ort', c)] / med[('tilefuse', c)]:>7.2f}")
    for e in engines:
        pen = med[(e, "cold")] - med[(e, "back to back")]
        cpu = med[(e, "cold")] - med[(e, "cpu warm")]
        print(f"{e}: cold penalty {pen:.2f} ms, {cpu:.2f} of it taken off by {args.warm_ms:.0f} ms of CPU work "
              f"before the run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
