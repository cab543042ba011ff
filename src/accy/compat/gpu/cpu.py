"""The CPU's device state (`State`) and handle (`Handle`)."""

from __future__ import annotations

from dataclasses import dataclass

from .state import DeviceState
from .state import Handle as DeviceHandle


@dataclass(frozen=True)
class Handle(DeviceHandle):
    """The CPU's handle."""

    kind: str = "cpu"


class State(DeviceState):
    """The CPU device's state.

    >>> State().handle().kind
    'cpu'
    """

    def __init__(self) -> None:
        super().__init__(Handle())


__all__ = ["Handle", "State"]
