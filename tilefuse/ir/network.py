"""Network: op nodes plus ordered variable inputs and outputs, and the builder most users use.

    net = tilefuse.Network("tiny")
    x = net.input("x", (1, 3, 32, 32))
    y = net.conv2d(x, w, b, stride=1, padding=1)
    y = net.relu(y)
    net.output(y)

Every builder call normalizes its parameters and infers the output shape at once, so a wrong
shape, dtype or parameter raises a GraphError naming the node.
"""
from __future__ import annotations

import itertools
import math
from typing import Iterable, Sequence

import numpy as np

from ..errors import GraphError
from ..kernels import reference as ref
from . import ops as opdefs
from .node import DataNode, OpNode, integer_dtype


MAX_SORTED = 64     # the longest axis `Network.sorted_slices` orders (Batcher's: ~n log^2 n / 4 comparators)


def batcher_pairs(n: int) -> list[tuple[int, int]]:
    """Batcher's odd-even merge sort for n values: comparators (i, j), i < j, in order (min to i, max to j). Built
    for the power of two N >= n and cut to n: the missing inputs stand for +inf, which a comparator leaves where it
    is, so every comparator reaching past n is a no-op and dropped."""
    big = 1 << max(0, (n - 1).bit_length())
    pairs, p = [], 1
    while p < big:
        k = p
        while k >= 1:
            for j in range(k % p, big - k, 2 * k):
                for i in range(min(k, big - j - k)):
                    if (i + j) // (2 * p) == (i + j + k) // (2 * p) and i + j + k < n:
                        pairs.append((i + j, i + j + k))
            k //= 2
        p *= 2
    return pairs


