"""Gather and scatter as users write them: batch axes, every combining mode, and a choice of what
happens to out-of-range indices. Compositions over the kinds `gather`, `scatter_add` and
`scatter` (which index one axis, have no batch axes and clamp).

- **Batch axes.** Axes that the indices share with the table (other than the indexed axis) are
  batch axes, as JAX's `operand_batching_dims`: the element at batch position b is picked from
  the table's row b. They are merged with the indexed axis into one flat axis, and each index is
  offset by its batch position (after clamping, so that no index reaches a neighbouring row).
- **Out-of-range indices** (JAX's `mode`): `"clip"` clamps them into [0, extent - 1] (every
  kind's own behaviour, and the default, so that gather and scatter_add stay each other's
  transpose); gather's `"fill"` gives `fill_value` there (NaN for floats, the lowest integer,
  True, as JAX); scatter's `"drop"` sends such updates to one extra row, padded on and sliced
  off again, so they change nothing whatever the combining mode.
- **Combining modes**: `add` (the linear kind `scatter_add`), `multiply`, `max`, `min` (the kind
  `scatter`) and `set`: the last update in index order wins (as NumPy's `a[i] = u`, and
  deterministic on every backend): each row takes the largest update position aimed at it
  (a scatter-max of positions), then gathers that update. Gradients follow the recorded
  kinds: for `set`, the winning update's tangent, or the operand's where nothing landed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import AxisError, DTypeError, TypeRuleError
from .kinds.registry import check_has_axes
from .types import TensorType, bool_, i32, i64

GATHER_MODES = ("clip", "fill")
SCATTER_MODES = ("clip", "drop")
SCATTER_COMBINES = {"add": None, "multiply": "mul", "max": "max", "min": "min", "set": None}


def _fresh(taken, base: str) -> str:
    name = base
    while name in taken:
        name += "_"
    return name


def default_fill(dtype):
    """JAX's fill value for out-of-range gathers: NaN, the lowest signed integer, the largest
    unsigned one, True."""
    if dtype.is_float:
        return float("nan")
    if dtype == bool_:
        return True
    info = np.iinfo(dtype.numpy)
    return int(info.min) if info.min < 0 else int(info.max)


class Indexing:
    """`gather` and `scatter` with batch axes and modes, over `OpsApi`'s primitives (a mixin)."""

    def gather(self, table, indices, axis: str, mode: str = "clip", fill_value=None):
        """Rows of `table` along `axis` picked by `indices`: the result has the table's axes with
        `axis` replaced, in place, by the indices' own axes. Axes that the indices share with
        the table are batch axes (row b of the table serves the indices at b). `mode`: "clip"
        clamps out-of-range indices, "fill" gives `fill_value` there.

        >>> import accy
        >>> p = accy.trace.define("g", [accy.spec(accy.f32, b=2, n=3), accy.spec(accy.i32, b=2)],
        ...                       lambda b, a: a[0].gather(a[1], "n"))
        >>> accy.reference.run(p, [[[0, 1, 2], [3, 4, 5]], [2, 0]])[0].tolist()
        [2.0, 3.0]
        """
        self._check_indexing("gather", table, indices, axis)
        if mode not in GATHER_MODES:
            raise TypeRuleError(f"gather: mode {mode!r} is not one of {', '.join(GATHER_MODES)}")
        batch = self._batch_axes(table, indices, axis)
        expected = self._gathered_axes(table, indices, axis, batch)
        if batch:
            merged, flat_indices, flat = self._flattened_batch(table, indices, axis, batch)
            result = self.emit("gather", [merged, flat_indices], {"axis": flat})
        else:
            result = self.emit("gather", [table, indices], {"axis": axis})
        if mode == "fill":
            fill = default_fill(table.ty.dtype) if fill_value is None else fill_value
            inside = self._in_range(indices, table.ty.extent(axis))
            result = self.select(inside, result, self.scalar(table.ty.dtype, fill))
        return self.transpose(result, expected)

    def scatter(
        self, operand, indices, updates, axis: str, combine: str = "add", mode: str = "clip"
    ):
        """`operand` with each slice of `updates` combined into the row its index names along
        `axis` (`updates` has the axes `gather` would give, in any order). `combine`: add,
        multiply, max, min, or set (the last update in index order wins). Batch axes as
        `gather`. `mode`: "clip" clamps out-of-range indices, "drop" ignores their updates.

        >>> import accy
        >>> p = accy.trace.define(
        ...     "s", [accy.spec(accy.f32, n=3), accy.spec(accy.i32, t=3), accy.spec(accy.f32, t=3)],
        ...     lambda b, a: a[0].scatter(a[1], a[2], "n", combine="max", mode="drop"))
        >>> accy.reference.run(p, [[0, 0, 0], [1, 1, 7], [2, 5, 9]])[0].tolist()
        [0.0, 5.0, 0.0]
        """
        self._check_indexing("scatter", operand, indices, axis)
        if combine not in SCATTER_COMBINES:
            raise TypeRuleError(
                f"scatter: combine {combine!r} is not one of {', '.join(SCATTER_COMBINES)}"
            )
        if mode not in SCATTER_MODES:
            raise TypeRuleError(f"scatter: mode {mode!r} is not one of {', '.join(SCATTER_MODES)}")
        batch = self._batch_axes(operand, indices, axis)
        expected = self._gathered_axes(operand, indices, axis, batch)
        if sorted(updates.ty.axes) != sorted(expected):
            raise AxisError(
                f"scatter: updates must have the axes {expected} (what gather gives for the "
                f"operand {operand.ty} and indices {indices.ty}), got {updates.ty}"
            )
        extent = operand.ty.extent(axis)
        if mode == "drop":  # out-of-range updates land on an extra row, sliced off after
            indices = self.select(self._in_range(indices, extent), indices, extent)
            operand = self.pad(operand, axis, 0, 1, 0)
        if batch:
            merged, flat_indices, flat = self._flattened_batch(operand, indices, axis, batch)
            scattered = self._scatter_one_axis(merged, flat_indices, updates, flat, combine)
            parts = {a: operand.ty.extent(a) for a in (*batch, axis)}
            result = self.transpose(self.split(scattered, flat, parts), operand.ty.axes)
        else:
            result = self._scatter_one_axis(operand, indices, updates, axis, combine)
        return self.slice(result, axis, 0, extent) if mode == "drop" else result

    # -- pieces -----------------------------------------------------------------------------

    def _check_indexing(self, kind: str, table, indices, axis: str) -> None:
        check_has_axes(kind, table.ty, [axis], role="table" if kind == "gather" else "operand")
        if indices.ty.dtype not in (i32, i64):
            raise DTypeError(f"{kind}: indices must be i32 or i64, got {indices.ty}")
        for name in indices.ty.axes:
            shared = name != axis and table.ty.has(name)
            if shared and table.ty.extent(name) != indices.ty.extent(name):
                raise AxisError(
                    f"{kind}: batch axis {name!r} has extent {indices.ty.extent(name)} on "
                    f"the indices {indices.ty} but {table.ty.extent(name)} on {table.ty}; "
                    f"rename it on one of them if it is not a batch axis"
                )

    def _batch_axes(self, table, indices, axis: str) -> tuple[str, ...]:
        """The table's axes (in its order) that the indices share: the batch axes."""
        return tuple(a for a in table.ty.axes if a != axis and indices.ty.has(a))

    def _gathered_axes(self, table, indices, axis: str, batch) -> list[str]:
        """The axes of a gather's result: `axis` replaced by the indices' own axes."""
        own = [a for a in indices.ty.axes if a not in batch]
        return [a for name in table.ty.axes for a in (own if name == axis else [name])]

    def _in_range(self, indices, extent: int):
        return self.binary(
            "and", self.compare("ge", indices, 0), self.compare("lt", indices, extent)
        )

    def _flattened_batch(self, table, indices, axis: str, batch):
        """`table` with its batch axes and `axis` merged (row-major) into one fresh axis, and
        `indices` clamped and offset into it."""
        flat = _fresh(set(table.ty.axes) | set(indices.ty.axes), f"{axis}_batched")
        merged = self.merge(table, (*batch, axis), flat)
        total = merged.ty.extent(flat)
        dtype = i64 if total > np.iinfo(np.int32).max else indices.ty.dtype
        extent = table.ty.extent(axis)
        offset = self.convert(self.minimum(self.maximum(indices, 0), max(extent - 1, 0)), dtype)
        stride = extent
        for name in reversed(batch):
            position = self.iota(TensorType(dtype, ((name, indices.ty.extent(name)),)), name)
            offset = self.add(offset, self.mul(position, stride))
            stride *= table.ty.extent(name)
        return merged, offset, flat

    def _scatter_one_axis(self, operand, indices, updates, axis: str, combine: str):
        gathered = self._gathered_axes(operand, indices, axis, ())
        updates = self.transpose(updates, gathered)
        if combine == "add":
            return self.emit("scatter_add", [operand, indices, updates], {"axis": axis})
        if combine == "set":
            return self._scatter_set(operand, indices, updates, axis)
        attrs = {"axis": axis, "combine": SCATTER_COMBINES[combine]}
        return self.emit("scatter", [operand, indices, updates], attrs)

    def _scatter_set(self, operand, indices, updates, axis: str):
        """The last update aimed at each element wins: the largest update position (over the
        indices' axes, row-major) is scattered with max, then that update gathered."""
        own = indices.ty.axes
        count = int(np.prod(indices.ty.extents, dtype=np.int64))
        dtype = i64 if count > np.iinfo(np.int32).max else i32
        source = _fresh(set(updates.ty.axes), f"{axis}_update")
        rest = [a for a in updates.ty.axes if a not in own]
        rest_extents = [(a, updates.ty.extent(a)) for a in rest]
        flat_updates = self.reshape(
            self.transpose(updates, (*own, *rest)), ((source, count), *rest_extents)
        )
        positions = self.reshape(
            self.iota(TensorType(dtype, ((source, count),)), source), indices.ty.named_extents
        )
        positions = self.broadcast_to(positions, updates.ty.with_dtype(dtype))
        nothing = self.full(operand.ty.with_dtype(dtype), -1)
        attrs = {"axis": axis, "combine": "max"}
        winner = self.emit("scatter", [nothing, indices, positions], attrs)
        picked = self.gather(flat_updates, self.maximum(winner, 0), source)
        landed = self.compare("ge", winner, 0)
        return self.transpose(self.select(landed, picked, operand), operand.ty.axes)


