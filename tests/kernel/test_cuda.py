"""The CUDA side: every kernel's CUDA C through `nvcc -ptx` (so CI, which has nvcc and no GPU,
fails on a syntax error in generated CUDA), and, where a GPU is present, the PTX run against
NumPy like the C.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import accy
from accy.kernel import Limits, lower, toolchain
from accy.kernel.examples import CUSTOM_DOUBLE_TARGET, custom_double_kernel

from ..executors import needs_nvcc
from ..halves import comparable
from .catalog import CASES, Case, conversion_programs
from .cuda_driver import Driver, DriverUnavailable


def _every_kernel_source() -> str:
    programs = [case.program for case in CASES] + conversion_programs()
    return "".join(program.cuda_source() for program in programs)


@pytest.mark.slow
@needs_nvcc
def test_every_test_kernel_compiles_to_ptx_with_nvcc():
    # One translation unit for all of them: also checks that kernels can share one.
    ptx = toolchain.ptx_with_nvcc(_every_kernel_source(), "the kernel tests' CUDA C")
    for case in CASES:
        assert f".entry {lower.symbol(case.name)}(" in ptx


@needs_nvcc
def test_the_seeds_double_kernel_builds_as_cuda_ptx():
    artifact = custom_double_kernel().create_kernel_call_artifact(
        Limits.testing, "handle", target=CUSTOM_DOUBLE_TARGET, version=1, format="cuda_ptx"
    )
    call = artifact.registry().require(CUSTOM_DOUBLE_TARGET, 1)
    assert ".visible .entry accy_kernel_accy_custom_double_4_f32(" in call.ptx
    assert (call.kernel_name, call.block, call.grid) == (
        "accy_kernel_accy_custom_double_4_f32",
        (4, 1, 1),
        (1, 1, 1),
    )
    assert call.format == "cuda_ptx" and artifact.handle == "handle"


@needs_nvcc
def test_cuda_c_that_does_not_compile_names_the_source():
    with pytest.raises(accy.CompileError, match=r"kernel 'broken'.*source kept at .*\.cu"):
        toolchain.ptx_with_nvcc("__global__ void broken() { return 1 }", "kernel 'broken'")


# ---------------------------------------------------------------------------------------------
# on a GPU


@pytest.fixture(scope="module")
def gpu_module():
    """The driver and one module holding every catalog kernel, or a skip naming the cause."""
    if toolchain.nvcc() is None:
        pytest.skip("cuda gate: nvcc is not on PATH, so there is no PTX to run")
    try:
        driver = Driver()
        module = driver.load(toolchain.cuda_to_ptx(_every_kernel_source(), "catalog"))
    except DriverUnavailable as error:
        pytest.skip(f"cuda gate: cuda_device_missing ({error})")
    return driver, module


def test_every_kernel_matches_numpy_on_a_gpu(gpu_module):
    driver, module = gpu_module
    failures = [failure for case in CASES if (failure := _mismatch_on_gpu(driver, module, case))]
    assert not failures, f"{len(failures)} kernels differ on the GPU:\n" + "\n".join(failures)


def _mismatch_on_gpu(driver: Driver, module, case: Case) -> str | None:
    # The launch dimensions come from the build; the code, from the module of all kernels
    # (one nvcc run rather than one per kernel).
    call = case.program.create_kernel_call_artifact(
        case.limits, None, target=f"test.{case.name}", version=1, format="cpu_object"
    ).call
    inputs = case.inputs(np.random.default_rng(zlib.crc32(case.name.encode())))
    got = driver.run(module, call, inputs)
    with np.errstate(all="ignore"):
        expected = np.asarray(case.expected(*inputs)).reshape(-1)
    got, expected = comparable(got), comparable(expected)  # bf16 NaN == NaN, as for floats
    try:
        if case.tolerance:
            np.testing.assert_allclose(got, expected, rtol=case.tolerance, atol=case.tolerance)
        else:
            np.testing.assert_array_equal(got, expected)
    except AssertionError as error:
        return f"{case.name}: {str(error).strip()[:600]}"
    return None


@pytest.mark.parametrize("package", list(toolchain.NVRTC_COMPILERS))
def test_nvrtc_compiles_the_double_kernel(package):
    compile_with_nvrtc = toolchain.NVRTC_COMPILERS[package]
    try:
        # An explicit architecture: without one, cuda.core asks the (maybe absent) device.
        ptx = compile_with_nvrtc(custom_double_kernel().cuda_source(), "compute_75")
    except ImportError:
        pytest.skip(f"cuda gate: {package} is not importable, so NVRTC through it is not tried")
    assert ".entry accy_kernel_accy_custom_double_4_f32(" in ptx
    assert ".target sm_75" in ptx
