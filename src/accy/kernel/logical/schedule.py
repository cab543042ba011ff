"""How a kernel's parallel loop is spread over the device: threads per block.

The grid is derived, not chosen: enough blocks for one thread per position of the loop, checked
against `accy.kernel.Limits` when the kernel is built.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import KernelError


@dataclass(frozen=True)
class ThreadBlocks:
    """Blocks of `x` threads; each thread computes one position of the kernel's loop."""

    x: int

    def __post_init__(self) -> None:
        if not isinstance(self.x, int) or isinstance(self.x, bool) or self.x < 1:
            raise KernelError(f"thread_blocks(x=...) needs a positive int, got {self.x!r}")


def thread_blocks(*, x: int) -> ThreadBlocks:
    """A schedule of `x` threads per block.

    >>> from accy.kernel.logical import schedule
    >>> schedule.thread_blocks(x=128)
    ThreadBlocks(x=128)
    """
    return ThreadBlocks(x)
