"""The reference evaluator: runs a Network op by op with the plain numpy kernels.

This is the executable spec every compiled program is checked against.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from .errors import GraphError
from .ir import Network
from .ir.ops import schema


def bind_inputs(net: Network, inputs) -> list[np.ndarray]:
    """Accept one array, a sequence in input order, or a {name: array} mapping; validate each."""
    if isinstance(inputs, np.ndarray) or np.isscalar(inputs):
        inputs = [inputs]
    if isinstance(inputs, Mapping):
        missing = [d.name for d in net.inputs if d.name not in inputs]
        extra = sorted(set(inputs) - {d.name for d in net.inputs})
        if missing or extra:
            raise GraphError(net.name, f"inputs given for {sorted(inputs)}; expected exactly "
                                       f"{[d.name for d in net.inputs]}")
        inputs = [inputs[d.name] for d in net.inputs]
    inputs = list(inputs)
    if len(inputs) != len(net.inputs):
        raise GraphError(net.name, f"got {len(inputs)} inputs, expected {len(net.inputs)} "
                                   f"({', '.join(d.name for d in net.inputs)})")
    out = []
    for d, a in zip(net.inputs, inputs):
        a = np.asarray(a)
        if a.shape != d.shape:
            raise GraphError(d.name, f"input has shape {a.shape}, expected {d.shape}")
        if a.dtype != d.dtype:
            # a float of another precision converts; integers, bools and the rest are refused
            if a.dtype.kind != "f" or np.dtype(d.dtype).kind != "f":
                raise GraphError(d.name, f"input has dtype {a.dtype}, expected {d.dtype} (the network "
                                         f"does not take {a.dtype}; convert it first if that is meant)")
            a = a.astype(d.dtype)
        out.append(a)
    return out


def evaluate(net: Network, inputs, return_all: bool = False):
    """Run `net` on `inputs` with the reference kernels.

    Returns the outputs in order as a list (or, with return_all, a dict of every data node).
    """
    env: dict[int, np.ndarray] = {}
    for d, a in zip(net.inputs, bind_inputs(net, inputs)):
        env[id(d)] = a
    values: dict[str, np.ndarray] = {}
    for op in net.ops:
        args = [d.value if d.is_constant else env[id(d)] for d in op.inputs]
        try:
            y = schema(op.op, op.name).reference(*args, **op.params)
        except GraphError:
            raise
        except Exception as e:  # add the node to whatever went wrong
            raise GraphError(op.name, f"reference kernel for {op.op} failed: {e}") from e
        out = op.outputs[0]
        y = np.asarray(y)
        if y.shape != out.shape:
            raise GraphError(op.name, f"reference kernel returned shape {y.shape}, expected {out.shape}")
        env[id(out)] = y
        if return_all:
            values[out.name] = y
    if return_all:
        return values
    return [env[id(d)] for d in net.outputs]
