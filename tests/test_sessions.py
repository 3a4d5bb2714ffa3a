"""Sessions you can trust (issue 11): shared devices, threads, IO addresses, device memory,
the paper's addressing through a real device and package, and tests that fail when the
runtime takes a shortcut (a sequential "pipeline", IO operands resolved off device memory)."""
from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest

import tilefuse
from tilefuse import qinglong as ql
from tilefuse.compiler.package import Block, DataPackage, IOSlot, load_package
from tilefuse.compiler.program import CONST, DIRECT, HIDDEN, INDIRECT, IO, Instruction, Operand, encode
from tilefuse.errors import DeviceError, GraphError, OutOfDeviceMemory
from tilefuse.runtime import CPUDevice, Session

from test_runtime import small_net


def _x(net, seed):
    return np.random.default_rng(seed).standard_normal(net.inputs[0].shape).astype(np.float32)


# ----------------------------------------------------------------------------- sharing a device

def test_two_sessions_on_one_device_do_not_corrupt_each_other():
    """The probe: plain sequential code, two packages on one CPUDevice, run_many interleaved."""
    dev = CPUDevice()
    na, nb = small_net(seed=0, n=1), small_net(seed=1, n=1, h=9, w=6)
    sa, sb = Session(tilefuse.compile(na), dev), Session(tilefuse.compile(nb), dev)
    sa.copy_constants()
    sb.copy_constants()          # B's segments allocated after A's: A must still use its own
    xa = [_x(na, i) for i in range(10)]
    xb = [_x(nb, 100 + i) for i in range(10)]
    for _ in range(2):
        ya, yb = sa.run_many(xa), sb.run_many(xb)
        for x, y in zip(xa, ya):
            np.testing.assert_allclose(y, tilefuse.evaluate(na, x)[0], rtol=1e-5, atol=1e-5)
        for x, y in zip(xb, yb):
            np.testing.assert_allclose(y, tilefuse.evaluate(nb, x)[0], rtol=1e-5, atol=1e-5)
    # each session resolves through its own segment-base record
    assert sa.segments["bases"] != sb.segments["bases"]
    assert dev.read_u64(sa.segments["bases"]) == sa.segments["const"]
    assert dev.read_u64(sb.segments["bases"]) == sb.segments["const"]


def test_releasing_one_session_leaves_the_other_working():
    dev = CPUDevice()
    net = small_net(n=1)
    c = tilefuse.compile(net)
    sa, sb = Session(c, dev), Session(c, dev)
    x = _x(net, 3)
    ya = sa.run(x)
    sb.run(x)
    sb.release()
    np.testing.assert_array_equal(sa.run(x), ya)


# ----------------------------------------------------------------------------- threads

def _sequential(sess, xs):
    return [sess.run(x) for x in xs]


def _in_threads(run, xs_per_thread):
    """[[run(x) for x in xs] for xs in xs_per_thread], one thread per list, all at once."""
    got, errors = [None] * len(xs_per_thread), []

    def worker(t):
        try:
            got[t] = [run(x) for x in xs_per_thread[t]]
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(len(xs_per_thread))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    return got


def test_eight_threads_200_runs_each_on_one_session():
    net = small_net(n=1)
    sess = Session(tilefuse.compile(net), threads=1)
    xs = [[_x(net, 1000 * t + i) for i in range(200)] for t in range(8)]
    want = [_sequential(sess, x) for x in xs]
    got = _in_threads(sess.run, xs)
    wrong = sum(not np.array_equal(a, b) for t in range(8) for a, b in zip(got[t], want[t]))
    assert wrong == 0, f"{wrong} of 1600 results wrong"
    assert 2 <= sess.contexts <= sess.max_concurrent   # the calls really ran side by side


