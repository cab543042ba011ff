"""Immutable IR records (`Attrs`, `Operation`, `Program`) and their canonical text form.

Values are numbered in the order they are defined (`%0`, `%1`, ...). Every operation defines one
value, except those whose kind has several results (`scan`). Parameters are operations of kind
`parameter`; `Program.parameters` lists their values by parameter index.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import AccyError
from .arrays import ConstantArray
from .types import TensorType

SYNTHETIC_ID = -1
"""The id of an operation that a transformation generated rather than traced from user code."""


_PLAIN = frozenset({str, int, float, bool})


def _frozen(value: Any) -> Any:
    """Lists as tuples and NumPy scalars as Python scalars, so that attributes hash and print."""
    if type(value) in _PLAIN:  # the common case, on every traced operation
        return value
    if isinstance(value, list | tuple):
        return tuple(_frozen(item) for item in value)
    if isinstance(value, np.generic):
        return value.item()
    return value


class Attrs(Mapping[str, Any]):
    """A frozen, hashable mapping of attribute name to value, kept sorted by name.

    Lists become tuples and NumPy scalars Python scalars, so `{"axes": ["lane"]}` and
    `{"axes": ("lane",)}` are the same attributes.
    """

    __slots__ = ("_items", "_hash", "checked")

    def __init__(self, items: Mapping[str, Any] | None = None, /, **extra: Any):
        merged = {**(items or {}), **extra} if extra else items
        self._items = (
            tuple(sorted([(name, _frozen(value)) for name, value in merged.items()]))
            if merged
            else ()
        )
        self._hash: int | None = None
        # The last (kind, operand types, result types) `check_operation` found with these
        # very attributes: a pass that re-emits an operation unchanged (simplify, inlining,
        # differentiation) then skips its type rule. A cache, not part of the value.
        self.checked: tuple | None = None

    def __getitem__(self, key: str) -> Any:
        for name, value in self._items:
            if name == key:
                return value
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(self._items)
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Attrs):
            return self._items == other._items and _signed_zeros(self) == _signed_zeros(other)
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    def __reduce__(self) -> tuple:
        # Without the cached hash (string hashes differ between processes) or `checked`.
        return _attrs_of_items, (self._items,)

    def replace(self, **changes: Any) -> Attrs:
        return Attrs(dict(self._items), **changes)

    def __repr__(self) -> str:
        return f"Attrs({dict(self._items)!r})"


def _signed_zeros(attrs: Attrs) -> tuple:
    """The names of the float attributes holding -0.0: equal to 0.0 in Python, but a different
    number (`x / -0.0` is -inf), so attributes that differ only there are not the same."""
    return tuple(
        name
        for name, value in attrs._items
        if type(value) is float and value == 0.0 and math.copysign(1.0, value) < 0
    )


def _attrs_of_items(items: tuple) -> Attrs:
    """The `Attrs` of already sorted and frozen `items` (what unpickling calls)."""
    attrs = Attrs.__new__(Attrs)
    attrs._items, attrs._hash, attrs.checked = items, None, None
    return attrs


@dataclass(frozen=True, init=False)
class Operation:
    """One SSA operation: `results = kind(operands) {attrs}`."""

    id: int
    kind: str
    operands: tuple[int, ...]
    results: tuple[int, ...]
    result_types: tuple[TensorType, ...]
    attrs: Attrs = field(default_factory=Attrs)
    operand_types: tuple[TensorType, ...] = ()

    def __init__(
        self,
        id: int,
        kind: str,
        operands: tuple[int, ...],
        results: tuple[int, ...],
        result_types: tuple[TensorType, ...],
        attrs: Attrs | None = None,
        operand_types: tuple[TensorType, ...] = (),
    ):
        # One update of the instance's dict, not a frozen dataclass's setattr per field: a
        # GPT-2 training step builds some 50,000 operations between tracing and simplifying.
        self.__dict__.update(
            id=id,
            kind=kind,
            operands=operands,
            results=results,
            result_types=result_types,
            attrs=Attrs() if attrs is None else attrs,
            operand_types=operand_types,
        )

    @property
    def type(self) -> TensorType:
        """The result type of a single-result operation."""
        (only,) = self.result_types
        return only

    @property
    def is_synthetic(self) -> bool:
        return self.id == SYNTHETIC_ID


@dataclass(frozen=True, eq=False)
class Program:
    """A traced program: parameters, a flat SSA list of operations in order, and outputs."""

    name: str
    operations: tuple[Operation, ...]
    outputs: tuple[int, ...]
    value_types: tuple[TensorType, ...]

    @functools.cached_property  # asked once per buffer by the backends: O(operations) each
    def parameters(self) -> tuple[int, ...]:
        """Values of the parameter operations, in parameter-index order."""
        params = [op for op in self.operations if op.kind == "parameter"]
        params.sort(key=lambda op: op.attrs["index"])
        return tuple(op.results[0] for op in params)

    @property
    def parameter_types(self) -> tuple[TensorType, ...]:
        return tuple(self.type_of(v) for v in self.parameters)

    @property
    def output_types(self) -> tuple[TensorType, ...]:
        return tuple(self.type_of(v) for v in self.outputs)

    def type_of(self, value: int) -> TensorType:
        """The type of value `value` (a parameter, an operation result or an output)."""
        return self.value_types[value]

    def contains_scan(self) -> bool:
        return any(op.kind == "scan" for op in self.operations)

    def count(self, kind: str) -> int:
        """How many operations of `kind` the program has."""
        return sum(op.kind == kind for op in self.operations)

    def __str__(self) -> str:
        return format_program(self)

    def __repr__(self) -> str:
        return f"<Program {self.name}: {len(self.operations)} operations>"

    @functools.cached_property  # a scan's body is walked once per iteration
    def dead_after(self) -> dict[int, list[int]]:
        """For each operation's index, the values no later operation reads and the program
        does not return (a result never read dies where it is made).

        >>> import accy
        >>> p = accy.trace.define("f", [accy.spec(accy.f32, lane=2)],
        ...                       lambda b, a: (a[0] * 2.0).exp())
        >>> [(p.operations[i].kind, values) for i, values in sorted(p.dead_after.items())]
        [('broadcast_in_dim', [1]), ('mul', [0, 2]), ('unary', [3])]
        """
        last: dict[int, int] = {}
        for index, op in enumerate(self.operations):
            for value in (*op.results, *op.operands):
                last[value] = index
        kept = set(self.outputs)
        dead: dict[int, list[int]] = {}
        for value, index in last.items():
            if value not in kept:
                dead.setdefault(index, []).append(value)
        return dead

    @functools.cached_property
    def digest(self) -> str:
        """The sha256 (hex) of the program's text, computed once: programs that print alike
        (a function traced twice) have the same digest, so compiled code is found by content.

        >>> import accy
        >>> def make():
        ...     return accy.trace.define("f", [accy.spec(accy.f32, n=2)], lambda b, a: a[0] + 1.0)
        >>> make().digest == make().digest, len(make().digest)
        (True, 64)
        """
        return hashlib.sha256(str(self).encode()).hexdigest()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Program) and self.digest == other.digest

    def __hash__(self) -> int:
        return hash(self.digest)


RESERVED = {"true", "false", "inf", "nan", "program", "return"}


# ---------------------------------------------------------------------------------------------
# printing: the canonical text form (the parser is in text.py)


def _format_type(t: TensorType) -> str:
    return str(t)


def _format_name(name: str) -> str:
    # Bare only if the tokenizer reads it back as one name token (ASCII identifiers).
    bare = name.isascii() and name.isidentifier() and name not in RESERVED
    return name if bare else _quote(name)


def _quote(s: str) -> str:
    escaped = s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _format_value(value: Any, indent: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _format_name(value)
    if isinstance(value, TensorType):
        return _format_type(value)
    if isinstance(value, Program):
        return _format(value, indent + "  ").rstrip("\n")
    if isinstance(value, ConstantArray):
        return value.text()
    if isinstance(value, tuple):
        items = []
        for item in value:
            if (
                isinstance(item, tuple)
                and len(item) == 2
                and isinstance(item[0], str)
                and isinstance(item[1], int)
                and not isinstance(item[1], bool)
            ):
                items.append(f"{_format_name(item[0])}={item[1]}")
            else:
                items.append(_format_value(item, indent))
        return "[" + ", ".join(items) + "]"
    raise AccyError(f"cannot print attribute value {value!r}")


def _format(program: Program, indent: str) -> str:
    lines = [f"program {_format_name(program.name)} {{"]
    for position, op in enumerate(program.operations):
        results = ", ".join(f"%{r}" for r in op.results)
        operands = ", ".join(f"%{v}" for v in op.operands)
        shown = {
            k: v
            for k, v in op.attrs.items()
            # A result type held as an attribute (parameter, constant, iota, custom_call) is
            # shown once, after the colon; the parser puts it back.
            if not (k == "type" and op.result_types == (v,))
        }
        attrs = ""
        if shown:
            attrs = (
                " {"
                + ", ".join(f"{k}={_format_value(v, indent + '  ')}" for k, v in shown.items())
                + "}"
            )
        types = ", ".join(_format_type(t) for t in op.result_types)
        line = f"{indent}  {results} = {op.kind}({operands}){attrs} : {types}"
        if op.id == SYNTHETIC_ID:
            line += " @synthetic"
        elif op.id != position:
            line += f" @{op.id}"
        lines.append(line)
    outputs = ", ".join(f"%{v}" for v in program.outputs)
    lines.append(f"{indent}  return {outputs}".rstrip())
    lines.append(f"{indent}}}")
    return "\n".join(lines) + "\n"


def format_program(program: Program) -> str:
    """The text form of `program` (what `str(program)` gives)."""
    return _format(program, "")


def permute_parameters(program: Program, order: list[int] | tuple[int, ...]) -> Program:
    """`program` whose parameter `i` is the old parameter `order[i]` (operations unchanged).

    >>> import accy
    >>> p = accy.trace.define("sub", [accy.spec(accy.f32)] * 2, lambda b, a: a[0] - a[1])
    >>> [float(x) for x in accy.reference.run(permute_parameters(p, [1, 0]), [1.0, 3.0])]
    [2.0]
    """
    count = len(program.parameters)
    if sorted(order) != list(range(count)):
        raise AccyError(f"permute_parameters: {list(order)} is not a permutation of 0..{count - 1}")
    new_index = {old: new for new, old in enumerate(order)}
    operations = tuple(
        Operation(
            op.id,
            op.kind,
            op.operands,
            op.results,
            op.result_types,
            op.attrs.replace(index=new_index[op.attrs["index"]]),
            op.operand_types,
        )
        if op.kind == "parameter"
        else op
        for op in program.operations
    )
    return Program(program.name, operations, program.outputs, program.value_types)
