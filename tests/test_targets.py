"""Target files: the built-in machines load, every number carries its source, a user's file needs
no code, and a missing or inconsistent field is rejected naming the field."""
from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from importlib import resources
from pathlib import Path

import pytest

from tilefuse.targets import TargetError, builtin_names, load_target, parse_quantity

BUILTIN = ["cambricon-x", "ft-m7032", "host", "trainer-004", "vck5000-aie", "virtex7-690t"]


def _doc(name: str) -> dict:
    return tomllib.loads(resources.files("tilefuse.targets").joinpath(name + ".toml").read_text())


def _dump(doc: dict) -> str:
    """A minimal TOML writer for the documents these tests edit (tables of scalars / inline tables)."""
    def val(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{json.dumps(k)} = {val(x)}" for k, x in v.items()) + " }"
        raise TypeError(v)

    lines = []

    def table(path, tbl):
        scalars = {k: v for k, v in tbl.items() if not (isinstance(v, dict) and any(isinstance(x, dict) for x in v.values())
                                                       and "value" not in v)}
        subs = {k: v for k, v in tbl.items() if k not in scalars}
        if path:
            lines.append(f"[{path}]")
        for k, v in scalars.items():
            lines.append(f"{json.dumps(k)} = {val(v)}")
        for k, v in subs.items():
            table(f"{path}.{json.dumps(k)}" if path else json.dumps(k), v)
    table("", doc)
    return "\n".join(lines) + "\n"


def _load_doc(tmp_path, doc, name="t.toml"):
    p = tmp_path / name
    p.write_text(_dump(doc))
    return load_target(p)


def test_builtin_targets_load_with_sources_and_ranges():
    assert builtin_names() == BUILTIN
    for name in BUILTIN:
        t = load_target(name)
        assert t.name == name
        for p in t.sources():
            assert p.tag in "SVRDM", (name, p.path, p.source)
            if p.tag == "M":
                assert p.range is not None and p.range[0] <= p.value <= p.range[1], (name, p.path)
        assert t.peak_flops() > 0


def test_peaks_match_the_papers():
    assert load_target("ft-m7032").peak_flops(8) == pytest.approx(4915.2e9)       # 19.7 TFLOP/s / 4 clusters
    assert load_target("ft-m7032").peak_flops(1) == pytest.approx(614.4e9)
    assert load_target("trainer-004").peak_flops() == pytest.approx(26.2144e12)
    assert load_target("cambricon-x").peak_flops() == pytest.approx(512e9)
    assert load_target("ft-m7032").capacity("AM") == 768 * 1024
    assert load_target("ft-m7032").link("ddr").effective == pytest.approx(42.6e9 * 0.77)


@pytest.mark.parametrize("text,kind,expect", [
    ("768 KiB", "bytes", 768 * 1024), ("6MB", "bytes", 6 * 2 ** 20), ("42.6 GB/s", "bandwidth", 42.6e9),
    ("300 Gbit/s", "bandwidth", 37.5e9), ("1.6GHz", "frequency", 1.6e9), ("0.5 us", "time", 5e-7), (3, "number", 3.0),
])
def test_quantities(text, kind, expect):
    assert parse_quantity(text, kind, "here") == pytest.approx(expect)


def test_quantity_errors_name_the_place():
    with pytest.raises(TargetError, match=r"here: unit 'parsec' is not a bytes unit"):
        parse_quantity("3 parsec", "bytes", "here")
    with pytest.raises(TargetError, match="is per cycle but the table names no clock"):
        parse_quantity("512 B/cycle", "bandwidth", "here")


def test_a_user_target_file_needs_no_code(tmp_path):
    doc = _doc("ft-m7032")
    doc["target"]["name"] = "my-dsp"
    doc["memory"]["AM"]["capacity"] = {"value": "1 MiB", "source": "M a bigger AM, for a what-if", "range": ["768 KiB", "2 MiB"]}
    t = _load_doc(tmp_path, doc, "my-dsp.toml")
    assert t.name == "my-dsp" and t.capacity("AM") == 2 ** 20
    assert [p.path for p in t.assumptions()].count("memory.AM.capacity") == 1


