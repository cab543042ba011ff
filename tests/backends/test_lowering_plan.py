"""The lowering plan (no compiler needed): what fuses, what is stored, and buffer reuse."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import accy
from accy import f32, spec
from accy.backends.cpu import compile as cpu_compile
from accy.backends.cpu.executable import CpuExecutable
from accy.lower import build_plan, explain
from accy.lower.buffers import Lifetime, place
from accy.lower.fusion import MAX_INLINE_DEPTH
from accy.lower.grouping import MAX_GROUP_OPERATIONS
from accy.lower.target import CPU
from accy.lower.views import reshaped_strides

from ..executors import EXECUTORS


def kinds(plan):
    return [step.kind for step in plan.steps]


def test_a_chain_of_single_use_elementwise_work_is_one_loop():
    program = accy.trace.define(
        "chain", [spec(f32, n=8)] * 2, lambda b, a: ((a[0] * a[1]).exp() + 1.0).tanh()
    )
    plan = build_plan(program)
    assert kinds(plan) == ["loop"]
    assert {op.kind for op in plan.steps[0].fused} >= {"mul", "unary", "add"}
    assert plan.workspace_bytes == 0


def test_a_reduction_fuses_the_elementwise_work_feeding_it():
    program = accy.trace.define(
        "sum_of_squares", [spec(f32, row=4, col=8)], lambda b, a: (a[0] * a[0]).exp().sum("col")
    )
    assert kinds(build_plan(program)) == ["reduce"]


def test_light_arithmetic_is_recomputed_rather_than_stored():
    def body(b, args):
        shifted = args[0] + 1.0  # one add: cheaper to redo than to store and reload
        return (shifted * args[1]).sum("col"), shifted.max("col")

    plan = build_plan(accy.trace.define("light", [spec(f32, row=4, col=8)] * 2, body))
    assert kinds(plan) == ["reductions"] and plan.workspace_bytes == 0
    for member in plan.steps[0].members:  # each computes the add itself
        assert "add" in [op.kind for op in member.fused]


def test_a_value_read_by_two_steps_is_stored_once():
    def softmax(b, args):
        weights = (args[0] - args[0].max("key")).exp()
        return weights / weights.sum("key")

    plan = build_plan(accy.trace.define("softmax", [spec(f32, q=4, key=8)], softmax))
    assert kinds(plan) == ["reduce", "loop", "reduce", "loop"]
    exp_step = plan.steps[1]
    assert exp_step.op.kind == "unary" and exp_step.op.attrs["op"] == "exp"


def test_an_expensive_value_is_not_recomputed_under_a_broadcast():
    program = accy.trace.define(
        "broadcast_exp",
        [spec(f32, col=8), spec(f32, row=64, col=8)],
        lambda b, a: a[0].exp() * a[1],
    )
    assert kinds(build_plan(program)) == ["loop", "loop"]


def test_layout_operations_on_stored_values_are_views_not_copies():
    program = accy.trace.define(
        "transposed_matmul",
        [spec(f32, k=3, m=2), spec(f32, k=3, n=4)],
        lambda b, a: a[0].transpose("m", "k").contract(a[1].rename("n", "j"), "k"),
    )
    plan = build_plan(program)
    assert kinds(plan) == ["dot"]
    assert plan.steps[0].detail.lhs.transposed and not plan.steps[0].detail.lhs.packed
    assert "lhs transposed" in explain(plan)


def test_an_operand_blas_cannot_read_is_packed():
    program = accy.trace.define(
        "interleaved",
        [spec(f32, m=3, k=4, q=2), spec(f32, k=4, n=5)],
        lambda b, a: a[0].contract(a[1], "k"),
    )
    (step,) = build_plan(program).steps
    assert step.detail.lhs.packed and [s.name for s in step.scratch] == ["lhs"]


def test_intermediates_share_memory_once_they_are_dead():
    def body(b, args):
        x = args[0]
        for _ in range(6):
            x = x.exp() * x.sum("col")  # each intermediate is read by two steps: stored
        return x.sum()

    program = accy.trace.define("deep", [spec(f32, row=64, col=64)], body)
    plan = build_plan(program)
    stored = [v for step in plan.steps for v in step.writes if plan.slots[v].storage == "workspace"]
    total = sum(program.type_of(v).nbytes for v in stored)
    assert plan.workspace_bytes < total / 2


def test_outputs_are_written_in_place_and_copied_only_when_shared():
    def body(b, args):
        doubled = args[0] * 2.0
        return args[0], doubled, doubled

    plan = build_plan(accy.trace.define("outputs", [spec(f32, n=4)], body))
    assert kinds(plan) == ["loop", "copy", "copy"]
    assert [str(s) for s in plan.output_slots] == ["output 0", "output 1", "output 2"]


def test_explain_lists_steps_and_the_scan_body():
    def body(b, args):
        def cell(_, values):
            return (values[0] + values[1],)

        carries, _ = b.scan(cell, carries=[args[0]], xs=[args[1]], axis="step")
        return carries[0]

    program = accy.trace.define("scan", [spec(f32, c=2), spec(f32, step=3, c=2)], body)
    text = explain(program)
    assert "plan of 'scan'" in text and "scan %" in text and "plan of 'scan_body'" in text


def test_flat_loops_over_the_same_elements_become_one_loop():
    def body(b, args):
        x = args[0]
        wave = x.tanh() * (-x * x).exp()
        return wave.sum(), wave * x.tanh(), (x.exp() * 2.0).sum()

    plan = build_plan(accy.trace.define("siblings", [spec(f32, n=4096)], body))
    assert kinds(plan) == ["group"]
    members = [m.kind for m in plan.steps[0].members]
    assert members.count("reduce") == 2 and members.count("loop") >= 2
    assert plan.workspace_bytes == 0  # nothing is stored between the members
    assert f"one loop for {len(members)} steps" in explain(plan)


def _updates_of_a_bucket(b, args):
    # As a data-parallel step's optimizer: gradients sliced out of one all-reduced buffer, each
    # read by the loops that update its moments (contiguous views at an offset).
    bucket, m1, v1, m2, v2 = args
    bucket = bucket * 0.5  # stored: a step of its own, read by both slices
    g1, g2 = bucket.slice("n", 0, 256), bucket.slice("n", 256, 512)
    return m1 * 0.9 + g1 * 0.1, v1 * 0.95 + g1 * g1, m2 * 0.9 + g2 * 0.1, v2 * 0.95 + g2 * g2


def test_loops_reading_contiguous_slices_of_a_buffer_become_one_loop():
    specs = [spec(f32, n=512)] + [spec(f32, n=256)] * 4
    program = accy.trace.define("bucket", specs, _updates_of_a_bucket)
    plan = build_plan(program)
    assert kinds(plan) == ["loop", "group"]
    assert len(plan.steps[1].members) == 4
    inputs = [np.linspace(-1, 1, t.size, dtype=np.float32) for t in specs]
    got = accy.compile(program, device="cpu")(*inputs)
    for g, e in zip(got, accy.reference.run(program, inputs), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-6)


def _moments(m, v, g):
    return m * 0.9 + g * 0.1, v * 0.95 + g * g * 0.05


def _update(p, m, v):
    return p - m / (v.sqrt() + 1e-8) * 1e-3


def _raised_update(others: int = 9):
    """Optimizer steps in an order that moving loops down cannot mend: parameter a's moments
    (over n), two parameters' moments and updates (over k), `others` parameters' moments (over
    e), a's update, then the others' updates. Moving the e moments down next to their updates
    brings a's update within reach of its moments only after they were considered."""

    def body(b, args):
        params = [args[i : i + 4] for i in range(0, len(args), 4)]
        (p, m, v, g), kept, later = params[0], params[1:3], params[3:]
        moments = _moments(m, v, g)
        steps = [
            x for q, *rest in kept for pair in [_moments(*rest)] for x in (*pair, _update(q, *pair))
        ]
        later_moments = [_moments(*rest) for _, *rest in later]
        updated = _update(p, *moments)
        later_updates = [_update(q[0], *pair) for q, pair in zip(later, later_moments, strict=True)]
        return (
            *moments,
            updated,
            *steps,
            *(x for pair in later_moments for x in pair),
            *later_updates,
        )

    types = [spec(f32, n=64)] * 4 + [spec(f32, k=48)] * 8 + [spec(f32, e=32)] * (4 * others)
    return accy.trace.define("raised", types, body)


