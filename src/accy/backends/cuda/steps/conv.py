"""CUDA for a conv the planner kept whole: cuDNN's convolution as a library step (see
`cudnn_conv`), captured in the program's graph like fused attention."""

from __future__ import annotations

from ....errors import AccyError
from .. import cudnn_conv
from ..context import StepCode, StepContext
from .calls import library_call
from .common import stage_moving_buffers


def emit_conv(ctx: StepContext) -> StepCode:
    """The cuDNN step of the conv; its operands are contiguous buffers in the layout
    `cudnn_conv.operand_orders` chose when the plan kept it."""
    op = ctx.step.op
    try:
        call = cudnn_conv.kernel_call(op)
    except cudnn_conv.Decline as why:  # kept at planning, so cuDNN accepted it then
        raise AccyError(
            f"internal: cuDNN declined a conv it accepted when planned: {why}"
        ) from None
    ctx.module.externals[call.kernel_name] = call
    return library_call(ctx, call, stage_moving_buffers(ctx, op.operands))
