"""accy.optim's transformations against optax where the peer tests do not reach: Muon's
Newton–Schulz on matrices with Adam elsewhere, Adafactor's factored moments, MultiSteps over
several accumulation windows, decay masks, state dtypes, 16-bit Adam; and the errors."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import accy
from accy import optim

R = "reference"
RNG = np.random.default_rng(0)


def tree_pair(shapes):
    """The same random parameters as an accy tree (axes a0, a1, ...) and a JAX tree."""
    arrays = {k: RNG.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    ours = {
        k: accy.named(v, tuple(f"{k}{i}" for i in range(v.ndim)), device=R)
        for k, v in arrays.items()
    }
    return ours, {k: jnp.asarray(v) for k, v in arrays.items()}


def run_both(ours_opt, their_opt, shapes, steps=3, grad_seed=1):
    """`steps` updates of both optimizers on the same gradients; the updates compared."""
    params, jax_params = tree_pair(shapes)
    rng = np.random.default_rng(grad_seed)
    grads_list = [
        {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()} for _ in range(steps)
    ]
    update = accy.jit(ours_opt.update)
    state, jax_state = ours_opt.init(params), their_opt.init(jax_params)
    for grads in grads_list:
        g = {k: accy.named(v, params[k].axes, device=R) for k, v in grads.items()}
        updates, state = update(g, state, params)
        jax_updates, jax_state = their_opt.update(
            {k: jnp.asarray(v) for k, v in grads.items()}, jax_state, jax_params
        )
        for k in shapes:
            np.testing.assert_allclose(
                updates[k].array, np.asarray(jax_updates[k]), rtol=2e-5, atol=1e-6
            )
        params = optim.apply_updates(params, updates)
        jax_params = optax.apply_updates(jax_params, jax_updates)
    assert update.traces == 1
    return state


@pytest.mark.slow
def test_muon_orthogonalises_matrices_and_adams_the_rest_as_optax():
    shapes = {"w": (4, 6), "tall": (6, 3), "b": (6,)}
    run_both(
        optim.muon(0.02, weight_decay=0.01), optax.contrib.muon(0.02, weight_decay=0.01), shapes
    )


@pytest.mark.slow
def test_muon_matrix_axes_pick_the_matrices_by_name():
    params = {
        "stack": accy.named(
            RNG.normal(size=(2, 3, 4)).astype(np.float32), ("layer", "embed", "mlp"), device=R
        ),
        "w": accy.named(RNG.normal(size=(3, 4)).astype(np.float32), ("embed", "mlp"), device=R),
    }

    def matrix_axes(leaf):  # "layer" is a batch axis of stacked matrices
        return ("embed", "mlp") if {"embed", "mlp"} <= set(leaf.axes) else None

    opt = optim.muon(0.02, matrix_axes=matrix_axes)
    updates, _ = opt.update(params, opt.init(params), params)
    jax_opt = optax.contrib.muon(
        0.02,
        muon_weight_dimension_numbers=lambda p: {
            "stack": optax.contrib.MuonDimensionNumbers(reduction_axis=1, output_axis=2),
            "w": optax.contrib.MuonDimensionNumbers(reduction_axis=0, output_axis=1),
        },
    )
    jax_params = {k: jnp.asarray(v.array) for k, v in params.items()}
    want, _ = jax_opt.update(jax_params, jax_opt.init(jax_params), jax_params)
    for k in params:
        np.testing.assert_allclose(updates[k].array, np.asarray(want[k]), rtol=2e-5, atol=1e-6)


@pytest.mark.slow
def test_adafactor_factors_the_two_largest_axes_as_optax():
    shapes = {"matrix": (3, 5), "cube": (2, 4, 3), "vector": (5,)}
    run_both(
        optim.adafactor(0.01, min_dim_size_to_factor=2, momentum=0.9, weight_decay_rate=0.01),
        optax.adafactor(0.01, min_dim_size_to_factor=2, momentum=0.9, weight_decay_rate=0.01),
        shapes,
    )
    params, _ = tree_pair(shapes)
    state = optim.adafactor(0.01, min_dim_size_to_factor=2).init(params)[0]
    assert state.v_row["cube"].axes == ("cube0", "cube2")  # without the largest axis, cube1
    assert state.v_col["cube"].axes == ("cube0", "cube1")  # without the second largest, cube2


@pytest.mark.parametrize("use_grad_mean", [True, False])
@pytest.mark.slow
def test_multisteps_accumulates_over_windows_as_optax(use_grad_mean):
    ours = optim.MultiSteps(optim.adam(0.1), every_k_schedule=3, use_grad_mean=use_grad_mean)
    theirs = optax.MultiSteps(optax.adam(0.1), every_k_schedule=3, use_grad_mean=use_grad_mean)
    state = run_both(ours, theirs, {"w": (2, 3)}, steps=7)
    assert int(state.mini_step) == 1 and int(state.gradient_step) == 2


@pytest.mark.slow
def test_adamw_mask_by_a_predicate_and_schedules_as_optax():
    shapes = {"w": (3, 2), "b": (2,)}

    def decay(params):
        return {k: k == "w" for k in params}

    schedule = optim.warmup_cosine_decay_schedule(0.0, 0.1, 1, 5)
    jax_schedule = optax.warmup_cosine_decay_schedule(0.0, 0.1, 1, 5)
    run_both(
        optim.chain(
            optim.clip_by_global_norm(0.5), optim.adamw(schedule, weight_decay=0.1, mask=decay)
        ),
        optax.chain(
            optax.clip_by_global_norm(0.5), optax.adamw(jax_schedule, weight_decay=0.1, mask=decay)
        ),
        shapes,
        steps=4,
    )


@pytest.mark.parametrize("nesterov", [False, True])
def test_lion_and_sgd_nesterov_as_optax(nesterov):
    shapes = {"w": (2, 2)}
    run_both(optim.lion(0.01, weight_decay=0.1), optax.lion(0.01, weight_decay=0.1), shapes)
    run_both(
        optim.sgd(0.1, momentum=0.9, nesterov=nesterov),
        optax.sgd(0.1, momentum=0.9, nesterov=nesterov),
        shapes,
    )


def test_mu_dtype_keeps_the_first_moment_in_bf16():
    params = {"w": accy.named(np.ones((2, 2), np.float32), ("a", "b"), device=R)}
    opt = optim.adam(0.1, mu_dtype=accy.bf16)
    state = opt.init(params)
    _, state = accy.jit(opt.update)(params, state, params)
    assert state[0].mu["w"].dtype == accy.bf16 and state[0].nu["w"].dtype == accy.f32


def test_adam_on_f16_computes_the_update_in_f32():
    """eps = 1e-8 is 0 in f16: computed in f16, a zero gradient's update is 0 / 0 = NaN."""
    params = [accy.named(np.array([1.0, 2.0], np.float16), ("a",), device=R)]
    grads = [accy.named(np.array([0.0, 1e-3], np.float16), ("a",), device=R)]
    for opt in (optim.adam(0.1), optim.adamw(0.1)):
        updates, state = opt.update(grads, opt.init(params), params)
        assert updates[0].dtype == accy.f16
        assert np.all(np.isfinite(updates[0].array.astype(np.float32)))
        np.testing.assert_allclose(
            updates[0].array.astype(np.float32), [-0.0 - 0.1e-4 * 1.0, -0.1], atol=2e-4
        )
    # the classes too
    adam = optim.Adam(learning_rate=0.1)
    new, _ = adam.apply(params, grads, adam.init(params))
    assert np.all(np.isfinite(new[0].array.astype(np.float32)))


