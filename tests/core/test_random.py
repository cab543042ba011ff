"""accy.random on the reference evaluator: Threefry's known answer, the streams' statistics
(moments and a Kolmogorov-Smirnov test on 10^6 draws), keys, and errors. Bit-identity with the
native CPU backend is tested in tests/backends/test_cpu_random.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

import accy
from accy import f16, f32, f64, i32, spec
from accy.random import KEY

N = 1_000_000
# The Kolmogorov-Smirnov statistic's critical value at significance 0.001: sqrt(-ln(0.0005)/2).
KS_CRITICAL = 1.95 / math.sqrt(N)


def _draw(function, seed=0, *extra_types):
    program = accy.trace.define("draw", [KEY, *extra_types], lambda b, a: function(b, *a))
    return program, accy.reference.run(program, [accy.random.key(seed)])


def _ks_statistic(samples, cdf):
    ordered = np.sort(samples.astype(np.float64))
    values = cdf(ordered)
    n = len(ordered)
    return max(np.max(np.arange(1, n + 1) / n - values), np.max(values - np.arange(n) / n))


@pytest.mark.slow
def test_uniform_floats_are_uniform_on_the_unit_interval():
    _, (u,) = _draw(lambda b, k: accy.random.uniform(k, spec(f32, n=N)))
    assert u.dtype == np.float32 and u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 5e-3 / math.sqrt(12) * 3
    assert abs(u.var() - 1 / 12) < 1e-3
    assert _ks_statistic(u, lambda x: x) < KS_CRITICAL


def test_normal_floats_are_standard_normal():
    _, (z,) = _draw(lambda b, k: accy.random.normal(k, spec(f32, n=N)))
    assert abs(z.mean()) < 5e-3 and abs(z.var() - 1.0) < 5e-3
    assert abs(np.mean(z.astype(np.float64) ** 3)) < 1e-2  # skewness
    assert abs(np.mean(z.astype(np.float64) ** 4) - 3.0) < 3e-2  # kurtosis
    erf = np.frompyfunc(math.erf, 1, 1)
    cdf = lambda x: 0.5 * (1.0 + erf(x / math.sqrt(2.0)).astype(np.float64))  # noqa: E731
    assert _ks_statistic(z, cdf) < KS_CRITICAL


def test_bits_have_every_bit_set_half_the_time():
    _, (bits,) = _draw(lambda b, k: accy.random.bits(k, spec(i32, n=100_000)))
    ones = np.unpackbits(bits.view(np.uint8)).reshape(-1, 32).mean(0)
    assert np.all(np.abs(ones - 0.5) < 0.01)


def test_split_keys_give_different_streams_and_one_key_the_same():
    def body(b, k):
        first, second = accy.random.split(k)
        t = spec(f32, n=8)
        return (
            accy.random.uniform(first, t),
            accy.random.uniform(second, t),
            accy.random.uniform(first, t),
            accy.random.uniform(accy.random.fold_in(k, 3), t),
        )

    _, (a, b, again, folded) = _draw(body)
    np.testing.assert_array_equal(a, again)
    assert not np.array_equal(a, b) and not np.array_equal(a, folded)
    _, (other,) = _draw(
        lambda b, k: accy.random.uniform(accy.random.split(k)[0], spec(f32, n=8)), 1
    )
    assert not np.array_equal(a, other)


def test_a_batch_of_keys_draws_one_stream_per_key():
    def body(b, k):
        keys = accy.random.split_along(k, "batch", 3)
        return accy.random.uniform(keys, spec(f32, n=4)), accy.random.split(k, 3)[1]

    program, (batch, second) = _draw(body)
    assert program.output_types[0] == spec(f32, n=4, batch=3)
    single = accy.trace.define("one", [KEY], lambda b, a: accy.random.uniform(a[0], spec(f32, n=4)))
    np.testing.assert_array_equal(accy.reference.run(single, [second])[0], batch[:, 1])


@pytest.mark.parametrize("dtype", [f64, f16], ids=str)
def test_uniform_of_other_float_types_stays_below_the_maximum(dtype):
    _, (u,) = _draw(lambda b, k: accy.random.uniform(k, spec(dtype, n=50_000), -2.0, 3.0))
    assert u.dtype == dtype.numpy and u.min() >= -2.0 and u.max() < 3.0
    assert abs(u.mean() - 0.5) < 0.05


def test_bernoulli_categorical_and_dropout_have_their_probabilities():
    logits = np.log(np.array([0.1, 0.2, 0.7], np.float32))

    def body(b, args):
        k, logits = args
        first, second, third = accy.random.split(k, 3)
        coins = accy.random.bernoulli(first, 0.3, spec(f32, n=100_000))
        batch = b.broadcast_to(logits, spec(f32, draw=100_000, c=3))
        picks = accy.random.categorical(second, batch, "c")
        dropped = accy.nn.dropout(third, b.full(spec(f32, n=100_000), 1.0), 0.5)
        return coins, picks, dropped

    program = accy.trace.define("d", [KEY, spec(f32, c=3)], body)
    coins, picks, dropped = accy.reference.run(program, [accy.random.key(5), logits])
    assert coins.dtype == np.bool_ and abs(coins.mean() - 0.3) < 0.01
    np.testing.assert_allclose(
        np.bincount(picks, minlength=3) / len(picks), [0.1, 0.2, 0.7], atol=0.01
    )
    assert set(np.unique(dropped).tolist()) == {0.0, 2.0} and abs(dropped.mean() - 1.0) < 0.02


def test_random_errors_say_what_a_key_is():
    with pytest.raises(accy.AxisError, match="axis 'key' of extent 2"):
        accy.trace.define(
            "e", [spec(i32, key=3)], lambda b, a: accy.random.uniform(a[0], spec(f32, n=2))
        )
    with pytest.raises(accy.DTypeError, match="uniform draws floats"):
        accy.trace.define("e", [KEY], lambda b, a: accy.random.uniform(a[0], spec(i32, n=2)))
    with pytest.raises(accy.AccyError, match="rate must be in"):
        accy.trace.define("e", [KEY, spec(f32, n=2)], lambda b, a: accy.nn.dropout(a[0], a[1], 1.0))
