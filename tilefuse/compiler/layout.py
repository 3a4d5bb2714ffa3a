"""Layout pass: which memory layout each tensor lives in, and the conversions between them.

Two layouts (docs/kernels.md):
  nchw    (N, C, H, W): the user's inputs and outputs, and every kernel without a blocked form
  nchwc   NCHW16c, (N, ceil(C/16), H, W, 16): channel blocks of 16 innermost (one AVX-512
          register), padded channels are zero, no spatial padding (the direct and Winograd
          kernels fold a conv's zero padding into their own input copies)

The pass works on the lowered program, an instruction list, and returns a new one (a pure
function, `LayoutResult.changed` says whether it did anything):

1. choose: a conv whose algorithm has an NCHWc form (`conv_layout`, also used by lowering to
   prepare the weights) runs nchwc; an im2col conv (groups 1: the 3-channel stems) reads nchw
   and writes nchwc when a blocked conv reads it (`_blocked_output_pays`; a fused residual is then
   read blocked, as the output: MobileOne's `conv3x3(x) + conv1x1(x)` stem); the kernels
   that have both forms (pooling, add, relu, scale: `kernels.registry.BLOCKED_FORM`) take the layout of their
   first activation input's producer; global average pool reads nchwc and writes
   (N, C, 1, 1) nchw; the element-wise, activation, resize, pad, slice and concat kernels of
   issue 9 follow too when their operands allow (`_blockable`: channel concat, H/W pads, a
   broadcasting operand that is per-channel, which stays NCHW: `blocked_inputs`), and so does
   a 1x1 conv carrying a squeeze-excitation scale; everything else runs nchw.
2. expand: every nchwc instruction gets a `to_nchwc` before each activation input and a
   `from_nchwc` after its output, so each instruction is correct on its own (the blocked
   tensors are new hidden nodes named '<tensor>@nchwc' with their blocked shapes, so memory
   planning and package validation see real sizes). A tensor is converted at most once.
3. cancel: a `to_nchwc` whose input comes from a `from_nchwc` is an inverse pair: its users
   read the blocked tensor directly; a `from_nchwc` left without users (and not writing a
   network output) is dropped. Conversions remain only where the layout really changes:
   after a NCHW-only kernel, before one, and at the network's inputs and outputs.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..ir.ops import BINARY
from ..kernels.registry import BLOCKED_FORM, BLOCKED_TO_NCHW
from .program import CONST, DIRECT, HIDDEN, Instruction, Operand

NCHW, NCHWC = "nchw", "nchwc"
LANES = 16
CONVERSIONS = frozenset({"to_nchwc", "from_nchwc"})


MAX_PAD_WASTE = 1.5
GROUPED_BLOCKED = frozenset({"depthwise", "grouped"})   # the blocked forms of grouped convs
CONVS = ("conv2d", "conv_transpose2d")                  # kernels whose params say their layout


def conv_layout(algorithm: str | None, mode: str = "auto", ci: int = 16, co: int = 16, groups: int = 1) -> str:
    """The layout a conv runs in: nchwc when its algorithm has a blocked form, the mode allows,
    and padding the channels to multiples of 16 adds at most 50% work: pad16(Ci)*pad16(Co) <=
    1.5*Ci*Co for a dense conv (a 5-channel layer would do 10x the work blocked); for depthwise and
    grouped convs, whose work grows with each padded count separately, pad16(C) <= 1.5*C for the
    input and the output channels."""
    from ..kernels.conv import NCHWC_ALGORITHMS
    if mode == NCHW or algorithm is None or algorithm not in NCHWC_ALGORITHMS:
        return NCHW
    pad = lambda c: -(-c // LANES) * LANES  # noqa: E731
    if algorithm in GROUPED_BLOCKED:
        return NCHWC if max(pad(ci) / ci, pad(co) / co) <= MAX_PAD_WASTE else NCHW
    if groups != 1 or pad(ci) * pad(co) > MAX_PAD_WASTE * ci * co:
        return NCHW
    return NCHWC


def conv_transpose_layout(mode: str, ci: int, co: int) -> str:
    """The layout of a conv_transpose2d on the phase kernel (kernels/conv/transpose.py): nchwc
    unless the mode says nchw or padding the channels adds more than 50% multiplies."""
    pad = lambda c: -(-c // LANES) * LANES  # noqa: E731
    return NCHW if mode == NCHW or pad(ci) * pad(co) > MAX_PAD_WASTE * ci * co else NCHWC


def blocked_shape(shape) -> tuple[int, ...]:
    n, c, h, w = shape
    return (n, -(-c // LANES), h, w, LANES)


@dataclass
class LayoutResult:
    instructions: list[Instruction]
    flops: list[int]
    changed: bool
    conversions: int        # conversion instructions left after cancelling
    cancelled: int          # inverse pairs removed


def _activations(ins: Instruction) -> list[int]:
    """Indices of the inputs that are activations (not constants)."""
    return [i for i, op in enumerate(ins.inputs) if op.segment != CONST]


def _readers(name: str, program: list[Instruction]) -> list[Instruction]:
    return [r for r in program if any(op.name == name for op in r.inputs)]


def _blocked_output_pays(ins: Instruction, program: list[Instruction]) -> bool:
    """An im2col conv (groups 1, e.g. a 3-channel stem) writes NCHW16c directly when a blocked
    conv reads its output, directly or through one pooling / element-wise op."""
    p = ins.params
    if ins.kernel != "conv2d" or p.get("algorithm") != "im2col" or p.get("groups") != 1:
        return False
    co = ins.output.shape[1]
    if -(-co // LANES) * LANES > MAX_PAD_WASTE * co:
        return False
    blocked = lambda r: r.kernel in CONVS and r.params.get("layout") == NCHWC  # noqa: E731
    for r in _readers(ins.output.name, program):
        if blocked(r) or (r.kernel in BLOCKED_FORM and r.kernel not in BLOCKED_TO_NCHW
                          and any(blocked(q) for q in _readers(r.output.name, program))):
            return True
    return False


_BINARY = frozenset(BINARY)
_OLD_BLOCKED = frozenset({"max_pool", "avg_pool", "relu", "scale"})   # need no channel counts


def blocked_inputs(ins: Instruction) -> list[int]:
    """The inputs a blocked instruction reads in NCHW16c; the others stay NCHW (the per-channel
    operand of a broadcasting binary op, a squeeze-excitation scale: the kernels read them so)."""
    acts = _activations(ins)
    if ins.kernel == "conv2d" and ins.params.get("has_input_scale"):
        return acts[:-1]
    if ins.kernel in _BINARY:
        return [i for i in acts if ins.inputs[i].shape == ins.output.shape]
    return acts


def nchwc_params_ok(kernel: str, p: dict) -> bool:
    """Whether the NCHW16c form of `kernel` runs with params p: concat joins channels, slice leaves the batch
    alone, pad pads rows and columns only; any other kernel any params (the validator asks the same)."""
    if kernel == "concat":
        return p["axis"] % 4 == 1
    if kernel == "slice":
        return p["axis"] % 4 != 0
    if kernel == "pad":
        return not any(p["pads"][:4])
    return True


def _blockable(ins: Instruction) -> bool:
    """A non-conv instruction whose kernel has an NCHW16c form and whose operands allow it."""
    from ..kernels.broadcast import channel_operand
    k, p, out = ins.kernel, ins.params, ins.output
    idx = blocked_inputs(ins)
    if k not in BLOCKED_FORM or not idx or out.dtype.kind != "f" or \
            any(len(ins.inputs[i].shape) != 4 for i in idx) or (len(out.shape) != 4 and k not in BLOCKED_TO_NCHW):
        return False
    if not nchwc_params_ok(k, p):
        return False
    if k in _BINARY:
        return all(channel_operand(out.shape, op.shape) for i, op in enumerate(ins.inputs) if i not in idx)
    return True


def _choose(program: list[Instruction]) -> list[tuple[str, str]]:
    produced: dict[str, str] = {}
    out = []
    for ins in program:
        k = ins.kernel
        lin = lout = NCHW
        if k == "conv2d" and ins.params.get("has_input_scale"):
            # a 1x1 conv with a squeeze-excitation scale follows its input (kernels/se_conv.py)
            lin = lout = produced.get(ins.inputs[0].name, NCHW)
        elif k in CONVS:
            lin = lout = ins.params.get("layout", NCHW)
            if lin == NCHW and _blocked_output_pays(ins, program):
                lout = NCHWC
        elif _blockable(ins):
            lin = produced.get(ins.inputs[blocked_inputs(ins)[0]].name, NCHW)
            lout = NCHW if k in BLOCKED_TO_NCHW else lin
        produced[ins.output.name] = lout
        out.append((lin, lout))
    return out


def _blocked(op: Operand) -> Operand:
    return Operand(f"{op.name}@{NCHWC}", DIRECT, HIDDEN, op.dtype, blocked_shape(op.shape))


def assign_layouts(program: list[Instruction], flops: list[int], mode: str = "auto") -> LayoutResult:
    """choose -> expand -> cancel (see the module docstring); mode "nchw" changes nothing."""
    choice = _choose(program) if mode != NCHW else [(NCHW, NCHW)] * len(program)
    if all(c == (NCHW, NCHW) for c in choice):
        return LayoutResult(list(program), list(flops), False, 0, 0)

    # expand
    new: list[tuple[Instruction, int]] = []
    converted: dict[str, Operand] = {}   # NCHW tensor name -> its blocked copy
    for ins, fl, (lin, lout) in zip(program, flops, choice):
        ops = list(ins.operands)
        # an im2col conv reading NCHW and writing NCHW16c adds its fused residual in the output's layout
        to_blocked = blocked_inputs(ins) if lin == NCHWC else [len(ins.inputs) - 1] if (
            lout == NCHWC and ins.kernel == "conv2d" and ins.params.get("has_residual")) else []
        if to_blocked:
            for i in to_blocked:
                src = ops[i]
                if src.name not in converted:
                    b = _blocked(src)
                    new.append((Instruction("to_nchwc", [src, b], {"channels": src.shape[1]}), 0))
                    converted[src.name] = b
                ops[i] = converted[src.name]
        params = dict(ins.params)
        if lin == NCHWC:
            params["layout"] = NCHWC
            if ins.kernel != "conv2d" and ins.kernel in BLOCKED_FORM - BLOCKED_TO_NCHW - _OLD_BLOCKED:
                # the real channel counts, which the blocked shapes no longer tell
                params["channels"] = ins.output.shape[1]
                params["in_channels"] = [ins.inputs[i].shape[1] for i in blocked_inputs(ins)]
        elif lout == NCHWC:
            params["out_layout"] = NCHWC
        if lout == NCHWC:
            orig = ops[-1]
            ops[-1] = _blocked(orig)
            new.append((Instruction(ins.kernel, ops, params), fl))
            new.append((Instruction("from_nchwc", [ops[-1], orig], {"channels": orig.shape[1]}), 0))
        else:
            new.append((Instruction(ins.kernel, ops, params), fl))

    # cancel inverse pairs: from_nchwc(b) -> y, to_nchwc(y) -> b' : readers of b' read b
    producer = {ins.output.name: ins for ins, _ in new}
    rename: dict[str, Operand] = {}
    kept: list[tuple[Instruction, int]] = []
    cancelled = 0
    for ins, fl in new:
        if ins.kernel == "to_nchwc":
            p = producer.get(ins.inputs[0].name)
            if p is not None and p.kernel == "from_nchwc" and p.inputs[0].shape == ins.output.shape:
                rename[ins.output.name] = p.inputs[0]
                cancelled += 1
                continue
        if rename:
            ins = replace(ins, operands=[rename.get(op.name, op) for op in ins.operands])
        kept.append((ins, fl))
    # drop conversions nobody reads (IO outputs are always kept)
    while True:
        used = {op.name for ins, _ in kept for op in ins.inputs}
        dead = [k for k, (ins, _) in enumerate(kept)
                if ins.kernel in CONVERSIONS and ins.output.segment == HIDDEN and ins.output.name not in used]
        if not dead:
            break
        kept = [x for k, x in enumerate(kept) if k not in set(dead)]
    conv_count = sum(ins.kernel in CONVERSIONS for ins, _ in kept)
    return LayoutResult([i for i, _ in kept], [f for _, f in kept], True, conv_count, cancelled)


def hidden_and_lifetimes(program: list[Instruction]) -> tuple[dict[str, int], dict[str, tuple[int, int]]]:
    """Hidden blocks (name -> nbytes) and their lifetimes [first, last] instruction index."""
    hidden: dict[str, int] = {}
    life: dict[str, list[int]] = {}
    for idx, ins in enumerate(program):
        for op in ins.operands:
            if op.segment == HIDDEN:
                hidden[op.name] = op.nbytes
                lf = life.setdefault(op.name, [idx, idx])
                lf[0], lf[1] = min(lf[0], idx), max(lf[1], idx)
    return hidden, {k: (v[0], v[1]) for k, v in life.items()}


def check_layouts(program: list[Instruction]) -> None:
    """Structural check: every tensor has one shape everywhere; NCHWc operands are 5-D x16."""
    shapes: dict[str, tuple] = {}
    for i, ins in enumerate(program):
        for op in ins.operands:
            if shapes.setdefault(op.name, op.shape) != op.shape:
                raise ValueError(f"layout pass: instruction {i} ({ins.kernel}) sees '{op.name}' with shape "
                                 f"{op.shape}, elsewhere {shapes[op.name]}")
            if op.name.endswith("@" + NCHWC) and (len(op.shape) != 5 or op.shape[-1] != LANES):
                raise ValueError(f"layout pass: blocked tensor '{op.name}' has shape {op.shape}, expected "
                                 f"(N, C/16, H, W, 16)")
