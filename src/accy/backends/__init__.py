"""Code generators and runtimes, one subpackage per device (`cpu`: generated C; `cuda`:
generated CUDA C, cuBLAS and CUDA graphs)."""

from . import cpu, cuda

__all__ = ["cpu", "cuda"]
