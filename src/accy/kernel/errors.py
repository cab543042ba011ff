"""Errors of the kernel DSL, all `accy.AccyError`s.

Each names the kernel (and, once registered, the custom-call target) so that a failure inside a
larger program can be traced back to the kernel that caused it.
"""

from __future__ import annotations

from ..errors import AccyError


class KernelError(AccyError):
    """A kernel program is malformed: an unknown parameter, a dtype mismatch, a misplaced store."""


class KernelLimitExceeded(KernelError):
    """A kernel does not fit the device `Limits` it is built for (threads, blocks, extents)."""


class KernelCallMismatch(KernelError):
    """A custom call's operands or result do not fit the kernel registered for its target."""


class KernelCallNotFound(KernelError):
    """No kernel is registered for a custom call's (target, version)."""
