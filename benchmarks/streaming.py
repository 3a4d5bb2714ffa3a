"""Streaming execution (issue 6): streamed vs layer-by-layer tilefuse vs PyTorch on large images.

    .venv/bin/python benchmarks/streaming.py                         # 1080p and 4K, both nets
    .venv/bin/python benchmarks/streaming.py --sizes 8k --modes stream    # 8K, streamed only
    .venv/bin/python benchmarks/streaming.py --sizes 8k                   # 8K everything (slow,
                                                                          # ~10 GB for layer by layer)
Networks (single image, float32, seeded weights):
  resnet18-trunk  ResNet18 without avgpool/fc (conv1 .. layer4), BN folded by the passes
  vgg-stack       VGG-style 3x3 stack 16,16,M,32,32,M,64,64,M,128,128 (channels reduced from
                  VGG's 64..512 so that layer-by-layer and PyTorch fit at 4K on this machine)
Modes (":B" after a stream mode overrides --band for it, e.g. stream:8):
  stream   tilefuse.stream.compile_stream(net, band_rows=B).run(x): a Session of the streamed
           program, one stream, every band's conv on the fast kernels of kernels/conv with all
           cores (threads=None)
  pipe2    the same with workers=2: the layer pipeline, 2 cost-balanced stages, kernels 1 thread each
  stream-nchw, pipe2-nchw   the same with layout="nchw": NCHW rings, every band through conv2d_run
           (the first version, for comparison; the default rings are NCHW16c)
  stream-wide   stream with min_band_pixels=480 (narrow deep layers take 2-4x the rows per step)
  lbl      layer by layer: tilefuse.Session(tilefuse.compile(net)).run(x)
  torch    the same optimized network (BN folded) run op by op with torch.nn.functional,
           torch.inference_mode, torch's default threads
Every (net, size, mode) runs in its own subprocess, so peak RSS (VmHWM) belongs to that case
alone; VmHWM is reset (/proc/self/clear_refs) just before the first run. "peak" is VmHWM at the
end, "run added" is VmHWM minus the RSS just before the first run (after building the network,
the weights and the input): the memory the runs themselves added, buffers first touched included.
Time is the best of --repeat runs after one warm-up run. Outputs are checked against the
layer-by-layer result at 1080p (max abs error / max abs value).

--interleave: timing only, in one process per (net, size): layer by layer and every stream mode
run in turn, --repeat rounds, medians and best; on a shared machine compare these ratios, not
times from different subprocesses.

--old TREE: old vs new (issue 12 moved streaming into the compiler and the runtime): every
stream mode on the tilefuse at TREE and on this tree, one resident worker process each, timed
runs alternating between them (--repeat rounds, who goes first alternating too); medians of wall
and process CPU time (all threads; on a loaded machine the fairer measure of the work done) and
their ratios, each worker's peak RSS and what its runs added, the plan's activation bytes, and
whether the outputs agree:

    git worktree add /tmp/tilefuse-old <commit before issue 12 phase 2>
    PYTHONPATH=. python benchmarks/streaming.py --old /tmp/tilefuse-old --sizes 1080p,4k \
        --modes stream,pipe2 --repeat 5

Part 2: line-buffer vs tiled filter on 4K uint8 frames (3x3 and 5x5 integer kernels, 1 and 2
workers), ms per frame, median of 10, checked equal.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

SIZES = {"1080p": (1080, 1920), "4k": (2160, 3840), "8k": (4320, 7680), "small": (270, 480)}
MODES = ("stream", "stream:8", "pipe2", "lbl", "torch")
NETS = ("resnet18-trunk", "vgg-stack")


def build(name: str, hw):
    import tilefuse
    from tilefuse.ir import Network
    from tilefuse.stream.netutil import trunk
    if name == "resnet18-trunk":
        return trunk(tilefuse.models.resnet18(seed=0), (1, 3) + tuple(hw))
    rng = np.random.default_rng(0)
    net = Network("vgg-stack")
    y = net.input("x", (1, 3) + tuple(hw))
    for i, v in enumerate([16, 16, "M", 32, 32, "M", 64, 64, "M", 128, 128]):
        if v == "M":
            y = net.max_pool(y, 2, stride=2, name=f"pool{i}")
            continue
        c = y.shape[1]
        w = (rng.standard_normal((v, c, 3, 3)) * np.sqrt(2.0 / (9 * c))).astype(np.float32)
        y = net.relu(net.conv2d(y, w, rng.uniform(-0.1, 0.1, v).astype(np.float32), padding=1, name=f"conv{i}"))
    net.output(y)
    return net


def rss_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak() -> int:
    """Reset VmHWM to the current RSS (Linux >= 4.0), so the peak is the runs' own; the RSS now."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return rss_bytes("VmRSS")


