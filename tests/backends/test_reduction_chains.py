"""Row reductions that read an earlier one's per-row results at their own row run as one
`chain` step (`accy.lower.grouping.reduction_chains`): the plan's chains, their values on the
CPU and on CUDA against the reference evaluator and NumPy, and the CUDA source."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import accy
from accy import bf16, f32, f64, spec
from accy.backends.base import CACHE
from accy.backends.cuda import compile_program
from accy.kernel import toolchain
from accy.lower import build_plan, explain, grouping
from accy.lower.target import CPU, GPU

from ..executors import cuda_device_or_skip, native_cpu, native_cuda, needs_nvcc
from ..halves import assert_close_scaled
from .row_losses import (
    check_against_reference,
    cross_entropy_loss,
    layer_norm_loss,
    random_inputs,
)

TARGETS = [pytest.param(CPU, id="cpu"), pytest.param(GPU, id="gpu")]
EXECUTORS = [pytest.param(native_cpu, id="cpu"), pytest.param(native_cuda, id="cuda")]


def chains(plan):
    return [step for step in plan.steps if step.kind == "chain"]


def phase_ops(chain):
    """Each phase's reducers, e.g. [["max", "sum"], ["sum"]]; ["loop"] for a loop phase."""
    return [
        ["loop"] if phase.kind == "loop" else [m.op.attrs["op"] for m in phase.members or (phase,)]
        for phase in chain.members
    ]


# Programs ---------------------------------------------------------------------------------------


def softmax_denominator(dtype=f32, rows=8, cols=64):
    return accy.trace.define(
        "denominator",
        [spec(dtype, row=rows, v=cols)],
        lambda b, a: (a[0] - a[0].max("v")).exp().sum("v"),
    )


def three_phases(dtype=f32, rows=12, cols=80):
    # max; sum of exp(x - max); sum of squared probabilities, reading both earlier results.
    def body(b, a):
        x = a[0]
        peak = x.max("v")
        e = (x - peak).exp()
        total = e.sum("v")
        return ((e / total) * (e / total)).sum("v"), total

    return accy.trace.define("three", [spec(dtype, row=rows, v=cols)], body)


def layer_norm(dtype=f32, rows=16, cols=48):
    return accy.trace.define(
        "layer_norm", [spec(dtype, row=rows, v=cols)], lambda b, a: accy.nn.layer_norm(a[0], "v")
    )


def transposed_read(n=8):
    # The second reduction keeps axis b and reads the max of row a: another row's result.
    def body(b, a):
        x = a[0]
        peak = x.max("b")  # [a]
        return (x.transpose(("b", "a")) - peak).exp().sum("a")

    return accy.trace.define("transposed", [spec(f32, a=n, b=n)], body)


def shifted_read(rows=8, cols=16):
    # The second reduction reads the max of the next row (rolled by one).
    def body(b, a):
        x = a[0]
        peak = x.max("v")
        rolled = b.concatenate([peak.slice("row", 1), peak.slice("row", 0, 1)], "row")
        return (x - rolled).exp().sum("v")

    return accy.trace.define("shifted", [spec(f32, row=rows, v=cols)], body)


# The plan ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_cross_entropy_forward_is_one_chain(target):
    plan = build_plan(cross_entropy_loss(bf16), target)
    (chain,) = chains(plan)
    assert phase_ops(chain) == [["max", "sum"], ["sum"]]  # max and pick; then sum(exp(x - max))
    assert [step.kind for step in plan.steps] == ["chain", "reduce", "loop"]
    assert "2 passes over each row in turn" in explain(plan)


def test_cross_entropy_gradient_chains():
    # The GPU computes exp(logits - max) inside the sum. The CPU stores exp(logits - max)
    # first: a loop computing exp, which its chains leave alone (its loops call libmvec's
    # vector exp, whose bits differ from a scalar call's). The logits here are a parameter,
    # which no result takes in place: their gradient is the chain's last phase (over a GEMM's
    # logits it is too, in place: test_a_last_loop_writes_over_the_logits_as_the_last_phase).
    gradient = accy.value_and_grad(cross_entropy_loss(bf16), wrt=[0])
    (chain,) = chains(build_plan(gradient, GPU))
    assert phase_ops(chain) == [["max", "sum"], ["sum"], ["loop"]]
    assert chain.members[1].epilogue  # the softmax's 1 / sum
    assert gradient.parameters[0] in chain.reads
    assert not chains(build_plan(gradient, CPU))
    assert "exp" in CPU.epilogue_excludes


