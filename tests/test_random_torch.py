"""Seeded random PyTorch modules (tests/random_torch.py; longer runs: its command line) through the paths a user
takes, against PyTorch and ONNX Runtime: `from_torch` -> compile -> Session on 1-3 threads, the streamed
schedule, both torch ONNX exporters -> `from_onnx`, and one training step (`random_torch.build_trainable` and
`build_train_modern` -> Trainer) against float64 PyTorch autograd. The modules are written in model-code idioms
(in-place activations, `x.ndim` checks, `x.size(1) // g` shuffles, `chunk`, `x[:, :c]`, `F.interpolate`,
permute-LayerNorm-Linear-permute, `F.pad` matching a skip's size, SPPF, Focus's strided slices, ASPP, functional
spellings; a fifth of the batch norms swapped for GroupNorm or InstanceNorm2d). 45, 46 and 97 crop with a negative `F.pad` (refused before this file existed); 37, 69, 321 and 344 put a padded
ceil-mode pool where the TorchScript exporter writes a broken file (shapes by ONNX's pre-opset-22 rule: ONNX
Runtime fails on 321 and 344, 37 and 69 declare an output shape PyTorch does not produce), which from_onnx must
refuse by name or run as PyTorch does. 61000165 drew a hardshrink whose input came within float32 rounding of its
lambda (every runtime rounds that input differently): `random_torch.build` now moves such thresholds off the
data."""
from __future__ import annotations

import pytest

import random_torch as RT

TORCH_SEEDS = list(range(0, 40)) + [45, 46, 97, 61000165, 66000438]   # 66000438: a draw float32 rounding decides
ONNX_SEEDS = list(range(0, 24)) + [37, 45, 69, 321, 344, 61000165]
# seeds from random_torch.FLIPS_FROM draw flips around blocks (`_Flipped`: test-time augmentation, x.flip(1),
# x[:, [2, 1, 0]], flipped inputs and outputs); 109000033 drew the x[:, idx] that from_torch refused before
FLIP_SEEDS = {109000033: {"out_h", "channels", "index"}, 109000036: {"tta", "out_hw"},
              109000037: {"out_hw", "out_h", "channels", "in_w"}}
TORCH_SEEDS += list(FLIP_SEEDS)
ONNX_SEEDS += [109000033, 109000037]
# seeds from random_torch.WARPS_FROM draw grid_sample warps around blocks (`_Warped`: RAFT's flow warp, an STN's
# affine_grid of a computed theta, a constant quarter-pixel shift, nearest or bilinear) and sin / cos activations
# (`_Periodic`); 126000006's affine_grid has a one-pixel axis, whose ATen decomposition PyTorch's own
# run_decompositions rejected (from_torch keeps affine_grid_generator whole since)
WARP_SEEDS = {126000004: ({("affine", "bilinear"), ("shift", "bilinear")}, {"snake"}),
              126000006: ({("affine", "bilinear"), ("flow", "bilinear"), ("shift", "nearest")}, {"cos"}),
              126000008: ({("flow", "bilinear"), ("shift", "bilinear"), ("shift", "nearest")}, {"siren"})}
TORCH_SEEDS += list(WARP_SEEDS)
ONNX_SEEDS += [126000006, 126000008]
# seeds from random_torch.MASKS_FROM follow blocks with masked assignments and bool arithmetic (`_Masked` kinds),
# 0-d statistics and cumsum box filters (`_Statistic`), and pad convs circularly; 131000012's count
# `(x > t).sum(1)` exports as Cast(bool -> int64) + ReduceSum, refused by from_onnx before
MASK_SEEDS = {131000000: ({5, 6}, {"running", "standardize"}, 1),
              131000012: ({3, 4, 5}, {"max", "norm", "standardize", "var_mean"}, 2),
              131000016: ({4}, {"box", "max", "var_mean"}, 1),
              131000026: ({2, 3}, {"norm", "standardize", "var_mean"}, 0)}
