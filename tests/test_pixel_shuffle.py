"""pixel_shuffle: PixelShuffle / DepthToSpace and their inverses (PixelUnshuffle / SpaceToDepth) as one op.

The reference against PyTorch and ONNX's reference evaluator (both channel orders), the layer kernel against the
reference, the compiler's canonical form of what model code writes (view -> permute -> view) and of ONNX's
DepthToSpace / SpaceToDepth, streaming (a row-mapped op: output row R reads input row R // r, an unshuffle rows
[R r, R r + r)) of super-resolution networks that shuffle last and unshuffle first, the package loader's check of
its row table, and training (the inverse shuffle as its backward)."""
from __future__ import annotations

import copy

import numpy as np
import pytest

import tilefuse
from tilefuse.errors import GraphError, PackageError
from tilefuse.interpreter import evaluate
from tilefuse.ir import Network
from tilefuse.kernels import movement
from tilefuse.kernels import reference as ref

from test_stream import _program_and_consts, assert_close, bands

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("n,c,h,w,r", [(1, 4, 3, 5, 2), (2, 18, 5, 7, 3), (1, 32, 1, 1, 4), (3, 9, 2, 6, 1)])
def test_reference_is_torchs_pixel_shuffle_and_unshuffle(n, c, h, w, r):
    x = _rand(n, c, h, w)
    y = ref.pixel_shuffle(x, r)
    assert np.array_equal(y, F.pixel_shuffle(torch.from_numpy(x), r).numpy())
    assert np.array_equal(ref.pixel_shuffle(y, r, inverse=True), F.pixel_unshuffle(torch.from_numpy(y), r).numpy())
    for mode in ("crd", "dcr"):
        assert np.array_equal(ref.pixel_shuffle(ref.pixel_shuffle(x, r, mode), r, mode, inverse=True), x)


