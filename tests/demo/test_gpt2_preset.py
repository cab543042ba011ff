"""`accy demo --preset`: the byte-level standard-library corpus splits by file, disjointly and
the same way every time; the tiny preset lowers the held-out loss; the sample is bytes; a bad
preset name is refused."""

from __future__ import annotations

import math

import numpy as np
import pytest

import accy
from accy.__main__ import main as accy_main
from accy.demo import preset
from accy.demo.text import ByteText, source_files, split_files, stdlib_root


@pytest.mark.slow
def test_the_split_is_by_file_disjoint_and_deterministic():
    files = source_files(stdlib_root())
    assert len(files) > 100 and files == sorted(files)
    assert not any("site-packages" in p.parts for p in files)
    train, held = split_files(files)
    assert set(train).isdisjoint(held) and len(train) + len(held) == len(files)
    assert held == files[9::10]
    assert split_files(source_files(stdlib_root())) == (train, held)


def test_the_corpus_is_the_files_bytes_in_order(tmp_path):
    for i in range(20):
        (tmp_path / f"m{i:02d}.py").write_bytes(bytes([65 + i]) * (i + 1))
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "site-packages" / "x.py").write_bytes(b"installed")
    text = ByteText.load(tmp_path)
    assert text.held_out_files == ("m09.py", "m19.py")
    assert bytes(text.held_out) == b"J" * 10 + b"T" * 20
    assert len(text.train) == sum(i + 1 for i in range(20)) - 30
    ids, targets = text.batch(np.random.default_rng(0), 3, 4, held_out=True)
    assert ids.shape == targets.shape == (3, 4) and ids.dtype == np.int32
    np.testing.assert_array_equal(ids[:, 1:], targets[:, :-1])
    assert set(ids.ravel()) <= {ord("J"), ord("T")}


def test_a_too_small_corpus_is_refused(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    with pytest.raises(accy.AccyError, match="needs at least 10"):
        ByteText.load(tmp_path)


@pytest.mark.slow
def test_the_tiny_preset_lowers_the_held_out_loss_and_samples_bytes(tmp_path):
    text = ByteText.load(max_bytes=2_000_000)
    run = preset.train_preset(
        "tiny", "cpu", tmp_path, steps=30, quiet=True, sample_bytes=20, text=text
    )
    first, last = run.held_out[0][1], run.held_out[-1][1]
    assert abs(first - math.log(256)) < 0.5  # near uniform before training
    assert run.held_out[-1][0] == 30 and last < first - 0.5
    assert isinstance(run.sample, bytes) and len(run.sample) == 20
    assert (tmp_path / "loss.png").stat().st_size > 0
    assert (tmp_path / "checkpoint.safetensors").exists()


def test_a_bad_preset_name_is_refused_clearly(tmp_path, capsys):
    with pytest.raises(accy.AccyError, match="no such preset.*gpt2-small, tiny"):
        preset.preset_named("gpt3")
    assert accy_main(["demo", "--preset", "gpt3", "--out", str(tmp_path)]) == 1
    assert "no such preset" in capsys.readouterr().err


def test_the_gpt2_small_preset_is_gpt2_small_over_bytes():
    c = preset.PRESETS["gpt2-small"].config
    assert (c.layers, c.heads, c.head_dim, c.width, c.hidden) == (12, 12, 64, 768, 3072)
    assert (c.tokens, c.batch, c.vocab) == (1024, 8, 256)


@pytest.mark.slow
def test_minutes_stop_the_run_at_the_wall_time(tmp_path):
    text = ByteText.load(max_bytes=200_000)
    run = preset.train_preset(
        "tiny", "cpu", tmp_path, steps=10**6, minutes=0.05, quiet=True, sample_bytes=2, text=text
    )
    assert 0 < run.steps < 10**6 and len(run.losses) == run.steps
    assert run.held_out[-1][0] == run.steps


def test_the_schedule_warms_up_then_decays_to_a_tenth():
    tiny = preset.PRESETS["tiny"]
    rates = [preset.learning_rate(tiny, s, s / 100) for s in range(101)]
    assert rates[0] < rates[tiny.warmup - 1] == pytest.approx(tiny.learning_rate)
    assert rates[-1] == pytest.approx(tiny.learning_rate / 10)
    assert all(np.diff(rates[tiny.warmup :]) <= 0)


def test_minutes_without_a_preset_is_refused(capsys):
    with pytest.raises(SystemExit):
        accy_main(["demo", "--minutes", "1"])
    assert "--minutes needs --preset" in capsys.readouterr().err


@pytest.mark.slow
def test_the_language_model_step_is_optax_adamw_with_the_decay_mask():
    import optax

    from accy.demo.common import language_model_step
    from accy.frontend.tracing import flatten

    config = accy.models.gpt2.Config(vocab=16, positions=8, embed=8, layers=1, heads=2)
    model = accy.models.gpt2.GPT2.init(config, accy.random.key(0), device="reference")
    ids = np.random.default_rng(0).integers(0, 16, (2, 5)).astype(np.int32)
    ids, targets = (accy.named(a, ("batch", "token"), "reference") for a in (ids, ids[:, ::-1]))
    rate = accy.named(np.float32(0.01), (), "reference")
    step, params, states = language_model_step(model, "reference", 0.5, weight_decay=0.1)
    _, grads = accy.value_and_grad(lambda m: m.loss(ids, targets))(model)
    _, tuned, _ = step(params, states, ids, targets, rate)
    mask = accy.nn.decay_mask(model)
    assert True in mask and False in mask  # matrices decay, gains and biases do not
    leaves = [np.asarray(x.array) for x in flatten(model)[0]]
    opt = optax.adamw(0.01, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, mask=mask)
    updates, _ = opt.update(
        [np.asarray(g.array) for g in flatten(grads)[0]], opt.init(leaves), leaves
    )
    expected = optax.apply_updates(leaves, updates)
    for got, want in zip(flatten(tuned)[0], expected, strict=True):
        np.testing.assert_allclose(np.asarray(got.array), np.asarray(want), rtol=1e-4, atol=1e-6)
