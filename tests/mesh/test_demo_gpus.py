"""`accy demo --gpus N`: the demo's training step data-parallel over a simulated mesh gives the
parameters of one device; a sharded function on a process mesh takes whole arrays or blocks."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy.demo.data import VOCAB, SortingTask
from accy.demo.model import Config, initial_parameters
from accy.demo.train import Model, main, make_optimizer
from accy.errors import MeshError
from accy.mesh import Mesh

from .test_nccl_simulated import run_ranks


def train_steps(gpus: int, steps: int = 3) -> list[np.ndarray]:
    task = SortingTask(length=4)
    config = Config(vocab=VOCAB, tokens=task.tokens, channels=16, heads=2, hidden=32, batch=8)
    model = Model(config, make_optimizer(), "cpu", gpus=gpus)
    parameters = list(initial_parameters(config, np.random.default_rng(0)).values())
    params, opt_state = model.initial(parameters)
    for step in range(steps):
        ids, targets, weights = task.batch(np.random.default_rng([0, step]), config.batch)
        value, params, opt_state = model.step(
            params,
            opt_state,
            model.named(ids, ("batch", "token")),
            model.named(targets, ("batch", "token")),
            model.named(weights, ("batch", "token")),
            model.named(np.float32(1e-3), ()),
        )
    parameters, slots = model.flat(params, opt_state)
    return [*parameters, *slots, np.asarray(float(value))]


@pytest.mark.slow
def test_two_simulated_devices_train_the_demo_to_the_parameters_of_one():
    one, two = train_steps(1), train_steps(2)
    for a, b in zip(one, two, strict=True):
        np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-6)


def test_demo_gpus_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        main(["--gpus", "0"])
    assert "--gpus must be at least 1" in capsys.readouterr().err


def test_a_sharded_function_on_gpus_needs_its_distributed():
    with pytest.raises(MeshError, match="distributed="):
        accy.shard(lambda x: x, Mesh(range(2), "data"), {"batch": "data"}, device="cuda")
    with pytest.raises(MeshError, match="simulated mesh"):
        accy.shard(lambda x: x, Mesh(range(2), "data"), {"batch": "data"}, device="tpu")


def test_a_sharded_function_on_a_process_mesh_takes_whole_arrays_or_blocks():
    whole = np.arange(24, dtype=np.float32).reshape(4, 6)

    def body(distributed, lock):
        def scaled(x, w):  # x {batch, f}; w {f}: the result keeps batch split
            return x * w, (x * w).sum("batch")

        step = accy.shard(
            scaled, distributed.mesh, {"batch": "data"}, device="cuda", distributed=distributed
        )
        x = accy.named(whole, ("batch", "f"))
        w = accy.named(np.arange(6, dtype=np.float32), ("f",))
        block, total = step(x, w)  # whole x: cut to this device's rows
        again, _ = step(block, w)  # the block itself: taken as it is
        return np.asarray(block.array), block.axes, np.asarray(total.array), np.asarray(again.array)

    results = run_ranks(2, body)
    for rank, result in enumerate(results):
        assert not isinstance(result, Exception), f"rank {rank}: {result!r}"
        block, axes, total, again = result
        rows = whole[2 * rank : 2 * rank + 2] * np.arange(6)
        assert axes == ("batch", "f")
        np.testing.assert_allclose(block, rows)
        np.testing.assert_allclose(total, (whole * np.arange(6)).sum(0))
        np.testing.assert_allclose(again, rows * np.arange(6))
