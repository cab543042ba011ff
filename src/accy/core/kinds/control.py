"""`custom_call` (an opaque call to a named target), `scan` (a loop over a named axis), `cond`
and `while_loop`, with their batching rules (vmap).

custom_call: `custom_call(args...) {target="accy.custom.double", version=1}`; its result type
is an attribute. Its rules come from the record registered for (target, version) in
`CUSTOM_CALLS` (an `accy.CustomCall`; the core only knows the methods it calls, see
`CustomCallRecord`), or from user rules (`accy.grad_with`, `accy.grad_with_rules`), which are
consulted first. Without either, differentiating it raises `CustomCallRequiresJvpContract` /
`CustomCallRequiresVjpContract`, naming the target.

A custom call with a VJP rule is linearized (for reverse mode) into a `custom_call` marked
`linearized=true` whose operands are `primals..., result, tangents...`; it is linear in the
tangents and only exists to be transposed by that VJP rule.

scan: operands are `consts..., carries..., xs...`; attribute `body` is a Program taking
`consts..., carries..., x slices...` and returning `new carries..., y slices...`. Each x has the
scanned `axis` (extent `length`); each y comes back stacked along `axis`, placed first. The
results are the final carries, then the stacked ys. `reverse=true` walks the axis backwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ...errors import (
    AxisError,
    CustomCallRequiresJvpContract,
    CustomCallRequiresVjpContract,
    TypeRuleError,
)
from ..ir import Operation, Program
from ..types import TensorType
from .registry import BatchedResults, Rule, attr, batch_first, batched_operand, register


class CustomCallRecord(Protocol):
    """What the kind table asks of a registered custom-call record (`accy.CustomCall`)."""

    def tangent(
        self, e: Any, op: Operation, primals: list, tangents: list, result: Any, *, reverse: bool
    ) -> Any:
        """The tangent of the call's result (`reverse`: the linearization is for transposing)."""
        ...

    def primal(self, e: Any, op: Operation, primals: list) -> Any:
        """The result reverse mode computes in place of the call, or None for the call."""
        ...

    def transpose(self, e: Any, op: Operation, cotangent: Any, operands: list) -> list:
        """One cotangent (or None) per operand of a call that is linear in some operands."""
        ...

    def mapped_axes_for(self, operand_types: Any) -> frozenset[str]:
        """The axes the call maps over, for operands of these types (see `accy.CustomCall`)."""
        ...

    def batched(self, e: Any, op: Operation, operands: list, batched: list, axis: str) -> Any:
        """The call mapped over `axis` (first on the operands that `batched` marks), with
        `axis` first in the result; None when the record has no batching rule."""
        ...


CUSTOM_CALLS: dict[tuple[str, int], CustomCallRecord] = {}
"""The one process-wide table of custom-call records by (target, version); `accy.custom`
registers into it, and the kind table, the transforms and the evaluators look records up here."""


def custom_call_record(attrs: Any) -> CustomCallRecord | None:
    """The record registered for the (target, version) of a custom call's attributes, or None."""
    return CUSTOM_CALLS.get((attrs["target"], attrs["version"]))


def missing_jvp(attrs: Any, detail: str = "") -> CustomCallRequiresJvpContract:
    """The error for a custom call differentiated in forward mode without a JVP rule."""
    target, version = attrs["target"], attrs["version"]
    return CustomCallRequiresJvpContract(
        f"custom_call {target!r} (version {version}) has no JVP rule{detail}; declare it with "
        f"accy.CustomCall({target!r}, version={version}, jvp=... or fallback=...), or give one "
        "through grad_with(hooks={'jvp': ...}) or grad_with_rules(jvp_rules=...)"
    )


def missing_vjp(attrs: Any, detail: str = "") -> CustomCallRequiresVjpContract:
    """The error for a custom call transposed without a VJP rule."""
    target, version = attrs["target"], attrs["version"]
    return CustomCallRequiresVjpContract(
        f"custom_call {target!r} (version {version}) has no VJP rule{detail}; declare it with "
        f"accy.CustomCall({target!r}, version={version}, vjp=...), or give one through "
        "grad_with(hooks={'vjp': ...}) or grad_with_rules(vjp_rules=...)"
    )


