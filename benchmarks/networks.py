"""Whole networks: tilefuse vs ONNX Runtime, PyTorch eager and PyTorch channels_last, same run.

    python benchmarks/networks.py                                   # every case below (takes a while)
    python benchmarks/networks.py --models mobilenet_v2 --batch 1 32 --threads 2 --reps 7
    python benchmarks/networks.py --cases resnet50:1 unet:1 --reps 5 --threads 2
    PYTHONPATH=. python3 benchmarks/networks.py --suite modern --threads 16     # the lead's 16-core box

Cases are model:batch pairs (--cases), or the product of --models and --batch. The default is
the classic suite (ResNet, AlexNet, VGG) and the issue-9 suite (MobileNetV2, EfficientNet-B0,
RegNetY-400MF, ConvNeXt-Tiny at batch 1 and 32, UNet at 512x512 batch 1); --suite picks one.
Images are 224x224, UNet's 512x512 (--image-size overrides both).

BLAS: run with the environment's OpenBLAS pins unset in that command alone (OpenBLAS then
uses its SkylakeX AVX-512 kernels; the header prints the one in use):
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/networks.py --threads 2 --tune

--tune compiles with tune=True (per-layer measured algorithm choice, cached in
~/.cache/tilefuse/tune.json or $TILEFUSE_CACHE_DIR) and also times the cost-model compile
("tf model s"). "jit s" is Session.warmup(): the first call, which compiles or loads the numba
kernels (cache=True: a second process loads them from disk).

Each engine gets the same weights (the zoo's seeded ones loaded into the torch twin, which
torch's TorchScript exporter writes to ONNX for ONNX Runtime), the same input and the same
thread count: tilefuse Session(threads=N), ONNX Runtime intra_op_num_threads=N with sequential
execution, torch.set_num_threads(N). Timing is interleaved, so load from other processes hits
every engine alike: after one warm-up run each, --reps rounds each time one run of every engine
(the order rotating per round; between engines `quiesce()` waits until the process is idle:
ONNX Runtime's workers spin for tens of ms after a run, and an engine started meanwhile loses a
core to them, benchmarks/quiesce.py); the table gives the median per engine. A ratio
> 1 means tilefuse is faster. "rel err" is max|tilefuse - torch| / max|torch|. The trailing
"vs ort best / paired" are two more ratios to ONNX Runtime from the same rounds: each engine's
fastest round, and the median of the per-round ratios (`round_stats`; on a VM whose speed shifts
between phases of seconds the two medians can come from different phases). The trailing
"regions" count where tilefuse's parallel task loops ran during the timed runs (warm-up included):
on numba's pool at the session's width, narrowed to fewer threads, or on our Python pool
(threads.region_plan: other processes' runnable threads decide), and how many bound calls replayed
their recorded task loops (threads.replaying).
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import time
import warnings

import numpy as np

from quiesce import quiesce  # noqa: E402  (benchmarks/quiesce.py)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

CLASSIC = ["resnet50:1", "resnet50:8", "resnet50:32", "resnet18:1", "resnet18:16",
           "alexnet:1", "alexnet:16", "vgg16:1", "vgg16:16"]
# issue 9: the modern models at batch 1 and 32, UNet at 512x512
MODERN = [f"{m}:{b}" for m in ("mobilenet_v2", "efficientnet_b0", "regnet_y_400mf", "convnext_tiny")
          for b in (1, 32)] + ["unet:1"]
SUITES = {"classic": CLASSIC, "modern": MODERN, "all": CLASSIC + MODERN}
IMAGE_SIZE = {"unet": 512}
PAUSE_S = 0.02


def interleaved(engines: dict, reps: int, inner: int = 1, rounds: dict | None = None) -> dict:
    """Median seconds per engine: one warm-up each, then `reps` rounds of every engine (order rotated
    per round, the process idle before each: quiesce, at least PAUSE_S), each timing `inner` runs back to back and counting their
    mean. inner = 1 (the default) is a single run after the other engines ran: cold caches and
    sleeping worker threads; a larger inner is the steady state of a serving loop. `rounds`, if
    given, receives each engine's per-round seconds (for `round_stats`)."""
    for fn in engines.values():
        fn()
    names = list(engines)
    times = {n: [] for n in names}
    for r in range(reps):
        for n in names[r % len(names):] + names[:r % len(names)]:
            quiesce(PAUSE_S)
            t = time.perf_counter()
            for _ in range(inner):
                engines[n]()
            times[n].append((time.perf_counter() - t) / inner)
    if rounds is not None:
        rounds.update(times)
    return {n: float(np.median(ts)) for n, ts in times.items()}


def round_stats(rounds: dict, a: str, b: str) -> tuple[float, float]:
    """(best, paired) ratios of engine b's time over engine a's from interleaved's per-round times:
    best = min(b) / min(a) (each engine's fastest round), paired = the median over rounds of
    b[r] / a[r] (the two ran within one round, seconds apart). On a VM whose speed drifts between
    phases that last seconds (the shared development machine), the median of each engine can fall in
    different phases; these two compare like with like."""
    ta, tb = np.asarray(rounds[a]), np.asarray(rounds[b])
    return float(tb.min() / ta.min()), float(np.median(tb / ta))


def torch_twin(name: str, net):
    """The torch module of zoo model `name` carrying `net`'s weights (tests/torch_zoo.py for the
    classic models, tests/modern_models.py for the issue-9 ones)."""
    import modern_models
    import torch_zoo
    if name in torch_zoo.BUILDERS:
        return torch_zoo.load(name, net).eval()
    return modern_models.load(name, net).eval()


