"""Device limits a kernel is checked against when it is built, so it never fails at launch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .errors import KernelLimitExceeded


@dataclass(frozen=True)
class Limits:
    """What the device allows one kernel launch.

    The defaults are CUDA's limits for every GPU since compute capability 3.0. `Limits.testing`
    is deliberately small, so that tests reach the limits with small kernels.

    >>> import accy
    >>> accy.kernel.Limits.testing.max_threads_per_block
    256
    >>> accy.kernel.Limits(max_threads_per_block=128).max_blocks
    2147483647
    """

    max_threads_per_block: int = 1024
    max_blocks: int = 2**31 - 1  # blocks in the grid's x dimension
    max_extent: int = 2**31 - 1  # elements one parallel loop may cover
    max_reduction_extent: int = 2**24  # steps of one thread's serial reduction
    max_parameters: int = 64

    testing: ClassVar[Limits]
    default: ClassVar[Limits]

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise KernelLimitExceeded(f"Limits.{name} must be a positive int, got {value!r}")

    def check_threads_per_block(self, kernel: str, threads: int) -> None:
        """Reject blocks larger than the device runs.

        >>> Limits.testing.check_threads_per_block("k", 1024)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        accy.kernel.errors.KernelLimitExceeded: ... 1024 threads per block, but the limits allow 256
        """
        if threads > self.max_threads_per_block:
            raise KernelLimitExceeded(
                f"kernel {kernel!r}: thread_blocks(x={threads}) asks for {threads} threads per "
                f"block, but the limits allow {self.max_threads_per_block}"
            )

    def check_blocks(self, kernel: str, label: str, extent: int, threads: int) -> int:
        """The blocks needed to give each of `extent` elements its own thread; checked.

        >>> Limits.testing.check_blocks("k", "e", 1000, 32)
        32
        """
        blocks = max(1, -(-extent // threads))
        if blocks > self.max_blocks:
            raise KernelLimitExceeded(
                f"kernel {kernel!r}: loop {label!r} covers {extent} elements, which at "
                f"{threads} threads per block needs {blocks} blocks, but the limits allow "
                f"{self.max_blocks}; use more threads per block (at most "
                f"{self.max_threads_per_block}) or split the work"
            )
        return blocks

    def check_extent(self, kernel: str, label: str, extent: int) -> None:
        """Reject a parallel loop longer than the limits allow.

        >>> Limits.testing.check_extent("k", "e", 1 << 16)
        """
        if extent > self.max_extent:
            raise KernelLimitExceeded(
                f"kernel {kernel!r}: loop {label!r} covers {extent} elements, but the limits "
                f"allow {self.max_extent} per loop"
            )

    def check_reduction_extent(self, kernel: str, label: str, extent: int) -> None:
        """Reject a serial reduction longer than one thread should run.

        >>> Limits.testing.check_reduction_extent("k", "r", 4096)
        """
        if extent > self.max_reduction_extent:
            raise KernelLimitExceeded(
                f"kernel {kernel!r}: reduction {label!r} runs {extent} steps in one thread, but "
                f"the limits allow {self.max_reduction_extent}"
            )

    def check_parameters(self, kernel: str, count: int) -> None:
        """Reject more kernel parameters than the limits allow.

        >>> Limits.testing.check_parameters("k", 8)
        """
        if count > self.max_parameters:
            raise KernelLimitExceeded(
                f"kernel {kernel!r} has {count} parameters, but the limits allow "
                f"{self.max_parameters}"
            )


Limits.default = Limits()
Limits.testing = Limits(
    max_threads_per_block=256,
    max_blocks=64,
    max_extent=1 << 16,
    max_reduction_extent=1 << 12,
    max_parameters=8,
)
