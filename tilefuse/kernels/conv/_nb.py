"""Numba helpers shared by the conv kernels: stack scratch arrays for register blocking.

`stack_f32(n)` returns a pointer to `n` float32 on the stack of the calling jitted function
(an `alloca` in its entry block). Wrapped with `numba.carray`, LLVM sees a private, non-aliased
buffer and keeps small accumulators (16 lanes = one AVX-512 register) in registers. Heap arrays
(`np.zeros` inside a jitted function) are not promoted and run ~20x slower in the inner loops.
"""
from __future__ import annotations

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

LANES = 16  # output-channel block: one AVX-512 register of float32


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


def _prefetch_impl(typingctx, arr, idx, rw):
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
        builder.call(fn, [ptr, ir.Constant(i32, rw), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def prefetch(typingctx, arr, idx):
    """Software prefetch (prefetcht0) of the cache line holding arr[idx] (1-D contiguous array);
    a hint only: never faults, so idx may run past the end."""
    return _prefetch_impl(typingctx, arr, idx, 0)


@intrinsic
def prefetchw(typingctx, arr, idx):
    """prefetch with intent to write (prefetchw): the line arrives in exclusive state."""
    return _prefetch_impl(typingctx, arr, idx, 1)


@intrinsic
def atomic_add(typingctx, arr, idx, val):
    """old = arr[idx]; arr[idx] += val, atomically (LLVM atomicrmw add, monotonic) on a 1-D
    contiguous int64 array: the shared task counter of a parallel loop (threads.py)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64 and isinstance(idx, types.Integer)
            and isinstance(val, types.Integer)):
        return None
    sig = types.int64(arr, idx, val)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.gep(ary.data, [args[1]])
        v = context.cast(builder, args[2], signature.args[2], types.int64)
        return builder.atomic_rmw("add", ptr, v, "monotonic")

    return sig, codegen
