"""pool: overlapping pooling, as a ResNet stem and an Inception branch pool.

x{batch, height, width, channel} -> max pool 3x3, stride 2, padding 1 on each side (ResNet's
stem; PyTorch's `max_pool2d(x, 3, 2, padding=1)`) -> average pool 3x3, stride 1, padding 1
(the padded positions count in the mean, as `avg_pool2d`'s default) -> the mean of its product
with w{height, width, channel}. The gradient with respect to x: the average pool's transpose,
then each max window's cotangent sent to its first maximum.

Each pool is the kind `reduce_window` (its gradients `select_and_scatter_add` and a windowed
sum): one-pass loops on the CPU (`accy/lower/pooling.py`), compositions elsewhere. JAX runs
`lax.reduce_window`, PyTorch `max_pool2d` / `avg_pool2d` on NCHW views of the same arrays.
No contractions: no FLOP count.
"""

from __future__ import annotations

import numpy as np

from accy import Builder, TensorType, Value, f32, nn, spec

from . import Extents, Workload, normal

WINDOW = {"height": 3, "width": 3}
PADDING = ((1, 1), (1, 1))


def pooled_side(side: int) -> int:
    """The side after the stride-2 max pool (the average pool keeps it)."""
    return (side + 2 - 3) // 2 + 1


def specs(extents: Extents) -> list[TensorType]:
    batch, height, width, channel = (extents[a] for a in ("batch", "height", "width", "channel"))
    return [
        spec(f32, batch=batch, height=height, width=width, channel=channel),
        spec(f32, height=pooled_side(height), width=pooled_side(width), channel=channel),
    ]


def inputs(extents: Extents, rng: np.random.Generator) -> list[np.ndarray]:
    batch, height, width, channel = (extents[a] for a in ("batch", "height", "width", "channel"))
    return [
        normal(rng, (batch, height, width, channel)),
        normal(rng, (pooled_side(height), pooled_side(width), channel)),
    ]


def loss(builder: Builder, args: list[Value]) -> Value:
    x, w = args
    stem = nn.max_pool(x, WINDOW, 2, PADDING)
    branch = nn.avg_pool(stem, WINDOW, 1, PADDING)
    return (branch * w).mean()


WORKLOAD = Workload(
    "pool",
    ("x", "w"),
    {"batch": 16, "height": 64, "width": 64, "channel": 64},
    {"batch": 2, "height": 5, "width": 6, "channel": 3},
    specs,
    inputs,
    loss,
    wrt=(0,),
)
