"""Unfused and fused training schedules over a Network.

A schedule runs one training step as a list of units (see traffic.py):

* unfused: every op is its own unit (BN is two: statistics, then apply; its backward is two:
  sums, then apply), every tensor goes to main memory, and a tensor with several consumers
  gets its gradient summed by a separate error-Add unit;
* fused: the patterns found by patterns.find_patterns become conv-centred units:
    forward  C1 unit:  conv, epilogue = bias + BN step 1 (per-channel sums of x and x^2), after
                       which F1, F2, F3 and the running statistics are computed;
             C2 unit:  input stage = BN step 2 (F1*x + F2) [+ shortcut, itself BN3-step-2'd in
                       4-2] [+ ReLU], applied per im2col plane; pattern 4 also writes the
                       result (C2's input, kept for its weight gradient);
    backward C2 unit:  post-processing of its input gradient = error Add (+ the other
                       branch's gradient) -> ReLU' -> BN step 1 (sums S1, S2 of the BN(s));
             C1/C3 unit: pre-processing of its output gradient = F1*dz + B*x + C;
                       the error Add at the shortcut's fork in its post-processing.
  Layers outside the patterns run as in the unfused schedule.

Activations are CNHW inside (kernels.py); network inputs and input gradients are NCHW. The ops without a
fused training kernel (activations, broadcasting binary ops, mean / sum, PReLU) compute on NCHW views of
them (`_logical`) with kernels/train_elementwise.py and activations.derivative, and store CNHW again.
"""
from __future__ import annotations

import time
from collections import defaultdict

import numpy as np

from ..errors import GraphError, UnsupportedOpError
from ..ir import Network, ops
from ..kernels import broadcast as bc, cnhw, dense, elementwise as ew, norm, pool
from ..kernels import reference as ref, train_conv as tc, train_elementwise as te
from ..kernels.train_direct import direct_conv
from ..kernels import train_resample as trs
from .patterns import Pattern, find_patterns
from .traffic import MemoryTracker, TrafficLog




def _nb(a) -> int:
    return int(a.nbytes)


def _logical(a: np.ndarray) -> np.ndarray:
    """A stored activation in the IR's layout: CNHW (4-D) viewed as NCHW; other ranks as they are."""
    return a.transpose(1, 0, 2, 3) if a.ndim == 4 else a


def _physical(a: np.ndarray) -> np.ndarray:
    """An IR-layout array as the schedule stores it: NCHW -> CNHW (4-D), contiguous."""
    return np.ascontiguousarray(a.transpose(1, 0, 2, 3) if a.ndim == 4 else a)


# ops whose constant operands have no weight slot, and which of their operands get a gradient (concat: all)
_OPERAND_SLOTS = {**{k: (0, 1) for k in ops.BINARY}, "matmul": (0, 1), "where": (2, 3), "grid_sample": (0, 1),
                  "take": (0,), "concat": None}
# ops whose backward (`_bwd_simple`) gives input 0 a gradient, which a parameter there gets (an expression of a
# parameter imported with from_torch(fold_parameters=False): `w.reshape(1, O, -1).mean(2)`, `w.abs()`)
_INPUT0_GRAD = frozenset({"activation", "adaptive_avg_pool", "adaptive_max_pool", "avg_pool", "cumsum", "flatten",
                          "global_avg_pool", "local_response_norm", "max", "max_pool", "mean", "norm", "pad",
                          "permute", "pixel_shuffle", "reshape", "resize", "slice", "softmax", "sum"})


def operand_constants(net: Network) -> dict[str, bool]:
    """Constant operands of the binary ops, matmul, where's values and concat (no weight slot says what they are) ->
    trainable or fixed.

    A parameter (the network's `constant_origin`, which from_torch fills from torch.export's signature: an
    nn.Parameter such as ConvNeXt's layer scale) is trained; a buffer or a literal (x + 3, x / 6: one value
    whose origin nobody recorded) stays fixed. Anything else is refused naming it rather than guessed: a
    folded expression of a parameter (its gradient would have to flow back through the fold), or a
    multi-value constant of a network that does not say (built by hand, imported from ONNX)."""
    out: dict[str, bool] = {}
    for op in net.ops:
        if op.op in _INPUT0_GRAD and op.inputs[0].is_constant:
            # a parameter (or view of one) that an op computes with: trained through the op's backward; any
            # other constant there (a buffer, a literal, a hand-built network's) stays fixed as before
            origin = net.constant_origin.get(op.inputs[0].name) or ""
            if origin == "parameter":
                out[op.inputs[0].name] = True
            elif origin.startswith("derived from"):
                raise UnsupportedOpError(
                    f"{op.name}: constant input '{op.inputs[0].name}' is {origin} (folded at import); its "
                    f"gradient would have to flow back through the fold; expected the network imported with "
                    f"from_torch(..., fold_parameters=False), which keeps the expression as ops")
        slots = _OPERAND_SLOTS.get(op.op, ())
        for d in (op.inputs[i] for i in (range(len(op.inputs)) if slots is None else slots)):
            if not d.is_constant:
                continue
            origin = net.constant_origin.get(d.name)
            if origin == "parameter":
                out[d.name] = True
            elif origin == "buffer" or (origin is None and d.value.size == 1):
                out[d.name] = False
            elif origin is None:
                raise UnsupportedOpError(
                    f"{op.name}: constant operand '{d.name}' {d.shape} may be a trainable parameter or a fixed "
                    f"buffer, and the network does not say which (built by hand or imported from ONNX); expected "
                    f"net.constant_origin['{d.name}'] = 'parameter' or 'buffer'")
            else:
                raise UnsupportedOpError(
                    f"{op.name}: constant operand '{d.name}' is {origin}; the trainer trains a parameter only "
                    f"where an op uses it as it is; expected the parameter itself as the operand (e.g. a layer "
                    f"scale stored as (C, 1, 1)), or the network imported with from_torch(..., "
                    f"fold_parameters=False), which keeps the expression as ops")
    return out


