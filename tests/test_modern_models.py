"""Modern CNNs end to end (issue 9): the zoo against its torch twins (tests/modern_models.py), and
every twin (plus GhostNet and a YOLO-style neck) through from_torch -> compile -> save ->
load_package -> Session.run against PyTorch.

Tolerance: fp32, max |tilefuse - torch| <= 1e-4 * max |torch| (the issue's criterion); measured
~1e-6 (float32 summation order over up to 50 layers).
Sizes: 64x64 inputs (every architecture here accepts it), batch 2 where it is cheap, to keep
the file at about a minute of CI.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tilefuse
import tilefuse.models as models
from tilefuse.interpreter import evaluate

import modern_models as mm

REL = 1e-4
SIZE = 64


def rel_err(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def torch_out(module, x):
    with torch.no_grad():
        y = module(torch.from_numpy(x))
    return [t.numpy() for t in (y if isinstance(y, (list, tuple)) else [y])]


def compiled_run(net, x, tmp_path, **kw):
    """compile -> save -> load_package -> Session.run: every output as a list."""
    path = tilefuse.compile(net, **kw).save(tmp_path / f"{net.name}.tfpkg")
    y = tilefuse.Session(tilefuse.load_package(path)).run(x)
    return y if isinstance(y, list) else [y]


ZOO_CASES = [("mobilenet_v2", 2), ("mobilenet_v3_large", 2), ("efficientnet_b0", 1), ("shufflenet_v2", 2),
             ("regnet_y_400mf", 2), ("convnext_tiny", 1), ("unet", 1), ("deeplabv3", 1)]


@pytest.mark.parametrize("name,batch", ZOO_CASES, ids=[c[0] for c in ZOO_CASES])
def test_zoo_model_matches_torch_twin(name, batch, tmp_path):
    net = models.get(name, seed=3, batch=batch, image_size=SIZE)
    twin = mm.load(name, net)
    x = np.random.default_rng(5).standard_normal(net.inputs[0].shape).astype(np.float32)
    (want,) = torch_out(twin, x)
    assert np.abs(want).max() > 0.1 and np.isfinite(want).all()
    # the spec (reference evaluator) and the compiled zoo net
    assert rel_err(evaluate(net, x)[0], want) <= REL
    assert rel_err(compiled_run(net, x, tmp_path)[0], want) <= REL
    # the twin through from_torch: same constants (state_dict names), same output
    imported = tilefuse.from_torch(twin, torch.from_numpy(x))
    assert {d.name for d in imported.constants()} == {d.name for d in net.constants()}
    assert rel_err(compiled_run(imported, x, tmp_path)[0], want) <= REL


@pytest.mark.parametrize("name", ["ghostnet", "yolo_neck"])
def test_test_only_models_through_from_torch(name, tmp_path):
    twin = mm.randomize(mm.build(name, 10), seed=2)
    x = np.random.default_rng(6).standard_normal((2, 3, SIZE, SIZE)).astype(np.float32)
    want = torch_out(twin, x)
    net = tilefuse.from_torch(twin, torch.from_numpy(x))
    got = compiled_run(net, x, tmp_path)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and rel_err(g, w) <= REL


def test_architecture_facts():
    """Parameter counts equal torchvision's published ones; the idioms reach the IR as expected."""
    published = {"mobilenet_v2": 3_504_872, "mobilenet_v3_large": 5_483_032, "efficientnet_b0": 5_288_548,
                 "shufflenet_v2": 2_278_604, "regnet_y_400mf": 4_344_144, "convnext_tiny": 28_589_128,
                 "deeplabv3": 42_004_074 - 2_365_205}    # torchvision counts the auxiliary FCN head too
    for name, count in published.items():
        net = models.get(name, image_size=SIZE)
        assert sum(d.value.size for d in net.constants() if "running_" not in d.name) == count, name
    ops = {o.op for o in models.shufflenet_v2(image_size=SIZE).ops}
    assert {"slice", "reshape", "permute", "concat", "mean"} <= ops        # chunk, shuffle, x.mean([2, 3])
    ops = {o.op for o in models.unet(image_size=SIZE).ops}
    assert {"conv_transpose2d", "concat"} <= ops
    dl = models.deeplabv3_resnet50(image_size=SIZE)
    assert dl.op("backbone.layer4.1.conv2").params["dilation"] == (4, 4)
    assert dl.op("backbone.layer4.0.conv2").params["dilation"] == (2, 2)   # the previous dilation
    assert dl.outputs[0].shape == (1, 21, SIZE, SIZE)


def test_compiler_fuses_the_modern_patterns():
    """SiLU / ReLU6 / Hardswish run in the conv epilogues; squeeze-excitation scales are fused
    into the projection conv; ConvNeXt's permute-LayerNorm-Linear-permute runs as channel_norm and
    1x1 convs with the layer scale folded in and the residual fused."""
    c = tilefuse.compile(models.efficientnet_b0(image_size=SIZE))
    ops = c.network.ops
    assert not any(o.op == "activation" and o.params["act"][0] == "silu" and
                   o.inputs[0].producer is not None and o.inputs[0].producer.op == "conv2d" for o in ops)
    assert sum(o.params.get("has_input_scale", False) for o in ops if o.op == "conv2d") == 16
    assert not any(o.op == "mul" for o in ops)
    twin = mm.load("convnext_tiny", models.convnext_tiny(image_size=SIZE))
    net = tilefuse.from_torch(twin, torch.zeros(1, 3, SIZE, SIZE))
    assert sum(o.op == "permute" for o in net.ops) == 2 * (18 + 5)          # imported as written
    opt = tilefuse.compile(net).network
    kinds = [o.op for o in opt.ops]
    assert "permute" not in kinds and "layer_norm" not in kinds and "mul" not in kinds
    assert kinds.count("channel_norm") == 18 + 5   # blocks, stem, 3 downsamplings, head
    blocks = [o for o in opt.ops if o.op == "conv2d" and o.params["has_residual"]]
    assert len(blocks) == 18


def test_source_line_of_an_unsupported_op_in_real_model_code():
    class Bad(mm.GhostModule):
        def forward(self, x):
            x1 = self.primary_conv(x)
            return torch.cumprod(x1, dim=1)          # not in the vocabulary

    with pytest.raises(tilefuse.UnsupportedOpError) as info:
        tilefuse.from_torch(Bad(3, 8).eval(), torch.zeros(1, 3, 8, 8))
    msg = str(info.value)
    assert "aten.cumprod" in msg and "test_modern_models.py" in msg and "torch.cumprod(x1, dim=1)" in msg


@pytest.mark.parametrize("name", ["shufflenet_v2", "unet"])
def test_tilefuse_run_new_zoo_models(name, capsys):
    from tilefuse.cli import main
    assert main(["run", name, "--image-size", "32", "--inputs", "1"]) == 0
    assert "-> OK" in capsys.readouterr().out
