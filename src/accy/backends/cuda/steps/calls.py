"""CUDA for copies of outputs and for custom calls: a registered kernel on its own grid, or a
host library's step (`accy.kernel.call.LibraryStep`, e.g. cuDNN) issued on the stream."""

from __future__ import annotations

from ....errors import AccyError
from ..context import StepCode, StepContext, launches, nothing
from ..kernels import blocks_for
from ..schedule import SCRATCH, Address, External, Level, Library, Schedule
from .common import copy_kernel, stage_moving_buffers


def emit_copy(ctx: StepContext) -> StepCode:
    """An output that is an input or another output: a copy."""
    (value,) = ctx.step.reads
    t = ctx.plan.program.type_of(value)
    if t.size == 0:
        return nothing
    output = len(ctx.plan.program.parameters) + ctx.step.output
    source = ctx.slot_expression(value)
    kernel = copy_kernel(ctx, source, f"(char *)io[{output}]", ctx.storage(value), t.size)
    return launches((kernel, blocks_for(t.size)))


def _kernel_call(ctx: StepContext):
    """The registered CUDA kernel of a custom_call, checked against the call's types."""
    op = ctx.step.op
    target, version = op.attrs["target"], op.attrs["version"]
    registry = ctx.module.registry
    call = None if registry is None else registry.lookup(target, version)
    if call is None:
        raise AccyError(
            f"custom_call {target!r} version {version} has no kernel to link to: pass a "
            f"registry that has it as accy.compile(program, 'cuda', kernel_call_registry=...)"
        )
    call.check_call(op.operand_types, op.type)
    if call.library is None and (call.ptx is None or call.grid is None):
        raise AccyError(
            f"custom_call {target!r} version {version}: kernel {call.symbol} was built as "
            f"{call.format!r}; the CUDA backend needs format='cuda_ptx' (PTX and a schedule)"
        )
    ctx.module.externals[call.kernel_name] = call
    return call


def emit_custom_call(ctx: StepContext) -> StepCode:
    """The kernel the registry links to the target, launched on its own grid. Its pointers are
    fixed in the graph, so operands and a result that live in the invocation's buffers pass
    through scratch (copied in before, out after)."""
    op = ctx.step.op
    call = _kernel_call(ctx)
    staging = stage_moving_buffers(ctx, op.operands)
    if call.library is not None:
        return library_call(ctx, call, staging)

    def schedule_call(level: Level, schedule: Schedule) -> None:
        launches(*staging.copies_before(ctx, level))(level, schedule)
        operands = iter(op.operands)
        arguments = [
            staging.result_address(ctx, level)
            if name == "dst"
            else staging.address(ctx, level, next(operands))
            for name, _ in call.parameters
        ]
        schedule.add(External(call.kernel_name, call.grid, call.block, tuple(arguments)))
        launches(*staging.copies_after(ctx, level))(level, schedule)

    return schedule_call


def library_call(ctx: StepContext, call, staging) -> StepCode:
    """A host library's step: like a custom kernel, it is captured with fixed addresses
    (operands and a result in the invocation's buffers pass through scratch), and it gets
    `scratch_bytes` of scratch of its own."""
    op = ctx.step.op
    own = ctx.scratch(max(call.library.scratch_bytes, 1))

    def schedule_library(level: Level, schedule: Schedule) -> None:
        launches(*staging.copies_before(ctx, level))(level, schedule)
        operands = tuple(staging.address(ctx, level, value) for value in op.operands)
        result = staging.result_address(ctx, level)
        schedule.add(Library(call.kernel_name, result, operands, Address(SCRATCH, own)))
        launches(*staging.copies_after(ctx, level))(level, schedule)

    return schedule_library
