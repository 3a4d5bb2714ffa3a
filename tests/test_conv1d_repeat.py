"""Conv1d / ConvTranspose1d and x.repeat / torch.tile through from_torch.

ECA-Net's channel attention (timm's EcaModule, in ECA-ResNets and EfficientNet variants) runs a Conv1d along the
channel means: `conv(x.mean((2, 3)).view(n, 1, -1))`; a grey input is made three-channel with
`x.repeat(1, 3, 1, 1)`. Both were refused ("a 1-D convolution", "aten.repeat"). A 1-D conv imports as the 2-D conv
of (N, C, 1, L) (as the ONNX importer lifts a 1-D Conv); a repeat as a broadcast along axes of size 1 and a concat
of copies along larger ones (as ONNX's Tile). Checked against PyTorch (float32 and float64 gradients) and, through
torch.onnx, ONNX Runtime.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import tilefuse

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional


class Eca(nn.Module):
    """timm's EcaModule (kernel size from the channel count, no bias, sigmoid gate)."""

    def __init__(self, c, gamma=2, beta=1):
        super().__init__()
        t = int(abs(math.log(c, 2) + beta) / gamma)
        k = max(t if t % 2 else t + 1, 3)
        self.conv = nn.Conv1d(1, 1, kernel_size=k, padding=(k - 1) // 2, bias=False)

    def forward(self, x):
        y = x.mean((2, 3)).view(x.shape[0], 1, -1)
        y = self.conv(y)
        y = y.sigmoid().view(x.shape[0], -1, 1, 1)
        return x * y.expand_as(x)


class EcaNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1), nn.BatchNorm2d(32), nn.ReLU())
        self.eca = Eca(32)
        self.conv = nn.Conv2d(32, 24, 3, 1, 1)
        self.eca2 = Eca(24)
        self.fc = nn.Linear(24, 5)

    def forward(self, x):
        if x.size(1) == 1:
            x = x.repeat(1, 3, 1, 1)                     # grey -> three channels
        y = self.eca2(F.relu(self.conv(self.eca(self.stem(x)))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


def _eca_net():
    torch.manual_seed(0)
    m = EcaNet().eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return m


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("cin", [1, 3])
def test_eca_net_matches_pytorch(threads, cin):
    m = _eca_net()
    x = torch.randn(2, cin, 20, 18)
    net = tilefuse.from_torch(m, x)
    assert sum(o.op == "conv2d" for o in net.ops) == 4            # the two Conv1d as 2-D convs of (N, 1, 1, C)
    got = tilefuse.compile(net, threads=threads).run(x.numpy())
    with torch.no_grad():
        want = m(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_eca_net_through_onnx_matches_onnx_runtime():
    import onnxruntime as ort
    from onnx_export import export
    m = _eca_net()
    x = torch.randn(1, 1, 16, 16)
    blob = export(m, x.numpy(), "torchscript")
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]
    got = tilefuse.compile(tilefuse.from_onnx(blob)).run(x.numpy())
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


class Conv1dNet(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        if kind == "strided":
            self.c = nn.Conv1d(6, 8, 5, stride=2, padding=1)
        elif kind == "grouped_dilated":
            self.c = nn.Conv1d(6, 4, 3, padding=2, dilation=2, groups=2, bias=False)
        elif kind == "same":
            self.c = nn.Conv1d(6, 6, 5, padding="same", groups=6)
        elif kind == "valid":
            self.c = nn.Conv1d(6, 3, 4, padding="valid")
        else:
            self.c = nn.ConvTranspose1d(6, 4, 4, stride=2, padding=1, output_padding=1)

    def forward(self, x):
        s = self.c(F.relu(x.flatten(2)))                     # (N, C, H, W) -> (N, C, H*W), the 1-D conv
        return s.unsqueeze(2) * 2                           # (N, C', L') -> (N, C', 1, L')


@pytest.mark.parametrize("kind", ["strided", "grouped_dilated", "same", "valid", "transposed"])
def test_conv1d_forms_match_pytorch(kind):
    torch.manual_seed(2)
    m = Conv1dNet(kind).eval()
    x = torch.randn(2, 6, 3, 7)
    got = tilefuse.compile(tilefuse.from_torch(m, x), threads=2).run(x.numpy())
    with torch.no_grad():
        want = m(x).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_eca_net_trains_gradients_equal_pytorchs():
    """The Trainer's gradients of the lifted Conv1d weights come back under their parameters' names and shapes
    (Const.root), against float64 PyTorch."""
    from tilefuse.training import SGD, Trainer
    m = _eca_net().train()
    x = torch.randn(3, 3, 12, 12)
    labels = np.array([1, 4, 0])
    net = tilefuse.from_torch(m, x)
    loss, grads = Trainer(net, SGD(0.1), schedule="unfused").forward_backward(x.numpy(), labels)
    m64 = _eca_net().double().train()
    want_loss = F.cross_entropy(m64(x.double()), torch.from_numpy(labels))
    want_loss.backward()
    assert float(loss) == pytest.approx(float(want_loss), rel=1e-5)
    for k in ("eca.conv.weight", "eca2.conv.weight", "conv.weight", "stem.0.weight"):
        want = dict(m64.named_parameters())[k].grad.numpy()
        np.testing.assert_allclose(np.asarray(grads[k]).reshape(want.shape), want, rtol=1e-4,
                                   atol=1e-5 * np.abs(want).max(), err_msg=k)


class Repeat(nn.Module):
    def __init__(self, reps, tile=False):
        super().__init__()
        self.reps, self.tile = reps, tile

    def forward(self, x):
        y = torch.tile(x, self.reps) if self.tile else x.repeat(*self.reps)
        return y * 2


@pytest.mark.parametrize("shape,reps,tile", [
    ((2, 1, 5, 6), (1, 3, 1, 1), False),        # grey -> three channels: a broadcast
    ((2, 3, 5, 6), (2, 1, 1, 2), False),        # the batch and the columns copied: concats
    ((3, 4, 5), (2, 1, 3, 1), False),           # a new leading axis
    ((2, 3, 1, 4), (1, 2, 3, 1), False),        # channels copied, a size-1 axis broadcast
    ((2, 3, 5, 6), (2, 2), True)])              # torch.tile: the repeats right-aligned
def test_repeat_and_tile_match_pytorch(shape, reps, tile):
    x = torch.randn(*shape)
    m = Repeat(reps, tile)
    got = tilefuse.compile(tilefuse.from_torch(m, x)).run(x.numpy())
    want = m(x).numpy()
    assert got.shape == want.shape and np.array_equal(got, want)


def test_refusals_name_the_node():
    with pytest.raises(tilefuse.errors.UnsupportedOpError, match=r"repeat \[1, 100, 1, 1\].*up to 64 copies"):
        tilefuse.from_torch(Repeat((1, 100, 1, 1)), torch.randn(1, 2, 3, 3))

    class Conv3d(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv3d(2, 2, 3)

        def forward(self, x):
            return self.c(x.unsqueeze(2).repeat(1, 1, 3, 1, 1)).squeeze(2)

    with pytest.raises(tilefuse.errors.UnsupportedOpError, match=r"3-D convolution.*node 'convolution'.*2-D convolution"):
        tilefuse.from_torch(Conv3d(), torch.randn(1, 2, 6, 6))
