"""Elementwise work over a row reduction's results inside the reduction's step (its epilogue,
`accy.lower.grouping.reduction_epilogues`): the plan, the same bits as the unfused plan on the
CPU, values against the reference evaluator (CPU and CUDA), and the CUDA source."""

from __future__ import annotations

import re

import numpy as np
import pytest

import accy
from accy import bf16, f32, f64, i32, spec
from accy.backends.base import CACHE
from accy.backends.cpu import vector_math
from accy.backends.cuda import compile_program
from accy.kernel import toolchain
from accy.lower import build_plan, explain, grouping
from accy.lower.target import CPU, GPU

from ..executors import native_cpu, native_cuda, needs_nvcc
from ..halves import assert_close_scaled
from .row_losses import cross_entropy_loss, layer_norm_loss, random_inputs

TARGETS = [pytest.param(CPU, id="cpu"), pytest.param(GPU, id="gpu")]


def flat_steps(steps):
    """`steps` with each chain's phases in its place (each phase keeps its own epilogue)."""
    return [phase for step in steps for phase in (step.members if step.kind == "chain" else [step])]


def hosts(plan):
    """The steps of `plan` (or phases of its chains) that run an epilogue."""
    return [step for step in flat_steps(plan.steps) if step.epilogue]


def epilogue_kinds(step):
    return [
        loop.op.attrs["op"] if loop.op.kind == "unary" else loop.op.kind for loop in step.epilogue
    ]


# Programs ---------------------------------------------------------------------------------------


def layer_norm(dtype=f32, rows=16, cols=48):
    return accy.trace.define(
        "layer_norm", [spec(dtype, row=rows, v=cols)], lambda b, a: accy.nn.layer_norm(a[0], "v")
    )


def mean_and_log(dtype=f32, rows=12, cols=40):
    # Two chained epilogue loops (the division, then log and a scale) over one sum.
    def body(b, a):
        mean = a[0].sum("v") / float(cols)
        return (mean * mean + 1.0).log() * 0.5

    return accy.trace.define("mean_and_log", [spec(dtype, row=rows, v=cols)], body)


def integer_rows(rows=10, cols=33):
    def body(b, a):
        x = a[0]
        return x.sum("v") * 3 + x.max("v") - 7

    return accy.trace.define("integer_rows", [spec(i32, row=rows, v=cols)], body)


def softmax_loss(dtype=f32, rows=8, cols=64):
    return accy.trace.define(
        "softmax_loss",
        [spec(dtype, row=rows, v=cols), spec(dtype, row=rows, v=cols)],
        lambda b, a: (accy.nn.softmax(a[0], "v") * a[1]).sum(),
    )


def log_softmax_rows(dtype=f32, rows=8, cols=64):
    return accy.trace.define(
        "log_softmax", [spec(dtype, row=rows, v=cols)], lambda b, a: accy.nn.logsumexp(a[0], "v")
    )


def _inputs(program, seed=0) -> list[np.ndarray]:
    return random_inputs(program, np.random.default_rng(seed), scale=2.0, shift=0.5)


# The plan ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_layer_norm_mean_division_and_rsqrt_are_epilogues(target):
    plan = build_plan(layer_norm(bf16), target)
    # The variance reads the mean at its own row, the output both: a chain of the three
    # (test_reduction_chains.py).
    assert [step.kind for step in plan.steps] == ["chain"]
    assert [step.kind for step in flat_steps(plan.steps)] == ["reduce", "reduce", "loop"]
    mean, variance = hosts(plan)
    assert epilogue_kinds(mean) == ["div"]
    assert epilogue_kinds(variance) == ["rsqrt"]
    # The sums themselves are kept in the loop: only the mean and the rsqrt are stored.
    assert mean.op.results[0] not in plan.slots and variance.op.results[0] not in plan.slots
    assert mean.writes == (mean.epilogue[0].op.results[0],)
    assert variance.writes == (variance.epilogue[0].op.results[0],)
    text = explain(plan)
    assert "kept in the loop" in text
    assert "- epilogue: div" in text and "- epilogue: rsqrt" in text


def test_chained_loops_join_one_epilogue():
    # The mean is an output (stored, so its own loop), and the log reads it: two loops.
    def body(b, a):
        mean = a[0].sum("v") / 40.0
        return mean, (mean * mean + 1.0).log()

    program = accy.trace.define("chain", [spec(f32, row=12, v=40)], body)
    plan = build_plan(program, GPU)
    (step,) = plan.steps
    assert epilogue_kinds(step) == ["div", "log"]
    assert set(step.writes) == set(program.outputs)


