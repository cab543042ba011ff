"""embedding: rows of a table gathered by token ids, sum of squares. Its gradient scatters."""

from __future__ import annotations

import numpy as np

from accy import Builder, TensorType, Value, f32, i32, spec

from . import Extents, Workload, normal


def specs(extents: Extents) -> list[TensorType]:
    return [
        spec(f32, vocab=extents["vocab"], channel=extents["channel"]),
        spec(i32, token=extents["token"]),
    ]


def inputs(extents: Extents, rng: np.random.Generator) -> list[np.ndarray]:
    table = normal(rng, (extents["vocab"], extents["channel"]))
    ids = rng.integers(0, extents["vocab"], size=extents["token"], dtype=np.int32)
    return [table, ids]


def loss(builder: Builder, args: list[Value]) -> Value:
    table, ids = args
    rows = table.gather(ids, "vocab")
    return (rows * rows).sum()


WORKLOAD = Workload(
    "embedding",
    ("table", "ids"),
    {"vocab": 32768, "channel": 256, "token": 4096},
    {"vocab": 7, "channel": 3, "token": 12},
    specs,
    inputs,
    loss,
    wrt=(0,),
)
