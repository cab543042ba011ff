"""`accy.debug_print` under grad, jvp, vjp, linearize and vmap prints what `jax.debug.print`
prints for the same program: the primal values once under differentiation, and once per
example under vmap (in JAX's order when vmaps nest)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

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


def test_debug_print_inside_a_loop_body_is_refused():
    def f(x):
        def body(carry, _):
            accy.debug_print("{}", carry)
            return carry * 2.0, None

        return accy.scan(body, x, None, axis="step", length=2)[0]

    with pytest.raises(accy.AccyError, match="not from inside a loop body"):
        accy.grad(f)(scalar(1.0))
