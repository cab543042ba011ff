"""Column reductions on CUDA (`accy.backends.cuda.columns`): reductions that keep the innermost
axis are one kernel whose last block per tile combines the partial values (no second pass),
checked against NumPy on a GPU in every dtype, for odd, tiny, strided and misaligned inputs,
and across graph replays (the arrival counters must be left at zero)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import accy
from accy import bf16, f16, f32, f64, i32, spec
from accy.backends.cuda import compile_program
from accy.backends.cuda.columns import choose_column_cut
from accy.backends.cuda.kernels import COUNTERS
from accy.kernel import toolchain

from ..executors import cuda_device_or_skip
from ..halves import comparable
from .cuda_emulation import emulate_kernel

# Accumulation in f32 (halves and f32) or f64, then one rounding to the result's dtype.
ACCUMULATION_EPS = {f32: 2.0**-20, bf16: 2.0**-20, f16: 2.0**-20, f64: 2.0**-48}
RESULT_EPS = {f32: 2.0**-22, bf16: 2.0**-8, f16: 2.0**-10, f64: 2.0**-50}


def _sum_program(dtype, shape: dict[str, int], reduced, accumulate=None):
    return accy.trace.define(
        "column_sum", [spec(dtype, **shape)], lambda b, a: a[0].sum(reduced, accumulate)
    )


def _values(dtype, shape, rng) -> np.ndarray:
    if dtype == i32:
        return rng.integers(-1000, 1000, shape).astype(np.int32)
    return (rng.standard_normal(shape) * 2.0).astype(dtype.numpy)


def _run_cuda(program, inputs) -> list[np.ndarray]:
    import cupy

    return [cupy.asnumpy(out) for out in accy.compile(program, device="cuda")(*inputs)]


def _assert_sum(got, terms: np.ndarray, axes, dtype, what: str) -> None:
    """`got` is the sum of `terms` (exact values, float64) over `axes`, within f32 (or f64)
    accumulation and one rounding to `dtype`."""
    want = terms.sum(axis=axes)
    magnitude = np.abs(terms).sum(axis=axes)
    got = comparable(got).astype(np.float64)
    assert got.shape == want.shape, what
    bound = ACCUMULATION_EPS[dtype] * magnitude * 4 + RESULT_EPS[dtype] * np.abs(want) * 2
    excess = np.abs(got - want) - bound
    assert np.all(excess <= 0), f"{what}: off by {np.max(excess)} beyond the bound"


@pytest.fixture(scope="module")
def gpu():
    return cuda_device_or_skip()


# The generated source (no GPU) ------------------------------------------------------------------


def _kernel_comments(source: str) -> list[str]:
    return re.findall(r"/\* step \d+: (reduce[^*]*)\*/", source)


@pytest.mark.parametrize("dtype", [bf16, f32], ids=str)
@pytest.mark.parametrize("columns", [768, 2304, 3072])
def test_a_column_reduction_is_one_kernel_that_combines_its_own_partials(dtype, columns):
    program = _sum_program(dtype, {"r": 8192, "c": columns}, "r")
    compiled = compile_program(program)
    assert _kernel_comments(compiled.source) == ["reduce (columns) "]
    assert "(combine)" not in compiled.source
    [launch] = compiled.schedule.actions
    width = 8 if dtype == bf16 else 4
    cut = choose_column_cut(columns, 8192, width, COUNTERS)
    assert launch.grid == cut.grid and 256 <= cut.grid <= 600  # 2-4 blocks on each of 132 SMs
    assert cut.chunks > 1 and "atomicAdd(" in compiled.source
    assert f"accy_vector<{'uint16_t' if dtype == bf16 else 'float'}, {width}>" in compiled.source
    # The last block sets its tile's counter back to zero for the next run.
    assert re.search(r"\(scratch - \d+\)\)\[tile\] = 0;", compiled.source)


def test_many_results_need_no_chunks_and_no_counters():
    program = _sum_program(f32, {"r": 16, "c": 1 << 20}, "r")
    source = compile_program(program).source
    assert "atomicAdd(" not in source and "(combine)" not in source


def test_column_kernels_of_one_program_share_one_counter_array():
    def body(b, a):
        return a[0].sum("r"), (a[0] * a[1]).sum("r"), a[2].sum("r")

    types = [spec(bf16, r=8192, c=768)] * 2 + [spec(f32, r=4096, c=3072)]
    compiled = compile_program(accy.trace.define("three", types, body))
    counters = set(
        re.findall(r"atomicAdd\(\(\(unsigned int \*\)\(scratch - (\d+)\)\)", compiled.source)
    )
    assert len(counters) == 1
    assert len(_kernel_comments(compiled.source)) == 3


@pytest.mark.slow
@pytest.mark.skipif(toolchain.nvcc() is None, reason="cuda gate: nvcc is not on PATH")
def test_column_kernels_compile_in_every_dtype():
    programs = [
        _sum_program(dtype, {"r": 4096, "c": 96}, "r") for dtype in (f32, f64, f16, bf16, i32)
    ]
    programs.append(
        accy.trace.define("max", [spec(bf16, r=4096, c=768)], lambda b, a: a[0].max("r"))
    )
    programs.append(_sum_program(f32, {"r": 9, "c": 7}, "r"))
    source = "".join(compile_program(p, prefix=f"p{n}_").source for n, p in enumerate(programs))
    ptx = toolchain.ptx_with_nvcc(source, "column kernels", arch="compute_90")
    assert "atom.global.add.u32" in ptx or "red.global.add.u32" in ptx


@pytest.mark.parametrize(
    ("dtype", "rows", "columns"), [(bf16, 2048, 96), (f32, 513, 7), (f64, 3000, 40)], ids=str
)
@pytest.mark.slow
def test_the_kernel_run_on_the_cpu_sums_alike_in_any_block_order(dtype, rows, columns):
    # Without a GPU: the generated kernel, blocks in shuffled orders, twice (the last block
    # differs from run to run; the counters must end at zero), misaligned for the scalar loop.
    program = _sum_program(dtype, {"r": rows, "c": columns}, "r")
    compiled = compile_program(program)
    [launch] = compiled.schedule.actions
    assert launch.grid > 1 and "atomicAdd(" in compiled.source
    x = _values(dtype, (rows, columns), np.random.default_rng(9))
    outputs = []
    for shift in (0, dtype.itemsize) if dtype == bf16 else (0,):
        runs = emulate_kernel(
            compiled.source, launch.kernel, launch.grid, x, dtype.numpy, (columns,), shift
        )
        outputs += runs
        _assert_sum(runs[0], x.astype(np.float64), (0,), dtype, f"{dtype} shift {shift}")
    for later in outputs[1:]:  # the vector and the scalar loop add in the same order
        assert later.tobytes() == outputs[0].tobytes()


def _sequential_f32_sum(x: np.ndarray, axis: int) -> np.ndarray:
    """The f32 sum of `x` along `axis`, rows added in order from 0.0."""
    total = np.zeros(np.delete(x.shape, axis), np.float32)
    for row in np.moveaxis(x.astype(np.float32), axis, 0):
        total = total + row
    return total


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dtype", "tokens", "length"), [(bf16, 16, 4), (f32, 6, 16), (bf16, 64, 1)], ids=str
)
def test_short_columns_take_a_thread_each_and_sum_in_row_order(dtype, tokens, length):
    # As the sum of a query group's heads for a key's gradient: columns of a few rows each,
    # a thread per vector of results (no row lane idle), 2048 bf16 (1024 f32) results a tile,
    # stored by 256 threads in turn. Each thread adds its rows in order, as the lanes' one
    # row each were combined: the bits of the sequential f32 sum (then one rounding).
    shape = {"t": tokens, "g": length, "c": 512}
    program = _sum_program(dtype, shape, "g")
    compiled = compile_program(program)
    [launch] = compiled.schedule.actions
    cut = choose_column_cut(tokens * 512, length, 16 // dtype.itemsize, COUNTERS)
    assert (cut.vectors, cut.chunks) == (256, 1) and launch.grid == cut.tiles
    assert "atomicAdd(" not in compiled.source
    x = _values(dtype, tuple(shape.values()), np.random.default_rng(5))
    want = _sequential_f32_sum(x, 1).astype(dtype.numpy)
    for shift in (0, dtype.itemsize):  # aligned (vector loads) and not (the scalar loop)
        runs = emulate_kernel(
            compiled.source, launch.kernel, launch.grid, x, dtype.numpy, (tokens, 512), shift
        )
        for got in runs:
            assert got.tobytes() == want.tobytes(), f"{dtype} shift {shift}"


# On a GPU ---------------------------------------------------------------------------------------

SUMS = [
    (bf16, {"r": 8192, "c": 768}, "r"),
    (bf16, {"r": 8192, "c": 3072}, "r"),
    (f32, {"r": 8192, "c": 768}, "r"),
    (f32, {"r": 8192, "c": 2304}, "r"),
    (f16, {"r": 1000, "c": 2304}, "r"),
    (f64, {"r": 777, "c": 130}, "r"),
    (f32, {"r": 1, "c": 768}, "r"),  # one row
    (bf16, {"r": 4097, "c": 1}, "r"),  # one column (a row reduction in all but name)
    (f32, {"r": 513, "c": 7}, "r"),  # odd extents: no vectors
    (bf16, {"r": 3001, "c": 6}, "r"),  # two lanes per thread
    (f32, {"b": 3, "t": 1000, "c": 24}, ("b", "t")),  # two reduced axes
    (bf16, {"a": 64, "t": 513, "c": 48}, "t"),  # a kept axis outside the reduced one
    (bf16, {"x": 3, "r": 50, "y": 5, "s": 7, "c": 16}, ("r", "s")),  # kept axes between
    (f32, {"r": 100, "c": 64, "u": 1}, "r"),  # a unit axis after the kept one
    (f64, {"r": 70000, "c": 3}, "r"),  # three long columns: many chunks, one tile
    (bf16, {"t": 512, "g": 4, "c": 1024}, "g"),  # a query group's 4 heads: a thread a vector
    (f32, {"t": 100, "g": 16, "c": 260}, "g"),  # 16 rows: a thread each, a partial last tile
]


@pytest.mark.parametrize(
    ("dtype", "shape", "reduced"),
    SUMS,
    ids=lambda x: str(x) if not isinstance(x, dict) else "x".join(map(str, x.values())),
)
def test_column_sums_match_numpy(gpu, dtype, shape, reduced):
    program = _sum_program(dtype, shape, reduced)
    x = _values(dtype, tuple(shape.values()), np.random.default_rng(1))
    [got] = _run_cuda(program, [x])
    axes = tuple(
        list(shape).index(a) for a in ((reduced,) if isinstance(reduced, str) else reduced)
    )
    _assert_sum(got, x.astype(np.float64), axes, dtype, f"{dtype} {shape}")


def test_bf16_sums_accumulate_in_f32_when_asked(gpu):
    program = _sum_program(bf16, {"r": 8192, "c": 768}, "r", accumulate=f32)
    x = _values(bf16, (8192, 768), np.random.default_rng(2))
    [got] = _run_cuda(program, [x])
    assert got.dtype == np.float32
    _assert_sum(got, x.astype(np.float64), (0,), f32, "bf16 summed into f32")


def test_int32_column_sums_are_exact(gpu):
    program = _sum_program(i32, {"r": 6000, "c": 200}, "r")
    x = _values(i32, (6000, 200), np.random.default_rng(3))
    [got] = _run_cuda(program, [x])
    np.testing.assert_array_equal(got, x.sum(axis=0, dtype=np.int32))


@pytest.mark.parametrize(
    ("dtype", "rows", "columns", "reducer"),
    [
        (bf16, 8192, 768, "max"),
        (f32, 1025, 33, "min"),
        (f16, 4096, 80, "max"),
        (f64, 3000, 64, "min"),
        (f16, 20000, 2, "max"),
    ],
)
def test_column_max_and_min_are_exact(gpu, dtype, rows, columns, reducer):
    program = accy.trace.define(
        reducer, [spec(dtype, r=rows, c=columns)], lambda b, a: getattr(a[0], reducer)("r")
    )
    x = _values(dtype, (rows, columns), np.random.default_rng(4))
    [got] = _run_cuda(program, [x])
    want = getattr(np, reducer)(x, axis=0)
    np.testing.assert_array_equal(comparable(got), comparable(want))


def test_a_fused_product_of_two_arrays_and_a_row_scale(gpu):
    # dy * xhat * rstd[r]: LayerNorm's gain gradient. CUDA keeps a fused expression's bf16
    # values in float32 (`Dialect.rounds_each_half_operation`): the products are not rounded.
    types = [spec(bf16, r=8192, c=768), spec(bf16, r=8192, c=768), spec(bf16, r=8192)]
    program = accy.trace.define(
        "gain_gradient", types, lambda b, a: (a[0] * (a[1] * a[2])).sum("r")
    )
    rng = np.random.default_rng(5)
    dy, xhat, scale = (_values(bf16, t.extents, rng) for t in program.parameter_types)
    [got] = _run_cuda(program, [dy, xhat, scale])
    terms = dy.astype(np.float64) * (xhat.astype(np.float64) * scale.astype(np.float64)[:, None])
    _assert_sum(got, terms, (0,), bf16, "dy * (xhat * scale)")


@pytest.mark.parametrize("view", ["sliced", "transposed"])
def test_non_contiguous_views(gpu, view):
    if view == "sliced":  # starts one element into each row: no 16-byte loads
        types = [spec(f32, r=4096, c=769)]
        program = accy.trace.define("v", types, lambda b, a: a[0].slice("c", 1, 769).sum("r"))
        x = _values(f32, (4096, 769), np.random.default_rng(6))
        terms = x[:, 1:]
    else:  # columns strided in memory
        types = [spec(f32, c=300, r=2000)]
        program = accy.trace.define("v", types, lambda b, a: a[0].transpose("r", "c").sum("r"))
        x = _values(f32, (300, 2000), np.random.default_rng(6))
        terms = x.T
    [got] = _run_cuda(program, [x])
    _assert_sum(got, terms.astype(np.float64), (0,), f32, view)


def test_misaligned_buffers_give_the_same_sums(gpu):
    import cupy

    program = _sum_program(bf16, {"r": 8192, "c": 768}, "r")
    x = _values(bf16, (8192, 768), np.random.default_rng(7))
    executable = accy.compile(program, device="cuda")
    base = cupy.zeros(x.nbytes + 2, dtype=cupy.uint8)
    moved = base[2:]
    moved.set(x.reshape(-1).view(np.uint8))
    out = cupy.zeros(768 * 2 + 2, dtype=cupy.uint8)[2:]
    executable.run_buffers([moved], [out])
    got = cupy.asnumpy(out).view(bf16.numpy)
    _assert_sum(got, x.astype(np.float64), (0,), bf16, "misaligned")


def test_replays_give_the_same_bits_and_new_inputs_new_sums(gpu):
    # Each run replays one CUDA graph: the arrival counters must be zero again after a run,
    # or the next run's last block would be the wrong one (or none) and the sums wrong.
    def body(b, a):
        return a[0].sum("r"), (a[0] * a[1]).sum("r"), a[2].sum("r")

    types = [spec(bf16, r=8192, c=768)] * 2 + [spec(f32, r=4096, c=3072)]
    program = accy.trace.define("three", types, body)
    executable = accy.compile(program, device="cuda")
    rng = np.random.default_rng(8)
    for _ in range(2):
        inputs = [_values(t.dtype, t.extents, rng) for t in program.parameter_types]
        import cupy

        runs = [[cupy.asnumpy(y) for y in executable(*inputs)] for _ in range(3)]
        for later in runs[1:]:
            for a, b in zip(runs[0], later, strict=True):
                np.testing.assert_array_equal(comparable(a), comparable(b))
        x, y, z = inputs
        products = x.astype(np.float64) * y.astype(np.float64)  # in float32, not rounded
        _assert_sum(runs[0][0], x.astype(np.float64), (0,), bf16, "x")
        _assert_sum(runs[0][1], products, (0,), bf16, "x * y")
        _assert_sum(runs[0][2], z.astype(np.float64), (0,), f32, "z")
