"""Array constants: held as one read-only NumPy array (hashed by content), printed exactly
(a list of literals when small, base64 bytes when large), placed as data by the backends, and
cheap to trace and differentiate whatever their size."""

from __future__ import annotations

import time

import numpy as np
import pytest

import accy
from accy import bf16, bool_, f16, f32, f64, i32, i64, spec, u8
from accy.core.arrays import LIST_LIMIT, ConstantArray

from ..conftest import _checking

DTYPES = [f32, f64, f16, bf16, i32, i64, u8, bool_]


def _values(dtype, n, rng):
    if dtype == bool_:
        return rng.random(n) > 0.5
    if dtype.is_float:
        values = rng.standard_normal(n) * 1e3
        values[:4] = [np.inf, -np.inf, -0.0, 1e-30][: min(4, n)]
        return values
    info = np.iinfo(dtype.numpy)
    return rng.integers(info.min, info.max, n, dtype=dtype.numpy, endpoint=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [3, LIST_LIMIT + 1, 1000])
def test_constants_print_and_parse_back_bit_exactly(dtype, n, rng):
    values = _values(dtype, n, rng)
    program = accy.trace.define("c", [], lambda b, a: b.constant(values, spec(dtype, n=n)))
    text = str(program)
    assert ('base64"' in text) == (n > LIST_LIMIT)
    parsed = accy.core.parse(text)
    assert str(parsed) == text
    (expected,) = accy.reference.run(program, [])
    (got,) = accy.reference.run(parsed, [])
    assert got.dtype == expected.dtype and got.tobytes() == expected.tobytes()


def test_small_float_constants_print_their_shortest_exact_decimal():
    program = accy.trace.define("c", [], lambda b, a: b.constant([0.1, 1.5, 1e-30], spec(f32, n=3)))
    assert "{value=[0.1, 1.5, 1e-30]}" in str(program)


def test_a_constant_is_a_read_only_copy_compared_by_content():
    values = np.arange(6, dtype=np.float32)
    held = ConstantArray.of(values, f32, (2, 3))
    values[0] = 99.0  # the caller's array is not the constant's
    assert held.array[0, 0] == 0.0 and not held.array.flags.writeable
    with pytest.raises(ValueError):
        held.array[0, 0] = 1.0
    assert held == ConstantArray.of(np.arange(6).reshape(2, 3), f32, (2, 3))
    assert held != ConstantArray.of(np.arange(6).reshape(2, 3), f64, (2, 3))
    assert len({held, ConstantArray.of(np.arange(6), f32, (2, 3))}) == 1


def test_the_reference_hands_out_a_writable_copy():
    program = accy.trace.define("c", [], lambda b, a: b.constant([1, 2], spec(i32, n=2)))
    (first,) = accy.reference.run(program, [])
    first[0] = 5
    assert accy.reference.run(program, [])[0].tolist() == [1, 2]


@pytest.mark.parametrize(
    "values, dtype, message",
    [
        ([1.5], i32, "1.5 is not an integer but the dtype is i32"),
        ([300], u8, r"constant values \[300, 300\] do not fit in u8"),
        ([np.nan], i64, "is not an integer"),
        (["a"], f32, None),
    ],
)
def test_bad_constant_values_are_refused(values, dtype, message):
    with pytest.raises((accy.DTypeError, ValueError), match=message):
        accy.trace.define("c", [], lambda b, a: b.constant(values, spec(dtype, n=1)))


@pytest.mark.parametrize(
    "attribute, message",
    [
        ('base64"AAAA"', "3 bytes given for f32"),
        ('base64"A"', "Incorrect padding|Invalid base64"),
        ('[1.0, "x"]', "a constant's values are numbers"),
        ("[1.0, 2.0, 3.0]", "3 values given for shape"),
    ],
)
def test_malformed_constant_text_is_a_parse_error(attribute, message):
    text = f"program p {{\n  %0 = constant() {{value={attribute}}} : f32[n=2]\n  return %0\n}}\n"
    with pytest.raises(accy.ParseError, match=message):
        accy.core.parse(text)


def _masked_loss(tokens):
    rows, cols = np.indices((tokens, tokens))
    mask = np.where(cols <= rows, 0.0, -1e9).astype(np.float32)
    t = spec(f32, token=tokens, key=tokens)

    def body(b, a):
        scores = a[0] + b.constant(mask, t)
        return accy.nn.softmax(scores, "key").sum()

    return accy.trace.define("masked", [t], body)


def test_tracing_and_differentiating_a_large_constant_costs_what_a_small_one_does():
    def cost(tokens):
        # Timed without the conftest's print -> parse -> print of every built program.
        _checking.active = True
        try:
            start = time.perf_counter()
            accy.value_and_grad(_masked_loss(tokens))
            return time.perf_counter() - start
        finally:
            _checking.active = False

    cost(16)  # warm: imports, caches
    small, large = min(cost(16) for _ in range(3)), min(cost(1024) for _ in range(3))
    # A million-element mask: one array copy and one hash, never a Python call per element.
    assert large < small + 0.25, (small, large)


def test_large_constants_are_data_in_the_cpu_library_not_c_literals():
    from accy.backends.cpu.compile import compile_program

    compiled = compile_program(_masked_loss(64))
    (name,) = compiled.data
    assert f'.incbin \\"{name}\\"' in compiled.source
    assert len(compiled.source) < 20_000  # 4096 literals would be more than that alone
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    got = accy.compile(_masked_loss(64), device="cpu")(x)[0]
    np.testing.assert_allclose(got, accy.reference.run(_masked_loss(64), [x])[0], rtol=1e-5)


def test_large_constants_are_uploaded_into_the_cuda_workspace_below_scratch():
    from accy.backends.cuda import compile_program

    compiled = compile_program(_masked_loss(64))
    ((offset, data),) = compiled.constants
    assert data.dtype == np.float32 and data.shape == (64, 64)
    assert compiled.plan.workspace_bytes <= offset < offset + data.nbytes <= compiled.scratch_offset
    assert f"(scratch - {compiled.scratch_offset - offset})" in compiled.source
    assert len(compiled.source) < 40_000
