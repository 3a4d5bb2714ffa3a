"""filter_stream (3-stage pipeline) and the `tilefuse filter` CLI."""

import argparse

import numpy as np
import pytest
from PIL import Image

from tilefuse.imaging import KERNELS, StreamReport, filter2d, filter_stream
from tilefuse.imaging import cli


def frames(n, shape=(45, 67), dtype=np.int32, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(-1000, 1000, size=shape).astype(dtype) for _ in range(n)]


@pytest.mark.parametrize("overlap, depth", [(True, 1), (True, 2), (True, 3), (False, 2)])
def test_stream_outputs_equal_filter2d_in_order(overlap, depth):
    src = frames(7)
    report = StreamReport()
    got = list(filter_stream(iter(src), KERNELS["sobel-x"], tile=(16, 16), workers=2,
                             depth=depth, overlap=overlap, report=report))
    assert [f.index for f in got] == list(range(7))
    for f, frame in zip(got, src):
        np.testing.assert_array_equal(f.output, filter2d(frame, KERNELS["sobel-x"]))
        t = f.timing
        assert t.copy_in_ms >= 0 and t.compute_ms > 0 and t.copy_out_ms >= 0
        assert t.total_ms == pytest.approx(t.copy_in_ms + t.compute_ms + t.copy_out_ms)
    assert len(report.timings) == 7 and report.wall_s > 0
    assert report.sequential_fps == pytest.approx(1000 / report.mean("total_ms"))
    assert report.pipelined_fps == pytest.approx(7 / report.wall_s)


def test_stream_outputs_are_independent_arrays():
    """Copy-out gives each frame its own host array: device buffers are reused."""
    got = [f.output for f in filter_stream(frames(5), KERNELS["laplace"], depth=2)]
    expected = [filter2d(f, KERNELS["laplace"]) for f in frames(5)]
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)


def test_stream_saturate_and_float():
    u8 = frames(3, dtype=np.uint8)
    for f, frame in zip(filter_stream(u8, KERNELS["sharpen"], saturate=True), u8):
        np.testing.assert_array_equal(f.output, filter2d(frame, KERNELS["sharpen"], saturate=True))
    f32 = frames(3, dtype=np.float32)
    for f, frame in zip(filter_stream(f32, KERNELS["gauss"], overlap=False), f32):
        assert f.output.dtype == np.float32
        np.testing.assert_array_equal(f.output, filter2d(frame, KERNELS["gauss"]))


def test_stream_empty_source_yields_nothing():
    assert list(filter_stream([], KERNELS["sharpen"])) == []


@pytest.mark.parametrize("overlap", [True, False])
def test_stream_frame_mismatch_raises(overlap):
    src = frames(2) + [np.zeros((3, 3), np.int32)]
    with pytest.raises(ValueError, match=r"frames\[2\]: found int32 \(3, 3\), expected int32 \(45, 67\)"):
        list(filter_stream(src, KERNELS["sharpen"], overlap=overlap))


def test_stream_source_error_propagates():
    def broken():
        yield frames(1)[0]
        raise RuntimeError("camera unplugged")
    with pytest.raises(RuntimeError, match="camera unplugged"):
        list(filter_stream(broken(), KERNELS["sharpen"]))


def test_stream_depth_error():
    with pytest.raises(ValueError, match=r"depth: found 0, expected a positive integer"):
        list(filter_stream(frames(1), KERNELS["sharpen"], depth=0))


def test_stream_kernel_error_names_argument():
    with pytest.raises(ValueError, match=r"kernel: found shape \(2, 2\)"):
        list(filter_stream(frames(1), np.ones((2, 2))))


# --- CLI ----------------------------------------------------------------------------------

def run_cli(argv):
    parser = argparse.ArgumentParser(prog="tilefuse")
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["filter", *argv])
    return args.func(args)


