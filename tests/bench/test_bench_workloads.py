"""The accy side of the benchmark workloads, at the check scale, against NumPy formulas.

Each formula (loss and gradients, derived by hand) is written here independently of accy and
of the harness; JAX and PyTorch are not needed (bench.systems is never imported). The accy
programs run on the reference evaluator, and on accy's native CPU backend when it exists.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import accy
from bench.compare import normwise_error, tolerance
from bench.measure import repeats_for, time_steps
from bench.runner import Options, SystemResult, WorkloadRun
from bench.workloads import WORKLOADS, gpu_extents
from bench.workloads.attention import causal_mask

Arrays = list[np.ndarray]


def softmax(logits: np.ndarray) -> np.ndarray:
    weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True)


def tiny(x: np.ndarray, y: np.ndarray) -> Arrays:
    return [np.sum(x * y), y, x]


def mlp(x: np.ndarray, w1: np.ndarray, w2: np.ndarray, y: np.ndarray) -> Arrays:
    hidden = np.tanh(x @ w1)
    logits = hidden @ w2
    peak = logits.max(axis=-1)
    logsumexp = peak + np.log(np.exp(logits - peak[:, None]).sum(axis=-1))
    loss = np.sum(logsumexp - (logits * y).sum(axis=-1))
    d_logits = softmax(logits) - y  # each row of y sums to 1
    d_hidden = (d_logits @ w2.T) * (1 - hidden**2)
    return [loss, x.T @ d_hidden, hidden.T @ d_logits]


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray) -> Arrays:
    weights = softmax(q @ k.T + mask)
    mixed = weights @ v
    d_mixed = 2 * mixed
    d_weights = d_mixed @ v.T
    d_scores = weights * (d_weights - (d_weights * weights).sum(axis=-1, keepdims=True))
    return [np.sum(mixed**2), d_scores @ k, d_scores.T @ q, weights.T @ d_mixed]


def embedding(table: np.ndarray, ids: np.ndarray) -> Arrays:
    rows = table[ids]
    d_table = np.zeros_like(table)
    np.add.at(d_table, ids, 2 * rows)
    return [np.sum(rows**2), d_table]


def elementwise(x: np.ndarray) -> Arrays:
    bump = np.exp(-x * x)
    loss = np.sum(np.tanh(x) * bump + np.abs(x))
    d_x = (1 - np.tanh(x) ** 2) * bump - 2 * x * np.tanh(x) * bump + np.sign(x)
    return [loss, d_x]


def block(x, w1, w2, gain, bias, eps=1e-5) -> Arrays:
    centered = x - x.mean(axis=-1, keepdims=True)
    normalized = centered / np.sqrt((centered**2).mean(axis=-1, keepdims=True) + eps)
    normed = normalized * gain + bias
    pre = normed @ w1
    c = math.sqrt(2 / math.pi)
    inner = np.tanh(c * (pre + 0.044715 * pre**3))
    hidden = 0.5 * pre * (1 + inner)
    out = hidden @ w2
    d_out = 2 * out
    d_hidden = d_out @ w2.T
    d_gelu = 0.5 * (1 + inner) + 0.5 * pre * (1 - inner**2) * c * (1 + 3 * 0.044715 * pre**2)
    d_pre = d_hidden * d_gelu
    d_normed = d_pre @ w1.T
    return [
        np.sum(out**2),
        normed.T @ d_pre,
        hidden.T @ d_out,
        (d_normed * normalized).sum(axis=0),
        d_normed.sum(axis=0),
    ]


def _patches(x: np.ndarray) -> np.ndarray:
    """[batch, height, width, 3, 3, channel]: each position's 3x3 neighbourhood (zero padded)."""
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    h, w = x.shape[1:3]
    return np.stack(
        [np.stack([padded[:, i : i + h, j : j + w] for j in range(3)], 3) for i in range(3)], 3
    )


