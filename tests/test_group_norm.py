"""group_norm: GroupNorm and InstanceNorm (groups = C) through every path.

The reference (float64) against PyTorch; the numba kernel against the reference on odd shapes, with fused
activations, bitwise equal for every thread count; `from_torch` (GroupNorm, InstanceNorm2d with and without
affine, with running statistics, GroupNorm(1, C)); both ONNX exporters (GroupNorm arrives as Reshape ->
InstanceNormalization -> Reshape -> Mul -> Add, which the compiler's `fold_group_norm` makes one op again);
hand-built GroupNormalization and InstanceNormalization nodes; the streamed schedule,
which ends before it with a reason; the trainer's backward against float64 PyTorch; packages that carry it."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import TensorProto, helper
from onnx_export import EXPORTERS, assert_close_to_max, export, ort_run, torch_run

import tilefuse
from tilefuse.errors import GraphError, UnsupportedOpError
from tilefuse.kernels import norm
from tilefuse.kernels import reference as ref

THREADS = (1, 2, 3, 5, 8, 16)


def _data(shape, seed=0, offset=0.0):
    r = np.random.default_rng(seed)
    c = shape[1]
    x = (r.standard_normal(shape) * r.uniform(0.5, 3.0) + offset).astype(np.float32)
    return x, r.uniform(0.5, 1.5, c).astype(np.float32), r.uniform(-0.5, 0.5, c).astype(np.float32)


SHAPES = [((2, 16, 5, 7), 4), ((1, 6, 1, 1), 3), ((3, 12, 9), 2), ((2, 8), 4), ((1, 30, 13, 11), 30),
          ((2, 5, 3, 4, 2), 1), ((1, 64, 33, 17), 8)]


@pytest.mark.parametrize("shape,groups", SHAPES)
def test_reference_matches_pytorch(shape, groups):
    x, g, b = _data(shape, offset=5.0)
    want = F.group_norm(torch.from_numpy(x).double(), groups, torch.from_numpy(g).double(),
                        torch.from_numpy(b).double(), 1e-5).numpy()
    got = ref.group_norm(x.astype(np.float64), g, b, groups, 1e-5)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("shape,groups", SHAPES)
@pytest.mark.parametrize("act", [None, ("relu",), ("silu", 0.0, 0.0), ("gelu", 0.0, 0.0)])
def test_kernel_matches_reference_bitwise_across_threads(shape, groups, act):
    # a channel mean far above its spread: the float64 sums keep the normalized values to float32 rounding
    x, g, b = _data(shape, seed=len(shape) + groups, offset=100.0)
    relu, a = (True, None) if act == ("relu",) else (False, act)
    want = ref.group_norm(x, g, b, groups, 1e-5, relu, a)
    outs = []
    for t in THREADS:
        out = np.full_like(x, np.nan)
        norm.group_norm(out, x, g, b, groups=groups, eps=1e-5, relu=relu, act=a, threads=t)
        outs.append(out)
    np.testing.assert_allclose(outs[0], want, rtol=0, atol=4e-6)
    for t, o in zip(THREADS[1:], outs[1:]):
        assert np.array_equal(o, outs[0]), f"{t} threads give other bits than 1"


BLOCKED_SHAPES = [((2, 16, 5, 7), 4), ((1, 40, 6, 5), 5), ((1, 40, 3, 4), 40), ((2, 20, 9, 3), 2), ((1, 48, 1, 1), 3),
                  ((1, 320, 8, 8), 32), ((2, 7, 4, 4), 7)]


@pytest.mark.parametrize("shape,groups", BLOCKED_SHAPES)
@pytest.mark.parametrize("act", [None, ("sigmoid", 0.0, 0.0), ("hardsigmoid", 1.0 / 6.0, 0.5)])
def test_blocked_kernel_matches_reference_with_zero_padded_lanes(shape, groups, act):
    """The NCHW16c form (groups straddling blocks, 16 lanes holding several groups, padded lanes): the reference
    to float32 rounding, the padded lanes 0 even where act(0) is not (sigmoid, hardsigmoid), bitwise equal for
    every thread count."""
    from tilefuse.kernels.conv import from_nchwc, to_nchwc
    x, g, b = _data(shape, seed=shape[1] + groups, offset=30.0)
    want = ref.group_norm(x, g, b, groups, 1e-5, False, act)
    xb = to_nchwc(x)
    outs = []
    for t in THREADS:
        ob = np.full_like(xb, np.nan)
        norm.group_norm(ob, xb, g, b, groups=groups, eps=1e-5, act=act, threads=t, layout="nchwc", channels=shape[1])
        outs.append(ob)
    np.testing.assert_allclose(from_nchwc(outs[0], shape[1]), want, rtol=0, atol=4e-6)
    o = outs[0]
    channel = np.arange(o.shape[1])[:, None] * 16 + np.arange(16)[None, :]        # (Cb, 16): channel of a lane
    padded = o.transpose(0, 1, 4, 2, 3)[:, channel >= shape[1]]                    # (N, padded lanes, H, W)
    assert padded.size == shape[0] * (-shape[1] % 16) * shape[2] * shape[3]
    assert not padded.any(), "padded lanes must stay 0"
    for t, o in zip(THREADS[1:], outs[1:]):
        assert np.array_equal(o, outs[0]), f"{t} threads give other bits than 1"


def test_group_norm_between_blocked_convs_runs_blocked():
    m = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.SiLU(), nn.Conv2d(32, 16, 3, padding=1))
    m = _affine(m).eval()
    x = np.random.default_rng(9).standard_normal((1, 16, 20, 18)).astype(np.float32)
    prog = tilefuse.compile(tilefuse.from_torch(m, torch.from_numpy(x)), threads=2)
    ks = [(i.kernel, i.params.get("layout")) for i in prog.lowered.instructions]
    assert ("group_norm", "nchwc") in ks and ks.count(("from_nchwc", None)) == 1, ks
    assert_close_to_max(prog.run(x), torch_run(m, x))


def test_a_constant_group_gives_beta():
    x = np.full((1, 4, 3, 3), 7.25, np.float32)
    x[:, 2:] = np.random.default_rng(1).standard_normal((1, 2, 3, 3))
    g, b = np.full(4, 2.0, np.float32), np.arange(4, dtype=np.float32)
    out = np.empty_like(x)
    norm.group_norm(out, x, g, b, groups=2, eps=1e-5)
    assert np.array_equal(out[0, :2], np.broadcast_to(b[:2, None, None], (2, 3, 3)))


class _Net(nn.Module):
    def __init__(self, norm_layer, act=None):
        super().__init__()
        self.conv = nn.Conv2d(5, 12, 3, padding=1)
        self.norm = norm_layer
        self.act = act or nn.Identity()
        self.head = nn.Conv2d(12, 7, 1)

    def forward(self, x):
        return self.head(self.act(self.norm(self.conv(x))))


def _affine(m):
    torch.manual_seed(3)
    for p in m.parameters():
        if p.dim() == 1 and p.shape[0] == 12:
            p.data.uniform_(-1.0, 1.0)
    return m


def _running(c):
    m = nn.InstanceNorm2d(c, affine=True, track_running_stats=True)
    m.running_mean.uniform_(-1, 1)
    m.running_var.uniform_(0.5, 2.0)
    return m


MODULES = {
    "group_norm": lambda: _Net(nn.GroupNorm(4, 12)),
    "group_norm_silu": lambda: _Net(nn.GroupNorm(3, 12), nn.SiLU(inplace=True)),
    "group_norm_one_group": lambda: _Net(nn.GroupNorm(1, 12), nn.ReLU()),
    "group_norm_no_affine": lambda: _Net(nn.GroupNorm(6, 12, affine=False)),
    "instance_norm": lambda: _Net(nn.InstanceNorm2d(12, affine=True), nn.LeakyReLU(0.1)),
    "instance_norm_no_affine": lambda: _Net(nn.InstanceNorm2d(12)),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_from_torch_matches_pytorch_and_fuses_the_activation(name):
    m = _affine(MODULES[name]()).eval()
    x = np.random.default_rng(0).standard_normal((2, 5, 11, 9)).astype(np.float32)
    net = tilefuse.from_torch(m, torch.from_numpy(x))
    assert [o.op for o in net.ops].count("group_norm") == 1
    prog = tilefuse.compile(net)
    assert [i.kernel for i in prog.lowered.instructions if i.kernel not in ("to_nchwc", "from_nchwc")] == \
        ["conv2d", "group_norm", "conv2d"]       # any activation rides in the group_norm kernel
    for t in (1, 3):
        assert_close_to_max(tilefuse.Session(prog, threads=t).run(x), torch_run(m, x), what=f"{name}, {t} threads")


def test_instance_norm_with_running_statistics_is_a_batch_norm():
    m = _Net(_running(12)).eval()
    x = np.random.default_rng(0).standard_normal((2, 5, 6, 6)).astype(np.float32)
    net = tilefuse.from_torch(m, torch.from_numpy(x))
    assert "group_norm" not in [o.op for o in net.ops]
    assert_close_to_max(tilefuse.compile(net).run(x), torch_run(m, x))


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", sorted(MODULES))
def test_both_exporters_import_as_one_group_norm(name, exporter):
    m = _affine(MODULES[name]()).eval()
    x = np.random.default_rng(1).standard_normal((2, 5, 10, 7)).astype(np.float32)
    blob = export(m, x, exporter)
    prog = tilefuse.compile(tilefuse.from_onnx(blob))
    kernels = [i.kernel for i in prog.lowered.instructions if i.kernel not in ("to_nchwc", "from_nchwc")]
    assert kernels == ["conv2d", "group_norm", "conv2d"], (prog.pass_log, kernels)
    y = prog.run(x)
    assert_close_to_max(y, torch_run(m, x), what="against PyTorch")
    assert_close_to_max(y, ort_run(blob, x), what="against ONNX Runtime")


def _node_model(op, opset, x_shape, scale, bias, **attrs):
    nodes = [helper.make_node(op, ["x", "s", "b"], ["y"], **attrs)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, x_shape)],
                              [onnx.numpy_helper.from_array(scale, "s"), onnx.numpy_helper.from_array(bias, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_group_normalization_matches_the_reference_and_onnxruntime():
    x, sc, bc = _data((2, 6, 4, 5), seed=4)
    m = _node_model("GroupNormalization", 21, x.shape, sc, bc, num_groups=3, epsilon=1e-3)
    got = tilefuse.compile(tilefuse.from_onnx(m)).run(x)
    np.testing.assert_allclose(got, ref.group_norm(x, sc, bc, 3, 1e-3), rtol=0, atol=4e-6)
    import onnxruntime as ort
    y = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, y, rtol=0, atol=1e-5)


def test_group_normalization_18_takes_scale_and_bias_per_group():
    """GroupNormalization-18 (the form opset 18 files carry): scale and bias of shape (G,), each group's value over
    its C / G channels; against the per-channel reference and ONNX Runtime (which runs the op's function body)."""
    x, _, _ = _data((2, 6, 4, 5), seed=5)
    sg = np.float32([0.5, 1.5, -2.0])
    bg = np.float32([0.1, -0.3, 0.7])
    m = _node_model("GroupNormalization", 18, x.shape, sg, bg, num_groups=3, epsilon=1e-4)
    got = tilefuse.compile(tilefuse.from_onnx(m)).run(x)
    np.testing.assert_allclose(got, ref.group_norm(x, np.repeat(sg, 2), np.repeat(bg, 2), 3, 1e-4), rtol=0, atol=4e-6)
    import onnxruntime as ort
    y = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, y, rtol=0, atol=1e-5)
    with pytest.raises(GraphError, match=r"scale has shape \(6,\); expected \(3,\) \(GroupNormalization-18: one "
                                         r"value per group\)"):
        tilefuse.from_onnx(_node_model("GroupNormalization", 18, x.shape, np.ones(6, np.float32), bg, num_groups=3))