@pytest.mark.parametrize("edit,field", [
    (lambda d: d["memory"]["AM"]["capacity"].pop("source"), r"memory\.AM\.capacity\.source: missing"),
    (lambda d: d["memory"].pop("SM"), r"memory\.SM: missing \(strategy 'ft-m7032' needs it\)"),
    (lambda d: d["param"].pop("nb_unit"), r"param\.nb_unit: missing"),
    (lambda d: d["compute"].__setitem__("peak_flops", {"value": "5.5e12", "source": "S made up"}),
     r"compute\.peak_flops: states 5500\.0 GFLOP/s .* inconsistent"),
    (lambda d: d["link"]["ddr"].__setitem__("to", "L9"), r"link\.ddr\.to: found 'L9'"),
    (lambda d: d["link"]["ddr"]["efficiency"].__setitem__("value", 1.5), r"outside its range|link\.ddr\.efficiency"),
    (lambda d: d["param"]["fmac_latency"].pop("range"), r"param\.fmac_latency\.range: missing"),
    (lambda d: d["memory"]["AM"]["capacity"].__setitem__("value", "768 furlongs"), r"memory\.AM\.capacity: unit"),
    (lambda d: d["memory"]["AM"]["capacity"].__setitem__("source", "Q guessed"), r"memory\.AM\.capacity\.source: found 'Q guessed'"),
    (lambda d: d["target"].__setitem__("strategy", "tpu"), r"target\.strategy: found 'tpu'"),
    (lambda d: d["target"].__setitem__("cores", 9), r"target\.cores / target\.max_cores"),
    (lambda d: d["clock"]["core"].__setitem__("value", "-1 GHz"), r"clock\.core: must be positive"),
    (lambda d: d["memory"]["AM"].__setitem__("per", "galaxy"), r"memory\.AM\.per: found 'galaxy'"),
    (lambda d: d.__setitem__("extra", {}), r"unknown section"),
])
def test_bad_target_files_are_rejected_naming_the_field(tmp_path, edit, field):
    doc = _doc("ft-m7032")
    edit(doc)
    with pytest.raises(TargetError, match=field):
        _load_doc(tmp_path, doc)


def _set(*path_value):
    """An edit setting doc[path...] = value (the last argument)."""
    *path, value = path_value

    def edit(d):
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
    return edit


@pytest.mark.parametrize("name,edit,field", [
    # numbers: finite, of a magnitude a machine has, ranges ordered
    ("ft-m7032", _set("link", "ddr", "bandwidth", "value", float("nan")),
     r"link\.ddr\.bandwidth: found nan, expected a finite"),
    ("host", _set("clock", "core", "value", "1e400 GHz"),
     r"clock\.core: found '1e400 GHz', expected a finite frequency"),
    ("host", _set("clock", "core", "value", "1e-300 GHz"),
     r"clock\.core: .* expected 0 or a magnitude in 1e-15\.\.1e\+18"),
    ("ft-m7032", _set("param", "fmac_latency", "range", [12, 3]), r"param\.fmac_latency\.range: .* low <= high"),
    # the shape of the file
    ("host", _set("param", 3), r"\[param\]: found 3, expected a section of tables"),
    ("ft-m7032", _set("memory", "AM", "bandwidth", "clock", {"a": 1}),
     r"memory\.AM\.bandwidth\.clock: found \{'a': 1\}"),
    ("host", _set("compute", "units", "value", 2.5), r"compute\.units: found 2\.5, expected a whole number"),
    ("host", _set("compute", "vector_ops_per_cycle", "value", 0), r"compute\.vector_ops_per_cycle: must be positive"),
    ("ft-m7032", _set("link", "gsm", "latency", "value", "-1 us"), r"outside its range|link\.gsm\.latency"),
    ("ft-m7032", _set("memory", "AM", "bandwidth", "value", "0 B/cycle"), r"memory\.AM\.bandwidth: must be positive"),
    # each strategy's parameters: whole numbers, flags, fractions, the kind of quantity, allowed values
    ("vck5000-aie", _set("param", "tile_width", "value", 32.5),
     r"param\.tile_width: found 32\.5, expected a whole number"),
    ("vck5000-aie", _set("param", "tile_height", "value", 0),
     r"param\.tile_height: found 0, expected a whole number in 1"),
    ("host", _set("param", "vector_lanes", "value", "1 KiB"), r"param\.vector_lanes: found '1 KiB', a bytes value"),
    ("ft-m7032", _set("param", "fuse_residual", "value", 0.5), r"param\.fuse_residual: found 0\.5, expected 0 or 1"),
    ("ft-m7032", _set("param", "vpes", "value", 0), r"param\.vpes: found 0, expected a whole number"),
    ("virtex7-690t", _set("param", "winograd_m", "value", 3), r"param\.winograd_m: found 3, expected one of 2, 4"),
    ("cambricon-x", _set("param", "instruction_bytes", "value", "3 GHz"),
     r"param\.instruction_bytes: found '3 GHz', a frequency"),
    # numbers that must agree with each other
    ("cambricon-x", _set("param", "dot_width", "value", 32),
     r"param\.dot_width: found 32, expected at most macs_per_cycle"),
    ("ft-m7032", _set("param", "fmacs", "value", 6), r"param\.fmacs x vpes x images_per_word = 6 x 16 x 4 MACs"),
    ("ft-m7032", _set("param", "m_min", "value", 13), r"expected m_min <= m_max"),
    ("trainer-004", _set("param", "pu_rows", "value", 32), r"a 32 x 32 array of 32-MAC PUs, but target\.cores = 512"),
])
def test_numbers_a_strategy_cannot_use_are_rejected_naming_the_field(tmp_path, name, edit, field):
    doc = _doc(name)
    if name == "ft-m7032" and "range" in field:
        doc["param"]["fmac_latency"]["value"] = 6
    edit(doc)
    with pytest.raises(TargetError, match=field):
        _load_doc(tmp_path, doc)


