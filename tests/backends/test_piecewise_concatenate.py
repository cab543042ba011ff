"""A concatenate of computed pieces computes only the piece each element is in: one branch per
piece (`accy.codegen.c.expressions.piecewise`), in CUDA's vector loop one branch per vector of
lanes where every piece starts at a multiple of the lanes (vector loads inside the branch).

Values exactly the reference evaluator's on the CPU backend (which shares the C expression
builder with CUDA), in the generated CUDA kernel run on the CPU (`cuda_emulation`), and on a
GPU; the CUDA source has no clamped index and one branch per piece.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import accy
from accy import bf16, f16, f32, f64, i32, spec
from accy.backends.cuda import compile_program
from accy.lower.split_gemms import split_widened_gemms

from ..executors import native_cpu, native_cuda
from ..halves import comparable
from .cuda_emulation import emulate_kernel

DTYPES = [f32, bf16, f16, f64, i32]


def _parts(rows: int, n: int, axis: str):
    """split_gemms' exact split of an f32 value into three bf16 parts, laid end to end."""

    def body(b, a):
        x = a[0] * 3.0  # computed, so that no piece is a load
        parts = [x.convert(bf16)]
        for _ in range(2):
            x = x - parts[-1].convert(f32)
            parts.append(x.convert(bf16))
        return b.concatenate(parts, axis)

    return accy.trace.define("parts", [spec(f32, r=rows, n=n)], body)


def _repeated(dtype, rows: int, n: int, axis: str):
    """A narrow operand repeated three times (split_gemms' partner of the parts), computed."""

    def body(b, a):
        w = a[0] * 2 if dtype == i32 else a[0] * 2.0
        return b.concatenate([w, w, w], axis)

    return accy.trace.define("repeated", [spec(dtype, r=rows, n=n)], body)


def _mixed(dtype, rows: int, n: int, axis: str):
    """Pieces of different extents and expressions, each one rounding from its operands."""

    def body(b, a):
        x, y = a
        one, two = (1, 2) if dtype == i32 else (1.0, 2.0)
        return b.concatenate([x * two, y + one, x - x * two], axis)

    other = {"r": rows + 3, "n": n} if axis == "r" else {"r": rows, "n": n + 5}
    return accy.trace.define("mixed", [spec(dtype, r=rows, n=n), spec(dtype, **other)], body)