def test_run_many_in_one_thread_while_run_loops_in_another():
    net = small_net(n=1)
    sess = Session(tilefuse.compile(net), threads=1)
    xa = [_x(net, i) for i in range(200)]
    xb = [_x(net, 500 + i) for i in range(200)]
    want_a, want_b = _sequential(sess, xa), _sequential(sess, xb)
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("b", [sess.run(x) for x in xb]))
    th.start()
    out["a"] = sess.run_many(xa, depth=3)
    th.join()
    assert sum(not np.array_equal(a, b) for a, b in zip(out["a"], want_a)) == 0
    assert sum(not np.array_equal(a, b) for a, b in zip(out["b"], want_b)) == 0


def test_max_concurrent_one_still_correct_from_threads():
    """With one context the calls queue for it: slower, never wrong."""
    net = small_net(n=1)
    sess = Session(tilefuse.compile(net), threads=1, max_concurrent=1)
    xs = [_x(net, i) for i in range(40)]
    want = _sequential(sess, xs)
    got = [None] * 40

    def worker(k):
        for i in range(k, 40, 4):
            got[i] = sess.run(xs[i])

    ths = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    [t.start() for t in ths]
    [t.join() for t in ths]
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    assert sess.contexts == 1


def test_streamed_network_eight_threads_200_runs():
    """compile(net, schedule="stream") is safe from threads (public API only)."""
    rng = np.random.default_rng(0)
    net = tilefuse.Network("streamed")
    x = net.input("x", (1, 3, 12, 10))
    y = net.relu(net.conv2d(x, rng.standard_normal((16, 3, 3, 3)).astype(np.float32), None, padding=1))
    y = net.max_pool(y, 2)
    net.output(net.conv2d(y, rng.standard_normal((8, 16, 3, 3)).astype(np.float32), None, padding=1))
    s = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": 2, "threads": 1})
    distinct = [[rng.standard_normal((1, 3, 12, 10)).astype(np.float32) for _ in range(20)] for _ in range(8)]
    xs = [[d[i % 20] for i in range(200)] for d in distinct]          # 200 runs per thread
    ref = [[s.run(x) for x in d] for d in distinct]
    want = [[r[i % 20] for i in range(200)] for r in ref]
    got = _in_threads(s.run, xs)
    assert sum(not np.array_equal(a, b) for t in range(8) for a, b in zip(got[t], want[t])) == 0
    np.testing.assert_allclose(want[0][0], tilefuse.evaluate(net, xs[0][0])[0], rtol=1e-4, atol=1e-4)


def test_release_while_computing_is_refused():
    net = small_net(n=1)
    sess = Session(tilefuse.compile(net))
    sess.copy_constants()
    started, go = threading.Event(), threading.Event()
    real = sess._execute

    def slow(*a, **kw):
        started.set()
        go.wait(10)
        real(*a, **kw)

    sess._execute = slow
    th = threading.Thread(target=lambda: sess.run(_x(net, 0)))
    th.start()
    started.wait(10)
    with pytest.raises(DeviceError, match="computing"):
        sess.release()
    go.set()
    th.join()
    sess.release()


# ----------------------------------------------------------------------------- compute_network addresses

@pytest.fixture
def qsess():
    net = small_net(n=1)
    dev = CPUDevice()
    sess = Session(tilefuse.compile(net), dev)
    sess.copy_constants()
    x = _x(net, 0)
    i = ql.dev_malloc(dev, x.nbytes)
    o = ql.dev_malloc(dev, 4 * int(np.prod(net.outputs[0].shape)))
    ql.dev_memcpy(dev, ql.HOST_TO_DEV, i, x)
    return net, dev, sess, x, i, o


def test_compute_network_into_the_constant_segment_is_refused(qsess):
    net, dev, sess, x, i, o = qsess
    want = sess.run(x)
    const = sess.segments["const"]
    with pytest.raises(DeviceError, match="segment block"):
        ql.compute_network(sess, [i], [const + 64])
    np.testing.assert_array_equal(sess.run(x), want)          # later runs are still right


