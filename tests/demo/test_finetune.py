"""`accy demo --preset finetune --from FOLDER`: a Hugging Face folder (a small GPT-2 that
accy writes) is fine-tuned on standard-library text, its held-out loss goes down, and the
folder it saves loads back with the tuned weights; bad flags are refused."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy.__main__ import main as accy_main
from accy.demo.finetune import finetune
from accy.demo.text import ByteText
from accy.models import gpt2


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2-bytes")
    config = gpt2.Config(vocab=256, positions=48, embed=32, layers=2, heads=2)
    gpt2.GPT2.init(config, accy.random.key(0)).save_pretrained(path)
    return path


@pytest.mark.slow  # four compiles: the step, the loss, generation's prefill and decode
def test_finetuning_lowers_the_held_out_loss_and_saves_a_folder(folder, tmp_path):
    text = ByteText.load(max_bytes=200_000)
    run = finetune(
        folder, "cpu", tmp_path, 40, quiet=True, text=text, sample_tokens=8, learning_rate=3e-3
    )
    assert run.steps == 40 and len(run.losses) == 40
    assert run.held_out_after < run.held_out_before - 0.5
    assert isinstance(run.sample_before, str) and isinstance(run.sample_after, str)
    tuned = accy.models.from_pretrained(run.saved, device="reference")
    original = accy.models.from_pretrained(folder, device="reference")
    assert not np.array_equal(np.asarray(tuned.wte.weight), np.asarray(original.wte.weight))


def test_the_finetune_flags_are_checked(folder, tmp_path, capsys):
    with pytest.raises(SystemExit):
        accy_main(["demo", "--preset", "finetune", "--out", str(tmp_path)])
    assert "needs --from" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        accy_main(["demo", "--from", str(folder)])
    assert "--from needs --preset finetune" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        accy_main(["demo", "--preset", "finetune", "--from", str(folder), "--dtype", "bf16"])
    assert "--dtype is not supported" in capsys.readouterr().err


@pytest.mark.slow
def test_a_vocabulary_too_small_for_bytes_is_refused(tmp_path):
    config = gpt2.Config(vocab=64, positions=16, embed=8, layers=1, heads=2)
    gpt2.GPT2.init(config, accy.random.key(0)).save_pretrained(tmp_path / "small")
    with pytest.raises(accy.AccyError, match="bytes need 256"):
        finetune(tmp_path / "small", "cpu", tmp_path, steps=1, quiet=True)
