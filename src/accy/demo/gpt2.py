"""GPT-2 in accy's named-axis front end: parameter shapes, initial values, logits, loss, the
FLOP count, and one jitted training step (loss, gradients, AdamW). Shared by the `gpt2`
workload of bench/ (`bench/gpt2.py`) and `accy demo --preset` (`demo/preset.py`).

The model: token embedding, learned position embeddings, pre-LayerNorm blocks (causal
attention with biases on the query/key/value and output projections, a GELU-tanh MLP 4x wide
with biases), a final LayerNorm, logits by the token embedding (tied); loss = mean
cross-entropy against integer next-token targets. AdamW: betas 0.9/0.95, eps 1e-8, weight
decay 0.1 on matrices (rank >= 2, the embeddings included, as nanoGPT; not on gains and
biases), f32 master weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import nn, optim
from ..backends.devices import as_device
from ..core.types import bf16, f32
from ..frontend import jit, named, value_and_grad

LR, BETA1, BETA2, EPS, WEIGHT_DECAY = 6e-4, 0.9, 0.95, 1e-8, 0.1


@dataclass(frozen=True)
class Config:
    """The model's size: `tokens` is the context (and the training sequence length), `batch`
    the sequences per step.

    >>> Config(layers=2, heads=2, width=64, batch=8, tokens=64, vocab=256).head_dim
    32
    """

    layers: int
    heads: int
    width: int
    batch: int
    tokens: int
    vocab: int = 50304

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def hidden(self) -> int:
        return 4 * self.width


def parameter_shapes(s: Config) -> dict[str, tuple[tuple[str, int], ...]]:
    """Every parameter by name, as named axes (the layout is the order written).

    >>> parameter_shapes(Config(1, 2, 8, 1, 4, 16))["embed"]
    (('vocab', 16), ('channel', 8))
    """
    c, h, k, f = ("channel", s.width), ("head", s.heads), ("dim", s.head_dim), ("hidden", s.hidden)
    shapes = {"embed": (("vocab", s.vocab), c), "position": (("token", s.tokens), c)}
    for i in range(s.layers):
        shapes |= {
            f"l{i}_ln1_gain": (c,),
            f"l{i}_ln1_bias": (c,),
            f"l{i}_qkv": (c, ("part", 3), h, k),
            f"l{i}_qkv_bias": (("part", 3), h, k),
            f"l{i}_proj": (h, k, c),
            f"l{i}_proj_bias": (c,),
            f"l{i}_ln2_gain": (c,),
            f"l{i}_ln2_bias": (c,),
            f"l{i}_fc": (c, f),
            f"l{i}_fc_bias": (f,),
            f"l{i}_out": (f, c),
            f"l{i}_out_bias": (c,),
        }
    return shapes | {"final_gain": (c,), "final_bias": (c,)}


def decayed(name: str, axes) -> bool:
    """Weight decay applies to the matrices (rank >= 2), as nanoGPT: not to gains and biases.

    >>> decayed("l0_fc", (("channel", 8), ("hidden", 32))), decayed("l0_fc_bias", (("hidden", 32),))
    (True, False)
    """
    return len(axes) >= 2 and not name.endswith("_bias")


def model_parameters(s: Config) -> int:
    """N of the FLOP formula: the parameters without the position embeddings.

    >>> model_parameters(Config(layers=12, heads=12, width=768, batch=8, tokens=1024))
    123689472
    """
    shapes = parameter_shapes(s)
    return sum(math.prod(n for _, n in a) for name, a in shapes.items() if name != "position")


def model_flops(s: Config) -> float:
    """Model FLOPs of one training step: 6 N B T + 12 L B T^2 d.

    >>> round(model_flops(Config(layers=12, heads=12, width=768, batch=8, tokens=1024)) / 1e12, 3)
    7.007
    """
    tokens = s.batch * s.tokens
    return 6.0 * model_parameters(s) * tokens + 12.0 * s.layers * s.batch * s.tokens**2 * s.width


def initial_values(s: Config, seed: int = 0) -> dict[str, np.ndarray]:
    """GPT-2's initialisation: normal(0, 0.02) matrices, residual projections scaled by
    1/sqrt(2 L), zero biases, unit gains.

    >>> float(initial_values(Config(1, 1, 4, 1, 2, 8))["final_gain"].sum())
    4.0
    """
    rng = np.random.default_rng(seed)
    values = {}
    for name, axes in parameter_shapes(s).items():
        shape = tuple(n for _, n in axes)
        if name.endswith("gain"):
            values[name] = np.ones(shape, np.float32)
        elif name.endswith("bias"):
            values[name] = np.zeros(shape, np.float32)
        else:
            std = 0.02 / math.sqrt(2 * s.layers) if name.endswith(("_proj", "_out")) else 0.02
            values[name] = (rng.standard_normal(shape) * std).astype(np.float32)
    return values


def logits(p: dict, ids, s: Config, policy=None, fused: bool = False, implementation=None):
    """The next-token logits {batch, token, vocab} for token ids {batch, token}, in accy's
    named-axis API (traced by `accy.jit`). With a mixed-precision `policy` they are cast to its
    output dtype; `fused` computes attention with `nn.attention` (its `implementation`)
    instead of the composition (scores, `nn.causal_mask`, softmax)."""

    def norm(x, gain, bias):
        return nn.layer_norm(x, "channel") * gain + bias

    x = p["embed"].gather(ids, "vocab") + p["position"]
    for i in range(s.layers):
        h = norm(x, p[f"l{i}_ln1_gain"], p[f"l{i}_ln1_bias"])
        qkv = h.contract(p[f"l{i}_qkv"], "channel") + p[f"l{i}_qkv_bias"]
        if fused:  # q, k and v read where the projection wrote them
            mixed = nn.attention_qkv(qkv, causal=True, implementation=implementation)
        else:
            q, k, v = (qkv.slice("part", j, j + 1, 1).sum("part") for j in range(3))
            k, v = k.rename("token", "key"), v.rename("token", "key")
            scores = q.contract(k, "dim") * (1.0 / math.sqrt(s.head_dim))
            weights = nn.softmax(nn.causal_mask(scores, "token", "key"), "key")
            mixed = weights.contract(v, "key")
        x = x + mixed.contract(p[f"l{i}_proj"], ("head", "dim")) + p[f"l{i}_proj_bias"]
        h = norm(x, p[f"l{i}_ln2_gain"], p[f"l{i}_ln2_bias"])
        u = nn.gelu_tanh(h.contract(p[f"l{i}_fc"], "channel") + p[f"l{i}_fc_bias"])
        x = x + u.contract(p[f"l{i}_out"], "hidden") + p[f"l{i}_out_bias"]
    x = norm(x, p["final_gain"], p["final_bias"])
    scores = x.contract(p["embed"], "channel")  # tied unembedding
    return policy.cast_to_output(scores) if policy is not None else scores


def loss(p: dict, ids, targets, s: Config, policy=None, fused=False, implementation=None):
    """The mean next-token cross-entropy (nats per token) of `logits` against integer
    `targets` {batch, token}."""
    scores = logits(p, ids, s, policy, fused, implementation)
    return nn.cross_entropy(scores, targets, "vocab").mean(("batch", "token"))


def policy_for(dtype: str):
    """The mixed-precision policy of `dtype`: None for f32, f32 masters computing in bf16."""
    return nn.mixed_precision(f32, bf16, f32) if dtype == "bf16" else None


def training_step(
    s: Config,
    device: str,
    dtype: str = "f32",
    fused: bool = False,
    learning_rate: float = LR,
    scheduled: bool = False,
):
    """`step(params, state, ids, targets) -> (loss, params, state)`: one jitted function (loss,
    gradients, AdamW over the "decay" and "plain" groups of `initial_state`); in bf16 under
    `accy.nn.mixed_precision(f32, bf16, f32)`. `scheduled` adds a last argument, the learning
    rate as a scalar named array. Parameters and state are donated (`donate_argnums=(0, 1)`,
    as JAX users write it) on "cpu" and "cuda": the step writes them in place, so the arrays
    passed in must not be used after the call (use the ones it returns). With `fused`,
    attention is `nn.attention`'s custom call on "cuda" (its kernels win at every size there)
    and its own choice by size elsewhere."""
    device = as_device(device)
    implementation = "fused" if device.is_cuda else None
    decay = optim.Adam(learning_rate, BETA1, BETA2, EPS, WEIGHT_DECAY)
    plain = optim.Adam(learning_rate, BETA1, BETA2, EPS, 0.0)
    policy = policy_for(dtype)

    def step(params, state, ids, targets, rate=None):
        def loss_of(grouped):
            merged = grouped["decay"] | grouped["plain"]
            if policy is not None:
                merged = policy.cast_to_compute(merged)
            return loss(merged, ids, targets, s, policy, fused, implementation)

        value, grads = value_and_grad(loss_of)(params)
        new_params, new_state = {}, {}
        for group, optimizer in (("decay", decay), ("plain", plain)):
            new_params[group], new_state[group] = optimizer.apply(
                params[group], grads[group], state[group], rate
            )
        return value, new_params, new_state

    donate = (0, 1) if device.takes_donations else ()
    if scheduled:
        return jit(step, device=device, donate_argnums=donate)

    def fixed(params, state, ids, targets):
        return step(params, state, ids, targets)

    return jit(fixed, device=device, donate_argnums=donate)


def initial_state(s: Config, device: str, seed: int = 0) -> tuple[dict, dict]:
    """Parameters and AdamW state, grouped "decay" and "plain", as f32 named arrays on
    `device` (in bf16 they are the policy's f32 masters, cast inside the step)."""
    shapes = parameter_shapes(s)
    groups: dict[str, dict] = {"decay": {}, "plain": {}}
    for name, value in initial_values(s, seed).items():
        axes = tuple(a for a, _ in shapes[name])
        group = "decay" if decayed(name, shapes[name]) else "plain"
        groups[group][name] = named(value, axes, device=device)
    decay = optim.Adam(LR, BETA1, BETA2, EPS, WEIGHT_DECAY)
    return groups, {g: decay.init(groups[g]) for g in groups}
