"""checkpoint, stop_gradient and linear_transpose on front-end functions, make_program and
jit(f).lower, against JAX."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import accy

RNG = np.random.default_rng(1)
W = RNG.normal(size=(3, 4)).astype(np.float32)
X = RNG.normal(size=3).astype(np.float32)


def on(value, axes):
    return accy.named(value, axes, device="reference")


def test_checkpoint_of_a_tree_function_with_closures_matches_jax():
    w = on(W, ("i", "o"))  # closed over: 12 elements
    layer = accy.checkpoint(lambda x, scale: {"y": (x.contract(w, "i") * scale["s"]).sin()})

    def loss(x, s):
        return layer(x, {"s": s})["y"].sum()

    g = accy.jit(accy.grad(loss, argnums=(0, 1)))(on(X, ("i",)), on(np.float32(0.5), ()))
    expected = jax.grad(
        lambda x, s: jax.checkpoint(lambda x, s: jnp.sin((x @ W) * s))(x, s).sum(), (0, 1)
    )(X, np.float32(0.5))
    np.testing.assert_allclose(g[0].array, expected[0], rtol=1e-5)
    np.testing.assert_allclose(g[1].item(), expected[1], rtol=1e-5)
    program = accy.make_program(accy.grad(loss))(on(X, ("i",)), on(np.float32(0.5), ()))
    assert program.count("scan") >= 1  # the region, recomputed in the backward pass
    eager = layer(on(X, ("i",)), {"s": 2.0})["y"]  # outside a trace it just runs
    np.testing.assert_allclose(eager.array, np.sin(X @ W * 2.0), rtol=1e-5)


def test_checkpoint_policies_and_the_builder_form():
    x = on(X, ("i",))
    keep = accy.checkpoint(lambda x: x.sin(), policy=accy.checkpoint_policies.everything_saveable)
    assert accy.make_program(lambda x: keep(x))(x).count("scan") == 0
    with pytest.raises(accy.AccyError, match="policy=.*nothing_saveable"):
        accy.checkpoint(lambda x: x, policy="dots_saveable")
    layer = accy.checkpoint(lambda b, a: (a[0] * a[0]).sin())
    p = accy.trace.define("loss", [accy.spec(accy.f32, lane=2)], lambda b, a: layer(b, a).sum())
    (g,) = accy.reference.run(accy.grad(p), [[0.5, 1.0]])
    np.testing.assert_allclose(g, 2 * np.array([0.5, 1]) * np.cos([0.25, 1.0]), rtol=1e-6)


def test_stop_gradient_matches_jax():
    def f(x, stop, where, exp):
        return (x * stop(x) + where(x > 0, stop(exp(x)), x)).sum()

    got = accy.grad(f)(on(X, ("i",)), accy.stop_gradient, accy.where, lambda x: x.exp())
    expected = jax.grad(f)(X, jax.lax.stop_gradient, jnp.where, jnp.exp)
    np.testing.assert_allclose(got.array, expected, rtol=1e-6)
    tree = accy.stop_gradient({"a": on(X, ("i",)), "n": 3})
    assert tree["n"] == 3 and tree["a"].array.tolist() == X.tolist()


def test_linear_transpose_matches_jax():
    w = on(W, ("i", "o"))

    def f(x, y):
        return {"p": x.contract(w, "i") * 2.0, "q": (x - y).sum()}

    f_t = accy.linear_transpose(f, on(X, ("i",)), on(X, ("i",)))
    ct = {"p": on(RNG.normal(size=4).astype(np.float32), ("o",)), "q": on(np.float32(3.0), ())}
    got = f_t(ct)
    expected = jax.linear_transpose(lambda x, y: {"p": (x @ W) * 2.0, "q": (x - y).sum()}, X, X)(
        {"p": np.asarray(ct["p"].array), "q": np.float32(3.0)}
    )
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g.array, e, rtol=1e-5)


def test_linear_transpose_misuse():
    x = on(X, ("i",))
    with pytest.raises(accy.AccyError, match="not linear"):
        accy.linear_transpose(lambda x: x * x, x)(x)
    with pytest.raises(accy.TransformError, match="structure of the function's output"):
        accy.linear_transpose(lambda x: x * 2.0, x)((x, x))
    with pytest.raises(accy.TransformError, match="floating-point"):
        accy.linear_transpose(lambda n: n, 3)


def test_make_program_and_lower():
    x = accy.named(X, ("i",))
    program = accy.make_program(lambda x, n: (x * float(n)).sum(), static_argnames="n")(x, n=3)
    assert program.count("mul") == 1 and [str(t) for t in program.output_types] == ["f32[]"]
    lowered = accy.jit(lambda x: (x * 2.0).exp().sum()).lower(x)
    assert lowered.program.count("reduce") == 1 and lowered.device is accy.device("cpu")
    assert "accy_run" in lowered.source() and "reduce" in lowered.plan()
    assert np.allclose(lowered.compile()(X)[0], np.exp(X * 2).sum(), rtol=1e-5)
