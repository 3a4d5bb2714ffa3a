"""Seed 000's Fig. 8 on this CPU: conv efficiency and scaling at 1, 2, 4, 8, 16 threads, with ONNX
Runtime at the same thread count in the same run.

    PYTHONPATH=. python3 benchmarks/scaling.py                          # all, threads 1 2 4 .. cores
    PYTHONPATH=. python3 benchmarks/scaling.py --threads-list 1,2,4,8,16 --batches 1,32 --reps 3
    PYTHONPATH=. python3 benchmarks/scaling.py --quick                  # batch 1 only, 2 reps
    (add --no-network, --no-layers or --no-ort to leave parts out; taskset -c 0-15 to pin;
     TILEFUSE_WAIT=spin|passive forces how numba's threads wait between layers, see kernels/threads.py)

Needs numpy, numba, onnx and onnxruntime (torch for the ResNet50 export to ONNX). Rows:
  - the nine ResNet50 layers of seed 000's Figs. 7/8: the 7x7/2 stem; the first 1x1 conv of the
    second block of stages 2-5 (256->64 @56, 512->128 @28, 1024->256 @14, 2048->512 @7); the 3x3
    conv of the same blocks (64 @56, 128 @28, 256 @14, 512 @7); bias + ReLU fused, run in the
    form a compiled network runs them (NCHW16c in and out; the stem NCHW in), with the algorithm
    tilefuse's cost model picks, bound once (conv.bind) with the task grid for the thread count;
  - the whole ResNet50 (Session.run: copy in, compute, copy out).
Columns: time (median of --reps after a warm-up), GFLOP/s = 2*N*Ho*Wo*K*K*Ci*Co / time (seed
000's eq. 2: direct-convolution FLOPs, also for Winograd rows, marked *), efficiency against
the measured peak (one core's float32 FMA peak, kernels/isa.measure_peak, times the threads),
scaling S_n = P_n / (n * P_1) (eq. 4), ONNX Runtime's time for the same layer (a Conv+Relu
model on NCHW input: its own layout reorders are inside its time; ours are not, the blocked
layout is kept between layers) or network, and tilefuse's speed-up over it (> 1: faster).
The last table is the dispatch cost per parallel region at each thread count: an empty task
loop through numba's pool (what the conv kernels use) and through the Python thread pool (what
the other kernels use), and the network's time between kernels per instruction
(tilefuse profile's "overhead" row).
"""
from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

# (name, Ci, Co, k, stride, H) at batch N; padding k // 2
LAYERS = [("stem 7x7/2", 3, 64, 7, 2, 224),
          ("1x1 256>64 @56", 256, 64, 1, 1, 56), ("1x1 512>128 @28", 512, 128, 1, 1, 28),
          ("1x1 1024>256 @14", 1024, 256, 1, 1, 14), ("1x1 2048>512 @7", 2048, 512, 1, 1, 7),
          ("3x3 64 @56", 64, 64, 3, 1, 56), ("3x3 128 @28", 128, 128, 3, 1, 28),
          ("3x3 256 @14", 256, 256, 3, 1, 14), ("3x3 512 @7", 512, 512, 3, 1, 7)]


def median_time(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def layer_case(spec, n, rng):
    from tilefuse.kernels import conv
    name, ci, co, k, s, h = spec
    p = k // 2
    x = rng.standard_normal((n, ci, h, h)).astype(np.float32)
    w = (rng.standard_normal((co, ci, k, k)) / np.sqrt(ci * k * k)).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32)
    ho = (h + 2 * p - k) // s + 1
    alg = conv.select_algorithm(x.shape, w.shape, (s, s), (p,) * 4, (1, 1), 1)
    stem = ci <= 4
    from tilefuse.kernels.threads import aligned
    # 64-byte aligned, as a compiled network's device memory is (numpy's large arrays are 16 bytes off)
    prep = {k_: aligned(v) if isinstance(v, np.ndarray) else v
            for k_, v in conv.prepare(alg, w, b, s, p, 1, 1, layout="nchw" if stem else "nchwc").items()}
    xin = aligned(x if stem else conv.to_nchwc(x))
    out = aligned(np.empty(conv.nchwc_shape((n, co, ho, ho)), np.float32))
    flops = 2.0 * n * ho * ho * k * k * ci * co
    return dict(name=name, alg=alg, x=x, w=w, b=b, xin=xin, out=out, prep=prep, s=s, p=p, stem=stem, flops=flops)


