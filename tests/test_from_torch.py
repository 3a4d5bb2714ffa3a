"""tilefuse.frontend.from_torch: user-defined torch models the zoo does not have, imported via
torch.export and run by the reference evaluator, against torch (eval mode).

fp32: rtol = atol = 1e-4 (activations O(1); measured ~1e-6). fp64: 1e-10.
Unsupported ops must raise UnsupportedOpError naming the ATen op, the node and the source line.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tilefuse
from tilefuse.errors import GraphError, UnsupportedOpError
from tilefuse.frontend import from_torch
from tilefuse.interpreter import evaluate

from modern_models import randomize as randomize_bn

TOL = {torch.float32: 1e-4, torch.float64: 1e-10}


def check_import(module: nn.Module, *shapes, dtype=torch.float32, seed: int = 0):
    """Import `module`, run both on the same random inputs, compare every output."""
    torch.manual_seed(seed)
    module = randomize_bn(module.to(dtype), seed).eval()
    xs = [torch.randn(s, dtype=dtype) for s in shapes]
    net = from_torch(module, xs[0] if len(xs) == 1 else tuple(xs))
    net.lint()
    got = evaluate(net, [x.numpy() for x in xs])
    with torch.no_grad():
        want = module(*xs)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == tuple(w.shape) and g.dtype == np.dtype(str(dtype).replace("torch.", ""))
        np.testing.assert_allclose(g, w.numpy(), rtol=TOL[dtype], atol=TOL[dtype])
    return net


# ----------------------------------------------------------------------------- models that import

class OddNet(nn.Module):
    """Odd channels, rectangular kernels, stride (2, 1), dilation, depthwise with 'same'
    padding, BN without affine, ceil-mode max pool, avg pool without padding counted."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(5, 7, (3, 5), stride=(2, 1), padding=(1, 2), dilation=(1, 2))
        self.bn1 = nn.BatchNorm2d(7, eps=1e-3)
        self.act = nn.ReLU(inplace=True)
        self.dw = nn.Conv2d(7, 14, 3, groups=7, padding="same", dilation=2, bias=False)
        self.bn2 = nn.BatchNorm2d(14, affine=False)
        self.pool1 = nn.MaxPool2d(3, 2, 1, ceil_mode=True)
        self.pool2 = nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.flat = nn.Flatten()
        self.fc = nn.Linear(14, 9)
        self.sm = nn.Softmax(dim=1)

    def forward(self, x):
        x = self.act(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.dw(x)))
        x = self.pool2(self.pool1(x))
        return self.sm(self.fc(self.flat(self.gap(x))))


class Inception(nn.Module):
    """Concat branches (valid / even-kernel 'same' / pooled), a residual add, LRN, dropout,
    identity, functional ops, view-flatten and two outputs."""

    def __init__(self, c=6):
        super().__init__()
        self.b1 = nn.Conv2d(c, 3, 1)
        self.b2 = nn.Sequential(nn.Conv2d(c, 4, 1), nn.ReLU(), nn.Conv2d(4, 5, (2, 4), padding="same"))
        self.b3 = nn.Conv2d(c, 2, 3, padding="valid")
        self.pad_pool = nn.MaxPool2d(3, 1, 1)
        self.mix = nn.Conv2d(3 + 5 + c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.lrn = nn.LocalResponseNorm(5, alpha=1e-2, beta=0.75, k=2.0)
        self.drop = nn.Dropout(0.3)
        self.ident = nn.Identity()
        self.head = nn.Linear(2 * 9 * 7, 4)

    def forward(self, x):
        y = torch.cat([self.b1(x), self.b2(x), self.pad_pool(x)], dim=1)
        y = self.bn(self.mix(y))
        y += x                                   # residual (in-place add)
        y = torch.relu(y)
        y = self.lrn(self.ident(y))
        side = self.b3(self.drop(y))             # 'valid': 11x9 -> 9x7
        side = side.view(side.size(0), -1)
        return y, self.head(side)


class MultiInput(nn.Module):
    """Two inputs, a shared (reused) conv, torch.add, functional pools, tensor methods."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 2 * 2, 5)

    def forward(self, a, b):
        ya = self.bn(self.conv(a))
        yb = self.bn(self.conv(b))               # the same module (and constants) twice
        y = torch.add(ya, yb).relu()
        y = F.max_pool2d(y, 2, ceil_mode=True)
        z = F.avg_pool2d(y, 3, stride=1, padding=1, count_include_pad=False)
        z = F.adaptive_avg_pool2d(z, (2, 2))
        z = torch.flatten(z, start_dim=1)
        logits = self.fc(z)
        return [F.softmax(logits, dim=-1), y.flatten(1), z.reshape(z.shape[0], -1),
                y.view(y.size(0), y.size(1), -1)]       # a flatten from dim 2


class ResidualStack(nn.Module):
    """Residual blocks with projection shortcuts, strided 5x5, F.relu_ and operator.add."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 10, 5, stride=2, padding=2, bias=False)
        self.bn0 = nn.BatchNorm2d(10)
        self.blocks = nn.ModuleList()
        for cin, cout, s in [(10, 10, 1), (10, 19, 2), (19, 19, 1)]:
            self.blocks.append(nn.ModuleDict({
                "conv": nn.Conv2d(cin, cout, 3, stride=s, padding=1, bias=False),
                "bn": nn.BatchNorm2d(cout),
                "short": nn.Identity() if (cin, s) == (cout, 1) else
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride=s, bias=False), nn.BatchNorm2d(cout)),
            }))
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(19, 3)

    def forward(self, x):
        x = F.relu_(self.bn0(self.stem(x)))
        for blk in self.blocks:
            x = F.relu(blk["bn"](blk["conv"](x)) + blk["short"](x))
        return self.fc(torch.flatten(self.pool(x), 1))