def ort_session(module, x: np.ndarray, threads: int):
    import onnxruntime as ort
    import torch
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (torch.from_numpy(x.copy()),), f, dynamo=False, input_names=["x"],
                          output_names=["y"], opset_version=17)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(f.getvalue(), so, providers=["CPUExecutionProvider"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="*", help="model:batch pairs")
    ap.add_argument("--models", nargs="*", help="models (with --batch): every model at every batch")
    ap.add_argument("--batch", nargs="*", type=int, default=[1, 32])
    ap.add_argument("--suite", choices=list(SUITES), default="all", help="without --cases/--models")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=5, help="interleaved rounds (median)")
    ap.add_argument("--inner", type=int, default=1, help="runs back to back per engine and round (their mean; "
                    "1: one run after the other engines, >1: the steady state)")
    ap.add_argument("--image-size", type=int, help="default 224, UNet 512")
    ap.add_argument("--no-ort", action="store_true")
    ap.add_argument("--no-cl", action="store_true", help="skip PyTorch channels_last")
    ap.add_argument("--tune", action="store_true", help="compile with tune=True (and time the cost-model choice too)")
    args = ap.parse_args()
    cases = list(args.cases or [])
    cases += [f"{m}:{b}" for m in (args.models or []) for b in args.batch]
    cases = cases or SUITES[args.suite]

    import onnxruntime as ort
    import torch
    import tilefuse
    from tilefuse import models
    from tilefuse.compiler.tune import cpu_model
    from tilefuse.kernels import placement
    from tilefuse.kernels.threads import blas_info, region_counts, region_mode, wait_policy

    torch.set_num_threads(args.threads)
    print(f"# networks: {cpu_model()}, {os.cpu_count()} cores, threads={args.threads}, tilefuse "
          f"{getattr(tilefuse, '__version__', '?')}, torch {torch.__version__}, onnxruntime {ort.__version__}, "
          f"numpy {np.__version__}, reps={args.reps} interleaved (median) x inner={args.inner}, OpenBLAS core {blas_info()}, "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}, numba wait {wait_policy()}, "
          f"workers off the caller's core {'on' if placement.available() else 'off'} (kernels/placement.py), "
          f"regions {region_mode(args.threads)} (now; resampled each second), "
          f"tune={args.tune}, load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    hdr = (f"{'model':<15} {'batch':>5} {'size':>4} {'tilefuse s':>10} {'tf model s':>10} {'ort s':>8} {'torch s':>9} "
           f"{'torch_cl s':>10} {'vs ort':>7} {'vs torch':>8} {'vs cl':>6} {'rel err':>8} {'jit s':>6}")
    print(hdr)
    print("-" * len(hdr))
    for case in cases:
        name, batch = case.split(":")
        batch = int(batch)
        size = args.image_size or IMAGE_SIZE.get(name, 224)
        net = models.get(name, seed=0, batch=batch, image_size=size)
        tm = torch_twin(name, net)
        x = np.random.default_rng(0).standard_normal(net.inputs[0].shape).astype(np.float32)
        xt = torch.from_numpy(x)

        compiled = tilefuse.compile(net, threads=args.threads, tune=args.tune)
        sess = tilefuse.Session(compiled, threads=args.threads)
        first = sess.warmup()
        y_tf = sess.run(x)
        engines = {"tf": lambda: sess.run(x)}
        if args.tune:
            s_model = tilefuse.Session(tilefuse.compile(net, threads=args.threads), threads=args.threads)
            s_model.warmup()
            engines["tf_model"] = lambda: s_model.run(x)
        with torch.no_grad():
            y_t = tm(xt).numpy()
        if not args.no_ort:
            osess = ort_session(tm, x, args.threads)
            engines["ort"] = lambda: osess.run(None, {"x": x})

        def torch_run():
            with torch.no_grad():
                tm(xt)
        engines["torch"] = torch_run
        if not args.no_cl:
            tm_cl = torch_twin(name, net).to(memory_format=torch.channels_last)
            x_cl = xt.contiguous(memory_format=torch.channels_last)

            def torch_cl_run():
                with torch.no_grad():
                    tm_cl(x_cl)
            engines["torch_cl"] = torch_cl_run
        region_counts(reset=True)
        per_round: dict = {}
        t = interleaved(engines, args.reps, args.inner, per_round)
        rc = region_counts()
        nan = float("nan")
        t_tf, t_model, t_ort = t["tf"], t.get("tf_model", nan), t.get("ort", nan)
        t_torch, t_cl = t["torch"], t.get("torch_cl", nan)
        err = float(np.max(np.abs(y_tf - y_t)) / np.max(np.abs(y_t)))
        ort_extra = ""
        if "ort" in per_round:
            best, paired = round_stats(per_round, "tf", "ort")
            ort_extra = f"vs ort best {best:.2f} / paired {paired:.2f}, "
        print(f"{name:<15} {batch:>5} {size:>4} {t_tf:>10.4f} {t_model:>10.4f} {t_ort:>8.4f} {t_torch:>9.4f} "
              f"{t_cl:>10.4f} {t_ort / t_tf:>7.2f} {t_torch / t_tf:>8.2f} {t_cl / t_tf:>6.2f} {err:>8.1e} "
              f"{first:>6.2f}   ({ort_extra}compile {compiled.compile_seconds:.2f} s, load {os.getloadavg()[0]:.2f}, regions "
              f"numba {rc['numba']} / narrowed {rc['narrowed']} / our pool {rc['pool']}, calls replayed "
              f"{rc['replayed']})", flush=True)
        sess.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
