"""The small-group training conv (kernels/train_grouped.py) against PyTorch autograd: forward, input, weight and
bias gradients; 1 to 16 channels a group in and out (RegNet's 8, a channel multiplier of 2, unequal widths),
strides 1 to 3, dilation, asymmetric and zero padding, odd sizes, kernels 1x1 to 5x5 and non-square; image blocks
that split the batch unevenly; bitwise equal on 1, 2, 3, 5, 8 and 16 threads. Tolerance: float32, 1e-5 of the
largest value (the forward and input gradient sum cg*kh*kw / og*kh*kw float32 products; the weight gradient sums
N*Ho*Wo products in float32 per chunk of positions, then float64). And the squeeze-excitation FCs (1x1 convs on
1x1 maps), which train as linear layers (kernels/train_direct.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tilefuse.kernels import cnhw
from tilefuse.kernels import train_conv as tc
from tilefuse.kernels import train_grouped as tg
from tilefuse.kernels.threads import using

CASES = [  # N, C, O, groups, H, W, (kh, kw), stride, (top, bottom, left, right), dilation
    (2, 16, 16, 2, 9, 11, (3, 3), 1, (1, 1, 1, 1), 1),          # RegNet's group width 8
    (3, 24, 24, 3, 12, 7, (3, 3), 2, (1, 1, 1, 1), 1),
    (2, 6, 12, 6, 13, 13, (5, 5), 2, (2, 2, 2, 2), 1),          # a depthwise conv with channel multiplier 2
    (2, 12, 8, 4, 11, 9, (3, 3), 1, (2, 2, 2, 2), 2),           # 3 in, 2 out a group; dilation 2
    (2, 8, 8, 2, 10, 9, (3, 3), 2, (0, 1, 0, 1), 1),            # TF "same" for stride 2
    (1, 10, 15, 5, 8, 10, (3, 5), 1, (1, 1, 2, 2), 1),          # non-square kernel
    (2, 9, 6, 3, 7, 6, (3, 3), 1, (0, 0, 0, 0), 1),             # no padding
    (2, 32, 32, 2, 10, 13, (3, 3), 3, (1, 0, 2, 1), 1),         # 16 a group, stride 3, asymmetric padding
    (3, 8, 8, 2, 5, 5, (1, 1), 2, (0, 0, 0, 0), 1),             # strided 1x1
    (2, 16, 16, 4, 4, 4, (3, 3), 1, (1, 1, 1, 1), 1),           # RegNet's 4x4 maps
    (2, 4, 4, 2, 40, 37, (3, 3), 2, (1, 1, 1, 1), 3),           # > 4096 positions a task: the float64 flush
]


def _torch(x, w, b, groups, stride, pad, dil):
    t, bt, left, r = pad
    return F.conv2d(F.pad(x, (left, r, t, bt)), w, b, stride, 0, dil, groups=groups)


def _close(got, want):
    want = want.detach().numpy()
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _run(x, wt, b, dy, g, threads):
    with using(threads):
        y = tg.grouped_forward_cnhw(cnhw.to_cnhw(x), wt, g, b)
        dwt, db, dx = tg.grouped_backward_cnhw(cnhw.to_cnhw(dy), cnhw.to_cnhw(x), wt, g, True, b is not None)
    return cnhw.to_nchw(y), dwt, db, cnhw.to_nchw(dx)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n,c,o,groups,h,w,k,s,pad,d", CASES)
def test_grouped_training_matches_autograd(n, c, o, groups, h, w, k, s, pad, d, bias):
    r = np.random.default_rng(h * w + k[0] + c)
    x = r.standard_normal((n, c, h, w)).astype(np.float32)
    wt = r.standard_normal((o, c // groups) + k).astype(np.float32)
    b = r.standard_normal(o).astype(np.float32) if bias else None
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(wt).requires_grad_()
    tb = torch.from_numpy(b).requires_grad_() if bias else None
    y_ref = _torch(tx, tw, tb, groups, s, pad, d)
    dy = r.standard_normal(tuple(y_ref.shape)).astype(np.float32)
    y_ref.backward(torch.from_numpy(dy))
    g = tc.ConvGeom(x.shape, wt.shape, (s, s), pad, (d, d), groups)
    assert tg.is_small_grouped(x.shape, wt.shape, groups)
    y, dwt, db, dx = _run(x, wt, b, dy, g, 2)

    _close(y, y_ref)
    _close(dx, tx.grad)
    _close(dwt, tw.grad)
    if bias:
        _close(db, tb.grad)
    else:
        assert db is None


def test_image_blocks_split_the_batch_unevenly(monkeypatch):
    """7 images in blocks of 2 (the last one short): the same results as one block of all 7."""
    r = np.random.default_rng(3)
    x = r.standard_normal((7, 16, 9, 8)).astype(np.float32)
    wt = r.standard_normal((16, 8, 3, 3)).astype(np.float32)
    b = r.standard_normal(16).astype(np.float32)
    g = tc.ConvGeom(x.shape, wt.shape, (2, 2), (1, 1, 1, 1), (1, 1), 2)
    dy = r.standard_normal((7, 16, g.ho, g.wo)).astype(np.float32)
    tg.plan.cache_clear()
    whole = _run(x, wt, b, dy, g, 2)
    assert tg.plan(g.key).nblk == 1
    p = tg.plan(g.key)
    monkeypatch.setattr(tg, "BLOCK_BYTES", 2 * 8 * p.P * p.Hq * p.Wq * 4)
    tg.plan.cache_clear()
    assert tg.plan(g.key).nbk == 2 and tg.plan(g.key).nblk == 4
    blocks = _run(x, wt, b, dy, g, 2)
    tg.plan.cache_clear()
    np.testing.assert_array_equal(whole[0], blocks[0])          # forward and dx: per position, the same sums
    np.testing.assert_array_equal(whole[3], blocks[3])
    for a, e in zip(whole[1:3], blocks[1:3]):                    # dw, db: other partial sums, within rounding
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5 * np.abs(a).max())


def test_grouped_training_is_bitwise_equal_across_threads():
    r = np.random.default_rng(7)
    x = r.standard_normal((5, 24, 14, 14)).astype(np.float32)
    wt = r.standard_normal((24, 8, 3, 3)).astype(np.float32)
    g = tc.ConvGeom(x.shape, wt.shape, (2, 2), (1, 1, 1, 1), (1, 1), 3)
    dy = r.standard_normal((5, 24, g.ho, g.wo)).astype(np.float32)
    b = r.standard_normal(24).astype(np.float32)
    out = [_run(x, wt, b, dy, g, t) for t in (1, 2, 3, 5, 8, 16)]
    for o in out[1:]:
        for a, e in zip(out[0], o):
            np.testing.assert_array_equal(a, e)


def test_which_grouped_convs_take_this_path():
    assert tg.is_small_grouped((2, 16, 5, 5), (16, 8, 3, 3), 2)
    assert tg.is_small_grouped((2, 8, 5, 5), (16, 1, 3, 3), 8)            # channel multiplier 2
    assert not tg.is_small_grouped((2, 8, 5, 5), (8, 1, 3, 3), 8)         # depthwise: train_depthwise.py
    assert not tg.is_small_grouped((2, 8, 5, 5), (8, 8, 3, 3), 1)         # one group: GEMMs
    assert not tg.is_small_grouped((2, 64, 5, 5), (64, 32, 3, 3), 2)      # 32 a group: GEMMs


@pytest.mark.parametrize("n,c,o,bias", [(32, 104, 26, True), (3, 7, 5, False), (70, 16, 40, True)])
def test_squeeze_excitation_fcs_train_as_linear_layers(n, c, o, bias):
    """1x1 convs on 1x1 maps (the squeeze-excitation FCs) run as linear layers (kernels/train_direct.py),
    against PyTorch autograd."""
    from tilefuse.kernels import train_direct as td
    r = np.random.default_rng(n + c)
    x = r.standard_normal((n, c, 1, 1)).astype(np.float32)
    wt = r.standard_normal((o, c, 1, 1)).astype(np.float32)
    b = r.standard_normal(o).astype(np.float32) if bias else None
    params = {"groups": 1, "stride": (1, 1), "padding": (0, 0, 0, 0)}
    assert td.direct_conv(x.shape, wt.shape, params)[0] is td.fc_forward_cnhw
    assert td.direct_conv((n, c, 2, 1), wt.shape, params) is None                  # a map: train_conv's GEMMs
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(wt).requires_grad_()
    tb = torch.from_numpy(b).requires_grad_() if bias else None
    y_ref = F.conv2d(tx, tw, tb)
    dy = r.standard_normal(tuple(y_ref.shape)).astype(np.float32)
    y_ref.backward(torch.from_numpy(dy))
    g = tc.ConvGeom(x.shape, wt.shape, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    with using(2):
        y = td.fc_forward_cnhw(cnhw.to_cnhw(x), wt, g, b)
        dwt, db, dx = td.fc_backward_cnhw(cnhw.to_cnhw(dy), cnhw.to_cnhw(x), wt, g, True, bias)

    _close(cnhw.to_nchw(y), y_ref)
    _close(cnhw.to_nchw(dx), tx.grad)
    _close(dwt, tw.grad)
    if bias:
        _close(db, tb.grad)
    else:
        assert db is None
