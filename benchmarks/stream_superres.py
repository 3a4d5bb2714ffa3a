"""A super-resolution network streamed over a large frame vs layer by layer, and PyTorch on the same model:
the plan's activation bytes and the times in one process (interleaved runs, medians).

The model is written as Real-ESRGAN's x2 and EDSR's upsampler write theirs: `F.pixel_unshuffle(x, 2)` first, a
residual body of 3x3 convs with leaky ReLU, then conv -> `nn.PixelShuffle(2)` twice (x4 over the unshuffled
map, x2 over the input) and a last 3x3 conv. tilefuse's compiler turns each view -> permute -> view into a
`pixel_shuffle` op, which streams (a row-mapped op), so the whole network runs on bands of rows.

    PYTHONPATH=. .venv/bin/python benchmarks/stream_superres.py --size 540x960 --width 32 --band 4 --reps 3
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import tilefuse


class SuperRes(nn.Module):
    def __init__(self, c: int = 32, blocks: int = 4):
        super().__init__()
        self.conv_first = nn.Conv2d(3 * 4, c, 3, 1, 1)
        self.body = nn.ModuleList(nn.Sequential(nn.Conv2d(c, c, 3, 1, 1), nn.LeakyReLU(0.2, inplace=True),
                                                nn.Conv2d(c, c, 3, 1, 1)) for _ in range(blocks))
        self.up1 = nn.Conv2d(c, 4 * c, 3, 1, 1)
        self.up2 = nn.Conv2d(c, 4 * c, 3, 1, 1)
        self.ps = nn.PixelShuffle(2)
        self.conv_last = nn.Conv2d(c, 3, 3, 1, 1)

    def forward(self, x):
        feat = self.conv_first(F.pixel_unshuffle(x, 2))
        for b in self.body:
            feat = feat + b(feat)
        feat = F.leaky_relu(self.ps(self.up1(feat)), 0.2)
        feat = F.leaky_relu(self.ps(self.up2(feat)), 0.2)
        return self.conv_last(feat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="540x960", help="HxW of the input frame (the output is 2x as high and wide)")
    ap.add_argument("--width", type=int, default=32, help="feature channels")
    ap.add_argument("--band", type=int, default=4, help="band_rows of the streamed schedule")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    h, w = map(int, a.size.lower().split("x"))
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    m = SuperRes(a.width).eval()
    x = torch.randn(1, 3, h, w)
    net = tilefuse.from_torch(m, x)
    xn = x.numpy()
    s = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": a.band}, threads=a.threads)
    p = s.plan().stream
    ss = tilefuse.Session(s, threads=a.threads)
    ys = ss.run(xn)                                   # first calls: kernels load
    lay = tilefuse.compile(net, threads=a.threads)
    ls = tilefuse.Session(lay, threads=a.threads)
    yl = ls.run(xn)
    with torch.no_grad():
        yt = m(x).numpy()
    err = float(np.abs(ys - yl).max() / np.abs(yl).max())
    err_t = float(np.abs(ys - yt).max() / np.abs(yt).max())
    ts, tl, tt = [], [], []
    for _ in range(a.reps):
        t = time.perf_counter(); ls.run(xn); tl.append(time.perf_counter() - t)      # noqa: E702
        t = time.perf_counter(); ss.run(xn); ts.append(time.perf_counter() - t)      # noqa: E702
        with torch.no_grad():
            t = time.perf_counter(); m(x); tt.append(time.perf_counter() - t)        # noqa: E702
    mib = 2 ** 20
    gflop = sum(r["flops"] for r in lay.plan().rows) / 1e9
    print(f"# stream_superres: {os.cpu_count()} cpus, threads={a.threads}, torch {torch.__version__}, load average "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"superres width {a.width} {h}x{w} -> {2 * h}x{2 * w}, {gflop:.1f} GFLOP, band {a.band}: streamed ops "
          f"{len(s.schedule.layers)}, tail {len(s.schedule.tail)}; plan {p.streamed_bytes / mib:.1f} MiB (rings "
          f"{p.ring_bytes / mib:.1f}) vs layer by layer {p.layer_by_layer_bytes / mib:.1f} MiB ({p.reduction:.1f}x "
          f"less)")
    print(f"time layer {np.median(tl):.3f} s, stream {np.median(ts):.3f} s, PyTorch {np.median(tt):.3f} s (medians "
          f"of {a.reps}); stream / layer {np.median(ts) / np.median(tl):.2f}, PyTorch / stream "
          f"{np.median(tt) / np.median(ts):.2f}; max |stream - layer| / max |layer| {err:.1e}, vs PyTorch {err_t:.1e}")


if __name__ == "__main__":
    main()
