"""The 22 tests of grad.zig (the Zig program accy's first tests were ported from), under
their own names.

Where grad.zig executes on the native CPU, these run through every available executor of
`tests/executors.py` (the reference evaluator always; the native CPU backend when it exists and
a C compiler is present). The two live-CUDA tests skip with a reason naming the gate.
"""

from __future__ import annotations

import numpy as np
import pytest

import accy
import accy.compat
from accy import f32, i32, spec
from accy.trace import define

from ..executors import EXECUTORS, cuda_device_or_skip
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
    plain_sum_loss,
    relu_loss,
    tan_loss,
    transposed_projection_loss,
)

ATTENTION_TOKENS, ATTENTION_CHANNELS, MASK_PENALTY = 4, 3, -30.0


def lane_specs(count):
    return [spec(f32, lane=4)] * count


def extents(program, value):
    return program.type_of(value).extents


# -- user rules of grad.zig ---------------------------------------------------------------------


class GeneratedGradCounter:
    def __init__(self, counts):
        self.counts = counts

    def _count(self, ctx, kind):
        if ctx.op.id == accy.SYNTHETIC_ID:
            self.counts[kind] += 1
        return ctx.default()

    def constant(self, ctx):
        return self._count(ctx, "constant")

    def mul(self, ctx):
        return self._count(ctx, "mul")

    def broadcast_in_dim(self, ctx):
        return self._count(ctx, "broadcast_in_dim")


def new_counts():
    return {"constant": 0, "mul": 0, "broadcast_in_dim": 0}


class DoubleJvpRule:
    def __init__(self):
        self.applied = 0

    def bind(self, ctx):
        if ctx.op.kind == "custom_call" and ctx.op.attrs["target"] == CUSTOM_DOUBLE:
            self.applied += 1
            builder = ctx.builder_handle()
            target, version = ctx.op.attrs["target"], ctx.op.attrs["version"]
            return accy.Dual(
                primal=builder.custom_call(target, version, [ctx.args[0].primal], ctx.op.type),
                tangent=builder.custom_call(target, version, [ctx.args[0].tangent], ctx.op.type),
            )
        return ctx.default()


class DoubleVjpRule:
    def __init__(self):
        self.applied = 0

    def custom_call(self, ctx):
        self.applied += 1
        if not ctx.operand_is_active(0):
            return
        builder = ctx.builder_handle()
        contribution = builder.custom_call(
            ctx.custom.target, ctx.custom.version, [ctx.cotangent], ctx.cotangent.ty
        )
        ctx.contribute(0, contribution)


# -- the tests ----------------------------------------------------------------------------------


def test_grad_derives_scalar_output_gradients_through_pullback():
    source = define("grad_elementwise", lane_specs(2), elementwise_loss)
    differentiated = accy.grad(source, wrt=(0, 1))
    assert len(differentiated.parameters) == 2
    assert len(differentiated.outputs) == 2
    assert extents(differentiated, differentiated.outputs[0]) == (4,)
    assert extents(differentiated, differentiated.outputs[1]) == (4,)


def test_grad_transposes_gather_with_scatter_add():
    source = define(
        "grad_embedding_lookup",
        [spec(f32, vocab=16, channel=4), spec(i32, token=3)],
        embedding_lookup_loss,
    )
    differentiated = accy.grad(source, wrt=(0,))
    assert len(differentiated.parameters) == 2
    assert extents(differentiated, differentiated.parameters[0]) == (16, 4)
    assert extents(differentiated, differentiated.parameters[1]) == (3,)
    assert len(differentiated.outputs) == 1
    assert extents(differentiated, differentiated.outputs[0]) == (16, 4)
    assert differentiated.count("scatter_add") >= 1


