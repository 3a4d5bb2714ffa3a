"""PyTorch import: `from_torch(module, example_input) -> Network` through torch.export.

The module is exported in eval mode (its mode is restored after) with the example inputs'
static shapes, so Python-level shape logic (`x.ndim`, `x.size(1) // g`, shape-dependent `if`s,
slicing, chunk / split, in-place ops, functional calls) is resolved by PyTorch itself. The
ExportedProgram is decomposed to core ATen ops except the few composite ops that are one IR op
(`_PRESERVED`: linear, layer_norm, silu, hardswish, pad, ...), and every graph node is mapped:

  placeholder  parameter / buffer / constant -> a constant named by its state_dict key
               ("layer1.0.conv1.weight"); user input -> net.input
  call_function an ATen op -> `_ATEN[name]` (conv, norms, activations, element-wise, movement,
               resize, pooling ...; docs/ops.md lists them); a node whose tensor operands are
               all constants is evaluated by torch at import time (constant folding)
  output       net.output (several tensors give several outputs)

Anything else raises UnsupportedOpError naming the ATen op, the node and the source line it
came from (`node.meta["stack_trace"]`): nothing is skipped silently. Op names follow the module
path ("layer1.0.conv1"; a module called again gets "_1", "_2"; a function called inside a
module gets "<module path>.<function>", e.g. "layer1.0.add"), so importing a torchvision-style
ResNet gives the names tilefuse.models uses.

torch is imported here only; the rest of tilefuse does not need it.
"""
from __future__ import annotations

import contextlib
import math
import operator
import re
from typing import Any

import numpy as np

from ..errors import GraphError, UnsupportedOpError
from ..ir import DataNode, Network
from ..ir.network import MAX_SORTED
from ..kernels import activations as _acts
from . import boolexpr, gather

try:  # torch is a test / import-time dependency, not a runtime one
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - exercised only without torch
    torch = None

_DTYPES = {}
if torch is not None:
    _DTYPES = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16}


# ----------------------------------------------------------------------------- entry point

def from_torch(module, example_input, name: str | None = None, fold_parameters: bool = True) -> Network:
    """Import a torch.nn.Module as a tilefuse Network (inference semantics).

    example_input: a tensor or a tuple/list of tensors, one per forward() argument; their shapes
    and dtypes fix the network's. Raises UnsupportedOpError for any op outside the vocabulary.
    """
    if torch is None:
        raise ImportError("tilefuse.from_torch needs torch (pip install torch)")
    if not isinstance(module, nn.Module):
        raise TypeError(f"from_torch expects a torch.nn.Module, got {type(module).__name__}")
    examples = (example_input,) if isinstance(example_input, torch.Tensor) else tuple(example_input)
    for i, t in enumerate(examples):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"example_input[{i}] is {type(t).__name__}; expected a torch.Tensor")
    n_args = _positional_arity(module)
    if n_args is not None and n_args != len(examples):
        raise GraphError(type(module).__name__, f"forward() takes {n_args} tensor inputs, expected one "
                                                f"example tensor each; got {len(examples)}")
    was_training = module.training
    attributes = _plain_attributes(module)
    module.eval()
    name = name or type(module).__name__
    try:
        with _leaf_ops(module), torch.no_grad():
            try:
                ep = torch.export.export(module, examples, strict=False)
            except Exception as e:
                raise UnsupportedOpError(
                    f"torch.export could not export {type(module).__name__}: {type(e).__name__}: "
                    f"{_first_lines(str(e), 6)}; expected a forward() whose control flow depends on "
                    f"shapes only, not on tensor values") from e
            # fast path: the exported graph as is, when every op maps and no mutation aliases a view;
            # else (the general path) functionalized and decomposed to core ATen, which takes seconds
            net = None
            if _mutations_are_local(ep):
                try:
                    net = _Importer(ep, name, direct=True, fold_parameters=fold_parameters,
                                    modules=dict(module.named_modules())).run(examples)
                except _NeedsDecomposition:
                    pass
            if net is None:
                ep = ep.run_decompositions(_decomposition_table())
        if net is None:
            net = _Importer(ep, name, fold_parameters=fold_parameters,
                            modules=dict(module.named_modules())).run(examples)
        net.module_buffers = _persistent_buffers(module)
        net.train_mode_updates.update(_train_mode_updates(module))
        return net
    finally:
        module.train(was_training)
        _restore_attributes(attributes)


def _plain_attributes(module) -> list:
    """(submodule, a copy of its plain attributes) for each submodule: a forward that stores a tensor on its module
    (FocalNet's `self.modulator = ...`, YOLO's anchor cache) leaves torch.export's fake tensors there, which a
    later deepcopy or eager run of the user's module fails on."""
    return [(m, {k: v for k, v in vars(m).items() if not k.startswith("_")}) for m in module.modules()]


def _restore_attributes(saved) -> None:
    """The plain attributes as they were before the export: those it added removed, a tensor it put in place of
    another value put back. (An attribute torch.export itself restored, to a copy of the value before it ran,
    stays: timm LeViT's attention-bias cache, a dict filled in place with a fake tensor during the export, comes
    back as the empty copy.)"""
    for m, before in saved:
        now = vars(m)
        for k in [k for k in now if not k.startswith("_") and k not in before]:
            del now[k]
        for k, v in before.items():
            if k not in now or (now[k] is not v and isinstance(now[k], torch.Tensor)):
                now[k] = v


def _train_mode_updates(module) -> dict:
    """Submodules whose training-mode forward computes with state the eval-mode export does not show: spectral
    norm (torch.nn.utils.parametrizations.spectral_norm, or the older hook torch.nn.utils.spectral_norm) runs a
    power iteration on its u / v buffers before every training forward, so its sigma differs from the eval graph's.
    (`Network.train_mode_updates`: the Trainer refuses the network naming them.)"""
    out = {}
    for path, m in module.named_modules():
        if _stochastic_depth(m) is not None and _stochastic_depth(m)[1] == "unscaled":
            out[path] = "DropPath(scale_by_keep=False): its training forward drops samples without the 1 / keep scale"
        if type(m).__name__ == "_SpectralNorm" and type(m).__module__.startswith("torch.nn.utils"):
            out[path] = "spectral norm: its training forward updates u / v by power iteration"
        for hook in getattr(m, "_forward_pre_hooks", {}).values():
            if type(hook).__name__ == "SpectralNorm" and type(hook).__module__.startswith("torch.nn.utils"):
                out[path or type(m).__name__] = (f"spectral norm of '{hook.name}': its training forward updates "
                                                 f"u / v by power iteration")
    return out


def _persistent_buffers(module) -> dict:
    """The module's persistent buffers by state-dict key, as numpy copies (`Network.module_buffers`)."""
    names = {k for k, _ in module.named_buffers()}
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items() if k in names}


class _NeedsDecomposition(Exception):
    """The exported (training IR) graph has an op that may decompose into supported ones."""


def _is_view(node) -> bool:
    """A node whose value aliases another tensor (a view op, or an element of a split's list)."""
    t = getattr(node, "target", None)
    if t is operator.getitem:
        return _is_view(node.args[0])
    schema = getattr(t, "_schema", None)
    if schema is None or schema.is_mutable:
        return False
    return any(r.alias_info is not None for r in schema.returns)


def _mutations_are_local(ep) -> bool:
    """Every in-place op mutates a tensor that is no view and has no views: importing the op as
    functional and rebinding the mutated tensor to its result is then exact."""
    for n in ep.graph.nodes:
        schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
        if schema is None or not schema.is_mutable:
            continue
        if n.target._opname.rstrip("_").endswith("dropout") and len(n.args) > 2 and not n.args[2]:
            continue   # in-place dropout at inference: the identity, nothing changes
        m = n.args[0]
        if not hasattr(m, "op") or m.op == "placeholder" or _is_view(m) or \
                any(_is_view(u) for u in m.users if u is not n):
            return False
    return True


def _positional_arity(module) -> int | None:
    import inspect
    try:
        sig = inspect.signature(module.forward)
    except (TypeError, ValueError):
        return None
    params = list(sig.parameters.values())
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return None
    return sum(p.default is p.empty for p in params)


def _gather_of_parameter(target, args, kwargs, c, shape):
    """(G, the parameter's value) for target's result when it only moves elements of c, a parameter or a gather
    of one: target applied to c's flat indices into the parameter (an int64 tensor in c's place; index tensors
    and the other arguments as they are) gives the result's. None where that does not give an int64 tensor of
    the result's shape."""
    if c.gather is not None:
        idx, value = torch.from_numpy(c.gather[0]).reshape(c.tensor.shape), c.gather[1]
    else:
        idx, value = torch.arange(c.tensor.numel(), dtype=torch.int64).reshape(c.tensor.shape), c.tensor.numpy()

    def swap(v):
        return idx if v is c else v.tensor if isinstance(v, Const) else v
    try:
        g = target(*torch.fx.node.map_aggregate(args, swap), **torch.fx.node.map_aggregate(kwargs, swap))
    except Exception:
        return None
    if not isinstance(g, torch.Tensor) or g.dtype != torch.int64 or tuple(g.shape) != tuple(shape):
        return None
    return np.ascontiguousarray(g.numpy()), np.array(value, copy=True)


def _first_lines(s: str, n: int) -> str:
    lines = [ln for ln in s.strip().splitlines() if ln.strip()]
    return " ".join(lines[:n])


# ops kept whole instead of decomposed (each is one IR op); the rest decomposes to core ATen
def _preserved():
    a = torch.ops.aten
    return [a.conv2d.padding, a.linear.default, a.layer_norm.default, a.silu.default, a.hardswish.default,
            a.hardsigmoid.default, a.relu6.default, a.prelu.default, a.pad.default,
            a.reflection_pad2d.default, a.replication_pad2d.default, a.adaptive_avg_pool2d.default,
            a.upsample_nearest2d.default, a.upsample_nearest2d.vec, a.upsample_bilinear2d.default,
            a.upsample_bilinear2d.vec, a._upsample_nearest_exact2d.default, a._upsample_nearest_exact2d.vec,
            a.hardtanh.default, a.gelu.default, a.elu.default, a.leaky_relu.default, a.group_norm.default,
            a.instance_norm.default,
            a.mish.default, a.softplus.default, a.celu.default, a.selu.default, a.log_sigmoid.default,
            a.scaled_dot_product_attention.default, a.upsample_bicubic2d.default, a.upsample_bicubic2d.vec,
            a.affine_grid_generator.default, a.im2col.default, a.col2im.default, a.max_unpool2d.default]


def _decomposition_table():
    table = torch.export.default_decompositions()
    for op in _preserved():
        table.pop(op, None)
    return table


# nn.LocalResponseNorm decomposes into a dozen ATen ops; while exporting, its modules call one
# custom op instead, which maps to the IR's local_response_norm
_LRN_OP = None


_DROP_PATH_OP = None


def _drop_path_op():
    """tilefuse::drop_path(x, p, mode): the identity (an eval-mode forward), which the export keeps as one node so
    that the network holds the stochastic depth a training forward applies."""
    global _DROP_PATH_OP
    if _DROP_PATH_OP is None:
        @torch.library.custom_op("tilefuse::drop_path", mutates_args=())
        def drop_path(x: torch.Tensor, p: float, mode: str) -> torch.Tensor:
            return x.clone()

        @drop_path.register_fake
        def _(x, p, mode):
            return torch.empty_like(x)

        _DROP_PATH_OP = drop_path
    return _DROP_PATH_OP


def _stochastic_depth(m):
    """(p, mode) of a stochastic-depth module with p > 0, by duck type: torchvision.ops.StochasticDepth (p, mode
    'row' / 'batch'), timm's DropPath (drop_prob, scale_by_keep; one draw per sample); else None. A DropPath that
    does not scale by 1 / keep is (p, 'unscaled')."""
    name = type(m).__name__
    if name == "StochasticDepth" and isinstance(getattr(m, "p", None), float) and m.p > 0:
        return m.p, getattr(m, "mode", "row")
    if name == "DropPath" and isinstance(getattr(m, "drop_prob", None), float) and m.drop_prob > 0:
        return m.drop_prob, "row" if getattr(m, "scale_by_keep", True) else "unscaled"
    return None


def _lrn_op():
    global _LRN_OP
    if _LRN_OP is None:
        @torch.library.custom_op("tilefuse::local_response_norm", mutates_args=())
        def lrn(x: torch.Tensor, size: int, alpha: float, beta: float, k: float) -> torch.Tensor:
            return F.local_response_norm(x, size, alpha, beta, k)

        @lrn.register_fake
        def _(x, size, alpha, beta, k):
            return torch.empty_like(x)

        _LRN_OP = lrn
    return _LRN_OP


@contextlib.contextmanager
def _leaf_ops(module):
    """nn.LocalResponseNorm and F.local_response_norm (AlexNet / GoogLeNet code calls either) as one op while
    exporting (PyTorch decomposes it to a 3-D average pool over a padded channel axis); a stochastic-depth module
    with p > 0 (torchvision's StochasticDepth, timm's DropPath: the identity in eval mode, so nothing would be
    exported) as tilefuse::drop_path, a dropout op for the Trainer."""
    swapped = []
    for m in module.modules():
        if type(m) is nn.LocalResponseNorm:
            op = _lrn_op()
            m.forward = (lambda mm: lambda x: op(x, mm.size, float(mm.alpha), float(mm.beta), float(mm.k)))(m)
            swapped.append(m)
        elif _stochastic_depth(m) is not None and _stochastic_depth(m)[1] in ("row", "batch"):
            op = _drop_path_op()
            m.forward = (lambda pm: lambda x: op(x, float(pm[0]), pm[1]))(_stochastic_depth(m))
            swapped.append(m)
    functional = F.local_response_norm

    def lrn(input, size, alpha=1e-4, beta=0.75, k=1.0):
        if input.dim() != 4:
            return functional(input, size, alpha, beta, k)
        return _lrn_op()(input, int(size), float(alpha), float(beta), float(k))
    F.local_response_norm = lrn
    try:
        yield
    finally:
        F.local_response_norm = functional
        for m in swapped:
            del m.forward


# ----------------------------------------------------------------------------- values

class Const:
    """A constant tensor during import (a parameter, a buffer, or a folded subgraph); it becomes
    a network constant named `key` when an op uses it as an operand. `origin` goes into the network's
    `constant_origin` (what the Trainer trains): "parameter" (an nn.Parameter as it is), "buffer" (a buffer, a
    constant, a literal), or "derived from parameter '<key>'" (a folded expression of a parameter). `root` is
    (key, shape) of the nn.Parameter whose elements this is in their own order (the parameter itself, or a view
    of it: `w.view(1, -1, 1, 1)`, `w[:, None, None]`), which the Trainer trains as that parameter. `gather` (with
    root) is (G, the parameter's value) where this is some of the parameter's elements in another order: G (int64,
    this shape) their flat indices into it (Swin's relative position bias `table[index]`)."""

    def __init__(self, tensor, key: str, origin: str = "buffer", root: tuple | None = None, gather=None):
        self.tensor = tensor.detach()
        self.key = key
        self.origin = origin
        self.root = root
        self.gather = gather

    @property
    def shape(self):
        return tuple(self.tensor.shape)

    def __repr__(self):
        return f"Const({self.key!r}, {self.shape})"


# ATen ops that move a tensor's elements (a gather of them, whatever the order: `_gather_of_parameter`)
_GATHER_OPS = frozenset({"view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "alias", "detach", "clone",
                         "contiguous", "slice", "select", "lift_fresh_copy", "flatten", "unflatten", "expand",
                         "permute", "transpose", "t", "index", "index_select", "repeat", "flip", "roll", "narrow"})
# ATen ops that give a tensor's elements in their own order (with as many elements: a view of all of them)
_VIEW_OPS = frozenset({"view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "alias", "detach", "clone",
                       "contiguous", "slice", "select", "lift_fresh_copy", "_to_copy", "flatten", "unflatten",
                       "expand"})

# ATen ops that move an integer input's values without computing with them: an integer-valued tensor (from an
# input the model takes as int64: a diffusion model's timesteps) may pass through these, and leave the integers
# only where an op's result is a float (`t.float()`, `t[:, None] * freqs`: PyTorch converts the integer to the
# float first, as the IR's float tensor already is) or a bool (a comparison); integer arithmetic is refused
_INT_MOVES = frozenset({"view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "alias", "detach", "clone",
                        "contiguous", "slice", "select", "lift_fresh_copy", "flatten", "unflatten", "expand",
                        "permute", "transpose", "t", "cat", "repeat", "flip", "index", "index_select", "split",
                        "split_with_sizes", "chunk", "narrow", "_to_copy"})
_INT_DTYPES = {}
if torch is not None:
    _INT_DTYPES = {torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8,
                   torch.uint8: np.uint8}

_NONDETERMINISTIC = ("rand", "randn", "randint", "bernoulli", "dropout", "native_dropout", "empty",
                     "normal", "uniform", "multinomial")


