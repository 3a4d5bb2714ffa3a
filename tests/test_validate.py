"""The kernel validator registry (compiler/validate.py VALIDATORS, one per kernels/registry.py KERNELS)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from tilefuse.compiler.program import CONST, DIRECT, HIDDEN, Instruction, Operand
from tilefuse.kernels import registry as cpu
from tilefuse.compiler import validate as V
from tilefuse.kernels.conv import ALGORITHMS, NCHWC_ALGORITHMS, conv2d_prepare
from tilefuse.kernels.conv.select import candidates


def test_every_registered_kernel_has_a_validator():
    """Fails when someone adds a kernel to KERNELS without its validator (see
    docs/architecture.md, "Package validation")."""
    from tilefuse.ir.ops import OPS
    missing = sorted(set(cpu.KERNELS) - set(V.VALIDATORS))
    hint = "; ".join(f'VALIDATORS["{k}"] = op_validator("{k}", _layouts("{k}"))' if k in OPS else
                     f'VALIDATORS["{k}"] = <a function raising ValueError>' for k in missing)
    assert not missing, f"kernels without a validator: {missing}; add to compiler/validate.py: {hint}"
    assert all(callable(v) for v in V.VALIDATORS.values())
    assert not set(V.VALIDATORS) - set(cpu.KERNELS), "validators of kernels that do not exist"


def test_every_conv_algorithm_declares_its_prepared_shapes():
    missing = sorted(set(ALGORITHMS) - set(V.PREPARED))
    assert not missing, f"conv algorithms without a PREPARED entry in compiler/validate.py: {missing}"


@pytest.mark.parametrize("co, ci, k, groups", [(1, 1, 1, 1), (5, 3, 3, 1), (16, 16, 1, 1), (17, 33, 3, 1),
                                               (40, 20, 1, 1), (64, 31, 5, 1), (6, 2, 3, 2), (8, 1, 3, 8),
                                               (33, 47, 3, 1), (32, 8, 7, 1), (48, 48, 3, 6), (40, 40, 3, 10),
                                               (26, 26, 5, 13), (64, 64, 3, 4)])
def test_prepared_shapes_match_conv2d_prepare(co, ci, k, groups):
    """The validator's shape rules are the shapes conv2d_prepare really makes."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((co, ci // groups if groups > 1 else ci, k, k)).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32)
    cin = w.shape[1] * groups
    for alg in candidates((1, cin, 8, 8), w.shape, (1, 1), (0, 0, 0, 0), (1, 1), groups):
        for layout in ("nchw", "nchwc") if alg in NCHWC_ALGORITHMS and groups == 1 else ("nchw",):
            real = conv2d_prepare(alg, w, b, (1, 1), (0, 0, 0, 0), (1, 1), groups, layout=layout)
            rule = V.PREPARED[alg](w.shape, groups, layout)
            assert {k_: tuple(v.shape) for k_, v in real.items()} == {k_: tuple(s) for k_, s in rule.items()}, \
                (alg, layout)


def test_register_requires_a_validator():
    with pytest.raises(TypeError, match="validator"):
        V.register("nothing", lambda out, x: None, None)
    assert "nothing" not in cpu.KERNELS


def _ins(kernel, shapes, out, params, dtype=np.float32, segs=None):
    dt = np.dtype(dtype)
    segs = segs or [HIDDEN] * len(shapes)
    ops = [Operand(f"in{i}", DIRECT, s, dt, tuple(sh)) for i, (sh, s) in enumerate(zip(shapes, segs))]
    return Instruction(kernel, ops + [Operand("out", DIRECT, HIDDEN, dt, tuple(out))], params)


