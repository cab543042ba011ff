"""The kernel DSL: `Program(name, parameters, body)` and the builders its body is run with.

`body(k, args)` runs once, when the Program is made. `k` is the kernel's scope; its
`for_each_1d` / `for_each_2d` open a loop and call `each(inner, index, each_args)`, where `inner`
is the loop's scope. Every load, op and store names the scope it happens in, and the builders
check the rules that make a kernel safe on any device:

- an index is only used inside its own loop, which guards it: no access is out of bounds for
  a buffer holding at least the loop's extent (checked at each call by `KernelCall.check_call`);
- `dst`, the call's result, is the only parameter written, never read, and stored exactly once,
  by a store that visits every position of its loop once: each element has one writer;
- a reduction runs serially inside the thread that needs it: no races, a fixed order.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

import numpy as np

from ...types import DType, i64
from .. import lower, ops
from ..dtypes import c_type, check_representable
from ..errors import KernelError
from ..ir import (
    Apply,
    Buffer,
    Constant,
    Index,
    Index1D,
    Index2D,
    IndexValue,
    Load,
    Operand,
    ParallelLoop,
    Reduction,
    Statement,
    Store,
    TracedKernel,
)
from ..limits import Limits
from .schedule import ThreadBlocks

if TYPE_CHECKING:
    from ..artifact import KernelCallArtifact

RESULT = "dst"  # the parameter bound to the custom call's result: the only one a kernel writes

Number = int | float | bool
Each = Callable[["Scope", Index, "Args"], object]
Body = Callable[["Scope", "Args"], object]


class _Trace:
    """The state of one run of a kernel body: fresh names, open scopes, reads and writes."""

    def __init__(self, kernel: str, parameters: Mapping[str, Buffer]):
        self.kernel = kernel
        self.parameters = parameters
        self.open: list[Scope] = []
        self.reads: dict[str, int] = {}  # parameter -> the largest extent it is indexed with
        self.writes: dict[str, int] = {}
        self._names = itertools.count()

    def fresh(self, prefix: str) -> str:
        return f"{prefix}{next(self._names)}"

    def fail(self, message: str) -> NoReturn:
        raise KernelError(f"kernel {self.kernel!r}: {message}")


# ---------------------------------------------------------------------------------------------
# values


class Value:
    """A value computed in a kernel: one C variable of `dtype`.

    Every op names the scope it runs in (the `inner` of the current `each`); operands may be
    Values or Python numbers, which take the other operand's dtype. The methods below are the
    rows of `accy.kernel.ops.OPS`; `apply` reaches any of them by name.

    >>> import numpy as np
    >>> import accy
    >>> from accy.kernel.examples import map_kernel, run_on_cpu
    >>> def softplus(inner, x):
    ...     return x.exp(inner).log1p(inner)
    >>> kernel = map_kernel("softplus", accy.f64, [accy.f64], softplus, 2)
    >>> run_on_cpu(kernel, np.array([0.0, 1.0])).round(6).tolist()
    [0.693147, 1.313262]
    """

    def __init__(self, var: str, dtype: DType, scope: Scope):
        self.var = var
        self.dtype = dtype
        self.scope = scope

    def __repr__(self) -> str:
        return f"<kernel value {self.var}: {self.dtype.name}>"

    def apply(self, inner: Scope, op: str, *others: Value | Number) -> Value:
        """`op(self, *others)` for any op of `accy.kernel.ops.OPS`, by name."""
        return inner.apply(op, self, *others)

    # arithmetic

    def add(self, inner: Scope, other: Value | Number) -> Value:
        """`self + other`."""
        return inner.apply("add", self, other)

    def sub(self, inner: Scope, other: Value | Number) -> Value:
        """`self - other`."""
        return inner.apply("sub", self, other)

    def mul(self, inner: Scope, other: Value | Number) -> Value:
        """`self * other`."""
        return inner.apply("mul", self, other)

    def div(self, inner: Scope, other: Value | Number) -> Value:
        """`self / other` (integers truncate; a zero divisor gives 0)."""
        return inner.apply("div", self, other)

    def pow(self, inner: Scope, other: Value | Number) -> Value:
        """`self ** other` (floats)."""
        return inner.apply("pow", self, other)

    def max(self, inner: Scope, other: Value | Number) -> Value:
        """The larger of `self` and `other` (NaN wins, as in NumPy)."""
        return inner.apply("max", self, other)

    def min(self, inner: Scope, other: Value | Number) -> Value:
        """The smaller of `self` and `other` (NaN wins)."""
        return inner.apply("min", self, other)

    # unary math

    def neg(self, inner: Scope) -> Value:
        """`-self` (integers wrap)."""
        return inner.apply("neg", self)

    def abs(self, inner: Scope) -> Value:
        """`|self|`."""
        return inner.apply("abs", self)

    def sign(self, inner: Scope) -> Value:
        """-1, 0 or 1 by the sign of `self` (NaN and zeros unchanged)."""
        return inner.apply("sign", self)

    def exp(self, inner: Scope) -> Value:
        """e ** `self`."""
        return inner.apply("exp", self)

    def log(self, inner: Scope) -> Value:
        """The natural logarithm."""
        return inner.apply("log", self)

    def log1p(self, inner: Scope) -> Value:
        """log(1 + `self`), exact near 0."""
        return inner.apply("log1p", self)

    def expm1(self, inner: Scope) -> Value:
        """e ** `self` - 1, exact near 0."""
        return inner.apply("expm1", self)

    def sin(self, inner: Scope) -> Value:
        """The sine."""
        return inner.apply("sin", self)

    def cos(self, inner: Scope) -> Value:
        """The cosine."""
        return inner.apply("cos", self)

    def tan(self, inner: Scope) -> Value:
        """The tangent."""
        return inner.apply("tan", self)

    def tanh(self, inner: Scope) -> Value:
        """The hyperbolic tangent."""
        return inner.apply("tanh", self)

    def logistic(self, inner: Scope) -> Value:
        """1 / (1 + e ** -`self`), without overflow."""
        return inner.apply("logistic", self)

    def sqrt(self, inner: Scope) -> Value:
        """The square root."""
        return inner.apply("sqrt", self)

    def rsqrt(self, inner: Scope) -> Value:
        """1 / sqrt(`self`)."""
        return inner.apply("rsqrt", self)

    def floor(self, inner: Scope) -> Value:
        """Rounded down."""
        return inner.apply("floor", self)

    def ceil(self, inner: Scope) -> Value:
        """Rounded up."""
        return inner.apply("ceil", self)

    def round(self, inner: Scope) -> Value:
        """Rounded to the nearest integer, halves to even."""
        return inner.apply("round", self)

    def logical_not(self, inner: Scope) -> Value:
        """Not `self` (a bool value)."""
        return inner.apply("not", self)

    # comparisons: bool values

    def eq(self, inner: Scope, other: Value | Number) -> Value:
        """`self == other`, as a bool value."""
        return inner.apply("eq", self, other)

    def ne(self, inner: Scope, other: Value | Number) -> Value:
        """`self != other`, as a bool value."""
        return inner.apply("ne", self, other)

    def lt(self, inner: Scope, other: Value | Number) -> Value:
        """`self < other`, as a bool value."""
        return inner.apply("lt", self, other)

    def le(self, inner: Scope, other: Value | Number) -> Value:
        """`self <= other`, as a bool value."""
        return inner.apply("le", self, other)

    def gt(self, inner: Scope, other: Value | Number) -> Value:
        """`self > other`, as a bool value."""
        return inner.apply("gt", self, other)

    def ge(self, inner: Scope, other: Value | Number) -> Value:
        """`self >= other`, as a bool value."""
        return inner.apply("ge", self, other)

    def select(self, inner: Scope, if_true: Value | Number, if_false: Value | Number) -> Value:
        """`if_true` where this bool value holds, else `if_false`."""
        return inner.apply("select", self, if_true, if_false)

    def cast(self, inner: Scope, dtype: DType) -> Value:
        """This value converted to `dtype` as NumPy's `astype` would (floats to ints saturate)."""
        return inner.cast(self, dtype)


