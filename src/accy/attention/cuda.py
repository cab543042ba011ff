"""The CUDA kernels of attention: cuDNN's fused attention (placeholder, filled in below)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..core.types import TensorType
from ..kernel.call import KernelCall
from ..kernel.errors import KernelCallNotFound
from .signature import Signature


def kernel_factory(
    s: Signature, part: str
) -> Callable[[Sequence[TensorType], TensorType], KernelCall]:
    def factory(operand_types: Sequence[TensorType], result_type: TensorType) -> KernelCall:
        raise KernelCallNotFound(f"{s.target(part)}: no CUDA kernel yet")

    return factory
