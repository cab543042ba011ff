"""Layout copies at memory speed: q, k and v taken out of a fused qkv projection (a reshape of a
slice: `Body` loads it through the reshaped view, `accy.lower.views.reshaped_strides`), the qkv
gradient assembled from the attention backward's stacked rows (a sum of zero pads that
`simplify` joins into one concatenate, read as one strided view:
`accy.lower.views.concatenated_view`), and a GEMM operand's plain pack through vector lanes.

Values on the CPU backend (it shares the plan and the C dialect with CUDA) and, where the CUDA
source is checked, in the generated CUDA kernel run on the CPU (`cuda_emulation`); on a GPU,
against the reference evaluator.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import accy
from accy import bf16, f16, f32, f64, spec
from accy.backends.cuda import compile_program
from accy.lower.views import StridedView, concatenated_view, reshape_groups

from ..executors import native_cpu, native_cuda
from ..halves import comparable
from .cuda_emulation import emulate_kernel

FLOATS = [f32, f64, f16, bf16]


def _qkv(dtype, b, t, h, d):
    return spec(dtype, batch=b, token=t, part=3, head=h, dim=d)


def _split(dtype, b=2, t=37, h=3, d=24, parts=(0, 1, 2)):
    # GPT-2's q, k, v: a slice of one element along `part`, summed away (a reshape).
    def body(_, a):
        return [a[0].slice("part", j, j + 1).sum("part") for j in parts]

    return accy.simplify(accy.trace.define("qkv_split", [_qkv(dtype, b, t, h, d)], body))


def _merged_heads(dtype, b=2, t=11, h=3, d=8):
    # A slice, then its (head, dim) merged into one channel: still a view (contiguous pair).
    def body(_, a):
        return a[0].slice("part", 1, 2).sum("part").merge(("head", "dim"), "channel")

    return accy.simplify(accy.trace.define("merged_heads", [_qkv(dtype, b, t, h, d)], body))


def _split_channel(dtype, b=3, t=5, h=4, d=6):
    # A slice of a wide channel, split into (head, dim): a view of the projection's output.
    def body(_, a):
        return a[0].slice("channel", h * d, 2 * h * d).split("channel", head=h, dim=d)

    program = accy.trace.define("split_channel", [spec(dtype, b=b, t=t, channel=3 * h * d)], body)
    return accy.simplify(program)


def _transposed_merge(dtype, b=2, t=7, h=3, d=5):
    # A transpose, then (token, dim) merged: no strides read it, so the index is divided back,
    # only within the merged group.
    def body(_, a):
        x = a[0].slice("part", 2, 3).sum("part").transpose("batch", "head", "token", "dim")
        return x.merge(("token", "dim"), "row")

    return accy.simplify(accy.trace.define("transposed_merge", [_qkv(dtype, b, t, h, d)], body))


def _computed_reshape(dtype, b=2, t=6, h=4, d=3):
    # A reshape of a computed value (not a view): per-group indices as well.
    def body(_, a):
        return (a[0] * 2.0).merge(("token", "part"), "row").split("row", x=t * 3 // 2, y=2)

    return accy.simplify(accy.trace.define("computed_reshape", [_qkv(dtype, b, t, h, d)], body))


def _rows(dtype, b, t, h, d):
    return spec(dtype, batch=b, head=h, row=3 * t, dim=d)


def _qkv_loss(dtype, b=2, t=9, h=3, d=8, parts=(0, 1, 2), spans=None):
    """sum_j <q_j, w_j>, q_j sliced out of qkv along `part` and w_j out of the stacked rows
    (the attention backward's dQ; dK; dV along the token axis): its gradient wrt qkv is the
    qkv gradient GPT-2 assembles. `spans` slices along `token` instead (overlapping: no joined
    pads)."""

    def body(_, a):
        qkv, rows = a
        total = None
        for j in parts:
            if spans is None:
                piece = qkv.slice("part", j, j + 1).sum("part")
                w = rows.slice("row", j * t, (j + 1) * t).rename("row", "token")
            else:
                start, stop = spans[j]
                piece = qkv.slice("token", start, stop).slice("part", 0, 1).sum("part")
                w = rows.slice("row", 0, stop - start).rename("row", "token")
            term = (piece * w).sum()
            total = term if total is None else total + term
        return total

    types = [_qkv(dtype, b, t, h, d), _rows(dtype, b, t, h, d)]
    return accy.trace.define("qkv_loss", types, body)


def _qkv_gradient(dtype, **shape):
    return accy.grad(_qkv_loss(dtype, **shape), wrt=(0,))


def _stacked_rows_gradient(dtype, b=2, t=256, h=4, d=64):
    """The qkv gradient as a program of the stacked rows alone: a sum of three zero pads of
    transposed row slices (the pullback of q, k, v's slices), simplified."""

    def body(_, a):
        (rows,) = a
        total = None
        for j in range(3):
            w = rows.slice("row", j * t, (j + 1) * t).rename("row", "token")
            w = w.transpose("batch", "token", "head", "dim")
            w = w.broadcast_to(spec(dtype, batch=b, token=t, part=1, head=h, dim=d))
            padded = w.pad("part", j, 2 - j)
            total = padded if total is None else total + padded
        return total

    program = accy.trace.define("stacked_rows", [_rows(dtype, b, t, h, d)], body)
    return accy.simplify(program)


def _inputs(program, seed=0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal(t.extents) * 1.5).astype(t.dtype.numpy)
        for t in program.parameter_types
    ]


def _assert_same(got, want, what: str) -> None:
    # Copies move bits: exactly the reference's values.
    np.testing.assert_array_equal(comparable(got), comparable(want), err_msg=what)


# Views, groups, simplification (no backend) ---------------------------------------------------


def test_reshape_groups_pair_the_axes_that_split_or_merge():
    assert reshape_groups((2, 1, 12), (2, 3, 4)) == [((0,), (0,)), ((2,), (1, 2))]
    assert reshape_groups((4, 6), (2, 12)) == [((0, 1), (0, 1))]
    assert reshape_groups((1, 1), (1,)) == []


def test_concatenated_view_joins_consecutive_slabs_of_one_buffer():
    program = _stacked_rows_gradient(f32, b=2, t=5, h=3, d=4)
    (op,) = [op for op in program.operations if op.kind == "concatenate"]
    # Rows [2, 3, 15, 4]: piece j at row 5j, read as [batch, token, part=1, head, dim].
    pieces = [StridedView(0, 20 * j, (180, 4, 0, 60, 1)) for j in range(3)]
    assert concatenated_view(op, pieces) == StridedView(0, 0, (180, 4, 20, 60, 1))
    assert concatenated_view(op, [pieces[0], pieces[2], pieces[1]]) is None  # out of order
    assert concatenated_view(op, [pieces[0], None, pieces[2]]) is None  # one is computed
    other_base = StridedView(1, 20, (180, 4, 0, 60, 1))
    assert concatenated_view(op, [pieces[0], other_base, pieces[2]]) is None


def test_the_qkv_gradient_simplifies_to_one_concatenate():
    program = _qkv_gradient(f32)
    assert program.count("concatenate") == 1
    assert program.count("pad") == 0 and program.count("add") == 0


def test_pads_with_a_gap_join_with_zeros_between():
    program = _qkv_gradient(f32, parts=(0, 2))
    assert program.count("concatenate") == 1 and program.count("pad") == 0


def test_overlapping_pads_stay_a_sum():
    program = _qkv_gradient(f32, t=9, parts=(0, 1), spans={0: (0, 5), 1: (3, 9)})
    assert program.count("concatenate") == 0 and program.count("add") >= 1


# Values on the CPU backend ----------------------------------------------------------------------

LAYOUTS = [_split, _merged_heads, _split_channel, _transposed_merge, _computed_reshape]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("build", LAYOUTS, ids=lambda f: f.__name__.strip("_"))
def test_reshapes_of_slices_match_the_reference_on_the_cpu(build, dtype):
    program = build(dtype)
    inputs = _inputs(program)
    want = accy.reference.run(program, inputs)
    for n, (got, w) in enumerate(zip(native_cpu(program, inputs), want, strict=True)):
        _assert_same(got, w, f"{program.name} {dtype} output {n}")


def test_the_qkv_split_is_numpy_slicing():
    program = _split(f32)
    (x,) = _inputs(program)
    for j, got in enumerate(native_cpu(program, [x])):
        np.testing.assert_array_equal(got, x[:, :, j])


GRADIENTS = [
    dict(),
    dict(b=1, t=5, h=1, d=3),
    dict(parts=(0, 2)),  # a gap: zeros between
    dict(parts=(1,)),  # one piece: a pad of zeros on both sides
    dict(t=9, parts=(0, 1), spans={0: (0, 5), 1: (3, 9)}),  # overlapping: still a sum
]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize(
    "shape", GRADIENTS, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items())
)
def test_qkv_gradients_match_numpy_on_the_cpu(shape, dtype):
    program = _qkv_gradient(dtype, **shape)
    qkv, rows = _inputs(program, seed=3)
    (got,) = native_cpu(program, [qkv, rows])
    (want,) = accy.reference.run(program, [qkv, rows])
    _assert_same(got, want, f"{dtype} {shape}")
    b, t, _, h, d = qkv.shape
    expected = np.zeros(qkv.shape, np.float64)
    for j in shape.get("parts", (0, 1, 2)):
        if "spans" in shape:
            start, stop = shape["spans"][j]
            expected[:, start:stop, 0] += (
                rows[:, :, : stop - start].astype(np.float64).swapaxes(1, 2)
            )
        else:
            expected[:, :, j] = rows[:, :, j * t : (j + 1) * t].astype(np.float64).swapaxes(1, 2)
    np.testing.assert_allclose(comparable(got).astype(np.float64), expected, rtol=2.0**-7)