def test_onnx_refusals_name_the_node_and_what_was_expected():
    x = (2, 6, 4, 5)
    one = np.ones(6, np.float32)
    with pytest.raises(GraphError, match=r"num_groups=4 does not divide the 6 channels"):
        tilefuse.from_onnx(_node_model("GroupNormalization", 21, x, one, one, num_groups=4))
    with pytest.raises(GraphError, match=r"B has shape \(5,\); expected \(6,\) \(one value per channel\)"):
        tilefuse.from_onnx(_node_model("InstanceNormalization", 17, x, one, one[:5]))


def test_network_refuses_groups_that_do_not_divide_the_channels():
    net = tilefuse.Network("n")
    x = net.input("x", (1, 6, 4, 4))
    with pytest.raises(GraphError, match=r"gn.*groups=4 does not divide the 6 channels.*expected a divisor of 6"):
        net.group_norm(x, 4, name="gn")


def test_a_real_instance_norm_of_reshaped_rows_is_not_folded():
    """Reshape -> InstanceNormalization with a scale that is not 1 -> Reshape: normalizes per (image, row of the
    3-D view) with that scale; the pass leaves it as it is, and the result still matches ONNX Runtime."""
    x, _, _ = _data((2, 6, 4, 4), seed=6)
    s = np.array([0.5, 2.0, -1.0], np.float32)
    nodes = [helper.make_node("Reshape", ["x", "shp"], ["r"]),
             helper.make_node("InstanceNormalization", ["r", "s", "b"], ["n"]),
             helper.make_node("Reshape", ["n", "back"], ["y"])]
    inits = [onnx.numpy_helper.from_array(np.array([2, 3, -1], np.int64), "shp"),
             onnx.numpy_helper.from_array(s, "s"), onnx.numpy_helper.from_array(np.zeros(3, np.float32), "b"),
             onnx.numpy_helper.from_array(np.array(x.shape, np.int64), "back")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)], inits)
    blob = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    prog = tilefuse.compile(tilefuse.from_onnx(blob))
    assert "0 reshaped instance norms" in " ".join(prog.pass_log)
    import onnxruntime as ort
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(prog.run(x), want, rtol=0, atol=1e-5)


