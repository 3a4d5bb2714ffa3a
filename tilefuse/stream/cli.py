"""Pieces for `tilefuse run MODEL --input-size HxW --schedule stream` (wired in tilefuse/cli.py).

    net = model_for_input("resnet18", (2160, 3840), batch=1, seed=0)
    report = stream_run_report(net, x, band_rows=4, workers=1)
    print(format_report(report))

Peak memory is the process's peak resident set (VmHWM in /proc/self/status; it only grows over
a process's life, so measure one schedule per process for honest numbers) and, with
`trace=True`, the peak of Python/numpy allocations during the run (tracemalloc).
"""
from __future__ import annotations

import time

import numpy as np

from ..errors import GraphError
from ..ir import Network


def parse_size(text: str) -> tuple[int, int]:
    """'2160x3840' -> (2160, 3840) (height x width)."""
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--input-size: found {text!r}, expected HxW such as 2160x3840") from None
    if h < 1 or w < 1:
        raise ValueError(f"--input-size: found {text!r}, expected positive sizes")
    return h, w


SIZED_MODELS = ("unet", "deeplabv3")   # zoo builders taking image_size=(H, W)


def model_for_input(name: str, size: tuple[int, int], batch: int = 1, seed: int = 0) -> Network:
    """Zoo model `name` for an (H, W) input: the whole network when its head accepts the size
    (ResNets: global pooling), else its fully convolutional trunk (VGG/AlexNet: the head's
    fixed 7x7 / 6x6 adaptive pooling feeds a fixed-size linear layer)."""
    from .. import models
    from .netutil import trunk, with_input_shape
    if name in SIZED_MODELS:          # sizes flow into their params (resize targets, decoder pads)
        return models.get(name, seed=seed, batch=batch, image_size=tuple(size))
    net = models.get(name, seed=seed, batch=batch)
    shape = (batch, net.inputs[0].shape[1], size[0], size[1])
    try:
        return with_input_shape(net, shape)
    except GraphError:
        return trunk(net, shape)


def peak_rss_bytes() -> int:
    """VmHWM: this process's peak resident set so far (0 where /proc is missing)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def stream_run_report(net: Network, x: np.ndarray, band_rows: int = 4, workers: int = 1,
                      repeat: int = 1, trace: bool = False) -> dict:
    """Compile `net` for streaming, run it once (timed as the first run: JIT, first touch of
    memory), then `repeat` more times (time_s is the best), and report time and memory."""
    import tracemalloc

    from . import compile_stream
    t = time.perf_counter()
    s = compile_stream(net, band_rows=band_rows, workers=workers)
    compile_s = time.perf_counter() - t
    plan = s.plan().stream
    t = time.perf_counter()
    y = s.run(x)
    first_s = time.perf_counter() - t
    times = []
    traced_peak = 0
    for i in range(max(repeat, 0)):
        if trace and i == 0:
            tracemalloc.start()
        t = time.perf_counter()
        y = s.run(x)
        times.append(time.perf_counter() - t)
        if trace and i == 0:
            traced_peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    outs = y if isinstance(y, list) else [y]
    return {
        "compile_s": compile_s, "first_run_s": first_s,
        "time_s": min(times) if times else first_s, "times_s": times,
        "peak_rss_bytes": peak_rss_bytes(), "traced_peak_bytes": traced_peak,
        "plan": plan, "output_shapes": [o.shape for o in outs], "outputs": outs,
        "streamed_ops": len(s.schedule.layers), "tail_ops": [op.name for op in s.schedule.tail],
        "band_rows": band_rows, "workers": workers,
    }


def format_report(r: dict) -> str:
    mib = 2.0 ** 20
    p = r["plan"]
    lines = [
        f"schedule stream: {r['streamed_ops']} ops streamed in bands of {r['band_rows']} rows, "
        f"workers {r['workers']}; tail on whole tensors: {', '.join(r['tail_ops']) or 'none'}",
        *(f"streamed part ends at '{n}' ({o}): {w}" for n, o, w in p.ends),
        f"activation memory (plan): streamed {p.streamed_bytes / mib:.1f} MiB vs layer by layer "
        f"{p.layer_by_layer_bytes / mib:.1f} MiB (layer by layer / streamed = {p.reduction:.1f})",
        f"time: first run {r['first_run_s']:.3f} s, best of {len(r['times_s'])} {r['time_s']:.3f} s; "
        f"compile {r['compile_s']:.2f} s",
        f"peak memory: process RSS {r['peak_rss_bytes'] / mib:.1f} MiB"
        + (f", traced numpy/Python peak {r['traced_peak_bytes'] / mib:.1f} MiB" if r["traced_peak_bytes"] else ""),
        f"outputs: {', '.join(str(s) for s in r['output_shapes'])}",
    ]
    return "\n".join(lines)


def add_stream_arguments(parser) -> None:
    """The options `tilefuse run` needs for streaming (call on the `run` subparser)."""
    parser.add_argument("--input-size", default=None, metavar="HxW",
                        help="input height x width, e.g. 2160x3840 (zoo models are rebuilt for it; "
                             "a head that cannot take it is dropped, leaving the trunk)")
    parser.add_argument("--schedule", choices=("layer", "stream"), default="layer",
                        help="layer: whole feature maps, layer by layer (default); stream: bands of "
                             "rows flow through the network, a few rows per layer in memory")
    parser.add_argument("--band-rows", type=int, default=4, help="stream: output rows per band and layer (default 4)")
    parser.add_argument("--stream-workers", type=int, default=1,
                        help="stream: >1 runs the layer pipeline with that many FLOP-balanced stages")


def run_stream_command(args, out=None) -> int:
    """`tilefuse run MODEL --schedule stream [--input-size HxW]`: build, compile for streaming,
    run (`args.inputs` timed runs after a first run), print time and peak memory; with
    `not args.no_check` compare with the reference evaluator (skipped above 1024x1024 inputs,
    where the reference's whole-map im2col needs GBs)."""
    import sys
    out = out or sys.stdout
    size = parse_size(args.input_size) if args.input_size else None
    t = time.perf_counter()
    if size is None:
        from .. import models
        kw = {"seed": args.seed, "batch": args.batch}
        if getattr(args, "image_size", None):
            kw["image_size"] = args.image_size
        net = models.get(args.model, **kw)
    else:
        net = model_for_input(args.model, size, batch=args.batch, seed=args.seed)
    print(f"model {args.model}: input {net.inputs[0].shape}, {len(net.ops)} ops, outputs "
          f"{[d.shape for d in net.outputs]}, built in {time.perf_counter() - t:.2f} s", file=out)
    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal(net.inputs[0].shape).astype(np.float32)
    r = stream_run_report(net, x, band_rows=getattr(args, "band_rows", 4),
                          workers=getattr(args, "stream_workers", 1), repeat=max(getattr(args, "inputs", 1), 1))
    print(format_report(r), file=out)
    if getattr(args, "verbose", False):
        print(str(r["plan"]), file=out)
    h, w = net.inputs[0].shape[2:]
    if not getattr(args, "no_check", False) and h * w <= 1024 * 1024:
        from ..interpreter import evaluate
        ref = evaluate(net, x)
        worst = max(float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))
                    for a, b in zip(r["outputs"], ref))
        ok = worst <= 1e-4
        print(f"check vs reference evaluator: max error {worst:.2e} (relative to max |ref|): "
              f"{'ok' if ok else 'MISMATCH'}", file=out)
        return 0 if ok else 1
    return 0
