"""The CUDA backend without a GPU (CI): the generated CUDA C of every test program compiles
with `nvcc -ptx`, and the schedule makes the choices the design promises."""

from __future__ import annotations

import subprocess
import sys

import pytest

import accy
import accy.compat
from accy import bf16, f16, f32, spec
from accy.backends.cuda import compile_program, cublas
from accy.backends.cuda.reductions import choose_cut
from accy.backends.cuda.schedule import SCRATCH, External, Gemm, Launch
from accy.kernel import Limits, toolchain
from accy.kernel.examples import CUSTOM_DOUBLE_TARGET, custom_double_kernel

from ..executors import needs_nvcc
from .kind_programs import CASES


def _custom_call_program():
    def body(b, args):
        doubled = b.custom_call(CUSTOM_DOUBLE_TARGET, 1, [args[0].exp()], args[0].ty)
        return doubled.sum(), doubled

    return accy.trace.define("custom", [spec(f32, lane=4)], body)


def _registry(size: int = 4):
    artifact = custom_double_kernel(size).create_kernel_call_artifact(
        Limits.testing, None, target=CUSTOM_DOUBLE_TARGET, version=1, format="cuda_ptx"
    )
    return artifact.registry()


@needs_nvcc
@pytest.mark.slow
def test_the_cuda_c_of_every_test_program_compiles_with_nvcc():
    # One translation unit (distinct symbol prefixes, the prelude guarded): one nvcc run.
    compiled = [compile_program(case.build(), prefix=f"p{n}_") for n, case in enumerate(CASES)]
    compiled.append(compile_program(_custom_call_program(), _registry(), prefix="custom_"))
    source = "".join(c.source for c in compiled)
    ptx = toolchain.ptx_with_nvcc(source, "the CUDA backend's test programs", arch="compute_90")
    for c in compiled:
        for kernel in c.kernels:
            assert f".entry {kernel}(" in ptx


@pytest.mark.slow
@needs_nvcc
def test_the_cuda_c_of_a_chain_of_thousands_of_operations_compiles():
    # The expression builder (shared with the CPU) recursed once per fused operation.
    def body(b, args):
        x, a = args
        for i in range(1000):
            x = (x * a).tanh() if i % 4 == 0 else x * a + 0.5
        return x

    program = accy.trace.define("long_chain", [spec(f32, n=8)] * 2, body)
    compiled = compile_program(program)
    ptx = toolchain.ptx_with_nvcc(compiled.source, "a long chain", arch="compute_90")
    assert all(f".entry {kernel}(" in ptx for kernel in compiled.kernels)


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("arch, rounding", [("compute_90", True), ("compute_75", False)])
def test_bf16_rounds_in_one_instruction_where_the_gpu_has_it(arch, rounding):
    # A chain of bf16 operations rounds after each; in software that made kernels compute-bound.
    program = accy.trace.define(
        "bf16_chain", [spec(bf16, n=8)] * 2, lambda b, a: (a[0] * a[1] + a[0]).tanh()
    )
    ptx = toolchain.ptx_with_nvcc(compile_program(program).source, "a bf16 chain", arch=arch)
    assert ("cvt.rn.bf16.f32" in ptx) == rounding


@needs_nvcc
def test_the_cuda_c_of_scatters_into_empty_tables_compiles():
    from ..differential.test_hardening import empty_scatter_program

    compiled = [
        compile_program(empty_scatter_program(dtype), prefix=f"p{n}_")
        for n, dtype in enumerate((f32, f16, bf16))
    ]
    source = "".join(c.source for c in compiled)
    toolchain.ptx_with_nvcc(source, "scatters into empty tables", arch="compute_90")


@needs_nvcc
def test_a_custom_call_is_an_external_launch_with_staged_buffers():
    compiled = compile_program(_custom_call_program(), _registry())
    (external,) = [a for a in compiled.schedule.actions if isinstance(a, External)]
    assert external.block == (4, 1, 1) and external.grid == (1, 1, 1)
    assert all(address.fixed for address in external.arguments)


