"""Is there a GPU, and which one to use: asked without touching a GPU or importing CuPy.

`platform_supported()` answers from the platform, the installed packages and the driver
library; `open_device(ordinal)` opens the device and raises `accy.RuntimeUnavailable` saying
what is missing (CuPy, the driver or the device).
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys

from ...errors import RuntimeUnavailable

DRIVER_LIBRARIES = {"linux": "libcuda.so.1", "win32": "nvcuda.dll"}


def _driver_present() -> bool:
    try:
        ctypes.CDLL(DRIVER_LIBRARIES[sys.platform])
    except OSError:
        return False
    return True


def platform_supported() -> bool:
    """Whether this platform can run the CUDA backend: Linux or Windows, with CuPy installed
    and a CUDA driver library present. Whether a device is there is `open_device`'s question.

    >>> isinstance(platform_supported(), bool)
    True
    """
    if sys.platform not in DRIVER_LIBRARIES:
        return False
    return importlib.util.find_spec("cupy") is not None and _driver_present()


def open_device(ordinal: int = 0) -> None:
    """Make GPU `ordinal` CuPy's current device, or raise `RuntimeUnavailable` saying what is
    missing.

    >>> try:
    ...     open_device(0)
    ... except RuntimeUnavailable:
    ...     pass  # no CuPy, driver or GPU here: the error says which
    """
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


__all__ = ["open_device", "platform_supported"]
