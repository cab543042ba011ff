"""attention: the seed's causal attention loss, sum((softmax(q k^T + mask) v)^2), with
`accy.nn.attention` (the mask is its bias).

In bf16, q, k, v and the mask are bf16, the attention's output is bf16 and its sum of squares
is f32.

FLOPs, as FlashAttention counts them (issue 16): 4·token²·channel·(1 + 2.5) = 14·token²·channel
for the forward (q·kᵀ, weights·v) and a backward of 2.5 forwards (the scores recomputed,
dweights, dv, dq, dk); the mask is a bias, so every score is computed and nothing is halved.
"""

from __future__ import annotations

import numpy as np

from accy import Builder, TensorType, Value, f32, nn, spec

from . import Extents, Workload, in_f32, normal

MASKED = -30.0


def specs(extents: Extents) -> list[TensorType]:
    token, channel = extents["token"], extents["channel"]
    return [spec(f32, token=token, channel=channel)] * 3 + [spec(f32, token=token, key=token)]


def causal_mask(tokens: int) -> np.ndarray:
    """0 where a query may attend (key <= token), MASKED above the diagonal."""
    allowed = np.tril(np.ones((tokens, tokens), dtype=bool))
    return np.where(allowed, 0.0, MASKED).astype(np.float32)


def inputs(extents: Extents, rng: np.random.Generator) -> list[np.ndarray]:
    token, channel = extents["token"], extents["channel"]
    # Scaled so that the scores q.k have a standard deviation of about 1.
    qkv = [normal(rng, (token, channel), scale=channel**-0.25) for _ in range(3)]
    return [*qkv, causal_mask(token)]


def loss(builder: Builder, args: list[Value]) -> Value:
    q, k, v, mask = args
    # softmax(q k^T + mask) v, fused (accy.nn.attention): the mask is its additive bias.
    mixed = nn.attention(
        q,
        k.rename("token", "key"),
        v.rename("token", "key"),
        dim_axis="channel",
        scale=1.0,
        bias=mask,
    )
    mixed = in_f32(mixed)
    return (mixed * mixed).sum()


def flops(extents: Extents) -> float:
    """4·token²·channel·(1 + 2.5) (see the module doc)."""
    return 4 * extents["token"] ** 2 * extents["channel"] * 3.5


WORKLOAD = Workload(
    "attention",
    ("q", "k", "v", "mask"),
    {"token": 256, "channel": 64},
    {"token": 5, "channel": 3},
    specs,
    inputs,
    loss,
    wrt=(0, 1, 2),
    dtypes=("f32", "bf16"),
    flops=flops,
    flops_formula="4*token^2*channel*(1 + 2.5)",
)
