"""accy: a named-axis tensor compiler with automatic differentiation.

>>> import accy
>>> loss = accy.trace.define(
...     "loss", [accy.spec(accy.f32, lane=4)] * 2, lambda b, a: (a[0] * a[1]).sum("lane"))
>>> print(loss.count("mul"))
1
"""

from . import errors, interpret, ops, program, reference, trace
from .errors import (
    AccyError,
    AxisError,
    CompileError,
    CustomCallRequiresJvpContract,
    CustomCallRequiresVjpContract,
    DTypeError,
    GradientRequiresScalarOutput,
    InvalidInput,
    NotDifferentiable,
    ParseError,
    RuntimeUnavailable,
    TypeRuleError,
)
from .program import SYNTHETIC_ID, Operation, Program
from .trace import Builder, Value
from .types import DType, TensorType, bf16, bool_, f16, f32, f64, i32, i64, spec, u8

__all__ = [
    "SYNTHETIC_ID",
    "AccyError",
    "AxisError",
    "Builder",
    "CompileError",
    "CustomCallRequiresJvpContract",
    "CustomCallRequiresVjpContract",
    "DType",
    "DTypeError",
    "GradientRequiresScalarOutput",
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
    "errors",
    "f16",
    "f32",
    "f64",
    "i32",
    "i64",
    "interpret",
    "ops",
    "program",
    "reference",
    "spec",
    "trace",
    "u8",
]
