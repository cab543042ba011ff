"""A small decoder-only transformer written with named axes, as plain functions of a dict of
parameters: they run eagerly on `accy.NamedArray`s and are traced by `accy.jit`.

Axes: batch, token (query position), key (attended position), channel (model width), head,
dim (per-head width), hidden (MLP width), vocab. Every parameter has named axes, so the code
says which axis each contraction sums over.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import nn
from ..core.types import TensorType, f32, spec


@dataclass(frozen=True)
class Config:
    vocab: int
    tokens: int
    channels: int = 64
    heads: int = 4
    layers: int = 2
    hidden: int = 128
    batch: int = 64

    @property
    def head_dim(self) -> int:
        return self.channels // self.heads


def parameter_specs(c: Config) -> dict[str, TensorType]:
    """Every trainable parameter, by name, with its named axes."""
    specs = {
        "embed": spec(f32, vocab=c.vocab, channel=c.channels),
        "position": spec(f32, token=c.tokens, channel=c.channels),
    }
    for layer in range(c.layers):
        specs |= {
            f"l{layer}_norm1_gain": spec(f32, channel=c.channels),
            f"l{layer}_norm1_bias": spec(f32, channel=c.channels),
            f"l{layer}_query": spec(f32, channel=c.channels, head=c.heads, dim=c.head_dim),
            f"l{layer}_key": spec(f32, channel=c.channels, head=c.heads, dim=c.head_dim),
            f"l{layer}_value": spec(f32, channel=c.channels, head=c.heads, dim=c.head_dim),
            f"l{layer}_out": spec(f32, head=c.heads, dim=c.head_dim, channel=c.channels),
            f"l{layer}_norm2_gain": spec(f32, channel=c.channels),
            f"l{layer}_norm2_bias": spec(f32, channel=c.channels),
            f"l{layer}_up": spec(f32, channel=c.channels, hidden=c.hidden),
            f"l{layer}_down": spec(f32, hidden=c.hidden, channel=c.channels),
        }
    specs |= {
        "final_gain": spec(f32, channel=c.channels),
        "final_bias": spec(f32, channel=c.channels),
        "unembed": spec(f32, channel=c.channels, vocab=c.vocab),
    }
    return specs


def initial_parameters(c: Config, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Gains start at one, biases at zero, matrices scaled by 1/sqrt(fan-in)."""
    values = {}
    for name, t in parameter_specs(c).items():
        if name.endswith("gain"):
            values[name] = np.ones(t.extents, np.float32)
        elif name.endswith("bias"):
            values[name] = np.zeros(t.extents, np.float32)
        else:
            fan_in = c.channels if name not in ("embed", "position") else 1
            if name.endswith("_out"):
                fan_in = c.channels
            if name.endswith("_down"):
                fan_in = c.hidden
            scale = 0.1 if fan_in == 1 else 1.0 / math.sqrt(fan_in)
            values[name] = (rng.standard_normal(t.extents) * scale).astype(np.float32)
    return values


def _norm(x, gain, bias):
    return nn.layer_norm(x, "channel") * gain + bias


def _attention(x, p: dict, layer: int, c: Config):
    h = _norm(x, p[f"l{layer}_norm1_gain"], p[f"l{layer}_norm1_bias"])
    queries = h.contract(p[f"l{layer}_query"], "channel")
    keys = h.contract(p[f"l{layer}_key"], "channel").rename("token", "key")
    values = h.contract(p[f"l{layer}_value"], "channel").rename("token", "key")
    # Fused: on the CPU a flash-attention kernel, never the {token, key} scores.
    mixed = nn.attention(queries, keys, values, causal=True)
    return mixed.contract(p[f"l{layer}_out"], ("head", "dim"))


def _mlp(x, p: dict, layer: int):
    h = _norm(x, p[f"l{layer}_norm2_gain"], p[f"l{layer}_norm2_bias"])
    return nn.gelu_tanh(h.contract(p[f"l{layer}_up"], "channel")).contract(
        p[f"l{layer}_down"], "hidden"
    )


def logits(p: dict, ids, c: Config):
    """Next-token logits {batch, token, vocab} from the parameters `p` (a dict of named arrays,
    or of traced values inside `accy.jit`) and token ids {batch, token}."""
    x = p["embed"].gather(ids, "vocab") + p["position"]
    for layer in range(c.layers):
        x = x + _attention(x, p, layer, c)
        x = x + _mlp(x, p, layer)
    return _norm(x, p["final_gain"], p["final_bias"]).contract(p["unembed"], "channel")


def loss(p: dict, ids, targets, weights, c: Config, policy=None):
    """Mean cross-entropy over the scored positions (those with weight 1); `targets` are
    integer token ids (no one-hot of batch x tokens x vocab). With a mixed-precision `policy`
    (`accy.nn.mixed_precision`), from logits in its output dtype."""
    scores = logits(p, ids, c)
    if policy is not None:
        scores = policy.cast_to_output(scores)
    per_position = nn.cross_entropy(scores, targets, "vocab")
    return (per_position * weights).sum(("batch", "token")) / weights.sum(("batch", "token"))
