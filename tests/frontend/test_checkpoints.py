"""accy.save / accy.load: safetensors files of trees of named arrays, NumPy arrays, Python
scalars and optimizer states; every dtype round-trips bit for bit; damaged or mismatched files
are CheckpointErrors naming the key; a resumed run continues bit-identically; a save killed
with SIGKILL leaves the previous file intact."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
import safetensors

import accy
from accy import optim

R = "reference"
SOURCE_ROOT = os.path.dirname(os.path.dirname(accy.__file__))


def bits(x):
    array = np.asarray(x.array if hasattr(x, "array") else x)
    return array.dtype, array.shape, array.tobytes()


def every_dtype():
    rng = np.random.default_rng(0)
    arrays = {
        "f32": rng.normal(size=(2, 3)).astype(np.float32),
        "f64": rng.normal(size=(3,)),
        "f16": rng.normal(size=(2, 2)).astype(np.float16),
        "bf16": rng.normal(size=(4,)).astype(accy.bf16.numpy),
        "i32": np.array([[-(2**31), 2**31 - 1]], np.int32),
        "i64": np.array([-(2**63), 2**63 - 1], np.int64),
        "u8": np.arange(5, dtype=np.uint8),
        "bool": np.array([True, False, True]),
    }
    tree = {
        name: accy.named(a, tuple(f"{name}_{i}" for i in range(a.ndim)), device=R)
        for name, a in arrays.items()
    }
    tree["scalar"] = accy.named(np.float32(np.nan), (), device=R)
    tree["empty"] = accy.named(np.zeros((0, 2), np.float32), ("none", "two"), device=R)
    tree["numpy"] = [np.arange(6, dtype=np.int64).reshape(2, 3), np.float32(-0.0)]
    tree["python"] = (7, 2.5, True, None, {"deep": [1.0]})
    return tree


def test_every_dtype_and_leaf_kind_round_trips_bit_for_bit(tmp_path):
    path = tmp_path / "all.safetensors"
    tree = every_dtype()
    accy.save(path, tree)
    for back in (accy.load(path, like=tree), accy.load(path, device=R)):
        assert accy.optim.base.tree_leaves(back) is not None
        for key in ("f32", "f64", "f16", "bf16", "i32", "i64", "u8", "bool", "scalar", "empty"):
            assert back[key].axes == tree[key].axes and back[key].dtype == tree[key].dtype
            assert bits(back[key]) == bits(tree[key])
            assert back[key].device == accy.device(R)
        assert bits(back["numpy"][0]) == bits(tree["numpy"][0])
        assert isinstance(back["numpy"][1], np.float32) and bits(back["numpy"][1]) == bits(
            np.float32(-0.0)
        )
        assert back["python"] == (7, 2.5, True, None, {"deep": [1.0]})
        assert [type(v) for v in back["python"][:3]] == [int, float, bool]
    # bf16 is stored as safetensors BF16 (not widened), and the metadata names the axes
    data = path.read_bytes()
    dtypes = {name: record["dtype"] for name, record in safetensors.deserialize(data)}
    assert (
        dtypes["['bf16']"] == "BF16" and dtypes["['f16']"] == "F16" and dtypes["['bool']"] == "BOOL"
    )
    (size,) = struct.unpack("<Q", data[:8])
    metadata = json.loads(data[8 : 8 + size])["__metadata__"]
    leaves = {e["key"]: e for e in json.loads(metadata["leaves"])}
    assert leaves["['f32']"]["axes"] == ["f32_0", "f32_1"]
    assert json.loads(metadata["structure"])["dict"][0][0] == "f32"


def test_a_tree_loads_on_the_devices_of_like(tmp_path):
    path = tmp_path / "t.safetensors"
    accy.save(path, {"w": accy.named(np.ones(2, np.float32), ("a",), device=R)})
    back = accy.load(path, like={"w": accy.named(np.zeros(2, np.float32), ("a",))})
    assert back["w"].device == accy.device("cpu") and back["w"].array.tolist() == [1.0, 1.0]


def training_setup():
    params = {
        "w": accy.named(
            np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3), ("in", "out"), device=R
        ),
        "b": accy.named(np.zeros(3, accy.bf16.numpy), ("out",), device=R),
    }
    schedule = optim.warmup_cosine_decay_schedule(0.0, 0.1, 2, 10, end_value=0.01)
    opt = optim.chain(
        optim.clip_by_global_norm(1.0),
        optim.adamw(schedule, weight_decay=0.1, mask={"w": True, "b": False}),
    )
    x = accy.named(np.array([[1.0, -2.0], [0.5, 0.25]], np.float32), ("batch", "in"), device=R)

    def loss(p):
        h = x.contract(p["w"], "in") + p["b"].convert(accy.f32)
        return (h * h).mean()

    @accy.jit
    def step(p, s):
        grads = accy.grad(loss)(p)
        updates, s = opt.update(grads, s, p)
        return optim.apply_updates(p, updates), s

    return params, opt, step


def test_a_resumed_run_continues_bit_identically(tmp_path):
    params, opt, step = training_setup()
    straight_p, straight_s = params, opt.init(params)
    for _ in range(6):
        straight_p, straight_s = step(straight_p, straight_s)

    p, s = params, opt.init(params)
    for _ in range(2):
        p, s = step(p, s)
    path = tmp_path / "resume.safetensors"
    accy.save(path, {"params": p, "opt": s})
    fresh = {"params": params, "opt": opt.init(params)}  # what a new process would build
    restored = accy.load(path, like=fresh)
    p, s = restored["params"], restored["opt"]
    for _ in range(4):
        p, s = step(p, s)
    for got, want in zip(
        optim.base.tree_leaves((p, s)),
        optim.base.tree_leaves((straight_p, straight_s)),
        strict=True,
    ):
        assert bits(got) == bits(want)
    assert step.traces == 1  # the restored state has the types of the fresh one


def test_optimizer_states_need_like_to_come_back_as_named_tuples(tmp_path):
    params = {"w": accy.named(np.ones((2, 2), np.float32), ("a", "b"), device=R)}
    opt = optim.MultiSteps(optim.inject_hyperparams(optim.adamw)(learning_rate=0.1), 2)
    state = opt.init(params)
    path = tmp_path / "state.safetensors"
    accy.save(path, state)
    back = accy.load(path, like=state)
    assert type(back) is type(state) and type(back.inner_opt_state) is type(state.inner_opt_state)
    for got, want in zip(optim.base.tree_leaves(back), optim.base.tree_leaves(state), strict=True):
        assert bits(got) == bits(want)
    with pytest.raises(
        accy.CheckpointError, match="MultiStepsState node, which only like= can rebuild"
    ):
        accy.load(path)


# -- damaged and mismatched files --------------------------------------------------------------


@pytest.fixture
def saved(tmp_path):
    tree = {"w": accy.named(np.ones((2, 3), np.float32), ("in", "out"), device=R), "n": 1}
    path = tmp_path / "good.safetensors"
    accy.save(path, tree)
    return path, tree


def test_a_file_that_is_not_safetensors(tmp_path):
    path = tmp_path / "junk.safetensors"
    path.write_bytes(b"definitely not a safetensors file, just text")
    with pytest.raises(accy.CheckpointError, match="is not a complete safetensors file"):
        accy.load(path)


def test_a_truncated_file(saved, tmp_path):
    path, tree = saved
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(accy.CheckpointError, match="damaged, truncated"):
        accy.load(cut, like=tree)


def test_a_safetensors_file_from_elsewhere(tmp_path):
    path = tmp_path / "other.safetensors"
    array = np.zeros(2, np.float32)
    spec = safetensors.TensorSpec(
        dtype="float32", shape=[2], data_ptr=array.ctypes.data, data_len=8
    )
    safetensors.serialize_file({"x": spec}, str(path), metadata={"format": "pt"})
    with pytest.raises(accy.CheckpointError, match="not an accy checkpoint"):
        accy.load(path)


def test_a_missing_file(tmp_path):
    with pytest.raises(accy.CheckpointError, match="cannot read"):
        accy.load(tmp_path / "absent.safetensors")


@pytest.mark.parametrize(
    ("like", "message"),
    [
        (
            {"w": ((2, 4), ("in", "out"), np.float32), "n": 1},
            r"key \['w'\] .* has extents \{'in': 2, 'out': 3\}; like has \{'in': 2, 'out': 4\}",
        ),
        (
            {"w": ((2, 3), ("in", "hidden"), np.float32), "n": 1},
            r"key \['w'\] .* has axes \('in', 'out'\); like has \('in', 'hidden'\)",
        ),
        (
            {"w": ((2, 3), ("in", "out"), np.float64), "n": 1},
            r"key \['w'\] .* has dtype f32; like has f64",
        ),
        (
            {"w": ((2, 3), ("in", "out"), np.float32), "n": 1, "extra": 2},
            r"has no key \['extra'\] that like has",
        ),
        ({"w": ((2, 3), ("in", "out"), np.float32)}, r"has key \['n'\], which like does not have"),
        (
            {"w": ((2, 3), ("in", "out"), np.float32), "n": 1.0},
            r"key \['n'\] .* holds a Python int; like has float",
        ),
        (
            {"w": np.zeros((2, 3), np.float32), "n": 1},
            r"key \['w'\] .* holds a named leaf; like has a NumPy array",
        ),
    ],
    ids=["shape", "axes", "dtype", "missing", "extra", "scalar kind", "array kind"],
)
def test_a_mismatched_file(saved, like, message):
    path, _ = saved
    like = {
        k: accy.named(np.zeros(v[0], v[2]), v[1], device=R) if isinstance(v, tuple) else v
        for k, v in like.items()
    }
    with pytest.raises(accy.CheckpointError, match=message):
        accy.load(path, like=like)


def test_what_cannot_be_saved(tmp_path):
    with pytest.raises(accy.CheckpointError, match=r"leaf \['name'\] is str"):
        accy.save(tmp_path / "s.safetensors", {"name": "text"})
    with pytest.raises(accy.CheckpointError, match="has NumPy dtype complex64"):
        accy.save(tmp_path / "c.safetensors", [np.zeros(2, np.complex64)])
    with pytest.raises(accy.CheckpointError, match="does not fit in 64 bits"):
        accy.save(tmp_path / "i.safetensors", [2**70])

    @accy.jit
    def inside(x):
        accy.save(tmp_path / "j.safetensors", [x])
        return x

    with pytest.raises(accy.CheckpointError, match="is a traced value"):
        inside(accy.named(np.zeros(2, np.float32), ("a",), device=R))
    with pytest.raises(accy.CheckpointError, match="cannot write in"):
        accy.save(tmp_path / "no" / "such" / "folder.safetensors", [1])
    assert sorted(os.listdir(tmp_path)) == []  # nothing half-written left behind


def test_a_failed_save_keeps_the_previous_file(saved):
    path, tree = saved
    before = path.read_bytes()
    with pytest.raises(accy.CheckpointError):
        accy.save(path, {"w": "not an array"})
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


# -- a save killed in the middle ---------------------------------------------------------------

SAVER = """
import sys
import numpy as np
import accy
import accy.checkpoints
import safetensors

