"""The plan of a per-device program as one CUDA graph with NCCL steps (`accy.mesh.graph`), on
the CPU: which collectives become NCCL steps, the bucket boundaries, the order of NCCL calls
(the same on every rank), the CUDA schedule the backend makes of it (compiled without a GPU),
and its values: every rank's rewritten program runs on the reference evaluator in a thread,
each NCCL step done in NumPy from its description alone, against the mesh evaluator on the
sharded program."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import accy
from accy import f32, spec
from accy.backends.base import backend_for, compile_artifact
from accy.backends.cuda.collectives import NcclStep
from accy.backends.cuda.schedule import SCRATCH, WORKSPACE, Gemm, Launch, Library
from accy.config import Config
from accy.errors import ConfigurationError, MeshError
from accy.mesh import Mesh, shard_program
from accy.mesh.graph import (
    BUCKET_BYTES,
    bucket_bytes_from_env,
    form_buckets,
    graph_plan,
    in_graph_reason,
    overlap_order,
)

# -- programs ---------------------------------------------------------------------------------


def mlp_train_step(size: int, layers: int = 3):
    """A data-parallel SGD step of a `layers`-layer tanh MLP, sharded over `size` devices."""
    width = 8

    def loss(b, a):
        h = a[0]
        for k in range(layers):
            h = h.contract(a[1 + k], "feature").tanh().rename("hidden", "feature")
        return (h**2.0).mean(("batch", "feature"))

    specs = [spec(f32, batch=4 * size, feature=width)] + [
        spec(f32, feature=width, hidden=width) for _ in range(layers)
    ]
    grads = accy.gradient.value_and_grad(
        accy.trace.define("mlp", specs, loss), tuple(range(1, layers + 1))
    )

    def step(b, a):
        value, *gs = b.call(grads, a)
        return (value, *(w - g * 0.1 for w, g in zip(a[1:], gs, strict=True)))

    whole = accy.trace.define("train", specs, step)
    return whole, shard_program(whole, Mesh(range(size), "data"), {"batch": "data"})


def collective_program(kind: str, size: int):
    """One collective of an ordinary value (x * 2), as nccl_checks has them."""
    attrs = {"mesh_axis": "data", "size": size}
    extra = {
        "psum": {},
        "all_gather": {"axis": "m"},  # not the leading axis
        "reduce_scatter": {"axis": "n"},
        "all_to_all": {"split_axis": "m", "concat_axis": "n"},  # m is not the leading axis
        "ppermute": {"perm": tuple((i, (i + 1) % size) for i in range(size))},
        "axis_index": {},
    }[kind]

    def body(b, a):
        if kind == "axis_index":
            return a[0] + b.convert(b.emit("axis_index", [], attrs), f32)
        return b.emit(kind, [a[0] * 2.0], {**attrs, **extra}) + 1.0

    return accy.trace.define(kind, [spec(f32, n=2 * size, m=4 * size)], body)


# -- NCCL steps done in NumPy, ranks as threads -------------------------------------------------


class Exchange:
    """Every rank's operands at each NCCL step, by rank (two barriers per step)."""

    def __init__(self, size: int):
        self.barrier = threading.Barrier(size, timeout=60)
        self.slots: list = [None] * size

    def all(self, rank: int, value):
        self.slots[rank] = value
        self.barrier.wait()
        every = list(self.slots)
        self.barrier.wait()
        return every


