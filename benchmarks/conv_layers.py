"""Conv layer benchmark (issue 3): the nine ResNet50 layers of seed 000 against PyTorch.

    .venv/bin/python benchmarks/conv_layers.py                     # batch 32 and 1, 1 and 2 threads
    .venv/bin/python benchmarks/conv_layers.py --batch 1 --layers 3x3_56 1x1_56 --repeat 3   # quick

Per layer, batch and thread count: tilefuse time (algorithm from select_algorithm, or
--algorithm), GFLOP/s (P = 2*N*Ho*Wo*K*K*Ci*Co / T, seed 000), fraction of the measured peak,
1->2 core scaling S2 = P2 / (2*P1), and the speed-up over PyTorch NCHW and channels_last
(torch / tilefuse time, > 1 means tilefuse is faster) measured in the same run with
torch.set_num_threads. Peak per thread count = max(numpy sgemm 4096^3, best torch conv
figure of the run, which is oneDNN on this CPU).

Layout (--layout, default nchwc): the form the compiled network runs, blocked NCHW16c input and
output (the layout pass keeps activations blocked between layers; the stem reads NCHW and writes
NCHW16c); --layout nchw times the NCHW entry points (which convert inside every call).
--tuned times every candidate algorithm and reports the fastest, which is what
`tilefuse.compile(net, tune=True)` picks; otherwise the cost model's choice.

BLAS: this machine's environment pins OPENBLAS_CORETYPE=Haswell (AVX2 sgemm, ~half the AVX-512
speed). Run benchmarks with it unset in that command alone:
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/conv_layers.py
(OpenBLAS 0.3.31 then picks SkylakeX by itself). --blas-coretype none|<type> leaves / sets it;
the core type in use is printed in the header.
"""
from __future__ import annotations

import argparse
import os
import sys

LAYERS = {  # name: (Ci, Co, H, k, stride, pad)
    "1x1_56": (256, 64, 56, 1, 1, 0),
    "1x1_28": (512, 128, 28, 1, 1, 0),
    "1x1_14": (1024, 256, 14, 1, 1, 0),
    "1x1_7": (2048, 512, 7, 1, 1, 0),
    "3x3_56": (64, 64, 56, 3, 1, 1),
    "3x3_28": (128, 128, 28, 3, 1, 1),
    "3x3_14": (256, 256, 14, 3, 1, 1),
    "3x3_7": (512, 512, 7, 3, 1, 1),
    "stem_7x7s2": (3, 64, 224, 7, 2, 3),
}


def _args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[32, 1])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--layers", nargs="+", default=list(LAYERS), choices=list(LAYERS))
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per measurement (median)")
    ap.add_argument("--algorithm", default=None, help="force one algorithm (default: select_algorithm)")
    ap.add_argument("--no-winograd", action="store_true")
    ap.add_argument("--blas-coretype", default="none", help="none (keep the environment) | an OPENBLAS_CORETYPE value")
    ap.add_argument("--layout", default="nchwc", choices=["nchwc", "nchw"])
    ap.add_argument("--tuned", action="store_true", help="time every candidate, report the fastest")
    return ap.parse_args()


