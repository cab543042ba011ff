"""Constants in C: a value as a literal of a dtype's compute type, and the bounds of a dtype.

Infinities and NaN are C99's `INFINITY` and `NAN`, and the most negative int64 is `INT64_MIN`
(its digits would negate an overflowing literal); every target's prelude defines them.
"""

from __future__ import annotations

import math

import numpy as np

from ...core.types import DType, bf16, bool_, f64, i64, round_to_bf16


def _float_literal(value: float, dtype: DType) -> str:
    value = _rounded_to(value, dtype)
    if math.isnan(value):
        return "NAN"
    if math.isinf(value):
        return "INFINITY" if value > 0 else "(-INFINITY)"
    text = repr(value) if dtype == f64 else repr(value) + "f"
    return f"({text})" if text.startswith("-") else text


def _rounded_to(value: float, dtype: DType) -> float:
    # Out of range becomes an infinity, as in the reference evaluator: not worth a warning.
    with np.errstate(over="ignore"):
        if dtype == bf16:
            return float(round_to_bf16(np.array([value], np.float32))[0])
        return float(np.array(value).astype(dtype.numpy))


def _int_literal(value: int, dtype: DType) -> str:
    if dtype == i64 and value == -(2**63):
        return "INT64_MIN"
    suffix = "LL" if dtype == i64 else ""
    return f"({value}{suffix})" if value < 0 else f"{value}{suffix}"


def literal(value, dtype: DType) -> str:
    """`value` as a C constant of `dtype`'s compute type, rounded to `dtype` (a float beyond
    its range is infinite, as in the reference evaluator).

    >>> from accy import f16, f32, f64, i64
    >>> literal(0.1, f32), literal(0.1, f64), literal(-1, i64), literal(float("-inf"), f32)
    ('0.10000000149011612f', '0.1', '(-1LL)', '(-INFINITY)')
    >>> literal(1e39, f32), literal(-1e9, f16)
    ('INFINITY', '(-INFINITY)')
    """
    if dtype.is_float:
        return _float_literal(float(value), dtype)
    if dtype == bool_:
        return "1" if value else "0"
    return _int_literal(int(value), dtype)


def lowest(dtype: DType) -> str:
    """The identity of max in `dtype`'s compute type."""
    if dtype.is_float:
        return "(-INFINITY)"
    if dtype == bool_:
        return "0"
    return literal(int(np.iinfo(dtype.numpy).min), dtype)


def highest(dtype: DType) -> str:
    """The identity of min in `dtype`'s compute type."""
    if dtype.is_float:
        return "INFINITY"
    if dtype == bool_:
        return "1"
    return literal(int(np.iinfo(dtype.numpy).max), dtype)
