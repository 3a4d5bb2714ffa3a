"""The layout pass (compiler/layout.py): blocked NCHW16c between layers, conversions only where
the layout changes, the user's inputs and outputs NCHW, results equal to the NCHW program.

Tolerance: blocked and NCHW programs run different kernels (padded channels, other summation
orders), so they agree to 1e-4 relative to max|y| (the end-to-end bar); the same program on 1 and
2 threads is bitwise identical.
"""
import numpy as np
import pytest

import tilefuse
from tilefuse import models
from tilefuse.compiler.layout import NCHWC, assign_layouts, blocked_shape, conv_layout
from tilefuse.compiler.program import DIRECT, HIDDEN, IO, INDIRECT, Instruction, Operand

F32 = np.dtype(np.float32)


def _close(a, b, tol=1e-4):
    assert a.shape == b.shape
    assert np.abs(a - b).max() <= tol * max(1.0, float(np.abs(b).max()))


def _kernels(compiled):
    return [r["kernel"] for r in compiled.plan().rows]


def _want(net, x):
    y = tilefuse.evaluate(net, [x])
    return y[0] if isinstance(y, (list, tuple)) else (list(y.values())[0] if isinstance(y, dict) else y)


@pytest.fixture(scope="module")
def resnet18():
    net = models.get("resnet18", seed=0, batch=2, image_size=64)
    x = np.random.default_rng(0).standard_normal(net.inputs[0].shape).astype(np.float32)
    return net, x


def test_resnet_runs_blocked_end_to_end_without_conversions(resnet18):
    net, x = resnet18
    c = tilefuse.compile(net)
    plan = c.plan()
    convs = [r for r in plan.rows if r["kernel"] == "conv2d"]
    # the stem (im2col, 3 input channels) reads NCHW and writes blocked; every other conv is blocked
    assert convs[0]["algorithm"] == "im2col" and convs[0]["params"].get("out_layout") == NCHWC
    assert all(r["layout"] == NCHWC for r in convs[1:])
    assert all(len(r["output_shape"]) == 5 and r["output_shape"][-1] == 16 for r in convs)
    pool = next(r for r in plan.rows if r["kernel"] == "max_pool")
    assert pool["layout"] == NCHWC
    assert "to_nchwc" not in _kernels(c) and "from_nchwc" not in _kernels(c)
    assert "inverse pairs cancelled" in c.layout_log
    # the user's input and output stay NCHW
    assert [s.shape for s in c.inputs] == [net.inputs[0].shape]
    assert [s.shape for s in c.outputs] == [net.outputs[0].shape]
    y = tilefuse.Session(c).run(x)
    _close(y, _want(net, x))
    _close(y, tilefuse.Session(tilefuse.compile(net, layout="nchw")).run(x))


def test_one_and_two_threads_identical_end_to_end(resnet18):
    net, x = resnet18
    c = tilefuse.compile(net, threads=1)
    y1 = tilefuse.Session(c).run(x)                  # the compiled thread count
    y2 = tilefuse.Session(c, threads=2).run(x)
    assert tilefuse.Session(c).threads == 1
    assert np.array_equal(y1, y2)


def _chain(c=32, lrn=True, out_conv=True):
    rng = np.random.default_rng(1)
    net = tilefuse.Network("chain")
    x = net.input("x", (1, c, 9, 8))
    y = net.relu(net.conv2d(x, rng.standard_normal((c, c, 3, 3)) * 0.1, rng.standard_normal(c), padding=1))
    if lrn:
        y = net.local_response_norm(y, 5)     # NCHW-only kernel in the middle
    y = net.conv2d(y, rng.standard_normal((c, c, 1, 1)) * 0.1)
    if out_conv:
        y = net.conv2d(y, rng.standard_normal((c, c, 3, 3)) * 0.1, padding=1)
    net.output(y)
    return net, rng.standard_normal((1, c, 9, 8)).astype(np.float32)


def test_conversions_only_where_the_layout_changes():
    net, x = _chain()
    c = tilefuse.compile(net)
    ks = _kernels(c)
    # x (NCHW input) -> to_nchwc -> conv -> from_nchwc -> LRN -> to_nchwc -> conv -> conv -> from_nchwc -> y
    assert ks == ["to_nchwc", "conv2d", "from_nchwc", "local_response_norm", "to_nchwc", "conv2d", "conv2d",
                  "from_nchwc"]
    prog = c.package.program()
    assert prog[0].inputs[0].segment == IO and prog[-1].output.segment == IO   # user tensors stay NCHW
    assert prog[-1].output.shape == (1, 32, 9, 8)
    _close(tilefuse.Session(c).run(x), _want(net, x))


def test_blocked_shapes_reach_memory_plan_and_package(tmp_path):
    net, x = _chain(c=28, lrn=False)
    c = tilefuse.compile(net)
    blocks = {b.name: b for b in c.package.blocks if b.segment == "hidden"}
    blocked = [n for n in blocks if n.endswith("@nchwc")]
    assert blocked and all(blocks[n].shape[-1] == 16 and blocks[n].shape[1] == 2 for n in blocked)
    assert all(blocks[n].nbytes == int(np.prod(blocks[n].shape)) * 4 for n in blocked)
    y = tilefuse.Session(c).run(x)
    loaded = tilefuse.Session(tilefuse.load_package(c.save(tmp_path / "chain.tfpkg")))
    assert np.array_equal(loaded.run(x), y)


