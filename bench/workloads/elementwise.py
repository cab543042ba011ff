"""elementwise: sum(tanh(x) exp(-x^2) + |x|) over 4M elements: memory and transcendentals."""

from __future__ import annotations

import numpy as np

from accy import Builder, TensorType, Value, f32, spec

from . import Extents, Workload, normal


def specs(extents: Extents) -> list[TensorType]:
    return [spec(f32, n=extents["n"])]


def inputs(extents: Extents, rng: np.random.Generator) -> list[np.ndarray]:
    return [normal(rng, (extents["n"],))]


def loss(builder: Builder, args: list[Value]) -> Value:
    (x,) = args
    return (x.tanh() * (-(x * x)).exp() + x.abs()).sum()


WORKLOAD = Workload("elementwise", ("x",), {"n": 4194304}, {"n": 17}, specs, inputs, loss, wrt=(0,))
