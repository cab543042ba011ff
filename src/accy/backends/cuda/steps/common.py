"""What several CUDA step emitters share: elementwise kernels, stores, copies, staging.

Imports no step module, so that every step module may import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ....codegen.c.dialect import CUDA
from ....codegen.c.expressions import Body, Flat, NotFlat
from ....errors import AccyError
from ..context import StepContext
from ..kernels import Kernel, axis_names, blocks_for, decompose, grid_stride
from ..schedule import SCRATCH, Address, Level


def indent(lines: list[str]) -> list[str]:
    return ["  " + line for line in lines]


def store(dtype, pointer: str, position: str, x: str) -> str:
    return f"{pointer}[{position}] = {CUDA.c_type(dtype).store.format(x=x)};"


def rounded(dtype, x: str) -> str:
    return CUDA.c_type(dtype).round.format(x=x)


def elementwise(ctx: StepContext, size: int, make) -> Kernel:
    """A grid-stride kernel over `size` elements; `make(body, flat)` returns the statements
    for element `i`, flat (one counter) when every access allows it, else per axis."""
    for flat in (True, False) if size > 1 else (False,):
        pointers = ctx.pointers()
        body = ctx.body(pointers)
        try:
            statements = make(body, flat)
        except NotFlat:
            continue
        lines = [grid_stride("i", size), *indent(statements), "}"]
        return ctx.kernel(pointers, lines)
    raise AccyError("internal: no loop for an elementwise step")


def element_index(body: Body, t, flat: bool, counter: str = "i", prefix: str = "i"):
    """(index, statements) of element `counter` of type `t`: flat, or one name per axis."""
    if flat:
        return Flat(counter, t), []
    names = axis_names(t, prefix)
    return names, decompose(counter, t.extents, names)


def copy_kernel(ctx: StepContext, source: str, target: str, storage: str, count: int) -> Kernel:
    """A kernel copying `count` elements of `storage` from C address `source` to `target`."""
    lines = [
        f"const {storage} *__restrict__ source = (const {storage} *)({source});",
        f"{storage} *__restrict__ target = ({storage} *)({target});",
        grid_stride("i", count),
        "  target[i] = source[i];",
        "}",
    ]
    return ctx.declare_kernel(lines, f"step {ctx.index}: copy")


@dataclass
class Staging:
    """Operands and a result that live in the invocation's buffers, whose addresses move from
    call to call, routed through scratch so that a library call or a custom kernel captured in
    the graph sees fixed addresses: `copies_in` run before it, `copies_out` after."""

    operands: dict[int, int] = field(default_factory=dict)  # value -> its copy's scratch offset
    result: int | None = None  # the result's byte offset in scratch, if it moves
    copies_in: list[tuple[Kernel, int]] = field(default_factory=list)
    copies_out: list[tuple[Kernel, int]] = field(default_factory=list)

    def address(self, ctx: StepContext, level: Level, value: int) -> Address:
        """Where the call reads operand `value` when the plan runs at `level`."""
        if value in self.operands:
            return Address(SCRATCH, self.operands[value])
        return ctx.view_address(level, value)

    def result_address(self, ctx: StepContext, level: Level) -> Address:
        """Where the call writes the step's result when the plan runs at `level`."""
        if self.result is not None:
            return Address(SCRATCH, self.result)
        return ctx.slot_address(level, ctx.step.op.results[0])


def _moves(ctx: StepContext, value: int) -> bool:
    """Whether stored `value` lives in the invocation's buffers (its address moves)."""
    return ctx.plan.slots[value].storage != "workspace"


def _span(ctx: StepContext, value: int) -> int:
    """Elements from the first to the last element of `value`'s view, inclusive."""
    t = ctx.plan.program.type_of(value)
    strides = ctx.view(value).strides
    return 1 + sum((n - 1) * abs(s) for n, s in zip(t.extents, strides, strict=True))


def stage_moving_buffers(ctx: StepContext, operands) -> Staging:
    """Copy kernels that route `operands` (values read as whole buffers) and the step's result
    through scratch, those of them whose addresses move; an operand's view keeps its layout."""
    staging = Staging()
    for value in operands:
        if value in staging.operands or not _moves(ctx, ctx.view(value).base):
            continue
        span = _span(ctx, value)
        offset = staging.operands[value] = ctx.scratch(span * ctx.itemsize(value))
        source, storage = ctx.view_expression(value), ctx.storage(value)
        kernel = copy_kernel(ctx, source, f"scratch + {offset}", storage, span)
        staging.copies_in.append((kernel, blocks_for(span)))
    op = ctx.step.op
    result = op.results[0]
    if _moves(ctx, result):
        staging.result = ctx.scratch(op.type.nbytes)
        source, target = f"scratch + {staging.result}", ctx.slot_expression(result)
        kernel = copy_kernel(ctx, source, target, ctx.storage(result), op.type.size)
        staging.copies_out.append((kernel, blocks_for(op.type.size)))
    return staging