def test_the_cpu_keeps_loops_of_vectorized_transcendentals():
    # Its loops call libmvec's vector logf, whose bits differ from a scalar call's.
    plan = build_plan(mean_and_log(f32), CPU)
    assert not hosts(plan) and [step.kind for step in plan.steps] == ["reduce", "loop"]
    assert set(vector_math.FUNCTIONS) <= CPU.epilogue_excludes


def test_a_consumer_broadcasting_the_result_over_the_rows_does_not_merge():
    program = accy.trace.define(
        "centered", [spec(f32, row=8, v=16)], lambda b, a: a[0] - a[0].sum("v")
    )
    # (It is the second phase of a chain: a pass over each row after the sum's,
    # test_reduction_chains.py.)
    plan = build_plan(program)
    assert not hosts(plan)
    assert [step.kind for step in flat_steps(plan.steps)] == ["reduce", "loop"]
    # With a division in between (stored: costly, read over every row element), the division
    # is the epilogue and the broadcasting subtraction stays a loop of its own.
    program = accy.trace.define(
        "centered", [spec(f32, row=8, v=16)], lambda b, a: a[0] - a[0].sum("v") / 16.0
    )
    steps = flat_steps(build_plan(program).steps)
    assert [step.kind for step in steps] == ["reduce", "loop"]
    assert epilogue_kinds(steps[0]) == ["div"]
    assert steps[1].op.type.size == 8 * 16


def test_a_consumer_reading_the_results_in_another_order_does_not_merge():
    # The same element count, but read transposed: not at the element's own position.
    def body(b, a):
        sums = a[0].sum("v")  # [row=4, col=6]
        return sums.transpose(("col", "row")) * 2.0

    program = accy.trace.define("transposed", [spec(f32, row=4, col=6, v=8)], body)
    plan = build_plan(program)
    assert not hosts(plan)


def test_a_consumer_reading_something_written_in_between_does_not_move():
    def body(b, a):
        x, w = a
        sums = x.sum("v")
        between = sums.contract(w, "row")  # a GEMM of the sums: after the reduction
        return sums * between

    inputs = [spec(f32, row=8, v=16), spec(f32, row=8)]
    plan = build_plan(accy.trace.define("between", inputs, body))
    assert not hosts(plan)
    assert [step.kind for step in plan.steps] == ["reduce", "dot", "loop"]


def test_a_step_in_between_that_reads_none_of_it_runs_ahead():
    def body(b, a):
        x, y, z = a
        between = y.contract(z, "k")  # a GEMM after the (hoisted) reduction, not reading it
        return x.sum("v") * between

    inputs = [spec(f32, row=8, v=16), spec(f32, row=8, k=4), spec(f32, k=4)]
    plan = build_plan(accy.trace.define("ahead", inputs, body))
    assert [step.kind for step in plan.steps] == ["dot", "reduce"]
    assert epilogue_kinds(plan.steps[1]) == ["mul"]


def test_a_loop_that_reads_no_result_joins_only_with_one_that_does():
    def body(b, a):
        x, y = a
        other = (y * 3.0).exp()  # an output: stored by a loop of its own, movable
        return other, x.sum("v") * other, (y * 2.0).tanh()

    program = accy.trace.define("pending", [spec(f32, row=8, v=16), spec(f32, row=8)], body)
    plan = build_plan(program, GPU)
    (host,) = hosts(plan)
    assert epilogue_kinds(host) == ["exp", "mul"]
    assert [step.kind for step in plan.steps] == ["reduce", "loop"]  # tanh stays


def test_a_result_read_elsewhere_is_still_stored():
    def body(b, a):
        sums = a[0].sum("v")
        return (sums / 16.0).sqrt(), a[0] * sums  # the second reads the sums broadcast

    plan = build_plan(accy.trace.define("both", [spec(f32, row=8, v=16)], body))
    (host,) = hosts(plan)
    assert host.op.results[0] in host.writes and host.op.results[0] in plan.slots


def test_sibling_reductions_share_one_epilogue():
    def body(b, a):
        x = a[0]
        return (x.sum("v") / 16.0 + x.max("v")).tanh()

    plan = build_plan(accy.trace.define("siblings", [spec(f32, row=8, v=16)], body), GPU)
    (step,) = plan.steps
    assert step.kind == "reductions" and epilogue_kinds(step) == ["tanh"]
    assert step.writes == tuple(plan.program.outputs)


@pytest.mark.slow
def test_an_epilogue_holds_a_bounded_number_of_operations():
    def body(b, a):
        x = a[0].sum("v")
        for k in range(700):  # each loop stored: an output read by the next
            x = (x * 0.5 + float(k)).tanh()
        return x

    plan = build_plan(accy.trace.define("long", [spec(f32, row=4, v=8)], body), GPU)
    for step in hosts(plan):
        size = len(step.fused) + 1 + sum(len(loop.fused) + 1 for loop in step.epilogue)
        assert size <= grouping.MAX_GROUP_OPERATIONS