def torch_runner(net):
    """Run the optimized network op by op with torch.nn.functional."""
    import torch
    import torch.nn.functional as F

    from tilefuse.compiler.passlist import run_passes
    opt, _ = run_passes(net)
    consts = {d.name: torch.from_numpy(np.array(d.value)) for d in opt.constants()}

    def run(x):
        env = {opt.inputs[0].name: torch.from_numpy(x)}
        with torch.inference_mode():
            for op in opt.ops:
                p = op.params
                ins = [consts[d.name] if d.is_constant else env[d.name] for d in op.inputs]
                if op.op == "conv2d":
                    t, b, l, r = p["padding"]
                    xin = ins[0] if (t, b, l, r) == (0,) * 4 else F.pad(ins[0], (l, r, t, b))
                    if t == b and l == r:
                        xin, pad = ins[0], (t, l)
                    else:
                        pad = 0
                    y = F.conv2d(xin, ins[1], ins[2] if p["has_bias"] else None, p["stride"], pad,
                                 p["dilation"], p["groups"])
                    if p["has_residual"]:
                        y += ins[-1]
                    if p["relu"]:
                        y.relu_()
                elif op.op == "max_pool":
                    y = F.max_pool2d(ins[0], p["kernel_size"], p["stride"], p["padding"][0], p["dilation"],
                                     ceil_mode=p["ceil_mode"])
                elif op.op == "relu":
                    y = F.relu(ins[0])
                elif op.op == "add":
                    y = ins[0] + ins[1]
                    if p["relu"]:
                        y.relu_()
                else:
                    raise NotImplementedError(op.op)
                env[op.outputs[0].name] = y
        return env[opt.outputs[0].name].numpy()
    return run


def parse_mode(mode: str, band: int):
    name, _, b = mode.partition(":")
    return name, int(b) if b else band


def make_runner(net, mode: str, band: int):
    """(run function, info dict) for one mode. Works on this tree and on a tree from before
    issue 12 (`--old`): `compile_stream(...).run` is a StreamedNetwork there, a
    CompiledNetwork run by a Session here; the plan's stream part is `.stream` here."""
    name, band = parse_mode(mode, band)
    if name in ("stream", "pipe2", "stream-nchw", "pipe2-nchw", "stream-wide"):
        from tilefuse.stream import compile_stream
        s = compile_stream(net, band_rows=band, workers=2 if name.startswith("pipe2") else 1,
                           layout="nchw" if name.endswith("-nchw") else "nchwc",
                           min_band_pixels=480 if name == "stream-wide" else 0)
        p = s.plan()
        p = getattr(p, "stream", None) or p
        if hasattr(s, "session"):           # constants on the device before the runs are measured
            s.session().copy_constants()
        return s.run, {"plan_streamed_bytes": p.streamed_bytes, "plan_lbl_bytes": p.layer_by_layer_bytes}
    if name == "lbl":
        import tilefuse
        sess = tilefuse.Session(tilefuse.compile(net))
        sess.copy_constants()
        return sess.run, {}
    return torch_runner(net), {}


def interleave(net_name: str, size: str, modes: list[str], repeat: int, band: int) -> list[str]:
    hw = SIZES[size]
    net = build(net_name, hw)
    x = np.random.default_rng(1).standard_normal((1, 3) + hw, dtype=np.float32)
    fns = {m: make_runner(net, m, band)[0] for m in modes}
    ts = {m: [] for m in modes}
    for f in fns.values():
        f(x)
    for _ in range(repeat):
        for m, f in fns.items():
            t = time.perf_counter()
            f(x)
            ts[m].append(time.perf_counter() - t)
    base = float(np.median(ts["lbl"])) if "lbl" in ts else None
    rows = []
    for m in modes:
        med = float(np.median(ts[m]))
        ratio = f"{med / base:.2f}" if base else ""
        rows.append(f"| {net_name} | {size} | {m} | {med:.2f} | {min(ts[m]):.2f} | {ratio} |")
    return rows


def first_run(net_name: str, size: str, mode: str, band: int):
    """Build the case, reset the peak RSS, run once: (net, x, run function, info, RSS before the
    run, output, seconds of the first run)."""
    net = build(net_name, SIZES[size])
    # float32 directly: a float64 temporary would set the peak RSS before the run starts
    x = np.random.default_rng(1).standard_normal((1, 3) + SIZES[size], dtype=np.float32)
    fn, info = make_runner(net, mode, band)
    base = reset_peak()
    t = time.perf_counter()
    y = fn(x)
    return net, x, fn, info, base, y, time.perf_counter() - t


