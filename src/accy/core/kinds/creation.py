"""Kinds that make values from nothing: `parameter`, `constant`, `iota`.

Their result type is an attribute (`type`). A constant is a splat of one scalar `value`, or a
`ConstantArray` (`accy.core.arrays`: a read-only NumPy array, already rounded to the dtype,
hashed by content). A splat float is rounded to its dtype when the program runs, as NumPy casts
it: one beyond the dtype's range is ±inf (`x * 1e39` in f32, `x * -1e9` in f16), on every
backend.
"""

from __future__ import annotations

import numpy as np

from ...errors import AxisError, DTypeError, TypeRuleError
from ..arrays import ConstantArray
from ..types import TensorType, bool_
from .registry import Rule, attr, check_arity, register, zero_tangent


def _type_attr(kind, attrs) -> TensorType:
    result = attr(kind, attrs, "type")
    if not isinstance(result, TensorType):
        raise TypeRuleError(f"{kind}: attribute 'type' must be a tensor type, got {result!r}")
    return result


def _parameter_infer(types, attrs):
    check_arity("parameter", types, 0)
    index = attr("parameter", attrs, "index")
    if not isinstance(index, int) or index < 0:
        raise TypeRuleError(f"parameter: index must be an int >= 0, got {index!r}")
    return _type_attr("parameter", attrs)


def _parameter_evaluate(attrs, args, evaluator):
    return evaluator.parameter(attrs["index"])


register(
    Rule("parameter", _parameter_infer, _parameter_evaluate, arity=0, result_type_is_attr=True)
)


def normalize_scalar(value, dtype):
    """A Python scalar of the kind that `dtype` holds (float for floats, int, or bool)."""
    if isinstance(value, np.generic):
        value = value.item()
    if not isinstance(value, bool | int | float):
        raise DTypeError(f"a constant must be a Python scalar, got {value!r}")
    if dtype == bool_:
        return bool(value)
    if dtype.is_float:
        return float(value)
    if isinstance(value, float) and not value.is_integer():
        raise DTypeError(f"constant {value!r} is not an integer but the dtype is {dtype}")
    result = int(value)
    info = np.iinfo(dtype.numpy)
    if not info.min <= result <= info.max:
        raise DTypeError(f"constant {value!r} does not fit in {dtype}")
    return result


def _constant_infer(types, attrs):
    check_arity("constant", types, 0)
    result = _type_attr("constant", attrs)
    value = attr("constant", attrs, "value")
    if isinstance(value, ConstantArray):
        if value.dtype != result.dtype or value.shape != result.extents:
            raise TypeRuleError(
                f"constant: values of {value.dtype}{list(value.shape)} given for {result}"
            )
        return result
    if isinstance(value, tuple | list):
        raise TypeRuleError(
            "constant: 'value' is one scalar (a splat) or a ConstantArray, not a sequence; "
            "builder.constant(values, type) makes one"
        )
    normalize_scalar(value, result.dtype)
    return result


def _constant_evaluate(attrs, args, _):
    t = attrs["type"]
    value = attrs["value"]
    # A float beyond the dtype's range is ±inf (the module docstring): chosen, not worth a warning.
    if isinstance(value, ConstantArray):
        return value.array.copy()  # evaluators may hand results out: never the shared array
    with np.errstate(over="ignore"):
        return np.full(t.extents, value, dtype=t.dtype.numpy)


register(
    Rule(
        "constant",
        _constant_infer,
        _constant_evaluate,
        zero_tangent,
        arity=0,
        result_type_is_attr=True,
    )
)


def _iota_infer(types, attrs):
    check_arity("iota", types, 0)
    result = _type_attr("iota", attrs)
    axis = attr("iota", attrs, "axis")
    if not result.has(axis):
        raise AxisError(f"iota: axis {axis!r} is not on {result}; its axes are {result.axes}")
    if result.dtype == bool_:
        raise DTypeError("iota cannot produce bool values")
    return result


def _iota_evaluate(attrs, args, _):
    t = attrs["type"]
    position = t.position(attrs["axis"])
    shape = [1] * t.rank
    shape[position] = t.extents[position]
    line = np.arange(t.extents[position], dtype=t.dtype.numpy).reshape(shape)
    return np.broadcast_to(line, t.extents).copy()


register(
    Rule(
        "iota",
        _iota_infer,
        _iota_evaluate,
        zero_tangent,
        arity=0,
        result_type_is_attr=True,
    )
)
