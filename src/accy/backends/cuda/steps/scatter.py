"""CUDA for scatter_add and scatter: copy the operand, then combine the updates into it (added
atomically, bf16 sums into a float32 accumulator rounded once at the end; or in index order: f16
sums, and the kind scatter's mul, max and min, so that every rounding is the CPU's and the
reference's)."""

from __future__ import annotations

from ....codegen.c.dialect import CUDA
from ....codegen.c.expressions import Body, clamp, linear
from ....codegen.c.templates import binary
from ....core.types import bf16, bool_, f16, f32, f64, i32, i64, u8
from ..context import StepCode, StepContext, launches, nothing
from ..kernels import axis_names, blocks_for, decompose, grid_stride
from .common import element_index, elementwise, indent, rounded, store

ATOMIC_ADD = {
    f32: "atomicAdd(&{at}, {x});",
    f64: "atomicAdd(&{at}, {x});",
    i32: "atomicAdd((int *)&{at}, (int){x});",
    i64: "atomicAdd((unsigned long long *)&{at}, (unsigned long long){x});",
    u8: "accy_atomic_add_u8(&{at}, (uint8_t){x});",
    bool_: "accy_atomic_or_u8(&{at}, (uint8_t)({x} != 0));",
}
ORDERED = (f16,)  # rounded after every addition: added in index order, as NumPy does


def _scatter_target(ctx: StepContext, pointers) -> tuple[str, list[str], str, str]:
    """(pointer name, declarations, load template, store template) of what updates add into:
    the result, or for bf16 a float32 accumulator that is rounded once at the end."""
    op = ctx.step.op
    if op.type.dtype != bf16:
        ctype = CUDA.c_type(op.type.dtype)
        return pointers[op.results[0]], [], ctype.load, ctype.store
    offset = ctx.workspace_scratch("accumulator")
    declaration = f"float *__restrict__ sum = (float *)(ws + {offset});"
    return "sum", [declaration], "{x}", "{x}"


def _scatter_copy(ctx: StepContext) -> str:
    """The kernel that copies the operand into the scatter's target."""
    op = ctx.step.op
    t = op.type

    def make(body: Body, flat: bool) -> list[str]:
        target, declarations, _, store_template = _scatter_target(ctx, body.pointers)
        index, head = element_index(body, t, flat)
        x = body.value(op.operands[0], index)
        return declarations + head + body.lines + [f"{target}[i] = {store_template.format(x=x)};"]

    return elementwise(ctx, t.size, make)


def _scatter_row(ctx: StepContext, body: Body, index: tuple[str, ...]) -> str:
    """The flat position in the result where the update at `index` goes (its row clamped)."""
    op = ctx.step.op
    result, indices = op.type, op.operand_types[1]
    position = result.position(op.attrs["axis"])
    extent = result.extents[position]
    row = body.value(op.operands[1], index[position : position + indices.rank])
    clamped = body.index_temp(clamp(f"(int64_t){row}", extent))
    at = index[:position] + (clamped,) + index[position + indices.rank :]
    return linear(at, result.extents)


def _scatter_atomic(ctx: StepContext) -> tuple[str, int]:
    """One thread per update, added with an atomic operation (integers add exactly in any
    order; f32 and f64 sums, and bf16's float32 accumulator, may differ in the last bits from
    run to run). The embedding gradient of a language model is this: thousands of token rows
    into a vocabulary, where an ordered walk would leave the GPU nearly idle."""
    op = ctx.step.op
    updates = op.operand_types[2]
    pointers = ctx.pointers()
    body = ctx.body(pointers)
    target, declarations, _, _ = _scatter_target(ctx, pointers)
    names = axis_names(updates, "u")
    head = decompose("i", updates.extents, names)
    at = _scatter_row(ctx, body, names)
    update = body.value(op.operands[2], names)
    atomic = ATOMIC_ADD[f32 if op.type.dtype == bf16 else op.type.dtype]
    add = atomic.format(at=f"{target}[{at}]", x=update)
    lines = declarations + [grid_stride("i", updates.size), *indent(head + body.lines + [add]), "}"]
    return ctx.kernel(pointers, lines, "(add)"), blocks_for(updates.size)


