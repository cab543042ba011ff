"""Diagonal sums, masked reductions and the counting and set functions (`x.trace`,
`mean/sum/prod(where=)`, `bincount`, `nonzero`, `unique` and its shortcuts): values against
jax.numpy on the same arrays, gradients against jax.grad, on the reference evaluator, the CPU
backend and under jit, and their errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import accy

RNG = np.random.default_rng(7)


def floats(*shape):
    return RNG.normal(size=shape).astype(np.float32)


# -- trace ------------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [0, 1, -2])
def test_trace_matches_jnp_trace_eagerly_and_under_jit(offset):
    data = floats(2, 3, 4)
    x = accy.named(data, ("batch", "row", "col"), device="reference")
    expected = jnp.trace(data, offset=offset, axis1=1, axis2=2)
    got = x.trace("row", "col", offset=offset)
    assert got.axes == ("batch",)
    np.testing.assert_allclose(got.array, expected, rtol=1e-6)
    jitted = accy.jit(lambda a: a.trace("col", "row", offset=-offset))(x.to("cpu"))
    np.testing.assert_allclose(jitted.array, expected, rtol=1e-6)


def test_trace_gradient_is_the_diagonal_mask():
    data = floats(3, 4)
    x = accy.named(data, ("row", "col"))
    got = accy.grad(lambda a: (a.trace("row", "col", offset=1) * 3.0).sum())(x)
    expected = jax.grad(lambda a: jnp.trace(a, offset=1) * 3.0)(data)
    np.testing.assert_allclose(got.array, expected)


def test_trace_errors_name_the_axes():
    x = accy.named(floats(3, 3), ("row", "col"))
    with pytest.raises(accy.AxisError, match="two different axes"):
        x.trace("row", "row")
    with pytest.raises(accy.AxisError, match="trace: axis 'depth' is not on"):
        x.trace("row", "depth")


# -- where= of reductions ---------------------------------------------------------------------


def test_mean_sum_prod_where_match_jnp():
    data = floats(4, 3)
    mask = RNG.uniform(size=(4, 3)) > 0.5
    row_mask = np.array([True, False, True, True])
    x = accy.named(data, ("row", "col"), device="reference")
    m = accy.named(mask, ("row", "col"), device="reference")
    r = accy.named(row_mask, "row", device="reference")
    np.testing.assert_allclose(x.mean(where=m).item(), jnp.mean(data, where=mask), rtol=1e-6)
    np.testing.assert_allclose(
        x.mean("row", where=r).array, jnp.mean(data, axis=0, where=row_mask[:, None]), rtol=1e-6
    )
    np.testing.assert_allclose(
        x.sum("col", where=m).array, jnp.sum(data, axis=1, where=mask), rtol=1e-6
    )
    np.testing.assert_allclose(x.prod(where=m).item(), jnp.prod(data, where=mask), rtol=1e-5)
    nothing = accy.named(np.zeros(4, bool), "row", device="reference")
    assert np.isnan(x.mean("row", where=nothing).array).all()  # as jnp: 0 / 0


def test_var_where_matches_jnp():
    data = floats(5, 3)
    mask = RNG.uniform(size=(5, 3)) > 0.3
    x = accy.named(data, ("row", "col"), device="reference")
    m = accy.named(mask, ("row", "col"), device="reference")
    got = accy.var(x, "row", ddof=1, where=m)
    np.testing.assert_allclose(got.array, jnp.var(data, axis=0, ddof=1, where=mask), rtol=1e-5)
    np.testing.assert_allclose(accy.var(x, where=m).item(), jnp.var(data, where=mask), rtol=1e-5)


def test_mean_where_under_jit_and_its_gradient():
    data = floats(4, 3)
    mask = RNG.uniform(size=(4, 3)) > 0.3
    x, m = accy.named(data, ("row", "col")), accy.named(mask, ("row", "col"))
    got = accy.jit(lambda a, w: a.mean("row", where=w))(x, m)
    np.testing.assert_allclose(got.array, jnp.mean(data, axis=0, where=mask), rtol=1e-6)
    grad = accy.grad(lambda a, w: (a * a).mean(where=w), argnums=0)(x, m)
    expected = jax.grad(lambda a: jnp.mean(a * a, where=mask))(data)
    np.testing.assert_allclose(grad.array, expected, rtol=1e-6)


def test_where_mask_errors():
    x = accy.named(floats(4, 3), ("row", "col"))
    with pytest.raises(accy.DTypeError, match="where= must be a bool array"):
        x.mean(where=x)
    with pytest.raises(accy.AxisError, match="has axes \\['depth'\\]"):
        x.sum(where=accy.named(np.ones(2, bool), "depth"))
    with pytest.raises(accy.AxisError, match="extent 2 on the mask"):
        x.prod(where=accy.named(np.ones(2, bool), "row"))


# -- bincount ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_bincount_counts_and_weights_match_jnp():
    values = np.array([[0, 1, 1], [7, -2, 3]], np.int32)  # 7 past the end, -2 counts as 0
    weights = floats(2, 3)
    x = accy.named(values, ("a", "b"), device="reference")
    w = accy.named(weights, ("a", "b"), device="reference")
    got = accy.bincount(x, "bin", length=5)
    assert got.axes == ("bin",) and got.dtype == accy.i32
    np.testing.assert_array_equal(got.array, jnp.bincount(values.ravel(), length=5))
    expected = jnp.bincount(values.ravel(), weights=weights.ravel(), length=5)
    np.testing.assert_allclose(accy.bincount(x, "bin", 5, weights=w).array, expected, rtol=1e-6)
    jitted = accy.jit(lambda v, u: accy.bincount(v, "bin", 5, weights=u))(x.to("cpu"), w.to("cpu"))
    np.testing.assert_allclose(jitted.array, expected, rtol=1e-6)


def test_bincount_gradient_with_respect_to_weights():
    values = np.array([0, 2, 2, 1], np.int32)
    x, w = accy.named(values, "t", device="reference"), accy.named(floats(4), "t").to("reference")
    scale = accy.named(np.array([1.0, 2.0, 3.0], np.float32), "bin", device="reference")
    got = accy.grad(lambda u: (accy.bincount(x, "bin", 3, weights=u) * scale).sum())(w)
    theirs = jax.grad(lambda u: (jnp.bincount(values, u, length=3) * scale.array).sum())(w.array)
    np.testing.assert_allclose(got.array, theirs)


def test_bincount_errors():
    x = accy.named(np.array([0, 1], np.int32), "t")
    with pytest.raises(accy.DTypeError, match="bincount: x must be an i32 or i64"):
        accy.bincount(x.convert(accy.f32), "bin", 3)
    with pytest.raises(accy.AxisError, match="already an axis"):
        accy.bincount(x, "t", 3)
    with pytest.raises(accy.AxisError, match="must be an int >= 0"):
        accy.bincount(x, "bin", -1)
    with pytest.raises(accy.AxisError, match="weights must have the axes of x"):
        accy.bincount(x, "bin", 3, weights=accy.named(floats(3), "t"))
    with pytest.raises(accy.AccyError, match="bincount: x must be a named array"):
        accy.bincount([0, 1], "bin", 3)


# -- nonzero ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("size", "device"), [(3, "reference"), (9, "cpu")])
def test_nonzero_matches_jnp(size, device):
    data = np.array([[0, 1, 0], [2, 0, 0], [0, 3, 4]], np.int32)
    x = accy.named(data, ("row", "col"), device="reference")
    expected = [np.asarray(i) for i in jnp.nonzero(data, size=size, fill_value=-1)]
    for got in (
        accy.nonzero(x, "hit", size=size, fill_value=-1),
        accy.jit(lambda a: accy.nonzero(a, "hit", size=size, fill_value=-1))(x.to(device)),
    ):
        assert [i.axes for i in got] == [("hit",), ("hit",)]
        for ours, theirs in zip(got, expected, strict=True):
            np.testing.assert_array_equal(ours.array, theirs)
    flags = accy.named(data.ravel() > 1, "t", device="reference")
    (only,) = accy.nonzero(flags, "hit", size=4)
    np.testing.assert_array_equal(only.array, jnp.nonzero(data.ravel() > 1, size=4)[0])


def test_nonzero_errors():
    with pytest.raises(accy.AxisError, match="nonzero: x is a scalar"):
        accy.nonzero(accy.named(np.int32(1), ()), "hit", size=1)
    with pytest.raises(accy.AxisError, match="output axis must be a name"):
        accy.nonzero(accy.named(np.ones(2, np.int32), "t"), 3, size=1)


# -- unique -----------------------------------------------------------------------------------


def _jnp_unique(data, size, axis=None):
    return jnp.unique(
        data,
        size=size,
        axis=axis,
        return_index=True,
        return_inverse=True,
        return_counts=True,
    )


@pytest.mark.slow
@pytest.mark.parametrize("size", [3, 5, 8])
def test_unique_of_every_element_matches_jnp(size):
    data = RNG.integers(0, 5, size=(3, 4)).astype(np.int32)
    x = accy.named(data, ("row", "col"), device="reference")
    got = accy.unique(x, "u", size, return_index=True, return_inverse=True, return_counts=True)
    for ours, theirs in zip(got, _jnp_unique(data, size), strict=True):
        np.testing.assert_array_equal(ours.array, np.reshape(theirs, ours.array.shape))
    assert got[2].axes == ("row", "col")


@pytest.mark.slow
@pytest.mark.parametrize("size", [2, 4])
def test_unique_slices_match_jnp_under_jit(size):
    data = np.array([[1, 2], [2, 3], [1, 2], [0, 9]], np.int32)
    x = accy.named(data, ("row", "col"), device="cpu")
    got = accy.jit(lambda a: accy.unique_all(a, "u", size, along="row"))(x)
    assert got[0].axes == ("u", "col") and got[2].axes == ("row",)
    for ours, theirs in zip(got, _jnp_unique(data, size, axis=0), strict=True):
        np.testing.assert_array_equal(ours.array, np.reshape(theirs, ours.array.shape))


@pytest.mark.slow
def test_unique_float_values_and_their_gradient():
    data = np.array([0.5, -1.0, 0.5, 2.0, -1.0], np.float32)
    x = accy.named(data, "t", device="reference")
    weights = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    w = accy.named(weights, "u", device="reference")
    values = accy.unique(x, "u", 4, fill_value=0.0)
    np.testing.assert_array_equal(values.array, jnp.unique(data, size=4, fill_value=0.0))
    got = accy.grad(lambda a: (accy.unique(a, "u", 4, fill_value=0.0) * w).sum())(x)
    theirs = jax.grad(lambda a: (jnp.unique(a, size=4, fill_value=0.0) * weights).sum())(data)
    np.testing.assert_allclose(got.array, theirs)


def test_unique_shortcuts_agree_with_unique():
    x = accy.named(np.array([3, 4, 1, 3, 1], np.int32), "t", device="reference")
    full = accy.unique(x, "u", 3, return_index=True, return_inverse=True, return_counts=True)
    pairs = {
        accy.unique_counts: (full[0], full[3]),
        accy.unique_inverse: (full[0], full[2]),
        accy.unique_all: full,
    }
    for shortcut, expected in pairs.items():
        for ours, theirs in zip(shortcut(x, "u", 3), expected, strict=True):
            np.testing.assert_array_equal(ours.array, theirs.array)
    np.testing.assert_array_equal(accy.unique_values(x, "u", 3).array, [1, 3, 4])


def test_unique_errors():
    x = accy.named(np.array([[1, 2]], np.int32), ("row", "col"))
    with pytest.raises(accy.AxisError, match="unique: axis 'depth' is not on"):
        accy.unique(x, "u", 2, along="depth")
    with pytest.raises(accy.AxisError, match="output axis 'row' is already an axis"):
        accy.unique(x, "row", 2)
    with pytest.raises(accy.AxisError, match="unique: x is a scalar"):
        accy.unique(accy.named(np.int32(1), ()), "u", 1)


@pytest.mark.slow
def test_counting_functions_under_vmap_match_jax_vmap():
    data = np.array([[3, 1, 3, 0], [2, 2, 5, 2]], np.int32)
    x = accy.named(data, ("b", "t"), device="reference")
    got = accy.vmap(lambda a: accy.unique(a, "u", 3, return_counts=True), "b")(x)
    expected = jax.vmap(lambda a: jnp.unique(a, size=3, return_counts=True))(data)
    for ours, theirs in zip(got, expected, strict=True):
        np.testing.assert_array_equal(ours.transpose("b", "u").array, theirs)
    (hits,) = accy.vmap(lambda a: accy.nonzero(a, "hit", size=3), "b")(x)
    theirs = jax.vmap(lambda a: jnp.nonzero(a, size=3)[0])(data)
    np.testing.assert_array_equal(hits.transpose("b", "hit").array, theirs)
    counts = accy.vmap(lambda a: accy.bincount(a, "bin", 6), "b")(x)
    theirs = jax.vmap(lambda a: jnp.bincount(a, length=6))(data)
    np.testing.assert_array_equal(counts.transpose("b", "bin").array, theirs)


def test_unique_counts_nans_as_one_value_as_jnp():
    data = np.array([np.nan, 1.0, np.nan, 0.5, 1.0], np.float32)
    x = accy.named(data, "t", device="reference")
    got = accy.unique(x, "u", 4, return_index=True, return_inverse=True, return_counts=True)
    for ours, theirs in zip(got, _jnp_unique(data, 4), strict=True):
        np.testing.assert_array_equal(ours.array, theirs)
