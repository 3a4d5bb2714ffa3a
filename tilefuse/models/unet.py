"""U-Net (Ronneberger et al. 2015), the common PyTorch form (milesial/Pytorch-UNet, bilinear=False).

inc: DoubleConv (conv3x3 + BN + ReLU, twice); down1..4: maxpool 2x2 then DoubleConv, doubling
the channels (base 64: 64 -> 1024); up1..4: ConvTranspose2d(k=2, s=2) halving the channels,
zero-pad to the skip tensor's size when the sizes are odd, concat [skip, upsampled], DoubleConv;
outc: conv1x1 to the classes. Names follow that module tree ("down2.maxpool_conv.1.double_conv.3",
"up1.up", "outc.conv").
"""
from __future__ import annotations

import numpy as np

from ..ir import DataNode, Network
from ._params import ParamFactory


def _double_conv(net: Network, pf: ParamFactory, x: DataNode, p: str, out_c: int) -> DataNode:
    for i in (0, 3):
        w, _ = pf.conv(f"{p}.double_conv.{i}", out_c, x.shape[1], 3)
        x = net.conv2d(x, w, None, padding=1, name=f"{p}.double_conv.{i}")
        x = net.batch_norm(x, *pf.bn(f"{p}.double_conv.{i + 1}", out_c), name=f"{p}.double_conv.{i + 1}")
        x = net.relu(x, name=f"{p}.double_conv.{i + 2}")
    return x


def unet(seed: int = 0, batch: int = 1, image_size: int = 256, num_classes: int = 2, base: int = 64,
         in_channels: int = 3, dtype=np.float32) -> Network:
    net = Network("unet")
    pf = ParamFactory(net, seed, dtype)
    h, w = (image_size, image_size) if isinstance(image_size, int) else image_size   # H = W, or (H, W)
    x = net.input("x", (batch, in_channels, h, w), dtype)
    skips = [_double_conv(net, pf, x, "inc", base)]
    for i in range(1, 5):
        y = net.max_pool(skips[-1], 2, 2, name=f"down{i}.maxpool_conv.0")
        skips.append(_double_conv(net, pf, y, f"down{i}.maxpool_conv.1", base * 2 ** i))
    x = skips.pop()
    for i in range(1, 5):
        skip = skips.pop()
        c = x.shape[1]
        w, b = pf.conv_transpose(f"up{i}.up", c, c // 2, 2, 2)
        x = net.conv_transpose2d(x, w, b, stride=2, name=f"up{i}.up")
        dy, dx = skip.shape[2] - x.shape[2], skip.shape[3] - x.shape[3]
        if dy or dx:
            x = net.pad(x, (0, 0, 0, 0, dy // 2, dy - dy // 2, dx // 2, dx - dx // 2), name=f"up{i}.pad")
        x = net.concat([skip, x], axis=1, name=f"up{i}.cat")
        x = _double_conv(net, pf, x, f"up{i}.conv", c // 2)
    w, b = pf.conv("outc.conv", num_classes, x.shape[1], 1, bias=True, gain=1.0)
    net.output(net.conv2d(x, w, b, name="outc.conv"))
    return net