def _custom_call_infer(types, attrs):
    target = attr("custom_call", attrs, "target")
    version = attr("custom_call", attrs, "version")
    if not isinstance(target, str) or not target:
        raise TypeRuleError(f"custom_call: target must be a non-empty string, got {target!r}")
    if not isinstance(version, int):
        raise TypeRuleError(f"custom_call {target}: version must be an int, got {version!r}")
    result = attr("custom_call", attrs, "type")
    if not isinstance(result, TensorType):
        raise TypeRuleError(f"custom_call {target}: result type must be a TensorType")
    return result


def custom_call_jvp(
    e: Any,
    op: Operation,
    primals: Sequence[Any],
    tangents: Sequence[Any],
    out: Any,
    *,
    reverse: bool = False,
) -> Any:
    """The tangent of a custom call, by its record's rules; `reverse` when the linearization
    will be transposed (then a VJP rule is preferred to a JVP rule)."""
    record = custom_call_record(op.attrs)
    if record is None:
        raise missing_jvp(op.attrs)
    return record.tangent(e, op, list(primals), list(tangents), out, reverse=reverse)


def custom_call_primal(
    e: Any, op: Operation, primals: Sequence[Any], perturbed: Sequence[bool]
) -> Any:
    """What reverse mode computes as a differentiated custom call's result: its record's
    `forward` rule (a custom_vjp's fwd), or None for the call itself. `perturbed`: which
    operands have tangents not known to be zero."""
    record = custom_call_record(op.attrs)
    return None if record is None else record.primal(e, op, list(primals), list(perturbed))


def _custom_call_transpose(e, op, ct, operands):
    record = custom_call_record(op.attrs)
    if record is None:
        raise missing_vjp(op.attrs)
    return record.transpose(e, op, ct, operands)


def _custom_call_batch(e, op, operands, batched, ctx):
    """The record's batching rule when it has one; else a loop: a scan along the batch axis
    that makes the call once per example (the unbatched operands are its consts)."""
    record = custom_call_record(op.attrs)
    if record is not None:
        result = record.batched(e, op, list(operands), list(batched), ctx.name)
        if result is not None:
            return result
    shared = [x for x, b in zip(operands, batched, strict=True) if not b]
    mapped = [x for x, b in zip(operands, batched, strict=True) if b]
    specs = [x.ty for x in shared] + [x.ty.without([ctx.name]) for x in mapped]

    def per_example(b, args):
        given, slices = iter(args[: len(shared)]), iter(args[len(shared) :])
        ordered = [next(slices) if flag else next(given) for flag in batched]
        return [b.emit("custom_call", ordered, op.attrs)]

    body = e.subprogram("custom_call_per_example", specs, per_example)
    attrs = {
        "body": body,
        "axis": ctx.name,
        "length": ctx.extent,
        "num_consts": len(shared),
        "num_carry": 0,
        "reverse": False,
    }
    (stacked,) = e.emit("scan", shared + mapped, attrs)
    return stacked


register(
    Rule(
        "custom_call",
        _custom_call_infer,
        lambda attrs, args, ev: ev.custom_call(attrs, args),
        custom_call_jvp,
        _custom_call_transpose,
        result_type_is_attr=True,
        batch=_custom_call_batch,
    )
)