def test_oddnet():
    check_import(OddNet(), (1, 5, 17, 23))
    check_import(OddNet(), (3, 5, 9, 12), seed=1)


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
def test_inception_concat_residual_two_outputs():
    net = check_import(Inception(), (2, 6, 11, 9))
    assert len(net.outputs) == 2
    ops = {o.name: o for o in net.ops}
    assert ops["b2.2"].params["padding"] == (0, 1, 1, 2)   # even kernel 'same': extra pad after
    assert ops["cat"].op == "concat" and ops["add"].op == "add"
    assert "ident" not in ops                                 # Identity vanishes
    assert ops["drop"].op == "dropout"                        # (the Trainer's mask; compile removes it)
    assert not any(o.op == "dropout" for o in tilefuse.compile(net).network.ops)
    assert ops["view"].op == "flatten"


def test_multi_input_shared_module():
    net = check_import(MultiInput(), (1, 3, 7, 7), (1, 3, 7, 7))
    assert [d.name for d in net.inputs] == ["a", "b"]
    assert len(net.outputs) == 4 and net.outputs[3].shape == (1, 8, 16)
    consts = [d.name for d in net.constants()]
    assert sorted(consts) == sorted(["conv.weight", "conv.bias", "bn.weight", "bn.bias",
                                     "bn.running_mean", "bn.running_var", "fc.weight", "fc.bias"])
    names = [o.name for o in net.ops]
    assert names[:4] == ["conv", "bn", "conv_1", "bn_1"]


def test_residual_stack_names():
    net = check_import(ResidualStack(), (2, 3, 20, 20))
    names = [o.name for o in net.ops]
    assert "blocks.1.short.0" in names and "blocks.1.short.1" in names
    assert net.op("blocks.1.conv").params["stride"] == (2, 2)
    assert net.data["blocks.1.short.1.running_var"].shape == (19,)


def test_float64_model():
    net = check_import(OddNet(), (1, 5, 10, 10), dtype=torch.float64)
    assert {d.dtype for d in net.constants()} == {np.dtype(np.float64)}


def test_training_mode_is_restored_and_ignored():
    m = randomize_bn(OddNet())
    m.train()
    x = torch.randn(1, 5, 12, 12)
    net = from_torch(m, x)
    assert m.training and m.bn1.training
    with torch.no_grad():
        want = m.eval()(x).numpy()              # import uses inference semantics
    np.testing.assert_allclose(evaluate(net, x.numpy())[0], want, rtol=1e-4, atol=1e-4)


def test_returning_an_input_or_a_tensor_twice():
    class Echo(nn.Module):
        def forward(self, x):
            y = torch.relu(x)
            return x, y, y

    net = check_import(Echo(), (1, 2, 3, 3))
    assert len(net.outputs) == 3 and len({id(d) for d in net.outputs}) == 3


