"""Model zoo vs the torchvision architectures (tests/torch_zoo.py) through the reference evaluator.

fp32 everywhere; outputs compared with rtol = atol = 1e-4 (logits are O(1..10); the measured
difference is ~1e-5, from float32 summation order over up to 50 layers).
Image sizes: the smallest that keep the torchvision heads valid and cheap: ResNets 64x64,
tinynet 32x32; AlexNet and VGG16 need 224 for their adaptive pools (6x6 / 7x7 identity).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tilefuse.models as models
from tilefuse.errors import GraphError
from tilefuse.interpreter import evaluate
from tilefuse.ir import Network

import torch_zoo

RTOL = ATOL = 1e-4

# torchvision's published parameter counts (weights + biases, no BN running stats)
TORCHVISION_PARAMS = {"alexnet": 61_100_840, "vgg16": 138_357_544, "resnet18": 11_689_512,
                      "resnet50": 25_557_032}


def compare_with_torch(name: str, net: Network, seed: int = 123):
    x = np.random.default_rng(seed).standard_normal(net.inputs[0].shape).astype(np.float32)
    (y,) = evaluate(net, x)
    module = torch_zoo.load(name, net)
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    assert y.shape == want.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, want, rtol=RTOL, atol=ATOL)
    return y, module


def n_params(net: Network) -> int:
    return sum(d.value.size for d in net.constants() if "running_" not in d.name)


@pytest.mark.parametrize("name,kw", [
    ("tinynet", dict(batch=3)),
    ("resnet18", dict(batch=2, image_size=64)),
    ("resnet50", dict(batch=1, image_size=64)),
    ("alexnet", dict(batch=1, image_size=224)),
])
def test_zoo_matches_torch(name, kw):
    net = models.get(name, seed=7, **kw)
    y, module = compare_with_torch(name, net)
    # constant names are exactly the torch state_dict keys (BN step counters aside), same shapes
    sd = {k: v for k, v in module.state_dict().items() if not k.endswith("num_batches_tracked")}
    consts = {d.name: d.shape for d in net.constants()}
    assert set(consts) == set(sd)
    assert all(tuple(sd[k].shape) == s for k, s in consts.items())
    if name in TORCHVISION_PARAMS:
        assert n_params(net) == TORCHVISION_PARAMS[name]


def test_vgg16_matches_torch():
    """The one full-size VGG16 run (~15 GFLOP in the numpy im2col reference)."""
    net = models.vgg16(seed=1)
    assert n_params(net) == TORCHVISION_PARAMS["vgg16"]
    assert "avgpool" not in {op.name for op in net.ops}       # 7x7 -> 7x7 is an identity
    compare_with_torch("vgg16", net)


def test_resnet_architecture_details():
    net = models.resnet50(image_size=64)
    conv = {op.name: op for op in net.ops if op.op == "conv2d"}
    # v1.5: the stride sits on the 3x3 conv of the first bottleneck of stages 2-4
    assert conv["layer2.0.conv2"].params["stride"] == (2, 2)
    assert conv["layer2.0.conv1"].params["stride"] == (1, 1)
    assert conv["layer2.0.downsample.0"].params["stride"] == (2, 2)
    assert conv["conv1"].params["padding"] == (3, 3, 3, 3)
    assert net.data["layer1.0.downsample.0.weight"].shape == (256, 64, 1, 1)
    assert "layer1.1.downsample.0" not in conv
    names = [op.name for op in net.ops]
    assert len(names) == len(set(names))
    assert names[:4] == ["conv1", "bn1", "relu", "maxpool"] and names[-3:] == ["avgpool", "flatten", "fc"]
    assert ["layer4.2.relu", "layer4.2.relu_1", "layer4.2.add", "layer4.2.relu_2"] == \
        [n for n in names if n.startswith("layer4.2.") and ("relu" in n or "add" in n)]
    r18 = [op.name for op in models.resnet18(image_size=64).ops]
    assert "layer3.0.downsample.1" in r18 and "layer1.0.downsample.0" not in r18


def test_zoo_names_match_from_torch_import():
    """from_torch of the torchvision module gives the zoo's op and constant names exactly."""
    from tilefuse.frontend import from_torch
    for name, kw in [("resnet18", dict(image_size=64)), ("tinynet", {})]:
        net = models.get(name, **kw)
        imported = from_torch(torch_zoo.load(name, net), torch.zeros(net.inputs[0].shape))
        assert [(o.name, o.op) for o in imported.ops] == [(o.name, o.op) for o in net.ops]
        assert sorted(d.name for d in imported.constants()) == sorted(d.name for d in net.constants())


