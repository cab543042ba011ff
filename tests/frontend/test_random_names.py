"""accy.random in front-end code: keys as NamedArrays, draws by axis name and independent of
layout order, the distributions JAX has, half-precision normals, seed range."""

import math

import numpy as np
import pytest

import accy

N = 20_000


def test_a_key_is_a_named_array_that_jit_takes():
    k = accy.random.key(0)
    assert k.axes == ("key",) and k.dtype == accy.i32
    draw = accy.jit(lambda k: accy.random.uniform(k, {"n": 4}))
    np.testing.assert_array_equal(draw(k).array, accy.random.uniform(k, {"n": 4}).array)
    assert accy.random.key(-1).array.tolist() == [-1, -1]
    assert accy.random.key(2**64 - 1).array.tolist() == [-1, -1]
    for seed in (2**64, -(2**63) - 1):
        with pytest.raises(accy.DTypeError, match="does not fit in 64 bits"):
            accy.random.key(seed)
    with pytest.raises(accy.DTypeError, match="a seed is an integer"):
        accy.random.key(1.5)


def test_draws_do_not_depend_on_layout_order():
    data = np.ones((3, 5), np.float32)
    x = accy.named(data, ("row", "col"))
    xt = accy.named(data.T.copy(), ("col", "row"))
    k = accy.random.key(3)
    dropped = accy.jit(lambda k, x: accy.nn.dropout(k, x, 0.5))
    a, b = dropped(k, x), dropped(k, xt)
    np.testing.assert_array_equal(a.array, b.array.T)
    u = accy.random.uniform(k, {"row": 3, "col": 5})
    v = accy.random.uniform(k, {"col": 5, "row": 3})
    np.testing.assert_array_equal(u.array, v.array.T)


@pytest.mark.parametrize("dtype", [accy.f16, accy.bf16])
def test_half_precision_normals_are_finite(dtype):
    z = accy.random.normal(accy.random.key(1), {"n": 200_000}, dtype=dtype)
    assert z.dtype == dtype
    values = np.asarray(z.array, np.float32)
    assert np.isfinite(values).all()
    assert abs(values.mean()) < 0.02 and abs(values.std() - 1.0) < 0.02


@pytest.mark.slow
def test_randint_permutation_choice():
    k1, k2, k3 = accy.random.split(accy.random.key(7), 3)
    r = accy.random.randint(k1, {"n": N}, -3, 5).array
    assert r.min() == -3 and r.max() == 4
    counts = np.bincount(r + 3)
    assert np.all(np.abs(counts - N / 8) < 5 * math.sqrt(N / 8))
    perm = accy.random.permutation(k2, 10, "n").array
    assert sorted(perm.tolist()) == list(range(10)) and perm.tolist() != list(range(10))
    x = accy.named(np.arange(10.0, dtype=np.float32) * 10, "n")
    shuffled = accy.random.permutation(k2, x, "n")
    np.testing.assert_array_equal(shuffled.array, x.array[perm])
    picked = accy.random.choice(k3, x, "n", {"pick": 10}, replace=False).array
    assert sorted(picked.tolist()) == sorted(x.array.tolist())
    p = accy.named(np.array([0.5, 0.0, 0.5] + [0.0] * 7, np.float32), "n")
    weighted = accy.random.choice(k3, x, "n", {"pick": 2000}, p=p).array
    assert set(weighted.tolist()) == {0.0, 20.0}
    assert abs((weighted == 0.0).mean() - 0.5) < 0.05
    two = accy.random.choice(k1, x, "n", {"pick": 2}, replace=False, p=p).array
    assert sorted(two.tolist()) == [0.0, 20.0]
    with pytest.raises(accy.AxisError, match="without replacement"):
        accy.random.choice(k1, x, "n", {"pick": 11}, replace=False)


def test_truncated_normal_and_gumbel_moments():
    k1, k2 = accy.random.split(accy.random.key(11))
    lower, upper = -1.0, 2.0
    t = accy.random.truncated_normal(k1, lower, upper, {"n": N}).array
    assert t.min() >= lower and t.max() <= upper

    def phi(v):
        return math.exp(-v * v / 2) / math.sqrt(2 * math.pi)

    def cdf(v):
        return 0.5 * (1 + math.erf(v / math.sqrt(2)))

    mean = (phi(lower) - phi(upper)) / (cdf(upper) - cdf(lower))
    assert abs(t.mean() - mean) < 0.02
    g = accy.random.gumbel(k2, {"n": N}).array
    assert abs(g.mean() - 0.5772156649) < 0.03


def test_concrete_draws_compile_once():
    k = accy.random.key(5)
    accy.random.normal(k, {"n": 3})
    before = len(accy.random._EAGER)
    accy.random.normal(accy.random.key(6), {"n": 3})
    assert len(accy.random._EAGER) == before