def main():
    args = _args()
    if "numpy" in sys.modules:
        raise RuntimeError("conv_layers.py must set OPENBLAS_CORETYPE before numpy is imported")
    if args.blas_coretype != "none":
        os.environ["OPENBLAS_CORETYPE"] = args.blas_coretype

    import platform
    import statistics
    import subprocess
    import time

    import numpy as np
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from tilefuse.compiler.layout import conv_layout
    from tilefuse.kernels.conv import (conv2d_prepare, conv2d_run, conv2d_run_nchwc, conv2d_run_to_nchwc,
                                       select_algorithm, to_nchwc)
    from tilefuse.kernels.threads import aligned, blas_info, blas_threads, cpu_count

    def med(fn, repeat):
        fn()  # warm-up (JIT, caches, allocator)
        ts = []
        for _ in range(repeat):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    model = next((ln.split(":", 1)[1].strip() for ln in subprocess.run(["lscpu"], capture_output=True, text=True)
                  .stdout.splitlines() if ln.startswith("Model name")), platform.processor())
    load = os.getloadavg()
    print(f"# machine: {model}, {cpu_count()} cores; OpenBLAS core type {blas_info()}; "
          f"torch {torch.__version__}; load average at start {load[0]:.2f}; layout {args.layout}; "
          f"{'tuned (fastest candidate)' if args.tuned else 'cost-model choice'}")

    # measured peak per thread count
    peak = {}
    a = np.random.default_rng(0).random((4096, 4096), dtype=np.float32)
    c = np.empty_like(a)
    for t in args.threads:
        with blas_threads(t):
            dt = min(med(lambda: np.matmul(a, a, out=c), 1) for _ in range(2))
        peak[t] = {"sgemm": 2 * 4096 ** 3 / dt / 1e9, "onednn": 0.0}
    del a, c

    rows = []
    rng = np.random.default_rng(0)
    for bsz in args.batch:
        for name in args.layers:
            ci, co, h, k, s, p = LAYERS[name]
            x = rng.standard_normal((bsz, ci, h, h), dtype=np.float32)
            w = (rng.standard_normal((co, ci, k, k), dtype=np.float32) / np.sqrt(ci * k * k)).astype(np.float32)
            b = rng.standard_normal(co, dtype=np.float32)
            ho = (h + 2 * p - k) // s + 1
            flops = 2 * bsz * ho * ho * k * k * ci * co
            kw = dict(stride=(s, s), padding=(p, p, p, p), dilation=(1, 1), groups=1)
            if args.algorithm:
                algs = [args.algorithm]
            elif args.tuned:
                from tilefuse.compiler.tune import tune_candidates
                algs = tune_candidates(x.shape, w.shape, dict(stride=(s, s), padding=(p,) * 4, dilation=(1, 1),
                                                              groups=1), not args.no_winograd,
                                       "auto" if args.layout == "nchwc" else "nchw")
            else:
                algs = [select_algorithm(x.shape, w.shape, (s, s), (p,) * 4, (1, 1), 1,
                                         allow_winograd=not args.no_winograd)]
            # 64-byte aligned, as a compiled network's device memory is (numpy's large arrays are 16 bytes off)
            x, xb = aligned(x), aligned(to_nchwc(x))

            def runner(alg, t):
                lay = conv_layout(alg, "auto" if args.layout == "nchwc" else "nchw", ci, co)
                prep = {k_: aligned(v) if isinstance(v, np.ndarray) else v
                        for k_, v in conv2d_prepare(alg, w, b, layout=lay, **kw).items()}
                if lay == "nchwc":
                    ob = aligned(np.empty((bsz, -(-co // 16), ho, ho, 16), np.float32))
                    return lambda: conv2d_run_nchwc(alg, ob, xb, prep, None, relu=True, threads=t, **kw)
                if args.layout == "nchwc" and alg == "im2col":  # the stem: NCHW in, blocked out
                    ob = aligned(np.empty((bsz, -(-co // 16), ho, ho, 16), np.float32))
                    return lambda: conv2d_run_to_nchwc(alg, ob, x, prep, None, relu=True, threads=t, **kw)
                out = aligned(np.empty((bsz, co, ho, ho), np.float32))
                return lambda: conv2d_run(alg, out, x, prep, None, relu=True, threads=t, **kw)

            xt, wt, bt = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b)
            xcl = xt.contiguous(memory_format=torch.channels_last)
            wcl = wt.contiguous(memory_format=torch.channels_last)
            for t in args.threads:
                torch.set_num_threads(t)
                times = {a: med(runner(a, t), args.repeat) for a in algs}
                alg = min(times, key=times.get)
                tf = times[alg]
                with torch.no_grad():
                    fn = lambda xx, ww: torch.relu_(torch.nn.functional.conv2d(xx, ww, bt, s, p))  # noqa: E731
                    tn = med(lambda: fn(xt, wt), args.repeat)
                    tc = med(lambda: fn(xcl, wcl), args.repeat)
                peak[t]["onednn"] = max(peak[t]["onednn"], flops / min(tn, tc) / 1e9)
                rows.append(dict(batch=bsz, layer=name, alg=alg, threads=t, t=tf, gf=flops / tf / 1e9,
                                 torch=tn, torch_cl=tc))
                print(f"  {name:11s} N={bsz:<3d} T={t} {alg:9s} {tf * 1e3:9.2f} ms {flops / tf / 1e9:7.1f} GF/s  "
                      f"torch {tn * 1e3:8.2f} ms  cl {tc * 1e3:8.2f} ms", flush=True)

    pk = {t: max(v.values()) for t, v in peak.items()}
    print()
    print("| threads | numpy sgemm 4096 GFLOP/s | best torch conv (oneDNN) GFLOP/s | peak used |")
    print("|---|---|---|---|")
    for t in args.threads:
        print(f"| {t} | {peak[t]['sgemm']:.1f} | {peak[t]['onednn']:.1f} | {pk[t]:.1f} |")
    print()
    print("| layer | N | algorithm | T | time ms | GFLOP/s | % peak | S2 | vs torch NCHW | vs torch channels_last |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s2 = ""
        if r["threads"] == 2:
            one = next((q for q in rows if q["threads"] == 1 and q["layer"] == r["layer"] and q["batch"] == r["batch"]),
                       None)
            if one:
                s2 = f"{100 * r['gf'] / (2 * one['gf']):.0f}%"
        print(f"| {r['layer']} | {r['batch']} | {r['alg']} | {r['threads']} | {r['t'] * 1e3:.2f} | {r['gf']:.1f} | "
              f"{100 * r['gf'] / pk[r['threads']]:.0f}% | {s2} | {r['torch'] / r['t']:.2f}x | "
              f"{r['torch_cl'] / r['t']:.2f}x |")
    print(f"\n# load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
