"""The squeeze-excitation scale in one kernel (issue 9): mean, two tiny FCs, activations.

    s[n] = gate(w2 @ act(w1 @ mean_hw(x[n]) + b1) + b2)        x (N, C, H, W) -> s (N, C, 1, 1)

w1 (R, C, 1, 1), w2 (C, R, 1, 1): the 1x1 convs of MobileNetV3 / EfficientNet / RegNetY's SE
block on a (N, C, 1, 1) tensor. Unfused, that is five instructions (global average pool, conv,
conv, and at batch 1 layout conversions around the convs), each a few thousand FLOPs after
the mean: the dispatch costs more than the work. Here: the means (kernels/pool.py
`channel_means`, x read once, threads over (image, channel blocks), NCHW16c or NCHW), then per
image both FCs as dot products over contiguous weight rows and the activations
(kernels/activations.py `apply_scalar`), in numba. The scale stays NCHW: the next 1x1 conv
takes it as its input scale (kernels/se_conv.py).

Tolerance against the reference (kernels/reference.py `squeeze_excitation`: numpy mean, then
ref.conv2d): float32 sums in another order, within 1e-5 relative. Every value of image n is
computed by one task in a fixed order whatever the task split: any thread count gives bitwise
identical results.
"""
from __future__ import annotations

import numba as nb
import numpy as np
from numba import njit

from . import activations as A
from . import reference as ref
from .conv._nb import atomic_add
from .pool import means_into
from .threads import numba_region, scratch


@njit(nogil=True, cache=True, fastmath=True)
def _fc_gate(s, m, w1, b1, w2, b2, i0, i1, c1, a1, e1, c2, a2, e2):
    """s[i] = gate(w2 @ act(w1 @ m[i] + b1) + b2) for images [i0, i1); w1 (R, C), w2 (C, R)."""
    R, C = w1.shape
    h = np.empty(R, np.float32)
    for i in range(i0, i1):
        for r in range(R):
            acc = np.float32(0.0)
            for c in range(C):
                acc += w1[r, c] * m[i, c]
            h[r] = A.apply_scalar(c1, acc + b1[r], a1, e1)
        si = s[i]
        for c in range(C):
            acc = np.float32(0.0)
            for r in range(R):
                acc += w2[c, r] * h[r]
            si[c] = acc + b2[c]
        # the gate over the row as one vectorized loop (per value inside the loop above it was a
        # scalar exp per channel: ~15 us of an EfficientNet 7x7 SE block's ~50)
        A.apply_span(si, 0, C, c2, a2, e2)


IMAGES_PER_TASK = 4   # the FC part per task (fixed: the result never depends on the split)


@njit(nogil=True, cache=True)
def _fc_seq(counter, tid, s, m, w1, b1, w2, b2, c1, a1, e1, c2, a2, e2):
    """One worker of the FC part (threads.numba_region): groups of IMAGES_PER_TASK images taken from
    counter."""
    n = s.shape[0]
    while True:
        i0 = atomic_add(counter, 0, 1) * IMAGES_PER_TASK
        if i0 >= n:
            break
        _fc_gate(s, m, w1, b1, w2, b2, i0, min(i0 + IMAGES_PER_TASK, n), c1, a1, e1, c2, a2, e2)


@njit(parallel=True, nogil=True, cache=True)
def _fc_par(nt, s, m, w1, b1, w2, b2, c1, a1, e1, c2, a2, e2):
    counter = np.zeros(1, np.int64)
    for _w in nb.prange(nt):
        _fc_seq(counter, nb.get_thread_id(), s, m, w1, b1, w2, b2, c1, a1, e1, c2, a2, e2)


def squeeze_excitation(out, x, w1, b1, w2, b2, *, act, gate, layout="nchw", threads=None, **_):
    """out (N, C, 1, 1) NCHW = the SE scale of x (NCHW, or NCHW16c with layout="nchwc")."""
    n, c = out.shape[0], out.shape[1]
    if out.dtype != np.float32 or not x.flags.c_contiguous:
        if layout == "nchwc":
            raise ValueError(f"squeeze_excitation (NCHW16c): float32 contiguous input expected, got {x.dtype}")
        out[...] = ref.squeeze_excitation(x, w1, b1, w2, b2, tuple(act), tuple(gate))
        return
    r = w1.shape[0]
    m = scratch("se_means", (n, c))
    means_into(m, x, layout, threads)
    c1, a1, e1 = A.encode(*act)
    c2, a2, e2 = A.encode(*gate)
    a1, e1, a2, e2 = (np.float32(v) for v in (a1, e1, a2, e2))
    w1m, w2m = w1.reshape(r, c), w2.reshape(c, r)          # (R, C, 1, 1) -> (R, C), (C, R, 1, 1) -> (C, R)
    s = out.reshape(n, c)                                    # (N, C, 1, 1) -> (N, C)
    # both steps are numba_region task loops: a bound call can be replayed (threads.replaying)
    numba_region(_fc_par, _fc_seq, threads, -(-n // IMAGES_PER_TASK), s, m, w1m, b1, w2m, b2, c1, a1, e1, c2, a2, e2)


KERNELS = {"squeeze_excitation": squeeze_excitation}
THREADED = frozenset({"squeeze_excitation"})
BLOCKED = frozenset({"squeeze_excitation"})
BLOCKED_TO_NCHW = frozenset({"squeeze_excitation"})
ACT_KERNELS = frozenset({"squeeze_excitation"})    # applies its `act` (and `gate`) itself
