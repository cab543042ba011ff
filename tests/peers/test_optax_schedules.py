"""optax's schedule tests (optax/schedules/_schedule_test.py, _join_test.py and
_inject_test.py, optax 0.2.8), case by case. Every accy schedule is checked three ways on
the same counts: on Python ints (NumPy float32 results), on an accy i32 array of all the
counts inside one `accy.jit` (the path an optimizer step takes), and against optax's own
schedule in the same run (and the literal values optax's test expects).
"""

from __future__ import annotations

import functools
import inspect
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import accy
from accy import optim

R = "reference"


def on_counts(schedule, counts):
    """The schedule on an i32 array of counts (axis "step"), jitted once."""
    steps = accy.named(np.asarray(counts, np.int32), ("step",), device=R)

    @accy.jit
    def run(c):
        value = schedule(c)
        if not hasattr(value, "ty"):  # a constant schedule ignores the count
            return c.convert(accy.f32) * 0.0 + float(value)
        return value

    return run(steps).array


def check(accy_schedule, optax_schedule, counts, expected=None, **tolerance):
    tolerance = tolerance or {"rtol": 1e-6, "atol": 1e-6}
    eager = np.array([accy_schedule(c) for c in counts], np.float32)
    traced = on_counts(accy_schedule, counts)
    theirs = np.array([optax_schedule(c) for c in counts], np.float32)
    np.testing.assert_allclose(eager, theirs, **tolerance)
    np.testing.assert_allclose(traced, theirs, **tolerance)
    if expected is not None:
        np.testing.assert_allclose(eager, np.asarray(expected, np.float32), atol=1e-3)


def both(name, *args, **kwargs):
    return getattr(optim, name)(*args, **kwargs), getattr(optax, name)(*args, **kwargs)


# -- ConstantTest, PolynomialTest, PiecewiseConstantTest --------------------------------------


def test_constant():
    check(*both("constant_schedule", 10), range(15), [10] * 15)


def test_linear():
    s = both("polynomial_schedule", init_value=10.0, end_value=20.0, power=1, transition_steps=10)
    check(*s, range(15), list(range(10, 20)) + [20] * 5)


@pytest.mark.parametrize("num_steps", [-1, 0])
def test_zero_steps_schedule(num_steps):
    s = both("polynomial_schedule", 10.0, 20.0, power=1, transition_steps=num_steps)
    check(*s, range(15), [10.0] * 15)


def test_nonlinear():
    s = both("polynomial_schedule", init_value=25.0, end_value=10.0, power=2, transition_steps=10)
    check(*s, range(15), [10.0 + 15.0 * (1.0 - n / 10) ** 2 for n in range(10)] + [10] * 5)


def test_with_decay_begin():
    s = both("polynomial_schedule", 30.0, 10.0, power=2, transition_steps=10, transition_begin=4)
    expected = [30.0] * 4 + [10.0 + 20.0 * (1.0 - n / 10) ** 2 for n in range(10)] + [10] * 6
    check(*s, range(20), expected)


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["positive", "negative"])
def test_piecewise_constant(sign):
    s = both("piecewise_constant_schedule", sign * 0.1, {3: 2.0, 6: 0.5})
    check(*s, range(10), sign * np.array([0.1, 0.1, 0.1, 0.2, 0.2, 0.2, 0.1, 0.1, 0.1, 0.1]))


# -- ExponentialTest ---------------------------------------------------------------------------


@pytest.mark.parametrize("staircase", [False, True])
def test_exponential_constant_schedule(staircase):
    s = both("exponential_decay", 1.0, transition_steps=15, decay_rate=1.0, staircase=staircase)
    check(*s, range(15), [1.0] * 15)


@pytest.mark.parametrize("staircase", [False, True])
def test_nonvalid_transition_steps(staircase):
    for steps in (-1, 0):
        s = both(
            "exponential_decay", 1.0, transition_steps=steps, decay_rate=1.0, staircase=staircase
        )
        check(*s, range(15), [1.0] * 15)