# ---------------------------------------------------------------------------------------------
# scopes


class Scope:
    """Where statements go: the kernel body (`k`) or the body of a loop (`inner`)."""

    def __init__(
        self,
        trace: _Trace,
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
        c_type(dtype)
        try:
            check_representable(value, dtype)
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
        c_type(dtype)
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


# ---------------------------------------------------------------------------------------------
# parameters


class Param:
    """A kernel parameter inside the body: loaded from, or (`dst` only) stored to."""

    def __init__(self, trace: _Trace, name: str, buffer: Buffer):
        self.name = name
        self.dtype = buffer.dtype
        self._trace = trace

    def __repr__(self) -> str:
        return f"<kernel param {self.name}: {self.dtype.name}>"

    def load(self, inner: Scope, index: Index) -> Value:
        """The element at `index`, as a value of the parameter's dtype.

        >>> from accy.kernel.examples import custom_double_kernel
        >>> "const float v1 = p_x[i0];" in custom_double_kernel().c_source()
        True
        """
        what = f"load of {self.name!r}"
        inner._require_active(what)
        if self.name == RESULT:
            self._trace.fail(
                f"{what}: {RESULT!r} is the call's result and write-only (each element has one "
                f"writer and no reader, so no thread can see another's unfinished write)"
            )
        inner._require_index(index, what)
        self._trace.reads[self.name] = max(self._trace.reads.get(self.name, 0), index.size)
        return inner._emit(self.dtype, lambda var: Load(var, self.dtype, self.name, index))

    def store(self, inner: Scope, value: Value | Number, index: Index) -> None:
        """Write `value` to the element at `index`: the loop's own index (or, in a 2-D loop, its
        transpose), once per kernel, so that each element has exactly one writer.

        >>> from accy.kernel.examples import custom_double_kernel
        >>> "p_dst[i0] = v2;" in custom_double_kernel().c_source()
        True
        """
        what = f"store to {self.name!r}"
        inner._require_active(what)
        self._check_store_target(what, inner)
        inner._require_index(index, what)
        self._check_store_index(what, inner, index)
        if not isinstance(value, Value):
            value = inner.constant(value, self.dtype)
        value = inner._visible(value, what)
        if value.dtype != self.dtype:
            self._trace.fail(
                f"{what}: the value is {value.dtype.name} but {self.name!r} holds "
                f"{self.dtype.name}; convert it with value.cast(inner, accy.{self.dtype.name})"
            )
        self._trace.writes[self.name] = index.size
        inner.statements.append(Store(self.name, self.dtype, index, value.var))

    def _check_store_target(self, what: str, inner: Scope) -> None:
        if self.name != RESULT:
            self._trace.fail(
                f"{what}: only {RESULT!r} (the call's result) may be written; {self.name!r} is "
                f"an operand of the call"
            )
        if self.name in self._trace.writes:
            self._trace.fail(
                f"{what}: {RESULT!r} is already stored once; each element has one writer"
            )
        if inner.kind != "for_each":
            self._trace.fail(
                f"{what} belongs in a for_each loop's body, not in {inner.kind} {inner.label!r}"
            )

    def _check_store_index(self, what: str, inner: Scope, index: Index) -> None:
        # A store at the loop's own index (or its transpose) writes each element exactly once.
        loop = inner.loop_index
        allowed = [loop] + ([loop.transposed()] if isinstance(loop, Index2D) else [])
        if index not in allowed:
            self._trace.fail(
                f"{what}: stores use the loop's own index (or, for for_each_2d, "
                f"index.transposed()), so that every element is written by exactly one thread"
            )


class Args:
    """The kernel's parameters, by name: `args.param("x")`."""

    def __init__(self, trace: _Trace, parameters: Mapping[str, Buffer]):
        self._trace = trace
        self._params = {name: Param(trace, name, b) for name, b in parameters.items()}

    def param(self, name: str) -> Param:
        """The parameter called `name`; an unknown name is a KernelError listing the others.

        >>> import accy
        >>> from accy.kernel import dynamic_buffer, logical
        >>> logical.Program(name="k", parameters={"dst": dynamic_buffer(accy.f32)},
        ...     body=lambda k, args: args.param("y"))
        Traceback (most recent call last):
        ...
        accy.kernel.errors.KernelError: kernel 'k': has no parameter 'y'; its parameters are dst
        """
        if name not in self._params:
            self._trace.fail(
                f"has no parameter {name!r}; its parameters are {', '.join(self._params)}"
            )
        return self._params[name]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._params)


