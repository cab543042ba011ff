"""The CPU workspace faulted in while the compiler runs (`accy.backends.cpu.workspace`): the
first executable of a compiled fragment runs on it, later ones allocate their own, and both
compute the same values as NumPy."""

import numpy as np
import pytest

import accy
from accy.backends.cpu import workspace
from accy.backends.cpu.compile import compile_program
from accy.backends.cpu.executable import CpuExecutable


def program():
    # The product is an intermediate (the sum reads it twice), so it lives in the workspace.
    def body(b, a):
        product = a[0].contract(a[1], "k")
        return (product * product).sum("n")

    specs = [accy.spec(accy.f32, m=64, k=32), accy.spec(accy.f32, k=32, n=64)]
    return accy.trace.define("square_sums", specs, body)


@pytest.fixture
def prefault_everything(monkeypatch):
    monkeypatch.setattr(workspace, "PREFAULT_BYTES", 1)


def test_first_executable_takes_the_prefaulted_block(prefault_everything):
    fragment = compile_program(program())
    assert fragment.workspace_bytes > 0 and fragment.workspace is not None
    first = CpuExecutable(fragment)
    second = CpuExecutable(fragment)
    assert fragment.workspace.take() is None  # handed out once, to the first executable
    assert first._workspace is not second._workspace
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 32), np.float32)
    b = rng.standard_normal((32, 64), np.float32)
    expected = ((a @ b) ** 2).sum(1)
    for executable in (first, second):
        (out,) = executable(a, b)
        np.testing.assert_allclose(out, expected, rtol=1e-4)


def test_small_workspaces_are_not_prefaulted():
    assert workspace.prefault(workspace.PREFAULT_BYTES - 1) is None
    block, address = workspace.Prefaulted(workspace.PREFAULT_BYTES).take()
    assert address % 64 == 0 and block.nbytes >= workspace.PREFAULT_BYTES and not block.any()
