"""Haliax's tests/test_ops.py, case by case, on accy's named operations. Haliax does not
import under this JAX, so the oracle is what its assertions use: jax.numpy on the same arrays.
Haliax draws inputs with hax.random; these draw them with NumPy. Haliax refuses to broadcast
two arrays neither of whose axes contain the other's; accy broadcasts by name to the union (its
documented rule), so those sub-cases are not translated; nor are hax.where's one-argument form,
nonzero, unique and bincount (which accy lacks) or mean's `where=`."""

import jax.numpy as jnp
import numpy as np
import pytest

import accy

RNG = np.random.default_rng(0)
SIZES = {"Height": 10, "Width": 3, "Depth": 4}


def uniform(*axes):
    data = RNG.uniform(size=tuple(SIZES[a] for a in axes)).astype(np.float32)
    return accy.named(data, axes, device="reference")


def rearranged(x, *axes):
    return np.asarray(x.transpose(*axes).array)


def test_add():
    a, b = uniform("Height", "Width", "Depth"), uniform("Height", "Width", "Depth")
    np.testing.assert_allclose((a + b).array, jnp.asarray(a.array) + b.array)
    b_reordered = b.transpose("Width", "Height", "Depth")
    got = rearranged(a + b_reordered, "Height", "Width", "Depth")
    np.testing.assert_allclose(got, jnp.asarray(a.array) + b.array)


def test_add_broadcasting():
    a, b = uniform("Height", "Width", "Depth"), uniform("Width", "Depth")
    np.testing.assert_allclose((a + b).array, jnp.asarray(a.array) + b.array)
    got = rearranged(a + b.transpose("Depth", "Width"), "Height", "Width", "Depth")
    np.testing.assert_allclose(got, jnp.asarray(a.array) + b.array)


def test_add_scalar():
    a = uniform("Height", "Width", "Depth")
    np.testing.assert_allclose((a + 1.0).array, jnp.asarray(a.array) + 1.0)
    np.testing.assert_allclose((1.0 + a).array, jnp.asarray(a.array) + 1.0)


def test_add_no_overlap():
    a, b = uniform("Height"), uniform("Width", "Depth")
    wide = a.broadcast_to(accy.spec(accy.f32, **SIZES)) + b
    expected = jnp.asarray(a.array).reshape((-1, 1, 1)) + b.array.reshape((1, *b.array.shape))
    np.testing.assert_allclose(wide.array, expected)


@pytest.mark.parametrize("use_jit", [False, True])
def test_where(use_jit):
    where = accy.jit(accy.where) if use_jit else accy.where
    a, b = uniform("Height", "Width", "Depth"), uniform("Height", "Width", "Depth")
    where(a > 0.0, a, 0.0)
    got = where(a > b, a, b)
    np.testing.assert_allclose(got.array, jnp.where(a.array > b.array, a.array, b.array))
    b_reordered = b.transpose("Width", "Height", "Depth")
    got = rearranged(where(a > b_reordered, a, b_reordered), "Height", "Width", "Depth")
    np.testing.assert_allclose(got, jnp.where(a.array > b.array, a.array, b.array))
    c, d = uniform("Height", "Width"), uniform("Width")
    got = rearranged(where(c > d, c, d), "Height", "Width")
    np.testing.assert_allclose(got, jnp.where(c.array > d.array, c.array, d.array))


def test_clip():
    a = uniform("Height", "Width", "Depth")
    np.testing.assert_allclose(accy.clip(a, 0.3, 0.7).array, jnp.clip(a.array, 0.3, 0.7))
    clipped = accy.clip(a.transpose("Width", "Height", "Depth"), 0.3, 0.7)
    np.testing.assert_allclose(
        rearranged(clipped, "Height", "Width", "Depth"), jnp.clip(a.array, 0.3, 0.7)
    )
    lower = accy.named(np.full((10, 3), 0.3, np.float32), ("Height", "Width"))
    upper = accy.named(np.full((3, 4), 0.7, np.float32), ("Width", "Depth"))
    got = rearranged(accy.clip(a.to("cpu"), lower, upper), "Height", "Width", "Depth")
    expected = jnp.clip(a.array, lower.array.reshape((10, 3, 1)), upper.array.reshape((1, 3, 4)))
    np.testing.assert_allclose(got, expected)


def test_tril_triu():
    a = uniform("Height", "Width", "Depth")
    for ours, theirs in (("tril", jnp.tril), ("triu", jnp.triu)):
        for k in (0, 1, -1):
            got = getattr(a, ours)("Width", "Depth", k=k)
            np.testing.assert_allclose(got.array, theirs(a.array, k=k))
        got = getattr(a, ours)("Height", "Depth")
        expected = theirs(a.array.transpose([1, 0, 2]))
        np.testing.assert_allclose(rearranged(got, "Width", "Height", "Depth"), expected)


def test_reductions_produce_scalar_named_arrays_when_none_axis():
    a = uniform("Height", "Width")
    assert isinstance(a.mean(), accy.NamedArray) and a.mean().axes == ()
    both = a.mean(("Height", "Width"))
    assert isinstance(both, accy.NamedArray) and both.axes == ()
    np.testing.assert_allclose(both.item(), jnp.mean(a.array), rtol=1e-6)


def test_pad():
    arr = accy.named(np.arange(6, dtype=np.float32).reshape(3, 2), ("Height", "Width"))
    padded = arr.pad("Height", 1, 2, 0.0).pad("Width", 0, 1, 0.0)
    expected = jnp.pad(arr.array, [(1, 2), (0, 1)], mode="constant", constant_values=0)
    assert padded.shape == {"Height": 6, "Width": 3}
    np.testing.assert_array_equal(padded.array, expected)


def test_allclose():
    a = uniform("Height", "Width")
    assert bool(accy.allclose(a, a + 1e-6)) == bool(jnp.allclose(a.array, a.array + 1e-6))
    assert not bool(accy.allclose(a, a + 1.0))
    ones = accy.named(np.ones((10, 3), np.float32), ("Height", "Width"))
    assert bool(accy.allclose(ones, ones.transpose("Width", "Height")))  # by name
