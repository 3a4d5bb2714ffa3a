"""Building blocks shared by the modern zoo models, named like torchvision's modules.

conv_norm_act: torchvision.ops.Conv2dNormActivation, a Sequential (conv, BN, activation): its
  constants are '<prefix>.0.weight', '<prefix>.1.running_mean', ...; the ops '<prefix>.0',
  '<prefix>.1', '<prefix>.2'.
squeeze_excitation: torchvision.ops.SqueezeExcitation (avgpool, fc1, activation, fc2,
  scale activation, then the channel scale): '<prefix>.fc1.weight', '<prefix>.fc2.bias'.
make_divisible: the channel rounding of the MobileNet papers (torchvision _make_divisible).
"""
from __future__ import annotations

from ..ir import DataNode, Network
from ._params import ParamFactory

# activation name -> (IR activation, params); ReLU is the relu op
ACTS = {
    "relu": ("relu", {}),
    "relu6": ("clip", {"min": 0.0, "max": 6.0}),
    "hardswish": ("hardswish", {}),
    "hardsigmoid": ("hardsigmoid", {}),
    "sigmoid": ("sigmoid", {}),
    "silu": ("silu", {}),
    "gelu": ("gelu", {}),
}


def make_divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:   # do not round down by more than 10%
        new_v += divisor
    return new_v


def act(net: Network, x: DataNode, kind: str | None, name: str) -> DataNode:
    if kind is None:
        return x
    a, params = ACTS[kind]
    return net.activation(x, a, name=name, **params)


def conv_norm_act(net: Network, pf: ParamFactory, x: DataNode, prefix: str, out_c: int, k: int, stride: int = 1,
                  groups: int = 1, activation: str | None = "relu", dilation: int = 1, padding: int | None = None,
                  eps: float = 1e-5, gamma_range=(0.5, 1.5), gain: float = 2.0) -> DataNode:
    """Conv2d(bias=False) -> BatchNorm2d -> activation, padding (k - 1) // 2 * dilation by default."""
    pad = (k - 1) // 2 * dilation if padding is None else padding
    w, _ = pf.conv(f"{prefix}.0", out_c, x.shape[1], k, groups=groups, gain=gain)
    y = net.conv2d(x, w, None, stride=stride, padding=pad, dilation=dilation, groups=groups, name=f"{prefix}.0")
    y = net.batch_norm(y, *pf.bn(f"{prefix}.1", out_c, gamma_range), eps=eps, name=f"{prefix}.1")
    return act(net, y, activation, f"{prefix}.2")


def squeeze_excitation(net: Network, pf: ParamFactory, x: DataNode, prefix: str, squeeze_c: int,
                       activation: str = "relu", scale_activation: str = "sigmoid") -> DataNode:
    """x * scale_act(fc2(act(fc1(mean over H, W of x)))) with 1x1 convs (bias) as fc1 / fc2."""
    c = x.shape[1]
    s = net.global_avg_pool(x, name=f"{prefix}.avgpool")
    w, b = pf.conv(f"{prefix}.fc1", squeeze_c, c, 1, bias=True)
    s = net.conv2d(s, w, b, name=f"{prefix}.fc1")
    s = act(net, s, activation, f"{prefix}.activation")
    w, b = pf.conv(f"{prefix}.fc2", c, squeeze_c, 1, bias=True, gain=1.0)
    s = net.conv2d(s, w, b, name=f"{prefix}.fc2")
    s = act(net, s, scale_activation, f"{prefix}.scale_activation")
    return net.mul(s, x, name=f"{prefix}.mul")


def classifier_head(net: Network, pf: ParamFactory, x: DataNode, fc: str, num_classes: int,
                    pool: str = "avgpool") -> DataNode:
    """global average pool, flatten, linear."""
    x = net.global_avg_pool(x, name=pool)
    x = net.flatten(x, 1, name="flatten")
    return net.linear(x, *pf.linear(fc, num_classes, x.shape[1], gain=1.0), name=fc)
