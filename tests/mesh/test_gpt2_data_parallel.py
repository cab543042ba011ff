"""bench.gpt2's accy training step (check scale), data-parallel over a simulated mesh of 2
devices: the same loss, parameters and Adam state as on one device, and a step of a few native
segments (forward and backward, then the updates) around the gradients' psums."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy.frontend.tracing import flatten
from accy.mesh import Mesh, split_program
from accy.mesh.segments import Segment
from bench import gpt2

S = gpt2.SCALES["check"]


@pytest.mark.slow
def test_gpt2_step_on_two_simulated_devices_matches_one():
    params, state, ids, targets = gpt2.accy_inputs(S, "cpu")
    single = gpt2.accy_step(S, "reference")
    sharded = accy.shard(gpt2.accy_step(S, "cpu").fn, Mesh(range(2), "data"), {"batch": "data"})
    one = two = (None, params, state)
    for _ in range(2):
        one = single(one[1], one[2], ids, targets)
        two = sharded(two[1], two[2], ids, targets)
    (a, _), (b, _) = flatten(one), flatten(two)
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        # Normwise: Adam divides by sqrt(v), so where a gradient is almost zero the update of
        # an element moves by a good part of the learning rate on rounding differences alone
        # (on the GPU host's CPU: 8.0e-7 against -6.0e-7 in an array of magnitude 1.2e-3).
        got, want = np.asarray(y.array), np.asarray(x.array)
        assert np.max(np.abs(got - want)) <= 2e-3 * np.max(np.abs(want)) + 1e-6
    steps = split_program(sharded.sharded(params, state, ids, targets).program)
    assert sum(isinstance(s, Segment) for s in steps) <= 4


@pytest.mark.slow
def test_data_parallel_attention_runs_on_each_devices_batch():
    """With nn.attention's custom call (as the step runs on CUDA), attention and its backward
    run on each device's batch entries: the only all_gathers left are the embedding
    gradient's ids and updates (fewer bytes than summing the whole table; the scatter runs
    whole), and there is one psum per gradient and the loss."""
    params, state, ids, targets = gpt2.accy_inputs(S, "cpu")
    step = gpt2.accy_step(S, "cuda", fused=True).fn  # implementation="fused", as on CUDA
    sharded = accy.shard(step, Mesh(range(2), "data"), {"batch": "data"})
    program = sharded.sharded(params, state, ids, targets).program
    calls = [op for op in program.operations if op.kind == "custom_call"]
    assert len(calls) == 2 * S.layers  # forward and backward records, one per layer each
    assert all(op.type.extent("batch") == S.batch // 2 for op in calls)
    assert program.count("all_gather") == 2
    assert program.count("psum") == sum(1 for _ in flatten(params)[0]) + 1
