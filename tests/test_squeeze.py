"""The squeeze-excitation path (issue 9): the fused SE-scale op and kernel (kernels/squeeze.py),
global average pooling over NCHW16c (kernels/pool.py), the input-scaled 1x1 conv (kernels/se_conv.py).

Each fast kernel against the reference (kernels/reference.py), the reference against PyTorch;
odd shapes (C not a multiple of 16, batch 1 and 3, H = W = 1, 7, 13); thread counts 1, 2, 3, 5
give bitwise identical results. fp32 tolerance: 1e-5 of the output's max (float32 sums in
another order than numpy's pairwise mean / the reference conv).
"""
from __future__ import annotations

import numpy as np
import pytest

import tilefuse
from tilefuse.interpreter import evaluate
from tilefuse.kernels import reference as ref

TOL = 1e-5
RNG = np.random.default_rng(9)
THREADS = (1, 2, 3, 5)


def rand(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def close(got, want, tol=TOL):
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * max(1.0, float(np.abs(want).max())))


def se_weights(c, r):
    return rand(r, c, 1, 1, scale=1 / np.sqrt(c)), rand(r), rand(c, r, 1, 1, scale=1 / np.sqrt(r)), rand(c)


# ----------------------------------------------------------------------------- reference vs PyTorch

@pytest.mark.parametrize("act,gate,tact,tgate", [
    (("silu", 0.0, 0.0), ("sigmoid", 0.0, 0.0), "SiLU", "Sigmoid"),
    (("relu", 0.0, 0.0), ("hardsigmoid", 1 / 6, 0.5), "ReLU", "Hardsigmoid"),
])
def test_reference_equals_pytorch_squeeze_excitation(act, gate, tact, tgate):
    torch = pytest.importorskip("torch")
    c, r = 21, 5
    x = rand(3, c, 7, 6)
    w1, b1, w2, b2 = se_weights(c, r)
    with torch.no_grad():
        t = torch.from_numpy
        m = t(x).mean((2, 3), keepdim=True)
        h = getattr(torch.nn, tact)()(torch.nn.functional.conv2d(m, t(w1), t(b1)))
        want = getattr(torch.nn, tgate)()(torch.nn.functional.conv2d(h, t(w2), t(b2))).numpy()
    close(ref.squeeze_excitation(x, w1, b1, w2, b2, act, gate), want)


# ----------------------------------------------------------------------------- kernels vs reference

@pytest.mark.parametrize("n,c,hw", [(1, 5, 1), (3, 33, 7), (1, 40, 13), (3, 16, 13), (2, 100, 1)])
def test_global_avg_pool_both_layouts_and_threads(n, c, hw):
    from tilefuse.kernels import pool
    from tilefuse.kernels.conv import to_nchwc
    x = rand(n, c, hw, hw + 2)
    want = ref.global_avg_pool(x)
    for layout, xin in (("nchw", x), ("nchwc", to_nchwc(x))):
        outs = []
        for th in THREADS:
            out = np.full((n, c, 1, 1), np.nan, np.float32)
            pool.global_avg_pool(out, xin, layout=layout, threads=th)
            outs.append(out)
        close(outs[0], want, 1e-6)
        for o in outs[1:]:
            np.testing.assert_array_equal(o, outs[0])


@pytest.mark.parametrize("layout,shape", [("nchw", (1, 2, 2048, 2048)), ("nchwc", (1, 1, 512, 1024, 16))])
def test_global_avg_pool_of_a_large_map_keeps_float32_precision(layout, shape):
    """The mean of 4M / 0.5M positions a lane within 1e-6 of float64 (one float32 chain over the positions was
    0.55% off over a 3 x 9.4M-position map, ONNX Runtime 0.034%: tests/onnx_mutants.py seed 7031886), the same
    bits for 1 and 2 threads."""
    from tilefuse.kernels import pool
    x = np.random.default_rng(4).random(shape, dtype=np.float32)      # in [0, 1): sums grow past 2^21
    want = x.astype(np.float64).mean(axis=(2, 3)).reshape(-1)
    outs = []
    for th in (1, 2):
        out = np.full((1, want.size, 1, 1), np.nan, np.float32)
        pool.global_avg_pool(out, x, layout=layout, threads=th)
        outs.append(out.reshape(-1))
    np.testing.assert_allclose(outs[0], want, rtol=1e-6)
    np.testing.assert_array_equal(outs[1], outs[0])


@pytest.mark.parametrize("n,c,r,hw", [(1, 5, 2, 1), (3, 33, 8, 7), (1, 40, 10, 13), (3, 96, 4, 13), (2, 17, 3, 7)])
@pytest.mark.parametrize("act,gate", [(("silu", 0.0, 0.0), ("sigmoid", 0.0, 0.0)),
                                      (("relu", 0.0, 0.0), ("hardsigmoid", 1 / 6, 0.5)),
                                      (("identity", 0.0, 0.0), ("sigmoid", 0.0, 0.0))])
