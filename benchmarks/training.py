"""Training-step benchmark (issue 5): ResNet18/ResNet50, fused vs unfused vs PyTorch CPU.

    .venv/bin/python benchmarks/training.py [--batch 32] [--image-size 112] [--steps 2]
                                            [--models resnet18,resnet50] [--threads 2]

Forward and backward are timed separately (median of --steps steps after one warm-up); the
unfused, fused and PyTorch steps are interleaved in one loop so that they see the same load
on a shared machine.
"Memory-bound overhead" is the time BN/ReLU/Add (and gradient error-Adds) add on top of the
convolutions: unfused = the time of those layers' own units; fused = (fused conv units + any
memory-bound layers outside the patterns) - (the plain conv units of the unfused run).
Peak activation memory: tilefuse = peak live activations + activation gradients counted by
the schedule's tracker; PyTorch = bytes of the distinct tensors autograd saves for backward.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

MB_OPS = ("batch_norm", "relu", "add", "error-add")


class TilefuseRun:
    def __init__(self, net, x, labels, schedule, threads):
        from tilefuse.training import SGD, Trainer
        self.tr = Trainer(net, SGD(0.01, momentum=0.9), schedule=schedule, threads=threads)
        self.x, self.labels, self.threads = x, labels, threads
        self.tr.step(x, labels)                          # warm-up (numba compile, caches)
        self.fw, self.bw, self.timings = [], [], []

    def step(self):
        from tilefuse.kernels import dense as K
        from tilefuse.training.trainer import _threads
        tr = self.tr
        s = tr.schedule
        s.timing.clear()
        with _threads(self.threads):
            t0 = time.perf_counter()
            logits = tr.forward(self.x)
            t1 = time.perf_counter()
            loss, dl = K.softmax_cross_entropy(logits, self.labels)
            s.backward(dl)
            t2 = time.perf_counter()
        tr.optimizer.step(tr.params, s.pgrads)
        self.fw.append(t1 - t0)
        self.bw.append(t2 - t1)
        self.timings.append(dict(s.timing))

    def result(self):
        ts = self.timings
        t = {k: statistics.median(d.get(k, 0.0) for d in ts) for k in set().union(*ts)}
        s = self.tr.schedule
        return {"fwd": statistics.median(self.fw), "bwd": statistics.median(self.bw), "timing": t,
                "peak": s.mem.peak, "held": sum(s.mem.held_at_fwd_end.values()),
                "trainer": self.tr, "all": [a + b for a, b in zip(self.fw, self.bw)]}


class TorchRun:
    def __init__(self, name, x, labels, threads):
        import torch
        import torch_zoo
        torch.set_num_threads(threads)
        self.m = torch_zoo.build(name, num_classes=1000)
        self.m.train()
        self.opt = torch.optim.SGD(self.m.parameters(), lr=0.01, momentum=0.9)
        self.xt, self.yt = torch.from_numpy(x), torch.from_numpy(labels)
        self.saved = {}
        self.fw, self.bw = [], []
        self.step()                                       # warm-up
        self.fw, self.bw = [], []

    def step(self):
        import torch
        import torch.nn.functional as F
        saved = self.saved

        def pack(t):
            saved[t.data_ptr()] = t.numel() * t.element_size()
            return t
        self.opt.zero_grad()
        saved.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            t0 = time.perf_counter()
            loss = F.cross_entropy(self.m(self.xt), self.yt)
            t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        self.opt.step()
        self.fw.append(t1 - t0)
        self.bw.append(t2 - t1)

    def result(self):
        params = {p.data_ptr() for p in self.m.parameters()}
        act = sum(v for k, v in self.saved.items() if k not in params)
        return {"fwd": statistics.median(self.fw), "bwd": statistics.median(self.bw), "held": act,
                "all": [a + b for a, b in zip(self.fw, self.bw)]}


def overheads(unf, fus):
    tu, tf = unf["timing"], fus["timing"]
    out = {}
    for ph in ("fwd", "bwd"):
        mb_u = sum(tu.get(f"{ph}:{o}", 0.0) for o in MB_OPS)
        conv_u = tu.get(f"{ph}:conv2d", 0.0)
        mb_f = sum(tf.get(f"{ph}:{o}", 0.0) for o in MB_OPS)
        out[ph] = (mb_u, max(tf.get(f"{ph}:conv2d", 0.0) - conv_u, 0.0) + mb_f, conv_u)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--image-size", type=int, default=112)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--models", default="resnet18,resnet50")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    import tilefuse.models as models
    rng = np.random.default_rng(0)
    import os
    try:
        from threadpoolctl import threadpool_info
        blas = [(i["internal_api"], i.get("architecture")) for i in threadpool_info() if i["user_api"] == "blas"]
    except ImportError:
        blas = "?"
    print(f"batch {a.batch}, {a.image_size}x{a.image_size}, {a.threads} threads, "
          f"median of {a.steps} interleaved steps (seconds); BLAS {blas}; "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')}; load average {os.getloadavg()}")
    for name in a.models.split(","):
        net = getattr(models, name)(seed=0, batch=a.batch, image_size=a.image_size, num_classes=1000)
        x = rng.standard_normal(net.inputs[0].shape).astype(np.float32)
        labels = rng.integers(0, 1000, a.batch)
        runs = {s: TilefuseRun(net, x, labels, s, a.threads) for s in ("unfused", "fused")}
        runs["pytorch"] = TorchRun(name, x, labels, a.threads)
        for _ in range(a.steps):                        # interleaved: same machine load
            for r in runs.values():
                r.step()
        res = {k: r.result() for k, r in runs.items()}
        print(f"\n{name}")
        print(f"{'':<10} {'forward':>9} {'backward':>9} {'step':>9} {'held MB':>9} {'peak MB':>9}")
        for k, r in res.items():
            peak = f"{r['peak'] / 1e6:9.1f}" if "peak" in r else f"{'-':>9}"
            print(f"{k:<10} {r['fwd']:9.3f} {r['bwd']:9.3f} {r['fwd'] + r['bwd']:9.3f} "
                  f"{r['held'] / 1e6:9.1f} {peak}   steps {[round(v, 2) for v in r['all']]}")
        print(f"step ratio PyTorch / fused: {statistics.median(res['pytorch']['all']) / statistics.median(res['fused']['all']):.2f}x "
              f"(median step times, interleaved)")
        oh = overheads(res["unfused"], res["fused"])
        for ph, (u, f, c) in oh.items():
            print(f"memory-bound overhead {ph}: unfused {u:.3f} s, fused {f:.3f} s "
                  f"({u / max(f, 1e-9):.1f}x less; plain convs {c:.3f} s)")
        tr = res["fused"]["trainer"]
        rows = tr.traffic()
        tf_u = res["unfused"]["trainer"].schedule.log.by_layer()
        tf_f = tr.schedule.log.by_layer()
        mb = {op.name for op in tr.schedule.ops if op.op in ("batch_norm", "relu", "add")}
        for ph in ("fwd", "bwd"):
            bu = sum(v[ph] for k, v in tf_u.items() if k in mb or k.startswith("error-add"))
            bf = sum(v[ph] for k, v in tf_f.items() if k in mb or k.startswith("error-add"))
            print(f"memory-bound traffic {ph}: unfused {bu / 1e6:.1f} MB, fused {bf / 1e6:.1f} MB")
        print(f"patterns: {len(rows)}")


if __name__ == "__main__":
    main()
