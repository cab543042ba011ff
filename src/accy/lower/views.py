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


def reshape_groups(old_extents, new_extents) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The smallest groups of old and new axes (positions, axes of extent 1 left out) whose
    extents have the same product, in order: a reshape only splits or merges within a group.
    Extents must have the same product and none may be 0.

    >>> reshape_groups((8, 1024, 1, 12, 64), (8, 1024, 12, 64))
    [((0,), (0,)), ((1,), (1,)), ((3,), (2,)), ((4,), (3,))]
    >>> reshape_groups((6, 4), (2, 3, 4)), reshape_groups((2, 3), (3, 2))
    ([((0,), (0, 1)), ((1,), (2,))], [((0, 1), (0, 1))])
    """
    old = [i for i, n in enumerate(old_extents) if n != 1]
    new = [i for i, n in enumerate(new_extents) if n != 1]
    groups, oi, ni = [], 0, 0
    while oi < len(old) and ni < len(new):
        oj, nj = oi + 1, ni + 1
        old_size, new_size = old_extents[old[oi]], new_extents[new[ni]]
        while old_size != new_size:
            if old_size < new_size:
                old_size *= old_extents[old[oj]]
                oj += 1
            else:
                new_size *= new_extents[new[nj]]
                nj += 1
        groups.append((tuple(old[oi:oj]), tuple(new[ni:nj])))
        oi, ni = oj, nj
    return groups


def reshaped_strides(old_extents, old_strides, new_extents) -> tuple[int, ...] | None:
    """Strides that read `new_extents` row-major from a strided array, or None if a copy is
    needed (the algorithm of NumPy's no-copy reshape: groups of old axes whose product equals a
    group of new axes must be contiguous among themselves).

    >>> reshaped_strides((2, 3), (3, 1), (6,)), reshaped_strides((2, 3), (1, 2), (6,))
    ((1,), None)
    """
    if 0 in old_extents:
        return row_major(new_extents)
    strides = [0] * len(new_extents)
    for olds, news in reshape_groups(old_extents, new_extents):
        steps = zip(olds, olds[1:], strict=False)  # each old axis and the next in its group
        if any(old_strides[a] != old_extents[b] * old_strides[b] for a, b in steps):
            return None
        stride = old_strides[olds[-1]]
        for k in reversed(news):
            strides[k] = stride
            stride *= new_extents[k]
    return tuple(strides)


def concatenated_pieces(op: Operation) -> list[tuple[int, int, int]]:
    """(operand, start, end) along the axis of concatenate `op`, for each non-empty operand.

    >>> import accy
    >>> p = accy.trace.define("joined", [accy.spec(accy.f32, n=3), accy.spec(accy.f32, n=0)],
    ...                       lambda b, a: b.concatenate([a[0] * 2.0, a[1], a[0]], "n"))
    >>> (op,) = [op for op in p.operations if op.kind == "concatenate"]
    >>> [(start, end) for _, start, end in concatenated_pieces(op)]
    [(0, 3), (3, 6)]
    """
    position = op.type.position(op.attrs["axis"])
    pieces, start = [], 0
    for value, t in zip(op.operands, op.operand_types, strict=True):
        n = t.extents[position]
        if n:
            pieces.append((value, start, start + n))
        start += n
    return pieces


def concatenated_view(op: Operation, views) -> StridedView | None:
    """The view of concatenate `op`'s result when its operands' `views` (None: not a view) are
    consecutive slabs of one buffer along the joined axis: same base, same strides elsewhere,
    each piece starting where the previous one ends. The gradient of q, k and v sliced out of
    one tensor is such a concatenate of three views of the attention backward's stacked rows.

    Not a view kind of the plan (a concatenate needed as a buffer is stored): code generators
    read a stored concatenate through it, as one strided load instead of a select per piece.
    """
    p = op.type.position(op.attrs["axis"])
    pieces = [(view, t) for view, t in zip(views, op.operand_types, strict=True) if t.extents[p]]
    if not pieces or any(view is None for view, _ in pieces):
        return None
    starts = [start for _, start, _ in concatenated_pieces(op)]
    first, first_type = pieces[0]
    step = _joined_stride(pieces, starts, p)
    if step is None:
        return None
    strides = first.strides[:p] + (step,) + first.strides[p + 1 :]
    offset = first.offset - starts[0] * step
    for (view, t), at in zip(pieces, starts, strict=True):
        same = all(view.strides[q] == strides[q] for q, n in enumerate(t.extents) if n > 1)
        if view.base != first.base or not same or view.offset != offset + at * step:
            return None
    return StridedView(first.base, offset, strides) if offset >= 0 else None


def _joined_stride(pieces, starts, p: int) -> int | None:
    """The stride along the joined axis: a piece's own stride there, or where every piece has
    one element along it, the distance between the first two pieces' offsets per element."""
    for view, t in pieces:
        if t.extents[p] > 1:
            return view.strides[p]
    if len(pieces) < 2:
        return pieces[0][0].strides[p]
    distance = pieces[1][0].offset - pieces[0][0].offset
    span = starts[1] - starts[0]
    return distance // span if distance % span == 0 else None


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
