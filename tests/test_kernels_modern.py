"""Runtime kernels of the modern ops (issue 9) against the reference evaluator, compiled and run
through a Session, in NCHW and in the blocked NCHW16c layout the layout pass keeps between
convolutions (channel counts not multiples of 16, so padded lanes are exercised).

fp32 tolerances: exact ops (movement, nearest resize, concat) within 1e-6 (they pass conv
results through); arithmetic ones 1e-5 relative to the output's max (float32 sums of <= a few
hundred terms, summation order differs).
"""
from __future__ import annotations

import numpy as np
import pytest

import tilefuse
from tilefuse.interpreter import evaluate

TOL = 1e-5
RNG = np.random.default_rng(11)


def w(shape, scale=None):
    fan = int(np.prod(shape[1:]))
    return (RNG.standard_normal(shape) * (scale or np.sqrt(2.0 / fan))).astype(np.float32)


def run_both(net, xs, threads=None, tmp=None):
    """compile -> save -> load_package (every instruction through its validator) -> run."""
    import tempfile
    from pathlib import Path
    want = evaluate(net, xs)
    c = tilefuse.compile(net, threads=threads)
    with tempfile.TemporaryDirectory() as d:
        pkg = tilefuse.load_package(c.save(Path(d) / "n.tfpkg"))
    got = tilefuse.Session(pkg, threads=threads).run(xs if len(xs) > 1 else xs[0])
    got = got if isinstance(got, list) else [got]
    for g, v in zip(got, want):
        assert g.shape == v.shape
        np.testing.assert_allclose(g, v, rtol=0, atol=TOL * max(1.0, float(np.abs(v).max())))
    return c


C = 40   # 40 channels: 3 blocks of 16, the last half padding


def between_convs(op, c=C, hw=(11, 9), batch=2, c_out=None):
    """x -> conv3x3 (blocked) -> op -> conv3x3 (blocked) -> output."""
    net = tilefuse.Network("blk")
    x = net.input("x", (batch, 32, *hw))
    y = net.conv2d(x, w((c, 32, 3, 3)), w((c,), 0.1), padding=1, name="c1")
    y = op(net, y)
    y = net.conv2d(y, w((48, y.shape[1], 3, 3)), None, padding=1, name="c2")
    net.output(y)
    return net


BLOCKED_CASES = {
    # after a pool (a conv would take the activation into its epilogue)
    "sigmoid": lambda n, y: n.sigmoid(n.max_pool(y, 3, 1, 1)),     # act(0) != 0: padded lanes rewritten
    "hardswish": lambda n, y: n.hardswish(n.max_pool(y, 3, 1, 1)),
    "clip": lambda n, y: n.activation(n.max_pool(y, 3, 1, 1), "clip", min=0.5, max=2.0),
    "prelu": lambda n, y: n.prelu(y, np.linspace(0.1, 0.9, C)),
    "se_mul": lambda n, y: n.mul(y, n.sigmoid(n.mean(y, (2, 3), True))),
    # after a pool (a conv would fold per-channel constants into its weights)
    "channel_add": lambda n, y: n.add(n.max_pool(y, 3, 1, 1),
                                      n.constant("bias", np.linspace(-1, 1, C, dtype=np.float32).reshape(1, C, 1, 1))),
    "scalar_div": lambda n, y: n.div(n.max_pool(y, 3, 1, 1), 3.0),
    "sub_full": lambda n, y: n.sub(y, n.relu(y)),
    "resize_nearest": lambda n, y: n.resize(y, scale_factor=2),
    "resize_bilinear": lambda n, y: n.resize(y, size=(7, 13), mode="bilinear"),
    "pad_reflect": lambda n, y: n.pad(y, (0, 0, 0, 0, 1, 2, 2, 0), "reflect"),
    "pad_const": lambda n, y: n.pad(y, (0, 0, 0, 0, 1, 0, 0, 1), "constant", 0.5),
    "slice_channels": lambda n, y: n.slice(y, 1, 3, 37, 2),
    "slice_h": lambda n, y: n.slice(y, 2, 1, None, 2),
    "channel_norm": lambda n, y: n.channel_norm(n.max_pool(y, 3, 1, 1), np.linspace(0.5, 1.5, C), np.zeros(C) + 0.1),
    "concat_odd": lambda n, y: n.concat([y, n.relu(y), n.slice(y, 1, 0, 7)], axis=1),
    "concat_aligned": lambda n, y: n.concat([n.slice(y, 1, 0, 16), n.slice(y, 1, 16, 32)], axis=1),
}


