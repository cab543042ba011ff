"""What every device state is: a `Handle` and the `DeviceState` that gives it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Handle:
    """What compiling and loading are given to say which device they target."""

    kind: str
    ordinal: int = 0


class DeviceState:
    """An opened device; `close()` releases nothing (executables hold what they use)."""

    def __init__(self, handle: Handle):
        self._handle = handle

    def handle(self) -> Handle:
        return self._handle

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> DeviceState:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


__all__ = ["DeviceState", "Handle"]
