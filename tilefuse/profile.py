"""`tilefuse profile MODEL [--threads N] [--batch B] [--plot out.png]`: where a network's time goes.

For every instruction of the compiled program: the kernel, the conv algorithm, the partitioning
and task count it runs with (the plan, for the thread count), its time (the best of --repeat
runs: the least disturbed by other work on the machine), GFLOP/s and the share of the measured peak (`kernels.isa.measure_peak()`, one core's
float32 FMA peak, times the thread count). Winograd rows count the direct convolution's FLOPs
(the work they replace), so their "GFLOP/s" can exceed what the multiply stage runs at. The
last row is the overhead between kernels, measured inside every timed pass: the pass's wall time
minus the sum of its own kernel calls (the Python loop, operand address resolution, the thread
hand-offs not inside a kernel's call), the median over the passes. The total is the best untimed
pass; it need not equal the sum of the rows plus the overhead, since each row is its own best of
--repeat runs (on a busy machine the rows' sum is the more optimistic). A fused chain's row and a stem conv's
row whose max pool runs inside it (kernels/stem_pool.py) hold the time and FLOPs of what they cover; the
covered rows say "fused". --plot writes the rows as a PNG bar chart (tilefuse/barchart.py, no plotting
library needed).

    profile(compiled_or_network, threads=None, repeat=10) -> Profile
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Profile:
    name: str
    rows: list[dict]
    total_seconds: float          # best whole compute (Session.compute)
    threads: int
    peak_core: float              # measured single-core FLOP/s
    target: dict = field(default_factory=dict)
    between_seconds: float | None = None   # median over the timed passes of (pass time - its kernel calls)

    @property
    def kernel_seconds(self) -> float:
        return sum(r["seconds"] for r in self.rows)

    @property
    def overhead_seconds(self) -> float:
        """The time between kernels: measured inside each timed pass (its wall time minus its own kernel
        calls, the median over the passes). total - (sum of per-instruction bests) is not it: each row's
        best is the least disturbed of --repeat runs, so on a busy machine that difference also holds the
        noise the rows left out (1.65 ms against a measured 0.3 for MobileNetV2 on 2 noisy cores)."""
        if self.between_seconds is not None:
            return self.between_seconds
        return self.total_seconds - self.kernel_seconds

    @property
    def peak(self) -> float:
        return self.peak_core * self.threads

    def __str__(self) -> str:
        t = self.target
        # columns as wide as their longest entry (squeeze_excitation, "Co split, x scaled"), at least the header's
        kw = max([12] + [len(r["kernel"]) for r in self.rows])
        aw = max([10] + [len(r["algorithm"]) + 1 for r in self.rows])
        pw = max([24] + [len(r["partitioning"]) for r in self.rows])
        head = (f"{'#':>3} {'kernel':<{kw}} {'algorithm':<{aw}} {'partitioning':<{pw}} {'tasks':>5} {'output':<22} "
                f"{'ms':>8} {'GFLOP/s':>8} {'%peak':>6}")
        lines = [f"{self.name}: {t.get('cpu_model')} ({t.get('llvm_cpu')}), {t.get('vector_bits')}-bit vectors, "
                 f"{self.threads} threads; measured peak {self.peak_core / 1e9:.1f} GFLOP/s per core, "
                 f"{self.peak / 1e9:.1f} for {self.threads}", head, "-" * len(head)]
        for r in self.rows:
            g = r["flops"] / r["seconds"] / 1e9 if r["seconds"] > 0 and r["flops"] else 0.0
            star = "*" if r["algorithm"].startswith("winograd") else ""
            lines.append(f"{r['index']:>3} {r['kernel']:<{kw}} {r['algorithm'] + star:<{aw}} {r['partitioning']:<{pw}} "
                         f"{str(r['tasks'] if r['tasks'] is not None else '-'):>5} {str(r['output_shape']):<22} "
                         f"{r['seconds'] * 1e3:>8.3f} {g:>8.1f} {100 * g * 1e9 / self.peak:>6.1f}")
        lines.append(f"{'':>3} {'overhead':<{kw}} {'between kernels':<{aw + pw + 1}} {'':>5} {'':<22} "
                     f"{self.overhead_seconds * 1e3:>8.3f}")
        lines.append("-" * len(head))
        flops = sum(r["flops"] for r in self.rows)
        g = flops / self.total_seconds / 1e9
        lines.append(f"total {self.total_seconds * 1e3:.3f} ms (best pass; {self.kernel_seconds * 1e3:.3f} in kernels, "
                     f"the sum of each row's best; {self.overhead_seconds * 1e3:.3f} between them, measured in each "
                     f"pass), {flops / 1e9:.3f} GFLOP, {g:.1f} GFLOP/s = "
                     f"{100 * g * 1e9 / self.peak:.1f}% of the measured peak; * Winograd rows count direct-conv FLOPs")
        return "\n".join(lines)

    def plot(self, path) -> None:
        from .barchart import write_bar_chart
        labels = [f"{r['index']} {r['kernel']} {r['algorithm'] if r['algorithm'] != '-' else ''}".strip()
                  for r in self.rows] + ["overhead"]
        values = [r["seconds"] * 1e3 for r in self.rows] + [self.overhead_seconds * 1e3]
        notes = []
        for r in self.rows:
            g = r["flops"] / r["seconds"] / 1e9 if r["seconds"] > 0 and r["flops"] else 0.0
            notes.append(f"{r['seconds'] * 1e3:.3f} ms {100 * g * 1e9 / self.peak:.0f}% " + (r["partitioning"] if
                         r["partitioning"] != "-" else "") + (f" {r['tasks']} tasks" if r["tasks"] else ""))
        notes.append(f"{self.overhead_seconds * 1e3:.3f} ms between kernels")
        colors = [(200, 120, 60) if r["algorithm"].startswith("winograd") else (70, 110, 180) if r["kernel"] ==
                  "conv2d" else (120, 160, 120) for r in self.rows] + [(180, 60, 60)]
        write_bar_chart(path, labels, values, notes, colors=colors,
                        title=f"{self.name}: {self.total_seconds * 1e3:.2f} ms on {self.threads} threads, "
                              f"{self.target.get('vector_bits')}-bit vectors")


def _timed_pass(sess, in_addrs, out_addrs, acc: list[float]) -> float:
    """One compute with the Session timing every kernel call (Session.compute(timings=)); returns the
    pass's own time between and around the kernel calls (its wall time minus their sum)."""
    t: list[float] = []
    t0 = time.perf_counter()
    sess.compute(in_addrs, out_addrs, timings=t)
    wall = time.perf_counter() - t0
    if len(t) != len(acc):
        raise RuntimeError(f"tilefuse profile: {len(t)} instruction times for a program of {len(acc)}")
    acc[:] = t
    return wall - sum(t)