def test_a_loop_moves_up_to_the_last_loop_over_its_elements():
    # a's update joins the group of its moments: one pass over n's buffers, not two.
    program = _raised_update()
    plan = build_plan(program, dataclasses.replace(CPU, clusters_loops=True))
    groups = [(step.kind, len(step.members)) for step in plan.steps]
    assert groups == [("group", 3), ("group", 6), ("group", 27)]
    assert plan.steps[0].members[0].op.type.size == 64
    # In program order (no reordering) a's update is a pass of its own after the e moments.
    unordered = [(step.kind, len(step.members)) for step in build_plan(program).steps]
    assert unordered == [("group", 2), ("group", 6), ("group", 18), ("loop", 0), ("group", 9)]


def test_the_plan_with_raised_loops_computes_the_reference_values(monkeypatch):
    program = _raised_update()
    target = dataclasses.replace(CPU, clusters_loops=True)
    monkeypatch.setattr(cpu_compile, "build_plan", lambda p: build_plan(p, target))
    compiled = cpu_compile.compile_program(program)
    assert len(compiled.plan.steps) == 3
    rng = np.random.default_rng(3)
    inputs = [rng.random(t.extents, dtype=np.float32) for t in program.parameter_types]
    got = CpuExecutable(compiled)(*inputs)
    for g, w in zip(got, accy.reference.run(program, inputs), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)


