"""The `cnn` training workload: a small CNN on 8x8 digit images with AdamW, as a user writes it
in accy, JAX (optax) and PyTorch (eager and `torch.compile`). `bench.training` runs and
compares it; this module holds the model, its sizes, inputs and one step builder per system.

The model (the same in every system, f32):

    images{batch, height=8, width=8, channel=1}
    -> conv 3x3 same (1 -> 16) + bias -> ReLU -> max pool 2x2     {batch, 4, 4, 16}
    -> conv 3x3 same (16 -> 32) + bias -> ReLU -> max pool 2x2    {batch, 2, 2, 32}
    -> dense (2*2*32 -> 64) + bias -> ReLU -> dropout (rate 0.25)
    -> dense (64 -> 10) + bias -> softmax cross-entropy against integer labels, batch mean

AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 1e-4 on every parameter, as optax's
and PyTorch's defaults decay every parameter); parameters and optimizer state updated in place
(accy and JAX donate them). Kernels are {height, width, channel, out} (JAX's HWIO); PyTorch
holds the same values in its own layouts (NCHW input, OIHW kernels), converted once.

Dropout: the keep mask {batch, hidden} is an input drawn once by NumPy from the seed, the same
for every system, so that the three systems drop the same units and their losses can be
compared (each system's own random numbers differ); each step multiplies by mask / (1 - rate),
as `accy.nn.dropout` does with the mask it draws.

FLOPs of one step (2 per multiply-add of the convolutions and dense layers; the first
convolution's input gradient is not needed):

    2 * batch * (2 * 64*9*1*16 + 3 * 16*9*16*32 + 3 * 128*64 + 3 * 64*10)
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

LR, BETA1, BETA2, EPS, WEIGHT_DECAY = 1e-3, 0.9, 0.999, 1e-8, 1e-4
DROPOUT = 0.25
SPATIAL = ("height", "width")


@dataclass(frozen=True)
class Scale:
    """The CNN's sizes: images of `side` x `side`, channels c1 and c2 of the two
    convolutions, a hidden dense layer, the classes, `batch` images per step."""

    batch: int
    side: int = 8
    c1: int = 16
    c2: int = 32
    hidden: int = 64
    classes: int = 10

    @property
    def pooled(self) -> int:
        """The side after the two 2x2 pools."""
        return self.side // 4


SCALES = {"cpu": Scale(batch=128), "check": Scale(batch=4, side=4, c1=3, c2=4, hidden=5, classes=3)}


def flops(s: Scale) -> float:
    """The FLOPs of one step (module doc): forward and weight gradients of both convolutions,
    the second's input gradient, and the dense layers' forward, weight and input gradients."""
    pixels, pooled = s.side * s.side, (s.side // 2) ** 2
    conv1 = pixels * 9 * 1 * s.c1
    conv2 = pooled * 9 * s.c1 * s.c2
    dense = s.pooled**2 * s.c2 * s.hidden + s.hidden * s.classes
    return 2.0 * s.batch * (2 * conv1 + 3 * conv2 + 3 * dense)


def parameter_shapes(s: Scale) -> dict[str, tuple[tuple[str, int], ...]]:
    """Every parameter as named axes (the layout is the order written)."""
    h, w = ("height", 3), ("width", 3)
    return {
        "conv1": (h, w, ("channel", 1), ("out", s.c1)),
        "conv1_bias": (("channel", s.c1),),
        "conv2": (h, w, ("channel", s.c1), ("out", s.c2)),
        "conv2_bias": (("channel", s.c2),),
        "dense1": (
            ("height", s.pooled),
            ("width", s.pooled),
            ("channel", s.c2),
            ("hidden", s.hidden),
        ),
        "dense1_bias": (("hidden", s.hidden),),
        "dense2": (("hidden", s.hidden), ("class", s.classes)),
        "dense2_bias": (("class", s.classes),),
    }


def initial_values(s: Scale, seed: int = 0) -> dict[str, np.ndarray]:
    """He-normal weights (fan in: everything but the last axis), zero biases, float32."""
    rng = np.random.default_rng([seed, 17])
    values = {}
    for name, axes in parameter_shapes(s).items():
        shape = tuple(n for _, n in axes)
        if name.endswith("bias"):
            values[name] = np.zeros(shape, np.float32)
        else:
            fan_in = int(np.prod(shape[:-1]))
            values[name] = (rng.standard_normal(shape) * (2.0 / fan_in) ** 0.5).astype(np.float32)
    return values


def batch(s: Scale, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Images {batch, height, width, channel=1} in [0, 1], int32 labels {batch}, and the
    dropout keep mask {batch, hidden} (1.0 kept, 0.0 dropped), float32."""
    rng = np.random.default_rng([seed, 29])
    images = rng.random((s.batch, s.side, s.side, 1), dtype=np.float32)
    labels = rng.integers(0, s.classes, s.batch, dtype=np.int32)
    keep = (rng.random((s.batch, s.hidden)) >= DROPOUT).astype(np.float32)
    return images, labels, keep


Step = Callable[[], float]  # one training step in place; returns the loss (outputs ready)

# -- accy ----------------------------------------------------------------------------------------


