"""Figures of a simulation, in the papers' style: efficiency and scaling per layer, and where the
time goes (compute, then the time spent waiting on each link or the host). matplotlib is a test
extra, imported only here."""
from __future__ import annotations


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:            # pragma: no cover - depends on the environment
        raise RuntimeError("--plot needs matplotlib, which tilefuse does not install by default; "
                           "pip install matplotlib (it is in the 'test' extra)") from e
    return plt


def breakdown(report) -> list[tuple[str, dict[str, float]]]:
    """Per layer: compute time, plus the rest of the layer's time charged to its bottleneck
    (the resource busy longest); the host copies as one more bar."""
    out = []
    for r in report.layers:
        if r.seconds <= 0:
            continue
        comp = min(r.compute_busy, r.seconds)
        parts = {"compute": comp}
        rest = r.seconds - comp
        if rest > 0:
            b = r.bottleneck
            parts["wait " + (b if b != "compute" else "other")] = rest
        out.append((r.name, parts))
    if report.host:
        out.append(("host", {"host " + k: v for k, v in report.host.items()}))
    return out


def plot(path, scaling=None, report=None) -> str:
    """Write a PNG: efficiency (and S_n) per layer for each core count, and the time breakdown of
    the run with the most cores (or of `report`)."""
    plt = _pyplot()
    import numpy as np
    rep = report if report is not None else scaling.runs[scaling.cores[-1]]
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.35 * len(rep.layers) + 3), 8))
    ax = axes[0]
    if scaling is not None:
        rows = scaling.layer_rows()
        xs = np.arange(len(rows))
        wd = 0.8 / len(scaling.cores)
        for j, n in enumerate(scaling.cores):
            ax.bar(xs + j * wd, [100 * r["eff"][n] for r in rows], wd, label=f"{n} core(s)")
        ax2 = ax.twinx()
        for n in scaling.cores[1:]:
            ax2.plot(xs + 0.4, [100 * r["S"][n] for r in rows], marker="o", lw=1, label=f"S{n}")
        ax2.set_ylabel("scaling S_n (%)")
        ax2.set_ylim(0, 110)
        ax2.legend(loc="upper right", fontsize=7)
        names = [r["name"] for r in rows]
    else:
        rows = [r for r in rep.layers if r.flops]
        xs = np.arange(len(rows))
        ax.bar(xs, [100 * r.efficiency for r in rows], 0.6, label=f"{rep.cores} core(s)")
        names = [r.name for r in rows]
    ax.set_xticks(xs + 0.4 if scaling is not None else xs)
    ax.set_xticklabels(names, rotation=70, fontsize=6)
    ax.set_ylabel("efficiency (% of peak)")
    ax.set_ylim(0, 100)
    ax.legend(loc="upper left", fontsize=7)
    ax.set_title(f"{rep.target.name}: efficiency per layer")
    ax = axes[1]
    parts = breakdown(rep)
    keys = sorted({k for _, p in parts for k in p}, key=lambda k: (k != "compute", k))
    xs = np.arange(len(parts))
    bottom = np.zeros(len(parts))
    for k in keys:
        v = np.array([p.get(k, 0.0) * 1e3 for _, p in parts])
        ax.bar(xs, v, 0.6, bottom=bottom, label=k)
        bottom += v
    ax.set_xticks(xs)
    ax.set_xticklabels([n for n, _ in parts], rotation=70, fontsize=6)
    ax.set_ylabel("ms")
    ax.set_title(f"time per layer, {rep.cores} core(s): compute, then waiting on the bottleneck")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)