def _conv_input_gradient(d_out: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """Each output's gradient sent back to the 3x3 inputs that made it."""
    h, w = d_out.shape[1:3]
    d_padded = np.zeros((d_out.shape[0], h + 2, w + 2, kernel.shape[2]))
    for i in range(3):
        for j in range(3):
            d_padded[:, i : i + h, j : j + w] += d_out @ kernel[i, j].T
    return d_padded[:, 1:-1, 1:-1]


def conv(x, k1, k2, w, labels) -> Arrays:
    def convolve(a, kernel):
        return np.einsum("bhwijc,ijco->bhwo", _patches(a), kernel)

    def kernel_gradient(a, d_out):
        return np.einsum("bhwijc,bhwo->ijco", _patches(a), d_out)

    first = convolve(x, k1)
    hidden = np.maximum(first, 0)
    summed = convolve(hidden, k2) + x
    block = np.maximum(summed, 0)
    pooled = block.mean(axis=(1, 2))
    logits = pooled @ w
    batch, classes = logits.shape
    one_hot = np.eye(classes)[labels]
    peak = logits.max(axis=-1)
    logsumexp = peak + np.log(np.exp(logits - peak[:, None]).sum(axis=-1))
    loss = np.mean(logsumexp - (logits * one_hot).sum(axis=-1))
    d_logits = (softmax(logits) - one_hot) / batch
    d_pooled = d_logits @ w.T
    d_summed = (summed > 0) * d_pooled[:, None, None, :] / (x.shape[1] * x.shape[2])
    d_first = (first > 0) * _conv_input_gradient(d_summed, k2)
    return [
        loss,
        kernel_gradient(x, d_first),
        kernel_gradient(hidden, d_summed),
        pooled.T @ d_logits,
    ]


def _pool_windows(a: np.ndarray, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """3x3 windows of `a` padded by 1 with -inf ({b, h, w, 9, c}) and each window element's
    flat position in `a` (-1 for padding)."""
    b, h, w, c = a.shape
    padded = np.pad(a, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-np.inf)
    where = np.pad(
        np.arange(a.size).reshape(a.shape), ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-1
    )
    rows, cols = (h + 2 - 3) // stride + 1, (w + 2 - 3) // stride + 1
    pieces = [
        (
            padded[:, i : i + stride * rows : stride, j : j + stride * cols : stride],
            where[:, i : i + stride * rows : stride, j : j + stride * cols : stride],
        )
        for i in range(3)
        for j in range(3)
    ]
    return np.stack([p for p, _ in pieces], 3), np.stack([q for _, q in pieces], 3)


def pool(x, w) -> Arrays:
    windows, where = _pool_windows(x, 2)
    stem = windows.max(axis=3)
    padded = np.pad(stem, ((0, 0), (1, 1), (1, 1), (0, 0)))
    h, wd = stem.shape[1:3]
    branch = sum(padded[:, i : i + h, j : j + wd] for i in range(3) for j in range(3)) / 9
    loss = np.mean(branch * w)
    d_branch = np.broadcast_to(w, branch.shape) / branch.size
    d_padded = np.zeros(padded.shape)
    for i in range(3):
        for j in range(3):
            d_padded[:, i : i + h, j : j + wd] += d_branch / 9
    d_stem = d_padded[:, 1:-1, 1:-1]
    chosen = np.take_along_axis(where, windows.argmax(axis=3)[:, :, :, None], 3)[:, :, :, 0]
    d_x = np.zeros(x.size)
    np.add.at(d_x, chosen.ravel(), d_stem.ravel())
    return [loss, d_x.reshape(x.shape)]


FORMULAS: dict[str, Callable[..., Arrays]] = {
    f.__name__: f for f in (tiny, mlp, attention, embedding, elementwise, block, conv, pool)
}


def executors() -> list:
    runs = [pytest.param(accy.reference.run, id="reference")]
    if callable(getattr(accy, "compile", None)):
        native = lambda program, inputs: accy.compile(program, device="cpu")(*inputs)  # noqa: E731
        runs.append(pytest.param(native, id="cpu"))
    return runs


def in_float64(arrays: Arrays) -> Arrays:
    return [a.astype(np.float64) if a.dtype.kind == "f" else a for a in arrays]


def test_every_workload_of_workloads_md_is_here():
    assert list(WORKLOADS) == [
        "tiny",
        "mlp",
        "attention",
        "embedding",
        "elementwise",
        "block",
        "conv",
        "pool",
    ]
    assert set(FORMULAS) == set(WORKLOADS)


@pytest.mark.parametrize("run", executors())
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_accy_workload_matches_numpy_formula(name, run):
    workload = WORKLOADS[name]
    inputs = workload.make_inputs("check", seed=3)
    outputs = run(workload.value_and_grad("check"), inputs)
    expected = FORMULAS[name](*in_float64(inputs))
    assert len(outputs) == len(expected) == len(workload.output_names)
    for output_name, actual, wanted in zip(workload.output_names, outputs, expected, strict=True):
        assert np.asarray(actual).dtype == np.float32, output_name
        error = normwise_error(actual, wanted)
        assert error <= tolerance(np.dtype(np.float32)), f"{name} {output_name}: {error:.2e}"


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_inputs_are_seeded_and_laid_out_as_the_specs(name):
    workload = WORKLOADS[name]
    first, again = workload.make_inputs("check", 7), workload.make_inputs("check", 7)
    for array, same, spec in zip(
        first, again, workload.specs(workload.extents("check")), strict=True
    ):
        np.testing.assert_array_equal(array, same)
        assert array.shape == spec.extents
        assert array.dtype == spec.dtype.numpy
    assert not np.array_equal(first[0], workload.make_inputs("check", 8)[0])


def test_the_cpu_scale_is_that_of_workloads_md():
    sizes = {name: w.extents("cpu") for name, w in WORKLOADS.items()}
    assert sizes["mlp"] == {"batch": 256, "in": 512, "hidden": 512, "out": 10}
    assert sizes["attention"] == {"token": 256, "channel": 64}
    assert sizes["embedding"] == {"vocab": 32768, "channel": 256, "token": 4096}
    assert sizes["elementwise"] == {"n": 4194304}
    assert sizes["block"] == {"row": 2048, "embed": 512, "ff": 2048}
    assert sizes["conv"] == {"batch": 16, "height": 32, "width": 32, "channel": 64, "class": 10}
    assert WORKLOADS["conv"].extents("cuda")["batch"] == 128


def test_the_gpu_scale_multiplies_batch_token_row_and_sets_the_vocab():
    assert gpu_extents({"vocab": 32768, "channel": 256, "token": 4096}) == {
        "vocab": 131072,
        "channel": 256,
        "token": 32768,
    }
    assert gpu_extents({"row": 2048, "embed": 512}) == {"row": 16384, "embed": 512}


def test_causal_mask_lets_a_token_see_itself_and_the_past():
    np.testing.assert_array_equal(causal_mask(3), [[0, -30, -30], [0, 0, -30], [0, 0, 0]])


def test_normwise_error_flags_wrong_shapes_and_nans_and_scales_by_the_largest_value():
    assert normwise_error(np.ones(3), np.ones(4)) == math.inf
    assert normwise_error(np.array([1.0, np.nan]), np.array([1.0, 2.0])) == math.inf
    assert normwise_error(np.array([100.0, 1.0]), np.array([100.0, 0.0])) == pytest.approx(0.01)
    assert normwise_error(np.zeros(2), np.zeros(2)) == 0.0
    assert tolerance(np.dtype(np.float32)) == pytest.approx(4 * 2.0**-11.5)


def test_time_steps_warms_up_then_times_the_requested_repeats():
    calls = []
    timing = time_steps(lambda: calls.append(1), budget_s=0.01, repeat=7)
    assert timing.repeats == 7
    assert len(calls) == timing.warmup_steps + 7
    assert timing.min_s <= timing.q1_s <= timing.median_s <= timing.q3_s


def test_repeats_fill_the_budget_within_bounds():
    assert repeats_for(0.1, budget_s=1.0) == 10
    assert repeats_for(10.0, budget_s=1.0) == 5
    assert repeats_for(1e-9, budget_s=1.0) == 20000


def test_peak_resident_sees_an_allocation_made_after_reset():
    # In a fresh process: in this one, earlier tests may have left freed pages resident that
    # the allocation reuses without the resident set growing (seen under pytest-xdist).
    script = (
        "import numpy as np; from bench.measure import PeakResident; meter = PeakResident(); "
        "meter.reset(); block = np.ones(8 * 2**20); del block; print(meter.peak_bytes())"
    )
    root = Path(__file__).resolve().parents[2]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, env=environment
    )
    assert int(out.stdout) >= 60 * 2**20


@pytest.mark.slow
def test_the_harness_side_never_imports_the_peers():
    """Only worker processes import JAX or PyTorch, so the harness runs without them."""
    modules = "bench.cli, bench.runner, bench.report, bench.compare, bench.measure, bench.workloads"
    script = f"import sys, {modules}; print(sorted({{'jax', 'torch'}} & set(sys.modules)))"
    completed = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        check=True,
    )
    assert completed.stdout.strip() == "[]"


