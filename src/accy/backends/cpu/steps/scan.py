"""scan: a C loop over the scanned axis that calls the body's function once per step."""

from __future__ import annotations

from ....codegen.c.dialect import GCC
from ....codegen.c.expressions import linear, offset_expression
from ....codegen.c.loops import nest
from ....core.types import TensorType
from ..loops import axis_index, axis_loops
from .context import StepContext


def address(ctx: StepContext, value: int) -> str:
    """The address of a stored value's buffer (its view's base plus offset), as `char *`."""
    view = ctx.plan.view(value)
    pointer = ctx.pointers[view.base]
    return f"(char *)({pointer} + {view.offset})" if view.offset else f"(char *){pointer}"


def double_buffered_carries(
    ctx: StepContext, carries: list[tuple[int, int]]
) -> tuple[list[str], list[str], list[str]]:
    """For a loop's carries ((initial value, result) pairs): the C that copies each initial
    value into the result's buffer and names two buffers per carry, `current{i}` (the result's)
    and `next{i}` (scratch), which the loop swaps after each step; and those two lists of names.
    """
    lines, current, following = [], [], []
    for i, (init, result) in enumerate(carries):
        nbytes = ctx.plan.program.type_of(result).nbytes
        partner = ctx.scratch("char", f"carry{i}")
        lines.append(f"memcpy({ctx.pointers[result]}, {address(ctx, init)}, {nbytes});")
        lines.append(f"char *current{i} = (char *){ctx.pointers[result]}, *next{i} = {partner};")
        current.append(f"current{i}")
        following.append(f"next{i}")
    return lines, current, following


def _slice_copy(ctx: StepContext, x: int, t: TensorType, axis: str, target: str) -> list[str]:
    """Copy step `s` of `x` along `axis` into the contiguous scratch `target`."""
    storage = GCC.c_type(t.dtype).storage
    position = t.position(axis)
    sliced = t.without([axis])
    index = axis_index(sliced, "q")
    full = index[:position] + ("s",) + index[position:]
    view = ctx.plan.view(x)
    source = f"(({storage} *){ctx.pointers[view.base]})"
    element = f"{source}[{offset_expression(full, view.strides, view.offset)}]"
    copy = f"(({storage} *){target})[{linear(index, sliced.extents)}] = {element};"
    return nest(axis_loops(sliced, "q"), [copy])


def emit_scan(ctx: StepContext) -> list[str]:
    """A C loop over the scanned axis that calls the body's function once per step.

    Carries alternate between the result buffer and a scratch buffer, so that a step never
    writes what it reads; x slices are read in place when the axis is outermost (else copied
    into scratch), and y slices are written in place (the axis is outermost in every y).
    """
    ctx.value_pointers()
    op, attrs = ctx.step.op, ctx.step.op.attrs
    length, axis = attrs["length"], attrs["axis"]
    num_consts, num_carry = attrs["num_consts"], attrs["num_carry"]
    body_function = ctx.unit.write_function(ctx.step.body)
    body_workspace = ctx.scratch("char", "body")
    inits = op.operands[num_consts : num_consts + num_carry]
    carries = list(zip(inits, op.results[:num_carry], strict=True))
    lines, current, following = double_buffered_carries(ctx, carries)
    step_lines = []
    slices = []
    for i, (x, t) in enumerate(
        zip(
            op.operands[num_consts + num_carry :],
            op.operand_types[num_consts + num_carry :],
            strict=True,
        )
    ):
        slice_bytes = t.nbytes // max(length, 1)
        if t.position(axis) == 0:
            slices.append(f"{address(ctx, x)} + s * {slice_bytes}")
        else:
            target = ctx.scratch("char", f"x{i}")
            step_lines += _slice_copy(ctx, x, t, axis, target)
            slices.append(target)
    ys = [
        f"(char *){ctx.pointers[y]} + s * {ctx.plan.program.type_of(y).nbytes // max(length, 1)}"
        for y in op.results[num_carry:]
    ]
    consts = [address(ctx, c) for c in op.operands[:num_consts]]
    arguments = consts + current + slices + following + ys
    step_lines.append(f"void *args[] = {{{', '.join(arguments) or '0'}}};")
    step_lines.append(f"{body_function}(args, {body_workspace});")
    for i in range(num_carry):
        step_lines.append(f"{{ char *swap = current{i}; current{i} = next{i}; next{i} = swap; }}")
    counter = f"{length - 1} - it" if attrs["reverse"] else "it"
    lines += nest([("it", length)], [f"const int64_t s = {counter};"] + step_lines)
    for i, (_, result) in enumerate(carries):
        nbytes = ctx.plan.program.type_of(result).nbytes
        pointer = ctx.pointers[result]
        lines.append(
            f"if (current{i} != (char *){pointer}) memcpy({pointer}, current{i}, {nbytes});"
        )
    return lines