class Network:
    """A directed acyclic graph of OpNodes over DataNodes.

    `ops` are kept in a topological order; `inputs` and `outputs` are ordered variable nodes.
    """

    def __init__(self, name: str = "network", ops: Sequence[OpNode] | None = None,
                 inputs: Sequence[DataNode] | None = None, outputs: Sequence[DataNode] | None = None):
        self.name = str(name)
        self.ops: list[OpNode] = []
        self.inputs: list[DataNode] = list(inputs or [])
        self.outputs: list[DataNode] = []
        self._names: set[str] = {d.name for d in self.inputs}
        self._counter = itertools.count()
        # constant name -> "parameter" / "buffer" / "derived from parameter '<key>'", where an importer knows
        # (from_torch: nn.Parameter or not); the Trainer trains the parameters among the operands of ops that
        # have no weight slot (a layer scale's mul) and refuses a constant whose origin it cannot tell
        self.constant_origin: dict[str, str] = {}
        # constant name -> (parameter key, parameter shape) where the constant is a parameter's elements in their
        # own order under another name or shape (from_torch: `w.view(1, -1, 1, 1)`, `w[:, None, None]`): the
        # Trainer trains the parameter, reading it in the constant's shape
        self.constant_alias: dict[str, tuple[str, tuple]] = {}
        # constant name -> (G, the parameter's value) where the constant is some of a parameter's elements in another
        # order (from_torch: Swin's `table[index.view(-1)].view(N, N, -1).permute(2, 0, 1)`): its flat values are
        # the parameter's flat values at G (int64, the constant's size); constant_alias names the parameter, and
        # the Trainer trains it (gradient: a scatter-add of the constant's at G)
        self.constant_gather: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        # input name -> the integer dtype (a numpy dtype string) the model declares it with: the input computes as
        # its float dtype, and a run takes an integer array for it where every value is exact in that float
        # (ir/node.py check_inputs); a diffusion model's timesteps
        self.integer_inputs: dict[str, str] = {}
        # output name -> the integer dtype it is returned as (`output(..., integer=)`: argmax's indices, computed as
        # exact floats): a run checks that every value is an integer and converts (runtime/session.py)
        self.integer_outputs: dict[str, str] = {}
        # state-dict key -> value of each persistent buffer of the module an importer read (from_torch): the
        # Trainer's state_dict hands back those that training does not update (a normalization's `mean` / `std`,
        # a spatial transformer's base theta) as they were, so that the module's load_state_dict takes it whole
        self.module_buffers: dict[str, np.ndarray] = {}
        # module path -> what its training-mode forward does that the eval-mode graph does not (from_torch: a
        # spectral norm's power iteration, which updates its u / v buffers); the Trainer refuses such a network
        self.train_mode_updates: dict[str, str] = {}
        # batch_norm op name -> its module's momentum for the running statistics (None: PyTorch's cumulative
        # average), where an importer knows it (from_torch); the Trainer's default for the others
        self.bn_momentum: dict[str, float | None] = {}
        if ops:
            self.ops = _toposort(list(ops), self.inputs)
            for op in self.ops:
                self._names.add(op.name)
                for d in op.inputs + op.outputs:
                    self._names.add(d.name)
        if outputs:
            self.output(*outputs)

    # ---------------------------------------------------------------- graph queries

    @property
    def data(self) -> dict[str, DataNode]:
        """All data nodes by name, in first-appearance order."""
        out: dict[str, DataNode] = {d.name: d for d in self.inputs}
        for op in self.ops:
            for d in op.inputs + op.outputs:
                out.setdefault(d.name, d)
        return out

    def constants(self) -> list[DataNode]:
        return [d for d in self.data.values() if d.is_constant]

    def hidden(self) -> list[DataNode]:
        """Variables that are neither network inputs nor outputs."""
        io = {id(d) for d in self.inputs + self.outputs}
        return [d for d in self.data.values() if not d.is_constant and id(d) not in io]

    def op(self, name: str) -> OpNode:
        for o in self.ops:
            if o.name == name:
                return o
        raise KeyError(f"network '{self.name}' has no op named '{name}'")

    def __len__(self) -> int:
        return len(self.ops)

    def __repr__(self) -> str:
        return f"Network({self.name!r}, {len(self.ops)} ops, inputs={[d.name for d in self.inputs]}, " \
               f"outputs={[d.name for d in self.outputs]})"

    def summary(self) -> str:
        lines = [f"network {self.name}: {len(self.ops)} ops"]
        for d in self.inputs:
            lines.append(f"  input  {d.name:<24} {d.shape} {d.dtype}")
        for op in self.ops:
            ins = ", ".join(d.name for d in op.inputs if not d.is_constant)
            lines.append(f"  {op.op:<20} {op.name:<24} ({ins}) -> {op.outputs[0].shape}")
        for d in self.outputs:
            lines.append(f"  output {d.name:<24} {d.shape} {d.dtype}")
        return "\n".join(lines)

    # ---------------------------------------------------------------- construction

    def _fresh(self, base: str) -> str:
        while True:
            name = f"{base}_{next(self._counter)}"
            if name not in self._names:
                return name

    def _claim(self, name: str) -> str:
        if name in self._names:
            raise GraphError(name, f"name '{name}' is already used in network '{self.name}'; "
                                   f"expected a unique name")
        self._names.add(name)
        return name

    def input(self, name: str, shape, dtype=np.float32, integer=None) -> DataNode:
        """Declare a variable network input (in order). `integer`: an integer dtype the model declares the input
        with (its values are integers: timesteps, a class index as a number); it computes as `dtype`, and a run
        takes an array of any integer dtype for it whose values `dtype` holds exactly."""
        d = DataNode(self._claim(name), shape, dtype)
        if integer is not None:
            self.integer_inputs[d.name] = integer_dtype(integer, d.name).str
        self.inputs.append(d)
        return d

    def input_specs(self) -> list[tuple]:
        """(name, shape, dtype, integer dtype or None) of each input, for `check_inputs`."""
        return [(d.name, d.shape, d.dtype, self.integer_inputs.get(d.name)) for d in self.inputs]

    def constant(self, name: str, array, dtype=None, nonfinite: bool = False) -> DataNode:
        """A data node with a bound constant (NaN and infinities only with `nonfinite`: `DataNode.bind_constant`)."""
        a = np.asarray(array)
        if dtype is None:
            dtype = a.dtype if a.dtype in (np.float16, np.float32, np.float64) else np.float32
        d = DataNode(self._claim(name), a.shape, dtype)
        d.bind_constant(a.astype(dtype, copy=False), nonfinite)
        return d

    def output(self, *nodes: DataNode, integer=None) -> None:
        """Mark data nodes as network outputs (in order). `integer`: an integer dtype (np.int64) the outputs are
        returned as (`integer_outputs`): their values are integers (argmax's indices), which a run checks and
        converts."""
        for d in nodes:
            if not isinstance(d, DataNode):
                raise GraphError(self.name, f"output() takes DataNodes, got {type(d).__name__}")
            if d.is_constant:
                raise GraphError(d.name, "a constant cannot be a network output; expected a computed node")
            if d.producer is None:
                raise GraphError(d.name, "is a network input; expected an op's output as network output")
            if any(d is o for o in self.outputs):
                raise GraphError(d.name, "is already a network output")
            self.outputs.append(d)
            if integer is not None:
                self.integer_outputs[d.name] = integer_dtype(integer, d.name).str

    def add_op(self, op: str, inputs: Sequence[DataNode], params: dict | None = None,
               name: str | None = None) -> DataNode:
        """Append an op (inputs must already exist), infer its output and return it."""
        name = name if name else self._fresh(op)
        if name in self._names:
            raise GraphError(name, f"name '{name}' is already used in network '{self.name}'; "
                                   f"expected a unique name")
        sch = opdefs.schema(op, name)
        p = sch.normalize(name, dict(params or {}))
        roles = sch.input_roles(p)
        variadic = roles and roles[-1].endswith("*")
        if (not variadic and len(inputs) != len(roles)) or (variadic and len(inputs) < 1):
            raise GraphError(name, f"{op} takes inputs ({', '.join(roles)}), got {len(inputs)}")
        for d in inputs:
            if not isinstance(d, DataNode):
                raise GraphError(name, f"input {d!r} is not a DataNode")
        fixed = opdefs.CONSTANT_ROLES.get(op, ())
        for role, d in zip(roles, inputs):
            if role in fixed and not d.is_constant:
                raise GraphError(name, f"{op}'s {role} '{d.name}' {d.shape} is computed by the network; expected a "
                                       f"constant (Network.conv2d lowers a conv of a computed weight or bias to "
                                       f"im2col and a matmul; elsewhere use mul / add ops)")
        shape = sch.infer(name, list(inputs), p)
        self._claim(name)
        out = DataNode(name, shape, inputs[0].dtype)
        node = OpNode(name=name, op=op, inputs=list(inputs), outputs=[out], params=p)
        out.producer = node
        for d in inputs:
            d.consumers.append(node)
        self.ops.append(node)
        return out

    def _const(self, opname: str, role: str, v, dtype) -> DataNode:
        if isinstance(v, DataNode):
            return v
        return self.constant(f"{opname}.{role}", np.asarray(v), dtype=dtype)

    def _name(self, op: str, name: str | None) -> str:
        return name if name else self._fresh(op)

    # ---------------------------------------------------------------- builder ops

    def conv2d(self, x: DataNode, weight, bias=None, stride=1, padding=0, dilation=1, groups=1,
               name: str | None = None) -> DataNode:
        n = self._name("conv2d", name)
        computed = isinstance(weight, DataNode) and not weight.is_constant
        if isinstance(bias, DataNode) and not bias.is_constant and not computed:
            # a computed bias (O,): the conv without one, the bias added as (1, O, 1, 1)
            y = self.conv2d(x, weight, None, stride, padding, dilation, groups, name=f"{n}.nobias")
            if tuple(bias.shape) != (y.shape[1],):
                raise GraphError(n, f"bias '{bias.name}' has shape {bias.shape}, expected {(y.shape[1],)}")
            return self.add(y, self.reshape(bias, (1, y.shape[1], 1, 1), name=f"{n}.bias4"), name=n)
        ins = [x, self._const(n, "weight", weight, x.dtype)]
        if bias is not None:
            ins.append(self._const(n, "bias", bias, x.dtype))
        return self.add_op("conv2d", ins, dict(stride=stride, padding=padding, dilation=dilation,
                                               groups=groups, has_bias=bias is not None), n)

    def conv2d_as_matmul(self, x: DataNode, w: DataNode, bias, stride, padding, dilation, groups,
                         n: str) -> DataNode:
        """A conv whose weight the network computes (StyleGAN2's modulated conv, CondConv / dynamic conv's
        per-sample kernels folded into groups) as im2col and a batched matmul, for the compiled runtime, whose conv
        kernels read prepared constant weights (compiler.passes.lower_computed_convs; the conv op itself carries
        such a weight for the reference evaluator and the Trainer).
        cols = unfold(pad(x)) (N, C kh kw, L) -> (N, g, C/g kh kw, L) (its channels (c, i, j) in c's
        order, so group gi's rows are contiguous); w (O, C/g, kh, kw) -> (g, O/g, C/g kh kw) (the same (c, i, j)
        order per output); matmul broadcasts to (N, g, O/g, L) -> (N, O, Ho, Wo); a bias (O,) added as (1, O, 1, 1).
        Shapes and attributes are checked as the conv op checks them."""
        sch = opdefs.schema("conv2d", n)
        p = sch.normalize(n, dict(stride=stride, padding=padding, dilation=dilation, groups=groups,
                                  has_bias=False))
        _, o, ho, wo = sch.infer(n, [x, w], p)
        bn, c = x.shape[:2]
        g, (kh, kw), (t, b, left, r) = p["groups"], w.shape[2:], p["padding"]
        xp = self.pad(x, (0, 0, 0, 0, t, b, left, r), name=f"{n}.pad") if t or b or left or r else x
        cols = self.unfold(xp, (kh, kw), p["dilation"], 0, p["stride"], name=f"{n}.cols")    # (N, C kh kw, L)
        k = c // g * kh * kw
        if g > 1:
            cols = self.reshape(cols, (bn, g, k, ho * wo), name=f"{n}.cols_g")               # (N, g, C/g kh kw, L)
        wm = self.reshape(w, (g, o // g, k) if g > 1 else (o, k), name=f"{n}.w")             # (g, O/g, C/g kh kw)
        y = self.matmul(wm, cols, name=f"{n}.mm")                                           # (N, g, O/g, L)
        if bias is None:
            return self.reshape(y, (bn, o, ho, wo), name=n)
        y = self.reshape(y, (bn, o, ho, wo), name=f"{n}.nobias")
        bd = self._const(n, "bias", bias, x.dtype)
        if tuple(bd.shape) != (o,):
            raise GraphError(n, f"bias '{bd.name}' has shape {bd.shape}, expected {(o,)}")
        if not bd.is_constant:
            return self.add(y, self.reshape(bd, (1, o, 1, 1), name=f"{n}.bias4"), name=n)
        b4 = self.constant(f"{n}.bias4", np.asarray(bd.value).reshape(1, o, 1, 1), dtype=x.dtype)
        # (the same parameter as the bias: its origin, and its name and shape for the trainer's gradient)
        self.constant_alias[b4.name] = self.constant_alias.get(bd.name, (bd.name, bd.shape))
        for table in (self.constant_origin, self.constant_gather):
            if bd.name in table:
                table[b4.name] = table[bd.name]
        return self.add(y, b4, name=n)

    def batch_norm(self, x: DataNode, gamma, beta, mean, var, eps=1e-5, name: str | None = None) -> DataNode:
        n = self._name("batch_norm", name)
        ins = [x] + [self._const(n, r, v, x.dtype) for r, v in
                     (("gamma", gamma), ("beta", beta), ("mean", mean), ("var", var))]
        return self.add_op("batch_norm", ins, {"eps": eps}, n)

    def scale(self, x: DataNode, alpha, beta, name: str | None = None) -> DataNode:
        n = self._name("scale", name)
        return self.add_op("scale", [x, self._const(n, "alpha", alpha, x.dtype),
                                     self._const(n, "beta", beta, x.dtype)], {}, n)

    def relu(self, x: DataNode, name: str | None = None) -> DataNode:
        return self.add_op("relu", [x], {}, name)

    def add(self, a: DataNode, b: DataNode, name: str | None = None) -> DataNode:
        return self.add_op("add", [a, b], {}, name)

    def max_pool(self, x: DataNode, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                 name: str | None = None) -> DataNode:
        return self.add_op("max_pool", [x], dict(kernel_size=kernel_size, stride=stride, padding=padding,
                                                 dilation=dilation, ceil_mode=ceil_mode), name)

    def avg_pool(self, x: DataNode, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True, name: str | None = None) -> DataNode:
        return self.add_op("avg_pool", [x], dict(kernel_size=kernel_size, stride=stride, padding=padding,
                                                 ceil_mode=ceil_mode, count_include_pad=count_include_pad),
                           name)

    def global_avg_pool(self, x: DataNode, name: str | None = None) -> DataNode:
        return self.add_op("global_avg_pool", [x], {}, name)

    def linear(self, x: DataNode, weight, bias=None, name: str | None = None) -> DataNode:
        n = self._name("linear", name)
        ins = [x, self._const(n, "weight", weight, x.dtype)]
        if bias is not None:
            ins.append(self._const(n, "bias", bias, x.dtype))
        return self.add_op("linear", ins, {"has_bias": bias is not None}, n)

    def flatten(self, x: DataNode, start_dim: int = 1, name: str | None = None) -> DataNode:
        return self.add_op("flatten", [x], {"start_dim": start_dim}, name)

    def softmax(self, x: DataNode, axis: int = 1, name: str | None = None) -> DataNode:
        return self.add_op("softmax", [x], {"axis": axis}, name)

    def local_response_norm(self, x: DataNode, size: int, alpha=1e-4, beta=0.75, k=1.0,
                            name: str | None = None) -> DataNode:
        return self.add_op("local_response_norm", [x], dict(size=size, alpha=alpha, beta=beta, k=k), name)

    def concat(self, xs: Iterable[DataNode], axis: int = 1, name: str | None = None) -> DataNode:
        return self.add_op("concat", list(xs), {"axis": axis}, name)

    def dropout(self, x: DataNode, p: float = 0.5, name: str | None = None, mode: str = "element") -> DataNode:
        """The identity at inference; in training (the Trainer) x times a random keep mask / (1 - p), one draw per
        element, per (sample, channel), per sample or per batch (`ops.DROPOUT_MODES`)."""
        return self.add_op("dropout", [x], {"p": p, "mode": mode}, name)

    # ---------------------------------------------------------------- modern CNN ops (issue 9)

    def conv_transpose2d(self, x: DataNode, weight, bias=None, stride=1, padding=0, output_padding=0,
                         dilation=1, groups=1, name: str | None = None) -> DataNode:
        """weight (C_in, C_out/groups, kh, kw), PyTorch ConvTranspose2d semantics."""
        n = self._name("conv_transpose2d", name)
        ins = [x, self._const(n, "weight", weight, x.dtype)]
        if bias is not None:
            ins.append(self._const(n, "bias", bias, x.dtype))
        return self.add_op("conv_transpose2d", ins, dict(stride=stride, padding=padding,
                                                         output_padding=output_padding, dilation=dilation,
                                                         groups=groups, has_bias=bias is not None), n)

    def activation(self, x: DataNode, act: str, name: str | None = None, **params) -> DataNode:
        """act(x) with an activation of kernels/activations.py: "silu", "clip" (min=, max=), ...
        ReLU is the relu op."""
        if act == "relu" and not params:
            return self.relu(x, name=name)
        return self.add_op("activation", [x], {"act": (act, params)}, name)

    def power(self, x: DataNode, p: float, name: str | None = None) -> DataNode:
        """x ** p as activation(pow), which holds p in float32. Every float32 of magnitude >= 2^24 is an even
        integer, so an odd integer p beyond that (ONNX's int32 exponent 2^31 - 1) would lose the sign of a
        negative x: it is pow(x, p - 1) * x then (pow(x, p + 1) / x for p < 0, so that 0 gives inf, not inf * 0),
        as PyTorch and ONNX Runtime keep the sign (the even power differs from x^p by the factor x: within
        float32 the same 0, inf or e^(p ln x))."""
        if abs(p) < 2 ** 24 or p != int(p) or int(p) % 2 == 0:
            return self.activation(x, "pow", name=name, exponent=p)
        even = self.activation(x, "pow", name=self._fresh(f"{name or 'pow'}.even"), exponent=p - 1 if p > 0 else p + 1)
        return self.mul(even, x, name=name) if p > 0 else self.div(even, x, name=name)

    def sigmoid(self, x: DataNode, name: str | None = None) -> DataNode:
        return self.activation(x, "sigmoid", name)

    def silu(self, x: DataNode, name: str | None = None) -> DataNode:
        return self.activation(x, "silu", name)

    def hardswish(self, x: DataNode, name: str | None = None) -> DataNode:
        return self.activation(x, "hardswish", name)

    def hardsigmoid(self, x: DataNode, name: str | None = None) -> DataNode:
        return self.activation(x, "hardsigmoid", name)

    def relu6(self, x: DataNode, name: str | None = None) -> DataNode:
        return self.activation(x, "clip", name, min=0.0, max=6.0)

    def gelu(self, x: DataNode, approximate: str = "none", name: str | None = None) -> DataNode:
        return self.activation(x, "gelu_tanh" if approximate == "tanh" else "gelu", name)

    def prelu(self, x: DataNode, slope, name: str | None = None) -> DataNode:
        n = self._name("prelu", name)
        return self.add_op("prelu", [x, self._const(n, "weight", np.asarray(slope).reshape(-1), x.dtype)], {}, n)

    def _binary(self, kind: str, a, b, name: str | None) -> DataNode:
        n = self._name(kind, name)
        # a number is a (1,) constant, or () beside a 0-d tensor (so that the result keeps the tensor's shape)
        if not isinstance(a, DataNode):
            a = self._const(n, "a", np.asarray(a, dtype=b.dtype).reshape(np.shape(a) or (1,) * bool(b.shape)),
                            b.dtype)
        if not isinstance(b, DataNode):
            b = self._const(n, "b", np.asarray(b, dtype=a.dtype).reshape(np.shape(b) or (1,) * bool(a.shape)),
                            a.dtype)
        return self.add_op(kind, [a, b], {}, n)

    def sub(self, a, b, name: str | None = None) -> DataNode:
        """a - b with NumPy broadcasting; either may be a constant array or a number."""
        return self._binary("sub", a, b, name)

    def mul(self, a, b, name: str | None = None) -> DataNode:
        return self._binary("mul", a, b, name)

    def div(self, a, b, name: str | None = None) -> DataNode:
        return self._binary("div", a, b, name)

    def matmul(self, a: DataNode, b: DataNode, name: str | None = None) -> DataNode:
        """a @ b as np.matmul / torch.matmul: the batch axes broadcast; a 1-D a is a row (K,) -> (1, K) and a 1-D b
        a column (K,) -> (K, 1), that axis dropped from the product again (reshapes around the matmul op, which
        takes rank >= 2); either may be a constant array."""
        n = self._name("matmul", name)
        dt = a.dtype if isinstance(a, DataNode) else b.dtype
        a, b = self._const(n, "a", a, dt), self._const(n, "b", b, dt)
        if len(a.shape) == 1 and len(b.shape) == 1:
            raise GraphError(n, f"the product of two vectors {a.shape} and {b.shape} is a scalar; tilefuse has no "
                                f"0-d tensors")
        ra, rb = len(a.shape) == 1, len(b.shape) == 1
        if not ra and not rb:
            return self.add_op("matmul", [a, b], {}, n)
        if ra:
            a = self.reshape(a, (1,) + a.shape, name=self._fresh(n + ".row"))          # (K,) -> (1, K)
        if rb:
            b = self.reshape(b, b.shape + (1,), name=self._fresh(n + ".column"))       # (K,) -> (K, 1)
        y = self.add_op("matmul", [a, b], {}, self._fresh(n + ".matmul"))
        # (..., 1, N) -> (..., N) or (..., M, 1) -> (..., M)
        return self.reshape(y, y.shape[:-2] + y.shape[-1:] if ra else y.shape[:-1], name=n)

    def einsum(self, equation: str, a: DataNode, b: DataNode, name: str | None = None) -> DataNode:
        """torch.einsum / ONNX Einsum of two tensors, composed of IR ops: the labels of one operand only (and not
        the output) summed out, then each operand permuted to (batch, own, contracted) / (batch, contracted, own)
        and reshaped to 3-D, one matmul, reshaped back and permuted to the output's order. Explicit output labels
        (or the implicit sorted form); no ellipsis, no label repeated within an operand (a diagonal)."""
        n = self._name("einsum", name)
        eq = equation.replace(" ", "")
        lhs, arrow, out = eq.partition("->")
        ins = lhs.split(",")
        if "." in eq or len(ins) != 2 or not all(t.isalpha() for t in ins + ([out] if out else [])):
            raise GraphError(n, f"einsum '{equation}': tilefuse implements two operands with letter labels, no "
                                f"ellipsis")
        la, lb = ins
        if not arrow:           # the implicit output: the labels that appear once, sorted
            out = "".join(sorted(c for c in set(la + lb) if (la + lb).count(c) == 1))
        for t, d in ((la, a), (lb, b)):
            if len(set(t)) != len(t) or len(t) != len(d.shape):
                raise GraphError(n, f"einsum '{equation}': operand '{d.name}' {d.shape} against labels '{t}' (one "
                                    f"label per axis, none repeated)")
        size = {}
        for t, d in ((la, a), (lb, b)):
            for c, k in zip(t, d.shape):
                if size.setdefault(c, k) != k:
                    raise GraphError(n, f"einsum '{equation}': label '{c}' is {size[c]} and {k} long")
        if set(out) - set(la + lb) or len(set(out)) != len(out):
            raise GraphError(n, f"einsum '{equation}': output labels '{out}' must each come from an operand once")

        if not out:
            raise GraphError(n, f"einsum '{equation}' gives a scalar; tilefuse has no 0-d tensors")

        def drop(x, t, other):          # labels of this operand only, not in the output: summed out
            gone = [i for i, c in enumerate(t) if c not in other and c not in out]
            if not gone:
                return x, t
            return (self.sum(x, tuple(gone), False, name=self._fresh(n + ".sum")),
                    "".join(c for i, c in enumerate(t) if i not in gone))
        a, la = drop(a, la, lb)
        b, lb = drop(b, lb, la)
        batch = [c for c in la if c in lb and c in out]
        contract = [c for c in la if c in lb and c not in out]
        left = [c for c in la if c not in lb]
        right = [c for c in lb if c not in la]

        def prod(cs):
            return int(np.prod([size[c] for c in cs], dtype=np.int64))

        def arrange(x, t, order, shape):
            perm = tuple(t.index(c) for c in order)
            if perm != tuple(range(len(perm))):
                x = self.permute(x, perm, name=self._fresh(n + ".permute"))
            return self.reshape(x, shape, name=self._fresh(n + ".reshape")) if tuple(x.shape) != shape else x
        nb = (prod(batch),)
        a3 = arrange(a, la, batch + left + contract, nb + (prod(left), prod(contract)))
        b3 = arrange(b, lb, batch + contract + right, nb + (prod(contract), prod(right)))
        y = self.matmul(a3, b3, name=self._fresh(n + ".matmul"))                 # (B, L, R)
        got = batch + left + right
        full = tuple(size[c] for c in got)
        y = self.reshape(y, full, name=self._fresh(n + ".unflat")) if tuple(y.shape) != full else y
        perm = tuple(got.index(c) for c in out)
        return self.permute(y, perm, name=n) if perm != tuple(range(len(perm))) else y

    def where(self, l, cmp: str, r, a, b, name: str | None = None) -> DataNode:
        """a where (l cmp r) else b, cmp one of gt, ge, lt, le, eq, ne; all four broadcast, any of them may be a
        number or a constant array (the first DataNode gives the dtype); a and b may be infinite or NaN (masked_fill
        with -inf)."""
        n = self._name("where", name)
        dt = next(v.dtype for v in (l, r, a, b) if isinstance(v, DataNode))
        ins = [v if isinstance(v, DataNode) else self.constant(
            self._fresh(f"{n}.{role}"), np.asarray(v, dtype=dt).reshape(np.shape(v) or (1,)), dt, role in "ab")
            for v, role in ((l, "l"), (r, "r"), (a, "a"), (b, "b"))]
        return self.add_op("where", ins, {"cmp": cmp}, n)

    def sorted_slices(self, x: DataNode, axis: int, nan_last: bool = True, name: str | None = None) -> list:
        """x's slices along axis (each of size 1 there) in ascending order, by Batcher's sorting network
        (`batcher_pairs`). nan_last: NaN sorts above every number (torch.sort / topk, ONNX TopK: a comparator is
        where(a != a, b, where(a > b, b, a)) and its mirror); else a comparator is minimum / maximum, whose NaN
        reaches every output (torch.median's NaN). Up to MAX_SORTED values; the slices no output reads are left
        to dead-code elimination."""
        axis = int(axis) % max(len(x.shape), 1)
        n = x.shape[axis]
        base = self._name("sort", name)
        if n > MAX_SORTED:
            raise GraphError(base, f"sorting an axis of {n} values; tilefuse orders up to {MAX_SORTED} values (a "
                                   f"sorting network of where / minimum / maximum ops)")
        v = [self.slice(x, axis, i, i + 1, name=self._fresh(f"{base}.in{i}")) for i in range(n)]
        for c, (i, j) in enumerate(batcher_pairs(n)):
            a, b = v[i], v[j]
            if nan_last:
                lo = self.where(a, "gt", b, b, a, name=self._fresh(f"{base}.lo{c}.num"))
                hi = self.where(a, "gt", b, a, b, name=self._fresh(f"{base}.hi{c}.num"))
                v[i] = self.where(a, "ne", a, b, lo, name=self._fresh(f"{base}.lo{c}"))
                v[j] = self.where(a, "ne", a, a, hi, name=self._fresh(f"{base}.hi{c}"))
            else:
                v[i] = self.minimum(a, b, name=self._fresh(f"{base}.lo{c}"))
                v[j] = self.maximum(a, b, name=self._fresh(f"{base}.hi{c}"))
        return v

    def maximum(self, a, b, name: str | None = None) -> DataNode:
        """The element-wise maximum with broadcasting (torch.maximum: NaN if either is NaN)."""
        return self._binary("maximum", a, b, name)

    def atan2(self, a, b, name: str | None = None) -> DataNode:
        """The angle of the point (b, a) in (-pi, pi] (torch.atan2(a, b), np.arctan2)."""
        return self._binary("atan2", a, b, name)

    def minimum(self, a, b, name: str | None = None) -> DataNode:
        return self._binary("minimum", a, b, name)

    def _reduce(self, kind: str, x: DataNode, axes, keepdim: bool, name: str | None) -> DataNode:
        """A reduce op; over every axis without keepdim (x.mean(), ONNX ReduceMean with keepdims=0) the reduce
        with keepdim, then a reshape to the 0-d () (the op itself keeps a dim)."""
        r = len(x.shape)
        whole = r > 0 and {int(a) % r for a in (axes if isinstance(axes, (tuple, list)) else (axes,))
                           if -r <= int(a) < r} == set(range(r))
        if keepdim or not whole:
            return self.add_op(kind, [x], {"axes": axes, "keepdim": keepdim}, name)
        n = self._name(kind, name)
        y = self.add_op(kind, [x], {"axes": axes, "keepdim": True}, self._fresh(n + ".keepdim"))
        return self.reshape(y, (), name=n)

    def mean(self, x: DataNode, axes, keepdim: bool = False, name: str | None = None) -> DataNode:
        return self._reduce("mean", x, axes, keepdim, name)

    def sum(self, x: DataNode, axes, keepdim: bool = False, name: str | None = None) -> DataNode:
        return self._reduce("sum", x, axes, keepdim, name)

    def max(self, x: DataNode, axes, keepdim: bool = False, name: str | None = None) -> DataNode:
        """The maximum over `axes` (torch.amax, x.max(dim)[0], ONNX ReduceMax)."""
        return self._reduce("max", x, axes, keepdim, name)

    def min(self, x: DataNode, axes, keepdim: bool = False, name: str | None = None) -> DataNode:
        """The minimum over `axes` (torch.amin, ONNX ReduceMin) as -max(-x): negation is exact."""
        n = self._name("min", name)
        neg = self.mul(x, -1.0, name=self._fresh(n + ".neg"))
        return self.mul(self.max(neg, axes, keepdim, name=self._fresh(n + ".max")), -1.0, name=n)

    def batch_stats_normalize(self, x: DataNode, eps: float, name: str | None = None) -> DataNode:
        """(x - mean) / sqrt(var + eps) with the batch's statistics over every axis but 1 (var biased), no affine:
        batch norm without running buffers (from_torch's `F.batch_norm(w, None, None, training=True)`, ONNX
        BatchNormalization training_mode=1) as mean, sub, mul, mean, add, rsqrt, mul."""
        r = len(x.shape)
        if r < 2:
            raise GraphError(name or "batch_stats_normalize", f"input {x.shape}; expected (N, C, ...)")
        n = name or self._fresh("batch_stats")
        dims = tuple(i for i in range(r) if i != 1)
        m = self.mean(x, dims, keepdim=True, name=self._fresh(n + ".mean"))              # (1, C, 1, ...)
        d = self.sub(x, m, name=self._fresh(n + ".centered"))
        v = self.mean(self.mul(d, d, name=self._fresh(n + ".square")), dims, keepdim=True,
                      name=self._fresh(n + ".var"))
        e = self.constant(self._fresh(n + ".eps"), np.full((1,), eps, x.dtype), dtype=x.dtype)
        v = self.add(v, e, name=self._fresh(n + ".var_eps"))
        return self.mul(d, self.activation(v, "rsqrt", name=self._fresh(n + ".rstd")), name=n)

    def vector_norm(self, x: DataNode, ord, axes, keepdim: bool = False, name: str | None = None) -> DataNode:
        """The vector norm over `axes` (torch.linalg.vector_norm, F.normalize's, ONNX ReduceL1 / ReduceL2):
        ord 2: sqrt(sum(x * x)); 1: sum(|x|); inf: max(|x|)."""
        n = self._name("vector_norm", name)
        ord = float(ord)
        if ord == 2:
            s = self.sum(self.mul(x, x, name=self._fresh(n + ".square")), axes, keepdim, name=self._fresh(n + ".sum"))
            return self.activation(s, "sqrt", name=n)
        if ord in (1, math.inf):
            a = self.activation(x, "abs", name=self._fresh(n + ".abs"))
            return (self.sum if ord == 1 else self.max)(a, axes, keepdim, name=n)
        raise GraphError(n, f"vector norm of order {ord}; expected 1, 2 or inf")

    def log_softmax(self, x: DataNode, axis: int = 1, name: str | None = None) -> DataNode:
        """ln softmax(x) along `axis`, as x - m - ln sum e^(x - m), m the maximum (no overflow, as PyTorch's)."""
        n = self._name("log_softmax", name)
        c = self.sub(x, self.max(x, (axis,), True, name=self._fresh(n + ".max")), name=self._fresh(n + ".shifted"))
        s = self.sum(self.activation(c, "exp", name=self._fresh(n + ".exp")), (axis,), True,
                     name=self._fresh(n + ".sum"))
        return self.sub(c, self.activation(s, "log", name=self._fresh(n + ".log")), name=n)

    def reshape(self, x: DataNode, shape, name: str | None = None) -> DataNode:
        return self.add_op("reshape", [x], {"shape": tuple(shape)}, name)

    def permute(self, x: DataNode, perm, name: str | None = None) -> DataNode:
        return self.add_op("permute", [x], {"perm": tuple(perm)}, name)

    def channel_shuffle(self, x, groups: int, start: int = 0, stop: int | None = None,
                        name: str | None = None) -> DataNode:
        """x: a tensor, or a list of them (concatenated along channels first)."""
        xs = list(x) if isinstance(x, (list, tuple)) else [x]
        return self.add_op("channel_shuffle", xs, {"groups": groups, "start": start, "stop": stop}, name)

    def pixel_shuffle(self, x: DataNode, factor: int, mode: str = "crd", inverse: bool = False,
                      name: str | None = None) -> DataNode:
        """nn.PixelShuffle(factor) / ONNX DepthToSpace (mode "dcr" or "crd"); inverse=True:
        nn.PixelUnshuffle / SpaceToDepth ("dcr")."""
        return self.add_op("pixel_shuffle", [x], {"factor": factor, "mode": mode, "inverse": inverse}, name)

    def take(self, x, indices: DataNode, axis: int = 0, negative: bool = True, name: str | None = None,
             padding_idx: int | None = None, scale_grad_by_freq: bool = False) -> DataNode:
        """x's slices along `axis` at run-time indices (a tensor of integer values: an integer input's, see
        `input(..., integer=)`), as np.take: nn.Embedding, `table[t]`, ONNX Gather at computed indices; x may be a
        constant array. A run with an index that is not an integer in [-N, N) ([0, N) without `negative`) fails
        naming it. padding_idx, scale_grad_by_freq: nn.Embedding's (training: no gradient for that row; a row's
        gradient divided by how often the batch reads it)."""
        n = self._name("take", name)
        x = self._const(n, "table", x, indices.dtype)
        return self.add_op("take", [x, indices], {"axis": axis, "negative": negative, "padding_idx": padding_idx,
                                                  "scale_grad_by_freq": scale_grad_by_freq}, n)

    def grid_sample(self, x: DataNode, grid: DataNode, mode: str = "bilinear", padding_mode: str = "zeros",
                    align_corners: bool = False, name: str | None = None) -> DataNode:
        """F.grid_sample / ONNX GridSample: x (N, C, H, W) sampled at grid (N, Ho, Wo, 2) of (x, y) in [-1, 1];
        mode bilinear or nearest, padding_mode zeros, border or reflection."""
        return self.add_op("grid_sample", [x, grid], {"mode": mode, "padding_mode": padding_mode,
                                                      "align_corners": align_corners}, name)

    def unfold(self, x: DataNode, kernel_size, dilation=1, padding=0, stride=1, name: str | None = None) -> DataNode:
        """F.unfold (im2col) of x (N, C, H, W): (N, C kh kw, L), column l the (kh, kw) window at output position l
        (row-major over (Ho, Wo)), channel c kh kw + i kw + j its element (i, j) of channel c. Exact: a zero pad
        ('<name>.pad'), per window element (i, j) a strided slice of rows and one of columns ('<name>.i_j.h',
        '.w') reshaped to (N, C, 1, L), concatenated along axis 2 ('<name>.cat') and reshaped."""
        base = self._name("unfold", name)
        if len(x.shape) != 4:
            raise GraphError(base, f"unfold of {x.shape}; expected (N, C, H, W)")
        pair = [tuple(int(v) for v in (p if isinstance(p, (tuple, list)) else (p, p))) for p in
                (kernel_size, dilation, padding, stride)]
        (kh, kw), (dh, dw), (ph, pw), (sh, sw) = pair
        if min(kh, kw, dh, dw, sh, sw) < 1 or min(ph, pw) < 0:
            raise GraphError(base, f"unfold with kernel {(kh, kw)}, dilation {(dh, dw)}, padding {(ph, pw)}, stride "
                                   f"{(sh, sw)}; expected positive kernel, dilation and stride, padding >= 0")
        n, c, h, w = x.shape
        ho, wo = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        if ho < 1 or wo < 1:
            raise GraphError(base, f"unfold of {x.shape} with kernel {(kh, kw)}, dilation {(dh, dw)}, padding "
                                   f"{(ph, pw)}: no window fits; expected H + 2 ph >= dh (kh - 1) + 1 (and W)")
        xp = self.pad(x, (0, 0, 0, 0, ph, ph, pw, pw), name=f"{base}.pad") if ph or pw else x
        cols = []
        for i in range(kh):
            for j in range(kw):
                r = self.slice(xp, 2, i * dh, i * dh + sh * (ho - 1) + 1, sh, name=f"{base}.{i}_{j}.h")
                r = self.slice(r, 3, j * dw, j * dw + sw * (wo - 1) + 1, sw, name=f"{base}.{i}_{j}.w")  # (N, C, Ho, Wo)
                cols.append(self.reshape(r, (n, c, 1, ho * wo), name=f"{base}.{i}_{j}"))
        y = self.concat(cols, axis=2, name=f"{base}.cat") if len(cols) > 1 else cols[0]     # (N, C, kh kw, L)
        return self.reshape(y, (n, c * kh * kw, ho * wo), name=base)

    def fold(self, cols: DataNode, output_size, kernel_size, dilation=1, padding=0, stride=1,
             name: str | None = None) -> DataNode:
        """F.fold (col2im), unfold's adjoint: cols (N, C kh kw, L) summed into (N, C, H, W), column l's element
        (c, i, j) added at row i dh + sh oh - top, column j dw + sw ow - left of output position l = (oh, ow).
        padding: p, (ph, pw), or (top, left, bottom, right) (ONNX Col2Im's pads). Per (i, j) the (N, C, Ho, Wo)
        block ('<name>.i_j') spread by the stride (zeros between: pads of (N, C, Ho, 1, Wo, 1)), padded onto the
        padded canvas, the canvases added in (i, j) order (PyTorch's: the same sums, bitwise), the padding
        cropped."""
        base = self._name("fold", name)
        pair = [tuple(int(v) for v in (p if isinstance(p, (tuple, list)) else (p, p))) for p in
                (output_size, kernel_size, dilation, stride)]
        (h, w), (kh, kw), (dh, dw), (sh, sw) = pair
        pads = tuple(int(v) for v in (padding if isinstance(padding, (tuple, list)) else (padding, padding)))
        top, left, bottom, right = pads * 2 if len(pads) == 2 else pads
        if len(cols.shape) != 3 or min(kh, kw, dh, dw, sh, sw, h, w) < 1 or min(top, left, bottom, right) < 0:
            raise GraphError(base, f"fold of {cols.shape} to {(h, w)}, kernel {(kh, kw)}, dilation {(dh, dw)}, "
                                   f"padding {pads}, stride {(sh, sw)}; expected (N, C kh kw, L), positive sizes")
        n, ckk, length = cols.shape
        hp, wp = h + top + bottom, w + left + right                                      # the padded canvas
        ho, wo = (hp - dh * (kh - 1) - 1) // sh + 1, (wp - dw * (kw - 1) - 1) // sw + 1
        if ckk % (kh * kw) or ho < 1 or wo < 1 or ho * wo != length:
            raise GraphError(base, f"fold of {cols.shape} to {(h, w)} with kernel {(kh, kw)}: expected (N, C {kh * kw}, "
                                   f"{max(ho, 0) * max(wo, 0)}) (C {kh * kw} channels, {max(ho, 0)} x {max(wo, 0)} "
                                   f"windows)")
        c = ckk // (kh * kw)
        blocks = self.reshape(cols, (n, c, kh * kw, ho, wo), name=f"{base}.blocks")       # (N, C, kh kw, Ho, Wo)
        acc = None
        for i in range(kh):
            for j in range(kw):
                k = f"{base}.{i}_{j}"
                b = self.slice(blocks, 2, i * kw + j, i * kw + j + 1, name=f"{k}.take")       # (N, C, 1, Ho, Wo)
                if sh > 1 or sw > 1:                  # zeros between the rows / columns: (N, C, Ho sh, Wo sw)
                    b = self.reshape(b, (n, c, ho, 1, wo, 1), name=f"{k}.split")
                    b = self.pad(b, (0, 0, 0, 0, 0, 0, 0, sh - 1, 0, 0, 0, sw - 1), name=f"{k}.spread")
                b = self.reshape(b, (n, c, ho * sh, wo * sw), name=f"{k}.rows")
                # onto the canvas: rows i dh .. i dh + sh (ho - 1) (the spread's trailing zeros cropped or padded)
                b = self.pad(b, (0, 0, 0, 0, i * dh, hp - i * dh - ho * sh, j * dw, wp - j * dw - wo * sw), name=k)
                acc = b if acc is None else self.add(acc, b, name=f"{k}.sum")
        if top or left or bottom or right:
            acc = self.pad(acc, (0, 0, 0, 0, -top, -bottom, -left, -right), name=f"{base}.crop")
        return self.reshape(acc, (n, c, h, w), name=base)

    def argmax(self, x: DataNode, axis: int, keepdim: bool = False, largest: bool = True, select_last: bool = False,
               name: str | None = None) -> DataNode:
        """The index along `axis` of the largest value (largest=False: the smallest) as a float of x's dtype;
        ties: the first (select_last: the last). Mark an output of it with `output(..., integer=np.int64)`. Of a
        1-D x without keepdim: the 0-d index (the op with keepdim, then a reshape to ())."""
        if len(x.shape) == 1 and not keepdim:
            n = self._name("argmax", name)
            y = self.add_op("argmax", [x], dict(axis=axis, keepdim=True, largest=largest, select_last=select_last),
                            self._fresh(n + ".keepdim"))
            return self.reshape(y, (), name=n)
        return self.add_op("argmax", [x], dict(axis=axis, keepdim=keepdim, largest=largest,
                                               select_last=select_last), name)

    def cumsum(self, x: DataNode, axis: int, exclusive: bool = False, reverse: bool = False,
               name: str | None = None) -> DataNode:
        """The running sum along `axis` (exclusive: before each position; reverse: from the end), accumulated in
        float64 (torch.cumsum, ONNX CumSum; an integral image: two of them)."""
        return self.add_op("cumsum", [x], dict(axis=axis, exclusive=exclusive, reverse=reverse), name)

    def affine_grid(self, theta: DataNode, size, align_corners: bool = False, name: str | None = None) -> DataNode:
        """F.affine_grid / ONNX AffineGrid of a computed theta (N, 2, 3) for size (N, C, H, W): the (N, H, W, 2)
        grid, ATen's base grid (x, y, 1) per position (a fixed constant '<name>.base') times theta transposed."""
        base = self._name("affine_grid", name)
        n, _, h, w = (int(v) for v in size)
        if tuple(theta.shape) != (n, 2, 3) or min(h, w) < 1:
            raise GraphError(base, f"theta '{theta.name}' has shape {theta.shape} for size {[int(v) for v in size]}; "
                                   f"expected ({n}, 2, 3) and positive H, W")
        grid0 = self.constant(f"{base}.base", ref.affine_grid_base(h, w, bool(align_corners), theta.dtype),
                              dtype=theta.dtype)                                    # (1, H W, 3)
        self.constant_origin[grid0.name] = "buffer"
        tt = self.permute(theta, (0, 2, 1), name=f"{base}.theta_t")                 # (N, 3, 2)
        g = self.matmul(grid0, tt, name=f"{base}.matmul")                           # (N, H W, 2)
        return self.reshape(g, (n, h, w, 2), name=base)

    def slice(self, x: DataNode, axis: int, start: int = 0, stop: int | None = None, step: int = 1,
              name: str | None = None) -> DataNode:
        return self.add_op("slice", [x], dict(axis=axis, start=start, stop=stop, step=step), name)

    def max_unpool(self, y: DataNode, x: DataNode, pooled: DataNode, kernel, output_hw=None,
                   name: str | None = None) -> DataNode:
        """nn.MaxUnpool2d(y, indices) where the indices are those of `pooled` = max_pool(x, kernel, stride =
        kernel, no padding, no dilation, no partial window): y's values written where each window of x held its
        maximum, zeros elsewhere, without an index tensor. The position is PyTorch's: the first maximum in the
        window's row-major order, or the last NaN in a window holding one. Per window position p = (i, j), x_p =
        x[:, :, i::kh, j::kw] (N, C, Ho, Wo); a reverse chain places y at the last NaN (x_p != x_p), a forward
        chain at the first x_p == pooled among the rest; the kh * kw pieces (N, C, Ho, Wo) interleave back to
        (N, C, Ho * kh, Wo * kw) (pixel_shuffle "dcr" for square windows, else reshape / permute), and zero rows /
        columns pad that to output_hw. The placement is at x's (h, w): PyTorch's and ONNX's where the output is as
        wide as x (they read an index as h * W + w in a row of the output's width; the importers check it)."""
        n = self._name("max_unpool", name)
        kh, kw = (int(v) for v in kernel)
        nb, c, ho, wo = y.shape
        if tuple(pooled.shape) != tuple(y.shape) or len(x.shape) != 4 or x.shape[:2] != y.shape[:2]:
            raise GraphError(n, f"max_unpool of {tuple(y.shape)} by the indices of a {tuple(x.shape)} -> "
                                f"{tuple(pooled.shape)} pool; expected the pooled shape")
        oh, ow = output_hw if output_hw is not None else (ho * kh, wo * kw)
        if oh < ho * kh or ow < wo * kw or x.shape[2] < ho * kh or x.shape[3] < wo * kw:
            raise GraphError(n, f"max_unpool output {oh}x{ow} from {ho}x{wo} windows of {kh}x{kw}; expected at "
                                f"least {ho * kh}x{wo * kw}")
        phases = [(i, j) for i in range(kh) for j in range(kw)]
        xp = []
        for i, j in phases:                                               # (N, C, Ho, Wo) each
            rows = self.slice(x, 2, i, i + ho * kh, kh, name=self._fresh(f"{n}.rows{i}{j}"))
            xp.append(self.slice(rows, 3, j, j + wo * kw, kw, name=self._fresh(f"{n}.x{i}{j}")))
        rest, nan_place = y, [None] * len(phases)
        for p in reversed(range(len(phases))):                            # the last NaN of a window
            nan_place[p] = self.where(xp[p], "ne", xp[p], rest, 0.0, name=self._fresh(f"{n}.nan{p}"))
            rest = self.where(xp[p], "ne", xp[p], 0.0, rest, name=self._fresh(f"{n}.nanrest{p}"))
        out = []
        for p in range(len(phases)):                                      # else the first maximum
            out.append(self.where(xp[p], "eq", pooled, rest, nan_place[p], name=self._fresh(f"{n}.at{p}")))
            if p + 1 < len(phases):
                rest = self.where(xp[p], "eq", pooled, 0.0, rest, name=self._fresh(f"{n}.rest{p}"))
        cat = self.concat(out, 1, name=self._fresh(f"{n}.phases"))       # (N, kh * kw * C, Ho, Wo)
        tail = (oh, ow) != (ho * kh, wo * kw)
        if kh == kw:
            z = self.pixel_shuffle(cat, kh, "dcr", name=self._fresh(n + ".interleave") if tail else n)
        else:
            z = self.reshape(cat, (nb, kh, kw, c, ho, wo), name=self._fresh(n + ".split"))
            z = self.permute(z, (0, 3, 4, 1, 5, 2), name=self._fresh(n + ".order"))     # (N, C, Ho, kh, Wo, kw)
            z = self.reshape(z, (nb, c, ho * kh, wo * kw), name=self._fresh(n + ".interleave") if tail else n)
        if tail:
            z = self.pad(z, (0, 0, 0, 0, 0, oh - ho * kh, 0, ow - wo * kw), name=n)
        return z

    def slice_scatter(self, x: DataNode, src: DataNode, axis: int, start: int, stop: int, step: int = 1,
                      name: str | None = None) -> DataNode:
        """x with src in place of x[start:stop:step] along axis (a slice assignment; start, stop as Python's
        slice(...).indices gives them). Step 1: a concat of x's slices around src; a larger step: the region
        x[start : start + L step] (zero-padded past the end) viewed as (.., L, step, ..), its column 0 replaced by
        src, viewed back. Values move, no arithmetic."""
        n = self._name("slice_scatter", name)
        r = len(x.shape)
        axis %= r
        size = x.shape[axis]
        count = len(range(start, stop, step))
        if step < 1 or tuple(src.shape) != x.shape[:axis] + (count,) + x.shape[axis + 1:]:
            raise GraphError(n, f"slice_scatter of {tuple(src.shape)} into {start}:{stop}:{step} of axis {axis} of "
                                f"{tuple(x.shape)}; expected a positive step and the slice's shape")
        if count == 0:
            return x
        if step == 1:
            mid, stop = src, start + count
        else:
            span = count * step
            stop = min(start + span, size)
            region = self.slice(x, axis, start, stop, name=self._fresh(n + ".region"))
            if start + span > size:                               # zeros past the end, in the kept columns only
                pads = [0] * (2 * r)
                pads[2 * axis + 1] = start + span - size
                region = self.pad(region, pads, name=self._fresh(n + ".region_pad"))
            split = x.shape[:axis] + (count, step) + x.shape[axis + 1:]
            cols = self.reshape(region, split, name=self._fresh(n + ".columns"))              # (.., L, step, ..)
            kept = self.slice(cols, axis + 1, 1, step, name=self._fresh(n + ".kept"))         # (.., L, step-1, ..)
            new = self.reshape(src, split[:axis + 1] + (1,) + split[axis + 2:], name=self._fresh(n + ".src"))
            mid = self.concat([new, kept], axis + 1, name=self._fresh(n + ".placed"))        # (.., L, step, ..)
            mid = self.reshape(mid, x.shape[:axis] + (span,) + x.shape[axis + 1:], name=self._fresh(n + ".merged"))
            if start + span > size:
                mid = self.slice(mid, axis, 0, stop - start, name=self._fresh(n + ".crop"))
        parts = ([self.slice(x, axis, 0, start, name=self._fresh(n + ".head"))] if start > 0 else []) + [mid] + \
            ([self.slice(x, axis, stop, size, name=self._fresh(n + ".tail"))] if stop < size else [])
        return mid if len(parts) == 1 else self.concat(parts, axis, name=n)

    def split(self, x: DataNode, sizes, axis: int = 1, name: str | None = None) -> list[DataNode]:
        """Consecutive pieces of `sizes` along `axis` (one slice op each: '<name>.0', '<name>.1', ...)."""
        base = self._name("split", name)
        if sum(sizes) != x.shape[axis]:
            raise GraphError(base, f"split sizes {tuple(sizes)} sum to {sum(sizes)}; expected {x.shape[axis]} "
                                   f"(axis {axis} of {x.shape})")
        out, start = [], 0
        for i, s in enumerate(sizes):
            out.append(self.slice(x, axis, start, start + s, 1, name=f"{base}.{i}"))
            start += s
        return out

    def pad(self, x: DataNode, pads, mode: str = "constant", value: float = 0.0,
            name: str | None = None) -> DataNode:
        """pads = (before_0, after_0, before_1, after_1, ...) over every axis. A negative pad crops, as in
        PyTorch's F.pad and ONNX's Pad: the pad op takes the positive pads, then a slice per cropped axis
        ('<name>.crop<axis>') removes the rest (padding first, as PyTorch does: a reflection may use the values
        the crop then removes)."""
        pads = tuple(int(v) for v in pads)
        if mode in ("circular", "wrap"):
            return self._pad_circular(x, pads, name)
        if min(pads, default=0) >= 0:
            return self.add_op("pad", [x], dict(pads=pads, mode=mode, value=value), name)
        n = self._name("pad", name)
        if len(pads) != 2 * len(x.shape):
            raise GraphError(n, f"pads={pads} has {len(pads)} values for input shape {x.shape}; expected "
                                f"{2 * len(x.shape)} (before, after per axis)")
        for i, d in enumerate(x.shape):
            if d + pads[2 * i] + pads[2 * i + 1] < 1:
                raise GraphError(n, f"pads ({pads[2 * i]}, {pads[2 * i + 1]}) crop all of axis {i} (size {d}) of "
                                    f"{x.shape}; expected an output size >= 1")
        y = x
        if max(pads) > 0:
            y = self.add_op("pad", [x], dict(pads=tuple(max(v, 0) for v in pads), mode=mode, value=value), n)
        for i in range(len(x.shape)):
            lo, hi = pads[2 * i], pads[2 * i + 1]
            if lo < 0 or hi < 0:
                size = y.shape[i]
                y = self.slice(y, i, max(-lo, 0), size - max(-hi, 0), 1, name=f"{n}.crop{i}")
        return y

    def _pad_circular(self, x: DataNode, pads, name: str | None) -> DataNode:
        """Circular padding (PyTorch's mode='circular', Conv2d(padding_mode='circular'); ONNX Pad mode 'wrap',
        NumPy's 'wrap'): per padded axis the concat of the wrapped-around slices and x, exact; a pad longer than
        the axis wraps again (whole copies). Negative pads crop first, and the padding wraps the cropped axis (as
        PyTorch's circular padding does: F.pad(arange(6), (-1, 3)) = [1 2 3 4 5 1 2 3]).

            axis of size d, pads (lo, hi) = (q * d + r, q2 * d + r2):
            [x[d - r:d], x * q, x, x * q2, x[0:r2]]  (concat along the axis)"""
        n = self._name("pad", name)
        if len(pads) != 2 * len(x.shape):
            raise GraphError(n, f"pads={pads} has {len(pads)} values for input shape {x.shape}; expected "
                                f"{2 * len(x.shape)} (before, after per axis)")
        axes = [i for i in range(len(x.shape)) if pads[2 * i] > 0 or pads[2 * i + 1] > 0]
        crop = tuple(min(v, 0) for v in pads)
        y = x if min(pads) >= 0 else self.pad(x, crop, name=n if not axes else self._fresh(n + ".crop"))
        for j, i in enumerate(axes):
            d = y.shape[i]
            (q, r), (q2, r2) = divmod(max(pads[2 * i], 0), d), divmod(max(pads[2 * i + 1], 0), d)
            parts = ([self.slice(y, i, d - r, d, name=self._fresh(f"{n}.wrap{i}lo"))] if r else []) + [y] * q + \
                [y] + [y] * q2 + ([self.slice(y, i, 0, r2, name=self._fresh(f"{n}.wrap{i}hi"))] if r2 else [])
            y = self.concat(parts, axis=i, name=n if j == len(axes) - 1 else self._fresh(f"{n}.axis{i}"))
        if y is x:
            y = self.dropout(x, 0.0, name=n)        # no padding: a copy, so the op keeps its name
        return y

    def resize(self, x: DataNode, size=None, scale_factor=None, mode: str = "nearest",
               align_corners: bool = False, name: str | None = None) -> DataNode:
        """F.interpolate on (N, C, H, W): mode "nearest", "nearest-exact", "bilinear" or "bicubic"; by size or
        scale_factor (output size floor(H * scale), the scale enters the coordinate map as in torch)."""
        h, w = x.shape[2], x.shape[3]
        if (size is None) == (scale_factor is None):
            raise GraphError(self._name("resize", name), "resize needs exactly one of size and scale_factor")
        scales = None
        if size is None:
            sh, sw = (scale_factor, scale_factor) if np.isscalar(scale_factor) else scale_factor
            scales = (float(sh), float(sw))
            size = (int(np.floor(h * scales[0])), int(np.floor(w * scales[1])))
        elif np.isscalar(size):
            size = (int(size), int(size))
        if mode in ("bilinear", "bicubic"):
            p = dict(mode="linear" if mode == "bilinear" else "cubic",
                     coord="align_corners" if align_corners else "half_pixel")
        elif mode == "nearest-exact":
            p = dict(mode="nearest", coord="half_pixel", nearest_mode="round_prefer_ceil")
        elif mode == "nearest":
            p = dict(mode="nearest", coord="asymmetric", nearest_mode="floor")
        else:
            raise GraphError(self._name("resize", name), f"interpolation mode {mode!r} is not supported; "
                                                        f"expected nearest, nearest-exact, bilinear or bicubic")
        return self.add_op("resize", [x], dict(p, size=tuple(size), scales=scales), name)

    def layer_norm(self, x: DataNode, gamma, beta, axis: int = -1, eps: float = 1e-5,
                   name: str | None = None) -> DataNode:
        """Normalize over the axes from `axis` to the last (torch LayerNorm(x.shape[axis:]))."""
        n = self._name("layer_norm", name)
        return self.add_op("layer_norm", [x, self._const(n, "weight", gamma, x.dtype),
                                          self._const(n, "bias", beta, x.dtype)], {"axis": axis, "eps": eps}, n)

    def channel_norm(self, x: DataNode, gamma, beta, eps: float = 1e-6, mode: str = "layer",
                     name: str | None = None) -> DataNode:
        """A norm over the channels of (N, C, H, W) at each position, then gamma[c] * . + beta[c]: mode "layer" is
        LayerNorm2d, "l2" x / (||x||_2 + eps) (SSD's L2Norm), "l2_clamp" x / max(||x||_2, eps) (F.normalize)."""
        n = self._name("channel_norm", name)
        return self.add_op("channel_norm", [x, self._const(n, "weight", gamma, x.dtype),
                                            self._const(n, "bias", beta, x.dtype)], {"eps": eps, "mode": mode}, n)

    def group_norm(self, x: DataNode, groups: int, gamma=None, beta=None, eps: float = 1e-5,
                   name: str | None = None) -> DataNode:
        """torch GroupNorm(groups, C): each of `groups` consecutive channel groups normalized over its channels
        and positions, then gamma[c] * . + beta[c] (default 1 and 0). groups = C is InstanceNorm."""
        n = self._name("group_norm", name)
        c = x.shape[1] if len(x.shape) >= 2 else 0
        gamma = np.ones(c, x.dtype) if gamma is None else gamma
        beta = np.zeros(c, x.dtype) if beta is None else beta
        return self.add_op("group_norm", [x, self._const(n, "weight", gamma, x.dtype),
                                          self._const(n, "bias", beta, x.dtype)], {"groups": groups, "eps": eps}, n)

    def adaptive_avg_pool(self, x: DataNode, output_size, name: str | None = None) -> DataNode:
        return self.add_op("adaptive_avg_pool", [x], {"output_size": output_size}, name)

    def adaptive_max_pool(self, x: DataNode, output_size, name: str | None = None) -> DataNode:
        return self.add_op("adaptive_max_pool", [x], {"output_size": output_size}, name)

    # ---------------------------------------------------------------- checks and copies

    def lint(self) -> None:
        """Cheap structural check run between compiler passes; raises GraphError."""
        seen: set[int] = {id(d) for d in self.inputs}
        names: set[str] = set()
        for op in self.ops:
            if op.name in names:
                raise GraphError(op.name, "duplicate op name")
            names.add(op.name)
            for d in op.inputs:
                if not d.is_constant and id(d) not in seen:
                    raise GraphError(op.name, f"input '{d.name}' is used before it is produced "
                                              f"(not a network input, constant or earlier op output)")
                if op not in d.consumers:
                    raise GraphError(op.name, f"input '{d.name}' does not list this op as a consumer")
            for d in op.outputs:
                if d.producer is not op:
                    raise GraphError(op.name, f"output '{d.name}' has a different producer")
                seen.add(id(d))
            sch = opdefs.schema(op.op, op.name)
            shape = sch.infer(op.name, op.inputs, op.params)
            if tuple(shape) != op.outputs[0].shape:
                raise GraphError(op.name, f"output shape {op.outputs[0].shape} disagrees with inferred {shape}")
        for d in self.outputs:
            if id(d) not in seen:
                raise GraphError(d.name, "network output is not produced by any op")

    def clone(self, name: str | None = None) -> "Network":
        """A structural copy (new nodes; constant arrays shared, they are read-only)."""
        mapping: dict[int, DataNode] = {}

        def cp(d: DataNode) -> DataNode:
            if id(d) not in mapping:
                nd = DataNode(d.name, d.shape, d.dtype)
                nd.value = d.value
                mapping[id(d)] = nd
            return mapping[id(d)]

        new = Network(name or self.name)
        new.inputs = [cp(d) for d in self.inputs]
        for op in self.ops:
            nop = OpNode(op.name, op.op, [cp(d) for d in op.inputs], [cp(d) for d in op.outputs],
                         dict(op.params))
            for d in nop.inputs:
                d.consumers.append(nop)
            for d in nop.outputs:
                d.producer = nop
            new.ops.append(nop)
        new.outputs = [cp(d) for d in self.outputs]
        new._names = set(self._names)
        new.constant_origin = dict(self.constant_origin)
        new.constant_alias = dict(self.constant_alias)
        new.constant_gather = dict(self.constant_gather)
        new.integer_inputs = dict(self.integer_inputs)
        new.integer_outputs = dict(self.integer_outputs)
        new.module_buffers = dict(self.module_buffers)
        new.train_mode_updates = dict(self.train_mode_updates)
        new.bn_momentum = dict(self.bn_momentum)
        new._counter = itertools.count(next(self._counter))
        return new


def _toposort(ops: list[OpNode], inputs: list[DataNode]) -> list[OpNode]:
    """Order ops so each runs after the producers of its inputs (Kahn's algorithm)."""
    produced = {id(d) for d in inputs}
    pending = list(ops)
    order: list[OpNode] = []
    while pending:
        ready = [o for o in pending if all(d.is_constant or id(d) in produced for d in o.inputs)]
        if not ready:
            stuck = pending[0]
            missing = [d.name for d in stuck.inputs if not d.is_constant and id(d) not in produced]
            raise GraphError(stuck.name, f"inputs {missing} are neither network inputs, constants nor "
                                         f"produced by another op (or the graph has a cycle)")
        for o in ready:
            order.append(o)
            for d in o.outputs:
                produced.add(id(d))
        pending = [o for o in pending if o not in ready]
    return order
