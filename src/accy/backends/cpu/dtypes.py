"""How each accy dtype looks in C: the type in memory, the type computed in, and conversions.

16-bit floats are computed in `float` and rounded back after every operation, as the reference
evaluator rounds every result: `f16` is C's `_Float16`, `bf16` the upper half of a float32 held
in a `uint16_t`. `bool` is one byte in memory (0 or 1) and an `int` in expressions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...ops.elementwise import round_to_bf16
from ...types import DType, bf16, bool_, f16, f32, f64, i32, i64, u8


@dataclass(frozen=True)
class CType:
    """A dtype in C. `load`, `store` and `round` are templates over `{x}`."""

    storage: str
    compute: str
    family: str  # float, signed, unsigned or bool: selects a template in `templates`
    suffix: str  # of C's math functions: expf for float, exp for double
    load: str = "{x}"
    store: str = "{x}"
    round: str = "{x}"


C_TYPES: dict[DType, CType] = {
    f32: CType("float", "float", "float", "f"),
    f64: CType("double", "double", "float", ""),
    f16: CType(
        "_Float16", "float", "float", "f", "(float){x}", "(_Float16){x}", "accy_cpu_round_f16({x})"
    ),
    bf16: CType(
        "uint16_t",
        "float",
        "float",
        "f",
        "accy_cpu_bf16_load({x})",
        "accy_cpu_bf16_store({x})",
        "accy_cpu_round_bf16({x})",
    ),
    i32: CType("int32_t", "int32_t", "signed", ""),
    i64: CType("int64_t", "int64_t", "signed", ""),
    u8: CType("uint8_t", "uint8_t", "unsigned", ""),
    bool_: CType("uint8_t", "int", "bool", "", "({x} != 0)", "(uint8_t){x}"),
}


def c_type(dtype: DType) -> CType:
    """The C description of `dtype`.

    >>> from accy import bf16
    >>> c_type(bf16).storage, c_type(bf16).compute
    ('uint16_t', 'float')
    """
    return C_TYPES[dtype]


def _float_literal(value: float, dtype: DType) -> str:
    # Rounded to the dtype first, as the reference evaluator does: beyond its range is ±inf.
    with np.errstate(over="ignore"):
        if dtype == f16:
            value = float(np.float16(value))
        elif dtype == bf16:
            value = float(round_to_bf16(np.array([value], np.float32))[0])
        elif dtype != f64:
            value = float(np.float32(value))
    if math.isnan(value):
        return "NAN"
    if math.isinf(value):
        return "INFINITY" if value > 0 else "(-INFINITY)"
    text = repr(value) if dtype == f64 else repr(value) + "f"
    return f"({text})" if text.startswith("-") else text


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
