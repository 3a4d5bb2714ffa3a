"""Auto-tuning of the conv algorithm per layer: `tilefuse.compile(net, tune=True)`.

For every conv the compiler asks `choose()`: the candidates (`kernels.conv.candidates`) are
timed on this machine, each in the layout it would run in (NCHW16c for the blocked forms),
with random data of the layer's shape, the fused epilogue and the session's thread count;
the fastest wins. Results persist in a JSON file so a layer is measured once per machine:

    $TILEFUSE_CACHE_DIR/tune.json        (default ~/.cache/tilefuse/tune.json)
    {"format": "tilefuse-tune", "version": 1,
     "entries": {"<machine key>": {"<layer key>": {"algorithm": "winograd4",
                                                   "seconds": {"direct": 0.0012, ...}}}}}

machine key: CPU model | LLVM CPU name and vector width the kernels are compiled for (kernels/isa.py) |
             usable cores | threads | OpenBLAS core type (the BLAS kernels change
             the GEMM-based algorithms' speed, and OPENBLAS_CORETYPE is set per process) |
             fingerprint of the conv kernels' source (a changed kernel is measured again)
layer key:   x shape | weight shape | stride | padding | dilation | groups | residual | relu |
             winograd allowed | layout mode

The file is plain JSON (no pickle), validated on load: anything malformed gives one warning
and is ignored (tuning measures again and rewrites the file), never an exception. Writes go
to a temporary file then `os.replace`, so a crash never leaves half a file.
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

FORMAT, VERSION = "tilefuse-tune", 1
CACHE_ENV = "TILEFUSE_CACHE_DIR"


def cache_path() -> Path:
    base = os.environ.get(CACHE_ENV)
    return Path(base) if base else Path.home() / ".cache" / "tilefuse"


def cpu_model() -> str:
    from ..kernels.isa import cpu_model as model
    return model()


_FINGERPRINT: str | None = None


def kernels_fingerprint() -> str:
    """A short hash of the conv kernels' source files: tuned choices are only valid for them."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        import hashlib
        from ..kernels import conv
        h = hashlib.sha256()
        for f in sorted(Path(conv.__file__).parent.glob("*.py")):
            h.update(f.name.encode() + b"\0" + f.read_bytes())
        _FINGERPRINT = h.hexdigest()[:12]
    return _FINGERPRINT


def machine_key(threads: int) -> str:
    from ..kernels.isa import info
    from ..kernels.blas import blas_info
    from ..kernels.threads import cpu_count
    i = info()
    return (f"{i['cpu_model']}|{i['llvm_cpu']} {i['vector_bits']}-bit|{cpu_count()} cores|{threads} threads"
            f"|blas {blas_info()}|kernels {kernels_fingerprint()}")


def layer_key(x_shape, w_shape, p: dict, allow_winograd: bool, layout_mode: str) -> str:
    return (f"x{list(x_shape)}|w{list(w_shape)}|s{list(p['stride'])}|p{list(p['padding'])}|d{list(p['dilation'])}"
            f"|g{p['groups']}|res{int(bool(p['has_residual']))}|relu{int(bool(p['relu']))}"
            f"|wino{int(bool(allow_winograd))}|{layout_mode}")


