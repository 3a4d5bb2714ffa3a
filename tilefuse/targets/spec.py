"""Hardware targets as data: a TOML file per machine, loaded and validated here.

A target file describes one machine the way Timeloop, SCALE-Sim and MAESTRO describe theirs
(shared/HARDWARE.md section 6): clocks, compute units, a list of memory levels, the links
between them and to the host, plus the parameters of the mapping strategy the machine's paper
uses. Every number is a table with its value and its source:

    [memory.AM]
    per = "core"
    capacity = { value = "768 KiB", source = "S 000:77", note = "array memory" }

Source tags (shared/HARDWARE.md): S stated in the seed paper, V verified in a public document,
R recalled (unchecked), D derived (the note gives the formula), M missing (the value is an
assumption; `range = [lo, hi]` gives its plausible range, which benchmarks sweep).

Units: capacities in B, KB/KiB, MB/MiB, GB/GiB (KB = KiB = 1024 B, the papers' usage for
on-chip memories); bandwidths in B/s, KB/s, MB/s, GB/s, TB/s (decimal), Gbit/s, or B/cycle
(then the table names its `clock`); frequencies in Hz, kHz, MHz, GHz; times in s, ms, us, ns.

`load_target(name_or_path)` (load.py) returns a `Target`; `Target.with_overrides(AM="1MiB", ddr="85GB/s")`
returns a changed copy. Anything missing or inconsistent raises `TargetError` naming the file
and the field.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import TilefuseError

TAGS = {"S": "stated in the seed", "V": "verified in a public document", "R": "recalled, unchecked",
        "D": "derived", "M": "missing: an assumption", "O": "override given by the user"}
MEMORY_SCOPES = ("core", "cluster", "chip", "card", "host", "pe", "row", "column", "pair")
DTYPES = ("float16", "float32", "int8", "int16", "int32")


class TargetError(TilefuseError, ValueError):
    """A target file (or an override) is missing a field or holds an inconsistent one."""

    def __init__(self, where: str, message: str):
        self.where = where
        super().__init__(f"{where}: {message}")


# ----------------------------------------------------------------------------- units

_CAP = {"b": 1, "kb": 1024, "kib": 1024, "mb": 1024 ** 2, "mib": 1024 ** 2, "gb": 1024 ** 3,
        "gib": 1024 ** 3}
_BW = {"b/s": 1.0, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12, "gbit/s": 1e9 / 8,
       "mbit/s": 1e6 / 8}
_FREQ = {"hz": 1.0, "khz": 1e3, "mhz": 1e6, "ghz": 1e9}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_NUM = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z/]*)\s*$")
KINDS = ("bytes", "bandwidth", "frequency", "time", "number")


def parse_quantity(raw, kind: str, where: str, clock_hz: float | None = None) -> float:
    """A number or a string with a unit -> float in base units (B, B/s, Hz, s)."""
    if isinstance(raw, bool):
        raise TargetError(where, f"found the boolean {raw}, expected a {kind}")
    if isinstance(raw, (int, float)):
        return _finite(float(raw), raw, kind, where)
    if not isinstance(raw, str):
        raise TargetError(where, f"found {type(raw).__name__} {raw!r}, expected a number or a "
                                 f"string with a unit")
    m = _NUM.match(raw)
    if not m:
        raise TargetError(where, f"cannot read {raw!r} as a {kind} (expected e.g. '768 KiB', "
                                 f"'42.6 GB/s', '1.6 GHz', '512 B/cycle')")
    v, unit = float(m.group(1)), m.group(2).lower()
    if not unit:
        return _finite(v, raw, kind, where)
    table = {"bytes": _CAP, "bandwidth": _BW, "frequency": _FREQ, "time": _TIME}.get(kind, {})
    if unit in table:
        return _finite(v * table[unit], raw, kind, where)
    if kind == "bandwidth" and unit == "b/cycle":
        if clock_hz is None:
            raise TargetError(where, f"{raw!r} is per cycle but the table names no clock; add "
                                     f"clock = \"<name of a [clock] entry>\"")
        return _finite(v * clock_hz, raw, kind, where)
    raise TargetError(where, f"unit '{m.group(2)}' is not a {kind} unit; expected one of "
                             f"{', '.join(sorted(table)) or 'none'}"
                      + (", b/cycle" if kind == "bandwidth" else ""))


MAGNITUDE = (1e-15, 1e18)      # what a number may be in base units (or 0): machines' times stay finite


def _finite(v: float, raw, kind: str, where: str) -> float:
    if not math.isfinite(v):
        raise TargetError(where, f"found {raw!r}, expected a finite {kind}")
    if v != 0 and not MAGNITUDE[0] <= abs(v) <= MAGNITUDE[1]:
        raise TargetError(where, f"found {raw!r}, a {kind} of {abs(v):.3g} in base units (B, B/s, Hz, s); "
                                 f"expected 0 or a magnitude in {MAGNITUDE[0]:g}..{MAGNITUDE[1]:g}")
    return v


def _unit_kind(raw) -> str:
    """The kind a value's unit names ("number" for a bare number or an unknown unit)."""
    m = _NUM.match(raw) if isinstance(raw, str) else None
    u = m.group(2).lower() if m else ""
    return ("bytes" if u in _CAP else "bandwidth" if u in _BW or u == "b/cycle" else
            "frequency" if u in _FREQ else "time" if u in _TIME else "number")


