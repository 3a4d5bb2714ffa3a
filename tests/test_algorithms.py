"""The algorithm pass (compiler/algorithms.py): one choice per conv, read by both schedules."""
from __future__ import annotations

import numpy as np
import pytest

import tilefuse
from tilefuse.compiler.algorithms import choose_algorithms
from tilefuse.compiler.passlist import run_passes
from tilefuse.errors import GraphError
from tilefuse.ir import Network
from tilefuse.kernels import conv as fast


def small_net(dtype=np.float32):
    rng = np.random.default_rng(0)
    net = Network("algos")
    x = net.input("x", (1, 16, 12, 10), dtype)
    w = lambda o, c, k: (rng.standard_normal((o, c, k, k)) * 0.2).astype(dtype)  # noqa: E731
    y = net.relu(net.conv2d(x, w(16, 16, 3), None, padding=1, name="c3"))
    y = net.conv2d(y, w(32, 16, 1), None, name="c1")
    y = net.conv2d(y, w(16, 32, 5), None, stride=2, padding=2, name="c5s2")
    net.output(y)
    return net


def annotated(net, **kw):
    opt, _ = run_passes(net)
    res = choose_algorithms(opt, **kw)
    return {op.name: op.params["algorithm"] for op in res.network.ops if op.op == "conv2d"}, res


def test_heuristic_annotates_every_conv_with_the_cost_models_pick():
    net = small_net()
    got, res = annotated(net)
    for op in run_passes(net)[0].ops:
        p = op.params
        want = fast.select_algorithm(op.inputs[0].shape, op.inputs[1].shape, p["stride"], p["padding"],
                                     p["dilation"], p["groups"])
        assert got[op.name] == want
    assert res.detail.startswith("heuristic")
    # a pass: the input network is not changed
    assert all("algorithm" not in op.params for op in run_passes(net)[0].ops)


def test_forced_for_every_conv_or_an_error_naming_the_layer():
    got, res = annotated(small_net(), algorithm="im2col")     # im2col runs every conv
    assert set(got.values()) == {"im2col"} and res.detail == "forced: im2col 3"
    with pytest.raises(GraphError, match=r"c1: conv algorithm 'winograd4' cannot run weight \(32, 16, 1, 1\)"):
        annotated(small_net(), algorithm="winograd4")         # c3 could, c1 (1x1) cannot
    with pytest.raises(ValueError, match="unknown conv algorithm 'fft'"):
        annotated(small_net(), algorithm="fft")


def test_reference_and_other_dtypes():
    got, _ = annotated(small_net(), algorithm="reference")
    assert set(got.values()) == {"reference"}
    got16, _ = annotated(small_net(np.float16))
    assert set(got16.values()) == {"reference"}


@pytest.mark.parametrize("schedule", ["layer", "stream"])
def test_both_schedules_read_the_annotation_and_never_pick_again(schedule, monkeypatch):
    calls = []
    real = fast.select_algorithm
    monkeypatch.setattr(fast, "select_algorithm", lambda *a, **k: calls.append(a) or real(*a, **k))
    net = small_net()
    compiled = tilefuse.compile(net, schedule=schedule)
    assert len(calls) == 3                                # once per conv, in the pass
    want, _ = annotated(net)
    monkeypatch.setattr(fast, "select_algorithm", real)
    if schedule == "layer":
        used = {r["output"].split("@")[0]: r["algorithm"] for r in compiled.plan().rows if r["kernel"] == "conv2d"}
        names = {op.outputs[0].name: op.name for op in compiled.network.ops if op.op == "conv2d"}
        assert {names[k]: v for k, v in used.items()} == want
    else:   # the band instructions carry the annotation, the bound band kernels run it
        bands = [ins for ins in compiled.package.program() if ins.kernel == "band"]
        assert {b.params["name"]: b.params["attrs"]["algorithm"] for b in bands} == want
        sess = compiled.session()
        sess.copy_constants()
        assert {r.layer.name: r.algorithm for r in sess._contexts[0].bound[0][0].runners} == want
    x = np.random.default_rng(1).standard_normal((1, 16, 12, 10)).astype(np.float32)
    np.testing.assert_allclose(compiled.run(x), tilefuse.evaluate(net, x)[0], rtol=1e-4, atol=1e-4)
