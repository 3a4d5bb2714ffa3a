"""Grouped convolution on NCHW16c (1 < groups < C_in) through the blocked direct kernels, issue 9.

A grouped conv is block-diagonal: output channel co reads the cg = C_in/groups input channels of
its group g = co // og (og = C_out/groups). In NCHW16c the unit of work is a 16-channel block,
so the groups are bundled into *block groups* of L consecutive groups, L the smallest count with
L*cg and L*og both multiples of 16:

    L = lcm(16 / gcd(16, cg), 16 / gcd(16, og))
    block group j: input blocks [j*Cbg, (j+1)*Cbg), output blocks [j*Obg, (j+1)*Obg),
                   Cbg = L*cg/16, Obg = L*og/16, G' = ceil(groups / L) block groups

and each block group is an ordinary dense conv of Cbg input blocks to Obg output blocks, run by
the register-blocked direct kernel of `direct.py` (`_direct_rows2`, 7 positions x 2 output
blocks, an odd Obg's last block in the first slot only; 5 x 1 on AVX2) on views of the block group's
channels, with the band copy that folds the zero padding into the task (`direct._pad_band`).
The packed weights are dense 16x16 tiles with zeros where an input and an output channel of the
block group belong to different groups:

  - cg and og multiples of 16 (ResNeXt's wide stages, most grouped 1x1s): L = 1, no zero
    weights, exactly the direct kernel per group;
  - smaller groups (RegNet's group width 8, ResNeXt's 4): L = 16/cg for og = cg, each output
    channel multiplies L*cg inputs of which cg are its own: L times the FLOPs of the group conv,
    still one vector FMA per 16 output channels. `applies()` admits L <= MAX_WASTE; beyond that
    (or when the cost model prefers it) the im2col fallback runs the layer in NCHW.

Exactness: the zero weights add 0 * x for the other groups' inputs of the same block group, which
is +0 for every finite x; a non-finite input (inf/NaN) in one group therefore also reaches the
other groups of its block group (the reference would keep it in its own group). The padded
channels (C not a multiple of 16) are zero on both sides, as everywhere in NCHW16c.

Tasks are (image, block group, band of output rows), from the shape only: any thread count gives
bitwise identical results.

Groups inside one block (cg == og in 2, 4, 8: RegNet's group width 8) do not take this form:
`prepare` hands them to `grouped_lanes.py` (cg FMAs per tap on lane-permuted inputs, no zero
weights, an inf/NaN stays in its group), and `run_nchwc` / `run` dispatch on the prepared weight's
rank (5: lanes, 7: block-group tiles). `prepare(..., form="tiles")` keeps the tile form for them
(benchmarks/grouped_layers.py compares the two).
"""
from __future__ import annotations


import numpy as np
from numba import njit

from tilefuse.kernels.conv import grouped_lanes
from tilefuse.kernels.conv._nb import LANES
from tilefuse.kernels.conv.direct import ALL_LIVE, _direct_rows2, _pad_band
from tilefuse.kernels.conv.epilogue import EMPTY1, bias_or_zeros, resolve_act
from tilefuse.kernels.conv.layout import from_nchwc, to_nchwc
from tilefuse.kernels.conv.planner import grouped_bundle as bundle
from tilefuse.kernels.conv.planner import grouped_lanes_applies as lanes_applies
from tilefuse.kernels.conv.planner import plan_grouped_rows, plan_grouped_tasks
from tilefuse.kernels.threads import parallel_for, scratch

MAX_WASTE = 4   # largest L (FLOPs multiplied by L) the blocked grouped form takes on


def applies(cin: int, cout: int, groups: int) -> bool:
    """The blocked grouped forms: real groups (not depthwise, not dense), inside one block (the lanes
    kernel, any of cg = og = 2, 4, 8) or bundled into block groups with at most MAX_WASTE."""
    if groups <= 1 or cin % groups or cout % groups or cin // groups == 1:
        return False
    return lanes_applies(cin, cout, groups) or bundle(cin, cout, groups)[0] <= MAX_WASTE


def uses_lanes(prepared) -> bool:
    """Is this prepared layer in the lanes form (grouped_lanes.py: weight (Ob, KH, KW, cg, 16))?"""
    return getattr(prepared["weight"], "ndim", 0) == 5