def test_name_argument_and_input_types():
    net = from_torch(nn.Sequential(nn.ReLU()), torch.zeros(1, 2, 3, 3), name="seq")
    assert net.name == "seq" and [o.name for o in net.ops] == ["0"]
    with pytest.raises(TypeError, match="torch.nn.Module"):
        from_torch(lambda x: x, torch.zeros(1))
    with pytest.raises(TypeError, match=r"example_input\[0\] is ndarray"):
        from_torch(nn.ReLU(), (np.zeros((1, 2)),))
    with pytest.raises(GraphError, match="takes 1 tensor inputs"):
        from_torch(nn.ReLU(), (torch.zeros(1, 2), torch.zeros(1, 2)))


# ----------------------------------------------------------------------------- unsupported ops

class Wrap(nn.Module):
    def __init__(self, fn, **mods):
        super().__init__()
        self.fn = fn
        for k, v in mods.items():
            setattr(self, k, v)

    def forward(self, x):
        return self.fn(self, x)


UNSUPPORTED = [
    # (module, input shape, fragments the message must contain)
    (Wrap(lambda s, x: s.c(x), c=nn.Conv3d(3, 3, 1)), (1, 3, 2, 8, 8),
     ["aten.convolution", "a 3-D convolution", "return self.fn(self, x)", "1-D (Conv1d, ConvTranspose1d)"]),
    (Wrap(lambda s, x: F.batch_norm(x, s.bn.running_mean, s.bn.running_var, training=True), bn=nn.BatchNorm2d(3)),
     (1, 3, 8, 8), ["batch statistics", "updates running_mean", "eval mode"]),
    (Wrap(lambda s, x: x.erfinv()), (1, 3, 8, 8), ["ATen op aten.erfinv"]),
    (Wrap(lambda s, x: torch.fmax(x, x * 0.5)), (1, 3, 8, 8), ["aten.fmax", "supported ATen ops:"]),
    (Wrap(lambda s, x: torch.cumprod(x, 1)), (1, 3, 8, 8), ["ATen op aten.cumprod.default", "supported ATen ops:"]),
    (Wrap(lambda s, x: torch.sort(x.flatten(1), 1)[0]), (1, 3, 8, 8), ["aten.sort.default along an axis of 192 values",
                                                                     "up to 64 values"]),
    (Wrap(lambda s, x: x.pow(x)), (1, 3, 8, 8), ["aten.pow.Tensor_Tensor", "a computed exponent",
                                                 "in forward: return self.fn(self, x)"]),
    (Wrap(lambda s, x: x.half()), (1, 3, 8, 8), ["dtype conversion to torch.float16"]),
    (Wrap(lambda s, x: torch.ops.aten.elu(x, 1.0, 1.0, 0.5)), (1, 3, 8, 8), ["elu with scale=1.0, input_scale=0.5"]),
    (Wrap(lambda s, x: torch.div(x, x + 1, rounding_mode="floor")), (1, 3, 8, 8),
     ["floor division (x // d) by a computed tensor"]),
    (Wrap(lambda s, x: s.p(x)[1].float(), p=nn.MaxPool2d(2, return_indices=True)), (1, 3, 8, 8),
     ["indices of max pooling"]),
]


@pytest.mark.parametrize("pad,mode", [((-1, 0, 0, 0), "constant"), ((0, -1, 2, -2), "constant"),
                                      ((-1, 2, 1, -2), "reflect"), ((3, -2, 0, 0), "reflect"),
                                      ((-2, 1, -1, 3), "replicate"), ((0, 0, 0, 0, -1, 1), "constant")])
def test_negative_pads_crop_like_pytorch(pad, mode):
    """F.pad with negative sizes crops (UNet code matching a skip's size with `F.pad(x, (0, dx, 0, dy))`); torch
    pads first and crops after, so a reflection may use values the crop removes ((3, -2) on a width of 5)."""
    module = Wrap(lambda s, x: s.c(F.pad(s.c(x), pad, mode=mode)), c=nn.Conv2d(3, 3, 3, padding=1))
    net = check_import(module, (2, 3, 5, 5))
    assert {op.op for op in net.ops} >= ({"slice", "pad"} if max(pad) > 0 else {"slice"})
    x = torch.randn(2, 3, 5, 5)
    with torch.no_grad():
        want = module(x).numpy()
    got = tilefuse.Session(tilefuse.compile(net, threads=2)).run(x.numpy())
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_negative_pads_that_crop_everything_are_refused():
    with pytest.raises(GraphError, match=r"crop all of axis 3 \(size 5\)"):
        from_torch(Wrap(lambda s, x: F.pad(x, (-3, -2))), torch.zeros(1, 3, 5, 5))


