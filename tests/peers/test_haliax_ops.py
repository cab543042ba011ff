"""Haliax's tests/test_ops.py, case by case, on accy's named operations. Haliax does not
import under this JAX, so the oracle is what its assertions use: jax.numpy on the same arrays.
Haliax draws inputs with hax.random; these draw them with NumPy. Haliax refuses to broadcast
two arrays neither of whose axes contain the other's; accy broadcasts by name to the union (its
documented rule), so those sub-cases are not translated; hax.where's one-argument form is not
either (accy lacks it).

Haliax's 18 cases: 12 translated (one test each), 6 not applicable (operations accy lacks:
trace, nonzero, unique and its shortcuts, bincount, mean's `where=`), one skipped test each.
"""

import jax.numpy as jnp
import numpy as np
import pytest

import accy
from tests.peers.ledger import not_applicable_tests, translates

RNG = np.random.default_rng(0)
SIZES = {"Height": 10, "Width": 3, "Depth": 4}


def uniform(*axes):
    data = RNG.uniform(size=tuple(SIZES[a] for a in axes)).astype(np.float32)
    return accy.named(data, axes, device="reference")


def rearranged(x, *axes):
    return np.asarray(x.transpose(*axes).array)


@translates("test_add")
def test_add():
    a, b = uniform("Height", "Width", "Depth"), uniform("Height", "Width", "Depth")
    np.testing.assert_allclose((a + b).array, jnp.asarray(a.array) + b.array)
    b_reordered = b.transpose("Width", "Height", "Depth")
    got = rearranged(a + b_reordered, "Height", "Width", "Depth")
    np.testing.assert_allclose(got, jnp.asarray(a.array) + b.array)


@translates("test_add_broadcasting")
def test_add_broadcasting():
    a, b = uniform("Height", "Width", "Depth"), uniform("Width", "Depth")
    np.testing.assert_allclose((a + b).array, jnp.asarray(a.array) + b.array)
    got = rearranged(a + b.transpose("Depth", "Width"), "Height", "Width", "Depth")
    np.testing.assert_allclose(got, jnp.asarray(a.array) + b.array)


@translates("test_add_scalar")
def test_add_scalar():
    a = uniform("Height", "Width", "Depth")
    np.testing.assert_allclose((a + 1.0).array, jnp.asarray(a.array) + 1.0)
    np.testing.assert_allclose((1.0 + a).array, jnp.asarray(a.array) + 1.0)


@translates("test_add_no_overlap")
def test_add_no_overlap():
    a, b = uniform("Height"), uniform("Width", "Depth")
    wide = a.broadcast_to(accy.spec(accy.f32, **SIZES)) + b
    expected = jnp.asarray(a.array).reshape((-1, 1, 1)) + b.array.reshape((1, *b.array.shape))
    np.testing.assert_allclose(wide.array, expected)


@translates("test_where")
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


@translates("test_clip")
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


@translates("test_tril_triu")
def test_tril_triu():
    a = uniform("Height", "Width", "Depth")
    for ours, theirs in (("tril", jnp.tril), ("triu", jnp.triu)):
        for k in (0, 1, -1):
            got = getattr(a, ours)("Width", "Depth", k=k)
            np.testing.assert_allclose(got.array, theirs(a.array, k=k))
        got = getattr(a, ours)("Height", "Depth")
        expected = theirs(a.array.transpose([1, 0, 2]))
        np.testing.assert_allclose(rearranged(got, "Width", "Height", "Depth"), expected)


@translates("test_reductions_produce_scalar_named_arrays_when_None_axis")
def test_reductions_produce_scalar_named_arrays_when_none_axis():
    a = uniform("Height", "Width")
    assert isinstance(a.mean(), accy.NamedArray) and a.mean().axes == ()
    both = a.mean(("Height", "Width"))
    assert isinstance(both, accy.NamedArray) and both.axes == ()
    np.testing.assert_allclose(both.item(), jnp.mean(a.array), rtol=1e-6)


@translates("test_pad")
def test_pad():
    arr = accy.named(np.arange(6, dtype=np.float32).reshape(3, 2), ("Height", "Width"))
    padded = arr.pad("Height", 1, 2, 0.0).pad("Width", 0, 1, 0.0)
    expected = jnp.pad(arr.array, [(1, 2), (0, 1)], mode="constant", constant_values=0)
    assert padded.shape == {"Height": 6, "Width": 3}
    np.testing.assert_array_equal(padded.array, expected)


@translates("test_allclose_array_equal_equiv")
def test_allclose():
    a = uniform("Height", "Width")
    assert bool(accy.allclose(a, a + 1e-6)) == bool(jnp.allclose(a.array, a.array + 1e-6))
    assert not bool(accy.allclose(a, a + 1.0))
    ones = accy.named(np.ones((10, 3), np.float32), ("Height", "Width"))
    assert bool(accy.allclose(ones, ones.transpose("Width", "Height")))  # by name
    # array_equal and array_equiv, as accy spells them: one shape and equal elements, or
    # equal elements once broadcast by name
    reordered = ones.transpose("Width", "Height")
    assert ones.shape == reordered.shape and bool((ones == reordered).min())
    for other in (accy.named(np.float32(1.0), ()), accy.named(np.ones(3, np.float32), "Width")):
        assert bool((ones == other).min()) and ones.shape != other.shape
    assert np.array_equiv(np.ones((10, 3)), 1.0) and not np.array_equal(np.ones((10, 3)), 1.0)
    z = accy.named(np.ones(4, np.float32), "C")
    assert (ones == z).shape != ones.shape  # not broadcastable into ones' shape: not equivalent


@translates("test_roll_scalar_named_shift")
def test_roll_scalar_named_shift():
    arr = accy.named(np.arange(12, dtype=np.int32).reshape(4, 3), ("H", "W"), device="reference")
    for value in (1, -1, 6):
        shift = accy.named(np.int32(value), (), device="reference")
        expected = jnp.roll(arr.array, value, axis=0)
        for rolled in (arr.roll(shift, "H"), accy.jit(lambda a, s: a.roll(s, "H"))(arr, shift)):
            assert rolled.axes == arr.axes
            np.testing.assert_array_equal(rolled.array, expected)


@translates("test_roll_bad_named_shift")
def test_roll_bad_named_shift():
    arr = accy.named(np.arange(12, dtype=np.int32).reshape(4, 3), ("H", "W"))
    shift = accy.named(np.arange(2, dtype=np.int32), "dummy")
    with pytest.raises(accy.AxisError, match=r"roll: the shift must be an int or an integer"):
        arr.roll(shift, "H")


NOT_APPLICABLE = {
    "test_trace": "accy lacks a trace (diagonal sum) operation; accy.trace is the tracing module",
    "test_nonzero": "accy lacks nonzero (with a size= bound)",
    "test_unique": "accy lacks unique (with a size= bound and its index/inverse/count outputs)",
    "test_unique_shortcuts": "accy lacks unique_values/unique_counts/unique_inverse/unique_all",
    "test_bincount": "accy lacks bincount",
    "test_mean_respects_where": "accy lacks the where= mask of its reductions",
}
test_not_applicable = not_applicable_tests(NOT_APPLICABLE)
