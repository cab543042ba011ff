"""optax's clipping tests (optax/transforms/_clipping_test.py, optax 0.2.8), case by case, with
optax's own results computed in the same run. optax's positional axes become names here:
`axis=(0, 1, 2)` is `axes=("h", "w", "d")`, and the batch axis of per-example clipping is
the axis named "batch"."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from optax.transforms import _clipping

import accy
from accy import optim

R = "reference"
STEPS = 50


def named(values, axes):
    return accy.named(np.asarray(values, np.float32), axes, device=R)


@pytest.fixture
def per_step_updates():
    return (named([500.0, 5.0], ("a",)), named([300.0, 3.0], ("a",)))


JAX_UPDATES = (jnp.array([500.0, 5.0]), jnp.array([300.0, 3.0]))
JAX_PARAMS = (jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0]))


def arrays(tree):
    return [np.asarray(x.array) for x in optim.base.tree_leaves(tree)]


def assert_trees_close(got, want, **tolerance):
    for g, w in zip(arrays(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, np.asarray(w), **tolerance)


def test_clip(per_step_updates):
    clipped, _ = optim.clip(1e6).update(per_step_updates, None)
    assert_trees_close(clipped, JAX_UPDATES)
    clipped, _ = optim.clip(1.0).update(per_step_updates, None)
    assert_trees_close(clipped, _clipping.clip(1.0).update(JAX_UPDATES, None)[0])
    assert_trees_close(clipped, jax.tree.map(jnp.ones_like, JAX_UPDATES))


def rms(x):
    return float(np.sqrt(np.mean(np.asarray(x.array, np.float64) ** 2)))


def test_clip_by_block_rms(per_step_updates):
    updates, jax_updates = per_step_updates, JAX_UPDATES
    for i in range(1, STEPS + 1):
        clipper, jax_clipper = (
            optim.clip_by_block_rms(1.0 / i),
            _clipping.clip_by_block_rms(1.0 / i),
        )
        updates, _ = clipper.update(updates, None)
        jax_updates, _ = jax_clipper.update(jax_updates, None)
        assert rms(updates[0]) == pytest.approx(1.0 / i, abs=1e-7)
        assert rms(updates[1]) == pytest.approx(1.0 / i, abs=1e-7)
        assert_trees_close(updates, jax_updates, rtol=1e-6)
        # continuously clipping causes no numerical issues
        step, _ = clipper.update(per_step_updates, None)
        assert_trees_close(updates, [np.asarray(x.array) for x in step], rtol=1e-6)


def test_clip_by_global_norm(per_step_updates):
    updates, jax_updates = per_step_updates, JAX_UPDATES
    for i in range(1, STEPS + 1):
        clipper, jax_clipper = (
            optim.clip_by_global_norm(1.0 / i),
            _clipping.clip_by_global_norm(1.0 / i),
        )
        updates, _ = clipper.update(updates, None)
        jax_updates, _ = jax_clipper.update(jax_updates, None)
        assert float(optim.global_norm(updates)) == pytest.approx(1.0 / i, abs=1e-6)
        assert_trees_close(updates, jax_updates, rtol=1e-6)
        step, _ = clipper.update(per_step_updates, None)
        assert_trees_close(updates, [np.asarray(x.array) for x in step], rtol=1e-6)


CONV3D = ("h", "w", "d", "i", "o")


@pytest.mark.slow
def test_adaptive_grad_clip_with_axis():
    conv3d_grad, conv3d_param = (
        named(np.full((2, 2, 2, 3, 4), 2.0), CONV3D),
        named(np.ones((2, 2, 2, 3, 4)), CONV3D),
    )
    linear_grad, linear_param = (
        named(np.full((5, 6), 3.0), ("i", "o")),
        named(np.ones((5, 6)), ("i", "o")),
    )
    spatial = ("h", "w", "d")
    clipped_conv3d = optim.adaptive_grad_clip(0.5, axes=spatial).update(
        [conv3d_grad], None, [conv3d_param]
    )[0][0]
    clipped_linear = optim.adaptive_grad_clip(0.5).update([linear_grad], None, [linear_param])[0][0]
    assert clipped_conv3d.shape == conv3d_grad.shape and clipped_linear.shape == linear_grad.shape
    assert np.all(
        optim.unitwise_norm(clipped_conv3d, spatial).array
        <= 0.5 * optim.unitwise_norm(conv3d_param, spatial).array + 1e-6
    )
    assert np.all(
        optim.unitwise_norm(clipped_linear).array
        <= 0.5 * optim.unitwise_norm(linear_param).array + 1e-6
    )
    # against optax's clipped values
    want_conv3d = _clipping.adaptive_grad_clip(0.5, axis=(0, 1, 2)).update(
        [jnp.ones((2, 2, 2, 3, 4)) * 2.0], None, [jnp.ones((2, 2, 2, 3, 4))]
    )[0][0]
    want_linear = _clipping.adaptive_grad_clip(0.5).update(
        [jnp.ones((5, 6)) * 3.0], None, [jnp.ones((5, 6))]
    )[0][0]
    np.testing.assert_allclose(clipped_conv3d.array, want_conv3d, rtol=1e-6)
    np.testing.assert_allclose(clipped_linear.array, want_linear, rtol=1e-6)
    small = named(np.full((2, 2, 2, 3, 4), 0.1), CONV3D)
    unclipped = optim.adaptive_grad_clip(2.0, axes=spatial).update([small], None, [conv3d_param])
    np.testing.assert_allclose(unclipped[0][0].array, small.array, rtol=1e-6)


def test_adaptive_grad_clip_default_axis_conv3d():
    grad, param = (
        named(np.full((2, 2, 2, 3, 4), 2.0), CONV3D),
        named(np.ones((2, 2, 2, 3, 4)), CONV3D),
    )
    clipped = optim.adaptive_grad_clip(0.5).update([grad], None, [param])[0][0]
    assert clipped.shape == grad.shape
    np.testing.assert_allclose(
        optim.unitwise_norm(clipped).array, optim.unitwise_norm(clipped, CONV3D[:4]).array
    )
    assert np.all(
        optim.unitwise_norm(clipped).array <= 0.5 * optim.unitwise_norm(param).array + 1e-6
    )
    want = _clipping.adaptive_grad_clip(0.5).update(
        [jnp.ones((2, 2, 2, 3, 4)) * 2.0], None, [jnp.ones((2, 2, 2, 3, 4))]
    )[0][0]
    np.testing.assert_allclose(clipped.array, want, rtol=1e-6)


def test_unitwise_norm_with_axis():
    values = np.arange(2 * 2 * 2 * 3 * 4, dtype=np.float32).reshape(2, 2, 2, 3, 4)
    x, jx = named(values, CONV3D), jnp.asarray(values)
    for axes, positions in [
        (("h", "w", "d"), (0, 1, 2)),
        (("i", "o"), (3, 4)),
        ("o", -1),
        (None, None),
        (CONV3D[:4], (0, 1, 2, 3)),
    ]:
        got = optim.unitwise_norm(x, axes)
        assert got.shape == x.shape
        np.testing.assert_allclose(
            got.array, _clipping.unitwise_norm(jx, axis=positions), rtol=1e-6
        )
    x2 = named([[1.0, 2.0], [3.0, 4.0]], ("i", "o"))
    np.testing.assert_allclose(
        optim.unitwise_norm(x2).array, _clipping.unitwise_norm(jnp.array([[1.0, 2.0], [3.0, 4.0]]))
    )
    x6 = named(np.ones((2,) * 6), ("a", "b", "c", "d", "e", "f"))
    with pytest.raises(accy.AccyError, match="no default norm axes"):
        optim.unitwise_norm(x6)
    assert optim.unitwise_norm(x6, ("a", "b", "c")).shape == x6.shape


def test_adaptive_grad_clip(per_step_updates):
    params = (named([1.0, 2.0], ("a",)), named([3.0, 4.0], ("a",)))
    updates, jax_updates = per_step_updates, JAX_UPDATES
    for i in range(1, STEPS + 1):
        clip_r = 1.0 / i
        clipper = optim.adaptive_grad_clip(clip_r)
        updates, _ = clipper.update(updates, None, params)
        jax_updates, _ = _clipping.adaptive_grad_clip(clip_r).update(jax_updates, None, JAX_PARAMS)
        for u, p in zip(updates, params, strict=True):
            u_norm, p_norm = optim.unitwise_norm(u).array, optim.unitwise_norm(p).array
            assert np.all(u_norm - clip_r * p_norm < 1e-6)
        assert_trees_close(updates, jax_updates, rtol=1e-5)
        step, _ = clipper.update(per_step_updates, None, params)
        assert_trees_close(updates, [np.asarray(x.array) for x in step], rtol=1e-6)
    grads_small = [named([[1.0, 2.0], [3.0, 4.0]], ("i", "o"))]
    params_small = [named(np.ones((2, 2)), ("i", "o"))]
    clipped = optim.adaptive_grad_clip(1.0).update(grads_small, None, params_small)[0][0]
    assert np.all(
        optim.unitwise_norm(clipped).array <= optim.unitwise_norm(params_small[0]).array + 1e-6
    )


@pytest.mark.slow
def test_per_example_global_norm_clip():
    first = [[0, -0.5], [3, 4], [5, 6], [0, 0]]
    second = [[0], [5], [-3], [0]]
    grads = [named(first, ("batch", "x")), named(second, ("batch", "y"))]
    total, clipped = optim.per_example_global_norm_clip(grads, l2_norm_clip=1.0)
    jax_grads = [jnp.array(first, jnp.float32), jnp.array(second, jnp.float32)]
    want, want_clipped = _clipping.per_example_global_norm_clip(jax_grads, l2_norm_clip=1.0)
    answer = [
        np.array([0, -0.5]) + np.array([3, 4]) / np.sqrt(50) + np.array([5, 6]) / np.sqrt(70),
        np.array([0]) + np.array([5]) / np.sqrt(50) + np.array([-3]) / np.sqrt(70),
    ]
    for got, w, a in zip(total, want, answer, strict=True):
        np.testing.assert_allclose(got.array, a, atol=1e-6)
        np.testing.assert_allclose(got.array, w, atol=1e-6)
    assert int(clipped) == int(want_clipped) == 2


@pytest.mark.parametrize("uniform", [True, False])
def test_per_example_layer_norm_clip(uniform):
    first = np.array([[0.5], [1.5], [-2.0], [3.0]], np.float32)
    second = np.ones((4, 3, 3, 2), np.float32)
    grads = [named(first, ("batch", "x")), named(second, ("batch", "h", "w", "c"))]
    clip = np.sqrt(2.0) if uniform else np.sqrt(19.0)
    total, clipped = optim.per_example_layer_norm_clip(grads, clip, uniform=uniform)
    want, want_clipped = _clipping.per_example_layer_norm_clip(
        [jnp.asarray(first), jnp.asarray(second)], jnp.float32(clip), uniform=uniform
    )
    assert float(total[0].array[0]) == pytest.approx(1.5, abs=1e-6)
    expected = 4 / np.sqrt(18) if uniform else 4.0
    np.testing.assert_allclose(total[1].array, np.full((3, 3, 2), expected), atol=1e-4)
    for got, w in zip(total, want, strict=True):
        np.testing.assert_allclose(got.array, w, rtol=1e-5)
    assert [int(c) for c in clipped] == [int(c) for c in want_clipped]
    assert [int(c) for c in clipped] == ([3, 4] if uniform else [3, 0])


def test_per_example_clipping_needs_the_batch_axis():
    with pytest.raises(accy.AccyError, match="no batch axis 'batch'"):
        optim.per_example_global_norm_clip([named([1.0], ("x",))], 1.0)


def test_adaptive_grad_clip_needs_params(per_step_updates):
    with pytest.raises(accy.AccyError, match="needs the parameters"):
        optim.adaptive_grad_clip(1.0).update(per_step_updates, None)
