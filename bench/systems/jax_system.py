"""JAX: `jax.jit(jax.value_and_grad(loss, argnums=wrt))`, one loss function per workload.

In bf16 the inputs are bf16 arrays; each contraction sums in f32 (`preferred_element_type`)
and is rounded back to bf16, except where the workload wants its f32 result (`wide`: the mlp's
logits, the block's output), as accy's `accumulate=f32`; attention is
`jax.nn.dot_product_attention` (the mask its bias); the loss is f32 and the gradients bf16.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bench.workloads import Workload

from .memory import DeviceMemory

Step = Callable[..., list[Any]]

# float32 means float32: on a GPU, JAX's default matmul precision would use TF32 (as PyTorch
# does not, by default, and accy does not), a different and less accurate computation. (bf16
# runs set it back to "default": `use_precision`.)
jax.config.update("jax_default_matmul_precision", "highest")


def dot(a, b, wide: bool = False):
    """a @ b; for 16-bit operands summed in f32, then rounded back unless `wide` (f32 result)."""
    if a.dtype == jnp.float32:
        return a @ b
    summed = jnp.matmul(a, b, preferred_element_type=jnp.float32)
    return summed if wide else summed.astype(a.dtype)


def tiny(x, y):
    return (x * y).sum()


def mlp(x, w1, w2, y):
    logits = dot(jnp.tanh(dot(x, w1)), w2, wide=True)
    y = y.astype(logits.dtype)
    return (jax.nn.logsumexp(logits, axis=-1) - (logits * y).sum(axis=-1)).sum()


def attention(q, k, v, mask):
    weights = jax.nn.softmax(q @ k.T + mask, axis=-1)
    mixed = weights @ v
    return (mixed * mixed).sum()


def embedding(table, ids):
    rows = table[ids]
    return (rows * rows).sum()


def elementwise(x):
    return (jnp.tanh(x) * jnp.exp(-x * x) + jnp.abs(x)).sum()


def block(x, w1, w2, gain, bias, eps=1e-5):
    centered = x - x.mean(axis=-1, keepdims=True)
    variance = (centered * centered).mean(axis=-1, keepdims=True)
    normed = centered * jax.lax.rsqrt(variance + eps) * gain + bias
    hidden = jax.nn.gelu(dot(normed, w1), approximate=True)
    out = dot(hidden, w2, wide=True)
    return (out * out).sum()


def fused_attention(q, k, v, mask):
    """attention through `jax.nn.dot_product_attention` with its default implementation (XLA's
    in JAX 0.10 and 0.11), one batch and one head, the mask its bias, no scaling."""
    mixed = jax.nn.dot_product_attention(
        q[None, :, None], k[None, :, None], v[None, :, None], bias=mask[None, None], scale=1.0
    )[0, :, 0].astype(jnp.float32)
    return (mixed * mixed).sum()


LOSSES: dict[str, Callable[..., Any]] = {
    f.__name__: f for f in (tiny, mlp, attention, embedding, elementwise, block)
}
HALF_LOSSES = LOSSES | {"attention": fused_attention}


def backend(device: str, dtype: str = "f32") -> str:
    return "xla"


def use_precision(dtype: str) -> None:
    """f32 GEMMs in exact f32 ("highest"); bf16 GEMMs at the default (bf16 products, f32 sums)."""
    jax.config.update("jax_default_matmul_precision", "highest" if dtype == "f32" else "default")


def _device(device: str) -> Any:
    return jax.devices("gpu" if device == "cuda" else "cpu")[0]


def device_inputs(workload: Workload, arrays: Sequence[np.ndarray], device: str) -> list[Any]:
    return jax.block_until_ready([jax.device_put(a, _device(device)) for a in arrays])


def build(workload: Workload, scale: str, device: str, dtype: str = "f32") -> Step:
    """`jax.jit(jax.value_and_grad(...))`; it traces and compiles at its first call."""
    use_precision(dtype)
    loss = (LOSSES if dtype == "f32" else HALF_LOSSES)[workload.name]
    step = jax.jit(jax.value_and_grad(loss, argnums=workload.wrt))

    def ready(*arrays: Any) -> list[Any]:
        loss, grads = step(*arrays)
        return jax.block_until_ready([loss, *grads])

    return ready


def to_numpy(outputs: Sequence[Any]) -> list[np.ndarray]:
    return [np.asarray(a) for a in outputs]


class _XlaPeak:
    """XLA's allocator statistics. Its peak cannot be reset: it is the peak since the process
    started, so it may include scratch memory of the compilation (autotuning) too."""

    method = "XLA peak_bytes_in_use since the process started (may include compile scratch)"

    def __init__(self, device: Any) -> None:
        self.device = device
        self.baseline = 0

    def in_use_bytes(self) -> int:
        return self.device.memory_stats()["bytes_in_use"]

    def reset(self) -> None:
        self.baseline = self.in_use_bytes()

    def peak_bytes(self) -> int:
        return self.device.memory_stats()["peak_bytes_in_use"] - self.baseline


def device_memory() -> DeviceMemory | None:
    return _XlaPeak(_device("cuda"))


def conv(x, k1, k2, w, labels):
    """The conv workload (bench/workloads/conv.py): NHWC input, HWIO kernels. In bf16 the
    convolutions are bf16 (f32 sums) and the classifier's product keeps its f32 sum."""

    def convolve(a, kernel):
        return jax.lax.conv_general_dilated(
            a, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    hidden = jax.nn.relu(convolve(x, k1))
    block = jax.nn.relu(convolve(hidden, k2) + x)
    logits = jnp.matmul(block.mean(axis=(1, 2)), w, preferred_element_type=jnp.float32)
    picked = jnp.take_along_axis(logits, labels[:, None], axis=1)[:, 0]
    return (jax.nn.logsumexp(logits, axis=-1) - picked).mean()


LOSSES["conv"] = conv  # registered here, after the table above, by the ops2 branch
HALF_LOSSES["conv"] = conv


def pool(x, w):
    """The pool workload (bench/workloads/pool.py): max pool 3x3 stride 2, then average pool
    3x3 stride 1, both padded by 1 on each side (NHWC)."""
    pads = ((0, 0), (1, 1), (1, 1), (0, 0))
    stem = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), pads)
    branch = jax.lax.reduce_window(stem, 0.0, jax.lax.add, (1, 3, 3, 1), (1, 1, 1, 1), pads) / 9
    return (branch * w).mean()


LOSSES["pool"] = pool
