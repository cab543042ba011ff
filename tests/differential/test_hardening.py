"""Bad and extreme input on every backend: NaN and infinity, out-of-range indices, empty axes,
extents past 32-bit indexing, malformed program text."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import accy
import accy.compat
from accy import bf16, f16, f32, i32, spec, u8
from accy.trace import define

from ..executors import available_backends
from ..halves import comparable

BACKENDS = [pytest.param(executor, id=name) for name, executor in available_backends()]
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -2.5, 3.0e38], np.float32)


def _ieee_program():
    def body(b, x):
        a, c = x
        return (
            a + c,
            a * c,
            a / c,
            a.max(c),
            a.min(c),
            a.exp(),
            a.tanh(),
            a.abs(),
            a.sqrt(),
            a.log(),
            (a > c).convert(f32),
            a.sum("n"),
            a.max("n"),
        )

    return define("ieee", [spec(f32, n=8), spec(f32, n=8)], body)


def _numpy_ieee(a, c):
    with np.errstate(all="ignore"):
        return [
            a + c,
            a * c,
            a / c,
            np.maximum(a, c),
            np.minimum(a, c),
            np.exp(a),
            np.tanh(a),
            np.abs(a),
            np.sqrt(a),
            np.log(a),
            (a > c).astype(np.float32),
            np.sum(a, dtype=np.float32),
            np.max(a),
        ]


@pytest.mark.parametrize("executor", BACKENDS)
def test_nan_and_infinity_propagate_as_ieee_says(executor):
    a = SPECIAL
    c = np.roll(SPECIAL, 3)
    got = executor(_ieee_program(), [a, c])
    for value, expected in zip(got, _numpy_ieee(a, c), strict=True):
        np.testing.assert_array_equal(np.isnan(value), np.isnan(expected))
        finite = ~np.isnan(expected)
        np.testing.assert_allclose(
            np.asarray(value)[finite], np.asarray(expected)[finite], rtol=1e-6
        )


@pytest.mark.parametrize("executor", BACKENDS)
def test_out_of_range_indices_are_clamped_never_read_out_of_bounds(executor):
    def body(b, x):
        table, ids = x
        return table.gather(ids, "vocab"), table.scatter_add(
            ids, table.gather(ids, "vocab"), "vocab"
        )

    program = define("clamp", [spec(f32, vocab=3, c=2), spec(i32, token=4)], body)
    table = np.arange(6, dtype=np.float32).reshape(3, 2)
    ids = np.array([-7, 0, 2, 2_000_000_000], np.int32)
    gathered, scattered = executor(program, [table, ids])
    np.testing.assert_array_equal(gathered, table[[0, 0, 2, 2]])
    expected = table.copy()
    np.add.at(expected, [0, 0, 2, 2], table[[0, 0, 2, 2]])
    np.testing.assert_array_equal(scattered, expected)


@pytest.mark.parametrize("executor", BACKENDS)
def test_empty_axes_give_empty_results_and_identity_reductions(executor):
    def body(b, x):
        (a,) = x
        return a * 2.0, a.sum("empty"), a.max("empty"), a.contract(a, "empty")

    program = define("empty", [spec(f32, empty=0, n=3)], body)
    doubled, total, peak, product = executor(program, [np.zeros((0, 3), np.float32)])
    assert doubled.shape == (0, 3)
    np.testing.assert_array_equal(total, [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(peak, [-np.inf, -np.inf, -np.inf])
    np.testing.assert_array_equal(product, [0.0, 0.0, 0.0])  # n is a batch axis


@pytest.mark.parametrize("executor", BACKENDS)
def test_concatenating_empty_pieces_gives_an_empty_result(executor):
    # Found by the differential property: no piece left for the generated selection to read.
    def body(b, x):
        (a,) = x
        empty = a.slice("n", 0, 0).rename("n", "m")
        return b.concatenate([empty, empty.cos()], "m") + 0.0, (a * 2.0).sum()

    program = define("empty_pieces", [spec(f32, n=1)], body)
    joined, total = executor(program, [np.array([1.5], np.float32)])
    assert joined.shape == (0,)
    np.testing.assert_array_equal(total, 3.0)


def test_types_too_large_for_64_bit_byte_offsets_are_refused():
    with pytest.raises(accy.AxisError, match="too large"):
        spec(f32, a=2**40, b=2**30)


def test_extents_past_32_bit_indexing_use_64_bit_loops():
    # Three billion bytes: built and compiled, not run (CI has no room for it).
    huge = 3_000_000_000
    program = define("huge", [spec(u8, n=huge)], lambda b, x: x[0] + x[0])
    try:
        accy.backends.cpu.find_compiler()
    except accy.RuntimeUnavailable:
        pytest.skip("native CPU backend: no C compiler")
    source = accy.backends.cpu.source.translation_unit(accy.lower.build_plan(program))
    assert str(huge) in source
    counters = re.findall(r"for \((\w+) ", source)
    assert counters and set(counters) == {"int64_t"}
    accy.compile(program, device="cpu")  # the C compiles; running it would need 6 GB


@pytest.mark.parametrize(
    "text",
    [
        "program p { return %0 }",
        "program p { %0 = parameter() {index=0} : f32[n=2] %1 = mul(%0, %0) : f32[n=3] return %1 }",
        "program p { %0 = parameter() {index=0} : f32[n=2147483648000000000000] return %0 }",
        "program p {",
        "\x00\x01",
    ],
)
def test_malformed_program_text_is_a_parse_error_with_a_position(text):
    with pytest.raises(accy.ParseError, match=r"line \d+, column \d+"):
        accy.core.parse(text)


NO_BUFFERS_SCRIPT = """
import numpy as np
import accy
import accy.compat
from accy import f32, spec
from accy.trace import define

