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
from .backends.devices import Device, default_device, device, devices
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
    disable_jit,
    jit,
    named,
    vmap,
)
from .frontend.array_functions import allclose, arange, clip, isclose, var, where
from .frontend.axes import (
    eliminate_axes,
    rearrange,
    rearrange_for_partial_order,
    replace_axis,
    without_axes,
)
from .frontend.control import associative_scan, cond, fori_loop, map, scan, switch, while_loop
from .frontend.custom_rules import (
    CustomVJPPrimal,
    SymbolicZero,
    closure_convert,
    custom_gradient,
    custom_jvp,
    custom_vjp,
    custom_vjp_primal_tree_values,
    custom_vmap,
    sequential_vmap,
    zero_from_primal,
)
from .frontend.dlpack import from_dlpack
from .frontend.errors import NonFiniteValue
from .frontend.functions import fwd_and_bwd, grad, jvp, linearize, value_and_grad, vjp
from .frontend.inspection import Lowered, eval_shape, make_program
from .frontend.jacobians import hessian, jacfwd, jacrev
from .frontend.printing import debug_print
from .frontend.regions import (
    checkpoint,
    checkpoint_name,
    checkpoint_policies,
    remat,
    stop_gradient,
)
from .frontend.tracing import block_until_ready, no_execution, no_tracing
from .frontend.transpose import linear_transpose
from .gradient import grad_with, grad_with_rules
from .mesh import Mesh, shard
from .nn import field
from .trace import Builder, Value
from .transforms.linearize import Dual
from .transforms.simplify import simplify

__all__ = [
    "SYNTHETIC_ID",
    "SymbolicZero",
    "AccyError",
    "AxisError",
    "Builder",
    "CheckpointError",
    "CompileError",
    "CompiledProgram",
    "CustomCall",
    "CustomVJPPrimal",
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
    "Lowered",
    "Mesh",
    "MeshError",
    "NamedArray",
    "NonArrayLeaf",
    "NonFiniteValue",
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
    "allclose",
    "arange",
    "associative_scan",
    "backends",
    "bf16",
    "block_until_ready",
    "bool_",
    "caches",
    "checkpoint",
    "checkpoint_name",
    "checkpoint_policies",
    "clear_caches",
    "clip",
    "closure_convert",
    "compile",
    "cond",
    "config",
    "core",
    "custom",
    "custom_gradient",
    "custom_jvp",
    "custom_vjp",
    "custom_vjp_primal_tree_values",
    "custom_vmap",
    "debug_print",
    "default_device",
    "device",
    "devices",
    "eliminate_axes",
    "errors",
    "eval_shape",
    "f16",
    "f32",
    "f64",
    "fwd_and_bwd",
    "field",
    "fori_loop",
    "from_dlpack",
    "frontend",
    "grad",
    "grad_with",
    "grad_with_rules",
    "gradient",
    "hessian",
    "i32",
    "i64",
    "interpret",
    "isclose",
    "jacfwd",
    "jacrev",
    "disable_jit",
    "jit",
    "jvp",
    "kernel",
    "linear_transpose",
    "linearize",
    "load",
    "lower",
    "make_program",
    "map",
    "mesh",
    "models",
    "named",
    "no_execution",
    "no_tracing",
    "nn",
    "optim",
    "random",
    "rearrange",
    "rearrange_for_partial_order",
    "reference",
    "remat",
    "replace_axis",
    "run",
    "save",
    "scan",
    "sequential_vmap",
    "shard",
    "simplify",
    "spec",
    "stop_gradient",
    "switch",
    "testing",
    "trace",
    "transforms",
    "u8",
    "value_and_grad",
    "var",
    "vjp",
    "vmap",
    "where",
    "while_loop",
    "without_axes",
    "zero_from_primal",
]
