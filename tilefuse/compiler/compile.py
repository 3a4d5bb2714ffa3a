"""compile(): Network -> passes -> lowering (+ tuning) -> layouts -> memory plan -> REOFF -> CompiledNetwork."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import GraphError
from ..ir import Network
from .algorithms import choose_algorithms
from .layout import NCHW, assign_layouts, check_layouts, conv_layout, conv_transpose_layout
from .lower import Lowered, lower, with_program
from .memory import MemoryPlan, plan_hidden
from .package import DataPackage, reoff_pack, save_package, validate_package
from .passes import fold_constants, lower_computed_convs
from .passlist import run_passes
from .program import SEGMENTS
from .streaming import RING_C, WHOLE, StreamInfo, StreamPlan, lower_streamed, stream_plan

TARGETS = ("cpu",)


@dataclass
class Plan:
    """What the compiler decided, per instruction, and the memory totals."""
    rows: list[dict]
    const_bytes: int
    hidden_bytes: int
    hidden_naive_bytes: int
    io_bytes: int
    passes: list[str] = field(default_factory=list)
    target: dict = field(default_factory=dict)     # kernels/isa.info() + threads: what the kernels run on
    stream: StreamPlan | None = None     # schedule "stream": rows held per layer, bytes, stages

    @property
    def total_flops(self) -> int:
        return sum(r["flops"] for r in self.rows)

    @property
    def total_bytes(self) -> int:
        return sum(r["bytes"] for r in self.rows)

    def __str__(self) -> str:
        kw = max([16] + [len(r["kernel"]) for r in self.rows])    # (band:pixel_shuffle)
        head = (f"{'#':>3} {'kernel':<{kw}} {'algorithm':<10} {'layout':<6} {'partitioning':<24} {'tasks':>5} "
                f"{'tiles':<22} {'output':<22} {'MFLOP':>9} {'MB':>7} {'ms':>7}  operands (segment+offset)")
        lines = [head, "-" * len(head)]
        if self.target:
            t = self.target
            kind = f", cost model {t['cost_host']}" if t.get("cost_host") else ""
            lines.insert(0, f"target: {t.get('cpu_model')} ({t.get('llvm_cpu')}), {t.get('vector_bits')}-bit vectors, "
                            f"{t.get('threads')} threads{kind}")
        for r in self.rows:
            ops = " ".join(r["addresses"])
            tiles = ",".join(f"{k}={v}" for k, v in r["tiles"].items()) or "-"
            ms = f"{r['measured_seconds'] * 1e3:>7.2f}" if r.get("measured_seconds") else f"{'-':>7}"
            tasks = r.get("tasks") if r.get("tasks") is not None else "-"
            lines.append(f"{r['index']:>3} {r['kernel']:<{kw}} {r['algorithm']:<10} {r['layout']:<6} "
                         f"{r['partitioning']:<24} {tasks:>5} {tiles:<22} {str(r['output_shape']):<22} "
                         f"{r['flops'] / 1e6:>9.2f} {r['bytes'] / 1e6:>7.2f} {ms}  {ops}")
        lines.append("-" * len(head))
        saved = 1 - self.hidden_bytes / self.hidden_naive_bytes if self.hidden_naive_bytes else 0.0
        lines.append(f"total {self.total_flops / 1e9:.3f} GFLOP, {self.total_bytes / 1e6:.1f} MB moved; "
                     f"constants {self.const_bytes / 2**20:.2f} MiB; "
                     f"hidden {self.hidden_bytes / 2**20:.2f} MiB planned vs {self.hidden_naive_bytes / 2**20:.2f} "
                     f"MiB naive ({100 * saved:.0f}% saved by liveness sharing); IO addresses {self.io_bytes} B")
        if self.stream is not None:
            lines += ["", "row-band schedule:", str(self.stream)]
        return "\n".join(lines)


@dataclass
class CompiledNetwork:
    network: Network            # after the passes
    source: Network             # as the user defined it
    package: DataPackage
    lowered: Lowered
    memory: MemoryPlan
    pass_log: list[str]
    compile_seconds: float
    options: dict
    tuning: dict = field(default_factory=dict)   # conv output name -> {"seconds": {alg: s}, "cached": bool}
    layout_log: str = ""
    stream: StreamInfo | None = None             # schedule "stream": what the row-band stage decided

    @property
    def schedule(self):
        """schedule "stream": the row-band schedule (streamed layers, tensors, steps, tail); else None."""
        return self.stream.schedule if self.stream is not None else None

    def plan(self) -> Plan:
        """Per instruction: kernel, algorithm, layout, partitioning and tile sizes (conv, from the
        planner), FLOPs, bytes moved (operands read + written), measured seconds when tuned."""
        from ..kernels.conv.planner import describe
        from ..kernels.threads import resolve_threads
        threads = resolve_threads(self.options.get("threads"))
        rows = []
        for i, (ins, fl) in enumerate(zip(self.package.program(), self.lowered.flops)):
            addrs = []
            for op in ins.operands:
                seg = SEGMENTS[op.segment]
                addrs.append(f"{op.name}@{seg}+{op.seg_offset}" + ("*" if seg == "io" else ""))
            alg = ins.params.get("algorithm", "-")
            layout = ins.params.get("layout", NCHW)
            part, tiles, measured, tasks = "-", {}, None, None
            as_nchw = lambda s, c: (s[0], c, s[2], s[3]) if len(s) == 5 else tuple(s)  # noqa: E731
            if ins.kernel == "conv2d" and ins.params.get("has_input_scale"):   # kernels/se_conv.py's paths
                from ..kernels.se_conv import describe as describe_se
                x, w = ins.inputs[0], self._conv_weight_shape(ins)
                d = describe_se(as_nchw(x.shape, w[1] * ins.params["groups"]), w, layout, ins.params["stride"],
                                ins.params["padding"], ins.params["groups"], threads)
                alg, part, tiles, tasks = d["algorithm"], d["partitioning"], d["tiles"], d["tasks"]
            elif ins.kernel == "conv2d" and alg not in ("-", "reference"):
                x, w = ins.inputs[0], self._conv_weight_shape(ins)
                o = ins.output.shape
                d = describe(alg, as_nchw(x.shape, w[1] * ins.params["groups"]), w, as_nchw(o, w[0]),
                             ins.params["groups"], ins.params["stride"], ins.params["padding"],
                             ins.params["dilation"], layout, threads=threads, out_layout=ins.params.get("out_layout"))
                part, tiles, tasks = d["partitioning"], d["tiles"], d["tasks"]
                t = self.tuning.get(ins.output.name.split("@")[0])
                measured = t["seconds"].get(alg) if t else None
            elif ins.kernel in ("to_nchwc", "from_nchwc"):
                layout = "nchw>c" if ins.kernel == "to_nchwc" else "c>nchw"
            kernel = ins.kernel
            if kernel == "band":                 # a streamed layer: its op, rows held of its output
                kernel = f"band:{ins.params['op']}"
                alg = ins.params["attrs"].get("algorithm", "-")
                n, c, h, w, cap, kind = ins.params["tensors"][-1]
                layout = "nchwc" if kind == RING_C else NCHW
                tiles = {"rows": "whole" if kind == WHOLE else f"{cap}/{h}"}
            elif kernel == "stream":
                tiles = {"steps": ins.operands[0].shape[0], "band": ins.params["band_rows"]}
            rows.append({
                "index": i, "kernel": kernel, "algorithm": alg, "layout": layout,
                "partitioning": part, "tiles": tiles, "tasks": tasks,
                "output": ins.output.name, "output_shape": ins.output.shape,
                "input_shapes": [op.shape for op in ins.inputs], "flops": fl,
                "bytes": sum(op.nbytes for op in ins.operands), "measured_seconds": measured,
                "addresses": addrs, "params": ins.params,
            })
        target = dict(self.package.meta.get("target") or {})
        return Plan(rows, self.package.const_bytes, self.package.hidden_bytes,
                    self.memory.naive_bytes, self.package.io_bytes, list(self.pass_log), target,
                    stream_plan(self.stream) if self.stream is not None else None)

    def _conv_weight_shape(self, ins) -> tuple:
        return tuple(self._weights.get(ins.output.name.split("@")[0], (0, 0, 0, 0)))

    @property
    def _weights(self) -> dict:
        if not hasattr(self, "_wshapes"):
            self._wshapes = {op.outputs[0].name: op.inputs[1].shape for op in self.network.ops
                             if op.op == "conv2d"}
        return self._wshapes

    def save(self, path) -> Path:
        return save_package(self.package, path)

    # thin conveniences over one Session of this network, made on first use. The runtime sets
    # `session_class` when it loads (runtime/session.py; `import tilefuse` loads it): the
    # compiler does not import the runtime, which sits above it.
    session_class = None

    def session(self):
        """The Session `run` / `run_many` use (default device, the compiled thread count)."""
        if getattr(self, "_session", None) is None:
            if CompiledNetwork.session_class is None:
                raise RuntimeError("no runtime is loaded: import tilefuse (or tilefuse.runtime) first")
            self._session = CompiledNetwork.session_class(self)
        return self._session

    def run(self, xs):
        """Session.run on this network: numpy in, one array out (or a list for several outputs)."""
        return self.session().run(xs)

    def run_many(self, inputs, depth: int = 3, progress: bool = False):
        return self.session().run_many(inputs, depth=depth, progress=progress)

    @property
    def inputs(self):
        return self.package.inputs

    @property
    def outputs(self):
        return self.package.outputs


def _share_constants(low: Lowered, pkg: DataPackage) -> None:
    """Point every lowered constant at its bytes in the package's constant area, so the
    compiled network holds its constants once: prepared weights (Winograd's are 4x the raw
    ones) were held a second time by the lowering otherwise."""
    offsets = {b.name: b.offset for b in pkg.blocks if b.segment == "const"}
    for d in low.constants:
        view = np.frombuffer(pkg.const_area, d.dtype, int(np.prod(d.shape)), offsets[d.name]).reshape(d.shape)
        d.value = view                                   # read-only, like every bound constant


def _conv_rule(layout_mode: str):
    """Lowering's conv rule: prepare each conv's constants for the algorithm the algorithm pass
    chose (compiler/algorithms.py) in the layout it runs in (`conv_layout`); None for the
    reference kernel."""
    from ..kernels import conv as fast

    def rule(op):
        x, w, p = op.inputs[0], op.inputs[1], op.params
        if x.dtype != np.float32 or p.get("has_input_scale"):
            return None   # an input-scaled conv (fused squeeze-excitation) runs kernels/se_conv.py
        if op.op == "conv_transpose2d":
            return _conv_transpose_rule(op, layout_mode)
        algo = p.get("algorithm", "reference")
        if algo == "reference":
            return None
        layout = conv_layout(algo, layout_mode, x.shape[1], w.shape[0], p["groups"])
        b = op.inputs[2].value if p["has_bias"] else None
        prepared = fast.conv2d_prepare(algo, w.value, b, p["stride"], p["padding"], p["dilation"], p["groups"],
                                       layout=layout)
        params = {"algorithm": algo, "weight_shape": tuple(int(d) for d in w.shape)}  # for validation
        if layout != NCHW:
            params["layout"] = layout
        return params, {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in prepared.items()}
    return rule


def _conv_transpose_rule(op, layout_mode: str):
    """conv_transpose2d: the NCHW16c phase kernel (kernels/conv/transpose.py) when it applies
    (groups <= transpose.MAX_DENSE_GROUPS), else None (the NCHW GEMM + col2im kernel)."""
    from ..kernels.conv import transpose
    x, w, p = op.inputs[0], op.inputs[1], op.params
    if not transpose.applies(p["groups"]):
        return None
    layout = conv_transpose_layout(layout_mode, x.shape[1], op.outputs[0].shape[1])
    prepared = transpose.prepare(w.value, op.inputs[2].value if p["has_bias"] else None, p["groups"])
    params = {"algorithm": "phase", "weight_shape": tuple(int(d) for d in w.shape)}  # for validation
    if layout != NCHW:
        params["layout"] = layout
    return params, {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in prepared.items()}


SCHEDULES = ("layer", "stream")


LAYOUTS = ("auto", "nchw")


def compile(net: Network, target: str = "cpu", *, schedule: str = "layer", passes=None,
            winograd: bool = True, algorithm: str | None = None, threads: int | None = None,
            stream_options: dict | None = None, tune: bool = False, layout: str = "auto"):
    """Compile a network once into a program and a REOFF data package (a CompiledNetwork).

    schedule: "layer" runs the layers one after another over whole tensors; "stream" runs the
              convolutional part depth-first, a few rows per layer at a time, in band
              instructions over row rings (compiler/streaming.py, docs/streaming.md;
              stream_options: band_rows, workers, queue_bands, band_mode, layer_rows, layout,
              min_band_pixels, threads (= the threads argument)). Both give the same
              CompiledNetwork: saved, loaded and run by Session alike.
    algorithm: force one conv algorithm wherever the conv library can run it ("reference" =
               plain numpy kernel everywhere); see compiler/algorithms.py.
    winograd: allow Winograd for stride-1 3x3 convs when the heuristic picks it.
    threads: the thread count the kernels use (None: all cores); a Session made from the result
             uses it unless given its own. With tune=True it is also the count tuning measures.
    tune: time the candidate algorithms of every conv on this machine and take the fastest;
          choices persist in $TILEFUSE_CACHE_DIR/tune.json (default ~/.cache/tilefuse), see tune.py.
    layout: "auto" keeps activations in NCHW16c between the layers that have a blocked kernel
            (compiler/layout.py; schedule "stream": NCHW16c rings); "nchw" runs every kernel on NCHW.
    """
    if target not in TARGETS:
        raise ValueError(f"target '{target}' is not supported; expected one of {TARGETS}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule '{schedule}' is not supported; expected one of {SCHEDULES}")
    if not isinstance(net, Network):
        raise TypeError(f"compile() takes a tilefuse Network, got {type(net).__name__}")
    if not net.outputs:
        raise GraphError(net.name, "network has no outputs; call net.output(node) first")
    if layout not in LAYOUTS:
        raise ValueError(f"layout '{layout}' is not supported; expected one of {LAYOUTS}")
    if threads is None and stream_options and stream_options.get("threads") is not None:
        threads = stream_options["threads"]                  # compile_stream(threads=) spelled as an option
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
    if stream_options and schedule != "stream":
        raise ValueError(f"stream_options are for schedule='stream', got schedule={schedule!r}")
    t0 = time.perf_counter()
    net.lint()
    _check_fits_host(net)
    options = {"target": target, "winograd": winograd, "algorithm": algorithm, "threads": threads,
               "tune": tune, "layout": layout, "schedule": schedule}
    tuning: dict = {}
    # before the pass list, whatever `passes=` says: expressions of constants folded (a conv reading one gets a
    # constant weight), then a conv of a computed weight lowered (the kernels read prepared weights)
    folded = fold_constants(net)
    low_net = lower_computed_convs(folded.network)
    opt, log = run_passes(low_net.network, passes)           # graph passes (passlist.py)
    log = [f"{r}: {res.detail}" for r, res in (("fold_constants", folded), ("lower_computed_convs", low_net))
           if res.changed] + log
    res = choose_algorithms(opt, algorithm=algorithm, winograd=winograd, tune=tune, threads=threads,
                            layout=layout, tuning=tuning)    # each conv's algorithm (algorithms.py)
    opt, log = res.network, log + [f"choose_algorithms: {res.detail}"]
    stream = None
    if schedule == "stream":                                 # row bands (streaming.py), then the tail
        low, stream, layout_log = lower_streamed(opt, _conv_rule(layout), stream_options or {}, layout)
    else:
        low = lower(opt, _conv_rule(layout))                 # ops -> instructions, prepared weights
        lay = assign_layouts(low.instructions, low.flops, layout)   # NCHW16c between blocked kernels
        check_layouts(lay.instructions)
        low = with_program(low, lay.instructions, lay.flops)
        layout_log = (f"assign_layouts: {lay.conversions} conversions, {lay.cancelled} inverse pairs cancelled"
                      if lay.changed else "assign_layouts: no change")
    log = log + [layout_log]
    mem = plan_hidden(low.hidden, low.lifetimes)             # liveness sharing of hidden blocks
    from ..kernels.isa import info as isa_info
    from ..kernels.threads import resolve_threads
    from ..kernels.isa import cost_host
    target = {k: v for k, v in isa_info().items() if k in ("cpu_model", "llvm_cpu", "vector_bits")}
    target["cost_host"] = cost_host()                        # the algorithm cost model's host kind
    target["threads"] = resolve_threads(threads)
    meta = {"pass_log": log, "options": {k: v for k, v in options.items() if v not in (None, False)},
            "gflops": sum(low.flops) / 1e9, "target": target}
    if net.integer_inputs:
        meta["integer_inputs"] = dict(net.integer_inputs)
    if net.integer_outputs:
        meta["integer_outputs"] = dict(net.integer_outputs)
    pkg = reoff_pack(net.name, low, mem, meta)
    _share_constants(low, pkg)                               # one copy of the constants, in the package
    validate_package(pkg, f"compiled '{net.name}'")           # what a loader would check, now
    if stream is not None:
        _warn_if_streaming_does_not_pay(net.name, stream_plan(stream))
    return CompiledNetwork(opt, net, pkg, low, mem, log, time.perf_counter() - t0, options, tuning, layout_log,
                           stream)


def check_fits_host(name: str, shape, dtype) -> None:
    """Refuse a tensor larger than this host's memory (OutOfDeviceMemory): no Session here could hold it, and
    planning it is not free (the plan's task lists grow with its batch: an ONNX file declaring a batch of 2^31
    took the process's memory in compile)."""
    from ..errors import OutOfDeviceMemory
    from ..kernels.isa import host_memory_bytes
    host = host_memory_bytes()
    nbytes = int(np.prod(shape, dtype=np.float64)) * np.dtype(dtype).itemsize
    if host is not None and nbytes > host:
        raise OutOfDeviceMemory(f"tensor '{name}' of shape {tuple(shape)} ({np.dtype(dtype)}) takes {nbytes} "
                                f"bytes, more than this host's memory ({host} bytes); expected a smaller batch or "
                                f"image")


def _check_fits_host(net: Network) -> None:
    for d in net.data.values():
        check_fits_host(d.name, d.shape, d.dtype)


WARN_EXCESS_BYTES = 16 << 20


def _warn_if_streaming_does_not_pay(name: str, plan: StreamPlan) -> None:
    """schedule="stream" whose plan holds more activation memory than layer by layer (a global op
    early in the network keeps a large tensor whole for the tail, e.g. DeepLabV3's ASPP pooling).
    Small images (an excess under WARN_EXCESS_BYTES: band scratch dominates) only get the plan's line."""
    if plan.streamed_bytes - plan.layer_by_layer_bytes < WARN_EXCESS_BYTES:
        return
    import warnings
    mib = 2.0 ** 20
    where = f"; the streamed part ends at '{plan.ends[0][0]}' ({plan.ends[0][1]})" if plan.ends else ""
    warnings.warn(f"'{name}': schedule='stream' plans {plan.streamed_bytes / mib:.1f} MiB of activations, more "
                  f"than layer by layer ({plan.layer_by_layer_bytes / mib:.1f} MiB){where}; "
                  f"schedule='layer' uses less memory here (compiled.plan() shows the rows held)", stacklevel=3)
