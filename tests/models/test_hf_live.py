"""accy's models against live `transformers` (skipped where it is not installed): folders that
accy's `save_pretrained` writes load in transformers with equal logits (f32) and equal weights
(bf16); GPT-2 small (124M, random weights drawn by transformers) gives equal logits and greedy
tokens (slow)."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy.models import generate, gpt2, llama
from accy.models.base import to_host

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def accy_logits(model, ids: np.ndarray) -> np.ndarray:
    out = accy.jit(lambda m, i: m(i))(model, accy.named(ids, ("batch", "token"), model._device()))
    return to_host(out, ("batch", "token", "vocab")).astype(np.float32)


def hf_logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(ids.astype(np.int64))).logits.float().numpy()


MODELS = {
    "gpt2": (
        gpt2.GPT2,
        gpt2.Config(vocab=40, positions=24, embed=16, layers=2, heads=4),
        transformers.GPT2LMHeadModel,
    ),
    "llama": (
        llama.Llama,
        llama.Config(vocab=40, embed=16, hidden=24, layers=2, heads=4, kv_heads=2, positions=32),
        transformers.LlamaForCausalLM,
    ),
    "llama3-rope": (  # Llama 3's RoPE scaling, its bands placed within the tiny head dim
        llama.Llama,
        llama.Config(
            vocab=40,
            embed=32,
            hidden=24,
            layers=1,
            heads=2,
            positions=32,
            rope_scaling=(8.0, 1.0, 4.0, 16.0),
        ),
        transformers.LlamaForCausalLM,
    ),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_transformers_loads_what_save_pretrained_writes(name, tmp_path):
    cls, config, hf_class = MODELS[name]
    model = cls.init(config, accy.random.key(3), device="reference")
    model.save_pretrained(tmp_path / "f32")
    hf = hf_class.from_pretrained(tmp_path / "f32").eval()
    ids = np.random.default_rng(0).integers(0, config.vocab, (2, 7)).astype(np.int32)
    np.testing.assert_allclose(hf_logits(hf, ids), accy_logits(model, ids), atol=1e-4)
    model.save_pretrained(tmp_path / "bf16", dtype=accy.bf16, max_shard_size="10KB")
    hf16 = hf_class.from_pretrained(tmp_path / "bf16", dtype=torch.bfloat16)
    ours = model.to_tensors(accy.bf16)
    for key, value in hf16.state_dict().items():
        if key in ours:
            assert value.dtype == torch.bfloat16
            np.testing.assert_array_equal(value.float().numpy(), ours[key].astype(np.float32))


@pytest.mark.slow
def test_gpt2_small_with_random_weights_equals_transformers(tmp_path):
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
    hf.save_pretrained(tmp_path)
    model = gpt2.GPT2.from_pretrained(tmp_path)
    assert model.config == gpt2.Config(
        vocab=50257, positions=1024, embed=768, layers=12, heads=12, bos=50256, eos=50256
    )
    ids = np.random.default_rng(1).integers(0, 50257, (1, 12)).astype(np.int32)
    np.testing.assert_allclose(accy_logits(model, ids), hf_logits(hf, ids), atol=1e-4)
    with torch.no_grad():
        want = hf.generate(
            torch.tensor(ids.astype(np.int64)),
            attention_mask=torch.ones(ids.shape, dtype=torch.int64),
            max_new_tokens=32,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        ).numpy()
    got = generate(model, accy.named(ids, ("batch", "token")), 32, cache_length=64)
    np.testing.assert_array_equal(to_host(got, ("batch", "token")), want)
