"""Element-wise activations: one table shared by the IR, the reference, the fused epilogues and training.

An activation is a name plus at most two float parameters (alpha, beta). Every fast kernel that
fuses an activation into its epilogue (conv, depthwise, linear, element-wise) receives it as the
triple `(code, alpha, beta)` from `encode()` and applies `apply_scalar(code, v, alpha, beta)`
inside its njit code (the branch on `code` is loop-invariant, so LLVM hoists it out of the lanes
loop). The numpy function `reference(name, x, alpha, beta)` is the spec; tests compare both with
PyTorch (`tests/test_activations.py`).

The epilogue order of a fused conv is fixed:  y = act(conv(x, w) + bias + residual).

 code  name         params (alpha, beta)          definition                               torch / ONNX
 ----  -----------  ----------------------------  ---------------------------------------  -----------------------------
 0     identity     -                             x
 1     relu         -                             max(x, 0)                                 ReLU / Relu
 2     clip         (min, max)                    min(max(x, alpha), beta)                  ReLU6 = clip(0, 6), Hardtanh,
                                                                                            clamp / Clip
 3     hardswish    -                             x * clip(x + 3, 0, 6) / 6                 Hardswish / HardSwish
 4     hardsigmoid  (alpha, beta)                 clip(alpha * x + beta, 0, 1)              torch: (1/6, 1/2); ONNX
                                                                                            default (0.2, 0.5)
 5     sigmoid      -                             1 / (1 + exp(-x))                         Sigmoid
 6     silu         -                             x * sigmoid(x)                            SiLU / Swish
 7     gelu         -                             x / 2 * (1 + erf(x / sqrt 2))             GELU(approximate='none')
 8     gelu_tanh    -                             x / 2 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
                                                                                            GELU(approximate='tanh')
 9     leaky_relu   (negative_slope, -)           x if x >= 0 else alpha * x                LeakyReLU / LeakyRelu
 10    elu          (alpha, -)                    x if x > 0 else alpha * (exp(x) - 1)      ELU / Elu
 11    tanh         -                             tanh(x)                                   Tanh

PReLU (a learned slope per channel) is not a scalar activation: it is its own op.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

# name -> (code, parameter names, defaults)
ACTIVATIONS: dict[str, tuple[int, tuple[str, ...], tuple[float, ...]]] = {
    "identity": (0, (), ()),
    "relu": (1, (), ()),
    "clip": (2, ("min", "max"), (-math.inf, math.inf)),
    "hardswish": (3, (), ()),
    "hardsigmoid": (4, ("alpha", "beta"), (1.0 / 6.0, 0.5)),
    "sigmoid": (5, (), ()),
    "silu": (6, (), ()),
    "gelu": (7, (), ()),
    "gelu_tanh": (8, (), ()),
    "leaky_relu": (9, ("negative_slope",), (0.01,)),
    "elu": (10, ("alpha",), (1.0,)),
    "tanh": (11, (), ()),
}
NAMES = {code: name for name, (code, _, _) in ACTIVATIONS.items()}
IDENTITY = (0, 0.0, 0.0)

_SQRT1_2 = 0.7071067811865476
_GELU_C = 0.7978845608028654  # sqrt(2 / pi)


def normalize(name: str, params: dict | None = None, where: str = "?") -> tuple[str, float, float]:
    """(name, {param: value}) -> (name, alpha, beta) with defaults filled in; ValueError naming what is wrong."""
    if name not in ACTIVATIONS:
        raise ValueError(f"{where}: unknown activation {name!r}; known: {', '.join(ACTIVATIONS)}")
    _, names, defaults = ACTIVATIONS[name]
    params = dict(params or {})
    vals = []
    for pname, d in zip(names, defaults):
        v = float(params.pop(pname, d))
        if math.isnan(v):
            raise ValueError(f"{where}: activation {name} parameter {pname} is NaN")
        vals.append(v)
    if params:
        raise ValueError(f"{where}: activation {name} takes parameters {names or '()'}, got {sorted(params)}")
    if name == "clip" and vals[0] > vals[1]:
        raise ValueError(f"{where}: clip min {vals[0]} > max {vals[1]}")
    vals += [0.0] * (2 - len(vals))
    return name, vals[0], vals[1]


def encode(name: str, alpha: float = 0.0, beta: float = 0.0) -> tuple[int, float, float]:
    """The (code, alpha, beta) triple a fused epilogue takes."""
    return ACTIVATIONS[name][0], float(alpha), float(beta)


def reference(name: str, x: np.ndarray, alpha: float = 0.0, beta: float = 0.0) -> np.ndarray:
    """The spec, in numpy, computed in float64 and returned in x's dtype."""
    d = np.asarray(x, np.float64)
    if name == "identity":
        y = d
    elif name == "relu":
        y = np.maximum(d, 0.0)
    elif name == "clip":
        y = np.minimum(np.maximum(d, alpha), beta)
    elif name == "hardswish":
        y = d * np.clip(d + 3.0, 0.0, 6.0) / 6.0
    elif name == "hardsigmoid":
        y = np.clip(alpha * d + beta, 0.0, 1.0)
    elif name == "sigmoid":
        y = 0.5 * (1.0 + np.tanh(0.5 * d))  # = 1 / (1 + exp(-x)), no overflow
    elif name == "silu":
        y = d * 0.5 * (1.0 + np.tanh(0.5 * d))
    elif name == "gelu":
        from math import erf
        y = 0.5 * d * (1.0 + np.vectorize(erf, otypes=[np.float64])(d * _SQRT1_2)) if d.size else d
    elif name == "gelu_tanh":
        y = 0.5 * d * (1.0 + np.tanh(_GELU_C * (d + 0.044715 * d ** 3)))
    elif name == "leaky_relu":
        y = np.where(d >= 0, d, alpha * d)
    elif name == "elu":
        y = np.where(d > 0, d, alpha * np.expm1(np.minimum(d, 0.0)))
    elif name == "tanh":
        y = np.tanh(d)
    else:
        raise ValueError(f"unknown activation {name!r}; known: {', '.join(ACTIVATIONS)}")
    return y.astype(np.asarray(x).dtype if np.asarray(x).dtype.kind == "f" else np.float32)


