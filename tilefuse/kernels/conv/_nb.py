"""Numba helpers shared by the conv kernels: stack scratch arrays for register blocking.

`stack_f32(n)` returns a pointer to `n` float32 on the stack of the calling jitted function
(an `alloca` in its entry block). Wrapped with `numba.carray`, LLVM sees a private, non-aliased
buffer and keeps small accumulators (16 lanes = one AVX-512 register) in registers. Heap arrays
(`np.zeros` inside a jitted function) are not promoted and run ~20x slower in the inner loops.
"""
from __future__ import annotations

import os

import numpy as np
from numba import types
from numba.core import cgutils
from numba import carray as nb_carray, njit
from numba.extending import intrinsic

LANES = 16  # output-channel block: one AVX-512 register of float32


def _register_asm_parser() -> None:
    """LLVM parses inline assembly (`tile16`) only with the host's asm parser registered; numba
    registers the target and its printer, not the parser. Registered at import, not in tile16's
    codegen: a kernel loaded from numba's cache never runs its codegen, and a function compiled
    later that links the cached kernel's IR (any caller outside the cache) would have LLVM parse
    the assembly without a parser, which aborts the process ("Inline asm not supported by this
    streamer")."""
    import llvmlite.binding as ll
    ll.initialize_native_asmparser()


_register_asm_parser()


@intrinsic
def stack_f32(typingctx, size):
    """float32* to `size` (a compile-time integer literal) stack slots."""
    if not isinstance(size, types.IntegerLiteral):
        return None
    n = size.literal_value
    sig = types.CPointer(types.float32)(size)

    def codegen(context, builder, signature, args):
        ty = context.get_value_type(types.float32)
        return cgutils.alloca_once(builder, ty, size=context.get_constant(types.intp, n))

    return sig, codegen


