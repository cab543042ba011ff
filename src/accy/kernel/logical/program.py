"""The kernel DSL: `Program(name, parameters, body)` and the builders its body is run with.

`body(k, args)` runs once, when the Program is made. `k` is the kernel's scope; its
`for_each_1d` / `for_each_2d` open a loop and call `each(inner, index, each_args)`, where `inner`
is the loop's scope. Every load, op and store names the scope it happens in, and the builders
check the rules that make a kernel safe on any device:

- an index is only used inside its own loop, which guards it: no access is out of bounds for
  a buffer holding at least the loop's extent (checked at each call by `KernelCall.check_call`);
- `dst`, the call's result, is the only parameter written, never read, and stored exactly once,
  by a store that visits every position of its loop once: each element has one writer;
- a reduction runs serially inside the thread that needs it: no races, a fixed order.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping

from .. import lower, ops
from ..artifact import KernelCallArtifact, compile_kernel_call
from ..errors import KernelError
from ..ir import RESULT, Buffer, Launch, TracedKernel
from ..limits import Limits
from .params import Args
from .schedule import ThreadBlocks
from .scope import Scope, Trace

Body = Callable[[Scope, Args], object]


def trace_kernel(name: str, parameters: Mapping[str, Buffer], body: Body) -> TracedKernel:
    """Run `body` once with builders and return what it recorded."""
    trace = Trace(name)
    kernel = Scope(trace, "kernel", name, None)
    trace.open.append(kernel)
    body(kernel, Args(trace, parameters))
    trace.open.pop()
    if RESULT not in trace.writes:
        trace.fail(f"never stores {RESULT!r}, so the call's result would be left unwritten")
    return TracedKernel(
        name,
        tuple((n, b.dtype) for n, b in parameters.items()),
        tuple(kernel.statements),
        tuple(trace.reads.items()),
        tuple(trace.writes.items()),
    )


# ---------------------------------------------------------------------------------------------
# the program


class Program:
    """A kernel over named buffers; `body(k, args)` says what each element of `dst` is.

    >>> import accy
    >>> from accy.kernel import dynamic_buffer, logical
    >>> def body(k, args):
    ...     def each(inner, index, each_args):
    ...         x = each_args.param("x").load(inner, index)
    ...         each_args.param("dst").store(inner, x.add(inner, x), index)
    ...     k.for_each_1d("e", 4, args, each)
    >>> double = logical.Program(
    ...     name="accy_custom_double_4_f32",
    ...     parameters={"dst": dynamic_buffer(accy.f32), "x": dynamic_buffer(accy.f32)},
    ...     body=body,
    ... ).with_schedule(logical.schedule.thread_blocks(x=4))
    >>> double.launch(accy.kernel.Limits.testing)
    Launch(block=(4, 1, 1), grid=(1, 1, 1))
    """

    def __init__(
        self,
        name: str,
        parameters: Mapping[str, Buffer],
        body: Body,
        schedule: ThreadBlocks | None = None,
    ):
        _check_name(name)
        _check_parameters(name, parameters)
        if not callable(body):
            raise KernelError(f"kernel {name!r}: body must be a function body(k, args)")
        self.name = name
        self.parameters = dict(parameters)
        self.body = body
        self.schedule = schedule
        self.traced = trace_kernel(name, self.parameters, body)

    def __repr__(self) -> str:
        params = ", ".join(f"{n}: {b.dtype.name}" for n, b in self.parameters.items())
        return f"<kernel {self.name}({params}) schedule={self.schedule}>"

    def with_schedule(self, schedule: ThreadBlocks) -> Program:
        """This kernel with `schedule` (from `accy.kernel.logical.schedule`)."""
        if not isinstance(schedule, ThreadBlocks):
            raise KernelError(
                f"kernel {self.name!r}: with_schedule takes schedule.thread_blocks(x=...), "
                f"got {schedule!r}"
            )
        scheduled = copy.copy(self)
        scheduled.schedule = schedule
        return scheduled

    def c_source(self) -> str:
        """The C definition of `void <name>(...)`, for the CPU backend."""
        return lower.c_source(self.traced)

    def cuda_source(self) -> str:
        """The CUDA C definition of the `__global__` kernel `<name>`."""
        return lower.cuda_source(self.traced)

    def launch(self, limits: Limits) -> Launch | None:
        """Check the kernel against `limits`; its launch dimensions, or None if unscheduled."""
        if not isinstance(limits, Limits):
            raise KernelError(
                f"kernel {self.name!r}: limits must be accy.kernel.Limits, got {limits!r}"
            )
        limits.check_parameters(self.name, len(self.parameters))
        for reduction in self.traced.reductions():
            limits.check_reduction_extent(self.name, reduction.label, reduction.index.extent)
        for loop in self.traced.loops():
            limits.check_extent(self.name, loop.label, loop.index.size)
        if self.schedule is None:
            return None
        threads = self.schedule.x
        limits.check_threads_per_block(self.name, threads)
        blocks = max(
            limits.check_blocks(self.name, loop.label, loop.index.size, threads)
            for loop in self.traced.loops()
        )
        return Launch((threads, 1, 1), (blocks, 1, 1))

    def create_kernel_call_artifact(
        self,
        limits: Limits,
        handle: object,
        *,
        target: str,
        version: int,
        format: str = "cpu_object",
        arch: str | None = None,
    ) -> KernelCallArtifact:
        """Build this kernel as the implementation of custom call `(target, version)`.

        `format` is "cpu_object" (C for the CPU backend) or "cuda_ptx" (PTX for the CUDA
        backend; the kernel needs a schedule). `arch` picks the PTX's virtual architecture
        ("compute_90"); None leaves the compiler's default. `handle` is kept, not inspected.

        >>> import accy
        >>> from accy.kernel import Limits, dynamic_buffer, logical
        >>> def body(k, args):
        ...     k.for_each_1d("e", 4, args, lambda inner, i, a: a.param("dst").store(
        ...         inner, a.param("x").load(inner, i).mul(inner, 2.0), i))
        >>> double = logical.Program(
        ...     name="double4", body=body,
        ...     parameters={"dst": dynamic_buffer(accy.f32), "x": dynamic_buffer(accy.f32)})
        >>> artifact = double.create_kernel_call_artifact(
        ...     Limits.testing, None, target="accy.custom.double", version=1)
        >>> artifact.registry().require("accy.custom.double", 1).c_signature
        'void accy_kernel_double4(float* p_dst, const float* p_x)'
        """
        call = compile_kernel_call(
            self.traced,
            self.launch(limits),
            target=target,
            version=version,
            format=format,
            arch=arch,
        )
        return KernelCallArtifact(call, handle)


def _check_identifier(kernel: str, what: str, name: object) -> None:
    # Generated C prefixes every name (`accy_kernel_<name>`, `p_<param>`), so no identifier can
    # collide with a keyword, a C library function or a generated variable.
    if not isinstance(name, str) or not name.isascii() or not name.isidentifier():
        raise KernelError(f"kernel {kernel!r}: {what} must be an ASCII identifier, got {name!r}")


def _check_name(name: object) -> None:
    _check_identifier(str(name), "the kernel name", name)


def _check_parameters(kernel: str, parameters: object) -> None:
    if not isinstance(parameters, Mapping) or not parameters:
        raise KernelError(f"kernel {kernel!r}: parameters must be a dict name -> dynamic_buffer")
    for name, buffer in parameters.items():
        _check_identifier(kernel, "a parameter name", name)
        if not isinstance(buffer, Buffer):
            raise KernelError(
                f"kernel {kernel!r}: parameter {name!r} must be a buffer such as "
                f"accy.kernel.dynamic_buffer(accy.f32), got {buffer!r}"
            )
        ops.check_dtype(buffer.dtype)
    if RESULT not in parameters:
        raise KernelError(
            f"kernel {kernel!r} needs a parameter named {RESULT!r}: the call's result, which "
            f"the kernel writes"
        )
