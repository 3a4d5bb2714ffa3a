"""Passes, lowering, memory planning, REOFF packing and the plan report."""
import numpy as np
import pytest

import tilefuse
from tilefuse.compiler import passes as P
from tilefuse.compiler.memory import plan_hidden
from tilefuse.compiler.program import CONST, HIDDEN, IO, decode
from tilefuse.errors import GraphError


def rand_bn(net, y, c, rng, name=None):
    return net.batch_norm(y, rng.uniform(0.5, 2, c), rng.standard_normal(c), rng.standard_normal(c),
                          rng.uniform(0.5, 2, c), name=name)


def residual_block(seed=0, c=5, h=9, w=7):
    """conv-BN-ReLU-conv-BN (+ conv-BN shortcut) -> add -> ReLU, odd sizes."""
    rng = np.random.default_rng(seed)
    net = tilefuse.Network("block")
    x = net.input("x", (2, c, h, w))
    y = net.relu(rand_bn(net, net.conv2d(x, rng.standard_normal((c, c, 3, 3)) * 0.3, padding=1), c, rng))
    y = rand_bn(net, net.conv2d(y, rng.standard_normal((c + 2, c, 3, 3)) * 0.3, padding=(1, 1, 3, 1),
                                dilation=(1, 2)), c + 2, rng)
    s = rand_bn(net, net.conv2d(x, rng.standard_normal((c + 2, c, 1, 1))), c + 2, rng)
    o = net.relu(net.add(y, s))
    net.output(o)
    return net


def count(net, op):
    return sum(o.op == op for o in net.ops)


def test_fold_bn_and_fuse_epilogues():
    net = residual_block()
    compiled = tilefuse.compile(net)
    opt = compiled.network
    assert count(opt, "batch_norm") == 0 and count(opt, "relu") == 0 and count(opt, "add") == 0
    assert count(opt, "conv2d") == 3
    last = [o for o in opt.ops if o.params.get("has_residual")]
    assert len(last) == 1 and last[0].params["relu"]
    x = np.random.default_rng(1).standard_normal((2, 5, 9, 7)).astype(np.float32)
    np.testing.assert_allclose(tilefuse.Session(compiled).run(x), tilefuse.evaluate(net, x)[0],
                               rtol=1e-4, atol=1e-4)
    # the source network is untouched
    assert count(net, "batch_norm") == 3


