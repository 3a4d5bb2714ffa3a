"""Tensor.unfold(dim, size, step): sliding windows along one axis as a new last axis. Local attention reads its
keys this way (timm's HaloAttn: `kv.unfold(2, win, block).unfold(3, win, block)`), patch embeddings cut patches
with `x.unfold(2, p, p).unfold(3, p, p)`. from_torch maps it to strided slices and a concat (a reshape and a
permute where the windows tile the axis): elements moved, so the result is bitwise PyTorch's.

Checked: odd extents, steps below / at / past the window, size 1, a window the whole axis, negative dims, ranks 3
and 4; HaloNet's attention block (timm's HaloAttn with its relative position embedding) through from_torch at 1
and 3 threads, the dynamo ONNX exporter (against PyTorch and ONNX Runtime) and one Trainer step against PyTorch.
Tolerance: fp32, max |tilefuse - torch| <= 1e-4 max |torch|.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx_export import EXPORTERS, check_export, check_from_torch
from test_training_modern import _step_against_torch

import tilefuse


class Unfold(nn.Module):
    def __init__(self, *windows):
        super().__init__()
        self.windows = windows

    def forward(self, x):
        for dim, size, step in self.windows:
            x = x.unfold(dim, size, step)
        return x


CASES = [((2, 4, 7, 9), [(3, 3, 1)]), ((2, 4, 7, 9), [(2, 2, 2)]), ((2, 4, 7, 9), [(-1, 4, 4), (2, 3, 3)]),
         ((2, 4, 7, 9), [(3, 1, 2)]), ((2, 4, 7, 9), [(1, 2, 3)]), ((3, 5, 11), [(2, 5, 7)]),
         ((2, 4, 7, 9), [(2, 7, 1)]), ((1, 3, 8, 8), [(2, 4, 4), (3, 4, 4)]), ((2, 3, 10, 6), [(2, 4, 2), (3, 2, 2)])]


@pytest.mark.parametrize("shape,windows", CASES, ids=[f"{s}-{w}" for s, w in CASES])
def test_unfold_is_bitwise_pytorch(shape, windows):
    x = torch.randn(*shape)
    m = Unfold(*windows)
    y = tilefuse.compile(tilefuse.from_torch(m, x)).run(x.numpy())
    want = m(x).numpy()
    assert y.shape == want.shape and np.array_equal(y, want)


def rel_logits_1d(q, rel_k, permute_mask):
    """timm (halo_attn.py): relative logits along one axis, shifted from relative to absolute by padding."""
    b, h, w, dim = q.shape
    rel_size = rel_k.shape[0]
    win_size = (rel_size + 1) // 2
    x = q @ rel_k.transpose(-1, -2)
    x = x.reshape(-1, w, rel_size)
    x_pad = F.pad(x, [0, 1]).flatten(1)
    x_pad = F.pad(x_pad, [0, rel_size - w])
    x_pad = x_pad.reshape(-1, w + 1, rel_size)
    x = x_pad[:, :w, win_size - 1:]
    x = x.reshape(b, h, 1, w, win_size).expand(-1, -1, win_size, -1, -1)
    return x.permute(permute_mask)


class PosEmbedRel(nn.Module):
    def __init__(self, block_size, win_size, dim_head, scale):
        super().__init__()
        self.block_size, self.dim_head = block_size, dim_head
        self.height_rel = nn.Parameter(torch.randn(win_size * 2 - 1, dim_head) * scale)
        self.width_rel = nn.Parameter(torch.randn(win_size * 2 - 1, dim_head) * scale)

    def forward(self, q):
        b, bb, hw, _ = q.shape
        q = q.reshape(-1, self.block_size, self.block_size, self.dim_head)
        rel_logits_w = rel_logits_1d(q, self.width_rel, permute_mask=(0, 1, 3, 2, 4))
        q = q.transpose(1, 2)
        rel_logits_h = rel_logits_1d(q, self.height_rel, permute_mask=(0, 3, 1, 4, 2))
        return (rel_logits_h + rel_logits_w).reshape(b, bb, hw, -1)


class HaloAttn(nn.Module):
    """timm's HaloAttn (Vaswani et al. 2021, HaloNet), stride 1: queries per block, keys and values from the block
    with a halo around it (`unfold` of the padded map)."""

    def __init__(self, dim, dim_out, num_heads=2, block_size=4, halo_size=1, dim_head=4):
        super().__init__()
        self.num_heads, self.dim_head_qk, self.dim_head_v = num_heads, dim_head, dim_out // num_heads
        self.dim_out_v = dim_out
        self.scale = self.dim_head_qk ** -0.5
        self.block_size = self.block_size_ds = block_size
        self.halo_size = halo_size
        self.win_size = block_size + halo_size * 2
        self.q = nn.Conv2d(dim, self.dim_head_qk * num_heads, 1, bias=False)
        self.kv = nn.Conv2d(dim, self.dim_head_qk * num_heads + dim_out, 1, bias=False)
        self.pos_embed = PosEmbedRel(block_size, self.win_size, self.dim_head_qk, self.scale)

    def forward(self, x):
        B, C, H, W = x.shape
        num_h_blocks, num_w_blocks = H // self.block_size, W // self.block_size
        num_blocks = num_h_blocks * num_w_blocks
        q = self.q(x)
        q = q.reshape(-1, self.dim_head_qk, num_h_blocks, self.block_size_ds, num_w_blocks,
                      self.block_size_ds).permute(0, 1, 3, 5, 2, 4)
        q = q.reshape(B * self.num_heads, self.dim_head_qk, -1, num_blocks).transpose(1, 3)
        kv = self.kv(x)
        kv = F.pad(kv, [self.halo_size, self.halo_size, self.halo_size, self.halo_size])
        kv = kv.unfold(2, self.win_size, self.block_size).unfold(3, self.win_size, self.block_size).reshape(
            B * self.num_heads, self.dim_head_qk + self.dim_head_v, num_blocks, -1).permute(0, 2, 3, 1)
        k, v = torch.split(kv, [self.dim_head_qk, self.dim_head_v], dim=-1)
        attn = (q @ k.transpose(-1, -2)) * self.scale + self.pos_embed(q)
        attn = attn.softmax(dim=-1)
        out = (attn @ v).transpose(1, 3)
        out = out.reshape(-1, self.block_size_ds, self.block_size_ds, num_h_blocks, num_w_blocks)
        return out.permute(0, 3, 1, 4, 2).contiguous().view(B, self.dim_out_v, H, W)


class HaloNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.attn = HaloAttn(8, 8)
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        return self.head((x + self.attn(x)).mean((2, 3)))


def _x(seed=0, n=2, size=8):
    return np.random.default_rng(seed).standard_normal((n, 3, size, size)).astype(np.float32)


def test_halonet_from_torch_matches_pytorch():
    check_from_torch(HaloNet, _x())


def test_halonet_onnx_export_matches_pytorch_and_onnxruntime():
    """(The dynamo exporter: the TorchScript exporter refuses Tensor.unfold of a padded tensor, "input size not
    accessible".)"""
    assert "dynamo" in EXPORTERS
    check_export(HaloNet, _x(1), "dynamo")


def test_halonet_training_step_matches_pytorch():
    torch.manual_seed(2)
    tr, grads = _step_against_torch(HaloNet(), torch.from_numpy(_x(2, 4)), torch.tensor([0, 3, 7, 9]))
    assert all(np.abs(grads[k]).max() > 0 for k in ("attn.kv.weight", "attn.pos_embed.height_rel"))
