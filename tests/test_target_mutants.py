"""Target files tilefuse did not write (tests/target_mutants.py): every mutant of the built-in machine
descriptions is refused by name or simulates to the reference's outputs with finite times and efficiencies
in [0, 1]; the seeds that found a bug stay here."""
from __future__ import annotations

import numpy as np
import pytest

import target_mutants as tm
import tilefuse
from tilefuse.errors import UnsupportedOpError
from tilefuse.targets import CapacityError, FilterJob, load_target, simulate

CHUNK = 1500


@pytest.mark.parametrize("start", [0, 1, 2, 3])
def test_mutant_targets_are_refused_or_simulated_correctly(start):
    bad = [msg for s in range(start * CHUNK, (start + 1) * CHUNK) if (msg := tm.check(77 * 10 ** 6 + s))]
    assert not bad, "\n".join(bad[:5])


# seeds of `tests/target_mutants.py` runs that failed before the fix beside them (run, what was wrong)
FOUND = [
    10000809,   # cambricon-x dot_width 32 > 16 multipliers: efficiency 1.35
    10004208,   # host macs_per_cycle 1.6e-29: a max pool at 4e28 efficiency
    10022082,   # vck5000-aie clock.pl 1e-300 Hz: an infinite time in the report's JSON
    20014431,   # virtex7-690t cores 3: the logic-lane max pool at efficiency 24
    20028229,   # vck5000-aie override macs_per_cycle 0: ZeroDivisionError in the report
    30037529,   # vck5000-aie override link efficiency 0: ZeroDivisionError
    30071137,   # vck5000-aie macs_per_cycle 1e-320: an infinite efficiency
    50048471,   # trainer-004 cores 3 under a 512-PU array: efficiency 28.6
    60051784,   # ft-m7032 override macs_per_cycle 1 under 16 VPEs x 3 FMACs x 4: efficiency 6.8
]


@pytest.mark.parametrize("seed", FOUND)
def test_found_seeds(seed):
    assert tm.check(seed) is None


def test_the_checker_can_fail(monkeypatch):
    """A simulation whose output is off, or whose time is infinite, is reported, not passed."""
    seeds = [s for s in range(80 * 10 ** 6, 80 * 10 ** 6 + 400) if tm._target(s, tm.random.Random(s))[0] is not None]
    real = tm.simulate

    def off(*a, **kw):
        rep = real(*a, **kw)
        if rep.outputs:
            rep.outputs = [o + (np.abs(o).max() + 1) * np.asarray(1e-2, o.dtype) for o in rep.outputs]
        return rep
    monkeypatch.setattr(tm, "simulate", off)
    found = [m for s in seeds if (m := tm.check(s))]
    assert any("off the reference" in m or "differs from the reference" in m for m in found), found[:3]

    def endless(*a, **kw):
        rep = real(*a, **kw)
        rep.layers[0].seconds = float("inf")
        return rep
    monkeypatch.setattr(tm, "simulate", endless)
    found = [m for s in seeds if (m := tm.check(s))]
    assert any("takes inf s" in m for m in found), found[:3]


def test_filter_job_tiles_are_checked_before_the_frame_is_padded():
    """A tile taller than the window memory is a CapacityError at once (it padded a 32e6-row frame first),
    and a tile no larger than the kernel is refused by name (it was a ValueError from range())."""
    img = np.zeros((48, 64), np.int32)
    with pytest.raises(CapacityError, match=r"window.*input window\[0\] 32000000x64"):
        simulate(FilterJob(np.ones((3, 3), np.int32), img), load_target("vck5000-aie", tile_height=32_000_000))
    with pytest.raises(UnsupportedOpError, match=r"a 3x3 kernel does not fit a 2x64 tile"):
        simulate(FilterJob(np.ones((3, 3), np.int32), img), load_target("vck5000-aie", tile_height=2))


def test_logic_stage_efficiency_stays_below_one_with_few_dsps():
    """virtex7-690t with a few DSPs: its pools run on logic lanes faster than the DSPs' peak; measured
    against what they ran on, not above 100%."""
    rep = simulate(tilefuse.compile(tilefuse.models.get("tinynet")), "virtex7-690t", cores=1)
    assert all(0 <= r.efficiency <= 1 + 1e-9 for r in rep.layers), [(r.name, r.efficiency) for r in rep.layers]
    assert any(r.kernel == "max_pool" for r in rep.layers)