@pytest.mark.parametrize("target", TARGETS)
def test_layer_norm_forward_and_backward_chain(target):
    # The mean, the variance (of x - mean computed inline) and the normalized output: one step.
    forward = build_plan(layer_norm(bf16), target)
    assert [step.kind for step in forward.steps] == ["chain"]
    assert phase_ops(forward.steps[0]) == [["sum"], ["sum"], ["loop"]]
    # With a backward pass x - mean is stored (read again there): a loop phase between. The
    # backward's last loop (the input's gradient) reads a buffer for the last time that it
    # could take (`_InPlace`), which the earlier phases read at their own rows alone: the
    # GPU's chain ends with it (`chains_end_in_place`), the CPU's leaves it a step.
    gradient = build_plan(accy.value_and_grad(layer_norm_loss(bf16), wrt=[0, 1]), target)
    forward, backward = chains(gradient)
    assert phase_ops(forward) == [["sum"], ["loop"], ["sum"], ["loop"]]
    mean, centered, variance, normalized = forward.members
    assert centered.op.kind == "sub" and set(centered.writes) <= set(variance.reads)
    assert set(centered.writes) <= set(normalized.reads)
    first, second, *last = backward.members
    assert set(first.writes) & set(second.reads)  # the second reads the first's row scalar
    if target.chains_end_in_place:
        assert phase_ops(backward) == [["sum"], ["sum"], ["loop"]]
        assert gradient.steps[-1] is backward
    else:
        assert phase_ops(backward) == [["sum"], ["sum"]]
        last = [gradient.steps[-1]]
    assert last[-1].kind == "loop" and set(second.writes) <= set(last[-1].reads)


def test_three_phases_are_one_chain():
    (chain,) = chains(build_plan(three_phases(), GPU))
    assert phase_ops(chain) == [["max"], ["sum"], ["sum"]]
    # The CPU stores exp(x - max) (a loop over the rows between the max and the sums, which no
    # chain takes); the two sums that read it chain.
    (chain,) = chains(build_plan(three_phases(), CPU))
    assert phase_ops(chain) == [["sum"], ["sum"]]


@pytest.mark.parametrize("build", [transposed_read, shifted_read])
@pytest.mark.parametrize("target", TARGETS)
def test_a_reduction_reading_another_row_does_not_chain(target, build):
    plan = build_plan(build(), target)
    assert not chains(plan)
    assert [s.kind for s in plan.steps if s.kind in ("reduce", "reductions")] == ["reduce"] * 2


def _centered_then(read):
    """max; y = x - max (an output, so stored: a loop over the rows); a sum of `read(y)`."""

    def body(b, a):
        x = a[0]
        y = x - x.max("v")
        return y, read(b, y).sum("v")

    return accy.trace.define("centered", [spec(f32, row=8, v=32)], body)


@pytest.mark.parametrize("target", TARGETS)
def test_a_loop_between_reductions_is_a_phase(target):
    (chain,) = chains(build_plan(_centered_then(lambda b, y: y * y), target))
    assert phase_ops(chain) == [["max"], ["loop"], ["sum"]]


@pytest.mark.parametrize("target", TARGETS)
def test_a_loop_value_read_in_another_row_does_not_chain(target):
    # The sum reads the loop's y of the next row (rolled by one): written by other threads.
    def rolled(b, y):
        return b.concatenate([y.slice("row", 1), y.slice("row", 0, 1)], "row")

    plan = build_plan(_centered_then(rolled), target)
    (chain,) = chains(plan)
    assert phase_ops(chain) == [["max"], ["loop"]]  # y, the chain's last phase; not the sum
    assert [step.kind for step in plan.steps] == ["chain", "reduce"]


def softmax(dtype=f32, rows=8, cols=32):
    return accy.trace.define(
        "softmax", [spec(dtype, row=rows, v=cols)], lambda b, a: accy.nn.softmax(a[0], "v")
    )


def test_a_loop_after_the_last_reduction_is_the_last_phase():
    # softmax: max, sum of exp(x - max), then exp(x - max) / sum: one kernel on the GPU. The
    # CPU stores exp(x - max) by a loop computing exp (no phase there), so nothing chains.
    plan = build_plan(softmax(), GPU)
    (chain,) = plan.steps
    assert phase_ops(chain) == [["max"], ["sum"], ["loop"]]
    assert not chains(build_plan(softmax(), CPU))
    off = replace(GPU, chains_reductions=True)
    with accy.config.override(lower_chain_trailing_loops=False):
        assert [step.kind for step in build_plan(softmax(), off).steps] == ["chain", "loop"]


