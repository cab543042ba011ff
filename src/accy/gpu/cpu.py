"""The CPU as a device: it needs no setup, but has the same `State().handle()` shape as CUDA."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Handle:
    """What compilation and loading are given to say which device they target."""

    kind: str = "cpu"
    ordinal: int = 0


class State:
    """The CPU device's state (the seed's `gpu.cpu.State`).

    >>> from accy.gpu.cpu import State
    >>> State().handle().kind
    'cpu'
    """

    def __init__(self) -> None:
        self._handle = Handle()

    def handle(self) -> Handle:
        return self._handle

    def close(self) -> None:
        """Nothing to release on the CPU; present so that code can treat devices alike."""

    def __enter__(self) -> State:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
