"""accy: a named-axis tensor compiler with automatic differentiation.

>>> import accy
>>> loss = accy.trace.define(
...     "loss", [accy.spec(accy.f32, lane=4)] * 2, lambda b, a: (a[0] * a[1]).sum("lane"))
>>> print(loss.count("mul"))
1
"""

from . import (
    core,
    custom,
    errors,
    gradient,
    interpret,
    nn,
    optim,
    random,
    reference,
    testing,
    trace,
    transforms,
)
from .config import config  # the settings object (module: accy.config)
from .core import SYNTHETIC_ID, Operation, Program
from .core.types import DType, TensorType, bf16, bool_, f16, f32, f64, i32, i64, spec, u8
from .custom import CustomCall
from .errors import (
    AccyError,
    AxisError,
    CompileError,
    CustomCallConflict,
    CustomCallError,
    CustomCallRequiresJvpContract,
    CustomCallRequiresVjpContract,
    DonationError,
    DTypeError,
    GradientRequiresScalarOutput,
    InvalidInput,
    NotDifferentiable,
    ParseError,
    RuntimeUnavailable,
    TypeRuleError,
)
from .gradient import (
    checkpoint,
    grad,
    grad_with,
    grad_with_rules,
    jvp,
    linear_transpose,
    linearize,
    value_and_grad,
    vjp,
)
from .trace import Builder, Value
from .transforms.linearize import Dual
from .transforms.simplify import simplify

__all__ = [
    "SYNTHETIC_ID",
    "AccyError",
    "AxisError",
    "Builder",
    "CompileError",
    "CustomCall",
    "CustomCallConflict",
    "CustomCallError",
    "CustomCallRequiresJvpContract",
    "CustomCallRequiresVjpContract",
    "DType",
    "Dual",
    "DTypeError",
    "GradientRequiresScalarOutput",
    "DonationError",
    "InvalidInput",
    "NotDifferentiable",
    "Operation",
    "ParseError",
    "Program",
    "RuntimeUnavailable",
    "TensorType",
    "TypeRuleError",
    "Value",
    "bf16",
    "bool_",
    "core",
    "custom",
    "errors",
    "f16",
    "f32",
    "f64",
    "grad",
    "grad_with",
    "grad_with_rules",
    "checkpoint",
    "config",
    "gradient",
    "i32",
    "i64",
    "interpret",
    "nn",
    "jvp",
    "linear_transpose",
    "linearize",
    "optim",
    "random",
    "reference",
    "simplify",
    "spec",
    "testing",
    "trace",
    "transforms",
    "u8",
    "value_and_grad",
    "vjp",
]

# The backends and the one way to run a program; older execution names over it (compat).
from . import backends, compat, executable, execute, gpu, lower  # noqa: E402
from .api import CompiledProgram, compile, run  # noqa: E402

__all__ += [
    "CompiledProgram",
    "backends",
    "compat",
    "compile",
    "executable",
    "execute",
    "gpu",
    "lower",
    "run",
]

# The kernel language of custom-call kernels.
from . import kernel  # noqa: E402

__all__ += ["kernel"]

# The Python-first front end: named arrays and function transforms over trees. The
# transforms take a Program too, and then are exactly `accy.gradient`'s.
from . import frontend  # noqa: E402
from .frontend import (  # noqa: E402
    DeviceMismatch,
    NamedArray,
    NonArrayLeaf,
    StaticArgumentError,
    TransformError,
    jit,
    named,
    vmap,
)
from .frontend.functions import (  # noqa: E402, F811
    grad,
    jvp,
    linearize,
    value_and_grad,
    vjp,
)

__all__ += [
    "DeviceMismatch",
    "NamedArray",
    "NonArrayLeaf",
    "StaticArgumentError",
    "TransformError",
    "frontend",
    "jit",
    "named",
    "vmap",
]

# Several devices (issue 21): a named device mesh, the SPMD transform, collectives.
from . import mesh  # noqa: E402
from .errors import MeshError  # noqa: E402
from .mesh import Mesh, shard  # noqa: E402

__all__ += ["Mesh", "MeshError", "mesh", "shard"]

# Function transforms, inspection and array functions of the front end, with their JAX names.
from .frontend.array_functions import allclose, arange, clip, isclose, var, where  # noqa: E402
from .frontend.axes import (  # noqa: E402
    eliminate_axes,
    rearrange,
    rearrange_for_partial_order,
    replace_axis,
    without_axes,
)
from .frontend.custom_rules import custom_jvp, custom_vjp  # noqa: E402
from .frontend.dlpack import from_dlpack  # noqa: E402
from .frontend.errors import NonFiniteValue  # noqa: E402
from .frontend.inspection import Lowered, make_program  # noqa: E402
from .frontend.jacobians import hessian, jacfwd, jacrev  # noqa: E402
from .frontend.printing import debug_print  # noqa: E402
from .frontend.regions import checkpoint, checkpoint_policies, remat, stop_gradient  # noqa: E402, F811
from .frontend.transpose import linear_transpose  # noqa: E402, F811

__all__ += [
    "Lowered",
    "NonFiniteValue",
    "allclose",
    "arange",
    "checkpoint_policies",
    "clip",
    "custom_jvp",
    "custom_vjp",
    "debug_print",
    "eliminate_axes",
    "from_dlpack",
    "hessian",
    "isclose",
    "jacfwd",
    "jacrev",
    "make_program",
    "rearrange",
    "rearrange_for_partial_order",
    "remat",
    "replace_axis",
    "stop_gradient",
    "var",
    "where",
    "without_axes",
]
