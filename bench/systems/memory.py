"""Peak device memory on a GPU, as each system reports it (CPU memory is measured from the
process's resident set in `bench.measure`)."""

from __future__ import annotations

from typing import Protocol


class DeviceMemory(Protocol):
    """Reads the most device memory allocated since `reset()`, above what was allocated then."""

    def reset(self) -> None: ...

    def peak_bytes(self) -> int: ...
