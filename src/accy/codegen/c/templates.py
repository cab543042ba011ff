"""C expression templates for the elementwise kinds, by operation and dtype family.

A row maps a dtype family (`float`, `signed`, `unsigned`, `bool`, or `*` for any) to a template
whose `{x}`, `{a}`, `{b}` are operands (C names or literals, never expressions with side
effects) and whose `{f}` is the math-function suffix of the compute type. Each template is the
reference evaluator's NumPy semantics written in C: integer division truncates and gives 0 for
x/0 (and wraps for MIN/-1), max and min propagate NaN, float-to-integer conversion truncates,
sends NaN to 0 and saturates.
"""

from __future__ import annotations

from ...errors import AccyError
from .types import CType

UNARY = {
    "neg": {"*": "-{x}"},
    "exp": {"float": "exp{f}({x})"},
    "log": {"float": "log{f}({x})"},
    "log1p": {"float": "log1p{f}({x})"},
    "expm1": {"float": "expm1{f}({x})"},
    "sin": {"float": "sin{f}({x})"},
    "cos": {"float": "cos{f}({x})"},
    "tan": {"float": "tan{f}({x})"},
    "tanh": {"float": "tanh{f}({x})"},
    "logistic": {"float": "accy_cpu_logistic{f}({x})"},
    "sqrt": {"float": "sqrt{f}({x})"},
    "rsqrt": {"float": "1 / sqrt{f}({x})"},
    "abs": {"float": "fabs{f}({x})", "signed": "({x} < 0 ? -{x} : {x})", "unsigned": "{x}"},
    "sign": {
        "float": "({x} > 0 ? 1 : {x} < 0 ? -1 : {x})",
        "signed": "(({x} > 0) - ({x} < 0))",
        "unsigned": "({x} > 0)",
    },
    "floor": {"float": "floor{f}({x})"},
    "ceil": {"float": "ceil{f}({x})"},
    "round": {"float": "rint{f}({x})"},  # halves to even in the default rounding mode
    "not": {"bool": "!{x}"},
    "stop_gradient": {"*": "{x}"},
}

BINARY = {
    "add": {"*": "{a} + {b}"},
    "sub": {"*": "{a} - {b}"},
    "mul": {"*": "{a} * {b}"},
    "div": {
        "float": "{a} / {b}",
        "signed": "({b} == 0 ? 0 : {b} == -1 ? -{a} : {a} / {b})",
        "unsigned": "({b} == 0 ? 0 : {a} / {b})",
    },
    "pow": {"float": "pow{f}({a}, {b})"},
    "max": {"float": "({a} > {b} || {a} != {a} ? {a} : {b})", "*": "({a} > {b} ? {a} : {b})"},
    "min": {"float": "({a} < {b} || {a} != {a} ? {a} : {b})", "*": "({a} < {b} ? {a} : {b})"},
}

COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}

REDUCERS = {"sum": "add", "prod": "mul", "max": "max", "min": "min"}


def _pick(table: dict, name: str, ctype: CType, what: str) -> str:
    row = table[name]
    template = row.get(ctype.family, row.get("*"))
    if template is None:
        raise AccyError(f"internal: no C template for {what} {name} on {ctype.family} values")
    return template


def unary(name: str, ctype: CType, x: str) -> str:
    """The C expression of unary `name` on `x`.

    >>> from accy import f32, i32
    >>> from accy.codegen.c.types import c_type
    >>> unary("exp", c_type(f32), "t0"), unary("abs", c_type(i32), "t0")
    ('expf(t0)', '(t0 < 0 ? -t0 : t0)')
    """
    return _pick(UNARY, name, ctype, "unary").format(x=x, f=ctype.suffix)


def binary(name: str, ctype: CType, a: str, b: str) -> str:
    """The C expression of binary kind `name` on `a` and `b`."""
    return _pick(BINARY, name, ctype, "binary").format(a=a, b=b, f=ctype.suffix)


def compare(direction: str, a: str, b: str) -> str:
    """The C comparison of `a` and `b` in `direction` (eq, ne, lt, le, gt, ge)."""
    return f"{a} {COMPARE[direction]} {b}"


def convert(x: str, source: CType, target: CType, bounds: tuple[str, str] | None) -> str:
    """Convert `x` from `source` to `target` compute values; `bounds` are the target's integer
    range as C literals (used when a float becomes an integer)."""
    if target.family == "bool":
        return f"{x} != 0"
    if source.family == "float" and target.family in ("signed", "unsigned"):
        low, high = bounds
        return f"ACCY_CPU_SATURATE({x}, {low}, {high}, {target.compute})"
    if target.storage == "_Float16":
        # Straight to half precision: a detour through float would round twice.
        return f"(_Float16)({x})"
    if target.storage == "uint16_t" and source.compute == "double":
        return f"(float)({x})"
    return f"({target.compute})({x})"
