"""What `from_torch(..., fold_parameters=False)` costs: a network whose conv weights are expressions of parameters
(an NF-ResNet stage: ScaledStdConv2d, weight standardization with a gain) imported folded (the inference import:
the convs keep their weight slots and fast kernels) and kept (the expressions as ops feeding each conv's weight:
what the Trainer needs; the Trainer runs its conv kernels on the computed weight, compile folds the expressions
back into constants), against PyTorch in the same run.

    .venv/bin/python benchmarks/parameter_expressions.py --threads 2 --reps 5

Rows: inference (compiled Session.run) folded and kept, PyTorch eval; one training step (Trainer.forward_backward)
kept, and of the same network with plain convs (nn.Conv2d, the Trainer's conv kernels) as the yardstick, PyTorch's
training step (forward, backward) of the NF network. Medians of --reps runs after a warm-up. Ratios > 1:
tilefuse faster.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)

from scaling import median_time  # noqa: E402


def build(c, plain):
    import torch.nn as nn
    import torch.nn.functional as F
    from test_parameter_expressions import ScaledStdConv2d

    conv = (lambda i, o, k, **kw: nn.Conv2d(i, o, k, **kw)) if plain else ScaledStdConv2d

    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = conv(3, c, 3, padding=1, stride=2)
            self.blocks = nn.ModuleList(nn.ModuleList([conv(c, c, 1), conv(c, c, 3, padding=1), conv(c, c, 1)])
                                        for _ in range(2))
            self.head = nn.Linear(c, 10)

        def forward(self, x):
            x = self.stem(x)
            for a, b, d in self.blocks:
                x = x + 0.2 * d(F.gelu(b(F.gelu(a(F.gelu(x))))))
            return self.head(x.mean((2, 3)))
    return Stage()


def main():
    import numpy as np
    import torch
    import torch.nn.functional as F

    import tilefuse
    from tilefuse.training import SGD, Trainer
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--channels", type=int, default=64)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, threads {a.threads}, batch "
          f"{a.batch}, {a.size}x{a.size}, {a.channels} channels")
    torch.manual_seed(0)
    nf, plain = build(a.channels, False), build(a.channels, True)
    x = torch.randn(a.batch, 3, a.size, a.size)
    labels = torch.arange(a.batch) % 10
    rows = {}
    for fold in (True, False):
        s = tilefuse.compile(tilefuse.from_torch(nf, x, fold_parameters=fold), threads=a.threads)
        rows[f"inference {'folded' if fold else 'kept'}"] = median_time(lambda: s.run(x.numpy()), a.reps)
    nf.eval()
    with torch.no_grad():
        rows["inference PyTorch"] = median_time(lambda: nf(x), a.reps)
    for name, m, fold in (("train kept", nf, False), ("train plain convs", plain, True)):
        tr = Trainer(tilefuse.from_torch(m, x, fold_parameters=fold), SGD(lr=0.01), threads=a.threads)
        rows[name] = median_time(lambda: tr.forward_backward(x.numpy(), labels.numpy(), input_grads=False),
                                 a.reps)
    nf.train()

    def torch_step():
        nf.zero_grad()
        F.cross_entropy(nf(x), labels).backward()
    rows["train PyTorch"] = median_time(torch_step, a.reps)
    for k, v in rows.items():
        peer = rows["inference PyTorch" if k.startswith("inference") else "train PyTorch"]
        print(f"{k:24s} {v * 1e3:9.1f} ms   PyTorch / this {peer / v:5.2f}x")
    print(f"kept / folded inference: {rows['inference kept'] / rows['inference folded']:.2f}x the time; "
          f"train kept / plain convs: {rows['train kept'] / rows['train plain convs']:.2f}x")


if __name__ == "__main__":
    main()
