"""Devices as objects: where a program runs and where its arrays live.

`accy.devices()` lists them: the CPU (native code), each CUDA GPU with its ordinal
("cuda:0", "cuda:1", ...), and the reference evaluator (NumPy). `accy.device("cuda:1")`,
`accy.device("cpu")` returns one; "cuda" is "cuda:0". Each name has one `Device` object (the
registry makes it once), so the fast paths compare devices by identity. Everywhere accy asks
for a device it takes a `Device` or its name, converted once at the door (`as_device`).

A device knows its backend (`backend`, registered per platform by `register_backend`), how to
put a host array there (`put`) and bring one back (`host`), which device holds an array
(`holding`), and whether it runs programs that take their inputs' memory (`donating`).

>>> import accy
>>> accy.device("cpu") is accy.device(accy.device("cpu")), str(accy.device("cuda"))
(True, 'cuda:0')
>>> accy.device("tpu")
Traceback (most recent call last):
accy.errors.AccyError: unknown device 'tpu'; the devices are cpu, cuda, cuda:N (a GPU's ...
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import numpy as np

from ..config import config
from ..errors import AccyError, DonationError, RuntimeUnavailable

PLATFORMS = ("cpu", "cuda", "reference")
"""The platforms accy has a backend for, in the order `devices()` lists them."""

BACKENDS: dict[str, Any] = {}
"""The backend of each platform (`accy.backends.base.register_backend` fills it)."""


class Device:
    """One device: its `platform` ("cpu", "cuda" or "reference") and `ordinal` (the GPU's
    number; 0 for the others). Made by the registry only (`device(name)`)."""

    __slots__ = ("platform", "ordinal", "name", "__weakref__")

    def __init__(self, platform: str, ordinal: int):
        self.platform, self.ordinal = platform, ordinal
        self.name = f"cuda:{ordinal}" if platform == "cuda" else platform

    @property
    def is_cuda(self) -> bool:
        """Whether this is a CUDA GPU (its arrays are CuPy arrays in its memory)."""
        return self.platform == "cuda"

    @property
    def is_host(self) -> bool:
        """Whether its arrays are NumPy arrays in host memory (the CPU and the reference)."""
        return self.platform != "cuda"

    @property
    def takes_donations(self) -> bool:
        """Whether programs compiled here can take their inputs' memory (`donating`)."""
        return hasattr(self.backend, "donating")

    @property
    def backend(self) -> Any:
        """The backend that compiles programs for this device."""
        backend = BACKENDS.get(self.platform)
        if backend is None:
            raise AccyError(f"device {self.name!r} has no backend registered")
        return backend

    def put(self, array: Any) -> Any:
        """`array` (a host array) in this device's memory: itself on a host device, a CuPy
        array on this GPU."""
        if self.is_host:
            return array
        cupy = _cupy(self)
        try:
            with cupy.cuda.Device(self.ordinal):
                return cupy.asarray(array)
        except cupy.cuda.runtime.CUDARuntimeError:
            count = gpu_count()  # counted only now: a driver call per array adds up
            if self.ordinal < count:
                raise
            raise RuntimeUnavailable(
                f"device {self.name!r}: there is no CUDA device {self.ordinal}; {count} present"
            ) from None

    def synchronize(self) -> None:
        """Wait until the work launched on this device has finished: on a GPU, accy returns
        from a call once its kernels are queued (every stream of the GPU is waited for); a
        host device has nothing to wait for.

        >>> import accy
        >>> accy.device("cpu").synchronize()
        """
        if self.is_host:
            return
        _cupy(self).cuda.Device(self.ordinal).synchronize()

    def host(self, array: Any) -> np.ndarray:
        """`array` (held by this device) as a NumPy array in host memory."""
        if self.is_host:
            return array
        return _cupy(self).asnumpy(array)

    def donating(self, executable: Any, donate: tuple[int, ...]) -> Any:
        """`executable` taking the memory of inputs `donate` (see `accy.compile`), as this
        device's backend does it, or `DonationError` where it cannot."""
        make = getattr(self.backend, "donating", None)
        if make is None:
            raise DonationError(
                f"donate={donate}: donation is implemented on the cpu and cuda devices; compile "
                f"for {self.name!r} without donate"
            )
        return make(executable, donate)

    def __repr__(self) -> str:
        return f"Device({self.name!r})"

    def __str__(self) -> str:
        return self.name

    def __reduce__(self) -> tuple:
        return (device, (self.name,))


