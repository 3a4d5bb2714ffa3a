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
                                                  = x * sigmoid(2 sqrt(2/pi) (...))         GELU(approximate='tanh')
 9     leaky_relu   (negative_slope, -)           x if x >= 0 else alpha * x                LeakyReLU / LeakyRelu
 10    elu          (alpha, -)                    x if x > 0 else alpha * (exp(x) - 1)      ELU / Elu
 11    tanh         -                             tanh(x)                                   Tanh
 12    mish         -                             x * tanh(softplus(x)) = x * n / (n + 2),  Mish; the TorchScript
                                                  n = e^x (e^x + 2)                         exporter's Softplus,
                                                                                            Tanh, Mul
 13    softplus     (beta, threshold)             x if beta x > threshold else              Softplus (beta 1,
                                                  log(1 + e^(beta x)) / beta                threshold 20) / Softplus
 14    abs          -                             |x|                                       abs / Abs
 15    exp          -                             e^x (0 below -87: no subnormal result)    exp / Exp
 16    log          -                             ln x (-inf at 0, NaN below)               log / Log
 17    sqrt         -                             sqrt(x) (NaN below 0)                     sqrt / Sqrt
 18    rsqrt        -                             1 / sqrt(x)                               rsqrt
 19    pow          (exponent, -)                 x^p = e^(p ln|x|), the sign of x for an   pow(x, number) / Pow
                                                  odd integer p, NaN for x < 0 otherwise;   (x^2, x^3, x^0.5,
                                                  1 for p = 0                               x^-1 import as mul /
                                                                                            sqrt / div)
 20    celu         (alpha, -)                    x if x > 0 else alpha (e^(x/alpha) - 1)   CELU / Celu (alpha > 0)
 21    selu         -                             1.0507... * (x if x > 0 else              SELU / Selu (torch's
                                                  1.6732... (e^x - 1))                      constants)
 22    log_sigmoid  -                             -softplus(-x) = min(x, 0) -               LogSigmoid
                                                  log(1 + e^-|x|)
 23    erf          -                             erf(x) (GELU's rational form; +-1 at      erf / Erf
                                                  |x| >= 4)
 24    floor        -                             floor(x)                                  floor / Floor
 25    ceil         -                             ceil(x)                                   ceil / Ceil
 26    round        -                             x rounded to the nearest integer, halves  round / Round
                                                  to even
 27    sin          -                             sin(x) (float64 inside: exact range         sin / Sin
                                                  reduction at any |x|)
 28    cos          -                             cos(x) (as sin)                           cos / Cos
 29    tan          -                             tan(x) (as sin)                           tan / Tan
 30    asin         -                             asin(x) (NaN outside [-1, 1]; as sin)     asin / Asin
 31    acos         -                             acos(x) (as asin)                         acos / Acos
 32    atan         -                             atan(x) (as sin)                          atan / Atan
 33    sinh         -                             sinh(x) (inf past float32's range)        sinh / Sinh
 34    cosh         -                             cosh(x) (as sinh)                         cosh / Cosh
 35    asinh        -                             asinh(x)                                  asinh / Asinh
 36    acosh        -                             acosh(x) (NaN below 1)                    acosh / Acosh
 37    atanh        -                             atanh(x) (+-inf at +-1, NaN beyond)       atanh / Atanh
 38    trunc        -                             x rounded toward 0                        trunc, fix, frac (x -
                                                                                            trunc x), div(rounding_mode
                                                                                            ='trunc')
 39    fmod         (divisor, -)                  x - n d, n = trunc(x / d) exactly (C's    fmod(x, d)
                                                  fmod: the sign of x; NaN for d = 0)
 40    remainder    (divisor, -)                  fmod, plus d where it is non-zero and     remainder(x, d), x % d
                                                  its sign differs from d's (PyTorch's)
 41    floor_divide (divisor, -)                  PyTorch's floor division of x by d (fmod  x // d, floor_divide,
                                                  based: (x - fmod) / d, one less where     div(rounding_mode=
                                                  the signs differ, floored, rounded up      'floor')
                                                  past .5; x / d for d = 0)
 42    log2         -                             log2(x) (-inf at 0, NaN below; as sin)    log2
 43    log10        -                             log10(x) (as log2)                        log10
 44    base_pow     (base, -)                     base^x, base > 0 (float64 inside, as      exp2 (base 2), pow(c, x)
                                                  sin)                                      / c ** x, ONNX Pow(c, x)
 45    erfc         -                             1 - erf(x) without the cancellation (as   erfc, special.erfc
                                                  sin)

ln, log2, log10, sqrt, rsqrt and pow with p < 0 are infinite at 0: `finite_at_zero` says so, and the compiler keeps such an
activation out of the epilogues that write act(0) into the padded channels of a blocked tensor (the next conv's
zero weights would multiply an infinity: NaN everywhere); the standalone activation zeroes those lanes.

PReLU (a learned slope per channel) is not a scalar activation: it is its own op.

The njit forms use no libm call (numba's math.exp/tanh/erf are scalar calls that stop a lanes loop
from vectorizing): exp32 follows Cephes' expf (a fitted degree-6 polynomial in Estrin's form, n rounded by
a shifter constant read back as integer bits) with the exponent built in the float's bits, tanh32 and
erf32 are Eigen's rational approximations, and divisions go through np.divide (no Python
ZeroDivisionError check). Their error against float64 is below 1e-6 absolute on all of float32;
tests/test_activations.py holds them to 2e-6 of PyTorch. GELU(erf) takes Phi from an erfc form, not
1 + erf (which cancels for x < 0): relative accuracy in the negative tail too, where PyTorch's and ONNX
Runtime's GELU are 0 or 100% off (`_phi_lower`).
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir as llvm_ir
from numba import njit, types
from numba.extending import intrinsic

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
    "mish": (12, (), ()),
    "softplus": (13, ("beta", "threshold"), (1.0, 20.0)),
    "abs": (14, (), ()),
    "exp": (15, (), ()),
    "log": (16, (), ()),
    "sqrt": (17, (), ()),
    "rsqrt": (18, (), ()),
    "pow": (19, ("exponent",), (1.0,)),
    "celu": (20, ("alpha",), (1.0,)),
    "selu": (21, (), ()),
    "log_sigmoid": (22, (), ()),
    "erf": (23, (), ()),
    "floor": (24, (), ()),
    "ceil": (25, (), ()),
    "round": (26, (), ()),
    "sin": (27, (), ()),
    "cos": (28, (), ()),
    "tan": (29, (), ()),
    "asin": (30, (), ()),
    "acos": (31, (), ()),
    "atan": (32, (), ()),
    "sinh": (33, (), ()),
    "cosh": (34, (), ()),
    "asinh": (35, (), ()),
    "acosh": (36, (), ()),
    "atanh": (37, (), ()),
    "trunc": (38, (), ()),
    "fmod": (39, ("divisor",), (1.0,)),
    "remainder": (40, ("divisor",), (1.0,)),
    "floor_divide": (41, ("divisor",), (1.0,)),
    "log2": (42, (), ()),
    "log10": (43, (), ()),
    "base_pow": (44, ("base",), (2.0,)),
    "erfc": (45, (), ()),
}
# the codes of x (op) d for a number d: the divisor is alpha
DIVISORS = ("fmod", "remainder", "floor_divide")
# the trigonometric and hyperbolic codes 27-37: numpy's float64 function (reference), libm's (kernels)
TRIG = ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh")
# the base-2 / base-10 logarithms, 2^x and erfc (codes 42-45): numpy's / math's float64 function, libm's (kernels)
LIBM = ("log2", "log10", "base_pow", "erfc")
NAMES = {code: name for name, (code, _, _) in ACTIVATIONS.items()}
IDENTITY = (0, 0.0, 0.0)