def test_overrides_obey_the_same_rules_when_simulated():
    """An override changes a number after the file was checked: the strategy checks the target again."""
    import tilefuse
    compiled = tilefuse.compile(tilefuse.models.get("tinynet"))
    for target, kw, field in [("ft-m7032", {"vpes": 0}, r"param\.vpes: found 0"),
                              ("vck5000-aie", {"tile_width": 7.5}, r"param\.tile_width: found 7\.5"),
                              ("trainer-004", {"cores": 3}, r"target\.cores = 3 PUs"),
                              ("ft-m7032", {"compute.macs_per_cycle.float16": 1},
                               r"more than compute\.macs_per_cycle")]:
        t = load_target(target, **kw)               # loading takes any number of the right kind ...
        with pytest.raises(TargetError, match=field):
            tilefuse.simulate(compiled, t)          # ... the strategy refuses what it cannot use
    with pytest.raises(TargetError, match=r"efficiency is a fraction of the bandwidth; found 0"):
        load_target("ft-m7032", **{"link.ddr.efficiency": 0})
    with pytest.raises(TargetError, match=r"compute\.units must be positive and a whole number >= max_cores"):
        load_target("ft-m7032", **{"compute.units": 2.5})


def test_unreadable_files(tmp_path):
    p = tmp_path / "broken.toml"
    p.write_text("[target\nname = ")
    with pytest.raises(TargetError, match="not valid TOML"):
        load_target(p)
    p.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TargetError, match="not UTF-8"):
        load_target(p)
    with pytest.raises(TargetError, match="no such target"):
        load_target(tmp_path / "missing.toml")


def test_overrides():
    t = load_target("ft-m7032", AM="1MiB", ddr="85.2 GB/s", core="1.8GHz", cores=4)
    assert t.capacity("AM") == 2 ** 20
    assert t.link("ddr").bandwidth.value == 85.2e9
    assert t.clock() == 1.8e9 and t.cores == 4
    assert t.memories["AM"].capacity.tag == "O"           # the report can tell an override apart
    t2 = load_target("ft-m7032").with_overrides(**{"link.ddr.efficiency": 1, "param.m_max": 8})
    assert t2.link("ddr").effective == 42.6e9 and t2.p("m_max") == 8
    with pytest.raises(TargetError, match="'XM' names nothing in target 'ft-m7032'"):
        load_target("ft-m7032", XM="1MiB")
    with pytest.raises(TargetError, match="cores must be an integer in 1..8"):
        load_target("ft-m7032", cores=9)
    with pytest.raises(TargetError, match="fraction of the bandwidth"):
        load_target("ft-m7032", **{"link.ddr.efficiency": 2})


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "tilefuse.cli", "simulate", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def test_cli_list_describe_and_bad_set():
    r = _cli("--list")
    assert r.returncode == 0 and all(n in r.stdout for n in BUILTIN)
    r = _cli("--target", "virtex7-690t", "--describe")
    assert r.returncode == 0 and "clock.fabric" in r.stdout and "M not in seed 003" in r.stdout
    r = _cli("tinynet", "--target", "ft-m7032", "--set", "BOGUS=1")
    assert r.returncode != 0 and "'BOGUS' names nothing" in r.stderr


def test_cli_check_scaling_and_plot(tmp_path):
    r = _cli("tinynet", "--target", "cambricon-x", "--check")
    assert r.returncode == 0, r.stderr
    assert "check vs reference evaluator" in r.stdout and "-> OK" in r.stdout
    png = tmp_path / "fig.png"
    r = _cli("tinynet", "--target", "ft-m7032", "--cores", "1,2,4,8", "--set", "AM=1MiB", "--plot", str(png))
    assert r.returncode == 0, r.stderr
    assert "S_n = P_n / (n P_1)" in r.stdout and "S8" in r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_target_files_ship_as_package_data():
    root = Path(__file__).resolve().parents[1]
    text = (root / "pyproject.toml").read_text()
    assert '"targets/*.toml"' in text
