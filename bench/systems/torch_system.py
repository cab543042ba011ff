"""PyTorch: forward, then `backward()`, one loss function per workload.

f32: eager. bf16: bf16 tensors, and on cuda the loss is `torch.compile`d (default mode; the
backward then is AOTAutograd's compiled graph); on the CPU it stays eager. Contractions of bf16
tensors sum in f32 and round the result to bf16 (PyTorch has no f32 output for them under
autograd), so the f32 results accy and JAX keep (the mlp's logits, the block's output) are the
bf16 product converted to f32: one rounding more. Attention is `scaled_dot_product_attention`
(the mask as `attn_mask`). The loss is f32, the gradients bf16.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import torch
import torch.nn.functional as F

from bench.workloads import Workload

from .memory import DeviceMemory

Step = Callable[..., list[Any]]

# One intra-op thread per core this process may use (2 on the project's CPU machine).
torch.set_num_threads(len(os.sched_getaffinity(0)))
# float32 means float32, as for JAX (jax_system.py): PyTorch's cuDNN convolutions default to
# TF32 on tensor cores (its matmuls do not), which put the conv workload's kernel gradients
# 8.7e-3 away from accy's and JAX's in f32. bf16 runs are unaffected.
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False


def tiny(x, y):
    return (x * y).sum()


def mlp(x, w1, w2, y):
    logits = torch.tanh(x @ w1) @ w2
    return (torch.logsumexp(logits, dim=-1) - (logits * y).sum(dim=-1)).sum()


def attention(q, k, v, mask):
    weights = torch.softmax(q @ k.T + mask, dim=-1)
    mixed = weights @ v
    return (mixed * mixed).sum()


def embedding(table, ids):
    rows = torch.index_select(table, 0, ids)
    return (rows * rows).sum()


def elementwise(x):
    return (torch.tanh(x) * torch.exp(-x * x) + torch.abs(x)).sum()


def block(x, w1, w2, gain, bias, eps=1e-5):
    normed = F.layer_norm(x, x.shape[-1:], weight=gain, bias=bias, eps=eps)
    hidden = F.gelu(normed @ w1, approximate="tanh")
    out = hidden @ w2
    return (out * out).sum()


def half_mlp(x, w1, w2, y):
    logits = (torch.tanh(x @ w1) @ w2).float()
    return (torch.logsumexp(logits, dim=-1) - (logits * y.float()).sum(dim=-1)).sum()


def half_attention(q, k, v, mask):
    """One batch, one head, the mask as an additive `attn_mask`, no scaling."""
    mixed = F.scaled_dot_product_attention(
        q[None, None], k[None, None], v[None, None], attn_mask=mask, scale=1.0
    )[0, 0].float()
    return (mixed * mixed).sum()


def half_block(x, w1, w2, gain, bias, eps=1e-5):
    normed = F.layer_norm(x, x.shape[-1:], weight=gain, bias=bias, eps=eps)
    hidden = F.gelu(normed @ w1, approximate="tanh")
    out = (hidden @ w2).float()
    return (out * out).sum()


LOSSES: dict[str, Callable[..., Any]] = {
    f.__name__: f for f in (tiny, mlp, attention, embedding, elementwise, block)
}
HALF_LOSSES = LOSSES | {"mlp": half_mlp, "attention": half_attention, "block": half_block}
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def compiles(device: str, dtype: str) -> bool:
    """Whether the loss is `torch.compile`d: bf16 on cuda (f32 and the CPU stay eager)."""
    return device == "cuda" and dtype != "f32"


def backend(device: str, dtype: str = "f32") -> str:
    return "inductor" if compiles(device, dtype) else "eager"


def device_inputs(workload: Workload, arrays: Sequence[np.ndarray], device: str) -> list[Any]:
    tensors = [_tensor(a).to(device) for a in arrays]
    for index in workload.wrt:
        tensors[index].requires_grad_(True)
    _synchronize(device)
    return tensors


def _tensor(array: np.ndarray) -> Any:
    """A CPU tensor of `array`; an `ml_dtypes.bfloat16` array (which PyTorch cannot read)
    becomes a bf16 tensor of the same values (exact: through float32)."""
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.array(array))


def build(workload: Workload, scale: str, device: str, dtype: str = "f32") -> Step:
    """A step: the forward pass, `backward()`, and the gradients taken out of the inputs.

    Taking them (`.grad = None`) leaves nothing behind, as with the other systems: the caller
    owns the outputs, and the next step starts from inputs without gradients. bf16 on cuda
    compiles the loss (`torch.compile`, default mode, static shapes: the check scale gets its
    own graph); it compiles at the first call.
    """
    loss_of, wrt = (LOSSES if dtype == "f32" else HALF_LOSSES)[workload.name], workload.wrt
    if compiles(device, dtype):
        loss_of = torch.compile(loss_of, dynamic=False)

    def step(*tensors: Any) -> list[Any]:
        loss = loss_of(*tensors)
        loss.backward()
        gradients = [tensors[index].grad for index in wrt]
        for index in wrt:
            tensors[index].grad = None
        _synchronize(device)
        return [loss.detach(), *gradients]

    return step


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def to_numpy(outputs: Sequence[Any]) -> list[np.ndarray]:
    """Host arrays; bf16 tensors (which NumPy cannot hold) as `ml_dtypes.bfloat16` arrays."""
    return [_host(a.detach().cpu()) for a in outputs]


def _host(tensor: Any) -> np.ndarray:
    if tensor.dtype == torch.bfloat16:
        return tensor.float().numpy().astype(ml_dtypes.bfloat16)  # exact: bf16 values
    return tensor.numpy()


class _CachingAllocatorPeak:
    """PyTorch's CUDA caching allocator statistics (bytes handed to tensors)."""

    method = "torch.cuda.max_memory_allocated since reset_peak_memory_stats"

    def __init__(self) -> None:
        self.baseline = 0

    def in_use_bytes(self) -> int:
        return torch.cuda.memory_allocated()

    def reset(self) -> None:
        torch.cuda.reset_peak_memory_stats()
        self.baseline = self.in_use_bytes()

    def peak_bytes(self) -> int:
        return torch.cuda.max_memory_allocated() - self.baseline


def device_memory() -> DeviceMemory | None:
    return _CachingAllocatorPeak()


def conv(x, k1, k2, w, labels):
    """The conv workload (bench/workloads/conv.py): the NHWC input and HWIO kernels permuted
    to PyTorch's NCHW and OIHW (views; autograd takes the gradients back to the inputs)."""
    nchw = x.permute(0, 3, 1, 2)
    hidden = F.relu(F.conv2d(nchw, k1.permute(3, 2, 0, 1), padding=1))
    block = F.relu(F.conv2d(hidden, k2.permute(3, 2, 0, 1), padding=1) + nchw)
    logits = (block.mean(dim=(2, 3)) @ w).float()  # bf16: the product rounded, then widened
    return F.cross_entropy(logits, labels.long())


LOSSES["conv"] = conv  # registered here, after the table above, by the ops2 branch
HALF_LOSSES["conv"] = conv


def pool(x, w):
    """The pool workload (bench/workloads/pool.py) on an NCHW view of the NHWC input; the
    average pool counts the padding, as the workload's."""
    stem = F.max_pool2d(x.permute(0, 3, 1, 2), 3, 2, padding=1)
    branch = F.avg_pool2d(stem, 3, 1, padding=1, count_include_pad=True)
    return (branch * w.permute(2, 0, 1)).mean()


LOSSES["pool"] = pool
