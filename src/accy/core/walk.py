"""Walking a program: visit its operations in order, giving each to a semantics.

A semantics is any object with `bind(op, args)` (the result of one operation, given its
operands' results) and `finish(outputs)`. `accy.interpret` builds composable layers of
semantics on this walk; `Inline` is the one the operation library needs to inline a program.
"""

from __future__ import annotations

from typing import Any

from ..errors import AccyError
from .ir import Operation, Program
from .kinds.registry import RULES


def run(program: Program, semantics: Any) -> Any:
    """Interpret `program` with `semantics`; returns `semantics.finish(outputs)`.

    >>> import accy
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, lane=2)], lambda b, a: a[0] * 2.0)
    >>> copy = accy.interpret.run(p, accy.interpret.Graph(accy.trace.Builder("copy")))
    >>> copy.count("mul")
    1
    """
    env: dict[int, Any] = {}
    # A semantics that holds large arrays (the reference evaluator's) sets `drops_dead_values`:
    # each value then goes after its last use instead of at the end (a random draw's
    # bit-mixing rounds are dozens of arrays the size of the draw).
    dead = program.dead_after if getattr(semantics, "drops_dead_values", False) else {}
    for index, op in enumerate(program.operations):
        result = semantics.bind(op, [env[v] for v in op.operands])
        if len(op.results) == 1 and not RULES[op.kind].multiple_results:
            env[op.results[0]] = result
        else:
            env.update(zip(op.results, result, strict=True))
        for value in dead.get(index, ()):
            del env[value]
    return semantics.finish([env[v] for v in program.outputs])


class Inline:
    """Emits a program's operations into another emitter, its parameters bound to `args`."""

    def __init__(self, emitter: Any, args: list[Any], program: Program):
        if len(args) != len(program.parameters):
            given = ", ".join(str(getattr(arg, "ty", repr(arg))) for arg in args) or "none"
            raise AccyError(
                f"call {program.name!r}: it takes {len(program.parameters)} arguments "
                f"({', '.join(map(str, program.parameter_types))}), got {len(args)} ({given})"
            )
        for position, (arg, expected) in enumerate(zip(args, program.parameter_types, strict=True)):
            if arg.ty != expected:
                raise AccyError(
                    f"call {program.name!r}: argument {position} has type {arg.ty} but the "
                    f"program's parameter {position} has type {expected}"
                )
        self.emitter = emitter
        self.args = args

    def bind(self, op: Operation, args: list[Any]) -> Any:
        if op.kind == "parameter":
            return self.args[op.attrs["index"]]
        return self.emitter.emit(op.kind, args, op.attrs)

    def finish(self, outputs: list[Any]) -> list[Any]:
        return outputs
