"""torch.cdist: pairwise distances of orders 1, 2 and inf, the batch axes broadcast. PyTorch's kernel
(aten._cdist_forward, which order 2 reaches only with at most 25 rows on both sides) maps to the norm of the
broadcast difference (`Network.vector_norm`); order 2 with more rows is PyTorch's own matmul form, traced.
A prototype head (distances from pooled features to learned prototypes, the negated distances as logits: prototypical
networks, ProtoPNet-style heads) through from_torch, the TorchScript ONNX exporter and one Trainer step, the
prototypes trained.

Tolerance: fp32, max |tilefuse - torch| <= 1e-4 max |torch| (assert_close_to_max); against float64 PyTorch where
PyTorch's float32 matmul form cancels (`|a|^2 + |b|^2 - 2 a.b`, points far from each other here).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx_export import EXPORTERS, assert_close_to_max, check_export, check_from_torch
from test_training_modern import _step_against_torch

import tilefuse
from tilefuse.errors import UnsupportedOpError


class CDist(nn.Module):
    def __init__(self, p, rows=None, batch2=None):
        super().__init__()
        self.p, self.rows, self.batch2 = p, rows, batch2

    def forward(self, x):                      # (N, C, H, W) -> points (N, H*W, C)
        pts = x.flatten(2).transpose(1, 2)
        other = pts[:, : self.rows] * 0.5 + 1.0
        if self.batch2 is not None:
            other = other[:1]                  # (1, R, C): broadcast over the batch
        return torch.cdist(pts, other, p=self.p)


CASES = [(2.0, 7, None), (1.0, 5, None), (math.inf, 9, None), (2.0, 3, 1), (1.0, 12, 1), (2.0, 40, None)]


@pytest.mark.parametrize("p,rows,batch2", CASES, ids=[f"p{p}-r{r}-b{b}" for p, r, b in CASES])
def test_cdist_matches_pytorch(p, rows, batch2):
    x = torch.randn(2, 6, 4, 5)                # 20 points: order 2 takes PyTorch's kernel unless rows > 25
    m = CDist(p, rows, batch2)
    net = tilefuse.from_torch(m, x)
    if p != 2.0 or rows <= 25:
        assert "matmul" not in {op.op for op in net.ops}
    want = m.double()(x.double()).numpy()
    for t in (1, 3):
        assert_close_to_max(tilefuse.compile(net, threads=t).run(x.numpy()), want, what=f"{t} threads")


def test_an_order_outside_1_2_inf_is_refused_naming_it():
    with pytest.raises(UnsupportedOpError, match=r"cdist of order 3.0.*supported: p = 1, 2, inf"):
        tilefuse.from_torch(CDist(3.0, 4), torch.randn(1, 3, 4, 4))


class ProtoHead(nn.Module):
    """Features pooled per image, then the negated distances to 10 learned prototypes as logits."""

    def __init__(self, c=8, k=10):
        super().__init__()
        self.conv = nn.Conv2d(3, c, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)
        self.prototypes = nn.Parameter(torch.randn(k, c))

    def forward(self, x):
        f = F.relu(self.bn(self.conv(x))).mean((2, 3))           # (N, C)
        return -torch.cdist(f[None], self.prototypes[None])[0]   # (1, N, C), (1, K, C) -> (N, K)


def _x(seed=0, n=4):
    return np.random.default_rng(seed).standard_normal((n, 3, 8, 8)).astype(np.float32)


def test_prototype_head_from_torch_matches_pytorch():
    check_from_torch(ProtoHead, _x())


def test_prototype_head_onnx_export_matches():
    """(The TorchScript exporter: the dynamo exporter has no ONNX function for aten._cdist_forward.)"""
    assert "torchscript" in EXPORTERS
    check_export(ProtoHead, _x(1), "torchscript")


def test_prototype_head_training_step_matches_pytorch():
    torch.manual_seed(3)
    tr, grads = _step_against_torch(ProtoHead(), torch.from_numpy(_x(2)), torch.tensor([0, 3, 7, 9]))
    assert "prototypes" in tr.params and np.abs(grads["prototypes"]).max() > 0