def _cross_entropy_over_a_gemm(rows=16, classes=1000, dtype=f32):
    def body(b, a):
        logits = a[0].contract(a[1], "d")
        return accy.nn.cross_entropy(logits, a[2], "v").mean("row")

    program = accy.trace.define(
        "ce_gemm",
        [spec(dtype, row=rows, d=8), spec(dtype, d=8, v=classes), spec(accy.i32, row=rows)],
        body,
    )
    return accy.value_and_grad(program, wrt=[1])


def test_a_last_loop_writes_over_the_logits_as_the_last_phase():
    # Cross-entropy over a GEMM's logits: their gradient is written over them (the last read
    # of a buffer as large), by the chain's last phase on the GPU (one pass fewer over the
    # logits, no more memory), by a loop of its own on the CPU.
    gradient = _cross_entropy_over_a_gemm()
    plan = build_plan(gradient, GPU)
    (chain,) = chains(plan)
    assert phase_ops(chain) == [["max", "sum"], ["sum"], ["loop"]]
    logits = next(s for s in plan.steps if s.kind == "dot").writes[0]
    (taker,) = [s for s in plan.steps if logits in s.reads]
    assert taker is chain and chain.members[-1].writes[0] in plan.in_place  # the logits' buffer
    apart = build_plan(gradient, replace(GPU, chains_end_in_place=0))
    assert len(apart.steps) == len(plan.steps) + 1
    # No second buffer of logits (64,000 bytes): the placement moves by an alignment at most.
    assert plan.workspace_bytes - apart.workspace_bytes <= 256
    cpu = build_plan(gradient, CPU)
    assert not any(c.members[-1].kind == "loop" for c in chains(cpu))
    assert any(s.kind == "loop" and s.writes[0] in cpu.in_place for s in cpu.steps)


def test_a_last_loop_over_rows_longer_than_the_bound_stays_a_step():
    # GPT-2's 50,304-wide rows: the logits' gradient is a loop of its own after the chain
    # (`Target.chains_end_in_place` bounds the rows' elements), still over the logits' buffer.
    gradient = _cross_entropy_over_a_gemm(rows=2, classes=GPU.chains_end_in_place + 1)
    plan = build_plan(gradient, GPU)
    (chain,) = chains(plan)
    assert phase_ops(chain) == [["max", "sum"], ["sum"]]
    logits = next(s for s in plan.steps if s.kind == "dot").writes[0]
    (taker,) = [s for s in plan.steps if logits in s.reads and s is not chain]
    assert taker.kind == "loop" and taker.writes[0] in plan.in_place
    at_bound = build_plan(_cross_entropy_over_a_gemm(2, GPU.chains_end_in_place), GPU)
    assert phase_ops(chains(at_bound)[0])[-1] == ["loop"]


def test_a_last_loop_stays_a_step_where_an_earlier_phase_reads_another_row():
    # y - x[next row] between the max and the sum reads x away from its own row: the loop that
    # could write over x (the last read) stays a step, after every row's passes.
    def body(b, a):
        x = a[0].contract(a[1], "d")  # stored: a buffer a result may take
        peak = x.max("v")
        rolled = b.concatenate([x.slice("row", 1), x.slice("row", 0, 1)], "row")
        total = (x - peak - rolled).sum("v")
        return (x * total).contract(a[1], "v")  # x * total stored, for the GEMM

    program = accy.trace.define("rolled", [spec(f32, row=8, d=4), spec(f32, d=4, v=32)], body)
    plan = build_plan(program, GPU)
    (chain,) = chains(plan)
    assert phase_ops(chain)[-1] != ["loop"]
    last = plan.steps[-2]
    assert last.kind == "loop" and last.writes[0] in plan.in_place


def test_a_step_between_that_reads_the_first_result_stays_after_the_chain():
    # The sum of the rows' maxima (hoisted to just after the max) reads the first phase's
    # result: it runs after the chain; the chain's sum reads nothing it writes.
    def body(b, a):
        x = a[0]
        peak = x.max("v")
        return peak.sum("row"), (x - peak).exp().sum("v")

    program = accy.trace.define("between", [spec(f32, row=8, v=32)], body)
    plan = build_plan(program, GPU)
    assert [step.kind for step in plan.steps] == ["chain", "reduce"]
    assert plan.steps[1].op.results[0] == program.outputs[0]


