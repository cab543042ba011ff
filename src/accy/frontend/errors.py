"""The errors of the function front end (`accy.jit`, `accy.grad` on functions, `accy.vmap`,
`accy.NamedArray`): each says what was wrong, where (the argument's path in its tree), and what
would be right. All are `accy.AccyError`s.
"""

from __future__ import annotations

from ..errors import AccyError


class NonArrayLeaf(AccyError):
    """A leaf of an argument tree is neither a named array nor a scalar (a string, a list
    element that is an object, a NumPy array without axis names, ...)."""


class StaticArgumentError(AccyError):
    """A static argument is unhashable, or `static_argnames` names no parameter of the function."""


class TransformError(AccyError):
    """A function transform was used in a way it does not support (argnums out of range,
    `has_aux` without a (value, aux) pair, a gradient with respect to integers, mismatched
    tangent trees, ...)."""


class TreeTooDeep(AccyError):
    """A tree of arguments or results is nested deeper than accy's trees (optree) can hold."""


class DeviceMismatch(AccyError):
    """Arrays on different devices met in one operation or one call."""


class NonFiniteValue(AccyError):
    """With `accy.config.debug_nans`, a call's outputs held a NaN or an infinity; the message
    names the first operation that made one, its axes and the user's source line."""


__all__ = [
    "DeviceMismatch",
    "NonArrayLeaf",
    "NonFiniteValue",
    "StaticArgumentError",
    "TransformError",
    "TreeTooDeep",
]
