"""Depthwise and transposed-conv layer benchmark (issue 9): tilefuse against the machine's memory
bandwidth, PyTorch and ONNX Runtime, same run.

    PYTHONPATH=. python3 benchmarks/depthwise.py --threads 16          # the lead's 16-core box
    .venv/bin/python benchmarks/depthwise.py --threads 1 2 --reps 20    # here
    .venv/bin/python benchmarks/depthwise.py --threads 2 --batch 1 dram --no-ort   # batch 1, then DRAM-sized

Depthwise is memory bound (a 3x3 stride-1 layer does 18 FLOP per input + output element, 2.25
FLOP/byte), so the yardstick is the bandwidth, not the FMA peak:

1. Memory bandwidth, STREAM-like (numba, `prange` over the arrays, 3 x BW_MIB MiB float32 arrays,
   far beyond the last-level cache): copy a[i] = b[i] (2 x 4 bytes per element counted) and triad
   a[i] = b[i] + s*c[i] (3 x 4 bytes), best of --bw-reps, at each thread count.
2. The depthwise layers of MobileNetV2 and EfficientNet-B0 (224x224 input; each distinct layer
   once, `DW_LAYERS`): per layer the tilefuse depthwise kernel on NCHW16c (the layout compiled
   networks keep between layers), GFLOP/s (2*N*Ho*Wo*C*K*K / t), GB/s moved (input + output +
   weights bytes / t, once each: the minimum any implementation must move), the fraction of the
   measured triad bandwidth, and the same layer in PyTorch (NCHW and channels_last) and ONNX
   Runtime (one Conv node, group = C, NCHW), with the ratios other / tilefuse (> 1: tilefuse
   faster). Times are medians of --reps runs after a warm-up; each framework runs over all
   layers before the next one starts (idle peers' spinning worker threads never overlap).
   Note: at batch 1 most of these layers (0.1-5 MB) fit in the last-level cache, so GB/s above
   the DRAM bandwidth means the data came from cache; `--batch dram` gives each layer the batch
   (column N) that makes its input + output at least DRAM_MIB MiB, far past any last-level
   cache, so GB/s there is DRAM traffic. --batch takes several values (default: 1 and dram).
3. The transposed convolutions of a UNet decoder (2x2 stride 2, `UNET_LAYERS`, 512x512 input,
   base 64): GFLOP/s, the same comparisons (they are compute bound: a per-phase 1x1 GEMM).

Only numpy, numba, torch, onnx and onnxruntime are needed (PYTHONPATH=. from the repo root).
"""
from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import sys
import time

# name: (C, H (input), K, stride); MobileNetV2 (t=6 blocks, 224 input) and EfficientNet-B0 (MBConv)
DW_LAYERS = {
    "mnv2_112_c32_s1": (32, 112, 3, 1),
    "mnv2_112_c96_s2": (96, 112, 3, 2),
    "mnv2_56_c144_s1": (144, 56, 3, 1),
    "mnv2_56_c144_s2": (144, 56, 3, 2),
    "mnv2_28_c192_s1": (192, 28, 3, 1),
    "mnv2_28_c192_s2": (192, 28, 3, 2),
    "mnv2_14_c384_s1": (384, 14, 3, 1),
    "mnv2_14_c576_s1": (576, 14, 3, 1),
    "mnv2_14_c576_s2": (576, 14, 3, 2),
    "mnv2_7_c960_s1": (960, 7, 3, 1),
    "effb0_56_c144_k5_s2": (144, 56, 5, 2),
    "effb0_28_c240_k5_s1": (240, 28, 5, 1),
    "effb0_28_c240_k3_s2": (240, 28, 3, 2),
    "effb0_14_c480_k3_s1": (480, 14, 3, 1),
    "effb0_14_c480_k5_s1": (480, 14, 5, 1),
    "effb0_14_c672_k5_s1": (672, 14, 5, 1),
    "effb0_14_c672_k5_s2": (672, 14, 5, 2),
    "effb0_7_c1152_k5_s1": (1152, 7, 5, 1),
    "effb0_7_c1152_k3_s1": (1152, 7, 3, 1),
}
# name: (C_in, C_out, H (input)); ConvTranspose2d(C_in, C_out, 2, stride=2), UNet on 512x512, base 64
UNET_LAYERS = {
    "unet_up1_32": (1024, 512, 32),
    "unet_up2_64": (512, 256, 64),
    "unet_up3_128": (256, 128, 128),
    "unet_up4_256": (128, 64, 256),
}
BW_MIB = 256
DRAM_MIB = 256   # --batch dram: input + output bytes of each layer at least this


