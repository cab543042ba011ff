"""The CPU as a device: it needs no setup, but has the same `State().handle()` shape as CUDA."""

from __future__ import annotations

from dataclasses import dataclass

from . import device


@dataclass(frozen=True)
class Handle(device.Handle):
    """The CPU's handle."""

    kind: str = "cpu"


class State(device.DeviceState):
    """The CPU device's state (the seed's `gpu.cpu.State`).

    >>> from accy.gpu.cpu import State
    >>> State().handle().kind
    'cpu'
    """

    def __init__(self) -> None:
        super().__init__(Handle())