def numpy_step(step: NcclStep, rank: int, exchange: Exchange, result_shape):
    """The NumPy implementation of one NCCL step on rank `rank` (its position)."""

    def implementation(*arrays):
        if step.kind == "bucket_finish":
            return np.zeros((), arrays[0].dtype)
        every = exchange.all(rank, [np.asarray(a) for a in arrays])
        if step.kind == "bucket_start":
            bucket = np.full(result_shape, np.nan, arrays[0].dtype)  # gaps: never read
            for k, (offset, count) in enumerate(zip(step.offsets, step.counts, strict=True)):
                total = sum(e[k].astype(np.float64) for e in every).ravel()
                assert total.size == count
                bucket[offset : offset + count] = total
            return bucket
        mine = [e[0] for e in every]
        if step.kind == "psum":
            return sum(x.astype(np.float64) for x in mine).astype(arrays[0].dtype)
        if step.kind == "all_gather":
            return np.concatenate(mine, axis=0)
        if step.kind == "reduce_scatter":
            total = sum(x.astype(np.float64) for x in mine).astype(arrays[0].dtype)
            return np.split(total, step.size, axis=0)[rank]
        if step.kind == "all_to_all":  # block `rank` of every sender, in the senders' order
            return np.concatenate([np.split(x, step.size, axis=0)[rank] for x in mine], axis=0)
        out = np.zeros(result_shape, arrays[0].dtype)  # ppermute
        for source, destination in step.pairs:
            if destination == rank:
                out = mine[source]
        return out

    return implementation


def run_plans(plans, inputs_by_rank):
    """Each rank's plan program on the reference evaluator, in a thread; outputs by rank."""
    exchange = Exchange(len(plans))
    results: list = [None] * len(plans)

    def rank(r: int) -> None:
        plan = plans[r]
        calls = {
            site.target: numpy_step(site.step, r, exchange, site.result_type.extents)
            for site in plan.sites
        }
        try:
            results[r] = accy.reference.run(plan.program, inputs_by_rank[r], custom_calls=calls)
        except Exception as error:  # noqa: BLE001 - reported by the test
            exchange.barrier.abort()
            results[r] = error

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(plans))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for r, result in enumerate(results):
        assert not isinstance(result, Exception), f"rank {r}: {result!r}"
    return results


def plans_for(program, size: int, bucket_bytes: int = BUCKET_BYTES):
    return [
        graph_plan(program, {"data": r}, group=7, bucket_bytes=bucket_bytes) for r in range(size)
    ]


def check_against_mesh_evaluator(program, size, inputs_by_rank, bucket_bytes):
    want = accy.mesh.run(program, Mesh(range(size), "data"), inputs_by_rank)
    got = run_plans(plans_for(program, size, bucket_bytes), inputs_by_rank)
    for r in range(size):
        for g, w in zip(got[r], want[r], strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


# -- values ----------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 2, 4, 8])
@pytest.mark.parametrize("bucket_bytes", [0, 300, BUCKET_BYTES])
def test_a_data_parallel_step_as_one_graph_program_matches_the_mesh_evaluator(size, bucket_bytes):
    whole, sharded = mlp_train_step(size)
    rng = np.random.default_rng(size)
    arrays = [rng.standard_normal(t.extents).astype(np.float32) for t in whole.parameter_types]
    inputs = [sharded.local(r, arrays) for r in range(size)]
    check_against_mesh_evaluator(sharded.program, size, inputs, bucket_bytes)
    # ... and the same parameters as one device (data parallelism is exact up to rounding).
    one = accy.reference.run(whole, arrays)
    got = run_plans(plans_for(sharded.program, size, bucket_bytes), inputs)[0]
    for g, w in zip(got, one, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "kind", ["psum", "all_gather", "reduce_scatter", "all_to_all", "ppermute", "axis_index"]
)
@pytest.mark.parametrize("size", [2, 4])
def test_every_collective_as_an_nccl_step_matches_the_mesh_evaluator(kind, size):
    program = collective_program(kind, size)
    rng = np.random.default_rng(0)
    inputs = [[rng.standard_normal((2 * size, 4 * size)).astype(np.float32)] for _ in range(size)]
    for bucket_bytes in (0, BUCKET_BYTES):
        check_against_mesh_evaluator(program, size, inputs, bucket_bytes)


def test_fsdp_gradients_as_one_graph_program_match_the_mesh_evaluator():
    def loss(b, a):
        x, w1, w2 = a
        return (x.contract(w1, "feature").tanh().contract(w2, "hidden") ** 2.0).mean("batch")

    specs = [spec(f32, batch=8, feature=4), spec(f32, feature=4, hidden=8), spec(f32, hidden=8)]
    whole = accy.gradient.value_and_grad(accy.trace.define("mlp", specs, loss), (1, 2))
    sharded = shard_program(whole, Mesh(range(2), "data"), {"batch": "data", "hidden": "data"})
    kinds = {op.kind for op in sharded.program.operations}
    assert {"all_gather", "reduce_scatter"} <= kinds
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(t.extents).astype(np.float32) for t in specs]
    inputs = [sharded.local(r, arrays) for r in range(2)]
    check_against_mesh_evaluator(sharded.program, 2, inputs, BUCKET_BYTES)
    # The loss' psum is bucketed, so the gathers and scatters of its mesh axis go to the second
    # stream too (one communicator, one stream); without buckets everything stays on the first.
    assert form_buckets(sharded.program, BUCKET_BYTES) != []
    for bucket_bytes, second in ((BUCKET_BYTES, True), (0, False)):
        plan = graph_plan(sharded.program, {"data": 0}, group=1, bucket_bytes=bucket_bytes)
        singles = [s.step for s in plan.sites if not s.step.kind.startswith("bucket_")]
        assert singles and all(step.second_stream == second for step in singles)


