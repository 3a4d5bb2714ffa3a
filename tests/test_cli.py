"""The command line: run, compile, inspect, and a damaged package."""
import numpy as np

from tilefuse.cli import main


def test_run_tinynet_checks_against_reference(capsys):
    assert main(["run", "tinynet", "--batch", "2", "--inputs", "3"]) == 0
    out = capsys.readouterr().out
    assert "plan:" in out and "constants copied once" in out and "first call (JIT" in out
    assert "-> OK" in out


def test_run_with_reference_algorithm_and_plan(capsys):
    assert main(["run", "tinynet", "--inputs", "1", "--algorithm", "reference", "--plan"]) == 0
    out = capsys.readouterr().out
    assert "planned vs" in out and "reference" in out


def test_compile_inspect_and_run_package(tmp_path, capsys):
    pkg = tmp_path / "tiny.tfpkg"
    assert main(["compile", "tinynet", "-o", str(pkg)]) == 0
    assert main(["inspect", str(pkg), "--all"]) == 0
    out = capsys.readouterr().out
    assert "valid" in out and "program:" in out and "input " in out
    assert main(["run", str(pkg), "--inputs", "2"]) == 0


def test_damaged_package_is_a_clear_error(tmp_path, capsys):
    pkg = tmp_path / "tiny.tfpkg"
    assert main(["compile", "tinynet", "-o", str(pkg)]) == 0
    data = bytearray(pkg.read_bytes())
    data[-10] ^= 0xFF
    pkg.write_bytes(bytes(data))
    assert main(["inspect", str(pkg)]) == 2
    err = capsys.readouterr().err
    assert "tilefuse: error:" in err and "checksum" in err


def test_run_streamed_schedule(capsys):
    assert main(["run", "tinynet", "--schedule", "stream", "--input-size", "40x36", "--inputs", "1"]) == 0
    out = capsys.readouterr().out
    assert "schedule stream" in out and "ok" in out


def test_filter_subcommand_roundtrip(tmp_path):
    img = (np.arange(30 * 20) % 251).astype(np.uint8).reshape(30, 20)
    src, dst = tmp_path / "in.npy", tmp_path / "out.npy"
    np.save(src, img)
    assert main(["filter", str(src), str(dst), "--kernel", "box"]) == 0
    assert np.load(dst).shape == img.shape
