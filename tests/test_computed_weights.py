"""Convolutions whose weights the network computes from its inputs: StyleGAN2's modulated conv (tests/zoo_blocks.py),
CondConv (timm's CondConv2d: per-sample kernels as a routing-weighted sum of expert kernels, the batch folded into
the groups), Dynamic Convolution (Chen et al. 2020, kaijieshi7's Dynamic_conv2d: attention over K kernels), a 1-D
conv with a computed kernel and 'same' padding. Such a conv is a conv2d op with a computed weight (and bias): the
interpreter's reference conv and the Trainer's conv kernels run it (their gradient for the weight flowing into the
graph), compile lowers it to im2col and a batched matmul (compiler.passes.lower_computed_convs). Checked here
against torch.nn.functional.conv2d and its autograd for odd shapes, groups, strides, dilations, asymmetric pads and
a computed bias; the models through from_torch (1 and 3 threads), both ONNX exporters (ONNX Runtime too) and one
Trainer step against PyTorch.

A conv weight folded at import from a parameter (timm's StdConv2d weight standardization) runs for inference; the
Trainer refuses it by name (training the folded tensor as a free parameter would train another network).
Tolerance: fp32, max |tilefuse - reference| <= 1e-4 * max |reference| (onnx_export.assert_close_to_max).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx_export import EXPORTERS, assert_close_to_max, check_export, check_from_torch
from test_training_modern import _step_against_torch

import tilefuse
from tilefuse.errors import GraphError, UnsupportedOpError
from tilefuse.interpreter import evaluate
from tilefuse.ir.network import Network
from tilefuse.training import SGD, Trainer

# (N, C, H, W, O, k, stride, padding (top, bottom, left, right), dilation, groups, bias)
CASES = [
    (1, 3, 7, 9, 5, 3, 1, (1, 1, 1, 1), 1, 1, None),
    (2, 4, 8, 8, 6, 3, 2, (0, 1, 2, 0), 1, 2, "constant"),
    (3, 6, 9, 5, 6, 3, 1, (2, 2, 2, 2), 2, 6, "computed"),          # depthwise, dilated
    (2, 8, 6, 7, 4, 1, 1, (0, 0, 0, 0), 1, 1, "computed"),
    (2, 6, 5, 6, 9, (2, 3), (1, 2), (1, 0, 0, 2), (2, 1), 3, "constant"),
]


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_conv_with_a_computed_weight_equals_torch(case):
    """The weight (and a computed bias) are network inputs: interpreter and compiled program (1 and 3 threads)
    against F.conv2d; the compiled network has no conv op left (the lowering) and its output keeps the conv's
    name; the Trainer's gradients of x, the weight and the bias (the conv output as per-pixel logits) against
    PyTorch's autograd."""
    n, c, h, w, o, k, stride, pad, dil, g, bias = case
    kh, kw = (k, k) if isinstance(k, int) else k
    r = np.random.default_rng(len(CASES) + n * c)
    x = r.standard_normal((n, c, h, w)).astype(np.float32)
    wt = r.standard_normal((o, c // g, kh, kw)).astype(np.float32)
    b = r.standard_normal(o).astype(np.float32)
    net = Network("computed")
    xd, wd = net.input("x", x.shape), net.input("w", wt.shape)
    bd = None if bias is None else b if bias == "constant" else net.input("b", b.shape)
    y = net.conv2d(xd, wd, bd, stride, pad, dil, g, name="conv")
    net.output(y)
    assert y.name == "conv" and [op.op for op in net.ops] == ["conv2d"]
    xs = [x, wt] + ([b] if bias == "computed" else [])
    xt = F.pad(torch.from_numpy(x), (pad[2], pad[3], pad[0], pad[1]))
    want = F.conv2d(xt, torch.from_numpy(wt), None if bias is None else torch.from_numpy(b), stride, 0, dil,
                    g).numpy()
    assert y.shape == want.shape
    assert_close_to_max(evaluate(net, xs)[0], want, what="interpreter")
    for t in (1, 3):
        cn = tilefuse.compile(net, threads=t)
        assert not any(op.op == "conv2d" for op in cn.network.ops) and cn.network.outputs[0].name == "conv"
        assert_close_to_max(cn.run(xs), want, what=f"{t} threads")
    labels = r.integers(0, o, (want.shape[0],) + want.shape[2:])
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, wt, b)]
    yt = F.conv2d(F.pad(ts[0], (pad[2], pad[3], pad[0], pad[1])), ts[1], None if bias is None else ts[2], stride,
                  0, dil, g)
    F.cross_entropy(yt, torch.from_numpy(labels)).backward()
    _, grads = Trainer(net, SGD(lr=0.1)).forward_backward(xs, labels)
    names = ("x", "w", "b" if bias == "computed" else "conv.bias")     # (a constant bias: a parameter)
    assert set(grads) == set(names[:2] + (names[2:] if bias else ()))
    for name, t in zip(names, ts):
        if name in grads:
            assert_close_to_max(grads[name], t.grad.numpy(), what=f"d{name}")


