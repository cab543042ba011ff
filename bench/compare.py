"""Checking that systems agree: a normwise error per output against a dtype-aware tolerance.

The error of `actual` against `expected` is max|actual - expected| / max|expected|: rounding
differences (another summation order, a fused multiply-add) scale with the largest values of
an output, so a relative error per element would flag harmless differences near zero, while a
wrong result (a bug) gives an error of order 1. NaN or infinity where the other is finite, or
a different shape, is an error of infinity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

TOLERANCE_IN_SQRT_EPS = 4.0  # the tolerance is this many times sqrt(eps) of the dtype


def tolerance(dtype: np.dtype) -> float:
    """The largest normwise error accepted for `dtype`: 4 sqrt(eps) (1.4e-3 for float32)."""
    return TOLERANCE_IN_SQRT_EPS * float(np.finfo(dtype).eps) ** 0.5


def normwise_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """max|actual - expected| / max|expected| (the scale is 1 when `expected` is all zero)."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    if actual.shape != expected.shape:
        return float("inf")
    if not np.array_equal(np.isfinite(actual), np.isfinite(expected)):
        return float("inf")
    finite = np.isfinite(expected)
    if not np.array_equal(actual[~finite], expected[~finite]):
        return float("inf")
    if not finite.any():
        return 0.0
    scale = float(np.max(np.abs(expected[finite]))) or 1.0
    return float(np.max(np.abs(actual[finite] - expected[finite]))) / scale


@dataclass(frozen=True)
class Agreement:
    """How far `actual` is from `expected` on one output (`output` names it)."""

    actual: str
    expected: str
    output: str
    error: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.error <= self.tolerance

    def describe(self) -> str:
        verdict = "<=" if self.ok else ">"
        return (
            f"{self.actual} vs {self.expected} on {self.output}: normwise error "
            f"{self.error:.2e} {verdict} tolerance {self.tolerance:.2e}"
        )


def agreements(
    actual: tuple[str, Sequence[np.ndarray]],
    expected: tuple[str, Sequence[np.ndarray]],
    output_names: Sequence[str],
) -> list[Agreement]:
    """One Agreement per output of two systems' (name, outputs)."""
    (actual_name, actual_outputs), (expected_name, expected_outputs) = actual, expected
    if len(actual_outputs) != len(expected_outputs):
        raise ValueError(
            f"{actual_name} returned {len(actual_outputs)} outputs, {expected_name} "
            f"{len(expected_outputs)}"
        )
    return [
        Agreement(
            actual_name,
            expected_name,
            name,
            normwise_error(a, e),
            tolerance(np.asarray(e).dtype),
        )
        for name, a, e in zip(output_names, actual_outputs, expected_outputs, strict=True)
    ]
