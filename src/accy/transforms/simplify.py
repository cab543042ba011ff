"""Simplification: algebraic identities, constant folding of splats, CSE and dead-code removal.

Gradients come out of linearize and transpose with work that is visibly useless: multiplying by
a broadcast 1.0 seed, adding zeros, broadcasting a constant, duplicate constants, residuals
nobody reads. `simplify` removes it. Each rule keeps the program's IEEE meaning: `x * 0` stays
(it is NaN where x is NaN or infinite), `0 - x` becomes `-x` only for a -0.0 (so that
`0.0 - 0.0` stays +0.0), and a -0.0 constant is never merged with 0.0. Two rules follow XLA
(and so JAX) rather than IEEE on the sign of a zero: `x + 0.0` is x, and a sum over axes of
extent 1 is its operand (both give -0.0 for a -0.0 where IEEE gives +0.0).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from ..core import Operation, Program
from ..core.arrays import is_array
from ..core.builder import Builder
from ..core.kinds.reduction import reduction_identity
from ..core.kinds.registry import rule_for
from ..interpret import Emitter, Graph, Inline, Layer, run
from ..trace import define


class _Simplify(Layer):
    def __init__(self, next: Any):
        super().__init__(next)
        self.emit = Emitter(self)
        self.splats: dict[int, Any] = {}  # value index -> the scalar it holds everywhere
        self.seen: dict[tuple, Any] = {}
        self.negations: dict[int, Any] = {}  # value index of neg(x) -> x
        self.pads: dict[int, tuple[Any, Any, Operation]] = {}  # pad(x, fill) -> (x, fill, op)
        self.concatenations: dict[int, tuple[list[Any], str]] = {}  # -> (operands, axis)

    def bind(self, op: Operation, args: list[Any]) -> Any:
        rule = RULES.get(op.kind)
        if rule is not None:
            replacement = rule(self, op, args)
            if replacement is not None:
                return replacement
        key = None
        if op.kind not in ("parameter", "custom_call", "scan"):
            operands = tuple(a.index for a in args)
            if op.kind in COMMUTATIVE:
                operands = tuple(sorted(operands))
            key = (op.kind, op.attrs, operands)
            if key in self.seen:
                return self.seen[key]
        result = self.next.bind(op, args)
        if key is not None:
            self.seen[key] = result
        if op.kind == "constant" and not is_array(op.attrs["value"]):
            self.splats[result.index] = op.attrs["value"]
        if op.kind == "unary" and op.attrs["op"] == "neg":
            self.negations[result.index] = args[0]
        if op.kind == "pad":
            self.pads[result.index] = (args[0], args[1], op)
        if op.kind == "concatenate":
            self.concatenations[result.index] = (list(args), op.attrs["axis"])
        return result

    def splat(self, value: Any) -> Any:
        return self.splats.get(value.index)

    def constant(self, type, scalar) -> Any:
        return self.emit.full(type, scalar)


def _is(s: _Simplify, value: Any, scalar: float) -> bool:
    held = s.splat(value)
    return held is not None and not isinstance(held, bool) and held == scalar


def _is_negative_zero(s: _Simplify, value: Any) -> bool:
    held = s.splat(value)
    return isinstance(held, float) and held == 0 and math.copysign(1.0, held) < 0


COMMUTATIVE = {"add", "mul", "max", "min"}


def _mul(s, op, args):
    a, b = args
    for x, y in ((a, b), (b, a)):
        if _is(s, y, 1):
            return x
        if _is(s, y, -1):
            return s.emit.neg(x)
        if _is(s, y, 0) and not op.type.dtype.is_float:
            return s.constant(op.type, 0)
    if s.splat(a) is not None and s.splat(b) is not None:
        return s.constant(op.type, s.splat(a) * s.splat(b))
    return None


def _add(s, op, args):
    a, b = args
    if _is(s, b, 0):
        return a
    if _is(s, a, 0):
        return b
    return _joined_pads(s, a, b)


def _joined_pads(s: _Simplify, a: Any, b: Any) -> Any:
    """`pad(x) + pad(y)`, zero-padded pieces that do not overlap along one axis and are padded
    alike along every other, is `pad(concatenate(x, zeros, y))`: the gradient of slices taken
    along one axis (q, k and v out of one projection) becomes one copy of the pieces instead of
    a sum that reads every piece for every element. Only a -0.0 of a piece differs (the sum
    made it +0.0)."""
    pieces = [s.pads.get(a.index), s.pads.get(b.index)]
    if any(p is None or not _zero_padded(s, p) for p in pieces):
        return None
    (x, fill, pad_x), (y, _, pad_y) = pieces
    differ = [
        k
        for k in range(x.ty.rank)
        if (pad_x.attrs["low"][k], pad_x.attrs["high"][k])
        != (pad_y.attrs["low"][k], pad_y.attrs["high"][k])
    ]
    if len(differ) != 1 or x.ty.axes != y.ty.axes:
        return None
    k = differ[0]
    if pad_y.attrs["low"][k] < pad_x.attrs["low"][k]:
        (x, pad_x), (y, pad_y) = (y, pad_y), (x, pad_x)
    gap = pad_y.attrs["low"][k] - pad_x.attrs["low"][k] - x.ty.extents[k]
    if gap < 0:
        return None
    parts = [x]
    if gap:
        axis = x.ty.axes[k]
        zeros = tuple(
            (n, gap if n == axis else e) for n, e in zip(x.ty.axes, x.ty.extents, strict=True)
        )
        parts.append(s.constant(x.ty.with_axes(zeros), 0))
    parts.append(y)
    joined = s.emit.concatenate(parts, x.ty.axes[k])
    low = pad_x.attrs["low"][:k] + (pad_x.attrs["low"][k],) + pad_x.attrs["low"][k + 1 :]
    high = pad_x.attrs["high"][:k] + (pad_y.attrs["high"][k],) + pad_x.attrs["high"][k + 1 :]
    return s.emit.pad_positional(joined, fill, low, high, pad_x.attrs["interior"])


def _zero_padded(s: _Simplify, pad: tuple[Any, Any, Operation]) -> bool:
    _, fill, op = pad
    plain = not any(op.attrs["interior"]) and min(op.attrs["low"] + op.attrs["high"]) >= 0
    return plain and _is(s, fill, 0)


def _pad(s, op, args):
    """A pad of nothing on every side is its operand."""
    if any(op.attrs["low"]) or any(op.attrs["high"]) or any(op.attrs["interior"]):
        return None
    return args[0]


def _concatenate(s, op, args):
    """A concatenate of concatenates along the same axis is one concatenate of their pieces
    (read as one strided view where the pieces are slabs of one buffer)."""
    axis = op.attrs["axis"]
    nested = [_pieces_along(s, a, axis) for a in args]
    if all(n is None for n in nested):
        return None
    pieces = [p for n, a in zip(nested, args, strict=True) for p in (n if n else [a])]
    return s.emit.concatenate(pieces, axis)


def _pieces_along(s: _Simplify, value: Any, axis: str) -> list[Any] | None:
    """The operands of `value` if it is a concatenate along `axis` in its own axis order."""
    joined = s.concatenations.get(value.index)
    if joined is None or joined[1] != axis:
        return None
    pieces = joined[0]
    return pieces if all(p.ty.axes == value.ty.axes for p in pieces) else None


def _sub(s, op, args):
    a, b = args
    if _is(s, b, 0):
        return a
    if _is(s, a, 0) and (_is_negative_zero(s, a) or not op.type.dtype.is_float):
        return s.emit.neg(b)  # -0.0 - x is -x; 0.0 - 0.0 is +0.0, not -(0.0)
    return None


def _div(s, op, args):
    return args[0] if _is(s, args[1], 1) else None


def _unary(s, op, args):
    (x,) = args
    if op.attrs["op"] == "neg":
        if s.splat(x) is not None and not isinstance(s.splat(x), bool):
            return s.constant(op.type, -s.splat(x))
        return s.negations.get(x.index)
    return None


def _same_splat(s, op, args):
    """broadcast_in_dim, transpose and reshape of a splat constant are a splat constant."""
    held = s.splat(args[0])
    return s.constant(op.type, held) if held is not None else None


def _convert(s, op, args):
    (x,) = args
    if x.ty == op.type:
        return x
    held = s.splat(x)
    if held is not None and op.type.dtype.is_float and not isinstance(held, bool):
        return s.constant(op.type, float(held))
    return None


def _select(s, op, args):
    predicate, on_true, on_false = args
    held = s.splat(predicate)
    if held is not None:
        return on_true if held else on_false
    if on_true is on_false:
        return on_true
    return None


def _reduce(s, op, args):
    x, init = args
    if op.attrs["op"] == "sum" and _is(s, x, 0) and s.splat(init) is not None:
        return s.constant(op.type, s.splat(init))
    if all(x.ty.extent(a) == 1 for a in op.attrs["axes"]) and _is_identity(s, op, init):
        # Over axes of extent 1 the reduction is x itself (a slice of one element along an
        # axis, summed away to drop it): a view, not a kernel. Only a sum's -0.0 differs (it
        # would come out +0.0).
        return s.emit.reshape(x, op.type.named_extents)
    return None


def _is_identity(s: _Simplify, op: Operation, init: Any) -> bool:
    """Whether `init` is the identity of `op`'s monoid (0 for sum, -inf for max, ...)."""
    value = s.splat(init)
    return value is not None and value == reduction_identity(op.attrs["op"], init.ty.dtype)


