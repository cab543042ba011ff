"""Building a kernel Program into a `KernelCallArtifact` for one custom-call target.

The build checks the kernel against the device `Limits`, lowers it, and compiles it for the
format asked: "cuda_ptx" compiles the CUDA C to PTX (NVRTC or nvcc); "cpu_object" checks the C
with the C compiler. Either way, a kernel that would not compile or not fit fails here, with the
target named, and never at link time or launch.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import lower
from .call import KernelCall, KernelCallRegistry
from .errors import KernelError
from .limits import Limits
from .logical.program import Program
from .toolchain import check_c_source, cuda_to_ptx

FORMATS = ("cpu_object", "cuda_ptx")


@dataclass(frozen=True)
class KernelCallArtifact:
    """A built kernel and the device-state handle it was built for."""

    call: KernelCall
    handle: object  # whatever the backend's State().handle() gave; the kernel does not use it

    def registry(self) -> KernelCallRegistry:
        """A registry mapping this artifact's (target, version) to its kernel."""
        return KernelCallRegistry([self.call])


def create_kernel_call_artifact(
    program: Program,
    limits: Limits,
    handle: object,
    *,
    target: str,
    version: int,
    format: str = "cpu_object",
    arch: str | None = None,
) -> KernelCallArtifact:
    """Build `program` as the kernel of custom call `(target, version)`.

    `format` is "cpu_object" (C for the CPU backend) or "cuda_ptx" (PTX for the CUDA backend;
    the program needs a schedule). `arch` picks the PTX's virtual architecture ("compute_90");
    None leaves the compiler's default. `handle` is kept, not inspected.

    >>> import accy
    >>> from accy.kernel import Limits, dynamic_buffer, logical
    >>> def body(k, args):
    ...     k.for_each_1d("e", 4, args, lambda inner, i, a: a.param("dst").store(
    ...         inner, a.param("x").load(inner, i).mul(inner, 2.0), i))
    >>> double = logical.Program(
    ...     name="double4", body=body,
    ...     parameters={"dst": dynamic_buffer(accy.f32), "x": dynamic_buffer(accy.f32)})
    >>> artifact = accy.kernel.create_kernel_call_artifact(
    ...     double, Limits.testing, None, target="accy.custom.double", version=1)
    >>> artifact.registry().require("accy.custom.double", 1).c_signature
    'void accy_kernel_double4(float* p_dst, const float* p_x)'
    """
    _check_key(program, target, version, format)
    launch = program.launch(limits)
    if format == "cuda_ptx" and launch is None:
        raise KernelError(
            f"kernel {program.name!r} (for {target!r}) has no schedule, which CUDA needs; "
            f"call .with_schedule(accy.kernel.logical.schedule.thread_blocks(x=...))"
        )
    what = f"kernel {program.name!r} for custom_call {target!r} (version {version})"
    c_text, cuda_text = program.c_source(), program.cuda_source()
    ptx = cuda_to_ptx(cuda_text, what, arch=arch) if format == "cuda_ptx" else None
    if format == "cpu_object":
        check_c_source(c_text, what)
    traced = program.traced
    call = KernelCall(
        target=target,
        version=version,
        symbol=lower.symbol(program.name),
        kernel_name=lower.symbol(program.name),
        parameters=traced.parameters,
        written=tuple(name for name, _ in traced.writes),
        extents=_touched(traced.reads, traced.writes),
        c_source=c_text,
        cuda_source=cuda_text,
        format=format,
        c_signature=lower.c_signature(traced),
        ptx=ptx,
        block=launch.block if launch else None,
        grid=launch.grid if launch else None,
    )
    return KernelCallArtifact(call, handle)


def _check_key(program: Program, target: str, version: int, format: str) -> None:
    if not isinstance(program, Program):
        raise KernelError(f"create_kernel_call_artifact needs a kernel Program, got {program!r}")
    if format not in FORMATS:
        raise KernelError(f"unknown kernel format {format!r}; use one of {', '.join(FORMATS)}")
    if not isinstance(target, str) or not target:
        raise KernelError(f"kernel {program.name!r}: target must be a non-empty string")
    if not isinstance(version, int) or isinstance(version, bool):
        raise KernelError(f"kernel {program.name!r}: version must be an int, got {version!r}")


def _touched(*accesses: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
    extents: dict[str, int] = {}
    for name, extent in (pair for access in accesses for pair in access):
        extents[name] = max(extents.get(name, 0), extent)
    return tuple(extents.items())
