"""Run-to-run spread of a whole network, tilefuse and ONNX Runtime alternating run by run (one process).

    PYTHONPATH=. .venv/bin/python benchmarks/phases.py regnet_y_400mf --threads 1 --runs 400
    PYTHONPATH=. .venv/bin/python benchmarks/phases.py convnext_tiny --threads 2 --runs 100 --layers

For a VM whose speed changes between phases (the shared development machine: phases of ~0.3-3 s,
benchmarks/RESULTS.md, 2026-11-29): `--runs` pairs of one tilefuse run then one ORT run, back to back,
the same weights and input as benchmarks/networks.py. Printed per engine: least, quartiles and the median
over the least (how far the typical run is from the machine's best); the correlation of the paired times;
the ratio of the medians and the median of the per-pair ratios; the median of each tenth of the runs in
time order (where the phases show). --layers: tilefuse's per-instruction times
(`Session.compute(timings=)`), the slowest quarter of the runs against the fastest quarter, the ten
instructions that slow down most (whether one kernel or all of them lose in a slow phase).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)


def _stats(name: str, v: np.ndarray) -> str:
    q1, q2, q3 = np.percentile(v, [25, 50, 75])
    return f"{name:<9} least {v.min():8.2f}  p25 {q1:8.2f}  median {q2:8.2f}  p75 {q3:8.2f}  median/least {q2 / v.min():.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--layers", action="store_true", help="tilefuse's instructions, slow quarter vs fast quarter")
    args = ap.parse_args()

    import tilefuse
    from tilefuse import models
    from networks import ort_session, torch_twin   # benchmarks/networks.py: the same twin and export

    net = models.get(args.model, seed=0, batch=args.batch)
    sess = tilefuse.Session(tilefuse.compile(net, threads=args.threads), threads=args.threads)
    x = np.random.default_rng(0).standard_normal(net.inputs[0].shape).astype(np.float32)
    osess = ort_session(torch_twin(args.model, net), x, args.threads)
    sess.run(x)
    ins, outs = sess.alloc_io()
    sess._copy_in([x], (ins, outs))
    for _ in range(5):
        sess.compute(ins, outs)
        osess.run(None, {"x": x})
    tf, ort, lay = [], [], []
    for _ in range(args.runs):
        tm: list | None = [] if args.layers else None
        t = time.perf_counter()
        sess.compute(ins, outs, timings=tm)
        tf.append(time.perf_counter() - t)
        if tm is not None:
            lay.append(tm)
        t = time.perf_counter()
        osess.run(None, {"x": x})
        ort.append(time.perf_counter() - t)
    a, b = np.array(tf) * 1e3, np.array(ort) * 1e3
    print(f"# phases: {args.model} batch {args.batch}, {args.threads} threads, {args.runs} pairs (tilefuse run, then "
          f"ORT run), ms")
    print(_stats("tilefuse", a))
    print(_stats("ORT", b))
    print(f"correlation {np.corrcoef(a, b)[0, 1]:.2f}; ORT / tilefuse: medians {np.median(b) / np.median(a):.3f}, "
          f"least {b.min() / a.min():.3f}, median of the pairs {np.median(b / a):.3f}")
    k = max(1, len(a) // 10)
    print("tilefuse by tenths:", " ".join(f"{np.median(a[i * k:(i + 1) * k]):.2f}" for i in range(len(a) // k)))
    print("ORT by tenths:     ", " ".join(f"{np.median(b[i * k:(i + 1) * k]):.2f}" for i in range(len(b) // k)))
    if lay:
        L = np.array(lay) * 1e6                   # (runs, instructions), us
        fast, slow = a <= np.percentile(a, 25), a >= np.percentile(a, 75)
        f, s = L[fast].mean(0), L[slow].mean(0)
        print(f"instructions (us, mean of the fastest / slowest quarter of runs): kernels {f.sum() / 1e3:.2f} / "
              f"{s.sum() / 1e3:.2f} ms")
        names = [ins.kernel for ins in sess._program]      # one time per instruction, in program order
        for i in np.argsort(-(s - f))[:10]:
            nm = names[i] if i < len(names) else "?"
            print(f"  #{i:<3} {nm:<20} {f[i]:9.1f} {s[i]:9.1f}  x{s[i] / max(f[i], 1e-9):.2f}")
    sess.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
