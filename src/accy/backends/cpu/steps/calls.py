"""custom_call (a kernel linked from the registry) and copies into outputs."""

from __future__ import annotations

from .context import StepContext


def emit_custom_call(ctx: StepContext) -> list[str]:
    """A call to the kernel the registry links to the target, its `dst` bound to the result."""
    ctx.value_pointers()
    op = ctx.step.op
    kernel = ctx.unit.kernel_for(op)
    operands = iter(op.operands)
    arguments = []
    for name, _ in kernel.parameters:
        if name == "dst":
            arguments.append(f"(void *){ctx.pointers[op.results[0]]}")
        else:
            view = ctx.plan.view(next(operands))
            arguments.append(f"(void *)({ctx.pointers[view.base]} + {view.offset})")
    return [f"{kernel.symbol}({', '.join(arguments)});"]


def emit_copy(ctx: StepContext) -> list[str]:
    """Copy a stored value into an output (an input returned, or a value returned twice)."""
    (value,) = ctx.step.reads
    t = ctx.plan.program.type_of(value)
    source = ctx.parameter("void", "source", ctx.slot_pointer(value), False)
    target = ctx.parameter("void", "target", ctx.output_pointer(ctx.step.output), True)
    return [f"memcpy({target}, {source}, {t.nbytes});"] if t.nbytes else []
