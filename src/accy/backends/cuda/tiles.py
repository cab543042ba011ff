"""Transposing copies at memory speed: tiles staged through shared memory.

A copy into another layout (a GEMM operand packed into scratch: `steps.dot._pack`) walks the
elements in one order. When the source's stride-1 axis (`read`) and the destination's
stride-1 axis (`write`) differ, one of the two sides is strided whatever that order is: every
lane of a warp touches its own 32-byte sector. GPT-2's output-projection weight gradient packed
the [batch, head, token, 64 of 72] attention output into [head, dim, batch, token] that way,
writing with a stride of 8192 elements: 104 us for 12.6 MB, about a tenth of memory speed.

So each thread block takes a tile of `side` x `side` elements spanned by those two axes (the
other axes, and the tile's place along the two, come from a grid-stride loop over tiles):

1. the block's threads read the tile with consecutive lanes along `read` (coalesced), computing
   the value at each position (`load`, the shared expression builder's statements), into a
   shared array in the compute type, one row per `write` position;
2. `__syncthreads()`;
3. they write it with consecutive lanes along `write` (coalesced), each lane reading a column
   of the shared array; `__syncthreads()` again before the next tile overwrites it.

A row of the shared array is `side + 1` values long, so a column's values fall in 32 distinct
banks (the row length is 1 modulo 32) and neither phase has bank conflicts. The side is 64
(4096 values, 16 per thread; 16.3 KiB of shared memory for 4-byte compute types) except for
8-byte compute types, whose tile is 32 x 32 (8.3 KiB). Tiles at the end of an axis whose extent
the side does not divide are checked element by element; axes the side divides are not.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .kernels import BLOCK, blocks_for, decompose, indent

# Element positions along the two tile axes, named apart from the shared expression builder's
# temporaries (`t<n>`, `j<n>`) and pointers (`v<n>`).
TILE_COUNTER = "tile_index"
SHARED = "accy_tile"
LANE = "tile_lane"
ROW = "tile_row"

Load = Callable[[tuple[str, ...]], tuple[list[str], str]]  # index -> (statements, value)
Store = Callable[[tuple[str, ...], str], str]  # (index, value) -> statement


def transposed_axes(extents, source_strides, target_strides) -> tuple[int, int] | None:
    """(read, write): the axes of stride 1 in the source and in the target of a copy of a
    tensor of `extents`, when they are two different axes (the copy transposes); None when the
    copy is coalesced both ways as it is, or when the source has no axis of stride 1 to read
    along (a broadcast, a strided slice: no tile makes it contiguous).

    >>> transposed_axes((8, 12, 1024, 64), (884736, 73728, 72, 1), (1024, 524288, 1, 8192))
    (3, 2)
    >>> transposed_axes((8, 12, 1024, 64), (884736, 73728, 72, 1), (786432, 64, 768, 1)) is None
    True
    """
    read = _unit_axis(extents, source_strides)
    write = _unit_axis(extents, target_strides)
    if read is None or write is None or read == write:
        return None
    return read, write


def _unit_axis(extents, strides) -> int | None:
    """The axis of more than one element whose stride is +-1, if any (the last such)."""
    units = [p for p, (n, s) in enumerate(zip(extents, strides, strict=True)) if n > 1]
    units = [p for p in units if abs(strides[p]) == 1]
    return units[-1] if units else None


def tile_side(compute_bytes: int) -> int:
    """Elements along each side of a tile whose values take `compute_bytes` each in shared
    memory: 64 (16 per thread of a block), 32 for 8-byte values (a quarter of the memory).

    >>> tile_side(4), tile_side(8)
    (64, 32)
    """
    return 32 if compute_bytes >= 8 else 64


def tile_count(extents, read: int, write: int, side: int) -> int:
    """How many tiles cover a tensor of `extents` (the grid-stride loop's length).

    >>> tile_count((8, 12, 1024, 64), 3, 2, 64)
    1536
    """
    return math.prod(_tile_extents(extents, read, write, side))


def _tile_extents(extents, read: int, write: int, side: int) -> tuple[int, ...]:
    """Each axis's extent in tiles: `side` elements a tile along the two tile axes, one
    element along the others."""
    return tuple(math.ceil(n / side) if p in (read, write) else n for p, n in enumerate(extents))


def tiled_copy(
    extents: tuple[int, ...],
    names: tuple[str, ...],
    axes: tuple[int, int],
    compute: str,
    compute_bytes: int,
    load: Load,
    store: Store,
) -> tuple[list[str], int]:
    """The statements of a kernel that copies a tensor of `extents` one tile at a time (see
    the module doc), and its grid.

    `names` are the C names of the element's index along each axis ("0" where the extent is
    1), `axes` the (read, write) axes of `transposed_axes`, `compute` the C type of a value as
    `load` returns it. `load(index)` gives the statements computing the value at `index`
    (a tuple of C expressions, one per axis) and the value; `store(index, value)` the
    statement writing it at `index`.

    >>> lines, grid = tiled_copy(
    ...     (100, 70), ("p0", "p1"), (1, 0), "float", 4,
    ...     lambda i: ([], f"src[{i[0]} * 70 + {i[1]}]"),
    ...     lambda i, x: f"dst[{i[0]} + {i[1]} * 100] = {x};")
    >>> grid, lines[0]
    (4, '__shared__ float accy_tile[64][65];')
    """
    read, write = axes
    side = tile_side(compute_bytes)
    rows_per_pass = BLOCK // side
    tiled = _tile_extents(extents, read, write, side)
    tile_names = tuple(
        (f"{name}_tile" if tiled[p] != 1 else "0") if p in axes else name
        for p, name in enumerate(names)
    )

    # Inside a phase: the element this thread handles, lanes along `along`, rows along the
    # other tile axis.
    def element(along: int) -> tuple[list[str], tuple[str, ...], str]:
        across = write if along == read else read
        positions = {along: LANE, across: ROW}
        lines = [
            f"const int64_t {names[p]} = {_start(tile_names[p], side)}{positions[p]};"
            for p in (along, across)
        ]
        bounds = [f"{names[p]} < {extents[p]}" for p in axes if extents[p] % side]
        return lines, names, " && ".join(bounds)

    read_lines, index, bounds = element(read)
    statements, value = load(index)
    gather = [*statements, f"{SHARED}[{ROW}][{LANE}] = {value};"]
    write_lines, _, _ = element(write)
    scatter = [store(index, f"{SHARED}[{LANE}][{ROW}]")]
    lines = [
        f"__shared__ {compute} {SHARED}[{side}][{side + 1}];",
        f"const int {LANE} = (int)(threadIdx.x % {side}u);",
        f"for (int64_t {TILE_COUNTER} = (int64_t)blockIdx.x; {TILE_COUNTER} < "
        f"{math.prod(tiled)}LL; {TILE_COUNTER} += (int64_t)gridDim.x) {{",
        *indent(decompose(TILE_COUNTER, tiled, tile_names)),
        *indent(_rows(side, rows_per_pass, read_lines, bounds, gather)),
        "  __syncthreads();",
        *indent(_rows(side, rows_per_pass, write_lines, bounds, scatter)),
        "  __syncthreads();",
        "}",
    ]
    return lines, blocks_for(math.prod(tiled), per_block=1)


def _start(tile: str, side: int) -> str:
    """The first element of tile `tile` along its axis, as the start of a C sum."""
    return "" if tile == "0" else f"{tile} * {side} + "


def _rows(side: int, step: int, head: list[str], bounds: str, body: list[str]) -> list[str]:
    """A loop over the tile's rows, `step` rows a pass (one per group of `side` threads),
    unrolled, running `body` at the positions `head` names, where `bounds` holds."""
    inner = [f"if ({bounds}) {{", *indent(body), "}"] if bounds else body
    return [
        "#pragma unroll",
        f"for (int {ROW} = (int)(threadIdx.x / {side}u); {ROW} < {side}; {ROW} += {step}) {{",
        *indent(head + inner),
        "}",
    ]