# float32 constants: njit code stays in float32 lanes (a Python float literal would widen to float64)
_F0, _F1, _F3, _F6 = np.float32(0.0), np.float32(1.0), np.float32(3.0), np.float32(6.0)
_FHALF, _FSIXTH, _F30 = np.float32(0.5), np.float32(1.0 / 6.0), np.float32(30.0)
_FSQRT1_2, _FGELU_C, _FGELU_K = np.float32(_SQRT1_2), np.float32(_GELU_C), np.float32(0.044715)


@njit(inline="always", cache=True)
def _sigmoid(v):
    # clamp so exp never overflows (float32 exp overflows above ~88.7); sigmoid(+-30) is 1/0 in fp32
    t = min(max(v, -_F30), _F30)
    return _F1 / (_F1 + math.exp(-t))


@njit(inline="always", cache=True)
def apply_scalar(code, v, alpha, beta):
    """The activation of one float32 value inside njit code ((code, alpha, beta) from encode(); pass
    alpha and beta as np.float32 so the arithmetic stays float32)."""
    if code == 0:
        return v
    if code == 1:
        return max(v, _F0)
    if code == 2:
        return min(max(v, alpha), beta)
    if code == 3:
        return v * min(max(v + _F3, _F0), _F6) * _FSIXTH
    if code == 4:
        return min(max(alpha * v + beta, _F0), _F1)
    if code == 5:
        return _sigmoid(v)
    if code == 6:
        return v * _sigmoid(v)
    if code == 7:
        return _FHALF * v * (_F1 + math.erf(v * _FSQRT1_2))
    if code == 8:
        return _FHALF * v * (_F1 + math.tanh(_FGELU_C * (v + _FGELU_K * v * v * v)))
    if code == 9:
        return v if v >= _F0 else alpha * v
    if code == 10:
        return v if v > _F0 else alpha * (math.exp(min(v, _F0)) - _F1)
    if code == 11:
        return math.tanh(v)
    return v


@njit(nogil=True, cache=True)
def apply_inplace(x, code, alpha, beta):
    """x[...] = act(x) on a contiguous float32 array (any shape), one thread."""
    f = x.reshape(-1)
    a, b = np.float32(alpha), np.float32(beta)
    for i in range(f.size):
        f[i] = apply_scalar(code, f[i], a, b)