def test_a_computed_bias_beside_a_constant_weight_is_added_after_the_conv():
    """The conv keeps its constant weight (the fast kernels) and no bias; the computed bias is added as (1, O, 1, 1)
    (the random_torch seed 156000000's block: `F.conv2d(x, w, self.bias * x.mean().tanh())`, which the compiled
    program got wrong while the conv op took a computed bias)."""
    r = np.random.default_rng(7)
    x, b = r.standard_normal((2, 5, 7, 6)).astype(np.float32), r.standard_normal(4).astype(np.float32)
    wt = r.standard_normal((4, 5, 3, 3)).astype(np.float32)
    net = Network("bias")
    y = net.conv2d(net.input("x", x.shape), wt, net.input("b", b.shape), 1, 1, name="conv")
    net.output(y)
    conv = next(op for op in net.ops if op.op == "conv2d")
    assert all(d.is_constant for d in conv.inputs[1:])
    want = F.conv2d(torch.from_numpy(x), torch.from_numpy(wt), torch.from_numpy(b), padding=1).numpy()
    for t in (1, 2):
        assert_close_to_max(tilefuse.compile(net, threads=t).run([x, b]), want, what=f"{t} threads")


def test_ops_with_constant_slots_refuse_a_computed_tensor_there():
    """Built directly (add_op), a conv_transpose2d / norm with a computed weight is refused by name: the compiler
    would pack it as a constant (a conv2d takes one: compile lowers it)."""
    net = Network("slots")
    x, w = net.input("x", (1, 4, 6, 6)), net.input("w", (4, 4, 3, 3))
    net.add_op("conv2d", [x, w], {"padding": 1}, "conv")
    with pytest.raises(GraphError, match=r"up.*conv_transpose2d's weight 'w' .* is computed by the network"):
        net.conv_transpose2d(x, w, name="up")
    g = net.input("g", (4,))
    with pytest.raises(GraphError, match=r"gn.*group_norm's gamma 'g' \(4,\) is computed by the network"):
        net.group_norm(x, 2, g, np.zeros(4, np.float32), name="gn")


def test_a_computed_weight_of_the_wrong_shape_is_refused_naming_the_conv():
    net = Network("bad")
    x, w = net.input("x", (1, 4, 6, 6)), net.input("w", (8, 3, 3, 3))
    with pytest.raises(GraphError, match=r"modconv.*3 input channels per group, expected 2"):
        net.conv2d(x, w, groups=2, name="modconv")
    with pytest.raises(GraphError, match=r"modconv.*bias 'b' has shape \(4,\), expected \(8,\)"):
        net.conv2d(x, net.input("w2", (8, 4, 3, 3)), net.input("b", (4,)), name="modconv")


# ----------------------------------------------------------------------------- models as their code writes them

