"""Winograd F(2x2, 3x3) for training: the forward pass, the input gradient and the weight
gradient of a 3x3, stride-1, pad-1 ("same"), one-group convolution on CNHW tensors, with the
fused pre- and post-processing of `train_conv.py` (ResNet's 3x3 convs); F(4x4, 3x3) on planes
whose larger side is 5-8 (section "F(4x4, 3x3)": the same tasks and GEMMs on 36 planes).

Each 2x2 output tile p of an image reads a 4x4 input patch d (rows 2ty-1 .. 2ty+2, columns
2tx-1 .. 2tx+2, zero outside the image). With the F(2x2, 3x3) matrices

    B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]
    G   = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]]
    A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]

and V = B^T d B, U = G g G^T (16 values each, xi = 4a + b):

    forward          M[xi] (O, P) = U[xi] (O, C) @ V[xi] (C, P),  y tile = A^T M A
    input gradient   the same with dy as input and Ud[xi = (a, b)] (C, O) = U[(s(a), s(b))]^T,
                     s = (3, 1, 2, 0) (the 180-degree rotated, transposed filters; U read
                     transposed by the GEMM)
    weight gradient  F(3x3, 2x2) (its matrices are A' = G, G' = A, B' = B): Dy = A dy A^T for a
                     2x2 tile of dy, Mw[xi]^T (O, C) = sum over tiles of Dy[xi] (O, P) @ V[xi]^T,
                     dW = G^T Mw G

so every conv is 16 GEMMs with 16 multiplies per 2x2 outputs instead of 36 (2.25x fewer FLOPs).
The GEMMs, 16 per numba call, are on AVX-512 hosts this module's register-blocked kernels where they
fit (section GEMMs): `nn_gemm` for the forward's and the input gradient's (6 x 64 blocks, V's rows
read in place), `nt_gemm` for the weight gradient's (4 x 4 blocks of dot products along the patches,
which both D and V store contiguously); elsewhere OpenBLAS's cblas_sgemm called from inside numba
(`blas.nb_gemm`). In the ResNet18 step (batch 32, 112x112, 2 threads) they ran at 131-137 GFLOP/s a
core (forward), 110-136 (input gradient), 115-127 (weight gradient) against OpenBLAS's 101-115,
102-115 and 79-96. The transforms run on rows of tiles through the vector intrinsics of
`conv/_nb.py` (`bt4v`, `bt4s`, `at4s`, `ad4s`). The (16, rows, patches) buffers get one spare row
and a padded row pitch (`pitch`) so that the 16 xi planes a transform loop reads or writes at once
do not start 4 KB apart (they would all fall into the same L1 sets: the dy transform of a 64-channel
layer ran 6x slower). Tasks, partials and their fixed-order sums follow `train_conv.Plan`, so
results are bitwise identical for every thread count. Transforms sum in float32 in a fixed order;
against direct convolution the results differ by float32 rounding (the tests compare them with
PyTorch).
"""
from __future__ import annotations

import numba as nb
import numpy as np

from .blas import nb_gemm
from .cnhw import JIT, transform_rows
from .conv._nb import ad4s, at4s, bt4s, bt4v, dot4x4, gemm6, x86_avx512

# ============================================================================ transforms