def test_cli_png_rgb_saturates_to_uint8(tmp_path):
    rgb = np.random.default_rng(1).integers(0, 256, size=(40, 50, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / "in.png")
    assert run_cli([str(tmp_path / "in.png"), str(tmp_path / "out.png"), "--kernel", "sharpen",
                    "--tile", "16x16", "--workers", "2"]) == 0
    out = np.asarray(Image.open(tmp_path / "out.png"))
    np.testing.assert_array_equal(out, filter2d(rgb, KERNELS["sharpen"], saturate=True))


def test_cli_tiff_keeps_int32(tmp_path):
    gray = np.random.default_rng(2).integers(0, 256, size=(33, 70), dtype=np.uint8)
    Image.fromarray(gray).save(tmp_path / "in.tif")
    assert run_cli([str(tmp_path / "in.tif"), str(tmp_path / "out.tiff"), "--kernel", "sobel-y",
                    "--method", "paper", "--tile", "64x32"]) == 0
    out = np.asarray(Image.open(tmp_path / "out.tiff"))
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, filter2d(gray, KERNELS["sobel-y"]))


def test_cli_npy_with_kernel_file(tmp_path):
    image = np.random.default_rng(3).standard_normal((21, 34)).astype(np.float32)
    kernel = np.random.default_rng(4).standard_normal((5, 5)).astype(np.float32)
    np.save(tmp_path / "in.npy", image)
    np.save(tmp_path / "k.npy", kernel)
    assert run_cli([str(tmp_path / "in.npy"), str(tmp_path / "out.npy"), "--kernel",
                    str(tmp_path / "k.npy"), "--border", "reflect"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"),
                                  filter2d(image, kernel, border="reflect"))


def test_cli_bench_prints_frames_errors_and_fps(capsys):
    assert run_cli(["--bench", "--frames", "3", "--size", "96x40", "--tile", "16x12"]) == 0
    text = capsys.readouterr().out
    for i in (1, 2, 3):
        assert f"IMG {i}/3 : errors 0" in text
    assert "Average copy-in" in text and "Average copy-out" in text
    assert "Average tiled compute" in text and "errors: 0 in 3 frames" in text
    assert text.strip().splitlines()[-1].split()[1] == "fps"


def test_cli_bench_overlapped(capsys):
    assert run_cli(["--bench", "--frames", "2", "--size", "64x48", "--overlap"]) == 0
    assert "stages overlapped" in capsys.readouterr().out


@pytest.mark.parametrize("argv, pattern", [
    (["a.png", "b.png", "--kernel", "nope"], r"--kernel: found 'nope', expected one of box"),
    (["a.png", "b.png", "--tile", "64by32"], r"--tile: found '64by32', expected two integers"),
    (["a.bmp", "b.png"], r"input: found suffix '.bmp' .*expected .npy"),
    (["a.png"], r"input/output: expected IN and OUT paths"),
    (["--bench", "--frames", "0"], r"--frames: found 0, expected at least 1"),
    (["--bench", "--size", "4k"], r"--size: found '4k', expected two integers"),
])
def test_cli_errors(argv, pattern, capsys, tmp_path):
    if argv[0] == "a.png" and len(argv) > 1 or argv == ["a.png"]:
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(tmp_path / "a.png")
        argv = [str(tmp_path / "a.png"), *([str(tmp_path / "b.png")] if len(argv) > 1 else []),
                *argv[2:]]
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("tilefuse filter: error: ")
    assert __import__("re").search(pattern, err), err


def test_cli_png_cannot_hold_float(tmp_path, capsys):
    np.save(tmp_path / "in.npy", np.zeros((8, 8), np.float32))
    assert run_cli([str(tmp_path / "in.npy"), str(tmp_path / "out.png")]) == 2
    assert "output: found a float32 (8, 8) result, which .png cannot hold" in capsys.readouterr().err


def test_cli_missing_pillow_message(monkeypatch, tmp_path, capsys):
    import builtins
    real_import = builtins.__import__

    def no_pil(name, *args, **kwargs):
        if name == "PIL" or name.startswith("PIL."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pil)
    np.save(tmp_path / "in.npy", np.zeros((8, 8), np.uint8))
    assert run_cli([str(tmp_path / "in.npy"), str(tmp_path / "out.png")]) == 2
    assert "needs Pillow, which is not installed" in capsys.readouterr().err


# --- files we did not make ----------------------------------------------------------------

def _npy_header(descr: str, shape) -> bytes:
    """A version-1.0 .npy header claiming `descr` and `shape` (the data is the caller's)."""
    text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {tuple(shape)}, }}"
    text += " " * (118 - len(text)) + "\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode()


