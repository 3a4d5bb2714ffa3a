"""GELU (erf) accuracy against float64, tilefuse against ONNX Runtime and PyTorch, and its cost per value.

    PYTHONPATH=. .venv/bin/python benchmarks/gelu_accuracy.py

Over 420,001 float32 points in [-13, 8]: per range the max absolute and max relative error (relative where the
float64 value x / 2 erfc(-x / sqrt 2) is above 1e-35; 1.0 means an engine returns 0 where the value is not) of
tilefuse's kernel (`activations.apply_span`, code 7), ONNX Runtime's Gelu (opset 20) and torch's F.gelu. Then
tilefuse's forward and derivative loops on one thread, ns a value (least of the runs), 64 Ki values (in L2) and
1 Mi values.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

RANGES = ((-13, -3), (-3, -1), (-1, 0), (0, 8))


def engines(x):
    import onnxruntime as ort
    import torch
    from onnx import TensorProto as TP
    from onnx import helper as h

    import tilefuse.kernels.activations as A
    g = h.make_graph([h.make_node("Gelu", ["x"], ["y"])], "g", [h.make_tensor_value_info("x", TP.FLOAT, [None])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [None])])
    s = ort.InferenceSession(h.make_model(g, opset_imports=[h.make_opsetid("", 20)]).SerializeToString(),
                             providers=["CPUExecutionProvider"])
    y = x.copy()
    A.apply_span(y, 0, y.size, 7, np.float32(0), np.float32(0))
    return {"tilefuse": y, f"ONNX Runtime {ort.__version__}": s.run(None, {"x": x})[0],
            f"PyTorch {torch.__version__}": torch.nn.functional.gelu(torch.from_numpy(x)).numpy()}


def speed():
    import tilefuse.kernels.activations as A
    rng = np.random.default_rng(0)
    big = (rng.standard_normal(1 << 20) * 3).astype(np.float32)
    out = {}
    for name, arr in (("64 Ki", big[:1 << 16].copy()), ("1 Mi", big)):
        reps = 200 if arr.size < 100_000 else 40
        y, g, dy = arr.copy(), np.empty_like(arr), np.ones_like(arr)
        fwd, bwd = [], []
        for _ in range(reps + 1):
            y[:] = arr
            t = time.perf_counter()
            A.apply_span(y, 0, y.size, 7, np.float32(0), np.float32(0))
            fwd.append(time.perf_counter() - t)
            t = time.perf_counter()
            A.grad_span(g, dy, arr, 7, np.float32(0), np.float32(0))
            bwd.append(time.perf_counter() - t)
        out[name] = (min(fwd[1:]) / arr.size * 1e9, min(bwd[1:]) / arr.size * 1e9)
    return out


def main() -> int:
    from scipy.special import erfc
    x = np.linspace(-13, 8, 420_001).astype(np.float32)
    d = x.astype(np.float64)
    want = 0.5 * d * erfc(-d / np.sqrt(2))
    print("| engine | " + " | ".join(f"[{lo}, {hi}) abs / rel" for lo, hi in RANGES) + " |")
    print("|---" * (len(RANGES) + 1) + "|")
    for name, y in engines(x).items():
        err = np.abs(y.astype(np.float64) - want)
        cells = []
        for lo, hi in RANGES:
            m = (d >= lo) & (d < hi) & (np.abs(want) > 1e-35)
            cells.append(f"{err[m].max():.1e} / {(err[m] / np.abs(want[m])).max():.1e}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    for name, (f, b) in speed().items():
        print(f"tilefuse GELU, {name} values, one thread: forward {f:.3f} ns a value, derivative {b:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