@pytest.mark.parametrize("module,shape,fragments", UNSUPPORTED, ids=lambda v: "" if not isinstance(v, list) else
                         v[0].split()[0][:30])
def test_unsupported_op_raises(module, shape, fragments):
    with pytest.raises(UnsupportedOpError) as info:
        from_torch(module, torch.zeros(shape))
    msg = str(info.value)
    assert "not supported by tilefuse.from_torch" in msg
    assert "test_from_torch.py:" in msg                      # the source line it came from
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"


def test_direct_parameter_access_and_functional_conv():
    """F.conv2d(x, self.w) with a raw Parameter imports (torch.export sees a parameter)."""
    class Raw(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 3, 1, 1))

        def forward(self, x):
            return F.conv2d(x, self.w)

    net = check_import(Raw(), (1, 3, 4, 4))
    assert [d.name for d in net.constants()] == ["w"]


def test_data_dependent_control_flow_raises():
    class Branchy(nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x

    with pytest.raises(UnsupportedOpError, match="torch.export could not export Branchy"):
        from_torch(Branchy(), torch.zeros(1, 3, 4, 4))


def test_unsupported_is_never_skipped():
    """An unsupported op in the middle of a supported chain still fails the import."""
    class Erfinv(nn.Module):
        def forward(self, x):
            return torch.erfinv(x)

    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), Erfinv(), nn.Conv2d(4, 4, 1))
    with pytest.raises(UnsupportedOpError, match=r"aten.erfinv.default.*torch.erfinv\(x\)"):
        from_torch(m, torch.zeros(1, 3, 8, 8))


class Idioms(nn.Module):
    """What torch.fx could not trace and torch.export resolves: x.ndim, x.size(1) // g, shape-
    dependent ifs, slicing with steps, chunk, in-place ops, scalar arithmetic, F.pad, reflect
    padding_mode, an adaptive pool to an uneven size, x.view with computed sizes."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(6, 6, 3, padding=1, padding_mode="reflect")
        self.p = nn.AdaptiveAvgPool2d(3)

    def forward(self, x):
        if x.ndim == 4 and x.shape[-1] > 4:
            x = self.c(x)
        g = 2
        n, c, h, w = x.size()
        x = x.view(n, g, c // g, h, w).transpose(1, 2).contiguous().view(n, -1, h, w)
        a, b = x.chunk(2, dim=1)
        b = b * 2.0 + 1
        b.sub_(0.5)
        x = torch.cat([a[:, :, ::2], b[:, :, 1::2]], dim=1)
        x = F.pad(x, (1, 0, 2, 1))
        x = self.p(x)
        return x.view(x.size(0), 6, -1).mean(-1)


def test_shape_logic_resolves_like_pytorch():
    net = check_import(Idioms(), (2, 6, 8, 7))
    kinds = {o.op for o in net.ops}
    assert {"pad", "reshape", "permute", "slice", "concat", "adaptive_avg_pool", "mean"} <= kinds


def test_docs_ops_table_lists_every_ir_op_and_aten_op():
    """docs/ops.md: one row per IR op, and every ATen op from_torch maps named in the ATen column."""
    from pathlib import Path

    from tilefuse.frontend.torch_export import _ATEN
    from tilefuse.ir.ops import OPS
    text = (Path(__file__).resolve().parents[1] / "docs" / "ops.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and (cells[0] in OPS or cells[0] == "(composed)"):
            rows[cells[0]] = cells[1]
    assert set(rows) - {"(composed)"} == set(OPS)
    aten_column = " ".join(rows.values())
    missing = [op for op in _ATEN if op not in aten_column.replace(",", " ").split() and op not in aten_column]
    assert not missing, missing


def test_clamp_at_negative_zero_keeps_the_sign_of_zero():
    """torch.clamp(x, min=-0.0) is -0.0 for negative x (1 / it is -inf), standalone or fused after a conv;
    tilefuse made it a relu (+0.0, +inf after the reciprocal)."""
    torch.manual_seed(0)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(16, 16, 3, padding=1)

        def forward(self, x):
            return 1 / torch.clamp(self.c(x), min=-0.0) + 1 / torch.clamp(x, min=-0.0)

    m, x = M().eval(), torch.randn(1, 16, 10, 10)
    with torch.no_grad():
        want = m(x).numpy()
    assert np.isneginf(want).sum() > 100
    net = tilefuse.from_torch(m, (x,))
    got = np.asarray(tilefuse.Session(tilefuse.compile(net)).run(x.numpy()))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))          # the signs of the zeros
    np.testing.assert_allclose(got, want, rtol=1e-3)                             # the rest: conv rounding, 1/x


class FunctionalLRN(nn.Module):
    """AlexNet-era code calling F.local_response_norm directly (PyTorch decomposes it to a 3-D average pool)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.lrn = nn.LocalResponseNorm(5)

    def forward(self, x):
        y = F.local_response_norm(torch.relu(self.conv(x)), 3, alpha=2e-4, beta=0.7, k=2.0)
        return self.lrn(y)