# What a strategy's parameter must be (Strategy.PARAMS maps each name to a rule): the rule's kind
# of quantity, the test and what the error says was expected. A tuple of numbers: one of them.
PARAM_RULES = {
    "count": ("number", lambda v: 1 <= v <= 2 ** 31 and v == int(v), "a whole number in 1..2^31"),
    "count0": ("number", lambda v: 0 <= v <= 2 ** 31 and v == int(v), "a whole number in 0..2^31"),
    "flag": ("number", lambda v: v in (0, 1), "0 or 1"),
    "fraction": ("number", lambda v: 0 <= v <= 1, "a fraction in [0, 1]"),
    "positive": ("number", lambda v: v > 0, "a number > 0"),
    "nonneg": ("number", lambda v: v >= 0, "a number >= 0"),
    "time": ("time", lambda v: v >= 0, "a time >= 0 (e.g. '1 us')"),
    "bandwidth": ("bandwidth", lambda v: v > 0, "a bandwidth > 0 (e.g. '10 GB/s')"),
}


def check_param(tgt: "Target", name: str, rule) -> None:
    """TargetError unless param.<name> of tgt (from the file or an override) obeys `rule`."""
    p = tgt.params[name]
    where = f"{tgt.path or tgt.name}" + (f" with {p.source[2:]}" if p.tag == "O" else "")
    if isinstance(rule, tuple):
        if p.value not in rule:
            raise TargetError(where, f"param.{name}: found {p.raw!r}, expected one of "
                                     f"{', '.join(str(v) for v in rule)} (strategy '{tgt.strategy}')")
        return
    kind, ok, expected = PARAM_RULES[rule]
    if p.kind not in ("number", kind):
        raise TargetError(where, f"param.{name}: found {p.raw!r}, a {p.kind} value; expected {expected}")
    if not ok(p.value):
        raise TargetError(where, f"param.{name}: found {p.raw!r}, expected {expected} "
                                 f"(strategy '{tgt.strategy}')")