def scan_signature(types, attrs):
    """Check a scan's operands against its body; return (carry types, stacked y types)."""
    body = attr("scan", attrs, "body")
    axis = attr("scan", attrs, "axis")
    length = attr("scan", attrs, "length")
    num_consts = attr("scan", attrs, "num_consts")
    num_carry = attr("scan", attrs, "num_carry")
    reverse = attr("scan", attrs, "reverse")
    if not isinstance(body, Program):
        raise TypeRuleError(f"scan: attribute 'body' must be a program, got {body!r}")
    for name, value in (("length", length), ("num_consts", num_consts), ("num_carry", num_carry)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise TypeRuleError(f"scan: attribute {name!r} must be an int >= 0, got {value!r}")
    if not isinstance(reverse, bool):
        raise TypeRuleError(f"scan: attribute 'reverse' must be true or false, got {reverse!r}")
    if num_consts + num_carry > len(types):
        raise TypeRuleError(
            f"scan: {num_consts} consts and {num_carry} carries, but only {len(types)} operands"
        )
    consts = types[:num_consts]
    carries = types[num_consts : num_consts + num_carry]
    xs = types[num_consts + num_carry :]
    for x in xs:
        if not x.has(axis) or x.extent(axis) != length:
            raise AxisError(
                f"scan: every x must have the scanned axis {axis!r} with extent {length}, got {x}"
            )
    expected = list(consts) + list(carries) + [x.without([axis]) for x in xs]
    parameters = list(body.parameter_types)
    if parameters != expected:
        raise TypeRuleError(
            f"scan: the body {body.name!r} takes ({', '.join(map(str, parameters))}) but the "
            f"scan gives it ({', '.join(map(str, expected))}): consts, carries, then x slices"
        )
    outputs = body.output_types
    if list(outputs[:num_carry]) != list(carries):
        raise TypeRuleError(
            f"scan: the body must return the carries' types ({', '.join(map(str, carries))}) "
            f"first, got ({', '.join(map(str, outputs[:num_carry]))})"
        )
    ys = []
    for y in outputs[num_carry:]:
        if y.has(axis):
            raise AxisError(f"scan: a y slice {y} already has the scanned axis {axis!r}")
        ys.append(y.with_axes(((axis, length), *y.named_extents)))
    return list(carries), ys


def _scan_infer(types, attrs):
    carries, ys = scan_signature(types, attrs)
    return tuple(carries + ys)


def _scan_evaluate(attrs, args, ev):
    num_consts, num_carry = attrs["num_consts"], attrs["num_carry"]
    consts = list(args[:num_consts])
    carries = list(args[num_consts : num_consts + num_carry])
    xs = args[num_consts + num_carry :]
    positions = [t.position(attrs["axis"]) for t in ev.operand_types[num_consts + num_carry :]]
    steps = range(attrs["length"])
    ys: list[list[np.ndarray]] = []
    for step in reversed(steps) if attrs["reverse"] else steps:
        slices = [np.take(x, step, axis=p) for x, p in zip(xs, positions, strict=True)]
        outputs = ev.run_program(attrs["body"], consts + carries + slices)
        carries = list(outputs[:num_carry])
        ys.append(list(outputs[num_carry:]))
    if attrs["reverse"]:
        ys.reverse()
    stacked = []
    for i, t in enumerate(ev.result_types[num_carry:]):
        stacked.append(
            np.stack([y[i] for y in ys]) if ys else np.zeros(t.extents, dtype=t.dtype.numpy)
        )
    return tuple(carries + stacked)


def _scan_batch(e, op, operands, batched, ctx):
    """Every operand made batched, the body batched in all its parameters; the stacked ys come
    out with the scanned axis first, and are laid out with the batch axis first."""
    operands = [batched_operand(e, x, b, ctx) for x, b in zip(operands, batched, strict=True)]
    body = ctx.batch_program(op.attrs["body"], [True] * len(op.attrs["body"].parameters))
    results = e.emit("scan", operands, op.attrs.replace(body=body))
    results = results if isinstance(results, tuple) else (results,)
    carries = op.attrs["num_carry"]
    return tuple(results[:carries]) + tuple(batch_first(e, y, ctx) for y in results[carries:])


register(Rule("scan", _scan_infer, _scan_evaluate, multiple_results=True, batch=_scan_batch))


# -- cond and while_loop -----------------------------------------------------------------------
#
# cond: operands `predicate, args...`; attributes `true_body` and `false_body`, two Programs
# that take the args' types and return the same types. The results are the outputs of the
# branch that the (bool, rank-0) predicate selects; only that branch runs.
#
# while_loop: operands `consts..., carries...`; attributes `cond_body` (consts, carries ->
# bool scalar) and `body` (consts, carries -> new carries), `num_consts`. The carries are
# updated while `cond_body` holds; the results are the final carries.


def _check_branch(kind: str, role: str, program: Any, expected: list) -> Program:
    if not isinstance(program, Program):
        raise TypeRuleError(f"{kind}: attribute {role!r} must be a program, got {program!r}")
    parameters = list(program.parameter_types)
    if parameters != list(expected):
        raise TypeRuleError(
            f"{kind}: the {role} {program.name!r} takes ({', '.join(map(str, parameters))}) "
            f"but is given ({', '.join(map(str, expected))})"
        )
    return program


def _cond_infer(types, attrs):
    if not types:
        raise TypeRuleError("cond needs a predicate operand")
    predicate = types[0]
    if predicate.dtype.name != "bool" or predicate.rank != 0:
        raise TypeRuleError(f"cond: the predicate must be a bool scalar, got {predicate}")
    args = list(types[1:])
    true_body = _check_branch("cond", "true_body", attr("cond", attrs, "true_body"), args)
    false_body = _check_branch("cond", "false_body", attr("cond", attrs, "false_body"), args)
    if list(true_body.output_types) != list(false_body.output_types):
        raise TypeRuleError(
            f"cond: the branches return different types: "
            f"({', '.join(map(str, true_body.output_types))}) when true, "
            f"({', '.join(map(str, false_body.output_types))}) when false"
        )
    return tuple(true_body.output_types)


def _cond_evaluate(attrs, args, ev):
    branch = attrs["true_body"] if bool(args[0]) else attrs["false_body"]
    return tuple(ev.run_program(branch, list(args[1:])))


def _cond_batch(e, op, operands, batched, ctx):
    """Both branches batched; with one predicate for all examples it stays a cond, and with a
    predicate per example both branches run (on every operand batched) and each result is
    selected per example (as JAX's batched cond becomes a select)."""
    predicate, args, flags = operands[0], list(operands[1:]), list(batched[1:])
    if batched[0]:
        args = [batched_operand(e, x, b, ctx) for x, b in zip(args, flags, strict=True)]
        flags = [True] * len(args)
    true_body = ctx.batch_program(op.attrs["true_body"], flags)
    false_body = ctx.batch_program(op.attrs["false_body"], flags)
    if not batched[0]:
        attrs = op.attrs.replace(true_body=true_body, false_body=false_body)
        results = e.emit("cond", [predicate, *args], attrs)
        return results if isinstance(results, tuple) else (results,)
    on_true = _as_tuple(e.call(true_body, taken_only(e, predicate, args)))
    on_false = _as_tuple(e.call(false_body, taken_only(e, e.unary("not", predicate), args)))
    return tuple(
        e.transpose(e.select(predicate, t, f), t.ty.axes)
        for t, f in zip(on_true, on_false, strict=True)
    )


def taken_only(e, taken, args: list) -> list:
    """The operands of a branch computed whether or not it is taken (a batched cond, a cond
    differentiated in reverse mode), differentiable only where `taken` holds (as JAX's): a
    branch not taken can have an infinite derivative (sqrt at 0) that the zero cotangent
    there would turn into NaN."""
    return [
        e.transpose(e.select(taken, x, e.unary("stop_gradient", x)), x.ty.axes)
        if x.ty.dtype.is_float
        else x
        for x in args
    ]


def _as_tuple(results: Any) -> tuple:
    return results if isinstance(results, tuple) else (results,)


register(Rule("cond", _cond_infer, _cond_evaluate, multiple_results=True, batch=_cond_batch))


def _while_infer(types, attrs):
    num_consts = attr("while_loop", attrs, "num_consts")
    if not isinstance(num_consts, int) or isinstance(num_consts, bool) or num_consts < 0:
        raise TypeRuleError(f"while_loop: num_consts must be an int >= 0, got {num_consts!r}")
    if num_consts > len(types):
        raise TypeRuleError(f"while_loop: {num_consts} consts but {len(types)} operands")
    condition = _check_branch(
        "while_loop", "cond_body", attr("while_loop", attrs, "cond_body"), types
    )
    body = _check_branch("while_loop", "body", attr("while_loop", attrs, "body"), types)
    outputs = condition.output_types
    if len(outputs) != 1 or outputs[0].dtype.name != "bool" or outputs[0].rank != 0:
        raise TypeRuleError(
            f"while_loop: cond_body must return one bool scalar, got "
            f"({', '.join(map(str, outputs))})"
        )
    carries = list(types[num_consts:])
    if list(body.output_types) != carries:
        raise TypeRuleError(
            f"while_loop: the body must return the carries' types "
            f"({', '.join(map(str, carries))}), got ({', '.join(map(str, body.output_types))})"
        )
    return tuple(carries)


def _while_evaluate(attrs, args, ev):
    num_consts = attrs["num_consts"]
    consts, carries = list(args[:num_consts]), list(args[num_consts:])
    while bool(ev.run_program(attrs["cond_body"], consts + carries)[0]):
        carries = list(ev.run_program(attrs["body"], consts + carries))
    return tuple(carries)


def _while_batch(e, op, operands, batched, ctx):
    """With one predicate for all examples (it reads no batched value), only the carries that
    depend on batched values are batched (a loop counter stays a scalar) and the loop stays
    as it is; else every carry is batched, the loop runs while the predicate holds for any
    example, and an example whose predicate no longer holds keeps its carries (JAX's batched
    while_loop)."""
    shared = _while_batch_shared_predicate(e, op, operands, batched, ctx)
    if shared is not None:
        return shared
    num_consts = op.attrs["num_consts"]
    consts = list(operands[:num_consts])
    carries = [
        batched_operand(e, x, b, ctx)
        for x, b in zip(operands[num_consts:], batched[num_consts:], strict=True)
    ]
    flags = list(batched[:num_consts]) + [True] * len(carries)
    condition = ctx.batch_program(op.attrs["cond_body"], flags)
    body = ctx.batch_program(op.attrs["body"], flags)
    types = [x.ty for x in consts + carries]

    def any_holds(b, args):
        return b.reduce_max(b.call(condition, args), [ctx.name])

    def step(b, args):
        holds = b.call(condition, args)
        stepped = _as_tuple(b.call(body, args))
        kept = args[num_consts:]
        return [
            b.transpose(b.select(holds, s, k), k.ty.axes)
            for s, k in zip(stepped, kept, strict=True)
        ]

    attrs = op.attrs.replace(
        cond_body=e.subprogram("while_any", types, any_holds),
        body=e.subprogram("while_masked_body", types, step),
    )
    return _as_tuple(e.emit("while_loop", consts + carries, attrs))


def _while_batch_shared_predicate(e, op, operands, batched, ctx):
    """The batched loop when its predicate is the same for every example (None otherwise):
    the carries batched are those that depend on batched values at any step (a fixpoint)."""
    if ctx.outputs_batched is None:
        return None
    attrs = op.attrs
    num_consts = attrs["num_consts"]
    consts = list(batched[:num_consts])
    carried = list(batched[num_consts:])
    while True:
        stepped = ctx.outputs_batched(attrs["body"], consts + carried)
        grown = [c or s for c, s in zip(carried, stepped, strict=True)]
        if grown == carried:
            break
        carried = grown
    if ctx.outputs_batched(attrs["cond_body"], consts + carried)[0]:
        return None
    carries = [
        batched_operand(e, x, b, ctx) if want else x
        for x, b, want in zip(operands[num_consts:], batched[num_consts:], carried, strict=True)
    ]
    flags = consts + carried
    new_attrs = attrs.replace(
        cond_body=ctx.batch_program(attrs["cond_body"], flags, [False]),
        body=ctx.batch_program(attrs["body"], flags, carried),
    )
    results = _as_tuple(e.emit("while_loop", list(operands[:num_consts]) + carries, new_attrs))
    return BatchedResults(results, tuple(carried))


register(
    Rule("while_loop", _while_infer, _while_evaluate, multiple_results=True, batch=_while_batch)
)
