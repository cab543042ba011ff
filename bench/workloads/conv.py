"""conv: a ResNet basic block, then a linear classifier and softmax cross-entropy.

x{batch, height, width, channel} -> conv 3x3 (channel -> channel, same padding) -> ReLU ->
conv 3x3 -> add x -> ReLU -> mean over height and width -> contract with w{channel, class} ->
cross-entropy against integer labels, averaged over the batch. Gradients with respect to both
kernels and w. Kernels are laid out {height, width, channel, out} (JAX's HWIO); the peers read
the same arrays (PyTorch in its NCHW / OIHW order, permuted inside the step).

Each convolution is the kind `conv` (cuDNN on CUDA, the tiled implicit GEMM of
`accy.lower.convolution` on the CPU); its gradients are convolutions too.

In bf16 the input, the kernels and the activations are bf16 (each convolution sums in f32 and
rounds once), the classifier's contraction keeps its f32 sum (`wide`) and the cross-entropy is
f32.

FLOPs of the loss and gradients, in units of one convolution (2·batch·height·width·9·channel²):
the two forward convolutions, both kernel gradients and the input gradient of the second (the
first's input is x, not differentiated): 5, that is 90·batch·height·width·channel², plus the
classifier's, which is negligible.
"""

from __future__ import annotations

import numpy as np

from accy import Builder, TensorType, Value, f32, i32, nn, spec

from . import Extents, Workload, normal, wide

SPATIAL = ("height", "width")


def specs(extents: Extents) -> list[TensorType]:
    batch, height, width, channel, classes = (
        extents[a] for a in ("batch", "height", "width", "channel", "class")
    )
    kernel = spec(f32, height=3, width=3, channel=channel, out=channel)
    return [
        spec(f32, batch=batch, height=height, width=width, channel=channel),
        kernel,
        kernel,
        spec(f32, {"channel": channel, "class": classes}),  # "class" is a Python keyword
        spec(i32, batch=batch),
    ]


def inputs(extents: Extents, rng: np.random.Generator) -> list[np.ndarray]:
    batch, height, width, channel, classes = (
        extents[a] for a in ("batch", "height", "width", "channel", "class")
    )
    fan_in = 9 * channel
    return [
        normal(rng, (batch, height, width, channel)),
        normal(rng, (3, 3, channel, channel), scale=(2.0 / fan_in) ** 0.5),
        normal(rng, (3, 3, channel, channel), scale=(2.0 / fan_in) ** 0.5),
        normal(rng, (channel, classes), scale=channel**-0.5),
        rng.integers(0, classes, size=batch).astype(np.int32),
    ]


def convolve(x: Value, kernel: Value) -> Value:
    """A 3x3 same-padded convolution, channel -> out, renamed back to channel."""
    return x.conv(kernel, SPATIAL, "channel", "out", padding="same").rename("out", "channel")


def loss(builder: Builder, args: list[Value]) -> Value:
    x, k1, k2, w, labels = args
    hidden = nn.relu(convolve(x, k1))
    block = nn.relu(convolve(hidden, k2) + x)
    logits = block.mean(SPATIAL).contract(w, "channel", accumulate=wide(block))
    return nn.cross_entropy(logits, labels, "class").mean("batch")


def flops(extents: Extents) -> float:
    """5 convolutions of 2·batch·height·width·9·channel² FLOPs each (see the module doc)."""
    batch, height, width, channel = (extents[a] for a in ("batch", "height", "width", "channel"))
    return 5 * 2 * batch * height * width * 9 * channel**2


WORKLOAD = Workload(
    "conv",
    ("x", "k1", "k2", "w", "labels"),
    {"batch": 16, "height": 32, "width": 32, "channel": 64, "class": 10},
    {"batch": 2, "height": 5, "width": 4, "channel": 3, "class": 4},
    specs,
    inputs,
    loss,
    wrt=(1, 2, 3),
    dtypes=("f32", "bf16"),
    flops=flops,
    flops_formula="90*batch*height*width*channel^2",
)
