"""grad.zig's programs trace, type-check and evaluate on the reference
evaluator with values worked out by hand (or, for attention, by an independent NumPy model)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import accy
from accy.trace import define

from ..grad_zig_programs import (
    CUSTOM_DOUBLE,
    abs_loss,
    batched_dot_general_loss,
    causal_attention_loss,
    cube_loss,
    double_sum_loss,
    elementwise_loss,
    embedding_lookup_loss,
    max_loss,
    max_loss_with_init_param,
    relu_loss,
    tan_loss,
    transposed_projection_loss,
)
from .core_helpers import evaluate_one

f32, i32 = accy.f32, accy.i32
spec = accy.spec


def scalar_of(program, *inputs, **options) -> float:
    value = evaluate_one(program, *inputs, **options)
    assert value.shape == () and value.dtype == np.float32
    return float(value)


def kinds(program) -> list[str]:
    return [op.kind for op in program.operations]


def lane(*values) -> np.ndarray:
    return np.array(values, dtype=np.float32)


# ---------------------------------------------------------------------------------------------


def test_elementwise_loss():
    program = define("grad_elementwise", [spec(f32, lane=4)] * 2, elementwise_loss)
    assert kinds(program) == ["parameter", "parameter", "mul", "constant", "reduce"]
    assert program.output_types == (spec(f32),)
    # 1*0.5 + 2*(-1) + 3*2 + 4*0.25 = 0.5 - 2 + 6 + 1
    assert scalar_of(program, lane(1, 2, 3, 4), lane(0.5, -1, 2, 0.25)) == 5.5


def test_embedding_lookup_loss_with_the_seeds_shapes():
    program = define(
        "grad_embedding_lookup",
        [spec(f32, vocab=16, channel=4), spec(i32, token=3)],
        embedding_lookup_loss,
    )
    (gather,) = [op for op in program.operations if op.kind == "gather"]
    assert gather.type == spec(f32, token=3, channel=4)
    table = np.arange(64, dtype=np.float32).reshape(16, 4)
    # rows 15, 0, 15: (60+61+62+63) + (0+1+2+3) + (60+61+62+63)
    assert scalar_of(program, table, np.array([15, 0, 15], np.int32)) == 498.0


def test_embedding_lookup_loss_with_the_seeds_values():
    program = define(
        "grad_unused_parameter_cpu",
        [spec(f32, vocab=4, channel=2), spec(i32, token=3)],
        embedding_lookup_loss,
    )
    table = np.array([[0.5, -1.0], [2.0, 0.25], [3.0, -2.0], [1.5, 0.75]], np.float32)
    # rows 2, 0, 2: (3 - 2) + (0.5 - 1) + (3 - 2)
    assert scalar_of(program, table, np.array([2, 0, 2], np.int32)) == 1.5


def test_relu_loss():
    program = define("grad_relu", [spec(f32, lane=4)], relu_loss)
    assert program.count("max") == 1 and program.count("broadcast_in_dim") == 1
    # max(x, 0): 0 + 2 + 0 + 4
    assert scalar_of(program, lane(-1, 2, -3, 4)) == 6.0


def test_cube_loss():
    program = define("grad_cube", [spec(f32, lane=4)], cube_loss)
    assert program.count("pow") == 1
    # 1 + 8 - 1 + 0.125
    assert scalar_of(program, lane(1, 2, -1, 0.5)) == 8.125


def test_reduce_max_with_a_constant_init():
    program = define("grad_reduce_max", [spec(f32, lane=4)], max_loss)
    (constant,) = [op for op in program.operations if op.kind == "constant"]
    assert constant.attrs["value"] == -3.4e38
    assert scalar_of(program, lane(-5, -2, -7, -3)) == -2.0
    # The init takes part: every element below it gives the init (rounded to f32).
    assert scalar_of(program, lane(*[-3.4e38 * 1.0000001] * 4)) == float(np.float32(-3.4e38))


def test_reduce_max_with_a_parameter_init():
    program = define(
        "grad_reduce_max_init", [spec(f32, lane=4), spec(f32)], max_loss_with_init_param
    )
    (reduce,) = [op for op in program.operations if op.kind == "reduce"]
    assert reduce.operands[1] == program.parameters[1]
    assert scalar_of(program, lane(1, 5, 3, 2), np.float32(4)) == 5.0
    assert scalar_of(program, lane(1, 5, 3, 2), np.float32(9)) == 9.0


def test_abs_loss():
    program = define("grad_abs", [spec(f32, lane=4)], abs_loss)
    assert scalar_of(program, lane(-1.5, 2, -3, 0)) == 6.5


def test_tan_loss():
    program = define("grad_tan", [spec(f32, lane=4)], tan_loss)
    x = lane(0, math.pi / 4, -math.pi / 4, math.pi / 3)
    # 0 + 1 - 1 + sqrt(3)
    assert scalar_of(program, x) == pytest.approx(math.sqrt(3), rel=1e-6)


def test_vector_output_program_for_grad_requires_scalar_output():
    program = define(
        "grad_vector", [spec(f32, lane=4)] * 2, lambda builder, args: args[0].mul(args[1])
    )
    assert program.output_types == (spec(f32, lane=4),)
    got = evaluate_one(program, lane(1, 2, 3, 4), lane(2, 2, 2, 2))
    np.testing.assert_array_equal(got, lane(2, 4, 6, 8))


def test_batched_dot_general_loss():
    program = define(
        "grad_batched_dot_general_cpu",
        [spec(f32, b=2, m=2, k=3), spec(f32, b=2, k=3, n=2), spec(f32, b=2, m=2, n=2)],
        batched_dot_general_loss,
    )
    (dot,) = [op for op in program.operations if op.kind == "dot_general"]
    assert dot.type == spec(f32, b=2, m=2, n=2)
    assert (dot.attrs["lhs_batch"], dot.attrs["rhs_batch"]) == ((0,), (0,))
    assert (dot.attrs["lhs_contracting"], dot.attrs["rhs_contracting"]) == ((2,), (1,))
    lhs = np.array([[[1, 2, 3], [4, 5, 6]], [[-1, 0.5, 2], [3, -2, 1]]], np.float32)
    rhs = np.array([[[7, 8], [9, 10], [11, 12]], [[0.25, -1], [2, -3], [4, 0.5]]], np.float32)
    weights = np.array([[[1, -0.5], [0.25, 2]], [[-1.5, 0.75], [3, -2]]], np.float32)
    # products: batch 0 [[58, 64], [139, 154]], batch 1 [[8.75, 0.5], [0.75, 3.5]]
    # weighted: 58 - 32 + 34.75 + 308 = 368.75 and -13.125 + 0.375 + 2.25 - 7 = -17.5
    assert scalar_of(program, lhs, rhs, weights) == 351.25


def test_non_canonical_dot_general_loss():
    program = define(
        "grad_noncanonical_dot_cpu",
        [spec(f32, k=3, m=2), spec(f32, k=3, n=2)],
        transposed_projection_loss,
    )
    (dot,) = [op for op in program.operations if op.kind == "dot_general"]
    assert dot.type == spec(f32, m=2, n=2)
    lhs = np.array([[1, 2], [3, 4], [5, 6]], np.float32)
    rhs = np.array([[0.5, -1], [2, 0.25], [-0.75, 1.5]], np.float32)
    # sum over m, n of sum over k = sum over k of (row sum of lhs) * (row sum of rhs)
    #   = 3 * (-0.5) + 7 * 2.25 + 11 * 0.75
    assert scalar_of(program, lhs, rhs) == 22.5


ATTENTION_TOKENS, ATTENTION_CHANNELS, MASK_PENALTY = 4, 3, -30.0


def attention_program():
    qkv = spec(f32, token=ATTENTION_TOKENS, channel=ATTENTION_CHANNELS)
    return define(
        "grad_causal_attention_fd",
        [qkv, qkv, qkv, spec(f32, token=ATTENTION_TOKENS, key=ATTENTION_TOKENS)],
        causal_attention_loss,
    )


def causal_mask() -> np.ndarray:
    rows, cols = np.indices((ATTENTION_TOKENS, ATTENTION_TOKENS))
    return np.where(cols <= rows, 0.0, MASK_PENALTY).astype(np.float32)


def attention_noise(seed: int) -> float:
    """grad.zig's splitmix64-based noise in [-1, 1]."""
    mask = (1 << 64) - 1
    state = (seed + 0x9E3779B97F4A7C15) & mask
    state = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & mask
    state = ((state ^ (state >> 27)) * 0x94D049BB133111EB) & mask
    state ^= state >> 31
    unit = np.float32(state & 0xFFFF) / np.float32(65535.0)
    return float(np.float32(2.0) * unit - np.float32(1.0))


