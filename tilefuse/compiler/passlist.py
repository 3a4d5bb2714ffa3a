"""The compile pipeline as one readable list: (pass, why). A lint runs after each pass."""
from __future__ import annotations

from ..errors import GraphError
from ..ir import Network
from . import passes as P

PASSES = [
    (P.remove_dropout,          "dropout is the identity at inference"),
    (P.eliminate_dead_nodes,    "nothing computes a value no output needs"),
    (P.canonicalize,            "one form per computation: mean over H, W is global_avg_pool, ..."),
    (P.fuse_channel_shuffle,    "concat -> channel shuffle -> channel slices: one gather per tensor read"),
    (P.channels_last_to_nchw,   "permute -> LayerNorm / Linear per position -> permute runs in NCHW"),
    (P.fold_batch_norm,         "conv -> BN with one user: BN folds into the conv's weights and bias"),
    (P.batch_norm_to_scale,     "a BN left over is a per-channel affine map"),
    (P.fold_channel_norm,       "mean -> x - u -> square -> mean -> + eps -> sqrt -> divide: one channel_norm"),
    (P.fold_l2_norm,            "square -> sum over C -> sqrt -> + eps or clamp -> x / .: one channel_norm (l2)"),
    (P.fold_softmax_scale,      "x * c -> softmax over the last axis: softmax(x, scale=c), one pass fewer"),
    (P.fold_group_norm,         "reshape -> instance norm -> reshape -> affine (ONNX GroupNorm): one group_norm"),
    (P.fold_channel_affine,     "conv/linear -> * or + a per-channel constant: folds into weights, bias"),
    (P.prune_dead_taps,         "kernel rows / columns that read only padding (dilation past the map) dropped"),
    (P.fuse_squeeze_excitation, "x * s(x) -> 1x1 conv: the channel scale moves onto the conv's weights"),
    (P.fuse_residual_add,       "conv -> add: the residual add runs in the conv's epilogue"),
    (P.fuse_activation,         "conv/linear/add/... -> activation: it runs in the producer's epilogue"),
    (P.fuse_squeeze_scale,      "mean -> 1x1 fc -> act -> 1x1 fc -> gate: the SE scale in one instruction"),
    (P.eliminate_dead_nodes,    "fusions may leave constants and ops without users"),
]


def run_passes(net: Network, passes=None) -> tuple[Network, list[str]]:
    """Run the passes in order; return the optimized network and a log line per pass."""
    log = []
    for fn, why in (PASSES if passes is None else passes):
        try:
            res = fn(net)
            res.network.lint()
        except GraphError as e:
            raise GraphError(e.node, f"{e.args[0]} (while running pass {fn.__name__})") from e
        log.append(f"{fn.__name__}: {res.detail or ('changed' if res.changed else 'no change')}")
        net = res.network
    return net, log
