"""simulate(): compiled programs executed on the machine models equal the reference evaluator,
and the timing obeys the invariants a machine model must (efficiency <= 100%, bandwidth and
memory changes act where they should, more cores never slower without a saturated link)."""
from __future__ import annotations

import json

import numpy as np
import pytest

import tilefuse
from tilefuse.errors import UnsupportedOpError
from tilefuse.imaging.reference import correlate_reference
from tilefuse.stream.cli import model_for_input
from tilefuse.targets import (CapacityError, FilterJob, SimulationError, TrainingJob, fusion_speedup,
                              qinglong_modes, scaling, simulate)

TARGETS = ["ft-m7032", "host", "cambricon-x", "virtex7-690t", "trainer-004"]
# FP16 targets: relative error of the outputs vs the FP32 reference (FP16 storage, FP32 sums);
# the host computes in FP32 (blocked sums in a different order: rounding only)
TOL = {"float16": 5e-3, "float32": 1e-5}


def _zoo():
    """Every zoo model at small sizes: VGG16 / AlexNet as their full convolutional trunks (their
    heads need 224x224 inputs; the head ops are covered by the ResNets, tinynet and AlexNet-224)."""
    return {
        "tinynet": tilefuse.models.tinynet(batch=2),
        "resnet18": tilefuse.models.resnet18(image_size=32),
        "resnet50": tilefuse.models.resnet50(image_size=32),
        "alexnet-trunk": model_for_input("alexnet", (67, 67)),
        "vgg16-trunk": model_for_input("vgg16", (32, 32)),
    }


@pytest.fixture(scope="module")
def zoo():
    out = {}
    for name, net in _zoo().items():
        x = np.random.default_rng(1).standard_normal(net.inputs[0].shape).astype(np.float32)
        out[name] = (net, tilefuse.compile(net), x, tilefuse.evaluate(net, x))
    return out


def _err(outs, refs) -> float:
    return max(float(np.abs(a.astype(np.float64) - b).max() / np.abs(b).max()) for a, b in zip(outs, refs))


@pytest.mark.parametrize("target", TARGETS)
def test_zoo_outputs_equal_the_reference(zoo, target):
    for name, (net, compiled, x, ref) in zoo.items():
        rep = simulate(compiled, target, inputs=x)
        assert [o.shape for o in rep.outputs] == [r.shape for r in ref]
        assert [o.dtype for o in rep.outputs] == [r.dtype for r in ref]
        err = _err(rep.outputs, ref)
        assert err <= TOL[rep.target.dtype], (name, target, err)
        for r in rep.layers:                                     # efficiency never above 100%
            assert 0.0 <= r.efficiency <= 1.0 + 1e-9, (name, target, r.name, r.efficiency)
            assert r.utilization <= 1.0 + 1e-9
        json.dumps(rep.to_dict())                                # the report serializes


def test_alexnet_224_with_its_head():
    net = tilefuse.models.alexnet(num_classes=10)
    x = np.random.default_rng(0).standard_normal(net.inputs[0].shape).astype(np.float32)
    ref = tilefuse.evaluate(net, x)
    for target in ("virtex7-690t", "host"):
        rep = simulate(tilefuse.compile(net), target, inputs=x)
        assert _err(rep.outputs, ref) <= TOL[rep.target.dtype], target


def test_multi_core_ft_m7032_outputs(zoo):
    net, compiled, x, ref = zoo["resnet18"]
    for n in (1, 3, 8):
        rep = simulate(compiled, "ft-m7032", cores=n, inputs=x)
        assert _err(rep.outputs, ref) <= TOL["float16"]
        assert rep.cores == n


def test_a_float16_network_is_supported():
    net = tilefuse.models.tinynet(dtype=np.float16)
    x = np.random.default_rng(0).standard_normal(net.inputs[0].shape).astype(np.float16)
    ref = tilefuse.evaluate(net, x)
    rep = simulate(tilefuse.compile(net), "ft-m7032", inputs=x)
    assert rep.outputs[0].dtype == np.float16
    assert _err(rep.outputs, [r.astype(np.float32) for r in ref]) <= 2e-2


