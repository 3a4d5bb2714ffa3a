"""Which register tiles the blocked conv kernels compile: `NARROW`, a compile-time constant.

Hosts compiled for 512-bit vectors (AVX-512, `isa.info()["vector_bits"]`) run the wide tiles: 7
positions x 2 blocks of 16 output channels (k1x1, direct, Winograd's GEMMs; the stem 8 x 2), 14-16
zmm accumulators of the 32 registers. On hosts compiled for 256-bit vectors (AVX2; Intel Xeons LLVM
marks prefer-256-bit when `TILEFUSE_VECTOR_BITS=256` keeps LLVM's choice) a 16-lane block is two
ymm registers and only 16 of them exist, so those tiles would need 28-32 and spill; there the
kernels run narrow tiles, 5 positions x 1 block = 10 ymm accumulators (`_k1x1_narrow`,
`_direct_rows_narrow`, `_stem_rows_narrow`, `_wino_gemm_narrow`, `_convt_rows_narrow`, all generated
with their wide forms from one template per kernel by tilegen.py), and depthwise /
grouped_lanes run their 16 lanes as two 8-lane halves. Every output element is the same reduction
in the same order in both forms, so the bits do not depend on the host (tests/test_register_tiles.py).

`ASM_AVX2`: on x86-64 hosts of that kind with AVX2 and FMA, the 1x1 kernel runs a 6 positions x
1 block tile written in assembly (`_nb.tile16` / `_nb.strip16`, `k1x1._k1x1_avx2`): 12 ymm accumulators,
which numba's code for the same tile spilled; the stem runs the same registers as a strip over an output
row's tiles (`_nb.sstrip16`, `stem._stem_rows_avx2`). The same bits again. `TILEFUSE_ASM_TILES=0` turns
them off (the numba 5 x 1 tile then runs).

`ASM_512`: on x86-64 hosts compiled for 512-bit vectors, the 1x1 (`_nb.strip512`, `k1x1._k1x1_strips`;
strided ones after a gather), the direct conv and the grouped conv through it (`_nb.dstrip512`,
`direct._direct_rows_512`; stride 1 or 2 along W) and the stem (`stem._stem_rows_512`) run AVX-512
strips: tiles of 14 positions x 2 blocks (28 zmm accumulators) in assembly, where the numba 7 x 2
tiles reached 45-72% of the measured peak (Ice Lake, 2026-11-27). The same bits as the numba tiles;
`TILEFUSE_ASM_TILES=0` turns them off too.

Read when the kernel modules are imported, after `tilefuse/__init__` has set the vector width
(`isa.configure()`); numba freezes the value into the compiled kernels (its cache is per CPU).
"""
from __future__ import annotations

from tilefuse.kernels import isa
from tilefuse.kernels.conv._nb import x86_avx2, x86_avx512

NARROW = isa.info()["vector_bits"] < 512


X86_AVX2 = x86_avx2()   # the assembly tile can be compiled here (it is emitted only then)


def _asm_avx2() -> bool:
    import os
    return NARROW and X86_AVX2 and os.environ.get("TILEFUSE_ASM_TILES", "").strip() != "0"


ASM_AVX2 = _asm_avx2()


X86_512 = x86_avx512()   # the AVX-512 strip can be compiled here


def _asm_512() -> bool:
    import os
    return (not NARROW) and X86_512 and os.environ.get("TILEFUSE_ASM_TILES", "").strip() != "0"


ASM_512 = _asm_512()
