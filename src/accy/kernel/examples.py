"""Kernels that tests and examples share; first among them the seed's custom double kernel."""

from __future__ import annotations

from ..types import f32
from .ir import Index, dynamic_buffer
from .logical import Args, Program, Scope, schedule

CUSTOM_DOUBLE_TARGET = "accy.custom.double"


def custom_double_kernel() -> Program:
    """The seed's `customDoubleKernel`: `dst = x + x` over 4 f32 elements, 4 threads a block.

    >>> import numpy as np
    >>> import accy
    >>> from accy.kernel.examples import CUSTOM_DOUBLE_TARGET, custom_double_kernel
    >>> artifact = custom_double_kernel().create_kernel_call_artifact(
    ...     accy.kernel.Limits.testing, None, target=CUSTOM_DOUBLE_TARGET, version=1)
    >>> call = artifact.registry().require(CUSTOM_DOUBLE_TARGET, 1)
    >>> call.run_on_cpu([np.array([1, 2, 3, 4], np.float32)]).tolist()
    [2.0, 4.0, 6.0, 8.0]
    """

    def body(k: Scope, args: Args) -> None:
        def each(inner: Scope, index: Index, each_args: Args) -> None:
            x = each_args.param("x").load(inner, index)
            doubled = x.add(inner, x)
            each_args.param("dst").store(inner, doubled, index)

        k.for_each_1d("e", 4, args, each)

    return Program(
        name="accy_custom_double_4_f32",
        parameters={"dst": dynamic_buffer(f32), "x": dynamic_buffer(f32)},
        body=body,
    ).with_schedule(schedule.thread_blocks(x=4))
