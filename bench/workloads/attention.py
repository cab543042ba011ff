"""attention: the seed's causal attention loss, sum((softmax(q k^T + mask) v)^2), with
`accy.nn.attention` (the mask is its bias)."""

from __future__ import annotations

import numpy as np

from accy import Builder, TensorType, Value, f32, nn, spec

from . import Extents, Workload, normal

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
    return (mixed * mixed).sum()


WORKLOAD = Workload(
    "attention",
    ("q", "k", "v", "mask"),
    {"token": 256, "channel": 64},
    {"token": 5, "channel": 3},
    specs,
    inputs,
    loss,
    wrt=(0, 1, 2),
)
