"""Random small networks for differential testing (tests/test_random_networks.py), and a longer fuzz run.

Each builder takes a seed and returns (network, input) or None (a draw that built nothing). The networks
mix what the compiler and the kernels choose between: convs of every kernel size 1-7, stride 1-2, dilation
1-2, any padding, groups (depthwise, grouped, dense), odd channel counts and map sizes, batch norms, residual
adds, activations, max / average pools, squeeze-excitation; the streaming builder adds nearest / bilinear
upsampling and channel concats on maps of up to 90 rows; the mixed builder (build_mixed) draws from more of
the vocabulary (transposed convs, channel norms, ShuffleNetV2 units, resize, pad, classifier heads, ...).

    .venv/bin/python tests/random_nets.py --check compile --seconds 600 [--seed 1]
    .venv/bin/python tests/random_nets.py --check stream --seconds 600
    .venv/bin/python tests/random_nets.py --check sessions --seconds 300
    .venv/bin/python tests/random_nets.py --check nonfinite --seconds 300
    .venv/bin/python tests/random_nets.py --check mixed --seconds 600

`compile`: the compiled program (compiled for 1-4 threads) run on 1, 2 and 3 threads against the reference
evaluator (fp32, 1e-4 of the output's max), bitwise equal across the session thread counts, and saved /
loaded as a package (the same bits). `stream`: schedule="stream" with band_rows 1-8 against the reference.
`sessions`: two sessions on one device, run / run_many from four threads, each output bitwise the
sequential one. `nonfinite`: a NaN, +inf or -inf at one input place, compiled and streamed: every output the
reference computes as NaN (non-finite) is NaN (non-finite), and nothing raises. `mixed`: build_mixed's
networks as `compile`, and those without a head streamed (a TilefuseError refusal allowed). A run prints
each failing seed (rebuild it with the builder) and a summary line.
"""
from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tilefuse  # noqa: E402
from tilefuse.errors import TilefuseError  # noqa: E402
from tilefuse.ir import Network  # noqa: E402

ACTS = (None, "relu", "relu6", "silu", "hardswish", "sigmoid", "gelu", "leaky_relu")
STREAM_ACTS = (None, "relu", "relu6", "silu", "hardswish")
RTOL = 1e-4


def _act(net, y, a):
    if a is None:
        return y
    if a == "relu6":
        return net.relu6(y)
    if a == "leaky_relu":
        return net.activation(y, a)
    return getattr(net, a)(y)