def pitch(rows: int, patches: int) -> int:
    """Row pitch (floats) >= patches, a multiple of 16, such that the xi planes of a
    (16, rows + 1, pitch) float32 buffer are not a multiple of 4 KB apart (+- 256 bytes).

    A plane is (rows + 1) * pitch * 4 bytes, 64 * (rows + 1) * (pitch / 16): when rows + 1 is a multiple
    of 64 every pitch gives a multiple of 4 KB, so the search stops after one cycle of pitches (64 steps
    of 16) and keeps the smallest pitch (the planes then alias in the cache; the results are the same)."""
    ld0 = -(-max(patches, 1) // 16) * 16
    for ld in range(ld0, ld0 + 64 * 16, 16):
        if ((rows + 1) * ld * 4 + 256) % 4096 >= 512:
            return ld
    return ld0



@nb.njit(**JIT)
def _filter_transform(g, out, n):
    """out[4a+b, i] = (G g_i G^T)[a, b] for i < n, g: (9, n) = the 3x3 filters as rows of taps
    (vectorized over i: all loads and stores contiguous)."""
    h = g.dtype.type(0.5)
    for i in range(n):
        g00, g01, g02 = g[0, i], g[1, i], g[2, i]
        g10, g11, g12 = g[3, i], g[4, i], g[5, i]
        g20, g21, g22 = g[6, i], g[7, i], g[8, i]
        # G g: four rows of three
        q10, q11, q12 = h * (g00 + g10 + g20), h * (g01 + g11 + g21), h * (g02 + g12 + g22)
        q20, q21, q22 = h * (g00 - g10 + g20), h * (g01 - g11 + g21), h * (g02 - g12 + g22)
        # (G g) G^T: each row (r0, r1, r2) -> (r0, (r0 + r1 + r2)/2, (r0 - r1 + r2)/2, r2)
        out[0, i] = g00
        out[1, i] = h * (g00 + g01 + g02)
        out[2, i] = h * (g00 - g01 + g02)
        out[3, i] = g02
        out[4, i] = q10
        out[5, i] = h * (q10 + q11 + q12)
        out[6, i] = h * (q10 - q11 + q12)
        out[7, i] = q12
        out[8, i] = q20
        out[9, i] = h * (q20 + q21 + q22)
        out[10, i] = h * (q20 - q21 + q22)
        out[11, i] = q22
        out[12, i] = g20
        out[13, i] = h * (g20 + g21 + g22)
        out[14, i] = h * (g20 - g21 + g22)
        out[15, i] = g22


# Ud's xi -> U's xi: (a, b) -> (s(a), s(b)), s = (3, 1, 2, 0) (the 180-degree rotation)
_MIRROR = np.array([15, 13, 14, 12, 7, 5, 6, 4, 11, 9, 10, 8, 3, 1, 2, 0], np.int64)


@nb.njit(inline="always", **JIT)
def _filter_block(gf, tf):
    """tf[16 k + l] = (G g_l G^T)[k] for 16 filters at once, g_l's taps gf[16 j + l] (j = 3a + b):
    `_filter_transform`'s operations on flat buffers with constant offsets (LLVM vectorizes the
    16 filters)."""
    h = gf.dtype.type(0.5)
    for i in range(16):
        g00, g01, g02 = gf[i], gf[16 + i], gf[32 + i]
        g10, g11, g12 = gf[48 + i], gf[64 + i], gf[80 + i]
        g20, g21, g22 = gf[96 + i], gf[112 + i], gf[128 + i]
        q10, q11, q12 = h * (g00 + g10 + g20), h * (g01 + g11 + g21), h * (g02 + g12 + g22)
        q20, q21, q22 = h * (g00 - g10 + g20), h * (g01 - g11 + g21), h * (g02 - g12 + g22)
        tf[i] = g00
        tf[16 + i] = h * (g00 + g01 + g02)
        tf[32 + i] = h * (g00 - g01 + g02)
        tf[48 + i] = g02
        tf[64 + i] = q10
        tf[80 + i] = h * (q10 + q11 + q12)
        tf[96 + i] = h * (q10 - q11 + q12)
        tf[112 + i] = q12
        tf[128 + i] = q20
        tf[144 + i] = h * (q20 + q21 + q22)
        tf[160 + i] = h * (q20 - q21 + q22)
        tf[176 + i] = q22
        tf[192 + i] = g20
        tf[208 + i] = h * (g20 + g21 + g22)
        tf[224 + i] = h * (g20 - g21 + g22)
        tf[240 + i] = g22


@nb.njit(**JIT)
def wino_weights(w2, U, o0, o1):
    """U[4a+b, o, c] = (G g G^T)[a, b] for the filters g = w2[o, 9c:9c + 9] (3x3, row-major),
    o in [o0, o1). Per output channel, 16 input channels at a time: their taps transposed into
    a (9, 16) block, transformed as vectors (`_filter_block`), stored as 16-float runs of U's rows
    (one filter at a time with (9, C) / (16, C) rows it ran ~7.6 cycles a weight)."""
    C = w2.shape[1] // 9
    gf = np.zeros(144, w2.dtype)
    tf = np.empty(256, w2.dtype)
    for o in range(o0, o1):
        wr = w2[o]
        for c0 in range(0, C, 16):
            m = min(16, C - c0)               # filters in this block (lanes >= m: not stored)
            src = wr[9 * c0:9 * (c0 + m)]
            for l in range(m):
                for j in range(9):
                    gf[16 * j + l] = src[9 * l + j]
            _filter_block(gf, tf)
            for k in range(16):
                dst = U[k, o, c0:c0 + m]
                tk = tf[16 * k:16 * k + 16]
                for l in range(m):
                    dst[l] = tk[l]


# planes at most this wide, tasks of at least this many images: the transform runs with the images
# as the vector lanes (`_wino_input_lanes`)
LANES_MAX_W = 8
LANES_MIN_IMAGES = 8


@nb.njit(inline="always", **JIT)
def lanes(W, images):
    """Do the transforms of a task of `images` images of width W run with the images as the vector
    lanes? Then its patches are ordered tile-major, p = tile * images + image, in V, M and D alike
    (every transform of the task's image range agrees, and the GEMMs do not care about the order of
    their columns); else image-major, p = image * tiles + tile."""
    return W <= LANES_MAX_W and images >= LANES_MIN_IMAGES


@nb.njit(**JIT)
def wino_input(x2, a, b, s2, a2, b2, r2, V, vr0, p0, n0, n1, c0, c1, H, W, affine, skind, relu,
               write_r):
    """V[xi, vr0 + c - c0, p0 + p] = (B^T d B)[xi] of the transformed input t(x)
    (train_conv._transform) for the patches p of images [n0, n1), channels [c0, c1): p =
    (n - n0)*th*tw + ty*tw + tx, or in the `lanes` order (n - n0) + (ty*tw + tx)*(n1 - n0).

    x2, s2, r2: (C, N*H*W) rows; with write_r also r2 = t(x) (pattern 4's stored C2 input);
    V: a contiguous (16, rows, pitch) buffer, written through unsigned flat offsets (no
    negative-index code in the loop; the planes can be as small as 4x4).

    Small planes (W <= LANES_MAX_W) of tasks with >= LANES_MIN_IMAGES images run
    `_wino_input_lanes` (the images as vector lanes), the others `_wino_input_planes` (one plane
    at a time, vectors along its rows). Both compute every value with the same operations in the
    same order: the same bits, in their patch orders. A V of 36 planes takes F(4x4, 3x3) (`wino4_input`)."""
    if V.shape[0] == 36:
        wino4_input(x2, a, b, s2, a2, b2, r2, V, vr0, p0, n0, n1, c0, c1, H, W, affine, skind, relu, write_r)
    elif lanes(W, n1 - n0):
        _wino_input_lanes(x2, a, b, s2, a2, b2, r2, V, vr0, p0, n0, n1, c0, c1, H, W, affine, skind,
                          relu, write_r)
    else:
        _wino_input_planes(x2, a, b, s2, a2, b2, r2, V, vr0, p0, n0, n1, c0, c1, H, W, affine,
                           skind, relu, write_r)


LN = 16     # the image lanes of `_wino_input_lanes` (a compile-time constant: the tile loop's offsets are)


@nb.njit(**JIT)
def _wino_input_lanes(x2, a, b, s2, a2, b2, r2, V, vr0, p0, n0, n1, c0, c1, H, W, affine, skind,
                      relu, write_r):
    """`wino_input` with the task's images as the vector lanes. A 4x4 or 7x7 plane has 2-4 tiles
    a row: one plane at a time (`_wino_input_planes`) cost 700-1100 cycles a plane (loop set-up,
    short rows). Per channel: t(x) of all the task's images in one pass (tmp), then per group of
    LN images: the padded planes transposed to pbn (rows, cols, LN images), each tile's 16 values
    computed for the LN images at once into Z (tiles, 16 xi, LN) (constant offsets: LLVM
    vectorizes the image loop), and Z stored into V's rows in the lanes order (patch p = tile *
    images + image: `lanes`), each (xi, tile) a contiguous run of the group's images."""
    th = (H + 1) // 2
    tw = (W + 1) // 2
    HW = H * W
    T = th * tw
    Wp = 2 * tw + 2
    nn = n1 - n0
    tmp = np.empty(nn * HW, V.dtype)
    pbn = np.zeros((2 * th + 2, Wp, LN), V.dtype)   # border stays 0
    Z = np.empty((T, 16, LN), V.dtype)
    pf = pbn.reshape(pbn.size)
    zf = Z.reshape(Z.size)
    g1 = np.uint64(Wp * LN)                          # the next padded row in pbn
    g2 = g1 + g1
    g3 = g2 + g1
    L1 = np.uint64(LN)                               # unsigned offsets: no negative-index code
    L2 = L1 + L1
    L3 = L2 + L1
    ld = V.shape[2]
    S = np.uint64(V.shape[1] * ld)                   # xi plane stride
    Vf = V.reshape(V.size)
    for c in range(c0, c1):
        transform_rows(x2, a, b, s2, a2, b2, r2, c, n0 * HW, n1 * HW, tmp, affine, skind, relu, write_r)
        base = np.uint64((vr0 + c - c0) * ld + p0)
        for m0 in range(0, nn, LN):
            m = min(LN, nn - m0)                     # images in this group (lanes >= m: not stored)
            src = tmp[m0 * HW:(m0 + m) * HW]
            for i in range(H):                       # (images, H, W) -> pbn (1 + H, 1 + W, lanes)
                for j in range(W):
                    dst = pbn[1 + i, 1 + j]
                    q = i * W + j
                    for n in range(m):               # long loops: the image axis innermost
                        dst[n] = src[q + n * HW]
            for ty in range(th):
                for tx in range(tw):
                    o = np.uint64((2 * ty * Wp + 2 * tx) * LN)   # pbn[2ty, 2tx, 0]
                    z = np.uint64((ty * tw + tx) * 16 * LN)      # Z[tile, 0, 0]
                    for n in range(LN):                          # one vector: the images
                        u = o + np.uint64(n)
                        # B^T d per column (rows d0..d3 of the patch, g1 apart; columns LN apart):
                        # R0 = d0 - d2, R1 = d1 + d2, R2 = d2 - d1, R3 = d1 - d3
                        d00, d01, d02, d03 = pf[u], pf[u + L1], pf[u + L2], pf[u + L3]
                        d10, d11 = pf[u + g1], pf[u + g1 + L1]
                        d12, d13 = pf[u + g1 + L2], pf[u + g1 + L3]
                        d20, d21 = pf[u + g2], pf[u + g2 + L1]
                        d22, d23 = pf[u + g2 + L2], pf[u + g2 + L3]
                        d30, d31 = pf[u + g3], pf[u + g3 + L1]
                        d32, d33 = pf[u + g3 + L2], pf[u + g3 + L3]
                        e00, e01, e02, e03 = d00 - d20, d01 - d21, d02 - d22, d03 - d23
                        e10, e11, e12, e13 = d10 + d20, d11 + d21, d12 + d22, d13 + d23
                        e20, e21, e22, e23 = d20 - d10, d21 - d11, d22 - d12, d23 - d13
                        e30, e31, e32, e33 = d10 - d30, d11 - d31, d12 - d32, d13 - d33
                        # (B^T d) B: row ar -> xi = 4 ar + (e0 - e2, e1 + e2, e2 - e1, e1 - e3)
                        w = z + np.uint64(n)
                        zf[w] = e00 - e02
                        zf[w + L1] = e01 + e02
                        zf[w + L2] = e02 - e01
                        zf[w + L3] = e01 - e03
                        zf[w + np.uint64(4 * LN)] = e10 - e12
                        zf[w + np.uint64(5 * LN)] = e11 + e12
                        zf[w + np.uint64(6 * LN)] = e12 - e11
                        zf[w + np.uint64(7 * LN)] = e11 - e13
                        zf[w + np.uint64(8 * LN)] = e20 - e22
                        zf[w + np.uint64(9 * LN)] = e21 + e22
                        zf[w + np.uint64(10 * LN)] = e22 - e21
                        zf[w + np.uint64(11 * LN)] = e21 - e23
                        zf[w + np.uint64(12 * LN)] = e30 - e32
                        zf[w + np.uint64(13 * LN)] = e31 + e32
                        zf[w + np.uint64(14 * LN)] = e32 - e31
                        zf[w + np.uint64(15 * LN)] = e31 - e33
            uN = np.uint64(nn)
            for k in range(16):                      # Z[:, xi, :m] -> V row: patch t * nn + image
                vk = base + np.uint64(k) * S + np.uint64(m0)
                for t in range(T):
                    zt = Z[t, k]
                    vt = vk + np.uint64(t) * uN
                    for n in range(m):
                        Vf[vt + np.uint64(n)] = zt[n]


@nb.njit(**JIT)
def _wino_input_planes(x2, a, b, s2, a2, b2, r2, V, vr0, p0, n0, n1, c0, c1, H, W, affine, skind, relu,
                       write_r):
    """`wino_input` one plane at a time: V[xi, vr0 + c - c0, p0 + p] = (B^T d B)[xi] of the transformed
    input t(x) (train_conv._transform) for the patches p of images [n0, n1) (p = (n - n0)*th*tw + ty*tw
    + tx), channels [c0, c1).

    Per row of tiles: the row stage (B^T d: four combinations of the patch rows, along the padded row)
    and the column stage ((B^T d) B: tile tx reads columns 2tx .. 2tx + 3) on 16, 8 or 4 lanes at once
    (`_nb.bt4v`, `_nb.bt4s`; a row's last chunk overlaps the one before, computing its values again).
    numba's own loops stayed scalar on rows of 7-15 values (AVX-512: it vectorizes 16 iterations at a
    time): 64 channels x 4 images at 28x28 565 -> 327 us, 128 x 8 at 14x14 810 -> 460 us on the Emerald
    Rapids VM (the 14x14 gain includes one t(x) call a channel instead of one a plane). The same
    operations per value in the same order as the scalar loops: the same bits.

    x2, s2, r2: (C, N*H*W) rows; with write_r also r2 = t(x) (pattern 4's stored C2 input);
    V: a contiguous (16, rows, pitch) buffer."""
    th = (H + 1) // 2
    tw = (W + 1) // 2
    HW = H * W
    T = th * tw
    Wp = 2 * tw + 2
    pb = np.zeros((2 * th + 2) * Wp, V.dtype)    # the padded plane, rows of Wp (border stays 0)
    R = np.empty(4 * Wp, V.dtype)                # B^T d of a row of tiles: 4 rows of Wp
    tmp = np.empty((n1 - n0) * HW, V.dtype)
    ld = V.shape[2]
    S = V.shape[1] * ld
    Vf = V.reshape(V.size)
    for c in range(c0, c1):
        # t(x) of the channel's planes of all the task's images in one call (a call per plane cost
        # ~0.25 us: a third of the transform of a 14x14 plane)
        transform_rows(x2, a, b, s2, a2, b2, r2, c, n0 * HW, n1 * HW, tmp, affine, skind, relu, write_r)
        for n in range(n0, n1):
            t0 = (n - n0) * HW
            for i in range(H):
                dst = pb[(1 + i) * Wp + 1:(1 + i) * Wp + 1 + W]
                src = tmp[t0 + i * W:t0 + (i + 1) * W]
                for j in range(W):
                    dst[j] = src[j]
            base = (vr0 + c - c0) * ld + p0 + (n - n0) * T
            for ty in range(th):
                so = 2 * ty * Wp          # the row stage: R[i] = (B^T d)[i] over the row's columns
                if Wp >= 16:
                    for k in range((Wp + 15) // 16):
                        j = min(16 * k, Wp - 16)
                        bt4v(R, j, Wp + j, 2 * Wp + j, 3 * Wp + j, pb, so + j, so + Wp + j, so + 2 * Wp + j,
                             so + 3 * Wp + j, 16)
                elif Wp >= 8:
                    for k in range((Wp + 7) // 8):
                        j = min(8 * k, Wp - 8)
                        bt4v(R, j, Wp + j, 2 * Wp + j, 3 * Wp + j, pb, so + j, so + Wp + j, so + 2 * Wp + j,
                             so + 3 * Wp + j, 8)
                else:                     # 4 <= Wp < 8
                    for j in (0, Wp - 4):
                        bt4v(R, j, Wp + j, 2 * Wp + j, 3 * Wp + j, pb, so + j, so + Wp + j, so + 2 * Wp + j,
                             so + 3 * Wp + j, 4)
                q = base + ty * tw
                for ar in range(4):       # the column stage: tile tx of R row ar at columns 2tx .. 2tx + 3
                    re = ar * Wp
                    q0 = q + 4 * ar * S
                    if tw >= 16:
                        for k in range((tw + 15) // 16):
                            t = min(16 * k, tw - 16)
                            bt4s(Vf, q0 + t, q0 + S + t, q0 + 2 * S + t, q0 + 3 * S + t, R, re + 2 * t, 16)
                    elif tw >= 8:
                        for k in range((tw + 7) // 8):
                            t = min(8 * k, tw - 8)
                            bt4s(Vf, q0 + t, q0 + S + t, q0 + 2 * S + t, q0 + 3 * S + t, R, re + 2 * t, 8)
                    elif tw >= 4:
                        for k in range((tw + 3) // 4):
                            t = min(4 * k, tw - 4)
                            bt4s(Vf, q0 + t, q0 + S + t, q0 + 2 * S + t, q0 + 3 * S + t, R, re + 2 * t, 4)
                    else:
                        for t in range(tw):
                            e0, e1, e2, e3 = R[re + 2 * t], R[re + 2 * t + 1], R[re + 2 * t + 2], R[re + 2 * t + 3]
                            Vf[q0 + t] = e0 - e2
                            Vf[q0 + S + t] = e1 + e2
                            Vf[q0 + 2 * S + t] = e2 - e1
                            Vf[q0 + 3 * S + t] = e1 - e3


@nb.njit(inline="always", **JIT)
def _output_tile(Mf, u, S):
    """A^T m A of one 2x2 output tile, m_k = Mf[u + k S] (k = 0..15, the xi planes): (y00, y01, y10, y11),
    summed left to right (`_nb.at4s`'s lanes compute the same)."""
    m0, m1, m2, m3 = Mf[u], Mf[u + S], Mf[u + 2 * S], Mf[u + 3 * S]
    m4, m5, m6, m7 = Mf[u + 4 * S], Mf[u + 5 * S], Mf[u + 6 * S], Mf[u + 7 * S]
    m8, m9, m10, m11 = Mf[u + 8 * S], Mf[u + 9 * S], Mf[u + 10 * S], Mf[u + 11 * S]
    m12, m13, m14, m15 = Mf[u + 12 * S], Mf[u + 13 * S], Mf[u + 14 * S], Mf[u + 15 * S]
    # A^T m: rows (m[0] + m[1] + m[2]) and (m[1] - m[2] - m[3]) per column b
    s00 = m0 + m4 + m8
    s01 = m1 + m5 + m9
    s02 = m2 + m6 + m10
    s03 = m3 + m7 + m11
    s10 = m4 - m8 - m12
    s11 = m5 - m9 - m13
    s12 = m6 - m10 - m14
    s13 = m7 - m11 - m15
    return s00 + s01 + s02, s01 - s02 - s03, s10 + s11 + s12, s11 - s12 - s13


@nb.njit(inline="always", **JIT)
def _lanes_crop(Y, yr, y0, HW, H, W, m):
    """yr[y0 + n HW + i W + j] = Y[i, j, n] for n < m (the lanes' output planes, cropped to H x W)."""
    for n in range(m):
        yb = y0 + n * HW
        for i in range(H):
            yi = Y[i]
            r = yb + i * W
            for j in range(W):
                yr[r + j] = yi[j, n]


@nb.njit(**JIT)
def _wino_output_lanes(M, rows, y2, n0, n1, o0, H, W):
    """`wino_output` for the `lanes` patch order (p = tile * images + image): per output row and
    group of LN images, each tile's A^T m A for the LN images at once (contiguous loads of M, the
    scalar loop's operations in its order: the same bits) into Y (the LN output planes padded to
    even sizes, the images innermost), then each image's H x W crop stored. On 7x7 planes a row of 4 tiles one plane at a time cost ~730
    cycles a plane (loop set-up, the odd width's row buffer)."""
    th = (H + 1) // 2
    tw = (W + 1) // 2
    HW = H * W
    T = th * tw
    nn = n1 - n0
    ld = M.shape[2]
    S = np.uint64(M.shape[1] * ld)
    Mf = M.reshape(M.size)
    W2 = 2 * tw
    Y = np.empty((2 * th, W2, LN), M.dtype)          # the group's output planes, padded to even
    yf = Y.reshape(Y.size)
    L1 = np.uint64(LN)
    R1 = np.uint64(W2 * LN)                          # the next output row in Y
    for o in range(rows):
        yr = y2[o0 + o]
        for m0 in range(0, nn, LN):
            m = min(LN, nn - m0)                     # images in this group (lanes >= m: not stored)
            for t in range(T):
                # lanes >= m read the next patches, or past them the spare row of M: not stored
                q = np.uint64(o * ld + t * nn + m0)
                ty = t // tw
                z = np.uint64((2 * ty * W2 + 2 * (t - ty * tw)) * LN)   # Y[2ty, 2tx, 0]
                for n in range(LN):
                    y00, y01, y10, y11 = _output_tile(Mf, q + np.uint64(n), S)
                    w = z + np.uint64(n)
                    yf[w] = y00
                    yf[w + L1] = y01
                    yf[w + R1] = y10
                    yf[w + R1 + L1] = y11
            _lanes_crop(Y, yr, (n0 + m0) * HW, HW, H, W, m)     # the images' H x W crops


@nb.njit(**JIT)
def wino_output(M, rows, y2, n0, n1, o0, H, W):
    """y2[o0 + o, image n, 2x2 tile p] = A^T M[:, o, p] A, cropped to H x W, for the rows
    o < rows of M (16, >= rows + 1, >= patches) and images [n0, n1), patches in the `lanes` order
    where that holds (`_wino_output_lanes`), else `_wino_output_planes`; an M of 36 planes: F(4x4, 3x3)
    (`wino4_output`)."""
    if M.shape[0] == 36:
        wino4_output(M, rows, y2, n0, n1, o0, H, W)
    elif lanes(W, n1 - n0):
        _wino_output_lanes(M, rows, y2, n0, n1, o0, H, W)
    else:
        _wino_output_planes(M, rows, y2, n0, n1, o0, H, W)


@nb.njit(**JIT)
def _wino_output_planes(M, rows, y2, n0, n1, o0, H, W):
    """`wino_output` one plane at a time (patch p = image * tiles + tile).

    A row of tiles 16, 8 or 4 at a time (`_nb.at4s`, the last chunk overlapping the one before),
    stored straight into y's two rows when W is even, else through a row buffer (cropped). numba
    left the per-tile loop scalar on rows of 7-14 tiles: 64 channels x 3 images at 28x28 238 -> 150
    us, 128 x 6 at 14x14 445 -> 285 us on the Emerald Rapids VM. The same bits."""
    th = (H + 1) // 2
    tw = (W + 1) // 2
    HW = H * W
    T = th * tw
    rb = np.empty(4 * tw, M.dtype)       # a row of tiles' two output rows (odd W, or past the last row)
    S = M.shape[1] * M.shape[2]
    ld = M.shape[2]
    Mf = M.reshape(M.size)
    even = W % 2 == 0
    for o in range(rows):
        yr = y2[o0 + o]
        for n in range(n0, n1):
            for ty in range(th):
                pt = o * ld + (n - n0) * T + ty * tw
                last = 2 * ty + 1 >= H
                if even:
                    r0, i0 = yr, n * HW + 2 * ty * W
                else:
                    r0, i0 = rb, 0
                if even and not last:
                    r1, i1 = yr, n * HW + (2 * ty + 1) * W
                else:
                    r1, i1 = rb, 2 * tw
                if tw >= 16:
                    for k in range((tw + 15) // 16):
                        t = min(16 * k, tw - 16)
                        at4s(r0, i0 + 2 * t, r1, i1 + 2 * t, Mf, pt + t, S, 16)
                elif tw >= 8:
                    for k in range((tw + 7) // 8):
                        t = min(8 * k, tw - 8)
                        at4s(r0, i0 + 2 * t, r1, i1 + 2 * t, Mf, pt + t, S, 8)
                elif tw >= 4:
                    for k in range((tw + 3) // 4):
                        t = min(4 * k, tw - 4)
                        at4s(r0, i0 + 2 * t, r1, i1 + 2 * t, Mf, pt + t, S, 4)
                else:
                    for tx in range(tw):
                        y00, y01, y10, y11 = _output_tile(Mf, pt + tx, S)
                        r0[i0 + 2 * tx] = y00
                        r0[i0 + 2 * tx + 1] = y01
                        r1[i1 + 2 * tx] = y10
                        r1[i1 + 2 * tx + 1] = y11
                if not even:
                    y0 = yr[n * HW + 2 * ty * W:n * HW + (2 * ty + 1) * W]
                    for j in range(W):
                        y0[j] = rb[j]
                    if not last:
                        y1 = yr[n * HW + (2 * ty + 1) * W:n * HW + (2 * ty + 2) * W]
                        for j in range(W):
                            y1[j] = rb[2 * tw + j]


@nb.njit(**JIT)
def _wino_dy_lanes(dy2, D, dr0, p0, n0, n1, o0, o1, H, W):
    """`wino_dy` for the `lanes` patch order (p = tile * images + image): per channel and group of
    LN images, the planes transposed to gbn (rows, cols, LN images; zero past H x W), each tile's 16
    values for the LN images at once (the scalar loop's operations in its order: the same bits)
    into Z (tiles, 16, LN), stored as contiguous runs of D's rows."""
    th = (H + 1) // 2
    tw = (W + 1) // 2
    HW = H * W
    T = th * tw
    nn = n1 - n0
    gbn = np.zeros((2 * th, 2 * tw, LN), D.dtype)
    Z = np.empty((T, 16, LN), D.dtype)
    gf = gbn.reshape(gbn.size)
    zf = Z.reshape(Z.size)
    L1 = np.uint64(LN)
    g1 = np.uint64(2 * tw * LN)                      # the next row in gbn
    ld = D.shape[2]
    S = np.uint64(D.shape[1] * ld)
    Df = D.reshape(D.size)
    uN = np.uint64(nn)
    for o in range(o0, o1):
        dro = dy2[o]
        base = np.uint64((dr0 + o - o0) * ld + p0)
        for m0 in range(0, nn, LN):
            m = min(LN, nn - m0)                     # images in this group (lanes >= m: not stored)
            src = dro[(n0 + m0) * HW:(n0 + m0 + m) * HW]
            for i in range(H):
                for j in range(W):
                    dst = gbn[i, j]
                    q = i * W + j
                    for n in range(m):
                        dst[n] = src[q + n * HW]
            for ty in range(th):
                for tx in range(tw):
                    u0 = np.uint64((2 * ty * 2 * tw + 2 * tx) * LN)
                    z = np.uint64((ty * tw + tx) * 16 * LN)
                    for n in range(LN):
                        u = u0 + np.uint64(n)
                        a0, a1 = gf[u], gf[u + L1]           # rows of A g: (a0, a1), (a0 + b0, a1 + b1),
                        b0, b1 = gf[u + g1], gf[u + g1 + L1]  # (a0 - b0, a1 - b1), (-b0, -b1)
                        e0, e1 = a0 + b0, a1 + b1
                        q0, q1 = a0 - b0, a1 - b1
                        # each row (u, v) -> (u, u + v, u - v, -v)
                        w = z + np.uint64(n)
                        zf[w] = a0
                        zf[w + L1] = a0 + a1
                        zf[w + np.uint64(2 * LN)] = a0 - a1
                        zf[w + np.uint64(3 * LN)] = -a1
                        zf[w + np.uint64(4 * LN)] = e0
                        zf[w + np.uint64(5 * LN)] = e0 + e1
                        zf[w + np.uint64(6 * LN)] = e0 - e1
                        zf[w + np.uint64(7 * LN)] = -e1
                        zf[w + np.uint64(8 * LN)] = q0
                        zf[w + np.uint64(9 * LN)] = q0 + q1
                        zf[w + np.uint64(10 * LN)] = q0 - q1
                        zf[w + np.uint64(11 * LN)] = -q1
                        zf[w + np.uint64(12 * LN)] = -b0
                        zf[w + np.uint64(13 * LN)] = -b0 - b1
                        zf[w + np.uint64(14 * LN)] = b1 - b0
                        zf[w + np.uint64(15 * LN)] = b1
            for k in range(16):
                vk = base + np.uint64(k) * S + np.uint64(m0)
                for t in range(T):
                    zt = Z[t, k]
                    vt = vk + np.uint64(t) * uN
                    for n in range(m):
                        Df[vt + np.uint64(n)] = zt[n]


@nb.njit(**JIT)
def wino_dy(dy2, D, dr0, p0, n0, n1, o0, o1, H, W):
    """D[xi, dr0 + o - o0, p0 + p] = (A g A^T)[xi] for the 2x2 tiles g of dy (zero beyond
    H x W), A = [[1, 0], [1, 1], [1, -1], [0, -1]], images [n0, n1), channels [o0, o1); patches
    in the `lanes` order where that holds (`_wino_dy_lanes`), else `_wino_dy_planes`; a D of 36 planes:
    F(4x4, 3x3) (`wino4_dy`)."""
    if D.shape[0] == 36:
        wino4_dy(dy2, D, dr0, p0, n0, n1, o0, o1, H, W)
    elif lanes(W, n1 - n0):
        _wino_dy_lanes(dy2, D, dr0, p0, n0, n1, o0, o1, H, W)
    else:
        _wino_dy_planes(dy2, D, dr0, p0, n0, n1, o0, o1, H, W)


@nb.njit(**JIT)
def _wino_dy_planes(dy2, D, dr0, p0, n0, n1, o0, o1, H, W):
    """`wino_dy` one plane at a time (patch p = image * tiles + tile).

    A row of tiles 16, 8 or 4 at a time (`_nb.ad4s`, the last chunk overlapping), read straight
    from dy's two rows when W is even, else from zero-padded copies; rows of under 4 tiles
    scalar. The same bits as the scalar loop."""
    th = (H + 1) // 2
    tw = (W + 1) // 2
    HW = H * W
    T = th * tw
    gb = np.zeros(4 * tw, D.dtype)            # the two rows, zero-padded: [0, 2tw) and [2tw, 4tw)
    g0 = gb[:2 * tw]
    g1 = gb[2 * tw:]
    S = D.shape[1] * D.shape[2]
    ld = D.shape[2]
    Df = D.reshape(D.size)
    even = W % 2 == 0
    for o in range(o0, o1):
        oc = dr0 + o - o0
        dro = dy2[o]
        for n in range(n0, n1):
            dr = dro[n * HW:(n + 1) * HW]
            for ty in range(th):
                last = 2 * ty + 1 >= H
                if even and not last and tw >= 4:
                    src, s0 = dro, n * HW + 2 * ty * W
                    s1 = s0 + W
                else:
                    row = dr[2 * ty * W:(2 * ty + 1) * W]
                    for j in range(W):
                        g0[j] = row[j]
                    if not last:
                        row = dr[(2 * ty + 1) * W:(2 * ty + 2) * W]
                        for j in range(W):
                            g1[j] = row[j]
                    else:
                        for j in range(W):
                            g1[j] = 0
                    src, s0, s1 = gb, 0, 2 * tw
                pt = p0 + (n - n0) * T + ty * tw
                q = oc * ld + pt
                if tw >= 16:
                    for k in range((tw + 15) // 16):
                        t = min(16 * k, tw - 16)
                        ad4s(Df, q + t, S, src, s0 + 2 * t, s1 + 2 * t, 16)
                elif tw >= 8:
                    for k in range((tw + 7) // 8):
                        t = min(8 * k, tw - 8)
                        ad4s(Df, q + t, S, src, s0 + 2 * t, s1 + 2 * t, 8)
                elif tw >= 4:
                    for k in range((tw + 3) // 4):
                        t = min(4 * k, tw - 4)
                        ad4s(Df, q + t, S, src, s0 + 2 * t, s1 + 2 * t, 4)
                else:
                    d0 = D[0, oc, pt:pt + tw]
                    d1 = D[1, oc, pt:pt + tw]
                    d2 = D[2, oc, pt:pt + tw]
                    d3 = D[3, oc, pt:pt + tw]
                    d4 = D[4, oc, pt:pt + tw]
                    d5 = D[5, oc, pt:pt + tw]
                    d6 = D[6, oc, pt:pt + tw]
                    d7 = D[7, oc, pt:pt + tw]
                    d8 = D[8, oc, pt:pt + tw]
                    d9 = D[9, oc, pt:pt + tw]
                    d10 = D[10, oc, pt:pt + tw]
                    d11 = D[11, oc, pt:pt + tw]
                    d12 = D[12, oc, pt:pt + tw]
                    d13 = D[13, oc, pt:pt + tw]
                    d14 = D[14, oc, pt:pt + tw]
                    d15 = D[15, oc, pt:pt + tw]
                    for tx in range(tw):
                        a0 = g0[2 * tx]                  # rows of A g: (a0, a1), (a0 + b0, a1 + b1),
                        a1 = g0[2 * tx + 1]              # (a0 - b0, a1 - b1), (-b0, -b1)
                        b0 = g1[2 * tx]
                        b1 = g1[2 * tx + 1]
                        e0, e1 = a0 + b0, a1 + b1
                        q0, q1 = a0 - b0, a1 - b1
                        # each row (u, v) -> (u, u + v, u - v, -v)
                        d0[tx] = a0
                        d1[tx] = a0 + a1
                        d2[tx] = a0 - a1
                        d3[tx] = -a1
                        d4[tx] = e0
                        d5[tx] = e0 + e1
                        d6[tx] = e0 - e1
                        d7[tx] = -e1
                        d8[tx] = q0
                        d9[tx] = q0 + q1
                        d10[tx] = q0 - q1
                        d11[tx] = -q1
                        d12[tx] = -b0
                        d13[tx] = -b0 - b1
                        d14[tx] = b1 - b0
                        d15[tx] = b1


@nb.njit(inline="always", **JIT)
def _sum_partials(Mw, m, o):
    """m[xi, c] = sum over the partials q in order of Mw[q, xi, o, c] (the weight gradient's products of
    output channel o: (partials, planes, O, C))."""
    Q, C = Mw.shape[0], Mw.shape[3]
    for k in range(m.shape[0]):
        mr = m[k]
        src = Mw[0, k, o]
        for c in range(C):
            mr[c] = src[c]
        for q in range(1, Q):
            src = Mw[q, k, o]
            for c in range(C):
                mr[c] += src[c]


@nb.njit(**JIT)
def wino_dw(Mw, dw4, o0, o1):
    """dw4[o, c] (3x3) = G^T m G with m[xi] = sum over partials q in order of Mw[q, xi, o, c],
    for o in [o0, o1) (Mw: (partials, 16, O, C), the weight gradient's products, rows o).

    Per output channel: the partial sums and G^T m G vectorized over the input channels, then
    stored as dw4[o]'s C * 9 contiguous floats. (With the products transposed, (C, O), the 9 taps
    of one (o, c) went 18 KB apart from the next o's: 2.8 ns a weight at 512 x 512 channels on the
    Emerald Rapids VM.) An Mw of 36 planes: F(4x4, 3x3) (`wino4_dw`)."""
    if Mw.shape[1] == 36:
        wino4_dw(Mw, dw4, o0, o1)
        return
    C = Mw.shape[3]
    m = np.empty((16, C), Mw.dtype)
    gl = np.empty((9, C), Mw.dtype)
    half = Mw.dtype.type(0.5)
    for o in range(o0, o1):
        _sum_partials(Mw, m, o)
        for c in range(C):
            # G^T m: rows k = 0, 1, 2 from rows a = 0..3 of m (per column b)
            v0, v1, v2, v3 = m[0, c], m[4, c], m[8, c], m[12, c]
            t00, t10, t20 = v0 + half * (v1 + v2), half * (v1 - v2), half * (v1 + v2) + v3
            v0, v1, v2, v3 = m[1, c], m[5, c], m[9, c], m[13, c]
            t01, t11, t21 = v0 + half * (v1 + v2), half * (v1 - v2), half * (v1 + v2) + v3
            v0, v1, v2, v3 = m[2, c], m[6, c], m[10, c], m[14, c]
            t02, t12, t22 = v0 + half * (v1 + v2), half * (v1 - v2), half * (v1 + v2) + v3
            v0, v1, v2, v3 = m[3, c], m[7, c], m[11, c], m[15, c]
            t03, t13, t23 = v0 + half * (v1 + v2), half * (v1 - v2), half * (v1 + v2) + v3
            # (G^T m) G: each row (t0, t1, t2, t3) -> (t0 + (t1 + t2)/2, (t1 - t2)/2, (t1 + t2)/2 + t3)
            gl[0, c] = t00 + half * (t01 + t02)
            gl[1, c] = half * (t01 - t02)
            gl[2, c] = half * (t01 + t02) + t03
            gl[3, c] = t10 + half * (t11 + t12)
            gl[4, c] = half * (t11 - t12)
            gl[5, c] = half * (t11 + t12) + t13
            gl[6, c] = t20 + half * (t21 + t22)
            gl[7, c] = half * (t21 - t22)
            gl[8, c] = half * (t21 + t22) + t23
        g = dw4[o]
        for c in range(C):
            for r in range(3):
                for j in range(3):
                    g[c, r, j] = gl[3 * r + j, c]


# ============================================================================ F(4x4, 3x3)
# Small planes (the 7x7 layers of a 112x112 ResNet): 4x4 output tiles of 6x6 patches, 36 GEMMs with 36
# multiplies per 16 outputs instead of 64 (F(2x2): 4 tiles of 16), on the same padded 8x8 cover of a 7x7
# plane. The matrices are Lavin & Gray's (points 0, 1, -1, 2, -2, inf; `conv/winograd.py` BT4, G4, AT4):
#
#     B^T d: (4d0 - 5d2 + d4, (d4 - 4d2) +- (d3 - 4d1), (d4 - d2) +- 2(d3 - d1), 4d1 - 5d3 + d5)
#     G g:   (g0/4, -(g0 + g2 +- g1)/6, (g0/24 + g2/6) +- g1/12, g2)
#     A^T m: (m0 + (m1 + m2) + (m3 + m4), (m1 - m2) + 2(m3 - m4), (m1 + m2) + 4(m3 + m4),
#             (m1 - m2) + 8(m3 - m4) + m5)
#     A t (the weight gradient's dy tiles, 4 -> 6): (t0, (t0 + t2) +- (t1 + t3), (t0 + 4t2) +- (2t1 + 8t3), t3)
#     G^T m (its 6 -> 3): (m0/4 - (m1 + m2)/6 + (m3 + m4)/24, (m2 - m1)/6 + (m3 - m4)/12,
#                          ((m3 + m4) - (m1 + m2))/6 + m5)
#
# xi = 6a + b. The input gradient's filters are not a permutation of U (the points are not closed under
# x -> 1/x as F(2x2)'s are): Ud (36, C, O) is transformed from the rotated filters (`wino4_weights_mirrored`).
# Every transform runs with the task's images as the vector lanes (patch p = tile * images + image, the
# `lanes` order, for any image count), in two stages through a small buffer (6 values a lane per loop:
# no spills). Larger coefficients than F(2x2) (up to 8 and 1/24): float32 errors 10-20x F(2x2)'s, ~1e-5 of
# the largest value at 256 channels (y 9.7e-6, dx 1.3e-5, dW 5.5e-6 against float64 PyTorch, batch 32; F(2x2)
# ~5e-7), as the inference F(4x4)'s (docs/kernels.md).
WINO4_MIN, WINO4_MAX = 5, 8     # planes whose larger side is in this range run F(4x4, 3x3)


def wino_m(H: int, W: int) -> int:
    """The output tile side of a training Winograd conv on H x W planes: 4 (F(4x4, 3x3)) or 2."""
    return 4 if WINO4_MIN <= max(H, W) <= WINO4_MAX else 2


def wino_tiles(H: int, W: int, m: int) -> int:
    """Output tiles (patches) a plane has."""
    return -(-H // m) * -(-W // m)


@nb.njit(inline="always", **JIT)
def _bt6(d0, d1, d2, d3, d4, d5):
    f2, f4, f5 = np.float32(2.0), np.float32(4.0), np.float32(5.0)
    t1 = d4 - f4 * d2
    t2 = d3 - f4 * d1
    t3 = d4 - d2
    t4 = f2 * (d3 - d1)
    return f4 * d0 - f5 * d2 + d4, t1 + t2, t1 - t2, t3 + t4, t3 - t4, f4 * d1 - f5 * d3 + d5


@nb.njit(inline="always", **JIT)
def _at6(m0, m1, m2, m3, m4, m5):
    f2, f4, f8 = np.float32(2.0), np.float32(4.0), np.float32(8.0)
    a = m1 + m2
    b = m1 - m2
    c = m3 + m4
    d = m3 - m4
    return m0 + a + c, b + f2 * d, a + f4 * c, b + f8 * d + m5


@nb.njit(inline="always", **JIT)
def _a6(t0, t1, t2, t3):
    f2, f4, f8 = np.float32(2.0), np.float32(4.0), np.float32(8.0)
    p = t0 + t2
    q = t1 + t3
    p4 = t0 + f4 * t2
    q4 = f2 * t1 + f8 * t3
    return t0, p + q, p - q, p4 + q4, p4 - q4, t3


@nb.njit(inline="always", **JIT)
def _g6(g0, g1, g2):
    c4, c6 = np.float32(0.25), np.float32(1.0 / 6.0)
    c12, c24 = np.float32(1.0 / 12.0), np.float32(1.0 / 24.0)
    s = g0 + g2
    a = c24 * g0 + c6 * g2
    b = c12 * g1
    return c4 * g0, -c6 * (s + g1), -c6 * (s - g1), a + b, a - b, g2


@nb.njit(inline="always", **JIT)
def _gt6(m0, m1, m2, m3, m4, m5):
    c4, c6 = np.float32(0.25), np.float32(1.0 / 6.0)
    c12, c24 = np.float32(1.0 / 12.0), np.float32(1.0 / 24.0)
    a = m1 + m2
    c = m3 + m4
    return c4 * m0 - c6 * a + c24 * c, c6 * (m2 - m1) + c12 * (m3 - m4), c6 * (c - a) + m5


@nb.njit(inline="always", **JIT)
def _to_lanes(src, buf, r0, HW, H, W, m):
    """buf[r0 + i, r0 + j, n] = src[n HW + i W + j] for the m images of src (planes of H x W) as lanes."""
    for i in range(H):
        for j in range(W):
            dst = buf[r0 + i, r0 + j]
            q = i * W + j
            for n in range(m):
                dst[n] = src[q + n * HW]


@nb.njit(inline="always", **JIT)
def _lanes_to_rows(Z, Xf, base, S, nn, m):
    """Xf[base + xi S + t nn + n] = Z[t, xi, n] for n < m: the tiles' values of m images stored in the
    `lanes` patch order, each (xi, tile) a contiguous run of the images."""
    for k in range(Z.shape[1]):
        vk = base + k * S
        for t in range(Z.shape[0]):
            zt = Z[t, k]
            vt = vk + t * nn
            for n in range(m):
                Xf[vt + n] = zt[n]


@nb.njit(**JIT)
def wino4_input(x2, a, b, s2, a2, b2, r2, V, vr0, p0, n0, n1, c0, c1, H, W, affine, skind, relu, write_r):
    """`wino_input` for F(4x4, 3x3): V[xi, vr0 + c - c0, p0 + t * (n1 - n0) + n - n0] = (B^T d B)[xi] of
    the 6x6 patch d of tile t (rows 4ty - 1 .. 4ty + 4, columns 4tx - 1 .. 4tx + 4, zero outside the
    plane) of t(x), V (36, rows, pitch). Per channel and group of LN images: the padded planes
    transposed to pbn (rows, cols, LN images), per tile B^T d column by column into E, then (B^T d) B row
    by row into Z (tiles, 36, LN), stored as runs of V's rows."""
    th = (H + 3) // 4
    tw = (W + 3) // 4
    HW = H * W
    T = th * tw
    nn = n1 - n0
    tmp = np.empty(nn * HW, V.dtype)
    pbn = np.zeros((4 * th + 2, 4 * tw + 2, LN), V.dtype)   # border stays 0
    E = np.empty((6, 6, LN), V.dtype)
    Z = np.empty((T, 36, LN), V.dtype)
    ld = V.shape[2]
    S = V.shape[1] * ld
    Vf = V.reshape(V.size)
    for c in range(c0, c1):
        transform_rows(x2, a, b, s2, a2, b2, r2, c, n0 * HW, n1 * HW, tmp, affine, skind, relu, write_r)
        base = (vr0 + c - c0) * ld + p0
        for m0 in range(0, nn, LN):
            m = min(LN, nn - m0)                     # images in this group (lanes >= m: not stored)
            _to_lanes(tmp[m0 * HW:(m0 + m) * HW], pbn, 1, HW, H, W, m)
            for ty in range(th):
                for tx in range(tw):
                    r0 = 4 * ty
                    for j in range(6):               # B^T d: column j
                        cj = 4 * tx + j
                        q0, q1, q2 = pbn[r0, cj], pbn[r0 + 1, cj], pbn[r0 + 2, cj]
                        q3, q4, q5 = pbn[r0 + 3, cj], pbn[r0 + 4, cj], pbn[r0 + 5, cj]
                        e0, e1, e2, e3, e4, e5 = E[0, j], E[1, j], E[2, j], E[3, j], E[4, j], E[5, j]
                        for n in range(LN):
                            v0, v1, v2, v3, v4, v5 = _bt6(q0[n], q1[n], q2[n], q3[n], q4[n], q5[n])
                            e0[n], e1[n], e2[n], e3[n], e4[n], e5[n] = v0, v1, v2, v3, v4, v5
                    zt = Z[ty * tw + tx]
                    for r in range(6):               # (B^T d) B: row r
                        q0, q1, q2, q3, q4, q5 = E[r, 0], E[r, 1], E[r, 2], E[r, 3], E[r, 4], E[r, 5]
                        z0, z1, z2 = zt[6 * r], zt[6 * r + 1], zt[6 * r + 2]
                        z3, z4, z5 = zt[6 * r + 3], zt[6 * r + 4], zt[6 * r + 5]
                        for n in range(LN):
                            v0, v1, v2, v3, v4, v5 = _bt6(q0[n], q1[n], q2[n], q3[n], q4[n], q5[n])
                            z0[n], z1[n], z2[n], z3[n], z4[n], z5[n] = v0, v1, v2, v3, v4, v5
            _lanes_to_rows(Z, Vf, base + m0, S, nn, m)


@nb.njit(**JIT)
def wino4_output(M, rows, y2, n0, n1, o0, H, W):
    """`wino_output` for F(4x4, 3x3): y2[o0 + o, image n, 4x4 tile t] = A^T M[:, o, p] A (p = t *
    (n1 - n0) + n - n0), cropped to H x W, for the rows o < rows of M (36, >= rows + 1, >= patches).
    Per row and group of LN images: A^T m column by column into E, (A^T m) A row by row into Y (the LN
    output planes padded to multiples of 4, images innermost), then each image's crop stored."""
    th = (H + 3) // 4
    tw = (W + 3) // 4
    HW = H * W
    T = th * tw
    nn = n1 - n0
    ld = M.shape[2]
    S = M.shape[1] * ld
    Mf = M.reshape(M.size)
    Y = np.empty((4 * th, 4 * tw, LN), M.dtype)
    E = np.empty((4, 6, LN), M.dtype)
    for o in range(rows):
        yr = y2[o0 + o]
        for m0 in range(0, nn, LN):
            m = min(LN, nn - m0)             # lanes >= m read the next patches or M's spare row: not stored
            for t in range(T):
                q = o * ld + t * nn + m0
                ty = t // tw
                tx = t - ty * tw
                for j in range(6):           # A^T m: column j (m rows a: planes 6a + j)
                    u = q + j * S
                    e0, e1, e2, e3 = E[0, j], E[1, j], E[2, j], E[3, j]
                    for n in range(LN):
                        w0, w1, w2, w3 = _at6(Mf[u + n], Mf[u + 6 * S + n], Mf[u + 12 * S + n],
                                              Mf[u + 18 * S + n], Mf[u + 24 * S + n], Mf[u + 30 * S + n])
                        e0[n], e1[n], e2[n], e3[n] = w0, w1, w2, w3
                for r in range(4):           # (A^T m) A: row r
                    q0, q1, q2, q3, q4, q5 = E[r, 0], E[r, 1], E[r, 2], E[r, 3], E[r, 4], E[r, 5]
                    yo = Y[4 * ty + r]
                    y0, y1, y2_, y3 = yo[4 * tx], yo[4 * tx + 1], yo[4 * tx + 2], yo[4 * tx + 3]
                    for n in range(LN):
                        w0, w1, w2, w3 = _at6(q0[n], q1[n], q2[n], q3[n], q4[n], q5[n])
                        y0[n], y1[n], y2_[n], y3[n] = w0, w1, w2, w3
            _lanes_crop(Y, yr, (n0 + m0) * HW, HW, H, W, m)     # the images' H x W crops


@nb.njit(**JIT)
def wino4_dy(dy2, D, dr0, p0, n0, n1, o0, o1, H, W):
    """`wino_dy` for F(4x4, 3x3): D[xi, dr0 + o - o0, p0 + t * (n1 - n0) + n - n0] = (A g A^T)[xi] for the
    4x4 tiles g of dy (zero beyond H x W), A (6 x 4) = AT4^T, images [n0, n1), channels [o0, o1)."""
    th = (H + 3) // 4
    tw = (W + 3) // 4
    HW = H * W
    T = th * tw
    nn = n1 - n0
    gbn = np.zeros((4 * th, 4 * tw, LN), D.dtype)   # zero past H x W
    E = np.empty((6, 4, LN), D.dtype)
    Z = np.empty((T, 36, LN), D.dtype)
    ld = D.shape[2]
    S = D.shape[1] * ld
    Df = D.reshape(D.size)
    for o in range(o0, o1):
        dro = dy2[o]
        base = (dr0 + o - o0) * ld + p0
        for m0 in range(0, nn, LN):
            m = min(LN, nn - m0)
            _to_lanes(dro[(n0 + m0) * HW:(n0 + m0 + m) * HW], gbn, 0, HW, H, W, m)
            for ty in range(th):
                for tx in range(tw):
                    for j in range(4):               # A g: column j
                        cj = 4 * tx + j
                        q0, q1, q2, q3 = gbn[4 * ty, cj], gbn[4 * ty + 1, cj], gbn[4 * ty + 2, cj], gbn[4 * ty + 3, cj]
                        e0, e1, e2, e3, e4, e5 = E[0, j], E[1, j], E[2, j], E[3, j], E[4, j], E[5, j]
                        for n in range(LN):
                            v0, v1, v2, v3, v4, v5 = _a6(q0[n], q1[n], q2[n], q3[n])
                            e0[n], e1[n], e2[n], e3[n], e4[n], e5[n] = v0, v1, v2, v3, v4, v5
                    zt = Z[ty * tw + tx]
                    for r in range(6):               # (A g) A^T: row r
                        q0, q1, q2, q3 = E[r, 0], E[r, 1], E[r, 2], E[r, 3]
                        z0, z1, z2 = zt[6 * r], zt[6 * r + 1], zt[6 * r + 2]
                        z3, z4, z5 = zt[6 * r + 3], zt[6 * r + 4], zt[6 * r + 5]
                        for n in range(LN):
                            v0, v1, v2, v3, v4, v5 = _a6(q0[n], q1[n], q2[n], q3[n])
                            z0[n], z1[n], z2[n], z3[n], z4[n], z5[n] = v0, v1, v2, v3, v4, v5
            _lanes_to_rows(Z, Df, base + m0, S, nn, m)


@nb.njit(inline="always", **JIT)
def _filter6_block(gf, e, tf):
    """tf[16 xi + l] = (G g_l G^T)[xi] (xi = 6a + b) for 16 filters, taps gf[16 j + l] (j = 3r + s): G g
    column by column into e (6 rows x 3 columns of 16), then (G g) G^T row by row."""
    for s in range(3):
        for l in range(16):
            v0, v1, v2, v3, v4, v5 = _g6(gf[16 * s + l], gf[48 + 16 * s + l], gf[96 + 16 * s + l])
            e[16 * s + l] = v0
            e[48 + 16 * s + l] = v1
            e[96 + 16 * s + l] = v2
            e[144 + 16 * s + l] = v3
            e[192 + 16 * s + l] = v4
            e[240 + 16 * s + l] = v5
    for a in range(6):
        for l in range(16):
            v0, v1, v2, v3, v4, v5 = _g6(e[48 * a + l], e[48 * a + 16 + l], e[48 * a + 32 + l])
            o = 96 * a + l
            tf[o] = v0
            tf[o + 16] = v1
            tf[o + 32] = v2
            tf[o + 48] = v3
            tf[o + 64] = v4
            tf[o + 80] = v5


@nb.njit(inline="always", **JIT)
def _put_block(tf, X, r, j0, m):
    """X[xi, r, j0:j0 + m] = the first m of the 16 values tf[16 xi:16 xi + 16], xi < 36."""
    for k in range(36):
        dst = X[k, r, j0:j0 + m]
        tk = tf[16 * k:16 * k + 16]
        for l in range(m):
            dst[l] = tk[l]


@nb.njit(**JIT)
def wino4_weights(w2, U, o0, o1):
    """U[6a + b, o, c] = (G g G^T)[a, b] for the filters g = w2[o, 9c:9c + 9], o in [o0, o1): per output
    channel, 16 input channels at a time (`wino_weights`' blocking)."""
    C = w2.shape[1] // 9
    gf = np.zeros(144, w2.dtype)
    e = np.empty(288, w2.dtype)
    tf = np.empty(576, w2.dtype)
    for o in range(o0, o1):
        wr = w2[o]
        for c0 in range(0, C, 16):
            m = min(16, C - c0)
            src = wr[9 * c0:9 * (c0 + m)]
            for l in range(m):
                for j in range(9):
                    gf[16 * j + l] = src[9 * l + j]
            _filter6_block(gf, e, tf)
            _put_block(tf, U, o, c0, m)


@nb.njit(**JIT)
def wino4_weights_mirrored(w2, Ud, c0, c1):
    """The input gradient's filters Ud[6a + b, c, o] = (G g' G^T)[a, b], g' = the filter w2[o, 9c:9c + 9]
    rotated by 180 degrees, for c in [c0, c1). Per 16 input channels: their taps of every output channel
    copied into wb (O rows of 144: w2's rows are 9C floats apart, and read 9 floats at a time straight
    from them they fell into 4 of L1's 64 sets at C = 256), then per input channel 16 output channels at a
    time, Ud's rows written along their length."""
    O = w2.shape[0]
    gf = np.zeros(144, w2.dtype)
    e = np.empty(288, w2.dtype)
    tf = np.empty(576, w2.dtype)
    wb = np.empty((O, 144), w2.dtype)
    for cc in range(c0, c1, 16):
        mc = min(16, c1 - cc)
        for o in range(O):
            src = w2[o, 9 * cc:9 * (cc + mc)]
            dst = wb[o]
            for t in range(9 * mc):
                dst[t] = src[t]
        for c in range(cc, cc + mc):
            t0 = 9 * (c - cc) + 8
            for o0 in range(0, O, 16):
                m = min(16, O - o0)
                for l in range(m):
                    wr = wb[o0 + l]
                    for j in range(9):
                        gf[16 * j + l] = wr[t0 - j]
                _filter6_block(gf, e, tf)
                _put_block(tf, Ud, c, o0, m)


@nb.njit(**JIT)
def wino4_dw(Mw, dw4, o0, o1):
    """dw4[o, c] (3x3) = G^T m G with m[xi] = sum over partials q in order of Mw[q, xi, o, c], o in [o0, o1)
    (Mw: (partials, 36, O, C)). Per output channel, vectorized over the input channels: the sums, G^T m
    column by column into e (3, 6, C), then (G^T m) G row by row."""
    C = Mw.shape[3]
    m = np.empty((36, C), Mw.dtype)
    e = np.empty((3, 6, C), Mw.dtype)
    gl = np.empty((9, C), Mw.dtype)
    for o in range(o0, o1):
        _sum_partials(Mw, m, o)
        for b in range(6):                   # G^T m: column b (rows a: planes 6a + b)
            q0, q1, q2, q3, q4, q5 = m[b], m[6 + b], m[12 + b], m[18 + b], m[24 + b], m[30 + b]
            e0, e1, e2 = e[0, b], e[1, b], e[2, b]
            for c in range(C):
                v0, v1, v2 = _gt6(q0[c], q1[c], q2[c], q3[c], q4[c], q5[c])
                e0[c], e1[c], e2[c] = v0, v1, v2
        for k in range(3):                   # (G^T m) G: row k
            q0, q1, q2, q3, q4, q5 = e[k, 0], e[k, 1], e[k, 2], e[k, 3], e[k, 4], e[k, 5]
            g0, g1, g2 = gl[3 * k], gl[3 * k + 1], gl[3 * k + 2]
            for c in range(C):
                v0, v1, v2 = _gt6(q0[c], q1[c], q2[c], q3[c], q4[c], q5[c])
                g0[c], g1[c], g2[c] = v0, v1, v2
        g = dw4[o]
        for c in range(C):
            for r in range(3):
                for j in range(3):
                    g[c, r, j] = gl[3 * r + j, c]


# ============================================================================ GEMMs
# OpenBLAS from numba (`blas.nb_gemm`), or on AVX-512 hosts (NT_GEMM, NN_GEMM) two register-blocked forms
# whose operands need no packing: `nt_gemm` (c = a @ b.T, both read along their rows) and `nn_gemm`
# (c = a @ b, b's rows read in place).
NT_GEMM = NN_GEMM = x86_avx512()

# The weight gradients' GEMMs c = a @ b.T reduce along the rows of both operands (positions, patches).
# OpenBLAS (SkylakeX kernels) ran that transposed-B form at 79-96 GFLOP/s on one Emerald Rapids core in the
# training step, 80-120 alone (the row-major NN form 100-150); `nt_gemm`'s 4 x 4 blocks of dot products
# run 125-145 alone at reductions of 256-1568 (the 4 a rows stay in L1, b streams from L2). Below NT_MIN_K
# the fold of the 16 sums a block costs too much (91 against OpenBLAS's 114 at 128). Only where AVX-512
# holds the 16 + 8 vectors in registers (on AVX2 each would be two halves: 48 registers of 16).
NT_MIN_K = 256
NT_KC = 1024        # terms a dot4x4 call reduces (4 rows of a: 16 KB, in L1)


@nb.njit(**JIT)
def nt_gemm(af, ao, lda, bf, bo, ldb, cf, co, ldc, m, n, k, add):
    """c[i, j] (= or += with add) sum over q < k of a[i, q] * b[j, q], i < m, j < n, for row-major
    operands in flat float32 arrays: x[i, q] = xf[xo + i ldx + q]. 4 x 4 blocks of dot products
    (`_nb.dot4x4`) over equal chunks of <= NT_KC terms (a block's 4 a rows stay in L1), the chunks' sums added
    in order; the last m % 4 rows and n % 4 columns from blocks that overlap the last whole ones,
    computed into a scratch block of which only the new rows / columns are kept (scalar loops where
    m or n < 4). Deterministic (the same bits for every call), other last bits than OpenBLAS's."""
    if m < 4 or n < 4:
        for i in range(m):
            for j in range(n):
                t = np.float32(0.0)
                for q in range(k):
                    t += af[ao + i * lda + q] * bf[bo + j * ldb + q]
                c = co + i * ldc + j
                cf[c] = cf[c] + t if add else t
        return
    m4, n4 = m // 4 * 4, n // 4 * 4
    tmp = np.empty(16, np.float32)
    step = -(-k // max(1, -(-k // NT_KC)))            # equal chunks of <= NT_KC terms
    for q0 in range(0, max(k, 1), max(step, 1)):
        kc = min(step, k - q0)
        acc = add or q0 > 0
        for i in range(0, m, 4):
            for j in range(0, n, 4):
                if i < m4 and j < n4:
                    dot4x4(cf, co + i * ldc + j, ldc, af, ao + i * lda + q0, lda, bf, bo + j * ldb + q0, ldb,
                           kc, acc)
                    continue
                i0, j0 = min(i, m - 4), min(j, n - 4)       # the overlapping block's corner
                dot4x4(tmp, 0, 4, af, ao + i0 * lda + q0, lda, bf, bo + j0 * ldb + q0, ldb, kc, False)
                for r in range(i - i0, 4):
                    for s in range(j - j0, 4):
                        c = co + (i0 + r) * ldc + j0 + s
                        cf[c] = cf[c] + tmp[4 * r + s] if acc else tmp[4 * r + s]


# The forward and input-gradient GEMMs c = a @ b (b's rows: patches or positions) on `nn_gemm` where the
# reduction is at most NN_MAX_K (longer ones: OpenBLAS, whose packing pays there: 132 against 116 GFLOP/s
# at 1152) and the blocks fit (>= 6 rows, >= 16 columns). 576 (a 64-channel 3x3 im2col: ResNet18's strided
# layer2 forward, 128 x 576 x 392 a task) ran 7.5 -> 6.8 ms of CPU a conv on nn_gemm; 1152 went 7.7 -> 8.3.
NN_MAX_K = 576
# ... and at most NN_MAX_K_T when a is read transposed (the input gradient's U^T: a block's 6 rows are 6
# floats of each of k rows of U, k cache lines that L1 no longer holds at k = 512: 96 GFLOP/s in the step
# against OpenBLAS's 108; 122-135 against 113-115 at k = 64-256)
NN_MAX_K_T = 256


@nb.njit(**JIT)
def nn_gemm(af, ao, sar, saq, bf, bo, ldb, cf, co, ldc, m, n, k):
    """c[i, j] = sum over q < k of a[i, q] * b[q, j], i < m, j < n (m >= 6, n >= 16, k > 0), for
    operands in flat float32 arrays: a[i, q] = af[ao + i sar + q saq] (a or a transpose), b[q, j] =
    bf[bo + q ldb + j], c[i, j] = cf[co + i ldc + j]. Blocks of 6 rows x 64 columns (`_nb.gemm6`, b's
    rows read in place: no packing, the block's 64 columns of b stay in L1 or L2 while its rows' terms
    run); the last rows and columns by blocks that overlap the ones before (each element's sum is the
    same whichever block computes it). 115-160 GFLOP/s on one Emerald Rapids core where OpenBLAS ran
    106-135 (k = 64-256; the stem's 147-deep cols 151 against 124)."""
    for j in range(0, n, 64):
        w = min(64, n - j)
        nv = (w + 15) // 16
        last = w - 16 if w % 16 else 16 * (nv - 1)     # the last vector's column in the block
        for i in range(0, m, 6):
            i0 = min(i, m - 6)
            cb, ab, bb = co + i0 * ldc + j, ao + i0 * sar, bo + j
            if nv == 4:
                gemm6(cf, cb, ldc, af, ab, sar, saq, bf, bb, ldb, k, last, 4)
            elif nv == 3:
                gemm6(cf, cb, ldc, af, ab, sar, saq, bf, bb, ldb, k, last, 3)
            elif nv == 2:
                gemm6(cf, cb, ldc, af, ab, sar, saq, bf, bb, ldb, k, last, 2)
            else:
                gemm6(cf, cb, ldc, af, ab, sar, saq, bf, bb, ldb, k, last, 1)


@nb.njit(inline="always", **JIT)
def nn_fits(m, kd, n):
    """Whether nn_gemm takes an (m, kd) @ (kd, n) product (else OpenBLAS)."""
    return NN_GEMM and m >= 6 and n >= 16 and 0 < kd <= NN_MAX_K


# ============================================================================ tasks

@nb.njit(**JIT)
def wino_gemms(fn, A, B, Cm, a0, m, kd, n, b0, beta, trans_b):
    """Cm[xi, :m, :n] = A[xi, a0:a0 + m, :kd] @ op(B[xi]) (+ beta*Cm) for every plane xi of A (16 or
    36), op(B[xi]) = B[xi, :n, b0:b0 + kd].T if trans_b else B[xi, :kd, b0:b0 + n] (blas.nb_gemm)."""
    for k in range(A.shape[0]):
        if trans_b:
            nb_gemm(fn, A[k, a0:a0 + m, :kd], B[k, :n, b0:b0 + kd], Cm[k, :m, :n], beta, True)
        else:
            nb_gemm(fn, A[k, a0:a0 + m, :kd], B[k, :kd, b0:b0 + n], Cm[k, :m, :n], beta, False)


@nb.njit(**JIT)
def wino_gemms_nn(A, B, Cm, ar, ac, bc, cc, m, kd, n):
    """The 16 products Cm[xi, :m, cc:cc + n] = A[xi, ar:ar + m, ac:ac + kd] @ B[xi, :kd, bc:bc + n] on
    `nn_gemm` (whole C-contiguous buffers; `nn_fits(m, kd, n)`): the forward's (U's rows from ar, V's
    patches from bc) and the weight gradient's of few patches (D's patches from ac, V^T, dW's columns
    from cc)."""
    Af, Bf, Cf = A.reshape(-1), B.reshape(-1), Cm.reshape(-1)
    lda, ldb, ldc = A.shape[2], B.shape[2], Cm.shape[2]
    for k in range(A.shape[0]):
        nn_gemm(Af, (k * A.shape[1] + ar) * lda + ac, lda, 1, Bf, k * B.shape[1] * ldb + bc, ldb,
                Cf, k * Cm.shape[1] * ldc + cc, ldc, m, n, kd)


@nb.njit(**JIT)
def transpose_planes(V, VT, n, P):
    """VT[xi, p, c] = V[xi, c, p] for c < n, p < P (the weight gradient's V^T for `wino_gemms_nn`)."""
    for x in range(V.shape[0]):
        for c0 in range(0, n, 16):
            c1 = min(n, c0 + 16)
            for p in range(P):
                for c in range(c0, c1):
                    VT[x, p, c] = V[x, c, p]


@nb.njit(**JIT)
def wino_gemms_nt(A, B, Cm, a0, m, kd, n, b0, c0, beta):
    """The weight gradient's 16 products Cm[xi, :m, c0:c0 + n] (= or += with beta = 1) A[xi, a0:a0 + m,
    b0:b0 + kd] @ B[xi, :n, :kd]^T, both operands read along their rows (the patches): `blas.nt_gemm`
    (4 x 4 blocks of dot products) on the flat buffers."""
    Af, Bf, Cf = A.reshape(-1), B.reshape(-1), Cm.reshape(-1)
    lda, ldb, ldc = A.shape[2], B.shape[2], Cm.shape[2]
    for x in range(A.shape[0]):
        nt_gemm(Af, x * A.shape[1] * lda + a0 * lda + b0, lda, Bf, x * B.shape[1] * ldb, ldb,
                Cf, x * Cm.shape[1] * ldc + c0, ldc, m, n, kd, beta != 0.0)


@nb.njit(**JIT)
def wino_gemms_mirrored(fn, U, B, Cm, a0, m, kd, n, b0):
    """The input gradient's 16 GEMMs on the forward filters: Cm[xi, :m, :n] = Ud[xi, a0:a0 + m] @
    B[xi, :kd, b0:b0 + n] with Ud[xi] = U[mirror(xi)]^T (the rotated, transposed filters) read as
    U[mirror(xi), :kd, a0:a0 + m] with the GEMM's transposed-A flag: no Ud is built (building it
    cost 2-3x U's transform: 5.8 ms a 512 x 512 layer)."""
    if nn_fits(m, kd, n) and kd <= NN_MAX_K_T:
        Uf, Bf, Cf = U.reshape(-1), B.reshape(-1), Cm.reshape(-1)
        ldu, ldb, ldc = U.shape[2], B.shape[2], Cm.shape[2]
        for k in range(16):           # Ud[xi][i, q] = U[mirror(xi)][q, a0 + i]: a read transposed
            nn_gemm(Uf, _MIRROR[k] * U.shape[1] * ldu + a0, 1, ldu, Bf, k * B.shape[1] * ldb + b0, ldb,
                    Cf, k * Cm.shape[1] * ldc, ldc, m, n, kd)
        return
    for k in range(16):
        nb_gemm(fn, U[_MIRROR[k], :kd, a0:a0 + m], B[k, :kd, b0:b0 + n], Cm[k, :m, :n], 0.0, False, True)