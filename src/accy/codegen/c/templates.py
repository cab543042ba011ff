"""C expression templates for the elementwise kinds, by operation and dtype family.

A row maps a dtype family (`float`, `signed`, `unsigned`, `bool`, or `*` for any) to a template
whose `{x}`, `{a}`, `{b}` are operands (C names or literals, never expressions with side
effects), `{f}` the math-function suffix of the compute type, `{c}` the compute type and `{u}`
the unsigned type of a signed integer's width. Each template is the reference evaluator's NumPy
semantics written in C without undefined behaviour: signed integers wrap (their arithmetic is
done in the unsigned type, where C defines overflow), integer division truncates and gives 0 for
x/0 (and wraps for MIN/-1), max and min propagate NaN, float-to-integer conversion truncates,
sends NaN to 0 and saturates.
"""

from __future__ import annotations

from ...core.types import DType, bool_
from ...errors import AccyError
from .literals import highest, lowest
from .types import CType


def _wrapping(symbol: str) -> str:
    return f"({{c}})(({{u}}){{a}} {symbol} ({{u}}){{b}})"


_WRAPPING_NEG = "({c})(({u})0 - ({u}){x})"

UNARY = {
    "neg": {"signed": _WRAPPING_NEG, "*": "-{x}"},
    "exp": {"float": "accy_exp{f}({x})"},  # the prelude's: the CPU's skips libmvec's slow lanes
    "log": {"float": "log{f}({x})"},
    "log1p": {"float": "log1p{f}({x})"},
    "expm1": {"float": "expm1{f}({x})"},
    "sin": {"float": "sin{f}({x})"},
    "cos": {"float": "cos{f}({x})"},
    "tan": {"float": "tan{f}({x})"},
    "tanh": {"float": "tanh{f}({x})"},
    "logistic": {"float": "accy_logistic{f}({x})"},
    "gelu_tanh": {"float": "accy_gelu_tanh{f}({x})"},
    "gelu_tanh_slope": {"float": "accy_gelu_tanh_slope{f}({x})"},
    "sqrt": {"float": "sqrt{f}({x})"},
    "rsqrt": {"float": "1 / sqrt{f}({x})"},
    "abs": {
        "float": "fabs{f}({x})",
        "signed": f"({{x}} < 0 ? {_WRAPPING_NEG} : {{x}})",
        "unsigned": "{x}",
    },
    "sign": {
        "float": "({x} > 0 ? 1 : {x} < 0 ? -1 : {x})",
        "signed": "(({x} > 0) - ({x} < 0))",
        "unsigned": "({x} > 0)",
    },
    "floor": {"float": "floor{f}({x})"},
    "ceil": {"float": "ceil{f}({x})"},
    "round": {"float": "rint{f}({x})"},  # halves to even in the default rounding mode
    "not": {"bool": "!{x}", "*": "({c})~{x}"},
    "stop_gradient": {"*": "{x}"},
    "asin": {"float": "asin{f}({x})"},
    "acos": {"float": "acos{f}({x})"},
    "atan": {"float": "atan{f}({x})"},
    "sinh": {"float": "sinh{f}({x})"},
    "cosh": {"float": "cosh{f}({x})"},
    "asinh": {"float": "asinh{f}({x})"},
    "acosh": {"float": "acosh{f}({x})"},
    "atanh": {"float": "atanh{f}({x})"},
    "erf": {"float": "erf{f}({x})"},
    "erfc": {"float": "erfc{f}({x})"},
    # Computed in double and rounded, as the reference does (accy.core.kinds.special).
    "lgamma": {"float": "({c})lgamma((double){x})"},
    "erf_inv": {"float": "({c})accy_erf_inv((double){x})"},
    "digamma": {"float": "({c})accy_digamma((double){x})"},
    "trigamma": {"float": "({c})accy_trigamma((double){x})"},
}

# The width in bits of the compute type, for shifts (a shift by the width or more is defined).
_BITS = "8 * sizeof({c})"

