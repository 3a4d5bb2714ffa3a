"""The reference evaluator: runs a Network op by op with the plain numpy kernels.

This is the executable spec every compiled program is checked against.
"""
from __future__ import annotations

import numpy as np

from .errors import GraphError
from .ir import Network
from .ir.node import check_inputs, integer_results
from .ir.ops import schema


def bind_inputs(net: Network, inputs) -> list[np.ndarray]:
    """One array, a sequence in input order, or a {name: array} mapping, validated against the
    network's inputs (`ir.node.check_inputs`, the one input validator)."""
    return check_inputs(net.input_specs(), inputs, net.name)


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
    return integer_results([env[id(d)] for d in net.outputs], [d.name for d in net.outputs], net.integer_outputs,
                           net.name)