def _dot_general(s, op, args):
    # With a float operand of zeros the result is zero only where the other holds no NaN or
    # infinity, so only integer contractions fold.
    if not op.type.dtype.is_float and any(_is(s, a, 0) for a in args):
        return s.constant(op.type, 0)
    return None


def _scan(s: _Simplify, op: Operation, args: list[Any]) -> Any:
    """A scan over a splat constant (a gradient's seed of 1.0 for every step, say) reads the
    scalar inside its body instead: the stacked constant is never made (16 MiB for a
    16,384-step RNN's seed). A y that is an x slice unchanged is that x (JAX's scan forwarding
    of inputs to outputs): the loop does not copy it."""
    forwarded = _scan_forwarding_xs(s, op, args)
    if forwarded is not None:
        return forwarded
    attrs = op.attrs
    first_x = attrs["num_consts"] + attrs["num_carry"]
    splats = {i: s.splat(a) for i, a in enumerate(args) if i >= first_x}
    splats = {i: v for i, v in splats.items() if v is not None}
    if not splats or len(splats) == len(args) - first_x:  # a scan needs one x for its length
        return None
    body: Program = attrs["body"]
    kept = [i for i in range(len(args)) if i not in splats]

    def reading_the_scalars(b, values):
        given = dict(zip(kept, values, strict=True))
        arguments = [
            given[i] if i in given else b.full(body.parameter_types[i], splats[i])
            for i in range(len(args))
        ]
        return run(body, Inline(b, arguments, body))

    smaller = define(body.name, [body.parameter_types[i] for i in kept], reading_the_scalars)
    return s.emit.emit("scan", [args[i] for i in kept], attrs.replace(body=smaller))