@pytest.mark.parametrize("dtype", [f32, bf16], ids=str)
def test_a_concatenate_along_the_innermost_axis_of_computed_pieces(dtype):
    # Pieces that are no view (computed): the select among pieces, unchanged.
    def body(_, a):
        x, y = a
        return (x * 2.0).pad("dim", 0, 5) + (y + 1.0).pad("dim", 3, 0)

    types = [spec(dtype, row=7, dim=3), spec(dtype, row=7, dim=5)]
    program = accy.simplify(accy.trace.define("inner", types, body))
    assert program.count("concatenate") == 1
    inputs = _inputs(program, seed=5)
    (got,) = native_cpu(program, inputs)
    (want,) = accy.reference.run(program, inputs)
    _assert_same(got, want, str(dtype))
    x, y = (comparable(v) for v in inputs)
    np.testing.assert_allclose(comparable(got), np.concatenate([x * 2, y + 1], 1), rtol=2.0**-7)


# The generated CUDA (no GPU) --------------------------------------------------------------------


def _kernel_text(source: str, name: str) -> str:
    start = source.index(f" {name}(")
    return source[start : source.index("\n}\n", start)]


def _only_kernel(program, prefix: str):
    compiled = compile_program(program, prefix=prefix)
    (launch,) = compiled.schedule.actions
    return compiled.source, launch


