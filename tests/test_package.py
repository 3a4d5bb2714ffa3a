"""The .tfpkg file: round trip, and every kind of damage raises PackageError."""
import json
import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilefuse
from tilefuse.compiler.package import MAGIC, from_bytes, to_bytes
from tilefuse.errors import PackageError

settings.register_profile("tilefuse", max_examples=150, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.function_scoped_fixture])
settings.load_profile("tilefuse")


def build():
    rng = np.random.default_rng(0)
    net = tilefuse.Network("pkgnet")
    x = net.input("x", (1, 3, 8, 8))
    y = net.conv2d(x, rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4), padding=1)
    y = net.relu(y)
    y = net.avg_pool(y, 2)
    net.output(net.softmax(net.linear(net.flatten(y), rng.standard_normal((5, 64)), rng.standard_normal(5))))
    return net


NET = build()
COMPILED = tilefuse.compile(NET)
BLOB = to_bytes(COMPILED.package)
X = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)


def test_round_trip_file(tmp_path):
    path = COMPILED.save(tmp_path / "net.tfpkg")
    assert path.read_bytes()[:8] == MAGIC
    pkg = tilefuse.load_package(path)
    assert pkg.const_area == COMPILED.package.const_area
    assert pkg.blocks == COMPILED.package.blocks and pkg.io == COMPILED.package.io
    y1 = tilefuse.Session(pkg).run(X)
    y0 = tilefuse.Session(COMPILED).run(X)
    np.testing.assert_array_equal(y0, y1)
    np.testing.assert_allclose(y1, tilefuse.evaluate(NET, X)[0], rtol=1e-5, atol=1e-6)


