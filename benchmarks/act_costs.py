"""What a fused activation costs a conv layer: tilefuse's direct 3x3 and stem kernels against ONNX Runtime.

    PYTHONPATH=. .venv/bin/python benchmarks/act_costs.py --threads 1 [--reps 60] [--acts leaky_relu silu]

Per layer (a direct 3x3 conv on NCHW16c, `direct.direct_nchwc`, and the 3-channel stem, `stem.run_to_nchwc`, the
way a compiled network calls them) and activation: tilefuse's time with the activation fused and its cost over
the same call without one; ONNX Runtime's time for a one-Conv graph and for Conv + the activation's node(s)
(LeakyRelu, Sigmoid * x for SiLU, Gelu at opset 20, HardSwish; ORT fuses what it can into its conv), the same
shapes and weights, NCHW in and out (so ORT's times include its reorders to and from its blocked layout, which
tilefuse's NCHW16c calls do not have: compare the activations' costs, the `+us` columns, more than the totals).
Every variant runs once per round, rounds alternating, `--reps` rounds; the least time per variant (the
development VM's speed drifts by 1.5x between phases, benchmarks/RESULTS.md). A ratio > 1: tilefuse faster.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

# name: (kernel, Ci, Co, H, stride)
LAYERS = {
    "direct 64-64@56": ("direct", 64, 64, 56, 1),
    "direct 128-128@28": ("direct", 128, 128, 28, 1),
    "direct 32-64@112/2": ("direct", 32, 64, 112, 2),
    "stem 3-32@224/2": ("stem", 3, 32, 224, 2),
}
ACTS = {"leaky_relu": ("leaky_relu", 0.1, 0.0), "silu": "silu", "gelu": "gelu", "hardswish": "hardswish"}


def ort_graph(w, b, stride, act, threads):
    """An ORT session: x -> Conv(w, b, 3x3, pad 1, stride) -> the activation's node(s) -> y."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    co, ci = w.shape[:2]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              strides=[stride, stride])]
    if act is None:
        nodes[0].output[0] = "y"
    elif act == "leaky_relu":
        nodes.append(helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.1))
    elif act == "silu":
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    elif act == "gelu":
        nodes.append(helper.make_node("Gelu", ["c"], ["y"]))
    elif act == "hardswish":
        nodes.append(helper.make_node("HardSwish", ["c"], ["y"]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", nargs="+", default=list(LAYERS), choices=list(LAYERS))
    ap.add_argument("--acts", nargs="+", default=list(ACTS), choices=list(ACTS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=60)
    args = ap.parse_args()

    import onnxruntime as ort

    from tilefuse.kernels.conv import direct, stem
    from tilefuse.kernels.conv.layout import to_nchwc
    from tilefuse.kernels.isa import describe

    print(f"# act_costs: {args.threads} threads, {describe()}, onnxruntime {ort.__version__}, least of {args.reps} "
          f"alternating rounds, us")
    hdr = (f"{'layer':<20} {'act':<11} {'tf':>8} {'tf +us':>8} {'ort':>8} {'ort +us':>8} {'vs ort':>7}")
    print(hdr)
    print("-" * len(hdr))
    rng = np.random.default_rng(0)
    acts = [None] + args.acts
    for name in args.layers:
        kind, ci, co, h, s = LAYERS[name]
        x = rng.standard_normal((1, ci, h, h)).astype(np.float32)
        w = (rng.standard_normal((co, ci, 3, 3)) / np.sqrt(9 * ci)).astype(np.float32)
        b = rng.standard_normal(co).astype(np.float32) * np.float32(0.1)
        ho = (h - 1) // s + 1
        out = np.zeros((1, -(-co // 16), ho, ho, 16), np.float32)
        if kind == "direct":
            pr, xb = direct.prepare(w, b), to_nchwc(x, (1, 1, 1, 1))
            calls = [lambda a=a: direct.direct_nchwc(out, xb, pr, stride=(s, s), act=ACTS.get(a),
                                                     threads=args.threads) for a in acts]
        else:
            pr = stem.prepare(w, b)
            calls = [lambda a=a: stem.run_to_nchwc(out, x, pr, stride=(s, s), padding=(1, 1, 1, 1), act=ACTS.get(a),
                                                   threads=args.threads) for a in acts]
        sessions = [ort_graph(w, b, s, a, args.threads) for a in acts]
        calls += [lambda o=o: o.run(None, {"x": x}) for o in sessions]
        for c in calls:
            c()
        best = [np.inf] * len(calls)
        for r in range(args.reps):
            for i in (range(len(calls)) if r % 2 == 0 else reversed(range(len(calls)))):
                t0 = time.perf_counter()
                calls[i]()
                best[i] = min(best[i], time.perf_counter() - t0)
        na = len(acts)
        tf, on = [v * 1e6 for v in best[:na]], [v * 1e6 for v in best[na:]]
        for i, a in enumerate(acts):
            print(f"{name:<20} {a or 'identity':<11} {tf[i]:>8.0f} {tf[i] - tf[0]:>+8.0f} {on[i]:>8.0f} "
                  f"{on[i] - on[0]:>+8.0f} {on[i] / tf[i]:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
