"""Peak bytes handed out by CuPy's memory pool, tracked with a CuPy memory hook."""

from __future__ import annotations

from typing import Any

import cupy


class _PoolTracker(cupy.cuda.MemoryHook):
    name = "BenchPoolTracker"

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0
        self.sizes: dict[int, int] = {}

    def malloc_postprocess(self, **kwargs: Any) -> None:
        self.sizes[kwargs["mem_ptr"]] = kwargs["mem_size"]
        self.live += kwargs["mem_size"]
        self.peak = max(self.peak, self.live)

    def free_postprocess(self, **kwargs: Any) -> None:
        self.live -= self.sizes.pop(kwargs["mem_ptr"], 0)


class CupyPoolPeak:
    """DeviceMemory for CuPy: the hook is installed at construction, before the step is built."""

    method = "bytes handed out by CuPy's memory pool (a CuPy memory hook)"

    def __init__(self) -> None:
        self.tracker = _PoolTracker()
        self.tracker.__enter__()
        self.baseline = 0

    def in_use_bytes(self) -> int:
        return self.tracker.live

    def reset(self) -> None:
        self.baseline = self.tracker.live
        self.tracker.peak = self.tracker.live

    def peak_bytes(self) -> int:
        return self.tracker.peak - self.baseline
