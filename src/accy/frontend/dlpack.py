"""DLPack both ways for NamedArrays: `NamedArray.__dlpack__`/`__dlpack_device__` (so
`torch.from_dlpack(x)` and `jax.numpy.from_dlpack(x)` take one), and `accy.from_dlpack(x,
axes)`, bfloat16 included.

NumPy exports no bfloat16 (it has no such dtype), so a bf16 array is exported as its 16-bit
words and the capsule's DLPack dtype is set to the standard's bfloat16 code (`kDLBfloat`, 16
bits) before it is handed over; importing reads a bfloat16 producer through
`accy.backends.dlpack.host_from_dlpack`. Other dtypes pass through the array library's own
DLPack without a copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..backends.dlpack import (
    CAPSULE,
    KDL_BFLOAT,
    DLManagedTensor,
    _capsule_is_valid,
    _capsule_pointer,
    host_from_dlpack,
)
from ..core.types import bf16
from ..errors import InvalidInput
from .named import NamedArray, named

KDL_CUDA = 2


def export(x: NamedArray, stream: Any = None, max_version: Any = None, copy: Any = None) -> Any:
    """The DLPack capsule of `x`'s array (what `x.__dlpack__()` returns).

    >>> import accy, numpy as np
    >>> x = accy.named(np.arange(3, dtype=np.float32), "n")
    >>> np.from_dlpack(x).tolist()
    [0.0, 1.0, 2.0]
    """
    array = x.array
    if x.dtype != bf16:
        options: dict[str, Any] = {}
        if stream is not None:
            options["stream"] = stream
        if max_version is not None:
            options["max_version"] = max_version
        if copy is not None:
            options["copy"] = copy
        return array.__dlpack__(**options)
    words = array.view(np.uint16) if isinstance(array, np.ndarray) else array.view("uint16")
    # The unversioned capsule (a consumer asking for a newer one still reads it), whose dtype
    # is rewritten in place: the capsule is ours until the consumer takes it.
    capsule = words.__dlpack__() if stream is None else words.__dlpack__(stream=stream)
    if not _capsule_is_valid(capsule, CAPSULE):
        raise InvalidInput("__dlpack__: the array library gave no DLPack capsule to rewrite")
    managed = DLManagedTensor.from_address(_capsule_pointer(capsule, CAPSULE))
    managed.dl_tensor.dtype.code = KDL_BFLOAT
    return capsule


def from_dlpack(x: Any, axes: Sequence[str], device: str | None = None) -> NamedArray:
    """A NamedArray of the DLPack producer `x` (a PyTorch tensor, a JAX or CuPy array, ...)
    with one axis name per dimension, in layout order: host arrays without a copy (bfloat16
    copied, which NumPy cannot import), CUDA arrays through CuPy.

    >>> import accy, numpy as np
    >>> accy.from_dlpack(np.ones((2, 3), np.float32), ("row", "col")).shape
    {'row': 2, 'col': 3}
    """
    if not hasattr(x, "__dlpack__"):
        raise InvalidInput(
            f"from_dlpack: {type(x).__name__} is not a DLPack producer (it has no __dlpack__); "
            "give a PyTorch tensor, a JAX, CuPy or NumPy array"
        )
    kind = x.__dlpack_device__()[0] if hasattr(x, "__dlpack_device__") else 1
    if kind == KDL_CUDA:
        try:
            import cupy
        except ImportError:
            raise InvalidInput(
                "from_dlpack: a CUDA array needs CuPy (pip install 'accy[cuda]')"
            ) from None
        return named(cupy.from_dlpack(x), axes, device=device)
    return named(host_from_dlpack(x, "from_dlpack"), axes, device=device)


def _dlpack(self: NamedArray, *, stream: Any = None, max_version: Any = None, **rest: Any) -> Any:
    return export(self, stream, max_version, rest.get("copy"))


def _dlpack_device(self: NamedArray) -> tuple[int, int]:
    if self.device.is_cuda:
        return self.array.__dlpack_device__()
    return (1, 0)


NamedArray.__dlpack__ = _dlpack  # type: ignore[attr-defined]
NamedArray.__dlpack_device__ = _dlpack_device  # type: ignore[attr-defined]


__all__ = ["export", "from_dlpack"]
