"""mlp: a tanh hidden layer, then softmax cross-entropy against one-hot labels, summed.

In bf16 the hidden layer is bf16 (its contraction summed in f32 and rounded once), the logits
are the f32 sum of the second contraction (`accumulate=f32`), and the cross-entropy is f32.

FLOPs of the loss and the gradients with respect to w1 and w2 (x has none):
4·batch·in·hidden + 6·batch·hidden·out (forward x·w1, h·w2; backward hᵀ·dlogits,
dlogits·w2ᵀ, xᵀ·dpre).
"""

from __future__ import annotations

import numpy as np

from accy import Builder, TensorType, Value, f32, nn, spec

from . import Extents, Workload, in_f32, normal, wide


def specs(extents: Extents) -> list[TensorType]:
    batch, inputs, hidden, out = (extents[a] for a in ("batch", "in", "hidden", "out"))
    return [
        spec(f32, {"batch": batch, "in": inputs}),  # "in" is a Python keyword: a dict then
        spec(f32, {"in": inputs, "hidden": hidden}),
        spec(f32, hidden=hidden, out=out),
        spec(f32, batch=batch, out=out),
    ]


def inputs(extents: Extents, rng: np.random.Generator) -> list[np.ndarray]:
    batch, fan_in, hidden, out = (extents[a] for a in ("batch", "in", "hidden", "out"))
    labels = rng.integers(0, out, size=batch)
    return [
        normal(rng, (batch, fan_in)),
        normal(rng, (fan_in, hidden), scale=fan_in**-0.5),
        normal(rng, (hidden, out), scale=hidden**-0.5),
        np.eye(out, dtype=np.float32)[labels],
    ]


def loss(builder: Builder, args: list[Value]) -> Value:
    x, w1, w2, y = args
    hidden = x.contract(w1, "in").tanh()
    logits = hidden.contract(w2, "hidden", accumulate=wide(hidden))
    y = in_f32(y)  # one-hot: exact in bf16 and in f32
    return (nn.logsumexp(logits, "out") - (logits * y).sum("out")).sum("batch")


def flops(extents: Extents) -> float:
    """4·batch·in·hidden + 6·batch·hidden·out (see the module doc)."""
    batch, fan_in, hidden, out = (extents[a] for a in ("batch", "in", "hidden", "out"))
    return 4 * batch * fan_in * hidden + 6 * batch * hidden * out


WORKLOAD = Workload(
    "mlp",
    ("x", "w1", "w2", "y"),
    {"batch": 256, "in": 512, "hidden": 512, "out": 10},
    {"batch": 4, "in": 6, "hidden": 5, "out": 3},
    specs,
    inputs,
    loss,
    wrt=(1, 2),
    dtypes=("f32", "bf16"),
    flops=flops,
    flops_formula="4*batch*in*hidden + 6*batch*hidden*out",
)
