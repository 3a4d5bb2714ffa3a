"""NaN and infinities in, NaN and infinities out: no kernel may drop a NaN or raise on one.

An input with a NaN (a corrupted frame, a division by zero upstream) must give NaN in every output that the
reference evaluator (and PyTorch) computes as NaN, and an infinite input non-finite values wherever theirs
are non-finite; a fast kernel that turns them into finite numbers hides the fault. The kernels compiled with
numba's `fastmath=True` did not: its `nnan` / `ninf` flags let LLVM assume finite values, and the standalone
tanh returned -1 for NaN, the channel norm raised ZeroDivisionError on a NaN or infinite input, and
ConvNeXt-Tiny fed one NaN pixel returned 1000 finite logits. Now every kernel compiles with `fpflags.FAST`
(no `nnan` / `ninf`), sigmoid is exactly 0 below -87 (SiLU(-inf) = -inf * 0 = nan, as PyTorch's; it was
-inf, and a squeeze-excitation gate of 1.6e-38 left finite outputs where PyTorch's were NaN), and erf32 is
exactly +-1 past its clamp (a depthwise kernel's GELU(-inf) was -inf, PyTorch's nan).

Extra non-finite outputs are allowed: Winograd spreads a NaN over its whole tile, and a blocked grouped conv
multiplies the other groups' zero weights with it (0 * nan = nan), as cuDNN's and oneDNN's do.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import random_nets  # noqa: E402
import tilefuse  # noqa: E402
from tilefuse.ir import Network  # noqa: E402

C, H, W = 20, 13, 11
VALUES = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}


def _w(rng, *shape):
    return (rng.standard_normal(shape) * 0.3).astype(np.float32)


# name -> builder(net, y, rng) of one op (or a conv with a fused activation) on y of C channels
OPS = {
    "relu": lambda n, y, r: n.relu(y),
    "relu6": lambda n, y, r: n.relu6(y),
    "sigmoid": lambda n, y, r: n.sigmoid(y),
    "silu": lambda n, y, r: n.silu(y),
    "hardswish": lambda n, y, r: n.hardswish(y),
    "hardsigmoid": lambda n, y, r: n.hardsigmoid(y),
    "gelu": lambda n, y, r: n.gelu(y),
    "gelu_tanh": lambda n, y, r: n.gelu(y, "tanh"),
    "leaky_relu": lambda n, y, r: n.activation(y, "leaky_relu"),
    "elu": lambda n, y, r: n.activation(y, "elu"),
    "tanh": lambda n, y, r: n.activation(y, "tanh"),
    "mish": lambda n, y, r: n.activation(y, "mish"),
    "softplus": lambda n, y, r: n.activation(y, "softplus"),
    "abs": lambda n, y, r: n.activation(y, "abs"),
    "exp": lambda n, y, r: n.activation(y, "exp"),
    "log": lambda n, y, r: n.activation(y, "log"),
    "sqrt": lambda n, y, r: n.activation(y, "sqrt"),
    "rsqrt": lambda n, y, r: n.activation(y, "rsqrt"),
    "pow": lambda n, y, r: n.activation(y, "pow", exponent=2.5),
    "pow_odd": lambda n, y, r: n.activation(y, "pow", exponent=-3.0),
    "celu": lambda n, y, r: n.activation(y, "celu", alpha=0.6),
    "selu": lambda n, y, r: n.activation(y, "selu"),
    "log_sigmoid": lambda n, y, r: n.activation(y, "log_sigmoid"),
    "clip": lambda n, y, r: n.activation(y, "clip", min=-0.5, max=0.5),
    "prelu": lambda n, y, r: n.prelu(y, _w(r, C)),
    "max_pool": lambda n, y, r: n.max_pool(y, 3, 2, 1),
    "max_pool_ceil": lambda n, y, r: n.max_pool(y, 2, 2, ceil_mode=True),
    "avg_pool": lambda n, y, r: n.avg_pool(y, 3, 1, 1),
    "global_avg_pool": lambda n, y, r: n.global_avg_pool(y),
    "adaptive_avg_pool": lambda n, y, r: n.adaptive_avg_pool(y, (3, 2)),
    "adaptive_avg_pool_divisible": lambda n, y, r: n.adaptive_avg_pool(          # (run as a 4x5 avg pool)
        n.slice(n.slice(y, 2, 0, 12), 3, 0, 10), (3, 2)),
    "batch_norm": lambda n, y, r: n.batch_norm(y, _w(r, C), _w(r, C), _w(r, C), np.abs(_w(r, C)) + 0.5),
    "scale": lambda n, y, r: n.scale(y, _w(r, C), _w(r, C)),
    "channel_norm": lambda n, y, r: n.channel_norm(y, _w(r, C), _w(r, C)),
    "layer_norm": lambda n, y, r: n.layer_norm(y, _w(r, y.shape[-1]), _w(r, y.shape[-1])),
    "softmax": lambda n, y, r: n.softmax(y, 1),
    "local_response_norm": lambda n, y, r: n.local_response_norm(y, 5),
    "mean": lambda n, y, r: n.mean(y, (2, 3), keepdim=True),
    "sum": lambda n, y, r: n.sum(y, (1,), keepdim=True),
    "resize_nearest": lambda n, y, r: n.resize(y, scale_factor=2, mode="nearest"),
    "resize_bilinear": lambda n, y, r: n.resize(y, size=(20, 17), mode="bilinear"),
    "pad_reflect": lambda n, y, r: n.pad(y, (0, 0, 0, 0, 1, 2, 1, 2), "reflect"),
    "pad_replicate": lambda n, y, r: n.pad(y, (0, 0, 0, 0, 1, 2, 1, 2), "replicate"),
    "squeeze_excitation": lambda n, y, r: n.mul(y, n.sigmoid(n.conv2d(n.relu(n.conv2d(
        n.mean(y, (2, 3), keepdim=True), _w(r, 8, C, 1, 1), _w(r, 8))), _w(r, C, 8, 1, 1), _w(r, C)))),
    "div": lambda n, y, r: n.div(y, n.constant("d", np.abs(_w(r, 1, C, 1, 1)) + 1)),
    "sub": lambda n, y, r: n.sub(y, n.constant("s", _w(r, 1, C, 1, 1))),
    "add": lambda n, y, r: n.add(y, n.relu(y)),
    "concat": lambda n, y, r: n.concat([y, n.relu(y)]),
    "channel_shuffle": lambda n, y, r: n.channel_shuffle(y, 4),
    "permute": lambda n, y, r: n.permute(y, (0, 2, 3, 1)),
    "linear": lambda n, y, r: n.linear(n.flatten(n.global_avg_pool(y)), _w(r, 10, C), _w(r, 10)),
    "conv1x1_tanh": lambda n, y, r: n.activation(n.conv2d(y, _w(r, 24, C, 1, 1), _w(r, 24)), "tanh"),
    "conv1x1_s2_silu": lambda n, y, r: n.silu(n.conv2d(y, _w(r, 24, C, 1, 1), _w(r, 24), stride=2)),
    "conv3x3_gelu": lambda n, y, r: n.gelu(n.conv2d(y, _w(r, 24, C, 3, 3), _w(r, 24), padding=1)),
    "conv3x3_s2_sigmoid": lambda n, y, r: n.sigmoid(n.conv2d(y, _w(r, 24, C, 3, 3), _w(r, 24), stride=2,
                                                             padding=1)),
    "conv5x5_d2_hardswish": lambda n, y, r: n.hardswish(n.conv2d(y, _w(r, 24, C, 5, 5), _w(r, 24), padding=4,
                                                                 dilation=2)),
    "conv7x7_s2_elu": lambda n, y, r: n.activation(n.conv2d(y, _w(r, 24, C, 7, 7), _w(r, 24), stride=2,
                                                            padding=3), "elu"),
    "depthwise3x3_gelu": lambda n, y, r: n.gelu(n.conv2d(y, _w(r, C, 1, 3, 3), _w(r, C), padding=1, groups=C)),
    "depthwise5x5_s2_silu": lambda n, y, r: n.silu(n.conv2d(y, _w(r, C, 1, 5, 5), _w(r, C), stride=2,
                                                            padding=2, groups=C)),
    "depthwise7x7_tanh": lambda n, y, r: n.activation(n.conv2d(y, _w(r, C, 1, 7, 7), _w(r, C), padding=3,
                                                               groups=C), "tanh"),
    "conv1x1_exp": lambda n, y, r: n.activation(n.conv2d(y, _w(r, 24, C, 1, 1), _w(r, 24)), "exp"),
    "depthwise3x3_celu": lambda n, y, r: n.activation(n.conv2d(y, _w(r, C, 1, 3, 3), _w(r, C), padding=1,
                                                               groups=C), "celu", alpha=0.5),
    "conv3x3_log": lambda n, y, r: n.activation(n.conv2d(y, _w(r, 24, C, 3, 3), _w(r, 24), padding=1), "log"),
    "grouped3x3_relu6": lambda n, y, r: n.relu6(n.conv2d(y, _w(r, 20, 4, 3, 3), _w(r, 20), padding=1,
                                                         groups=5)),
    "conv_transpose_sigmoid": lambda n, y, r: n.sigmoid(n.conv_transpose2d(y, _w(r, C, 12, 2, 2), _w(r, 12),
                                                                           stride=2)),
    "conv_transpose3x3": lambda n, y, r: n.conv_transpose2d(y, _w(r, C, 12, 3, 3), _w(r, 12), stride=2,
                                                             padding=1, output_padding=1),
}


def _covered(ref, got, what):
    """Every NaN of ref is NaN in got, every non-finite value of ref non-finite in got."""
    for name, bad in (("NaN", np.isnan), ("non-finite", lambda a: ~np.isfinite(a))):
        lost = bad(ref) & ~bad(got)
        assert not lost.any(), (f"{what}: {int(lost.sum())} of {int(bad(ref).sum())} {name} outputs of the "
                                f"reference are {got[lost][:4]} (first at {tuple(np.argwhere(lost)[0])})")


def _run(net, x, threads=2):
    with np.errstate(all="ignore"):
        ref = tilefuse.evaluate(net, x)[0]
        got = np.asarray(tilefuse.Session(tilefuse.compile(net, threads=threads), threads=threads).run(x))
    return ref, got


@pytest.mark.parametrize("after", ["input", "conv"])
@pytest.mark.parametrize("op", list(OPS))
def test_one_op_keeps_nan_and_infinities(op, after):
    """Each op on the network input (NCHW kernels) and after a 3x3 conv (the blocked NCHW16c kernels and the
    conv epilogues), with a NaN, +inf or -inf at three random places of the input."""
    rng = np.random.default_rng(sorted(OPS).index(op) + (100 if after == "conv" else 0))
    net = Network(f"nonfinite_{op}")
    x = net.input("x", (1, C if after == "input" else 5, H, W))
    y = x if after == "input" else net.conv2d(x, _w(rng, C, 5, 3, 3), _w(rng, C), padding=1)
    net.output(OPS[op](net, y, rng))
    compiled = tilefuse.compile(net, threads=2)
    session = tilefuse.Session(compiled, threads=2)
    for label, v in VALUES.items():
        for _ in range(3):
            xv = rng.standard_normal(x.shape).astype(np.float32)
            where = tuple(int(rng.integers(0, s)) for s in x.shape)
            xv[where] = v
            with np.errstate(all="ignore"):
                ref = tilefuse.evaluate(net, xv)[0]
                got = np.asarray(session.run(xv))
            _covered(ref, got, f"{op} after {after}, {label} at {where}")


# seeds of tests/random_nets.build whose output lost a NaN or an infinity before the fixes above (found by
# `python tests/random_nets.py --check nonfinite`): squeeze-excitation gates of -inf, GELU(-inf) in depthwise and
# grouped convs, SiLU(-inf) before a conv and a ReLU
KNOWN = [(5889, "-inf"), (6169, "-inf"), (9666, "inf"), (9677, "inf"), (1804, "inf"), (4216, "inf"),
         (8487, "-inf"), (8783, "-inf")]


@pytest.mark.parametrize("seed,value", KNOWN + [(s, ("nan", "inf", "-inf")[s % 3]) for s in range(1, 49)])
def test_random_networks_keep_nan_and_infinities(seed, value):
    err = random_nets.check_nonfinite(seed, VALUES[value])
    assert err is None, f"seed {seed}, {value}: {err}"


@pytest.mark.parametrize("seed", range(1, 17))
def test_streamed_random_networks_keep_nan(seed):
    err = random_nets.check_streamed_nonfinite(seed, (np.nan, np.inf, -np.inf)[seed % 3])
    assert err is None, f"seed {seed}: {err}"


@pytest.mark.parametrize("model", ["convnext_tiny", "efficientnet_b0"])
def test_zoo_model_with_one_nan_pixel_gives_nan_logits(model):
    """ConvNeXt-Tiny (channel norm, GELU, 7x7 depthwise) returned finite logits for an input with one NaN
    pixel; EfficientNet-B0 has SiLU, squeeze-excitation gates and the stem."""
    net = tilefuse.models.get(model, image_size=64)
    x = np.random.default_rng(0).standard_normal(net.inputs[0].shape).astype(np.float32)
    x[0, 1, 40, 21] = np.nan
    ref, got = _run(net, x)
    assert np.isnan(ref).all()
    _covered(ref, got, model)


def test_reference_adaptive_avg_pool_keeps_nan_and_infinities_in_their_windows():
    """The reference's adaptive average pool (also the runtime kernel where the windows overlap) took window sums
    as differences of prefix sums, so a NaN or an infinity spread to every later window (inf - inf = nan), and
    the compiled avg pool that an evenly dividing adaptive pool becomes disagreed with it (random_nets' mixed
    networks). Against PyTorch: the same values, and NaN / inf exactly where PyTorch has them."""
    import torch
    import torch.nn.functional as F

    from tilefuse.kernels import reference as ref
    rng = np.random.default_rng(5)
    for _ in range(200):
        h, w, oh, ow = (int(v) for v in rng.integers(1, 30, 2).tolist() + rng.integers(1, 12, 2).tolist())
        x = rng.standard_normal((2, 3, h, w)).astype(np.float32)
        x[rng.integers(0, 2), rng.integers(0, 3), rng.integers(0, h), rng.integers(0, w)] = rng.choice(
            [np.nan, np.inf, -np.inf])
        with np.errstate(all="ignore"):
            want = F.adaptive_avg_pool2d(torch.from_numpy(x), (oh, ow)).numpy()
            got = ref.adaptive_avg_pool(x, (oh, ow))
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
