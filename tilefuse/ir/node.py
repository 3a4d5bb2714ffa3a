"""Graph nodes: DataNode (a tensor) and OpNode (an operation), as QingLong's DtNode/OpNode.

A DataNode with a bound constant is a constant; without one it is a variable (a network input,
output or hidden intermediate).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..errors import GraphError

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16))


def as_dtype(dtype, where: str) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise GraphError(where, f"dtype {dtype!r} is not a numpy dtype") from e
    if dt not in SUPPORTED_DTYPES:
        raise GraphError(where, f"dtype {dt} is not supported; expected one of "
                                f"{', '.join(str(d) for d in SUPPORTED_DTYPES)}")
    return dt


MAX_DIM = 1 << 31            # any tensor dimension (compiler/validate.py checks packages against it too)


def as_shape(shape, where: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in shape)
    except (TypeError, ValueError) as e:
        raise GraphError(where, f"shape {shape!r} is not a sequence of integers") from e
    if any(d <= 0 for d in dims) or any(int(d) != d for d in shape):
        raise GraphError(where, f"shape {shape!r} must have positive integer dimensions")
    if any(d > MAX_DIM for d in dims):
        raise GraphError(where, f"shape {shape!r} has a dimension over {MAX_DIM} (2^31); expected each "
                                f"dimension <= 2^31 (a package stores no larger one)")
    return dims


def rounded_product(w: np.ndarray, p: np.ndarray, dt) -> np.ndarray | None:
    """p, the float64 product of the constant w and a factor folded into it (Gemm's alpha, a batch norm's
    gamma / std, a per-channel Mul), rounded to dt; None where the fold would lose a value of w that dt holds:
    a nonzero product under dt's smallest normal (it would round to a subnormal or zero: 1.4e-45 x 0.59 rounds
    to 1.4e-45, 70% off) or a finite product over dt's range. The caller keeps the factor as an op of
    its own then, applied after the sums as the peers apply it."""
    fi = np.finfo(dt)
    with np.errstate(over="ignore", invalid="ignore"):
        q = p.astype(dt)
        normal = np.abs(w) >= fi.tiny
        small = (p != 0) & (np.abs(p) < fi.tiny)
        over = np.isfinite(p) & ~np.isfinite(q)
    return None if np.any(normal & (small | over)) else q


def integer_dtype(dtype, where: str) -> np.dtype:
    """The integer dtype an input may be given as (`Network.input(..., integer=)`): int8 .. int64, uint8 .. uint64."""
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise GraphError(where, f"integer dtype {dtype!r} is not a numpy dtype") from e
    if dt.kind not in "iu":
        raise GraphError(where, f"integer dtype {dt}; expected a numpy integer dtype (int64, int32, ...)")
    return dt


def integer_results(values: list, names, ints: dict, where: str) -> list:
    """The outputs named in `ints` (output name -> integer dtype: `Network.integer_outputs`, a package's
    meta["integer_outputs"]) converted to that dtype, the rest as they are. Each value must be an integer in the
    dtype's range (an argmax's index is); RuntimeError naming the output, the position and the value otherwise."""
    if not ints:
        return values
    out = []
    for y, name in zip(values, names):
        dt = ints.get(name)
        if dt is None:
            out.append(y)
            continue
        with np.errstate(invalid="ignore"):
            yi = np.asarray(y).astype(np.dtype(dt))
            bad = yi != y
        if bad.any():
            pos = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), bad.shape))
            raise RuntimeError(f"{where}: output '{name}' is declared {np.dtype(dt)}, but holds "
                               f"{np.asarray(y)[pos].item()!r} at {pos}; expected integers (an index op's output)")
        out.append(yi)
    return out


def exact_integers(dt) -> int:
    """The largest integer magnitude up to which every integer is exact in the float dtype dt (2^24 for float32)."""
    return 1 << (np.finfo(dt).nmant + 1)


def check_inputs(specs, inputs, where: str) -> list[np.ndarray]:
    """The one input validator (the reference evaluator, Session.run, the trainer): `inputs` is
    one array, a sequence in input order or a {name: array} mapping; `specs` are the expected
    (name, shape, dtype) or (name, shape, dtype, integer dtype) in order. Each array must have its shape; a
    float of another precision is converted; integers are converted where the spec names an integer dtype (an
    input the model declares as integer: a diffusion model's timesteps) and every value is exact in the float
    dtype (|v| <= 2^24 for float32), refused elsewhere, as bools and the rest are; floats for such an input must
    hold integers: GraphError naming the input with what was found and what was expected."""
    specs = [(s[0], tuple(s[1]), np.dtype(s[2]), np.dtype(s[3]) if len(s) > 3 and s[3] is not None else None)
             for s in specs]
    names = [s[0] for s in specs]
    if isinstance(inputs, np.ndarray) or np.isscalar(inputs):
        inputs = [inputs]
    if isinstance(inputs, Mapping):
        missing = [n for n in names if n not in inputs]
        extra = sorted(set(inputs) - set(names))
        if missing or extra:
            raise GraphError(where, f"inputs given for {sorted(inputs)}; expected exactly {names}")
        inputs = [inputs[n] for n in names]
    inputs = list(inputs)
    if len(inputs) != len(specs):
        raise GraphError(where, f"got {len(inputs)} inputs, expected {len(specs)} ({', '.join(names)})")
    out = []
    for (name, shape, dt, integer), a in zip(specs, inputs):
        a = np.asarray(a)
        if a.shape != shape:
            raise GraphError(name, f"input has shape {a.shape}, expected {shape}")
        if a.dtype != dt:
            if integer is not None and a.dtype.kind in "iu":
                lim = exact_integers(dt)
                big = np.abs(a.astype(np.float64)) > lim if a.size else np.zeros(0, bool)
                if big.any():
                    v = a.reshape(-1)[int(np.argmax(big.reshape(-1)))]
                    raise GraphError(name, f"input has the value {v}; the model takes it as {integer}, which "
                                           f"tilefuse computes in {dt}: expected integers within +-{lim} (exact in "
                                           f"{dt})")
            elif a.dtype.kind != "f" or dt.kind != "f":
                want = f"{dt} or an integer dtype ({integer} in the model)" if integer is not None else str(dt)
                raise GraphError(name, f"input has dtype {a.dtype}, expected {want} (the network does not take "
                                       f"{a.dtype}; convert it first if that is meant)")
            a = a.astype(dt)
        elif integer is not None and a.size:
            # floats for an input the model declares integer: accepted where every value is an integer
            with np.errstate(invalid="ignore"):
                frac = ~(np.isfinite(a) & (a == np.round(a)))
            if frac.any():
                pos = tuple(int(i) for i in np.unravel_index(int(np.argmax(frac)), a.shape))
                raise GraphError(name, f"input has the value {a[pos].item()!r} at {pos}; the model takes it as "
                                       f"{integer}: expected integers (an integer array, or floats holding integers)")
        out.append(a)
    return out


class DataNode:
    """A tensor in the network: name, shape, dtype, producer, consumers, optional constant."""

    __slots__ = ("name", "shape", "dtype", "producer", "consumers", "value")

    def __init__(self, name: str, shape, dtype=np.float32, value: np.ndarray | None = None, nonfinite: bool = False):
        self.name = str(name)
        self.shape = as_shape(shape, self.name)
        self.dtype = as_dtype(dtype, self.name)
        self.producer: OpNode | None = None
        self.consumers: list[OpNode] = []
        self.value: np.ndarray | None = None
        if value is not None:
            self.bind_constant(value, nonfinite)

    def bind_constant(self, array, nonfinite: bool = False) -> "DataNode":
        """Bind constant data to this node (QingLong's bindConstant); it stops being a variable. NaN and
        infinities are refused (a diverged checkpoint's weights) unless `nonfinite`: the values a where op
        selects (`masked_fill(mask, -inf)`, torch.where(m, x, nan)), which the model means as they are."""
        a = np.asarray(array)
        if a.shape != self.shape:
            raise GraphError(self.name, f"bound constant has shape {a.shape}, expected {self.shape}")
        if a.dtype != self.dtype:
            if not np.can_cast(a.dtype, self.dtype, casting="same_kind"):
                raise GraphError(self.name, f"bound constant has dtype {a.dtype}, expected {self.dtype}")
            a = a.astype(self.dtype)
        if not nonfinite and not np.all(np.isfinite(a)):
            raise GraphError(self.name, "bound constant contains NaN or infinity (a weight or an operand other "
                                        "than the values a where / masked_fill selects)")
        if self.producer is not None:
            raise GraphError(self.name, f"is produced by op '{self.producer.name}' and cannot be a constant")
        # frozen, so that no one changes a bound constant in place; a writable array is copied first (freezing
        # the caller's own array would break its later writes: a Trainer's weights after predict()); asarray, not
        # ascontiguousarray, which makes a 0-d array 1-d (an ONNX scalar initializer: onnx_mutants seed 6018449)
        self.value = np.array(a, order="C", copy=True) if a.flags.writeable else np.asarray(a, order="C")
        self.value.flags.writeable = False
        return self

    @property
    def is_constant(self) -> bool:
        return self.value is not None

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def __repr__(self) -> str:
        kind = "const" if self.is_constant else "var"
        return f"DataNode({self.name!r}, {self.shape}, {self.dtype}, {kind})"


@dataclass(eq=False)
class OpNode:
    """An operation: type, parameters, input data nodes and its output data node(s)."""

    name: str
    op: str
    inputs: list[DataNode]
    outputs: list[DataNode]
    params: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        ins = ", ".join(d.name for d in self.inputs)
        outs = ", ".join(d.name for d in self.outputs)
        return f"{self.name} = {self.op}({ins}) -> {outs} {self.params}"
