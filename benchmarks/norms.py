"""GroupNorm / InstanceNorm layers and norms written in tensor math: tilefuse against PyTorch and ONNX Runtime.

    .venv/bin/python benchmarks/norms.py --threads 1 2 --reps 20
    PYTHONPATH=. python3 benchmarks/norms.py --threads 16          # a bigger machine

Each case is one normalization layer (with the activation model code puts after it) as an nn.Module: PyTorch
runs it as written; ONNX Runtime runs its TorchScript export (GroupNorm arrives as Reshape ->
InstanceNormalization -> Reshape -> Mul -> Add, as in files users have); tilefuse compiles the same export
(`from_onnx`: the compiler folds the chain back into one group_norm with the activation fused) and runs it in a
Session. The last case is a diffusion UNet's residual block (GroupNorm, SiLU, conv 3x3, twice, and the skip):
the group norms between blocked convs run on NCHW16c. The last three are norms model code writes in tensor math:
the official ConvNeXt LayerNorm (the compiler folds its nine ops into one channel_norm), SSD's L2Norm and
F.normalize (one channel_norm in an l2 mode). Medians of --reps runs after a warm-up, each framework over all cases before the next starts. GB/s
counts the input read once and the output written once (for the residual block too, where it is only a scale) (the least any implementation moves); the kernel is
memory bound, so the yardstick is the machine's bandwidth (depthwise.py measures it: `triad`). Ratios > 1: tilefuse
faster. Needs numpy, numba, torch, onnx, onnxruntime.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)

from scaling import median_time  # noqa: E402

# (name, input shape, module kind, groups, activation)
CASES = [
    ("unet-sd 320@64x64 gn32+silu", (1, 320, 64, 64), "gn", 32, "silu"),
    ("unet-sd 640@32x32 gn32+silu", (1, 640, 32, 32), "gn", 32, "silu"),
    ("resnet-gn 256@56x56 gn32+relu", (8, 256, 56, 56), "gn", 32, "relu"),
    ("detect-head 256@80x80 gn32+relu", (2, 256, 80, 80), "gn", 32, "relu"),
    ("style 64@256x256 instance+relu", (1, 64, 256, 256), "in", 64, "relu"),
    ("cyclegan 256@64x64 instance", (1, 256, 64, 64), "in", 256, "none"),
    # a diffusion UNet's residual block (GN, SiLU, conv 3x3, GN, SiLU, conv 3x3, + x): the group norms run
    # between blocked convs (NCHW16c, no conversions)
    ("resblock 128@64x64 (2 conv + 2 gn)", (1, 128, 64, 64), "resblock", 32, "silu"),
    # model code's own norms written with tensor math: the official ConvNeXt LayerNorm (channels_first: mean,
    # (x - u).pow(2).mean, torch.sqrt; the compiler folds it into one channel_norm), SSD's L2Norm (pow, sum,
    # sqrt, + eps, div, * the expanded weight) and F.normalize over a feature map (both fold into one
    # channel_norm in an l2 mode, the weight into its gamma)
    ("convnext-official 96@56x56 layernorm", (1, 96, 56, 56), "cf_ln", 0, "none"),
    ("convnext-official 192@28x28 b8 layernorm", (8, 192, 28, 28), "cf_ln", 0, "none"),
    ("ssd 512@38x38 l2norm", (1, 512, 38, 38), "l2norm", 0, "none"),
    ("ssd 512@38x38 b8 l2norm", (8, 512, 38, 38), "l2norm", 0, "none"),
    ("F.normalize 256@28x28 b8", (8, 256, 28, 28), "normalize", 0, "none"),
]


class ResBlock:
    """(built lazily: torch is imported in main)"""

    @staticmethod
    def make(c, groups):
        import torch.nn as nn

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.n1, self.c1 = nn.GroupNorm(groups, c), nn.Conv2d(c, c, 3, padding=1)
                self.n2, self.c2 = nn.GroupNorm(groups, c), nn.Conv2d(c, c, 3, padding=1)
                self.act = nn.SiLU()

            def forward(self, x):
                h = self.c1(self.act(self.n1(x)))
                return x + self.c2(self.act(self.n2(h)))
        return Block().eval()


def _tensor_norm(kind, c):
    import torch
    import torch.nn as nn

    class LayerNormCF(nn.Module):      # facebookresearch/ConvNeXt, models/convnext.py, data_format="channels_first"
        def __init__(self):
            super().__init__()
            self.weight, self.bias, self.eps = nn.Parameter(torch.ones(c)), nn.Parameter(torch.zeros(c)), 1e-6

        def forward(self, x):
            u = x.mean(1, keepdim=True)
            s = (x - u).pow(2).mean(1, keepdim=True)
            x = (x - u) / torch.sqrt(s + self.eps)
            return self.weight[:, None, None] * x + self.bias[:, None, None]

    class L2Norm(nn.Module):           # ssd.pytorch, layers/modules/l2norm.py
        def __init__(self):
            super().__init__()
            self.weight, self.eps = nn.Parameter(torch.full((c,), 20.0)), 1e-10

        def forward(self, x):
            norm = x.pow(2).sum(dim=1, keepdim=True).sqrt() + self.eps
            x = torch.div(x, norm)
            return self.weight.unsqueeze(0).unsqueeze(2).unsqueeze(3).expand_as(x) * x

    class Normalize(nn.Module):
        def forward(self, x):
            return torch.nn.functional.normalize(x, dim=1)

    return {"cf_ln": LayerNormCF, "l2norm": L2Norm, "normalize": Normalize}[kind]().eval()


def _module(kind, c, groups, act):
    import torch.nn as nn
    if kind == "resblock":
        return ResBlock.make(c, groups)
    if kind in ("cf_ln", "l2norm", "normalize"):
        return _tensor_norm(kind, c)
    norm = nn.GroupNorm(groups, c) if kind == "gn" else nn.InstanceNorm2d(c, affine=True)
    a = {"silu": nn.SiLU(), "relu": nn.ReLU(), "none": nn.Identity()}[act]
    return nn.Sequential(norm, a).eval()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[2])
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args(argv)
    import numpy as np
    import onnxruntime as ort
    import torch
    from onnx_export import export

    import tilefuse
    print(f"# norms: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}, "
          f"onnxruntime {ort.__version__}")
    rng = np.random.default_rng(0)
    for threads in a.threads:
        torch.set_num_threads(threads)
        rows = []
        for name, shape, kind, groups, act in CASES:
            m = _module(kind, shape[1], groups, act)
            with torch.no_grad():
                for p in m.parameters():
                    lo = 0.5 if p.dim() == 1 else -0.05                   # norm weights / conv weights
                    p.copy_(torch.from_numpy(rng.uniform(lo, -lo if lo < 0 else 1.5, p.shape).astype(np.float32)))
            x = rng.standard_normal(shape).astype(np.float32)
            blob = export(m, x, "torchscript")
            prog = tilefuse.compile(tilefuse.from_onnx(blob), threads=threads)
            kernels = [i.kernel for i in prog.lowered.instructions]
            sess = tilefuse.Session(prog, threads=threads)
            so = ort.SessionOptions()
            so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
            osess = ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])
            tx = torch.from_numpy(x)
            y_tf, y_ort = sess.run(x), osess.run(None, {"x": x})[0]
            with torch.no_grad():
                y_pt = m(tx).numpy()
            err = max(float(np.abs(y_tf - y_pt).max()), float(np.abs(y_tf - y_ort).max())) / float(np.abs(y_pt).max())
            kernels = [k for k in kernels if k not in ("to_nchwc", "from_nchwc")] + \
                [f"({sum(k in ('to_nchwc', 'from_nchwc') for k in kernels)} conversions)"]
            rows.append([name, shape, kernels, x.nbytes * 2, err, sess, osess, m, tx, x])
        t_tf = [median_time(lambda r=r: r[5].run(r[9]), a.reps) for r in rows]
        t_ort = [median_time(lambda r=r: r[6].run(None, {"x": r[9]}), a.reps) for r in rows]
        with torch.no_grad():
            t_pt = [median_time(lambda r=r: r[7](r[8]), a.reps) for r in rows]
        print(f"\n## {threads} thread(s): median of {a.reps}")
        print(f"{'case':<34} {'tilefuse ms':>11} {'GB/s':>6} {'PyTorch ms':>10} {'ORT ms':>8} {'PT/tf':>6} "
              f"{'ORT/tf':>6}  max rel err  tilefuse instructions")
        for r, tf, o, p in zip(rows, t_tf, t_ort, t_pt):
            print(f"{r[0]:<34} {tf * 1e3:11.3f} {r[3] / tf / 1e9:6.1f} {p * 1e3:10.3f} {o * 1e3:8.3f} {p / tf:6.2f} "
                  f"{o / tf:6.2f}  {r[4]:.1e}      {' '.join(r[2])}")
        gm = statistics.geometric_mean
        print(f"geometric mean: PyTorch / tilefuse {gm([p / t for p, t in zip(t_pt, t_tf)]):.2f}, "
              f"ONNX Runtime / tilefuse {gm([o / t for o, t in zip(t_ort, t_tf)]):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