_SQRT1_2 = 0.7071067811865476
_GELU_C = 0.7978845608028654  # sqrt(2 / pi)
# GELU(approximate='tanh') is 0 (x * 0: -0, NaN at -inf) and so is its derivative where 0.5 (1 + tanh z) < 2^-26,
# where float32's tanh z rounds to -1: PyTorch's and ONNX Runtime's zeros (x = -5.6: sqrt of their 0 is 0, of the
# true -2.6e-9 NaN; tests/onnx_graphs.py seed 79056053); above it the sigmoid form's accurate value
GELU_TANH_FLUSH = 2.0 ** -26
_SELU_SCALE, _SELU_ALPHA = 1.0507009873554804934193349852946, 1.6732632423543772848170429916717  # torch's, ONNX's


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
    if name == "pow" and not math.isfinite(vals[0]):
        raise ValueError(f"{where}: pow exponent {vals[0]}; expected a finite number")
    if name == "base_pow" and not (math.isfinite(vals[0]) and vals[0] > 0):
        raise ValueError(f"{where}: base_pow base {vals[0]}; expected a finite number > 0")
    if name in DIVISORS and not math.isfinite(vals[0]):
        raise ValueError(f"{where}: {name} divisor {vals[0]}; expected a finite number")
    if name == "celu" and not vals[0] > 0:
        raise ValueError(f"{where}: celu alpha {vals[0]}; expected alpha > 0")
    vals += [0.0] * (2 - len(vals))
    return name, vals[0], vals[1]


def finite_at_zero(name: str, alpha: float = 0.0, beta: float = 0.0) -> bool:
    """act(0) is finite (log, sqrt's reciprocal and negative powers are not): whether an epilogue may write it
    into a blocked tensor's padded channels, which the next conv multiplies by zero weights."""
    return bool(np.isfinite(reference(name, np.zeros(1, np.float64), alpha, beta)[0]))


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
        # Phi(x) = erfc(-x / sqrt 2) / 2: no cancellation in the negative tail (1 + erf lost all digits below -8)
        y = 0.5 * d * np.vectorize(math.erfc, otypes=[np.float64])(-d * _SQRT1_2) if d.size else d
    elif name == "gelu_tanh":
        with np.errstate(over="ignore", invalid="ignore"):   # 0.5 (1 + tanh z) = 1 / (1 + e^-2z): no cancellation
            s = 1.0 / (1.0 + np.exp(-2.0 * _GELU_C * (d + 0.044715 * d ** 3)))
            y = np.where(s < GELU_TANH_FLUSH, 0.0 * d, d * s)
    elif name == "leaky_relu":
        y = np.where(d >= 0, d, alpha * d)
    elif name == "elu":
        y = np.where(d > 0, d, alpha * np.expm1(np.minimum(d, 0.0)))
    elif name == "tanh":
        y = np.tanh(d)
    elif name == "softplus":
        bx = alpha * d
        with np.errstate(invalid="ignore"):      # NaN in, NaN out
            y = np.where(bx > beta, d, np.logaddexp(0.0, bx) / alpha)
    elif name == "mish":
        y = d * np.tanh(np.logaddexp(0.0, d))     # softplus without overflow; mish(-inf) = -inf * 0 = nan
    elif name == "erf":
        y = np.vectorize(math.erf, otypes=[np.float64])(d) if d.size else d
    elif name in ("floor", "ceil", "round", "trunc"):
        y = {"floor": np.floor, "ceil": np.ceil, "round": np.rint, "trunc": np.trunc}[name](d)
    elif name in DIVISORS:
        y = _divide_ref(name, np.asarray(x), alpha)
    elif name in LIBM:
        with np.errstate(all="ignore"):           # log2(0) = -inf, NaN below 0, 2^x overflows to inf: as PyTorch
            y = {"log2": np.log2, "log10": np.log10, "base_pow": lambda v: np.power(float(alpha), v),
                 "erfc": lambda v: np.vectorize(math.erfc, otypes=[np.float64])(v) if v.size else v}[name](d)
    elif name in TRIG:
        with np.errstate(all="ignore"):           # sin(+-inf), asin(2) = NaN, atanh(1) = inf: as PyTorch
            y = {"sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos,
                 "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh,
                 "atanh": np.arctanh}[name](d)
    elif name in ("abs", "exp", "log", "sqrt", "rsqrt", "pow", "celu", "selu", "log_sigmoid"):
        with np.errstate(all="ignore"):           # overflow to inf, log(0) = -inf, NaN below 0: as PyTorch
            y = {"abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
                 "rsqrt": lambda v: 1.0 / np.sqrt(v),
                 "pow": lambda v: np.power(v, alpha),
                 "celu": lambda v: np.where(v > 0, v, alpha * np.expm1(np.minimum(v, 0.0) / alpha)),
                 "selu": lambda v: _SELU_SCALE * np.where(v > 0, v, _SELU_ALPHA * np.expm1(np.minimum(v, 0.0))),
                 "log_sigmoid": lambda v: -np.logaddexp(0.0, -v)}[name](d)
    else:
        raise ValueError(f"unknown activation {name!r}; known: {', '.join(ACTIVATIONS)}")
    with np.errstate(over="ignore"):              # beyond float32's range: inf, as PyTorch's float32
        return y.astype(np.asarray(x).dtype if np.asarray(x).dtype.kind == "f" else np.float32)


def _divide_ref(name: str, x: np.ndarray, d: float) -> np.ndarray:
    """fmod / remainder / floor_divide of x by the number d in x's own dtype, as PyTorch computes them (fmod is
    exact in any dtype; remainder's `fmod + d` and floor division's steps round in x's dtype)."""
    dt = x.dtype if x.dtype.kind == "f" else np.dtype(np.float32)
    v, b = x.astype(dt), dt.type(d)
    with np.errstate(all="ignore"):
        m = np.fmod(v, b)
        if name == "fmod":
            return m
        if name == "remainder":
            return np.where((m != 0) & ((b < 0) != (m < 0)), m + b, m)
        if b == 0:
            return v / b
        q = (v - m) / b
        q = np.where((m != 0) & ((b < 0) != (m < 0)), q - dt.type(1), q)
        f = np.floor(q)
        f = np.where(q - f > dt.type(0.5), f + dt.type(1), f)
        return np.where(q != 0, f, np.copysign(dt.type(0), v / b))


