"""The CPU kernel registry: instruction kernel name -> function(out, *inputs, **params).

A compiled program's instructions name their kernel; the runtime looks it up here and calls it
with views of device memory, so every kernel writes its result into `out` in place. Conv2d
dispatches on the `algorithm` the compiler chose (`kernels/conv`); pooling, element-wise,
linear and softmax use the numba kernels of `pool.py`, `elementwise.py` and `dense.py`; the rest vectorized numpy, all
within the tolerance `tests/` states against `reference.py`.

Instructions the layout pass (compiler/layout.py) moved to NCHW16c carry params["layout"] =
"nchwc" and get blocked (N, C/16, H, W, 16) views; `to_nchwc` / `from_nchwc` convert.
Kernels in THREADED take `threads` (the session's thread count) as a parameter.
"""
from __future__ import annotations

import os

import numpy as np

from . import dense, elementwise, pool
from . import reference as ref
from .threads import replaying


def _conv2d(out, x, *args, stride, padding, dilation, groups, has_bias, has_residual, relu=False, act=None,
            algorithm="reference", prepared=(), threads=None, layout="nchw", out_layout=None,
            has_input_scale=False, **_):
    args = list(args)
    if has_input_scale:   # a fused squeeze-excitation scale: the compiler left it on the plain path
        from .se_conv import conv2d_input_scaled
        conv2d_input_scaled(out, x, *args, stride=stride, padding=padding, dilation=dilation, groups=groups,
                            has_bias=has_bias, has_residual=has_residual, relu=relu, act=act, threads=threads,
                            layout=layout)
        return
    if layout == "nchw" and out_layout == "nchwc":
        from .conv import conv2d_run_to_nchwc
        prep = {k: args.pop(0) for k in prepared}
        res = args.pop(0) if has_residual else None
        conv2d_run_to_nchwc(algorithm, out, x, prep, res, stride=stride, padding=padding, dilation=dilation,
                            groups=groups, relu=relu, act=act, threads=threads)
        return
    if layout == "nchwc":
        from .conv import conv2d_run_nchwc
        prep = {k: args.pop(0) for k in prepared}
        res = args.pop(0) if has_residual else None
        conv2d_run_nchwc(algorithm, out, x, prep, res, stride=stride, padding=padding, dilation=dilation,
                         groups=groups, relu=relu, act=act, threads=threads)
        return
    if algorithm == "reference":
        w = args.pop(0)
        b = args.pop(0) if has_bias else None
        res = args.pop(0) if has_residual else None
        if act is None:
            out[...] = ref.conv2d(x, w, b, stride, padding, dilation, groups, residual=res, relu=relu)
            return
        from .activations import NAMES, reference as act_reference
        from .conv.epilogue import resolve_act
        code, al, be = resolve_act(relu, act, "conv2d")
        y = ref.conv2d(x, w, b, stride, padding, dilation, groups, residual=res)
        out[...] = act_reference(NAMES[code], y, float(al), float(be))
        return
    from .conv import conv2d_run
    prep = {k: args.pop(0) for k in prepared}
    res = args.pop(0) if has_residual else None
    conv2d_run(algorithm, out, x, prep, res, stride=stride, padding=padding, dilation=dilation,
               groups=groups, relu=relu, act=act, threads=threads)


def _to_nchwc(out, x, channels=None, threads=None, **_):
    from .conv import to_nchwc
    to_nchwc(x, out=out, threads=threads)


def _from_nchwc(out, xb, channels, threads=None, **_):
    from .conv import from_nchwc
    from_nchwc(xb, channels, out=out, threads=threads)


def _max_pool(out, x, **p):
    if x.dtype != np.float32:
        out[...] = ref.max_pool(x, **{k: v for k, v in p.items() if k not in ("layout", "threads")})
        return
    pool.max_pool(out, x, **p)


def _avg_pool(out, x, **p):
    if x.dtype != np.float32:
        out[...] = ref.avg_pool(x, **{k: v for k, v in p.items() if k not in ("layout", "threads")})
        return
    pool.avg_pool(out, x, **p)


def _copy_reshape(out, x, **_):
    out.reshape(-1)[...] = x.reshape(-1)


def _wrap(fn):
    """Adapt a reference kernel (returns a new array) to the in-place convention."""
    def k(out, *ins, **params):
        out[...] = fn(*ins, **params)
    k.__name__ = getattr(fn, "__name__", "kernel")
    return k