def test_a_wrong_gradient_stops_the_workload_with_a_message_naming_it(tmp_path):
    workload = WORKLOADS["tiny"]
    run = WorkloadRun(workload, ["accy", "jax"], Options(), scratch=tmp_path)
    correct = accy.reference.run(workload.value_and_grad("cpu"), workload.make_inputs("cpu"))
    small = accy.reference.run(workload.value_and_grad("check"), workload.make_inputs("check"))
    wrong_dy = [correct[0], correct[1], correct[2] * 1.5]
    for system, outputs in (("accy", correct), ("jax", wrong_dy)):
        run.result.systems[system] = SystemResult(system, backend="test")
        (tmp_path / system / "check").mkdir(parents=True)
        np.savez(tmp_path / system / "check" / "outputs.npz", *outputs)
        np.savez(tmp_path / system / "check" / "check_outputs.npz", *small)
    assert not run.systems_agree()
    assert run.result.status == "mismatch"
    assert "accy (test) vs JAX on d/dy: normwise error 3.33e-01 > tolerance" in run.result.message
    assert "d/dx" not in run.result.message


def test_call_paths_prints_microseconds_per_call_for_each_path(capsys):
    from bench import call_paths

    try:
        accy.backends.cpu.find_compiler()
    except accy.RuntimeUnavailable:
        pytest.skip("native CPU backend: no C compiler")
    assert call_paths.main(["--calls", "3", "--rounds", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[0].strip() for line in lines] == [
        "compile(p)(*arrays)",
        "Cpu(p).launch(buffers)",
        "Cpu(p).launch(bytes, memoryviews)",
        "compile(p).run_buffers",
    ]
    assert all(line.endswith("µs per call") for line in lines)
