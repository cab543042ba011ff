"""scatter_add: the operand copied into the result, then each update added at its row."""

from __future__ import annotations

from ....errors import AccyError
from ....types import TensorType, bf16
from ..dtypes import c_type
from ..expressions import Flat, NotFlat, linear
from ..loops import axis_index, axis_loops, nest
from .context import StepContext, store_element


def _copy_operand_into(ctx: StepContext, out: str, t: TensorType, store: str) -> list[str]:
    op = ctx.step.op
    for flat in (True, False):
        body = ctx.body()
        index = Flat("i", t) if flat else axis_index(t)
        try:
            x = body.value(op.operands[0], index)
        except NotFlat:
            continue
        loops = [("i", t.size)] if flat else axis_loops(t)
        position = "i" if flat else linear(index, t.extents)
        return nest(loops, body.lines + [f"{out}[{position}] = {store.format(x=x)};"])
    raise AccyError("internal: no loop for the scatter operand")


def emit_scatter(ctx: StepContext) -> list[str]:
    """Copy the operand into the result, then add each update at its (clamped) row.

    bf16 results are summed in a float32 scratch array and rounded once at the end, as the
    reference evaluator (which holds bf16 in float32) does; f16 rounds after every addition,
    as NumPy's float16 `add.at` does.
    """
    ctx.value_pointers()
    op = ctx.step.op
    result, indices, updates = op.type, op.operand_types[1], op.operand_types[2]
    ctype = c_type(result.dtype)
    out = ctx.pointers[op.results[0]]
    if result.dtype == bf16:
        target, load, store, rounded = ctx.scratch("float", "accumulator"), "{x}", "{x}", "{x}"
    else:
        target, load, store, rounded = out, ctype.load, ctype.store, ctype.round
    lines = _copy_operand_into(ctx, target, result, store)
    position = result.position(op.attrs["axis"])
    extent = result.extents[position]
    if extent and updates.size:
        body = ctx.body()
        index = axis_index(updates, "u")
        row = body.value(op.operands[1], index[position : position + indices.rank])
        clamped = body.index_temp(f"ACCY_CPU_CLAMP((int64_t){row}, {extent - 1})")
        update = body.value(op.operands[2], index)
        at = index[:position] + (clamped,) + index[position + indices.rank :]
        element = f"{target}[{linear(at, result.extents)}]"
        total = rounded.format(x=f"{load.format(x=element)} + {update}")
        body.lines.append(f"{element} = {store.format(x=total)};")
        lines += nest(axis_loops(updates, "u"), body.lines)
    if result.dtype == bf16:
        final = store_element(result.dtype, out, "i", f"{target}[i]")
        lines += nest([("i", result.size)], [final])
    return lines
