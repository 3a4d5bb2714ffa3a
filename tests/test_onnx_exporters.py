"""Models exported by both torch exporters (TorchScript-based `dynamo=False` and `dynamo=True`),
imported with from_onnx, compiled and run through a Session: equal to ONNX Runtime on the same
file and to PyTorch (fp32, max error <= 1e-4 of the output's max)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tilefuse
from onnx_export import EXPORTERS, assert_close_to_max, export, ort_run, torch_run
from tilefuse import models
from torch_zoo import load as torch_zoo_load


def _check(module, x, exporter, opset=None, **import_kw):
    blob = export(module, x, exporter, opset)
    net = tilefuse.from_onnx(blob, **import_kw)
    y = tilefuse.Session(tilefuse.compile(net)).run(x)
    assert_close_to_max(y, ort_run(blob, x), what=f"{exporter} vs ONNX Runtime")
    assert_close_to_max(y, torch_run(module, x), what=f"{exporter} vs PyTorch")
    return blob, net


class Idioms(nn.Module):
    """CNN idioms that exporters turn into shape arithmetic and reductions."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.register_buffer("gain", torch.linspace(0.5, 1.5, 8))
        self.fc = nn.Linear(8 * 4 * 4, 10)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        assert x.ndim == 4
        y = F.relu(self.bn(self.conv(x)), inplace=True)
        y = y * self.gain.view(1, -1, 1, 1) + 1.0           # per-channel scale, scalar shift
        y = y + self.conv2(y)
        pooled = F.max_pool2d(y, 2)                          # (N, 8, 4, 4)
        a = self.fc(pooled.view(pooled.size(0), -1))         # Shape -> Gather -> Concat -> Reshape
        b = self.head(torch.flatten(y.mean((2, 3), keepdim=True), 1))   # ReduceMean over H, W
        c = self.head(y.mean(dim=[-1, -2]))
        return torch.cat([F.softmax(a, dim=1), b + c / 2.0], 1)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_idioms(exporter):
    torch.manual_seed(0)
    m = Idioms()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2)
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    _check(m, x, exporter)


@pytest.mark.parametrize("opset", [11, 13, 17, 20])
def test_torchscript_opsets(opset):
    """The TorchScript exporter at opsets 11-20 (Unsqueeze axes as attribute before 13, as input from
    13; ReduceMean axes as input from 18; Softmax's 2-D rule before 13)."""
    torch.manual_seed(1)
    m = Idioms()
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    blob, _ = _check(m, x, "torchscript", opset)
    assert onnx.load_from_string(blob).opset_import[0].version == opset


@pytest.mark.parametrize("opset", [18, 21])
def test_dynamo_opsets(opset):
    torch.manual_seed(2)
    m = Idioms()
    x = np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)
    blob, _ = _check(m, x, "dynamo", opset)
    assert max(o.version for o in onnx.load_from_string(blob).opset_import if o.domain == "") == opset


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", ["tinynet", "resnet18"])
def test_zoo_models(name, exporter):
    kw = dict(seed=3, batch=2) if name == "tinynet" else dict(seed=3, batch=1, image_size=64)
    net0 = getattr(models, name)(**kw)
    tm = torch_zoo_load(name, net0)
    x = np.random.default_rng(4).standard_normal(net0.inputs[0].shape).astype(np.float32)
    _, net = _check(tm, x, exporter)
    np.testing.assert_allclose(tilefuse.evaluate(net, x)[0], tilefuse.evaluate(net0, x)[0], rtol=1e-4, atol=1e-4)


def test_symbolic_batch_from_both_exporters():
    """A dynamic batch dimension is fixed with input_shapes; the shape arithmetic folds at that batch."""
    torch.manual_seed(5)
    m = Idioms()
    x = np.random.default_rng(5).standard_normal((3, 3, 8, 8)).astype(np.float32)
    for exporter in EXPORTERS:
        blob = export(m, x[:1], exporter, dynamic=True)
        with pytest.raises(tilefuse.GraphError, match="symbolic shape"):
            tilefuse.from_onnx(blob)
        net = tilefuse.from_onnx(blob, input_shapes={"x": (3, 3, 8, 8)})
        y = tilefuse.Session(tilefuse.compile(net)).run(x)
        assert_close_to_max(y, ort_run(blob, x), what=exporter)