if sys.argv[2] == "in-place":  # the control: a writer that overwrites the file where it is

    def write_in_place(path, arrays, metadata):
        with open(path, "wb") as f:
            f.write(safetensors.serialize(accy.checkpoints._specs(arrays), metadata=metadata))

    accy.checkpoints._write_atomically = write_in_place
blocks = [[accy.named(np.full((1024, 1024), v, np.float32), ("a", "b"))] * 4 for v in (1, 2)]
version = 0
while True:
    version += 1
    accy.save(sys.argv[1], {"version": version, "w": blocks[version % 2]})
    print(version, flush=True)
"""
LIKE = {"version": 0, "w": [accy.named(np.zeros((1024, 1024), np.float32), ("a", "b"))] * 4}


def kill_during_a_save(path, fraction, writer="atomic"):
    """Start a process saving 16 MB trees to `path` in a loop, time one save, and SIGKILL it
    `fraction` of a save's time after the next one starts."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([SOURCE_ROOT, *sys.path])}
    command = [sys.executable, "-c", SAVER, str(path), writer]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, env=environment, text=True)
    try:
        assert child.stdout.readline(), "the saving process ended early"
        start = time.monotonic()
        done = int(child.stdout.readline())
        time.sleep((time.monotonic() - start) * fraction)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    return done


@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.75])
@pytest.mark.slow
def test_kill_9_during_a_save_leaves_a_whole_checkpoint(tmp_path, fraction):
    path = tmp_path / "live.safetensors"
    done = kill_during_a_save(path, fraction)
    back = accy.load(path, like=LIKE)  # a whole file: one of the versions saved
    assert back["version"] >= done
    for block in back["w"]:
        assert np.all(block.array == 1 + back["version"] % 2)


@pytest.mark.slow
def test_the_kill_9_test_catches_a_writer_that_is_not_atomic(tmp_path):
    broken = 0
    for i, fraction in enumerate([0.25, 0.5, 0.75]):
        path = tmp_path / f"live{i}.safetensors"
        kill_during_a_save(path, fraction, writer="in-place")
        try:
            accy.load(path, like=LIKE)
        except accy.CheckpointError:
            broken += 1
    assert broken >= 1