def _region_only(out, *ins, **params):
    raise RuntimeError("stream / band instructions run inside a stream region (runtime/streaming.py), "
                       "bound by the Session; they are not called one by one")


KERNELS = {
    "conv2d": _conv2d,
    "batch_norm": _wrap(lambda x, g, b, m, v, eps: ref.batch_norm(x, g, b, m, v, eps)),
    "scale": elementwise.scale,
    "relu": elementwise.relu,
    "add": elementwise.add,
    "max_pool": _max_pool,
    "avg_pool": _avg_pool,
    "global_avg_pool": pool.global_avg_pool,
    "linear": dense.linear,
    "matmul": dense.matmul,
    "flatten": _copy_reshape,
    "dropout": _copy_reshape,
    "softmax": dense.softmax,
    "local_response_norm": _wrap(ref.local_response_norm),
    "to_nchwc": _to_nchwc,
    "from_nchwc": _from_nchwc,
    # the row-band schedule: a region header and one band instruction per streamed layer
    # (kernels/bands.py computes the bands)
    "stream": _region_only,
    "band": _region_only,
}

# kernels besides conv2d with an NCHW16c form (params["layout"] = "nchwc"): the layout pass
# (compiler/layout.py) lets them follow their input's layout; BLOCKED_TO_NCHW ones read blocked
# input and write NCHW
BLOCKED_FORM = frozenset({"max_pool", "avg_pool", "add", "relu", "scale", "global_avg_pool"})
BLOCKED_TO_NCHW = frozenset({"global_avg_pool"})

# kernels that take the session's thread count as params["threads"]
THREADED = {"conv2d", "max_pool", "avg_pool", "global_avg_pool", "add", "relu", "to_nchwc",
            "from_nchwc", "linear", "matmul", "softmax"}

# the modern-CNN ops (issue 9), one module per op family, each with its KERNELS, THREADED and
# BLOCKED (the kernels with an NCHW16c form); their validators are in compiler/validate.py
from . import broadcast, conv_transpose, movement, norm, reduce, resize, squeeze  # noqa: E402

for _m in (broadcast, conv_transpose, movement, norm, reduce, resize, squeeze):
    KERNELS.update(_m.KERNELS)      # "add" (any broadcasting, any activation) and "concat" included
    THREADED |= _m.THREADED
    BLOCKED_FORM = BLOCKED_FORM | _m.BLOCKED
BLOCKED_TO_NCHW = BLOCKED_TO_NCHW | squeeze.BLOCKED_TO_NCHW    # the SE scale: blocked x -> NCHW (N, C, 1, 1)
# kernels that apply a fused activation (params "act") themselves; lowering emits a separate
# activation instruction after any other kernel whose op carries a non-ReLU activation
ACT_KERNELS = (broadcast.ACT_KERNELS | conv_transpose.ACT_KERNELS | {"conv2d"} | squeeze.ACT_KERNELS
               | norm.ACT_KERNELS)

# ---------------------------------------------------------------- bind-time preparation (issue 3)
# Session._bind calls `bind(kernel, views, params)` once per instruction: it returns the callable
# the compute loop runs, fn(out, *inputs). Convs go through the conv front door (conv.bind): the
# arguments are validated once (shapes and dtypes do not change between runs: constants and
# hidden blocks are fixed views, IO operands have fixed shapes) and the task grid is fixed for
# the thread count, so a call goes straight to the algorithm's kernel with no per-call checks.
# It also pins tiny layers to one thread (`threads_for`): a rule on the shape only, and every
# kernel gives bitwise identical results for any thread count, so outputs never depend on it.

SMALL_BYTES = 64 << 10      # non-conv kernels touching less than this run on the calling thread
SMALL_CONV_FLOPS = 2e6      # convs below this (~10 us on one core) too: the pool hand-off costs ~40 us
# (on blocked outputs `threads_for` counts N*Ob*H*W positions, the FLOPs times the output blocks: in effect
# 2 MFLOP / Ob. Counting the positions once, with this or a 1 or 0.5 MFLOP threshold, ran MobileNetV2 and
# RegNetY at 64x64 and EfficientNet-B0 at 32x32 images 0.97-1.08x the time at 2 threads: kept as it is)
# depthwise runs ~10x fewer FLOP/s than the dense convs (memory and latency bound: a 7x7 x 576 layer,
# 0.5 MFLOP, took 23 us on one core) and its tasks are a numba region (a few us at 2 threads, ~16 us at
# 16 on the device machine), so only those below this times max(1, threads / 4) stay on the calling thread
SMALL_DW_FLOPS = 2.5e5


