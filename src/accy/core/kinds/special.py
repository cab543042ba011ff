"""Special functions for the reference evaluator: erf, erfc, erf_inv, lgamma, digamma, trigamma.

NumPy has none of them. Every function is computed in float64 over whole arrays and rounded to
the operand's dtype, on every target. The reference evaluator runs the random draws of
`accy.nn.init` (a normal or truncated-normal draw is erf_inv of a uniform one, and erf_inv's
Newton steps evaluate erf), so erf must be vectorised: with one Python call per element, erf
took a quarter of the time that initialising GPT-2 small takes. erf, erfc and erf_inv run
over blocks of `BLOCK` elements, whose temporaries stay in the processor's cache.

- `erf`, `erfc`: fdlibm's rational approximations (Sun's `s_erf.c`, 1993, as in FreeBSD's
  msun, musl and Go's `math`), written over NumPy arrays: five ranges of |x|, split where
  fdlibm splits them (on the high 32 bits of the double). erf is within 1 ulp of the exact
  value, erfc within 2.2 (both measured against mpmath); against glibc's (Python's `math.erf`,
  `math.erfc`) they differ by at most 1 and 2 ulp, and erfc by up to 4 between 0.84375 and
  1.25, where glibc's own error reaches 3.5 ulp.
- `lgamma`: Python's `math.lgamma` element by element (nearly correctly rounded; nothing
  draws through it, so its speed does not matter).
- `erf_inv`: Giles' single-precision approximation ("Approximating the erfinv function", GPU
  Computing Gems, 2011), then two Newton steps on erf in double precision; -1 and 1 give
  -inf and inf, outside [-1, 1] NaN. The generated C runs the same algorithm
  (`accy.codegen.c.prelude`), so backends and reference agree to rounding.
- `digamma`: the reflection formula below 1/2, the recurrence psi(x) = psi(x + 1) - 1/x up to
  10, then the asymptotic series (error below 1e-14 there); NaN at the poles (0, -1, -2, ...).
- `trigamma` (the derivative of digamma): the same three steps; NaN at the poles.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ...errors import AccyError

TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
HALF_SQRT_PI = math.sqrt(math.pi) / 2.0
ASYMPTOTIC_FROM = 10.0  # digamma and trigamma recur up to here, then use their series


def _in_double(function: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """`function` computed on float64 and rounded back to the operand's dtype."""

    def apply(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        with np.errstate(all="ignore"):
            result = np.asarray(function(x.astype(np.float64, copy=False)))
            return result.astype(x.dtype, copy=False)

    apply.__doc__ = function.__doc__
    return apply


def _math(function: Callable[[float], float]) -> Callable[[np.ndarray], np.ndarray]:
    vectorized = np.frompyfunc(function, 1, 1)
    return lambda x: np.asarray(vectorized(x), np.float64)


def _lgamma_scalar(x: float) -> float:
    try:
        return math.lgamma(x)
    except ValueError:  # the poles 0, -1, -2, ...
        return math.inf


# fdlibm's coefficients (s_erf.c), each tuple from the constant term up.
ERX = 8.45062911510467529297e-01  # erf(1) rounded to 24 bits: the fit near 1 is erf - ERX
EFX = 1.28379167095512586316e-01  # 2 / sqrt(pi) - 1: erf(x) = x + EFX x below 2**-28
EFX8 = 1.02703333676410069053e00  # 8 EFX, for subnormal x (EFX x alone would lose bits)
# erf(x) = x + x P(x^2) / Q(x^2) for |x| < 0.84375
SMALL_P = (
    1.28379167095512558561e-01,
    -3.25042107247001499370e-01,
    -2.84817495755985104766e-02,
    -5.77027029648944159157e-03,
    -2.37630166566501626084e-05,
)
SMALL_Q = (
    1.0,
    3.97917223959155352819e-01,
    6.50222499887672944485e-02,
    5.08130628187576562776e-03,
    1.32494738004321644526e-04,
    -3.96022827877536812320e-06,
)
# erf(1 + s) = ERX + P(s) / Q(s) for 0.84375 <= |x| < 1.25
NEAR_ONE_P = (
    -2.36211856075265944077e-03,
    4.14856118683748331666e-01,
    -3.72207876035701323847e-01,
    3.18346619901161753674e-01,
    -1.10894694282396677476e-01,
    3.54783043256182359371e-02,
    -2.16637559486879084300e-03,
)
NEAR_ONE_Q = (
    1.0,
    1.06420880400844228286e-01,
    5.40397917702171048937e-01,
    7.18286544141962662868e-02,
    1.26171219808761642112e-01,
    1.36370839120290507362e-02,
    1.19844998467991074170e-02,
)
# erfc(x) = exp(-x^2 - 0.5625 + R(1/x^2) / S(1/x^2)) / x for 1.25 <= x < 1/0.35
MIDDLE_R = (
    -9.86494403484714822705e-03,
    -6.93858572707181764372e-01,
    -1.05586262253232909814e01,
    -6.23753324503260060396e01,
    -1.62396669462573470355e02,
    -1.84605092906711035994e02,
    -8.12874355063065934246e01,
    -9.81432934416914548592e00,
)
MIDDLE_S = (
    1.0,
    1.96512716674392571292e01,
    1.37657754143519042600e02,
    4.34565877475229228821e02,
    6.45387271733267880336e02,
    4.29008140027567833386e02,
    1.08635005541779435134e02,
    6.57024977031928170135e00,
    -6.04244152148580987438e-02,
)
# the same form for 1/0.35 <= x < 28
FAR_R = (
    -9.86494292470009928597e-03,
    -7.99283237680523006574e-01,
    -1.77579549177547519889e01,
    -1.60636384855821916062e02,
    -6.37566443368389627722e02,
    -1.02509513161107724954e03,
    -4.83519191608651397019e02,
)
FAR_S = (
    1.0,
    3.03380607434824582924e01,
    3.25792512996573918826e02,
    1.53672958608443695994e03,
    3.19985821950859553908e03,
    2.55305040643316442583e03,
    4.74528541206955367215e02,
    -2.24409524465858183362e01,
)

# The ranges, as fdlibm draws them: bounds on the high 32 bits of |x| (sign cleared).
TINY_SUBNORMAL = 0x00800000  # |x| < 2**-1015: EFX8 scaling keeps the product's bits
TINY_FOR_ERF = 0x3E300000  # |x| < 2**-28: erf(x) = x + EFX x
TINY_FOR_ERFC = 0x3C700000  # |x| < 2**-56: erfc(x) = 1 - x
SMALL = 0x3FEB0000  # |x| < 0.84375
NEAR_ONE = 0x3FF40000  # |x| < 1.25
MIDDLE_FOR_ERF = 0x4006DB6E  # |x| < 1/0.35 (erfc's bound is one below, as fdlibm's)
MIDDLE_FOR_ERFC = 0x4006DB6D
SATURATED_ERF = 0x40180000  # |x| >= 6: erf(x) rounds to sign(x), erfc(-x) to 2
SATURATED_ERFC = 0x403C0000  # x >= 28: erfc(x) underflows to 0


BLOCK = 1 << 14  # elements per block: a block's temporaries stay in the processor's cache


def _blockwise(function: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """`function` of a flat float64 array, applied block by block over an array of any shape.
    The branches' masks, gathers and polynomials are a few dozen passes over their operand:
    over cache-sized blocks they run several times faster than over a whole large array."""

    def apply(x: np.ndarray) -> np.ndarray:
        flat = np.ravel(x)
        if flat.size <= BLOCK:
            return function(flat).reshape(np.shape(x))
        result = np.empty_like(flat)
        for start in range(0, flat.size, BLOCK):
            result[start : start + BLOCK] = function(flat[start : start + BLOCK])
        return result.reshape(np.shape(x))

    apply.__doc__ = function.__doc__
    return apply


def _horner(t: np.ndarray, coefficients: tuple[float, ...]) -> np.ndarray:
    """The polynomial with `coefficients` (constant term first) at t, nested as fdlibm's."""
    total = np.full_like(t, coefficients[-1])
    for c in reversed(coefficients[:-1]):
        total *= t
        total += c
    return total


def _high_words(x: np.ndarray) -> np.ndarray:
    """The high 32 bits of each |x| (exponent and the top of the mantissa), the word that
    fdlibm compares against its range bounds."""
    return np.abs(x).view(np.uint64) >> np.uint64(32)


def _low_word_cleared(x: np.ndarray) -> np.ndarray:
    """x with the low 32 bits of its mantissa zeroed: 21 significant bits, so x * x is exact."""
    return (x.view(np.uint64) & np.uint64(0xFFFFFFFF00000000)).view(np.float64)


def _fill(
    result: np.ndarray,
    x: np.ndarray,
    where: np.ndarray,
    formula: Callable[[np.ndarray], np.ndarray],
) -> None:
    """result[where] = formula(x[where]), through an index array: a boolean mask's gather and
    scatter branch on every element, and on ranges that interleave (as a normal draw's do)
    they run several times slower than flatnonzero and integer indexing."""
    index = np.flatnonzero(where)
    if index.size:
        result[index] = formula(x[index])


def _small_ratio(x: np.ndarray) -> np.ndarray:
    """P/Q with erf(x) = x + x P/Q for |x| < 0.84375."""
    z = x * x
    return _horner(z, SMALL_P) / _horner(z, SMALL_Q)


def _near_one_ratio(x: np.ndarray) -> np.ndarray:
    """P/Q with erf(|x|) = ERX + P/Q for 0.84375 <= |x| < 1.25."""
    s = np.abs(x) - 1.0
    return _horner(s, NEAR_ONE_P) / _horner(s, NEAR_ONE_Q)


def _tail_exponent(t: np.ndarray, far: bool) -> np.ndarray:
    """R/S with erfc(x) = exp(-x^2 - 0.5625 + R/S) / x, t = 1/x^2, for 1.25 <= x < 1/0.35
    or (`far`) 1/0.35 <= x < 28."""
    if far:
        return _horner(t, FAR_R) / _horner(t, FAR_S)
    return _horner(t, MIDDLE_R) / _horner(t, MIDDLE_S)


def _erfc_tail(x: np.ndarray, far_from: int) -> np.ndarray:
    """erfc(|x|) for 1.25 <= |x| < 28, the second fit from the high word `far_from` on.

    exp(-x^2) is split as exp(-z^2) exp((z - x)(z + x)) with z = x cut to its high 32 bits:
    z^2 is then exact, and the small second factor carries the rounding error of x^2 that a
    plain exp(-x * x) would multiply up to many ulp in erfc's tail."""
    ax = np.abs(x)
    t = 1.0 / (ax * ax)
    far = _high_words(ax) >= far_from
    ratio = np.empty_like(ax)
    _fill(ratio, t, far, lambda v: _tail_exponent(v, far=True))
    _fill(ratio, t, ~far, lambda v: _tail_exponent(v, far=False))
    z = _low_word_cleared(ax)
    return np.exp(-z * z - 0.5625) * np.exp((z - ax) * (z + ax) + ratio) / ax


def _erf_tiny(x: np.ndarray) -> np.ndarray:
    """erf(x) for |x| < 2**-28: x + EFX x, scaled by 8 for subnormal x (where EFX x alone
    would lose bits)."""
    subnormal = _high_words(x) < TINY_SUBNORMAL
    return np.where(subnormal, 0.125 * (8.0 * x + EFX8 * x), x + EFX * x)


@_blockwise
def _erf(x: np.ndarray) -> np.ndarray:
    """erf over a flat float64 array (fdlibm's algorithm); the body of `erf` and of erf_inv's
    Newton steps. erf(-x) = -erf(x), so each range computes erf(|x|) and copies x's sign."""
    high = _high_words(x)
    result = np.copysign(1.0, x)  # |x| >= 6 and the infinities; the other ranges overwrite
    _fill(result, x, high < SMALL, lambda v: v + v * _small_ratio(v))
    _fill(result, x, high < TINY_FOR_ERF, _erf_tiny)  # within the small range: overwrites it
    near_one = (high >= SMALL) & (high < NEAR_ONE)
    _fill(result, x, near_one, lambda v: np.copysign(ERX + _near_one_ratio(v), v))
    middle = (high >= NEAR_ONE) & (high < SATURATED_ERF)
    _fill(result, x, middle, lambda v: np.copysign(1.0 - _erfc_tail(v, MIDDLE_FOR_ERF), v))
    _fill(result, x, np.isnan(x), lambda v: v)
    return result


def _erfc_small_below_quarter(x: np.ndarray) -> np.ndarray:
    return 1.0 - (x + x * _small_ratio(x))


def _erfc_small_from_quarter(x: np.ndarray) -> np.ndarray:
    # erf(x) > 0.27 here: 1 - (x + x R) would round x + x R first and lose bits of x R.
    return 0.5 - (x * _small_ratio(x) + (x - 0.5))


@_blockwise
def _erfc(x: np.ndarray) -> np.ndarray:
    """erfc over a flat float64 array (fdlibm's algorithm); erfc(-x) = 2 - erfc(x)."""
    high = _high_words(x)
    positive = x > 0.0
    result = 2.0 * ~positive  # x >= 28 gives 0 and x <= -6 gives 2; the other ranges overwrite
    small = high < SMALL
    _fill(result, x, small & (x < 0.25), _erfc_small_below_quarter)
    _fill(result, x, small & (x >= 0.25), _erfc_small_from_quarter)
    _fill(result, x, high < TINY_FOR_ERFC, lambda v: 1.0 - v)  # within the small range
    near_one = (high >= SMALL) & (high < NEAR_ONE)
    _fill(result, x, near_one & positive, lambda v: (1.0 - ERX) - _near_one_ratio(v))
    _fill(result, x, near_one & ~positive, lambda v: 1.0 + (ERX + _near_one_ratio(v)))
    middle = high >= NEAR_ONE
    right = middle & positive & (high < SATURATED_ERFC)
    _fill(result, x, right, lambda v: _erfc_tail(v, MIDDLE_FOR_ERFC))
    left = middle & ~positive & (high < SATURATED_ERF)
    _fill(result, x, left, lambda v: 2.0 - _erfc_tail(v, MIDDLE_FOR_ERFC))
    _fill(result, x, np.isnan(x), lambda v: v)
    return result


@_in_double
def erf(x: np.ndarray) -> np.ndarray:
    """The error function, 2/sqrt(pi) times the integral of exp(-t^2) from 0 to x.

    >>> erf(np.array([0.0, 1.0, -np.inf])).round(6).tolist()
    [0.0, 0.842701, -1.0]
    >>> erf(np.array([0.5, -2.0], np.float32))
    array([ 0.5204999, -0.9953223], dtype=float32)
    """
    return _erf(x)


@_in_double
def erfc(x: np.ndarray) -> np.ndarray:
    """1 - erf(x), accurate where erf(x) is close to 1.

    >>> f"{float(erfc(np.array(10.0))):.12e}"  # 1 - erf(10) would round to 0
    '2.088487583763e-45'
    >>> erfc(np.array([-np.inf, 0.0, 30.0, np.nan])).tolist()
    [2.0, 1.0, 0.0, nan]
    """
    return _erfc(x)


@_in_double
def lgamma(x: np.ndarray) -> np.ndarray:
    """log |Gamma(x)|; inf at the poles.

    >>> lgamma(np.array([1.0, 0.5, 0.0])).round(6).tolist()
    [0.0, 0.572365, inf]
    """
    return _math(_lgamma_scalar)(x)


def _erf_inv_guess(x: np.ndarray) -> np.ndarray:
    """Giles' single-precision approximation of erf_inv (relative error about 1e-7)."""
    w = -np.log((1.0 - x) * (1.0 + x))
    central, tail = w - 2.5, np.sqrt(w) - 3.0
    p = np.full_like(x, 2.81022636e-08)
    for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503):
        p = c + p * central
    for c in (-0.00417768164, 0.246640727, 1.50140941):
        p = c + p * central
    q = np.full_like(x, -0.000200214257)
    for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613):
        q = c + q * tail
    for c in (0.00943887047, 1.00167406, 2.83297682):
        q = c + q * tail
    return np.where(w < 5.0, p, q) * x


