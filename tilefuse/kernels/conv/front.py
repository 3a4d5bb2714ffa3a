"""The conv front door: `prepare` (compile time) and `bind` (once per layer) -> a validated callable.

    prepared = conv.prepare(algorithm, w, b, stride, padding, dilation, groups, layout)
    layer = conv.bind(algorithm, x_shape, out_shape, {name: shape of prepared[name]}, stride=..., padding=...,
                      dilation=..., groups=..., has_residual=..., act=..., layout=..., out_layout=..., threads=...)
    layer(out, x, prepared, residual)          # many times: no argument checks, the plan fixed
    layer.describe()                           # algorithm, form, partitioning, tasks, tiles, threads

`bind` checks everything that does not change between calls (algorithm and form, dtypes, the
shapes of input, output, residual and prepared constants against each other and the conv's
parameters, the activation) and raises ValueError saying what was found and what was expected;
it fixes the task grid for the thread count (planner.layer_plan, the plan `compiled.plan()`
shows). The runtime binds every conv instruction once (kernels/registry.bind); the per-call
entry points (conv2d_run, conv2d_run_nchwc, conv2d_run_to_nchwc) stay for direct callers.

Forms: "nchw" (NCHW in and out, every algorithm), "nchwc" (NCHW16c in and out: gemm1x1, direct,
winograd2, winograd4, depthwise, grouped) and "nchw>nchwc" (NCHW in, NCHW16c out: im2col, groups 1; the stem kernel
when the input has <= 4 channels and its packed weights are among the prepared constants).
"""
from __future__ import annotations

import numpy as np

from tilefuse.kernels.activations import NAMES
from tilefuse.kernels.conv import depthwise, direct, gemm1x1, grouped, im2col, k1x1, stem, winograd
from tilefuse.kernels.conv.epilogue import resolve_act
from tilefuse.kernels.conv.planner import layer_plan
from tilefuse.kernels.conv.select import ALGORITHMS, candidates
from tilefuse.kernels.threads import resolve_threads

NCHWC_ALGORITHMS = ("gemm1x1", "direct", "winograd2", "winograd4", "depthwise", "grouped")
GROUPED_BLOCKED = ("depthwise", "grouped")   # NCHW16c forms of grouped convs
FORMS = ("nchw", "nchwc", "nchw>nchwc")


def pair(v):
    return (int(v), int(v)) if np.isscalar(v) else tuple(int(i) for i in v)


def pad4(p):
    if np.isscalar(p):
        return (int(p),) * 4
    p = tuple(int(i) for i in p)
    return p if len(p) == 4 else (p[0], p[0], p[1], p[1])


class BoundConv:
    """One conv layer bound to its shapes, epilogue and thread count (from `bind`).

    replayable: the runner does all its work in task loops started through threads.numba_region, with
    arguments that depend only on the arrays passed and the bound parameters, so a recorded call
    (threads.capture_regions) can be replayed on the same arrays (kernels/registry.py does)."""

    __slots__ = ("algorithm", "form", "threads", "info", "_run", "replayable")

    def __init__(self, algorithm, form, threads, info, run, replayable=False):
        self.algorithm, self.form, self.threads, self.info, self._run = algorithm, form, threads, info, run
        self.replayable = replayable

    def __call__(self, out, x, prepared, residual=None) -> None:
        self._run(out, x, prepared, residual)

    def describe(self) -> dict:
        return {"algorithm": self.algorithm, "form": self.form, **self.info}

    def __repr__(self):
        i = self.info
        return (f"BoundConv({self.algorithm}, {self.form}, {i['partitioning']}, {i['tasks']} tasks, "
                f"{self.threads} threads)")


