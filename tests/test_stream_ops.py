"""schedule="stream" with the ops of modern CNNs (issue 9): convs with any fused activation,
activation / prelu / add / sub / mul / div with a constant broadcast over the rows,
channel_norm, MobileNetV2- and EfficientNet-style blocks, the zoo's mobilenet_v2 and
efficientnet_b0 (which streams up to its first squeeze-excitation and says so).

Every streamed result is compared with the layer schedule and the reference interpreter
(tests/test_stream.py's tolerance), at band_rows 1, 2, 3 and odd heights."""
from __future__ import annotations

import numpy as np
import pytest

import tilefuse
from tilefuse.compiler.bands import split_streamable
from tilefuse.interpreter import evaluate
from tilefuse.ir import Network

from test_stream import W, assert_close, bands

ACTS = [("clip", {"min": 0.0, "max": 6.0}), ("hardswish", {}), ("hardsigmoid", {}), ("sigmoid", {}),
        ("silu", {}), ("gelu", {}), ("gelu_tanh", {}), ("leaky_relu", {"negative_slope": 0.2}),
        ("elu", {"alpha": 0.7}), ("tanh", {}), ("clip", {"min": -0.5, "max": 0.5})]


def _stem(net, p, x, c=20):
    """conv 3x3 (20 channels: NCHW16c rings with padded lanes) and a max pool (so the next op is
    not fused into the conv)."""
    y = net.conv2d(x, p.conv(c, 5, 3), p.vec(c), padding=1)
    return net.max_pool(y, 3, stride=1, padding=1)


def _head(net, p, y, c=20):
    net.output(net.conv2d(y, p.conv(7, c, 3), p.vec(7), stride=2, padding=1))


def net_conv_act(h, w, act, params):
    """A 3x3 conv, a depthwise 3x3 stride 2 and a 1x1 conv, each with the activation fused."""
    p = W(11)
    net = Network(f"conv_{act}")
    x = net.input("x", (1, 5, h, w))
    y = net.activation(net.conv2d(x, p.conv(20, 5, 3), p.vec(20), padding=1), act, **params)
    y = net.activation(net.conv2d(y, p.conv(20, 20, 3, groups=20), p.vec(20), stride=2, padding=1, groups=20),
                       act, **params)
    y = net.activation(net.conv2d(y, p.conv(9, 20, 1), p.vec(9)), act, **params)
    net.output(y)
    return net


def _op_net(case):
    def build(h, w):
        p = W(12)
        net = Network(case)
        x = net.input("x", (1, 5, h, w))
        y = _stem(net, p, x)
        if case == "activation":
            y = net.hardswish(net.silu(y))
        elif case == "prelu":
            y = net.prelu(y, p.vec(20))
        elif case == "prelu1":
            y = net.prelu(y, [0.25])
        elif case == "add_channel":
            y = net.add(y, net.constant("bias_c", p.vec(20).reshape(1, 20, 1, 1)))
        elif case == "sub_scalar_first":
            y = net.sub(0.5, y)
        elif case == "mul_chw":
            y = net.mul(p.vec(20).reshape(20, 1, 1), y)
        elif case == "div_channel":
            y = net.div(y, (p.vec(20) + 2).reshape(1, 20, 1, 1))
        elif case == "add_act":     # two rings (pools: no conv to fuse into), the activation fused into the add
            z = net.avg_pool(y, 3, stride=1, padding=1)
            y = net.gelu(net.add(y, z))
        elif case == "channel_norm":
            y = net.channel_norm(y, p.vec(20, 0.5, 1.5), p.vec(20))
        _head(net, p, y)
        return net
    return build


OP_CASES = ["activation", "prelu", "prelu1", "add_channel", "sub_scalar_first", "mul_chw", "div_channel", "add_act",
            "channel_norm"]
HW = [(13, 11), (9, 16)]


def check_streams(net, band_rows=(1, 2, 3), layouts=("nchwc",), whole=True):
    x = np.random.default_rng(7).standard_normal(net.inputs[0].shape).astype(np.float32)
    want = evaluate(net, x)[0]
    layer = tilefuse.Session(tilefuse.compile(net)).run(x)
    assert_close(layer, want, f"{net.name} layer schedule vs reference", tol=1e-4)
    for layout in layouts:
        for br in band_rows:
            s = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": br, "layout": layout})
            if whole:
                assert not s.schedule.tail and not s.schedule.ends, (net.name, s.schedule.ends)
            got = s.run(x)
            assert_close(got, layer, f"{net.name} band_rows={br} {layout} vs layer schedule")
            assert_close(got, want, f"{net.name} band_rows={br} {layout} vs reference", tol=1e-4)
    return s


