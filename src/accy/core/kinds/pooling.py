"""Windowed reductions in one pass: `reduce_window` and the two kinds of its max/min derivative.

Every kind reduces windows over named axes (`axes`; the per-axis attributes are positional
along `axes`): `window` extents, `stride`, `low`/`high` padding (negative crops) and window
`dilation`. The window offsets are visited in row-major order of `axes` (the order the values
API gives them: the input's layout), padded positions holding the identity of the op.

- `reduce_window(x) {op, axes, window, stride, low, high, dilation}`: sum, max or min over each
  window (a window with a NaN has max and min NaN). The result has x's axes, each window axis
  with its number of window positions.
- `select_and_gather_add(t, x) {op, ...}`: for each window of `x`, the element of `t` at its
  first extreme (`op` max or min: the first NaN if any, else the first maximum, a padded
  position counting as a candidate of the identity's value, whose `t` is 0). The JVP of
  reduce_window max/min (XLA's select_and_gather_add).
- `select_and_scatter_add(s, x) {op, ...}`: x's shape, each window's element of `s` added at
  that window's first extreme of `x` (nothing for a padded one). Its transpose and the other's
  (XLA's select_and_scatter_add), so the derivatives of every order close over these kinds.

The transpose of a windowed sum is a windowed sum of the cotangent, spread by the stride
(interior padding) and padded as a transposed convolution's input gradient (JAX's rule).
The backends run the kinds whole (the CPU's one-pass loops, `accy/lower/pooling.py`) or as
compositions of pad, strided slices and reductions (`core/windows.py`).
"""

from __future__ import annotations

import numpy as np

from ...errors import AxisError, DTypeError, TypeRuleError
from ..types import TensorType, bool_
from .registry import (
    Linear,
    Rule,
    Zero,
    attr,
    batched_operand,
    check_arity,
    check_has_axes,
    describe,
    register,
)

WINDOW_KINDS = ("reduce_window", "select_and_gather_add", "select_and_scatter_add")
PER_AXIS = ("window", "stride", "low", "high", "dilation")
CHOOSERS = ("max", "min")


def window_attrs(op: str, axes, window, stride, pairs, dilation) -> dict:
    """The attributes of a windowed kind from per-axis sequences (`pairs`: (low, high)).

    >>> window_attrs("max", ["h"], [3], [2], [(1, 1)], [1])["low"]
    (1,)
    """
    return {
        "op": op,
        "axes": tuple(axes),
        "window": tuple(window),
        "stride": tuple(stride),
        "low": tuple(lo for lo, _ in pairs),
        "high": tuple(hi for _, hi in pairs),
        "dilation": tuple(dilation),
    }


def window_positions(n: int, k: int, stride: int, low: int, high: int, dilation: int) -> int:
    """How many windows fit along an axis of extent `n` once padded (-1 when none fits).

    >>> window_positions(5, 3, 2, 1, 1, 1)
    3
    """
    padded, span = n + low + high, (k - 1) * dilation + 1
    return -1 if padded < span else (padded - span) // stride + 1


def _check_attrs(kind: str, x: TensorType, attrs) -> tuple[str, ...]:
    axes = tuple(attr(kind, attrs, "axes"))
    if not axes or len(set(axes)) != len(axes):
        raise AxisError(f"{kind}: axes {axes} must name at least one axis, each once")
    check_has_axes(kind, x, axes)
    for name in PER_AXIS:
        values = attr(kind, attrs, name)
        if not isinstance(values, tuple) or len(values) != len(axes):
            raise TypeRuleError(f"{kind}: {name} needs one integer per axis {axes}, got {values!r}")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise TypeRuleError(f"{kind}: {name} must be integers, got {values!r}")
    for i, axis in enumerate(axes):
        k, s, r = attrs["window"][i], attrs["stride"][i], attrs["dilation"][i]
        if k < 1 or s < 1 or r < 1:
            raise AxisError(f"window {k}, stride {s} and dilation {r} of {axis!r} must all be >= 1")
    return axes


def reduced_type(kind: str, x: TensorType, attrs) -> TensorType:
    """`x`'s type with each window axis's extent its number of windows, or an AxisError
    saying which window does not fit.

    >>> from accy import f32, spec
    >>> print(reduced_type("reduce_window", spec(f32, h=5, c=2),
    ...                    window_attrs("max", ["h"], [3], [2], [(1, 1)], [1])))
    f32[h=3, c=2]
    """
    axes = _check_attrs(kind, x, attrs)
    extents = dict(x.named_extents)
    for i, axis in enumerate(axes):
        per = [attrs[name][i] for name in PER_AXIS]
        positions = window_positions(x.extent(axis), *per)
        if positions < 0:
            k, _, low, high, r = per
            raise AxisError(
                f"the window of axis {axis!r} spans {(k - 1) * r + 1} elements; the padded axis "
                f"has {x.extent(axis) + low + high} ({kind} of {x})"
            )
        extents[axis] = positions
    return TensorType(x.dtype, tuple((a, extents[a]) for a in x.axes))


