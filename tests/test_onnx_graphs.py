"""Seeded random ONNX graphs (tests/onnx_graphs.py) against ONNX Runtime: every graph ORT runs is either refused
by tilefuse with a TilefuseError naming what it does not implement, or computed within 1e-4 of the output's max
(of ORT's output, or of ONNX's reference evaluator's where ORT's float32 arithmetic is the outlier). Longer runs:
`python tests/onnx_graphs.py --kind spatial|tensor --seconds N` (the ties of Resize that such a run found are
tests/test_onnx_modern.py::test_resize_nearest_ties_follow_onnx_runtime)."""
from __future__ import annotations

import numpy as np
import pytest

import onnx_graphs as G

BATCHES = 10            # pytest cases per kind
SEEDS_PER_BATCH = 100   # graphs per case (~0.3 s)


@pytest.mark.parametrize("batch", range(BATCHES))
@pytest.mark.parametrize("kind", ["spatial", "tensor"])
def test_random_onnx_graphs_match_onnx_runtime_or_are_refused(kind, batch):
    problems = []
    for seed in range(batch * SEEDS_PER_BATCH, (batch + 1) * SEEDS_PER_BATCH):
        p = G.check(kind, seed)
        if p:
            problems.append(f"seed {seed}: {p}")
    assert not problems, "\n".join(problems[:5])


@pytest.mark.parametrize("kind", ["spatial", "tensor"])
def test_graphs_with_a_nonfinite_tail_match_onnx_runtime(kind):
    """Seeds from onnx_graphs.TAIL_FROM: half the graphs end in Shrink, ThresholdedRelu, or a Where of IsNaN, IsInf
    or a comparison with +-inf (ops claimed in the sixty-fifth session); at least a quarter of these have one."""
    problems, tails = [], 0
    for seed in range(G.TAIL_FROM, G.TAIL_FROM + SEEDS_PER_BATCH):
        built = (G.build_spatial if kind == "spatial" else G.build_tensor)(seed, tail=True)
        tails += built is not None and built[0].graph.node[-1].op_type in ("Shrink", "ThresholdedRelu", "Where") \
            and any(o == "pre" for n in built[0].graph.node for o in n.output)
        p = G.check(kind, seed)
        if p:
            problems.append(f"seed {seed}: {p}")
    assert not problems, "\n".join(problems[:5])
    assert tails >= SEEDS_PER_BATCH // 4, tails


# seeds longer runs found (2026-12-05): Resize's round modes near a half (76010120), a mean that cancels to 1e-5
# of its terms' sum (76047196: float32 rounding decides), the reference's LRN window as a difference of running
# sums (77014535), GELU(approximate='tanh') in its negative tail (77022427), ONNX Runtime's LRN 0.24% off the
# formula where tilefuse is not (77052015), a Pow of a LayerNormalization near 0 (77002218: rounding decides),
# sqrt of GELU's tail, where a value below float32's reach is 0 or NaN (79056053); 2026-12-06: GELU(erf) alone in
# its tail, 3e-4 off as PyTorch's (14017953, 14044539: the checker's rounding model covers erf's rounding now); a
# reciprocal of GELU(erf)'s tail (101115614: tilefuse's 1 + erf cancelled, a factor of 3; now an erfc form, more
# accurate than ONNX Runtime's and onnx's float64 one, which the checker's evaluator replaces)
FOUND = [("spatial", 76010120), ("spatial", 76047196), ("tensor", 77002218), ("tensor", 77014535),
         ("tensor", 77022427), ("tensor", 77052015), ("tensor", 79056053), ("tensor", 14017953),
         ("tensor", 14044539), ("tensor", 101115614)]


@pytest.mark.parametrize("kind,seed", FOUND)
def test_graphs_longer_runs_found(kind, seed):
    problem = G.check(kind, seed)
    assert problem is None, f"seed {seed}: {problem}"


@pytest.mark.parametrize("kind,seed,factor", [("tensor", 14044539, 1.01), ("tensor", 77002218, 1.001)])
def test_the_checker_fails_a_wrong_value(kind, seed, factor, monkeypatch):
    """The check can fail where its rounding model is widest (a GELU tail, a Pow of a LayerNorm near 0): every
    output `factor` times the computed one."""
    import tilefuse
    assert G.check(kind, seed) is None
    real_run = tilefuse.Session.run

    def off(self, *a, **k):
        return np.asarray(real_run(self, *a, **k)) * factor
    monkeypatch.setattr(tilefuse.Session, "run", off)
    assert "error" in (G.check(kind, seed) or "")