def _shape_dtype(v):
    return tuple(v.shape), np.dtype(v.dtype)


def threads_for(kernel: str, views, params: dict, threads):
    """The thread count an instruction runs with: 1 for tiny layers, else `threads`."""
    if kernel not in THREADED:
        return threads
    shapes = [_shape_dtype(v)[0] for v in views]
    if kernel == "conv2d":
        out = shapes[-1]
        positions = int(np.prod(out[:-1])) if params.get("layout") == "nchwc" or params.get("out_layout") == \
            "nchwc" else int(np.prod(out)) // max(out[1], 1)
        prepared = params.get("prepared") or ()
        wsize = int(np.prod(shapes[1])) if prepared else 0
        small = SMALL_CONV_FLOPS
        if params.get("algorithm") == "depthwise" and prepared:
            wsize = int(np.prod(shapes[1][1:]))    # (Ob, KH, KW, 16): one block's taps per position
            from .threads import resolve_threads
            small = SMALL_DW_FLOPS * max(1.0, resolve_threads(threads) / 4)
        if wsize and 2.0 * positions * wsize < small:
            return 1
        return threads
    nbytes = sum(int(np.prod(s)) * _shape_dtype(v)[1].itemsize for s, v in zip(shapes, views))
    return 1 if nbytes < SMALL_BYTES else threads


def _bind_conv2d(views, params):
    """The conv front door's bound layer (conv.bind: validated once, task grid fixed for the thread
    count) as fn(out, x, *prepared, residual?), or None: the reference algorithm, or arguments
    bind rejects (the generic path then raises the kernel's error at compute time, where it
    always was)."""
    from . import conv
    p = params
    keys = tuple(p.get("prepared") or ())
    if not keys or p.get("algorithm") in (None, "reference"):
        return None
    has_res = bool(p.get("has_residual"))
    nk = len(keys)
    if len(views) != 2 + nk + has_res:
        return None
    dts = {np.dtype(v.dtype) for v in (views[0], views[-1]) + ((views[-2],) if has_res else ())}
    contiguous = all(v.flags.c_contiguous for v in views if isinstance(v, np.ndarray))
    if len(dts) != 1 or not contiguous or (has_res and tuple(views[-2].shape) != tuple(views[-1].shape)):
        return None
    try:
        layer = conv.bind(p["algorithm"], views[0].shape, views[-1].shape, dict(zip(keys, views[1:1 + nk])),
                          stride=p["stride"], padding=p["padding"], dilation=p["dilation"], groups=p.get("groups", 1),
                          has_residual=has_res, relu=p.get("relu", False), act=p.get("act"),
                          layout=p.get("layout", "nchw"), out_layout=p.get("out_layout"), threads=p.get("threads"),
                          dtype=dts.pop())
    except ValueError:
        return None

    def run(out, x, *args):
        layer(out, x, dict(zip(keys, args[:nk])), args[nk] if has_res else None)
    # replayable layers (front.BoundConv.replayable): from the second call on, the recorded task loops
    # run again without the Python that derived their arguments (threads.replaying)
    call = replaying(run) if layer.replayable else run
    call.__name__ = f"conv2d_{layer.algorithm}_{layer.form.replace('>', '_to_')}"
    call.layer = layer
    return call


# kernels whose fast form does all its work in numba_region task loops (and whose other forms run no
# such loop): bound calls are replayed from the second on (threads.replaying)
# (the channel movement kernels: their lane gather is one such loop, their other forms numpy copies only)
REPLAYABLE = frozenset({"squeeze_excitation", "global_avg_pool", "linear", "concat", "slice", "channel_shuffle"})
# the layout conversions: one numba_region loop on contiguous float32 operands (else a copy comes first)
CONVERSIONS = frozenset({"to_nchwc", "from_nchwc"})


def bind(kernel: str, views, params: dict):
    """(fn, params) the runtime calls as fn(out, *inputs, **params); see the section comment."""
    params = dict(params)
    if kernel in THREADED:
        params["threads"] = threads_for(kernel, views, params, params.get("threads"))
    if kernel in REPLAYABLE or (kernel in CONVERSIONS and all(
            isinstance(v, np.ndarray) and v.flags.c_contiguous and v.dtype == np.float32 for v in views)):
        fn, kw = KERNELS[kernel], params
        call = replaying(lambda out, *ins: fn(out, *ins, **kw))
        call.__name__ = kernel
        return call, {}
    if kernel == "conv2d" and params.get("has_input_scale"):
        from .se_conv import bind as bind_input_scaled
        fast = bind_input_scaled(views, params)
        if fast is not None:
            return fast, {}
    elif kernel == "conv2d":
        fast = _bind_conv2d(views, params)
        if fast is not None:
            return fast, {}
    return KERNELS[kernel], params


