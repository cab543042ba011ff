"""Kernels that tests and docstrings share (first, the custom double kernel), and the
shortest way to run a kernel on NumPy arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..core.types import DType, f32
from .ir import Index, dynamic_buffer
from .limits import Limits
from .logical import Args, Program, Scope, Value, schedule

CUSTOM_DOUBLE_TARGET = "accy.custom.double"


def custom_double_kernel(size: int = 4) -> Program:
    """A kernel doubling its input, `dst = x + x`, over `size` f32 elements, a thread each.

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

        k.for_each_1d("e", size, args, each)

    return Program(
        name=f"accy_custom_double_{size}_f32",
        parameters={"dst": dynamic_buffer(f32), "x": dynamic_buffer(f32)},
        body=body,
    ).with_schedule(schedule.thread_blocks(x=size))


def map_kernel(
    name: str,
    result: DType,
    operands: Sequence[DType],
    compute: Callable[..., Value],
    extent: int,
    threads: int = 32,
) -> Program:
    """`dst[i] = compute(inner, x0[i], x1[i], ...)` for i < extent, one thread per element.

    >>> import numpy as np
    >>> import accy
    >>> from accy.kernel.examples import map_kernel, run_on_cpu
    >>> halve = map_kernel("halve", accy.f32, [accy.f32], lambda inner, x: x.mul(inner, 0.5), 4)
    >>> run_on_cpu(halve, np.array([1, 2, 3, 4], np.float32)).tolist()
    [0.5, 1.0, 1.5, 2.0]
    """
    names = [f"x{n}" for n in range(len(operands))]
    parameters = {"dst": dynamic_buffer(result)}
    parameters.update({n: dynamic_buffer(d) for n, d in zip(names, operands, strict=True)})

    def body(k: Scope, args: Args) -> None:
        def each(inner: Scope, index: Index, each_args: Args) -> None:
            values = [each_args.param(n).load(inner, index) for n in names]
            each_args.param("dst").store(inner, compute(inner, *values), index)

        k.for_each_1d("e", extent, args, each)

    program = Program(name=name, parameters=parameters, body=body)
    return program.with_schedule(schedule.thread_blocks(x=threads))


def run_on_cpu(program: Program, *operands: np.ndarray) -> np.ndarray:
    """Build `program` for the CPU (under `Limits.default`) and run it on `operands`.

    >>> import numpy as np
    >>> run_on_cpu(custom_double_kernel(), np.array([1, 2, 3, 4], np.float32)).tolist()
    [2.0, 4.0, 6.0, 8.0]
    """
    artifact = program.create_kernel_call_artifact(
        Limits.default, None, target=f"example.{program.name}", version=1
    )
    return artifact.call.run_on_cpu(list(operands))
