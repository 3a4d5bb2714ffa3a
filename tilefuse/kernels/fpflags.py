"""The floating-point flags of the numba kernels.

`FAST` is LLVM's fast-math set without the two flags that assume finite values: reassociation (sums that
vectorize), FMA contraction, no signed zeros, reciprocals and approximate functions, but neither `nnan` nor
`ninf`. With those two (numba's `fastmath=True`) LLVM may drop a NaN anywhere it likes, and it did: the tanh
activation returned -1 for a NaN input, the channel norm raised ZeroDivisionError on a
NaN or infinite input (numba's division-by-zero check compared a NaN divisor with 0 under `nnan`), and a
ConvNeXt fed one NaN pixel returned finite logits. A NaN in the input gives a NaN in every output the
reference computes as NaN (`tests/test_nonfinite.py`); `tests/test_structure.py` keeps `fastmath=True` out of
the package. Kernels with their own reasons state narrower sets (`activations.SPAN_FASTMATH`,
`depthwise.FASTMATH`, `cnhw.JITR`, the Winograd transforms' `fastmath=False`).

numba takes a `set` (not a frozenset) and keeps the object it is given; nothing mutates it.
"""
FAST = {"reassoc", "contract", "nsz", "arcp", "afn"}
