"""Which off-the-shelf model definitions run through tilefuse, as a new user would try them.

For each model of torchvision (classification, segmentation) and timm, with random weights in
eval mode: `from_torch(model, x)` -> `compile` -> `Session.run`, compared with PyTorch on the same
input. Prints one line per model (ok / refused with the error / wrong with the error) and the counts.
Needs torchvision and timm (not installed on the development machine; run where they are):

    PYTHONPATH=. python3 benchmarks/model_coverage.py --threads 16 --image-size 160
    PYTHONPATH=. python3 benchmarks/model_coverage.py --only torchvision --models resnet18,mobilenet_v2
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

import numpy as np

TORCHVISION_CLS = ["alexnet", "vgg16", "resnet18", "resnet50", "resnext50_32x4d", "wide_resnet50_2",
                   "densenet121", "googlenet", "inception_v3", "squeezenet1_0", "squeezenet1_1",
                   "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0",
                   "regnet_y_400mf", "mnasnet1_0", "shufflenet_v2_x1_0", "convnext_tiny"]
TORCHVISION_SEG = ["fcn_resnet50", "deeplabv3_resnet50", "deeplabv3_mobilenet_v3_large",
                   "lraspp_mobilenet_v3_large"]
TIMM = ["resnet50d", "efficientnet_b0", "mobilenetv3_large_100", "mobilenetv2_100", "convnext_atto",
        "regnety_004", "ghostnet_100", "repvgg_a0", "rexnet_100", "densenet121", "mixnet_s",
        "mnasnet_100", "dla34", "cspresnet50", "dpn68", "xception41", "hrnet_w18_small", "res2net50_14w_8s",
        "selecsls42b", "tf_efficientnet_lite0"]


def _seg_wrapper(torch, model):
    class SegOut(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(x)["out"]
    return SegOut(model)


def build(torch, family: str, name: str):
    if family == "timm":
        import timm
        return timm.create_model(name, pretrained=False)
    import torchvision
    if family == "torchvision-seg":
        m = getattr(torchvision.models.segmentation, name)(weights=None, weights_backbone=None,
                                                           num_classes=21)
        return _seg_wrapper(torch, m)
    kw = {"weights": None}
    if name in ("googlenet", "inception_v3"):
        kw["aux_logits"] = False
        kw["init_weights"] = True
    return getattr(torchvision.models, name)(**kw)


def try_one(torch, tilefuse, family, name, size, threads, rtol):
    torch.manual_seed(0)
    model = build(torch, family, name).eval()
    if name == "inception_v3":
        size = max(size, 75)
    x = torch.randn(1, 3, size, size)
    with torch.no_grad():
        want = model(x)
    want = want.numpy() if hasattr(want, "numpy") else np.asarray(want)
    t0 = time.perf_counter()
    try:
        net = tilefuse.from_torch(model, x)
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        return "refused (import)", f"{type(e).__name__}: {str(e).splitlines()[0][:160]}", 0.0
    try:
        compiled = tilefuse.compile(net, threads=threads)
        sess = tilefuse.Session(compiled, threads=threads)
        got = sess.run(x.numpy())
    except Exception as e:  # noqa: BLE001
        return "refused (compile/run)", f"{type(e).__name__}: {str(e).splitlines()[0][:160]}", 0.0
    got = got[0] if isinstance(got, list) else got
    dt = time.perf_counter() - t0
    if got.shape != want.shape:
        return "WRONG", f"shape {got.shape} vs torch {want.shape}", dt
    err = float(np.max(np.abs(got - want))) / max(float(np.max(np.abs(want))), 1e-30)
    if not np.isfinite(got).all() or err > rtol:
        return "WRONG", f"relative error {err:.2e} > {rtol:g}", dt
    return "ok", f"relative error {err:.1e}", dt


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=("torchvision", "timm", "all"), default="all")
    ap.add_argument("--models", default=None, help="comma-separated subset")
    ap.add_argument("--image-size", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rtol", type=float, default=1e-3,
                    help="max |tilefuse - torch| / max |torch| counted as a match (default 1e-3)")
    a = ap.parse_args(argv)
    import torch
    torch.set_num_threads(a.threads)
    import tilefuse
    todo = []
    if a.only in ("torchvision", "all"):
        todo += [("torchvision", n) for n in TORCHVISION_CLS] + [("torchvision-seg", n) for n in TORCHVISION_SEG]
    if a.only in ("timm", "all"):
        todo += [("timm", n) for n in TIMM]
    if a.models:
        keep = set(a.models.split(","))
        todo = [t for t in todo if t[1] in keep]
    counts: dict[tuple[str, str], int] = {}
    print(f"torch {torch.__version__}, image {a.image_size}x{a.image_size}, threads {a.threads}", flush=True)
    for fam, name in todo:
        try:
            status, why, dt = try_one(torch, tilefuse, fam, name, a.image_size, a.threads, a.rtol)
        except Exception as e:  # noqa: BLE001 - e.g. the model cannot be built here
            status, why, dt = "not built", f"{type(e).__name__}: {str(e).splitlines()[0][:160]}", 0.0
            traceback.print_exc(limit=1, file=sys.stderr)
        counts[(fam, status)] = counts.get((fam, status), 0) + 1
        print(f"{fam:16s} {name:30s} {status:22s} {dt:6.1f} s  {why}", flush=True)
    fams = sorted({f for f, _ in counts})
    for f in fams:
        total = sum(v for (g, _), v in counts.items() if g == f)
        parts = ", ".join(f"{s} {v}" for (g, s), v in sorted(counts.items()) if g == f)
        print(f"{f}: {counts.get((f, 'ok'), 0)} of {total} run and match ({parts})")


if __name__ == "__main__":
    main()