@pytest.mark.parametrize("which", ["hidden", "io", "bases"])
def test_compute_network_into_any_session_segment_is_refused(qsess, which):
    net, dev, sess, x, i, o = qsess
    other = Session(tilefuse.compile(small_net(seed=5, n=1)), dev)
    other.copy_constants()
    for s in (sess, other):
        with pytest.raises(DeviceError, match="expected a block from dev_malloc"):
            ql.compute_network(sess, [i], [s.segments[which]])
        with pytest.raises(DeviceError, match="expected a block from dev_malloc"):
            ql.compute_network(sess, [s.segments[which]], [o])


def test_compute_network_address_checks(qsess):
    net, dev, sess, x, i, o = qsess
    with pytest.raises(DeviceError, match="not inside an allocated block"):
        ql.compute_network(sess, [i], [10 ** 12])
    small = ql.dev_malloc(dev, 8)
    with pytest.raises(DeviceError, match="not inside an allocated block"):
        ql.compute_network(sess, [small], [o])            # too small for the input
    with pytest.raises(DeviceError, match="overlaps input"):
        big = ql.dev_malloc(dev, x.nbytes)
        ql.dev_memcpy(dev, ql.HOST_TO_DEV, big, x)
        ql.compute_network(sess, [big], [big])
    with pytest.raises(DeviceError, match="not an integer"):
        ql.compute_network(sess, [float(i)], [o])
    with pytest.raises(DeviceError, match="expected 1 and 1"):
        ql.compute_network(sess, [i], [o, o])
    ql.compute_network(sess, [i], [o])
    y = ql.dev_memcpy(dev, ql.DEV_TO_HOST, o, shape=net.outputs[0].shape, dtype=np.float32)
    np.testing.assert_allclose(y, tilefuse.evaluate(net, x)[0], rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- device memory

def test_default_device_grows_instead_of_reserving():
    dev = CPUDevice()
    assert dev.reserved_bytes == 0
    net = small_net(n=1)
    sess = Session(tilefuse.compile(net), dev)
    sess.run(_x(net, 0))
    assert 0 < dev.reserved_bytes <= 64 << 20
    big = dev.alloc(200 << 20)          # larger than an arena: an arena of its own
    assert dev.reserved_bytes >= 200 << 20
    dev.free(big)
    assert dev.reserved_bytes <= 64 << 20   # the big arena went back to the OS


def test_dropping_a_session_frees_its_segments():
    dev = CPUDevice()
    net = small_net(n=1)
    c = tilefuse.compile(net)
    sess = Session(c, dev)
    sess.run(_x(net, 0))
    assert dev.used_bytes > 0
    del sess
    gc.collect()
    assert dev.used_bytes == 0
    with Session(c, dev) as s:
        s.run(_x(net, 0))
    assert dev.used_bytes == 0


def test_fixed_capacity_and_out_of_memory_message():
    net = small_net(n=1)
    c = tilefuse.compile(net)
    # room for the constants and a record, not for the hidden segment
    dev = CPUDevice(capacity_bytes=64 + -(-c.package.const_bytes // 64) * 64 + 64)
    with pytest.raises(OutOfDeviceMemory, match=r"larger capacity_bytes \(CLI: --device-memory\)"):
        Session(c, dev).copy_constants()
    assert dev.used_bytes == 0           # a failed copy_constants gives back what it took


def test_growable_device_refuses_more_than_the_host_has():
    dev = CPUDevice()
    with pytest.raises(OutOfDeviceMemory, match="this host has"):
        dev.alloc(1 << 50)
    assert dev.reserved_bytes == 0


def test_freed_arena_addresses_are_never_valid_again():
    dev = CPUDevice(arena_bytes=1 << 20)
    a = dev.alloc(4 << 20)
    dev.free(a)
    with pytest.raises(DeviceError):
        dev.copy_in(a, np.zeros(4, np.float32))
    b = dev.alloc(4 << 20)
    assert b != a


# ----------------------------------------------------------------------------- inputs

@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.bool_, np.complex64])
def test_inputs_of_other_kinds_are_refused_not_cast(dtype):
    net = small_net(n=1)
    sess = Session(tilefuse.compile(net))
    with pytest.raises(GraphError, match=f"x: input has dtype {np.dtype(dtype)}, expected float32"):
        sess.run(np.ones(net.inputs[0].shape, dtype))
    with pytest.raises(GraphError, match="expected float32"):
        sess.run_many([np.ones(net.inputs[0].shape, dtype)])


# ----------------------------------------------------------------------------- tests that can fail

def test_run_many_stages_really_overlap():
    """A sequential loop posing as the pipeline fails this: with slow fake stages, some
    copy-in, compute and copy-out of different items must run at the same time."""
    net = small_net(n=1)
    sess = Session(tilefuse.compile(net))
    sess.copy_constants()
    spans = {"in": [], "compute": [], "out": []}
    lock = threading.Lock()

    def timed(name, fn):
        def f(*a):
            t0 = time.perf_counter()
            time.sleep(0.02)
            r = fn(*a)
            with lock:
                spans[name].append((t0, time.perf_counter()))
            return r
        return f

    sess._copy_in = timed("in", sess._copy_in)
    sess.compute = timed("compute", sess.compute)
    sess._copy_out = timed("out", sess._copy_out)
    xs = [_x(net, i) for i in range(12)]
    ys = sess.run_many(xs, depth=3)
    assert all(np.array_equal(a, sess.run(x)) for a, x in zip(ys, xs))

    def overlaps(a, b):
        return sum(1 for s in spans[a] for t in spans[b] if s[0] < t[1] and t[0] < s[1])

    assert overlaps("in", "compute") >= 3 and overlaps("compute", "out") >= 3, spans


class _RedirectingDevice(CPUDevice):
    """Writes `redirect_to` wherever `redirect_from` is written as a u64: a session that reads
    its IO addresses back from device memory follows the change, one that kept them in a Python
    structure does not."""
    redirect_from = redirect_to = None

    def write_u64(self, addr, value):
        if value == self.redirect_from:
            value = self.redirect_to
        super().write_u64(addr, value)


def test_io_operands_are_resolved_through_device_memory():
    net = small_net(n=1)
    dev = _RedirectingDevice()
    sess = Session(tilefuse.compile(net), dev)
    sess.copy_constants()
    x = _x(net, 1)
    nbytes = 4 * int(np.prod(net.outputs[0].shape))
    i, o, o2 = dev.alloc(x.nbytes), dev.alloc(nbytes), dev.alloc(nbytes)
    dev.copy_in(i, x)
    dev.copy_in(o, np.zeros(nbytes // 4, np.float32))
    dev.redirect_from, dev.redirect_to = o, o2
    sess.compute([i], [o])
    assert not dev.copy_out(o, (nbytes // 4,), np.float32).any()
    y = dev.copy_out(o2, net.outputs[0].shape, np.float32)
    np.testing.assert_allclose(y, tilefuse.evaluate(net, x)[0], rtol=1e-5, atol=1e-5)


def _package(name, const, blocks, io, prog, hidden=0):
    body, _ = encode(prog)
    area = bytearray(const) if const else bytearray(-(-len(body) // 64) * 64)
    assert len(body) <= min((b.offset for b in blocks if b.segment == "const"), default=len(area))
    area[:len(body)] = body
    return DataPackage(name, len(area), hidden, 8 * len(io), len(body), bytes(area), blocks, io)


def test_paper_direct_addressing_through_a_device_and_package(tmp_path):
    """Constant segment at 1024, block at segment offset 2048, byte 4 of it: 3076."""
    f32 = np.dtype(np.float32)
    k = np.array([5.0, 7.0], np.float32)
    area = bytearray(2048 + 64)
    area[2048:2056] = k.tobytes()
    prog = [Instruction("add", [Operand("x", INDIRECT, IO, f32, (1,), 0, 0),
                                Operand("k", DIRECT, CONST, f32, (1,), 2048, 4),
                                Operand("y", INDIRECT, IO, f32, (1,), 8, 0)], {"relu": False})]
    pkg = _package("direct", area, [Block("k", "const", 2048, 8, f32.str, (2,))],
                   [IOSlot("x", "input", 0, f32.str, (1,)), IOSlot("y", "output", 8, f32.str, (1,))], prog)
    pkg = load_package(pkg.save(tmp_path / "direct.tfpkg"))       # through the file and its validation
    dev = CPUDevice(capacity_bytes=1 << 16)
    dev.alloc(1024 - 64)                                             # [64, 1024): the constants land at 1024
    sess = Session(pkg, dev)
    sess.copy_constants()
    assert sess.segments["const"] == 1024
    assert dev.view(3076, np.float32, (1,))[0] == 7.0               # 1024 + 2048 + 4
    np.testing.assert_array_equal(sess.run(np.array([1.0], np.float32)), [8.0])
    dev.view(3076, np.float32, (1,))[0] = 100.0                      # the kernel reads address 3076
    np.testing.assert_array_equal(sess.run(np.array([1.0], np.float32)), [101.0])


def test_paper_indirect_addressing_through_a_device_and_package(tmp_path):
    """IO-address segment at 9000, its slot at +8 holds the output block 10000; the second
    instruction writes byte 6 of the output: 10006."""
    f16 = np.dtype(np.float16)
    prog = [Instruction("flatten", [Operand("x", INDIRECT, IO, f16, (1, 3), 0, 0),
                                    Operand("y", INDIRECT, IO, f16, (1, 3), 8, 0)], {"start_dim": 1}),
            Instruction("flatten", [Operand("x", INDIRECT, IO, f16, (1, 1), 0, 6),
                                    Operand("y", INDIRECT, IO, f16, (1, 1), 8, 6)], {"start_dim": 1})]
    pkg = _package("indirect", None, [],
                   [IOSlot("x", "input", 0, f16.str, (1, 4)), IOSlot("y", "output", 8, f16.str, (1, 4))], prog)
    pkg = load_package(pkg.save(tmp_path / "indirect.tfpkg"))
    dev = CPUDevice(capacity_bytes=1 << 16, alignment=8)
    # steer first fit: the session allocates its constants, then a record, a hidden and an IO segment
    holes = [dev.alloc(pkg.const_bytes), dev.alloc(24), dev.alloc(8)]
    dev.alloc(9000 - (holes[-1] + 8))                                 # fill up to 9000
    io_hole = dev.alloc(16)
    assert io_hole == 9000
    dev.alloc(10000 - 9016)
    out = dev.alloc(8)
    assert out == 10000
    inp = dev.alloc(8)
    for h in holes + [io_hole]:
        dev.free(h)
    sess = Session(pkg, dev)
    sess.copy_constants()
    assert sess.segments["io"] == 9000
    x = np.array([[1.5, -2.0, 3.25, 4.0]], np.float16)
    dev.copy_in(inp, x)
    ql.compute_network(sess, [inp], [out])
    assert dev.read_u64(9000 + 8) == 10000
    assert dev.view(10006, np.float16, (1,))[0] == np.float16(4.0)
    np.testing.assert_array_equal(dev.copy_out(out, (1, 4), np.float16), x)


# ----------------------------------------------------------------------------- zero copy

def test_map_host_blocks_are_the_array_and_never_allocated_into():
    dev = CPUDevice()
    a = np.arange(1000, dtype=np.float32)
    addr = dev.map_host(a)
    assert dev.block_of(addr, a.nbytes, kind="user") == addr
    v = dev.view(addr, np.float32, (1000,))
    assert np.shares_memory(v, a)
    v[3] = -1.0                                   # kernels write the caller's array itself
    assert a[3] == -1.0
    before = dev.reserved_bytes
    others = [dev.alloc(64) for _ in range(20)]   # the allocator never places a block in it
    for o in others:
        assert not (addr <= o < addr + a.nbytes)
    assert dev.reserved_bytes >= before           # mapped bytes are not the device's own
    dev.free(addr)
    with pytest.raises(DeviceError):
        dev.view(addr, np.float32, (1000,))       # unmapped: the address is gone for good
    addr2 = dev.map_host(np.ones(8, np.float32))
    assert addr2 != addr
    for bad in (np.arange(10, dtype=np.float32)[::2], np.frombuffer(b"\0" * 16, np.float32),
                np.empty(0, np.float32), [1.0]):
        with pytest.raises(DeviceError, match="expected a C-contiguous, writable"):
            dev.map_host(bad)


def _big_const_net():
    net = tilefuse.Network("bigconst")
    x = net.input("x", (1, 64, 12, 12))
    rng = np.random.default_rng(5)
    y = net.conv2d(x, rng.standard_normal((256, 64, 3, 3)).astype(np.float32) * 0.05,
                   np.zeros(256, np.float32), padding=1)
    net.output(net.relu(y))
    return net


def test_zero_copy_session_maps_constants_and_io_instead_of_copying(tmp_path):
    """On the default (growable) CPUDevice the constant segment is the package's own bytes and
    run() reads the caller's input in place: nothing is copied (bytes_in / bytes_out stay 0),
    the device holds less than the constants, and the results equal a copying (fixed-capacity)
    device's bit for bit; the same for a package loaded from a file."""
    net = _big_const_net()
    c = tilefuse.compile(net)
    x = _x(net, 7)
    fixed = CPUDevice(capacity_bytes=64 << 20)
    assert not fixed.zero_copy
    ref = Session(c, fixed).run(x)
    assert fixed.bytes_in >= c.package.const_bytes          # the copying device copied them
    path = tmp_path / "big.tfpkg"
    c.save(path)
    for pkg in (c.package, load_package(path)):
        dev = CPUDevice()
        s = Session(pkg, dev)
        s.copy_constants()
        const = dev.view(s.segments["const"], np.uint8, (pkg.const_bytes,))
        assert np.shares_memory(const, np.frombuffer(pkg.const_area, np.uint8))
        assert dev.mapped_bytes == pkg.const_bytes           # the weights are the package's ...
        assert dev.used_bytes - dev.mapped_bytes < pkg.const_bytes   # ... with no second copy
        for _ in range(3):
            y = s.run(x)
            np.testing.assert_array_equal(y, ref)
        assert dev.bytes_in == 0 and dev.bytes_out == 0
        for _ in range(20):
            s.run(x)
        assert dev.mapped_bytes == pkg.const_bytes          # IO mappings are removed after each call
        ro = np.frombuffer(x.tobytes(), np.float32).reshape(x.shape)   # read-only input: copied once
        np.testing.assert_array_equal(s.run(ro), ref)
        np.testing.assert_array_equal(s.run_many([x, ro]), [ref, ref])  # run_many copies in and out


def test_run_many_copies_inputs_so_a_reused_buffer_is_safe():
    """A producer that reuses one array for every item (a video decoder's frame buffer):
    run_many must read each item when it takes it, not later."""
    net = small_net(n=1)
    s = Session(tilefuse.compile(net), CPUDevice())
    xs = [_x(net, i) for i in range(6)]
    buf = np.empty_like(xs[0])

    def frames():
        for x in xs:
            buf[...] = x
            yield buf
    ys = s.run_many(frames())
    for x, y in zip(xs, ys):
        np.testing.assert_allclose(y, tilefuse.evaluate(net, x)[0], rtol=1e-5, atol=1e-5)


def test_run_many_reuses_kernel_scratch_across_calls(monkeypatch):
    """Each run_many starts new stage threads; the kernels' host scratch (Winograd's V / M buffers)
    lives with the session's context, so the second call allocates none (a per-thread scratch
    allocated them again every call, and glibc's brk heap kept the pages)."""
    from tilefuse.kernels import threads as T
    rng = np.random.default_rng(0)
    net = tilefuse.Network("wino")
    x = net.input("x", (1, 32, 28, 28))
    y = net.relu(net.conv2d(x, rng.standard_normal((64, 32, 3, 3)), rng.standard_normal(64), padding=1))
    net.output(net.conv2d(y, rng.standard_normal((64, 64, 3, 3)), rng.standard_normal(64), padding=1))
    sess = Session(tilefuse.compile(net, algorithm="winograd4"), threads=2)
    xs = [_x(net, i) for i in range(4)]
    made = []
    get = T.Scratch.get

    def counting_get(self, name, shape, dtype=np.float32):
        if (name, np.dtype(dtype)) not in self.bufs:
            made.append((threading.current_thread().name, name))
        return get(self, name, shape, dtype)

    monkeypatch.setattr(T.Scratch, "get", counting_get)
    first = sess.run_many(xs)
    assert any(n.startswith("wino") for _, n in made), made   # the kernels do use scratch
    made.clear()
    second = sess.run_many(xs)
    assert made == [], f"second run_many allocated kernel scratch again: {made}"
    assert all(np.array_equal(a, b) for a, b in zip(first, second))


def _io_net(inputs: int, seed=0):
    """`inputs` inputs (1 or 2, of different shapes) and two outputs: IO operands in three or four slots of
    the IO segment (streaming takes one input)."""
    rng = np.random.default_rng(seed)
    net = tilefuse.Network("io")
    a = net.input("a", (1, 8, 10, 9))
    b = net.input("b", (1, 5, 10, 9)) if inputs == 2 else net.conv2d(
        a, rng.standard_normal((5, 8, 1, 1)).astype(np.float32) * 0.2, None)
    ya = net.relu(net.conv2d(a, rng.standard_normal((6, 8, 3, 3)).astype(np.float32) * 0.2, None, padding=1))
    yb = net.conv2d(b, rng.standard_normal((6, 5, 1, 1)).astype(np.float32) * 0.2, None)
    y = net.add(ya, yb)
    net.output(y, net.conv2d(b, rng.standard_normal((3, 5, 3, 3)).astype(np.float32) * 0.2, None, padding=1))
    return net


@pytest.mark.parametrize("schedule,inputs", [("layer", 2), ("layer", 1), ("stream", 1)])
def test_zero_copy_run_reads_each_io_array_in_its_own_slot(schedule, inputs):
    """run() on the zero-copy device hands the kernels the caller's arrays as the IO operands without
    mapping them (session.py's module docstring): every input read from its own array and every output
    written to a new one, bit for bit what the copying device's address path computes, the inputs left
    unchanged, the outputs fresh arrays each call; a read-only or strided input is copied first."""
    net = _io_net(inputs)
    c = tilefuse.compile(net, schedule=schedule)
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(i.shape).astype(np.float32) for i in net.inputs]
    ref = Session(c, CPUDevice(capacity_bytes=64 << 20)).run(xs)
    want = tilefuse.evaluate(net, xs)
    assert len(ref) == len(want) == 2
    for r, w in zip(ref, want):
        np.testing.assert_allclose(r, w, rtol=1e-4, atol=1e-4)
    dev = CPUDevice()
    s = Session(c, dev)
    keep = [x.copy() for x in xs]
    first = s.run(dict(reversed(list(zip(("a", "b"), xs)))))
    for y, r in zip(first, ref):
        np.testing.assert_array_equal(y, r)
    for x, k in zip(xs, keep):
        np.testing.assert_array_equal(x, k)
    again = s.run(xs)
    for y, z in zip(first, again):
        assert not np.shares_memory(y, z) and not any(np.shares_memory(y, x) for x in xs)
        np.testing.assert_array_equal(y, z)
    odd = [np.asfortranarray(xs[0])] + [np.frombuffer(x.tobytes(), np.float32).reshape(x.shape) for x in xs[1:]]
    for y, r in zip(s.run(odd), ref):
        np.testing.assert_array_equal(y, r)
    assert dev.bytes_in == 0 and dev.bytes_out == 0 and dev.mapped_bytes == c.package.const_bytes