def _conv(net, r, y, c, kind, max_k=7):
    """A random conv of `kind` (conv, dw, group) on y (c channels), or None where the window does not fit."""
    h, w = y.shape[2], y.shape[3]
    k = int(r.choice([k for k in (1, 1, 3, 3, 5, 7) if k <= max_k]))
    s, d = int(r.choice([1, 1, 2])), int(r.choice([1, 1, 1, 2]))
    p = (k // 2) * d if r.random() < 0.7 else int(r.integers(0, k // 2 * d + 1))
    if min(h, w) + 2 * p - d * (k - 1) - 1 < 0:
        return None
    if kind == "dw":
        g, o = c, c
    elif kind == "group":
        g = int(r.choice([q for q in (2, 3, 4, 8) if c % q == 0] or [1]))
        o = g * int(r.integers(1, 9))
    else:
        g, o = 1, int(r.choice([1, 3, 8, 16, 17, 32, 40, 64]))
    wt = (r.standard_normal((o, c // g, k, k)) / np.sqrt(c // g * k * k)).astype(np.float32)
    b = (r.standard_normal(o) * 0.1).astype(np.float32)
    what = f"{kind} {c}->{o} k{k} s{s} p{p} d{d} g{g}"
    return net.conv2d(y, wt, b, stride=s, padding=p, dilation=d, groups=g), o, what


def _bn_and_residual(net, r, z, y, o):
    """z (o channels, a conv of y) with a batch norm three times in ten and y added three times in ten where
    the shapes allow."""
    if r.random() < 0.3:
        z = net.batch_norm(z, gamma=r.random(o) + 0.5, beta=r.standard_normal(o) * 0.1,
                           mean=r.standard_normal(o) * 0.1, var=r.random(o) + 0.5)
    if r.random() < 0.3 and z.shape == y.shape:
        z = net.add(z, y)
    return z


def build(seed: int):
    """A network of 1-3 layers (conv / depthwise / grouped + BN, residual add and activation; pool;
    squeeze-excitation) on a (1-3, C, 3-39, 3-39) input: (net, x, description) or None."""
    r = np.random.default_rng(seed)
    n = int(r.choice([1, 1, 2, 3]))
    c0 = int(r.choice([1, 3, 4, 5, 8, 16, 17, 24, 32, 48]))
    h = int(r.integers(3, 40))
    w = int(r.choice([h, int(r.integers(3, 40))]))
    net = Network(f"random{seed}")
    x = net.input("x", (n, c0, h, w))
    y, c, desc = x, c0, []
    for _ in range(int(r.integers(1, 4))):
        kind = str(r.choice(["conv", "conv", "dw", "group", "pool", "se"]))
        if kind in ("conv", "dw", "group"):
            made = _conv(net, r, y, c, kind)
            if made is None:
                continue
            z, o, what = made
            z = _bn_and_residual(net, r, z, y, o)
            a = ACTS[int(r.integers(len(ACTS)))]
            y, c = _act(net, z, a), o
            desc.append(f"{what} {a}")
        elif kind == "pool":
            if min(y.shape[2], y.shape[3]) < 3:
                continue
            y = net.max_pool(y, 3, stride=2, padding=1) if r.random() < 0.5 else net.avg_pool(y, 2, stride=2)
            desc.append("pool")
        else:
            m = net.mean(y, (2, 3), keepdim=True)
            cs = max(1, c // 4)
            w1 = (r.standard_normal((cs, c, 1, 1)) / np.sqrt(c)).astype(np.float32)
            w2 = (r.standard_normal((c, cs, 1, 1)) / np.sqrt(cs)).astype(np.float32)
            s = net.sigmoid(net.conv2d(net.relu(net.conv2d(m, w1, np.zeros(cs, np.float32))), w2,
                                       np.zeros(c, np.float32)))
            y = net.mul(y, s)
            desc.append("se")
    if y is x:
        return None
    net.output(y)
    return net, r.standard_normal((n, c0, h, w)).astype(np.float32), desc


def build_stream(seed: int):
    """A fully convolutional network of 1-5 layers (conv / depthwise, pools, 2x upsampling, residual adds,
    channel concats) on a (1, C, 16-89, 8-69) input: (net, x, description) or None."""
    r = np.random.default_rng(seed)
    c0 = int(r.choice([3, 4, 8, 16]))
    h, w = int(r.integers(16, 90)), int(r.integers(8, 70))
    net = Network(f"stream{seed}")
    x = net.input("x", (1, c0, h, w))
    y, c, desc, earlier = x, c0, [], []
    for _ in range(int(r.integers(1, 6))):
        kind = str(r.choice(["conv", "conv", "dw", "pool", "up", "add", "cat"]))
        hh, ww = y.shape[2], y.shape[3]
        if kind in ("conv", "dw"):
            made = _conv(net, r, y, c, kind, max_k=5)
            if made is None:
                continue
            z, o, what = made
            a = STREAM_ACTS[int(r.integers(len(STREAM_ACTS)))]
            earlier.append(y)
            y, c = _act(net, z, a), o
            desc.append(f"{what} {a}")
        elif kind == "pool":
            if min(hh, ww) < 4:
                continue
            y = net.max_pool(y, 3, stride=2, padding=1) if r.random() < 0.5 else net.avg_pool(y, 2, stride=2)
            desc.append("pool")
        elif kind == "up":
            if hh * ww > 5000:
                continue
            y = net.resize(y, scale_factor=2, mode=str(r.choice(["nearest", "bilinear"])))
            desc.append("up")
        elif kind == "add":
            same = [e for e in earlier if e.shape == y.shape]
            if same:
                y = net.add(y, same[-1])
                desc.append("add")
        else:
            same = [e for e in earlier if e.shape[2:] == y.shape[2:]]
            if same:
                y = net.concat([y, same[-1]], axis=1)
                c = y.shape[1]
                desc.append("cat")
    if y is x:
        return None
    net.output(y)
    return net, r.standard_normal((1, c0, h, w)).astype(np.float32), desc


MIXED_ACTS = ACTS + ("hardsigmoid", "elu", "tanh", "prelu", "clip")


def _act_mixed(net, r, y, a):
    if a == "prelu":
        return net.prelu(y, (r.random(int(r.choice([1, y.shape[1]]))) * 0.5).astype(np.float32))
    if a == "clip":
        return net.activation(y, "clip", min=float(-r.random()), max=float(r.random() + 0.5))
    if a in ("hardsigmoid", "elu", "tanh"):
        return net.activation(y, a)
    return _act(net, y, a)


def _f32(r, *shape, scale=1.0):
    return (r.standard_normal(shape) * scale).astype(np.float32)


def _mixed_layer(net, r, y, c, kind):
    """One layer of build_mixed on y (c channels): (y, c, description) or None where it does not fit."""
    h, w = y.shape[2], y.shape[3]
    if kind in ("conv", "dw", "group"):
        made = _conv(net, r, y, c, kind)
        if made is None:
            return None
        z, o, what = made
        z = _bn_and_residual(net, r, z, y, o)
        a = MIXED_ACTS[int(r.integers(len(MIXED_ACTS)))]
        return _act_mixed(net, r, z, a), o, f"{what} {a}"
    if kind == "convT":
        k, s = int(r.choice([2, 3, 4])), int(r.choice([1, 2, 2]))
        p, op = int(r.integers(0, (k - 1) // 2 + 1)), int(r.integers(0, s))
        g = c if r.random() < 0.25 else 1
        o = c if g > 1 else int(r.choice([4, 8, 13, 16]))
        if (h - 1) * s - 2 * p + k + op < 1 or (w - 1) * s - 2 * p + k + op < 1 or max(h, w) > 24:
            return None
        wt = _f32(r, c, o // g, k, k, scale=1 / np.sqrt(c * k * k / g))
        z = net.conv_transpose2d(y, wt, _f32(r, o, scale=0.1), stride=s, padding=p, output_padding=op, groups=g)
        a = MIXED_ACTS[int(r.integers(len(MIXED_ACTS)))]
        return _act_mixed(net, r, z, a), o, f"convT {c}->{o} k{k} s{s} p{p} op{op} g{g} {a}"
    if kind in ("chnorm", "ln_permute") and c < 8:   # a norm over 1-7 channels after a ReLU is ill-conditioned
        return None                                   # (a position of zeros and one tiny value: 3e-4 apart)
    if kind == "chnorm":
        return net.channel_norm(y, r.random(c).astype(np.float32) + 0.5, _f32(r, c, scale=0.1)), c, "channel_norm"
    if kind == "ln_permute":     # ConvNeXt's permute -> LayerNorm -> permute
        z = net.permute(y, (0, 2, 3, 1))
        z = net.layer_norm(z, r.random(c).astype(np.float32) + 0.5, _f32(r, c, scale=0.1), eps=1e-6)
        return net.permute(z, (0, 3, 1, 2)), c, "permute-layer_norm-permute"
    if kind == "concat":
        o = int(r.choice([3, 8, 16, 21]))
        z = net.conv2d(y, _f32(r, o, c, 1, 1, scale=1 / np.sqrt(c)), _f32(r, o, scale=0.1))
        parts = [y, net.relu(z)] if r.random() < 0.5 else [net.relu(z), y]
        return net.concat(parts), c + o, f"concat +{o}"
    if kind == "shuffle_unit":    # ShuffleNetV2: x[:, :c // 2] passes, the other half through 1x1-dw-1x1
        if c % 2 or c < 4:
            return None
        hc = c // 2
        a, b = (net.slice(y, 1, 0, hc), net.slice(y, 1, hc, c)) if r.random() < 0.5 else net.split(y, [hc, hc])
        b = net.relu(net.conv2d(b, _f32(r, hc, hc, 1, 1, scale=1 / np.sqrt(hc)), _f32(r, hc, scale=0.1)))
        b = net.conv2d(b, _f32(r, hc, 1, 3, 3, scale=0.3), _f32(r, hc, scale=0.1), padding=1, groups=hc)
        b = net.relu(net.conv2d(b, _f32(r, hc, hc, 1, 1, scale=1 / np.sqrt(hc)), _f32(r, hc, scale=0.1)))
        return net.channel_shuffle(net.concat([a, b]), 2), c, "shuffle unit"
    if kind == "shuffle":
        gs = [g for g in (2, 3, 4, 8) if c % g == 0]
        if not gs:
            return None
        g = int(r.choice(gs))
        return net.channel_shuffle(y, g), c, f"channel_shuffle {g}"
    if kind == "resize":
        if max(h, w) > 24:
            return None
        m = str(r.choice(["nearest", "bilinear", "nearest-exact"]))
        if r.random() < 0.5:
            z = net.resize(y, scale_factor=int(r.choice([2, 2, 3])), mode=m)
        else:
            z = net.resize(y, size=(int(r.integers(1, 40)), int(r.integers(1, 40))), mode=m,
                           align_corners=bool(m == "bilinear" and r.random() < 0.5))
        return z, c, f"resize {m} -> {z.shape[2]}x{z.shape[3]}"
    if kind == "pad":
        m = str(r.choice(["constant", "reflect", "replicate"]))
        lim = 2 if m != "reflect" else min(2, h - 1, w - 1)
        if lim < 0:
            return None
        pt, pb, pl, pr = (int(r.integers(0, lim + 1)) for _ in range(4))
        return net.pad(y, (0, 0, 0, 0, pt, pb, pl, pr), m, float(r.standard_normal())), c, f"pad {m}"
    if kind == "se":              # squeeze-excitation: ReLU / SiLU inside, sigmoid / hardsigmoid gate
        m = net.mean(y, (2, 3), keepdim=True)
        cs = max(1, c // 4)
        inner, gate = str(r.choice(["relu", "silu"])), str(r.choice(["sigmoid", "hardsigmoid"]))
        t = net.conv2d(m, _f32(r, cs, c, 1, 1, scale=1 / np.sqrt(c)), _f32(r, cs, scale=0.1))
        t = net.relu(t) if inner == "relu" else net.silu(t)
        t = net.activation(net.conv2d(t, _f32(r, c, cs, 1, 1, scale=1 / np.sqrt(cs)), _f32(r, c, scale=0.1)), gate)
        z = net.mul(y, t) if r.random() < 0.7 else net.mul(t, y)
        if r.random() < 0.5:      # the next 1x1 conv (the SE scale fused into it)
            o = int(r.choice([8, 16, 24]))
            z = net.conv2d(z, _f32(r, o, c, 1, 1, scale=1 / np.sqrt(c)), _f32(r, o, scale=0.1))
            return z, o, f"se {inner}/{gate} + 1x1 -> {o}"
        return z, c, f"se {inner}/{gate}"
    if kind == "pool":
        if min(h, w) < 2:
            return None
        if r.random() < 0.2:
            oh, ow = int(r.integers(1, min(h, 5) + 1)), int(r.integers(1, min(w, 5) + 1))
            return net.adaptive_avg_pool(y, (oh, ow)), c, f"adaptive_avg_pool {oh}x{ow}"
        k = int(r.choice([2, 3]))
        if min(h, w) < k:
            return None
        s, p, ceil = int(r.choice([1, 2])), int(r.integers(0, k // 2 + 1)), bool(r.random() < 0.3)
        if r.random() < 0.5:
            return net.max_pool(y, k, stride=s, padding=p, ceil_mode=ceil), c, f"max_pool k{k} s{s} p{p} ceil{ceil}"
        cip = bool(r.random() < 0.5)
        return (net.avg_pool(y, k, stride=s, padding=p, ceil_mode=ceil, count_include_pad=cip), c,
                f"avg_pool k{k} s{s} p{p} ceil{ceil} cip{cip}")
    if kind == "affine":          # per-channel constants (folded into the conv before, where there is one)
        z = net.mul(y, net.constant(f"scale{len(net.ops)}", r.random((1, c, 1, 1)).astype(np.float32) + 0.5))
        return net.add(z, net.constant(f"shift{len(net.ops)}", _f32(r, 1, c, 1, 1, scale=0.1))), c, "affine"
    return None


MIXED_KINDS = ("conv", "conv", "dw", "group", "convT", "chnorm", "ln_permute", "concat", "shuffle_unit",
               "shuffle", "resize", "pad", "se", "pool", "affine")


def build_mixed(seed: int):
    """A network of 1-5 layers drawn from more of the vocabulary than build's (transposed convs, channel norms
    and ConvNeXt's permute-LayerNorm-permute, concats, ShuffleNetV2 units with slices / split and channel
    shuffles, resize in three modes, pads in three modes, squeeze-excitation with hardsigmoid gates and the
    next 1x1 conv, adaptive and ceil-mode pools, per-channel affine constants, thirteen activations), ending in
    a classifier head (global pool, flatten, linear, softmax) one time in four: (net, x, description, head)
    or None."""
    r = np.random.default_rng(seed)
    n = int(r.choice([1, 1, 2, 3]))
    c0 = int(r.choice([1, 3, 4, 8, 16, 17, 24, 32]))
    h = int(r.integers(3, 33))
    w = int(r.choice([h, int(r.integers(3, 33))]))
    net = Network(f"mixed{seed}")
    x = net.input("x", (n, c0, h, w))
    y, c, desc = x, c0, []
    for _ in range(int(r.integers(1, 6))):
        made = _mixed_layer(net, r, y, c, str(r.choice(MIXED_KINDS)))
        if made is not None:
            y, c, what = made
            desc.append(what)
    if y is x:
        return None
    head = r.random() < 0.25
    if head:
        k = int(r.choice([5, 10]))
        y = net.linear(net.flatten(net.global_avg_pool(y)), _f32(r, k, c, scale=1 / np.sqrt(c)), _f32(r, k))
        if r.random() < 0.5:
            y = net.softmax(y, 1)
        desc.append("head")
    net.output(y)
    return net, r.standard_normal((n, c0, h, w)).astype(np.float32), desc, head


def _err(got, ref) -> float:
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape:
        return float("inf")
    return float(np.abs(got.astype(np.float64) - ref).max()) / max(float(np.abs(ref).max()), 1e-6)


def check_compiled(seed: int, builder=build) -> str | None:
    """None, or what went wrong for builder(seed) (see the module docstring, `compile`)."""
    b = builder(seed)
    if b is None:
        return None
    net, x, desc = b[:3]
    r = np.random.default_rng(seed + 1)
    ref = tilefuse.evaluate(net, x)[0]
    ct = int(r.integers(1, 5))
    compiled = tilefuse.compile(net, threads=ct)
    outs = [np.asarray(tilefuse.Session(compiled, threads=t).run(x)) for t in (1, 2, 3)]
    err = _err(outs[0], ref)
    if not err <= RTOL:
        return f"compiled for {ct} threads: error {err:.3g} against the reference; {desc}"
    if not all(np.array_equal(outs[0], o) for o in outs[1:]):
        return f"compiled for {ct} threads: other bits on 1 / 2 / 3 session threads; {desc}"
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "net.tfpkg")
        compiled.save(path)
        loaded = np.asarray(tilefuse.Session(tilefuse.load_package(path), threads=2).run(x))
    if not np.array_equal(loaded, outs[0]):
        return f"saved and loaded: other bits; {desc}"
    return None


def check_streamed(seed: int) -> str | None:
    """None, or what went wrong for build_stream(seed) (see the module docstring, `stream`)."""
    b = build_stream(seed)
    if b is None:
        return None
    net, x, desc = b
    r = np.random.default_rng(seed + 1)
    band = int(r.choice([1, 2, 3, 4, 8]))
    ref = tilefuse.evaluate(net, x)[0]
    s = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": band}, threads=int(r.integers(1, 4)))
    err = _err(s.run(x), ref)
    return None if err <= RTOL else f"band_rows {band}: error {err:.3g} against the reference; {desc}"


def check_sessions(seed: int, calls: int = 12, workers: int = 4) -> str | None:
    """None, or what went wrong for build(seed) run from several threads (module docstring, `sessions`)."""
    from tilefuse.runtime.device import CPUDevice
    b = build(seed)
    if b is None:
        return None
    net, x, desc = b
    r = np.random.default_rng(seed + 1)
    compiled = tilefuse.compile(net, threads=2)
    dev = CPUDevice() if r.random() < 0.5 else CPUDevice(capacity_bytes=64 << 20)
    sessions = [tilefuse.Session(compiled, device=dev, threads=int(r.integers(1, 3))) for _ in range(2)]
    xs = [r.standard_normal(x.shape).astype(np.float32) for _ in range(calls)]
    want = [np.array(sessions[0].run(v)) for v in xs]
    got, errors = [None] * calls, []

    def work(t):
        try:
            for j in range(t, calls, workers):
                s = sessions[j % 2]
                got[j] = np.array(s.run_many([xs[j]], depth=2)[0] if j % 3 == 0 else s.run(xs[j]))
        except Exception as e:       # reported below, with the seed
            errors.append(repr(e))
    threads = [threading.Thread(target=work, args=(t,)) for t in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        return f"{errors[0]}; {desc}"
    bad = [j for j in range(calls) if not np.array_equal(got[j], want[j])]
    return f"calls {bad} differ from the sequential outputs; {desc}" if bad else None


def _lost_nonfinite(ref, got) -> str | None:
    """None when every NaN of ref is NaN in got and every non-finite value of ref non-finite in got (extra
    ones are allowed: Winograd tiles, grouped convs' zero weights), else what was lost."""
    for name, bad in (("NaN", np.isnan), ("non-finite", lambda a: ~np.isfinite(a))):
        lost = bad(ref) & ~bad(got)
        if lost.any():
            return f"{int(lost.sum())} of {int(bad(ref).sum())} {name} outputs of the reference are {got[lost][:3]}"
    return None


def _poisoned(x, seed: int, value: float):
    """x with `value` at one place drawn from the seed (the same place for every value)."""
    r = np.random.default_rng(seed + 7)
    x = x.copy()
    x[tuple(int(r.integers(0, s)) for s in x.shape)] = value
    return x


def check_nonfinite(seed: int, value: float) -> str | None:
    """None, or what went wrong for build(seed) run with `value` (NaN, +-inf) at one input place: no error,
    and the reference's NaN / non-finite outputs are NaN / non-finite (module docstring, `nonfinite`)."""
    b = build(seed)
    if b is None:
        return None
    net, x, desc = b
    x = _poisoned(x, seed, value)
    with np.errstate(all="ignore"):
        ref = tilefuse.evaluate(net, x)[0]
        got = np.asarray(tilefuse.Session(tilefuse.compile(net, threads=2), threads=2).run(x))
    lost = _lost_nonfinite(ref, got)
    return f"{value} in: {lost}; {desc}" if lost else None


def check_streamed_nonfinite(seed: int, value: float) -> str | None:
    """check_nonfinite for build_stream(seed) under schedule="stream" (band_rows from the seed)."""
    b = build_stream(seed)
    if b is None:
        return None
    net, x, desc = b
    x = _poisoned(x, seed, value)
    band = int(np.random.default_rng(seed + 1).choice([1, 2, 3, 4, 8]))
    with np.errstate(all="ignore"):
        ref = tilefuse.evaluate(net, x)[0]
        s = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": band}, threads=2)
        got = np.asarray(s.run(x))
    lost = _lost_nonfinite(ref, got)
    return f"{value} in, band_rows {band}: {lost}; {desc}" if lost else None


def check_mixed_streamed(seed: int) -> str | None:
    """build_mixed(seed) without a head under schedule="stream" against the reference; a clear refusal
    (a TilefuseError naming what streaming does not take) is allowed, any other exception is not."""
    b = build_mixed(seed)
    if b is None or b[3]:
        return None
    net, x, desc, _ = b
    r = np.random.default_rng(seed + 2)
    band = int(r.choice([1, 2, 3, 4, 8]))
    try:
        s = tilefuse.compile(net, schedule="stream", stream_options={"band_rows": band}, threads=int(r.integers(1, 4)))
    except TilefuseError:
        return None
    err = _err(s.run(x), tilefuse.evaluate(net, x)[0])
    return None if err <= RTOL else f"streamed, band_rows {band}: error {err:.3g} against the reference; {desc}"


_VALUES = (np.nan, np.inf, -np.inf)
CHECKS = {"compile": check_compiled, "stream": check_streamed, "sessions": check_sessions,
          "nonfinite": lambda seed: check_nonfinite(seed, _VALUES[seed % 3]) or
          check_streamed_nonfinite(seed, _VALUES[seed % 3]),
          "mixed": lambda seed: check_compiled(seed, build_mixed) or check_mixed_streamed(seed)}


def _hung(seed: int, limit: float, label: str, ran: int, fails: int) -> None:
    """The watchdog's end: a seed that runs past `limit` seconds is a finding (a hang): its seed, the
    summary so far and every thread's stack, then the process exits with status 2."""
    print(f"seed {seed}: still running after {limit:.0f} s (a hang?); every thread's stack:", flush=True)
    faulthandler.dump_traceback(file=sys.stdout, all_threads=True)
    print(f"{label}: {ran} seeds, {fails + 1} failing (stopped at the hung seed)", flush=True)
    os._exit(2)


def run_seeds(fn, seconds: float, first: int, label: str, seed_limit: float = 1200.0) -> int:
    """fn(seed) -> None or a problem, for seeds first, first + 1, ... until `seconds` pass; prints each problem
    with its seed (a crash is a finding too) and a summary line; returns the number of failing seeds. A seed
    still running after `seed_limit` seconds (a cold numba cache compiles for a few minutes in the first
    seeds) ends the run with its seed and stacks (`_hung`) rather than leaving an outer timeout to kill it
    without a word."""
    end, seed, fails, ran = time.time() + seconds, first, 0, 0
    while time.time() < end:
        dog = threading.Timer(seed_limit, _hung, (seed, seed_limit, label, ran, fails))
        dog.daemon = True
        dog.start()
        try:
            problem = fn(seed)
        except Exception as e:
            problem = f"{type(e).__name__}: {str(e)[:300]}"
        finally:
            dog.cancel()
        if problem:
            fails += 1
            print(f"seed {seed}: {problem}", flush=True)
        seed += 1
        ran += 1
    print(f"{label}: {ran} seeds, {fails} failing", flush=True)
    return fails


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", choices=sorted(CHECKS), default="compile")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0, help="first seed: seeds run from seed * 1e6 up")
    ap.add_argument("--seed-limit", type=float, default=1200.0,
                    help="seconds one seed may run before the run stops on it as a hang")
    a = ap.parse_args(argv)
    return 1 if run_seeds(CHECKS[a.check], a.seconds, a.seed * 10 ** 6, a.check, a.seed_limit) else 0


if __name__ == "__main__":
    sys.exit(main())
