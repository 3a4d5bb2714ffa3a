"""Device memory, the two QingLong addressing modes, Session.run / run_many."""
import threading
import time

import numpy as np
import pytest

import tilefuse
from tilefuse.errors import DeviceError, GraphError, OutOfDeviceMemory
from tilefuse.runtime import CPUDevice, Session, resolve_direct, resolve_indirect
from tilefuse.runtime.device import SEGMENT_BASE_AREA


def small_net(seed=0, n=2, c=3, h=7, w=5):
    rng = np.random.default_rng(seed)
    net = tilefuse.Network("small")
    x = net.input("x", (n, c, h, w))
    y = net.conv2d(x, rng.standard_normal((4, c, 3, 3)), rng.standard_normal(4), padding=1)
    y = net.relu(y)
    y = net.max_pool(y, 2, ceil_mode=True)
    net.output(net.linear(net.flatten(y), rng.standard_normal((6, 4 * ((h + 1) // 2) * ((w + 1) // 2)))))
    return net


# ----------------------------------------------------------------------------- addressing

def test_paper_direct_addressing_example():
    # filter byte 4 in a constant segment at base 1024, block at segment offset 2048 -> 3076
    assert resolve_direct(1024, 2048, 4) == 3076


def test_paper_indirect_addressing_example():
    # IO segment at 9000; its slot at offset 8 holds the user's block address 10000;
    # byte 6 of the output -> 10006 (through real device memory)
    dev = CPUDevice(capacity_bytes=1 << 16, alignment=8)
    dev.alloc(9000 - 64)                       # [64, 9000)
    io = dev.alloc(16)
    assert io == 9000
    dev.write_u64(9000 + 8, 10000)
    assert resolve_indirect(dev, 9000, 8, 6) == 10006


def test_session_resolves_through_device_memory():
    net = small_net()
    sess = Session(tilefuse.compile(net))
    sess.copy_constants()
    dev = sess.device
    seg = sess.segments
    # the session's own segment-base record, in device memory
    assert [dev.read_u64(seg["bases"] + 8 * i) for i in range(3)] == [seg["const"], seg["hidden"], seg["io"]]
    ins, outs = sess.alloc_io()
    x = np.random.default_rng(1).standard_normal(net.inputs[0].shape).astype(np.float32)
    dev.copy_in(ins[0], x)
    sess.compute(ins, outs)
    # the IO segment now holds the user's addresses (segment-indirect addressing)
    assert dev.read_u64(seg["io"]) == ins[0]
    assert dev.read_u64(seg["io"] + 8) == outs[0]
    y = dev.copy_out(outs[0], net.outputs[0].shape, np.float32)
    np.testing.assert_allclose(y, tilefuse.evaluate(net, x)[0], rtol=1e-5, atol=1e-5)
    sess.free_io((ins, outs))
    sess.release()
    assert dev.used_bytes == 0


# ----------------------------------------------------------------------------- allocator

def test_alloc_is_aligned_and_never_zero():
    dev = CPUDevice(capacity_bytes=1 << 20, alignment=64)
    addrs = [dev.alloc(n) for n in (1, 63, 64, 65, 1000)]
    assert all(a % 64 == 0 and a >= SEGMENT_BASE_AREA for a in addrs)
    assert len(set(addrs)) == len(addrs)


def test_free_coalesces_and_reuses():
    dev = CPUDevice(capacity_bytes=4096 + SEGMENT_BASE_AREA, alignment=64)
    a, b, c = dev.alloc(1024), dev.alloc(1024), dev.alloc(1024)
    dev.free(b)
    dev.free(a)
    d = dev.alloc(2048)  # fits only if a and b merged
    assert d == a
    dev.free(c)
    dev.free(d)
    assert dev.alloc(4096) == a


def test_out_of_memory_reports_requested_and_used():
    dev = CPUDevice(capacity_bytes=1 << 12)
    dev.alloc(2048)
    with pytest.raises(OutOfDeviceMemory, match=r"cannot allocate 4096 bytes: 2048 of 4096 bytes in use"):
        dev.alloc(4096)


@pytest.mark.parametrize("bad", [0, -5, 1.5, True])
def test_alloc_rejects_bad_sizes(bad):
    with pytest.raises(DeviceError, match="positive integer"):
        CPUDevice(1 << 12).alloc(bad)


def test_double_free_and_bad_copies():
    dev = CPUDevice(1 << 16)
    a = dev.alloc(256)
    dev.free(a)
    with pytest.raises(DeviceError, match="not an allocated block"):
        dev.free(a)
    b = dev.alloc(64)
    with pytest.raises(DeviceError, match="not inside an allocated block"):
        dev.copy_in(b, np.zeros(100, np.float32))  # 400 bytes into 64
    with pytest.raises(DeviceError):
        dev.copy_out(b + 10_000, (4,), np.float32)


def test_session_out_of_memory_on_small_device():
    net = small_net()
    with pytest.raises(OutOfDeviceMemory):
        Session(tilefuse.compile(net), CPUDevice(capacity_bytes=1024)).copy_constants()


def test_qingling_style_calls():
    from tilefuse import qinglong as ql
    net = small_net()
    compiled = tilefuse.compile(net)
    dev = CPUDevice()
    sess = Session(compiled, dev)
    sess.copy_constants()
    x = np.ones(net.inputs[0].shape, np.float32)
    i = ql.dev_malloc(dev, x.nbytes)
    o = ql.dev_malloc(dev, 4 * int(np.prod(net.outputs[0].shape)))
    ql.dev_memcpy(dev, ql.HOST_TO_DEV, i, x)
    ql.compute_network(sess, [i], [o])
    y = ql.dev_memcpy(dev, ql.DEV_TO_HOST, o, shape=net.outputs[0].shape, dtype=np.float32)
    ql.dev_free(dev, i)
    ql.dev_free(dev, o)
    # the paper's names stay reachable from the top level for existing code
    assert tilefuse.dev_malloc is ql.dev_malloc and tilefuse.compute_network is ql.compute_network
    np.testing.assert_allclose(y, tilefuse.evaluate(net, x)[0], rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- session

def test_run_checks_input_shape_and_dtype():
    sess = Session(tilefuse.compile(small_net()))
    with pytest.raises(GraphError, match=r"x: input has shape \(1, 3, 7, 5\), expected \(2, 3, 7, 5\)"):
        sess.run(np.zeros((1, 3, 7, 5), np.float32))
    with pytest.raises(GraphError, match="got 2 inputs, expected 1"):
        sess.run([np.zeros((2, 3, 7, 5))] * 2)
    with pytest.raises(GraphError, match="dtype complex128"):
        sess.run(np.zeros((2, 3, 7, 5), np.complex128))
    # the constant segment and one context (record, hidden, IO addresses); no IO buffer left behind
    assert sess.device.used_bytes == sum(
        -(-s // 64) * 64 for s in (max(sess.package.const_bytes, 1), 24, max(sess.package.hidden_bytes, 1),
                                   max(sess.package.io_bytes, 1)))


def test_run_many_1000_inputs_equal_run_in_order():
    net = small_net(n=1)
    sess = Session(tilefuse.compile(net))
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(net.inputs[0].shape).astype(np.float32) for _ in range(1000)]
    ys = sess.run_many(xs, depth=3)
    assert len(ys) == 1000
    for i in range(0, 1000, 1):
        np.testing.assert_array_equal(ys[i], sess.run(xs[i]))
    st = sess.last_stats
    assert st.items == 1000 and st.stage_names == ["copy-in", "compute", "copy-out"]


def test_run_many_surfaces_a_failing_input_quickly_and_frees_buffers():
    net = small_net(n=1)
    sess = Session(tilefuse.compile(net))
    sess.copy_constants()
    used = sess.device.used_bytes
    good = np.zeros(net.inputs[0].shape, np.float32)
    xs = [good] * 50 + [np.zeros((9, 9), np.float32)] + [good] * 5000
    t = time.perf_counter()
    with pytest.raises(GraphError, match="expected"):
        sess.run_many(xs, depth=3)
    assert time.perf_counter() - t < 10
    assert sess.device.used_bytes == used
    assert not [t for t in threading.enumerate() if t.name.startswith("pipeline-")]


def test_run_many_surfaces_a_compute_failure():
    net = small_net(n=1)
    sess = Session(tilefuse.compile(net))
    sess.copy_constants()
    calls = {"n": 0}
    real = sess.compute

    def flaky(i, o):
        calls["n"] += 1
        if calls["n"] == 7:
            raise RuntimeError("device fault on item 7")
        real(i, o)

    sess.compute = flaky
    with pytest.raises(RuntimeError, match="device fault"):
        sess.run_many([np.zeros(net.inputs[0].shape, np.float32)] * 100, depth=3)


def test_run_many_with_depth_one_and_several_outputs():
    rng = np.random.default_rng(3)
    net = tilefuse.Network("two")
    x = net.input("x", (1, 2, 4, 4))
    y = net.conv2d(x, rng.standard_normal((3, 2, 1, 1)))
    net.output(net.relu(y), net.global_avg_pool(y))
    sess = Session(tilefuse.compile(net))
    xs = [rng.standard_normal((1, 2, 4, 4)).astype(np.float32) for _ in range(5)]
    for x_, ys in zip(xs, sess.run_many(xs, depth=1)):
        ref = tilefuse.evaluate(net, x_)
        assert isinstance(ys, list) and len(ys) == 2
        for a, b in zip(ys, ref):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
