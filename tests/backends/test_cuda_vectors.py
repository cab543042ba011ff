"""Vector loads and stores in the CUDA backend's elementwise and reduction kernels
(`accy.backends.cuda.vectors`): where the generated source uses them (no GPU needed), and, on
a GPU, that the vector path, its scalar tail and its fallback for misaligned buffers compute
what the reference evaluator does, in every float dtype."""

from __future__ import annotations

import re

import numpy as np
import pytest

import accy
from accy import bf16, f16, f32, f64, i32, spec
from accy.backends.cuda import compile_program
from accy.backends.cuda.reductions import choose_cut
from accy.backends.cuda.schedule import Batched
from accy.kernel import toolchain

from ..executors import cuda_device_or_skip, native_cuda, needs_nvcc
from ..halves import assert_close_scaled, comparable
from .cuda_emulation import emulate_kernel

FLOATS = [f32, f64, f16, bf16]
STORAGE = {f32: "float", f64: "double", f16: "accy_half", bf16: "uint16_t"}
LANES = {f32: 4, f64: 2, f16: 8, bf16: 8}
# Relative tolerance per dtype: a few units in the last place of the format (reductions add in
# another order than the reference; halves round after every operation).
RTOL = {f64: 1e-10, f32: 1e-4, f16: 2.0**-8, bf16: 2.0**-5}


def _elementwise(dtype, n=20003):
    # Flat: one counter; 20003 is not a multiple of any lane width, so the tail loop runs.
    return accy.trace.define(
        "flat", [spec(dtype, n=n)] * 2, lambda b, a: (a[0] * a[1]).tanh() + a[0]
    )


def _broadcast(dtype, rows=201, cols=96):
    # Per axis (the bias and scale broadcast along rows): vectors along the innermost axis.
    return accy.trace.define(
        "scale_shift",
        [spec(dtype, row=rows, col=cols), spec(dtype, col=cols), spec(dtype, col=cols)],
        lambda b, a: a[0] * a[1] + a[2],
    )


def _odd(dtype):
    # The innermost extent (7) takes no vector: scalar code only.
    return accy.trace.define(
        "odd", [spec(dtype, row=5, col=7), spec(dtype, col=7)], lambda b, a: a[0] - a[1]
    )


def _row_sum_exp(dtype, rows=12, cols=8200):
    # Long rows: a block per row, one pass, vector loads.
    return accy.trace.define(
        "row_sum_exp", [spec(dtype, row=rows, v=cols)], lambda b, a: a[0].exp().sum("v")
    )


def _row_max(dtype, rows=80, cols=264):
    return accy.trace.define("row_max", [spec(dtype, row=rows, v=cols)], lambda b, a: a[0].max("v"))


def _total(dtype, n=40000):
    # A sum, not of squares: 40000 squares would overflow f16 (and the test would compare inf).
    return accy.trace.define("total", [spec(dtype, n=n)], lambda b, a: (a[0] * 0.5).sum("n"))


def _columns(dtype, batch=2, tokens=128, width=96):
    # A bias gradient: the innermost axis kept, each thread `width` adjacent results.
    return accy.trace.define(
        "columns",
        [spec(dtype, b=batch, t=tokens, c=width)],
        lambda b, a: (a[0] * 2.0).sum(("b", "t")),
    )


def _unit_columns(dtype):
    # A reduction over an axis of one element: elementwise in all but name.
    return accy.trace.define(
        "unit_columns", [spec(dtype, b=1, t=200, c=96)], lambda b, a: (a[0] + 1.0).sum("b")
    )


def _cross_entropy(dtype, rows=16, classes=4104):
    program = accy.trace.define(
        "cross_entropy",
        [spec(dtype, row=rows, v=classes), spec(i32, row=rows)],
        lambda b, a: accy.nn.cross_entropy(a[0], a[1], "v").mean("row"),
    )
    return accy.value_and_grad(program, wrt=[0])


def _layer_norm(dtype, rows=64, cols=768):
    program = accy.trace.define(
        "layer_norm",
        [spec(dtype, row=rows, col=cols), spec(dtype, col=cols)],
        lambda b, a: (accy.nn.layer_norm(a[0], "col") * a[1]).sum(),
    )
    return accy.value_and_grad(program, wrt=[0, 1])