def prepare(w, b, groups: int, form: str | None = None) -> dict:
    """w (Co, Cg, KH, KW) -> the lanes form when the groups fit inside one block (grouped_lanes.prepare:
    {"weight": (Ob, KH, KW, cg, 16), "bias": (Ob*16,)}) unless form="tiles"; otherwise
    {"weight": (G', Obg, Cbg, KH, KW, 16ci, 16co), "bias": (G'*Obg*16,)}: the block groups' dense
    tiles (direct.pack_weights' layout per block group), zero between groups."""
    w = np.asarray(w, np.float32)
    co, cg, kh, kw = w.shape
    ci = cg * groups
    if form not in (None, "lanes", "tiles"):
        raise ValueError(f"grouped: form {form!r} unknown; expected 'lanes' or 'tiles'")
    if co % groups:
        raise ValueError(f"grouped: {co} output channels not divisible by groups={groups}")
    if form == "lanes" or (form is None and lanes_applies(ci, co, groups)):
        return grouped_lanes.prepare(w, b, groups)
    og = co // groups
    L, cbg, obg, gp = bundle(ci, co, groups)
    # dense (G'*Obg*16 outputs, Cbg*16 inputs of the block group) with zeros between groups
    dense = np.zeros((gp, obg * LANES, cbg * LANES, kh, kw), np.float32)
    for g in range(groups):
        j, k = divmod(g, L)                      # block group, group within it
        dense[j, k * og:(k + 1) * og, k * cg:(k + 1) * cg] = w[g * og:(g + 1) * og]
    # (G', Obg*16co, Cbg*16ci, KH, KW) -> (G', Obg, 16co, Cbg, 16ci, KH, KW) -> (G', Obg, Cbg, KH, KW, 16ci, 16co)
    wt = dense.reshape(gp, obg, LANES, cbg, LANES, kh, kw).transpose(0, 1, 3, 5, 6, 4, 2)
    bias = np.zeros(gp * obg * LANES, np.float32)
    bias[:co] = bias_or_zeros(b, co)
    return {"weight": np.ascontiguousarray(wt), "bias": bias}


@njit(nogil=True, cache=True)
def _groups_task(of, xf, wt, bias, rf, has_res, band, i, j0, j1, r0, r1, geo, code, al, be):
    """Block groups [j0, j1) of image i, output rows [r0, r1): per block group, views of its
    channel blocks (and the zero-bordered band copy when there is padding) handed to the direct
    kernel. One call per task (numba calls numba directly: no per-group dispatch from Python).
    of / rf / xf: the flat tensors (contiguous 1-D slices reshape to the kernels' 4-D views);
    geo = (Cb, H, W, Ob, Ho, Wo, Cbg, Obg, KH, sh, sw, dh, dw, t, l, Wp, padded)."""
    cb, h, w, ob, ho, wo, cbg, obg = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7]
    kh, sh, sw, dh, dw, t, l, wp, padded = geo[8], geo[9], geo[10], geo[11], geo[12], geo[13], geo[14], geo[15], \
        geo[16]
    x0 = r0 * sh                                        # first padded input row of the band
    nrows = (r1 - 1 - r0) * sh + (kh - 1) * dh + 1
    P = ho * wo * 16
    for j in range(j0, j1):
        c0, c1 = j * cbg, min((j + 1) * cbg, cb)
        o0, o1 = j * obg, min((j + 1) * obg, ob)
        # (1, blocks, Ho*Wo, 16) views of block group j of image i
        ov = of[(i * ob + o0) * P:(i * ob + o1) * P].reshape(1, o1 - o0, ho * wo, 16)
        if has_res:
            rv = rf[(i * ob + o0) * P:(i * ob + o1) * P].reshape(1, o1 - o0, ho * wo, 16)
        else:
            rv = rf[:0].reshape(0, 0, 0, 16)
        if o1 - o0 == obg and c1 - c0 == cbg:
            wg = wt[j]
        else:
            wg = np.ascontiguousarray(wt[j, :o1 - o0, :c1 - c0])
        bg = bias[o0 * 16:o1 * 16]
        xin = xf[(i * cb + c0) * h * w * 16:(i * cb + c1) * h * w * 16]
        if padded:
            bd = band[:(c1 - c0) * nrows * wp * 16].reshape(1, c1 - c0, nrows, wp, 16)
            _pad_band(bd, xin.reshape(1, c1 - c0, h, w, 16), 0, x0 - t, l, kh, dh, sh, r1 - r0)
            xv = band[:(c1 - c0) * nrows * wp * 16].reshape(1, c1 - c0, nrows * wp, 16)
            xr0 = x0
            live = (t, t + h, l, l + w)          # the image inside the padded plane
        else:
            xv = xin.reshape(1, c1 - c0, h * w, 16)
            xr0 = 0
            live = ALL_LIVE
        _direct_rows2(ov, 0, 0, xv, 0, xr0, wg, r0, r1, wo, wp, sh, sw, dh, dw, bg, rv, has_res, code, al, be, 0,
                      o1 - o0, live)


