"""Peak device memory on a GPU, as each system reports it (CPU memory is measured from the
process's resident set in `bench.measure`)."""

from __future__ import annotations

from typing import Protocol


class DeviceMemory(Protocol):
    """Reads the memory in use now, and the most in use since `reset()` above what was in use
    then. `method` says in a few words how (it goes into the JSON)."""

    method: str

    def in_use_bytes(self) -> int: ...

    def reset(self) -> None: ...

    def peak_bytes(self) -> int: ...
