"""optax's alias tests (optax/_src/alias_test.py, optax 0.2.8), case by case, against optax's
own results computed in the same run.

The common tests run over optax's `_OPTIMIZERS_UNDER_TEST` list: each accy optimizer takes the
same steps from the same start as the optax one (parameters compared after every run), does
not retrace, accepts extra update arguments, works inside `inject_hyperparams` and
`MultiSteps`, keeps the dtypes it is given. Not applicable here: complex parameters (accy has
no complex dtypes), the LBFGS tests (accy has no L-BFGS) and the entries of optax's list for
optimizers accy does not provide (`NOT_PROVIDED`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import accy
from accy import optim

R = "reference"  # the NumPy evaluator: no C compile per optimizer, so the file stays fast

OPTIMIZERS = (  # optax's _OPTIMIZERS_UNDER_TEST, less NOT_PROVIDED
    ("adabelief", {"learning_rate": 1e-2}),
    ("adadelta", {"learning_rate": 0.1}),
    ("adadelta", {}),
    ("adafactor", {"learning_rate": 5e-3}),
    ("adafactor", {}),
    ("adagrad", {"learning_rate": 1.0}),
    ("adam", {"learning_rate": 1e-1}),
    ("adamax", {"learning_rate": 1e-1}),
    ("adamaxw", {"learning_rate": 1e-1}),
    ("adamw", {"learning_rate": 1e-1}),
    ("adan", {"learning_rate": 1e-1}),
    ("amsgrad", {"learning_rate": 1e-1}),
    ("fromage", {"learning_rate": 5e-3}),
    ("lamb", {"learning_rate": 1e-3}),
    ("lars", {"learning_rate": 1.0}),
    ("lion", {"learning_rate": 1e-2, "weight_decay": 1e-4}),
    ("nadam", {"learning_rate": 1e-2}),
    ("nadamw", {"learning_rate": 1e-2}),
    ("novograd", {"learning_rate": 1e-3}),
    ("optimistic_adam_v2", {"learning_rate": 2e-3}),
    ("optimistic_gradient_descent", {"learning_rate": 2e-3, "alpha": 0.7, "beta": 0.1}),
    ("polyak_sgd", {"max_learning_rate": 1.0}),
    ("radam", {"learning_rate": 5e-3}),
    ("rmsprop", {"learning_rate": 5e-3}),
    ("rmsprop", {"learning_rate": 5e-3, "momentum": 0.9}),
    ("rprop", {"learning_rate": 1e-1}),
    ("sgd", {"learning_rate": 1e-3, "momentum": 0.9}),
    ("sign_sgd", {"learning_rate": 1e-1}),
    ("signum", {"learning_rate": 1e-2}),
    ("sm3", {"learning_rate": 1.0}),
    ("yogi", {"learning_rate": 1e-1}),
)
NOT_PROVIDED = (
    "noisy_sgd",  # its noise is drawn from JAX's random stream, which accy's keys do not share
    "optimistic_adam",  # deprecated in optax for optimistic_adam_v2, which is here
)
CASES = [
    pytest.param(name, kwargs, id=f"{name}-{i}") for i, (name, kwargs) in enumerate(OPTIMIZERS)
]
# The optimizers every default run checks in the heavier tests; CI's slow run checks them all.
DEFAULT = {"adam", "adamw", "adafactor", "lion", "polyak_sgd", "rmsprop", "sgd", "sm3"}
SOME_CASES = [
    pytest.param(name, kwargs, id=f"{name}-{i}", marks=() if name in DEFAULT else pytest.mark.slow)
    for i, (name, kwargs) in enumerate(OPTIMIZERS)
]
COMPLEX_NA = "n/a: accy has no complex dtypes"


def slow(value):
    """A parametrisation the default run skips (CI runs it), to keep the file fast."""
    return pytest.param(value, marks=pytest.mark.slow)


STEPS = 12  # optax runs 10000 to convergence: test_optimization_converges (slow) does


# -- targets (optax's _setup_parabola and _setup_rosenbrock) ----------------------------------


def parabola_accy(p):
    d = p - accy.named(np.array([1.0, -1.0, 1.0], np.float32), ("lane",), device=R)
    return (d * d).sum()


def rosenbrock_accy(p):
    x0, x1 = p.slice("lane", 0, 1).sum(), p.slice("lane", 1, 2).sum()
    return (1.0 - x0) * (1.0 - x0) + 100.0 * ((x1 - x0 * x0) * (x1 - x0 * x0))


def parabola_jax(p):
    return jnp.sum((p - jnp.array([1.0, -1.0, 1.0])) ** 2)


def rosenbrock_jax(p):
    return (1.0 - p[0]) ** 2 + 100.0 * (p[1] - p[0] ** 2) ** 2


TARGETS = {
    "parabola": (parabola_accy, parabola_jax, [-1.0, 10.0, 1.0], [1.0, -1.0, 1.0]),
    "rosenbrock": (rosenbrock_accy, rosenbrock_jax, [0.0, 0.0], [1.0, 1.0]),
}


def make_step(opt, objective):
    @accy.jit
    def step(params, state):
        value, grads = accy.value_and_grad(objective)(params)
        updates, state = opt.update(grads, state, params, value=value)  # polyak_sgd reads it
        return optim.apply_updates(params, updates), state

    return step


def optax_run(name, kwargs, objective, start, steps):
    opt = getattr(optax, name)(**kwargs)

    def step(params, state):  # eager: a jax.jit compile per case would cost more than it saves
        value, grads = jax.value_and_grad(objective)(params)
        updates, state = opt.update(grads, state, params, value=value)
        return optax.apply_updates(params, updates), state

    params = jnp.asarray(start, jnp.float32)
    state = opt.init(params)
    for _ in range(steps):
        params, state = step(params, state)
    return np.asarray(params)


# -- AliasTest.test_optimization ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "complex64"])
@pytest.mark.parametrize("target", [slow("parabola"), "rosenbrock"])
@pytest.mark.parametrize(("name", "kwargs"), CASES)
def test_optimization(name, kwargs, target, dtype):
    if dtype == "complex64":
        pytest.skip(COMPLEX_NA)
    accy_objective, jax_objective, start, _ = TARGETS[target]
    opt = getattr(optim, name)(**kwargs)
    step = make_step(opt, accy_objective)
    params = accy.named(np.array(start, np.float32), ("lane",), device=R)
    state = opt.init(params)
    for _ in range(STEPS):
        params, state = step(params, state)
    expected = optax_run(name, kwargs, jax_objective, start, STEPS)
    # RAdam's rectification term cancels catastrophically in f32 at small step counts
    # (ro_inf - 2 t b2^t / (1 - b2^t)): optax's own eager and jitted runs differ by 1e-3 here
    rtol = 3e-3 if name == "radam" else 1e-4
    np.testing.assert_allclose(params.array, expected, rtol=rtol, atol=1e-6)
    # "the optimizer doesn't recompile on 2nd call": one trace over all the steps, and none
    # for a fresh state
    params, state = step(
        accy.named(np.array(start, np.float32), ("lane",), device=R), opt.init(params)
    )
    assert step.traces == 1


@pytest.mark.slow
@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize(("name", "kwargs"), CASES)
def test_optimization_converges(name, kwargs, target):
    if name in ("sign_sgd", "signum") and target == "rosenbrock":
        pytest.skip("n/a: optax skips it too (needs a learning-rate schedule)")
    accy_objective, _, start, final = TARGETS[target]
    opt = getattr(optim, name)(**kwargs)
    step = make_step(opt, accy_objective)
    params = accy.named(np.array(start, np.float32), ("lane",))  # native cpu: 10000 steps
    state = opt.init(params)
    for _ in range(10000):
        params, state = step(params, state)
    if name in ("adadelta", "adafactor") and "learning_rate" not in kwargs:
        pytest.skip("n/a: optax skips it too (needs a learning rate to be stable)")
    np.testing.assert_allclose(params.array, final, rtol=3e-2, atol=3e-2)


# -- test_optimizers_accept_extra_args ------------------------------------------------------------


@pytest.mark.parametrize(("name", "kwargs"), SOME_CASES)
def test_optimizers_accept_extra_args(name, kwargs):
    opt = getattr(optim, name)(**kwargs)
    params = accy.named(np.array([0.0, 0.0], np.float32), ("lane",), device=R)
    state = opt.init(params)

    @accy.jit
    def step(params, state):
        value, grads = accy.value_and_grad(rosenbrock_accy)(params)
        updates, state = opt.update(
            grads, state, params, value=value, unexpected_extra_args_your_optimizer_doesnt_expect=1
        )
        return optim.apply_updates(params, updates), state

    for _ in range(2):
        params, state = step(params, state)
    expected = optax_run(name, kwargs, rosenbrock_jax, [0.0, 0.0], 2)
    np.testing.assert_allclose(params.array, expected, rtol=1e-5, atol=1e-7)


# -- test_optimizers_can_be_wrapped_in_inject_hyperparams ----------------------------------------


def _leaves(tree):
    return [np.asarray(x.array, np.float64) for x in optim.base.tree_leaves(tree)]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "kwargs"), SOME_CASES)
def test_optimizers_can_be_wrapped_in_inject_hyperparams(name, kwargs):
    factory = getattr(optim, name)
    static = ("min_dim_size_to_factor",) if name == "adafactor" else ()
    opt, injected = factory(**kwargs), optim.inject_hyperparams(factory, static)(**kwargs)
    params = [
        accy.named(-np.ones((2, 3), np.float32), ("a", "b"), device=R),
        accy.named(np.ones((2, 5, 2), np.float32), ("a", "b", "c"), device=R),
    ]
    grads = [params[0] * -1.0, params[1] * -1.0]
    value = accy.named(np.float32(0.0), (), device=R)  # polyak_sgd's loss
    updates, state = accy.jit(opt.update)(grads, accy.jit(opt.init)(params), params, value=value)
    updates_i, state_i = accy.jit(injected.update)(
        grads, accy.jit(injected.init)(params), params, value=value
    )
    for got, want in zip(_leaves(updates_i), _leaves(updates), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-3)
    for got, want in zip(_leaves(state_i.inner_state), _leaves(state), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4)
    # and optax's own updates for the same inputs
    jax_params = [-jnp.ones((2, 3)), jnp.ones((2, 5, 2))]
    jax_grads = [jnp.ones((2, 3)), -jnp.ones((2, 5, 2))]
    jax_opt = getattr(optax, name)(**kwargs)
    jax_updates, _ = jax_opt.update(
        jax_grads, jax_opt.init(jax_params), jax_params, value=jnp.array(0.0)
    )
    for got, want in zip(_leaves(updates), jax_updates, strict=True):
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-5, atol=1e-7)


# -- test_explicit_dtype --------------------------------------------------------------------------

DTYPES = {"bfloat16": accy.bf16, "float32": accy.f32, None: None}


@pytest.mark.parametrize("opt_name", ["sgd_mom", "adam", "adamw"])
@pytest.mark.parametrize("state_dtype", ["bfloat16", "float32", "complex64", None])
@pytest.mark.parametrize("params_dtype", ["bfloat16", "float32", "complex64", None])
def test_explicit_dtype(params_dtype, state_dtype, opt_name):
    if "complex64" in (params_dtype, state_dtype):
        pytest.skip(COMPLEX_NA)
    if opt_name == "sgd_mom":
        opt = optim.sgd(0.1, momentum=0.9, accumulator_dtype=state_dtype)
        jax_opt = optax.sgd(0.1, momentum=0.9, accumulator_dtype=state_dtype)
        attribute = "trace"
    else:
        opt = getattr(optim, opt_name)(0.1, mu_dtype=state_dtype)
        jax_opt = getattr(optax, opt_name)(0.1, mu_dtype=state_dtype)
        attribute = "mu"
    dtype = DTYPES[params_dtype] or accy.f32
    params = accy.named(np.zeros(2, dtype.numpy), ("lane",), device=R)
    got = getattr(opt.init(params)[0], attribute).dtype
    jax_params = jnp.zeros(2, jax.dtypes.canonicalize_dtype(params_dtype))
    want = optax.tree.get(jax_opt.init(jax_params), attribute).dtype
    assert got.numpy == np.dtype(want)


# -- test_preserve_dtype --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [slow("bfloat16"), "float32"])
@pytest.mark.parametrize(("name", "kwargs"), SOME_CASES)
def test_preserve_dtype(name, kwargs, dtype):
    opt = getattr(optim, name)(**kwargs)
    accy_dtype = DTYPES[dtype]
    params = accy.named(np.array([1.0, 2.0], accy_dtype.numpy), ("lane",), device=R)
    value, grads = accy.value_and_grad(lambda x: (x * x).sum())(params)
    updates, _ = accy.jit(opt.update)(grads, accy.jit(opt.init)(params), params, value=value)
    assert updates.dtype == grads.dtype == accy_dtype
    jax_opt = getattr(optax, name)(**kwargs)
    jax_params = jnp.array([1.0, 2.0], dtype)
    jax_value, jax_grads = jax.value_and_grad(lambda x: jnp.sum(x**2))(jax_params)
    want, _ = jax_opt.update(jax_grads, jax_opt.init(jax_params), jax_params, value=jax_value)
    # bf16: accy computes in f32 and rounds once, optax rounds after every operation
    tolerance = 2e-2 if dtype == "bfloat16" else 1e-6
    np.testing.assert_allclose(
        np.asarray(updates.array, np.float32), np.asarray(want, np.float32), rtol=tolerance
    )


# -- test_state_shape_dtype_shard_stability -------------------------------------------------------


@pytest.mark.parametrize(
    "dtype", [slow("float16"), "bfloat16", slow("float32"), slow("float64"), "complex64"]
)
@pytest.mark.parametrize(("name", "kwargs"), SOME_CASES)
def test_state_shape_dtype_shard_stability(name, kwargs, dtype):
    if dtype == "complex64":
        pytest.skip(COMPLEX_NA)
    accy_dtype = {"float16": accy.f16, "float64": accy.f64}.get(dtype) or DTYPES[dtype]
    opt = getattr(optim, name)(**kwargs)
    start = accy.named(np.array([-1.0, 10.0, 1.0], accy_dtype.numpy), ("lane",), device=R)
    final = np.array([1.0, -1.0, 1.0], accy_dtype.numpy)

    def objective(p):
        d = p - accy.named(final, ("lane",), device=R)
        return (d * d).sum()

    step = make_step(opt, objective)
    params, state = start, opt.init(start)
    types = [leaf.ty for leaf in optim.base.tree_leaves(state)]
    for _ in range(2):
        params, state = step(params, state)
        assert params.dtype == accy_dtype
        assert [leaf.ty for leaf in optim.base.tree_leaves(state)] == types
    assert step.traces == 1


# -- test_gradient_accumulation -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["bfloat16", slow("float32")])
@pytest.mark.parametrize(("name", "kwargs"), SOME_CASES)
def test_gradient_accumulation(name, kwargs, dtype):
    opt = optim.MultiSteps(getattr(optim, name)(**kwargs), every_k_schedule=4)
    params = accy.named(np.array([1.0, 2.0], DTYPES[dtype].numpy), ("lane",), device=R)
    value, grads = accy.value_and_grad(lambda x: (x * x).sum())(params)
    updates, _ = accy.jit(opt.update)(grads, accy.jit(opt.init)(params), params, value=value)
    assert updates.dtype == grads.dtype
    assert np.array_equal(np.asarray(updates.array, np.float32), np.zeros(2, np.float32))


def test_the_optimizers_optax_tests_that_accy_does_not_provide_are_named():
    for name in NOT_PROVIDED:
        assert not hasattr(optim, name) and hasattr(optax, name)
