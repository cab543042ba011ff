"""grad.zig's custom double kernel as the implementation of its custom call.

Until the native backends link kernels themselves, the reference evaluator runs the kernel's
compiled C for every `custom_call` in grad.zig's differentiated program: the gradient of
sum(double(x)) must be 2 everywhere.
"""

from __future__ import annotations

import numpy as np

import accy
from accy.kernel import Limits
from accy.kernel.examples import CUSTOM_DOUBLE_TARGET, custom_double_kernel

LANE = accy.spec(accy.f32, lane=4)


def double_sum_loss(b, args):
    doubled = b.custom_call(CUSTOM_DOUBLE_TARGET, 1, [args[0]], args[0].ty)
    return doubled.sum("lane")


class DoubleJvpRule:
    """grad.zig's JVP contract: double is linear, so the tangent is doubled too."""

    def bind(self, ctx):
        if ctx.op.kind != "custom_call" or ctx.op.attrs["target"] != CUSTOM_DOUBLE_TARGET:
            return ctx.default()
        builder = ctx.builder_handle()
        target, version = ctx.op.attrs["target"], ctx.op.attrs["version"]
        return accy.Dual(
            primal=builder.custom_call(target, version, [ctx.args[0].primal], ctx.op.type),
            tangent=builder.custom_call(target, version, [ctx.args[0].tangent], ctx.op.type),
        )


class DoubleVjpRule:
    """grad.zig's VJP contract: the cotangent goes through the same kernel."""

    def custom_call(self, ctx):
        if ctx.operand_is_active(0):
            builder = ctx.builder_handle()
            ct = ctx.cotangent
            ctx.contribute(
                0, builder.custom_call(ctx.custom.target, ctx.custom.version, [ct], ct.ty)
            )


def _kernel_implementations():
    registry = (
        custom_double_kernel()
        .create_kernel_call_artifact(
            Limits.testing, None, target=CUSTOM_DOUBLE_TARGET, version=1, format="cpu_object"
        )
        .registry()
    )
    call = registry.require(CUSTOM_DOUBLE_TARGET, 1)
    calls = []

    def run_kernel(x):
        calls.append(x)
        return call.run_on_cpu([x], LANE)

    return {(CUSTOM_DOUBLE_TARGET, 1): run_kernel}, calls


def test_forward_custom_call_runs_the_kernel():
    source = accy.trace.define("custom_double_forward", [LANE], double_sum_loss)
    implementations, calls = _kernel_implementations()
    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    (loss,) = accy.reference.run(source, [x], custom_calls=implementations)
    assert float(loss) == 20.0 and len(calls) == 1


def test_seed_custom_call_gradient_through_the_kernel():
    source = accy.trace.define("grad_custom_double", [LANE], double_sum_loss)
    differentiated = accy.grad_with(
        source,
        wrt=(0,),
        hooks={"jvp": accy.interpret.bind(DoubleJvpRule()), "vjp": DoubleVjpRule()},
    )
    implementations, calls = _kernel_implementations()
    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    (gradient,) = accy.reference.run(differentiated, [x], custom_calls=implementations)
    np.testing.assert_array_equal(gradient, [2.0, 2.0, 2.0, 2.0])
    assert calls, "the differentiated program's custom call ran the kernel"


def test_seed_custom_call_gradient_executes_on_the_native_cpu_backend():
    # grad.zig's "gradWith custom-call gradient executes on live CUDA", on the native CPU backend:
    # the backend links the kernel's C into the compiled program through the registry.
    import accy.compat
    import accy.lower
    from accy.compat.gpu.cpu import State

    handle = State().handle()
    registry = (
        custom_double_kernel()
        .create_kernel_call_artifact(
            Limits.testing, handle, target=CUSTOM_DOUBLE_TARGET, version=1, format="cpu_object"
        )
        .registry()
    )
    source = accy.trace.define("native_grad_custom_double", [LANE], double_sum_loss)
    differentiated = accy.grad_with(
        source,
        wrt=(0,),
        hooks={"jvp": accy.interpret.bind(DoubleJvpRule()), "vjp": DoubleVjpRule()},
    )
    options = accy.compat.lower.FragmentCompilerOptions(kernel_call_registry=registry)
    compiled = accy.compat.lower.compile_fragment(handle, differentiated, options)
    fragment = accy.compat.executable.load_fragment(handle, compiled, options)
    inputs = [np.array([1, 2, 3, 4], np.float32)]
    bindings = accy.compat.executable.prepare_invocation(fragment, inputs)
    bindings.launch()
    gradient = np.full(4, -1.0, np.float32)
    bindings.read_output(0, gradient)
    np.testing.assert_allclose(gradient, 2.0, atol=1e-6)
