"""scatter_add and scatter: the operand copied into the result, then each update combined into
its row (added; or multiplied, max, min for the kind `scatter`, in the same loops).

A large result whose scattered axis is its outermost is shared out by rows: each thread copies
the operand into its own band of rows and adds the updates that land there, so no two threads
write one element, every element sees its updates in the serial order (the same bits), and the
band a thread fills is still in its cache when it scatters. A fresh result's pages are also
faulted in (zeroed by the kernel) by both cores, which on a gradient of a large table is most of
the work.
"""

from __future__ import annotations

import math

from ....codegen.c.dialect import GCC
from ....codegen.c.expressions import Flat, NotFlat, linear
from ....codegen.c.loops import PARALLEL, nest
from ....codegen.c.templates import binary
from ....core.types import TensorType, bf16, f32
from ....errors import AccyError
from ..loops import axis_index, axis_loops, worth_threads
from .context import StepContext, store_element

# The band of rows (outermost indices) that one thread owns, inside a parallel region.
BAND = (
    "const int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();",
    "const int64_t row_lo = {rows} * thread / threads, row_hi = {rows} * (thread + 1) / threads;",
)


def _copy_operand_into(
    ctx: StepContext, out: str, t: TensorType, store: str, banded: bool = False
) -> list[str]:
    """Copy the operand into `out`; `banded`: only rows row_lo to row_hi (outermost axis)."""
    op = ctx.step.op
    row = math.prod(t.extents[1:])  # elements per outermost index (any extent may be 0)
    for flat in (True, False):
        body = ctx.body()
        index = Flat("i", t) if flat else axis_index(t)
        try:
            x = body.value(op.operands[0], index)
        except NotFlat:
            continue
        loops = [("i", t.size)] if flat else axis_loops(t)
        position = "i" if flat else linear(index, t.extents)
        bounds = None
        if banded:
            band = ("row_lo", "row_hi") if not flat else (f"row_lo * {row}", f"row_hi * {row}")
            bounds = {"i" if flat else "i0": band}
        copy = f"{out}[{position}] = {store.format(x=x)};"
        return nest(loops, [*body.lines, copy], bounds=bounds)
    raise AccyError("internal: no loop for the scatter operand")


def combined(op, ctype, current: str, update: str) -> str:
    """The C of `current` combined with `update`: added (scatter_add), or the kind scatter's
    `combine` (mul, max, min) with the elementwise kinds' own templates (NaN, wrapping)."""
    name = op.attrs["combine"] if op.kind == "scatter" else "add"
    return binary(name, ctype, current, update)


def emit_scatter(ctx: StepContext) -> list[str]:
    """Copy the operand into the result, then combine each update into its (clamped) row.

    bf16 results are summed in a float32 scratch array and rounded once at the end, as the
    reference evaluator (which holds bf16 in float32) does; f16 rounds after every addition,
    as NumPy's float16 `add.at` does.
    """
    ctx.value_pointers()
    op = ctx.step.op
    result, indices, updates = op.type, op.operand_types[1], op.operand_types[2]
    if result.size == 0:  # no element to write: updates have nowhere to go
        return []
    ctype = GCC.c_type(result.dtype)
    out = ctx.pointers[op.results[0]]
    if result.dtype == bf16:
        target, load, store, rounded = ctx.scratch("float", "accumulator"), "{x}", "{x}", "{x}"
    else:
        target, load, store, rounded = out, ctype.load, ctype.store, ctype.round
    position = result.position(op.attrs["axis"])
    extent = result.extents[position]
    banded = position == 0 and extent > 1 and worth_threads(result.size, ())
    lines = _copy_operand_into(ctx, target, result, store, banded)
    if extent and updates.size:
        body = ctx.body()
        index = axis_index(updates, "u")
        row = body.value(op.operands[1], index[position : position + indices.rank])
        clamped = body.index_temp(f"ACCY_CLAMP((int64_t){row}, {extent - 1})")
        if banded:
            body.lines.append(f"if ({clamped} < row_lo || {clamped} >= row_hi) continue;")
        update = body.value(op.operands[2], index)
        if op.kind == "scatter":  # max and min read it twice
            update = body.temp(result.dtype, update, rounded=False)
        at = index[:position] + (clamped,) + index[position + indices.rank :]
        element = f"{target}[{linear(at, result.extents)}]"
        ctype_of_sum = GCC.c_type(f32) if result.dtype == bf16 else ctype
        total = rounded.format(x=combined(op, ctype_of_sum, load.format(x=element), update))
        body.lines.append(f"{element} = {store.format(x=total)};")
        lines += nest(axis_loops(updates, "u"), body.lines)
    if banded:
        band = [line.format(rows=extent) for line in BAND]
        lines = [PARALLEL, "{", *(f"  {line}" for line in band + lines), "}"]
    if result.dtype == bf16:
        final = store_element(result.dtype, out, "i", f"{target}[i]")
        lines += nest([("i", result.size)], [final])
    return lines
