"""JAX's tests/api_test.py, classes RematTest, Remat3Test, InputSavedVJPTest, JaxprTest,
DCETest, NamedCallTest, EvalJaxprPrimitiveTest and the one-case classes, case by case on accy's
`checkpoint` (its policies and `checkpoint_name`), `make_program`, `scan`, `cond` and the
gradient transforms: the peer's programs with named axes, JAX's own results computed in the same
run. What a policy saves is read off the backward pass: the operations the reverse scan of the
checkpointed region recomputes, and the residuals it reads."""

import functools
import re
import traceback
from pathlib import Path

import jax
import jax.ad_checkpoint
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals

import accy
from accy.core import Program
from tests.peers.ledger import not_applicable_tests, translates

P = accy.checkpoint_policies
NEVER = functools.partial(accy.checkpoint, policy=lambda op, name: False)
REMATS = pytest.mark.parametrize("remat", [accy.checkpoint, NEVER], ids=["default", "policy"])


def scalar(value):
    return accy.named(np.float32(value), (), device="reference")


def vec(values, axes=("i",)):
    return accy.named(np.asarray(values, np.float32), axes, device="reference")


def close(got, expected, rtol=1e-5, atol=1e-6):
    got = got.array if isinstance(got, accy.NamedArray) else got
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(expected), rtol, atol)


def count(program, kind, op=None):
    """Operations of `kind` (a unary one: `op`) in `program` and every body nested in it."""
    found = 0
    for operation in program.operations:
        if operation.kind == kind and (op is None or operation.attrs.get("op") == op):
            found += 1
        for value in operation.attrs.values():
            if isinstance(value, Program):
                found += count(value, kind, op)
    return found


def backward_scans(program):
    """The reverse scans that transposing the checkpointed regions made (outermost first)."""
    found = []
    for operation in program.operations:
        body = operation.attrs.get("body")
        if operation.kind == "scan" and body.name.endswith("_transposed"):
            found.append(operation)
    return found


def backward(f, *args):
    """The backward pass of `f` at `args`: the body of the checkpointed region's reverse scan
    (what the backward pass recomputes) and its residuals (how many primal values it reads)."""
    out, vjp_fn = accy.vjp(f, *args)
    program = accy.make_program(vjp_fn)(out)
    (scan,) = backward_scans(program)
    return scan.attrs["body"], scan.attrs["num_consts"]


def counts(program):
    return {op: count(program, "unary", op) for op in ("sin", "cos")} | {
        "dot": count(program, "dot_general")
    }


def recomputed(f, *args):
    """What the backward pass of `f` at `args` computes in the checkpointed region's reverse
    scan: the sines, cosines and dots it does (JAX counts them in `make_jaxpr(f_vjp)`)."""
    return counts(backward(f, *args)[0])


# -- RematTest -----------------------------------------------------------------------------------


@translates("RematTest.test_remat_grad_python_control_flow_static_argnums")
def test_remat_grad_python_control_flow_static_argnums():
    # JAX's static_argnums: accy passes a Python value through the region unchanged.
    @accy.checkpoint
    def g(x, positive):
        return (x.sin(), 3.0) if positive else (x.cos(), 4.0)

    close(g(scalar(2.0), 2.0 > 0)[0], np.sin(2.0))
    close(accy.grad(lambda x: g(x, True)[0])(scalar(2.0)), jax.grad(jnp.sin)(2.0))


@translates("RematTest.test_remat_grad_python_control_flow_unhashable_static_argnums")
def test_remat_grad_python_control_flow_unhashable_static_argnums():
    class A:
        def __init__(self, positive):
            self.positive = positive

        __hash__ = None  # unhashable

    @accy.checkpoint
    def g(x, a):
        return (x.sin(), 3.0) if a.positive else (x.cos(), 4.0)

    close(g(scalar(2.0), A(True))[0], np.sin(2.0))
    close(accy.grad(lambda x: g(x, A(False))[0])(scalar(2.0)), jax.grad(jnp.cos)(2.0))


@translates("RematTest.test_remat_retracing")
def test_remat_retracing():
    traced = []

    @accy.checkpoint
    def g(x):
        traced.append(None)
        return x.sin(), 3.0

    f = accy.jit(lambda x: g(x)[0])
    for _ in range(10):
        close(f(scalar(2.0)), np.sin(2.0))
    assert len(traced) == 1  # traced once with the jitted function, then cached


@translates("RematTest.test_remat_static_agnums_retracing")
def test_remat_static_agnums_retracing():
    traced = []

    @accy.checkpoint
    def g(x, positive):
        traced.append(None)
        return (x.sin(), 3.0) if positive else (x.cos(), 4.0)

    f = accy.jit(lambda x, positive: g(x, positive)[0], static_argnames="positive")
    for _ in range(10):
        close(f(scalar(2.0), positive=True), np.sin(2.0))
    assert len(traced) == 1


@translates("RematTest.test_remat_jit")
@REMATS
def test_remat_jit(remat):
    g = remat(lambda x: x.sin().sin())
    f = accy.jit(lambda x: g(x))
    x = scalar(2.0)
    expected = jax.grad(lambda x: jnp.sin(jnp.sin(x)))(2.0)
    close(f(x), np.sin(np.sin(2.0)))
    close(accy.grad(f)(x), expected)
    close(accy.jit(accy.grad(lambda x: g(x)))(x), expected)


@translates("RematTest.test_remat_vmap")
@REMATS
def test_remat_vmap(remat):
    g = remat(lambda x: x.sin().sin())
    x = vec(np.arange(3.0))
    close(accy.vmap(g, "i")(x), np.sin(np.sin(np.arange(3.0))))
    jax_g = jax.checkpoint(lambda x: jnp.sin(jnp.sin(x)))
    expected = jax.jacfwd(jax_g)(jnp.arange(3.0))
    h = accy.jacfwd(lambda x: g(x).rename("i", "o"))(x)
    close(h, expected)
    close(accy.jacrev(lambda x: g(x).rename("i", "o"))(x), expected)


@translates("RematTest.test_remat_vmap_not_leading_dim")
@REMATS
def test_remat_vmap_not_leading_dim(remat):
    g = remat(lambda x: x.sin().sin())
    data = np.arange(3 * 5.0).reshape(3, 5)
    got = accy.vmap(g, "j")(vec(data, ("i", "j")))  # JAX's in_axes=1, out_axes=0
    assert got.axes == ("j", "i")
    close(got, jax.vmap(jax.checkpoint(lambda x: jnp.sin(jnp.sin(x))), 1, 0)(data))


@translates("RematTest.test_remat_higher_order_autodiff")
@REMATS
def test_remat_higher_order_autodiff(remat):
    g = remat(lambda x: x.sin().cos())
    expected = jax.grad(jax.grad(lambda x: jnp.cos(jnp.sin(x))))(3.0)
    close(accy.grad(accy.grad(g))(scalar(3.0)), expected, rtol=1e-4)


@translates("RematTest.test_remat_higher_order_ad_preserves_remat_primitive")
@pytest.mark.parametrize("kind", ["basic", "cond"])
def test_remat_higher_order_ad_preserves_remat_primitive(kind):
    if kind == "basic":
        f, jax_f = (lambda x: x.sin().sin()), (lambda x: jnp.sin(jnp.sin(x)))
    else:
        f = lambda x: accy.cond(x > 0, lambda x: x.sin(), lambda x: x.cos(), x)  # noqa: E731
        jax_f = lambda x: jax.lax.cond(x > 0, jnp.sin, jnp.cos, x)  # noqa: E731
    g = accy.checkpoint(f)
    x = scalar(0.3)
    close(accy.grad(accy.grad(g))(x), jax.grad(jax.grad(jax_f))(0.3), rtol=1e-4)
    program = accy.make_program(accy.value_and_grad(accy.grad(g)))(x)
    remats = [op for op in program.operations if op.attrs.get("remat")]
    assert remats, "the second derivative keeps a checkpointed region"


@translates("RematTest.test_remat_scan")
def test_remat_scan():
    def to_scan(c, x):
        return c.sin(), None

    xs = vec(np.arange(3.0), ("t",))

    def f(x, remat):
        body = accy.checkpoint(to_scan) if remat else to_scan
        return accy.scan(body, x, xs, axis="t")[0]

    def jax_f(x):
        return jax.lax.scan(jax.checkpoint(lambda c, x: (jnp.sin(c), None)), x, np.arange(3.0))[0]

    x = scalar(4.0)
    close(f(x, True), f(x, False))
    close(accy.grad(lambda x: f(x, True))(x), jax.grad(jax_f)(4.0))
    y, vjp_fn = accy.vjp(lambda x: f(x, True), x)
    assert count(accy.make_program(vjp_fn)(y), "unary", "cos") >= 1


@translates("RematTest.test_remat_no_redundant_flops")
@REMATS
def test_remat_no_redundant_flops(remat):
    two = scalar(2.0)
    f = remat(lambda x, y: x.sin() * y)
    g = accy.jit(lambda x: f(two, x))
    program = accy.make_program(accy.grad(g))(scalar(3.0))
    assert count(program, "unary", "sin") <= 1
    close(accy.grad(g)(scalar(3.0)), np.sin(2.0))