def test_file_layout_is_self_describing():
    hlen = struct.unpack_from("<I", BLOB, 12)[0]
    header = json.loads(BLOB[16:16 + hlen])
    assert header["format"] == "tilefuse-package"
    assert set(header["tags"]) == {"const_bytes", "hidden_bytes", "io_bytes"}
    assert header["program_size"] > 0 and header["io"][0]["name"] == "x"
    start = -(-(16 + hlen + 4) // 64) * 64
    assert len(BLOB) == start + header["tags"]["const_bytes"]


def test_missing_file():
    with pytest.raises(PackageError, match="cannot read"):
        tilefuse.load_package("/nonexistent/net.tfpkg")


@pytest.mark.parametrize("n", [0, 5, 19, 20, 100, len(BLOB) // 2, len(BLOB) - 1])
def test_truncated(n):
    with pytest.raises(PackageError):
        from_bytes(BLOB[:n])


def test_trailing_bytes():
    with pytest.raises(PackageError, match="trailing bytes"):
        from_bytes(BLOB + b"\0")


def test_not_a_package():
    with pytest.raises(PackageError, match="bad magic"):
        from_bytes(b"\x89PNG\r\n\x1a\n" + BLOB[8:])


def _rewrite_header(mutate):
    """Re-sign a header after changing it, to reach the checks behind the checksum."""
    hlen = struct.unpack_from("<I", BLOB, 12)[0]
    h = json.loads(BLOB[16:16 + hlen])
    start = -(-(16 + hlen + 4) // 64) * 64
    area = BLOB[start:]
    mutate(h)
    head = json.dumps(h).encode()
    pre = MAGIC + struct.pack("<II", 1, len(head)) + head + struct.pack("<I", zlib.crc32(head))
    return pre + b"\0" * ((-len(pre)) % 64) + area


@pytest.mark.parametrize("mutate, message", [
    (lambda h: h["tags"].update(const_bytes=h["tags"]["const_bytes"] + 64), "truncated"),
    (lambda h: h["tags"].update(io_bytes=12), "multiple of 8"),
    (lambda h: h["tags"].update(hidden_bytes=0), "outside"),
    (lambda h: h.update(program_size=10**9), "exceeds"),
    (lambda h: h["blocks"][0].update(nbytes=h["blocks"][0]["nbytes"] + 4), "is not"),
    (lambda h: h["blocks"][0].update(offset=10**9), "outside"),
    (lambda h: h["blocks"][0].update(dtype="complex64"), "dtype"),
    (lambda h: h["blocks"][0].update(shape=[0, 3]), "shape"),
    (lambda h: h["io"][0].update(offset=16), "io slot"),
    (lambda h: h["io"].pop(), "io slots need"),
    (lambda h: h.pop("tags"), "'tags' is missing"),
    (lambda h: h.update(name=5), "type int"),
    (lambda h: h.update(const_sha256="0" * 64), "checksum"),
    (lambda h: h["tags"].update(const_bytes=-1), ">= 0"),
])
def test_inconsistent_headers(mutate, message):
    with pytest.raises(PackageError, match=message):
        from_bytes(_rewrite_header(mutate))


@given(st.integers(0, len(BLOB) - 1), st.integers(1, 255))
def test_fuzz_flipped_byte(pos, xor):
    data = bytearray(BLOB)
    data[pos] ^= xor
    with pytest.raises(PackageError):
        from_bytes(bytes(data))


@given(st.integers(0, len(BLOB) - 1))
def test_fuzz_truncation(n):
    with pytest.raises(PackageError):
        from_bytes(BLOB[:n])


@given(st.binary(min_size=0, max_size=4096))
def test_fuzz_garbage(data):
    with pytest.raises(PackageError):
        from_bytes(data)
    with pytest.raises(PackageError):
        from_bytes(BLOB[:20] + data)


@given(st.integers(0, 2**32 - 1), st.integers(0, 5))
def test_fuzz_wrong_sizes(value, which):
    """Overwrite the header length or the tag sizes with arbitrary values."""
    if which == 0:
        data = BLOB[:12] + struct.pack("<I", value) + BLOB[16:]
        if value == struct.unpack_from("<I", BLOB, 12)[0]:
            return
        with pytest.raises(PackageError):
            from_bytes(data)
        return
    key = ["const_bytes", "hidden_bytes", "io_bytes", "program_size", "blocks"][which - 1]

    def mutate(h):
        if key == "program_size":
            h["program_size"] = value
        elif key == "blocks":
            h["blocks"][value % len(h["blocks"])]["offset"] = value
        else:
            h["tags"][key] = value
    data = _rewrite_header(mutate)
    if data == BLOB:
        return
    try:
        pkg = from_bytes(data)
    except PackageError:
        return
    # a changed size that still validates must still describe a consistent package
    tilefuse.Session(pkg).run(X)


def test_reoff_pack_writes_each_constant_in_place():
    """reoff_pack copies every constant straight into the constant area (no bytes temporary):
    each block holds exactly the constant's C-order bytes at its aligned offset, whatever the
    dtype, a non-contiguous value or a 0-d one, and the bytes between blocks stay zero."""
    from tilefuse.compiler.lower import Lowered
    from tilefuse.compiler.memory import plan_hidden
    from tilefuse.compiler.package import reoff_pack
    from tilefuse.ir.node import DataNode
    rng = np.random.default_rng(3)
    values = {"w": rng.standard_normal((5, 3, 3, 3)).astype(np.float32),
              "t": rng.standard_normal((7, 6)).astype(np.float32).T,          # non-contiguous
              "i": rng.standard_normal((3, 5)),                                    # float64
              "h": rng.standard_normal(11).astype(np.float16),
              "s": np.array(2.5, np.float32)}                                 # 0-d
    consts = []
    for name, v in values.items():
        d = DataNode(name, v.shape, v.dtype)
        d.value = v
        consts.append(d)
    low = Lowered([], consts, {}, {}, [], [])
    pkg = reoff_pack("consts", low, plan_hidden({}, {}))
    area = bytes(pkg.const_area)
    blocks = {b.name: b for b in pkg.blocks if b.segment == "const"}
    covered = set()
    for name, v in values.items():
        b = blocks[name]
        want = np.ascontiguousarray(v).tobytes()
        assert b.nbytes == len(want) and area[b.offset:b.offset + b.nbytes] == want, name
        covered.update(range(b.offset, b.offset + b.nbytes))
    start = pkg.program_size
    assert all(area[k] == 0 for k in range(start, len(area)) if k not in covered)


def _addr(a) -> int:
    return np.frombuffer(a, np.uint8).ctypes.data if not isinstance(a, np.ndarray) else a.ctypes.data


def test_constants_and_tensors_are_cache_line_aligned_in_host_memory(tmp_path):
    """Blocks are 64-byte aligned device addresses; the host bytes behind them must be too, or every
    weight and tensor sits 16 bytes off its cache line (numpy's and bytearray's large buffers start 16
    bytes past a page) and each 64-byte AVX-512 load is split in two."""
    import copy

    from tilefuse.runtime.device import CPUDevice
    pkg = COMPILED.package
    loaded = from_bytes(to_bytes(pkg))
    for area in (pkg.const_area, loaded.const_area, copy.deepcopy(pkg).const_area):
        assert _addr(area) % 64 == 0
    assert copy.deepcopy(pkg).const_area == pkg.const_area and loaded == pkg
    dev = CPUDevice()
    for n in (1, 1000, 3 << 20, 70 << 20):        # small, large, larger than one arena
        assert dev.view(dev.alloc(n), np.uint8, (n,)).ctypes.data % 64 == 0
    sess = tilefuse.Session(COMPILED)
    sess.copy_constants()
    ctx = sess._acquire()
    try:
        views = [v for _, vs, _, _ in ctx.bound for v in vs if isinstance(v, np.ndarray)]
        assert views and all(v.ctypes.data % 64 == 0 for v in views)   # weights, biases, hidden tensors
    finally:
        sess._give_back(ctx)
        sess.release()


def test_scratch_views_follow_their_buffer():
    """Scratch.get returns the view it built for (slot, dtype, shape) on later calls (the layers ask for
    the same one every call); when the slot's buffer grows the old views are dropped, so a cached view
    never points into the buffer that was replaced. Shapes and dtypes of a slot get their own views."""
    from tilefuse.kernels.threads import Scratch
    s = Scratch()
    a = s.get("band", (2, 100))
    assert s.get("band", (2, 100)) is a and a.shape == (2, 100)
    assert s.get("band", [2, 100]) is a                         # a list shape: the same view
    b = s.get("band", 50)
    assert b.shape == (50,) and b.ctypes.data == a.ctypes.data     # same buffer, another view
    d = s.get("band", (2, 100), np.float64)
    assert d.dtype == np.float64 and d.ctypes.data != a.ctypes.data
    big = s.get("band", (4, 1000))                               # grows the float32 buffer
    assert big.shape == (4, 1000)
    again = s.get("band", (2, 100))
    assert again is not a and again.ctypes.data == big.ctypes.data   # a view of the new buffer
    again[...] = 7.0
    assert np.all(s.bufs[("band", np.dtype(np.float32))][:200] == 7.0)


def test_scratch_buffers_are_cache_line_aligned():
    from tilefuse.kernels.threads import Scratch, aligned, aligned_empty
    s = Scratch()
    for n in (3, 5000, 1 << 20):
        assert s.get("x", n).ctypes.data % 64 == 0 and s.get("y", (n, 2), np.float64).ctypes.data % 64 == 0
        a = aligned_empty(n, np.int64)
        assert a.ctypes.data % 64 == 0 and a.shape == (n,) and a.dtype == np.int64
        src = np.arange(n * 3, dtype=np.float32).reshape(n, 3)[:, 1:]          # not contiguous
        b = aligned(src)
        assert b.ctypes.data % 64 == 0 and b.flags.c_contiguous and np.array_equal(b, src)
        assert aligned(b) is b
