"""PyTorch import: `from_torch(module, example_input) -> Network` through torch.fx.

The module is traced with `torch.fx.symbolic_trace` (in eval mode; its mode is restored after),
and every fx node is translated to the op vocabulary:

  placeholder            -> net.input (shape and dtype from example_input)
  call_module            -> one of _MODULES (nn.Conv2d, nn.BatchNorm2d, ...)
  call_function          -> one of _FUNCTIONS (operator.add, torch.flatten, torch.cat, F.relu, ...)
  call_method            -> one of _METHODS (x.relu(), x.view(n, -1), x.size(0), ...)
  output                 -> net.output (a tuple / list of tensors gives several outputs)

Anything else raises UnsupportedOpError naming the op and the fx node, with the supported list:
nothing is ever skipped silently. Constants are named after the module's state_dict keys
("layer1.0.conv1.weight"); ops after the module path ("layer1.0.conv1"; a module called again
gets "_1", "_2"; a function called inside a module gets "<module path>.<function>", e.g.
"layer1.0.add"), so importing a torchvision ResNet gives the names tilefuse.models uses.

torch is imported here only; the rest of tilefuse does not need it.
"""
from __future__ import annotations

import operator
import re
from typing import Any, Callable

import numpy as np

from ..errors import GraphError, UnsupportedOpError
from ..ir import DataNode, Network
from ..models._params import adaptive_avg_pool

try:  # torch is a test / import-time dependency, not a runtime one
    import torch
    import torch.fx
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - exercised only without torch
    torch = None

_DTYPES = {}
if torch is not None:
    _DTYPES = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16}


def from_torch(module, example_input, name: str | None = None) -> Network:
    """Import a torch.nn.Module as a tilefuse Network (inference semantics).

    example_input: a tensor or a tuple/list of tensors, one per forward() argument; only their
    shapes and dtypes are used. Raises UnsupportedOpError for any op outside the supported set.
    """
    if torch is None:
        raise ImportError("tilefuse.from_torch needs torch (pip install torch)")
    if not isinstance(module, nn.Module):
        raise TypeError(f"from_torch expects a torch.nn.Module, got {type(module).__name__}")
    examples = (example_input,) if isinstance(example_input, torch.Tensor) else tuple(example_input)
    for i, t in enumerate(examples):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"example_input[{i}] is {type(t).__name__}; expected a torch.Tensor")
    was_training = module.training
    module.eval()
    try:
        try:
            gm = torch.fx.symbolic_trace(module)
        except Exception as e:
            raise UnsupportedOpError(
                f"torch.fx could not trace {type(module).__name__}: {type(e).__name__}: {e}; "
                f"expected a forward() without data-dependent control flow") from e
        return _Importer(gm, name or type(module).__name__).run(examples)
    finally:
        module.train(was_training)


# ----------------------------------------------------------------------------- importer

