"""C statements that compute one value at one index inside a loop body.

`Body.value(v, index)` returns a C operand (a temporary's name or a literal) holding value `v`
at `index`, emitting the statements that compute it. A stored value, or a layout operation over
one (a strided view), is a load; any other value is computed by the emitter of its kind
(`EMITTERS`), which asks for its operands at the indices it needs. Each (value, index) pair is
computed once per body, so a value used twice in a fused loop costs one evaluation.

An index is either a tuple of C integer expressions (one per axis of the value's type) or a
`Flat` index: one loop counter over every element of a type, used where all loads are
contiguous, so that the loop is a single flat, vectorizable loop. An emitter that needs axis
positions raises `NotFlat`, and the loop is then generated as a nest.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass

from ...core import Operation
from ...core.arrays import ConstantArray, is_array
from ...core.types import DType, TensorType, bool_
from ...lower.grouping import keeps_flat_order
from ...lower.plan import Plan
from ...lower.views import (
    StridedView,
    concatenated_pieces,
    concatenated_view,
    reshape_groups,
    reshaped_strides,
    row_major,
)
from . import templates
from .dialect import Dialect
from .literals import literal
from .types import CType

INLINE_LIMIT = 256
"""Constants of at most this many elements are literals in the source; larger ones are data."""


class NotFlat(Exception):
    """An emitter needs per-axis indices; the loop must be a nest."""


@dataclass(frozen=True)
class Flat:
    """The flat loop counter `var` running over the elements of `type` in row-major order."""

    var: str
    type: TensorType


Index = tuple[str, ...] | Flat


def components(index: Index) -> tuple[str, ...]:
    """The per-axis parts of `index`; a flat index has none (`NotFlat`)."""
    if isinstance(index, Flat):
        raise NotFlat
    return index


def flat_position(counter: str, offset: int) -> str:
    """Element `counter` of a contiguous view that starts `offset` elements into its buffer.

    >>> flat_position("i", 0), flat_position("i", 768)
    ('i', 'i + 768')
    """
    return f"{counter} + {offset}" if offset else counter


def term(index: str, stride: int) -> str | None:
    """`index * stride` as C, or None when it is zero."""
    if stride == 0 or index == "0":
        return None
    return index if stride == 1 else f"{index} * {stride}"


def offset_expression(index: tuple[str, ...], strides, offset: int = 0) -> str:
    """`offset + sum(index[k] * strides[k])` as C, without zero terms.

    >>> offset_expression(("i0", "0", "i2"), (12, 4, 1), 5)
    'i0 * 12 + i2 + 5'
    """
    terms = [t for t in map(term, index, strides) if t is not None]
    if offset:
        terms.append(str(offset))
    return " + ".join(terms) or "0"


def linear(index: tuple[str, ...], extents) -> str:
    """The row-major position of `index` in a tensor of `extents`, as C."""
    return offset_expression(index, row_major(tuple(extents)))


def clamp(expression: str, extent: int) -> str:
    """`expression` clamped into [0, extent - 1], as C."""
    return f"ACCY_CLAMP({expression}, {extent - 1})"


def _memo_key(v: int, index: Index) -> tuple:
    # A flat counter names the same element of `v` whatever type it was passed down with (a
    # convert's operand has another dtype, a reshape's other axes).
    return (v, index.var) if isinstance(index, Flat) else (v, index)


LOCAL_NAME = re.compile(r"\b(acc|[vtj])(\d+)(?![0-9A-Za-z])")
"""A name `Unit.fresh` and `Body` give a function's locals and parameters: a family (values
`v`, temporaries `t`, index temporaries `j`, accumulators `acc`, which may carry a suffix such
as `_init`), then a number. File-scope names start with the unit's prefix (`accy_`) instead."""