def _scan_forwarding_xs(s: _Simplify, op: Operation, args: list[Any]) -> Any:
    """The scan's results with each y that its body returns as an x slice unchanged taken
    from that x (laid out as the y, the scanned axis first), or None when there is none."""
    attrs = op.attrs
    body: Program = attrs["body"]
    num_carry = attrs["num_carry"]
    first_x = attrs["num_consts"] + num_carry
    x_of = {p: first_x + j for j, p in enumerate(body.parameters[first_x:])}
    forwarded = {k: x_of[v] for k, v in enumerate(body.outputs[num_carry:]) if v in x_of}
    if not forwarded:
        return None
    y_types = op.result_types[num_carry:]
    ys = {k: s.emit.transpose(args[i], y_types[k].axes) for k, i in forwarded.items()}
    kept = [k for k in range(len(y_types)) if k not in forwarded]
    carries: tuple = ()
    if num_carry or kept:
        outputs = body.outputs[:num_carry] + tuple(body.outputs[num_carry + k] for k in kept)
        smaller = eliminate_dead_code(dataclasses.replace(body, outputs=outputs))
        results = s.emit.emit("scan", args, attrs.replace(body=smaller))
        results = results if isinstance(results, tuple) else (results,)
        carries = tuple(results[:num_carry])
        ys.update(zip(kept, results[num_carry:], strict=True))
    return carries + tuple(ys[k] for k in range(len(y_types)))


