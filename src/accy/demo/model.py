"""A small decoder-only transformer written with named axes: its parameters are a dict of
named arrays (the checkpoint's layout), and `logits` runs them as `accy.nn` modules (`Block`:
LayerNorm, MultiHeadAttention, MLP) built over the dict's arrays, eagerly on `accy.NamedArray`s
or traced by `accy.jit`.

Axes: batch, token (query position), key (attended position), channel (model width), head,
dim (per-head width), hidden (MLP width), vocab. Every parameter has named axes, so the code
says which axis each contraction sums over.

With `Config.scan_layers` every per-layer parameter is stacked along a `layer` axis
(`layers_query`: {layer, channel, head, dim}) and the layers run as one `nn.Stacked` (a scan
over it), as Levanter and MaxText do: the traced program, and its compile time, stay the same
size whatever the depth. `stack_layers` turns the per-layer parameters into the stacked ones
(same values, same model).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

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
    scan_layers: bool = False

    @property
    def head_dim(self) -> int:
        return self.channels // self.heads


def layer_specs(c: Config) -> dict[str, TensorType]:
    """The parameters of one layer, by their name within the layer."""
    return {
        "norm1_gain": spec(f32, channel=c.channels),
        "norm1_bias": spec(f32, channel=c.channels),
        "query": spec(f32, channel=c.channels, head=c.heads, dim=c.head_dim),
        "key": spec(f32, channel=c.channels, head=c.heads, dim=c.head_dim),
        "value": spec(f32, channel=c.channels, head=c.heads, dim=c.head_dim),
        "out": spec(f32, head=c.heads, dim=c.head_dim, channel=c.channels),
        "norm2_gain": spec(f32, channel=c.channels),
        "norm2_bias": spec(f32, channel=c.channels),
        "up": spec(f32, channel=c.channels, hidden=c.hidden),
        "down": spec(f32, hidden=c.hidden, channel=c.channels),
    }


def parameter_specs(c: Config) -> dict[str, TensorType]:
    """Every trainable parameter, by name, with its named axes: per layer (`l3_query`), or
    stacked along `layer` (`layers_query`) with `scan_layers`."""
    specs = {
        "embed": spec(f32, vocab=c.vocab, channel=c.channels),
        "position": spec(f32, token=c.tokens, channel=c.channels),
    }
    for name, t in layer_specs(c).items():
        if c.scan_layers:
            specs[f"layers_{name}"] = t.with_axes((("layer", c.layers), *t.named_extents))
        else:
            specs |= {f"l{layer}_{name}": t for layer in range(c.layers)}
    specs |= {
        "final_gain": spec(f32, channel=c.channels),
        "final_bias": spec(f32, channel=c.channels),
        "unembed": spec(f32, channel=c.channels, vocab=c.vocab),
    }
    return specs


def stack_layers(values: dict[str, np.ndarray], c: Config) -> dict[str, np.ndarray]:
    """Per-layer parameters (`l3_query`) stacked along a leading `layer` axis
    (`layers_query`), in the order of `parameter_specs` with `scan_layers`: the same model.

    >>> c = Config(vocab=5, tokens=4, channels=8, heads=2, layers=3, hidden=8)
    >>> stacked = stack_layers(initial_parameters(c, np.random.default_rng(0)), c)
    >>> stacked["layers_query"].shape
    (3, 8, 2, 4)
    """
    scanned = replace(c, scan_layers=True)
    out = {}
    for name in parameter_specs(scanned):
        if name.startswith("layers_"):
            part = name.removeprefix("layers_")
            out[name] = np.stack([values[f"l{layer}_{part}"] for layer in range(c.layers)])
        else:
            out[name] = values[name]
    return out


def initial_parameters(c: Config, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Gains start at one, biases at zero, matrices scaled by 1/sqrt(fan-in). With
    `scan_layers`, the same values stacked (`stack_layers`)."""
    if c.scan_layers:
        return stack_layers(initial_parameters(replace(c, scan_layers=False), rng), c)
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


def block(q: dict) -> Block:
    """One pre-norm transformer layer as `accy.nn` modules over its parameters `q` (by their
    name in the layer; arrays or traced values, with or without the `layer` axis)."""

    def linear(weight, inputs, outputs):
        return nn.Linear(weight, None, inputs, outputs)

    heads = ("head", "dim")
    attention = nn.MultiHeadAttention(
        linear(q["query"], ("channel",), heads),
        linear(q["key"], ("channel",), heads),
        linear(q["value"], ("channel",), heads),
        linear(q["out"], heads, ("channel",)),
        embed="channel",
        causal=True,  # fused: on the CPU a flash-attention kernel, never the {token, key} scores
    )
    mlp = nn.MLP(
        linear(q["up"], ("channel",), ("hidden",)),
        linear(q["down"], ("hidden",), ("channel",)),
        nn.gelu_tanh,
    )
    return Block(
        nn.LayerNorm(q["norm1_gain"], q["norm1_bias"], "channel"),
        attention,
        nn.LayerNorm(q["norm2_gain"], q["norm2_bias"], "channel"),
        mlp,
    )


class Block(nn.Module):
    """A pre-norm layer: x + attention(norm1(x)), then + mlp(norm2(x))."""

    norm1: nn.LayerNorm
    attention: nn.MultiHeadAttention
    norm2: nn.LayerNorm
    mlp: nn.MLP

    def __call__(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def logits(p: dict, ids, c: Config):
    """Next-token logits {batch, token, vocab} from the parameters `p` (a dict of named arrays,
    or of traced values inside `accy.jit`) and token ids {batch, token}: the layers are
    `Block` modules over the dict's arrays; with `scan_layers` one `nn.Stacked` over the
    stacked ones (a scan when traced, a loop over the slices on named arrays)."""
    x = nn.Embedding(p["embed"], "vocab")(ids) + p["position"]
    if c.scan_layers:
        layers = block({name: p[f"layers_{name}"] for name in layer_specs(c)})
        x = nn.Stacked(layers, "layer")(x)
    else:
        for layer in range(c.layers):
            x = block({name: p[f"l{layer}_{name}"] for name in layer_specs(c)})(x)
    final = nn.LayerNorm(p["final_gain"], p["final_bias"], "channel")
    return nn.Linear(p["unembed"], None, ("channel",), ("vocab",))(final(x))


def loss(p: dict, ids, targets, weights, c: Config, policy=None):
    """Mean cross-entropy over the scored positions (those with weight 1); `targets` are
    integer token ids (no one-hot of batch x tokens x vocab). With a mixed-precision `policy`
    (`accy.nn.mixed_precision`), from logits in its output dtype."""
    scores = logits(p, ids, c)
    if policy is not None:
        scores = policy.cast_to_output(scores)
    per_position = nn.cross_entropy(scores, targets, "vocab")
    return (per_position * weights).sum(("batch", "token")) / weights.sum(("batch", "token"))
