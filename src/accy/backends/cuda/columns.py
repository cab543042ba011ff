"""Column reductions (the innermost axis kept: bias gradients, sums over the tokens) in one
kernel that reads its input at memory speed.

A block covers a *tile* of `ColumnCut.vectors` vectors of `width` adjacent results (16 bytes
of input each) and one *chunk* of the reduced rows: thread (`cv`, `rl`) adds vector `cv`'s
rows `rl`, `rl + row_lanes`, ... of the chunk, `width` accumulators in registers, one vector
load per row. The block's `row_lanes` partial values of each result are combined in shared
memory in lane order. With one chunk that is the result. With several (too few tiles to fill
the GPU: GPT-2's [8192, 768] is 6 tiles), each block writes its partial values to scratch,
and the last block of a tile to arrive (`__threadfence`, then an atomic counter in
`Module.counters`, which that block sets back to zero for the next run or graph replay) adds
the tile's partial values in chunk order: no second kernel, no float atomics.

The order of additions is fixed by the shapes alone (and, as for every reduction, by whether
the buffers allow vector loads), so results are the same bits run after run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .kernels import BLOCK, indent
from .reductions import Accumulator, identity

COLUMN_VECTORS = 16  # vectors per tile: a warp reads two rows of 256 contiguous bytes
SCALAR_COLUMNS = 32  # results per tile without vectors: a warp reads one row's 32 results
BUSY_BLOCKS = 132 * 3  # blocks that keep an H200's 132 SMs reading (about 3 each)
MIN_ROWS_PER_THREAD = 8  # fewer than this and a thread's loads do not hide its setup
MAX_CHUNKS = 128  # the last block of a tile reads chunks x columns partial values


@dataclass(frozen=True)
class ColumnCut:
    """How a column reduction of `outputs` results of `length` elements each is shared: tiles
    of `vectors` vectors of `width` adjacent results, each tile's rows cut into `chunks`."""

    outputs: int
    length: int
    width: int
    vectors: int
    chunks: int

    @property
    def row_lanes(self) -> int:
        """Threads of a block that share one vector of results (each its own rows)."""
        return BLOCK // self.vectors

    @property
    def columns(self) -> int:
        """Results per tile."""
        return self.vectors * self.width

    @property
    def tiles(self) -> int:
        return math.ceil(self.outputs / self.columns)

    @property
    def grid(self) -> int:
        return self.tiles * self.chunks


