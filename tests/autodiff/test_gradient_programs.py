"""Properties of gradient programs: lean (nothing useless left), documented conventions for
ties and select, and clear errors for what cannot be differentiated."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import f32, i32, spec
from accy.trace import define
from accy.transforms.simplify import eliminate_dead_code

from .test_check_grads import attention_program, mlp_program

# Counts recorded in the Autodiff issue's closing note; a change that makes gradients larger
# should be a conscious one. mlp's source grew from 23 to 25 when nn.cross_entropy became
# optax's -sum(labels * log_softmax(logits)), differentiable in its labels.
LEAN_COUNTS = {"attention": (22, 34), "mlp": (25, 28)}


def useless_operations(program):
    """Operations that simplification or dead-code removal would still take out."""
    problems = []
    if len(eliminate_dead_code(program).operations) != len(program.operations):
        problems.append("dead code")
    if len(accy.simplify(program).operations) != len(program.operations):
        problems.append("foldable or duplicate operations")
    for op in program.operations:
        if op.kind == "transpose" and tuple(op.attrs["order"]) == op.operand_types[0].axes:
            problems.append("identity transpose")
        if op.kind in ("broadcast_in_dim", "reshape") and op.type == op.operand_types[0]:
            problems.append(f"identity {op.kind}")
    return problems


@pytest.mark.parametrize("name, make", [("attention", attention_program), ("mlp", mlp_program)])
def test_gradient_programs_stay_lean(name, make):
    source = make()
    wrt = (0, 1, 2) if name == "attention" else (1, 2)
    gradient = accy.grad(source, wrt=wrt)
    assert useless_operations(gradient) == []
    assert (len(source.operations), len(gradient.operations)) == LEAN_COUNTS[name]


def test_grad_of_a_plain_sum_is_a_constant_of_ones():
    source = define("sum", [spec(f32, n=3)], lambda b, x: x[0].sum("n"))
    gradient = accy.grad(source)
    assert [op.kind for op in gradient.operations] == ["parameter", "constant"]


def test_ties_in_binary_max_split_the_derivative_evenly():
    source = define("tie", [spec(f32), spec(f32)], lambda b, x: x[0].max(x[1]))
    gradient = accy.grad(source, wrt=(0, 1))
    dx, dy = accy.reference.run(gradient, [np.float32(2.0), np.float32(2.0)])
    assert (float(dx), float(dy)) == (0.5, 0.5)


def test_select_sends_the_cotangent_to_the_taken_branch_and_zero_to_the_other():
    def body(b, x):
        # The untaken branch would have an infinite derivative (sqrt at 0): it must get an
        # exact zero cotangent, so the gradient stays finite.
        return b.select(x[0] > 0.0, x[0] * 3.0, x[0].sqrt()).sum("n")

    source = define("select", [spec(f32, n=3)], body)
    (gradient,) = accy.reference.run(accy.grad(source), [np.array([1.0, 2.0, 5.0], np.float32)])
    np.testing.assert_array_equal(gradient, [3.0, 3.0, 3.0])


def test_wrt_must_name_float_parameters():
    source = define(
        "lookup",
        [spec(f32, vocab=3), spec(i32, token=2)],
        lambda b, x: x[0].gather(x[1], "vocab").sum("token"),
    )
    with pytest.raises(accy.NotDifferentiable, match="only floating-point parameters"):
        accy.grad(source, wrt=(1,))
    with pytest.raises(accy.NotDifferentiable, match="not a parameter index"):
        accy.grad(source, wrt=(2,))
    with pytest.raises(accy.NotDifferentiable, match="twice"):
        accy.grad(source, wrt=(0, 0))


def test_vjp_of_a_vector_output_with_an_explicit_cotangent():
    source = define("square", [spec(f32, n=3)], lambda b, x: x[0] * x[0])
    outputs = accy.reference.run(
        accy.vjp(source), [np.array([1.0, 2.0, 3.0], np.float32), np.ones(3, np.float32)]
    )
    np.testing.assert_array_equal(outputs[0], [1.0, 4.0, 9.0])
    np.testing.assert_array_equal(outputs[1], [2.0, 4.0, 6.0])


def test_linear_transpose_of_a_contraction():
    matrix = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)

    def body(b, x):
        return x[0].contract(b.constant(matrix, spec(f32, n=3, m=2)), "n")

    source = define("linear", [spec(f32, n=3)], body)
    (transposed,) = accy.reference.run(
        accy.linear_transpose(source), [np.array([1.0, -1.0], np.float32)]
    )
    np.testing.assert_allclose(transposed, matrix @ np.array([1.0, -1.0]))


def test_gradients_can_be_differentiated_again():
    source = define("cube", [spec(f32, n=2)], lambda b, x: (x[0] * x[0] * x[0]).sum("n"))
    second = accy.grad(
        define("g", [spec(f32, n=2)], lambda b, x: b.call(accy.grad(source), x).sum("n"))
    )
    (values,) = accy.reference.run(second, [np.array([1.0, -2.0], np.float32)])
    np.testing.assert_allclose(values, [6.0, -12.0])


@pytest.mark.parametrize("monoid", ["sum", "max", "min", "prod"])
def test_a_reduction_over_axes_of_extent_one_is_a_reshape(monoid):
    """GPT-2's `qkv.slice("part", j, j + 1).sum("part")` picks one part: a view of the
    projection, not a kernel that copies it."""
    from accy.transforms.simplify import simplify

    def pick(b, a):
        one = a[0].slice("part", 1, 2, 1)
        return {"sum": one.sum, "max": one.max, "min": one.min, "prod": one.prod}[monoid]("part")

    program = accy.trace.define("pick", [accy.spec(accy.f32, part=3, n=4)], pick)
    simplified = simplify(program)
    assert simplified.count("reduce") == 0 and simplified.count("reshape") == 1
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    (want,) = accy.reference.run(program, [x])
    (got,) = accy.reference.run(simplified, [x])
    np.testing.assert_array_equal(got, x[1])
    np.testing.assert_array_equal(want, x[1])


def test_a_reduction_from_another_init_is_kept():
    from accy.transforms.simplify import simplify

    program = accy.trace.define(
        "offset",
        [accy.spec(accy.f32, part=1, n=4)],
        lambda b, a: b.reduce(a[0], 1.0, "sum", ["part"]),
    )
    assert simplify(program).count("reduce") == 1