@pytest.mark.parametrize("name", list(BLOCKED_CASES))
def test_blocked_forms_match_reference(name):
    net = between_convs(BLOCKED_CASES[name])
    x = RNG.standard_normal(net.inputs[0].shape).astype(np.float32)
    c = run_both(net, [x])
    prog = c.package.program()
    kernels = [i.kernel for i in prog]
    # every instruction between the two convs runs blocked: the only conversions are at the ends
    assert kernels.count("to_nchwc") <= 1 and kernels.count("from_nchwc") == 1, kernels
    mid = [i for i in prog if i.kernel not in ("conv2d", "to_nchwc", "from_nchwc", "global_avg_pool")
           and i.output.shape[2:4] != (1, 1)]     # the squeeze path on (N, C, 1, 1) stays NCHW
    assert mid and all(i.params.get("layout") == "nchwc" for i in mid), [(i.kernel, i.params.get("layout"))
                                                                           for i in mid]


def test_squeeze_excitation_conv_blocked_and_nchw():
    """mul(x, sigmoid(fc(mean x))) -> 1x1 conv: fused into the conv as an input scale, on blocked
    tensors (k1x1 with per-image scaled weights) and on NCHW ones (per-image GEMM)."""
    for c_in, layout in ((C, "nchwc"), (5, "nchw")):
        def se(n, y):
            s = n.mean(y, (2, 3), True)
            s = n.conv2d(s, w((8, y.shape[1], 1, 1)), w((8,), 0.1))
            s = n.sigmoid(n.conv2d(n.relu(s), w((y.shape[1], 8, 1, 1)), None))
            return n.conv2d(n.mul(y, s), w((32, y.shape[1], 1, 1)), w((32,), 0.1), name="proj")
        net = between_convs(se, c=c_in)
        x = RNG.standard_normal(net.inputs[0].shape).astype(np.float32)
        c = run_both(net, [x])
        proj = [i for i in c.package.program() if i.output.name.startswith("proj")][0]
        assert proj.params.get("has_input_scale") and proj.params.get("layout", "nchw") == layout
        assert not any(i.kernel == "mul" for i in c.package.program())


@pytest.mark.parametrize("scale_first", [False, True])
def test_squeeze_excitation_conv_on_a_1x1_map(scale_first):
    """On a 1x1 map (the last stage of a 32x32 image) the feature map and its squeeze-excitation scale are
    both (N, C, 1, 1): `scale * x` (operands in that order) must still fuse with x as the conv's input and
    the scale as its input scale, so the conv stays on x's blocked layout (read the other way round it ran
    on NCHW: RegNetY's last-stage 1x1s 5-10x slower at 32x32). Same values as the reference either way."""
    net = tilefuse.Network("se1x1")
    x = net.input("x", (2, 32, 2, 2))
    y = net.conv2d(x, w((C, 32, 3, 3)), w((C,), 0.1), padding=1, stride=2, name="c1")     # (2, C, 1, 1)
    s = net.mean(y, (2, 3), True)
    s = net.sigmoid(net.conv2d(net.relu(net.conv2d(s, w((8, C, 1, 1)), w((8,), 0.1))), w((C, 8, 1, 1)), None))
    net.output(net.conv2d(net.mul(s, y) if scale_first else net.mul(y, s), w((48, C, 1, 1)), w((48,), 0.1),
                          name="proj"))
    xv = RNG.standard_normal(net.inputs[0].shape).astype(np.float32)
    c = run_both(net, [xv])
    prog = c.package.program()
    proj = [i for i in prog if i.output.name.startswith("proj")][0]
    assert proj.params.get("has_input_scale") and proj.params.get("layout") == "nchwc", proj.params
    assert proj.inputs[0].name.startswith("c1"), [op.name for op in proj.inputs]
    assert not any(i.kernel == "mul" for i in prog)


