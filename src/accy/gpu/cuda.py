"""The CUDA device state (the seed's `gpu.cuda`): is there a GPU, and which one to use.

`platform_supported()` answers without touching a GPU (and without importing CuPy);
`State.init_device(ordinal)` opens the device and raises `accy.RuntimeUnavailable` when CuPy,
the driver or the device is missing. Its `handle()` is what `accy.lower.compile_fragment` and
`accy.executable.load_fragment` take.
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
from dataclasses import dataclass

from ..errors import RuntimeUnavailable
from . import device

DRIVER_LIBRARIES = {"linux": "libcuda.so.1", "win32": "nvcuda.dll"}


@dataclass(frozen=True)
class Handle(device.Handle):
    """A GPU's handle."""

    kind: str = "cuda"


def _driver_present() -> bool:
    try:
        ctypes.CDLL(DRIVER_LIBRARIES[sys.platform])
    except OSError:
        return False
    return True


def platform_supported() -> bool:
    """Whether this platform can run the CUDA backend: Linux or Windows, with CuPy installed
    and a CUDA driver library present. Whether a device is there is `State.init_device`'s
    question.

    >>> import accy
    >>> isinstance(accy.gpu.cuda.platform_supported(), bool)
    True
    """
    if sys.platform not in DRIVER_LIBRARIES:
        return False
    return importlib.util.find_spec("cupy") is not None and _driver_present()


class State(device.DeviceState):
    """An opened CUDA device (the seed's `gpu.cuda.State`).

    >>> import accy
    >>> try:
    ...     state = accy.gpu.cuda.State.init_device(0)
    ... except accy.RuntimeUnavailable:
    ...     state = None  # no CuPy, driver or GPU here
    >>> state is None or state.handle() == accy.gpu.cuda.Handle("cuda", 0)
    True
    """

    def __init__(self, ordinal: int):
        super().__init__(Handle("cuda", ordinal))

    @classmethod
    def init_device(cls, ordinal: int = 0) -> State:
        """Open GPU `ordinal`, or raise `RuntimeUnavailable` saying what is missing."""
        if not platform_supported():
            raise RuntimeUnavailable(
                f"CUDA is not supported here (platform {sys.platform}; CuPy installed: "
                f"{importlib.util.find_spec('cupy') is not None}; driver: {_driver_present()})"
            )
        import cupy

        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except cupy.cuda.runtime.CUDARuntimeError as error:
            raise RuntimeUnavailable(f"the CUDA driver sees no device ({error})") from None
        if not 0 <= ordinal < count:
            raise RuntimeUnavailable(f"there is no CUDA device {ordinal}; {count} present")
        cupy.cuda.Device(ordinal).use()
        return cls(ordinal)
