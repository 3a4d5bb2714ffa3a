"""Reversed slices (a negative step): torch.flip / x.flip(dims), ONNX Slice with steps < 0.

Test-time augmentation code flips the image (`model(x.flip(3)).flip(3)`), and a flip of channels shows up in
colour-order swaps (`x.flip(1)`: RGB <-> BGR). They import as `slice` ops with a negative step (Python's slice
rules), compile on NCHW and NCHW16c (a reversed channel slice is one lane gather), stream where they are row-local
(channels, columns) and end the streamed part by name where they are not (rows), and train.
"""
from __future__ import annotations

import numpy as np
import pytest

import tilefuse
from tilefuse.errors import GraphError
from tilefuse.interpreter import evaluate
from tilefuse.ir import Network
from tilefuse.kernels import reference as ref

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional


class TTA(nn.Module):
    """A small classifier-free segmenter run on the image and on its mirror, averaged (test-time augmentation as
    segmentation code writes it), with a BGR input swapped to RGB first."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 20, 3, 1, 1), nn.BatchNorm2d(20), nn.ReLU(),
                                  nn.Conv2d(20, 20, 3, 1, 1, groups=4), nn.SiLU(), nn.Conv2d(20, 5, 1))

    def forward(self, x):
        x = x.flip(1)                                       # BGR -> RGB
        y = self.body(x)
        y = (y + self.body(torch.flip(x, dims=[3])).flip(-1)) / 2
        return torch.cat([y, torch.flip(y[:, :2], [1, 2])], 1)


def _tta():
    torch.manual_seed(0)
    m = TTA().eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
        m.body[1].running_mean.uniform_(-0.5, 0.5)
        m.body[1].running_var.uniform_(0.5, 2)
    return m


def test_flip_reference_is_numpys_and_torchs():
    x = np.random.default_rng(0).standard_normal((2, 5, 4, 7)).astype(np.float32)
    for axis in range(4):
        for start, stop, step in ((-1, None, -1), (5, 0, -2), (None, None, -3), (-2, -7, -1)):
            want = torch.from_numpy(x).flip(axis).numpy() if (start, stop, step) == (-1, None, -1) else \
                x[(slice(None),) * axis + (slice(start, stop, step),)]
            if len(range(*slice(start, stop, step).indices(x.shape[axis]))) == 0:
                continue
            assert np.array_equal(ref.slice_axis(x, axis, start, stop, step), want)


@pytest.mark.parametrize("threads", [1, 2])
def test_tta_model_imports_and_compiles_equal_to_pytorch(threads):
    """x.flip(1), torch.flip(x, dims=[3]), .flip(-1), torch.flip(y[:, :2], [1, 2]): each flip one slice of step -1
    per dimension; the compiled program (NCHW16c around the convs: the channel flips are lane gathers) equals
    PyTorch and the reference, at every thread count."""
    m = _tta()
    x = torch.randn(2, 3, 13, 10)
    with torch.no_grad():
        want = m(x).numpy()
    net = tilefuse.from_torch(m, x)
    flips = [o for o in net.ops if o.op == "slice" and o.params["step"] < 0]
    assert sorted(o.params["axis"] for o in flips) == [1, 1, 2, 3, 3], [o.params for o in flips]
    assert all((o.params["start"], o.params["stop"], o.params["step"]) == (-1, None, -1) for o in flips)
    np.testing.assert_allclose(evaluate(net, x.numpy())[0], want, rtol=1e-5, atol=1e-5)
    c = tilefuse.compile(net, threads=threads)
    got = tilefuse.Session(c, threads=threads).run(x.numpy())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # a mirrored image gives the mirrored prediction (the TTA average is symmetric): a flip done as a no-op
    # or on the wrong axis fails this
    mirrored = tilefuse.Session(c, threads=threads).run(np.ascontiguousarray(x.numpy()[..., ::-1]))
    np.testing.assert_allclose(mirrored[:, :5], got[:, :5, :, ::-1], rtol=1e-5, atol=1e-5)


def test_channel_flip_on_blocked_tensors_is_a_lane_gather():
    """A reversed channel slice between two convs (NCHW16c both sides) for channel counts that are and are not
    multiples of 16, and a strided one (step -3): the lane gather's table reads channel c0 + c * step."""
    rng = np.random.default_rng(2)
    for c, (start, stop, step) in ((16, (-1, None, -1)), (37, (-1, None, -1)), (37, (35, 2, -3)),
                                   (40, (20, None, -1))):
        net = Network(f"cflip{c}")
        x = net.input("x", (2, 32, 21, 20))
        y = net.conv2d(x, rng.standard_normal((c, 32, 3, 3)).astype(np.float32), None, padding=1)
        y = net.slice(y, 1, start, stop, step)
        k = y.shape[1]
        net.output(net.conv2d(y, rng.standard_normal((7, k, 1, 1)).astype(np.float32), None))
        xv = rng.standard_normal((2, 32, 21, 20)).astype(np.float32)
        comp = tilefuse.compile(net)
        assert [len(i.output.shape) for i in comp.lowered.instructions if i.kernel == "slice"] == [5]   # NCHW16c
        want = evaluate(net, xv)[0]      # sums of 32 x 9 products, then of up to 40: |want| up to ~200
        np.testing.assert_allclose(comp.run(xv), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_column_and_channel_flips_stream_and_a_row_flip_ends_the_streamed_part():
    from test_stream import bands
    from test_stream_upsample import check_streams
    rng = np.random.default_rng(3)

    def build(axis):
        net = Network(f"flip{axis}")
        x = net.input("x", (1, 4, 17, 11))
        y = net.conv2d(x, rng.standard_normal((20, 4, 3, 3)).astype(np.float32), None, padding=1)
        y = net.slice(y, axis, -1, None, -1)
        net.output(net.conv2d(y, rng.standard_normal((6, 20, 3, 3)).astype(np.float32), None, padding=1))
        return net
    for axis in (1, 3):
        s = check_streams(build(axis), band_rows=(1, 4), must=("slice", "conv2d"))
        assert not s.schedule.tail
        assert [b.params["attrs"]["step"] for b in bands(s) if b.params["op"] == "slice"] == [-1]
    net = build(2)
    s = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": 3})
    assert [(o, "rows reversed" in w) for _, o, w in s.schedule.ends] == [("slice", True)], s.schedule.ends
    x = rng.standard_normal((1, 4, 17, 11)).astype(np.float32)
    want = evaluate(net, x)[0]
    np.testing.assert_allclose(s.run(x), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_step_zero_is_refused_by_name():
    net = Network("zero")
    x = net.input("x", (1, 3, 4, 4))
    with pytest.raises(GraphError, match="step=0; expected a non-zero step"):
        net.slice(x, 3, 0, None, 0)


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([-1], [-(2 ** 62)], [3], [-1]),                      # torch.onnx's flip
    ([-1, 5], [-(2 ** 62), 0], [1, 2], [-1, -2]),
    ([6], [1], [-1], [-3]),
    ([2 ** 62], [-(2 ** 62)], [2], [-1])])
