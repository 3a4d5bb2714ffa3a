"""Studies built from several simulations: seed 004's fused-vs-separate comparison."""
from __future__ import annotations

from ..ir import Network
from .simulate import simulate
from .strategies.trainer004 import TrainingJob


def fusion_speedup(net: Network, target="trainer-004", batch_scale: int = 1, seed: int = 0, **overrides) -> dict:
    """Forward and backward time of one training step, separate vs fused, and the gains
    (separate / fused - 1, the paper's Table 4 numbers)."""
    out = {}
    for mode in ("separate", "fused"):
        r = simulate(TrainingJob(net, mode, batch_scale), target, seed=seed, **overrides)
        out[mode] = {"fwd": r.extra["fwd_seconds"], "bwd": r.extra["bwd_seconds"], "report": r}
    out["fwd_gain"] = out["separate"]["fwd"] / out["fused"]["fwd"] - 1
    out["bwd_gain"] = out["separate"]["bwd"] / out["fused"]["bwd"] - 1
    return out