def numbered_locally(text: str, names: re.Pattern = LOCAL_NAME) -> str:
    """`text` (one function's parameters and body) with its local names numbered from 0 in order
    of first use, per family (`names` matches a local name, its family as group 1: the CPU's
    `LOCAL_NAME` by default): two functions that differ only in their locals' numbering read
    the same, so that a unit can define one of them for both.

    >>> numbered_locally("float *v40, const float *v7) { t12 = v7[i] + t9; v40[i] = t12; }")
    'float *v0, const float *v1) { t0 = v1[i] + t1; v0[i] = t0; }'
    >>> numbered_locally("float acc5 = acc5_init; j8 = i * 2;")
    'float acc0 = acc0_init; j0 = i * 2;'
    """
    numbers: dict[str, str] = {}
    counts: dict[str, int] = {}

    def renumbered(match: re.Match) -> str:
        name = match.group(0)
        if name not in numbers:
            family = match.group(1)
            numbers[name] = f"{family}{counts.get(family, 0)}"
            counts[family] = counts.get(family, 0) + 1
        return numbers[name]

    return names.sub(renumbered, text)


class Unit:
    """File-scope state of one translation unit in `dialect`: fresh names and declarations;
    `registry` holds the kernels of custom calls, and file-scope names start with `prefix`."""

    def __init__(self, dialect: Dialect, registry=None, prefix: str = "accy_"):
        self.dialect = dialect
        self.registry = registry
        self.prefix = prefix
        self.declarations: list[str] = []
        self._counter = itertools.count()
        self._constants: dict[tuple[int, int], str] = {}

    def c_type(self, dtype: DType) -> CType:
        """How `dtype` looks in this unit's dialect."""
        return self.dialect.c_type(dtype)

    def fresh(self, prefix: str) -> str:
        return f"{prefix}{next(self._counter)}"

    def declare(self, text: str) -> None:
        self.declarations.append(text)

    def constant_array(self, plan: Plan, op: Operation) -> str:
        """A C expression indexable like an array of constant `op`'s elements, declared once per
        content: a file-scope array of literals when it is small (`INLINE_LIMIT` elements),
        else the backend's `constant_data` (data loaded with the code, not C source)."""
        values = op.attrs["value"]
        if values.digest not in self._constants:
            name = self.fresh(f"{self.prefix}constant")
            if values.size > INLINE_LIMIT:
                name = self.constant_data(name, values)
            else:
                self.literal_array(name, values)
            self._constants[values.digest] = name
        return self._constants[values.digest]

    def literal_array(self, name: str, values: ConstantArray) -> None:
        """Declare `name` as a file-scope array of `values`'s elements, written as literals."""
        items = ", ".join(literal(x, values.dtype) for x in values.array.ravel()) or "0"
        compute = self.c_type(values.dtype).compute
        self.declare(f"{self.dialect.constant_qualifiers} {compute} {name}[] = {{{items}}};")

    def constant_data(self, name: str, values: ConstantArray) -> str:
        """Where a large constant's elements live, as a C expression of type `const compute *`
        (`compute_values` gives their bytes). A backend places them as data loaded once with
        its code (the CPU in a read-only section, CUDA in its workspace); this default writes
        literals, for units that have no such place."""
        self.literal_array(name, values)
        return name


