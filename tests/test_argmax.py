"""argmax / argmin: the indices a segmentation or classification model returns (`model(x).argmax(1)`,
`logits.max(1)`'s indices, ONNX ArgMax / ArgMin), computed as exact floats and returned as int64.

The reference (a mask of the positions equal to the extreme, its first True) against torch.argmax / argmin
(ties: the first; NaN: the extreme) and against ONNX's select_last_index (the last tie); the kernel
(np.argmax / np.argmin on the reversed axis for select_last) bitwise against the reference; from_torch of a
segmentation head's argmax, max(dim)'s values and indices, argmin with keepdim, the indices converted to float and
computed with, and used to read a table (take); both exporters against ONNX Runtime; the integer outputs of a
saved package (meta["integer_outputs"], validated on load), and a run that refuses, naming the output, to return a
declared integer output holding a non-integer."""
from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx_export import EXPORTERS, export, ort_run

import tilefuse
from tilefuse.compiler.package import validate_package
from tilefuse.errors import GraphError, PackageError, UnsupportedOpError
from tilefuse.kernels import reference as ref
from tilefuse.kernels.reduce import argmax as argmax_kernel

SHAPES = [(2, 5, 6, 7), (1, 1, 1, 1), (3, 17), (4, 1, 9), (2, 3, 1, 40)]


def _data(shape, seed=0, ties=False, nan=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    if ties:
        x = np.round(x * 2) / 2                  # many equal values along every axis
    if nan:
        x.reshape(-1)[::7] = np.nan
    return x


@pytest.mark.parametrize("shape,ties,nan", [(s, t, n) for s in SHAPES for t, n in ((False, False), (True, False),
                                                                                  (True, True))])
def test_reference_matches_torch(shape, ties, nan):
    x = _data(shape, ties=ties, nan=nan)
    t = torch.from_numpy(x)
    for axis, keep in itertools.product(range(-len(shape), len(shape)), (False, True)):
        for largest, fn in ((True, torch.argmax), (False, torch.argmin)):
            want = fn(t, dim=axis, keepdim=keep).numpy()
            got = ref.argmax(x, axis % len(shape), keep, largest)
            assert got.dtype == np.float32 and got.shape == want.shape
            np.testing.assert_array_equal(got, want, err_msg=f"axis {axis} keepdim {keep} largest {largest}")


def test_select_last_matches_onnx_reference():
    from onnx import helper, TensorProto
    from onnx.reference import ReferenceEvaluator
    x = _data((3, 6, 5), ties=True)
    for op, axis in itertools.product(("ArgMax", "ArgMin"), (0, 1, 2)):
        node = helper.make_node(op, ["x"], ["y"], axis=axis, keepdims=0, select_last_index=1)
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
        want = ReferenceEvaluator(helper.make_model(g)).run(None, {"x": x})[0]
        np.testing.assert_array_equal(ref.argmax(x, axis, False, op == "ArgMax", True), want)


@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_is_the_reference_bitwise(shape):
    for ties, nan in ((False, False), (True, True)):
        x = _data(shape, 1, ties, nan)
        for axis, keep, largest, last in itertools.product(range(len(shape)), (False, True), (True, False),
                                                           (False, True)):
            want = ref.argmax(x, axis, keep, largest, last)
            out = np.full(want.shape, -1.0, np.float32)
            argmax_kernel(out, x, axis=axis, keepdim=keep, largest=largest, select_last=last)
            np.testing.assert_array_equal(out, want)


class SegHead(nn.Module):
    """A segmentation model's inference wrapper: logits, then the class per pixel and its confidence."""

    def __init__(self, classes=6):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, classes, 1))

    def forward(self, x):
        logits = F.interpolate(self.body(x), size=x.shape[-2:], mode="bilinear", align_corners=False)
        prob = logits.softmax(dim=1)
        conf, pred = prob.max(1)
        return pred, conf, torch.argmin(logits, dim=1, keepdim=True)