@pytest.mark.parametrize("act,params", ACTS, ids=lambda a: a if isinstance(a, str) else "")
def test_convs_with_any_activation_stream(act, params):
    s = check_streams(net_conv_act(11, 9, act, params))
    acts = [b.params["attrs"].get("act") for b in bands(s)]
    assert all(a is not None and a[0] == act for a in acts), acts   # fused: no activation band


@pytest.mark.parametrize("case", OP_CASES)
@pytest.mark.parametrize("hw", HW, ids=lambda s: f"{s[0]}x{s[1]}")
def test_row_local_ops_stream(case, hw):
    net = _op_net(case)(*hw)
    s = check_streams(net, layouts=("nchwc", "nchw") if hw == HW[0] else ("nchwc",))
    ops_ = [b.params["op"] for b in bands(s)]
    want = {"activation": "activation", "prelu": "prelu", "prelu1": "prelu", "add_channel": "add",
            "sub_scalar_first": "sub", "mul_chw": "mul", "div_channel": "div", "add_act": "add",
            "channel_norm": "channel_norm"}[case]
    assert want in ops_, ops_


def mbv2_block(net, p, x, cin, cout, stride, expand, act=("clip", {"min": 0.0, "max": 6.0})):
    """Inverted residual: 1x1 expand + BN + act, depthwise 3x3 (stride) + BN + act, 1x1
    projection + BN, residual add when the shape allows."""
    name, params = act
    c = cin * expand

    def bn(y, ch):
        return net.batch_norm(y, p.vec(ch, 0.5, 1.5), p.vec(ch), p.vec(ch), p.vec(ch, 0.5, 2.0))
    y = net.activation(bn(net.conv2d(x, p.conv(c, cin, 1)), c), name, **params)
    y = net.activation(bn(net.conv2d(y, p.conv(c, c, 3, groups=c), padding=1, stride=stride, groups=c), c),
                       name, **params)
    y = bn(net.conv2d(y, p.conv(cout, c, 1)), cout)
    return net.add(x, y) if stride == 1 and cin == cout else y


def net_mbv2(h, w, acts=None):
    p = W(21)
    acts = acts or [("clip", {"min": 0.0, "max": 6.0})] * 4
    net = Network("mbv2_blocks")
    x = net.input("x", (1, 3, h, w))
    y = net.activation(net.conv2d(x, p.conv(16, 3, 3), None, stride=2, padding=1), *acts[0][:1], **acts[0][1])
    y = mbv2_block(net, p, y, 16, 16, 1, 3, acts[1])
    y = mbv2_block(net, p, y, 16, 24, 2, 4, acts[2])
    y = mbv2_block(net, p, y, 24, 24, 1, 2, acts[3])
    net.output(y)
    return net


def test_mobilenet_v2_blocks_stream_completely():
    check_streams(net_mbv2(31, 27), layouts=("nchwc", "nchw"))


def test_blocks_with_silu_hardswish_gelu_stream_completely():
    acts = [("silu", {}), ("hardswish", {}), ("gelu", {}), ("silu", {})]
    check_streams(net_mbv2(25, 19, acts))


def test_modern_blocks_saved_loaded_and_run_many(tmp_path):
    """The streamed package of the new ops (activation params in the band attrs) passes the
    loader's validation and runs through Session.run_many equal to the layer schedule."""
    net = net_mbv2(21, 17, [("hardswish", {}), ("clip", {"min": 0.0, "max": 6.0}), ("silu", {}), ("gelu", {})])
    s = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": 2, "workers": 2})
    assert not s.schedule.tail
    pkg = tilefuse.load_package(s.save(tmp_path / "mbv2.tfpkg"))
    xs = [np.random.default_rng(i).standard_normal(net.inputs[0].shape).astype(np.float32) for i in range(3)]
    ys = tilefuse.Session(pkg).run_many(xs, depth=2)
    layer = tilefuse.Session(tilefuse.compile(net))
    for x, y in zip(xs, ys):
        assert_close(y, layer.run(x), "saved streamed blocks vs layer schedule")


def test_zoo_mobilenet_v2_streams_its_whole_trunk():
    net = tilefuse.models.mobilenet_v2(seed=0, image_size=64)
    s = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": 2})
    assert [op.op for op in s.schedule.tail] == ["global_avg_pool", "flatten", "linear"]
    assert [e[1] for e in s.schedule.ends] == ["global_avg_pool"]
    assert "reads whole planes" in str(s.plan().stream)
    x = np.random.default_rng(1).standard_normal(net.inputs[0].shape).astype(np.float32)
    assert_close(s.run(x), tilefuse.Session(tilefuse.compile(net)).run(x), "mobilenet_v2 streamed")


