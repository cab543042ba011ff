"""custom_call on the native CPU: kernels from a registry are linked into the program."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

import accy
import accy.compat
from accy import f32, spec
from accy.compat.lower import FragmentCompilerOptions

SCALE_AND_SHIFT = """
void fake_scale_shift(float *dst, const float *x, const float *shift) {
  for (int i = 0; i < 4; ++i) dst[i] = 3.0f * x[i] + shift[0];
}
"""


@dataclass(frozen=True)
class FakeKernelCall:
    target: str
    version: int
    symbol: str
    parameters: tuple
    c_source: str

    def check_call(self, operand_types, result_type):
        if result_type != spec(f32, lane=4):
            raise accy.AccyError(f"custom_call {self.target!r}: the result must be f32[lane=4]")


class FakeRegistry:
    def __init__(self, *calls):
        self.calls = {(c.target, c.version): c for c in calls}

    def lookup(self, target, version):
        return self.calls.get((target, version))


KERNEL = FakeKernelCall(
    "test.scale_shift",
    2,
    "fake_scale_shift",
    (("dst", f32), ("x", f32), ("shift", f32)),
    SCALE_AND_SHIFT,
)


def program_with_calls():
    result = spec(f32, lane=4)

    def body(b, args):
        x, shift = args
        once = b.custom_call("test.scale_shift", 2, [x.exp(), shift], result)
        twice = b.custom_call("test.scale_shift", 2, [once, shift], result)
        return twice.sum("lane"), once

    return accy.trace.define("custom", [spec(f32, lane=4), spec(f32)], body)


def test_custom_calls_run_the_registered_kernel(native_cpu):
    program = program_with_calls()
    compiled = accy.compile(program, kernel_call_registry=FakeRegistry(KERNEL))
    x, shift = np.array([0, 1, 2, -1], np.float32), np.array(0.5, np.float32)
    total, once = compiled(x, shift)
    np.testing.assert_allclose(once, 3 * np.exp(x) + 0.5, rtol=1e-6)
    np.testing.assert_allclose(total, np.sum(3 * once + 0.5), rtol=1e-6)
    source = accy.backends.cpu.compile_program(program, FakeRegistry(KERNEL)).source
    assert source.count("void fake_scale_shift(") == 1  # included once, called twice


@pytest.mark.parametrize("registry", [None, FakeRegistry()], ids=["no registry", "empty"])
def test_a_call_without_a_kernel_fails_at_compile_time_naming_it(native_cpu, registry):
    options = FragmentCompilerOptions(kernel_call_registry=registry)
    with pytest.raises(accy.AccyError, match="custom_call 'test.scale_shift' version 2 has no"):
        accy.compat.lower.compile_fragment(None, program_with_calls(), options)


def test_the_kernel_checks_the_call(native_cpu):
    def body(b, args):
        return b.custom_call("test.scale_shift", 2, [args[0], args[1]], spec(f32, lane=5))

    program = accy.trace.define("mismatch", [spec(f32, lane=4), spec(f32)], body)
    options = FragmentCompilerOptions(kernel_call_registry=FakeRegistry(KERNEL))
    with pytest.raises(accy.AccyError, match="the result must be f32\\[lane=4\\]"):
        accy.compat.lower.compile_fragment(None, program, options)


def test_a_kernel_that_does_not_compile_is_a_compile_error(native_cpu):
    broken = FakeKernelCall(
        "test.scale_shift", 2, "fake_scale_shift", KERNEL.parameters, "void fake_scale_shift("
    )
    options = FragmentCompilerOptions(kernel_call_registry=FakeRegistry(broken))
    with pytest.raises(accy.CompileError, match="the C compiler rejected"):
        accy.compat.lower.compile_fragment(None, program_with_calls(), options)
