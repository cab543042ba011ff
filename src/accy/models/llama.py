"""Llama from `accy.nn` layers, with Hugging Face in and out.

Pre-RMSNorm layers of grouped-query attention with rotary position embeddings and a SwiGLU
MLP, no biases; the output layer is `lm_head` (or the token embedding with
`tie_word_embeddings`). The conversions from `transformers`' `LlamaForCausalLM` tensors
(PyTorch `Linear`s, stored (out, in)): `q_proj` {heads x dim, embed} becomes {embed, head,
group, dim}, query head h being key/value head h // group (as `repeat_kv`); `k_proj`/`v_proj`
{embed, head, dim}; `o_proj` {head, group, dim, embed}. RoPE is applied as Hugging Face's
`rotate_half` (the two halves of each head's dim are the rotated pairs: the q/k projection rows
keep the layout of the files, with no permutation).

>>> import accy, numpy as np
>>> config = Config(vocab=32, embed=8, hidden=16, layers=2, heads=4, kv_heads=2)
>>> model = Llama.init(config, accy.random.key(0))
>>> ids = accy.named(np.array([[1, 2, 3]], np.int32), ("batch", "token"))
>>> model(ids).shape
{'batch': 1, 'token': 3, 'vocab': 32}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import optree

from ..core.types import DType
from ..errors import PretrainedError
from ..frontend.named import NamedArray, named
from ..frontend.tracing import NAMESPACE
from ..nn import init as initialisers
from ..nn.layers import Embedding, Linear, MultiHeadAttention, RMSNorm, Stacked, SwiGLU
from ..nn.module import Module, field
from . import hub
from .base import Array, CausalLM, dtype_named, to_host, to_named, weights_dtype

HOST = "cpu"
"""Where `Llama.from_tensors` makes each layer's arrays before stacking them (NumPy's memory)."""
LLAMA3_ROPE = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclass(frozen=True)
class Config:
    """Llama's hyper-parameters (Hugging Face's names in `from_hf`/`to_hf`).

    >>> Config(vocab=32000, embed=4096, hidden=11008, layers=32, heads=32).head_dim
    128
    """

    vocab: int
    embed: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int | None = None  # default: heads (no grouping)
    head_dim_: int | None = None  # default: embed / heads
    positions: int = 2048
    eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: tuple | None = None  # Llama 3's (factor, low, high, original positions)
    tied: bool = False
    bos: int | None = None
    eos: int | None = None

    def __post_init__(self) -> None:
        if self.heads % self.key_value_heads:
            raise PretrainedError(
                f"Llama: num_key_value_heads ({self.key_value_heads}) must divide "
                f"num_attention_heads ({self.heads})"
            )

    @property
    def key_value_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def group(self) -> int:
        return self.heads // self.key_value_heads

    @property
    def head_dim(self) -> int:
        return self.head_dim_ or self.embed // self.heads

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> Config:
        """From a `transformers` LlamaConfig dict (its config.json)."""
        rope = config.get("rope_parameters") or {}
        scaling = config.get("rope_scaling") or {}
        kind = rope.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
        if kind not in ("default", "llama3"):
            raise PretrainedError(
                f"Llama: rope_type {kind!r} is not supported (the default RoPE and llama3 are)"
            )
        rope_scaling = None
        if kind == "llama3":
            given = {**scaling, **rope}
            try:
                rope_scaling = tuple(float(given[name]) for name in LLAMA3_ROPE)
            except KeyError as missing:
                raise PretrainedError(f"Llama: the llama3 rope parameters lack {missing}") from None
        for option in ("attention_bias", "mlp_bias"):
            if config.get(option):
                raise PretrainedError(f"Llama: {option}=true is not supported")
        if config.get("hidden_act", "silu") != "silu":
            raise PretrainedError(f"Llama: hidden_act {config['hidden_act']!r} is not silu")
        try:
            return cls(
                vocab=config["vocab_size"],
                embed=config["hidden_size"],
                hidden=config["intermediate_size"],
                layers=config["num_hidden_layers"],
                heads=config["num_attention_heads"],
                kv_heads=config.get("num_key_value_heads"),
                head_dim_=config.get("head_dim"),
                positions=config.get("max_position_embeddings", 2048),
                eps=config.get("rms_norm_eps", 1e-6),
                rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
                rope_scaling=rope_scaling,
                tied=bool(config.get("tie_word_embeddings", False)),
                bos=config.get("bos_token_id"),
                eos=config.get("eos_token_id"),
            )
        except KeyError as missing:
            raise PretrainedError(f"Llama's config.json lacks {missing}") from None

    def to_hf(self) -> dict[str, Any]:
        return {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": self.vocab,
            "hidden_size": self.embed,
            "intermediate_size": self.hidden,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.positions,
            "rms_norm_eps": self.eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": self.rope_parameters(),
            "tie_word_embeddings": self.tied,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "bos_token_id": self.bos,
            "eos_token_id": self.eos,
        }

    def rope_parameters(self) -> dict[str, Any]:
        if self.rope_scaling is None:
            return {"rope_theta": self.rope_theta, "rope_type": "default"}
        scaling = dict(zip(LLAMA3_ROPE, self.rope_scaling, strict=True))
        scaling["original_max_position_embeddings"] = int(
            scaling["original_max_position_embeddings"]
        )
        return {"rope_theta": self.rope_theta, "rope_type": "llama3", **scaling}


class Block(Module):
    """One Llama layer: RMSNorm, grouped-query attention with RoPE, RMSNorm, SwiGLU."""

    input_layernorm: RMSNorm
    self_attn: MultiHeadAttention
    post_attention_layernorm: RMSNorm
    mlp: SwiGLU


class Llama(CausalLM):
    """Llama (`lm_head` None when the output layer is the token embedding)."""

    config_class = Config  # what from_pretrained reads config.json into
    model_type = "llama"  # the `model_type` of its transformers folders

    embed_tokens: Embedding
    blocks: Stacked
    norm: RMSNorm
    lm_head: Linear | None
    config: Config = field(static=True)

    @property
    def kv_heads(self) -> int:
        return self.config.key_value_heads

    @property
    def head_dim(self) -> int:
        return self.config.head_dim

    @classmethod
    def init(
        cls, config: Config, key: Any, *, dtype: DType | str = "float32", device: str = "cpu"
    ) -> Llama:
        """Random weights: N(0, 0.02) matrices and embeddings (transformers' default
        `initializer_range`), unit norm weights.

        >>> import accy
        >>> config = Config(vocab=8, embed=4, hidden=8, layers=1, heads=2)
        >>> accy.nn.parameter_count(Llama.init(config, accy.random.key(0))) > 0
        True
        """
        c, dtype = config, dtype_named(dtype)
        options = {"dtype": dtype, "device": device}
        k_embed, k_blocks, k_head = initialisers.split(key, 3)
        embed = {"embed": c.embed}
        grouped = {"group": c.group} if c.group > 1 else {}
        query = {"head": c.key_value_heads, **grouped, "dim": c.head_dim}
        kv = {"head": c.key_value_heads, "dim": c.head_dim}

        def linear(k, inputs, outputs):
            weight = initialisers.normal(k, {**inputs, **outputs}, 0.02, **options)
            return Linear(weight, None, tuple(inputs), tuple(outputs))

        def block(k):
            kq, kk, kv_, ko, kg, ku, kd = initialisers.split(k, 7)
            attn = MultiHeadAttention(
                linear(kq, embed, query),
                linear(kk, embed, kv),
                linear(kv_, embed, kv),
                linear(ko, query, embed),
                rope_theta=c.rope_theta,
                rope_scaling=c.rope_scaling,
            )
            hidden = {"hidden": c.hidden}
            mlp = SwiGLU(
                linear(kg, embed, hidden), linear(ku, embed, hidden), linear(kd, hidden, embed)
            )
            norm = RMSNorm.init(embed, eps=c.eps, **options)
            return Block(norm, attn, norm.replace(), mlp)

        table = initialisers.normal(k_embed, {"vocab": c.vocab, "embed": c.embed}, 0.02, **options)
        return cls(
            Embedding(table, "vocab"),
            Stacked.init(c.layers, block, k_blocks),
            RMSNorm.init(embed, eps=c.eps, **options),
            None if c.tied else linear(k_head, embed, {"vocab": c.vocab}),
            c,
        )

    def embed(self, ids: Array, positions: Array) -> Array:
        return self.embed_tokens(ids)

    def block(self, layer: Block, x: Array, positions: Array, cache):
        h = layer.input_layernorm(x)
        if cache is None:
            mixed = layer.self_attn(h, positions=positions)
        else:
            mixed, cache = layer.self_attn(h, positions=positions, cache=cache)
        x = x + mixed
        return x + layer.mlp(layer.post_attention_layernorm(x)), cache

    def head(self, x: Array) -> Array:
        x = self.norm(x)
        return self.embed_tokens.unembed(x) if self.lm_head is None else self.lm_head(x)

    # -- Hugging Face ------------------------------------------------------------------------

    @classmethod
    def from_tensors(
        cls,
        config: Config,
        tensors: dict[str, np.ndarray],
        *,
        dtype: DType | str = "float32",
        device: str = "cpu",
        where: str = "the weights",
    ) -> Llama:
        """The model from Hugging Face's tensors by name (what `from_pretrained` reads).

        >>> import accy
        >>> config = Config(vocab=8, embed=4, hidden=8, layers=1, heads=2)
        >>> model = Llama.init(config, accy.random.key(0))
        >>> again = Llama.from_tensors(model.config, model.to_tensors(), device="reference")
        >>> again.config == model.config
        True
        """
        c, dtype = config, dtype_named(dtype)
        tensors = dict(tensors)
        E, KV, G, D, F = c.embed, c.key_value_heads, c.group, c.head_dim, c.hidden
        query_axes = ("head", "group", "dim") if G > 1 else ("head", "dim")
        query_shape = (KV, G, D) if G > 1 else (KV, D)

        def take(name, shape, axes, reshape=None, transpose=None, on=device):
            array = hub.take(tensors, name, shape, where)
            if reshape is not None:
                array = array.reshape(reshape)
            if transpose is not None:
                array = np.transpose(array, transpose)
            return to_named(array, axes, dtype, on)

        def linear(weight, inputs, outputs):
            return Linear(weight, None, inputs, outputs)

        def on_host(*args):  # a layer's arrays: stacked on the host (below)
            return take(*args, on=HOST)

        def layer(i: int) -> Block:
            p = f"model.layers.{i}."
            last = len(query_shape)
            q = on_host(
                p + "self_attn.q_proj.weight",
                (c.heads * D, E),
                ("embed", *query_axes),
                (*query_shape, E),
                (last, *range(last)),
            )
            k = on_host(
                p + "self_attn.k_proj.weight",
                (KV * D, E),
                ("embed", "head", "dim"),
                (KV, D, E),
                (2, 0, 1),
            )
            v = on_host(
                p + "self_attn.v_proj.weight",
                (KV * D, E),
                ("embed", "head", "dim"),
                (KV, D, E),
                (2, 0, 1),
            )
            o = on_host(
                p + "self_attn.o_proj.weight",
                (E, c.heads * D),
                (*query_axes, "embed"),
                (E, *query_shape),
                (*range(1, last + 1), 0),
            )
            attn = MultiHeadAttention(
                linear(q, ("embed",), query_axes),
                linear(k, ("embed",), ("head", "dim")),
                linear(v, ("embed",), ("head", "dim")),
                linear(o, query_axes, ("embed",)),
                rope_theta=c.rope_theta,
                rope_scaling=c.rope_scaling,
            )
            mlp = SwiGLU(
                linear(
                    on_host(p + "mlp.gate_proj.weight", (F, E), ("hidden", "embed")),
                    ("embed",),
                    ("hidden",),
                ),
                linear(
                    on_host(p + "mlp.up_proj.weight", (F, E), ("hidden", "embed")),
                    ("embed",),
                    ("hidden",),
                ),
                linear(
                    on_host(p + "mlp.down_proj.weight", (E, F), ("embed", "hidden")),
                    ("hidden",),
                    ("embed",),
                ),
            )
            norms = [
                RMSNorm(on_host(p + f"{name}.weight", (E,), ("embed",)), "embed", c.eps)
                for name in ("input_layernorm", "post_attention_layernorm")
            ]
            tensors.pop(p + "self_attn.rotary_emb.inv_freq", None)  # a buffer of older files
            return Block(norms[0], attn, norms[1], mlp)

        # The layers are stacked on the host and put on `device` once: stacked there, each
        # layer's arrays would be device memory held until the stack is made (and kept by a
        # pool such as CuPy's after: 4.2 GB of the 1B Llama's).
        stacked = Stacked.stack([layer(i) for i in range(c.layers)])
        blocks = optree.tree_map(
            lambda a: named(np.asarray(a), a.axes, device), stacked, namespace=NAMESPACE
        )
        table = take("model.embed_tokens.weight", (c.vocab, E), ("vocab", "embed"))
        head = None
        if c.tied:
            tensors.pop("lm_head.weight", None)
        else:
            head = linear(
                take("lm_head.weight", (c.vocab, E), ("vocab", "embed")), ("embed",), ("vocab",)
            )
        model = cls(
            Embedding(table, "vocab"),
            blocks,
            RMSNorm(take("model.norm.weight", (E,), ("embed",)), "embed", c.eps),
            head,
            c,
        )
        if tensors:
            raise PretrainedError(
                f"{where} has tensors a Llama of this config does not use: "
                f"{', '.join(sorted(tensors)[:6])}"
            )
        return model

    def to_tensors(self, dtype: DType | str | None = None) -> dict[str, np.ndarray]:
        """The weights as Hugging Face's tensors by name (`model.layers.0.self_attn.q_proj
        .weight`, ...), in `dtype` (default: the model's).

        >>> import accy
        >>> config = Config(vocab=8, embed=4, hidden=8, layers=1, heads=2)
        >>> model = Llama.init(config, accy.random.key(0))
        >>> model.to_tensors()["model.embed_tokens.weight"].shape
        (8, 4)
        """
        c = self.config
        dtype = dtype_named(dtype) if dtype is not None else weights_dtype(self)
        E, KV, D = c.embed, c.key_value_heads, c.head_dim
        query_axes = ("head", "group", "dim") if c.group > 1 else ("head", "dim")
        stacked = self.blocks.layers
        attn, mlp = stacked.self_attn, stacked.mlp

        def per_layer(x: NamedArray, axes, shape=None):
            array = to_host(x, ("layer", *axes), dtype)
            return array if shape is None else array.reshape(c.layers, *shape)

        layers = {
            "self_attn.q_proj.weight": per_layer(
                attn.query.weight, (*query_axes, "embed"), (c.heads * D, E)
            ),
            "self_attn.k_proj.weight": per_layer(
                attn.key.weight, ("head", "dim", "embed"), (KV * D, E)
            ),
            "self_attn.v_proj.weight": per_layer(
                attn.value.weight, ("head", "dim", "embed"), (KV * D, E)
            ),
            "self_attn.o_proj.weight": per_layer(
                attn.output.weight, ("embed", *query_axes), (E, c.heads * D)
            ),
            "mlp.gate_proj.weight": per_layer(mlp.gate.weight, ("hidden", "embed")),
            "mlp.up_proj.weight": per_layer(mlp.up.weight, ("hidden", "embed")),
            "mlp.down_proj.weight": per_layer(mlp.down.weight, ("embed", "hidden")),
            "input_layernorm.weight": per_layer(stacked.input_layernorm.weight, ("embed",)),
            "post_attention_layernorm.weight": per_layer(
                stacked.post_attention_layernorm.weight, ("embed",)
            ),
        }
        out = {
            f"model.layers.{i}.{name}": array[i]
            for i in range(c.layers)
            for name, array in layers.items()
        }
        out["model.embed_tokens.weight"] = to_host(
            self.embed_tokens.weight, ("vocab", "embed"), dtype
        )
        out["model.norm.weight"] = to_host(self.norm.weight, ("embed",), dtype)
        if self.lm_head is not None:
            out["lm_head.weight"] = to_host(self.lm_head.weight, ("vocab", "embed"), dtype)
        return out


Model = Llama
__all__ = ["Block", "Config", "Llama", "Model"]