def test_grad_with_routes_generated_ops_through_user_semantics():
    source = define("grad_with_elementwise", lane_specs(2), elementwise_loss)
    counts, seed_counts = new_counts(), new_counts()
    differentiated = accy.grad_with(
        source,
        wrt=(0, 1),
        hooks={
            "linearize": accy.interpret.bind(GeneratedGradCounter(counts)),
            "pullback": accy.interpret.bind(GeneratedGradCounter(counts)),
            "seed": accy.interpret.bind(GeneratedGradCounter(seed_counts)),
        },
    )
    assert counts["mul"] >= 4
    assert counts["broadcast_in_dim"] >= 1
    assert seed_counts["constant"] == 1
    assert len(differentiated.parameters) == 2
    assert len(differentiated.outputs) == 2
    assert extents(differentiated, differentiated.outputs[0]) == (4,)
    assert extents(differentiated, differentiated.outputs[1]) == (4,)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_grad_differentiates_relu_through_select(executor):
    source = define("grad_relu", lane_specs(1), relu_loss)
    differentiated = accy.grad(source, wrt=(0,))
    assert len(differentiated.outputs) == 1
    assert extents(differentiated, differentiated.outputs[0]) == (4,)
    # Beyond grad.zig: the values. At the kink x == 0 the tie splits the derivative evenly.
    (gradient,) = executor(differentiated, [np.array([-1.0, 0.0, 2.0, 3.0], np.float32)])
    np.testing.assert_array_equal(gradient, [0.0, 0.5, 1.0, 1.0])


def test_grad_differentiates_pow_with_inactive_exponent():
    source = define("grad_cube", lane_specs(1), cube_loss)
    differentiated = accy.grad(source, wrt=(0,))
    assert len(differentiated.outputs) == 1
    assert extents(differentiated, differentiated.outputs[0]) == (4,)
    logs = [
        op for op in differentiated.operations if op.kind == "unary" and op.attrs["op"] == "log"
    ]
    assert logs == []


@pytest.mark.parametrize("executor", EXECUTORS)
def test_grad_preserves_source_parameters_when_no_residuals_are_needed(executor):
    source = define("grad_plain_sum", lane_specs(1), plain_sum_loss)
    differentiated = accy.grad(source, wrt=(0,))
    assert len(differentiated.parameters) == 1
    assert extents(differentiated, differentiated.parameters[0]) == (4,)
    assert len(differentiated.outputs) == 1
    assert extents(differentiated, differentiated.outputs[0]) == (4,)
    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    (gradient,) = executor(differentiated, [x])
    np.testing.assert_array_equal(gradient, [1.0, 1.0, 1.0, 1.0])


@pytest.mark.parametrize("executor", EXECUTORS)
def test_grad_executes_with_an_unused_parameter_on_native_cpu(executor):
    source = define(
        "grad_unused_parameter_cpu",
        [spec(f32, vocab=4, channel=2), spec(i32, token=3)],
        embedding_lookup_loss,
    )
    differentiated = accy.grad(source, wrt=(0,))
    assert len(differentiated.parameters) == 2
    assert extents(differentiated, differentiated.parameters[0]) == (4, 2)
    assert extents(differentiated, differentiated.parameters[1]) == (3,)
    table = np.array([0.5, -1.0, 2.0, 0.25, 3.0, -2.0, 1.5, 0.75], np.float32).reshape(4, 2)
    indices = np.array([2, 0, 2], np.int32)
    (table_grad,) = executor(differentiated, [table, indices])
    np.testing.assert_array_equal(table_grad.ravel(), [1.0, 1.0, 0.0, 0.0, 2.0, 2.0, 0.0, 0.0])


def test_value_and_grad_emits_the_loss_ahead_of_the_gradients():
    source = define("value_and_grad_elementwise", lane_specs(2), elementwise_loss)
    combined = accy.value_and_grad(source, wrt=(0, 1))
    assert len(combined.parameters) == 2
    assert extents(combined, combined.parameters[0]) == (4,)
    assert extents(combined, combined.parameters[1]) == (4,)
    assert len(combined.outputs) == 3
    assert extents(combined, combined.outputs[0]) == ()
    assert extents(combined, combined.outputs[1]) == (4,)
    assert extents(combined, combined.outputs[2]) == (4,)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_value_and_grad_computes_the_loss_and_gradients_in_one_launch(executor):
    source = define("value_and_grad_numeric", lane_specs(2), elementwise_loss)
    combined = accy.value_and_grad(source, wrt=(0, 1))
    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    y = np.array([0.5, -1.0, 2.0, 0.25], np.float32)
    loss, x_grad, y_grad = executor(combined, [x, y])
    assert abs(float(loss) - 5.5) <= 1e-6
    np.testing.assert_array_equal(x_grad, y)
    np.testing.assert_array_equal(y_grad, x)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_grad_differentiates_reduce_max(executor):
    source = define("grad_reduce_max", lane_specs(1), max_loss)
    differentiated = accy.grad(source, wrt=(0,))
    assert len(differentiated.outputs) == 1
    assert extents(differentiated, differentiated.outputs[0]) == (4,)
    (gradient,) = executor(differentiated, [np.array([1.0, 5.0, 2.0, 5.0], np.float32)])
    np.testing.assert_array_equal(gradient, [0.0, 0.5, 0.0, 0.5])  # the tie splits evenly