def _index_lines(kernel: str) -> list[str]:
    # The per-element index arithmetic (`j` temporaries), apart from the counter's decomposition.
    return re.findall(r"const int64_t j\d+ = .*;", kernel)


def test_the_qkv_split_is_a_vectorized_copy_without_divisions():
    source, launch = _only_kernel(_split(bf16, b=2, t=256, h=12, d=64, parts=(1,)), "split_")
    kernel = _kernel_text(source, launch.kernel)
    assert "accy_vector<uint16_t, 8> t0 = *(const accy_vector<uint16_t, 8> *)(v0 +" in kernel
    assert "+ 768" in kernel  # k starts one head row (12 x 64) into each token's qkv
    assert not [line for line in _index_lines(kernel) if "/" in line or "%" in line]


def test_the_qkv_gradient_is_a_vectorized_copy_without_clamps():
    source, launch = _only_kernel(_stacked_rows_gradient(bf16), "rows_")
    kernel = _kernel_text(source, launch.kernel)
    assert "*(const accy_vector<uint16_t, 8> *)(v0 +" in kernel
    assert "ACCY_CLAMP" not in kernel and not re.search(r"\? t\d", kernel)  # no select
    assert not _index_lines(kernel)


def test_a_plain_pack_stores_vectors():
    def body(_, a):
        return a[0].slice("d", 0, 64).contract(a[1], ("h", "d"))

    types = [spec(bf16, b=2, h=12, t=256, d=72), spec(bf16, h=12, d=64, e=64)]
    compiled = compile_program(accy.trace.define("plain_pack", types, body), prefix="pack_")
    start = compiled.source.index("(pack lhs) */")
    kernel = compiled.source[start : compiled.source.index("\n}\n", start)]
    assert "*(accy_vector<uint16_t, 8> *)(packed +" in kernel
    assert "*(const accy_vector<uint16_t, 8> *)(v0 +" in kernel


