"""Convolution with a per-image input channel scale: the fused squeeze-excitation multiply.

    y[n] = act(conv(x[n] * s[n], w) + b (+ residual))        s (N, C, 1, 1)

For a 1x1 conv (stride 1, no padding, groups 1: the projection after the squeeze-excitation
of MobileNetV3 / EfficientNet / RegNetY), the scale moves onto the weights instead of the
activation: out[n] (O, H*W) = (w (O, C) * s[n] (1, C)) @ x[n] (C, H*W), so the scaled tensor
x * s (N*C*H*W values) is never written or read; the per-image weight copy is O*C values (on
NCHW16c: made task by task inside the 1x1 kernel, each task scaling its own output channels' weights
into its thread's scratch, k1x1.run_nchwc(input_scale=...)).
One OpenBLAS GEMM per image and block of output channels (tasks on the conv pool, BLAS at one
thread), then bias, residual and the activation in place. On NCHW16c tensors the per-image
scaled weights are packed for the blocked 1x1 kernel (kernels/conv/k1x1.py) instead, or, where
that moves more values (a batch of small maps with many channels: O + N*H*W < N*O), the input
is scaled once into a scratch buffer and one 1x1 conv runs over the batch, the scaling and the
1x1 in one task loop (`_se1x1_seq`: a scaling phase, then the 1x1's tasks; the products are then
rounded as the reference rounds them: x * s first). Other convs scale the input into a
scratch buffer first and run the reference conv (correct, not fast). Tolerance against the
reference (which scales x first): the products are associated differently, within 1e-5
relative.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from numba import njit

from . import reference as ref
from .broadcast import _code, apply_act_inplace
from .conv._nb import atomic_add_sync, cpu_yield, mul16, new_counter
from .conv.epilogue import resolve_act
from .conv.k1x1 import _k1x1_seq
from .threads import (blas_threads, numba_region, parallel_for, replaying, resolve_threads,
                      scratch)


@njit(nogil=True, cache=True)
def scale_blocks(xs, x, s2, n, c0, c1):
    """xs[n, cb, p, :] = x[n, cb, p, :] * s2[n, cb*16:(cb+1)*16] for the blocks [c0, c1) of image n: x (N, Cb, P, 16)
    NCHW16c, s2 (N, C) the scale; the lanes past C written 0 (the weights' rows there are zero and the 1x1
    reduces over [0, kc), kc <= C: never read). One 16-lane multiply per position (`_nb.mul16`; as a 16-lane
    loop numba left it scalar: ~1.4 cycles a value, 28 us for EfficientNet's 1152-channel 7x7 input)."""
    Cb, P = x.shape[1], x.shape[2]
    C = s2.shape[1]
    xf, xsf, sf = x.reshape(x.size), xs.reshape(xs.size), s2.reshape(s2.size)
    for cb in range(c0, c1):
        base = (n * Cb + cb) * P * 16
        sc = n * C + cb * 16
        if cb * 16 + 16 <= C:
            for p in range(P):
                mul16(xsf, base + 16 * p, xf, base + 16 * p, sf, sc)
        else:
            m = C - cb * 16
            for p in range(P):
                o = base + 16 * p
                for l in range(m):
                    xsf[o + l] = xf[o + l] * sf[sc + l]
                for l in range(m, 16):
                    xsf[o + l] = 0.0


YIELD_AFTER = 2000    # polls of the phase count before a waiting worker yields its core (cpu_yield) between polls


@njit(nogil=True, cache=True)
def _scale_phase(counter, xs, x, s2, per):
    """The first phase of `_se1x1_seq`: the input-scaling tasks (image, `per` channel blocks) taken from
    counter[1], each counted in counter[2] when written; returns once every task is written (whoever ran
    it). A worker waits only for tasks other workers took and are running, so no schedule deadlocks: a
    worker that starts late finds them taken or done."""
    N, Cb = x.shape[0], x.shape[1]
    chunks = (Cb + per - 1) // per
    total = N * chunks
    while True:
        t = atomic_add_sync(counter, 1, 1)
        if t >= total:
            break
        n = t // chunks
        c0 = (t - n * chunks) * per
        scale_blocks(xs, x, s2, n, c0, min(Cb, c0 + per))
        atomic_add_sync(counter, 2, 1)
    spins = 0
    while atomic_add_sync(counter, 2, 0) < total:
        spins += 1
        if spins > YIELD_AFTER:   # a task takes microseconds; longer, its thread may be waiting for this core
            cpu_yield()


@njit(nogil=True, cache=True)
def _se1x1_seq(counter, tid, xs4, x4, s2, per, tasks, of, xf, wp, bias, rf, has_res, code, alpha, beta, HWo, Wo,
               HWi, Wi, Cb, Ob, sh, sw, q_outer, pfd, pfo, kc):
    """One worker of the input-scaled 1x1 (threads.numba_region): the scaling phase (`_scale_phase`: xs = x * s
    into scratch), then the 1x1's tasks on xs (k1x1._k1x1_seq; xf is xs flat). One region for both: the scale's
    padding and the scaling were a region each before the 1x1's (~5-25 us of launch and Python a call on the
    development VMs, 16 such convs in RegNetY-400MF)."""
    _scale_phase(counter, xs4, x4, s2, per)
    _k1x1_seq(counter, tid, tasks, of, xf, wp, bias, rf, has_res, code, alpha, beta, HWo, Wo, HWi, Wi, Cb, Ob, sh,
              sw, q_outer, pfd, pfo, kc)


@njit(parallel=True, nogil=True, cache=True)
def _se1x1_par(nt, xs4, x4, s2, per, tasks, of, xf, wp, bias, rf, has_res, code, alpha, beta, HWo, Wo, HWi, Wi, Cb,
               Ob, sh, sw, q_outer, pfd, pfo, kc):
    counter = new_counter(nt)
    for _w in nb.prange(nt):
        _se1x1_seq(counter, nb.get_thread_id(), xs4, x4, s2, per, tasks, of, xf, wp, bias, rf, has_res, code, alpha,
                   beta, HWo, Wo, HWi, Wi, Cb, Ob, sh, sw, q_outer, pfd, pfo, kc)


SCALE_VALUES = 8192   # values a scaling task writes: a 7x7 map's 440 channels (RegNetY) are 3 tasks, not one


CALL_VALUES = 100_000   # a 1x1 conv call per image costs about a memory pass over this many values


def scales_weights(n: int, c: int, o: int, positions: int) -> bool:
    """Scale the weights per image (one conv call per image) rather than the input (one conv over
    the batch) where an image's weights, plus the cost of a call per image in a batch, are fewer
    values than its input: early, large maps; the late small maps (EfficientNet / RegNetY at 7x7:
    O > H*W) scale the input, read and written once. (Batch 1 always scaling the weights, with the
    16-lane scaling: EfficientNet-B0 9.68 against 9.60 ms on the Ice Lake VM at 2 threads, its
    1152 -> 320 7x7 projection 316 against 259 us in the network (`benchmarks/net_ab.py`): the
    rule above stays.)"""
    return o * c + (CALL_VALUES if n > 1 else 0) < c * positions


def run_nchwc(out, x, prepared, s, res=None, *, relu=False, act=None, threads=None) -> None:
    """Blocked x (N, Cb, H, W, 16) / out / residual, NCHW scale s (N, C, 1, 1); `prepared`: the
    unscaled weights packed by k1x1.prepare (w (O, C, 1, 1), b) -> {"weight" (OP, Cip, 32), "bias"}."""
    from .conv import k1x1
    wk, bias = prepared["weight"], prepared["bias"]
    n, cb, h, wd, _ = x.shape
    c = s.shape[1]
    o = out.shape[1] * 16
    s2 = s.reshape(n, c)                                  # (N, C, 1, 1) -> (N, C)
    act = None if relu else act
    if not scales_weights(n, c, o, h * wd):
        xs = scratch("se_conv_xs", x.shape)
        x4, xs4 = x.reshape(n, cb, h * wd, 16), xs.reshape(n, cb, h * wd, 16)   # (N, Cb, H, W, 16) -> (N, Cb, H*W, 16)
        # one region: the input scaled into xs (tasks of SCALE_VALUES), then the 1x1 over xs. The scale passes
        # as their own regions (~64K values a task: pool.mean_tasks) cost a launch each; on our Python pool
        # (one numba call per task through the GIL) the pass ran ~5 GB/s, 1.07 ms for RegNetY's batch-32 7x7
        # input. (Scaling and convolving images in groups of 0.5-4 MiB, so the scaled copy stays in the caches,
        # ran 0.91-1.25x the time: not kept.)
        per = max(1, SCALE_VALUES // (h * wd * 16))
        code, al, be = resolve_act(relu, act, "gemm1x1")
        threads = resolve_threads(threads)
        loop = k1x1._task_loop(out, xs, prepared, res, (1, 1), code, al, be, threads, None)
        ntasks = max(len(loop[0]), n * -(-cb // per))
        # s2 is read inside the loop, so a replayed call (threads.replaying) sees new scale values: a bound call's
        # scale is a contiguous float32 view of device memory, passed as itself (the copy below is for other callers)
        numba_region(_se1x1_par, _se1x1_seq, threads, ntasks, xs4, x4, np.ascontiguousarray(s2, np.float32), per,
                     *loop)
        return
    for i in range(n):   # the weights scaled task by task inside the 1x1 (= k1x1.prepare(w * s[i], b)["weight"])
        k1x1.run_nchwc(out[i:i + 1], x[i:i + 1], prepared, res[i:i + 1] if res is not None else None, relu=relu,
                       act=act, threads=threads, input_scale=s2[i])


# k1x1's partitionings, short enough for the plan's column with the scaling's note after them
_SHORT = {"Co split (input shared)": "Co split", "positions x Co split": "positions x Co",
          "positions split": "positions"}


def describe(x_shape, w_shape, layout: str, stride, padding, groups: int, threads: int) -> dict:
    """What `compiled.plan()` shows for an input-scaled conv: {"algorithm", "partitioning", "tasks",
    "tiles"}, the path this module runs for it. x_shape (N, C, H, W) NCHW, w_shape (O, C/groups, kh, kw).
    "se1x1": the blocked 1x1 with the scale on the weights per image (k1x1 calls, one an image: tasks
    summed over the images) or on the input (one task loop; its 1x1 tasks, after the scaling ones);
    "blas": NCHW, one GEMM per image and block of 64 output channels; "reference": the input scaled
    into scratch, then the reference conv."""
    from .conv.planner import plan_k1x1
    n, c, h, w = x_shape
    o = w_shape[0]
    one = tuple(w_shape[2:]) == (1, 1) and tuple(stride) == (1, 1) and tuple(padding) == (0, 0, 0, 0) and \
        groups == 1
    if layout == "nchwc" and tuple(w_shape[2:]) == (1, 1):
        cip, op = -(-c // 16) * 16, -(-o // 32)
        per_image = scales_weights(n, c, -(-o // 16) * 16, h * w)
        pl = plan_k1x1(cip, op, h * w if per_image else n * h * w, threads, -(-o // 16))
        return {"algorithm": "se1x1", "tasks": pl["tasks"] * (n if per_image else 1),
                "partitioning": _SHORT.get(pl["partitioning"], pl["partitioning"])
                + (", w scaled" if per_image else ", x scaled"),
                "tiles": {"Q": pl["Q"], "B": pl["B"], "scaled": "weights" if per_image else "input"}}
    if layout != "nchwc" and one:
        return {"algorithm": "blas", "partitioning": "images x 64 channels", "tasks": n * -(-o // 64), "tiles": {}}
    return {"algorithm": "reference", "partitioning": "-", "tasks": None, "tiles": {}}


def bind(views, params):
    """The bound NCHW16c input-scaled 1x1 conv (registry.bind, once per instruction): the weights
    packed once (k1x1.prepare), so a call scales 32 contiguous values per input channel instead
    of transposing the weights. None when the instruction is not that form (the generic path)."""
    from .conv import k1x1
    p = params
    has_b, has_r = bool(p.get("has_bias")), bool(p.get("has_residual"))
    if p.get("layout") != "nchwc" or len(views) != 4 + has_b + has_r or views[1].shape[2:] != (1, 1):
        return None
    w = views[1]
    b = views[2] if has_b else None
    prepared = k1x1.prepare(np.asarray(w, np.float32), None if b is None else np.asarray(b, np.float32))
    prepared["kc"] = int(k1x1.reduction_length(prepared["weight"]))
    relu, act, threads = p.get("relu", False), p.get("act"), p.get("threads")

    def run(out, x, *rest):
        res = rest[1 + has_b] if has_r else None
        run_nchwc(out, x, prepared, rest[-1], res, relu=relu, act=act, threads=threads)
    # all of run_nchwc's work is in numba_region task loops (the scale's padding, the input scaling, the
    # 1x1 with its weights scaled per task): replayed from the second call on (threads.replaying)
    call = replaying(run)
    call.__name__ = "conv2d_input_scaled_nchwc"
    return call


def conv2d_input_scaled(out, x, w, *rest, stride, padding, dilation, groups, has_bias, has_residual, relu,
                        act=None, threads=None, layout="nchw"):
    rest = list(rest)
    b = rest.pop(0) if has_bias else None
    res = rest.pop(0) if has_residual else None
    s = rest.pop(0)
    if layout == "nchwc":
        # blocked x / out / residual (1x1 only: the layout pass blocks no other), NCHW scale
        from .conv import k1x1
        if w.shape[2:] != (1, 1):
            raise ValueError(f"input-scaled conv (NCHWc): weight {w.shape}; expected a 1x1 kernel")
        run_nchwc(out, x, k1x1.prepare(np.asarray(w, np.float32), b), s, res, relu=relu, act=act, threads=threads)
        return
    n, c, h, wd = x.shape
    o = w.shape[0]
    one_by_one = (w.shape[2:] == (1, 1) and tuple(stride) == (1, 1) and tuple(padding) == (0, 0, 0, 0)
                  and groups == 1)
    if out.dtype != np.float32 or not one_by_one:
        out[...] = ref.conv2d(x, w, b, stride, padding, dilation, groups, residual=res, relu=relu, act=act,
                              input_scale=s)
        return
    w2 = w.reshape(o, c)                       # (O, C, 1, 1) -> (O, C)
    x3 = x.reshape(n, c, h * wd)               # (N, C, H, W) -> (N, C, H*W)
    o3 = out.reshape(n, o, h * wd)
    s2 = s.reshape(n, 1, c)                    # (N, C, 1, 1) -> (N, 1, C)

    ob = 64   # output channels per task: a batch-1 layer still splits over the threads

    def task(t):
        i, o0 = t
        o1 = min(o0 + ob, o)
        blk = o3[i, o0:o1]
        np.matmul(w2[o0:o1] * s2[i], x3[i], out=blk)   # (ob, C) @ (C, H*W) -> (ob, H*W)
        if b is not None:
            blk += b[o0:o1].reshape(-1, 1)
        if res is not None:
            blk += res[i, o0:o1].reshape(o1 - o0, h * wd)

    with blas_threads(1):
        parallel_for(task, [(i, o0) for i in range(n) for o0 in range(0, o, ob)], threads)
    code, al, be = _code(act, relu)
    apply_act_inplace(out, code, al, be, threads)
