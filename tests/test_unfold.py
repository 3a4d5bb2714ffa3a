"""F.unfold (im2col) and F.fold (col2im) as real model code uses them: RAFT's convex flow upsampling
(`F.unfold(8 * flow, [3, 3], padding=1)` viewed as (N, 2, 9, 1, 1, H, W), times a softmaxed mask, summed, permuted),
LIIF's feature unfolding (`F.unfold(feat, 3, padding=1).view(N, C * 9, H, W)`), non-overlapping patches (stride =
kernel), FuseFormer's soft split / soft composition (nn.Unfold, a linear over each patch, nn.Fold of the
overlapping patches).

`Network.unfold` and `Network.fold` are exact (pads, strided slices, concat, reshape; fold adds its canvases in
PyTorch's order): from_torch equals F.unfold / F.fold bitwise for kernels, dilations, paddings and strides on odd
shapes, compiled on 1 and 3 threads and in the reference evaluator; the models through from_torch and both ONNX
exporters (ONNX Col2Im) against PyTorch and ONNX Runtime; unfolding and folding networks train as PyTorch does
(the pad / slice / concat / add / reshape backward)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx_export import EXPORTERS, assert_close_to_max, export, ort_run

import tilefuse
from tilefuse.errors import GraphError, UnsupportedOpError

# (x shape, F.unfold keywords)
GEOMETRIES = [((2, 5, 9, 8), dict(kernel_size=3, padding=1)),
              ((1, 3, 7, 11), dict(kernel_size=(2, 3), dilation=(2, 1), padding=(1, 0), stride=(2, 3))),
              ((2, 4, 6, 6), dict(kernel_size=1)),
              ((1, 2, 8, 12), dict(kernel_size=4, stride=4)),
              ((3, 1, 5, 5), dict(kernel_size=5)),
              ((1, 2, 1, 9), dict(kernel_size=(1, 3), padding=(0, 2), dilation=2))]


class Unfold(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, x):
        return F.unfold(x, **self.kw)


class Fold(nn.Module):
    def __init__(self, size, **kw):
        super().__init__()
        self.size, self.kw = size, kw

    def forward(self, cols):
        return F.fold(cols, self.size, **self.kw)


FOLD_GEOMETRIES = GEOMETRIES + [((1, 2, 9, 9), dict(kernel_size=3, stride=2, padding=1))]


@pytest.mark.parametrize("shape,kw", FOLD_GEOMETRIES, ids=[str(i) for i in range(len(FOLD_GEOMETRIES))])
def test_fold_is_f_fold_bitwise(shape, kw):
    cols = F.unfold(torch.randn(shape), **kw) * 3.0      # overlapping windows: sums
    m = Fold(shape[-2:], **kw)
    want = m(cols).numpy()
    net = tilefuse.from_torch(m, cols)
    for threads in (1, 3):
        np.testing.assert_array_equal(tilefuse.compile(net, threads=threads).run(cols.numpy()), want)
    np.testing.assert_array_equal(tilefuse.evaluate(net, [cols.numpy()])[0], want)


@pytest.mark.parametrize("shape,kw", GEOMETRIES, ids=[str(i) for i in range(len(GEOMETRIES))])
def test_unfold_is_f_unfold_bitwise(shape, kw):
    x = torch.randn(shape)
    m = Unfold(**kw)
    want = m(x).numpy()
    net = tilefuse.from_torch(m, x)
    for threads in (1, 3):
        np.testing.assert_array_equal(tilefuse.compile(net, threads=threads).run(x.numpy()), want)
    np.testing.assert_array_equal(tilefuse.evaluate(net, [x.numpy()])[0], want)


class ConvexUpsample(nn.Module):
    """RAFT's upsample_flow (raft.py), with the flow and the mask from 1x1 / 3x3 convs of the features."""

    def __init__(self, c=8):
        super().__init__()
        self.mask = nn.Conv2d(c, 64 * 9, 1)
        self.flow = nn.Conv2d(c, 2, 3, padding=1)

    def forward(self, x):
        flow, mask = self.flow(x), .25 * self.mask(x)
        N, _, H, W = flow.shape
        mask = mask.view(N, 1, 9, 8, 8, H, W)
        mask = torch.softmax(mask, dim=2)
        up_flow = F.unfold(8 * flow, [3, 3], padding=1)
        up_flow = up_flow.view(N, 2, 9, 1, 1, H, W)
        up_flow = torch.sum(mask * up_flow, dim=2)
        up_flow = up_flow.permute(0, 1, 4, 2, 5, 3)
        return up_flow.reshape(N, 2, 8 * H, 8 * W)