class _Importer:
    def __init__(self, gm, name: str):
        self.gm = gm
        self.net = Network(name)
        self.modules = dict(gm.named_modules())
        self.env: dict[Any, Any] = {}           # fx node -> DataNode | python value
        self.used: set[str] = set()             # every name we gave to the network
        self.consts: dict[str, DataNode] = {}   # state_dict key -> constant node (shared reuse)
        self.node = None                        # fx node being translated (for errors)
        self.path = ""                          # module path of the call_module being translated

    # ------------------------------------------------------------ helpers

    def fail(self, what: str, hint: str = "") -> UnsupportedOpError:
        n = self.node
        where = f"fx node '{n.name}'" if n is not None else "module"
        return UnsupportedOpError(f"{where}: {what} is not supported by tilefuse.from_torch"
                                  + (f"; {hint}" if hint else ""))

    def unique(self, base: str) -> str:
        name, i = base, 0
        while name in self.used:
            i += 1
            name = f"{base}_{i}"
        self.used.add(name)
        return name

    def op_name(self) -> str:
        """Module path for call_module ('layer1.0.conv1'); '<scope>.<fn>' for functions."""
        n = self.node
        if n.op == "call_module":
            return self.unique(str(n.target))
        # fx already named the node after the function ('add', 'flatten_1'): drop its counter
        base = n.target if isinstance(n.target, str) else re.sub(r"_\d+$", "", n.name)
        base = base.strip("_") or n.name
        stack = n.meta.get("nn_module_stack") or {}
        scope = list(stack.values())[-1][0] if stack else ""
        return self.unique(f"{scope}.{base}" if scope else base)

    def const(self, key: str, value, dtype) -> DataNode:
        """A constant named by its state_dict key, created once and shared by every use."""
        arr = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        dt = np.dtype(dtype)
        d = self.consts.get(key)
        if d is not None and d.dtype == dt:
            return d
        name = self.unique(key if d is None else f"{key}.{dt}")
        d = self.net.constant(name, arr.astype(dt), dtype=dt)
        self.consts[key] = d
        return d

    def tensor(self, v, what: str = "input") -> DataNode:
        if isinstance(v, DataNode):
            return v
        raise self.fail(f"{what} of type {type(v).__name__} (a constant or non-tensor operand)",
                        "expected a tensor computed from the network inputs")

    def load(self, a):
        """Replace fx nodes inside args by their translated values."""
        return torch.fx.node.map_arg(a, lambda n: self.env[n])

    # ------------------------------------------------------------ driver

    def run(self, examples) -> Network:
        graph = self.gm.graph
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(examples):
            raise GraphError(self.net.name, f"forward() takes {len(placeholders)} tensor inputs "
                                            f"({', '.join(p.name for p in placeholders)}), "
                                            f"expected one example tensor each; got {len(examples)}")
        ex = iter(examples)
        for n in graph.nodes:
            self.node = n
            if n.op == "placeholder":
                t = next(ex)
                if t.dtype not in _DTYPES:
                    raise GraphError(n.name, f"example input has dtype {t.dtype}; expected one of "
                                             f"{', '.join(str(d) for d in _DTYPES)}")
                self.env[n] = self.net.input(self.unique(n.name), tuple(t.shape), _DTYPES[t.dtype])
            elif n.op == "call_module":
                m = self.modules[n.target]
                self.path = str(n.target)
                fn = _MODULES.get(type(m))  # exact class: a subclass may change forward()
                if fn is None:
                    raise self.fail(f"module {type(m).__module__}.{type(m).__name__} ('{n.target}')",
                                    "supported modules: " + ", ".join(c.__name__ for c in _MODULES))
                self.env[n] = fn(self, m, *self.load(n.args), **self.load(n.kwargs))
            elif n.op == "call_function":
                fn = _FUNCTIONS.get(n.target)
                if fn is None:
                    raise self.fail(f"function {_fn_name(n.target)}",
                                    "supported functions: " + ", ".join(sorted({_fn_name(f) for f in _FUNCTIONS})))
                self.env[n] = fn(self, *self.load(n.args), **self.load(n.kwargs))
            elif n.op == "call_method":
                fn = _METHODS.get(n.target)
                if fn is None:
                    raise self.fail(f"tensor method .{n.target}()",
                                    "supported methods: " + ", ".join(f".{k}()" for k in sorted(_METHODS)))
                self.env[n] = fn(self, *self.load(n.args), **self.load(n.kwargs))
            elif n.op == "get_attr":
                raise self.fail(f"direct parameter/buffer access '{n.target}'",
                                "use the tensor inside a supported module (e.g. nn.Conv2d) instead")
            elif n.op == "output":
                self.outputs(self.load(n.args[0]))
            else:  # pragma: no cover - fx has no other node kinds
                raise self.fail(f"fx node kind '{n.op}'")
        self.node = None
        return self.net

    def outputs(self, result) -> None:
        flat: list = []

        def walk(v):
            if isinstance(v, (tuple, list)):
                for u in v:
                    walk(u)
            elif isinstance(v, dict):
                for u in v.values():
                    walk(u)
            else:
                flat.append(v)

        walk(result)
        if not flat:
            raise GraphError(self.net.name, "forward() returns no tensor; expected at least one")
        for v in flat:
            d = self.tensor(v, "network output")
            if d.producer is None or any(d is o for o in self.net.outputs):
                # an input returned as is, or the same tensor returned twice: copy it
                d = self.net.dropout(d, 0.0, name=self.unique(f"{d.name}.copy"))
            self.net.output(d)


