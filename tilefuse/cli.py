"""Command line: `tilefuse run | compile | inspect | filter | train`."""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def _model(name: str, batch: int, image_size: int | None, seed: int):
    from . import models
    kw = {"seed": seed, "batch": batch}
    if image_size:
        kw["image_size"] = image_size
    return models.get(name, **kw)


def _describe_plan(compiled, out) -> None:
    plan = compiled.plan()
    algos: dict[str, int] = {}
    for r in plan.rows:
        key = r["kernel"] + (f"[{r['algorithm']}]" if r["algorithm"] != "-" else "")
        algos[key] = algos.get(key, 0) + 1
    print(f"plan: {len(plan.rows)} instructions, {plan.total_flops / 1e9:.2f} GFLOP per run", file=out)
    print("      " + ", ".join(f"{k} x{v}" for k, v in sorted(algos.items())), file=out)
    print(f"      passes: {'; '.join(plan.passes)}", file=out)
    saved = 1 - plan.hidden_bytes / plan.hidden_naive_bytes if plan.hidden_naive_bytes else 0
    print(f"memory: constants {plan.const_bytes / 2**20:.1f} MiB, hidden {plan.hidden_bytes / 2**20:.1f} MiB "
          f"(naive {plan.hidden_naive_bytes / 2**20:.1f} MiB, {100 * saved:.0f}% shared), "
          f"IO addresses {plan.io_bytes} B", file=out)


def cmd_run(args) -> int:
    if getattr(args, "schedule", "layer") == "stream":
        from .stream.cli import run_stream_command
        return run_stream_command(args)
    import tilefuse
    from .runtime import Session
    out = sys.stdout
    rng = np.random.default_rng(args.seed)
    if args.model.endswith(".tfpkg"):
        pkg = tilefuse.load_package(args.model)
        compiled, net = pkg, None
        print(f"package {args.model}: {pkg.name}", file=out)
    else:
        t = time.perf_counter()
        if getattr(args, "input_size", None):
            from .stream.cli import model_for_input, parse_size
            net = model_for_input(args.model, parse_size(args.input_size), batch=args.batch, seed=args.seed)
        else:
            net = _model(args.model, args.batch, args.image_size, args.seed)
        print(f"model {args.model}: batch {args.batch}, input {net.inputs[0].shape}, "
              f"{len(net.ops)} ops, built in {time.perf_counter() - t:.2f} s", file=out)
        compiled = tilefuse.compile(net, winograd=not args.no_winograd, algorithm=args.algorithm,
                                    threads=args.threads, tune=args.tune, layout=args.layout)
        print(f"compiled in {compiled.compile_seconds:.2f} s" + (" (tuned)" if args.tune else ""), file=out)
        _describe_plan(compiled, out)
        if args.plan:
            print(compiled.plan(), file=out)
    sess = Session(compiled, threads=args.threads)
    t = time.perf_counter()
    sess.copy_constants()
    print(f"constants copied once: {sess.package.const_bytes / 2**20:.1f} MiB in "
          f"{time.perf_counter() - t:.3f} s", file=out)
    shapes = [(s.shape, s.dtype) for s in sess.package.inputs]
    xs = [[rng.standard_normal(sh).astype(dt) for sh, dt in shapes] for _ in range(args.inputs)]
    jit = sess.warmup()  # numba compiles, or loads its on-disk cache, on the first call
    t = time.perf_counter()
    sess.run(xs[0])
    single = time.perf_counter() - t
    t = time.perf_counter()
    ys = sess.run_many(xs, depth=args.depth, progress=args.inputs > 4 and sys.stderr.isatty())
    dt = time.perf_counter() - t
    st = sess.last_stats
    n_img = args.inputs * shapes[0][0][0]
    print(f"first call (JIT / cache load) {jit:.3f} s; one run {single:.3f} s; {args.inputs} runs through "
          f"the 3-stage pipeline in "
          f"{dt:.3f} s: {1e3 * dt / args.inputs:.1f} ms per run, {n_img / dt:.1f} images/s", file=out)
    print(f"stages per run: " + ", ".join(f"{nm} {1e3 * s / max(st.items, 1):.2f} ms"
                                          for nm, s in zip(st.stage_names, st.stage_seconds)), file=out)
    from .stream.cli import peak_rss_bytes
    print(f"peak memory (RSS) {peak_rss_bytes() / 2**20:.0f} MiB", file=out)
    if net is not None and not args.no_check:
        from .interpreter import evaluate
        t = time.perf_counter()
        ref = evaluate(net, xs[0])
        got = ys[0] if isinstance(ys[0], list) else [ys[0]]
        worst = 0.0
        ok = True
        for a, b in zip(got, ref):
            err = float(np.max(np.abs(a - b)))
            tol = args.atol + args.rtol * float(np.max(np.abs(b)))
            worst = max(worst, err)
            ok &= err <= tol and np.array_equal(np.argmax(a.reshape(a.shape[0], -1), 1),
                                                np.argmax(b.reshape(b.shape[0], -1), 1))
        print(f"check vs reference evaluator ({time.perf_counter() - t:.2f} s): max abs error {worst:.3g}, "
              f"top-1 {'matches' if ok else 'DIFFERS'} -> {'OK' if ok else 'MISMATCH'}", file=out)
        if not ok:
            return 1
    return 0


def cmd_compile(args) -> int:
    import tilefuse
    net = _model(args.model, args.batch, args.image_size, args.seed)
    compiled = tilefuse.compile(net, winograd=not args.no_winograd, algorithm=args.algorithm,
                                threads=args.threads, tune=args.tune, layout=args.layout)
    path = compiled.save(args.output)
    _describe_plan(compiled, sys.stdout)
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB)")
    return 0


