"""Attention blocks CNNs carry (matmul of computed tensors, softmax): tilefuse against PyTorch and ONNX Runtime.

    .venv/bin/python benchmarks/attention.py --threads 1 2 --reps 20
    PYTHONPATH=. python3 benchmarks/attention.py --threads 16          # a bigger machine

Each case is one block as model code writes it (the definitions of tests/test_attention.py): the non-local block
(embedded Gaussian, its 1x1 convs, two matmuls over all positions, softmax, and the output conv + BN), timm-style
multi-head self-attention over a feature map's positions (LayerNorm, qkv Linear, q @ k^T, softmax, @ v, proj),
and F.scaled_dot_product_attention between 1x1 convs. PyTorch runs the module; ONNX Runtime runs its
TorchScript export; tilefuse compiles the module (`from_torch`) and runs it in a Session with the same thread
count. GFLOP/s counts the two matmuls' 2 M N K each (the rest is small). Medians of --reps runs after a
warm-up, each framework over all cases before the next starts. Ratios > 1: tilefuse faster. Needs numpy,
numba, torch, onnx, onnxruntime.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scaling import median_time  # noqa: E402

# name, model key of tests/test_attention.py, input shape, channels, matmul FLOPs (2 M N K, both products)
CASES = [
    ("non-local 256@32x32 (inner 128)", "non_local", (1, 256, 32, 32), 256, 2 * 2 * 1024 * 1024 * 128),
    ("non-local 128@28x28 b8 (inner 64)", "non_local", (8, 128, 28, 28), 128, 8 * 2 * 2 * 784 * 784 * 64),
    ("mhsa 192@16x16 b8 (4 heads)", "mhsa", (8, 192, 16, 16), 192, 8 * 2 * 2 * 256 * 256 * 192),
    ("sdpa 96@28x28 (2 heads)", "sdpa", (1, 96, 28, 28), 96, 2 * 2 * 784 * 784 * 96),
]


def _module(key, c):
    import test_attention as T
    if key == "non_local":
        return T.NonLocal(c, c // 2).eval()
    if key == "mhsa":
        return T.MHSA(c, 4).eval()
    return T.SDPAttention(c, 2).eval()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[2])
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args(argv)
    import numpy as np
    import onnxruntime as ort
    import torch
    from onnx_export import export

    import tilefuse
    print(f"# attention: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, torch "
          f"{torch.__version__}, onnxruntime {ort.__version__}")
    rng = np.random.default_rng(0)
    for threads in a.threads:
        torch.set_num_threads(threads)
        rows = []
        for name, key, shape, c, flops in CASES:
            torch.manual_seed(0)
            m = _module(key, c)
            x = rng.standard_normal(shape).astype(np.float32)
            tx = torch.from_numpy(x)
            prog = tilefuse.compile(tilefuse.from_torch(m, tx), threads=threads)
            sess = tilefuse.Session(prog, threads=threads)
            blob = export(m, x, "torchscript")
            so = ort.SessionOptions()
            so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
            osess = ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])
            with torch.no_grad():
                y_pt = m(tx).numpy()
            y_tf, y_ort = sess.run(x), osess.run(None, {"x": x})[0]
            err = max(float(np.abs(y_tf - y_pt).max()), float(np.abs(y_tf - y_ort).max())) / float(np.abs(y_pt).max())
            rows.append((name, flops, err, sess, osess, m, tx, x))
        t_tf = [median_time(lambda r=r: r[3].run(r[7]), a.reps) for r in rows]
        t_ort = [median_time(lambda r=r: r[4].run(None, {"x": r[7]}), a.reps) for r in rows]
        with torch.no_grad():
            t_pt = [median_time(lambda r=r: r[5](r[6]), a.reps) for r in rows]
        print(f"\n## {threads} thread(s): median of {a.reps}")
        print(f"{'case':<36} {'tilefuse ms':>11} {'GFLOP/s':>8} {'PyTorch ms':>10} {'ORT ms':>8} {'PT/tf':>6} "
              f"{'ORT/tf':>6}  max rel err")
        for r, tf, o, p in zip(rows, t_tf, t_ort, t_pt):
            print(f"{r[0]:<36} {tf * 1e3:11.3f} {r[1] / tf / 1e9:8.1f} {p * 1e3:10.3f} {o * 1e3:8.3f} {p / tf:6.2f} "
                  f"{o / tf:6.2f}  {r[2]:.1e}")
        gm = statistics.geometric_mean
        print(f"geometric mean: PyTorch / tilefuse {gm([p / t for p, t in zip(t_pt, t_tf)]):.2f}, "
              f"ONNX Runtime / tilefuse {gm([o / t for o, t in zip(t_ort, t_tf)]):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
