"""The core of accy, below everything else: types, the IR, the kind table, the builder, the text.

Modules import in this order and never upward: `types` (dtypes, `TensorType`) → `ir`
(immutable records and their printed form) → `kinds` (each kind's rules) → `walk` (visiting a
program) → `operations` (the named-axis operation library) → `value` and `builder` (the one
type-checked emission) → `text` (the parser). Tracing, transformations, interpreters and the
parser all build programs through `builder`.
"""

from .builder import Builder, check_operation
from .ir import SYNTHETIC_ID, Attrs, Operation, Program, format_program
from .kinds import RULES, Linear, Rule, Zero, rule_for
from .operations import OpsApi, axis_tuple
from .text import parse
from .types import DType, TensorType, bf16, bool_, f16, f32, f64, i32, i64, spec, u8
from .value import Value

__all__ = [
    "RULES",
    "SYNTHETIC_ID",
    "Attrs",
    "Builder",
    "DType",
    "Linear",
    "Operation",
    "OpsApi",
    "Program",
    "Rule",
    "TensorType",
    "Value",
    "Zero",
    "axis_tuple",
    "bf16",
    "bool_",
    "check_operation",
    "f16",
    "f32",
    "f64",
    "format_program",
    "i32",
    "i64",
    "parse",
    "rule_for",
    "spec",
    "u8",
]