NCHW_CASES = {
    "conv_transpose": lambda n, x: n.conv_transpose2d(x, w((5, 6, 3, 3)), w((6,), 0.1), stride=2, padding=1,
                                                      output_padding=1),
    "conv_transpose_groups_silu": lambda n, x: n.silu(n.conv_transpose2d(x, w((5, 1, 4, 4)), None, stride=2,
                                                                        padding=1, groups=5)),
    "mean_sum": lambda n, x: n.add(n.mean(x, (1,), True), n.sum(x, (1, 3), True)),
    "channel_shuffle": lambda n, x: n.reshape(n.permute(n.reshape(x, (2, 5, 1, 9, 7)), (0, 2, 1, 3, 4)),
                                              (2, 5, 9, 7)),
    "channel_norm": lambda n, x: n.channel_norm(x, np.linspace(0.5, 1.5, 5), np.linspace(-1, 1, 5)),
    "layer_norm": lambda n, x: n.layer_norm(x, np.ones((9, 7)), np.zeros((9, 7)), axis=2),
    "adaptive": lambda n, x: n.adaptive_avg_pool(x, (4, 3)),
    "pad_replicate": lambda n, x: n.pad(x, (0, 0, 1, 0, 2, 1, 0, 3), "replicate"),
    "broadcast_rows": lambda n, x: n.mul(x, n.constant("r", np.linspace(0, 1, 7).astype(np.float32))),
}


@pytest.mark.parametrize("name", list(NCHW_CASES))
@pytest.mark.parametrize("threads", [1, 2])
def test_nchw_kernels_match_reference(name, threads):
    net = tilefuse.Network("nchw")
    x = net.input("x", (2, 5, 9, 7))
    net.output(NCHW_CASES[name](net, x))
    xv = RNG.standard_normal(x.shape).astype(np.float32)
    run_both(net, [xv], threads=threads)


def test_validators_refuse_inconsistent_blocked_instructions():
    """Crafted NCHW16c instructions of the new kernels: channel counts, shapes and operand layouts
    that disagree are refused before anything runs (compiler/validate.py)."""
    from tilefuse.compiler import validate as V
    from tilefuse.compiler.program import CONST, DIRECT, HIDDEN, Instruction, Operand

    def ins(kernel, shapes, out, params, segs=None):
        segs = segs or [HIDDEN] * len(shapes)
        ops = [Operand(f"i{k}", DIRECT, sg, np.dtype(np.float32), sh) for k, (sh, sg) in enumerate(zip(shapes, segs))]
        return Instruction(kernel, ops + [Operand("o", DIRECT, HIDDEN, np.dtype(np.float32), out)], params)

    blk = dict(layout="nchwc", relu=False)
    ok = [
        ins("mul", [(2, 3, 5, 5, 16), (2, 40, 1, 1)], (2, 3, 5, 5, 16), dict(blk, channels=40, in_channels=[40])),
        ins("concat", [(1, 3, 4, 4, 16), (1, 1, 4, 4, 16)], (1, 4, 4, 4, 16),
            dict(axis=1, layout="nchwc", channels=56, in_channels=[40, 16])),
        ins("slice", [(1, 3, 4, 4, 16)], (1, 2, 4, 4, 16),
            dict(axis=1, start=3, stop=37, step=2, layout="nchwc", channels=17, in_channels=[40])),
        ins("conv2d", [(1, 3, 4, 4, 16), (32, 40, 1, 1), (1, 40, 1, 1)], (1, 2, 4, 4, 16),
            dict(stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1, has_bias=False, has_residual=False,
                 has_input_scale=True, relu=False, layout="nchwc"), [HIDDEN, CONST, HIDDEN]),
    ]
    for i in ok:
        V.VALIDATORS[i.kernel](i)
    bad = [
        (ins("mul", [(2, 3, 5, 5, 16), (2, 40, 1, 1)], (2, 3, 5, 5, 16), dict(blk, channels=40, in_channels=[33])),
         "broadcast"),
        (ins("mul", [(2, 3, 5, 5, 16), (2, 40, 1, 1)], (2, 3, 5, 5, 16), dict(blk, channels=60, in_channels=[40])),
         "channel"),
        (ins("concat", [(1, 3, 4, 4, 16), (1, 1, 4, 4, 16)], (1, 4, 4, 4, 16),
             dict(axis=1, layout="nchwc", channels=56, in_channels=[40])), "in_channels"),
        (ins("resize", [(1, 3, 4, 4, 16)], (1, 3, 8, 8, 16),
             dict(size=(8, 8), scales=None, mode="nearest", coord="asymmetric", nearest_mode="floor",
                  channels=40, in_channels=[40])), "NCHW16c form"),
        (ins("conv2d", [(1, 3, 4, 4, 16), (32, 40, 3, 3), (1, 40, 1, 1)], (1, 2, 2, 2, 16),
             dict(stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1, has_bias=False, has_residual=False,
                  has_input_scale=True, relu=False, layout="nchwc"), [HIDDEN, CONST, HIDDEN]), "1x1"),
    ]
    for i, msg in bad:
        with pytest.raises(ValueError, match=msg):
            V.VALIDATORS[i.kernel](i)


