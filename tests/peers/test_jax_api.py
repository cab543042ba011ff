"""JAX's tests/api_test.py, case by case, on accy's front end (jit, grad, value_and_grad,
jacfwd/jacrev/hessian, jvp/vjp/linearize, linear_transpose, checkpoint, stop_gradient,
has_aux, static arguments): the peer's inputs, and JAX's own results computed in the same run.
accy names its static arguments (`static_argnames`); JAX's `static_argnums` cases are
translated to the parameters' names."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import accy

RNG = np.random.default_rng(0)


def scalar(value):
    return accy.named(np.float32(value), (), device="reference")


def vec(values, axis="i"):
    return accy.named(np.asarray(values, np.float32), (axis,), device="reference")


def close(got, expected, rtol=1e-5):
    unwrap = jax.tree_util.tree_map(
        lambda x: np.asarray(x.array) if isinstance(x, accy.NamedArray) else x,
        got,
        is_leaf=lambda x: isinstance(x, accy.NamedArray),
    )
    got_leaves, expected_leaves = (jax.tree_util.tree_leaves(t) for t in (unwrap, expected))
    assert len(got_leaves) == len(expected_leaves), (unwrap, expected)
    for g, e in zip(got_leaves, expected_leaves, strict=True):
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(e), rtol=rtol, atol=1e-6)


def test_jit_static_args():
    sides = {"accy": [], "jax": []}

    def make(who):
        def f(x, y, z, flag=False, flag2=False):
            del flag2
            assert flag
            sides[who].append(None)
            return 100 * x + 10 * y + z

        return f

    f1 = accy.jit(make("accy"), static_argnames=("flag", "flag2"))
    j1 = jax.jit(make("jax"), static_argnums=(3, 4))
    for args in [(1, 2, 3, True, False), (1, 2, 3, True, False), (2, 1, 3, True, False)]:
        assert f1(*args).item() == j1(*args)
        assert len(sides["accy"]) == len(sides["jax"]) == 1
    assert f1(2, 1, 3, True, True).item() == j1(2, 1, 3, True, True) == 213
    assert len(sides["accy"]) == len(sides["jax"]) == 2
    for who in sides:
        sides[who].clear()
    f2 = accy.jit(make("accy"), static_argnames=("x", "z", "flag", "flag2"))
    j2 = jax.jit(make("jax"), static_argnums=(0, 2, 3, 4))
    for args in [
        (1, 2, 3, True, False),
        (1, 3, 3, True, False),
        (2, 2, 3, True, False),
        (2, 4, 3, True, False),
        (2, 4, 3, True, True),
        (2, 5, 3, True, True),
    ]:
        assert f2(*args).item() == j2(*args)
        assert len(sides["accy"]) == len(sides["jax"])


def test_static_args_equality():
    class A:
        def __hash__(self):
            return 1

        def __eq__(self, other):
            return isinstance(other, A)

    side = []

    def f(x, static_arg):
        side.append(None)
        return x * 100

    f1 = accy.jit(f, static_argnames="static_arg")
    assert f1(1, A()).item() == jax.jit(f, static_argnums=1)(1, A()) == 100
    assert f1(1, A()).item() == 100
    assert len(side) == 2 and f1.traces == 1  # one trace each: accy's, JAX's


def test_jit_kwargs():
    side = []

    def f(x, y, z):
        side.append(None)
        return 100 * x + 10 * y + z

    g = accy.jit(f)
    assert g(1, 2, 3).item() == jax.jit(f)(1, 2, 3) == 123
    assert g(1, 2, 3).item() == 123 and g.traces == 1
    assert g(1, 2, z=3).item() == 123 and g.traces == 2  # a keyword: another signature
    assert g(1, 2, z=3).item() == 123 and g.traces == 2


def test_jit_static_argnums_requires_type_equality():
    seen = []

    @accy.jit(static_argnames="k")
    def f(k):
        seen.append(k)
        return 0.0

    for x in [1, True, 1.0]:
        f(k=x)
        f(k=x)
    assert [type(v) for v in seen] == [int, bool, float]  # no cache hit across types


def test_jit_nan_times_zero():
    def f(x):
        return 1 + x * 0

    close(accy.jit(f)(scalar(np.nan)), jax.jit(f)(np.nan))
    assert np.isnan(accy.jit(f)(scalar(np.nan)).item())


def test_grad_argnums():
    def f(x, y, z, flag=False):
        assert flag
        return 1.0 * x + 2.0 * y + 3.0 * z

    close(accy.grad(f)(1.0, 1.0, 1.0, flag=True), jax.grad(f)(1.0, 1.0, 1.0, flag=True))
    close(accy.grad(f, argnums=1)(1.0, 1.0, 1.0, flag=True), 2.0)
    close(
        accy.grad(f, argnums=(2, 0))(1.0, 1.0, 1.0, flag=True),
        jax.grad(f, argnums=(2, 0))(1.0, 1.0, 1.0, flag=True),
    )


def test_value_and_grad_argnums():
    def f(x, y, z, flag=False):
        assert flag
        return 1.0 * x + 2.0 * y + 3.0 * z

    for argnums in (0, 1, (2, 0)):
        close(
            accy.value_and_grad(f, argnums=argnums)(1.0, 1.0, 1.0, flag=True),
            jax.value_and_grad(f, argnums=argnums)(1.0, 1.0, 1.0, flag=True),
        )


def test_grad_of_jit():
    side = []

    @accy.jit
    def f(x):
        side.append(None)
        return x * x

    close(accy.grad(f)(1.0), jax.grad(lambda x: x * x)(1.0))
    close(accy.grad(f)(2.0), 4.0)
    assert len(side) == 1


def test_jit_of_grad():
    side = []

    @accy.jit
    def f(x):
        side.append(None)
        return x * x

    g = accy.jit(accy.grad(f))
    close(g(scalar(1.0)), 2.0)
    close(g(scalar(2.0)), 4.0)
    assert len(side) == 1


def test_grad_nonscalar_and_tuple_outputs():
    with pytest.raises(accy.GradientRequiresScalarOutput, match="scalar"):
        accy.grad(lambda x: x)(vec([0.0, 0.0, 0.0]))
    with pytest.raises(accy.TransformError, match="one scalar array"):
        accy.grad(lambda x: (x, x))(1.0)
    with pytest.raises(accy.TransformError, match="one scalar array"):
        accy.grad(lambda x: ())(vec([0.0, 0.0, 0.0]))


def test_grad_bad_input():
    with pytest.raises(accy.NonArrayLeaf, match="'foo'"):
        accy.grad(lambda x: x)("foo")


def test_grad_of_int_errors():
    with pytest.raises(accy.TransformError, match="floating-point"):
        accy.grad(lambda x: x**2)(3)


def test_jacobian():
    a = RNG.normal(size=(4, 3)).astype(np.float32)
    x = RNG.normal(size=3).astype(np.float32)
    w = accy.named(a, ("o", "i"), device="reference")

    def f(x):
        return w.contract(x, "i")

    for ours, theirs in ((accy.jacfwd, jax.jacfwd), (accy.jacrev, jax.jacrev)):
        close(ours(f)(vec(x)), theirs(lambda x: a @ x)(x))
    tanh = lambda x: f(x).tanh()  # noqa: E731
    close(accy.jacfwd(tanh)(vec(x)), accy.jacrev(tanh)(vec(x)))
    close(accy.jacrev(tanh)(vec(x)), jax.jacrev(lambda x: jnp.tanh(a @ x))(x))


def test_hessian():
    a = RNG.normal(size=(4, 4)).astype(np.float32)
    x = RNG.normal(size=4).astype(np.float32)
    w = accy.named(a, ("i_", "i"), device="reference")

    def f(x):
        return (x.rename("i", "i_") * w.contract(x, "i")).sum()

    expected = jax.hessian(lambda x: jnp.dot(x, jnp.dot(a, x)))(x)
    close(accy.hessian(f)(vec(x)), expected, rtol=1e-4)
    np.testing.assert_allclose(expected, a + a.T, rtol=1e-4)


def test_hessian_aux():
    a = RNG.normal(size=(4, 4)).astype(np.float32)
    x = RNG.normal(size=4).astype(np.float32)
    w = accy.named(a, ("i_", "i"), device="reference")
    h, aux = accy.hessian(
        lambda x: ((x.rename("i", "i_") * w.contract(x, "i")).sum(), x), has_aux=True
    )(vec(x))
    eh, eaux = jax.hessian(lambda x: (jnp.dot(x, jnp.dot(a, x)), x), has_aux=True)(x)
    close(h, eh, rtol=1e-4)
    close(aux, eaux)


def test_jacobian_on_pytrees():
    zero, one = scalar(0.0), scalar(1.0)  # the peer's 0. and 1., on the reference evaluator
    three = (scalar(1.0), scalar(2.0), scalar(3.0))
    for ours, theirs in ((accy.jacfwd, jax.jacfwd), (accy.jacrev, jax.jacrev)):
        close(ours(lambda x, y: (x, y))(zero, one), theirs(lambda x, y: (x, y))(0.0, 1.0))
        close(ours(lambda x, y: (x, y), 1)(zero, one), theirs(lambda x, y: (x, y), 1)(0.0, 1.0))
        close(
            ours(lambda x, y: (x, y), (0, 1))(zero, one),
            theirs(lambda x, y: (x, y), (0, 1))(0.0, 1.0),
        )
        close(ours(lambda x: x[:2])(three), theirs(lambda x: x[:2])((1.0, 2.0, 3.0)))
        x = RNG.normal(size=2).astype(np.float32)
        y = RNG.normal(size=3).astype(np.float32)
        got = ours(lambda x, y: {"x": x.rename("i", "p"), "xy": (x * y).rename("i", "p")})(
            vec(x), vec(y, "j")
        )
        expected = theirs(lambda x, y: {"x": x, "xy": jnp.outer(x, y)})(x, y)
        close(got, expected)


def test_hessian_on_pytrees():
    got = accy.hessian(lambda x: [v**2.0 for v in x])((scalar(1.0), scalar(2.0)))
    expected = jax.hessian(lambda x: jnp.array(x) ** 2)((1.0, 2.0))
    # JAX stacks the list into one array (the last axis of each block); accy keeps the list.
    stacked = [
        [np.array([got[k][i][j].item() for k in range(2)]) for j in range(2)] for i in range(2)
    ]
    close(stacked, expected)


def test_grad_and_aux_basic():
    g, aux = accy.grad(lambda x: (x**3.0, [x**2.0]), has_aux=True)(3.0)
    eg, eaux = jax.grad(lambda x: (x**3, [x**2]), has_aux=True)(3.0)
    close((g, aux), (eg, eaux))


def test_grad_and_aux_error():
    for bad in (lambda x: (1, 2, 3), lambda x: x, lambda x: (x,)):
        with pytest.raises(accy.TransformError, match="must return a pair"):
            accy.grad(bad, has_aux=True)(1.0)


def test_grad_and_aux_nested():
    def f(x):
        g, aux = accy.grad(lambda x: (x**3.0, [x**3.0]), has_aux=True)(x)
        return aux[0] * x.sin()

    def f_jax(x):
        g, aux = jax.grad(lambda x: (x**3, [x**3]), has_aux=True)(x)
        return aux[0] * jnp.sin(x)

    expected = jax.grad(f_jax)(4.0)
    close(accy.grad(f)(4.0), expected)
    close(accy.jit(accy.grad(f))(scalar(4.0)), expected)
    close(accy.jit(accy.grad(accy.jit(f)))(scalar(4.0)), expected)


def test_grad_and_aux_constant():
    g, aux = accy.grad(lambda x: (x**3.0, [4.0]), has_aux=True)(4.0)
    close((g, aux), jax.grad(lambda x: (x**3, [4.0]), has_aux=True)(4.0))


def test_jacfwd_and_jacrev_and_aux_nested():
    for ours, theirs in ((accy.jacfwd, jax.jacfwd), (accy.jacrev, jax.jacrev)):
        jac, aux = ours(lambda x: (x**3.0, [x**2.0]), has_aux=True)(3.0)
        close((jac, aux), theirs(lambda x: (x**3, [x**2]), has_aux=True)(3.0))

        def f(x, ours=ours):
            jac, aux = ours(lambda x: (x**3.0, [x**3.0]), has_aux=True)(x)
            return aux[0] * x.sin()

        def f_jax(x, theirs=theirs):
            jac, aux = theirs(lambda x: (x**3, [x**3]), has_aux=True)(x)
            return aux[0] * jnp.sin(x)

        close(ours(f)(4.0), theirs(f_jax)(4.0))
        close(accy.jit(ours(accy.jit(f)))(scalar(4.0)), theirs(f_jax)(4.0))


def test_jvp_and_aux_basic():
    got = accy.jvp(lambda x: (x**3.0, [x**2.0]), (3.0,), (4.0,), has_aux=True)
    expected = jax.jvp(lambda x: (x**3, [x**2]), (3.0,), (4.0,), has_aux=True)
    close(got, expected)


def test_jvp_mismatched_arguments():
    with pytest.raises(accy.TransformError, match="structure"):
        accy.jvp(lambda x, y: x * y, (np.float32(2),), ())
    with pytest.raises(accy.TransformError, match="type"):
        accy.jvp(lambda x: -x, (vec([1.0, 2.0, 3.0]),), (vec([1.0, 2.0, 3.0, 4.0]),))


def test_jvp_non_tuple_arguments():
    with pytest.raises(accy.TransformError, match="tuples of arguments"):
        accy.jvp(lambda x, y: x + y, 0.0, (1.0,))


def test_vjp_mismatched_arguments():
    _, pullback = accy.vjp(lambda x, y: x * y, np.float32(3), np.float32(4))
    with pytest.raises(accy.TransformError, match="structure"):
        pullback((np.float32(7), np.float32(100)))
    with pytest.raises(accy.TransformError, match="type"):
        pullback(np.float16(42))


def test_jvp_jit_cached():
    def func(x):
        def inner(y):
            return y * x

        return accy.jit(inner)(4.0) + accy.jit(inner)(5.0)

    def func_jax(x):
        def inner(y):
            return y * x

        return jax.jit(inner)(4.0) + jax.jit(inner)(5.0)

    close(accy.jvp(func, (5.0,), (1.0,)), jax.jvp(func_jax, (5.0,), (1.0,)))


def test_linear_transpose_abstract():
    y = np.arange(3, dtype=np.float32)
    (z,) = accy.linear_transpose(lambda x: 2.0 * x, vec([0.0, 0.0, 0.0]))(vec(y))
    (e,) = jax.linear_transpose(lambda x: 2 * x, jax.ShapeDtypeStruct((3,), np.float32))(y)
    close(z, e)


def test_linear_transpose_dce():
    f = accy.jit(lambda x: (2.0 * x, x > 0))
    close(accy.linear_transpose(lambda x: f(x)[0], 1.0)(1.0), (2.0,))


def test_linear_transpose_error():
    t = accy.linear_transpose(lambda x: [x, x], 1.0)
    with pytest.raises(accy.TransformError, match="structure"):
        t(1.0)
    t = accy.linear_transpose(lambda x: x.broadcast_to(accy.spec(accy.f32, two=2)), 1.0)
    with pytest.raises(accy.TransformError, match="type"):
        t(1.0)


def test_linear_transpose_zeros():
    got = accy.linear_transpose(lambda x: x[0], [1.0, 2.0])(3.0)
    expected = jax.linear_transpose(lambda x: x[0], [1.0, 2.0])(3.0)
    close(got, expected)


def test_linearize_instantiates_zero_outputs():
    _, f_lin = accy.linearize(lambda x: (x, 1.0), 3.0)
    _, y = f_lin(1.0)
    close(y + 1.0, 1.0)


def test_linearize_aux():
    f, lin_fn, aux = accy.linearize(lambda x: (x * 2.0 - 3.0, x > 0), 3.4, has_aux=True)
    ef, elin, eaux = jax.linearize(lambda x: (x * 2 - 3, x > 0), 3.4, has_aux=True)
    close((f, lin_fn(5.0)), (ef, elin(5.0)))
    assert bool(aux) == bool(eaux)


@pytest.mark.parametrize("remat", [accy.checkpoint, accy.remat])
def test_remat_basic(remat):
    @remat
    def g(x):
        return x.sin().sin(), 3.0

    def f(x):
        return g(x)[0]

    def f_jax(x):
        return jax.remat(lambda x: (jnp.sin(jnp.sin(x)), 3.0))(x)[0]

    close(f(scalar(2.0)), f_jax(2.0))
    ans, f_lin = accy.linearize(f, 2.0)
    eans, elin = jax.linearize(f_jax, 2.0)
    close((ans, f_lin(3.0)), (eans, elin(3.0)))


def test_remat_freevars():
    def f2(x):
        y = 2.0 * x.sin()
        return accy.checkpoint(lambda x: x.cos() * y.sin())(x)

    def f2_jax(x):
        y = 2 * jnp.sin(x)
        return jax.remat(lambda x: jnp.cos(x) * jnp.sin(y))(x)

    close(f2(scalar(2.0)), f2_jax(2.0))
    close(accy.grad(f2)(2.0), jax.grad(f2_jax)(2.0))
    close(accy.jvp(f2, (2.0,), (1.0,)), jax.jvp(f2_jax, (2.0,), (1.0,)))


def test_stop_gradient():
    def f(x):
        return x.sin() * accy.stop_gradient(x.cos())

    def f_jax(x):
        return jnp.sin(x) * jax.lax.stop_gradient(jnp.cos(x))

    close(accy.grad(f)(3.0), jax.grad(f_jax)(3.0))
    close(accy.jvp(f, (3.0,), (1.0,)), jax.jvp(f_jax, (3.0,), (1.0,)))


def test_jit_decorator_factory():
    @accy.jit(static_argnames=["flag"])
    def func(x, flag):
        return x if flag else -x

    expected = jax.jit(lambda x, flag: x if flag else -x, static_argnames=["flag"])
    assert func(1, True).item() == expected(1, True) == 1
    assert func(1, False).item() == expected(1, False) == -1


def test_jit_of_noncallable():
    with pytest.raises(accy.TransformError, match="needs a function"):
        accy.jit(3)


def test_jit_lower_compile():
    def f(x):
        return (x**2.0).sqrt() + 1.0

    lowered = accy.jit(f).lower(1.0)
    compiled = lowered.compile()
    expected = jax.jit(lambda x: jnp.sqrt(x**2) + 1.0).lower(1.0).compile()(1.0)
    close(compiled(np.float32(1.0))[0], expected)
    assert [str(t) for t in lowered.program.parameter_types] == ["f32[]"]


def test_jit_lower_as_text():
    lowered = accy.jit(lambda x: x + 4.0).lower(1.0)
    assert isinstance(lowered.as_text(), str) and "add" in lowered.as_text()
    assert isinstance(lowered.source(), str) and isinstance(lowered.plan(), str)
