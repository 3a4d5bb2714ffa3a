"""define/import -> compile -> save/load -> Session.run / run_many, against PyTorch (fp32).

Tolerance: rtol = atol = 1e-4 for every model (the issue's bar); the same numbers go through
the file format, so the loaded package must give bit-identical results to the in-memory one.
"""
import numpy as np
import pytest
import torch
import torch.nn as nn

import tilefuse
from tilefuse import models
from torch_zoo import load as torch_zoo_load

RTOL = ATOL = 1e-4

ZOO = [  # (name, batch, image size): small images where the architecture allows it
    ("resnet18", 2, 64),
    ("resnet50", 1, 64),
    ("alexnet", 1, 224),
    ("vgg16", 1, 224),
    ("tinynet", 3, 32),
]


def torch_out(module, x):
    with torch.no_grad():
        y = module(torch.from_numpy(x))
    return [t.numpy() for t in y] if isinstance(y, (tuple, list)) else [y.numpy()]


def check_all_paths(net, x, expected, tmp_path, runs=3):
    compiled = tilefuse.compile(net)
    sess = tilefuse.Session(compiled)
    y = sess.run(x)
    y = y if isinstance(y, list) else [y]
    for a, b in zip(y, expected):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
    path = compiled.save(tmp_path / f"{net.name}.tfpkg")
    loaded = tilefuse.Session(tilefuse.load_package(path))
    y2 = loaded.run(x)
    y2 = y2 if isinstance(y2, list) else [y2]
    for a, b in zip(y2, y):
        np.testing.assert_array_equal(a, b)
    many = loaded.run_many([x] * runs, depth=3)
    for m in many:
        m = m if isinstance(m, list) else [m]
        for a, b in zip(m, y):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name, batch, size", ZOO)
def test_zoo_model_matches_torch(name, batch, size, tmp_path):
    net = models.get(name, seed=0, batch=batch, image_size=size)
    tm = torch_zoo_load(name, net)
    x = np.random.default_rng(1).standard_normal(net.inputs[0].shape).astype(np.float32)
    check_all_paths(net, x, torch_out(tm, x), tmp_path)


@pytest.mark.parametrize("name, batch, size", [("resnet18", 1, 48), ("resnet50", 2, 40), ("alexnet", 1, 224),
                                              ("vgg16", 1, 224), ("tinynet", 2, 48)])
def test_zoo_model_through_from_torch(name, batch, size, tmp_path):
    net0 = models.get(name, seed=2, batch=batch, image_size=size)
    tm = torch_zoo_load(name, net0)
    x = np.random.default_rng(3).standard_normal(net0.inputs[0].shape).astype(np.float32)
    net = tilefuse.from_torch(tm, torch.from_numpy(x))
    check_all_paths(net, x, torch_out(tm, x), tmp_path)


class OddNet(nn.Module):
    """Shapes the zoo does not have: odd channels, asymmetric padding, dilation, groups,
    depthwise, concat branches, a residual add, LRN, avg pool with ceil mode, two outputs."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 17, (3, 5), stride=(2, 1), padding=(1, 2), bias=False)
        self.bn = nn.BatchNorm2d(17)
        self.dw = nn.Conv2d(17, 17, 3, padding=2, dilation=2, groups=17)
        self.g2 = nn.Conv2d(17, 10, 3, padding=1, groups=1)
        self.branch_a = nn.Conv2d(17, 6, 1)
        self.branch_b = nn.Conv2d(17, 4, 5, padding=2)
        self.lrn = nn.LocalResponseNorm(3)
        self.grouped = nn.Conv2d(10, 10, 3, padding=1, groups=2)
        self.bn2 = nn.BatchNorm2d(10)
        self.pool = nn.AvgPool2d(3, stride=2, ceil_mode=True, count_include_pad=False)
        self.mp = nn.MaxPool2d(2, ceil_mode=True)
        self.fc = nn.Linear(10, 7)
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        x = torch.relu(self.bn(self.stem(x)))
        x = self.dw(x)
        y = torch.cat([self.branch_a(x), self.branch_b(x)], dim=1)      # 10 channels
        y = self.lrn(y)
        z = torch.relu(self.bn2(self.grouped(y)) + y)
        p = self.mp(self.pool(z))
        h = torch.flatten(nn.functional.adaptive_avg_pool2d(p, 1), 1)
        return torch.softmax(self.fc(self.drop(h)), dim=1), p


def randomize_bn(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.3)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.2)
    return module.eval()


@pytest.mark.parametrize("batch, h, w", [(1, 23, 19), (3, 16, 31)])
def test_user_torch_model_odd_shapes(batch, h, w, tmp_path):
    torch.manual_seed(0)
    tm = randomize_bn(OddNet())
    x = np.random.default_rng(4).standard_normal((batch, 3, h, w)).astype(np.float32)
    net = tilefuse.from_torch(tm, torch.from_numpy(x))
    assert len(net.outputs) == 2
    check_all_paths(net, x, torch_out(tm, x), tmp_path)


def test_ablation_modes_are_what_they_claim(monkeypatch):
    """Counted, so collapsing the modes fails: compiles, constant copies, pipelined runs."""
    import tilefuse.ablation as ab
    from tilefuse.runtime import Session
    counts = {}

    def compile_counted(*a, **k):
        counts["compiles"] += 1
        return tilefuse.compile(*a, **k)

    class Counted(Session):
        def copy_constants(self):
            if not self.segments:
                counts["copies"] += 1
            super().copy_constants()

        def run_many(self, *a, **k):
            counts["pipelined"] += 1
            return super().run_many(*a, **k)

    monkeypatch.setattr(ab, "compile_net", compile_counted)
    monkeypatch.setattr(ab, "Session", Counted)
    net = models.get("tinynet", seed=0, batch=1, image_size=16)
    xs = [np.random.default_rng(i).standard_normal(net.inputs[0].shape).astype(np.float32) for i in range(5)]
    want = {"baseline": (5, 5, 0), "ql1": (1, 5, 0), "ql2": (1, 1, 0), "ql3": (1, 1, 1)}
    for mode, (compiles, copies, pipelined) in want.items():
        counts.update(compiles=0, copies=0, pipelined=0)
        ab.run_mode(net, xs, mode)
        assert (counts["compiles"], counts["copies"], counts["pipelined"]) == (compiles, copies, pipelined), mode


def test_ablation_modes_agree():
    from tilefuse.ablation import MODES, run_mode
    net = models.get("tinynet", seed=0, batch=1, image_size=16)
    xs = [np.random.default_rng(i).standard_normal(net.inputs[0].shape).astype(np.float32) for i in range(6)]
    results = {m: run_mode(net, xs, m) for m in MODES}
    for m in MODES:
        assert results[m].seconds > 0 and len(results[m].outputs) == 6
        for a, b in zip(results[m].outputs, results["baseline"].outputs):
            np.testing.assert_array_equal(a, b)