# ----------------------------------------------------------------------------- VCK5000 (seed 001)

def test_vck5000_filter_job_is_exact_int32():
    k = np.array([[64, 128, 64], [128, 256, 128], [64, 128, 64]])
    img = np.random.default_rng(3).integers(-(2 ** 20), 2 ** 20, size=(75, 131)).astype(np.int32)
    rep = simulate(FilterJob(k, img), "vck5000-aie")
    ref = correlate_reference(img, k, "replicate")
    assert rep.outputs[0].dtype == np.int32 and np.array_equal(rep.outputs[0], ref)
    k5 = np.arange(25).reshape(5, 5) - 12
    rep = simulate(FilterJob(k5, img, border="constant"), "vck5000-aie", cores=3)
    assert np.array_equal(rep.outputs[0], correlate_reference(img, k5, "constant"))


def test_vck5000_runs_stride1_convolutions_and_rejects_the_rest():
    net = tilefuse.Network("two-convs")
    x = net.input("x", (1, 2, 40, 70))
    rng = np.random.default_rng(0)
    y = net.conv2d(x, rng.standard_normal((3, 2, 3, 3)).astype(np.float32), np.ones(3, np.float32), padding=1)
    y = net.conv2d(y, rng.standard_normal((2, 3, 5, 5)).astype(np.float32), None, padding=2)
    net.output(y)
    xv = rng.standard_normal((1, 2, 40, 70)).astype(np.float32)
    rep = simulate(tilefuse.compile(net), "vck5000-aie", inputs=xv)
    assert _err(rep.outputs, tilefuse.evaluate(net, xv)) <= 1e-5
    with pytest.raises(UnsupportedOpError, match=r"instruction 0 \(conv2d 'conv1'.*needs stride 1.*\(2, 2\)"):
        simulate(tilefuse.compile(tilefuse.models.resnet18(image_size=32)), "vck5000-aie")
    pooled = tilefuse.Network("conv-pool")
    y = pooled.conv2d(pooled.input("x", (1, 1, 16, 16)), np.ones((1, 1, 3, 3), np.float32), None, padding=1)
    pooled.output(pooled.max_pool(y, 2, name="pool"))
    with pytest.raises(UnsupportedOpError, match=r"instruction 1 \(max_pool 'pool'.*has no max_pool"):
        simulate(tilefuse.compile(pooled), "vck5000-aie")


def test_vck5000_frame_time_model():
    k = np.ones((3, 3), np.int32)
    rep = simulate(FilterJob(k, shape=(2160, 3840)), "vck5000-aie", functional=False)
    assert rep.extra["tiles"] == 4464                           # 62 x 72 tiles, as the repository computes
    assert rep.layers[0].bottleneck == "link mm2s"              # the PL mover, not the AI Engines
    assert rep.outputs is None


# ----------------------------------------------------------------------------- invariants

