"""`tilefuse simulate MODEL --target T`: a zoo model (or a .tfpkg) on a model of a paper's machine.

    tilefuse simulate resnet50 --target ft-m7032 --batch 32 --cores 1,2,4,8 --set AM=1MiB --plot out.png
    tilefuse simulate tinynet --target cambricon-x --check      # execute and compare with the reference
    tilefuse simulate --list                                     # the built-in targets
    tilefuse simulate --target virtex7-690t --describe           # every number with its source
"""
from __future__ import annotations

import sys


def register(subparsers) -> None:
    from ..models import NAMES
    s = subparsers.add_parser("simulate", help="run a compiled model on a model of a seed paper's machine")
    s.add_argument("model", nargs="?", default=None,
                   help=f"zoo model ({', '.join(NAMES)}) or a .tfpkg package")
    s.add_argument("--target", default="ft-m7032", help="built-in target name or a target .toml file")
    s.add_argument("--batch", type=int, default=1)
    s.add_argument("--image-size", type=int, default=None)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--cores", default=None, help="core count, or a list 1,2,4,8 for a scaling table")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a target number: AM=1MiB, ddr=85.2GB/s, core=1.8GHz, link.ddr.efficiency=1")
    s.add_argument("--check", action="store_true",
                   help="execute the tiles and compare the outputs with the reference evaluator")
    s.add_argument("--plot", default=None, metavar="PNG", help="efficiency / scaling and time breakdown figure")
    s.add_argument("--list", action="store_true", help="list the built-in targets")
    s.add_argument("--describe", action="store_true", help="print the target's numbers with their sources")
    s.set_defaults(func=cmd_simulate)


def _overrides(items) -> dict:
    out = {}
    for it in items:
        if "=" not in it:
            raise SystemExit(f"tilefuse simulate: --set {it!r}: expected KEY=VALUE (e.g. AM=1MiB)")
        k, v = it.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def describe(tgt) -> str:
    lines = [f"{tgt.name}: {tgt.title}", f"  strategy {tgt.strategy} (seed {tgt.seed}), {tgt.dtype}, "
             f"{tgt.cores} of {tgt.max_cores} cores, peak {tgt.peak_flops() / 1e9:.1f} GFLOP/s"]
    for p in tgt.sources():
        rng = f"  [range {p.range[0]:.4g} .. {p.range[1]:.4g}]" if p.range else ""
        lines.append(f"  {p.path:<40} {p.text():>14}  {p.source}{rng}" + (f"  ({p.note})" if p.note else ""))
    return "\n".join(lines)


def cmd_simulate(args) -> int:
    import numpy as np

    from . import builtin_names, load_target, scaling, simulate
    out = sys.stdout
    if args.list:
        for name in builtin_names():
            t = load_target(name)
            print(f"{name:<14} {t.title}", file=out)
        return 0
    tgt = load_target(args.target, **_overrides(args.set))
    if args.describe:
        print(describe(tgt), file=out)
        if args.model is None:
            return 0
    if args.model is None:
        raise SystemExit("tilefuse simulate: give a MODEL (or --list / --describe)")
    import tilefuse
    net = None
    if args.model.endswith(".tfpkg"):
        compiled = tilefuse.load_package(args.model)
    else:
        kw = {"seed": args.seed, "batch": args.batch}
        if args.image_size:
            kw["image_size"] = args.image_size
        net = tilefuse.models.get(args.model, **kw)
        compiled = tilefuse.compile(net)
    cores = [int(c) for c in args.cores.split(",")] if args.cores else [tgt.cores]
    if len(cores) > 1:
        sc = scaling(compiled, tgt, cores=cores)
        print(sc.runs[cores[-1]].table(), file=out)
        print(file=out)
        print(sc.table(), file=out)
        if args.plot:
            from .plot import plot
            print(f"wrote {plot(args.plot, scaling=sc)}", file=out)
        return 0
    x = None
    if args.check:
        x = [np.random.default_rng(args.seed).standard_normal(s.shape).astype(np.dtype(s.dtype))
             for s in compiled.package.inputs] if hasattr(compiled, "package") else \
            [np.random.default_rng(args.seed).standard_normal(s.shape).astype(np.dtype(s.dtype))
             for s in compiled.inputs]
    rep = simulate(compiled, tgt, cores=cores[0], inputs=x, functional=args.check)
    print(rep.table(), file=out)
    if args.plot:
        from .plot import plot
        print(f"wrote {plot(args.plot, report=rep)}", file=out)
    if args.check:
        if net is None:
            print("check: a package has no network to evaluate; outputs computed only", file=out)
            return 0
        ref = tilefuse.evaluate(net, x)
        tol = 2e-2 if np.dtype(tgt.dtype) == np.float16 else 1e-4
        worst = max(float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-30)) for a, b in zip(rep.outputs, ref))
        ok = worst <= tol
        print(f"check vs reference evaluator: max error {worst:.3g} of the output's range "
              f"(tolerance {tol:g} for {tgt.dtype}) -> {'OK' if ok else 'MISMATCH'}", file=out)
        return 0 if ok else 1
    return 0