@pytest.mark.parametrize("content, pattern", [
    (_npy_header("<f4", (100000, 100000)) + bytes(64),
     r"declares a float32 array of shape \(100000, 100000\) \(40000000000 bytes\) but holds 64 bytes"),
    (_npy_header("<f4", (8, 8)) + bytes(255), r"\(256 bytes\) but holds 255 bytes"),
    (_npy_header("<f4", (-1, 4)) + bytes(16), r"declares shape \(-1, 4\), expected sizes >= 0"),
    (b"\x93NUMPY\x01\x00\xff\xff" + b"{" * 100, r"is not a readable .npy file \(EOF"),
    (b"PK\x03\x04 not a npy", r"is not a readable .npy file"),
    (_npy_header("|O", (2,)) + bytes(16), r"holds Python objects \(dtype object\), expected numbers"),
])
@pytest.mark.parametrize("role", ["input", "--kernel"])
def test_cli_refuses_bad_npy_before_allocating(content, pattern, role, tmp_path, capsys):
    bad = tmp_path / "bad.npy"
    bad.write_bytes(content)
    np.save(tmp_path / "ok.npy", np.zeros((8, 8), np.float32))
    argv = ([str(bad), str(tmp_path / "out.npy")] if role == "input"
            else [str(tmp_path / "ok.npy"), str(tmp_path / "out.npy"), "--kernel", str(bad)])
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tilefuse filter: error: {role}: ")
    assert __import__("re").search(pattern, err), err
    assert not (tmp_path / "out.npy").exists()


def test_cli_reads_big_endian_and_fortran_npy(tmp_path):
    image = np.random.default_rng(5).standard_normal((13, 17)).astype(np.float32)
    np.save(tmp_path / "be.npy", image.astype(">f4"))
    np.save(tmp_path / "f.npy", np.asfortranarray(image))
    for name in ("be.npy", "f.npy"):
        assert run_cli([str(tmp_path / name), str(tmp_path / f"out_{name}")]) == 0
        np.testing.assert_array_equal(np.load(tmp_path / f"out_{name}"), filter2d(image, KERNELS["sharpen"]))


def test_cli_refuses_decompression_bomb_and_multi_page(tmp_path, capsys, monkeypatch):
    Image.new("L", (300, 200)).save(tmp_path / "big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10000)        # 60000 pixels: over twice the limit
    assert run_cli([str(tmp_path / "big.png"), str(tmp_path / "out.npy")]) == 2
    assert "big.png' is too large to read safely" in capsys.readouterr().err
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 50000)        # over the limit, under twice: a warning
    assert run_cli([str(tmp_path / "big.png"), str(tmp_path / "out.npy")]) == 2
    assert "big.png' is too large to read safely" in capsys.readouterr().err
    pages = [Image.fromarray(np.full((8, 8), i, np.uint8)) for i in range(3)]
    pages[0].save(tmp_path / "pages.tif", save_all=True, append_images=pages[1:])
    assert run_cli([str(tmp_path / "pages.tif"), str(tmp_path / "out.npy")]) == 2
    assert "pages.tif' holds 3 images (pages or frames), expected one" in capsys.readouterr().err
    assert not (tmp_path / "out.npy").exists()
