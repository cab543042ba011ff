"""GPT-2 and Llama against `transformers`: the reference folders of `tests/data/hf/` (built by
`tools/make_hf_reference.py` with transformers itself: weights, logits, a loss and its
gradients, 32 greedily generated tokens) on the CPU backend and the reference evaluator; the
folders accy writes; and the errors of bad folders. No torch is needed here except in the
tests marked as needing it (`test_hf_live.py`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import accy
from accy.models import generate, gpt2, llama
from accy.models.base import to_host
from accy.models.generate import decode_step

DATA = Path(__file__).resolve().parents[1] / "data" / "hf"
MODELS = {"gpt2-tiny": gpt2.GPT2, "llama-tiny": llama.Llama}


def expected(name: str) -> dict[str, np.ndarray]:
    return load_file(str(DATA / name / "expected.safetensors"))


def logits_of(model, ids: np.ndarray, device: str) -> np.ndarray:
    forward = accy.jit(lambda m, i: m(i))
    out = forward(model, accy.named(ids, ("batch", "token"), device))
    return to_host(out, ("batch", "token", "vocab"))


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", "reference"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_logits_and_greedy_generation_equal_transformers(name, device):
    model = MODELS[name].from_pretrained(DATA / name, device=device)
    want = expected(name)
    np.testing.assert_allclose(logits_of(model, want["ids"], device), want["logits"], atol=1e-4)
    before = decode_step(device).traces
    prompt = accy.named(want["prompt"], ("batch", "token"))
    out = generate(model, prompt, 32)
    np.testing.assert_array_equal(to_host(out, ("batch", "token")), want["generated"])
    # one compile of the decode step served all 31 single-token steps
    assert decode_step(device).traces - before <= 1
    generate(model, prompt, 4)
    assert decode_step(device).traces - before <= 1


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_loss_and_gradients_equal_pytorch(name):
    # on the reference evaluator (the CPU backend's logits are checked above; compiling the
    # gradient program in C would take most of this file's time)
    model = MODELS[name].from_pretrained(DATA / name, device="reference")
    want = expected(name)
    summary = json.loads((DATA / name / "expected.json").read_text())
    ids = accy.named(want["ids"], ("batch", "token"), device="reference")
    loss, grads = accy.jit(accy.value_and_grad(lambda m, i: m.loss(i)))(model, ids)
    assert loss.item() == pytest.approx(summary["loss"], abs=1e-5)
    assert type(grads) is type(model)
    by_name = grads.to_tensors()  # the gradients under Hugging Face's names
    for key, value in want.items():
        if key.startswith("grad."):
            np.testing.assert_allclose(by_name[key.removeprefix("grad.")], value, atol=2e-5)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_save_pretrained_writes_the_files_transformers_wrote(name, tmp_path):
    model = MODELS[name].from_pretrained(DATA / name, device="reference")
    model.save_pretrained(tmp_path / "f32")
    theirs = accy.models.hub.read_tensors(DATA / name)
    ours = accy.models.hub.read_tensors(tmp_path / "f32")
    assert sorted(ours) == sorted(set(theirs) - {"lm_head.weight"} | set(ours) & {"lm_head.weight"})
    for key, value in ours.items():
        np.testing.assert_array_equal(value, theirs[key])
    again = accy.models.from_pretrained(tmp_path / "f32", device="reference")
    ids = expected(name)["ids"]
    np.testing.assert_array_equal(
        logits_of(again, ids, "reference"), logits_of(model, ids, "reference")
    )
    # sharded and bf16
    model.save_pretrained(tmp_path / "bf16", dtype=accy.bf16, max_shard_size="8KB")
    index = json.loads((tmp_path / "bf16" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    halved = accy.models.from_pretrained(tmp_path / "bf16", dtype="bfloat16", device="reference")
    assert halved.embed_tokens.weight.dtype == accy.bf16 if name == "llama-tiny" else True
    close = logits_of(halved, ids, "reference").astype(np.float32)
    assert np.abs(close - expected(name)["logits"]).max() < 0.15 * np.abs(close).max()


@pytest.mark.slow
def test_random_models_train_and_round_trip(tmp_path):
    config = llama.Config(vocab=32, embed=8, hidden=16, layers=2, heads=4, kv_heads=2, tied=True)
    model = llama.Llama.init(config, accy.random.key(0), device="reference")
    assert model.lm_head is None and accy.nn.parameter_count(model) > 0
    model.save_pretrained(tmp_path)
    assert "lm_head.weight" not in accy.models.hub.read_tensors(tmp_path)
    back = llama.Llama.from_pretrained(tmp_path, device="reference")
    ids = np.array([[1, 2, 3, 4]], np.int32)
    np.testing.assert_array_equal(
        logits_of(back, ids, "reference"), logits_of(model, ids, "reference")
    )


@pytest.mark.slow
def test_sampling_is_reproducible_and_respects_top_k():
    model = gpt2.GPT2.from_pretrained(DATA / "gpt2-tiny", device="reference")
    prompt = accy.named(expected("gpt2-tiny")["prompt"], ("batch", "token"))
    key = accy.random.key(7)
    first = to_host(
        generate(model, prompt, 6, key=key, temperature=0.8, top_k=3), ("batch", "token")
    )
    second = to_host(
        generate(model, prompt, 6, key=key, temperature=0.8, top_k=3), ("batch", "token")
    )
    np.testing.assert_array_equal(first, second)
    # top_k=1 is greedy, whatever the key; a tiny top_p keeps only the most likely token too
    greedy = to_host(generate(model, prompt, 6), ("batch", "token"))
    for options in ({"top_k": 1}, {"top_p": 1e-6}):
        sampled = generate(model, prompt, 6, key=accy.random.key(1), **options)
        np.testing.assert_array_equal(to_host(sampled, ("batch", "token")), greedy)
    # each sampled token is among the 3 most likely after the tokens before it
    logits = logits_of(model, first, "reference")[0]
    for position in range(8, 14):
        top3 = np.argsort(-logits[position - 1])[:3]
        assert first[0, position] in top3


def test_generate_names_bad_arguments():
    model = gpt2.GPT2.from_pretrained(DATA / "gpt2-tiny", device="reference")
    prompt = accy.named(np.array([[1, 2]], np.int32), ("batch", "token"))
    with pytest.raises(accy.AxisError, match="named \\('batch', 'token'\\)"):
        generate(model, accy.named(np.array([1, 2], np.int32), "token"), 3)
    with pytest.raises(accy.AccyError, match="exceed the model's 48 positions"):
        generate(model, prompt, 47)
    with pytest.raises(accy.AccyError, match="max_new_tokens"):
        generate(model, prompt, 0)
    with pytest.raises(accy.AccyError, match="top_p"):
        generate(model, prompt, 2, key=accy.random.key(0), top_p=1.5)
    with pytest.raises(accy.AccyError, match="temperature"):
        generate(model, prompt, 2, key=accy.random.key(0), temperature=0.0)
    with pytest.raises(accy.AccyError, match="language model"):
        generate({"w": 1}, prompt, 2)


def test_bad_folders_get_clear_errors(tmp_path):
    with pytest.raises(accy.PretrainedError, match="is not a folder"):
        gpt2.GPT2.from_pretrained(tmp_path / "absent")
    with pytest.raises(accy.PretrainedError, match="config.json is missing"):
        gpt2.GPT2.from_pretrained(tmp_path)
    with pytest.raises(accy.PretrainedError, match="describes a 'llama' model"):
        gpt2.GPT2.from_pretrained(DATA / "llama-tiny")
    folder = tmp_path / "copy"
    shutil.copytree(DATA / "gpt2-tiny", folder)
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    with pytest.raises(accy.PretrainedError, match="not a readable safetensors file"):
        gpt2.GPT2.from_pretrained(folder)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(accy.PretrainedError, match="PyTorch pickles"):
        gpt2.GPT2.from_pretrained(folder)
    tensors = load_file(str(DATA / "gpt2-tiny" / "model.safetensors"))
    del tensors["transformer.h.1.mlp.c_fc.bias"]
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(accy.PretrainedError, match="no tensor 'h.1.mlp.c_fc.bias'"):
        gpt2.GPT2.from_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"n_embd": 32}))
    with pytest.raises(
        accy.PretrainedError,
        match="c_attn.weight. has shape \\(16, 48\\), but the config says \\(32, 96\\)",
    ):
        gpt2.GPT2.from_pretrained(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(accy.PretrainedError, match="not readable JSON"):
        gpt2.GPT2.from_pretrained(folder)
    rope = json.loads((DATA / "llama-tiny" / "config.json").read_text())
    rope["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0}
    with pytest.raises(accy.PretrainedError, match="rope_type .yarn. is not supported .the"):
        llama.Config.from_hf(rope)
    with pytest.raises(accy.PretrainedError, match="model_type 'bert'"):
        (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))
        accy.models.from_pretrained(folder)
