"""Every kernel the tests run, with inputs and a NumPy oracle.

`CASES` is the one list the numeric tests (against NumPy, on the CPU) and the PTX test (every
kernel through `nvcc -ptx`) share, so a kernel added here is checked both ways.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

import accy
from accy.core.types import DType, bf16, bool_, f16, f32, f64, i32, i64, u8
from accy.kernel import Index2D, Limits, dynamic_buffer, examples, ops
from accy.kernel.examples import custom_double_kernel
from accy.kernel.logical import Program, schedule

EXTENT = 64
ROWS, COLS = 6, 10
SCHEDULE = schedule.thread_blocks(x=32)

Inputs = Callable[[np.random.Generator], list[np.ndarray]]


@dataclass(frozen=True)
class Case:
    """A kernel, how to make its inputs, and what NumPy says its result (flattened) is."""

    program: Program
    inputs: Inputs
    expected: Callable[..., np.ndarray]
    tolerance: float = 0.0  # relative and absolute; 0 asks for equality (NaNs where NumPy has them)
    limits: Limits = Limits.testing

    @property
    def name(self) -> str:
        return self.program.name


# ---------------------------------------------------------------------------------------------
# inputs


def random_array(rng: np.random.Generator, dtype: DType, n: int, low=-4.0, high=4.0) -> np.ndarray:
    """Values of `dtype` in [low, high) for floats; integers over their whole range."""
    if dtype == bool_:
        return rng.integers(0, 2, n).astype(np.bool_)
    if not dtype.is_float:
        info = np.iinfo(dtype.numpy)
        return rng.integers(info.min, info.max, n, dtype=dtype.numpy, endpoint=True)
    return rng.uniform(low, high, n).astype(np.float32).astype(dtype.numpy)


def with_specials(values: np.ndarray) -> np.ndarray:
    """Floats with NaN, infinities and signed zeros planted at the front."""
    if values.dtype.kind != "f" and values.dtype != bf16.numpy:
        return values
    planted = values.copy()
    specials = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0]
    planted[: len(specials)] = specials
    return planted


def small_ints(rng: np.random.Generator, dtype: DType, n: int) -> np.ndarray:
    """Integers near zero (zeros included), for division."""
    low = 0 if dtype == u8 else -9
    return rng.integers(low, 10, n).astype(dtype.numpy)


def numpy_of(dtype: DType, function: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """`function` on NumPy arrays, as accy computes in `dtype`: bf16 computed in float32, each
    result rounded to bf16."""

    def reference(*arrays: np.ndarray) -> np.ndarray:
        wide = [a.astype(np.float32) if a.dtype == bf16.numpy else a for a in arrays]
        with np.errstate(all="ignore"):
            result = function(*wide)
        return result.astype(bf16.numpy) if dtype == bf16 and result.dtype == np.float32 else result

    return reference


# ---------------------------------------------------------------------------------------------
# kernel shapes


def map_kernel(
    name: str, result: DType, operands: Sequence[DType], compute: Callable, extent: int = EXTENT
) -> Program:
    """`dst[i] = compute(inner, x0[i], x1[i], ...)`, one thread per element, 32 a block."""
    return examples.map_kernel(name, result, operands, compute, extent)


def applies(op: str, dtype: DType) -> bool:
    """Whether the op table defines `op` for `dtype` (the error tests cover the rest)."""
    return ops.applies(op, dtype)


# ---------------------------------------------------------------------------------------------
# elementwise


def trunc_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """accy's integer division: truncation toward zero; 0 for a zero divisor."""
    safe = np.where(b == 0, 1, b)
    quotient = np.abs(a.astype(np.int64)) // np.abs(safe.astype(np.int64))
    quotient = np.where((a < 0) != (safe < 0), -quotient, quotient)
    return np.where(b == 0, 0, quotient).astype(a.dtype)


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b) if a.dtype.kind == "f" else trunc_divide(a, b)


BINARY_REFERENCES = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": _divide,
    "pow": np.power,
    "max": np.maximum,
    "min": np.minimum,
}
BINARY_DTYPES = (f32, f64, f16, bf16, i32, i64, u8, bool_)