def _fn_name(f) -> str:
    name = getattr(f, "__name__", repr(f))
    for mod, prefix in ((operator, "operator"), (torch, "torch"), (F, "torch.nn.functional")):
        if getattr(mod, name, None) is f:
            return f"{prefix}.{name}"
    mod = getattr(f, "__module__", None) or ""
    return f"{mod}.{name}" if mod else name


def _arg(args, kwargs, i: int, key: str, default=None):
    if len(args) > i:
        return args[i]
    return kwargs.get(key, default)


# ----------------------------------------------------------------------------- shared lowering

def _conv(imp: _Importer, m, x):
    x = imp.tensor(x)
    if m.padding_mode != "zeros":
        raise imp.fail(f"nn.Conv2d with padding_mode='{m.padding_mode}'", "supported: padding_mode='zeros'")
    kh, kw = m.kernel_size
    dh, dw = m.dilation
    if isinstance(m.padding, str):
        if m.padding == "valid":
            pad = (0, 0, 0, 0)
        else:  # 'same' (stride 1): torch puts the odd extra padding at the bottom / right
            th, tw = dh * (kh - 1), dw * (kw - 1)
            pad = (th // 2, th - th // 2, tw // 2, tw - tw // 2)
    else:
        ph, pw = m.padding
        pad = (ph, ph, pw, pw)
    name = imp.op_name()
    w = imp.const(f"{imp.path}.weight", m.weight, x.dtype)
    b = imp.const(f"{imp.path}.bias", m.bias, x.dtype) if m.bias is not None else None
    return imp.net.conv2d(x, w, b, stride=m.stride, padding=pad, dilation=m.dilation,
                          groups=m.groups, name=name)


def _batch_norm(imp: _Importer, m, x):
    x = imp.tensor(x)
    if m.running_mean is None or m.running_var is None:
        raise imp.fail(f"{type(m).__name__} with track_running_stats=False",
                       "inference import needs running_mean / running_var")
    p = imp.path
    c = m.num_features
    if m.affine:
        gamma, beta = imp.const(f"{p}.weight", m.weight, x.dtype), imp.const(f"{p}.bias", m.bias, x.dtype)
    else:
        gamma = imp.const(f"{p}.unit_weight", np.ones(c), x.dtype)
        beta = imp.const(f"{p}.zero_bias", np.zeros(c), x.dtype)
    mean = imp.const(f"{p}.running_mean", m.running_mean, x.dtype)
    var = imp.const(f"{p}.running_var", m.running_var, x.dtype)
    return imp.net.batch_norm(x, gamma, beta, mean, var, eps=float(m.eps), name=imp.op_name())


def _relu(imp: _Importer, x, *a, **k):
    return imp.net.relu(imp.tensor(x), name=imp.op_name())


def _pool_padding(p):
    ph, pw = (p, p) if isinstance(p, int) else tuple(p)
    return (ph, ph, pw, pw)


def _max_pool(imp, x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
              return_indices=False):
    if return_indices:
        raise imp.fail("max pooling with return_indices=True")
    stride = stride if stride not in (None, [], ()) else kernel_size
    return imp.net.max_pool(imp.tensor(x), kernel_size, stride, _pool_padding(padding), dilation,
                            ceil_mode, name=imp.op_name())


def _avg_pool(imp, x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
              divisor_override=None):
    if divisor_override is not None:
        raise imp.fail(f"average pooling with divisor_override={divisor_override}")
    stride = stride if stride not in (None, [], ()) else kernel_size
    return imp.net.avg_pool(imp.tensor(x), kernel_size, stride, _pool_padding(padding), ceil_mode,
                            count_include_pad, name=imp.op_name())


def _adaptive_avg_pool(imp, x, output_size):
    x = imp.tensor(x)
    if isinstance(output_size, int) or output_size is None:
        output_size = (output_size, output_size)
    name = imp.op_name()
    try:
        return adaptive_avg_pool(imp.net, x, tuple(output_size), name=name, error=GraphError)
    except GraphError as e:
        raise imp.fail(f"AdaptiveAvgPool2d from {x.shape[2]}x{x.shape[3]} to "
                       f"{tuple(output_size)}", "supported: output 1x1, output equal to the input, "
                       "or an input that is an integer multiple of the output") from e


def _flatten(imp, x, start_dim=0, end_dim=-1):
    x = imp.tensor(x)
    r = len(x.shape)
    sd, ed = start_dim % r, end_dim % r
    if ed != r - 1:
        raise imp.fail(f"flatten with end_dim={end_dim} (of rank {r})", "supported: end_dim=-1")
    if sd == ed:
        return x
    if sd == 0:
        raise imp.fail("flatten with start_dim=0 (flattening the batch dimension)",
                       "supported: start_dim >= 1")
    return imp.net.flatten(x, sd, name=imp.op_name())


def _reshape(imp, x, *shape):
    """x.view(n, -1) / reshape: supported when it is a flatten of the trailing dims."""
    x = imp.tensor(x)
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    if not all(isinstance(s, (int, np.integer)) for s in shape):
        raise imp.fail(f"reshape to {shape} with non-constant sizes")
    total = int(np.prod(x.shape))
    known = int(np.prod([s for s in shape if s != -1])) if shape else 1
    target = tuple(total // known if s == -1 else int(s) for s in shape)
    if target == x.shape:
        return x
    for sd in range(1, len(x.shape)):
        if target == tuple(x.shape[:sd]) + (int(np.prod(x.shape[sd:])),):
            return imp.net.flatten(x, sd, name=imp.op_name())
    raise imp.fail(f"reshape/view from {x.shape} to {target}",
                   "supported: flattening the trailing dimensions, e.g. x.view(x.size(0), -1)")


def _add(imp, a, b, *, alpha=1, out=None):
    if alpha != 1 or out is not None:
        raise imp.fail(f"add with alpha={alpha}" if alpha != 1 else "add with out=")
    if not (isinstance(a, DataNode) and isinstance(b, DataNode)):
        raise imp.fail(f"add of a tensor and a {type(b if isinstance(a, DataNode) else a).__name__}",
                       "supported: the sum of two tensors of the same shape")
    return imp.net.add(a, b, name=imp.op_name())


def _cat(imp, tensors, dim=0, *, axis=None, out=None):
    if out is not None:
        raise imp.fail("cat with out=")
    dim = axis if axis is not None else dim
    xs = [imp.tensor(t, "cat operand") for t in tensors]
    return imp.net.concat(xs, axis=dim, name=imp.op_name())


def _softmax(imp, x, dim=None, _stacklevel=3, dtype=None):
    if dim is None:
        raise imp.fail("softmax without dim", "pass dim explicitly")
    if dtype is not None:
        raise imp.fail(f"softmax with dtype={dtype}")
    return imp.net.softmax(imp.tensor(x), axis=int(dim), name=imp.op_name())


def _dropout(imp, x, p=0.5, training=False, inplace=False):
    if training:
        raise imp.fail("dropout with training=True", "import inference graphs (training=False)")
    return imp.net.dropout(imp.tensor(x), float(p), name=imp.op_name())


def _lrn(imp, x, size, alpha=1e-4, beta=0.75, k=1.0):
    return imp.net.local_response_norm(imp.tensor(x), int(size), float(alpha), float(beta), float(k),
                                       name=imp.op_name())


def _linear(imp, x, w_key, w, b_key, b):
    x = imp.tensor(x)
    wd = imp.const(w_key, w, x.dtype)
    bd = imp.const(b_key, b, x.dtype) if b is not None else None
    return imp.net.linear(x, wd, bd, name=imp.op_name())


def _size(imp, x, dim=None):
    x = imp.tensor(x)
    return tuple(x.shape) if dim is None else x.shape[dim]


def _getattr(imp, obj, attr):
    if isinstance(obj, DataNode) and attr == "shape":
        return tuple(obj.shape)
    raise imp.fail(f"attribute access .{attr}", "supported: x.shape")


def _getitem(imp, obj, idx):
    if isinstance(obj, (tuple, list)):
        return obj[idx]
    raise imp.fail(f"indexing a {type(obj).__name__}",
                   "supported: indexing tuples such as x.shape or a tuple of tensors")


# ----------------------------------------------------------------------------- dispatch tables

def _module_table():
    def conv(imp, m, x):
        return _conv(imp, m, x)

    def identity(imp, m, x, *a, **k):
        return x

    def flatten(imp, m, x):
        return _flatten(imp, x, m.start_dim, m.end_dim)

    def softmax(imp, m, x):
        return _softmax(imp, x, m.dim)

    def linear(imp, m, x):
        return _linear(imp, x, f"{imp.path}.weight", m.weight, f"{imp.path}.bias", m.bias)

    return {
        nn.Conv2d: conv,
        nn.BatchNorm2d: _batch_norm,
        nn.ReLU: lambda imp, m, x: _relu(imp, x),
        nn.MaxPool2d: lambda imp, m, x: _max_pool(imp, x, m.kernel_size, m.stride, m.padding,
                                                  m.dilation, m.ceil_mode, m.return_indices),
        nn.AvgPool2d: lambda imp, m, x: _avg_pool(imp, x, m.kernel_size, m.stride, m.padding,
                                                  m.ceil_mode, m.count_include_pad, m.divisor_override),
        nn.AdaptiveAvgPool2d: lambda imp, m, x: _adaptive_avg_pool(imp, x, m.output_size),
        nn.Linear: linear,
        nn.Flatten: flatten,
        nn.Dropout: lambda imp, m, x: _dropout(imp, x, m.p),
        nn.Dropout2d: lambda imp, m, x: _dropout(imp, x, m.p),
        nn.LocalResponseNorm: lambda imp, m, x: _lrn(imp, x, m.size, m.alpha, m.beta, m.k),
        nn.Softmax: softmax,
        nn.Identity: identity,
    }


def _function_table():
    t: dict[Callable, Callable] = {
        operator.add: lambda imp, a, b: _add(imp, a, b),
        operator.iadd: lambda imp, a, b: _add(imp, a, b),
        torch.add: _add,
        torch.relu: _relu,
        torch.relu_: _relu,
        F.relu: lambda imp, x, inplace=False: _relu(imp, x),
        F.relu_: _relu,
        torch.flatten: _flatten,
        torch.cat: _cat,
        torch.concat: _cat,
        torch.concatenate: _cat,
        F.softmax: _softmax,
        torch.softmax: _softmax,
        F.dropout: _dropout,
        F.max_pool2d: _max_pool,
        F.avg_pool2d: _avg_pool,
        F.adaptive_avg_pool2d: _adaptive_avg_pool,
        F.local_response_norm: _lrn,
        torch.reshape: lambda imp, x, shape: _reshape(imp, x, shape),
        getattr: _getattr,
        operator.getitem: _getitem,
    }
    return t


_METHOD_TABLE = {
    "relu": _relu,
    "relu_": _relu,
    "add": _add,
    "add_": _add,
    "flatten": lambda imp, x, start_dim=0, end_dim=-1: _flatten(imp, x, start_dim, end_dim),
    "view": _reshape,
    "reshape": _reshape,
    "size": _size,
    "softmax": lambda imp, x, dim=None, dtype=None: _softmax(imp, x, dim, dtype=dtype),
    "contiguous": lambda imp, x, *a, **k: imp.tensor(x),
}

_MODULES: dict = {}
_FUNCTIONS: dict = {}
_METHODS: dict = _METHOD_TABLE
if torch is not None:
    _MODULES = _module_table()
    _FUNCTIONS = _function_table()
