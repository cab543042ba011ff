"""The operation-building API shared by the tracer's `Builder` and by transformations.

`OpsApi` turns named-axis requests (add these, sum over `channel`, contract over `key`) into IR
operations through one method, `emit(kind, operands, attrs)`, which a subclass provides: the
`Builder` appends to a program, a transformation's emitter passes the operation down a stack of
interpreter layers. Elementwise operations broadcast by axis name here, so the IR always holds
explicit `broadcast_in_dim`/`transpose` operations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import AccyError, AxisError, DTypeError
from .arrays import ConstantArray
from .compositions import Compositions
from .counting import Counting
from .indexing import Indexing
from .ir import Program, permute_parameters
from .kinds.creation import normalize_scalar
from .kinds.registry import Zero
from .types import DType, TensorType, bool_, compute_dtype
from .walk import Inline, run
from .windows import Windows

Scalar = bool | int | float

CHECKPOINT_AXIS = "checkpoint_"
"""The axis of the one-step scan that `OpsApi.checkpoint` makes of a region."""


def axis_tuple(axes) -> tuple[str, ...]:
    """Normalize an axis argument: one name, or a sequence of names."""
    if isinstance(axes, str):
        return (axes,)
    return tuple(axes)


def check_contracted_axes(
    what: str, a: TensorType, b: TensorType, axes: Sequence[str], labels: tuple[str, str]
) -> None:
    """An AxisError unless every axis of `axes` is on both `a` and `b` with one extent;
    `labels` name the two operands in the message.

    >>> from accy.core.types import f32
    >>> a, b = TensorType(f32, (("i", 2),)), TensorType(f32, (("i", 3),))
    >>> check_contracted_axes("f", a, b, ("i",), ("a", "b"))
    Traceback (most recent call last):
    ...
    accy.errors.AxisError: f: axis 'i' has extent 2 on a and 3 on b
    """
    for axis in axes:
        if not (a.has(axis) and b.has(axis)):
            raise AxisError(
                f"{what}: axis {axis!r} must be on both operands, but {labels[0]} has "
                f"({', '.join(a.axes)}) and {labels[1]} has ({', '.join(b.axes)}); a typo must "
                "not become an outer product"
            )
        if a.extent(axis) != b.extent(axis):
            raise AxisError(
                f"{what}: axis {axis!r} has extent {a.extent(axis)} on {labels[0]} and "
                f"{b.extent(axis)} on {labels[1]}"
            )


def is_axis_argument(x: Any) -> bool:
    """An axis name or a sequence of them (an empty one reduces over no axes)."""
    return isinstance(x, str) or (
        isinstance(x, tuple | list) and all(isinstance(a, str) for a in x)
    )


class OpsApi(Compositions, Counting, Indexing, Windows):
    """Named-axis operations over traced values; subclasses provide `emit`. The operations
    composed of others (flip, cumsum, dynamic_slice, argmax, ...) are in `Compositions`."""

    def emit(self, kind: str, operands: Sequence[Any], attrs=None, id: int | None = None):
        """Build one operation of `kind` (type-checked by `builder.check_operation`)."""
        raise NotImplementedError

    def subprogram(self, name: str, specs: Sequence[TensorType], body):
        """Trace the Python function `body(builder, args)` into a Program of its own."""
        raise NotImplementedError

    def capturing_subprogram(self, name: str, specs: Sequence[TensorType], body):
        """Like `subprogram`, also returning the enclosing values the body used (closures),
        which the program takes as extra parameters after `specs`; none by default."""
        return self.subprogram(name, specs, body), []

    # -- creation ---------------------------------------------------------------------------

    def scalar(self, dtype: DType, value: Scalar):
        """A rank-0 constant: `builder.scalar(accy.f32, 0.0)`."""
        return self.full(TensorType(dtype, ()), value)

    def full(self, type: TensorType, value: Scalar):
        """A constant of `type` with every element equal to `value`."""
        return self.emit(
            "constant", [], {"type": type, "value": normalize_scalar(value, type.dtype)}
        )

    def zeros(self, type: TensorType):
        return self.full(type, 0)

    def constant(self, values, type: TensorType):
        """A constant holding `values` (a NumPy array or nested lists in `type`'s layout)."""
        array = np.asarray(values)
        if array.shape != type.extents:
            raise AxisError(
                f"constant: values have shape {array.shape} but {type} needs {type.extents}"
            )
        values = ConstantArray.of(array, type.dtype, type.extents)
        return self.emit("constant", [], {"type": type, "value": values})

    def iota(self, type: TensorType, axis: str):
        """Values counting 0, 1, 2, ... along `axis`, repeated over the other axes of `type`."""
        return self.emit("iota", [], {"type": type, "axis": axis})

    def instantiate(self, value):
        """A traced value for a tangent that may be a symbolic `Zero`."""
        return self.zeros(value.type) if isinstance(value, Zero) else value

    # -- elementwise ------------------------------------------------------------------------

    def unary(self, op: str, x):
        return self.emit("unary", [x], {"op": op})

    def neg(self, x):
        return self.unary("neg", x)

    def add(self, a, b):
        return self.binary("add", a, b)

    def sub(self, a, b):
        return self.binary("sub", a, b)

    def mul(self, a, b):
        return self.binary("mul", a, b)

    def div(self, a, b):
        return self.binary("div", a, b)

    def pow(self, a, b):
        return self.binary("pow", a, b)

    def maximum(self, a, b):
        return self.binary("max", a, b)

    def minimum(self, a, b):
        return self.binary("min", a, b)

    def binary(self, kind: str, a, b):
        a, b = self._values(kind, a, b)
        a, b = self.align(kind, a, b)
        return self.emit(kind, [a, b])

    def compare(self, direction: str, a, b):
        a, b = self._values(f"compare {direction}", a, b)
        a, b = self.align(f"compare {direction}", a, b)
        return self.emit("compare", [a, b], {"direction": direction})

    def select(self, predicate, on_true, on_false):
        """Elementwise `on_true if predicate else on_false`, broadcasting by axis name; a
        Python bool is a predicate too."""
        if not hasattr(predicate, "ty"):
            predicate = self.full(TensorType(bool_, ()), normalize_scalar(predicate, bool_))
        on_true, on_false = self._values("select", on_true, on_false)
        predicate, on_true, on_false = self.align("select", predicate, on_true, on_false)
        return self.emit("select", [predicate, on_true, on_false])

    def convert(self, x, dtype: DType):
        if x.ty.dtype == dtype:
            return x
        return self.emit("convert", [x], {"dtype": dtype.name})

    def bitcast_convert(self, x, dtype: DType):
        """`x`'s bits reinterpreted as `dtype` of the same width (f32 <-> i32, f64 <-> i64)."""
        return self.emit("bitcast_convert", [x], {"dtype": dtype.name})

    def floor_divide(self, a, b):
        """`a // b` as NumPy computes it: the quotient rounded toward -inf (x // 0 is 0 for
        integers; for floats, NumPy's divmod algorithm, so results agree with it exactly)."""
        a, b = self._values("floor_divide", a, b)
        if not a.ty.dtype.is_float:
            remainder = self.binary("rem", a, b)
            return self.sub(self.binary("div", a, b), self._remainder_adjustment(remainder, b))
        mod = self.binary("rem", a, b)
        quotient = self.div(self.sub(a, mod), b)
        adjust = self._remainder_adjustment(mod, b)
        quotient = self.sub(quotient, adjust)
        floored = self.unary("floor", quotient)
        floored = self.add(
            floored, self.convert(self.compare("gt", quotient - floored, 0.5), a.ty.dtype)
        )
        zero_quotient = self.binary("copysign", self.zeros(a.ty), self.div(a, b))
        floored = self.select(self.compare("eq", quotient, 0.0), zero_quotient, floored)
        return self.select(self.compare("eq", b, 0.0), self.div(a, b), floored)

    def remainder(self, a, b):
        """`a % b` as NumPy and Python compute it: the sign of the divisor (x % 0 is 0 for
        integers and NaN for floats)."""
        a, b = self._values("remainder", a, b)
        mod = self.binary("rem", a, b)
        adjust = self.compare("ne", self._remainder_adjustment(mod, b), 0)
        adjusted = self.select(adjust, self.add(mod, b), mod)
        if not a.ty.dtype.is_float:
            return adjusted
        zero = self.binary("copysign", self.zeros(mod.ty), b)
        return self.select(self.compare("eq", mod, 0.0), zero, adjusted)

    def _remainder_adjustment(self, mod, b):
        """1 where a truncated remainder `mod` and the divisor `b` differ in sign, else 0."""
        nonzero = self.compare("ne", mod, 0)
        differ = self.compare("ne", self.compare("lt", mod, 0), self.compare("lt", b, 0))
        return self.convert(self.binary("and", nonzero, differ), mod.ty.dtype)

    def _values(self, kind: str, a, b):
        """Make Python scalars into constants of the other operand's dtype; check dtypes."""
        a_has, b_has = hasattr(a, "ty"), hasattr(b, "ty")  # asked once each: every operation
        if not (a_has and b_has):
            if not a_has and not b_has:
                raise AccyError(f"{kind} needs at least one traced value, got {a!r} and {b!r}")
            if not a_has:
                a = self.full(TensorType(b.ty.dtype, ()), a)
            if not b_has:
                b = self.full(TensorType(a.ty.dtype, ()), b)
        if a.ty.dtype != b.ty.dtype:
            raise DTypeError(
                f"{kind}: operands have different dtypes (left {a.ty}, right {b.ty}); accy does "
                f"not promote dtypes silently, convert one with .convert(accy.{b.ty.dtype})"
            )
        return a, b

    def align(self, kind: str, *values):
        """Broadcast values by axis name to the union of their axes (left operand's first)."""
        named: dict[str, int] = {}
        for v in values:
            for name, extent in v.ty.named_extents:
                if named.setdefault(name, extent) != extent:
                    shapes = ", ".join(str(x.ty) for x in values)
                    raise AxisError(
                        f"{kind}: axis {name!r} has extent {named[name]} on one operand and "
                        f"{extent} on another ({shapes}); equal names need equal extents "
                        f"(rename one axis if they are different axes)"
                    )
        target = tuple(named.items())
        return [  # most operands have the union's axes in its order already: no new type
            v if v.ty.named_extents == target else self.broadcast_to(v, v.ty.with_axes(target))
            for v in values
        ]

    # -- layout -----------------------------------------------------------------------------

    def broadcast_to(self, x, target: Any):
        """`x` with `target`'s axes (by name and order), repeating it along new axes. `target` is
        a type, an array, or a mapping of axis names to extents (another array's `.shape`)."""
        goal = x.ty.with_axes(_named_extents_of(target))
        if goal == x.ty:
            return x
        if sorted(goal.axes) == sorted(x.ty.axes):
            return self.transpose(x, goal.axes)
        return self.emit("broadcast_in_dim", [x], {"shape": goal.named_extents})

    def transpose(self, x, order: Sequence[str]):
        """Lay `x` out with its axes in `order` (the meaning does not change)."""
        order = axis_tuple(order)
        if order == x.ty.axes:
            return x
        return self.emit("transpose", [x], {"order": order})

    def reshape(self, x, named_extents):
        named = tuple((n, int(e)) for n, e in named_extents)
        if named == x.ty.named_extents:
            return x
        return self.emit("reshape", [x], {"shape": named})

    def rename_axes(self, x, names: Sequence[str]):
        """Give `x`'s axes, in layout order, the names `names` (no data moves)."""
        return self.reshape(x, zip(names, x.ty.extents, strict=True))

    def rename(self, x, old: str, new: str):
        """Rename axis `old` to `new`: metadata only."""
        self._require_axes("rename", x, [old])
        if new != old and x.ty.has(new):
            raise AxisError(f"rename: {x.ty} already has an axis {new!r}")
        return self.rename_axes(x, [new if a == old else a for a in x.ty.axes])

    def merge(self, x, axes: Sequence[str], into: str):
        """Merge `axes` (in that order, row-major) into one axis `into`."""
        axes = axis_tuple(axes)
        self._require_axes("merge", x, axes)
        first = min(x.ty.position(a) for a in axes)
        rest = [a for a in x.ty.axes if a not in axes]
        order = rest[:first] + list(axes) + rest[first:]
        x = self.transpose(x, order)
        merged = int(np.prod([x.ty.extent(a) for a in axes], dtype=np.int64))
        named = [(a, e) for a, e in x.ty.named_extents if a not in axes]
        named.insert(first, (into, merged))
        return self.reshape(x, named)

    def split(self, x, axis: str, parts: dict[str, int]):
        """Split `axis` into `parts` (name -> extent, row-major): the inverse of `merge`."""
        self._require_axes("split", x, [axis])
        total = int(np.prod(list(parts.values()), dtype=np.int64))
        if total != x.ty.extent(axis):
            raise AxisError(
                f"split: parts {parts} have {total} elements but axis {axis!r} of {x.ty} has "
                f"{x.ty.extent(axis)}"
            )
        named = []
        for name, extent in x.ty.named_extents:
            named.extend(parts.items() if name == axis else [(name, extent)])
        return self.reshape(x, named)

    def slice(self, x, axis: str, start: int = 0, stop: int | None = None, step: int = 1):
        """Elements `start:stop:step` along `axis`."""
        self._require_axes("slice", x, [axis])
        position = x.ty.position(axis)
        stop = x.ty.extent(axis) if stop is None else stop
        starts = tuple(start if i == position else 0 for i in range(x.ty.rank))
        limits = tuple(stop if i == position else e for i, e in enumerate(x.ty.extents))
        strides = tuple(step if i == position else 1 for i in range(x.ty.rank))
        return self.slice_positional(x, starts, limits, strides)

    def slice_positional(self, x, starts, limits, strides):
        return self.emit(
            "slice",
            [x],
            {"starts": tuple(starts), "limits": tuple(limits), "strides": tuple(strides)},
        )

    def pad(
        self,
        x,
        axis: str,
        low: int = 0,
        high: int = 0,
        value: Scalar = 0,
        interior: int = 0,
        mode: str = "constant",
    ):
        """Pad `axis` with `low` elements before, `high` after and `interior` between each.

        `mode` "constant" pads with `value`; a negative `low` or `high` removes elements
        (after interior padding, as StableHLO's pad). "reflect", "symmetric", "edge" and
        "wrap" take the padding from `x` as NumPy's `np.pad` does (`Compositions`).
        """
        if mode != "constant":
            return self.pad_with_mode(x, axis, low, high, mode)
        self._require_axes("pad", x, [axis])
        if low < 0 or high < 0:
            padded = self.pad(x, axis, max(low, 0), max(high, 0), value, interior)
            extent = padded.ty.extent(axis)
            if -min(low, 0) - min(high, 0) > extent:
                raise AxisError(
                    f"pad: removing {-low} and {-high} elements of axis {axis!r} leaves fewer "
                    f"than none ({padded.ty})"
                )
            return self.slice(padded, axis, -min(low, 0), extent + min(high, 0))
        position = x.ty.position(axis)

        def per_axis(v):
            return tuple(v if i == position else 0 for i in range(x.ty.rank))

        fill = value if hasattr(value, "ty") else self.scalar(x.ty.dtype, value)
        return self.pad_positional(x, fill, per_axis(low), per_axis(high), per_axis(interior))

    def pad_positional(self, x, value, low, high, interior):
        return self.emit(
            "pad", [x, value], {"low": tuple(low), "high": tuple(high), "interior": tuple(interior)}
        )

    def concatenate(self, values: Sequence[Any], axis: str):
        """Join values along `axis`; other axes are matched by name."""
        if not values:
            raise AxisError("concatenate needs at least one value")
        first = values[0]
        self._require_axes("concatenate", first, [axis])
        laid_out = [first] + [
            self.transpose(v, first.ty.axes) if sorted(v.ty.axes) == sorted(first.ty.axes) else v
            for v in values[1:]
        ]
        return self.emit("concatenate", laid_out, {"axis": axis})

    # -- reductions -------------------------------------------------------------------------

    def reduce(self, x, init, op: str, axes=None):
        """Reduce `axes` of `x` with `op` (sum, max, min, prod), starting from scalar `init`."""
        axes = x.ty.axes if axes is None else axis_tuple(axes)
        if not hasattr(init, "ty"):
            init = self.scalar(x.ty.dtype, init)
        return self.emit("reduce", [x, init], {"op": op, "axes": axes})

    def sum(self, x, axes=None, accumulate: DType | None = None, where=None):
        """Sum over `axes` (one name or several; all axes when None), of the elements where
        the bool mask `where` holds when it is given (`masked`).

        f16 and bf16 are summed in f32 and the sum rounded once; `accumulate=accy.f32` keeps
        the f32 sum (the result is f32): the operand widened, exactly, in the same loop.
        """
        x = self.masked("sum", x, where, 0)
        if accumulate is not None and accumulate != x.ty.dtype:
            x = self.convert(x, self._accumulation("sum", x, accumulate))
        return self.reduce(x, 0, "sum", axes)

    def _accumulation(self, kind: str, x, accumulate: DType) -> DType:
        """Check that `accumulate` may sum `x`'s values: a float no narrower than x's compute
        dtype (the sum's own precision)."""
        widths = {"f16": 0, "bf16": 0, "f32": 1, "f64": 2}
        if not (x.ty.dtype.is_float and isinstance(accumulate, DType) and accumulate.is_float):
            raise DTypeError(
                f"{kind}: accumulate={accumulate!r} needs a float operand and a float dtype such "
                f"as accy.f32 (got {x.ty})"
            )
        if widths[accumulate.name] < widths[compute_dtype(x.ty.dtype).name]:
            raise DTypeError(
                f"{kind}: accumulate={accumulate} is narrower than {x.ty.dtype}'s compute dtype "
                f"{compute_dtype(x.ty.dtype)}; a sum is never accumulated in less precision"
            )
        return accumulate

    def reduce_max(self, x, axes=None):
        return self.reduce(x, _lowest(x.ty.dtype), "max", axes)

    def reduce_min(self, x, axes=None):
        return self.reduce(x, _highest(x.ty.dtype), "min", axes)

    def prod(self, x, axes=None, where=None):
        """The product over `axes`, of the elements where the mask `where` holds if given."""
        return self.reduce(self.masked("prod", x, where, 1), 1, "prod", axes)

    def masked(self, kind: str, x, where, identity):
        """`x` with `identity` where the bool mask `where` is False (`x` itself when `where` is
        None): the operand of a reduction with `where=`, as NumPy's. The mask's axes must be
        among `x`'s (it is broadcast by name over the others).

        >>> import accy
        >>> p = accy.trace.define("m", [accy.spec(accy.f32, n=3), accy.spec(accy.bool_, n=3)],
        ...                       lambda b, a: b.masked("sum", a[0], a[1], 0))
        >>> accy.reference.run(p, [[1.0, 2.0, 3.0], [True, False, True]])[0].tolist()
        [1.0, 0.0, 3.0]
        """
        if where is None:
            return x
        if not hasattr(where, "ty") or where.ty.dtype != bool_:
            got = where.ty if hasattr(where, "ty") else repr(where)
            raise DTypeError(f"{kind}: where= must be a bool array (a mask), got {got}")
        extra = [a for a in where.ty.axes if not x.ty.has(a)]
        if extra:
            raise AxisError(
                f"{kind}: the mask {where.ty} has axes {extra} that {x.ty} lacks; a mask's axes "
                f"must be among the operand's ({', '.join(x.ty.axes) or 'none'})"
            )
        for name in where.ty.axes:
            if where.ty.extent(name) != x.ty.extent(name):
                raise AxisError(
                    f"{kind}: axis {name!r} has extent {where.ty.extent(name)} on the mask "
                    f"{where.ty} but {x.ty.extent(name)} on {x.ty}"
                )
        kept = self.select(where, x, self.scalar(x.ty.dtype, identity))
        return self.transpose(kept, x.ty.axes)

    def extreme_value(self, dtype: DType, lowest: bool):
        """The lowest (or highest) value of `dtype`: the identity of max (or min)."""
        return _lowest(dtype) if lowest else _highest(dtype)

    def mean(self, x, axes=None, accumulate: DType | None = None, where=None):
        """The mean over `axes`; floats only (an integer mean would truncate silently). With
        the bool mask `where`, the mean of the elements where it holds (NaN where none does,
        as NumPy's `mean(where=)`).

        f16 and bf16 are summed and divided in f32, and rounded once; with `accumulate` the
        mean stays in that dtype.
        """
        axes = x.ty.axes if axes is None else axis_tuple(axes)
        self._require_axes("mean", x, axes)
        if not x.ty.dtype.is_float:
            raise DTypeError(
                f"mean needs a floating-point operand, got {x.ty}; convert it first, e.g. "
                f"x.convert(accy.f32).mean(...)"
            )
        wide = compute_dtype(x.ty.dtype) if accumulate is None else accumulate
        total = self.sum(x, axes, accumulate=wide, where=where)
        if where is None:
            count = float(np.prod([x.ty.extent(a) for a in axes], dtype=np.int64))
        else:
            ones = self.full(TensorType(total.ty.dtype, ()), 1)
            count = self.sum(self.broadcast_to(ones, x.ty), axes, where=where)
        mean = self.div(total, count)
        return mean if accumulate is not None else self.convert(mean, x.ty.dtype)

    # -- contraction ------------------------------------------------------------------------

    def dot_general(
        self,
        lhs,
        rhs,
        lhs_contracting,
        rhs_contracting,
        lhs_batch=(),
        rhs_batch=(),
        accumulate: DType | None = None,
    ):
        """StableHLO dot_general with positional dimensions; `accumulate` is the dtype the
        products are summed in and the result's (JAX's preferred_element_type)."""
        attrs = {
            "lhs_contracting": tuple(lhs_contracting),
            "rhs_contracting": tuple(rhs_contracting),
            "lhs_batch": tuple(lhs_batch),
            "rhs_batch": tuple(rhs_batch),
        }
        if accumulate is not None and accumulate != lhs.ty.dtype:
            if not isinstance(accumulate, DType):
                raise DTypeError(
                    f"accumulate must be an accy dtype such as accy.f32, got {accumulate!r}"
                )
            attrs["accumulate"] = accumulate.name
        return self.emit("dot_general", [lhs, rhs], attrs)

    def contract(self, a, b, axes, accumulate: DType | None = None):
        """Sum the product of `a` and `b` over `axes`, which both must have.

        Axes on both operands that are not contracted are batch axes. The result has the batch
        axes, then `a`'s other axes, then `b`'s other axes. f16 and bf16 products are summed in
        f32 and rounded once; `accumulate=accy.f32` keeps the f32 sum as an f32 result.
        """
        axes = axis_tuple(axes)
        labels = (f"the left operand {a.ty}", f"the right operand {b.ty}")
        check_contracted_axes("contract", a.ty, b.ty, axes, labels)
        batch = [n for n in a.ty.axes if b.ty.has(n) and n not in axes]
        for axis in batch:
            if a.ty.extent(axis) != b.ty.extent(axis):
                raise AxisError(
                    f"contract: shared axis {axis!r} (a batch axis) has extent "
                    f"{a.ty.extent(axis)} on {a.ty} and {b.ty.extent(axis)} on {b.ty}"
                )
        return self.dot_general(
            a,
            b,
            [a.ty.position(n) for n in axes],
            [b.ty.position(n) for n in axes],
            [a.ty.position(n) for n in batch],
            [b.ty.position(n) for n in batch],
            accumulate=accumulate,
        )

    # -- indexing ---------------------------------------------------------------------------

    def scatter_add(self, operand, indices, updates, axis: str, mode: str = "clip"):
        """`operand` plus each slice of `updates` added at its index along `axis`: `scatter`
        with combine="add" (batch axes and modes as there).

        `updates` has the axes that `gather` would give (the operand's, with `axis` replaced by
        the indices' axes), matched by name: it is laid out in that order first if needed.
        """
        return self.scatter(operand, indices, updates, axis, "add", mode)

    # -- control ----------------------------------------------------------------------------

    def custom_call(self, target: str, version: int, args: Sequence[Any], result_type: TensorType):
        """An opaque call to `target`; its result has `result_type`."""
        return self.emit(
            "custom_call", list(args), {"target": target, "version": version, "type": result_type}
        )

    def scan(
        self,
        body,
        consts=(),
        carries=(),
        xs=(),
        axis: str = "step",
        reverse: bool = False,
        remat: bool = False,
    ):
        """Loop `body` over `axis` of the `xs`, threading `carries`; see `accy.core.kinds.control`.

        `body` is a Program, or a function `body(builder, args)` traced on the fly, which may use
        values of the enclosing program (they become extra consts, and are differentiable).
        `remat=True` makes reverse-mode differentiation store only the carries of each step and
        recompute the body's intermediates in the backward scan. Returns (final carries,
        stacked ys) as two tuples.

        >>> import accy
        >>> def program(b, args):
        ...     w, h, xs = args
        ...     (final,), _ = b.scan(lambda b, a: ((a[0] * w + a[1]).tanh(),), carries=[h],
        ...                          xs=[xs], axis="time")
        ...     return final.sum("lane")
        >>> p = accy.trace.define("rnn", [accy.spec(accy.f32, lane=2)] * 2
        ...                       + [accy.spec(accy.f32, time=3, lane=2)], program)
        >>> p.count("scan")
        1
        """
        consts, carries, xs = list(consts), list(carries), list(xs)
        if not xs:
            raise AxisError("scan needs at least one x to scan over")
        for x in xs:
            self._require_axes("scan", x, [axis])
        length = xs[0].ty.extent(axis)
        if not isinstance(body, Program):
            specs = [v.ty for v in consts + carries] + [x.ty.without([axis]) for x in xs]
            body, captured = self.capturing_subprogram("scan_body", specs, body)
            if captured:
                # The captured values are consts, placed after the given ones.
                given, extra = len(consts), len(captured)
                rest = range(given, len(specs))
                order = [*range(given), *range(len(specs), len(specs) + extra), *rest]
                body = permute_parameters(body, order)
                consts = consts + list(captured)
        attrs = {
            "body": body,
            "axis": axis,
            "length": length,
            "num_consts": len(consts),
            "num_carry": len(carries),
            "reverse": reverse,
        }
        if remat:
            attrs["remat"] = True
        results = self.emit("scan", consts + carries + xs, attrs)
        results = results if isinstance(results, tuple) else (results,)
        return tuple(results[: len(carries)]), tuple(results[len(carries) :])

    def _branches(self, name: str, functions: Sequence[Any], specs: list) -> tuple[list, list]:
        """Trace functions over the same `specs` into programs that share their captured
        enclosing values: every program takes `specs`, then all the captured values."""
        traced = [
            f if isinstance(f, Program) else self.capturing_subprogram(name, specs, _as_list(f))
            for f in functions
        ]
        traced = [(t, []) if isinstance(t, Program) else t for t in traced]
        captured: list = []
        for _, values in traced:
            captured += [v for v in values if not any(v is c for c in captured)]
        if not captured:
            return [t for t, _ in traced], []
        programs = []
        for program, values in traced:
            extra = [c.ty for c in captured]
            positions = [next(i for i, c in enumerate(captured) if c is v) for v in values]

            def widened(b, args, program=program, positions=positions):
                inputs = list(args[: len(specs)]) + [args[len(specs) + i] for i in positions]
                return run(program, Inline(b, inputs, program))

            programs.append(_define_program(self, program.name, specs + extra, widened))
        return programs, captured

    def cond(self, predicate, on_true, on_false, args: Sequence[Any]):
        """`on_true(builder, args)` if the bool scalar `predicate` holds, else
        `on_false(builder, args)`: only the selected branch runs. The branches (functions or
        Programs) return the same types and may use enclosing values. Returns a Value, or a
        tuple when the branches return several.

        >>> import accy
        >>> def f(b, a):
        ...     return b.cond(a[0].sum("lane") > 0.0, lambda b, v: v[0] * 2.0,
        ...                   lambda b, v: -v[0], [a[0]])
        >>> p = accy.trace.define("f", [accy.spec(accy.f32, lane=2)], f)
        >>> [x.tolist() for x in accy.reference.run(p, [[1.0, 2.0]])]
        [[2.0, 4.0]]
        """
        args = list(args)
        specs = [a.ty for a in args]
        (true_body, false_body), captured = self._branches(
            "cond_branch", [on_true, on_false], specs
        )
        if not true_body.outputs and not false_body.outputs:
            return ()  # nothing to compute: no operation (it would have no result)
        results = self.emit(
            "cond",
            [predicate, *args, *captured],
            {"true_body": true_body, "false_body": false_body},
        )
        results = results if isinstance(results, tuple) else (results,)
        return results[0] if len(results) == 1 else results

    def while_loop(self, condition, body, carries: Sequence[Any]):
        """Run `body(builder, carries) -> new carries` while `condition(builder, carries)` (a
        bool scalar) holds; returns the final carries as a tuple. The functions may use
        enclosing values. Forward mode differentiates it; reverse mode does not (the number
        of steps is not known ahead): use `scan` over a fixed number of steps instead.

        >>> import accy
        >>> def f(b, a):
        ...     return b.while_loop(lambda b, c: c[0] < 10.0, lambda b, c: [c[0] * 2.0], a)[0]
        >>> p = accy.trace.define("f", [accy.spec(accy.f32)], f)
        >>> float(accy.reference.run(p, [1.0])[0])
        16.0
        """
        carries = list(carries)
        specs = [c.ty for c in carries]
        (condition, body), captured = self._branches("while_body", [condition, body], specs)
        if not carries:
            return ()  # no state: nothing to compute (the loop has no result)
        # The captured values are consts: reorder (carries, captured) -> (captured, carries).
        if captured:
            order = [*range(len(specs), len(specs) + len(captured)), *range(len(specs))]
            condition = permute_parameters(condition, order)
            body = permute_parameters(body, order)
        results = self.emit(
            "while_loop",
            [*captured, *carries],
            {"cond_body": condition, "body": body, "num_consts": len(captured)},
        )
        return results if isinstance(results, tuple) else (results,)

    def checkpoint(self, body, args: Sequence[Any]):
        """Apply `body(builder, args)` as a region whose intermediates reverse mode does not
        store: the backward pass recomputes them from `args` (JAX's `jax.checkpoint`).

        The region is a one-step scan with `remat=True` over the axis `checkpoint_`; its
        results come back without that axis. It may use enclosing values (closures). Returns
        what `body` returns (a Value, or a tuple).

        >>> import accy
        >>> def loss(b, a):
        ...     hidden = b.checkpoint(lambda b, x: (x[0] * x[0]).sin(), [a[0]])
        ...     return hidden.sum("lane")
        >>> p = accy.trace.define("loss", [accy.spec(accy.f32, lane=2)], loss)
        >>> [round(float(v), 4) for v in accy.reference.run(accy.grad(p), [[0.5, 1.0]])[0]]
        [0.9689, 1.0806]
        """
        args = list(args)
        single = []

        def region(b, values):
            outputs = body(b, values)
            single.append(not isinstance(outputs, tuple | list))
            return list(outputs) if not single[0] else [outputs]

        program, captured = self.capturing_subprogram("checkpoint", [a.ty for a in args], region)
        results = self.emit(
            "scan",
            args + list(captured),
            {
                "body": program,
                "axis": CHECKPOINT_AXIS,
                "length": 1,
                "num_consts": len(args) + len(captured),
                "num_carry": 0,
                "reverse": False,
                "remat": True,
            },
        )
        results = results if isinstance(results, tuple) else (results,)
        outputs = tuple(
            self.reshape(r, [(a, e) for a, e in r.ty.named_extents if a != CHECKPOINT_AXIS])
            for r in results
        )
        return outputs[0] if single[0] else outputs

    def call(self, program, args: Sequence[Any]):
        """Inline `program` applied to `args`; returns its output (a tuple if it has several).

        An argument with the parameter's axes in another layout order is transposed to it.
        """
        args = list(args)
        expected_types = program.parameter_types
        for position, (arg, expected) in enumerate(zip(args, expected_types, strict=False)):
            if not hasattr(arg, "ty") or arg.ty == expected or arg.ty.dtype != expected.dtype:
                continue
            if sorted(arg.ty.named_extents) == sorted(expected.named_extents):
                args[position] = self.transpose(arg, expected.axes)
        outputs = run(program, Inline(self, args, program))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    # -- tangent helpers (symbolic zeros) ---------------------------------------------------

    def add_tangents(self, a, b):
        if isinstance(a, Zero):
            return b
        if isinstance(b, Zero):
            return a
        return self.add(a, b)

    def scale_tangent(self, tangent, factor):
        return tangent if isinstance(tangent, Zero) else self.mul(tangent, factor)

    def neg_tangent(self, tangent):
        return tangent if isinstance(tangent, Zero) else self.neg(tangent)

    # -- helpers ----------------------------------------------------------------------------

    def _require_axes(self, kind: str, x, axes) -> None:
        for axis in axes:
            if not x.ty.has(axis):
                raise AxisError(
                    f"{kind}: axis {axis!r} is not on {x.ty}; its axes are "
                    f"{', '.join(x.ty.axes) or '(none, it is a scalar)'}"
                )


def _as_list(function: Any) -> Any:
    """A traced function whose result (a Value or a sequence of them) comes back as a list."""

    def listed(b, args):
        outputs = function(b, args)
        return list(outputs) if isinstance(outputs, tuple | list) else [outputs]

    return listed


def _define_program(api: OpsApi, name: str, specs: list, function: Any) -> Program:
    program, _ = api.capturing_subprogram(name, specs, function)
    return program


def _lowest(dtype: DType):
    if dtype.is_float:
        return float("-inf")
    if dtype == bool_:
        return False
    return int(np.iinfo(dtype.numpy).min)


def _highest(dtype: DType):
    if dtype.is_float:
        return float("inf")
    if dtype == bool_:
        return True
    return int(np.iinfo(dtype.numpy).max)


def _named_extents_of(target: Any) -> tuple[tuple[str, int], ...]:
    """The (axis, extent) pairs of a broadcast's target: a type, an array or a mapping."""
    if isinstance(target, Mapping):
        pairs = tuple(target.items())
        if all(isinstance(n, str) and isinstance(e, int | np.integer) for n, e in pairs):
            return tuple((n, int(e)) for n, e in pairs)
    else:
        named = getattr(getattr(target, "ty", target), "named_extents", None)
        if named is not None:
            return named
    raise AxisError(
        f"broadcast_to: the target must be a type, an array or a mapping of axis names to "
        f"integer extents (such as another array's .shape), got {type(target).__name__} "
        f"{target!r}"[:300]
    )
