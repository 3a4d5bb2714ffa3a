"""Training conv kernels (kernels/train_conv.py, kernels/train_winograd.py): every path against a
float64 PyTorch reference, with the fused pre-processing (BN step 2, shortcut Add, ReLU, stored
C2 input), the BN statistics epilogue, the backward pre-processing F1*dz + B*x + C and the
post-processing (error Add, ReLU', BN step-1 sums); results bitwise identical for 1, 2, 3 and 5
threads; the task grid has tasks for 16 cores on ResNet's layers.

Tolerances (float32 kernels, float64 reference): 1e-5 * max|reference| (+1e-6) for outputs and
gradients (GEMMs over <= 600 terms; Winograd's transforms add a few float32 roundings), 1e-4
relative for the BN sums (float64 sums of float32 values that cancel).
"""
from __future__ import annotations

import functools
import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tilefuse.kernels import blas, threads, train_conv as tc
from tilefuse.kernels.blas import blas_threads
from tilefuse.kernels.threads import using

# N, C, H, W, O, (kh, kw), stride, padding (t, b, l, r), dilation, groups
GEOMS = {
    "3x3-same": (3, 6, 9, 7, 5, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),       # Winograd / shift
    "3x3-same-4x4": (33, 16, 4, 4, 24, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),  # many images
    "3x3-s2": (2, 5, 8, 9, 6, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),         # gather, col2im
    "1x1": (4, 8, 5, 6, 7, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),           # direct
    "1x1-s2": (3, 8, 7, 7, 16, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1),
    "odd": (3, 4, 13, 11, 6, (2, 3), (2, 1), (1, 2, 0, 1), (2, 1), 2),         # groups, dilation
    "5x5-dil": (2, 6, 9, 9, 4, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 1),       # same, dilated
    "stem": (2, 3, 20, 20, 8, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1),
    # Winograd weight gradient on nt_gemm: 360 patches (>= NT_MIN_K, 8 past the last 16), 6 x 5 (edges)
    "3x3-same-nt": (5, 5, 16, 18, 6, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    # nn_gemm on channel blocks at offsets (>= 6 rows each with the "small" blocking, forward and input gradient)
    "3x3-same-96": (2, 96, 12, 12, 96, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    # Winograd F(4x4, 3x3) (small planes): odd sizes, a partial last tile both ways, fewer images than lanes
    "3x3-same-f4": (3, 6, 7, 5, 5, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    # ... and 20 images (a whole group of 16 lanes and 4), channels past 16 (the filter blocks)
    "3x3-same-f4-20": (20, 17, 8, 6, 24, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    # 63 channels in and out: Winograd planes of 64 rows (wg.pitch once looped forever there, seed 65000701)
    "3x3-f4-63": (1, 63, 5, 6, 63, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
}


def _pre(rng, C, shape, kind):
    """A Pre of the given kind and its float64 reference function (CNHW tensors)."""
    a = (1 + 0.2 * rng.standard_normal(C)).astype(np.float32)
    b = (0.2 * rng.standard_normal(C)).astype(np.float32)
    s = rng.standard_normal(shape).astype(np.float32)
    a2 = (1 + 0.2 * rng.standard_normal(C)).astype(np.float32)
    b2 = (0.2 * rng.standard_normal(C)).astype(np.float32)
    col = (lambda v: v.astype(np.float64).reshape(-1, 1, 1, 1))
    if kind == "none":
        return tc.IDENTITY, (lambda x: x.astype(np.float64))
    if kind == "bn-relu":
        return tc.Pre(a=a, b=b, relu=True), (lambda x: np.maximum(col(a) * x + col(b), 0))
    r = np.zeros(shape, np.float32)
    pre = tc.Pre(a=a, b=b, s=s, a2=a2, b2=b2, relu=True, r_out=r)
    return pre, (lambda x: np.maximum(col(a) * x + col(b) + col(a2) * s + col(b2), 0))


def _reference(x, w, bias, t, g, dyb, post_args):
    """float64 torch: y = conv(t(x)) + bias, its BN sums, the gradients for dy = dyb, and the
    post-processed input gradient with its sums."""
    xt = torch.tensor(t(x).transpose(1, 0, 2, 3).copy(), requires_grad=True)    # NCHW
    wt = torch.tensor(w.astype(np.float64), requires_grad=True)
    bt = torch.tensor(bias.astype(np.float64), requires_grad=True)
    pt, pb, pl, pr = g.pt, g.pb, g.pl, g.pr
    y = F.conv2d(F.pad(xt, (pl, pr, pt, pb)), wt, bt, (g.sh, g.sw), 0, (g.dh, g.dw), g.groups)
    y.backward(torch.tensor(dyb.transpose(1, 0, 2, 3).copy()))
    yc = y.detach().numpy().transpose(1, 0, 2, 3)
    dx = xt.grad.numpy().transpose(1, 0, 2, 3)
    acc, mk, ma, mb, x1, x2 = post_args
    v = dx + acc
    v = np.where(ma.reshape(-1, 1, 1, 1) * mk + mb.reshape(-1, 1, 1, 1) > 0, v, 0)
    sums = (v.sum(axis=(1, 2, 3)), (v * x1).sum(axis=(1, 2, 3)), (v * x2).sum(axis=(1, 2, 3)))
    return (yc, (yc.sum(axis=(1, 2, 3)), (yc ** 2).sum(axis=(1, 2, 3))), wt.grad.numpy(),
            bt.grad.numpy(), v, sums)


def _run(x, w, bias, g, pre, dy_pre, post_args, nthreads):
    with blas_threads(1), using(nthreads):
        stats = (np.zeros(g.O), np.zeros(g.O))
        y = tc.conv_forward_cnhw(x, w, g, bias=bias, pre=pre, stats=stats)
        post = tc.Post(*post_args)
        dw, db, dx = tc.conv_backward_cnhw(None, x, w, g, pre=pre, post=post, dy_pre=dy_pre,
                                           has_bias=True)
    r = pre.r_out.copy() if pre.r_out is not None else None
    return y, stats, dw, db, dx, (post.s1, post.s2a, post.s2b), r


def _close(name, got, ref, rel):
    ref = np.asarray(ref, np.float64)
    err = float(np.abs(np.asarray(got, np.float64) - ref).max())
    tol = rel * float(np.abs(ref).max()) + 1e-6
    assert err <= tol, f"{name}: max |error| {err:.3g} > {tol:.3g}"


# several channel blocks per layer (MIN_BLOCK is 128: these layers would get one): the forward runs
# several output-channel blocks per tile (the tiles' cols or V built once in a shared phase), the
# input gradient several input-channel blocks. "odd" has 3 output channels a group: one block.
_BLOCKINGS = [(geom, blocks) for geom in GEOMS for blocks in ("default", "small") if
              not (blocks == "small" and geom in ("odd", "3x3-f4-63"))]
# small tiles and (Winograd) short weight-gradient chunks: several tiles and several chunk groups whose
# partials `wino_dw` sums (the default plans of these small layers have one tile and one group)
_BLOCKINGS += [(geom, "chunks") for geom in GEOMS if geom.startswith("3x3-same")]


@pytest.mark.parametrize("winograd", [True, False])
@pytest.mark.parametrize("prekind", ["none", "bn-relu", "shortcut"])
@pytest.mark.parametrize("geom, blocks", _BLOCKINGS)
def test_conv_paths_match_torch_and_threads(geom, blocks, prekind, winograd, monkeypatch):
    if winograd and not tc.WINOGRAD:
        pytest.skip("Winograd needs numpy's OpenBLAS (blas.SGEMM)")
    monkeypatch.setattr(tc, "WINOGRAD", winograd)
    # plans made here stay here: a fresh cache (the small blocks' plans must not outlive the test)
    monkeypatch.setattr(tc, "plan", functools.lru_cache(maxsize=None)(tc.plan.__wrapped__))
    if blocks == "small":
        blocks_of = tc._blocks
        monkeypatch.setattr(tc, "_blocks", lambda rows, groups, ntiles: blocks_of(rows, groups, ntiles, 2))
        N, C, H, W, O, (kh, kw), st, pad, dil, groups = GEOMS[geom]
        p = tc.plan(tc.ConvGeom((N, C, H, W), (O, C // groups, kh, kw), st, pad, dil, groups).key)
        assert len(p.oblocks) > groups                                # several blocks indeed
    if blocks == "chunks":                 # (without Winograd: the shift im2col on small tiles)
        monkeypatch.setattr(tc, "MIN_COLS", 16)
        monkeypatch.setattr(tc, "WINO_DW_PATCHES", 16)
    N, C, H, W, O, (kh, kw), st, pad, dil, groups = GEOMS[geom]
    g = tc.ConvGeom((N, C, H, W), (O, C // groups, kh, kw), st, pad, dil, groups)
    assert not winograd or not geom.startswith("3x3-same") or tc._use_wino(g, np.float32)
    assert not winograd or tc._wino_geom(g)[0] == (4 if "f4" in geom else 2) or not tc._use_wino(g, np.float32)
    rng = np.random.default_rng(len(geom) + 7 * len(prekind))
    x = rng.standard_normal((C, N, H, W)).astype(np.float32)
    w = (rng.standard_normal((O, C // groups, kh, kw)) / np.sqrt(C * kh * kw)).astype(np.float32)
    bias = rng.standard_normal(O).astype(np.float32)
    pre, t = _pre(rng, C, x.shape, prekind)
    oshape = (O, N, g.ho, g.wo)
    dz, xb = rng.standard_normal(oshape).astype(np.float32), rng.standard_normal(oshape).astype(np.float32)
    f1, bb, cc = (rng.standard_normal(O).astype(np.float32) for _ in range(3))
    dyb = (f1.reshape(-1, 1, 1, 1).astype(np.float64) * dz + bb.reshape(-1, 1, 1, 1) * xb.astype(np.float64)
           + cc.reshape(-1, 1, 1, 1))
    post_args = (rng.standard_normal(x.shape).astype(np.float32), rng.standard_normal(x.shape).astype(np.float32),
                 (1 + 0.2 * rng.standard_normal(C)).astype(np.float32), (0.1 * rng.standard_normal(C)).astype(np.float32),
                 rng.standard_normal(x.shape).astype(np.float32), rng.standard_normal(x.shape).astype(np.float32))
    ref = _reference(x, w, bias, t, g, dyb, [a.astype(np.float64) for a in post_args])
    runs = {n: _run(x, w, bias, g, pre, (dz, xb, f1, bb, cc), post_args, n) for n in (1, 2, 3, 5)}
    y, stats, dw, db, dx, sums, r = runs[1]
    _close("y", y, ref[0], 1e-5)
    for got, want in zip(stats, ref[1]):
        _close("BN sums of y", got, want, 1e-4)
    _close("dw", dw, ref[2], 1e-5)
    _close("db", db, ref[3], 1e-5)
    _close("dx (post-processed)", dx, ref[4], 1e-5)
    for got, want in zip(sums, ref[5]):
        _close("BN sums of dx", got, want, 1e-4)
    if r is not None:
        np.testing.assert_allclose(r, t(x), rtol=1e-6, atol=1e-6)
    for n in (2, 3, 5):                       # bitwise identical for every thread count
        for a, b_ in zip(runs[1], runs[n]):
            if isinstance(a, tuple):
                assert all(np.array_equal(u, v) for u, v in zip(a, b_)), (geom, n)
            elif a is not None:
                assert np.array_equal(a, b_), (geom, n)


@pytest.mark.parametrize("seed", range(6))
def test_stride2_cols_equal_the_gather(seed):
    """`_cols_s2` (the im2col of convs of stride 2 along W: even columns of a zero-padded plane, 16, 8 or 4
    at a time, the last chunk overlapping) writes exactly the gather's cols (`_cols_gather`, the index
    table), for random kernels, row strides and dilations, paddings and widths (1-80 output columns),
    with a BN + ReLU input stage, on a channel and image sub-range."""
    rng = np.random.default_rng(seed)
    for _ in range(8):
        kh, kw = int(rng.integers(1, 8)), int(rng.integers(1, 8))
        sh, dh = int(rng.integers(1, 4)), int(rng.integers(1, 3))
        pt, pb, pl, pr = (int(v) for v in rng.integers(0, 4, 4))
        H, W = int(rng.integers(max(1, (kh - 1) * dh + 1 - pt - pb), 40)), int(rng.integers(max(1, kw - pl - pr), 160))
        N, C = 4, 5
        g = tc.ConvGeom((N, C, H, W), (3, C, kh, kw), (sh, 2), (pt, pb, pl, pr), (dh, 1), 1)
        x2 = rng.standard_normal((C, N * H * W)).astype(np.float32)
        a, b = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
        d2 = np.zeros((1, 1), np.float32)
        outs = []
        for f in ("s2", "gather"):
            cols = np.full((3 * kh * kw, 2 * g.ho * g.wo), np.nan, np.float32)
            args = (x2, a, b, d2, a, b, d2, cols, 1, 3, 1, 4)
            if f == "s2":
                tc._cols_s2(*args, H, W, kh, kw, sh, pt, pl, dh, g.ho, g.wo, True, 0, True, False)
            else:
                tc._cols_gather(*args, H * W, tc._gather_table(g.key), True, 0, True, False)
            outs.append(cols)
        np.testing.assert_array_equal(outs[0], outs[1], err_msg=str(g.key))


def test_tasks_run_on_several_threads(monkeypatch):
    """The split really hands tasks to pool threads (a sequential loop would pass the bitwise
    checks above), and ResNet18's layers with 28x28 or larger outputs at batch 32 have >= 16
    tasks per pass (smaller layers get fewer: tiles keep >= MIN_COLS GEMM columns)."""
    seen = set()
    real = threads.parallel_range
    other = threading.Event()      # a second thread took a task
    waited = []

    def spy(ntasks, fn, nthreads=None):
        def task(i, tid):
            seen.add(tid)
            if len(seen) > 1:
                other.set()
            elif ntasks > 1 and not waited:
                # the first thread holds its first task until another takes one (a loaded machine can let the
                # caller finish every small task before a woken worker gets one); a sequential loop never does
                waited.append(other.wait(10.0))
            fn(i, tid)
        real(ntasks, task, nthreads)
    monkeypatch.setattr(threads, "parallel_range", spy)
    N, C, H, W, O = 8, 16, 14, 14, 16
    g = tc.ConvGeom((N, C, H, W), (O, C, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    x = np.random.default_rng(0).standard_normal((C, N, H, W)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((O, C, 3, 3)).astype(np.float32)
    with blas_threads(1), using(3):
        for _ in range(5):
            tc.conv_forward_cnhw(x, w, g)
            tc.conv_backward_cnhw(np.ones((O, N, H, W), np.float32), x, w, g)
    assert len(seen) > 1, seen
    import tilefuse.models as models
    net = models.resnet18(seed=0, batch=32, image_size=112, num_classes=10)
    for op in net.ops:
        if op.op != "conv2d" or op.outputs[0].shape[2] < 28:
            continue
        p_ = op.params
        g = tc.ConvGeom(op.inputs[0].shape, op.inputs[1].shape, p_["stride"], p_["padding"],
                        p_["dilation"], p_["groups"])
        pl = tc.plan(g.key, 4, tc._use_wino(g, np.float32))
        assert len(pl.tiles) * len(pl.oblocks) >= 16, op.name


@pytest.mark.parametrize("N", [5, 7, 20, 32, 50, 64])
def test_image_tiles_are_even_and_a_power_of_two(N):
    """Image-range tiles split any batch into a power-of-two count (or N, one image each) of tiles whose sizes
    differ by at most one, covering every image once: 32 images in 7 tiles of 5 (5 x 6 + 2) left
    one of two threads idle for the last tile."""
    for C, H, O, k, s, p in [(64, 28, 64, 3, 1, 1), (128, 14, 128, 3, 1, 1), (128, 14, 256, 3, 2, 1),
                             (128, 14, 256, 1, 2, 0), (256, 7, 256, 3, 1, 1), (3, 112, 64, 7, 2, 3)]:
        g = tc.ConvGeom((N, C, H, H), (O, C, k, k), (s, s), (p, p, p, p), (1, 1), 1)
        for wino in (False, True) if k == 3 and s == 1 else (False,):
            tiles = tc.plan(g.key, 4, wino).tiles
            n = len(tiles)
            assert (n & (n - 1) == 0 and n <= N) or n == N, (g.key, tiles)
            assert [t[0] for t in tiles[1:]] == [t[1] for t in tiles[:-1]], tiles
            assert tiles[0][0] == 0 and tiles[-1][1] == N, tiles
            sizes = [b - a for a, b in tiles]
            assert max(sizes) - min(sizes) <= 1, (g.key, sizes)


def test_nb_gemm_matches_numpy():
    if not blas.SGEMM[0]:
        pytest.skip("numpy's OpenBLAS has no cblas_sgemm")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((13, 70)).astype(np.float32)
    b = rng.standard_normal((21, 70)).astype(np.float32)
    c = rng.standard_normal((13, 40)).astype(np.float32)
    want = c.copy()
    want[:, 3:24] += a @ b.T
    blas.nb_gemm(blas.SGEMM, a, b, c[:, 3:24], 1.0, True)
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5)
    out = np.empty((13, 21), np.float32)
    blas.nb_gemm(blas.SGEMM, a, np.ascontiguousarray(b.T), out, 0.0, False)
    np.testing.assert_allclose(out, a @ b.T, rtol=1e-5, atol=1e-5)
    lp64 = blas._symbol("scipy_cblas_sgemm")     # the 32-bit-integer interface, where present
    if lp64 is not None:
        import ctypes
        out[:] = 0
        blas.nb_gemm((ctypes.cast(lp64, ctypes.c_void_p).value, False), a, np.ascontiguousarray(b.T),
                     out, 0.0, False)
        np.testing.assert_allclose(out, a @ b.T, rtol=1e-5, atol=1e-5)


def _wino_v_reference(xt, H, W):
    """V[xi, c, n*T + t] = (B^T d B)[xi] of the zero-padded 4x4 patches, float64 numpy (xt: the
    transformed input (C, N, H, W))."""
    Bt = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
    C, N = xt.shape[:2]
    th, tw = (H + 1) // 2, (W + 1) // 2
    pad = np.zeros((C, N, 2 * th + 2, 2 * tw + 2))
    pad[:, :, 1:H + 1, 1:W + 1] = xt
    V = np.zeros((16, C, N * th * tw))
    for ty in range(th):
        for tx in range(tw):
            d = pad[:, :, 2 * ty:2 * ty + 4, 2 * tx:2 * tx + 4]          # (C, N, 4, 4)
            v = np.einsum("ij,cnjk,lk->cnil", Bt, d, Bt).reshape(C, N, 16)
            V[:, :, np.arange(N) * th * tw + ty * tw + tx] = v.transpose(2, 0, 1)
    return V


def test_wino_pitch_ends_for_every_row_count():
    """pitch(rows, P): a multiple of 16 >= P; the planes (rows + 1) * pitch floats apart miss the 4 KB
    multiples by >= 256 bytes where some pitch can (rows + 1 not a multiple of 64), and it returns
    where none can (it looped forever at rows = 63, 127, ...)."""
    from tilefuse.kernels import train_winograd as wg
    for rows in range(0, 300):
        for P in (1, 16, 17, 100, 1000):
            ld = wg.pitch(rows, P)
            assert ld >= P and ld % 16 == 0 and ld < P + 64 * 16
            if (rows + 1) % 64:
                assert ((rows + 1) * ld * 4 + 256) % 4096 >= 512, (rows, P, ld)
            else:
                assert ld == -(-P // 16) * 16


@pytest.mark.parametrize("H, W", [(1, 1), (2, 3), (3, 6), (3, 7), (6, 13), (9, 15), (4, 20), (16, 16), (17, 31),
                                  (2, 45), (33, 40), (5, 64)])
def test_wino_input_planes_vector_rows(H, W):
    """`_wino_input_planes` runs both stages on 16, 8 or 4 lanes at once, a row's last chunk
    overlapping the one before (widths 1-64: every chunk width, with and without the overlap)
    and images [1, 3) of 3 at a row / patch offset: B^T d B in float64, nothing else written."""
    from tilefuse.kernels import train_winograd as wg
    rng = np.random.default_rng(H * 100 + W)
    C, N, c0, c1, vr0, p0 = 4, 3, 1, 3, 2, 5
    T = ((H + 1) // 2) * ((W + 1) // 2)
    x2 = rng.standard_normal((C, N * H * W)).astype(np.float32)
    a, b = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    d2 = np.zeros((1, 1), np.float32)
    V = np.full((16, vr0 + C + 1, wg.pitch(vr0 + C, p0 + N * T)), np.nan, np.float32)
    wg._wino_input_planes(x2, a, b, d2, a, b, d2, V, vr0, p0, 1, N, c0, c1, H, W, True, 0, True, False)
    t = np.maximum(a[:, None] * x2.astype(np.float64) + b[:, None], 0)
    ref = _wino_v_reference(t[c0:c1].reshape(c1 - c0, N, H, W)[:, 1:], H, W)
    np.testing.assert_allclose(V[:, vr0:vr0 + c1 - c0, p0:p0 + (N - 1) * T], ref, rtol=1e-5, atol=1e-5)
    V[:, vr0:vr0 + c1 - c0, p0:p0 + (N - 1) * T] = np.nan
    assert np.isnan(V).all()


_WIDTHS = [(1, 1), (2, 3), (3, 6), (3, 7), (6, 13), (9, 15), (4, 20), (16, 16), (17, 31), (2, 45), (33, 40),
           (5, 64)]
# small planes of tasks of >= 8 images: the images as the vector lanes, patches tile-major
_LANES = [(4, 4, 20), (7, 7, 17), (5, 3, 18), (1, 1, 9), (8, 8, 40), (3, 6, 9)]


def _image_major(a, images, T):
    """The last axis of `a` (patches of `images` images in the `lanes` order, tile-major) image-major."""
    lead = a.shape[:-1]
    return a.reshape(*lead, T, images).swapaxes(-1, -2).reshape(*lead, images * T)


@pytest.mark.parametrize("H, W, N", [(h, w, 3) for h, w in _WIDTHS] + _LANES)
def test_wino_output_vector_rows(H, W, N):
    """`wino_output` against float64 for images [1, N) and output rows at an offset; nothing else
    written: A^T m A of 16, 8 or 4 tiles at once (the last chunk overlapping, stored straight into
    y for even widths, cropped through a row buffer for odd ones), or of 16 images at once on small
    planes of tasks of >= 8 images (M's patches tile-major, `lanes`)."""
    from tilefuse.kernels import train_winograd as wg
    rng = np.random.default_rng(H * 100 + W + 1)
    rows, o0 = 3, 2
    th, tw = (H + 1) // 2, (W + 1) // 2
    T = th * tw
    M = rng.standard_normal((16, rows + 1, wg.pitch(rows, N * T))).astype(np.float32)
    y = np.full((o0 + rows + 1, N * H * W), np.nan, np.float32)
    wg.wino_output(M, rows, y, 1, N, o0, H, W)
    At = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)
    m = M[:, :rows, :(N - 1) * T].astype(np.float64)
    if wg.lanes(W, N - 1):
        m = _image_major(m, N - 1, T)
    m = m.reshape(4, 4, rows, N - 1, th, tw)
    t = np.einsum("ia,abrnyx,jb->rnyixj", At, m, At).reshape(rows, N - 1, 2 * th, 2 * tw)[:, :, :H, :W]
    got = y[o0:o0 + rows].reshape(rows, N, H, W)
    np.testing.assert_allclose(got[:, 1:], t, rtol=1e-5, atol=1e-5)
    got[:, 1:] = np.nan
    assert np.isnan(y).all()


@pytest.mark.parametrize("H, W, N", [(h, w, 3) for h, w in _WIDTHS] + _LANES)
def test_wino_dy_vector_rows(H, W, N):
    """`wino_dy` against float64 for images [1, N) and channels [1, 3) at a row / patch offset;
    nothing else written: A g A^T of 16, 8 or 4 tiles of dy at once (read from dy's rows for even
    widths, from zero-padded copies for odd ones and the last row of odd heights), or of 16 images
    at once on small planes of tasks of >= 8 images (D's patches tile-major, `lanes`)."""
    from tilefuse.kernels import train_winograd as wg
    rng = np.random.default_rng(H * 100 + W + 2)
    O, dr0, p0 = 4, 2, 5
    th, tw = (H + 1) // 2, (W + 1) // 2
    T = th * tw
    dy = rng.standard_normal((O, N * H * W)).astype(np.float32)
    D = np.full((16, dr0 + 3, wg.pitch(dr0 + 2, p0 + N * T)), np.nan, np.float32)
    wg.wino_dy(dy, D, dr0, p0, 1, N, 1, 3, H, W)
    A = np.array([[1, 0], [1, 1], [1, -1], [0, -1]], np.float64)
    g = np.zeros((2, N - 1, 2 * th, 2 * tw))
    g[:, :, :H, :W] = dy[1:3].reshape(2, N, H, W)[:, 1:]
    g = g.reshape(2, N - 1, th, 2, tw, 2)
    ref = np.einsum("ai,onyixj,bj->abonyx", A, g, A).reshape(16, 2, (N - 1) * T)
    got = D[:, dr0:dr0 + 2, p0:p0 + (N - 1) * T]
    np.testing.assert_allclose(_image_major(got, N - 1, T) if wg.lanes(W, N - 1) else got, ref, rtol=1e-6, atol=1e-6)
    got[:] = np.nan
    assert np.isnan(D).all()


@pytest.mark.parametrize("H, W, N", [(4, 4, 8), (4, 4, 33), (7, 7, 16), (5, 3, 17), (8, 6, 20)])
def test_wino_input_image_lanes_equal_planes(H, W, N):
    """train_winograd.wino_input's two forms: small planes with the images as the vector lanes
    (`_wino_input_lanes`) and one plane at a time (`_wino_input_planes`) give the same bits for
    every input stage (BN affine, shortcut with and without its BN, ReLU, the stored C2 input),
    at a row / patch offset and a channel sub-range; and both equal B^T d B in float64."""
    from tilefuse.kernels import train_winograd as wg
    assert W <= wg.LANES_MAX_W and N >= wg.LANES_MIN_IMAGES     # wino_input takes the lanes form
    rng = np.random.default_rng(H * 100 + W * 10 + N)
    C, c0, c1, vr0, p0 = 5, 1, 4, 2, 3
    T = ((H + 1) // 2) * ((W + 1) // 2)
    x2 = rng.standard_normal((C, N * H * W)).astype(np.float32)
    s2 = rng.standard_normal((C, N * H * W)).astype(np.float32)
    a, b, a2, b2 = (rng.standard_normal(C).astype(np.float32) for _ in range(4))
    d1, d2 = np.zeros(1, np.float32), np.zeros((1, 1), np.float32)
    for affine, skind, relu, write_r in [(False, 0, False, False), (True, 0, True, False),
                                         (True, 1, True, True), (True, 2, True, True), (False, 2, False, True)]:
        out = {}
        for name, f in (("lanes", wg._wino_input_lanes), ("planes", wg._wino_input_planes), ("entry", wg.wino_input)):
            V = np.full((16, vr0 + C + 1, wg.pitch(vr0 + C, p0 + N * T)), np.nan, np.float32)
            r2 = np.full((C, N * H * W), np.nan, np.float32) if write_r else d2
            f(x2, a if affine else d1, b if affine else d1, s2 if skind else d2, a2 if skind == 2 else d1,
              b2 if skind == 2 else d1, r2, V, vr0, p0, 0, N, c0, c1, H, W, affine, skind, relu, write_r)
            out[name] = (V, r2.copy())
        for name in ("lanes", "entry"):      # the same bits, the patches tile-major
            got = out[name][0].copy()
            got[:, :, p0:p0 + N * T] = _image_major(got[:, :, p0:p0 + N * T], N, T)
            np.testing.assert_array_equal(got, out["planes"][0], err_msg=f"{name} V {affine, skind}")
            np.testing.assert_array_equal(out[name][1], out["planes"][1], err_msg=f"{name} r {affine, skind}")
        # float64 reference of the written block; everything else untouched (NaN)
        t = x2.astype(np.float64)
        if affine:
            t = a[:, None] * t + b[:, None]
        if skind == 1:
            t = t + s2
        elif skind == 2:
            t = t + a2[:, None] * s2 + b2[:, None]
        if relu:
            t = np.maximum(t, 0)
        ref = _wino_v_reference(t[c0:c1].reshape(c1 - c0, N, H, W), H, W)
        V = out["planes"][0]
        got = V[:, vr0:vr0 + c1 - c0, p0:p0 + N * T]
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
        assert np.isnan(V[:, :vr0]).all() and np.isnan(V[:, vr0 + c1 - c0:]).all()
        assert np.isnan(V[:, :, :p0]).all() and np.isnan(V[:, :, p0 + N * T:]).all()
        if write_r:
            np.testing.assert_allclose(out["lanes"][1][c0:c1], t[c0:c1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("m, n, k", [(64, 64, 784), (13, 7, 37), (6, 9, 15), (5, 6, 300), (3, 7, 40),
                                     (9, 2, 33), (4, 4, 16), (8, 12, 2100), (7, 5, 0), (16, 16, 1)])
def test_nt_gemm_matches_float64(m, n, k):
    """train_winograd.nt_gemm (4 x 4 blocks of dot products along both operands' rows, a masked last
    step, equal chunks of <= NT_KC terms, overlapping edge blocks) against float64 numpy, = and +=, on
    operands and a result at offsets inside larger flat arrays: nothing else is written."""
    from tilefuse.kernels import train_winograd as wg
    rng = np.random.default_rng(m * 10000 + n * 100 + k)
    lda, ldb, ldc = k + 5, k + 19, n + 3
    ao, bo, co = 7, 3, 2 * ldc + 1
    af = rng.standard_normal(ao + m * lda + 16).astype(np.float32)
    bf = rng.standard_normal(bo + n * ldb + 16).astype(np.float32)
    a = af[ao:ao + m * lda].reshape(m, lda)[:, :k].astype(np.float64)
    b = bf[bo:bo + n * ldb].reshape(n, ldb)[:, :k].astype(np.float64)
    for add in (False, True):
        cf = rng.standard_normal(co + m * ldc + 9).astype(np.float32)
        keep = cf.copy()
        wg.nt_gemm(af, ao, lda, bf, bo, ldb, cf, co, ldc, m, n, k, add)
        c = cf[co:co + m * ldc].reshape(m, ldc)
        ref = a @ b.T + (keep[co:co + m * ldc].reshape(m, ldc)[:, :n] if add else 0)
        np.testing.assert_allclose(c[:, :n], ref, rtol=1e-5, atol=1e-5 * max(1, k) ** 0.5)
        written = np.zeros(cf.size, bool)
        written[co:co + m * ldc] = np.tile(np.arange(ldc) < n, m)
        np.testing.assert_array_equal(cf[~written], keep[~written])


@pytest.mark.parametrize("m, n, k", [(64, 392, 64), (6, 16, 1), (7, 17, 5), (13, 40, 147), (11, 100, 33),
                                     (25, 64, 512), (6, 130, 9)])
@pytest.mark.parametrize("transposed", [False, True])
def test_nn_gemm_matches_float64(m, n, k, transposed):
    """train_winograd.nn_gemm (blocks of 6 rows x 64 columns, b's rows in place, the last rows and columns
    by overlapping blocks, the last vector of a block at a column off 16) against float64 numpy, a read
    by rows or transposed, operands and result inside larger flat arrays: nothing else is written; and
    every element equals the one a single-row, single-column product gives (the overlaps store the same
    values)."""
    from tilefuse.kernels import train_winograd as wg
    rng = np.random.default_rng(m * 1000 + n + k)
    ld = (k + 3) if not transposed else (m + 5)
    sar, saq = (ld, 1) if not transposed else (1, ld)
    ao, bo, co, ldb, ldc = 5, 9, 3, n + 7, n + 2
    af = rng.standard_normal(ao + (m - 1) * sar + (k - 1) * saq + 1 + 11).astype(np.float32)
    bf = rng.standard_normal(bo + k * ldb + 4).astype(np.float32)
    a = np.array([[af[ao + i * sar + q * saq] for q in range(k)] for i in range(m)], np.float64)
    b = bf[bo:bo + k * ldb].reshape(k, ldb)[:, :n].astype(np.float64)
    cf = np.full(co + m * ldc + 6, np.nan, np.float32)
    wg.nn_gemm(af, ao, sar, saq, bf, bo, ldb, cf, co, ldc, m, n, k)
    c = cf[co:co + m * ldc].reshape(m, ldc)
    np.testing.assert_allclose(c[:, :n], a @ b, rtol=1e-5, atol=1e-5 * k ** 0.5)
    written = np.zeros(cf.size, bool)
    written[co:co + m * ldc] = np.tile(np.arange(ldc) < n, m)
    assert np.isnan(cf[~written]).all()
    # element (i, j) from a product of rows i-5..i and columns j-15..j alone
    for i, j in [(m - 1, n - 1), (0, 0), (m // 2, n // 2), (m - 1, 0)]:
        i0, j0 = max(0, i - 5), max(0, j - 15)
        if i0 + 6 > m or j0 + 16 > n:
            continue
        sub = np.full((6, 16), np.nan, np.float32).reshape(-1)
        wg.nn_gemm(af, ao + i0 * sar, sar, saq, bf, bo + j0, ldb, sub, 0, 16, 6, 16, k)
        assert sub.reshape(6, 16)[i - i0, j - j0] == c[i, j], (i, j)


def test_wino_gemms_nn_offsets():
    """train_winograd.wino_gemms_nn at row / column offsets of all three buffers (the forward's U rows and V
    patches, the weight gradient's D patches and dW columns), and transpose_planes, against float64."""
    from tilefuse.kernels import train_winograd as wg
    rng = np.random.default_rng(5)
    m, kd, n, ar, ac, bc, cc = 13, 37, 21, 3, 7, 5, 2
    A = rng.standard_normal((16, ar + m + 1, ac + kd + 3)).astype(np.float32)
    B = rng.standard_normal((16, kd + 2, bc + n + 4)).astype(np.float32)
    Cm = np.full((16, m + 2, cc + n + 3), np.nan, np.float32)
    wg.wino_gemms_nn(A, B, Cm, ar, ac, bc, cc, m, kd, n)
    ref = np.einsum("xik,xkj->xij", A[:, ar:ar + m, ac:ac + kd].astype(np.float64),
                    B[:, :kd, bc:bc + n].astype(np.float64))
    np.testing.assert_allclose(Cm[:, :m, cc:cc + n], ref, rtol=1e-5, atol=1e-5)
    Cm[:, :m, cc:cc + n] = np.nan
    assert np.isnan(Cm).all()
    V = rng.standard_normal((16, n + 1, kd + 5)).astype(np.float32)
    VT = np.full((16, kd, n + 2), np.nan, np.float32)
    wg.transpose_planes(V, VT, n, kd)
    np.testing.assert_array_equal(VT[:, :, :n], V[:, :n, :kd].transpose(0, 2, 1))
    assert np.isnan(VT[:, :, n:]).all()


@pytest.mark.parametrize("Q, C, O", [(1, 37, 21), (3, 20, 130), (2, 5, 3), (1, 528, 48)])
def test_wino_dw_matches_float64(Q, C, O):
    """train_winograd.wino_dw (dW[o, c] = G^T m G, m = the partials Mw[q, :, o, c] summed in order,
    vectorized over c) against float64 numpy, on a sub-range of output channels (the others stay
    untouched), channel counts off 16."""
    from tilefuse.kernels import train_winograd as wg
    rng = np.random.default_rng(Q * 1000 + C + O)
    Mw = rng.standard_normal((Q, 16, O, C)).astype(np.float32)
    G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])
    m = Mw.astype(np.float64).sum(axis=0).reshape(4, 4, O, C)
    ref = np.einsum("ai,aboc,bj->ocij", G, m, G)
    dw = np.full((O, C, 3, 3), np.nan, np.float32)
    wg.wino_dw(Mw, dw, 1, O)
    assert np.isnan(dw[0]).all()
    np.testing.assert_allclose(dw[1:], ref[1:], rtol=1e-5, atol=1e-5 * Q)


@pytest.mark.parametrize("O, C", [(37, 21), (16, 48), (5, 3), (130, 64)])
def test_wino_weights_match_float64(O, C):
    """train_winograd.wino_weights (U = G g G^T per filter, 16 filters a vector block) against
    float64 numpy, for channel counts that are not multiples of 16, on a sub-range (rows outside
    stay untouched); and the input gradient's GEMMs on U read transposed (`wino_gemms_mirrored`:
    Ud[xi, c, o] = U[mirror(xi), o, c], a sub-block of its rows at a patch offset) against numpy."""
    from tilefuse.kernels import train_winograd as wg
    rng = np.random.default_rng(O * 100 + C)
    w = rng.standard_normal((O, C, 3, 3)).astype(np.float32)
    G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])
    ref = np.einsum("ai,ocij,bj->aboc", G, w.astype(np.float64), G).reshape(16, O, C)
    U = np.full((16, O, C), np.nan, np.float32)
    wg.wino_weights(w.reshape(O, C * 9), U, 1, O)
    assert np.isnan(U[:, 0]).all()
    np.testing.assert_allclose(U[:, 1:], ref[:, 1:], rtol=1e-6, atol=1e-6)
    if not blas.SGEMM[0]:
        return                                   # (the GEMMs need numpy's OpenBLAS)
    U[:, 0] = rng.standard_normal((16, C))
    P, b0, c0, m = 23, 3, C // 3, C - C // 3
    vd = rng.standard_normal((16, O, b0 + P)).astype(np.float32)
    Md = np.full((16, m + 1, P + 2), np.nan, np.float32)
    wg.wino_gemms_mirrored(blas.SGEMM, U, vd, Md, c0, m, O, P, b0)
    mirror = [15, 13, 14, 12, 7, 5, 6, 4, 11, 9, 10, 8, 3, 1, 2, 0]
    Ud = U.astype(np.float64)[mirror].transpose(0, 2, 1)            # (16, C, O)
    want = Ud[:, c0:c0 + m] @ vd[:, :, b0:].astype(np.float64)
    np.testing.assert_allclose(Md[:, :m, :P], want, rtol=1e-4, atol=1e-4)
    assert np.isnan(Md[:, m]).all() and np.isnan(Md[:, :, P:]).all()


@pytest.mark.parametrize("H, W, N", [(7, 7, 20), (5, 8, 3), (8, 6, 17), (3, 5, 4), (7, 4, 33)])
def test_wino4_transforms_match_float64(H, W, N):
    """The F(4x4, 3x3) transforms of train_winograd (hand-factored expressions, the images as vector lanes)
    against float64 einsums of the paper's matrices (conv/winograd.py's BT4, G4, AT4): the input and dy
    transforms for images [1, N) and channels at a row / patch offset (patch p = tile * images + image),
    the output transform's H x W crop, U, the rotated Ud, and dW = G^T (sum of partials) G; nothing
    outside the written ranges is touched."""
    from tilefuse.kernels import train_winograd as wg
    from tilefuse.kernels.conv.winograd import AT4, BT4, G4
    rng = np.random.default_rng(H * 100 + W * 10 + N)
    th, tw = -(-H // 4), -(-W // 4)
    T, nn, C, c0, c1, vr0, p0 = th * tw, N - 1, 5, 1, 4, 2, 3
    x = rng.standard_normal((C, N, H, W)).astype(np.float32)
    pad = np.zeros((C, N, 4 * th + 2, 4 * tw + 2))
    pad[:, :, 1:H + 1, 1:W + 1] = x
    ld = wg.pitch(8, p0 + nn * T)
    V = np.full((36, 8, ld), np.nan, np.float32)
    d1, d2 = np.ones(1, np.float32), np.zeros((1, 1), np.float32)
    wg.wino_input(x.reshape(C, -1), d1, d1, d2, d1, d1, d2, V, vr0, p0, 1, N, c0, c1, H, W, False, 0, False,
                  False)
    for t in range(T):
        ty, tx = divmod(t, tw)
        d = pad[c0:c1, 1:, 4 * ty:4 * ty + 6, 4 * tx:4 * tx + 6]
        ref = np.einsum("ij,cnjk,lk->ilcn", BT4, d, BT4).reshape(36, c1 - c0, nn)
        got = V[:, vr0:vr0 + c1 - c0, p0 + t * nn:p0 + (t + 1) * nn]
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    assert np.isnan(V[:, :vr0]).all() and np.isnan(V[:, vr0 + c1 - c0:]).all()
    assert np.isnan(V[:, :, :p0]).all() and np.isnan(V[:, :, p0 + nn * T:]).all()
    # dy: A g A^T of the 4x4 tiles (zero past H x W)
    dy = rng.standard_normal((C, N, H, W)).astype(np.float32)
    dpad = np.zeros((C, N, 4 * th, 4 * tw))
    dpad[:, :, :H, :W] = dy
    D = np.full((36, 8, ld), np.nan, np.float32)
    wg.wino_dy(dy.reshape(C, -1), D, vr0, p0, 1, N, c0, c1, H, W)
    for t in range(T):
        ty, tx = divmod(t, tw)
        gt = dpad[c0:c1, 1:, 4 * ty:4 * ty + 4, 4 * tx:4 * tx + 4]
        ref = np.einsum("ji,cnjk,kl->ilcn", AT4, gt, AT4).reshape(36, c1 - c0, nn)
        got = D[:, vr0:vr0 + c1 - c0, p0 + t * nn:p0 + (t + 1) * nn]
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    assert np.isnan(D[:, :vr0]).all() and np.isnan(D[:, :, p0 + nn * T:]).all()
    # output: A^T m A, cropped, rows o0.. of y for images [1, N)
    rows, o0 = 3, 1
    M = rng.standard_normal((36, rows + 1, wg.pitch(rows, nn * T))).astype(np.float32)
    y = np.full((rows + 2, N * H * W), np.nan, np.float32)
    wg.wino_output(M, rows, y, 1, N, o0, H, W)
    got = y.reshape(rows + 2, N, H, W)
    for t in range(T):
        ty, tx = divmod(t, tw)
        m = M[:, :rows, t * nn:(t + 1) * nn].astype(np.float64).reshape(6, 6, rows, nn)
        ref = np.einsum("ia,abon,jb->onij", AT4, m, AT4)[:, :, :H - 4 * ty, :W - 4 * tx]
        h, w_ = ref.shape[2], ref.shape[3]
        np.testing.assert_allclose(got[o0:o0 + rows, 1:, 4 * ty:4 * ty + h, 4 * tx:4 * tx + w_], ref,
                                   rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    assert np.isnan(got[:o0]).all() and np.isnan(got[o0 + rows:]).all() and np.isnan(got[:, 0]).all()
    # filters: U (36, O, C) of rows [1, O), Ud (36, C, O) of the rotated filters for channels [1, C)
    O, Cw = 21, 19
    w = rng.standard_normal((O, Cw, 3, 3)).astype(np.float32)
    U = np.full((36, O, Cw), np.nan, np.float32)
    wg.wino4_weights(w.reshape(O, -1), U, 1, O)
    ref = np.einsum("ai,ocij,bj->aboc", G4, w.astype(np.float64), G4).reshape(36, O, Cw)
    assert np.isnan(U[:, 0]).all()
    np.testing.assert_allclose(U[:, 1:], ref[:, 1:], rtol=1e-5, atol=1e-6)
    Ud = np.full((36, Cw, O), np.nan, np.float32)
    wg.wino4_weights_mirrored(w.reshape(O, -1), Ud, 1, Cw)
    ref = np.einsum("ai,ocij,bj->abco", G4, w[:, :, ::-1, ::-1].astype(np.float64), G4).reshape(36, Cw, O)
    assert np.isnan(Ud[:, 0]).all()
    np.testing.assert_allclose(Ud[:, 1:], ref[:, 1:], rtol=1e-5, atol=1e-6)
    # dW = G^T m G, m = the 2 partials summed in order, rows [1, O)
    Mw = rng.standard_normal((2, 36, O, Cw)).astype(np.float32)
    dw = np.full((O, Cw, 3, 3), np.nan, np.float32)
    wg.wino_dw(Mw, dw, 1, O)
    m = (Mw[0] + Mw[1]).astype(np.float64).reshape(6, 6, O, Cw)
    ref = np.einsum("ai,aboc,bj->ocij", G4, m, G4)
    assert np.isnan(dw[0]).all()
    np.testing.assert_allclose(dw[1:], ref[1:], rtol=1e-5, atol=1e-5)


def test_wino4_error_at_resnet_width():
    """F(4x4, 3x3)'s float32 error at a ResNet layer's width (256 channels, 7x7 planes), against float64
    PyTorch: its transforms' coefficients (up to 8 and 1/24) and the 256-term sums make it 10-20x F(2x2)'s
    (~5e-7 of the largest value there): y, dx and dW within 5e-5 of their largest values (measured 1e-5 at
    batch 32)."""
    rng = np.random.default_rng(5)
    N, C, H = 4, 256, 7
    g = tc.ConvGeom((N, C, H, H), (C, C, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    if not tc._use_wino(g, np.float32):
        pytest.skip("Winograd needs numpy's OpenBLAS (blas.SGEMM)")
    assert tc._wino_geom(g)[0] == 4
    x = rng.standard_normal((C, N, H, H)).astype(np.float32)
    w = (rng.standard_normal((C, C, 3, 3)) / np.sqrt(9 * C)).astype(np.float32)
    dy = rng.standard_normal((C, N, H, H)).astype(np.float32)
    with blas_threads(1), using(2):
        y = tc.conv_forward_cnhw(x, w, g)
        dw, _, dx = tc.conv_backward_cnhw(dy, x, w, g)
    xt = torch.tensor(x.transpose(1, 0, 2, 3).astype(np.float64), requires_grad=True)
    wt = torch.tensor(w.astype(np.float64), requires_grad=True)
    yt = F.conv2d(xt, wt, padding=1)
    yt.backward(torch.tensor(dy.transpose(1, 0, 2, 3).astype(np.float64)))
    _close("y", y, yt.detach().numpy().transpose(1, 0, 2, 3), 5e-5)
    _close("dx", dx, xt.grad.numpy().transpose(1, 0, 2, 3), 5e-5)
    _close("dw", dw, wt.grad.numpy(), 5e-5)
