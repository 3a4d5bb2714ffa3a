"""Cache-line alignment of kernel operands (issue 13): the same conv layers with every array (input,
prepared weights, output) on a 64-byte boundary and 16 bytes past one, interleaved in one run.

    PYTHONPATH=. python benchmarks/alignment.py [--threads 1 16] [--rounds 30]

Until 2026-11-27 every tensor and weight of a compiled network sat 16 bytes past a cache line (device
arenas and constant areas came from malloc'd buffers; docs/architecture.md, "Alignment"), which splits
every 64-byte AVX-512 load in two (every second 32-byte AVX2 one). This measures what that cost per
kernel on the machine it runs on: the least time of --rounds calls per variant, the two variants
alternated call by call, and the ratio offset+16 / aligned (> 1: the misaligned run was slower).
The outputs of the two variants are checked bitwise equal (alignment never changes a result).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# name: (C_in, C_out, H, k, stride, pad, algorithm); ResNet50's stem and a layer of each kernel
LAYERS = {
    "stem_7x7s2": (3, 64, 224, 7, 2, 3, "im2col"),
    "1x1_56": (64, 256, 56, 1, 1, 0, "gemm1x1"),
    "1x1_14": (1024, 256, 14, 1, 1, 0, "gemm1x1"),
    "3x3s2_28": (128, 128, 56, 3, 2, 1, "direct"),
    "3x3_14_wino": (256, 256, 14, 3, 1, 1, "winograd4"),
    "dw3x3_14": (576, 576, 14, 3, 1, 1, "depthwise"),
}


def at_offset(a: np.ndarray, off: int) -> np.ndarray:
    """A copy of a whose first byte is `off` bytes past a 64-byte boundary."""
    raw = np.zeros(a.nbytes + 128, np.uint8)
    o = (-raw.ctypes.data % 64) + off
    v = raw[o:o + a.nbytes].view(a.dtype).reshape(a.shape)
    v[...] = a
    return v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--layers", nargs="+", default=list(LAYERS), choices=list(LAYERS))
    args = ap.parse_args()
    from tilefuse.kernels import isa
    from tilefuse.kernels.conv import conv2d_prepare, conv2d_run_nchwc, conv2d_run_to_nchwc, to_nchwc
    inf = isa.info()
    print(f"# alignment: {inf.get('cpu_model')} ({inf.get('llvm_cpu')}), {inf.get('vector_bits')}-bit vectors; "
          f"least of {args.rounds} calls per variant, the variants alternated")
    print(f"{'layer':<13} {'algorithm':<10} {'T':>3} {'aligned ms':>11} {'+16 ms':>9} {'+16 / aligned':>14}")
    rng = np.random.default_rng(0)
    for name in args.layers:
        ci, co, h, k, s, p, alg = LAYERS[name]
        groups = ci if alg == "depthwise" else 1
        x = rng.standard_normal((1, ci, h, h), dtype=np.float32)
        w = (rng.standard_normal((co, ci // groups, k, k), dtype=np.float32) / np.sqrt(ci * k * k)).astype(np.float32)
        b = rng.standard_normal(co, dtype=np.float32)
        ho = (h + 2 * p - k) // s + 1
        kw = dict(stride=(s, s), padding=(p, p, p, p), dilation=(1, 1), groups=groups)
        stem = alg == "im2col"
        prep0 = conv2d_prepare(alg, w, b, **kw) if stem else conv2d_prepare(alg, w, b, layout="nchwc", **kw)
        x0 = x if stem else to_nchwc(x)
        out0 = np.zeros((1, -(-co // 16), ho, ho, 16), np.float32)
        for t in args.threads:
            runs = {}
            for off in (0, 16):
                prep = {kk: at_offset(v, off) if isinstance(v, np.ndarray) else v for kk, v in prep0.items()}
                xx, oo = at_offset(x0, off), at_offset(out0, off)
                run = conv2d_run_to_nchwc if stem else conv2d_run_nchwc
                runs[off] = ((lambda run=run, prep=prep, xx=xx, oo=oo:
                              run(alg, oo, xx, prep, None, relu=True, threads=t, **kw)), oo)
            best = {0: 1e9, 16: 1e9}
            for f, _ in runs.values():
                f()   # compile / warm up
            for _ in range(args.rounds):
                for off, (f, _) in runs.items():
                    t0 = time.perf_counter()
                    f()
                    best[off] = min(best[off], time.perf_counter() - t0)
            if not np.array_equal(runs[0][1].view(np.int32), runs[16][1].view(np.int32)):
                print(f"{name}: outputs differ between the aligned and the offset run", file=sys.stderr)
                return 1
            print(f"{name:<13} {alg:<10} {t:>3} {best[0] * 1e3:>11.3f} {best[16] * 1e3:>9.3f} "
                  f"{best[16] / best[0]:>14.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
