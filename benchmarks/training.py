"""Training-step benchmark (issues 5, 9 and 13): ResNet18/ResNet50 (the zoo networks) and the modern CNNs of
tests/modern_models.py (MODERN, imported with from_torch; UNet and DeepLabV3 as dense predictors, per-pixel
cross-entropy), tilefuse fused and unfused vs PyTorch CPU, same process, interleaved steps.

    PYTHONPATH=. python3 benchmarks/training.py [--batch 32] [--image-size 112] [--steps 5]
        [--models resnet18,resnet50] [--threads 2[,16,...]] [--profile] [--kernels] [--no-unfused]

Needs numpy, numba and torch only (the torch models are tests/torch_zoo.py). For each thread
count T of --threads (run one after the other): tilefuse runs its steps on T threads
(Trainer(threads=T): its pool, OpenBLAS held at one thread) and PyTorch on
torch.set_num_threads(T); to mimic a machine with T cores, start the command under
`taskset -c 0-(T-1)` as well (both then see only those cores).

A step is the whole training step on both sides: tilefuse `Trainer.step` (input/label/finite
checks, forward, backward, SGD) and PyTorch zero_grad + forward + cross-entropy + backward +
SGD step. Steps of the runs alternate (unfused, fused, PyTorch, unfused, ...) after one warm-up
step each, so they see the same machine load; the table gives median wall times, the median
CPU time of a step (process time: every thread; PyTorch's OpenMP threads spin while they wait,
which counts as CPU), and "vs PyTorch" = PyTorch's median step / ours (> 1: tilefuse faster).
The forward / backward split of tilefuse comes from the schedule's timers.

--kernels: after the timed steps, the CPU time of a few more fused steps by kernel role (the
GEMMs of the forward pass, the input gradient and the weight gradient; Winograd transforms;
im2col/col2im with the fused input stage; pre/post-processing and epilogues; unfused BN).

--profile: per op type, the median time of a tilefuse fused step (its schedule's timers: the
fused convolutions include the BN/ReLU/Add work moved into them) next to PyTorch's (one
torch.profiler step after the timed ones; self time of the ATen ops, children included in
their parents' rows as torch reports them).

"Memory-bound overhead" is the time BN/ReLU/Add (and gradient error-Adds) add on top of the
convolutions: unfused = the time of those layers' own units; fused = (fused conv units + any
memory-bound layers outside the patterns) - (the plain conv units of the unfused run).
Peak activation memory: tilefuse = peak live activations + activation gradients counted by
the schedule's tracker; PyTorch = bytes of the distinct tensors autograd saves for backward.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
if not os.environ.get("PYTHONPATH"):          # the repository's tilefuse unless PYTHONPATH says
    sys.path.insert(0, str(ROOT))

MB_OPS = ("batch_norm", "relu", "add", "error-add")


def _med(v):
    return statistics.median(v) if v else float("nan")


class TilefuseRun:
    def __init__(self, net, x, labels, schedule, threads):
        from tilefuse.training import SGD, Trainer
        self.tr = Trainer(net, SGD(0.01, momentum=0.9), schedule=schedule, threads=threads)
        self.x, self.labels = x, labels
        self.tr.step(x, labels)                          # warm-up (numba compile, caches)
        self.steps, self.cpu, self.timings = [], [], []

    def step(self):
        s = self.tr.schedule
        s.timing.clear()
        c0, t0 = time.process_time(), time.perf_counter()
        self.tr.step(self.x, self.labels)
        self.steps.append(time.perf_counter() - t0)
        self.cpu.append(time.process_time() - c0)
        self.timings.append(dict(s.timing))

    def result(self):
        ts = self.timings
        t = {k: _med([d.get(k, 0.0) for d in ts]) for k in set().union(*ts)}
        s = self.tr.schedule
        return {"fwd": _med([sum(v for k, v in d.items() if k.startswith("fwd:")) for d in ts]),
                "bwd": _med([sum(v for k, v in d.items() if k.startswith("bwd:")) for d in ts]),
                "step": _med(self.steps), "cpu": _med(self.cpu), "all": self.steps, "timing": t,
                "peak": s.mem.peak, "held": sum(s.mem.held_at_fwd_end.values()), "trainer": self.tr}


class TorchRun:
    def __init__(self, name, x, labels, threads, module=None):
        import torch
        import torch_zoo
        torch.set_num_threads(threads)
        self.m = module if module is not None else torch_zoo.build(name, num_classes=1000)
        self.m.train()
        self.opt = torch.optim.SGD(self.m.parameters(), lr=0.01, momentum=0.9)
        self.xt, self.yt = torch.from_numpy(x), torch.from_numpy(labels)
        self.saved = {}
        self.step()                                       # warm-up
        self.fw, self.bw, self.steps, self.cpu = [], [], [], []

    def _run(self):
        import torch
        import torch.nn.functional as F
        saved = self.saved

        def pack(t):
            saved[t.data_ptr()] = t.numel() * t.element_size()
            return t
        c0, t0 = time.process_time(), time.perf_counter()
        self.opt.zero_grad()
        saved.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = F.cross_entropy(self.m(self.xt), self.yt)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        self.opt.step()
        t3 = time.perf_counter()
        return t1 - t0, t2 - t1, t3 - t0, time.process_time() - c0

    def step(self):
        fw, bw, st, cpu = self._run()
        if hasattr(self, "steps"):
            self.fw.append(fw)
            self.bw.append(bw)
            self.steps.append(st)
            self.cpu.append(cpu)

    def profile(self):
        """Self CPU time (s) of each ATen op over one step (torch.profiler)."""
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            self._run()
        return {e.key: e.self_cpu_time_total / 1e6 for e in prof.key_averages()}

    def result(self):
        params = {p.data_ptr() for p in self.m.parameters()}
        act = sum(v for k, v in self.saved.items() if k not in params)
        return {"fwd": _med(self.fw), "bwd": _med(self.bw), "step": _med(self.steps),
                "cpu": _med(self.cpu), "held": act, "all": self.steps}


# op types: tilefuse schedule timer keys -> PyTorch ATen ops (self time)
PROFILE_ROWS = [
    ("conv forward (fused: + BN/ReLU/Add)", ["fwd:conv2d"],
     ["aten::mkldnn_convolution", "aten::convolution", "aten::_convolution", "aten::conv2d",
      "aten::thnn_conv2d", "aten::_slow_conv2d_forward"]),
    ("conv backward (fused: + BN/ReLU/Add)", ["bwd:conv2d"],
     ["aten::convolution_backward", "aten::mkldnn_convolution_backward",
      "aten::_slow_conv2d_backward"]),
    ("batch norm forward", ["fwd:batch_norm"], ["aten::native_batch_norm", "aten::batch_norm",
                                               "aten::_batch_norm_impl_index"]),
    ("batch norm backward", ["bwd:batch_norm"], ["aten::native_batch_norm_backward"]),
    ("relu forward", ["fwd:relu"], ["aten::relu_", "aten::relu", "aten::clamp_min_",
                                    "aten::clamp_min"]),
    ("relu backward", ["bwd:relu"], ["aten::threshold_backward"]),
    ("add forward / error adds", ["fwd:add", "bwd:add", "bwd:error-add"], []),
    ("max pool forward", ["fwd:max_pool"], ["aten::max_pool2d_with_indices", "aten::max_pool2d"]),
    ("max pool backward", ["bwd:max_pool"], ["aten::max_pool2d_with_indices_backward"]),
    ("global avg pool fwd+bwd", ["fwd:global_avg_pool", "bwd:global_avg_pool"],
     ["aten::mean", "aten::adaptive_avg_pool2d", "aten::_adaptive_avg_pool2d",
      "aten::_adaptive_avg_pool2d_backward", "aten::sum"]),
    ("linear fwd+bwd", ["fwd:linear", "bwd:linear", "fwd:flatten", "bwd:flatten"],
     ["aten::addmm", "aten::mm", "aten::t", "aten::linear"]),
]


def profile_table(fused, torch_prof):
    t = fused["timing"]
    print(f"\n  per op type, one step, {'tilefuse fused':>14} {'PyTorch':>9} {'ratio':>6}")
    used = set()
    tot_f = tot_t = 0.0
    for label, tf_keys, th_keys in PROFILE_ROWS:
        a = sum(t.get(k, 0.0) for k in tf_keys)
        b = sum(torch_prof.get(k, 0.0) for k in th_keys)
        used.update(th_keys)
        tot_f += a
        tot_t += b
        ratio = f"{b / a:6.2f}" if a > 0 and b > 0 else f"{'-':>6}"
        print(f"  {label:<38} {a:14.4f} {b:9.4f} {ratio}")
    rest_t = sum(v for k, v in torch_prof.items() if k not in used and k.startswith("aten::"))
    rest_f = sum(v for k, v in t.items() if k not in {k2 for _, ks, _ in PROFILE_ROWS for k2 in ks}
                 and (k.startswith("fwd:") or k.startswith("bwd:")))
    print(f"  {'other ops (loss, optimizer, copies ...)':<38} {rest_f:14.4f} {rest_t:9.4f}")
    print(f"  (tilefuse rows are schedule timers; 'other' there excludes the optimizer and the "
          f"step's checks: step {fused['step']:.3f} s = fwd {fused['fwd']:.3f} + bwd "
          f"{fused['bwd']:.3f} + the rest)")


class KernelTimer:
    """--kernels: CPU time (thread_time, summed over threads) of the training kernels by role,
    by wrapping the module-level functions the conv and BN code calls (a few us per call)."""

    ROLES = {
        "gemm": None, "wino_gemms": None, "wino_gemms_nn": None, "_mm": None,   # split by caller below
        "wino_gemms_mirrored": "GEMM input gradient", "wino_gemms_nt": "GEMM weight gradient",
        "transpose_planes": "GEMM weight gradient",
        "wino_input": "Winograd transforms", "wino_output": "Winograd transforms",
        "wino_dy": "Winograd transforms", "wino_dw": "Winograd transforms",
        "wino_weights": "Winograd transforms",
        "_cols_shift": "im2col / col2im (+ input stage)", "_cols_gather": "im2col / col2im (+ input stage)",
        "_col2im_post": "im2col / col2im (+ input stage)", "_mirror_rows": "im2col / col2im (+ input stage)",
        "_pre_rows": "pre/post-processing, epilogue", "_post_rows": "pre/post-processing, epilogue",
        "_epilogue": "pre/post-processing, epilogue", "_bwd_pre": "pre/post-processing, epilogue",
        "_sum_transpose": "weight-gradient partial sums", "_row_sums": "pre/post-processing, epilogue",
    }
    CALLERS = {"task": "GEMM forward", "dw_task": "GEMM weight gradient",
               "wdw_task": "GEMM weight gradient", "dx_task": "GEMM input gradient",
               "wdx_task": "GEMM input gradient"}

    def __init__(self):
        import threading
        from tilefuse.kernels import norm, train_conv, train_winograd
        self.lock = threading.Lock()
        self.t = {}
        self.saved = []
        for mod in (train_conv, train_winograd):
            for fn_name, role in self.ROLES.items():
                if hasattr(mod, fn_name) and not (mod is train_winograd and fn_name == "gemm"):
                    self._wrap(mod, fn_name, role)
        for fn_name in ("_row_sums", "_row_affine", "_row_dot_sums", "_row_bn_bwd"):
            self._wrap(norm, fn_name, "batch norm (unfused layers)")

    def _wrap(self, mod, fn_name, role):
        f = getattr(mod, fn_name)
        callers = self.CALLERS

        def w(*args, **kw):
            c0 = time.thread_time()
            r = f(*args, **kw)
            dt = time.thread_time() - c0
            caller = sys._getframe(1).f_code.co_name
            if caller == "_mm":          # OpenBLAS under train_conv._mm: counted as _mm's
                return r
            key = role or callers.get(caller, "GEMM (other)")
            with self.lock:
                self.t[key] = self.t.get(key, 0.0) + dt
            return r
        self.saved.append((mod, fn_name, f))
        setattr(mod, fn_name, w)

    def restore(self):
        for mod, fn_name, f in self.saved:
            setattr(mod, fn_name, f)


MODERN = ("mobilenet_v2", "mobilenet_v3_large", "efficientnet_b0", "regnet_y_400mf", "shufflenet_v2", "ghostnet",
          "convnext_tiny", "unet", "deeplabv3")
DENSE = {"unet": 2, "deeplabv3": 21}      # dense predictors: classes; labels (N, H, W), per-pixel cross-entropy


def run_model(name, a, threads, rng):
    import tilefuse.models as models
    module = None
    if name in MODERN:            # tests/modern_models.py's definition, PyTorch's default init, through from_torch
        import torch
        import modern_models
        import tilefuse
        torch.manual_seed(0)
        module = modern_models.build(name, num_classes=DENSE.get(name, 1000))
        x = rng.standard_normal((a.batch, 3, a.image_size, a.image_size)).astype(np.float32)
        net = tilefuse.from_torch(module, torch.from_numpy(x))
    else:
        net = getattr(models, name)(seed=0, batch=a.batch, image_size=a.image_size, num_classes=1000)
        x = rng.standard_normal(net.inputs[0].shape).astype(np.float32)
    labels = (rng.integers(0, DENSE[name], (a.batch, a.image_size, a.image_size)) if name in DENSE
              else rng.integers(0, 1000, a.batch))
    kinds = ("fused",) if a.no_unfused else ("unfused", "fused")
    runs = {s: TilefuseRun(net, x, labels, s, threads) for s in kinds}
    runs["pytorch"] = TorchRun(name, x, labels, threads, module)
    for _ in range(a.steps):                            # interleaved: same machine load
        for r in runs.values():
            r.step()
    res = {k: r.result() for k, r in runs.items()}
    ref = res["pytorch"]["step"]
    print(f"\n{name}, {threads} threads")
    print(f"{'':<10} {'forward':>9} {'backward':>9} {'step':>9} {'CPU s':>8} {'vs PyTorch':>10} "
          f"{'held MB':>9} {'peak MB':>9}")
    for k, r in res.items():
        peak = f"{r['peak'] / 1e6:9.1f}" if "peak" in r else f"{'-':>9}"
        print(f"{k:<10} {r['fwd']:9.3f} {r['bwd']:9.3f} {r['step']:9.3f} {r['cpu']:8.3f} "
              f"{ref / r['step']:9.2f}x {r['held'] / 1e6:9.1f} {peak}   steps "
              f"{[round(v, 3) for v in r['all']]}")
    print(f"step ratio PyTorch / fused: {ref / res['fused']['step']:.2f}x (median step times, "
          f"interleaved; > 1: tilefuse faster)")
    if "unfused" in res:
        print_overheads(res)
    if a.profile:
        profile_table(res["fused"], runs["pytorch"].profile())
    if a.kernels:
        kt = KernelTimer()
        fr = runs["fused"]
        steps = []
        for _ in range(max(1, a.steps // 2)):
            kt.t = {}
            c0 = time.process_time()
            fr.tr.step(fr.x, fr.labels)
            steps.append((time.process_time() - c0, dict(kt.t)))
        kt.restore()
        cpu, t = steps[len(steps) // 2]
        print(f"\n  fused step, CPU time by kernel role (all threads; step {cpu:.3f} s CPU):")
        for k, v in sorted(t.items(), key=lambda kv: -kv[1]):
            print(f"  {k:<38} {v:8.4f} s  {v / cpu:5.1%}")
        print(f"  {'the rest (pools, ReLU/Add, loss, SGD, checks, Python)':<38} "
              f"{cpu - sum(t.values()):8.4f} s")


def print_overheads(res):
    tu, tf = res["unfused"]["timing"], res["fused"]["timing"]
    for ph in ("fwd", "bwd"):
        mb_u = sum(tu.get(f"{ph}:{o}", 0.0) for o in MB_OPS)
        conv_u = tu.get(f"{ph}:conv2d", 0.0)
        mb_f = sum(tf.get(f"{ph}:{o}", 0.0) for o in MB_OPS)
        f = max(tf.get(f"{ph}:conv2d", 0.0) - conv_u, 0.0) + mb_f
        print(f"memory-bound overhead {ph}: unfused {mb_u:.3f} s, fused {f:.3f} s "
              f"({mb_u / max(f, 1e-9):.1f}x less; plain convs {conv_u:.3f} s)")
    tr = res["fused"]["trainer"]
    tf_u = res["unfused"]["trainer"].schedule.log.by_layer()
    tf_f = tr.schedule.log.by_layer()
    mb = {op.name for op in tr.schedule.ops if op.op in ("batch_norm", "relu", "add")}
    for ph in ("fwd", "bwd"):
        bu = sum(v[ph] for k, v in tf_u.items() if k in mb or k.startswith("error-add"))
        bf = sum(v[ph] for k, v in tf_f.items() if k in mb or k.startswith("error-add"))
        print(f"memory-bound traffic {ph}: unfused {bu / 1e6:.1f} MB, fused {bf / 1e6:.1f} MB")
    print(f"patterns: {len(tr.traffic())}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--image-size", type=int, default=112)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--models", default="resnet18,resnet50")
    ap.add_argument("--threads", default="2",
                    help="thread counts, comma-separated (each runs on its own, e.g. 2,16)")
    ap.add_argument("--profile", action="store_true", help="per-op-type times vs torch.profiler")
    ap.add_argument("--no-unfused", action="store_true", help="skip the unfused schedule")
    ap.add_argument("--kernels", action="store_true",
                    help="CPU time of the fused step by kernel role (GEMMs fwd / dX / dW, transforms, ...)")
    a = ap.parse_args(argv)
    import numba
    import torch

    from tilefuse.kernels import blas, train_conv
    from tilefuse.kernels.threads import cpu_count
    counts = [int(t) for t in a.threads.split(",")]
    print(f"batch {a.batch}, {a.image_size}x{a.image_size}, median of {a.steps} interleaved "
          f"steps (seconds); {cpu_count()} CPUs usable; numpy {np.__version__}, numba "
          f"{numba.__version__}, torch {torch.__version__}; OpenBLAS core {blas.blas_info()}, "
          f"sgemm from numba: {'yes' if getattr(blas, 'SGEMM', (0,))[0] else 'no'}, Winograd 3x3: "
          f"{getattr(train_conv, 'WINOGRAD', False)}; tilefuse from {Path(train_conv.__file__).parents[2]}; "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')}; "
          f"load average {tuple(round(v, 2) for v in os.getloadavg())}")
    rng = np.random.default_rng(0)
    for threads in counts:
        if threads > cpu_count():
            print(f"(note: {threads} threads on {cpu_count()} usable CPUs: oversubscribed)")
        for name in a.models.split(","):
            run_model(name, a, threads, rng)
    print(f"\nload average at end {tuple(round(v, 2) for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
