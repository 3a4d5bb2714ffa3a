"""Whole networks: tilefuse vs PyTorch eager, PyTorch channels_last and ONNX Runtime, same run.

    python benchmarks/networks.py                       # the issue's table (takes a while)
    python benchmarks/networks.py --cases resnet50:1 resnet18:16 --reps 3 --threads 2

BLAS: run with the environment's OpenBLAS pins unset in that command alone (OpenBLAS then
uses its SkylakeX AVX-512 kernels; the header prints the one in use):
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/networks.py --threads 2 --tune

--tune compiles with tune=True (per-layer measured algorithm choice, cached in
~/.cache/tilefuse/tune.json or $TILEFUSE_CACHE_DIR) and also times the cost-model compile
("tf model s"). "jit s" is Session.warmup(): the first call, which compiles or loads the numba
kernels (cache=True: a second process loads them from disk).

Each engine gets the same weights (the zoo's seeded ones loaded into the torch module, which
is exported to ONNX for ONNX Runtime), the same input and the same thread count. Times are
the median of --reps runs after one warm-up run. A ratio > 1 means tilefuse is faster.
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

DEFAULT_CASES = ["resnet50:1", "resnet50:8", "resnet50:32", "resnet18:1", "resnet18:16",
                 "alexnet:1", "alexnet:16", "vgg16:1", "vgg16:16"]


def median_time(fn, reps: int) -> float:
    fn()  # warm-up
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="*", default=DEFAULT_CASES, help="model:batch pairs")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--no-ort", action="store_true")
    ap.add_argument("--tune", action="store_true", help="compile with tune=True (and time the cost-model choice too)")
    args = ap.parse_args()

    import onnxruntime as ort
    import torch
    import tilefuse
    import torch_zoo
    from tilefuse.compiler.tune import cpu_model
    from tilefuse import models

    from tilefuse.kernels.threads import blas_info
    torch.set_num_threads(args.threads)
    print(f"# networks: {cpu_model()}, {os.cpu_count()} cores, threads={args.threads}, torch {torch.__version__}, "
          f"onnxruntime {ort.__version__}, reps={args.reps} (median), OpenBLAS core {blas_info()}, "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}, tune={args.tune}, "
          f"load average {os.getloadavg()[0]:.2f}")
    hdr = (f"{'model':<9} {'batch':>5} {'tilefuse s':>10} {'tf model s':>10} {'torch s':>9} {'torch_cl s':>10} "
           f"{'ort s':>8} {'vs torch':>8} {'vs cl':>7} {'vs ort':>7} {'max|diff|':>9} {'jit s':>6}")
    print(hdr)
    print("-" * len(hdr))
    for case in args.cases:
        name, batch = case.split(":")
        batch = int(batch)
        net = models.get(name, seed=0, batch=batch, image_size=args.image_size)
        tm = torch_zoo.load(name, net).eval()
        x = np.random.default_rng(0).standard_normal(net.inputs[0].shape).astype(np.float32)
        xt = torch.from_numpy(x)

        compiled = tilefuse.compile(net, threads=args.threads, tune=args.tune)
        sess = tilefuse.Session(compiled, threads=args.threads)
        first = sess.warmup()
        y_tf = sess.run(x)
        t_tf = median_time(lambda: sess.run(x), args.reps)
        t_model = float("nan")
        if args.tune:
            c_model = tilefuse.compile(net, threads=args.threads)
            s_model = tilefuse.Session(c_model, threads=args.threads)
            s_model.warmup()
            t_model = median_time(lambda: s_model.run(x), args.reps)
            s_model.release()

        with torch.no_grad():
            y_t = tm(xt).numpy()
            t_torch = median_time(lambda: tm(xt), args.reps)
            tm_cl = tm.to(memory_format=torch.channels_last)
            x_cl = xt.to(memory_format=torch.channels_last)
            t_cl = median_time(lambda: tm_cl(x_cl), args.reps)
            tm = tm.to(memory_format=torch.contiguous_format)

        t_ort = float("nan")
        if not args.no_ort:
            f = io.BytesIO()
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(tm, (torch.from_numpy(x.copy()),), f, dynamo=False, input_names=["x"], output_names=["y"])
            so = ort.SessionOptions()
            so.intra_op_num_threads = args.threads
            so.inter_op_num_threads = 1
            osess = ort.InferenceSession(f.getvalue(), so, providers=["CPUExecutionProvider"])
            t_ort = median_time(lambda: osess.run(None, {"x": x}), args.reps)

        diff = float(np.max(np.abs(y_tf - y_t)))
        print(f"{name:<9} {batch:>5} {t_tf:>10.4f} {t_model:>10.4f} {t_torch:>9.4f} {t_cl:>10.4f} {t_ort:>8.4f} "
              f"{t_torch / t_tf:>8.2f} {t_cl / t_tf:>7.2f} {t_ort / t_tf:>7.2f} {diff:>9.2e} {first:>6.2f}"
              f"   (compile {compiled.compile_seconds:.2f} s, load {os.getloadavg()[0]:.2f})", flush=True)
        sess.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