def bind_chains(program, views, threads) -> dict:
    """{instruction index: fn} for the fused conv chains of a program (kernels/conv/chain.py): the
    chain's first instruction runs the whole chain (a replayed call, threads.replaying), the others
    are no-ops (`fn.fused_into` names the first). views[i]: instruction i's operand views (None: not
    to be fused)."""
    from .conv.chain import find_chains
    from .threads import resolve_threads
    bound = {}
    for head, (chain, idx) in find_chains(program, views, resolve_threads(threads)).items():
        call = replaying(chain)
        call.__name__ = "conv_chain"
        call.chain = chain
        call.covers = tuple(idx)
        bound[head] = call
        for j in idx[1:]:
            def noop(out, *ins):
                pass
            noop.__name__ = "fused"
            noop.fused_into = head
            bound[j] = noop
    return bound


# the squeeze-excitation means from the depthwise conv's epilogue (bind_se_sums); TILEFUSE_SE_SUMS=0 turns
# it off (the squeeze-excitation reads the depthwise output again: the same bits)
SE_SUMS = os.environ.get("TILEFUSE_SE_SUMS", "1").strip() != "0"


def _free_pairs(program, views, taken):
    """(i, instruction i, instruction i + 1) for each pair of consecutive instructions that a binder may take:
    neither already bound (`taken`) and both with operand views (`views[i]` not None)."""
    taken = set(taken)
    for i in range(len(program) - 1):
        if i in taken or i + 1 in taken or views[i] is None or views[i + 1] is None:
            continue
        yield i, program[i], program[i + 1]


def bind_se_sums(program, views, threads, taken=()) -> dict:
    """{instruction index: fn} for the depthwise -> squeeze-excitation pairs of a program (EfficientNet's and
    MobileNetV3's blocks): the NCHW16c depthwise conv at i writes, besides its output, each output row's sum
    over its positions into a small array of this context ((N, Ob, Ho, 16): `depthwise.run_nchwc(row_sums=)`,
    in its epilogue while the row is in L1), and the squeeze-excitation at i + 1, whose input is that output,
    takes its means from them (`squeeze.squeeze_excitation(row_sums=)`) instead of reading the output again.
    Both are replayed calls (threads.replaying). The means are the same bits either way (kernels/squeeze.py).
    views[i]: instruction i's operand views (None: not to be bound); `taken`: indices already bound (chains)."""
    from .conv import depthwise
    from .squeeze import squeeze_excitation
    bound: dict = {}
    if not SE_SUMS:
        return bound
    for i, ins, nxt in _free_pairs(program, views, taken):
        p = ins.params
        keys = tuple(p.get("prepared") or ())
        if ins.kernel != "conv2d" or p.get("algorithm") != "depthwise" or p.get("layout") != "nchwc" or \
                p.get("out_layout") not in (None, "nchwc") or p.get("has_input_scale") or keys != ("weight", "bias"):
            continue
        if nxt.kernel != "squeeze_excitation" or nxt.params.get("layout") != "nchwc" or \
                nxt.inputs[0].name != ins.output.name:
            continue
        dv, sv = views[i], views[i + 1]
        if not all(isinstance(v, np.ndarray) and v.dtype == np.float32 and v.flags.c_contiguous for v in (*dv, *sv)):
            continue
        dparams = dict(p)
        dparams["threads"] = threads_for("conv2d", dv, dparams, threads)
        layer = _bind_conv2d(dv, dparams)          # the layer's own checks and description
        if layer is None or layer.layer.algorithm != "depthwise" or layer.layer.form != "nchwc":
            continue
        out = dv[-1]
        n, ob, ho, _, _ = out.shape
        rs = np.zeros((n, ob, ho, 16), np.float32)     # this context's row sums of the pair
        has_res = bool(p.get("has_residual"))
        kw = dict(stride=p["stride"], padding=p["padding"], dilation=p["dilation"], relu=p.get("relu", False),
                  act=p.get("act"), threads=dparams["threads"])

        def run_dw(out, x, w, b, *rest, kw=kw, rs=rs, has_res=has_res):
            depthwise.run_nchwc(out, x, {"weight": w, "bias": b}, rest[0] if has_res else None, row_sums=rs, **kw)
        sparams = dict(nxt.params)
        sparams["threads"] = threads_for("squeeze_excitation", sv, sparams, threads)

        def run_se(out, *ins_, sp=sparams, rs=rs):
            squeeze_excitation(out, *ins_, row_sums=rs, **sp)
        dcall, scall = replaying(run_dw), replaying(run_se)
        dcall.__name__, scall.__name__ = layer.__name__, "squeeze_excitation"
        dcall.layer = layer.layer
        dcall.se_sums_for, scall.se_sums_from = i + 1, i
        bound[i], bound[i + 1] = dcall, scall
    return bound


