"""atan2, the IR's binary op (torch.atan2 / arctan2): the angle of optical flow, of a gradient field, of a complex
feature's (re, im) pair, as model code computes it.

The kernel (libm's atan2f per value, every broadcast form: equal shapes, a per-channel operand in NCHW and
NCHW16c, anything else through NumPy) and the reference (np.arctan2) against PyTorch with NaN, infinities and
signed zeros (every quadrant's edge); the gradient against autograd (tests/test_training_modern.py's binary
backward test covers every kind); a flow-angle network through from_torch, the stream schedule and the Trainer."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import tilefuse
from test_training_modern import _step_against_torch
from tilefuse.kernels import broadcast as B
from tilefuse.kernels import reference as ref
from tilefuse.kernels.conv import from_nchwc, to_nchwc

RNG = np.random.default_rng(12)
EDGES = np.float32([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 1e30, -1e30, 2.5])


def _specials(shape):
    x = RNG.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    idx = RNG.choice(flat.size, size=min(EDGES.size, flat.size), replace=False)
    flat[idx] = EDGES[:idx.size]
    return x


@pytest.mark.parametrize("sa,sb", [((12, 12), (12, 12)), ((2, 5, 4, 3), (2, 5, 4, 3)), ((2, 5, 4, 3), (1, 5, 1, 1)),
                                   ((2, 5, 1, 1), (2, 5, 4, 3)), ((2, 5, 4, 3), (1, 1, 4, 3)), ((7,), (3, 1))])
def test_kernel_reference_and_torch_agree(sa, sb):
    if sa == (12, 12):          # every pair of edge values: the quadrants' edges, signed zeros, infinities
        a, b = np.meshgrid(EDGES, EDGES, indexing="ij")
        a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    else:
        a, b = _specials(sa), _specials(sb)
    want = torch.atan2(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    out = np.empty(np.broadcast_shapes(a.shape, b.shape), np.float32)
    B.binary("atan2", out, a, b, threads=2)
    for got in (ref.binary("atan2", a, b), out):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        fin = ~np.isnan(want)
        np.testing.assert_allclose(got[fin], want[fin], rtol=2e-7, atol=0)
        assert np.array_equal(np.signbit(got[fin & (want == 0)]), np.signbit(want[fin & (want == 0)]))


@pytest.mark.parametrize("swap", [False, True])
def test_blocked_per_channel_operand_with_a_fused_activation(swap):
    c = 20
    x = RNG.standard_normal((2, c, 3, 5)).astype(np.float32)
    s = RNG.standard_normal((1, c, 1, 1)).astype(np.float32)
    xb = to_nchwc(x)
    o = np.full_like(xb, 7.0)
    B.binary("atan2", o, *((s, xb) if swap else (xb, s)), act=("sin", 0.0, 0.0), layout="nchwc", channels=c)
    want = np.sin(np.arctan2(*((s.astype(np.float64), x.astype(np.float64)) if swap else
                               (x.astype(np.float64), s.astype(np.float64)))))
    np.testing.assert_allclose(from_nchwc(o, c), want, rtol=1e-6, atol=1e-7)
    assert not o[:, -1, :, :, c % 16:].any()          # the padded lanes stay 0


class FlowAngle(nn.Module):
    """Features -> a flow (u, v) -> its angle and magnitude -> features: RAFT-style visualisation-as-input code."""

    def __init__(self, classes=0):
        super().__init__()
        self.flow = nn.Conv2d(3, 2, 3, padding=1)
        self.head = nn.Conv2d(3, 6, 3, padding=1)
        self.fc = nn.Linear(6, classes) if classes else None

    def forward(self, x):
        f = self.flow(x)
        u, v = f[:, :1], f[:, 1:]
        ang = torch.atan2(v, u)
        mag = torch.sqrt(u * u + v * v)
        y = torch.relu(self.head(torch.cat([ang, mag, torch.arctan2(x[:, :1], x[:, 1:2])], 1)))
        return self.fc(y.mean((2, 3))) if self.fc is not None else y


def test_flow_angle_network_imports_streams_and_trains():
    torch.manual_seed(0)
    m, x = FlowAngle().eval(), torch.randn(2, 3, 10, 12)
    net = tilefuse.from_torch(m, x)
    assert [op.op for op in net.ops].count("atan2") == 2
    with torch.no_grad():
        want = m(x).numpy()
    for threads in (1, 3):
        np.testing.assert_allclose(tilefuse.compile(net, threads=threads).run(x.numpy()), want, rtol=1e-5,
                                   atol=2e-6)
    s = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": 2})
    assert not s.schedule.ends and not s.schedule.tail       # row-local: all of it streams
    np.testing.assert_allclose(s.run(x.numpy()), want, rtol=1e-5, atol=2e-6)
    torch.manual_seed(1)
    _step_against_torch(FlowAngle(classes=4), torch.randn(3, 3, 8, 9), torch.tensor([0, 3, 1]))
