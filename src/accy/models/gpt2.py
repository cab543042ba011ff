"""GPT-2 from `accy.nn` layers, with Hugging Face in and out.

`GPT2.from_pretrained(folder)` reads a local `transformers` GPT-2 folder (`config.json` and
safetensors weights, sharded or not; names with or without the `transformer.` prefix);
`save_pretrained(folder)` writes one that `transformers.GPT2LMHeadModel.from_pretrained`
loads unchanged. The conversions: GPT-2's `Conv1D` weights are stored (in, out), so `c_attn`
{embed, 3 x embed} splits into the query, key and value `Linear`s {embed, head, dim}; the
output layer is the token embedding (tied); the position embedding is an `Embedding` over
the axis `position`; the layers are stacked along `layer` and run by a scan.

>>> import accy, numpy as np
>>> config = Config(vocab=32, positions=16, embed=8, layers=2, heads=2)
>>> model = GPT2.init(config, accy.random.key(0))
>>> ids = accy.named(np.array([[1, 2, 3]], np.int32), ("batch", "token"))
>>> model(ids).shape
{'batch': 1, 'token': 3, 'vocab': 32}
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.types import DType
from ..errors import PretrainedError
from ..frontend.named import NamedArray
from ..nn import functional as F
from ..nn import init as initialisers
from ..nn.layers import MLP, Embedding, LayerNorm, Linear, MultiHeadAttention, Stacked
from ..nn.module import Module, field
from . import hub
from .base import Array, CausalLM, dtype_named, to_host, to_named, weights_dtype

QKV = ("query", "key", "value")
ACTIVATIONS = {
    "gelu_new": F.gelu_tanh,
    "gelu_pytorch_tanh": F.gelu_tanh,
    "gelu": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


@dataclass(frozen=True)
class Config:
    """GPT-2's hyper-parameters (Hugging Face's names in `from_hf`/`to_hf`).

    >>> Config(vocab=50257, positions=1024, embed=768, layers=12, heads=12).head_dim
    64
    """

    vocab: int
    positions: int
    embed: int
    layers: int
    heads: int
    hidden: int | None = None  # default 4 x embed
    eps: float = 1e-5
    activation: str = "gelu_new"
    bos: int | None = None  # the special token ids, kept for the saved config
    eos: int | None = None

    def __post_init__(self) -> None:
        if self.embed % self.heads:
            raise PretrainedError(f"GPT-2: n_embd ({self.embed}) must divide by n_head")
        if self.activation not in ACTIVATIONS:
            raise PretrainedError(
                f"GPT-2: activation_function {self.activation!r} is not one of "
                f"{', '.join(ACTIVATIONS)}"
            )

    @property
    def head_dim(self) -> int:
        return self.embed // self.heads

    @property
    def mlp_width(self) -> int:
        return self.hidden or 4 * self.embed

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> Config:
        """From a `transformers` GPT2Config dict (its config.json)."""
        for option, supported in (
            ("scale_attn_weights", True),
            ("scale_attn_by_inverse_layer_idx", False),
            ("add_cross_attention", False),
        ):
            if config.get(option, supported) != supported:
                raise PretrainedError(f"GPT-2: {option}={config[option]} is not supported")
        try:
            return cls(
                vocab=config["vocab_size"],
                positions=config["n_positions"],
                embed=config["n_embd"],
                layers=config["n_layer"],
                heads=config["n_head"],
                hidden=config.get("n_inner"),
                eps=config.get("layer_norm_epsilon", 1e-5),
                activation=config.get("activation_function", "gelu_new"),
                bos=config.get("bos_token_id"),
                eos=config.get("eos_token_id"),
            )
        except KeyError as missing:
            raise PretrainedError(f"GPT-2's config.json lacks {missing}") from None

    def to_hf(self) -> dict[str, Any]:
        return {
            "model_type": "gpt2",
            "architectures": ["GPT2LMHeadModel"],
            "vocab_size": self.vocab,
            "n_positions": self.positions,
            "n_ctx": self.positions,
            "n_embd": self.embed,
            "n_layer": self.layers,
            "n_head": self.heads,
            "n_inner": self.hidden,
            "layer_norm_epsilon": self.eps,
            "activation_function": self.activation,
            "tie_word_embeddings": True,
            "scale_attn_weights": True,
            "attn_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "resid_pdrop": 0.0,
            "bos_token_id": self.bos,
            "eos_token_id": self.eos,
        }


class Block(Module):
    """One pre-LayerNorm GPT-2 layer: causal attention (biased projections) and a GELU MLP."""

    ln_1: LayerNorm
    attn: MultiHeadAttention
    ln_2: LayerNorm
    mlp: MLP


class GPT2(CausalLM):
    """GPT-2 (the language-modelling head tied to the token embedding)."""

    config_class = Config  # what from_pretrained reads config.json into
    model_type = "gpt2"  # the `model_type` of its transformers folders

    wte: Embedding
    wpe: Embedding
    blocks: Stacked
    ln_f: LayerNorm
    config: Config = field(static=True)

    @property
    def kv_heads(self) -> int:
        return self.config.heads

    @property
    def head_dim(self) -> int:
        return self.config.head_dim

    @classmethod
    def init(
        cls, config: Config, key: Any, *, dtype: DType | str = "float32", device: str = "cpu"
    ) -> GPT2:
        """Random weights as GPT-2's initialisation: N(0, 0.02) matrices and embeddings, the
        residual projections N(0, 0.02 / sqrt(2 layers)), zero biases, unit gains.

        >>> import accy
        >>> config = Config(vocab=8, positions=8, embed=4, layers=1, heads=2)
        >>> accy.nn.parameter_count(GPT2.init(config, accy.random.key(0))) > 0
        True
        """
        dtype = dtype_named(dtype)
        c = config
        std, residual = 0.02, 0.02 / math.sqrt(2 * c.layers)
        k_wte, k_wpe, k_blocks = initialisers.split(key, 3)
        options = {"dtype": dtype, "device": device}

        def normal(k, shape, scale=std):
            return initialisers.normal(k, shape, scale, **options)

        def zeros(shape):
            return initialisers.zeros(shape, dtype, device)

        heads = {"head": c.heads, "dim": c.head_dim}
        embed = {"embed": c.embed}

        def linear(k, inputs, outputs, scale=std):
            weight = normal(k, {**inputs, **outputs}, scale)
            return Linear(weight, zeros(outputs), tuple(inputs), tuple(outputs))

        def block(k):
            kq, kk, kv, ko, kf, kp = initialisers.split(k, 6)
            attn = MultiHeadAttention(
                linear(kq, embed, heads),
                linear(kk, embed, heads),
                linear(kv, embed, heads),
                linear(ko, heads, embed, residual),
            )
            hidden = {"hidden": c.mlp_width}
            mlp = MLP(
                linear(kf, embed, hidden),
                linear(kp, hidden, embed, residual),
                ACTIVATIONS[c.activation],
            )
            norm = LayerNorm.init(embed, eps=c.eps, **options)
            return Block(norm, attn, norm.replace(), mlp)

        return cls(
            Embedding(normal(k_wte, {"vocab": c.vocab, "embed": c.embed}), "vocab"),
            Embedding(normal(k_wpe, {"position": c.positions, "embed": c.embed}), "position"),
            Stacked.init(c.layers, block, k_blocks),
            LayerNorm.init(embed, eps=c.eps, **options),
            c,
        )

    def embed(self, ids: Array, positions: Array) -> Array:
        return self.wte(ids) + self.wpe(positions)

    def block(self, layer: Block, x: Array, positions: Array, cache):
        h = layer.ln_1(x)
        if cache is None:
            mixed, cache = layer.attn(h), None
        else:
            mixed, cache = layer.attn(h, positions=positions, cache=cache)
        x = x + mixed
        return x + layer.mlp(layer.ln_2(x)), cache

    def head(self, x: Array) -> Array:
        return self.wte.unembed(self.ln_f(x))

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
    ) -> GPT2:
        """The model from Hugging Face's tensors by name (what `from_pretrained` reads).

        >>> import accy
        >>> config = Config(vocab=8, positions=8, embed=4, layers=1, heads=2)
        >>> model = GPT2.init(config, accy.random.key(0))
        >>> again = GPT2.from_tensors(model.config, model.to_tensors(), device="reference")
        >>> again.config == model.config
        True
        """
        c, dtype = config, dtype_named(dtype)
        tensors = {_unprefixed(name): array for name, array in tensors.items()}
        E, H, D, F_ = c.embed, c.heads, c.head_dim, c.mlp_width

        def take(name, shape, axes, reshape=None):
            array = hub.take(tensors, name, shape, where)
            if reshape is not None:
                array = array.reshape(reshape)
            return to_named(array, axes, dtype, device)

        def layer(i: int) -> Block:
            p = f"h.{i}."
            qkv = hub.take(tensors, p + "attn.c_attn.weight", (E, 3 * E), where).reshape(E, 3, H, D)
            qkv_bias = hub.take(tensors, p + "attn.c_attn.bias", (3 * E,), where).reshape(3, H, D)
            io = (("embed",), ("head", "dim"))
            q, k, v = (
                Linear(
                    to_named(qkv[:, j], ("embed", "head", "dim"), dtype, device),
                    to_named(qkv_bias[j], ("head", "dim"), dtype, device),
                    *io,
                )
                for j in range(3)
            )
            out = Linear(
                take(p + "attn.c_proj.weight", (E, E), ("head", "dim", "embed"), (H, D, E)),
                take(p + "attn.c_proj.bias", (E,), ("embed",)),
                ("head", "dim"),
                ("embed",),
            )
            mlp = MLP(
                Linear(
                    take(p + "mlp.c_fc.weight", (E, F_), ("embed", "hidden")),
                    take(p + "mlp.c_fc.bias", (F_,), ("hidden",)),
                    ("embed",),
                    ("hidden",),
                ),
                Linear(
                    take(p + "mlp.c_proj.weight", (F_, E), ("hidden", "embed")),
                    take(p + "mlp.c_proj.bias", (E,), ("embed",)),
                    ("hidden",),
                    ("embed",),
                ),
                ACTIVATIONS[c.activation],
            )
            norms = [
                LayerNorm(
                    take(p + f"ln_{n}.weight", (E,), ("embed",)),
                    take(p + f"ln_{n}.bias", (E,), ("embed",)),
                    "embed",
                    c.eps,
                )
                for n in (1, 2)
            ]
            for buffer in ("attn.bias", "attn.masked_bias"):  # causal-mask buffers of old files
                tensors.pop(p + buffer, None)
            return Block(norms[0], MultiHeadAttention(q, k, v, out), norms[1], mlp)

        blocks = Stacked.stack([layer(i) for i in range(c.layers)])
        model = cls(
            Embedding(take("wte.weight", (c.vocab, E), ("vocab", "embed")), "vocab"),
            Embedding(take("wpe.weight", (c.positions, E), ("position", "embed")), "position"),
            blocks,
            LayerNorm(
                take("ln_f.weight", (E,), ("embed",)),
                take("ln_f.bias", (E,), ("embed",)),
                "embed",
                c.eps,
            ),
            c,
        )
        tensors.pop("lm_head.weight", None)  # tied to wte
        if tensors:
            raise PretrainedError(
                f"{where} has tensors a GPT-2 of this config does not use: "
                f"{', '.join(sorted(tensors)[:6])}"
            )
        return model

    def to_tensors(self, dtype: DType | str | None = None) -> dict[str, np.ndarray]:
        """The weights as Hugging Face's tensors by name (`transformer.h.0.attn.c_attn.weight`,
        ...), in `dtype` (default: the model's).

        >>> import accy
        >>> config = Config(vocab=8, positions=8, embed=4, layers=1, heads=2)
        >>> model = GPT2.init(config, accy.random.key(0))
        >>> model.to_tensors()["transformer.wte.weight"].shape
        (8, 4)
        """
        c = self.config
        dtype = dtype_named(dtype) if dtype is not None else weights_dtype(self)
        E = c.embed

        def host(x: NamedArray, axes, shape=None):
            array = to_host(x, axes, dtype)
            return array.reshape(shape) if shape is not None else array

        stacked = self.blocks.layers
        attn, mlp = stacked.attn, stacked.mlp

        def per_layer(x: NamedArray, axes, flat=None):
            array = host(x, ("layer", *axes))
            return array if flat is None else array.reshape(c.layers, *flat)

        qkv = np.concatenate(
            [per_layer(getattr(attn, n).weight, ("embed", "head", "dim"), (E, E)) for n in QKV], 2
        )
        qkv_bias = np.concatenate(
            [per_layer(getattr(attn, n).bias, ("head", "dim"), (E,)) for n in QKV], 1
        )
        layers = {
            "attn.c_attn.weight": qkv,
            "attn.c_attn.bias": qkv_bias,
            "attn.c_proj.weight": per_layer(attn.output.weight, ("head", "dim", "embed"), (E, E)),
            "attn.c_proj.bias": per_layer(attn.output.bias, ("embed",)),
            "mlp.c_fc.weight": per_layer(mlp.up.weight, ("embed", "hidden")),
            "mlp.c_fc.bias": per_layer(mlp.up.bias, ("hidden",)),
            "mlp.c_proj.weight": per_layer(mlp.down.weight, ("hidden", "embed")),
            "mlp.c_proj.bias": per_layer(mlp.down.bias, ("embed",)),
        }
        for n, norm in ((1, stacked.ln_1), (2, stacked.ln_2)):
            layers[f"ln_{n}.weight"] = per_layer(norm.weight, ("embed",))
            layers[f"ln_{n}.bias"] = per_layer(norm.bias, ("embed",))
        out = {
            f"transformer.h.{i}.{name}": array[i]
            for i in range(c.layers)
            for name, array in layers.items()
        }
        out["transformer.wte.weight"] = host(self.wte.weight, ("vocab", "embed"))
        out["transformer.wpe.weight"] = host(self.wpe.weight, ("position", "embed"))
        out["transformer.ln_f.weight"] = host(self.ln_f.weight, ("embed",))
        out["transformer.ln_f.bias"] = host(self.ln_f.bias, ("embed",))
        return out


def _unprefixed(name: str) -> str:
    return name.removeprefix("transformer.")


Model = GPT2
__all__ = ["GPT2", "Block", "Config", "Model"]