@pytest.mark.parametrize("target", TARGETS)
def test_layer_norm_backward_row_scalars_are_epilogues(target):
    gradient = accy.value_and_grad(layer_norm_loss(bf16), wrt=[0, 1])
    plan = build_plan(gradient, target)
    last_dot = max(i for i, step in enumerate(plan.steps) if step.kind == "dot")
    after = flat_steps(plan.steps[last_dot + 1 :])
    backward = [s for s in after if s.kind in ("reduce", "reductions")]
    rows = [s for s in backward if s.detail.strategy == "rows" and s.detail.kept]
    assert rows and all(s.epilogue for s in rows)
    rows_count = gradient.parameter_types[0].extents[0]
    small_loops = [
        s for s in plan.steps if s.kind in ("loop", "group") and _elements(s) == rows_count
    ]
    assert not small_loops, "a separate loop over the row scalars is left"


def _elements(step) -> int:
    first = step.members[0] if step.members else step
    return first.op.type.size


# Values: the same bits as the unfused plan on the CPU, close to the reference ------------------


def _unfused_cpu(program, inputs):
    """The CPU's outputs with epilogues switched off (each loop its own step, as before)."""
    with accy.config.override(lower_epilogue_window=0):
        assert not hosts(build_plan(program))
        CACHE.clear()
        try:
            return native_cpu(program, inputs)
        finally:
            CACHE.clear()


