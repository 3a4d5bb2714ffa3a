"""Target files tilefuse did not write: the built-in machine descriptions (tilefuse/targets/*.toml), each
changed one to three times the way a user's what-if edit, a typo or a hostile file would (numbers scaled
by 0, -1, 1e-300 ... 1e300 or made fractional, values replaced by strings, booleans, tables, NaN or
infinity, units swapped, keys removed or added, sections replaced, the TOML text itself cut or flipped),
then simulated: a small compiled program (or the seed's own job: a FilterJob on vck5000-aie, a
TrainingJob on trainer-004), functionally or timing only (tests/test_target_mutants.py; longer runs:
the command line below).

tilefuse must either refuse the file with a TilefuseError naming the field (TargetError, CapacityError,
UnsupportedOpError, SimulationError, ...) or simulate it; any other exception is a failure, as is a hang
(60 s). A simulation that runs must give every layer a finite, non-negative time, an efficiency and a
utilization in [0, 1], a report that renders and serializes, and, when it computes, the reference's
outputs: the target's numbers choose the blocking and the timing, never the result (the float16 targets
within 5e-3 of the float32 reference, the others within 1e-5; a FilterJob bit for bit).

    .venv/bin/python tests/target_mutants.py --seconds 300 [--seed 1]
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import random
import signal
import sys
import tempfile
import time
import tomllib
import traceback
from importlib import resources

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tilefuse  # noqa: E402
from tilefuse.errors import TilefuseError  # noqa: E402
from tilefuse.imaging.reference import correlate_reference  # noqa: E402
from tilefuse.targets import FilterJob, TrainingJob, builtin_names, load_target, simulate  # noqa: E402
from tilefuse.targets.spec import parse_target  # noqa: E402
from tilefuse.targets.strategies import STRATEGIES  # noqa: E402

TOL = {"float16": 5e-3, "float32": 1e-5, "int32": 0.0}       # relative to the reference's largest output
HANG_S = 60
TEXTS = {n: resources.files("tilefuse.targets").joinpath(n + ".toml").read_text() for n in builtin_names()}
DOCS = {n: tomllib.loads(t) for n, t in TEXTS.items()}
FACTORS = [0, -1, -0.5, 0.5, 1.5, 2, 3, 7, 1e3, 1e-3, 1e6, 1e-6, 1e30, 1e-30, 1e300, 1e-300, 1.0000001]
WILD = [0, -1, 1, 2, 0.5, -0.5, 1e300, -1e300, float("nan"), float("inf"), -float("inf"), "", "abc", True,
        False, [], {}, [1, 2], ["1 us", "0 us"], [2, 1], 2 ** 63, 2 ** 70, -2 ** 63, "0 GHz", "-5 KiB", "nan GHz",
        "inf KiB", "1e400 GB/s", "1 B/cycle", "0 B", "1e-300 us", "1e300 us", "5", "3 GHz", "1 KiB", "1e9",
        1e-300, 7, 64, 3, 1000000, {"value": 1}, {"value": 1, "source": "S x"}, {"value": 2, "source": "M x"},
        {"value": 2, "source": "M x", "range": [1, 3]}, "S made up", "M guess", "core", "chip", "AM", "host"]
UNIT_NUMBERS = ["0", "-1", "nan", "inf", "1e308", "1e-320", "2", "0.5", "1e12", "3"]
UNITS = ["B", "KiB", "MiB", "GB", "GB/s", "Gbit/s", "B/cycle", "GHz", "MHz", "Hz", "us", "ns", "s", "furlongs", ""]


# ----------------------------------------------------------------------------- mutations

def _leaves(d, path=()):
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _leaves(v, path + (k,))
    if path:
        yield path


def _get(d, path):
    for k in path:
        d = d[k]
    return d


def _numbers(doc):
    """Paths of the numbers (and quantity strings) a file states: the `value`s and the bare ones."""
    out = []
    for p in _leaves(doc):
        v = _get(doc, p)
        if (isinstance(v, (int, float)) and not isinstance(v, bool)) or (
                isinstance(v, str) and v[:1].isdigit()):
            out.append(p)
    return out


def _mutate(doc, r: random.Random) -> str:
    how = r.random()
    nums = _numbers(doc)
    if how < 0.45 and nums:                              # a stated number scaled
        p = r.choice(nums)
        v = _get(doc, p)
        f = r.choice(FACTORS)
        if isinstance(v, str):
            num, _, unit = v.partition(" ")
            try:
                new = f"{float(num) * f!r} {unit}".strip()
            except ValueError:
                new = r.choice(UNIT_NUMBERS) + " " + unit
        else:
            new = v * f
            if isinstance(v, int) and r.random() < 0.5 and math.isfinite(new):
                new = int(new)
        _get(doc, p[:-1])[p[-1]] = new
        return f"{'.'.join(p)} = {new!r} (was {v!r})"
    if how < 0.55 and nums:                              # a quantity's number or unit swapped
        p = r.choice(nums)
        v = _get(doc, p)
        new = f"{r.choice(UNIT_NUMBERS)} {r.choice(UNITS)}".strip()
        _get(doc, p[:-1])[p[-1]] = new
        return f"{'.'.join(p)} = {new!r} (was {v!r})"
    paths = list(_leaves(doc))
    p = r.choice(paths)
    parent = _get(doc, p[:-1])
    if how < 0.70:
        new = copy.deepcopy(r.choice(WILD))
        old = parent[p[-1]]
        parent[p[-1]] = new
        return f"{'.'.join(p)} = {new!r} (was {old!r:.60})"
    if how < 0.85:
        del parent[p[-1]]
        return f"removed {'.'.join(p)}"
    if how < 0.93:
        name = r.choice(["extra", "value", "source", "range", "clock", "per", "units", "cores", "note", "x"])
        parent[name] = copy.deepcopy(r.choice(WILD))
        return f"{'.'.join(p[:-1] + (name,))} = {parent[name]!r} (added)"
    sec = r.choice(["target", "clock", "compute", "memory", "link", "param", "extra"])
    doc[sec] = copy.deepcopy(r.choice(WILD))
    return f"[{sec}] = {doc[sec]!r}"


def _mutate_text(text: str, r: random.Random) -> tuple[str, str]:
    """The TOML text cut short or with a few characters replaced."""
    if r.random() < 0.5:
        n = r.randrange(len(text))
        return text[:n], f"text cut at {n}"
    chars = list(text)
    for _ in range(r.randint(1, 4)):
        chars[r.randrange(len(chars))] = r.choice(list("=[]{}\"'.,#\n 0-9eE\x00\u00e9"))
    return "".join(chars), "text characters replaced"


# ----------------------------------------------------------------------------- workloads

def _conv_net(seed: int = 0) -> tilefuse.Network:
    """conv 3x3 + ReLU, conv 1x1, a residual add, a max pool: the ops every conv target maps."""
    g = np.random.default_rng(seed)
    net = tilefuse.Network("mutant_net")
    x = net.input("x", (2, 8, 12, 12))
    w3 = (g.standard_normal((16, 8, 3, 3)) / 8.5).astype(np.float32)
    w1 = (g.standard_normal((8, 16, 1, 1)) / 4).astype(np.float32)
    y = net.relu(net.conv2d(x, w3, g.standard_normal(16).astype(np.float32), padding=1, name="c3"))
    z = net.conv2d(y, w1, None, name="c1")
    net.output(net.max_pool(net.relu(net.add(z, x)), 2, 2))
    return net


_CACHE: dict = {}


def _workloads():
    """[(what, inputs, reference outputs)] compiled programs, built once per process."""
    if not _CACHE:
        progs = []
        for net in (_conv_net(), tilefuse.models.resnet18(image_size=32, num_classes=10)):
            x = np.random.default_rng(1).standard_normal(net.inputs[0].shape).astype(np.float32)
            progs.append((tilefuse.compile(net), x, tilefuse.evaluate(net, x)))
        _CACHE["progs"] = progs
    return _CACHE["progs"]


def _job(name: str, r: random.Random):
    """The seed's own job for the targets that have one (None otherwise)."""
    if name == "vck5000-aie":
        k = np.array(r.choice([[[1, 2, 1], [2, 4, 2], [1, 2, 1]], np.arange(25).reshape(5, 5) - 12, [[3]]]))
        img = np.random.default_rng(r.randrange(99)).integers(-2 ** 20, 2 ** 20, (37, 70)).astype(np.int32)
        return FilterJob(k, img, border=r.choice(["replicate", "constant"]))
    if name == "trainer-004":
        return TrainingJob(_conv_net(), schedule=r.choice(["fused", "separate"]))
    return None