def choose_column_cut(outputs: int, length: int, width: int, counters: int) -> ColumnCut:
    """The cut of `outputs` column results of `length` elements, `width` adjacent results per
    thread (dividing `outputs`); at most `counters` tiles when the rows are cut into chunks.

    Columns of at most one row per row lane (`BLOCK // vectors` of them) take a thread each
    instead, a block of 256 vectors: the row lanes past the column's end would have nothing to
    do. Llama's grouped-query key and value gradients, sums of 4 query heads, kept 12 of 16
    threads idle (40 us a layer each for 42 MB on the H200). Each thread then adds the rows in
    the order the lanes' partial values were combined: the same sums, bit for bit.

    >>> choose_column_cut(768, 8192, 8, 4096)  # GPT-2's bias gradient, bf16
    ColumnCut(outputs=768, length=8192, width=8, vectors=16, chunks=64)
    >>> choose_column_cut(7, 5, 1, 4096)  # a few short columns: one block, one pass
    ColumnCut(outputs=7, length=5, width=1, vectors=8, chunks=1)
    >>> choose_column_cut(4194304, 4, 8, 4096)  # the sum over a query group of 4 heads, bf16
    ColumnCut(outputs=4194304, length=4, width=8, vectors=256, chunks=1)
    """
    most = COLUMN_VECTORS if width > 1 else SCALAR_COLUMNS
    if length <= BLOCK // most:
        most = BLOCK
    vectors = min(most, 1 << max(0, math.ceil(math.log2(outputs // width))))
    tiles = math.ceil(outputs / (vectors * width))
    chunks = 1
    # Only a tile of at most a block's results is combined by its last block (`_last_block`).
    if tiles < BUSY_BLOCKS and tiles <= counters and vectors * width <= BLOCK:
        rows = length // (BLOCK // vectors * MIN_ROWS_PER_THREAD)
        chunks = max(1, min(math.ceil(BUSY_BLOCKS / tiles), rows, MAX_CHUNKS))
    return ColumnCut(outputs, length, width, vectors, chunks)


@dataclass(frozen=True)
class ColumnLoop:
    """The loop body of a column reduction: `statements` computing, for row counter `r` and
    the kept indices of vector `o`, one value per lane (`values`), valid where C `condition`
    holds (the vector form: its buffers are aligned; "true" for the scalar form)."""

    statements: list[str]
    values: list[str]
    condition: str = "true"


@dataclass(frozen=True)
class ColumnKernel:
    """What a column reduction kernel computes besides its loop: the kept indices of vector
    `o` (`first(o)`), the initial value (`head` statements, C value `initial`), the final
    store (`store(column, value)`), and with chunks the partial values' C pointer `partials`
    and the arrival counters `counters`."""

    accumulator: Accumulator
    first: Callable[[str], list[str]]
    head: list[str]
    initial: str
    store: Callable[[str, str], list[str]]
    partials: str = ""
    counters: str = ""


def _row_loop(cut: ColumnCut, loop: ColumnLoop, acc: Accumulator, unrolled: bool) -> list[str]:
    """Thread (cv, rl)'s loop over its rows of the block's chunk."""
    rows = f"{cut.length}LL"
    first = f"chunk * {rows} / {cut.chunks}" if cut.chunks > 1 else "0"
    stop = f"(chunk + 1) * {rows} / {cut.chunks}" if cut.chunks > 1 else rows
    lines = [f"const int64_t r_stop = {stop};"]
    if unrolled:
        # Loads of the next rows are issued before this row's values are added in: more
        # bytes in flight per thread (the order of additions is the same).
        lines.append("#pragma unroll 4")
    lines.append(f"for (int64_t r = {first} + rl; r < r_stop; r += {cut.row_lanes}) {{")
    lines += indent(loop.statements)
    for k, x in enumerate(loop.values):
        lines.append(f"  {acc.name}{k} = {acc.combine(f'{acc.name}{k}', x)};")
    return lines + ["}"]


def _rows_of_shared(acc: Accumulator, count: int, stride: int, column: str) -> list[str]:
    """`total` = the `count` values of `column` in shared memory (`stride` apart), in order."""
    shared = f"{acc.name}_shared"
    lines = [f"{acc.compute} total = {shared}[{column}];"]
    if count > 1:
        lines += [
            f"for (int l = 1; l < {count}; ++l) {{",
            f"  total = {acc.combine('total', f'{shared}[l * {stride} + {column}]')};",
            "}",
        ]
    return lines


def _last_block(cut: ColumnCut, kernel: ColumnKernel) -> list[str]:
    """The last block of a tile to arrive adds the tile's partial values in chunk order
    (`groups` threads per result, each every `groups`-th chunk, then in group order)."""
    acc = kernel.accumulator
    groups = BLOCK // cut.columns
    column = f"(int64_t)tile * {cut.columns} + c"
    partial = (
        f"((volatile {acc.compute} *){kernel.partials})[(int64_t)g * {cut.outputs}LL + column]"
    )
    finish = kernel.store("column", acc.combine(kernel.initial, "total"))
    return [
        # Every block's partial values are visible before its arrival is counted.
        "__threadfence();",
        "__shared__ bool is_last;",
        "__syncthreads();",
        "if (threadIdx.x == 0) {",
        f"  is_last = atomicAdd({kernel.counters} + tile, 1u) == {cut.chunks - 1}u;",
        "}",
        "__syncthreads();",
        "if (!is_last) return;",
        f"const int c = threadIdx.x % {cut.columns};",
        f"const int64_t column = {column};",
        f"{acc.compute} part = {identity(acc.reducer, acc.dtype)};",
        f"if (column < {cut.outputs}LL) {{",
        "  #pragma unroll 8",
        f"  for (int g = threadIdx.x / {cut.columns}; g < {cut.chunks}; g += {groups}) {{",
        f"    part = {acc.combine('part', partial)};",
        "  }",
        "}",
        f"{acc.name}_shared[threadIdx.x] = part;",
        "__syncthreads();",
        f"if (threadIdx.x < {cut.columns} && column < {cut.outputs}LL) {{",
        *indent(_rows_of_shared(acc, groups, cut.columns, "threadIdx.x")),
        *indent(finish),
        "}",
        # Every block of the tile has arrived: the counter is free for the next run.
        f"if (threadIdx.x == 0) {kernel.counters}[tile] = 0;",
    ]


def column_lines(
    cut: ColumnCut, kernel: ColumnKernel, scalar: ColumnLoop, vector: ColumnLoop | None
) -> list[str]:
    """The statements of a column reduction kernel (see the module docstring); `vector` the
    loop with vector loads (used where its condition holds), `scalar` the loop otherwise."""
    acc = kernel.accumulator
    width = cut.width
    lines = list(kernel.head)
    lines += [
        f"__shared__ {acc.compute} {acc.name}_shared[{BLOCK * width}];",
        f"const unsigned int tile = blockIdx.x % {cut.tiles}u;",
        f"const unsigned int chunk = blockIdx.x / {cut.tiles}u;",
        f"const int cv = threadIdx.x % {cut.vectors};",
        f"const int rl = threadIdx.x / {cut.vectors};",
        f"const int64_t o = (int64_t)tile * {cut.vectors} + cv;",
    ]
    lines += [
        f"{acc.compute} {acc.name}{k} = {identity(acc.reducer, acc.dtype)};" for k in range(width)
    ]
    inner = kernel.first("o")
    if vector is None:
        inner += _row_loop(cut, scalar, acc, False)
    else:
        # Where a buffer is misaligned, the same rows element by element (the same order).
        inner.append(f"if ({vector.condition}) {{")
        inner += indent(_row_loop(cut, vector, acc, True))
        inner.append("} else {")
        inner += indent(_row_loop(cut, scalar, acc, False))
        inner.append("}")
    lines += [f"if (o < {cut.outputs // width}LL) {{", *("  " + x for x in inner), "}"]
    lines += [
        f"{acc.name}_shared[rl * {cut.columns} + cv * {width} + {k}] = {acc.name}{k};"
        for k in range(width)
    ]
    lines.append("__syncthreads();")
    if cut.columns > BLOCK:  # more results than threads: each thread stores every BLOCK-th
        return lines + _stores_of_a_wide_tile(cut, kernel)
    lines.append(f"const int64_t result = (int64_t)tile * {cut.columns} + threadIdx.x;")
    lines.append(f"if (threadIdx.x < {cut.columns} && result < {cut.outputs}LL) {{")
    lines += ["  " + x for x in _rows_of_shared(acc, cut.row_lanes, cut.columns, "threadIdx.x")]
    if cut.chunks == 1:
        lines += ["  " + x for x in kernel.store("result", acc.combine(kernel.initial, "total"))]
    else:
        at = f"(int64_t)chunk * {cut.outputs}LL + result"
        lines.append(f"  {kernel.partials}[{at}] = total;")
    lines.append("}")
    if cut.chunks > 1:
        lines += _last_block(cut, kernel)
    return lines


def _stores_of_a_wide_tile(cut: ColumnCut, kernel: ColumnKernel) -> list[str]:
    """The stores of a tile of more results than a block has threads (one chunk: see
    `choose_column_cut`): thread t stores results t, t + BLOCK, ... of the tile, read from
    shared memory so that a warp's stores are adjacent."""
    acc = kernel.accumulator
    finish = kernel.store("result", acc.combine(kernel.initial, "total"))
    return [
        f"for (int c = threadIdx.x; c < {cut.columns}; c += {BLOCK}) {{",
        f"  const int64_t result = (int64_t)tile * {cut.columns} + c;",
        f"  if (result < {cut.outputs}LL) {{",
        *indent(indent(_rows_of_shared(acc, cut.row_lanes, cut.columns, "c"))),
        *indent(indent(finish)),
        "  }",
        "}",
    ]
