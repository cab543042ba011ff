"""Device states whose `handle()` names a device: `cpu.State()` and
`cuda.State.init_device(0)`; `Handle` is what compiling and loading are given.

>>> with DeviceState(Handle("cpu")) as state:
...     state.handle()
Handle(kind='cpu', ordinal=0)
"""

from . import cpu, cuda
from .state import DeviceState, Handle

__all__ = ["DeviceState", "Handle", "cpu", "cuda"]
