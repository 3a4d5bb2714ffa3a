"""schedule="stream" with the row-mapped ops (issue 9): resize (nearest, bilinear, align_corners
both ways, by scale and by size), conv_transpose2d (stride, padding, output_padding, groups,
dilation), pad on H and W (constant, reflect, replicate) and adaptive_avg_pool, whose output rows
read a monotone range of input rows given by a row table (kernels/bands.py `RowTable`), not an
integer-stride window. Each is compared with the layer schedule and the reference interpreter
at odd sizes and odd band_rows; the zoo's unet and deeplabv3 and the YOLO-style neck of
tests/modern_models.py stream with their decoders / upsampling inside the streamed part; the
package loader recomputes the row tables from the params and refuses a tampered one."""
from __future__ import annotations

import numpy as np
import pytest

import tilefuse
from tilefuse.errors import GraphError, PackageError
from tilefuse.interpreter import evaluate
from tilefuse.ir import Network
from tilefuse.kernels.bands import RowTable

from test_stream import W, assert_close, bands


def _x(net, seed=7):
    return np.random.default_rng(seed).standard_normal(net.inputs[0].shape).astype(np.float32)


def check_streams(net, band_rows=(1, 3), layouts=("nchwc", "nchw"), must=(), x=None):
    """Streamed == layer schedule == reference at each band_rows / ring layout; every op of
    `must` runs as a band (inside the streamed part)."""
    x = _x(net) if x is None else x
    want = evaluate(net, x)
    layer = tilefuse.Session(tilefuse.compile(net)).run(x)
    layer = layer if isinstance(layer, (list, tuple)) else [layer]
    for lay, w in zip(layer, want):
        assert_close(lay, w, f"{net.name} layer schedule vs reference", tol=1e-4)
    s = None
    for layout in layouts:
        for br in band_rows:
            s = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": br, "layout": layout})
            streamed = {b.params["op"] for b in bands(s)}
            assert set(must) <= streamed, (net.name, sorted(streamed), s.schedule.ends)
            got = s.run(x)
            got = got if isinstance(got, (list, tuple)) else [got]
            for g, lay, w in zip(got, layer, want):
                assert_close(g, lay, f"{net.name} band_rows={br} {layout} vs layer schedule", tol=2e-5)
                assert_close(g, w, f"{net.name} band_rows={br} {layout} vs reference", tol=1e-4)
    return s


def _wrap(name, h, w, body, c=20, cin=5):
    """conv 3x3 -> body(net, p, y) -> conv 3x3: the row-mapped op between two streamed convs."""
    p = W(5)
    net = Network(name)
    x = net.input("x", (1, cin, h, w))
    y = net.conv2d(x, p.conv(c, cin, 3), p.vec(c), padding=1)
    y = body(net, p, y)
    co = y.shape[1]
    net.output(net.conv2d(y, p.conv(6, co, 3), p.vec(6), padding=1))
    return net


RESIZE_CASES = [
    ("nearest_x2", dict(scale_factor=2, mode="nearest")),
    ("nearest_x1.5", dict(scale_factor=1.5, mode="nearest")),
    ("nearest_size", dict(size=(23, 17), mode="nearest")),
    ("nearest_exact", dict(scale_factor=2, mode="nearest-exact")),
    ("nearest_down", dict(size=(5, 4), mode="nearest")),
    ("bilinear_x2", dict(scale_factor=2, mode="bilinear")),
    ("bilinear_x2_ac", dict(scale_factor=2, mode="bilinear", align_corners=True)),
    ("bilinear_x1.5", dict(scale_factor=1.5, mode="bilinear")),
    ("bilinear_size_ac", dict(size=(20, 31), mode="bilinear", align_corners=True)),
    ("bilinear_size", dict(size=(29, 14), mode="bilinear")),
]


