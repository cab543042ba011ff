"""Ways to execute a Program in tests, so one test body runs on every available backend.

An executor takes (program, list of NumPy inputs) and returns a list of NumPy outputs.
"""

from __future__ import annotations

import numpy as np
import pytest

import accy


def reference(program, inputs):
    return accy.reference.run(program, inputs)


def native_cpu(program, inputs):
    """The native CPU backend (generated C); skips when no C compiler is present."""
    try:
        accy.backends.cpu.find_compiler()
    except accy.RuntimeUnavailable:
        pytest.skip("native CPU backend: no C compiler")
    arrays = [
        accy.reference.as_input_array(x, t, f"input {i}")
        for i, (x, t) in enumerate(zip(inputs, program.parameter_types, strict=True))
    ]
    return accy.compile(program, device="cpu")(*arrays)


EXECUTORS = [
    pytest.param(reference, id="reference"),
    pytest.param(native_cpu, id="native_cpu"),
]


def available_backends():
    """(name, executor) for every backend this machine can run, the reference first."""
    backends = [("reference", reference)]
    try:
        accy.backends.cpu.find_compiler()
        backends.append(("native_cpu", native_cpu))
    except accy.RuntimeUnavailable:
        pass
    return backends


def cuda_device_or_skip():
    """The CUDA device state, or a skip whose reason names the gate that is closed."""
    gpu = getattr(accy, "gpu", None)
    cuda = getattr(gpu, "cuda", None) if gpu is not None else None
    if cuda is None:
        pytest.skip("cuda gate: build flag disabled (accy has no CUDA backend in this build)")
    if not cuda.platform_supported():
        pytest.skip("cuda gate: unsupported platform (no CUDA driver or CuPy)")
    try:
        return cuda.State.init_device(0)
    except accy.RuntimeUnavailable as error:
        pytest.skip(f"cuda gate: device missing ({error})")


__all__ = ["EXECUTORS", "available_backends", "cuda_device_or_skip", "np"]
