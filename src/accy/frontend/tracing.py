"""Tracing Python functions over trees of arrays, and running what was traced.

`trace(fn, args, kwargs)` calls `fn` on traced values in place of the array leaves of its
arguments and records a Program whose parameters are those leaves (then any arrays the function
closed over and that became inputs) and whose outputs are the leaves of what it returned.

`Staged` is what every function transform shares: a cache from a call's signature (tree
structure, each leaf's dtype and named axes, static values) to a Program built for it, and two
ways to run it: on concrete NamedArrays (compiled once per device and cached), or, when the
arguments are traced values of an enclosing transform, inlined into that trace. So transforms
compose: `accy.jit(accy.grad(f))` and `accy.grad(accy.grad(f))` are plain nesting.
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
import itertools
import logging
import operator
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import optree

from ..api import compile as compile_program
from ..backends.base import array_call
from ..backends.devices import CPU, Device, current_default
from ..caches import Group, Table, limit
from ..config import config
from ..core import Program, Value
from ..core.builder import Builder
from ..core.types import TensorType
from ..errors import AccyError, InvalidInput, attach_user_location
from .cache_misses import (
    describe_function,
    explain_first_trace,
    explain_signature_miss,
)
from .debugging import check_outputs, user_location
from .errors import (
    DeviceMismatch,
    NonArrayLeaf,
    StaticArgumentError,
    TransformError,
    TreeTooDeep,
)
from .named import NamedArray, check_device, intern, named_scalar

NAMESPACE = "accy"
# Closed-over arrays with at most this many elements become constants of the program; larger
# ones become extra inputs, so that big weights are not copied into the program text.
CONSTANT_LIMIT = 64


# -- trees -------------------------------------------------------------------------------------


def is_static_field(field: dataclasses.Field, value: Any) -> bool:
    """Whether a dataclass field is static (part of the tree's structure, not a leaf): declared
    so (`accy.field(static=True)`, i.e. `metadata={"static": True}`), or holding a string,
    which can never be an array."""
    return bool(field.metadata.get("static")) or isinstance(value, str)


def register_dataclass(cls: type, static=is_static_field) -> None:
    """Register the dataclass `cls` as a tree node: the fields for which `static(field, value)`
    is false are its children, the others (with their values) its metadata, so they key the
    trace cache. Every field is kept, `init=False` ones included: unflattening sets the fields
    on a new instance without calling `__init__` (as JAX's `register_dataclass`)."""
    fields = dataclasses.fields(cls)

    def flatten_node(obj):
        children, names, statics = [], [], []
        for f in fields:
            value = getattr(obj, f.name)
            if static(f, value):
                statics.append((f.name, value))
            else:
                children.append(value)
                names.append(f.name)
        return tuple(children), (tuple(names), tuple(statics)), tuple(names)

    def unflatten_node(metadata, children):
        names, statics = metadata
        obj = object.__new__(cls)
        for name, value in (*zip(names, children, strict=True), *statics):
            object.__setattr__(obj, name, value)
        return obj

    optree.register_pytree_node(cls, flatten_node, unflatten_node, namespace=NAMESPACE)


TREE_DEPTH_LIMIT: int = getattr(optree, "MAX_RECURSION_DEPTH", 1000)
"""How many levels of nesting a tree may have (optree's limit); a transform's arguments sit two
levels down, in the (args, kwargs) pair."""


def too_deep() -> TreeTooDeep:
    """The error for a tree nested deeper than optree (or Python) can recurse."""
    return TreeTooDeep(
        f"a tree of arguments or results is nested deeper than the {TREE_DEPTH_LIMIT} levels "
        f"accy's trees (optree) can hold, counting the 2 levels of the (args, kwargs) pair "
        f"around a transform's arguments: keep trees at most {TREE_DEPTH_LIMIT - 2} levels "
        "deep (a list or dict of layers instead of layers nested in one another)"
    )


@contextmanager
def depth_checked() -> Iterator[None]:
    """Turn optree's (or Python's) RecursionError on a tree nested too deep into TreeTooDeep.
    (The per-call paths, `flatten` and `unflatten`, catch it themselves: a `try` costs nothing
    where a context manager costs a generator per call.)

    >>> deep = 1.0
    >>> for _ in range(TREE_DEPTH_LIMIT + 1):
    ...     deep = [deep]
    >>> with depth_checked():
    ...     flatten(deep)
    Traceback (most recent call last):
    accy.frontend.errors.TreeTooDeep: a tree of arguments or results is nested ...
    """
    try:
        yield
    except RecursionError:
        raise too_deep() from None


def flatten(tree: Any) -> tuple[list[Any], Any]:
    """The leaves of `tree` and its structure. Dicts, lists, tuples, named tuples and (on first
    sight, registered then) dataclass instances are nodes; None is an empty node. A tree nested
    deeper than TREE_DEPTH_LIMIT is a TreeTooDeep error."""
    leaves, treedef, _ = flatten_with_kinds(tree)
    return leaves, treedef


def flatten_with_kinds(tree: Any) -> tuple[list[Any], Any, set[type]]:
    """`flatten(tree)`, and the set of its leaves' types (which a call's fast path asks for)."""
    try:
        leaves, treedef = optree.tree_flatten(tree, namespace=NAMESPACE)
    except RecursionError:
        raise too_deep() from None
    # Per kind of leaf, not per leaf (set and map loop in C): a training step's few hundred
    # arrays are one kind. A leaf that is a dataclass (not a dataclass class: its kind is
    # `type`) is of a dataclass kind.
    kinds = set(map(type, leaves))
    for kind in kinds:
        if kind is not NamedArray and dataclasses.is_dataclass(kind):
            register_dataclass(kind)
            return flatten_with_kinds(tree)
    return leaves, treedef, kinds


def unflatten(treedef: Any, leaves: Sequence[Any]) -> Any:
    try:
        return optree.tree_unflatten(treedef, leaves)
    except RecursionError:
        raise too_deep() from None


def structure(tree: Any) -> Any:
    return flatten(tree)[1]


def leaf_paths(tree: Any) -> list[str]:
    """A readable path for each leaf of `tree`: `args[0]['w'][1]`."""
    with depth_checked():
        paths, _, _ = optree.tree_flatten_with_path(tree, namespace=NAMESPACE)
    return ["".join(f"[{p!r}]" for p in path) for path in paths]


def argument_path(path: str) -> str:
    """A leaf path of an `(args, kwargs)` tree as the user wrote it: `args[0]['w']`."""
    if path.startswith("[0]"):
        return "args" + path[3:]
    if path.startswith("[1]"):
        return "kwargs" + path[3:]
    return path


def describe_leaf(leaf: Any) -> str:
    if isinstance(leaf, np.ndarray):
        return f"a NumPy array of shape {leaf.shape} without axis names"
    return f"{type(leaf).__name__} {leaf!r}"[:120]


def non_array_leaf(where: str, leaf: Any) -> NonArrayLeaf:
    if isinstance(leaf, np.ndarray):
        names = tuple(f"axis{i}" for i in range(leaf.ndim))
        hint = f"name its axes with accy.named(array, {names})"
    elif where.startswith("the output"):
        return NonArrayLeaf(
            f"{where} is {describe_leaf(leaf)}, which is not an array; a transformed function "
            "returns a tree whose leaves are accy arrays or numbers: return other values from "
            "a plain Python function around it"
        )
    else:
        hint = (
            "pass it as a static argument (static_argnames=...), close over it, or remove it "
            "from the tree"
        )
    return NonArrayLeaf(
        f"{where} is {describe_leaf(leaf)}, which is not an array; the leaves of argument "
        f"trees must be accy.NamedArray values or scalars: {hint}"
    )


def as_array_leaf(leaf: Any, where: str, device: Device = CPU) -> Any:
    """`leaf` as a NamedArray or traced Value: scalars and rank-0 NumPy arrays become rank-0
    NamedArrays; anything else that is not an array raises `NonArrayLeaf`."""
    if isinstance(leaf, NamedArray | Value):
        return leaf
    if isinstance(leaf, bool | int | float | np.generic) or (
        isinstance(leaf, np.ndarray) and leaf.ndim == 0
    ):
        try:
            return named_scalar(leaf, device, where)
        except InvalidInput:  # a value out of its dtype's range: the message says which
            raise
        except AccyError:
            raise non_array_leaf(where, leaf) from None
    raise non_array_leaf(where, leaf)


PYTHON_SCALARS = (bool, int, float)


def is_python_value(leaf: Any) -> bool:
    """Whether `leaf` can stay a Python value where a transform leaves arguments untouched (grad
    outside argnums, vmap): Python scalars, and other hashable non-array objects (strings,
    enums, ...), which then key the trace cache. NumPy scalars and arrays cannot."""
    if type(leaf) in PYTHON_SCALARS:
        return True
    if isinstance(leaf, NamedArray | Value | np.generic | np.ndarray):
        return False
    try:
        hash(leaf)
    except TypeError:
        return False
    return not hasattr(leaf, "__dlpack__")  # a CuPy or other framework's array


def is_array(leaf: Any) -> bool:
    return isinstance(leaf, NamedArray | Value)


def static_key(value: Any) -> Any:
    """`value` as a part of a cache key: by type and value, so that `1`, `1.0` and `True`
    (equal in Python) and `0.0` and `-0.0` (equal too, but `1 / -0.0` is -inf) key apart;
    tuples and frozensets key by their items.

    >>> static_key(1) == static_key(True), static_key(0.0) == static_key(-0.0)
    (False, False)
    >>> static_key((1, 2.0)) == static_key((1, 2.0))
    True
    """
    kind = type(value)
    if kind is float:
        return (kind, value.hex()) if value == value else (kind, "nan")
    if kind is tuple:
        return (kind, tuple(static_key(v) for v in value))
    if kind is frozenset:
        return (kind, frozenset(static_key(v) for v in value))
    return (kind, value)


# -- traced values -----------------------------------------------------------------------------


class TracedArray(Value):
    """A traced value of a function being transformed: a `Value` whose comparisons are
    elementwise (bool arrays, as on NamedArrays) and which has no truth value or data while
    its function is traced. Only the front end's traces make them: the compiler's own Values
    compare by identity, as it keeps them in lists and dicts."""

    __slots__ = ()

    # Elementwise comparisons (bool arrays), as on NamedArrays; hashed by identity still, as
    # the compiler keeps traced values in dicts.
    def __eq__(self, other: Any) -> Any:  # type: ignore[override]
        return self.builder.compare("eq", self, other)

    def __ne__(self, other: Any) -> Any:  # type: ignore[override]
        return self.builder.compare("ne", self, other)

    __hash__ = Value.__hash__

    # Traced values are immutable: a copy is the value itself (`copy.deepcopy` would otherwise
    # copy the whole trace and return a value of no trace).
    def __copy__(self) -> TracedArray:
        return self

    def __deepcopy__(self, memo: dict) -> TracedArray:
        return self

    def __bool__(self) -> bool:
        raise AccyError(
            f"the traced value {self.ty} (%{self.index} of {self.builder.name!r}) has no truth "
            "value while its function is being traced (inside accy.jit, accy.grad, ...): "
            "Python's if, and, or and while need a concrete value; choose elementwise with "
            "accy.where(predicate, a, b), or branch with accy.cond, or make the value a static "
            "argument (static_argnames=...)"
        )

    @property
    def array(self):
        raise AccyError(
            "a traced value has no data while its function is being traced (inside accy.jit, "
            "accy.grad, accy.vmap, ...); return it from the function to see its value"
        )

    def __array__(self, dtype=None, copy=None):
        raise AccyError(
            "cannot turn a traced value into a NumPy array while its function is being traced "
            "(inside accy.jit, accy.grad, ...); use accy operations on it, or return it"
        )

    def _no_python_value(self, conversion: str) -> AccyError:
        return AccyError(
            f"{conversion} of the traced value {self.ty} (%{self.index} of "
            f"{self.builder.name!r}) needs a concrete value, which it has not while its "
            "function is being traced (inside accy.jit, accy.grad, ...): keep it an array "
            "(x.convert(accy.i32) changes its dtype; accy.where and accy.cond choose by it), "
            "or make the value a static argument (static_argnames=...)"
        )

    def item(self) -> Any:
        raise self._no_python_value("item()")

    def __float__(self) -> float:
        raise self._no_python_value("float()")

    def __int__(self) -> int:
        raise self._no_python_value("int()")

    def __complex__(self) -> complex:
        raise self._no_python_value("complex()")

    def __index__(self) -> int:  # list indexing, range(), hex() and oct()
        raise self._no_python_value("using it as a Python index (__index__)")


def escaped_value(use: str, name: str, types: Sequence[str] = ()) -> AccyError:
    """The error for traced values (of `types`) of the finished trace `name`, met again by
    `use`."""
    of = f" ({', '.join(types)})" if types else ""
    return AccyError(
        f"{use}: a traced value{of} of {name!r} was used after its function returned "
        "(kept in a global or an attribute while tracing?); traced values only exist "
        "inside the transformed function: return it instead"
    )


class FunctionBuilder(Builder):
    """A Builder that accepts NamedArrays and values of enclosing traces as operands.

    A NamedArray the function closed over becomes a constant (small) or an extra input (large);
    a value of an enclosing trace becomes an extra input, bound to that value when the program
    is inlined there.
    """

    def __init__(self, name: str, depth: int = 0):
        super().__init__(name)
        self.depth = depth  # how many traces enclose this one
        self.finished = False
        self.body = False  # whether it traces a loop body or a branch (see `current`)
        self.captured: list[Any] = []  # what each extra input is bound to, in order
        self.foreign = False  # whether a value of another trace was captured
        self.locations: dict[int, str] = {}  # operation id -> the user's line that traced it
        # whether `accy.debug_print` records values here (True), ignores them ("drop": a trace
        # whose forward values were printed by another, as vjp's backward), or refuses them
        self.allows_prints: bool | str = False
        # (format, structure, leaves with PRINTED for the array ones, those arrays)
        self.prints: list[tuple[str, Any, list[Any], list[Any]]] = []
        self._lifted: dict[int, Value] = {}
        self._alive: list[Any] = []  # lifted operands, kept so that their ids stay unique

    def finish(self) -> None:
        """Mark the trace done (its values record nothing more) and drop the tables only
        tracing reads: they hold this trace's own values, which refer back to it, a cycle that
        kept every operation it recorded alive until a full cyclic collection."""
        self.finished = True
        self._lifted.clear()
        self._alive.clear()
        self._captures.clear()
        self._kept.clear()

    def _values(self, kind: str, a: Any, b: Any) -> Any:
        if self.finished:  # before a Python scalar operand becomes a constant of this trace
            types = [str(v.ty) for v in (a, b) if isinstance(v, Value) and v.builder is self]
            raise escaped_value(kind, self.name, types)
        return super()._values(kind, a, b)

    def lift(self, operand: Any) -> Any:
        """`operand` as a value of this trace (operands that already are, unchanged)."""
        if isinstance(operand, Value) and operand.builder is self:
            return operand
        known = self._lifted.get(id(operand))
        if known is not None:
            return known
        if isinstance(operand, NamedArray) and operand.ty.size <= CONSTANT_LIMIT:
            lifted = self.constant(np.asarray(operand), operand.ty)
        elif isinstance(operand, NamedArray):
            # Captured at trace time, as a constant is (JAX's rule): a copy, so that later
            # in-place changes to the caller's buffer reach no compiled program.
            self.captured.append(NamedArray(operand.array.copy(), operand.ty, operand.device))
            lifted = self.parameter(operand.ty)
        elif isinstance(operand, Value):
            self.foreign = True
            self.captured.append(operand)
            lifted = self.parameter(operand.ty)
        else:
            return operand
        self._lifted[id(operand)] = lifted
        self._alive.append(operand)
        return lifted

    def emit(self, kind: str, operands: Sequence[Any], attrs=None, id: int | None = None):
        # An operation on a value of a trace nested inside this one belongs to that trace
        # (`x * y` with x from an outer function and y from the inner one it differentiates).
        if self.finished:
            types = [str(v.ty) for v in operands if isinstance(v, Value) and v.builder is self]
            raise escaped_value(kind, self.name, types)
        inner = innermost(operands)
        if inner is not None and inner.depth > self.depth:
            return inner.emit(kind, operands, attrs, id)
        current = self.current()
        if current is not self and kind != "parameter":
            return current.emit(kind, operands, attrs, id)
        lifted = [self.lift(o) for o in operands]
        where = user_location()
        if where is not None:
            self.locations[len(self._operations) if id is None else id] = where
        results = super().emit(kind, lifted, attrs, id)
        if isinstance(results, tuple):
            return tuple(TracedArray(self, v.index, v.ty) for v in results)
        return TracedArray(self, results.index, results.ty)

    def current(self) -> FunctionBuilder:
        """Where an operation asked of this trace is recorded: in the innermost loop body or
        branch being traced inside it, if any (so that `x.sqrt()` on an enclosing `x` inside
        a cond branch runs only when the branch does, as JAX records it), else here."""
        top = _ACTIVE[-1] if _ACTIVE else self
        return top if top.body and top.depth > self.depth and not self.finished else self

    def capturing_subprogram(
        self, name: str, specs: Sequence[TensorType], body: Callable
    ) -> tuple[Program, list[Any]]:
        """Trace a body (of a scan, a cond branch, a while loop) into a Program of its own,
        with a FunctionBuilder one level deeper: whatever the body reads from outside (values
        of this trace or of any enclosing one, NamedArrays, values of a transform called in
        the body) becomes an extra parameter after `specs`, returned beside the program in
        parameter order so that the operation passes them in (JAX's closure conversion)."""
        inner = FunctionBuilder(name, len(_ACTIVE))
        inner.body = True
        arguments = [inner.parameter(spec) for spec in specs]
        _ACTIVE.append(inner)
        try:
            outputs = body(inner, arguments)
            program = inner.build(outputs)
        except AccyError as error:
            attach_user_location(error)
            raise
        finally:
            _ACTIVE.pop()
            inner.finish()
        return program, list(inner.captured)

    def build(self, outputs) -> Program:
        """The Program returning `outputs`; an output read from outside (a closed-over array, a
        value of an enclosing trace) is lifted into this trace first."""
        many = isinstance(outputs, tuple | list)
        lifted = [self.lift(v) for v in (outputs if many else [outputs])]
        return super().build(lifted if many else lifted[0])

    def full(self, type: TensorType, value: Any):
        if isinstance(value, np.ndarray) and value.ndim > 0:
            raise NonArrayLeaf(
                f"a NumPy array of shape {value.shape} was used in an accy operation; name its "
                f"axes first: accy.named(array, {tuple(f'axis{i}' for i in range(value.ndim))})"
            )
        if isinstance(value, np.ndarray):  # a 0-d array (`np.array(2)`) is its scalar
            value = value.item()
        return super().full(type, value)


def enclosing_builder(values: Sequence[Any]) -> Any:
    """The builder of the most deeply nested trace among traced `values` (None if none)."""
    builders = [v.builder for v in values if isinstance(v, Value)]
    return max(builders, key=lambda b: getattr(b, "depth", 0), default=None)


def innermost(operands: Sequence[Any]) -> Any:
    """The builder of the most deeply nested trace among the operands' (None if none)."""
    found = None
    for operand in operands:
        builder = getattr(operand, "builder", None)
        if isinstance(builder, FunctionBuilder) and (found is None or builder.depth > found.depth):
            found = builder
    return found


_ACTIVE: list[FunctionBuilder] = []  # the traces under way, outermost first


def innermost_trace() -> FunctionBuilder | None:
    """The innermost trace under way (a transformed function's, or a loop body's), or None
    outside any."""
    return _ACTIVE[-1] if _ACTIVE else None


@dataclasses.dataclass
class Traced:
    """A traced function: its Program (parameters: the argument leaves, then `captured`), the
    structure of its output, and the raw output (traced values in the function's own tree)."""

    program: Program
    output: Any
    out_treedef: Any
    captured: list[Any]
    foreign: bool
    locations: dict[int, str] = dataclasses.field(default_factory=dict)  # op id -> user line
    # `accy.debug_print` calls: (format, structure of its arguments, their leaves with PRINTED
    # where the next program outputs after the function's own go), in order.
    prints: list[tuple[str, Any, list[Any]]] = dataclasses.field(default_factory=list)


def trace(
    fn: Callable,
    leaves: Sequence[Any],
    treedef: Any,
    name: str | None = None,
    finish=None,
    prints: bool | str = False,
) -> Traced:
    """Trace `fn(*args, **kwargs)`, where `(args, kwargs) = unflatten(treedef, leaves)` with
    each array leaf replaced by a traced parameter of the same type (other leaves, already
    substituted statics, pass through). `finish(builder, output)` may post-process the output
    before its leaves become the program's outputs. With `prints`, the values of
    `accy.debug_print` calls become outputs after those (`Traced.prints`); with
    `prints="drop"` the calls print nothing (their values were printed by another trace)."""
    builder = FunctionBuilder(name or getattr(fn, "__name__", "function"), len(_ACTIVE))
    builder.allows_prints = prints
    parameters = [builder.parameter(leaf.ty) if is_array(leaf) else leaf for leaf in leaves]
    args, kwargs = unflatten(treedef, parameters)
    _ACTIVE.append(builder)
    try:
        output = fn(*args, **kwargs)
        if finish is not None:
            output = finish(builder, output)
        out_leaves, out_treedef = flatten(output)
        values = [
            builder.lift(as_array_leaf(leaf, f"the output{path}"))
            for leaf, path in zip(out_leaves, leaf_paths(output), strict=True)
        ]
        printed = []
        for text, structure_of, template, recorded in builder.prints:
            values += [builder.lift(v) for v in recorded]
            printed.append((text, structure_of, template))
        program = builder.build(values)
    except AccyError as error:
        attach_user_location(error)
        raise
    finally:
        _ACTIVE.pop()
        builder.finish()
    return Traced(
        program, output, out_treedef, builder.captured, builder.foreign, builder.locations, printed
    )


# -- static arguments --------------------------------------------------------------------------


class Statics:
    """Where a function's static arguments sit: by name, and by position when passed so."""

    def __init__(self, fn: Callable, static_argnames: Sequence[str] | str):
        names = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
        self.names = names
        self.positions: dict[str, int] = {}
        if not names:
            return
        try:
            parameters = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            parameters = []
        known = {p.name: i for i, p in enumerate(parameters)}
        has_kwargs = any(p.kind is p.VAR_KEYWORD for p in parameters)
        for name in names:
            if name not in known and not has_kwargs:
                raise StaticArgumentError(
                    f"static_argnames names {name!r}, but {getattr(fn, '__name__', fn)!r} has no "
                    f"parameter {name!r}; its parameters are {', '.join(known) or 'none'}"
                )
            kind = parameters[known[name]].kind if name in known else None
            if kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL):
                raise StaticArgumentError(
                    f"static_argnames names {name!r}, a positional-only or *args parameter of "
                    f"{getattr(fn, '__name__', fn)!r}, which has no name to pass it by; make it "
                    "a keyword-capable parameter, or close over the value instead"
                )
            if kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
                self.positions[name] = known[name]

    def split(self, args: tuple, kwargs: dict) -> tuple[tuple, dict, tuple]:
        """(dynamic args, dynamic kwargs, statics): statics are (name, value, position or
        None) triples, their values checked hashable (they key the compile cache)."""
        if not self.names:
            return args, kwargs, ()
        kwargs = dict(kwargs)
        statics = []
        for name in self.names:
            position = self.positions.get(name)
            if name in kwargs:
                statics.append((name, kwargs.pop(name), None))
            elif position is not None and position < len(args):
                statics.append((name, args[position], position))
        for name, value, _ in statics:
            try:
                hash(value)
            except TypeError:
                raise StaticArgumentError(
                    f"static argument {name!r} is {describe_leaf(value)}, which is unhashable; "
                    "static values key the compile cache, so pass a hashable one (a tuple "
                    "rather than a list, a frozen dataclass), or make it an array argument"
                ) from None
            except Exception as error:  # its __hash__ raised something else
                raise StaticArgumentError(
                    f"static argument {name!r} is {describe_leaf(value)}, whose __hash__ raised "
                    f"{type(error).__name__}: {error}; static values key the compile cache, so "
                    "they must hash without raising"
                ) from error
        taken = {position for _, _, position in statics}
        dynamic = tuple(a for i, a in enumerate(args) if i not in taken)
        return dynamic, kwargs, tuple(statics)

    @staticmethod
    def key(statics: tuple) -> tuple:
        """The cache key of `split`'s statics: by type and value (`static_key`)."""
        return tuple((name, static_key(value), position) for name, value, position in statics)

    @staticmethod
    def merge(args: Sequence[Any], kwargs: dict, statics: tuple) -> tuple[tuple, dict]:
        """The inverse of `split`: static values back where the function expects them."""
        args, kwargs = list(args), dict(kwargs)
        for _, value, position in sorted(
            (s for s in statics if s[2] is not None), key=lambda s: s[2]
        ):
            args.insert(position, value)
        kwargs.update((name, value) for name, value, position in statics if position is None)
        return tuple(args), kwargs


# -- staged programs ---------------------------------------------------------------------------


@dataclasses.dataclass
class Entry:
    """A program built for one signature, and how to read its outputs."""

    program: Program
    out_treedef: Any
    captured: list[Any]
    foreign: bool
    out_types: tuple[TensorType, ...] = ()
    # device -> a weak reference to the call of the program compiled there (its `array_call`,
    # which lives as long as the executable: `accy.caches`' executables cache decides which
    # stay alive)
    compiled: dict[Device, Any] = dataclasses.field(default_factory=dict)
    donate: tuple[int, ...] = ()  # program inputs the call may overwrite (`accy.jit`)
    locations: dict[int, str] = dataclasses.field(default_factory=dict)  # op id -> user line
    prints: list[tuple[str, Any, list[Any]]] = dataclasses.field(default_factory=list)  # Traced's

    def __post_init__(self) -> None:
        self.out_types = tuple(intern(t) for t in self.program.output_types)
        self.captured_arrays: dict[str, list[Any]] = {}
        self.single = self.out_treedef.is_leaf()
        # device -> per output, the argument it was written into (donated, same type), or None
        self.written_into: dict[Device, list[int | None]] = {}


Builds = Callable[[list[Any], Any], Entry]


@contextmanager
def without_collection() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a program is built or compiled (the
    outermost such block resumes it). Building GPT-2's step allocates hundreds of thousands of
    objects that all stay alive; each allocation-triggered collection walked them again, a
    quarter of the build's time. When it resumes, see `_resume_collection`.

    >>> import gc
    >>> with without_collection():
    ...     gc.isenabled()
    False
    >>> gc.isenabled()
    True
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        _resume_collection()
        gc.enable()


_COLLECTION = {
    "unwalked": 0,  # objects that joined the oldest generation unwalked since the last full one
    "tracked after the last full collection": 0,
    # Objects frozen when accy was imported (Python 3.12 starts with a few hundred) or, after
    # a build, none: any other count means the program froze objects of its own.
    "frozen as left": gc.get_freeze_count(),
}
UNWALKED_OBJECTS_BEFORE_COLLECTING = 400_000
"""How many objects `_resume_collection` lets join the oldest generation unwalked, at least,
before it collects them all: a bound on the cyclic garbage that builds leave (a few thousand
objects each) and that waits for a full collection."""


def _resume_collection() -> None:
    """After a build: the objects it made (the young generation's count, which grows while
    collection is paused) join the oldest generation without being walked (`gc.freeze` then
    `gc.unfreeze`, which move lists without walking them), since walking them all at once, as
    the first young collection would, took a fifth of GPT-2's build. Once more objects have
    joined so since the last full collection than `UNWALKED_OBJECTS_BEFORE_COLLECTING` and half
    the objects that collection left, a full collection runs instead, so that the garbage of
    many builds (a test suite's, a sweep's) is freed, at a cost in proportion to what they
    made. A program that froze objects of its own (before forking workers, say) keeps them
    frozen and Python's usual collection."""
    if gc.get_freeze_count() != _COLLECTION["frozen as left"]:
        return  # (counting the frozen objects walks them: it is done on an empty list only)
    _COLLECTION["frozen as left"] = 0
    _COLLECTION["unwalked"] += gc.get_count()[0]
    bound = max(
        UNWALKED_OBJECTS_BEFORE_COLLECTING,
        _COLLECTION["tracked after the last full collection"] // 2,
    )
    if _COLLECTION["unwalked"] <= bound:
        gc.freeze()
        gc.unfreeze()
        return
    gc.collect()
    _COLLECTION["unwalked"] = 0
    gc.freeze()
    _COLLECTION["tracked after the last full collection"] = gc.get_freeze_count()
    gc.unfreeze()


_noted = threading.Event()

# Each trace and each compile of a transformed function, at DEBUG level (JAX's log_compiles):
# logging.getLogger("accy.compile").setLevel(logging.DEBUG) with a handler shows them.
COMPILE_LOG = logging.getLogger("accy.compile")


def _note_forgotten_signature(name: str, bound: Any) -> None:
    """Say once per process that a function's table of traced signatures is full: a function
    called with ever new shapes forgets its oldest signatures and traces them again."""
    if not _noted.is_set():
        _noted.set()
        logging.getLogger("accy.caches").warning(
            "accy: %r keeps at most accy.config.%s = %s traced signatures; its oldest is "
            "forgotten (traced again if it is called again); raise the bound if shapes cycle",
            name,
            bound,
            limit(bound),
        )


# Every Staged's tables, bounded alike (accy.clear_caches() empties them).
SIGNATURES = Group("jit signatures", "jit_signatures_max_entries")
FAST_SIGNATURES = Group("jit signatures by type identity", "jit_signatures_max_entries")

_ONLY_NAMED_ARRAYS = {NamedArray}
_device_of = operator.attrgetter("device")
_type_of = operator.attrgetter("ty")
_array_of = operator.attrgetter("array")


class Staged:
    """Programs built per signature by `build(leaves, treedef)` (leaves: NamedArrays or
    Values, only their types matter) and run on concrete arrays or inlined into a trace."""

    def __init__(
        self, build: Builds, device: str | Device | None = None, static_scalars: bool = False
    ):
        self.build = build
        self.device = None if device is None else check_device(device)
        # Python scalars and other hashable Python values in the arguments stay Python values
        # (keying the cache) rather than becoming traced inputs: how grad and vmap treat the
        # arguments they do not transform.
        self.static_scalars = static_scalars
        self.cache: Table = SIGNATURES.table()
        # Positional NamedArrays only, no keywords (the usual call): (device, ids of the
        # argument types) -> what `call` needs, bound once (`_remember_fast`): a weak reference
        # to the compiled program's call, the captured arrays, the one output's type (or None),
        # the outputs' wrapper (`output_wrapper`, or None), structure, types and devices, and
        # the argument types (kept alive, so that the ids stay theirs).
        self.flat: Table = FAST_SIGNATURES.table()
        # Trees of NamedArrays on one device (`__call__`): (treedef, ids of the leaves' types)
        # -> (Entry, the types, kept alive so that the ids stay theirs). Hashing the types by
        # value is a Python call each: a training step passes a few hundred on every call.
        self.trees: Table = FAST_SIGNATURES.table()
        self.traces = 0  # how many times a program was built (a cache miss): for tests
        # For explain_cache_misses: the function's name and source line, and whether its
        # first trace was explained already (by its jit's new static arguments).
        self.described: tuple[str, tuple[str, int] | None] = ("a transformed function", None)
        self.first_explained = False
        self.statics: list[tuple] = []  # (name, cache key, value) of a jit's static arguments

    def entry(self, leaves: Sequence[Any], treedef: Any, key: tuple) -> Entry:
        entry = self.cache.get(key)
        if entry is None:
            if _REFUSED["tracing"]:
                raise TransformError(
                    f"accy.no_tracing(): {self.described[0]!r} would be traced here (a "
                    "signature not traced before); trace it before the block, with the same "
                    "argument types and static values"
                )
            if config.explain_cache_misses:
                self._explain_miss(key)
            self.traces += 1
            start = time.perf_counter()
            with without_collection():
                entry = self.build(list(leaves), treedef)
            elapsed = 1e3 * (time.perf_counter() - start)
            COMPILE_LOG.debug("accy: traced %r in %.1f ms", entry.program.name, elapsed)
            if not entry.foreign:
                if len(self.cache) >= (limit(self.cache.bound) or len(self.cache) + 1):
                    _note_forgotten_signature(entry.program.name, self.cache.bound)
                self.cache.put(key, entry)
        return entry

    def _explain_miss(self, key: tuple) -> None:
        """Log why `key` is traced (`accy.config.explain_cache_misses`)."""
        name, line = self.described
        earlier = list(self.cache.copy())  # one atomic copy: other threads may add entries
        if not earlier:
            if not self.first_explained:
                explain_first_trace(name, line)
            self.first_explained = True
            return
        paths = [argument_path("".join(f"[{p!r}]" for p in path)) for path in key[0].paths()]
        explain_signature_miss(describe_function(name, line), key, earlier, paths)

    def entry_for(self, tree: Any) -> Entry:
        """The Entry (the traced Program) for the arguments `tree`, built if new, without
        running it: what `accy.make_program` and `jit(f).lower` show."""
        leaves, treedef = flatten(tree)
        paths = None
        converted = []
        for position, leaf in enumerate(leaves):
            if not is_array(leaf) and not (self.static_scalars and is_python_value(leaf)):
                paths = paths or leaf_paths(tree)
                leaf = as_array_leaf(leaf, argument_path(paths[position]))
            converted.append(leaf)
        key = (
            treedef,
            tuple(leaf.ty if is_array(leaf) else static_key(leaf) for leaf in converted),
        )
        return self.entry(converted, treedef, key)

    def call(self, args: tuple, kwargs: dict) -> Any:
        """Run on `(args, kwargs)`. The fast path, where the call overhead matters: every
        argument a NamedArray on one device, no keywords, a signature run before (`flat`)
        whose compiled program is alive, and `debug_nans` off; everything else (a first call,
        a released program, keywords, trees, scalars, NaN checks) takes the general path."""
        if not kwargs and args:
            device = args[0].device if type(args[0]) is NamedArray else None
            key, arrays = [device], []
            for a in args:
                if type(a) is not NamedArray or a.device is not device:
                    break
                key.append(id(a.ty))
                arrays.append(a.array)
            else:
                key = tuple(key)
                found = self.flat.get(key)
                if found is not None:
                    run, captured, single, wrap, treedef, out_types, devices, _ = found
                    # The executables cache owns compiled programs: one it dropped is None.
                    run = run()
                    if run is not None and not config.debug_nans:
                        arrays += captured  # (one star argument: two cost a tuple more)
                        outputs = run(*arrays)
                        if single is not None:
                            return NamedArray(outputs[0], single, device)
                        if wrap is not None:
                            return wrap(outputs)
                        # map() wraps the outputs in C, a list comprehension costs ~2x as much
                        return unflatten(
                            treedef, list(map(NamedArray, outputs, out_types, devices))
                        )
                result = self((args, kwargs))
                self._remember_fast(key, args, device)
                return result
        return self((args, kwargs))

    def _remember_fast(self, key: tuple, args: tuple, device: Device) -> None:
        """Record the call just run on the positional NamedArrays `args` for the fast path of
        `call`: what it needs bound once (the compiled program's call, held weakly; the captured
        arrays; how to wrap the outputs). Entries that print (`accy.debug_print`) are left to
        the general path, as is a device other than this Staged's own."""
        entry = self.cache.get((structure((args, {})), tuple(a.ty for a in args)))
        if entry is None or entry.prints or device not in entry.compiled:
            return
        held = entry.compiled[device]
        if held() is None or self.device not in (None, device):
            return
        single = entry.out_types[0] if entry.single else None
        wrap = None if entry.single else output_wrapper(entry.out_treedef, entry.out_types, device)
        self.flat.put(
            key,
            (
                held,
                entry.captured_arrays[device],
                single,
                wrap,
                entry.out_treedef,
                entry.out_types,
                (device,) * len(entry.out_types),
                tuple(a.ty for a in args),  # kept alive, so that the ids in `key` stay theirs
            ),
        )

    def __call__(self, tree: Any) -> Any:
        """Run on `tree` (the arguments): its leaves must be arrays or scalars."""
        leaves, treedef, kinds = flatten_with_kinds(tree)
        # The fast path: every leaf a NamedArray on one device (checked with set and map,
        # which loop in C: a training step passes a few hundred arrays on every call).
        if kinds != _ONLY_NAMED_ARRAYS:
            return self._call_general(tree, leaves, treedef)
        devices = set(map(_device_of, leaves))
        device = self.device or (next(iter(devices)) if len(devices) == 1 else None)
        if device is None or devices != {device}:
            return self._call_general(tree, leaves, treedef)
        types = tuple(map(_type_of, leaves))
        by_identity = (treedef, tuple(map(id, types)))
        found = self.trees.get(by_identity)
        if found is not None:
            entry = found[0]
        else:
            key = (treedef, types)
            entry = self.cache.get(key) or self.entry(leaves, treedef, key)
            if entry.foreign:  # it read values of an enclosing trace: it runs there
                return inline(entry, enclosing_builder(entry.captured), leaves)
            self.trees.put(by_identity, (entry, types))
        return self.run_concrete(entry, list(map(_array_of, leaves)), device, leaves)

    def run_concrete(
        self, entry: Entry, arrays: list[Any], device: Device, leaves: list[Any] | None = None
    ) -> Any:
        """Run `entry`'s program on `arrays` (compiled for `device` first if needed). Where
        `leaves` are the arguments as NamedArrays on `device`, an output written into a
        donated one's array (the same array object, of the same type) is that NamedArray
        itself: a training step's parameters and state come back without a new wrapper each."""
        held = entry.compiled.get(device)
        run = None if held is None else held()
        if run is None:  # not compiled yet, or released by the executables cache
            start = time.perf_counter()
            with without_collection():
                run = array_call(compile_program(entry.program, device, donate=entry.donate))
            COMPILE_LOG.debug(
                "accy: compiled %r for %s in %.1f ms",
                entry.program.name,
                device.name,
                1e3 * (time.perf_counter() - start),
            )
            entry.compiled[device] = weakref.ref(run)
            entry.captured_arrays[device] = [c.to(device).array for c in entry.captured]
            entry.written_into[device] = written_into(entry, getattr(run, "aliases", None))
        outputs = run(*arrays, *entry.captured_arrays[device])
        if config.debug_nans:
            check_outputs(entry, [*arrays, *entry.captured_arrays[device]], outputs)
        if entry.prints:
            outputs = show_prints(entry, outputs, device)
        into = entry.written_into.get(device)
        if leaves is not None and into and not entry.prints:
            named = [
                leaves[i] if i is not None and leaves[i].array is o else NamedArray(o, t, device)
                for o, t, i in zip(outputs, entry.out_types, into, strict=True)
            ]
        else:
            named = list(map(NamedArray, outputs, entry.out_types, itertools.repeat(device)))
        return unflatten(entry.out_treedef, named)

    def _call_general(self, tree: Any, leaves: list[Any], treedef: Any) -> Any:
        paths = None
        converted = []
        for position, leaf in enumerate(leaves):
            if self.static_scalars and is_python_value(leaf):
                pass
            elif not isinstance(leaf, NamedArray | Value):
                paths = paths or leaf_paths(tree)
                leaf = as_array_leaf(leaf, argument_path(paths[position]))
            converted.append(leaf)
        traced = [leaf for leaf in converted if isinstance(leaf, Value)]
        key = (
            treedef,
            tuple(leaf.ty if is_array(leaf) else static_key(leaf) for leaf in converted),
        )
        if traced:
            entry = self.entry(converted, treedef, key)
            # Into the innermost trace among the arguments and what the function closed over
            # (a cotangent of a vmapped function next to primals of the function around it
            # belongs to the vmapped one; so does a call closing over a vmapped value).
            builder = innermost(traced + entry.captured) or traced[0].builder
            if getattr(builder, "finished", False):
                raise escaped_value("an argument", builder.name, [str(v.ty) for v in traced])
            return inline(entry, builder, [c for c in converted if is_array(c)])
        arrays = [leaf for leaf in converted if is_array(leaf)]
        # Scalars given as Python or NumPy numbers follow the arrays' device.
        devices = {leaf.device for leaf in leaves if isinstance(leaf, NamedArray)}
        device = self.device
        if device is None and len(devices) > 1:
            paths = leaf_paths(tree)
            where = ", ".join(
                f"{argument_path(p)} on '{leaf.device}'"
                for p, leaf in zip(paths, converted, strict=True)
                if isinstance(leaf, NamedArray)
            )
            raise DeviceMismatch(
                f"arrays on different devices were passed together ({where}); move them with "
                ".to(device), or give the transform a device"
            )
        device = device or (devices.pop() if devices else current_default())
        entry = self.entry(converted, treedef, key)
        if entry.foreign:  # it read values of an enclosing trace: it runs there
            return inline(entry, enclosing_builder(entry.captured), arrays)
        return self.run_concrete(entry, [leaf.to(device).array for leaf in arrays], device)


def written_into(entry: Entry, aliases: dict[int, int] | None) -> list[int | None]:
    """Per output of `entry`'s program, the argument whose donated buffer it is written into
    (`aliases`: a donating executable's output -> input) where that argument is one of the
    call's leaves (not a captured array) of the output's very type; None for the others. An
    empty list where no output is.

    >>> import accy, numpy as np
    >>> step = accy.jit(lambda w, g: (w - g, (w * g).sum("n")), donate_argnums=(0,))
    >>> w, g = (accy.named(np.ones(3, np.float32), "n") for _ in range(2))
    >>> new, total = step(w, g)
    >>> entry = next(iter(step._staged.get(()).cache.values()))
    >>> written_into(entry, {0: 0}), written_into(entry, None)
    ([0, None], [])
    """
    if not aliases:
        return []
    arguments = len(entry.program.parameter_types) - len(entry.captured)
    parameters = entry.program.parameter_types
    into = []
    for k, t in enumerate(entry.out_types):
        i = aliases.get(k)
        into.append(i if i is not None and i < arguments and parameters[i] == t else None)
    return into if any(i is not None for i in into) else []


# Depths of the no_tracing blocks under way (process-wide, as the settings are).
_REFUSED = {"tracing": 0}


@contextmanager
def no_tracing() -> Iterator[None]:
    """Inside the `with` block, a transformed function that would be traced (a first call,
    or a new signature) raises `TransformError` instead (`jax.no_tracing`): a check that a
    loop runs only programs traced before it. Checked where a trace would start, so it costs
    a cached call nothing.

    >>> import accy, numpy as np
    >>> f = accy.jit(lambda x: x * 2.0)
    >>> x = accy.named(np.ones(2, np.float32), "n")
    >>> with accy.no_tracing():
    ...     f(x)
    Traceback (most recent call last):
    accy.frontend.errors.TransformError: accy.no_tracing(): 'function' would be traced here ...
    >>> _ = f(x)  # traced before the block, it runs in it
    >>> with accy.no_tracing():
    ...     f(x).array.tolist()
    [2.0, 2.0]
    """
    _REFUSED["tracing"] += 1
    try:
        yield
    finally:
        _REFUSED["tracing"] -= 1


def _refuse_execution(
    self: Staged, entry: Entry, arrays: list, device: Device, leaves: list | None = None
) -> Any:
    raise TransformError(
        f"accy.no_execution(): {entry.program.name!r} would run on {device.name} here; run "
        "it outside the block (inside it, transformed functions may be traced and inlined "
        "into other traces, not run)"
    )


def _call_without_fast_path(self: Staged, args: tuple, kwargs: dict) -> Any:
    return self((args, kwargs))


@contextmanager
def no_execution() -> Iterator[None]:
    """Inside the `with` block, running a transformed function's compiled program raises
    `TransformError` (`jax.no_execution`); tracing, and calls inside another trace, still
    work. The switch is the process's, and costs nothing outside the block: it swaps
    `Staged`'s run methods rather than being checked per call.

    >>> import accy, numpy as np
    >>> f = accy.jit(lambda: accy.named(np.ones(3, np.float32), "n"))
    >>> with accy.no_execution():
    ...     f()
    Traceback (most recent call last):
    accy.frontend.errors.TransformError: accy.no_execution(): 'function' would run on cpu ...
    >>> f().shape
    {'n': 3}
    """
    before = Staged.call, Staged.run_concrete
    Staged.call, Staged.run_concrete = _call_without_fast_path, _refuse_execution
    try:
        yield
    finally:
        Staged.call, Staged.run_concrete = before


WRITTEN_OUT_NODES = 64
"""Output trees of at most this many nodes (tuples and lists) get a wrapper written out."""


def output_wrapper(treedef: Any, out_types: Sequence[TensorType], device: Device) -> Any:
    """A function from a program's outputs to NamedArrays on `device` in the structure
    `treedef`, written out where that structure is tuples and lists of at most
    WRITTEN_OUT_NODES nodes (a call then skips optree's unflatten and a `map`: 0.4 us of
    `accy.jit(value_and_grad)`'s 2.7); None for other structures, which optree unflattens.

    >>> import accy, numpy as np
    >>> x = accy.named(np.ones(2, np.float32), "n")
    >>> wrap = output_wrapper(structure((x, [x])), [x.ty, x.ty], x.device)
    >>> value, [gradient] = wrap([np.zeros(2, np.float32), np.ones(2, np.float32)])
    >>> value.array.tolist(), gradient.ty == x.ty
    ([0.0, 0.0], True)
    >>> output_wrapper(structure({"a": x}), [x.ty], x.device) is None
    True
    """
    if treedef.num_nodes > WRITTEN_OUT_NODES or treedef.num_leaves != len(out_types):
        return None
    source = _wrapper_source(treedef, itertools.count())
    if source is None:
        return None
    names = {f"t{k}": t for k, t in enumerate(out_types)}
    namespace = {"NamedArray": NamedArray, "device": device, **names}
    return eval(compile(f"lambda o: {source}", "<outputs>", "eval"), namespace)


def _wrapper_source(treedef: Any, numbers: Iterator[int]) -> str | None:
    """`treedef` as an expression of `NamedArray(o[k], tk, device)` leaves in tuples and lists,
    or None where it holds another kind of node."""
    if treedef.is_leaf():
        k = next(numbers)
        return f"NamedArray(o[{k}], t{k}, device)"
    if treedef.type not in (tuple, list):
        return None
    parts = [_wrapper_source(child, numbers) for child in treedef.children()]
    if any(part is None for part in parts):
        return None
    if treedef.type is list:
        return f"[{', '.join(parts)}]"
    return f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"


def inline(entry: Entry, builder: Any, leaves: list[Any]) -> Any:
    """Emit `entry`'s program into the trace of `builder`, bound to `leaves` and its captures."""
    if not hasattr(builder, "call"):
        raise AccyError(f"cannot inline into {builder!r}")
    if isinstance(builder, FunctionBuilder):
        builder = builder.current()
    arguments = [builder.lift(leaf) if hasattr(builder, "lift") else leaf for leaf in leaves]
    arguments += [builder.lift(c) if hasattr(builder, "lift") else c for c in entry.captured]
    outputs = builder.call(entry.program, arguments)
    outputs = list(outputs) if isinstance(outputs, tuple) else [outputs]
    if entry.prints:  # the inlined function's prints become the enclosing trace's
        outputs = record_prints(entry, outputs, builder)
    return unflatten(entry.out_treedef, outputs)


def show_prints(entry: Entry, outputs: Sequence[Any], device: Device) -> list[Any]:
    """Print the `accy.debug_print` values among a run's outputs; returns the function's own."""
    count = entry.out_treedef.num_leaves
    position = count
    for text, structure_of, template in entry.prints:
        leaves = []
        for leaf in template:
            if leaf is PRINTED:
                leaf = NamedArray(outputs[position], entry.out_types[position], device)
                position += 1
            leaves.append(leaf)
        args, kwargs = unflatten(structure_of, leaves)
        print(text.format(*args, **kwargs))
    return list(outputs[:count])


def record_prints(entry: Entry, outputs: list[Any], builder: Any) -> list[Any]:
    """Hand the `accy.debug_print` values among an inlined program's outputs to `builder`
    (the enclosing trace); returns the function's own outputs."""
    count = entry.out_treedef.num_leaves
    position = count
    for text, structure_of, template in entry.prints:
        leaves = []
        for leaf in template:
            if leaf is PRINTED:
                leaf = outputs[position]
                position += 1
            leaves.append(leaf)
        record_print(builder, text, structure_of, leaves)
    return outputs[:count]


PRINTED = object()  # marks an array leaf of a debug_print, returned by the program


def record_print(builder: Any, text: str, structure_of: Any, leaves: Sequence[Any]) -> None:
    """Record one `accy.debug_print` of `leaves` (of its `(args, kwargs)`) in the trace of
    `builder`, whose program will return their arrays; a trace that cannot (a loop body, a
    custom rule, ...) refuses it, and one whose values another trace prints ignores it."""
    allows = getattr(builder, "allows_prints", False)
    if allows == "drop":
        return
    if not allows:
        raise AccyError(
            f"accy.debug_print({text!r}, ...) inside {getattr(builder, 'name', 'a transform')!r}: "
            "values are printed from accy.jit, grad, jvp, vjp, vmap and scan bodies and eagerly, "
            "not from inside a while_loop body, a cond branch or a custom rule (where a value "
            "may not be printed at all); return the value and print it outside"
        )
    template = [PRINTED if hasattr(leaf, "ty") else leaf for leaf in leaves]
    arrays = [builder.lift(leaf) for leaf in leaves if hasattr(leaf, "ty")]
    builder.prints.append((text, structure_of, template, arrays))


def block_until_ready(tree: Any) -> Any:
    """`tree`, once the work computing its NamedArrays has finished (`jax.block_until_ready`):
    each device they are on is waited for once; other leaves pass through.

    >>> import accy, numpy as np
    >>> tree = {"x": accy.named(np.ones(2, np.float32), "i"), "n": 4}
    >>> accy.block_until_ready(tree) is tree
    True
    """
    devices = {leaf.device for leaf in flatten(tree)[0] if isinstance(leaf, NamedArray)}
    for device in devices:
        device.synchronize()
    return tree


__all__ = [
    "Entry",
    "FunctionBuilder",
    "NonArrayLeaf",
    "Staged",
    "Statics",
    "as_array_leaf",
    "block_until_ready",
    "flatten",
    "inline",
    "leaf_paths",
    "trace",
    "unflatten",
]
