"""UNet streamed over a large image vs layer by layer (issue 9): the plan's activation bytes,
the time of both schedules in one process (interleaved runs, medians), and their difference.

    PYTHONPATH=. .venv/bin/python benchmarks/stream_unet.py --size 2160x3840 --base 8 --band 4 --reps 3
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

import tilefuse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1080x1920", help="HxW of the input image")
    ap.add_argument("--base", type=int, default=16, help="UNet base width (the zoo's default is 64)")
    ap.add_argument("--band", type=int, default=4, help="band_rows of the streamed schedule")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    h, w = map(int, a.size.lower().split("x"))
    net = tilefuse.models.unet(seed=0, image_size=(h, w), base=a.base)
    x = np.random.default_rng(0).standard_normal(net.inputs[0].shape).astype(np.float32)
    s = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": a.band}, threads=a.threads)
    lay = tilefuse.compile(net, threads=a.threads)
    p = s.plan().stream
    ss, ls = tilefuse.Session(s, threads=a.threads), tilefuse.Session(lay, threads=a.threads)
    ys, yl = ss.run(x), ls.run(x)                     # first calls: kernels load
    err = float(np.abs(ys - yl).max() / np.abs(yl).max())
    ts, tl = [], []
    for _ in range(a.reps):
        t = time.perf_counter(); ls.run(x); tl.append(time.perf_counter() - t)      # noqa: E702
        t = time.perf_counter(); ss.run(x); ts.append(time.perf_counter() - t)      # noqa: E702
    mib = 2 ** 20
    print(f"# stream_unet: {os.cpu_count()} cpus, threads={a.threads}, load average "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"unet base {a.base} {h}x{w} band {a.band}: streamed ops {len(s.schedule.layers)}, tail "
          f"{len(s.schedule.tail)}; plan {p.streamed_bytes / mib:.1f} MiB (rings {p.ring_bytes / mib:.1f}) vs "
          f"layer by layer {p.layer_by_layer_bytes / mib:.1f} MiB ({p.reduction:.1f}x less)")
    print(f"time layer {np.median(tl):.3f} s, stream {np.median(ts):.3f} s (medians of {a.reps}); "
          f"stream / layer {np.median(ts) / np.median(tl):.2f}; max |stream - layer| / max |layer| {err:.1e}")


if __name__ == "__main__":
    main()
