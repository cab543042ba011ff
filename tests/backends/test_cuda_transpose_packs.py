"""GEMM operands packed by a transposing copy (`accy.backends.cuda.tiles`): which packs the
generated source tiles through shared memory (no GPU needed), and, on a GPU, that contractions
whose operands are packed that way compute what NumPy does, in every float dtype, at extents the
tile divides and at extents it does not, with axes of one element, from a transposed view and
from a fused elementwise producer."""

from __future__ import annotations

import re

import numpy as np
import pytest

import accy
from accy import bf16, f16, f32, f64, spec
from accy.backends.cuda import compile_program
from accy.backends.cuda.tiles import tile_count, tiled_copy, transposed_axes

from ..executors import cuda_device_or_skip, native_cuda
from ..halves import comparable

FLOATS = [f32, f64, f16, bf16]
# Relative to the result's largest magnitude: the GEMM adds in another order than NumPy, and
# 16-bit results are rounded once.
RTOL = {f64: 1e-12, f32: 1e-5, f16: 2.0**-9, bf16: 2.0**-6}


def _weight_gradient(dtype, b=3, h=2, t=70, d=33, e=5):
    # GPT-2's output projection's weight gradient: sum over batch and token of the attention
    # output [b, h, t, d] times the gradient [b, t, e]. The left operand's rows (h, d) are not
    # one strided axis, so it is packed [h, d, b, t]: its stride-1 axis d becomes token's.
    return accy.trace.define(
        "weight_gradient",
        [spec(dtype, b=b, h=h, t=t, d=d), spec(dtype, b=b, t=t, e=e)],
        lambda _, a: a[0].contract(a[1], ("b", "t")),
    )


def _from_transposed_view(dtype, b=2, h=3, t=40, d=66, e=4):
    # The operand is a transposed view of the stored [b, h, t, d]: walked in its own order
    # (d before t) a kernel writes coalesced but reads with a stride of d.
    return accy.trace.define(
        "from_transposed_view",
        [spec(dtype, b=b, h=h, t=t, d=d), spec(dtype, b=b, t=t, e=e)],
        lambda _, a: a[0].transpose("b", "h", "d", "t").contract(a[1], ("b", "t")),
    )


def _fused(dtype, b=2, h=2, t=67, d=35, e=3):
    # A dot of transpose(x * 2 + y): the elementwise producer is stored, then packed.
    def build(_, a):
        x, y, g = a
        return (x * 2.0 + y).transpose("b", "h", "d", "t").contract(g, ("b", "t"))

    return accy.trace.define(
        "fused",
        [spec(dtype, b=b, h=h, t=t, d=d)] * 2 + [spec(dtype, b=b, t=t, e=e)],
        build,
    )


def _forward_projection(dtype, b=2, h=3, t=70, d=33, e=5):
    # The output projection itself: rows (b, t), columns (h, d), packed [b, t, h, d], d last in
    # both layouts: a plain copy, coalesced both ways.
    return accy.trace.define(
        "forward_projection",
        [spec(dtype, b=b, h=h, t=t, d=d), spec(dtype, h=h, d=d, e=e)],
        lambda _, a: a[0].contract(a[1], ("h", "d")),
    )


TILED = {
    "weight_gradient": _weight_gradient,
    "multiples": lambda dtype: _weight_gradient(dtype, b=2, h=2, t=128, d=64),
    "unit_batch": lambda dtype: _weight_gradient(dtype, b=1, h=3, t=65, d=17),
    "one_tile": lambda dtype: _weight_gradient(dtype, b=2, h=2, t=5, d=3),
    "from_transposed_view": _from_transposed_view,
    "fused": _fused,
}
EINSUM = {
    "weight_gradient": "bhtd,bte->hde",
    "multiples": "bhtd,bte->hde",
    "unit_batch": "bhtd,bte->hde",
    "one_tile": "bhtd,bte->hde",
    "from_transposed_view": "bhtd,bte->hde",
    "forward_projection": "bhtd,hde->bte",
}


def _packs(source: str) -> list[str]:
    return re.findall(r"/\* step \d+: dot \((pack [^)]*)\) \*/", source)