RULES: dict[str, Callable[[_Simplify, Operation, list[Any]], Any]] = {
    "mul": _mul,
    "add": _add,
    "pad": _pad,
    "concatenate": _concatenate,
    "sub": _sub,
    "div": _div,
    "unary": _unary,
    "broadcast_in_dim": _same_splat,
    "transpose": _same_splat,
    "reshape": _same_splat,
    "convert": _convert,
    "select": _select,
    "reduce": _reduce,
    "dot_general": _dot_general,
    "scan": _scan,
}


def live_values(program: Program) -> set[int]:
    """Values that the outputs depend on (parameters always count as live). A scan's operands
    count only where its live results need them: a carry that no live result depends on
    (through the other carries, to a fixpoint) is dead, and so is its initial value."""
    live = set(program.outputs) | set(program.parameters)
    for op in reversed(program.operations):
        if not any(r in live for r in op.results):
            continue
        if op.kind == "scan":
            kept = _live_scan_carries(op, live)
            live.update(op.operands[i] for i in _scan_operands_read(op, kept, live))
        elif op.kind == "cond":
            live.update(op.operands[i] for i in _cond_operands_read(op, live))
        else:
            live.update(op.operands)
    return live


def _depends_on(body: Program, outputs: Sequence[int]) -> set[int]:
    """The values of `body` that `outputs` depend on."""
    needed = set(outputs)
    for op in reversed(body.operations):
        if any(r in needed for r in op.results):
            needed.update(op.operands)
    return needed


def _live_scan_carries(op: Operation, live: set[int]) -> list[int]:
    """The carries of a scan that its live results need: the live carries, and those the
    needed carries and live ys read, to a fixpoint."""
    body: Program = op.attrs["body"]
    num_consts, num_carry = op.attrs["num_consts"], op.attrs["num_carry"]
    ys = [k for k, y in enumerate(op.results[num_carry:]) if y in live]
    kept = {j for j in range(num_carry) if op.results[j] in live}
    while True:
        outputs = [body.outputs[j] for j in kept] + [body.outputs[num_carry + k] for k in ys]
        needed = _depends_on(body, outputs)
        more = {j for j in range(num_carry) if body.parameters[num_consts + j] in needed}
        if more <= kept:
            return sorted(kept)
        kept |= more


def _scan_operands_read(op: Operation, kept: list[int], live: set[int]) -> list[int]:
    """The operand positions a scan keeping the carries `kept` reads: those carries, the
    consts its body reads for them and its live ys, and every x (they give its length)."""
    num_consts, num_carry = op.attrs["num_consts"], op.attrs["num_carry"]
    if len(kept) == num_carry:
        return list(range(len(op.operands)))
    body: Program = op.attrs["body"]
    ys = [k for k, y in enumerate(op.results[num_carry:]) if y in live]
    outputs = [body.outputs[j] for j in kept] + [body.outputs[num_carry + k] for k in ys]
    needed = _depends_on(body, outputs)
    consts = [i for i in range(num_consts) if body.parameters[i] in needed]
    return (
        consts
        + [num_consts + j for j in kept]
        + list(range(num_consts + num_carry, len(op.operands)))
    )


