"""The CUDA device state, kept for compatibility (see `accy.compat.seed`)."""

from ..compat.seed import CudaHandle as Handle
from ..compat.seed import CudaState as State
from ..compat.seed import platform_supported

__all__ = ["Handle", "State", "platform_supported"]
