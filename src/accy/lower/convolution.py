"""Which convs the CPU runs whole, in which layout, and the geometry its kernel walks.

The CPU's convolution is implicit GEMM over tiles of rows: for each tile it gathers the
tile's windows into a patch matrix that stays in cache (the input's channels are innermost, so
each window offset copies one run of channels), and multiplies it with the kernel in one BLAS
GEMM. Nothing as large as the whole im2col matrix is ever written; the result is stored once.
Two forms, by shape (the conv kind's derivatives close over it, so both are convolutions):

- `rows` (forward convolutions and input gradients): a row of the patch matrix per result
  position; x laid out (batch, spatial, contract), the kernel (spatial, contract, outputs),
  the result (batch, spatial, outputs) = patches [rows, window * channels] @ kernel.
- `columns` (kernel gradients, whose kernel operand is the cotangent and whose window is the
  whole output): a row of patches per position of the kernel operand (contract, spatial), its
  columns the result's spatial positions times x's batch axes; x laid out (contract, spatial,
  batch), the kernel operand (contract, spatial, outputs), the result (outputs, spatial, batch)
  = the sum over tiles of kernel-tileᵀ @ patches. Each of a fixed number of parts (by shape,
  never by thread count) sums its tiles into a partial result; the partials are added in order.

16-bit floats (bf16, f16) are converted to f32 as they are gathered and summed in f32, the
result rounded once, as the kind's reference does.

Declined (composed, `core/windows.py`): every conv with `accy.config.cpu_conv` off
(`ACCY_CPU_CONV=0`); integer dtypes, no contracted axis, an empty operand, sizes past 32-bit
BLAS integers. Paired axes (groups, a vmapped kernel) are laid out outermost on both operands
and the result: the conv of each of their elements runs in turn on its own slices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import config
from ..core import Operation
from ..core.kinds.convolution import axis_roles
from ..core.types import TensorType, bf16, f16, f32, f64

DTYPES = (f32, f64, bf16, f16)
HALF = ("bf16", "f16")
TILE_BYTES = 512 << 10  # a patch tile: a quarter of a core's L2 (2 MiB on the 2-core EPYC)
MAX_TILE_ROWS = 512
MIN_TILE_ROWS = 16
MIN_COLUMN_ROWS = 128
PARALLEL_WORK = 1 << 22  # rows * depth * outputs from which tiles are shared among threads
VECTOR = 16  # f32 lanes of an AVX-512 register
PARTS = 8  # at most this many parts share a conv's tiles (the step emitters' CHUNKS)
PARTIALS_BYTES = 32 << 20  # a kernel gradient's partial results, all parts together


@dataclass(frozen=True)
class ConvGeometry:
    """One conv as the CPU's tiled kernel sees it (operands in `cpu_orders`' layout).

    Per spatial axis i, patch element (row position r, column position q) reads the input at
    dilated-padded coordinate `r * row_step[i] + q * column_step[i] - low[i]`: an element
    where that coordinate is a multiple of `lhs_dilation[i]` and inside the input, else zero.
    `rows`: forward; row positions are the result's, columns the window offsets.
    `columns`: kernel gradient; row positions are the kernel operand's, columns the result's.
    """

    form: str  # "rows" or "columns"
    dtype: str
    lead: int  # rows form: batch elements; columns form: contracted elements
    inner: int  # the run of x copied per window offset: contract (rows) or batch (columns)
    outputs: int  # the kernel operand's output elements
    extents: tuple[int, ...]  # x's spatial extents
    row_extents: tuple[int, ...]
    column_extents: tuple[int, ...]
    row_step: tuple[int, ...]
    column_step: tuple[int, ...]
    low: tuple[int, ...]
    lhs_dilation: tuple[int, ...]
    groups: int = 1  # the paired axes' elements: a conv of its own each, outermost in memory

    @property
    def rows(self) -> int:
        """Rows of the whole patch matrix (the GEMMs' summed m, or k in the columns form)."""
        return self.lead * math.prod(self.row_extents)

    @property
    def depth(self) -> int:
        """Columns of the patch matrix: column positions times the copied run."""
        return math.prod(self.column_extents) * self.inner

    @property
    def vectorized(self) -> bool:
        """Whether the tiles multiply in the CPU's own AVX-512 micro-kernels where the
        compiler targets AVX-512 (f32, and 16-bit floats computed in f32), rather than in
        BLAS."""
        return self.dtype != "f64"

    @property
    def half(self) -> bool:
        """A 16-bit float conv: its operands are converted to f32 as they are gathered (the
        patches, the kernel, a kernel gradient's cotangent tile), the products summed in f32
        and rounded once into the result, as the kind's."""
        return self.dtype in HALF

    @property
    def stride(self) -> int:
        """Elements from one patch row to the next: in the vectorized columns form, the depth
        rounded up to whole vectors (the micro-kernel's loads run along it)."""
        if self.vectorized and self.form == "columns":
            return -(-self.depth // VECTOR) * VECTOR
        return self.depth

    @property
    def tile(self) -> int:
        """Rows per tile: a patch tile of about `TILE_BYTES`."""
        rows = TILE_BYTES // max(self.stride * self.item, 1)
        # The columns form adds each tile's product into the partial result: as many rows
        # as there are, up to MIN_COLUMN_ROWS, so that the adds stay a small part of the work.
        least = MIN_COLUMN_ROWS if self.form == "columns" else MIN_TILE_ROWS
        return min(max(least, min(MAX_TILE_ROWS, rows)), self.rows)

    @property
    def tiles(self) -> int:
        return -(-self.rows // self.tile)

    @property
    def parts(self) -> int:
        """How many parts share the tiles: a number fixed by the shape, so that the results
        never depend on the threads there are."""
        if self.rows * self.depth * self.outputs < PARALLEL_WORK:
            return 1
        if self.form == "columns":  # a partial result each: at most PARTIALS_BYTES of them
            fit = PARTIALS_BYTES // (self.outputs * self.depth * self.item)
            return max(1, min(PARTS, self.tiles, fit))
        return min(PARTS, self.tiles)

    @property
    def item(self) -> int:
        """Bytes of the compute type (f32 for 16-bit floats): the workspace's elements."""
        return 8 if self.dtype == "f64" else 4

    @property
    def padded_outputs(self) -> int:
        """The outputs rounded up to whole vectors: the columns of the vectorized rows form's
        copy of the kernel (zeros past the outputs, so that every load is a whole vector)."""
        return -(-self.outputs // VECTOR) * VECTOR

    @property
    def packs_weights(self) -> bool:
        """Whether the rows form copies the kernel (padded to whole vectors, and in f32)."""
        return self.form == "rows" and self.vectorized

    @property
    def sums_partials(self) -> bool:
        """Whether the columns form sums into partial results (in the compute type) and then
        adds them into the result: with several parts, or a 16-bit result to round."""
        return self.form == "columns" and (self.parts > 1 or self.half)

    def scratch(self) -> tuple[tuple[str, int], ...]:
        """Workspace names and sizes in bytes: a patch tile per part; in the columns form
        partial results (`sums_partials`) and, for 16-bit floats, a tile of the cotangent in
        f32 per part; in the rows form the padded kernel (`packs_weights`) and, for 16-bit
        floats, a tile of f32 results per part."""
        scratch = [("patches", self.parts * self.tile * self.stride * self.item)]
        if self.sums_partials:
            scratch.append(("partial", self.parts * self.outputs * self.depth * self.item))
        if self.packs_weights:
            scratch.append(("weights", self.depth * self.padded_outputs * self.item))
        if self.half:
            scratch.append(("staged", self.parts * self.tile * self.outputs * self.item))
        return tuple(scratch)


def _form(x: TensorType, kernel: TensorType, result: TensorType, spatial) -> str:
    window = math.prod(kernel.extent(a) for a in spatial)
    out = math.prod(result.extent(a) for a in spatial)
    return "columns" if window > out else "rows"


def _declined(op: Operation) -> bool:
    x, kernel = op.operand_types
    roles = axis_roles(x, kernel, op.attrs)
    return (
        x.dtype not in DTYPES
        or not roles["contract"]
        or 0 in (*x.extents, *kernel.extents, *op.type.extents)
        or max(x.size, kernel.size, op.type.size) >= 1 << 31
    )


def cpu_orders(op: Operation) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The CPU target's `keep` for conv: the operand orders of its tiled kernel (module doc),
    or None where it declines (then the conv is composed).

    >>> import accy
    >>> types = [accy.spec(accy.f32, c=2, w=5), accy.spec(accy.f32, o=4, c=2, w=3)]
    >>> p = accy.trace.define("c", types, lambda b, a: a[0].conv(a[1], ["w"], "c", "o"))
    >>> cpu_orders(p.operations[-1])
    (('w', 'c'), ('w', 'c', 'o'))
    """
    if op.kind != "conv" or not config.cpu_conv or _declined(op):
        return None
    x, kernel = op.operand_types
    roles = axis_roles(x, kernel, op.attrs)
    spatial, contract = roles["spatial"], roles["contract"]
    paired, batch, outputs = roles["paired"], roles["batch"], roles["outputs"]
    if _form(x, kernel, op.type, spatial) == "rows":
        return (*paired, *batch, *spatial, *contract), (*paired, *spatial, *contract, *outputs)
    return (*paired, *contract, *spatial, *batch), (*paired, *contract, *spatial, *outputs)


def geometry(op: Operation) -> ConvGeometry:
    """The geometry of a conv the CPU kept (its operands laid out by `cpu_orders`).

    >>> import accy
    >>> types = [accy.spec(accy.f32, n=2, w=5, c=3), accy.spec(accy.f32, w=3, c=3, o=4)]
    >>> p = accy.trace.define("c", types, lambda b, a: a[0].conv(a[1], ["w"], "c", "o"))
    >>> g = geometry(p.operations[-1])
    >>> g.form, g.rows, g.depth, g.outputs
    ('rows', 6, 9, 4)
    """
    x, kernel = op.operand_types
    a = op.attrs
    roles = axis_roles(x, kernel, a)
    spatial = roles["spatial"]
    size = lambda t, axes: math.prod(t.extent(axis) for axis in axes)  # noqa: E731
    form = _form(x, kernel, op.type, spatial)
    window = tuple(kernel.extent(s) for s in spatial)
    out = tuple(op.type.extent(s) for s in spatial)
    common = dict(
        dtype=x.dtype.name,
        outputs=size(kernel, roles["outputs"]),
        extents=tuple(x.extent(s) for s in spatial),
        low=tuple(a["low"]),
        lhs_dilation=tuple(a["lhs_dilation"]),
        groups=size(x, roles["paired"]),
    )
    if form == "rows":
        return ConvGeometry(
            form,
            lead=size(x, roles["batch"]),
            inner=size(x, roles["contract"]),
            row_extents=out,
            column_extents=window,
            row_step=tuple(a["stride"]),
            column_step=tuple(a["rhs_dilation"]),
            **common,
        )
    return ConvGeometry(
        form,
        lead=size(x, roles["contract"]),
        inner=size(x, roles["batch"]),
        row_extents=window,
        column_extents=out,
        row_step=tuple(a["rhs_dilation"]),
        column_step=tuple(a["stride"]),
        **common,
    )


def cpu_scratch(op: Operation) -> tuple[tuple[str, int], ...]:
    """The workspace a kept conv's CPU step needs (names and bytes).

    >>> import accy
    >>> types = [accy.spec(accy.f32, n=2, w=5, c=3), accy.spec(accy.f32, w=3, c=3, o=4)]
    >>> p = accy.trace.define("c", types, lambda b, a: a[0].conv(a[1], ["w"], "c", "o"))
    >>> cpu_scratch(p.operations[-1])
    (('patches', 216), ('weights', 576))
    """
    return geometry(op).scratch()