def test_zoo_efficientnet_b0_streams_up_to_its_first_squeeze_excitation():
    net = tilefuse.models.efficientnet_b0(seed=0, image_size=64)
    s = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": 2})
    streamed = [l.kind for l in s.schedule.layers]
    assert streamed and all(k == "conv2d" for k in streamed), streamed        # stem, depthwise
    assert s.schedule.tail[0].op == "squeeze_excitation"                        # the SE scale (its mean)
    ends = {e[1]: e[2] for e in s.schedule.ends}
    assert "reads whole planes" in ends["squeeze_excitation"]
    assert any("squeeze-excitation" in why for why in ends.values()), ends      # the scaled conv / mul
    plan = str(s.plan().stream)
    assert "streamed part ends at" in plan and "squeeze_excitation" in plan
    x = np.random.default_rng(2).standard_normal(net.inputs[0].shape).astype(np.float32)
    assert_close(s.run(x), tilefuse.Session(tilefuse.compile(net)).run(x), "efficientnet_b0 streamed")


def test_a_variable_channel_scale_ends_the_streamed_part():
    """squeeze-excitation written out: x * sigmoid(conv(mean(x))). The mean reads whole planes,
    so the scale is a tail tensor and the mul (reading the streamed x) ends the streamed part,
    named with the reason; the result still equals the layer schedule."""
    p = W(31)
    net = Network("se")
    x = net.input("x", (1, 3, 15, 11))
    y = net.silu(net.conv2d(x, p.conv(8, 3, 3), p.vec(8), padding=1))
    s = net.sigmoid(net.conv2d(net.global_avg_pool(y), p.conv(8, 8, 1), p.vec(8)))
    net.output(net.conv2d(net.mul(y, s), p.conv(4, 8, 3), p.vec(4), padding=1))
    streamed, tail = split_streamable(net)
    assert [op.op for op in streamed] == ["conv2d", "activation"]
    c = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": 3})
    whys = " | ".join(f"{n} ({o}): {w}" for n, o, w in c.schedule.ends)
    assert "global_avg_pool does not stream" in whys, whys
    assert "computed in the tail" in whys or "squeeze-excitation" in whys, whys
    xx = np.random.default_rng(3).standard_normal(net.inputs[0].shape).astype(np.float32)
    assert_close(c.run(xx), tilefuse.Session(tilefuse.compile(net)).run(xx), "SE net streamed")


def test_a_constant_that_varies_over_rows_does_not_stream():
    p = W(32)
    net = Network("rowconst")
    x = net.input("x", (1, 3, 9, 7))
    y = net.conv2d(x, p.conv(4, 3, 3), p.vec(4), padding=1)
    plane = np.random.default_rng(1).standard_normal((1, 4, 9, 7)).astype(np.float32)   # varies: nothing to shrink
    y = net.add(y, net.constant("plane", plane))
    net.output(y)
    c = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": 2})
    assert [op.op for op in c.schedule.tail] == ["add"]
    assert "varies over rows" in c.schedule.ends[0][2]


def test_loader_refuses_blocked_rings_for_a_band_kernel_without_that_form():
    """A package is untrusted: an NCHW16c ring for a band op whose kernel has no NCHW16c form
    here (a div by a constant) is refused by the loader, not run."""
    import copy
    import dataclasses
    from tilefuse.compiler.streaming import RING_C, _blocked_shape, validate_stream
    from tilefuse.errors import PackageError
    s = tilefuse.compile(_op_net("div_channel")(13, 11), schedule="stream", stream_options={"band_rows": 2})
    prog = s.package.program()
    k = next(i for i, ins in enumerate(prog) if ins.kernel == "band" and ins.params["op"] == "div")
    p = copy.deepcopy(prog)
    ins = p[k]
    t = [list(v) for v in ins.params["tensors"]]
    acts = [i for i, o in enumerate(ins.operands) if o.segment != 0]
    for j, ti in zip(acts, range(len(t))):
        t[ti][5] = RING_C
        o = ins.operands[j]
        ins.operands[j] = dataclasses.replace(o, shape=_blocked_shape(tuple(t[ti][:4]), t[ti][4]))
    ins.params["tensors"] = t
    steps = np.asarray(s.schedule.steps, np.int32)
    validate_stream(prog, lambda op: steps)                       # as compiled: valid
    with pytest.raises(PackageError, match="takes NCHW rings only"):
        validate_stream(p, lambda op: steps)
