"""The C dialect of each target: its dtype table, its prelude, and how it declares constants.

Everything else (templates, literals, the expression builder) is the same for every target;
a target differs only in these fields, as tinygrad's `CStyleLanguage` subclasses override a few
of its entries. `GCC` is C for the CPU (gcc or clang), `CUDA` is CUDA C for NVRTC and nvcc.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ...core.types import DType
from .prelude import CUDA_TARGET, GCC_TARGET, prelude
from .types import CType, c_types


@dataclass(frozen=True)
class Dialect:
    """One target's C: `types` per dtype, the `prelude` text, the qualifiers of a file-scope
    constant array (`static const` on the CPU, in device memory on CUDA), and where 16-bit
    float values computed in float registers round to 16 bits.

    `rounds_each_half_operation`: True rounds the result of every bf16/f16 arithmetic
    operation, as the reference evaluator does (bit for bit the same results). False keeps the
    intermediate values of one fused expression in float32 and rounds where a value is stored,
    converted (`convert`) or compared, as XLA (`xla_allow_excess_precision`, its default) and
    PyTorch's compiler do: results are at least as accurate, within the format's tolerance of
    the reference's. On the H200 the rounding instruction runs at a quarter of the arithmetic
    rate: GPT-2's bf16 GELU backward took 175 us with a rounding per operation and 43 us
    without (the backward's kernel timed in both forms).
    """

    name: str
    types: Mapping[DType, CType]
    prelude: str
    constant_qualifiers: str
    rounds_each_half_operation: bool = True

    def c_type(self, dtype: DType) -> CType:
        """How `dtype` looks in this dialect.

        >>> from accy import f16
        >>> GCC.c_type(f16).storage, CUDA.c_type(f16).storage
        ('_Float16', 'accy_half')
        """
        return self.types[dtype]


GCC = Dialect("c", c_types("_Float16"), prelude(GCC_TARGET), "static const")
CUDA = Dialect(
    "cuda",
    c_types("accy_half"),
    prelude(CUDA_TARGET),
    "static __device__ const",
    rounds_each_half_operation=False,
)
