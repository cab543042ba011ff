"""JAX's tests/custom_api_test.py (CustomJVPTest, CustomVJPTest), case by case, on
`accy.custom_jvp` / `accy.custom_vjp`: the peer's inputs, and JAX's own results computed in the
same run. Cases that need vmap of a custom call (a batching rule accy's custom calls lack) or
Python control flow on traced values are not translated."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import accy


def scalar(value):
    return accy.named(np.float32(value), (), device="reference")


def close(got, expected):
    got_leaves = jax.tree_util.tree_leaves(
        jax.tree_util.tree_map(
            lambda x: np.asarray(x.array) if isinstance(x, accy.NamedArray) else x,
            got,
            is_leaf=lambda x: isinstance(x, accy.NamedArray),
        )
    )
    expected_leaves = jax.tree_util.tree_leaves(expected)
    assert len(got_leaves) == len(expected_leaves)
    for g, e in zip(got_leaves, expected_leaves, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-5, atol=1e-6)


def sin_jvp_pair(custom_jvp, sin, cos):
    @custom_jvp
    def f(x):
        return sin(x)

    def f_jvp(primals, tangents):
        (x,), (g,) = primals, tangents
        return f(x), 2.0 * cos(x) * g

    f.defjvp(f_jvp)
    return f


ACCY_SIN = sin_jvp_pair(accy.custom_jvp, lambda x: x.sin(), lambda x: x.cos())
JAX_SIN = sin_jvp_pair(jax.custom_jvp, jnp.sin, jnp.cos)


def test_custom_jvp_basic():
    x = 3.0
    close(ACCY_SIN(scalar(x)), JAX_SIN(x))
    close(accy.jvp(ACCY_SIN, (x,), (1.0,)), jax.jvp(JAX_SIN, (x,), (1.0,)))
    close(accy.grad(ACCY_SIN)(x), jax.grad(JAX_SIN)(x))


def test_custom_jvp_invariance():
    def make(custom_jvp, jvp, cos):
        @custom_jvp
        def f(x):
            return cos(2.0 * x) / 2.0

        f.defjvp(lambda p, t: (f(p[0]), 3.0 * t[0]))
        f2 = lambda x: jvp(f, (x,), (x,))[0]  # noqa: E731
        f3 = lambda x: jvp(f2, (x,), (x,))[0]  # noqa: E731
        return f, f2, f3

    ours = make(accy.custom_jvp, accy.jvp, lambda x: x.cos())
    theirs = make(jax.custom_jvp, jax.jvp, jnp.cos)
    for a, j in zip(ours, theirs, strict=True):
        close(accy.jvp(a, (1.0,), (1.0,)), jax.jvp(j, (1.0,), (1.0,)))


def test_custom_jvp_jit():
    x = 3.0
    on_cpu = accy.named(np.float32(x), ())
    close(accy.jit(ACCY_SIN)(on_cpu), jax.jit(JAX_SIN)(x))
    close(accy.jit(accy.jit(ACCY_SIN))(on_cpu), jax.jit(jax.jit(JAX_SIN))(x))
    close(
        accy.jit(lambda x: accy.jvp(ACCY_SIN, (x,), (x,)))(on_cpu),
        jax.jit(lambda x: jax.jvp(JAX_SIN, (x,), (x,)))(x),
    )
    close(accy.jvp(accy.jit(ACCY_SIN), (x,), (x,)), jax.jvp(jax.jit(JAX_SIN), (x,), (x,)))


def test_custom_jvp_pytrees():
    def make(custom_jvp, sin, cos):
        @custom_jvp
        def f(x):
            return {"b": sin(x["a"])}

        f.defjvp(lambda p, t: (f(p[0]), {"b": 2.0 * cos(p[0]["a"]) * t[0]["a"]}))
        return f

    ours = make(accy.custom_jvp, lambda x: x.sin(), lambda x: x.cos())
    theirs = make(jax.custom_jvp, jnp.sin, jnp.cos)
    x = {"a": 3.0}
    close(ours({"a": scalar(3.0)})["b"], theirs(x)["b"])
    close(accy.jvp(ours, (x,), (x,)), jax.jvp(theirs, (x,), (x,)))


def test_custom_jvp_kwargs():
    def make(custom_jvp):
        @custom_jvp
        def my_fun(x, y, c=1.0):
            return c * (x + y)

        def my_jvp(primals, tangents):
            x, y, c = primals
            _, _, t_c = tangents
            return my_fun(x, y, c), t_c

        my_fun.defjvp(my_jvp)
        return my_fun

    ours, theirs = make(accy.custom_jvp), make(jax.custom_jvp)
    f_ours = lambda x, y: ours(x, y, c=2.0) ** 2.0  # noqa: E731
    f_theirs = lambda x, y: jnp.square(theirs(x, y, c=2.0)).sum()  # noqa: E731
    close(accy.jit(f_ours)(scalar(10.0), scalar(5.0)), f_theirs(10.0, 5.0))
    close(accy.jvp(f_ours, (10.0, 5.0), (1.0, 1.0)), jax.jvp(f_theirs, (10.0, 5.0), (1.0, 1.0)))


def test_custom_jvp_nondiff_argnums():
    def make(custom_jvp):
        @functools.partial(custom_jvp, nondiff_argnums=(0,))
        def app(f, x):
            return f(x)

        def app_jvp(f, primals, tangents):
            (x,), (t,) = primals, tangents
            return app(f, x), 3.0 * t

        app.defjvp(app_jvp)
        return app

    ours, theirs = make(accy.custom_jvp), make(jax.custom_jvp)
    assert ours(lambda x: 2 * x, 1) == theirs(lambda x: 2 * x, 1) == 2
    close(
        accy.jvp(lambda x: ours(lambda y: 2.0 * y, x), (1.0,), (1.0,)),
        jax.jvp(lambda x: theirs(lambda y: 2 * y, x), (1.0,), (1.0,)),
    )


def test_custom_jvp_missing_rule_error():
    @accy.custom_jvp
    def foo(x):
        return x**2.0

    for call in (lambda: foo(2.0), lambda: accy.jvp(foo, (2.0,), (1.0,))):
        with pytest.raises(accy.TransformError, match="foo.*has no JVP rule.*defjvp"):
            call()
    with pytest.raises(accy.TransformError, match="no JVP rule"):
        accy.grad(foo)(2.0)


def test_custom_jvp_rule_inconsistent_structure_error():
    @accy.custom_jvp
    def f(x):
        return (x**2.0,)

    @f.defjvp
    def foo_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return f(x), [2.0 * x * t, x]

    f(scalar(2.0))  # doesn't crash
    with pytest.raises(accy.TransformError, match="tangent_out of structure"):
        accy.jvp(f, (2.0,), (1.0,))


def test_custom_jvp_primal_tangent_type_disagreement_error():
    @accy.custom_jvp
    def f(x):
        return x**2.0

    @f.defjvp
    def foo_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return f(x), t.broadcast_to(accy.spec(accy.f32, one=1))

    f(scalar(2.0))  # doesn't crash
    with pytest.raises(accy.TransformError, match="same type"):
        accy.jvp(f, (2.0,), (1.0,))


def test_custom_jvp_rule_doesnt_return_pair_error():
    @accy.custom_jvp
    def f(x):
        return x**2.0

    @f.defjvp
    def foo_jvp(primals, tangents):
        return tangents[0]

    f(scalar(2.0))  # doesn't crash
    with pytest.raises(accy.TransformError, match="must return a pair"):
        accy.jvp(f, (2.0,), (1.0,))


def sin_vjp(custom_vjp, sin, cos):
    @custom_vjp
    def f(x):
        return sin(x)

    f.defvjp(lambda x: (f(x), cos(x)), lambda cos_x, g: (2.0 * cos_x * g,))
    return f


ACCY_SIN_VJP = sin_vjp(accy.custom_vjp, lambda x: x.sin(), lambda x: x.cos())
JAX_SIN_VJP = sin_vjp(jax.custom_vjp, jnp.sin, jnp.cos)


def test_custom_vjp_basic():
    x = 3.0
    close(ACCY_SIN_VJP(scalar(x)), JAX_SIN_VJP(x))
    close(accy.grad(ACCY_SIN_VJP)(x), jax.grad(JAX_SIN_VJP)(x))
    close(accy.value_and_grad(ACCY_SIN_VJP)(x), jax.value_and_grad(JAX_SIN_VJP)(x))


def test_custom_vjp_invariance():
    def make(custom_vjp, value_and_grad, cos):
        @custom_vjp
        def f(x):
            return cos(2.0 * x) / 2.0

        f.defvjp(lambda x: (f(x), x), lambda x, g: (g * 3.0,))
        f2 = lambda x: value_and_grad(f)(x)[0]  # noqa: E731
        f3 = lambda x: value_and_grad(f2)(x)[0]  # noqa: E731
        return f, f2, f3

    ours = make(accy.custom_vjp, accy.value_and_grad, lambda x: x.cos())
    theirs = make(jax.custom_vjp, jax.value_and_grad, jnp.cos)
    for a, j in zip(ours, theirs, strict=True):
        close(accy.grad(a)(1.0), jax.grad(j)(1.0))
        close(accy.jit(a)(scalar(1.0)), j(1.0))


def test_custom_vjp_jit():
    x = 3.0
    on_cpu = accy.named(np.float32(x), ())
    close(accy.jit(ACCY_SIN_VJP)(on_cpu), jax.jit(JAX_SIN_VJP)(x))
    close(accy.jit(accy.jit(ACCY_SIN_VJP))(on_cpu), jax.jit(jax.jit(JAX_SIN_VJP))(x))
    close(accy.jit(accy.grad(ACCY_SIN_VJP))(on_cpu), jax.jit(jax.grad(JAX_SIN_VJP))(x))
    close(accy.grad(accy.jit(ACCY_SIN_VJP))(x), jax.grad(jax.jit(JAX_SIN_VJP))(x))


def test_custom_vjp_pytrees():
    def make(custom_vjp, sin, cos):
        @custom_vjp
        def f(x):
            return {"b": sin(x["a"])}

        def f_bwd(res, g):
            return ({"a": 2.0 * res["r"] * g["b"]},)

        f.defvjp(lambda x: (f(x), {"r": cos(x["a"])}), f_bwd)
        return f

    ours = make(accy.custom_vjp, lambda x: x.sin(), lambda x: x.cos())
    theirs = make(jax.custom_vjp, jnp.sin, jnp.cos)
    x = {"a": 3.0}
    close(ours({"a": scalar(3.0)})["b"], theirs(x)["b"])
    close(accy.grad(lambda x: ours(x)["b"])(x), jax.grad(lambda x: theirs(x)["b"])(x))


def test_custom_vjp_forward_mode_differentiates_the_function():
    # JAX refuses jvp of a custom_vjp function (test_jvp_error); accy differentiates the
    # function itself in forward mode: the derivative of sin, not the rule's 2 cos.
    close(accy.jvp(ACCY_SIN_VJP, (3.0,), (1.0,)), jax.jvp(jnp.sin, (3.0,), (1.0,)))


def test_custom_vjp_kwargs():
    def make(custom_vjp):
        @custom_vjp
        def my_fun(x, y, c=1.0):
            return c * (x + y)

        my_fun.defvjp(lambda x, y, c=1.0: (my_fun(c, y, c), None), lambda _, g: (g, g, g))
        return my_fun

    ours, theirs = make(accy.custom_vjp), make(jax.custom_vjp)
    f_ours = lambda x, y: ours(x, y, c=2.0) ** 2.0  # noqa: E731
    f_theirs = lambda x, y: jnp.square(theirs(x, y, c=2.0)).sum()  # noqa: E731
    close(accy.jit(f_ours)(scalar(10.0), scalar(5.0)), f_theirs(10.0, 5.0))
    # fwd disagrees with the function (c, y, c instead of x, y, c): under grad the primal is
    # fwd's (14), as JAX runs fwd under differentiation; bwd passes g through.
    close(accy.grad(f_ours)(10.0, 5.0), jax.grad(f_theirs)(10.0, 5.0))
    close(accy.value_and_grad(f_ours)(10.0, 5.0), jax.value_and_grad(f_theirs)(10.0, 5.0))


def test_custom_vjp_nondiff_argnums():
    def make(custom_vjp, cos):
        @functools.partial(custom_vjp, nondiff_argnums=(0,))
        def app(f, x):
            return f(x)

        app.defvjp(lambda f, x: (app(f, x), cos(x)), lambda f, cos_x, g: (cos_x * g,))
        return app

    ours = make(accy.custom_vjp, lambda x: x.cos())
    theirs = make(jax.custom_vjp, jnp.cos)
    assert ours(lambda x: 2 * x, 1) == theirs(lambda x: 2 * x, 1) == 2
    close(
        accy.value_and_grad(lambda x: ours(lambda y: 2.0 * y, x))(1.0),
        jax.value_and_grad(lambda x: theirs(lambda y: 2 * y, x))(1.0),
    )


def test_custom_vjp_missing_rule_error():
    @accy.custom_vjp
    def foo(x):
        return x**2.0

    with pytest.raises(accy.TransformError, match="foo.*has no rules.*defvjp"):
        foo(2.0)
    with pytest.raises(accy.TransformError, match="defvjp"):
        accy.grad(foo)(2.0)


def test_custom_vjp_rule_inconsistent_structure_error():
    @accy.custom_vjp
    def f(x):
        return x

    f.defvjp(lambda x: (x, None), lambda _, g: (g, g))
    f(scalar(2.0))  # doesn't crash
    with pytest.raises(accy.TransformError, match="one cotangent per differentiable argument"):
        accy.grad(f)(2.0)


def test_custom_vjp_bwd_returns_non_tuple_error():
    @accy.custom_vjp
    def f(x):
        return x

    f.defvjp(lambda x: (x, None), lambda _, g: 2.0 * g)
    with pytest.raises(accy.TransformError, match="must return a tuple"):
        accy.grad(f)(3.0)


def test_custom_vjp_fwd_output_structure_error():
    @accy.custom_vjp
    def f(x):
        return x

    f.defvjp(lambda x: ((x, x), None), lambda _, y_bar: (y_bar,))
    with pytest.raises(accy.TransformError, match="fwd of 'f' returned an output of structure"):
        accy.grad(f)(1.0)


def test_custom_vjp_clip_gradient():
    def make(custom_vjp, clip):
        @custom_vjp
        def _clip_gradient(lo, hi, x):
            return x

        _clip_gradient.defvjp(
            lambda lo, hi, x: (x, (lo, hi)),
            lambda res, g: (None, None, clip(g, res[0], res[1])),
        )
        return lambda x: _clip_gradient(-0.1, x + 0.1, x)

    ours, theirs = make(accy.custom_vjp, accy.clip), make(jax.custom_vjp, jnp.clip)
    close(accy.grad(ours)(0.1), jax.grad(theirs)(0.1))
