"""jacfwd, jacrev and hessian over trees, against JAX's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import accy

RNG = np.random.default_rng(0)
W = RNG.normal(size=(3, 2)).astype(np.float32)
X = RNG.normal(size=3).astype(np.float32)
B = RNG.normal(size=2).astype(np.float32)


def on(value, axes):
    return accy.named(value, axes, device="reference")


def model(params, x, out="out"):  # h[out] = tanh(sum_i x[i] w[i, o] + b[o]); and a scalar
    hidden = (x.contract(params["w"], "i") + params["b"]).tanh().rename("o", out)
    return {"h": hidden, "s": (hidden * hidden).sum()}


def model_jax(params, x):
    hidden = jnp.tanh(x @ params["w"] + params["b"])
    return {"h": hidden, "s": (hidden * hidden).sum()}


PARAMS = {"w": on(W, ("i", "o")), "b": on(B, ("o",))}
PARAMS_JAX = {"w": W, "b": B}


@pytest.mark.slow
@pytest.mark.parametrize("jac, jac_jax", [(accy.jacrev, jax.jacrev), (accy.jacfwd, jax.jacfwd)])
def test_jacobian_of_a_tree_against_jax(jac, jac_jax):
    got = jac(model, argnums=(0, 1))(PARAMS, on(X, ("i",)))
    expected = jac_jax(model_jax, argnums=(0, 1))(PARAMS_JAX, X)
    dparams, dx = got["h"]
    assert dparams["w"].axes == ("out", "i", "o") and dx.axes == ("out", "i")
    np.testing.assert_allclose(dparams["w"].array, expected["h"][0]["w"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx.array, expected["h"][1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["s"][1].array, expected["s"][1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["s"][0]["w"].array, expected["s"][0]["w"], rtol=1e-5)
    np.testing.assert_allclose(got["s"][0]["b"].array, expected["s"][0]["b"], rtol=1e-5)


def test_shared_axis_names_are_an_error_that_suggests_a_rename():
    with pytest.raises(accy.AxisError, match=r"share the axis name 'o'.*rename"):
        accy.jacrev(model)(PARAMS, on(X, ("i",)), "o")
    with pytest.raises(accy.AxisError, match=r"share the axis name 'o'.*rename"):
        accy.jacfwd(model)(PARAMS, on(X, ("i",)), "o")


def test_jacobian_axes_are_the_outputs_then_the_inputs():
    x = on(RNG.normal(size=(2, 3)).astype(np.float32), ("a", "b"))

    def f(x):
        return (x * x).rename("a", "p").rename("b", "q").sum("q")

    expected = jax.jacrev(lambda x: (x * x).sum(1))(np.asarray(x))
    for jac in (accy.jacrev, accy.jacfwd):
        got = jac(f)(x)
        assert got.axes == ("p", "a", "b")
        np.testing.assert_allclose(got.array, expected, rtol=1e-6)


@pytest.mark.slow
def test_hessian_against_jax_with_the_suffix_rule():
    x = on(X, ("i",))
    expected = jax.hessian(lambda x: jnp.sum(jnp.sin(x) * x[0]))(X)
    hessian = accy.hessian(lambda x: (x.sin() * x["i", 0]).sum())
    got = hessian(x)
    assert got.axes == ("i_", "i")
    np.testing.assert_allclose(got.array, expected, rtol=1e-5, atol=1e-6)
    renamed = accy.hessian(lambda x: (x.sin() * x["i", 0]).sum(), second_axis=str.upper)(x)
    assert renamed.axes == ("I", "i")
    hessian(on(X + 1.0, ("i",)))
    assert hessian.staged.traces == 1  # one trace per signature, as accy.grad
    with pytest.raises(accy.AxisError, match="a name of its own"):
        accy.hessian(lambda x: x.sum(), second_axis="")(x)


def test_has_aux_and_nesting_under_jit():
    x = on(X, ("i",))

    def f(x):
        y = (x * x).rename("i", "o")
        return y, {"norm": y.sum()}

    for jac in (accy.jacrev, accy.jacfwd):
        J, aux = accy.jit(jac(f, has_aux=True))(x)
        np.testing.assert_allclose(J.array, np.diag(2 * X), rtol=1e-6)
        np.testing.assert_allclose(aux["norm"].item(), (X * X).sum(), rtol=1e-6)


def test_integer_inputs_are_refused():
    with pytest.raises(accy.TransformError, match="Python int"):
        accy.jacrev(lambda x: x * 2.0)(3)
    ints = on(np.arange(3, dtype=np.int32), ("i",))
    with pytest.raises(accy.TransformError, match="floating-point"):
        accy.jacfwd(lambda x: x.convert(accy.f32).rename("i", "o"))(ints)
