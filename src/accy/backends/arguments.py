"""The one rule by which every device turns a caller's value into a parameter's array.

An array (NumPy, or any DLPack producer such as a CPU tensor of PyTorch or JAX) must have the
parameter's dtype exactly and its extents; a non-contiguous one is copied (a copy loses
nothing). Python scalars and (nested) lists have no dtype of their own, so they are converted,
but only where nothing is lost:

- bools only for a bool parameter, and a bool parameter takes only bools;
- ints for an integer parameter when they fit its range (no wrapping), and for a float
  parameter when the dtype holds them exactly;
- floats only for a float parameter (never truncated to an integer), rounded to its precision
  as a float literal is; a finite float that would overflow to infinity is refused;
- nothing else (None, strings, ragged lists).

bf16 arrays are `ml_dtypes.bfloat16` NumPy arrays and f16 arrays `numpy.float16`, both ways; a
float32 array for a bf16 parameter is refused like any other dtype mismatch (convert it with
`.astype(ml_dtypes.bfloat16)`, which rounds to nearest even). A DLPack producer's bf16 tensor (a
PyTorch bf16 CPU tensor) is read through `accy.backends.dlpack`, since NumPy's own DLPack import
has no bfloat16. Every refusal is an
`InvalidInput` naming the program, the argument, what was given and what would be right, and
it is the same on every device: the CUDA backend checks device arrays with `check_array` too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.types import TensorType, bf16
from ..errors import InvalidInput
from .dlpack import host_from_dlpack


def held_dtype(t: TensorType) -> np.dtype:
    """The NumPy dtype of the arrays that hold `t`'s values (`ml_dtypes.bfloat16` for bf16).

    >>> from accy import bf16, i32, spec
    >>> held_dtype(spec(bf16, n=2)), held_dtype(spec(i32, n=2))
    (dtype(bfloat16), dtype('int32'))
    """
    return np.dtype(t.dtype.numpy)


def dtype_name(dtype: np.dtype) -> str:
    """How to spell `dtype` in Python: `numpy.float32`, `ml_dtypes.bfloat16`.

    >>> dtype_name(np.dtype(np.float16)), dtype_name(held_dtype(TensorType(bf16)))
    ('numpy.float16', 'ml_dtypes.bfloat16')
    """
    return f"{dtype.type.__module__}.{dtype.type.__name__}"


def where(program_name: str, position: int) -> str:
    """How messages name argument `position` of a program."""
    return f"program {program_name!r}, argument {position}"


def check_count(program_name: str, types: tuple[TensorType, ...], given: int) -> None:
    """Refuse a call with the wrong number of arrays."""
    if given != len(types):
        raise InvalidInput(
            f"program {program_name!r} takes {len(types)} arrays "
            f"({', '.join(map(str, types)) or 'none'}), got {given}"
        )


def check_array(dtype: Any, shape: tuple[int, ...], t: TensorType, at: str) -> None:
    """Refuse an array (host or device) whose dtype or shape is not `t`'s."""
    held = held_dtype(t)
    if dtype != held:
        raise InvalidInput(
            f"{at}: an array of dtype {dtype} was given for {t}, which needs {held}; convert it "
            f"with .astype({dtype_name(held)}) (accy does not convert dtypes silently)"
        )
    if tuple(shape) != t.extents:
        raise InvalidInput(
            f"{at}: an array of shape {tuple(shape)} was given for {t}, which has shape "
            f"{t.extents} (axes in layout order: {', '.join(t.axes) or 'none, a scalar'})"
        )


def is_exact(value: Any, array_type: type, extents: tuple[int, ...], dtype: Any) -> bool:
    """Whether `value` passes the rule as it is: a C-contiguous `array_type` (NumPy's or CuPy's
    ndarray) of exactly `dtype` and `extents`. Every device asks this first, per argument (four
    comparisons: the common case of a call), and sends anything else through `host_array`;
    the CPU's array call asks it inline (`exact_source`).

    >>> is_exact(np.zeros(2, np.float32), np.ndarray, (2,), np.dtype(np.float32))
    True
    >>> is_exact(np.zeros(4, np.float32)[::2], np.ndarray, (2,), np.dtype(np.float32))
    False
    """
    return (
        type(value) is array_type
        and value.dtype == dtype
        and value.shape == extents
        and value.flags.c_contiguous
    )


