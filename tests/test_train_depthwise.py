"""The depthwise training kernel (kernels/train_depthwise.py) against PyTorch autograd: forward, input,
weight and bias gradients; strides 1 and 2, dilation, asymmetric and zero padding, odd sizes, kernels 1-7;
bitwise equal on 1, 2, 3 and 5 threads. Tolerance: float32, 1e-5 of the largest value (the forward and input
gradient sum kh*kw float32 products; the weight gradient sums N*Ho*Wo products in float64)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tilefuse.kernels import cnhw
from tilefuse.kernels import train_conv as tc
from tilefuse.kernels import train_depthwise as tdw
from tilefuse.kernels.threads import using

CASES = [  # N, C, H, W, k, stride, (top, bottom, left, right), dilation
    (2, 5, 9, 11, 3, 1, (1, 1, 1, 1), 1),
    (3, 4, 12, 7, 3, 2, (1, 1, 1, 1), 1),
    (2, 3, 13, 13, 5, 2, (2, 2, 2, 2), 1),
    (1, 6, 8, 10, 7, 1, (3, 3, 3, 3), 1),
    (2, 4, 11, 9, 3, 1, (2, 2, 2, 2), 2),
    (2, 3, 10, 9, 3, 2, (0, 1, 0, 1), 1),          # TF "same" for stride 2: pad bottom / right only
    (2, 3, 7, 6, 3, 1, (0, 0, 0, 0), 1),
    (4, 2, 5, 5, 1, 1, (0, 0, 0, 0), 1),
    (2, 17, 15, 33, 3, 1, (1, 1, 1, 1), 1),        # rows longer than a vector
]


def _torch(x, w, b, stride, pad, dil):
    t, bt, left, r = pad
    xp = F.pad(x, (left, r, t, bt))
    return F.conv2d(xp, w, b, stride, 0, dil, groups=x.shape[1])


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n,c,h,w,k,s,pad,d", CASES)
def test_depthwise_training_matches_autograd(n, c, h, w, k, s, pad, d, bias):
    r = np.random.default_rng(h * w + k)
    x = r.standard_normal((n, c, h, w)).astype(np.float32)
    wt = r.standard_normal((c, 1, k, k)).astype(np.float32)
    b = r.standard_normal(c).astype(np.float32) if bias else None
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(wt).requires_grad_()
    tb = torch.from_numpy(b).requires_grad_() if bias else None
    y_ref = _torch(tx, tw, tb, s, pad, d)
    dy = r.standard_normal(tuple(y_ref.shape)).astype(np.float32)
    y_ref.backward(torch.from_numpy(dy))
    g = tc.ConvGeom(x.shape, wt.shape, (s, s), pad, (d, d), c)
    assert tdw.is_depthwise(x.shape, wt.shape, c)
    with using(2):
        y = tdw.depthwise_forward_cnhw(cnhw.to_cnhw(x), wt, g, b)
        dwt, db, dx = tdw.depthwise_backward_cnhw(cnhw.to_cnhw(dy), cnhw.to_cnhw(x), wt, g, True, bias)

    def close(got, want):
        want = want.detach().numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    close(cnhw.to_nchw(y), y_ref)
    close(cnhw.to_nchw(dx), tx.grad)
    close(dwt, tw.grad)
    if bias:
        close(db, tb.grad)
    else:
        assert db is None


def test_depthwise_training_is_bitwise_equal_across_threads():
    r = np.random.default_rng(7)
    x = cnhw.to_cnhw(r.standard_normal((3, 24, 14, 14)).astype(np.float32))
    wt = r.standard_normal((24, 1, 3, 3)).astype(np.float32)
    g = tc.ConvGeom((3, 24, 14, 14), wt.shape, (2, 2), (1, 1, 1, 1), (1, 1), 24)
    dy = r.standard_normal((24, 3, g.ho, g.wo)).astype(np.float32)
    out = []
    for t in (1, 2, 3, 5):
        with using(t):
            y = tdw.depthwise_forward_cnhw(x, wt, g)
            out.append((y,) + tdw.depthwise_backward_cnhw(dy, x, wt, g, True, True))
    for o in out[1:]:
        for a, b in zip(out[0], o):
            np.testing.assert_array_equal(a, b)


def test_grouped_but_not_depthwise_is_not_taken():
    assert not tdw.is_depthwise((2, 8, 5, 5), (8, 2, 3, 3), 4)          # 2 channels a group
    assert not tdw.is_depthwise((2, 8, 5, 5), (16, 1, 3, 3), 8)         # channel multiplier 2
    assert not tdw.is_depthwise((2, 8, 5, 5), (8, 8, 3, 3), 1)
