"""`accy.from_dlpack(x, axes)`: a NamedArray of any DLPack producer, bfloat16 included (read
through `accy.backends.dlpack.host_from_dlpack`). The other way, `NamedArray.__dlpack__` and
`__dlpack_device__` (so `torch.from_dlpack(x)` and `jax.numpy.from_dlpack(x)` take one) export
through `accy.backends.dlpack.export_array`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..backends.dlpack import host_from_dlpack
from ..errors import InvalidInput
from .named import NamedArray, named

KDL_CUDA = 2


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
