"""custom_jvp / custom_vjp beyond JAX's own cases: several outputs, closures, every device."""

import jax
import jax.numpy as jnp
import numpy as np

import accy

W = np.linspace(-1.0, 1.0, 100).astype(np.float32)  # above the 64 elements of a constant


def test_custom_vjp_with_several_outputs_and_a_closure_on_cpu():
    w = accy.named(W, "n")

    @accy.custom_vjp
    def two(x):
        return {"dot": (x * w).sum(), "twice": x * 2.0}

    def bwd(x, ct):  # a deliberately scaled rule: 3x the true pullback
        return ((ct["dot"] * w + ct["twice"] * 2.0) * 3.0,)

    two.defvjp(lambda x: (two(x), x), bwd)

    def loss(x):
        out = two(x)
        return out["dot"] + (out["twice"] * out["twice"]).sum()

    x = accy.named(np.ones(100, np.float32), "n")
    g = accy.jit(accy.grad(loss))(x)  # native code: the records' fallbacks are inlined
    expected = 3.0 * (W + 2.0 * 2.0 * (2.0 * np.ones(100)))
    np.testing.assert_allclose(g.array, expected, rtol=1e-5)
    value = accy.jit(loss)(x).item()
    np.testing.assert_allclose(value, W.sum() + 400.0, rtol=1e-5)


def test_custom_jvp_closing_over_an_enclosing_trace():
    def outer(scale, x):
        @accy.custom_jvp
        def f(y):
            return (y * scale).sin()

        f.defjvp(lambda p, t: (f(p[0]), t[0] * 10.0))
        return f(x)

    got = accy.grad(outer, argnums=1)(accy.named(np.float32(2.0), ()), 0.5)
    assert got.item() == 10.0
    value = accy.jit(outer)(accy.named(np.float32(2.0), ()), accy.named(np.float32(0.5), ()))
    np.testing.assert_allclose(value.item(), np.sin(1.0), rtol=1e-6)


def test_a_rule_closing_over_a_traced_value_matches_jax():
    def outer(custom_jvp, sin, exp):
        def f_of(scale, x):
            @custom_jvp
            def f(y):
                return sin(y)

            f.defjvp(lambda p, t: (f(p[0]), t[0] * exp(scale)))
            return f(x)

        return f_of

    ours = outer(accy.custom_jvp, lambda x: x.sin(), lambda x: x.exp())
    theirs = outer(jax.custom_jvp, jnp.sin, jnp.exp)
    scale, x = accy.named(np.float32(2.0), ()), accy.named(np.float32(0.5), ())
    # scale is traced (by jit) but not differentiated: JAX refuses a rule closing over a
    # value being differentiated, and accy would give it no cotangent.
    got = accy.jit(lambda s, x: accy.grad(ours, argnums=1)(s, x))(scale, x)
    expected = jax.jit(lambda s, x: jax.grad(theirs, argnums=1)(s, x))(2.0, 0.5)
    np.testing.assert_allclose(got.item(), expected, rtol=1e-6)


def test_custom_jvp_against_jax_on_a_stable_softplus():
    def make(custom_jvp, exp, log1p, logistic):
        @custom_jvp
        def softplus(x):
            return log1p(exp(x))

        softplus.defjvp(lambda p, t: (softplus(p[0]), t[0] * logistic(p[0])))
        return softplus

    ours = make(accy.custom_jvp, lambda x: x.exp(), lambda x: x.log1p(), lambda x: x.logistic())
    theirs = make(jax.custom_jvp, jnp.exp, jnp.log1p, jax.nn.sigmoid)
    x = np.array([-3.0, 0.0, 100.0], np.float32)
    got = accy.grad(lambda x: ours(x).sum())(accy.named(x, "n", device="reference"))
    np.testing.assert_allclose(got.array, jax.grad(lambda x: theirs(x).sum())(x), rtol=1e-6)
    assert np.isfinite(got.array).all()


def test_custom_rules_inside_scan_bodies_compile_on_the_cpu():
    # The CPU backend has no kernel for a custom function's call: the call is inlined, in the
    # scan body that vmap (one call per example) and accy.scan put it in too.
    @accy.custom_jvp
    def f(x):
        return x.sin()

    f.defjvp(lambda p, t: (f(p[0]), 2.0 * t[0]))
    xs = accy.named(np.arange(3.0, dtype=np.float32), "n")  # on the CPU
    looped = accy.jit(lambda x: accy.scan(lambda c, _: (f(c), None), x, axis="s", length=2)[0])
    np.testing.assert_allclose(accy.vmap(f, "n")(xs).array, np.sin(np.arange(3.0)), rtol=1e-6)
    np.testing.assert_allclose(looped(xs).array, np.sin(np.sin(np.arange(3.0))), rtol=1e-6)
    grads = accy.grad(lambda x: accy.vmap(f, "n")(x).sum())(xs)
    np.testing.assert_allclose(grads.array, np.full(3, 2.0), rtol=1e-6)
