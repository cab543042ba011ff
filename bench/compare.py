"""Checking that systems agree: a normwise error per output against a dtype-aware tolerance.

The error of `actual` against `expected` is max|actual - expected| / max|expected|: rounding
differences (another summation order, a fused multiply-add) scale with the largest values of
an output, so a relative error per element would flag harmless differences near zero, while a
wrong result (a bug) gives an error of order 1. NaN or infinity where the other is finite, or
a different shape, is an error of infinity.

The tolerance follows the precision the workload runs in (not an output's dtype: an f32 loss
summed from bf16 values carries bf16's errors):
- float32 (and float64): 4 sqrt(eps), 1.4e-3 for float32.
- bfloat16 and float16: 16 u, where u = eps / 2 is the unit roundoff (bf16: 2^-8, so 6.25%;
  f16: 2^-11). Each bf16 value a loss and its gradient pass through is rounded once, with a
  relative error of at most u, and correct implementations round in different places (PyTorch
  rounds a product to bf16 where accy and JAX keep the f32 sum; its layer norm rounds once
  where a composition rounds each step). The longest chains of roundings in these workloads
  are about 8 deep (forward and backward), each error carried with a factor of order one, and
  the errors of two implementations add: 2 x 8 u. Measured (seeds 0-7 at the check scale
  against float64 of the same computation, and at the CPU scale between systems): at most
  5 u. A wrong result is still an error of order one, 16 times this tolerance or more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import ml_dtypes
import numpy as np

TOLERANCE_IN_SQRT_EPS = 4.0  # float32/float64: this many times sqrt(eps) of the dtype
HALF_TOLERANCE_IN_ROUNDOFF = 16.0  # bfloat16/float16: this many unit roundoffs (eps / 2)
PRECISIONS = {"f32": np.dtype(np.float32), "bf16": np.dtype(ml_dtypes.bfloat16)}


def tolerance(dtype: np.dtype | str) -> float:
    """The largest normwise error accepted for results computed in `dtype` (a NumPy dtype or
    "f32"/"bf16"): 4 sqrt(eps) for float32 (1.4e-3), 16 unit roundoffs for bfloat16 (2^-4)
    and float16 (2^-7).

    >>> tolerance("bf16"), round(tolerance("f32"), 6)
    (0.0625, 0.001381)
    """
    dtype = PRECISIONS[dtype] if isinstance(dtype, str) else np.dtype(dtype)
    eps = float(ml_dtypes.finfo(dtype).eps)
    if dtype.itemsize <= 2:
        return HALF_TOLERANCE_IN_ROUNDOFF * eps / 2
    return TOLERANCE_IN_SQRT_EPS * eps**0.5


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
    precision: str | None = None,
) -> list[Agreement]:
    """One Agreement per output of two systems' (name, outputs), each against the tolerance of
    `precision` ("f32", "bf16"), or by default of the expected output's dtype."""
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
            tolerance(precision or np.asarray(e).dtype),
        )
        for name, a, e in zip(output_names, actual_outputs, expected_outputs, strict=True)
    ]
