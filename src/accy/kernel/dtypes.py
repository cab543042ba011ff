"""How each accy dtype lives in generated C and CUDA C: in memory, in registers, as a literal.

f16 and bf16 are stored as their 16 raw bits (`unsigned short`) and computed in `float`; every
result is rounded back to the dtype's precision, so that a kernel gives NumPy's float16 answers.
bool is a byte holding 0 or 1. Generated code uses only built-in C types, which NVRTC (which has
no standard headers) and gcc read alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.types import DType, bf16, bool_, f16, f32, f64, i32, i64, round_to_bf16, u8
from .errors import KernelError


@dataclass(frozen=True)
class CType:
    """One dtype in generated code. Templates take the operand as `{x}`."""

    storage: str  # element type of a buffer
    compute: str  # type of a value held in a variable
    family: str  # picks the op templates: "f32", "f64", "signed", "unsigned" or "bool"
    storage_numpy: np.dtype  # NumPy dtype of a raw buffer element
    load: str = "{x}"  # buffer element -> value
    store: str = "{x}"  # value -> buffer element
    round: str = "{x}"  # rounds a computed value to the dtype's precision
    unsigned: str = ""  # unsigned type of the same width, for wrapping integer arithmetic

    @property
    def math_suffix(self) -> str:
        """`expf` for float values, `exp` for double: the suffix of C's math functions."""
        return "f" if self.compute == "float" else ""


_U16 = np.dtype(np.uint16)

C_TYPES: dict[DType, CType] = {
    f32: CType("float", "float", "f32", np.dtype(np.float32)),
    f64: CType("double", "double", "f64", np.dtype(np.float64)),
    f16: CType(
        "unsigned short",
        "float",
        "f32",
        _U16,
        load="accy_f16_to_f32({x})",
        store="accy_f32_to_f16({x})",
        round="accy_round_f16({x})",
    ),
    bf16: CType(
        "unsigned short",
        "float",
        "f32",
        _U16,
        load="accy_bf16_to_f32({x})",
        store="accy_f32_to_bf16({x})",
        round="accy_round_bf16({x})",
    ),
    i32: CType("int", "int", "signed", np.dtype(np.int32), unsigned="unsigned int"),
    i64: CType(
        "long long", "long long", "signed", np.dtype(np.int64), unsigned="unsigned long long"
    ),
    # u8 arithmetic happens in unsigned int and is cut back to a byte, which wraps like NumPy.
    u8: CType(
        "unsigned char", "unsigned char", "unsigned", np.dtype(np.uint8), unsigned="unsigned int"
    ),
    bool_: CType(
        "unsigned char",
        "unsigned char",
        "bool",
        np.dtype(np.uint8),
        load="(unsigned char)({x} != 0)",
    ),
}


def c_type(dtype: DType) -> CType:
    """The C representation of `dtype`.

    >>> import accy
    >>> accy.kernel.dtypes.c_type(accy.f16).storage
    'unsigned short'
    """
    if dtype not in C_TYPES:
        raise KernelError(f"dtype {dtype!r} has no kernel representation; use one of {_names()}")
    return C_TYPES[dtype]


def c_storage_type(dtype: DType) -> str:
    """The C element type of a kernel buffer of `dtype` (what a caller's pointer points to).

    >>> import accy
    >>> accy.kernel.c_storage_type(accy.i64)
    'long long'
    """
    return c_type(dtype).storage


def _names() -> str:
    return ", ".join(d.name for d in C_TYPES)


# ---------------------------------------------------------------------------------------------
# literals


def literal(value: float | int | bool, dtype: DType) -> str:
    """A C expression of type `dtype`'s compute type holding `value` (rounded to `dtype` first).

    >>> import accy
    >>> accy.kernel.dtypes.literal(0.5, accy.f32)
    '0.5f'
    """
    check_representable(value, dtype)
    family = c_type(dtype).family
    return _LITERALS[family](value, dtype)


def check_representable(value: float | int | bool, dtype: DType) -> None:
    """Reject constants that would silently change: 0.5 as an int, 300 as a u8, 2 as a bool.

    >>> import accy
    >>> check_representable(300, accy.u8)
    Traceback (most recent call last):
    ...
    accy.kernel.errors.KernelError: constant 300 is outside the range of u8 [0, 255]
    """
    if not isinstance(value, int | float | bool | np.number | np.bool_):
        raise KernelError(f"a kernel constant must be a Python number, got {value!r}")
    if dtype.is_float:
        return
    if isinstance(value, float | np.floating) and not float(value).is_integer():
        raise KernelError(f"constant {value!r} is not an integer, so it cannot be a {dtype.name}")
    info = (0, 1) if dtype == bool_ else np.iinfo(dtype.numpy)
    low, high = (0, 1) if dtype == bool_ else (info.min, info.max)
    if not low <= int(value) <= high:
        raise KernelError(
            f"constant {value!r} is outside the range of {dtype.name} [{low}, {high}]"
        )


def _float_literal(value: float | int | bool, dtype: DType) -> str:
    rounded = _rounded_to(float(value), dtype)
    width = "F32" if c_type(dtype).compute == "float" else "F64"
    if math.isnan(rounded):
        return f"ACCY_NAN_{width}"
    if math.isinf(rounded):
        return f"(-ACCY_INF_{width})" if rounded < 0 else f"ACCY_INF_{width}"
    # repr round-trips a double exactly; a float-rounded value reads back as the same float.
    return f"{rounded!r}{c_type(dtype).math_suffix}"


def _rounded_to(value: float, dtype: DType) -> float:
    if dtype == bf16:
        return float(round_to_bf16(np.array([value], np.float32))[0])
    # Out-of-range values become inf, as a cast in C would make them; that is not worth a warning.
    with np.errstate(over="ignore"):
        return float(np.array(value).astype(dtype.numpy))


def _int_literal(value: float | int | bool, dtype: DType) -> str:
    number = int(value)
    ctype = c_type(dtype).compute
    # The most negative long long has no literal: -9223372036854775808 would negate an overflow.
    if number == -(2**63):
        return f"(({ctype})(-9223372036854775807LL - 1LL))"
    return f"(({ctype}){number}LL)"


_LITERALS = {
    "f32": _float_literal,
    "f64": _float_literal,
    "signed": _int_literal,
    "unsigned": _int_literal,
    "bool": _int_literal,
}
