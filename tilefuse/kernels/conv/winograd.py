"""Winograd minimal filtering F(m x m, 3 x 3) for stride-1, dilation-1, ungrouped 3x3 convs.

    Y = A^T [ (G g G^T) (.) (B^T d B) ] A            (Lavin & Gray, "Fast Algorithms for
                                                      Convolutional Neural Networks", CVPR 2016,
                                                      arXiv:1509.09308, section 4; seed 003)

d is an alpha x alpha input tile (alpha = m + 2), tiles overlap by 2; g the 3x3 filter.
The matrices below are the paper's, written out: F(2,3) from its eqs. (7)-(8) (interpolation
points 0, 1, -1, inf) and F(4,3) from its section 4.2 (points 0, 1, -1, 2, -2, inf; the same
matrices as Lavin's Cook-Toom generator `wincnn`). `check_transform(m)` verifies the 1-D
identity A^T [(G g) (.) (B^T d)] = correlate(d, g) exactly in float64; the tests call it.

Pipeline per task (a chunk of P tiles, P from the planner so V and M stay in L2):
  1. input transform (numba, 16 channels per vector): xb NCHWc -> V (alpha^2, P, Ci)
  2. element-wise stage as alpha^2 GEMMs, one batched np.matmul:
     M (alpha^2, P, Co) = V (alpha^2, P, Ci) @ U (alpha^2, Ci, Co)
  3. output transform (numba, 16 output channels per vector) + bias, residual, activation, stored
     straight into the NCHW output.
U = G g G^T is computed once by `prepare` (compile time; it goes into the data package).
F(4,3) does 36 multiplies per 16 outputs (4x fewer than direct) but its transforms have larger
coefficients, so its fp32 error is larger (docs/kernels.md has the measured table).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from tilefuse.kernels.conv._nb import LANES
from tilefuse.kernels.conv.epilogue import bias_or_zeros, resolve_act
from tilefuse.kernels.conv.layout import to_nchwc
from tilefuse.kernels.conv.planner import plan_winograd
from tilefuse.kernels.threads import blas_threads, parallel_for, scratch

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


def prepare(w, b, m: int) -> dict:
    co = w.shape[0]
    bias = np.zeros(-(-co // LANES) * LANES, np.float32)
    bias[:co] = bias_or_zeros(b, co)
    return {"weight": transform_weights(np.asarray(w, np.float32), m), "bias": bias}


# Transform code generation ------------------------------------------------------------------
# The numba transforms are straight-line code generated from the matrices above (zeros dropped,
# +-1 folded), one loop over 16 channel lanes per row/column, so LLVM keeps everything in
# vector registers; loops over a runtime coefficient table were 3x slower. The output is the
# committed module _winograd_gen.py; tests check that it matches `generate_transform_source()`.
# Regenerate: python -m tilefuse.kernels.conv.winograd

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
    w(f"@njit(nogil=True, cache=True, fastmath=True)")
    w(f"def _wino_input_{m}(V, xb, p0, P, th, tw):")
    w(f'    """V[a*{alpha}+b, pi, cb*16+l] = (B^T d B)[a, b] for tile p0+pi (F({m}x{m},3x3), generated)."""')
    w(f"    Cb = xb.shape[1]")
    w(f"    t = nb.carray(stack_f32({A2 * 16}), ({alpha}, {alpha}, 16))")
    w(f"    per_img = th * tw")
    w(f"    for pi in range(P):")
    w(f"        p = p0 + pi")
    w(f"        n = p // per_img")
    w(f"        r = p % per_img")
    w(f"        y0 = (r // tw) * {m}")
    w(f"        x0 = (r % tw) * {m}")
    w(f"        for cb in range(Cb):")
    w(f"            for j in range({alpha}):  # t = B^T d")
    w(f"                for l in range(16):")
    for i in range(alpha):
        w(f"                    d{i} = xb[n, cb, y0 + {i}, x0 + j, l]")
    dn = [f"d{i}" for i in range(alpha)]
    for a in range(alpha):
        w(f"                    t[{a}, j, l] = {_expr(BT[a], dn)}")
    w(f"            for a in range({alpha}):  # V = t B")
    w(f"                for l in range(16):")
    for j in range(alpha):
        w(f"                    e{j} = t[a, {j}, l]")
    en = [f"e{j}" for j in range(alpha)]
    for b in range(alpha):
        w(f"                    V[a * {alpha} + {b}, pi, cb * 16 + l] = {_expr(BT[b], en)}")
    w("")
    w("")
    # the same transform reading the unpadded NCHWc input (no separate pad pass over the layer):
    # interior tiles read it in place, border tiles gather their patch (zeros outside) first;
    # the arithmetic is the same, so the result is bitwise that of _wino_input_m on a padded copy
    w(f"@njit(nogil=True, cache=True, fastmath=True)")
    w(f"def _wino_input_{m}_c(V, x, p0, P, th, tw, pt, pl):")
    w(f'    """_wino_input_{m} from unpadded x (N, Cb, H, W, 16), padding pt (top) / pl (left) of zeros (generated)."""')
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
    w(f"@njit(nogil=True, cache=True, fastmath=True)")
    w(f"def _wino_output_{m}(out, M, p0, P, th, tw, bias, res, has_res, code, alpha, beta):")
    w(f'    """out[n, c, y0+i, x0+j] = act((A^T M A)[i, j] + bias[c] (+ res)), valid positions (generated)."""')
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
    w(f"            nl = min(16, Co - ob * 16)")
    w(f"            for l in range(nl):")
    w(f"                co = ob * 16 + l")
    w(f"                for i in range(mh):")
    w(f"                    orow = out[n, co, y0 + i]")
    w(f"                    for j in range(mw):")
    w(f"                        v = y[l, i, j]")
    w(f"                        if has_res:")
    w(f"                            v += res[n, co, y0 + i, x0 + j]")
    w(f"                        orow[x0 + j] = apply_scalar(code, v, alpha, beta)")
    w("")
    w("")
    w(f"@njit(nogil=True, cache=True, fastmath=True)")
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


def run(out, x, prepared, residual=None, *, m: int, padding=(0, 0, 0, 0), relu=False, act=None, threads=None,
        plan=None) -> None:
    code, al, be = resolve_act(relu, act, f"winograd{m}")
    U, bias = prepared["weight"], prepared["bias"]
    n, ci, h, w = x.shape
    a2, cip, cop = U.shape
    alpha = m + 2
    if a2 != alpha * alpha:
        raise ValueError(f"winograd F({m}x{m},3x3) expects U with {alpha * alpha} planes, got {U.shape}")
    _, co, ho, wo = out.shape
    th, tw = -(-ho // m), -(-wo // m)
    t, b, l, r = padding
    # pad so that every alpha x alpha tile reads inside the array: Hp = th*m + 2, Wp = tw*m + 2
    eb, er = th * m + 2 - (h + t + b), tw * m + 2 - (w + l + r)
    xb = to_nchwc(x, (t, b + eb, l, r + er), threads=threads)
    f_in, f_out = _TRANSFORMS[m][:2]
    p_tot = n * th * tw
    pc = (plan or plan_winograd(alpha, cip, cop, p_tot))["tiles"]
    has_res = residual is not None
    res = residual if has_res else np.zeros((0, 0, 0, 0), np.float32)
    tasks = [(p0, min(pc, p_tot - p0)) for p0 in range(0, p_tot, pc)]

    def task(tk):
        p0, P = tk
        V = scratch("wino_V", a2 * P * cip).reshape(a2, P, cip)
        M = scratch("wino_M", a2 * P * cop).reshape(a2, P, cop)
        f_in(V, xb, p0, P, th, tw)
        np.matmul(V, U, out=M)  # (a2, P, Ci) @ (a2, Ci, Co) -> (a2, P, Co)
        f_out(out, M, p0, P, th, tw, bias, res, has_res, code, al, be)

    with blas_threads(1):
        parallel_for(task, tasks, threads)


def run_nchwc(out_b, x_b, prepared, residual_b=None, *, m: int, padding=(0, 0, 0, 0), relu=False, act=None,
              threads=None, plan=None) -> None:
    """NCHWc in (unpadded), NCHWc out: x_b (N, Cb, H, W, 16) -> out_b (N, Ob, Ho, Wo, 16).

    The input is copied once into a zero-bordered NCHWc buffer (whole 64-byte vectors, no
    transpose), the output transform stores whole 16-channel vectors with the epilogue."""
    code, al, be = resolve_act(relu, act, f"winograd{m}")
    U, bias = prepared["weight"], prepared["bias"]
    n, cb, h, w, _ = x_b.shape
    a2, cip, cop = U.shape
    alpha = m + 2
    if a2 != alpha * alpha:
        raise ValueError(f"winograd F({m}x{m},3x3) expects U with {alpha * alpha} planes, got {U.shape}")
    _, ob, ho, wo, _ = out_b.shape
    th, tw = -(-ho // m), -(-wo // m)
    t, _, l, _ = padding
    f_out = _TRANSFORMS[m][2]
    if FUSED_PAD:
        f_in0 = _TRANSFORMS[m][3]
        f_in = lambda V, xsrc, p0, P, th, tw: f_in0(V, xsrc, p0, P, th, tw, t, l)  # noqa: E731
        xp = x_b
    else:
        hp, wp = th * m + 2, tw * m + 2  # every alpha x alpha tile reads inside the padded buffer
        xp = _pad_buffer((n, cb, hp, wp, LANES))
        nq = n * cb
        qc = _pad_chunk(nq, hp * wp)
        parallel_for(lambda q0: _pad_nchwc_planes(xp, x_b, q0, min(nq, q0 + qc), t, l), range(0, nq, qc), threads)
        f_in = _TRANSFORMS[m][0]
    p_tot = n * th * tw
    pc = (plan or plan_winograd(alpha, cip, cop, p_tot))["tiles"]
    has_res = residual_b is not None
    res = residual_b if has_res else np.zeros((0, 0, 0, 0, 0), np.float32)
    tasks = [(p0, min(pc, p_tot - p0)) for p0 in range(0, p_tot, pc)]

    # few tile blocks (small batch / feature map): split the output channels too, so that both
    # cores work; each (tiles, channels) task transforms its input tiles itself
    cob = _co_block(len(tasks), cop) if CO_SPLIT else cop
    tasks = [(p0, P, c0) for p0, P in tasks for c0 in range(0, cop, cob)]

    def task(tk):
        p0, P, c0 = tk
        V = scratch("wino_V", a2 * P * cip).reshape(a2, P, cip)
        M = scratch("wino_M", a2 * P * cob).reshape(a2, P, cob)
        f_in(V, xp, p0, P, th, tw)
        np.matmul(V, U if cob == cop else U[:, :, c0:c0 + cob], out=M)  # (a2, P, Ci) @ (a2, Ci, Co) -> (a2, P, Co)
        f_out(out_b, M, p0, P, th, tw, bias[c0:c0 + cob], res, has_res, code, al, be, c0 // LANES)

    with blas_threads(1):
        parallel_for(task, tasks, threads)


def _co_block(tile_tasks: int, cop: int) -> int:
    """Output channels per task: with a single tile block (batch 1 at 28x28 and below), halved
    (while the half is >= 64 and a multiple of 16) until there are >= 4 tasks; else all of them
    (measured at batch 32, 14x14 and 7x7 with 2 tile blocks: splitting channels too was 10-20%
    slower). From the shape only, so 1 vs 2 threads stay bitwise identical."""
    cob = cop
    if tile_tasks > 1:
        return cob
    while tile_tasks * (cop // cob) < 4 and cob % 32 == 0 and cob // 2 >= 64:
        cob //= 2
    return cob


# run_nchwc reads the unpadded input in the input transform (True) instead of first copying the
# whole layer into a zero-bordered buffer (False: the previous path, kept for A/B measurements)
FUSED_PAD = True
# run_nchwc splits output channels across tasks when there are few tile blocks (False: never)
CO_SPLIT = True


def _pad_buffer(shape):
    # the calling thread's scratch; the pad tasks write disjoint (n, cb) planes of it
    return scratch("wino_pad", int(np.prod(shape))).reshape(shape)


@njit(nogil=True, cache=True)
def _pad_nchwc(xp, x, n, cb, pt, pl):
    """xp[n, cb] (Hp, Wp, 16) = x[n, cb] (H, W, 16) placed at (pt, pl), zeros elsewhere."""
    H, W = x.shape[2], x.shape[3]
    Hp, Wp = xp.shape[2], xp.shape[3]
    for hh in range(Hp):
        h = hh - pt
        for ww in range(Wp):
            wv = ww - pl
            if 0 <= h < H and 0 <= wv < W:
                for q in range(16):
                    xp[n, cb, hh, ww, q] = x[n, cb, h, wv, q]
            else:
                for q in range(16):
                    xp[n, cb, hh, ww, q] = 0.0


def _pad_chunk(planes: int, plane_px: int) -> int:
    """(n, cb) planes per pad task: ~256 KB of output each (one Python task per 14x14 plane cost
    more than its copy and serialised on the GIL at 2 threads), at least 1."""
    return max(1, min(planes, (1 << 18) // (plane_px * LANES * 4)))


@njit(nogil=True, cache=True)
def _pad_nchwc_planes(xp, x, q0, q1, pt, pl):
    """_pad_nchwc for the flattened (n, cb) planes q0 <= q < q1."""
    Cb = x.shape[1]
    for q in range(q0, q1):
        _pad_nchwc(xp, x, q // Cb, q % Cb, pt, pl)


def _load_transforms():
    from tilefuse.kernels.conv import _winograd_gen as g
    # getattr: regenerating the module imports this one before the new functions exist
    return {m: tuple(getattr(g, nm, None) for nm in (f"_wino_input_{m}", f"_wino_output_{m}", f"_wino_output_{m}_c",
                                                      f"_wino_input_{m}_c"))
            for m in (2, 4)}


_TRANSFORMS = _load_transforms()

if __name__ == "__main__":
    import pathlib
    path = pathlib.Path(__file__).with_name("_winograd_gen.py")
    path.write_text(generate_transform_source())
    print(f"wrote {path}")
