"""`accy.kernel`: a small language for custom-call kernels, lowered to C and to CUDA C.

A kernel is a `logical.Program` over named buffers; its `create_kernel_call_artifact` builds it for
a custom-call target, and the artifact's `registry()` is what the backends link custom calls
against. See README.md in this directory for the design.

>>> import accy
>>> from accy.kernel import Limits, dynamic_buffer, logical
>>> def body(k, args):
...     def each(inner, index, each_args):
...         x = each_args.param("x").load(inner, index)
...         each_args.param("dst").store(inner, x.add(inner, x), index)
...     k.for_each_1d("e", 4, args, each)
>>> double = logical.Program(
...     name="accy_custom_double_4_f32",
...     parameters={"dst": dynamic_buffer(accy.f32), "x": dynamic_buffer(accy.f32)},
...     body=body,
... ).with_schedule(logical.schedule.thread_blocks(x=4))
>>> registry = double.create_kernel_call_artifact(
...     Limits.testing, None, target="accy.custom.double", version=1, format="cpu_object"
... ).registry()
>>> registry.require("accy.custom.double", 1).symbol
'accy_kernel_accy_custom_double_4_f32'
"""

from . import examples, logical, lower, ops
from .artifact import FORMATS, KernelCallArtifact
from .call import KernelCall, KernelCallRegistry
from .errors import KernelCallMismatch, KernelCallNotFound, KernelError, KernelLimitExceeded
from .handwritten import c_kernel_call
from .ir import Buffer, Index1D, Index2D, dynamic_buffer
from .limits import Limits
from .lower import c_storage_type

__all__ = [
    "c_kernel_call",
    "FORMATS",
    "Buffer",
    "Index1D",
    "Index2D",
    "KernelCall",
    "KernelCallArtifact",
    "KernelCallMismatch",
    "KernelCallNotFound",
    "KernelCallRegistry",
    "KernelError",
    "KernelLimitExceeded",
    "Limits",
    "c_storage_type",
    "dynamic_buffer",
    "examples",
    "logical",
    "lower",
    "ops",
]