@pytest.mark.parametrize("executor", EXECUTORS)
def test_grad_differentiates_reduce_max_init_parameter(executor):
    source = define(
        "grad_reduce_max_init", [spec(f32, lane=4), spec(f32)], max_loss_with_init_param
    )
    differentiated = accy.grad(source, wrt=(0, 1))
    assert len(differentiated.outputs) == 2
    assert extents(differentiated, differentiated.outputs[0]) == (4,)
    assert extents(differentiated, differentiated.outputs[1]) == ()
    x = np.array([1.0, 3.0, 2.0, 0.0], np.float32)
    x_grad, init_grad = executor(differentiated, [x, np.float32(7.0)])
    np.testing.assert_array_equal(x_grad, [0, 0, 0, 0])
    assert float(init_grad) == 1.0
    x_grad, init_grad = executor(differentiated, [x, np.float32(3.0)])  # init ties with x[1]
    np.testing.assert_array_equal(x_grad, [0, 0.5, 0, 0])
    assert float(init_grad) == 0.5


@pytest.mark.parametrize("executor", EXECUTORS)
def test_grad_differentiates_abs_through_the_sign_mask(executor):
    source = define("grad_abs", lane_specs(1), abs_loss)
    differentiated = accy.grad(source, wrt=(0,))
    assert extents(differentiated, differentiated.outputs[0]) == (4,)
    (gradient,) = executor(differentiated, [np.array([-2.0, 0.0, 3.0, -0.5], np.float32)])
    np.testing.assert_array_equal(gradient, [-1.0, 0.0, 1.0, -1.0])


@pytest.mark.parametrize("executor", EXECUTORS)
def test_grad_differentiates_tan(executor):
    source = define("grad_tan", lane_specs(1), tan_loss)
    differentiated = accy.grad(source, wrt=(0,))
    assert extents(differentiated, differentiated.outputs[0]) == (4,)
    x = np.array([0.1, -0.4, 0.7, 1.2], np.float32)
    (gradient,) = executor(differentiated, [x])
    np.testing.assert_allclose(gradient, 1.0 / np.cos(x.astype(np.float64)) ** 2, rtol=1e-5)