class LIIFUnfold(nn.Module):
    """LIIF's feat_unfold, then a 1x1 conv over the 9 C neighbours and a classifier (for the training step)."""

    def __init__(self, head=False):
        super().__init__()
        self.enc = nn.Conv2d(3, 6, 3, padding=1)
        self.mix = nn.Conv2d(54, 4, 1)
        self.fc = nn.Linear(4, 5) if head else None

    def forward(self, x):
        feat = self.enc(x)
        feat = F.unfold(feat, 3, padding=1).view(feat.shape[0], feat.shape[1] * 9, feat.shape[2], feat.shape[3])
        y = self.mix(feat)
        return self.fc(torch.relu(y).mean((2, 3))) if self.fc is not None else y


class SoftSplitComp(nn.Module):
    """FuseFormer's SoftSplit / SoftComp: overlapping 3x3 patches (stride 2) to tokens, a linear per token, back to
    an image by nn.Fold (the overlaps summed), and a head (for the training step)."""

    def __init__(self, c=3, hidden=10, head=False):
        super().__init__()
        self.split = nn.Unfold(kernel_size=3, stride=2, padding=1)
        self.embed = nn.Linear(c * 9, hidden)
        self.back = nn.Linear(hidden, 4 * 9)
        self.comp = nn.Fold(output_size=(9, 11), kernel_size=3, stride=2, padding=1)
        self.fc = nn.Linear(4, 5) if head else None

    def forward(self, x):
        t = self.split(x).permute(0, 2, 1)                     # (N, L, C 9)
        t = self.back(F.gelu(self.embed(t))).permute(0, 2, 1)  # (N, 4 9, L)
        y = self.comp(t)                                       # (N, 4, 9, 11)
        return self.fc(torch.tanh(y).mean((2, 3))) if self.fc is not None else y


@pytest.mark.parametrize("make,shape", [(ConvexUpsample, (2, 8, 5, 6)), (LIIFUnfold, (1, 3, 7, 9)),
                                        (SoftSplitComp, (2, 3, 9, 11))],
                         ids=["raft-upsample", "liif", "soft-split-comp"])
def test_models_through_from_torch_and_onnx(make, shape):
    torch.manual_seed(0)
    m = make().eval()
    x = torch.randn(shape)
    with torch.no_grad():
        want = m(x).numpy()
    net = tilefuse.from_torch(m, x)
    assert_close_to_max(tilefuse.compile(net).run(x.numpy()), want, rel=1e-5, what="from_torch")
    for exporter in EXPORTERS:
        blob = export(m, x.numpy(), exporter)
        got = tilefuse.compile(tilefuse.from_onnx(blob)).run(x.numpy())
        assert_close_to_max(got, ort_run(blob, x.numpy()), rel=1e-5, what=f"{exporter} vs ONNX Runtime")
        assert_close_to_max(got, want, rel=1e-5, what=f"{exporter} vs PyTorch")


@pytest.mark.parametrize("make", [lambda: LIIFUnfold(head=True), lambda: SoftSplitComp(head=True)],
                         ids=["liif", "soft-split-comp"])
def test_unfolding_and_folding_networks_train_as_torch(make):
    from test_training_modern import _step_against_torch
    torch.manual_seed(2)
    _step_against_torch(make(), torch.randn(3, 3, 9, 11), torch.tensor([0, 4, 2]))


def test_what_is_refused_is_refused_by_name():
    class Fold3d(nn.Module):
        def forward(self, x):
            return F.fold(x[0], (4, 4), 2, stride=2)          # unbatched (C kh kw, L)

    with pytest.raises(UnsupportedOpError, match=r"fold of \(8, 4\).*a 3-D \(N, C kh kw, L\) input"):
        tilefuse.from_torch(Fold3d(), torch.randn(1, 8, 4))
    net = tilefuse.Network("n")
    with pytest.raises(GraphError, match=r"fold of \(1, 18, 5\) to \(4, 4\) with kernel \(3, 3\): expected "
                                         r"\(N, C 9, 4\)"):
        net.fold(net.input("c", (1, 18, 5)), 4, 3)
    with pytest.raises(GraphError, match=r"unfold of \(1, 2, 4, 4\) with kernel \(5, 5\), dilation \(1, 1\), "
                                         r"padding \(0, 0\): no window fits"):
        net.unfold(net.input("x", (1, 2, 4, 4)), 5)
    with pytest.raises(GraphError, match=r"unfold of \(2, 4, 4\); expected \(N, C, H, W\)"):
        net.unfold(net.input("y", (2, 4, 4)), 3)
    with pytest.raises(GraphError, match=r"expected positive kernel, dilation and stride"):
        net.unfold(net.input("z", (1, 2, 4, 4)), 2, stride=0)