@translates("RematTest.test_remat_binomial_checkpointing")
@REMATS
def test_remat_binomial_checkpointing(remat):
    def binom_checkpoint(funs):
        if len(funs) == 1:
            return funs[0]
        f1 = binom_checkpoint(funs[: len(funs) // 2])
        f2 = binom_checkpoint(funs[len(funs) // 2 :])
        return remat(lambda x: f1(f2(x)))

    f1 = binom_checkpoint([lambda x: x.sin()] * 4)
    x = scalar(4.0)
    jax_f = lambda x: jnp.sin(jnp.sin(jnp.sin(jnp.sin(x))))  # noqa: E731
    close(f1(x), jax_f(4.0))
    close(accy.grad(f1)(x), jax.grad(jax_f)(4.0), rtol=1e-4)


@translates("RematTest.test_remat_symbolic_zeros")
def test_remat_symbolic_zeros():
    init = np.random.default_rng(0).uniform(0.0, 5.0, (5, 3)).astype(np.float32)

    def func(d0):
        def move(r, i):
            return r + 0.001 * (d0 * r), accy.named(np.zeros(1, np.float32), "one")

        r, _ = accy.scan(accy.checkpoint(move), vec(init, ("n", "d")), length=2, axis="t")
        return r["n", 0]["d", 0]

    def jax_func(d0):
        def move(r, i):
            return r + 0.001 * (d0 * r), jnp.array([0.0])

        return jax.lax.scan(jax.checkpoint(move), init, jnp.arange(2))[0][0, 0]

    close(accy.grad(func)(scalar(5.0)), jax.grad(jax_func)(5.0), rtol=1e-4)


@translates("RematTest.test_remat_jit2")
@REMATS
def test_remat_jit2(remat):
    @accy.jit
    def f(x):
        y = 2 * x

        @remat
        def g():
            return y

        return g()

    close(f(scalar(3.0)), 6.0)


@translates("RematTest.test_remat_nontrivial_env")
def test_remat_nontrivial_env():
    @accy.checkpoint
    def foo(state, dt=0.5, c=1):
        u, u_t = state
        u_tt = c**2 * u
        return (u, u_t + u_tt * dt)

    @functools.partial(accy.jit, static_argnames="count")
    def multi_step(state, count, dt, c):
        return accy.scan(lambda s, _: (foo(s, dt, c), None), state, length=count, axis="t")

    def loss(u0, target, steps, dt=0.5**0.5, c=1.0):
        (uf, _), _ = multi_step((u0, u0 * 0.0), steps, np.float32(dt), c)
        return ((uf - target) ** 2).mean()

    def jax_loss(u0, target):
        foo = jax.checkpoint(lambda s, dt, c: (s[0], s[1] + c**2 * s[0] * dt))
        (uf, _), _ = jax.lax.scan(
            lambda s, _: (foo(s, 1 / np.sqrt(2), 1.0), None), (u0, u0 * 0), None, 10
        )
        return ((uf - target) ** 2).mean()

    target = vec(np.zeros((4, 4)), ("a", "b"))
    u0 = vec(np.ones((4, 4)), ("a", "b"))
    close(loss(u0, target, 10), jax_loss(jnp.ones((4, 4)), jnp.zeros((4, 4))), rtol=1e-5)


@pytest.mark.slow
@translates("RematTest.test_remat_jit3")
@REMATS
def test_remat_jit3(remat):
    def f(w, x):
        a = x.contract(w, "d").rename("e", "d")  # jnp.dot(x, w)
        b = a.contract(a.rename("t", "T"), "d")  # einsum btd,bTd->btT
        c = b.contract(a.rename("t", "T"), "T")  # einsum btT,bTd->btd
        return c.sum()

    def jax_f(w, x):
        a = jnp.dot(x, w)
        b = jnp.einsum("btd,bTd->btT", a, a)
        return jnp.sum(jnp.einsum("btT,bTd->btd", b, a))

    w = vec(np.ones((1, 1)), ("d", "e"))
    x = vec(np.ones((1, 1, 1)), ("b", "t", "d"))
    got = accy.grad(remat(f), argnums=(0, 1))(w, x)
    expected = jax.grad(jax_f, (0, 1))(jnp.ones((1, 1)), jnp.ones((1, 1, 1)))
    close(got[0], expected[0])
    close(got[1], expected[1])

    mul = accy.jit(lambda a, b: a * b)
    g = remat(lambda w, x: mul(mul(w, x), mul(w, x)))
    close(accy.grad(g)(scalar(1.0), scalar(1.0)), 2.0)


@translates("RematTest.test_remat_scan2")
def test_remat_scan2():
    def scanned_f(x, _):
        return accy.scan(lambda x, _: (x + 1.0, None), x, length=1, axis="t")[0], None

    def scan_bug(x0):
        return accy.checkpoint(scanned_f)(x0, None)[0]

    close(accy.grad(scan_bug)(scalar(1.0)), 1.0)


@translates("RematTest.test_remat_jit_static_argnum_omnistaging")
def test_remat_jit_static_argnum_omnistaging():
    def f(a_bool, y):
        return y + 1 if a_bool else y

    jitted = accy.jit(f, static_argnames="a_bool", device="reference")
    assert jitted(True, 1).item() == jax.jit(f, static_argnums=0)(True, 1) == 2


@translates("RematTest.test_escaped_tracer_remat")
@REMATS
def test_escaped_tracer_remat(remat):
    def f(x):
        seq = [x * 0.0]  # a traced value (a closed-over array would be computed eagerly)

        def g():
            seq[0] += 1  # leaks the region's traced value into seq
            return seq[0]

        remat(g)()
        remat(lambda: g())()

    with pytest.raises(accy.AccyError, match="after its function returned"):
        accy.jit(f)(scalar(0.0))


@translates("RematTest.test_remat_custom_policy")
@pytest.mark.parametrize("policy", ["save_anything", "save_nothing", "save_sin"])
@pytest.mark.parametrize("jit_square", [False, True])
def test_remat_custom_policy(policy, jit_square):
    chosen = {
        "save_anything": P.everything_saveable,
        "save_nothing": None,
        "save_sin": P.save_only_these_names("sin"),
    }[policy]
    sin = lambda x: accy.checkpoint_name(x.sin(), "sin")  # noqa: E731
    square = lambda x: x * x  # noqa: E731
    square = accy.jit(square) if jit_square else square
    f = accy.checkpoint(lambda x: sin(square(sin(x))), policy=chosen)
    jax_f = lambda x: jnp.sin(jnp.square(jnp.sin(x)))  # noqa: E731
    y, ydot = accy.jvp(f, (scalar(1.0),), (scalar(2.0),))
    y_expected, ydot_expected = jax.jvp(jax_f, (1.0,), (2.0,))
    close(y, y_expected)
    close(ydot, ydot_expected, rtol=1e-5)
    close(accy.grad(f)(scalar(3.0)), jax.grad(jax_f)(3.0), rtol=1e-5)
    close(accy.grad(accy.grad(f))(scalar(3.0)), jax.grad(jax.grad(jax_f))(3.0), rtol=1e-4)
    if policy == "save_anything":  # no region at all: nothing is recomputed
        out, vjp_fn = accy.vjp(f, scalar(1.0))
        assert not backward_scans(accy.make_program(vjp_fn)(out))
        return
    again = recomputed(f, scalar(1.0))
    # The backward pass needs sin(x) (square's derivative) and the two cosines.
    assert again["sin"] == (0 if policy == "save_sin" else 1)
    assert again["cos"] == 2


@pytest.mark.slow
@translates("RematTest.test_remat_checkpoint_dots", "RematTest.test_remat_checkpoint_dots_jit")
@pytest.mark.parametrize("jitted", [False, True])
@pytest.mark.parametrize(
    "policy", [P.checkpoint_dots, P.dots_saveable, P.nothing_saveable], ids=["dots", "same", "none"]
)
def test_remat_checkpoint_dots(policy, jitted):
    def mm(x):
        return x.contract(x.rename("j", "k").rename("i", "j"), "j").rename("k", "j")

    def f(x):
        x = (mm(x) * 1e-3).sin()
        x = (mm(x) * 1e-3).sin()
        return (mm(x) * 1e-3).sin()

    def jax_f(x):
        x = jnp.sin(jnp.dot(x, x, precision="highest") * 1e-3)
        x = jnp.sin(jnp.dot(x, x, precision="highest") * 1e-3)
        return jnp.sin(jnp.dot(x, x, precision="highest") * 1e-3)

    g = accy.checkpoint(f, policy=policy)
    g = accy.jit(g) if jitted else g
    data = np.ones((2, 2), np.float32) * 3.0
    x = vec(data, ("i", "j"))
    again = recomputed(g, x)
    saved = policy is not P.nothing_saveable
    # JAX's counts: with dots saved, the backward pass redoes the two inner sines and only the
    # two transposed dots per primal dot; with nothing saved, the three primal dots as well.
    assert again == {"sin": 2, "cos": 3, "dot": 6 if saved else 9}
    _, residuals = backward(g, x)
    assert residuals == (4 if saved else 1)  # the argument, and the three dots' results
    expected = jax.grad(lambda x: jax_f(x).sum())(data)
    close(accy.grad(lambda x: g(x).sum())(x), expected, rtol=1e-5)


@pytest.mark.slow
@translates(
    "RematTest.test_remat_checkpoint_dots_with_no_batch_dims",
    "RematTest.test_remat_checkpoint_dots_with_no_batch_dims2",
)
@pytest.mark.parametrize("batched", [False, True])
def test_remat_checkpoint_dots_with_no_batch_dims(batched):
    def mm(x):  # einsum ij,jk->ik, or nij,njk->nik with the batch axis n
        return x.contract(x.rename("j", "k").rename("i", "j"), "j").rename("k", "j")

    def f(x):
        return mm(mm(mm(x).sin()).sin()).sin()

    def jax_f(x):
        spec = "nij,njk->nik" if batched else "ij,jk->ik"
        for _ in range(3):
            x = jnp.sin(jnp.einsum(spec, x, x, precision="highest"))
        return x

    shape, axes = ((3, 2, 2), ("n", "i", "j")) if batched else ((2, 2), ("i", "j"))
    data = np.full(shape, 0.5, np.float32)
    g = accy.checkpoint(f, policy=P.checkpoint_dots_with_no_batch_dims)
    again = recomputed(g, vec(data, axes))
    assert again == {"sin": 2, "cos": 3, "dot": 9 if batched else 6}
    expected = jax.grad(lambda x: jax_f(x).sum())(data)
    close(accy.grad(lambda x: g(x).sum())(vec(data, axes)), expected, rtol=1e-5)


def check_grads(f, jax_f, value, order=2, rtol=1e-4):
    """`f`'s first `order` derivatives at the scalar `value` equal JAX's of `jax_f`."""
    x = scalar(value)
    for _ in range(order):
        f, jax_f = accy.grad(f), jax.grad(jax_f)
        close(f(x), jax_f(value), rtol=rtol)


@translates("RematTest.test_remat_dropvar_policy")
def test_remat_dropvar_policy():
    @functools.partial(accy.checkpoint, policy=P.checkpoint_dots)
    def g(x):
        return accy.grad(lambda x: (x, x)[0])(x)

    @functools.partial(jax.checkpoint, policy=jax.checkpoint_policies.checkpoint_dots)
    def jax_g(x):
        return jax.grad(lambda x: (x, x)[0])(x)

    close(accy.grad(g)(scalar(3.0)), jax.grad(jax_g)(3.0))


@pytest.mark.slow
@translates("RematTest.test_remat_custom_jvp_policy")
def test_remat_custom_jvp_policy():
    sin = accy.custom_jvp(lambda x: x.sin())
    sin.defjvp(lambda primals, tangents: (sin(primals[0]), primals[0].cos() * tangents[0]))
    jax_sin = jax.custom_jvp(jnp.sin)
    jax_sin.defjvp(
        lambda primals, tangents: (jax_sin(primals[0]), jnp.cos(primals[0]) * tangents[0])
    )

    @functools.partial(accy.checkpoint, policy=P.checkpoint_dots)
    def f(x):
        for _ in range(3):
            x = sin(x * x * 1e-3)  # jnp.dot of two scalars
        return x

    def jax_f(x):
        for _ in range(3):
            x = jax_sin(jnp.dot(x, x) * 1e-3)
        return x

    check_grads(f, jax_f, 3.0)
    g = lambda x: accy.scan(lambda x, _: (f(x), None), x, length=2, axis="t")[0]  # noqa: E731
    jax_g = lambda x: jax.lax.scan(lambda x, _: (jax_f(x), None), x, None, 2)[0]  # noqa: E731
    check_grads(g, jax_g, 3.0)


@translates("RematTest.test_remat_custom_vjp_policy")
def test_remat_custom_vjp_policy():
    sin = accy.custom_vjp(lambda x: x.sin())
    sin.defvjp(lambda x: (sin(x), x), lambda x, y_bar: (x.cos() * y_bar,))

    @functools.partial(accy.checkpoint, policy=P.checkpoint_dots)
    def f(x):
        def dot2(y, z):  # JAX's named_call "dot" of two scalar dots
            return x * (y * z)

        for _ in range(3):
            x = sin(dot2(x, x) * 1e-3)
        return x

    def jax_f(x):
        for _ in range(3):
            x = jnp.sin(x * (x * x) * 1e-3)
        return x

    close(accy.grad(f)(scalar(3.0)), jax.grad(jax_f)(3.0), rtol=1e-4)
    g = lambda x: accy.scan(lambda x, _: (f(x), None), x, length=2, axis="t")[0]  # noqa: E731
    jax_g = lambda x: jax.lax.scan(lambda x, _: (jax_f(x), None), x, None, 2)[0]  # noqa: E731
    close(accy.grad(g)(scalar(3.0)), jax.grad(jax_g)(3.0), rtol=1e-4)


@translates("RematTest.test_constants_not_hoisted")
def test_constants_not_hoisted():
    never = functools.partial(accy.checkpoint, policy=P.nothing_saveable)
    x = vec(np.ones((2, 2)), ("i", "j"))
    zeros = vec(np.zeros((2, 2)), ("i", "j"))  # a constant of the region, as jnp.zeros_like
    jax_never = functools.partial(jax.checkpoint, policy=jax.checkpoint_policies.nothing_saveable)
    for f, jax_f in [
        (lambda x: zeros * x, lambda x: jnp.zeros_like(x) * x),
        (lambda x: zeros * x.sin(), lambda x: jnp.zeros_like(x) * jnp.sin(x)),
    ]:
        body, residuals = backward(never(f), x)
        expected = len(saved_residuals(jax_never(jax_f), jnp.ones((2, 2))))
        assert residuals == expected
        assert count(body, "constant") <= 1  # the zeros are recomputed, not stored


def _residual_count(f, *args):
    return backward(f, *args)[1]


@translates("RematTest.test_name_saveable_input", "RematTest.test_name_pytree")
@pytest.mark.parametrize("tree", [False, True])
def test_name_saveable_input(tree):
    def mm(x):
        return x.contract(x.rename("j", "k").rename("i", "j"), "j").rename("k", "j")

    @functools.partial(accy.checkpoint, policy=P.save_only_these_names("foo"))
    def f(x):
        x = (
            accy.checkpoint_name({"a": mm(x)}, "foo")["a"]
            if tree
            else (accy.checkpoint_name(mm(x), "foo"))
        )
        return mm(x)

    body, residuals = backward(f, vec(np.ones((3, 3)), ("i", "j")))
    assert residuals == 2  # the argument and the value named foo (JAX's res[1])
    assert count(body, "dot_general") == 4  # two transposed dots each; the first is not redone

    def jax_f(x):
        y = jax.ad_checkpoint.checkpoint_name(jnp.dot(x, x), "foo")
        return jnp.dot(y, y)

    jax_f = jax.checkpoint(jax_f, policy=jax.checkpoint_policies.save_only_these_names("foo"))
    assert len(saved_residuals(jax_f, jnp.ones((3, 3)))) == residuals


def _named_product(x):
    y = accy.checkpoint_name(x.sin(), "y")
    z = accy.checkpoint_name(x.cos(), "z")
    w = accy.checkpoint_name(x.exp(), "w")
    return (((x * y) * z) * w) * x.tanh()


def _jax_named_product(x):
    name = jax.ad_checkpoint.checkpoint_name
    y, z, w = name(jnp.sin(x), "y"), name(jnp.cos(x), "z"), name(jnp.exp(x), "w")
    return (((x * y) * z) * w) * jnp.tanh(x)


@translates("RematTest.test_name_denylist", "RematTest.test_name_allowlist")
@pytest.mark.parametrize(
    "names", [("y", "z", "w"), ("z", "w"), ("w",), ()], ids=["yzw", "zw", "w", "none"]
)
@pytest.mark.parametrize("kind", ["save_any_names_but_these", "save_only_these_names"])
def test_name_lists(kind, names):
    # JAX's values are constants (2 * 2), which accy computes eagerly; here they depend on x.
    f = accy.checkpoint(_named_product, policy=getattr(P, kind)(*names))
    jax_f = jax.checkpoint(
        _jax_named_product, policy=getattr(jax.checkpoint_policies, kind)(*names)
    )
    saved = len(names) if kind == "save_only_these_names" else 3 - len(names)
    residuals = _residual_count(f, scalar(0.5))
    assert residuals == 1 + saved  # x, and the named values the policy keeps
    assert residuals == len(saved_residuals(jax_f, 0.5))
    close(accy.grad(f)(scalar(0.5)), jax.grad(_jax_named_product)(0.5), rtol=1e-5)


@translates("RematTest.test_checkpoint_name_vmap")
def test_checkpoint_name_vmap():
    def f(x):
        return accy.checkpoint_name(x * 2.0, "y") + 1.0

    f_remat = accy.checkpoint(f, policy=P.save_only_these_names("y"))
    f_vmapped = accy.vmap(f_remat, "row")
    data = np.arange(6.0).reshape(2, 3)
    x = vec(data, ("row", "col"))
    close(f_vmapped(x), data * 2.0 + 1.0)
    close(accy.grad(lambda a: f_vmapped(a).sum())(x), np.full((2, 3), 2.0))


@translates("RematTest.test_checkpoint_dropvars")
@REMATS
def test_checkpoint_dropvars(remat):
    @remat
    def f(x):
        _, x = accy.jit(lambda: (x, x))()
        return x

    close(accy.grad(f)(scalar(3.0)), 1.0)


@translates("RematTest.test_dce_keeps_eqns_with_used_outputs_but_no_used_inputs")
def test_dce_keeps_eqns_with_used_outputs_but_no_used_inputs():
    @accy.checkpoint
    def f(x):
        c = accy.jit(lambda: accy.named(np.float32(3.0), ()), device="reference")()
        return c * x

    close(accy.grad(f)(scalar(3.0)), 3.0)


@translates(
    "RematTest.test_linearize_caching",
    "RematTest.test_vjp_caching",
    "RematTest.test_fwd_caching",
)
@pytest.mark.parametrize("transform", ["linearize", "vjp", "fwd"])
def test_remat_of_jit_caching(transform):
    inner = accy.jit(lambda x: 2 * x)
    identity = accy.checkpoint(inner)
    x = scalar(1.0)
    if transform == "linearize":
        _, f_lin = accy.linearize(identity, x)
        results = [f_lin(x) for _ in range(20)]
    elif transform == "vjp":
        _, f_vjp = accy.vjp(identity, x)
        results = [f_vjp(x)[0] for _ in range(20)]
    else:
        results = [accy.jvp(identity, (x,), (x,))[1] for _ in range(20)]
    for result in results:
        close(result, 2.0)
    assert inner.traces == 1  # the jitted function is traced once, then reused


@translates(
    "RematTest.test_vjp_caching_static_argnums", "RematTest.test_fwd_caching_static_argnums"
)
@pytest.mark.parametrize("transform", ["vjp", "fwd"])
def test_remat_of_jit_caching_static(transform):
    inner = accy.jit(lambda x, y: 2 * x if y else x, static_argnames="y")
    identity = accy.checkpoint(lambda x, y: inner(x, y=y))
    x = scalar(1.0)
    for _ in range(20):
        if transform == "vjp":
            _, f_vjp = accy.vjp(lambda x: identity(x, True), x)
            close(f_vjp(x)[0], 2.0)
        else:
            close(accy.jvp(lambda x: identity(x, True), (x,), (x,))[1], 2.0)
    assert inner.traces == 1


@translates("RematTest.test_remat_of_scan")
def test_remat_of_scan():
    def f(x):
        return accy.scan(lambda c, _: (c.sin(), c.sin()), x, length=3, axis="t")

    def jax_f(x):
        return jax.lax.scan(lambda c, _: (jnp.sin(c), jnp.sin(c)), x, None, length=3)

    g = accy.checkpoint(lambda x: f(x)[0])
    check_grads(g, lambda x: jax_f(x)[0], 3.0)
    out, vjp_fn = accy.vjp(g, scalar(4.0))
    program = accy.make_program(vjp_fn)(out)
    assert count(program, "unary", "sin") and count(program, "unary", "cos")


@translates("RematTest.test_remat_of_scan_unused_extensive_output_grad")
def test_remat_of_scan_unused_extensive_output_grad():
    def f(c, a):
        b = a.sin().sum() + c.sin().sum()
        return (c * b).sin(), b

    def jax_f(c, a):
        b = jnp.sin(a).sum() + jnp.sin(c).sum()
        return jnp.sin(c * b), b

    g = accy.checkpoint(lambda c, a: accy.scan(f, c, a, axis="t"), policy=P.nothing_saveable)
    c_data, as_data = np.arange(4.0) / 4.0, np.arange(15.0).reshape(5, 3) / 15.0
    c, as_ = vec(c_data, ("i",)), vec(as_data, ("t", "j"))
    got = accy.grad(lambda c, as_: g(c, as_)[0].sum(), argnums=(0, 1))(c, as_)
    expected = jax.grad(lambda c, a: jax.lax.scan(jax_f, c, a)[0].sum(), (0, 1))(c_data, as_data)
    close(got[0], expected[0], rtol=1e-5)
    close(got[1], expected[1], rtol=1e-5)


@translates("RematTest.test_remat_of_jit_residual_forwarding")
def test_remat_of_jit_residual_forwarding():
    ones = vec(np.ones(2))

    @functools.partial(accy.checkpoint, policy=P.save_only_these_names("y"))
    def f(x):
        y = accy.checkpoint_name(ones.sin() * x / x, "y")
        x = accy.jit(lambda: x * y)()
        return accy.jit(lambda: x * y)()

    close(accy.grad(lambda x: f(x).sum())(scalar(3.0)), 2 * np.sin(1.0) ** 2, rtol=1e-5)


@translates("RematTest.test_const_in_jvp_scan", "RematTest.test_const_in_jvp_cond")
@pytest.mark.parametrize("control", ["scan", "cond"])
def test_const_in_jvp(control):
    steps = vec(np.arange(3.0))
    f = accy.custom_jvp(lambda x: x * steps)
    f.defjvp(lambda primals, tangents: (f(primals[0]), tangents[0] * steps))

    @accy.checkpoint
    def g(x):
        if control == "scan":
            y = accy.scan(lambda c, _: (f(c), None), x, length=1, axis="t")[0]
        else:
            y = accy.cond(x.sum() > 0, f, lambda x: x, x)
        return y.sum()

    close(accy.grad(g)(vec(np.arange(3.0))), np.arange(3.0))


def _dots_chain(w, x):
    for _ in range(3):
        x = x.contract(w, "i").rename("o", "i").sin()
    return x


def _jax_dots_chain(w, x):
    for _ in range(3):
        x = jnp.sin(jnp.dot(x, w, precision="highest"))
    return x


@pytest.mark.slow
@translates("RematTest.test_remat_checkpoint_dots_inside_scan")
def test_remat_checkpoint_dots_inside_scan():
    x = vec(np.ones(5))

    def f(w):
        step = accy.checkpoint(lambda x: _dots_chain(w, x), policy=P.checkpoint_dots)
        return accy.scan(lambda x, _: (step(x), None), x, length=2, axis="t")[0]

    data = np.full((5, 5), 0.1, np.float32)
    w = vec(data, ("i", "o"))
    out, vjp_fn = accy.vjp(f, w)
    program = accy.make_program(vjp_fn)(out)
    (reverse,) = [op for op in program.operations if op.kind == "scan" and op.attrs["reverse"]]
    again = counts(reverse.attrs["body"])
    # JAX's counts: two sines redone (the carry is stored, which is one sine), three cosines.
    # JAX has six dots: two per primal dot. accy's loop has three (the x cotangents): the
    # reverse scan sums a const's per-step contractions (w's cotangent) after the loop.
    assert again == {"sin": 2, "cos": 3, "dot": 3}

    def jax_f(w):
        return jax.lax.scan(lambda x, _: (_jax_dots_chain(w, x), None), jnp.ones(5), None, 2)[0]

    expected = jax.grad(lambda w: jax_f(w).sum())(data)
    close(accy.grad(lambda w: f(w).sum())(w), expected, rtol=1e-4)


@pytest.mark.slow
@translates("RematTest.test_remat_of_cond")
def test_remat_of_cond():
    def f(x):
        return accy.cond(x > 0.0, lambda c: (c.sin(), c.sin()), lambda c: (c.sin(), c.sin()), x)

    check_grads(accy.checkpoint(lambda x: f(x)[0]), jnp.sin, 3.0)

    def g(x):
        return accy.cond(x > 0.0, lambda c: c.sin().sin(), lambda c: c, x)

    jax_g = lambda x: jax.lax.cond(x > 0.0, lambda c: jnp.sin(jnp.sin(c)), lambda c: c, x)  # noqa: E731
    check_grads(accy.checkpoint(g), jax_g, 3.0)
    again = recomputed(accy.checkpoint(g), scalar(4.0))
    assert again["sin"] >= 1 and again["cos"] >= 1  # sin(x) is redone for the outer cosine


@pytest.mark.slow
@translates("RematTest.test_remat_checkpoint_dots_inside_cond")
def test_remat_checkpoint_dots_inside_cond():
    x = vec(np.ones(5))

    def f(w):
        chain = accy.checkpoint(lambda x: _dots_chain(w, x), policy=P.checkpoint_dots)
        return accy.cond(x.sum() > 0, chain, lambda x: x, x)

    data = np.full((5, 5), 0.1, np.float32)
    w = vec(data, ("i", "o"))
    # JAX's counts: two sines redone, three cosines. JAX's five dots are two per primal dot but
    # the first (x is not differentiated); accy's region has those two x cotangents, and sums
    # w's three per-step contractions after its one-step loop.
    assert recomputed(f, w) == {"sin": 2, "cos": 3, "dot": 2}

    def jax_f(w):
        return jax.lax.cond(True, lambda x: _jax_dots_chain(w, x), lambda x: x, jnp.ones(5))

    expected = jax.grad(lambda w: jax_f(w).sum())(data)
    close(accy.grad(lambda w: f(w).sum())(w), expected, rtol=1e-4)


@translates("RematTest.test_remat_checkpoint_dots_outside_cond")
def test_remat_checkpoint_dots_outside_cond():
    x = vec(np.ones(5))

    @functools.partial(accy.checkpoint, policy=P.checkpoint_dots)
    def f(w):
        return accy.cond(x.sum() > 0, lambda x: _dots_chain(w, x), lambda x: x, x)

    data = np.full((5, 5), 0.1, np.float32)
    w = vec(data, ("i", "o"))
    # JAX's counts: the branch's dots are saved, so two sines are redone, three cosines, and
    # five dots (two per primal dot but the first, whose x is not differentiated).
    assert recomputed(f, w) == {"sin": 2, "cos": 3, "dot": 5}

    def jax_f(w):
        return jax.lax.cond(True, lambda x: _jax_dots_chain(w, x), lambda x: x, jnp.ones(5))

    expected = jax.grad(lambda w: jax_f(w).sum())(data)
    close(accy.grad(lambda w: f(w).sum())(w), expected, rtol=1e-4)


@translates("RematTest.test_remat_of_while_loop")
def test_remat_of_while_loop():
    def f(x):
        return accy.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1].sin()), (0, x))[1]

    _, y_dot = accy.jvp(accy.checkpoint(f), (scalar(3.0),), (scalar(1.0),))
    close(y_dot, jax.grad(lambda x: jnp.sin(jnp.sin(jnp.sin(x))))(3.0), rtol=1e-5)
    _, f_lin = accy.linearize(accy.checkpoint(f), scalar(4.0))
    program = accy.make_program(f_lin)(scalar(1.0))
    assert count(program, "unary", "sin") and count(program, "unary", "cos")


@translates(
    "RematTest.test_concreteness_error_includes_user_code",
    "RematTest.test_concreteness_error_includes_user_code_with_static_argnums",
)
@pytest.mark.parametrize("extra", [False, True])
def test_concreteness_error_includes_user_code(extra):
    @accy.checkpoint
    def f(x, *_):
        if x > 0:
            return x
        return x.sin()

    args = (scalar(3.0), 1.0) if extra else (scalar(3.0),)
    with pytest.raises(accy.AccyError, match="truth value") as error:
        accy.jit(f)(*args)
    text = "".join(traceback.format_exception(error.value))
    assert "x > 0" in text  # the user's line, in the traceback
    assert "test_jax_api_remat.py" in str(error.value)  # and named by the message


@translates("RematTest.test_excess_precision_hell")
def test_excess_precision_hell():
    eps = float(jnp.finfo("bfloat16").eps)
    dot = accy.custom_vjp(lambda x: x.contract(x.rename("j", "k").rename("i", "j"), "j"))
    dot.defvjp(lambda x: (dot(x), None), lambda _, g: (g.rename("k", "j"),))
    foo = accy.custom_vjp(lambda x: x.convert(accy.f32))
    foo.defvjp(lambda x: (foo(x), x), lambda x, _: (x,))  # accy: the argument's type
    f = accy.jit(accy.checkpoint(lambda x: foo(dot(x)), policy=P.everything_saveable))
    data = (np.eye(2) * (1 + eps)).astype(jnp.bfloat16)
    x = accy.named(data, ("i", "j"), device="reference")
    y, vjp_fn = accy.vjp(f, x)
    (y_,) = vjp_fn(accy.named(np.ones((2, 2), np.float32), ("i", "k"), device="reference"))
    np.testing.assert_array_equal(np.asarray(y.array, np.float32), np.asarray(y_.array, np.float32))


# -- Remat3Test -----------------------------------------------------------------------------------


@translates("Remat3Test.test_remat_output_to_residual_forwarding")
def test_remat_output_to_residual_forwarding():
    body = accy.jit(lambda x: accy.checkpoint_name(x.sin(), "y"))
    f = accy.checkpoint(lambda x: body(x), policy=P.save_only_these_names("y"))
    close(accy.grad(f)(scalar(1.0)), jnp.cos(1.0))
    _, residuals = backward(f, scalar(1.0))
    assert residuals == 1  # the argument: sin(x) is not needed by the backward pass


@translates("Remat3Test.test_remat_of_jit_output_to_residual_forwarding")
def test_remat_of_jit_output_to_residual_forwarding():
    @functools.partial(accy.checkpoint, policy=P.save_only_these_names("y"))
    def f(x):
        y = accy.jit(lambda: accy.checkpoint_name(x.sin(), "y"))()
        return y, y * y

    def g(x):
        a, b = f(x)
        return a**2 + b

    expected = jax.grad(lambda x: jnp.sin(x) ** 2 + jnp.sin(x) * jnp.sin(x))(1.0)
    close(accy.grad(g)(scalar(1.0)), expected, rtol=1e-5)
    body, residuals = backward(g, scalar(1.0))
    assert count(body, "unary", "sin") == 0  # the named sin(x) is read, not redone


@translates("Remat3Test.test_remat_unhashable_static_argnums")
def test_remat_unhashable_static_argnums():
    # JAX's static_argnums/static_argnames: a dict of Python numbers passes through accy's
    # region as a Python value.
    f = accy.checkpoint(lambda x, static_dict: x * static_dict["scale"])
    x = vec(np.ones(4))
    close(accy.grad(lambda x: f(x, {"scale": 2.0}).sum())(x), np.full(4, 2.0))
    h = accy.checkpoint(lambda x, cfg: x * cfg["scale"])
    close(accy.grad(lambda x: h(x, cfg={"scale": 3.0}).sum())(x), np.full(4, 3.0))
    jax_h = jax.checkpoint(lambda x, cfg: x * cfg["scale"], static_argnames="cfg")
    assert float(jax.grad(lambda x: jax_h(x, cfg={"scale": 3.0}))(1.0)) == 3.0


@translates("Remat3Test.test_remat_eqn_dce")
def test_remat_eqn_dce():
    f = accy.checkpoint(lambda x, y: (x.sin(), y.cos()))
    program = accy.make_program(lambda x, y: f(x, y)[0])(scalar(1.0), scalar(2.0))
    (region,) = [op for op in program.operations if op.kind == "scan"]
    assert len(region.operands) == 1  # y is not an input of the pruned region
    assert count(program, "unary", "cos") == 0 and count(program, "unary", "sin") == 1
    close(accy.jit(lambda x, y: f(x, y)[0])(scalar(3.0), scalar(2.0)), jnp.sin(3.0))
    both = accy.make_program(f)(scalar(1.0), scalar(2.0))
    (region,) = [op for op in both.operations if op.kind == "scan"]
    assert len(region.operands) == 2


@translates(
    "Remat3Test.test_remat_expand_stages_call_without_inlining",
    "Remat3Test.test_remat_expand_stages_call_without_inlining_high_jaxpr",
)
@pytest.mark.parametrize("nested", [False, True])
def test_remat_expand_stages_call_without_inlining(nested):
    inner = accy.checkpoint(lambda x: x.cos().cos())

    @accy.checkpoint
    def f(x):
        for _ in range(10):
            x = x.sin()
        return inner(x) if nested else x

    program = accy.jit(f).lower(scalar(1.0)).program
    (region,) = [op for op in program.operations if op.kind == "scan"]
    body = region.attrs["body"]
    assert body.count("unary") == 10  # the ten sines, staged once inside the region
    assert body.count("scan") == (1 if nested else 0)  # the inner region, not inlined


# -- JaxprTest ------------------------------------------------------------------------------------


@translates("JaxprTest.test_scalar_literals")
def test_scalar_literals():
    program = accy.make_program(lambda x: x + 2)(np.int32(42))
    assert len(program.parameters) == 1  # the literal 2 is a constant, not an extra input
    assert len(jax.make_jaxpr(lambda x: x + 2)(42).constvars) == 0


@translates("JaxprTest.test_abstract_inputs")
def test_abstract_inputs():
    program = accy.make_program(lambda x: x + 2.0)(accy.spec(accy.f32))
    (parameter,) = program.parameter_types
    jaxpr = jax.make_jaxpr(lambda x: x + 2.0)(jax.ShapeDtypeStruct((), np.float32))
    assert parameter == accy.spec(accy.f32) and jaxpr.in_avals[0].shape == ()


@translates("JaxprTest.test_const", "JaxprTest.test_non_scalar_const")
@pytest.mark.parametrize("size", [1, 3])
def test_const(size):
    zeros = vec(np.zeros(size), ("n",))
    program = accy.make_program(lambda x: (x, 1.0, zeros))(scalar(0.0))
    assert [str(t) for t in program.output_types] == ["f32[]", "f32[]", f"f32[n={size}]"]
    assert program.outputs[0] == program.parameters[0]
    assert len(program.parameters) == 1 and program.count("constant") == 2
    jaxpr = jax.make_jaxpr(lambda x: (x, 1.0, np.zeros(size, np.float32)))(jnp.float32(0.0))
    assert len(jaxpr.eqns) == 0 and len(jaxpr.out_avals) == 3


@translates("JaxprTest.test_cond")
def test_cond():
    def f(x):
        return accy.cond(x >= 0.0, lambda xt, _: xt + x, lambda _, xf: xf - x, x + 1.0, x + 2.0)

    program = accy.make_program(f)(scalar(3.0))
    (cond,) = [op for op in program.operations if op.kind == "cond"]
    assert program.count("compare") == 1 and program.count("add") == 2
    assert cond.attrs["true_body"].count("add") == 1
    assert cond.attrs["false_body"].count("sub") == 1
    assert len(cond.operands) == 4  # the predicate, x (closed over), and both operands
    jax_f = lambda x: jax.lax.cond(x >= 0.0, lambda a, _: a + x, lambda _, b: b - x, x + 1, x + 2)  # noqa: E731
    close(accy.jit(f)(scalar(3.0)), jax_f(3.0))
    close(accy.jit(f)(scalar(-3.0)), jax_f(-3.0))


@translates("JaxprTest.test_make_jaxpr_static_argnums")
def test_make_jaxpr_static_argnums():
    program = accy.make_program(lambda x, y: x + y, static_argnames="y")(np.int32(2), 3)
    assert "value=3" in str(program)
    assert "3" in str(jax.make_jaxpr(lambda x, y: x + y, static_argnums=(1,))(2, 3))


@translates("JaxprTest.test_make_jaxpr_return_shape")
def test_make_jaxpr_return_shape():
    zeros = vec(np.zeros(2), ("n",))
    program = accy.make_program(lambda x: (x + 1, zeros))(np.int32(1))
    assert program.output_types == (accy.spec(accy.i32), accy.spec(accy.f32, n=2))
    _, shapes = jax.make_jaxpr(lambda x: (x + 1, jnp.zeros(2)), return_shape=True)(jnp.int32(1))
    assert [s.shape for s in shapes] == [(), (2,)]


@translates(
    "JaxprTest.test_elide_trivial_convert_element_types",
    "JaxprTest.test_elide_trivial_broadcasts",
    "JaxprTest.test_convert_element_type_literal_constant_folding",
)
@pytest.mark.parametrize("kind", ["convert", "broadcast", "literal"])
def test_elide_trivial_operations(kind):
    x = vec(np.arange(3.0), ("n",))
    three = scalar(3.0)
    fn = {
        "convert": lambda: x.convert(accy.f32).convert(accy.f32).convert(accy.f32),
        "broadcast": lambda: three.broadcast_to(accy.spec(accy.f32)),
        "literal": lambda: three.convert(accy.f16),
    }[kind]
    program = accy.make_program(fn)()
    assert all(op.kind in ("parameter", "constant") for op in program.operations), program
    jax_fn = {
        "convert": lambda: jax.lax.convert_element_type(
            np.arange(3.0, dtype=np.float32), "float32"
        ),
        "broadcast": lambda: jax.lax.broadcast(np.float32(3), ()),
        "literal": lambda: jax.lax.convert_element_type(3.0, "float16"),
    }[kind]
    assert len(jax.make_jaxpr(jax_fn)().eqns) == 0


# -- DCETest --------------------------------------------------------------------------------------


def _used_parameters(program):
    read = {v for op in program.operations for v in op.operands} | set(program.outputs)
    return [p in read for p in program.parameters]


def _scan_body(program):
    scans = [op for op in program.operations if op.kind == "scan"]
    return scans[0].attrs["body"] if scans else None


@translates("DCETest.test_dce_jaxpr_scan_nontrivial_fixedpoint_carry")
@pytest.mark.parametrize(
    "used, inputs, adds",
    [
        ((0, 1, 2), [True, True, True, False], 2),
        ((2,), [True, True, True, False], 2),
        ((0, 1), [True, True, False, False], 1),
        ((3,), [True, True, True, True], 3),
    ],
)
def test_dce_jaxpr_scan_nontrivial_fixedpoint_carry(used, inputs, adds):
    def body(c, _):
        return [c[0]] + [c1 + c2 for c1, c2 in zip(c[:-1], c[1:], strict=True)], None

    def f(*lst):
        out, _ = accy.scan(body, list(lst), length=len(lst), axis="t")
        return [out[i] for i in used]

    def jax_f(*lst):
        out, _ = jax.lax.scan(body, list(lst), None, length=len(lst))
        return [out[i] for i in used]

    args = [scalar(v) for v in (1.0, 2.0, 3.0, 4.0)]
    program = accy.make_program(f)(*args)
    assert _used_parameters(program) == inputs
    assert _scan_body(program).count("add") == adds
    for got, expected in zip(accy.jit(f)(*args), jax_f(1.0, 2.0, 3.0, 4.0), strict=True):
        close(got, expected)
    grads = accy.grad(lambda *a: sum(f(*a)), argnums=tuple(range(4)))(*args)
    expected = jax.grad(lambda *a: sum(jax_f(*a)), argnums=tuple(range(4)))(1.0, 2.0, 3.0, 4.0)
    for got, e in zip(grads, expected, strict=True):
        close(got, e)


@translates("DCETest.test_dce_jaxpr_scan_nontrivial_fixedpoint_carry_2")
@pytest.mark.parametrize(
    "used, inputs, muls",
    [((8,), [1, 2, 3, 5, 8], 4), ((9,), [9], 0), ((9, 7, 6), [6, 7, 9], 0), ((3,), [1, 2, 3], 2)],
)
def test_dce_jaxpr_scan_nontrivial_fixedpoint_carry_2(used, inputs, muls):
    hidden = [1, 2, 3, 5, 8]
    three = vec([3.0, 1.0, 4.0], ("k",))

    def body(c, _):
        _ = three.sin()  # unused work (JAX: jnp.sin of a constant), pruned
        sub = [c[i] for i in hidden]
        sub = [sub[0]] + [c1 * c2 for c1, c2 in zip(sub[:-1], sub[1:], strict=True)]
        new = list(c)
        for i, elt in zip(hidden, sub, strict=True):
            new[i] = elt
        return new, None

    xs = vec(np.arange(10.0), ("t",))

    def f(*lst):
        out, _ = accy.scan(body, list(lst), xs, axis="t")
        return [out[i] for i in used]

    args = [scalar(v) for v in range(1, 11)]
    program = accy.make_program(f)(*args)
    assert _used_parameters(program)[:10] == [i in inputs for i in range(10)]
    body_program = _scan_body(program)
    assert (body_program.count("mul") if body_program else 0) == muls
    out, _ = jax.lax.scan(body, [float(v) for v in range(1, 11)], np.arange(10.0))
    for got, i in zip(accy.jit(f)(*args), used, strict=True):
        close(got, out[i], rtol=1e-5)


@translates("DCETest.test_dce_jaxpr_scan_nontrivial_fixedpoint_extensive_output")
@pytest.mark.parametrize("use_ys", [True, False])
def test_dce_jaxpr_scan_nontrivial_fixedpoint_extensive_output(use_ys):
    def f(*lst):
        _, ys = accy.scan(lambda c, _: ([c[-1], *c[:-1]], c[-1]), list(lst), length=4, axis="t")
        return ys if use_ys else lst[0] * 0.0

    program = accy.make_program(f)(*[scalar(v) for v in (1.0, 2.0, 3.0, 4.0)])
    assert program.count("scan") == (1 if use_ys else 0)
    if use_ys:
        assert _used_parameters(program) == [True] * 4
        _, ys = jax.lax.scan(lambda c, _: ([c[-1], *c[:-1]], c[-1]), [1.0, 2.0, 3.0, 4.0], None, 4)
        close(accy.jit(f)(*[scalar(v) for v in (1.0, 2.0, 3.0, 4.0)]), ys)


@translates("DCETest.test_dce_jaxpr_scan_extensive_input")
@pytest.mark.parametrize("used", [(0,), (1,), ()])
def test_dce_jaxpr_scan_extensive_input(used):
    def cumprod(xs):
        c, ys = accy.scan(lambda c, x: (c * x, c), accy.named(np.float32(1.0), ()), xs, axis="t")
        return [(c, ys)[i] for i in used]

    xs = vec(np.arange(1.0, 5.0), ("t",))
    program = accy.make_program(cumprod)(xs)
    assert program.count("scan") == (1 if used else 0)
    assert _used_parameters(program) == [bool(used)]
    c, ys = jax.lax.scan(lambda c, x: (c * x, c), 1.0, jnp.arange(1.0, 5.0))
    for got, i in zip(accy.jit(cumprod)(xs), used, strict=True):
        close(got, (c, ys)[i])


@translates("DCETest.test_dce_jaxpr_scan_overpruning")
def test_dce_jaxpr_scan_overpruning():
    @accy.checkpoint
    def scanned_f(c, x):
        out = (c * x).tanh()
        return out, out

    def f(xs):
        return accy.scan(scanned_f, accy.named(np.float32(1.0), ()), xs, axis="t")

    xs = vec(np.arange(10.0), ("t",))
    _, f_lin = accy.linearize(f, xs)
    got = f_lin(xs)
    _, jax_lin = jax.linearize(
        lambda xs: jax.lax.scan(jax.checkpoint(lambda c, x: (jnp.tanh(c * x),) * 2), 1.0, xs),
        jnp.arange(10.0),
    )
    for g, e in zip(got, jax_lin(jnp.arange(10.0)), strict=True):
        close(g, e, rtol=1e-5)


@translates("DCETest.test_dce_jaxpr_scan_const_in_jvp")
def test_dce_jaxpr_scan_const_in_jvp():
    steps = vec(np.arange(3.0))
    f = accy.custom_jvp(lambda x: x * steps)
    f.defjvp(lambda primals, tangents: (f(primals[0]), tangents[0] * steps))

    def g(x):
        return accy.scan(lambda c, _: (f(c), None), x, length=1, axis="t")[0]

    x = vec(np.arange(3.0))

    def selecting(outputs):
        def h(x, xdot):
            both = accy.jvp(g, (x,), (xdot,))
            return [both[i] for i in outputs]

        return h

    for outputs in [(0, 1), (0,)]:
        h = selecting(outputs)
        program = accy.make_program(h)(x, x)
        assert _used_parameters(program) == [True, 1 in outputs]
        close(accy.jit(h)(x, x)[0], np.arange(3.0) ** 2)


@translates("DCETest.test_dce_jaxpr_scan_results")
def test_dce_jaxpr_scan_results():
    three = vec(np.arange(3.0), ("k",))

    def f(cs, xs):
        def body(c, x):
            return (c[0], c[0] + c[1], three), x

        cs, xs = accy.scan(body, cs, xs, axis="t")
        return cs[::2], xs[::2]

    cs = (scalar(1.0), scalar(2.0), three)
    xs = (vec(np.arange(3.0), ("t",)), vec(np.arange(3.0) + 5, ("t",)))
    got = accy.jit(f)(cs, xs)
    expected = jax.lax.scan(
        lambda c, x: ((c[0], c[0] + c[1], jnp.arange(3.0)), x),
        (1.0, 2.0, jnp.arange(3.0)),
        (jnp.arange(3.0), jnp.arange(3.0) + 5),
    )
    expected = (expected[0][::2], expected[1][::2])
    for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        close(g, e)


def _sin_branches(swap, one_sided):
    def true_fn(x1, x2):
        return (x1.sin(), x1.sin()) if one_sided else (x1.sin(), x2.sin())

    def false_fn(x1, x2):
        if one_sided:
            return x2.sin(), x2.sin()
        return (x2.sin(), x1.sin()) if swap else (x1.sin(), x2.sin())

    return true_fn, false_fn


@translates("DCETest.test_dce_jaxpr_cond_trivial")
@pytest.mark.parametrize(
    "swap, one_sided, used, inputs, sines",
    [
        (False, False, (0, 1), [True, True], 4),  # nothing to prune
        (False, False, (), [False, False], 0),  # everything pruned
    ],
)
def test_dce_jaxpr_cond(swap, one_sided, used, inputs, sines):
    true_fn, false_fn = _sin_branches(swap, one_sided)

    def f(x1, x2):
        out = accy.cond(x1 > 0, true_fn, false_fn, x1, x2)
        return [out[i] for i in used]

    x = scalar(1.0)
    program = accy.make_program(f)(x, x)
    assert _used_parameters(program) == inputs
    assert count(program, "unary", "sin") == sines
    expected = jax.lax.cond(
        True, lambda a, b: (jnp.sin(a), jnp.sin(b)), lambda a, b: (a, b), 1.0, 1.0
    )
    for got, i in zip(accy.jit(f)(x, x), used, strict=True):
        close(got, expected[i])


NONTRIVIAL_BRANCHES = {
    "x2 pruned": (lambda a, b: (a.sin(), b.sin()), lambda a, b: (a.sin(), a.sin())),
    "swapped": (lambda a, b: (a.sin(), b.sin()), lambda a, b: (b.sin(), a.sin())),
    "one each": (lambda a, b: (a.sin(), a.sin()), lambda a, b: (b.sin(), b.sin())),
}


@translates("DCETest.test_dce_jaxpr_cond_nontrivial")
@pytest.mark.parametrize(
    "branches, used, inputs, sines",
    [
        ("x2 pruned", (0,), [True, False], 2),  # one sine trimmed on each side, x2 unread
        ("swapped", (0,), [True, True], 2),  # trimmed, but x2 is still read
        ("one each", (0, 1), [True, True], 4),  # nothing to prune
        ("one each", (0,), [True, True], 2),  # work pruned, inputs kept
    ],
)
def test_dce_jaxpr_cond_nontrivial(branches, used, inputs, sines):
    true_fn, false_fn = NONTRIVIAL_BRANCHES[branches]

    def f(x1, x2):
        out = accy.cond(x1 > 0, true_fn, false_fn, x1, x2)
        return [out[i] for i in used]

    x1, x2 = scalar(1.0), scalar(-2.0)
    program = accy.make_program(f)(x1, x2)
    assert _used_parameters(program) == inputs
    assert count(program, "unary", "sin") == sines
    for flag in (1.0, -1.0):
        x1 = scalar(flag)
        got = accy.jit(f)(x1, x2)
        taken = true_fn if flag > 0 else false_fn
        expected = jax.jit(lambda a, b, t=taken: [_jax_of(v) for v in t(_Jax(a), _Jax(b))])(
            flag, -2.0
        )
        for g, i in zip(got, used, strict=True):
            close(g, expected[i])


class _Jax:
    """A JAX value with `.sin()`, so that one branch serves accy and JAX."""

    def __init__(self, value):
        self.value = value

    def sin(self):
        return _Jax(jnp.sin(self.value))


def _jax_of(wrapped):
    return wrapped.value


# -- NamedCallTest, and the one-case classes -----------------------------------------------------


@translates("NamedCallTest.test_integer_overflow")
@pytest.mark.parametrize("func", ["identity_trivial", "identity", "closure_trivial", "closure"])
def test_integer_overflow(func):
    f = accy.jit(
        {
            "identity_trivial": lambda x: x,
            "identity": lambda x: x + 0,
            "closure_trivial": lambda x: accy.jit(lambda: x)(),
            "closure": lambda x: accy.jit(lambda: x + 0)(),
        }[func],
        device="reference",
    )
    info = np.iinfo(np.int32)  # a Python int is traced as i32 (JAX's default int without x64)
    for _ in range(2):  # before and after the cache has entries
        for outside in (int(info.max) + 1, int(info.min) - 1):
            with pytest.raises(accy.AccyError, match="does not hold exactly"):
                f(outside)
            with pytest.raises(OverflowError):
                jax.jit(lambda x: x)(outside)
        for inside in (int(info.max), int(info.min)):
            assert f(inside).dtype == accy.i32 and f(inside).item() == inside


@translates("CleanupTest.test_call_wrapped_second_phase_cleanup")
def test_call_wrapped_second_phase_cleanup():
    from accy.frontend.tracing import innermost_trace

    with pytest.raises(accy.AccyError):
        accy.vmap(lambda x: x, "i", out_axes=None)(vec(np.arange(3.0)))
    assert innermost_trace() is None  # no trace is left open after the error


@translates("GarbageCollectionTest.test_xla_gc_callback")
def test_xla_gc_callback():
    import gc
    import weakref

    data = np.arange(10, dtype=np.int32)
    x = accy.named(data, ("n",))
    ref = weakref.ref(data)
    del data, x
    gc.collect()
    assert ref() is None


# -- EvalJaxprPrimitiveTest: a traced Program called inside transformed functions -----------------


def _call_program(f, *args):
    """`f` traced into a Program, then called on `args` (JAX's eval_jaxpr_p.bind)."""
    program = accy.make_program(f)(*args)
    outputs = args[0].builder.call(program, list(args)) if _traced(args) else None
    if outputs is None:
        return accy.jit(lambda *a: a[0].builder.call(program, list(a)))(*args)
    return outputs


def _traced(args):
    return isinstance(args[0], accy.core.Value)


@translates("EvalJaxprPrimitiveTest.test_eval_jaxpr_impl")
def test_eval_jaxpr_impl():
    x, y = scalar(3.0), scalar(4.0)
    close(_call_program(lambda x, y: x * y + 1.0, x, y), 3.0 * 4.0 + 1.0)


@translates(
    "EvalJaxprPrimitiveTest.test_eval_jaxpr_jvp", "EvalJaxprPrimitiveTest.test_eval_jaxpr_grad"
)
def test_eval_jaxpr_jvp_and_grad():
    x = scalar(2.0)
    cube = accy.make_program(lambda x: x**3)(x)

    def g(x):
        return x.builder.call(cube, [x])

    primal, tangent = accy.jvp(g, (x,), (scalar(1.0),))
    expected = jax.jvp(lambda x: x**3, (2.0,), (1.0,))
    close(primal, expected[0])
    close(tangent, expected[1])
    close(accy.grad(g)(x), jax.grad(lambda x: x**3)(2.0))


@translates(
    "EvalJaxprPrimitiveTest.test_eval_jaxpr_vmap", "EvalJaxprPrimitiveTest.test_eval_jaxpr_jit"
)
def test_eval_jaxpr_vmap_and_jit():
    square = accy.make_program(lambda x: x**2 + 1.0)(scalar(1.0))
    xs = vec([1.0, 2.0, 3.0])
    close(accy.vmap(lambda x: x.builder.call(square, [x]), "i")(xs), np.array([2.0, 5.0, 10.0]))
    sine = accy.make_program(lambda x: x.sin())(scalar(1.0))
    close(accy.jit(lambda x: x.builder.call(sine, [x]))(scalar(1.0)), jnp.sin(1.0))


@translates("EvalJaxprPrimitiveTest.test_eval_jaxpr_linearize_of_while")
def test_eval_jaxpr_linearize_of_while():
    step = accy.make_program(lambda u: u.sin() * 2.0)(scalar(1.0))

    def f(x):
        def body(c):
            i, v = c
            return i + 1, v.builder.call(step, [v])

        return accy.while_loop(lambda c: c[0] < 3, body, (0, x))[1]

    ref = lambda v: jnp.sin(jnp.sin(jnp.sin(v) * 2.0) * 2.0) * 2.0  # noqa: E731
    y, lin = accy.linearize(f, scalar(1.0))
    y_ref, lin_ref = jax.linearize(ref, 1.0)
    close(y, y_ref, rtol=1e-5)
    close(lin(scalar(1.0)), lin_ref(1.0), rtol=1e-5)


# -- InputSavedVJPTest -----------------------------------------------------------------------------


@translates("InputSavedVJPTest.test_doesnt_leak_symbolic_zeros")
def test_doesnt_leak_symbolic_zeros():
    _, vjp_fn = accy.vjp(lambda x: scalar(1.0), scalar(3.14))
    (ans,) = vjp_fn(scalar(1.0))
    assert isinstance(ans, accy.NamedArray) and ans.item() == 0.0
    (jax_ans,) = jax.vjp(lambda x: 1.0, 3.14)[1](1.0)
    assert isinstance(jax_ans, jax.Array) and float(jax_ans) == 0.0


# -- accy's own: the policies' errors and the documented example ----------------------------------


def test_policy_errors_name_what_is_wrong():
    with pytest.raises(accy.AccyError, match="names are strings .* got 3"):
        P.save_only_these_names("h", 3)
    with pytest.raises(accy.AccyError, match="the name is a string, got 3"):
        accy.checkpoint_name(scalar(1.0), 3)
    with pytest.raises(accy.AccyError, match="policy=3 is not a policy"):
        accy.checkpoint(lambda x: x, policy=3)


def test_a_policy_compiles_on_the_cpu_backend():
    # The marks a policy leaves on the region's operations reach the generated C unharmed.
    f = accy.checkpoint(
        lambda x: accy.checkpoint_name(x.sin(), "s").sin() * x.contract(x, "i"),
        policy=P.save_from_both_policies(P.save_only_these_names("s"), P.dots_saveable),
    )
    x = accy.named(np.linspace(0.1, 1.0, 4, dtype=np.float32), ("i",))
    got = accy.jit(accy.grad(lambda x: f(x).sum()))(x)
    expected = jax.grad(lambda x: (jnp.sin(jnp.sin(x)) * jnp.dot(x, x)).sum())(x.array)
    assert got.device is accy.device("cpu")
    close(got, expected, rtol=1e-5)


def test_the_policies_example_of_docs_frontend_runs(capsys):
    doc = Path(__file__).parents[2] / "docs" / "frontend.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)
    (block,) = [b for b in blocks if "checkpoint_name" in b]
    exec(compile(block, "docs/frontend.md", "exec"), {})
    assert capsys.readouterr().out.strip() == "{'i': 3, 'o': 2}"


PRIMITIVE = (
    "defines a JAX primitive (core.Primitive, def_impl) and counts its evaluations: accy's "
    "operation kinds are a closed set"
)
CSE = (
    "XLA's CSE prevention (prevent_cse, optimization_barrier in HLO text): accy's checkpoint "
    "has no CSE barrier to ask for"
)
JVP_POLICY = (
    "a policy over operations that JVP rules add (cos of sin's derivative): accy's policies "
    "see the region's own operations only"
)
CUSTOM_REMAT = (
    "JAX's custom_remat (user fwd/rematerialize/bwd rules under remat3): accy lacks custom_remat"
)
OFFLOAD = (
    "offloading residuals to host memory spaces (save_and_offload_*): accy has one memory "
    "space per device"
)

NOT_APPLICABLE = {
    "RematTest.test_remat_eval_counter": PRIMITIVE,
    "RematTest.test_remat_recursive_checkpoint_recompute_counts": PRIMITIVE,
    "Remat3Test.test_remat_eval_counter": PRIMITIVE,
    "RematTest.test_no_cse_widget_on_primals": CSE,
    "RematTest.test_no_cse_widget_with_prevent_cse_false": CSE,
    "RematTest.test_remat_partial_cse_prevention": CSE,
    "RematTest.test_remat_partial_cse_prevention_all_false": CSE,
    "RematTest.test_remat_partial_cse_prevention_pytree": CSE,
    "Remat3Test.test_remat_partial_cse_prevention_pytree_prefix_forms": CSE,
    "Remat3Test.test_remat_computed_residuals_cse_prevention": CSE,
    "Remat3Test.test_remat_cse_prevention_no_cotangents_flag": CSE,
    "RematTest.test_remat_custom_policy_save_cos": JVP_POLICY,
    "RematTest.test_remat_of_scan_policy": JVP_POLICY,
    "RematTest.test_remat_of_scan_funky_custom_jvp": JVP_POLICY,
    "RematTest.test_remat_of_scan_funky_custom_jvp2": JVP_POLICY,
    "RematTest.test_remat_of_cond_policy": JVP_POLICY,
    "RematTest.test_remat_of_cond_funky_custom_jvp": JVP_POLICY,
    "RematTest.test_remat_of_cond_funky_custom_jvp2": JVP_POLICY,
    "RematTest.test_remat_of_while_loop_policy": JVP_POLICY,
    "Remat3Test.test_remat_custom_policy_save_cos": CUSTOM_REMAT,
    "Remat3Test.test_remat_of_scan_funky_custom_jvp": CUSTOM_REMAT,
    "Remat3Test.test_remat_of_cond_funky_custom_jvp": CUSTOM_REMAT,
    "Remat3Test.test_remat_of_cond_policy": CUSTOM_REMAT,
    "Remat3Test.test_remat_of_scan_policy": CUSTOM_REMAT,
    "Remat3Test.test_remat_of_cond_funky_custom_jvp2": "an empty test in JAX (raises SkipTest)",
    "Remat3Test.test_remat_of_scan_funky_custom_jvp2": "an empty test in JAX (raises SkipTest)",
    "Remat3Test.test_remat_custom_policy_save_anything_new_remat": "an empty test in JAX (pass)",
    "Remat3Test.test_remat_residual_logging": "an empty test in JAX (pass)",
    "RematTest.test_remat_offload_names_jaxpr": OFFLOAD,
    "RematTest.test_remat_offload_names_of_scan_jaxpr": OFFLOAD,
    "RematTest.test_remat_offload_dot_with_no_batch_dims_jaxpr": OFFLOAD,
    "RematTest.test_remat_custom_jvp_linear_policy": (
        "accy lacks transposing a custom_jvp function that its own JVP rule applies to the "
        "tangents (CustomCallRequiresVjpContract in reverse mode)"
    ),
    "RematTest.test_saved_residuals_utility": (
        "accy lacks a saved_residuals report (each residual with its source); the tests here "
        "count the residuals of the backward scan instead"
    ),
    "RematTest.test_saved_residuals_utility_jit": (
        "accy lacks a saved_residuals report (each residual with its source)"
    ),
    "RematTest.test_remat_checkpoint_dots_outside_scan": (
        "accy lacks policies that reach into a scan nested in the region: its dots are recomputed"
    ),
    "RematTest.test_remat_residual_logging": (
        "accy lacks logging what a checkpointed region saves"
    ),
    "RematTest.test_name_stack_annotation": (
        "jax.named_scope name stacks in the jaxpr's pretty-printer: accy has no name stacks"
    ),
    "RematTest.test_remat_grad_accum_refs": "jax.ref mutable array references: accy has none",
    "Remat3Test.test_custom_vjp_with_checkpoint_name_in_fwd": (
        "accy lacks saving a custom_vjp's residuals: its fwd is rerun in the backward pass"
    ),
    "Remat3Test.test_custom_vjp_with_checkpoint_name_in_fwd_static_argnums": (
        "accy lacks saving a custom_vjp's residuals: its fwd is rerun in the backward pass"
    ),
    "JaxprTest.test_make_jaxpr_axis_env": (
        "axis_env names a pmap axis for psum outside any mapped context: accy has no such axis "
        "environment"
    ),
    "JaxprTest.test_weak_type_jit_invariance": "weak types: accy never promotes dtypes",
    "JaxprTest.test_eqn_repr_with_no_lhs": (
        "the repr of a jaxpr equation without outputs: accy records debug_print as an extra "
        "program output, not an operation"
    ),
    **{
        f"NamedCallTest.{name}": "jax.named_call (a named sub-computation in HLO): accy lacks it"
        for name in (
            "test_non_jaxtype_arg",
            "test_jax_transforms",
            "test_static_argnums",
            "test_partial_eval",
        )
    },
    "BackendsTest.test_no_backend_warning_on_cpu_if_platform_specified": (
        "JAX's platform-selection warning at import: accy has no platform plugins to warn about"
    ),
    "EnvironmentInfoTest.test_print_environment_info": (
        "jax.print_environment_info (jax and jaxlib versions): accy lacks it"
    ),
    "AutodidaxTest.test_autodidax_smoketest": "runs JAX's docs/autodidax.py tutorial",
    "OverrideLoweringTest.test_sharding_constraint_as_noop": (
        "overriding MLIR lowering rules of sharding constraints: accy has no MLIR lowering"
    ),
    **{
        f"InputSavedVJPTest.{name}": (
            "vjp's args_res / saveable_args (replacing saved residuals after the forward pass): "
            "accy lacks them"
        )
        for name in (
            "test_basic",
            "test_basic_pass_through_jit",
            "test_basic_unused_vjp3",
            "test_basic_opaque_vjp3",
            "test_basic_opaque_cond_vjp3",
            "test_basic_pytree_error",
            "test_fsdp_error",
            "test_fsdp_vjp3",
            "test_saveable_args_basic",
            "test_saveable_args_broadcasts",
            "test_saveable_args_loose_prefix",
            "test_saveable_args_unused_arg_stays_not_needed",
            "test_saveable_args_pass_through_jit",
            "test_saveable_args_structure_errors",
        )
    },
    "TracebackTest.test_traceback_test": "a self-test of the depth helper, no JAX API",
    **{
        f"TracebackTest.{name}": "pins the Python stack depth of JAX's own implementation"
        for name in (
            "test_scan_traceback",
            "test_cond_traceback",
            "test_jit_traceback",
            "test_grad_traceback",
            "test_vmap_traceback",
            "test_custom_vjp_traceback",
        )
    },
    "Remat3Test.test_remat_dce_input_to_output_forwarding": (
        "ad_checkpoint.dce on a traced jaxpr (JAX internals); Remat3Test.test_remat_eqn_dce "
        "checks accy's pruning of a region"
    ),
}

test_not_applicable = not_applicable_tests(NOT_APPLICABLE)
