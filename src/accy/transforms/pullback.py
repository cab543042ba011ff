"""Reverse mode: transpose the linear part of a linearized program.

The walk is JAX's backward pass. Values that depend on a tangent parameter are linear; every
other operation (primal outputs, residuals) is re-emitted in a forward sweep. Then the linear
operations are visited backwards: each kind's transpose rule turns the cotangent of its result
into cotangents of its linear operands, which accumulate by addition. Custom calls are
transposed by user VJP rules (`vjp_rules`), else by the VJP rule of their `accy.CustomCall`
record.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from ..core import Operation, Program
from ..core.builder import Builder
from ..core.kinds.registry import Linear, rule_for
from ..errors import AccyError
from ..interpret import Emitter, Graph
from .linearize import Linearized
from .simplify import eliminate_dead_code


@dataclass(frozen=True)
class Pullback:
    """A transposed program: it takes the primal parameters, then one cotangent (seed) per
    output; it returns the primal outputs (when kept), then one cotangent per `wrt` input."""

    program: Program
    primal_parameter_count: int
    seed_parameter_count: int
    keep_primal_outputs: bool


class VjpContext:
    """What a user VJP rule receives for one operation being transposed."""

    def __init__(self, backward: _Backward, op: Operation, cotangent: Any, operands: list[Any]):
        self.op = op
        self.custom = SimpleNamespace(**dict(op.attrs))
        self.cotangent = cotangent
        self.operands = operands
        self._backward = backward

    def operand_is_active(self, index: int) -> bool:
        """Whether operand `index` is linear (needs a cotangent)."""
        return isinstance(self.operands[index], Linear)

    def contribute(self, index: int, value: Any) -> None:
        """Add `value` to the cotangent of operand `index`."""
        if not self.operand_is_active(index):
            raise AccyError(f"{self.op.kind}: operand {index} is not active; it takes no cotangent")
        expected = self.operands[index].type
        if value.ty != expected:
            raise AccyError(
                f"{self.op.kind} {self.op.attrs.get('target', '')}: the VJP rule contributed "
                f"{value.ty} to operand {index}, whose type is {expected}"
            )
        self._backward.accumulate(self.op.operands[index], value)

    def builder_handle(self) -> Builder:
        return self._backward.semantics.builder_handle()


class _Backward:
    def __init__(self, semantics: Any, vjp_rules: Any):
        self.semantics = semantics
        self.emit = Emitter(semantics)
        self.vjp_rules = vjp_rules
        self.cotangents: dict[int, Any] = {}

    def accumulate(self, value: int, cotangent: Any) -> None:
        previous = self.cotangents.get(value)
        self.cotangents[value] = (
            cotangent if previous is None else self.emit.add(previous, cotangent)
        )

    def transpose(self, op: Operation, cotangent: Any, operands: list[Any]) -> None:
        user_rule = getattr(self.vjp_rules, op.kind, None) if self.vjp_rules is not None else None
        if user_rule is not None:
            user_rule(VjpContext(self, op, cotangent, operands))
            return
        rule = rule_for(op.kind)
        if rule.transpose is None:
            raise AccyError(f"{op.kind} is not linear in its tangent operands: no transpose rule")
        # A custom call's transpose rule asks its record (accy.CustomCall) for the VJP rule.
        contributions = rule.transpose(self.emit, op, cotangent, operands)
        for value, operand, contribution in zip(op.operands, operands, contributions, strict=True):
            if contribution is not None and isinstance(operand, Linear):
                self.accumulate(value, contribution)


class _PrimalSweep:
    """Re-emits the non-linear operations (primal outputs and residuals) on demand, in program
    order, so that the transposed program holds only the primal work it needs."""

    def __init__(self, source: Program, semantics: Any, linear: set[int], first_tangent: int):
        self.semantics = semantics
        self.env: dict[int, Any] = {}
        self.producer: dict[int, tuple[int, Operation]] = {}
        for position, op in enumerate(source.operations):
            for result in op.results:
                self.producer[result] = (position, op)
        self.linear = linear
        # Every primal parameter stays a parameter, used or not, so the signature is kept.
        for op in source.operations:
            if op.kind == "parameter" and op.attrs["index"] < first_tangent:
                self.env[op.results[0]] = semantics.bind(op, [])

    def value(self, value: int) -> Any:
        if value not in self.env:
            for op in self._missing_operations(value):
                args = [self.env[v] for v in op.operands]
                result = self.semantics.bind(op, args)
                results = result if len(op.results) > 1 else (result,)
                self.env.update(zip(op.results, results, strict=True))
        return self.env[value]

    def _missing_operations(self, value: int) -> list[Operation]:
        needed: dict[int, Operation] = {}
        stack = [value]
        while stack:
            v = stack.pop()
            position, op = self.producer[v]
            if v in self.env or position in needed:
                continue
            if v in self.linear:
                raise AccyError(f"internal: the linear value %{v} was needed as a residual")
            needed[position] = op
            stack.extend(op.operands)
        return [needed[p] for p in sorted(needed)]


def linear_values(program: Program, first_linear_parameter: int) -> set[int]:
    """Values that depend on a parameter whose index is >= first_linear_parameter."""
    linear = set(program.parameters[first_linear_parameter:])
    for op in program.operations:
        if any(v in linear for v in op.operands):
            linear.update(op.results)
    return linear


def pullback(
    linearized: Linearized,
    *,
    keep_primal_outputs: bool = False,
    semantics: Any = None,
    vjp_rules: Any = None,
) -> Pullback:
    """Transpose `linearized` into a program from output cotangents to input cotangents.

    `semantics` is what the transposed program is emitted into (a `Graph` by default, or hook
    layers over one); `vjp_rules` is an object whose method `custom_call(ctx)` transposes custom
    calls (see `VjpContext`).
    """
    source = linearized.program
    n = linearized.primal_parameter_count
    outputs_kept = linearized.primal_output_count
    semantics = semantics or Graph(Builder(source.name))
    backward = _Backward(semantics, vjp_rules)
    linear = linear_values(source, n)

    primal = _PrimalSweep(source, semantics, linear, n)

    tangent_outputs = source.outputs[outputs_kept:]
    for position, value in enumerate(tangent_outputs):
        seed = backward.emit.emit(
            "parameter", [], {"index": n + position, "type": source.type_of(value)}
        )
        if value in linear:
            backward.accumulate(value, seed)

    for op in reversed(source.operations):
        if op.kind == "parameter" or op.results[0] not in linear:
            continue
        if len(op.results) != 1:
            raise AccyError(f"{op.kind} with several results cannot be transposed (unroll scans)")
        cotangent = backward.cotangents.pop(op.results[0], None)
        if cotangent is None:
            continue
        operands = [
            Linear(t) if v in linear else primal.value(v)
            for v, t in zip(op.operands, op.operand_types, strict=True)
        ]
        backward.transpose(op, cotangent, operands)

    gradients = []
    for parameter in source.parameters[n:]:
        cotangent = backward.cotangents.get(parameter)
        if cotangent is None:
            cotangent = backward.emit.zeros(source.type_of(parameter))
        gradients.append(cotangent)
    kept = [primal.value(v) for v in source.outputs[:outputs_kept]] if keep_primal_outputs else []
    program = semantics.finish(kept + gradients)
    if isinstance(program, Program):
        # Residual operands are materialized for every transposed operation; drop those that
        # no transpose rule used (a reduce's init, say).
        program = eliminate_dead_code(program)
    return Pullback(program, n, len(tangent_outputs), keep_primal_outputs)
