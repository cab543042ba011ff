"""CUDA C compiled by NVRTC into device binaries, kept in accy's disk cache, and loaded.

`module(source, options, ordinal)` is the one way accy turns CUDA C into a loaded module: the
generated kernels' translation units, the custom kernels whose PTX the driver cannot load, and
the helper kernels of the library steps (cuDNN attention, FP8 scaling). The binary (a cubin for
the device's architecture, or PTX where this NVRTC cannot write one) is an entry of the disk
cache's "cuda-binary" namespace (`accy.codegen.cache`: its trust check, locks and size bound),
keyed on the source, the options, the architecture, and the NVRTC and driver versions. A warm
start therefore loads every binary without starting NVRTC at all; CuPy's own cache would compile
an empty program first, once per set of options and thread, to learn NVRTC's build (about 0.3 s
of a warm first step on an H200 host).

NVRTC is thread-safe and CuPy's binding releases the GIL while it compiles, so the
translation units of one program are compiled in parallel threads (`runtime.KernelsLoading`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ...caches import memoized
from ...codegen.cache import Cache, key
from ...errors import CompileError
from ...kernel.toolchain import nvrtc_through_cupy

CACHE = Cache("cuda-binary", suffix=".bin")
# Flush f32 denormals to zero: what CuPy's `RawModule` adds to every NVRTC compile, and so the
# options under which the CUDA backend's results were validated against the reference.
ALWAYS = ("-ftz=true",)
MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CUfunction_attribute's CU_FUNC_ATTRIBUTE_... of that name


def module(
    source: str,
    options: Sequence[str] = (),
    ordinal: int = 0,
    compiling: Callable[[], None] | None = None,
) -> Any:
    """`source` compiled by NVRTC with `options` for GPU `ordinal` (read from the disk cache
    when this machine compiled it before) and loaded in the current context: a CuPy
    `cupy.cuda.function.Module`, whose `get_function(name)` is a kernel. `compiling()`, if
    given, is called just before NVRTC starts (not at all on a cache hit). Raises CompileError
    with NVRTC's log when the source does not compile.

    >>> from accy.backends.devices import gpu_count
    >>> if gpu_count():
    ...     nop = module('extern "C" __global__ void nop() {}').get_function("nop")
    """
    import cupy

    architecture, binary_kind, versions = target(ordinal)
    flags = (*options, *ALWAYS, f"-arch={architecture}")
    entry = key("cuda binary", source, *flags, versions)

    def write(output: Path) -> None:
        if compiling is not None:
            compiling()
        output.write_bytes(compile(source, flags, binary_kind))

    path = CACHE.build(entry, write)
    loaded = cupy.cuda.function.Module()
    loaded.load(path.read_bytes())
    return loaded


def allow_dynamic_shared_memory(kernel: Any, size: int) -> None:
    """Let `kernel` (a function of a `module`) launch with `size` bytes of dynamic shared
    memory: above 48 KiB a launch fails unless its function allows that much first."""
    from cupy.cuda import driver

    driver.funcSetAttribute(kernel.ptr, MAX_DYNAMIC_SHARED_SIZE_BYTES, size)


@memoized("cuda binary targets")
def target(ordinal: int) -> tuple[str, str, str]:
    """What NVRTC compiles for GPU `ordinal`: its `-arch` (the GPU's own architecture, or the
    newest this NVRTC knows where the GPU is newer: PTX, which the driver compiles), "cubin" or
    "ptx", and the NVRTC and driver versions (part of every key)."""
    from cupy_backends.cuda.api import runtime
    from cupy_backends.cuda.libs import nvrtc

    properties = runtime.getDeviceProperties(ordinal)
    capability = 10 * properties["major"] + properties["minor"]
    newest = max(getattr(nvrtc, "getSupportedArchs", lambda: (capability,))())
    major, minor = nvrtc.getVersion()
    versions = f"nvrtc {major}.{minor}, driver {runtime.driverGetVersion()}"
    if capability <= newest:
        return f"sm_{capability}", "cubin", versions
    return f"compute_{newest}", "ptx", versions


def compile(source: str, flags: Sequence[str], binary_kind: str) -> bytes:
    """NVRTC's cubin (or PTX) of `source` under `flags`; CompileError with its log if it fails."""
    try:
        return nvrtc_through_cupy(source, flags, binary_kind)
    except RuntimeError as error:
        raise CompileError(
            f"NVRTC failed to compile accy's CUDA C; this is a bug in accy: {error}"
        ) from None
