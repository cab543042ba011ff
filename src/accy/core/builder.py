"""Building programs: the one type-checked emission, `Builder`, and `trace_into`.

`check_operation` runs a kind's arity check and type rule; every operation that enters a
program goes through it, whether traced (`Builder.emit`), parsed (`accy.core.text`) or emitted
by a transformation (`accy.interpret.Emitter`). `Builder` records checked operations into a
`Program`; `trace_into(builder, specs, body)` traces a Python function into one (the entry
point, `define`, is `accy.trace`'s).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import AccyError, attach_user_location
from .arrays import is_array
from .ir import Attrs, Operation, Program
from .kinds.registry import Rule, check_arity, rule_for
from .operations import OpsApi
from .types import TensorType, check_not_float8
from .value import ArrayOps, Value


def check_operation(
    kind: str, operand_types: tuple[TensorType, ...], attrs: Any
) -> tuple[Rule, Attrs, tuple[TensorType, ...]]:
    """Check an operation of `kind` on operands of `operand_types`: its rule, its attributes as
    `Attrs`, and its result types. Raises the kind's `TypeRuleError` when it is ill-typed.

    >>> from accy import f32, spec
    >>> _, _, results = check_operation("add", (spec(f32, lane=2),) * 2, {})
    >>> [str(t) for t in results]
    ['f32[lane=2]']
    """
    rule = rule_for(kind)
    attrs = attrs if isinstance(attrs, Attrs) else Attrs(attrs or {})
    last = attrs.checked
    if last is not None and last[0] == kind and last[1] == operand_types:
        return rule, attrs, last[2]  # the same rule on the same types: the same results
    if rule.arity is not None:
        check_arity(kind, operand_types, rule.arity)
    inferred = rule.infer(operand_types, attrs)
    results = tuple(inferred) if rule.multiple_results else (inferred,)
    check_not_float8(kind, results)  # every operand is some operation's result, parameters too
    attrs.checked = (kind, operand_types, results)
    return rule, attrs, results


class Builder(OpsApi):
    """Records operations into a Program. Every type rule runs here, while tracing."""

    def __init__(self, name: str = "program", parent: Builder | None = None):
        self.name = name
        self._operations: list[Operation] = []
        self._types: list[TensorType] = []
        self._parameter_count = 0
        self._producers: dict[int, Operation] = {}
        # A sub-program's builder (a scan body) may use values of its enclosing builders:
        # each such value becomes one extra parameter, listed in `captured` (closures).
        self.parent = parent
        self.depth = 0 if parent is None else parent.depth + 1
        self.captured: list[Value] = []
        self._captures: dict[tuple[int, int], Value] = {}
        self._kept: list[Any] = []

    def parameter(self, type: TensorType, index: int | None = None, id: int | None = None) -> Value:
        """A new parameter of `type` (index: the next free one unless given)."""
        index = self._parameter_count if index is None else index
        return self.emit("parameter", [], {"index": index, "type": type}, id=id)

    def emit(self, kind: str, operands: Sequence[Any], attrs=None, id: int | None = None):
        """Check and record one operation; returns its result Value (a tuple if several)."""
        for value in operands:
            if getattr(value, "builder", None) is not self:
                return self._emit_with_outside_operands(kind, list(operands), attrs, id)
        return self._record(kind, operands, attrs, id)

    def _emit_with_outside_operands(self, kind: str, operands: list, attrs, id: int | None):
        """`emit` where some operand is not this builder's value: a value of an enclosing
        builder (captured), a concrete array (a constant), or a mistake (explained)."""
        inner = self._innermost(operands)
        if inner is not self:
            # `w * x` with `w` from an enclosing program and `x` from a scan body being traced:
            # the operation belongs to the body (which captures `w`).
            return inner.emit(kind, operands, attrs, id)
        operands = [self._capture(v) for v in operands]
        for position, value in enumerate(operands):
            if not isinstance(value, Value) or value.builder is not self:
                raise AccyError(
                    f"{kind}: operand {position} ({value!r}) is not a value of the program "
                    f"{self.name!r} being traced; values from another trace cannot be mixed in"
                )
        return self._record(kind, operands, attrs, id)

    def _record(self, kind: str, operands: Sequence[Value], attrs, id: int | None):
        """Type-check an operation on this builder's `operands` and append it."""
        operand_types = tuple([v.ty for v in operands])
        rule, attrs, result_types = check_operation(kind, operand_types, attrs)
        first = len(self._types)
        count = len(result_types)
        results = (first,) if count == 1 else tuple(range(first, first + count))
        self._types.extend(result_types)
        if kind == "parameter":
            self._parameter_count = max(self._parameter_count, attrs["index"] + 1)
        op = Operation(
            len(self._operations) if id is None else id,
            kind,
            tuple([v.index for v in operands]),
            results,
            result_types,
            attrs,
            operand_types,
        )
        self._operations.append(op)
        producers = self._producers
        for result in results:
            producers[result] = op
        if rule.multiple_results:
            return tuple(Value(self, r, t) for r, t in zip(results, result_types, strict=True))
        return Value(self, first, result_types[0])

    def subprogram(self, name: str, specs: Sequence[TensorType], body: Callable) -> Program:
        """Trace `body(builder, args)` into a Program of its own (a scan's body)."""
        return trace_into(Builder(name), specs, body)[0]

    def capturing_subprogram(
        self, name: str, specs: Sequence[TensorType], body: Callable
    ) -> tuple[Program, list[Value]]:
        """Trace `body(builder, args)` into a Program that may use this builder's values (and
        its enclosing builders'): each one used becomes an extra parameter after `specs`, and
        is returned, in parameter order, beside the program.

        >>> import accy
        >>> b = accy.trace.Builder("outer")
        >>> w = b.parameter(accy.spec(accy.f32, lane=2))
        >>> body, captured = b.capturing_subprogram(
        ...     "body", [accy.spec(accy.f32, lane=2)], lambda inner, a: a[0] * w)
        >>> len(body.parameters), captured == [w]
        (2, True)
        """
        return trace_into(Builder(name, parent=self), specs, body)

    def _innermost(self, operands: list[Any]) -> Builder:
        inner = self
        for value in operands:
            other = getattr(value, "builder", None)
            if isinstance(other, Builder) and other.depth > inner.depth:
                ancestor = other
                while ancestor is not None and ancestor is not self:
                    ancestor = ancestor.parent
                if ancestor is self:
                    inner = other
        return inner

    def _capture(self, value: Any) -> Any:
        """`value` itself, or the parameter standing for it when it is an enclosing value, or a
        constant holding a concrete array (a NamedArray read by a traced body)."""
        if not isinstance(value, Value):
            return self._constant_of(value) if isinstance(value, ArrayOps) else value
        if value.builder is self:
            return value
        ancestor = self.parent
        while ancestor is not None and ancestor is not value.builder:
            ancestor = ancestor.parent
        if ancestor is None:
            return value  # not ours: the check in `emit` explains the mistake
        key = (id(value.builder), value.index)
        if key not in self._captures:
            self._captures[key] = self.parameter(value.ty)
            self.captured.append(value)
        return self._captures[key]

    def _constant_of(self, array: ArrayOps) -> Value:
        """A constant of this program holding the concrete `array`'s elements (once per array)."""
        key = (id(array), -1)
        if key not in self._captures:
            self._captures[key] = self.constant(np.asarray(array), array.ty)
            self._kept.append(array)  # so that its id stays its own
        return self._captures[key]

    def splat_value(self, value: Value):
        """The scalar every element of `value` holds, when it is a splat constant; else None."""
        op = self._producers.get(value.index)
        if op is None or op.kind != "constant" or is_array(op.attrs["value"]):
            return None
        return op.attrs["value"]

    def build(self, outputs) -> Program:
        """The finished Program whose outputs are `outputs` (a Value or a sequence of Values)."""
        outputs = list(outputs) if isinstance(outputs, tuple | list) else [outputs]
        outputs = [self._capture(v) for v in outputs]
        for position, value in enumerate(outputs):
            if not isinstance(value, Value) or value.builder is not self:
                raise AccyError(
                    f"program {self.name!r}: output {position} ({value!r}) is not a traced value "
                    "of this program; return Values made from the body's arguments"
                )
        indices = sorted(op.attrs["index"] for op in self._operations if op.kind == "parameter")
        if indices != list(range(len(indices))):
            raise AccyError(f"program {self.name!r}: parameter indices {indices} are not 0..n-1")
        return Program(
            self.name,
            tuple(self._operations),
            tuple(v.index for v in outputs),
            tuple(self._types),
        )


def trace_into(
    builder: Builder, specs: Sequence[TensorType], body: Callable
) -> tuple[Program, list]:
    """Trace `body(builder, args)` into `builder`, with one parameter per spec: the Program and
    the values it captured from enclosing builders.

    >>> import accy
    >>> twice = lambda b, a: a[0] * 2.0
    >>> program, captured = trace_into(Builder("twice"), [accy.spec(accy.f32, n=2)], twice)
    >>> program.count("mul"), captured
    (1, [])
    """
    args = [builder.parameter(spec) for spec in specs]
    try:
        outputs = body(builder, args)
        return builder.build(outputs), list(builder.captured)
    except AccyError as error:
        attach_user_location(error)
        raise