def test_grad_requires_scalar_output():
    source = define("grad_vector", lane_specs(2), lambda b, args: args[0] * args[1])
    with pytest.raises(accy.GradientRequiresScalarOutput, match="one scalar"):
        accy.grad(source, wrt=(0,))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_grad_executes_batched_dot_general_gradients_on_native_cpu(executor):
    batch, m, k, n = 2, 2, 3, 2
    source = define(
        "grad_batched_dot_general_cpu",
        [spec(f32, b=batch, m=m, k=k), spec(f32, b=batch, k=k, n=n), spec(f32, b=batch, m=m, n=n)],
        batched_dot_general_loss,
    )
    differentiated = accy.grad(source, wrt=(0, 1))
    lhs = np.array(
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, -1.0, 0.5, 2.0, 3.0, -2.0, 1.0], np.float32
    ).reshape(batch, m, k)
    rhs = np.array(
        [7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 0.25, -1.0, 2.0, -3.0, 4.0, 0.5], np.float32
    ).reshape(batch, k, n)
    weights = np.array([1.0, -0.5, 0.25, 2.0, -1.5, 0.75, 3.0, -2.0], np.float32).reshape(
        batch, m, n
    )
    lhs_grad, rhs_grad = executor(differentiated, [lhs, rhs, weights])
    expected_lhs = np.zeros_like(lhs)
    expected_rhs = np.zeros_like(rhs)
    for b in range(batch):
        for row in range(m):
            for inner in range(k):
                expected_lhs[b, row, inner] = sum(
                    weights[b, row, col] * rhs[b, inner, col] for col in range(n)
                )
        for inner in range(k):
            for col in range(n):
                expected_rhs[b, inner, col] = sum(
                    lhs[b, row, inner] * weights[b, row, col] for row in range(m)
                )
    assert len(differentiated.outputs) == 2
    np.testing.assert_allclose(lhs_grad, expected_lhs, atol=1e-6)
    np.testing.assert_allclose(rhs_grad, expected_rhs, atol=1e-6)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_grad_executes_noncanonical_dot_general_gradients_on_native_cpu(executor):
    source = define(
        "grad_noncanonical_dot_cpu",
        [spec(f32, k=3, m=2), spec(f32, k=3, n=2)],
        transposed_projection_loss,
    )
    differentiated = accy.grad(source, wrt=(0, 1))
    lhs = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], np.float32)
    rhs = np.array([0.5, -1.0, 2.0, 0.25, -0.75, 1.5], np.float32)
    lhs_grad, rhs_grad = executor(differentiated, [lhs.reshape(3, 2), rhs.reshape(3, 2)])
    lhs_grad, rhs_grad = lhs_grad.ravel(), rhs_grad.ravel()
    for k in range(3):
        rhs_row_sum = rhs[k * 2] + rhs[k * 2 + 1]
        lhs_row_sum = lhs[k * 2] + lhs[k * 2 + 1]
        assert abs(lhs_grad[k * 2] - rhs_row_sum) <= 1e-6
        assert abs(lhs_grad[k * 2 + 1] - rhs_row_sum) <= 1e-6
        assert abs(rhs_grad[k * 2] - lhs_row_sum) <= 1e-6
        assert abs(rhs_grad[k * 2 + 1] - lhs_row_sum) <= 1e-6


def attention_noise(seed: int) -> float:
    """grad.zig's splitmix64-style noise in [-1, 1]."""
    mask = (1 << 64) - 1
    state = (seed + 0x9E3779B97F4A7C15) & mask
    state = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & mask
    state = ((state ^ (state >> 27)) * 0x94D049BB133111EB) & mask
    state ^= state >> 31
    return 2.0 * float(state & 0xFFFF) / 65535.0 - 1.0


@pytest.mark.parametrize("executor", EXECUTORS)
def test_value_and_grad_matches_finite_differences_through_causal_attention(executor):
    tokens, channels = ATTENTION_TOKENS, ATTENTION_CHANNELS
    source = define(
        "grad_causal_attention_fd",
        [spec(f32, token=tokens, channel=channels)] * 3 + [spec(f32, token=tokens, key=tokens)],
        causal_attention_loss,
    )
    combined = accy.value_and_grad(source, wrt=(0, 1, 2))
    inputs = [
        np.array(
            [attention_noise(t * 1000 + e) for e in range(tokens * channels)], np.float32
        ).reshape(tokens, channels)
        for t in range(3)
    ]
    rows, cols = np.indices((tokens, tokens))
    mask = np.where(cols <= rows, 0.0, MASK_PENALTY).astype(np.float32)
    _, *gradients = executor(combined, inputs + [mask])
    step = np.float32(0.01)
    for t in range(3):
        for e in range(tokens * channels):
            probes = []
            for offset in (step, -step):
                perturbed = [x.copy() for x in inputs]
                perturbed[t].reshape(-1)[e] += offset
                (loss,) = executor(source, perturbed + [mask])
                probes.append(float(loss))
            finite_difference = (probes[0] - probes[1]) / (2.0 * float(step))
            analytic = float(gradients[t].reshape(-1)[e])
            tolerance = 0.002 + 0.02 * abs(finite_difference)
            assert abs(finite_difference - analytic) <= tolerance


def test_grad_with_rules_differentiates_custom_calls_through_both_contracts():
    source = define("grad_custom_double", lane_specs(1), double_sum_loss)
    jvp_rule, vjp_rule = DoubleJvpRule(), DoubleVjpRule()
    differentiated = accy.grad_with_rules(source, (0,), jvp_rule, vjp_rule)
    assert jvp_rule.applied == 1
    assert vjp_rule.applied == 1
    assert len(differentiated.parameters) == 1
    assert len(differentiated.outputs) == 1
    assert extents(differentiated, differentiated.outputs[0]) == (4,)
    custom_calls = [op for op in differentiated.operations if op.kind == "custom_call"]
    assert all(op.attrs["target"] == CUSTOM_DOUBLE for op in custom_calls)
    assert len(custom_calls) >= 1


