"""`accy.debug_print` under grad, jvp, vjp, linearize and vmap, and inside scan bodies, prints
what `jax.debug.print` prints for the same program: the primal values once under
differentiation, once per example under vmap (in JAX's order when vmaps nest), and at every
step of a scan."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import accy

R = "reference"
TEXT = "x={x:.3f} twice={y:.2f}"


def accy_f(x):
    accy.debug_print(TEXT, x=x, y=x * 2.0)
    return (x * x).sum()


def jax_f(x):
    jax.debug.print(TEXT, x=x, y=x * 2.0)
    return (x * x).sum()


def printed(capsys, run):
    capsys.readouterr()
    run()
    jax.effects_barrier()
    return capsys.readouterr().out


def scalar(v):
    return accy.named(np.float32(v), (), device=R)


def test_grad_jvp_and_their_nestings_print_the_primal_values_once(capsys):
    x, t = scalar(3.0), scalar(1.0)
    cases = [
        (lambda: accy.grad(accy_f)(x), lambda: jax.grad(jax_f)(3.0)),
        (lambda: accy.jit(accy.grad(accy_f))(x), lambda: jax.jit(jax.grad(jax_f))(3.0)),
        (lambda: accy.value_and_grad(accy_f)(x), lambda: jax.value_and_grad(jax_f)(3.0)),
        (lambda: accy.grad(accy.grad(accy_f))(x), lambda: jax.grad(jax.grad(jax_f))(3.0)),
        (lambda: accy.jvp(accy_f, (x,), (t,)), lambda: jax.jvp(jax_f, (3.0,), (1.0,))),
    ]
    for ours, theirs in cases:
        expected = printed(capsys, theirs)
        assert expected == "x=3.000 twice=6.00\n"
        assert printed(capsys, ours) == expected


def test_vjp_and_linearize_print_in_their_forward_pass_only(capsys):
    x = scalar(3.0)
    _, back = accy.vjp(accy_f, x)
    _, jax_back = jax.vjp(jax_f, 3.0)
    assert printed(capsys, lambda: back(scalar(1.0))) == printed(capsys, lambda: jax_back(1.0))
    assert printed(capsys, lambda: accy.linearize(accy_f, x)) == printed(
        capsys, lambda: jax.linearize(jax_f, 3.0)
    )
    _, f_jvp = accy.linearize(accy_f, x)
    assert printed(capsys, lambda: f_jvp(scalar(1.0))) == ""


def test_vmap_prints_once_per_example_in_jax_order(capsys):
    xs = np.arange(4.0, dtype=np.float32).reshape(2, 2)
    grid = accy.named(xs, ("i", "j"), device=R)
    row = accy.named(xs[0] + 1.0, "j", device=R)
    cases = [
        (lambda: accy.vmap(accy_f, "j")(row), lambda: jax.vmap(jax_f)(xs[0] + 1.0)),
        (
            lambda: accy.vmap(accy.vmap(accy_f, "j"), "i")(grid),
            lambda: jax.vmap(jax.vmap(jax_f))(jnp.asarray(xs)),
        ),
        (
            lambda: accy.jit(accy.vmap(accy.grad(accy_f), "j"))(row),
            lambda: jax.jit(jax.vmap(jax.grad(jax_f)))(xs[0] + 1.0),
        ),
    ]
    for ours, theirs in cases:
        expected = printed(capsys, theirs)
        assert printed(capsys, ours) == expected
    assert printed(capsys, cases[1][1]).splitlines()[1] == "x=2.000 twice=4.00"


def test_vmap_prints_an_unmapped_value_with_each_example(capsys):
    def ours(x, y):
        accy.debug_print("{:.1f} {:.1f}", x, y)
        return x + y

    def theirs(x, y):
        jax.debug.print("{:.1f} {:.1f}", x, y)
        return x + y

    expected = printed(capsys, lambda: jax.vmap(theirs, in_axes=(0, None))(jnp.arange(2.0), 5.0))
    xs = accy.named(np.arange(2.0, dtype=np.float32), "b", device=R)
    assert printed(capsys, lambda: accy.vmap(ours, "b")(xs, scalar(5.0))) == expected
    assert expected == "0.0 5.0\n1.0 5.0\n"


def test_a_format_spec_on_an_array_with_axes_is_an_axis_error():
    def f(x):
        accy.debug_print("{:.2f}", x)
        return x.sum()

    with pytest.raises(accy.AxisError, match=r"formats a scalar, but the array has axes"):
        accy.grad(f)(accy.named(np.ones(2, np.float32), "n", device=R))


def test_a_scan_body_prints_at_every_step_as_jax_does(capsys):
    def step(c, _):
        accy.debug_print("c = {c:.1f}", c=c)
        return c + 1.0, None

    def jax_step(c, _):
        jax.debug.print("c = {c:.1f}", c=c)
        return c + 1.0, None

    x = scalar(1.0)
    cases = [
        (
            lambda: accy.value_and_grad(lambda x: accy.scan(step, x, None, length=2, axis="t")[0])(
                x
            ),
            lambda: jax.value_and_grad(lambda x: lax.scan(jax_step, x, None, length=2)[0])(1.0),
        ),
        (
            lambda: accy.jit(lambda x: accy.scan(step, x, None, length=3, axis="t", reverse=True))(
                x
            ),
            lambda: jax.jit(lambda x: lax.scan(jax_step, x, None, length=3, reverse=True))(1.0),
        ),
        (
            lambda: accy.jit(lambda x: accy.scan(step, x, None, length=4, axis="t", unroll=2))(x),
            lambda: jax.jit(lambda x: lax.scan(jax_step, x, None, length=4, unroll=2))(1.0),
        ),
        (
            lambda: accy.jit(lambda x: accy.fori_loop(0, 2, lambda i, c: step(c, i)[0], x))(x),
            lambda: jax.jit(lambda x: lax.fori_loop(0, 2, lambda i, c: jax_step(c, i)[0], x))(1.0),
        ),
    ]
    for ours, theirs in cases:
        expected = printed(capsys, theirs)
        assert printed(capsys, ours) == expected
    assert expected == "c = 1.0\nc = 2.0\n"


def test_debug_print_inside_a_while_loop_body_is_refused():
    def f(x):
        def body(carry):
            accy.debug_print("{}", carry)
            return carry * 2.0

        return accy.while_loop(lambda c: c < 4.0, body, x)

    with pytest.raises(accy.AccyError, match="not from inside a while_loop body"):
        accy.jvp(f, (scalar(1.0),), (scalar(1.0),))


@pytest.mark.slow
def test_a_print_of_values_no_example_changes_prints_once_under_vmap_and_jacobians(capsys):
    def ours(x, y):
        accy.debug_print("y={:.1f}", y)
        return x * y

    def theirs(x, y):
        jax.debug.print("y={:.1f}", y)
        return x * y

    xs = accy.named(np.arange(3.0, dtype=np.float32), "b", device=R)
    expected = printed(capsys, lambda: jax.vmap(theirs, in_axes=(0, None))(jnp.arange(3.0), 5.0))
    assert printed(capsys, lambda: accy.vmap(ours, "b")(xs, scalar(5.0))) == expected == "y=5.0\n"

    def accy_h(x):
        accy.debug_print("sum={:.2f}", x.sum())
        return x.sin()

    def jax_h(x):
        jax.debug.print("sum={:.2f}", x.sum())
        return jnp.sin(x)

    x = accy.named(np.array([0.5, 1.0], np.float32), "n", device=R)
    renamed = lambda x: accy_h(x).rename("n", "m")  # noqa: E731
    cases = [
        (lambda: accy.jacfwd(renamed)(x), lambda: jax.jacfwd(jax_h)(jnp.array([0.5, 1.0]))),
        (lambda: accy.jacrev(renamed)(x), lambda: jax.jacrev(jax_h)(jnp.array([0.5, 1.0]))),
        (
            lambda: accy.hessian(lambda x: accy_h(x).sum())(x),
            lambda: jax.hessian(lambda x: jax_h(x).sum())(jnp.array([0.5, 1.0])),
        ),
    ]
    for ours_run, theirs_run in cases:
        expected = printed(capsys, theirs_run)
        assert printed(capsys, ours_run) == expected == "sum=1.50\n"
