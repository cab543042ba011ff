"""block: a transformer feed-forward block, layer norm then a gelu MLP, sum of squares.

In bf16 the layer norm and the hidden layer are bf16 (each contraction summed in f32 and rounded
once), the output is the f32 sum of the second contraction (`accumulate=f32`) and its sum of
squares is f32.

FLOPs of the loss and the gradients with respect to w1, w2, gain and bias (x has none):
12·row·embed·ff (forward normed·w1, hidden·w2; backward hiddenᵀ·dout, dout·w2ᵀ, normedᵀ·dpre,
dpre·w1ᵀ, each 2·row·embed·ff).
"""

from __future__ import annotations

import numpy as np

from accy import Builder, TensorType, Value, f32, nn, spec

from . import Extents, Workload, normal, wide

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
    out = hidden.contract(w2, "ff", accumulate=wide(hidden))
    return (out * out).sum()


def flops(extents: Extents) -> float:
    """12·row·embed·ff (see the module doc)."""
    return 12 * extents["row"] * extents["embed"] * extents["ff"]


WORKLOAD = Workload(
    "block",
    ("x", "w1", "w2", "gain", "bias"),
    {"row": 2048, "embed": 512, "ff": 2048},
    {"row": 3, "embed": 4, "ff": 6},
    specs,
    inputs,
    loss,
    wrt=(1, 2, 3, 4),
    dtypes=("f32", "bf16"),
    flops=flops,
    flops_formula="12*row*embed*ff",
)
