"""block: a transformer feed-forward block, layer norm then a gelu MLP, sum of squares."""

from __future__ import annotations

import numpy as np

from accy import Builder, TensorType, Value, f32, nn, spec

from . import Extents, Workload, normal

EPS = 1e-5


def specs(extents: Extents) -> list[TensorType]:
    row, embed, ff = extents["row"], extents["embed"], extents["ff"]
    return [
        spec(f32, row=row, embed=embed),
        spec(f32, embed=embed, ff=ff),
        spec(f32, ff=ff, embed=embed),
        spec(f32, embed=embed),
        spec(f32, embed=embed),
    ]


def inputs(extents: Extents, rng: np.random.Generator) -> list[np.ndarray]:
    row, embed, ff = extents["row"], extents["embed"], extents["ff"]
    return [
        normal(rng, (row, embed)),
        normal(rng, (embed, ff), scale=embed**-0.5),
        normal(rng, (ff, embed), scale=ff**-0.5),
        1.0 + normal(rng, (embed,), scale=0.1),
        normal(rng, (embed,), scale=0.1),
    ]


def loss(builder: Builder, args: list[Value]) -> Value:
    x, w1, w2, gain, bias = args
    normed = nn.layer_norm(x, "embed", eps=EPS) * gain + bias
    hidden = nn.gelu_tanh(normed.contract(w1, "embed"))
    out = hidden.contract(w2, "ff")
    return (out * out).sum()


WORKLOAD = Workload(
    "block",
    ("x", "w1", "w2", "gain", "bias"),
    {"row": 2048, "embed": 512, "ff": 2048},
    {"row": 3, "embed": 4, "ff": 6},
    specs,
    inputs,
    loss,
    wrt=(1, 2, 3, 4),
)