class _SkipDead(Layer):
    def __init__(self, next: Any, live: set[int]):
        super().__init__(next)
        self.live = live
        self.emit = Emitter(next)

    def bind(self, op: Operation, args: list[Any]) -> Any:
        if not any(r in self.live for r in op.results):
            return tuple(None for _ in op.results) if rule_for(op.kind).multiple_results else None
        if op.kind == "cond" and op.results:
            pruned = _cond_without_dead_outputs(self.emit, op, args, self.live)
            if pruned is not None:
                return pruned
        if op.kind == "scan":
            kept = _live_scan_carries(op, self.live)
            if len(kept) < op.attrs["num_carry"]:
                return _scan_without_dead_carries(self.emit, op, args, kept, self.live)
            pruned = _scan_without_dead_ys(self.emit, op, args, self.live)
            if pruned is not None:
                return pruned
            op, args = _scan_without_unread_consts(op, args)
        return self.next.bind(op, args)


def _cond_operands_read(op: Operation, live: set[int]) -> list[int]:
    """The operand positions a cond reads for its live results: the predicate, and the
    arguments either branch reads for them."""
    outputs = [k for k, r in enumerate(op.results) if r in live]
    read = [0]
    for position in range(1, len(op.operands)):
        for branch in (op.attrs["true_body"], op.attrs["false_body"]):
            needed = _depends_on(branch, [branch.outputs[k] for k in outputs])
            if branch.parameters[position - 1] in needed:
                read.append(position)
                break
    return read


def _cond_without_dead_outputs(emit: Emitter, op: Operation, args: list[Any], live: set[int]):
    """The cond computing only its live results, from the arguments they read (None when
    nothing can go); the dead results are None."""
    outputs = [k for k, r in enumerate(op.results) if r in live]
    read = _cond_operands_read(op, live)
    if len(outputs) == len(op.results) and len(read) == len(op.operands):
        return None
    kept = [i - 1 for i in read[1:]]

    def pruned(branch: Program) -> Program:
        types = branch.parameter_types

        def running(b, values):
            given = dict(zip(kept, values, strict=True))
            arguments = [given[i] if i in given else b.zeros(types[i]) for i in range(len(types))]
            results = run(branch, Inline(b, arguments, branch))
            return [results[k] for k in outputs]

        return eliminate_dead_code(define(branch.name, [types[i] for i in kept], running))

    attrs = op.attrs.replace(
        true_body=pruned(op.attrs["true_body"]), false_body=pruned(op.attrs["false_body"])
    )
    results = emit.emit("cond", [args[i] for i in read], attrs)
    results = results if isinstance(results, tuple) else (results,)
    found = dict(zip(outputs, results, strict=True))
    return tuple(found.get(k) for k in range(len(op.results)))


def _scan_without_dead_carries(
    emit: Emitter, op: Operation, args: list[Any], kept: list[int], live: set[int]
) -> Any:
    """The scan carrying only the carries `kept` (and computing only its live ys); the dead
    carries' results are None."""
    body: Program = op.attrs["body"]
    num_consts, num_carry = op.attrs["num_consts"], op.attrs["num_carry"]
    ys = [k for k, y in enumerate(op.results[num_carry:]) if y in live]
    dropped = [num_consts + j for j in range(num_carry) if j not in kept]
    positions = [i for i in range(len(args)) if i not in dropped]
    types = body.parameter_types

    def carrying_the_rest(b, values):
        given = dict(zip(positions, values, strict=True))
        arguments = [given[i] if i in given else b.zeros(types[i]) for i in range(len(args))]
        outputs = run(body, Inline(b, arguments, body))
        return [outputs[j] for j in kept] + [outputs[num_carry + k] for k in ys]

    smaller = eliminate_dead_code(
        define(body.name, [types[i] for i in positions], carrying_the_rest)
    )
    attrs = op.attrs.replace(body=smaller, num_carry=len(kept))
    smaller_op = dataclasses.replace(
        op,
        operands=tuple(op.operands[i] for i in positions),
        operand_types=tuple(op.operand_types[i] for i in positions),
        attrs=attrs,
    )
    smaller_op, kept_args = _scan_without_unread_consts(smaller_op, [args[i] for i in positions])
    results = emit.emit("scan", kept_args, smaller_op.attrs)
    results = results if isinstance(results, tuple) else (results,)
    carries = dict(zip(kept, results[: len(kept)], strict=True))
    stacked = dict(zip(ys, results[len(kept) :], strict=True))
    return tuple(carries.get(j) for j in range(num_carry)) + tuple(
        stacked.get(k) for k in range(len(op.results) - num_carry)
    )