def _args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch", nargs="+", default=["1", "dram"], help="batch sizes: integers or 'dram'")
    ap.add_argument("--reps", type=int, default=10, help="timed runs per measurement (median)")
    ap.add_argument("--bw-reps", type=int, default=5)
    ap.add_argument("--layers", nargs="+", default=list(DW_LAYERS) + list(UNET_LAYERS),
                    choices=list(DW_LAYERS) + list(UNET_LAYERS))
    ap.add_argument("--no-ort", action="store_true", help="skip ONNX Runtime")
    return ap.parse_args()


def _stream_kernels():
    import numba as nb

    @nb.njit(parallel=True, nogil=True, cache=True)
    def copy(a, b):
        for i in nb.prange(a.size):
            a[i] = b[i]

    @nb.njit(parallel=True, nogil=True, cache=True)
    def triad(a, b, c, s):
        for i in nb.prange(a.size):
            a[i] = b[i] + s * c[i]

    return copy, triad


def bandwidth(threads: int, reps: int) -> tuple[float, float]:
    """(copy GB/s, triad GB/s) on `threads` of numba's threads, best of reps."""
    import numba as nb
    import numpy as np
    copy, triad = _stream_kernels()
    n = BW_MIB * (1 << 20) // 4
    a, b, c = np.zeros(n, np.float32), np.ones(n, np.float32), np.full(n, 2.0, np.float32)
    nb.set_num_threads(min(threads, nb.config.NUMBA_NUM_THREADS))
    copy(a, b)
    triad(a, b, c, np.float32(3.0))
    tc, tt = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        copy(a, b)
        tc.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        triad(a, b, c, np.float32(3.0))
        tt.append(time.perf_counter() - t0)
    return 2 * 4 * n / min(tc) / 1e9, 3 * 4 * n / min(tt) / 1e9


