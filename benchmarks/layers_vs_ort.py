"""Layer by layer against ONNX Runtime: where a network's gap to ORT is.

    PYTHONPATH=. python benchmarks/layers_vs_ort.py resnet50 --threads 2 [--batch 1] [--repeat 20] [--top 10] \
        [--stat least|median] [--warm K]

ONNX Runtime runs the zoo model's torch twin (the same weights, exported by torch's TorchScript
exporter, as benchmarks/networks.py does) with its profiler on (`enable_profiling`): each node's
kernel time, the least of --repeat runs (--stat median: the median). tilefuse's per-instruction times
come from timed passes (`Session.compute(timings=)`, as `tilefuse profile`; the least (median) of
--repeat runs too). Both engines run with the same thread count in this process, interleaved: every round
one ORT run and one tilefuse pass, the process idle before each (benchmarks/quiesce.py), the order
alternating, so a drift of the machine's speed hits both.

Convolutions are matched by output shape in execution order: each tilefuse conv with the first unmatched
ORT conv (Conv or FusedConv, which carries the ReLU / Add that tilefuse fuses too) of the same output
shape, since the engines may order independent branches differently. An ORT activation node right after a
conv of its shape (QuickGelu, ORT's fused SiLU; HardSwish, Gelu, ...: `ACTIVATION_OPS`) counts as that
conv's time, as tilefuse runs it in the conv's epilogue. A fused chain of tilefuse's (an inverted
residual block's expansion, depthwise and projection in one call, kernels/conv/chain.py) is one row, its
convs' ORT times summed. The other ops are summed per kind, ORT's convs that no tilefuse conv took among
them ("Conv not paired": the squeeze-excitation FCs tilefuse runs inside squeeze_excitation). A ratio > 1
means tilefuse's layer is faster.
The last block lists the layers with the most time lost to ORT: the ones to work on.
"""
from __future__ import annotations

import argparse
import gc
import io
import json
import os
import sys
import tempfile
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))


def interleaved_times(onnx_bytes: bytes, x: np.ndarray, compiled, threads: int, repeat: int,
                      pause: float = 0.02, stat=np.min, warm: int = 0):
    """Both engines' per-layer times from one loop: each of `repeat` rounds runs ORT once (its profiler
    on) and one timed tilefuse pass (`Session.compute(timings=)`), the process idle before each
    (benchmarks/quiesce.py, at least `pause` seconds: ORT's workers spin for tens of ms after a run), the order
    alternating per round. Both see the same machine phase, which drifts by 1.5x within minutes on the
    shared development VM. Returns ([(node name, op, output shape, least kernel seconds)] in ORT's
    execution order, [least seconds per tilefuse instruction], tilefuse's median "between kernels"). stat:
    np.min (the least of the rounds, the default) or np.median, for both engines. warm > 0: each engine runs
    warm + 1 times back to back after its pause and only the last `warm` runs count (the steady state of a
    serving loop: the first layer after an idle pause pays for waking the threads and cold caches, in both
    engines; MobileNetV2's stem 530 against 320 us)."""
    import onnxruntime as ort
    from quiesce import quiesce

    from tilefuse.profile import _timed_pass
    from tilefuse.runtime import Session
    with tempfile.TemporaryDirectory() as d:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(d, "ort")
        s = ort.InferenceSession(onnx_bytes, so, providers=["CPUExecutionProvider"])
        s.run(None, {"x": x})                                # warm-up (its events are dropped below)
        sess = Session(compiled, threads=threads)
        sess.copy_constants()
        ins, outs = sess.alloc_io()
        sess.device.copy_in(ins[0], x)
        sess.compute(ins, outs)                              # JIT / cache load, first touch
        nins = len(compiled.plan().rows)
        per, between = [], []
        keep = [False]                                       # per ORT run in order: does it count
        for r in range(repeat):
            for which in ((0, 1) if r % 2 == 0 else (1, 0)):
                quiesce(pause)
                for k in range(warm + 1):
                    if which == 0:
                        s.run(None, {"x": x})
                        keep.append(k > 0 or warm == 0)
                    else:
                        acc = [0.0] * nins
                        b = _timed_pass(sess, ins, outs, acc)
                        if k > 0 or warm == 0:
                            between.append(b)
                            per.append(acc)
        sess.free_io((ins, outs))
        chains = sess.chains()
        sess.release()
        with open(s.end_profiling()) as f:
            events = json.load(f)
        del s
        gc.collect()
    times, order = {}, []
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        name = e["name"][: -len("_kernel_time")]
        if name not in times:
            times[name] = []
            shapes = e.get("args", {}).get("output_type_shape") or [{}]
            shape = tuple(next(iter(shapes[0].values()), ()))
            order.append((name, e["args"].get("op_name", "?"), shape))
        times[name].append(e["dur"] * 1e-6)
    # one event per node and run, in run order: keep the runs that count (not the warm-up, not a block's first)
    def kept(v):
        return [t for t, k in zip(v, keep) if k] if len(v) == len(keep) else v[1:]
    ort_rows = [(n, op, shp, float(stat(kept(times[n])))) for n, op, shp in order]
    return ort_rows, stat(np.array(per), axis=0), float(np.median(between)), chains