@pytest.mark.parametrize("shift", [0, 2], ids=["aligned", "misaligned"])
@pytest.mark.slow
def test_the_generated_qkv_kernels_copy_the_right_elements(shift):
    # The CUDA kernels themselves, run on the CPU: the vector loop (aligned) and the scalar one.
    split = _split(bf16, b=2, t=64, h=4, d=64, parts=(2,))
    source, launch = _only_kernel(split, "emulated_split_")
    (x,) = _inputs(split, seed=8)
    for got in emulate_kernel(source, launch.kernel, 4, x, x.dtype, (2, 64, 4, 64), shift):
        _assert_same(got, x[:, :, 2], f"split shift {shift}")
    gradient = _stacked_rows_gradient(bf16, b=2, t=64, h=4, d=64)
    source, launch = _only_kernel(gradient, "emulated_rows_")
    (rows,) = _inputs(gradient, seed=9)
    want = rows.reshape(2, 4, 3, 64, 64).transpose(0, 3, 2, 1, 4)
    for got in emulate_kernel(source, launch.kernel, 4, rows, rows.dtype, want.shape, shift):
        _assert_same(got, want, f"gradient shift {shift}")


# On a GPU ---------------------------------------------------------------------------------------


def _cuda_matches_the_reference(program, seed: int) -> None:
    inputs = _inputs(program, seed)
    want = accy.reference.run(program, inputs)
    for n, (got, w) in enumerate(zip(native_cuda(program, inputs), want, strict=True)):
        _assert_same(got, w, f"{program.name} output {n}")


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("build", LAYOUTS, ids=lambda f: f.__name__.strip("_"))
def test_reshapes_of_slices_match_the_reference_on_cuda(build, dtype):
    _cuda_matches_the_reference(build(dtype), seed=1)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_gpt2_sized_qkv_copies_match_the_reference_on_cuda(dtype):
    _cuda_matches_the_reference(_split(dtype, b=2, t=1024, h=12, d=64), seed=2)
    _cuda_matches_the_reference(_stacked_rows_gradient(dtype, b=2, t=1024, h=12, d=64), seed=3)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize(
    "shape", GRADIENTS, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items())
)
def test_qkv_gradients_match_the_reference_on_cuda(shape, dtype):
    _cuda_matches_the_reference(_qkv_gradient(dtype, **shape), seed=4)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("d", [64, 24, 7], ids=lambda d: f"d{d}")
def test_plain_packs_match_numpy_on_cuda(dtype, d):
    # d = 64 and 24: vector lanes (8, or fewer for 4- and 8-byte dtypes); 7: scalar only.
    def body(_, a):
        return a[0].slice("d", 0, d).contract(a[1], ("h", "d"))

    types = [spec(dtype, b=2, h=3, t=130, d=d + 8), spec(dtype, h=3, d=d, e=16)]
    program = accy.trace.define("plain_pack", types, body)
    x, w = _inputs(program, seed=6)
    (got,) = native_cuda(program, [x, w])
    want = np.einsum("bhtd,hde->bte", comparable(x)[..., :d].astype(np.float64), comparable(w))
    scale = float(np.abs(want).max())
    rtol = {f64: 1e-12, f32: 1e-5, f16: 2.0**-9, bf16: 2.0**-6}[dtype]
    np.testing.assert_allclose(comparable(got), want, rtol=rtol, atol=rtol * scale)
