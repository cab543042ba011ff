"""Every kind on the native CPU backend against the reference evaluator.

Many operations share one program, so that the suite pays for few compiles; inputs come in
several layouts (operands whose axes are in another order, transposed and sliced views).
"""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import bf16, bool_, f16, f32, f64, i32, i64, spec, u8
from accy.backends.cpu import templates
from accy.ops.elementwise import BINARY, UNARY

from .conftest import assert_matches_reference

FLOATS = [f32, f64, f16, bf16]
TOLERANCE = {f16: (2e-3, 2e-3), bf16: (1e-2, 1e-2)}
POSITIVE_ONLY = {"log", "log1p", "sqrt", "rsqrt"}


def held(values, t):
    """Values as the reference holds them for type `t` (16-bit floats rounded)."""
    dtype = np.float32 if t.dtype == bf16 else t.dtype.numpy
    return accy.reference.as_input_array(np.asarray(values).astype(dtype), t, "test input")


def test_every_unary_and_binary_kind_has_a_c_template():
    assert set(UNARY) <= set(templates.UNARY)
    assert set(BINARY) <= set(templates.BINARY)


def _float_elementwise(b, args):
    x, positive, y = args
    outputs = [b.unary(op, positive if op in POSITIVE_ONLY else x) for op in UNARY if op != "not"]
    outputs += [x + y, x - y, x * y, x / y, positive**y, x.max(y), x.min(y)]
    outputs += [b.compare(d, x, y).convert(x.dtype) for d in ("eq", "ne", "lt", "le", "gt", "ge")]
    outputs.append(b.select(x > y, x, y))
    return tuple(outputs)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_float_elementwise_kinds_match_the_reference(native_cpu, dtype):
    types = [spec(dtype, row=3, col=5), spec(dtype, row=3, col=5), spec(dtype, col=5, row=3)]
    program = accy.trace.define(f"elementwise_{dtype}", types, _float_elementwise)
    rng = np.random.default_rng(0)
    x = rng.uniform(-3, 3, (3, 5))
    x[0, :5] = [0.5, -2.5, 1.5, np.nan, 40.0]  # halves (round), NaN, a large logistic input
    y = rng.uniform(-3, 3, (5, 3))
    y[0, 0] = 0.5  # a tie with x[0, 0]
    positive = rng.uniform(0.1, 3, (3, 5))
    inputs = [held(v, t) for v, t in zip((x, positive, y), types, strict=True)]
    assert_matches_reference(program, inputs, *TOLERANCE.get(dtype, (1e-5, 1e-6)))


def _integer_kinds(b, args):
    x, y = args
    outputs = [b.unary(op, x) for op in ("neg", "abs", "sign")]
    outputs += [x + y, x - y, x * y, x / y, x.max(y), x.min(y)]
    outputs += [b.compare(d, x, y) for d in ("eq", "lt", "ge")]
    outputs += [b.select(x > y, x, y), x.sum("n"), x.max("n"), x.min("n"), x.prod("n")]
    return tuple(outputs)


@pytest.mark.parametrize("dtype", [i32, i64, u8], ids=str)
def test_integer_kinds_wrap_and_divide_as_the_reference(native_cpu, dtype):
    program = accy.trace.define(f"integers_{dtype}", [spec(dtype, n=12)] * 2, _integer_kinds)
    info = np.iinfo(dtype.numpy)
    signed = dtype != u8
    x = [info.min, info.max, -7 if signed else 7, 7, 0, 5, -5 if signed else 250, 9, 100, 3, 1, 2]
    y = [-1 if signed else 1, 2, 2, -2 if signed else 200, 0, 0, 3, -4 if signed else 4, 7, 3, 1, 0]
    assert_matches_reference(program, [np.array(x, dtype.numpy), np.array(y, dtype.numpy)])


DTYPES = [f32, f64, f16, bf16, i32, i64, u8, bool_]


def test_every_conversion_matches_the_reference(native_cpu):
    def convert_all(b, args):
        return tuple(x.convert(d) for x in args for d in DTYPES if d != x.dtype)

    program = accy.trace.define("conversions", [spec(d, n=10) for d in DTYPES], convert_all)
    floats = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 255.7, -0.5, 1.5, 7e4, 0.0])
    integers = np.array([-1, 0, 1, 127, 128, 255, 256, 70000, -70000, 2**31 - 1])
    inputs = []
    for t in program.parameter_types:
        if t.dtype == bool_:
            values = np.array([1, 0, 1, 1, 0, 0, 1, 0, 1, 0], bool)
        elif t.dtype.is_float:
            with np.errstate(over="ignore"):
                values = floats.astype(np.float32 if t.dtype == bf16 else t.dtype.numpy)
        else:
            values = integers.astype(t.dtype.numpy)
        inputs.append(held(values, t))
    assert_matches_reference(program, inputs, 1e-2, 1e-2)