class IndexUses(nn.Module):
    """The indices used: converted to float and computed with, compared, and used to read a table."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 5)
        self.register_buffer("table", torch.linspace(-1.0, 1.0, 5))

    def forward(self, x):
        logits = self.fc(x.mean((2, 3)))                      # (N, 5)
        cls = logits.argmax(dim=-1)                           # (N,) int64
        scaled = cls.float() / 4.0                            # arithmetic after a conversion
        hit = (cls == 2).float()
        return scaled + hit + self.table[cls], cls


@pytest.mark.parametrize("make,shape", [(SegHead, (2, 3, 13, 11)), (IndexUses, (3, 12, 4, 4))],
                         ids=["seg-head", "index-uses"])
def test_from_torch_returns_the_indices_as_int64(make, shape):
    torch.manual_seed(0)
    m = make().eval()
    x = torch.randn(shape)
    with torch.no_grad():
        want = m(x)
    net = tilefuse.from_torch(m, x)
    assert "argmax" in {o.op for o in net.ops}
    for threads in (1, 3):
        got = tilefuse.compile(net, threads=threads).run(x.numpy())
        for g, w in zip(got, want):
            w = w.numpy()
            assert g.dtype == w.dtype and g.shape == w.shape
            if w.dtype == np.int64:
                np.testing.assert_array_equal(g, w)
            else:
                np.testing.assert_allclose(g, w, rtol=0, atol=1e-5 * np.abs(w).max())
    ev = tilefuse.evaluate(net, [x.numpy()])
    assert [e.dtype for e in ev] == [w.numpy().dtype for w in want]


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_seg_head_through_onnx_matches_onnx_runtime(exporter):
    torch.manual_seed(1)
    m = SegHead().eval()
    x = torch.randn(2, 3, 9, 10).numpy()
    blob = export(m, x, exporter)
    want = ort_run(blob, x, all_outputs=True)
    got = tilefuse.compile(tilefuse.from_onnx(blob)).run(x)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if w.dtype == np.int64:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-5)


def test_integer_outputs_survive_a_saved_package_and_hostile_meta_is_refused(tmp_path):
    m = SegHead().eval()
    x = torch.randn(1, 3, 8, 8)
    c = tilefuse.compile(tilefuse.from_torch(m, x))
    c.save(tmp_path / "seg.tfpkg")
    pkg = tilefuse.load_package(tmp_path / "seg.tfpkg")
    assert set(pkg.meta["integer_outputs"].values()) == {np.dtype(np.int64).str}
    got = tilefuse.Session(pkg).run(x.numpy())
    np.testing.assert_array_equal(got[0], m(x)[0].numpy())
    out = pkg.outputs[0].name
    for bad, msg in [({out: "<f4"}, rf"gives output '{out}' the dtype '<f4'; expected an integer dtype"),
                     ({"nope": "<i8"}, r"expected \{output name: integer dtype\} naming float outputs"),
                     ([out], r"meta integer_outputs \["),
                     ({out: "int128"}, r"expected an integer dtype")]:
        p = copy.deepcopy(pkg)
        p.meta["integer_outputs"] = bad
        with pytest.raises(PackageError, match=msg):
            validate_package(p, "hostile")


def test_a_declared_integer_output_holding_a_fraction_fails_the_run_by_name():
    net = tilefuse.Network("n")
    x = net.input("x", (2, 3))
    y = net.relu(x, name="r")
    net.output(y, integer=np.int64)
    a = np.array([[1.0, 2.0, 3.0], [0.0, 4.0, 5.5]], np.float32)
    with pytest.raises(RuntimeError, match=r"output 'r' is declared int64, but holds 5.5 at \(1, 2\); expected "
                                           r"integers"):
        tilefuse.compile(net).run(a)
    with pytest.raises(RuntimeError, match=r"output 'r' is declared int64"):
        tilefuse.evaluate(net, [a])
    assert tilefuse.compile(net).run(np.floor(a)).dtype == np.int64


class Flat(nn.Module):
    def forward(self, x):
        y = x * 1.5
        return y.argmax(), y.argmin(keepdim=True), y[0, 0].argmax(0)


def test_argmax_over_every_value_is_a_0d_index():
    x = torch.randn(2, 3, 5)
    x[1, 2, 3] = x.max() + 1
    net = tilefuse.from_torch(Flat(), x)
    assert [o.shape for o in net.outputs] == [(), (1, 1, 1), ()]
    got = tilefuse.compile(net).run(x.numpy())
    for g, w in zip(got, Flat()(x)):
        assert g.dtype == np.int64 and g.shape == tuple(w.shape)
        np.testing.assert_array_equal(g, w.numpy())


def test_what_is_refused_is_refused_by_name():
    net = tilefuse.Network("n")
    with pytest.raises(GraphError, match=r"axis 3 is out of range for rank 2"):
        net.argmax(net.input("y", (5, 2)), 3)


def test_an_integer_input_given_fractions_is_refused_by_name():
    """Floats for an input the model declares integer are taken where they hold integers (the one-array call too),
    refused naming the value elsewhere; an integer input passed through is returned in its dtype."""
    net = tilefuse.Network("n")
    t = net.input("t", (4,), integer=np.int64)
    net.output(net.reshape(t, (2, 2), name="r"), integer=np.int64)
    sess = tilefuse.compile(net)
    for a in (np.array([3, 1, -2, 7]), np.float32([3, 1, -2, 7])):
        got = sess.run(a)
        assert got.dtype == np.int64 and got.tolist() == [[3, 1], [-2, 7]]
    with pytest.raises(GraphError, match=r"t: input has the value 1.5 at \(1,\); the model takes it as int64: "
                                         r"expected integers"):
        sess.run(np.float32([3, 1.5, -2, 7]))
    with pytest.raises(GraphError, match=r"input has the value nan at \(0,\)"):
        tilefuse.evaluate(net, [np.float32([np.nan, 1, 2, 3])])


def test_unread_indices_compute_no_argmax_and_train():
    """CBAM's `torch.max(x, 1, keepdim=True)[0]` reads only the values: no argmax op (it would cost a pass and has
    no backward), and the network trains."""
    from tilefuse.training import SGD, Trainer

    class SpatialMax(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.fc = nn.Linear(1, 3)

        def forward(self, x):
            y = torch.max(self.conv(x), 1, keepdim=True)[0] + torch.min(x, 1, keepdim=True)[0]
            return self.fc(y.mean((2, 3)))

    net = tilefuse.from_torch(SpatialMax(), torch.randn(2, 3, 5, 5))
    assert "argmax" not in {o.op for o in net.ops}
    loss, _ = Trainer(net, SGD(lr=0.1)).forward_backward(np.random.default_rng(0).standard_normal(
        (2, 3, 5, 5)).astype(np.float32), np.array([0, 2]))
    assert np.isfinite(loss)
