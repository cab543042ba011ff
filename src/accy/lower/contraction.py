"""How a `dot_general` maps onto a BLAS GEMM: `C[b] = A[b] @ B[b]` for each batch index `b`.

The result is laid out batch axes, then the left operand's free axes (M), then the right
operand's free axes (N), so each batch is a row-major M x N matrix. An operand whose view shows
its axes as one matrix with a unit stride on one side is passed as it is (a transposed one with
BLAS's transpose flag, not copied); any other is first packed into scratch memory laid out batch,
rows, columns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core import Operation
from ..core.kinds.contraction import dimensions, free_dimensions
from .views import StridedView, row_major


@dataclass(frozen=True)
class MatrixOperand:
    """One GEMM operand: where it is read (`view`, or packed scratch when `packed`), BLAS's
    transpose flag, the leading dimension, and the stride (elements) of each batch axis."""

    view: StridedView
    packed: bool
    order: tuple[int, ...]
    transposed: bool
    leading: int
    batch_strides: tuple[int, ...]


@dataclass(frozen=True)
class Gemm:
    """C[b] = A[b] @ B[b] for each index b over `batch_extents`, each C[b] row-major m x n."""

    batch_extents: tuple[int, ...]
    m: int
    n: int
    k: int
    lhs: MatrixOperand
    rhs: MatrixOperand


def _collapse(extents, strides, positions) -> tuple[int, int] | None:
    """(extent, stride) of a group of axes read as one axis, or None if they do not merge."""
    size = math.prod(extents[p] for p in positions)
    kept = [(extents[p], strides[p]) for p in positions if extents[p] != 1]
    if size == 0 or not kept:
        return size, 1
    for (_, outer), (inner_extent, inner) in zip(kept, kept[1:], strict=False):
        if outer != inner * inner_extent:
            return None
    return size, kept[-1][1]


def _as_matrix(rows, row_stride, cols, col_stride) -> tuple[bool, int] | None:
    """(transposed, leading dimension) of a rows x cols strided matrix, or None."""
    if cols <= 1 or col_stride == 1:
        leading = row_stride if rows > 1 else max(cols, 1)
        if leading >= max(cols, 1):
            return False, leading
    if rows <= 1 or row_stride == 1:
        leading = col_stride if cols > 1 else max(rows, 1)
        if leading >= max(rows, 1):
            return True, leading
    return None


def _matrix(view, extents, rows, cols, batch, packed) -> MatrixOperand | None:
    row = _collapse(extents, view.strides, rows)
    col = _collapse(extents, view.strides, cols)
    if row is None or col is None:
        return None
    matrix = _as_matrix(row[0], row[1], col[0], col[1])
    if matrix is None:
        return None
    batch_strides = tuple(view.strides[p] for p in batch)
    return MatrixOperand(view, packed, tuple(batch + rows + cols), *matrix, batch_strides)


def _packed_view(extents, order) -> StridedView:
    """The view of an operand copied into scratch in the axis order `order`."""
    packed = row_major(tuple(extents[p] for p in order))
    strides = [0] * len(extents)
    for stride, position in zip(packed, order, strict=True):
        strides[position] = stride
    return StridedView(-1, 0, tuple(strides))


def _operand(view, extents, rows, cols, batch, pack: bool = False) -> MatrixOperand:
    matrix = None if pack else _matrix(view, extents, rows, cols, batch, packed=False)
    if matrix is None:
        packed = _packed_view(extents, tuple(batch) + tuple(rows) + tuple(cols))
        matrix = _matrix(packed, extents, rows, cols, batch, packed=True)
    return matrix


def gemm_layout(op: Operation, lhs: StridedView, rhs: StridedView, pack: bool = False) -> Gemm:
    """The GEMM that computes `op` from its operands' views (packing those that need it, or
    both with `pack`: the CPU converts 16-bit float operands to float32 as it packs them).

    `MatrixOperand.order` is the operand's axes in the packed layout: batch, rows, columns.

    >>> import accy
    >>> from accy.lower.views import view_of_stored
    >>> p = accy.trace.define("mm", [accy.spec(accy.f32, k=3, m=2), accy.spec(accy.f32, k=3, n=4)],
    ...                       lambda b, a: a[0].contract(a[1], "k"))
    >>> op = p.operations[-1]
    >>> gemm = gemm_layout(op, *(view_of_stored(v, p.type_of(v)) for v in op.operands))
    >>> gemm.m, gemm.n, gemm.k, gemm.lhs.transposed, gemm.lhs.packed
    (2, 4, 3, True, False)
    """
    lc, rc, lb, rb = dimensions(op.attrs)
    lhs_type, rhs_type = op.operand_types
    lf = free_dimensions(lhs_type.rank, lc, lb)
    rf = free_dimensions(rhs_type.rank, rc, rb)
    return Gemm(
        tuple(lhs_type.extents[p] for p in lb),
        math.prod(lhs_type.extents[p] for p in lf),
        math.prod(rhs_type.extents[p] for p in rf),
        math.prod(lhs_type.extents[p] for p in lc),
        _operand(lhs, lhs_type.extents, lf, list(lc), list(lb), pack),
        _operand(rhs, rhs_type.extents, list(rc), rf, list(rb), pack),
    )


@dataclass(frozen=True)
class StridedMatrix:
    """An operand read in place as a batch of matrices with any strides (in elements): entry
    (r, c) of batch element b is at offset + b . batch_strides + r * row + c * column."""

    offset: int
    row: int
    column: int
    batch_strides: tuple[int, ...]


def strided_matrices(
    op: Operation, lhs: StridedView, rhs: StridedView
) -> tuple[StridedMatrix | None, StridedMatrix | None]:
    """Each operand as the matrix of `gemm_layout` (A: m x k, B: k x n) read in place with any
    strides, or None where its rows or its columns do not merge into one strided axis: loops
    read any such matrix, where BLAS needs a unit stride on one side.

    >>> import accy
    >>> from accy.lower.views import view_of_stored
    >>> p = accy.trace.define("mm", [accy.spec(accy.f32, k=3, m=2), accy.spec(accy.f32, k=3, n=4)],
    ...                       lambda b, a: a[0].contract(a[1], "k"))
    >>> op = p.operations[-1]
    >>> a, b = strided_matrices(op, *(view_of_stored(v, p.type_of(v)) for v in op.operands))
    >>> (a.row, a.column), (b.row, b.column)
    ((1, 2), (4, 1))
    """
    lc, rc, lb, rb = dimensions(op.attrs)
    lhs_type, rhs_type = op.operand_types
    lf = free_dimensions(lhs_type.rank, lc, lb)
    rf = free_dimensions(rhs_type.rank, rc, rb)

    def matrix(view, extents, rows, cols, batch) -> StridedMatrix | None:
        row, col = _collapse(extents, view.strides, rows), _collapse(extents, view.strides, cols)
        if row is None or col is None:
            return None
        return StridedMatrix(view.offset, row[1], col[1], tuple(view.strides[p] for p in batch))

    return (
        matrix(lhs, lhs_type.extents, lf, list(lc), list(lb)),
        matrix(rhs, rhs_type.extents, list(rc), rf, list(rb)),
    )


def loop_indices(op, result_index) -> tuple[tuple[str, ...], tuple[str, ...], list]:
    """For dot_general as loops: each operand's index in terms of the result's counters
    `result_index` and contraction counters `k0, k1, ...`, and the contraction loops.

    Shared by the CPU and CUDA generators (a CUDA thread runs one result element's loop).

    >>> import accy
    >>> p = accy.trace.define("mv", [accy.spec(accy.f32, m=2, k=3), accy.spec(accy.f32, k=3)],
    ...                       lambda b, a: a[0].contract(a[1], "k"))
    >>> dot = next(op for op in p.operations if op.kind == "dot_general")
    >>> loop_indices(dot, ("r0",))
    (('r0', 'k0'), ('k0',), [('k0', 3)])
    """
    lc, rc, lb, rb = dimensions(op.attrs)
    lhs_type, rhs_type = op.operand_types
    lf = free_dimensions(lhs_type.rank, lc, lb)
    rf = free_dimensions(rhs_type.rank, rc, rb)
    contract = [f"k{q}" if lhs_type.extents[p] != 1 else "0" for q, p in enumerate(lc)]
    lhs_index = [""] * lhs_type.rank
    rhs_index = [""] * rhs_type.rank
    for q, (left, right) in enumerate(zip(lb, rb, strict=True)):
        lhs_index[left] = rhs_index[right] = result_index[q]
    for q, p in enumerate(lf):
        lhs_index[p] = result_index[len(lb) + q]
    for q, p in enumerate(rf):
        rhs_index[p] = result_index[len(lb) + len(lf) + q]
    for q, (left, right) in enumerate(zip(lc, rc, strict=True)):
        lhs_index[left] = rhs_index[right] = contract[q]
    loops = [(f"k{q}", lhs_type.extents[p]) for q, p in enumerate(lc) if lhs_type.extents[p] != 1]
    return tuple(lhs_index), tuple(rhs_index), loops