def test_seeds_are_deterministic():
    a, b = models.resnet18(seed=3, image_size=64), models.resnet18(seed=3, image_size=64, batch=4)
    c = models.resnet18(seed=4, image_size=64)
    sa, sb, sc = models.state_dict(a), models.state_dict(b), models.state_dict(c)
    assert list(sa) == list(sb)
    assert all(np.array_equal(sa[k], sb[k]) for k in sa)          # batch does not change weights
    assert not any(np.array_equal(sa[k], sc[k]) for k in sa)      # another seed changes all
    x = np.random.default_rng(0).standard_normal(a.inputs[0].shape).astype(np.float32)
    assert np.array_equal(evaluate(a, x)[0], evaluate(models.resnet18(seed=3, image_size=64), x)[0])


def test_bn_statistics_are_nontrivial():
    sd = models.state_dict(models.resnet18(image_size=64))
    var = np.concatenate([v for k, v in sd.items() if k.endswith("running_var")])
    mean = np.concatenate([v for k, v in sd.items() if k.endswith("running_mean")])
    gamma = np.concatenate([v for k, v in sd.items() if k.endswith("bn1.weight")])
    assert 0.5 <= var.min() and var.max() <= 2.0 and var.std() > 0.3
    assert np.abs(mean).max() > 0.3 and np.abs(mean).max() <= 0.5
    assert gamma.std() > 0.2


def test_activations_stay_order_one():
    """Kaiming scaling + centred BN stats: every intermediate of ResNet50 has RMS in [0.1, 20]."""
    net = models.resnet50(image_size=64)
    x = np.random.default_rng(1).standard_normal(net.inputs[0].shape).astype(np.float32)
    values = evaluate(net, x, return_all=True)
    rms = {k: float(np.sqrt(np.mean(v.astype(np.float64) ** 2))) for k, v in values.items()}
    bad = {k: r for k, r in rms.items() if not 0.1 <= r <= 20}
    assert not bad


def test_registry():
    assert models.NAMES == ("alexnet", "vgg16", "resnet18", "resnet50", "tinynet", "mobilenet_v2",
                            "mobilenet_v3_large", "efficientnet_b0", "shufflenet_v2", "regnet_y_400mf",
                            "convnext_tiny", "unet", "deeplabv3")
    net = models.get("TinyNet", batch=2, num_classes=5)
    assert net.inputs[0].shape == (2, 3, 32, 32) and net.outputs[0].shape == (2, 5)
    with pytest.raises(KeyError, match="unknown model 'lenet'; expected one of alexnet"):
        models.get("lenet")


def test_float64_zoo_model():
    net = models.tinynet(dtype=np.float64)
    assert {d.dtype for d in net.constants()} == {np.dtype(np.float64)}
    x = np.random.default_rng(2).standard_normal(net.inputs[0].shape)
    y32 = evaluate(models.tinynet(), x.astype(np.float32))[0]
    np.testing.assert_allclose(evaluate(net, x)[0], y32, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("hw,out,op", [((12, 12), 6, "avg_pool"), ((7, 7), 7, None),
                                       ((5, 5), 1, "global_avg_pool"), ((9, 9), (3, 9), "avg_pool"),
                                       ((8, 10), (None, 2), "avg_pool"), ((6, 4), (2, 1), "avg_pool")])
def test_adaptive_avg_pool_lowering(hw, out, op):
    net = Network("ap")
    x = net.input("x", (2, 3) + hw)
    y = models.adaptive_avg_pool(net, x, out, name="avgpool")
    if op is None:
        assert y is x and not net.ops
        return
    assert net.ops[-1].op == op
    net.output(y)
    xv = np.random.default_rng(3).standard_normal(x.shape).astype(np.float32)
    want = torch.nn.functional.adaptive_avg_pool2d(torch.from_numpy(xv), out).numpy()
    np.testing.assert_allclose(evaluate(net, xv)[0], want, rtol=1e-6, atol=1e-6)


def test_adaptive_avg_pool_uneven_sizes_use_the_adaptive_op():
    net = Network("ap")
    x = net.input("x", (1, 3, 7, 7))
    y = models.adaptive_avg_pool(net, x, 3, name="avgpool")
    assert net.ops[-1].op == "adaptive_avg_pool" and y.shape == (1, 3, 3, 3)
    net.output(y)
    xv = np.random.default_rng(4).standard_normal(x.shape).astype(np.float32)
    want = torch.nn.functional.adaptive_avg_pool2d(torch.from_numpy(xv), 3).numpy()
    np.testing.assert_allclose(evaluate(net, xv)[0], want, rtol=1e-6, atol=1e-6)
    alex = models.alexnet(image_size=256)        # features end at 7x7, pooled to 6x6
    assert alex.op("avgpool").op == "adaptive_avg_pool"


def test_load_into_torch_rejects_mismatch():
    net = models.tinynet(num_classes=10)
    with pytest.raises(KeyError, match="fc.weight"):
        models.load_into_torch(torch_zoo.build("tinynet", num_classes=7), net)
    with pytest.raises(KeyError, match="missing in net"):
        models.load_into_torch(torch_zoo.build("resnet18"), net)