# the stem conv -> max pool pairs computed together (bind_stem_pools); TILEFUSE_STEM_POOL=0 turns it off (the
# pool reads the stem's output again: the same bits)
STEM_POOL = os.environ.get("TILEFUSE_STEM_POOL", "1").strip() != "0"


def bind_stem_pools(program, views, threads, taken=()) -> dict:
    """{instruction index: fn} for the stem conv -> max pool pairs of a program (ResNet's 7x7/2 conv and 3x3/2
    pool; kernels/stem_pool.py): the conv's call (the stem kernel: NCHW input of <= 4 channels, NCHW16c output)
    also pools, band by band while the rows are in cache, into the max pool's output; the pool's own call is a
    no-op (`fn.fused_into` names the conv). The same bits as the two calls. views[i]: instruction i's operand
    views (None: not to be bound; the conv's input may be the program's input, an IO operand resolved per
    call); `taken`: indices already bound."""
    from .conv import stem
    from .stem_pool import run as run_stem_pool
    bound: dict = {}
    if not STEM_POOL:
        return bound
    readers: dict[str, int] = {}
    for ins in program:
        for op in ins.inputs:
            readers[op.name] = readers.get(op.name, 0) + 1
    for i, ins, nxt in _free_pairs(program, views, taken):
        p, q = ins.params, nxt.params
        keys = tuple(p.get("prepared") or ())
        if ins.kernel != "conv2d" or p.get("algorithm") != "im2col" or p.get("layout") not in (None, "nchw") or \
                p.get("out_layout") != "nchwc" or p.get("groups", 1) != 1 or p.get("has_input_scale") or \
                "stem_weight" not in keys:
            continue
        if nxt.kernel != "max_pool" or q.get("layout") != "nchwc" or nxt.inputs[0].name != ins.output.name:
            continue
        cv, pv = views[i], views[i + 1]
        out, y = cv[-1], pv[-1]
        if not all(isinstance(v, np.ndarray) and v.dtype == np.float32 and v.flags.c_contiguous for v in (out, y)) \
                or np.dtype(cv[0].dtype) != np.float32 or not stem.applies(cv[0].shape[1], 1) or out.ndim != 5:
            continue
        # the pool writes while the stem still reads: its output must not be memory the conv reads (the planner
        # may give the pool the conv's input block, dead after the conv when they run apart)
        if any(isinstance(v, np.ndarray) and np.may_share_memory(v, y) for v in cv[:-1]):
            continue
        has_res = bool(p.get("has_residual"))
        nk = len(keys)
        kw = dict(stride=p["stride"], padding=p["padding"], dilation=p["dilation"], relu=p.get("relu", False),
                  act=p.get("act"), pool_kernel=tuple(q["kernel_size"]), pool_stride=tuple(q["stride"]),
                  pool_padding=tuple(q.get("padding", (0, 0, 0, 0))), pool_dilation=tuple(q.get("dilation", (1, 1))),
                  threads=threads_for("conv2d", cv, p, threads),
                  # the pool its only reader: the stem rows in a ring, not all written out (stem_pool.RING)
                  stem_output=readers.get(ins.output.name, 0) != 1)

        def run_pair(out, x, *args, kw=kw, y=y, keys=keys, nk=nk, has_res=has_res):
            run_stem_pool(out, x, dict(zip(keys, args[:nk])), y, args[nk] if has_res else None, **kw)

        def noop(out, *ins_):
            pass
        call = replaying(run_pair)
        call.__name__ = "conv2d_stem_pool"
        call.stem_pool_for = i + 1
        noop.__name__ = "fused"
        noop.fused_into = i
        bound[i], bound[i + 1] = call, noop
    return bound