# -- indexing by name --------------------------------------------------------------------------


def _index_pairs(x: Any, key: Any) -> list[tuple[str, Any]]:
    """`x["token", 1:]`, `x["token", 1:, "batch", 0]` or `x[{"token": slice(1, None)}]` as
    (axis, index) pairs."""
    if isinstance(key, Mapping):
        return list(key.items())
    if (
        not isinstance(key, tuple)
        or len(key) % 2
        or not all(isinstance(name, str) for name in key[::2])
    ):
        raise AxisError(
            f"index {key!r}: index by axis name, as x['token', 1:], x['batch', 0], "
            f"x['token', 1:, 'batch', 0] or x[{{'token': slice(1, None)}}]; the axes of {x.ty} "
            f"are {', '.join(x.ty.axes) or '(none, it is a scalar)'}"
        )
    return list(zip(key[::2], key[1::2], strict=True))


def index_by_name(ops: Any, x: Any, key: Any) -> Any:
    """Slice (`start:stop:step`) or index (an int, which removes the axis) `x` along named axes.

    >>> import accy, numpy as np
    >>> x = accy.named(np.arange(12).reshape(3, 4).astype(np.float32), ("row", "col"))
    >>> x["col", ::2, "row", -1].array.tolist()
    [8.0, 10.0]
    """
    for axis, index in _index_pairs(x, key):
        if not x.ty.has(axis):
            raise AxisError(
                f"index: axis {axis!r} is not on {x.ty}; its axes are "
                f"{', '.join(x.ty.axes) or '(none, it is a scalar)'}"
            )
        extent = x.ty.extent(axis)
        if isinstance(index, slice):
            start, stop, step = index.indices(extent)
            if step < 0:
                raise AxisError(f"index: axis {axis!r}: negative steps are not supported")
            x = ops.slice(x, axis, start, max(start, stop), step)
        elif isinstance(index, int | np.integer) and not isinstance(index, bool):
            position = int(index) + extent if index < 0 else int(index)
            if not 0 <= position < extent:
                raise AxisError(
                    f"index: {int(index)} is out of range for axis {axis!r} of extent {extent}"
                )
            x = ops.slice(x, axis, position, position + 1)
            x = ops.reshape(x, x.ty.without([axis]).named_extents)
        elif _is_integer_scalar(index):
            x = _dynamic_index(ops, x, axis, index)
        else:
            raise AxisError(
                f"index: axis {axis!r} takes an int, an integer scalar array or a slice, got "
                f"{index!r}; gather with x.gather(indices, axis) picks rows by an index array"
            )
    return x


def _is_integer_scalar(index: Any) -> bool:
    ty = getattr(index, "ty", None)
    return isinstance(ty, TensorType) and ty.rank == 0 and ty.dtype in (i32, i64)


def _dynamic_index(ops: Any, x: Any, axis: str, index: Any) -> Any:
    """`x` at the traced position `index` along `axis`, which it removes (JAX's `x[i]`): a
    negative index counts from the end, and an out-of-range one is clamped, as JAX's is."""
    extent = x.ty.extent(axis)
    index = ops.select(ops.compare("lt", index, 0), ops.add(index, extent), index)
    x = ops.dynamic_slice(x, {axis: index}, {axis: 1})
    return ops.reshape(x, x.ty.without([axis]).named_extents)
