"""Axis bookkeeping by name, as Haliax's `haliax.axis` helpers: shapes are dicts of extents
(`{"batch": 4, "feature": 3}`), TensorTypes, or tuples of axis names; `rearrange` transposes
an array to a partial order of its axes, with `...` standing for the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.types import TensorType
from ..errors import AxisError

Shape = dict[str, int] | TensorType | tuple[str, ...] | list[str]


def _as_pairs(shape: Any, what: str) -> tuple[list[tuple[str, int | None]], str]:
    """`shape` as (name, extent or None) pairs, and which kind it was ("dict", "names")."""
    if isinstance(shape, TensorType):
        return list(shape.named_extents), "dict"
    if isinstance(shape, dict):
        return list(shape.items()), "dict"
    if isinstance(shape, str):
        return [(shape, None)], "names"
    if isinstance(shape, tuple | list) and all(isinstance(a, str) for a in shape):
        return [(a, None) for a in shape], "names"
    raise AxisError(
        f"{what}: a shape is a dict of axis extents, a TensorType or a tuple of axis names, "
        f"got {shape!r}"
    )


def _rebuilt(pairs: list[tuple[str, int | None]], kind: str) -> Any:
    return dict(pairs) if kind == "dict" else tuple(name for name, _ in pairs)


def _check_extents(what: str, pairs: list, others: list) -> None:
    mine = dict(pairs)
    for name, extent in others:
        have = mine.get(name)
        if have is not None and extent is not None and have != extent:
            raise AxisError(
                f"{what}: axis {name!r} has extent {have} in one shape and {extent} in the other"
            )


def without_axes(shape: Shape, axes: Shape) -> Any:
    """`shape` without the axes of `axes` that it has (the others are ignored); the shared
    ones must agree on their extents.

    >>> without_axes({"H": 3, "W": 4, "C": 5}, {"H": 3}), without_axes(("H", "W"), ("C",))
    ({'W': 4, 'C': 5}, ('H', 'W'))
    """
    pairs, kind = _as_pairs(shape, "without_axes")
    drop, _ = _as_pairs(axes, "without_axes")
    _check_extents("without_axes", pairs, drop)
    names = {name for name, _ in drop}
    return _rebuilt([p for p in pairs if p[0] not in names], kind)


def eliminate_axes(shape: Shape, axes: Shape) -> Any:
    """`shape` without the axes of `axes`, every one of which it must have.

    >>> eliminate_axes(("H", "W"), ("H",))
    ('W',)
    """
    pairs, _ = _as_pairs(shape, "eliminate_axes")
    drop, _ = _as_pairs(axes, "eliminate_axes")
    have = {name for name, _ in pairs}
    missing = [name for name, _ in drop if name not in have]
    if missing:
        raise AxisError(
            f"eliminate_axes: {', '.join(map(repr, missing))} not in {shape!r}; its axes are "
            f"{', '.join(sorted(have)) or 'none'}"
        )
    return without_axes(shape, axes)


def replace_axis(shape: Shape, old: str, new: Shape) -> Any:
    """`shape` with the axis `old` replaced, in place, by the axes of `new`, none of which
    it may have already.

    >>> replace_axis({"H": 3, "W": 4}, "H", {"H": 3, "C": 5})
    {'H': 3, 'C': 5, 'W': 4}
    """
    pairs, kind = _as_pairs(shape, "replace_axis")
    added, _ = _as_pairs(new, "replace_axis")
    names = [name for name, _ in pairs]
    if old not in names:
        raise AxisError(f"replace_axis: {old!r} is not an axis of {shape!r}")
    kept = {name for name in names if name != old}
    clash = [name for name, _ in added if name in kept]
    if clash:
        raise AxisError(
            f"replace_axis: {', '.join(map(repr, clash))} already in {shape!r}; rename first"
        )
    at = names.index(old)
    return _rebuilt(pairs[:at] + added + pairs[at + 1 :], kind)


def rearrange_for_partial_order(partial_order: Sequence[Any], axes: Sequence[str]) -> tuple:
    """`axes` reordered to follow `partial_order`, a sequence of names in which `...` stands
    for any number of the other axes. The other axes keep their order, and each goes to the
    first `...` after the named axes that came before it in `axes` (or, when there is none,
    to the last `...`).

    >>> rearrange_for_partial_order(("apple", ..., "banana"), ("banana", "apple", "cherry"))
    ('apple', 'cherry', 'banana')
    """
    axes = tuple(axes)
    if len(set(axes)) != len(axes):
        raise AxisError(f"rearrange: the axes {axes} name an axis twice")
    named = [a for a in partial_order if a is not ...]
    if len(set(named)) != len(named):
        raise AxisError(f"rearrange: {tuple(partial_order)} names an axis twice")
    missing = [a for a in named if a not in axes]
    if missing:
        raise AxisError(f"rearrange: {', '.join(map(repr, missing))} not among the axes {axes}")
    slots = [i for i, a in enumerate(partial_order) if a is ...]
    if not slots:
        if sorted(named) != sorted(axes):
            raise AxisError(
                f"rearrange: {tuple(partial_order)} is not an order of all of {axes}; add ... "
                "for the axes it leaves out"
            )
        return tuple(named)
    position = {a: i for i, a in enumerate(partial_order) if a is not ...}
    filled: dict[int, list[str]] = {slot: [] for slot in slots}
    latest = -1  # the partial-order position of the latest named axis seen so far
    for axis in axes:
        if axis in position:
            latest = max(latest, position[axis])
            continue
        after = [slot for slot in slots if slot > latest]
        filled[after[0] if after else slots[-1]].append(axis)
    out: list[str] = []
    for i, entry in enumerate(partial_order):
        out.extend(filled[i] if entry is ... else [entry])
    return tuple(out)


def rearrange(x: Any, order: Sequence[Any]) -> Any:
    """`x` transposed to the axis order `order`, in which `...` stands for the axes it does
    not name (Haliax's `rearrange`).

    >>> import accy, numpy as np
    >>> x = accy.named(np.zeros((2, 3, 4), np.float32), ("batch", "token", "feature"))
    >>> accy.rearrange(x, ("feature", ...)).axes
    ('feature', 'batch', 'token')
    """
    if not hasattr(x, "ty"):
        raise AxisError(f"rearrange: x must be a named array or a traced value, got {x!r}")
    goal = rearrange_for_partial_order(tuple(order), x.ty.axes)
    return x.builder.transpose(x, goal)


__all__ = [
    "eliminate_axes",
    "rearrange",
    "rearrange_for_partial_order",
    "replace_axis",
    "without_axes",
]