def test_functional_local_response_norm_is_one_op_and_f_is_restored():
    torch.manual_seed(0)
    m, x = FunctionalLRN().eval(), torch.randn(2, 3, 9, 9)
    net = from_torch(m, x)
    assert [op.op for op in net.ops].count("local_response_norm") == 2
    with torch.no_grad():
        np.testing.assert_allclose(tilefuse.compile(net).run(x.numpy()), m(x).numpy(), rtol=1e-5, atol=1e-6)
    assert F.local_response_norm.__module__ == "torch.nn.functional"      # the export's stand-in is gone


class RReLUNet(nn.Module):
    """nn.RReLU and F.rrelu in eval mode: a leaky ReLU of slope (lower + upper) / 2."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.act = nn.RReLU(0.1, 0.3)

    def forward(self, x):
        y = self.act(self.conv(x))
        return F.rrelu(y - 0.5, training=self.training)


def test_rrelu_at_inference_is_its_mean_slope_leaky_relu():
    net = check_import(RReLUNet(), (2, 3, 7, 5))
    slopes = sorted(op.params["act"][1] for op in net.ops if op.op == "activation")
    assert slopes == pytest.approx([0.2, (1 / 8 + 1 / 3) / 2])


class _TwoSlicesOfABuffer(torch.nn.Module):
    """SSD's box decoding and FCOS's locations: two slices / selects of one buffer (`p[..., 2:]`, `p[..., :2]`;
    `q[:, 0]`, `q[:, 1]`), which fold to constants of one name ('p.slice', 'q.select')."""

    def __init__(self):
        super().__init__()
        self.register_buffer("p", torch.arange(8.0).view(2, 4))
        self.register_buffer("q", torch.arange(8.0).view(4, 2) * 0.5)

    def forward(self, x):
        y = x * self.p[..., 2:] + self.p[..., :2]
        return torch.stack([y[:, 0] - self.q[:2, 0], y[:, 1] - self.q[:2, 1]], 1)


def test_two_folds_of_one_constant_by_one_op_stay_two_constants():
    """Both folds got the first one's network constant (one key per constant): y took p's first two columns twice
    (max error 2.0), FCOS's y coordinates its x ones."""
    m, x = _TwoSlicesOfABuffer(), torch.randn(2, 2)
    net = tilefuse.from_torch(m, x)
    np.testing.assert_array_equal(tilefuse.compile(net).run(x.numpy()), m(x).numpy())
    assert len([d for d in net.constants() if d.name.startswith("p.slice")]) == 2


class _StoresOnSelf(torch.nn.Module):
    """FocalNet's `self.modulator = self.h(ctx_all)` and YOLO's anchor cache: a forward that stores tensors on
    the module."""

    def __init__(self):
        super().__init__()
        self.c = torch.nn.Conv2d(3, 4, 1)
        self.anchors, self.shape = torch.zeros(4), None

    def forward(self, x):
        self.modulator = self.c(x)
        if self.shape != x.shape:
            self.anchors, self.shape = torch.arange(4.0), x.shape
        return self.modulator.mean((2, 3)) + self.anchors


def test_import_leaves_the_modules_attributes_as_they_were():
    """torch.export ran forward() on fake tensors and left them on the module: a deepcopy or an eager run of the
    user's module afterwards failed ('Cannot access data pointer of Tensor (e.g. FakeTensor ...)')."""
    import copy
    m, x = _StoresOnSelf(), torch.randn(1, 3, 8, 8)
    anchors = m.anchors
    net = tilefuse.from_torch(m, x)
    assert not hasattr(m, "modulator") and m.anchors is anchors and m.shape is None and m.training
    copy.deepcopy(m)
    with torch.no_grad():
        np.testing.assert_allclose(tilefuse.compile(net).run(x.numpy()), m(x).numpy(), rtol=1e-6, atol=1e-6)
    assert type(m.modulator) is torch.Tensor