def test_a_slice_of_a_group_members_result_starts_a_new_loop():
    def body(b, args):
        grown = args[0].exp()  # stored; read by a member of its group and through a slice
        return grown * 2.0, grown.slice("n", 0, 64) + args[1]

    program = accy.trace.define("sliced", [spec(f32, n=64)] * 2, body)
    plan = build_plan(program)
    assert kinds(plan) == ["group", "loop"]  # the slice reads the buffer after its loop
    x, y = np.linspace(-1, 1, 64, dtype=np.float32), np.ones(64, np.float32)
    got = accy.compile(program, device="cpu")(x, y)
    np.testing.assert_allclose(np.asarray(got[1]), np.exp(x) + 1, rtol=1e-6)


def test_a_step_reading_a_reduction_of_its_group_starts_a_new_loop():
    def normalized(b, args):
        total = args[0].sum()
        return args[0] / total  # needs the whole sum before any element

    plan = build_plan(accy.trace.define("normalized", [spec(f32, n=64)], normalized))
    assert kinds(plan) == ["reduce", "loop"]


def _adam(b, args):
    # AdamW's order: the moments, then the step count and its bias corrections (scalars), then
    # the parameter update reading both.
    g, m, v, p, count = args
    m = m * 0.9 + g * 0.1
    v = v * 0.95 + g * g * 0.05
    count = count + 1.0
    c1 = 1.0 - (count * np.log(0.9)).exp()
    c2 = 1.0 - (count * np.log(0.95)).exp()
    return m, v, p - ((m / c1) / ((v / c2).sqrt() + 1e-8) + p * 0.1) * 1e-3, count


def _adam_program():
    return accy.trace.define("adam", [spec(f32, n=4096)] * 4 + [spec(f32)], _adam)


def test_scalar_loops_run_early_so_the_loops_around_them_become_one():
    plan = build_plan(_adam_program())
    assert kinds(plan) == ["loop", "loop", "loop", "group"]
    assert len(plan.steps[-1].members) == 3  # both moments and the parameter, one loop


