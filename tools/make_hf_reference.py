"""Build the Hugging Face reference models of `tests/models/` with `transformers` itself.

    PYTHONPATH=src python tools/make_hf_reference.py        # writes tests/data/hf/<name>/

For each model (a tiny GPT-2 with tied embeddings; a tiny Llama with grouped-query attention,
RoPE and an untied output layer, saved in shards) it draws random weights with `transformers`
(seeded), `save_pretrained`s the model into `tests/data/hf/<name>/`, and writes beside it what
the tests compare accy with, computed by PyTorch in f32:

- `expected.safetensors`: `ids` (a batch of token ids), `logits` for them, the gradients of
  the loss for a few parameters (`grad.<hugging face name>`), `prompt` and `generated` (the
  prompt followed by 32 tokens of greedy `generate`);
- `expected.json`: the loss (mean next-token cross-entropy of `ids`, as `labels=ids` gives)
  and the smallest gap between the best and second-best logit over the generated steps (the
  margin that makes greedy decoding comparable across implementations).

The weights are drawn wider than the usual 0.02 so that the logits (and so greedy decoding)
are well separated; the folders are a few tens of KB each.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1] / "tests" / "data" / "hf"
NEW_TOKENS = 32
GRADIENTS = {
    "gpt2-tiny": (
        "transformer.wte.weight",
        "transformer.h.0.attn.c_attn.weight",
        "transformer.h.1.mlp.c_proj.weight",
        "transformer.ln_f.weight",
    ),
    "llama-tiny": (
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.1.self_attn.k_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
        "lm_head.weight",
    ),
}


def gpt2() -> transformers.PreTrainedModel:
    config = transformers.GPT2Config(
        vocab_size=64,
        n_positions=48,
        n_embd=16,
        n_layer=2,
        n_head=2,
        initializer_range=0.3,
        bos_token_id=None,
        eos_token_id=None,
    )
    return transformers.GPT2LMHeadModel(config)


def llama() -> transformers.PreTrainedModel:
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        initializer_range=0.3,
        tie_word_embeddings=False,
    )
    return transformers.LlamaForCausalLM(config)


def build(name: str, make, seed: int, shard: str | None) -> None:
    torch.manual_seed(seed)
    model = make().float().eval()
    folder = ROOT / name
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*"):
        old.unlink()
    if shard:
        model.save_pretrained(folder, max_shard_size=shard)
    else:
        model.save_pretrained(folder)
    generator = torch.Generator().manual_seed(seed + 1)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (2, 8), generator=generator)
    output = model(input_ids=ids, labels=ids)
    output.loss.backward()
    parameters = dict(model.named_parameters())
    tensors = {"ids": ids.to(torch.int32), "logits": output.logits.detach()}
    for parameter in GRADIENTS[name]:
        tensors[f"grad.{parameter}"] = parameters[parameter].grad.detach().clone()
    prompt = ids[:1]
    # No end-of-sequence token: generation runs the 32 steps, and no logits processor
    # (min_new_tokens suppressing the eos token) changes what greedy decoding picks.
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    with torch.no_grad():
        generated = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),  # every token counts, whatever its id
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
    assert generated.sequences.shape[1] == prompt.shape[1] + NEW_TOKENS
    margins = []
    for step in generated.logits:
        top = torch.topk(step[0], 2).values
        margins.append(float(top[0] - top[1]))
    tensors["prompt"] = prompt.to(torch.int32)
    tensors["generated"] = generated.sequences.to(torch.int32)
    save_file({k: v.contiguous() for k, v in tensors.items()}, folder / "expected.safetensors")
    summary = {
        "loss": output.loss.item(),
        "smallest_greedy_margin": min(margins),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    (folder / "expected.json").write_text(json.dumps(summary, indent=2) + "\n")
    distinct = len(set(generated.sequences[0, prompt.shape[1] :].tolist()))
    print(
        f"{name}: loss {summary['loss']:.4f}, smallest greedy margin {min(margins):.4f}, "
        f"{distinct} distinct generated tokens"
    )


def main() -> None:
    build("gpt2-tiny", gpt2, seed=0, shard=None)
    build("llama-tiny", llama, seed=2, shard="16KB")


if __name__ == "__main__":
    main()