def _onnx_model(op, shape, **attrs):
    from onnx import TensorProto, helper
    n, c, h, w = shape
    b = attrs["blocksize"]
    out = (n, c // (b * b), h * b, w * b) if op == "DepthToSpace" else (n, c * b * b, h // b, w // b)
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("op,mode,shape,b", [("DepthToSpace", "DCR", (2, 18, 3, 5), 3),
                                              ("DepthToSpace", "CRD", (2, 18, 3, 5), 3),
                                              ("DepthToSpace", "DCR", (1, 8, 4, 1), 2),
                                              ("SpaceToDepth", None, (2, 3, 6, 9), 3),
                                              ("SpaceToDepth", None, (1, 5, 4, 2), 2)])
def test_onnx_depth_to_space_imports_as_one_op_equal_to_onnx(op, mode, shape, b):
    """ONNX's reference evaluator and ONNX Runtime give what the reference and the compiled program give."""
    from onnx.reference import ReferenceEvaluator
    ort = pytest.importorskip("onnxruntime")
    attrs = {"blocksize": b, **({"mode": mode} if mode else {})}
    model = _onnx_model(op, shape, **attrs)
    x = _rand(*shape, seed=1)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    blob = model.SerializeToString()
    got_ort = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.array_equal(want, got_ort)
    net = tilefuse.from_onnx(blob)
    assert [o.op for o in net.ops] == ["pixel_shuffle"]
    assert np.array_equal(ref.pixel_shuffle(x, b, (mode or "DCR").lower(), op == "SpaceToDepth"), want)
    assert np.array_equal(tilefuse.compile(net).run(x), want)


def test_onnx_blocksize_zero_is_refused():
    with pytest.raises(GraphError, match="blocksize 0; expected a positive integer"):
        tilefuse.from_onnx(_onnx_model("DepthToSpace", (1, 4, 2, 2), blocksize=1).SerializeToString()
                           .replace(b"blocksize\x18\x01", b"blocksize\x18\x00"))


@pytest.mark.parametrize("mode,inverse", [("crd", False), ("dcr", False), ("crd", True), ("dcr", True)])
def test_layer_kernel_is_the_reference(mode, inverse):
    x = _rand(2, 12, 4, 6, seed=2)
    want = ref.pixel_shuffle(x, 2, mode, inverse)
    out = np.full(want.shape, np.nan, np.float32)
    movement.pixel_shuffle(out, x, factor=2, mode=mode, inverse=inverse)
    assert np.array_equal(out, want)
    wide = np.full(want.shape[:3] + (want.shape[3] + 3,), np.nan, np.float32)    # a strided output view
    movement.pixel_shuffle(wide[..., 1:-2], x, factor=2, mode=mode, inverse=inverse)
    assert np.array_equal(wide[..., 1:-2], want)


def test_builder_refuses_shapes_that_do_not_divide():
    net = Network("bad")
    x = net.input("x", (1, 6, 4, 5))
    with pytest.raises(GraphError, match="6 channels; expected a multiple of 4"):
        net.pixel_shuffle(x, 2)
    with pytest.raises(GraphError, match="height 4 and width 5 must be multiples of 2"):
        net.pixel_shuffle(x, 2, inverse=True)
    with pytest.raises(GraphError, match="mode='cdr'"):
        net.pixel_shuffle(x, 1, mode="cdr")


class SuperRes(nn.Module):
    """Real-ESRGAN's x2 input (pixel_unshuffle first), a body, ESPCN / EDSR's upsampler (conv -> PixelShuffle,
    twice) and a last conv, as their model code writes them."""

    def __init__(self, c=16):
        super().__init__()
        self.conv_first = nn.Conv2d(3 * 4, c, 3, 1, 1)
        self.body = nn.Sequential(nn.Conv2d(c, c, 3, 1, 1), nn.LeakyReLU(0.2, inplace=True), nn.Conv2d(c, c, 3, 1, 1))
        self.upsample = nn.Sequential(nn.Conv2d(c, 4 * c, 3, 1, 1), nn.PixelShuffle(2),
                                      nn.Conv2d(c, 9 * c, 3, 1, 1), nn.PixelShuffle(3))
        self.conv_last = nn.Conv2d(c, 3, 3, 1, 1)

    def forward(self, x):
        feat = self.conv_first(F.pixel_unshuffle(x, 2))
        feat = feat + self.body(feat)
        return self.conv_last(F.leaky_relu(self.upsample(feat), 0.2))


@pytest.fixture(scope="module")
def superres():
    torch.manual_seed(0)
    m = SuperRes().eval()
    x = torch.randn(1, 3, 26, 18)
    with torch.no_grad():
        want = m(x).numpy()
    return tilefuse.from_torch(m, x), x.numpy(), want


def test_model_codes_view_permute_view_compiles_to_pixel_shuffle(superres):
    net, x, want = superres
    assert [o.op for o in net.ops].count("permute") == 3          # as exported: three view -> permute -> view
    c = tilefuse.compile(net)
    kinds = [o.op for o in c.network.ops]
    assert kinds.count("pixel_shuffle") == 3 and "permute" not in kinds and "reshape" not in kinds
    # the LeakyReLU after the last shuffle moved before it (a shuffle permutes elements) and into the conv
    assert "activation" not in kinds
    assert [o.params["act"][0] for o in c.network.ops if o.name == "upsample.2"] == ["leaky_relu"]
    assert [o.params for o in c.network.ops if o.op == "pixel_shuffle"] == [
        {"factor": 2, "mode": "crd", "inverse": True}, {"factor": 2, "mode": "crd", "inverse": False},
        {"factor": 3, "mode": "crd", "inverse": False}]
    assert_close(c.run(x), want, "compiled super-resolution vs PyTorch", tol=1e-5)


def test_other_view_permute_views_stay_as_they_are():
    """A 6-D permutation that is no pixel shuffle (its (i, j) axes swapped) keeps reshape / permute."""
    net = Network("swap")
    x = net.input("x", (1, 8, 3, 5))
    y = net.reshape(x, (1, 2, 2, 2, 3, 5))
    y = net.permute(y, (0, 1, 4, 3, 5, 2))
    net.output(net.reshape(y, (1, 2, 6, 10)))
    xv = _rand(1, 8, 3, 5, seed=3)
    c = tilefuse.compile(net)
    assert "pixel_shuffle" not in [o.op for o in c.network.ops]
    assert np.array_equal(c.run(xv), evaluate(net, xv)[0])
    assert not np.array_equal(c.run(xv), ref.pixel_shuffle(xv, 2))


@pytest.mark.parametrize("band_rows", [1, 2, 5])
def test_super_resolution_streams_end_to_end(superres, band_rows):
    """Every op streams (no tail): the unshuffle reads two input rows per output row, the shuffles one input row
    for two / three output rows; equal to the layer schedule and PyTorch in either ring layout."""
    net, x, want = superres
    layer = tilefuse.compile(net).run(x)
    for layout in ("nchwc", "nchw"):
        s = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": band_rows, "layout": layout})
        assert not s.schedule.tail
        assert [b.params["op"] for b in bands(s)].count("pixel_shuffle") == 3
        got = s.run(x)
        assert_close(got, layer, f"streamed band_rows={band_rows} {layout} vs layer schedule", tol=2e-6)
        assert_close(got, want, f"streamed band_rows={band_rows} {layout} vs PyTorch", tol=1e-5)


def test_saved_stream_round_trips_and_its_row_tables_are_checked(superres, tmp_path):
    net, x, want = superres
    s = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": 3})
    path = s.save(tmp_path / "sr.tfpkg")
    assert_close(tilefuse.Session(tilefuse.load_package(path)).run(x), want, "loaded streamed package", tol=1e-5)
    from tilefuse.compiler.streaming import validate_stream
    prog, read = _program_and_consts(s)
    validate_stream(prog, read)
    at = [i for i, ins in enumerate(prog) if ins.kernel == "band" and ins.params["op"] == "pixel_shuffle"]
    tables = [{k: list(v) for k, v in prog[i].params["windows"][0].items()} for i in at]
    assert tables[0]["lo"][:3] == [0, 2, 4] and tables[0]["hi"][:3] == [2, 4, 6]      # unshuffle by 2
    assert tables[2]["lo"][:7] == [0, 0, 0, 1, 1, 1, 2] and tables[2]["hi"][:4] == [1, 1, 1, 2]   # shuffle by 3
    p = copy.deepcopy(prog)
    p[at[2]].params["windows"] = [dict(tables[2], lo=[0] * len(tables[2]["lo"]))]   # row 0 for every output row
    with pytest.raises(PackageError, match=r"window 0 is rows \[0, 2\) for output row 3"):
        validate_stream(p, read)
    p = copy.deepcopy(prog)
    p[at[1]].params["attrs"] = dict(p[at[1]].params["attrs"], factor=4)
    with pytest.raises(PackageError, match="pixel_shuffle"):
        validate_stream(p, read)


def test_trains_as_its_reshape_permute_form():
    """The trainer's backward of pixel_shuffle (the inverse shuffle) gives the gradients of the same network
    written as reshape / permute / reshape, whose backward is checked against PyTorch elsewhere."""
    from tilefuse.training import SGD, Trainer
    rng = np.random.default_rng(4)
    w1 = (rng.standard_normal((8, 12, 3, 3)) * 0.2).astype(np.float32)
    w2 = (rng.standard_normal((5, 2, 3, 3)) * 0.2).astype(np.float32)

    def build(op_form):
        net = Network("sr")
        x = net.input("x", (2, 3, 6, 8))
        if op_form:
            y = net.pixel_shuffle(x, 2, inverse=True)
        else:
            y = net.reshape(net.permute(net.reshape(x, (2, 3, 3, 2, 4, 2)), (0, 1, 3, 5, 2, 4)), (2, 12, 3, 4))
        y = net.relu(net.conv2d(y, w1, np.zeros(8, np.float32), padding=1, name="c1"))
        if op_form:
            y = net.pixel_shuffle(y, 2, mode="dcr")
        else:
            y = net.reshape(net.permute(net.reshape(y, (2, 2, 2, 2, 3, 4)), (0, 3, 4, 1, 5, 2)), (2, 2, 6, 8))
        y = net.conv2d(y, w2, np.zeros(5, np.float32), padding=1, name="c2")
        net.output(net.flatten(net.global_avg_pool(y)))
        return net

    x = rng.standard_normal((2, 3, 6, 8)).astype(np.float32)
    labels = np.array([1, 3])
    got = Trainer(build(True), SGD(0.1), schedule="unfused").forward_backward(x, labels)
    want = Trainer(build(False), SGD(0.1), schedule="unfused").forward_backward(x, labels)
    assert got[0] == pytest.approx(want[0], rel=1e-6)
    assert set(got[1]) == set(want[1]) and any(np.abs(g).max() > 0 for g in got[1].values())
    for k in want[1]:
        np.testing.assert_allclose(got[1][k], want[1][k], rtol=1e-5, atol=1e-7, err_msg=k)


@pytest.mark.parametrize("mode", ["dcr", "crd"])
def test_both_orders_stream_on_either_ring_layout(mode, monkeypatch):
    """Shuffles and unshuffles of either channel order between convs (channel counts that leave padded lanes in
    NCHW16c rings, factors 2 and 3): NCHW16c rings on both sides take the lane gather
    (`movement.pixel_shuffle_band_nchwc`), NCHW rings the layer kernel; equal to the reference at odd band
    sizes."""
    from test_stream_upsample import check_streams
    rng = np.random.default_rng(5)

    def conv(net, y, co):
        ci = y.shape[1]
        return net.conv2d(y, (rng.standard_normal((co, ci, 3, 3)) * 0.2).astype(np.float32),
                          (rng.standard_normal(co) * 0.1).astype(np.float32), padding=1)
    net = Network(f"shuffles_{mode}")
    x = net.input("x", (2, 5, 12, 8))
    y = conv(net, x, 144)
    y = net.pixel_shuffle(y, 3, mode=mode)                    # (2, 16, 36, 24)
    y = conv(net, y, 20)
    y = net.pixel_shuffle(y, 2, mode=mode, inverse=True)      # (2, 80, 18, 12)
    net.output(conv(net, y, 7))
    calls = []
    gather = movement.pixel_shuffle_band_nchwc
    monkeypatch.setattr(movement, "pixel_shuffle_band_nchwc", lambda *a, **k: calls.append(k) or gather(*a, **k))
    check_streams(net, band_rows=(1, 3), must=("pixel_shuffle",))
    assert {(k["factor"], k["inverse"]) for k in calls} == {(3, False), (2, True)}


def test_only_a_lone_element_wise_activation_moves_before_a_shuffle():
    """relu / activation after a shuffle read by nothing else moves before it (and fuses into the conv); a PReLU
    (a slope per channel: the shuffle changes the channels) or an activation whose shuffle has a second reader
    stays where it is. Values equal the reference either way."""
    rng = np.random.default_rng(6)
    w = (rng.standard_normal((16, 3, 3, 3)) * 0.3).astype(np.float32)

    def build(kind):
        net = Network(kind)
        x = net.input("x", (1, 3, 5, 6))
        ps = net.pixel_shuffle(net.conv2d(x, w, np.zeros(16, np.float32), padding=1, name="conv"), 2, name="ps")
        if kind == "prelu":
            net.output(net.prelu(ps, np.linspace(-0.5, 0.5, 4).astype(np.float32)))
        elif kind == "shared":
            net.output(net.add(net.activation(ps, "silu"), ps))
        else:
            net.output(net.activation(ps, "silu"))
        return net

    x = _rand(1, 3, 5, 6, seed=7)
    for kind, fused in (("lone", True), ("prelu", False), ("shared", False)):
        net = build(kind)
        c = tilefuse.compile(net)
        conv = next(o for o in c.network.ops if o.op == "conv2d")
        assert (conv.params.get("act") is not None and conv.params["act"][0] == "silu") == fused, kind
        assert_close(c.run(x), evaluate(net, x)[0], f"{kind} vs reference", tol=1e-5)