def test_stream_schedule_ends_before_a_group_norm_with_the_reason():
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                      nn.GroupNorm(2, 8), nn.SiLU(), nn.Conv2d(8, 4, 3, padding=1)).eval()
    x = np.random.default_rng(2).standard_normal((1, 3, 40, 24)).astype(np.float32)
    prog = tilefuse.compile(tilefuse.from_torch(m, torch.from_numpy(x)), schedule="stream")
    ends = prog.stream.schedule.ends
    assert [(e[1], e[2]) for e in ends] == [("group_norm", "group_norm does not stream: it reads whole planes "
                                                           "(a global op)")]
    assert_close_to_max(prog.run(x), torch_run(m, x))


class _TrainNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(),
            nn.Conv2d(8, 12, 3, stride=2, padding=1, bias=False), nn.InstanceNorm2d(12, affine=True), nn.ReLU(),
            nn.Conv2d(12, 12, 1), nn.GroupNorm(1, 12, affine=False), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.fc = nn.Linear(12, 5)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


@pytest.mark.parametrize("schedule", ["fused", "unfused"])
def test_trainer_group_norm_gradients_match_float64_pytorch(schedule):
    """One step's loss and every parameter's gradient against PyTorch autograd in float64 (GroupNorm with 2 and
    1 groups, InstanceNorm2d with affine parameters; the fixed unit weight and zero bias of GroupNorm(affine=False)
    are not trained, as in PyTorch)."""
    import copy

    from tilefuse.training import Trainer
    torch.manual_seed(6)
    m = _TrainNet().eval()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, (nn.GroupNorm, nn.InstanceNorm2d)) and mod.weight is not None:
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.3, 0.3)
    x = np.random.default_rng(8).standard_normal((3, 3, 10, 9)).astype(np.float32)
    labels = np.array([0, 3, 4])
    net = tilefuse.from_torch(m, torch.from_numpy(x))
    tr = Trainer(net, schedule=schedule)
    assert not any(k.endswith((".unit_weight", ".zero_bias")) for k in tr.params)
    loss, grads = tr.forward_backward(x, labels)
    m64 = copy.deepcopy(m).double().train()
    ref = F.cross_entropy(m64(torch.from_numpy(x).double()), torch.from_numpy(labels))
    ref.backward()
    assert abs(loss - float(ref)) <= 1e-5 * max(1.0, abs(float(ref)))
    floor = 1e-5 * max(float(p.grad.abs().max()) for p in m64.parameters())
    for k, p in m64.named_parameters():
        want = p.grad.numpy()
        err = float(np.abs(grads[k] - want).max())
        assert err <= 1e-4 * float(np.abs(want).max()) + floor, (k, err, float(np.abs(want).max()))