@pytest.mark.parametrize("kernel, shapes, out, params, ok", [
    ("relu", [(2, 3)], (2, 3), {}, True),
    ("relu", [(2, 3)], (2, 4), {}, False),
    ("relu", [(1, 1, 4, 4, 16)], (1, 1, 4, 4, 16), {"layout": "nchwc"}, True),
    ("relu", [(2, 3)], (2, 3), {"layout": "nchw"}, False),          # layout given: only 'nchwc'
    ("softmax", [(2, 3)], (2, 3), {"axis": 1, "layout": "nchwc"}, False),
    ("add", [(2, 3), (2, 3)], (2, 3), {"relu": False}, True),
    ("add", [(2, 3), (2, 3)], (2, 3), {"relu": False, "act": ("identity", 0.0, 0.0)}, False),  # not normal form
    ("add", [(2, 3), (2, 3)], (2, 3), {"relu": False, "act": ("silu", 0.0, 0.0)}, True),
    ("add", [(2, 3), (1, 3)], (2, 3), {"relu": False}, True),   # broadcasting
    ("add", [(2, 3), (3, 2)], (2, 3), {"relu": False}, False),
    ("add", [(2, 3)], (2, 3), {"relu": False}, False),               # one operand short
    ("max_pool", [(1, 2, 5, 5)], (1, 2, 2, 2), {"kernel_size": (2, 2), "stride": (2, 2), "padding": (0, 0, 0, 0),
                                                "ceil_mode": False, "dilation": (1, 1)}, True),
    ("max_pool", [(1, 2, 5, 5)], (1, 2, 3, 3), {"kernel_size": (2, 2), "stride": (2, 2), "padding": (0, 0, 0, 0),
                                                "ceil_mode": False, "dilation": (1, 1)}, False),
    ("max_pool", [(1, 2, 5, 5)], (1, 2, 2, 2), {"kernel_size": 2, "stride": (2, 2), "padding": (0, 0, 0, 0),
                                                "ceil_mode": False, "dilation": (1, 1)}, False),   # not normalized
    ("global_avg_pool", [(1, 2, 5, 5, 16)], (1, 20, 1, 1), {"layout": "nchwc"}, True),
    ("global_avg_pool", [(1, 2, 5, 5, 16)], (1, 40, 1, 1), {"layout": "nchwc"}, False),
    ("linear", [(2, 5), (3, 5)], (2, 3), {"has_bias": False, "relu": False}, True),
    ("linear", [(2, 5), (3, 4)], (2, 3), {"has_bias": False, "relu": False}, False),
    ("to_nchwc", [(1, 20, 3, 3)], (1, 2, 3, 3, 16), {"channels": 20}, True),
    ("to_nchwc", [(1, 20, 3, 3)], (1, 1, 3, 3, 16), {"channels": 20}, False),
    ("from_nchwc", [(1, 2, 3, 3, 16)], (1, 20, 3, 3), {"channels": 20}, True),
    ("from_nchwc", [(1, 2, 3, 3, 16)], (1, 40, 3, 3), {"channels": 40}, False),
])
def test_validators_accept_consistent_and_refuse_inconsistent(kernel, shapes, out, params, ok):
    ins = _ins(kernel, shapes, out, params)
    if ok:
        V.VALIDATORS[kernel](ins)
    else:
        with pytest.raises(ValueError):
            V.VALIDATORS[kernel](ins)


def _blocked(**p):
    return dict(p, layout="nchwc")