def test_no_chain_through_a_step_that_depends_on_the_first():
    # The second sum reads a value (a column sum of x - max) that needs the first's result
    # and is made by a step of its own in between: it cannot move up, so there is no chain.
    def body(b, a):
        x = a[0]
        peak = x.max("v")
        shift = (x - peak).sum("row")  # [v], a columns reduction after the max
        return (x - shift).exp().sum("v")

    plan = build_plan(accy.trace.define("pinned", [spec(f32, row=8, v=32)], body), GPU)
    assert not chains(plan)


def test_a_chain_holds_a_bounded_number_of_operations():
    def body(b, a):
        x = a[0]
        total = x.sum("v")
        for k in range(40):
            y = x
            for _ in range(12):
                y = (y * float(k + 2) + total).tanh()
            total = y.sum("v")
        return total

    plan = build_plan(accy.trace.define("long", [spec(f32, row=4, v=8)], body), GPU)
    found = chains(plan)
    assert len(found) >= 2
    for chain in found:
        assert sum(grouping._phase_operations(p) for p in chain.members) <= (
            grouping.MAX_GROUP_OPERATIONS
        )


def test_switched_off_by_the_target():
    assert not chains(build_plan(softmax_denominator(), replace(GPU, chains_reductions=False)))


# Values -----------------------------------------------------------------------------------------


def _check(executor, program, rtol, expected=None, seed=0):
    check_against_reference(executor, program, expected, rtol, seed, scale=2.0, shift=0.5)


def _softmax_parts(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(1, keepdims=True))
    total = e.sum(1, keepdims=True)
    return e, total


VALUE_PROGRAMS = [
    pytest.param(lambda: softmax_denominator(f32), 1e-5, id="denominator-f32"),
    pytest.param(lambda: three_phases(f32), 1e-5, id="three-f32"),
    pytest.param(lambda: softmax_denominator(f32, rows=300, cols=8), 1e-5, id="thread-per-row"),
    # Few long rows: on CUDA each phase its own two-pass reduction.
    pytest.param(lambda: three_phases(bf16, rows=8, cols=8200), 2.0**-6, id="three-bf16-long"),
    pytest.param(lambda: cross_entropy_loss(bf16), 2.0**-6, id="ce-bf16"),
    pytest.param(lambda: layer_norm(f32), 1e-5, id="layer_norm-f32"),
    pytest.param(lambda: softmax(bf16, rows=300, cols=4200), 2.0**-7, id="softmax-long"),
    pytest.param(lambda: _centered_then(lambda b, y: y * y), 1e-5, id="loop-phase"),
    pytest.param(lambda: layer_norm(bf16, rows=300, cols=4200), 2.0**-6, id="layer_norm-long"),
    pytest.param(
        lambda: accy.value_and_grad(cross_entropy_loss(f32), wrt=[0]), 1e-5, id="ce-grad-f32"
    ),
    pytest.param(
        lambda: accy.value_and_grad(cross_entropy_loss(bf16), wrt=[0]), 2.0**-5, id="ce-grad-bf16"
    ),
    pytest.param(
        lambda: accy.value_and_grad(layer_norm_loss(f32), wrt=[0, 1]), 1e-4, id="ln-grad-f32"
    ),
    pytest.param(
        lambda: accy.value_and_grad(layer_norm_loss(f64, rows=3000, cols=40, out=3), wrt=[0, 1]),
        1e-10,
        id="ln-grad-f64-many-rows",
    ),
    # The logits' gradient written over the GEMM's logits by the chain's last phase (GPU).
    pytest.param(lambda: _cross_entropy_over_a_gemm(), 1e-5, id="ce-gemm-grad-f32"),
    pytest.param(
        lambda: _cross_entropy_over_a_gemm(300, 5000, bf16), 2.0**-5, id="ce-gemm-grad-bf16"
    ),
]


@pytest.mark.parametrize("build, rtol", VALUE_PROGRAMS)
def test_the_value_programs_chain(build, rtol):
    assert chains(build_plan(build(), GPU))


@pytest.mark.slow
@pytest.mark.parametrize("build, rtol", VALUE_PROGRAMS)
@pytest.mark.parametrize("executor", EXECUTORS)
def test_chained_programs_match_the_reference(executor, build, rtol):
    _check(executor, build(), rtol)