def derivative(name: str, dy: np.ndarray, x: np.ndarray, alpha: float = 0.0, beta: float = 0.0) -> np.ndarray:
    """dy * act'(x), the training backward of `reference` (float64 inside, returned in dy's dtype).

    At the kinks it takes PyTorch autograd's side: relu, leaky_relu, elu, celu, selu 0 / slope at x = 0
    (x > 0 counts as the positive branch); clip passes the gradient only strictly inside (min, max), as
    hardtanh / ReLU6 do (torch.clamp also passes it at x = min or max); hardsigmoid strictly inside
    0 < alpha x + beta < 1; hardswish 0 up to -3 inclusive, x / 3 + 1 / 2 strictly between, 1 from 3 on; abs
    sign(x) (0 at 0); pow with exponent 0 zero; floor, ceil, round, trunc, floor_divide zero everywhere,
    fmod and remainder one."""
    d = np.asarray(x, np.float64)
    g = np.asarray(dy, np.float64)
    with np.errstate(all="ignore"):               # inf / NaN propagate as in PyTorch
        if name == "identity":
            k = np.ones_like(d)
        elif name == "relu":
            k = (d > 0).astype(np.float64)
        elif name == "clip":
            k = ((d > alpha) & (d < beta)).astype(np.float64)
        elif name == "hardswish":
            k = np.where(d <= -3.0, 0.0, np.where(d < 3.0, d / 3.0 + 0.5, 1.0))
        elif name == "hardsigmoid":
            t = alpha * d + beta
            k = np.where((t > 0.0) & (t < 1.0), alpha, 0.0)
        elif name in ("sigmoid", "silu", "log_sigmoid"):
            s = 0.5 * (1.0 + np.tanh(0.5 * d))
            k = {"sigmoid": lambda: s * (1.0 - s), "silu": lambda: s * (1.0 + d * (1.0 - s)),
                 "log_sigmoid": lambda: 1.0 - s}[name]()
        elif name == "gelu":
            erfc = np.vectorize(math.erfc, otypes=[np.float64])(-d * _SQRT1_2) if d.size else d
            k = 0.5 * erfc + d * np.exp(-0.5 * d * d) / math.sqrt(2.0 * math.pi)
        elif name == "gelu_tanh":
            s = 1.0 / (1.0 + np.exp(-2.0 * _GELU_C * (d + 0.044715 * d ** 3)))    # = 0.5 (1 + tanh z)
            k = np.where(s < GELU_TANH_FLUSH, 0.0 * d,
                         s + 2.0 * d * s * (1.0 - s) * _GELU_C * (1.0 + 3.0 * 0.044715 * d * d))
        elif name == "leaky_relu":
            k = np.where(d > 0, 1.0, alpha)
        elif name == "elu":
            k = np.where(d > 0, 1.0, alpha * np.exp(np.minimum(d, 0.0)))
        elif name == "tanh":
            t = np.tanh(d)
            k = 1.0 - t * t
        elif name == "mish":
            t = np.tanh(np.logaddexp(0.0, d))
            k = t + d * 0.5 * (1.0 + np.tanh(0.5 * d)) * (1.0 - t * t)
        elif name == "softplus":
            bx = alpha * d
            k = np.where(bx > beta, 1.0, 0.5 * (1.0 + np.tanh(0.5 * bx)))
        elif name == "abs":
            k = np.sign(d)
        elif name == "exp":
            k = np.exp(d)
        elif name == "log":
            k = 1.0 / d
        elif name in ("log2", "log10"):
            k = 1.0 / (d * math.log(2.0 if name == "log2" else 10.0))
        elif name == "base_pow":
            k = math.log(alpha) * np.power(float(alpha), d)
        elif name == "erfc":
            k = -2.0 / math.sqrt(math.pi) * np.exp(-d * d)
        elif name == "sqrt":
            k = 0.5 / np.sqrt(d)
        elif name == "rsqrt":
            k = -0.5 / (d * np.sqrt(d))
        elif name == "pow":
            k = np.zeros_like(d) if alpha == 0.0 else alpha * np.power(d, alpha - 1.0)
        elif name == "celu":
            k = np.where(d > 0, 1.0, np.exp(np.minimum(d, 0.0) / alpha))
        elif name == "selu":
            k = _SELU_SCALE * np.where(d > 0, 1.0, _SELU_ALPHA * np.exp(np.minimum(d, 0.0)))
        elif name == "erf":
            k = 2.0 / math.sqrt(math.pi) * np.exp(-d * d)
        elif name in ("floor", "ceil", "round", "trunc", "floor_divide"):
            k = np.zeros_like(d)
        elif name in ("fmod", "remainder"):
            k = np.ones_like(d)              # (PyTorch's: the gradient passes to x)
        elif name == "sin":
            k = np.cos(d)
        elif name == "cos":
            k = -np.sin(d)
        elif name == "tan":
            k = 1.0 + np.tan(d) ** 2
        elif name in ("asin", "acos"):
            k = (1.0 if name == "asin" else -1.0) / np.sqrt(1.0 - d * d)
        elif name == "atan":
            k = 1.0 / (1.0 + d * d)
        elif name == "sinh":
            k = np.cosh(d)
        elif name == "cosh":
            k = np.sinh(d)
        elif name == "asinh":
            k = 1.0 / np.sqrt(d * d + 1.0)
        elif name == "acosh":
            k = 1.0 / np.sqrt(d * d - 1.0)
        elif name == "atanh":
            k = 1.0 / (1.0 - d * d)
        else:
            raise ValueError(f"unknown activation {name!r}; known: {', '.join(ACTIVATIONS)}")
        out = g * k
    dt = np.asarray(dy).dtype
    with np.errstate(over="ignore"):
        return out.astype(dt if dt.kind == "f" else np.float32)


# float32 constants: njit code stays in float32 lanes (a Python float literal would widen to float64)
_F0, _F1, _F2, _F3, _F6 = np.float32(0.0), np.float32(1.0), np.float32(2.0), np.float32(3.0), np.float32(6.0)
_FHALF, _FSIXTH = np.float32(0.5), np.float32(1.0 / 6.0)
_FSQRT1_2, _FGELU_C, _FGELU_K = np.float32(_SQRT1_2), np.float32(_GELU_C), np.float32(0.044715)
_FGELU_2C = np.float32(2.0 * _GELU_C)
_FGELU_FLUSH = np.float32(GELU_TANH_FLUSH)
# GELU(erf) as x Phi(x) with Phi(-a) = erfc(a / sqrt 2) / 2 = t e^(C(t) - a^2 / 2), t = 1 / (1 + a / (2 sqrt 2)):
# Numerical Recipes' erfc (erfcc: a degree-9 polynomial C in t, 1.2e-7 relative for every a >= 0) with its
# constant term less ln 2. x / 2 (1 + erf(x / sqrt 2)) cancelled for x < 0 (GELU(-5.57) was 9.3e-7 off, 16x its
# value, and a reciprocal after it a factor of 3: tests/onnx_graphs.py seed 101115614); this form does not, and
# costs one exp32 and one division as the rational erf did one division. |x| is clamped at _GELU_FAR, where
# t e^(...) = 4e-38 is still a normal float (a subnormal one costs a microcode assist per lane); below -_GELU_FAR
# GELU is x * 0 (its value is above -1e-36): -0, NaN at -inf, as 1 + erf's was.
_GELU_FAR = np.float32(12.85)
_FERFC_T = np.float32(0.5 * _SQRT1_2)
_GP = tuple(np.float32(c) for c in (-1.26551223 - math.log(2.0), 1.00002368, 0.37409196, 0.09678418, -0.18628806,
                                     0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277))