def _layouts(b, args):
    x, y = args  # x: [a, b, c]; y: [c, a]
    e = x.exp()
    constant = np.arange(12, dtype=np.float32).reshape(3, 4)
    return (
        e.transpose("c", "a", "b"),
        x.transpose("c", "a", "b"),
        b.broadcast_to(y, spec(f32, b=4, c=5, a=3)),
        b.broadcast_to(y.tanh(), spec(f32, b=4, c=5, a=3)),
        x.merge(("a", "b"), "ab"),
        e.merge(("b", "c"), "bc"),
        e.transpose("c", "b", "a").merge(("c", "b"), "cb"),
        x.transpose("c", "b", "a").merge(("c", "b"), "cb"),
        e.split("c", c1=1, c2=5),
        x.slice("b", 1, 4, 2),
        e.slice("c", 0, 5, 3),
        x.pad("b", 1, 2, value=-1.0, interior=1),
        e.pad("c", 2, 0, value=0.5),
        b.concatenate([x, e, x], "b"),
        b.concatenate([y, y.exp()], "a"),
        b.iota(spec(f32, a=3, b=4), "b"),
        b.iota(spec(i32, q=6), "q"),
        b.constant(constant, spec(f32, a=3, b=4)) * x.sum("c"),
    )


def test_layout_kinds_on_stored_and_computed_operands(native_cpu):
    program = accy.trace.define(
        "layouts", [spec(f32, a=3, b=4, c=5), spec(f32, c=5, a=3)], _layouts
    )
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(t.extents).astype(np.float32) for t in program.parameter_types]
    assert_matches_reference(program, inputs)


def _reductions(b, args):
    x, y = args  # x: [a, b, c]; y: [c, a]
    e = x.exp()
    return (
        x.sum("b"),  # kept innermost: accumulates in the result ("columns")
        x.sum(("a", "c")),
        e.max("a"),
        e.min("c"),
        x.prod("c"),
        x.sum(),
        x.max(("a", "b", "c")),
        e.sum("a").exp(),
        y.sum("c"),
        y.max("a"),
        b.reduce(x, b.scalar(f32, 2.5), "sum", ()),
        b.reduce(x, y.sum(), "max", "b"),  # an init that is itself computed
    )


def test_reductions_over_every_axis_combination(native_cpu):
    types = [spec(f32, a=3, b=4, c=5), spec(f32, c=5, a=3)]
    program = accy.trace.define("reductions", types, _reductions)
    rng = np.random.default_rng(2)
    inputs = [rng.standard_normal(t.extents).astype(np.float32) for t in types]
    inputs[0][0, 0, 0] = np.nan  # max and min propagate NaN, as NumPy's do
    assert_matches_reference(program, inputs)


@pytest.mark.parametrize("dtype", [f16, bf16, i32, bool_], ids=str)
def test_reductions_of_other_dtypes(native_cpu, dtype):
    def reduce_all(b, args):
        ops = ("max", "min") if dtype == bool_ else ("sum", "max", "min", "prod")
        methods = {"max": b.reduce_max, "min": b.reduce_min, "sum": b.sum, "prod": b.prod}
        return tuple(methods[op](args[0], axes) for op in ops for axes in ("a", "b", None))

    program = accy.trace.define(f"reductions_{dtype}", [spec(dtype, a=6, b=7)], reduce_all)
    rng = np.random.default_rng(3)
    if dtype == bool_:
        x = rng.random((6, 7)) > 0.5
    elif dtype == i32:
        x = rng.integers(-3, 4, (6, 7)).astype(np.int32)
    else:
        x = held(rng.uniform(0.5, 1.5, (6, 7)), program.parameter_types[0])
    assert_matches_reference(program, [x], 1e-2, 1e-2)


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


def _contractions(b, args):
    x, y, z, w = args  # x: [b, m, k]; y: [k, b, n]; z: [m, k, q]; w: [k]
    computed = x.exp() if x.dtype.is_float else x * x
    return (
        x.contract(y, "k"),  # batched; the right operand's batch axis is not leading
        b.dot_general(x, x.rename("m", "r"), (2,), (2,), (0,), (0,)),  # x @ x^T per batch
        z.contract(y, "k"),  # free axes around the contracted one: packed for BLAS
        computed.contract(y, "k"),
        x.transpose("k", "m", "b").contract(y, "k"),  # a transposed view, no copy
        w.contract(w, "k"),
        b.dot_general(z, z.rename("q", "s"), (0, 1), (0, 1)),  # two contracted axes
    )


@pytest.mark.parametrize("dtype", [f32, f64, i32, f16], ids=str)
def test_dot_general_layouts(native_cpu, dtype):
    types = [
        spec(dtype, b=2, m=3, k=4),
        spec(dtype, k=4, b=2, n=5),
        spec(dtype, m=3, k=4, q=2),
        spec(dtype, k=4),
    ]
    program = accy.trace.define(f"contractions_{dtype}", types, _contractions)
    rng = np.random.default_rng(5)
    if dtype.is_float:
        inputs = [held(rng.standard_normal(t.extents), t) for t in types]
    else:
        inputs = [rng.integers(-5, 5, t.extents).astype(dtype.numpy) for t in types]
    tolerance = (1e-2, 1e-2) if dtype == f16 else (1e-5, 1e-5)
    assert_matches_reference(program, inputs, *tolerance)