def _bucket_slices(dtype, n=16384):
    # A data-parallel optimizer's updates: gradients read as contiguous slices of one stored
    # buffer (the all-reduced bucket), at offsets 0 and n, in one group kernel.
    def body(b, args):
        bucket, m1, v1, m2, v2 = args
        bucket = bucket * 0.5
        g1, g2 = bucket.slice("n", 0, n), bucket.slice("n", n, 2 * n)
        return m1 * 0.9 + g1 * 0.1, v1 * 0.95 + g1 * g1, m2 * 0.9 + g2 * 0.1, v2 * 0.95 + g2 * g2

    return accy.trace.define("bucket_slices", [spec(dtype, n=2 * n)] + [spec(dtype, n=n)] * 4, body)


def _adamw(dtype, n=20480):
    # Two parameters' AdamW updates in one loop (f32 masters, gradients in `dtype`): 12 f32
    # streams and 2 of `dtype`, too many registers at 8 lanes a thread.
    def body(b, args):
        updated = []
        for p, m, v, g in (args[:4], args[4:]):
            g = g.convert(f32)
            m = m * 0.9 + g * 0.1
            v = v.abs() * 0.95 + g * g * 0.05  # a second moment (the inputs are normal)
            updated += [p - m / ((v + 1e-8).sqrt()) * 1e-3, m, v]
        return tuple(updated)

    return accy.trace.define("adamw", ([spec(f32, n=n)] * 3 + [spec(dtype, n=n)]) * 2, body)


def _optimizer_order(dtype, sizes=(20480, 16384, 20480, 20480)):
    # AdamW as an optimizer traces it (every parameter's moments, the bias corrections of the
    # step count, then every update), simplified as a jitted step is: the updates move up into
    # their moments' groups, three parameters of one shape and one of another.
    def body(b, args):
        step, params = args[0], [args[1 + 4 * k : 5 + 4 * k] for k in range(len(sizes))]
        moments = []
        for _, m, v, g in params:
            g = g.convert(f32)
            moments.append((m * 0.9 + g * 0.1, v.abs() * 0.95 + g * g * 0.05))
        first, second = step * step * 0.1 + 1.0, step * step * 0.05 + 1.0
        updated = [
            p - (m / first / ((v / second).sqrt() + 1e-8) + p * 0.01) * 1e-3
            for (p, _, _, _), (m, v) in zip(params, moments, strict=True)
        ]
        return (*updated, *(x for pair in moments for x in pair))

    types = [spec(f32)]
    for n in sizes:
        types += [spec(f32, n=n)] * 3 + [spec(dtype, n=n)]
    return accy.simplify(accy.trace.define("optimizer_order", types, body))


