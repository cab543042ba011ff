"""Scopes: where a kernel body's statements go, and the rules that keep a kernel safe.

`k` (the kernel's scope) opens parallel loops; each loop's `inner` scope loads, computes,
reduces and stores. A scope accepts statements only while it is the innermost open one, and a
value or index only from itself or a scope that encloses it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, NoReturn, Protocol

import numpy as np

from ...core.types import DType, i64
from .. import ops
from ..errors import KernelError
from ..ir import (
    Apply,
    Constant,
    Index,
    Index1D,
    Index2D,
    IndexValue,
    Operand,
    ParallelLoop,
    Reduction,
    Statement,
    Store,
)
from .values import Number, Value


class Args(Protocol):
    """The kernel's parameters as a body sees them (`accy.kernel.logical.params.Args`, which
    builds on this module); a scope passes them on to each iteration."""

    def param(self, name: str) -> Any: ...


Each = Callable[["Scope", Index, Args], object]


class Trace:
    """The state of one run of a kernel body: fresh names, open scopes, reads and writes."""

    def __init__(self, kernel: str):
        self.kernel = kernel
        self.open: list[Scope] = []
        self.reads: dict[str, int] = {}  # parameter -> the largest extent it is indexed with
        self.writes: dict[str, int] = {}
        self._names = itertools.count()

    def fresh(self, prefix: str) -> str:
        return f"{prefix}{next(self._names)}"

    def fail(self, message: str) -> NoReturn:
        raise KernelError(f"kernel {self.kernel!r}: {message}")


class Scope:
    """Where statements go: the kernel body (`k`) or the body of a loop (`inner`)."""

    def __init__(
        self,
        trace: Trace,
        kind: str,
        label: str,
        parent: Scope | None,
        loop_index: Index | None = None,
    ):
        self.kind = kind  # "kernel", "for_each" or "reduce"
        self.label = label
        self.parent = parent
        self.loop_index = loop_index
        self.statements: list[Statement] = []
        self._trace = trace

    def __repr__(self) -> str:
        return f"<kernel scope {self.kind} {self.label!r}>"

    # loops

    def for_each_1d(self, label: str, extent: int, args: Args, each: Each) -> ParallelLoop:
        """Run `each(inner, index, args)` for every position `0 .. extent-1`, in parallel.

        >>> import numpy as np
        >>> import accy
        >>> from accy.kernel import dynamic_buffer, logical
        >>> from accy.kernel.examples import run_on_cpu
        >>> def body(k, args):
        ...     def each(inner, index, each_args):
        ...         x = each_args.param("x").load(inner, index)
        ...         each_args.param("dst").store(inner, x.neg(inner), index)
        ...     k.for_each_1d("e", 3, args, each)
        >>> negate = logical.Program(name="negate", body=body,
        ...     parameters={"dst": dynamic_buffer(accy.f32), "x": dynamic_buffer(accy.f32)})
        >>> run_on_cpu(negate, np.array([1, -2, 3], np.float32)).tolist()
        [-1.0, 2.0, -3.0]
        """
        self._require_kernel_level("for_each_1d")
        index = Index1D(label, self._extent(label, extent), self._trace.fresh("i"))
        return self._parallel(label, index, args, each)

    def for_each_2d(
        self, label: str, extents: tuple[int, int], args: Args, each: Each
    ) -> ParallelLoop:
        """Run `each(inner, index, args)` for every (row, col) of a `rows x cols` grid.

        `index` is an `Index2D`: row-major, with `.row`, `.col` and `.transposed()`.

        >>> import numpy as np
        >>> import accy
        >>> from accy.kernel import dynamic_buffer, logical
        >>> from accy.kernel.examples import run_on_cpu
        >>> def body(k, args):
        ...     def each(inner, index, each_args):
        ...         x = each_args.param("x").load(inner, index)
        ...         each_args.param("dst").store(inner, x, index.transposed())
        ...     k.for_each_2d("g", (2, 3), args, each)
        >>> transpose = logical.Program(name="transpose", body=body,
        ...     parameters={"dst": dynamic_buffer(accy.i32), "x": dynamic_buffer(accy.i32)})
        >>> run_on_cpu(transpose, np.arange(6, dtype=np.int32)).tolist()
        [0, 3, 1, 4, 2, 5]
        """
        self._require_kernel_level("for_each_2d")
        if not isinstance(extents, tuple | list) or len(extents) != 2:
            self._trace.fail(f"for_each_2d {label!r} needs extents (rows, cols), got {extents!r}")
        rows, cols = (self._extent(label, e) for e in extents)
        row = Index1D(f"{label}_row", rows, self._trace.fresh("i"))
        col = Index1D(f"{label}_col", cols, self._trace.fresh("i"))
        return self._parallel(label, Index2D(row, col), args, each)

    def reduce_1d(
        self, label: str, extent: int, args: Args, each: Each, combine: str = "add"
    ) -> Value:
        """Combine `each(inner, index, args)` over `0 .. extent-1` (add, mul, max or min).

        The thread that needs the result computes it alone, in order: no races, and the same
        answer on every run. Floats accumulate at their compute precision (f16 and bf16 in
        float, rounded once at the end).

        >>> import numpy as np
        >>> import accy
        >>> from accy.kernel import Index2D, dynamic_buffer, logical
        >>> from accy.kernel.examples import run_on_cpu
        >>> def body(k, args):
        ...     def each_row(inner, row, each_args):
        ...         def term(inner2, col, args2):
        ...             return args2.param("x").load(inner2, Index2D(row, col))
        ...         total = inner.reduce_1d("col", 3, each_args, term, combine="add")
        ...         each_args.param("dst").store(inner, total, row)
        ...     k.for_each_1d("row", 2, args, each_row)
        >>> row_sums = logical.Program(name="row_sums", body=body,
        ...     parameters={"dst": dynamic_buffer(accy.f32), "x": dynamic_buffer(accy.f32)})
        >>> run_on_cpu(row_sums, np.arange(6, dtype=np.float32)).tolist()
        [3.0, 12.0]
        """
        self._require_active("reduce_1d")
        if self.kind == "kernel":
            self._trace.fail(f"reduce_1d {label!r} belongs inside a for_each loop's `each`")
        index = Index1D(label, self._extent(label, extent), self._trace.fresh("i"))
        terms: list[Value] = []

        def run(inner: Scope) -> None:
            term = each(inner, index, args)
            terms.append(inner._visible(term, f"the result of reduce_1d {label!r}"))

        body = self._nested("reduce", label, index, run)
        dtype = terms[0].dtype
        ops.check_combine(self._trace.kernel, combine, dtype)
        var = self._trace.fresh("v")
        self.statements.append(Reduction(var, dtype, combine, label, index, body, terms[0].var))
        return Value(var, dtype, self)

    # values

    def constant(self, value: Number, dtype: DType) -> Value:
        """`value` as a kernel value of `dtype` (it must fit: no silent rounding to an int).

        >>> import numpy as np
        >>> import accy
        >>> from accy.kernel.examples import map_kernel, run_on_cpu
        >>> def plus_ten(inner, x):
        ...     return x.add(inner, inner.constant(10, accy.i64))
        >>> run_on_cpu(map_kernel("plus_ten", accy.i64, [accy.i64], plus_ten, 2),
        ...     np.array([1, 2])).tolist()
        [11, 12]
        """
        self._require_active("constant")
        ops.check_dtype(dtype)
        try:
            ops.check_representable(value, dtype)
        except KernelError as error:
            self._trace.fail(str(error))
        return self._emit(dtype, lambda var: Constant(var, dtype, value))

    def index_value(self, index: Index1D) -> Value:
        """A loop position as an i64 value (also `index.value(inner)`).

        >>> import numpy as np
        >>> import accy
        >>> from accy.kernel.examples import map_kernel, run_on_cpu
        >>> def plus_position(inner, x):
        ...     return x.add(inner, inner.index_value(inner.loop_index))
        >>> run_on_cpu(map_kernel("plus_i", accy.i64, [accy.i64], plus_position, 3),
        ...     np.array([5, 5, 5])).tolist()
        [5, 6, 7]
        """
        self._require_active("index_value")
        self._require_index(index, "index_value")
        if not isinstance(index, Index1D):
            self._trace.fail("index_value takes a 1-D index (use index.row or index.col)")
        return self._emit(i64, lambda var: IndexValue(var, i64, index))

    def select(self, condition: Value, if_true: Value | Number, if_false: Value | Number) -> Value:
        """`if_true` where `condition` holds, else `if_false`.

        >>> import numpy as np
        >>> import accy
        >>> from accy.kernel.examples import map_kernel, run_on_cpu
        >>> def relu(inner, x):
        ...     return inner.select(x.gt(inner, 0.0), x, 0.0)
        >>> run_on_cpu(map_kernel("relu", accy.f32, [accy.f32], relu, 2),
        ...     np.array([-1, 2], np.float32)).tolist()
        [0.0, 2.0]
        """
        return self.apply("select", condition, if_true, if_false)

    def apply(self, op: str, *operands: Value | Number) -> Value:
        """`op(*operands)` for any op of `accy.kernel.ops.OPS`, by name.

        >>> import numpy as np
        >>> import accy
        >>> from accy.kernel.examples import map_kernel, run_on_cpu
        >>> def hypot(inner, x, y):
        ...     return inner.apply("add", x.mul(inner, x), y.mul(inner, y)).apply(inner, "sqrt")
        >>> run_on_cpu(map_kernel("hypot", accy.f32, [accy.f32] * 2, hypot, 1),
        ...     np.array([3], np.float32), np.array([4], np.float32)).tolist()
        [5.0]
        """
        self._require_active(op)
        values = self._values(op, operands)
        dtypes = tuple(v.dtype for v in values)
        result = ops.result_dtype(self._trace.kernel, op, dtypes)
        args = tuple(Operand(v.var, v.dtype) for v in values)
        return self._emit(result, lambda var: Apply(var, result, op, args))

    def cast(self, value: Value, dtype: DType) -> Value:
        """`value` converted to `dtype`, as NumPy's `astype` (floats to ints saturate).

        >>> import numpy as np
        >>> import accy
        >>> from accy.kernel.examples import map_kernel, run_on_cpu
        >>> def truncate(inner, x):
        ...     return inner.cast(x, accy.i32)
        >>> run_on_cpu(map_kernel("truncate", accy.i32, [accy.f32], truncate, 3),
        ...     np.array([-1.5, 2.7, 1e10], np.float32)).tolist()
        [-1, 2, 2147483647]
        """
        self._require_active("cast")
        source = self._visible(value, "cast")
        ops.check_dtype(dtype)
        args = (Operand(source.var, source.dtype),)
        return self._emit(dtype, lambda var: Apply(var, dtype, "cast", args))

    # the rules

    def _emit(self, dtype: DType, make: Callable[[str], Statement]) -> Value:
        var = self._trace.fresh("v")
        self.statements.append(make(var))
        return Value(var, dtype, self)

    def _parallel(self, label: str, index: Index, args: Args, each: Each) -> ParallelLoop:
        body = self._nested("for_each", label, index, lambda inner: each(inner, index, args))
        if not any(isinstance(s, Store) for s in body):
            self._trace.fail(f"loop {label!r} stores nothing; a loop's only effect is its store")
        loop = ParallelLoop(label, index, body)
        self.statements.append(loop)
        return loop

    def _nested(
        self, kind: str, label: str, index: Index, run: Callable[[Scope], None]
    ) -> tuple[Statement, ...]:
        if not isinstance(label, str) or not label.isidentifier():
            self._trace.fail(f"a loop label must be an identifier, got {label!r}")
        inner = Scope(self._trace, kind, label, self, index)
        self._trace.open.append(inner)
        try:
            run(inner)
        finally:
            self._trace.open.pop()
        return tuple(inner.statements)

    def _extent(self, label: str, extent: int) -> int:
        if not isinstance(extent, int | np.integer) or isinstance(extent, bool) or extent < 1:
            self._trace.fail(f"loop {label!r} needs a positive int extent, got {extent!r}")
        return int(extent)

    def _chain(self) -> list[Scope]:
        scopes, scope = [], self
        while scope is not None:
            scopes.append(scope)
            scope = scope.parent
        return scopes

    def _require_kernel_level(self, what: str) -> None:
        self._require_active(what)
        if self.kind != "kernel":
            self._trace.fail(
                f"{what} opens a parallel loop, so it is called on the kernel scope `k`, not "
                f"inside loop {self.label!r}; use for_each_2d or reduce_1d for nested work"
            )

    def _require_active(self, what: str) -> None:
        current = self._trace.open[-1] if self._trace.open else None
        if current is self:
            return
        if self not in self._trace.open:
            self._trace.fail(f"{what}: the scope of {self.kind} {self.label!r} has ended")
        self._trace.fail(
            f"{what} was given the scope of {self.kind} {self.label!r}, but the innermost open "
            f"scope is {current.kind} {current.label!r}; pass the `inner` its `each` received"
        )

    def _require_index(self, index: Index, what: str) -> None:
        if not isinstance(index, Index1D | Index2D):
            self._trace.fail(f"{what} needs an Index1D or Index2D, got {index!r}")
        open_positions = {
            component
            for scope in self._chain()
            if scope.loop_index is not None
            for component in scope.loop_index.components
        }
        for component in index.components:
            if component not in open_positions:
                self._trace.fail(
                    f"{what}: index {component.label!r} is used outside its loop, which is "
                    f"the only place it is guarded against its extent"
                )

    def _visible(self, value: object, what: str) -> Value:
        if not isinstance(value, Value):
            self._trace.fail(f"{what} must be a kernel value, got {value!r}")
        if value.scope not in self._chain():
            self._trace.fail(
                f"{what}: value {value.var} comes from {value.scope.kind} "
                f"{value.scope.label!r}, which has ended or does not enclose this scope"
            )
        return value

    def _values(self, op: str, operands: tuple[Value | Number, ...]) -> list[Value]:
        # Numbers take the dtype of the Values they meet (select's predicate excluded).
        peers = [o for o in operands[1 if op == "select" else 0 :] if isinstance(o, Value)]
        if not peers:
            self._trace.fail(f"{op} needs at least one kernel value among its operands")
        return [
            self._visible(o, op) if isinstance(o, Value) else self.constant(o, peers[0].dtype)
            for o in operands
        ]