def trace_kernel(name: str, parameters: Mapping[str, Buffer], body: Body) -> TracedKernel:
    """Run `body` once with builders and return what it recorded."""
    trace = _Trace(name, parameters)
    kernel = Scope(trace, "kernel", name, None)
    trace.open.append(kernel)
    body(kernel, Args(trace, parameters))
    trace.open.pop()
    if RESULT not in trace.writes:
        trace.fail(f"never stores {RESULT!r}, so the call's result would be left unwritten")
    return TracedKernel(
        name,
        tuple((n, b.dtype) for n, b in parameters.items()),
        tuple(kernel.statements),
        tuple(trace.reads.items()),
        tuple(trace.writes.items()),
    )


# ---------------------------------------------------------------------------------------------
# the program


@dataclass(frozen=True)
class Launch:
    """CUDA launch dimensions: `grid` blocks of `block` threads."""

    block: tuple[int, int, int]
    grid: tuple[int, int, int]


class Program:
    """A kernel over named buffers; `body(k, args)` says what each element of `dst` is.

    >>> import accy
    >>> from accy.kernel import dynamic_buffer, logical
    >>> def body(k, args):
    ...     def each(inner, index, each_args):
    ...         x = each_args.param("x").load(inner, index)
    ...         each_args.param("dst").store(inner, x.add(inner, x), index)
    ...     k.for_each_1d("e", 4, args, each)
    >>> double = logical.Program(
    ...     name="accy_custom_double_4_f32",
    ...     parameters={"dst": dynamic_buffer(accy.f32), "x": dynamic_buffer(accy.f32)},
    ...     body=body,
    ... ).with_schedule(logical.schedule.thread_blocks(x=4))
    >>> double.launch(accy.kernel.Limits.testing)
    Launch(block=(4, 1, 1), grid=(1, 1, 1))
    """

    def __init__(
        self,
        name: str,
        parameters: Mapping[str, Buffer],
        body: Body,
        schedule: ThreadBlocks | None = None,
    ):
        _check_name(name)
        _check_parameters(name, parameters)
        if not callable(body):
            raise KernelError(f"kernel {name!r}: body must be a function body(k, args)")
        self.name = name
        self.parameters = dict(parameters)
        self.body = body
        self.schedule = schedule
        self.traced = trace_kernel(name, self.parameters, body)

    def __repr__(self) -> str:
        params = ", ".join(f"{n}: {b.dtype.name}" for n, b in self.parameters.items())
        return f"<kernel {self.name}({params}) schedule={self.schedule}>"

    def with_schedule(self, schedule: ThreadBlocks) -> Program:
        """This kernel with `schedule` (from `accy.kernel.logical.schedule`)."""
        if not isinstance(schedule, ThreadBlocks):
            raise KernelError(
                f"kernel {self.name!r}: with_schedule takes schedule.thread_blocks(x=...), "
                f"got {schedule!r}"
            )
        scheduled = copy.copy(self)
        scheduled.schedule = schedule
        return scheduled

    def c_source(self) -> str:
        """The C definition of `void <name>(...)`, for the CPU backend."""
        return lower.c_source(self.traced)

    def cuda_source(self) -> str:
        """The CUDA C definition of the `__global__` kernel `<name>`."""
        return lower.cuda_source(self.traced)

    def launch(self, limits: Limits) -> Launch | None:
        """Check the kernel against `limits`; its launch dimensions, or None if unscheduled."""
        if not isinstance(limits, Limits):
            raise KernelError(
                f"kernel {self.name!r}: limits must be accy.kernel.Limits, got {limits!r}"
            )
        limits.check_parameters(self.name, len(self.parameters))
        for reduction in self.traced.reductions():
            limits.check_reduction_extent(self.name, reduction.label, reduction.index.extent)
        for loop in self.traced.loops():
            limits.check_extent(self.name, loop.label, loop.index.size)
        if self.schedule is None:
            return None
        threads = self.schedule.x
        limits.check_threads_per_block(self.name, threads)
        blocks = max(
            limits.check_blocks(self.name, loop.label, loop.index.size, threads)
            for loop in self.traced.loops()
        )
        return Launch((threads, 1, 1), (blocks, 1, 1))

    def create_kernel_call_artifact(
        self,
        limits: Limits,
        handle: object,
        *,
        target: str,
        version: int,
        format: str = "cpu_object",
        arch: str | None = None,
    ) -> KernelCallArtifact:
        """Build this kernel as the implementation of custom call `(target, version)`.

        See `accy.kernel.create_kernel_call_artifact`.
        """
        from ..artifact import create_kernel_call_artifact

        return create_kernel_call_artifact(
            self, limits, handle, target=target, version=version, format=format, arch=arch
        )