@_in_double
@_blockwise
def erf_inv(x: np.ndarray) -> np.ndarray:
    """The inverse of erf on [-1, 1].

    >>> erf_inv(np.array([0.0, 0.5, 1.0, 2.0])).round(6).tolist()
    [0.0, 0.476936, inf, nan]
    """
    inside = np.abs(x) < 1.0
    y = _erf_inv_guess(np.where(inside, x, 0.0))
    for _ in range(2):  # Newton's method on erf(y) = x
        y = y - (_erf(y) - x) / (TWO_OVER_SQRT_PI * np.exp(-y * y))
    edge = np.where(np.abs(x) == 1.0, np.copysign(np.inf, x), np.nan)
    return np.where(inside, y, edge)


def _poles(x: np.ndarray) -> np.ndarray:
    return (x <= 0.0) & (x == np.floor(x))


def _recur(x: np.ndarray, term: Callable[[np.ndarray], np.ndarray]):
    """(x moved up to at least ASYMPTOTIC_FROM, the sum of `term` over the steps), elementwise
    and in the order the C loop adds them."""
    total = np.zeros_like(x)
    while True:
        below = x < ASYMPTOTIC_FROM
        if not below.any():
            return x, total
        total = np.where(below, total + term(np.where(below, x, 1.0)), total)
        x = np.where(below, x + 1.0, x)