class Body:
    """The statements of one loop body over one plan; `pointers` names each stored base."""

    def __init__(self, unit: Unit, plan: Plan, pointers: dict[int, str]):
        self.unit = unit
        self.plan = plan
        self.pointers = pointers
        self.lines: list[str] = []
        self._memo: dict[tuple, str] = {}

    def value(self, v: int, index: Index) -> str:
        key = _memo_key(v, index)
        if key not in self._memo:
            view = self.plan.view(v)
            if view is not None:
                self._memo[key] = self._load(v, view, index)
            else:
                op = self.plan.producer(v)
                self._memo[key] = EMITTERS[op.kind](self, op, index)
        return self._memo[key]

    def branches(self, dtypes: list[DType], cases: list[tuple[str | None, Callable]]) -> list[str]:
        """Variables of `dtypes` set by the first of `cases` (condition, thunk) whose C
        condition holds (None: always, the last case): `if (c0) {...} else if (c1) {...}`, each
        branch holding only the statements of its own thunk, which returns one operand per
        variable. Values computed inside a branch are forgotten after it (`scope`), so that no
        later statement reads a temporary declared in a branch that did not run."""
        names = [self.variable(dtype) for dtype in dtypes]
        for k, (condition, thunk) in enumerate(cases):
            opening = "if" if k == 0 else "} else if"
            if condition is None:
                self.lines.append("} else {" if k else "{")
            else:
                self.lines.append(f"{opening} ({condition}) {{")
            start, saved = len(self.lines), self.scope()
            operands = thunk()
            self.lines += [f"{n} = {x};" for n, x in zip(names, operands, strict=True)]
            self.lines[start:] = ["  " + line for line in self.lines[start:]]
            self.restore(saved)
        self.lines.append("}")
        return names

    def vector_lanes(self, index: Index) -> list[tuple[str, ...]] | None:
        """The index of every lane of a vector computed at once, where `index` is its first
        lane's (`accy.backends.cuda.vectors.LaneBody`); None: one element at a time."""
        return None

    def variable(self, dtype: DType) -> str:
        """A fresh, not yet assigned variable of `dtype`'s compute type."""
        name = self.unit.fresh("t")
        self.lines.append(f"{self.unit.c_type(dtype).compute} {name};")
        return name

    def scope(self) -> object:
        """What `restore` needs to forget every value computed after this call."""
        return dict(self._memo)

    def restore(self, saved: object) -> None:
        self._memo = saved

    def made(self, v: int, index: Index) -> str | None:
        """The operand holding `v` at `index` if it was computed or seeded, else None."""
        return self._memo.get(_memo_key(v, index))

    def seed(self, v: int, index: Index, operand: str) -> None:
        """Make `operand` the value of `v` at `index` (computed here, so never loaded)."""
        self._memo[_memo_key(v, index)] = operand

    def epilogue(
        self, results: dict[int, str], loops, position: str, store: Callable[[int, str], None]
    ) -> None:
        """A row reduction's epilogue (`accy.lower.grouping.reduction_epilogues`) at result
        element `position`: with `results` (value -> the operand holding its final value
        there) seeded, each loop's operation computed in order, each seeing the ones before,
        and `store(value, operand)` called on its result (the caller stores it where the plan
        keeps it)."""
        for value, operand in results.items():
            self.seed(value, Flat(position, self.plan.program.type_of(value)), operand)
        for loop in loops:
            op = loop.op
            index = Flat(position, op.type)
            x = EMITTERS[op.kind](self, op, index)
            self.seed(op.results[0], index, x)
            store(op.results[0], x)

    def temp(self, dtype: DType, expression: str, rounded: bool = True) -> str:
        ctype = self.unit.c_type(dtype)
        name = self.unit.fresh("t")
        if rounded:
            expression = ctype.round.format(x=expression)
        self.lines.append(f"const {ctype.compute} {name} = {expression};")
        return name

    def shifted(self, component: str, start: int, whole_vector: bool = False) -> str:
        """Index `component` less `start`, as a name; `whole_vector`: every lane of a vector
        (`accy.backends.cuda.vectors.LaneBody`) is in the piece that starts at `start`."""
        return self.index_temp(f"{component} - {start}") if start else component

    def index_temp(self, expression: str) -> str:
        if expression.isidentifier() or expression.isdigit():
            return expression
        name = self.unit.fresh("j")
        self.lines.append(f"const int64_t {name} = {expression};")
        return name

    def element(self, v: int, view: StridedView, index: Index) -> str:
        """The C lvalue of `v`'s element at `index` in its base buffer."""
        if isinstance(index, Flat):
            value_type = self.plan.program.type_of(v)
            if all(s == 0 for s in view.strides):
                return f"{self.pointers[view.base]}[{view.offset}]"
            same_shape = value_type.extents == index.type.extents
            if not (same_shape and view.is_contiguous(value_type)):
                raise NotFlat
            pointer, offset = self.flat_pointer(view)
            return f"{pointer}[{flat_position(index.var, offset)}]"
        return f"{self.pointers[view.base]}[{offset_expression(index, view.strides, view.offset)}]"

    def flat_pointer(self, view: StridedView) -> tuple[str, int]:
        """(pointer, element offset) through which a contiguous `view` is read flat: its base
        buffer's pointer and its offset there, or, where the pointers can name a pointer to an
        element (`at(base, offset)`: CUDA's, whose kernels then do not depend on where in
        its buffer the view starts), that pointer and 0."""
        at = getattr(self.pointers, "at", None)
        if at is None or not view.offset:
            return self.pointers[view.base], view.offset
        return at(view.base, view.offset), 0

    def read(self, v: int, view: StridedView, index: Index) -> str:
        """Value `v` at `index`, loaded through `view` (a layout operation's result whose
        operands are views, read straight from their base buffer)."""
        return self._load(v, view, index)

    def _load(self, v: int, view: StridedView, index: Index) -> str:
        dtype = self.plan.program.type_of(v).dtype
        loaded = self.unit.c_type(dtype).load.format(x=self.element(v, view, index))
        return self.temp(dtype, loaded, rounded=False)