# -- the plan ---------------------------------------------------------------------------------


def test_gradient_psums_go_into_buckets_in_the_order_the_backward_pass_makes_them():
    _, sharded = mlp_train_step(2, layers=3)
    program = sharded.program
    # Each gradient is 8 x 8 f32 = 256 bytes; the loss 4 bytes.
    buckets = form_buckets(program, bucket_bytes=300)
    producer = {r: op for op in program.operations for r in op.results}
    operand_of = {v: producer[v].operands[0] for b in buckets for v in b.members}
    order = overlap_order(program, 300)
    position = {r: i for i, op in enumerate(order) for r in op.results}
    sizes = [[program.type_of(v).nbytes for v in b.members] for b in buckets]
    assert sorted(n for s in sizes for n in s) == [4, 256, 256, 256]
    assert all(sum(s) >= 300 for s in sizes[:-1])  # every bucket but the last is full
    ready = [max(position[operand_of[v]] for v in b.members) for b in buckets]
    assert ready == sorted(ready)  # started in the order their members are produced
    # ... which is the backward pass': the last layer's gradient first, before any update.
    first_update = min(i for i, op in enumerate(order) if op.kind == "sub" and 1 in op.operands)
    assert ready[-1] < first_update
    # One bucket holds everything at DDP's 25 MiB; none without buckets.
    assert len(form_buckets(program, BUCKET_BYTES)) == 1
    assert form_buckets(program, 0) == []


def test_a_bucket_starts_right_after_its_last_gradient_and_finishes_before_its_first_reader():
    _, sharded = mlp_train_step(2, layers=3)
    plan = graph_plan(sharded.program, {"data": 0}, group=1, bucket_bytes=300)
    ops = plan.program.operations
    steps = {site.target: site.step for site in plan.sites}
    kinds = [steps[op.attrs["target"]].kind if op.kind == "custom_call" else op.kind for op in ops]
    starts = [i for i, k in enumerate(kinds) if k == "bucket_start"]
    finishes = [i for i, k in enumerate(kinds) if k == "bucket_finish"]
    dots = [i for i, k in enumerate(kinds) if k == "dot_general"]
    assert len(starts) == len(finishes) == len(plan.buckets) >= 2
    # The first bucket starts while backward contractions remain: they overlap its all-reduce.
    assert any(starts[0] < d < finishes[0] for d in dots)
    for start in starts:  # its operands were produced by the operation just before
        produced = set(ops[start - 1].results)
        assert produced & set(ops[start].operands)
    # Nothing reads a sum before its finish: every slice of a bucket is added to the token.
    for i, op in enumerate(ops):
        if op.kind == "slice":
            assert any(f < i for f in finishes)


