"""Thin 1x1 convs of MobileNetV2 (issue 9), and ConvNeXt-Tiny's GELU expansions: the tilefuse NCHW16c kernel
against ONNX Runtime's conv, same run.

    PYTHONPATH=. env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/thin_layers.py --threads 2
    PYTHONPATH=. .venv/bin/python benchmarks/thin_layers.py --layers 16-96@112 --batch 1 32 --reps 20

Per layer (MobileNetV2's expand / project 1x1 convs, with the network's fused epilogue: ReLU6 after
an expansion, the residual add after a projection inside a repeated block): the time of tilefuse's
kernel as the compiled network runs it (`kernels.conv.bound_conv`-style call of k1x1.run_nchwc on
NCHW16c input and output, the plan for the thread count) and ONNX Runtime's time for the same Conv
node (+Clip / +Add, fused by ORT into its NCHWc conv) taken from ORT's own per-node profile, so
ORT's layout reorders at the graph boundary are not counted. The GELU layers (ConvNeXt-Tiny's
expansions, `--layers 96-384@56 192-768@28 384-1536@14`) give ORT a Conv and an ONNX Gelu node (opset
20) and count both nodes' times. Both engines run --reps times in
alternation, INNER calls back to back each time (threads awake, as inside a network); medians, and the minima (less hit by other processes on a shared machine).
A ratio > 1 means tilefuse is faster. The tilefuse time includes the Python call (run_nchwc).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

from quiesce import quiesce  # noqa: E402  (benchmarks/quiesce.py)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

INNER = 5  # back-to-back calls per timing (a layer inside a network runs with its threads awake)
PAUSE_S = 0.02  # between engines: the other engine's spinning worker threads go idle first (networks.py)

# name: (Ci, Co, H, stride, epilogue) — MobileNetV2's 1x1 layers at 224x224
LAYERS = {
    "32-16@112": (32, 16, 112, 1, "none"),
    "16-96@112": (16, 96, 112, 1, "relu6"),
    "96-24@56": (96, 24, 56, 1, "none"),
    "24-144@56": (24, 144, 56, 1, "relu6"),
    "144-24@56": (144, 24, 56, 1, "residual"),
    "144-32@28": (144, 32, 28, 1, "none"),
    "32-192@28": (32, 192, 28, 1, "relu6"),
    "192-32@28": (192, 32, 28, 1, "residual"),
    "576-96@14": (576, 96, 14, 1, "residual"),
    "960-160@7": (960, 160, 7, 1, "residual"),
    # ConvNeXt-Tiny's expansions (1x1 + GELU) at batch 1
    "96-384@56": (96, 384, 56, 1, "gelu"),
    "192-768@28": (192, 768, 28, 1, "gelu"),
    "384-1536@14": (384, 1536, 14, 1, "gelu"),
}
MOBILENET = [k for k, v in LAYERS.items() if v[4] != "gelu"]


def ort_conv_ms(ci, co, h, epi, w, b, x, res, threads, reps):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    n = x.shape[0]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[1, 1])]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))]
    feeds = {"x": x}
    if epi == "relu6":
        inits += [numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]
        nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["y"]))
    elif epi == "gelu":
        nodes.append(helper.make_node("Gelu", ["c"], ["y"]))
    elif epi == "residual":
        ins.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, list(res.shape)))
        feeds["r"] = res
        nodes.append(helper.make_node("Add", ["c", "r"], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", ["c"], ["y"]))
    g = helper.make_graph(nodes, "thin", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, co, h, h])],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20 if epi == "gelu" else 17)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s, feeds


def ort_node_ms(s, ops=("Conv",)) -> tuple[float, float]:
    """(median, min) kernel time of ORT's conv node (op Conv / NchwcConv / FusedConv), ms; with more
    `ops` (op names containing one of them: "Gelu"), the sum of each kind's median and of its min."""
    path = s.end_profiling()
    ev = json.load(open(path))
    med = low = 0.0
    for op in ops:
        ts = [e["dur"] for e in ev if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
              and op in e.get("args", {}).get("op_name", "")]
        med += float(np.median(ts[2:])) / 1e3
        low += float(np.min(ts[2:])) / 1e3
    return med, low


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", nargs="+", default=MOBILENET, choices=list(LAYERS),
                    help="default: MobileNetV2's layers (the GELU ones by name)")
    ap.add_argument("--batch", nargs="+", type=int, default=[1])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()

    from tilefuse.kernels.conv import k1x1
    from tilefuse.kernels.conv.layout import to_nchwc
    from tilefuse.kernels.conv.planner import plan_k1x1
    print(f"# thin 1x1 layers: threads={args.threads}, reps={args.reps} alternating (median), "
          f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    hdr = (f"{'layer':<11} {'batch':>5} {'epilogue':>9} {'tilefuse ms':>11} {'ort ms':>8} {'vs ort':>7} {'GFLOP/s':>8}"
           f" {'tf min':>8} {'ort min':>8} {'min vs':>7}")
    print(hdr)
    print("-" * len(hdr))
    rng = np.random.default_rng(0)
    for name in args.layers:
        ci, co, h, st, epi = LAYERS[name]
        for n in args.batch:
            w = (rng.standard_normal((co, ci, 1, 1)) / np.sqrt(ci)).astype(np.float32)
            b = rng.standard_normal(co).astype(np.float32)
            x = rng.standard_normal((n, ci, h, h)).astype(np.float32)
            res = rng.standard_normal((n, co, h, h)).astype(np.float32) if epi == "residual" else None
            prep = k1x1.prepare(w, b)
            xb = to_nchwc(x)
            rb = to_nchwc(res) if res is not None else None
            ob = np.empty((n, -(-co // 16), h, h, 16), np.float32)
            act = ("clip", 0.0, 6.0) if epi == "relu6" else "gelu" if epi == "gelu" else None
            plan = plan_k1x1(prep["weight"].shape[1], prep["weight"].shape[0], n * h * h, args.threads)

            def tf():
                k1x1.run_nchwc(ob, xb, prep, rb, act=act, threads=args.threads, plan=plan)
            s, feeds = ort_conv_ms(ci, co, h, epi, w, b, x, res, args.threads, args.reps)
            tf()
            s.run(None, feeds)
            tt = []
            for _ in range(args.reps):
                quiesce(PAUSE_S)
                # one untimed call wakes the parked workers (ORT's first run after the pause is in its per-node
                # profile like the others, diluted over INNER + 1 runs)
                tf()
                t = time.perf_counter()
                for _ in range(INNER):
                    tf()
                tt.append((time.perf_counter() - t) / INNER)
                quiesce(PAUSE_S)
                for _ in range(INNER + 1):
                    s.run(None, feeds)
            t_tf, m_tf = float(np.median(tt)) * 1e3, float(np.min(tt)) * 1e3
            t_ort, m_ort = ort_node_ms(s, ("Conv", "Gelu") if epi == "gelu" else ("Conv",))
            gf = 2.0 * n * h * h * ci * co / (t_tf * 1e-3) / 1e9
            print(f"{name:<11} {n:>5} {epi:>9} {t_tf:>11.3f} {t_ort:>8.3f} {t_ort / t_tf:>7.2f} {gf:>8.1f}"
                  f" {m_tf:>8.3f} {m_ort:>8.3f} {m_ort / m_tf:>7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
