"""Antialiased resampling against PyTorch: F.interpolate(..., antialias=True) (torchvision's tensor Resize), which
from_torch imports as one matmul by a constant weight matrix per resized axis (frontend/torch_export.py
`_resize_aa`), against PyTorch's separable kernel in the same run, same thread count.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/resize_antialias.py
    .venv/bin/python benchmarks/resize_antialias.py --size 480 640 --out 224 298 --threads 1 2 --reps 15

Prints per case the best and median of --reps calls of each and the ratio PyTorch / tilefuse (best; > 1: tilefuse
faster), and the max difference of the outputs.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def _best(f, reps):
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return min(ts), float(np.median(ts))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, nargs=2, default=(480, 640), help="input H W")
    ap.add_argument("--out", type=int, nargs=2, default=(224, 298), help="output H W")
    ap.add_argument("--modes", nargs="+", default=["bilinear", "bicubic"])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=15)
    a = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F

    import tilefuse

    class Resize(torch.nn.Module):
        def __init__(self, mode):
            super().__init__()
            self.mode = mode

        def forward(self, x):
            return F.interpolate(x, size=tuple(a.out), mode=self.mode, antialias=True)

    x = torch.rand(1, 3, *a.size)
    print(f"1x3x{a.size[0]}x{a.size[1]} -> {a.out[0]}x{a.out[1]}, antialias=True, best / median of {a.reps}")
    for mode in a.modes:
        m = Resize(mode)
        net = tilefuse.from_torch(m, x)
        for t in a.threads:
            torch.set_num_threads(t)
            c = tilefuse.compile(net, threads=t)
            c.run(x.numpy())
            with torch.no_grad():
                tb, tm = _best(lambda: m(x), a.reps)
                err = float(np.abs(c.run(x.numpy()) - m(x).numpy()).max())
            fb, fm = _best(lambda: c.run(x.numpy()), a.reps)
            print(f"  {mode:8s} {t} thread(s): PyTorch {tb * 1e3:7.2f} / {tm * 1e3:7.2f} ms, tilefuse "
                  f"{fb * 1e3:7.2f} / {fm * 1e3:7.2f} ms, ratio {tb / fb:.2f}, max |diff| {err:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