# The generated source (no GPU) ------------------------------------------------------------------


@pytest.mark.parametrize("case", TILED, ids=str)
def test_a_transposing_pack_goes_tile_by_tile_through_shared_memory(case):
    source = compile_program(TILED[case](bf16)).source
    assert _packs(source) == ["pack lhs, 64x64 tiles"], _packs(source)
    assert "__shared__ float accy_tile[64][65];" in source
    assert source.count("__syncthreads();") == 2


def test_eight_byte_values_take_32_by_32_tiles():
    source = compile_program(_weight_gradient(f64)).source
    assert _packs(source) == ["pack lhs, 32x32 tiles"]
    assert "__shared__ double accy_tile[32][33];" in source


def test_a_pack_that_keeps_its_stride_1_axis_stays_a_plain_copy():
    source = compile_program(_forward_projection(bf16)).source
    assert _packs(source) == ["pack lhs"]
    assert "__shared__" not in source


def test_the_gpt2_pack_is_1536_tiles_of_its_token_and_dim_axes():
    # [batch 8, head 12, token 1024, 64 of a row of 72] into [head, dim, batch, token].
    axes = transposed_axes((8, 12, 1024, 64), (884736, 73728, 72, 1), (1024, 524288, 1, 8192))
    assert axes == (3, 2)
    assert tile_count((8, 12, 1024, 64), *axes, 64) == 8 * 12 * 16


@pytest.mark.parametrize(
    ("extents", "source", "target", "axes"),
    [
        ((4, 5), (5, 1), (1, 4), (1, 0)),  # a matrix transposed
        ((4, 5), (5, 1), (5, 1), None),  # the same layout
        ((4, 1, 5), (5, 5, 1), (1, 4, 4), (2, 0)),  # the axis of one element never counts
        ((4, 5), (5, -1), (1, 4), (1, 0)),  # a reversed axis still reads contiguously
        ((4, 5), (0, 1), (5, 1), None),  # a broadcast row, read along its stride-1 axis
        ((4, 5), (10, 2), (1, 4), None),  # no stride-1 source axis: no tile makes it one
    ],
)
def test_which_copies_transpose(extents, source, target, axes):
    assert transposed_axes(extents, source, target) == axes


def test_edge_tiles_check_only_the_axes_the_side_does_not_divide():
    def load(index):
        return [], f"src[{index[0]} * 70 + {index[1]}]"

    def store(index, x):
        return f"dst[{index[0]} + {index[1]} * 128] = {x};"

    lines, grid = tiled_copy((128, 70), ("p0", "p1"), (1, 0), "float", 4, load, store)
    text = "\n".join(lines)
    assert grid == 2 * 2
    assert text.count("if (p1 < 70) {") == 2
    assert "p0 < 128" not in text


# On a GPU ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu():
    return cuda_device_or_skip()


def _inputs(program, rng) -> list[np.ndarray]:
    return [rng.standard_normal(t.extents).astype(t.dtype.numpy) for t in program.parameter_types]


def _expected(case: str, inputs: list[np.ndarray]) -> np.ndarray:
    wide = [comparable(x).astype(np.float64) for x in inputs]
    if case == "fused":
        x, y, g = wide
        return np.einsum("bhtd,bte->hde", x * 2.0 + y, g)
    return np.einsum(EINSUM[case], *wide)


def _assert_close(got, want, dtype, what: str) -> None:
    got = comparable(got).astype(np.float64)
    assert got.shape == want.shape, what
    rtol = RTOL[dtype]
    scale = float(np.max(np.abs(want), initial=1e-30))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale, err_msg=what)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("case", [*TILED, "forward_projection"], ids=str)
def test_packed_contractions_match_numpy_on_cuda(gpu, case, dtype):
    build = TILED.get(case, _forward_projection)
    program = build(dtype)
    inputs = _inputs(program, np.random.default_rng(11))
    (got,) = native_cuda(program, inputs)
    _assert_close(got, _expected(case, inputs), dtype, f"{case} {dtype}")