def test_squeeze_excitation_kernel_both_layouts_and_threads(n, c, r, hw, act, gate):
    from tilefuse.kernels import squeeze
    from tilefuse.kernels.conv import to_nchwc
    x = rand(n, c, hw, hw)
    w1, b1, w2, b2 = se_weights(c, r)
    want = ref.squeeze_excitation(x, w1, b1, w2, b2, act, gate)
    for layout, xin in (("nchw", x), ("nchwc", to_nchwc(x))):
        outs = []
        for th in THREADS:
            out = np.full((n, c, 1, 1), np.nan, np.float32)
            squeeze.squeeze_excitation(out, xin, w1, b1, w2, b2, act=act, gate=gate, layout=layout, threads=th)
            outs.append(out)
        close(outs[0], want)
        for o in outs[1:]:
            np.testing.assert_array_equal(o, outs[0])


@pytest.mark.parametrize("n,c,r,hw", [(1, 960, 240, 7), (5, 1000, 250, 3), (1, 700, 190, 5), (3, 520, 130, 1)])
def test_large_fc_weights_split_rows_over_tasks(n, c, r, hw, monkeypatch):
    """FC weights of at least squeeze.SPLIT_BYTES (MobileNetV3-Large's 960 -> 240 -> 960) run both FCs in
    row chunks (a rule on the shape only): the reference within tolerance, the same bits at every thread
    count, from x and from row sums, and the unsplit kernel's values within 1e-6."""
    from tilefuse.kernels import squeeze
    from tilefuse.kernels.conv import to_nchwc
    from tilefuse.kernels.conv._nb import row_sum16
    assert squeeze.fc_chunks(r, c) > 1 and squeeze.fc_chunks(48, 1152) == 1   # EfficientNet-B0's largest: one
    x = rand(n, c, hw, hw)
    w1, b1, w2, b2 = se_weights(c, r)
    act, gate = ("hardswish", 0.0, 0.0), ("hardsigmoid", 1 / 6, 0.5)
    want = ref.squeeze_excitation(x, w1, b1, w2, b2, act, gate)
    xb = to_nchwc(x)
    rs = np.zeros((n, xb.shape[1], hw, 16), np.float32)       # x's row sums, as the depthwise epilogue writes them
    xf, rsf = xb.reshape(-1), rs.reshape(-1)
    for i in range(n * xb.shape[1] * hw):
        row_sum16(xf, i * hw * 16, hw, rsf, i * 16)

    def run(layout, th, sums=None):
        out = np.full((n, c, 1, 1), np.nan, np.float32)
        squeeze.squeeze_excitation(out, x if layout == "nchw" else xb, w1, b1, w2, b2, act=act, gate=gate,
                                   layout=layout, threads=th, row_sums=sums)
        return out
    outs = [run(lay, th, sums) for lay, sums in (("nchw", None), ("nchwc", None), ("nchwc", rs)) for th in THREADS]
    close(outs[0], want)
    for o in outs[len(THREADS):]:
        np.testing.assert_array_equal(o, outs[len(THREADS)])      # blocked: from x and from row sums alike
    close(outs[len(THREADS)], want)
    monkeypatch.setattr(squeeze, "SPLIT_BYTES", 1 << 40)
    assert squeeze.fc_chunks(r, c) == 1
    close(run("nchwc", 2), outs[len(THREADS)], tol=1e-6)