def test_dot_general_with_an_empty_contraction(native_cpu):
    types = [spec(f32, m=2, k=0), spec(f32, k=0, n=3)]
    program = accy.trace.define("empty_k", types, lambda b, a: a[0].contract(a[1], "k"))
    inputs = [np.zeros(t.extents, np.float32) for t in types]
    assert_matches_reference(program, inputs)


def _indexing(b, args):
    table, ids, ids2, updates = args  # table: [v, c]; ids: [t]; ids2: [p, q]; updates: [t, c]
    return (
        table.gather(ids, "v"),
        table.exp().gather(ids2, "v"),
        table.transpose("c", "v").gather(ids, "v"),
        table.scatter_add(ids, updates, "v"),
        b.zeros(table.ty).scatter_add(ids, updates.exp(), "v"),
        table.gather(ids, "v").sum("t"),
    )


def test_gather_and_scatter_add_clamp_out_of_range_indices(native_cpu):
    types = [spec(f32, v=5, c=3), spec(i32, t=4), spec(i64, p=2, q=2), spec(f32, t=4, c=3)]
    program = accy.trace.define("indexing", types, _indexing)
    rng = np.random.default_rng(6)
    inputs = [
        rng.standard_normal((5, 3)).astype(np.float32),
        np.array([0, -3, 4, 9], np.int32),  # below and beyond the table; 4 twice after clamping
        np.array([[1, 7], [-1, 2]], np.int64),
        rng.standard_normal((4, 3)).astype(np.float32),
    ]
    assert_matches_reference(program, inputs)


def _scans(b, args):
    w, h0, xs, xt = args  # xs: [step, c] (axis outermost); xt: [c, step] (axis inside)

    def cell(_, values):
        w, h, x, y = values
        new = (h * w + x).tanh() + y
        return new, new.sum("c"), h

    forward = b.scan(cell, consts=[w], carries=[h0], xs=[xs, xt], axis="step")
    backward = b.scan(cell, consts=[w], carries=[h0], xs=[xs, xt], axis="step", reverse=True)
    return (*forward[0], *forward[1], *backward[0], *backward[1])


def test_scan_forward_and_reverse(native_cpu):
    types = [spec(f32, c=3), spec(f32, c=3), spec(f32, step=4, c=3), spec(f32, c=3, step=4)]
    program = accy.trace.define("scans", types, _scans)
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal(t.extents).astype(np.float32) for t in types]
    assert_matches_reference(program, inputs)


@pytest.mark.parametrize("dtype", [f16, bf16, i32], ids=str)
def test_scatter_add_with_repeated_rows_adds_as_the_reference(native_cpu, dtype):
    def body(b, args):
        table, ids, updates = args
        return table.scatter_add(ids, updates, "v"), table.gather(ids, "v")

    types = [spec(dtype, v=3, c=2), spec(i32, t=6), spec(dtype, t=6, c=2)]
    program = accy.trace.define(f"scatter_{dtype}", types, body)
    rng = np.random.default_rng(8)
    ids = np.array([0, 0, 0, 1, 1, 2], np.int32)
    if dtype == i32:
        inputs = [rng.integers(-5, 5, t.extents).astype(np.int32) for t in types]
    else:
        inputs = [held(rng.uniform(-1, 1, t.extents), t) for t in types]
    inputs[1] = ids
    assert_matches_reference(program, inputs, rtol=0, atol=0)  # bit for bit


def test_empty_tensors(native_cpu):
    def body(b, args):
        x, empty, no_ids = args
        return (
            empty.sum(),
            empty.max(),
            b.concatenate([x, empty.rename("m", "n")], "n"),
            x.gather(no_ids, "n"),
            empty.exp(),
            b.broadcast_to(x, spec(f32, n=3, z=0)).sum("z"),
        )

    types = [spec(f32, n=3), spec(f32, m=0), spec(i32, t=0)]
    program = accy.trace.define("empty", types, body)
    inputs = [np.ones(3, np.float32), np.zeros(0, np.float32), np.zeros(0, np.int32)]
    assert_matches_reference(program, inputs)


def test_a_scan_of_length_zero_returns_its_initial_carries(native_cpu):
    def body(b, args):
        def cell(_, values):
            return values[0] + values[1], values[0] * 2.0

        carries, ys = b.scan(cell, carries=[args[0]], xs=[args[1]], axis="s")
        return (*carries, *ys)

    program = accy.trace.define("scan_zero", [spec(f32, c=2), spec(f32, s=0, c=2)], body)
    assert_matches_reference(program, [np.ones(2, np.float32), np.zeros((0, 2), np.float32)])


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
