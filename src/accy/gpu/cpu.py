"""The CPU's device state, kept for compatibility (see `accy.compat.seed`)."""

from ..compat.seed import CpuHandle as Handle
from ..compat.seed import CpuState as State

__all__ = ["Handle", "State"]