_FINV_SQRT_2PI = np.float32(1.0 / math.sqrt(2.0 * math.pi))


@intrinsic
def _bits_as_f32(typingctx, v):
    """Reinterpret an int32's bits as a float32 (an LLVM bitcast: vectorizes)."""
    if v != types.int32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llvm_ir.FloatType())
    return types.float32(types.int32), codegen


@intrinsic
def _f32_as_bits(typingctx, v):
    """Reinterpret a float32's bits as an int32 (an LLVM bitcast: vectorizes)."""
    if v != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llvm_ir.IntType(32))
    return types.int32(types.float32), codegen


# exp, after Cephes expf (S. L. Moshier, Cephes Math Library, expf.c): x = n ln2 + r, |r| <= ln2/2
# (Cody-Waite: ln2 in two parts), e^r = 1 + r + r^2 q(r), 2^n built in the exponent bits. Relative error
# 0.98 ulp at most over 1M points of [-87, 87] (tests/test_activations.py::
# test_exp32_is_within_one_and_a_half_ulps); branch-free, so LLVM vectorizes it (numba's math.exp is a
# scalar libm call).
# n comes from the "shifter" trick: x log2(e) + 1.5 * 2^23 rounds x log2(e) to an integer in the float's
# low mantissa bits (+ 127, the exponent bias, added in the same constant), read back with integer
# operations, so that no flag of a fastmath caller can fold the round trip away (with reassociation
# LLVM rewrites the float form (t + C) - C to t). One fused multiply-add, an integer subtract and a convert
# in place of floor's round + convert + add; q in Estrin's form (two independent multiply-adds, then two in
# r^2) in place of Horner's five in a row, and of degree 4 in place of Cephes' 5. SiLU over 401408 floats,
# one Zen 3 core: 0.666 -> 0.538 ns a value (benchmarks/RESULTS.md, 2026-11-29, nineteenth session).
_LOG2E = np.float32(1.44269504088896341)
_LN2_HI, _LN2_LO = np.float32(0.693359375), np.float32(-2.12194440e-4)
# e^r = 1 + r + r^2 q(r), q of degree 4 fitted to e^r's relative error on |r| <= ln2/2 (a weighted least-squares
# fit on Chebyshev nodes, iterated towards equal ripple): 7.8e-9 in float64, below float32's half ulp, as
# Cephes' degree-5 q (1.1e-9); one multiply-add fewer
_EQ = tuple(np.float32(c) for c in (0.49999967217445374, 0.16666479408740997, 0.04167356714606285,
                                     0.008372685872018337, 0.0013571209274232388))
_EXP_SHIFT = np.float32(1.5 * 2 ** 23 + 127)         # 12583039.0: exact in float32
_EXP_SHIFT_BITS = np.int32(0x4B400000 + 127)          # its bits: the integer n sits in the low mantissa bits

# tanh and erf: Eigen's rational approximations (Eigen/src/Core/MathFunctionsImpl.h,
# generic_fast_tanh_float / generic_fast_erf_float), odd numerator over even denominator
_TANH_CLAMP, _TANH_ONE = np.float32(7.90531110763549805), np.float32(9.0)
_TA = tuple(np.float32(c) for c in (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11,
                                     5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04,
                                     4.89352455891786e-03))
_TB = tuple(np.float32(c) for c in (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03,
                                     4.89352518554385e-03))
_ERF_CLAMP = np.float32(4.0)
_EA = tuple(np.float32(c) for c in (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
                                     -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
                                     -1.60960333262415e-02))
_EB = tuple(np.float32(c) for c in (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
                                     -7.37332916720468e-03, -1.42647390514189e-02))


@njit(inline="always", cache=True)
def exp32(x):
    """e^x for float32 x in [-87, 87] (the callers clamp: e^-87 = 1.6e-38 is still a normal float, and
    n + 127 below stays a valid exponent), vectorizable."""
    tb = _f32_as_bits(x * _LOG2E + _EXP_SHIFT)      # bits of 1.5 * 2^23 + 127 + round(x log2 e)
    n = np.float32(np.int32(tb - _EXP_SHIFT_BITS))   # round(x log2 e); the int32 keeps the convert one vector op
    r = x - n * _LN2_HI - n * _LN2_LO                # Cody-Waite: |r| <= ln2 / 2
    r2 = r * r
    q = (_EQ[4] * r2 + (_EQ[3] * r + _EQ[2])) * r2 + (_EQ[1] * r + _EQ[0])
    p = q * r2 + r + _F1
    # tb << 23 keeps only its low 9 bits, n + 127 in [1, 253], as the exponent field of 2^n
    return p * _bits_as_f32(np.int32(tb << 23))


@njit(inline="always", cache=True)
def tanh32(x):
    """tanh for float32 x, vectorizable; exactly +-1 where float32 tanh rounds to +-1 (|x| >= 9)."""
    c = min(max(x, -_TANH_CLAMP), _TANH_CLAMP)
    c2 = c * c
    p = ((((((_TA[0] * c2 + _TA[1]) * c2 + _TA[2]) * c2 + _TA[3]) * c2 + _TA[4]) * c2 + _TA[5]) * c2
         + _TA[6]) * c
    q = ((_TB[0] * c2 + _TB[1]) * c2 + _TB[2]) * c2 + _TB[3]
    t = np.divide(p, q)  # ufunc division: no ZeroDivisionError check, so it vectorizes
    return _F1 if x >= _TANH_ONE else (-_F1 if x <= -_TANH_ONE else t)


@njit(inline="always", cache=True)
def erf32(x):
    """erf for float32 x, vectorizable; exactly +-1 where float32 erf rounds to +-1 (|x| >= 4), whatever
    flags the caller compiles it with (the rational form at the clamp gave 1 - 6e-8 under `arcp`, so a
    depthwise kernel's GELU(-inf) was -inf * 6e-8 = -inf, PyTorch's and the reference's -inf * 0 = nan)."""
    c = min(max(x, -_ERF_CLAMP), _ERF_CLAMP)
    c2 = c * c
    p = ((((((_EA[0] * c2 + _EA[1]) * c2 + _EA[2]) * c2 + _EA[3]) * c2 + _EA[4]) * c2 + _EA[5]) * c2
         + _EA[6]) * c
    q = (((_EB[0] * c2 + _EB[1]) * c2 + _EB[2]) * c2 + _EB[3]) * c2 + _EB[4]
    t = np.divide(p, q)
    return _F1 if x >= _ERF_CLAMP else (-_F1 if x <= -_ERF_CLAMP else t)


