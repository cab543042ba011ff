"""Counting and set operations with a bounded output axis: `bincount`, `nonzero` and `unique`,
built from sort, cumsum, compare, select, gather and scatter, so that every backend runs them
and derivatives follow the recorded kinds (the values of `unique` differentiate through its
gather; indices and counts are integers).

The number of results depends on the data, so the caller names the output axis and its extent
(JAX's `size=`): results past that extent are dropped, and unused slots hold `fill_value`.

- `nonzero` ranks the nonzero elements by a cumulative count in row-major order, scatters each
  one's flat position to its rank, and unravels the positions into one index per axis.
- `unique` sorts the rows (a row is one element, or with `axis` one slice along it) by stable
  sorts on each column, last column first (a lexicographic order), marks each row that differs
  from the one before it, and numbers the groups by a cumulative count of the marks.
"""

from __future__ import annotations

from typing import Any

from ..errors import AxisError, DTypeError
from .indexing import _fresh
from .types import TensorType, bool_, i32, i64


class Counting:
    """bincount, nonzero and unique over `OpsApi`'s primitives (a mixin)."""

    def _check_output_axis(self, kind: str, x, axis: str, extent: int) -> None:
        if not isinstance(axis, str):
            raise AxisError(f"{kind}: the output axis must be a name (a string), got {axis!r}")
        if x.ty.has(axis):
            raise AxisError(
                f"{kind}: the output axis {axis!r} is already an axis of {x.ty}; name a new one"
            )
        if not isinstance(extent, int) or isinstance(extent, bool) or extent < 0:
            raise AxisError(
                f"{kind}: the extent of output axis {axis!r} must be an int >= 0 (JAX's "
                f"size=), got {extent!r}"
            )

    def bincount(self, x, axis: str, extent: int, weights=None):
        """The number of times each value 0 .. extent - 1 occurs in the integer array `x` (or
        the sum of `weights` at those elements), along the new axis `axis`, as
        `jnp.bincount(x, weights, length=extent)`: negative values count as 0, values >= extent
        are dropped. Counts are i32; weighted sums have the weights' dtype and differentiate
        with respect to them.

        >>> import accy
        >>> p = accy.trace.define("b", [accy.spec(accy.i32, t=4)],
        ...                       lambda b, a: b.bincount(a[0], "bin", 3))
        >>> accy.reference.run(p, [[2, 0, 2, 9]])[0].tolist()
        [1, 0, 2]
        """
        self._check_output_axis("bincount", x, axis, extent)
        if x.ty.dtype not in (i32, i64):
            raise DTypeError(f"bincount: x must be an i32 or i64 array, got {x.ty}")
        if weights is None:
            weights = self.broadcast_to(self.scalar(i32, 1), x.ty)
        elif not hasattr(weights, "ty") or weights.ty.shape != x.ty.shape:
            got = weights.ty if hasattr(weights, "ty") else repr(weights)
            raise AxisError(f"bincount: weights must have the axes of x ({x.ty}), got {got}")
        indices = self.maximum(x, 0)
        bins = self.zeros(TensorType(weights.ty.dtype, ((axis, extent),)))
        return self.scatter(bins, indices, weights, axis, "add", mode="drop")

    def nonzero(self, x, axis: str, extent: int, fill_value: int = 0):
        """The positions of the nonzero elements of `x` in row-major order (`jnp.nonzero(x,
        size=extent, fill_value=...)`): a tuple of i32 arrays over the new axis `axis`, one per
        axis of `x` in layout order; slots past the last nonzero element hold `fill_value`.

        >>> import accy
        >>> p = accy.trace.define("n", [accy.spec(accy.f32, t=4)],
        ...                       lambda b, a: b.nonzero(a[0], "hit", 3, fill_value=-1))
        >>> accy.reference.run(p, [[0.0, 2.0, 0.0, 5.0]])[0].tolist()
        [1, 3, -1]
        """
        self._check_output_axis("nonzero", x, axis, extent)
        if x.ty.rank == 0:
            raise AxisError("nonzero: x is a scalar; it needs at least one axis (as jnp.nonzero)")
        flat_axis = _fresh(set(x.ty.axes) | {axis}, "flat")
        flat = self.merge(x, x.ty.axes, flat_axis)
        hits = flat if flat.ty.dtype == bool_ else self.compare("ne", flat, 0)
        counted = self.convert(hits, i32)
        rank = self.sub(self.cumulative(counted, "sum", flat_axis), 1)
        target = self.select(hits, rank, extent)  # misses go past the end: dropped
        slots = self.zeros(TensorType(i32, ((axis, extent),)))
        positions = self._positions(flat, flat_axis)
        found = self.scatter(slots, target, positions, axis, "add", mode="drop")
        used = self.compare("lt", self._positions(slots, axis), self.sum(counted))
        out = []
        stride = x.ty.size
        for name in x.ty.axes:
            stride //= max(x.ty.extent(name), 1)
            index = self.remainder(self.floor_divide(found, max(stride, 1)), x.ty.extent(name))
            out.append(self.select(used, index, self.scalar(i32, fill_value)))
        return tuple(out)

    def unique(
        self,
        x,
        axis: str,
        extent: int,
        along: str | None = None,
        fill_value: Any = None,
    ) -> dict[str, Any]:
        """The sorted distinct elements of `x` (or, with `along`, its distinct slices along that
        axis) over the new axis `axis` of `extent` slots, as `jnp.unique(x, size=extent,
        axis=...)`, with what its return_index, return_inverse and return_counts give: a dict
        of "values" (unused slots hold `fill_value`, by default the smallest value, or row, as
        JAX), "index" (i32: the position of each value's first occurrence, along `along` or in
        the row-major order of `x`; unused slots repeat slot 0's), "inverse" (i32, with `x`'s
        axes, or just `along`: the slot of each element) and "counts" (i32: occurrences of each
        value; 0 in unused slots).

        >>> import accy
        >>> p = accy.trace.define("u", [accy.spec(accy.i32, t=4)],
        ...                       lambda b, a: b.unique(a[0], "u", 3)["inverse"])
        >>> accy.reference.run(p, [[7, 5, 7, 7]])[0].tolist()
        [1, 0, 1, 1]
        """
        self._check_output_axis("unique", x, axis, extent)
        if along is not None:
            self._require_axes("unique", x, [along])
        if x.ty.rank == 0:
            raise AxisError("unique: x is a scalar; it needs at least one axis")
        taken = set(x.ty.axes) | {axis}
        if along is None:
            rows_axis = _fresh(taken, "flat")
            table = self.merge(x, x.ty.axes, rows_axis)
            columns = []
        else:
            rows_axis, table = along, x
            columns = [a for a in x.ty.axes if a != along]
        column_axis = _fresh(taken, "columns")
        rows = self.merge(table, columns, column_axis) if columns else table
        n = rows.ty.extent(rows_axis)
        order = self._lexicographic_order(rows, rows_axis, column_axis if columns else None)
        ranked = self.gather(self.unary("stop_gradient", rows), order, rows_axis)
        earlier = self.pad(self.slice(ranked, rows_axis, 0, max(n - 1, 0)), rows_axis, 1, 0, 0)
        differs = self.compare("ne", ranked, earlier)
        if ranked.ty.dtype.is_float:  # NaNs are equal to each other here, as jnp's equal_nan
            both_nan = self.binary(
                "and", self.compare("ne", ranked, ranked), self.compare("ne", earlier, earlier)
            )
            differs = self.binary("and", differs, self.unary("not", both_nan))
        differs = self.convert(differs, i32)
        if columns:
            differs = self.reduce_max(differs, column_axis)
        first = self.compare("eq", self._positions(ranked, rows_axis), 0)
        starts = self.select(first, 1, differs)  # 1 where a new group begins (sorted order)
        group = self.sub(self.cumulative(starts, "sum", rows_axis), 1)
        is_start = self.compare("eq", starts, 1)
        slots = self.zeros(TensorType(i32, ((axis, extent),)))
        positions = self._positions(ranked, rows_axis)
        start_rank = self.scatter(
            slots, self.select(is_start, group, extent), positions, axis, "add", mode="drop"
        )
        used = self.compare("lt", self._positions(slots, axis), self.sum(starts))
        # unused slots keep start rank 0: the index of slot 0's value, as JAX pads it
        index = self.gather(order, start_rank, rows_axis)
        values = self.gather(table, index, rows_axis)
        if fill_value is None:  # the smallest value (row), in slot 0, as JAX
            fill_value = self.gather(values, self.scalar(i32, 0), axis)
        values = self.transpose(self.select(used, values, fill_value), values.ty.axes)
        inverse = self.scatter(self.zeros(group.ty), order, group, rows_axis, "add")
        if along is None:
            inverse = self.split(inverse, rows_axis, x.ty.shape)
        ones = self.broadcast_to(self.scalar(i32, 1), group.ty)
        counts = self.scatter(slots, group, ones, axis, "add", mode="drop")
        return {"values": values, "index": index, "inverse": inverse, "counts": counts}

    def _lexicographic_order(self, rows, rows_axis: str, column_axis: str | None):
        """The i32 permutation along `rows_axis` that sorts the rows of `rows` (stable), by
        their elements along `column_axis` in order: a stable sort by each column, the last
        first."""
        order = self._positions(rows, rows_axis)
        keys = self.unary("stop_gradient", rows)
        if column_axis is None:
            return self.sort([keys, order], rows_axis)[1]
        for c in reversed(range(rows.ty.extent(column_axis))):
            column = self.gather(keys, self.scalar(i32, c), column_axis)
            order = self.sort([self.gather(column, order, rows_axis), order], rows_axis)[1]
        return order
