"""One Session shared by several threads: throughput against the same calls made one after
another (the peer, same run), and against one context (max_concurrent=1: what a session-wide
lock would give).

    python benchmarks/sessions.py                         # resnet18 at 64x64 and tinynet, 1 kernel thread
    python benchmarks/sessions.py --cases resnet50:1:224 --callers 1 2 4 8 --runs 32 --kernel-threads 1

Each caller thread runs `--runs` inputs through `Session.run`; every result is compared with
the sequential one (bitwise). A ratio > 1 means the shared session beats the sequential loop.
With kernel threads = 1 the parallelism comes only from the callers (numba and BLAS release
the GIL), so the ratio shows how much of the machine concurrent calls can use; with kernel
threads = all cores, one call already uses them and the ratio stays near 1.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tilefuse  # noqa: E402
from tilefuse import models  # noqa: E402


def timed_threads(sess, xs_per_caller):
    out = [None] * len(xs_per_caller)

    def work(i):
        out[i] = [sess.run(x) for x in xs_per_caller[i]]

    ths = [threading.Thread(target=work, args=(i,)) for i in range(len(xs_per_caller))]
    t = time.perf_counter()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    return time.perf_counter() - t, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", nargs="+", default=["tinynet:1:32", "resnet18:1:64"], help="model:batch:size")
    ap.add_argument("--callers", nargs="+", type=int, default=[1, 2, 4])
    ap.add_argument("--runs", type=int, default=24, help="inputs per caller thread")
    ap.add_argument("--kernel-threads", type=int, default=1)
    args = ap.parse_args()
    print(f"cpus {os.cpu_count()}, kernel threads {args.kernel_threads}, {args.runs} runs per caller")
    print(f"{'case':<18} {'callers':>7} {'seq s':>8} {'shared s':>9} {'1-ctx s':>8} {'shared/seq':>10} "
          f"{'shared/1-ctx':>12} {'contexts':>8}")
    for case in args.cases:
        name, batch, size = case.split(":")
        net = models.get(name, seed=0, batch=int(batch), image_size=int(size))
        c = tilefuse.compile(net, threads=args.kernel_threads)
        for k in args.callers:
            rng = np.random.default_rng(k)
            xs = [[rng.standard_normal(net.inputs[0].shape).astype(np.float32) for _ in range(args.runs)]
                  for _ in range(k)]
            shared = tilefuse.Session(c, threads=args.kernel_threads, max_concurrent=max(k, 1))
            one = tilefuse.Session(c, threads=args.kernel_threads, max_concurrent=1)
            shared.warmup()
            one.warmup()
            t = time.perf_counter()
            want = [[shared.run(x) for x in xc] for xc in xs]
            t_seq = time.perf_counter() - t
            t_shared, got = timed_threads(shared, xs)
            t_one, got1 = timed_threads(one, xs)
            for g in (got, got1):
                assert all(np.array_equal(a, b) for gc, wc in zip(g, want) for a, b in zip(gc, wc)), \
                    "a threaded result differs from the sequential one"
            print(f"{case:<18} {k:>7} {t_seq:>8.3f} {t_shared:>9.3f} {t_one:>8.3f} {t_seq / t_shared:>10.2f} "
                  f"{t_one / t_shared:>12.2f} {shared.contexts:>8}")


if __name__ == "__main__":
    main()