def test_inject_hyperparams_changes_the_learning_rate_without_retracing():
    params = {"w": accy.named(np.ones(2, np.float32), ("a",), device=R)}
    opt = optim.inject_hyperparams(optim.adamw)(learning_rate=0.1, weight_decay=0.0)
    update = accy.jit(opt.update)
    state = opt.init(params)
    first, state = update(params, state, params)
    state.hyperparams["learning_rate"] = accy.named(np.float32(0.01), (), device=R)
    second, state = update(params, state, params)
    assert update.traces == 1
    ratio = second["w"].array / first["w"].array
    np.testing.assert_allclose(ratio, 0.1, rtol=1e-5)  # adam's direction is ±1 on these steps


# -- errors ------------------------------------------------------------------------------------


def test_misuse_is_an_accy_error_naming_what_is_wrong():
    params = {"w": accy.named(np.ones(2, np.float32), ("a",), device=R)}
    opt = optim.adam(0.1)
    with pytest.raises(
        accy.AccyError, match="updates, parameters and state must be trees of the same structure"
    ):
        opt.update({"w": params["w"], "x": params["w"]}, opt.init(params))
    with pytest.raises(accy.AccyError, match="argument 1 is float, not a GradientTransformation"):
        optim.chain(optim.scale(1.0), 0.5)
    with pytest.raises(accy.AccyError, match="not a floating-point dtype"):
        optim.adam(0.1, mu_dtype="int32")
    with pytest.raises(accy.AccyError, match="its leaves must be Python bools"):
        optim.adamw(0.1, mask={"w": "yes"}).init(params)
    with pytest.raises(accy.AccyError, match="is not a tree prefix"):
        optim.adamw(0.1, mask={"v": True}).init(params)
    with pytest.raises(accy.AccyError, match="needs the parameters"):
        optim.adamw(0.1).update(params, optim.adamw(0.1).init(params))
    with pytest.raises(accy.AccyError, match="matrix_axes gave"):
        m = optim.muon(0.1, matrix_axes=lambda leaf: ("a", "zz"))
        m.update(params, m.init(params), params)
    with pytest.raises(accy.AccyError, match="every_k_schedule=0 must be >= 1"):
        optim.MultiSteps(optim.sgd(0.1), 0)
    with pytest.raises(accy.AccyError, match="cosine_decay_schedule: decay_steps=0"):
        optim.cosine_decay_schedule(1.0, 0)
    with pytest.raises(accy.AccyError, match="3 schedules need 2 boundaries"):
        optim.join_schedules([optim.constant_schedule(1.0)] * 3, [1])
    with pytest.raises(accy.AccyError, match="unexpected keyword"):
        optim.inject_hyperparams(optim.sgd)(learning_rate=0.1, momentom=0.9)


@pytest.mark.parametrize("bias_correction", [False, True])
def test_centred_rmsprop_and_ema_as_optax(bias_correction):
    # initial_scale keeps the first step's variance away from 0: with bias correction and a
    # zero start, E[g^2] - E[g]^2 is rounding noise (0 in exact arithmetic) divided by eps
    kwargs = dict(centered=True, momentum=0.9, bias_correction=bias_correction, initial_scale=0.5)
    shapes = {"w": (2, 3)}
    run_both(optim.rmsprop(0.01, **kwargs), optax.rmsprop(0.01, **kwargs), shapes)
    run_both(
        optim.chain(optim.ema(0.9), optim.scale(-0.1)),
        optax.chain(optax.ema(0.9), optax.scale(-0.1)),
        shapes,
    )