def test_onnx_slice_with_negative_steps_is_onnx_runtimes(starts, ends, axes, steps):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(4)
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")] + [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in
                                                  (("s", starts), ("e", ends), ("a", axes), ("t", steps))]
    idx = [slice(None)] * 4
    for s_, e_, a_, t_ in zip(starts, ends, axes, steps):
        idx[a_ % 4] = slice(s_, e_, t_)
    yshape = list(np.zeros((1, 8, 9, 7))[tuple(idx)].shape)
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                           helper.make_node("Slice", ["c", "s", "e", "a", "t"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 7])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, yshape)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    x = rng.standard_normal((1, 3, 9, 7)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = tilefuse.compile(tilefuse.from_onnx(model)).run(x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_torch_onnx_export_of_the_tta_model_imports():
    """torch.onnx writes each flip as a Slice with steps -1 (ends INT64_MIN); the file imports and matches."""
    import io
    m = _tta()
    x = torch.randn(1, 3, 12, 9)
    buf = io.BytesIO()
    torch.onnx.export(m, (x,), buf, opset_version=17, dynamo=False)
    import onnx
    model = onnx.load_from_string(buf.getvalue())
    assert any(n.op_type == "Slice" for n in model.graph.node)
    with torch.no_grad():
        want = m(x).numpy()
    np.testing.assert_allclose(tilefuse.compile(tilefuse.from_onnx(model)).run(x.numpy()), want, rtol=1e-5,
                               atol=1e-5)


def test_trains_gradients_through_flips_equal_pytorchs():
    """One forward / backward of the Trainer through channel, row and column flips: every parameter gradient
    against PyTorch's (float64). A backward that scattered the gradient unreversed fails it."""
    from tilefuse.training import SGD, Trainer

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(3, 8, 3, 1, 1)
            self.b = nn.Conv2d(8, 6, 3, 1, 1)
            self.fc = nn.Linear(6, 4)

        def forward(self, x):
            y = F.relu(self.a(x.flip(1)))
            y = self.b(torch.flip(y, [2, 3]) + y[:, :, :, ::1])
            return self.fc(F.adaptive_avg_pool2d(y.flip(1)[:, :, 1:], 1).flatten(1))

    torch.manual_seed(1)
    m = Net()
    x = torch.randn(2, 3, 8, 7)
    labels = np.array([1, 3])
    net = tilefuse.from_torch(m, x)
    loss, grads = Trainer(net, SGD(0.1), schedule="unfused").forward_backward(x.numpy(), labels)
    m64 = Net().double()
    m64.load_state_dict(m.state_dict())
    want_loss = F.cross_entropy(m64(x.double()), torch.from_numpy(labels))
    want_loss.backward()
    assert float(loss) == pytest.approx(float(want_loss), rel=1e-5)
    for k, p in m64.named_parameters():
        want = p.grad.numpy()
        np.testing.assert_allclose(grads[k].reshape(want.shape), want, rtol=1e-4, atol=1e-5 * np.abs(want).max(),
                                   err_msg=k)


@pytest.mark.parametrize("axis,indices,slices", [
    (1, [2, 1, 0], 1),                       # BGR -> RGB as exporters write x[:, [2, 1, 0]]
    (1, [7, 6, 5, 4, 3, 2, 1, 0, 8], 2),     # reversed, then one more
    (3, [0, 2, 4, 6], 1),                    # strided
    (2, [5, 3, 1, 1, 2], 2),                 # reversed by 2, then the repeated 1 starts a consecutive pair
    (3, [6, 0], 1),                          # two indices: one reversed slice of step 6
    (1, [[3, 2], [1, 0]], 1)])               # 2-D indices
def test_onnx_gather_of_evenly_spaced_indices_is_one_slice_each(axis, indices, slices):
    """An ONNX Gather with constant indices becomes one slice per run of evenly spaced indices (reversed and strided
    too), then a concat: the slice count, and the values against ONNX Runtime."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    idx = np.array(indices, np.int64)
    shape = [1, 9, 7, 8]
    out = shape[:axis] + list(idx.shape) + shape[axis + 1:]
    g = helper.make_graph([helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
                          [numpy_helper.from_array(idx, "i")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    net = tilefuse.from_onnx(model)
    assert [o.op for o in net.ops].count("slice") == slices, [(o.op, o.params) for o in net.ops]
    got = tilefuse.compile(net).run(x)
    assert got.shape == want.shape and np.array_equal(got, want)


class _Indexed(nn.Module):
    """Constant-index gathers as model code writes them, around a conv."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.conv = nn.Conv2d(3, 4, 3, 1, 1)

    def forward(self, x):
        if self.kind == "bgr":
            x = x[:, [2, 1, 0]]                                 # BGR -> RGB
        elif self.kind == "index_select":
            x = x.index_select(1, torch.tensor([1, 1, 0]))
        elif self.kind == "rows":
            x = x[:, :, [0, 2, 4, 6, 8, 3]]                     # strided rows, then one more
        elif self.kind == "tensor":
            x = x[:, :, :, torch.arange(x.size(3) - 1, -1, -1)]  # columns reversed by an arange
        y = self.conv(x)
        return y[:, [3, 0]] if self.kind == "out" else y


@pytest.mark.parametrize("kind,slices", [("bgr", 1), ("index_select", 2), ("rows", 2), ("tensor", 1), ("out", 1)])
def test_torch_constant_indexing_is_one_slice_per_run(kind, slices):
    """x[:, [2, 1, 0]], index_select and x[..., idx] with constant integer indices (aten.index.Tensor,
    aten.index_select) import as ONNX's Gather does (frontend/gather.py): one slice per run of evenly spaced
    indices, concatenated; the values are PyTorch's."""
    torch.manual_seed(0)
    m = _Indexed(kind).eval()
    x = torch.randn(2, 3, 10, 9)
    net = tilefuse.from_torch(m, x)
    assert [o.op for o in net.ops].count("slice") == slices, [(o.op, o.params) for o in net.ops]
    with torch.no_grad():
        want = m(x).numpy()
    got = tilefuse.compile(net, threads=2).run(x.numpy())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_torch_indexing_with_two_index_tensors_is_refused_by_name():
    """x[:, [1, 0], [2, 3]] (two index tensors: pairs of entries, not a gather along one dim) is refused naming
    the node and what tilefuse takes."""
    class Two(nn.Module):
        def forward(self, x):
            return x[:, [1, 0], [2, 3]] * 2

    with pytest.raises(tilefuse.errors.UnsupportedOpError, match=r"2 index tensors.*node 'index'.*x\[:, \[2, 1, 0\]\]"):
        tilefuse.from_torch(Two(), torch.randn(1, 3, 5, 5))