def test_grad_with_accepts_custom_call_contracts_through_public_hooks():
    source = define("grad_public_custom_double", lane_specs(1), double_sum_loss)
    jvp_rule, vjp_rule = DoubleJvpRule(), DoubleVjpRule()
    differentiated = accy.grad_with(
        source, wrt=(0,), hooks={"jvp": accy.interpret.bind(jvp_rule), "vjp": vjp_rule}
    )
    assert jvp_rule.applied == 1
    assert vjp_rule.applied == 1
    assert len(differentiated.parameters) == 1
    assert len(differentiated.outputs) == 1
    assert extents(differentiated, differentiated.outputs[0]) == (4,)
    # Beyond grad.zig: evaluated with a reference implementation of the target, the gradient
    # of sum(2x) is 2 everywhere.
    (gradient,) = accy.reference.run(
        differentiated,
        [np.arange(4, dtype=np.float32)],
        custom_calls={(CUSTOM_DOUBLE, 1): lambda x: x + x},
    )
    np.testing.assert_array_equal(gradient, [2.0, 2.0, 2.0, 2.0])


def test_grad_with_rules_still_rejects_missing_contracts_by_name():
    source = define("grad_custom_opaque", lane_specs(1), double_sum_loss)
    with pytest.raises(accy.CustomCallRequiresJvpContract, match="accy.custom.double"):
        accy.grad_with_rules(source, (0,), None, DoubleVjpRule())
    with pytest.raises(accy.CustomCallRequiresVjpContract, match="accy.custom.double"):
        accy.grad_with_rules(source, (0,), DoubleJvpRule(), None)


def test_value_and_grad_executes_loss_and_gradients_in_one_launch_on_live_cuda():
    handle = accy.compat.gpu.cuda.State.init_device(cuda_device_or_skip()).handle()
    source = define("live_value_and_grad", lane_specs(2), elementwise_loss)
    combined = accy.value_and_grad(source, wrt=(0, 1))
    options = accy.compat.lower.FragmentCompilerOptions(artifact_format="cuda_c")
    compiled = accy.compat.lower.compile_fragment(handle, combined, options)
    fragment = accy.compat.executable.load_fragment(handle, compiled, options)
    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    y = np.array([0.5, -1.0, 2.0, 0.25], np.float32)
    loss = np.full((), -1.0, np.float32)
    x_grad = np.full(4, -1.0, np.float32)
    y_grad = np.full(4, -1.0, np.float32)
    accy.compat.executable.invoke(fragment, [x, y], [loss, x_grad, y_grad])
    assert abs(float(loss) - 5.5) <= 1e-6
    np.testing.assert_array_equal(x_grad, y)
    np.testing.assert_array_equal(y_grad, x)


def test_grad_with_custom_call_gradient_executes_on_live_cuda():
    handle = accy.compat.gpu.cuda.State.init_device(cuda_device_or_skip()).handle()
    from accy.kernel.examples import custom_double_kernel

    artifact = custom_double_kernel().create_kernel_call_artifact(
        accy.kernel.Limits.testing, handle, target=CUSTOM_DOUBLE, version=1, format="cuda_ptx"
    )
    registry = artifact.registry()
    source = define("live_grad_custom_double", lane_specs(1), double_sum_loss)
    jvp_rule, vjp_rule = DoubleJvpRule(), DoubleVjpRule()
    differentiated = accy.grad_with(
        source, wrt=(0,), hooks={"jvp": accy.interpret.bind(jvp_rule), "vjp": vjp_rule}
    )
    options = accy.compat.lower.FragmentCompilerOptions(
        artifact_format="cuda_c", kernel_call_registry=registry
    )
    compiled = accy.compat.lower.compile_fragment(handle, differentiated, options)
    fragment = accy.compat.executable.load_fragment(handle, compiled, options)
    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    bindings = accy.compat.executable.prepare_invocation(fragment, [x])
    bindings.launch()
    gradient = np.full(4, -1.0, np.float32)
    bindings.read_output(0, gradient)
    np.testing.assert_allclose(gradient, 2.0, atol=1e-6)
