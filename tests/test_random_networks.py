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
