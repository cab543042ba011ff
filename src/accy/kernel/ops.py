"""The kernel DSL's closed set of elementwise ops, each a row: C template per family, type rule.

A template is C (and CUDA C: they share every expression) with the operands as `{a}`, `{b}`
(and the predicate of select as `{p}`), and these dtype fields: `{c}` the compute type, `{u}` the
unsigned type of the same width, `{f}` the math suffix (`expf` / `exp`), `{n}` the dtype name.
Operands are always variables, so a template may read one more than once.

Semantics follow accy's reference evaluator (NumPy): integer arithmetic wraps (done in unsigned
types, where C defines overflow), integer division truncates and gives 0 for a zero divisor,
max/min propagate NaN, round goes half to even.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..core.types import DType, bool_
from .dtypes import C_TYPES, c_type, literal
from .errors import KernelError

FLOAT = ("f32", "f64")
SIGNED = ("signed",)
UNSIGNED = ("unsigned",)
INTEGER = SIGNED + UNSIGNED
BOOL = ("bool",)
NUMBER = FLOAT + INTEGER
ANY = NUMBER + BOOL


@dataclass(frozen=True)
class ElementOp:
    """One op: its templates by operand family and its signature (see `SIGNATURES`)."""

    templates: dict[str, str]
    signature: str  # "unary", "binary", "compare" or "select"


def _op(signature: str, groups: dict[tuple[str, ...], str]) -> ElementOp:
    templates = {family: text for families, text in groups.items() for family in families}
    return ElementOp(templates, signature)


def _wrapping(symbol: str) -> str:
    # Signed overflow is undefined in C; unsigned arithmetic wraps, and converting back is
    # modular on every compiler accy targets (and defined from C++20).
    return f"({{c}})(({{u}}){{a}} {symbol} ({{u}}){{b}})"


_NAN_AWARE_MAX = "({a} != {a} || {a} > {b} ? {a} : {b})"
_NAN_AWARE_MIN = "({a} != {a} || {a} < {b} ? {a} : {b})"

BINARY = {
    "add": _op("binary", {FLOAT: "({a} + {b})", INTEGER: _wrapping("+")}),
    "sub": _op("binary", {FLOAT: "({a} - {b})", INTEGER: _wrapping("-")}),
    "mul": _op("binary", {FLOAT: "({a} * {b})", INTEGER: _wrapping("*")}),
    "div": _op("binary", {FLOAT: "({a} / {b})", INTEGER: "accy_div_{n}({a}, {b})"}),
    "pow": _op("binary", {FLOAT: "pow{f}({a}, {b})"}),
    "max": _op(
        "binary", {FLOAT: _NAN_AWARE_MAX, INTEGER: "({a} > {b} ? {a} : {b})", BOOL: "({a} | {b})"}
    ),
    "min": _op(
        "binary", {FLOAT: _NAN_AWARE_MIN, INTEGER: "({a} < {b} ? {a} : {b})", BOOL: "({a} & {b})"}
    ),
}

_WRAPPING_NEG = "({c})(({u})0 - ({u}){a})"

UNARY = {
    "neg": _op("unary", {FLOAT: "(-{a})", INTEGER: _WRAPPING_NEG}),
    "abs": _op(
        "unary",
        {FLOAT: "fabs{f}({a})", SIGNED: f"({{a}} < 0 ? {_WRAPPING_NEG} : {{a}})", UNSIGNED: "{a}"},
    ),
    "sign": _op(
        "unary",
        {
            # NaN and signed zeros come back unchanged, as NumPy's sign gives them.
            FLOAT: "({a} > 0 ? ({c})1 : ({a} < 0 ? ({c})-1 : {a}))",
            SIGNED: "({c})(({a} > 0) - ({a} < 0))",
            UNSIGNED: "({c})({a} > 0)",
        },
    ),
    "exp": _op("unary", {FLOAT: "exp{f}({a})"}),
    "log": _op("unary", {FLOAT: "log{f}({a})"}),
    "log1p": _op("unary", {FLOAT: "log1p{f}({a})"}),
    "expm1": _op("unary", {FLOAT: "expm1{f}({a})"}),
    "sin": _op("unary", {FLOAT: "sin{f}({a})"}),
    "cos": _op("unary", {FLOAT: "cos{f}({a})"}),
    "tan": _op("unary", {FLOAT: "tan{f}({a})"}),
    "tanh": _op("unary", {FLOAT: "tanh{f}({a})"}),
    "logistic": _op("unary", {FLOAT: "accy_logistic{f}({a})"}),
    "sqrt": _op("unary", {FLOAT: "sqrt{f}({a})"}),
    "rsqrt": _op("unary", {FLOAT: "(({c})1 / sqrt{f}({a}))"}),
    "floor": _op("unary", {FLOAT: "floor{f}({a})"}),
    "ceil": _op("unary", {FLOAT: "ceil{f}({a})"}),
    # rint rounds in the default mode, half to even, as NumPy's round does.
    "round": _op("unary", {FLOAT: "rint{f}({a})"}),
    "not": _op("unary", {BOOL: "(unsigned char)!{a}"}),
}

COMPARE = {
    name: _op("compare", {ANY: f"(unsigned char)({{a}} {symbol} {{b}})"})
    for name, symbol in {
        "eq": "==",
        "ne": "!=",
        "lt": "<",
        "le": "<=",
        "gt": ">",
        "ge": ">=",
    }.items()
}

SELECT = {"select": _op("select", {ANY: "({p} ? {a} : {b})"})}

OPS: dict[str, ElementOp] = {**BINARY, **UNARY, **COMPARE, **SELECT}


# ---------------------------------------------------------------------------------------------
# type rules: operand dtypes -> result dtype, by signature


def _same_dtype(kernel: str, name: str, dtypes: tuple[DType, ...]) -> DType:
    if len(set(dtypes)) != 1:
        shown = ", ".join(d.name for d in dtypes)
        raise KernelError(
            f"kernel {kernel!r}: {name} needs operands of one dtype, got {shown}; convert one "
            f"with value.cast(inner, dtype)"
        )
    return dtypes[0]


def _unary_rule(kernel: str, name: str, dtypes: tuple[DType, ...]) -> tuple[DType, DType]:
    return dtypes[0], dtypes[0]


def _binary_rule(kernel: str, name: str, dtypes: tuple[DType, ...]) -> tuple[DType, DType]:
    dtype = _same_dtype(kernel, name, dtypes)
    return dtype, dtype


def _compare_rule(kernel: str, name: str, dtypes: tuple[DType, ...]) -> tuple[DType, DType]:
    return _same_dtype(kernel, name, dtypes), bool_


def _select_rule(kernel: str, name: str, dtypes: tuple[DType, ...]) -> tuple[DType, DType]:
    if dtypes[0] != bool_:
        raise KernelError(f"kernel {kernel!r}: select needs a bool condition, got {dtypes[0].name}")
    dtype = _same_dtype(kernel, name, dtypes[1:])
    return dtype, dtype


@dataclass(frozen=True)
class Signature:
    """How many operands, their names in templates, and the rule giving (family dtype, result)."""

    operands: tuple[str, ...]
    rule: Callable[[str, str, tuple[DType, ...]], tuple[DType, DType]]


SIGNATURES = {
    "unary": Signature(("a",), _unary_rule),
    "binary": Signature(("a", "b"), _binary_rule),
    "compare": Signature(("a", "b"), _compare_rule),
    "select": Signature(("p", "a", "b"), _select_rule),
}


def result_dtype(kernel: str, name: str, dtypes: tuple[DType, ...]) -> DType:
    """The dtype of `name(operands...)`, or a KernelError saying why the op does not apply.

    >>> import accy
    >>> result_dtype("k", "lt", (accy.f32, accy.f32))
    accy.bool
    >>> result_dtype("k", "exp", (accy.i32,))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    accy.kernel.errors.KernelError: kernel 'k': exp does not apply to i32 values; it takes f32, ...
    """
    op = operation(kernel, name)
    signature = SIGNATURES[op.signature]
    if len(dtypes) != len(signature.operands):
        raise KernelError(
            f"kernel {kernel!r}: {name} takes {len(signature.operands)} operands, got {len(dtypes)}"
        )
    family_dtype, result = signature.rule(kernel, name, dtypes)
    if c_type(family_dtype).family not in op.templates:
        accepted = ", ".join(d.name for d, t in C_TYPES.items() if t.family in op.templates)
        raise KernelError(
            f"kernel {kernel!r}: {name} does not apply to {family_dtype.name} values; it takes "
            f"{accepted} (convert with value.cast(inner, dtype) first)"
        )
    return result


def operation(kernel: str, name: str) -> ElementOp:
    """The row of op `name`, or a KernelError listing the ops.

    >>> operation("k", "add").signature
    'binary'
    """
    if name not in OPS:
        raise KernelError(f"kernel {kernel!r}: unknown op {name!r}; the ops are {', '.join(OPS)}")
    return OPS[name]


def render(name: str, operands: tuple[str, ...], dtypes: tuple[DType, ...], result: DType) -> str:
    """The C expression of an op whose type `result_dtype` has already accepted.

    >>> import accy
    >>> render("add", ("v1", "v2"), (accy.i32, accy.i32), accy.i32)
    '(int)((unsigned int)v1 + (unsigned int)v2)'
    >>> render("mul", ("v1", "v2"), (accy.f16, accy.f16), accy.f16)
    'accy_round_f16((v1 * v2))'
    """
    op = OPS[name]
    signature = SIGNATURES[op.signature]
    family_dtype = dtypes[-1]  # select's predicate comes first; the others share one dtype
    text = _fill(op.templates[c_type(family_dtype).family], family_dtype, signature, operands)
    return text if result == bool_ and op.signature == "compare" else _rounded(text, result)


def _fill(template: str, dtype: DType, signature: Signature, operands: tuple[str, ...]) -> str:
    ctype = c_type(dtype)
    fields = dict(zip(signature.operands, operands, strict=True))
    return template.format(
        **fields, c=ctype.compute, u=ctype.unsigned, f=ctype.math_suffix, n=dtype.name
    )


def _rounded(text: str, dtype: DType) -> str:
    return c_type(dtype).round.format(x=text)


# ---------------------------------------------------------------------------------------------
# casts: (from family, to family) -> template; `{ff}` is the source float family


_FLOAT_TO_INT = "accy_{ff}_to_{n}({a})"  # saturating: C leaves out-of-range conversions undefined

CASTS: dict[tuple[str, str], str] = {
    **{(source, target): _FLOAT_TO_INT for source in FLOAT for target in INTEGER},
    **{(source, "bool"): "(unsigned char)({a} != 0)" for source in ANY},
}
_PLAIN_CAST = "(({c}){a})"


def render_cast(operand: str, source: DType, target: DType) -> str:
    """The C expression converting `operand` from `source` to `target`, as NumPy's astype.

    >>> import accy
    >>> render_cast("v1", accy.f32, accy.i32)
    'accy_f32_to_i32(v1)'
    >>> render_cast("v1", accy.i32, accy.f64)
    '((double)v1)'
    """
    if source == target:
        return operand
    template = CASTS.get((c_type(source).family, c_type(target).family), _PLAIN_CAST)
    text = template.format(
        a=operand, c=c_type(target).compute, n=target.name, ff=c_type(source).family
    )
    return _rounded(text, target)


# ---------------------------------------------------------------------------------------------
# reductions: combine op -> identity (a Python number, turned into a literal of the dtype)


def _lowest(dtype: DType) -> float | int:
    if dtype.is_float:
        return -np.inf
    return 0 if dtype == bool_ else int(np.iinfo(dtype.numpy).min)


def _highest(dtype: DType) -> float | int:
    if dtype.is_float:
        return np.inf
    return 1 if dtype == bool_ else int(np.iinfo(dtype.numpy).max)


COMBINES = {
    "add": lambda dtype: 0,
    "mul": lambda dtype: 1,
    "max": _lowest,
    "min": _highest,
}


def check_combine(kernel: str, combine: str, dtype: DType) -> None:
    """Reject an unknown reduction, or one the op table does not define for `dtype`.

    >>> import accy
    >>> check_combine("k", "max", accy.bool_)
    """
    if combine not in COMBINES:
        raise KernelError(
            f"kernel {kernel!r}: unknown reduction {combine!r}; use one of {', '.join(COMBINES)}"
        )
    result_dtype(kernel, combine, (dtype, dtype))


def identity(combine: str, dtype: DType) -> str:
    """The literal a reduction starts from: 0 for add, 1 for mul, the lowest value for max.

    >>> import accy
    >>> identity("max", accy.f32), identity("min", accy.u8)
    ('(-ACCY_INF_F32)', '((unsigned char)255LL)')
    """
    return literal(COMBINES[combine](dtype), dtype)


def render_combine(combine: str, accumulator: str, term: str, dtype: DType) -> str:
    """One reduction step, at the compute type's precision (f16 sums round once, at the end).

    >>> import accy
    >>> render_combine("add", "v3", "v7", accy.f16)
    '(v3 + v7)'
    """
    op = OPS[combine]
    return _fill(
        op.templates[c_type(dtype).family], dtype, SIGNATURES["binary"], (accumulator, term)
    )