def _scatter_ordered(ctx: StepContext) -> tuple[str, int]:
    """One thread per column (the non-index axes of the updates), walking the indices in
    order: 16-bit results round after every addition (and products after every
    multiplication), so the order must be NumPy's."""
    op = ctx.step.op
    result, indices, updates = op.type, op.operand_types[1], op.operand_types[2]
    position = result.position(op.attrs["axis"])
    index_positions = range(position, position + indices.rank)
    columns = [p for p in range(updates.rank) if p not in index_positions]
    pointers = ctx.pointers()
    body = ctx.body(pointers)
    target, declarations, load, store_template = _scatter_target(ctx, pointers)
    names = axis_names(updates, "u")
    column_extents = tuple(updates.extents[p] for p in columns)
    head = decompose("c", column_extents, tuple(names[p] for p in columns))
    inner = decompose("t", indices.extents, tuple(names[p] for p in index_positions))
    at = _scatter_row(ctx, body, names)
    update = body.temp(op.type.dtype, body.value(op.operands[2], names), rounded=False)
    element = f"{target}[{at}]"
    name = op.attrs["combine"] if op.kind == "scatter" else "add"
    ctype = CUDA.c_type(f32 if op.type.dtype == bf16 else op.type.dtype)
    total = binary(name, ctype, load.format(x=element), update)
    if op.type.dtype != bf16:
        total = rounded(op.type.dtype, total)
    add = f"{element} = {store_template.format(x=total)};"
    count = max(1, updates.size // max(indices.size, 1))
    loop = [f"for (int64_t t = 0; t < {indices.size}LL; ++t) {{", *indent(inner + body.lines)]
    lines = declarations + [grid_stride("c", count), *indent(head + loop + ["  " + add, "}"]), "}"]
    return ctx.kernel(pointers, lines, "(ordered add)"), blocks_for(count)


def _scatter_round(ctx: StepContext) -> tuple[str, int]:
    """bf16: the float32 sums rounded once into the result, eight a thread (two 16-byte
    loads, one 16-byte store) where both buffers are aligned, then one at a time."""
    op = ctx.step.op
    pointers = ctx.pointers()
    offset = ctx.workspace_scratch("accumulator")
    out = pointers[op.results[0]]
    size = op.type.size
    rounded_lanes = [f"r.v[{k}] = accy_bf16_store(s{k // 4}.v[{k % 4}]);" for k in range(8)]
    lines = [
        f"const float *__restrict__ sum = (const float *)(ws + {offset});",
        f"const bool vectorized = ((((size_t)sum) | ((size_t){out})) & 15) == 0;",
        f"const int64_t vector_end = vectorized ? {size - size % 8}LL : 0LL;",
        grid_stride("q", "vector_end / 8"),
        "  const accy_vector<float, 4> s0 = *(const accy_vector<float, 4> *)(sum + q * 8);",
        "  const accy_vector<float, 4> s1 = *(const accy_vector<float, 4> *)(sum + q * 8 + 4);",
        "  accy_vector<uint16_t, 8> r;",
        *("  " + line for line in rounded_lanes),
        f"  *(accy_vector<uint16_t, 8> *)({out} + q * 8) = r;",
        "}",
        grid_stride("i", f"{size}LL", first="vector_end"),
        "  " + store(bf16, out, "i", "sum[i]"),
        "}",
    ]
    return ctx.kernel(pointers, lines, "(round)"), blocks_for(size)


def emit_scatter(ctx: StepContext) -> StepCode:
    """Copy the operand into the result, then add each update at its (clamped) row."""
    op = ctx.step.op
    result, updates = op.type, op.operand_types[2]
    if result.size == 0:
        return nothing
    kernels = [(_scatter_copy(ctx), blocks_for(result.size))]
    if updates.size:
        ordered = result.dtype in ORDERED or op.kind == "scatter"
        kernels.append(_scatter_ordered(ctx) if ordered else _scatter_atomic(ctx))
    if result.dtype == bf16:
        kernels.append(_scatter_round(ctx))
    return launches(*kernels)
