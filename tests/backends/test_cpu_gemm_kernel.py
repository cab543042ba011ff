"""accy's own float32 GEMM (`accy.backends.cpu.gemm`): every layout of the operands (each
transposed or not), tiles cut at every edge (rows not a multiple of 12, columns not of 32,
depths not of 256, more than one 1024-column block), the shapes it hands to the BLAS, and bf16
operands, against NumPy's float64 product within an f32 GEMM's rounding bound; and the choice
(`accy.config.cpu_gemm_kernel`) is in the generated source."""

from __future__ import annotations

import ctypes
import dataclasses
import os

import ml_dtypes
import numpy as np
import pytest

import accy
from accy.backends.cpu import gemm
from accy.backends.cpu.blas import find_blas
from accy.backends.cpu.compile import compile_program
from accy.backends.cpu.steps.dot import PARALLEL_GEMM_MNK

needs_kernel = pytest.mark.skipif(
    not gemm.cpu_has_avx512() or find_blas() is None, reason="the CPU has no AVX-512F, or no BLAS"
)


@pytest.fixture(autouse=True)
def _every_product_takes_the_kernel(monkeypatch):
    """The small products here use the kernel too (by default a program needs 2^26
    multiply-adds of GEMMs); executables compiled under the default are dropped."""
    monkeypatch.setattr(gemm, "SMALLEST_GEMM_WORK", 0)
    accy.clear_caches()
    yield
    accy.clear_caches()


def gemm_bound(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """What an f32 GEMM may be off by: k * 2^-24 * (|a| |b|), sums in any order."""
    return a.shape[1] * 2.0**-24 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))


def product_program(
    m: int, n: int, k: int, a_transposed: bool, b_transposed: bool, dtype, accumulate=None
):
    """out[m, n] = sum_k a b, with a stored [k, m] where a_transposed and b stored [n, k] where
    b_transposed (the layouts that make the generated code pass BLAS's transpose flags)."""
    a_axes = {"k": k, "m": m} if a_transposed else {"m": m, "k": k}
    b_axes = {"n": n, "k": k} if b_transposed else {"k": k, "n": n}
    types = [accy.spec(dtype, **a_axes), accy.spec(dtype, **b_axes)]

    def body(builder, args):
        out = args[0].contract(args[1], "k", accumulate=accumulate)
        return out.transpose("m", "n") if out.axes != ("m", "n") else out

    return accy.trace.define("product", types, body)


def run_product(m, n, k, a_transposed, b_transposed, dtype=accy.f32, seed=0, accumulate=None):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    if dtype == accy.bf16:
        a, b = a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16)
    program = product_program(m, n, k, a_transposed, b_transposed, dtype, accumulate)
    stored_a = np.ascontiguousarray(a.T) if a_transposed else a
    stored_b = np.ascontiguousarray(b.T) if b_transposed else b
    (out,) = accy.compile(program, device="cpu")(stored_a, stored_b)
    return np.asarray(out, np.float64), a.astype(np.float64), b.astype(np.float64), program


LAYOUTS = [(False, False), (True, False), (False, True), (True, True)]
# (m, n, k): whole tiles; rows, columns and depth cut at tile edges; two column blocks and
# three depth blocks; 16 columns (the narrowest it takes); one row; a last block of 4 rows and
# one of 8 (the kernel's shorter variants; 5 rows and 1 row take them too).
SHAPES = [
    (24, 64, 256),
    (37, 45, 300),
    (13, 1100, 530),
    (5, 16, 7),
    (1, 40, 33),
    (64, 48, 40),
    (20, 32, 16),
]


@pytest.mark.parametrize("a_transposed, b_transposed", LAYOUTS)
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_f32_products_match_numpy(native_cpu, m, n, k, a_transposed, b_transposed):
    out, a, b, _ = run_product(m, n, k, a_transposed, b_transposed)
    assert out.shape == (m, n)
    assert np.all(np.abs(out - a @ b) <= gemm_bound(a, b) + 1e-30)


@pytest.mark.parametrize("m, n, k", [(40, 10, 64), (300, 3, 500)])
def test_narrow_products_handed_to_blas_match_numpy(native_cpu, m, n, k):
    out, a, b, _ = run_product(m, n, k, False, False)
    assert np.all(np.abs(out - a @ b) <= gemm_bound(a, b) + 1e-30)


@pytest.mark.parametrize("a_transposed, b_transposed", [(False, False), (True, True)])
def test_bf16_products_summed_in_f32_match_numpy(native_cpu, a_transposed, b_transposed):
    out, a, b, program = run_product(
        29, 70, 260, a_transposed, b_transposed, accy.bf16, seed=1, accumulate=accy.f32
    )
    assert program.output_types[0].dtype == accy.f32
    assert np.all(np.abs(out - a @ b) <= gemm_bound(a, b) + 1e-30)