@pytest.mark.parametrize("staircase", [False, True])
def test_nonvalid_decay_rate(staircase):
    s = both("exponential_decay", 1.0, transition_steps=2, decay_rate=0.0, staircase=staircase)
    check(*s, range(15), [1.0] * 15)


def _staircased(count, staircase, transition_steps=2):
    p = count / transition_steps
    return np.floor(p) if staircase else p


@pytest.mark.parametrize(("staircase", "begin"), [(False, 0), (True, 0), (False, 5), (True, 5)])
def test_exponential(staircase, begin):
    s = both(
        "exponential_decay",
        1.0,
        transition_steps=2,
        decay_rate=2.0,
        transition_begin=begin,
        staircase=staircase,
    )
    expected = [1.0] * begin + [2.0 ** _staircased(c, staircase) for c in range(15)]
    check(*s, range(15 + begin), expected)


@pytest.mark.parametrize(
    ("decay_rate", "end_value", "staircase"),
    [
        (0.2, 0.1, False),
        (1.0, 0.1, False),
        (2.0, 3.0, False),
        (0.2, 0.1, True),
        (1.0, 0.1, True),
        (2.0, 3.0, True),
    ],
)
def test_end_value_with_staircase(decay_rate, end_value, staircase):
    s = both(
        "exponential_decay",
        1.0,
        transition_steps=2,
        decay_rate=decay_rate,
        transition_begin=3,
        staircase=staircase,
        end_value=end_value,
    )
    expected = np.array(
        [1.0] * 3 + [decay_rate ** _staircased(c, staircase) for c in range(11)], np.float32
    )
    bound = np.maximum if decay_rate < 1.0 else np.minimum
    check(*s, range(14), bound(expected, end_value))


def test_immutable_count():
    s = both("exponential_decay", 32.0, transition_steps=1, decay_rate=0.5)
    check(*s, range(5), [32, 16, 8, 4, 2])


# -- CosineDecayTest ---------------------------------------------------------------------------


def test_decay_count_smaller_count():
    s = both("cosine_decay_schedule", 0.1, 10, 0.0)
    check(*s, range(10), 0.1 * (0.5 + 0.5 * np.cos(np.pi * np.arange(10) / 10)))


def test_decay_count_greater_count():
    s = both("cosine_decay_schedule", 0.1, 5, 0.0)
    fractions = np.minimum(np.arange(12) / 5, 1.0)
    check(*s, range(12), 0.1 * (0.5 + 0.5 * np.cos(np.pi * fractions)))


def test_decay_count_greater_count_with_alpha():
    s = both("cosine_decay_schedule", 0.1, 5, 0.1)
    fractions = np.minimum(np.arange(12) / 5, 1.0)
    check(*s, range(12), 0.1 * (0.9 * (0.5 + 0.5 * np.cos(np.pi * fractions)) + 0.1))


def test_cosine_with_exponent():
    ours, theirs = both(
        "cosine_decay_schedule", init_value=0.1, decay_steps=100, alpha=0.0, exponent=2
    )
    counts = np.array([0, 10, 50, 75, 100])
    expected = [0.1, 0.09516553580760956, 0.025, 0.0021446612663567066, 0.0]
    np.testing.assert_allclose(ours(counts), expected, rtol=1e-6, atol=1e-8)  # an array of counts
    np.testing.assert_allclose(on_counts(ours, counts), expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ours(counts), theirs(counts), rtol=1e-6, atol=1e-8)


def test_with_giant_int_steps():
    ours, theirs = both("cosine_decay_schedule", 1000.0, decay_steps=int(1e10), alpha=0.0)
    np.testing.assert_allclose(ours(int(1e9)), 975.52826, rtol=1e-6)
    np.testing.assert_allclose(on_counts(ours, [int(1e9)]), [975.52826], rtol=1e-6)
    np.testing.assert_allclose(ours(int(1e9)), theirs(int(1e9)), rtol=1e-6)


# -- WarmupCosineDecayTest ---------------------------------------------------------------------


