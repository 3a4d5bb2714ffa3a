"""The channel shuffle (ShuffleNet) as one op, and the NCHW16c lane gather behind it and the misaligned
channel concats and slices (kernels/movement.py).

- the IR op `channel_shuffle` (the concatenation of its inputs, shuffled, channels [start, stop)):
  the reference against torch's nn.ChannelShuffle, shape errors named;
- the blocked kernel against the reference, bitwise (pure movement), with every padded lane written 0
  (the output starts as NaN), odd channel counts, several inputs, batch 1-3, 1-3 threads, and the
  non-contiguous fallback;
- the passes: model code's view -> transpose -> view becomes `channel_shuffle`, ShuffleNetV2's
  chunk -> cat -> shuffle -> chunk becomes one shuffle per tensor read (no concat, no slice left),
  and not where the shuffle's output has another reader or is an output;
- whole networks through from_torch (and torch.nn.ChannelShuffle), compile, save / load_package and
  Session, replayed calls included, against torch.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

import tilefuse
from tilefuse.errors import GraphError
from tilefuse.frontend import from_torch
from tilefuse.interpreter import evaluate
from tilefuse.ir import Network
from tilefuse.kernels import movement
from tilefuse.kernels import reference as ref
from tilefuse.kernels.conv.layout import to_nchwc

RNG = np.random.default_rng(5)


def rnd(shape):
    return RNG.standard_normal(shape).astype(np.float32)


def blocked(x):
    return to_nchwc(x)


# ----------------------------------------------------------------------------- the op and its reference

@pytest.mark.parametrize("shape,g", [((1, 116, 5, 3), 2), ((3, 12, 4, 7), 3), ((2, 20, 1, 1), 4), ((1, 7, 3, 2), 7)])
def test_reference_equals_torch(shape, g):
    x = rnd(shape)
    want = nn.ChannelShuffle(g)(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(ref.channel_shuffle([x], g), want)
    net = Network("s")
    xi = net.input("x", shape)
    net.output(net.channel_shuffle(xi, g))
    (got,) = evaluate(net, [x])
    np.testing.assert_array_equal(got, want)


def test_inputs_and_range_equal_cat_shuffle_slice():
    a, b = rnd((2, 10, 3, 4)), rnd((2, 14, 3, 4))
    t = nn.ChannelShuffle(3)(torch.cat([torch.from_numpy(a), torch.from_numpy(b)], 1)).numpy()
    net = Network("s")
    ai, bi = net.input("a", a.shape), net.input("b", b.shape)
    net.output(net.channel_shuffle([ai, bi], 3, start=5, stop=19))
    (got,) = evaluate(net, [a, b])
    np.testing.assert_array_equal(got, t[:, 5:19])


def test_shape_errors_name_the_node():
    net = Network("e")
    x = net.input("x", (1, 10, 3, 3))
    with pytest.raises(GraphError, match=r"sh: .*10 channels do not split into groups=4"):
        net.channel_shuffle(x, 4, name="sh")
    with pytest.raises(GraphError, match=r"sh2: channel_shuffle channels \[2, 12\) of 10; expected stop <= 10"):
        net.channel_shuffle(x, 2, start=2, stop=12, name="sh2")
    y = net.input("y", (1, 4, 2, 3))
    with pytest.raises(GraphError, match=r"sh3: concat input 'y' has shape \(1, 4, 2, 3\)"):
        net.channel_shuffle([x, y], 2, name="sh3")
    with pytest.raises(GraphError, match="groups=0 must be >= 1"):
        net.channel_shuffle(x, 0)


# ----------------------------------------------------------------------------- the blocked kernel

SHUFFLE_CASES = [   # (input channel counts, groups, start, stop)
    ((58, 58), 2, 0, 58),       # ShuffleNetV2 x1.0, first half
    ((58, 58), 2, 58, 116),     # second half
    ((116, 116), 2, 0, None),   # a stride-2 unit's shuffle, whole
    ((24, 40, 8), 3, 5, 50),    # three inputs, three groups, a range inside
    ((116,), 4, 0, None),       # one input
    ((16, 16), 2, 0, None),     # aligned
    ((3,), 1, 1, 3),            # one group: a channel slice
]


@pytest.fixture(params=["vector", "lanes"])
def lane_form(request, monkeypatch):
    """Both forms of the lane gather: the AVX-512 permutes (conv/_nb.permsel16; where the host has AVX-512F)
    and lane by lane."""
    from tilefuse.kernels.conv.tiles import X86_512
    if request.param == "vector" and not X86_512:
        pytest.skip("the vector form needs AVX-512F (this host runs the lane-by-lane form, tested below)")
    monkeypatch.setattr(movement, "LANE_SIMD", request.param == "vector")
    return request.param


@pytest.mark.parametrize("chans,g,start,stop", SHUFFLE_CASES)
@pytest.mark.parametrize("n,threads", [(1, 1), (2, 2), (3, 3)])
def test_blocked_shuffle_bitwise(chans, g, start, stop, n, threads, lane_form):
    xs = [rnd((n, c, 5, 7)) for c in chans]
    want = ref.channel_shuffle(xs, g, start, stop)
    c_out = want.shape[1]
    out = np.full((n, -(-c_out // 16), 5, 7, 16), np.nan, np.float32)
    movement.channel_shuffle(out, *[blocked(x) for x in xs], groups=g, start=start, stop=stop, layout="nchwc",
                             in_channels=list(chans), channels=c_out, threads=threads)
    np.testing.assert_array_equal(out, blocked(want))      # padded lanes included: 0, not NaN


def test_blocked_shuffle_non_contiguous_fallback():
    xs = [rnd((2, 58, 4, 6)) for _ in range(2)]
    big = np.zeros((2, 4, 4, 12, 16), np.float32)
    big[:, :, :, ::2] = blocked(xs[0])
    view = big[:, :, :, ::2]                               # a strided view: not the gather's operand
    assert not view.flags.c_contiguous
    out = np.full((2, 4, 4, 6, 16), np.nan, np.float32)
    movement.channel_shuffle(out, view, blocked(xs[1]), groups=2, start=58, stop=116, layout="nchwc",
                             in_channels=[58, 58], channels=58, threads=2)
    np.testing.assert_array_equal(out, blocked(ref.channel_shuffle(xs, 2, 58, 116)))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_blocked_concat_and_slice_gather(threads, lane_form):
    """Misaligned channel concats and slices take the lane gather; whole-block ones numpy copies."""
    a, b, c = rnd((2, 21, 3, 5)), rnd((2, 7, 3, 5)), rnd((2, 33, 3, 5))
    out = np.full((2, 4, 3, 5, 16), np.nan, np.float32)
    movement.concat(out, blocked(a), blocked(b), blocked(c), axis=1, layout="nchwc", in_channels=[21, 7, 33],
                    channels=61, threads=threads)
    np.testing.assert_array_equal(out, blocked(np.concatenate([a, b, c], 1)))
    for start, stop, step in ((3, 30, 1), (0, 33, 2), (16, 33, 1), (5, 6, 1)):
        want = c[:, start:stop:step]
        out = np.full((2, -(-want.shape[1] // 16), 3, 5, 16), np.nan, np.float32)
        movement.slice_(out, blocked(c), axis=1, start=start, stop=stop, step=step, layout="nchwc",
                        in_channels=[33], channels=want.shape[1], threads=threads)
        np.testing.assert_array_equal(out, blocked(want))


def test_lane_segments():
    """The vector form's table: per output block its source vectors (at most MAX_SEGMENTS, else lane by
    lane) and for each the lane feeding every output lane, or -1."""
    nseg, src, idx = movement.lane_segments("channel_shuffle", (58, 58), 58, 4, (2, 0))
    # block 0: channels 0-7 of input 0 (its block 0) and of input 1 (block 0): two source vectors
    assert nseg[0] == 2 and tuple(src[:, 0, 0]) == (0, 0) and tuple(src[:, 0, 1]) == (1, 0)
    assert list(idx[0, :16]) == [0, -1, 1, -1, 2, -1, 3, -1, 4, -1, 5, -1, 6, -1, 7, -1]
    assert list(idx[0, 16:32]) == [-1, 0, -1, 1, -1, 2, -1, 3, -1, 4, -1, 5, -1, 6, -1, 7]
    # a 16-way spread (one channel from each of 16 inputs) is more than the vector form takes
    nseg, _, _ = movement.lane_segments("concat", (1,) * 16, 16, 1, ())
    assert nseg[0] == movement.MAX_SEGMENTS + 1
    xs = [rnd((2, 1, 3, 4)) for _ in range(16)]
    out = np.full((2, 1, 3, 4, 16), np.nan, np.float32)
    movement.concat(out, *[blocked(x) for x in xs], axis=1, layout="nchwc", in_channels=[1] * 16, channels=16,
                    threads=2)
    np.testing.assert_array_equal(out, blocked(np.concatenate(xs, 1)))


def test_lane_table_is_cached_and_read_only():
    t = movement.lane_table("channel_shuffle", (58, 58), 58, 4, (2, 0))
    assert t is movement.lane_table("channel_shuffle", (58, 58), 58, 4, (2, 0))
    assert not t.flags.writeable
    # output channel 1 of the shuffle is channel 0 of the second input; lanes 58-63 are padding
    assert tuple(t[:, 0, 1]) == (1, 0, 0) and (t[0, 3, 10:] == -1).all()


# ----------------------------------------------------------------------------- passes and whole networks

def channel_shuffle(x, groups: int):
    """As model code writes it (torchvision's shufflenetv2)."""
    batchsize, num_channels, height, width = x.size()
    x = x.view(batchsize, groups, num_channels // groups, height, width)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(batchsize, -1, height, width)


class Unit(nn.Module):
    """ShuffleNetV2's stride-1 unit: chunk, branch on the second half, cat, shuffle."""

    def __init__(self, c):
        super().__init__()
        h = c // 2
        self.branch = nn.Sequential(nn.Conv2d(h, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU(inplace=True),
                                    nn.Conv2d(h, h, 3, 1, 1, groups=h, bias=False), nn.BatchNorm2d(h),
                                    nn.Conv2d(h, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU(inplace=True))

    def forward(self, x):
        x1, x2 = x.chunk(2, dim=1)
        return channel_shuffle(torch.cat((x1, self.branch(x2)), dim=1), 2)


class Net(nn.Module):
    def __init__(self, c=58, units=3, tail=None):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, 2, 1)
        self.units = nn.Sequential(*[Unit(c) for _ in range(units)])
        self.tail = tail

    def forward(self, x):
        y = self.units(self.stem(x))
        return y if self.tail is None else self.tail(y)


def _init(m):
    torch.manual_seed(0)
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 1.5)
            mod.weight.data.uniform_(0.5, 1.5)
    return m.eval()


def _run(net, xs, threads):
    """compile -> save -> load_package (every instruction through its validator) -> Session.run per input
    (from the second on, replayed task loops)."""
    c = tilefuse.compile(net, threads=threads)
    with tempfile.TemporaryDirectory() as d:
        pkg = tilefuse.load_package(c.save(Path(d) / "n.tfpkg"))
    s = tilefuse.Session(pkg, threads=threads)
    return c, [s.run(x) for x in xs]


def _close(got, m, x):
    want = m(torch.from_numpy(x)).detach().numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.parametrize("threads", [1, 2])
def test_shufflenet_units_fused_and_equal_torch(threads):
    m = _init(Net(58, 3))
    xs = [rnd((2, 3, 18, 14)) for _ in range(3)]
    net = from_torch(m, torch.from_numpy(xs[0]))
    c, outs = _run(net, xs, threads)
    ops = [o.op for o in c.network.ops]
    # the first unit's chunk of the stem's output stays two slices; nothing else moves channels but the
    # shuffles: two per unit (one per half the next unit reads), the last unit's (a network output) whole
    assert "concat" not in ops and ops.count("slice") == 2 and "permute" not in ops and "reshape" not in ops, ops
    assert ops.count("channel_shuffle") == 2 + 2 + 1, ops
    prog = c.package.program()
    assert all(i.params.get("layout") == "nchwc" for i in prog if i.kernel == "channel_shuffle")
    for x, got in zip(xs, outs):
        _close(got, m, x)


@pytest.mark.parametrize("threads", [1, 2])
def test_replayed_runs_read_new_inputs(threads):
    m = _init(Net(58, 2, tail=nn.Conv2d(58, 10, 1)))
    net = from_torch(m, torch.zeros(1, 3, 16, 16))
    c = tilefuse.compile(net, threads=threads)
    s = tilefuse.Session(c, threads=threads)
    for seed in range(4):
        x = np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32)
        _close(s.run(x), m, x)


def test_shuffle_with_another_reader_is_not_split():
    """The shuffle's output is also added to itself: it stays one tensor (the slices are not fused)."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 40, 1)
            self.post = nn.Conv2d(20, 8, 1)

        def forward(self, x):
            y = channel_shuffle(self.conv(x), 4)
            a, b = y.chunk(2, dim=1)
            return self.post(a) + self.post(b) + y.sum(1, keepdim=True)

    m = _init(M())
    x = rnd((1, 3, 9, 11))
    net = from_torch(m, torch.from_numpy(x))
    c, (got,) = _run(net, [x], 2)
    ops = [o.op for o in c.network.ops]
    assert ops.count("channel_shuffle") == 1 and ops.count("slice") == 2, ops
    _close(got, m, x)


def test_torch_channel_shuffle_module():
    m = _init(nn.Sequential(nn.Conv2d(3, 24, 3, padding=1), nn.ChannelShuffle(3), nn.Conv2d(24, 5, 1)))
    x = rnd((2, 3, 7, 6))
    net = from_torch(m, torch.from_numpy(x))
    c, (got,) = _run(net, [x], 2)
    assert [o.op for o in c.network.ops].count("channel_shuffle") == 1
    _close(got, m, x)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_onnx_exports_fuse_the_same_way(exporter):
    """Reshape -> Transpose -> Reshape with the Concat before and the Split / Slice after, from both torch
    exporters: the same gathers as from_torch, equal to ONNX Runtime and torch."""
    from onnx_export import export, ort_run

    from tilefuse.frontend import from_onnx
    m = _init(Net(58, 3, tail=nn.Conv2d(58, 6, 1)))
    x = rnd((1, 3, 14, 18))
    blob = export(m, x, exporter)
    c, (got,) = _run(from_onnx(blob), [x], 2)
    ops = [o.op for o in c.network.ops]
    assert "concat" not in ops and "permute" not in ops and ops.count("channel_shuffle") == 2 + 2 + 1, ops
    _close(got, m, x)
    want = ort_run(blob, x)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * float(np.abs(want).max()))


def test_validator_refuses_crafted_shuffles():
    """A package's channel_shuffle instruction is checked before anything runs: channel counts that
    disagree with the blocked shapes (the lane table would name blocks the inputs do not have), a range past
    the channels, groups that do not divide them."""
    from tilefuse.compiler import validate as V
    from tilefuse.compiler.program import DIRECT, HIDDEN, Instruction, Operand

    def ins(shapes, out, **params):
        ops = [Operand(f"i{k}", DIRECT, HIDDEN, np.dtype(np.float32), sh) for k, sh in enumerate(shapes)]
        return Instruction("channel_shuffle", ops + [Operand("o", DIRECT, HIDDEN, np.dtype(np.float32), out)],
                           dict(params, layout="nchwc"))
    V.VALIDATORS["channel_shuffle"](ins([(1, 4, 5, 5, 16), (1, 4, 5, 5, 16)], (1, 4, 5, 5, 16), groups=2,
                                        start=58, stop=116, channels=58, in_channels=[58, 58]))
    bad = [
        (ins([(1, 2, 5, 5, 16)], (1, 7, 5, 5, 16), groups=2, start=0, stop=None, channels=100, in_channels=[100]),
         "channel blocks"),
        (ins([(1, 4, 5, 5, 16), (1, 4, 5, 5, 16)], (1, 4, 5, 5, 16), groups=2, start=60, stop=120, channels=60,
             in_channels=[58, 58]), "stop <= 116"),
        (ins([(1, 4, 5, 5, 16)], (1, 4, 5, 5, 16), groups=3, start=0, stop=None, channels=58, in_channels=[58]),
         "groups=3"),
        (ins([(1, 4, 5, 5, 16), (1, 4, 6, 5, 16)], (1, 8, 5, 5, 16), groups=2, start=0, stop=None, channels=116,
             in_channels=[58, 58]), "concat input"),
    ]
    for i, msg in bad:
        with pytest.raises(ValueError, match=msg):
            V.VALIDATORS["channel_shuffle"](i)