class TrainingSchedule:
    """One network's training step under the 'unfused' or 'fused' schedule."""

    def __init__(self, net: Network, params: dict, buffers: dict, mode: str = "fused",
                 bn_momentum: float | None = None, seed: int = 0):
        if mode not in ("fused", "unfused"):
            raise ValueError(f"schedule '{mode}' is not known; expected 'fused' or 'unfused'")
        self.net, self.params, self.buffers, self.mode = net, params, buffers, mode
        # a constant that is a view of a parameter (net.constant_alias) -> that parameter's name in params
        self.alias = {name: key for name, (key, _) in net.constant_alias.items()}
        # the running statistics' momentum: bn_momentum for every BN where given; else each BN's own
        # (net.bn_momentum: from_torch's module's, None the cumulative average), 0.1 (PyTorch's default) for the rest
        self.momentum = bn_momentum
        self.batches_tracked = lambda: 0     # (the Trainer's count of training forwards before this one)
        self.rng = np.random.default_rng(seed)
        if len(net.outputs) != 1:
            raise GraphError(net.name, f"has {len(net.outputs)} outputs; training expects one "
                                       f"(the logits)")
        self.ops = list(net.ops)
        out = net.outputs[0]
        if out.producer is not None and out.producer.op == "softmax" and \
                out.producer.params["axis"] % len(out.shape) == 1:
            self.ops.remove(out.producer)    # cross-entropy takes the softmax's input
            out = out.producer.inputs[0]
        if len(out.shape) not in (2, 4):
            raise GraphError(out.name, f"logits have shape {out.shape}; expected (N, classes) or, for a dense "
                                       f"prediction, (N, classes, H, W)")
        self.logits = out
        for op in self.ops:
            self._check(op)
        operand_constants(net)
        # the patterns are found in both schedules (the unfused report is per pattern too);
        # only the fused schedule executes them as fused units
        self.found: list[Pattern] = find_patterns(net)
        self.patterns: list[Pattern] = self.found if mode == "fused" else []
        self.pattern_of: dict[str, Pattern] = {}     # memory-bound op name -> pattern
        self.c2_of: dict[str, Pattern] = {}          # conv name -> pattern it is C2 of
        self.stat_of: dict[str, tuple] = {}          # conv name -> (pattern, bn op)
        self.fork_owner: dict[str, str] = {}         # tensor -> layer charged for its error Add
        for p in self.patterns:
            for m in p.members:
                self.pattern_of[m.name] = p
            self.c2_of[p.c2.name] = p
            if p.bn is not None:
                self.stat_of[p.c1.name] = (p, p.bn)
            if p.bn3 is not None:
                self.stat_of[p.c3.name] = (p, p.bn3)
        found_of = {m.name: p for p in self.found for m in p.members}
        for op in self.ops:                          # the error Add of a residual shortcut
            if op.op == "add":
                p = found_of.get(op.name)
                sc = p.shortcut if p is not None else None
                for d in op.inputs:
                    if len(d.consumers) > 1:
                        self.fork_owner.setdefault(d.name, op.name)
                if sc is not None:
                    self.fork_owner[sc.name] = op.name
        self.order = {op.name: i for i, op in enumerate(self.ops)}
        self.timing: dict[str, float] = defaultdict(float)

    @staticmethod
    def _check(op):
        """Refuse, naming the op, anything this schedule has no exact backward for: an op kind
        without one (a gradient is never dropped silently), or a form the kernels do not cover."""
        act = ops.epilogue_act(op.params)[0] if op.op in ops.ACT_EPILOGUE else "identity"
        if act not in ("identity", "relu") or op.params.get("has_input_scale"):
            raise UnsupportedOpError(f"{op.name}: {op.op} with a fused {act if act != 'identity' else 'input scale'} "
                                     f"epilogue has no backward in the trainer; expected a network before "
                                     f"inference fusion")
        if op.op == "group_norm" and len(op.inputs[0].shape) != 4:
            raise UnsupportedOpError(f"{op.name}: group_norm of a rank-{len(op.inputs[0].shape)} tensor "
                                     f"{op.inputs[0].shape} has no backward in the trainer; expected (N, C, H, W)")
        if op.op == "group_norm" and op.params.get("relu"):
            raise UnsupportedOpError(f"{op.name}: group_norm with a fused relu epilogue cannot be trained; "
                                     f"expected a network before inference fusion")
        if op.op in ("conv2d", "conv_transpose2d") and (op.params.get("relu") or op.params.get("has_residual")):
            raise UnsupportedOpError(f"{op.name}: {op.op} with a fused relu/residual epilogue cannot be "
                                     f"trained; expected a network before inference fusion")
        if op.op == "grid_sample" and op.params["mode"] == "bicubic":
            raise UnsupportedOpError(f"{op.name}: grid_sample mode 'bicubic' has no backward in the trainer; "
                                     f"expected mode 'bilinear' or 'nearest'")
        if op.op == "flatten" and op.params["start_dim"] != 1:
            raise UnsupportedOpError(f"{op.name}: flatten(start_dim={op.params['start_dim']}); "
                                     f"expected start_dim=1")
        if not hasattr(TrainingSchedule, "_bwd_" + op.op) or not hasattr(TrainingSchedule, "_fwd_" + op.op):
            have = sorted(m[5:] for m in dir(TrainingSchedule) if m.startswith("_bwd_") and
                          hasattr(TrainingSchedule, "_fwd_" + m[5:]))
            raise UnsupportedOpError(f"{op.name}: op '{op.op}' has no backward in the trainer; expected only "
                                     f"{', '.join(have)} (softmax as the last op)")

    # ------------------------------------------------------------------ helpers

    def P(self, d):
        """Value of a constant (trainable copy or buffer) or a live activation."""
        if d.is_constant:
            if d.name in self.alias and self.alias[d.name] in self.params:
                p = self.params[self.alias[d.name]]
                if d.name in self.net.constant_gather:      # the parameter's elements at G
                    return p.reshape(-1)[self.net.constant_gather[d.name][0]].reshape(d.shape)
                return p.reshape(d.shape)
            if d.name in self.params:
                return self.params[d.name]
            return self.buffers[d.name] if d.name in self.buffers else d.value    # (a fixed operand: x + 3)
        return self.env[d.name]

    def _weight(self, d):
        """A conv's weight or bias: a constant's (trained) value, or a computed tensor in the IR's layout (OIHW)."""
        return self.P(d) if d.is_constant else np.ascontiguousarray(_logical(self.env[d.name]))

    def _weight_grad(self, d, g, u, layer):
        """A conv weight's or bias's gradient: its parameter's, or (computed by the network) into the graph."""
        if d.is_constant:
            self._param_grad(d.name, g)
        elif self._wants(d):
            self._contribute(d.name, _physical(np.asarray(g, d.dtype)), u, layer)

    def _store(self, u, name, arr, layer, writer):
        self.env[name] = arr
        u.write(name, _nb(arr), layer)
        self.mem.alloc(name, _nb(arr), layer, writer)

    def trains(self, d) -> bool:
        """Whether constant d is (a view of) a trained parameter."""
        return self.alias.get(d.name, d.name) in self.params

    def _param_grad(self, name, g):
        gather = self.net.constant_gather.get(name)
        name = self.alias.get(name, name)
        if name not in self.params and name in self.buffers:
            return                  # a fixed weight (BatchNorm2d(affine=False)'s unit weight): no gradient
        if gather is not None:      # a gather of the parameter's elements: its gradient scattered back, summed
            full = np.zeros(self.params[name].size, np.float64)
            np.add.at(full, gather[0], np.asarray(g, np.float64).reshape(-1))
            g = full
        g = np.asarray(g, dtype=self.params[name].dtype).reshape(self.params[name].shape)
        if name in self.pgrads:
            self.pgrads[name] = self.pgrads[name] + g
        else:
            self.pgrads[name] = g

    def _layer_of_fork(self, t):
        return self.fork_owner.get(t, f"error-add:{t}")

    def _contribute(self, t, arr, u=None, layer=None, alias=False):
        """Add a gradient contribution for tensor t (a separate error-Add unit if needed)."""
        if t not in self.grads:
            self.grads[t] = arr
            if not alias:
                u.write("d:" + t, _nb(arr), layer)
                self.mem.alloc("d:" + t, _nb(arr), "grad", "d:" + t)
            return
        owner = self._layer_of_fork(t)
        ua = self.log.unit("bwd", f"error-add {t}")
        t0 = time.perf_counter()
        old = self.grads[t]
        ua.read("d:" + t, _nb(old), owner)
        ua.read("d:" + t + "'", _nb(arr), owner)
        s = ew.add_forward(old, arr)
        ua.write("d:" + t, _nb(s), owner)
        self.grads[t] = s
        self.mem.alloc("d:" + t, _nb(s), "grad", "d:" + t)
        if not alias and u is not None:
            u.write("d:" + t + "'", _nb(arr), layer)
        dt = time.perf_counter() - t0
        self.timing["memory-bound"] += dt
        self.timing["bwd:error-add"] += dt

    # ------------------------------------------------------------------ forward

    def forward(self, inputs: list) -> np.ndarray:
        self.env: dict = {}
        self.grads: dict = {}
        self.pgrads: dict = {}
        self.bn: dict = {}
        self.saved: dict = {}
        self.log = TrafficLog()
        self.mem = MemoryTracker()
        for d, a in zip(self.net.inputs, inputs):
            a = cnhw.to_cnhw(a) if a.ndim == 4 else np.ascontiguousarray(a)
            self.env[d.name] = a
            self.mem.alloc(d.name, _nb(a), "input", "input")
        for op in self.ops:
            if op.name in self.pattern_of:
                continue                              # runs inside a conv unit
            t0 = time.perf_counter()
            getattr(self, "_fwd_" + op.op)(op)
            dt = time.perf_counter() - t0
            self.timing["conv" if op.op == "conv2d" else
                        ("memory-bound" if op.op in ops.MEMORY_BOUND else "other")] += dt
            self.timing["fwd:" + op.op] += dt
        self.mem.end_forward()
        return _logical(self.env[self.logits.name])        # (N, classes) or (N, classes, H, W)

    def _fwd_conv2d(self, op):
        u = self.log.unit("fwd", op.name)
        x, w = op.inputs[0], op.inputs[1]
        p = op.params
        g = tc.ConvGeom(x.shape, w.shape, p["stride"], p["padding"], p["dilation"], p["groups"])
        bias = self._weight(op.inputs[2]) if p["has_bias"] else None
        direct = direct_conv(x.shape, w.shape, p)      # (never in a pattern: patterns._plain_conv)
        if direct is not None:
            u.read(x.name, _nb(self.env[x.name]), op.name)
            self._store(u, op.outputs[0].name, direct[0](self.env[x.name], self._weight(w), g, bias), op.name,
                        op.name)
            return
        pre, src = tc.IDENTITY, x
        pat = self.c2_of.get(op.name)
        if pat is not None:
            src, pre = self._fwd_pre(pat, op, u)
        else:
            u.read(x.name, _nb(self.env[x.name]), op.name)
        stats = None
        if op.name in self.stat_of:
            stats = (np.zeros(g.O), np.zeros(g.O))
        y = tc.conv_forward_cnhw(self.env[src.name], self._weight(w), g, bias=bias, pre=pre, stats=stats)
        self._store(u, op.outputs[0].name, y, op.name, op.name)
        if stats is not None:
            _, bn = self.stat_of[op.name]
            self._bn_finalize(bn, stats[0], stats[1], g.N * g.ho * g.wo)

    def _convt_geom(self, op):
        p = op.params
        return tc.transposed_geom(op.inputs[0].shape, op.inputs[1].shape, p["stride"], p["padding"],
                                  p["output_padding"], p["dilation"], p["groups"])

    def _fwd_conv_transpose2d(self, op):
        bias = self.P(op.inputs[2]) if op.params["has_bias"] else None
        w = self.P(op.inputs[1])
        self._simple(op, lambda x: tc.conv_transpose_forward_cnhw(x, w, self._convt_geom(op), bias))

    def _fwd_pre(self, pat: Pattern, op, u):
        """Input stage of C2: returns (stored source tensor, Pre)."""
        x1 = pat.x1
        u.read(x1.name, _nb(self.env[x1.name]), op.name)
        if pat.kind == "1":
            return x1, tc.Pre(relu=True)
        f1, f2 = self.bn[pat.bn.name].fwd_coefs(x1.dtype)
        if pat.kind == "2":
            return x1, tc.Pre(a=f1, b=f2)
        if pat.kind == "3":
            return x1, tc.Pre(a=f1, b=f2, relu=True)
        add_l = pat.add.name
        relu_l = pat.relu.name if pat.relu is not None else add_l
        r = np.empty(self.env[x1.name].shape, x1.dtype)
        self.env[pat.r.name] = r
        u.write(pat.r.name, _nb(r), relu_l)
        self.mem.alloc(pat.r.name, _nb(r), relu_l, op.name)
        if pat.kind == "4-1":
            s = self.env[pat.shortcut.name]
            u.read(pat.shortcut.name, _nb(s), add_l)
            return x1, tc.Pre(a=f1, b=f2, s=s, relu=True, r_out=r)
        x3 = pat.c3.outputs[0]
        s = self.env[x3.name]
        u.read(x3.name, _nb(s), add_l)
        a2, b2 = self.bn[pat.bn3.name].fwd_coefs(x1.dtype)
        return x1, tc.Pre(a=f1, b=f2, s=s, a2=a2, b2=b2, relu=True, r_out=r)

    def bn_momentum(self, name: str) -> float:
        """The momentum this step's running-statistics update of BN `name` uses (PyTorch's: a cumulative
        average, momentum None, weighs the n-th batch 1 / n)."""
        if self.momentum is not None:
            return float(self.momentum)
        m = self.net.bn_momentum.get(name, 0.1)
        return 1.0 / (self.batches_tracked() + 1) if m is None else m

    def _bn_finalize(self, bn, s, ss, m):
        g, b, mean, var = bn.inputs[1:]
        run = None
        if mean.name in self.buffers and var.name in self.buffers:
            run = (self.buffers[mean.name], self.buffers[var.name])
        st = norm.BNState().finalize_forward(s, ss, m, self.P(g), self.P(b), bn.params["eps"], run,
                                          self.bn_momentum(bn.name))
        self.bn[bn.name] = st
        return st

    def _fwd_batch_norm(self, op):
        x = self.env[op.inputs[0].name]
        u1 = self.log.unit("fwd", op.name + ".stats")
        u1.read(op.inputs[0].name, _nb(x), op.name)
        s, ss, m = norm.bn_stats(x)
        st = self._bn_finalize(op, s, ss, m)
        u2 = self.log.unit("fwd", op.name + ".apply")
        u2.read(op.inputs[0].name, _nb(x), op.name)
        self._store(u2, op.outputs[0].name, norm.bn_apply(x, *st.fwd_coefs(x.dtype)), op.name, op.name)

    def _fwd_scale(self, op):
        x = self.env[op.inputs[0].name]
        u = self.log.unit("fwd", op.name)
        u.read(op.inputs[0].name, _nb(x), op.name)
        a, b = self.P(op.inputs[1]), self.P(op.inputs[2])
        self._store(u, op.outputs[0].name, norm.bn_apply(x, a, b), op.name, op.name)

    def _fwd_group_norm(self, op):
        g, b = self.P(op.inputs[1]), self.P(op.inputs[2])
        stats = {}

        def run(x):
            y, stats["mean"], stats["rstd"] = norm.group_norm_forward(x, g, b, op.params["groups"], op.params["eps"])
            return y
        self._simple(op, run)
        self.saved[op.name] = (stats["mean"], stats["rstd"])

    def _fwd_relu(self, op):
        x = self.env[op.inputs[0].name]
        u = self.log.unit("fwd", op.name)
        u.read(op.inputs[0].name, _nb(x), op.name)
        self._store(u, op.outputs[0].name, ew.relu_forward(x), op.name, op.name)

    def _fwd_add(self, op):
        if not _plain_add(op):
            return self._fwd_binary(op)
        a, b = (self.env[d.name] for d in op.inputs)
        u = self.log.unit("fwd", op.name)
        u.read(op.inputs[0].name, _nb(a), op.name)
        u.read(op.inputs[1].name, _nb(b), op.name)
        y = ew.add_forward(a, b)
        if op.params.get("relu"):
            y = ew.relu_forward(y)
        self._store(u, op.outputs[0].name, y, op.name, op.name)

    def _input(self, d):
        """Input d as stored (CNHW for 4-D): an activation, or a constant's value (a slice of torch.zeros_like(x)
        that a slice assignment keeps: TSM's shift)."""
        return _physical(np.asarray(self.P(d))) if d.is_constant else self.env.get(d.name)

    def _simple(self, op, fn):
        x = self._input(op.inputs[0])
        u = self.log.unit("fwd", op.name)
        if not op.inputs[0].is_constant:
            u.read(op.inputs[0].name, _nb(x), op.name)
        self._store(u, op.outputs[0].name, fn(x), op.name, op.name)

    def _fwd_max_pool(self, op):
        p = op.params
        out = {}

        def run(x):
            y, idx = pool.max_pool_forward(x, p["kernel_size"], p["stride"], p["padding"], p["dilation"],
                                        p["ceil_mode"])
            out["idx"] = idx
            return y
        self._simple(op, run)
        self.saved[op.name] = out["idx"]

    def _fwd_avg_pool(self, op):
        p = op.params
        self._simple(op, lambda x: pool.avg_pool_forward(x, p["kernel_size"], p["stride"], p["padding"],
                                                      p["ceil_mode"], p["count_include_pad"]))

    def _fwd_global_avg_pool(self, op):
        self._simple(op, pool.global_avg_pool_forward)

    def _fwd_resize(self, op):
        p = op.params
        self._simple(op, lambda x: ref.resize(x, p["size"], p["scales"], p["mode"], p["coord"], p["nearest_mode"],
                                              arith=p["arith"], cubic_a=p.get("cubic_a", -0.75),
                                              cubic_exclude=p.get("cubic_exclude", False)))

    def _fwd_adaptive_avg_pool(self, op):
        self._simple(op, lambda x: ref.adaptive_avg_pool(x, op.params["output_size"]))

    def _fwd_adaptive_max_pool(self, op):
        self._simple(op, lambda x: ref.adaptive_max_pool(x, op.params["output_size"]))

    def _fwd_channel_shuffle(self, op):
        p = op.params
        self._fwd_values(op, lambda *xs: ref.channel_shuffle(xs, p["groups"], p["start"], p["stop"]))

    def _fwd_channel_norm(self, op):
        g, b, p = self.P(op.inputs[1]), self.P(op.inputs[2]), op.params
        self._simple(op, lambda x: _physical(ref.channel_norm(_logical(x), g, b, p["eps"], p["mode"])))

    def _fwd_local_response_norm(self, op):
        p = op.params
        self._simple(op, lambda x: _physical(ref.local_response_norm(_logical(x), p["size"], p["alpha"], p["beta"],
                                                                     p["k"])))

    def _fwd_flatten(self, op):
        def run(x):
            if x.ndim == 4:            # CNHW -> (N, C*H*W) in NCHW order
                return np.ascontiguousarray(x.transpose(1, 0, 2, 3)).reshape(x.shape[1], -1)
            return x.reshape(x.shape[0], -1)
        self._simple(op, run)

    def _fwd_linear(self, op):
        w = self.P(op.inputs[1])
        b = self.P(op.inputs[2]) if op.params["has_bias"] else None

        def run(x):                   # (..., K) -> (..., M): the leading axes as rows
            xl = _logical(x)
            return _physical(dense.linear_forward(xl.reshape(-1, xl.shape[-1]), w, b).reshape(
                xl.shape[:-1] + (w.shape[0],)))
        self._simple(op, run)
        if op.params.get("relu"):
            self.env[op.outputs[0].name] = ew.relu_forward(self.env[op.outputs[0].name])

    def _fwd_dropout(self, op):
        prob, mode = op.params["p"], op.params.get("mode", "element")
        x = self.env[op.inputs[0].name]
        # one draw per element (as stored), or per (N, C), per N, one for the batch (drawn in the IR layout,
        # stored as x is: it broadcasts over the other axes)
        shape = op.inputs[0].shape
        draw = {"channel": shape[:2] + (1,) * (len(shape) - 2), "sample": shape[:1] + (1,) * (len(shape) - 1),
                "batch": (1,) * len(shape)}.get(mode)
        keep = self.rng.random(x.shape) >= prob if draw is None else _physical(self.rng.random(draw) >= prob)
        mask = keep.astype(x.dtype) / (1.0 - prob) if prob > 0 else None
        self.saved[op.name] = mask
        self._simple(op, lambda x: x * mask if mask is not None else x.copy())

    def _fwd_concat(self, op):
        ax = op.params["axis"] % len(op.inputs[0].shape)
        phys = {0: 1, 1: 0}.get(ax, ax) if len(op.inputs[0].shape) == 4 else ax
        # a constant operand (ENet's torch.zeros channel padding, a class token) in the activations' layout
        dt = next(self.env[d.name].dtype for d in op.inputs if not d.is_constant)
        xs = [_physical(np.asarray(self.P(d), dtype=dt)) if d.is_constant else self.env[d.name]
              for d in op.inputs]
        u = self.log.unit("fwd", op.name)
        for d, x in zip(op.inputs, xs):
            if not d.is_constant:
                u.read(d.name, _nb(x), op.name)
        self._store(u, op.outputs[0].name, np.concatenate(xs, axis=phys), op.name, op.name)

    def _value(self, d):
        """An operand in the IR's layout: a constant as it is, an activation as an NCHW view."""
        return self.P(d) if d.is_constant else _logical(self.env[d.name])

    def _fwd_values(self, op, fn):
        """An op of several operands on their IR-layout values (`_value`): y = fn(*values), stored CNHW."""
        u = self.log.unit("fwd", op.name)
        for d in op.inputs:
            if not d.is_constant:
                u.read(d.name, _nb(self.env[d.name]), op.name)
        self._store(u, op.outputs[0].name, _physical(fn(*(self._value(d) for d in op.inputs))), op.name, op.name)

    def _fwd_binary(self, op):
        """add (broadcasting or with a constant) / sub / mul / div / maximum / minimum, then the fused relu."""
        self._fwd_values(op, lambda a, b: ref.binary(op.op, a, b, bool(op.params.get("relu"))))

    def _fwd_activation(self, op):
        def run(x):
            y = np.empty_like(x)
            bc.activation(y, x, act=op.params["act"])
            return y
        self._simple(op, run)

    def _fwd_reduce(self, op):
        axes = tuple(a % len(op.inputs[0].shape) for a in op.params["axes"])
        self._simple(op, lambda x: _physical(ref.reduce(op.op, _logical(x), axes, op.params["keepdim"])))

    _fwd_mean = _fwd_sum = _fwd_max = _fwd_reduce

    def _fwd_where(self, op):
        self._fwd_values(op, lambda *v: ref.where(*v, op.params["cmp"]))

    def _fwd_matmul(self, op):
        self._fwd_values(op, ref.matmul)

    def _fwd_grid_sample(self, op):
        p = op.params
        self._fwd_values(op, lambda x, grid: ref.grid_sample(x, grid, p["mode"], p["padding_mode"],
                                                             p["align_corners"]))

    def _fwd_take(self, op):
        p = op.params
        self._fwd_values(op, lambda x, idx: ref.take(x, idx, p["axis"], p["negative"]))

    def _fwd_pad(self, op):
        p = op.params
        self._simple(op, lambda x: _physical(ref.pad(_logical(x), p["pads"], p["mode"], p["value"])))

    def _fwd_softmax(self, op):
        p = op.params
        self._simple(op, lambda x: _physical(ref.softmax(_logical(x), p["axis"] % x.ndim, p.get("scale", 1.0))))

    def _fwd_reshape(self, op):
        shape = op.outputs[0].shape
        self._simple(op, lambda x: _physical(_logical(x).reshape(shape)))

    def _fwd_permute(self, op):
        self._simple(op, lambda x: _physical(np.transpose(_logical(x), op.params["perm"])))

    def _fwd_cumsum(self, op):
        p = op.params
        self._simple(op, lambda x: _physical(ref.cumsum(_logical(x), p["axis"], p["exclusive"], p["reverse"])))

    def _fwd_pixel_shuffle(self, op):
        p = op.params
        self._simple(op, lambda x: _physical(ref.pixel_shuffle(_logical(x), p["factor"], p["mode"], p["inverse"])))

    def _fwd_slice(self, op):
        p = op.params
        ax = p["axis"] % len(op.inputs[0].shape)
        self._simple(op, lambda x: _physical(ref.slice_axis(_logical(x), ax, p["start"], p["stop"], p["step"])))

    def _fwd_layer_norm(self, op):
        g, b = self.P(op.inputs[1]), self.P(op.inputs[2])
        p = op.params
        self._simple(op, lambda x: _physical(ref.layer_norm(_logical(x), g, b, p["axis"], p["eps"])))

    def _fwd_prelu(self, op):
        s = self.P(op.inputs[1])
        self._simple(op, lambda x: _physical(ref.prelu(_logical(x), s)))

    # ------------------------------------------------------------------ backward

    def backward(self, dlogits: np.ndarray, input_grads: bool = True):
        """Gradients of every trainable constant (self.pgrads) and, with input_grads, of every
        network input (a training step needs none: the stem's input gradient is skipped)."""
        self.input_grads = input_grads
        self.grads[self.logits.name] = _physical(dlogits)
        for op in reversed(self.ops):
            t0 = time.perf_counter()
            if op.name in self.pattern_of:
                if op.op == "add":             # pass-through bookkeeping only
                    self._bwd_add_virtual(op)
                continue
            gname = op.outputs[0].name
            if op.name in self.stat_of:
                gname = self.stat_of[op.name][1].outputs[0].name
            if gname not in self.grads:
                continue                      # no gradient reaches this op
            getattr(self, "_bwd_" + op.op)(op)
            self.mem.free_written_by(op.name)
            self.mem.free("d:" + op.outputs[0].name)
            dt = time.perf_counter() - t0
            self.timing["conv" if op.op == "conv2d" else
                        ("memory-bound" if op.op in ops.MEMORY_BOUND else "other")] += dt
            self.timing["bwd:" + op.op] += dt
        out = {}
        for d in self.net.inputs:
            g = self.grads.get(d.name)
            if g is not None:
                out[d.name] = cnhw.to_nchw(g) if g.ndim == 4 else g
        self.mem.free_written_by("input")
        return out

    def _wants(self, d) -> bool:
        """Does the backward pass need the gradient of tensor d?"""
        return d.producer is not None or (getattr(self, "input_grads", True) and d in self.net.inputs)

    def _bwd_add_virtual(self, op):
        """The Add inside pattern 4: the C2 unit stored d(Add out); pass it to the operands."""
        dz = self.grads[op.outputs[0].name]
        for d in op.inputs:
            self._contribute(d.name, dz, alias=True)

    def _bwd_conv2d(self, op):
        u = self.log.unit("bwd", op.name)
        x, w = op.inputs[0], op.inputs[1]
        p = op.params
        g = tc.ConvGeom(x.shape, w.shape, p["stride"], p["padding"], p["dilation"], p["groups"])
        direct = direct_conv(x.shape, w.shape, p)
        if direct is not None:
            return self._bwd_direct(op, g, u, direct[1])
        # ---- output side: dy, or F1*dz + B*x + C when this conv feeds a fused BN
        dy_pre, dy = None, None
        if op.name in self.stat_of:
            pat, bn = self.stat_of[op.name]
            dz_name = bn.outputs[0].name
            dz = self.grads[dz_name]
            xb = self.env[op.outputs[0].name]
            u.read("d:" + dz_name, _nb(dz), op.name, side="out")
            u.read(op.outputs[0].name, _nb(xb), bn.name, side="out")
            dy_pre = (dz, xb) + self.bn[bn.name].bwd_coefs(xb.dtype)
        else:
            dy = self.grads[op.outputs[0].name]
            u.read("d:" + op.outputs[0].name, _nb(dy), op.name, side="out")
        # ---- input side: WG input (recomputed through the input stage) and post-processing
        pat = self.c2_of.get(op.name)
        pre, src, post, target = tc.IDENTITY, x, None, x.name
        need_dx = self._wants(x)
        if pat is not None:
            src, pre, post, target = self._bwd_c2(pat, op, u)
        else:
            u.read(x.name, _nb(self.env[x.name]), op.name)
            if self.mode == "fused" and target in self.grads and target in self.fork_owner \
                    and self.fork_owner[target] in self.pattern_of_names():
                acc = self.grads[target]
                u.read("d:" + target, _nb(acc), self.fork_owner[target])
                post = tc.Post(acc=acc)
        dw, db, dx = tc.conv_backward_cnhw(dy, self.env[src.name], self._weight(w), g, pre=pre, post=post,
                                          dy_pre=dy_pre, need_dx=need_dx, has_bias=p["has_bias"])
        self._weight_grad(w, dw, u, op.name)
        if p["has_bias"]:
            self._weight_grad(op.inputs[2], db, u, op.name)
        if op.name in self.stat_of:
            pat_, bn = self.stat_of[op.name]
            self.mem.free("d:" + bn.outputs[0].name)
            if pat_.add is not None:
                self.mem.free("d:" + pat_.add.outputs[0].name)
        if not need_dx:
            return
        if post is not None and post.acc is not None:      # the error Add ran in post-processing
            self.grads.pop(target, None)
        if pat is not None:
            self._finish_c2(pat, op, u, dx, post, target)
        else:
            self._contribute(target, dx, u, op.name)

    def _bwd_direct(self, op, g, u, backward):
        """The backward of a conv kernels/train_direct.py runs (depthwise, small groups, fc)."""
        x, w = op.inputs[0], op.inputs[1]
        dy = self.grads[op.outputs[0].name]
        u.read("d:" + op.outputs[0].name, _nb(dy), op.name, side="out")
        u.read(x.name, _nb(self.env[x.name]), op.name)
        need_dx = self._wants(x)
        dw, db, dx = backward(dy, self.env[x.name], self._weight(w), g, need_dx, op.params["has_bias"])
        self._weight_grad(w, dw, u, op.name)
        if db is not None:
            self._weight_grad(op.inputs[2], db, u, op.name)
        if need_dx:
            self._contribute(x.name, dx, u, op.name)

    def pattern_of_names(self):
        if not hasattr(self, "_pnames"):
            self._pnames = set(self.pattern_of)
        return self._pnames

    def _bwd_c2(self, pat: Pattern, op, u):
        """C2's backward input side: (WG source, Pre, Post, gradient target)."""
        x1 = pat.x1
        ex1 = self.env[x1.name]
        if pat.kind in ("1", "2", "3"):
            u.read(x1.name, _nb(ex1), op.name)
            if pat.kind == "1":
                return x1, tc.Pre(relu=True), tc.Post(mk=ex1), x1.name
            f1, f2 = self.bn[pat.bn.name].fwd_coefs(x1.dtype)
            if pat.kind == "2":
                return x1, tc.Pre(a=f1, b=f2), tc.Post(x1=ex1), pat.bn.outputs[0].name
            return (x1, tc.Pre(a=f1, b=f2, relu=True), tc.Post(mk=ex1, ma=f1, mb=f2, x1=ex1),
                    pat.bn.outputs[0].name)
        r = pat.r
        er = self.env[r.name]
        u.read(r.name, _nb(er), op.name)                   # stored C2 input: WG and ReLU'
        u.read(x1.name, _nb(ex1), pat.bn.name)             # BN step 1 needs BN's input
        acc = self.grads.get(r.name)
        if acc is not None:                                # error Add with the other branch
            u.read("d:" + r.name, _nb(acc), self._layer_of_fork(r.name))
        x3 = self.env[pat.c3.outputs[0].name] if pat.kind == "4-2" else None
        if x3 is not None:
            u.read(pat.c3.outputs[0].name, _nb(x3), pat.bn3.name)
        return r, tc.IDENTITY, tc.Post(acc=acc, mk=er, x1=ex1, x2=x3), pat.add.outputs[0].name

    def _finish_c2(self, pat, op, u, dx, post, target):
        """Store C2's post-processed input gradient; finish BN step 1 of the backward pass."""
        r = pat.r
        self.grads.pop(r.name, None)
        self.mem.free("d:" + r.name)
        self.grads[target] = dx
        u.write("d:" + target, _nb(dx), op.name)
        self.mem.alloc("d:" + target, _nb(dx), "grad", "d:" + target)
        if pat.bn is not None:
            for bn, s2 in ((pat.bn, post.s2a), (pat.bn3, post.s2b)):
                if bn is None:
                    continue
                st = self.bn[bn.name].finalize_backward(post.s1, s2)
                self._param_grad(bn.inputs[1].name, st.dgamma)
                self._param_grad(bn.inputs[2].name, st.dbeta)

    def _bwd_batch_norm(self, op):
        x = self.env[op.inputs[0].name]
        dy = self.grads[op.outputs[0].name]
        st = self.bn[op.name]
        u1 = self.log.unit("bwd", op.name + ".sums")
        u1.read("d:" + op.outputs[0].name, _nb(dy), op.name)
        u1.read(op.inputs[0].name, _nb(x), op.name)
        s1, s2 = norm.bn_bwd_sums(dy, x)
        st.finalize_backward(s1, s2)
        self._param_grad(op.inputs[1].name, st.dgamma)
        self._param_grad(op.inputs[2].name, st.dbeta)
        u2 = self.log.unit("bwd", op.name + ".apply")
        u2.read("d:" + op.outputs[0].name, _nb(dy), op.name)
        u2.read(op.inputs[0].name, _nb(x), op.name)
        self._contribute(op.inputs[0].name, norm.bn_bwd_apply(dy, x, *st.bwd_coefs(x.dtype)), u2, op.name)

    def _bwd_scale(self, op):
        x = self.env[op.inputs[0].name]
        dy = self.grads[op.outputs[0].name]
        u = self.log.unit("bwd", op.name)
        u.read("d:" + op.outputs[0].name, _nb(dy), op.name)
        u.read(op.inputs[0].name, _nb(x), op.name)
        s1, s2 = norm.bn_bwd_sums(dy, x)
        self._param_grad(op.inputs[1].name, s2)
        self._param_grad(op.inputs[2].name, s1)
        a = self.P(op.inputs[1])
        z = np.zeros_like(a)
        self._contribute(op.inputs[0].name, norm.bn_bwd_apply(dy, x, a, z, z), u, op.name)

    def _bwd_group_norm(self, op):
        mean, rstd = self.saved[op.name]
        gamma = self.P(op.inputs[1])

        def fn(dy, x):
            dx, dg, db = norm.group_norm_backward(dy, x, gamma, mean, rstd, op.params["groups"])
            for d, grad in ((op.inputs[1], dg), (op.inputs[2], db)):
                if self.trains(d):              # (GroupNorm(affine=False)'s unit weight, zero bias: buffers)
                    self._param_grad(d.name, grad)
            return dx
        self._bwd_simple(op, fn)

    def _bwd_relu(self, op):
        x = self.env[op.inputs[0].name]
        dy = self.grads[op.outputs[0].name]
        u = self.log.unit("bwd", op.name)
        u.read("d:" + op.outputs[0].name, _nb(dy), op.name)
        u.read(op.inputs[0].name, _nb(x), op.name)
        self._contribute(op.inputs[0].name, ew.relu_backward(dy, x), u, op.name)

    def _bwd_add(self, op):
        if not _plain_add(op):
            return self._bwd_binary(op)
        dy = self.grads[op.outputs[0].name]
        if op.params.get("relu"):
            y = self.env[op.outputs[0].name]
            u = self.log.unit("bwd", op.name)
            u.read("d:" + op.outputs[0].name, _nb(dy), op.name)
            u.read(op.outputs[0].name, _nb(y), op.name)
            dy = ew.relu_backward(dy, y)
            u.write("d:" + op.name + ".pre", _nb(dy), op.name)
        for d in op.inputs:                   # d(a) = d(b) = d(out): no data moves
            if self._wants(d):
                self._contribute(d.name, dy, alias=True)

    def _bwd_simple(self, op, fn, reads_x=True):
        dy = self.grads[op.outputs[0].name]
        u = self.log.unit("bwd", op.name)
        u.read("d:" + op.outputs[0].name, _nb(dy), op.name)
        x = self._input(op.inputs[0])
        if reads_x and not op.inputs[0].is_constant:
            u.read(op.inputs[0].name, _nb(x), op.name)
        dx = fn(dy, x)                        # (fn may also produce parameter gradients)
        if op.inputs[0].is_constant:
            if op.op in _INPUT0_GRAD and self.trains(op.inputs[0]):     # an expression of a parameter
                self._param_grad(op.inputs[0].name, _logical(dx))
        elif self._wants(op.inputs[0]):
            self._contribute(op.inputs[0].name, dx, u, op.name)

    def _phys_shape(self, d):
        s = d.shape
        return (s[1], s[0], s[2], s[3]) if len(s) == 4 else s

    def _bwd_max_pool(self, op):
        idx = self.saved[op.name]
        shape = self._phys_shape(op.inputs[0])
        self._bwd_simple(op, lambda dy, x: pool.max_pool_backward(dy, idx, shape), reads_x=False)

    def _bwd_avg_pool(self, op):
        p = op.params
        shape = self._phys_shape(op.inputs[0])
        self._bwd_simple(op, lambda dy, x: pool.avg_pool_backward(
            dy, shape, p["kernel_size"], p["stride"], p["padding"], p["count_include_pad"]),
            reads_x=False)

    def _bwd_global_avg_pool(self, op):
        shape = self._phys_shape(op.inputs[0])
        self._bwd_simple(op, lambda dy, x: pool.global_avg_pool_backward(dy, shape), reads_x=False)

    def _bwd_resize(self, op):
        p, hw = op.params, op.inputs[0].shape[2:]
        self._bwd_simple(op, lambda dy, x: trs.resize_backward(
            dy, hw, p["size"], p["scales"], p["mode"], p["coord"], p["nearest_mode"], p["arith"],
            p.get("cubic_a", -0.75), p.get("cubic_exclude", False)), reads_x=False)

    def _bwd_adaptive_avg_pool(self, op):
        hw = op.inputs[0].shape[2:]
        self._bwd_simple(op, lambda dy, x: trs.adaptive_avg_pool_backward(dy, hw, op.params["output_size"]),
                         reads_x=False)

    def _bwd_adaptive_max_pool(self, op):
        self._bwd_simple(op, lambda dy, x: trs.adaptive_max_pool_backward(dy, x, op.params["output_size"]))

    def _bwd_channel_shuffle(self, op):
        """The inverse permutation: dy into zeros at [start, stop) of the shuffled channels, viewed (N, C/g, g, ..)
        and transposed back, split among the concatenated inputs."""
        p, dy = op.params, _logical(self.grads[op.outputs[0].name])
        u = self.log.unit("bwd", op.name)
        u.read("d:" + op.outputs[0].name, _nb(dy), op.name)
        sizes = [d.shape[1] for d in op.inputs]
        n, c, g = dy.shape[0], sum(sizes), p["groups"]
        full = np.zeros((n, c) + dy.shape[2:], dy.dtype)
        full[:, p["start"]:p["start"] + dy.shape[1]] = dy
        # (N, C, H, W) -> (N, C/g, g, H, W) -> (N, g, C/g, H, W) -> (N, C, H, W): channel c of the input
        dx = full.reshape((n, c // g, g) + dy.shape[2:]).swapaxes(1, 2).reshape(full.shape)
        for d, part in zip(op.inputs, np.split(dx, np.cumsum(sizes)[:-1], axis=1)):
            if self._wants(d):
                self._contribute(d.name, _physical(part), u, op.name)

    def _bwd_local_response_norm(self, op):
        p = op.params
        self._bwd_simple(op, lambda dy, x: _physical(te.local_response_norm_backward(
            _logical(dy), _logical(x), p["size"], p["alpha"], p["beta"], p["k"])))

    def _bwd_channel_norm(self, op):
        gamma, p = self.P(op.inputs[1]), op.params

        self._bwd_norm(op, lambda dy, x: te.channel_norm_backward(dy, x, gamma, p["eps"], p["mode"]))

    def _bwd_conv_transpose2d(self, op):
        w, has_bias = op.inputs[1], op.params["has_bias"]

        def run(dy, x):
            dw, db, dx = tc.conv_transpose_backward_cnhw(dy, x, self.P(w), self._convt_geom(op),
                                                         self._wants(op.inputs[0]), has_bias)
            self._param_grad(w.name, dw)
            if has_bias:
                self._param_grad(op.inputs[2].name, db)
            return dx
        self._bwd_simple(op, run)

    def _bwd_flatten(self, op):
        d = op.inputs[0]

        def run(dy, x):
            if len(d.shape) == 4:
                n, c, h, w = d.shape
                return np.ascontiguousarray(dy.reshape(n, c, h, w).transpose(1, 0, 2, 3))
            return dy.reshape(d.shape)
        self._bwd_simple(op, run, reads_x=False)

    def _bwd_linear(self, op):
        w = self.P(op.inputs[1])
        has_bias = op.params["has_bias"]

        def run(dy, x):
            if op.params.get("relu"):
                dy = dy * (self.env[op.outputs[0].name] > 0)
            xl, dyl = _logical(x), _logical(dy)      # (..., K), (..., M) -> rows
            dx, dw, db = dense.linear_backward(dyl.reshape(-1, dyl.shape[-1]), xl.reshape(-1, xl.shape[-1]), w,
                                               has_bias)
            self._param_grad(op.inputs[1].name, dw)
            if has_bias:
                self._param_grad(op.inputs[2].name, db)
            return _physical(dx.reshape(xl.shape))
        self._bwd_simple(op, run)

    def _bwd_dropout(self, op):
        mask = self.saved[op.name]
        self._bwd_simple(op, lambda dy, x: dy * mask if mask is not None else dy, reads_x=False)

    def _bwd_concat(self, op):
        dy = self.grads[op.outputs[0].name]
        ax = op.params["axis"] % len(op.inputs[0].shape)
        phys = {0: 1, 1: 0}.get(ax, ax) if len(op.inputs[0].shape) == 4 else ax
        u = self.log.unit("bwd", op.name)
        u.read("d:" + op.outputs[0].name, _nb(dy), op.name)
        sizes = np.cumsum([d.shape[ax] for d in op.inputs])[:-1]
        for d, part in zip(op.inputs, np.split(dy, sizes, axis=phys)):
            if d.is_constant:                         # a trained one (a class token): its gradient, IR layout
                self._operand_grads(op, [(d, _logical(np.ascontiguousarray(part)))], u)
            elif self._wants(d):
                self._contribute(d.name, np.ascontiguousarray(part), u, op.name)

    def _bwd_binary(self, op):
        dy = self.grads[op.outputs[0].name]
        u = self.log.unit("bwd", op.name)
        u.read("d:" + op.outputs[0].name, _nb(dy), op.name)
        dy = _logical(dy)
        if op.params.get("relu"):
            y = self.env[op.outputs[0].name]
            u.read(op.outputs[0].name, _nb(y), op.name)
            dy = np.where(_logical(y) > 0, dy, np.zeros((), dy.dtype))
        vals = []
        for d in op.inputs:
            if not d.is_constant:
                u.read(d.name, _nb(self.env[d.name]), op.name)
            vals.append(self._value(d))
        self._operand_grads(op, zip(op.inputs, te.binary_backward(op.op, dy, *vals)), u)

    def _bwd_activation(self, op):
        act = op.params["act"]
        if act[0] == "sqrt" and self._is_vector_norm(op):
            # torch.linalg.vector_norm's rule (F.normalize, x.norm(dim=1)): a zero vector's norm has gradient 0
            def fn(dy, x):
                dx = te.activation_backward(act, dy, x)
                return np.where(x == 0, np.zeros((), dx.dtype), dx)
            self._bwd_simple(op, fn)
            return
        self._bwd_simple(op, lambda dy, x: te.activation_backward(act, dy, x))

    @staticmethod
    def _is_vector_norm(op) -> bool:
        """sqrt(sum(x * x)): Network.vector_norm's ord-2 form."""
        s = op.inputs[0].producer
        m = s.inputs[0].producer if s is not None and s.op == "sum" else None
        return m is not None and m.op == "mul" and m.inputs[0] is m.inputs[1]

    def _bwd_reduce(self, op):
        shape, p = op.inputs[0].shape, op.params
        self._bwd_simple(op, lambda dy, x: _physical(te.reduce_backward(op.op, _logical(dy), shape, p["axes"],
                                                                         p["keepdim"])), reads_x=False)

    _bwd_mean = _bwd_sum = _bwd_reduce

    def _bwd_max(self, op):
        y = _logical(self.env[op.outputs[0].name])
        self._bwd_simple(op, lambda dy, x: _physical(te.max_backward(_logical(dy), _logical(x), y, op.params["axes"],
                                                                      op.params["keepdim"])))

    def _operand_grads(self, op, grads, u=None):
        """Contribute the gradients of op's operands (IR layout): activations, trained constants."""
        u = u if u is not None else self.log.unit("bwd", op.name)
        for d, g in grads:
            if d.is_constant:
                if self.trains(d):
                    self._param_grad(d.name, g)
            elif self._wants(d):
                self._contribute(d.name, _physical(g), u, op.name)

    def _bwd_where(self, op):
        dy = _logical(self.grads[op.outputs[0].name])
        l, r, a, b = (self._value(d) for d in op.inputs)
        with np.errstate(invalid="ignore"):
            cond = ref._CMP[op.params["cmp"]](l, r)
        self._operand_grads(op, zip(op.inputs[2:], te.where_backward(dy, cond, a.shape, b.shape)))

    def _bwd_matmul(self, op):
        dy = _logical(self.grads[op.outputs[0].name])
        self._operand_grads(op, zip(op.inputs, te.matmul_backward(dy, *(self._value(d) for d in op.inputs))))

    def _bwd_grid_sample(self, op):
        """The input's gradient and the grid's (a computed grid: a flow, an affine_grid of a computed theta)."""
        p, dy = op.params, _logical(self.grads[op.outputs[0].name])
        u = self.log.unit("bwd", op.name)
        u.read("d:" + op.outputs[0].name, _nb(dy), op.name)
        for d in op.inputs:
            if not d.is_constant:
                u.read(d.name, _nb(self.env[d.name]), op.name)
        x, grid = (self._value(d) for d in op.inputs)
        grads = trs.grid_sample_backward(dy, x, grid, p["mode"], p["padding_mode"], p["align_corners"])
        self._operand_grads(op, zip(op.inputs, grads), u)

    def _bwd_take(self, op):
        """The table's gradient (an nn.Embedding's weight, a computed tensor); the indices (integers) get none."""
        p, dy = op.params, _logical(self.grads[op.outputs[0].name])
        x, idx = (self._value(d) for d in op.inputs)
        dx = te.take_backward(dy, x.shape, idx, p["axis"] % x.ndim, p["negative"], p.get("padding_idx"),
                              p.get("scale_grad_by_freq", False))
        self._operand_grads(op, [(op.inputs[0], dx)])

    def _bwd_pad(self, op):
        p, shape = op.params, op.inputs[0].shape
        self._bwd_simple(op, lambda dy, x: _physical(te.pad_backward(_logical(dy), shape, p["pads"], p["mode"])),
                         reads_x=False)

    def _bwd_softmax(self, op):
        p = op.params
        y = _logical(self.env[op.outputs[0].name])
        self._bwd_simple(op, lambda dy, x: _physical(te.softmax_backward(
            _logical(dy), y, p["axis"] % y.ndim, p.get("scale", 1.0))), reads_x=False)

    def _bwd_reshape(self, op):
        shape = op.inputs[0].shape
        self._bwd_simple(op, lambda dy, x: _physical(_logical(dy).reshape(shape)), reads_x=False)

    def _bwd_permute(self, op):
        inv = tuple(int(i) for i in np.argsort(op.params["perm"]))
        self._bwd_simple(op, lambda dy, x: _physical(np.transpose(_logical(dy), inv)), reads_x=False)

    def _bwd_cumsum(self, op):
        """y_i = sum over j <= i of x_j: dx_j = sum over i >= j of dy_i, the cumsum of dy the other way (exclusive
        stays exclusive)."""
        p = op.params
        self._bwd_simple(op, lambda dy, x: _physical(ref.cumsum(_logical(dy), p["axis"], p["exclusive"],
                                                                not p["reverse"])), reads_x=False)

    def _bwd_pixel_shuffle(self, op):
        """A permutation of the elements: dy through the inverse shuffle."""
        p = op.params
        self._bwd_simple(op, lambda dy, x: _physical(ref.pixel_shuffle(_logical(dy), p["factor"], p["mode"],
                                                                       not p["inverse"])), reads_x=False)

    def _bwd_slice(self, op):
        p, shape = op.params, op.inputs[0].shape
        ax = p["axis"] % len(shape)

        def run(dy, x):               # the slice's gradient scattered into zeros of the input's shape
            dx = np.zeros(shape, dy.dtype)
            idx = [slice(None)] * len(shape)
            idx[ax] = slice(p["start"], p["stop"], p["step"])
            dx[tuple(idx)] = _logical(dy)
            return _physical(dx)
        self._bwd_simple(op, run, reads_x=False)

    def _bwd_layer_norm(self, op):
        gamma, p = self.P(op.inputs[1]), op.params

        self._bwd_norm(op, lambda dy, x: te.layer_norm_backward(dy, x, gamma, p["axis"], p["eps"]))

    def _bwd_norm(self, op, fn):
        """A norm with (x, gamma, beta): (dx, dgamma, dbeta) = fn(dy, x) on the IR-layout views; gamma and beta
        get theirs where they train (not an importer's unit weight / zero bias)."""
        def run(dy, x):
            dx, dg, db = fn(_logical(dy), _logical(x))
            for d, grad in ((op.inputs[1], dg), (op.inputs[2], db)):
                if self.trains(d):
                    self._param_grad(d.name, grad)
            return _physical(dx)
        self._bwd_simple(op, run)

    def _bwd_prelu(self, op):
        s = op.inputs[1]

        def run(dy, x):
            dx, ds = te.prelu_backward(_logical(dy), _logical(x), self.P(s))
            if self.trains(s):
                self._param_grad(s.name, ds)
            return _physical(dx)
        self._bwd_simple(op, run)


for _kind in ops.BINARY:
    if _kind != "add":
        setattr(TrainingSchedule, "_fwd_" + _kind, TrainingSchedule._fwd_binary)
        setattr(TrainingSchedule, "_bwd_" + _kind, TrainingSchedule._bwd_binary)


def _plain_add(op) -> bool:
    """An add of two activations of one shape: the kernels (and the fused patterns) of seed 004."""
    return op.inputs[0].shape == op.inputs[1].shape and not any(d.is_constant for d in op.inputs)
