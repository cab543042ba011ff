"""Attention on CUDA: for now every call runs as the composition (scores, softmax, weighted sum)
through the CUDA backend's own kernels and cuBLAS: the kernel function declines every operand
type (`accy.custom.inline_declined`). cuDNN's fused attention for bf16/f16 is the next step
(see the package README).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..core.types import TensorType
from ..kernel.call import KernelCall
from .signature import Signature


def kernel_factory(
    s: Signature, part: str
) -> Callable[[Sequence[TensorType], TensorType], KernelCall | None]:
    """The `kernels["cuda"]` entry of record `part` of `s`: None (the composition) for now."""

    def factory(operand_types: Sequence[TensorType], result_type: TensorType) -> None:
        return None

    return factory