def _check_identifier(kernel: str, what: str, name: object) -> None:
    # Generated C prefixes every name (`accy_kernel_<name>`, `p_<param>`), so no identifier can
    # collide with a keyword, a C library function or a generated variable.
    if not isinstance(name, str) or not name.isascii() or not name.isidentifier():
        raise KernelError(f"kernel {kernel!r}: {what} must be an ASCII identifier, got {name!r}")


def _check_name(name: object) -> None:
    _check_identifier(str(name), "the kernel name", name)


def _check_parameters(kernel: str, parameters: object) -> None:
    if not isinstance(parameters, Mapping) or not parameters:
        raise KernelError(f"kernel {kernel!r}: parameters must be a dict name -> dynamic_buffer")
    for name, buffer in parameters.items():
        _check_identifier(kernel, "a parameter name", name)
        if not isinstance(buffer, Buffer):
            raise KernelError(
                f"kernel {kernel!r}: parameter {name!r} must be a buffer such as "
                f"accy.kernel.dynamic_buffer(accy.f32), got {buffer!r}"
            )
        c_type(buffer.dtype)
    if RESULT not in parameters:
        raise KernelError(
            f"kernel {kernel!r} needs a parameter named {RESULT!r}: the call's result, which "
            f"the kernel writes"
        )