def _with_gemm(update):
    """max, sum(x - max) and x * sum over the rows of a GEMM's x, `update` (a GEMM) reading the
    last: that loop may write over x."""

    def body(b, a):
        x = a[0].contract(a[1], "d")
        total = (x - x.max("v")).sum("v")
        return update(b, x * total, a[1])

    return accy.trace.define("with_gemm", [spec(f32, row=24, d=4), spec(f32, d=4, v=96)], body)


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: _with_gemm(lambda b, y, w: y.contract(w, "v")), id="rows"),
        pytest.param(_cross_entropy_over_a_gemm, id="ce-gemm-grad"),
    ],
)
def test_a_chain_ending_in_place_matches_the_reference_on_the_cpu(monkeypatch, build):
    # The CPU backend planned as the GPU plans chains (`chains_end_in_place`): each row's last
    # pass writes over the buffer that the row's earlier passes read.
    from accy.backends.cpu import compile as cpu_compile

    target = replace(CPU, chains_end_in_place=GPU.chains_end_in_place)
    program = build()
    plan = build_plan(program, target)
    (end,) = [c.members[-1] for c in chains(plan) if c.members[-1].kind == "loop"]
    assert end.writes[0] in plan.in_place
    monkeypatch.setattr(cpu_compile, "build_plan", lambda p: build_plan(p, target))
    CACHE.clear()
    try:
        _check(native_cpu, program, 1e-5)
    finally:
        CACHE.clear()


@pytest.mark.parametrize("executor", EXECUTORS)
def test_three_phases_match_numpy(executor):
    def expected(x):
        e, total = _softmax_parts(x)
        p = e / total
        return (p * p).sum(1), total[:, 0]

    _check(executor, three_phases(f64), 1e-12, expected)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_chain_gives_the_bits_of_separate_steps(executor):
    # Each phase computes what its step computed on its own: the same bits, but for CUDA's
    # contractions into FMAs (NVRTC's default), which a loop's kernel of its own and a chain's
    # loop phase may make differently.
    program = accy.value_and_grad(layer_norm_loss(f32, rows=40, cols=96), wrt=[0, 1])
    inputs = random_inputs(program, np.random.default_rng(1))
    chained = executor(program, inputs)
    with accy.config.override(lower_chain_window=0):
        assert not chains(build_plan(program, GPU))
        CACHE.clear()
        try:
            apart = executor(program, inputs)
        finally:
            CACHE.clear()
    for position, (c, a) in enumerate(zip(chained, apart, strict=True)):
        if executor is native_cpu:
            assert np.asarray(c).tobytes() == np.asarray(a).tobytes(), f"output {position} differs"
        else:
            assert_close_scaled(c, a, 1e-6, f"output {position}: chained against apart")


# The CUDA source (no GPU needed) ----------------------------------------------------------------


def _chain_kernel(source: str) -> str:
    start = source.index(": chain (chain) */")
    return source[start : source.index("\n}\n", start)]


def test_the_cuda_chain_is_one_kernel_with_a_barrier_between_passes():
    # GPT-2's cross-entropy rows (a block per row): the sum's pass reads the max where the first
    # pass stored it, after the block's barrier.
    source = compile_program(cross_entropy_loss(bf16, rows=8192, classes=50304)).source
    kernel = _chain_kernel(source)
    first, second = kernel.split("__syncthreads();\n    {")
    assert "p0_acc0" in first and "p0_acc1" in first and "p1_acc0" in second
    stored = {line.split("[")[0].strip() for line in first.splitlines() if "[o] =" in line}
    assert len(stored) == 2  # the max and the pick
    assert len([p for p in stored if f"{p}[k0]" in second]) == 1  # the max, loaded at the row
    assert "expf(" in second and source.count(": chain (chain) */") == 1


def test_the_cuda_chain_of_layer_norm_stores_the_centered_rows_then_the_output():
    gradient = accy.value_and_grad(layer_norm_loss(bf16, rows=8192, cols=768, out=32), wrt=[0, 1])
    kernel = _chain_kernel(compile_program(gradient).source)  # the forward's, the first
    mean, centered, variance, normalized = kernel.split("__syncwarp();")  # a warp per row
    assert "p0_acc0" in mean and "_acc" not in centered and "p2_acc0" in variance
    assert "_acc" not in normalized and "*(accy_vector<uint16_t, 8> *)" in normalized
    # x - mean stored 8 bf16 at a time, then read back by the variance's pass.
    (store,) = [line for line in centered.splitlines() if line.strip().startswith("*(accy_vector")]
    pointer = store.split("(")[2].split(" +")[0]
    assert f"(const accy_vector<uint16_t, 8> *)({pointer} + k0 * 768" in variance


