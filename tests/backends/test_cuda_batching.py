"""Launches of one kernel that do not depend on each other run as one batched launch
(`schedule.batch_launches`, horizontal fusion like PyTorch's multi-tensor apply): the schedule
is checked without a GPU; on a GPU, a multi-tensor AdamW step against NumPy and the batched
schedule against the one in plan order, bit for bit (skipped without CUDA)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import accy
from accy import f32, spec
from accy.backends.cuda import compile as cuda_compile
from accy.backends.cuda import compile_program
from accy.backends.cuda.schedule import (
    BARRIER,
    NUMBER,
    POOL,
    WORKSPACE,
    Access,
    Batched,
    Launch,
    Schedule,
    batch_launches,
)
from accy.optim import Adam

from ..executors import cuda_device_or_skip

# Three alike, two alike, one alone; interleaved, as a model's layers are (the planner groups
# only neighbouring steps over the same elements).
SHAPES = [(64,), (16, 8), (64,), (16, 8), (64,), (5,)]
ADAM = Adam(1e-2, 0.9, 0.999, 1e-8, 0.1)


@pytest.fixture(autouse=True)
def _loops_apart(monkeypatch):
    """Plans without `clusters_loops`, which would run the interleaved same-shaped updates
    next to each other as one group, leaving the batcher nothing to join; built afresh (the
    disk cache's key does not know of the change)."""
    gpu = dataclasses.replace(cuda_compile.GPU, clusters_loops=False)
    monkeypatch.setattr(cuda_compile, "GPU", gpu)
    monkeypatch.setattr(cuda_compile, "stored", lambda cache, key, program, build: build())


def _adamw(shapes=SHAPES):
    """One AdamW update over parameters of `shapes`: (params, grads, m, v, step) ->
    (new params, new m, new v)."""
    count = len(shapes)

    def body(b, args):
        params, grads = args[:count], args[count : 2 * count]
        ms, vs = args[2 * count : 3 * count], args[3 * count : 4 * count]
        step = args[-1]
        new_p, new_m, new_v = [], [], []
        for p, g, m, v in zip(params, grads, ms, vs, strict=True):
            updated, (m2, v2) = ADAM.update(b, p, g, [m, v], step, b.scalar(f32, 1e-2))
            new_p.append(updated)
            new_m.append(m2)
            new_v.append(v2)
        return (*new_p, *new_m, *new_v)

    types = [_spec(shape) for shape in shapes] * 4 + [spec(f32)]
    # As `accy.jit` makes it: the bias corrections, alike for every parameter, computed once.
    return accy.simplify(accy.trace.define("adamw", types, body))


def _spec(shape):
    return spec(f32, **{f"a{k}": n for k, n in enumerate(shape)})


class _Kernels:
    def batchable(self, name):
        return True

    def batched(self, name):
        return name + "_batch"


def _schedule(*accesses: Access) -> Schedule:
    schedule = Schedule()
    for access in accesses:
        schedule.add(Launch("k", 4, 256, schedule.table([]), 0))
        schedule.accesses.append(access)
    return schedule


def _groups(schedule: Schedule) -> list[int]:
    return [len(a.members) if isinstance(a, Batched) else 1 for a in schedule.actions]


def test_same_shaped_updates_are_one_launch_per_kernel():
    serial = compile_program(_adamw(), batch=False).schedule
    batched = compile_program(_adamw()).schedule
    counts: dict[str, int] = {}
    for launch in serial.actions:
        counts[launch.kernel] = counts.get(launch.kernel, 0) + 1
    repeated = sorted(n for n in counts.values() if n > 1)
    assert repeated  # the planner left same-shaped updates apart (not neighbours)
    # Each kernel's launches become one; the others stay as they were.
    assert sorted(n for n in _groups(batched) if n > 1) == repeated
    assert sum(_groups(batched)) == len(serial.actions)
    assert len(batched.actions) == len(serial.actions) - sum(n - 1 for n in repeated)
    for action in batched.actions:
        if isinstance(action, Batched):
            assert {m.kernel for m in action.members} == {action.members[0].kernel}
            assert action.grid == sum(m.grid for m in action.members)
            table = batched.pool[action.io : action.io + 2 + 3 * len(action.members)]
            assert table[0].source == NUMBER and table[0].offset == len(action.members)
            assert [a.source for a in table[-2 * len(action.members) :]] == [POOL] * len(
                action.members
            ) + [WORKSPACE] * len(action.members)
    assert batched.serial == serial.actions


def test_batched_variant_reads_the_member_table():
    compiled = compile_program(_adamw())
    names = {a.kernel for a in compiled.schedule.actions if isinstance(a, Batched)}
    assert names
    for name in names:
        source = compiled.source[compiled.source.index(name) :]
        body = source[: source.index("\n}")]
        assert "accy_table" in body and "blockIdx.x - accy_first" in body
        assert "gridDim.x" not in body  # the body uses its member's grid


def test_a_launch_reading_anothers_result_is_not_merged():
    first = Access(reads=((0, 0, 64),), writes=((WORKSPACE, 0, 64),))
    reader = Access(reads=((WORKSPACE, 0, 64),), writes=((1, 0, 64),))
    schedule = _schedule(first, reader)
    batch_launches(schedule, 1, _Kernels())
    assert _groups(schedule) == [1, 1] and schedule.serial is None


def test_reused_workspace_orders_launches():
    # The second overwrites bytes the first reads (the workspace reused): not merged.
    schedule = _schedule(
        Access(reads=((WORKSPACE, 0, 64),), writes=((1, 0, 64),)),
        Access(reads=((0, 0, 64),), writes=((WORKSPACE, 32, 96),)),
    )
    batch_launches(schedule, 1, _Kernels())
    assert _groups(schedule) == [1, 1]


def test_independent_launches_merge_across_others_and_not_across_barriers():
    a = Access(reads=((0, 0, 8),), writes=((WORKSPACE, 0, 8),))
    b = Access(reads=((0, 0, 8),), writes=((WORKSPACE, 8, 16),))
    schedule = _schedule(a, BARRIER, b)
    batch_launches(schedule, 1, _Kernels())
    assert _groups(schedule) == [1, 1, 1]
    schedule = _schedule(a, b, Access(reads=((WORKSPACE, 0, 16),), writes=((1, 0, 8),)))
    batch_launches(schedule, 1, _Kernels())
    assert _groups(schedule) == [2, 1]


def test_a_chain_of_layers_keeps_its_launches_apart():
    def body(b, args):
        x, *weights = args
        for w in weights:
            x = x.contract(w, "c").rename("d", "c").tanh()
        return (x * x).sum()

    types = [spec(f32, n=16, c=8)] + [spec(f32, c=8, d=8)] * 4
    schedule = compile_program(accy.trace.define("chain", types, body)).schedule
    assert not any(isinstance(a, Batched) for a in schedule.actions)


def test_reordering_records_donation_hazards():
    # The second update writes output 1 before... nothing: plan order kept, no hazard; but a
    # merged pair where one reads input 0 and the other writes a same-sized output is one.
    a = Access(reads=((0, 0, 64),), writes=((2, 0, 64),))
    b = Access(reads=((1, 0, 64),), writes=((3, 0, 64),))
    schedule = _schedule(a, b)
    batch_launches(schedule, 2, _Kernels())
    assert _groups(schedule) == [2]
    assert (0, 3) in schedule.hazards and (0, 2) not in schedule.hazards


# on a GPU --------------------------------------------------------------------------------------


def _run(compiled, arrays, donate: bool = False):
    import cupy

    from accy.backends.cuda.runtime import load

    fragment = load(compiled)
    inputs = [cupy.asarray(a) for a in arrays]
    outputs = [cupy.empty(t.extents, np.float32) for t in compiled.program.output_types]
    if donate:  # each new param/m/v written over its input (inputs: p, g, m, v; outputs: p, m, v)
        n = len(SHAPES)
        outputs = [inputs[k] for k in (*range(n), *range(2 * n, 4 * n))]
    pointers = [x.data.ptr for x in (*inputs, *outputs)]
    fragment.run(pointers)
    cupy.cuda.get_current_stream().synchronize()
    return [cupy.asnumpy(x) for x in outputs]


def _arrays(seed=0):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]  # params
    arrays += [rng.standard_normal(s).astype(np.float32) for s in SHAPES]  # grads
    arrays += [rng.standard_normal(s).astype(np.float32) * 0.1 for s in SHAPES]  # m
    arrays += [rng.random(s).astype(np.float32) * 0.1 for s in SHAPES]  # v
    return arrays + [np.array(3.0, np.float32)]