def test_causal_attention_with_zero_queries_averages_the_visible_values():
    program = attention_program()
    assert program.output_types == (spec(f32),)
    zeros = np.zeros((ATTENTION_TOKENS, ATTENTION_CHANNELS), np.float32)
    values = np.repeat(np.arange(4, dtype=np.float32)[:, None], ATTENTION_CHANNELS, axis=1)
    # Zero scores: token r attends uniformly to keys 0..r (exp(-30) elsewhere, ~1e-13), so each
    # of its 3 channels mixes to r / 2: loss = 3 * (0 + 0.25 + 1 + 2.25).
    got = scalar_of(program, zeros, zeros, values, causal_mask())
    assert got == pytest.approx(10.5, rel=1e-6)


def test_causal_attention_with_the_seeds_inputs_matches_an_independent_model():
    count = ATTENTION_TOKENS * ATTENTION_CHANNELS
    q, k, v = (
        np.array([attention_noise(t * 1000 + e) for e in range(count)], np.float32).reshape(
            ATTENTION_TOKENS, ATTENTION_CHANNELS
        )
        for t in range(3)
    )
    scores = q.astype(np.float64) @ k.T.astype(np.float64) + causal_mask()
    probs = np.exp(scores - scores.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    expected = ((probs @ v.astype(np.float64)) ** 2).sum()
    got = scalar_of(attention_program(), q, k, v, causal_mask())
    assert got == pytest.approx(expected, rel=1e-5)


def test_custom_call_double_sum():
    program = define("grad_custom_double", [spec(f32, lane=4)], double_sum_loss)
    (call,) = [op for op in program.operations if op.kind == "custom_call"]
    assert (call.attrs["target"], call.attrs["version"], call.type) == (
        CUSTOM_DOUBLE,
        1,
        spec(f32, lane=4),
    )
    doubles = {(CUSTOM_DOUBLE, 1): lambda x: x + x}
    # 2 * (1 + 2 + 3 + 4)
    assert scalar_of(program, lane(1, 2, 3, 4), custom_calls=doubles) == 20.0


def test_seed_programs_are_scan_free_and_typed_at_every_value():
    programs = [
        define("a", [spec(f32, lane=4)] * 2, elementwise_loss),
        define("b", [spec(f32, lane=4)], relu_loss),
        attention_program(),
    ]
    for program in programs:
        assert not program.contains_scan()
        for op in program.operations:
            assert op.result_types == tuple(program.type_of(r) for r in op.results)
