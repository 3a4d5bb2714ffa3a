"""ResNet18 training step, fused and unfused, against PyTorch autograd (issue 5).

Two routes: the zoo network run through the test's IR-to-torch interpreter, and a torch
module imported with from_torch (gradients keyed by the module's named_parameters(), the
exported state dict loaded back into the module). Tolerance: 2e-3 * max|reference| per
tensor (see test_training.py), float32, batch 2.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tilefuse.models as models
from tilefuse.training import SGD, Trainer, find_patterns

from test_training import assert_close, torch_step

REL = 2e-3


def test_resnet18_zoo_matches_torch():
    net = models.resnet18(seed=0, batch=2, image_size=64, num_classes=10)
    kinds = [p.kind for p in find_patterns(net)]
    assert kinds.count("3") == 8 and kinds.count("4-1") == 4 and kinds.count("4-2") == 3
    x = np.random.default_rng(0).standard_normal(net.inputs[0].shape).astype(np.float32)
    labels = [3, 7]
    loss_ref, g_ref, b_ref = torch_step(net, x, labels)
    for sched in ("unfused", "fused"):
        tr = Trainer(net, schedule=sched)
        loss, grads = tr.forward_backward(x, labels)
        assert loss == pytest.approx(loss_ref, rel=1e-4)
        for k in g_ref:
            assert_close(f"{sched} {k}", grads[k], g_ref[k], REL)
        sd = tr.state_dict()
        for k in b_ref:
            assert_close(f"{sched} {k}", sd[k], b_ref[k], REL)
        assert int(sd["bn1.num_batches_tracked"]) == 1


def test_resnet18_from_torch_step_and_state_dict():
    from tilefuse.frontend import from_torch
    import torch_zoo

    torch.manual_seed(0)
    module = torch_zoo.build("resnet18", num_classes=10)
    xt = torch.randn(2, 3, 64, 64)
    net = from_torch(module, xt)
    module.train()
    labels = torch.tensor([1, 4])
    F.cross_entropy(module(xt), labels).backward()
    tr = Trainer(net, SGD(0.1, momentum=0.9, weight_decay=5e-4), schedule="fused")
    loss, grads = tr.forward_backward(xt.numpy(), labels.numpy())
    names = dict(module.named_parameters())
    assert set(names) <= set(grads)
    for k, p in names.items():
        assert_close(k, grads[k], p.grad.numpy(), REL)
    # one SGD step on both sides, then the exported state dict loads into the module
    opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    opt.step()
    tr.optimizer.step(tr.params, {k: v for k, v in grads.items() if k in tr.params})
    sd = tr.to_torch_state_dict()
    ref = module.state_dict()
    for k, v in ref.items():
        assert k in sd, k
        if v.dtype.is_floating_point:
            assert_close(k, sd[k].numpy(), v.numpy(), REL)
    module.load_state_dict(sd, strict=True)