@pytest.mark.parametrize("kernel, shapes, out, params, message", [
    ("add", [(1, 1, 6, 5, 16), (1, 1, 6, 5, 16)], (1, 1, 6, 5, 16),
     _blocked(relu=False, channels=16, in_channels=[16, 16]), None),
    ("add", [(1, 1, 6, 5, 16), (1, 16, 1, 1)], (1, 1, 6, 5, 16), _blocked(relu=False, channels=16, in_channels=[16]),
     None),                                                          # a per-channel operand stays NCHW
    # a blocked operand that broadcasts over rows: the IR allows it, the NCHW16c kernel does not (package fuzz,
    # hypothesis seed 73: a RuntimeError from the kernel at the first run)
    ("add", [(1, 1, 6, 5, 16), (1, 1, 1, 5, 16)], (1, 1, 6, 5, 16),
     _blocked(relu=False, channels=16, in_channels=[16, 16]), "the NCHW16c add takes the output's shape"),
    ("mul", [(1, 1, 6, 5, 16), (1, 1, 6, 1)], (1, 1, 6, 5, 16), _blocked(relu=False, channels=16, in_channels=[16]),
     "or a per-channel"),
    ("concat", [(1, 1, 3, 5, 16), (1, 1, 3, 5, 16)], (1, 1, 3, 5, 16), _blocked(axis=1, channels=16,
                                                                                  in_channels=[8, 8]), None),
    ("concat", [(1, 1, 3, 5, 16), (1, 1, 3, 5, 16)], (1, 1, 6, 5, 16), _blocked(axis=2, channels=16,
                                                                                  in_channels=[16, 16]), "axis=2"),
    ("slice", [(2, 1, 3, 5, 16)], (1, 1, 3, 5, 16), _blocked(axis=0, start=0, stop=1, step=1, channels=16,
                                                             in_channels=[16]), "axis=0"),
    ("pad", [(1, 1, 3, 5, 16)], (1, 2, 3, 5, 16), _blocked(pads=(0, 0, 0, 16, 0, 0, 0, 0), mode="constant",
                                                           value=0.0, channels=32, in_channels=[16]), "pads="),
])
def test_blocked_validators_take_only_what_the_nchwc_kernels_run(kernel, shapes, out, params, message):
    ins = _ins(kernel, shapes, out, params)
    if message is None:
        V.VALIDATORS[kernel](ins)
    else:
        with pytest.raises(ValueError, match=message):
            V.VALIDATORS[kernel](ins)


def test_dtypes_are_checked():
    V.VALIDATORS["relu"](_ins("relu", [(2, 3)], (2, 3), {}, np.float64))
    with pytest.raises(ValueError, match="float dtype"):
        V.VALIDATORS["relu"](_ins("relu", [(2, 3)], (2, 3), {}, np.int32))
    with pytest.raises(ValueError, match="float32"):
        V.VALIDATORS["relu"](_ins("relu", [(1, 1, 2, 2, 16)], (1, 1, 2, 2, 16), {"layout": "nchwc"}, np.float64))


def _conv(alg, x, w_shape, out, layout=None, res=False, groups=1, stride=1, padding=0, prepared_shapes=None):
    p = {"stride": (stride, stride), "padding": (padding,) * 4, "dilation": (1, 1), "groups": groups,
         "has_bias": True, "has_residual": res, "relu": False, "algorithm": alg, "prepared": ("weight", "bias"),
         "weight_shape": tuple(w_shape)}
    if layout:
        p["layout"] = layout
    shapes = prepared_shapes or V.PREPARED[alg](w_shape, groups, layout or "nchw")
    return _ins("conv2d", [x, shapes["weight"], shapes["bias"]] + ([out] if res else []), out, p,
                segs=[HIDDEN, CONST, CONST] + ([HIDDEN] if res else []))