def _kernel_hw(algorithm, shapes: dict, where: str):
    """(Cg, KH, KW) of the weights from the prepared constants' shapes."""
    w = shapes.get("weight")
    if w is None:
        raise ValueError(f"{where}: prepared constants have no 'weight' (found {sorted(shapes)})")
    if algorithm == "im2col":
        if len(w) != 5:
            raise ValueError(f"{where}: im2col weight has shape {w}, expected (G, Co/G, Cg, KH, KW)")
        return w[2], w[3], w[4]
    if algorithm == "direct":
        if len(w) != 6 or w[4:] != (16, 16):
            raise ValueError(f"{where}: direct weight has shape {w}, expected (Ob, Cb, KH, KW, 16, 16)")
        return w[1] * 16, w[2], w[3]
    if algorithm.startswith("winograd"):
        m = int(algorithm[-1])
        if len(w) != 4 or w[0] != (m + 2) ** 2 or w[3] != 32:
            raise ValueError(f"{where}: winograd weight has shape {w}, expected ({(m + 2) ** 2}, OP, Cip, 32)")
        return w[2], 3, 3
    if len(w) == 3 and w[2] == 32:                      # gemm1x1, NCHWc (k1x1): (OP, Cip, 32)
        return w[1], 1, 1
    if len(w) == 2:                                     # gemm1x1, NCHW: (Co, Ci)
        return w[1], 1, 1
    raise ValueError(f"{where}: gemm1x1 weight has shape {w}, expected (OP, Cip, 32) or (Co, Ci)")