def cmd_inspect(args) -> int:
    import tilefuse
    pkg = tilefuse.load_package(args.file)
    print(f"package '{pkg.name}' ({args.file}): valid")
    print(f"tags: constants {pkg.const_bytes} B (program {pkg.program_size} B), hidden {pkg.hidden_bytes} B, "
          f"IO addresses {pkg.io_bytes} B")
    for s in pkg.io:
        print(f"  {s.kind:<6} {s.name:<28} {tuple(s.shape)} {np.dtype(s.dtype)} (IO slot +{s.offset})")
    prog = pkg.program()
    print(f"program: {len(prog)} instructions")
    limit = len(prog) if args.all else min(len(prog), 20)
    for i, ins in enumerate(prog[:limit]):
        algo = ins.params.get("algorithm")
        kernel, held = ins.kernel, ""
        if kernel == "band":                     # a streamed layer: its op, the rows its output holds
            kernel = f"band:{ins.params['op']}"
            algo = ins.params["attrs"].get("algorithm")
            n, c, h, w, cap, kind = ins.params["tensors"][-1]
            held = "  whole" if kind == 0 else f"  rows held {cap}/{h}" + (" NCHW16c" if kind == 2 else "")
        print(f"  {i:>3} {kernel:<18}{'[' + algo + ']' if algo else '':<12} -> {ins.output.name} "
              f"{ins.output.shape}{held}")
    if limit < len(prog):
        print(f"  ... {len(prog) - limit} more (--all to list them)")
    for i, ins in enumerate(prog):
        if ins.kernel == "stream":
            p = ins.params
            rings = [b for b in prog[i + 1:i + 1 + p["layers"]] if b.params["tensors"][-1][5] != 0]
            ring_bytes = sum(b.output.nbytes for b in rings)
            print(f"stream region at {i}: {p['layers']} layers in bands of {p['band_rows']} rows "
                  f"({ins.operands[0].shape[0]} steps, {p['workers']} stage(s)); {len(rings)} ring(s), "
                  f"{ring_bytes / 2**20:.2f} MiB of rows held in the hidden segment")
    consts = [b for b in pkg.blocks if b.segment == "const"]
    print(f"constant blocks: {len(consts)}; hidden blocks: {len(pkg.blocks) - len(consts)}")
    return 0


SUBCOMMAND_MODULES = ("tilefuse.imaging.cli", "tilefuse.training.cli", "tilefuse.targets.cli",
                      "tilefuse.distributed.cli", "tilefuse.profile")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tilefuse", description="Compile CNNs once, run them many times.")
    sub = p.add_subparsers(dest="command", required=True)

    def model_args(q, default="resnet50"):
        q.add_argument("model", nargs="?" if default else None, default=default,
                       help="zoo model (alexnet, vgg16, resnet18, resnet50, tinynet) or, for run, a .tfpkg")
        q.add_argument("--batch", type=int, default=1)
        q.add_argument("--image-size", type=int, default=None, help="input H = W (default: the model's)")
        q.add_argument("--seed", type=int, default=0)
        q.add_argument("--no-winograd", action="store_true", help="never pick Winograd for 3x3 convs")
        q.add_argument("--algorithm", default=None,
                       help="force one conv algorithm (gemm1x1, direct, winograd2, winograd4, im2col, reference)")
        q.add_argument("--threads", type=int, default=None, help="kernel threads (default: all cores)")
        q.add_argument("--tune", action="store_true",
                       help="measure the conv algorithms per layer on this machine (cached in ~/.cache/tilefuse)")
        q.add_argument("--layout", choices=("auto", "nchw"), default="auto",
                       help="auto: NCHW16c between layers with blocked kernels; nchw: plain NCHW everywhere")

    r = sub.add_parser("run", help="compile, copy constants once, run inputs, check against the reference")
    model_args(r)
    r.add_argument("--inputs", type=int, default=8, help="number of inputs to run (default 8)")
    r.add_argument("--depth", type=int, default=3, help="IO buffer sets in flight")
    r.add_argument("--plan", action="store_true", help="print the full per-instruction plan")
    r.add_argument("--no-check", action="store_true")
    r.add_argument("--rtol", type=float, default=1e-3)
    r.add_argument("--atol", type=float, default=1e-4)
    from .stream.cli import add_stream_arguments
    add_stream_arguments(r)  # --input-size HxW, --schedule {layer,stream}, --band-rows, --stream-workers
    r.set_defaults(func=cmd_run)

    c = sub.add_parser("compile", help="compile a zoo model into a .tfpkg package")
    model_args(c, default=None)
    c.add_argument("-o", "--output", required=True)
    c.set_defaults(func=cmd_compile)

    i = sub.add_parser("inspect", help="validate a .tfpkg and print its contents")
    i.add_argument("file")
    i.add_argument("--all", action="store_true")
    i.set_defaults(func=cmd_inspect)

    # subcommands that live with their subsystem: each module has `register(subparsers)`; a module
    # that is not there (yet) is skipped, a module that fails to import is an error
    import importlib
    for mod in SUBCOMMAND_MODULES:
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name is not None and (mod + ".").startswith(e.name + "."):
                continue
            raise
        m.register(sub)
    return p


def main(argv=None) -> int:
    from .errors import TilefuseError
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TilefuseError as e:
        print(f"tilefuse: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
