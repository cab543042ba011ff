"""Fixtures of the kernel tests: every catalog kernel built once, and compiled into one library."""

from __future__ import annotations

import pytest

from accy.kernel import KernelCall
from accy.kernel.cpu import CpuLibrary

from .catalog import CASES

# The device-state handle is opaque to accy.kernel: any object will do.
HANDLE = object()


@pytest.fixture(scope="session")
def catalog_calls() -> dict[str, KernelCall]:
    """Each catalog kernel built as a "cpu_object" artifact for target `test.<name>`."""
    return {
        case.name: case.program.create_kernel_call_artifact(
            case.limits, HANDLE, target=f"test.{case.name}", version=1, format="cpu_object"
        ).call
        for case in CASES
    }


@pytest.fixture(scope="session")
def catalog_library(catalog_calls) -> CpuLibrary:
    """All catalog kernels in one translation unit, as the CPU backend would include them."""
    return CpuLibrary(catalog_calls.values())
