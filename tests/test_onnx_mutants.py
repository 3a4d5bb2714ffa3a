"""ONNX files tilefuse did not make (tests/onnx_mutants.py): the random graphs of onnx_graphs.py mutated the way a
broken exporter or a hostile file would. Each is refused with a TilefuseError or computed as ONNX Runtime computes
it; an exception of another type, a crash, a hang or a wrong value fails. Longer runs:
`python tests/onnx_mutants.py --seconds N --seed S`."""
from __future__ import annotations

import numpy as np
import pytest

import onnx_mutants as M

BATCHES = 4
SEEDS_PER_BATCH = 500     # mutants per case (~2 s: most are refused early)


@pytest.mark.parametrize("batch", range(BATCHES))
def test_mutated_onnx_files_are_refused_by_name_or_computed_right(batch):
    problems = []
    for seed in range(batch * SEEDS_PER_BATCH, (batch + 1) * SEEDS_PER_BATCH):
        p = M.check(seed)
        if p:
            problems.append(f"seed {seed}: {p}")
    assert not problems, "\n".join(problems[:5])


# seeds the first runs found (2026-12-06), each failing before its fix:
# 1003963 Squeeze with an empty `axes` list squeezed nothing (ONNX Runtime: every axis of size 1);
# 1015990 ReduceSum keepdims=-2^63 read as 1 (refused now: flags are 0 or 1);
# 1036922 Max(x, inf) gave 3.4e38 (clip bounds were clamped to the float32 range);
# 1003977 an input dimension of 2^62 ended in struct.error in the program encoder (refused at import now);
# 1041598 a batch of 2^31 took all memory in compile (refused: larger than this host's memory);
# 2005072 Expand to 2^31 rows made a 16 GiB constant (refused: over the importer's constant size);
# 2067734 PRelu of a rank-5 input with a (C, 1, 1) slope: the compiled kernel took it as per-channel (wrong);
# 2045711 LayerNormalization with eps 1e-45 over one value: NaN (the kernel's rsqrt estimate of a subnormal);
# 4011540 GroupNormalization without inputs: IndexError in the importer's checker pass;
# 6018449 Neg of a tensor squeezed to shape (): shape (1,) (a (1,) constant operand; 0-d constants were made 1-d);
# 2013470, 2108331 float32 overflow decides which elements are inf or NaN (not a failure, `_overflow_decides`);
# 9053317 Max(x, -0.0) -> Pow(-1): a relu's +0.0 where ONNX Runtime's -0.0 gives -inf (a clip keeps -0.0 now);
# 11068116 Gemm alpha = 1.4e-45 folded into B flushed the weights (a scale after the sums now);
# 12061890 Pow by int 2^31 - 1 read as float32 2^31 (even): +inf for a negative base (pow(x, p - 1) * x now);
# 12069362 Sum with an int64 constant (refused now). The checker's own (mutants ORT refuses go to ONNX's reference,
# whose BatchNormalization-9 11063615, dilated Conv 12010801, Softmax before opset 13 12066739 and empty-axes
# Squeeze 12025125 are replaced; float16 graphs 12067163 at 1e-2), rounding inside a graph (12060690: a
# LayerNorm summed to ~0) and subnormal quanta (12072864), sums near float32's largest (12076057); 14014198 Min of a
# 0-d x and a (1,) bound: a clip that kept the 0-d shape (a broadcasting minimum now); 15125578 the checker's: a
# Softmax-11 without its axis, which onnx's evaluator gave the newest schema's -1 (the opset's default is 1)
FOUND = [1003963, 1015990, 1036922, 1003977, 1041598, 2005072, 2067734, 2045711, 4011540, 6018449, 2013470,
         2108331, 9053317, 11068116, 12061890, 12069362, 11063615, 12010801, 12066739, 12025125, 12067163, 12060690,
         12072864, 12076057, 14014198, 15125578]


@pytest.mark.parametrize("seed", FOUND)
def test_mutants_longer_runs_found(seed):
    problem = M.check(seed)
    assert problem is None, f"seed {seed}: {problem}"


def test_the_checker_fails_an_unnamed_error_and_a_wrong_value(monkeypatch):
    """The check can fail: an importer that raises an IndexError, and a runtime whose output is 0.1% off."""
    import tilefuse
    seed = next(s for s in range(200) if M.check(s) is None and _computed(s))
    real_import, real_run = tilefuse.from_onnx, tilefuse.Session.run
    monkeypatch.setattr(tilefuse, "from_onnx", lambda *a, **k: [][0])
    assert "IndexError" in (M.check(seed) or "")
    monkeypatch.setattr(tilefuse, "from_onnx", real_import)

    def off(self, *a, **k):
        y = np.array(real_run(self, *a, **k))
        y.reshape(-1)[np.argmax(np.abs(y))] *= 1.001
        return y
    monkeypatch.setattr(tilefuse.Session, "run", off)
    assert "error" in (M.check(seed) or "")


def _computed(seed) -> bool:
    """Whether tilefuse computes the mutant and ONNX Runtime runs it (so the values are compared)."""
    import tilefuse
    from tilefuse.errors import TilefuseError
    blob, x, _ = M.mutant(seed) or (None, None, None)
    if blob is None:
        return False
    try:
        net = tilefuse.from_onnx(blob)
        tilefuse.compile(net)
    except TilefuseError:
        return False
    n = len(M.ACCEPTED)
    return M.check(seed) is None and len(M.ACCEPTED) == n and len(net.inputs) == 1


@pytest.fixture(scope="module", autouse=True)
def _stop_the_ort_worker():
    yield
    while M._POOL:
        M._POOL.pop().shutdown(wait=True)


def test_a_mutant_ort_refuses_is_checked_against_onnxs_reference(monkeypatch):
    """Where ONNX Runtime refuses a mutant tilefuse computes (a dilated Conv with auto_pad SAME, seed 12010801),
    ONNX's reference evaluator decides: the right values pass, 0.1% off fails (before, any value passed)."""
    import tilefuse
    seed = 12010801
    assert isinstance(M._ort_run(*M.mutant(seed)[:2]), str)
    assert M.check(seed) is None
    real_run = tilefuse.Session.run

    def off(self, *a, **k):
        y = np.array(real_run(self, *a, **k))
        fin = np.isfinite(y)
        y[fin] = y[fin] * 1.001
        return y
    monkeypatch.setattr(tilefuse.Session, "run", off)
    assert "against ONNX's reference" in (M.check(seed) or "")
