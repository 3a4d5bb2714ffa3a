"""Circular padding: nn.Conv2d(padding_mode='circular') (weather and climate CNNs on a periodic globe, tiling
textures), F.pad(mode='circular') in 1-D / 2-D / 3-D with negative pads (PyTorch crops first, then wraps the
cropped axis), and ONNX Pad mode 'wrap' (against ONNX Runtime and ONNX's node case): Network.pad's slices and a
concat, exact. A circularly padded network trains as PyTorch; the stream schedule ends its streamed part at the
wrap (a concat along the rows or the columns does not stream: only channel concats do) and computes the rest whole,
correctly."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import TensorProto, helper

import tilefuse
from test_training_modern import _step_against_torch
from tilefuse.interpreter import evaluate
from tilefuse.ir import Network


class Pad(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return self.f(self.conv(x))


PADS = {
    "(1, 1, 1, 1)": lambda y: F.pad(y, (1, 1, 1, 1), mode="circular"),
    "a whole period (7, 7, 5, 5)": lambda y: F.pad(y, (7, 7, 5, 5), mode="circular"),
    "asymmetric (0, 3, 2, 1)": lambda y: F.pad(y, (0, 3, 2, 1), mode="circular"),
    "crop then wrap (-1, 3, 2, -2)": lambda y: F.pad(y, (-1, 3, 2, -2), mode="circular"),
    "crop then wrap (2, -3, -1, 0)": lambda y: F.pad(y, (2, -3, -1, 0), mode="circular"),
    "1-D (3, 2)": lambda y: F.pad(y.flatten(2), (3, 2), mode="circular"),
    "3-D (1, 1, 1, 1, 1, 1)": lambda y: F.pad(y.unsqueeze(1), (1, 1, 1, 1, 1, 1), mode="circular").sum(1),
}


@pytest.mark.parametrize("case", list(PADS))
def test_f_pad_circular_matches_torch(case):
    torch.manual_seed(0)
    m = Pad(PADS[case]).eval()
    x = torch.randn(2, 3, 5, 7)
    with torch.no_grad():
        want = m(x).numpy()
    net = tilefuse.from_torch(m, x)
    got = tilefuse.compile(net).run(x.numpy())
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, evaluate(net, x.numpy())[0])        # the composite is exact
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("k,stride,dilation", [(3, 1, 1), ((5, 3), 2, 1), (3, 1, 2), (1, 1, 1)])
def test_conv2d_padding_mode_circular_matches_torch(k, stride, dilation):
    torch.manual_seed(1)
    kk = (k, k) if isinstance(k, int) else k
    pad = tuple(dilation * (s - 1) // 2 for s in kk)
    m = nn.Sequential(nn.Conv2d(3, 8, kk, stride, pad, dilation, padding_mode="circular"), nn.ReLU(),
                      nn.Conv2d(8, 4, 3, padding=1, padding_mode="circular")).eval()
    x = torch.randn(2, 3, 9, 12)
    with torch.no_grad():
        want = m(x).numpy()
    got = tilefuse.compile(tilefuse.from_torch(m, x)).run(x.numpy())
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _wrap_model(shape, pads, opset=19):
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode="wrap")
    out = [d + pads[i] + pads[i + len(shape)] for i, d in enumerate(shape)]
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
                          [onnx.numpy_helper.from_array(np.array(pads, np.int64), "pads")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("pads", [[0, 0, 1, 2, 0, 0, 2, 1], [0, 0, 5, 7, 0, 0, 5, 7], [0, 1, 0, 3, 0, 0, 2, 0],
                                  [0, 0, 6, 9, 0, 0, 2, 8], [0, 0, -1, 3, 0, 0, 2, -2]])
def test_onnx_pad_wrap_matches_onnxruntime(pads):
    shape = (2, 3, 5, 7)
    model = _wrap_model(shape, pads)
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    if min(pads) >= 0:      # ONNX's reference: NumPy's wrap (a pad longer than the axis wraps again)
        np.testing.assert_array_equal(np.pad(x, [(pads[i], pads[i + 4]) for i in range(4)], mode="wrap"), want)
    got = tilefuse.compile(tilefuse.from_onnx(model)).run(x)
    np.testing.assert_array_equal(got, want)


class Periodic(nn.Module):
    """A small classifier on a periodic domain (longitude wraps): circular convs throughout."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 6, 3, padding=1, padding_mode="circular")
        self.c2 = nn.Conv2d(6, 8, 3, stride=2, padding=1, padding_mode="circular")
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        y = torch.relu(self.c2(y))
        return self.fc(y.mean((2, 3)))


def test_a_circular_network_trains_as_torch():
    torch.manual_seed(2)
    _step_against_torch(Periodic(), torch.randn(4, 3, 8, 10), torch.tensor([0, 4, 2, 1]))


def test_the_stream_schedule_ends_at_a_wrap_and_computes_the_rest_whole():
    rng = np.random.default_rng(3)
    net = Network("wrap")
    x = net.input("x", (1, 4, 12, 10))
    w = rng.standard_normal((4, 4, 3, 3)).astype(np.float32) * 0.3
    y = net.pad(x, (0, 0, 0, 0, 0, 0, 1, 1), mode="circular", name="wrap_w")     # columns only
    y = net.relu(net.conv2d(y, w, padding=(1, 0), name="c1"))
    y = net.pad(y, (0, 0, 0, 0, 1, 1, 1, 1), mode="circular", name="wrap_hw")     # rows: needs the bottom
    y = net.conv2d(y, w, name="c2")
    net.output(y)
    xv = rng.standard_normal((1, 4, 12, 10)).astype(np.float32)
    want = evaluate(net, xv)[0]
    s = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": 2})
    got = s.run(xv)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tilefuse.compile(net).run(xv), want, rtol=1e-5, atol=1e-5)
    assert [e[:2] for e in s.schedule.ends] == [("wrap_w", "concat")], s.schedule.ends