@pytest.mark.parametrize(("init", "peak", "end"), [(10, 0.5, 1e-4), (5, 3, 0.0)])
def test_warmup_cosine_limits(init, peak, end):
    s = both(
        "warmup_cosine_decay_schedule",
        init,
        peak,
        warmup_steps=100,
        decay_steps=1000,
        end_value=end,
    )
    ours = s[0]
    np.testing.assert_allclose(init, ours(0))
    np.testing.assert_allclose(peak, ours(100))
    np.testing.assert_allclose(end, ours(1000), rtol=1e-3)
    check(*s, [0, 50, 100, 500, 1000, 1200], rtol=1e-5, atol=1e-6)


def test_warmup_cosine_with_exponent():
    kwargs = dict(
        init_value=0.2,
        peak_value=1.21,
        end_value=-3.0,
        warmup_steps=50,
        decay_steps=100,
        exponent=2,
    )
    ours, theirs = both("warmup_cosine_decay_schedule", **kwargs)
    counts = np.array([0, 10, 50, 75, 100])
    expected = [
        0.20000004768371582,
        0.4020000100135803,
        1.2100000381469727,
        -1.947500228881836,
        -3.000000238418579,
    ]
    np.testing.assert_allclose(ours(counts), expected, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(on_counts(ours, counts), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ours(counts), theirs(counts), rtol=1e-6, atol=1e-8)


def test_zero_peak_value():
    kwargs = dict(
        init_value=0.2, peak_value=0, end_value=-3.0, warmup_steps=50, decay_steps=100, exponent=2
    )
    ours, theirs = both("warmup_cosine_decay_schedule", **kwargs)
    counts = np.array([0, 10, 50, 75, 100])
    np.testing.assert_allclose(ours(counts), [0.2, 0.16, 0.0, 0.0, 0.0], rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(on_counts(ours, counts), theirs(counts), rtol=1e-6, atol=1e-7)


def test_monotonicity_and_exponent_ordering():
    kwargs = dict(init_value=0.0, peak_value=1.0, warmup_steps=5, decay_steps=25, end_value=0.1)
    regular = optim.warmup_cosine_decay_schedule(**kwargs, exponent=1.0)
    steep = optim.warmup_cosine_decay_schedule(**kwargs, exponent=2.0)
    steps = np.arange(26)
    values, values2 = regular(steps), steep(steps)
    assert all(values[t] < values[t + 1] for t in range(5))  # warmup increases
    assert float(values[5]) == pytest.approx(1.0, abs=1e-6)  # peak at the boundary
    assert all(values[t] >= values[t + 1] for t in range(5, 25))  # decay is non-increasing
    assert float(values[-1]) == pytest.approx(0.1, abs=1e-6)
    assert all(values2[t] <= values[t] + 1e-12 for t in range(5, 26))  # p=2 below p=1
    np.testing.assert_allclose(
        values, optax.warmup_cosine_decay_schedule(**kwargs)(steps), rtol=1e-6, atol=1e-7
    )


def test_raises_when_decay_equals_warmup():
    kwargs = dict(init_value=0.2, peak_value=1.2, warmup_steps=10, decay_steps=10, end_value=0.0)
    with pytest.raises(ValueError):
        optax.warmup_cosine_decay_schedule(**kwargs)
    with pytest.raises(accy.AccyError, match="must exceed warmup_steps"):
        optim.warmup_cosine_decay_schedule(**kwargs)


# -- SGDRTest ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("lr0", "lr1", "lr2"), [(1.6, 0.8, 0.4), (1.6, 1.6, 1.6)])
def test_sgdr_limits(lr0, lr1, lr2):
    kwargs = [
        {
            "decay_steps": int(step),
            "peak_value": lr,
            "init_value": 0,
            "end_value": 0.0,
            "warmup_steps": 500,
        }
        for step, lr in zip([2e3, 3e3, 5e3], [lr0, lr1, lr2], strict=True)
    ]
    ours, theirs = optim.sgdr_schedule(kwargs), optax.sgdr_schedule(kwargs)
    for count, lr in [(500, lr0), (2500, lr1), (5500, lr2)]:
        np.testing.assert_allclose(lr, ours(count), rtol=1e-6)
    check(ours, theirs, [0, 500, 1999, 2000, 2500, 5000, 5500, 9999, 10000], rtol=1e-5, atol=1e-6)


# -- PiecewiseInterpolateTest, OneCycleTest ------------------------------------------------------


@pytest.mark.slow
def test_linear_piecewise():
    s = both("piecewise_interpolate_schedule", "linear", 200.0, {5: 1.5, 10: 0.25})
    expected = [
        200.0,
        220.0,
        240.0,
        260.0,
        280.0,
        300.0,
        255.0,
        210.0,
        165.0,
        120.0,
        75.0,
        75.0,
        75.0,
    ]
    check(*s, range(13), expected, rtol=1e-5)


@pytest.mark.slow
def test_cos_piecewise():
    s = both("piecewise_interpolate_schedule", "cosine", 400.0, {5: 1.2, 3: 0.6, 7: 1.0})
    check(*s, range(9), [400.0, 360.0, 280.0, 240.0, 264.0, 288.0, 288.0, 288.0, 288.0], rtol=1e-5)


def test_empty_dict():
    check(*both("piecewise_interpolate_schedule", "linear", 13.0, {}), range(5), [13.0] * 5)


def test_no_dict():
    check(*both("piecewise_interpolate_schedule", "cosine", 17.0), range(3), [17.0] * 3)


@pytest.mark.parametrize(("kind", "scales"), [("linar", None), ("", {5: 3.0}), (None, {})])
def test_invalid_type(kind, scales):
    with pytest.raises(ValueError):
        optax.piecewise_interpolate_schedule(kind, 13.0, scales)
    with pytest.raises(accy.AccyError, match="must be 'linear' or 'cosine'"):
        optim.piecewise_interpolate_schedule(kind, 13.0, scales)


def test_invalid_scale():
    with pytest.raises(ValueError):
        optax.piecewise_interpolate_schedule("linear", 13.0, {5: -3})
    with pytest.raises(accy.AccyError, match="non-negative"):
        optim.piecewise_interpolate_schedule("linear", 13.0, {5: -3})


def test_zero_interval_size():
    ours, theirs = both("piecewise_interpolate_schedule", "linear", 13.0, {0: 2.0, 5: 3.0})
    assert all(np.isfinite(ours(i)) for i in range(6))
    assert float(ours(0)) == pytest.approx(26.0) and float(ours(5)) == pytest.approx(78.0)
    check(ours, theirs, range(7))


def test_linear_onecycle():
    s = both(
        "linear_onecycle_schedule",
        transition_steps=10,
        peak_value=1000,
        pct_start=0.3,
        pct_final=0.7,
        div_factor=10.0,
        final_div_factor=100.0,
    )
    expected = [100.0, 400.0, 700.0, 1000.0, 775.0, 550.0, 325.0, 100.0, 67.0, 34.0, 1.0, 1.0]
    check(*s, range(12), expected, rtol=1e-5)


def test_cosine_onecycle():
    s = both(
        "cosine_onecycle_schedule",
        transition_steps=5,
        peak_value=1000.0,
        pct_start=0.4,
        div_factor=10.0,
        final_div_factor=100.0,
    )
    check(*s, range(7), [100.0, 550.0, 1000.0, 750.25, 250.75, 1.0, 1.0], rtol=1e-5)


@pytest.mark.parametrize("name", ["cosine_onecycle_schedule", "linear_onecycle_schedule"])
def test_nonpositive_transition_steps(name):
    with pytest.raises(ValueError):
        getattr(optax, name)(transition_steps=0, peak_value=5.0)
    with pytest.raises(accy.AccyError, match="must be positive"):
        getattr(optim, name)(transition_steps=0, peak_value=5.0)


# -- ScheduleAsLearningRateTest ----------------------------------------------------------------

from tests.peers.test_optax_alias import CASES, make_step, parabola_accy  # noqa: E402


@pytest.mark.parametrize(("name", "kwargs"), CASES)
def test_schedule_as_learning_rate(name, kwargs):
    annotation = inspect.signature(getattr(optax, name)).parameters.get("learning_rate")
    if annotation is None or annotation.annotation not in (
        optax.ScalarOrSchedule,
        optax.Schedule,
    ):  # optax's own condition
        pytest.skip("n/a: optax skips it too (the optimizer takes no learning-rate schedule)")
    factory = getattr(optim, name)
    with_schedule = factory(**dict(kwargs, learning_rate=optim.constant_schedule(1e-3)))
    with_rate = factory(**dict(kwargs, learning_rate=1e-3))
    start = accy.named(np.array([-1.0, 10.0, 1.0], np.float32), ("lane",), device=R)
    results = []
    for opt in (with_schedule, with_rate):
        step, params, state = make_step(opt, parabola_accy), start, opt.init(start)
        for _ in range(10):
            params, state = step(params, state)
        results.append(params.array)
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6)


# -- JoinTest ----------------------------------------------------------------------------------


def test_join_schedules():
    def make(module):
        c = module.constant_schedule
        return module.join_schedules([c(1.0), c(2.0), c(1.0)], boundaries=[3, 6])

    check(make(optim), make(optax), range(8), [1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 1.0, 1.0], atol=0.0)


# -- InjectHyperparamsTest ---------------------------------------------------------------------


def arrays(tree):
    return [np.asarray(x.array) for x in optim.base.tree_leaves(tree)]


def test_inject_updates():
    opt = optim.inject_hyperparams(optim.scale)(
        step_size=optim.piecewise_constant_schedule(3.0, {1: 5, 7: 2, 12: 1.5})
    )
    params = [accy.named(np.float32(0.0), (), device=R)]
    state = accy.jit(opt.init)(params)
    update = accy.jit(opt.update)
    expected = [3.0] * 2 + [15.0] * 6 + [30.0] * 5 + [45.0] * 3
    grads = [accy.named(np.float32(1.0), (), device=R)]
    for i in range(15):
        updates, state = update(grads, state, params=params)
        np.testing.assert_almost_equal(float(updates[0]), expected[i + 1])
    assert update.traces == 1


def test_hyperparams_state():
    opt = optim.inject_hyperparams(optim.trace)(
        decay=optim.piecewise_constant_schedule(0.8, {3: 0.5, 9: 1.25}), nesterov=True
    )
    params = [accy.named(np.zeros((2, 3), np.float32), ("a", "b"), device=R) for _ in range(3)]
    state, update = accy.jit(opt.init)(params), accy.jit(opt.update)
    expected = [0.8] * 4 + [0.4] * 6 + [0.5] * 2
    grads = [p + 1.0 for p in params]
    for i in range(12):
        np.testing.assert_almost_equal(float(state.hyperparams["decay"]), expected[i], decimal=6)
        _, state = update(grads, state)
    np.testing.assert_almost_equal(float(state.hyperparams["decay"]), expected[-1], decimal=6)


def test_constant_hyperparams():
    opt = optim.inject_hyperparams(optim.scale_by_adam)(b1=0.0, b2=0.0)
    params = [accy.named(np.zeros((2, 3), np.float32), ("a", "b"), device=R) for _ in range(3)]
    state, update = accy.jit(opt.init)(params), accy.jit(opt.update)
    grads = [p + 1.0 for p in params]
    for _ in range(5):
        updates, state = update(grads, state, params)
        for name, value in [("b1", 0.0), ("b2", 0.0), ("eps", 1e-8), ("eps_root", 0.0)]:
            np.testing.assert_almost_equal(float(state.hyperparams[name]), value)
        for got, want in zip(arrays(updates), arrays(grads), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-6)


def test_overriding_hyperparam():
    opt = optim.inject_hyperparams(optim.clip_by_global_norm)(0.1)
    params = accy.named(np.zeros((3, 5, 7), np.float32), ("a", "b", "c"), device=R)
    state, update = accy.jit(opt.init)(params), accy.jit(opt.update)
    grads = params + 1.0
    for i in range(5):
        state.hyperparams["max_norm"] = i
        updates, state = update(grads, state)
        assert np.isclose(np.linalg.norm(updates.array.ravel()), i)


@pytest.mark.parametrize("static_args", ["mask", ["mask"]])
def test_static_args(static_args):
    @functools.partial(optim.inject_hyperparams, static_args=static_args)
    def custom_optim(learning_rate, mask):
        return optim.masked(optim.scale(-learning_rate), mask)

    def matrices(tree):
        return optim.base.tree_map(lambda x: len(x.axes) > 1, tree)

    opt = custom_optim(0.1, matrices)
    params = [
        accy.named(np.ones((1, 2), np.float32), ("a", "b"), device=R),
        accy.named(np.ones(2, np.float32), ("b",), device=R),
        accy.named(np.ones((1, 1, 1), np.float32), ("a", "b", "c"), device=R),
    ]
    state = accy.jit(opt.init)(params)
    updates, state = accy.jit(opt.update)(params, state)
    assert set(state.hyperparams) == {"learning_rate"}
    for got, p in zip(arrays(updates), params, strict=True):
        np.testing.assert_allclose(got, -0.1 * p.array if len(p.axes) > 1 else p.array, rtol=1e-6)


@pytest.mark.parametrize("static_args", ["b1", ["b1", "b2"]])
def test_numeric_static_args(static_args):
    opt = optim.inject_hyperparams(optim.scale_by_adam, static_args=static_args)(b1=0.9, b2=0.95)
    params = [accy.named(np.ones((1, 2), np.float32), ("a", "b"), device=R)]
    state = accy.jit(opt.init)(params)
    _, state = accy.jit(opt.update)(params, state)
    names = {static_args} if isinstance(static_args, str) else set(static_args)
    assert not set(state.hyperparams).intersection(names)


def test_prng_key_not_hyperparameter():
    """A random key (an i32 array) is no hyperparameter: it passes through unconverted."""

    def random_noise_optimizer(key, scale):
        def init(params):
            return (key, scale)

        def update(updates, state, params=None):
            key, scale = state
            keys = accy.random.split(key, len(optim.base.tree_leaves(updates)) + 1)
            noise = [
                accy.random.normal(k, u.ty) * scale.convert(u.dtype)
                for k, u in zip(keys, optim.base.tree_leaves(updates), strict=False)
            ]
            return noise, (keys[-1], scale)

        return optim.GradientTransformation(init, update)

    key = accy.named(accy.random.key(17), ("key",), device=R)
    opt = optim.inject_hyperparams(random_noise_optimizer)(key=key, scale=1e-3)
    params = [accy.named(np.ones((1, 2), np.float32), ("a", "b"), device=R)]
    state = accy.jit(opt.init)(params)
    assert set(state.hyperparams) == {"scale"}
    updates, state = accy.jit(opt.update)(params, state)
    assert np.all(np.abs(updates[0].array) < 0.1)


BF16, F32 = accy.bf16, accy.f32


@pytest.mark.parametrize(
    ("hyperparam_dtype", "param_dtype", "grad_dtype"),
    [(BF16, F32, BF16), (BF16, F32, F32), (F32, BF16, BF16), (F32, F32, BF16), (F32, BF16, F32)],
)
def test_hyperparam_dtypes(hyperparam_dtype, param_dtype, grad_dtype):
    opt = optim.inject_hyperparams(optim.scale_by_adam, hyperparam_dtype=hyperparam_dtype)(
        b1=0.9, b2=0.95
    )
    params = [
        accy.named(np.ones(shape, param_dtype.numpy), axes, device=R)
        for shape, axes in [((1, 2), ("a", "b")), ((2,), ("b",)), ((1, 1, 1), ("a", "b", "c"))]
    ]
    grads = [p.convert(grad_dtype) for p in params]
    state = accy.jit(opt.init)(params)
    assert state.hyperparams["b1"].dtype == state.hyperparams["b2"].dtype == hyperparam_dtype
    _, state = accy.jit(opt.update)(grads, state)
    assert state.hyperparams["b1"].dtype == state.hyperparams["b2"].dtype == hyperparam_dtype


@pytest.mark.parametrize("param_dtype", [BF16, F32])
def test_hyperparam_default_dtype(param_dtype):
    params = [
        accy.named(np.ones((1, 2), param_dtype.numpy), ("a", "b"), device=R),
        accy.named(np.ones(2, param_dtype.numpy), ("b",), device=R),
    ]
    for b1, b2 in [(0.9, 0.95), (np.asarray(0.9), np.asarray(0.95))]:
        state = accy.jit(optim.inject_hyperparams(optim.scale_by_adam)(b1=b1, b2=b2).init)(params)
        assert state.hyperparams["b1"].dtype == state.hyperparams["b2"].dtype == param_dtype
    # accy arrays keep their dtype, as optax's non-weak-typed arrays
    b1 = accy.named(np.float32(0.9), (), device=R)
    b2 = accy.named(np.float32(0.95), (), device=R).convert(BF16)
    state = accy.jit(optim.inject_hyperparams(optim.scale_by_adam)(b1=b1, b2=b2).init)(params)
    assert (state.hyperparams["b1"].dtype, state.hyperparams["b2"].dtype) == (F32, BF16)


@pytest.mark.parametrize("static_args", ["lr", ["lr"]])
def test_static_args_error(static_args):
    with pytest.raises(ValueError):
        optax.inject_hyperparams(optax.scale, static_args=static_args)
    with pytest.raises(accy.AccyError, match=r"static_args \['lr'\] are not parameters"):
        optim.inject_hyperparams(optim.scale, static_args=static_args)


def test_inject_hyperparams_starts_with_step_count_zero():
    opt = optim.inject_hyperparams(optim.scale)(lambda count: count)
    params = accy.named(np.zeros(3, np.float32), ("a",), device=R)
    grads = accy.named(np.array([-1.0, 0.0, 1.0], np.float32), ("a",), device=R)
    updates, _ = accy.jit(opt.update)(grads, opt.init(params))
    np.testing.assert_array_equal(updates.array, np.zeros(3))


# -- StatefulTest ------------------------------------------------------------------------------


def test_wrap_stateless_schedule():
    schedule = optim.linear_schedule(1.0, 1.0, 10)
    wrapped = optim.WrappedSchedule(schedule)
    count = 0
    state = wrapped.init()
    assert int(state.count) == count
    for _ in range(8):
        np.testing.assert_allclose(schedule(count), float(wrapped(state)), atol=0.0)
        count += 1
        state = wrapped.update(state, loss=accy.named(np.float32(1.0), (), device=R))
        assert int(state.count) == count


class ExampleState(NamedTuple):
    total: object


class ExampleStatefulSchedule:
    def init(self):
        return ExampleState(accy.named(np.float32(0.0), (), device=R))

    def update(self, state, **extra):
        return ExampleState(state.total + extra["addendum"])

    def __call__(self, state, **extra):
        return state.total


def test_inject_stateful_hyperparams():
    grads = (
        accy.named(np.ones(3, np.float32), ("a",), device=R),
        accy.named(np.ones(2, np.float32), ("b",), device=R),
    )
    tx = optim.inject_hyperparams(optim.scale)(step_size=ExampleStatefulSchedule())
    state = accy.jit(tx.init)(grads)
    addendum = accy.named(np.float32(0.3), (), device=R)
    update = accy.jit(tx.update)
    _, state = update(grads, state, params=grads, addendum=addendum)
    _, state = update(grads, state, params=grads, addendum=addendum)
    np.testing.assert_allclose(float(state.hyperparams["step_size"]), 0.3, atol=0.0)
    np.testing.assert_allclose(float(state.hyperparams_states["step_size"].total), 0.6, rtol=1e-7)
    # optax's numbers in the same run
    their = optax.inject_hyperparams(optax.scale)(step_size=_OptaxExample())
    jax_grads = (jnp.ones(3), jnp.ones(2))
    jax_state = their.init(jax_grads)
    for _ in range(2):
        _, jax_state = their.update(jax_grads, jax_state, jax_grads, addendum=jnp.float32(0.3))
    np.testing.assert_allclose(
        float(state.hyperparams_states["step_size"].total),
        float(jax_state.hyperparams_states["step_size"].total),
        rtol=1e-7,
    )


class _OptaxExample(optax.schedules.StatefulSchedule):
    def init(self):
        return ExampleState(jnp.zeros([], jnp.float32))

    def update(self, state, **extra):
        return ExampleState(state.total + extra["addendum"])

    def __call__(self, state, **extra):
        return state.total
