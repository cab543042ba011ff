"""Rematerialization (`accy.lower.remat`): values of cheap elementwise work read long after they
were made are computed again there. The rewritten forward/backward programs compute the same
bits on the reference evaluator, the plan's peak of live bytes falls, and what is not cheap, or
would keep its inputs alive longer, is left alone."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

import accy
from accy import nn
from accy.lower import build_plan, fusion
from accy.lower.remat import clusters, convert_inside_scans, rematerialize, rematerialize_stored
from accy.lower.target import CPU, GPU

from ..halves import composed_gelu_tanh

DISTANCE = 8  # operations: the programs here are small
REMAT_CPU = dataclasses.replace(CPU, rematerialize_after=DISTANCE)


def mlp_gradient(dtype, layers=2, batch=16, channel=32, hidden=64):
    """value_and_grad of a residual MLP with GELU (tanh), by its weights."""
    types = [accy.spec(dtype, batch=batch, channel=channel)]
    types += [
        accy.spec(dtype, channel=channel, hidden=hidden),
        accy.spec(dtype, hidden=hidden, channel=channel),
    ] * layers

    def body(b, a):
        x = a[0]
        for i in range(layers):
            u = composed_gelu_tanh(x.contract(a[1 + 2 * i], "channel"))
            x = x + u.contract(a[2 + 2 * i], "hidden")
        return (x * x).sum().convert(accy.f32)

    loss = accy.trace.define("mlp", types, body)
    return accy.value_and_grad(loss, wrt=tuple(range(1, 1 + 2 * layers)))


def layer_norm_gradient(dtype, batch=16, channel=32, hidden=64):
    """value_and_grad of a LayerNorm (gain, bias) feeding a GELU MLP, by every parameter."""
    types = [
        accy.spec(dtype, batch=batch, channel=channel),
        accy.spec(dtype, channel=channel),
        accy.spec(dtype, channel=channel),
        accy.spec(dtype, channel=channel, hidden=hidden),
        accy.spec(dtype, hidden=hidden, channel=channel),
    ]

    def body(b, a):
        x, gain, bias, w1, w2 = a
        h = nn.layer_norm(x, "channel") * gain + bias
        y = x + composed_gelu_tanh(h.contract(w1, "channel")).contract(w2, "hidden")
        return (y * y).sum().convert(accy.f32)

    loss = accy.trace.define("ln_block", types, body)
    return accy.value_and_grad(loss, wrt=(0, 1, 2, 3, 4))


def stacked_layers_gradient(layers=3, batch=8, channel=16):
    """value_and_grad of a scan over residual tanh layers computed in bf16 from f32 master
    weights converted before the scan (mixed precision), by the masters."""
    types = [
        accy.spec(accy.bf16, batch=batch, channel=channel),
        accy.spec(accy.f32, layer=layers, channel=channel, hidden=channel),
    ]

    def body(b, a):
        def layer(b, v):
            x, w = v
            return [x + x.contract(w, "channel").rename("hidden", "channel").tanh()]

        (x,), _ = b.scan(layer, carries=[a[0]], xs=[a[1].convert(accy.bf16)], axis="layer")
        return (x * x).sum().convert(accy.f32)

    loss = accy.trace.define("stacked", types, body)
    return accy.value_and_grad(loss, wrt=(1,))


def random_inputs(program, seed=0):
    rng = np.random.default_rng(seed)
    inputs = []
    for t in program.parameter_types:
        x = rng.standard_normal(t.extents) * 0.5
        inputs.append(x.astype(ml_dtypes.bfloat16 if t.dtype == accy.bf16 else np.float32))
    return inputs


def assert_same_bits(program, rewritten, inputs):
    want = accy.reference.run(program, inputs)
    got = accy.reference.run(rewritten, inputs)
    assert len(got) == len(want)
    for position, (g, w) in enumerate(zip(got, want, strict=True)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, f"output {position}"
        assert g.tobytes() == w.tobytes(), f"output {position} differs"


def stored(program):
    return fusion.decide(program).is_stored


def peak_live_bytes(plan) -> int:
    """The most workspace bytes in use at any step (a buffer written in place of another, at the
    same offset, counted once)."""
    spans: dict[int, list[int]] = {}
    for index, step in enumerate(plan.steps):
        for value in (*step.writes, *step.reads):
            slot = plan.slots.get(value)
            if slot is not None and slot.storage == "workspace":
                spans.setdefault(value, [index, index])[1] = index
    live = [set() for _ in plan.steps]
    for value, (first, last) in spans.items():
        slot = plan.slots[value]
        for index in range(first, last + 1):
            live[index].add((slot.index, slot.type.nbytes))
    return max((sum(n for _, n in blocks) for blocks in live), default=0)


@pytest.mark.parametrize("dtype", [accy.f32, accy.bf16])
def test_mlp_gradient_is_bit_identical_after_gelu_is_recomputed(dtype):
    program = mlp_gradient(dtype)
    rewritten = rematerialize(program, DISTANCE, stored(program))
    # The backward pass computes tanh (GELU's) again instead of keeping the forward's.
    assert rewritten.count("unary") > program.count("unary")
    assert_same_bits(program, rewritten, random_inputs(program))


@pytest.mark.parametrize("dtype", [accy.f32, accy.bf16])
def test_layer_norm_block_gradient_is_bit_identical(dtype):
    program = layer_norm_gradient(dtype)
    rewritten = rematerialize(program, DISTANCE, stored(program))
    assert len(rewritten.operations) > len(program.operations)
    assert rewritten.count("reduce") == program.count("reduce")  # no reduction is repeated
    assert rewritten.count("dot_general") == program.count("dot_general")
    assert_same_bits(program, rewritten, random_inputs(program, seed=1))


def test_without_transcendentals_gelu_is_kept_and_layer_norm_is_still_recomputed():
    # GELU's output x * 0.5 * (tanh(u) + 1) is one multiplication away from values its
    # derivative reads, but a GPU computes tanh(u) + 1 inline in each step that reads it.
    mlp = mlp_gradient(accy.bf16)

    def hidden_operations(program):
        return sum(op.type.has("hidden") for op in program.operations)

    with_tanh = rematerialize(mlp, DISTANCE, stored(mlp))
    assert hidden_operations(with_tanh) > hidden_operations(mlp)
    arithmetic = rematerialize(mlp, DISTANCE, stored(mlp), transcendentals=False)
    assert hidden_operations(arithmetic) == hidden_operations(mlp)
    norm = layer_norm_gradient(accy.bf16)
    rewritten = rematerialize(norm, DISTANCE, stored(norm), transcendentals=False)
    assert len(rewritten.operations) > len(norm.operations)
    assert_same_bits(norm, rewritten, random_inputs(norm, seed=2))


def test_the_plan_keeps_less_alive_at_its_peak():
    program = mlp_gradient(accy.bf16, layers=3, hidden=256)
    before = build_plan(program, CPU)
    after = build_plan(program, REMAT_CPU)
    assert len(after.program.operations) > len(program.operations)
    # Per layer the GELU output (16 x 256 bf16, 8 KiB) no longer waits for the backward pass.
    assert peak_live_bytes(after) <= peak_live_bytes(before) - 2 * 16 * 256 * 2
    assert after.workspace_bytes < before.workspace_bytes


def test_the_rewritten_gradient_runs_natively(native_cpu):
    program = layer_norm_gradient(accy.f32)
    rewritten = build_plan(program, REMAT_CPU).program
    assert rewritten is not program
    inputs = random_inputs(program, seed=2)
    native = accy.compile(rewritten, device="cpu")(*inputs)
    for got, want in zip(native, accy.reference.run(program, inputs), strict=True):
        # GEMMs sum in another order than the reference: an f32 rounding of the largest terms
        scale = float(np.max(np.abs(want)))
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5 * scale)


def far_apart(make_value, extra_types=()):
    """A program reading `make_value(a)` once at once and once after a long unrelated chain."""
    types = [accy.spec(accy.f32, m=8, n=64), accy.spec(accy.f32, m=8, n=64), *extra_types]

    def body(b, a):
        v = make_value(a)
        early = v.sum()
        far = a[1]
        for _ in range(2 * DISTANCE):
            far = far.exp()
        return early + (v * far).sum()

    return accy.trace.define("far", types, body)


def test_a_cheap_value_of_parameters_is_copied():
    program = far_apart(lambda a: (a[0] * 2.0).tanh())
    rewritten = rematerialize(program, DISTANCE)
    assert rewritten.count("unary") == program.count("unary") + 1
    assert_same_bits(program, rewritten, random_inputs(program))


def test_small_inputs_may_be_kept_alive_for_a_copy():
    # v = tanh(x - mean): the mean (8 floats) is read again later, x is a parameter.
    program = far_apart(lambda a: (a[0] - a[0].mean("n")).tanh())
    rewritten = rematerialize(program, DISTANCE)
    assert rewritten.count("unary") == program.count("unary") + 1
    assert rewritten.count("reduce") == program.count("reduce")
    assert_same_bits(program, rewritten, random_inputs(program))


def test_a_copy_may_read_a_result_of_an_operation_with_several():
    types = [accy.spec(accy.f32, m=8, n=64)] * 2

    def body(b, a):
        ordered = a[0].sort("n")  # a sort: one operation with a tuple of results
        v = ordered.tanh()
        early = v.sum()
        far = a[1]
        for _ in range(2 * DISTANCE):
            far = far.exp()
        return early + (v * far + ordered).sum()  # `ordered` is alive there anyway

    program = accy.trace.define("sorted", types, body)
    rewritten = rematerialize(program, DISTANCE)
    assert rewritten.count("unary") == program.count("unary") + 1
    assert rewritten.count("sort") == 1
    assert_same_bits(program, rewritten, random_inputs(program))


@pytest.mark.parametrize(
    "why, make_value, extra",
    [
        ("a reduction", lambda a: a[0].max("m") * a[0], ()),
        ("a GEMM", lambda a: a[0].contract(a[2], "n"), (accy.spec(accy.f32, n=64, k=64),)),
        # tanh is cheap, but of a GEMM's result that would otherwise die at once
        (
            "input not alive",
            lambda a: a[0].contract(a[2], "n").tanh(),
            (accy.spec(accy.f32, n=64, k=64),),
        ),
        ("a gather", lambda a: a[0].gather(a[2], "m"), (accy.spec(accy.i32, m=8),)),
    ],
)
def test_what_is_not_cheap_or_would_keep_inputs_alive_is_left_alone(why, make_value, extra):
    program = far_apart(make_value, extra)
    assert rematerialize(program, DISTANCE) is program, why


def test_a_program_without_late_reads_is_unchanged():
    types = [accy.spec(accy.f32, n=64)]
    program = accy.trace.define("f", types, lambda b, a: (a[0].tanh() * a[0]).sum())
    assert rematerialize(program, DISTANCE) is program
    forward = mlp_gradient(accy.f32)
    assert rematerialize(forward, 10_000) is forward  # every read is near its value


def test_outputs_and_values_fusion_computes_inline_are_not_copied():
    program = far_apart(lambda a: (a[0] * 2.0).tanh())
    assert rematerialize(program, DISTANCE, lambda value: False) is program
    # Small values are below the GPU target's threshold: nothing to gain from copies.
    gradient = mlp_gradient(accy.bf16)
    assert rematerialize_stored(gradient, GPU) is gradient
    assert (
        rematerialize_stored(
            gradient,
            dataclasses.replace(GPU, rematerialize_after=DISTANCE, rematerialize_min_bytes=0),
        )
        is not gradient
    )


def test_runs_of_reads():
    assert clusters([], 4) == []
    assert clusters([1, 2, 3], 0) == [[1], [2], [3]]
    assert clusters([0, 4, 9, 13], 4) == [[0, 4], [9, 13]]


@pytest.mark.slow
def test_the_gpt2_check_step_planned_for_a_gpu_keeps_less_alive():
    from accy.backends.cuda import cudnn_conv
    from tools.gpt2_memory import step_program

    program, _ = step_program("check", "bf16", True)
    gpu = dataclasses.replace(GPU, keep=cudnn_conv.layout_for, rematerialize_min_bytes=0)
    before = build_plan(program, dataclasses.replace(gpu, rematerialize_after=0))
    after = build_plan(program, gpu)
    assert peak_live_bytes(after) < 0.85 * peak_live_bytes(before)
    # Without copies, each LayerNorm's x - mean is computed inside its three readers (fusion's
    # LIGHT_RECOMPUTE_STEPS); the output computed again for the backward pass is a fourth, so
    # with copies it is stored once per LayerNorm: a few more steps, none of them large.
    assert len(after.steps) < 1.2 * len(before.steps)
    # The whole step (loss, gradients, AdamW) computes the same bits: token ids below the
    # vocabulary's 64, non-negative floats (AdamW's second moments are square roots' operands).
    rng = np.random.default_rng(4)
    inputs = [
        rng.integers(0, 64, t.extents).astype(np.int32)
        if t.dtype == accy.i32
        else (np.abs(rng.standard_normal(t.extents)) * 0.02).astype(np.float32)
        for t in program.parameter_types
    ]
    assert_same_bits(before.program, after.program, inputs)


def test_a_conversion_read_by_scans_is_made_inside_them():
    program = stacked_layers_gradient(layers=3, channel=16)
    weights = {"layer": 3, "channel": 16, "hidden": 16}

    def stacked_bf16(p):  # the masters converted whole
        bf16 = accy.spec(accy.bf16, **weights)
        return [op for op in p.operations if op.kind == "convert" and op.type == bf16]

    inside = convert_inside_scans(program)
    assert stacked_bf16(program) and not stacked_bf16(inside)
    # The forward scan and the backward one read the f32 masters, each converting its slice.
    scans = [op for op in inside.operations if op.kind == "scan"]
    assert len(scans) == 2
    assert all(accy.spec(accy.f32, **weights) in op.operand_types for op in scans)
    assert_same_bits(program, inside, random_inputs(program, seed=3))
    gpu = dataclasses.replace(GPU, rematerialize_min_bytes=0)
    with accy.config.override(lower_convert_inside_scans=True):
        assert not stacked_bf16(build_plan(program, gpu).program)
    # Off by default: the whole copy costs memory, the slices a second conversion.
    assert stacked_bf16(build_plan(program, gpu).program)
    # Below the GPU's `rematerialize_min_bytes` (inside a scan, a conversion is a kernel a step)
    # and on the CPU, the conversion is left as it is.
    assert convert_inside_scans(program, GPU.rematerialize_min_bytes) is program
    assert stacked_bf16(build_plan(program, CPU).program)