def _scanned_custom_call_program(computed: bool):
    # A custom call on each row (64 f32: 256 bytes, aligned as scratch) of a stacked value:
    # the program's parameter itself (its address moves from call to call), or its exp (in
    # the workspace: fixed addresses).
    def body(b, args):
        rows = args[0].exp() if computed else args[0]

        def step(b, a):
            (total, row) = a
            doubled = b.custom_call(CUSTOM_DOUBLE_TARGET, 1, [row], row.ty)
            return total + doubled.sum(), doubled

        (total,), (ys,) = b.scan(step, carries=[b.scalar(f32, 0.0)], xs=[rows], axis="t")
        return total, ys.exp()

    return accy.trace.define("scanned_custom", [spec(f32, t=3, lane=64)], body)


def _copies(compiled) -> int:
    return sum(
        1
        for a in compiled.schedule.actions
        if isinstance(a, Launch) and "copy" in compiled.kernel_comments.get(a.kernel, "")
    )


@pytest.mark.slow
@needs_nvcc
def test_a_scanned_custom_call_copies_only_the_rows_whose_addresses_move():
    # Unrolled, each iteration knows where its row is: a row of the workspace is read in
    # place, a row of the invocation's input is copied into scratch first, every iteration;
    # either way the result goes in place into the scan's stacked output (the workspace).
    moving = compile_program(_scanned_custom_call_program(False), _registry(64))
    fixed = compile_program(_scanned_custom_call_program(True), _registry(64))
    calls = {}
    for name, compiled in (("moving", moving), ("fixed", fixed)):
        calls[name] = [a.arguments for a in compiled.schedule.actions if isinstance(a, External)]
        assert len(calls[name]) == 3
        assert all(dst.fixed and dst.source != SCRATCH for dst, _ in calls[name])
    assert all(x.source == SCRATCH for _, x in calls["moving"])
    rows = [x for _, x in calls["fixed"]]
    assert all(x.fixed and x.source != SCRATCH for x in rows) and len(set(rows)) == 3
    assert _copies(moving) == _copies(fixed) + 3


@pytest.mark.slow
def test_importing_accy_never_imports_cupy():
    code = "import sys, accy; accy.backends.cuda.platform_supported(); print('cupy' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


def test_compile_fragment_makes_a_cuda_artifact_without_a_gpu():
    program = accy.trace.define("twice", [spec(f32, lane=4)], lambda b, a: a[0] * 2.0)
    options = accy.compat.lower.FragmentCompilerOptions(artifact_format="cuda_c")
    compiled = accy.compat.lower.compile_fragment(accy.compat.gpu.cuda.Handle(), program, options)
    assert compiled.artifact_format == "cuda_c"
    assert [type(a) for a in compiled.schedule.actions] == [Launch]
    assert 'extern "C" __global__' in compiled.source


def test_single_gemms_stage_invocation_buffers_through_scratch():
    # cublasGemmBatchedEx does not split long contractions, so a single GEMM gets fixed
    # addresses: its operands and result that live in the invocation's buffers are copied.
    def body(b, args):
        x, w = args
        return x.contract(w, "k").tanh().contract(w.rename("k", "q"), "n").sum()

    types = [spec(f32, b=2, m=3, k=4), spec(f32, k=4, n=4)]
    actions = compile_program(accy.trace.define("chain", types, body)).schedule.actions
    gemms = [a for a in actions if isinstance(a, Gemm)]
    assert gemms and all(g.arrays is None and g.batch == 1 for g in gemms)
    assert any(SCRATCH in (g.a.source, g.b.source, g.c.source) for g in gemms)


def test_short_contractions_into_large_results_are_a_kernel_not_cublas():
    def body(b, args):
        return args[0].contract(args[1], "k")

    def actions(k, n):
        types = [spec(f32, m=2048, k=k), spec(f32, k=k, n=n)]
        return compile_program(accy.trace.define("short", types, body)).schedule.actions

    assert not any(isinstance(a, Gemm) for a in actions(10, 512))
    assert any(isinstance(a, Gemm) for a in actions(17, 512))  # long enough for cuBLAS
    assert any(isinstance(a, Gemm) for a in actions(10, 4))  # a small result: one launch anyway