@pytest.mark.parametrize("o,c", [(17, 33), (32, 16), (70, 100), (5, 3), (96, 40)])   # O=70: the scaled-input path
def test_se_conv_scales_weights_like_k1x1_prepare(o, c):
    """The input-scaled 1x1 conv scales the packed weights per image inside the 1x1 kernel, task by
    task into per-thread scratch (k1x1.run_nchwc(input_scale=...)): its output equals the 1x1 on
    k1x1.prepare(w * s[n]) bit for bit for any thread count and task grid (odd O and C, a map whose
    tasks split the output channels and one whose tasks split the positions), and the conv over a batch
    of per-image scales on NCHW16c equals the reference (which scales x first)."""
    from tilefuse.kernels import reference as ref
    from tilefuse.kernels import se_conv
    from tilefuse.kernels.conv import from_nchwc, k1x1, to_nchwc
    wt = RNG.standard_normal((o, c, 1, 1)).astype(np.float32)
    b = RNG.standard_normal(o).astype(np.float32)
    s = RNG.random((3, c, 1, 1)).astype(np.float32)
    for hw in (3, 23):
        x1 = to_nchwc(RNG.standard_normal((1, c, hw, hw)).astype(np.float32))
        for i in range(3):
            want_b = np.empty((1, -(-o // 16), hw, hw, 16), np.float32)
            k1x1.run_nchwc(want_b, x1, k1x1.prepare(wt * s[i].reshape(1, c, 1, 1), b), threads=1)
            for threads in (1, 2, 3):
                got_b = np.full_like(want_b, np.nan)
                k1x1.run_nchwc(got_b, x1, k1x1.prepare(wt, b), threads=threads, input_scale=s[i].reshape(c))
                np.testing.assert_array_equal(got_b, want_b)
            with pytest.raises(ValueError, match="input scale has"):
                k1x1.run_nchwc(got_b, x1, k1x1.prepare(wt, b), input_scale=s[i].reshape(c)[:c // 2])
    x = RNG.standard_normal((3, c, 5, 7)).astype(np.float32)
    res = RNG.standard_normal((3, o, 5, 7)).astype(np.float32)
    want = ref.conv2d(x, wt, b, (1, 1), (0, 0, 0, 0), (1, 1), 1, residual=res, act=("silu", 0.0, 0.0), input_scale=s)
    for threads in (1, 2):
        out = np.full((3, -(-o // 16), 5, 7, 16), np.nan, np.float32)
        se_conv.conv2d_input_scaled(out, to_nchwc(x), wt, b, to_nchwc(res), s, stride=(1, 1), padding=(0, 0, 0, 0),
                                    dilation=(1, 1), groups=1, has_bias=True, has_residual=True, relu=False,
                                    act=("silu", 0.0, 0.0), threads=threads, layout="nchwc")
        got = from_nchwc(out, o)
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("threads", [1, 2])
def test_division_by_zero_gives_inf_and_nan_as_numpy_does(threads):
    """x / y with zeros in y (a user's data): inf / nan as NumPy and PyTorch give them, never an
    exception; and a per-channel divisor on NCHW16c tensors whose padded lanes hold zeros."""
    from tilefuse.kernels import broadcast as B
    a = np.array([1.0, -2.0, 0.0, 3.0] * 9, np.float32).reshape(1, 4, 3, 3)
    b = np.array([0.0, 0.0, 0.0, 2.0] * 9, np.float32).reshape(1, 4, 3, 3)
    net = tilefuse.Network("div0")
    x, y = net.input("x", a.shape), net.input("y", b.shape)
    net.output(net.div(x, y))
    with np.errstate(divide="ignore", invalid="ignore"):
        want = a / b
    got = tilefuse.compile(net, threads=threads).run([a, b])
    np.testing.assert_array_equal(got, want)                       # inf, -inf, nan, 1.5
    # blocked form, 20 channels in 2 blocks of 16 lanes (12 padded lanes hold zeros)
    xb = np.zeros((1, 2, 3, 4, 16), np.float32)
    xb[:, 0], xb[:, 1, :, :, :4] = 1.0, 1.0
    s = np.linspace(1, 2, 20, dtype=np.float32).reshape(1, 20, 1, 1)
    for swap in (False, True):
        o = np.empty_like(xb)
        args = (s, xb) if swap else (xb, s)
        B.binary("div", o, *args, layout="nchwc", channels=20, threads=threads)
        dense = np.concatenate([o[:, 0], o[:, 1, :, :, :4]], axis=-1)   # (1, 3, 4, 20) real lanes
        want = (s.reshape(20) / 1.0) if swap else (1.0 / s.reshape(20))
        np.testing.assert_allclose(dense, np.broadcast_to(want, dense.shape), rtol=1e-6)
        assert np.all(o[:, 1, :, :, 4:] == 0)                        # padded lanes stay zero


@pytest.mark.parametrize("c", [3, 17, 37, 96])
def test_channel_norm_of_a_constant_position_is_beta(c):
    """Where all channels of a position are equal (a constant pad, a saturated ReLU6), x - mean is 0 and the
    output is exactly beta, as PyTorch's LayerNorm gives (norm.py's shifted sums): the float32 mean of the equal values
    had missed by an ulp and 1 / sqrt(eps) magnified it to up to 1.9e-3 (times gamma). Both layouts, and the
    reference's channel_norm and layer_norm (the same miss, 1.7e-4 in a random network's constant pad)."""
    import torch
    import torch.nn.functional as F

    from tilefuse.kernels import norm
    from tilefuse.kernels import reference as ref
    from tilefuse.kernels.conv import from_nchwc, to_nchwc
    x = RNG.standard_normal((2, c, 5, 7)).astype(np.float32)
    vals = np.float32([6.0, 0.7, -3.3, 1e3, 0.1, 2.9])
    const = RNG.random((2, 5, 7)) < 0.5                                  # (N, H, W) positions made constant
    x = np.where(const[:, None], vals[RNG.integers(0, 6, (2, 1, 5, 7))], x).astype(np.float32)
    g, b = RNG.standard_normal(c).astype(np.float32), RNG.standard_normal(c).astype(np.float32)
    t = F.layer_norm(torch.from_numpy(x).permute(0, 2, 3, 1), (c,), torch.from_numpy(g), torch.from_numpy(b),
                     eps=1e-6).permute(0, 3, 1, 2).numpy()
    want = np.broadcast_to(b.reshape(1, c, 1, 1), x.shape)
    ob = np.empty_like(to_nchwc(x))
    norm.channel_norm(ob, to_nchwc(x), g, b, eps=1e-6, threads=2, layout="nchwc", channels=c)
    o = np.empty_like(x)
    norm.channel_norm(o, x, g, b, eps=1e-6, threads=2)
    m = np.broadcast_to(const[:, None], x.shape)
    r = ref.channel_norm(x, g, b, 1e-6)                                 # the reference: the same (its _mean_var)
    rl = ref.layer_norm(x.transpose(0, 2, 3, 1), g, b, -1, 1e-6).transpose(0, 3, 1, 2)
    for got in (from_nchwc(ob, c), o, r, rl):
        np.testing.assert_array_equal(got[m], want[m])
        np.testing.assert_array_equal(got[m], t[m])                    # torch's: exactly beta too
        np.testing.assert_allclose(got[~m], t[~m], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", ["nchw", "nchwc"])
def test_channel_l2_norm_against_torch_and_at_zero(layout):
    """The l2 modes against PyTorch's own forms (SSD: x / (x.pow(2).sum(1).sqrt() + eps); F.normalize: x /
    max(||x||, eps)), positions of all zeros included: with eps 0, 0 / 0 is NaN as in PyTorch, F.normalize's clamp
    gives 0, SSD's eps gives 0; a NaN at a position makes that position's outputs NaN, and only those."""
    import torch
    import torch.nn.functional as F

    from tilefuse.kernels import norm
    from tilefuse.kernels.conv import from_nchwc, to_nchwc
    c = 21
    x = RNG.standard_normal((2, c, 4, 6)).astype(np.float32)
    x[0, :, 1, 2] = 0.0
    x[1, :, 3, :] = 0.0
    x[1, 5, 0, 0] = np.nan
    g = RNG.standard_normal(c).astype(np.float32)
    t = torch.from_numpy(x)
    cases = [("l2", 1e-10, t / (t.pow(2).sum(1, keepdim=True).sqrt() + 1e-10)),
             ("l2", 0.0, t / t.norm(dim=1, keepdim=True)),
             ("l2_clamp", 1e-12, F.normalize(t, dim=1))]
    for mode, eps, want in cases:
        want = (want * torch.from_numpy(g).view(1, c, 1, 1)).numpy()
        if layout == "nchwc":
            ob = np.empty_like(to_nchwc(x))
            norm.channel_norm(ob, to_nchwc(x), g, np.zeros(c, np.float32), eps=eps, threads=2, layout="nchwc",
                              channels=c, mode=mode)
            got = from_nchwc(ob, c)
        else:
            got = np.empty_like(x)
            norm.channel_norm(got, x, g, np.zeros(c, np.float32), eps=eps, threads=2, mode=mode)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        assert np.isnan(want[1, :, 0, 0]).all() and (eps > 0) != np.isnan(want[0, :, 1, 2]).all()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape,k", [((8, 256, 192), 1), ((2, 3, 5, 7), 2), ((4, 37), 1), ((3, 700, 30), 1)])
def test_layer_norm_kernel_rows(shape, k):
    """norm.layer_norm over the trailing k axes (rows on the pool) against float64 PyTorch within 1e-6 of the
    output's scale; a constant row gives beta exactly (shifted sums); bitwise the same for 1, 2 and 3 threads."""
    import torch
    import torch.nn.functional as F

    from tilefuse.kernels import norm
    x = (RNG.standard_normal(shape) * 3 + 1).astype(np.float32)
    x.reshape(-1, int(np.prod(shape[-k:])))[1] = 6.25          # a constant row (a padded token)
    ns = shape[-k:]
    g, b = RNG.standard_normal(ns).astype(np.float32), RNG.standard_normal(ns).astype(np.float32)
    want = F.layer_norm(torch.from_numpy(x).double(), ns, torch.from_numpy(g).double(), torch.from_numpy(b).double(),
                        1e-5).numpy()
    outs = []
    for th in (1, 2, 3):
        o = np.full_like(x, np.nan)
        norm.layer_norm(o, x, g, b, axis=len(shape) - k, eps=1e-5, threads=th)
        outs.append(o)
    assert np.abs(outs[0] - want).max() <= 1e-6 * np.abs(want).max()
    np.testing.assert_array_equal(outs[0].reshape(-1, g.size)[1], b.reshape(-1))
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


@pytest.mark.parametrize("eps", [1e-45, 1e-40, 1e-38])
def test_layer_norm_kernel_with_a_subnormal_eps(eps):
    """A constant row with a subnormal eps is beta, as float64 says, not NaN: the kernel's 1 / sqrt (a reciprocal
    square root estimate under fastmath) read var + eps = 1e-45 as 0 (ONNX LayerNormalization epsilon=1e-45 over
    one value, onnx_mutants seed 2045711)."""
    from tilefuse.kernels import norm
    from tilefuse.kernels import reference as ref
    x = np.full((3, 5), 2.5, np.float32)
    x[1] = RNG.standard_normal(5).astype(np.float32)
    g, b = np.full(5, 2.0, np.float32), np.arange(5, dtype=np.float32)
    o = np.full_like(x, np.nan)
    norm.layer_norm(o, x, g, b, axis=1, eps=eps)
    np.testing.assert_array_equal(o[[0, 2]], np.stack([b, b]))
    want = ref.layer_norm(x.astype(np.float64), g, b, 1, eps)
    np.testing.assert_allclose(o, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode,eps", [("layer", 1e-6), ("l2", 1e-10), ("l2_clamp", 1e-12)])
@pytest.mark.parametrize("n,c,h,w", [(1, 37, 9, 5), (3, 20, 7, 7), (1, 96, 14, 3), (2, 16, 1, 30), (1, 768, 7, 7)])
def test_channel_norm_blocked_kernel(n, c, h, w, mode, eps):
    """The channel norm on NCHW16c (kernels/norm.py, tasks of rows on a numba region), each mode (ConvNeXt's
    LayerNorm, SSD's L2Norm, F.normalize): equal to the reference within 1e-5 of the output's scale, and the NCHW
    kernel too; the padded lanes of the input never read (filled with NaN and huge values here) and written 0;
    bitwise the same for 1, 2 and 3 threads (the task split never changes a position's sums)."""
    from tilefuse.kernels import norm
    from tilefuse.kernels import reference as ref
    from tilefuse.kernels.conv import from_nchwc, to_nchwc
    x = (RNG.standard_normal((n, c, h, w)) * 3 + 1).astype(np.float32)
    g = RNG.standard_normal(c).astype(np.float32)
    b = RNG.standard_normal(c).astype(np.float32)
    xb = to_nchwc(x)
    if c % 16:
        xb[:, -1, :, :, c % 16:] = np.where(RNG.random(xb[:, -1, :, :, c % 16:].shape) < 0.5, np.nan, 1e30)
    want = ref.channel_norm(x, g, b, eps, mode)
    outs = []
    for th in (1, 2, 3):
        ob = np.full_like(xb, 7.0)
        norm.channel_norm(ob, xb, g, b, eps=eps, threads=th, layout="nchwc", channels=c, mode=mode)
        outs.append(ob)
    got = from_nchwc(outs[0], c)
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    o = np.empty_like(x)
    norm.channel_norm(o, x, g, b, eps=eps, threads=2, mode=mode)
    assert np.abs(o - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    flat = outs[0].transpose(0, 2, 3, 1, 4).reshape(n, h, w, -1)     # (N, Cb, H, W, 16) -> (N, H, W, Cb*16)
    assert np.all(flat[..., c:] == 0.0)
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    big = np.full(xb.shape[:3] + (2 * w, 16), 7.0, np.float32)
    strided = big[:, :, :, ::2]                                  # a non-contiguous output view: written through
    norm.channel_norm(strided, xb, g, b, eps=eps, threads=2, layout="nchwc", channels=c, mode=mode)
    np.testing.assert_array_equal(big[:, :, :, ::2], outs[0])
    assert np.all(big[:, :, :, 1::2] == 7.0)
