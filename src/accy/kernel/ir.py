"""The records a traced kernel is made of: buffers, indices and statements.

A kernel body is run once, at `Program(...)`, with builder objects (`accy.kernel.logical`) that
append these records. Every value is a single assignment (`v3 = v1 + v2`) named by its C
variable, so that lowering (`accy.kernel.lower`) only has to print records in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..core.types import DType


class IndexScope(Protocol):
    """A scope that gives a loop position as a value (`accy.kernel.logical.scope.Scope`, which
    builds on these records)."""

    def index_value(self, index: Index1D) -> Any: ...


RESULT = "dst"  # the parameter bound to the custom call's result: the only one a kernel writes


@dataclass(frozen=True)
class Buffer:
    """A kernel parameter: a flat buffer of `dtype` elements whose length is bound per call."""

    dtype: DType

    def __repr__(self) -> str:
        return f"dynamic_buffer({self.dtype!r})"


def dynamic_buffer(dtype: DType) -> Buffer:
    """A buffer parameter of `dtype` whose length comes from the tensor it is bound to.

    >>> import accy
    >>> accy.kernel.dynamic_buffer(accy.f32)
    dynamic_buffer(accy.f32)
    """
    return Buffer(dtype)


@dataclass(frozen=True)
class Index1D:
    """The position in one loop: `var` runs over `0 .. extent-1` (its loop guards it).

    Passed to `each(inner, index, each_args)` by `for_each_1d` and `reduce_1d`.
    """

    label: str
    extent: int
    var: str  # the C variable holding the position

    @property
    def size(self) -> int:
        """Elements an access with this index may touch."""
        return self.extent

    @property
    def components(self) -> tuple[Index1D, ...]:
        return (self,)

    def value(self, inner: IndexScope) -> Any:
        """The position as an i64 value, for arithmetic.

        >>> import accy
        >>> from accy.kernel import dynamic_buffer, logical
        >>> def body(k, args):
        ...     k.for_each_1d("e", 3, args, lambda inner, i, a: a.param("dst").store(
        ...         inner, i.value(inner), i))
        >>> logical.Program(name="iota", parameters={"dst": dynamic_buffer(accy.i64)},
        ...     body=body).name
        'iota'
        """
        return inner.index_value(self)


@dataclass(frozen=True)
class Index2D:
    """A row-major position in a `row.extent` x `col.extent` grid: offset `row * cols + col`.

    `for_each_2d` passes one; `Index2D(row, col)` combines two 1-D positions (a loop's and a
    reduction's, say) into one.
    """

    row: Index1D
    col: Index1D

    @property
    def size(self) -> int:
        return self.row.extent * self.col.extent

    @property
    def components(self) -> tuple[Index1D, ...]:
        return (self.row, self.col)

    def transposed(self) -> Index2D:
        """The same position in the transposed (column-major) layout: offset `col * rows + row`.

        >>> from accy.kernel import Index1D, Index2D
        >>> Index2D(Index1D("r", 2, "i0"), Index1D("c", 3, "i1")).transposed().row.label
        'c'
        """
        return Index2D(self.col, self.row)


Index = Index1D | Index2D


# ---------------------------------------------------------------------------------------------
# statements


@dataclass(frozen=True)
class Operand:
    var: str
    dtype: DType


@dataclass(frozen=True)
class Constant:
    var: str
    dtype: DType
    value: Any


@dataclass(frozen=True)
class Load:
    var: str
    dtype: DType
    param: str
    index: Index


@dataclass(frozen=True)
class IndexValue:
    var: str
    dtype: DType
    index: Index1D


@dataclass(frozen=True)
class Apply:
    """`var = op(operands...)`: an elementwise op or a cast (op "cast") from `accy.kernel.ops`."""

    var: str
    dtype: DType
    op: str
    operands: tuple[Operand, ...]


@dataclass(frozen=True)
class Store:
    param: str
    dtype: DType
    index: Index
    value: str


@dataclass(frozen=True)
class ParallelLoop:
    """One thread per position of `index` on CUDA; nested `for` loops in C."""

    label: str
    index: Index
    body: tuple[Statement, ...]


@dataclass(frozen=True)
class Reduction:
    """`var = combine over index of term`, computed serially by the thread that needs it."""

    var: str
    dtype: DType
    combine: str
    label: str
    index: Index1D
    body: tuple[Statement, ...]
    term: str


Statement = Constant | Load | IndexValue | Apply | Store | ParallelLoop | Reduction


@dataclass(frozen=True)
class Launch:
    """CUDA launch dimensions: `grid` blocks of `block` threads."""

    block: tuple[int, int, int]
    grid: tuple[int, int, int]


@dataclass(frozen=True)
class TracedKernel:
    """A kernel body after tracing, with what it reads and writes, ready to lower."""

    name: str
    parameters: tuple[tuple[str, DType], ...]
    body: tuple[Statement, ...]
    reads: tuple[tuple[str, int], ...]  # parameter -> elements the kernel may read
    writes: tuple[tuple[str, int], ...]  # parameter -> elements the kernel writes

    @property
    def written(self) -> frozenset[str]:
        return frozenset(name for name, _ in self.writes)

    def loops(self) -> list[ParallelLoop]:
        return [s for s in self.body if isinstance(s, ParallelLoop)]

    def reductions(self) -> list[Reduction]:
        return list(_reductions_in(self.body))


def _reductions_in(statements: tuple[Statement, ...]):
    for statement in statements:
        if isinstance(statement, ParallelLoop | Reduction):
            if isinstance(statement, Reduction):
                yield statement
            yield from _reductions_in(statement.body)