TORCH_SEEDS += list(MASK_SEEDS)
ONNX_SEEDS += [131000012, 131000016]
# from ORDER_FROM: blocks followed by `_Ordered` (10 sort, 11 median, 12 top-k, 13 kthvalue, 14 a -inf masked
# softmax, 15 any, 16 log2 / exp2, 17 an antialiased shrink); 145000453 and 145000456 export sort / topk as TopK,
# refused by from_onnx before
ORDER_SEEDS = {143000008: {11, 12, 17}, 143000021: {14, 17}, 143000027: {10, 13, 14, 16}, 143000025: {13, 15, 17}}
TORCH_SEEDS += list(ORDER_SEEDS)
ONNX_SEEDS += [145000453, 145000456]
# from POOL_FROM: blocks followed by `_Pooled` (18 max_unpool2d by max_pool2d's indices, 19 avg_pool2d with
# divisor_override, 20 a slice assignment, 21 a strided one, 22 torch.split); 153000003 and 153000009 export
# `y[..., 1::3] = v` as a TorchScript ScatterND of a strided box (past 256 runs: refused before)
POOL_SEEDS = {153000015: {18, 19, 20, 22}, 153000024: {18, 19, 20, 21}, 153000007: {21, 22}}
TORCH_SEEDS += list(POOL_SEEDS)
ONNX_SEEDS += [153000003, 153000009]
# from WEIGHTS_FROM: blocks followed by `_Computed` (23 a dynamic depthwise conv, 24 a modulated conv, 25 a computed
# bias); 156000000: a computed bias at batch 1, which the compiled conv read as a constant (wrong by 0.058 x max)
WEIGHT_SEEDS = {156000000: {25}, 156000036: {23, 24, 25}, 156000002: {23, 24}}
TORCH_SEEDS += list(WEIGHT_SEEDS)
ONNX_SEEDS += [156000019]
# from EXPRESSIONS_FROM: also 26 a weight-standardized conv with a gain (NFNet), 27 weight norm, 28 an equalized
# learning rate (expressions of parameters: folded for inference, kept as ops and trained through by the train check)
EXPRESSION_SEEDS = {161000052: {25, 27, 28}, 161000022: {24, 26, 28}, 161000003: {27}}
TORCH_SEEDS += [161000052]
ONNX_SEEDS += [161000005]     # BatchNormalization training_mode=1 on a weight (refused before)
# 95000019: an export without L2Norm's `+ 1e-10` (0 / 0 at an all-zero position) whose NaN meets a max pool:
# ONNX Runtime's pool drops it, PyTorch's and tilefuse's keep it
DYNAMO_SEEDS = [0, 1, 45, 95000019, 126000006, 131000005, 153000023,     # 153000023: max_unpool2d's ScatterND
                156000016,                                                 # computed conv weights and bias
                161000065]                                  # two max_unpool2d sharing their zeros (refused before)
STREAM_SEEDS = list(range(0, 16)) + [45, 109000036, 109000037, 126000008, 131000013]
TRAIN_SEEDS = list(range(0, 16)) + [70001998]   # 70001998: a true gradient of 0 in rounding noise
# the whole vocabulary trained: 42 and 43 (F.normalize's constant ones, L2Norm's `weight.view(1, -1, 1, 1)`:
# refused before), 1000062 and 1000082 (F.normalize of an all-zero position: NaN gradients before), 1000192 (an
# InstanceNorm2d at batch 1 after LayerNorm2d: PyTorch's own CPU backward is wrong there; the reference works
# around it), 8000513 (SSD's L2Norm, `x.pow(2).sum(1).sqrt()`, at positions a ReLU zeroed: PyTorch's gradient
# is NaN there, sqrt's inf derivative times 0; the reference takes the function's finite derivative, which
# tilefuse's channel norm gives), 12000641 (`log1p(|x|) - 0.1 sqrt(|x|)` after an InstanceNorm2d of a depthwise
# conv's all-zero plane: PyTorch's gradient is NaN, sqrt's inf derivative times abs's 0 at 0, and so is the
# composition's; the Trainer refuses the step naming the gradient, which the check takes as agreement)
# 65001588, 65003019: draws that float32's rounding of a layer's output decides (checked on the loss only; they
# fail if `check_train_modern` stops probing that rounding)
TRAIN_MODERN_SEEDS = list(range(0, 12)) + [42, 43, 1000062, 1000082, 1000192, 8000513, 12000641, 65001588,
                                           65003019, 109000007, 109000019,   # these two: flips trained
                                           126000002, 126000010,   # warps trained (grid_sample's backward)
                                           131000012, 131000016,   # masks, 0-d statistics, cumsum, circular
                                           156000010, 156000021,   # convs of computed weights trained
                                           161000022, 161000003,   # through expressions of parameters
                                           162000041]   # a loss float32 rounding moves by 1e-3 (PyTorch's too)