def _single_conv(ci, co, hw, k, n=4, stride=1):
    net = tilefuse.Network(f"conv{k}")
    x = net.input("x", (n, ci, hw, hw))
    w = np.random.default_rng(0).standard_normal((co, ci, k, k)).astype(np.float32) / (ci * k * k) ** 0.5
    net.output(net.conv2d(x, w, None, stride=stride, padding=k // 2, name="conv"))
    return net, tilefuse.compile(net)


def test_doubling_a_link_halves_a_bound_layer_and_leaves_a_compute_bound_one():
    _, link_bound = _single_conv(512, 16, 28, 1, n=32)           # 1x1, few outputs, 8 cores: DDR-bound
    _, compute_bound = _single_conv(2048, 512, 7, 1, n=4)         # 1x1, deep, one core: compute-bound
    base = {"link.ddr.latency": "0 us", "link.gsm.latency": "0 us", "gsm_tensor_fraction": 1e-9}
    a = simulate(link_bound, "ft-m7032", cores=8, functional=False, **base).layers[0]
    b = simulate(link_bound, "ft-m7032", cores=8, functional=False, ddr="85.2 GB/s", **base).layers[0]
    assert a.bottleneck == "link ddr" and a.link_busy("ddr") > 0.95 * a.seconds
    assert b.seconds / a.seconds == pytest.approx(0.5, abs=0.03)
    c = simulate(compute_bound, "ft-m7032", cores=1, functional=False, **base).layers[0]
    d = simulate(compute_bound, "ft-m7032", cores=1, functional=False, ddr="85.2 GB/s", **base).layers[0]
    assert c.bottleneck == "compute" and c.utilization > 0.95
    assert d.seconds / c.seconds == pytest.approx(1.0, abs=0.01)
    _, deep3x3 = _single_conv(256, 256, 14, 3, n=8)
    g = simulate(deep3x3, "trainer-004", functional=False).layers[0]
    h = simulate(deep3x3, "trainer-004", functional=False, feature="410 GB/s").layers[0]
    assert g.bottleneck == "compute" and h.seconds / g.seconds == pytest.approx(1.0, abs=0.01)
    # the same on the trainer's feature link, for a streamed (memory-bound) layer
    net = tilefuse.Network("relu")
    x = net.input("x", (8, 64, 56, 56))
    net.output(net.relu(x))
    e = simulate(tilefuse.compile(net), "trainer-004", functional=False).layers[0]
    f = simulate(tilefuse.compile(net), "trainer-004", functional=False, feature="410 GB/s").layers[0]
    assert e.bottleneck == "link feature" and f.seconds / e.seconds == pytest.approx(0.5, abs=0.03)


def test_shrinking_a_memory_changes_the_blocking_never_the_output(zoo):
    net, compiled, x, ref = zoo["resnet18"]
    big = simulate(compiled, "ft-m7032", inputs=x)
    small = simulate(compiled, "ft-m7032", inputs=x, AM="96KiB", SM="16KiB")
    assert [r.mapping for r in big.layers] != [r.mapping for r in small.layers]
    assert all(r.peaks.get("AM", 0) <= 96 * 1024 for r in small.layers)
    assert _err(small.outputs, ref) <= TOL["float16"]
    np.testing.assert_allclose(small.outputs[0], big.outputs[0], rtol=2e-3, atol=2e-3 * np.abs(ref[0]).max())
    for target, mem in (("cambricon-x", {"NBin": "2KiB", "SB": "512B"}), ("trainer-004", {"Fbuf_In": "64KiB"}),
                        ("host", {"L2": "32KiB"})):
        a = simulate(compiled, target, inputs=x)
        b = simulate(compiled, target, inputs=x, **mem)
        assert [r.mapping for r in a.layers] != [r.mapping for r in b.layers], target
        assert _err(b.outputs, ref) <= TOL[b.target.dtype], target


def test_a_tile_that_cannot_fit_is_an_error_naming_the_memory(zoo):
    _, compiled, x, _ = zoo["tinynet"]
    with pytest.raises(CapacityError, match=r"AM\[core 0\]: .* needs \d+ B .* does not fit"):
        simulate(compiled, "ft-m7032", AM="1KiB")
    with pytest.raises(CapacityError, match="NBin"):
        simulate(compiled, "cambricon-x", NBin="64B")


def test_more_cores_never_slower_unless_a_shared_link_saturates(zoo):
    for name in ("resnet18", "vgg16-trunk"):
        _, compiled, _, _ = zoo[name]
        sc = scaling(compiled, "ft-m7032", cores=(1, 2, 4, 8))
        assert sc.slower_without_reason() == [], name
        for row in sc.layer_rows():
            assert row["S"][1] == pytest.approx(1.0)
            assert all(0 < row["S"][n] <= 1.0 + 1e-9 for n in (2, 4, 8)), row
    _, big = _single_conv(256, 64, 56, 1, n=32)
    sc = scaling(big, "ft-m7032", cores=(1, 2, 4, 8))
    rows = sc.layer_rows()
    assert rows[0]["S"][8] < rows[0]["S"][2] < 1.0               # bandwidth-limited scaling ...
    assert rows[0]["saturated"][8] == ["ddr"]                    # ... and the report names the link
    assert "S_n = P_n / (n P_1)" in sc.table()


def test_timing_does_not_depend_on_executing(zoo):
    _, compiled, x, _ = zoo["resnet50"]
    for target in TARGETS:
        a = simulate(compiled, target, inputs=x)
        b = simulate(compiled, target, functional=False)
        assert [r.seconds for r in a.layers] == [r.seconds for r in b.layers], target
        assert b.outputs is None


def test_a_package_without_its_network(tmp_path, zoo):
    net, _, x, ref = zoo["tinynet"]
    plain = tilefuse.compile(net, algorithm="reference")
    pkg = tilefuse.load_package(plain.save(tmp_path / "t.tfpkg"))
    rep = simulate(pkg, "ft-m7032", inputs=x)
    assert _err(rep.outputs, ref) <= TOL["float16"]
    blocked = tilefuse.load_package(tilefuse.compile(net).save(tmp_path / "b.tfpkg"))
    with pytest.raises(SimulationError, match="prepared form"):
        simulate(blocked, "ft-m7032")


def test_bad_inputs():
    with pytest.raises(TypeError, match="CompiledNetwork, a DataPackage or a Network"):
        simulate("resnet50", "ft-m7032")
    compiled = tilefuse.compile(tilefuse.models.tinynet())
    with pytest.raises(SimulationError, match=r"input 'x' has shape \(1, 3, 8, 8\), expected \(1, 3, 32, 32\)"):
        simulate(compiled, "host", inputs=np.zeros((1, 3, 8, 8), np.float32))


# ----------------------------------------------------------------------------- per-paper extras

def test_qinglong_modes_from_one_run():
    net = tilefuse.Network("fc")
    x = net.input("x", (1, 512))
    net.output(net.linear(x, np.zeros((256, 512), np.float32), np.zeros(256, np.float32)))
    rep = simulate(tilefuse.compile(net), "cambricon-x", functional=False)
    m = qinglong_modes(rep, 100, compile_seconds=0.01)
    s = {k: m.speedup(k) for k in ("dlplib", "ql1", "ql2", "ql3")}
    assert s["dlplib"] == 1.0 and s["dlplib"] < s["ql1"] < s["ql2"] <= s["ql3"]
    one = qinglong_modes(rep, 1, compile_seconds=0.01)
    assert one.seconds("ql2") == pytest.approx(one.seconds("ql3"))        # nothing to overlap for one input
    assert rep.extra["constant_bytes"] >= 256 * 512 * 2


def test_virtex7_pipeline():
    net = model_for_input("alexnet", (67, 67))
    rep = simulate(tilefuse.compile(net), "virtex7-690t", functional=False)
    stages = [r.seconds for r in rep.layers if r.seconds > 0]
    assert rep.extra["interval"] == pytest.approx(max(stages))
    assert sum(rep.extra["dsps"].values()) <= 3600
    assert any("Winograd" in r.mapping for r in rep.layers)


def test_training_job_fused_and_separate():
    net = tilefuse.models.tinynet(batch=4)
    fs = fusion_speedup(net, batch_scale=2)
    sep, fus = fs["separate"]["report"], fs["fused"]["report"]
    assert sep.extra["loss"] == pytest.approx(fus.extra["loss"], rel=1e-5)
    for k, g in sep.extra["grads"].items():
        np.testing.assert_allclose(fus.extra["grads"][k], g, rtol=1e-4, atol=1e-5)
    feat = lambda r: sum(x.bytes["link feature"] for x in r.layers)  # noqa: E731
    assert feat(fus) < feat(sep)
    assert fs["fwd_gain"] > 0 and fs["bwd_gain"] > 0
    one = simulate(TrainingJob(net, "fused", 1), "trainer-004")
    assert feat(fus) == 2 * feat(one)                                  # activation traffic scales with the batch
    with pytest.raises(ValueError, match="expected 'fused' or 'separate'"):
        TrainingJob(net, "both")


# ----------------------------------------------------------------------------- the seeds' mechanisms

def _ftm(**ov):
    from tilefuse.targets import load_target
    from tilefuse.targets.strategies.ftm7032 import FTM7032
    return FTM7032(load_target("ft-m7032", **ov), functional=False)


def test_ft_m7032_1x1_kernel_follows_algorithm_1():
    # Nb = 192 FP16 values = 48 words = 3 vector registers: one FMA per FMAC per broadcast weight
    s = _ftm()
    assert s.chunk_vregs() == 3
    K, m = 256, 8
    tail = 6 + m * 3 / 2 + 10                   # FMA drain, m x 3 stores at 2 per cycle, loop set-up
    assert s.k1x1_cycles(m, K, 48) == pytest.approx(K * m + tail)      # a K step: m broadcasts, 3m FMAs
    # a one-register row (16 words) is broadcast-bound: the same m cycles per K step for a third
    # of the work, so two such rows cost nearly what the 3-register chunk costs twice
    one = s.k1x1_cycles(m, K, 16)
    assert one == pytest.approx(K * m + 6 + m / 2 + 10)
    assert s.k1x1_cycles(m, K, 96) == pytest.approx(2 * (K * m + tail))
    assert s.k1x1_cycles(m, K, 64) == pytest.approx(K * m + tail + one)   # 3 registers + 1
    # half a broadcast per cycle doubles a K step; m below the FMA pipeline depth stalls on it
    assert _ftm(broadcasts_per_cycle=0.5).k1x1_cycles(m, K, 48) == pytest.approx(2 * K * m + tail)
    assert s.k1x1_cycles(4, K, 48) == pytest.approx(K * 6 + 6 + 4 * 3 / 2 + 10)
    # m <= 12 from the registers: 3m accumulators + 3 row + m broadcast registers <= 64 - 4
    assert s.blocking_1x1(96, 256, 3136, 1, 2)["m"] == 12
    assert _ftm(reserved_registers=16).blocking_1x1(96, 256, 3136, 1, 2)["m"] <= 11
    # Nb is a multiple of 192 values (48 words) grown while two Ib and Ob fit AM (section 3.1.1)
    b = s.blocking_1x1(64, 256, 3136, 1, 2)
    assert b["K"] == 256 and b["Nb"] % 48 == 0 and 2 * 256 * b["Nb"] * 4 * 2 + 64 * b["Nb"] * 4 * 2 <= 768 * 1024


def test_ft_m7032_kxk_kernel_follows_algorithm_2():
    s = _ftm()
    # per tap: 3 FMAs (48 channels), one broadcast input word, 3 weight registers from AM (4 per cycle)
    taps, cib, npix = 9, 64, 10
    word = cib * taps * 1 + 8 * 3 / 3 + 6 + 3 / 2 + 10     # + the 9 groups summed, drain, store, loop
    assert s.kxk_cycles(npix, cib, 3, 3, 48) == pytest.approx(npix * word + 2 * npix * 3 / 2)
    later = s.kxk_cycles(npix, cib, 3, 3, 48, first_ci=False) - s.kxk_cycles(npix, cib, 3, 3, 48)
    assert later == pytest.approx(npix * (3 / 4 + 3 / 3))   # the earlier Ci blocks' partial sums


def test_ft_m7032_single_weight_buffer_serialises_weight_loads():
    # section 2.4: for k x k only the input in SM has two buffers, so a weight broadcast waits
    # for the compute on the previous block and the compute waits for it
    _, c = _single_conv(128, 96, 14, 3, n=4)
    one = simulate(c, "ft-m7032", cores=1, functional=False).layers[0]
    two = simulate(c, "ft-m7032", cores=1, functional=False, kxk_weight_buffers=2).layers[0]
    assert "one buffer" in one.mapping and "2 buffers" in two.mapping
    assert one.seconds >= 0.95 * (one.compute_busy + one.link_busy("ddr"))
    assert two.seconds < 0.8 * (two.compute_busy + two.link_busy("ddr"))
    net, c = _single_conv(40, 20, 9, 3, n=3)
    x = np.random.default_rng(2).standard_normal(net.inputs[0].shape).astype(np.float32)
    ref = tilefuse.evaluate(net, x)
    for nb in (1, 2):
        rep = simulate(c, "ft-m7032", cores=2, inputs=x, kxk_weight_buffers=nb)
        assert _err(rep.outputs, ref) <= TOL["float16"]


def test_dma_start_up_delays_a_transfer_but_leaves_the_shared_link_free():
    _, c = _single_conv(512, 16, 28, 1, n=32)
    base = {"gsm_tensor_fraction": 1e-9}
    a = simulate(c, "ft-m7032", cores=8, functional=False, **base, **{"link.ddr.latency": "0 us"}).layers[0]
    b = simulate(c, "ft-m7032", cores=8, functional=False, **base, **{"link.ddr.latency": "1 us"}).layers[0]
    assert b.link_busy("ddr") == pytest.approx(a.link_busy("ddr"))          # bytes / bandwidth only
    assert b.link_busy("ddr") == pytest.approx(a.bytes["link ddr"] / (42.6e9 * 0.77))
    assert a.seconds <= b.seconds < 1.1 * a.seconds


def test_ft_m7032_runs_a_fused_residual_add_as_its_own_pass():
    compiled = tilefuse.compile(tilefuse.models.resnet18(image_size=32, batch=4))    # whole N4 groups
    sep = simulate(compiled, "ft-m7032", functional=False)
    fus = simulate(compiled, "ft-m7032", functional=False, fuse_residual=1)
    res = [i for i, r in enumerate(fus.layers) if r.kernel == "conv2d" and "residual Add" in sep.layers[i].mapping]
    assert res and not any("residual Add" in r.mapping for r in fus.layers)
    for i in res:       # the Add pass reads the conv's output and the shortcut and writes the sum
        assert sep.layers[i].bytes.get("link ddr", 0) + sep.layers[i].bytes.get("link gsm", 0) > \
            fus.layers[i].bytes.get("link ddr", 0) + fus.layers[i].bytes.get("link gsm", 0)
        assert sep.layers[i].seconds > fus.layers[i].seconds
    assert sep.layers[res[0]].flops == fus.layers[res[0]].flops


def test_cambricon_host_side_is_modelled_from_the_target():
    net = tilefuse.Network("fc")
    x = net.input("x", (1, 512))
    net.output(net.linear(x, np.zeros((256, 512), np.float32), np.zeros(256, np.float32)))
    c = tilefuse.compile(net)
    rep = simulate(c, "cambricon-x", functional=False)
    e = rep.extra
    assert e["instructions"] == sum(r.instructions for r in rep.layers) > 0
    assert e["compile_seconds"] == pytest.approx(e["instructions"] * 1e-6)      # 1 us per instruction
    slow = simulate(c, "cambricon-x", functional=False, compile_per_instruction="2 us")
    assert slow.extra["compile_seconds"] == pytest.approx(2 * e["compile_seconds"])
    assert e["constant_bytes"] == (256 * 512 + 256) * 2 + 8 * e["instructions"]   # FP16 data + instructions
    # DLPlib / QingLong1 copy the constant blocks one by one (a call each), QingLong2/3 the package
    assert e["constants_separate_seconds"] == pytest.approx(e["constants_seconds"] + e["constant_blocks"] * 10e-6)
    m = qinglong_modes(rep, 50)
    i, xx, o = rep.host["copy in"], rep.seconds, rep.host["copy out"]
    assert m.seconds("dlplib") == pytest.approx(50 * (e["compile_seconds"] + e["constants_separate_seconds"] + i + xx + o))
    assert m.seconds("ql2") == pytest.approx(e["compile_seconds"] + e["pack_seconds"] + e["constants_seconds"]
                                             + 50 * (i + xx + o))
    # deterministic: nothing is timed on the machine running the model
    assert qinglong_modes(simulate(c, "cambricon-x", functional=False), 50).seconds("dlplib") == m.seconds("dlplib")


def test_vck5000_host_copies_follow_the_xrt_calls():
    k = np.ones((3, 3), np.int32)
    rep = simulate(FilterJob(k, shape=(216, 384)), "vck5000-aie", functional=False)
    nbytes = 216 * 384 * 4
    copy = nbytes / 6e9                                    # xrt::bo::write / read: a memcpy
    assert rep.host["host -> device"] == pytest.approx(copy + 50e-6 + nbytes / (15.75e9 * 0.563))
    assert rep.host["device -> host"] == pytest.approx(copy + 50e-6 + nbytes / (15.75e9 * 0.772))


def _modern_net(c=8, hw=8):
    """The ops of issue 9 that the machine models stream: a transposed conv (mixes channels), a
    conv with a fused SiLU, constants broadcast per channel ((1, C, 1, 1), (C, 1, 1)) and along W
    (a 1-D constant of length W == C, which must not be read as per-channel), prelu, reflect pad,
    bilinear resize, channel norm, concat."""
    rng = np.random.default_rng(3)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    net = tilefuse.Network("modern-ops")
    x = net.input("x", (2, c, hw, hw))
    u = net.conv_transpose2d(x, f32(c, c, 3, 3) * 0.3, f32(c),
                             stride=2, padding=1, output_padding=1)                # (2, c, 2hw, 2hw)
    y = net.activation(net.conv2d(u, f32(c, c, 3, 3) * 0.2, padding=1), "silu")
    y = net.activation(net.add(net.conv2d(y, f32(c, c, 1, 1) * 0.3), y), "hardswish")   # residual, then act
    y = net.mul(y, net.constant("s", f32(1, c, 1, 1)))
    y = net.sub(y, net.constant("m", f32(c, 1, 1)))
    y = net.add(y, net.constant("row", f32(2 * hw)))            # broadcast along W (length 2hw)
    y = net.prelu(y, np.abs(f32(c)) * 0.1)
    y = net.pad(y, (0, 0, 0, 0, 1, 2, 2, 1), mode="reflect")
    y = net.resize(y, size=(2 * hw + 5, 2 * hw + 3), mode="bilinear")
    y = net.channel_norm(y, f32(c), f32(c))
    z = net.resize(net.avg_pool(u, 2, stride=2), size=(2 * hw + 5, 2 * hw + 3), mode="nearest")
    net.output(net.concat([y, z]))
    return net


@pytest.mark.parametrize("target", TARGETS)
def test_modern_ops_equal_the_reference_or_are_refused(target):
    """Every op of a modern network either runs on the machine model with the reference's result or
    is refused by name; none is silently wrong (a transposed conv streamed in channel chunks once
    mixed the wrong input channels, a fused SiLU was dropped)."""
    net = _modern_net()
    x = np.random.default_rng(1).standard_normal(net.inputs[0].shape).astype(np.float32)
    ref = tilefuse.evaluate(net, x)
    compiled = tilefuse.compile(net)
    convs = [i.params for i in compiled.package.program() if i.kernel == "conv2d"]
    assert any(p.get("act", ("identity",))[0] == "silu" for p in convs), "the SiLU is fused into the conv"
    assert any(p.get("act", ("identity",))[0] == "hardswish" and p["has_residual"] for p in convs)
    try:
        rep = simulate(compiled, target, inputs=x)
    except (UnsupportedOpError, CapacityError) as e:     # refused by name: an op, or a memory too small
        assert target not in ("host", "ft-m7032"), e
        assert "mapping" in str(e) or "does not fit" in str(e)
        return
    assert _err(rep.outputs, ref) <= TOL[rep.target.dtype] * 4, target


def test_row_bands_of_a_plane_equal_the_reference():
    """Planes larger than the streaming memory go through in row bands: per-channel and
    broadcast constants still line up."""
    rng = np.random.default_rng(2)
    c = hw = 24                                  # a 1-D constant of length W == C runs along W
    net = tilefuse.Network("bands")
    x = net.input("x", (2, c, hw, hw))
    y = net.mul(net.relu(x), rng.standard_normal((1, c, 1, 1)).astype(np.float32))
    y = net.sub(y, rng.standard_normal((c, 1, 1)).astype(np.float32))
    y = net.add(y, net.constant("row", rng.standard_normal(hw).astype(np.float32)))
    y = net.prelu(y, np.abs(rng.standard_normal(c)).astype(np.float32) * 0.1)
    net.output(net.max_pool(y, 3, stride=2, padding=1))
    x = rng.standard_normal(net.inputs[0].shape).astype(np.float32)
    rep = simulate(tilefuse.compile(net), "host", inputs=x, L2="3KiB")
    assert any("bands" in r.mapping for r in rep.layers)
    assert _err(rep.outputs, tilefuse.evaluate(net, x)) <= 1e-5


def test_an_input_scaled_conv_is_refused_by_name():
    import torch
    from tilefuse.frontend.torch_export import from_torch

    class SE(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Conv2d(16, 4, 1), torch.nn.Conv2d(4, 16, 1)
            self.proj = torch.nn.Conv2d(16, 8, 1)

        def forward(self, x):
            s = torch.sigmoid(self.fc2(torch.relu(self.fc1(x.mean((2, 3), keepdim=True)))))
            return self.proj(x * s)

    torch.manual_seed(0)
    compiled = tilefuse.compile(from_torch(SE().eval(), torch.randn(1, 16, 8, 8)))
    if not any(i.kernel == "conv2d" and i.params.get("has_input_scale") for i in compiled.package.program()):
        pytest.fail("the SE scale is no longer fused into the conv: update this test to another refused op")
    with pytest.raises(UnsupportedOpError, match="input-scaled convolution"):
        simulate(compiled, "host")


def test_squeeze_excitation_runs_as_whole_images():
    """The fused SE op (means, two FCs, gate) mixes channels: on a machine model it is computed per
    whole image, equal to the reference (it was once chunked by channel planes like a pool)."""
    import torch
    from tilefuse.frontend.torch_export import from_torch

    class SE(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Conv2d(24, 6, 1), torch.nn.Conv2d(6, 24, 1)

        def forward(self, x):
            return torch.sigmoid(self.fc2(torch.relu(self.fc1(x.mean((2, 3), keepdim=True)))))

    torch.manual_seed(0)
    x = torch.randn(2, 24, 9, 9)
    net = from_torch(SE().eval(), x)
    compiled = tilefuse.compile(net)
    assert any(i.kernel == "squeeze_excitation" for i in compiled.package.program())
    ref = tilefuse.evaluate(net, x.numpy())
    for target in ("host", "ft-m7032"):
        rep = simulate(compiled, target, inputs=x.numpy())
        assert _err(rep.outputs, ref) <= TOL[rep.target.dtype] * 4, target
    # a memory that holds a few channel planes but not an image: refused, never chunked by channels
    with pytest.raises(CapacityError, match="chunk of one image"):
        simulate(compiled, "host", inputs=x.numpy(), L2="8KiB")
