"""Seeded random networks against the reference evaluator (tests/random_nets.py; longer runs: its command
line). Each seed is a small network of the layer kinds real models combine, at odd channel counts and map
sizes: the compiled program on 1-3 threads (the same bits on each, and after save / load), the streamed
schedule at band_rows 1-8, and sessions shared by four threads. The stream seeds below include networks
whose layers never read the input's last row (an avg pool on an odd height, a 1x1/2 conv on an even one),
which the streaming dry run once refused with an IndexError. The mixed seeds draw from more of the vocabulary
(random_nets.build_mixed: transposed convs, channel norms, concats, ShuffleNetV2 units, resize, pad, SE with
hardsigmoid gates, adaptive / ceil-mode pools, classifier heads); 1392, 4007, 5701, 6056 and 1004752 put a
constant pad before a channel norm, whose float32 mean of equal values once missed by an ulp (kernel and
reference, 1.3e-4-3e-4 of the output's max)."""
from __future__ import annotations

import pytest

import random_nets as R

COMPILE_SEEDS = range(0, 96)
STREAM_SEEDS = range(0, 64)          # 41, 42, 46, 61: layers done before the last input row
SESSION_SEEDS = range(0, 16)
MIXED_SEEDS = list(range(0, 96)) + [1392, 4007, 5701, 6056, 1004752]


@pytest.mark.parametrize("seed", COMPILE_SEEDS)
def test_random_network_compiled_matches_reference(seed):
    problem = R.check_compiled(seed)
    assert problem is None, f"seed {seed}: {problem}"


@pytest.mark.parametrize("seed", STREAM_SEEDS)
def test_random_network_streamed_matches_reference(seed):
    problem = R.check_streamed(seed)
    assert problem is None, f"seed {seed}: {problem}"


@pytest.mark.parametrize("seed", SESSION_SEEDS)
def test_random_network_shared_sessions_from_threads(seed):
    problem = R.check_sessions(seed)
    assert problem is None, f"seed {seed}: {problem}"


@pytest.mark.parametrize("seed", MIXED_SEEDS)
def test_random_mixed_network_compiled_and_streamed_match_reference(seed):
    problem = R.check_compiled(seed, R.build_mixed) or R.check_mixed_streamed(seed)
    assert problem is None, f"seed {seed}: {problem}"


def test_a_hung_seed_ends_the_run_with_its_seed_and_stacks():
    """run_seeds' watchdog: a seed past its limit stops the run (status 2) naming the seed, with the summary
    and the stack where it hangs (a train_modern run was once killed by an outer timeout without a word:
    seed 65000701 looped forever in train_winograd.pitch)."""
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    code = ("import random_nets as R\n"
            "def fn(seed):\n"
            "    while seed == 2:\n"
            "        pass\n"
            "    return 'wrong' if seed == 1 else None\n"
            "R.run_seeds(fn, 60, 0, 'demo', seed_limit=1.5)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.path.join(here, "..")]))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "seed 1: wrong" in r.stdout and "seed 2: still running after 2 s" in r.stdout, r.stdout
    assert "in fn" in r.stdout and "demo: 2 seeds, 2 failing (stopped at the hung seed)" in r.stdout, r.stdout
