"""The activation table: numpy reference and the njit scalar form against PyTorch, float32."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tilefuse.kernels import activations as A

X = np.concatenate([np.linspace(-100, 100, 2001), np.random.default_rng(0).standard_normal(4000) * 4,
                    [0.0, -0.0, 3.0, -3.0, 1e-30, -1e-30]]).astype(np.float32)

# name, params, torch function; tolerance: float32, atol 2e-6 + rtol 2e-6 (transcendental ulps)
CASES = [
    ("identity", {}, lambda t: t),
    ("relu", {}, F.relu),
    ("clip", {"min": 0.0, "max": 6.0}, F.relu6),
    ("clip", {"min": -1.0, "max": 1.0}, F.hardtanh),
    ("clip", {"min": -2.5, "max": 0.5}, lambda t: torch.clamp(t, -2.5, 0.5)),
    ("hardswish", {}, F.hardswish),
    ("hardsigmoid", {}, F.hardsigmoid),
    ("hardsigmoid", {"alpha": 0.2, "beta": 0.5}, lambda t: torch.clamp(0.2 * t + 0.5, 0, 1)),
    ("sigmoid", {}, torch.sigmoid),
    ("silu", {}, F.silu),
    ("gelu", {}, F.gelu),
    ("gelu_tanh", {}, lambda t: F.gelu(t, approximate="tanh")),
    ("leaky_relu", {}, F.leaky_relu),
    ("leaky_relu", {"negative_slope": 0.2}, lambda t: F.leaky_relu(t, 0.2)),
    ("elu", {}, F.elu),
    ("elu", {"alpha": 1.7}, lambda t: F.elu(t, 1.7)),
    ("tanh", {}, torch.tanh),
    ("mish", {}, F.mish),
    ("softplus", {}, F.softplus),
    ("softplus", {"beta": 2.0, "threshold": 5.0}, lambda t: F.softplus(t, 2.0, 5.0)),
    ("softplus", {"beta": 0.5, "threshold": 1e30}, lambda t: F.softplus(t, 0.5, 1e30)),
]


@pytest.mark.parametrize("name,params,fn", CASES, ids=[f"{c[0]}{i}" for i, c in enumerate(CASES)])
def test_activation_matches_torch(name, params, fn):
    want = fn(torch.from_numpy(X)).numpy()
    n, a, b = A.normalize(name, params)
    got_ref = A.reference(n, X, a, b)
    y = X.copy()
    A.apply_inplace(y, *A.encode(n, a, b))
    assert got_ref.dtype == np.float32 and y.dtype == np.float32
    np.testing.assert_allclose(got_ref, want, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(y, want, rtol=2e-6, atol=2e-6)
    assert np.isfinite(y).all()


def test_normalize_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown activation 'swish2'"):
        A.normalize("swish2")
    with pytest.raises(ValueError, match="takes parameters"):
        A.normalize("relu", {"alpha": 1})
    with pytest.raises(ValueError, match="min 6.0 > max 0.0"):
        A.normalize("clip", {"min": 6, "max": 0})


def test_codes_are_unique_and_dense():
    codes = sorted(c for c, _, _ in A.ACTIVATIONS.values())
    assert codes == list(range(len(codes)))


@pytest.mark.parametrize("name", ["sigmoid", "silu", "elu", "mish"])
def test_no_subnormal_results_beyond_the_exponent_range(name):
    """sigmoid, SiLU and ELU of inputs of magnitude >= 1 never give a subnormal float: x86 computes
    those through a microcode assist, ~150-285 cycles a 16-lane vector instead of ~30 (SiLU on values
    beyond +-87, Ice Lake VM). Before the clamp sigmoid(-100) was 4.2e-39; SiLU and ELU went through
    the same subnormal intermediates (e^v, 1 / (1 + e^-v)), which their results do not show (their
    speed is in benchmarks/RESULTS.md, tenth session). NaN still propagates, and the values stay
    within the torch tolerance above (the clamp moves them by less than 1.7e-38)."""
    x = np.concatenate([np.linspace(-1000, -1, 4001), np.linspace(1, 1000, 4001),
                        [np.inf, -np.inf, 87.0, -87.0, 87.4, -87.4, 88.5, -88.5, 104.0, -104.0]]).astype(np.float32)
    y = x.copy()
    A.apply_inplace(y, *A.encode(*A.normalize(name)))
    tiny = np.finfo(np.float32).tiny
    assert not ((y != 0) & (np.abs(y) < tiny)).any(), x[(y != 0) & (np.abs(y) < tiny)][:5]
    fn = {"sigmoid": torch.sigmoid, "silu": F.silu, "elu": F.elu, "mish": F.mish}[name]
    # infinities included: sigmoid(-inf) = 0 exactly, so SiLU(-inf) = -inf * 0 = nan, as torch's
    np.testing.assert_allclose(y, fn(torch.from_numpy(x)).numpy(), rtol=2e-6, atol=2e-6)
    z = np.array([np.nan] * 20, np.float32)
    A.apply_inplace(z, *A.encode(*A.normalize(name)))
    assert np.isnan(z).all()


_FIRST_CALLER = r"""
import sys
import numpy as np
from tilefuse.kernels import activations as A
from tilefuse.kernels.conv.epilogue import act_span
x = np.load(sys.argv[2])
if sys.argv[1] == "fastmath-caller-first":
    y = x.copy()
    act_span(y, 0, y.size, 6, np.float32(0.0), np.float32(0.0))   # compiles apply_span as its callee
