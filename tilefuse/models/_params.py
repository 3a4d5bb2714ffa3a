"""Seeded random constants for the model zoo, named like the torchvision state_dict keys.

Scaling: convolution and linear weights are Kaiming-normal (std = sqrt(gain / fan_in), gain 2
before a ReLU, He et al. 2015, "Delving Deep into Rectifiers", eq. 10), so E[x^2] stays about
constant through conv + ReLU stacks. BN statistics are non-trivial but centred on what such a
conv produces (pre-BN variance ~1): running_var ~ U[0.5, 2], gamma ~ U[0.5, 1.5] (so
E[gamma^2 / var] ~ 1.0), running_mean ~ U[-0.5, 0.5], beta ~ U[-0.25, 0.25]. The last BN of a
residual branch gets gamma ~ U[0.2, 0.6] so that the sum of many blocks stays O(1) (the idea of
torchvision's zero_init_residual, without making the branch vanish).

Constants are drawn in module order from one numpy Generator, so a seed fixes every value.
"""
from __future__ import annotations

import numpy as np

from ..ir import DataNode, Network


class ParamFactory:
    """Creates named, seeded constants on `net` (float32 unless `dtype` says otherwise)."""

    def __init__(self, net: Network, seed: int, dtype=np.float32):
        self.net = net
        self.rng = np.random.default_rng(seed)
        self.dtype = np.dtype(dtype)

    def _const(self, name: str, a: np.ndarray) -> DataNode:
        return self.net.constant(name, a.astype(self.dtype), dtype=self.dtype)

    def weight(self, name: str, shape, fan_in: int, gain: float = 2.0) -> DataNode:
        w = self.rng.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(gain / fan_in))
        return self._const(name, w)

    def bias(self, name: str, n: int, bound: float = 0.05) -> DataNode:
        return self._const(name, self.rng.uniform(-bound, bound, n).astype(np.float32))

    def conv(self, prefix: str, out_c: int, in_c: int, k, groups: int = 1, bias: bool = False,
             gain: float = 2.0):
        """(weight, bias or None) named '<prefix>.weight', '<prefix>.bias'."""
        kh, kw = (k, k) if isinstance(k, int) else k
        shape = (out_c, in_c // groups, kh, kw)
        w = self.weight(f"{prefix}.weight", shape, fan_in=shape[1] * kh * kw, gain=gain)
        b = self.bias(f"{prefix}.bias", out_c) if bias else None
        return w, b

    def linear(self, prefix: str, out_f: int, in_f: int, gain: float = 2.0):
        w = self.weight(f"{prefix}.weight", (out_f, in_f), fan_in=in_f, gain=gain)
        return w, self.bias(f"{prefix}.bias", out_f)

    def conv_transpose(self, prefix: str, in_c: int, out_c: int, k, stride, groups: int = 1, bias: bool = True):
        """ConvTranspose2d (weight (in, out/groups, kh, kw)); fan-in = the inputs each output sees."""
        kh, kw = (k, k) if isinstance(k, int) else k
        sh, sw = (stride, stride) if isinstance(stride, int) else stride
        fan_in = max(1, (in_c // groups) * kh * kw // (sh * sw))
        w = self.weight(f"{prefix}.weight", (in_c, out_c // groups, kh, kw), fan_in=fan_in)
        return w, (self.bias(f"{prefix}.bias", out_c) if bias else None)

    def layer_norm(self, prefix: str, shape):
        """(weight, bias) of a LayerNorm, gamma ~ U[0.5, 1.5], beta ~ U[-0.25, 0.25]."""
        return (self._const(f"{prefix}.weight", self.rng.uniform(0.5, 1.5, shape)),
                self._const(f"{prefix}.bias", self.rng.uniform(-0.25, 0.25, shape)))

    def uniform(self, name: str, shape, lo: float, hi: float) -> DataNode:
        return self._const(name, self.rng.uniform(lo, hi, shape))

    def bn(self, prefix: str, c: int, gamma_range=(0.5, 1.5)):
        """(gamma, beta, running_mean, running_var) named like nn.BatchNorm2d's state_dict."""
        r = self.rng
        gamma = r.uniform(*gamma_range, c)
        beta = r.uniform(-0.25, 0.25, c)
        mean = r.uniform(-0.5, 0.5, c)
        var = r.uniform(0.5, 2.0, c)
        return (self._const(f"{prefix}.weight", gamma), self._const(f"{prefix}.bias", beta),
                self._const(f"{prefix}.running_mean", mean), self._const(f"{prefix}.running_var", var))


def conv_bn(net: Network, pf: ParamFactory, x: DataNode, conv: str, bn: str, out_c: int, k: int,
            stride: int = 1, padding: int = 0, gamma_range=(0.5, 1.5)) -> DataNode:
    """conv (no bias) + inference batch norm, the ResNet building pair."""
    w, _ = pf.conv(conv, out_c, x.shape[1], k)
    y = net.conv2d(x, w, None, stride=stride, padding=padding, name=conv)
    return net.batch_norm(y, *pf.bn(bn, out_c, gamma_range), eps=1e-5, name=bn)


def adaptive_avg_pool(net: Network, x: DataNode, output_size, name: str) -> DataNode:
    """AdaptiveAvgPool2d in its cheapest form: output 1x1 -> global_avg_pool; input == output ->
    identity (returns x, no op); input divisible by output -> avg_pool with kernel = stride =
    input // output; anything else the adaptive_avg_pool op (PyTorch's overlapping windows)."""
    if isinstance(output_size, int):
        output_size = (output_size, output_size)
    h, w = x.shape[2], x.shape[3]
    oh = h if output_size[0] is None else int(output_size[0])
    ow = w if output_size[1] is None else int(output_size[1])
    if (oh, ow) == (h, w):
        return x
    if (oh, ow) == (1, 1):
        return net.global_avg_pool(x, name=name)
    if h % oh == 0 and w % ow == 0:
        k = (h // oh, w // ow)
        return net.avg_pool(x, kernel_size=k, stride=k, name=name)
    return net.adaptive_avg_pool(x, (oh, ow), name=name)