def _embedding_gradient(dtype, rows=1000, tokens=512, width=64):
    # A token table's gradient: the updates of 4 x 128 tokens (many repeated) added at their
    # rows (bf16's in a float32 accumulator, then rounded).
    def body(b, a):
        return b.zeros(spec(dtype, v=rows, c=width)).scatter_add(a[0], a[1], "v")

    indices, updates = spec(i32, s=4, t=tokens // 4), spec(dtype, s=4, t=tokens // 4, c=width)
    return accy.trace.define("embedding_gradient", [indices, updates], body)


VECTORIZED = [
    _elementwise,
    _broadcast,
    _row_sum_exp,
    _row_max,
    _total,
    _columns,
    _unit_columns,
    _cross_entropy,
    _layer_norm,
    _bucket_slices,
]
PROGRAMS = [*VECTORIZED, _odd, _adamw, _optimizer_order, _embedding_gradient]


def _inputs(program, rng) -> list[np.ndarray]:
    arrays = []
    for t in program.parameter_types:
        if t.dtype == i32:
            classes = program.parameter_types[0].extents[-1]
            arrays.append(rng.integers(0, classes, t.extents).astype(np.int32))
        else:
            arrays.append((rng.standard_normal(t.extents) * 1.5).astype(t.dtype.numpy))
    return arrays


def _vector_types(source: str) -> set[str]:
    return set(re.findall(r"accy_vector<(\w+), (\d+)>", source))


# The generated source (no GPU) ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("build", VECTORIZED, ids=lambda f: f.__name__.strip("_"))
def test_kernels_load_and_store_16_bytes_at_a_time(build, dtype):
    source = compile_program(build(dtype)).source
    assert (STORAGE[dtype], str(LANES[dtype])) in _vector_types(source)
    # Each vector path keeps its scalar fallback, taken where a pointer is misaligned.
    assert source.count("& 15)") >= 1


@pytest.mark.parametrize(("dtype", "lanes"), [(bf16, 4), (f16, 4), (f32, 4), (f64, 2)], ids=str)
def test_a_loop_of_many_streams_takes_fewer_lanes(dtype, lanes):
    # 8 lanes of 14 streams would be 416 bytes of values a thread (150 registers for GPT-2's
    # AdamW): 4 lanes keep the f32 streams' 16-byte vectors, the halves' 8 bytes.
    types = _vector_types(compile_program(_adamw(dtype)).source)
    assert ("float", str(lanes)) in types
    assert all(width == str(lanes) for _, width in types), types


@pytest.mark.parametrize(("dtype", "kernels"), [(bf16, 2), (f16, 2), (f32, 2), (f64, 1)], ids=str)
def test_independent_updates_too_wide_for_registers_are_one_kernel_each(dtype, kernels):
    # Two parameters' AdamW updates share no stream: at their fewest lanes (4) the halves'
    # and f32 gradients' 14 streams hold 208-224 bytes of lane values a thread, so each
    # update is its own launch of one kernel; f64 gradients' 2 lanes hold 128 bytes, one launch.
    # The two launches touch different buffers: the schedule batches them into one.
    _assert_one_kernel_per_update(compile_program(_adamw(dtype)), kernels)


def _assert_one_kernel_per_update(compiled, kernels: int) -> None:
    """`compiled` runs `kernels` launches of one kernel in plan order; more than one are
    batched into one launch."""
    schedule = compiled.schedule
    names = [action.kernel for action in schedule.serial or schedule.actions]
    assert len(names) == kernels and len(set(names)) == 1, names
    if kernels > 1:
        (batched,) = schedule.actions
        assert isinstance(batched, Batched) and len(batched.members) == kernels


def test_updates_sharing_only_splat_constants_are_still_independent():
    # Simplification makes one value of each splat constant (0.9, 0.95...) for both updates;
    # recomputing a constant is no shared work, so the updates stay a kernel each.
    _assert_one_kernel_per_update(compile_program(accy.simplify(_adamw(bf16))), 2)


def test_each_parameter_of_an_optimizer_group_is_a_part_and_one_shape_one_launch():
    # Three parameters of 20480 elements: their moments and updates one group, a kernel per
    # parameter, launched as one; the parameter of 16384 elements a group of its own.
    compiled = compile_program(_optimizer_order(bf16))
    groups = [s for s in compiled.plan.steps if s.kind == "group"]
    assert sorted(len(s.members) for s in groups) == [3, 9]
    batched = [a for a in compiled.schedule.actions if isinstance(a, Batched)]
    assert [len(a.members) for a in batched] == [3]


def test_bf16_scatter_sums_are_rounded_8_values_a_thread():
    # bf16 sums go into a float32 accumulator, rounded into the result with two 16-byte loads
    # and one 16-byte store a thread where both buffers are aligned.
    source = compile_program(_embedding_gradient(bf16)).source
    assert "accy_vector<uint16_t, 8> r;" in source
    assert "accy_vector<uint16_t, 8> r;" not in compile_program(_embedding_gradient(f32)).source


def test_updates_that_share_a_stream_stay_one_kernel():
    # Both updates read the same gradient: one kernel loads it once for both.
    def body(b, a):
        g = a[4].convert(f32)
        return tuple(
            x for p, m in (a[0:2], a[2:4]) for x in (p - (m * 0.9 + g) * 1e-3, m * 0.9 + g)
        )

    program = accy.trace.define("shared", [spec(f32, n=20480)] * 4 + [spec(bf16, n=20480)], body)
    assert len(compile_program(program).schedule.actions) == 1


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_an_innermost_extent_no_vector_divides_keeps_scalar_code(dtype):
    assert _vector_types(compile_program(_odd(dtype)).source) == set()


def test_small_loops_stay_scalar():
    # Latency-bound: vectors would cost code and compile time for nothing.
    assert _vector_types(compile_program(_elementwise(bf16, n=4096)).source) == set()
    assert _vector_types(compile_program(_row_sum_exp(bf16, rows=2, cols=4096)).source) == set()


def test_a_flat_loop_of_odd_length_ends_in_a_scalar_tail():
    source = compile_program(_elementwise(bf16, n=20003)).source
    assert "vector_end = vectorized ? 20000LL : 0LL" in source
    assert "i = vector_end + " in source


def test_a_long_row_is_one_block_and_one_pass():
    compiled = compile_program(_row_sum_exp(bf16, rows=8192, cols=50304))
    assert "(combine)" not in compiled.source
    assert choose_cut(8192, 50304, True, width=8).lanes == 256
    assert ("uint16_t", "8") in _vector_types(compiled.source)


def test_a_misaligned_view_and_a_transpose_are_read_element_by_element():
    # x[:, 1:] starts one element into the buffer: no 16-byte load can reach it, so only the
    # result is stored as vectors; the same for a transposed read.
    sliced = accy.trace.define(
        "sliced",
        [spec(f32, row=256, col=129)],
        lambda b, a: a[0].slice("col", 1, 129) * 2.0,
    )
    transposed = accy.trace.define(
        "transposed",
        [spec(f32, row=128, col=128), spec(f32, col=128, row=128)],
        lambda b, a: a[0] + a[1].transpose("row", "col"),
    )
    for program in (sliced, transposed):
        source = compile_program(program).source
        stores = re.findall(r"\*\(accy_vector<float, 4> \*\)\(v\d+ \+ i\) = t\d+;", source)
        assert stores, source
        if program is sliced:
            assert "const accy_vector" not in source


@pytest.mark.parametrize("shift", [0, 4])
@pytest.mark.parametrize("start", [256, 257])
@pytest.mark.slow
def test_a_contiguous_slice_at_an_offset_is_read_as_vectors_where_aligned(start, shift):
    # As a gradient read out of a data-parallel step's all-reduced bucket: x[256:] starts 1 KB
    # into its buffer, so 16-byte loads reach it; x[257:] does not (scalar loads). The kernel
    # run on the CPU (blocks in shuffled orders), with the buffers aligned and misaligned (the
    # scalar loop).
    n = 16384
    program = accy.trace.define(
        "offset", [spec(f32, n=start + n)], lambda b, a: a[0].slice("n", start, start + n) * 2.0
    )
    compiled = compile_program(program)
    # The slice is read through a pointer to its first element (`o0`, its address in the
    # launch's table), so that the kernel's text does not depend on where the slice starts.
    assert "o0[i]" in compiled.source and f"i + {start}" not in compiled.source
    vector_load = "*(const accy_vector<float, 4> *)(o0 + i)"
    assert (vector_load in compiled.source) == (start % 4 == 0)
    [launch] = compiled.schedule.actions
    x = np.linspace(-1, 1, start + n, dtype=np.float32)
    # The launch's table: the input (source 0) and the output (source 1), each at its offset.
    pool = compiled.schedule.pool[launch.io : launch.io + 2]
    table = tuple((address.source, address.offset) for address in pool)
    assert sorted(table) == [(0, 4 * start), (1, 0)]
    runs = emulate_kernel(
        compiled.source, launch.kernel, launch.grid, x, np.float32, (n,), shift, table=table
    )
    for out in runs:
        np.testing.assert_array_equal(out, x[start:] * 2)


@pytest.mark.slow
@pytest.mark.parametrize("shift", [0, 4])
def test_a_value_rounded_to_bf16_is_stored_as_its_high_half(shift):
    # The f32 result converted to bf16 is a rounded value: the vector loop stores its high half
    # (`accy_bf16_bits`) rather than converting it a second time. 2049 vectors of 8 lanes and
    # a scalar tail of 5 (all of it scalar when misaligned), run on the CPU (blocks in
    # shuffled orders) against the reference's bits.
    n = 2049 * 8 + 5
    program = accy.trace.define(
        "rounded", [spec(f32, n=n)], lambda b, a: (a[0] * 1.5 + 0.25).convert(bf16)
    )
    compiled = compile_program(program)
    [launch] = compiled.schedule.actions
    kernel = compiled.source[compiled.source.index(f" {launch.kernel}(") :]
    vector_loop = kernel[: kernel.index("for (int64_t i = vector_end")]
    assert "vectorized ? 16392LL : 0LL" in vector_loop
    assert vector_loop.count("accy_bf16_bits(") == 8
    assert "accy_bf16_store(" not in vector_loop
    x = (np.random.default_rng(3).standard_normal(n) * 4).astype(np.float32)
    x[:3] = [np.nan, np.inf, -1e-40]  # a NaN, an infinity and an f32 subnormal keep their bits
    (want,) = accy.reference.run(program, [x])
    pool = compiled.schedule.pool[launch.io : launch.io + 2]
    table = tuple((address.source, address.offset) for address in pool)
    bits = np.asarray(want).view(np.uint16)
    for got in emulate_kernel(
        compiled.source, launch.kernel, 4, x, np.uint16, (n,), shift, 2, table
    ):
        np.testing.assert_array_equal(got, bits)


@needs_nvcc
@pytest.mark.slow
def test_the_vector_kernels_compile_to_vector_instructions():
    source = "".join(
        compile_program(build(dtype), prefix=f"p{n}_{dtype}_").source
        for n, build in enumerate(PROGRAMS)
        for dtype in FLOATS
    )
    ptx = toolchain.ptx_with_nvcc(source, "vector kernels", arch="compute_90")
    assert re.search(r"ld(\.global)?(\.nc)?\.v4\.", ptx)
    assert re.search(r"st(\.global)?\.v4\.", ptx)


# On a GPU ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu():
    return cuda_device_or_skip()


def _assert_close(got, want, dtype, what: str) -> None:
    assert_close_scaled(got, want, RTOL[dtype], what)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("build", PROGRAMS, ids=lambda f: f.__name__.strip("_"))
def test_vector_kernels_match_the_reference_on_cuda(gpu, build, dtype):
    program = build(dtype)
    inputs = _inputs(program, np.random.default_rng(7))
    got = native_cuda(program, inputs)
    want = accy.reference.run(program, inputs)
    for position, (g, w) in enumerate(zip(got, want, strict=True)):
        _assert_close(g, w, dtype, f"{program.name} {dtype} output {position}")


def _misaligned_copy(cupy, array: np.ndarray):
    """`array`'s bytes on the device, one element into an allocation: aligned for its scalar
    loads, not for 16-byte vectors."""
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    shift = array.dtype.itemsize
    base = cupy.zeros(raw.nbytes + shift, dtype=cupy.uint8)
    view = base[shift:]
    view.set(raw)
    return view


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("build", [_elementwise, _broadcast, _row_sum_exp, _total, _columns])
def test_misaligned_buffers_take_the_scalar_path_with_the_same_results(gpu, build, dtype):
    import cupy

    program = build(dtype)
    inputs = _inputs(program, np.random.default_rng(11))
    executable = accy.compile(program, device="cuda")
    aligned = [
        cupy.asnumpy(x).view(t.dtype.numpy)
        for x, t in zip(executable(*inputs), program.output_types, strict=True)
    ]
    device_inputs = [_misaligned_copy(cupy, x) for x in inputs]
    outputs = [
        _misaligned_copy(cupy, np.zeros(t.extents, t.dtype.numpy)) for t in program.output_types
    ]
    executable.run_buffers(device_inputs, outputs)
    want = accy.reference.run(program, inputs)
    for position, (out, t) in enumerate(zip(outputs, program.output_types, strict=True)):
        got = cupy.asnumpy(out).view(t.dtype.numpy).reshape(t.extents)
        what = f"{program.name} {dtype} output {position}"
        if build in (_elementwise, _broadcast):
            # Element for element the same arithmetic on either path: the same bits.
            np.testing.assert_array_equal(comparable(got), comparable(aligned[position]), what)
        _assert_close(got, want[position], dtype, what)
