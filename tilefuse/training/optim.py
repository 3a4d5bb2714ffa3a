"""SGD with PyTorch semantics (torch.optim.SGD, dampening 0, no Nesterov).

    g = grad + weight_decay * p
    buf = g                      (first step)
    buf = momentum * buf + g     (later steps)
    p -= lr * (buf if momentum else g)
"""
from __future__ import annotations

import numpy as np


class SGD:
    def __init__(self, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        if not lr > 0:
            raise ValueError(f"SGD lr={lr}; expected > 0")
        if momentum < 0 or weight_decay < 0:
            raise ValueError(f"SGD momentum={momentum}, weight_decay={weight_decay}; expected >= 0")
        self.lr, self.momentum, self.weight_decay = float(lr), float(momentum), float(weight_decay)
        self.state: dict[str, np.ndarray] = {}

    def step(self, params: dict, grads: dict) -> None:
        """Update params[name] in place for every name in grads (the float32 parameters in one
        numba pass over all of them, split over the step's threads: `kernels.elementwise.
        sgd_update_many`, the same bits as the numpy form below)."""
        from ..kernels.elementwise import sgd_update_many
        fast = []
        for name, g in grads.items():
            p = params[name]
            if (p.dtype == np.float32 and g.dtype == np.float32 and p.flags.c_contiguous
                    and g.flags.c_contiguous and g.shape == p.shape):
                first = self.momentum and name not in self.state
                buf = None
                if self.momentum:
                    buf = self.state.get(name)
                    if buf is None:
                        buf = self.state[name] = np.empty_like(p)
                fast.append((p, g, buf, first))
                continue
            d = g.astype(p.dtype, copy=False)
            if self.weight_decay:
                d = d + self.weight_decay * p
            if self.momentum:
                buf = self.state.get(name)
                if buf is None:
                    buf = self.state[name] = np.array(d, dtype=p.dtype, copy=True)
                else:
                    buf *= self.momentum
                    buf += d
                d = buf
            p -= self.lr * d
        if fast:
            sgd_update_many(fast, self.lr, self.momentum, self.weight_decay)

    def state_dict(self) -> dict:
        return {"lr": self.lr, "momentum": self.momentum, "weight_decay": self.weight_decay,
                "momentum_buffer": dict(self.state)}
