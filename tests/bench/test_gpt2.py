"""The gpt2 workload's accy side at the check scale: its loss against an independent NumPy
forward pass, its training step (AdamW, donated parameters and state) against the same step
without donation, and the FLOP count of WORKLOADS.md."""

from __future__ import annotations

import math

import numpy as np
import pytest

import accy
from accy.frontend.tracing import flatten, unflatten
from bench import gpt2

S = gpt2.SCALES["check"]


def _numpy_loss(p, ids, targets):
    def norm(x, g, b):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-5) * g + b

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))

    x = p["embed"][ids] + p["position"]
    causal = np.tril(np.ones((S.tokens, S.tokens), bool))
    for i in range(S.layers):
        h = norm(x, p[f"l{i}_ln1_gain"], p[f"l{i}_ln1_bias"])
        qkv = np.einsum("btc,cphk->pbthk", h, p[f"l{i}_qkv"]) + p[f"l{i}_qkv_bias"][:, None, None]
        scores = np.einsum("bthk,bshk->bhts", qkv[0], qkv[1]) / math.sqrt(S.head_dim)
        scores = np.where(causal, scores, -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        mixed = np.einsum("bhts,bshk->bthk", weights, qkv[2])
        x = x + np.einsum("bthk,hkc->btc", mixed, p[f"l{i}_proj"]) + p[f"l{i}_proj_bias"]
        h = norm(x, p[f"l{i}_ln2_gain"], p[f"l{i}_ln2_bias"])
        x = x + gelu(h @ p[f"l{i}_fc"] + p[f"l{i}_fc_bias"]) @ p[f"l{i}_out"] + p[f"l{i}_out_bias"]
    logits = norm(x, p["final_gain"], p["final_bias"]) @ p["embed"].T
    shifted = logits - logits.max(-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return -np.take_along_axis(log_p, targets[..., None], -1).mean()


@pytest.mark.slow
def test_the_accy_loss_matches_numpy():
    values = {k: v.astype(np.float64) for k, v in gpt2.initial_values(S).items()}
    values = {k: v * (50.0 if not k.endswith(("gain", "bias")) else 1.0) for k, v in values.items()}
    ids, targets = gpt2.batch(S)
    shapes = gpt2.parameter_shapes(S)
    params = {
        k: accy.named(v.astype(np.float32), tuple(a for a, _ in shapes[k]))
        for k, v in values.items()
    }
    loss = accy.jit(lambda p, i, t: gpt2.accy_loss(p, i, t, S))(
        params, accy.named(ids, ("batch", "token")), accy.named(targets, ("batch", "token"))
    )
    np.testing.assert_allclose(float(loss.array), _numpy_loss(values, ids, targets), rtol=1e-4)


@pytest.mark.slow
def test_a_training_step_updates_in_place_as_without_donation():
    step = gpt2.accy_step(S, "cpu")
    params, state, ids, targets = gpt2.accy_inputs(S, "cpu")
    before = params["decay"]["embed"].array
    leaves, treedef = flatten((params, state))
    copies = unflatten(treedef, [accy.named(np.array(a.array), a.axes) for a in leaves])
    loss, new_params, _ = step(params, state, ids, targets)
    assert new_params["decay"]["embed"].array is before  # the parameter was updated in place
    plain = accy.jit(step.fn)  # the same step, nothing donated
    loss_again, expected, _ = plain(*copies, ids, targets)
    assert float(loss.array) == float(loss_again.array)
    for group in ("decay", "plain"):
        for name, value in expected[group].items():
            np.testing.assert_array_equal(new_params[group][name].array, value.array)
    assert abs(float(loss.array) - math.log(S.vocab)) < 0.1


def test_model_flops_follow_the_workloads_formula():
    small = gpt2.SCALES["cuda"]
    assert gpt2.model_parameters(small) == 123_689_472  # nanoGPT's GPT-2 small count
    expected = 6 * 123_689_472 * 8 * 1024 + 12 * 12 * 8 * 1024**2 * 768
    assert gpt2.model_flops(small) == expected


def _loss_at(values, policy=None, fused=False) -> float:
    ids, targets = gpt2.batch(S)
    shapes = gpt2.parameter_shapes(S)
    params = {
        k: accy.named(v.astype(np.float32), tuple(a for a, _ in shapes[k]))
        for k, v in values.items()
    }

    def loss(p, i, t):
        p = policy.cast_to_compute(p) if policy is not None else p
        return gpt2.accy_loss(p, i, t, S, policy, fused)

    named_ids, named_targets = (accy.named(a, ("batch", "token")) for a in (ids, targets))
    return float(accy.jit(loss)(params, named_ids, named_targets).array)


def _sharpened_values():
    """The initial values with matrices 50 times larger: a loss far from log(vocab)."""
    values = gpt2.initial_values(S)
    return {k: v * (50.0 if not k.endswith(("gain", "bias")) else 1.0) for k, v in values.items()}


@pytest.mark.slow
def test_the_bf16_loss_matches_numpy_within_the_bf16_tolerance():
    """Under `mixed_precision(f32, bf16, f32)` the parameters are rounded to bf16 and every
    activation is bf16; against float64 of the rounded parameters, within 16 roundoffs."""
    from bench.compare import tolerance

    values = _sharpened_values()
    policy = accy.nn.mixed_precision(accy.f32, accy.bf16, accy.f32)
    rounded = {k: v.astype(accy.bf16.numpy).astype(np.float64) for k, v in values.items()}
    expected = _numpy_loss(rounded, *gpt2.batch(S))
    assert abs(_loss_at(values, policy) - expected) <= tolerance("bf16") * abs(expected)
    assert abs(_loss_at(values, policy, fused=True) - expected) <= tolerance("bf16") * abs(expected)


@pytest.mark.slow
def test_fused_attention_gives_the_compositions_loss():
    values = _sharpened_values()
    np.testing.assert_allclose(_loss_at(values, fused=True), _loss_at(values), rtol=1e-5)


@pytest.mark.slow
def test_a_bf16_training_step_lowers_the_loss_and_keeps_f32_parameters():
    step = gpt2.accy_step(S, "cpu", "bf16")
    params, state, ids, targets = gpt2.accy_inputs(S, "cpu")
    losses = []
    for _ in range(3):
        loss, params, state = step(params, state, ids, targets)
        losses.append(float(loss.array))
    assert losses[2] < losses[0]
    assert all(np.asarray(p.array).dtype == np.float32 for p in params["decay"].values())


def test_auto_attention_is_nn_attention_on_every_device():
    import argparse

    def chosen(device, dtype, attention="auto", gpus=0):
        args = argparse.Namespace(device=device, dtype=dtype, accy_attention=attention, gpus=gpus)
        return gpt2.attention_for(args)

    assert chosen("cuda", "bf16") == "fused"  # cuDNN's kernels
    assert chosen("cuda", "f32") == "fused"  # accy's f32 kernels
    assert chosen("cpu", "f32") == "fused"  # the CPU's flash kernel, or the composition by size
    assert chosen("cpu", "f32", gpus=2) == "fused"
    assert chosen("cuda", "f32", "composition") == "composition"  # asked for: kept


def test_python_m_bench_runs_gpt2_when_named(monkeypatch, tmp_path):
    from bench import cli

    calls = []
    monkeypatch.setattr(gpt2, "main", lambda argv: calls.append(argv) or 0)
    assert cli.chosen_workloads("gpt2", "bf16") == ["gpt2"]
    assert "gpt2" not in cli.chosen_workloads(None, "f32")  # only when named: it is long
    assert cli.main(["--workloads", "gpt2", "--device", "cuda", "--dtype", "bf16"]) == 0
    argv = calls[0]  # then the same at 64 x 1024 (below)
    assert argv[:4] == ["--device", "cuda", "--dtype", "bf16"]
    assert argv[-1].endswith("results/gpt2-cuda-bf16.json")
    out = tmp_path / "g.json"
    cli.main(["--workloads", "gpt2", "--scale", "check", "--systems", "accy", "--json", str(out)])
    assert calls[-1][-4:] == ["--scale", "check", "--json", str(out)]
    assert calls[-1][calls[-1].index("--systems") + 1] == "accy"
    calls.clear()  # without --dtype, on CUDA: bf16 at batch 8 and 64, each to its own JSON
    assert cli.main(["--workloads", "gpt2", "--device", "cuda"]) == 0
    assert [argv[argv.index("--dtype") + 1] for argv in calls] == ["bf16", "bf16"]
    assert calls[1][calls[1].index("--scale") :][:2] == ["--scale", "cuda-b64"]
    assert "--scale" not in calls[0]
    assert [argv[-1].rsplit("/", 1)[-1] for argv in calls] == [
        "gpt2-cuda-bf16.json",
        "gpt2-cuda-bf16-b64.json",
    ]
    calls.clear()  # f32 when asked for: the one batch size
    assert cli.main(["--workloads", "gpt2", "--device", "cuda", "--dtype", "f32"]) == 0
    assert [argv[-1].rsplit("/", 1)[-1] for argv in calls] == ["gpt2-cuda.json"]


def test_one_command_s_reports_go_beside_its_json(monkeypatch, tmp_path):
    # `python -m bench --workloads gpt2,llama1b --json RUN.json`: three reports, each its own
    # file named after RUN.json (before, the GPT-2 ones went to bench/results instead).
    from bench import cli, llama1b

    calls = []
    monkeypatch.setattr(gpt2, "main", lambda argv: calls.append(argv) or 0)
    monkeypatch.setattr(llama1b, "main", lambda argv: calls.append(argv) or 0)
    out = tmp_path / "run.json"
    assert cli.main(["--workloads", "gpt2,llama1b", "--device", "cuda", "--json", str(out)]) == 0
    assert [argv[-1] for argv in calls] == [
        str(tmp_path / "run-gpt2-cuda-bf16.json"),
        str(tmp_path / "run-gpt2-cuda-bf16-b64.json"),
        str(tmp_path / "run-llama1b-cuda-bf16.json"),
    ]


@pytest.mark.slow
def test_the_layers_model_is_the_same_gpt2():
    # `accy.models.gpt2` (stacked layers under a scan) from the same weights: the loss of an
    # independent NumPy forward pass.
    values = _sharpened_values()
    model = gpt2.accy_layers_model(S, "cpu", values)
    ids, targets = gpt2.batch(S)

    def loss(m, ids, targets):
        return accy.nn.cross_entropy(m(ids), targets, "vocab").mean()

    named_ids, named_targets = (accy.named(a, ("batch", "token")) for a in (ids, targets))
    got = float(accy.jit(loss)(model, named_ids, named_targets).array)
    np.testing.assert_allclose(got, _numpy_loss(values, ids, targets), rtol=1e-4)


@pytest.mark.slow
def test_the_layers_step_trains_as_the_unrolled_step():
    # Three AdamW steps of each from the same weights (the weight decay on the same matrices):
    # the losses agree but for the order of the sums.
    step, model, state = gpt2.accy_layers_step(S, "cpu")
    ids, targets = (accy.named(a, ("batch", "token")) for a in gpt2.batch(S))
    unrolled = gpt2.accy_step(S, "cpu")
    params, unrolled_state, *_ = gpt2.accy_inputs(S, "cpu")
    for _ in range(3):
        loss, model, state = step(model, state, ids, targets)
        expected, params, unrolled_state = unrolled(params, unrolled_state, ids, targets)
        np.testing.assert_allclose(float(loss.array), float(expected.array), rtol=1e-5)


def test_the_layers_model_decays_what_the_unrolled_one_does():
    from accy.frontend.tracing import flatten

    model = gpt2.accy_layers_model(S, "cpu")
    leaves = flatten(model)[0]
    sizes = {True: 0, False: 0}
    for leaf, decayed in zip(leaves, gpt2.layers_decayed(model), strict=True):
        sizes[decayed] += leaf.array.size
    shapes = gpt2.parameter_shapes(S)
    expected = {True: 0, False: 0}
    for name, axes in shapes.items():
        expected[gpt2.decayed(name, axes)] += math.prod(n for _, n in axes)
    assert sizes == expected


def test_the_abstract_layers_model_has_the_real_one_s_types():
    from accy.frontend.tracing import flatten

    real = flatten(gpt2.accy_layers_model(S, "cpu"))[0]
    abstract = flatten(gpt2.abstract_layers_model(S))[0]
    assert [leaf.ty for leaf in abstract] == [leaf.ty for leaf in real]