@njit(inline="always", cache=True)
def _phi_lower(a):
    """Phi(-a) = erfc(a / sqrt 2) / 2 for float32 a in [0, _GELU_FAR] (the callers clamp), vectorizable;
    within 1.2e-7 relative before float32's rounding of a^2 / 2 in the exponent."""
    t = np.divide(_F1, _F1 + _FERFC_T * a)
    q = ((((((((_GP[9] * t + _GP[8]) * t + _GP[7]) * t + _GP[6]) * t + _GP[5]) * t + _GP[4]) * t + _GP[3]) * t
          + _GP[2]) * t + _GP[1]) * t + _GP[0]
    return t * exp32(q - _FHALF * a * a)


# sigmoid's exponent is kept within +-_SIG_CLAMP: e^-87 = 1.6e-38 is still a normal float, so neither
# e^-v (v > 87) nor 1 / (1 + e^-v) (v < -87) is a subnormal number, which x86 computes through a
# microcode assist: SiLU over values beyond +-87 ran 156-285 cycles a 16-lane vector against ~20-30
# (Ice Lake VM). Below -87 sigmoid is 0 (float32's exact value is under 1.7e-38 there), so that
# sigmoid(-inf) = 0 and SiLU(-inf) = -inf * 0 = NaN, as in PyTorch and the reference (with the clamped
# exponent alone they were 1.6e-38 and -inf, and an infinite input left finite values where PyTorch's were
# NaN: tests/test_nonfinite.py); 1 for v >= 87. A NaN fails the compare and stays NaN.
_SIG_CLAMP = np.float32(87.0)


@njit(inline="always", cache=True)
def _sigmoid(v):
    s = np.divide(_F1, _F1 + exp32(min(max(-v, -_SIG_CLAMP), _SIG_CLAMP)))
    return _F0 if v < -_SIG_CLAMP else s


# Mish: tanh(softplus(v)) = ((1 + e^v)^2 - 1) / ((1 + e^v)^2 + 1) = n / (n + 2) with n = e^v (e^v + 2): no log, no
# tanh, no cancellation. Past v = 20 the ratio is 1 in float32 (n ~ 2e17), so e^v is taken at min(v, 20) (no
# overflow to inf / inf); below -87 the ratio is 0 (float32's exact value is under 1.7e-38 there), so that
# mish(-inf) = -inf * 0 = nan as in PyTorch, and no subnormal intermediate (as sigmoid above).
_MISH_HI = np.float32(20.0)


@njit(inline="always", cache=True)
def _mish_ratio(v):
    e = exp32(max(min(v, _MISH_HI), -_SIG_CLAMP))
    n = e * (e + _F2)
    r = np.divide(n, n + _F2)
    return _F0 if v < -_SIG_CLAMP else r


# Softplus: log(1 + e^b) = max(b, 0) + log1p(e^-|b|), b = beta x; log1p(t), t in (0, 1], as 2 atanh(s) with
# s = t / (2 + t) <= 1/3: the odd series to s^13 (its next term is below 2e-9), no libm call. e^-|b| is taken at
# -87 at least (no subnormal intermediate; the result is off by under 1.7e-38 there).
_LOG1P_C = tuple(np.float32(2.0 / k) for k in (3, 5, 7, 9, 11, 13))


@njit(inline="always", cache=True)
def _softplus(v, beta, threshold):
    b = beta * v
    t = exp32(max(-abs(b), -_SIG_CLAMP))
    s = np.divide(t, _F2 + t)
    s2 = s * s
    q = ((((_LOG1P_C[5] * s2 + _LOG1P_C[4]) * s2 + _LOG1P_C[3]) * s2 + _LOG1P_C[2]) * s2 + _LOG1P_C[1]) * s2 \
        + _LOG1P_C[0]
    y = np.divide(max(b, _F0) + (_F2 * s + q * s2 * s), beta)
    return v if b > threshold else y


# e^x over all of float32: e^min(x, 87) * e^(x - 87) past 87 (inf past 88.72, as float32's exp), 0 below -87
# (float32's exact value is under 1.7e-38 there: no subnormal result, which x86 computes through a microcode
# assist), NaN for NaN.
@njit(inline="always", cache=True)
def _exp(v):
    h = min(max(v, -_SIG_CLAMP), _SIG_CLAMP)
    r = exp32(h) * exp32(min(max(v - h, _F0), _SIG_CLAMP))
    return _F0 if v < -_SIG_CLAMP else r


# ln x: x = m 2^e with m in [sqrt(1/2), sqrt(2)) read from the float's bits (a subnormal x scaled by 2^23
# first), ln m = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.172: the odd series to s^11 (its next term is below
# 1e-10), e ln2 in two parts (Cody-Waite, as exp32). -inf at +-0, NaN below 0 and for NaN, inf at inf.
_FLT_MIN, _TWO23 = np.float32(1.1754943508222875e-38), np.float32(8388608.0)
_SQRT2F = np.float32(1.4142135623730951)
_LOG_C = tuple(np.float32(2.0 / k) for k in (3, 5, 7, 9, 11))
_INF32, _NAN32 = np.float32(np.inf), np.float32(np.nan)
_MANT, _ONE_BITS, _EXPF = np.int32(0x007FFFFF), np.int32(0x3F800000), np.int32(0xFF)


@njit(inline="always", cache=True)
def log32(x):
    """ln x for float32 x, vectorizable."""
    small = x < _FLT_MIN
    bits = _f32_as_bits(x * _TWO23 if small else x)
    e = np.float32(np.int32((bits >> np.int32(23)) & _EXPF)) - (np.float32(150.0) if small else np.float32(127.0))
    m = _bits_as_f32(np.int32((bits & _MANT) | _ONE_BITS))      # [1, 2)
    big = m > _SQRT2F
    m = m * _FHALF if big else m
    e = e + _F1 if big else e
    s = np.divide(m - _F1, m + _F1)
    s2 = s * s
    q = (((_LOG_C[4] * s2 + _LOG_C[3]) * s2 + _LOG_C[2]) * s2 + _LOG_C[1]) * s2 + _LOG_C[0]
    r = e * _LN2_HI + (e * _LN2_LO + (_F2 * s + q * s2 * s))
    if x > _F0 and x < _INF32:
        return r
    return -_INF32 if x == _F0 else (x if x == _INF32 else _NAN32)


# x^p = e^(p ln|x|); for x < 0 the sign of x where p is an odd integer (-0 included), NaN where p is no integer
# (PyTorch's and C's pow); 1 for p = 0 whatever x. The relative error grows with |p ln x| (ln's 6e-8 times it: 5e-6 at
# a result of e^80).
@njit(inline="always", cache=True)
def _pow(v, p):
    r = _exp(p * log32(abs(v)))
    fl = np.floor(p)
    half = np.floor(fl * _FHALF)
    r = -r if (fl == p and fl != half + half and _f32_as_bits(v) < np.int32(0)) else r   # odd p, x <= -0
    r = _NAN32 if (fl != p and v < _F0 and v != -_INF32) else r                          # (-inf)^2.5 = inf
    return _F1 if p == _F0 else r