@_in_double
def digamma(x: np.ndarray) -> np.ndarray:
    """The logarithmic derivative of Gamma; NaN at the poles.

    >>> digamma(np.array([1.0, 0.5, 0.0])).round(6).tolist()
    [-0.577216, -1.96351, nan]
    """
    original = x
    reflect = x < 0.5
    shift = np.where(reflect, -np.pi / np.tan(np.pi * x), 0.0)
    x = np.where(reflect, 1.0 - x, x)
    x, steps = _recur(np.where(np.isnan(x), ASYMPTOTIC_FROM, x), lambda v: 1.0 / v)
    r = 1.0 / (x * x)
    series = r * (1 / 12 - r * (1 / 120 - r * (1 / 252 - r * (1 / 240 - r * (1 / 132)))))
    result = shift - steps + (np.log(x) - 0.5 / x - series)
    return np.where(_poles(original) | np.isnan(original), np.nan, result)


@_in_double
def trigamma(x: np.ndarray) -> np.ndarray:
    """The derivative of digamma; NaN at the poles.

    >>> trigamma(np.array([1.0, 0.5])).round(6).tolist()  # pi^2 / 6, pi^2 / 2
    [1.644934, 4.934802]
    """
    original = x
    reflect = x < 0.5
    s = np.sin(np.pi * x)
    shift = np.where(reflect, np.pi * np.pi / (s * s), 0.0)
    sign = np.where(reflect, -1.0, 1.0)
    x = np.where(reflect, 1.0 - x, x)
    x, steps = _recur(np.where(np.isnan(x), ASYMPTOTIC_FROM, x), lambda v: 1.0 / (v * v))
    r = 1.0 / (x * x)
    series = (1.0 / x) * r * (1 / 6 - r * (1 / 30 - r * (1 / 42 - r * (1 / 30 - r * (5 / 66)))))
    result = shift + sign * (steps + (1.0 / x + 0.5 * r + series))
    return np.where(_poles(original) | np.isnan(original), np.nan, result)


def no_tangent(name: str):
    """A tangent rule that says the derivative of `name` is not available."""

    def tangent(e, t, x, y):
        raise AccyError(f"the derivative of {name} (a higher polygamma) is not implemented")

    return tangent
