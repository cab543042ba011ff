"""A CUDA device's state (`State.init_device(ordinal)`) and handle (`Handle`)."""

from __future__ import annotations

from dataclasses import dataclass

from ...backends.cuda.device import open_device, platform_supported
from .state import DeviceState
from .state import Handle as DeviceHandle


@dataclass(frozen=True)
class Handle(DeviceHandle):
    """A GPU's handle."""

    kind: str = "cuda"


class State(DeviceState):
    """An opened CUDA device.

    >>> import accy
    >>> try:
    ...     state = State.init_device(0)
    ... except accy.RuntimeUnavailable:
    ...     state = None  # no CuPy, driver or GPU here
    >>> state is None or state.handle() == Handle("cuda", 0)
    True
    """

    def __init__(self, ordinal: int):
        super().__init__(Handle("cuda", ordinal))

    @classmethod
    def init_device(cls, ordinal: int = 0) -> State:
        """Open GPU `ordinal`, or raise `RuntimeUnavailable` saying what is missing."""
        open_device(ordinal)
        return cls(ordinal)


__all__ = ["Handle", "State", "platform_supported"]