def _binary_inputs(op: str, dtype: DType) -> Inputs:
    def make(rng):
        if op == "div" and not dtype.is_float:
            return [random_array(rng, dtype, EXTENT), small_ints(rng, dtype, EXTENT)]
        if op == "pow":
            return [random_array(rng, dtype, EXTENT, 0.1, 3.0), random_array(rng, dtype, EXTENT)]
        return [with_specials(random_array(rng, dtype, EXTENT)) for _ in range(2)]

    return make


def binary_case(op: str, dtype: DType) -> Case:
    program = map_kernel(
        f"binary_{op}_{dtype.name}",
        dtype,
        [dtype, dtype],
        lambda inner, a, b: a.apply(inner, op, b),
    )
    tolerance = UNARY_TOLERANCE[dtype] if op == "pow" else 0.0
    return Case(
        program, _binary_inputs(op, dtype), numpy_of(dtype, BINARY_REFERENCES[op]), tolerance
    )


def _logistic(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


# op -> (NumPy function, input range, whether the result is exact rather than libm-dependent)
UNARY_REFERENCES = {
    "neg": (np.negative, (-4, 4), True),
    "abs": (np.abs, (-4, 4), True),
    "sign": (np.sign, (-4, 4), True),
    "floor": (np.floor, (-4, 4), True),
    "ceil": (np.ceil, (-4, 4), True),
    "round": (np.round, (-4, 4), True),
    "sqrt": (np.sqrt, (0.01, 8), True),
    "rsqrt": (lambda x: 1 / np.sqrt(x), (0.01, 8), True),
    "exp": (np.exp, (-3, 3), False),
    "log": (np.log, (0.01, 8), False),
    "log1p": (np.log1p, (0.01, 8), False),
    "expm1": (np.expm1, (-3, 3), False),
    "sin": (np.sin, (-3, 3), False),
    "cos": (np.cos, (-3, 3), False),
    "tan": (np.tan, (-1.2, 1.2), False),
    "tanh": (np.tanh, (-3, 3), False),
    "logistic": (_logistic, (-6, 6), False),
}
UNARY_TOLERANCE = {f32: 2e-6, f64: 1e-14, f16: 1e-3, bf16: 8e-3}


def unary_case(op: str, dtype: DType) -> Case:
    function, (low, high), exact = UNARY_REFERENCES[op]
    program = map_kernel(
        f"unary_{op}_{dtype.name}", dtype, [dtype], lambda inner, x: x.apply(inner, op)
    )

    def make(rng):
        values = random_array(rng, dtype, EXTENT, low, high)
        # Round halves exercise round-half-to-even; they only exist exactly in float types.
        return [np.concatenate([np.array([0.5, 1.5, 2.5, -0.5], values.dtype), values[4:]])]

    inputs = make if op == "round" else (lambda rng: [random_array(rng, dtype, EXTENT, low, high)])
    tolerance = 0.0 if exact else UNARY_TOLERANCE[dtype]
    return Case(program, inputs, numpy_of(dtype, function), tolerance)


INT_UNARY = {"neg": np.negative, "abs": np.abs, "sign": np.sign}


def int_unary_case(op: str, dtype: DType) -> Case:
    program = map_kernel(
        f"unary_{op}_{dtype.name}", dtype, [dtype], lambda inner, x: x.apply(inner, op)
    )

    def make(rng):
        values = random_array(rng, dtype, EXTENT)
        info = np.iinfo(dtype.numpy)
        values[:3] = [info.min, info.max, 0]  # the extremes, where negation wraps
        return [values]

    return Case(program, make, numpy_of(dtype, INT_UNARY[op]))


COMPARE_REFERENCES = {
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}


def compare_case(op: str, dtype: DType) -> Case:
    program = map_kernel(
        f"compare_{op}_{dtype.name}",
        bool_,
        [dtype, dtype],
        lambda inner, a, b: a.apply(inner, op, b),
    )

    def make(rng):
        a = with_specials(random_array(rng, dtype, EXTENT))
        b = with_specials(random_array(rng, dtype, EXTENT))
        b[EXTENT // 2 :] = a[EXTENT // 2 :]  # half equal, so eq/le/ge see both answers
        return [a, b]

    return Case(program, make, numpy_of(dtype, COMPARE_REFERENCES[op]))


# (source, target, input range) for casts; NumPy's astype is the oracle within these ranges.
CASTS = [
    (f32, i32, (-1e6, 1e6)),
    (f64, i64, (-1e15, 1e15)),
    (f32, u8, (0, 255.9)),
    (f64, i32, (-2e9, 2e9)),
    (i32, f32, None),
    (i64, f64, None),
    (i64, f32, None),
    (i64, i32, None),
    (i32, u8, None),
    (u8, i64, None),
    (f64, f32, (-1e6, 1e6)),
    (f32, f64, (-1e6, 1e6)),
    (f32, f16, (-7e4, 7e4)),
    (f16, f32, (-6e4, 6e4)),
    (f32, bf16, (-1e30, 1e30)),
    (bf16, f32, (-1e30, 1e30)),
    (f16, bf16, (-6e4, 6e4)),
    (bf16, f16, (-100, 100)),
    (f16, i32, (-6e4, 6e4)),
    (f32, bool_, (-1, 1)),
    (i32, bool_, None),
    (bool_, f32, None),
    (bool_, i32, None),
]


def _astype(target: DType) -> Callable[[np.ndarray], np.ndarray]:
    def cast(x: np.ndarray) -> np.ndarray:
        if target == bf16:
            return x.astype(np.float32).astype(bf16.numpy)
        return x.astype(target.numpy)

    return cast


def cast_case(source: DType, target: DType, limits: tuple[float, float] | None) -> Case:
    program = map_kernel(
        f"cast_{source.name}_to_{target.name}",
        target,
        [source],
        lambda inner, x: x.cast(inner, target),
    )

    def make(rng):
        values = random_array(rng, source, EXTENT, *(limits or (0, 1)))
        if source == f32 and target == bool_:
            values[:2] = [0.0, -0.0]
        return [values]

    return Case(program, make, numpy_of(target, _astype(target)))


# ---------------------------------------------------------------------------------------------
# constants, positions, select


def _affine(inner, x):
    return x.mul(inner, 0.5).add(inner, inner.constant(3.0, f32))


def _plus_position(inner, x):
    # `inner.loop_index` is the index of the loop whose body this is.
    position = inner.loop_index.value(inner).cast(inner, f32)
    return x.add(inner, position)


def _clamp(inner, x):
    return x.max(inner, -1.0).min(inner, 1.0)


def _select(inner, x, y):
    return x.gt(inner, 0.0).select(inner, x.mul(inner, 2.0), y.sub(inner, 1.0))


def _not_equal(inner, a, b):
    return a.eq(inner, b).logical_not(inner)


def _wrapping_sum(inner, a, b):
    return a.add(inner, b).mul(inner, 3).sub(inner, 7)


def _mixed(inner, x, n):
    # An i32 divisor taken to f32, a comparison on the result, and a select back to f32.
    quotient = x.div(inner, n.cast(inner, f32).add(inner, 0.5))
    return quotient.lt(inner, 1.0).select(inner, quotient.exp(inner), quotient.sqrt(inner))


def _unit(rng, dtype, n=EXTENT):
    return random_array(rng, dtype, n, -2.0, 2.0)


MISC = [
    Case(
        map_kernel("affine_f32", f32, [f32], _affine),
        lambda rng: [_unit(rng, f32)],
        lambda x: x * np.float32(0.5) + np.float32(3.0),
    ),
    Case(
        map_kernel("plus_position_f32", f32, [f32], _plus_position),
        lambda rng: [_unit(rng, f32)],
        lambda x: x + np.arange(EXTENT, dtype=np.float32),
    ),
    Case(
        map_kernel("clamp_f32", f32, [f32], _clamp),
        lambda rng: [with_specials(_unit(rng, f32))],
        lambda x: np.minimum(np.maximum(x, np.float32(-1)), np.float32(1)),
    ),
    Case(
        map_kernel("select_f32", f32, [f32, f32], _select),
        lambda rng: [_unit(rng, f32), _unit(rng, f32)],
        lambda x, y: np.where(x > 0, x * np.float32(2), y - np.float32(1)),
    ),
    Case(
        map_kernel("not_equal_bool", bool_, [bool_, bool_], _not_equal),
        lambda rng: [random_array(rng, bool_, EXTENT), random_array(rng, bool_, EXTENT)],
        lambda a, b: a != b,
    ),
    Case(
        map_kernel("wrapping_i32", i32, [i32, i32], _wrapping_sum),
        lambda rng: [random_array(rng, i32, EXTENT), random_array(rng, i32, EXTENT)],
        lambda a, b: (a + b) * np.int32(3) - np.int32(7),
    ),
    Case(
        map_kernel("mixed_f32_i32", f32, [f32, i32], _mixed),
        lambda rng: [random_array(rng, f32, EXTENT, 0, 4), small_ints(rng, i32, EXTENT) ** 2],
        numpy_of(f32, lambda x, n: _mixed_reference(x, n)),
        tolerance=2e-6,
    ),
    Case(
        map_kernel("fill_i64", i64, [], lambda inner: inner.constant(-(2**63), i64)),
        lambda rng: [],
        lambda: np.full(EXTENT, -(2**63), np.int64),
    ),
]


def _outer_constant_kernel() -> Program:
    # A value made in the kernel's scope, before the loop, and used inside it.
    def body(k, args):
        scale = k.constant(2.5, f64).mul(k, -2.0)

        def each(inner, index, each_args):
            x = each_args.param("x").load(inner, index)
            each_args.param("dst").store(inner, x.mul(inner, scale), index)

        k.for_each_1d("e", EXTENT, args, each)

    parameters = {"dst": dynamic_buffer(f64), "x": dynamic_buffer(f64)}
    return Program(name="outer_constant_f64", parameters=parameters, body=body).with_schedule(
        SCHEDULE
    )


MISC.append(
    Case(_outer_constant_kernel(), lambda rng: [_unit(rng, f64)], lambda x: x * np.float64(-5.0))
)


def _mixed_reference(x: np.ndarray, n: np.ndarray) -> np.ndarray:
    quotient = x / (n.astype(np.float32) + np.float32(0.5))
    return np.where(quotient < 1, np.exp(quotient), np.sqrt(quotient))


# ---------------------------------------------------------------------------------------------
# two dimensions


def grid_kernel(name: str, parameters: dict, each, extents=(ROWS, COLS)) -> Program:
    def body(k, args):
        k.for_each_2d("g", extents, args, each)

    return Program(name=name, parameters=parameters, body=body).with_schedule(SCHEDULE)


def _transpose_each(inner, index, args):
    x = args.param("x").load(inner, index)
    args.param("dst").store(inner, x, index.transposed())


def _bias_each(inner, index, args):
    x = args.param("x").load(inner, index)
    bias = args.param("bias").load(inner, index.col)
    scale = args.param("scale").load(inner, index.row)
    args.param("dst").store(inner, x.add(inner, bias).mul(inner, scale), index)


def _grid(rng, dtype=f32):
    return _unit(rng, dtype, ROWS * COLS)


TWO_D = [
    Case(
        grid_kernel(
            "transpose_i64",
            {"dst": dynamic_buffer(i64), "x": dynamic_buffer(i64)},
            _transpose_each,
        ),
        lambda rng: [random_array(rng, i64, ROWS * COLS)],
        lambda x: x.reshape(ROWS, COLS).T,
    ),
    Case(
        grid_kernel(
            "bias_scale_f32",
            {
                "dst": dynamic_buffer(f32),
                "x": dynamic_buffer(f32),
                "bias": dynamic_buffer(f32),
                "scale": dynamic_buffer(f32),
            },
            _bias_each,
        ),
        lambda rng: [_grid(rng), _unit(rng, f32, COLS), _unit(rng, f32, ROWS)],
        lambda x, bias, scale: (x.reshape(ROWS, COLS) + bias) * scale[:, None],
    ),
]


# ---------------------------------------------------------------------------------------------
# reductions: one thread per row reduces along the row


def row_kernel(name: str, result: DType, operands: dict[str, DType], row_value) -> Program:
    """`dst[r] = row_value(inner, row, args)` for each row, one thread per row."""
    parameters = {"dst": dynamic_buffer(result)}
    parameters.update({n: dynamic_buffer(d) for n, d in operands.items()})

    def body(k, args):
        def each(inner, row, each_args):
            each_args.param("dst").store(inner, row_value(inner, row, each_args), row)

        k.for_each_1d("row", ROWS, args, each)

    return Program(name=name, parameters=parameters, body=body).with_schedule(SCHEDULE)


def reduce_row(combine: str, term=None):
    """The row's elements of x (or `term` of them) combined with `combine`."""

    def row_value(inner, row, args):
        def each(inner2, col, args2):
            x = args2.param("x").load(inner2, Index2D(row, col))
            return term(inner2, x) if term else x

        return inner.reduce_1d("col", COLS, args, each, combine=combine)

    return row_value


def _logsumexp(inner, row, args):
    top = reduce_row("max")(inner, row, args)

    def each(inner2, col, args2):
        x = args2.param("x").load(inner2, Index2D(row, col))
        return x.sub(inner2, top).exp(inner2)

    total = inner.reduce_1d("col2", COLS, args, each)
    return top.add(inner, total.log(inner))


def _matvec(inner, row, args):
    def each(inner2, col, args2):
        a = args2.param("a").load(inner2, Index2D(row, col))
        return a.mul(inner2, args2.param("v").load(inner2, col))

    return inner.reduce_1d("col", COLS, args, each)


def _nested(inner, row, args):
    # dst[r] = sum_c a[r, c] * (sum_k b[c, k]): a reduction inside a reduction.
    def each(inner2, col, args2):
        def inner_each(inner3, k, args3):
            return args3.param("b").load(inner3, Index2D(col, k))

        row_of_b = inner2.reduce_1d("k", 4, args2, inner_each)
        return args2.param("a").load(inner2, Index2D(row, col)).mul(inner2, row_of_b)

    return inner.reduce_1d("col", COLS, args, each)


def _total_kernel() -> Program:
    def body(k, args):
        def each(inner, index, each_args):
            def term(inner2, e, args2):
                return args2.param("x").load(inner2, e)

            total = inner.reduce_1d("all", EXTENT, each_args, term)
            each_args.param("dst").store(inner, total, index)

        k.for_each_1d("one", 1, args, each)

    parameters = {"dst": dynamic_buffer(f64), "x": dynamic_buffer(f64)}
    return Program(name="total_f64", parameters=parameters, body=body).with_schedule(SCHEDULE)


def _rows(x: np.ndarray) -> np.ndarray:
    return x.reshape(ROWS, COLS)


REDUCTIONS = [
    Case(
        row_kernel("row_sum_f32", f32, {"x": f32}, reduce_row("add")),
        lambda rng: [_grid(rng)],
        lambda x: _rows(x).sum(axis=1),
        tolerance=1e-6,
    ),
    Case(
        row_kernel("row_max_f32", f32, {"x": f32}, reduce_row("max")),
        lambda rng: [_grid(rng) - 10],
        lambda x: _rows(x).max(axis=1),
    ),
    Case(
        row_kernel("row_min_i32", i32, {"x": i32}, reduce_row("min")),
        lambda rng: [random_array(rng, i32, ROWS * COLS)],
        lambda x: _rows(x).min(axis=1),
    ),
    Case(
        row_kernel("row_wrapping_sum_i32", i32, {"x": i32}, reduce_row("add")),
        lambda rng: [random_array(rng, i32, ROWS * COLS)],
        lambda x: _rows(x).sum(axis=1, dtype=np.int32),
    ),
    Case(
        row_kernel("row_prod_f64", f64, {"x": f64}, reduce_row("mul")),
        lambda rng: [random_array(rng, f64, ROWS * COLS, 0.5, 1.5)],
        lambda x: _rows(x).prod(axis=1),
        tolerance=1e-14,
    ),
    Case(
        row_kernel("row_any_bool", bool_, {"x": bool_}, reduce_row("max")),
        lambda rng: [rng.uniform(size=ROWS * COLS) < 0.08],
        lambda x: _rows(x).any(axis=1),
    ),
    Case(
        row_kernel(
            "row_sum_squares_f16", f16, {"x": f16}, reduce_row("add", lambda i, x: x.mul(i, x))
        ),
        lambda rng: [_grid(rng, f16)],
        # f16 terms round to f16; the sum accumulates in float and rounds once.
        lambda x: (_rows(x) * _rows(x)).astype(np.float32).sum(axis=1).astype(np.float16),
        tolerance=1e-3,
    ),
    Case(
        row_kernel("row_logsumexp_f32", f32, {"x": f32}, _logsumexp),
        lambda rng: [_grid(rng) * 10],
        lambda x: (
            np.log(np.exp(_rows(x) - _rows(x).max(1, keepdims=True)).sum(1)) + _rows(x).max(1)
        ),
        tolerance=2e-6,
    ),
    Case(
        row_kernel("matvec_f32", f32, {"a": f32, "v": f32}, _matvec),
        lambda rng: [_grid(rng), _unit(rng, f32, COLS)],
        lambda a, v: _rows(a) @ v,
        tolerance=2e-6,
    ),
    Case(
        row_kernel("nested_sum_f64", f64, {"a": f64, "b": f64}, _nested),
        lambda rng: [_grid(rng, f64), _unit(rng, f64, COLS * 4)],
        lambda a, b: _rows(a) @ b.reshape(COLS, 4).sum(axis=1),
        tolerance=1e-13,
    ),
    Case(
        _total_kernel(),
        lambda rng: [_unit(rng, f64)],
        lambda x: np.array([x.sum()]),
        tolerance=1e-13,
    ),
]


# ---------------------------------------------------------------------------------------------
# grad.zig's kernel, and a large launch


def _double_expected(x: np.ndarray) -> np.ndarray:
    return x + x


def _wide_kernel() -> Program:
    # Many blocks, and a last block only partly inside the extent: the thread guard at work.
    program = map_kernel("wide_scale_f32", f32, [f32], lambda inner, x: x.mul(inner, -3.0), 10_000)
    return program.with_schedule(schedule.thread_blocks(x=96))


SEED = [
    Case(custom_double_kernel(), lambda rng: [_unit(rng, f32, 4)], _double_expected),
    Case(
        _wide_kernel(),
        lambda rng: [_unit(rng, f32, 10_000)],
        lambda x: x * np.float32(-3),
        limits=Limits.default,
    ),
]


def conversion_program(source: DType, target: DType, extent: int = 1 << 16) -> Program:
    """`dst = x.cast(target)` over `extent` elements: the exhaustive f16/bf16 tests' kernel."""
    return map_kernel(
        f"convert_{source.name}_{target.name}_{extent}",
        target,
        [source],
        lambda inner, x: x.cast(inner, target),
        extent=extent,
    )


def conversion_programs() -> list[Program]:
    """The conversion kernels test_half.py builds (sizes as it uses them)."""
    return [
        conversion_program(f16, f32),
        conversion_program(f32, f16, HARD_FLOAT_COUNT),
        conversion_program(f32, bf16),
    ]


HARD_FLOAT_COUNT = 1 << 19  # test_half._hard_floats fills this many floats


CASES: list[Case] = [
    *SEED,
    *(binary_case(op, d) for op in BINARY_REFERENCES for d in BINARY_DTYPES if applies(op, d)),
    *(unary_case(op, d) for op in UNARY_REFERENCES for d in (f32, f64)),
    *(unary_case(op, d) for op in ("exp", "tanh", "sqrt", "round", "abs") for d in (f16, bf16)),
    *(int_unary_case(op, d) for op in INT_UNARY for d in (i32, i64, u8)),
    *(compare_case(op, d) for op in COMPARE_REFERENCES for d in (f32, i32, u8, bool_)),
    *(cast_case(*c) for c in CASTS),
    *MISC,
    *TWO_D,
    *REDUCTIONS,
]

assert len({case.name for case in CASES}) == len(CASES), "kernel names must be unique"
assert accy.kernel  # the tests exercise the package as `accy.kernel`