class TuneCache:
    """The JSON file's entries; `load()` never raises on a bad file."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path is not None else cache_path() / "tune.json"
        self.entries: dict[str, dict[str, dict]] = {}
        self.dirty = False

    def load(self) -> "TuneCache":
        try:
            raw = self.path.read_text()
        except FileNotFoundError:
            return self
        except OSError as e:
            warnings.warn(f"tilefuse tune cache {self.path}: cannot read ({e}); ignoring it")
            return self
        try:
            self.entries = _validate(json.loads(raw))
        except (ValueError, TypeError) as e:
            warnings.warn(f"tilefuse tune cache {self.path} is invalid ({e}); ignoring it, tuning again")
            self.entries = {}
        return self

    def get(self, machine: str, layer: str) -> dict | None:
        return self.entries.get(machine, {}).get(layer)

    def put(self, machine: str, layer: str, algorithm: str, seconds: dict[str, float]) -> None:
        self.entries.setdefault(machine, {})[layer] = {"algorithm": algorithm,
                                                      "seconds": {k: float(v) for k, v in seconds.items()}}
        self.dirty = True

    def save(self) -> None:
        if not self.dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"format": FORMAT, "version": VERSION, "entries": self.entries}
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tune-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        self.dirty = False


def _validate(doc) -> dict:
    from ..kernels.conv import ALGORITHMS
    if not isinstance(doc, dict):
        raise ValueError(f"top level is {type(doc).__name__}, expected an object")
    if doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise ValueError(f"format/version {doc.get('format')!r}/{doc.get('version')!r}, "
                         f"expected {FORMAT!r}/{VERSION}")
    entries = doc.get("entries")
    if not isinstance(entries, dict):
        raise ValueError("'entries' must be an object")
    for mk, layers in entries.items():
        if not isinstance(layers, dict):
            raise ValueError(f"entries[{mk!r}] must be an object")
        for lk, e in layers.items():
            where = f"entries[{mk!r}][{lk!r}]"
            if not isinstance(e, dict) or e.get("algorithm") not in ALGORITHMS:
                raise ValueError(f"{where}: 'algorithm' must be one of {ALGORITHMS}")
            secs = e.get("seconds")
            if not isinstance(secs, dict) or not all(
                    k in ALGORITHMS and isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e4
                    for k, v in secs.items()):
                raise ValueError(f"{where}: 'seconds' must map algorithm names to positive numbers")
    return entries


def measure(algorithm: str, layout: str, x_shape, w_shape, p: dict, threads: int, reps: int = 3,
            seed: int = 0) -> float:
    """Median seconds of one conv call (after a warm-up call that also triggers the JIT)."""
    from ..kernels.conv import conv2d_prepare, conv2d_run, conv2d_run_nchwc, to_nchwc
    from ..kernels.reference import conv_out_size
    rng = np.random.default_rng(seed)
    n, ci, h, w = x_shape
    co, _, kh, kw = w_shape
    st, pad, dil = p["stride"], p["padding"], p["dilation"]
    ho = conv_out_size(h, kh, st[0], pad[0], pad[1], dil[0])
    wo = conv_out_size(w, kw, st[1], pad[2], pad[3], dil[1])
    x = rng.standard_normal(x_shape, dtype=np.float32)
    wt = rng.standard_normal(w_shape, dtype=np.float32)
    b = np.zeros(co, np.float32)
    prep = conv2d_prepare(algorithm, wt, b, st, pad, dil, p["groups"], layout=layout)
    kw_ = dict(stride=st, padding=pad, dilation=dil, groups=p["groups"], relu=p["relu"], threads=threads)
    if layout == "nchwc":
        xb = to_nchwc(x)
        out = np.empty((n, -(-co // 16), ho, wo, 16), np.float32)
        res = np.zeros_like(out) if p["has_residual"] else None
        call = lambda: conv2d_run_nchwc(algorithm, out, xb, prep, res, **kw_)  # noqa: E731
    else:
        out = np.empty((n, co, ho, wo), np.float32)
        res = np.zeros_like(out) if p["has_residual"] else None
        call = lambda: conv2d_run(algorithm, out, x, prep, res, **kw_)  # noqa: E731
    call()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        call()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def tune_candidates(x_shape, w_shape, p: dict, allow_winograd: bool, layout_mode: str) -> list[str]:
    """The algorithms tuning times: when the layer can run blocked, only the blocked ones (an
    NCHW kernel that wins in isolation would cost two layout conversions in the network)."""
    from ..kernels.conv import candidates
    from .layout import NCHWC, conv_layout
    cands = candidates(x_shape, w_shape, p["stride"], p["padding"], p["dilation"], p["groups"], allow_winograd)
    blocked = [a for a in cands if conv_layout(a, layout_mode, x_shape[1], w_shape[0], p["groups"]) == NCHWC]
    return blocked or cands


def choose(cache: TuneCache, x_shape, w_shape, p: dict, *, threads: int, allow_winograd: bool,
           layout_mode: str, reps: int = 3) -> tuple[str, dict[str, float], bool]:
    """(algorithm, {candidate: seconds}, from_cache) for one conv layer."""
    from .layout import conv_layout
    cands = tune_candidates(x_shape, w_shape, p, allow_winograd, layout_mode)
    mk, lk = machine_key(threads), layer_key(x_shape, w_shape, p, allow_winograd, layout_mode)
    hit = cache.get(mk, lk)
    if hit is not None and hit["algorithm"] in cands:
        return hit["algorithm"], dict(hit["seconds"]), True
    secs = {a: measure(a, conv_layout(a, layout_mode, x_shape[1], w_shape[0], p["groups"]), x_shape, w_shape, p,
                       threads, reps) for a in cands}
    best = min(secs, key=secs.get)
    cache.put(mk, lk, best, secs)
    return best, secs, False
