"""Milliseconds of a function's GPU work, timed with CUDA events through PyTorch (the device
tools that compare accy's kernels with PyTorch's use it)."""

from __future__ import annotations

from collections.abc import Callable


def cuda_ms(fn: Callable[[], object], repeats: int = 10, warmup: int = 2) -> float:
    """Mean milliseconds of `fn()` on the current CUDA stream, over `repeats` calls after
    `warmup` untimed ones."""
    import torch

    for _ in range(warmup):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / repeats
