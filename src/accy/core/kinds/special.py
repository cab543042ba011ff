"""Special functions for the reference evaluator: erf, erfc, erf_inv, lgamma, digamma, trigamma.

NumPy has none of them. erf, erfc and lgamma are Python's `math` functions applied element by
element (correctly rounded or nearly, in double precision). erf_inv, digamma and trigamma are
the algorithms that the generated C runs (`accy.codegen.c.prelude`), written over NumPy arrays
in double precision, so that backends and reference agree to rounding: every function is
computed in float64 and rounded to the operand's dtype, on every target.

- `erf_inv`: Giles' single-precision approximation ("Approximating the erfinv function", GPU
  Computing Gems, 2011), then two Newton steps on erf in double precision; -1 and 1 give
  -inf and inf, outside [-1, 1] NaN.
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
            return np.asarray(function(x.astype(np.float64))).astype(x.dtype)

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


@_in_double
def erf(x: np.ndarray) -> np.ndarray:
    """The error function.

    >>> erf(np.array([0.0, 1.0, -np.inf])).round(6).tolist()
    [0.0, 0.842701, -1.0]
    """
    return _math(math.erf)(x)


@_in_double
def erfc(x: np.ndarray) -> np.ndarray:
    """1 - erf(x), accurate where erf(x) is close to 1.

    >>> float(erfc(np.array(10.0)))
    2.088487583762545e-45
    """
    return _math(math.erfc)(x)


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
def erf_inv(x: np.ndarray) -> np.ndarray:
    """The inverse of erf on [-1, 1].

    >>> erf_inv(np.array([0.0, 0.5, 1.0, 2.0])).round(6).tolist()
    [0.0, 0.476936, inf, nan]
    """
    inside = np.abs(x) < 1.0
    y = _erf_inv_guess(np.where(inside, x, 0.0))
    for _ in range(2):  # Newton's method on erf(y) = x
        y = y - (_math(math.erf)(y) - x) / (TWO_OVER_SQRT_PI * np.exp(-y * y))
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