def test_trainer_refuses_a_group_norm_of_features():
    from tilefuse.training import Trainer
    net = tilefuse.Network("n")
    x = net.input("x", (4, 6))
    y = net.linear(net.group_norm(x, 2, name="gn"), np.ones((3, 6), np.float32), name="fc")
    net.output(y)
    with pytest.raises(UnsupportedOpError, match=r"gn: group_norm of a rank-2 tensor \(4, 6\) has no backward"):
        Trainer(net)


def test_package_round_trip_and_a_crafted_groups_parameter_is_refused(tmp_path):
    from fuzz_nets import join, split

    from tilefuse.compiler.package import from_bytes, load_package, to_bytes
    from tilefuse.errors import PackageError
    m = _affine(MODULES["group_norm_silu"]()).eval()
    x = np.random.default_rng(3).standard_normal((1, 5, 8, 8)).astype(np.float32)
    prog = tilefuse.compile(tilefuse.from_torch(m, torch.from_numpy(x)))
    path = prog.save(tmp_path / "gn.tfpkg")
    np.testing.assert_array_equal(tilefuse.Session(load_package(path)).run(x), prog.run(x))
    # groups=5 does not divide the 12 channels: the loader's validator refuses the instruction (re-signed file)
    h, program, area = split(from_bytes(to_bytes(prog.package)))
    k = next(i for i, ins in enumerate(program) if ins.kernel == "group_norm")
    program[k].params["groups"] = 5
    with pytest.raises(PackageError, match=r"groups=5 does not divide the 12 channels"):
        from_bytes(join(h, program, area))
