"""Compiling a traced kernel into the `KernelCall` of one custom-call target.

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
from .ir import Launch, TracedKernel
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


def compile_kernel_call(
    traced: TracedKernel,
    launch: Launch | None,
    *,
    target: str,
    version: int,
    format: str,
    arch: str | None,
) -> KernelCall:
    """Lower and compile a traced kernel as the implementation of custom call
    `(target, version)` in `format` (see `Program.create_kernel_call_artifact`)."""
    _check_key(traced.name, target, version, format)
    if format == "cuda_ptx" and launch is None:
        raise KernelError(
            f"kernel {traced.name!r} (for {target!r}) has no schedule, which CUDA needs; "
            f"call .with_schedule(accy.kernel.logical.schedule.thread_blocks(x=...))"
        )
    what = f"kernel {traced.name!r} for custom_call {target!r} (version {version})"
    c_text, cuda_text = lower.c_source(traced), lower.cuda_source(traced)
    ptx = cuda_to_ptx(cuda_text, what, arch=arch) if format == "cuda_ptx" else None
    if format == "cpu_object":
        check_c_source(c_text, what)
    return KernelCall(
        target=target,
        version=version,
        symbol=lower.symbol(traced.name),
        kernel_name=lower.symbol(traced.name),
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


def _check_key(kernel: str, target: str, version: int, format: str) -> None:
    if format not in FORMATS:
        raise KernelError(f"unknown kernel format {format!r}; use one of {', '.join(FORMATS)}")
    if not isinstance(target, str) or not target:
        raise KernelError(f"kernel {kernel!r}: target must be a non-empty string")
    if not isinstance(version, int) or isinstance(version, bool):
        raise KernelError(f"kernel {kernel!r}: version must be an int, got {version!r}")


def _touched(*accesses: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
    extents: dict[str, int] = {}
    for name, extent in (pair for access in accesses for pair in access):
        extents[name] = max(extents.get(name, 0), extent)
    return tuple(extents.items())