def test_few_channels_stay_nchw():
    # 5 channels would do 10x the multiplies padded to 16: the layer keeps NCHW
    assert conv_layout("direct", "auto", 5, 5) == "nchw"
    assert conv_layout("direct", "auto", 64, 12) == NCHWC   # 16/12 padded: +33%
    assert conv_layout("im2col", "auto", 64, 64) == "nchw"
    assert conv_layout("direct", "nchw", 64, 64) == "nchw"
    assert conv_layout("direct", "auto", 64, 64, groups=2) == "nchw"


def _op(name, shape, seg=HIDDEN):
    return Operand(name, INDIRECT if seg == IO else DIRECT, seg, F32, shape)


def test_pass_cancels_inverse_pairs_and_is_pure():
    s = (1, 32, 4, 4)
    w = Operand("w", DIRECT, 0, F32, (2, 2, 3, 3, 16, 16))
    prog = [Instruction("conv2d", [_op("x", s, IO), w, _op("a", s)], {"layout": NCHWC, "algorithm": "direct"}),
            Instruction("relu", [_op("a", s), _op("b", s)]),
            Instruction("conv2d", [_op("b", s), w, _op("y", s, IO)], {"layout": NCHWC, "algorithm": "direct"})]
    before = [(i.kernel, [o.shape for o in i.operands]) for i in prog]
    res = assign_layouts(prog, [1, 0, 1])
    assert [(i.kernel, [o.shape for o in i.operands]) for i in prog] == before   # input untouched
    assert res.changed and res.cancelled == 2 and res.conversions == 2
    assert [i.kernel for i in res.instructions] == ["to_nchwc", "conv2d", "relu", "conv2d", "from_nchwc"]
    assert res.instructions[2].params["layout"] == NCHWC                       # relu follows its input
    assert res.instructions[2].output.shape == blocked_shape(s)
    assert res.flops == [0, 1, 0, 1, 0]
    assert not assign_layouts(prog, [1, 0, 1], mode="nchw").changed


def test_warmup_reports_first_call_seconds_and_threads_validation(resnet18):
    net, x = resnet18
    c = tilefuse.compile(net, threads=2)
    sess = tilefuse.Session(c)
    assert sess.threads == 2
    secs = sess.warmup()
    assert secs > 0 and sess.jit_seconds == secs
    assert np.array_equal(sess.run(x), tilefuse.Session(c, threads=1).run(x))
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        tilefuse.compile(net, threads=0)
    with pytest.raises(ValueError, match="layout 'nhwc' is not supported"):
        tilefuse.compile(net, layout="nhwc")


def test_plan_shows_layout_partitioning_tiles_and_bytes(resnet18):
    net, _ = resnet18
    plan = tilefuse.compile(net).plan()
    by_alg = {r["algorithm"]: r for r in plan.rows if r["kernel"] == "conv2d"}
    assert by_alg["direct"]["partitioning"] in ("images", "rows split", "Co split", "rows x Co split")
    assert "rows" in by_alg["direct"]["tiles"] and by_alg["direct"]["tasks"] >= 1
    assert by_alg["gemm1x1"]["partitioning"] in ("Co split (input shared)", "positions split", "positions x Co split",
                                                 "one task")
    assert {"Nb", "m", "K"} <= set(by_alg["gemm1x1"]["tiles"])
    assert all(r["bytes"] > 0 for r in plan.rows) and plan.total_bytes == sum(r["bytes"] for r in plan.rows)
    target, head = str(plan).splitlines()[:2]
    assert target.startswith("target: ") and "-bit vectors" in target and "threads" in target
    assert all(k in head for k in ("algorithm", "layout", "partitioning", "tasks", "tiles", "MFLOP", "MB", "ms"))


@pytest.mark.parametrize("act", ["relu", "none", "plus_one"])
def test_a_stem_writing_blocked_reads_its_fused_residual_blocked(act):
    """An im2col conv on 3 channels writes NCHW16c for the 16-channel conv after it; the sum it carries as a fused
    residual (MobileOne's and FastViT's stems: conv3x3(x) + relu(conv1x1(x))) must be read blocked too (it stayed
    NCHW: 'residual ... has shape (2, 16, H, W), expected (2, 1, H, W, 16)' at compile)."""
    from tilefuse.ir import Network
    rng = np.random.default_rng(7)
    w = lambda *s: (rng.standard_normal(s) * 0.3).astype(np.float32)      # noqa: E731
    net = Network("stem_residual")
    x = net.input("x", (2, 3, 13, 11))
    side = net.conv2d(x, w(16, 3, 1, 1), w(16), name="c1")
    side = {"relu": lambda v: net.relu(v), "none": lambda v: v, "plus_one": lambda v: net.add(v, net.constant("one", np.ones(1, np.float32)))}[act](side)
    y = net.add(net.conv2d(x, w(16, 3, 3, 3), w(16), padding=1, name="c3"), side)
    net.output(net.conv2d(y, w(16, 16, 3, 3), w(16), padding=1, name="c16"))
    xv = rng.standard_normal((2, 3, 13, 11)).astype(np.float32)
    want = _want(net, xv)
    outs = []
    for t in (1, 3):
        c = tilefuse.compile(net, threads=t)
        outs.append(c.run(xv))
        _close(outs[-1], want)
    np.testing.assert_array_equal(outs[0], outs[1])