VALUE_PROGRAMS = [
    pytest.param(lambda: layer_norm(f32), 1e-5, id="layer_norm-f32"),
    pytest.param(lambda: layer_norm(bf16), 2.0**-6, id="layer_norm-bf16"),
    pytest.param(lambda: layer_norm(f64), 1e-12, id="layer_norm-f64"),
    pytest.param(lambda: mean_and_log(f32), 1e-5, id="mean_and_log-f32"),
    pytest.param(lambda: mean_and_log(bf16), 2.0**-6, id="mean_and_log-bf16"),
    pytest.param(integer_rows, 0, id="integers"),
    pytest.param(lambda: log_softmax_rows(f32), 1e-5, id="logsumexp-f32"),
    pytest.param(
        lambda: accy.value_and_grad(layer_norm_loss(f32), wrt=[0, 1]), 1e-4, id="ln-grad-f32"
    ),
    pytest.param(
        lambda: accy.value_and_grad(layer_norm_loss(bf16), wrt=[0, 1]), 2.0**-5, id="ln-grad-bf16"
    ),
    pytest.param(
        lambda: accy.value_and_grad(layer_norm_loss(f64), wrt=[0, 1]), 1e-10, id="ln-grad-f64"
    ),
    pytest.param(
        lambda: accy.value_and_grad(softmax_loss(f32), wrt=[0]), 1e-5, id="softmax-grad-f32"
    ),
    pytest.param(
        lambda: accy.value_and_grad(cross_entropy_loss(f32), wrt=[0]), 1e-5, id="ce-grad-f32"
    ),
    pytest.param(
        lambda: accy.value_and_grad(cross_entropy_loss(bf16), wrt=[0]), 2.0**-5, id="ce-grad-bf16"
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("build, rtol", VALUE_PROGRAMS)
def test_cpu_gives_the_bits_of_the_unfused_plan(build, rtol):
    program = build()
    inputs = _inputs(program)
    got = native_cpu(program, inputs)
    unfused = _unfused_cpu(program, inputs)
    for position, (g, u) in enumerate(zip(got, unfused, strict=True)):
        assert g.dtype == u.dtype and g.shape == u.shape
        assert np.asarray(g).tobytes() == np.asarray(u).tobytes(), f"output {position} differs"
    reference = accy.reference.run(program, inputs)
    for position, (g, r) in enumerate(zip(got, reference, strict=True)):
        assert_close_scaled(g, r, rtol, f"{program.name} output {position} against the reference")


WITHOUT_EPILOGUES = {"softmax-grad-f32"}  # its division broadcasts the sums: none to make


@pytest.mark.parametrize("build, rtol", VALUE_PROGRAMS)
def test_the_programs_have_epilogues(build, rtol, request):
    program = build()
    expected = request.node.callspec.id not in WITHOUT_EPILOGUES
    assert bool(hosts(build_plan(program, GPU))) == expected


@pytest.mark.parametrize("build, rtol", VALUE_PROGRAMS)
def test_cuda_matches_the_reference(build, rtol):
    program = build()
    inputs = _inputs(program)
    got = native_cuda(program, inputs)
    reference = accy.reference.run(program, inputs)
    for position, (g, r) in enumerate(zip(got, reference, strict=True)):
        assert g.dtype == r.dtype
        assert_close_scaled(g, r, max(rtol, 1e-6), f"{program.name} output {position} on CUDA")


@pytest.mark.parametrize(
    "build, rtol",
    [
        pytest.param(lambda: layer_norm(f32, rows=300, cols=96), 1e-6, id="layer_norm-f32"),
        pytest.param(
            lambda: accy.value_and_grad(layer_norm_loss(bf16), wrt=[0, 1]), 2.0**-7, id="ln-grad"
        ),
    ],
)
def test_cuda_matches_the_unfused_plan(build, rtol):
    # The same operations in the same order; only contractions into FMAs (NVRTC's default)
    # may differ between a kernel of its own and the reduction's.
    program = build()
    inputs = _inputs(program)
    got = native_cuda(program, inputs)
    with accy.config.override(lower_epilogue_window=0):
        CACHE.clear()
        try:
            unfused = native_cuda(program, inputs)
        finally:
            CACHE.clear()
    for position, (g, u) in enumerate(zip(got, unfused, strict=True)):
        assert_close_scaled(g, u, rtol, f"{program.name} output {position}: fused against unfused")


def test_cuda_long_rows_with_blocks_and_vector_loads():
    # Rows of 8200 (a block per row, 16-byte loads): the epilogue runs in thread 0 of a block.
    program = layer_norm(bf16, rows=8, cols=8200)
    inputs = _inputs(program)
    got = native_cuda(program, inputs)
    assert_close_scaled(got[0], accy.reference.run(program, inputs)[0], 2.0**-6, "long rows")


# The CUDA source (no GPU needed) ----------------------------------------------------------------


def _kernels(source: str) -> dict[str, str]:
    """Kernel comment ('step N: kind ...') -> its text."""
    parts = re.split(r"/\* (step [\d.]+: [^*]*)\*/", source)
    return {parts[k].strip(): parts[k + 1] for k in range(1, len(parts), 2)}


def test_cuda_layer_norm_runs_no_kernel_over_the_row_scalars():
    # GPT-2's shape: 8192 rows of 768.
    # The mean, the variance and the output: one kernel, a chain's three passes over each row.
    kernels = _kernels(compile_program(layer_norm(bf16, rows=8192, cols=768)).source)
    assert len(kernels) == 1
    assert not any("8192LL; i +=" in text for text in kernels.values())
    chain = kernels["step 0: chain (chain)"]
    mean, variance, _ = chain.split("__syncwarp();")  # a warp per row of 768
    assert "/ 768.0f" in mean and "result0" in mean
    assert "1 / sqrtf(" in variance and "accy_bf16_store" in variance


def test_cuda_epilogue_of_a_two_pass_reduction_is_in_the_combining_pass():
    # Two rows of 200000: each row cut into chunks, partial values combined by a second kernel.
    # The chain of the mean and the variance runs as two reductions (too few rows for one pass).
    kernels = _kernels(compile_program(layer_norm(f32, rows=2, cols=200000)).source)
    for step in ("0.0", "0.1"):
        assert "result0" not in kernels[f"step {step}: reduce"]
        assert "result0" in kernels[f"step {step}: reduce (combine)"]


def test_cuda_two_pass_reduction_with_an_epilogue():
    program = layer_norm(f32, rows=2, cols=200000)
    inputs = _inputs(program)
    got = native_cuda(program, inputs)
    assert_close_scaled(got[0], accy.reference.run(program, inputs)[0], 1e-5, "two passes")


def test_cuda_layer_norm_backward_runs_no_kernel_over_the_row_scalars():
    gradient = accy.value_and_grad(layer_norm_loss(bf16, rows=8192, cols=768, out=32), wrt=[0, 1])
    kernels = _kernels(compile_program(gradient).source)
    small = [what for what, text in kernels.items() if "< 8192LL; i +=" in text]
    assert not small, f"kernels over the 8192 row scalars: {small}"


@pytest.mark.slow
@needs_nvcc
def test_the_kernels_with_epilogues_compile():
    programs = [
        layer_norm(bf16, rows=8192, cols=768),
        mean_and_log(bf16),
        integer_rows(),
        accy.value_and_grad(cross_entropy_loss(bf16), wrt=[0]),
        accy.value_and_grad(layer_norm_loss(bf16, rows=64, cols=768, out=32), wrt=[0, 1]),
    ]
    source = "".join(
        compile_program(program, prefix=f"e{n}_").source for n, program in enumerate(programs)
    )
    assert source.count("result0") >= len(programs)
    toolchain.ptx_with_nvcc(source, "reduction epilogues", arch="compute_90")
