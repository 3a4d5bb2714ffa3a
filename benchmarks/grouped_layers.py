"""RegNetY-400MF's grouped 3x3 convs (group width 8, issue 9): the lanes kernel against the dense-tile
grouped path and ONNX Runtime's conv, same run.

    PYTHONPATH=. env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/grouped_layers.py --threads 2
    PYTHONPATH=. .venv/bin/python benchmarks/grouped_layers.py --layers 48@56 440@7 --batch 1 32 --reps 10

Per layer (C channels, groups of 8 in and out, 3x3, padding 1, + bias + ReLU as RegNet fuses it):
  lanes   grouped_lanes.run_nchwc (grouped.prepare's default form for groups of 2 / 4 / 8 channels):
          cg FMAs per tap on lane-permuted inputs;
  tiles   the dense-tile grouped form (grouped.prepare(..., form="tiles"), what ran before): 16x16
          tiles with zero weights between the groups of a block, 2x the FLOPs at group width 8;
  ort     ONNX Runtime's Conv (+Relu, fused by ORT) node time from ORT's own per-node profile (its
          layout reorders at the graph boundary are not counted).
tilefuse runs on NCHW16c input and output (as in the compiled network); the times include the Python
call. The engines run --reps times in alternation, INNER calls back to back each time (threads awake,
as inside a network); medians, and the minima (less hit by other processes on a shared machine).
Ratios > 1 mean the lanes kernel is faster. GFLOP/s counts the grouped conv's real FLOPs (2*N*Ho*Wo*C*8*9).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from quiesce import quiesce  # noqa: E402  (benchmarks/quiesce.py)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from thin_layers import ort_node_ms  # noqa: E402

INNER = 5
PAUSE_S = 0.02
CG = 8

# name: (C, output size, stride) — RegNetY-400MF's grouped 3x3 layers at 224x224 (the first block of a
# stage has stride 2; "/2" marks it)
LAYERS = {
    "48@56/2": (48, 56, 2),
    "48@56": (48, 56, 1),
    "104@28/2": (104, 28, 2),
    "104@28": (104, 28, 1),
    "208@14/2": (208, 14, 2),
    "208@14": (208, 14, 1),
    "440@7/2": (440, 7, 2),
    "440@7": (440, 7, 1),
}
DEFAULT = ["48@56/2", "48@56", "104@28", "208@14", "440@7"]


def ort_session(c, s, w, b, x, threads):
    import tempfile

    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    n, _, h, _ = x.shape
    ho = (h + 2 - 3) // s + 1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              strides=[s, s], group=c // CG),
             helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(nodes, "grouped", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, c, ho, ho])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]), {"x": x}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", nargs="+", default=DEFAULT, choices=list(LAYERS))
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 32])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--no-ort", action="store_true", help="tilefuse's two forms only")
    args = ap.parse_args()

    from tilefuse.kernels.conv import grouped
    from tilefuse.kernels.conv.layout import to_nchwc
    print(f"# RegNetY-400MF grouped 3x3 layers (group width {CG}, + bias + ReLU): threads={args.threads}, "
          f"reps={args.reps} alternating (median), load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    hdr = (f"{'layer':<9} {'batch':>5} {'lanes ms':>9} {'tiles ms':>9} {'ort ms':>8} {'vs tiles':>8} {'vs ort':>7}"
           f" {'GFLOP/s':>8} {'min vs tiles':>12} {'min vs ort':>10}")
    print(hdr)
    print("-" * len(hdr))
    rng = np.random.default_rng(0)
    act = ("relu", 0.0, 0.0)
    for name in args.layers:
        c, ho, s = LAYERS[name]
        h = ho * s
        for n in args.batch:
            w = (rng.standard_normal((c, CG, 3, 3)) / np.sqrt(CG * 9)).astype(np.float32)
            b = rng.standard_normal(c).astype(np.float32)
            x = rng.standard_normal((n, c, h, h)).astype(np.float32)
            xb = to_nchwc(x)
            lanes, tiles = grouped.prepare(w, b, c // CG), grouped.prepare(w, b, c // CG, form="tiles")
            assert grouped.uses_lanes(lanes) and not grouped.uses_lanes(tiles)
            o1 = np.empty((n, -(-c // 16), ho, ho, 16), np.float32)
            o2 = np.empty_like(o1)
            kw = dict(stride=(s, s), padding=(1, 1, 1, 1), act=act, threads=args.threads)

            def run_lanes():
                grouped.run_nchwc(o1, xb, lanes, None, **kw)

            def run_tiles():
                grouped.run_nchwc(o2, xb, tiles, None, **kw)
            engines = [run_lanes, run_tiles]
            sess = None
            if not args.no_ort:
                sess, feeds = ort_session(c, s, w, b, x, args.threads)
                engines.append(lambda: sess.run(None, feeds))
            for f in engines:
                f()
            err = float(np.abs(o1 - o2).max())
            assert err <= 1e-4 * max(1.0, float(np.abs(o2).max())), err
            tt = [[], []]
            for _ in range(args.reps):
                for i, f in enumerate(engines):
                    quiesce(PAUSE_S)
                    t = time.perf_counter()
                    for _ in range(INNER):
                        f()
                    if i < 2:
                        tt[i].append((time.perf_counter() - t) / INNER)
            t_l, t_t = (float(np.median(v)) * 1e3 for v in tt)
            m_l, m_t = (float(np.min(v)) * 1e3 for v in tt)
            t_o, m_o = ort_node_ms(sess) if sess is not None else (float("nan"), float("nan"))
            gf = 2.0 * n * ho * ho * c * CG * 9 / (t_l * 1e-3) / 1e9
            print(f"{name:<9} {n:>5} {t_l:>9.3f} {t_t:>9.3f} {t_o:>8.3f} {t_t / t_l:>8.2f} {t_o / t_l:>7.2f}"
                  f" {gf:>8.1f} {m_t / m_l:>12.2f} {m_o / m_l:>10.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