outs = []
for code, a, b in ((5, 0.0, 0.0), (6, 0.0, 0.0), (7, 0.0, 0.0), (8, 0.0, 0.0), (10, 1.0, 0.0), (11, 0.0, 0.0),
                   (12, 0.0, 0.0), (13, 1.0, 20.0)):
    y = x.copy()
    A.apply_span(y, 0, y.size, code, np.float32(a), np.float32(b))
    outs.append(y)
np.save(sys.argv[3], np.stack(outs))
"""


def test_apply_span_bits_do_not_depend_on_its_first_caller(tmp_path):
    """numba compiles a function that states no `fastmath` with the flags of the caller that triggers its first
    compile, and caches that code: apply_span compiled first as the callee of epilogue.act_span (fastmath=True)
    gave other bits (and NaN handling that assumes finite values) than compiled on its own. It states its flags
    (activations.SPAN_FASTMATH): two fresh processes with empty kernel caches, one compiling it through
    act_span first, one directly, give the same bits for every transcendental activation, NaN and infinities
    included."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    x = np.concatenate([X, np.float32([np.nan, np.inf, -np.inf, 88.0, -88.0, 1e-38])]).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    script = tmp_path / "first.py"
    script.write_text(_FIRST_CALLER)
    root = Path(__file__).resolve().parent.parent
    got = {}
    for order in ("fastmath-caller-first", "alone"):
        env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / f"cache-{order}"), PYTHONPATH=str(root))
        out = tmp_path / f"{order}.npy"
        r = subprocess.run([sys.executable, str(script), order, str(tmp_path / "x.npy"), str(out)], env=env,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        got[order] = np.load(out)
    a, b = got["fastmath-caller-first"], got["alone"]
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), np.argwhere(a.view(np.uint32) != b.view(np.uint32))[:5]
    want = {5: torch.sigmoid, 6: F.silu, 7: F.gelu, 8: lambda t: F.gelu(t, approximate="tanh"), 10: F.elu,
            11: torch.tanh, 12: F.mish, 13: F.softplus}
    # infinities too: SiLU(-inf) = -inf * 0 = nan, as torch's; torch's erf GELU of +inf is nan (its vector
    # form), the reference's and ours inf
    for (code, fn), row in zip(want.items(), b):
        keep = x != np.inf if code == 7 else np.ones(x.shape, bool)
        np.testing.assert_allclose(row[keep], fn(torch.from_numpy(x[keep])).numpy(), rtol=2e-6, atol=2e-6)


def test_exp32_is_within_one_and_a_half_ulps():
    """activations.exp32 (sigmoid, SiLU, ELU) over [-87, 87] against float64 exp: at most 1.5 ulp of the
    float32 result (0.98 measured; Cephes' own form 1.002). A wrong coefficient of q, a dropped Cody-Waite
    term or a shifter rounding folded away by fastmath flags moves it by many ulps."""
    from numba import njit

    @njit(fastmath=A.SPAN_FASTMATH)
    def exps(x):
        y = np.empty_like(x)
        for i in range(x.size):
            y[i] = A.exp32(x[i])
        return y

    x = np.concatenate([np.linspace(-87, 87, 1_000_001), np.float32([-87, 87, 0, -0.0, 1e-30, -1e-30]),
                        (np.arange(-600, 601) * np.log(2) / 2)]).astype(np.float32)   # the rounding's ties
    x = x[np.abs(x) <= 87]
    got = exps(x).astype(np.float64)
    want = np.exp(x.astype(np.float64))
    ulp = np.spacing(want.astype(np.float32)).astype(np.float64)
    err = np.abs(got - want) / ulp
    assert err.max() <= 1.5, (err.max(), x[np.argmax(err)])


