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
