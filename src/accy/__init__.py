"""accy: a named-axis tensor compiler with automatic differentiation.

>>> import accy
>>> loss = accy.trace.define(
...     "loss", [accy.spec(accy.f32, lane=4)] * 2, lambda b, a: (a[0] * a[1]).sum("lane"))
>>> print(loss.count("mul"))
1
"""

# The packages (the pipeline, bottom up: core, trace, transforms, lower, backends, frontend).
from . import (
    backends,
    caches,
    core,
    custom,
    errors,
    frontend,
    gradient,
    interpret,
    kernel,
    lower,
    mesh,
    models,
    nn,
    optim,
    random,
    reference,
    testing,
    trace,
    transforms,
)

# The public surface: each name bound once, from the module that owns it.
from .api import CompiledProgram, compile, run
from .backends.devices import Device, device, devices
from .caches import clear_caches
from .checkpoints import load, save
from .config import config
from .core import SYNTHETIC_ID, Operation, Program
from .core.types import DType, TensorType, bf16, bool_, f16, f32, f64, i32, i64, spec, u8
from .custom import CustomCall
from .errors import (
    AccyError,
    AxisError,
    CheckpointError,
    CompileError,
    CustomCallConflict,
    CustomCallError,
    CustomCallRequiresJvpContract,
    CustomCallRequiresVjpContract,
    DonationError,
    DTypeError,
    GradientRequiresScalarOutput,
    InvalidInput,
    MeshError,
    NotDifferentiable,
    ParseError,
    PretrainedError,
    RuntimeUnavailable,
    TypeRuleError,
)
from .frontend import (
    DeviceMismatch,
    NamedArray,
    NonArrayLeaf,
    StaticArgumentError,
    TransformError,
    jit,
    named,
    vmap,
)
from .frontend.control import cond, fori_loop, map, scan, switch, while_loop
from .frontend.functions import grad, jvp, linearize, value_and_grad, vjp
from .gradient import checkpoint, grad_with, grad_with_rules, linear_transpose
from .mesh import Mesh, shard
from .nn import field
from .trace import Builder, Value
from .transforms.linearize import Dual
from .transforms.simplify import simplify

__all__ = [
    "SYNTHETIC_ID",
    "AccyError",
    "AxisError",
    "Builder",
    "CheckpointError",
    "CompileError",
    "CompiledProgram",
    "CustomCall",
    "CustomCallConflict",
    "CustomCallError",
    "CustomCallRequiresJvpContract",
    "CustomCallRequiresVjpContract",
    "DType",
    "DTypeError",
    "Device",
    "DeviceMismatch",
    "DonationError",
    "Dual",
    "GradientRequiresScalarOutput",
    "InvalidInput",
    "Mesh",
    "MeshError",
    "NamedArray",
    "NonArrayLeaf",
    "NotDifferentiable",
    "Operation",
    "ParseError",
    "PretrainedError",
    "Program",
    "RuntimeUnavailable",
    "StaticArgumentError",
    "TensorType",
    "TransformError",
    "TypeRuleError",
    "Value",
    "backends",
    "bf16",
    "bool_",
    "caches",
    "checkpoint",
    "clear_caches",
    "compile",
    "cond",
    "config",
    "core",
    "custom",
    "device",
    "devices",
    "errors",
    "f16",
    "f32",
    "f64",
    "field",
    "fori_loop",
    "frontend",
    "grad",
    "grad_with",
    "grad_with_rules",
    "gradient",
    "i32",
    "i64",
    "interpret",
    "jit",
    "jvp",
    "kernel",
    "linear_transpose",
    "linearize",
    "load",
    "lower",
    "map",
    "mesh",
    "models",
    "named",
    "nn",
    "optim",
    "random",
    "reference",
    "run",
    "save",
    "scan",
    "shard",
    "simplify",
    "spec",
    "switch",
    "testing",
    "trace",
    "transforms",
    "u8",
    "value_and_grad",
    "vjp",
    "vmap",
    "while_loop",
]