class _Importer:
    def __init__(self, ep, name: str, direct: bool = False, fold_parameters: bool = True, modules=None):
        self.ep = ep
        self.fold_parameters = fold_parameters
        self.modules = modules or {}  # module path -> module (the user's: a BN's momentum, which eval export drops)
        self.direct = direct          # the undecomposed graph: unknown ops ask for decomposition
        self.net = Network(name)
        self.env: dict[Any, Any] = {}
        self.used: set[str] = set()
        # (key, dtype) -> [(the Const's tensor, its network constant)]: two folds of one constant by one op
        # (`p[..., :2]`, `p[..., 2:]`: both 'p.slice') share a key, not a value
        self.consts: dict[tuple[str, str], list] = {}
        self.node = None
        self.dtype = np.dtype(np.float32)
        self.int_nodes: set = set()   # FX nodes whose values are an integer input's (moved, not computed with)

    # ------------------------------------------------------------ helpers

    def where(self) -> str:
        """The node and the innermost source line outside torch itself that produced it."""
        n = self.node
        if n is None:
            return "module"
        frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', n.meta.get("stack_trace") or "")
        user = [f for f in frames if not re.search(r"[/\\]torch[/\\]", f[0])] or frames
        if not user:
            return f"node '{n.name}'"
        file, line, fn, code = user[-1]
        return f"node '{n.name}' at {file}:{line} in {fn}: {code.strip()}"

    def fail(self, what: str, hint: str = "") -> UnsupportedOpError:
        op = self.target_name() if self.node is not None and self.node.op == "call_function" else ""
        head = f"{op}: {what}" if op and op not in what else what
        return UnsupportedOpError(f"{head} is not supported by tilefuse.from_torch ({self.where()})"
                                  + (f"; {hint}" if hint else ""))

    def unique(self, base: str) -> str:
        name, i = base, 0
        while name in self.used:
            i += 1
            name = f"{base}_{i}"
        self.used.add(name)
        return name

    def op_name(self) -> str:
        """The module path for a torch.nn module's own op ('layer1.0.conv1'); '<scope>.<fn>' for a
        function called in a user module's forward ('layer1.0.add')."""
        n = self.node
        stack = list((n.meta.get("nn_module_stack") or {}).values())
        fn = n.meta.get("torch_fn")
        base = fn[1].split(".")[-1] if fn else re.sub(r"_\d+$", "", n.name)
        base = base.strip("_") or n.name
        if stack:
            path, typ = stack[-1]
            typ = typ if isinstance(typ, str) else getattr(typ, "__module__", "") + "." + getattr(typ, "__name__", "")
            if typ.startswith("torch.nn.modules.") and path:
                return self.unique(path)
            return self.unique(f"{path}.{base}" if path else base)
        return self.unique(base)

    def const_node(self, c: Const, nonfinite: bool = False) -> DataNode:
        """The network constant for `c` (created once per key, dtype and value); NaN and infinities only with
        `nonfinite` (where's values)."""
        dt = self.dtype
        key = (c.key, str(dt))
        seen = self.consts.setdefault(key, [])
        d = next((d for t, d in seen if t is c.tensor or (t.shape == c.tensor.shape and t.dtype == c.tensor.dtype
                                                         and torch.equal(t, c.tensor))), None)
        if d is None:
            arr = c.tensor.cpu().numpy()
            if arr.dtype.kind not in "fiub":
                raise self.fail(f"a constant of dtype {arr.dtype} ('{c.key}')")
            arr = arr.astype(dt)
            if arr.ndim == 0:
                arr = arr.reshape(1)
            d = self.net.constant(self.unique(c.key), arr, dtype=dt, nonfinite=nonfinite)
            self.net.constant_origin[d.name] = c.origin
            if c.root is not None and (c.root[0] != d.name or tuple(c.root[1]) != arr.shape or c.gather is not None):
                self.net.constant_alias[d.name] = (c.root[0], tuple(c.root[1]))
            if c.gather is not None:
                self.net.constant_gather[d.name] = (c.gather[0].reshape(-1), c.gather[1])
            seen.append((c.tensor, d))
        return d

    def fixed(self, base: str, arr: np.ndarray) -> DataNode:
        """A constant the importer makes (a norm's unit weight, a broadcast's ones): a buffer, never trained."""
        d = self.net.constant(self.unique(base), arr, dtype=self.dtype)
        self.net.constant_origin[d.name] = "buffer"
        return d

    def tensor(self, v, what="input") -> DataNode:
        if isinstance(v, DataNode):
            return v
        if isinstance(v, Const):        # an op that computes with a constant (beside a computed operand, or a
            return self.const_node(v)   # parameter with fold_parameters=False: `batch_norm(w.reshape(1, O, -1))`)
        raise self.fail(f"{self.target_name()} with a {type(v).__name__} {what}",
                        "expected a tensor computed from the network inputs")

    def weight(self, v, what: str) -> Const:
        if isinstance(v, Const):
            return v
        raise self.fail(f"{self.target_name()} with a computed {what}",
                        f"expected the {what} to be a parameter or buffer (a constant)")

    def operand(self, v, like: DataNode, nonfinite: bool = False) -> DataNode:
        """A binary op operand: a DataNode as is, a constant tensor or a number as a constant (NaN and infinities
        only with `nonfinite`: where's values)."""
        if isinstance(v, DataNode):
            return v
        if isinstance(v, Const):
            return self.const_node(v, nonfinite)
        if isinstance(v, (int, float, bool)):
            key = self.unique(f"{self.op_name_hint()}.scalar")
            d = self.net.constant(key, np.full((1,) if like.shape else (), v, dtype=like.dtype), dtype=like.dtype,
                                  nonfinite=nonfinite)
            self.net.constant_origin[d.name] = "buffer"
            return d
        raise self.fail(f"{self.target_name()} with an operand of type {type(v).__name__}")

    def module(self):
        """The user's module whose forward made the current node (the innermost on its nn_module_stack), or None."""
        stack = list((self.node.meta.get("nn_module_stack") or {}).values())
        return self.modules.get(stack[-1][0]) if stack else None

    def op_name_hint(self) -> str:
        stack = list((self.node.meta.get("nn_module_stack") or {}).values())
        return (stack[-1][0] + "." if stack and stack[-1][0] else "") + self.node.name

    def target_name(self) -> str:
        t = self.node.target
        return f"aten.{t._opname}.{t._overloadname}" if hasattr(t, "_opname") else str(t)

    # ------------------------------------------------------------ driver

    def run(self, examples) -> Network:
        sig = self.ep.graph_signature
        state = self.ep.state_dict
        consts = getattr(self.ep, "constants", {}) or {}
        specs = {s.arg.name: s for s in sig.input_specs if hasattr(s.arg, "name")}
        user = [s for s in sig.input_specs if s.kind.name == "USER_INPUT"]
        if len(user) != len(examples):
            raise GraphError(self.net.name, f"forward() takes {len(user)} tensor inputs, expected one "
                                            f"example tensor each; got {len(examples)}")
        ex = iter(examples)
        floats = [_DTYPES[t.dtype] for t in examples if t.dtype in _DTYPES]
        float_dt = floats[0] if floats else np.float32      # what an integer input computes as
        self.dtype = np.dtype(float_dt)
        for n in self.ep.graph.nodes:
            self.node = n
            if n.op == "placeholder":
                s = specs.get(n.name)
                kind = s.kind.name if s is not None else "USER_INPUT"
                if kind == "USER_INPUT":
                    t = next(ex)
                    if t.dtype in _INT_DTYPES:          # timesteps, a class index: computed as the network's float
                        self.int_nodes.add(n)
                        self.env[n] = self.net.input(self.unique(n.name), tuple(t.shape), float_dt,
                                                     integer=_INT_DTYPES[t.dtype])
                        continue
                    if t.dtype not in _DTYPES:
                        raise GraphError(n.name, f"example input has dtype {t.dtype}; expected one of "
                                                 f"{', '.join(str(d) for d in (*_DTYPES, *_INT_DTYPES))}")
                    self.env[n] = self.net.input(self.unique(n.name), tuple(t.shape), _DTYPES[t.dtype])
                elif kind in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
                    t = state[s.target] if s.target in state else consts[s.target]
                    self.env[n] = Const(t, s.target, "parameter", (s.target, tuple(t.shape))) \
                        if kind == "PARAMETER" else Const(t, s.target, "buffer")
                else:
                    raise self.fail(f"a graph input of kind {kind}")
            elif n.op == "call_function":
                ints = self.int_nodes and any(a in self.int_nodes for a in n.all_input_nodes)
                if ints:
                    self._check_integer_use(n)
                self.env[n] = self.call(n)
                self._check_shapes(n, self.env[n])
                if (ints and _integer_result(n)) or _index_result(n):
                    self.int_nodes.add(n)
            elif n.op == "output":
                fx = _flatten(n.args[0])
                self.outputs(self.load(n.args[0]),
                             [_INT_DTYPES.get(_result_dtype(a)) if a in self.int_nodes else None for a in fx],
                             [_fx_shape(a) for a in fx])
            elif n.op == "get_attr":
                self.env[n] = Const(getattr(self.ep.graph_module, n.target), str(n.target))
            else:  # pragma: no cover
                raise self.fail(f"graph node kind '{n.op}'")
        self.node = None
        return self.net

    def _check_shapes(self, n, result) -> None:
        """Every tensor the importer built has the shape PyTorch computed for the node (for a 0-d tensor, () or
        (1,): a one-value constant operand is (1,), which broadcasts as the 0-d tensor does against any tensor of
        rank >= 1, and `outputs` reshapes it); a difference is an importer bug, refused rather than computed
        wrong."""
        vals = n.meta.get("val")
        got, want = (list(result), list(vals)) if isinstance(result, (tuple, list)) and \
            isinstance(vals, (tuple, list)) else ([result], [vals])
        for d, v in zip(got, want):
            if isinstance(d, DataNode) and isinstance(v, torch.Tensor) and all(type(s) is int for s in v.shape):
                shape = tuple(v.shape)
                if tuple(d.shape) != shape and not (shape == () and tuple(d.shape) == (1,)):
                    raise GraphError(d.name, f"the importer built shape {tuple(d.shape)} for {self.target_name()}"
                                             f" where PyTorch computes {tuple(v.shape)}; please report this "
                                             f"with the model")

    def load(self, a):
        return torch.fx.node.map_arg(a, lambda n: self.env[n])

    def _check_integer_use(self, n) -> None:
        """An op reading an integer input's values: a move (_INT_MOVES; a conversion to a wider integer), or an op
        whose result is a float or a bool (the integer converted to the float first, as PyTorch promotes it);
        integer arithmetic (t + 1, t // 2) is refused, since the IR would compute it in float."""
        if n.target is operator.getitem:
            return
        name = getattr(n.target, "_opname", "")
        if name in ("take", "index_put", "scatter", "scatter_add", "index_add", "index_copy"):
            idx = next((a for a in n.all_input_nodes if a in self.int_nodes), None)
            raise self.fail(f"{name} with '{idx.name}' (an integer input's values) as indices",
                            "tilefuse reads at run-time indices through x[t], index_select, nn.Embedding and 1-D "
                            "gather only")
        if not _integer_result(n):
            return
        dt = _result_dtype(n)
        if name == "_to_copy" and (dt not in (torch.int64, torch.int32)):
            raise self.fail(f"converting an integer input's values to {dt}",
                            "tilefuse keeps them exact as int32 / int64 or converts them to the float dtype")
        if name not in _INT_MOVES:
            src = next(a for a in n.all_input_nodes if a in self.int_nodes)
            raise self.fail(f"integer arithmetic on '{src.name}' (an integer input's values, result {dt})",
                            "tilefuse computes in floats and takes an integer input through reshapes, slices, "
                            "conversions to float (t.float()) and ops with a float result: convert it first "
                            "(t.float() + 1)")

    def call(self, n):
        args, kwargs = self.load(n.args), self.load(n.kwargs)
        target = n.target
        if target is operator.getitem:
            seq, i = args
            if isinstance(seq, (tuple, list)):
                return seq[i]
            raise self.fail(f"indexing a {type(seq).__name__}")
        if not hasattr(target, "_opname"):
            if target in _SIZE_CHECKS and any(isinstance(v, _MaskedSize) for v in _flatten(args)):
                return _MaskedSize()    # export's range check of x[mask]'s size (for an _assert_scalar)
            raise self.fail(f"function {getattr(target, '__name__', target)}")
        name = target._opname
        if name.startswith("_assert"):
            return None   # export's own metadata / shape assertions: already true for static shapes
        flat = [v for v in _flatten(args) + _flatten(list(kwargs.values()))]
        bad = next((v for v in flat if isinstance(v, _Unsupported)), None)
        if bad is not None and not (name == "max_unpool2d" and isinstance(bad, _PoolIndices)):
            raise self.fail(f"{self.target_name()} of {bad.what}",
                            f"tilefuse computes the values only; the indices come from {bad.where}")
        masked = [v for v in flat if isinstance(v, _Masked)]
        base = name[:-1] if name.endswith("_") and name[:-1] in _ATEN else name     # add_, index_put_
        if masked and base != "index_put":
            return self.masked_elementwise(base, args, kwargs, masked)
        cmp = next((v for v in flat if isinstance(v, boolexpr.BOOL)), None)
        if name == "index" and len(args) == 2 and len(args[1]) == 1 and isinstance(args[1][0], boolexpr.BOOL):
            return _mask_select(self, *args)
        if cmp is not None and name in _BOOL_ARITHMETIC:
            return self.bool_arithmetic(name, args, kwargs)
        if cmp is not None and name in ("any", "all"):
            return self.bool_reduce(name, *args, **kwargs)
        if cmp is not None and name in ("eq", "ne") and _bool_constant(args[1]) is not None and \
                isinstance(args[0], boolexpr.BOOL):
            # m != 0, m == True (count_nonzero's decomposition): m itself or its negation
            return args[0] if _bool_constant(args[1]) == (name == "eq") else boolexpr.Not(args[0])
        if cmp is not None and name not in _BOOL_READERS:
            if self.direct:             # (x > 0).to(dtype) and the like decompose to a reader
                raise _NeedsDecomposition(name)
            raise self.fail(f"{self.target_name()} of a comparison's bool tensor (from {boolexpr.leaf(cmp).origin})",
                            "tilefuse uses a comparison in torch.where(...), ~ / & / |, .float() / .to(x.dtype), "
                            "arithmetic (x * mask, mask.sum(), mask.cumsum(1)) and x[mask] = v only")
        if not any(isinstance(v, (DataNode, *boolexpr.BOOL)) for v in flat) and \
                not name.startswith(_NONDETERMINISTIC):
            out = self.fold(target, args, kwargs)
            if self.fold_parameters or not _derived(out):
                return out
            args, kwargs = self.parameters_as_nodes(args, kwargs)
        fn = _ATEN.get(name.rstrip("_") if name not in _ATEN else name)
        if fn is None:
            if self.direct:
                raise _NeedsDecomposition(name)
            raise self.fail(f"ATen op {self.target_name()}",
                            "supported ATen ops: " + ", ".join(sorted(_ATEN)))
        out = fn(self, *args, **kwargs)
        schema = getattr(target, "_schema", None)
        if schema is not None and schema.is_mutable and n.args and hasattr(n.args[0], "op"):
            self.env[n.args[0]] = out     # x.add_(y): later reads of x see the result
        return out

    def masked_elementwise(self, name, args, kwargs, masked):
        """An element-wise op on x[mask] (`_Masked`, a data-dependent shape): computed on the whole of x and still
        x[mask] (`y[m] = x[m] * 2`, `y[m] += v`: index_put then takes it as where(m, ..., y)); every x[mask] it
        reads must have the same mask, and any other tensor must broadcast against x[mask]'s trailing dims as it
        does against x's. Anything else reading x[mask] (a reduction, a reshape) is refused by name."""
        m0 = masked[0]
        if name == "sym_size":
            return _MaskedSize()        # read by export's own range checks only (else refused where used)
        what = f"{self.target_name()} of x[mask] (from {m0.origin}; a data-dependent shape)"
        hint = "tilefuse computes x[mask] element-wise into an assignment y[mask] = f(x[mask]), and its sum and " \
               "mean; write torch.where(mask, f(x), y)"
        if name in ("sum", "mean") and len(masked) == 1 and len(args) == 1 and not kwargs:
            return _masked_total(self, name, m0)
        if name not in _MASKED_ELEMENTWISE:
            raise self.fail(what, hint)
        if any(not _same_bool(m.mask, m0.mask) for m in masked[1:]):
            raise self.fail(f"{self.target_name()} of x[mask] and y[other_mask]", hint)
        rest = len(m0.x.shape) - m0.rank
        for v in _flatten(args) + _flatten(list(kwargs.values())):
            if isinstance(v, (DataNode, Const)) and len(v.shape if isinstance(v, DataNode) else v.tensor.shape) > rest:
                raise self.fail(f"{what} with a tensor of rank > {rest}", hint)
        unwrap = (lambda v: v.x if isinstance(v, _Masked) else v)
        out = _ATEN[name](self, *torch.fx.node.map_aggregate(args, unwrap),
                          **torch.fx.node.map_aggregate(kwargs, unwrap))
        if not isinstance(out, DataNode):
            raise self.fail(what, hint)
        return _Masked(out, m0.mask, m0.rank, m0.origin)

    def bool_arithmetic(self, name, args, kwargs):
        """Arithmetic reading a comparison's bool tensor. Of bools only, mul is logical and, add logical or (PyTorch's
        bool result); otherwise PyTorch promotes the bool to 1 / 0 of the float dtype (logaddexp's `(a == b) * x`,
        nanmean's count `(~isnan(x)).sum()`), and so does the importer (a where op per comparison), the op then
        importing as usual. A sum of bools is an int64 count: an integer tensor (`int_nodes`)."""
        if _result_dtype(self.node) == torch.bool and name in ("mul", "add") and not kwargs:
            a, b = args
            if isinstance(a, boolexpr.BOOL) and isinstance(b, boolexpr.BOOL):
                return boolexpr.And(a, b) if name == "mul" else boolexpr.Or(a, b)
            raise self.fail(f"{self.target_name()} of a bool tensor and a {type(b).__name__}")

        def promote(v):
            if not isinstance(v, boolexpr.BOOL):
                return v
            return boolexpr.select(self.net, v, 1.0, 0.0, self.unique(self.op_name_hint() + ".float"))
        args = torch.fx.node.map_aggregate(args, promote)
        kwargs = torch.fx.node.map_aggregate(kwargs, promote)
        out = _ATEN[name](self, *args, **kwargs)
        if _integer_result(self.node):
            self.int_nodes.add(self.node)
        return out

    def bool_reduce(self, name, e, dim=None, keepdim=False):
        """any / all of a comparison's bool tensor (over dims, or every dim: 0-d): the max / min of its 1 / 0 (a
        where op) compared with 0.5, a comparison again for where / ~ / arithmetic to read."""
        if not isinstance(e, boolexpr.BOOL):
            raise self.fail(f"{self.target_name()} of a bool tensor and a comparison")
        f = boolexpr.select(self.net, e, 1.0, 0.0, self.unique(self.op_name_hint() + ".float"))
        dims = list(range(len(f.shape))) if dim is None else list(dim) if isinstance(dim, (list, tuple)) else [dim]
        r = _ATEN["amax" if name == "any" else "amin"](self, f, dims, keepdim)
        return boolexpr.Cmp(r, "gt", self.operand(0.5, r), self.where())

    def parameters_as_nodes(self, args, kwargs):
        """(fold_parameters=False) args and kwargs with each parameter (or view of one) a network constant, for
        an op that computes with it: the network computes the expression, the Trainer trains the parameter."""
        def node(v):
            return self.const_node(v) if isinstance(v, Const) and v.origin != "buffer" else v
        return torch.fx.node.map_aggregate(args, node), torch.fx.node.map_aggregate(kwargs, node)

    def fold(self, target, args, kwargs):
        """Evaluate a constant-only node with torch (e.g. a transposed weight, a scalar tensor)."""
        def unwrap(v):
            return v.tensor if isinstance(v, Const) else v
        a = torch.fx.node.map_aggregate(args, unwrap)
        k = torch.fx.node.map_aggregate(kwargs, unwrap)
        try:
            out = target(*a, **k)
        except Exception as e:
            raise self.fail(f"constant subgraph {self.target_name()}", f"torch failed to evaluate it: {e}") from e
        keys = [v.key for v in _flatten(args) if isinstance(v, Const)]
        key = f"{keys[0]}.{target._opname}" if len(keys) == 1 else self.node.name
        params = [v for v in _flatten(args) if isinstance(v, Const) and v.origin != "buffer"]
        origin = "buffer" if not params else (
            f"derived from parameter '{params[0].root[0] if params[0].root else params[0].key}'"
            if params[0].origin == "parameter" else params[0].origin)
        consts = [v for v in _flatten(args) if isinstance(v, Const)]
        if isinstance(out, torch.Tensor) and target._opname in _VIEW_OPS and len(consts) == 1 and \
                consts[0].root is not None and consts[0].gather is None and out.dtype == consts[0].tensor.dtype \
                and out.numel() == int(np.prod(consts[0].root[1])):
            # every element of the parameter in its own order: trained as the parameter (its gradient reshaped)
            return Const(out, key, "parameter", consts[0].root)
        roots = [c for c in consts if c.root is not None]
        if isinstance(out, torch.Tensor) and target._opname in _GATHER_OPS and len(roots) == 1 and \
                out.dtype == roots[0].tensor.dtype and out.dtype.is_floating_point and \
                all(c is roots[0] or c.origin == "buffer" for c in consts):
            g = _gather_of_parameter(target, args, kwargs, roots[0], out.shape)
            if g is not None:       # some of the parameter's elements, moved: trained as the parameter
                return Const(out, key, "parameter", roots[0].root, g)
        if isinstance(out, torch.Tensor):
            return Const(out, key, origin)
        if isinstance(out, (tuple, list)):
            return type(out)(Const(t, f"{key}.{i}", origin) if isinstance(t, torch.Tensor) else t
                             for i, t in enumerate(out))
        return out

    def outputs(self, result, integer=None, shapes=None) -> None:
        """The network's outputs; integer[i]: the integer dtype output i is returned as (an argmax, an integer
        input moved), or None; shapes[i]: PyTorch's shape of output i (a 0-d one built as (1,) is reshaped)."""
        flat = _flatten(result)
        integer = integer or [None] * len(flat)
        shapes = shapes or [None] * len(flat)
        if not flat:
            raise GraphError(self.net.name, "forward() returns no tensor; expected at least one")
        for v, dt, shape in zip(flat, integer, shapes):
            if isinstance(v, Const):
                raise GraphError(self.net.name, f"forward() returns the constant '{v.key}'; expected tensors "
                                                f"computed from the inputs")
            if isinstance(v, _Masked):
                raise self.fail(f"forward() returning {v!r}, of a data-dependent shape",
                                "return torch.where(mask, x, fill) or a reduction of it (x[mask].sum())")
            if isinstance(v, _Unsupported):
                raise self.fail(f"forward() returning {v.what}",
                                f"tilefuse computes the values only; the indices come from {v.where}")
            d = self.tensor(v, "network output")
            if shape == () and d.shape == (1,):
                d = self.net.reshape(d, (), name=self.unique(f"{d.name}.0d"))
            if d.producer is None or any(d is o for o in self.net.outputs):
                # an input returned as is, or the same tensor returned twice: copy it
                d = self.net.dropout(d, 0.0, name=self.unique(f"{d.name}.copy"))
            self.net.output(d, integer=dt)


