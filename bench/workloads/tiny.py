"""tiny: sum_lane(x * y), four lanes. It measures the fixed cost of one call."""

from __future__ import annotations

import numpy as np

from accy import Builder, TensorType, Value, f32, spec

from . import Extents, Workload, normal


def specs(extents: Extents) -> list[TensorType]:
    return [spec(f32, lane=extents["lane"])] * 2


def inputs(extents: Extents, rng: np.random.Generator) -> list[np.ndarray]:
    return [normal(rng, (extents["lane"],)) for _ in range(2)]


def loss(builder: Builder, args: list[Value]) -> Value:
    x, y = args
    return (x * y).sum("lane")


WORKLOAD = Workload("tiny", ("x", "y"), {"lane": 4}, {"lane": 4}, specs, inputs, loss, wrt=(0, 1))
