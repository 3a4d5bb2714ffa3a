"""compile(tune=True): candidates measured per conv layer, choices persisted in a validated JSON
cache keyed by layer shape and machine. Every test uses its own cache directory."""
import json
import warnings

import numpy as np
import pytest

import tilefuse
from tilefuse.compiler import tune


def small_net(c=32):
    rng = np.random.default_rng(0)
    net = tilefuse.Network("tunable")
    x = net.input("x", (1, c, 10, 10))
    y = net.relu(net.conv2d(x, rng.standard_normal((c, c, 3, 3)) * 0.1, rng.standard_normal(c), padding=1))
    y = net.conv2d(y, rng.standard_normal((c, c, 1, 1)) * 0.1)
    net.output(y)
    return net, rng.standard_normal((1, c, 10, 10)).astype(np.float32)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(tune.CACHE_ENV, str(tmp_path))
    return tmp_path


def test_tune_measures_persists_and_reuses(cache_dir, monkeypatch):
    net, x = small_net()
    c = tilefuse.compile(net, tune=True, threads=1)
    doc = json.loads((cache_dir / "tune.json").read_text())
    assert doc["format"] == "tilefuse-tune" and doc["version"] == 1
    (machine, layers), = doc["entries"].items()
    assert "1 threads" in machine and len(layers) == 2
    for entry in layers.values():
        assert entry["algorithm"] == min(entry["seconds"], key=entry["seconds"].get)
    convs = [r for r in c.plan().rows if r["kernel"] == "conv2d"]
    assert all(r["measured_seconds"] and r["measured_seconds"] > 0 for r in convs)
    assert " ms" in str(c.plan()) or "ms" in str(c.plan()).splitlines()[0]
    want = tilefuse.Session(tilefuse.compile(net, algorithm="reference")).run(x)
    assert np.abs(tilefuse.Session(c).run(x) - want).max() <= 5e-3 * max(1, np.abs(want).max())

    # second compile: from the cache, nothing measured
    monkeypatch.setattr(tune, "measure", lambda *a, **k: pytest.fail("measured although cached"))
    c2 = tilefuse.compile(net, tune=True, threads=1)
    assert all(t["cached"] for t in c2.tuning.values())
    assert [r["algorithm"] for r in c2.plan().rows] == [r["algorithm"] for r in c.plan().rows]


def test_machine_key_separates_thread_counts(cache_dir):
    assert tune.machine_key(1) != tune.machine_key(2)
    net, _ = small_net(c=16)
    tilefuse.compile(net, tune=True, threads=1)
    tilefuse.compile(net, tune=True, threads=2)
    assert len(json.loads((cache_dir / "tune.json").read_text())["entries"]) == 2


@pytest.mark.parametrize("content", [
    "not json {",
    "[]",
    json.dumps({"format": "something-else", "version": 1, "entries": {}}),
    json.dumps({"format": "tilefuse-tune", "version": 1, "entries": {"m": {"l": {"algorithm": "fft",
                                                                              "seconds": {}}}}}),
    json.dumps({"format": "tilefuse-tune", "version": 1,
                "entries": {"m": {"l": {"algorithm": "direct", "seconds": {"direct": -1}}}}}),
    "\x00\x01\x02",
])
def test_bad_cache_file_warns_and_is_replaced(cache_dir, content):
    (cache_dir / "tune.json").write_text(content)
    net, _ = small_net(c=16)
    with pytest.warns(UserWarning, match="tune cache"):
        tilefuse.compile(net, tune=True, threads=1)
    doc = json.loads((cache_dir / "tune.json").read_text())   # rewritten, valid
    assert tune._validate(doc)


def test_cached_choice_must_still_be_a_candidate(cache_dir):
    net, _ = small_net(c=16)
    tilefuse.compile(net, tune=True, threads=1)
    path = cache_dir / "tune.json"
    doc = json.loads(path.read_text())
    for entries in doc["entries"].values():
        for e in entries.values():
            e["algorithm"] = "gemm1x1"   # valid name, but not applicable to the 3x3 layer
    path.write_text(json.dumps(doc))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = tilefuse.compile(net, tune=True, threads=1)
    algs = [r["algorithm"] for r in c.plan().rows if r["kernel"] == "conv2d"]
    assert algs[0] != "gemm1x1"


def test_default_cache_location(monkeypatch, tmp_path):
    monkeypatch.delenv(tune.CACHE_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert tune.cache_path() == tmp_path / ".cache" / "tilefuse"