@pytest.mark.parametrize("seed,kinds", FLIP_SEEDS.items())
def test_flip_seeds_draw_their_flips(seed, kinds):
    """The flip seeds above still draw the flips they were chosen for (a change of the generator would make
    them test something else), and the seeds below FLIPS_FROM none."""
    module, _ = RT.build(seed)
    assert {m.kind for m in module.modules() if isinstance(m, RT._Flipped)} == kinds
    module, _ = RT.build(seed - RT.FLIPS_FROM)
    assert not any(isinstance(m, RT._Flipped) for m in module.modules())


@pytest.mark.parametrize("seed,kinds", WARP_SEEDS.items())
def test_warp_seeds_draw_their_warps(seed, kinds):
    """The warp seeds above still draw the warps and periodic activations they were chosen for, and the seeds
    below WARPS_FROM none."""
    module, _ = RT.build(seed)
    warps = {(m.kind, m.mode if m.kind == "shift" else "bilinear") for m in module.modules()
             if isinstance(m, RT._Warped)}
    assert (warps, {m.kind for m in module.modules() if isinstance(m, RT._Periodic)}) == kinds
    module, _ = RT.build(seed - RT.WARPS_FROM)
    assert not any(isinstance(m, (RT._Warped, RT._Periodic)) for m in module.modules())


@pytest.mark.parametrize("seed,kinds", ORDER_SEEDS.items())
def test_order_seeds_draw_their_order_statistics(seed, kinds):
    for s, want in ((seed, kinds), (seed - RT.ORDER_FROM + RT.MASKS_FROM, set())):
        module, _ = RT.build(s)
        assert {m.kind for m in module.modules() if isinstance(m, RT._Ordered)} == want


@pytest.mark.parametrize("seed,kinds", POOL_SEEDS.items())
def test_pool_seeds_draw_their_blocks(seed, kinds):
    for s, want in ((seed, kinds), (seed - RT.POOL_FROM + RT.ORDER_FROM, set())):
        module, _ = RT.build(s)
        assert {m.kind for m in module.modules() if isinstance(m, RT._Pooled)} == want


@pytest.mark.parametrize("seed,kinds", EXPRESSION_SEEDS.items())
def test_expression_seeds_draw_their_blocks(seed, kinds):
    """The seeds draw the expression kinds they were chosen for; the weight seeds below EXPRESSIONS_FROM no kind
    past 25 (test_weight_seeds_draw_their_blocks: exactly theirs)."""
    module, _ = RT.build(seed)
    assert {m.kind for m in module.modules() if isinstance(m, RT._Computed)} == kinds


@pytest.mark.parametrize("seed,kinds", WEIGHT_SEEDS.items())
def test_weight_seeds_draw_their_blocks(seed, kinds):
    for s, want in ((seed, kinds), (seed - RT.WEIGHTS_FROM + RT.POOL_FROM, set())):
        module, _ = RT.build(s)
        assert {m.kind for m in module.modules() if isinstance(m, RT._Computed)} == want


@pytest.mark.parametrize("seed,kinds", MASK_SEEDS.items())
def test_mask_seeds_draw_their_masks(seed, kinds):
    """The mask seeds above still draw the masks, statistics and circular convs they were chosen for, and the
    seeds below MASKS_FROM none."""
    from torch import nn
    for s, want in ((seed, kinds), (seed - RT.MASKS_FROM, (set(), set(), 0))):
        module, _ = RT.build(s)
        got = ({m.kind for m in module.modules() if isinstance(m, RT._Masked)},
               {m.kind for m in module.modules() if isinstance(m, RT._Statistic)},
               sum(isinstance(m, nn.Conv2d) and m.padding_mode == "circular" for m in module.modules()))
        assert got == want


@pytest.mark.parametrize("seed", TORCH_SEEDS)
def test_random_module_from_torch_matches_pytorch(seed):
    problem = RT.check_torch(seed)
    assert problem is None, f"seed {seed}: {problem}"