nothing = define("nothing", [], lambda b, x: ())
assert accy.compile(nothing, device="cpu")() == []
artifact = accy.compat.lower.compile_fragment(None, nothing)
fragment = accy.compat.executable.load_fragment(None, artifact)
accy.compat.executable.invoke(fragment, [], [])
constant = define("constant", [], lambda b, x: b.scalar(f32, 2.5) * 2.0)
(four,) = accy.compile(constant, device="cpu")()
assert four.shape == () and four == np.float32(5.0), four
sink = define("sink", [spec(f32, n=3)], lambda b, x: ())
assert accy.compile(sink, device="cpu")(np.ones(3, np.float32)) == []
print("ok")
"""


@pytest.mark.slow
def test_programs_without_inputs_or_outputs_run_on_the_cpu():
    # In a process of its own: the defect was a segmentation fault, which would end pytest.
    try:
        accy.backends.cpu.find_compiler()
    except accy.RuntimeUnavailable:
        pytest.skip("native CPU backend: no C compiler")
    source_root = os.path.dirname(os.path.dirname(accy.__file__))
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([source_root, *sys.path])}
    result = subprocess.run(
        [sys.executable, "-c", NO_BUFFERS_SCRIPT],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", (
        f"exit status {result.returncode}\n{result.stderr}"
    )


def _long_chain(v, a, c, steps, tanh):
    for i in range(steps):
        v = tanh(v * a) if i % 4 == 0 else v * a + c
    return v


@functools.cache
def _long_chain_program(steps: int):
    return define(
        "long_chain", [spec(f32, n=6)] * 3, lambda b, x: _long_chain(*x, steps, lambda y: y.tanh())
    )


@pytest.mark.slow
@pytest.mark.parametrize("executor", BACKENDS)
def test_a_chain_of_ten_thousand_elementwise_operations_runs(executor):
    # Lowering and code generation walk expressions recursively: fusion bounds their depth.
    steps = 5_000  # ten thousand operations, far deeper than Python's recursion limit
    program = _long_chain_program(steps)
    assert len(program.operations) > 10_000
    x = np.linspace(-2, 2, 6, dtype=np.float32)
    a = np.linspace(0.9, 1.01, 6, dtype=np.float32)
    c = np.full(6, 0.01, np.float32)
    (got,) = executor(program, [x, a, c])
    np.testing.assert_allclose(got, _long_chain(x, a, c, steps, np.tanh), rtol=1e-4, atol=1e-6)


@functools.cache
def _scan_gradient(steps: int):
    def step(_, values):
        weight, carry, x = values
        new = (carry * weight + x).tanh()
        return new, new

    def body(b, args):
        weight, h0, xs = args
        (final,), _ = b.scan(step, consts=[weight], carries=[h0], xs=[xs], axis="time")
        return final.sum("h")

    types = [spec(f32, h=2), spec(f32, h=2), spec(f32, time=steps, h=2)]
    return accy.grad(define("long_scan", types, body), wrt=(0, 1))


@pytest.mark.parametrize("executor", BACKENDS)
def test_the_gradient_of_a_scan_of_three_hundred_steps_runs(executor):
    # The gradient unrolls the scan: a program of thousands of operations, one long chain.
    steps = 300
    rng = np.random.default_rng(7)
    weight = rng.uniform(0.5, 0.9, 2).astype(np.float32)
    h0 = rng.uniform(-1, 1, 2).astype(np.float32)
    xs = rng.uniform(-0.5, 0.5, (steps, 2)).astype(np.float32)
    d_weight, d_h0 = executor(_scan_gradient(steps), [weight, h0, xs])
    hs = [h0.astype(np.float64)]
    for x in xs:
        hs.append(np.tanh(hs[-1] * weight + x))
    carry, expected_weight = np.ones(2), np.zeros(2)
    for t in reversed(range(steps)):
        local = carry * (1 - hs[t + 1] ** 2)
        expected_weight += local * hs[t]
        carry = local * weight
    np.testing.assert_allclose(d_weight, expected_weight, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(d_h0, carry, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("executor", BACKENDS)
@pytest.mark.parametrize(
    ("dtype", "held", "scale"),
    [(f16, np.float16, -1e9), (f16, np.float16, 70000.0), (f32, np.float32, 1e39)]
    + [(bf16, ml_dtypes.bfloat16, 1e39), (bf16, ml_dtypes.bfloat16, -3.4e38)],
)
def test_float_constants_beyond_their_dtype_round_to_infinity(executor, dtype, held, scale):
    def body(b, x):
        (a,) = x
        table = b.constant([scale, 1.0, -scale], spec(dtype, n=3))
        return a * scale, a * table, a + scale

    program = define("beyond_range", [spec(dtype, n=3)], body)
    a = np.array([1.0, -2.0, 0.0], held)
    with np.errstate(over="ignore", invalid="ignore"):
        # bf16's largest finite value is below float32's: 3.4e38 rounds up to infinity in it.
        constant = held(np.sign(scale) * np.inf) if dtype == bf16 else held(scale)
        table = np.array([constant, 1, -constant], held)
        expected = [a * constant, a * table, a + constant]
    assert np.isinf(constant)
    for got, want in zip(executor(program, [a]), expected, strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(comparable(got), comparable(want))


def empty_scatter_program(dtype):
    """scatter_add into tables with an empty leading axis: the scattered one, then another."""

    def body(b, x):
        table, ids, updates, wide, wide_updates = x
        return table.scatter_add(ids, updates, "vocab"), wide.scatter_add(
            ids, wide_updates, "vocab"
        )

    types = [spec(dtype, vocab=0, c=2), spec(i32, token=3), spec(dtype, token=3, c=2)]
    types += [spec(dtype, c=0, vocab=4), spec(dtype, c=0, token=3)]
    return define(f"empty_scatter_{dtype}", types, body)


@pytest.mark.parametrize("executor", BACKENDS)
@pytest.mark.parametrize("dtype", [f32, f16, bf16, i32])
def test_scatter_add_into_an_empty_leading_axis_gives_an_empty_result(executor, dtype):
    held = dtype.numpy
    table = np.zeros((0, 2), held)
    ids = np.array([0, 5, -1], np.int32)
    updates = np.ones((3, 2), held)
    wide, wide_updates = np.zeros((0, 4), held), np.zeros((0, 3), held)
    expected = wide.copy()
    np.add.at(expected, (slice(None), np.clip(ids, 0, 3)), wide_updates)
    got = executor(empty_scatter_program(dtype), [table, ids, updates, wide, wide_updates])
    assert got[0].shape == (0, 2) and got[0].dtype == table.dtype
    assert got[1].shape == expected.shape and got[1].dtype == expected.dtype
