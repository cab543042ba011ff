"""Training steps (value_and_grad + Adam over a parameter tree) sharded by the axis mapping
alone give the parameters one device gives: data parallel and ZeRO/FSDP-style sharding."""

from __future__ import annotations

import numpy as np
import pytest

import accy


def loss(params, x, y):
    h = (x.contract(params["w1"], "feature") + params["b1"]).tanh()
    p = h.contract(params["w2"], "hidden").logistic()
    return -(y * p.log() + (1.0 - y) * (1.0 - p).log()).mean("batch")


ADAM = accy.optim.Adam(learning_rate=0.05)


def step(params, state, x, y):
    value, grads = accy.value_and_grad(loss)(params, x, y)
    params, state = ADAM.apply(params, grads, state)
    return params, state, value


def problem():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 3)).astype(np.float32)
    params = {
        "w1": accy.named(
            rng.standard_normal((3, 8)).astype(np.float32) * 0.5, ("feature", "hidden")
        ),
        "b1": accy.named(np.zeros(8, np.float32), ("hidden",)),
        "w2": accy.named(rng.standard_normal(8).astype(np.float32) * 0.5, ("hidden",)),
    }
    data = accy.named(x, ("batch", "feature"))
    labels = accy.named((x.sum(1) > 0).astype(np.float32), ("batch",))
    return params, data, labels


def train(step_fn, steps=3):
    params, x, y = problem()
    state = ADAM.init(params)
    for _ in range(steps):
        params, state, value = step_fn(params, state, x, y)
    return params, value


@pytest.mark.slow
@pytest.mark.parametrize(
    ("devices", "mapping", "device"),
    (
        (2, {"batch": "data"}, "cpu"),
        (4, {"batch": "data"}, "reference"),
        (8, {"batch": "data"}, "reference"),
        (4, {"batch": "data", "hidden": "data"}, "cpu"),
        (8, {"batch": "data", "hidden": "data"}, "reference"),
    ),
    ids=("dp2-cpu", "dp4", "dp8", "fsdp4-cpu", "fsdp8"),
)
def test_sharded_training_matches_one_device(devices, mapping, device):
    want, want_loss = train(accy.jit(step))
    sharded = accy.shard(step, accy.Mesh(range(devices), "data"), mapping, device=device)
    got, got_loss = train(sharded)
    assert float(got_loss.array) == pytest.approx(float(want_loss.array), rel=1e-5)
    for name in want:
        np.testing.assert_allclose(got[name].array, want[name].array, rtol=1e-5, atol=1e-6)
    params, state = problem()[0], ADAM.init(problem()[0])
    program = sharded.sharded(params, state, *problem()[1:]).program
    if "hidden" in mapping:  # ZeRO/FSDP: gradients reduce-scattered, parameters all-gathered
        assert program.count("reduce_scatter") > 0 and program.count("all_gather") > 0
        w1 = next(t for t in program.parameter_types if t.has("feature") and t.has("hidden"))
        assert w1.extent("hidden") == 8 // devices
    else:  # data parallel: gradients psum-med, nothing gathered
        assert program.count("psum") > 0 and program.count("all_gather") == 0
