"""The CPU's loop nests: adjacent loops merged where every access is linear in the merged
counter (`accy.backends.cpu.loops.coalesced`), and `exp` kept off libmvec's slow lanes
(`accy_expf` in the GCC prelude)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import accy
from accy import f32, f64, i32, spec
from accy.backends.cpu.loops import coalesced
from accy.codegen.c.expressions import offset_expression

from .conftest import assert_matches_reference


def _accesses(*strides_per_array):
    """A loop body reading one array per stride tuple, over counters i0, i1, i2."""

    def emit(components):
        index = tuple(components[f"i{k}"] for k in range(3))
        loads = [f"a{n}[{offset_expression(index, s)}]" for n, s in enumerate(strides_per_array)]
        return [f"out[{offset_expression(index, (20, 5, 1))}] = {' + '.join(loads)};"]

    return emit


LOOPS = [("i0", 3), ("i1", 4), ("i2", 5)]


def test_loops_whose_every_access_is_linear_in_them_merge_into_one():
    loops, lines = coalesced(LOOPS, _accesses((20, 5, 1), (60, 15, 3)))
    assert loops == [("i2", 60)]
    assert lines == ["out[i2] = a0[i2] + a1[i2 * 3];"]


def test_a_broadcast_or_transposed_access_keeps_its_loops_apart():
    # a0 is broadcast along i0 (stride 0 there, 5 along i1): i0 stays; i1 and i2 still merge.
    loops, _ = coalesced(LOOPS, _accesses((0, 5, 1)))
    assert loops == [("i0", 3), ("i2", 20)]
    # a0 is transposed in (i1, i2): no two adjacent counters move it by one stride.
    loops, lines = coalesced(LOOPS, _accesses((20, 1, 4)))
    assert loops == LOOPS
    assert lines == ["out[i0 * 20 + i1 * 5 + i2] = a0[i0 * 20 + i1 + i2 * 4];"]


@pytest.mark.parametrize(
    "statement",
    [
        "const int32_t t0 = (int32_t)(i1);",  # an iota: the counter's own value
        "x[ACCY_CLAMP(i1, 3) * 5 + i2] = 0;",  # a clamp inside a subscript
        "x[y[i1] * 5 + i2] = 0;",  # a subscript inside a subscript
        "const int64_t j0 = i1 * 5 + i2;",  # an index computed outside any subscript
    ],
)
def test_a_counter_used_outside_a_linear_subscript_is_never_merged(statement):
    def emit(components):
        assert components == {c: c for c, _ in LOOPS}, "merged a counter it cannot renumber"
        return [statement, f"out[{offset_expression(('i0', 'i1', 'i2'), (20, 5, 1))}] = 0;"]

    loops, _ = coalesced(LOOPS, emit)
    assert ("i1", 4) in loops


def _causal_softmax(b, args):
    # As the demo's attention lays it out: [token, key, batch, head], read from a transposed
    # [batch, head, token, key], masked by iotas of token and key.
    scores = args[0].transpose("token", "key", "batch", "head") * 0.25
    grid = spec(i32, token=5, key=5)
    causal = b.iota(grid, "token") >= b.iota(grid, "key")
    masked = b.select(causal, scores, -np.inf)
    e = (masked - masked.max("key")).exp()
    return (e / e.sum("key"),)


def test_a_masked_softmax_runs_batch_and_head_as_one_vectorized_loop(native_cpu):
    program = accy.trace.define(
        "softmax", [spec(f32, batch=6, head=4, token=5, key=5)], _causal_softmax
    )
    source = accy.backends.cpu.compile_program(program).source
    # The (batch, head) loops of the exp loop and of the max and sum over key: one 24-long loop.
    assert len(re.findall(r"< 24; \+\+i3\)", source)) >= 3, source
    assert not re.search(r"< 4; \+\+i3\)", source)
    scores = np.random.default_rng(3).standard_normal((6, 4, 5, 5)).astype(np.float32)
    assert_matches_reference(program, [scores], rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [f32, f64], ids=str)
def test_exp_is_exact_at_underflow_infinities_and_nan_in_a_vectorized_loop(native_cpu, dtype):
    np_type = np.float32 if dtype == f32 else np.float64
    low = -104.0 if dtype == f32 else -746.0  # below: exp is +0 (under half the least denormal)
    specials = [
        -np.inf,
        low - 1e3,
        low - 0.5,
        low,
        low + 0.5,
        -90.0,
        -1.0,
        0.0,
        2.0,
        np.inf,
        np.nan,
    ]
    x = np.resize(np.array(specials, np_type), 64 * len(specials))  # every lane position
    program = accy.trace.define("exp", [spec(dtype, n=x.size)], lambda b, a: (a[0].exp(),))
    assert "accy_exp" in accy.backends.cpu.compile_program(program).source
    got = accy.compile(program, "cpu")(x)[0]
    want = np.exp(x)
    underflow = x < low
    assert np.all(got[underflow] == 0) and not np.signbit(got[underflow]).any()
    assert np.isnan(got[np.isnan(x)]).all() and np.all(got[x == np.inf] == np.inf)
    finite = np.isfinite(x) & ~underflow
    np.testing.assert_allclose(
        got[finite], want[finite], rtol=4e-7 if dtype == f32 else 1e-15, atol=0
    )


@pytest.mark.parametrize("dtype", [f32, f64], ids=str)
def test_logistic_of_saturated_and_infinite_inputs_in_a_vectorized_loop(native_cpu, dtype):
    specials = [-np.inf, -2e3, -120.0, -104.0, -90.0, -3.0, 0.0, 3.0, 90.0, 120.0, np.inf, np.nan]
    np_type = np.float32 if dtype == f32 else np.float64
    x = np.resize(np.array(specials, np_type), 64 * len(specials))
    program = accy.trace.define(
        "logistic", [spec(dtype, n=x.size)], lambda b, a: (a[0].logistic(),)
    )
    got = assert_matches_reference(program, [x], rtol=1e-6, atol=0)[0]
    assert np.all(got[x <= -2e3] == 0) and np.all(got[x >= 90.0] == 1)