def _inputs(program, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = []
    for t in program.parameter_types:
        # Values over many binades, so that every part of a split is nonzero.
        x = rng.standard_normal(t.extents) * np.exp2(rng.integers(-12, 12, t.extents))
        arrays.append((x * 4 if t.dtype == i32 else x).astype(t.dtype.numpy))
    return arrays


def _assert_exact(got, want, what: str) -> None:
    np.testing.assert_array_equal(comparable(got), comparable(want), err_msg=what)


def _cpu_matches_the_reference(program, seed: int = 0) -> None:
    inputs = _inputs(program, seed)
    (want,) = accy.reference.run(program, inputs)
    (got,) = native_cpu(program, inputs)
    _assert_exact(got, want, program.name)


# On the CPU backend -----------------------------------------------------------------------------

SHAPES = [(8, 24), (5, 13), (3, 1)]  # multiples of 8 along n, and not


@pytest.mark.parametrize("axis", ["n", "r"])
@pytest.mark.parametrize("rows, n", SHAPES)
def test_split_parts_match_the_reference_on_the_cpu(rows, n, axis):
    _cpu_matches_the_reference(_parts(rows, n, axis), seed=1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("axis", ["n", "r"])
@pytest.mark.parametrize("rows, n", SHAPES)
def test_computed_pieces_match_the_reference_on_the_cpu(dtype, rows, n, axis):
    _cpu_matches_the_reference(_repeated(dtype, rows, n, axis), seed=2)
    _cpu_matches_the_reference(_mixed(dtype, rows, n, axis), seed=3)


def test_split_parts_are_the_value():
    # Independently of the reference: the three parts add up to the f32 value, exactly.
    program = _parts(6, 16, "n")
    (x,) = _inputs(program, seed=4)
    (got,) = native_cpu(program, [x])
    parts = comparable(got).astype(np.float64).reshape(6, 3, 16)
    np.testing.assert_array_equal(parts.sum(1), (x * 3).astype(np.float64))
    assert np.mean(parts[:, 2] != 0) > 0.5  # the third part matters


# The generated CUDA (no GPU) --------------------------------------------------------------------


def _kernels(source: str) -> list[str]:
    return re.findall(r'extern "C" __global__ .*?\n\}\n', source, re.S)


def _only_kernel(program, prefix: str) -> tuple[str, str]:
    compiled = compile_program(program, prefix=prefix)
    (launch,) = compiled.schedule.actions
    (kernel,) = [k for k in _kernels(compiled.source) if f" {launch.kernel}(" in k]
    return compiled.source, launch.kernel, kernel


@pytest.mark.parametrize("axis", ["n", "r"])
def test_cuda_branches_per_piece_with_vector_loads(axis):
    _, _, kernel = _only_kernel(_parts(64, 256, axis), f"branches_{axis}_")
    assert "ACCY_CLAMP" not in kernel and not re.search(r"\? t\d", kernel)  # no select
    # One chain of branches in the vector loop, one in the scalar loop.
    assert kernel.count("} else if (") == 2 and kernel.count("} else {") == 2
    assert kernel.count("*(const accy_vector<float, 8> *)(v") == 3  # one per piece
    assert "if (" in kernel


def _straddling():
    # Pieces of 12 and 20 along n: a vector of 8 lanes may straddle 12.
    def body(b, a):
        x = a[0] * 2.0
        return b.concatenate([x.slice("n", 0, 12), x.slice("n", 12, 32) + 1.0], "n")

    return accy.trace.define("straddle", [spec(bf16, r=1024, n=32)], body)


def test_cuda_vectors_straddling_a_piece_branch_per_lane():
    _, _, kernel = _only_kernel(_straddling(), "straddle_")
    vector_loop = kernel[: kernel.index("for (int64_t i = vector_end")]
    assert "ACCY_CLAMP" not in kernel
    assert vector_loop.count("} else {") == 8  # a branch per lane
    # Each lane's loads are scalar: a vector could reach past its piece.
    assert "*(const accy_vector" not in kernel
    assert "*(accy_vector<uint16_t, 8> *)(v" in kernel  # the store is still one vector


def _repeated_then_widened():
    # split_gemms' repeated bf16 operand (stored, so each piece is a load), fused into a convert.
    def body(b, a):
        return b.concatenate([a[0]] * 3, "r").convert(f32)

    return accy.trace.define("repeated_widened", [spec(bf16, r=256, n=64)], body)


def test_a_fused_concatenate_branches_once_per_vector():
    _, _, kernel = _only_kernel(_repeated_then_widened(), "fused_")
    vector_loop = kernel[: kernel.index("for (int64_t i = vector_end")]
    assert "ACCY_CLAMP" not in kernel
    assert vector_loop.count("} else if (") == 1 and vector_loop.count("} else {") == 1
    assert vector_loop.count("*(const accy_vector<uint16_t, 8> *)(v") == 3


def test_split_gemms_concatenates_have_no_clamp(configure):
    configure(lower_smallest_split=0)
    types = [spec(f32, row=64, k=64), spec(bf16, k=64, col=8)]

    def body(_, a):
        return a[0].contract(a[1].convert(f32), "k")

    split = split_widened_gemms(accy.trace.define("widened", types, body))
    assert split.count("concatenate") == 2
    kernels = "".join(_kernels(compile_program(split, prefix="widened_").source))
    assert "ACCY_CLAMP" not in kernels
    assert "} else {" in kernels


def _swapped_io(kernel: str) -> str:
    # The emulator reads io[0] and writes io[1]; the plan may number them the other way.
    first = re.search(r"=[^;]*io\[0\]", kernel).group(0)
    if "const " in first:
        return kernel
    return kernel.replace("io[0]", "io[@]").replace("io[1]", "io[0]").replace("io[@]", "io[1]")


@pytest.mark.parametrize("shift", [0, 4])  # aligned: vectors; misaligned: the scalar loop
@pytest.mark.parametrize("case", ["n", "r", "straddle", "fused"])
@pytest.mark.slow
def test_emulated_cuda_kernel_matches_the_reference(case, shift):
    special = {"straddle": _straddling, "fused": _repeated_then_widened}
    program = special[case]() if case in special else _parts(64, 256, case)
    source, name, kernel = _only_kernel(program, f"emulated_{case}_")
    source = source.replace(kernel, _swapped_io(kernel))
    (x,) = _inputs(program, seed=5)
    (want,) = accy.reference.run(program, [x])
    want = np.asarray(want)
    bits = want.view(np.uint16 if want.itemsize == 2 else np.uint32)
    for got in emulate_kernel(source, name, 4, x, bits.dtype, want.shape, shift):
        np.testing.assert_array_equal(got, bits, err_msg=f"{case} shift {shift}")


# On a GPU ---------------------------------------------------------------------------------------


def _cuda_matches_the_reference(program, seed: int) -> None:
    inputs = _inputs(program, seed)
    (want,) = accy.reference.run(program, inputs)
    (got,) = native_cuda(program, inputs)
    _assert_exact(got, want, program.name)


@pytest.mark.parametrize("axis", ["n", "r"])
@pytest.mark.parametrize("rows, n", [(256, 256), (129, 100), (3, 13)])
def test_split_parts_match_the_reference_on_cuda(rows, n, axis):
    _cuda_matches_the_reference(_parts(rows, n, axis), seed=6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("axis", ["n", "r"])
@pytest.mark.parametrize("rows, n", [(256, 128), (129, 100)])
def test_computed_pieces_match_the_reference_on_cuda(dtype, rows, n, axis):
    _cuda_matches_the_reference(_repeated(dtype, rows, n, axis), seed=7)
    _cuda_matches_the_reference(_mixed(dtype, rows, n, axis), seed=8)