# ORT ops that apply a conv's activation as a node of their own (QuickGelu: x * sigmoid(alpha x), ORT's fusion of
# SiLU); tilefuse fuses them into the conv's epilogue, so their time is the conv's in the tables below
ACTIVATION_OPS = ("QuickGelu", "Gelu", "FastGelu", "BiasGelu", "HardSwish", "HardSigmoid", "Relu", "Clip", "LeakyRelu",
                  "Sigmoid", "Tanh", "Elu")


def fold_activations(ort_rows: list) -> tuple[list, int]:
    """ort_rows (name, op, shape, seconds) in execution order -> the same with each activation node that runs
    right after a conv of its output shape added to that conv's time and dropped; and how many were folded."""
    out, folded = [], 0
    for row in ort_rows:
        prev = out[-1] if out else None
        if (row[1] in ACTIVATION_OPS and prev is not None and prev[1] in ("Conv", "FusedConv")
                and tuple(prev[2]) == tuple(row[2])):
            out[-1] = (prev[0], prev[1], prev[2], prev[3] + row[3])
            folded += 1
            continue
        out.append(row)
    return out, folded


def same_shape(ort_shape: tuple, tf_shape: tuple) -> bool:
    """ORT's NCHW output shape against tilefuse's (NCHW16c rows carry padded channels: compared as blocks)."""
    if len(ort_shape) != 4:
        return True                       # no shape recorded: nothing to check
    n, c, h, w = ort_shape
    if len(tf_shape) == 5:
        return tf_shape[0] == n and tf_shape[1] == -(-c // 16) and tf_shape[2:4] == (h, w)
    return tf_shape == (n, c, h, w)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--image-size", type=int)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--warm", type=int, default=0, metavar="K",
                    help="each engine runs K + 1 times per round, back to back; the first of each block is dropped "
                         "(steady state; default 0: one run per round, after an idle pause)")
    ap.add_argument("--stat", choices=("least", "median"), default="least",
                    help="each layer's least time of the rounds (its speed) or median (what a run typically sees)")
    args = ap.parse_args()

    import onnxruntime as ort
    import torch

    import tilefuse
    from networks import IMAGE_SIZE, torch_twin
    from tilefuse import models
    from tilefuse.kernels.isa import describe
    from tilefuse.profile import Profile

    torch.set_num_threads(args.threads)
    size = args.image_size or IMAGE_SIZE.get(args.model, 224)
    net = models.get(args.model, seed=0, batch=args.batch, image_size=size)
    x = np.random.default_rng(0).standard_normal(net.inputs[0].shape).astype(np.float32)
    tm = torch_twin(args.model, net)
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(tm, (torch.from_numpy(x.copy()),), f, dynamo=False, input_names=["x"], output_names=["y"],
                          opset_version=17)
    compiled = tilefuse.compile(net, threads=args.threads)
    ort_rows, tf_least, between, chains = interleaved_times(f.getvalue(), x, compiled, args.threads, args.repeat,
                                                            stat=np.min if args.stat == "least" else np.median,
                                                            warm=args.warm)
    prof = Profile(args.model, [{"index": r["index"], "kernel": r["kernel"], "algorithm": r["algorithm"],
                                 "partitioning": r["partitioning"], "tasks": r.get("tasks"),
                                 "output_shape": r["output_shape"], "flops": r["flops"], "seconds": float(t)}
                                for r, t in zip(compiled.plan().rows, tf_least)],
                   total_seconds=float("nan"), threads=args.threads, peak_core=0.0, between_seconds=between)
    print(f"# layers vs ORT: {args.model} batch {args.batch} {size}x{size}, {args.threads} threads, {describe()}, "
          f"onnxruntime {ort.__version__}, {args.stat} of {args.repeat * max(1, args.warm)} runs per layer"
          + (f" ({args.warm} warm runs a round)" if args.warm else ""))
    ort_total = sum(r[3] for r in ort_rows)
    print(f"kernels: tilefuse {prof.kernel_seconds * 1e3:.3f} ms ({len(prof.rows)} instructions; + "
          f"{prof.overhead_seconds * 1e3:.3f} ms between them), ORT {ort_total * 1e3:.3f} ms ({len(ort_rows)} nodes)")

    ops = {r[1] for r in ort_rows}
    ort_rows, folded = fold_activations(ort_rows)
    if folded:
        print(f"({folded} ORT activation nodes ({', '.join(sorted({op for op in ACTIVATION_OPS if op in ops}))}) "
              f"right after a conv of their shape: their time counted as the conv's, as tilefuse fuses them)")
    ortc = [r for r in ort_rows if r[1] in ("Conv", "FusedConv")]
    tfc = [r for r in prof.rows if r["kernel"] == "conv2d"]
    # a fused chain (kernels/conv/chain.py) runs at its first instruction: the chain's convs after the first are
    # matched to their ORT convs as usual, and those ORT times are added to the first one's row
    head_of = {j: i for i, (covers, _) in chains.items() for j in covers[1:]}
    hdr = f"{'#':>3} {'algorithm':<11} {'output':<22} {'MFLOP':>7} {'tf us':>9} {'ort us':>9} {'vs ort':>7}"
    print(hdr)
    print("-" * len(hdr))
    pairs, used, at = [], set(), {}
    for row in tfc:
        # the first unmatched ORT conv with this output shape: the engines may order independent
        # branches differently (ORT ran a bottleneck's 3x3 before its downsample conv on Intel)
        j = next((j for j, (_, _, oshape, _) in enumerate(ortc) if j not in used
                  and same_shape(oshape, tuple(row["output_shape"]))), None)
        if j is None:
            print(f"  tilefuse conv #{row['index']} {tuple(row['output_shape'])}: no ORT conv left with its shape")
            continue
        used.add(j)
        h = head_of.get(row["index"])
        if h is not None and h in at:
            head, ot0 = pairs[at[h]]
            head = dict(head, seconds=head["seconds"] + row["seconds"], flops=head["flops"] + row["flops"],
                        chain=head.get("chain", 1) + 1)
            pairs[at[h]] = (head, ot0 + ortc[j][3])
            continue
        at[row["index"]] = len(pairs)
        pairs.append((dict(row), ortc[j][3]))
    for row, ot in pairs:
        tt = row["seconds"]
        alg = f"chain of {row['chain']}" if "chain" in row else row["algorithm"] or "-"
        row["algorithm"] = alg
        print(f"{row['index']:>3} {alg:<11} {str(tuple(row['output_shape'])):<22} "
              f"{row['flops'] / 1e6:>7.1f} {tt * 1e6:>9.1f} {ot * 1e6:>9.1f} {ot / tt:>7.2f}")
    if len(ortc) != len(tfc) or len(used) != len(tfc):
        print(f"(ORT ran {len(ortc)} convs, tilefuse {len(tfc)}: {len(used)} paired)")
    if head_of:
        print(f"(a 'chain of k' row: the fused chain's k convs, its output shape the first one's; ORT's times of "
              f"those k convs summed)")
    print()
    by = {}
    for row, ot in pairs:
        a = by.setdefault(row["algorithm"] or "-", [0, 0.0, 0.0])
        a[0] += 1
        a[1] += row["seconds"]
        a[2] += ot
    print(f"{'by algorithm':<14} {'layers':>6} {'tf ms':>8} {'ort ms':>8} {'vs ort':>7}")
    for alg, (k, tt, ot) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"{alg:<14} {k:>6} {tt * 1e3:>8.3f} {ot * 1e3:>8.3f} {ot / tt:>7.2f}")
    other_ort, other_tf = {}, {}
    for _, op, _, ot in ort_rows:
        if op not in ("Conv", "FusedConv"):
            other_ort[op] = other_ort.get(op, 0.0) + ot
    # ORT convs no tilefuse conv took (RegNetY's / EfficientNet's squeeze-excitation FCs, which tilefuse runs
    # inside its squeeze_excitation kernel): their time is ORT's side of the other ops
    unpaired = [r for j, r in enumerate(ortc) if j not in used]
    if unpaired:
        other_ort[f"Conv not paired ({len(unpaired)})"] = sum(r[3] for r in unpaired)
    for row in prof.rows:
        if row["kernel"] != "conv2d":
            other_tf[row["kernel"]] = other_tf.get(row["kernel"], 0.0) + row["seconds"]
    print("other ops, tilefuse:", ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in other_tf.items()) or "-")
    print("other ops, ORT:     ", ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in other_ort.items()) or "-")
    print()
    lost = sorted(pairs, key=lambda p: -(p[0]["seconds"] - p[1]))[: args.top]
    print(f"most time lost to ORT (top {len(lost)}):")
    for row, ot in lost:
        print(f"  #{row['index']:<3} {row['algorithm']:<11} {str(tuple(row['output_shape'])):<22} "
              f"{(row['seconds'] - ot) * 1e6:>8.1f} us lost ({row['partitioning']}, {row.get('tasks')} tasks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