_rows, plan_tasks = plan_grouped_rows, plan_grouped_tasks   # planner.py


def run_nchwc(out_b, x_b, prepared, residual_b=None, *, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
              relu=False, act=None, threads=None) -> None:
    """x_b (N, Cb, H, W, 16) unpadded -> out_b (N, Ob, Ho, Wo, 16), y = act(conv + bias + residual).

    The block groups' channel ranges of x_b / out_b may run past the tensors' blocks (the last block
    group of a layer whose group count is not a multiple of L): those blocks are all padding (zero
    weights), so the views are clipped to the tensors."""
    if uses_lanes(prepared):
        grouped_lanes.run_nchwc(out_b, x_b, prepared, residual_b, stride=stride, padding=padding, dilation=dilation,
                                relu=relu, act=act, threads=threads)
        return
    code, al, be = resolve_act(relu, act, "grouped")
    wt, bias = prepared["weight"], prepared["bias"]
    gp, obg, cbg, kh, kw = wt.shape[:5]
    n, cb, h, w, _ = x_b.shape
    _, ob, ho, wo, _ = out_b.shape
    if gp * obg < ob or gp * cbg < cb or bias.shape != (gp * obg * LANES,):
        raise ValueError(f"grouped (NCHWc): weight {wt.shape} / bias {bias.shape} cover {gp * cbg} input / "
                         f"{gp * obg} output blocks, tensors have {cb} / {ob}")
    t, b, l, r = padding
    padded = padding != (0, 0, 0, 0)
    wp = w + l + r
    rows = _rows(cbg, obg, kh, kw, stride, dilation, ho, wo, wp, padded)
    has_res = residual_b is not None
    of, xf = out_b.reshape(-1), x_b.reshape(-1)       # flat views, no copy
    rf = residual_b.reshape(-1) if has_res else EMPTY1
    geo = np.array([cb, h, w, ob, ho, wo, cbg, obg, kh, stride[0], stride[1], dilation[0], dilation[1], t, l, wp,
                    int(padded)], np.int64)
    tasks = plan_tasks(n, gp, cbg, obg, kh, kw, ho, wo, rows)
    band_size = cbg * ((rows - 1) * stride[0] + (kh - 1) * dilation[0] + 1) * wp * LANES if padded else 0

    def task(tk):
        band = scratch("grouped_pad", band_size) if padded else EMPTY1
        _groups_task(of, xf, wt, bias, rf, has_res, band, tk[0], tk[1], tk[2], tk[3], tk[4], geo, code, al, be)

    parallel_for(task, tasks, threads)


def run(out, x, prepared, residual=None, *, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), relu=False,
        act=None, threads=None) -> None:
    """NCHW in, NCHW out: block the input (and residual), run the NCHW16c kernel, unblock."""
    n, co, ho, wo = out.shape
    rb = to_nchwc(residual, threads=threads) if residual is not None else None
    ob = prepared["weight"].shape[0] if uses_lanes(prepared) else -(-co // LANES)
    out_b = np.empty((n, ob, ho, wo, LANES), np.float32)
    run_nchwc(out_b, to_nchwc(x, threads=threads), prepared, rb, stride=stride, padding=padding, dilation=dilation,
              relu=relu, act=act, threads=threads)
    from_nchwc(out_b, co, out=out, threads=threads)
