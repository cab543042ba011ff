"""How each accy dtype looks in C: the type in memory, the type computed in, and conversions.

16-bit floats are computed in `float` and rounded back after every operation, as the reference
evaluator rounds every result. `bf16` is the upper half of a float32 held in a `uint16_t`;
`f16` is a target's own half type (`half_types`): C's `_Float16` for gcc, a two-byte struct on
CUDA, each converting to and from float with one correct rounding. `bool` is one byte in memory
(0 or 1) and an `int` in expressions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...core.types import DType, bf16, bool_, f16, f32, f64, i32, i64, u8


@dataclass(frozen=True)
class CType:
    """A dtype in C. `load`, `store`, `round` and `convert` are templates over `{x}`."""

    storage: str
    compute: str
    family: str  # float, signed, unsigned or bool: selects a template in `templates`
    suffix: str  # of C's math functions: expf for float, exp for double
    load: str = "{x}"
    store: str = "{x}"
    round: str = "{x}"
    convert: str = ""  # a value of another dtype into this one; default: a cast to `compute`
    unsigned: str = ""  # the unsigned type of a signed integer's width, for wrapping arithmetic


def half_type(storage: str) -> CType:
    """f16 stored as the target's half type `storage`; conversions go straight to it, since a
    detour through float would round twice."""
    return CType(
        storage,
        "float",
        "float",
        "f",
        load="(float){x}",
        store=f"({storage}){{x}}",
        round="accy_round_f16({x})",
        convert=f"({storage})({{x}})",
    )


def c_types(half: str) -> dict[DType, CType]:
    """The table of a target whose half type is `half`.

    >>> c_types("_Float16")[bf16].storage, c_types("_Float16")[bf16].compute
    ('uint16_t', 'float')
    """
    return {
        f32: CType("float", "float", "float", "f"),
        f64: CType("double", "double", "float", ""),
        f16: half_type(half),
        bf16: CType(
            "uint16_t",
            "float",
            "float",
            "f",
            "accy_bf16_load({x})",
            "accy_bf16_store({x})",
            "accy_round_bf16({x})",
        ),
        i32: CType("int32_t", "int32_t", "signed", "", unsigned="uint32_t"),
        i64: CType("int64_t", "int64_t", "signed", "", unsigned="uint64_t"),
        u8: CType("uint8_t", "uint8_t", "unsigned", ""),
        bool_: CType("uint8_t", "int", "bool", "", "({x} != 0)", "(uint8_t){x}"),
    }


COMPUTE_NUMPY = {
    "float": np.dtype(np.float32),
    "double": np.dtype(np.float64),
    "int32_t": np.dtype(np.int32),
    "int64_t": np.dtype(np.int64),
    "uint8_t": np.dtype(np.uint8),
    "int": np.dtype(np.int32),
}


def compute_values(values: np.ndarray, ctype: CType) -> np.ndarray:
    """`values` as a C-contiguous array of `ctype`'s compute type: the bytes native code reads
    through a `const compute *` (a constant placed as data rather than written as literals).

    >>> from accy import f16
    >>> compute_values(np.array([1.5], np.float16), c_types("_Float16")[f16]).dtype
    dtype('float32')
    """
    return np.ascontiguousarray(values, dtype=COMPUTE_NUMPY[ctype.compute])