def test_gelu_tanh_is_accurate_in_its_negative_tail():
    """GELU(approximate='tanh') and its derivative over [-12, 6] against float64, each value to (2e-6 + 4 ulp x
    |2z|) of itself, z = sqrt(2/pi) (x + 0.044715 x^3) (float32's rounding of the exponent's argument, 2z = -70 at
    x = -9.3, is what e^2z can be off by), or to 1e-35 (the sigmoid is 0 below e^-87 = 1.6e-38, no subnormal
    numbers; the derivative multiplies it by up to 230); the derivative, a sum, to the size of its terms; 0 where
    0.5 (1 + tanh z) < 2^-26 (activations.GELU_TANH_FLUSH: float32's tanh z is -1, PyTorch's GELU 0).
    0.5 x (1 + tanh z) cancels where tanh z is near -1: GELU(-4.32) = -1.363e-5 came out 3% off
    (tests/onnx_graphs.py seed 77022427); the kernels take 0.5 (1 + tanh z) as sigmoid(2z), which does not."""
    x = np.concatenate([np.linspace(-12, 6, 200_001), [-4.3237102, -6.0, -9.0]]).astype(np.float32)
    d = x.astype(np.float64)
    c = np.sqrt(2 / np.pi)
    z2 = 2 * c * (d + 0.044715 * d ** 3)
    with np.errstate(over="ignore"):
        s = 1.0 / (1.0 + np.exp(-z2))
    flush = s < A.GELU_TANH_FLUSH       # float32's tanh z is -1 there: 0, as PyTorch's and ONNX Runtime's
    assert flush.sum() > 1000 and (~flush & (d < -5)).sum() > 1000
    want_y = np.where(flush, 0.0, d * s)
    term = np.where(flush, 0.0, 2 * d * s * (1 - s) * c * (1 + 3 * 0.044715 * d * d))
    want_g = np.where(flush, 0.0, s + term)
    y = x.copy()
    A.apply_span(y, 0, y.size, 8, np.float32(0), np.float32(0))
    dy = np.ones_like(x)
    g = np.empty_like(x)
    A.grad_span(g, dy, x, 8, np.float32(0), np.float32(0))
    rel = 2e-6 + 4 * 2.0 ** -24 * np.abs(z2)
    for got, want, size, what in ((y, want_y, np.abs(want_y), "gelu_tanh"),
                                  (g, want_g, s + np.abs(term), "its derivative")):   # (a sum: to its terms)
        err = np.abs(got.astype(np.float64) - want)
        bad = err > rel * size + 1e-35
        assert not bad.any(), (what, x[bad][:3], got[bad][:3], want[bad][:3])


def test_gelu_erf_is_accurate_in_its_negative_tail():
    """GELU (erf) and its derivative over [-14, 8] against float64 (Phi by erfc, which does not cancel): for x < 0
    each value to 2e-6 of itself plus 4 ulp x x^2 / 2 (float32's rounding of e^(-x^2 / 2)'s argument), for x >= 0
    to 3e-7 x max(1, |value|); 0 below -12.85 (activations._GELU_FAR: the value is above -1e-36). x / 2 (1 +
    erf(x / sqrt 2)) cancels for x < 0: GELU(-5.57) was 9.3e-7 off, 16x its value, and a reciprocal after it a
    factor of 3 (tests/onnx_graphs.py seed 101115614); GELU(-2.9) 6.8e-5 relative. The kernels take Phi from an
    erfc form (activations._phi_lower); the old form fails here from x = -1 down."""
    from scipy.special import erfc
    x = np.concatenate([np.linspace(-14, 8, 220_001), [-3.0, -12.85, -12.8499, -5.5727, -1e-30, 1e-30, 0.0]])
    x = x.astype(np.float32)
    d = x.astype(np.float64)
    phi = np.exp(-d * d / 2) / np.sqrt(2 * np.pi)
    cdf = erfc(-d / np.sqrt(2)) / 2
    zero = x < -A._GELU_FAR
    want_y = np.where(zero, 0.0, d * cdf)
    want_g = np.where(zero, 0.0, cdf + d * phi)
    y = x.copy()
    A.apply_span(y, 0, y.size, 7, np.float32(0), np.float32(0))
    g = np.empty_like(x)
    A.grad_span(g, np.ones_like(x), x, 7, np.float32(0), np.float32(0))
    neg = d < 0
    for got, want, size, what in ((y, want_y, np.abs(want_y), "gelu"),
                                  (g, want_g, cdf + np.abs(d * phi), "its derivative")):   # (a sum: to its terms)
        err = np.abs(got.astype(np.float64) - want)
        tol = np.where(neg, (2e-6 + 4 * 2.0 ** -24 * d * d / 2) * size, 3e-7 * np.maximum(size, 1.0))
        bad = err > tol
        assert not bad.any(), (what, x[bad][:3], got[bad][:3], want[bad][:3])
    assert (y[zero] == 0).all() and (g[zero] == 0).all()
    # the reference (float64, erfc; no flush) agrees with the same values, and with torch in float64
    np.testing.assert_allclose(A.reference("gelu", d), d * cdf, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(A.reference("gelu", d), F.gelu(torch.from_numpy(d)).numpy(), rtol=1e-7, atol=1e-15)
