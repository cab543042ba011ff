"""accy.save / accy.load on a mesh: each device's blocks in a file of their own, an index
written last, the whole tree or any device's blocks on another mesh read back."""

from __future__ import annotations

import os

import numpy as np
import pytest
import safetensors

import accy
from accy import optim
from accy.checkpoints import load_block

R = "reference"
MAPPING = {"batch": "data", "hidden": "data"}  # ZeRO/FSDP: parameters and state split


def loss(params, x):
    h = x.contract(params["w"], "feature").tanh()
    return (h * params["v"]).sum("hidden").mean("batch") + (params["odd"] * params["odd"]).sum()


OPT = optim.adamw(0.05, weight_decay=0.1)


def step(params, state, x):
    grads = accy.grad(loss)(params, x)
    updates, state = OPT.update(grads, state, params)
    return optim.apply_updates(params, updates), state


def problem():
    rng = np.random.default_rng(0)
    params = {
        "w": accy.named(rng.normal(size=(3, 8)).astype(np.float32), ("feature", "hidden")),
        "v": accy.named(rng.normal(size=8).astype(np.float32), ("hidden",)),
        "odd": accy.named(rng.normal(size=3).astype(np.float32), ("extra",)),  # unmapped: whole
    }
    x = accy.named(rng.normal(size=(8, 3)).astype(np.float32), ("batch", "feature"))
    return params, OPT.init(params), x


def bits(tree):
    return [
        (np.asarray(leaf).dtype, np.asarray(leaf).shape, np.asarray(leaf).tobytes())
        for leaf in optim.base.tree_leaves(tree)
    ]


def test_each_device_writes_its_blocks_and_a_resumed_sharded_run_is_bit_identical(tmp_path):
    mesh = accy.Mesh(range(4), "data")
    sharded = accy.shard(step, mesh, MAPPING, device=R)
    params, state, x = problem()
    straight = (params, state)
    for _ in range(4):
        straight = sharded(*straight, x)

    run = (params, state)
    for _ in range(2):
        run = sharded(*run, x)
    path = tmp_path / "ckpt.safetensors"
    accy.save(path, {"params": run[0], "opt": run[1]}, mesh=mesh, axis_mapping=MAPPING)
    shards = sorted(p for p in os.listdir(tmp_path) if p != "ckpt.safetensors")
    assert len(shards) == 4 and all(
        ".rank" in p and p.endswith("-of-4.safetensors") for p in shards
    )
    for name in shards:  # a device's file holds its block of each split leaf: 8 / 4 rows
        content = dict(safetensors.deserialize((tmp_path / name).read_bytes()))
        assert content["['params']['w']"]["shape"] == [3, 2]
        assert ("['params']['odd']" in content) == (".rank0-" in name)  # whole: rank 0 only

    fresh = {"params": params, "opt": OPT.init(params)}
    restored = accy.load(path, like=fresh)
    run = (restored["params"], restored["opt"])
    for _ in range(2):
        run = sharded(*run, x)
    assert bits(run) == bits(straight)


def test_load_block_reshards_to_another_mesh(tmp_path):
    params, state, _ = problem()
    tree = {"params": params, "opt": state}
    path = tmp_path / "ckpt.safetensors"
    accy.save(path, tree, mesh=accy.Mesh(range(4), "data"), axis_mapping=MAPPING)
    two_by_two = accy.Mesh(np.arange(4).reshape(2, 2), ("data", "model"))
    for rank in range(4):
        block = load_block(path, tree, two_by_two, {"hidden": "model"}, rank)
        column = two_by_two.coordinates(rank)["model"]
        w = block["params"]["w"]
        assert w.axes == ("feature", "hidden") and w.shape == {"feature": 3, "hidden": 4}
        whole = np.asarray(params["w"].array)
        np.testing.assert_array_equal(w.array, whole[:, 4 * column : 4 * column + 4])
        assert block["params"]["odd"].shape == {"extra": 3}  # an unmapped axis: whole
        assert int(block["opt"][0].count) == 0
    with pytest.raises(accy.CheckpointError, match="rank 4 is not one of the mesh's 4"):
        load_block(path, tree, two_by_two, {"hidden": "model"}, 4)


def test_a_failed_sharded_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    params, state, _ = problem()
    mesh = accy.Mesh(range(4), "data")
    path = tmp_path / "ckpt.safetensors"
    accy.save(path, params, mesh=mesh, axis_mapping=MAPPING)
    before = sorted(os.listdir(tmp_path))
    accy.save(path, params, mesh=mesh, axis_mapping=MAPPING)  # a second save replaces the first
    after = sorted(os.listdir(tmp_path))
    assert len(after) == 5 and set(after) & set(before) == {"ckpt.safetensors"}

    import accy.checkpoints as checkpoints

    real = checkpoints._write_atomically
    calls = []

    def dies_on_the_third_shard(target, arrays, metadata):
        calls.append(target)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real(target, arrays, metadata)

    monkeypatch.setattr(checkpoints, "_write_atomically", dies_on_the_third_shard)
    changed = {k: v + 1.0 for k, v in params.items()}
    with pytest.raises(OSError):
        accy.save(path, changed, mesh=mesh, axis_mapping=MAPPING)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == after  # the new shards removed, the old kept
    assert bits(accy.load(path, like=params)) == bits(params)


def test_damaged_sharded_checkpoints(tmp_path):
    params, _, _ = problem()
    mesh = accy.Mesh(range(2), "data")
    first, second = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    accy.save(first, params, mesh=mesh, axis_mapping=MAPPING)
    accy.save(second, params, mesh=mesh, axis_mapping=MAPPING)
    shard_a = sorted(p for p in os.listdir(tmp_path) if p.startswith("a.safetensors."))[1]
    shard_b = sorted(p for p in os.listdir(tmp_path) if p.startswith("b.safetensors."))[1]
    (tmp_path / shard_a).write_bytes((tmp_path / shard_b).read_bytes())
    with pytest.raises(accy.CheckpointError, match="belongs to another save"):
        accy.load(first, like=params)
    os.remove(tmp_path / shard_b)
    with pytest.raises(accy.CheckpointError, match="cannot read"):
        accy.load(second, like=params)
    with pytest.raises(accy.CheckpointError, match="axis_mapping= needs mesh="):
        accy.save(tmp_path / "c.safetensors", params, axis_mapping=MAPPING)
    with pytest.raises(accy.CheckpointError, match="mesh= must be an accy.Mesh"):
        accy.save(tmp_path / "c.safetensors", params, mesh=4, axis_mapping=MAPPING)