_FSELU_SCALE, _FSELU_ALPHA = np.float32(_SELU_SCALE), np.float32(_SELU_ALPHA)
# e^t - 1 for t <= 0 (ELU, CELU, SELU): e^t - 1 cancels near 0 (ELU(-1e-30) was 0, PyTorch's expm1 gives
# -1e-30), so above -1/4 the Taylor series to t^7 (its next term is under 2e-9 of the value)
_EM1_C = tuple(np.float32(1.0 / f) for f in (2, 6, 24, 120, 720, 5040))
_EM1_LO = np.float32(-0.25)


@njit(inline="always", cache=True)
def _expm1_neg(t):
    p = t * (_F1 + t * (_EM1_C[0] + t * (_EM1_C[1] + t * (_EM1_C[2] + t * (_EM1_C[3] + t * (_EM1_C[4]
                                                                                             + t * _EM1_C[5]))))))
    return p if t > _EM1_LO else _exp(t) - _F1


# apply_span's floating-point flags, stated so that they are never inherited: numba compiles a function without
# its own `fastmath` with the flags of the caller that triggers its first compile (targetconfig's
# inherit_if_not_set), and caches that code. apply_span is called by fastmath kernels (epilogue.act_span,
# depthwise._finish_row, squeeze's gates) and by plain ones, so its bits and speed had depended on which of them
# ran first since the cache was made (SiLU over 64K floats, one Zen 3 core: 0.93 ns a value compiled on its own,
# 0.58 as act_span's callee, different last bits; benchmarks/RESULTS.md, 2026-11-29, eighteenth session).
# "contract" lets LLVM fuse the polynomials' multiply-adds (0.65 ns); no flag that assumes finite values (a NaN
# in gives a NaN out, the clamps stay). tests/test_activations.py checks both orders.
SPAN_FASTMATH = {"contract"}


# the element-wise math codes (14-37), one function each: apply_span's loop for a code inlines only its own
# function, and apply_scalar (inlined into every kernel's scalar stores) reaches them through one call of
# _math_call: inlining all of them there made numba compile 9x longer (apply_span 18 -> 169 s, a conv network's
# kernels 1.7 -> 6.8 s)
@njit(inline="always", cache=True)
def _s_abs(v, alpha, beta):
    return abs(v)


@njit(inline="always", cache=True)
def _s_exp(v, alpha, beta):
    return _exp(v)


@njit(inline="always", cache=True)
def _s_log(v, alpha, beta):
    return log32(v)


@njit(inline="always", cache=True)
def _s_sqrt(v, alpha, beta):
    return np.sqrt(v)


@njit(inline="always", cache=True)
def _s_rsqrt(v, alpha, beta):
    return np.divide(_F1, np.sqrt(v))


@njit(inline="always", cache=True)
def _s_pow(v, alpha, beta):
    return _pow(v, alpha)


@njit(inline="always", cache=True)
def _s_celu(v, alpha, beta):
    return v if v > _F0 else alpha * _expm1_neg(np.divide(min(v, _F0), alpha))


@njit(inline="always", cache=True)
def _s_selu(v, alpha, beta):
    return _FSELU_SCALE * (v if v > _F0 else _FSELU_ALPHA * _expm1_neg(min(v, _F0)))


@njit(inline="always", cache=True)
def _s_log_sigmoid(v, alpha, beta):
    return -_softplus(-v, _F1, _INF32)


@njit(inline="always", cache=True)
def _s_erf(v, alpha, beta):
    return erf32(v)


@njit(inline="always", cache=True)
def _s_floor(v, alpha, beta):
    return np.floor(v)


@njit(inline="always", cache=True)
def _s_ceil(v, alpha, beta):
    return np.ceil(v)


@njit(inline="always", cache=True)
def _s_round(v, alpha, beta):
    return np.rint(v)        # the current rounding mode: to nearest, halves to even (torch.round, ONNX Round)


# sin and cos: libm's float64 functions (exact range reduction at any |x|; rounded to float32 they are within
# half an ulp and a hair of the true value), a scalar call per value: the loop does not vectorize. They appear in
# timestep and positional embeddings (a few thousand values), where a float32 polynomial's reduction would lose
# digits at the arguments those make (t * 10000^(-k/d) up to 1e3 .. 1e4 radians).
@njit(inline="always", cache=True)
def _s_sin(v, alpha, beta):
    return np.float32(math.sin(np.float64(v)))


@njit(inline="always", cache=True)
def _s_cos(v, alpha, beta):
    return np.float32(math.cos(np.float64(v)))


def _libm(fn):
    """A code's float32 function from libm's float64 one (as sin: one scalar call per value)."""
    @njit(inline="always", cache=True)
    def f(v, alpha, beta):
        return np.float32(fn(np.float64(v)))
    return f


# tan .. atanh: libm's float64 functions rounded to float32, as sin and cos (inverse and hyperbolic functions in
# coordinate transforms, SIREN-style networks, losses); compiled, asin, acos, acosh and atanh are NaN outside their
# domains and sinh / cosh overflow to inf (libm's results: numba raises no domain error)
_s_tan, _s_asin, _s_acos, _s_atan, _s_sinh, _s_cosh, _s_asinh, _s_acosh, _s_atanh = (
    _libm(fn) for fn in (math.tan, math.asin, math.acos, math.atan, math.sinh, math.cosh, math.asinh, math.acosh,
                         math.atanh))


# log2, log10, erfc: libm's float64 functions rounded to float32, as sin (exact powers of 2 and 10 give exact
# logarithms; erfc keeps its relative accuracy in the tail, where 1 - erf is 0)
_s_log2, _s_log10, _s_erfc = (_libm(fn) for fn in (math.log2, math.log10, math.erfc))


@njit(inline="always", cache=True)
def _s_base_pow(v, alpha, beta):
    """base^x (base = alpha > 0) by libm's float64 pow, rounded: not exp(x ln base) in float32, whose error grows
    with |x ln base|."""
    return np.float32(math.pow(np.float64(alpha), np.float64(v)))


@njit(inline="always", cache=True)
def _s_trunc(v, alpha, beta):
    return np.floor(v) if v >= _F0 else np.ceil(v)      # -0.5 -> -0.0, NaN -> NaN, as np.trunc


@njit(inline="always", cache=True)
def _s_fmod(v, alpha, beta):
    """C's fmod, exact: in float64 (a float32 x and d's result is a float32 value), rounded back."""
    b = np.float64(alpha)
    if b == 0.0 or not math.isfinite(np.float64(v)):
        return np.float32(np.nan)
    if math.isinf(b):
        return v
    return np.float32(np.fmod(np.float64(v), b))


@njit(inline="always", cache=True)
def _s_remainder(v, alpha, beta):
    m = _s_fmod(v, alpha, beta)
    if m != _F0 and (alpha < _F0) != (m < _F0):
        return m + alpha
    return m