# k of one pass (the sums rounded straight from the registers) and of three (kept in float32
# between passes, rounded on the last); 20 columns, 10 (narrow: the packing path).
@pytest.mark.parametrize("m, n, k", [(29, 70, 200), (13, 45, 600), (30, 20, 40), (16, 10, 300)])
def test_bf16_products_rounded_once_match_numpy(native_cpu, m, n, k):
    out, a, b, program = run_product(m, n, k, False, True, accy.bf16, seed=4)
    assert program.output_types[0].dtype == accy.bf16
    if gemm.cpu_has_avx512() and find_blas() is not None:  # the kernel's path, or packing's
        assert ("accy_gemm_mixed(" in compile_program(program).source) == (n >= 16)
    exact = a @ b
    # within the f32 sums' bound, then one rounding to bf16 (half a unit in the last of 8 bits)
    assert np.all(np.abs(out - exact) <= gemm_bound(a, b) * 1.01 + np.abs(exact) * 2.0**-8)


def test_batched_bf16_products_match_numpy(native_cpu):
    types = [accy.spec(accy.bf16, head=3, row=20, k=40), accy.spec(accy.bf16, head=3, k=40, col=48)]
    program = accy.trace.define(
        "batched", types, lambda b, a: a[0].contract(a[1], "k", accumulate=accy.f32)
    )
    rng = np.random.default_rng(5)
    a = rng.standard_normal((3, 20, 40)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((3, 40, 48)).astype(ml_dtypes.bfloat16)
    (out,) = accy.compile(program, device="cpu")(a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    bound = 40 * 2.0**-24 * (np.abs(a64) @ np.abs(b64))
    assert np.all(np.abs(np.asarray(out, np.float64) - a64 @ b64) <= bound + 1e-30)


@pytest.mark.parametrize("dtype", [accy.f32, accy.bf16])
def test_threaded_bands_match_numpy(native_cpu, dtype):
    m, n, k = 400, 256, 200  # cut into bands that OpenMP threads run
    assert m * n * k >= PARALLEL_GEMM_MNK
    out, a, b, _ = run_product(m, n, k, False, True, dtype, seed=2, accumulate=accy.f32)
    assert np.all(np.abs(out - a @ b) <= gemm_bound(a, b) + 1e-30)


@needs_kernel
def test_the_choice_is_in_the_source_and_the_kernel_is_called(native_cpu, configure):
    program = product_program(24, 64, 32, False, False, accy.f32)
    chosen = compile_program(program)
    assert gemm.KERNEL in chosen.source and chosen.blas.sgemm_kernel == gemm.KERNEL
    blas = find_blas()
    loaded = gemm.with_gemm_kernel(chosen.blas, chosen.source)
    assert loaded.mixed_gemm != 0
    # float32 GEMMs: the BLAS's own where it has AVX-512 kernels, else the kernel's
    assert (loaded.sgemm == blas.sgemm) == blas.runs_avx512
    configure(cpu_gemm_kernel=False)
    plain = compile_program(program)
    assert gemm.KERNEL not in plain.source and plain.blas == blas
    assert plain.library_path != chosen.library_path  # never the same library


@needs_kernel
def test_programs_of_small_gemms_do_not_wait_for_the_kernel(monkeypatch):
    monkeypatch.setattr(gemm, "SMALLEST_GEMM_WORK", 1 << 26)
    from accy.lower.plan import build_plan

    blas = find_blas()
    small = build_plan(product_program(256, 256, 64, False, False, accy.f32))
    large = build_plan(product_program(512, 512, 256, False, False, accy.f32))
    assert gemm.gemm_work(small) == 256 * 256 * 64 and gemm.gemm_work(large) == 1 << 26
    assert gemm.choose_gemm_kernel(blas, small) == blas
    assert gemm.choose_gemm_kernel(blas, large).sgemm_kernel == gemm.KERNEL


@needs_kernel
def test_the_kernel_alone_matches_numpy_and_hands_over_what_it_does_not_serve(native_cpu):
    blas = find_blas()
    sgemm_address = gemm.kernel_sgemm(blas)
    integer = ctypes.c_int64 if blas.integer_bits == 64 else ctypes.c_int32
    pointer = ctypes.c_void_p
    arguments = [ctypes.c_int] * 3 + [integer] * 3 + [ctypes.c_float, pointer, integer]
    arguments += [pointer, integer, ctypes.c_float, pointer, integer]
    sgemm = ctypes.CFUNCTYPE(None, *arguments)(sgemm_address)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((20, 50)).astype(np.float32)
    b = rng.standard_normal((50, 40)).astype(np.float32)
    c = rng.standard_normal((20, 40)).astype(np.float32)
    expected = 2 * (a.astype(np.float64) @ b) + 0.5 * c
    # alpha 2 and beta 0.5: BLAS's own sgemm does it
    sgemm(101, 111, 111, 20, 40, 50, 2.0, a.ctypes.data, 50, b.ctypes.data, 40, 0.5,
          c.ctypes.data, 40)  # fmt: skip
    assert np.all(np.abs(c - expected) <= 2 * gemm_bound(a, b) + 1e-5)
    # a leading dimension wider than the row: a view into a larger array
    wide = np.zeros((20, 48), np.float32)
    sgemm(101, 111, 111, 20, 40, 50, 1.0, a.ctypes.data, 50, b.ctypes.data, 40, 0.0,
          wide.ctypes.data, 48)  # fmt: skip
    assert np.all(np.abs(wide[:, :40] - a.astype(np.float64) @ b) <= gemm_bound(a, b) + 1e-30)
    assert np.all(wide[:, 40:] == 0)


@needs_kernel
def test_a_kernel_the_compiler_rejects_is_a_clear_error(native_cpu, monkeypatch):
    monkeypatch.setattr(gemm, "SOURCE", "this is not C;")
    monkeypatch.setattr(gemm, "_loaded", {})
    with pytest.raises(accy.errors.CompileError, match="ACCY_CPU_GEMM_KERNEL=0"):
        gemm.with_gemm_kernel(
            dataclasses.replace(find_blas(), sgemm_kernel=gemm.KERNEL), "accy_sgemm("
        )


@pytest.mark.parametrize("dtype", [accy.f32, accy.bf16])
def test_a_two_layer_gradient_matches_the_reference(native_cpu, dtype):
    """Every GEMM of a value_and_grad (each operand transposed somewhere) on the kernel."""
    types = [
        accy.spec(dtype, row=40, embed=36),
        accy.spec(dtype, embed=36, ff=70),
        accy.spec(dtype, ff=70, embed=36),
    ]

    def loss(builder, args):
        x, w1, w2 = args
        hidden = x.contract(w1, "embed").tanh()
        out = hidden.contract(w2, "ff", accumulate=accy.f32 if dtype == accy.bf16 else None)
        return (out * out).sum()

    program = accy.value_and_grad(accy.trace.define("layers", types, loss), wrt=(1, 2))
    rng = np.random.default_rng(6)
    held = dtype.numpy
    inputs = [
        rng.standard_normal((40, 36)).astype(held),
        (rng.standard_normal((36, 70)) / 6).astype(held),
        (rng.standard_normal((70, 36)) / 8).astype(held),
    ]
    got = accy.compile(program, device="cpu")(*inputs)
    want = accy.reference.run(program, inputs)
    tolerance = 1e-5 if dtype == accy.f32 else 2e-2  # bf16: roundings placed differently
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        assert np.max(np.abs(g - w)) <= tolerance * np.max(np.abs(w))


@needs_kernel
def test_float32_gemms_stay_with_a_blas_that_has_avx512_kernels(native_cpu):
    """The kernel replaces BLAS's sgemm only where the BLAS runs no AVX-512 kernels of its own
    (OpenBLAS held to Haswell's); its bf16 GEMM is loaded either way."""
    blas = dataclasses.replace(find_blas(), sgemm_kernel=gemm.KERNEL)
    for core, own in (("SkylakeX", True), ("Cooperlake", True), ("Haswell", False), ("", False)):
        marked = dataclasses.replace(blas, core=core)
        assert marked.runs_avx512 == own
        loaded = gemm.with_gemm_kernel(marked, "accy_sgemm(")
        assert (loaded.sgemm == blas.sgemm) == own and loaded.mixed_gemm != 0


@pytest.mark.slow
def test_the_blas_says_which_core_its_kernels_are_for():
    """NumPy's OpenBLAS names its core; `OPENBLAS_CORETYPE=Haswell` holds it to Haswell's."""
    import subprocess
    import sys

    code = "from accy.backends.cpu.blas import find_blas; b = find_blas(); print(b and b.core)"
    env = {**os.environ, "OPENBLAS_CORETYPE": "Haswell"}
    held = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    blas = find_blas()
    if blas is None or "openblas" not in blas.path.lower():
        pytest.skip("the BLAS found is not OpenBLAS")
    assert blas.core and held.stdout.strip() == "Haswell"
