"""Algorithm choice: one annotating pass that both schedules read.

    res = choose_algorithms(net, algorithm=None, winograd=True, tune=False, threads=None, layout="auto")

Every conv2d of the optimized network gets `params["algorithm"]`, the kernel its layer runs:

  - forced (`compile(algorithm=...)`): that algorithm for every conv; a conv the conv library
    cannot run with it (`kernels.conv.candidates`) raises GraphError naming the layer;
    "reference" forces the plain numpy kernel everywhere;
  - tuned (`compile(tune=True)`): every candidate measured on this machine, the fastest kept
    and cached per layer shape and machine (`compiler/tune.py`);
  - else the cost model's pick (`kernels.conv.select_algorithm`, on the whole layer's shape and the
    thread count the program is compiled for: on many threads a batch-1 14x14 layer runs direct
    rather than Winograd, whose tasks there stream 4x the weight bytes in too few tiles).

Convs on other dtypes than float32 get "reference". The layer schedule (`lower.py`) prepares
each conv's weights for its algorithm and the layout `layout.conv_layout` gives it; the row-band
schedule (`bands.py`) prepares them for its rings' layouts; neither picks an algorithm again.
Choosing on a band's shape instead of the layer's was measured worse: the cost model then
prefers direct over Winograd F(4,3), which is about 2x faster on bands too.
"""
from __future__ import annotations

import numpy as np

from ..errors import GraphError
from ..ir import Network
from .passes import PassResult

REFERENCE = "reference"


def choose_algorithms(net: Network, *, algorithm: str | None = None, winograd: bool = True, tune: bool = False,
                      threads: int | None = None, layout: str = "auto",
                      tuning: dict | None = None) -> PassResult:
    """Annotate every conv2d with params["algorithm"]; `tuning` (if given) receives, per conv
    output name, the measured seconds of each candidate and whether they came from the cache."""
    from ..kernels import conv as fast
    net = net.clone()
    cache = None
    if tune and not algorithm:
        from .tune import TuneCache
        cache = TuneCache().load()
    if algorithm and algorithm != REFERENCE and algorithm not in fast.ALGORITHMS:
        raise ValueError(f"unknown conv algorithm {algorithm!r}; expected one of {fast.ALGORITHMS + (REFERENCE,)}")
    counts: dict[str, int] = {}
    for op in net.ops:
        if op.op != "conv2d":      # conv_transpose2d has one kernel family (lowering picks its form)
            continue
        x, w = op.inputs[0], op.inputs[1]
        p = op.params
        if p.get("has_input_scale"):
            continue               # an input-scaled conv runs kernels/se_conv.py: no algorithm to choose
        if algorithm == REFERENCE or x.dtype != np.float32:
            algo = REFERENCE
        else:
            cands = fast.candidates(x.shape, w.shape, p["stride"], p["padding"], p["dilation"], p["groups"],
                                    allow_winograd=winograd)
            if algorithm:
                if algorithm not in cands:
                    raise GraphError(op.name, f"conv algorithm {algorithm!r} cannot run weight {w.shape} with "
                                              f"stride={p['stride']}, padding={p['padding']}, "
                                              f"dilation={p['dilation']}, groups={p['groups']}; candidates: "
                                              f"{cands}; expected an algorithm every conv can run (or none forced)")
                algo = algorithm
            elif cache is not None:
                from ..kernels.threads import resolve_threads
                from .tune import choose
                algo, secs, hit = choose(cache, x.shape, w.shape, p, threads=resolve_threads(threads),
                                         allow_winograd=winograd, layout_mode=layout)
                if tuning is not None:
                    tuning[op.outputs[0].name] = {"seconds": secs, "cached": hit}
            else:
                from ..kernels.threads import resolve_threads
                algo = fast.select_algorithm(x.shape, w.shape, p["stride"], p["padding"], p["dilation"],
                                             p["groups"], allow_winograd=winograd, threads=resolve_threads(threads))
        op.params = {**p, "algorithm": algo}
        counts[algo] = counts.get(algo, 0) + 1
    if cache is not None:
        cache.save()                                     # persist what tuning measured
    how = "tuned" if cache is not None else ("forced" if algorithm else "heuristic")
    detail = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "no conv"
    return PassResult(net, bool(counts), f"{how}: {detail}")