@pytest.mark.parametrize("n,c,o,hw", [(1, 33, 17, 13), (3, 40, 70, 7), (3, 20, 5, 13), (1, 100, 70, 1), (2, 7, 3, 7)])
def test_input_scaled_conv_bound_both_paths_and_threads(n, c, o, hw, monkeypatch):
    """The bound NCHW16c form (weights packed once): the scaled-weights path and the
    scaled-input path (kernels/se_conv.scales_weights) both equal the reference, for any
    thread count bitwise, with a residual and an activation."""
    from tilefuse.kernels import se_conv
    from tilefuse.kernels.conv import from_nchwc, to_nchwc
    x = rand(n, c, hw, hw + 1)
    wt, b = rand(o, c, 1, 1, scale=0.2), rand(o)
    res = rand(n, o, hw, hw + 1)
    s = RNG.random((n, c, 1, 1)).astype(np.float32)
    act = ("silu", 0.0, 0.0)
    want = ref.conv2d(x, wt, b, (1, 1), (0, 0, 0, 0), (1, 1), 1, residual=res, act=act, input_scale=s)
    xb, rb = to_nchwc(x), to_nchwc(res)
    params = dict(has_bias=True, has_residual=True, layout="nchwc", act=act, relu=False)
    for weights in (True, False):      # force the scaled weights / the scaled input
        monkeypatch.setattr(se_conv, "scales_weights", lambda *a: weights)
        outs = []
        for th in THREADS:
            out = np.full((n, -(-o // 16), hw, hw + 1, 16), np.nan, np.float32)
            fn = se_conv.bind([xb, wt, b, rb, s, out], dict(params, threads=th))
            fn(out, xb, wt, b, rb, s)
            outs.append(out)
        close(from_nchwc(outs[0], o), want)
        for q in outs[1:]:
            np.testing.assert_array_equal(q, outs[0])


@pytest.mark.parametrize("mode", ["numba", "pool"])
def test_input_scaled_conv_one_region_replayed_with_new_values(mode, monkeypatch):
    """The scaled-input path runs the scaling and the 1x1 in one task loop (se_conv._se1x1_seq: a scaling
    phase the 1x1 tasks wait for). Called again and again as a session calls a bound layer (the same operand
    arrays, new values in them: from the second call on its task loop is replayed, threads.replaying), on
    numba's pool and on ours (threads.region_plan), at 1, 2, 3 and 8 threads: every call equals the reference
    for that call's input and scale (a 1x1 that ran before the scaled copy was complete, or on the last call's
    copy, would not), the threads bitwise alike. RegNetY's 7x7 shape (C = O: the input is scaled, in 3 tasks)
    and an odd one (C = 37: a partial last block)."""
    from tilefuse.kernels import se_conv, threads
    from tilefuse.kernels.conv import from_nchwc, to_nchwc
    monkeypatch.setitem(threads._NUMBA, "mode", mode)
    for n, c, o, hw in [(1, 440, 440, 7), (2, 37, 45, 5)]:
        assert not se_conv.scales_weights(n, c, o, hw * hw)
        xb = to_nchwc(rand(n, c, hw, hw))
        s = RNG.random((n, c, 1, 1)).astype(np.float32)
        wt, b = rand(o, c, 1, 1, scale=1 / np.sqrt(c)), rand(o)
        params = dict(has_bias=True, has_residual=False, layout="nchwc", act=None, relu=True)
        outs = {}
        fns = {}
        threads.region_counts(reset=True)
        for call in range(3):
            x = rand(n, c, hw, hw)
            xb[...] = to_nchwc(x)
            s[...] = RNG.random((n, c, 1, 1))
            want = ref.conv2d(x, wt, b, (1, 1), (0, 0, 0, 0), (1, 1), 1, relu=True, input_scale=s)
            for th in (1, 2, 3, 8):
                out = outs.setdefault(th, np.full((n, -(-o // 16), hw, hw, 16), np.nan, np.float32))
                fn = fns.setdefault(th, se_conv.bind([xb, wt, b, s, out], dict(params, threads=th)))
                fn(out, xb, wt, b, s)
                close(from_nchwc(out, o), want)
                np.testing.assert_array_equal(out, outs[1])
        assert threads.region_counts()["replayed"] == 4      # the third call of each binding


def test_scale_phase_waits_for_a_task_another_worker_is_writing():
    """The scaling phase's wait (se_conv._scale_phase): a worker that finds every scaling task taken returns only
    once all are written, polling the count and, after YIELD_AFTER polls, giving its core away between polls
    (conv/_nb.cpu_yield). Here the last task is 'written' by another thread 50 ms later: the worker returns
    after that, not before, and does return (its GIL released: nogil)."""
    import threading
    import time
    from tilefuse.kernels import se_conv
    x4 = rand(1, 3, 7, 16)
    xs4 = np.zeros_like(x4)
    s2 = rand(1, 40)
    counter = np.zeros(4, np.int64)
    counter[1] = 3          # (N = 1) x 3 chunks of one block: all taken
    counter[2] = 2          # two written, one still being written elsewhere
    t0 = time.perf_counter()
    waiter = threading.Thread(target=se_conv._scale_phase, args=(counter, xs4, x4, s2, 1), daemon=True)
    waiter.start()
    time.sleep(0.05)
    assert waiter.is_alive()
    counter[2] += 1
    waiter.join(10)
    assert not waiter.is_alive() and time.perf_counter() - t0 >= 0.05
    assert not xs4.any()    # it took no task itself


# ----------------------------------------------------------------------------- the compiler pass

def _se_net(c=37, r=9, n=3, hw=7, shared_mean=False, gate="sigmoid"):
    """conv -> SE (mean, 1x1 conv + SiLU, 1x1 conv + gate, mul) -> 1x1 conv, as the zoo writes it;
    shared_mean: the mean also feeds the output (the pattern must not fuse)."""
    net = tilefuse.Network("se")
    x = net.input("x", (n, 8, hw, hw))
    y = net.conv2d(x, net.constant("w0", rand(c, 8, 3, 3, scale=0.3)), net.constant("b0", rand(c)), padding=1, name="c0")
    m = net.global_avg_pool(y, name="pool")
    w1, b1, w2, b2 = se_weights(c, r)
    s = net.conv2d(m, net.constant("w1", w1), net.constant("b1", b1), name="fc1")
    s = net.activation(s, "silu", name="act")
    s = net.conv2d(s, net.constant("w2", w2), None, name="fc2")
    s = net.activation(s, gate, name="gate")
    z = net.mul(y, s, name="mul")
    z = net.conv2d(z, net.constant("w3", rand(19, c, 1, 1, scale=0.2)), net.constant("b3", rand(19)), name="proj")
    net.output(z)
    if shared_mean:
        net.output(m)
    return net


@pytest.mark.parametrize("threads", [1, 2])
def test_se_block_compiles_to_one_instruction_and_matches_the_reference(threads, tmp_path):
    net = _se_net()
    c = tilefuse.compile(net, threads=threads)
    kinds = [o.op for o in c.network.ops]
    assert kinds.count("squeeze_excitation") == 1 and "global_avg_pool" not in kinds, kinds
    se = next(o for o in c.network.ops if o.op == "squeeze_excitation")
    assert se.params["act"][0] == "silu" and se.params["gate"][0] == "sigmoid"
    pkg = tilefuse.load_package(c.save(tmp_path / "se.tfpkg"))      # every instruction validated on load
    x = rand(*net.inputs[0].shape)
    want = evaluate(net, {"x": x})
    want = list(want.values())[0] if isinstance(want, dict) else want[0]
    close(tilefuse.Session(pkg, threads=threads).run(x), want)
    # the SE scale reads the blocked conv output: conversions only at the network's input / output
    kernels = [i.kernel for i in c.package.program()]
    assert kernels.count("squeeze_excitation") == 1
    assert kernels.count("to_nchwc") <= 1 and kernels.count("from_nchwc") <= 1, kernels


def test_a_shared_mean_is_not_fused():
    net = _se_net(shared_mean=True)
    c = tilefuse.compile(net)
    kinds = [o.op for o in c.network.ops]
    assert "squeeze_excitation" not in kinds and "global_avg_pool" in kinds
    x = rand(*net.inputs[0].shape)
    want = evaluate(net, {"x": x})
    want = list(want.values()) if isinstance(want, dict) else list(want)
    got = tilefuse.Session(c).run(x)
    for g, v in zip(got, want):
        close(g, v)


def test_validator_refuses_a_crafted_squeeze_excitation():
    from tilefuse.compiler import validate as V
    from tilefuse.compiler.program import CONST, DIRECT, HIDDEN, Instruction, Operand

    def op(name, shape, seg=HIDDEN):
        return Operand(name, DIRECT, seg, np.dtype(np.float32), shape)
    good = [op("x", (2, 3, 5, 5, 16)), op("w1", (4, 40, 1, 1), CONST), op("b1", (4,), CONST),
            op("w2", (40, 4, 1, 1), CONST), op("b2", (40,), CONST), op("s", (2, 40, 1, 1))]
    p = dict(act=("silu", 0.0, 0.0), gate=("sigmoid", 0.0, 0.0), layout="nchwc")
    V.VALIDATORS["squeeze_excitation"](Instruction("squeeze_excitation", good, p))
    bad = list(good)
    bad[3] = op("w2", (41, 4, 1, 1), CONST)
    with pytest.raises(ValueError, match="w2"):
        V.VALIDATORS["squeeze_excitation"](Instruction("squeeze_excitation", bad, p))
    bad = list(good)
    bad[-1] = op("s", (2, 48, 1, 1))
    with pytest.raises(ValueError):
        V.VALIDATORS["squeeze_excitation"](Instruction("squeeze_excitation", bad, p))


@pytest.mark.parametrize("batch,hw", [(1, 13), (3, 7)])
def test_torch_se_block_fuses_and_matches_pytorch(batch, hw):
    """The idiom real model code writes (tests/modern_models.py: x.mean((2, 3), keepdim=True),
    conv fc1, SiLU, conv fc2, Sigmoid, s * x, then a 1x1 projection) through from_torch: one
    squeeze_excitation op, equal to PyTorch."""
    torch = pytest.importorskip("torch")
    import modern_models as mm
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Conv2d(5, 40, 3, padding=1), torch.nn.SiLU(),
                                mm.SqueezeExcitation(40, 10, act=torch.nn.SiLU), torch.nn.Conv2d(40, 24, 1)).eval()
    x = torch.randn(batch, 5, hw, hw)
    net = tilefuse.from_torch(block, x)
    c = tilefuse.compile(net, threads=2)
    assert [o.op for o in c.network.ops].count("squeeze_excitation") == 1
    with torch.no_grad():
        want = block(x).numpy()
    close(tilefuse.Session(c, threads=2).run(x.numpy()), want)
