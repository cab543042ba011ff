"""`accy.CustomCall`: one record gives a custom call its type, its reference implementation, its
kernels and its derivative; the reference evaluator, the gradient functions and `accy.compile`
find it without any per-call argument. Derivatives are checked against central finite
differences (`accy.testing.check_grads`) and against NumPy formulas worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

import accy
import accy.compat
from accy import f32, f64, spec
from accy.kernel import KernelCallNotFound, KernelError, Limits
from accy.kernel.examples import custom_double_kernel, map_kernel
from accy.testing import check_grads

from ..executors import cuda_device_or_skip

LANE = spec(f32, lane=4)
X = np.array([0.3, -1.2, 0.7, 2.0], np.float32)


def same_type(x):
    return x


def sum_of(record):
    """The program sum_lane(record(x)) on one f32[lane=4] parameter."""
    return accy.trace.define(f"sum_{record.target}", [LANE], lambda b, a: record(a[0]).sum("lane"))


def native_cpu_or_skip():
    try:
        accy.backends.cpu.find_compiler()
    except accy.RuntimeUnavailable:
        pytest.skip("native CPU backend: no C compiler")


# -- records used by several tests ----------------------------------------------------------------


def sin_with_jvp():
    """sin, differentiated only through a JVP rule (reverse mode transposes the rule's mul)."""
    return accy.CustomCall(
        "test.sin",
        version=1,
        result_type=same_type,
        reference=np.sin,
        jvp=lambda e, primals, tangents, result: e.mul(tangents[0], e.unary("cos", primals[0])),
    )


def exp_with_vjp():
    """exp, differentiated only through a VJP rule, which reuses the primal result."""
    return accy.CustomCall(
        "test.exp",
        version=1,
        result_type=same_type,
        reference=np.exp,
        vjp=lambda e, primals, result, ct: [e.mul(ct, result)],
    )


class Counted:
    """Wraps a rule and counts its applications."""

    def __init__(self, rule):
        self.rule, self.applied = rule, 0

    def __call__(self, *args):
        self.applied += 1
        return self.rule(*args)


# -- reference evaluation -------------------------------------------------------------------------


def test_the_reference_evaluator_runs_the_records_implementation():
    sin_with_jvp()
    program = accy.trace.define("sin", [LANE], lambda b, a: accy.custom.lookup("test.sin", 1)(a[0]))
    (result,) = accy.reference.run(program, [X])
    np.testing.assert_allclose(result, np.sin(X), rtol=1e-6)
    (compiled,) = accy.compile(program, device="reference")(X)
    np.testing.assert_allclose(compiled, np.sin(X), rtol=1e-6)


def test_custom_calls_argument_overrides_the_record():
    sin = sin_with_jvp()
    program = accy.trace.define("sin", [LANE], lambda b, a: sin(a[0]))
    (result,) = accy.reference.run(program, [X], custom_calls={("test.sin", 1): np.cos})
    np.testing.assert_allclose(result, np.cos(X), rtol=1e-6)


def test_register_custom_call_creates_then_updates_the_records_reference():
    accy.reference.register_custom_call("test.legacy", 2, lambda x: 2 * x)
    record = accy.custom.lookup("test.legacy", 2)
    assert record is not None and record.jvp is None
    program = accy.trace.define(
        "legacy", [LANE], lambda b, a: b.custom_call("test.legacy", 2, [a[0]], LANE)
    )
    np.testing.assert_array_equal(accy.reference.run(program, [X])[0], 2 * X)
    accy.reference.register_custom_call("test.legacy", 2, lambda x: 3 * x)
    assert accy.custom.lookup("test.legacy", 2) is record
    np.testing.assert_allclose(accy.reference.run(program, [X])[0], 3 * X, rtol=1e-6)


def test_a_call_without_a_reference_implementation_says_how_to_declare_one():
    accy.CustomCall("test.no_reference", result_type=same_type)
    program = sum_of(accy.custom.lookup("test.no_reference", 1))
    with pytest.raises(accy.AccyError, match=r"accy.CustomCall\('test.no_reference'"):
        accy.reference.run(program, [X])


# -- derivatives ------------------------------------------------------------------------------


def test_jvp_only_gives_forward_and_reverse_mode():
    source = sum_of(sin_with_jvp())
    (gradient,) = accy.reference.run(accy.grad(source), [X])
    np.testing.assert_allclose(gradient, np.cos(X), rtol=1e-6)
    # The program's own custom call is the only one: reverse mode transposed the rule's mul.
    assert accy.grad(source).count("custom_call") == 0
    tangent = np.array([1.0, 0.5, -2.0, 0.0], np.float32)
    _, derivative = accy.reference.run(accy.jvp(source), [X, tangent])
    np.testing.assert_allclose(derivative, np.sum(np.cos(X) * tangent), rtol=1e-6)
    check_grads(source, [X], order=2)


def test_vjp_only_gives_reverse_mode_and_refuses_forward_mode():
    source = sum_of(exp_with_vjp())
    gradient_program = accy.grad(source)
    (gradient,) = accy.reference.run(gradient_program, [X])
    np.testing.assert_allclose(gradient, np.exp(X), rtol=1e-6)
    assert not any(op.attrs.get("linearized") for op in gradient_program.operations)
    check_grads(source, [X], order=2, modes=("rev",))
    with pytest.raises(accy.CustomCallRequiresJvpContract, match="'test.exp'.*VJP rule"):
        accy.jvp(source)


def test_with_both_rules_forward_mode_uses_the_jvp_and_reverse_mode_the_vjp():
    jvp = Counted(lambda e, primals, tangents, result: e.mul(tangents[0], result))
    vjp = Counted(lambda e, primals, result, ct: [e.mul(ct, result)])
    exp = accy.CustomCall("test.exp2", result_type=same_type, reference=np.exp, jvp=jvp, vjp=vjp)
    source = sum_of(exp)
    accy.grad(source)
    assert (jvp.applied, vjp.applied) == (0, 1)
    accy.jvp(source)
    assert (jvp.applied, vjp.applied) == (1, 1)
    check_grads(source, [X], order=2)


def test_with_symbolic_zeros_the_forward_and_vjp_rules_see_which_operands_are_perturbed():
    seen = []

    def forward(e, primals, perturbed):
        seen.append(("forward", tuple(perturbed)))
        return e.mul(primals[0], primals[1])

    def vjp(e, primals, result, ct, perturbed):
        seen.append(("vjp", tuple(perturbed)))
        x, y = primals
        return [e.mul(ct, y) if perturbed[0] else None, e.mul(ct, x) if perturbed[1] else None]

    product = accy.CustomCall(
        "test.product",
        result_type=lambda x, y: x,
        reference=np.multiply,
        forward=forward,
        vjp=vjp,
        symbolic_zeros=True,
    )
    source = accy.trace.define(
        "product", [LANE, LANE], lambda b, a: product(a[0], a[1]).sum("lane")
    )
    y = X[::-1].copy()
    (gradient,) = accy.reference.run(accy.grad(source, wrt=(1,)), [X, y])
    np.testing.assert_allclose(gradient, X, rtol=1e-6)
    assert seen == [("forward", (False, True)), ("vjp", (False, True))]
    seen.clear()
    gradients = accy.reference.run(accy.grad(source, wrt=(0, 1)), [X, y])
    np.testing.assert_allclose(gradients, [y, X], rtol=1e-6)
    assert seen == [("forward", (True, True)), ("vjp", (True, True))]


def test_value_and_grad_and_vjp_find_the_record():
    exp = exp_with_vjp()
    source = accy.trace.define("two_outputs", [LANE], lambda b, a: exp(a[0]))
    cotangent = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    primal, gradient = accy.reference.run(accy.vjp(source), [X, cotangent])
    np.testing.assert_allclose(primal, np.exp(X), rtol=1e-6)
    np.testing.assert_allclose(gradient, cotangent * np.exp(X), rtol=1e-6)
    loss, gradient = accy.reference.run(accy.value_and_grad(sum_of(exp)), [X])
    np.testing.assert_allclose(loss, np.exp(X).sum(), rtol=1e-6)
    np.testing.assert_allclose(gradient, np.exp(X), rtol=1e-6)


def test_a_vjp_through_a_backward_custom_call_with_fallbacks_for_higher_orders():
    backward = accy.CustomCall(
        "test.square_backward",
        result_type=lambda x, ct: x,
        reference=lambda x, ct: 2 * x * ct,
        fallback=lambda x, ct: x * ct * 2.0,
    )
    square = accy.CustomCall(
        "test.square",
        result_type=same_type,
        reference=np.square,
        vjp=lambda e, primals, result, ct: [backward.call(e, primals[0], ct)],
        fallback=lambda x: x * x,
    )
    source = accy.trace.define("cubic", [LANE], lambda b, a: (square(a[0]) * a[0]).sum("lane"))
    gradient_program = accy.grad(source)
    calls = [op for op in gradient_program.operations if op.kind == "custom_call"]
    targets = sorted(op.attrs["target"] for op in calls)
    assert [t for t in targets if t.startswith("test.")] == ["test.square", "test.square_backward"]
    np.testing.assert_allclose(accy.reference.run(gradient_program, [X])[0], 3 * X**2, rtol=1e-6)
    check_grads(source, [X], order=2)  # forward mode and second order use the fallbacks


def test_a_fallback_alone_differentiates_in_both_modes():
    softplus = accy.CustomCall(
        "test.softplus",
        result_type=same_type,
        reference=lambda x: np.log1p(np.exp(x)),
        fallback=lambda x: (x.exp() + 1.0).log(),
    )
    source = sum_of(softplus)
    (gradient,) = accy.reference.run(accy.grad(source), [X])
    np.testing.assert_allclose(gradient, 1 / (1 + np.exp(-X)), rtol=1e-6)
    check_grads(source, [X], order=2)


def test_user_rules_are_consulted_before_the_record():
    record_jvp = Counted(lambda e, primals, tangents, result: e.mul(tangents[0], 2.0))
    accy.CustomCall("test.double", result_type=same_type, reference=lambda x: 2 * x, jvp=record_jvp)

    class UserJvp:
        applied = 0

        def custom_call(self, ctx):
            self.applied += 1
            builder = ctx.builder_handle()
            attrs = ctx.op.attrs
            return accy.Dual(
                builder.custom_call(attrs["target"], attrs["version"], [ctx.args[0].primal], LANE),
                ctx.args[0].tangent * 3.0,
            )

    user = UserJvp()
    source = sum_of(accy.custom.lookup("test.double", 1))
    (gradient,) = accy.reference.run(accy.grad_with_rules(source, (0,), user, None), [X])
    assert (user.applied, record_jvp.applied) == (1, 0)
    np.testing.assert_allclose(gradient, 3.0)
    (gradient,) = accy.reference.run(accy.grad_with_rules(source, (0,), None, None), [X])
    assert record_jvp.applied == 1
    np.testing.assert_allclose(gradient, 2.0)


def test_a_linear_call_in_a_jvp_rule_is_transposed_by_the_vjp_rule():
    # grad.zig's contracts as one record: double is linear, so its JVP applies it to the tangent
    # and its VJP to the cotangent.
    double = accy.CustomCall(
        "test.linear_double",
        result_type=same_type,
        reference=lambda x: 2 * x,
        jvp=lambda e, primals, tangents, result: double.call(e, tangents[0]),
        vjp=lambda e, primals, result, ct: [double.call(e, ct)],
    )
    source = sum_of(double)
    np.testing.assert_array_equal(accy.reference.run(accy.grad(source), [X])[0], 2.0)
    transposed = accy.linear_transpose(accy.trace.define("d", [LANE], lambda b, a: double(a[0])))
    np.testing.assert_array_equal(accy.reference.run(transposed, [X])[0], 2 * X)


# -- kernels on the backends ----------------------------------------------------------------------


def square_records(format):
    """x*x and its backward 2*x*ct, each with a kernel from the kernel DSL for `format`."""
    backward = accy.CustomCall(
        "test.kernel_square_backward",
        result_type=lambda x, ct: x,
        reference=lambda x, ct: 2 * x * ct,
        kernels={
            format: map_kernel(
                "record_square_backward4",
                f32,
                [f32, f32],
                lambda inner, x, ct: x.mul(inner, ct).mul(inner, 2.0),
                4,
            )
        },
    )
    square = accy.CustomCall(
        "test.kernel_square",
        result_type=same_type,
        reference=np.square,
        vjp=lambda e, primals, result, ct: [backward.call(e, primals[0], ct)],
        kernels={format: map_kernel("record_square4", f32, [f32], lambda i, x: x.mul(i, x), 4)},
    )
    source = accy.trace.define(
        "kernel_cubic", [LANE], lambda b, a: (square(a[0]) * a[0].sin()).sum("lane")
    )
    return square, backward, source


def expected_cubic(x):
    """sum(x^2 sin x) and its gradient 2x sin x + x^2 cos x, in float64."""
    x = x.astype(np.float64)
    return np.sum(x**2 * np.sin(x)), 2 * x * np.sin(x) + x**2 * np.cos(x)


def test_grad_on_the_native_cpu_links_the_records_kernels():
    native_cpu_or_skip()
    _, _, source = square_records("cpu")
    check_grads(source, [X], modes=("rev",), order=1)  # the references, in float64
    combined = accy.value_and_grad(source)
    loss, gradient = accy.compile(combined, device="cpu")(X)  # no kernel_call_registry
    want_loss, want_gradient = expected_cubic(X)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(gradient, want_gradient, rtol=1e-5, atol=1e-6)
    # The fragment API (accy.compat) finds the kernels too.
    options = accy.compat.lower.FragmentCompilerOptions()
    compiled = accy.compat.lower.compile_fragment(None, combined, options)
    assert "accy_kernel_record_square_backward4" in compiled.source


def test_grad_on_cuda_links_the_records_kernels():
    cuda_device_or_skip()
    _, _, source = square_records("cuda")
    loss, gradient = accy.compile(accy.value_and_grad(source), device="cuda")(X)
    want_loss, want_gradient = expected_cubic(X)
    np.testing.assert_allclose(np.asarray(loss.get()), want_loss, rtol=1e-5)
    np.testing.assert_allclose(gradient.get(), want_gradient, rtol=1e-5, atol=1e-6)


def test_the_registry_for_a_program_keeps_explicit_kernels_first_and_is_reused():
    square, backward, source = square_records("cpu")
    program = accy.grad(source)
    registry = accy.custom.kernel_registry_for(program, "cpu")
    assert registry is accy.custom.kernel_registry_for(program, "cpu_object")
    assert registry.require("test.kernel_square_backward", 1).symbol.endswith("backward4")
    explicit = (
        map_kernel("explicit_backward4", f32, [f32, f32], lambda i, x, ct: x.mul(i, ct), 4)
        .create_kernel_call_artifact(
            Limits.testing, None, target="test.kernel_square_backward", version=1
        )
        .registry()
    )
    merged = accy.custom.kernel_registry_for(program, "cpu", explicit)
    assert merged.require("test.kernel_square_backward", 1).symbol.endswith("explicit_backward4")
    # A program without record kernels gets the explicit registry itself.
    plain = accy.trace.define("plain", [LANE], lambda b, a: a[0] * 2.0)
    assert accy.custom.kernel_registry_for(plain, "cpu", explicit) is explicit


def test_a_record_without_a_kernel_for_the_backend_is_kernel_call_not_found():
    # Compiling links kernels before any device is opened, so this needs no GPU.
    _, _, source = square_records("cpu")
    options = accy.compat.lower.FragmentCompilerOptions("cuda_c")
    expected = "'test.kernel_square'.*no kernel for 'cuda_ptx'.*kernels for: cpu_object"
    with pytest.raises(KernelCallNotFound, match=expected):
        accy.compat.lower.compile_fragment(None, source, options)


def test_a_kernel_built_for_another_target_is_rejected():
    call = custom_double_kernel().create_kernel_call_artifact(
        Limits.testing, None, target="test.other", version=1
    )
    record = accy.CustomCall("test.mislabelled", result_type=same_type, kernels={"cpu": call})
    with pytest.raises(KernelError, match="built for 'test.other' version 1"):
        record.kernel("cpu", [LANE], LANE)


def test_a_kernel_function_of_the_types_is_called_with_them():
    seen = []

    def build(operand_types, result_type):
        seen.append((operand_types, result_type))
        return custom_double_kernel()

    record = accy.CustomCall("test.by_types", result_type=same_type, kernels={"cpu": build})
    assert record.kernel("cpu", [LANE], LANE).format == "cpu_object"
    assert seen == [((LANE,), LANE)]


# -- errors -------------------------------------------------------------------------------------


def test_wrong_operand_types_are_a_type_rule_error_naming_the_call():
    record = accy.CustomCall("test.typed", result_type=LANE, operand_types=[LANE])

    def body(b, a):
        return record(a[0])

    with pytest.raises(accy.TypeRuleError, match=r"'test.typed' \(version 1\) takes 1 operands"):
        accy.trace.define("wrong", [spec(f64, lane=4)], body)
    pair = accy.CustomCall("test.pair", result_type=lambda a, b: a)
    with pytest.raises(accy.TypeRuleError, match="'test.pair'.*does not take the operands"):
        accy.trace.define("one", [LANE], lambda b, a: pair(a[0]))
    bad = accy.CustomCall("test.bad_rule", result_type=lambda x: "f32")
    with pytest.raises(accy.TypeRuleError, match="must return a TensorType"):
        accy.trace.define("bad", [LANE], lambda b, a: bad(a[0]))


def test_calling_a_record_off_a_trace_or_without_a_type_rule_is_an_error():
    record = accy.CustomCall("test.untyped")
    with pytest.raises(accy.CustomCallError, match="call it on traced values"):
        record(1.0)
    with pytest.raises(accy.CustomCallError, match="has no result type"):
        accy.trace.define("untyped", [LANE], lambda b, a: record(a[0]))
    with pytest.raises(accy.CustomCallError, match="operand 1 is 2.0, not a traced value"):
        accy.trace.define("scalar", [LANE], lambda b, a: record.call(b, a[0], 2.0))


def test_no_rule_and_no_fallback_raise_the_contract_errors_naming_the_target():
    opaque = accy.CustomCall("test.opaque", result_type=same_type, reference=np.sin)
    with pytest.raises(accy.CustomCallRequiresJvpContract, match="'test.opaque'.*no fallback"):
        accy.grad(sum_of(opaque))
    with pytest.raises(accy.CustomCallRequiresJvpContract, match="'test.opaque'"):
        accy.jvp(sum_of(opaque))
    # A JVP rule that applies the call to the tangent needs a VJP rule to transpose it.
    linear = accy.CustomCall(
        "test.linear_no_vjp",
        result_type=same_type,
        jvp=lambda e, primals, tangents, result: linear.call(e, tangents[0]),
    )
    with pytest.raises(accy.CustomCallRequiresVjpContract, match="'test.linear_no_vjp'"):
        accy.grad(sum_of(linear))


def test_rules_returning_the_wrong_types_are_errors_naming_the_call():
    wrong_jvp = accy.CustomCall(
        "test.wrong_jvp", result_type=same_type, jvp=lambda e, p, t, r: e.sum(t[0], "lane")
    )
    with pytest.raises(accy.CustomCallError, match="'test.wrong_jvp'.*JVP rule returned f32"):
        accy.jvp(sum_of(wrong_jvp))
    wrong_count = accy.CustomCall(
        "test.wrong_vjp", result_type=same_type, vjp=lambda e, p, r, c: []
    )
    with pytest.raises(accy.CustomCallError, match="list of 1 cotangents"):
        accy.grad(sum_of(wrong_count))
    wrong_type = accy.CustomCall(
        "test.wrong_vjp_type", result_type=same_type, vjp=lambda e, p, r, c: [e.sum(c, "lane")]
    )
    with pytest.raises(
        accy.CustomCallError,
        match=r"for operand 0 f32\[\], but it must have the type f32\[lane=4\]",
    ):
        accy.grad(sum_of(wrong_type))
    wrong_fallback = accy.CustomCall(
        "test.wrong_fallback", result_type=same_type, fallback=lambda x: x.sum("lane")
    )
    with pytest.raises(accy.CustomCallError, match=r"its fallback returns \(f32\[\]\)"):
        accy.grad(sum_of(wrong_fallback))


def test_registering_a_different_definition_twice_is_a_conflict():
    first = accy.CustomCall("test.twice", result_type=same_type, reference=np.sin)
    again = accy.CustomCall("test.twice", result_type=same_type, reference=np.sin)
    assert accy.custom.lookup("test.twice", 1) is first and again.definition() == first.definition()
    with pytest.raises(accy.CustomCallConflict, match=r"'test.twice' \(version 1\).*reference"):
        accy.CustomCall("test.twice", result_type=same_type, reference=np.cos)
    replaced = accy.CustomCall("test.twice", result_type=same_type, reference=np.cos, replace=True)
    assert accy.custom.lookup("test.twice", 1) is replaced
    other_version = accy.CustomCall("test.twice", 2, result_type=same_type, reference=np.cos)
    assert accy.custom.lookup("test.twice", 2) is other_version


def test_bad_declarations_are_custom_call_errors():
    with pytest.raises(accy.CustomCallError, match="target must be a non-empty string"):
        accy.CustomCall("")
    with pytest.raises(accy.CustomCallError, match="version must be an int"):
        accy.CustomCall("test.v", version=True)
    with pytest.raises(accy.CustomCallError, match="jvp must be a function"):
        accy.CustomCall("test.j", jvp="rule")
    with pytest.raises(accy.CustomCallError, match="unknown kernel format 'tpu'"):
        accy.CustomCall("test.k", kernels={"tpu": custom_double_kernel()})
    with pytest.raises(accy.CustomCallError, match=r"operand_types\[0\] must be a TensorType"):
        accy.CustomCall("test.o", operand_types=["f32"])
    record = accy.CustomCall("test.k2", kernels={"cpu": "not a kernel"})
    with pytest.raises(accy.CustomCallError, match="must be an accy.kernel Program"):
        record.kernel("cpu", [LANE], LANE)


def test_registered_restores_the_table():
    record = accy.CustomCall("test.scoped", result_type=same_type, register=False)
    assert accy.custom.lookup("test.scoped", 1) is None
    with accy.custom.registered(record):
        assert accy.custom.lookup("test.scoped", 1) is record
        assert record in accy.custom.records()
    assert accy.custom.lookup("test.scoped", 1) is None


def test_mapped_axes_are_axis_names_or_a_rule_and_only_the_results():
    with pytest.raises(accy.CustomCallError, match="mapped_axes must be axis names"):
        accy.CustomCall("test.mapped_str", result_type=same_type, mapped_axes="lane")
    with pytest.raises(accy.CustomCallError, match="mapped_axes must be axis names"):
        accy.CustomCall("test.mapped_ints", result_type=same_type, mapped_axes=[0])
    named = accy.CustomCall(
        "test.mapped", result_type=same_type, mapped_axes=["lane", "row"], register=False
    )
    assert named.mapped_axes_for([LANE]) == {"lane"}  # "row" is not an axis of the result
    ruled = accy.CustomCall(
        "test.mapped_rule", result_type=same_type, mapped_axes=lambda x: x.axes, register=False
    )
    assert ruled.mapped_axes_for([LANE]) == {"lane"}
    assert (
        accy.CustomCall("test.unmapped", result_type=same_type, register=False).mapped_axes_for(
            [LANE]
        )
        == frozenset()
    )