def profile(compiled, threads: int | None = None, repeat: int = 10, peak_core: float | None = None,
            name: str | None = None) -> Profile:
    """Run `compiled` (a CompiledNetwork or a Network, compiled here for `threads`) `repeat` times
    and time every instruction; see the module docstring."""
    from .compiler import compile as compile_net
    from .ir import Network
    from .kernels.isa import info, measure_peak
    from .kernels.threads import resolve_threads
    from .runtime import Session
    if isinstance(compiled, Network):
        compiled = compile_net(compiled, threads=threads)
    if repeat < 1:
        raise ValueError(f"profile: repeat must be >= 1, got {repeat}")
    t = resolve_threads(threads if threads is not None else compiled.options.get("threads"))
    plan = compiled.plan()
    sess = Session(compiled, threads=t)
    sess.copy_constants()
    try:
        in_addrs, out_addrs = sess.alloc_io()
        rng = np.random.default_rng(0)
        for a, s in zip(in_addrs, sess.package.inputs):
            sess.device.copy_in(a, rng.standard_normal(s.shape).astype(s.dtype))
        sess.compute(in_addrs, out_addrs)                       # JIT / cache load, first touch
        per = [[0.0] * len(plan.rows) for _ in range(repeat)]
        totals, between = [], []
        for k in range(repeat):
            between.append(_timed_pass(sess, in_addrs, out_addrs, per[k]))
            t0 = time.perf_counter()
            sess.compute(in_addrs, out_addrs)
            totals.append(time.perf_counter() - t0)
        sess.free_io((in_addrs, out_addrs))
        chains = sess.chains()
        pools = sess.stem_pools()
    finally:
        sess.release()
    # a fused chain (kernels/conv/chain.py) runs at its first instruction: that row holds the chain's time
    # and FLOPs, the others say where they went
    into = {j: i for i, (covers, _) in chains.items() for j in covers[1:]}
    # a stem conv -> max pool pair (kernels/stem_pool.py) runs at the conv: its row holds both
    pooled = {j: i for i, j in pools.items()}
    rows = []
    for r in plan.rows:
        row = {"index": r["index"], "kernel": r["kernel"], "algorithm": r["algorithm"], "layout": r["layout"],
               "partitioning": r["partitioning"], "tasks": r.get("tasks"), "output_shape": r["output_shape"],
               "flops": r["flops"], "seconds": min(p[r["index"]] for p in per)}
        if r["index"] in chains:
            covers, d = chains[r["index"]]
            row.update(algorithm="chain", partitioning=d["partitioning"], tasks=d["tasks"],
                       flops=sum(plan.rows[j]["flops"] for j in covers))
        elif r["index"] in into:
            row.update(algorithm="fused", partitioning=f"in chain #{into[r['index']]}", tasks=None, flops=0)
        elif r["index"] in pools:
            row.update(partitioning=row["partitioning"].replace(" (stem kernel)", "") + " + pool",
                       flops=r["flops"] + plan.rows[pools[r["index"]]]["flops"])
        elif r["index"] in pooled:
            row.update(algorithm="fused", partitioning=f"in the stem #{pooled[r['index']]}", tasks=None, flops=0)
        rows.append(row)
    pk = peak_core if peak_core is not None else measure_peak()
    return Profile(name or compiled.package.name, rows, min(totals), t, pk, dict(plan.target or info()),
                   between_seconds=float(np.median(between)))


def cmd_profile(args) -> int:
    from .cli import _model
    from .compiler import compile as compile_net
    net = _model(args.model, args.batch, args.image_size, args.seed)
    compiled = compile_net(net, threads=args.threads, winograd=not args.no_winograd, algorithm=args.algorithm)
    p = profile(compiled, threads=args.threads, repeat=args.repeat, name=f"{args.model} batch {args.batch}")
    print(p)
    if args.plot:
        p.plot(args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def register(subparsers) -> None:
    from .models import NAMES
    q = subparsers.add_parser("profile", help="per-layer time, partitioning and share of the measured peak")
    q.add_argument("model", nargs="?", default="resnet50", help=f"zoo model ({', '.join(NAMES)})")
    q.add_argument("--threads", type=int, default=None, help="kernel threads (default: all cores)")
    q.add_argument("--batch", type=int, default=1)
    q.add_argument("--image-size", type=int, default=None)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--repeat", type=int, default=10, help="runs to take the best of (default 10)")
    q.add_argument("--no-winograd", action="store_true")
    q.add_argument("--algorithm", default=None, help="force one conv algorithm")
    q.add_argument("--plot", default=None, metavar="PNG", help="write a bar chart of the rows")
    q.set_defaults(func=cmd_profile)