def test_the_sum_of_exponentials_of_an_f32_max_is_added_in_the_max_pass():
    # The f32 cross-entropy's rows: the sum of exp(x - max) runs with the max in one pass over
    # each row (each thread's sum relative to its running max), one read of the logits.
    kernel = _chain_kernel(
        compile_program(cross_entropy_loss(f32, rows=8192, classes=50304)).source
    )
    assert "__syncthreads();\n    {" not in kernel  # one pass
    assert "p1_sum * accy_softmax_expf(p1_sum_peak - p0_acc0)" in kernel
    assert "p1_sum_shared[threadIdx.x / 32] = p1_sum;" in kernel
    # A bf16 max is stored rounded: the sum's own pass reads that value (two passes).
    kernel = _chain_kernel(compile_program(softmax_denominator(bf16, 2048, 4096)).source)
    assert "p1_sum" not in kernel and "p1_acc0" in kernel


@pytest.mark.parametrize("lanes", [1, 32, 256])
def test_a_running_sum_of_exponentials_matches_the_reference_on_cuda(lanes):
    # Rows of one thread (8 columns), a warp (512) and a block (4096) each, on random values
    # and on rows of -inf only (NaN, as the reference has it), half -inf, one +inf, one NaN.
    cuda_device_or_skip()
    cols = {1: 8, 32: 512, 256: 4096}[lanes]
    program = softmax_denominator(f32, rows=1024, cols=cols)
    kernel = _chain_kernel(compile_program(program).source)
    assert f"threadIdx.x % {lanes};" in kernel or lanes == 1
    x = np.random.default_rng(5).standard_normal((1024, cols)).astype(np.float32) * 4
    x[0] = -np.inf
    x[1, : cols // 2] = -np.inf
    x[2, cols // 3] = np.inf
    x[3, cols // 5] = np.nan
    (got,) = native_cuda(program, [x])
    (want,) = accy.reference.run(program, [x])
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, equal_nan=True)
    assert np.isnan(np.asarray(got)[[0, 2, 3]]).all()


@pytest.mark.parametrize(("rows", "lanes"), [(8192, 16), (8193, 32), (2048, 32)])
def test_many_rows_of_a_warp_take_half_a_warp_each(rows, lanes):
    # GPT-2's layer-norm rows (768 bf16: 96 vectors of 8): 8192 rows at a warp each would
    # be more than a wave of threads, so half a warp walks a row; an odd count of rows (a
    # warp's halves would run different passes) and fewer rows keep a warp a row.
    kernel = _chain_kernel(compile_program(layer_norm(bf16, rows=rows, cols=768)).source)
    assert f"const int lane = threadIdx.x % {lanes};" in kernel
    assert f"for (int d = {lanes // 2}; d > 0; d >>= 1)" in kernel


@pytest.mark.parametrize(
    ("dtype", "rtol"), [pytest.param(f32, 1e-4, id="f32"), pytest.param(bf16, 2.0**-5, id="bf16")]
)
def test_rows_of_half_a_warp_match_the_reference_on_cuda(dtype, rtol):
    # The layer norm's forward and backward chains over 8192 rows of 768, half a warp a row.
    cuda_device_or_skip()
    program = accy.value_and_grad(layer_norm_loss(dtype, rows=8192, cols=768, out=3), wrt=[0, 1])
    _check(native_cuda, program, rtol)


def test_few_long_rows_run_each_phase_as_its_own_reduction():
    source = compile_program(layer_norm(f32, rows=2, cols=200000)).source
    assert ": chain (chain) */" not in source
    assert "step 0.0: reduce (combine)" in source and "step 0.1: reduce (combine)" in source


@pytest.mark.slow
@needs_nvcc
def test_the_chain_kernels_compile():
    programs = [
        cross_entropy_loss(bf16, rows=8192, classes=50304),  # a block per row
        accy.value_and_grad(cross_entropy_loss(bf16, rows=64, classes=1000), wrt=[0]),  # a warp
        softmax_denominator(f32, rows=300, cols=8),  # a thread per row
        three_phases(bf16, rows=2048, cols=4200),
        layer_norm(bf16, rows=8192, cols=768),
        accy.value_and_grad(layer_norm_loss(bf16, rows=64, cols=768, out=32), wrt=[0, 1]),
    ]
    source = "".join(
        compile_program(program, prefix=f"c{n}_").source for n, program in enumerate(programs)
    )
    assert source.count(": chain (chain) */") >= len(programs)
    toolchain.ptx_with_nvcc(source, "reduction chains", arch="compute_90")
