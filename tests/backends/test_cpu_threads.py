"""The native CPU backend and the process's threads: fork() after parallel work, and programs
running concurrently in several threads."""

from __future__ import annotations

import multiprocessing
import threading
import warnings

import numpy as np
import pytest

import accy
from accy import f32, f64, spec
from accy.backends.cpu.compile import compile_program
from accy.backends.cpu.steps.dot import PARALLEL_GEMM_MNK

N = 1 << 21  # elements: exp over them is past loops.PARALLEL_WORK
M = K = 256  # a GEMM of M * M * K past PARALLEL_GEMM_MNK, shared out in bands


def _parallel_program():
    def body(b, x):
        a, left, right = x
        return (a * 0.5).exp(), left.contract(right, "k")

    types = [spec(f32, n=N), spec(f32, m=M, k=K), spec(f32, k=K, j=M)]
    return accy.trace.define("parallel", types, body)


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_child_forked_after_parallel_work_runs_programs(native_cpu):
    program = _parallel_program()
    assert M * M * K >= PARALLEL_GEMM_MNK
    assert "omp parallel" in compile_program(program).source  # the parent starts OpenMP threads
    rng = np.random.default_rng(0)
    a = np.linspace(-4, 4, N, dtype=np.float32)
    left = rng.standard_normal((M, K)).astype(np.float32)
    right = rng.standard_normal((K, M)).astype(np.float32)
    run = accy.compile(program, device="cpu")
    _, parent_product = run(a, left, right)

    def child(results):
        exp, product = run(a, left, right)
        results.put(
            (
                float(np.max(np.abs(exp - np.exp(a * np.float32(0.5))) / np.exp(a * 0.5))),
                bool(np.array_equal(product, parent_product)),
            )
        )

    context = multiprocessing.get_context("fork")
    results = context.Queue()
    process = context.Process(target=child, args=(results,))
    with warnings.catch_warnings():
        # JAX, imported by other tests in this worker, warns at every fork that its own threads
        # may deadlock the child; the child here never touches JAX.
        warnings.filterwarnings("ignore", r"os\.fork\(\) was called", RuntimeWarning)
        process.start()
    process.join(timeout=120)
    if process.is_alive():
        process.kill()
        process.join()
        pytest.fail("the forked child hung in a program it ran (the parent's OpenMP threads)")
    assert process.exitcode == 0
    relative_error, same_product = results.get(timeout=10)
    assert relative_error < 1e-6
    assert same_product  # GEMM bands depend on the shape only, not on the threads available
    np.testing.assert_allclose(parent_product, left @ right, rtol=1e-4, atol=1e-3)


def _gemms(name, shapes, dtype):
    def body(b, x):
        return tuple(x[i].contract(x[i + 1], "k") for i in range(0, len(x), 2))

    types = [t for m, k, n in shapes for t in (spec(dtype, m=m, k=k), spec(dtype, k=k, n=n))]
    return accy.trace.define(name, types, body)


@pytest.mark.slow
def test_gemms_give_the_same_bits_whatever_runs_in_other_threads(native_cpu):
    # OpenBLAS's results depend on its thread count, which is global to the process.
    shapes = [(300, 257, 190), (64, 1000, 64), (513, 129, 257), (17, 2000, 33)]
    programs = [
        _gemms("first", shapes, f32),
        _gemms("second", shapes[::-1], f32),
        _gemms("third", shapes[1:], f64),
    ]
    rng = np.random.default_rng(1)
    cases = []
    for program in programs:
        inputs = [
            rng.standard_normal(t.extents).astype(t.dtype.numpy) for t in program.parameter_types
        ]
        run = accy.compile(program, device="cpu")
        serial = run(*inputs)
        expected = [inputs[i] @ inputs[i + 1] for i in range(0, len(inputs), 2)]
        for got, want in zip(serial, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
        cases.append((run, inputs, serial))
    differences = []

    def repeat(run, inputs, serial):
        for _ in range(60):
            for got, want in zip(run(*inputs), serial, strict=True):
                if not np.array_equal(got, want):
                    differences.append(got.shape)

    threads = [threading.Thread(target=repeat, args=case) for case in cases * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert differences == []