@njit(inline="always", cache=True)
def _s_floor_divide(v, alpha, beta):
    """PyTorch's div_floor_floating in float32."""
    if alpha == _F0:
        return np.divide(v, alpha)
    m = _s_fmod(v, alpha, beta)
    q = np.divide(v - m, alpha)
    if m != _F0 and (alpha < _F0) != (m < _F0):
        q = q - _F1
    if q != _F0:
        f = np.floor(q)
        return f + _F1 if q - f > _FHALF else f
    return np.float32(math.copysign(0.0, np.divide(np.float64(v), np.float64(alpha))))


MATH_CODES = 14     # codes from here on: the element-wise math functions


@njit(nogil=True, cache=True, fastmath=SPAN_FASTMATH)
def _math_call(code, v, alpha, beta):
    """One value of a math code (14-45), out of line (flags stated: never inherited from the caller)."""
    if code == 14:
        return _s_abs(v, alpha, beta)
    if code == 15:
        return _s_exp(v, alpha, beta)
    if code == 16:
        return _s_log(v, alpha, beta)
    if code == 17:
        return _s_sqrt(v, alpha, beta)
    if code == 18:
        return _s_rsqrt(v, alpha, beta)
    if code == 19:
        return _s_pow(v, alpha, beta)
    if code == 20:
        return _s_celu(v, alpha, beta)
    if code == 21:
        return _s_selu(v, alpha, beta)
    if code == 22:
        return _s_log_sigmoid(v, alpha, beta)
    if code == 23:
        return _s_erf(v, alpha, beta)
    if code == 24:
        return _s_floor(v, alpha, beta)
    if code == 25:
        return _s_ceil(v, alpha, beta)
    if code == 26:
        return _s_round(v, alpha, beta)
    if code == 27:
        return _s_sin(v, alpha, beta)
    if code == 28:
        return _s_cos(v, alpha, beta)
    if code == 29:
        return _s_tan(v, alpha, beta)
    if code == 30:
        return _s_asin(v, alpha, beta)
    if code == 31:
        return _s_acos(v, alpha, beta)
    if code == 32:
        return _s_atan(v, alpha, beta)
    if code == 33:
        return _s_sinh(v, alpha, beta)
    if code == 34:
        return _s_cosh(v, alpha, beta)
    if code == 35:
        return _s_asinh(v, alpha, beta)
    if code == 36:
        return _s_acosh(v, alpha, beta)
    if code == 37:
        return _s_atanh(v, alpha, beta)
    if code == 38:
        return _s_trunc(v, alpha, beta)
    if code == 39:
        return _s_fmod(v, alpha, beta)
    if code == 40:
        return _s_remainder(v, alpha, beta)
    if code == 41:
        return _s_floor_divide(v, alpha, beta)
    if code == 42:
        return _s_log2(v, alpha, beta)
    if code == 43:
        return _s_log10(v, alpha, beta)
    if code == 44:
        return _s_base_pow(v, alpha, beta)
    if code == 45:
        return _s_erfc(v, alpha, beta)
    return v


@njit(inline="always", cache=True)
def apply_scalar(code, v, alpha, beta):
    """The activation of one float32 value inside njit code ((code, alpha, beta) from encode(); pass
    alpha and beta as np.float32 so the arithmetic stays float32). Every branch is free of libm
    calls, so a loop over lanes with a loop-invariant code vectorizes."""
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
        h = _phi_lower(min(abs(v), _GELU_FAR))
        return v * (h if v < _F0 else _F1 - h) if v >= -_GELU_FAR else v * _F0
    if code == 8:
        # 0.5 (1 + tanh z) as sigmoid(2z): 1 + tanh z cancelled in the negative tail (GELU(-4.32) = -1.36e-5 came
        # out 3% off; tests/onnx_graphs.py seed 77022427), the sigmoid's 1 / (1 + e^-2z) does not; 0 (x 0) where
        # float32's tanh z is -1 (GELU_TANH_FLUSH)
        s = _sigmoid(_FGELU_2C * (v + _FGELU_K * v * v * v))
        return v * (s if s >= _FGELU_FLUSH else _F0)
    if code == 9:
        return v if v >= _F0 else alpha * v
    if code == 10:
        return v if v > _F0 else alpha * _expm1_neg(min(v, _F0))
    if code == 11:
        return tanh32(v)
    if code == 12:
        return v * _mish_ratio(v)
    if code == 13:
        return _softplus(v, alpha, beta)
    return _math_call(code, v, alpha, beta)      # 14-45 (a call: see _s_abs)


@njit(inline="always", cache=True)
def _apply_loop(f, lo, hi, code, a, b):
    g = f[lo:hi]        # a view: indices from 0 up, no negative-index wraparound code in the loop
    for i in range(g.size):
        g[i] = apply_scalar(code, g[i], a, b)


def _math_loop(fn):
    """The in-place loop of one math code's function (inlined whole: the loop vectorizes)."""
    @njit(inline="always", cache=True)
    def loop(f, lo, hi, a, b):
        g = f[lo:hi]
        for i in range(g.size):
            g[i] = fn(g[i], a, b)
    return loop


_L_ABS, _L_EXP, _L_LOG, _L_SQRT, _L_RSQRT, _L_POW, _L_CELU, _L_SELU, _L_LOG_SIGMOID = (
    _math_loop(f) for f in (_s_abs, _s_exp, _s_log, _s_sqrt, _s_rsqrt, _s_pow, _s_celu, _s_selu, _s_log_sigmoid))
_L_ERF, _L_FLOOR, _L_CEIL, _L_ROUND, _L_SIN, _L_COS = (
    _math_loop(f) for f in (_s_erf, _s_floor, _s_ceil, _s_round, _s_sin, _s_cos))
_L_TAN, _L_ASIN, _L_ACOS, _L_ATAN, _L_SINH, _L_COSH, _L_ASINH, _L_ACOSH, _L_ATANH = (
    _math_loop(f) for f in (_s_tan, _s_asin, _s_acos, _s_atan, _s_sinh, _s_cosh, _s_asinh, _s_acosh, _s_atanh))
_L_TRUNC, _L_FMOD, _L_REMAINDER, _L_FLOOR_DIVIDE = (
    _math_loop(f) for f in (_s_trunc, _s_fmod, _s_remainder, _s_floor_divide))
_L_LOG2, _L_LOG10, _L_BASE_POW, _L_ERFC = (_math_loop(f) for f in (_s_log2, _s_log10, _s_base_pow, _s_erfc))