def _numpy_adamw(arrays):
    n = len(SHAPES)
    step = float(arrays[-1])
    b1, b2, eps, decay, lr = ADAM.beta1, ADAM.beta2, ADAM.eps, ADAM.weight_decay, 1e-2
    out_p, out_m, out_v = [], [], []
    for p, g, m, v in zip(*(arrays[k * n : (k + 1) * n] for k in range(4)), strict=True):
        p, g, m, v = (x.astype(np.float64) for x in (p, g, m, v))
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        direction = (m / (1 - b1**step)) / (np.sqrt(v / (1 - b2**step)) + eps) + decay * p
        out_p.append(p - lr * direction)
        out_m.append(m)
        out_v.append(v)
    return out_p + out_m + out_v


@pytest.mark.parametrize("donate", [False, True], ids=["fresh-outputs", "donated"])
def test_multi_tensor_adamw_on_cuda_equals_numpy_and_plan_order(donate):
    cuda_device_or_skip()
    program = _adamw()
    arrays = _arrays()
    batched = _run(compile_program(program), arrays, donate)
    serial = _run(compile_program(program, batch=False), _arrays(), donate)
    for got, same, want in zip(batched, serial, _numpy_adamw(arrays), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
        np.testing.assert_array_equal(got, same)  # bit for bit the unbatched schedule's


@pytest.mark.skipif(
    __import__("accy.kernel.toolchain", fromlist=["nvcc"]).nvcc() is None,
    reason="cuda gate: nvcc is not on PATH (nor in $CUDA_HOME/bin)",
)
def test_batched_variants_compile():
    ptx = compile_program(_adamw()).ptx()
    assert "_batch" in ptx