def _scan_without_unread_consts(op: Operation, args: list[Any]) -> tuple[Operation, list[Any]]:
    """The scan without the consts its body does not read (a checkpointed region's argument
    that only a pruned output used), as the operation and its arguments."""
    body: Program = op.attrs["body"]
    num_consts = op.attrs["num_consts"]
    read = {v for o in body.operations for v in o.operands} | set(body.outputs)
    parameters = body.parameters
    unread = [i for i in range(num_consts) if parameters[i] not in read]
    if not unread:
        return op, args
    kept = [i for i in range(len(args)) if i not in unread]
    types = body.parameter_types

    def reading_the_rest(b, values):
        given = dict(zip(kept, values, strict=True))
        arguments = [given[i] if i in given else b.zeros(types[i]) for i in range(len(args))]
        return run(body, Inline(b, arguments, body))

    smaller = eliminate_dead_code(define(body.name, [types[i] for i in kept], reading_the_rest))
    attrs = op.attrs.replace(body=smaller, num_consts=num_consts - len(unread))
    operands = tuple(op.operands[i] for i in kept)
    operand_types = tuple(op.operand_types[i] for i in kept)
    pruned = dataclasses.replace(op, operands=operands, attrs=attrs, operand_types=operand_types)
    return pruned, [args[i] for i in kept]


def _scan_without_dead_ys(emit: Emitter, op: Operation, args: list[Any], live: set[int]) -> Any:
    """The scan without the stacked outputs nobody reads (a primal scan's ys that a gradient
    does not need: a stacked array as large as the inputs), or None when all are read."""
    num_carry = op.attrs["num_carry"]
    ys = op.results[num_carry:]
    kept = [k for k, y in enumerate(ys) if y in live]
    if len(kept) == len(ys):
        return None
    body: Program = op.attrs["body"]
    outputs = body.outputs[:num_carry] + tuple(body.outputs[num_carry + k] for k in kept)
    smaller = eliminate_dead_code(dataclasses.replace(body, outputs=outputs))
    op = dataclasses.replace(op, attrs=op.attrs.replace(body=smaller))
    op, args = _scan_without_unread_consts(op, args)
    results = emit.emit("scan", args, op.attrs)
    results = results if isinstance(results, tuple) else (results,)
    stacked = dict(zip(kept, results[num_carry:], strict=True))
    return tuple(results[:num_carry]) + tuple(stacked.get(k) for k in range(len(ys)))


def eliminate_dead_code(program: Program) -> Program:
    """`program` without the operations its outputs do not need."""
    return run(program, _SkipDead(Graph(Builder(program.name)), live_values(program)))


def simplify(program: Program) -> Program:
    """Fold identities and splat constants, share duplicate work, drop dead code.

    >>> import accy
    >>> p = accy.trace.define("p", [accy.spec(accy.f32, lane=2)], lambda b, a: a[0] * 1.0 + 0.0)
    >>> accy.simplify(p).count("mul")
    0
    """
    layer = _Simplify(Graph(Builder(program.name)))
    folded = run(program, layer)
    # The layer and its emitter refer to each other: without this its tables (every operation
    # seen, by operands) would wait for a full cyclic collection rather than go now.
    layer.emit = None
    return eliminate_dead_code(folded)


__all__ = ["eliminate_dead_code", "live_values", "simplify"]
