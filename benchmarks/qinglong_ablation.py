"""QingLong ablation (seed 002, Table 3 and Figure 12): baseline vs ql1 vs ql2 vs ql3.

    python benchmarks/qinglong_ablation.py                 # 100 inputs, everything
    python benchmarks/qinglong_ablation.py --inputs 20 --only Conv1 FC1 AlexNet

Time per mode = compile + every constant copy + every input's copy-in, compute, copy-out.
Single-layer cases run each mode --repeat times, interleaved, and report the best run (their
times are short and page-fault noise moves them); networks run once.
Speedups are over `baseline` (compile and copy constants for every input, like DLPlib);
the group averages are arithmetic means of the per-case speedups, as the paper reports them.
The paper's figures (Cambricon-X simulator, 100 inputs): ql3 over DLPlib 4.75x on single
layers, 68.4x on networks, 17.48x overall.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import tilefuse  # noqa: E402
from tilefuse import models  # noqa: E402
from tilefuse.ablation import MODES, run_mode  # noqa: E402
from tilefuse.compiler.tune import cpu_model  # noqa: E402


def layer_net(kind: str, seed: int = 0) -> tilefuse.Network:
    """The paper's single-layer test set (Table 3), batch 1."""
    rng = np.random.default_rng(seed)
    net = tilefuse.Network(kind)
    if kind in ("Conv1", "Conv2"):
        co = 384 if kind == "Conv1" else 256
        x = net.input("x", (1, 96, 112, 112))
        w = (rng.standard_normal((co, 96, 3, 3)) * np.sqrt(2 / (96 * 9))).astype(np.float32)
        net.output(net.conv2d(x, w, np.zeros(co, np.float32), stride=1, padding=1))
    elif kind in ("FC1", "FC2"):
        m = 4096 if kind == "FC1" else 1000
        x = net.input("x", (1, 4096))
        net.output(net.linear(x, (rng.standard_normal((m, 4096)) / 64).astype(np.float32),
                              np.zeros(m, np.float32)))
    elif kind in ("Scale1", "Scale2", "BN1", "BN2"):
        c = 96 if kind.endswith("1") else 256
        x = net.input("x", (1, c, 112, 112))
        if kind.startswith("Scale"):
            net.output(net.scale(x, rng.uniform(0.5, 2, c), rng.standard_normal(c)))
        else:
            net.output(net.batch_norm(x, rng.uniform(0.5, 2, c), rng.standard_normal(c),
                                      rng.standard_normal(c), rng.uniform(0.5, 2, c)))
    else:
        raise ValueError(kind)
    return net


LAYERS = ["Conv1", "Conv2", "FC1", "FC2", "Scale1", "Scale2", "BN1", "BN2"]
NETWORKS = ["AlexNet", "VGG16"]


def build(case: str) -> tilefuse.Network:
    if case in LAYERS:
        return layer_net(case)
    return models.get(case.lower(), seed=0, batch=1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, default=100)
    ap.add_argument("--only", nargs="*", default=None, help="cases to run (default: all)")
    ap.add_argument("--modes", nargs="*", default=list(MODES))
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of each mode per single-layer case, interleaved; the best is reported "
                         "(networks run once: VGG16's baseline alone takes minutes)")
    args = ap.parse_args()
    cases = args.only or LAYERS + NETWORKS
    print(f"# QingLong ablation, {args.inputs} inputs per case; machine: {cpu_model()}, "
          f"{os.cpu_count()} cores, tilefuse {tilefuse.__version__}")
    print(f"{'case':<8} " + " ".join(f"{m + ' s':>11}" for m in args.modes) + "  "
          + " ".join(f"{m + ' x':>9}" for m in args.modes if m != "baseline") + "  check")
    speed: dict[str, dict[str, float]] = {}
    for case in cases:
        net = build(case)
        rng = np.random.default_rng(1)
        xs = [rng.standard_normal(net.inputs[0].shape).astype(np.float32) for _ in range(args.inputs)]
        times, outs = {}, {}
        for _ in range(args.repeat if case in LAYERS else 1):
            for m in args.modes:
                r = run_mode(net, xs, m)
                if m not in times or r.seconds < times[m]:
                    times[m] = r.seconds
                outs[m] = r.outputs
        ref = outs[args.modes[0]]
        same = all(np.array_equal(a, b) for m in args.modes for a, b in zip(outs[m], ref))
        speed[case] = {m: times["baseline"] / times[m] for m in args.modes if "baseline" in times}
        print(f"{case:<8} " + " ".join(f"{times[m]:>11.3f}" for m in args.modes) + "  "
              + " ".join(f"{speed[case].get(m, float('nan')):>9.2f}" for m in args.modes if m != "baseline")
              + f"  {'same outputs' if same else 'OUTPUTS DIFFER'}", flush=True)
    if "baseline" in args.modes:
        for label, group in (("layers", LAYERS), ("networks", NETWORKS), ("all", LAYERS + NETWORKS)):
            g = [c for c in cases if c in group]
            if g:
                means = {m: np.mean([speed[c][m] for c in g]) for m in args.modes if m != "baseline"}
                print(f"mean speedup over baseline, {label:<8} ({len(g)} cases): "
                      + ", ".join(f"{m} {v:.2f}x" for m, v in means.items()))
    return 0


if __name__ == "__main__":
    t = time.perf_counter()
    rc = main()
    print(f"# total {time.perf_counter() - t:.1f} s")
    sys.exit(rc)