def exact_source(value: str, array_type: str, extents: str, dtype: str) -> str:
    """`is_exact(value, array_type, extents, dtype)` as a Python expression over those names:
    how a call made per executable, which names each of its arrays, asks it inline (a function
    call per argument would cost as much again as the comparisons).

    >>> exact_source("a0", "ndarray", "e0", "d0")
    'type(a0) is ndarray and a0.dtype == d0 and a0.shape == e0 and a0.flags.c_contiguous'
    >>> names = {"ndarray": np.ndarray, "e0": (2,), "d0": np.dtype(np.float32)}
    >>> for a0 in (np.zeros(2, np.float32), np.zeros(4, np.float32)[::2], np.zeros(2), [0, 0]):
    ...     assert eval(exact_source("a0", "ndarray", "e0", "d0"), {"a0": a0, **names}) == (
    ...         is_exact(a0, np.ndarray, (2,), np.dtype(np.float32)))
    """
    return (
        f"type({value}) is {array_type} and {value}.dtype == {dtype} and "
        f"{value}.shape == {extents} and {value}.flags.c_contiguous"
    )


def host_array(value: Any, t: TensorType, at: str) -> np.ndarray:
    """`value` as a contiguous host array of `t`'s held dtype and extents, by the rule above.

    >>> import numpy as np
    >>> from accy import f32, i32, spec
    >>> host_array([1, 2], spec(f32, n=2), "x").tolist()
    [1.0, 2.0]
    >>> host_array([1.5, 2.0], spec(i32, n=2), "x")
    Traceback (most recent call last):
    accy.errors.InvalidInput: x: a Python float was given for i32[n=2]; it takes ints ...
    """
    if not isinstance(value, np.ndarray | np.generic) and hasattr(value, "__dlpack__"):
        value = host_from_dlpack(value, at)
    if isinstance(value, np.ndarray | np.generic):
        array = np.asarray(value)
    else:
        array = python_values(value, t, at)
    check_array(array.dtype, array.shape, t, at)
    # Not np.ascontiguousarray: it turns a scalar's 0-d array into a 1-d one.
    return array if array.flags.c_contiguous else array.copy(order="C")


def python_values(value: Any, t: TensorType, at: str) -> np.ndarray:
    """A Python scalar or (nested) list as an array of `t`'s held dtype, converted losslessly."""
    try:
        natural = np.asarray(value)
    except (ValueError, TypeError):
        natural = np.empty(0, dtype=object)
    if natural.size == 0 and natural.dtype != object:
        return natural.astype(held_dtype(t))  # an empty list holds nothing to lose
    kind, target = natural.dtype.kind, t.dtype
    if kind not in "bif":
        raise InvalidInput(
            f"{at}: {type(value).__name__} {_preview(value)} cannot be converted to {t}; Python "
            f"values must be bools, ints or floats (a list of them, shaped {t.extents})"
        )
    if (kind == "b") != (target.numpy == np.bool_):
        given = "a Python bool" if kind == "b" else f"a Python {_names[kind]}"
        raise InvalidInput(f"{at}: {given} was given for {t}; {_wanted(t)}")
    if kind == "f" and not _is_float(t):
        raise InvalidInput(
            f"{at}: a Python float was given for {t}; it takes ints (accy does not truncate "
            f"floats; convert them explicitly)"
        )
    if kind == "i" and not _holds_exactly(natural, t):
        raise InvalidInput(
            f"{at}: {_preview(value)} has an int that {t} does not hold exactly "
            f"({_range(t)}); accy does not wrap or round ints"
        )
    converted = _converted(natural, t)
    if kind == "f" and np.any(np.isfinite(natural) & ~np.isfinite(converted)):
        raise InvalidInput(f"{at}: {_preview(value)} has a float that overflows {t}")
    return converted


_names = {"i": "int", "f": "float"}


def _is_float(t: TensorType) -> bool:
    return t.dtype.is_float


def _wanted(t: TensorType) -> str:
    if t.dtype.numpy == np.bool_:
        return "it takes bools only"
    return "it takes floats or ints" if _is_float(t) else "it takes ints"


def _holds_exactly(ints: np.ndarray, t: TensorType) -> bool:
    """Whether every int64 in `ints` survives the trip to `t`'s dtype and back."""
    held = held_dtype(t)
    if held.kind in "iu":
        info = np.iinfo(held)
        return bool(ints.min() >= info.min and ints.max() <= info.max)
    with np.errstate(over="ignore", invalid="ignore"):
        back = _converted(ints, t).astype(np.int64)
    return bool(np.array_equal(back, ints))


def _converted(natural: np.ndarray, t: TensorType) -> np.ndarray:
    """`natural` cast to `t`'s held dtype (to nearest, ties to even, for the floats)."""
    with np.errstate(over="ignore"):
        return natural.astype(held_dtype(t))


def _range(t: TensorType) -> str:
    held = held_dtype(t)
    if held.kind in "iu":
        info = np.iinfo(held)
        return f"its range is {info.min} to {info.max}"
    digits = 8 if t.dtype == bf16 else np.finfo(held).nmant + 1
    return f"it holds ints exactly up to 2**{digits}"


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


__all__ = [
    "check_array",
    "check_count",
    "dtype_name",
    "exact_source",
    "held_dtype",
    "host_array",
    "is_exact",
    "python_values",
    "where",
]