@pytest.mark.parametrize("executor", EXECUTORS)
def test_an_adam_update_with_its_scalars_moved_early_matches_numpy(executor):
    rng = np.random.default_rng(0)
    g, m, p = (rng.standard_normal(4096).astype(np.float32) for _ in range(3))
    v, count = rng.random(4096).astype(np.float32), np.float32(4.0)
    got = [np.asarray(x) for x in executor(_adam_program(), [g, m, v, p, count])]
    m1, v1 = 0.9 * m + 0.1 * g, 0.95 * v + 0.05 * g * g
    c1, c2 = 1 - 0.9**5.0, 1 - 0.95**5.0
    p1 = p - ((m1 / c1) / (np.sqrt(v1 / c2) + 1e-8) + 0.1 * p) * 1e-3
    for actual, expected in zip(got, (m1, v1, p1, 5.0), strict=True):
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-7)


def test_place_reuses_freed_blocks():
    lifetimes = [Lifetime("a", 1000, 0, 1), Lifetime("b", 1000, 1, 2), Lifetime("c", 1000, 2, 3)]
    offsets, size = place(lifetimes, 4)
    assert offsets["a"] == offsets["c"] and size == 2048


@pytest.mark.parametrize(
    "old, strides, new, expected",
    [
        ((2, 3, 4), (12, 4, 1), (6, 4), (4, 1)),
        ((4, 3), (1, 4), (12,), None),  # a transposed buffer cannot be flattened in place
        ((4, 3), (1, 4), (2, 2, 3), (2, 1, 4)),
        ((2, 1, 3), (3, 3, 1), (6,), (1,)),
    ],
)
def test_reshape_is_a_view_when_strides_allow(old, strides, new, expected):
    assert reshaped_strides(old, strides, new) == expected


def test_unused_results_are_not_computed():
    def body(b, args):
        args[0].sum()  # traced, but nothing uses it
        args[0].contract(args[0].rename("n", "m"), ())  # an unused outer product
        return args[0].abs()

    plan = build_plan(accy.trace.define("unused", [spec(f32, n=4)], body))
    assert kinds(plan) == ["loop"]


def _fused_depth(step) -> int:
    """The most operations between the step's root and a leaf of its inline expression."""
    inside = {op.results[0]: op for op in step.fused}
    depth = {}
    for op in step.fused + (step.op,):  # in program order: operands first
        depth[op.results[0]] = 1 + max(
            (depth.get(v, 0) for v in op.operands if v in inside), default=0
        )
    return depth[step.op.results[0]]


@pytest.mark.slow
def test_a_long_chain_is_cut_into_steps_of_bounded_depth_and_groups_of_bounded_size():
    def body(b, args):
        x, a = args
        for _ in range(1500):
            x = x * a + 0.5
        return x

    plan = build_plan(accy.trace.define("chain", [spec(f32, n=8)] * 2, body))
    steps = [m for step in plan.steps for m in (step.members or (step,))]
    assert sum(len(s.fused) + 1 for s in steps) >= 3000
    assert max(map(_fused_depth, steps)) <= 2 * MAX_INLINE_DEPTH
    for group in plan.steps:
        assert sum(len(m.fused) + 1 for m in group.members) <= MAX_GROUP_OPERATIONS


def test_planning_an_expression_that_reuses_values_takes_linear_time(monkeypatch):
    # x + x at every level: following each use separately visits 2**levels paths.
    calls = 0
    is_stored = accy.lower.fusion.Fusion.is_stored

    def counted(self, value):
        nonlocal calls
        calls += 1
        return is_stored(self, value)

    monkeypatch.setattr(accy.lower.fusion.Fusion, "is_stored", counted)

    def body(b, args):
        x = args[0]
        for _ in range(20):
            x = (x + x) * 0.5
        return x

    program = accy.trace.define("doubling", [spec(f32, n=8)], body)
    build_plan(program)
    assert calls < 20 * len(program.operations)
