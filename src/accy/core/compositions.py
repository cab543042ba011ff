"""Array operations built from the closed set of kinds: no new kind, so differentiation and
every backend handle them through the rules of the kinds they record.

`Compositions` is a mixin of `OpsApi` (`accy.core.operations`): flip, roll, tril/triu,
cumulative sums, products, maxima and minima, padding modes, dynamic slices with traced
starts, and argmax/argmin.

- Cumulative operations are Hillis-Steele scans: log2(n) rounds of `x op shifted(x)`, each a
  slice and a pad, which fuse into elementwise loops; a float sum may differ from a
  sequential one in the last bits.
- Dynamic slices clamp their start indices as JAX's `lax.dynamic_slice` does: the slice always
  lies inside the operand (a start past the end is moved back).
- sort, argsort and top_k are the kind `sort` (stable, NaN last; `core/kinds/sorting.py`)
  carrying the operands, or positions (an iota) for argsort and top_k.
- argmax/argmin return the first index of the extreme value (as NumPy), and of the first NaN
  where there is one.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..errors import AxisError, TypeRuleError
from .kinds.registry import check_has_axes
from .types import TensorType, i32

_IDENTITIES = {"sum": 0, "prod": 1}
_COMBINE = {"sum": "add", "prod": "mul", "max": "max", "min": "min"}


class Compositions:
    """Compositions over `OpsApi`'s primitives (this class only adds methods)."""

    def _index_vector(self, indices, axis: str):
        """A constant i32 vector along `axis` (for gathers with indices known when tracing)."""
        indices = np.asarray(indices, np.int64)
        return self.constant(indices, TensorType(i32, ((axis, len(indices)),)))

    def _positions(self, x, axis: str, dtype=i32):
        """0, 1, 2, ... along `axis` of `x`, over `x`'s axis alone."""
        return self.iota(TensorType(dtype, ((axis, x.ty.extent(axis)),)), axis)

    def flip(self, x, axis: str):
        """`x` with the order of its elements along `axis` reversed."""
        self._require_axes("flip", x, [axis])
        n = x.ty.extent(axis)
        return self.gather(x, self._index_vector(np.arange(n)[::-1], axis), axis)

    def roll(self, x, shift, axis: str):
        """Elements moved `shift` places forward along `axis`, wrapping around (np.roll);
        `shift` is an int, or an integer scalar array (traced or not: jnp.roll's array shift)."""
        self._require_axes("roll", x, [axis])
        n = x.ty.extent(axis)
        if hasattr(shift, "ty"):
            return self._roll_by_array(x, shift, axis, n)
        shift = shift % n if n else 0
        if shift == 0:
            return x
        return self.concatenate(
            [self.slice(x, axis, n - shift, n), self.slice(x, axis, 0, n - shift)], axis
        )

    def _roll_by_array(self, x, shift, axis: str, n: int):
        if shift.ty.rank != 0 or shift.ty.dtype.is_float or shift.ty.dtype.name == "bool":
            raise AxisError(
                f"roll: the shift must be an int or an integer scalar, got {shift.ty}; roll "
                "along one axis by one amount (index or reduce the shift first)"
            )
        if n == 0:
            return x
        # the window of [x, x] that starts (n - shift) mod n elements in
        start = self.remainder(self.sub(n, self.remainder(shift, n)), n)
        doubled = self.concatenate([x, x], axis)
        return self.transpose(self.dynamic_slice(doubled, {axis: start}, {axis: n}), x.ty.axes)

    def triangle(self, x, rows: str, columns: str, k: int = 0, lower: bool = True):
        """`x` where column - row <= k (lower) or >= k (upper), zero elsewhere."""
        self._require_axes("tril" if lower else "triu", x, [rows, columns])
        offset = self.sub(self._positions(x, columns), self._positions(x, rows))
        keep = self.compare("le" if lower else "ge", offset, k)
        kept = self.select(keep, x, self.zeros(TensorType(x.ty.dtype, ())))
        return self.transpose(kept, x.ty.axes)

    def tril(self, x, rows: str, columns: str, k: int = 0):
        """The lower triangle of `x` over (`rows`, `columns`): column - row <= k, else 0."""
        return self.triangle(x, rows, columns, k, lower=True)

    def triu(self, x, rows: str, columns: str, k: int = 0):
        """The upper triangle of `x` over (`rows`, `columns`): column - row >= k, else 0."""
        return self.triangle(x, rows, columns, k, lower=False)

    def trace(self, x, axis1: str, axis2: str, offset: int = 0):
        """The sum of the diagonal of `x` over (`axis1`, `axis2`): the elements where
        position(axis2) - position(axis1) == offset, summed over both axes (np.trace).

        >>> import accy
        >>> p = accy.trace.define("t", [accy.spec(accy.f32, r=2, c=2)],
        ...                       lambda b, a: b.trace(a[0], "r", "c"))
        >>> float(accy.reference.run(p, [[[1.0, 2.0], [3.0, 4.0]]])[0])
        5.0
        """
        self._require_axes("trace", x, [axis1, axis2])
        if axis1 == axis2:
            raise AxisError(
                f"trace: axis1 and axis2 are both {axis1!r}; name two different axes of {x.ty}"
            )
        offsets = self.sub(self._positions(x, axis2), self._positions(x, axis1))
        on_diagonal = self.compare("eq", offsets, int(offset))
        kept = self.select(on_diagonal, x, self.zeros(TensorType(x.ty.dtype, ())))
        return self.sum(kept, (axis1, axis2))

    def cumulative(self, x, op: str, axis: str, reverse: bool = False):
        """Inclusive cumulative `op` (sum, prod, max, min) along `axis`; from the end when
        `reverse`."""
        if op not in _COMBINE:
            raise TypeRuleError(f"cumulative: unknown op {op!r}; use one of {', '.join(_COMBINE)}")
        self._require_axes(f"cumulative {op}", x, [axis])
        n = x.ty.extent(axis)
        fill = _IDENTITIES.get(op)
        if fill is None:
            fill = self.extreme_value(x.ty.dtype, lowest=op == "max")
        shift = 1
        while shift < n:
            if reverse:
                moved = self.pad(self.slice(x, axis, shift, n), axis, 0, shift, fill)
            else:
                moved = self.pad(self.slice(x, axis, 0, n - shift), axis, shift, 0, fill)
            x = self.binary(_COMBINE[op], x, moved)
            shift *= 2
        return x

    def pad_with_mode(self, x, axis: str, low: int, high: int, mode: str):
        """Padding whose values come from `x` itself, as NumPy's np.pad modes: "reflect"
        (mirrored, the edge not repeated), "symmetric" (the edge repeated), "edge", "wrap"."""
        self._require_axes("pad", x, [axis])
        if mode not in ("reflect", "symmetric", "edge", "wrap"):
            raise TypeRuleError(
                f"pad: unknown mode {mode!r}; use constant, reflect, symmetric, edge or wrap"
            )
        n = x.ty.extent(axis)
        if low < 0 or high < 0:
            raise AxisError(f"pad: mode {mode!r} needs low and high >= 0, got {low} and {high}")
        if n == 0 and low + high:
            raise AxisError(f"pad: mode {mode!r} cannot pad the empty axis {axis!r} of {x.ty}")
        source = np.pad(np.arange(n), (low, high), mode=mode)
        return self.gather(x, self._index_vector(source, axis), axis)

    def dynamic_slice(self, x, starts: Mapping[str, object], sizes: Mapping[str, int]):
        """The block of `x` of `sizes` (axis -> extent) starting at `starts` (axis -> a traced
        integer scalar or an int), each start clamped into [0, extent - size] as JAX does."""
        for axis, size in sizes.items():
            self._require_axes("dynamic_slice", x, [axis])
            extent = x.ty.extent(axis)
            if not 0 <= size <= extent:
                raise AxisError(
                    f"dynamic_slice: size {size} of axis {axis!r} must be in [0, {extent}] ({x.ty})"
                )
            start = self._clamped_start(starts.get(axis, 0), extent - size)
            positions = self.iota(TensorType(i32, ((axis, size),)), axis)
            x = self.gather(x, self.add(positions, start), axis)
        return x

    def dynamic_update_slice(self, x, update, starts: Mapping[str, object]):
        """`x` with `update` written at `starts` (axis -> a traced integer scalar or an int;
        axes not named start at 0), each start clamped into [0, extent - update's extent]."""
        self._require_axes("dynamic_update_slice", x, update.ty.axes)
        inside = None
        for axis in update.ty.axes:
            extent, size = x.ty.extent(axis), update.ty.extent(axis)
            if size > extent:
                raise AxisError(
                    f"dynamic_update_slice: the update {update.ty} is longer than {x.ty} along "
                    f"{axis!r}"
                )
            start = self._clamped_start(starts.get(axis, 0), extent - size)
            local = self.sub(self._positions(x, axis), start)
            update = self.gather(update, local, axis)  # out-of-range rows clamp, then masked
            here = self.binary("and", self.compare("ge", local, 0), self.compare("lt", local, size))
            inside = here if inside is None else self.binary("and", inside, here)
        if inside is None:
            return x
        return self.transpose(self.select(inside, update, x), x.ty.axes)

    def _clamped_start(self, start, high: int):
        if not hasattr(start, "ty"):
            return self.scalar(i32, min(max(int(start), 0), high))
        if start.ty.rank != 0 or start.ty.dtype.is_float:
            raise TypeRuleError(f"a dynamic start index must be an integer scalar, got {start.ty}")
        return self.convert(self.minimum(self.maximum(start, 0), high), i32)

    def argmax(self, x, axis: str):
        """The i32 position of the largest element along `axis` (the first of ties, or of
        NaNs)."""
        return self._arg_extreme(x, axis, "max")

    def argmin(self, x, axis: str):
        """The i32 position of the smallest element along `axis` (the first of ties, or of
        NaNs)."""
        return self._arg_extreme(x, axis, "min")

    def _arg_extreme(self, x, axis: str, op: str):
        self._require_axes(f"arg{op}", x, [axis])
        n = x.ty.extent(axis)
        extreme = self.reduce_max(x, axis) if op == "max" else self.reduce_min(x, axis)
        extreme = self.unary("stop_gradient", extreme)
        hits = self.compare("eq", x, extreme)
        if x.ty.dtype.is_float:
            hits = self.binary("or", hits, self.compare("ne", x, x))
        candidates = self.select(hits, self._positions(x, axis), n)
        return self.reduce_min(candidates, axis)

    def sort(self, operands, axis: str, descending: bool = False):
        """Sort along `axis` by the first operand, carrying the others along (a tuple of the
        sorted operands, each with its own axes); stable, NaN last (first when
        `descending`). Derivatives follow the permutation.

        >>> import accy
        >>> p = accy.trace.define("s", [accy.spec(accy.f32, n=3)] * 2,
        ...                       lambda b, a: b.sort([a[0], a[1]], "n", descending=True))
        >>> [r.tolist() for r in accy.reference.run(p, [[1, 3, 2], [10, 30, 20]])]
        [[3.0, 2.0, 1.0], [30.0, 20.0, 10.0]]
        """
        operands = list(operands) if isinstance(operands, list | tuple) else [operands]
        check_has_axes("sort", operands[0].ty, [axis], role="keys")
        keys = operands[0]
        # Operands with the keys' axes ride in the kind; one with more axes is gathered by the
        # permutation (the keys' other axes are then its batch axes).
        same = [sorted(x.ty.axes) == sorted(keys.ty.axes) for x in operands]
        for x, carried in zip(operands, same, strict=True):
            if not carried:
                check_has_axes("sort", x.ty, keys.ty.axes)
        aligned = [
            self.transpose(x, keys.ty.axes) for x, c in zip(operands, same, strict=True) if c
        ]
        if not all(same):
            aligned.append(self.iota(keys.ty.with_dtype(i32), axis))
        attrs = {"axis": axis, "descending": bool(descending)}
        results = list(self.emit("sort", aligned, attrs))
        order = results[-1]
        out = []
        for x, carried in zip(operands, same, strict=True):
            picked = results.pop(0) if carried else self.gather(x, order, axis)
            out.append(self.transpose(picked, x.ty.axes))
        return tuple(out)

    def argsort(self, x, axis: str, descending: bool = False):
        """The i32 positions that sort `x` along `axis` (stable: equal elements keep their
        order; NaN last, or first when `descending`)."""
        self._require_axes("argsort", x, [axis])
        positions = self.iota(x.ty.with_dtype(i32), axis)
        return self.sort([x, positions], axis, descending)[1]

    def top_k(self, x, k: int, axis: str):
        """The `k` largest elements along `axis` in descending order and their i32 positions
        (the first position among equal elements first, as lax.top_k)."""
        n = x.ty.extent(axis) if x.ty.has(axis) else 0
        if not 0 <= k <= n:
            raise AxisError(f"top_k: k={k} must be in [0, {n}] for axis {axis!r} of {x.ty}")
        positions = self.iota(x.ty.with_dtype(i32), axis)
        values, order = self.sort([x, positions], axis, descending=True)
        return self.slice(values, axis, 0, k), self.slice(order, axis, 0, k)