def test_conv_validator_rederives_every_shape():
    ok = [
        _conv("direct", (1, 1, 8, 8, 16), (20, 16, 3, 3), (1, 2, 8, 8, 16), "nchwc", padding=1),
        _conv("winograd4", (1, 2, 8, 8, 16), (16, 17, 3, 3), (1, 1, 6, 6, 16), "nchwc", res=True),
        _conv("gemm1x1", (1, 2, 8, 8, 16), (40, 20, 1, 1), (1, 3, 4, 4, 16), "nchwc", stride=2),
        _conv("im2col", (1, 4, 8, 8), (6, 2, 3, 3), (1, 6, 8, 8), groups=2, padding=1),
        _conv("direct", (1, 3, 8, 8), (5, 3, 3, 3), (1, 5, 6, 6)),
        _conv("grouped", (1, 3, 8, 8, 16), (48, 8, 3, 3), (1, 3, 8, 8, 16), "nchwc", groups=6, padding=1),
        _conv("grouped", (1, 2, 8, 8, 16), (24, 4, 3, 3), (1, 2, 3, 3, 16), "nchwc", groups=6, stride=2, res=True),
    ]
    for ins in ok:
        V.validate_conv2d(ins)
    bad = [
        (_conv("direct", (1, 1, 8, 8, 16), (20, 16, 3, 3), (1, 2, 9, 8, 16), "nchwc", padding=1), "give"),
        (_conv("direct", (1, 2, 8, 8, 16), (20, 16, 3, 3), (1, 2, 8, 8, 16), "nchwc", padding=1), "channel blocks"),
        (_conv("winograd4", (1, 2, 8, 8, 16), (16, 17, 3, 3), (1, 1, 6, 6, 16), "nchwc",
               prepared_shapes={"weight": (36, 32, 32), "bias": (16,)}), "needs"),
        (_conv("winograd2", (1, 1, 8, 8, 16), (16, 16, 3, 3), (1, 1, 4, 4, 16), "nchwc", stride=2), "cannot run"),
        (_conv("im2col", (1, 4, 8, 8), (6, 2, 3, 3), (1, 6, 8, 8), "nchwc", groups=2, padding=1), "groups"),
        # grouped lanes weights (Ob, KH, KW, cg, 16): a block short, a wrong group width, the tile form's shape
        (_conv("grouped", (1, 3, 8, 8, 16), (48, 8, 3, 3), (1, 3, 8, 8, 16), "nchwc", groups=6, padding=1,
               prepared_shapes={"weight": (2, 3, 3, 8, 16), "bias": (48,)}), "needs"),
        (_conv("grouped", (1, 3, 8, 8, 16), (48, 8, 3, 3), (1, 3, 8, 8, 16), "nchwc", groups=6, padding=1,
               prepared_shapes={"weight": (3, 3, 3, 4, 16), "bias": (48,)}), "needs"),
        (_conv("grouped", (1, 3, 8, 8, 16), (48, 8, 3, 3), (1, 3, 8, 8, 16), "nchwc", groups=6, padding=1,
               prepared_shapes={"weight": (3, 1, 1, 3, 3, 16, 16), "bias": (48,)}), "needs"),
    ]
    extra = _conv("direct", (1, 3, 8, 8), (5, 3, 3, 3), (1, 5, 6, 6), res=True)
    extra.params["has_residual"] = False                      # a residual operand nobody declared
    bad.append((extra, "input operands"))
    for ins, msg in bad:
        with pytest.raises(ValueError, match=msg):
            V.validate_conv2d(ins)


def test_bounds():
    V.check_bounded({"a": (1, 2), "b": 1.5, "c": "s", "d": None, "e": True, "shape": (100352, 7)})
    for bad in ({"a": V.MAX_PARAM + 1}, {"a": (1, -V.MAX_PARAM - 1)}, {"a": float("inf")}, {"a": float("nan")},
                {"a": object()}, {"stride": (1, V.MAX_SPATIAL + 1)}, {"padding": (0, 0, 0, V.MAX_SPATIAL + 1)}):
        with pytest.raises(ValueError):
            V.check_bounded(bad)


def test_written_tracks_last_writer_per_byte():
    from tilefuse.compiler.package import _Written
    w = _Written()
    w.add(0, 10, "a")
    w.add(5, 15, "b")                     # b overwrites the second half of a
    assert w.covers(0, 5, "a") and not w.covers(0, 6, "a") and w.covers(5, 15, "b")
    assert not w.covers(14, 16, "b") and w.covers(3, 3, "z")
    w.add(15, 20, "b")
    assert w.covers(5, 20, "b")
    for a, b in itertools.combinations(range(0, 21, 5), 2):
        assert w.covers(a, b, "b") == (a >= 5)