def bind_layer(c, threads):
    from tilefuse.kernels import conv
    return conv.bind(c["alg"], c["xin"].shape, c["out"].shape, c["prep"], stride=c["s"], padding=c["p"], dilation=1,
                     act="relu", layout="nchw" if c["stem"] else "nchwc", out_layout="nchwc" if c["stem"] else None,
                     threads=threads)


def ort_conv_session(c, threads):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    co, ci, k, _ = c["w"].shape
    n, _, h, _ = c["x"].shape
    node_c = helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], strides=[c["s"]] * 2,
                              pads=[c["p"]] * 4)
    node_r = helper.make_node("Relu", ["c"], ["y"])
    g = helper.make_graph([node_c, node_r], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                  list(c["x"].shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(c["w"], "w"), numpy_helper.from_array(c["b"], "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = min(model.ir_version, 9)
    return _ort_session(model.SerializeToString(), threads, ort)


def _ort_session(model_bytes, threads, ort):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def resnet50_onnx(net, x):
    import warnings

    import torch
    import torch_zoo
    tm = torch_zoo.load("resnet50", net).eval()
    f = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(tm, (torch.from_numpy(x.copy()),), f, dynamo=False, input_names=["x"], output_names=["y"])
    return f.getvalue()


def dispatch_costs(threads_list, reps=2000):
    """Seconds per empty parallel region at each thread count: numba pool vs Python pool."""
    from numba import njit, prange

    from tilefuse.kernels.conv._nb import atomic_add
    from tilefuse.kernels.threads import numba_region, parallel_for

    @njit(parallel=True, nogil=True)
    def par(nt, tasks):
        counter = np.zeros(1, np.int64)
        for _w in prange(nt):
            while True:
                i = atomic_add(counter, 0, 1)
                if i >= tasks.shape[0]:
                    break
                tasks[i, 1] = tasks[i, 0] + 1

    @njit(nogil=True)
    def seq(counter, tid, tasks):      # one worker (numba_region's contract): tasks from counter[0]
        while True:
            i = atomic_add(counter, 0, 1)
            if i >= tasks.shape[0]:
                break
            tasks[i, 1] = tasks[i, 0] + 1

    out = {}
    for t in threads_list:
        tasks = np.zeros((t, 2), np.int64)
        numba_region(par, seq, t, t, tasks)
        a = time.perf_counter()
        for _ in range(reps):
            numba_region(par, seq, t, t, tasks)
        nb_s = (time.perf_counter() - a) / reps
        r = range(t)
        parallel_for(lambda i: None, r, t)
        a = time.perf_counter()
        for _ in range(reps // 4):
            parallel_for(lambda i: None, r, t)
        out[t] = (nb_s, (time.perf_counter() - a) / (reps // 4))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads-list", default=None, help="comma separated (default: 1, 2, 4, ... up to the cores)")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-layers", action="store_true")
    ap.add_argument("--no-network", action="store_true")
    ap.add_argument("--no-ort", action="store_true")
    ap.add_argument("--quick", action="store_true", help="batch 1 only, 2 reps")
    args = ap.parse_args()
    if args.quick:
        args.batches, args.reps = "1", 2

    import tilefuse
    from tilefuse.kernels import isa
    from tilefuse.kernels.threads import cpu_count, numba_layer, numba_max_threads, wait_policy
    cores = cpu_count()
    tl = ([int(v) for v in args.threads_list.split(",")] if args.threads_list else
          [t for t in (1, 2, 4, 8, 16, 32, 64) if t <= cores])
    tl = [t for t in tl if t <= numba_max_threads()] or [1]
    batches = [int(v) for v in args.batches.split(",")]
    ort = None
    if not args.no_ort:
        import onnxruntime as ort
    peak = isa.measure_peak()
    i = isa.info()
    print(f"# scaling: {i['cpu_model']} ({i['llvm_cpu']}), {cores} cores usable, {i['vector_bits']}-bit vectors, "
          f"measured peak {peak / 1e9:.1f} GFLOP/s per core; numba {numba_layer()} pool, wait {wait_policy()}; "
          f"onnxruntime {ort.__version__ if ort else '-'}; threads {tl}; reps {args.reps} (median); "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    hdr = (f"{'batch':>5} {'layer':<18} {'alg':<10} {'T':>3} {'ms':>9} {'GFLOP/s':>8} {'eff%':>5} {'S_n':>5} "
           f"{'ort ms':>9} {'vs ort':>6} {'tasks':>5}  partitioning")
    rng = np.random.default_rng(0)
    for n in batches:
        print(hdr)
        print("-" * len(hdr))
        rows = []
        if not args.no_layers:
            for spec in LAYERS:
                c = layer_case(spec, n, rng)
                p1 = None
                for t in tl:
                    layer = bind_layer(c, t)
                    sec = median_time(lambda: layer(c["out"], c["xin"], c["prep"], None), args.reps)
                    o = None
                    if ort:
                        sess = ort_conv_session(c, t)
                        o = median_time(lambda: sess.run(None, {"x": c["x"]}), args.reps)
                    d = layer.describe()
                    rows.append((c["name"], c["alg"], t, sec, c["flops"], o, d["tasks"], d["partitioning"]))
                    p1 = _print_row(n, rows[-1], p1, peak, tl[0])
        if not args.no_network:
            net = tilefuse.models.resnet50(seed=0, batch=n)
            x = rng.standard_normal(net.inputs[0].shape).astype(np.float32)
            compiled = tilefuse.compile(net)
            flops = compiled.plan().total_flops
            onnx_bytes = resnet50_onnx(net, x) if ort else None
            p1 = None
            for t in tl:
                sess = tilefuse.Session(compiled, threads=t)
                sess.warmup()
                sec = median_time(lambda: sess.run(x), args.reps)
                sess.release()
                o = None
                if ort:
                    osess = _ort_session(onnx_bytes, t, ort)
                    o = median_time(lambda: osess.run(None, {"x": x}), args.reps)
                p1 = _print_row(n, ("ResNet50", "network", t, sec, flops, o, None, "-"), p1, peak, tl[0])
        print(flush=True)
    print("# * Winograd rows count the direct convolution's FLOPs (seed 000's eq. 2)")
    print(f"{'T':>3} {'numba region us':>16} {'python pool us':>15} {'between kernels us/instr':>25}")
    costs = dispatch_costs(tl)
    net = tilefuse.models.resnet50(seed=0, batch=1)
    compiled = tilefuse.compile(net)
    from tilefuse.profile import profile
    for t in tl:
        pr = profile(compiled, threads=t, repeat=max(3, args.reps), peak_core=peak)
        per = pr.overhead_seconds / len(pr.rows)
        print(f"{t:>3} {costs[t][0] * 1e6:>16.1f} {costs[t][1] * 1e6:>15.1f} {per * 1e6:>25.1f}", flush=True)
    return 0


def _print_row(n, row, p1, peak, t0):
    name, alg, t, sec, flops, o, tasks, part = row
    p = flops / sec
    if t == t0:
        p1 = p / t0
    s_n = p / (t * p1) if p1 else float("nan")
    star = "*" if alg.startswith("winograd") else ""
    ort_s = f"{o * 1e3:>9.3f}" if o else f"{'-':>9}"
    vs = f"{o / sec:>6.2f}" if o else f"{'-':>6}"
    print(f"{n:>5} {name:<18} {alg + star:<10} {t:>3} {sec * 1e3:>9.3f} {p / 1e9:>8.1f} {100 * p / (peak * t):>5.1f} "
          f"{s_n:>5.2f} {ort_s} {vs} {str(tasks if tasks is not None else '-'):>5}  {part}", flush=True)
    return p1


if __name__ == "__main__":
    sys.exit(main())