def format_quantity(v: float, kind: str) -> str:
    if kind == "bytes":
        for u, s in (("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024)):
            if v >= s:
                return f"{v / s:.4g} {u}"
        return f"{v:.0f} B"
    if kind == "bandwidth":
        return f"{v / 1e9:.4g} GB/s"
    if kind == "frequency":
        return f"{v / 1e9:.4g} GHz" if v >= 1e9 else f"{v / 1e6:.4g} MHz"
    if kind == "time":
        return f"{v * 1e3:.4g} ms"
    return f"{v:.4g}"


# ----------------------------------------------------------------------------- values

@dataclass(frozen=True)
class Param:
    """One number of a target, with where it comes from."""
    path: str               # e.g. "memory.AM.capacity"
    value: float            # in base units
    kind: str
    source: str             # "S 000:77", "M assumed ..."
    note: str = ""
    range: tuple[float, float] | None = None
    raw: Any = None

    @property
    def tag(self) -> str:
        return self.source[:1]

    def text(self) -> str:
        return format_quantity(self.value, self.kind)


def _param(tbl, path: str, kind: str, where: str, clock_hz: float | None = None,
           required: bool = True, clocks: dict | None = None) -> Param | None:
    loc = f"{where}: {path}"
    if tbl is None:
        if required:
            raise TargetError(where, f"{path}: missing (every number is a table "
                                     f"{{ value = ..., source = \"S|V|R|D|M ...\" }})")
        return None
    if not isinstance(tbl, dict):
        raise TargetError(where, f"{path}: found {tbl!r}; expected a table {{ value = ..., "
                                 f"source = \"S|V|R|D|M ...\" }} so the number carries its source")
    unknown = set(tbl) - {"value", "source", "note", "range", "clock"}
    if unknown:
        raise TargetError(where, f"{path}: unknown key(s) {sorted(unknown)}; expected value, source, "
                                 f"note, range, clock")
    if "clock" in tbl:
        if not clocks or not isinstance(tbl["clock"], str) or tbl["clock"] not in clocks:
            raise TargetError(where, f"{path}.clock: found {tbl['clock']!r}, expected one of "
                                     f"{', '.join(clocks or {})}")
        clock_hz = clocks[tbl["clock"]].value
    if "value" not in tbl:
        raise TargetError(where, f"{path}.value: missing")
    src = tbl.get("source")
    if not isinstance(src, str) or not src.strip():
        raise TargetError(where, f"{path}.source: missing; every number needs its source tag "
                                 f"(S, V, R, D or M, then where)")
    if src.strip()[0] not in TAGS or (len(src.strip()) > 1 and not src.strip()[1].isspace()):
        raise TargetError(where, f"{path}.source: found {src!r}; expected it to start with one of "
                                 f"{', '.join(TAGS)} and a space")
    v = parse_quantity(tbl["value"], kind, loc, clock_hz)
    rng = None
    if "range" in tbl:
        r = tbl["range"]
        if not (isinstance(r, list) and len(r) == 2):
            raise TargetError(where, f"{path}.range: found {r!r}, expected [low, high]")
        rng = (parse_quantity(r[0], kind, loc + ".range", clock_hz),
               parse_quantity(r[1], kind, loc + ".range", clock_hz))
        if rng[0] > rng[1]:
            raise TargetError(where, f"{path}.range: found {r}, expected [low, high] with low <= high")
        if not rng[0] <= v <= rng[1]:
            raise TargetError(where, f"{path}: value {tbl['value']!r} lies outside its range {r}")
    elif src.strip()[0] == "M":
        raise TargetError(where, f"{path}.range: missing; a missing (M) value is an assumption and "
                                 f"must state its plausible range = [low, high]")
    return Param(path, v, kind, src.strip(), str(tbl.get("note", "")), rng, tbl["value"])


@dataclass(frozen=True)
class MemorySpec:
    name: str
    per: str                        # scope of one instance: core, cluster, chip, card, ...
    capacity: Param | None          # None: unbounded (host or DRAM of unknown size)
    bandwidth: Param | None = None  # read port to the compute units, if given
    double_buffered: bool = False
    note: str = ""


@dataclass(frozen=True)
class LinkSpec:
    name: str
    src: str
    dst: str
    bandwidth: Param
    efficiency: Param | None = None
    shared: bool = True             # one link for all cores (they contend) or one per core
    broadcast: bool = False         # one transfer can deliver the same bytes to every core
    latency: Param | None = None    # fixed cost per transfer

    @property
    def effective(self) -> float:
        """Bytes per second a transfer gets: bandwidth x efficiency."""
        return self.bandwidth.value * (self.efficiency.value if self.efficiency else 1.0)


@dataclass(frozen=True)
class Target:
    name: str
    title: str
    strategy: str
    seed: str
    dtype: str
    cores: int                      # cores used by default
    max_cores: int
    clocks: dict[str, Param]
    compute: dict[str, Param]       # units, macs_per_cycle.<dtype>, ...
    compute_clock: str
    memories: dict[str, MemorySpec]
    links: dict[str, LinkSpec]
    params: dict[str, Param]
    path: str = ""
    notes: str = ""
    overrides: dict[str, str] = field(default_factory=dict)

    # ------------------------------------------------------------------ accessors

    def clock(self, name: str | None = None) -> float:
        return self.clocks[name or self.compute_clock].value

    def macs_per_cycle(self, dtype: str | None = None) -> float:
        dt = dtype or self.dtype
        key = f"macs_per_cycle.{dt}"
        if key not in self.compute:
            have = sorted(k.split(".", 1)[1] for k in self.compute if k.startswith("macs_per_cycle."))
            raise TargetError(self.name, f"compute.macs_per_cycle.{dt}: missing; the target computes "
                                         f"in {', '.join(have)}")
        return self.compute[key].value

    def peak_flops(self, cores: int | None = None, dtype: str | None = None) -> float:
        """2 x MACs/cycle x clock x cores (1 MAC = 2 FLOP)."""
        n = self.cores if cores is None else cores
        return 2.0 * self.macs_per_cycle(dtype) * self.clock() * n

    def p(self, name: str) -> float:
        if name not in self.params:
            raise TargetError(self.name, f"param.{name}: missing (strategy '{self.strategy}' needs it)")
        return self.params[name].value

    def capacity(self, memory: str) -> float:
        m = self.memories[memory]
        return float("inf") if m.capacity is None else m.capacity.value

    def link(self, name: str) -> LinkSpec:
        if name not in self.links:
            raise TargetError(self.name, f"link.{name}: missing (strategy '{self.strategy}' needs it)")
        return self.links[name]

    def sources(self) -> list[Param]:
        """Every number with its source, for reports."""
        out = list(self.clocks.values()) + list(self.compute.values())
        for m in self.memories.values():
            out += [p for p in (m.capacity, m.bandwidth) if p is not None]
        for ln in self.links.values():
            out += [p for p in (ln.bandwidth, ln.efficiency, ln.latency) if p is not None]
        return out + list(self.params.values())

    def assumptions(self) -> list[Param]:
        """The missing (M) numbers: values the file assumes, each with its plausible range."""
        return [p for p in self.sources() if p.tag == "M"]

    # ------------------------------------------------------------------ overrides

    def with_overrides(self, **overrides) -> "Target":
        """A copy with some numbers replaced. Keys (case-insensitive):
        a memory name (its capacity), a link name (its bandwidth), a clock name (its frequency),
        'cores', a param name, or a dotted path such as 'link.ddr.efficiency' or
        'compute.macs_per_cycle.float16'. Values are numbers or strings with units."""
        t = self
        for key, val in overrides.items():
            t = t._override(key, val)
        return t

    def override_keys(self) -> list[str]:
        return (["cores"] + list(self.memories) + list(self.links) + list(self.clocks)
                + list(self.params) + [p.path for p in self.sources()])

    def _override(self, key: str, val) -> "Target":
        k = key.strip()
        lk = k.lower()
        where = f"override {key}={val!r}"
        rec = dict(self.overrides)
        rec[k] = str(val)
        if lk == "cores":
            n = int(parse_quantity(val, "number", where))
            if not 1 <= n <= self.max_cores or n != parse_quantity(val, "number", where):
                raise TargetError(where, f"cores must be an integer in 1..{self.max_cores}")
            return replace(self, cores=n, overrides=rec)
        path = None
        for names, fmt in ((self.memories, "memory.{}.capacity"), (self.links, "link.{}.bandwidth"),
                           (self.clocks, "clock.{}"), (self.params, "param.{}")):
            path = next((fmt.format(nm) for nm in names if nm.lower() == lk), path)
        if path is None and "." in k:
            path = k
        if path is None:
            raise TargetError(where, f"'{key}' names nothing in target '{self.name}'; expected one of "
                                     f"{', '.join(self.override_keys()[:40])}")
        return self._set(path, val, where, rec)

    def _set(self, path: str, val, where: str, rec: dict) -> "Target":
        parts = path.split(".")
        src = f"O {where}"

        def newp(old: Param | None, kind: str, clock_hz=None) -> Param:
            v = parse_quantity(val, kind, where, clock_hz)
            if v < 0 or (v == 0 and kind in ("bytes", "bandwidth", "frequency")):
                raise TargetError(where, f"{path} must be {'positive' if kind in ('bytes', 'bandwidth', 'frequency') else 'non-negative'}, found {val!r}")
            return Param(path, v, kind, src, f"was {old.text() if old else 'unset'} ({old.source if old else ''})",
                         None, val)
        sec = parts[0]
        if sec == "clock" and len(parts) == 2 and parts[1] in self.clocks:
            c = dict(self.clocks)
            c[parts[1]] = newp(c[parts[1]], "frequency")
            return replace(self, clocks=c, overrides=rec)
        if sec == "param" and len(parts) == 2 and parts[1] in self.params:
            p = dict(self.params)
            p[parts[1]] = newp(p[parts[1]], p[parts[1]].kind)
            return replace(self, params=p, overrides=rec)
        if sec == "compute" and ".".join(parts[1:]) in self.compute:
            c = dict(self.compute)
            key = ".".join(parts[1:])
            c[key] = newp(c[key], "number")
            if c[key].value <= 0 or key == "units" and not self.max_cores <= c[key].value == int(c[key].value):
                need = " and a whole number >= max_cores" if key == "units" else ""
                raise TargetError(where, f"{path} must be positive{need}, found {val!r}")
            return replace(self, compute=c, overrides=rec)
        if sec == "memory" and len(parts) == 3 and parts[1] in self.memories:
            m = self.memories[parts[1]]
            if parts[2] == "capacity":
                m = replace(m, capacity=newp(m.capacity, "bytes"))
            elif parts[2] == "bandwidth":
                m = replace(m, bandwidth=newp(m.bandwidth, "bandwidth"))
            else:
                raise TargetError(where, f"{path}: only capacity and bandwidth of a memory can be overridden")
            mem = dict(self.memories)
            mem[parts[1]] = m
            return replace(self, memories=mem, overrides=rec)
        if sec == "link" and len(parts) == 3 and parts[1] in self.links:
            ln = self.links[parts[1]]
            if parts[2] in ("bandwidth", "latency"):
                ln = replace(ln, **{parts[2]: newp(getattr(ln, parts[2]),
                                                   "bandwidth" if parts[2] == "bandwidth" else "time")})
            elif parts[2] == "efficiency":
                p = newp(ln.efficiency, "number")
                if not 0 < p.value <= 1:
                    raise TargetError(where, f"{path} is a fraction of the bandwidth; found {val!r}, "
                                             f"expected one in (0, 1]")
                ln = replace(ln, efficiency=p)
            else:
                raise TargetError(where, f"{path}: only bandwidth, efficiency and latency of a link "
                                         f"can be overridden")
            links = dict(self.links)
            links[parts[1]] = ln
            return replace(self, links=links, overrides=rec)
        raise TargetError(where, f"'{path}' names nothing in target '{self.name}'; expected one of "
                                 f"{', '.join(self.override_keys()[:40])}")


# ----------------------------------------------------------------------------- loading

def _need(tbl: dict, key: str, typ, where: str, path: str):
    if key not in tbl:
        raise TargetError(where, f"{path}{key}: missing")
    v = tbl[key]
    if not isinstance(v, typ) or isinstance(v, bool) and typ is not bool:
        raise TargetError(where, f"{path}{key}: found {v!r}, expected {getattr(typ, '__name__', typ)}")
    return v


def parse_target(doc: dict, where: str = "<target>", strategies: dict | None = None) -> Target:
    """Validate a parsed TOML document and build a Target (TargetError names the field).
    strategies: name -> class with `check_target(target)` (the fields that strategy needs)."""
    STRATEGIES = strategies or {}
    known = {"target", "clock", "compute", "memory", "link", "param"}
    extra = set(doc) - known
    if extra:
        raise TargetError(where, f"unknown section(s) {sorted(extra)}; expected {sorted(known)}")
    t = doc.get("target")
    if not isinstance(t, dict):
        raise TargetError(where, "[target]: missing (name, title, strategy, seed, dtype, cores)")
    name = _need(t, "name", str, where, "target.")
    title = _need(t, "title", str, where, "target.")
    strategy = _need(t, "strategy", str, where, "target.")
    if STRATEGIES and strategy not in STRATEGIES:
        raise TargetError(where, f"target.strategy: found '{strategy}', expected one of "
                                 f"{', '.join(sorted(STRATEGIES))}")
    seed = str(t.get("seed", ""))
    dtype = _need(t, "dtype", str, where, "target.")
    if dtype not in DTYPES:
        raise TargetError(where, f"target.dtype: found '{dtype}', expected one of {', '.join(DTYPES)}")
    cores = _need(t, "cores", int, where, "target.")
    max_cores = t.get("max_cores", cores)
    if not isinstance(max_cores, int) or isinstance(max_cores, bool) or not 1 <= cores <= max_cores:
        raise TargetError(where, f"target.cores / target.max_cores: found {cores} / {max_cores}; "
                                 f"expected integers with 1 <= cores <= max_cores")
    for sec in ("memory", "link", "param"):
        if not isinstance(doc.get(sec, {}), dict):
            raise TargetError(where, f"[{sec}]: found {doc[sec]!r}, expected a section of tables")
    clocks_t = doc.get("clock")
    if not isinstance(clocks_t, dict) or not clocks_t:
        raise TargetError(where, "[clock]: missing; name at least one clock domain")
    clocks = {k: _param(v, f"clock.{k}", "frequency", where) for k, v in clocks_t.items()}
    for k, p in clocks.items():
        if p.value <= 0:
            raise TargetError(where, f"clock.{k}: must be positive, found {p.raw!r}")

    def clock_of(tbl, path):
        c = tbl.get("clock")
        if c is None:
            return None
        if not isinstance(c, str) or c not in clocks:
            raise TargetError(where, f"{path}.clock: found '{c}', expected one of {', '.join(clocks)}")
        return clocks[c].value

    comp_t = doc.get("compute")
    if not isinstance(comp_t, dict):
        raise TargetError(where, "[compute]: missing (clock, units, macs_per_cycle.<dtype>)")
    cclock = _need(comp_t, "clock", str, where, "compute.")
    if cclock not in clocks:
        raise TargetError(where, f"compute.clock: found '{cclock}', expected one of {', '.join(clocks)}")
    compute: dict[str, Param] = {"units": _param(comp_t.get("units"), "compute.units", "number", where)}
    macs = comp_t.get("macs_per_cycle")
    if not isinstance(macs, dict) or not macs:
        raise TargetError(where, "compute.macs_per_cycle: missing; give MACs per cycle per unit for at "
                                 "least the target's dtype")
    for dt, v in macs.items():
        if dt not in DTYPES:
            raise TargetError(where, f"compute.macs_per_cycle.{dt}: unknown dtype; expected {', '.join(DTYPES)}")
        compute[f"macs_per_cycle.{dt}"] = _param(v, f"compute.macs_per_cycle.{dt}", "number", where)
    if f"macs_per_cycle.{dtype}" not in compute:
        raise TargetError(where, f"compute.macs_per_cycle.{dtype}: missing; target.dtype is {dtype}")
    for k, v in comp_t.items():
        if k in ("clock", "units", "macs_per_cycle"):
            continue
        compute[k] = _param(v, f"compute.{k}", "number", where)
    for k, p in compute.items():
        if p.value <= 0:
            raise TargetError(where, f"compute.{k}: must be positive, found {p.raw!r}")
    if compute["units"].value != int(compute["units"].value):
        raise TargetError(where, f"compute.units: found {compute['units'].raw!r}, expected a whole number")
    if compute["units"].value < max_cores:
        raise TargetError(where, f"compute.units: {compute['units'].raw} units but target.max_cores is "
                                 f"{max_cores}; expected units >= max_cores")
    if "peak_flops" in compute:     # a stated peak must agree with units x MACs x 2 x clock
        derived = 2 * compute[f"macs_per_cycle.{dtype}"].value * clocks[cclock].value * compute["units"].value
        stated = compute["peak_flops"].value
        if abs(derived - stated) > 0.02 * stated:
            raise TargetError(where, f"compute.peak_flops: states {stated / 1e9:.1f} GFLOP/s but units x "
                                     f"macs_per_cycle.{dtype} x 2 x clock.{cclock} = {derived / 1e9:.1f} "
                                     f"GFLOP/s; the numbers are inconsistent")

    mems: dict[str, MemorySpec] = {}
    for mname, m in (doc.get("memory") or {}).items():
        path = f"memory.{mname}"
        if not isinstance(m, dict):
            raise TargetError(where, f"{path}: expected a table")
        unknown = set(m) - {"per", "capacity", "bandwidth", "double_buffered", "note", "clock"}
        if unknown:
            raise TargetError(where, f"{path}: unknown key(s) {sorted(unknown)}")
        per = _need(m, "per", str, where, path + ".")
        if per not in MEMORY_SCOPES:
            raise TargetError(where, f"{path}.per: found '{per}', expected one of {', '.join(MEMORY_SCOPES)}")
        cap = m.get("capacity")
        capp = None if cap == "unbounded" else _param(cap, f"{path}.capacity", "bytes", where)
        if capp is not None and capp.value <= 0:
            raise TargetError(where, f"{path}.capacity: must be positive, found {capp.raw!r}")
        bw = _param(m.get("bandwidth"), f"{path}.bandwidth", "bandwidth", where, clock_of(m, path),
                    required=False, clocks=clocks)
        if bw is not None and bw.value <= 0:
            raise TargetError(where, f"{path}.bandwidth: must be positive, found {bw.raw!r}")
        db = m.get("double_buffered", False)
        if not isinstance(db, bool):
            raise TargetError(where, f"{path}.double_buffered: found {db!r}, expected true or false")
        mems[mname] = MemorySpec(mname, per, capp, bw, db, str(m.get("note", "")))

    links: dict[str, LinkSpec] = {}
    ends = set(mems) | {"host"}
    for lname, ln in (doc.get("link") or {}).items():
        path = f"link.{lname}"
        if not isinstance(ln, dict):
            raise TargetError(where, f"{path}: expected a table")
        unknown = set(ln) - {"from", "to", "bandwidth", "efficiency", "shared", "broadcast", "latency",
                             "note", "clock"}
        if unknown:
            raise TargetError(where, f"{path}: unknown key(s) {sorted(unknown)}")
        src = _need(ln, "from", str, where, path + ".")
        dst = _need(ln, "to", str, where, path + ".")
        for end, key in ((src, "from"), (dst, "to")):
            if end not in ends:
                raise TargetError(where, f"{path}.{key}: found '{end}', expected a memory of this file "
                                         f"({', '.join(sorted(mems))}) or 'host'")
        bwp = _param(ln.get("bandwidth"), f"{path}.bandwidth", "bandwidth", where, clock_of(ln, path),
                     clocks=clocks)
        if bwp.value <= 0:
            raise TargetError(where, f"{path}.bandwidth: must be positive, found {bwp.raw!r}")
        eff = _param(ln.get("efficiency"), f"{path}.efficiency", "number", where, required=False)
        if eff is not None and not 0 < eff.value <= 1:
            raise TargetError(where, f"{path}.efficiency: found {eff.raw!r}, expected a fraction in (0, 1]")
        lat = _param(ln.get("latency"), f"{path}.latency", "time", where, required=False)
        if lat is not None and lat.value < 0:
            raise TargetError(where, f"{path}.latency: must be >= 0, found {lat.raw!r}")
        for flag in ("shared", "broadcast"):
            if flag in ln and not isinstance(ln[flag], bool):
                raise TargetError(where, f"{path}.{flag}: found {ln[flag]!r}, expected true or false")
        links[lname] = LinkSpec(lname, src, dst, bwp, eff, ln.get("shared", True), ln.get("broadcast", False), lat)

    params = {}
    for pname, pv in (doc.get("param") or {}).items():
        kind = _unit_kind(pv.get("value")) if isinstance(pv, dict) else "number"
        params[pname] = _param(pv, f"param.{pname}", kind, where, clocks=clocks)
    tgt = Target(name, title, strategy, seed, dtype, cores, max_cores, clocks, compute, cclock, mems,
                 links, params, where, str(t.get("notes", "")))
    if STRATEGIES:
        STRATEGIES[strategy].check_target(tgt)   # the strategy's own required fields
    return tgt


def require(tgt: Target, memories=(), links=(), params=(), clocks=()) -> None:
    """Raise TargetError naming the first field a strategy needs that the file lacks, or the first
    parameter that breaks its rule (params: names, or a dict name -> PARAM_RULES key / allowed values)."""
    for section, names, have in (("memory", memories, tgt.memories), ("link", links, tgt.links),
                                 ("param", params, tgt.params), ("clock", clocks, tgt.clocks)):
        for nm in names:
            if nm not in have:
                raise TargetError(tgt.path, f"{section}.{nm}: missing (strategy '{tgt.strategy}' needs it)")
    if isinstance(params, dict):
        for nm, rule in params.items():
            check_param(tgt, nm, rule)
