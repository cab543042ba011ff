"""The SPMD transform: sharded programs on simulated meshes of 1, 2, 4 and 8 devices give what
the program gives on one device (reference mesh evaluator and native CPU segments)."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import f32, i32, nn, spec
from accy.errors import MeshError
from accy.mesh import Mesh, MeshExecutable, run, shard_program

DP = {"batch": "data"}
FSDP = {"batch": "data", "hidden": "data"}


def mlp_loss(b, a):
    x, y, w1, b1, w2 = a
    h = (x.contract(w1, "feature") + b1).tanh()
    return ((h.contract(w2, "hidden") - y) ** 2.0).mean(("batch", "out"))


MLP_SPECS = [
    spec(f32, batch=16, feature=4),
    spec(f32, batch=16, out=2),
    spec(f32, feature=4, hidden=8),
    spec(f32, hidden=8),
    spec(f32, hidden=8, out=2),
]


def inputs_for(program, seed=0):
    rng = np.random.default_rng(seed)
    arrays = []
    for t in program.parameter_types:
        if t.dtype == i32:
            arrays.append(rng.integers(0, 5, t.extents).astype(np.int32))
        else:
            arrays.append(rng.standard_normal(t.extents).astype(np.float32))
    return arrays


def check_sharded(program, mesh, mapping, device="reference", arrays=None, tol=2e-5):
    arrays = inputs_for(program) if arrays is None else arrays
    want = accy.reference.run(program, arrays)
    sharded = shard_program(program, mesh, mapping)
    got = MeshExecutable(sharded, device=device)(*arrays)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
    return sharded


@pytest.mark.parametrize("devices", (1, 2, 4, 8))
@pytest.mark.parametrize("mapping", (DP, FSDP, {"hidden": "data"}), ids=("dp", "fsdp", "tp"))
def test_gradient_program_on_every_mesh(devices, mapping):
    program = accy.gradient.value_and_grad(accy.trace.define("mlp", MLP_SPECS, mlp_loss), (2, 3, 4))
    sharded = check_sharded(program, Mesh(range(devices), "data"), mapping)
    if mapping is DP:  # parameters whole on every device; their gradients psum-med
        assert sharded.program.count("psum") == 4 and sharded.program.count("all_gather") == 0
        assert all(not s.axes for s in sharded.output_shardings)
    if mapping is FSDP:  # parameters, gradients split along hidden: reduce_scatter, all_gather
        assert sharded.program.count("reduce_scatter") == 3
        assert sharded.program.count("all_gather") >= 3
        assert [dict(s.axes) for s in sharded.output_shardings[1:]] == [{"hidden": "data"}] * 3
        assert sharded.program.parameter_types[2].extent("hidden") == 8 // devices


@pytest.mark.parametrize(("devices", "mapping"), ((2, DP), (4, FSDP)), ids=("dp-2", "fsdp-4"))
def test_native_cpu_segments_match(devices, mapping):
    program = accy.gradient.value_and_grad(accy.trace.define("mlp", MLP_SPECS, mlp_loss), (2, 3, 4))
    check_sharded(program, Mesh(range(devices), "data"), mapping, device="cpu")


def test_two_axis_mesh_data_and_model_parallel():
    program = accy.gradient.value_and_grad(accy.trace.define("mlp", MLP_SPECS, mlp_loss), (2, 3, 4))
    mesh = Mesh(np.arange(8).reshape(2, 4), ("data", "model"))
    sharded = check_sharded(program, mesh, {"batch": "data", "hidden": "model"})
    assert dict(sharded.input_shardings[0].axes) == {"batch": "data"}
    assert dict(sharded.input_shardings[2].axes) == {"hidden": "model"}


def transformer_pieces(b, a):
    """Attention-like work over a sharded batch: softmax (a max over a whole axis), an
    embedding gather, slices, pads, concatenation and reshapes."""
    tokens, table, w = a
    x = table.gather(tokens, "vocab")  # [batch, token, channel]
    scores = x.contract(x.rename("token", "key"), "channel")
    mixed = nn.softmax(scores, "key").contract(x.rename("token", "key"), "key")
    shifted = b.pad(b.slice(mixed, "token", 1, 4), "token", high=1)
    both = b.concatenate([mixed, shifted], "channel")
    flat = b.merge(both, ("token", "channel"), "flat")
    out = flat.contract(w, "flat").max("batch")
    return (out * out).sum() + nn.logsumexp(flat, "batch").sum()


PIECES_SPECS = [
    spec(i32, batch=8, token=4),
    spec(f32, vocab=5, channel=3),
    spec(f32, flat=24, hidden=4),
]


@pytest.mark.parametrize("devices", (1, 2, 4, 8))
def test_kinds_that_need_whole_axes(devices):
    program = accy.gradient.value_and_grad(
        accy.trace.define("pieces", PIECES_SPECS, transformer_pieces), (1, 2)
    )
    check_sharded(program, Mesh(range(devices), "data"), DP, tol=1e-4)


EMBED_SPECS = [spec(i32, batch=8, token=3), spec(f32, vocab=5, channel=8)]


def embedding_loss(b, a):
    tokens, table = a
    return (table.gather(tokens, "vocab") ** 2.0).sum()


@pytest.mark.parametrize("devices", (1, 2, 4, 8))
@pytest.mark.parametrize("mapping", (DP, {"batch": "data", "channel": "data"}), ids=("dp", "fsdp"))
def test_an_embedding_gradient_scatters_each_devices_tokens(devices, mapping):
    # The gather's transpose adds the cotangent rows into zeros. With more rows of updates
    # (24 tokens) than twice the table's (5), each device adds its own batch's rows and the
    # pending sum is taken once (a psum, or a reduce_scatter onto the table's channel blocks).
    program = accy.trace.define("embed", EMBED_SPECS, embedding_loss)
    program = accy.gradient.value_and_grad(program, (1,))
    sharded = check_sharded(program, Mesh(range(devices), "data"), mapping)
    if mapping is DP:
        assert sharded.program.count("all_gather") == 0
    (scatter,) = [op for op in sharded.program.operations if op.kind == "scatter_add"]
    assert scatter.operand_types[1].extent("batch") == 8 // devices


def test_a_large_tables_gradient_gathers_the_rows_instead():
    # 24 rows of updates against a 64-row table: gathering them moves fewer bytes than
    # summing the table, so the scatter runs whole on every device.
    specs = [EMBED_SPECS[0], spec(f32, vocab=64, channel=4)]
    program = accy.trace.define("embed", specs, embedding_loss)
    program = accy.gradient.value_and_grad(program, (1,))
    sharded = check_sharded(program, Mesh(range(2), "data"), DP)
    (scatter,) = [op for op in sharded.program.operations if op.kind == "scatter_add"]
    assert scatter.operand_types[1].extent("batch") == 8
    assert sharded.program.count("all_gather") == 2


@pytest.mark.parametrize("devices", (2, 4))
def test_a_scatter_add_into_a_nonzero_operand_runs_whole(devices):
    # Each device adding its own rows into the operand would add the operand once a device.
    def body(b, a):
        tokens, table, rows = a
        return b.scatter_add(table, tokens, rows, "vocab")

    rows = spec(f32, batch=8, token=3, channel=8)
    program = accy.trace.define("scatter", [*EMBED_SPECS, rows], body)
    sharded = check_sharded(program, Mesh(range(devices), "data"), DP)
    (scatter,) = [op for op in sharded.program.operations if op.kind == "scatter_add"]
    assert scatter.operand_types[1].extent("batch") == 8


def test_splitting_a_reshaped_or_sliced_axis():
    def body(b, a):
        x = a[0]
        y = b.split(x, "batch", {"outer": 2, "inner": 4}).sum("inner")
        z = b.slice(x, "batch", 2, 6).sum("batch")
        kept = b.reshape(x, [("batch", 8), ("renamed", 3)])  # the batch blocks stay put
        return y.sum("outer") + z, kept.sum("renamed")

    program = accy.trace.define("r", [spec(f32, batch=8, feature=3)], body)
    check_sharded(program, Mesh(range(4), "data"), DP)


def test_scan_runs_whole_on_every_device():
    def body(b, a):
        xs, init = a

        def step(bb, args):
            carry, x = args
            new = (carry * x).tanh()
            return new, new

        (carry,), (ys,) = b.scan(step, carries=[init], xs=[xs], axis="time")
        return carry.sum() + ys.sum()

    program = accy.trace.define("scan", [spec(f32, time=3, batch=4), spec(f32, batch=4)], body)
    check_sharded(accy.gradient.value_and_grad(program, (0, 1)), Mesh(range(2), "data"), DP)


def test_sum_with_a_nonzero_init_adds_it_once():
    def body(b, a):
        return b.reduce(a[0], b.scalar(f32, 10.0), "sum", "batch")

    program = accy.trace.define("init", [spec(f32, batch=8)], body)
    check_sharded(program, Mesh(range(4), "data"), DP)


def test_errors_name_what_is_wrong():
    program = accy.trace.define("mlp", MLP_SPECS, mlp_loss)
    with pytest.raises(MeshError, match="cannot split evenly"):
        shard_program(program, Mesh(range(3), "data"), DP)
    with pytest.raises(MeshError, match="mesh axis 'model' is not on the mesh"):
        shard_program(program, Mesh(range(2), "data"), {"batch": "model"})
    with pytest.raises(MeshError, match="axis names"):
        Mesh(np.arange(4).reshape(2, 2), ("a", "a"))
    with pytest.raises(MeshError, match="one name per dimension"):
        Mesh(np.arange(4).reshape(2, 2), "data")
    with pytest.raises(MeshError, match="twice"):
        Mesh([0, 0], "data")
    with pytest.raises(MeshError, match="program axis names to mesh axis names"):
        shard_program(program, Mesh(range(2), "data"), ["batch"])
    sharded = shard_program(program, Mesh(range(2), "data"), DP)
    with pytest.raises(MeshError, match="the whole array"):
        sharded.split([np.zeros((3, 3))] + [np.zeros(t.extents) for t in MLP_SPECS[1:]])


def test_unmapped_axes_leave_the_program_as_it_is():
    program = accy.trace.define("mlp", MLP_SPECS, mlp_loss)
    sharded = shard_program(program, Mesh(range(4), "data"), {"nothing": "data"})
    assert sharded.program.parameter_types == program.parameter_types
    assert not any(op.kind in ("psum", "all_gather") for op in sharded.program.operations)
    outputs = run(sharded.program, sharded.mesh, sharded.split(inputs_for(program)))
    assert len({float(o[0]) for o in outputs}) == 1


def test_shard_a_function_over_named_arrays():
    mesh = accy.Mesh(range(4), "data")
    x = accy.named(np.arange(24, dtype=np.float32).reshape(8, 3), ("batch", "feature"))
    w = accy.named(np.ones(3, np.float32), ("feature",))

    def f(x, w):
        return {"mean": (x * w).mean("batch"), "rows": (x * w).sum("feature")}

    sharded = accy.shard(f, mesh, {"batch": "data"})
    got = sharded(x, w)
    np.testing.assert_allclose(got["mean"].array, np.asarray(x.array).mean(0))
    np.testing.assert_allclose(got["rows"].array, np.asarray(x.array).sum(1))
    assert got["rows"].axes == ("batch",)
    assert sharded.sharded(x, w).program.parameter_types[0].extent("batch") == 2
    with pytest.raises(MeshError, match="accy.Mesh"):
        accy.shard(f, "data", {"batch": "data"})


def test_donation_is_checked_and_a_simulated_mesh_computes_the_same():
    mesh = accy.Mesh(range(2), "data")
    w = accy.named(np.ones(3, np.float32), ("feature",))
    x = accy.named(np.arange(12, dtype=np.float32).reshape(4, 3), ("batch", "feature"))

    def sgd(w, x):
        return w - 0.5 * x.mean("batch")

    got = accy.shard(sgd, mesh, {"batch": "data"}, donate_argnums=(0,))(w, x)
    np.testing.assert_allclose(got.array, 1 - 0.5 * np.asarray(x.array).mean(0))
    np.testing.assert_array_equal(w.array, np.ones(3, np.float32))  # a simulated mesh keeps it
    with pytest.raises(accy.AccyError, match=r"shard: donate_argnums=\(2,\) names argument 2"):
        accy.shard(sgd, mesh, {"batch": "data"}, donate_argnums=(2,))(w, x)


@pytest.mark.slow
@pytest.mark.parametrize("device", ("reference", "cpu"))
@pytest.mark.parametrize("mapping", ({"batch": "data"}, {"head": "data"}), ids=("batch", "head"))
def test_fused_attention_runs_on_each_devices_batch_and_heads(device, mapping):
    """nn.attention's records map over the batch and head axes: sharded over either, each
    device runs attention (and its backward) on its block, with no all_gather, and the loss
    and gradients are the one device's."""
    q_spec = spec(f32, batch=4, head=2, token=8, dim=4)
    k_spec = spec(f32, batch=4, head=2, key=8, dim=4)

    def loss(b, a):
        q, k, v = a
        out = nn.attention(q, k, v, causal=True, implementation="fused")
        return (out * out).sum(("batch", "head", "token", "dim"))

    program = accy.trace.define("attention", [q_spec, k_spec, k_spec], loss)
    gradient = accy.value_and_grad(program, wrt=(0, 1, 2))
    sharded = check_sharded(gradient, Mesh(range(2), "data"), mapping, device=device, tol=1e-4)
    assert sharded.program.count("all_gather") == 0
    (axis,) = mapping
    calls = [op for op in sharded.program.operations if op.kind == "custom_call"]
    assert len(calls) == 2  # forward and backward, on this device's half of the axis
    assert all(op.type.extent(axis) == {"batch": 2, "head": 1}[axis] for op in calls)