# ----------------------------------------------------------------------------- the check

def _target(seed: int, r: random.Random):
    """(target or None when refused, description of the mutations)."""
    name = r.choice(sorted(DOCS))
    if r.random() < 0.08:                                # the file's text itself damaged
        text, what = _mutate_text(TEXTS[name], r)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, f"{name}.toml")
            with open(path, "w", encoding="utf-8", errors="surrogatepass") as f:
                f.write(text)
            try:
                return load_target(path), name, [what]
            except TilefuseError:
                return None, name, [what]
    doc = copy.deepcopy(DOCS[name])
    muts = [_mutate(doc, r) for _ in range(r.randint(1, 3))]
    try:
        tgt = parse_target(doc, name, STRATEGIES)
    except TilefuseError:
        return None, name, muts
    if r.random() < 0.15:                                # and an override on top, as `simulate(..., AM=...)` takes
        keys = tgt.override_keys()
        key = r.choice(keys)
        val = copy.deepcopy(r.choice(WILD + ["1 MiB", "85 GB/s", 1, 2, 4, 0.9]))
        muts.append(f"override {key}={val!r}")
        try:
            tgt = tgt.with_overrides(**{key: val})
        except TilefuseError:
            return None, name, muts
    return tgt, name, muts


def _rel_err(outs, refs) -> float:
    worst = 0.0
    for a, b in zip(outs, refs):
        if a.shape != b.shape:
            return math.inf
        scale = max(float(np.abs(b).max()), 1e-30)
        worst = max(worst, float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()) / scale)
    return worst


