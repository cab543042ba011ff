"""Immutable IR records: `Attrs`, `Operation`, `Program`.

Values are numbered in the order they are defined (`%0`, `%1`, ...). Every operation defines one
value, except those whose kind has several results (`scan`). Parameters are operations of kind
`parameter`; `Program.parameters` lists their values by parameter index.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..types import TensorType

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

    __slots__ = ("_items", "_hash")

    def __init__(self, items: Mapping[str, Any] | None = None, /, **extra: Any):
        merged = dict(items or {})
        merged.update(extra)
        self._items = tuple(sorted((name, _frozen(value)) for name, value in merged.items()))
        self._hash: int | None = None

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
            return self._items == other._items
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    def replace(self, **changes: Any) -> Attrs:
        return Attrs(dict(self._items), **changes)

    def __repr__(self) -> str:
        return f"Attrs({dict(self._items)!r})"


@dataclass(frozen=True)
class Operation:
    """One SSA operation: `results = kind(operands) {attrs}`."""

    id: int
    kind: str
    operands: tuple[int, ...]
    results: tuple[int, ...]
    result_types: tuple[TensorType, ...]
    attrs: Attrs = field(default_factory=Attrs)
    operand_types: tuple[TensorType, ...] = ()

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

    @property
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
        from .text import format_program

        return format_program(self)

    def __repr__(self) -> str:
        return f"<Program {self.name}: {len(self.operations)} operations>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Program) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))
