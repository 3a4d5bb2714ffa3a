"""Lowering: an optimized Network -> instructions over (segment, block) operands.

Each op becomes one instruction whose kernel is named after the op (the CPU kernel registry,
`kernels/registry.py`, maps names to functions). Operands are classified into the three QingLong
segments: bound constants -> CONST (direct), network inputs/outputs -> IO (indirect),
everything else -> HIDDEN (direct). Segment offsets stay 0 here; REOFF fills them in.
An op whose fused activation (params "act", not ReLU) its kernel cannot apply becomes two
instructions: the op into a temporary '<out>@preact', then an `activation` instruction.
Conv layers get their algorithm (and the layout it runs in) here, and an algorithm that
transforms weights at compile time (Winograd, blocked layouts) adds its prepared arrays as
new constant operands. The layout pass (`layout.py`) then rewrites the instruction list.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir import Network
from ..ir.node import DataNode
from ..ir.ops import IDENTITY_ACT, epilogue_act, with_act
from ..ir.ops import flops as op_flops
from ..kernels.registry import ACT_KERNELS
from .program import CONST, DIRECT, HIDDEN, INDIRECT, IO, Instruction, Operand


@dataclass
class Lowered:
    instructions: list[Instruction]
    constants: list[DataNode]                 # in first-use order (REOFF step 1 order)
    hidden: dict[str, int]                    # name -> nbytes
    lifetimes: dict[str, tuple[int, int]]
    io: list[tuple[str, str, np.dtype, tuple[int, ...]]]  # (name, 'input'|'output', dtype, shape)
    flops: list[int]


def lower(net: Network, conv_rule=None, ops=None) -> Lowered:
    """conv_rule(op) -> (params to add, {role: ndarray} prepared constants) or None.

    The params may carry "layout": "nchwc" (the prepared constants are then the blocked form);
    the layout pass inserts the conversions such a conv needs. `ops`: lower only these ops of
    `net` (in order; the row-band schedule lowers its tail this way), operands classified as
    for the whole network."""
    io_names = [d.name for d in net.inputs] + [d.name for d in net.outputs]
    io_set = set(io_names)
    constants: list[DataNode] = []
    seen_const: set[str] = set()
    hidden: dict[str, int] = {}
    lifetimes: dict[str, list[int]] = {}
    instructions: list[Instruction] = []
    flops: list[int] = []

    def operand(d: DataNode, idx: int) -> Operand:
        if d.is_constant:
            if d.name not in seen_const:
                seen_const.add(d.name)
                constants.append(d)
            return Operand(d.name, DIRECT, CONST, d.dtype, d.shape)
        if d.name in io_set:
            return Operand(d.name, INDIRECT, IO, d.dtype, d.shape)
        hidden[d.name] = d.nbytes
        life = lifetimes.setdefault(d.name, [idx, idx])
        life[0], life[1] = min(life[0], idx), max(life[1], idx)
        return Operand(d.name, DIRECT, HIDDEN, d.dtype, d.shape)

    for idx, op in enumerate(net.ops if ops is None else ops):
        params = dict(op.params)
        inputs = list(op.inputs)
        if op.op in ("conv2d", "conv_transpose2d") and conv_rule is not None:
            extra = conv_rule(op)
            if extra is not None:
                add_params, prepared = extra
                params.update(add_params)
                # prepared arrays replace weight and bias (input 1, and 2 if present)
                nkeep = 1
                rest = inputs[2 + int(op.params["has_bias"]):]
                inputs = inputs[:nkeep] + [DataNode(f"{op.inputs[1].name}@{params['algorithm']}.{k}",
                                                    v.shape, v.dtype, v) for k, v in prepared.items()] + rest
                params["prepared"] = list(prepared)
        act = epilogue_act(params)
        if act[0] not in ("identity", "relu") and op.op not in ACT_KERNELS:
            # the kernel has no such epilogue (yet): it writes a temporary, an activation follows
            tmp = DataNode(f"{op.outputs[0].name}@preact", op.outputs[0].shape, op.outputs[0].dtype)
            params = with_act(params, IDENTITY_ACT)
            instructions.append(Instruction(op.op, [operand(d, idx) for d in inputs] + [operand(tmp, idx)],
                                            params))
            instructions.append(Instruction("activation", [operand(tmp, idx), operand(op.outputs[0], idx)],
                                            {"act": act}))
            flops += [op_flops(op), int(np.prod(tmp.shape))]
            continue
        ops = [operand(d, idx) for d in inputs] + [operand(op.outputs[0], idx)]
        instructions.append(Instruction(op.op, ops, params))
        flops.append(op_flops(op))
    return Lowered(instructions, constants, hidden, {k: (v[0], v[1]) for k, v in lifetimes.items()},
                   [(d.name, "input", d.dtype, d.shape) for d in net.inputs]
                   + [(d.name, "output", d.dtype, d.shape) for d in net.outputs], flops)


def with_program(low: Lowered, instructions: list[Instruction], flops: list[int]) -> Lowered:
    """The same lowering with a rewritten instruction list: hidden blocks and lifetimes recomputed."""
    from .layout import hidden_and_lifetimes
    hidden, lifetimes = hidden_and_lifetimes(instructions)
    return Lowered(instructions, low.constants, hidden, lifetimes, low.io, flops)