class CondConv2d(nn.Module):
    """timm's CondConv2d (efficientnet_blocks / cond_conv2d.py), static padding."""

    def __init__(self, in_channels, out_channels, kernel_size=3, stride=1, padding=1, dilation=1, groups=1,
                 bias=False, num_experts=4):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = (kernel_size, kernel_size)
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.num_experts = num_experts
        self.weight_shape = (self.out_channels, self.in_channels // self.groups) + self.kernel_size
        weight_num_param = 1
        for wd in self.weight_shape:
            weight_num_param *= wd
        self.weight = torch.nn.Parameter(torch.randn(self.num_experts, weight_num_param) * 0.2)
        if bias:
            self.bias_shape = (self.out_channels,)
            self.bias = torch.nn.Parameter(torch.randn(self.num_experts, self.out_channels) * 0.1)
        else:
            self.register_parameter('bias', None)

    def forward(self, x, routing_weights):
        B, C, H, W = x.shape
        weight = torch.matmul(routing_weights, self.weight)
        new_weight_shape = (B * self.out_channels, self.in_channels // self.groups) + self.kernel_size
        weight = weight.view(new_weight_shape)
        bias = None
        if self.bias is not None:
            bias = torch.matmul(routing_weights, self.bias)
            bias = bias.view(B * self.out_channels)
        # move batch elements with channels so each batch element can be efficiently convolved with separate kernel
        x = x.reshape(1, B * C, H, W)
        out = F.conv2d(x, weight, bias, stride=self.stride, padding=self.padding, dilation=self.dilation,
                       groups=self.groups * B)
        out = out.permute([1, 0, 2, 3]).view(B, self.out_channels, out.shape[-2], out.shape[-1])
        return out


class CondConvResidual(nn.Module):
    """timm's CondConvResidual (an inverted residual whose convs are CondConv2d, routed by a sigmoid of the pooled
    input), SE omitted."""

    def __init__(self, in_chs, out_chs, exp_ratio=4, stride=1, num_experts=4):
        super().__init__()
        mid_chs = in_chs * exp_ratio
        self.has_skip = stride == 1 and in_chs == out_chs
        self.routing_fn = nn.Linear(in_chs, num_experts)
        self.conv_pw = CondConv2d(in_chs, mid_chs, 1, padding=0, num_experts=num_experts)
        self.bn1 = nn.BatchNorm2d(mid_chs)
        self.conv_dw = CondConv2d(mid_chs, mid_chs, 3, stride=stride, padding=1, groups=mid_chs,
                                  num_experts=num_experts)
        self.bn2 = nn.BatchNorm2d(mid_chs)
        self.conv_pwl = CondConv2d(mid_chs, out_chs, 1, padding=0, bias=True, num_experts=num_experts)
        self.bn3 = nn.BatchNorm2d(out_chs)

    def forward(self, x):
        shortcut = x
        pooled_inputs = F.adaptive_avg_pool2d(x, 1).flatten(1)  # CondConv routing
        routing_weights = torch.sigmoid(self.routing_fn(pooled_inputs))
        x = F.relu(self.bn1(self.conv_pw(x, routing_weights)))
        x = F.relu(self.bn2(self.conv_dw(x, routing_weights)))
        x = self.bn3(self.conv_pwl(x, routing_weights))
        if self.has_skip:
            x = x + shortcut
        return x


class attention2d(nn.Module):
    """kaijieshi7 Dynamic-convolution-Pytorch attention2d."""

    def __init__(self, in_planes, ratios, K, temperature):
        super(attention2d, self).__init__()
        assert temperature % 3 == 1
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        if in_planes != 3:
            hidden_planes = int(in_planes * ratios) + 1
        else:
            hidden_planes = K
        self.fc1 = nn.Conv2d(in_planes, hidden_planes, 1, bias=False)
        self.fc2 = nn.Conv2d(hidden_planes, K, 1, bias=True)
        self.temperature = temperature

    def forward(self, x):
        x = self.avgpool(x)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.fc2(x).view(x.size(0), -1)
        return F.softmax(x / self.temperature, 1)


class Dynamic_conv2d(nn.Module):
    """kaijieshi7 Dynamic-convolution-Pytorch Dynamic_conv2d."""

    def __init__(self, in_planes, out_planes, kernel_size, ratio=0.25, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, K=4, temperature=34):
        super(Dynamic_conv2d, self).__init__()
        assert in_planes % groups == 0
        self.in_planes = in_planes
        self.out_planes = out_planes
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding
        self.dilation = dilation
        self.groups = groups
        self.bias = bias
        self.K = K
        self.attention = attention2d(in_planes, ratio, K, temperature)

        self.weight = nn.Parameter(torch.randn(K, out_planes, in_planes // groups, kernel_size, kernel_size) * 0.2,
                                   requires_grad=True)
        if bias:
            self.bias = nn.Parameter(torch.randn(K, out_planes) * 0.1)
        else:
            self.bias = None

    def forward(self, x):
        softmax_attention = self.attention(x)
        batch_size, in_planes, height, width = x.size()
        x = x.view(1, -1, height, width)
        weight = self.weight.view(self.K, -1)

        aggregate_weight = torch.mm(softmax_attention, weight).view(-1, self.in_planes, self.kernel_size,
                                                                    self.kernel_size)
        if self.bias is not None:
            aggregate_bias = torch.mm(softmax_attention, self.bias).view(-1)
            output = F.conv2d(x, weight=aggregate_weight, bias=aggregate_bias, stride=self.stride,
                              padding=self.padding, dilation=self.dilation, groups=self.groups * batch_size)
        else:
            output = F.conv2d(x, weight=aggregate_weight, bias=None, stride=self.stride, padding=self.padding,
                              dilation=self.dilation, groups=self.groups * batch_size)

        output = output.view(batch_size, self.out_planes, output.size(-2), output.size(-1))
        return output


class DynamicKernel1d(nn.Module):
    """A per-sample 1-D kernel from a linear layer (lightweight / dynamic convolution along a sequence of
    features), 'same' padding."""

    def __init__(self, ch=6, k=5):
        super().__init__()
        self.ch, self.k = ch, k
        self.kernel = nn.Linear(ch, ch * k)

    def forward(self, x):                          # (B, C, L)
        b, c, length = x.shape
        w = self.kernel(x.mean(2)).view(b * c, 1, self.k).softmax(-1)
        y = F.conv1d(x.reshape(1, b * c, length), w, padding="same", groups=b * c)
        return y.view(b, c, length)


class CondConvNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.blocks = nn.Sequential(CondConvResidual(8, 8), CondConvResidual(8, 12, stride=2))
        self.head = nn.Linear(12, num_classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


class DynamicConvNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = Dynamic_conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = Dynamic_conv2d(8, 16, 3, stride=2, padding=2, dilation=2, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.seq = DynamicKernel1d(16, 5)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        n, c, h, w = x.shape
        x = self.seq(x.view(n, c, h * w))
        return self.fc(x.mean(2))


MODELS = {"condconv": CondConvNet, "dynamic_conv": DynamicConvNet}


def _build(name, seed, train=False):
    torch.manual_seed(seed)
    m = MODELS[name]()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for mm in m.modules():
            if isinstance(mm, nn.BatchNorm2d):
                mm.weight.copy_(torch.rand(mm.weight.shape, generator=g) + 0.5)
                mm.bias.copy_(torch.randn(mm.bias.shape, generator=g) * 0.2)
                mm.running_mean.copy_(torch.randn(mm.running_mean.shape, generator=g) * 0.2)
                mm.running_var.copy_(torch.rand(mm.running_var.shape, generator=g) + 0.5)
    return m.train(train)


def _x(seed=0, n=2):
    return np.random.default_rng(seed).standard_normal((n, 3, 16, 16)).astype(np.float32)


@pytest.mark.parametrize("name", list(MODELS))
def test_from_torch_matches_pytorch(name):
    check_from_torch(lambda: _build(name, 3), _x())


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", list(MODELS))
def test_onnx_exports_match_pytorch_and_onnxruntime(name, exporter):
    check_export(lambda: _build(name, 4), _x(1, 3), exporter)


@pytest.mark.parametrize("name", list(MODELS))
def test_one_training_step_matches_pytorch(name):
    """The expert kernels are parameters read by a matmul as they are (a view of them): the Trainer trains them,
    the gradient flowing back through the lowered conv (matmul, im2col) and the routing."""
    module = _build(name, 5, train=True)
    x = torch.from_numpy(_x(2, 4))
    tr, grads = _step_against_torch(module, x, torch.tensor([0, 3, 7, 9]))
    experts = [n + ".weight" for n, m in module.named_modules() if isinstance(m, (CondConv2d, Dynamic_conv2d))]
    assert len(experts) in (2, 6) and all(np.abs(grads[k]).max() > 0 for k in experts)


class StdConv2d(nn.Conv2d):
    """timm's StdConv2d (BiT): the weight standardized in forward()."""

    def __init__(self, *args, eps=1e-6, **kwargs):
        super().__init__(*args, **kwargs)
        self.eps = eps

    def forward(self, x):
        weight = F.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None, training=True,
                              momentum=0., eps=self.eps).reshape_as(self.weight)
        return F.conv2d(x, weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class BiTBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = StdConv2d(3, 8, 3, padding=1)
        self.gn = nn.GroupNorm(2, 8)
        self.conv2 = StdConv2d(8, 10, 1)

    def forward(self, x):
        return self.conv2(F.relu(self.gn(self.conv1(x)))).mean((2, 3))


def test_weight_standardization_runs_and_its_training_is_refused_by_name():
    torch.manual_seed(0)
    m = BiTBlock().eval()
    x = torch.randn(2, 3, 8, 8)
    net = tilefuse.from_torch(m, x)
    assert_close_to_max(tilefuse.compile(net).run(x.numpy()), m(x).detach().numpy())
    with pytest.raises(UnsupportedOpError, match=r"conv1.*weight slot is derived from parameter 'conv1.weight'"):
        Trainer(net, SGD(lr=0.1))


class HyperLinear(nn.Module):
    """A hypernetwork's head: per-batch linear weights and bias computed from the input's statistics."""

    def __init__(self, c=6, out=5):
        super().__init__()
        self.c, self.out = c, out
        self.gen_w = nn.Linear(c, c * out)
        self.gen_b = nn.Linear(c, out)
        self.fixed = nn.Parameter(torch.randn(out, c) * 0.3)

    def forward(self, x):                          # (B, C, H, W)
        f = x.mean((2, 3))                         # (B, C)
        ctx = f.mean(0)                            # (C,): one weight for the batch
        w = self.gen_w(ctx).view(self.out, self.c).tanh()
        return F.linear(f, w, self.gen_b(ctx)) + F.linear(f, self.fixed, self.gen_b(ctx).sigmoid())


def test_linear_with_a_computed_weight_and_bias():
    check_from_torch(lambda: HyperLinear(), _x(3, 3)[:, :, :8, :8].repeat(2, axis=1))