def _fx_shape(n) -> tuple | None:
    """The shape PyTorch computed for an FX node's tensor, else None."""
    v = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
    if not isinstance(v, torch.Tensor) or not all(type(s) is int for s in v.shape):
        return None                             # (a data-dependent size: x[mask]'s)
    return tuple(v.shape)


def _result_dtype(n):
    v = n.meta.get("val")
    v = v[0] if isinstance(v, (tuple, list)) and v else v
    return getattr(v, "dtype", None)


def _integer_result(n) -> bool:
    """The FX node's result (its first, for an op of several) is an integer tensor."""
    dt = _result_dtype(n)
    return dt is not None and not dt.is_floating_point and not dt.is_complex and dt != torch.bool


def _index_result(n) -> bool:
    """The FX node computes indices (the IR's argmax): argmax, argmin, or max / min over a dim (its second
    result)."""
    t = getattr(n, "target", None)
    name = getattr(t, "_opname", "")
    return name in ("argmax", "argmin") or (name in ("max", "min") and getattr(t, "_overloadname", "") == "dim")


def _derived(v) -> bool:
    """Whether a fold's result is an expression of a parameter (not a buffer, not the parameter's own elements)."""
    return any(isinstance(c, Const) and c.origin.startswith("derived from") for c in _flatten(v))


def _flatten(v) -> list:
    if isinstance(v, (tuple, list)):
        out = []
        for u in v:
            out += _flatten(u)
        return out
    if isinstance(v, dict):
        return _flatten(list(v.values()))
    return [v]


# ----------------------------------------------------------------------------- ATen op mapping

def _pair(v):
    return (int(v[0]), int(v[1])) if isinstance(v, (tuple, list)) and len(v) == 2 else \
        (int(v[0]), int(v[0])) if isinstance(v, (tuple, list)) else (int(v), int(v))