def _ort_session(node_kind: str, x_shape, w, b, attrs: dict, threads: int):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    node = helper.make_node(node_kind, ["x", "w", "b"], ["y"], **attrs)
    graph = helper.make_graph([node], "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    f = io.BytesIO()
    onnx.save(model, f)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(f.getvalue(), so, providers=["CPUExecutionProvider"])


def main():
    args = _args()
    import numpy as np
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from tilefuse.kernels.threads import cpu_count

    def med(fn):
        fn()
        ts = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    print(f"# depthwise / conv_transpose layers: {platform.processor() or platform.machine()}, {cpu_count()} cores, "
          f"torch {torch.__version__}, batches {' '.join(args.batch)}, median of {args.reps}, "
          f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    hdr = (f"{'layer':<22} {'N':>4} {'tf us':>9} {'GFLOP/s':>8} {'GB/s':>7} {'%BW':>5} | {'torch':>9} {'t/tf':>5} "
           f"{'torch_cl':>9} {'cl/tf':>5} | {'ort':>9} {'ort/tf':>6}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        copy_bw, triad_bw = bandwidth(threads, args.bw_reps)
        print(f"\n## {threads} thread(s): memory bandwidth copy {copy_bw:.1f} GB/s, triad {triad_bw:.1f} GB/s "
              f"({3 * BW_MIB} MiB STREAM-like, numba)")
        for batch in args.batch:
            layers = [_layer(name, _batch(name, batch), np) for name in args.layers]
            # one framework at a time over all layers (a peer's spinning worker threads never overlap
            # another's measurement), then the table
            t_tf = [med(lambda L=L: L["tf"](threads)) for L in layers]
            t_nchw, t_cl = [], []
            with torch.no_grad():
                for L in layers:
                    xt, wt, bt = (torch.from_numpy(a) for a in (L["x"], L["w"], L["b"]))
                    xc = xt.contiguous(memory_format=torch.channels_last)
                    t_nchw.append(med(lambda: L["torch"](xt, wt, bt)))
                    t_cl.append(med(lambda: L["torch"](xc, wt, bt)))
            t_ort = []
            for L in layers:
                if args.no_ort:
                    t_ort.append(float("nan"))
                    continue
                sess = _ort_session(L["ort_op"], L["x"].shape, L["w"], L["b"], L["ort_attrs"], threads)
                t_ort.append(med(lambda: sess.run(None, {"x": L["x"]})))
                del sess
            for kind, title in (("dw", f"depthwise, batch {batch} (tilefuse NCHW16c in/out; GB/s = (input + output "
                                       f"+ weights bytes) / time; %BW of the triad bandwidth)"),
                                ("up", f"conv_transpose2d 2x2 stride 2, batch {batch} (UNet decoder; tilefuse NCHW16c "
                                       f"phase kernel)")):
                rows = [i for i, L in enumerate(layers) if L["kind"] == kind]
                if not rows:
                    continue
                print(f"\n{title}\n{hdr}")
                for i in rows:
                    L, t = layers[i], t_tf[i]
                    print(f"{L['name']:<22} {L['n']:>4} {t * 1e6:>9.1f} {L['flops'] / t / 1e9:>8.1f} "
                          f"{L['bytes'] / t / 1e9:>7.1f} {100 * L['bytes'] / t / 1e9 / triad_bw:>5.0f} | "
                          f"{t_nchw[i] * 1e6:>9.1f} {t_nchw[i] / t:>5.2f} {t_cl[i] * 1e6:>9.1f} {t_cl[i] / t:>5.2f} | "
                          f"{t_ort[i] * 1e6:>9.1f} {t_ort[i] / t:>6.2f}", flush=True)
            del layers


def _batch(name: str, batch: str) -> int:
    """An integer batch as given; 'dram': the smallest batch whose input + output bytes reach DRAM_MIB."""
    if batch != "dram":
        return int(batch)
    if name in DW_LAYERS:
        c, h, k, s = DW_LAYERS[name]
        ho = (h + 2 * (k // 2) - k) // s + 1
        per_image = 4 * c * (h * h + ho * ho)
    else:
        ci, co, h = UNET_LAYERS[name]
        per_image = 4 * h * h * (ci + 4 * co)
    return max(1, -(-DRAM_MIB * (1 << 20) // per_image))


def _layer(name: str, n: int, np):
    """Inputs, weights, the tilefuse call and the peers' calls of one benchmark layer."""
    import torch
    from tilefuse.kernels.conv import depthwise, to_nchwc, transpose
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    if name in DW_LAYERS:
        c, h, k, s = DW_LAYERS[name]
        p = k // 2
        ho = (h + 2 * p - k) // s + 1
        x = rng.standard_normal((n, c, h, h)).astype(np.float32)
        w = (rng.standard_normal((c, 1, k, k)) * 0.3).astype(np.float32)
        b = rng.standard_normal(c).astype(np.float32)
        prep, xb = depthwise.prepare(w, b, c), to_nchwc(x)
        ob = np.empty((n, -(-c // 16), ho, ho, 16), np.float32)
        return dict(name=name, kind="dw", n=n, x=x, w=w, b=b, flops=2 * n * c * ho * ho * k * k,
                    bytes=4 * (n * c * h * h + n * c * ho * ho + c * k * k),
                    tf=lambda t: depthwise.run_nchwc(ob, xb, prep, stride=(s, s), padding=(p,) * 4, threads=t),
                    torch=lambda xt, wt, bt: torch.nn.functional.conv2d(xt, wt, bt, s, p, 1, c),
                    ort_op="Conv", ort_attrs=dict(group=c, kernel_shape=[k, k], pads=[p] * 4, strides=[s, s]))
    ci, co, h = UNET_LAYERS[name]
    x = rng.standard_normal((n, ci, h, h)).astype(np.float32)
    w = (rng.standard_normal((ci, co, 2, 2)) / np.sqrt(ci)).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32)
    prep, xb = transpose.prepare(w, b, 1), to_nchwc(x)
    ob = np.empty((n, -(-co // 16), 2 * h, 2 * h, 16), np.float32)
    return dict(name=name, kind="up", n=n, x=x, w=w, b=b, flops=2 * n * ci * co * h * h * 4,
                bytes=4 * (n * ci * h * h + n * co * 4 * h * h + ci * co * 4),
                tf=lambda t: transpose.run_nchwc(ob, xb, prep, stride=(2, 2), threads=t),
                torch=lambda xt, wt, bt: torch.nn.functional.conv_transpose2d(xt, wt, bt, 2),
                ort_op="ConvTranspose", ort_attrs=dict(kernel_shape=[2, 2], strides=[2, 2]))


if __name__ == "__main__":
    main()
