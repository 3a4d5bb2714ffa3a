"""Compile the numba kernels of several networks at once, one process per case, into the shared cache.

    python benchmarks/prewarm.py resnet50:1:16 resnet50:32:16 mobilenet_v2:1:2 ...   # model:batch:threads

A fresh machine compiles tilefuse's kernels on first use (~2.5-3 minutes for ResNet50 on the
16-core device machine, one core busy). The benchmarks then pay that inside their first case.
This script starts one process per case, all at the same time: each compiles the network for its
thread count, runs `Session.warmup()` (which compiles, or loads from numba's on-disk cache, every
kernel the plan calls) and exits. The wall time is about that of the slowest case instead of the
sum; later processes load the kernels from the cache. Two processes compiling the same kernel
both write it (numba replaces cache files atomically); at worst an index entry is lost and a
later process compiles that kernel again. Nothing is timed here beyond the compile itself.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
IMAGE_SIZE = {"unet": 512}


def one(case: str) -> None:
    sys.path.insert(0, os.path.join(HERE, ".."))
    import tilefuse
    from tilefuse import models
    name, batch, threads = case.split(":")
    net = models.get(name, seed=0, batch=int(batch), image_size=IMAGE_SIZE.get(name, 224))
    t0 = time.perf_counter()
    sess = tilefuse.Session(tilefuse.compile(net, threads=int(threads)), threads=int(threads))
    jit = sess.warmup()
    sess.release()
    print(f"prewarm {case}: compile+warmup {time.perf_counter() - t0:.1f} s (warmup {jit:.1f} s)", flush=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--one"]:
        one(argv[1])
        return 0
    t0 = time.perf_counter()
    procs = [(c, subprocess.Popen([sys.executable, __file__, "--one", c])) for c in argv]
    bad = 0
    for case, p in procs:
        if p.wait() != 0:
            print(f"prewarm {case}: exit {p.returncode}", flush=True)
            bad += 1
    print(f"prewarm: {len(procs)} cases in {time.perf_counter() - t0:.1f} s, {bad} failed", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
