"""JAX's tests/api_test.py, classes RematTest, Remat3Test, InputSavedVJPTest, JaxprTest,
DCETest, NamedCallTest, EvalJaxprPrimitiveTest and the one-case classes, case by case on accy's
`checkpoint` (its policies and `checkpoint_name`), `make_program`, `scan`, `cond` and the
gradient transforms: the peer's programs with named axes, JAX's own results computed in the same
run. What a policy saves is read off the backward pass: the operations the reverse scan of the
checkpointed region recomputes, and the residuals it reads."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

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


def recomputed(f, *args):
    body, _ = backward(f, *args)
    return {op: count(body, "unary", op) for op in ("sin", "cos")} | {
        "dot": count(body, "dot_general")
    }


# -- RematTest -----------------------------------------------------------------------------------


@translates("RematTest.test_remat_grad_python_control_flow_static_argnums")
def test_remat_grad_python_control_flow_static_argnums():
    # JAX's static_argnums: accy passes a Python value through the region unchanged.
    @accy.checkpoint
    def g(x, positive):
        return (x.sin(), 3.0) if positive else (x.cos(), 4.0)

    def f(x):
        return g(x, float(x.item()) > 0 if not isinstance(x, accy.core.Value) else True)[0]

    close(f(scalar(2.0)), np.sin(2.0))
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


NOT_APPLICABLE = {}

test_not_applicable = not_applicable_tests(NOT_APPLICABLE)
