"""Array functions of the NumPy namespace over named arrays: `where`, `arange`, `clip`, `var`,
`allclose`, and the counting and set functions `bincount`, `nonzero`, `unique` (and its
`unique_values`/`unique_counts`/`unique_inverse`/`unique_all` shortcuts), whose data-dependent
number of results is bounded by a named output axis of a given extent (JAX's `size=`).

Each takes NamedArrays, traced values and Python scalars alike, and runs eagerly or records
operations while tracing, as the methods of `NamedArray` do: the operation library is that of
the most deeply traced operand (`operations_of`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..backends.devices import CPU
from ..core.types import DType, TensorType, bool_
from ..errors import AccyError, AxisError, DTypeError
from .named import NamedArray, eager_ops, named, scalar_dtype


def operations_of(*operands: Any) -> Any:
    """The operation library for `operands`: the builder of the innermost trace among them,
    else the eager library of the first NamedArray's device; None when no operand is an array.

    >>> import accy, numpy as np
    >>> operations_of(2.0, accy.named(np.ones(2, np.float32), "n")).device
    Device('cpu')
    """
    found = None
    for operand in operands:
        builder = getattr(operand, "builder", None)
        if builder is None:
            continue
        depth = getattr(builder, "depth", -1)
        if found is None or depth > getattr(found, "depth", -1):
            found = builder
    return found


def _array_like(ops: Any, value: Any, dtype: DType | None) -> Any:
    """`value` as an operand: arrays unchanged, Python and NumPy scalars as rank-0 constants of
    `dtype` (or the dtype they become when traced: `scalar_dtype`)."""
    if hasattr(value, "ty"):
        return value
    if isinstance(value, np.ndarray) and value.ndim > 0:
        raise AxisError(
            f"a NumPy array of shape {value.shape} was given where a named array or a scalar is "
            f"expected; name its axes first: accy.named(array, "
            f"{tuple(f'axis{i}' for i in range(value.ndim))})"
        )
    return ops.full(TensorType(dtype or scalar_dtype(value), ()), value)


def where(predicate: Any, on_true: Any, on_false: Any) -> Any:
    """Elementwise `on_true` where `predicate` holds, else `on_false` (`jnp.where` with three
    arguments), broadcast by axis name. Any of the three may be a Python scalar; a scalar branch
    takes the dtype of the other branch (or its own: f32 for floats, i32 for ints).

    >>> import accy, numpy as np
    >>> x = accy.named(np.array([-1.0, 2.0, -3.0], np.float32), "n")
    >>> accy.where(x > 0, x, 0.0).array.tolist()
    [0.0, 2.0, 0.0]
    """
    ops = operations_of(predicate, on_true, on_false)
    if ops is None:
        ops = eager_ops(CPU)
    branch_dtype = next((v.ty.dtype for v in (on_true, on_false) if hasattr(v, "ty")), None)
    predicate = _array_like(ops, predicate, bool_)
    if predicate.ty.dtype != bool_:
        raise DTypeError(
            f"where: the predicate is {predicate.ty}; it must be bool: compare first "
            "(x > 0, x.eq(y))"
        )
    on_true = _array_like(ops, on_true, branch_dtype)
    on_false = _array_like(ops, on_false, branch_dtype)
    return ops.select(predicate, on_true, on_false)


def arange(
    axis: str,
    start: int | float | None = None,
    stop: int | float | None = None,
    step: int | float = 1,
    dtype: DType | None = None,
    device: str | None = None,
) -> NamedArray:
    """Evenly spaced values along one new axis `axis`, as `np.arange(start, stop, step)`
    (`arange(axis, n)` counts 0 to n - 1). The dtype is i32 for integer bounds, f32 otherwise,
    unless `dtype` is given.

    >>> import accy
    >>> accy.arange("token", 4).array.tolist(), accy.arange("t", 1.0, 2.0, 0.25).axes
    ([0, 1, 2, 3], ('t',))
    """
    if not isinstance(axis, str):
        raise AxisError(
            f"arange: the first argument names the new axis (a string), got {axis!r}: "
            "accy.arange('token', 5)"
        )
    if start is None:
        raise AccyError(f"arange: give the number of values: accy.arange({axis!r}, 5)")
    if stop is None:
        start, stop = 0, start
    bounds = (start, stop, step)
    if not all(isinstance(v, int | float | np.integer | np.floating) for v in bounds):
        raise DTypeError(f"arange: start, stop and step must be numbers, got {bounds!r}")
    if step == 0:
        raise AccyError("arange: step must not be 0")
    if dtype is None:
        integral = all(isinstance(v, int | np.integer) for v in bounds)
        numpy_dtype = np.int32 if integral else np.float32
    else:
        numpy_dtype = dtype.numpy
    values = np.arange(start, stop, step, dtype=numpy_dtype)
    return named(values, (axis,), device=device)


def clip(x: Any, lower: Any = None, upper: Any = None) -> Any:
    """`x` limited to [lower, upper] elementwise (`jnp.clip`): max(x, lower), then min with
    `upper`; either bound may be None (no limit), a scalar or an array.

    >>> import accy, numpy as np
    >>> x = accy.named(np.array([-2.0, 0.5, 3.0], np.float32), "n")
    >>> accy.clip(x, -1.0, 1.0).array.tolist()
    [-1.0, 0.5, 1.0]
    """
    if not hasattr(x, "ty"):
        raise AccyError(f"clip: x must be a named array or a traced value, got {x!r}")
    if lower is None and upper is None:
        raise AccyError("clip: give a lower bound, an upper bound or both")
    ops = operations_of(x, lower, upper)
    if lower is not None:
        x = ops.maximum(x, lower)
    if upper is not None:
        x = ops.minimum(x, upper)
    return x


def var(x: Any, axes: str | Sequence[str] | None = None, ddof: int = 0, where: Any = None) -> Any:
    """The variance over `axes` (names; None: every axis), the mean of the squared deviations
    from the mean (`jnp.var`); `ddof` is subtracted from the count in the divisor. With the
    bool mask `where`, of the elements where it holds (`jnp.var(x, where=mask)`).

    >>> import accy, numpy as np
    >>> x = accy.named(np.array([[1.0, 2.0, 3.0, 4.0]], np.float32), ("row", "col"))
    >>> accy.var(x, "col").array.tolist(), accy.var(x, ddof=1).item()
    ([1.25], 1.6666666269302368)
    >>> accy.var(x, where=x < 3.5).item()
    0.6666666865348816
    """
    if not hasattr(x, "ty") or not x.ty.dtype.is_float:
        got = x.ty if hasattr(x, "ty") else repr(x)
        raise DTypeError(f"var: x must be a floating-point array, got {got}")
    names = x.ty.axes if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
    for name in names:
        if not x.ty.has(name):
            raise AxisError(f"var: axis {name!r} is not on {x.ty}; its axes are {x.ty.axes}")
    count = 1
    for name in names:
        count *= x.ty.extent(name)
    if count - ddof <= 0:
        raise AccyError(f"var: ddof={ddof} leaves no degrees of freedom over {count} elements")
    if where is None:
        deviation = x - x.mean(names)
        return (deviation * deviation).sum(names) / float(count - ddof)
    ops = operations_of(x, where)
    deviation = x - x.mean(names, where=where)
    selected = ops.broadcast_to(ops.scalar(x.ty.dtype, 1), x.ty).sum(names, where=where)
    return (deviation * deviation).sum(names, where=where) / (selected - float(ddof))


def isclose(
    a: Any, b: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False
) -> Any:
    """Elementwise |a - b| <= atol + rtol |b| (`np.isclose`); equal infinities are close, and
    NaNs are close to each other only with `equal_nan`.

    >>> import accy, numpy as np
    >>> a = accy.named(np.array([1.0, np.inf, np.nan], np.float32), "n")
    >>> accy.isclose(a, a).array.tolist()
    [True, True, False]
    """
    ops = operations_of(a, b)
    if ops is None:
        raise AccyError(f"isclose: at least one of a and b must be an array, got {a!r}, {b!r}")
    dtype = next(v.ty.dtype for v in (a, b) if hasattr(v, "ty"))
    if not dtype.is_float:
        return ops.compare("eq", a, b)
    a, b = _array_like(ops, a, dtype), _array_like(ops, b, dtype)
    near = ops.compare("le", (a - b).abs(), ops.add(b.abs() * float(rtol), float(atol)))
    close = near | ops.compare("eq", a, b)  # infinities of one sign
    if equal_nan:
        close = close | (ops.compare("ne", a, a) & ops.compare("ne", b, b))
    return close


def allclose(
    a: Any, b: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False
) -> Any:
    """Whether every element of `a` is close to `b`'s (`isclose` over all elements), as a bool
    scalar array (`bool()` of an eager one is a Python bool).

    >>> import accy, numpy as np
    >>> x = accy.named(np.array([1.0, 2.0], np.float32), "n")
    >>> bool(accy.allclose(x, x + 1e-7)), bool(accy.allclose(x, x + 1e-3))
    (True, False)
    """
    return isclose(a, b, rtol, atol, equal_nan).min()


def _operations_for(kind: str, x: Any) -> Any:
    """The operation library of the array `x`, or a clear error when `x` is not an array."""
    if not hasattr(x, "ty"):
        raise AccyError(
            f"{kind}: x must be a named array or a traced value, got {x!r}; name its axes "
            "first: accy.named(array, ('axis0', ...))"
        )
    return operations_of(x)


def bincount(x: Any, axis: str, length: int, weights: Any = None) -> Any:
    """How often each value 0 .. length - 1 occurs in the integer array `x`, over the new axis
    `axis` (`jnp.bincount(x, weights, length=length)`, Haliax's `hax.bincount(x, Axis)`); with
    `weights` (an array with `x`'s axes), the sum of the weights of those elements instead,
    differentiable with respect to them. Negative values count as 0; values >= length are
    dropped. Every axis of `x` is counted over.

    >>> import accy, numpy as np
    >>> x = accy.named(np.array([0, 1, 1, 3], np.int32), "token")
    >>> accy.bincount(x, "bin", length=3).array.tolist()
    [1, 2, 0]
    """
    return _operations_for("bincount", x).bincount(x, axis, length, weights)


def nonzero(x: Any, axis: str, size: int, fill_value: int = 0) -> tuple[Any, ...]:
    """The positions of the nonzero (or True) elements of `x` in row-major order, as
    `jnp.nonzero(x, size=size, fill_value=fill_value)`: one i32 array over the new axis `axis`
    (of extent `size`) per axis of `x`, in layout order; slots past the last nonzero element
    hold `fill_value`, and nonzero elements past `size` are dropped.

    >>> import accy, numpy as np
    >>> x = accy.named(np.array([[0, 5], [7, 0]], np.int32), ("row", "col"))
    >>> [i.array.tolist() for i in accy.nonzero(x, "hit", size=3, fill_value=-1)]
    [[0, 1, -1], [1, 0, -1]]
    """
    return _operations_for("nonzero", x).nonzero(x, axis, size, fill_value)


def unique(
    x: Any,
    axis: str,
    size: int,
    *,
    along: str | None = None,
    return_index: bool = False,
    return_inverse: bool = False,
    return_counts: bool = False,
    fill_value: Any = None,
) -> Any:
    """The sorted distinct elements of `x`, over the new axis `axis` of extent `size`, as
    `jnp.unique(x, size=size, ...)`; with `along` (an axis name: JAX's and Haliax's `axis=`),
    the distinct slices along that axis, sorted lexicographically. Unused slots hold
    `fill_value` (by default the smallest value or slice, as JAX); distinct values past `size`
    are dropped. The values differentiate (through a gather); the other outputs are i32.

    Returns the values alone, or a tuple of the values and, in this order, what is asked for:
    `return_index` (the position of each value's first occurrence: along `along`, or in the
    row-major order of `x`), `return_inverse` (the slot of each element of `x`, with `x`'s
    axes; or of each slice, over `along`), `return_counts` (the occurrences of each value).

    >>> import accy, numpy as np
    >>> x = accy.named(np.array([3, 4, 1, 3, 1], np.int32), "token")
    >>> values, counts = accy.unique(x, "u", size=3, return_counts=True)
    >>> values.array.tolist(), counts.array.tolist()
    ([1, 3, 4], [2, 2, 1])
    """
    results = _operations_for("unique", x).unique(x, axis, size, along, fill_value)
    wanted = [
        name
        for name, asked in (
            ("index", return_index),
            ("inverse", return_inverse),
            ("counts", return_counts),
        )
        if asked
    ]
    if not wanted:
        return results["values"]
    return (results["values"], *(results[name] for name in wanted))


def unique_values(x: Any, axis: str, size: int, *, along: str | None = None) -> Any:
    """The sorted distinct values of `x` over the new axis `axis` (`jnp.unique_values`):
    `unique(x, axis, size, along=along)`.

    >>> import accy, numpy as np
    >>> x = accy.named(np.array([2, 1, 2], np.int32), "token")
    >>> accy.unique_values(x, "u", size=2).array.tolist()
    [1, 2]
    """
    return unique(x, axis, size, along=along)


def unique_counts(x: Any, axis: str, size: int, *, along: str | None = None) -> tuple[Any, Any]:
    """(values, counts) of `unique` (`jnp.unique_counts`).

    >>> import accy, numpy as np
    >>> x = accy.named(np.array([2, 1, 2], np.int32), "token")
    >>> [r.array.tolist() for r in accy.unique_counts(x, "u", size=2)]
    [[1, 2], [1, 2]]
    """
    return unique(x, axis, size, along=along, return_counts=True)


def unique_inverse(x: Any, axis: str, size: int, *, along: str | None = None) -> tuple[Any, Any]:
    """(values, inverse) of `unique` (`jnp.unique_inverse`): `values.gather(inverse, axis)`
    rebuilds `x`.

    >>> import accy, numpy as np
    >>> x = accy.named(np.array([2, 1, 2], np.int32), "token")
    >>> [r.array.tolist() for r in accy.unique_inverse(x, "u", size=2)]
    [[1, 2], [1, 0, 1]]
    """
    return unique(x, axis, size, along=along, return_inverse=True)


def unique_all(
    x: Any, axis: str, size: int, *, along: str | None = None
) -> tuple[Any, Any, Any, Any]:
    """(values, index, inverse, counts) of `unique` (`jnp.unique_all`).

    >>> import accy, numpy as np
    >>> x = accy.named(np.array([2, 1, 2], np.int32), "token")
    >>> [r.array.tolist() for r in accy.unique_all(x, "u", size=2)]
    [[1, 2], [1, 0], [1, 0, 1], [1, 2]]
    """
    return unique(
        x, axis, size, along=along, return_index=True, return_inverse=True, return_counts=True
    )


__all__ = [
    "allclose",
    "arange",
    "bincount",
    "clip",
    "isclose",
    "nonzero",
    "operations_of",
    "unique",
    "unique_all",
    "unique_counts",
    "unique_inverse",
    "unique_values",
    "var",
    "where",
]