def bind(algorithm, x_shape, out_shape, prepared, *, stride, padding, dilation, groups=1, has_residual=False,
         relu=False, act=None, layout="nchw", out_layout=None, threads=None, dtype=np.float32) -> BoundConv:
    """Validate a conv layer once and return the callable that runs it (see the module docstring).

    prepared: {name: array or shape} of the prepared constants; x_shape / out_shape in the layout
    of the form (NCHW16c: (N, C/16, H, W, 16)); dtype: of input, output and residual."""
    where = f"conv2d({algorithm})"
    stride, padding, dilation = pair(stride), pad4(padding), pair(dilation)
    form = "nchw>nchwc" if layout == "nchw" and out_layout == "nchwc" else layout
    if algorithm not in ALGORITHMS:
        raise ValueError(f"{where}: unknown conv algorithm; expected one of {ALGORITHMS}")
    if form not in FORMS:
        raise ValueError(f"{where}: layout {layout!r} -> {out_layout!r} unknown; expected one of {FORMS}")
    if np.dtype(dtype) != np.float32:
        raise ValueError(f"{where}: the fast kernels take float32, found {np.dtype(dtype)}")
    if form == "nchwc" and (algorithm not in NCHWC_ALGORITHMS or (groups != 1 and algorithm not in GROUPED_BLOCKED)):
        raise ValueError(f"{where}: no NCHWc form with groups={groups}; NCHWc algorithms: {NCHWC_ALGORITHMS}, groups 1 "
                         f"(grouped convs: {GROUPED_BLOCKED})")
    if form == "nchw>nchwc" and (algorithm != "im2col" or groups != 1):
        raise ValueError(f"{where}: NCHW -> NCHW16c only with im2col, groups 1; found groups={groups}")
    shapes = {k: tuple(getattr(v, "shape", v)) for k, v in prepared.items()}
    x_shape, out_shape = tuple(x_shape), tuple(out_shape)
    blocked_in, blocked_out = form == "nchwc", form != "nchw"
    for name, s, blocked in (("x", x_shape, blocked_in), ("out", out_shape, blocked_out)):
        if blocked and (len(s) != 5 or s[-1] != 16):
            raise ValueError(f"{where}: {name} has shape {s}, expected NCHW16c (N, C/16, H, W, 16)")
        if not blocked and len(s) != 4:
            raise ValueError(f"{where}: {name} has shape {s}, expected NCHW (N, C, H, W)")
    if algorithm in GROUPED_BLOCKED:
        return _bind_grouped(algorithm, form, x_shape, out_shape, shapes, stride, padding, dilation, groups,
                             has_residual, relu, act, threads, where)
    cg, kh, kw = _kernel_hw(algorithm, shapes, where)
    n, h, w = x_shape[0], x_shape[2], x_shape[3]
    ci = x_shape[1] * 16 if blocked_in else x_shape[1]
    padded = algorithm in ("direct", "winograd2", "winograd4") or shapes["weight"][-1] == 32
    if (-(-ci // 16) * 16 if padded else ci) != cg * groups:
        raise ValueError(f"{where}: input has {ci} channels, the weights expect {cg * groups} (Cg={cg} x groups="
                         f"{groups}{', padded to 16' if padded else ''})")
    cg = ci // groups
    ho = (h + padding[0] + padding[1] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (w + padding[2] + padding[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    co = out_shape[1] * 16 if blocked_out else out_shape[1]
    bias = shapes.get("bias")
    lo = co - 15 if blocked_out else co                 # NCHW16c: co counts the padded channels
    if bias is None or len(bias) != 1 or not lo <= bias[0] <= co + (16 if blocked_out else 15):
        raise ValueError(f"{where}: prepared bias has shape {bias}, expected ({lo}..{co}) entries for the output's "
                         f"{co} channels")
    expect = (n, out_shape[1], ho, wo) + ((16,) if blocked_out else ())
    if out_shape != expect or ho < 1 or wo < 1:
        raise ValueError(f"{where}: out has shape {out_shape}, expected {expect} (input {x_shape}, kernel {kh}x{kw}, "
                         f"stride {stride}, padding {padding}, dilation {dilation})")
    w_shape = (co, cg, kh, kw)
    if algorithm not in candidates((n, ci, h, w), w_shape, stride, padding, dilation, groups):
        raise ValueError(f"{where}: cannot run weight {w_shape} with stride={stride}, padding={padding}, "
                         f"dilation={dilation}, groups={groups}; candidates: "
                         f"{candidates((n, ci, h, w), w_shape, stride, padding, dilation, groups)}")
    act = resolve_act(relu, act, where)
    t = resolve_threads(threads)
    use_stem = form == "nchw>nchwc" and stem.applies(ci, groups) and "stem_weight" in shapes
    lp = layer_plan(algorithm, (n, ci, h, w), w_shape, (n, co, ho, wo), groups, stride, padding, dilation,
                    "nchwc" if form == "nchwc" else "nchw", t, "nchwc" if use_stem else None)
    plan = lp.pop("plan")
    lp["activation"] = NAMES[act[0]]
    run = _runner(algorithm, form, use_stem, plan, act, t, stride, padding, dilation, groups)
    # k1x1, direct, Winograd (NCHW16c) and the stem kernel: argument derivation, then numba_region only
    return BoundConv(algorithm, form, t, lp, run, replayable=form == "nchwc" or use_stem)


def _bind_grouped(algorithm, form, x_shape, out_shape, shapes, stride, padding, dilation, groups, has_residual,
                  relu, act, threads, where) -> BoundConv:
    """bind for depthwise / grouped: their prepared weights carry the block structure (the real
    channel counts are not in the padded NCHW16c shapes, so the checks are on blocks)."""
    w, bias = shapes.get("weight"), shapes.get("bias")
    blocked = form == "nchwc"
    for name, s in (("x", x_shape), ("out", out_shape)):
        if len(s) != (5 if blocked else 4) or (blocked and s[-1] != 16):
            raise ValueError(f"{where}: {name} has shape {s}, expected "
                             f"{'NCHW16c (N, C/16, H, W, 16)' if blocked else 'NCHW (N, C, H, W)'}")
    n, h, wd = x_shape[0], x_shape[2], x_shape[3]
    xb = x_shape[1] if blocked else -(-x_shape[1] // 16)
    ob = out_shape[1] if blocked else -(-out_shape[1] // 16)
    if algorithm == "depthwise":
        if w is None or len(w) != 4 or w[3] != 16:
            raise ValueError(f"{where}: depthwise weight has shape {w}, expected (Ob, KH, KW, 16)")
        _, kh, kw, _ = w
        mult = "src" in shapes
        if w[0] != ob or (not mult and xb != ob) or -(-groups // 16) != xb:
            raise ValueError(f"{where}: weight {w} with groups={groups} does not fit input {x_shape} / output "
                             f"{out_shape} (depthwise: groups = C_in, {'Ob' if mult else 'Cb = Ob'} blocks)")
    elif w is not None and len(w) == 5:                  # groups inside one block (grouped_lanes.py)
        if w[4] != 16 or w[3] not in (2, 4, 8):
            raise ValueError(f"{where}: grouped (lanes) weight has shape {w}, expected (Ob, KH, KW, cg, 16) with "
                             f"cg in 2, 4, 8")
        _, kh, kw, cgl, _ = w
        if w[0] != ob or xb != ob or -(-groups * cgl // 16) != xb or (not blocked and not
                                                                     x_shape[1] == out_shape[1] == groups * cgl):
            raise ValueError(f"{where}: weight {w} with groups={groups} does not fit input {x_shape} / output "
                             f"{out_shape} (grouped lanes: groups x {cgl} channels in and out, Cb = Ob blocks)")
        groups = ob * 16 // cgl                         # the padded channels' group count, for the plan
    else:
        if w is None or len(w) != 7 or w[5:] != (16, 16):
            raise ValueError(f"{where}: grouped weight has shape {w}, expected (G', Obg, Cbg, KH, KW, 16, 16) "
                             f"or (Ob, KH, KW, cg, 16)")
        gp, obg, cbg, kh, kw = w[:5]
        if not (gp - 1) * cbg < xb <= gp * cbg or not (gp - 1) * obg < ob <= gp * obg:
            raise ValueError(f"{where}: weight {w} covers {gp * cbg} input / {gp * obg} output blocks, tensors have "
                             f"{xb} / {ob}")
    if bias is None or len(bias) != 1 or bias[0] < ob * 16:
        raise ValueError(f"{where}: prepared bias has shape {bias}, expected at least ({ob * 16},)")
    ho = (h + padding[0] + padding[1] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (wd + padding[2] + padding[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    expect = (n, out_shape[1], ho, wo) + ((16,) if blocked else ())
    if tuple(out_shape) != expect or ho < 1 or wo < 1:
        raise ValueError(f"{where}: out has shape {out_shape}, expected {expect} (input {x_shape}, kernel {kh}x{kw}, "
                         f"stride {stride}, padding {padding}, dilation {dilation})")
    act = resolve_act(relu, act, where)
    t = resolve_threads(threads)
    ci, co = xb * 16, ob * 16
    cg = 1 if algorithm == "depthwise" else max(1, ci // groups)
    lp = layer_plan(algorithm, (n, ci, h, wd), (co, cg, kh, kw), (n, co, ho, wo), groups, stride, padding, dilation,
                    "nchwc" if blocked else "nchw", t)
    lp.pop("plan")
    lp["activation"] = NAMES[act[0]]
    mod = depthwise if algorithm == "depthwise" else grouped
    f = mod.run_nchwc if blocked else mod.run
    # NCHW16c depthwise and grouped (lanes form): numba_region only. Their other forms (depthwise's gather
    # for a channel multiplier > 1, grouped's tiles) run parallel_for, which a recording marks as not
    # replayable (threads.replaying)
    return BoundConv(algorithm, form, t, lp,
                     lambda o, x, p, r: f(o, x, p, r, stride=stride, padding=padding, dilation=dilation, act=act,
                                          threads=t), replayable=blocked)


def _runner(algorithm, form, use_stem, plan, act, t, stride, padding, dilation, groups):
    m = int(algorithm[-1]) if algorithm.startswith("winograd") else 0
    if form == "nchwc":
        if algorithm == "gemm1x1":
            return lambda o, x, p, r: k1x1.run_nchwc(o, x, p, r, stride=stride, act=act, threads=t, plan=plan)
        if algorithm == "direct":
            return lambda o, x, p, r: direct.run_nchwc(o, x, p, r, stride=stride, padding=padding, dilation=dilation,
                                                       act=act, threads=t, plan=plan)
        return lambda o, x, p, r: winograd.run_nchwc(o, x, p, r, m=m, padding=padding, act=act, threads=t, plan=plan)
    if form == "nchw>nchwc":
        if use_stem:
            return lambda o, x, p, r: stem.run_to_nchwc(o, x, p, r, stride=stride, padding=padding,
                                                        dilation=dilation, act=act, threads=t, plan=plan)
        return lambda o, x, p, r: im2col.run_to_nchwc(o, x, p, r, stride=stride, padding=padding, dilation=dilation,
                                                      act=act, threads=t)
    if algorithm == "gemm1x1":
        return lambda o, x, p, r: gemm1x1.run(o, x, p, r, stride=stride, act=act, threads=t)
    if algorithm == "direct":
        return lambda o, x, p, r: direct.run(o, x, p, r, stride=stride, padding=padding, dilation=dilation, act=act,
                                             threads=t)
    if m:
        return lambda o, x, p, r: winograd.run(o, x, p, r, m=m, padding=padding, act=act, threads=t)
    return lambda o, x, p, r: im2col.run(o, x, p, r, stride=stride, padding=padding, dilation=dilation, groups=groups,
                                         act=act, threads=t)
