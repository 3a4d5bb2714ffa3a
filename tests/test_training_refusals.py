"""The Trainer refuses, naming the op, every network with an op it has no backward for (issue 9):
a gradient is never silently dropped. The ops it trains are in tests/test_training_modern.py (adaptive max pooling,
channel_shuffle, channel_norm there too) and (resize, adaptive average pooling, conv_transpose2d)
tests/test_training_segmentation.py."""
from __future__ import annotations

import numpy as np
import pytest

import tilefuse
import tilefuse.models as models
from tilefuse.errors import UnsupportedOpError
from tilefuse.training import SGD, Trainer


def small(build):
    net = tilefuse.Network("t")
    x = net.input("x", (2, 3, 8, 8))
    y = net.conv2d(x, np.random.default_rng(0).standard_normal((4, 3, 3, 3)) * 0.2, None, padding=1, name="conv")
    y = build(net, y)
    y = net.flatten(net.global_avg_pool(y, name="gap"), 1, name="flat")
    net.output(net.linear(y, np.ones((5, y.shape[1])) * 0.1, np.zeros(5), name="fc"))
    return net


@pytest.mark.parametrize("build,fragment", [
    (lambda n, y: n.add(y, n.constant("b", np.ones((1, 4, 1, 1), np.float32)), name="bc"),
     "bc: constant operand 'b' (1, 4, 1, 1) may be a trainable parameter or a fixed buffer"),
    (lambda n, y: n.where(y, "gt", n.constant("z", np.zeros(1, np.float32)), y,
                          n.constant("z2", np.ones((1, 4, 1, 1), np.float32)), name="w"),
     "w: constant operand 'z2' (1, 4, 1, 1) may be a trainable parameter"),
])
def test_trainer_refuses_ops_without_backward(build, fragment):
    with pytest.raises(UnsupportedOpError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        Trainer(small(build), SGD(lr=0.1))


def test_a_transposed_conv_with_a_fused_relu_is_refused():
    """The inference fusion's relu epilogue on a transposed conv (a UNet's up-convolution after compile): refused,
    not trained as if the relu were not there."""
    net = small(lambda n, y: n.conv_transpose2d(y, np.ones((4, 2, 2, 2), np.float32) * 0.1, None, stride=2,
                                                name="ct"))
    ct = next(op for op in net.ops if op.op == "conv_transpose2d")
    ct.params["relu"] = True
    with pytest.raises(UnsupportedOpError, match="ct: conv_transpose2d with a fused relu/residual epilogue"):
        Trainer(net, SGD(lr=0.1))


def test_trainer_refuses_fused_inference_epilogues_and_zoo_models():
    net = tilefuse.compile(models.mobilenet_v2(image_size=32, num_classes=4)).network
    with pytest.raises(UnsupportedOpError, match="epilogue"):
        Trainer(net, SGD(lr=0.1))
    net = models.mobilenet_v2(image_size=32, num_classes=4)        # the zoo network before fusion trains
    x = np.random.default_rng(0).standard_normal(net.inputs[0].shape).astype(np.float32)
    assert np.isfinite(Trainer(net, SGD(lr=0.1)).step(x, np.arange(net.inputs[0].shape[0]) % 4))


def test_supported_networks_still_train():
    net = small(lambda n, y: n.relu(y, name="r"))
    t = Trainer(net, SGD(lr=0.1))
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    loss = t.step(x, np.array([0, 3]))
    assert np.isfinite(loss)


@pytest.mark.parametrize("build", [
    lambda n, y: n.adaptive_avg_pool(y, (3, 3), name="ap"),
    lambda n, y: n.resize(y, scale_factor=2, name="up"),
    lambda n, y: n.conv_transpose2d(y, np.ones((4, 2, 2, 2), np.float32) * 0.1, None, stride=2, name="ct"),
    lambda n, y: n.adaptive_max_pool(y, (3, 3), name="ap"),
    lambda n, y: n.channel_shuffle(y, 2, name="cs"),
    lambda n, y: n.local_response_norm(y, 3, name="lrn"),
], ids=["adaptive_avg_pool", "resize", "conv_transpose2d", "adaptive_max_pool", "channel_shuffle", "lrn"])
def test_ops_once_refused_now_train(build):
    """These were refused here until the thirty-seventh session: their gradient now reaches the conv below."""
    t = Trainer(small(build), SGD(lr=0.1))
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    loss, grads = t.forward_backward(x, np.array([0, 3]))
    assert np.isfinite(loss) and np.abs(grads["conv.weight"]).max() > 0
