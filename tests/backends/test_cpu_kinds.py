"""Every kind on the native CPU backend against the reference evaluator: every program of the
shared catalog (`kind_programs`, which the CUDA tests run too), and the CPU's own concerns
(templates, threads, row bands of a large scatter, an empty contraction).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import accy
from accy import bf16, f32, i32, spec
from accy.codegen.c import templates
from accy.core.kinds.elementwise import BINARY, UNARY

from .conftest import assert_matches_reference
from .kind_programs import CASES, held


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_every_kind_matches_the_reference_on_the_cpu(native_cpu, case):
    program = case.build()
    inputs = case.inputs(np.random.default_rng(zlib.crc32(case.name.encode())), program)
    assert_matches_reference(program, inputs, *case.tolerance("cpu"))


def test_every_unary_and_binary_kind_has_a_c_template():
    assert set(UNARY) <= set(templates.UNARY)
    assert set(BINARY) <= set(templates.BINARY)


def test_large_loops_and_reductions_run_on_threads(native_cpu):
    def body(b, args):
        x, m = args
        wave = x.tanh() * (-x * x).exp() + x.abs()
        return wave.sum(), wave, m.sum("row"), m.exp().sum("col")

    types = [spec(f32, n=300_000), spec(f32, row=600, col=512)]
    program = accy.trace.define("threaded", types, body)
    source = accy.backends.cpu.compile_program(program).source
    assert "omp parallel" in source
    rng = np.random.default_rng(4)
    inputs = [rng.standard_normal(t.extents).astype(np.float32) for t in types]
    assert_matches_reference(program, inputs, rtol=1e-4, atol=1e-3)


def test_dot_general_with_an_empty_contraction(native_cpu):
    types = [spec(f32, m=2, k=0), spec(f32, k=0, n=3)]
    program = accy.trace.define("empty_k", types, lambda b, a: a[0].contract(a[1], "k"))
    inputs = [np.zeros(t.extents, np.float32) for t in types]
    assert_matches_reference(program, inputs)


def test_a_group_reads_its_members_through_layouts_that_keep_the_element_order(native_cpu):
    def body(b, args):
        wave = (args[0] * 0.3).tanh()  # [a, c, b=1], kept inside one loop
        moved = wave.transpose("a", "b", "c")  # moves only the unit axis: same element order
        return moved.sum(), (1.0 - wave * wave) * 0.3

    program = accy.trace.define("unit_axes", [spec(f32, a=3, c=6, b=1)], body)
    assert [step.kind for step in accy.lower.build_plan(program).steps] == ["group"]
    inputs = [np.random.default_rng(9).standard_normal((3, 6, 1)).astype(np.float32)]
    assert_matches_reference(program, inputs)


@pytest.mark.parametrize("dtype", [f32, bf16, i32], ids=str)
def test_large_scatter_add_shares_rows_among_threads_bit_for_bit(native_cpu, dtype):
    def body(b, args):
        table, flipped, ids, updates = args
        return (
            table.scatter_add(ids, updates, "v"),  # a flat copy of the operand
            flipped.transpose("v", "c").scatter_add(ids, updates, "v"),  # a strided copy
        )

    v, c, t = 4099, 257, 600  # over a million elements: banded by rows, one band per thread
    types = [spec(dtype, v=v, c=c), spec(dtype, c=c, v=v), spec(i32, t=t), spec(dtype, t=t, c=c)]
    program = accy.trace.define(f"large_scatter_{dtype}", types, body)
    assert "row_lo" in accy.backends.cpu.compile_program(program).source
    rng = np.random.default_rng(9)
    ids = rng.integers(-50, v + 50, t).astype(np.int32)  # repeated, and clamped at both ends
    ids[:40] = v // 2  # many updates of one row, near a band's edge
    if dtype == i32:
        inputs = [rng.integers(-5, 5, x.extents).astype(np.int32) for x in types]
    else:
        inputs = [held(rng.uniform(-1, 1, x.extents), x) for x in types]
    inputs[2] = ids
    assert_matches_reference(program, inputs, rtol=0, atol=0)  # bit for bit
