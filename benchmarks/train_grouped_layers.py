"""RegNetY-400MF's grouped 3x3 convs (group width 8) in training: the direct small-group kernel
(kernels/train_grouped.py), the im2col + GEMM path it replaced (kernels/train_conv.py) and PyTorch, same run.

    PYTHONPATH=. env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/train_grouped_layers.py
    PYTHONPATH=. .venv/bin/python benchmarks/train_grouped_layers.py --threads 2 --batch 32 --image-size 112 --reps 7

Per layer (C channels, groups of 8 in and out, 3x3, padding 1, no bias; the shapes of RegNetY-400MF's step at
--image-size): forward, and backward (weight and input gradients), each engine's least of --reps calls, the engines
alternating; "x" is how many of the layer the network has (the totals count them). PyTorch's forward and
backward are timed around F.conv2d and .backward in one call. The tilefuse kernels run on CNHW, as in the Trainer, with BLAS on one thread
and `using(threads)`, as the Trainer runs them. Ratios > 1 mean the direct kernel is faster.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def layers(image_size):
    """(C, H, stride, count) of RegNetY-400MF's grouped convs: widths 48, 104, 208, 440, depths 1, 3, 6, 6, the
    first block of a stage at stride 2; the stem halves the image."""
    out, h = [], image_size // 2
    for c, d in ((48, 1), (104, 3), (208, 6), (440, 6)):
        out.append((c, h, 2, 1))
        h = (h + 1) // 2
        if d > 1:
            out.append((c, h, 1, d - 1))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--image-size", type=int, default=112)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    import torch
    import torch.nn.functional as F
    from tilefuse.kernels import train_conv as tc, train_grouped as tg
    from tilefuse.kernels.blas import blas_threads
    from tilefuse.kernels.threads import using
    torch.set_num_threads(a.threads)
    rng = np.random.default_rng(0)
    N = a.batch
    print(f"batch {N}, {a.image_size}x{a.image_size}, {a.threads} threads; least of {a.reps}, ms")
    print(f"{'layer':<18} {'direct fwd':>10} {'bwd':>7} {'im2col fwd':>10} {'bwd':>7} {'torch fwd':>9} {'bwd':>7}")
    tot = np.zeros(6)
    with blas_threads(1), using(a.threads):
        for C, H, s, cnt in layers(a.image_size):
            G = C // 8
            x = rng.standard_normal((C, N, H, H)).astype(np.float32)           # CNHW
            w = (rng.standard_normal((C, 8, 3, 3)) * 0.1).astype(np.float32)
            g = tc.ConvGeom((N, C, H, H), w.shape, (s, s), (1, 1, 1, 1), (1, 1), G)
            assert tg.is_small_grouped((N, C, H, H), w.shape, G)
            dy = rng.standard_normal((C, N, g.ho, g.wo)).astype(np.float32)
            xt = torch.from_numpy(x.transpose(1, 0, 2, 3).copy()).requires_grad_()
            wt = torch.from_numpy(w).requires_grad_()
            dyt = torch.from_numpy(dy.transpose(1, 0, 2, 3).copy())

            def timed(f):
                t0 = time.perf_counter()
                f()
                return time.perf_counter() - t0

            def torch_fb():                                                  # (forward, backward) seconds
                t0 = time.perf_counter()
                y = F.conv2d(xt, wt, None, s, 1, 1, G)
                t1 = time.perf_counter()
                y.backward(dyt)
                return t1 - t0, time.perf_counter() - t1
            calls = [lambda: tg.grouped_forward_cnhw(x, w, g),
                     lambda: tg.grouped_backward_cnhw(dy, x, w, g, True, False),
                     lambda: tc.conv_forward_cnhw(x, w, g),
                     lambda: tc.conv_backward_cnhw(dy, x, w, g, need_dx=True, has_bias=False)]
            best = [np.inf] * 6
            for f in calls + [torch_fb]:
                f()                                                          # warm-up (compile, caches)
            for _ in range(a.reps):
                for i, f in enumerate(calls):
                    best[i] = min(best[i], timed(f))
                best[4:6] = np.minimum(best[4:6], torch_fb())
            ms = np.array(best) * 1e3
            tot += ms * cnt
            print(f"{C:>4} @ {H:>3} s{s} x{cnt:<3} {ms[0]:10.2f} {ms[1]:7.2f} {ms[2]:10.2f} {ms[3]:7.2f} "
                  f"{ms[4]:9.2f} {ms[5]:7.2f}")
    print(f"{'total':<18} {tot[0]:10.1f} {tot[1]:7.1f} {tot[2]:10.1f} {tot[3]:7.1f} {tot[4]:9.1f} {tot[5]:7.1f}")
    print(f"direct / im2col: forward {tot[2] / tot[0]:.2f}x, backward {tot[3] / tot[1]:.2f}x faster; "
          f"PyTorch / direct: forward {tot[4] / tot[0]:.2f}, backward {tot[5] / tot[1]:.2f} (> 1: tilefuse faster)")


if __name__ == "__main__":
    main()
