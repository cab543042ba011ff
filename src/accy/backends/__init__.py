"""Code generators and runtimes, one subpackage per device (`cpu`: generated C)."""

from . import cpu

__all__ = ["cpu"]
