"""simulate(): a compiled program mapped onto a paper's machine, executed, and timed.

    report = tilefuse.simulate(compiled, "ft-m7032", cores=8)          # or AM="1MiB", ddr="85GB/s"
    print(report.table())
    report.outputs                    # equal to the reference evaluator's (dtype tolerance)

The program is read through its public surface: each instruction's kernel, params and operand
shapes (layout conversions of the CPU program are skipped: a target keeps its own layout), the
constants from the package, and for convolutions whose weights the CPU compiler transformed
(Winograd, blocked) the original weights from `compiled.network`. Each instruction becomes a
`Layer`; the target's strategy (strategies/) executes it tile by tile through capacity-checked
memories with the shared kernels (`kernels/reference.py`, the Winograd transforms, the imaging
reference) and times every transfer and compute step on a `Timeline`.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import TilefuseError, UnsupportedOpError
from ..ir.ops import schema
from .load import load_target
from .report import Layer, LayerReport, ScalingReport, SimReport, SimulationError
from .spec import Target
from .strategies import STRATEGIES

CONVERSIONS = ("to_nchwc", "from_nchwc")
FREE = ("flatten", "reshape", "dropout")          # views: no data moves on any target


def logical(name: str) -> str:
    """'x@nchwc' -> 'x', 'conv1.weight@direct.weight' -> 'conv1.weight'."""
    return name.split("@", 1)[0]


# ----------------------------------------------------------------------------- program access

class _Program:
    """Instructions, constants and op semantics of a CompiledNetwork / DataPackage / Network."""

    def __init__(self, compiled):
        from ..compiler import CompiledNetwork, DataPackage
        from ..ir import Network
        if isinstance(compiled, Network):
            from ..compiler import compile as compile_net
            compiled = compile_net(compiled, algorithm="reference")
        if isinstance(compiled, CompiledNetwork):
            self.package, self.network = compiled.package, compiled.network
        elif isinstance(compiled, DataPackage):
            self.package, self.network = compiled, None
        else:
            raise TypeError(f"simulate() takes a CompiledNetwork, a DataPackage or a Network, got "
                            f"{type(compiled).__name__}")
        self.name = self.package.name
        self.instructions = self.package.program()
        self._blocks = {b.name: b for b in self.package.blocks if b.segment == "const"}
        self._ops = {op.outputs[0].name: op for op in self.network.ops} if self.network is not None else {}

    def constant(self, name: str) -> np.ndarray:
        b = self._blocks.get(name)
        if b is None:
            raise SimulationError(f"constant '{name}' is not in package '{self.name}'")
        a = np.frombuffer(self.package.const_area, dtype=np.dtype(b.dtype), count=int(np.prod(b.shape)),
                          offset=b.offset)
        return a.reshape(b.shape)

    def op_of(self, ins):
        return self._ops.get(logical(ins.output.name))

    def conv_weights(self, i: int, ins, params: dict | None = None):
        """(weight OIHW, bias or None) of a conv instruction (params: a band instruction's op params)."""
        op = self.op_of(ins)
        p = ins.params if params is None else params
        if op is not None:
            w = op.inputs[1].value
            b = op.inputs[2].value if p.get("has_bias") else None
            return w, b
        if p.get("algorithm", "reference") == "reference":
            w = self.constant(ins.inputs[1].name)
            b = self.constant(ins.inputs[2].name) if p.get("has_bias") else None
            return w, b
        raise SimulationError(f"instruction {i} (conv2d -> {logical(ins.output.name)}): its weights are "
                              f"stored in the CPU kernel's prepared form ({p.get('algorithm')}); simulate the "
                              f"CompiledNetwork, or compile with algorithm='reference' before saving")


def _clean_params(kernel: str, name: str, params: dict) -> dict:
    s = schema(kernel, name)
    keep = {k: v for k, v in params.items() if k not in ("algorithm", "prepared", "layout", "out_layout",
                                                         "channels", "threads")}
    return s.normalize(name, keep)


def compute_dtype(target: Target, net_dtype) -> np.dtype:
    """Float networks compute in the target's dtype when it is a float type (the papers' FP16),
    otherwise in their own dtype if the target has MACs for it."""
    nd = np.dtype(net_dtype)
    td = np.dtype(target.dtype)
    if nd.kind == "f" and td.kind == "f":
        return td
    if f"macs_per_cycle.{nd.name}" in target.compute:
        return nd
    raise UnsupportedOpError(f"target {target.name} computes in "
                             f"{', '.join(k.split('.')[1] for k in target.compute if k.startswith('macs'))}; "
                             f"the program's data is {nd}")


def simulate(compiled, target, *, cores: int | None = None, inputs=None, functional: bool = True,
             seed: int = 0, **overrides) -> SimReport:
    """Map every instruction of `compiled` onto `target` with the target paper's strategy.

    compiled:   tilefuse.compile(...) output, a DataPackage, a Network (compiled here), or, for
                the vck5000-aie target, a `FilterJob`; the trainer-004 target also takes a
                `TrainingJob` (one training step, fused or separate).
    target:     a built-in name (tilefuse.targets.builtin_names()), a .toml path or a Target.
    cores:      cores to use (default: the target file's); multi-core targets only.
    inputs:     network inputs (default: seeded standard normal).
    functional: False times the tiles without computing them (large benchmarks); the blocking,
                the capacity checks and the timing are the same.
    overrides:  AM="1MiB", ddr="85.2 GB/s", clock/param names... (Target.with_overrides).
    """
    tgt = load_target(target, **overrides)
    if cores is not None:
        tgt = tgt.with_overrides(cores=cores)
    strat = STRATEGIES[tgt.strategy](tgt, functional)
    special = getattr(strat, "simulate_job", None)
    if special is not None and not _is_program(compiled):
        return _checked(special(compiled, inputs=inputs, seed=seed), tgt)
    prog = _Program(compiled)
    io_in = prog.package.inputs
    net_dtype = np.dtype(io_in[0].dtype) if io_in else np.dtype(np.float32)
    dt = compute_dtype(tgt, net_dtype)
    layers, skipped = _layers(prog, dt, functional)
    strat.check_program(layers)
    env: dict[str, np.ndarray] = {}
    if functional:
        for slot, a in zip(io_in, _bind_inputs(prog, inputs, seed)):
            env[slot.name] = a.astype(dt)
    reports: list[LayerReport] = []
    for lay, out_name in layers:
        if functional:
            lay.inputs = [env[a.name] if isinstance(a, _Act) else a for a in lay.inputs]
            if isinstance(lay.residual, _Act):
                lay.residual = env[lay.residual.name]
        else:
            lay.inputs = [None if isinstance(a, _Act) else a for a in lay.inputs]
            lay.residual = None
        if lay.kernel in FREE:
            if functional:
                lay.out = lay.reference(*lay.inputs)
            rep = LayerReport(lay.index, lay.name, lay.kernel, lay.out_shape, 0, 0.0, tgt.cores,
                              tgt.peak_flops(), tgt.clock(), {}, {}, "view (no data moves)")
        else:
            try:
                rep = strat.run(lay)
            except TilefuseError as e:
                e.args = (f"instruction {lay.index} ({lay.kernel} '{lay.name}') on {tgt.name}: {e.args[0]}",)
                raise
        if functional:
            if lay.out is None:
                raise SimulationError(f"strategy {tgt.strategy} produced no output for layer '{lay.name}'")
            if tuple(lay.out.shape) != tuple(lay.out_shape):
                raise SimulationError(f"layer '{lay.name}': the target produced shape {lay.out.shape}, "
                                      f"expected {lay.out_shape}")
            env[out_name] = np.asarray(lay.out).astype(dt, copy=False)
        lay.inputs, lay.out, lay.residual = [], None, None          # free the arrays
        reports.append(rep)
    notes = []
    if skipped:
        notes.append(f"{skipped} layout conversion(s) of the CPU program are not executed: the target keeps "
                     f"its own layout")
    outputs = None
    if functional:
        outputs = [env[s.name].astype(np.dtype(s.dtype)) for s in prog.package.outputs]
    rep = SimReport(tgt, tgt.cores, reports, outputs, notes=notes)
    strat.finish(rep, prog, [lay for lay, _ in layers])
    return _checked(rep, tgt)


def _check_time(rep: LayerReport, tgt) -> None:
    """A layer's time must be a finite number of seconds: numbers of the target far outside any
    machine's (a clock of 1e-300 Hz, a link of 1e300 B/s) can make it overflow."""
    times = [rep.seconds, *rep.busy.values()]
    if not all(isinstance(t, (int, float)) and math.isfinite(t) and t >= 0 for t in times):
        raise SimulationError(f"layer '{rep.name}' on {tgt.name}: the target's numbers give a time of "
                              f"{rep.seconds!r} s (busy {rep.busy}); check its clocks, rates and bandwidths "
                              f"({tgt.path or tgt.name})")


def _checked(rep: SimReport, tgt) -> SimReport:
    """The report, once its layers' times, the total and the host side are finite."""
    for lay_rep in rep.layers:
        _check_time(lay_rep, tgt)
    if not all(math.isfinite(t) for t in (rep.seconds, *rep.host.values())):
        raise SimulationError(f"{tgt.name}: the target's numbers give a device time of {rep.seconds!r} s and host "
                              f"times {rep.host}; check its clocks, rates and bandwidths ({tgt.path or tgt.name})")
    return rep


class _Act:
    """An activation operand, resolved from device memory when its instruction runs."""
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


class _Shape:
    __slots__ = ("name", "shape", "dtype")

    def __init__(self, name, shape, dtype):
        self.name, self.shape, self.dtype = name, tuple(shape), dtype


def _layers(prog: _Program, dt, functional: bool):
    """The program's instructions as Layers, with NCHW shapes inferred through the op schemas
    (blocked NCHW16c operands of the CPU program carry padded shapes)."""
    shapes: dict[str, tuple] = {s.name: tuple(s.shape) for s in prog.package.inputs}
    out, skipped = [], 0
    for i, ins in enumerate(prog.instructions):
        k = ins.kernel
        if k in CONVERSIONS or k == "stream":      # a layout conversion, a stream region's header
            if k in CONVERSIONS:
                shapes[logical(ins.output.name)] = shapes[logical(ins.inputs[0].name)]
            skipped += 1
            continue
        iparams = ins.params
        if k == "band":     # a streamed layer of the CPU program: its op on whole tensors here
            k, iparams = ins.params["op"], dict(ins.params["attrs"], **{
                key: ins.params[key] for key in ("prepared", "weight_shape") if key in ins.params})
        op = prog.op_of(ins)
        name = op.name if op is not None else logical(ins.output.name)
        params = _clean_params(k, name, iparams)
        args: list = []
        w = b = res = None
        if k == "conv2d":
            w, b = prog.conv_weights(i, ins, iparams)
            w = np.asarray(w).astype(dt)
            b = np.asarray(b).astype(dt) if b is not None else None
            args = [_Act(logical(ins.inputs[0].name)), w] + ([b] if b is not None else [])
            var = [o for o in ins.inputs[1:] if o.segment != 0]     # residual?, input_scale? (in order)
            if params.get("has_residual"):
                res = _Act(logical(var[0].name))
                args.append(res)
            if params.get("has_input_scale"):       # (N, C, 1, 1): a squeeze-excitation scale
                args.append(_Act(logical(var[-1].name)))
        else:
            for j, o in enumerate(ins.inputs):
                if o.segment == 0:       # a constant
                    c = op.inputs[j].value if op is not None else prog.constant(o.name)
                    args.append(np.asarray(c).astype(dt))
                else:
                    args.append(_Act(logical(o.name)))
            if k == "linear":
                w = args[1]
                b = args[2] if params.get("has_bias") else None
        metas = [_Shape(a.name, shapes[a.name], dt) if isinstance(a, _Act) else _Shape("const", a.shape, dt)
                 for a in args]
        try:
            oshape = tuple(schema(k, name).infer(name, metas, params))
        except TilefuseError as e:
            raise SimulationError(f"instruction {i} ({k} '{name}'): {e}") from None
        oname = logical(ins.output.name)
        shapes[oname] = oshape
        in_shapes = [m.shape for m in metas]
        flops = _flops(k, in_shapes, oshape, params)
        out.append((Layer(i, name, k, params, args, in_shapes, oshape, flops, np.dtype(dt), w, b, res,
                          functional, act_inputs=tuple(j for j, a in enumerate(args) if isinstance(a, _Act))),
                    oname))
    return out, skipped


def _is_program(obj) -> bool:
    from ..compiler import CompiledNetwork, DataPackage
    from ..ir import Network
    return isinstance(obj, (CompiledNetwork, DataPackage, Network))


def _flops(kernel, in_shapes, out_shape, params) -> int:
    s = schema(kernel)
    try:
        return int(s.flops([tuple(x) for x in in_shapes], tuple(out_shape), params))
    except Exception:
        return 0


def _bind_inputs(prog: _Program, inputs, seed: int) -> list[np.ndarray]:
    slots = prog.package.inputs
    if inputs is None:
        rng = np.random.default_rng(seed)
        return [rng.standard_normal(s.shape).astype(np.dtype(s.dtype)) for s in slots]
    if isinstance(inputs, np.ndarray):
        inputs = [inputs]
    if isinstance(inputs, dict):
        inputs = [inputs[s.name] for s in slots]
    inputs = list(inputs)
    if len(inputs) != len(slots):
        raise SimulationError(f"got {len(inputs)} inputs, expected {len(slots)} ({', '.join(s.name for s in slots)})")
    out = []
    for s, a in zip(slots, inputs):
        a = np.asarray(a)
        if tuple(a.shape) != tuple(s.shape):
            raise SimulationError(f"input '{s.name}' has shape {a.shape}, expected {tuple(s.shape)}")
        out.append(a.astype(np.dtype(s.dtype)))
    return out


def scaling(compiled, target, cores=(1, 2, 4, 8), **kw) -> ScalingReport:
    """simulate() at each core count (timing only unless functional=True is given)."""
    kw.setdefault("functional", False)
    tgt = load_target(target)
    runs = {n: simulate(compiled, tgt, cores=n, **kw) for n in cores}
    return ScalingReport(runs[cores[0]].target, list(cores), runs)