def _check_op(kind: str, op: str, allowed, x: TensorType) -> None:
    if op not in allowed:
        raise TypeRuleError(f"{kind}: op {op!r} is not one of {allowed}")
    if x.dtype == bool_:
        raise DTypeError(f"{kind} does not apply to bool operands ({x}); convert it first")


def _reduce_window_infer(types, attrs):
    check_arity("reduce_window", types, 1)
    _check_op("reduce_window", attr("reduce_window", attrs, "op"), ("sum", *CHOOSERS), types[0])
    return reduced_type("reduce_window", types[0], attrs)


def _check_pair(kind: str, types, first_type: TensorType) -> None:
    if types[0] != first_type:
        raise TypeRuleError(
            f"{kind}: operand 0 must have the type {first_type} ({describe(types)})"
        )


def _gather_infer(types, attrs):
    kind = "select_and_gather_add"
    check_arity(kind, types, 2)
    _check_op(kind, attr(kind, attrs, "op"), CHOOSERS, types[1])
    _check_pair(kind, types, types[1])
    return reduced_type(kind, types[1], attrs)


def _scatter_infer(types, attrs):
    kind = "select_and_scatter_add"
    check_arity(kind, types, 2)
    _check_op(kind, attr(kind, attrs, "op"), CHOOSERS, types[1])
    _check_pair(kind, types, reduced_type(kind, types[1], attrs))
    return types[1]


# reference -----------------------------------------------------------------------------------


def _identity(op: str, dtype: np.dtype):
    """What a padded position holds: 0 for sum, the lowest (highest) value for max (min)."""
    if op == "sum":
        return dtype.type(0)
    if np.issubdtype(dtype, np.floating):
        return dtype.type(-np.inf if op == "max" else np.inf)
    info = np.iinfo(dtype)
    return dtype.type(info.min if op == "max" else info.max)


def _padded(x: np.ndarray, positions, attrs, fill) -> np.ndarray:
    """`x` padded (or cropped) along each window axis with `fill`."""
    for i, p in enumerate(positions):
        low, high = attrs["low"][i], attrs["high"][i]
        widths = [(0, 0)] * x.ndim
        widths[p] = (max(low, 0), max(high, 0))
        x = np.pad(x, widths, constant_values=fill)
        index = [slice(None)] * x.ndim
        index[p] = slice(-min(low, 0), x.shape[p] + min(high, 0))
        x = x[tuple(index)]
    return x


def _window_view(x: np.ndarray, x_type: TensorType, attrs, fill) -> np.ndarray:
    """The windows of `x` (padded with `fill`), a strided view: x's axes with window positions,
    then one axis per window axis over its offsets (in `axes` order)."""
    positions = [x_type.position(a) for a in attrs["axes"]]
    padded = _padded(x, positions, attrs, fill)
    spans = [(k - 1) * r + 1 for k, r in zip(attrs["window"], attrs["dilation"], strict=True)]
    view = np.lib.stride_tricks.sliding_window_view(padded, spans, axis=positions)
    index = [slice(None)] * x.ndim
    for i, p in enumerate(positions):
        index[p] = slice(None, None, attrs["stride"][i])
    index += [slice(None, None, r) for r in attrs["dilation"]]
    return view[tuple(index)]


def _flat_windows(x: np.ndarray, x_type: TensorType, attrs, fill) -> np.ndarray:
    view = _window_view(x, x_type, attrs, fill)
    return view.reshape(*view.shape[: x.ndim], -1)


def _first_extremes(x: np.ndarray, x_type: TensorType, attrs) -> np.ndarray:
    """The flat offset in each window of its first extreme (first NaN, else first max/min;
    padded positions hold the identity)."""
    windows = _flat_windows(x, x_type, attrs, _identity(attrs["op"], x.dtype))
    return (np.argmax if attrs["op"] == "max" else np.argmin)(windows, axis=-1)


def _reduce_window_evaluate(attrs, args, ev):
    (x,) = (np.asarray(a) for a in args)
    windows = _flat_windows(x, ev.operand_types[0], attrs, _identity(attrs["op"], x.dtype))
    reduce = {"sum": np.sum, "max": np.max, "min": np.min}[attrs["op"]]
    return reduce(windows, axis=-1)


def _gather_evaluate(attrs, args, ev):
    t, x = (np.asarray(a) for a in args)
    x_type = ev.operand_types[1]
    chosen = _first_extremes(x, x_type, attrs)
    tangents = _flat_windows(t, x_type, attrs, t.dtype.type(0))
    return np.take_along_axis(tangents, chosen[..., None], axis=-1)[..., 0]


