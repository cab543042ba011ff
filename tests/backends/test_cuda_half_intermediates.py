"""bf16/f16 on CUDA: the values of one fused expression stay in float32 registers and round to
16 bits where they are stored, converted or compared (`Dialect.rounds_each_half_operation`);
the CPU rounds after every operation, as the reference does."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

import accy
from accy import bf16, f32, spec
from accy.backends.cuda import compile_program
from accy.codegen.c.dialect import CUDA, GCC

from ..executors import cuda_device_or_skip, native_cuda
from ..halves import composed_gelu_tanh


def _gelu(dtype, n=4099):
    return accy.trace.define("gelu", [spec(dtype, n=n)], lambda b, a: composed_gelu_tanh(a[0]))


def _kernel_bodies(source: str) -> str:
    return source.split('extern "C"', 1)[1]


def test_the_dialects_say_where_half_values_round():
    assert GCC.rounds_each_half_operation and not CUDA.rounds_each_half_operation


def test_a_fused_bf16_expression_rounds_only_where_it_is_stored():
    body = _kernel_bodies(compile_program(_gelu(bf16)).source)
    assert "tanhf(" in body
    assert "accy_round_bf16(" not in body
    assert "accy_bf16_store(" in body


def test_an_explicit_convert_and_a_comparison_still_round():
    def body(b, a):
        rounded = (a[0] * 3.0).convert(bf16).convert(f32)  # f32 -> bf16 -> f32
        return rounded, (a[1] * 3.0).max("n")

    program = accy.trace.define("c", [spec(f32, n=64), spec(bf16, n=64)], body)
    gradient = accy.grad(
        accy.trace.define("m", [spec(bf16, n=64)], lambda b, a: (a[0] * 3.0).max("n")), wrt=(0,)
    )
    source = _kernel_bodies(compile_program(program).source)
    assert re.search(r"accy_round_bf16\(\(float\)", source)  # the convert to bf16
    comparisons = _kernel_bodies(compile_program(gradient).source)
    assert re.search(r"accy_round_bf16\([^;]*\) == accy_round_bf16\(", comparisons)


# On a GPU ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu():
    return cuda_device_or_skip()


def test_gelu_in_bf16_is_within_one_rounding_of_the_exact_value(gpu):
    program = _gelu(bf16)
    x = np.linspace(-6, 6, 4099).astype(ml_dtypes.bfloat16)
    (got,) = native_cuda(program, [x])
    # The program's constants are bf16: 0.044715 and sqrt(2/pi) rounded.
    cubic, slope = (float(ml_dtypes.bfloat16(c)) for c in (0.044715, np.sqrt(2 / np.pi)))
    exact = x.astype(np.float64)
    exact = 0.5 * exact * (1 + np.tanh(slope * (exact + cubic * exact**3)))
    error = np.abs(got.astype(np.float64) - exact)
    # One rounding to bf16 (half a unit in the last place: 2^-9 relative), and the float32
    # arithmetic before it: 1 + tanh(u) for very negative u is float32's 2^-24 absolute error
    # of tanh, times x / 2.
    bound = 2.0**-8 * np.abs(exact) + 2.0**-22 * np.abs(x.astype(np.float64))
    assert np.all(error <= bound)
    (reference,) = accy.reference.run(program, [x])
    reference_error = np.abs(reference.astype(np.float64) - exact)
    assert error.mean() <= reference_error.mean()


def test_the_gradient_of_a_maximum_of_a_fused_bf16_expression_picks_the_maximum(gpu):
    loss = accy.trace.define("m", [spec(bf16, n=257)], lambda b, a: (a[0] * 3.0 + 1.0).max("n"))
    gradient = accy.grad(loss, wrt=(0,))
    rng = np.random.default_rng(3)
    x = rng.permutation(np.linspace(-2, 2, 257)).astype(ml_dtypes.bfloat16)
    (got,) = native_cuda(gradient, [x])
    (want,) = accy.reference.run(gradient, [x])
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
    assert got.astype(np.float32).sum() == 3.0
