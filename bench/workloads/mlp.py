"""mlp: a tanh hidden layer, then softmax cross-entropy against one-hot labels, summed."""

from __future__ import annotations

import numpy as np

from accy import Builder, TensorType, Value, f32, nn, spec

from . import Extents, Workload, normal


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
    logits = x.contract(w1, "in").tanh().contract(w2, "hidden")
    return (nn.logsumexp(logits, "out") - (logits * y).sum("out")).sum("batch")


WORKLOAD = Workload(
    "mlp",
    ("x", "w1", "w2", "y"),
    {"batch": 256, "in": 512, "hidden": 512, "out": 10},
    {"batch": 4, "in": 6, "hidden": 5, "out": 3},
    specs,
    inputs,
    loss,
    wrt=(1, 2),
)
