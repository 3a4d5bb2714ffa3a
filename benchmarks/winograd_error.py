"""Numerical error of the Winograd kernels against the direct kernel (fp32), for docs/kernels.md.

    .venv/bin/python benchmarks/winograd_error.py

For each layer shape: inputs ~ N(0, 1), weights ~ N(0, 1/(9*Ci)) (He-like scale, outputs ~ N(0, 1)).
Reported against a float64 reference conv: max abs error and max relative error
(max|y - ref| / max|ref|) of direct, winograd2 and winograd4, and the ratio winograd/direct.
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tilefuse.kernels import reference as ref  # noqa: E402
from tilefuse.kernels.conv import conv2d_prepare, conv2d_run  # noqa: E402

SHAPES = [(1, 64, 56), (1, 128, 28), (1, 256, 14), (1, 512, 7), (4, 64, 28)]  # (N, C, H), 3x3 C->C pad 1


def main():
    rng = np.random.default_rng(0)
    kw = dict(stride=(1, 1), padding=(1, 1, 1, 1), dilation=(1, 1), groups=1)
    print("| layer (N, C, HxW) | algorithm | max abs err | max rel err | vs direct (abs) |")
    print("|---|---|---|---|---|")
    for n, c, h in SHAPES:
        x = rng.standard_normal((n, c, h, h), dtype=np.float32)
        w = (rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
        want = ref.conv2d(x.astype(np.float64), w.astype(np.float64), None, (1, 1), (1, 1, 1, 1))
        scale = np.abs(want).max()
        errs = {}
        for alg in ("direct", "winograd2", "winograd4"):
            out = np.empty((n, c, h, h), np.float32)
            conv2d_run(alg, out, x, conv2d_prepare(alg, w, None, **kw), relu=False, **kw)
            errs[alg] = float(np.abs(out - want).max())
            print(f"| ({n}, {c}, {h}x{h}) | {alg} | {errs[alg]:.2e} | {errs[alg] / scale:.2e} | "
                  f"{errs[alg] / errs['direct']:.1f}x |")


if __name__ == "__main__":
    main()
