"""The training workloads of `bench.training` (cnn, char-gpt) at the check scale: accy's first
loss against an independent NumPy forward pass, every system's first steps against JAX's
(through the harness's own check), the FLOP count, and the command line."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from bench import cli, cnn, training

S = cnn.SCALES["check"]
HAS_TORCH = importlib.util.find_spec("torch") is not None


def _numpy_cnn_loss(s: cnn.Scale) -> float:
    """The CNN's mean cross-entropy at its initial parameters, in float64 NumPy."""
    p = {k: v.astype(np.float64) for k, v in cnn.initial_values(s).items()}
    images, labels, keep = cnn.batch(s)
    images, keep = images.astype(np.float64), keep.astype(np.float64)

    def conv_same(x, k):  # x {b, h, w, c}, k {3, 3, c, o}
        padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
        h, w = x.shape[1:3]
        return sum(
            np.einsum("bhwc,co->bhwo", padded[:, i : i + h, j : j + w], k[i, j])
            for i in range(3)
            for j in range(3)
        )

    def pool(x):
        b, h, w, c = x.shape
        return x.reshape(b, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))

    x = pool(np.maximum(conv_same(images, p["conv1"]) + p["conv1_bias"], 0))
    x = pool(np.maximum(conv_same(x, p["conv2"]) + p["conv2_bias"], 0))
    hidden = np.maximum(np.einsum("bhwc,hwco->bo", x, p["dense1"]) + p["dense1_bias"], 0)
    hidden = hidden * keep / (1 - cnn.DROPOUT)
    logits = hidden @ p["dense2"] + p["dense2_bias"]
    top = logits.max(-1, keepdims=True)
    logsumexp = np.log(np.exp(logits - top).sum(-1)) + top[:, 0]
    return float((logsumexp - logits[np.arange(s.batch), labels]).mean())


class _Runs(dict):
    """The harness's worker in this process, run for a system when first asked for: first
    call, CHECK_STEPS losses, brief timings."""

    def __missing__(self, system: str) -> dict:
        self[system] = training.worker("cnn", system, "check", "f32", 0.01)
        return self[system]


@pytest.fixture(scope="module")
def cnn_runs():
    return _Runs()


@pytest.mark.slow
def test_accy_cnn_first_loss_matches_numpy_and_the_steps_train(cnn_runs):
    run = cnn_runs["accy"]
    expected = _numpy_cnn_loss(S)
    assert abs(run["losses"][0] - expected) <= 1e-5 * abs(expected)
    assert len(run["losses"]) == training.CHECK_STEPS and run["losses"][-1] < run["losses"][0]
    assert len(run["rounds"]) == training.ROUNDS


@pytest.mark.slow  # JAX's and PyTorch's runs: seconds each
def test_every_cnn_system_agrees_with_jax_over_the_checked_steps(cnn_runs):
    reference = cnn_runs["jax"]["losses"]
    assert len(reference) == training.CHECK_STEPS
    assert reference[-1] < reference[0]  # the steps train
    for system in ["accy", "jax", *(["torch"] if HAS_TORCH else [])]:
        run = cnn_runs[system]
        verdict = training.check(run["losses"], reference, "f32")
        assert verdict["ok"], (system, verdict)
        assert len(run["rounds"]) == training.ROUNDS


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_char_gpt_accy_agrees_with_jax(dtype):
    accy_run = training.worker("char-gpt", "accy", "check", dtype, 0.01)
    jax_run = training.worker("char-gpt", "jax", "check", dtype, 0.01)
    verdict = training.check(accy_run["losses"], jax_run["losses"], dtype)
    assert verdict["ok"], verdict


def test_the_check_catches_a_wrong_update_that_the_losses_alone_would_pass():
    reference = [2.0, 1.9990, 1.9980]
    wrong_update = [2.0, 1.9995, 1.9990]  # half the decrease: within 1.4e-3 as losses
    verdict = training.check(wrong_update, reference, "f32")
    assert verdict["errors"]["losses"] <= verdict["tolerance"]
    assert not verdict["ok"]
    assert training.check(reference, reference, "f32")["ok"]


def test_a_failed_or_disagreeing_system_fails_the_report():
    ok = {"check_against_jax": {"ok": True}}
    assert not training.failed(
        {"systems": {"jax": {}, "accy": ok, "torch": {"error": "not installed"}}}
    )
    assert training.failed({"systems": {"accy": {"check_against_jax": {"ok": False}}}})
    assert training.failed({"systems": {"accy": {"error": "Traceback ..."}}})


def test_cnn_flops_match_a_hand_count_at_the_check_scale():
    # batch 4, 4x4 images, channels 3 and 4, hidden 5, 3 classes: pooled 2x2 then 1x1
    conv1, conv2 = 16 * 9 * 1 * 3, 4 * 9 * 3 * 4
    dense = 1 * 4 * 5 + 5 * 3
    assert cnn.flops(S) == 2 * 4 * (2 * conv1 + 3 * conv2 + 3 * dense)


def test_python_m_bench_runs_the_training_workloads_when_named(monkeypatch):
    calls = []
    monkeypatch.setattr(training, "main", lambda argv: calls.append(argv) or 0)
    assert cli.main(["--workloads", "cnn,char-gpt", "--systems", "accy,torch"]) == 0
    argv = calls[-1]
    assert argv[argv.index("--workloads") + 1] == "cnn,char-gpt"
    assert argv[argv.index("--systems") + 1] == "accy,torch,torch-compile"
    assert "--dtype" not in argv  # each workload in every precision it has
    cli.main(["--workloads", "char-gpt", "--dtype", "bf16", "--scale", "check", "--quick"])
    assert calls[-1][-6:] == ["--dtype", "bf16", "--scale", "check", "--budget", "0.2"]
    with pytest.raises(SystemExit, match="CPU workloads"):
        cli.main(["--workloads", "cnn", "--device", "cuda"])


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--workloads", "mnist"], "unknown workload mnist"),
        (["--systems", "tf"], "unknown system tf"),
        (["--workloads", "cnn", "--dtype", "bf16"], "none of cnn has it"),
    ],
)
def test_bad_arguments_say_what_is_known(argv, said):
    with pytest.raises(SystemExit, match=said):
        training.main(argv)