@pytest.mark.parametrize("seed", STREAM_SEEDS)
def test_random_module_streamed_matches_pytorch(seed):
    problem = RT.check_stream(seed)
    assert problem is None, f"seed {seed}: {problem}"


@pytest.mark.parametrize("seed", ONNX_SEEDS)
def test_random_module_torchscript_onnx_matches_pytorch_and_onnxruntime(seed):
    problem = RT.CHECKS["onnx"](seed)
    assert problem is None, f"seed {seed}: {problem}"


@pytest.mark.parametrize("seed", DYNAMO_SEEDS)
def test_random_module_dynamo_onnx_matches_pytorch_and_onnxruntime(seed):
    problem = RT.CHECKS["dynamo"](seed)
    assert problem is None, f"seed {seed}: {problem}"


def test_a_broken_exports_nan_must_reach_what_onnx_runtimes_reaches(monkeypatch):
    """The broken-export branch of the ONNX check fails a NaN tilefuse lost, and a NaN ONNX Runtime does not have
    in a file with no max pool or max / min reduction to drop it."""
    run = RT._run

    def lose_one(net, x, seed):
        got = run(net, x, seed)
        got.reshape(-1)[0] = 0.0          # ONNX Runtime's output there is NaN (its pool's first element)
        return got

    monkeypatch.setattr(RT, "_run", lose_one)
    assert "broken export" in (RT.CHECKS["dynamo"](95000019) or "")
    monkeypatch.setattr(RT, "_run", run)
    monkeypatch.setattr(RT, "_drops_nan", lambda blob: False)
    assert "broken export" in (RT.CHECKS["dynamo"](95000019) or "")


@pytest.mark.parametrize("seed", TRAIN_SEEDS)
def test_random_trainable_module_step_matches_float64_pytorch(seed):
    problem = RT.check_train(seed)
    assert problem is None, f"seed {seed}: {problem}"


@pytest.mark.parametrize("seed", TRAIN_MODERN_SEEDS)
def test_random_module_of_the_whole_vocabulary_trains_as_float64_pytorch(seed):
    problem = RT.check_train_modern(seed)
    assert problem is None, f"seed {seed}: {problem}"


def test_the_draws_cover_the_idioms():
    """The generator still draws what the docstring promises (a refactor that drops a block kind fails here)."""
    kinds, norms = set(), set()
    for seed in TORCH_SEEDS + ONNX_SEEDS:
        module, _ = RT.build(seed)
        kinds |= {type(b).__name__ for b in module.blocks}
        norms |= {type(m).__name__ for m in module.modules()}
    assert norms >= {"BatchNorm2d", "GroupNorm", "InstanceNorm2d"}
    assert kinds >= {"ConvBNAct", "Residual", "InvertedResidual", "ShuffleUnit", "Ghost", "SplitConv",
                     "ConvNeXtBlock", "LayerNorm2d", "UpCat", "Pool", "Pad", "Affine", "Head", "ConvTranspose2d",
                     "SPPF", "Focus", "ASPP", "Functional"}


def test_thresholds_are_moved_off_the_data():
    """Seed 61000165's hardshrink input comes 6e-8 (17 float32 steps) from lambda 0.033 as drawn: `build` moves
    lambda until no input value is within THRESHOLD_NEAR x max|input| of it, and leaves a threshold far from
    the data where it was drawn."""
    import numpy as np
    import torch

    module, x = RT.build(61000165)
    act = module.blocks[2].branches[0].act
    assert isinstance(act, RT._WhereAct) and act.kind == 1
    drawn = next(m for _, m, _ in RT._draws(61000165)).blocks[2].branches[0].act.t   # the first draw is valid
    assert act.t != drawn and abs(abs(act.t) - abs(drawn)) < 1e-3
    seen = []
    h = act.register_forward_pre_hook(lambda m, i: seen.append(i[0].detach().double().abs()))
    with torch.no_grad():
        module(torch.from_numpy(x))
    h.remove()
    v = seen[0]
    assert float((v - abs(act.t)).abs().min()) >= RT.THRESHOLD_NEAR * float(v.max())
    far = RT._WhereAct(np.random.default_rng(0))
    far.t = 10.0
    net = RT.RandomNet([far]).eval()
    RT._thresholds_off_data(net, np.zeros((1, 1, 2, 2), np.float32) + 0.5)
    assert far.t == 10.0