def _prefetch_impl(typingctx, arr, idx, rw, locality=3):
    if not isinstance(arr, types.Array) or not isinstance(idx, types.Integer):
        return None
    sig = types.void(arr, idx)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        i8p = ir.IntType(8).as_pointer()
        ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), i8p)
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        builder.call(fn, [ptr, ir.Constant(i32, rw), ir.Constant(i32, locality), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def prefetch(typingctx, arr, idx):
    """Software prefetch (prefetcht0) of the cache line holding arr[idx] (1-D contiguous array);
    a hint only: never faults, so idx may run past the end."""
    return _prefetch_impl(typingctx, arr, idx, 0)


@intrinsic
def prefetch_l2(typingctx, arr, idx):
    """prefetch into L2, not L1 (prefetcht1): for data needed a while later, which would only evict
    what L1 holds now (the next channel pair's weight rows in k1x1)."""
    return _prefetch_impl(typingctx, arr, idx, 0, 2)


@intrinsic
def prefetchw(typingctx, arr, idx):
    """prefetch with intent to write (prefetchw): the line arrives in exclusive state."""
    return _prefetch_impl(typingctx, arr, idx, 1)


def _atomic_add_impl(arr, idx, val, ordering):
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64 and isinstance(idx, types.Integer)
            and isinstance(val, types.Integer)):
        return None
    sig = types.int64(arr, idx, val)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.gep(ary.data, [args[1]])
        v = context.cast(builder, args[2], signature.args[2], types.int64)
        return builder.atomic_rmw("add", ptr, v, ordering)

    return sig, codegen


@intrinsic
def atomic_add(typingctx, arr, idx, val):
    """old = arr[idx]; arr[idx] += val, atomically (LLVM atomicrmw add, monotonic) on a 1-D
    contiguous int64 array: the shared task counter of a parallel loop (threads.py)."""
    return _atomic_add_impl(arr, idx, val, "monotonic")


@intrinsic
def atomic_add_sync(typingctx, arr, idx, val):
    """`atomic_add` with sequentially consistent ordering: the memory written before it is visible to a
    thread that reads the new count with it (val 0: a read), and the compiler moves no load or store
    across it. The phase count of a two-phase task loop (se_conv's scale-then-convolve region)."""
    return _atomic_add_impl(arr, idx, val, "seq_cst")


# TILEFUSE_AFFINITY=0: counters hand the tasks out in table order (`take`). Read when the kernels compile: numba's
# cache does not key on it, so a cache compiled with the other setting keeps that one (A/B runs: a NUMBA_CACHE_DIR
# of their own per setting)
AFFINITY = os.environ.get("TILEFUSE_AFFINITY", "1").strip() not in ("0", "off", "no", "false")
COUNTER_BASE = 8      # counter slots before the per-thread chunk counters (threads.COUNTER_SLOTS <= this)
COUNTER_STRIDE = 8    # int64s between two threads' chunk counters: one 64-byte line each


@njit(nogil=True, cache=True)
def new_counter(nt):
    """A task loop's counter for a team of nt workers (`take`): slot 3 holds nt, each worker's chunk
    counter a cache line of its own past COUNTER_BASE."""
    c = np.zeros(COUNTER_BASE + COUNTER_STRIDE * max(nt, 1), np.int64)
    if AFFINITY:
        c[3] = nt
    return c


@njit(nogil=True, inline="always")
def take(counter, tid, ntasks):
    """The next task of a loop of `ntasks` for worker `tid`, or -1 when none is left. A counter from
    `new_counter(nt)` (slot 3 = nt > 1): worker k owns the contiguous chunk [k*ntasks//nt,
    (k+1)*ntasks//nt) and takes its own tasks first, in order, then what is left of the others' chunks
    (each chunk's count is atomic: every task runs once, and a worker the OS does not schedule holds up
    no one). Consecutive layers split the same way leave each thread's part of a map in its own core's
    cache. Any other counter (slot 3 zero): the tasks in order from slot 0, as `atomic_add` hands them."""
    nt = counter[3]
    if nt <= 1:
        i = atomic_add(counter, 0, 1)
        return i if i < ntasks else -1
    k = tid % nt
    for _j in range(nt):
        lo = k * ntasks // nt
        n = (k + 1) * ntasks // nt - lo
        s = COUNTER_BASE + COUNTER_STRIDE * k
        if counter[s] < n:
            c = atomic_add(counter, s, 1)
            if c < n:
                return lo + c
        k += 1
        if k == nt:
            k = 0
    return -1


def _linux_x86_64() -> bool:
    import platform
    return platform.system() == "Linux" and platform.machine().lower() in ("x86_64", "amd64")


@intrinsic
def cpu_yield(typingctx):
    """sched_yield(2): give the core to another runnable thread, for a worker waiting on others (a two-phase
    task loop's phase count, `atomic_add_sync`). On a loaded machine the thread it waits for may be waiting
    for this core; spinning on would hold it until the time slice ends. Linux x86-64: the system call itself
    (numba cannot cache a function that calls through ctypes); elsewhere nothing (the caller spins on)."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        if _linux_x86_64():
            i64 = ir.IntType(64)
            builder.asm(ir.FunctionType(i64, [i64]), "syscall", "={rax},{rax},~{rcx},~{r11},~{memory}",
                        [ir.Constant(i64, 24)], True)      # 24: sched_yield on x86-64 Linux
        return context.get_dummy_value()

    return sig, codegen


def _act16(context, builder, dst, src, res, hr, code, al, be, hide, leaky=False):
    """The codegen of store16 / act16: each operand (array type, array value, index type, index value)."""
    from llvmlite import ir
    i64 = ir.IntType(64)
    vty = ir.VectorType(ir.FloatType(), 16)

    def ptr(op):   # &array[idx] as <16 x float>*
        aty, a, ity, idx = op
        ary = context.make_array(aty)(context, builder, a)
        i = context.cast(builder, idx, ity, types.int64)
        return builder.bitcast(builder.gep(ary.data, [i]), vty.as_pointer())

    v = builder.load(ptr(src), align=4)
    res_slot = cgutils.alloca_once_value(builder, v)
    with builder.if_then(hr):
        r = builder.load(ptr(res), align=4)
        builder.store(builder.fadd(v, r), res_slot)
    v = builder.load(res_slot)

    def splat(x):
        return builder.shuffle_vector(builder.insert_element(ir.Constant(vty, ir.Undefined), x,
                                                             ir.Constant(ir.IntType(32), 0)),
                                      ir.Constant(vty, ir.Undefined), ir.Constant(ir.VectorType(
                                          ir.IntType(32), 16), [0] * 16))

    zero = ir.Constant(vty, [0.0] * 16)
    relu = builder.select(builder.fcmp_ordered(">", zero, v), zero, v)
    a, b = splat(al), splat(be)
    m = builder.select(builder.fcmp_ordered(">", a, v), a, v)
    clip = builder.select(builder.fcmp_ordered("<", b, m), b, m)
    c = context.cast(builder, code[1], code[0], types.int64)
    other = v
    if leaky:   # code 9: v if v >= 0 else alpha * v (NaN: alpha * NaN, as the scalar form)
        other = builder.select(builder.icmp_signed("==", c, ir.Constant(i64, 9)),
                               builder.select(builder.fcmp_ordered(">=", v, zero), v, builder.fmul(a, v)), v)
    out = builder.select(builder.icmp_signed("==", c, ir.Constant(i64, 1)), relu,
                         builder.select(builder.icmp_signed("==", c, ir.Constant(i64, 2)), clip, other))
    dp = ptr(dst)
    if hide:
        # in place, a store of select(c, 0, <what was loaded from dp>) to dp is folded by LLVM into a
        # masked store (vmaskmovps: microcoded on AMD Zen): store through a copy of dp that an empty
        # inline asm hides from the optimizer (as max16 does)
        hidden = builder.asm(ir.FunctionType(i64, [i64]), "", "=r,0", [builder.ptrtoint(dp, i64)], False)
        dp = builder.inttoptr(hidden, vty.as_pointer())
    builder.store(out, dp, align=4)


@intrinsic
def store16(typingctx, dst, di, src, si, res, ri, has_res, code, alpha, beta):
    """dst[di:di + 16] = act(src[si:si + 16] (+ res[ri:ri + 16] if has_res)) as one 16-lane vector
    (LLVM `<16 x float>`: one zmm, or two ymm on 256-bit hosts), for the activation codes 0
    (identity), 1 (ReLU) and 2 (clip to [alpha, beta]); arrays C-contiguous float32, indexed flat
    (dst may be src: each vector is loaded before it is stored). The epilogue of the register
    tiles (epilogue.store_rows): numba runs no SLP vectorizer, and the same loads, adds, selects and
    stores written as 16-lane loops were left as 16 scalar triples. The selects are numba's max /
    min (`max(v, a)` = a if a > v else v; `min(v, b)` = b if b < v else v) lane by lane, so the bits
    (NaN and -0.0 included) are those of the scalar loops."""
    f32 = types.float32
    ok = (all(isinstance(a, types.Array) and a.dtype == f32 and a.layout == "C" for a in (dst, src, res))
          and all(isinstance(a, types.Integer) for a in (di, si, ri, code))
          and isinstance(has_res, types.Boolean) and alpha == f32 and beta == f32)
    if not ok:
        return None
    sig = types.void(dst, di, src, si, res, ri, has_res, code, alpha, beta)

    def codegen(context, builder, signature, args):
        d_a, di_v, s_a, si_v, r_a, ri_v, hr, code_v, al, be = args
        a = signature.args
        _act16(context, builder, (a[0], d_a, a[1], di_v), (a[2], s_a, a[3], si_v), (a[4], r_a, a[5], ri_v), hr,
               (a[7], code_v), al, be, hide=False)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def act16(typingctx, dst, di, res, ri, has_res, code, alpha, beta):
    """dst[di:di + 16] = act(dst[di:di + 16] (+ res[ri:ri + 16] if has_res)) in place: `store16` with
    dst as its source, the store hidden from LLVM's masked-store fold (an in-place ReLU loop compiled
    to vmaskmovps, 12 and more cycles a vector on AMD Zen). Codes 0, 1, 2 and 9 (leaky ReLU, slope
    alpha); any other code leaves the vector as it is (after the residual). The bits of the scalar
    loops: the residual add, then numba's max / min lane by lane, or v if v >= 0 else alpha * v."""
    f32 = types.float32
    ok = (all(isinstance(a, types.Array) and a.dtype == f32 and a.layout == "C" for a in (dst, res))
          and all(isinstance(a, types.Integer) for a in (di, ri, code))
          and isinstance(has_res, types.Boolean) and alpha == f32 and beta == f32)
    if not ok:
        return None
    sig = types.void(dst, di, res, ri, has_res, code, alpha, beta)

    def codegen(context, builder, signature, args):
        d_a, di_v, r_a, ri_v, hr, code_v, al, be = args
        a = signature.args
        _act16(context, builder, (a[0], d_a, a[1], di_v), (a[0], d_a, a[1], di_v), (a[2], r_a, a[3], ri_v), hr,
               (a[5], code_v), al, be, hide=True, leaky=True)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def max16(typingctx, dst, di, src, si):
    """dst[di:di + 16] = src[si:si + 16] where src > dst or src is NaN, else dst, as one 16-lane
    vector (the scalar `v if v > t or v != v else t` lane by lane, so the bits are those of the
    scalar loop: a NaN in either is kept, as PyTorch's max pool does); C-contiguous float32 or float64 arrays of one dtype, indexed
    flat. The max pool's column pass (pool._max_pool_rows), a 16-lane loop that numba (no SLP
    vectorizer) left scalar."""
    ok = (all(isinstance(a, types.Array) and a.layout == "C" for a in (dst, src)) and dst.dtype == src.dtype
          and dst.dtype in (types.float32, types.float64) and all(isinstance(a, types.Integer) for a in (di, si)))
    if not ok:
        return None
    sig = types.void(dst, di, src, si)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        vty = ir.VectorType(context.get_value_type(signature.args[0].dtype), 16)

        def ptr(k, a, idx):   # &array_k[idx] as a 16-lane vector pointer
            ary = context.make_array(signature.args[k])(context, builder, a)
            i = context.cast(builder, idx, signature.args[k + 1], types.int64)
            return builder.bitcast(builder.gep(ary.data, [i]), vty.as_pointer())

        dp = ptr(0, args[0], args[1])
        t = builder.load(dp, align=4)
        v = builder.load(ptr(2, args[2], args[3]), align=4)
        take = builder.or_(builder.fcmp_ordered(">", v, t), builder.fcmp_unordered("uno", v, v))
        # a store of select(take, v, <what was loaded from dp>) to dp is folded by LLVM into a
        # masked store (vmaskmovps: microcoded on AMD Zen, the pool ran ~10x slower than ORT's):
        # the store goes through a copy of dp that an empty inline asm hides from the optimizer
        i64 = ir.IntType(64)
        hidden = builder.asm(ir.FunctionType(i64, [i64]), "", "=r,0", [builder.ptrtoint(dp, i64)], False)
        builder.store(builder.select(take, v, t), builder.inttoptr(hidden, vty.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def maxwin16(typingctx, dst, di, src, rows, nr, c0, cstep, nc):
    """dst[di:di + 16] = the max of one pooling window as 16-lane vectors held in registers: for each
    of `nc` columns b (in order), the max of src[rows[a] + c0 + b * cstep : +16] over the `nr` rows a
    (in order, from -inf), then the max of those column maxima (in order, from -inf); each max the
    scalar `v if v > t or v != v else t` lane by lane. The same selects in the same order as the
    separable row pass and column pass of `max16` (pool._max_pool_rows), so the same bits (NaN and
    -0.0 included), but the window's loads go straight into registers: the column pass of `max16`
    ran three dependent load-select-store rounds on each output vector. dst / src C-contiguous
    float32 or float64 arrays indexed flat, rows a C-contiguous int64 array of flat offsets."""
    ok = (all(isinstance(a, types.Array) and a.layout == "C" for a in (dst, src, rows)) and dst.dtype == src.dtype
          and dst.dtype in (types.float32, types.float64) and rows.dtype == types.int64
          and all(isinstance(a, types.Integer) for a in (di, nr, c0, cstep, nc)))
    if not ok:
        return None
    sig = types.void(dst, di, src, rows, nr, c0, cstep, nc)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        a = signature.args
        fty = context.get_value_type(a[0].dtype)
        vty = ir.VectorType(fty, 16)
        cast = lambda k: context.cast(builder, args[k], a[k], types.int64)  # noqa: E731
        dst_a = context.make_array(a[0])(context, builder, args[0])
        src_a = context.make_array(a[2])(context, builder, args[2])
        rows_a = context.make_array(a[3])(context, builder, args[3])
        di_v, nr_v, c0_v, cs_v, nc_v = cast(1), cast(4), cast(5), cast(6), cast(7)
        ninf = ir.Constant(vty, [ir.Constant(fty, float("-inf"))] * 16)

        def sel(v, t):
            take = builder.or_(builder.fcmp_ordered(">", v, t), builder.fcmp_unordered("uno", v, v))
            return builder.select(take, v, t)

        acc = cgutils.alloca_once_value(builder, ninf)        # private slots: promoted to registers
        col = cgutils.alloca_once(builder, vty)
        builder.store(ninf, acc)
        with cgutils.for_range(builder, nc_v) as lb:
            builder.store(ninf, col)
            off = builder.add(c0_v, builder.mul(lb.index, cs_v))
            with cgutils.for_range(builder, nr_v) as la:
                r = builder.load(builder.gep(rows_a.data, [la.index]))
                vp = builder.bitcast(builder.gep(src_a.data, [builder.add(r, off)]), vty.as_pointer())
                builder.store(sel(builder.load(vp, align=4), builder.load(col)), col)
            builder.store(sel(builder.load(col), builder.load(acc)), acc)
        dp = builder.bitcast(builder.gep(dst_a.data, [di_v]), vty.as_pointer())
        builder.store(builder.load(acc), dp, align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def reduce16(typingctx, src, si, nvec, shift, scale, kind):
    """Over k < 16 nvec, t = (src[si + k] - shift) * scale: the max of t (kind 0), the sum of t (kind 1) or the
    sum of t * t (kind 2; kind a literal), as the scalar loop over 16 lanes computes it: lane l takes the k = l
    mod 16 in order (max: `t if t > lane else lane`, a NaN skipped; sums: `lane + t`), then the lanes are
    combined in order 0..15 from -inf / 0 the same way. The 16 lanes stay in one register (numba left such a
    lane loop over a stack array a store-forwarding chain, ~4x slower): the row passes of the softmax and the
    layer norm. C-contiguous float32 src indexed flat; shift and scale float32 (the subtract is skipped at
    shift 0.0 only in the sense that x - 0 = x)."""
    f32 = types.float32
    if not (isinstance(src, types.Array) and src.dtype == f32 and src.layout == "C" and isinstance(si, types.Integer)
            and isinstance(nvec, types.Integer) and shift == f32 and scale == f32
            and isinstance(kind, types.IntegerLiteral) and kind.literal_value in (0, 1, 2)):
        return None
    k_ = kind.literal_value
    sig = f32(src, si, nvec, shift, scale, kind)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        a = signature.args
        fty = ir.FloatType()
        vty = ir.VectorType(fty, 16)
        ary = context.make_array(a[0])(context, builder, args[0])
        si_v = context.cast(builder, args[1], a[1], types.int64)
        n_v = context.cast(builder, args[2], a[2], types.int64)
        start = ir.Constant(fty, float("-inf") if k_ == 0 else 0.0)

        def splat(x):
            return builder.shuffle_vector(builder.insert_element(ir.Constant(vty, ir.Undefined), x,
                                                                 ir.Constant(ir.IntType(32), 0)),
                                          ir.Constant(vty, ir.Undefined),
                                          ir.Constant(ir.VectorType(ir.IntType(32), 16), [0] * 16))

        sh, sc = splat(args[3]), splat(args[4])

        def step(t, acc):
            if k_ == 0:
                return builder.select(builder.fcmp_ordered(">", t, acc), t, acc)
            return builder.fadd(acc, t)

        acc = cgutils.alloca_once_value(builder, ir.Constant(vty, [start] * 16))   # promoted to a register
        with cgutils.for_range(builder, n_v) as lp:
            i = builder.add(si_v, builder.mul(lp.index, ir.Constant(ir.IntType(64), 16)))
            v = builder.load(builder.bitcast(builder.gep(ary.data, [i]), vty.as_pointer()), align=4)
            t = builder.fmul(builder.fsub(v, sh), sc)
            builder.store(step(builder.fmul(t, t) if k_ == 2 else t, builder.load(acc)), acc)
        lanes = builder.load(acc)
        r = start
        for lane in range(16):
            r = step(builder.extract_element(lanes, ir.Constant(ir.IntType(32), lane)), r)
        return r

    return sig, codegen


@intrinsic
def transpose16(typingctx, dst, di, dstride, src, si, sstride, nin, nout):
    """A 16 x 16 float32 tile transposed in registers: row r of the source is src[si + r sstride : +16] for r < nin
    (rows from nin on read as zeros), and dst[di + c dstride : +16] gets column c for c < nout. Sixteen vector loads,
    four rounds of 16 two-vector shuffles (each swaps the off-diagonal b x b blocks, b = 8, 4, 2, 1), sixteen vector
    stores: the NCHW <-> NCHW16c conversions and the permutes that move the last axis (numba left their element
    loops strided gathers). C-contiguous float32 arrays indexed flat; the caller keeps every row in bounds."""
    f32 = types.float32
    if not (all(isinstance(a, types.Array) and a.dtype == f32 and a.layout == "C" for a in (dst, src))
            and all(isinstance(a, types.Integer) for a in (di, dstride, si, sstride, nin, nout))):
        return None
    sig = types.void(dst, di, dstride, src, si, sstride, nin, nout)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        a = signature.args
        vty = ir.VectorType(ir.FloatType(), 16)
        i64, i32 = ir.IntType(64), ir.IntType(32)
        cast = lambda k: context.cast(builder, args[k], a[k], types.int64)  # noqa: E731
        dst_a = context.make_array(a[0])(context, builder, args[0])
        src_a = context.make_array(a[3])(context, builder, args[3])
        di_v, ds_v, si_v, ss_v, nin_v, nout_v = cast(1), cast(2), cast(4), cast(5), cast(6), cast(7)
        zero = ir.Constant(vty, [ir.Constant(ir.FloatType(), 0.0)] * 16)
        rows = []
        for r in range(16):
            slot = cgutils.alloca_once_value(builder, zero)
            with builder.if_then(builder.icmp_signed("<", ir.Constant(i64, r), nin_v)):
                off = builder.add(si_v, builder.mul(ss_v, ir.Constant(i64, r)))
                p = builder.bitcast(builder.gep(src_a.data, [off]), vty.as_pointer())
                builder.store(builder.load(p, align=4), slot)
            rows.append(builder.load(slot))
        for b in (8, 4, 2, 1):
            top = [j if (j // b) % 2 == 0 else 16 + j - b for j in range(16)]
            bot = [j + b if (j // b) % 2 == 0 else 16 + j for j in range(16)]
            new = list(rows)
            for r in range(16):
                if (r // b) % 2 == 0:
                    t, u = rows[r], rows[r + b]
                    new[r] = builder.shuffle_vector(t, u, ir.Constant(ir.VectorType(i32, 16), top))
                    new[r + b] = builder.shuffle_vector(t, u, ir.Constant(ir.VectorType(i32, 16), bot))
            rows = new
        for c in range(16):
            with builder.if_then(builder.icmp_signed("<", ir.Constant(i64, c), nout_v)):
                off = builder.add(di_v, builder.mul(ds_v, ir.Constant(i64, c)))
                p = builder.bitcast(builder.gep(dst_a.data, [off]), vty.as_pointer())
                builder.store(rows[c], p, align=4)
        return context.get_dummy_value()

    return sig, codegen


def _vec16_ptr(context, builder, signature, args, k):
    """&array[idx] as a pointer to a 16 x float32 vector, for the intrinsics below: the float32 array is
    argument k of the call, its flat index argument k + 1."""
    from llvmlite import ir
    a = signature.args
    ary = context.make_array(a[k])(context, builder, args[k])
    i = context.cast(builder, args[k + 1], a[k + 1], types.int64)
    return builder.bitcast(builder.gep(ary.data, [i]), ir.VectorType(ir.FloatType(), 16).as_pointer())


@intrinsic
def mul16(typingctx, dst, di, src, si, sc, ci):
    """dst[di:di + 16] = src[si:si + 16] * sc[ci:ci + 16] as one 16-lane vector multiply, or times
    the scalar sc (a float32) broadcast; C-contiguous float32 arrays indexed flat (dst may be src).
    Each lane is one IEEE multiply: the bits of the scalar loop. The scales of the fused
    squeeze-excitation (se_conv.scale_blocks, k1x1._k1x1_scaled_seq), whose 16- and 32-lane loops
    numba (no SLP vectorizer) left as scalar multiplies, ~1.4 cycles a value."""
    f32 = types.float32
    vec = isinstance(sc, types.Array) and sc.dtype == f32 and sc.layout == "C" and isinstance(ci, types.Integer)
    ok = (all(isinstance(a, types.Array) and a.dtype == f32 and a.layout == "C" for a in (dst, src))
          and all(isinstance(a, types.Integer) for a in (di, si)) and (vec or (sc == f32 and isinstance(ci, types.Integer))))
    if not ok:
        return None
    sig = types.void(dst, di, src, si, sc, ci)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        vty = ir.VectorType(ir.FloatType(), 16)
        v = builder.load(_vec16_ptr(context, builder, signature, args, 2), align=4)
        if vec:
            f = builder.load(_vec16_ptr(context, builder, signature, args, 4), align=4)
        else:
            f = builder.shuffle_vector(builder.insert_element(ir.Constant(vty, ir.Undefined), args[4],
                                                              ir.Constant(ir.IntType(32), 0)),
                                       ir.Constant(vty, ir.Undefined),
                                       ir.Constant(ir.VectorType(ir.IntType(32), 16), [0] * 16))
        builder.store(builder.fmul(v, f), _vec16_ptr(context, builder, signature, args, 0), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def borrow(typingctx, arr):
    """The same array without its owner (meminfo and parent NULL): numba's reference counting skips
    it, so passing it to a called kernel function costs no atomic increment / decrement (a call with
    four owned arrays costs eight, per call: per register tile in act_block's case). Only for
    arguments of a call made while `arr` itself is alive (the view owns nothing)."""
    if not isinstance(arr, types.Array):
        return None
    sig = arr(arr)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        out = context.make_array(signature.return_type)(context, builder)
        for name in ("nitems", "itemsize", "data", "shape", "strides"):
            setattr(out, name, getattr(ary, name))
        out.meminfo = cgutils.get_null_value(out.meminfo.type)
        out.parent = cgutils.get_null_value(out.parent.type)
        return out._getvalue()

    return sig, codegen


@intrinsic
def stack_i64(typingctx, size):
    """int64* to `size` (a compile-time integer literal) stack slots (the parameter block of
    `gemm6x16`)."""
    if not isinstance(size, types.IntegerLiteral):
        return None
    n = size.literal_value
    sig = types.CPointer(types.int64)(size)

    def codegen(context, builder, signature, args):
        return cgutils.alloca_once(builder, context.get_value_type(types.int64),
                                   size=context.get_constant(types.intp, n))

    return sig, codegen


@intrinsic
def address(typingctx, arr, idx):
    """The byte address of arr[idx] (1-D C-contiguous array, flat index) as an int64."""
    if not (isinstance(arr, types.Array) and isinstance(idx, types.Integer)):
        return None
    sig = types.int64(arr, idx)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        i = context.cast(builder, args[1], signature.args[1], types.int64)
        return builder.ptrtoint(builder.gep(ary.data, [i]), ir.IntType(64))

    return sig, codegen


@intrinsic
def load_f32(typingctx, addr):
    """The float32 at byte address `addr` (an int64 from `address` or an array's data pointer, plus a
    byte offset): a gather over several source arrays in one loop (kernels/movement.py's lane gather).
    The caller keeps the arrays alive and the address inside them."""
    if not isinstance(addr, types.Integer):
        return None
    sig = types.float32(addr)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        a = context.cast(builder, args[0], signature.args[0], types.int64)
        return builder.load(builder.inttoptr(a, ir.PointerType(ir.FloatType())), align=4)

    return sig, codegen


@intrinsic
def permsel16(typingctx, dst, di, segs, off, idx, ii, nseg):
    """dst[di:di + 16] = 16 lanes gathered from `nseg` (a literal, 1..4) source vectors: for segment j, the 16
    float32 at byte address segs[j] + off (segs: CPointer(int64)), permuted by the lane indices
    idx[ii + 16 j: ii + 16 j + 16] (int32; vpermps, `llvm.x86.avx512.permvar.sf.512`) where that index is
    >= 0; lanes no segment names are 0. The lane gather's AVX-512 form (kernels/movement.py): a few
    vector loads and permutes per 16 values instead of 16 scalar loads and stores. Only on hosts with
    AVX-512F (`x86_avx512`); elsewhere the (unreachable) call traps."""
    f32, i32 = types.float32, types.int32
    if not (isinstance(dst, types.Array) and dst.dtype == f32 and dst.layout == "C" and isinstance(di, types.Integer)
            and isinstance(segs, types.CPointer) and segs.dtype == types.int64 and isinstance(off, types.Integer)
            and isinstance(idx, types.Array) and idx.dtype == i32 and idx.layout == "C"
            and isinstance(ii, types.Integer) and isinstance(nseg, types.IntegerLiteral)
            and 1 <= nseg.literal_value <= 4):
        return None
    n = nseg.literal_value
    sig = types.void(dst, di, segs, off, idx, ii, nseg)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        vf = ir.VectorType(ir.FloatType(), 16)
        vi = ir.VectorType(ir.IntType(32), 16)
        if not x86_avx512():
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.trap")
            builder.call(fn, [])
            return context.get_dummy_value()
        perm = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vi]),
                                              "llvm.x86.avx512.permvar.sf.512")
        o = context.cast(builder, args[3], signature.args[3], types.int64)
        ia = context.make_array(signature.args[4])(context, builder, args[4])
        i0 = context.cast(builder, args[5], signature.args[5], types.int64)
        acc = ir.Constant(vf, [0.0] * 16)
        for j in range(n):
            a = builder.add(builder.load(builder.gep(args[2], [ir.Constant(ir.IntType(64), j)])), o)
            v = builder.load(builder.inttoptr(a, vf.as_pointer()), align=4)
            ij = builder.add(i0, ir.Constant(ir.IntType(64), 16 * j))
            iv = builder.load(builder.bitcast(builder.gep(ia.data, [ij]), vi.as_pointer()), align=4)
            m = builder.icmp_signed(">=", iv, ir.Constant(vi, [0] * 16))
            acc = builder.select(m, builder.call(perm, [v, iv]), acc)
        builder.store(acc, _vec16_ptr(context, builder, signature, args, 0), align=4)
        return context.get_dummy_value()

    return sig, codegen


# The AVX2 register tile of the blocked conv kernels (k1x1, direct, Winograd's GEMMs on tiles.ASM_AVX2
# hosts), in x86-64 assembly (AT&T syntax; `$$` is LLVM's literal `$`): R <= 6 output positions x 16
# output channels, 2R ymm accumulators. Numba's code for the 6 x 16 tile spilled: LLVM hoists the six
# broadcasts ahead of the FMAs (12 accumulators + 2 weights + 6 broadcasts = 20 of the 16 ymm
# registers), so the numba kernels there run 5 x 16 (10 accumulators). Written out, the tile keeps its
# accumulators in ymm0-11, the weight row in ymm12-13 and alternates two broadcast registers.
# The reduction runs over chunks of at most 16 input channels: chunk j's channels are consecutive
# floats from x + table[j] (+ each position's offset); the weight rows (16 floats) of all chunks'
# channels follow each other `wstride` bytes apart. Parameter block (int64 [13], read through %rdi):
#   0 &x (position 0)   1 &w (first channel's row)   2-6 byte offsets of positions 1-5 from position 0
#   7 chunks   8 channels in the last chunk (1..16; the others have 16)   9 &table (int64 byte offsets)
#  10 wstride   11 &acc (R x 16 float32, written)   12 &bias[16], or 0: no bias added
# acc[r, l] = (sum over the channels in order of fma(x[r, c], w[c, l], .)) (+ bias[l]): the numba
# tiles' reduction, operation for operation (the same bits; tests/test_register_tiles.py).
TILE_ROWS = 6
# tile16's and strip16's whole chunks (16 channels) run unrolled: the rolled loop spends 4 instructions a
# channel on its counters beside 20 (tile16) or 21 (strip16) for 12 FMAs, and where the core's dispatch is
# the limit (a busy SMT sibling on the host) those count (docs/kernels.md). The same FMAs in the same order:
# the same bits. False (read when the kernels compile): every chunk on the rolled loop.
TILE_UNROLL = True


def _tile_asm(rows: int, resume: bool = False) -> str:
    """resume: the accumulators start from acc's values (prm[11]: a partial sum of an earlier slice of the
    reduction, stored there exactly), else from 0 (tile16a / tile16)."""
    def channel(k):   # one input channel: 2 weight loads, R broadcasts, 2R FMAs (k: its place in a chunk)
        pos = ["(%rsi)", "(%rsi,%r8)", "(%rsi,%r9)", "(%rsi,%r10)", "(%rsi,%r11)", "(%rsi,%r12)"][:rows]
        body = ["vmovups (%rdx), %ymm12", "vmovups 32(%rdx), %ymm13"]
        for r, p in enumerate(pos):
            b = 14 + (r & 1)
            body += [f"vbroadcastss {4 * k}{p}, %ymm{b}", f"vfmadd231ps %ymm{b}, %ymm12, %ymm{2 * r}",
                     f"vfmadd231ps %ymm{b}, %ymm13, %ymm{2 * r + 1}"]
        return body
    regs = ["r14", "rdx", "r8", "r9", "r10", "r11", "r12", "rcx"]
    s = [f"mov {8 * i}(%rdi), %{r}" for i, r in enumerate(regs) if not (rows + 1 <= i <= 6)]
    s += ["mov 72(%rdi), %r13", "mov 80(%rdi), %r15"]
    if resume:
        s += ["mov 88(%rdi), %rax"] + [f"vmovups {32 * i}(%rax), %ymm{i}" for i in range(2 * rows)]
    else:
        s += [f"vxorps %ymm{i}, %ymm{i}, %ymm{i}" for i in range(2 * rows)]
    s += ["test %rcx, %rcx", "jz 2f",
          "1:", "mov (%r13), %rsi", "add %r14, %rsi", "add $$8, %r13", "mov $$16, %rbx", "cmp $$1, %rcx", "jne 3f",
          "mov 64(%rdi), %rbx",
          "3:"]
    if TILE_UNROLL:    # a whole chunk (16 channels): unrolled, only the weight pointer advanced a channel
        s += ["cmp $$16, %rbx", "jne 14f"]
        for k in range(16):
            s += channel(k) + ["add %r15, %rdx"]
        s += ["jmp 13f"]
    s += ["14:"] + channel(0) + ["add $$4, %rsi", "add %r15, %rdx", "dec %rbx", "jnz 14b",
                                 "13:", "dec %rcx", "jnz 1b",
                                 "2:", "mov 96(%rdi), %rdx", "test %rdx, %rdx", "jz 4f", "vmovups (%rdx), %ymm12",
                                 "vmovups 32(%rdx), %ymm13"]
    s += [f"vaddps %ymm{12 + (i & 1)}, %ymm{i}, %ymm{i}" for i in range(2 * rows)]
    s += ["4:", "mov 88(%rdi), %rax"] + [f"vmovups %ymm{i}, {32 * i}(%rax)" for i in range(2 * rows)]
    return "\n\t".join(s)


def _clobbers(vector_regs: list[str]) -> str:
    """The clobber list of an assembly block that uses these vector registers and every scratch
    general-purpose register but %rdi (the parameter block) and %rbp."""
    return ",".join([f"~{{{v}}}" for v in vector_regs]
                    + [f"~{{{r}}}" for r in ("rax", "rbx", "rcx", "rdx", "rsi", "r8", "r9", "r10", "r11", "r12",
                                             "r13", "r14", "r15")]
                    + ["~{memory}", "~{dirflag}", "~{fpsr}", "~{flags}"])


_TILE_CLOBBERS = _clobbers([f"ymm{i}" for i in range(16)])


def _x86_with(features: set[str]) -> bool:
    """An x86-64 host whose code numba generates with these LLVM features ("+avx2", ...)."""
    import platform

    from numba.core.registry import cpu_target
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    return features <= set(cpu_target.target_context.codegen()._tm_features.split(","))


def x86_avx2() -> bool:
    """Can the assembly tile be compiled here: an x86-64 host whose code numba generates with AVX2
    and FMA (tiles.X86_AVX2; tiles.ASM_AVX2 decides whether the kernels use it)."""
    return _x86_with({"+avx2", "+fma"})


def _asm_codegen(available, text: str, clobbers: str):
    """The codegen of an assembly block intrinsic: the block with the parameter block's address (the
    intrinsic's first argument) in %rdi. Where available() is false (another kind of host) the
    dispatchers still compile their unreachable assembly branch; it traps there instead of holding x86
    code LLVM cannot assemble."""
    def codegen(context, builder, signature, args):
        from llvmlite import ir
        if not available():
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.trap")
            builder.call(fn, [])
            return context.get_dummy_value()
        i64 = ir.IntType(64)
        builder.asm(ir.FunctionType(ir.VoidType(), [i64]), text, "{rdi}," + clobbers,
                    [builder.ptrtoint(args[0], i64)], True)
        return context.get_dummy_value()
    return codegen


def _asm_block(prm, rows, text):
    """The typing and codegen of an assembly block intrinsic (tile16, strip16): prm a CPointer(int64)
    parameter block (its address in %rdi), rows a compile-time literal 1..6, text(rows) the assembly.
    On another kind of host the dispatchers still compile their (unreachable) assembly branch; it
    traps there instead of holding x86 code LLVM cannot assemble."""
    if not (isinstance(prm, types.CPointer) and prm.dtype == types.int64 and isinstance(rows, types.IntegerLiteral)
            and 1 <= rows.literal_value <= TILE_ROWS):
        return None
    return types.void(prm, rows), _asm_codegen(x86_avx2, text(rows.literal_value), _TILE_CLOBBERS)


@intrinsic
def tile16(typingctx, prm, rows):
    """The assembly tile above for `rows` (a compile-time literal, 1..6) positions, its parameters
    in prm (a CPointer(int64) of 13 from stack_i64). x86-64 with AVX2 and FMA only (tiles.ASM_AVX2
    says where it runs); LLVM parses it with the host's asm parser (`_register_asm_parser`)."""
    return _asm_block(prm, rows, _tile_asm)


def _tile_rows(tile, most: int = TILE_ROWS):
    """An inlined dispatcher nv -> tile(prm, nv) for nv = 1..most rows chosen at run time (a partial last
    tile computes only its positions): `if nv >= most: tile(prm, most) elif nv == most - 1: ...`, written
    out (each call's row count must be a compile-time literal)."""
    lines = ["def rows(prm, nv):", f"    if nv >= {most}:", f"        tile(prm, {most})"]
    for r in range(most - 1, 1, -1):
        lines += [f"    elif nv == {r}:", f"        tile(prm, {r})"]
    lines += ["    else:", "        tile(prm, 1)"]
    scope = {"tile": tile}
    exec("\n".join(lines), scope)
    return njit(inline="always")(scope["rows"])


tile16_rows = _tile_rows(tile16)    # tile16 with nv = 1..6 rows chosen at run time


@intrinsic
def tile16a(typingctx, prm, rows):
    """tile16 resuming a reduction: the accumulators start from acc (prm[11], R x 16 float32: the partial
    sums of the chunks before this call's, as tile16 or tile16a stored them) instead of 0, so a reduction
    run in slices (direct._direct_rows_avx2: a slice's weights stay in L1 over all the task's tiles) is the
    same FMA chain as one call over all the chunks: the same bits."""
    return _asm_block(prm, rows, lambda r: _tile_asm(r, True))


tile16a_rows = _tile_rows(tile16a)  # tile16a with nv = 1..6 rows chosen at run time


# The strip form of the tile (k1x1 at stride 1 on tiles.ASM_AVX2 hosts): `ntiles` consecutive tiles of R
# positions, the positions of the strip consecutive in every 16-channel plane (64 bytes apart: one image's
# map of a stride-1 1x1), each tile computed as tile16 computes it (the same FMA chain: bits equal) and
# stored by the assembly itself: + bias, (+ residual), the activation (0 identity, 1 ReLU, 2 clip), to the
# output (R consecutive positions of one 16-channel block). The numba code around tile16 cost ~250 cycles
# a tile (parameter block, stores through a stack buffer, prefetch bookkeeping): a K = 32 tile is ~200
# cycles of FMAs. The next tile's input lines (each chunk's; parameter 12) and output lines are prefetched.
# Parameter block (int64 [16], read through %rdi):
#   0 &x (the strip's first position, chunk 0)   1 &w (first channel's row)   2 chunk stride (bytes)
#   3 chunks (0: none, the accumulators stay 0)   4 channels in the last chunk (1..16)   5 wstride (bytes)
#   6 &out (the first position)   7 tiles (>= 1)   8 &bias[16]   9 &residual (like out), or 0: none
#  10 activation code (0, 1, 2)   11 &(alpha, beta) (float32: clip's bounds)   12 prefetch the input (0: no,
#     where the strip's input is already in L1/L2: a later block's sweep)   13 bytes from a weight row to the
#     same row of the block computed next (prefetcht1 as each row is read: the next block's weights reach L2
#     at the pace of the compute; a burst of prefetches stalls once the miss buffers are full)
#  14 accumulate: the accumulators start from the output's values (a later slice of the reduction), else 0
#  15 finalize: + bias, residual and the activation before the store (the reduction's last slice), else
#     the partial sums are stored as they are (float32, exact: the chain goes on from them unchanged)
# ReLU: max(0, v) as vmaxps with 0 first (0 if 0 > v else v: NaN and -0.0 pass, as store16's select);
# clip: min(beta, max(alpha, v)) the same way (alpha if alpha > v else v; beta if beta < m else m).
STRIP_PF_OUT = 2   # output lines prefetched (prefetchw) this many tiles ahead
STRIP_PF_IN = 1    # input lines (each chunk's) this many tiles ahead


def _strip_channel(rows: int, k: int = 0) -> list[str]:
    """One input channel of the strip's tile: the weight row (2 loads), its prefetch for the block computed
    next, R broadcasts, 2R FMAs. k: the channel's place in an unrolled chunk (byte offsets k x 128 into the
    weights, k x 4 into the positions); 0: the rolled loop's (%rsi and %rdx advanced by the loop)."""
    w = 128 * k
    body = [f"vmovups {w}(%rdx), %ymm12", f"vmovups {w + 32}(%rdx), %ymm13", f"prefetcht1 {w}(%rdx,%rax)"]
    for r in range(rows):
        b = 14 + (r & 1)
        body += [f"vbroadcastss {64 * r + 4 * k}(%rsi), %ymm{b}", f"vfmadd231ps %ymm{b}, %ymm12, %ymm{2 * r}",
                 f"vfmadd231ps %ymm{b}, %ymm13, %ymm{2 * r + 1}"]
    return body


def _strip_tile(rows: int, loads: list[str], zeros: list[str], channel) -> list[str]:
    """A ymm strip's tile up to its finalize test (strip16's, strip8's): the parameters into registers, the
    accumulators loaded (`loads`: accumulate, prm[14]) or zeroed, the output and input prefetches, the chunk
    loop over `channel(rows, k)` (a whole 16-channel chunk on 128-byte weight rows unrolled), then `je 8f`
    when not finalizing (prm[15]). Label 5 starts the tile."""
    step = 64 * rows
    s = ["mov 104(%rdi), %rax", "mov (%rdi), %r10", "mov 48(%rdi), %r11", "mov 56(%rdi), %r12", "mov 72(%rdi), %r13",
         "mov 16(%rdi), %r8", "mov 40(%rdi), %r9",
         "5:", "cmpq $$0, 112(%rdi)", "je 9f"] + loads + ["jmp 10f", "9:"] + zeros
    s += ["10:"] + [f"prefetchw {STRIP_PF_OUT * step + 64 * r}(%r11)" for r in range(rows)]
    s += ["mov %r10, %r14", "mov 8(%rdi), %rdx", "mov 24(%rdi), %rcx", "test %rcx, %rcx", "jz 2f",
          "1:", "mov %r14, %rsi", "mov $$16, %rbx", "cmp $$1, %rcx", "jne 3f", "mov 32(%rdi), %rbx", "3:"]
    s += ["cmpq $$0, 96(%rdi)", "je 4f"] + [f"prefetcht0 {STRIP_PF_IN * step + 64 * r}(%r14)" for r in range(rows)]
    s += ["4:"]
    if TILE_UNROLL:   # a whole chunk (16 channels) on 128-byte weight rows (k1x1's pairs): unrolled
        s += ["cmp $$16, %rbx", "jne 14f", "cmp $$128, %r9", "jne 14f"]
        for k in range(16):
            s += channel(rows, k)
        s += ["add $$2048, %rdx", "jmp 13f"]
    return s + ["14:"] + channel(rows, 0) + ["add $$4, %rsi", "add %r9, %rdx", "dec %rbx", "jnz 14b",
                                            "13:", "add %r8, %r14", "dec %rcx", "jnz 1b",
                                            "2:", "cmpq $$0, 120(%rdi)", "je 8f"]


def _strip_asm(rows: int) -> str:
    step = 64 * rows
    acc = range(2 * rows)
    s = _strip_tile(rows, [f"vmovups {32 * i}(%r11), %ymm{i}" for i in acc],
                    [f"vxorps %ymm{i}, %ymm{i}, %ymm{i}" for i in acc], _strip_channel)
    s += _ymm_finish(rows)
    s += [f"add $${step}, %r10", f"add $${step}, %r11", "dec %r12", "jnz 5b"]
    return "\n\t".join(s)


def _ymm_act(regs, tag: int) -> list[str]:
    """The activation of `_ymm_finish` (prm[10]: 0 none / 1 ReLU / 2 clip with prm[11]'s bounds) over `regs`,
    with ymm12-13 as its constants; local labels tag, tag + 1."""
    s = ["mov 80(%rdi), %r15", "cmp $$1, %r15", f"jne {tag}f", "vxorps %ymm12, %ymm12, %ymm12"]
    s += [f"vmaxps %ymm{i}, %ymm12, %ymm{i}" for i in regs]
    s += [f"jmp {tag + 1}f", f"{tag}:", "cmp $$2, %r15", f"jne {tag + 1}f", "mov 88(%rdi), %r15",
          "vbroadcastss (%r15), %ymm12", "vbroadcastss 4(%r15), %ymm13"]
    s += [f"vmaxps %ymm{i}, %ymm12, %ymm{i}" for i in regs]
    s += [f"vminps %ymm{i}, %ymm13, %ymm{i}" for i in regs]
    return s + [f"{tag + 1}:"]


def _ymm_finish(rows: int) -> list[str]:
    """The ymm strips' tile epilogue (strip16's finalize, sstrip16's): + bias (prm[8]), + residual (%r13, 0:
    none; advanced a tile), the activation (prm[10] 0 / 1 ReLU / 2 clip, prm[11] &(alpha, beta)), stored at
    %r11 (label 8: the stores). Accumulator i holds position i // 2's lanes 8 * (i % 2) .. + 8."""
    acc = range(2 * rows)
    s = ["mov 64(%rdi), %r15", "vmovups (%r15), %ymm12", "vmovups 32(%r15), %ymm13"]
    s += [f"vaddps %ymm{12 + (i & 1)}, %ymm{i}, %ymm{i}" for i in acc]
    s += ["test %r13, %r13", "jz 6f"]
    s += [f"vaddps {32 * i}(%r13), %ymm{i}, %ymm{i}" for i in acc]
    s += [f"add $${64 * rows}, %r13",
          "6:"] + _ymm_act(acc, 7)
    return s + [f"vmovups %ymm{i}, {32 * i}(%r11)" for i in acc]


@intrinsic
def strip16(typingctx, prm, rows):
    """The strip above for `rows` (a compile-time literal, 1..6) positions a tile, its parameters in prm
    (a CPointer(int64) of 16 from stack_i64); x86-64 with AVX2 and FMA only, as tile16."""
    return _asm_block(prm, rows, _strip_asm)


strip16_rows = _tile_rows(strip16)  # strip16 with nv = 1..6 positions a tile chosen at run time


# The half-block strip (k1x1 at stride 1 on tiles.ASM_AVX2 hosts, an output block whose lanes 8-15 have zero
# weights: the last block of Co = 24, 40, 104, 440, ... where Co % 16 is 1..8). strip16 runs such a block as
# two ymm halves, the upper one FMAs on zero weights (a quarter of a 24-channel projection's FMAs); here a tile
# is R <= 12 positions x the block's lanes 0-7: 12 ymm accumulators (position r's in ymm r), the weight half-row
# in ymm12, three broadcast registers in turn. The same parameter block as strip16 and each lower lane's FMA
# chain as strip16's (the same bits). Lanes 8-15 are stored as strip16 stores them for finite inputs:
# act(0 + bias + residual) (their FMA chain is fma(x, 0, .) from +0: exactly +0; a NaN or infinite input
# made them NaN there, here they stay act(bias + residual) = act(0), the padded channels' value,
# docs/kernels.md "Epilogue"). Not finalizing (a reduction slice's partial sums): lanes 0-7 only.
HALF_ROWS = 12


def _strip8_channel(rows: int, k: int = 0) -> list[str]:
    """One input channel of the half strip's tile: the weight half-row, its prefetch for the block computed
    next, R broadcasts, R FMAs (k as in `_strip_channel`)."""
    w = 128 * k
    body = [f"vmovups {w}(%rdx), %ymm12", f"prefetcht1 {w}(%rdx,%rax)"]
    for r in range(rows):
        b = 13 + r % 3
        body += [f"vbroadcastss {64 * r + 4 * k}(%rsi), %ymm{b}", f"vfmadd231ps %ymm{b}, %ymm12, %ymm{r}"]
    return body


def _strip8_asm(rows: int) -> str:
    step = 64 * rows
    acc = range(rows)
    s = _strip_tile(rows, [f"vmovups {64 * i}(%r11), %ymm{i}" for i in acc],
                    [f"vxorps %ymm{i}, %ymm{i}, %ymm{i}" for i in acc], _strip8_channel)
    # finalize: lanes 0-7 as _ymm_finish's (+ bias, + residual, the activation), then lanes 8-15 from +0
    s += ["mov 64(%rdi), %r15", "vmovups (%r15), %ymm12"]
    s += [f"vaddps %ymm12, %ymm{i}, %ymm{i}" for i in acc]
    s += ["test %r13, %r13", "jz 6f"] + [f"vaddps {64 * i}(%r13), %ymm{i}, %ymm{i}" for i in acc]
    s += ["6:"] + _ymm_act(acc, 15) + [f"vmovups %ymm{i}, {64 * i}(%r11)" for i in acc]
    s += ["mov 64(%rdi), %r15", "vxorps %ymm15, %ymm15, %ymm15", "vaddps 32(%r15), %ymm15, %ymm15"]
    s += [f"vmovaps %ymm15, %ymm{i}" for i in acc]
    s += ["test %r13, %r13", "jz 7f"] + [f"vaddps {64 * i + 32}(%r13), %ymm{i}, %ymm{i}" for i in acc]
    s += [f"add $${step}, %r13", "7:"] + _ymm_act(acc, 17) + [f"vmovups %ymm{i}, {64 * i + 32}(%r11)" for i in acc]
    s += ["jmp 11f", "8:"] + [f"vmovups %ymm{i}, {64 * i}(%r11)" for i in acc]
    s += ["11:", f"add $${step}, %r10", f"add $${step}, %r11", "dec %r12", "jnz 5b"]
    return "\n\t".join(s)


@intrinsic
def strip8(typingctx, prm, rows):
    """The half-block strip above for `rows` (a compile-time literal, 1..12) positions a tile, its parameters
    in prm (strip16's block of 16 int64 from stack_i64); x86-64 with AVX2 and FMA only, as tile16."""
    if not (isinstance(prm, types.CPointer) and prm.dtype == types.int64 and isinstance(rows, types.IntegerLiteral)
            and 1 <= rows.literal_value <= HALF_ROWS):
        return None
    return types.void(prm, rows), _asm_codegen(x86_avx2, _strip8_asm(rows.literal_value), _TILE_CLOBBERS)


strip8_rows = _tile_rows(strip8, HALF_ROWS)  # strip8 with nv = 1..12 positions a tile chosen at run time


# The stem's AVX2 strip (stem._stem_rows_avx2 on tiles.ASM_AVX2 hosts): dstrip512's loop (below) with ymm
# registers: tiles of R <= 6 consecutive output positions of one output row x one block of 16 output
# channels, the positions `ps` (4, 8 or 16: stride 1, 2 or 4) bytes apart in the stem's plain (C, rows, Wp) band;
# the reduction runs over a table of chunks (the (c, kh, kw) taps in the weights' order, one input channel
# each, at the tap's byte offset from the position), the weight rows wb[ob, c, kh, kw, :] 64 bytes apart.
# Registers as tile16's (accumulators ymm0-11: position r's lanes 0-7 in ymm(2r), 8-15 in ymm(2r+1); the
# weight row in ymm12-13; two broadcast registers alternating); the epilogue strip16's finalize (+ bias,
# + residual, identity / ReLU / clip, stored by the assembly). Each accumulator's chain is the numba stem
# tiles' (fma(x, w, acc) over the taps in order, + bias, + residual, the activation as store16): the same
# bits (tests/test_register_tiles.py). The numba 5 x 1 tile around which this replaces ran 35 GFLOP/s on
# two Zen 3 cores (MobileNetV2's stem: 614 us against ONNX Runtime's 437). Parameter block (int64 [14],
# dstrip512's layout, read through %rdi):
#   0 &x (position 0 of the strip's first tile)   1 &w (the block's first row)   2 &table (int64 byte offsets)
#   3 chunks (>= 1)   4, 5 unused   6 &out (position 0)   7 tiles (>= 1)   8 &bias[16]
#   9 &residual (like out), or 0   10 activation code (0, 1, 2)   11 &(alpha, beta)   12, 13 unused
def _sstrip16_asm(rows: int, ps: int) -> str:
    acc = range(2 * rows)
    body = ["vmovups (%rdx), %ymm12", "vmovups 32(%rdx), %ymm13"]
    for r in range(rows):
        b = 14 + (r & 1)
        body += [f"vbroadcastss {ps * r}(%rsi), %ymm{b}", f"vfmadd231ps %ymm{b}, %ymm12, %ymm{2 * r}",
                 f"vfmadd231ps %ymm{b}, %ymm13, %ymm{2 * r + 1}"]
    s = ["mov (%rdi), %r10", "mov 48(%rdi), %r11", "mov 56(%rdi), %r12", "mov 72(%rdi), %r13",
         "5:"] + [f"vxorps %ymm{i}, %ymm{i}, %ymm{i}" for i in acc]
    s += [f"prefetchw {STRIP_PF_OUT * 64 * rows + 64 * r}(%r11)" for r in range(rows)]
    s += ["mov 8(%rdi), %rdx", "mov 16(%rdi), %r8", "mov 24(%rdi), %rcx",
          "1:", "mov (%r8), %rsi", "add %r10, %rsi", "add $$8, %r8"] + body + [
          "add $$64, %rdx", "dec %rcx", "jnz 1b"] + _ymm_finish(rows)
    s += [f"add $${ps * rows}, %r10", f"add $${64 * rows}, %r11", "dec %r12", "jnz 5b"]
    return "\n\t".join(s)


@intrinsic
def sstrip16(typingctx, prm, rows, ps):
    """The stem's AVX2 strip above for `rows` (1..6) positions a tile, `ps` (4, 8, 16) input bytes from one
    position to the next, both compile-time literals; parameters in prm (CPointer(int64) of 14). x86-64
    with AVX2 and FMA only, as tile16."""
    ok = (isinstance(prm, types.CPointer) and prm.dtype == types.int64
          and all(isinstance(v, types.IntegerLiteral) for v in (rows, ps))
          and 1 <= rows.literal_value <= TILE_ROWS and ps.literal_value in (4, 8, 16))
    if not ok:
        return None
    text = _sstrip16_asm(rows.literal_value, ps.literal_value)
    return types.void(prm, rows, ps), _asm_codegen(x86_avx2, text, _TILE_CLOBBERS)


def _by_rows6(strip, ps: int):
    """An inlined dispatcher nv -> strip(prm, nv, ps) for nv = 1..6 positions chosen at run time (`_by_rows`'
    form for the ymm strips)."""
    @njit(inline="always")
    def rows(prm, nv):
        if nv >= 6:
            strip(prm, 6, ps)
        elif nv == 5:
            strip(prm, 5, ps)
        elif nv == 4:
            strip(prm, 4, ps)
        elif nv == 3:
            strip(prm, 3, ps)
        elif nv == 2:
            strip(prm, 2, ps)
        else:
            strip(prm, 1, ps)
    return rows


_sstrip16_1, _sstrip16_2, _sstrip16_4 = _by_rows6(sstrip16, 4), _by_rows6(sstrip16, 8), _by_rows6(sstrip16, 16)


@njit(inline="always")
def sstrip16_rows(prm, nv, step):
    """The stem's AVX2 strip with nv = 1..6 positions a tile and stride step = 1, 2, 4 chosen at run time."""
    if step == 1:
        _sstrip16_1(prm, nv)
    elif step == 2:
        _sstrip16_2(prm, nv)
    else:
        _sstrip16_4(prm, nv)


# The AVX-512 strip (k1x1 at stride 1 on tiles.ASM_512 hosts): `_strip_asm`'s loop, stores and epilogue
# with zmm registers and tiles of R <= 14 positions x B (1 or 2) blocks of 16 output channels: 2R
# accumulators in zmm0-27 (position r, block b in zmm(B*r + b)), the weight row (B x 16 floats, the
# pair-packed wp row: block 1 at +64 bytes) in zmm28-29, two broadcast registers alternating (zmm30-31).
# Per input channel B loads + R broadcasts feed B*R FMAs (28 FMAs on 16 loads: the numba 7 x 2 tile
# ran 14 on 9 and its per-tile code around them). B = 1 only for an odd last block. Each accumulator's
# chain is the numba tiles' (fma(x, w, acc) over the channels in order, + bias, + residual, the
# activation as store16): the same bits (tests/test_register_tiles.py). Parameter block: strip16's 16
# (block 0's addresses) and
#  16 the byte distance from an output block to the next (block 1's output / residual at +that)
STRIP512_ROWS = 14


def _zmm_acc(rows: int, blocks: int):
    """The zmm strips' accumulators: [(r, b)] and A(r, b) = the register of position r, block b."""
    return [(r, b) for r in range(rows) for b in range(blocks)], (lambda r, b: blocks * r + b)


def _zmm_mem(r: int, b: int, base: str, disp: int = 0) -> str:
    """Position r of output block b at base (+ the block stride in %r15), disp bytes further."""
    return f"{disp + 64 * r}({base})" if b == 0 else f"{disp + 64 * r}({base},%r15)"


def _zmm_finish(rows: int, blocks: int) -> list[str]:
    """The zmm strips' tile epilogue: + bias (prm[8]), + residual (%r13, 0: none; advanced a tile), the
    activation (prm[10] 0 / 1 ReLU / 2 clip, prm[11] &(alpha, beta)), stored at %r11 (label 8: the stores).
    ReLU and clip take the bound first, as `_strip_asm` (NaN and -0.0 come out as from store16)."""
    acc, A = _zmm_acc(rows, blocks)
    s = ["mov 64(%rdi), %rdx"] + [f"vmovups {64 * b}(%rdx), %zmm{28 + b}" for b in range(blocks)]
    s += [f"vaddps %zmm{28 + b}, %zmm{A(r, b)}, %zmm{A(r, b)}" for r, b in acc]
    s += ["test %r13, %r13", "jz 6f"]
    s += [f"vaddps {_zmm_mem(r, b, '%r13')}, %zmm{A(r, b)}, %zmm{A(r, b)}" for r, b in acc]
    s += [f"add $${64 * rows}, %r13",
          "6:", "mov 80(%rdi), %rdx", "cmp $$1, %rdx", "jne 7f", "vpxord %zmm28, %zmm28, %zmm28"]
    s += [f"vmaxps %zmm{A(r, b)}, %zmm28, %zmm{A(r, b)}" for r, b in acc]
    s += ["jmp 8f", "7:", "cmp $$2, %rdx", "jne 8f", "mov 88(%rdi), %rdx", "vbroadcastss (%rdx), %zmm28",
          "vbroadcastss 4(%rdx), %zmm29"]
    s += [f"vmaxps %zmm{A(r, b)}, %zmm28, %zmm{A(r, b)}" for r, b in acc]
    s += [f"vminps %zmm{A(r, b)}, %zmm29, %zmm{A(r, b)}" for r, b in acc]
    return s + ["8:"] + [f"vmovups %zmm{A(r, b)}, {_zmm_mem(r, b, '%r11')}" for r, b in acc]


def _zmm_prefetch_out(rows: int, blocks: int) -> list[str]:
    """prefetchw of the output lines STRIP_PF_OUT tiles ahead of %r11."""
    return [f"prefetchw {_zmm_mem(r, b, '%r11', STRIP_PF_OUT * 64 * rows)}" for r in range(rows) for b in range(blocks)]


def _strip512_asm(rows: int, blocks: int) -> str:
    step = 64 * rows
    acc, A = _zmm_acc(rows, blocks)
    body = [f"vmovups {64 * b}(%rdx), %zmm{28 + b}" for b in range(blocks)]
    body += [f"prefetcht1 {64 * b}(%rdx,%rax)" for b in range(blocks)]
    for r in range(rows):
        bc = 30 + (r & 1)
        body += [f"vbroadcastss {64 * r}(%rsi), %zmm{bc}"]
        body += [f"vfmadd231ps %zmm{bc}, %zmm{28 + b}, %zmm{A(r, b)}" for b in range(blocks)]
    s = ["mov 104(%rdi), %rax", "mov (%rdi), %r10", "mov 48(%rdi), %r11", "mov 56(%rdi), %r12", "mov 72(%rdi), %r13",
         "mov 16(%rdi), %r8", "mov 40(%rdi), %r9", "mov 128(%rdi), %r15",
         "5:", "cmpq $$0, 112(%rdi)", "je 9f"]
    s += [f"vmovups {_zmm_mem(r, b, '%r11')}, %zmm{A(r, b)}" for r, b in acc]
    s += ["jmp 10f", "9:"]
    s += [f"vpxord %zmm{A(r, b)}, %zmm{A(r, b)}, %zmm{A(r, b)}" for r, b in acc]
    s += ["10:"] + _zmm_prefetch_out(rows, blocks)
    s += ["mov %r10, %r14", "mov 8(%rdi), %rdx", "mov 24(%rdi), %rcx", "test %rcx, %rcx", "jz 2f",
          "1:", "mov %r14, %rsi", "mov $$16, %rbx", "cmp $$1, %rcx", "jne 3f", "mov 32(%rdi), %rbx", "3:"]
    s += ["cmpq $$0, 96(%rdi)", "je 4f"] + [f"prefetcht0 {STRIP_PF_IN * step + 64 * r}(%r14)" for r in range(rows)]
    s += ["4:"] + body + ["add $$4, %rsi", "add %r9, %rdx", "dec %rbx", "jnz 4b",
                          "add %r8, %r14", "dec %rcx", "jnz 1b",
                          "2:", "cmpq $$0, 120(%rdi)", "je 8f"]
    s += _zmm_finish(rows, blocks)
    s += [f"add $${step}, %r10", f"add $${step}, %r11", "dec %r12", "jnz 5b"]
    return "\n\t".join(s)


_ZMM_CLOBBERS = _clobbers([f"zmm{i}" for i in range(32)])


def x86_avx512() -> bool:
    """Can the AVX-512 strip be compiled here: an x86-64 host whose code numba generates with AVX-512F
    (tiles.X86_512; tiles.ASM_512 decides whether the kernels use it)."""
    return _x86_with({"+avx512f"})


def _zmm_literals(prm, rows, blocks, ps, steps) -> bool:
    """The zmm strips' typing: prm a CPointer(int64), rows 1..14, blocks 1 or 2 and ps (the input bytes
    between positions) in `steps`, all compile-time literals."""
    return (isinstance(prm, types.CPointer) and prm.dtype == types.int64
            and all(isinstance(v, types.IntegerLiteral) for v in (rows, blocks, ps))
            and 1 <= rows.literal_value <= STRIP512_ROWS and blocks.literal_value in (1, 2)
            and ps.literal_value in steps)


@intrinsic
def strip512(typingctx, prm, rows, blocks, ps):
    """The AVX-512 strip above for `rows` (1..14) positions x `blocks` (1, 2) output blocks a tile, the
    positions ps = 64 bytes apart (dstrip512's signature), all compile-time literals; its parameters in
    prm (a CPointer(int64) of 17 from stack_i64). On a host without AVX-512 the (unreachable) call traps
    instead."""
    if not _zmm_literals(prm, rows, blocks, ps, (64,)):
        return None
    return (types.void(prm, rows, blocks, ps),
            _asm_codegen(x86_avx512, _strip512_asm(rows.literal_value, blocks.literal_value), _ZMM_CLOBBERS))


def _by_rows(strip, blocks: int, ps: int):
    """An inlined dispatcher nv -> strip(prm, nv, blocks, ps) for nv = 1..14 positions chosen at run time
    (the intrinsics take compile-time literals: one branch per position count; blocks and ps, closure
    constants, are literals to numba too)."""
    @njit(inline="always")
    def rows(prm, nv):
        if nv >= 14:
            strip(prm, 14, blocks, ps)
        elif nv == 13:
            strip(prm, 13, blocks, ps)
        elif nv == 12:
            strip(prm, 12, blocks, ps)
        elif nv == 11:
            strip(prm, 11, blocks, ps)
        elif nv == 10:
            strip(prm, 10, blocks, ps)
        elif nv == 9:
            strip(prm, 9, blocks, ps)
        elif nv == 8:
            strip(prm, 8, blocks, ps)
        elif nv == 7:
            strip(prm, 7, blocks, ps)
        elif nv == 6:
            strip(prm, 6, blocks, ps)
        elif nv == 5:
            strip(prm, 5, blocks, ps)
        elif nv == 4:
            strip(prm, 4, blocks, ps)
        elif nv == 3:
            strip(prm, 3, blocks, ps)
        elif nv == 2:
            strip(prm, 2, blocks, ps)
        else:
            strip(prm, 1, blocks, ps)
    return rows


_strip512_two = _by_rows(strip512, 2, 64)
_strip512_one = _by_rows(strip512, 1, 64)


@njit(inline="always")
def strip512_rows(prm, nv, nblk):
    """strip512 with nv = 1..14 positions a tile and nblk = 1, 2 blocks chosen at run time."""
    if nblk == 2:
        _strip512_two(prm, nv)
    else:
        _strip512_one(prm, nv)


# The AVX-512 strip of the direct kxk conv (direct._direct_rows_512 on tiles.ASM_512 hosts): tiles of R <= 14
# consecutive output positions of one output row x B (1, 2) blocks, the positions `step` (1 or 2: the
# stride) x 64 bytes apart in the (padded) input; the reduction runs over a table of chunks (the (cb, kh,
# kw) taps in the weights' order, 16 input channels each, at the chunk's byte offset from the position), the
# weight rows of block 0 consecutive (64 bytes apart: direct's packed wb[ob, cb, kh, kw, ci, :]), block 1's
# the weight block stride further. Registers as strip512's (accumulators zmm0-27, weights zmm28-29,
# broadcasts zmm30-31); the epilogue is strip512's finalize (+ bias, + residual, identity / ReLU / clip,
# stored by the assembly). The FMA chain per accumulator is the direct tiles' (`fma(x, w, acc)` over the
# chunks and their channels in order): the same bits (tests/test_register_tiles.py). The direct conv's
# table (ps 64, 128) holds a pair a chunk, (input byte offset, weight byte offset from &w): a table of the
# live taps only skips the others' weights too (`direct._direct_rows_512`); the stem's (ps 4, 8) one input
# offset a chunk, its weight rows consecutive. Parameter block (int64 [14], read through %rdi):
#   0 &x (position 0 of the strip's first tile)   1 &w (block 0's first row)   2 &table (int64 byte offsets)
#   3 chunks (>= 1)   4 (ps 64, 128) prefetch distance: as each weight row of block 0 is read, the line that many
#     bytes on is prefetched into L2 (prefetcht1; another block's same row: the weights of the block pair the
#     caller computes next, `direct._direct_rows_512`; 0: the row itself, no traffic)   5 weight block stride
#     (bytes)   6 &out (position 0, block 0)   7 tiles   8 &bias[B * 16]   9 &residual (like out), or 0
#  10 activation code (0, 1, 2)   11 &(alpha, beta)   12 (two-row tiles) the input bytes from one output row's
#     positions to the next row's   13 the byte distance from an output block to the next
def _dstrip512_asm(rows: int, blocks: int, ps: int, split: int = 0) -> str:
    """ps: the input bytes from one position to the next: 64 or 128 (direct, NCHW16c input, 16 channels a
    chunk, 4 bytes apart; (input, weight) offset pairs), 4 or 8 (the stem, a plain (C, rows, Wp) band: one
    channel a chunk). split > 0: positions split..rows-1 are those of the next output row, read %r9 =
    prm[12] bytes further on (its input row stride) (the direct conv's two-row tiles on maps at most 7
    wide: one call fills the strip's 14 positions)."""
    ch = 16 if ps >= 64 else 1                # input channels a chunk
    if ch == 16:    # %rdx = &w + the chunk's weight offset, %rax = &w
        chunk = ["mov (%r8), %rsi", "add %r10, %rsi", "mov 8(%r8), %rdx", "add %rax, %rdx", "add $$16, %r8"]
    else:           # the weight rows run on from chunk to chunk
        chunk = ["mov (%r8), %rsi", "add %r10, %rsi", "add $$8, %r8"]
    acc, A = _zmm_acc(rows, blocks)
    body = ["vmovups (%rdx), %zmm28"] + (["vmovups (%rdx,%r14), %zmm29"] if blocks == 2 else [])
    if ch == 16:    # the row prm[4] bytes on, into L2 (%r15 holds the distance in the chunk loop)
        body += ["prefetcht1 (%rdx,%r15)"]
    for r in range(rows):
        bc = 30 + (r & 1)
        src = f"{ps * (r - split)}(%rsi,%r9)" if 0 < split <= r else f"{ps * r}(%rsi)"
        body += [f"vbroadcastss {src}, %zmm{bc}"]
        body += [f"vfmadd231ps %zmm{bc}, %zmm{28 + b}, %zmm{A(r, b)}" for b in range(blocks)]
    s = ["mov (%rdi), %r10", "mov 48(%rdi), %r11", "mov 56(%rdi), %r12", "mov 72(%rdi), %r13",
         "mov 40(%rdi), %r14", "mov 104(%rdi), %r15"] + (["mov 96(%rdi), %r9"] if split else []) + [
         "5:"]
    s += [f"vpxord %zmm{A(r, b)}, %zmm{A(r, b)}, %zmm{A(r, b)}" for r, b in acc]
    s += _zmm_prefetch_out(rows, blocks)
    s += ["mov 8(%rdi), %rdx", "mov 8(%rdi), %rax", "mov 16(%rdi), %r8", "mov 24(%rdi), %rcx"]
    s += (["mov 32(%rdi), %r15"] if ch == 16 else []) + ["1:"]       # %r15: the prefetch distance ...
    s += chunk + [f"mov $${ch}, %rbx", "4:"] + body
    s += ["add $$4, %rsi", "add $$64, %rdx", "dec %rbx", "jnz 4b", "dec %rcx", "jnz 1b"]
    s += (["mov 104(%rdi), %r15"] if ch == 16 else []) + _zmm_finish(rows, blocks)   # ... the block distance
    s += [f"add $${ps * rows}, %r10", f"add $${64 * rows}, %r11", "dec %r12", "jnz 5b"]
    return "\n\t".join(s)


@intrinsic
def dstrip512(typingctx, prm, rows, blocks, ps):
    """The direct conv's (and the stem's) AVX-512 strip above for `rows` (1..14) positions x `blocks` (1, 2)
    at `ps` (64, 128: direct; 4, 8: the stem) input bytes from one position to the next, all compile-time
    literals; parameters in prm (CPointer(int64) of 14)."""
    if not _zmm_literals(prm, rows, blocks, ps, (4, 8, 64, 128)):
        return None
    text = _dstrip512_asm(rows.literal_value, blocks.literal_value, ps.literal_value)
    return types.void(prm, rows, blocks, ps), _asm_codegen(x86_avx512, text, _ZMM_CLOBBERS)


@intrinsic
def dstrip512x2(typingctx, prm, rows, blocks, ps):
    """`dstrip512` for two output rows in one tile: `rows` (2..14, even) positions, the first rows / 2 those of
    one output row, the rest the next row's, prm[12] input bytes further on; the output positions follow each
    other (rows / 2 is the map's width). Each position's chain is dstrip512's: the same bits."""
    if not _zmm_literals(prm, rows, blocks, ps, (64, 128)) or rows.literal_value % 2:
        return None
    text = _dstrip512_asm(rows.literal_value, blocks.literal_value, ps.literal_value, rows.literal_value // 2)
    return types.void(prm, rows, blocks, ps), _asm_codegen(x86_avx512, text, _ZMM_CLOBBERS)


def _by_pairs(strip, blocks: int, ps: int):
    """An inlined dispatcher w -> strip(prm, 2 * w, blocks, ps) for a map width w = 1..7 chosen at run time."""
    @njit(inline="always")
    def rows(prm, w):
        if w >= 7:
            strip(prm, 14, blocks, ps)
        elif w == 6:
            strip(prm, 12, blocks, ps)
        elif w == 5:
            strip(prm, 10, blocks, ps)
        elif w == 4:
            strip(prm, 8, blocks, ps)
        elif w == 3:
            strip(prm, 6, blocks, ps)
        elif w == 2:
            strip(prm, 4, blocks, ps)
        else:
            strip(prm, 2, blocks, ps)
    return rows


_dstrip512_two_1, _dstrip512_two_2 = _by_rows(dstrip512, 2, 64), _by_rows(dstrip512, 2, 128)
_dpair512_two_1, _dpair512_two_2 = _by_pairs(dstrip512x2, 2, 64), _by_pairs(dstrip512x2, 2, 128)
_dpair512_one_1, _dpair512_one_2 = _by_pairs(dstrip512x2, 1, 64), _by_pairs(dstrip512x2, 1, 128)
_dstrip512_one_1, _dstrip512_one_2 = _by_rows(dstrip512, 1, 64), _by_rows(dstrip512, 1, 128)
_sstrip512_two_1, _sstrip512_two_2 = _by_rows(dstrip512, 2, 4), _by_rows(dstrip512, 2, 8)
_sstrip512_one_1, _sstrip512_one_2 = _by_rows(dstrip512, 1, 4), _by_rows(dstrip512, 1, 8)


def _by_blocks_step(two_1, two_2, one_1, one_2, doc: str):
    """An inlined dispatcher (prm, n, nblk, step) -> the strip of nblk = 2 or 1 blocks at stride step = 1 or 2
    (the four `_by_rows` / `_by_pairs` dispatchers of one strip), chosen at run time."""
    @njit(inline="always")
    def rows(prm, n, nblk, step):
        if nblk == 2:
            if step == 1:
                two_1(prm, n)
            else:
                two_2(prm, n)
        elif step == 1:
            one_1(prm, n)
        else:
            one_2(prm, n)
    rows.__doc__ = doc
    return rows


dstrip512_rows = _by_blocks_step(
    _dstrip512_two_1, _dstrip512_two_2, _dstrip512_one_1, _dstrip512_one_2,
    """The direct strip (NCHW16c input) with nv = 1..14 positions, nblk = 1, 2 blocks and stride step = 1, 2
    chosen at run time.""")
dpair512_rows = _by_blocks_step(
    _dpair512_two_1, _dpair512_two_2, _dpair512_one_1, _dpair512_one_2,
    """The direct strip over two output rows of a map w = 1..7 wide (2w positions), nblk = 1, 2 blocks and
    stride step = 1, 2 chosen at run time (`dstrip512x2`).""")
sstrip512_rows = _by_blocks_step(
    _sstrip512_two_1, _sstrip512_two_2, _sstrip512_one_1, _sstrip512_one_2,
    """The stem's strip (a plain (C, rows, Wp) band, one channel a chunk), as dstrip512_rows.""")


@intrinsic
def add16(typingctx, dst, di, src, si):
    """dst[di:di + 16] += src[si:si + 16] as one 16-lane vector add (each lane one IEEE add: the bits of
    the scalar loop); C-contiguous float32 arrays indexed flat. For the row sums (`row_sum16`), whose
    16-lane loops numba left partly scalar."""
    f32 = types.float32
    ok = (all(isinstance(a, types.Array) and a.dtype == f32 and a.layout == "C" for a in (dst, src))
          and all(isinstance(a, types.Integer) for a in (di, si)))
    if not ok:
        return None
    sig = types.void(dst, di, src, si)

    def codegen(context, builder, signature, args):
        dp = _vec16_ptr(context, builder, signature, args, 0)
        builder.store(builder.fadd(builder.load(dp, align=4), builder.load(_vec16_ptr(context, builder, signature, args, 2),
                                                                           align=4)), dp, align=4)
        return context.get_dummy_value()

    return sig, codegen


def _lanes_ok(arrays, ints, width) -> bool:
    """The lane intrinsics' typing: C-contiguous float32 arrays, integer indices, width a literal 4, 8 or 16."""
    return (all(isinstance(a, types.Array) and a.dtype == types.float32 and a.layout == "C" for a in arrays)
            and all(isinstance(a, types.Integer) for a in ints)
            and isinstance(width, types.IntegerLiteral) and width.literal_value in (4, 8, 16))


def _vec_ptr(context, builder, aty, aval, idx, lanes):
    """&array[idx] (a flat int64 index value) as a pointer to a `lanes` x float32 vector."""
    from llvmlite import ir
    ary = context.make_array(aty)(context, builder, aval)
    return builder.bitcast(builder.gep(ary.data, [idx]), ir.VectorType(ir.FloatType(), lanes).as_pointer())


@intrinsic
def bt4v(typingctx, dst, d0, d1, d2, d3, src, s0, s1, s2, s3, width):
    """The Winograd F(2x2, 3x3) butterfly B^T on `width` (a literal: 4, 8 or 16) lanes at once: with x_i the
    `width` float32 at src[s_i], dst[d0] = x0 - x2, dst[d1] = x1 + x2, dst[d2] = x2 - x1, dst[d3] = x1 - x3
    (C-contiguous float32 arrays indexed flat; dst is not src). Each lane is the scalar loop's IEEE
    add or subtract: the same bits. Both stages of the training input transform
    (train_winograd._wino_input_planes), whose rows of 7-14 tiles numba left scalar (the vectorizer
    wants 16 iterations on AVX-512)."""
    if not _lanes_ok((dst, src), (d0, d1, d2, d3, s0, s1, s2, s3), width):
        return None
    n = width.literal_value
    sig = types.void(dst, d0, d1, d2, d3, src, s0, s1, s2, s3, width)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        a = signature.args

        def ptr(k, j):
            return _vec_ptr(context, builder, a[k], args[k], context.cast(builder, args[j], a[j], types.int64), n)
        x0, x1, x2, x3 = (builder.load(ptr(5, 6 + i), align=4) for i in range(4))
        for j, v in enumerate((builder.fsub(x0, x2), builder.fadd(x1, x2), builder.fsub(x2, x1),
                               builder.fsub(x1, x3))):
            builder.store(v, ptr(0, 1 + j), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def bt4s(typingctx, dst, d0, d1, d2, d3, src, si, width):
    """`bt4v` with the four inputs interleaved: x_i[l] = src[si + 2 l + i] for l < `width` (a literal: 4, 8,
    16), read as two vectors of 2 * width floats (at si and si + 2) split into even and odd lanes. The
    column stage of the training input transform: tile tx of a row reads columns 2 tx .. 2 tx + 3."""
    if not _lanes_ok((dst, src), (d0, d1, d2, d3, si), width):
        return None
    n = width.literal_value
    sig = types.void(dst, d0, d1, d2, d3, src, si, width)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        a = signature.args
        i32 = ir.IntType(32)

        def ptr(k, idx, lanes):
            return _vec_ptr(context, builder, a[k], args[k], idx, lanes)
        s0 = context.cast(builder, args[6], a[6], types.int64)
        s2 = builder.add(s0, ir.Constant(ir.IntType(64), 2))
        lo = builder.load(ptr(5, s0, 2 * n), align=4)
        hi = builder.load(ptr(5, s2, 2 * n), align=4)
        ev = ir.Constant(ir.VectorType(i32, n), [2 * l for l in range(n)])
        od = ir.Constant(ir.VectorType(i32, n), [2 * l + 1 for l in range(n)])
        x0 = builder.shuffle_vector(lo, lo, ev)
        x1 = builder.shuffle_vector(lo, lo, od)
        x2 = builder.shuffle_vector(hi, hi, ev)
        x3 = builder.shuffle_vector(hi, hi, od)
        for j, v in enumerate((builder.fsub(x0, x2), builder.fadd(x1, x2), builder.fsub(x2, x1),
                               builder.fsub(x1, x3))):
            i = context.cast(builder, args[1 + j], a[1 + j], types.int64)
            builder.store(v, ptr(0, i, n), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def at4s(typingctx, dst0, d0, dst1, d1, src, si, sstride, width):
    """The Winograd F(2x2, 3x3) output transform A^T m A of `width` (a literal: 4, 8 or 16) tiles at once:
    m_k = the `width` float32 at src[si + k * sstride] (k = 0..15, the xi planes); per lane
    s0b = m_b + m_(4+b) + m_(8+b), s1b = m_(4+b) - m_(8+b) - m_(12+b) (b = 0..3), and the tile's two output
    rows interleaved: dst0[d0 + 2 l], dst0[d0 + 2 l + 1] = s00 + s01 + s02, s01 - s02 - s03; dst1[d1 + 2 l],
    dst1[d1 + 2 l + 1] = s10 + s11 + s12, s11 - s12 - s13 (left to right: `train_winograd.wino_output`'s
    scalar order, the same bits). C-contiguous float32 arrays indexed flat."""
    if not _lanes_ok((dst0, dst1, src), (d0, d1, si, sstride), width):
        return None
    n = width.literal_value
    sig = types.void(dst0, d0, dst1, d1, src, si, sstride, width)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        a = signature.args
        i32 = ir.IntType(32)

        def ptr(k, idx, lanes):
            return _vec_ptr(context, builder, a[k], args[k], idx, lanes)
        s0 = context.cast(builder, args[5], a[5], types.int64)
        st = context.cast(builder, args[6], a[6], types.int64)
        m = []
        for k in range(16):
            m.append(builder.load(ptr(4, s0, n), align=4))
            s0 = builder.add(s0, st)
        fa, fs = builder.fadd, builder.fsub
        s_0 = [fa(fa(m[b], m[4 + b]), m[8 + b]) for b in range(4)]
        s_1 = [fs(fs(m[4 + b], m[8 + b]), m[12 + b]) for b in range(4)]
        inter = ir.Constant(ir.VectorType(i32, 2 * n), [(l // 2) + (n if l % 2 else 0) for l in range(2 * n)])
        for k, (sr, di) in enumerate(((s_0, args[1]), (s_1, args[3]))):
            even = fa(fa(sr[0], sr[1]), sr[2])
            odd = fs(fs(sr[1], sr[2]), sr[3])
            v = builder.shuffle_vector(even, odd, inter)
            i = context.cast(builder, di, a[1 + 2 * k], types.int64)
            builder.store(v, ptr(2 * k, i, 2 * n), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def ad4s(typingctx, dst, di, dstride, src, s0, s1, width):
    """The Winograd weight gradient's transform of dy, A g A^T, for `width` (a literal: 4, 8 or 16) 2x2
    tiles at once: a_j[l] = src[s0 + 2 l + j], b_j[l] = src[s1 + 2 l + j] (the tile's two rows, read as
    vectors of 2 * width floats split into even and odd lanes); the 16 values (`train_winograd.wino_dy`'s
    expressions and order: the same bits; negation as numba's, -0.0 - v) stored at dst[di + k * dstride],
    k = 0..15. C-contiguous float32 arrays indexed flat."""
    if not _lanes_ok((dst, src), (di, dstride, s0, s1), width):
        return None
    n = width.literal_value
    sig = types.void(dst, di, dstride, src, s0, s1, width)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        a = signature.args
        i32 = ir.IntType(32)
        vty = ir.VectorType(ir.FloatType(), n)

        def ptr(k, idx, lanes):
            return _vec_ptr(context, builder, a[k], args[k], idx, lanes)
        ev = ir.Constant(ir.VectorType(i32, n), [2 * l for l in range(n)])
        od = ir.Constant(ir.VectorType(i32, n), [2 * l + 1 for l in range(n)])
        rows = []
        for j in (4, 5):
            v = builder.load(ptr(3, context.cast(builder, args[j], a[j], types.int64), 2 * n), align=4)
            rows.append((builder.shuffle_vector(v, v, ev), builder.shuffle_vector(v, v, od)))
        (a0, a1), (b0, b1) = rows
        fa, fs = builder.fadd, builder.fsub
        neg = (lambda v: fs(ir.Constant(vty, [-0.0] * n), v))
        e0, e1, q0, q1 = fa(a0, b0), fa(a1, b1), fs(a0, b0), fs(a1, b1)
        nb0 = neg(b0)
        out = (a0, fa(a0, a1), fs(a0, a1), neg(a1), e0, fa(e0, e1), fs(e0, e1), neg(e1),
               q0, fa(q0, q1), fs(q0, q1), neg(q1), nb0, fs(nb0, b1), fs(b1, b0), b1)
        d = context.cast(builder, args[1], a[1], types.int64)
        st = context.cast(builder, args[2], a[2], types.int64)
        for v in out:
            builder.store(v, ptr(0, d, n), align=4)
            d = builder.add(d, st)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def ev2(typingctx, dst, di, src, si, width):
    """dst[di + l] = src[si + 2 l] for l < `width` (a literal: 4, 8 or 16): 2 * width floats read from
    src[si] (one past the last value used: the caller leaves it readable) and their even lanes stored.
    dst: a float32 array with unit stride (a row of a 2-D array of any row pitch), src C-contiguous;
    both indexed flat. The stride-2 im2col of the training convs (`train_conv._cols_s2`)."""
    if not (isinstance(dst, types.Array) and dst.dtype == types.float32 and dst.ndim == 1
            and _lanes_ok((src,), (di, si), width)):
        return None
    n = width.literal_value
    sig = types.void(dst, di, src, si, width)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        a = signature.args
        i32 = ir.IntType(32)
        s0 = context.cast(builder, args[3], a[3], types.int64)
        v = builder.load(_vec_ptr(context, builder, a[2], args[2], s0, 2 * n), align=4)
        ev = ir.Constant(ir.VectorType(i32, n), [2 * l for l in range(n)])
        d0 = context.cast(builder, args[1], a[1], types.int64)
        builder.store(builder.shuffle_vector(v, v, ev), _vec_ptr(context, builder, a[0], args[0], d0, n), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def copy16(typingctx, dst, di, src, si):
    """dst[di:di + 16] = src[si:si + 16] as one 16-lane vector load and store; C-contiguous float32
    arrays indexed flat. The strided 1x1's gather (k1x1._strided_seq), whose 16-lane copy numba left
    scalar: ~1 value a nanosecond, 96 us for RegNetY's 32-channel 112x112 -> 56x56 gather."""
    f32 = types.float32
    ok = (all(isinstance(a, types.Array) and a.dtype == f32 and a.layout == "C" for a in (dst, src))
          and all(isinstance(a, types.Integer) for a in (di, si)))
    if not ok:
        return None
    sig = types.void(dst, di, src, si)

    def codegen(context, builder, signature, args):
        v = builder.load(_vec16_ptr(context, builder, signature, args, 2), align=4)
        builder.store(v, _vec16_ptr(context, builder, signature, args, 0), align=4)
        return context.get_dummy_value()

    return sig, codegen


def _fold16(builder, vecs):
    """16 vectors of 16 float32 lanes -> one vector whose lane q is the sum of vecs[q]'s lanes, by a
    fixed tree: each level adds the lower and upper halves of every vector's groups, two vectors at a
    time (30 shuffles and 15 adds for the 16 sums instead of 60 and 64 one vector at a time)."""
    from llvmlite import ir
    i32 = ir.IntType(32)
    w = 16                                  # lanes a group (one accumulator's partial sums) holds
    while len(vecs) > 1:
        h, ia, ib = w // 2, [], []
        for src in (0, 1):                  # x's groups, then y's, halved
            for q in range(16 // w):
                base = src * 16 + q * w
                ia += [base + l for l in range(h)]
                ib += [base + h + l for l in range(h)]
        ca, cb = ir.Constant(ir.VectorType(i32, 16), ia), ir.Constant(ir.VectorType(i32, 16), ib)
        vecs = [builder.fadd(builder.shuffle_vector(x, y, ca), builder.shuffle_vector(x, y, cb))
                for x, y in zip(vecs[0::2], vecs[1::2])]
        w = h
    return vecs[0]


@intrinsic
def dot4x4(typingctx, c, ci, ldc, a, ai, lda, b, bi, ldb, k, add):
    """A 4 x 4 block of dot products along contiguous rows: c[ci + r ldc + s] = (c[...] if add else 0) +
    sum over q < k of a[ai + r lda + q] * b[bi + s ldb + q], r, s < 4 (C-contiguous float32 arrays
    indexed flat). 16 accumulators of 16 lanes, one fused multiply-add per lane and step (8 vector loads
    per 16 FMAs: the four a rows stay in L1 while b streams), the last k % 16 terms by masked loads
    (nothing past a row's end is read), folded by `_fold16`: a fixed order, the same bits on every call.
    The training weight gradients' GEMMs (train_winograd.nt_gemm)."""
    if not (all(isinstance(x, types.Array) and x.dtype == types.float32 and x.layout == "C" for x in (c, a, b))
            and all(isinstance(x, types.Integer) for x in (ci, ldc, ai, lda, bi, ldb, k))
            and isinstance(add, (types.Integer, types.Boolean))):
        return None
    sig = types.void(c, ci, ldc, a, ai, lda, b, bi, ldb, k, add)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        sa = signature.args
        i32, i64, v16 = ir.IntType(32), ir.IntType(64), ir.VectorType(ir.FloatType(), 16)
        ci_, ldc_, ai_, lda_, bi_, ldb_, k_, add_ = (context.cast(builder, args[j], sa[j], types.int64)
                                                     for j in (1, 2, 4, 5, 7, 8, 9, 10))
        k16 = builder.and_(k_, ir.Constant(i64, -16))
        fma = builder.module.globals.get("llvm.fma.v16f32") or ir.Function(
            builder.module, ir.FunctionType(v16, [v16, v16, v16]), "llvm.fma.v16f32")
        zero = ir.Constant(v16, None)

        def step(kk, acc, mask=None):
            def row(j, base, ld, r):
                ptr = _vec_ptr(context, builder, sa[j], args[j],
                               builder.add(builder.add(base, builder.mul(ld, ir.Constant(i64, r))), kk), 16)
                if mask is None:
                    return builder.load(ptr, align=4)
                nm = "llvm.masked.load.v16f32.p0"
                ml = builder.module.globals.get(nm) or ir.Function(
                    builder.module, ir.FunctionType(v16, [ptr.type, i32, mask.type, v16]), nm)
                return builder.call(ml, [ptr, ir.Constant(i32, 4), mask, zero])
            xb = [row(6, bi_, ldb_, s) for s in range(4)]
            out = []
            for r in range(4):
                xa = row(3, ai_, lda_, r)
                out += [builder.call(fma, [xa, xb[s], acc[4 * r + s]]) for s in range(4)]
            return out

        entry = builder.block
        loop = builder.append_basic_block("dot.loop")
        check = builder.append_basic_block("dot.check")
        tail = builder.append_basic_block("dot.tail")
        done = builder.append_basic_block("dot.done")
        builder.cbranch(builder.icmp_signed(">", k16, ir.Constant(i64, 0)), loop, check)
        builder.position_at_end(loop)                      # the whole 16-term steps
        kq = builder.phi(i64)
        kq.add_incoming(ir.Constant(i64, 0), entry)
        acc = [builder.phi(v16) for _ in range(16)]
        for p in acc:
            p.add_incoming(zero, entry)
        new = step(kq, acc)
        kn = builder.add(kq, ir.Constant(i64, 16))
        kq.add_incoming(kn, loop)
        for p, v in zip(acc, new):
            p.add_incoming(v, loop)
        builder.cbranch(builder.icmp_signed("<", kn, k16), loop, check)
        builder.position_at_end(check)                     # a last, partial step?
        acc_c = [builder.phi(v16) for _ in range(16)]
        for p, v in zip(acc_c, new):
            p.add_incoming(zero, entry)
            p.add_incoming(v, loop)
        builder.cbranch(builder.icmp_signed("<", k16, k_), tail, done)
        builder.position_at_end(tail)
        left = builder.sub(k_, k16)
        u64 = ir.Constant(ir.VectorType(i64, 16), None)
        splat = builder.shuffle_vector(builder.insert_element(u64, left, ir.Constant(i32, 0)), u64,
                                       ir.Constant(ir.VectorType(i32, 16), [0] * 16))
        mask = builder.icmp_signed("<", ir.Constant(ir.VectorType(i64, 16), list(range(16))), splat)
        new_t = step(k16, acc_c, mask)
        builder.branch(done)
        builder.position_at_end(done)
        fin = [builder.phi(v16) for _ in range(16)]
        for p, a0, a1 in zip(fin, acc_c, new_t):
            p.add_incoming(a0, check)
            p.add_incoming(a1, tail)
        sums = _fold16(builder, fin)
        add = builder.icmp_signed("!=", add_, ir.Constant(i64, 0))
        for r in range(4):
            part = builder.shuffle_vector(sums, sums, ir.Constant(ir.VectorType(i32, 4), list(range(4 * r, 4 * r + 4))))
            at = builder.add(ci_, builder.mul(ldc_, ir.Constant(i64, r)))
            ptr = _vec_ptr(context, builder, sa[0], args[0], at, 4)
            old = builder.load(ptr, align=4)
            builder.store(builder.select(add, builder.fadd(old, part), part), ptr, align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def gemm6(typingctx, c, ci, ldc, a, ai, sar, saq, b, bi, ldb, k, last, nv):
    """A 6-row x (nv vectors of 16) block of c = a @ b: c[ci + r ldc + 16 v + l] = sum over q < k of
    a[ai + r sar + q saq] * b[bi + q ldb + 16 v + l], r < 6, l < 16, for v < nv - 1 and the last vector
    at column `last` instead of 16 (nv - 1) (a block's columns may end past a multiple of 16: its last
    vector then overlaps the one before, or the block before, and stores the same values there). nv a
    literal 1-4; k > 0; C-contiguous float32 arrays indexed flat; a read by scalar broadcasts at any
    strides (a or its transpose), b's rows as vectors: no packing. 6 x nv accumulators of 16 lanes, the
    terms in order q = 0, 1, ... by fused multiply-adds (each element's sum in the order of a
    row-by-column loop, whatever block computes it). The training forward and input-gradient GEMMs
    (train_winograd.nn_gemm)."""
    arrays_ok = all(isinstance(x, types.Array) and x.dtype == types.float32 and x.layout == "C" for x in (c, a, b))
    if not (arrays_ok and all(isinstance(x, types.Integer) for x in (ci, ldc, ai, sar, saq, bi, ldb, k, last))
            and isinstance(nv, types.IntegerLiteral) and 1 <= nv.literal_value <= 4):
        return None
    sig = types.void(c, ci, ldc, a, ai, sar, saq, b, bi, ldb, k, last, nv)
    nvec = nv.literal_value

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        sa = signature.args
        i32, i64, v16 = ir.IntType(32), ir.IntType(64), ir.VectorType(ir.FloatType(), 16)
        ci_, ldc_, ai_, sar_, saq_, bi_, ldb_, k_, last_ = (context.cast(builder, args[j], sa[j], types.int64)
                                                           for j in (1, 2, 4, 5, 6, 8, 9, 10, 11))
        fma = builder.module.globals.get("llvm.fma.v16f32") or ir.Function(
            builder.module, ir.FunctionType(v16, [v16, v16, v16]), "llvm.fma.v16f32")
        zero = ir.Constant(v16, None)
        splat0 = ir.Constant(ir.VectorType(i32, 16), [0] * 16)
        adata = context.make_array(sa[3])(context, builder, args[3]).data
        cols = [ir.Constant(i64, 16 * v) for v in range(nvec - 1)] + [last_]
        entry = builder.block
        loop, done = builder.append_basic_block("gemm6.loop"), builder.append_basic_block("gemm6.done")
        builder.branch(loop)
        builder.position_at_end(loop)
        q = builder.phi(i64)
        q.add_incoming(ir.Constant(i64, 0), entry)
        acc = [builder.phi(v16) for _ in range(6 * nvec)]
        for p in acc:
            p.add_incoming(zero, entry)
        brow = builder.add(bi_, builder.mul(q, ldb_))
        bv = [builder.load(_vec_ptr(context, builder, sa[7], args[7], builder.add(brow, col), 16), align=4)
              for col in cols]
        aq = builder.add(ai_, builder.mul(q, saq_))
        new = []
        for r in range(6):
            x = builder.load(builder.gep(adata, [builder.add(aq, builder.mul(sar_, ir.Constant(i64, r)))]), align=4)
            xs = builder.shuffle_vector(builder.insert_element(zero, x, ir.Constant(i32, 0)), zero, splat0)
            new += [builder.call(fma, [xs, bv[v], acc[r * nvec + v]]) for v in range(nvec)]
        qn = builder.add(q, ir.Constant(i64, 1))
        q.add_incoming(qn, loop)
        for p, v in zip(acc, new):
            p.add_incoming(v, loop)
        builder.cbranch(builder.icmp_signed("<", qn, k_), loop, done)
        builder.position_at_end(done)
        for r in range(6):
            row = builder.add(ci_, builder.mul(ldc_, ir.Constant(i64, r)))
            for v in range(nvec):
                ptr = _vec_ptr(context, builder, sa[0], args[0], builder.add(row, cols[v]), 16)
                builder.store(new[r * nvec + v], ptr, align=4)
        return context.get_dummy_value()

    return sig, codegen


@njit(inline="always", cache=True)
def row_sum16(f, base, w, dst, d):
    """dst[d:d+16] = the sum of the w 16-float vectors at f[base + 16p] (one NCHW16c row of one channel
    block), in a fixed order: positions p = 4i + k into four partial sums a_k, then (a0 + a1) + (a2 + a3)
    (four add chains in flight). The one order the squeeze-excitation means use, whether the depthwise
    conv before them summed its rows in its epilogue or the squeeze-excitation reads them (kernels/squeeze.py):
    the same bits either way. f, dst: flat float32; base, d: offsets."""
    a = nb_carray(stack_f32(64), 64)           # a_k = a[16k:16k+16]
    for l in range(64):
        a[l] = 0.0
    w4 = w // 4 * 4
    for p in range(0, w4, 4):
        q = base + 16 * p
        add16(a, 0, f, q)
        add16(a, 16, f, q + 16)
        add16(a, 32, f, q + 32)
        add16(a, 48, f, q + 48)
    for p in range(w4, w):
        add16(a, 0, f, base + 16 * p)
    add16(a, 0, a, 16)                          # a0 + a1
    add16(a, 32, a, 48)                         # a2 + a3
    add16(a, 0, a, 32)                          # (a0 + a1) + (a2 + a3)
    mul16(dst, d, a, 0, np.float32(1.0), 0)     # a copy (x * 1 is x, -0 and NaN included)