_REGISTRY: dict[str, Device] = {}
_LOCK = threading.Lock()


def _made(platform: str, ordinal: int) -> Device:
    name = f"cuda:{ordinal}" if platform == "cuda" else platform
    found = _REGISTRY.get(name)
    if found is None:
        with _LOCK:
            found = _REGISTRY.setdefault(name, Device(platform, ordinal))
    return found


CPU = _made("cpu", 0)
REFERENCE = _made("reference", 0)


def _unknown(spec: Any) -> AccyError:
    return AccyError(
        f"unknown device {spec!r}; the devices are cpu, cuda, cuda:N (a GPU's ordinal), reference"
    )


def device(spec: str | Device) -> Device:
    """The device named `spec` ("cpu", "reference", "cuda" for "cuda:0", "cuda:N"), or `spec`
    itself when it is a Device: the one conversion at every door that takes a device.

    >>> device("cuda:1").ordinal, device("cpu") is CPU
    (1, True)
    """
    if type(spec) is Device:
        return spec
    if not isinstance(spec, str):
        raise _unknown(spec)
    found = _REGISTRY.get(spec)
    if found is not None:
        return found
    platform, _, number = spec.partition(":")
    if platform == "cuda" and (not number or (number.isdigit() and number.isascii())):
        return _made("cuda", int(number or 0))
    raise _unknown(spec)


as_device = device


def gpu_count() -> int:
    """How many CUDA GPUs this process sees (0 without CuPy, a driver or a GPU)."""
    from .cuda.device import platform_supported  # no CuPy import unless CUDA is there

    if not platform_supported():
        return 0
    import cupy

    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except cupy.cuda.runtime.CUDARuntimeError:
        return 0


def devices() -> list[Device]:
    """Every device of this process: the CPU, each CUDA GPU by ordinal, the reference.

    >>> import accy
    >>> accy.devices()[0], accy.devices()[-1]
    (Device('cpu'), Device('reference'))
    """
    return [CPU, *(_made("cuda", k) for k in range(gpu_count())), REFERENCE]


def current_default() -> Device:
    """The device new arrays from host data and calls without array arguments go to:
    `accy.config.default_device` (the CPU unless `accy.default_device` or
    ACCY_DEFAULT_DEVICE says otherwise).

    >>> current_default() is CPU
    True
    """
    name = config.default_device
    return _REGISTRY.get(name) or device(name)  # the registry first: new arrays ask for it


def default_device(spec: str | Device) -> contextlib.AbstractContextManager[None]:
    """Inside the `with` block, new arrays made from host data (`accy.named`, `accy.arange`,
    random keys) and calls without array arguments (a jitted function of scalars or of
    nothing, control flow on scalars) go to the device `spec`, as `jax.default_device` does.
    An array's own device still decides where a call on it runs, as does `jit(f, device=)`.
    Blocks nest; the setting is the process's (`accy.config.default_device`).

    >>> import accy, numpy as np
    >>> with accy.default_device(accy.device("reference")):
    ...     accy.named(np.ones(2), "n").device
    Device('reference')
    >>> accy.named(np.ones(2), "n").device
    Device('cpu')
    """
    if not isinstance(spec, str | Device):
        raise AccyError(
            f"accy.default_device takes a device (accy.device('cpu'), accy.devices()[k]) or "
            f"its name, not {type(spec).__name__} {spec!r}"
        )
    return config.override(default_device=device(spec).name)


def holding(array: Any) -> Device:
    """The device whose memory holds `array`: its GPU for a CuPy array, else the CPU.

    >>> holding(np.zeros(2)) is CPU
    True
    """
    if type(array).__module__.split(".")[0] == "cupy":
        return _made("cuda", int(array.device.id))
    return CPU


def _cupy(where: Device) -> Any:
    try:
        import cupy
    except ImportError:
        raise RuntimeUnavailable(
            f"device {where.name!r} needs CuPy (pip install 'accy[cuda]'), which is not installed"
        ) from None
    return cupy


__all__ = [
    "BACKENDS",
    "CPU",
    "PLATFORMS",
    "REFERENCE",
    "Device",
    "as_device",
    "current_default",
    "default_device",
    "device",
    "devices",
    "gpu_count",
    "holding",
]
