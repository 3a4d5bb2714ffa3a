"""The seed papers' hardware figures, reproduced on the machine models (tilefuse.targets).

    python benchmarks/papers.py                 # all five papers, with the parameter sweeps
    python benchmarks/papers.py --only 000 003  # some of them
    python benchmarks/papers.py --quick         # no sweeps

Each table puts the paper's figure beside the model's with the relative error (model / paper - 1).
Every parameter comes from the target files (tilefuse/targets/*.toml: S stated in the seed, V
verified, R recalled, D derived, M missing = an assumption); none is fitted to these results.
Each M parameter is swept over its stated range on the paper's headline figure, so the tables
show how far the assumption can move the result. Timing only (functional=False): the blocking,
capacity checks and timelines are those of a functional run (tests/test_simulate.py checks that).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import tilefuse  # noqa: E402
from tilefuse.targets import (FilterJob, fusion_speedup, load_target, qinglong_modes, scaling,  # noqa: E402
                              simulate)
from tilefuse.targets.spec import format_quantity  # noqa: E402

ROWS: list[tuple] = []


def row(paper: str, what: str, ref, model, unit: str = "", note: str = "", count: bool = True) -> None:
    """One figure: the paper's, the model's, the error. count=False: shown, but not a figure the
    summary counts (the other reading of a figure the seed prints two ways)."""
    err = (model / ref - 1) if isinstance(ref, (int, float)) and ref else None
    if count:
        ROWS.append((paper, what, ref, model, unit, err, note))
    r = f"{ref:.4g}" if isinstance(ref, (int, float)) else str(ref)
    e = f"{100 * err:+.1f}%" if err is not None else "-"
    print(f"  {what:<52} paper {r:>9} {unit:<6} model {model:>9.4g} {unit:<6} error {e:>8}  {note}", flush=True)


def params(target: str, names=None) -> None:
    t = load_target(target)
    print(f"  parameters ({target}, source tags S/V/R/D/M):")
    for p in t.sources():
        if names is None and p.tag not in "M":
            continue
        if names is not None and p.path not in names and p.tag != "M":
            continue
        rng = f" [range {format_quantity(p.range[0], p.kind)} .. {format_quantity(p.range[1], p.kind)}]" if p.range else ""
        print(f"    {p.path:<36} {p.text():>12}  {p.source[:90]}{rng}")


def sweep(target: str, figure, label: str, keys=None) -> None:
    """Move each M parameter of `target` (or each of `keys` that has a range) to the ends of its
    range; figure(**overrides) -> value."""
    t = load_target(target)
    print(f"  sweep of the assumptions (M) on {label}:")
    base = figure()
    print(f"    {'(as in the file)':<36} {base:10.4g}")
    for p in t.sources():
        if p.range is None or (keys is None and p.tag != "M") or (keys is not None and p.path not in keys):
            continue
        vals = []
        for v in p.range:
            raw = v
            if p.kind == "time":
                raw = f"{v * 1e6:g} us"
            elif p.kind == "bandwidth":
                raw = f"{v / 1e9:g} GB/s"
            elif p.kind == "frequency":
                raw = f"{v / 1e6:g} MHz"
            try:
                vals.append(figure(**{p.path: raw}))
            except Exception as e:          # an end of a range the mapping cannot use
                vals.append(float("nan"))
                print(f"    ({p.path}={raw}: {type(e).__name__}: {str(e)[:80]})")
        print(f"    {p.path:<36} {vals[0]:10.4g} .. {vals[1]:10.4g}   "
              f"({format_quantity(p.range[0], p.kind)} .. {format_quantity(p.range[1], p.kind)})")


def conv_net(n, ci, co, hw, k, stride=1):
    net = tilefuse.Network(f"conv{k}x{k}_{ci}_{co}_{hw}")
    x = net.input("x", (n, ci, hw, hw))
    w = np.zeros((co, ci, k, k), np.float32)
    net.output(net.conv2d(x, w, None, stride=stride, padding=k // 2, name="conv"))
    return tilefuse.compile(net, algorithm="reference")


# ----------------------------------------------------------------------------- 000 FT-M7032

def paper_000(quick: bool, batch: int = 32) -> None:
    print(f"\n=== 000 FT-M7032 (one GPDSP cluster, FP16, N4CHW4; batch {batch}, an assumption for Figs. 7-8: "
          f"the seed states 32 only for section 4.4)")
    one = [(256, 64, 56), (512, 128, 28), (1024, 256, 14), (2048, 512, 7)]
    three = [(64, 64, 56), (128, 128, 28), (256, 256, 14), (512, 512, 7)]
    paper1 = [64.95, ">60", ">60", "lower"]
    paper3 = ["lower", 50.01, 51.37, 45.07]
    print(" Fig. 7: single-core efficiency, 2nd block's first (1x1) and second (3x3) conv of stages 2-5")
    for (ci, co, hw), ref in zip(one, paper1):
        e = simulate(conv_net(batch, ci, co, hw, 1), "ft-m7032", cores=1, functional=False).layers[0].efficiency
        row("000", f"Fig7 conv1x1 {hw}x{hw} {ci}->{co}, 1 core", ref, 100 * e, "%")
    for (ci, co, hw), ref in zip(three, paper3):
        e = simulate(conv_net(batch, ci, co, hw, 3), "ft-m7032", cores=1, functional=False).layers[0].efficiency
        row("000", f"Fig7 conv3x3 {hw}x{hw} {ci}->{co}, 1 core", ref, 100 * e, "%")
    print(" Fig. 8: efficiency and scaling S_n at 1/2/4/8 cores")
    figs = {1: (conv_net(batch, 256, 64, 56, 1), [64.95, 57.18, 46.78, 31.41], [100, 88.04, 72.02, 48.36]),
            3: (conv_net(batch, 128, 128, 28, 3), [50.01, 44.27, 38.21, 26.93], [100, 88.52, 76.42, 53.86])}
    for k, (c, effs, ss) in figs.items():
        sc = scaling(c, "ft-m7032", cores=(1, 2, 4, 8))
        r = sc.layer_rows()[0]
        for n, pe, ps in zip((1, 2, 4, 8), effs, ss):
            row("000", f"Fig8 conv{k}x{k} efficiency, {n} cores", pe, 100 * r["eff"][n], "%",
                ", ".join(r["saturated"][n]) and f"saturated: {', '.join(r['saturated'][n])}")
        for n, ps in zip((2, 4, 8), ss[1:]):
            row("000", f"Fig8 conv{k}x{k} scaling S_{n}", ps, 100 * r["S"][n], "%")
    # the paper's own Fig. 8 times (T_n proportional to 1 / (n E_n)) fit T(n) = a / n + b: b is a part
    # of the single-core time that more cores do not shorten
    for k, (_, effs, _) in figs.items():
        t = [1 / (n * e) for n, e in zip((1, 2, 4, 8), effs)]
        a = (t[0] - t[3]) / (1 - 1 / 8)
        b = t[0] - a
        fit = [a / n + b for n in (1, 2, 4, 8)]
        print(f"    paper's conv{k}x{k}: T(n) = a/n + b with b = {100 * b / t[0]:.0f}% of T(1) "
              f"(exact at 1 and 8 cores, within {100 * max(abs(fit[i] / t[i] - 1) for i in (1, 2)):.0f}% at 2 and 4)")
    print(" Table 1: ResNet50, batch 32, one cluster (8 cores)")
    t0 = time.perf_counter()
    rn = tilefuse.compile(tilefuse.models.resnet50(batch=32), algorithm="reference")
    rep = simulate(rn, "ft-m7032", cores=8, functional=False)
    row("000", "Tab1 ResNet50 batch 32, 8 cores", 209.73, rep.seconds * 1e3, "ms",
        f"({100 * rep.efficiency:.1f}% of peak; simulated in {time.perf_counter() - t0:.0f} s)")
    row("000", "Tab1 speedup over the E5-2640 (1131.27 ms, measured)", 5.39, 1131.27 / (rep.seconds * 1e3), "x")
    by: dict[str, float] = {}
    for r in rep.layers:
        key = r.kernel + (" 1x1" if r.mapping.startswith("1x1") else " kxk" if r.kernel == "conv2d" else "")
        by[key] = by.get(key, 0.0) + r.seconds
    print("    time by kind: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in sorted(by.items(), key=lambda kv: -kv[1])))
    params("ft-m7032", ["link.ddr.bandwidth", "link.ddr.efficiency", "clock.core", "memory.AM.capacity",
                        "memory.SM.capacity"])
    if not quick:
        f8 = figs[1][0]
        sweep("ft-m7032", lambda **ov: 100 * simulate(f8, "ft-m7032", cores=1, functional=False,
                                                      **ov).layers[0].efficiency,
              "Fig. 8 conv1x1 efficiency at 1 core (paper 64.95%)")
        sweep("ft-m7032", lambda **ov: 100 * simulate(f8, "ft-m7032", cores=8, functional=False,
                                                      **ov).layers[0].efficiency,
              "Fig. 8 conv1x1 efficiency at 8 cores (paper 31.41%)")
        f3 = figs[3][0]
        sweep("ft-m7032", lambda **ov: 100 * simulate(f3, "ft-m7032", cores=1, functional=False,
                                                      **ov).layers[0].efficiency,
              "Fig. 8 conv3x3 efficiency at 1 core (paper 50.01%)")
        sweep("ft-m7032", lambda **ov: 1e3 * simulate(rn, "ft-m7032", cores=8, functional=False, **ov).seconds,
              "Table 1 ResNet50 ms (paper 209.73)",
              keys=["link.ddr.efficiency", "link.ddr.latency", "param.broadcasts_per_cycle"])
        f3_1 = lambda **ov: 100 * simulate(f3, "ft-m7032", cores=1, functional=False, **ov).layers[0].efficiency  # noqa: E731
        f3_8 = lambda **ov: 100 * simulate(f3, "ft-m7032", cores=8, functional=False, **ov).layers[0].efficiency  # noqa: E731
        print(f"    what-if kxk_weight_buffers=2 (a ping-pong Wb, which 000:131 does not describe): conv3x3 "
              f"1 core {f3_1(kxk_weight_buffers=2):.1f}%, 8 cores {f3_8(kxk_weight_buffers=2):.1f}% (paper 50.01 / 26.93)")
        print(f"    what-if fuse_residual=1 (the Add fused into the conv, as tilefuse's CPU program does): ResNet50 "
              f"{simulate(rn, 'ft-m7032', cores=8, functional=False, fuse_residual=1).seconds * 1e3:.1f} ms")
        r = simulate(rn, "ft-m7032", cores=8, functional=False, AM="1MiB")
        print(f"    what-if AM=1MiB: ResNet50 {r.seconds * 1e3:.1f} ms; DDR twice as fast: "
              f"{simulate(rn, 'ft-m7032', cores=8, functional=False, ddr='85.2GB/s').seconds * 1e3:.1f} ms")


# ----------------------------------------------------------------------------- 001 VCK5000

def paper_001(quick: bool) -> None:
    print("\n=== 001 VCK5000: 3x3 filter on a 3840x2160 int32 frame, 7 AIE cores, PL movers at 300 MHz")
    k = np.array([[64, 128, 64], [128, 256, 128], [64, 128, 64]], np.int32)
    job = FilterJob(k, shape=(2160, 3840))

    def run(**ov):
        return simulate(job, "vck5000-aie", functional=False, **ov)
    r = run()
    row("001", "host -> device per frame", 11.64, r.host["host -> device"] * 1e3, "ms",
        f"(bo.write memcpy {r.extra['h2d']['copy'] * 1e3:.2f} + sync DMA {r.extra['h2d']['dma'] * 1e3:.2f})")
    row("001", "AIE + PL per frame", 62.97, r.seconds * 1e3, "ms", f"bottleneck {r.layers[0].bottleneck}, "
                                                                   f"{r.extra['tiles']} tiles")
    row("001", "device -> host per frame", 12.99, r.host["device -> host"] * 1e3, "ms",
        f"(sync DMA {r.extra['d2h']['dma'] * 1e3:.2f} + bo.read memcpy {r.extra['d2h']['copy'] * 1e3:.2f})")
    row("001", "total per frame", 87.6, (r.seconds + r.host_seconds) * 1e3, "ms")
    small = FilterJob(k, np.random.default_rng(0).integers(0, 100, (300, 500)).astype(np.int32))
    from tilefuse.imaging.reference import correlate_reference
    ok = np.array_equal(simulate(small, "vck5000-aie").outputs[0], correlate_reference(small.image, k, "replicate"))
    print(f"  functional check (500x300 frame through the same tiles): exact = {ok}")
    params("vck5000-aie", ["clock.pl", "link.h2c.bandwidth", "link.h2c.efficiency", "link.c2h.efficiency",
                           "param.words_per_cycle"])
    if not quick:
        sweep("vck5000-aie", lambda **ov: run(**ov).seconds * 1e3, "AIE + PL ms (paper 62.97)")
        sweep("vck5000-aie", lambda **ov: run(**ov).host["host -> device"] * 1e3, "host -> device ms (paper 11.64)",
              keys=["link.h2c.efficiency", "link.h2c.latency", "link.host_copy.bandwidth"])
        sweep("vck5000-aie", lambda **ov: run(**ov).host["device -> host"] * 1e3, "device -> host ms (paper 12.99)",
              keys=["link.c2h.efficiency", "link.c2h.latency", "link.host_copy.bandwidth"])
        r2 = run(load_send_serial=0)
        print(f"    what-if the movers overlapped load and send (001's proposed fix): AIE + PL {r2.seconds * 1e3:.2f} ms")


# ----------------------------------------------------------------------------- 002 Cambricon-X

def paper_002(quick: bool) -> None:
    from qinglong_ablation import LAYERS, layer_net
    print("\n=== 002 Cambricon-X + QingLong: speedup of each mode over DLPlib (compile + copies + compute)")
    print("  everything from the target file: compile = instructions issued x compile_per_instruction (+ REOFF")
    print("  packing for QL2/3), constants block by block (DLPlib, QL1) or as one package (QL2/3); no host timing")
    nets = {k: layer_net(k) for k in LAYERS}
    nets["AlexNet"] = tilefuse.models.alexnet()
    nets["VGG16"] = tilefuse.models.vgg16()
    compiled = {name: tilefuse.compile(net, algorithm="reference") for name, net in nets.items()}

    def runs_for(names, **ov):
        return {k: simulate(compiled[k], "cambricon-x", functional=False, **ov) for k in names}
    runs = runs_for(compiled)

    def table(n_inputs, runs_):
        return {name: {mode: qinglong_modes(rep, n_inputs).speedup(mode) for mode in ("ql1", "ql2", "ql3")}
                for name, rep in runs_.items()}
    s100 = table(100, runs)
    print(f"  {'case':<8} {'instr':>9} {'compile ms':>10} {'device ms':>10} {'const ms':>9} {'in+out ms':>9}   "
          f"ql1     ql2     ql3  (x DLPlib, 100 inputs)")
    for name, rep in runs.items():
        s, e = s100[name], rep.extra
        print(f"  {name:<8} {e['instructions']:>9,} {e['compile_seconds'] * 1e3:10.2f} {rep.seconds * 1e3:10.3f} "
              f"{e['constants_seconds'] * 1e3:9.3f} {rep.host_seconds * 1e3:9.3f}  {s['ql1']:6.2f}  {s['ql2']:6.2f}  "
              f"{s['ql3']:6.2f}")
    single = [s100[k]["ql3"] for k in LAYERS]
    nets_ = [s100[k]["ql3"] for k in ("AlexNet", "VGG16")]
    row("002", "Fig13 QL3 over DLPlib, single layers (mean)", 4.75, statistics.mean(single), "x")
    row("002", "Fig13 QL3 over DLPlib, networks (mean)", 68.4, statistics.mean(nets_), "x")
    row("002", "Fig13 QL3 over DLPlib, all ten (mean)", 17.48, statistics.mean(single + nets_), "x")
    big = {k: runs[k] for k in ("AlexNet", "VGG16")}
    s1000 = table(1000, big)
    row("002", "Fig14-15 QL3 over DLPlib, networks, 1000 inputs", 178.8,
        statistics.mean(s1000[k]["ql3"] for k in s1000), "x")
    gain = lambda a, b, ks: 100 * statistics.mean(s100[k][b] / s100[k][a] - 1 for k in ks)  # noqa: E731
    row("002", "QL2 over QL1 (constants once), FC", 186, gain("ql1", "ql2", ["FC1", "FC2"]), "%")
    row("002", "QL2 over QL1, Conv", 5, gain("ql1", "ql2", ["Conv1", "Conv2"]), "%")
    row("002", "QL2 over QL1, Scale/BN (paper: < 1%)", 1, gain("ql1", "ql2", ["Scale1", "Scale2", "BN1", "BN2"]), "%")
    row("002", "QL3 over QL2 (pipeline), FC", 4.3, gain("ql2", "ql3", ["FC1", "FC2"]), "%")
    row("002", "QL3 over QL2, Conv", 38, gain("ql2", "ql3", ["Conv1", "Conv2"]), "%")
    row("002", "QL3 over QL2, Scale/BN", 95, gain("ql2", "ql3", ["Scale1", "Scale2", "BN1", "BN2"]), "%")
    fc = statistics.mean(runs[k].seconds / runs[k].host_seconds for k in ("FC1", "FC2"))
    row("002", "FC compute / (copy in + copy out) (text, 002 sec. 5.3)", 18, fc, "x")
    sweep_n = (100, 200, 500, 1000)
    q21 = statistics.mean(qinglong_modes(big[k], n).seconds("ql1") / qinglong_modes(big[k], n).seconds("ql2")
                          for k in big for n in sweep_n)
    q32 = statistics.mean(qinglong_modes(big[k], n).seconds("ql2") / qinglong_modes(big[k], n).seconds("ql3")
                          for k in big for n in sweep_n)
    row("002", "Figs14-15 networks QL2 / QL1 time, 100-1000 inputs", 3.73, q21, "x", "'提升3.73倍' read as a ratio")
    row("002", "Figs14-15 networks QL3 / QL2 time, 100-1000 inputs", 1.4, q32, "x", "'提升1.4倍' read as a ratio")
    one = [qinglong_modes(r, 1) for r in runs.values()]
    print(f"  QL2 slower than QL1 for a single input (the paper says so, 002 sec. 5.3): "
          f"{sum(m.seconds('ql2') > m.seconds('ql1') for m in one)} of {len(one)} cases")
    # what the paper's own network figures imply, taken together (no model involved): with
    # QL2/QL1 = r2 and QL3/QL2 = r3 per input for many inputs, K = (r2 - 1)(i + x + o) and
    # i + x + o = r3 x; then 68.4x at 100 inputs fixes the compile time c in units of x
    r2, r3 = 3.73, 1.4
    per = r3 + (r2 - 1) * r3                       # DLPlib's per-input work without compiling, in x
    c = (68.4 * (per + 99) - 100 * per) / (100 - 68.4)
    at1000 = 1000 * (c + per) / (c + per + 999)
    model_c = statistics.mean(big[k].extra["compile_seconds"] / big[k].seconds for k in big)
    print(f"  the paper's network figures together imply compile = {c:.0f} x one input's device time (then 1000 "
          f"inputs give {at1000:.1f}x; paper 178.8x); the model's compile is {model_c:.1f} x its device time")
    params("cambricon-x", ["clock.core", "memory.NBin.capacity", "memory.SB.capacity", "param.instruction_bytes"])
    if not quick:
        names = [k for k in compiled if k != "VGG16"]

        def all_mean(**ov):
            t = table(100, runs_for(names, **ov))
            return statistics.mean(t[k]["ql3"] for k in t)
        sweep("cambricon-x", all_mean, "mean QL3 speedup over DLPlib at 100 inputs, VGG16 left out for time "
                                       "(paper 17.48x with it)")


# ----------------------------------------------------------------------------- 003 Virtex-7

def paper_003(quick: bool) -> None:
    print("\n=== 003 Virtex-7 690T: AlexNet (torchvision's), layer pipeline, line buffers, Winograd F(2x2,3x3)")
    c = tilefuse.compile(tilefuse.models.alexnet(), algorithm="reference")

    def tput(**ov):
        return simulate(c, "virtex7-690t", functional=False, **ov).extra["throughput_flops"] / 1e12
    r = simulate(c, "virtex7-690t", functional=False)
    row("003", "AlexNet throughput", 1.31, r.extra["throughput_flops"] / 1e12, "TFLOP/s",
        f"slowest stage {r.extra['slowest_stage']}, {1 / r.extra['interval']:.0f} images/s")
    conv_flops = sum(x.flops for x in r.layers if x.kernel == "conv2d")
    conv_t = max(x.seconds for x in r.layers if x.kernel == "conv2d")
    print(f"  (convolutions alone: {conv_flops / conv_t / 1e12:.3f} TFLOP/s at their own slowest stage)")
    params("virtex7-690t", ["compute.units", "memory.BRAM.capacity"])
    if not quick:
        sweep("virtex7-690t", tput, "AlexNet TFLOP/s (paper 1.31)")
        for wino in (False,):
            print("    (the F(2x2,3x3) stages would need 2.25x the DSPs without Winograd)")


# ----------------------------------------------------------------------------- 004 trainer

def paper_004(quick: bool) -> None:
    print("\n=== 004 training accelerator: fused vs separate BN/ReLU/Add, one step at batch 32 "
          "(executed at batch 1, traffic and MACs x32)")
    # Table 4 prints ResNet18 87.0 / 100.7 and ResNet50 48.5 / 54.5. Section 4.4 gives the whole
    # ResNet50 FP +87.0% and BP '1倍' (about +100%) from Figs. 8-9, whose blocks (conv3_x blk3,
    # conv2_x blk2) exist only in ResNet50: the table's row labels are swapped (docs/simulate.md).
    text = {"resnet50": (87.0, 100.7), "resnet18": (48.5, 54.5)}
    got = {}
    for name in ("resnet18", "resnet50"):
        t0 = time.perf_counter()
        net = tilefuse.models.get(name, batch=1)
        fs = fusion_speedup(net, batch_scale=32)
        got[name] = fs
        fp, bp = text[name]
        row("004", f"Tab4/text {name} FP gain (fused / separate)", fp, 100 * fs["fwd_gain"], "%",
            f"separate {fs['separate']['fwd'] * 1e3:.1f} ms, fused {fs['fused']['fwd'] * 1e3:.1f} ms")
        row("004", f"Tab4/text {name} BP gain", bp, 100 * fs["bwd_gain"], "%",
            f"separate {fs['separate']['bwd'] * 1e3:.1f} ms, fused {fs['fused']['bwd'] * 1e3:.1f} ms "
            f"({time.perf_counter() - t0:.0f} s)")
    mean_fp = 100 * (got["resnet18"]["fwd_gain"] + got["resnet50"]["fwd_gain"]) / 2
    mean_bp = 100 * (got["resnet18"]["bwd_gain"] + got["resnet50"]["bwd_gain"]) / 2
    row("004", "Tab4 average FP gain (either reading)", 67.7, mean_fp, "%")
    row("004", "Tab4 average BP gain (either reading)", 77.6, mean_bp, "%")
    print("  Table 4 as printed (ResNet18 87.0 / 100.7, ResNet50 48.5 / 54.5; not counted, see docs/simulate.md):")
    for name, (fp, bp) in (("resnet18", (87.0, 100.7)), ("resnet50", (48.5, 54.5))):
        row("004", f"Tab4 as printed {name} FP gain", fp, 100 * got[name]["fwd_gain"], "%", count=False)
        row("004", f"Tab4 as printed {name} BP gain", bp, 100 * got[name]["bwd_gain"], "%", count=False)
    params("trainer-004", ["link.feature.bandwidth", "link.weight.bandwidth", "clock.core"])
    if not quick:
        net = tilefuse.models.resnet18(batch=1)
        sweep("trainer-004", lambda **ov: 100 * fusion_speedup(net, batch_scale=32, **ov)["fwd_gain"],
              "ResNet18 FP gain % (text reading: 48.5)")


PAPERS = {"000": paper_000, "001": paper_001, "002": paper_002, "003": paper_003, "004": paper_004}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", default=list(PAPERS), help="papers: 000 001 002 003 004")
    ap.add_argument("--quick", action="store_true", help="skip the sweeps of the assumed parameters")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    for p in args.only:
        PAPERS[p](args.quick)
    print(f"\n=== summary: {len(ROWS)} figures, {time.perf_counter() - t0:.0f} s")
    print(f"{'paper':<6} {'figure':<52} {'paper':>9} {'model':>9} {'error':>8}")
    for paper, what, ref, model, unit, err, note in ROWS:
        r = f"{ref:.4g}" if isinstance(ref, (int, float)) else str(ref)
        print(f"{paper:<6} {what:<52} {r:>9} {model:>9.4g} {(f'{100 * err:+.1f}%' if err is not None else '-'):>8}")
    errs = [abs(e) for *_, e, _ in ROWS if e is not None]
    print(f"within 15%: {sum(e <= 0.15 for e in errs)} of {len(errs)} numeric figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