def test_every_rank_issues_the_same_nccl_steps_in_the_same_order():
    for size in (2, 4, 8):
        _, sharded = mlp_train_step(size)
        plans = plans_for(sharded.program, size, bucket_bytes=300)
        assert all(p.order == plans[0].order for p in plans)
        assert plans[0].order[0].startswith("bucket 0 start: psum over data")
    program = collective_program("ppermute", 4)
    plans = plans_for(program, 4)
    assert all(p.order == plans[0].order for p in plans)
    assert [p.sites[0].step.position for p in plans] == [0, 1, 2, 3]


def test_the_cuda_schedule_issues_buckets_between_backward_kernels_at_fixed_addresses():
    """Compiled for CUDA without a GPU: the NCCL steps are library actions of the schedule; a
    bucket's start comes before backward GEMMs and kernels that run while it all-reduces; its
    operands and result are workspace buffers (never the shared scratch, which an asynchronous
    read must not see)."""
    _, sharded = mlp_train_step(2, layers=3)
    plan = graph_plan(sharded.program, {"data": 0}, group=1, bucket_bytes=300)
    compiled = compile_artifact(backend_for("cuda"), plan.program, plan.registry())
    actions = compiled.schedule.actions
    libraries = [(i, a) for i, a in enumerate(actions) if isinstance(a, Library)]
    kinds = [compiled.externals[a.symbol].library.kind for _, a in libraries]
    assert kinds.count("bucket_start") == kinds.count("bucket_finish") == len(plan.buckets)
    first_start = next(i for (i, _), k in zip(libraries, kinds, strict=True) if k == "bucket_start")
    first_finish = next(
        i for (i, _), k in zip(libraries, kinds, strict=True) if k == "bucket_finish"
    )
    between = actions[first_start + 1 : first_finish]
    assert any(isinstance(a, Gemm | Launch) for a in between)
    for (_, action), kind in zip(libraries, kinds, strict=True):
        if kind.startswith("bucket_"):
            for address in (action.result, *action.operands):
                assert address.source == WORKSPACE and address.source != SCRATCH


def test_all_gather_off_the_leading_axis_is_moved_to_the_front_and_back():
    plan = graph_plan(collective_program("all_gather", 2), {"data": 0}, group=1)
    (site,) = plan.sites
    assert site.operand_types[0].axes == ("m", "n")  # the gathered axis first
    assert site.result_type.extent("m") == 16
    assert site.step.datatype == "NCCL_UINT8" and site.step.counts == (4 * 8 * 4,)
    assert plan.program.output_types[0].axes == ("n", "m")


# -- what cannot run in a graph, and bad settings ---------------------------------------------


@pytest.mark.parametrize(
    ("split", "concat"), [("a", "c"), ("c", "a"), ("b", "b"), ("c", "b")], ids=lambda a: a
)
def test_all_to_all_of_three_axes_matches_the_mesh_evaluator(split, concat):
    # The split axis first or last, the concatenated one before or after it, or the same.
    size = 2
    attrs = {"mesh_axis": "data", "size": size, "split_axis": split, "concat_axis": concat}
    program = accy.trace.define(
        "a2a",
        [spec(f32, a=2 * size, b=3 * size, c=4 * size)],
        lambda b, a: b.emit("all_to_all", [a[0] * 2.0], attrs) + 1.0,
    )
    rng = np.random.default_rng(1)
    extents = program.parameter_types[0].extents
    inputs = [[rng.standard_normal(extents).astype(np.float32)] for _ in range(size)]
    check_against_mesh_evaluator(program, size, inputs, 0)