BINARY = {
    "add": {"signed": _wrapping("+"), "*": "{a} + {b}"},
    "sub": {"signed": _wrapping("-"), "*": "{a} - {b}"},
    "mul": {"signed": _wrapping("*"), "*": "{a} * {b}"},
    "div": {
        "float": "{a} / {b}",
        "signed": "({b} == 0 ? 0 : {b} == -1 ? ({c})(({u})0 - ({u}){a}) : {a} / {b})",
        "unsigned": "({b} == 0 ? 0 : {a} / {b})",
    },
    "pow": {"float": "pow{f}({a}, {b})"},
    "max": {"float": "({a} > {b} || {a} != {a} ? {a} : {b})", "*": "({a} > {b} ? {a} : {b})"},
    "min": {"float": "({a} < {b} || {a} != {a} ? {a} : {b})", "*": "({a} < {b} ? {a} : {b})"},
    "atan2": {"float": "atan2{f}({a}, {b})"},
    "copysign": {"float": "copysign{f}({a}, {b})"},
    "rem": {
        "float": "fmod{f}({a}, {b})",
        "signed": "({b} == 0 || {b} == -1 ? 0 : {a} % {b})",
        "unsigned": "({b} == 0 ? 0 : {a} % {b})",
    },
    "and": {"*": "({a} & {b})"},
    "or": {"*": "({a} | {b})"},
    "xor": {"*": "({a} ^ {b})"},
    "shift_left": {
        "signed": f"(({{u}}){{b}} >= {_BITS} ? ({{c}})0 : ({{c}})(({{u}}){{a}} << {{b}}))",
        "unsigned": f"({{b}} >= {_BITS} ? ({{c}})0 : ({{c}})({{a}} << {{b}}))",
    },
    "shift_right_logical": {
        "signed": f"(({{u}}){{b}} >= {_BITS} ? ({{c}})0 : ({{c}})(({{u}}){{a}} >> {{b}}))",
        "unsigned": f"({{b}} >= {_BITS} ? ({{c}})0 : ({{c}})({{a}} >> {{b}}))",
    },
    # >> of a negative signed value is arithmetic on gcc, clang and nvcc (C23 defines it so).
    "shift_right_arithmetic": {
        "signed": f"({{a}} >> (({{u}}){{b}} >= {_BITS} ? {_BITS} - 1 : {{b}}))",
        "unsigned": f"({{b}} >= {_BITS} ? ({{c}})0 : ({{c}})({{a}} >> {{b}}))",
    },
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
    >>> from accy.codegen.c.dialect import GCC
    >>> unary("exp", GCC.c_type(f32), "t0"), unary("abs", GCC.c_type(i32), "t0")
    ('accy_expf(t0)', '(t0 < 0 ? (int32_t)((uint32_t)0 - (uint32_t)t0) : t0)')
    """
    template = _pick(UNARY, name, ctype, "unary")
    return template.format(x=x, f=ctype.suffix, c=ctype.compute, u=ctype.unsigned)


def binary(name: str, ctype: CType, a: str, b: str) -> str:
    """The C expression of binary kind `name` on `a` and `b`."""
    template = _pick(BINARY, name, ctype, "binary")
    return template.format(a=a, b=b, f=ctype.suffix, c=ctype.compute, u=ctype.unsigned)


def compare(direction: str, a: str, b: str) -> str:
    """The C comparison of `a` and `b` in `direction` (eq, ne, lt, le, gt, ge)."""
    return f"{a} {COMPARE[direction]} {b}"


def select(p: str, a: str, b: str) -> str:
    """`a` where `p` holds, else `b`."""
    return f"{p} ? {a} : {b}"


def bounds(dtype: DType) -> tuple[str, str] | None:
    """An integer dtype's range as C literals (what a float converted to it saturates at).

    >>> from accy import f32, u8
    >>> bounds(u8), bounds(f32)
    (('0', '255'), None)
    """
    if dtype.is_float or dtype == bool_:
        return None
    return lowest(dtype), highest(dtype)


def convert(x: str, source: CType, target: CType, bounds: tuple[str, str] | None) -> str:
    """Convert `x` from `source` to `target` compute values; `bounds` are the target's integer
    range as C literals (used when a float becomes an integer)."""
    if target.family == "bool":
        return f"{x} != 0"
    if source.family == "float" and target.family in ("signed", "unsigned"):
        low, high = bounds
        return f"ACCY_SATURATE({x}, {low}, {high}, {target.compute})"
    return (target.convert or f"({target.compute})({{x}})").format(x=x)


# bitcast_convert between dtypes of one width, by (source, target) dtype names.
BITCAST = {
    ("f32", "i32"): "(int32_t)accy_float_bits({x})",
    ("i32", "f32"): "accy_float_from_bits((uint32_t){x})",
    ("f64", "i64"): "(int64_t)accy_double_bits({x})",
    ("i64", "f64"): "accy_double_from_bits((uint64_t){x})",
}


def bitcast(x: str, source: DType, target: DType) -> str:
    """`x`'s bits reinterpreted from `source` to `target` (of the same width).

    >>> from accy import f32, i32
    >>> bitcast("t0", f32, i32)
    '(int32_t)accy_float_bits(t0)'
    """
    if source == target:
        return x
    return BITCAST[(source.name, target.name)].format(x=x)


def precedes(family: str, descending: bool, a: str, b: str) -> str:
    """Whether `a` sorts strictly before `b` (the kind sort's order): smaller first (larger when
    `descending`); NaN after every number (before, when descending), as NumPy.

    >>> precedes("signed", False, "x", "y")
    '(x < y)'
    """
    if family != "float":
        return f"({a} {'>' if descending else '<'} {b})"
    if descending:
        return f"({a} > {b} || ({a} != {a} && {b} == {b}))"
    return f"({a} < {b} || ({b} != {b} && {a} == {a}))"
