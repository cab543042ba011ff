"""accy.optim over trees of named arrays (any float dtype), eagerly and under accy.jit, against
NumPy implementations of the update rules; accy.nn on named arrays."""

from __future__ import annotations

import numpy as np
import pytest

import accy

R = "reference"


def numpy_adam(params, grads, m, v, t, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    m = b1 * m + (1 - b1) * grads
    v = b2 * v + (1 - b2) * grads**2
    update = (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    return params - lr * update, m, v


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adam_over_a_tree_eagerly_and_jitted(dtype):
    w = np.array([[1.0, -2.0], [0.5, 3.0]], dtype)
    b = np.array([0.1, -0.1], dtype)
    params = {"w": accy.named(w, ("i", "o"), device=R), "b": accy.named(b, ("o",), device=R)}

    def loss(p):
        return ((p["w"] * p["w"]).sum("i") * p["b"]).sum()

    adam = accy.optim.Adam(learning_rate=0.1)

    @accy.jit
    def step(p, state):
        grads = accy.grad(loss)(p)
        return adam.apply(p, grads, state)

    eager_params, eager_state = params, adam.init(params)
    jit_params, jit_state = params, adam.init(params)
    mw, vw, mb, vb = (np.zeros_like(x) for x in (w, w, b, b))
    nw, nb = w.copy(), b.copy()
    for t in (1, 2, 3):
        gw, gb = 2 * nw * nb, (nw * nw).sum(0)  # hand derivation of loss's gradient
        nw, mw, vw = numpy_adam(nw, gw, mw, vw, t, lr=0.1)
        nb, mb, vb = numpy_adam(nb, gb, mb, vb, t, lr=0.1)
        grads = accy.grad(loss)(eager_params)
        eager_params, eager_state = adam.apply(eager_params, grads, eager_state)
        jit_params, jit_state = step(jit_params, jit_state)
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    for got in (eager_params, jit_params):
        assert got["w"].array.dtype == dtype
        np.testing.assert_allclose(got["w"].array, nw, rtol=tolerance, atol=tolerance)
        np.testing.assert_allclose(got["b"].array, nb, rtol=tolerance, atol=tolerance)
    assert jit_state.step.item() == 3.0 and step.traces == 1


def test_sgd_with_momentum_and_a_scheduled_learning_rate():
    x = accy.named(np.array([1.0, -1.0]), ("lane",), device=R)
    sgd = accy.optim.SGD(momentum=0.5)
    state = sgd.init([x])
    params = [x]
    velocity, value = np.zeros(2), x.array.copy()
    for rate in (0.1, 0.05):
        grads = [params[0] * 2.0]  # d/dx sum(x^2)
        params, state = sgd.apply(params, grads, state, learning_rate=rate)
        velocity = 0.5 * velocity + 2 * value
        value = value - rate * velocity
    np.testing.assert_allclose(params[0].array, value, rtol=1e-12)


def test_training_step_program_takes_float64_parameters():
    loss = accy.trace.define("l", [accy.spec(accy.f64, n=2)], lambda b, a: (a[0] * a[0]).sum())
    step = accy.optim.training_step(loss, 1, accy.optim.Adam(learning_rate=0.1))
    state = accy.optim.initial_state(accy.optim.Adam(), [np.ones(2)])
    assert state[0].dtype == np.float64
    _, new, m, v = accy.reference.run(step, [np.ones(2), *state, 1.0, 0.1])
    expected, _, _ = numpy_adam(np.ones(2), 2 * np.ones(2), 0, 0, 1, lr=0.1)
    # the learning rate input is float32 (0.1 is 0.10000000149...), converted to float64
    np.testing.assert_allclose(new, expected, rtol=1e-8)


def test_apply_misuse():
    x = accy.named(np.array([1.0]), ("a",), device=R)
    sgd = accy.optim.SGD()
    with pytest.raises(accy.AccyError, match="does not have the parameters' structure"):
        sgd.apply({"x": x}, [x], sgd.init({"x": x}))


def test_nn_functions_take_named_arrays():
    logits = np.array([[1.0, 2.0, 0.5], [0.0, 0.0, 3.0]])
    x = accy.named(logits, ("batch", "vocab"), device=R)
    labels = accy.named(np.eye(3)[[1, 2]], ("batch", "vocab"), device=R)
    shifted = logits - logits.max(1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    np.testing.assert_allclose(
        accy.nn.cross_entropy(x, labels, "vocab").array, -log_softmax[[0, 1], [1, 2]]
    )
    np.testing.assert_allclose(accy.nn.relu(x - 1.0).array, np.maximum(logits - 1.0, 0))
    np.testing.assert_allclose(
        accy.nn.gelu_tanh(x).array,
        0.5 * logits * (1 + np.tanh(np.sqrt(2 / np.pi) * (logits + 0.044715 * logits**3))),
    )
