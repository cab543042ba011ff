"""The kernel DSL's closed set of elementwise ops: which dtypes each takes, its type rule, and
its C (and CUDA C), which is the shared dialect's (`accy.codegen.c.templates`).

Semantics follow accy's reference evaluator (NumPy): integer arithmetic wraps, integer division
truncates and gives 0 for a zero divisor, max/min propagate NaN, round goes half to even, and
f16/bf16 results are rounded after every op. Operands are always variables, so a template may
read one more than once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..codegen.c import templates
from ..codegen.c.dialect import GCC, Dialect
from ..codegen.c.literals import highest, literal, lowest
from ..core.types import DType, bool_
from .errors import KernelError

FLOAT = ("float",)
SIGNED = ("signed",)
UNSIGNED = ("unsigned",)
INTEGER = SIGNED + UNSIGNED
BOOL = ("bool",)
NUMBER = FLOAT + INTEGER
ANY = NUMBER + BOOL


@dataclass(frozen=True)
class ElementOp:
    """One op: the dtype families it takes and its signature (see `SIGNATURES`)."""

    families: tuple[str, ...]
    signature: str  # "unary", "binary", "compare" or "select"


BINARY = {
    "add": ElementOp(NUMBER, "binary"),
    "sub": ElementOp(NUMBER, "binary"),
    "mul": ElementOp(NUMBER, "binary"),
    "div": ElementOp(NUMBER, "binary"),
    "pow": ElementOp(FLOAT, "binary"),
    "max": ElementOp(ANY, "binary"),
    "min": ElementOp(ANY, "binary"),
}

_FLOAT_UNARY = (
    "exp", "log", "log1p", "expm1", "sin", "cos", "tan", "tanh", "logistic", "sqrt", "rsqrt",
    "floor", "ceil", "round",
)  # fmt: skip
UNARY = {
    "neg": ElementOp(NUMBER, "unary"),
    "abs": ElementOp(NUMBER, "unary"),
    "sign": ElementOp(NUMBER, "unary"),
    **{name: ElementOp(FLOAT, "unary") for name in _FLOAT_UNARY},
    "not": ElementOp(BOOL, "unary"),
}

COMPARE = {name: ElementOp(ANY, "compare") for name in templates.COMPARE}

SELECT = {"select": ElementOp(ANY, "select")}

OPS: dict[str, ElementOp] = {**BINARY, **UNARY, **COMPARE, **SELECT}


def check_dtype(dtype: object) -> None:
    """Reject anything that is not one of accy's dtypes.

    >>> check_dtype("float")
    Traceback (most recent call last):
    ...
    accy.kernel.errors.KernelError: dtype 'float' has no kernel representation; use one of f32, f64, f16, bf16, i32, i64, u8, bool
    """  # noqa: E501
    if dtype not in GCC.types:
        names = ", ".join(d.name for d in GCC.types)
        raise KernelError(f"dtype {dtype!r} has no kernel representation; use one of {names}")


def check_representable(value: float | int | bool, dtype: DType) -> None:
    """Reject constants that would silently change: 0.5 as an int, 300 as a u8, 2 as a bool.

    >>> import accy
    >>> check_representable(300, accy.u8)
    Traceback (most recent call last):
    ...
    accy.kernel.errors.KernelError: constant 300 is outside the range of u8 [0, 255]
    """
    if not isinstance(value, int | float | bool | np.number | np.bool_):
        raise KernelError(f"a kernel constant must be a Python number, got {value!r}")
    if dtype.is_float:
        return
    if isinstance(value, float | np.floating) and not float(value).is_integer():
        raise KernelError(f"constant {value!r} is not an integer, so it cannot be a {dtype.name}")
    info = (0, 1) if dtype == bool_ else np.iinfo(dtype.numpy)
    low, high = (0, 1) if dtype == bool_ else (info.min, info.max)
    if not low <= int(value) <= high:
        raise KernelError(
            f"constant {value!r} is outside the range of {dtype.name} [{low}, {high}]"
        )


def constant(value: float | int | bool, dtype: DType) -> str:
    """A C literal of `dtype`'s compute type holding `value` (rounded to `dtype` first).

    >>> import accy
    >>> constant(0.5, accy.f32)
    '0.5f'
    """
    check_representable(value, dtype)
    return literal(value, dtype)


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
    if not applies(name, family_dtype):
        accepted = ", ".join(d.name for d in GCC.types if applies(name, d))
        raise KernelError(
            f"kernel {kernel!r}: {name} does not apply to {family_dtype.name} values; it takes "
            f"{accepted} (convert with value.cast(inner, dtype) first)"
        )
    return result


def applies(name: str, dtype: DType) -> bool:
    """Whether op `name` takes operands of `dtype`.

    >>> import accy
    >>> applies("add", accy.bool_), applies("max", accy.bool_)
    (False, True)
    """
    return GCC.c_type(dtype).family in OPS[name].families


def operation(kernel: str, name: str) -> ElementOp:
    """The row of op `name`, or a KernelError listing the ops.

    >>> operation("k", "add").signature
    'binary'
    """
    if name not in OPS:
        raise KernelError(f"kernel {kernel!r}: unknown op {name!r}; the ops are {', '.join(OPS)}")
    return OPS[name]


def render(
    name: str,
    operands: tuple[str, ...],
    dtypes: tuple[DType, ...],
    result: DType,
    dialect: Dialect = GCC,
) -> str:
    """The C expression of an op whose type `result_dtype` has already accepted.

    >>> import accy
    >>> render("add", ("v1", "v2"), (accy.i32, accy.i32), accy.i32)
    '(int32_t)((uint32_t)v1 + (uint32_t)v2)'
    >>> render("mul", ("v1", "v2"), (accy.f16, accy.f16), accy.f16)
    'accy_round_f16(v1 * v2)'
    """
    ctype = dialect.c_type(dtypes[-1])  # select's predicate comes first; the others share one
    signature = OPS[name].signature
    if signature == "compare":
        return templates.compare(name, *operands)
    if signature == "select":
        text = templates.select(*operands)
    elif signature == "unary":
        text = templates.unary(name, ctype, *operands)
    else:
        text = templates.binary(name, ctype, *operands)
    return dialect.c_type(result).round.format(x=text)


def render_cast(operand: str, source: DType, target: DType, dialect: Dialect = GCC) -> str:
    """The C expression converting `operand` from `source` to `target`, as NumPy's astype.

    >>> import accy
    >>> render_cast("v1", accy.f32, accy.i32)
    'ACCY_SATURATE(v1, (-2147483648), 2147483647, int32_t)'
    >>> render_cast("v1", accy.i32, accy.f64)
    '(double)(v1)'
    """
    if source == target:
        return operand
    c_source, c_target = dialect.c_type(source), dialect.c_type(target)
    text = templates.convert(operand, c_source, c_target, templates.bounds(target))
    return c_target.round.format(x=text)


# ---------------------------------------------------------------------------------------------
# reductions: combine op -> identity


COMBINES: dict[str, Callable[[DType], str]] = {
    "add": lambda dtype: literal(0, dtype),
    "mul": lambda dtype: literal(1, dtype),
    "max": lowest,
    "min": highest,
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
    ('(-INFINITY)', '255')
    """
    return COMBINES[combine](dtype)


def render_combine(
    combine: str, accumulator: str, term: str, dtype: DType, dialect: Dialect = GCC
) -> str:
    """One reduction step, at the compute type's precision (f16 sums round once, at the end).

    >>> import accy
    >>> render_combine("add", "v3", "v7", accy.f16)
    'v3 + v7'
    """
    return templates.binary(combine, dialect.c_type(dtype), accumulator, term)