def test_bn_not_folded_when_conv_has_two_users():
    rng = np.random.default_rng(0)
    net = tilefuse.Network("two_users")
    x = net.input("x", (1, 3, 6, 6))
    c = net.conv2d(x, rng.standard_normal((4, 3, 3, 3)), padding=1)
    b = rand_bn(net, c, 4, rng)
    net.output(net.add(b, c))
    opt = P.fold_batch_norm(net).network
    assert count(opt, "batch_norm") == 1
    compiled = tilefuse.compile(net)
    assert count(compiled.network, "scale") == 1  # the leftover BN became a scale
    xi = rng.standard_normal((1, 3, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(tilefuse.Session(compiled).run(xi), tilefuse.evaluate(net, xi)[0],
                               rtol=1e-4, atol=1e-5)


def test_relu_not_fused_into_conv_that_is_a_network_output():
    rng = np.random.default_rng(0)
    net = tilefuse.Network("out")
    x = net.input("x", (1, 2, 5, 5))
    c = net.conv2d(x, rng.standard_normal((2, 2, 3, 3)))
    net.output(c, net.relu(c))
    opt = tilefuse.compile(net).network
    assert count(opt, "relu") == 1


def test_dead_nodes_removed():
    rng = np.random.default_rng(0)
    net = tilefuse.Network("dead")
    x = net.input("x", (1, 2, 5, 5))
    net.conv2d(x, rng.standard_normal((2, 2, 3, 3)))  # unused
    net.output(net.relu(x) if False else net.max_pool(x, 2))
    res = P.eliminate_dead_nodes(net)
    assert res.changed and count(res.network, "conv2d") == 0


def test_pass_results_say_whether_they_changed():
    net = residual_block()
    assert P.fold_batch_norm(net).changed
    assert not P.remove_dropout(net).changed


def test_memory_planner_shares_and_respects_lifetimes():
    blocks = {"a": 1000, "b": 1000, "c": 1000, "d": 64}
    life = {"a": (0, 1), "b": (1, 2), "c": (2, 3), "d": (0, 3)}
    plan = plan_hidden(blocks, life)
    assert plan.naive_bytes == 3 * 1024 + 64
    assert plan.planned_bytes < plan.naive_bytes
    items = list(blocks)
    for i, p in enumerate(items):
        for q in items[i + 1:]:
            lp, lq = life[p], life[q]
            if not (lp[1] < lq[0] or lq[1] < lp[0]):  # live together -> disjoint memory
                op, oq = plan.offsets[p], plan.offsets[q]
                assert op + blocks[p] <= oq or oq + blocks[q] <= op, (p, q)
    assert plan.offsets["a"] == plan.offsets["c"]  # a dies before c is born


def test_reoff_layout_and_offsets():
    net = residual_block()
    compiled = tilefuse.compile(net)
    pkg = compiled.package
    prog = decode(pkg.const_area[:pkg.program_size])  # instructions first in the constant area
    consts = {b.name: b for b in pkg.blocks if b.segment == "const"}
    hidden = {b.name: b for b in pkg.blocks if b.segment == "hidden"}
    assert min(b.offset for b in consts.values()) >= pkg.program_size
    assert pkg.io_bytes == 8 * 2
    for ins in prog:
        for op in ins.operands:
            if op.segment == CONST:
                assert op.seg_offset == consts[op.name].offset
                raw = pkg.const_area[op.seg_offset:op.seg_offset + op.nbytes]
                node = next(d for d in compiled.lowered.constants if d.name == op.name)
                assert raw == node.value.tobytes()
            elif op.segment == HIDDEN:
                assert op.seg_offset == hidden[op.name].offset
            else:
                assert op.segment == IO and op.seg_offset in (0, 8)
    assert pkg.const_bytes == max(b.offset + b.nbytes for b in consts.values()) + \
        (-max(b.offset + b.nbytes for b in consts.values())) % 64


def test_plan_reports_kernels_flops_and_memory():
    compiled = tilefuse.compile(residual_block())
    plan = compiled.plan()
    assert [r["kernel"] for r in plan.rows] == ["conv2d"] * 3
    assert plan.rows[0]["flops"] == 2 * 2 * 5 * 9 * 7 * 5 * 9
    assert plan.hidden_bytes <= plan.hidden_naive_bytes
    text = str(plan)
    assert "planned vs" in text and "x@io+0*" in text


def test_compile_errors():
    net = tilefuse.Network("empty")
    net.input("x", (1, 1, 2, 2))
    with pytest.raises(GraphError, match="no outputs"):
        tilefuse.compile(net)
    with pytest.raises(ValueError, match="target 'gpu' is not supported"):
        tilefuse.compile(residual_block(), target="gpu")


def test_bn_fold_weights_chunked_equal_whole_array_formula():
    """fold_batch_norm scales the weights a few output channels at a time (no whole-weight
    float64 temporaries); the folded weights are bitwise the whole-array float64 formula,
    for a weight spanning several chunks and an odd channel count."""
    rng = np.random.default_rng(5)
    net = tilefuse.Network("fold_chunks")
    x = net.input("x", (1, 70, 5, 5))
    w = rng.standard_normal((301, 70, 3, 3)).astype(np.float32)       # 1.4 MiB as float64: 2 chunks
    c = net.conv2d(x, w, padding=1, name="c")
    b = rand_bn(net, c, 301, rng)
    net.output(b)
    bn = [o for o in net.ops if o.op == "batch_norm"][0]
    gamma, beta, mean, var = (d.value.astype(np.float64) for d in bn.inputs[1:])
    s = gamma / np.sqrt(var + bn.params["eps"])
    want = (w.astype(np.float64) * s.reshape(-1, 1, 1, 1)).astype(np.float32)
    opt = P.fold_batch_norm(net).network
    conv = [o for o in opt.ops if o.op == "conv2d"][0]
    assert count(opt, "batch_norm") == 0
    np.testing.assert_array_equal(conv.inputs[1].value, want)
    assert conv.inputs[1].value.dtype == np.float32


@pytest.mark.parametrize("case", ["flush", "overflow", "normal"])
def test_a_fold_that_would_flush_or_overflow_a_weight_is_not_made(case):
    """fold_batch_norm and fold_channel_affine round w * s to float32: with s = 1e-43 every weight became a
    subnormal with 2-3 significant bits, with s = 1e30 and w ~ 1e10 inf. Such a factor is left as an op after
    the conv (a scale), whose result the reference gives; an ordinary factor is folded."""
    rng = np.random.default_rng(8)
    gamma, var, wscale, xscale = {"flush": (1e-25, 1e36, 1.0, 1.0), "overflow": (1e30, 1.0, 1e10, 1e-20),
                                  "normal": (1.5, 1.0, 1.0, 1.0)}[case]
    w = (rng.standard_normal((4, 3, 3, 3)) * wscale).astype(np.float32)
    net = tilefuse.Network("fold_range")
    x = net.input("x", (1, 3, 6, 6))
    y = net.batch_norm(net.conv2d(x, w, padding=1), np.full(4, gamma), np.zeros(4), np.zeros(4), np.full(4, var))
    net.output(net.mul(net.conv2d(x, w, padding=1), net.constant("s", np.full((1, 4, 1, 1), gamma / var ** 0.5,
                                                                            np.float32))))
    net.output(y)
    folded = case == "normal"
    assert (count(P.fold_batch_norm(net).network, "batch_norm") == 0) == folded
    assert (count(P.fold_channel_affine(net).network, "mul") == 0) == folded
    xi = (rng.standard_normal((1, 3, 6, 6)) * xscale).astype(np.float32)
    got = tilefuse.Session(tilefuse.compile(net)).run(xi)
    for g, want in zip(got, tilefuse.evaluate(net, xi)):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=max(4e-45, 1e-5 * float(np.abs(want).max())))


def test_fold_constants_gives_a_conv_of_an_expression_of_constants_a_constant_weight():
    """compile's fold_constants (before the lowering of convs of computed weights): a weight standardization of a
    constant folds into one constant, so the compiled conv keeps a constant weight and its fast kernels (without
    the fold it would be lowered to im2col and a matmul); not folded: an expand of a constant to a larger tensor
    (a column plus a row: beyond FOLD_LIMIT), a result with NaN (computed at run time as the reference does). The
    compiled program equals the interpreter on the unfolded network."""
    rng = np.random.default_rng(3)
    net = tilefuse.Network("ws")
    x = net.input("x", (2, 3, 16, 16))
    w = net.constant("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    ws = net.mul(net.sub(w, net.mean(w, (1, 2, 3), True, name="w_mean"), name="w_centred"), 0.5, name="w_std")
    y = net.conv2d(x, ws, padding=1, name="conv")                                  # (2, 4, 16, 16)
    big = net.add(net.constant("col", rng.standard_normal((2, 4, 16, 1)).astype(np.float32)),
                  net.constant("row", rng.standard_normal((1, 1, 1, 1024)).astype(np.float32)), name="big")
    nan = net.activation(net.constant("neg", -np.ones((1, 4, 1, 1), np.float32)), "log", name="nan")
    net.output(net.add(y, net.slice(big, 3, 0, 16), name="plus_big"))
    net.output(net.add(y, nan, name="with_nan"))
    res = P.fold_constants(net)
    assert res.detail == "3 ops of constants folded" and res.network.op("conv").inputs[1].is_constant
    assert {"big", "nan"} <= {op.name for op in res.network.ops}
    assert not any(op.op == "conv2d" for op in P.lower_computed_convs(net).network.ops)
    cn = tilefuse.compile(net, threads=2)
    assert cn.pass_log[0] == "fold_constants: 3 ops of constants folded"
    conv = [op for op in cn.network.ops if op.op == "conv2d"]
    assert len(conv) == 1 and conv[0].inputs[1].is_constant
    xi = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    for g, want in zip(cn.run(xi), tilefuse.evaluate(net, xi)):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5 * float(np.nanmax(np.abs(want))))
        assert np.array_equal(np.isnan(g), np.isnan(want))