def _scatter_evaluate(attrs, args, ev):
    s, x = (np.asarray(a) for a in args)
    x_type = ev.operand_types[1]
    chosen = _first_extremes(x, x_type, attrs)
    positions = np.arange(x.size).reshape(x.shape)
    # Each window's flat position in x (-1 where the extreme is a padded position).
    where = np.take_along_axis(_flat_windows(positions, x_type, attrs, -1), chosen[..., None], -1)
    where = where[..., 0].ravel()
    out = np.zeros(x.size, s.dtype)
    kept = where >= 0
    np.add.at(out, where[kept], s.ravel()[kept])
    return out.reshape(x.shape)


# derivatives ---------------------------------------------------------------------------------


def _reduce_window_jvp(e, op, primals, tangents, outputs):
    (x,), (dx,) = primals, tangents
    if op.attrs["op"] == "sum":
        return e.emit("reduce_window", [dx], op.attrs)
    return e.emit("select_and_gather_add", [dx, x], op.attrs)


def sum_transpose_attrs(x: TensorType, out: TensorType, attrs) -> tuple[dict, tuple[int, ...]]:
    """The windowed sum that transposes `attrs`' (JAX's rule): its attributes, over the
    cotangent spread by each axis's stride (interior padding `stride - 1`, the second result),
    with window and dilation unchanged, stride 1 and the transposed convolution's padding.

    >>> from accy import f32, spec
    >>> attrs = window_attrs("sum", ["h"], [3], [2], [(1, 1)], [1])
    >>> new, interior = sum_transpose_attrs(spec(f32, h=5), spec(f32, h=3), attrs)
    >>> new["low"], new["high"], interior
    ((1,), (1,), (1,))
    """
    pairs = []
    for i, axis in enumerate(attrs["axes"]):
        n, m = x.extent(axis), out.extent(axis)
        span = (attrs["window"][i] - 1) * attrs["dilation"][i] + 1
        before = span - attrs["low"][i] - 1
        spread = (m - 1) * attrs["stride"][i] + 1 if m else 0
        pairs.append((before, n + span - 1 - spread - before))
    ones = (1,) * len(pairs)
    new = window_attrs("sum", attrs["axes"], attrs["window"], ones, pairs, attrs["dilation"])
    return new, tuple(s - 1 for s in attrs["stride"])


def _reduce_window_transpose(e, op, ct, operands):
    (x,) = operands
    if op.attrs["op"] != "sum":
        raise TypeRuleError(f"reduce_window {op.attrs['op']} is not linear in its operand")
    attrs, interiors = sum_transpose_attrs(x.type, op.type, op.attrs)
    for axis, interior in zip(attrs["axes"], interiors, strict=True):
        if interior:
            ct = e.pad(ct, axis, 0, 0, 0, interior=interior)
    return [e.emit("reduce_window", [ct], attrs)]


def _linear_in_first(kind: str, other: str):
    """The JVP and transpose rules of a kind linear in operand 0 (x's tangent adds nothing:
    the choice of extremes is piecewise constant), whose transpose is the kind `other`."""

    def jvp(e, op, primals, tangents, outputs):
        if isinstance(tangents[0], Zero):
            return Zero(op.type)
        return e.emit(kind, [tangents[0], primals[1]], op.attrs)

    def transpose(e, op, ct, operands):
        if isinstance(operands[1], Linear):
            raise TypeRuleError(f"{kind} is not linear in its operand 1 (the selecting input)")
        return [e.emit(other, [ct, operands[1]], op.attrs), None]

    return jvp, transpose


def _batch(e, op, operands, batched, ctx):
    """The batch axis is one more axis outside the windows, on every operand."""
    operands = [batched_operand(e, v, b, ctx) for v, b in zip(operands, batched, strict=True)]
    return e.emit(op.kind, operands, op.attrs)


_gather_jvp, _gather_transpose = _linear_in_first("select_and_gather_add", "select_and_scatter_add")
_scatter_jvp, _scatter_transpose = _linear_in_first(
    "select_and_scatter_add", "select_and_gather_add"
)

register(
    Rule(
        "reduce_window",
        _reduce_window_infer,
        _reduce_window_evaluate,
        _reduce_window_jvp,
        _reduce_window_transpose,
        arity=1,
        batch=_batch,
    )
)
register(
    Rule(
        "select_and_gather_add",
        _gather_infer,
        _gather_evaluate,
        _gather_jvp,
        _gather_transpose,
        arity=2,
        batch=_batch,
    )
)
register(
    Rule(
        "select_and_scatter_add",
        _scatter_infer,
        _scatter_evaluate,
        _scatter_jvp,
        _scatter_transpose,
        arity=2,
        batch=_batch,
    )
)
