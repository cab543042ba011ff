"""What the CPU and CUDA device states share: a handle naming the device, and a state that
hands it out and can be used as a context manager."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Handle:
    """What compilation and loading are given to say which device they target."""

    kind: str
    ordinal: int = 0


class DeviceState:
    """An opened device; `close()` releases nothing (fragments hold what they use), and is
    there so that code can treat every device alike.

    >>> with DeviceState(Handle("cpu")) as state:
    ...     state.handle()
    Handle(kind='cpu', ordinal=0)
    """

    def __init__(self, handle: Handle):
        self._handle = handle

    def handle(self) -> Handle:
        return self._handle

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> DeviceState:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