@njit(nogil=True, cache=True, fastmath=SPAN_FASTMATH)
def apply_span(f, lo, hi, code, a, b):
    """f[lo:hi] = act(f[lo:hi]) in place on a 1-D float32 array (a, b float32). One loop per code
    (the code is a compile-time constant in each), so every loop vectorizes. Compiled with SPAN_FASTMATH
    whoever calls it first."""
    if code == 0:
        return
    elif code == 1:
        _apply_loop(f, lo, hi, 1, a, b)
    elif code == 2:
        _apply_loop(f, lo, hi, 2, a, b)
    elif code == 3:
        _apply_loop(f, lo, hi, 3, a, b)
    elif code == 4:
        _apply_loop(f, lo, hi, 4, a, b)
    elif code == 5:
        _apply_loop(f, lo, hi, 5, a, b)
    elif code == 6:
        _apply_loop(f, lo, hi, 6, a, b)
    elif code == 7:
        _apply_loop(f, lo, hi, 7, a, b)
    elif code == 8:
        _apply_loop(f, lo, hi, 8, a, b)
    elif code == 9:
        _apply_loop(f, lo, hi, 9, a, b)
    elif code == 10:
        _apply_loop(f, lo, hi, 10, a, b)
    elif code == 11:
        _apply_loop(f, lo, hi, 11, a, b)
    elif code == 12:
        _apply_loop(f, lo, hi, 12, a, b)
    elif code == 13:
        _apply_loop(f, lo, hi, 13, a, b)
    elif code == 14:
        _L_ABS(f, lo, hi, a, b)
    elif code == 15:
        _L_EXP(f, lo, hi, a, b)
    elif code == 16:
        _L_LOG(f, lo, hi, a, b)
    elif code == 17:
        _L_SQRT(f, lo, hi, a, b)
    elif code == 18:
        _L_RSQRT(f, lo, hi, a, b)
    elif code == 19:
        _L_POW(f, lo, hi, a, b)
    elif code == 20:
        _L_CELU(f, lo, hi, a, b)
    elif code == 21:
        _L_SELU(f, lo, hi, a, b)
    elif code == 22:
        _L_LOG_SIGMOID(f, lo, hi, a, b)
    elif code == 23:
        _L_ERF(f, lo, hi, a, b)
    elif code == 24:
        _L_FLOOR(f, lo, hi, a, b)
    elif code == 25:
        _L_CEIL(f, lo, hi, a, b)
    elif code == 26:
        _L_ROUND(f, lo, hi, a, b)
    elif code == 27:
        _L_SIN(f, lo, hi, a, b)
    elif code == 28:
        _L_COS(f, lo, hi, a, b)
    elif code == 29:
        _L_TAN(f, lo, hi, a, b)
    elif code == 30:
        _L_ASIN(f, lo, hi, a, b)
    elif code == 31:
        _L_ACOS(f, lo, hi, a, b)
    elif code == 32:
        _L_ATAN(f, lo, hi, a, b)
    elif code == 33:
        _L_SINH(f, lo, hi, a, b)
    elif code == 34:
        _L_COSH(f, lo, hi, a, b)
    elif code == 35:
        _L_ASINH(f, lo, hi, a, b)
    elif code == 36:
        _L_ACOSH(f, lo, hi, a, b)
    elif code == 37:
        _L_ATANH(f, lo, hi, a, b)
    elif code == 38:
        _L_TRUNC(f, lo, hi, a, b)
    elif code == 39:
        _L_FMOD(f, lo, hi, a, b)
    elif code == 40:
        _L_REMAINDER(f, lo, hi, a, b)
    elif code == 41:
        _L_FLOOR_DIVIDE(f, lo, hi, a, b)
    elif code == 42:
        _L_LOG2(f, lo, hi, a, b)
    elif code == 43:
        _L_LOG10(f, lo, hi, a, b)
    elif code == 44:
        _L_BASE_POW(f, lo, hi, a, b)
    else:
        _L_ERFC(f, lo, hi, a, b)


@njit(nogil=True, cache=True)
def apply_inplace(x, code, alpha, beta):
    """x[...] = act(x) on a contiguous float32 array (any shape), one thread (`apply_span`)."""
    f = x.reshape(-1)
    apply_span(f, 0, f.size, code, np.float32(alpha), np.float32(beta))


# training backward (training/schedule.py's activation op): out = dy * act'(x) in float32, one loop per code
# (the code a constant in each, as apply_span), the kink conventions of `derivative`. Codes 0-11 have a loop;
# the others (mish, softplus, the math functions 14-37) take `derivative` (numpy, float64 inside), which the
# tests compare both with PyTorch (tests/test_training_modern.py).
GRAD_CODES = frozenset(range(12))
_F1_3 = np.float32(1.0 / 3.0)
_FGELU_K3 = np.float32(3.0 * 0.044715)


@njit(inline="always", cache=True)
def _grad_scalar(code, g, v, a, b):
    if code == 0:
        return g
    if code == 1:
        return g if v > _F0 else _F0
    if code == 2:
        return g if (v > a and v < b) else _F0
    if code == 3:
        return _F0 if v <= -_F3 else (g * (v * _F1_3 + _FHALF) if v < _F3 else g)
    if code == 4:
        t = a * v + b
        return g * a if (t > _F0 and t < _F1) else _F0
    if code == 5:
        s = _sigmoid(v)
        return g * (s * (_F1 - s))
    if code == 6:
        s = _sigmoid(v)
        return g * (s * (_F1 + v * (_F1 - s)))
    if code == 7:
        c = min(max(v, -_GELU_FAR), _GELU_FAR)
        h = _phi_lower(abs(c))
        k = (h if v < _F0 else _F1 - h) + c * (exp32(-_FHALF * c * c) * _FINV_SQRT_2PI)    # Phi + x phi
        return g * (k if v >= -_GELU_FAR else v * _F0)
    if code == 8:
        s = _sigmoid(_FGELU_2C * (v + _FGELU_K * v * v * v))       # 0.5 (1 + t); 1 - t^2 = 4 s (1 - s)
        k = s + _F2 * v * s * (_F1 - s) * _FGELU_C * (_F1 + _FGELU_K3 * v * v)
        return g * (k if s >= _FGELU_FLUSH else _F0 * v)
    if code == 9:
        return g if v > _F0 else g * a
    if code == 10:
        return g if v > _F0 else g * (a * exp32(max(v, -_SIG_CLAMP)))
    t = tanh32(v)                                   # code 11
    return g * (_F1 - t * t)


@njit(nogil=True, cache=True)
def _grad_loop(out, dy, x, code, a, b):
    for i in range(out.size):
        out[i] = _grad_scalar(code, dy[i], x[i], a, b)


@njit(nogil=True, cache=True)
def grad_span(out, dy, x, code, a, b):
    """out = dy * act'(x) over 1-D float32 views (a, b float32), codes in GRAD_CODES; one loop per code."""
    if code == 0:
        _grad_loop(out, dy, x, 0, a, b)
    elif code == 1:
        _grad_loop(out, dy, x, 1, a, b)
    elif code == 2:
        _grad_loop(out, dy, x, 2, a, b)
    elif code == 3:
        _grad_loop(out, dy, x, 3, a, b)
    elif code == 4:
        _grad_loop(out, dy, x, 4, a, b)
    elif code == 5:
        _grad_loop(out, dy, x, 5, a, b)
    elif code == 6:
        _grad_loop(out, dy, x, 6, a, b)
    elif code == 7:
        _grad_loop(out, dy, x, 7, a, b)
    elif code == 8:
        _grad_loop(out, dy, x, 8, a, b)
    elif code == 9:
        _grad_loop(out, dy, x, 9, a, b)
    elif code == 10:
        _grad_loop(out, dy, x, 10, a, b)
    else:
        _grad_loop(out, dy, x, 11, a, b)
