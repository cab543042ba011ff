"""Haliax's tests/test_ops.py, case by case, on accy's named operations. Haliax does not
import under this JAX, so the oracle is what its assertions use: jax.numpy on the same arrays.
Haliax draws inputs with hax.random; these draw them with NumPy. Haliax refuses to broadcast
two arrays neither of whose axes contain the other's; accy broadcasts by name to the union (its
documented rule), so those sub-cases are not translated; hax.where's one-argument form is not
either (accy lacks it).

Haliax's 18 cases, all translated (one test each). Haliax's `hax.trace(x, a, b)` is the method
`x.trace(a, b)` (accy.trace is the tracing module); its `Axis(name, size)` outputs are a name
and `size=` (`length=` for bincount); its `unique(..., axis=A)` is `along=A`.
"""

import jax.numpy as jnp
import numpy as np
import pytest

import accy
from tests.peers.ledger import translates

RNG = np.random.default_rng(0)
SIZES = {"Height": 10, "Width": 3, "Depth": 4}


def uniform(*axes):
    data = RNG.uniform(size=tuple(SIZES[a] for a in axes)).astype(np.float32)
    return accy.named(data, axes, device="reference")


def rearranged(x, *axes):
    return np.asarray(x.transpose(*axes).array)


@translates("test_trace")
def test_trace():
    wide = uniform("Width", "Depth")
    assert wide.trace("Width", "Depth").axes == ()
    np.testing.assert_allclose(wide.trace("Width", "Depth").item(), jnp.trace(wide.array))
    deep = uniform("Height", "Width", "Depth")
    got = deep.trace("Width", "Depth")
    assert got.axes == ("Height",)
    np.testing.assert_allclose(got.array, jnp.trace(deep.array, axis1=1, axis2=2), rtol=1e-6)


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


@pytest.mark.slow
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


@translates("test_nonzero")
@pytest.mark.parametrize("use_jit", [False, True])
def test_nonzero(use_jit):
    data = np.array([[0, 1, 0, 2], [3, 0, 4, 0], [0, 0, 5, 6]], np.int32)
    arr = accy.named(data, ("Height", "Width"), device="reference")

    def nonzero(a):
        return accy.nonzero(a, "Nonzero", size=12, fill_value=-1)

    i, j = accy.jit(nonzero)(arr) if use_jit else nonzero(arr)
    ui, uj = jnp.nonzero(data, size=12, fill_value=-1)
    assert i.axes == ("Nonzero",) and j.axes == ("Nonzero",)
    np.testing.assert_array_equal(i.array, ui)
    np.testing.assert_array_equal(j.array, uj)


@translates("test_mean_respects_where")
def test_mean_respects_where():
    a = uniform("Height", "Width")
    mask = RNG.uniform(size=(10, 3)) > 0.5
    where = accy.named(mask, ("Height", "Width"), device="reference")
    assert not bool(accy.isclose(a.mean(), a.mean(where=where)))
    np.testing.assert_allclose(a.mean(where=where).item(), jnp.mean(a.array, where=mask), rtol=1e-6)
    rows = RNG.uniform(size=10) > 0.5
    where = accy.named(rows, "Height", device="reference")
    assert not bool(accy.isclose(a.mean(), a.mean(where=where)))
    expected = jnp.mean(a.array, where=rows.reshape((-1, 1)))
    np.testing.assert_allclose(a.mean(where=where).item(), expected, rtol=1e-6)


M = np.array([[1, 2], [2, 3], [1, 2]], np.int32)
X = np.array([3, 4, 1, 3, 1], np.int32)


@pytest.mark.slow
@translates("test_unique")
def test_unique():
    m = accy.named(M, ("Height", "Width"), device="reference")
    np.testing.assert_array_equal(accy.unique(m, "U", size=3).array, jnp.unique(M))
    rows = accy.unique(m, "U2", size=2, along="Height")
    np.testing.assert_array_equal(rows.array, jnp.unique(M, axis=0))
    x = accy.named(X, "Height", device="reference")
    values, indices = accy.unique(x, "U3", size=3, return_index=True)
    expected_values, expected_indices = jnp.unique(X, return_index=True)
    np.testing.assert_array_equal(values.array, expected_values)
    np.testing.assert_array_equal(indices.array, expected_indices)
    np.testing.assert_array_equal(values.array, x.gather(indices, "Height").array)
    values, inverse = accy.unique(x, "U3", size=3, return_inverse=True)
    np.testing.assert_array_equal(inverse.array, jnp.unique(X, return_inverse=True)[1])
    values, inverse = accy.unique(m, "U3", size=3, along="Height", return_inverse=True)
    rebuilt = values.gather(inverse, "U3").transpose("Height", "Width")
    np.testing.assert_array_equal(rebuilt.array, M)
    values, counts = accy.unique(x, "U3", size=3, return_counts=True)
    np.testing.assert_array_equal(counts.array, jnp.unique(X, return_counts=True)[1])
    values, counts = accy.unique(m, "U2", size=2, along="Height", return_counts=True)
    expected_values, expected_counts = jnp.unique(M, axis=0, return_counts=True)
    np.testing.assert_array_equal(values.array, expected_values)
    np.testing.assert_array_equal(counts.array, expected_counts)


def as_tuple(results):
    return results if isinstance(results, tuple) else (results,)


@translates("test_unique_shortcuts")
def test_unique_shortcuts():
    m = accy.named(M, ("Height", "Width"), device="reference")
    x = accy.named(X, "Height1", device="reference")
    pairs = [
        (accy.unique_values(m, "U", 3), accy.unique(m, "U", 3)),
        (accy.unique_counts(m, "U", 3), accy.unique(m, "U", 3, return_counts=True)),
        (accy.unique_inverse(x, "U2", 3), accy.unique(x, "U2", 3, return_inverse=True)),
        (
            accy.unique_all(m, "U3", 2, along="Height"),
            accy.unique(
                m,
                "U3",
                2,
                along="Height",
                return_index=True,
                return_inverse=True,
                return_counts=True,
            ),
        ),
    ]
    for shortcut, full in pairs:
        for ours, theirs in zip(as_tuple(shortcut), as_tuple(full), strict=True):
            np.testing.assert_array_equal(ours.array, theirs.array)
    all_results = jnp.unique_all(X)
    for ours, theirs in zip(accy.unique_all(x, "U2", 3), all_results, strict=True):
        np.testing.assert_array_equal(ours.array, theirs)


@translates("test_bincount")
def test_bincount():
    data = np.array([0, 1, 1, 2, 3, 1], np.int32)
    x = accy.named(data, "X", device="reference")
    out = accy.bincount(x, "B", length=5)
    assert out.axes == ("B",)
    np.testing.assert_array_equal(out.array, jnp.bincount(data, length=5))
    w = accy.arange("X", 6, dtype=accy.f32, device="reference")
    expected = jnp.bincount(data, weights=w.array, length=5)
    np.testing.assert_allclose(accy.bincount(x, "B", length=5, weights=w).array, expected)