# elementwise kinds ---------------------------------------------------------------------------


def _arithmetic(body: Body, dtype, expression: str) -> str:
    """An arithmetic result: rounded to its dtype, or for 16-bit floats in a dialect that keeps
    them in float32 between operations (`Dialect.rounds_each_half_operation`), not yet."""
    return body.temp(dtype, expression, rounded=body.unit.dialect.rounds_each_half_operation)


def _unary(body: Body, op: Operation, index: Index) -> str:
    x = body.value(op.operands[0], index)
    ctype = body.unit.c_type(op.type.dtype)
    return _arithmetic(body, op.type.dtype, templates.unary(op.attrs["op"], ctype, x))


def _binary(body: Body, op: Operation, index: Index) -> str:
    a, b = (body.value(v, index) for v in op.operands)
    ctype = body.unit.c_type(op.type.dtype)
    return _arithmetic(body, op.type.dtype, templates.binary(op.kind, ctype, a, b))


def _compare(body: Body, op: Operation, index: Index) -> str:
    # Compared values are rounded to their dtype: `x == max(x)` holds at the maximum when the
    # stored maximum was rounded and x is computed again in float32 registers.
    a, b = (body.value(v, index) for v in op.operands)
    if not body.unit.dialect.rounds_each_half_operation:
        rounding = body.unit.c_type(op.operand_types[0].dtype).round
        a, b = rounding.format(x=a), rounding.format(x=b)
    return body.temp(bool_, templates.compare(op.attrs["direction"], a, b))


def _select(body: Body, op: Operation, index: Index) -> str:
    p, a, b = (body.value(v, index) for v in op.operands)
    return body.temp(op.type.dtype, templates.select(p, a, b), rounded=False)


def _convert(body: Body, op: Operation, index: Index) -> str:
    source, target = op.operand_types[0].dtype, op.type.dtype
    x = body.value(op.operands[0], index)
    c_source, c_target = body.unit.c_type(source), body.unit.c_type(target)
    return body.temp(target, templates.convert(x, c_source, c_target, templates.bounds(target)))


def _bitcast(body: Body, op: Operation, index: Index) -> str:
    x = body.value(op.operands[0], index)
    expression = templates.bitcast(x, op.operand_types[0].dtype, op.type.dtype)
    return body.temp(op.type.dtype, expression, rounded=False)


# creation kinds ------------------------------------------------------------------------------


def _constant(body: Body, op: Operation, index: Index) -> str:
    value, dtype = op.attrs["value"], op.type.dtype
    if not is_array(value):
        return literal(value, dtype)
    name = body.unit.constant_array(body.plan, op)
    position = index.var if isinstance(index, Flat) else linear(index, op.type.extents)
    return f"{name}[{position}]"


