"""Strided views: layout operations that move no data when their operand is already in memory.

A `transpose`, `reshape`, `broadcast_in_dim` or `slice` of a stored value is the same memory read
with other strides (a broadcast repeats elements with stride 0). Code generators turn a view into
a plain strided load, and BLAS takes a view with a unit stride without a copy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..core import Operation
from ..core.types import TensorType

VIEW_KINDS = frozenset({"transpose", "reshape", "broadcast_in_dim", "slice"})


@dataclass(frozen=True)
class StridedView:
    """Elements of a value read from the buffer of `base`: element `i` is at
    `offset + sum(i[k] * strides[k])`, counted in elements of the base's dtype."""

    base: int
    offset: int
    strides: tuple[int, ...]

    def is_contiguous(self, type: TensorType) -> bool:
        """Whether the view is the base's memory in row-major order of `type`."""
        significant = [
            (s, c)
            for s, c, n in zip(self.strides, row_major(type.extents), type.extents, strict=True)
            if n > 1
        ]
        return all(s == c for s, c in significant)


def row_major(extents: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of `extents`, in elements.

    >>> row_major((2, 3, 4))
    (12, 4, 1)
    """
    strides, step = [], 1
    for extent in reversed(extents):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


def view_of_stored(value: int, type: TensorType) -> StridedView:
    """The view of a stored value over its own buffer: row-major, no offset."""
    return StridedView(value, 0, row_major(type.extents))


def _transpose(op: Operation, view: StridedView) -> StridedView:
    operand = op.operand_types[0]
    return StridedView(
        view.base, view.offset, tuple(view.strides[operand.position(a)] for a in op.attrs["order"])
    )


def _broadcast(op: Operation, view: StridedView) -> StridedView:
    operand = op.operand_types[0]
    strides = tuple(
        view.strides[operand.position(a)] if operand.has(a) else 0 for a in op.type.axes
    )
    return StridedView(view.base, view.offset, strides)


def _slice(op: Operation, view: StridedView) -> StridedView:
    starts, steps = op.attrs["starts"], op.attrs["strides"]
    offset = view.offset + sum(s * k for s, k in zip(starts, view.strides, strict=True))
    return StridedView(
        view.base, offset, tuple(s * k for s, k in zip(steps, view.strides, strict=True))
    )


def _reshape(op: Operation, view: StridedView) -> StridedView | None:
    strides = reshaped_strides(op.operand_types[0].extents, view.strides, op.type.extents)
    return None if strides is None else StridedView(view.base, view.offset, strides)


def reshaped_strides(old_extents, old_strides, new_extents) -> tuple[int, ...] | None:
    """Strides that read `new_extents` row-major from a strided array, or None if a copy is
    needed (the algorithm of NumPy's no-copy reshape: groups of old axes whose product equals a
    group of new axes must be contiguous among themselves).

    >>> reshaped_strides((2, 3), (3, 1), (6,)), reshaped_strides((2, 3), (1, 2), (6,))
    ((1,), None)
    """
    if 0 in old_extents:
        return row_major(new_extents)
    old = [(n, s) for n, s in zip(old_extents, old_strides, strict=True) if n != 1]
    new_positions = [i for i, n in enumerate(new_extents) if n != 1]
    new = [new_extents[i] for i in new_positions]
    strides = [0] * len(new_extents)
    oi = ni = 0
    while oi < len(old) and ni < len(new):
        oj, nj = oi + 1, ni + 1
        old_size, new_size = old[oi][0], new[ni]
        while old_size != new_size:
            if old_size < new_size:
                old_size *= old[oj][0]
                oj += 1
            else:
                new_size *= new[nj]
                nj += 1
        if any(old[k][1] != old[k + 1][0] * old[k + 1][1] for k in range(oi, oj - 1)):
            return None
        stride = old[oj - 1][1]
        for k in range(nj - 1, ni - 1, -1):
            strides[new_positions[k]] = stride
            stride *= new[k]
        oi, ni = oj, nj
    return tuple(strides)


VIEW_RULES: dict[str, Callable[[Operation, StridedView], StridedView | None]] = {
    "transpose": _transpose,
    "broadcast_in_dim": _broadcast,
    "slice": _slice,
    "reshape": _reshape,
}


def view_through(op: Operation, operand_view: StridedView | None) -> StridedView | None:
    """The view of `op`'s result, given the view of its operand (None: not a view)."""
    if operand_view is None or op.kind not in VIEW_RULES:
        return None
    return VIEW_RULES[op.kind](op, operand_view)