def run_case(net_name: str, size: str, mode: str, repeat: int, band: int) -> dict:
    net, x, fn, info, base, y, first = first_run(net_name, size, mode, band)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        y = fn(x)
        times.append(time.perf_counter() - t)
    out = {"net": net_name, "size": size, "mode": mode, "first_s": first, "time_s": min(times or [first]),
           "peak_bytes": rss_bytes("VmHWM"), "base_bytes": base, "out_shape": list(y.shape), **info}
    if size in ("1080p", "small") and not mode.startswith("lbl"):
        import tilefuse
        ref = tilefuse.Session(tilefuse.compile(net)).run(x)
        out["max_err_rel"] = float(np.max(np.abs(y - ref)) / max(1e-30, float(np.max(np.abs(ref)))))
    return out


def serve(net_name: str, size: str, mode: str, band: int) -> int:
    """A worker for --old: build the case, then run it once per "run" line on stdin, printing
    the seconds; "stats" prints the peak RSS and what the runs added to it (JSON lines)."""
    net, x, fn, info, base, y, first = first_run(net_name, size, mode, band)
    print(json.dumps({"ready": True, "first_s": first, "sum": float(np.sum(y, dtype=np.float64)), **info}),
          flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "run":
            t, c = time.perf_counter(), time.process_time()
            fn(x)
            print(json.dumps({"s": time.perf_counter() - t, "cpu": time.process_time() - c}), flush=True)
        elif cmd == "stats":
            print(json.dumps({"peak_bytes": rss_bytes("VmHWM"), "base_bytes": base}), flush=True)
        else:
            break
    return 0


def old_vs_new(old_tree: str, nets, sizes, modes, repeat: int, band: int) -> list[str]:
    """The same cases on a tree from before issue 12 (`old_tree`, e.g. a git worktree of main at
    that point) and on this one: one resident worker process per tree and case, the timed runs
    alternating old, new, old, new, ... so both see the same machine load."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows = ["| net | size | mode | old median s | new median s | new / old | CPU s old / new | CPU new / old | "
            "old peak / run added MiB | new peak / run added MiB | plan MiB old / new | outputs equal |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    mib = 2.0 ** 20
    print("\n".join(rows), flush=True)
    for net_name in nets:
        for size in sizes:
            for mode in modes:
                procs, ready = {}, {}
                for tag, tree in (("old", old_tree), ("new", here)):
                    env = dict(os.environ, PYTHONPATH=tree)
                    if mode.startswith("pipe2"):
                        env["OPENBLAS_NUM_THREADS"] = "1"
                    procs[tag] = subprocess.Popen(
                        [sys.executable, os.path.abspath(__file__), "--serve", f"{net_name},{size},{mode}", "--band",
                         str(band)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=tree)
                    ready[tag] = json.loads(procs[tag].stdout.readline())
                ts, cpu = {"old": [], "new": []}, {"old": [], "new": []}
                for r in range(repeat):
                    for tag in (("old", "new") if r % 2 == 0 else ("new", "old")):   # alternate who goes first
                        procs[tag].stdin.write("run\n")
                        procs[tag].stdin.flush()
                        got = json.loads(procs[tag].stdout.readline())
                        ts[tag].append(got["s"])
                        cpu[tag].append(got["cpu"])
                stats = {}
                for tag, p in procs.items():
                    p.stdin.write("stats\nquit\n")
                    p.stdin.flush()
                    stats[tag] = json.loads(p.stdout.readline())
                    p.wait()
                med = {k: float(np.median(v)) for k, v in ts.items()}
                mcpu = {k: float(np.median(v)) for k, v in cpu.items()}
                mem = {k: f"{v['peak_bytes'] / mib:.0f} / {(v['peak_bytes'] - v['base_bytes']) / mib:.0f}"
                       for k, v in stats.items()}
                plan = " / ".join(f"{ready[k].get('plan_streamed_bytes', 0) / mib:.1f}" for k in ("old", "new"))
                same = abs(ready["old"]["sum"] - ready["new"]["sum"]) <= 1e-6 * max(1.0, abs(ready["old"]["sum"]))
                rows.append(f"| {net_name} | {size} | {mode} | {med['old']:.3f} | {med['new']:.3f} | "
                            f"{med['new'] / med['old']:.3f} | {mcpu['old']:.2f} / {mcpu['new']:.2f} | "
                            f"{mcpu['new'] / mcpu['old']:.3f} | {mem['old']} | {mem['new']} | {plan} | {same} |")
                print(rows[-1], flush=True)
    return rows


def filter_bench() -> list[str]:
    from tilefuse.imaging import filter2d
    from tilefuse.imaging.linebuffer import filter2d_linebuffer
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (2160, 3840)).astype(np.uint8)
    rows = ["| kernel | workers | line buffer ms | tiled filter2d ms | equal |", "|---|---|---|---|---|"]
    for k in (3, 5):
        ker = rng.integers(-4, 5, (k, k)).astype(np.int32)
        for wk in (1, 2):
            res = {}
            for name, f in (("lb", lambda: filter2d_linebuffer(img, ker, workers=wk)),
                            ("tiled", lambda: filter2d(img, ker, workers=wk))):
                out = f()
                ts = []
                for _ in range(10):
                    t = time.perf_counter()
                    f()
                    ts.append(time.perf_counter() - t)
                res[name] = (1e3 * float(np.median(ts)), out)
            eq = np.array_equal(res["lb"][1], res["tiled"][1])
            rows.append(f"| {k}x{k} | {wk} | {res['lb'][0]:.2f} | {res['tiled'][0]:.2f} | {eq} |")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--sizes", default="1080p,4k")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--band", type=int, default=4)
    ap.add_argument("--interleave", action="store_true", help="timing ratios in one process (see above)")
    ap.add_argument("--repeat", type=int, default=0, help="timed runs after the warm-up (default: 2, 1 at 8K)")
    ap.add_argument("--no-filter", action="store_true")
    ap.add_argument("--old", metavar="TREE", help="old vs new: this tree against the tilefuse checkout at TREE "
                    "(e.g. `git worktree add /tmp/old <commit before issue 12>`), timed runs interleaved")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        net_name, size, mode = args.serve.split(",")
        return serve(net_name, size, mode, args.band)
    if args.old:
        modes = [m for m in args.modes.split(",") if m not in ("lbl", "torch")]
        print("| old tree:", args.old, "| machine:", os.cpu_count(), "cores, load average", os.getloadavg())
        old_vs_new(args.old, args.nets.split(","), args.sizes.split(","), modes, args.repeat or 5, args.band)
        return 0
    if args.case:
        net_name, size, mode = args.case.split(",")
        rep = args.repeat or (1 if size == "8k" else 2)
        print(json.dumps(run_case(net_name, size, mode, rep, args.band)))
        return 0
    mib = 2.0 ** 20
    from tilefuse.kernels.threads import blas_info
    print(f"machine: {os.cpu_count()} cores; load average {os.getloadavg()}; OpenBLAS core {blas_info()}; "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')}", flush=True)
    if args.interleave:
        print("| net | size | mode | median s | best s | median / lbl median |")
        print("|---|---|---|---|---|---|")
        for net_name in args.nets.split(","):
            for size in args.sizes.split(","):
                modes = [m for m in args.modes.split(",") if m != "torch"]
                for row in interleave(net_name, size, modes, args.repeat or 5, args.band):
                    print(row, flush=True)
        return 0
    print("| net | size | mode | time s | first run s | peak RSS MiB | run added MiB | plan act. MiB "
          "(stream / lbl) | check |")
    print("|---|---|---|---|---|---|---|---|---|")
    for net_name in args.nets.split(","):
        for size in args.sizes.split(","):
            for mode in args.modes.split(","):
                cmd = [sys.executable, __file__, "--case", f"{net_name},{size},{mode}", "--band", str(args.band)]
                if args.repeat:
                    cmd += ["--repeat", str(args.repeat)]
                env = dict(os.environ)
                if mode.startswith("pipe2"):
                    env["OPENBLAS_NUM_THREADS"] = "1"
                p = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if p.returncode != 0:
                    print(f"| {net_name} | {size} | {mode} | failed: {p.stderr.strip().splitlines()[-1:]} |||||", flush=True)
                    continue
                r = json.loads(p.stdout.strip().splitlines()[-1])
                plan = (f"{r['plan_streamed_bytes'] / mib:.0f} / {r['plan_lbl_bytes'] / mib:.0f}"
                        if "plan_streamed_bytes" in r else "")
                chk = f"{r['max_err_rel']:.1e}" if "max_err_rel" in r else ""
                print(f"| {net_name} | {size} | {mode} | {r['time_s']:.2f} | {r['first_s']:.2f} | "
                      f"{r['peak_bytes'] / mib:.0f} | {(r['peak_bytes'] - r['base_bytes']) / mib:.0f} | {plan} | {chk} |",
                      flush=True)
    if not args.no_filter:
        print()
        print("\n".join(filter_bench()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
