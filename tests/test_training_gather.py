"""A parameter read through an index trains: Swin's relative position bias (`table[index.view(-1)].view(N, N,
-1).permute(2, 0, 1)`), LeViT's `attention_biases[:, attention_bias_idxs]`, one table read twice.

from_torch folds such a read to a constant (the index is a buffer); the constant keeps the parameter's flat
indices of its elements (Network.constant_gather: the same ATen ops applied to the parameter's flat index), so
the Trainer trains the parameter: forward reads it at those indices, backward scatter-adds the constant's
gradient back (an element read twice gets both). Against PyTorch's gradients (test_training_modern's
_step_against_torch), then the trained network's output after an SGD step against PyTorch's after the same
step."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

import tilefuse
from test_training_modern import _step_against_torch
from tilefuse.training import SGD, Trainer


class BiasedAttention(nn.Module):
    """Attention over a 3x3 map's pixels with Swin's and LeViT's learned position biases."""

    def __init__(self, c=8, heads=2, side=3):
        super().__init__()
        n = side * side
        self.heads = heads
        self.qkv = nn.Conv2d(c, 3 * c, 1)
        self.table = nn.Parameter(torch.randn((2 * side - 1) ** 2, heads) * 0.5)
        coords = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + side - 1
        self.register_buffer("index", rel[..., 0] * (2 * side - 1) + rel[..., 1])          # (N, N)
        self.ab = nn.Parameter(torch.randn(heads, 2 * side) * 0.5)
        self.register_buffer("ab_idx", torch.randint(0, 2 * side, (n, n), generator=torch.Generator().manual_seed(1)))

    def forward(self, x):
        b, c, h, w = x.shape
        q, k, v = self.qkv(x).flatten(2).transpose(1, 2).reshape(b, h * w, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        n = h * w
        bias = self.table[self.index.view(-1)].view(n, n, -1).permute(2, 0, 1).contiguous()     # (heads, N, N)
        attn = (q @ k.transpose(-2, -1)) * 0.5 + bias.unsqueeze(0) + self.ab[:, self.ab_idx]
        attn = attn + self.table[self.index][..., :1].permute(2, 0, 1)          # the table read a second time
        o = (attn.softmax(-1) @ v).transpose(1, 2).reshape(b, n, c)
        return x + o.transpose(1, 2).reshape(b, c, h, w)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), BiasedAttention(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 4))


def test_the_index_read_tables_get_pytorchs_gradients():
    x = torch.randn(4, 3, 3, 3, generator=torch.Generator().manual_seed(2))
    tr, grads = _step_against_torch(_model(), x, torch.tensor([0, 3, 1, 2]))
    assert {"1.table", "1.ab"} <= set(grads)
    assert grads["1.table"].shape == (25, 2) and grads["1.ab"].shape == (2, 6)


def test_a_step_moves_the_tables_as_pytorchs_sgd():
    m = _model()
    x = torch.randn(4, 3, 3, 3, generator=torch.Generator().manual_seed(3))
    y = torch.tensor([1, 0, 3, 2])
    net = tilefuse.from_torch(m, x)
    assert sum(name in net.constant_gather for name in net.data) >= 2
    tr = Trainer(net, SGD(lr=0.5))
    tr.step(x.numpy(), y.numpy())
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    m.train()
    torch.nn.functional.cross_entropy(m(x), y).backward()
    opt.step()
    m.eval()
    with torch.no_grad():
        want = m(x).numpy()
    got = tilefuse.evaluate(tr.inference_network(), x.numpy())[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(tr.params["1.table"], m[1].table.detach().numpy(), rtol=1e-4, atol=1e-6)