def _convolution(imp, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    x = imp.tensor(x)
    if isinstance(w, DataNode) or isinstance(b, DataNode):
        return _conv_computed(imp, x, w, b, stride, padding if isinstance(padding, (tuple, list)) else (padding,),
                              dilation, transposed, groups)
    w = imp.weight(w, "weight")
    if len(w.shape) == 3 and len(x.shape) == 3:
        return _convolution_1d(imp, x, w, b, stride, padding, dilation, transposed, output_padding, groups)
    if len(w.shape) != 4 or len(x.shape) != 4:
        raise imp.fail(f"a {len(w.shape) - 2}-D convolution (weight {w.shape}) of an input {x.shape}",
                       "supported: 2-D convolution (Conv2d, ConvTranspose2d) of (N, C, H, W) and 1-D (Conv1d, "
                       "ConvTranspose1d) of (N, C, L)")
    ph, pw = _pair(padding)
    name = imp.op_name()
    wd = imp.const_node(w)
    bd = imp.const_node(imp.weight(b, "bias")) if b is not None else None
    if transposed:
        return imp.net.conv_transpose2d(x, wd, bd, _pair(stride), (ph, ph, pw, pw), _pair(output_padding),
                                        _pair(dilation), int(groups), name=name)
    return imp.net.conv2d(x, wd, bd, _pair(stride), (ph, ph, pw, pw), _pair(dilation), int(groups), name=name)


def _convolution_1d(imp, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    """Conv1d / ConvTranspose1d (ECA-Net's attention: a conv along the channel means, `conv(y.view(n, 1, -1))`) as
    the 2-D conv of (N, C, 1, L): the weight (Co, Ci/g, K) as (Co, Ci/g, 1, K), each 1-D attribute along W (as the
    ONNX importer lifts a 1-D Conv). aten.convolution's padding is numbers (conv1d's 'same' / 'valid' decompose to
    them)."""
    n, c, length = x.shape
    one = lambda v: (int(v[0]) if isinstance(v, (tuple, list)) else int(v))  # noqa: E731
    root = w.root if w.root is not None else ((w.key, w.shape) if w.origin == "parameter" else None)
    w4 = Const(w.tensor.unsqueeze(2), f"{w.key}.as_2d", w.origin, root)    # (Co, Ci/g, K) -> (Co, Ci/g, 1, K)
    x4 = _reshape(imp, x, (n, c, 1, length))                              # (N, C, L) -> (N, C, 1, L)
    y = _convolution(imp, x4, w4, b, (1, one(stride)), (0, one(padding)), (1, one(dilation)), transposed,
                     (0, one(output_padding)), groups)
    return _reshape(imp, y, (n, y.shape[1], y.shape[3]))                 # (N, Co, 1, L') -> (N, Co, L')


def _same_padding(padding, kernel, dilation) -> tuple:
    """conv2d's 'same' / 'valid' as (top, bottom, left, right): torch puts an odd extra pad after."""
    if padding == "valid":
        return (0, 0, 0, 0)
    (kh, kw), (dh, dw) = kernel, _pair(dilation)
    th, tw = dh * (kh - 1), dw * (kw - 1)
    return (th // 2, th - th // 2, tw // 2, tw - tw // 2)


def _conv_computed(imp, x, w, b, stride, padding, dilation, transposed, groups):
    """A conv whose weight (or bias) the network computes from its inputs: StyleGAN2's modulated conv (the batch
    folded into groups), CondConv / dynamic conv's per-sample kernels (Network.conv2d lowers it to im2col and a
    matmul). A 1-D one (N, C, L) as the 2-D conv of (N, C, 1, L); padding: numbers or ('same',) / ('valid',)."""
    if transposed:
        raise imp.fail(f"a transposed convolution whose weight is computed from the inputs (weight "
                       f"{_shape_of(w)})", "tilefuse runs conv_transpose2d with a parameter or buffer weight")
    wd = w if isinstance(w, DataNode) else imp.const_node(imp.weight(w, "weight"))
    bd = None if b is None else b if isinstance(b, DataNode) else imp.const_node(imp.weight(b, "bias"))
    name = imp.op_name()
    if len(x.shape) == 3 and len(wd.shape) == 3:
        n, c, length = x.shape
        one = lambda v: (int(v[0]) if isinstance(v, (tuple, list)) else int(v))  # noqa: E731
        x4 = _reshape(imp, x, (n, c, 1, length))                                  # (N, C, L) -> (N, C, 1, L)
        w4 = imp.net.reshape(wd, (wd.shape[0], wd.shape[1], 1, wd.shape[2]), name=imp.unique(name + ".w2d"))
        pad = padding if isinstance(padding[0], str) else (0, one(padding))
        pad = (0, 0) + _same_padding(pad[0], (1, wd.shape[2]), (1, one(dilation)))[2:] if isinstance(pad[0], str) \
            else (0, 0, pad[1], pad[1])
        y = imp.net.conv2d(x4, w4, bd, (1, one(stride)), pad, (1, one(dilation)), int(groups),
                           name=imp.unique(name + ".2d"))
        return _reshape(imp, y, (n, y.shape[1], y.shape[3]))                     # (N, Co, 1, L') -> (N, Co, L')
    if len(wd.shape) != 4 or len(x.shape) != 4:
        raise imp.fail(f"a {len(wd.shape) - 2}-D convolution (weight {wd.shape}) of an input {x.shape}",
                       "supported: 2-D convolution of (N, C, H, W) and 1-D of (N, C, L)")
    if isinstance(padding[0], str):
        pad = _same_padding(padding[0], wd.shape[2:], dilation)
    else:
        ph, pw = _pair(padding)
        pad = (ph, ph, pw, pw)
    return imp.net.conv2d(x, wd, bd, _pair(stride), pad, _pair(dilation), int(groups), name=name)


def _shape_of(v):
    return tuple(v.shape) if isinstance(v, DataNode) else tuple(v.tensor.shape) if isinstance(v, Const) else v


def _conv2d_padding(imp, x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """aten.conv2d: padding as numbers, or 'same' / 'valid' (torch puts an odd extra pad after)."""
    if not isinstance(padding, str):
        return _convolution(imp, x, w, b, stride, padding, dilation, False, (0, 0), groups)
    x = imp.tensor(x)
    if isinstance(w, DataNode) or isinstance(b, DataNode):
        return _conv_computed(imp, x, w, b, stride, (padding,), dilation, False, groups)
    w = imp.weight(w, "weight")
    pad = _same_padding(padding, w.shape[2:], dilation)
    name = imp.op_name()
    bd = imp.const_node(imp.weight(b, "bias")) if b is not None else None
    return imp.net.conv2d(x, imp.const_node(w), bd, _pair(stride), pad, _pair(dilation), int(groups), name=name)


def _batch_norm(imp, x, w, b, mean, var, momentum, eps):
    x = imp.tensor(x)
    mean, var = imp.weight(mean, "running mean"), imp.weight(var, "running variance")
    prefix = mean.key[: -len(".running_mean")] if mean.key.endswith(".running_mean") else mean.key
    c = x.shape[1]
    g = imp.const_node(w) if w is not None else imp.fixed(f"{prefix}.unit_weight", np.ones(c, imp.dtype))
    bb = imp.const_node(b) if b is not None else imp.fixed(f"{prefix}.zero_bias", np.zeros(c, imp.dtype))
    y = imp.net.batch_norm(x, g, bb, imp.const_node(mean), imp.const_node(var), eps=float(eps), name=imp.op_name())
    m = imp.module()
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        # the running statistics' momentum a training step uses (None: the cumulative average), which the
        # eval-mode graph does not carry
        imp.net.bn_momentum[y.producer.name] = None if m.momentum is None else float(m.momentum)
    return (y, None, None)


def _batch_norm_aten(imp, x, w, b, mean, var, training, momentum, eps, *rest):
    """aten.batch_norm (the exported graph before decomposition)."""
    if training or mean is None:
        return _batch_norm_training(imp, x, w, b, mean, var, training, momentum, eps)[0]
    return _batch_norm(imp, x, w, b, mean, var, momentum, eps)[0]


def _const_reshaped(c: Const, shape) -> Const:
    """Const c reshaped (a view of the same parameter elements, in their order)."""
    g = None if c.gather is None else (c.gather[0].reshape(shape), c.gather[1])
    return Const(c.tensor.reshape(shape), c.key, c.origin, c.root, g)


def _batch_norm_training(imp, x, w, b, *rest):
    """Batch norm with the batch's statistics and no running buffers (F.batch_norm(x, None, None, training=True):
    timm's StdConv2d weight standardization; BatchNorm2d(track_running_stats=False)): mean and biased variance
    over every axis but 1, as mean, sub, mul, mean, add, rsqrt, mul, then the affine weight and bias (constants or
    computed, (C,) viewed as (1, C, 1, ...)) (`Network.batch_stats_normalize`). Returns (y, None, None) as
    native_batch_norm does.
    rest: (running_mean, running_var, training, momentum, eps[, cudnn]) or, for _native_batch_norm_legit.no_stats,
    (training, momentum, eps)."""
    if imp.node.target._overloadname == "no_stats":
        rest = (None, None) + tuple(rest)
    mean, var, training, momentum, eps = rest[:5]
    if mean is not None or var is not None:
        raise imp.fail("batch norm with batch statistics that also updates running_mean / running_var "
                       "(training=True with buffers)", "an inference import reads the running statistics; "
                       "expected the module in eval mode (from_torch calls module.eval())")
    x = imp.tensor(x)
    r = len(x.shape)
    if r < 2:
        raise imp.fail(f"batch norm of a rank-{r} input {x.shape}", "expected (N, C, ...)")
    base = imp.op_name_hint()
    y = imp.net.batch_stats_normalize(x, float(eps), name=imp.unique(base + ".normalized")
                                      if w is not None or b is not None else imp.op_name())
    shape = [1, x.shape[1]] + [1] * (r - 2)
    for k, t in (("weight", w), ("bias", b)):
        if t is None:
            continue
        t = _reshape(imp, t, shape) if isinstance(t, DataNode) else imp.operand(_const_reshaped(t, shape), y)
        y = (imp.net.mul if k == "weight" else imp.net.add)(y, t, name=imp.unique(f"{base}.{k}"))
    return (y, None, None)


def _group_norm(imp, x, groups, w=None, b=None, eps=1e-5, *rest):
    """aten.group_norm(x, groups, weight?, bias?, eps, cudnn_enabled) -> group_norm."""
    x = imp.tensor(x)
    name = imp.op_name()
    c = x.shape[1] if len(x.shape) >= 2 else 0
    g = imp.const_node(imp.weight(w, "weight")) if w is not None else \
        imp.fixed(f"{name}.unit_weight", np.ones(c, imp.dtype))
    bb = imp.const_node(imp.weight(b, "bias")) if b is not None else \
        imp.fixed(f"{name}.zero_bias", np.zeros(c, imp.dtype))
    return imp.net.add_op("group_norm", [x, g, bb], {"groups": int(groups), "eps": float(eps)}, name)


def _native_group_norm(imp, x, w, b, n, c, hw, groups, eps):
    """aten.native_group_norm(x, weight?, bias?, N, C, HxW, groups, eps) -> (y, mean, rstd)."""
    return (_group_norm(imp, x, groups, w, b, eps), None, None)


def _instance_norm(imp, x, w, b, mean, var, use_input_stats, momentum, eps, *rest):
    """aten.instance_norm: statistics of each image's channel (group_norm with groups = C), or, with
    track_running_stats in eval mode (use_input_stats False), the running statistics (batch_norm)."""
    if not use_input_stats:
        y = _batch_norm(imp, x, w, b, mean, var, momentum, eps)[0]
        imp.net.train_mode_updates[y.producer.name] = (
            "instance norm with running statistics (track_running_stats=True): its training forward normalizes by "
            "each sample's own statistics, the eval graph by the running ones")
        return y
    xt = imp.tensor(x)
    if len(xt.shape) < 3:
        raise imp.fail(f"instance norm of a rank-{len(xt.shape)} input {xt.shape}", "expected (N, C, ...)")
    return _group_norm(imp, x, xt.shape[1], w, b, eps)


def _conv_transpose(imp, x, w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    return _convolution(imp, x, w, b, stride, padding, dilation, True, output_padding, groups)


def _act(name, **fixed):
    def f(imp, x, *args, **kwargs):
        return imp.net.activation(imp.tensor(x), name, name=imp.op_name(), **fixed)
    return f


def _relu(imp, x):
    return imp.net.relu(imp.tensor(x), name=imp.op_name())


def _round(imp, x, decimals=0):
    """torch.round (halves to even); round(x, decimals=d) scales by 10^d, which the IR does not spell."""
    if decimals != 0:
        raise imp.fail(f"round with decimals={decimals}", "expected torch.round(x) (decimals 0)")
    return imp.net.activation(imp.tensor(x), "round", name=imp.op_name())


def _clip(imp, x, lo=None, hi=None):
    x = imp.tensor(x)
    if isinstance(lo, (Const, DataNode)) or isinstance(hi, (Const, DataNode)):
        # tensor bounds (clamp.Tensor): min(max(x, lo), hi), each broadcast
        name = imp.op_name()
        if lo is not None:
            x = imp.net.maximum(x, imp.operand(lo, x), name=name if hi is None else imp.unique(name + ".min"))
        if hi is not None:
            x = imp.net.minimum(x, imp.operand(hi, x), name=name)
        return x
    lo = -math.inf if lo is None else float(lo)
    hi = math.inf if hi is None else float(hi)
    if lo == 0.0 and math.copysign(1.0, lo) > 0 and hi == math.inf:    # clamp(min=-0.0) keeps -0.0: clip
        return imp.net.relu(x, name=imp.op_name())
    return imp.net.activation(x, "clip", name=imp.op_name(), min=lo, max=hi)


def _gelu(imp, x, approximate="none"):
    return imp.net.gelu(imp.tensor(x), approximate=approximate, name=imp.op_name())


def _leaky_relu(imp, x, negative_slope=0.01):
    return imp.net.activation(imp.tensor(x), "leaky_relu", name=imp.op_name(), negative_slope=float(negative_slope))


def _rrelu(imp, x, lower=1.0 / 8.0, upper=1.0 / 3.0, training=False, generator=None):
    """RReLU at inference: a leaky ReLU of slope (lower + upper) / 2, as PyTorch's eval mode; training mode draws
    a random slope per element (refused by name)."""
    if training:
        raise imp.fail("rrelu with training=True (a random slope per element)",
                       "expected the module in eval mode or F.rrelu(x, training=False)")
    y = _leaky_relu(imp, x, (float(lower) + float(upper)) / 2.0)
    if float(lower) != float(upper):
        imp.net.train_mode_updates[y.producer.name] = (f"RReLU(lower={float(lower)}, upper={float(upper)}): its "
                                                       f"training forward draws a random slope per element")
    return y


def _elu(imp, x, alpha=1.0, scale=1.0, input_scale=1.0):
    """aten.elu: ELU (scale 1, input_scale 1), SELU (torch's constants), CELU (input_scale 1 / alpha); with
    another scale, ELU then a multiply."""
    x = imp.tensor(x)
    alpha, scale, input_scale = float(alpha), float(scale), float(input_scale)
    if input_scale == 1 and math.isclose(alpha, _acts._SELU_ALPHA, rel_tol=1e-12) and \
            math.isclose(scale, _acts._SELU_SCALE, rel_tol=1e-12):
        return imp.net.activation(x, "selu", name=imp.op_name())
    if scale == 1 and alpha > 0 and math.isclose(input_scale * alpha, 1.0, rel_tol=1e-12) and input_scale != 1:
        return imp.net.activation(x, "celu", name=imp.op_name(), alpha=alpha)
    if input_scale != 1:
        raise imp.fail(f"elu with scale={scale}, input_scale={input_scale}",
                       "supported: ELU, SELU, CELU and ELU times a scale")
    if scale == 1:
        return imp.net.activation(x, "elu", name=imp.op_name(), alpha=alpha)
    y = imp.net.activation(x, "elu", name=imp.unique(imp.op_name_hint() + ".elu"), alpha=alpha)
    return imp.net.mul(y, scale, name=imp.op_name())


def _pow(imp, x, p):
    """x ** p for a number p (or a one-value constant tensor: GeM pooling's learned p): x * x, x * x * x,
    sqrt, rsqrt, 1 / x and x itself as those ops, any other p as activation(pow); a number to a tensor's power
    (pow.Scalar: 2 ** x, torch.pow(10.0, x)) as activation(base_pow)."""
    if isinstance(x, (int, float, Const)) and isinstance(p, DataNode):
        return _base_pow(imp, x, p)
    x = imp.tensor(x)
    if isinstance(p, Const):
        if p.tensor.numel() != 1:
            raise imp.fail(f"pow with an exponent tensor of shape {tuple(p.tensor.shape)}",
                           "expected a number or a one-value constant exponent")
        p = p.tensor.reshape(-1)[0].item()
    elif not isinstance(p, (int, float)):
        raise imp.fail("pow with a computed exponent", "expected a number or a one-value constant exponent")
    p = float(p)
    name = imp.op_name()
    if p == 1:
        return x
    if p in (2, 3):
        sq = imp.net.mul(x, x, name=name if p == 2 else imp.unique(imp.op_name_hint() + ".square"))
        return sq if p == 2 else imp.net.mul(sq, x, name=name)
    if p == -1:
        return imp.net.div(imp.operand(1.0, x), x, name=name)
    if p in (0.5, -0.5):
        return imp.net.activation(x, "sqrt" if p > 0 else "rsqrt", name=name)
    return imp.net.power(x, p, name=name)


def _base_pow(imp, c, x):
    """c ** x for a number (or one-value constant) c > 0: base_pow, libm's pow in float64; 1 ** x is 1 (NaN
    included, as PyTorch's); c <= 0 is refused by name."""
    if isinstance(c, Const):
        if c.tensor.numel() != 1:
            raise imp.fail(f"pow of a constant base tensor of shape {tuple(c.tensor.shape)}",
                           "expected a number or a one-value constant base")
        c = c.tensor.reshape(-1)[0].item()
    c = float(c)
    if not (math.isfinite(c) and c > 0):
        raise imp.fail(f"pow of the base {c} to a tensor's power", "expected a finite base > 0")
    return imp.net.activation(x, "base_pow", name=imp.op_name(), base=c)


def _log1p(imp, x):
    """log1p as ln(1 + x): exact but for 1 + x's rounding (an absolute error under 6e-8 near 0)."""
    x = imp.tensor(x)
    one = imp.net.add_op("add", [x, imp.operand(1.0, x)], {}, imp.unique(imp.op_name_hint() + ".plus1"))
    return imp.net.activation(one, "log", name=imp.op_name())


def _expm1(imp, x):
    """expm1 as e^x - 1 (an absolute error under 6e-8 near 0)."""
    x = imp.tensor(x)
    e = imp.net.activation(x, "exp", name=imp.unique(imp.op_name_hint() + ".exp"))
    return imp.net.sub(e, 1.0, name=imp.op_name())


def _var(imp, x, dims=None, *rest, correction=None, keepdim=False, unbiased=None, sqrt=False, with_mean=False):
    """var / std (.correction: (x, dims, *, correction, keepdim); .dim: (x, dims, unbiased, keepdim)) and
    var_mean: sum((x - mean)^2) / (n - correction) over dims, as mean, sub, mul, sum and a scale (sqrt for std)."""
    x = imp.tensor(x)
    if imp.node.target._overloadname == "dim" or rest:
        unbiased = rest[0] if rest else unbiased
        keepdim = rest[1] if len(rest) > 1 else keepdim
        correction = 1 if unbiased in (None, True) else 0
    correction = 1 if correction is None else float(correction)
    r = len(x.shape)
    dims = tuple(range(r)) if dims in (None, []) else tuple(int(d) % r for d in dims)
    n = int(np.prod([x.shape[d] for d in dims]))
    base = imp.op_name_hint()
    m = imp.net.mean(x, dims, keepdim=True, name=imp.unique(base + ".mean"))
    d = imp.net.sub(x, m, name=imp.unique(base + ".centered"))
    sq = imp.net.mul(d, d, name=imp.unique(base + ".square"))
    s = imp.net.sum(sq, dims, keepdim=bool(keepdim), name=imp.unique(base + ".sum"))
    # n - correction <= 0: torch's inf / nan (0 / 0); a multiply by inf keeps 0 * inf = nan
    f = 1.0 / (n - correction) if n - correction > 0 else math.inf
    v = imp.net.mul(s, f, name=imp.unique(base + ".var") if sqrt or with_mean else imp.op_name())
    if sqrt:
        v = imp.net.activation(v, "sqrt", name=imp.op_name())
    if with_mean:
        mean = m if keepdim else _reshape(imp, m, [s_ for i, s_ in enumerate(x.shape) if i not in dims] or [])
        return (v, mean)
    return v


def _cdist(imp, x1, x2, p=2.0, compute_mode=None):
    """aten._cdist_forward(x1, x2, p, compute_mode): x1 (.., P, M), x2 (.., R, M) -> (.., P, R), the batch axes
    broadcast; order 1, 2, inf: the norm over M of x1[.., :, None, :] - x2[.., None, :, :] (`Network.vector_norm`),
    as PyTorch's kernel computes it. (torch.cdist of order 2 with more than 25 rows on either side never reaches
    this op: PyTorch's Python computes sqrt(max(|a|^2 + |b|^2 - 2 a.b, 0)) with a matmul, which the export traces.)"""
    x1, x2 = imp.tensor(x1), imp.tensor(x2)
    p = float(p)
    if len(x1.shape) < 2 or len(x2.shape) < 2 or x1.shape[-1] != x2.shape[-1]:
        raise imp.fail(f"cdist of {x1.shape} and {x2.shape}", "expected (.., P, M) and (.., R, M)")
    if p not in (1.0, 2.0, math.inf):
        raise imp.fail(f"cdist of order {p}", "supported: p = 1, 2, inf")
    name = imp.op_name()
    (P, M), R = x1.shape[-2:], x2.shape[-2]
    a = _reshape(imp, x1, tuple(x1.shape[:-1]) + (1, M))                         # (.., P, 1, M)
    b = _reshape(imp, x2, tuple(x2.shape[:-2]) + (1, R, M))                      # (.., 1, R, M)
    d = imp.net.sub(a, b, name=imp.unique(name + ".diff"))                       # (.., P, R, M)
    return imp.net.vector_norm(d, p, (len(d.shape) - 1,), False, name=name)


def _vector_norm(imp, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """linalg_vector_norm (F.normalize's norm): Network.vector_norm (ord 1, 2, inf)."""
    x = imp.tensor(x)
    if dtype is not None:
        raise imp.fail(f"vector norm with dtype={dtype}")
    if float(ord) not in (1.0, 2.0, math.inf):
        raise imp.fail(f"vector norm of order {ord}", "supported: 1, 2, inf")
    r = len(x.shape)
    dims = tuple(range(r)) if dim in (None, []) else tuple(int(d) % r for d in ([dim] if isinstance(dim, int) else dim))
    return imp.net.vector_norm(x, ord, dims, bool(keepdim), name=imp.op_name())


def _log_softmax(imp, x, dim, *rest):
    return imp.net.log_softmax(imp.tensor(x), int(dim) % len(imp.tensor(x).shape), name=imp.op_name())


def _min(imp, x, *rest, **kw):
    """aten.min.dim ((values, indices): the indices refused where used) and aten.min.default (of every value)."""
    overload = imp.node.target._overloadname
    if overload == "dim":
        dim, keepdim = (list(rest) + [kw.get("dim"), kw.get("keepdim", False)][len(rest):])[:2]
        return (_amin(imp, x, [dim], keepdim), _dim_indices(imp, False, x, dim, keepdim))
    if overload == "default":
        return _amin(imp, x, None, False)
    if overload == "other":                 # torch.min(a, b): the element-wise minimum
        return _binary("minimum")(imp, x, *rest)
    raise imp.fail(f"aten.min.{overload}", "expected a min over dims (x.min(dim), torch.amin) or of two tensors")


def _amin(imp, x, dims=None, keepdim=False):
    x = imp.tensor(x)
    if not x.shape:
        return x
    dims = tuple(range(len(x.shape))) if dims in (None, []) else tuple(dims)
    return imp.net.min(x, dims, bool(keepdim), name=imp.op_name())


def _prelu(imp, x, w):
    x = imp.tensor(x)
    w = imp.weight(w, "slope")
    if int(np.prod(w.shape)) not in (1, x.shape[1] if len(x.shape) > 1 else -1):
        raise imp.fail(f"prelu with a slope of shape {w.shape} for input {x.shape}")
    name = imp.op_name()
    wd = imp.const_node(Const(w.tensor.reshape(-1), w.key, w.origin))
    return imp.net.add_op("prelu", [x, wd], {}, name)


def _divisor(imp, b, what: str) -> float:
    """The number a division-like op divides by: a number or a one-value constant; else refused by name."""
    if isinstance(b, Const) and b.tensor.numel() == 1 and b.tensor.dtype != torch.bool and \
            not b.tensor.dtype.is_complex:
        return float(b.tensor.reshape(-1)[0])
    if isinstance(b, (int, float)) and not isinstance(b, bool):
        return float(b)
    raise imp.fail(f"{what} by a {'computed tensor' if isinstance(b, DataNode) else 'constant tensor'}",
                   f"tilefuse computes {what} by a number (x % 2.0, torch.fmod(x, 1.5), x // 0.5)")


def _by_divisor(name: str):
    """fmod / remainder / floor_divide of x by a number: activation codes 39-41 (PyTorch's own arithmetic)."""
    what = {"fmod": "fmod", "remainder": "remainder (x % d)", "floor_divide": "floor division (x // d)"}[name]

    def f(imp, x, b):
        if not isinstance(x, DataNode):
            raise imp.fail(f"{what} of a number or constant by a computed tensor",
                           f"tilefuse computes {what} of a computed tensor by a number")
        return imp.net.activation(x, name, name=imp.op_name(), divisor=_divisor(imp, b, what))
    return f


def _trunc_div(imp, a, b):
    """div(rounding_mode='trunc'): trunc(a / b), as PyTorch computes it."""
    like = a if isinstance(a, DataNode) else b
    q = imp.net.add_op("div", [imp.operand(a, like), imp.operand(b, like)], {}, imp.unique(imp.op_name_hint() + ".div"))
    return imp.net.activation(q, "trunc", name=imp.op_name())


def _frac(imp, x):
    """frac(x) = x - trunc(x) (exact)."""
    x = imp.tensor(x)
    t = imp.net.activation(x, "trunc", name=imp.unique(imp.op_name_hint() + ".trunc"))
    return imp.net.sub(x, t, name=imp.op_name())


def _binary(kind):
    def f(imp, a, b, *, alpha=1, rounding_mode=None):
        if rounding_mode == "trunc" and kind == "div":
            return _trunc_div(imp, a, b)
        if rounding_mode == "floor" and kind == "div":
            return _by_divisor("floor_divide")(imp, a, b)
        if rounding_mode is not None:
            raise imp.fail(f"div with rounding_mode={rounding_mode!r}", "supported: None, 'trunc', 'floor'")
        like = a if isinstance(a, DataNode) else b
        if alpha != 1:
            if kind not in ("add", "sub"):
                raise imp.fail(f"{kind} with alpha={alpha}")
            b = imp.net.mul(imp.operand(b, like), float(alpha), name=imp.unique(imp.op_name_hint() + ".alpha"))
        name = imp.op_name()
        return imp.net.add_op(kind, [imp.operand(a, like), imp.operand(b, like)], {}, name)
    return f


def _rsub(imp, a, b, alpha=1):
    """rsub(a, b, alpha) = b - alpha * a."""
    like = a if isinstance(a, DataNode) else b
    if alpha != 1:
        a = imp.net.mul(imp.operand(a, like), float(alpha), name=imp.unique(imp.op_name_hint() + ".alpha"))
    return imp.net.add_op("sub", [imp.operand(b, like), imp.operand(a, like)], {}, imp.op_name())


def _reduce(kind):
    def f(imp, x, dims=None, keepdim=False, *, dtype=None):
        x = imp.tensor(x)
        if dtype is not None:
            raise imp.fail(f"{kind} with dtype={dtype}")
        if not x.shape:
            return x                # a reduce of a 0-d tensor: itself
        dims = tuple(range(len(x.shape))) if dims in (None, []) else tuple(dims)
        # over every axis without keepdim: a 0-d tensor (Network's reduce and a reshape to ())
        return getattr(imp.net, kind)(x, dims, bool(keepdim), name=imp.op_name())
    return f


def _max_dim(imp, x, dim, keepdim=False):
    """aten.max.dim: (values, indices): the max reduce and the argmax."""
    return (_reduce("max")(imp, x, [dim], keepdim), _dim_indices(imp, True, x, dim, keepdim))


def _sorted_slices(imp, x: DataNode, dim: int, nan_last: bool) -> list[DataNode]:
    """x's slices along dim in ascending order (`Network.sorted_slices`: NaN last, or min / max for the median)."""
    if x.shape[dim] > MAX_SORTED:
        raise imp.fail(f"{imp.target_name()} along an axis of {x.shape[dim]} values",
                       f"tilefuse orders up to {MAX_SORTED} values (a sorting network of where / min / max ops)")
    return imp.net.sorted_slices(x, dim, nan_last, name=imp.unique(imp.op_name_hint() + ".sort"))


def _picked(imp, parts: list[DataNode], dim: int, keepdim: bool) -> DataNode:
    """The slices concatenated along dim (or the one slice, dim dropped without keepdim)."""
    y = parts[0] if len(parts) == 1 else imp.net.concat(parts, axis=dim, name=imp.op_name())
    if len(parts) == 1 and not keepdim:
        shape = tuple(d for k, d in enumerate(y.shape) if k != dim)
        return imp.net.reshape(y, shape, name=imp.op_name())
    return y


def _order_stat(imp, x, dim, keepdim, pick, nan_last, what):
    x = imp.tensor(x)
    dim = int(dim) % max(len(x.shape), 1)
    v = _sorted_slices(imp, x, dim, nan_last)
    return (_picked(imp, [v[pick(len(v))]], dim, keepdim), _Unsupported(imp, f"the indices of {what}"))


def _median(imp, x, dim=None, keepdim=False):
    """median.dim (values, indices): the lower median ((n - 1) // 2 of the sorted values; NaN if any is NaN, as
    PyTorch's) by a min / max sorting network; median.default of the whole tensor (0-d); the indices are refused
    where read."""
    if dim is None:
        x = imp.tensor(x)
        flat = imp.net.reshape(x, (int(np.prod(x.shape)),), name=imp.unique(imp.op_name_hint() + ".flat"))
        return _order_stat(imp, flat, 0, False, lambda n: (n - 1) // 2, False, "median")[0]
    return _order_stat(imp, x, dim, keepdim, lambda n: (n - 1) // 2, False, "median")


def _kthvalue(imp, x, k, dim=-1, keepdim=False):
    """kthvalue (values, indices): the k-th smallest (NaN above every number, as PyTorch's sort)."""
    n = imp.tensor(x).shape[int(dim)]
    if not 1 <= int(k) <= n:
        raise imp.fail(f"kthvalue k={k} of {n} values")
    return _order_stat(imp, x, dim, keepdim, lambda n: int(k) - 1, True, "kthvalue")


def _sort(imp, x, *args, dim=-1, descending=False, stable=None):
    """sort / sort.stable (values, indices): the sorting network's slices concatenated (NaN last ascending, first
    descending, as PyTorch's); the indices are refused where read."""
    if args:    # sort.default(x, dim, descending) / sort.stable(x, *, stable, dim, descending)
        dim = args[0]
        descending = args[1] if len(args) > 1 else descending
    x = imp.tensor(x)
    dim = int(dim) % len(x.shape)
    v = _sorted_slices(imp, x, dim, True)
    return (_picked(imp, v[::-1] if descending else v, dim, True), _Unsupported(imp, "the indices of sort"))


def _topk(imp, x, k, dim=-1, largest=True, sorted=True):
    """topk (values, indices): the k largest (descending, NaN first) or smallest (ascending) of the sorted slices;
    the indices are refused where read."""
    x = imp.tensor(x)
    dim = int(dim) % len(x.shape)
    n, k = x.shape[dim], int(k)
    if not 0 < k <= n:
        raise imp.fail(f"topk k={k} of {n} values")
    v = _sorted_slices(imp, x, dim, True)
    parts = v[::-1][:k] if largest else v[:k]
    return (_picked(imp, parts, dim, True), _Unsupported(imp, "the indices of topk"))


def _dim_indices(imp, largest, x, dim, keepdim):
    """max.dim / min.dim's indices: the argmax where the graph reads them (`[1]`), else nothing (CBAM's
    `torch.max(x, 1)[0]` computes no argmax, and trains)."""
    if not any(u.target is operator.getitem and u.args[1] == 1 and u.users for u in imp.node.users):
        return None
    return _arg_extreme(largest)(imp, x, dim, keepdim)


def _arg_extreme(largest: bool):
    """aten.argmax / argmin along a dim (the first extreme; NaN is the extreme): the IR's argmax, an integer
    tensor (`_Importer.int_nodes`: moved, compared or converted to float, returned as int64)."""
    def f(imp, x, dim=None, keepdim=False):
        x = imp.tensor(x)
        what = "argmax" if largest else "argmin"
        if dim is None:         # the index into the flattened x: 0-d (keepdim: x's rank of ones)
            flat = imp.net.reshape(x, (int(np.prod(x.shape)),), name=imp.unique(imp.op_name_hint() + ".flat")) \
                if len(x.shape) != 1 else x
            y = imp.net.argmax(flat, 0, True, largest, name=imp.unique(imp.op_name_hint() + ".keepdim"))
            return imp.net.reshape(y, (1,) * len(x.shape) if keepdim else (), name=imp.op_name())
        return imp.net.argmax(x, int(dim), bool(keepdim), largest, name=imp.op_name())
    return f


def _max(imp, x, *rest, **kw):
    """aten.max.default (the maximum of every value), aten.max.dim, aten.max.other (element-wise, two tensors)."""
    overload = imp.node.target._overloadname
    if overload == "dim":
        return _max_dim(imp, x, *rest, **kw)
    if overload == "default":
        return _reduce("max")(imp, x, None, False)
    if overload == "other":
        return _binary("maximum")(imp, x, *rest)
    raise imp.fail(f"aten.max.{overload}", "expected a max over dims (x.max(dim), torch.amax) or of two tensors")


def _adaptive_max_pool(imp, x, output_size):
    """aten.adaptive_max_pool2d: to sizes that divide the input's (1x1 included) max_pool with the window the
    quotient, to any other the adaptive_max_pool op (PyTorch's overlapping windows); (values, indices), the
    indices refused where used."""
    x = imp.tensor(x)
    oh, ow = (int(s) for s in output_size)
    if len(x.shape) != 4:
        raise imp.fail(f"adaptive max pooling of {x.shape} to {(oh, ow)}", "expected (N, C, H, W)")
    h, w = x.shape[-2:]
    if h % oh or w % ow:
        y = imp.net.adaptive_max_pool(x, (oh, ow), name=imp.op_name())
    else:
        k = (h // oh, w // ow)
        y = imp.net.max_pool(x, k, k, (0, 0, 0, 0), name=imp.op_name())
    return (y, _Unsupported(imp, "the indices of adaptive max pooling (return_indices=True)"))


def _reshape(imp, x, shape):
    x = imp.tensor(x)
    shape = tuple(int(s) for s in shape)
    total = int(np.prod(x.shape))
    known = int(np.prod([s for s in shape if s != -1])) if shape else 1
    target = tuple(total // known if s == -1 else s for s in shape) if known else shape
    if target == x.shape:
        return x
    if len(target) == 2 and len(x.shape) > 2 and target[0] == x.shape[0]:
        return imp.net.flatten(x, 1, name=imp.op_name())      # x.view(x.size(0), -1), torch.flatten(x, 1)
    return imp.net.reshape(x, shape, name=imp.op_name())


def _squeeze(imp, x, dims=None):
    x = imp.tensor(x)
    r = len(x.shape)
    if dims is None:
        dims = [i for i, s in enumerate(x.shape) if s == 1]
    dims = {d % r for d in ([dims] if isinstance(dims, int) else dims)}
    return _reshape(imp, x, [s for i, s in enumerate(x.shape) if not (i in dims and s == 1)] or [])


def _unsqueeze(imp, x, dim):
    x = imp.tensor(x)
    shape = list(x.shape) if _fx_shape(imp.node.args[0]) != () else []    # a 0-d tensor's (1,): to (1,)
    shape.insert(dim % (len(shape) + 1), 1)
    return _reshape(imp, x, shape)


def _flatten_op(imp, x, start_dim=0, end_dim=-1):
    x = imp.tensor(x)
    r = len(x.shape)
    sd, ed = start_dim % r, end_dim % r
    shape = list(x.shape[:sd]) + [int(np.prod(x.shape[sd:ed + 1]))] + list(x.shape[ed + 1:])
    return _reshape(imp, x, shape)


def _tensor_unfold(imp, x, dim, size, step):
    """Tensor.unfold(dim, size, step): the n = (L - size) // step + 1 windows of `size` along dim, dim's extent
    becoming n and the window a new last axis (HaloNet's `kv.unfold(2, win, block)`, patchify's
    `x.unfold(2, p, p).unfold(3, p, p)`). step == size: a slice to n * size, a reshape (.., n, size, ..) and a
    permute moving the window axis last; else one strided slice per window element, concatenated on a new last
    axis. Exact (elements moved)."""
    x = imp.tensor(x)
    r = len(x.shape)
    d = int(dim) % r if r else 0
    length = x.shape[d] if r else 1
    size, step = int(size), int(step)
    if size < 0 or step < 1 or size > length:
        raise imp.fail(f"unfold(dim={dim}, size={size}, step={step}) of a tensor {x.shape}",
                       f"expected 0 <= size <= {length} (the extent of dim {d}) and step >= 1")
    if r == 0:
        return _reshape(imp, x, (1,))
    n = (length - size) // step + 1
    shape = tuple(x.shape)
    name = imp.op_name()
    if step == size and size > 0:
        if n * size != length:
            x = imp.net.slice(x, d, 0, n * size, 1, name=imp.unique(name + ".whole"))
        y = _reshape(imp, x, shape[:d] + (n, size) + shape[d + 1:])              # (.., n, size, ..)
        perm = tuple(i for i in range(r + 1) if i != d + 1) + (d + 1,)
        return imp.net.permute(y, perm, name=name) if perm != tuple(range(r + 1)) else y
    out = shape[:d] + (n,) + shape[d + 1:]
    parts = [_reshape(imp, imp.net.slice(x, d, j, j + step * (n - 1) + 1, step, name=imp.unique(f"{name}.{j}")),
                      out + (1,)) for j in range(size)]                           # window element j: (.., n, .., 1)
    if not parts:
        raise imp.fail(f"unfold of windows of size 0 (tensor {x.shape})", "expected size >= 1")
    return parts[0] if len(parts) == 1 else imp.net.concat(parts, axis=r, name=name)


def _permute(imp, x, dims):
    x = imp.tensor(x)
    perm = tuple(int(d) % len(x.shape) for d in dims)
    if not perm or perm == tuple(range(len(x.shape))):       # permute(()) of a 0-d tensor
        return x
    return imp.net.permute(x, perm, name=imp.op_name())


def _transpose(imp, x, d0, d1):
    x = imp.tensor(x)
    perm = list(range(len(x.shape)))
    perm[d0 % len(perm)], perm[d1 % len(perm)] = perm[d1 % len(perm)], perm[d0 % len(perm)]
    return _permute(imp, x, perm)


def _slice(imp, x, dim=0, start=None, end=None, step=1):
    x = imp.tensor(x)
    dim = dim % len(x.shape)
    size = x.shape[dim]
    start = 0 if start is None else int(start)
    end = size if end is None or end > size else int(end)
    s = slice(start, end, int(step)).indices(size)
    if s == (0, size, 1):
        return x
    return imp.net.slice(x, dim, s[0], s[1], s[2], name=imp.op_name())


def _flip(imp, x, dims):
    """torch.flip / x.flip(dims): one reversed slice (step -1) per dimension of size > 1."""
    x = imp.tensor(x)
    axes = [d for d in dict.fromkeys(int(d) % len(x.shape) for d in dims) if x.shape[d] > 1]
    if not axes:
        return x
    base = imp.op_name()
    for i, d in enumerate(axes):
        x = imp.net.slice(x, d, -1, None, -1, name=base if i == len(axes) - 1 else imp.unique(f"{base}.{i}"))
    return x


def _gather_dim(imp, x, dim, index, what):
    """x's entries at the constant integer indices `index` (a Const, any shape) along dim: one slice per run of
    evenly spaced indices, concatenated (frontend/gather.py), the dim then reshaped to the indices' shape."""
    x = imp.tensor(x)
    dim = dim % len(x.shape)
    if not isinstance(index, Const):
        raise imp.fail(f"{what} with computed indices", "expected constant integer indices (a list or a tensor "
                                                       "built from constants)")
    t = index.tensor
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise imp.fail(f"{what} with indices of dtype {t.dtype}", "expected integer indices")
    ids = t.reshape(-1).tolist()
    n = x.shape[dim]
    if not ids:
        raise imp.fail(f"{what} with no indices", "expected at least one index")
    bad = [i for i in ids if not -n <= i < n]
    if bad:
        raise imp.fail(f"{what} with indices {bad[:8]} out of range for dim {dim} of size {n}",
                       f"expected indices in [{-n}, {n})")
    runs = gather.index_runs([i % n for i in ids])
    if len(runs) > gather.MAX_RUNS:
        raise imp.fail(f"{what} whose indices form {len(runs)} runs",
                       f"tilefuse gathers up to {gather.MAX_RUNS} runs of evenly spaced indices (as slices)")
    base = imp.op_name()
    parts = [x if r == range(n) else imp.net.slice(x, dim, *gather.slice_args(r), name=imp.unique(f"{base}.{k}"))
             for k, r in enumerate(runs)]
    y = parts[0] if len(parts) == 1 else imp.net.concat(parts, axis=dim, name=imp.unique(f"{base}.cat"))
    # (..., len(ids), ...) -> (..., *index.shape, ...)
    return _reshape(imp, y, list(x.shape[:dim]) + list(t.shape) + list(x.shape[dim + 1:]))


def _take(imp, x, dim, index, negative=True, **grad):
    """x (a tensor or a constant table) at run-time indices along dim: the IR's take (an integer input's values);
    grad: nn.Embedding's padding_idx / scale_grad_by_freq (the Trainer's gradient)."""
    x = imp.const_node(x) if isinstance(x, Const) else imp.tensor(x)
    return imp.net.take(x, index, axis=int(dim), negative=negative, name=imp.op_name(), **grad)


def _index(imp, x, indices):
    """aten.index.Tensor, x[:, idx] and the like: one index tensor, every other dim whole (None); constant indices
    `_gather_dim`, an integer input's values (alphas[t]) the IR's take."""
    adv = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(adv) != 1:
        raise imp.fail(f"indexing with {len(adv)} index tensors", "expected one index tensor, every other dim "
                                                                   "taken whole (x[:, [2, 1, 0]])")
    if isinstance(adv[0][1], DataNode):
        return _take(imp, x, adv[0][0], adv[0][1])
    return _gather_dim(imp, imp.tensor(x), adv[0][0], adv[0][1], "indexing")


def _index_select(imp, x, dim, index):
    if isinstance(index, DataNode):
        return _take(imp, x, dim, index)
    return _gather_dim(imp, x, dim, index, "index_select")


def _embedding(imp, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """nn.Embedding / F.embedding at run-time indices (a class label input): rows of the table (padding_idx and
    scale_grad_by_freq change only the gradient: kept for the Trainer)."""
    if not isinstance(indices, DataNode):
        raise imp.fail("embedding at constant indices", "expected the indices to be an integer network input")
    pad = None if padding_idx is None or int(padding_idx) < 0 else int(padding_idx)     # aten's -1: none
    return _take(imp, weight, 0, indices, negative=False, padding_idx=pad,
                 scale_grad_by_freq=bool(scale_grad_by_freq))


def _gather(imp, x, dim, index, sparse_grad=False):
    """torch.gather of a 1-D tensor at run-time indices (diffusion code's `a.gather(-1, t)`): take; other ranks are
    refused."""
    shape = tuple(x.tensor.shape) if isinstance(x, Const) else tuple(imp.tensor(x).shape)
    if len(shape) != 1 or not isinstance(index, DataNode) or len(index.shape) != 1:
        raise imp.fail(f"gather along dim {dim} of a {len(shape)}-D tensor",
                       "tilefuse gathers a 1-D tensor at an integer input's values (a.gather(-1, t))")
    return _take(imp, x, 0, index, negative=False)


def _cumsum(imp, x, dim, *, dtype=None):
    """torch.cumsum: the IR's cumsum (float64 accumulation, as PyTorch's CPU cumsum of float32); a bool's
    (DETR's `not_mask.cumsum(1, dtype=torch.float32)`) as 1 / 0 (bool_arithmetic)."""
    x = imp.tensor(x)
    counts = _result_dtype(imp.node.args[0]) == torch.bool and dtype in _INT_DTYPES     # a bool's int64 count
    if dtype is not None and _DTYPES.get(dtype) != x.dtype and not counts:
        raise imp.fail(f"cumsum with dtype={dtype}", f"the network computes in {x.dtype}")
    return imp.net.cumsum(x, int(dim) % len(x.shape), name=imp.op_name())


def _narrow(imp, x, dim, start, length):
    return _slice(imp, x, dim, start, int(start) + int(length))


def _select(imp, x, dim, index):
    x = imp.tensor(x)
    dim = dim % len(x.shape)
    index = index % x.shape[dim]
    y = imp.net.slice(x, dim, index, index + 1, 1, name=imp.op_name())
    return _reshape(imp, y, [s for i, s in enumerate(x.shape) if i != dim] or [])


def _split_sizes(imp, x, sizes, dim=0):
    x = imp.tensor(x)
    dim = dim % len(x.shape)
    base = imp.op_name()
    out, start = [], 0
    for i, s in enumerate(sizes):
        s = int(s)
        if s == x.shape[dim]:
            out.append(x)
        else:
            out.append(imp.net.slice(x, dim, start, start + s, 1, name=imp.unique(f"{base}.{i}")))
        start += s
    return out


def _split(imp, x, split_size, dim=0):
    x = imp.tensor(x)
    if isinstance(split_size, (list, tuple)):
        return _split_sizes(imp, x, split_size, dim)
    size = x.shape[dim % len(x.shape)]
    return _split_sizes(imp, x, [min(split_size, size - i) for i in range(0, size, int(split_size))], dim)


def _chunk(imp, x, chunks, dim=0):
    x = imp.tensor(x)
    size = x.shape[dim % len(x.shape)]
    step = -(-size // int(chunks))
    return _split(imp, x, step, dim)


def _cat(imp, tensors, dim=0):
    xs = [imp.operand(t, next(v for v in tensors if isinstance(v, DataNode))) for t in tensors]
    if len(xs) == 1:
        return xs[0]
    return imp.net.concat(xs, axis=int(dim), name=imp.op_name())


def _torch_pads(imp, x, pad):
    """torch's pad list (last axis first: left, right, top, bottom, ...) -> IR pads per axis (a negative pad
    crops: Network.pad)."""
    pad = [int(p) for p in pad]
    r = len(x.shape)
    pads = [0] * (2 * r)
    for i in range(len(pad) // 2):
        axis = r - 1 - i
        pads[2 * axis], pads[2 * axis + 1] = pad[2 * i], pad[2 * i + 1]
    return pads


def _pad(imp, x, pad, mode="constant", value=None):
    x = imp.tensor(x)
    if mode not in ("constant", "reflect", "replicate", "circular"):
        raise imp.fail(f"pad mode {mode!r}", "supported: constant, reflect, replicate, circular")
    return imp.net.pad(x, _torch_pads(imp, x, pad), mode, 0.0 if value is None else float(value),
                       name=imp.op_name())


def _pad_mode(mode):
    def f(imp, x, pad, value=0.0):
        return _pad(imp, x, pad, mode, value if mode == "constant" else None)
    return f


def _resize(mode):
    """upsample_*2d.vec(x, output_size, [align_corners,] scale_factors) and
    .default(x, output_size, [align_corners,] scales_h, scales_w)."""
    def f(imp, x, output_size=None, *rest, **kw):
        x = imp.tensor(x)
        names = (["align_corners"] if mode in ("bilinear", "bicubic") else []) + \
            (["scale_factors"] if imp.node.target._overloadname == "vec" else ["scales_h", "scales_w"])
        a = dict(zip(names, rest))
        a.update(kw)
        if "scale_factors" in a:
            scales = a["scale_factors"]
        else:
            scales = None if a.get("scales_h") is None else (a["scales_h"], a.get("scales_w", a["scales_h"]))
        h, w = x.shape[2], x.shape[3]
        if output_size is None:
            if scales is None:
                raise imp.fail("upsampling without an output size or a scale")
            output_size = (int(math.floor(h * float(scales[0]))), int(math.floor(w * float(scales[1]))))
        size = (int(output_size[0]), int(output_size[1]))
        sc = None if scales is None else (float(scales[0]), float(scales[1]))
        if mode in ("bilinear", "bicubic"):
            p = dict(mode="linear" if mode == "bilinear" else "cubic",
                     coord="align_corners" if a.get("align_corners") else "half_pixel")
        elif mode == "nearest-exact":
            p = dict(mode="nearest", coord="half_pixel", nearest_mode="round_prefer_ceil")
        else:
            p = dict(mode="nearest", coord="asymmetric", nearest_mode="floor")
        return imp.net.add_op("resize", [x], dict(p, size=size, scales=sc), imp.op_name())
    return f


def _resize_aa(mode):
    """_upsample_{bilinear,bicubic}2d_aa (F.interpolate(..., antialias=True), torchvision's Resize of a tensor):
    separable, one matrix per resized axis, each PyTorch's own weights (its kernel applied to the identity: the
    filter widened by the scale when downsampling, normalized over the taps inside the image), applied as a
    matmul: x @ Ww^T along W, then Wh @ along H (PyTorch's order; an axis whose size stays is not resampled).
    .default(x, output_size, align_corners, scales_h, scales_w) and .vec(x, output_size, align_corners,
    scale_factors)."""
    def f(imp, x, output_size=None, align_corners=False, *rest, **kw):
        x = imp.tensor(x)
        if len(x.shape) != 4:
            raise imp.fail(f"antialiased {mode} resampling of a {len(x.shape)}-D tensor", "expected (N, C, H, W)")
        vec = imp.node.target._overloadname == "vec"
        names = ["scale_factors"] if vec else ["scales_h", "scales_w"]
        a = dict(zip(names, rest))
        a.update(kw)
        scales = a.get("scale_factors") if vec else (a.get("scales_h"), a.get("scales_w"))
        scales = (None, None) if scales is None else tuple(None if s is None else float(s) for s in scales)
        h, w = x.shape[2], x.shape[3]
        if output_size is None:
            if None in scales:
                raise imp.fail("antialiased resampling without an output size or a scale")
            output_size = (int(math.floor(h * scales[0])), int(math.floor(w * scales[1])))
        ho, wo = int(output_size[0]), int(output_size[1])
        if wo == 1 and ho not in (1, h):
            # PyTorch's antialiased kernel (2.13) repeats its first output row when the output is one column wide
            # and the height changes ((3, 1) -> (2, 1) of [1, 10, 100]: 4.375 twice, not 4.375, 66.25): refused
            # rather than computed otherwise than PyTorch
            raise imp.fail(f"antialiased {mode} resampling of {(h, w)} to {(ho, wo)} (one output column)",
                           "PyTorch repeats its first output row there; resize the height and the width in two "
                           "calls, or use antialias=False")
        op = getattr(torch.ops.aten, f"_upsample_{mode}2d_aa").default
        tdt = _torch_dtype(x.dtype)

        def weights(n_in, n_out, scale):        # (n_out, n_in): row i holds output i's weights
            basis = torch.eye(n_in, dtype=tdt).reshape(1, n_in, 1, n_in)
            return op(basis, [1, n_out], bool(align_corners), None, scale)[0, :, 0, :].T.contiguous().numpy()
        base, y = imp.op_name_hint(), x
        if wo != w:                               # (N, C, H, W) @ (W, Wo) -> (N, C, H, Wo)
            wt = imp.fixed(base + ".aa_w", np.ascontiguousarray(weights(w, wo, scales[1]).T))
            y = imp.net.matmul(y, wt, name=imp.op_name() if ho == h else imp.unique(base + ".aa_cols"))
        if ho != h:                               # (Ho, H) @ (N, C, H, Wo) -> (N, C, Ho, Wo)
            y = imp.net.matmul(imp.fixed(base + ".aa_h", weights(h, ho, scales[0])), y, name=imp.op_name())
        return y
    return f


def _adaptive_avg_pool(imp, x, output_size):
    from ..models._params import adaptive_avg_pool
    x = imp.tensor(x)
    return adaptive_avg_pool(imp.net, x, tuple(int(s) for s in output_size), name=imp.op_name())


def _max_pool(imp, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    x = imp.tensor(x)
    k = _pair(kernel_size)
    s = _pair(stride) if stride not in (None, [], ()) else k
    ph, pw = _pair(padding)
    y = imp.net.max_pool(x, k, s, (ph, ph, pw, pw), _pair(dilation), bool(ceil_mode), name=imp.op_name())
    return (y, _PoolIndices(imp, x, y, k, s, (ph, pw), _pair(dilation), bool(ceil_mode)))


def _max_unpool(imp, y, indices, output_size):
    """F.max_unpool2d / nn.MaxUnpool2d by the indices of a max_pool2d(return_indices=True) with non-overlapping
    windows (SegNet, ENet): Network.max_unpool, from the pooled input (no index tensor)."""
    y = imp.tensor(y)
    if not isinstance(indices, _PoolIndices):
        raise imp.fail(f"max_unpool2d by indices that are not max_pool2d's ({indices!r})",
                       "unpool by the indices of a max_pool2d(..., return_indices=True) in the same forward()")
    p = indices
    h, w = p.x.shape[2:]
    ho, wo = p.y.shape[2:]
    whole = all((n - k) % s == 0 for n, k, s in ((h, p.k[0], p.s[0]), (w, p.k[1], p.s[1])))
    if tuple(p.k) != tuple(p.s) or p.pad != (0, 0) or p.dilation != (1, 1) or (p.ceil_mode and not whole):
        raise imp.fail(f"max_unpool2d by the indices of max pooling with kernel {tuple(p.k)}, stride "
                       f"{tuple(p.s)}, padding {p.pad}, dilation {p.dilation}, ceil_mode={p.ceil_mode} (on "
                       f"{h}x{w})", "tilefuse unpools windows that do not overlap: stride = kernel_size, no "
                                    "padding, no dilation, no partial window (ceil_mode on a size that divides)")
    if tuple(y.shape) != tuple(p.y.shape):
        raise imp.fail(f"max_unpool2d of a {tuple(y.shape)} tensor by indices of shape {tuple(p.y.shape)}",
                       "unpool a tensor of the pooled shape")
    out = tuple(int(v) for v in output_size)[-2:] if output_size else (ho * p.k[0], wo * p.k[1])
    if out[1] != w or out[0] < ho * p.k[0]:
        # PyTorch reads an index as h * W + w of the pooled input (width W) in a row of the output's width
        raise imp.fail(f"max_unpool2d to {out[0]}x{out[1]} by the indices of a {h}x{w} input pooled to {ho}x{wo} "
                       f"(PyTorch places the values at other rows / columns than the input's there)",
                       f"pass output_size=x.size() of the pooled input x, or a height of at least {ho * p.k[0]} "
                       f"with width {w}")
    return imp.net.max_unpool(y, p.x, p.y, p.k, out, name=imp.op_name())


def _avg_pool(imp, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
              divisor_override=None):
    x = imp.tensor(x)
    k = _pair(kernel_size)
    s = _pair(stride) if stride not in (None, [], ()) else k
    ph, pw = _pair(padding)
    if divisor_override is not None:
        return _sum_pool(imp, x, k, s, (ph, pw), bool(ceil_mode), int(divisor_override))
    return imp.net.avg_pool(x, k, s, (ph, ph, pw, pw), bool(ceil_mode), bool(count_include_pad), name=imp.op_name())


def _sum_pool(imp, x, k, s, pad, ceil_mode, divisor):
    """avg_pool2d(divisor_override=d): each window's sum (padding counted as zeros) over d, as an average
    pooling of whole windows (x zero-padded by `pad` and, for ceil-mode windows past the end, by what they lack)
    times k_h * k_w / d."""
    def size(n, k, s, p):                     # PyTorch's pooling output size
        o = (-(-(n + 2 * p - k) // s) if ceil_mode else (n + 2 * p - k) // s) + 1
        return o - 1 if ceil_mode and (o - 1) * s >= n + p else o
    h, w = x.shape[2:]
    (kh, kw), (sh, sw), (ph, pw) = k, s, pad
    eh = max(0, (size(h, kh, sh, ph) - 1) * sh + kh - (h + 2 * ph))
    ew = max(0, (size(w, kw, sw, pw) - 1) * sw + kw - (w + 2 * pw))
    base = imp.op_name_hint()
    if ph or pw or eh or ew:
        x = imp.net.pad(x, (0, 0, 0, 0, ph, ph + eh, pw, pw + ew), name=imp.unique(base + ".zeros"))
    y = imp.net.avg_pool(x, k, s, 0, False, True, name=imp.unique(base + ".mean"))
    return imp.net.mul(y, kh * kw / divisor, name=imp.op_name())


class _Unsupported:
    """A value that raises if anything uses it (e.g. max pooling's indices)."""

    def __init__(self, imp, what):
        self.imp, self.what, self.where = imp, what, imp.where()

    def __repr__(self):
        return self.what


class _PoolIndices(_Unsupported):
    """The indices of max_pool2d(return_indices=True): refused by any op but max_unpool2d, which unpools from
    the pooled input x and output y (Network.max_unpool)."""

    def __init__(self, imp, x, y, k, s, pad, dilation, ceil_mode):
        super().__init__(imp, "the indices of max pooling (return_indices=True)")
        self.x, self.y, self.k, self.s, self.pad, self.dilation, self.ceil_mode = x, y, k, s, pad, dilation, ceil_mode


# the ATen ops that may read a bool tensor (a boolexpr expression: comparisons kept symbolic)
_BOOL_READERS = frozenset({"where", "_to_copy", "logical_not", "bitwise_not", "logical_and", "bitwise_and",
                           "__and__", "logical_or", "bitwise_or", "__or__", "clone", "alias", "detach",
                           "index_put", "scaled_dot_product_attention"})
# arithmetic on a bool tensor: _Importer.bool_arithmetic (the bool as 1 / 0)
_BOOL_ARITHMETIC = frozenset({"mul", "add", "sub", "rsub", "div", "sum", "cumsum"})


def _bool_constant(v) -> bool | None:
    """True / False for a number 1 / 0 or a bool (or a 0-d constant holding one), else None."""
    if isinstance(v, Const) and v.tensor.dim() == 0:
        v = v.tensor.item()
    if isinstance(v, (bool, int, float)) and v in (0, 1):
        return bool(v)
    return None


def _infinite(v) -> float | None:
    """+-inf for a number or 0-d constant that is one, else None."""
    if isinstance(v, Const) and v.tensor.dim() == 0 and v.tensor.dtype.is_floating_point:
        v = float(v.tensor)
    return v if isinstance(v, float) and np.isinf(v) else None


def _compare_infinite(imp, x, cmp, inf):
    """x cmp +-inf (logsumexp's and nan_to_num's decompositions compare with them): boolexpr.compare_infinite."""
    return boolexpr.compare_infinite(x, cmp, inf, lambda v: _where_operand(imp, v, x), imp.where())


def _compare(cmp):
    def f(imp, a, b):
        like = a if isinstance(a, DataNode) else b
        if isinstance(a, DataNode) and _infinite(b) is not None:
            return _compare_infinite(imp, a, cmp, _infinite(b))
        if isinstance(b, DataNode) and _infinite(a) is not None:
            return _compare_infinite(imp, b, boolexpr.MIRROR[cmp], _infinite(a))
        return boolexpr.Cmp(_where_operand(imp, a, like), cmp, _where_operand(imp, b, like), imp.where())
    return f


def _isnan(imp, x):
    return boolexpr.is_nan(imp.tensor(x), imp.where())


def _isinf(imp, x):
    return _compare_infinite(imp, _act("abs")(imp, x), "eq", float("inf"))


def _bool_arg(imp, e):
    if not isinstance(e, boolexpr.BOOL):
        raise imp.fail(f"{imp.target_name()} of a tensor that is not a comparison",
                       "tilefuse keeps bool tensors as comparisons of float tensors")
    return e


def _logical_not(imp, e):
    return boolexpr.Not(_bool_arg(imp, e))


def _logical(kind):
    def f(imp, a, b):
        return kind(_bool_arg(imp, a), _bool_arg(imp, b))
    return f


def _where(imp, c, a, b):
    """aten.where.self(condition, a, b): where ops (boolexpr.select); the condition a comparison expression or a
    constant bool mask (keep > 0.5); a, b tensors, constants or numbers (scalar_tensor's 0-d constants as one
    value)."""
    like = next((v for v in (a, b) if isinstance(v, DataNode)), None)
    if isinstance(c, Const) and c.tensor.dtype == torch.bool:     # a constant mask: keep > 0.5
        if like is None:
            raise imp.fail("torch.where of constants only")
        keep = Const(c.tensor.to(_torch_dtype(like.dtype)), c.key + ".keep")
        c = boolexpr.Cmp(_where_operand(imp, keep, like), "gt", _where_operand(imp, 0.5, like), imp.where())
    if not isinstance(c, boolexpr.BOOL):
        raise imp.fail("torch.where with a condition that is not a comparison or a constant mask",
                       "expected torch.where(x > t, a, b) and the like")
    like = like or boolexpr.leaf(c).l
    return boolexpr.select(imp.net, c, _where_operand(imp, a, like, True), _where_operand(imp, b, like, True),
                           imp.op_name())


class _Masked:
    """x[mask] for a bool mask over x's leading `rank` dims (a data-dependent shape): carried as the whole of x
    (`x`) and the mask, for element-wise ops and an index_put with the same mask (`_Importer.masked_elementwise`)."""

    def __init__(self, x: DataNode, mask, rank: int, origin: str):
        self.x, self.mask, self.rank, self.origin = x, mask, rank, origin

    def __repr__(self):
        return f"x[mask] (from {self.origin})"


class _MaskedSize:
    """The size of x[mask] (data-dependent): what export's own range checks compare; nothing else may read it."""

    def __repr__(self):
        return "the data-dependent size of x[mask]"


_SIZE_CHECKS = frozenset({operator.ge, operator.le, operator.gt, operator.lt, operator.eq, operator.ne})

# the ATen ops computed element-wise on x[mask] (`_Masked`)
_MASKED_ELEMENTWISE = frozenset({
    "add", "sub", "mul", "div", "rsub", "neg", "pow", "clamp", "clamp_min", "clamp_max", "relu", "sigmoid", "tanh",
    "exp", "log", "abs", "sqrt", "rsqrt", "sin", "cos", "hardtanh", "leaky_relu", "gelu", "silu", "maximum",
    "minimum", "floor", "ceil", "round", "trunc", "fmod", "remainder", "_to_copy", "clone", "alias", "detach",
    "reciprocal", "square", "elu", "hardswish", "hardsigmoid", "softplus", "mish", "log1p", "expm1", "sign",
    "lerp", "addcmul", "addcdiv", "where"})


def _masked_total(imp, kind, m):
    """x[mask].sum() / .mean(), 0-d: the sum of where(mask, x, 0); the mean divides by the count (the mask's 1 / 0
    summed, times the trailing size per selected row; 0 / 0 = NaN for an empty selection, as PyTorch)."""
    base = imp.op_name_hint()
    mask = _bool_trailing(imp, m.mask, m.rank, len(m.x.shape))
    axes = tuple(range(len(m.x.shape)))
    kept = boolexpr.select(imp.net, mask, m.x, 0.0, imp.unique(base + ".masked"))
    total = imp.net.sum(kept, axes, name=imp.op_name() if kind == "sum" else imp.unique(base + ".sum"))
    if kind == "sum":
        return total
    ones = boolexpr.select(imp.net, mask, 1.0, 0.0, imp.unique(base + ".mask"))
    count = imp.net.sum(ones, tuple(range(len(ones.shape))), name=imp.unique(base + ".count"))
    per_row = int(np.prod(m.x.shape[m.rank:]))
    if per_row != 1:
        count = imp.net.mul(count, float(per_row), name=imp.unique(base + ".elements"))
    return imp.net.div(total, count, name=imp.op_name())


def _mask_select(imp, x, indices):
    """x[mask] (aten.index with one bool mask over x's leading dims): a `_Masked`, for element-wise ops and an
    assignment with the same mask."""
    x = imp.tensor(x)
    mask = indices[0]
    mshape = _fx_shape(imp.node.args[1][0])
    if mshape is None or len(mshape) > len(x.shape) or tuple(x.shape[:len(mshape)]) != mshape:
        raise imp.fail(f"x[mask] with a mask of shape {mshape} for x of shape {x.shape}",
                       "expected a mask over x's leading dims")
    return _Masked(x, mask, len(mshape), imp.where())


def _same_bool(a, b) -> bool:
    """Two masks the same expression: the same comparisons of the same tensors (a constant by its value)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, Const):
        return a.tensor.shape == b.tensor.shape and bool((a.tensor == b.tensor).all())
    if isinstance(a, boolexpr.Not):
        return _same_bool(a.e, b.e)
    if isinstance(a, (boolexpr.And, boolexpr.Or)):
        return _same_bool(a.a, b.a) and _same_bool(a.b, b.b)

    def same(u, v):
        if u is v:
            return True
        return u.is_constant and v.is_constant and u.shape == v.shape and np.array_equal(u.value, v.value)
    return a.cmp == b.cmp and same(a.l, b.l) and same(a.r, b.r)


def _index_put(imp, x, indices, values, accumulate=False):
    """x[mask] = v (aten.index_put with one bool mask, a comparison or a constant, over x's leading dims): where(mask,
    v, x) (accumulate, x[mask] += v: where(mask, x + v, x)). v a number or a tensor of static shape that broadcasts
    to x's trailing dims (a 0-d x.mean() included); a value of x[mask]'s own data-dependent shape never reaches
    here (aten.index of a mask is refused)."""
    x = imp.const_node(x) if isinstance(x, Const) else imp.tensor(x)     # torch.zeros_like(x), then y[m] = ...
    if len(indices) != 1 or not isinstance(indices[0], (*boolexpr.BOOL, Const)):
        raise imp.fail("index_put (x[idx] = v) at computed or several indices",
                       "tilefuse assigns through one bool mask (x[x < 0] = 0, a comparison or a constant mask); "
                       "write torch.where(mask, v, x)")
    mask = indices[0]
    if isinstance(values, _Masked):         # y[m] = f(x[m]): f computed on the whole of x
        if not _same_bool(values.mask, mask):
            raise imp.fail("y[mask] = x[other_mask]", "expected the same mask on both sides (torch.where(...))")
        values = values.x
    if isinstance(mask, Const):
        if mask.tensor.dtype != torch.bool:
            raise imp.fail("index_put at constant integer indices", "expected a bool mask (x[mask] = v)")
        keep = Const(mask.tensor.to(_torch_dtype(x.dtype)), mask.key + ".keep")
        mask = boolexpr.Cmp(_where_operand(imp, keep, x), "gt", _where_operand(imp, 0.5, x), imp.where())
    mshape = _fx_shape(imp.node.args[1][0])
    if mshape is None or len(mshape) > len(x.shape) or tuple(x.shape[:len(mshape)]) != mshape:
        raise imp.fail(f"x[mask] = v with a mask of shape {mshape} for x of shape {x.shape}",
                       "expected a mask over x's leading dims (x[x < 0] = 0, x[keep] = 0 with keep of shape (N,))")
    mask = _bool_trailing(imp, mask, len(mshape), len(x.shape))
    if isinstance(values, Const) and values.tensor.dim() == 0:
        values = float(values.tensor)
    v = imp.operand(values, x)
    vshape = () if isinstance(values, DataNode) and values.shape == x.shape else \
        _fx_shape(imp.node.args[2]) if isinstance(imp.node.args[2], torch.fx.Node) else ()
    rest = tuple(x.shape[len(mshape):])
    try:
        np.broadcast_shapes(tuple(vshape or ()), (1,) + rest)
    except ValueError:
        raise imp.fail(f"x[mask] = v with v of shape {vshape} for x of shape {x.shape} and mask {mshape}",
                       f"expected v to broadcast to (1, *{rest}) (a number, x.mean(), a per-position tensor)") \
            from None
    if vshape and len(vshape) == len(rest) + 1:       # (1, *rest): drop the leading 1 (k, the masked count)
        v = imp.net.reshape(v, rest or (1,), name=imp.unique(imp.op_name_hint() + ".values"))
    if accumulate:
        v = imp.net.add(x, v, name=imp.unique(imp.op_name_hint() + ".accumulate"))
    return boolexpr.select(imp.net, mask, v, x, imp.op_name())


def _bool_trailing(imp, e, rank, to):
    """A bool expression of rank `rank` with `to - rank` trailing unit axes (a mask over leading dims, made to
    broadcast as index_put reads it)."""
    if rank == to:
        return e
    if isinstance(e, boolexpr.Not):
        return boolexpr.Not(_bool_trailing(imp, e.e, rank, to))
    if isinstance(e, (boolexpr.And, boolexpr.Or)):
        return type(e)(_bool_trailing(imp, e.a, rank, to), _bool_trailing(imp, e.b, rank, to))

    def grow(d):
        shape = (1,) * (rank - len(d.shape)) + tuple(d.shape) + (1,) * (to - rank)
        return imp.net.reshape(d, shape, name=imp.unique(f"{d.name}.mask"))
    return boolexpr.Cmp(grow(e.l), e.cmp, grow(e.r), e.origin)


def _where_operand(imp, v, like, value: bool = False):
    """A where / comparison operand as a DataNode: a 0-d constant (scalar_tensor) as one value; where's values
    (`value`) may be infinite or NaN (masked_fill(mask, -inf))."""
    if isinstance(v, Const) and v.tensor.dim() == 0:
        v = float(v.tensor)
    return imp.operand(v, like, value)


def _full_like(imp, x, fill_value, *, dtype=None, **_):
    """zeros_like / ones_like / full_like of a computed tensor: a constant of its shape (canonicalize cuts it to
    one value where a broadcasting op reads it)."""
    x = imp.tensor(x)
    if dtype is not None and _DTYPES.get(dtype) != x.dtype:
        raise imp.fail(f"full_like with dtype {dtype}", f"the network computes in {x.dtype}")
    return Const(torch.full(x.shape, float(fill_value), dtype=next(t for t, n in _DTYPES.items()
                                                                   if np.dtype(n) == x.dtype)),
                 imp.unique(imp.op_name_hint() + ".full"))


def _sign(imp, x):
    """sign(x) = 1 where x > 0, else -1 where x < 0, else x (0, -0 and NaN as they are): two where ops."""
    x = imp.tensor(x)
    base = imp.op_name_hint()
    neg = imp.net.where(x, "lt", 0.0, -1.0, x, name=imp.unique(base + ".neg"))
    return imp.net.where(x, "gt", 0.0, 1.0, neg, name=imp.op_name())


def _linear(imp, x, w, b=None):
    x = imp.tensor(x)
    if len(x.shape) == 1:                          # nn.Linear of a vector (K,): as (1, K), then (O,)
        y = _linear(imp, _reshape(imp, x, (1, x.shape[0])), w, b)
        return _reshape(imp, y, y.shape[1:])
    if isinstance(w, DataNode) or isinstance(b, DataNode):
        # a weight or bias the network computes (a hypernetwork's F.linear(x, w)): x @ w.T (+ b) as a matmul
        name = imp.op_name()
        if isinstance(w, DataNode):
            if len(w.shape) != 2:
                raise imp.fail(f"linear with a computed weight {w.shape}", "expected (out_features, in_features)")
            wt = imp.net.permute(w, (1, 0), name=imp.unique(name + ".wT"))                # (O, K) -> (K, O)
            y = imp.net.matmul(x, wt, name=name if b is None else imp.unique(name + ".mm"))
        else:
            y = imp.net.linear(x, imp.const_node(imp.weight(w, "weight")), None, name=imp.unique(name + ".mm"))
        return y if b is None else imp.net.add(y, imp.operand(b, y), name=name)
    wd = imp.const_node(imp.weight(w, "weight"))
    bd = imp.const_node(imp.weight(b, "bias")) if b is not None else None
    return imp.net.linear(x, wd, bd, name=imp.op_name())


def _addmm(imp, b, x, wt, beta=1, alpha=1):
    """addmm(bias, x, w.T): a linear layer whose weight arrives transposed."""
    if beta != 1 or alpha != 1:
        raise imp.fail(f"addmm with beta={beta}, alpha={alpha}")
    wt = imp.weight(wt, "matrix operand")
    key = wt.key[: -len(".permute")] if wt.key.endswith(".permute") else f"{wt.key}.T"
    t = wt.tensor.t().contiguous()
    root = gather = None
    if wt.root is not None and wt.origin == "parameter":
        # a parameter's elements transposed (Dynamic conv's `torch.mm(attention, self.weight.view(K, -1))`): the
        # Trainer trains that parameter (a gather of it), not the transposed tensor under a name of its own
        g = _gather_of_parameter(torch.ops.aten.t.default, (wt,), {}, wt, tuple(t.shape))
        if g is not None:
            root = wt.root
            if tuple(t.shape) != tuple(root[1]) or not np.array_equal(g[0].reshape(-1), np.arange(t.numel())):
                gather = g
    return _linear(imp, x, Const(t, key, wt.origin, root, gather), b)


def _mm(imp, x, wt):
    """mm(x, w.T) (a linear layer) when the right operand is a constant; of a computed right operand (or a
    constant left one): matmul."""
    if isinstance(wt, DataNode) or not isinstance(x, DataNode):
        return _matmul(imp, x, wt)
    return _addmm(imp, None, x, wt)


def _sdpa(imp, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    """F.scaled_dot_product_attention at inference: softmax(q @ k^T * scale + bias) @ v, scale 1 / sqrt(E) unless
    given (two matmuls, a mul, a softmax over the last axis). A float attn_mask is added (timm's Swin: the relative
    position bias plus the shift mask); a bool one (a comparison or a constant) and is_causal keep the scores where
    True and put -inf elsewhere (a where op); a row a constant mask masks entirely is 0, as PyTorch's safe softmax
    makes it. dropout and enable_gqa are refused by name."""
    if dropout_p or enable_gqa or (is_causal and attn_mask is not None):
        raise imp.fail("scaled_dot_product_attention with " + ", ".join(
            w for w, on in (("is_causal=True and an attn_mask", is_causal and attn_mask is not None),
                            (f"dropout_p={dropout_p}", dropout_p), ("enable_gqa=True", enable_gqa)) if on),
            "supported: a float or bool attn_mask or is_causal, no dropout (eval)")
    q, k, v = imp.tensor(q), imp.tensor(k), imp.tensor(v)
    base = imp.op_name_hint()
    r = len(k.shape)
    kt = imp.net.permute(k, tuple(range(r - 2)) + (r - 1, r - 2), name=imp.unique(base + ".k_t"))
    s = imp.net.matmul(q, kt, name=imp.unique(base + ".scores"))
    s = imp.net.mul(s, float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1]),
                    name=imp.unique(base + ".scaled"))
    dead = None           # (..., L, 1) bool: rows a constant mask masks entirely
    safe = attn_mask is not None and not isinstance(attn_mask, Const)   # a computed mask may mask a whole row
    if is_causal:
        attn_mask = Const(torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(), imp.unique(base + ".causal"))
    if isinstance(attn_mask, Const) and attn_mask.tensor.dtype == torch.bool:
        keep = attn_mask.tensor
        dead = ~keep.any(-1, keepdim=True)
        attn_mask = boolexpr.Cmp(imp.const_node(Const(keep.to(_torch_dtype(s.dtype)), attn_mask.key + ".keep")),
                                 "gt", imp.operand(0.5, s), imp.where())
    if isinstance(attn_mask, boolexpr.BOOL):
        s = boolexpr.select(imp.net, attn_mask, s, imp.operand(-math.inf, s, nonfinite=True),
                            imp.unique(base + ".masked"))
    elif attn_mask is not None:
        s = imp.net.add(s, imp.operand(attn_mask, s), name=imp.unique(base + ".biased"))
    p = imp.net.softmax(s, axis=len(s.shape) - 1, name=imp.unique(base + ".softmax"))
    if safe:              # PyTorch's safe softmax: a row whose scores are all -inf is 0 (not 0 / 0)
        top = _reduce("max")(imp, s, [len(s.shape) - 1], True)
        p = imp.net.where(top, "lt", -float(np.finfo(s.dtype).max), 0.0, p, name=imp.unique(base + ".safe"))
    if dead is not None and bool(dead.any()):
        live = imp.const_node(Const((~dead).to(_torch_dtype(s.dtype)), imp.unique(base + ".live")))
        p = imp.net.where(live, "gt", 0.5, p, 0.0, name=imp.unique(base + ".safe"))
    return imp.net.matmul(p, v, name=imp.op_name())


def _torch_dtype(dt):
    """The torch dtype of a numpy float dtype (the importer's _DTYPES backwards)."""
    return next(t for t, n in _DTYPES.items() if np.dtype(n) == np.dtype(dt))


def _matmul(imp, a, b):
    """aten.bmm, aten.mm / matmul of computed tensors: a @ b (attention's q @ k^T, attn @ v)."""
    like = a if isinstance(a, DataNode) else b
    return imp.net.matmul(imp.operand(a, like), imp.operand(b, like), name=imp.op_name())


def _layer_norm(imp, x, normalized_shape, w=None, b=None, eps=1e-5, *rest):
    x = imp.tensor(x)
    k = len(normalized_shape)
    axis = len(x.shape) - k
    shape = tuple(int(s) for s in normalized_shape)
    name = imp.op_name()
    g = imp.const_node(imp.weight(w, "weight")) if w is not None else \
        imp.fixed(f"{name}.unit_weight", np.ones(shape, imp.dtype))
    bb = imp.const_node(imp.weight(b, "bias")) if b is not None else \
        imp.fixed(f"{name}.zero_bias", np.zeros(shape, imp.dtype))
    y = imp.net.add_op("layer_norm", [x, g, bb], {"axis": axis, "eps": float(eps)}, name)
    return (y, None, None)


def _layer_norm_single(imp, *a, **k):
    return _layer_norm(imp, *a, **k)[0]


def _softmax(imp, x, dim, *rest):
    return imp.net.softmax(imp.tensor(x), axis=int(dim), name=imp.op_name())


def _identity(imp, x, *a, **k):
    return x


def _dropout(imp, x, p=0.5, train=False):
    """aten.dropout / feature_dropout (nn.Dropout, Dropout1d / Dropout2d) of an eval-mode export: a dropout op
    (the identity at inference, compiled away; the Trainer's mask per element or per (sample, channel)); p = 0:
    nothing. Alpha dropout's training forward (SELU's) is none the Trainer has: the network records it
    (`Network.train_mode_updates`) and the Trainer refuses it naming the op."""
    if train:
        raise imp.fail("dropout with train=True", "import inference graphs (eval mode)")
    x = imp.tensor(x)
    if not float(p):
        return x
    kind = imp.node.target._opname
    name = imp.op_name()
    if "alpha" in kind:
        imp.net.train_mode_updates[name] = (f"{kind}(p={float(p)}): its training forward (alpha dropout) is none "
                                            f"the trainer has")
        return x
    return imp.net.dropout(x, float(p), name=name, mode="channel" if kind.startswith("feature") else "element")


def _drop_path(imp, x, p, mode):
    """tilefuse::drop_path (`_leaf_ops`: torchvision's StochasticDepth, timm's DropPath with p > 0): a dropout op
    with one draw per sample ('row') or for the batch ('batch')."""
    stack = list((imp.node.meta.get("nn_module_stack") or {}).values())
    name = imp.unique(stack[-1][0] if stack and stack[-1][0] else "drop_path")       # the module's path
    return imp.net.dropout(imp.tensor(x), float(p), name=name, mode="batch" if mode == "batch" else "sample")


def _to_copy(imp, x, *, dtype=None, **k):
    if isinstance(x, boolexpr.BOOL):    # mask.float(): 1 where it holds, else 0
        if dtype == torch.bool:
            return x
        if _DTYPES.get(dtype) != imp.dtype:
            raise imp.fail(f"a comparison's bool tensor converted to {dtype}", f"expected {imp.dtype} (.float())")
        return boolexpr.select(imp.net, x, 1.0, 0.0, imp.op_name())
    x = imp.tensor(x)
    if dtype is not None and _DTYPES.get(dtype) != x.dtype:
        raise imp.fail(f"a dtype conversion to {dtype}", f"the network computes in {x.dtype}")
    return x


def _lrn(imp, x, size, alpha, beta, k):
    return imp.net.local_response_norm(imp.tensor(x), int(size), float(alpha), float(beta), float(k),
                                       name=imp.op_name())


MAX_REPEATS = 64     # copies along an axis of size > 1 (a concat of them), as the ONNX importer's Tile


def _copy(imp, dst, src, non_blocking=False):
    """aten.copy (functionalized `x[:, 0] = v` / `copy_`): src's values in dst's shape (broadcast)."""
    shape = tuple(imp.tensor(dst, "destination").shape) if isinstance(dst, DataNode) else tuple(dst.tensor.shape)
    s = imp.const_node(src) if isinstance(src, Const) else imp.tensor(src, "source")
    return s if tuple(s.shape) == shape else _expand(imp, s, list(shape))


def _slice_scatter(imp, x, src, dim=0, start=None, end=None, step=1):
    """aten.slice_scatter (functionalized `y[:, :c] = f(x[:, :c])`, FasterNet's partial conv, `y[..., 1:3] = 0.5`,
    `y[:, :, ::2] = v`): x with src in place of x[start:end:step] along dim (`Network.slice_scatter`)."""
    x = imp.const_node(x) if isinstance(x, Const) else imp.tensor(x)
    src = imp.const_node(src) if isinstance(src, Const) else imp.tensor(src, "source")
    dim = int(dim) % len(x.shape)
    start, end, step = slice(start, end, int(step)).indices(x.shape[dim])
    want = x.shape[:dim] + (len(range(start, end, step)),) + x.shape[dim + 1:]
    if tuple(src.shape) != tuple(want):
        raise imp.fail(f"slice_scatter of a {tuple(src.shape)} source into x[{start}:{end}:{step}] along dim {dim} "
                       f"of {tuple(x.shape)}", f"expected a source of shape {want}")
    return imp.net.slice_scatter(x, src, dim, start, end, step, name=imp.op_name())


_GRID_MODES = {0: "bilinear", 1: "nearest", 2: "bicubic"}
_GRID_PADDINGS = {0: "zeros", 1: "border", 2: "reflection"}


def _grid_sampler(imp, x, grid, interpolation_mode, padding_mode, align_corners):
    """F.grid_sample (aten.grid_sampler / grid_sampler_2d with the enums' integers) of 4-D tensors: bilinear,
    nearest, bicubic."""
    x, g = imp.tensor(x), imp.const_node(grid) if isinstance(grid, Const) else imp.tensor(grid, "grid")
    mode = _GRID_MODES.get(int(interpolation_mode), str(interpolation_mode))
    if mode not in ("bilinear", "nearest", "bicubic") or len(x.shape) != 4:
        raise imp.fail(f"grid_sample mode={mode!r} of a {len(x.shape)}-D input",
                       "supported: 4-D (N, C, H, W) inputs, mode 'bilinear', 'nearest' or 'bicubic'")
    return imp.net.grid_sample(x, g, mode, _GRID_PADDINGS[int(padding_mode)], bool(align_corners),
                               name=imp.op_name())


def _affine_grid_generator(imp, theta, size, align_corners):
    """F.affine_grid of a computed theta (N, 2, 3) for a 4-D size (`Network.affine_grid`: ATen's base grid times
    theta transposed); a constant theta folds. Kept from decomposition: ATen's decomposition of a one-pixel axis
    writes a tensor literal that PyTorch's own run_decompositions rejects."""
    theta = imp.tensor(theta, "theta")
    if len(size) != 4:
        raise imp.fail(f"affine_grid of size {list(size)}", "a 4-D (N, C, H, W) size (2-D grids)")
    return imp.net.affine_grid(theta, [int(v) for v in size], bool(align_corners), name=imp.op_name())


def _im2col(imp, x, kernel_size, dilation, padding, stride):
    """F.unfold (aten.im2col) of (N, C, H, W): `Network.unfold` (pad, strided slices, concat, reshape: exact).
    Kept from decomposition (which writes it as an advanced index)."""
    x = imp.tensor(x)
    if len(x.shape) != 4:
        raise imp.fail(f"unfold of {x.shape}", "a 4-D (N, C, H, W) input")
    return imp.net.unfold(x, kernel_size, dilation, padding, stride, name=imp.op_name())


def _col2im(imp, x, output_size, kernel_size, dilation, padding, stride):
    """F.fold (aten.col2im) of (N, C kh kw, L): `Network.fold` (PyTorch's sums in its order: bitwise). Kept from
    decomposition (which writes it as an index_put)."""
    x = imp.tensor(x)
    if len(x.shape) != 3:
        raise imp.fail(f"fold of {x.shape}", "a 3-D (N, C kh kw, L) input")
    return imp.net.fold(x, output_size, kernel_size, dilation, padding, stride, name=imp.op_name())


def _repeat(imp, x, repeats):
    """x.repeat(*sizes) / torch.tile (a grey image to three channels: `x.repeat(1, 3, 1, 1)`): along an axis of size
    1 a broadcast (`_expand`: x * ones), along a larger one the copies concatenated, as ONNX's Tile."""
    x = imp.tensor(x)
    reps = [int(r) for r in repeats]
    if len(reps) < len(x.shape) or min(reps) < 1:
        raise imp.fail(f"repeat {reps} of a {x.shape} tensor", f"at least {len(x.shape)} repeats, each >= 1")
    shape = (1,) * (len(reps) - len(x.shape)) + tuple(x.shape)
    y = _reshape(imp, x, shape)                                           # new leading axes of size 1
    y = _expand(imp, y, [s * r if s == 1 else s for s, r in zip(shape, reps)])
    for ax, (s, r) in enumerate(zip(shape, reps)):
        if s > 1 and r > 1:
            if r > MAX_REPEATS:
                raise imp.fail(f"repeat {reps} of a {x.shape} tensor ({r} copies of axis {ax})",
                               f"up to {MAX_REPEATS} copies of an axis larger than 1 (as a concat)")
            y = imp.net.concat([y] * r, axis=ax, name=imp.op_name())
    return y


def _expand(imp, x, size, *, implicit=False):
    x = imp.tensor(x)
    size = tuple(x.shape[i - (len(size) - len(x.shape))] if s == -1 else int(s) for i, s in enumerate(size))
    if size == x.shape:
        return x
    # materialize the broadcast: x * ones, the ones only over the expanded axes (canonicalize drops the product
    # where its consumers broadcast anyway)
    xs = (1,) * (len(size) - len(x.shape)) + tuple(x.shape)
    ones = np.ones([s if d == 1 else 1 for d, s in zip(xs, size)], imp.dtype)
    ones = imp.fixed(f"{imp.op_name_hint()}.ones", ones)
    return imp.net.mul(x, ones, name=imp.op_name())


_ATEN = {
    "convolution": _convolution,
    "conv2d": _conv2d_padding,
    "_native_batch_norm_legit_no_training": _batch_norm,
    "_native_batch_norm_legit": _batch_norm_training,
    "batch_norm": _batch_norm_aten,
    "conv_transpose2d": _conv_transpose,
    "native_batch_norm": _batch_norm_training,
    "relu": _relu,
    "relu6": lambda imp, x: _clip(imp, x, 0.0, 6.0),
    "hardtanh": lambda imp, x, lo=-1.0, hi=1.0: _clip(imp, x, lo, hi),
    "clamp": _clip,
    "clamp_min": lambda imp, x, lo: _clip(imp, x, lo, None),
    "clamp_max": lambda imp, x, hi: _clip(imp, x, None, hi),
    "sigmoid": _act("sigmoid"),
    "tanh": _act("tanh"),
    "silu": _act("silu"),
    "mish": _act("mish"),
    "softplus": lambda imp, x, beta=1.0, threshold=20.0: imp.net.activation(
        imp.tensor(x), "softplus", name=imp.op_name(), beta=float(beta), threshold=float(threshold)),
    "hardswish": _act("hardswish"),
    "hardsigmoid": _act("hardsigmoid"),
    "gelu": _gelu,
    "leaky_relu": _leaky_relu,
    "rrelu": _rrelu,
    "elu": _elu,
    "celu": lambda imp, x, alpha=1.0: imp.net.activation(imp.tensor(x), "celu", name=imp.op_name(),
                                                         alpha=float(alpha)),
    "selu": _act("selu"),
    "log_sigmoid": _act("log_sigmoid"),
    "log_sigmoid_forward": lambda imp, x: (_act("log_sigmoid")(imp, x), None),
    "abs": _act("abs"),
    "erf": _act("erf"),
    "floor": _act("floor"),
    "trunc": _act("trunc"),
    "fix": _act("trunc"),
    "frac": _frac,
    "fmod": _by_divisor("fmod"),
    "remainder": _by_divisor("remainder"),
    "floor_divide": _by_divisor("floor_divide"),
    "ceil": _act("ceil"),
    "round": _round,
    "sin": _act("sin"),
    "cos": _act("cos"),
    "tan": _act("tan"),
    "asin": _act("asin"),
    "acos": _act("acos"),
    "atan": _act("atan"),
    "sinh": _act("sinh"),
    "cosh": _act("cosh"),
    "asinh": _act("asinh"),
    "acosh": _act("acosh"),
    "atanh": _act("atanh"),
    "exp": _act("exp"),
    "log": _act("log"),
    "log2": _act("log2"),
    "log10": _act("log10"),
    "exp2": lambda imp, x: imp.net.activation(imp.tensor(x), "base_pow", name=imp.op_name(), base=2.0),
    "erfc": _act("erfc"),
    "sqrt": _act("sqrt"),
    "rsqrt": _act("rsqrt"),
    "log1p": _log1p,
    "expm1": _expm1,
    "neg": lambda imp, x: imp.net.mul(imp.tensor(x), -1.0, name=imp.op_name()),
    "reciprocal": lambda imp, x: imp.net.div(imp.operand(1.0, imp.tensor(x)), imp.tensor(x), name=imp.op_name()),
    "square": lambda imp, x: _pow(imp, x, 2),
    "pow": _pow,
    "var": _var,
    "std": lambda imp, *a, **k: _var(imp, *a, sqrt=True, **k),
    "var_mean": lambda imp, *a, **k: _var(imp, *a, with_mean=True, **k),
    "linalg_vector_norm": _vector_norm,
    "_log_softmax": _log_softmax,
    "log_softmax": _log_softmax,
    "prelu": _prelu,
    "_prelu_kernel": _prelu,
    "add": _binary("add"),
    "sub": _binary("sub"),
    "mul": _binary("mul"),
    "div": _binary("div"),
    "rsub": _rsub,
    "mean": _reduce("mean"),
    "sum": _reduce("sum"),
    "amax": _reduce("max"),
    "argmax": _arg_extreme(True),
    "argmin": _arg_extreme(False),
    "maximum": _binary("maximum"),
    "atan2": _binary("atan2"),
    "arctan2": _binary("atan2"),
    "gt": _compare("gt"),
    "ge": _compare("ge"),
    "lt": _compare("lt"),
    "le": _compare("le"),
    "eq": _compare("eq"),
    "ne": _compare("ne"),
    "where": _where,
    "index_put": _index_put,
    "isnan": _isnan,
    "isinf": _isinf,
    "logical_not": _logical_not,
    "bitwise_not": _logical_not,
    "logical_and": _logical(boolexpr.And),
    "bitwise_and": _logical(boolexpr.And),
    "__and__": _logical(boolexpr.And),
    "logical_or": _logical(boolexpr.Or),
    "bitwise_or": _logical(boolexpr.Or),
    "__or__": _logical(boolexpr.Or),
    "sign": _sign,
    "full_like": _full_like,
    "minimum": _binary("minimum"),
    "amin": _amin,
    "min": _min,
    "max": _max,
    "median": _median,
    "kthvalue": _kthvalue,
    "sort": _sort,
    "topk": _topk,
    "adaptive_max_pool2d": _adaptive_max_pool,
    "view": _reshape,
    "_unsafe_view": _reshape,
    "reshape": _reshape,
    "squeeze": _squeeze,
    "unsqueeze": _unsqueeze,
    "flatten": _flatten_op,
    "permute": _permute,
    "_cdist_forward": _cdist,
    "unfold": _tensor_unfold,
    "transpose": _transpose,
    "t": lambda imp, x: _transpose(imp, x, 0, 1),
    "slice": _slice,
    "narrow": _narrow,
    "flip": _flip,
    "cumsum": _cumsum,
    "index": _index,
    "index_select": _index_select,
    "embedding": _embedding,
    "gather": _gather,
    "select": _select,
    "split": _split,
    "split_with_sizes": _split_sizes,
    "chunk": _chunk,
    "cat": _cat,
    "pad": _pad,
    "constant_pad_nd": _pad_mode("constant"),
    "reflection_pad2d": _pad_mode("reflect"),
    "replication_pad2d": _pad_mode("replicate"),
    "upsample_nearest2d": _resize("nearest"),
    "_upsample_nearest_exact2d": _resize("nearest-exact"),
    "upsample_bilinear2d": _resize("bilinear"),
    "upsample_bicubic2d": _resize("bicubic"),
    "_upsample_bilinear2d_aa": _resize_aa("bilinear"),
    "_upsample_bicubic2d_aa": _resize_aa("bicubic"),
    "adaptive_avg_pool2d": _adaptive_avg_pool,
    "_adaptive_avg_pool2d": _adaptive_avg_pool,
    "max_pool2d_with_indices": _max_pool,
    "max_pool2d": lambda imp, *a, **k: _max_pool(imp, *a, **k)[0],
    "max_unpool2d": _max_unpool,
    "avg_pool2d": _avg_pool,
    "linear": _linear,
    "addmm": _addmm,
    "mm": _mm,
    "bmm": _matmul,
    "scaled_dot_product_attention": _sdpa,
    "matmul": _matmul,
    "group_norm": _group_norm,
    "native_group_norm": _native_group_norm,
    "instance_norm": _instance_norm,
    "native_layer_norm": _layer_norm,
    "layer_norm": _layer_norm_single,
    "_softmax": _softmax,
    "softmax": _softmax,
    "clone": _identity,
    "alias": _identity,
    "contiguous": _identity,
    "detach": _identity,
    "lift_fresh_copy": _identity,
    "_to_copy": _to_copy,
    "dropout": _dropout,
    "drop_path": _drop_path,
    "feature_dropout": _dropout,
    "alpha_dropout": _dropout,
    "feature_alpha_dropout": _dropout,
    "expand": _expand,
    "repeat": _repeat,
    "grid_sampler": _grid_sampler,
    "affine_grid_generator": _affine_grid_generator,
    "im2col": _im2col,
    "col2im": _col2im,
    "copy": _copy,
    "slice_scatter": _slice_scatter,
    "grid_sampler_2d": _grid_sampler,
    "local_response_norm": _lrn,
    "channel_shuffle": lambda imp, x, groups: imp.net.channel_shuffle(imp.tensor(x), int(groups), name=imp.op_name()),
    "native_channel_shuffle": lambda imp, x, groups: imp.net.channel_shuffle(imp.tensor(x), int(groups),
                                                                             name=imp.op_name()),
}