def accy_loss(p: dict, images, labels, keep):
    """The mean cross-entropy, in accy's named-axis front end."""
    from accy import nn

    def conv_block(x, kernel, bias):
        y = x.conv(kernel, SPATIAL, "channel", "out", padding="same").rename("out", "channel")
        return nn.max_pool(nn.relu(y + bias), {"height": 2, "width": 2})

    x = conv_block(images, p["conv1"], p["conv1_bias"])
    x = conv_block(x, p["conv2"], p["conv2_bias"])
    hidden = nn.relu(x.contract(p["dense1"], ("height", "width", "channel")) + p["dense1_bias"])
    hidden = hidden * keep * (1.0 / (1.0 - DROPOUT))
    logits = hidden.contract(p["dense2"], "hidden") + p["dense2_bias"]
    return nn.cross_entropy(logits, labels, "class").mean("batch")


def accy_step(s: Scale, dtype: str = "f32") -> Step:
    """`accy.jit` of value_and_grad and `accy.optim.Adam` (AdamW), parameters and state donated."""
    import accy

    optimizer = accy.optim.Adam(LR, BETA1, BETA2, EPS, WEIGHT_DECAY)
    shapes = parameter_shapes(s)
    params = {
        k: accy.named(v, tuple(a for a, _ in shapes[k])) for k, v in initial_values(s).items()
    }
    state = optimizer.init(params)
    images, labels, keep = batch(s)
    data = (
        accy.named(images, ("batch", "height", "width", "channel")),
        accy.named(labels, ("batch",)),
        accy.named(keep, ("batch", "hidden")),
    )

    @functools.partial(accy.jit, donate_argnums=(0, 1))
    def train(params, state, images, labels, keep):
        loss, grads = accy.value_and_grad(accy_loss)(params, images, labels, keep)
        params, state = optimizer.apply(params, grads, state)
        return loss, params, state

    held = [params, state]

    def step() -> float:
        loss, held[0], held[1] = train(held[0], held[1], *data)
        return float(np.asarray(loss.array))

    return step


# -- JAX -----------------------------------------------------------------------------------------


def jax_step(s: Scale, dtype: str = "f32") -> Step:
    """`jax.jit` of value_and_grad and optax AdamW, parameters and state donated."""
    import jax
    import jax.numpy as jnp
    import optax

    jax.config.update("jax_default_matmul_precision", "highest")
    params = {k: jnp.asarray(v) for k, v in initial_values(s).items()}
    images, labels, keep = (jnp.asarray(a) for a in batch(s))
    optimizer = optax.adamw(LR, BETA1, BETA2, EPS, weight_decay=WEIGHT_DECAY)

    def conv_block(x, kernel, bias):
        y = jax.lax.conv_general_dilated(
            x, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        y = jax.nn.relu(y + bias)
        return jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    def loss_fn(p, images, labels, keep):
        x = conv_block(images, p["conv1"], p["conv1_bias"])
        x = conv_block(x, p["conv2"], p["conv2_bias"])
        flat = x.reshape(x.shape[0], -1)
        hidden = jax.nn.relu(flat @ p["dense1"].reshape(flat.shape[1], -1) + p["dense1_bias"])
        hidden = hidden * keep * (1.0 / (1.0 - DROPOUT))
        logits = hidden @ p["dense2"] + p["dense2_bias"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train(p, opt, images, labels, keep):
        loss, grads = jax.value_and_grad(loss_fn)(p, images, labels, keep)
        updates, opt = optimizer.update(grads, opt, p)
        return loss, optax.apply_updates(p, updates), opt

    held = [params, optimizer.init(params)]

    def step() -> float:
        loss, held[0], held[1] = train(held[0], held[1], images, labels, keep)
        return float(loss)

    return step


# -- PyTorch -------------------------------------------------------------------------------------


def torch_step(s: Scale, dtype: str = "f32", compiled: bool = False) -> Step:
    """PyTorch eager (or the loss under `torch.compile`), `torch.optim.AdamW`, in its own
    layouts: NCHW images, OIHW kernels, the dense layer's rows in (channel, height, width)
    order, as `flatten` of an NCHW map gives them."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    values = initial_values(s)
    layouts = {
        "conv1": lambda a: a.transpose(3, 2, 0, 1),
        "conv2": lambda a: a.transpose(3, 2, 0, 1),
        "dense1": lambda a: a.transpose(2, 0, 1, 3).reshape(-1, a.shape[-1]),
    }
    params = {
        k: torch.tensor(np.ascontiguousarray(layouts.get(k, lambda a: a)(v)), requires_grad=True)
        for k, v in values.items()
    }
    images, labels, keep = batch(s)
    images = torch.tensor(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))
    labels, keep = torch.tensor(labels, dtype=torch.long), torch.tensor(keep)
    optimizer = torch.optim.AdamW(
        list(params.values()), LR, betas=(BETA1, BETA2), eps=EPS, weight_decay=WEIGHT_DECAY
    )

    def loss_fn(images, labels, keep):
        p = params
        x = F.max_pool2d(F.relu(F.conv2d(images, p["conv1"], p["conv1_bias"], padding=1)), 2)
        x = F.max_pool2d(F.relu(F.conv2d(x, p["conv2"], p["conv2_bias"], padding=1)), 2)
        hidden = F.relu(x.flatten(1) @ p["dense1"] + p["dense1_bias"])
        hidden = hidden * keep * (1.0 / (1.0 - DROPOUT))
        logits = hidden @ p["dense2"] + p["dense2_bias"]
        return F.cross_entropy(logits, labels)

    forward = torch.compile(loss_fn) if compiled else loss_fn

    def step() -> float:
        loss = forward(images, labels, keep)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


BUILDERS = {"accy": accy_step, "jax": jax_step, "torch": torch_step}
