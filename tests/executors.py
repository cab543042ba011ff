"""Ways to execute a Program in tests, so one test body runs on every available backend.

An executor takes (program, list of NumPy inputs) and returns a list of NumPy outputs.
"""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy.backends.cuda.device import open_device, platform_supported
from accy.kernel import toolchain


def reference(program, inputs):
    return accy.reference.run(program, inputs)


def native_cpu(program, inputs):
    """The native CPU backend (generated C); skips when no C compiler is present."""
    try:
        accy.backends.cpu.find_compiler()
    except accy.RuntimeUnavailable:
        pytest.skip("native CPU backend: no C compiler")
    return accy.compile(program, device="cpu")(*inputs)


def native_cuda(program, inputs):
    """The CUDA backend (NVRTC kernels, cuBLAS, one graph launch); skips naming the closed gate."""
    cuda_device_or_skip()
    import cupy

    return [cupy.asnumpy(out) for out in accy.compile(program, device="cuda")(*inputs)]


def run_fragment(compiled, inputs):
    """Run a CUDA `CompiledFragment` on the GPU as it is (no executable cache: the schedule is
    the one given, e.g. compiled with a switch patched)."""
    import cupy

    from accy.backends.cuda.runtime import load

    program = compiled.program
    arguments = [cupy.asarray(x) for x in inputs]
    outputs = [cupy.empty(t.extents, t.dtype.numpy) for t in program.output_types]
    fragment = load(compiled)
    fragment.run([int(a.data.ptr) for a in arguments + outputs])
    cupy.cuda.get_current_stream().synchronize()
    return [cupy.asnumpy(o) for o in outputs]


EXECUTORS = [
    pytest.param(reference, id="reference"),
    pytest.param(native_cpu, id="native_cpu"),
    pytest.param(native_cuda, id="native_cuda"),
]


def available_backends():
    """(name, executor) for every backend this machine can run, the reference first."""
    backends = [("reference", reference)]
    try:
        accy.backends.cpu.find_compiler()
        backends.append(("native_cpu", native_cpu))
    except accy.RuntimeUnavailable:
        pass
    if cuda_gate() is None:
        backends.append(("native_cuda", native_cuda))
    return backends


def cuda_gate() -> str | None:
    """Why CUDA tests cannot run here (what is missing), or None when they can."""
    if not platform_supported():
        return "cuda gate: no CuPy or no CUDA driver library on this platform"
    try:
        open_device(0)
    except accy.RuntimeUnavailable as error:
        return f"cuda gate: device missing ({error})"
    return None


def cuda_device_or_skip() -> int:
    """The ordinal of the GPU the tests run on (opened), or a skip whose reason says what is
    missing."""
    reason = cuda_gate()
    if reason is not None:
        pytest.skip(reason)
    return 0


__all__ = ["EXECUTORS", "available_backends", "cuda_device_or_skip", "cuda_gate", "np"]


needs_nvcc = pytest.mark.skipif(
    toolchain.nvcc() is None, reason="cuda gate: nvcc is not on PATH (nor in $CUDA_HOME/bin)"
)
"""Marks a test that compiles generated CUDA with nvcc (no GPU needed)."""
