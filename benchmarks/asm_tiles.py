"""The AVX2 assembly register tile against the numba tile it replaces, kernel by kernel, one core.

    PYTHONPATH=. .venv/bin/python benchmarks/asm_tiles.py [--rounds 9] [--reps 5]

On x86-64 AVX2 hosts (`tiles.ASM_AVX2`) the 1x1, direct and Winograd-GEMM kernels run the 6 x 16
tile of `_nb.tile16` (docs/kernels.md, "The assembly tile"); elsewhere they run the numba 5 x 1
tile (`_k1x1_narrow`, `_direct_rows_narrow`, `_wino_gemm_narrow`). Both are compiled here and
called on the same arguments (a whole layer as one task, aligned operands), alternated round by
round; each side's best round is kept (this VM's timings drift by up to 1.5x within minutes, so only
same-run pairs count). Prints GFLOP/s of both, the time ratio asm / numba (< 1: the assembly tile is
faster) and whether the outputs are bitwise equal. Layer shapes: ResNet50 1x1 and 3x3 layers at
batch 1, RegNet / MobileNet / EfficientNet 1x1 layers, Winograd F(4x4) / F(2x2) GEMMs.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    from numba import njit

    from tilefuse.kernels import isa
    from tilefuse.kernels.conv import conv2d_prepare, direct, k1x1, nchwc_shape, to_nchwc, winograd
    from tilefuse.kernels.conv.epilogue import EMPTY1, EMPTY4
    from tilefuse.kernels.conv.tiles import ASM_AVX2
    from tilefuse.kernels.threads import aligned
    if not ASM_AVX2:
        print(f"this host does not run the assembly tile (tiles.ASM_AVX2 is False: {isa.describe()})")
        return
    print(f"# asm tile vs numba tile, one core: {isa.describe()}; best of {args.rounds} alternated rounds "
          f"x {args.reps} calls")
    rng = np.random.default_rng(0)

    def ab(name, fa, fb, mk, flops):
        best, outs = {"numba": 1e9, "asm": 1e9}, {}
        for _ in range(args.rounds):
            for k, f in (("numba", fa), ("asm", fb)):
                out, a = mk()
                f(out, *a)
                t = time.perf_counter()
                for _ in range(args.reps):
                    f(out, *a)
                best[k] = min(best[k], (time.perf_counter() - t) / args.reps)
                outs[k] = out.copy()
        print(f"| {name} | {flops / best['numba'] / 1e9:.1f} | {flops / best['asm'] / 1e9:.1f} | "
              f"{best['asm'] / best['numba']:.3f} | {np.array_equal(outs['numba'], outs['asm'])} |", flush=True)

    def loop(tile):
        @njit
        def run(of, xf, wp, bias, q1, op, hw, w, cb, ob, kc):
            tile(of, xf, wp, bias, EMPTY1, False, 1, np.float32(0), np.float32(0), 0, q1, 0, op, hw, w, hw, w, cb, ob,
                 1, 1, True, 1, True, kc)
        return run

    print("\n| 1x1 layer (Ci -> Co @ map) | numba 5x1 GFLOP/s | asm 6x1 GFLOP/s | asm / numba time | same bits |")
    print("|---|---|---|---|---|")
    k_numba, k_asm = loop(k1x1._k1x1_narrow), loop(k1x1._k1x1_avx2)
    for ci, co, hw in [(64, 256, 56), (256, 64, 56), (1024, 256, 14), (2048, 512, 7), (104, 104, 28), (208, 208, 14),
                       (440, 440, 7), (32, 48, 112), (24, 144, 56), (960, 160, 7)]:
        x = aligned(to_nchwc(rng.standard_normal((1, ci, hw, hw)).astype(np.float32)))
        pr = conv2d_prepare("gemm1x1", rng.standard_normal((co, ci, 1, 1)).astype(np.float32),
                            rng.standard_normal(co).astype(np.float32), 1, 0, 1, 1, layout="nchwc")
        wp, bias = aligned(pr["weight"]), aligned(pr["bias"])
        kc = k1x1.reduction_length(wp)

        def mk(x=x, wp=wp, bias=bias, ci=ci, co=co, hw=hw, kc=kc):
            ob = aligned(np.zeros(nchwc_shape((1, co, hw, hw)), np.float32))
            return ob.reshape(-1), (x.reshape(-1), wp, bias, hw * hw, wp.shape[0], hw * hw, hw, -(-ci // 16),
                                    -(-co // 16), kc)
        ab(f"{ci} -> {co} @ {hw}x{hw}", k_numba, k_asm, mk, 2 * ci * co * hw * hw)

    print("\n| Winograd GEMM (alpha^2, tiles, Ci -> Co) | numba 5x1 GFLOP/s | asm 6x1 GFLOP/s | asm / numba time | "
          "same bits |")
    print("|---|---|---|---|---|")
    for a2, p, cip, cob in [(36, 196, 64, 64), (36, 49, 128, 128), (36, 16, 256, 256), (36, 4, 512, 512),
                            (16, 196, 128, 128)]:
        V = aligned(rng.standard_normal((a2, p, cip)).astype(np.float32))
        U = aligned(rng.standard_normal((a2, cob // 32, cip, 32)).astype(np.float32))

        def mk(V=V, U=U, a2=a2, p=p, cob=cob):
            return aligned(np.zeros((a2, p, cob), np.float32)), (V, U, p, 0, cob // 32, cob // 16)
        ab(f"{a2}, {p}, {cip} -> {cob}", winograd._wino_gemm_narrow, winograd._wino_gemm_avx2, mk,
           2 * a2 * p * cip * cob)

    print("\n| direct 3x3 (Ci -> Co @ map, stride) | numba 5x1 GFLOP/s | asm 6x1 GFLOP/s | asm / numba time | "
          "same bits |")
    print("|---|---|---|---|---|")
    for ci, co, hw, s in [(64, 64, 56, 1), (128, 128, 28, 1), (256, 256, 14, 1), (512, 512, 7, 1), (128, 128, 56, 2)]:
        pr = direct.prepare(rng.standard_normal((co, ci, 3, 3)).astype(np.float32) * 0.1,
                            rng.standard_normal(co).astype(np.float32))
        xp = np.pad(rng.standard_normal((1, ci, hw, hw)).astype(np.float32), ((0, 0), (0, 0), (1, 1), (1, 1)))
        hp = hw + 2
        # (1, Ci, Hp, Wp) -> (1, Cb, 16, Hp, Wp) -> (1, Cb, Hp, Wp, 16) -> (1, Cb, Hp*Wp, 16)
        xb = aligned(np.ascontiguousarray(xp.reshape(1, ci // 16, 16, hp, hp).transpose(0, 1, 3, 4, 2))
                     .reshape(1, ci // 16, hp * hp, 16))
        ho = (hp - 3) // s + 1
        wb, bias = aligned(pr["weight"]), aligned(pr["bias"])

        def mk(xb=xb, wb=wb, bias=bias, ho=ho, hp=hp, s=s, co=co):
            return (aligned(np.zeros((1, co // 16, ho * ho, 16), np.float32)),
                    (0, 0, xb, 0, 0, wb, 0, ho, ho, hp, s, s, 1, 1, bias, EMPTY4, False, 1, np.float32(0),
                     np.float32(0), 0, co // 16))
        ab(f"{ci} -> {co} @ {hw}x{hw}, s{s}", direct._direct_rows_narrow, direct._direct_rows_avx2, mk,
           2 * ci * co * 9 * ho * ho)


if __name__ == "__main__":
    main()