@pytest.mark.parametrize("case,kw", RESIZE_CASES, ids=[c[0] for c in RESIZE_CASES])
def test_resize_streams(case, kw):
    net = _wrap(f"resize_{case}", 11, 9, lambda net, p, y: net.resize(y, **kw))
    check_streams(net, must=("resize",))


CONVT_CASES = [
    ("k2s2", dict(k=2, stride=2)),
    ("k3s2_p1_op1", dict(k=3, stride=2, padding=1, output_padding=1)),
    ("k4s2_p1", dict(k=4, stride=2, padding=1)),
    ("k3s1_p1", dict(k=3, stride=1, padding=1)),
    ("k3s2_groups4", dict(k=3, stride=2, padding=1, groups=4)),
    ("k3s2_depthwise", dict(k=3, stride=2, padding=1, output_padding=1, groups=20)),   # GEMM + col2im
    ("k3s2_dilation2", dict(k=3, stride=2, padding=2, dilation=2, output_padding=1)),
    ("k1s3", dict(k=1, stride=3)),          # rows with no tap: bias only
    ("k2s3_p2", dict(k=2, stride=3, padding=2, output_padding=2)),
]


@pytest.mark.parametrize("case,kw", CONVT_CASES, ids=[c[0] for c in CONVT_CASES])
def test_conv_transpose_streams(case, kw):
    kw = dict(kw)
    k, g = kw.pop("k"), kw.get("groups", 1)

    def body(net, p, y):
        co = 12 if g in (1, 4) else 20
        w = p.conv(y.shape[1], co // g, k)       # (C_in, C_out/groups, k, k)
        return net.relu(net.conv_transpose2d(y, w, p.vec(co), **kw))
    net = _wrap(f"convt_{case}", 9, 7, body)
    s = check_streams(net, band_rows=(1, 2, 3), must=("conv_transpose2d",))
    acts = [b.params["attrs"].get("relu") or b.params["attrs"].get("act") for b in bands(s)
            if b.params["op"] == "conv_transpose2d"]
    assert all(acts), acts      # the ReLU fused into the transposed conv's epilogue


PAD_CASES = [("constant", (0, 0, 0, 0, 2, 3, 1, 2), "constant"), ("reflect", (0, 0, 0, 0, 3, 2, 2, 1), "reflect"),
             ("replicate", (0, 0, 0, 0, 1, 4, 3, 0), "replicate"), ("bottom_only", (0, 0, 0, 0, 0, 1, 0, 1), "constant")]


@pytest.mark.parametrize("case,pads,mode", PAD_CASES, ids=[c[0] for c in PAD_CASES])
def test_pad_streams(case, pads, mode):
    net = _wrap(f"pad_{case}", 10, 8, lambda net, p, y: net.pad(y, pads, mode=mode, value=0.25))
    check_streams(net, band_rows=(1, 2, 3), must=("pad",))


def test_adaptive_avg_pool_streams_and_height_one_ends_the_stream():
    net = _wrap("adaptive", 13, 11, lambda net, p, y: net.adaptive_avg_pool(y, (5, 4)))
    check_streams(net, must=("adaptive_avg_pool",))
    net = _wrap("adaptive1", 13, 11, lambda net, p, y: net.adaptive_avg_pool(y, (1, 3)))
    s = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": 2})
    assert s.schedule.ends[0][1] == "adaptive_avg_pool" and "global op" in s.schedule.ends[0][2]


def test_unet_like_decoder_with_skips_and_odd_sizes():
    """Encoder (max pool), decoder (transposed conv, pad to the skip's size, channel concat),
    a bilinear x1.5 head: all in one streamed part; 2 workers too."""
    def body(net, p, y):
        d = net.max_pool(y, 2, 2)                                        # 20 x 5 x 4 (H 11 -> 5)
        d = net.conv2d(d, p.conv(24, 20, 3), p.vec(24), padding=1)
        u = net.conv_transpose2d(d, p.conv(24, 16, 2), p.vec(16), stride=2)   # 16 x 10 x 8
        u = net.pad(u, (0, 0, 0, 0, 0, 1, 0, 1))                           # to 11 x 9
        y = net.concat([y, u], axis=1)
        return net.resize(net.relu(y), scale_factor=1.5, mode="bilinear")
    net = _wrap("unet_like", 11, 9, body)
    check_streams(net, band_rows=(1, 2), must=("conv_transpose2d", "pad", "concat", "resize"))
    x = _x(net)
    s = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": 2, "workers": 2})
    assert not s.schedule.tail
    assert_close(s.run(x), evaluate(net, x)[0], "unet-like, 2 workers", tol=1e-4)


def test_saved_package_round_trip_and_tampered_row_table(tmp_path):
    def body(net, p, y):
        y = net.conv_transpose2d(y, p.conv(20, 8, 3), p.vec(8), stride=2, padding=1, output_padding=1)
        return net.resize(net.pad(y, (0, 0, 0, 0, 1, 1, 1, 1), mode="reflect"), scale_factor=1.5, mode="bilinear")
    net = _wrap("saved", 9, 7, body)
    x = _x(net)
    s = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": 3})
    path = s.save(tmp_path / "up.tfpkg")
    got = tilefuse.Session(tilefuse.load_package(path)).run(x)
    assert_close(got, evaluate(net, x)[0], "loaded streamed package vs reference", tol=1e-4)
    tables = [b for b in bands(s) if isinstance(b.params["windows"][0], dict)]
    assert {b.params["op"] for b in tables} == {"conv_transpose2d", "pad", "resize"}

    # the loader (validate_stream) recomputes every row table from the params and the shapes
    import copy
    from tilefuse.compiler.streaming import validate_stream
    from test_stream import _program_and_consts
    prog, read = _program_and_consts(s)
    validate_stream(prog, read)
    at = next(i for i, ins in enumerate(prog) if ins.kernel == "band" and ins.params["op"] == "resize")

    def broken(edit, match):
        p = copy.deepcopy(prog)
        edit(p[at].params["windows"][0])
        with pytest.raises(PackageError, match=match):
            validate_stream(p, read)

    def shrink(t):             # output row 5 claims one input row less than it reads
        t["hi"] = list(t["hi"])
        t["hi"][5] -= 1
    broken(shrink, r"window 0 is rows \[\d+, \d+\) for output row 5")

    def short(t):
        t["lo"], t["hi"] = t["lo"][:3], t["hi"][:3]
    broken(short, "window 0 is a row table of 3 rows")

    def strided(t):
        t.clear()
        t["lo"] = "x"
    broken(strided, "window")

    at = next(i for i, ins in enumerate(prog) if ins.kernel == "band" and ins.params["op"] == "pad")
    p = copy.deepcopy(prog)
    p[at].params["attrs"] = dict(p[at].params["attrs"], pads=(0, 0, 1, 0, 1, 1, 1, 1))   # pads a channel
    with pytest.raises(PackageError, match="only H and W pads"):
        validate_stream(p, read)


def test_saved_row_slice_round_trips_and_its_window_is_checked(tmp_path):
    """A slice of rows in a saved package: it loads and runs; the loader recomputes its window from
    the params ([step, first row, 1]) and refuses one that reads other rows, or a slice of the batch."""
    import copy
    from tilefuse.compiler.streaming import validate_stream
    from test_stream import _program_and_consts
    net = _wrap("rows", 13, 6, lambda net, p, y: net.add_op("slice", [y], dict(axis=2, start=1, stop=12, step=3)))
    x = _x(net)
    s = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": 2})
    path = s.save(tmp_path / "rows.tfpkg")
    assert_close(tilefuse.Session(tilefuse.load_package(path)).run(x), evaluate(net, x)[0],
                 "loaded row slice vs reference", tol=1e-4)
    prog, read = _program_and_consts(s)
    validate_stream(prog, read)
    at = next(i for i, ins in enumerate(prog) if ins.kernel == "band" and ins.params["op"] == "slice")
    assert list(prog[at].params["windows"][0]) == [3, 1, 1]
    for window, match in (([3, 0, 1], r"window 0 is RowWindow\(stride=3, offset=0, span=1\); the params give "
                                       r"RowWindow\(stride=3, offset=1"),
                          ([1, 1, 1], "window 0 is RowWindow.stride=1")):
        p = copy.deepcopy(prog)
        p[at].params["windows"] = [window]
        with pytest.raises(PackageError, match=match):
            validate_stream(p, read)
    p = copy.deepcopy(prog)
    p[at].params["attrs"] = dict(p[at].params["attrs"], axis=0, start=0, stop=None, step=1)
    with pytest.raises(PackageError, match="slice of axis 0 .the batch."):
        validate_stream(p, read)


def test_row_table_is_monotone_hull():
    from tilefuse.kernels.bands import row_window
    t = row_window("pad", {"pads": (0, 0, 0, 0, 2, 2, 0, 0), "mode": "reflect", "value": 0.0}, (1, 1, 5, 3),
                   (1, 1, 9, 3))
    # rows: 2 1 0 1 2 3 4 3 2 -> lo suffix-min, hi prefix-max
    assert t == RowTable((0, 0, 0, 1, 2, 2, 2, 2, 2), (3, 3, 3, 3, 3, 4, 5, 5, 5))
    assert t.fits(3) == 5 and t.rows(2, 6) == (0, 4)


# ----------------------------------------------------------------------------- models

def _torch_twin_check(net, twin, x, options, must):
    """Streamed (saved and loaded) == PyTorch twin (the issue's 1e-4 of max) == layer schedule."""
    import torch
    with torch.no_grad():
        want = twin(torch.from_numpy(x))
    want = [t.numpy() for t in (want if isinstance(want, (list, tuple)) else [want])]
    s = tilefuse.compile(net, schedule="stream", stream_options=options)
    streamed = [l.kind for l in s.schedule.layers]
    for op, count in must.items():
        assert streamed.count(op) == count, (op, streamed.count(op), s.schedule.ends)
    got = s.run(x)
    got = got if isinstance(got, (list, tuple)) else [got]
    layer = tilefuse.Session(tilefuse.compile(net)).run(x)
    layer = layer if isinstance(layer, (list, tuple)) else [layer]
    for g, w, lay in zip(got, want, layer):
        assert g.shape == w.shape
        assert np.abs(g - w).max() <= 1e-4 * np.abs(w).max(), (net.name, np.abs(g - w).max(), np.abs(w).max())
        assert_close(g, lay, f"{net.name} streamed vs layer schedule", tol=2e-5)
    return s


def test_zoo_unet_streams_encoder_and_decoder():
    """UNet at an odd size (46: the decoder pads the upsampled maps to the skips' sizes): every
    op streams, the four transposed convs, pads and skip concats inside the streamed part."""
    import modern_models as mm
    net = tilefuse.models.get("unet", seed=3, image_size=46, base=8)
    twin = mm.load("unet", net, base=8)
    x = _x(net, 5)
    s = _torch_twin_check(net, twin, x, {"band_rows": 3},
                          {"conv_transpose2d": 4, "concat": 4, "pad": 3})
    assert not s.schedule.tail and not s.schedule.ends


def test_zoo_deeplabv3_streams_its_backbone_and_says_where_the_image_pooling_ends_it():
    """DeepLabV3's ASPP image pooling (global mean -> 1x1 -> upsample -> concat) is a global op:
    the backbone and the ASPP conv branches stream, the plan names the global pool and the concat
    that reads its upsampled map as where the streamed part ends, and the ASPP tail (projection,
    head, bilinear upsampling) runs layer by layer; the result equals the PyTorch twin."""
    import modern_models as mm
    net = tilefuse.models.get("deeplabv3", seed=3, image_size=40)
    twin = mm.load("deeplabv3", net)
    s = _torch_twin_check(net, twin, _x(net, 4), {"band_rows": 2}, {})
    streamed = {l.name for l in s.schedule.layers}
    assert {"classifier.0.convs.0.0", "classifier.0.convs.3.0"} <= streamed      # ASPP conv branches
    ends = {name: why for name, op, why in s.schedule.ends}
    assert "global op" in ends["classifier.0.convs.4.0"]
    assert "computed in the tail" in ends["classifier.0.cat"]
    plan = str(s.plan().stream)
    assert "streamed part ends at 'classifier.0.convs.4.0' (global_avg_pool)" in plan
    assert [op.op for op in s.schedule.tail][-1] == "resize"
    assert "schedule='layer' uses less" in plan          # 40x40: the whole backbone output kept for the tail


def test_streaming_that_holds_more_than_layer_by_layer_warns(monkeypatch):
    """At a size where the kept tensors matter, compile(schedule="stream") warns with both sizes."""
    import importlib
    compile_mod = importlib.import_module("tilefuse.compiler.compile")     # the module, not the function
    monkeypatch.setattr(compile_mod, "WARN_EXCESS_BYTES", 1 << 20)
    net = tilefuse.models.get("deeplabv3", seed=3, image_size=96)
    with pytest.warns(UserWarning, match=r"plans .* MiB of activations, more than layer by layer .*"
                                         r"ends at 'classifier\.0\.convs\.4\.0'"):
        tilefuse.compile(net, schedule="stream", stream_options={"band_rows": 2})


def test_deeplab_head_without_image_pooling_streams_its_bilinear_upsampling():
    """The DeepLabV3 head without the global branch (dilated convs, 1x1 classifier, bilinear
    upsampling x8 to the input size, align_corners False): everything streams."""
    p = W(9)
    net = Network("deeplab_head")
    x = net.input("x", (1, 3, 43, 37))
    y = net.relu(net.conv2d(x, p.conv(16, 3, 3), p.vec(16), stride=2, padding=1))
    y = net.relu(net.conv2d(y, p.conv(24, 16, 3), p.vec(24), stride=2, padding=1))
    y = net.relu(net.conv2d(y, p.conv(24, 24, 3), p.vec(24), stride=2, padding=1))
    branches = [net.relu(net.conv2d(y, p.conv(16, 24, 3), p.vec(16), padding=r, dilation=r)) for r in (1, 2, 3)]
    y = net.relu(net.conv2d(net.concat(branches, axis=1), p.conv(16, 48, 1), p.vec(16)))
    y = net.conv2d(y, p.conv(5, 16, 1), p.vec(5))
    net.output(net.resize(y, size=(43, 37), mode="bilinear"))
    s = check_streams(net, band_rows=(2, 5), must=("resize",))
    assert not s.schedule.tail


def test_yolo_neck_streams_through_from_torch():
    """The YOLO-style neck of tests/modern_models.py (SiLU convs, C2f's torch.chunk, SPPF max
    pools, nearest x2 upsampling by nn.Upsample and F.interpolate, concats, three heads):
    imported by from_torch, every op streams and the three outputs equal PyTorch."""
    import torch
    import modern_models as mm
    twin = mm.randomize(mm.build("yolo_neck", 10), seed=2)
    x = np.random.default_rng(6).standard_normal((1, 3, 64, 96)).astype(np.float32)
    net = tilefuse.from_torch(twin, torch.from_numpy(x))
    s = _torch_twin_check(net, twin, x, {"band_rows": 3}, {"resize": 2})
    assert not s.schedule.tail and len(s.schedule.sinks) == 3
    assert "slice" in {l.kind for l in s.schedule.layers}        # C2f's chunk on channels


def test_float16_row_mapped_ops_stream():
    """Other dtypes: the reference paths of the band kernels (conv_transpose2d on the band,
    resize / adaptive pool with their `band` argument) equal the layer schedule bit for bit."""
    p = W(5)
    net = Network("f16")
    x = net.input("x", (1, 4, 11, 9), np.float16)
    y = net.conv2d(x, p.conv(8, 4, 3).astype(np.float16), None, padding=1)
    y = net.conv_transpose2d(y, p.conv(8, 6, 3).astype(np.float16), None, stride=2, padding=1, output_padding=1)
    y = net.pad(y, (0, 0, 0, 0, 1, 2, 1, 0), mode="replicate")
    y = net.resize(y, scale_factor=1.5, mode="bilinear")
    net.output(net.adaptive_avg_pool(y, (7, 5)))
    xh = np.random.default_rng(1).standard_normal((1, 4, 11, 9)).astype(np.float16)
    s = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": 3})
    assert [l.kind for l in s.schedule.layers] == ["conv2d", "conv_transpose2d", "pad", "resize", "adaptive_avg_pool"]
    got, layer = s.run(xh), tilefuse.compile(net).run(xh)
    assert got.dtype == np.float16 and np.array_equal(got, layer)


@pytest.mark.parametrize("axis,start,stop,step", [(1, 3, 17, 1), (1, 0, 20, 3), (1, 16, 20, 1), (-1, 1, 8, 2),
                                                  (2, 1, 9, 1), (2, 0, None, 2), (-2, 1, None, 2), (2, -8, 10, 3),
                                                  (2, 4, 5, 1), (2, 0, 11, 4),
                                                  (1, -1, None, -1), (1, 17, 2, -3), (3, -1, None, -1), (-1, 7, 0, -2)])
def test_channel_row_and_column_slices_stream(axis, start, stop, step):
    """torch.chunk / x[:, :c] (channel slices, NCHW16c rings through movement.slice_'s lane copies),
    column slices and slices of rows (a row window: output row r reads input row start + r * step)
    stream; a slice of the batch does not."""
    net = _wrap(f"slice{axis}", 11, 9, lambda net, p, y: net.relu(
        net.add_op("slice", [y], dict(axis=axis, start=start, stop=stop, step=step))))
    s = check_streams(net, band_rows=(1, 2, 5), must=("slice",))
    if axis % 4 == 2:
        sl = next(b for b in bands(s) if b.params["op"] == "slice")
        first = slice(start, stop, step).indices(11)[0]
        assert [list(w) for w in sl.params["windows"]] == [[step, first, 1]]
    batch = Network("batch")
    x = batch.input("x", (3, 4, 7, 5))
    batch.output(batch.add_op("slice", [x], dict(axis=0, start=1, stop=None, step=1)))
    with pytest.raises(GraphError, match="slice of axis 0 .the batch.; only slices of channels, rows or columns"):
        tilefuse.compile(batch, schedule="stream")


def test_yolov5_focus_streams_from_torch():
    """YOLOv5's Focus as its model code writes it (x[..., ::2, ::2] and three more phases, cat, a conv):
    four slices of rows and four of columns, all streamed, equal to PyTorch and the layer schedule."""
    torch = pytest.importorskip("torch")

    class Focus(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(12, 16, 3, 1, 1)

        def forward(self, x):
            return torch.nn.functional.silu(self.conv(torch.cat(
                [x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]], 1)))

    torch.manual_seed(0)
    m = Focus().eval()
    x = torch.randn(1, 3, 38, 22)
    net = tilefuse.from_torch(m, x)
    s = check_streams(net, band_rows=(1, 4), must=("slice", "concat", "conv2d"), x=x.numpy())
    assert [b.params["attrs"]["axis"] % 4 for b in bands(s) if b.params["op"] == "slice"].count(2) == 4
    assert not s.schedule.tail
    with torch.no_grad():
        assert_close(s.run(x.numpy()), m(x).numpy(), "Focus streamed vs PyTorch", tol=1e-5)