def test_all_to_all_is_one_step_of_block_sized_exchanges():
    plan = graph_plan(collective_program("all_to_all", 4), {"data": 0}, group=1)
    (site,) = plan.sites
    assert site.operand_types[0].axes == ("m", "n")  # the split axis first: blocks contiguous
    assert site.step.datatype == "NCCL_UINT8" and site.step.counts == (4 * 8 * 16 // 4,)
    assert plan.program.output_types[0].named_extents == (("n", 32), ("m", 4))


def test_programs_the_graph_cannot_hold_say_why():
    attrs = {"mesh_axis": "data", "size": 2}
    only = accy.trace.define("only", [spec(f32, n=4)], lambda b, a: b.emit("psum", [a[0]], attrs))
    assert "only collectives" in in_graph_reason(only)
    with pytest.raises(
        MeshError, match="program 'only' cannot run inside one CUDA graph: it has only"
    ):
        graph_plan(only, {"data": 0}, group=1)
    assert in_graph_reason(collective_program("psum", 2)) is None


def test_a_bad_bucket_size_in_the_environment_is_an_error(monkeypatch, configure):
    monkeypatch.setenv("ACCY_NCCL_BUCKET_MB", "lots")
    with pytest.raises(ConfigurationError, match="ACCY_NCCL_BUCKET_MB='lots' .* expected a"):
        _ = Config().nccl_bucket_mb
    monkeypatch.setenv("ACCY_NCCL_BUCKET_MB", "0.5")
    assert Config().nccl_bucket_mb == 0.5
    configure(nccl_bucket_mb=0.5)
    assert bucket_bytes_from_env() == 2**19


def test_booleans_travel_as_bytes_in_a_graph():
    from accy.core.types import bool_

    attrs = {"mesh_axis": "data", "size": 2}
    # Type rules refuse a bool psum; a bool ppermute moves bytes, so it is planned.
    p = accy.trace.define(
        "flags",
        [spec(bool_, n=4)],
        lambda b, a: b.emit("ppermute", [~a[0]], {**attrs, "perm": ((0, 1), (1, 0))}),
    )
    assert graph_plan(p, {"data": 0}, group=1).sites[0].step.datatype == "NCCL_UINT8"


def test_a_step_of_a_closed_communicator_group_is_an_error():
    from accy.errors import RuntimeUnavailable

    step = NcclStep("psum", 123456, "data", "NCCL_FLOAT32", (4,), 2)
    with pytest.raises(RuntimeUnavailable, match="group 123456 is closed or was never registered"):
        step.load(0)


def test_a_bucket_the_backend_would_stage_through_scratch_falls_back_to_the_programs_stream():
    """A psum of a view of a parameter: the backend copies the operand into its shared scratch,
    which a later step may overwrite while the second stream still reads it, so the program is
    planned again without buckets (its psum on the program's stream)."""
    from accy.mesh.graph import compile_for_cuda, staged_bucket_steps

    attrs = {"mesh_axis": "data", "size": 2}
    p = accy.trace.define(
        "view",
        [spec(f32, n=4, m=2)],
        lambda b, a: b.emit("psum", [a[0].rename("n", "k")], attrs) * 3.0,
    )
    plan = graph_plan(p, {"data": 0}, group=1)
    artifact = compile_artifact(backend_for("cuda"), plan.program, plan.registry())
    assert plan.buckets and staged_bucket_steps(artifact)
    plan, artifact = compile_for_cuda(p, {"data": 0}, group=1)
    assert not plan.buckets and staged_bucket_steps(artifact) == []
    assert plan.order == ("psum over data, 8 x NCCL_FLOAT32",)
    # The DP step's gradients are workspace buffers: its buckets stay.
    _, sharded = mlp_train_step(2)
    plan, artifact = compile_for_cuda(sharded.program, {"data": 0}, group=1)
    assert plan.buckets and staged_bucket_steps(artifact) == []


def test_other_libraries_steps_are_not_taken_for_buckets():
    """A step of another library (cuDNN's fused attention in a data-parallel GPT-2 step) has no
    collective kind: it is not a bucket, whatever buffers it reads (it used to raise
    AttributeError here)."""
    from types import SimpleNamespace

    from accy.backends.cuda.schedule import Address
    from accy.mesh.graph import staged_bucket_steps

    scratch = Address(SCRATCH, 0)
    attention = Library("accy_cudnn_attention_forward", scratch, (scratch,), scratch)
    artifact = SimpleNamespace(
        schedule=SimpleNamespace(actions=[attention]),
        externals={attention.symbol: SimpleNamespace(library=SimpleNamespace())},
    )
    assert staged_bucket_steps(artifact) == []