def _iota(body: Body, op: Operation, index: Index) -> str:
    axis = components(index)[op.type.position(op.attrs["axis"])]
    return body.temp(op.type.dtype, f"({body.unit.c_type(op.type.dtype).compute})({axis})")


# layout kinds (reached only when the operand is computed, not stored) ------------------------


def _by_name(source: TensorType, target: TensorType, index: tuple[str, ...]) -> tuple[str, ...]:
    """The index of `source` whose axes are picked, by name, from an index of `target`."""
    return tuple(index[target.position(a)] for a in source.axes)


def _broadcast(body: Body, op: Operation, index: Index) -> str:
    operand = op.operand_types[0]
    if operand.rank == 0:
        return body.value(op.operands[0], ())
    if isinstance(index, Flat) and keeps_flat_order(op):
        return body.value(op.operands[0], Flat(index.var, operand))
    return body.value(op.operands[0], _by_name(operand, op.type, components(index)))


def _transpose(body: Body, op: Operation, index: Index) -> str:
    operand = op.operand_types[0]
    if isinstance(index, Flat) and keeps_flat_order(op):
        return body.value(op.operands[0], Flat(index.var, operand))
    return body.value(op.operands[0], _by_name(operand, op.type, components(index)))


def _reshape(body: Body, op: Operation, index: Index) -> str:
    operand = op.operand_types[0]
    if isinstance(index, Flat):
        return body.value(op.operands[0], Flat(index.var, operand))
    view = body.plan.view(op.operands[0])
    strides = (
        None if view is None else reshaped_strides(operand.extents, view.strides, op.type.extents)
    )
    if strides is not None:
        # A stored reshape of a view (q sliced out of a fused qkv, say) reads the base directly:
        # no flat position to divide back into the operand's axes.
        return body.read(op.results[0], StridedView(view.base, view.offset, strides), index)
    return body.value(op.operands[0], _reshaped_index(body, operand, op.type, index))


def _reshaped_index(
    body: Body, operand: TensorType, result: TensorType, index: tuple[str, ...]
) -> tuple[str, ...]:
    """The operand's index of a reshape's element at `index`. Axes pass through where a group
    of axes is one axis on both sides (only axes of extent 1 come or go), and a flat position is
    divided back into axes only within each group that splits or merges."""
    if 0 in operand.extents:
        return ("0",) * operand.rank
    parts = ["0"] * operand.rank
    for olds, news in reshape_groups(operand.extents, result.extents):
        flat = body.index_temp(
            linear(tuple(index[k] for k in news), [result.extents[k] for k in news])
        )
        if len(olds) == 1:
            parts[olds[0]] = flat
            continue
        extents = [operand.extents[k] for k in olds]
        for k, (n, s) in enumerate(zip(extents, row_major(tuple(extents)), strict=True)):
            parts[olds[k]] = body.index_temp(f"({flat} / {s}) % {n}" if k else f"{flat} / {s}")
    return tuple(parts)


def _slice(body: Body, op: Operation, index: Index) -> str:
    starts, steps = op.attrs["starts"], op.attrs["strides"]
    parts = tuple(
        offset_expression((i,), (k,), s)
        for i, s, k in zip(components(index), starts, steps, strict=True)
    )
    return body.value(op.operands[0], tuple(body.index_temp(p) for p in parts))


def _pad(body: Body, op: Operation, index: Index) -> str:
    operand, fill = op.operand_types[0], body.value(op.operands[1], ())
    if operand.size == 0:
        return fill
    conditions, parts = [], []
    for i, n, low, inner in zip(
        components(index), operand.extents, op.attrs["low"], op.attrs["interior"], strict=True
    ):
        shifted = body.index_temp(f"{i} - {low}" if low else i)
        if inner:
            conditions.append(f"{shifted} % {inner + 1} == 0")
            shifted = body.index_temp(f"{shifted} / {inner + 1}")
        conditions.append(f"{shifted} >= 0 && {shifted} < {n}")
        # Clamped, so the operand is only ever evaluated inside its bounds.
        parts.append(body.index_temp(clamp(shifted, n)))
    x = body.value(op.operands[0], tuple(parts))
    inside = " && ".join(f"({c})" for c in conditions)
    return body.temp(op.type.dtype, f"({inside}) ? {x} : {fill}", rounded=False)


