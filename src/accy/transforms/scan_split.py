"""Scan bodies taken apart for differentiation: dependence, and the primal/linear split.

Reverse mode differentiates a `scan` without unrolling it (JAX's `_scan_partial_eval` and
`_scan_transpose`): the JVP body (primal and tangent carries together) is split into

- a *primal* body: the operations that do not depend on a tangent. Run forward as a scan, it
  gives the primal results and, as extra ys stacked along the scanned axis, the *residuals*
  (the primal values the tangent work reads at each step);
- a *linear* body: the operations that depend on a tangent, reading the residuals as x slices.
  `pullback` transposes it into a scan that runs in the opposite direction.

Residuals cost memory, so not every primal value read by the linear body is stacked:
constants are recomputed in the linear body, consts and x slices are read from the scan's own
operands, and values computed from consts alone are hoisted out of the loop and computed once.
With `remat=True` only the carries are stacked: the linear body recomputes, from each step's
carries, consts and x slices, the primal values it reads.

Every walk here is a loop over the body's operations (no recursion over values), so the cost is
linear in the size of the body and independent of the scan's length.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..core import Program
from ..core.kinds.control import taken_only
from ..core.kinds.elementwise import CHEAP_UNARY
from ..core.kinds.registry import rule_for
from ..errors import AccyError
from ..interpret import Inline, run
from ..trace import define
from .batch import batch
from .simplify import eliminate_dead_code


def dependents(program: Program, sources: set[int]) -> set[int]:
    """The values of `program` that depend on any of the parameter positions in `sources`.

    >>> import accy
    >>> p = accy.trace.define("p", [accy.spec(accy.f32)] * 2, lambda b, a: (a[0] * 2.0, a[1]))
    >>> sorted(dependents(p, {0})) == sorted([p.parameters[0], p.outputs[0]])
    True
    """
    parameters = program.parameters
    found = {parameters[i] for i in sources}
    for op in program.operations:
        if op.kind != "parameter" and any(v in found for v in op.operands):
            found.update(op.results)
    return found


@dataclass(frozen=True)
class Roles:
    """How a scan's operands (and its body's parameters) divide: consts, carries, xs."""

    num_consts: int
    num_carry: int
    count: int

    @staticmethod
    def of(attrs: Any, count: int) -> Roles:
        return Roles(attrs["num_consts"], attrs["num_carry"], count)

    @property
    def consts(self) -> range:
        return range(self.num_consts)

    @property
    def carries(self) -> range:
        return range(self.num_consts, self.num_consts + self.num_carry)

    @property
    def xs(self) -> range:
        return range(self.num_consts + self.num_carry, self.count)


def carry_fixpoint(body: Program, roles: Roles, active: Sequence[bool], floats_only: bool) -> list:
    """`active` (one flag per body parameter) closed under the loop: a carry becomes active
    when the body's new value for it depends on an active parameter. Converges in at most
    `num_carry + 1` passes (JAX's `_scan_jvp` fixpoint)."""
    active = list(active)
    while True:
        found = dependents(body, {i for i, a in enumerate(active) if a})
        changed = False
        for j, position in enumerate(roles.carries):
            output_type = body.output_types[j]
            if active[position] or body.outputs[j] not in found:
                continue
            if floats_only and not output_type.dtype.is_float:
                continue
            active[position] = True
            changed = True
        if not changed:
            return active


@dataclass(frozen=True)
class Source:
    """Where the linear scan reads one of its primal operands: `operand` (the original scan's
    operand at `index`), `hoisted` (output `index` of the hoisted program) or `residual` (the
    stacked residual `index`, an extra y of the primal scan)."""

    where: str
    index: int


@dataclass(frozen=True)
class Split:
    """A scan body split into a primal scan and a linear scan (see the module docstring).

    The primal scan takes the original operands at `primal_operands` (consts, carries, xs) and
    returns `primal_outputs` (indices of body outputs: its carries, then its ys), then the
    stacked residuals. The hoisted program takes the original operands at `hoist_operands`.
    The linear scan's operands are `linear_consts` (primal sources, then original operands),
    `linear_carries` (original operand indices), `linear_xs` (likewise); it returns the body
    outputs `linear_outputs`.
    """

    primal_body: Program
    primal_operands: tuple[int, ...]
    primal_num_consts: int
    primal_num_carry: int
    primal_outputs: tuple[int, ...]
    residual_count: int
    hoist: Program | None
    hoist_operands: tuple[int, ...]
    linear_body: Program
    linear_consts: tuple[Source, ...]
    linear_carries: tuple[int, ...]
    linear_xs: tuple[Source, ...]
    linear_outputs: tuple[int, ...]

    @property
    def needs_primal_scan(self) -> bool:
        return bool(self.primal_outputs) or self.residual_count > 0


SAVED = "checkpoint_saved"
"""The attribute (True) of an operation in a `remat` scan's body whose results reverse mode
stacks rather than recomputes: what a checkpoint policy chose to store
(`accy.checkpoint_policies`). Transformations keep it, as they keep every attribute."""


def split(body: Program, roles: Roles, linear: Sequence[bool], remat: bool) -> Split:
    """Split `body` given which parameters are linear (a fixpoint over carries is applied).
    Under `remat`, only the results of operations marked `SAVED` are stacked; the rest of the
    primal work the linear body reads is recomputed there."""
    linear = carry_fixpoint(body, roles, linear, floats_only=False)
    parameters = body.parameters
    linear_params = {i for i, a in enumerate(linear) if a}
    lv = dependents(body, linear_params)
    role_of = {}
    for group, positions in (("const", roles.consts), ("carry", roles.carries), ("x", roles.xs)):
        for i in positions:
            role_of[parameters[i]] = (group, i)
    producer = {}
    for op in body.operations:
        for r in op.results:
            producer[r] = op
    carry_outputs = body.outputs[: roles.num_carry]
    y_outputs = body.outputs[roles.num_carry :]
    linear_carry_positions = [j for j, i in enumerate(roles.carries) if linear[i]]
    primal_carry_positions = [j for j, i in enumerate(roles.carries) if not linear[i]]
    linear_y_positions = [k for k, v in enumerate(y_outputs) if v in lv]
    primal_y_positions = [k for k, v in enumerate(y_outputs) if v not in lv]

    # Primal values that the linear body reads.
    needed: list[int] = []
    seen: set[int] = set()

    def need(value: int) -> None:
        if value not in lv and value not in seen:
            seen.add(value)
            needed.append(value)

    for op in body.operations:
        if op.kind != "parameter" and op.results[0] in lv:
            for v in op.operands:
                need(v)
    for j in linear_carry_positions:
        need(carry_outputs[j])
    for k in linear_y_positions:
        need(y_outputs[k])

    # Which primal work the linear body redoes itself.
    recompute: set[int] = set()
    if remat:
        stack = list(needed)
        while stack:
            v = stack.pop()
            if v in recompute or v in role_of or producer[v].attrs.get(SAVED, False):
                continue
            recompute.add(v)
            stack.extend(producer[v].operands)
    else:
        recompute = light_recompute(body, needed, role_of, producer)

    invariant: set[int] = {parameters[i] for i in roles.consts if not linear[i]}
    for op in body.operations:
        if op.kind != "parameter" and all(v in invariant for v in op.operands):
            invariant.update(op.results)

    # Where each primal value the linear body reads (and does not recompute) comes from.
    boundary: list[int] = []  # values, in definition order
    seen_boundary: set[int] = set()
    read = needed if not recompute else sorted(recompute_inputs(body, recompute, needed, lv))
    for v in read:
        if v in recompute or v in seen_boundary:
            continue
        seen_boundary.add(v)
        boundary.append(v)

    const_sources: list[tuple[int, Source]] = []
    x_sources: list[tuple[int, Source]] = []
    hoisted: list[int] = []
    residuals: list[int] = []
    for v in boundary:
        group = role_of.get(v, (None, None))
        if group[0] == "const":
            const_sources.append((v, Source("operand", group[1])))
        elif group[0] == "x":
            x_sources.append((v, Source("operand", group[1])))
        elif v in invariant and group[0] is None:
            const_sources.append((v, Source("hoisted", len(hoisted))))
            hoisted.append(v)
        else:
            x_sources.append((v, Source("residual", len(residuals))))
            residuals.append(v)

    # -- the primal body: nonlinear parameters -> primal carries, primal ys, residuals --------
    primal_params = [i for i in range(roles.count) if not linear[i]]
    primal_consts = [i for i in primal_params if i in roles.consts]
    primal_carries = [i for i in primal_params if i in roles.carries]
    primal_outputs = tuple(primal_carry_positions) + tuple(
        roles.num_carry + k for k in primal_y_positions
    )

    def primal_fn(b, args):
        env = {parameters[i]: a for i, a in zip(primal_params, args, strict=True)}
        _replay(b, body, env, lambda op: op.results[0] not in lv)
        return [env[body.outputs[o]] for o in primal_outputs] + [env[v] for v in residuals]

    primal_body = eliminate_dead_code(
        define(
            body.name + "_primal", [body.type_of(parameters[i]) for i in primal_params], primal_fn
        )
    )

    # -- the hoisted program: nonlinear consts -> loop-invariant residuals -------------------
    hoist = None
    if hoisted:

        def hoist_fn(b, args):
            env = {parameters[i]: a for i, a in zip(primal_consts, args, strict=True)}
            _replay(b, body, env, lambda op: op.results[0] in invariant)
            return [env[v] for v in hoisted]

        hoist = eliminate_dead_code(
            define(
                body.name + "_hoisted",
                [body.type_of(parameters[i]) for i in primal_consts],
                hoist_fn,
            )
        )

    # -- the linear body: primal sources and linear parameters -> linear outputs --------------
    linear_const_params = [i for i in roles.consts if linear[i]]
    linear_carry_params = [i for i in roles.carries if linear[i]]
    linear_x_params = [i for i in roles.xs if linear[i]]
    boundary_consts = [v for v, _ in const_sources]
    boundary_xs = [v for v, _ in x_sources]
    types = (
        [body.type_of(v) for v in boundary_consts]
        + [body.type_of(parameters[i]) for i in linear_const_params]
        + [body.type_of(parameters[i]) for i in linear_carry_params]
        + [body.type_of(v) for v in boundary_xs]
        + [body.type_of(parameters[i]) for i in linear_x_params]
    )
    linear_outputs = tuple(linear_carry_positions) + tuple(
        roles.num_carry + k for k in linear_y_positions
    )

    def linear_fn(b, args):
        keys = (
            boundary_consts
            + [parameters[i] for i in linear_const_params]
            + [parameters[i] for i in linear_carry_params]
            + boundary_xs
            + [parameters[i] for i in linear_x_params]
        )
        env = dict(zip(keys, args, strict=True))
        # Any result, not the first: the linear body may need only a later result of a
        # multi-result operation (the ys of a scan nested in a checkpointed region).
        _replay(b, body, env, lambda op: any(r in lv or r in recompute for r in op.results))
        return [env[body.outputs[o]] for o in linear_outputs]

    linear_body = define(body.name + "_linear", types, linear_fn)
    return Split(
        primal_body=primal_body,
        primal_operands=tuple(primal_params),
        primal_num_consts=len(primal_consts),
        primal_num_carry=len(primal_carries),
        primal_outputs=primal_outputs,
        residual_count=len(residuals),
        hoist=hoist,
        hoist_operands=tuple(primal_consts),
        linear_body=linear_body,
        linear_consts=tuple(s for _, s in const_sources)
        + tuple(Source("operand", i) for i in linear_const_params),
        linear_carries=tuple(linear_carry_params),
        linear_xs=tuple(s for _, s in x_sources)
        + tuple(Source("operand", i) for i in linear_x_params),
        linear_outputs=linear_outputs,
    )


def recompute_inputs(body: Program, recompute: set[int], needed: list, lv: set[int]) -> set[int]:
    """The primal values that the linear body reads, directly or through the work it
    recomputes, and does not recompute itself: parameters, and (without remat) residuals."""
    inputs = {v for v in needed if v not in recompute}
    for op in body.operations:
        if op.kind != "parameter" and any(r in recompute for r in op.results):
            inputs.update(v for v in op.operands if v not in recompute and v not in lv)
    return inputs


LIGHT_KINDS = frozenset({"add", "sub", "mul", "div", "max", "min", "compare", "select"})
LIGHT_KINDS |= {"convert", "broadcast_in_dim", "transpose", "reshape", "slice", "constant", "iota"}


def _is_light(op: Any) -> bool:
    """One cheap operation per element, or a layout: recomputed rather than stacked."""
    return op.kind in LIGHT_KINDS or op.kind == "unary" and op.attrs["op"] in CHEAP_UNARY


def constant_values(body: Program) -> set[int]:
    """The values that light operations make from constants and iota alone (a broadcast
    scalar, a causal mask): recomputing them reads nothing."""
    found: set[int] = set()
    for op in body.operations:
        if _is_light(op) and all(v in found for v in op.operands):
            found.update(op.results)
    return found


def light_recompute(body: Program, needed: list, role_of: dict, producer: dict) -> set[int]:
    """Without remat: the primal values that the linear body recomputes instead of reading
    them as stacked residuals.

    A residual is written by the forward scan and read back by the backward scan at every
    step, a round trip through memory that costs more than an elementwise operation or a
    broadcast; and, unlike the unrolled program, where fusion recomputes such values inside
    their readers, a scan body's residuals are stored as they are. So a value made by a light
    operation (`LIGHT_KINDS`: arithmetic without transcendentals, layout, constants) is
    recomputed from its operands when the operands not already at hand (parameters, values
    stored anyway) take no more bytes than the value itself. Walking from the last definition
    to the first, a chain of light operations collapses onto the heavy values it starts from
    (an MLP's tanh-GELU derivative stores its input and the tanh, not every product; a softmax's
    broadcast denominator stores the row sums). Constants and iota always qualify. A light
    value whose operands are wider than it is judged by its whole chain of light operations
    (`_light_chain`) instead: RMSNorm's bf16 x * rstd, an f32 product converted, reads only x
    and rstd, both at hand. Any other unary operation (a transcendental) is recomputed when
    its operand is at hand already: it costs a few instructions per element and no stored
    bytes (SwiGLU's logistic(gate), the gate being stacked for the derivative anyway: 128 MiB
    a layer of the llama1b step).

    >>> import accy
    >>> p = accy.trace.define("p", [accy.spec(accy.f32, lane=4)], lambda b, a: a[0].exp() * 2.0)
    >>> mul = p.operations[-1]
    >>> producer = {r: op for op in p.operations for r in op.results}
    >>> found = light_recompute(p, [mul.results[0]], {p.parameters[0]: ("x", 0)}, producer)
    >>> sorted(producer[v].kind for v in found)  # exp(x) too: x is at hand
    ['broadcast_in_dim', 'constant', 'mul', 'unary']
    """
    free = constant_values(body)
    available = set(needed) | set(role_of)
    recompute: set[int] = set()
    candidates = set(needed)
    for op in reversed(body.operations):
        value = op.results[0]
        if value not in candidates or value in role_of:
            continue
        added = [v for v in dict.fromkeys(op.operands) if v not in available]
        stored = [v for v in added if v not in free]
        if not _is_light(op):
            if op.kind == "unary" and not stored:
                recompute.add(value)
            continue
        if sum(body.type_of(v).nbytes for v in stored) <= body.type_of(value).nbytes:
            recompute.add(value)
            available.update(added)
            candidates.update(added)
            continue
        chain, frontier = _light_chain(value, producer, available | free)
        stored = [v for v in frontier if v not in available and v not in free]
        if sum(body.type_of(v).nbytes for v in stored) <= body.type_of(value).nbytes:
            recompute.update(chain)
            available.update(chain, frontier)
            candidates.update(frontier)
    return recompute


MAX_LIGHT_CHAIN = 16
"""The most light operations one recomputed value repeats when its chain is judged whole."""


def _light_chain(value: int, producer: dict, at_hand: set[int]) -> tuple[list[int], set[int]]:
    """The light operations' values that compute `value` from values at hand or made by other
    operations (its `frontier`), at most `MAX_LIGHT_CHAIN` of them. What a value one step
    away from a wider one needs: RMSNorm's bf16 `x * rstd` is a conversion of an f32 product,
    twice its bytes, but that product reads only x and rstd, both stacked anyway."""
    chain: list[int] = []
    frontier: set[int] = set()
    pending, seen = [value], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        op = producer[current]
        at_hand_already = current != value and current in at_hand
        if at_hand_already or not _is_light(op) or len(chain) >= MAX_LIGHT_CHAIN:
            frontier.add(current)
            continue
        chain.append(current)
        pending.extend(op.operands)
    return chain, frontier


def _replay(b: Any, body: Program, env: dict, keep: Any) -> None:
    """Emit into `b`, in order, the operations of `body` that `keep` accepts and whose results
    are not bound yet; their operands must be bound in `env` (results are added to it)."""
    for op in body.operations:
        if op.kind == "parameter" or op.results[0] in env or not keep(op):
            continue
        result = b.emit(op.kind, [env[v] for v in op.operands], op.attrs)
        results = result if rule_for(op.kind).multiple_results else (result,)
        env.update(zip(op.results, results, strict=True))


# -- per-step contractions of the xs, done once before the loop ---------------------------------


def _carry_free_and_stepwise(body: Program, roles: Roles) -> set[int]:
    """Values of `body` computed from its consts and xs alone that depend on an x: the same
    work at every step on that step's slices, which one batched operation over all the steps
    can do before the loop."""
    parameters = body.parameters
    carry_free = {parameters[i] for i in (*roles.consts, *roles.xs)}
    stepwise = {parameters[i] for i in roles.xs}
    for op in body.operations:
        if op.kind == "parameter" or not all(v in carry_free for v in op.operands):
            continue
        carry_free.update(op.results)
        if any(v in stepwise for v in op.operands):
            stepwise.update(op.results)
    return stepwise - set(parameters)


def stepwise_contractions(body: Program, roles: Roles) -> bool:
    """Whether `body` contracts its xs with its consts (an RNN's `x_t U`): work that `emit_scan`
    does for every step at once before the loop."""
    producer = {r: op for op in body.operations for r in op.results}
    return any(producer[v].kind == "dot_general" for v in _carry_free_and_stepwise(body, roles))


def emit_scan(emit: Any, operands: Sequence[Any], attrs: Any, id: int | None = None) -> Any:
    """Emit a scan, first taking out of its body the contractions of its xs with its consts (an
    RNN's `x_t U`): one batched contraction over every step runs before the loop, and the body
    reads its result as a new x. Per step that is one kernel (a GEMM's worth of graph nodes on
    a GPU) less and a slice read instead; the loop keeps only the carry-dependent work. Done
    when the new xs are at most twice the size of the xs they come from (an extra stacked
    array: `remat` scans are emitted as they are).

    >>> import accy
    >>> def rnn(b, a):
    ...     (h,), _ = b.scan(lambda b, v: [(v[0].contract(a[0], "h").rename("o", "h")
    ...                      + v[1].contract(a[1], "i").rename("o", "h")).tanh()],
    ...                      carries=[a[2]], xs=[a[3]], axis="t")
    ...     return h.sum()
    >>> p = accy.trace.define("rnn", [accy.spec(accy.f32, h=3, o=3), accy.spec(accy.f32, i=2, o=3),
    ...     accy.spec(accy.f32, h=3), accy.spec(accy.f32, t=5, i=2)], rnn)
    >>> gradient = accy.grad(p, (0, 1))
    >>> [op.kind for op in gradient.operations if op.kind in ("dot_general", "scan")][:2]
    ['dot_general', 'scan']
    """
    body: Program = attrs["body"]
    roles = Roles.of(attrs, len(operands))
    stepwise = _carry_free_and_stepwise(body, roles)
    producer = {r: op for op in body.operations for r in op.results}
    if not any(producer[v].kind == "dot_general" for v in stepwise):
        return emit.emit("scan", list(operands), attrs, id=id)
    readers = {v for op in body.operations if not set(op.results) <= stepwise for v in op.operands}
    frontier = [v for v in dict.fromkeys((*readers, *body.outputs)) if v in stepwise]
    new_size = sum(body.type_of(v).size for v in frontier)
    old_size = sum(body.parameter_types[i].size for i in roles.xs)
    if not frontier or new_size > 2 * old_size:
        return emit.emit("scan", list(operands), attrs, id=id)
    axis, length = attrs["axis"], attrs["length"]
    hoisted = eliminate_dead_code(dataclasses.replace(body, outputs=tuple(frontier)))
    try:
        stepped = batch(hoisted, axis, length, [i in roles.xs for i in range(roles.count)])
    except AccyError:  # the body uses the scanned axis's name itself: leave it as it is
        return emit.emit("scan", list(operands), attrs, id=id)
    arguments = [
        emit.transpose(v, (axis, *v.ty.without([axis]).axes)) if i in roles.xs else v
        for i, v in enumerate(operands)
    ]
    new_xs = run(stepped, Inline(emit, arguments, stepped))
    # The xs that only the hoisted work read are no longer sliced at every step.
    parameters = body.parameters
    kept = [
        i
        for i in range(roles.count)
        if i not in roles.xs or parameters[i] in readers or parameters[i] in body.outputs
    ]
    reading = _body_reading(body, kept, frontier)
    return emit.emit(
        "scan", [*(operands[i] for i in kept), *new_xs], attrs.replace(body=reading), id=id
    )


def _body_reading(body: Program, kept: list[int], frontier: list[int]) -> Program:
    """`body` with the parameters at positions `kept`, then parameters for the `frontier`
    values, read instead of computed."""
    parameters = [body.parameters[i] for i in kept]
    types = [*(body.type_of(v) for v in parameters), *(body.type_of(v) for v in frontier)]

    def replay_reading(b, args):
        env = dict(zip(parameters, args[: len(parameters)], strict=True))
        env.update(zip(frontier, args[len(parameters) :], strict=True))
        for op in body.operations:
            if op.kind == "parameter" or all(r in env for r in op.results):
                continue
            if not all(v in env for v in op.operands):
                continue  # work for the frontier only: done before the loop
            result = b.emit(op.kind, [env[v] for v in op.operands], op.attrs)
            results = result if rule_for(op.kind).multiple_results else (result,)
            env.update(zip(op.results, results, strict=True))
        return [env[v] for v in body.outputs]

    return eliminate_dead_code(define(body.name, types, replay_reading))


# -- per-step outputs computed after the loop ----------------------------------------------------


@dataclass(frozen=True)
class Sunk:
    """A scan body some of whose stacked outputs are computed after the loop instead: `body`
    lacks the outputs at positions `moved`, which `after` computes for one step from the
    consts and the outputs at positions `sources` (batched over the steps, it runs once)."""

    body: Program
    after: Program
    moved: tuple[int, ...]
    sources: tuple[int, ...]


def _derivation(body: Program, position: int, consts: set[int], ys: dict[int, int]):
    """(sources, has a contraction) when output `position` is computed from consts and other
    stacked outputs alone (`ys`: value -> its output position), else None."""
    producer = {r: op for op in body.operations for r in op.results}
    target = body.outputs[position]
    sources, contracts, seen, pending = set(), False, set(), [target]
    while pending:
        value = pending.pop()
        if value in seen or value in consts:
            continue
        seen.add(value)
        if value != target and ys.get(value, position) != position:
            sources.add(ys[value])
            continue
        op = producer[value]
        if op.kind == "parameter":
            return None
        contracts |= op.kind == "dot_general"
        pending.extend(op.operands)
    return sources, contracts


def sink_stepwise_outputs(body: Program, num_consts: int, num_carry: int) -> Sunk | None:
    """The stacked outputs of a scan body that are contractions of other stacked outputs with
    consts (a reverse RNN step's input cotangent `g_t U^T`, where `g_t` is stacked anyway for
    the weight gradient) moved after the loop, or None when there are none.

    >>> import accy
    >>> body = accy.trace.define("step", [accy.spec(accy.f32, i=2, o=3),
    ...     accy.spec(accy.f32, o=3), accy.spec(accy.f32, o=3)],
    ...     lambda b, a: [a[1] + a[2], a[2], a[2].contract(a[0], "o")])
    >>> sunk = sink_stepwise_outputs(body, num_consts=1, num_carry=1)
    >>> sunk.moved, sunk.sources, sunk.body.count("dot_general")
    ((2,), (1,), 0)
    """
    consts = set(body.parameters[:num_consts])
    ys = {}
    for position in range(num_carry, len(body.outputs)):
        ys.setdefault(body.outputs[position], position)
    moved, sources = [], set()
    for position in range(num_carry, len(body.outputs)):
        found = _derivation(body, position, consts, ys)
        movable = found is not None and found[1] and position not in sources
        if movable and not found[0] & set(moved):
            moved.append(position)
            sources |= found[0]
    if not moved:
        return None
    sources_ = tuple(sorted(sources))
    read = [body.outputs[k] for k in sources_]
    types = [*body.parameter_types[:num_consts], *(body.type_of(v) for v in read)]

    def after_the_loop(b, args):
        env = dict(zip(body.parameters[:num_consts], args[:num_consts], strict=True))
        env.update(zip(read, args[num_consts:], strict=True))
        for op in body.operations:
            if op.kind == "parameter" or all(r in env for r in op.results):
                continue
            if all(v in env for v in op.operands):
                result = b.emit(op.kind, [env[v] for v in op.operands], op.attrs)
                results = result if rule_for(op.kind).multiple_results else (result,)
                env.update(zip(op.results, results, strict=True))
        return [env[body.outputs[k]] for k in moved]

    after = eliminate_dead_code(define(body.name + "_after", types, after_the_loop))
    kept = tuple(v for k, v in enumerate(body.outputs) if k not in moved)
    smaller = eliminate_dead_code(dataclasses.replace(body, outputs=kept))
    return Sunk(smaller, after, tuple(moved), sources_)


def emit_scan_sinking(
    emit: Any, operands: Sequence[Any], attrs: Any, num_consts: int, hoist: bool = False
) -> tuple:
    """Emit a scan; its results. Stacked outputs that are contractions of other stacked outputs
    with consts (`sink_stepwise_outputs`: a reverse RNN step's `g_t U^T`) are computed after the
    loop, batched over the steps: one GEMM instead of one per step. With `hoist`, the xs'
    contractions with consts are also done before the loop (`emit_scan`)."""
    body = attrs["body"]
    sunk = sink_stepwise_outputs(body, num_consts, attrs["num_carry"])
    flags = None if sunk is None else [False] * num_consts + [True] * len(sunk.sources)
    try:
        stepped = None if sunk is None else batch(sunk.after, attrs["axis"], attrs["length"], flags)
    except AccyError:  # the body uses the scanned axis's name itself
        sunk = stepped = None
    kept_body = body if sunk is None else sunk.body
    if hoist:
        results = emit_scan(emit, list(operands), attrs.replace(body=kept_body))
    else:
        results = emit.emit("scan", list(operands), attrs.replace(body=kept_body))
    results = results if isinstance(results, tuple) else (results,)
    if sunk is None:
        return results
    kept = iter(results)
    full = [None if k in sunk.moved else next(kept) for k in range(len(body.outputs))]
    arguments = [*operands[:num_consts], *(full[k] for k in sunk.sources)]
    for position, value in zip(
        sunk.moved, run(stepped, Inline(emit, arguments, stepped)), strict=True
    ):
        full[position] = value
    return tuple(full)


# -- per-step contractions summed after the loop ------------------------------------------------

LAYOUT_KINDS = ("transpose", "reshape")  # linear, one operand: they commute with a sum


@dataclass(frozen=True)
class Product:
    """A term of a per-step sum that is `dot` (a contraction of two values that change from
    step to step), then the layout operations `chain` in order. Summed over the steps, it is
    one contraction over the scanned axis of the two operands stacked along it."""

    dot: Any
    chain: tuple[Any, ...]


def sum_terms(program: Program, value: int) -> list[tuple[int, tuple[Any, ...]]]:
    """The terms of `value` as a tree of `add`s of same-typed operands: (term, layout chain)
    pairs, where the chain is the transposes and reshapes applied to the term on the way (the
    term is where they start: the dot, say), in application order.

    >>> import accy
    >>> p = accy.trace.define("f", [accy.spec(accy.f32, n=2)] * 3,
    ...     lambda b, a: a[0] + (a[1] + a[2]))
    >>> sorted(term for term, _ in sum_terms(p, p.outputs[0]))
    [0, 1, 2]
    """
    producer = {r: op for op in program.operations for r in op.results}
    terms, pending = [], [(value, ())]
    while pending:
        current, chain = pending.pop()
        op = producer.get(current)
        adds = op is not None and op.kind == "add" and not chain
        if adds and all(t == op.type for t in op.operand_types):
            pending.extend((v, ()) for v in op.operands)
        elif op is not None and op.kind in LAYOUT_KINDS:
            pending.append((op.operands[0], (op, *chain)))
        else:
            terms.append((current, chain))
    return terms


def step_products(
    program: Program, value: int, invariant: set[int], stacked: set[int]
) -> tuple[list[int], list[Product]]:
    """Split `value` (a per-step cotangent of a loop-invariant operand, in a scan body) into
    terms added up step by step and `Product`s contracted once after the loop.

    A term is a product when it is a dot_general of two values that change with the step (not
    in `invariant`) and the operands to stack for it (those not already stacked: `stacked`)
    hold at most half the elements of the result: an RNN's weight gradient (outer products of
    two vectors per step) becomes one GEMM over the steps instead of a matrix accumulated in a
    carry at each step, for a little more memory than the vectors. Other terms, and layout
    chains that do not end at such a dot, are returned as values to add up per step.
    """
    producer = {r: op for op in program.operations for r in op.results}
    rest, products = [], []
    for term, chain in sum_terms(program, value):
        op = producer.get(term)
        if op is not None and op.kind == "dot_general" and _worth_stacking(op, invariant, stacked):
            products.append(Product(op, chain))
        else:
            rest.append(chain[-1].results[0] if chain else term)
    return rest, products


def _worth_stacking(dot: Any, invariant: set[int], stacked: set[int]) -> bool:
    if any(v in invariant for v in dot.operands):
        return False
    extra = sum(
        t.size for v, t in zip(dot.operands, dot.operand_types, strict=True) if v not in stacked
    )
    return 2 * extra <= dot.type.size


def summed_product(emit: Any, product: Product, stacked: dict, axis: str) -> Any:
    """The sum over the steps of `product`: its dot over the stacked operands (`stacked`: each
    operand's value -> that value stacked along `axis`), contracting the scanned axis too, then
    its layout chain."""
    dot = product.dot
    lhs, rhs = (stacked[v] for v in dot.operands)
    dims = dict(dot.attrs)
    for side, value in (("lhs", lhs), ("rhs", rhs)):
        at = value.ty.position(axis)

        def moved(p: int, at: int = at) -> int:
            return p if p < at else p + 1

        dims[f"{side}_batch"] = [moved(p) for p in dot.attrs[f"{side}_batch"]]
        dims[f"{side}_contracting"] = [at] + [moved(p) for p in dot.attrs[f"{side}_contracting"]]
    total = emit.emit("dot_general", [lhs, rhs], dot.attrs.replace(**dims))
    for op in product.chain:
        total = emit.emit(op.kind, [total], op.attrs)
    return total


def invariant_values(program: Program, parameters: Sequence[int]) -> set[int]:
    """The values of `program` computed from the given parameter positions alone (and from
    constants): the same at every step of a loop whose consts those parameters are."""
    found = {program.parameters[i] for i in parameters}
    for op in program.operations:
        if op.kind != "parameter" and all(v in found for v in op.operands):
            found.update(op.results)
    return found


def replay(b: Any, program: Program, arguments: Sequence[Any]) -> dict:
    """Emit `program`'s operations into `b` on `arguments`; every value of it, by number."""
    env = dict(zip(program.parameters, arguments, strict=True))
    _replay(b, program, env, lambda op: True)
    return env


def inline_cond(attrs: Any, operand_types: Sequence[Any]) -> Program:
    """A program (predicate, args...) -> outputs computing both branches of a cond and
    selecting each output by the predicate: how reverse mode differentiates a cond (the
    backends run a cond as control flow: only the branch taken). Each branch's operands are
    differentiable only where it is taken (`taken_only`).

    >>> import accy
    >>> p = accy.trace.define("f", [accy.spec(accy.bool_), accy.spec(accy.f32)],
    ...     lambda b, a: b.cond(a[0], lambda b, v: v[0] + 1.0, lambda b, v: v[0], [a[1]]))
    >>> inlined = inline_cond(p.operations[2].attrs, p.operations[2].operand_types)
    >>> inlined.count("select"), [float(x) for x in accy.reference.run(inlined, [True, 2.0])]
    (3, [3.0])
    """

    def both(b, args):
        predicate, values = args[0], list(args[1:])
        when_true = taken_only(b, predicate, values)
        when_false = taken_only(b, b.unary("not", predicate), values)
        on_true = run(attrs["true_body"], Inline(b, when_true, attrs["true_body"]))
        on_false = run(attrs["false_body"], Inline(b, when_false, attrs["false_body"]))
        return [b.select(predicate, t, f) for t, f in zip(on_true, on_false, strict=True)]

    return define("cond_inlined", list(operand_types), both)


__all__ = [
    "Product",
    "invariant_values",
    "replay",
    "step_products",
    "sum_terms",
    "Roles",
    "Source",
    "Split",
    "carry_fixpoint",
    "dependents",
    "emit_scan",
    "emit_scan_sinking",
    "stepwise_contractions",
    "summed_product",
    "sink_stepwise_outputs",
    "Sunk",
    "inline_cond",
    "split",
]
