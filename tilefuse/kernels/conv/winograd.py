"""Winograd minimal filtering F(m x m, 3 x 3) for stride-1, dilation-1, ungrouped 3x3 convs.

    Y = A^T [ (G g G^T) (.) (B^T d B) ] A            (Lavin & Gray, "Fast Algorithms for
                                                      Convolutional Neural Networks", CVPR 2016,
                                                      arXiv:1509.09308, section 4; seed 003)

d is an alpha x alpha input tile (alpha = m + 2), tiles overlap by 2; g the 3x3 filter.
The matrices below are the paper's, written out: F(2,3) from its eqs. (7)-(8) (interpolation
points 0, 1, -1, inf) and F(4,3) from its section 4.2 (points 0, 1, -1, 2, -2, inf; the same
matrices as Lavin's Cook-Toom generator `wincnn`). `check_transform(m)` verifies the 1-D
identity A^T [(G g) (.) (B^T d)] = correlate(d, g) exactly in float64; the tests call it.

Pipeline per task (P tiles x a group of output-channel pairs, from planner.plan_winograd for the
thread count; the layer's tasks run in one numba parallel loop):
  1. input transform (numba, 16 channels per vector) of the task's tiles, read from the unpadded
     NCHWc input (border tiles gather a zero-padded patch): V (alpha^2, P, Ci)
  2. element-wise stage as alpha^2 GEMMs in numba (`_wino_gemm`, the k1x1 micro-kernel):
     M (alpha^2, P, cob) = V (alpha^2, P, Ci) @ U (alpha^2, Ci, cob), summed over Ci in order
  3. output transform (numba, 16 output channels per vector) + bias, residual, activation, stored
     straight into the NCHWc (or NCHW) output.
U = G g G^T is computed and packed once by `prepare` (compile time; it goes into the data package).
Every output element's arithmetic is the same whatever the task grid or thread count (no BLAS,
whose result may depend on the GEMM's size), so the results are bitwise identical across them.
F(4,3) does 36 multiplies per 16 outputs (4x fewer than direct) but its transforms have larger
coefficients, so its fp32 error is larger (docs/kernels.md has the measured table).
"""
from __future__ import annotations

import functools

import numba as nb
import numpy as np
from numba import njit

from tilefuse.kernels.conv._nb import LANES, address, new_counter, stack_f32, stack_i64, store16, take, tile16_rows
from tilefuse.kernels.conv._tiles_gen import _wino_gemm_narrow, _wino_gemm_wide  # (tilegen.WINO_GEMM)
from tilefuse.kernels.conv.tiles import ASM_AVX2, NARROW
from tilefuse.kernels.conv.epilogue import EMPTY1, EMPTY4, bias_or_zeros, resolve_act
from tilefuse.kernels.conv.layout import to_nchwc
from tilefuse.kernels.conv.planner import plan_winograd
from tilefuse.kernels.threads import numba_max_threads, numba_region, region_threads, resolve_threads, scratch

# F(2, 3): Lavin & Gray eq. (7)/(8)
BT2 = np.array([[1, 0, -1, 0],
                [0, 1, 1, 0],
                [0, -1, 1, 0],
                [0, 1, 0, -1]], np.float64)
G2 = np.array([[1, 0, 0],
               [1 / 2, 1 / 2, 1 / 2],
               [1 / 2, -1 / 2, 1 / 2],
               [0, 0, 1]], np.float64)
AT2 = np.array([[1, 1, 1, 0],
                [0, 1, -1, -1]], np.float64)

# F(4, 3): Lavin & Gray section 4.2
BT4 = np.array([[4, 0, -5, 0, 1, 0],
                [0, -4, -4, 1, 1, 0],
                [0, 4, -4, -1, 1, 0],
                [0, -2, -1, 2, 1, 0],
                [0, 2, -1, -2, 1, 0],
                [0, 4, 0, -5, 0, 1]], np.float64)
G4 = np.array([[1 / 4, 0, 0],
               [-1 / 6, -1 / 6, -1 / 6],
               [-1 / 6, 1 / 6, -1 / 6],
               [1 / 24, 1 / 12, 1 / 6],
               [1 / 24, -1 / 12, 1 / 6],
               [0, 0, 1]], np.float64)
AT4 = np.array([[1, 1, 1, 1, 1, 0],
                [0, 1, -1, 2, -2, 0],
                [0, 1, 1, 4, 4, 0],
                [0, 1, -1, 8, -8, 1]], np.float64)