def _concatenate(body: Body, op: Operation, index: Index) -> str:
    index = components(index)
    view = concatenated_view(op, [body.plan.view(v) for v in op.operands])
    if view is not None:
        # Pieces that are consecutive slabs of one buffer (the gradient of q, k and v sliced
        # out of one tensor) are one strided load, not a select among every piece's load.
        return body.read(op.results[0], view, index)
    made = body.made(op.results[0], index)
    if made is not None:  # a later lane of a vector (the loop's own op is not memoized)
        return made
    pieces = concatenated_pieces(op)
    if not pieces:  # every operand is empty along the axis, so the result has no elements
        return literal(0, op.type.dtype)
    lanes = body.vector_lanes(index)
    if lanes is None or not _one_piece_per_vector(op, lanes, pieces):
        return piecewise(body, op, [index], pieces, whole_vector=False)[0]
    # Every lane at once, in one branch per piece (vector loads inside); later lanes find
    # their values made.
    values = piecewise(body, op, lanes, pieces, whole_vector=True)
    for at, x in zip(lanes[1:], values[1:], strict=True):
        body.seed(op.results[0], at, x)
    return values[0]


def _one_piece_per_vector(op: Operation, lanes: list[tuple[str, ...]], pieces) -> bool:
    """Whether the elements at `lanes` (a vector's, the first a multiple of its width along
    any lane axis) lie in one piece: they differ along another axis than the concatenated
    one, or every piece starts at a multiple of the width."""
    position = op.type.position(op.attrs["axis"])
    if all(at[position] == lanes[0][position] for at in lanes):
        return True
    return all(start % len(lanes) == 0 for _, start, _ in pieces)


def piecewise(
    body: Body, op: Operation, indices: list[tuple[str, ...]], pieces, whole_vector: bool
) -> list[str]:
    """Concatenate `op` at each of `indices`, all in one piece (the first decides which):
    one branch per piece computing only that piece's operand (its expression may be many
    times a select's share, as in a value split into parts), and no clamped indices.
    `whole_vector`: `indices` are every lane of a vector (`Body.shifted`)."""
    position = op.type.position(op.attrs["axis"])
    first = indices[0][position]

    def piece(value: int, start: int):
        def operands() -> list[str]:
            return [
                body.value(
                    value,
                    at[:position]
                    + (body.shifted(at[position], start, whole_vector),)
                    + at[position + 1 :],
                )
                for at in indices
            ]

        return operands

    cases = [(f"{first} < {end}", piece(value, start)) for value, start, end in pieces[:-1]]
    cases.append((None, piece(pieces[-1][0], pieces[-1][1])))
    return body.branches([op.type.dtype] * len(indices), cases)


def _gather(body: Body, op: Operation, index: Index) -> str:
    table, indices = op.operand_types
    position = table.position(op.attrs["axis"])
    extent = table.extents[position]
    if extent == 0:
        return literal(0, op.type.dtype)
    index = components(index)
    rows = index[position : position + indices.rank]
    row = body.value(op.operands[1], rows)
    clamped = body.index_temp(clamp(f"(int64_t){row}", extent))
    at = index[:position] + (clamped,) + index[position + indices.rank :]
    return body.value(op.operands[0], at)


Emitter = Callable[[Body, Operation, Index], str]

EMITTERS: dict[str, Emitter] = {
    "unary": _unary,
    **{kind: _binary for kind in templates.BINARY},
    "compare": _compare,
    "select": _select,
    "convert": _convert,
    "bitcast_convert": _bitcast,
    "constant": _constant,
    "iota": _iota,
    "broadcast_in_dim": _broadcast,
    "transpose": _transpose,
    "reshape": _reshape,
    "slice": _slice,
    "pad": _pad,
    "concatenate": _concatenate,
    "gather": _gather,
}
