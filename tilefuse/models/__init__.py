"""Model zoo: torchvision architectures built with the Network API, with seeded weights.

    net = tilefuse.models.resnet50(seed=0)              # batch 1, 224x224, 1000 classes
    net = tilefuse.models.get("alexnet", batch=4)
    tilefuse.models.NAMES                               # ('alexnet', 'vgg16', ...)

Constants are named exactly like the torchvision state_dict keys ("conv1.weight",
"layer1.0.downsample.1.running_var", "classifier.6.bias", ...) and ops after the module path
("layer1.0.conv1", "features.3", a reused ReLU as "layer1.0.relu_1"), so `state_dict(net)`
loads straight into the torchvision module (`load_into_torch`).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..ir import Network
from ._params import adaptive_avg_pool
from .alexnet import alexnet
from .convnext import convnext_tiny
from .deeplab import deeplabv3_resnet50
from .efficientnet import efficientnet_b0
from .mobilenet import mobilenet_v2, mobilenet_v3_large
from .regnet import regnet_y_400mf
from .resnet import resnet18, resnet50
from .shufflenet import shufflenet_v2
from .tinynet import tinynet
from .unet import unet
from .vgg import vgg16

_REGISTRY: dict[str, Callable[..., Network]] = {
    "alexnet": alexnet,
    "vgg16": vgg16,
    "resnet18": resnet18,
    "resnet50": resnet50,
    "tinynet": tinynet,
    "mobilenet_v2": mobilenet_v2,
    "mobilenet_v3_large": mobilenet_v3_large,
    "efficientnet_b0": efficientnet_b0,
    "shufflenet_v2": shufflenet_v2,
    "regnet_y_400mf": regnet_y_400mf,
    "convnext_tiny": convnext_tiny,
    "unet": unet,
    "deeplabv3": deeplabv3_resnet50,
}
NAMES: tuple[str, ...] = tuple(_REGISTRY)


def get(name: str, **kw) -> Network:
    """Build zoo model `name` (seed=, batch=, image_size=, num_classes=, dtype=)."""
    try:
        build = _REGISTRY[name.lower()]
    except KeyError:
        raise KeyError(f"unknown model '{name}'; expected one of {', '.join(NAMES)}") from None
    return build(**kw)


def state_dict(net: Network) -> dict[str, np.ndarray]:
    """Every bound constant of `net` by name (for zoo nets: the torchvision state_dict keys)."""
    return {d.name: d.value for d in net.constants()}


def load_into_torch(module, net: Network, strict: bool = True):
    """Copy `net`'s constants into a torch module by state_dict key (imports torch lazily).

    Keys the net does not carry but torch has as bookkeeping (BN num_batches_tracked) are kept
    from the module; with strict, any other missing or unexpected key raises KeyError.
    """
    import torch

    own = module.state_dict()
    consts = state_dict(net)
    missing = [k for k in own if k not in consts and not k.endswith("num_batches_tracked")]
    unexpected = [k for k in consts if k not in own]
    if strict and (missing or unexpected):
        raise KeyError(f"state_dict mismatch: missing in net {missing[:8]}, not in module "
                       f"{unexpected[:8]}")
    new = {k: (torch.from_numpy(np.array(consts[k])).to(v.dtype) if k in consts else v)
           for k, v in own.items()}
    for k, v in new.items():   # a 1x1 conv weight (out, in, 1, 1) loads into a Linear's (out, in)
        if k in consts and tuple(v.shape) != tuple(own[k].shape) and tuple(v.shape) == tuple(own[k].shape) + (1, 1):
            new[k] = v.reshape(own[k].shape)
    for k in new:
        if tuple(new[k].shape) != tuple(own[k].shape):
            raise KeyError(f"'{k}': net constant has shape {tuple(new[k].shape)}, module expects "
                           f"{tuple(own[k].shape)}")
    module.load_state_dict(new, strict=True)
    return module


__all__ = ["NAMES", "get", "state_dict", "load_into_torch", "adaptive_avg_pool",
           "alexnet", "vgg16", "resnet18", "resnet50", "tinynet", "mobilenet_v2", "mobilenet_v3_large",
           "efficientnet_b0", "shufflenet_v2", "regnet_y_400mf", "convnext_tiny", "unet", "deeplabv3_resnet50"]