MATRICES = {2: (BT2, G2, AT2), 4: (BT4, G4, AT4)}
EMPTY5 = np.zeros((0, 0, 0, 0, 0), np.float32)


def check_transform(m: int, trials: int = 10, seed: int = 0) -> float:
    """Max abs error of the 1-D identity A^T[(G g) * (B^T d)] == correlate(d, g), float64."""
    bt, g_, at = MATRICES[m]
    rng = np.random.default_rng(seed)
    worst = 0.0
    for _ in range(trials):
        d, g = rng.standard_normal(m + 2), rng.standard_normal(3)
        y = at @ ((g_ @ g) * (bt @ d))
        ref = np.array([d[i:i + 3] @ g for i in range(m)])
        worst = max(worst, float(np.abs(y - ref).max()))
    return worst


def transform_weights(w: np.ndarray, m: int) -> np.ndarray:
    """(Co, Ci, 3, 3) -> U (alpha^2, Cip, Cop), U[a*alpha+b, ci, co] = (G w[co, ci] G^T)[a, b],
    channels zero padded to multiples of 16. Computed in float64, stored float32."""
    co, ci, kh, kw = w.shape
    if (kh, kw) != (3, 3):
        raise ValueError(f"winograd F({m}x{m},3x3) needs a 3x3 kernel, got weight shape {w.shape}")
    _, g, _ = MATRICES[m]
    alpha = m + 2
    u = np.einsum("ai,ocij,bj->aboc", g, w.astype(np.float64), g)  # (alpha, alpha, Co, Ci)
    cip, cop = -(-ci // LANES) * LANES, -(-co // LANES) * LANES
    U = np.zeros((alpha * alpha, cip, cop), np.float32)
    # (alpha, alpha, Co, Ci) -> (alpha^2, Ci, Co)
    U[:, :ci, :co] = u.reshape(alpha * alpha, co, ci).transpose(0, 2, 1)
    return U


def pack_weights(U: np.ndarray) -> np.ndarray:
    """U (alpha^2, Cip, Cop) -> (alpha^2, OP, Cip, 32): output channels in pairs of 16-blocks, the
    last pair zero padded (the GEMM micro-kernel loads one 32-float row per input channel)."""
    a2, cip, cop = U.shape
    op = -(-cop // 32)
    up = np.zeros((a2, cip, op * 32), np.float32)
    up[:, :, :cop] = U
    # (a2, Cip, OP*32) -> (a2, Cip, OP, 32) -> (a2, OP, Cip, 32)
    return np.ascontiguousarray(up.reshape(a2, cip, op, 32).transpose(0, 2, 1, 3))


def prepare(w, b, m: int) -> dict:
    """{"weight": U packed (alpha^2, OP, Cip, 32), "bias": (Cop,) zero padded}."""
    co = w.shape[0]
    bias = np.zeros(-(-co // LANES) * LANES, np.float32)
    bias[:co] = bias_or_zeros(b, co)
    return {"weight": pack_weights(transform_weights(np.asarray(w, np.float32), m)), "bias": bias}


# Transform code generation ------------------------------------------------------------------
# The numba transforms are straight-line code generated from the matrices above (zeros dropped,
# +-1 folded), one loop over 16 channel lanes per row/column, so LLVM keeps everything in
# vector registers; loops over a runtime coefficient table were 3x slower. The output is the
# committed module _winograd_gen.py; tests check that it matches `generate_transform_source()`.
# Regenerate: python -m tilefuse.kernels.conv.winograd
# fastmath=False, stated (numba would otherwise inherit a caller's flags): with fastmath (reassociation, FMA
# contraction) LLVM chose the F(4x4) transforms' operation order per compile context: inlined into
# `_wino_front` and optimized there, the cached machine code computed other last bits than the same kernel
# compiled in the running process (ResNet50's output differed between a process that compiled its kernels
# and one that loaded them; tests/test_jit_determinism.py). Written out, each transform is the same IEEE
# operations in the order of the generated expression wherever it runs.

def _term(c, v):
    c = float(c)
    if c == 1: return f"+ {v}"
    if c == -1: return f"- {v}"
    s = "-" if c < 0 else "+"
    return f"{s} np.float32({abs(c)!r}) * {v}"

def _expr(row, names, init=None):
    parts = [_term(c, names[i]) for i, c in enumerate(row) if c != 0]
    if init: parts = [f"+ {init}"] + parts
    e = " ".join(parts)
    return e[2:] if e.startswith("+ ") else "-" + e[2:]

def _gen_one(m, BT, AT):
    alpha = m + 2
    A2 = alpha * alpha
    L = []
    w = L.append
    dn = [f"d{i}" for i in range(alpha)]
    en = [f"e{j}" for j in range(alpha)]
    # the input transform reads the unpadded NCHWc input (no padded copy of the layer): interior
    # tiles read it in place, border tiles gather their patch (zeros outside) first
    w("@njit(nogil=True, cache=True, fastmath=False)")
    w(f"def _wino_input_{m}_c(V, x, p0, P, th, tw, pt, pl):")
    w(f'    """V[a*{alpha}+b, pi, cb*16+l] = (B^T d B)[a, b] for tile p0+pi of unpadded x (N, Cb, H, W, 16), padding pt (top) / pl (left) of zeros (F({m}x{m},3x3), generated)."""')
    w(f"    Cb, H, W = x.shape[1], x.shape[2], x.shape[3]")
    w(f"    t = nb.carray(stack_f32({A2 * 16}), ({alpha}, {alpha}, 16))")
    w(f"    d = nb.carray(stack_f32({A2 * 16}), ({alpha}, {alpha}, 16))")
    w(f"    per_img = th * tw")
    w(f"    for pi in range(P):")
    w(f"        p = p0 + pi")
    w(f"        n = p // per_img")
    w(f"        r = p % per_img")
    w(f"        y0 = (r // tw) * {m} - pt")
    w(f"        x0 = (r % tw) * {m} - pl")
    w(f"        inside = y0 >= 0 and x0 >= 0 and y0 + {alpha} <= H and x0 + {alpha} <= W")
    w(f"        for cb in range(Cb):")
    w(f"            if inside:")
    w(f"                for j in range({alpha}):  # t = B^T d")
    w(f"                    for l in range(16):")
    for i in range(alpha):
        w(f"                        d{i} = x[n, cb, y0 + {i}, x0 + j, l]")
    for a in range(alpha):
        w(f"                        t[{a}, j, l] = {_expr(BT[a], dn)}")
    w(f"            else:")
    w(f"                for i in range({alpha}):")
    w(f"                    for j in range({alpha}):")
    w(f"                        yy = y0 + i")
    w(f"                        xx = x0 + j")
    w(f"                        if 0 <= yy < H and 0 <= xx < W:")
    w(f"                            for l in range(16):")
    w(f"                                d[i, j, l] = x[n, cb, yy, xx, l]")
    w(f"                        else:")
    w(f"                            for l in range(16):")
    w(f"                                d[i, j, l] = 0.0")
    w(f"                for j in range({alpha}):  # t = B^T d")
    w(f"                    for l in range(16):")
    for i in range(alpha):
        w(f"                        d{i} = d[{i}, j, l]")
    for a in range(alpha):
        w(f"                        t[{a}, j, l] = {_expr(BT[a], dn)}")
    w(f"            for a in range({alpha}):  # V = t B")
    w(f"                for l in range(16):")
    for j in range(alpha):
        w(f"                    e{j} = t[a, {j}, l]")
    for b in range(alpha):
        w(f"                    V[a * {alpha} + {b}, pi, cb * 16 + l] = {_expr(BT[b], en)}")
    w("")
    w("")
    w("@njit(nogil=True, cache=True, fastmath=False)")
    w(f"def _wino_output_{m}(out, M, p0, P, th, tw, bias, res, has_res, code, alpha, beta, ob0):")
    w(f'    """NCHW output: out[n, c, y0+i, x0+j] = act((A^T M A)[i, j] + bias (+ res)), valid positions; M and bias hold channel blocks ob0.. (generated)."""')
    w(f"    Co, Ho, Wo = out.shape[1], out.shape[2], out.shape[3]")
    w(f"    Ob = M.shape[2] // 16")
    w(f"    mm = nb.carray(stack_f32({A2 * 16}), ({A2}, 16))")
    w(f"    s = nb.carray(stack_f32({alpha * m * 16}), ({alpha}, {m}, 16))")
    w(f"    y = nb.carray(stack_f32({m * m * 16}), (16, {m}, {m}))")
    w(f"    per_img = th * tw")
    w(f"    for pi in range(P):")
    w(f"        p = p0 + pi")
    w(f"        n = p // per_img")
    w(f"        r = p % per_img")
    w(f"        y0 = (r // tw) * {m}")
    w(f"        x0 = (r % tw) * {m}")
    w(f"        mh = min({m}, Ho - y0)")
    w(f"        mw = min({m}, Wo - x0)")
    w(f"        for ob in range(Ob):")
    w(f"            for k in range({A2}):")
    w(f"                for l in range(16):")
    w(f"                    mm[k, l] = M[k, pi, ob * 16 + l]")
    w(f"            for a in range({alpha}):  # s = M A")
    w(f"                for l in range(16):")
    for b in range(alpha):
        w(f"                    e{b} = mm[a * {alpha} + {b}, l]")
    for j in range(m):
        w(f"                    s[a, {j}, l] = {_expr(AT[j], en)}")
    w(f"            for j in range({m}):  # y = A^T s + bias")
    w(f"                for l in range(16):")
    w(f"                    bl = bias[ob * 16 + l]")
    for a in range(alpha):
        w(f"                    e{a} = s[{a}, j, l]")
    for i in range(m):
        w(f"                    y[l, {i}, j] = {_expr(AT[i], en, init='bl')}")
    w(f"            nl = min(16, Co - (ob0 + ob) * 16)")
    w(f"            for l in range(nl):")
    w(f"                co = (ob0 + ob) * 16 + l")
    w(f"                for i in range(mh):")
    w(f"                    orow = out[n, co, y0 + i]")
    w(f"                    for j in range(mw):")
    w(f"                        v = y[l, i, j]")
    w(f"                        if has_res:")
    w(f"                            v += res[n, co, y0 + i, x0 + j]")
    w(f"                        orow[x0 + j] = apply_scalar(code, v, alpha, beta)")
    w("")
    w("")
    w("@njit(nogil=True, cache=True, fastmath=False)")
    w(f"def _wino_output_{m}_c(out, M, p0, P, th, tw, bias, res, has_res, code, alpha, beta, ob0):")
    w(f'    """NCHWc output: out[n, ob0+ob, y0+i, x0+j, :] = act((A^T M A)[i, j] + bias (+ res)); M and bias hold channel blocks ob0.. (generated)."""')
    w(f"    Obo, Ho, Wo = out.shape[1], out.shape[2], out.shape[3]")
    w(f"    Ob = M.shape[2] // 16")
    w(f"    of, rf = out.reshape(out.size), res.reshape(res.size)  # flat (N, Ob, Ho, Wo, 16), the same or empty")
    w(f"    mm = nb.carray(stack_f32({A2 * 16}), ({A2}, 16))")
    w(f"    s = nb.carray(stack_f32({alpha * m * 16}), ({alpha}, {m}, 16))")
    w(f"    y = nb.carray(stack_f32({m * m * 16}), ({m * m}, 16))  # y[i*{m} + j, l]")
    w(f"    per_img = th * tw")
    w(f"    for pi in range(P):")
    w(f"        p = p0 + pi")
    w(f"        n = p // per_img")
    w(f"        r = p % per_img")
    w(f"        y0 = (r // tw) * {m}")
    w(f"        x0 = (r % tw) * {m}")
    w(f"        mh = min({m}, Ho - y0)")
    w(f"        mw = min({m}, Wo - x0)")
    w(f"        for ob in range(Ob):")
    w(f"            for k in range({A2}):")
    w(f"                for l in range(16):")
    w(f"                    mm[k, l] = M[k, pi, ob * 16 + l]")
    w(f"            for a in range({alpha}):  # s = M A")
    w(f"                for l in range(16):")
    for b in range(alpha):
        w(f"                    e{b} = mm[a * {alpha} + {b}, l]")
    for j in range(m):
        w(f"                    s[a, {j}, l] = {_expr(AT[j], en)}")
    w(f"            for j in range({m}):  # y = A^T s + bias")
    w(f"                for l in range(16):")
    w(f"                    bl = bias[ob * 16 + l]")
    for a in range(alpha):
        w(f"                    e{a} = s[{a}, j, l]")
    for i in range(m):
        w(f"                    y[{i * m} + j, l] = {_expr(AT[i], en, init='bl')}")
    w(f"            for i in range(mh):")
    w(f"                store_block(of, rf, has_res, y, i * {m}, RB_OFFSETS, (((n * Obo + ob0 + ob) * Ho + y0 + i) * Wo + x0) * 16,")
    w(f"                            mw, 1, 0, code, alpha, beta)")
    return "\n".join(L) + "\n"


GEN_HEADER = ('"""GENERATED by tilefuse.kernels.conv.winograd.generate_transform_source(); do not edit.\n\n'
              'Winograd input/output transforms F(2x2,3x3) and F(4x4,3x3), Lavin & Gray (arXiv:1509.09308)."""\n'
              'import numba as nb\nimport numpy as np\nfrom numba import njit\n\n'
              'from tilefuse.kernels.activations import apply_scalar\n'
              'from tilefuse.kernels.conv._nb import stack_f32\n'
              'from tilefuse.kernels.conv.epilogue import RB_OFFSETS, store_block\n\n\n')


def generate_transform_source() -> str:
    parts = [_gen_one(m, MATRICES[m][0], MATRICES[m][2]) for m in (2, 4)]
    return GEN_HEADER + "\n\n".join(parts)


# Element-wise stage: alpha^2 GEMMs in numba -----------------------------------------------------
# M[a] (P, cob) = V[a] (P, Cip) @ U[a] (Cip, cob), register-blocked like k1x1.py: 7 tiles x 2
# output-channel blocks = 14 zmm accumulators held over the whole Cip reduction; per input channel
# one 128-byte row of the packed U feeds 14 FMAs with 7 broadcasts. Every output element is the
# sum over c = 0 .. Cip-1 in order, whatever the task's tile range or channel pairs, so the grid
# and the thread count never change the bits (OpenBLAS's result could depend on the GEMM's size).

@njit(nogil=True, cache=True)
def _wino_gemm_avx2(M, V, U, P, pa0, pa1, nob):
    """`_wino_gemm_narrow` with the assembly tile `_nb.tile16` (x86-64 AVX2 hosts, tiles.ASM_AVX2): 6
    tiles x 1 output block, a partial last one only its tiles; the same loops, sums and bits (no bias:
    the tile adds none when prm[12] = 0). V's channels are contiguous per tile (chunks of 16 at
    64-byte steps), U[a, pair, c, 16 * (kb % 2) + l] rows 128 bytes apart."""
    na2, _, Cip = V.shape
    npair = U.shape[1]
    cob = M.shape[2]
    vf = V.reshape(V.size)
    mf = M.reshape(M.size)
    uf = U.reshape(U.size)
    acc = nb.carray(stack_f32(96), (6, 16))
    af = acc.reshape(96)
    pp = stack_i64(13)   # the tile's parameter block (_nb.tile16)
    prm = nb.carray(pp, 13)
    nch = (Cip + 15) // 16
    table = np.empty(nch, np.int64)
    for j in range(nch):
        table[j] = j * 64
    prm[7] = nch
    prm[8] = Cip - 16 * (nch - 1)
    prm[9] = address(table, 0)
    prm[10] = 128
    prm[11] = address(af, 0)
    prm[12] = 0
    for r in range(1, 6):
        prm[1 + r] = r * Cip * 4
    for a in range(na2):
        for ib in range(0, P, 6):
            nv = min(6, P - ib)
            prm[0] = address(vf, (a * P + ib) * Cip)
            for kb in range(nob):
                pair = pa0 + kb // 2
                prm[1] = address(uf, (a * npair + pair) * Cip * 32 + (kb % 2) * 16)
                tile16_rows(pp, nv)
                for r in range(nv):
                    store16(mf, (a * P + ib + r) * cob + kb * 16, af, r * 16, EMPTY1, 0, False, 0, np.float32(0.0),
                            np.float32(0.0))


@njit(nogil=True, cache=True)
def _wino_gemm(M, V, U, P, pa0, pa1, nob):
    """The alpha^2 GEMMs with the register tile of the host's vector width (tiles.NARROW, tiles.ASM_AVX2)."""
    if ASM_AVX2:
        _wino_gemm_avx2(M, V, U, P, pa0, pa1, nob)
    elif NARROW:
        _wino_gemm_narrow(M, V, U, P, pa0, pa1, nob)
    else:
        _wino_gemm_wide(M, V, U, P, pa0, pa1, nob)


@njit(nogil=True, cache=True)
def _wino_front(x, U, bias, vbuf, mbuf, p0, P, pa0, pa1, th, tw, pt, pl, m):
    """A task's input transform (its tiles, all input channels) into vbuf and its alpha^2 GEMMs
    into mbuf: returns M (alpha^2, P, cob), the task's bias slice and its first output block."""
    a2, _, Cip, _ = U.shape
    nob = min(2 * pa1, bias.shape[0] // 16) - 2 * pa0
    V = vbuf[:a2 * P * Cip].reshape(a2, P, Cip)
    M = mbuf[:a2 * P * nob * 16].reshape(a2, P, nob * 16)
    if m == 2:
        _gen._wino_input_2_c(V, x, p0, P, th, tw, pt, pl)
    else:
        _gen._wino_input_4_c(V, x, p0, P, th, tw, pt, pl)
    _wino_gemm(M, V, U, P, pa0, pa1, nob)
    return M, bias[32 * pa0:32 * pa0 + nob * 16], 2 * pa0


@njit(nogil=True, cache=True)
def _wino_task_c(out, x, U, bias, res, has_res, code, alpha, beta, vbuf, mbuf, p0, P, pa0, pa1, th, tw, pt, pl, m):
    """One task (tiles [p0, p0+P) x output-channel pairs [pa0, pa1)), NCHWc out (N, Ob, Ho, Wo, 16)."""
    M, b, ob0 = _wino_front(x, U, bias, vbuf, mbuf, p0, P, pa0, pa1, th, tw, pt, pl, m)
    if m == 2:
        _gen._wino_output_2_c(out, M, p0, P, th, tw, b, res, has_res, code, alpha, beta, ob0)
    else:
        _gen._wino_output_4_c(out, M, p0, P, th, tw, b, res, has_res, code, alpha, beta, ob0)


@njit(nogil=True, cache=True)
def _wino_task_nchw(out, x, U, bias, res, has_res, code, alpha, beta, vbuf, mbuf, p0, P, pa0, pa1, th, tw, pt, pl,
                    m):
    """The same task, NCHW out (N, Co, Ho, Wo) (and NCHW residual)."""
    M, b, ob0 = _wino_front(x, U, bias, vbuf, mbuf, p0, P, pa0, pa1, th, tw, pt, pl, m)
    if m == 2:
        _gen._wino_output_2(out, M, p0, P, th, tw, b, res, has_res, code, alpha, beta, ob0)
    else:
        _gen._wino_output_4(out, M, p0, P, th, tw, b, res, has_res, code, alpha, beta, ob0)


@njit(parallel=True, nogil=True, cache=True)
def _wino_par_c(nt, tasks, out, x, U, bias, res, has_res, code, alpha, beta, vbuf, mbuf, th, tw, pt, pl, m):
    """Every task (rows (p0, P, pa0, pa1)) on numba's pool; vbuf / mbuf (threads, size) scratch."""
    counter = new_counter(nt)
    for _w in nb.prange(nt):
        _wino_seq_c(counter, nb.get_thread_id(), tasks, out, x, U, bias, res, has_res, code, alpha, beta, vbuf, mbuf,
                    th, tw, pt, pl, m)


@njit(nogil=True, cache=True)
def _wino_seq_c(counter, tid, tasks, out, x, U, bias, res, has_res, code, alpha, beta, vbuf, mbuf, th, tw, pt, pl, m):
    """One worker of the task loop on the calling thread: tasks taken from `counter` (threads.numba_region)."""
    while True:
        i = take(counter, tid, tasks.shape[0])
        if i < 0:
            break
        _wino_task_c(out, x, U, bias, res, has_res, code, alpha, beta, vbuf[tid], mbuf[tid], tasks[i, 0], tasks[i, 1],
                     tasks[i, 2], tasks[i, 3], th, tw, pt, pl, m)


@njit(parallel=True, nogil=True, cache=True)
def _wino_par_nchw(nt, tasks, out, x, U, bias, res, has_res, code, alpha, beta, vbuf, mbuf, th, tw, pt, pl, m):
    """Every task of the layer on nt of numba's threads."""
    counter = new_counter(nt)
    for _w in nb.prange(nt):
        _wino_seq_nchw(counter, nb.get_thread_id(), tasks, out, x, U, bias, res, has_res, code, alpha, beta, vbuf, mbuf,
                       th, tw, pt, pl, m)


@njit(nogil=True, cache=True)
def _wino_seq_nchw(counter, tid, tasks, out, x, U, bias, res, has_res, code, alpha, beta, vbuf, mbuf, th, tw, pt, pl,
                   m):
    """One worker of the task loop on the calling thread: tasks taken from `counter` (threads.numba_region)."""
    while True:
        i = take(counter, tid, tasks.shape[0])
        if i < 0:
            break
        _wino_task_nchw(out, x, U, bias, res, has_res, code, alpha, beta, vbuf[tid], mbuf[tid], tasks[i, 0],
                        tasks[i, 1], tasks[i, 2], tasks[i, 3], th, tw, pt, pl, m)


@functools.lru_cache(maxsize=1024)
def task_table(total_tiles: int, op: int, tiles: int, pairs: int) -> np.ndarray:
    """(T, 4) int64 rows (p0, P, pa0, pa1): tile chunks outer, channel-pair groups inner."""
    t = np.array([(p0, min(tiles, total_tiles - p0), c0, min(c0 + pairs, op)) for p0 in range(0, total_tiles, tiles)
                  for c0 in range(0, op, pairs)], np.int64).reshape(-1, 4)
    t.flags.writeable = False
    return t


def _execute(out, x_b, prepared, res, has_res, act, m, padding, threads, plan, nchw, ho, wo):
    code, al, be = act
    U, bias = prepared["weight"], prepared["bias"]
    a2, op, cip, _ = U.shape
    alpha = m + 2
    if a2 != alpha * alpha:
        raise ValueError(f"winograd F({m}x{m},3x3) expects U with {alpha * alpha} planes, got {U.shape}")
    if x_b.shape[1] * LANES != cip:
        raise ValueError(f"winograd F({m}x{m},3x3): weight has {cip} input channels, input {x_b.shape[1] * LANES}")
    n = x_b.shape[0]
    th, tw = -(-ho // m), -(-wo // m)
    total = n * th * tw
    threads = resolve_threads(threads)
    p = plan or plan_winograd(alpha, cip, bias.shape[0], total, threads)
    tasks = task_table(total, op, p["tiles"], p["pairs"])
    rows = numba_max_threads() if region_threads(threads, len(tasks)) > 1 else 1
    vbuf = scratch("wino_V", (rows, a2 * p["tiles"] * cip))
    mbuf = scratch("wino_M", (rows, a2 * p["tiles"] * p["pairs"] * 32))
    par, seq = (_wino_par_nchw, _wino_seq_nchw) if nchw else (_wino_par_c, _wino_seq_c)
    numba_region(par, seq, threads, len(tasks), tasks, out, x_b, U, bias, res, has_res, code, al, be, vbuf, mbuf, th,
                 tw, padding[0], padding[2], m)


def run(out, x, prepared, residual=None, *, m: int, padding=(0, 0, 0, 0), relu=False, act=None, threads=None,
        plan=None) -> None:
    """NCHW in, NCHW out: the input is blocked once (NCHWc, unpadded), the output transform writes
    NCHW with the residual and the activation."""
    act = resolve_act(relu, act, f"winograd{m}")
    _, _, ho, wo = out.shape
    has_res = residual is not None
    _execute(out, to_nchwc(x, threads=threads), prepared, residual if has_res else EMPTY4, has_res, act, m, padding,
             threads, plan, True, ho, wo)


def run_nchwc(out_b, x_b, prepared, residual_b=None, *, m: int, padding=(0, 0, 0, 0), relu=False, act=None,
              threads=None, plan=None) -> None:
    """NCHWc in (unpadded), NCHWc out: x_b (N, Cb, H, W, 16) -> out_b (N, Ob, Ho, Wo, 16).

    A task (a chunk of tiles x a group of output-channel pairs, planner.plan_winograd for the
    thread count) transforms its tiles' input (border tiles gather a zero-padded patch, so there is
    no padded copy of the layer), runs the alpha^2 GEMMs and the output transform, which stores
    whole 16-channel vectors with the epilogue. The layer's tasks run in one numba parallel loop."""
    act = resolve_act(relu, act, f"winograd{m}")
    _, _, ho, wo, _ = out_b.shape
    has_res = residual_b is not None
    _execute(out_b, x_b, prepared, residual_b if has_res else EMPTY5, has_res, act, m, padding, threads, plan, False,
             ho, wo)


from tilefuse.kernels.conv import _winograd_gen as _gen  # noqa: E402  (generated from the matrices above)

if __name__ == "__main__":
    import pathlib
    path = pathlib.Path(__file__).with_name("_winograd_gen.py")
    path.write_text(generate_transform_source())
    print(f"wrote {path}")
