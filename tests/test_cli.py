"""The command line: run, compile, inspect, and a damaged package."""
import numpy as np

from tilefuse.cli import main


def test_run_tinynet_checks_against_reference(capsys):
    assert main(["run", "tinynet", "--batch", "2", "--inputs", "3"]) == 0
    out = capsys.readouterr().out
    assert "plan:" in out and "constants mapped in place (zero copy)" in out and "first call (JIT" in out
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


# ----------------------------------------------------------------------------- user mistakes (issue 11)

import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402


def cli(argv, capsys):
    """(exit status, stderr) of `tilefuse argv`, in this process."""
    try:
        code = main(argv)
    except SystemExit as e:       # argparse errors
        code = e.code
    return code, capsys.readouterr().err


MISTAKES = [
    (["run", "nosuchmodel"], r"unknown model 'nosuchmodel'; expected one of alexnet, .*tinynet"),
    (["compile", "MODEL", "-o", "{tmp}/x.tfpkg"], r"unknown model 'MODEL'; expected one of"),
    (["run", "tinynet", "--threads", "0"], r"--threads: found 0; expected an integer >= 1"),
    (["run", "tinynet", "--threads", "two"], r"--threads: found 'two'; expected an integer >= 1"),
    (["run", "tinynet", "--depth", "0"], r"--depth: found 0; expected an integer >= 1"),
    (["run", "tinynet", "--inputs", "0"], r"--inputs: found 0; expected an integer >= 1"),
    (["run", "tinynet", "--input-size", "12by3"], r"--input-size: found '12by3', expected HxW"),
    (["run", "tinynet", "--input-size", "0x5"], r"--input-size: found '0x5', expected positive sizes"),
    (["compile", "tinynet", "-o", "{tmp}/missing/x.tfpkg"], r"directory '.*missing' does not exist; expected an existing directory"),
    (["compile", "tinynet", "-o", "{tmp}"], r"is a directory; expected a file path"),
    (["run", "tinynet", "--image-size", "0"], r"--image-size: found 0; expected an integer >= 1"),
    (["run", "tinynet", "--batch", "0"], r"--batch: found 0; expected an integer >= 1"),
    (["run", "tinynet", "--seed", "-1"], r"--seed: found -1; expected an integer >= 0"),
    (["run", "tinynet", "--rtol", "nan"], r"--rtol: found nan; expected a finite number >= 0"),
    (["run", "tinynet", "--algorithm", "fastest"], r"--algorithm: invalid choice: 'fastest'"),
    (["run", "tinynet", "--schedule", "stream", "--band-rows", "0"], r"--band-rows: found 0; expected an integer >= 1"),
    (["run", "tinynet", "--schedule", "stream", "--stream-workers", "0"], r"--stream-workers: found 0"),
    (["run", "tinynet", "--device-memory", "lots"], r"'lots' is not a size; expected a byte count such as 512M"),
    (["run", "tinynet", "--device-memory", "4K"], r"cannot allocate \d+ bytes: .* \(CLI: --device-memory\)"),
    (["run", "resnet18", "--algorithm", "winograd4", "--image-size", "32"], r"conv1: conv algorithm 'winograd4' cannot run"),
    (["run", "{tmp}/missing.tfpkg"], r"cannot read package file .*missing.tfpkg"),
    (["run", "{pkg}", "--batch", "4"], r"--batch cannot apply to a package"),
    (["run", "{pkg}", "--schedule", "stream"], r"--schedule stream compiles a zoo model; .* is a package"),
    (["compile", "{pkg}", "-o", "{tmp}/y.tfpkg"], r"compile takes a zoo model name, got the package"),
    (["inspect", "/dev/zero"], r"/dev/zero: not a regular file"),
    (["inspect", "{tmp}"], r"not a regular file"),
    ([], r"the following arguments are required: command"),
    (["compile", "tinynet"], r"the following arguments are required: -o/--output"),
]


@pytest.fixture(scope="module")
def tiny_pkg(tmp_path_factory):
    path = tmp_path_factory.mktemp("pkg") / "tiny.tfpkg"
    assert main(["compile", "tinynet", "-o", str(path)]) == 0
    return path


@pytest.mark.parametrize("argv, message", MISTAKES, ids=[" ".join(a) or "nothing" for a, _ in MISTAKES])
def test_user_mistake_is_one_line_exit_2(argv, message, tmp_path, tiny_pkg, capsys):
    argv = [a.format(tmp=tmp_path, pkg=tiny_pkg) for a in argv]
    code, err = cli(argv, capsys)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("tilefuse"), err
    assert re.search(message, lines[0]), lines[0]


def test_debug_shows_the_traceback():
    r = subprocess.run([sys.executable, "-m", "tilefuse.cli", "run", "nosuchmodel", "--debug"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "Traceback" in r.stderr and "unknown model 'nosuchmodel'" in r.stderr
    r = subprocess.run([sys.executable, "-m", "tilefuse.cli", "run", "nosuchmodel"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_inspect_escapes_names_from_the_file(tmp_path, capsys):
    """Names in a package are data: terminal escape sequences are shown, never sent raw."""
    import tilefuse
    net = tilefuse.Network("evil\x1b]0;pwned\x07\x1b[2J")
    x = net.input("x\x1b[31m", (1, 2, 3, 3))
    net.output(net.relu(x, name="relu\r\nfake line"))
    path = tilefuse.compile(net).save(tmp_path / "evil.tfpkg")
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert "evil\\x1b]0;pwned\\x07\\x1b[2J" in out and "x\\x1b[31m" in out and "relu\\r\\nfake line" in out


def test_run_fits_a_6gb_address_space_limit():
    """The default device grows instead of reserving 8 GiB up front."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    r = subprocess.run([sys.executable, "-m", "tilefuse.cli", "run", "tinynet", "--inputs", "2"],
                       capture_output=True, text=True, timeout=600, preexec_fn=limit)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "-> OK" in r.stdout


def test_device_memory_option(capsys):
    assert main(["run", "tinynet", "--inputs", "2", "--device-memory", "64M"]) == 0
    out = capsys.readouterr().out
    assert "-> OK" in out and "constants copied once" in out     # a fixed-size device copies them