def check(seed: int) -> str | None:
    """None when the mutant target is refused by name or simulates correctly; else what went wrong."""
    r = random.Random(seed)
    tgt, name, muts = _target(seed, r)
    where = f"seed {seed} {name}: {'; '.join(muts)}"
    if tgt is None:
        return None
    job = _job(tgt.strategy if tgt.strategy in ("vck5000-aie", "trainer-004") else name, r)
    functional = r.random() < 0.6
    if job is not None and r.random() < 0.7:
        what, x, ref = job, None, None
    else:
        what, x, ref = r.choice(_workloads())
    use_alarm = hasattr(signal, "SIGALRM") and signal.getsignal(signal.SIGALRM) is _on_alarm
    if use_alarm:
        signal.alarm(HANG_S)
    try:
        rep = simulate(what, tgt, inputs=x, functional=functional)
    except _Hang:
        return f"{where}: simulate ran past {HANG_S} s"
    except TilefuseError:
        return None
    except Exception as e:      # noqa: BLE001 - the point: anything else is a failure
        return f"{where}: {type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}"
    finally:
        if use_alarm:
            signal.alarm(0)
    for lay in rep.layers:
        if not (math.isfinite(lay.seconds) and lay.seconds >= 0):
            return f"{where}: layer {lay.name} takes {lay.seconds!r} s"
        if not (0.0 <= lay.efficiency <= 1.0 + 1e-9 and lay.utilization <= 1.0 + 1e-9):
            return f"{where}: layer {lay.name} efficiency {lay.efficiency!r} utilization {lay.utilization!r}"
    try:
        rep.table()
        json.dumps(rep.to_dict(), allow_nan=False)
    except Exception as e:      # noqa: BLE001
        return f"{where}: the report does not render: {type(e).__name__}: {e}"
    if functional and isinstance(what, FilterJob):
        want = correlate_reference(what.image, what.kernel, what.border)
        if not np.array_equal(rep.outputs[0], want):
            return f"{where}: FilterJob output differs from the reference in {(rep.outputs[0] != want).sum()} pixels"
    elif functional and ref is not None:
        err = _rel_err(rep.outputs, ref)
        if not err <= TOL[tgt.dtype if tgt.dtype in TOL else "float32"]:
            return f"{where}: outputs {err:.3g} off the reference (tolerance {TOL.get(tgt.dtype)})"
    return None


class _Hang(Exception):
    pass


def _on_alarm(*_):
    raise _Hang()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--show", type=int, default=20, help="failures printed in full")
    a = ap.parse_args(argv)
    signal.signal(signal.SIGALRM, _on_alarm)
    t0, n, bad = time.time(), 0, 0
    while time.time() - t0 < a.seconds:
        seed = a.seed * 10 ** 7 + n
        msg = check(seed)
        n += 1
        if msg:
            bad += 1
            if bad <= a.show:
                print(msg, flush=True)
    print(f"{bad} of {n} mutant targets failing ({time.time() - t0:.0f} s, seed {a.seed})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