def test_batched_gemms_that_touch_invocation_buffers_read_pointer_arrays():
    def body(b, args):
        return args[0].contract(args[1], "k").sum()

    types = [spec(f32, b=2, m=3, k=4), spec(f32, b=2, k=4, n=5)]
    actions = compile_program(accy.trace.define("batched", types, body)).schedule.actions
    gemms = [a for a in actions if isinstance(a, Gemm)]
    assert gemms and all(g.batch == 2 and g.arrays is not None for g in gemms)


def test_work_is_cut_by_shape_alone():
    assert choose_cut(1, 1 << 24, True).lanes == 256  # one result: whole blocks, chunked
    assert choose_cut(1, 1 << 24, True).chunks > 1
    assert choose_cut(8192, 256, True).lanes == 32  # many rows: a warp each
    assert choose_cut(8192, 256, False).lanes == 1  # columns: a thread each
    assert choose_cut(3, 50_000, False).chunks > 1  # few long columns: chunked
    assert choose_cut(3, 2048, True, split=False).chunks == 1  # combining partials: final


def test_partial_values_are_combined_by_a_final_pass():
    types = [spec(f32, few=3, step=50_000)]
    program = accy.trace.define("rows", types, lambda b, a: a[0].sum("step"))
    source = compile_program(program).source
    combine = source[source.index("(combine)") :]
    assert "part0[o * " in combine and "+ g]" not in combine  # reads partials, writes results


@pytest.mark.parametrize(
    ("dtype", "accumulate", "result"),
    [(bf16, None, "bf16"), (bf16, f32, "f32"), (f16, None, "f16")],
)
def test_half_contractions_are_cublas_gemms_accumulating_in_f32(dtype, accumulate, result):
    types = [spec(dtype, m=64, k=32), spec(dtype, k=32, n=48)]
    program = accy.trace.define(
        "half_gemm", types, lambda b, a: a[0].contract(a[1], "k", accumulate=accumulate)
    )
    (gemm,) = [a for a in compile_program(program).schedule.actions if isinstance(a, Gemm)]
    assert (gemm.dtype, gemm.out) == (dtype.name, result)
    data, out, compute, scalar = cublas.gemm_types(gemm, tf32=True)
    assert data == cublas.DATA_TYPES[dtype.name] and out == cublas.DATA_TYPES[result]
    assert (compute, scalar) == (cublas.COMPUTE_32F, "f32")  # TF32 never touches half GEMMs


def test_tf32_is_a_compile_option_and_part_of_the_cache_key():
    from accy.backends.base import CompileOptions

    at = accy.backends.cuda.schedule.Address(0)
    gemm = Gemm("f32", 0, 0, 2, 2, 2, at, 2, at, 2, at, 2)
    assert cublas.gemm_types(gemm)[2] == cublas.COMPUTE_32F
    assert cublas.gemm_types(gemm, tf32=True)[2] == cublas.COMPUTE_32F_FAST_TF32
    assert CompileOptions().key() != CompileOptions(precision="tf32").key()
    with pytest.raises(accy.AccyError, match="precision 'tf16' is not one of f32, tf32"):
        accy.compile(accy.trace.define("p", [spec(f32)], lambda b, a: a[0]), precision="tf16")


def test_without_a_gpu_cuda_tests_skip_naming_the_gate():
    from ..executors import cuda_gate

    reason = cuda_gate()
    assert reason is None or reason.startswith("cuda gate: ")
    if reason is not None:
        with pytest.raises(accy.RuntimeUnavailable):
            accy.compat.gpu.cuda.State.init_device(0)


def test_a_missing_custom_kernel_is_named_at_compile_time():
    program = _custom_call_program()
    with pytest.raises(accy.AccyError, match="no kernel to link to"):
        compile_program(program)
